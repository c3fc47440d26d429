//! `cvslurm check --contract` through the binary: against the strict stand-in (the contract)
//! every assumption holds; against a stand-in switched to the other behaviour of one question,
//! that question is reported as not holding (exit 1) — or, where cvslurm takes either answer,
//! as what the server did (exit 0). Nothing is left behind in any case.

mod common;
use common::*;
use serde_json::{json, Value};
use std::process::Output;

/// Runs `cvslurm check --contract` on a site of `cv`, with a slurm.conf naming the cluster.
fn contract(cv: &Standin) -> (Option<i32>, String) {
    let site = Site::new(&cv.server(), &cv.ca(), "");
    let slurm_conf = site.dir.path().join("slurm.conf");
    std::fs::write(&slurm_conf, "ClusterName=west\n").unwrap();
    let out: Output = std::process::Command::new(bin())
        .args(["check", "--contract"])
        .env_remove("CV_API_TOKEN")
        .env_remove("CV_API_SERVER")
        .env("CVSLURM_CONF", &site.conf)
        .env("SLURM_CONF", &slurm_conf)
        .output()
        .unwrap();
    (out.status.code(), stdout(&out) + &stderr(&out))
}

/// The line of question `n`.
fn line<'a>(text: &'a str, n: &str) -> &'a str {
    let tag = format!(" {n}. ");
    text.lines()
        .find(|l| l.contains(&tag) && l.len() > 5 && &l[4..5] == " ")
        .unwrap_or_else(|| panic!("no line for question {n}: {text}"))
}

/// The stand-in holds nothing (the throw-away keys are gone).
fn nothing_left(cv: &Standin, text: &str) {
    assert_eq!(
        cv.state(),
        json!({"jobs": {}, "nodes": {}}),
        "left behind: {text}"
    );
    assert!(
        text.contains("cleaned up: the throw-away JobConfig and NodeConfig cvslurm-contract-"),
        "{text}"
    );
}

#[test]
fn every_assumption_holds_against_the_contract() {
    let cv = Standin::start();
    let (code, text) = contract(&cv);
    assert_eq!(code, Some(0), "{text}");
    for n in ["1", "2", "3a", "3b", "4", "5", "6", "7"] {
        assert!(line(&text, n).starts_with("ok   "), "{text}");
    }
    assert!(text.contains("all of cvslurm's assumptions hold"), "{text}");
    assert!(line(&text, "1").contains("HTTP 400"), "{text}");
    assert!(line(&text, "6").contains("rejected (HTTP 400"), "{text}");
    nothing_left(&cv, &text);
    // It wrote under its throw-away keys only, qualified by the cluster.
    for r in cv.requests() {
        if r["method"] == "POST" {
            let id = r["body"]["key"]["id"].as_str().unwrap_or("");
            assert!(
                id.starts_with("cvslurm-contract-") && id.ends_with("@west"),
                "{r}"
            );
        }
    }
}

/// Each question against the other behaviour: (behaviour, question, the line's tag: `ok`
/// still, `FAIL`, or `note` for a harmless difference; what the line says).
#[test]
fn each_question_against_the_other_behaviour() {
    let cases: &[(Value, &str, &str, &str)] = &[
        (json!({"get_without_key": 200}), "1", "ok", "HTTP 200"),
        (json!({"get_unknown_key": 200}), "2", "FAIL", "HTTP 200"),
        (
            json!({"set": "replace"}),
            "3a",
            "FAIL",
            "nodes gone, start_time gone",
        ),
        (
            json!({"empty_list": "keeps"}),
            "3b",
            "FAIL",
            "the stored nodes are kept",
        ),
        (
            json!({"end_time_on_running": "cleared"}),
            "4",
            "note",
            "end_time is gone",
        ),
        (
            json!({"hostname": "must_match_key"}),
            "5",
            "FAIL",
            "refused: HTTP 400",
        ),
        (
            json!({"unknown_fields": "ignore"}),
            "6",
            "ok",
            "ignored (HTTP 200, the field not stored)",
        ),
    ];
    for (behaviour, n, tag, says) in cases {
        let cv = Standin::start();
        cv.set_behaviour(behaviour.clone());
        let (code, text) = contract(&cv);
        let l = line(&text, n);
        assert!(l.contains(says), "{behaviour}: {text}");
        assert!(l.starts_with(&format!("{tag:<4} ")), "{behaviour}: {text}");
        if *tag == "note" {
            // A harmless difference: named, and no failure.
            assert_eq!(code, Some(0), "{behaviour}: {text}");
            assert!(
                text.contains(
                    "every assumption holds but question(s) 4, where it differs harmlessly"
                ),
                "{text}"
            );
        } else if *tag == "ok" {
            assert_eq!(code, Some(0), "{behaviour}: {text}");
        } else {
            assert_eq!(code, Some(1), "{behaviour}: {text}");
            assert!(
                text.contains("do not hold: question(s) ") && text.contains(n),
                "{text}"
            );
        }
        nothing_left(&cv, &text);
    }
}

/// A CloudVision that cannot delete a JobConfig: question 7 does not hold, and the throw-away
/// job cannot be removed: it is left ended, and the output names it with the curl command
/// that deletes it. The NodeConfig is deleted.
#[test]
fn a_job_that_cannot_be_deleted_is_named_with_the_command_that_deletes_it() {
    let cv = Standin::start();
    cv.set_behaviour(json!({"delete_job": "unsupported"}));
    let (code, text) = contract(&cv);
    assert_eq!(code, Some(1), "{text}");
    assert!(line(&text, "7").starts_with("FAIL "), "{text}");
    assert!(line(&text, "7").contains("HTTP 405"), "{text}");
    let jobs = cv.state()["jobs"].clone();
    let (id, job) = jobs
        .as_object()
        .and_then(|o| o.iter().next())
        .expect("the job is left");
    assert_eq!(job["state"], "JOB_STATE_COMPLETED", "{job}");
    assert_eq!(cv.state()["nodes"], json!({}));
    let cleanup = text
        .lines()
        .find(|l| l.starts_with("FAIL clean-up:"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        cleanup.contains(&format!("JobConfig {id} is still in CloudVision"))
            && cleanup.contains("curl -X DELETE -H \"Authorization: Bearer $(cat ")
            && cleanup.contains(&format!("--cacert {}", cv.ca().display()))
            && cleanup.contains(&format!(
                "/api/resources/computejob/v1/JobConfig?key.id={}",
                id.replace('@', "%40")
            )),
        "{cleanup}"
    );
}

/// Unreachable or a refused token: exit 2, nothing written.
#[test]
fn it_writes_nothing_when_it_cannot_run() {
    let cv = Standin::start();
    let site = Site::new(&cv.server(), &cv.ca(), "");
    std::fs::write(&site.token_file, "bad\n").unwrap();
    let out = site.run(&["check", "--contract"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("refused the token"),
        "{}",
        stdout(&out)
    );
    assert!(cv.requests().iter().all(|r| r["method"] == "GET"));
    drop(cv);
    let out = site.run(&["check", "--contract"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("nothing was written"),
        "{}",
        stdout(&out)
    );
}

/// CloudVision failing midway (one request answered 503 after the first Set): the rest is
/// reported as not asked (exit 2), and the throw-away keys are still deleted.
#[test]
fn a_failure_midway_still_cleans_up() {
    let cv = Standin::start();
    // Each answer takes 150 ms, so the test switches the fault in while the check runs.
    cv.set_mode(json!({"mode": "ok", "delay_ms": 150}));
    let site = Site::new(&cv.server(), &cv.ca(), "");
    let child = std::process::Command::new(bin())
        .args(["check", "--contract"])
        .env_remove("CV_API_TOKEN")
        .env_remove("CV_API_SERVER")
        .env("CVSLURM_CONF", &site.conf)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the first Set", std::time::Duration::from_secs(20), || {
        cv.requests().iter().any(|r| r["method"] == "POST")
    });
    cv.set_mode(json!({"mode": "status", "status": 503, "count": 1}));
    let out = child.wait_with_output().unwrap();
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("HTTP 503"), "{text}");
    assert!(
        line(&text, "7").starts_with("SKIP ") && line(&text, "7").contains("not asked"),
        "{text}"
    );
    assert!(text.contains("could not be asked"), "{text}");
    nothing_left(&cv, &text);
}

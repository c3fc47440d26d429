//! `cvslurm check --contract` through the binary: against the strict stand-in (the contract)
//! every assumption holds; against a stand-in switched to the other behaviour of one question,
//! that question is reported as not holding (exit 1) — or, where cvslurm takes either answer,
//! as what the server did (exit 0). Against the rules of Arista's own fake CloudVision (the
//! `arista` profile) every record it posts but the deliberate ones is accepted, and what needs
//! a GetOne is "cannot tell" (exit 2); against a plain web server it writes nothing after its
//! first Set (exit 2). Nothing is left behind but what a server cannot delete.

use crate::common::*;
use serde_json::{json, Value};
use std::process::Output;

/// Runs `cvslurm check --contract` on a site of `cv` (with `extra` configuration lines), with
/// a slurm.conf naming the cluster.
fn contract_with(cv: &Standin, extra: &str) -> (Option<i32>, String) {
    let site = Site::with_standin(cv, extra);
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

/// [`contract_with`] in the default configuration (question 5 not asked).
fn contract(cv: &Standin) -> (Option<i32>, String) {
    contract_with(cv, "")
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
        text.contains("cleaned up: the throw-away JobConfig ")
            && (text.contains(" is deleted") || text.contains(" are deleted")),
        "{text}"
    );
}

/// The POSTs of the run that are deliberately about a refusal: question 6's unknown field,
/// question 8's `type`, question 5's NodeConfig whose hostname is not its key.id.
fn deliberate(r: &Value) -> bool {
    let b = &r["body"];
    b.get("cvslurm_contract_unknown_field").is_some()
        || b.get("type").is_some()
        || (b.get("hostname").is_some() && b["hostname"] != b["key"]["id"])
}

/// Every record the run posts is a whole one, under its throw-away key, qualified by the
/// cluster; every one but the deliberate ones is accepted (200).
fn whole_records_accepted(cv: &Standin) {
    let posts: Vec<Value> = cv
        .requests()
        .into_iter()
        .filter(|r| r["method"] == "POST")
        .collect();
    assert!(posts.len() >= 6, "{posts:?}");
    for r in &posts {
        let b = &r["body"];
        let id = b["key"]["id"].as_str().unwrap_or("");
        assert!(
            id.starts_with("cvslurm-contract-") && id.ends_with("@west"),
            "{r}"
        );
        assert_eq!(b["location"], "west", "{r}");
        if r["path"].as_str().unwrap().ends_with("JobConfig") {
            assert_eq!(b["name"], "cvslurm check --contract", "{r}");
            assert!(b["start_time"].is_string(), "{r}");
            let lists: Vec<&str> = ["nodes", "interfaces"]
                .into_iter()
                .filter(|k| b.get(*k).is_some())
                .collect();
            assert_eq!(lists.len(), 1, "not exactly one list: {r}");
            assert!(
                b[lists[0]]["values"]
                    .as_array()
                    .is_some_and(|v| !v.is_empty()),
                "{r}"
            );
            assert_eq!(
                b.get("end_time").is_some(),
                b["state"] != "JOB_STATE_RUNNING",
                "{r}"
            );
        } else {
            assert!(b["hostname"].is_string(), "{r}");
            assert!(
                b["data_interfaces"]["values"]
                    .as_array()
                    .is_some_and(|v| !v.is_empty()),
                "{r}"
            );
        }
        if !deliberate(r) {
            assert_eq!(r["status"], 200, "refused: {r}");
        }
    }
}

#[test]
fn every_assumption_holds_against_the_contract() {
    let cv = Standin::start();
    let (code, text) = contract(&cv);
    assert_eq!(code, Some(0), "{text}");
    for n in ["1", "2", "3", "4", "5", "6", "7", "8"] {
        assert!(line(&text, n).starts_with("ok   "), "{text}");
    }
    // 3b (an empty list) is no longer asked: cvslurm never sends one.
    assert!(!text.contains(" 3a. ") && !text.contains(" 3b. "), "{text}");
    assert!(text.contains("all of cvslurm's assumptions hold"), "{text}");
    assert!(line(&text, "1").contains("HTTP 400"), "{text}");
    assert!(line(&text, "2").contains("HTTP 404"), "{text}");
    assert!(
        line(&text, "3").contains("merged (both lists are stored)"),
        "{text}"
    );
    // The default configuration sends hostname = key.id: no NodeConfig is written.
    assert!(line(&text, "5").contains("not asked"), "{text}");
    assert!(line(&text, "6").contains("rejected (HTTP 400"), "{text}");
    assert!(line(&text, "8").contains("accepted (HTTP 200)"), "{text}");
    nothing_left(&cv, &text);
    whole_records_accepted(&cv);
    assert!(!cv
        .requests()
        .iter()
        .any(|r| r["path"].as_str().unwrap().ends_with("NodeConfig")));
}

/// With a configuration whose NodeConfig hostname is not its key.id, question 5 is asked
/// with a whole NodeConfig, and both keys are deleted.
#[test]
fn question_5_is_asked_where_the_hostname_is_not_the_key() {
    for setting in ["NodeHostname=hostname", "QualifyNodeNames=yes"] {
        let cv = Standin::start();
        let (code, text) = contract_with(&cv, setting);
        assert_eq!(code, Some(0), "{setting}: {text}");
        let l = line(&text, "5");
        assert!(
            l.starts_with("ok   ") && l.contains("accepted (GetOne shows the hostname sent)"),
            "{setting}: {text}"
        );
        assert!(l.contains(setting), "{text}");
        assert!(
            text.contains("cleaned up: the throw-away JobConfig and NodeConfig cvslurm-contract-"),
            "{text}"
        );
        nothing_left(&cv, &text);
        whole_records_accepted(&cv);
        let nodes = cv.accepted("NodeConfig");
        assert_eq!(nodes.len(), 1, "{nodes:?}");
    }
}

/// Each question against the other behaviour: (behaviour, configuration, question, the line's
/// tag: `ok` still, `FAIL`, or `note` for a harmless difference; what the line says).
#[test]
fn each_question_against_the_other_behaviour() {
    let cases: &[(Value, &str, &str, &str, &str)] = &[
        (json!({"get_without_key": 200}), "", "1", "ok", "HTTP 200"),
        (json!({"get_unknown_key": 200}), "", "2", "FAIL", "HTTP 200"),
        (
            json!({"set": "replace"}),
            "",
            "3",
            "ok",
            "replaced (only the interfaces are stored)",
        ),
        (
            json!({"end_time_on_running": "cleared"}),
            "",
            "4",
            "note",
            "end_time is gone",
        ),
        (
            json!({"hostname": "must_match_key"}),
            "NodeHostname=hostname",
            "5",
            "FAIL",
            "refused: HTTP 400",
        ),
        (
            json!({"unknown_fields": "ignore"}),
            "",
            "6",
            "ok",
            "ignored (HTTP 200, the field not stored)",
        ),
    ];
    for (behaviour, conf, n, tag, says) in cases {
        let cv = Standin::start();
        cv.set_behaviour(behaviour.clone());
        let (code, text) = contract_with(&cv, conf);
        let l = line(&text, n);
        assert!(l.contains(says), "{behaviour}: {text}");
        assert!(l.starts_with(&format!("{tag:<4} ")), "{behaviour}: {text}");
        if *tag == "note" {
            // A harmless difference: named, and no failure.
            assert_eq!(code, Some(0), "{behaviour}: {text}");
            assert!(
                text.contains(
                    "no assumption fails; question(s) 4 differ from what it assumes, as their note lines say"
                ),
                "{text}"
            );
        } else if *tag == "ok" {
            assert_eq!(code, Some(0), "{behaviour}: {text}");
        } else {
            assert_eq!(code, Some(1), "{behaviour}: {text}");
            assert!(
                text.contains(&format!("do not hold: question(s) {n};")),
                "{text}"
            );
        }
        if *n == "5" {
            // The refusal names the setting to turn off.
            assert!(
                l.contains("turn NodeHostname=hostname off in cloudvision.conf"),
                "{text}"
            );
        }
        nothing_left(&cv, &text);
    }
}

/// A CloudVision that cannot delete a JobConfig (405): question 7 is a note (cvslurm then
/// posts the whole record without the delete), and the throw-away job cannot be removed: it
/// is left ended, and the output names it with the curl command that deletes it.
#[test]
fn a_job_that_cannot_be_deleted_is_named_with_the_command_that_deletes_it() {
    let cv = Standin::start();
    cv.set_behaviour(json!({"delete_job": "unsupported"}));
    let (code, text) = contract(&cv);
    assert_eq!(code, Some(0), "{text}");
    let l = line(&text, "7");
    assert!(
        l.starts_with("note ") && l.contains("the server has no JobConfig DELETE (HTTP 405"),
        "{text}"
    );
    assert!(
        l.contains("cvslurm then posts the whole record without deleting it first"),
        "{text}"
    );
    assert!(!text.contains("FAIL"), "{text}");
    let jobs = cv.state()["jobs"].clone();
    let (id, job) = jobs
        .as_object()
        .and_then(|o| o.iter().next())
        .expect("the job is left");
    assert_eq!(job["state"], "JOB_STATE_COMPLETED", "{job}");
    assert_eq!(cv.state()["nodes"], json!({}));
    let cleanup = text
        .lines()
        .find(|l| l.starts_with("note clean-up:"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        cleanup.contains(&format!(
            "JobConfig {id} is still in CloudVision, as this server has no JobConfig DELETE"
        )) && cleanup.contains("curl -X DELETE -H \"Authorization: Bearer $(cat ")
            && cleanup.contains(&format!("--cacert {}", cv.ca().display()))
            && cleanup.contains(&format!(
                "/api/resources/computejob/v1/JobConfig?key.id={}",
                id.replace('@', "%40")
            )),
        "{cleanup}"
    );
    whole_records_accepted(&cv);
}

/// Against the rules of Arista's own fake CloudVision (every POST a whole record, no GET, no
/// JobConfig DELETE, `type` only JOB_TYPE_TENANT): every record but the deliberate ones is
/// accepted; the questions that read a record back cannot be told (never "holds"); 7 and 8
/// are notes; no FAIL; exit 2 (not every question could be answered). The job, which it
/// cannot delete, is left COMPLETED and named with the curl command.
#[test]
fn against_arista_s_fake_cloudvision_every_whole_record_is_accepted() {
    let cv = Standin::start_profile("arista");
    let (code, text) = contract(&cv);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        !text.lines().any(|l| l.starts_with("FAIL")),
        "a FAIL line: {text}"
    );
    let first = text.lines().next().unwrap();
    assert_eq!(
        first,
        format!(
            "note {} does not answer a GetOne as CloudVision (HTTP 404 \"{{\\\"errors\\\":[\\\"GET not supported by CV stub\\\"]}}\"): the questions that read a record back cannot be answered; the writes are asked all the same",
            cv.server()
        ),
        "{text}"
    );
    for n in ["1", "2", "3", "4"] {
        let l = line(&text, n);
        assert!(
            l.starts_with("note ")
                && l.contains(
                    "cannot tell: the server does not answer GetOne as CloudVision (HTTP 404"
                ),
            "question {n}: {text}"
        );
    }
    assert!(
        line(&text, "3").contains("both Sets were accepted"),
        "{text}"
    );
    assert!(line(&text, "5").starts_with("ok   "), "{text}");
    assert!(line(&text, "6").starts_with("ok   "), "{text}");
    assert!(line(&text, "6").contains("rejected (HTTP 400"), "{text}");
    assert!(
        line(&text, "7").starts_with("note ")
            && line(&text, "7").contains("the server has no JobConfig DELETE (HTTP 404"),
        "{text}"
    );
    let l8 = line(&text, "8");
    assert!(
        l8.starts_with("note ")
            && l8.contains("refused (HTTP 400")
            && l8.contains("JOB_TYPE_TENANT")
            && l8.contains("the records of cvslurm send <jobid> would be refused by this server, while the hooks' records (no type) are not"),
        "{text}"
    );
    assert!(
        text.contains("4 question(s) cannot be told: 1, 2, 3, 4: the server does not answer GetOne as CloudVision"),
        "{text}"
    );
    assert!(
        text.contains("question(s) 7, 8 differ from what cvslurm assumes"),
        "{text}"
    );
    // Nothing says the merge semantics were checked.
    assert!(
        !text.contains("all of cvslurm's assumptions hold")
            && !text.contains("merged")
            && !text.contains("end_time is kept"),
        "{text}"
    );
    whole_records_accepted(&cv);
    // Both deliberate refusals were asked, and refused.
    let refused: Vec<Value> = cv
        .requests()
        .into_iter()
        .filter(|r| r["method"] == "POST" && r["status"] != 200)
        .collect();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(refused.iter().all(deliberate), "{refused:?}");
    // Left COMPLETED (the server has no JobConfig DELETE), named with the command.
    let jobs = cv.state()["jobs"].clone();
    let (id, job) = jobs
        .as_object()
        .and_then(|o| o.iter().next())
        .expect("the job is left");
    assert_eq!(job["state"], "JOB_STATE_COMPLETED", "{job}");
    assert_eq!(cv.state()["nodes"], json!({}));
    assert!(
        text.lines().any(|l| l.starts_with(&format!(
            "note clean-up: the throw-away JobConfig {id} is still in CloudVision, as this server has no JobConfig DELETE"
        )) && l.contains("curl -X DELETE")),
        "{text}"
    );
}

/// Arista's fake CloudVision refuses a NodeConfig whose hostname is not its key.id: where
/// the configuration sends such records, question 5 is a FAIL naming the setting (exit 1).
#[test]
fn against_arista_s_fake_cloudvision_a_hostname_other_than_the_key_fails() {
    let cv = Standin::start_profile("arista");
    let (code, text) = contract_with(&cv, "QualifyNodeNames=yes");
    assert_eq!(code, Some(1), "{text}");
    let l = line(&text, "5");
    assert!(
        l.starts_with("FAIL ")
            && l.contains("refused: HTTP 400")
            && l.contains("turn QualifyNodeNames=yes off in cloudvision.conf (QualifyNodeNames=no"),
        "{text}"
    );
    assert!(text.contains("do not hold: question(s) 5;"), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.starts_with("FAIL")).count(),
        1,
        "{text}"
    );
    whole_records_accepted(&cv);
    // The NodeConfig was refused: nothing of it is stored, and no DELETE was sent for it.
    assert_eq!(cv.state()["nodes"], json!({}));
    assert!(!cv
        .requests()
        .iter()
        .any(|r| r["method"] == "DELETE" && r["path"].as_str().unwrap().ends_with("NodeConfig")));
}

/// A plain web server (every API request 404 text/html, or 200 text/html): reported as not
/// answering as CloudVision; the run stops at its first Set, and sends nothing after it (no
/// DELETE: no Set was taken). Exit 2.
#[test]
fn a_web_server_is_not_cloudvision_and_gets_nothing_after_the_first_set() {
    for (profile, status, page) in [
        (
            "web",
            404,
            "<html><head><title>404 Not Found</title></head><body><h1>Not Found</h1></body></html>",
        ),
        (
            "web200",
            200,
            "<html><body><h1>It works!</h1></body></html>",
        ),
    ] {
        let cv = Standin::start_profile(profile);
        let (code, text) = contract(&cv);
        assert_eq!(code, Some(2), "{profile}: {text}");
        let requests = cv.requests();
        let methods: Vec<String> = requests
            .iter()
            .map(|r| format!("{} {}", r["method"].as_str().unwrap(), r["status"]))
            .collect();
        assert_eq!(
            methods,
            [
                format!("GET {status}"),
                format!("GET {status}"),
                format!("GET {status}"),
                format!("POST {status}")
            ],
            "{profile}: {text}"
        );
        let key = requests[3]["body"]["key"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        let server = cv.server();
        let answer = format!("HTTP {status} \"{page}\"");
        let first: Vec<&str> = text.lines().take(5).collect();
        assert_eq!(
            first,
            [
                format!("note {server} does not answer a GetOne as CloudVision ({answer}): the questions that read a record back cannot be answered; the writes are asked all the same"),
                format!("asking CloudVision {server} with the throw-away JobConfig {key} (deleted at the end)"),
                format!("note 1. GET JobConfig without a key: cannot tell: the server does not answer GetOne as CloudVision ({answer})"),
                format!("note 2. GetOne of a JobConfig key that does not exist: cannot tell: the server does not answer GetOne as CloudVision ({answer})"),
                format!("SKIP 3. a whole Set by interfaces after a whole Set by nodes: the Set by nodes: the server is not answering as CloudVision: {answer}"),
            ],
            "{profile}: {text}"
        );
        for n in ["4", "6", "7", "8"] {
            assert!(
                line(&text, n).starts_with("SKIP ")
                    && line(&text, n).ends_with(&format!(
                        "not asked: the server did not answer as CloudVision (question 3, the Set by nodes: HTTP {status})"
                    )),
                "{profile}: {text}"
            );
        }
        assert!(
            text.contains(
                "cleaned up: nothing to delete: no Set under the throw-away keys was taken"
            ),
            "{text}"
        );
        assert!(
            text.contains("5 question(s) could not be asked: 3, 4, 6, 7, 8: the server is not answering as CloudVision"),
            "{text}"
        );
        assert!(!text.contains("FAIL"), "{text}");
    }
}

/// Unreachable or a refused token: exit 2, nothing written.
#[test]
fn it_writes_nothing_when_it_cannot_run() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
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
/// reported as not asked (exit 2), and the throw-away key is still deleted.
#[test]
fn a_failure_midway_still_cleans_up() {
    let cv = Standin::start();
    // Each answer takes 150 ms, so the test switches the fault in while the check runs.
    cv.set_mode(json!({"mode": "ok", "delay_ms": 150}));
    let site = Site::with_standin(&cv, "");
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

/// Ctrl-C or SIGTERM while the questions run: the throw-away RUNNING record the stand-in
/// already holds is deleted, the line printed first names it with the command that deletes it
/// by hand, and the exit status is 128 + the signal. The stand-in holds the run at its fifth
/// request (question 3's second Set: `"after": 4`) until the signal was sent, so it lands
/// mid-run whatever the pace. With CloudVision failing from then on, the record is
/// named as left, with its curl command. Old code: killed, the record stayed, nothing said.
#[test]
fn a_signal_midway_deletes_the_record_or_says_how() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    for (sig, code, then) in [
        (Signal::SIGTERM, 143, json!({"mode": "ok"})),
        (Signal::SIGINT, 130, json!({"mode": "ok"})),
        (
            Signal::SIGTERM,
            143,
            json!({"mode": "status", "status": 500}),
        ),
    ] {
        let cv = Standin::start();
        cv.set_mode(json!({"mode": "hang", "after": 4}));
        let site = Site::with_standin(&cv, "");
        let child = std::process::Command::new(bin())
            .args(["check", "--contract"])
            .env_remove("CV_API_TOKEN")
            .env_remove("CV_API_SERVER")
            .env("CVSLURM_CONF", &site.conf)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        wait_for("a request held", std::time::Duration::from_secs(20), || {
            cv.requests().iter().any(|r| r["outcome"] == "hang")
        });
        let jobs = cv.state()["jobs"].clone();
        let key = jobs.as_object().unwrap().keys().next().cloned();
        let key = key.expect("the stand-in holds the throw-away record");
        assert!(key.starts_with("cvslurm-contract-"), "{key}");
        kill(Pid::from_raw(child.id() as i32), sig).unwrap();
        // releases the held request (its connection closed)
        cv.set_mode(then.clone());
        let out = child.wait_with_output().unwrap();
        let text = stdout(&out) + &stderr(&out);
        assert_eq!(out.status.code(), Some(code), "{sig}: {text}");
        assert!(
            text.contains(&format!(
                "interrupted by {sig}: the questions stop here; deleting the throw-away records (should that be cut short, delete them by hand: JobConfig {key}: curl -X DELETE"
            )),
            "{text}"
        );
        if then["mode"] == "ok" {
            assert_eq!(cv.state(), json!({"jobs": {}, "nodes": {}}), "{text}");
            assert!(
                text.contains(&format!(
                    "cleaned up: the throw-away JobConfig {key} is deleted"
                )),
                "{text}"
            );
            assert!(
                text.trim_end().ends_with(&format!("interrupted by {sig}")),
                "{text}"
            );
        } else {
            assert!(cv.stored_job(&key).is_some());
            assert!(
                text.contains(&format!(
                    "FAIL clean-up: the throw-away JobConfig {key} is still in CloudVision"
                )) && text.contains("delete it by hand: curl -X DELETE"),
                "{text}"
            );
            assert!(
                text.contains("the throw-away records above are still in CloudVision"),
                "{text}"
            );
        }
        // nothing was asked after the signal but the clean-up
        let after_hang: Vec<String> = cv
            .requests()
            .iter()
            .skip_while(|r| r["outcome"] != "hang")
            .skip(1)
            .map(|r| {
                format!(
                    "{} {}",
                    r["method"].as_str().unwrap_or(""),
                    r["path"].as_str().unwrap_or("")
                )
            })
            .collect();
        assert!(
            after_hang
                .iter()
                .all(|r| r.starts_with("DELETE") || r.starts_with("POST")),
            "{after_hang:?}"
        );
    }
}

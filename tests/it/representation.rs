//! One representation per job: every JobConfig names exactly one of
//! `nodes` and `interfaces`, never an empty list, and a job's records all go the same way (the
//! way its first went, recorded in StateDir/reps/); where that cannot be (an end with no record
//! of how its RUNNING went, a tenant job switched between lists) the stored record is deleted
//! and the whole new one posted. A requeued job's new RUNNING does not keep the earlier run's
//! `end_time`. Each sequence runs through the binary against both profiles of the stand-in —
//! CloudVision's contract (a Set merges) and Arista's own fake CloudVision (a whole record per
//! POST, no GET, no JobConfig delete) — and the assertions are on the records each holds and
//! on every request. No slurmctld here (SlurmBinDir is empty): the job's GPUs can never be
//! asked, as after slurmctld forgot the job. The sequences that need slurmctld's answer (a
//! resend after a node's first inventory; an end the service attributes to MACs) are in
//! tests/e2e_gpu.rs.

use crate::common::*;
use cvslurm::cloudvision::payload::{JobConfig, JobState, Key};
use cvslurm::cloudvision::{Client, ClientOptions};
use cvslurm::internals::state::layout;
use serde_json::{json, Value};
use std::time::Duration;

const KEY_31: &str = "31@hpc-cluster-west";
const MACS: [&str; 2] = ["02:aa:00:00:00:01", "02:aa:00:00:00:02"];
const NODES: [&str; 4] = ["gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-4"];

/// The stored record's list `field`, `None` when it holds none.
fn list(job: &Value, field: &str) -> Option<Vec<String>> {
    job.get(field)
        .and_then(|l| l["values"].as_array())
        .map(|v| v.iter().map(|s| s.as_str().unwrap().to_string()).collect())
}

/// Asserts that the stored record holds exactly `want` in `field` and nothing in the other.
fn holds_only(job: &Value, field: &str, want: &[&str]) {
    let other = if field == "nodes" {
        "interfaces"
    } else {
        "nodes"
    };
    assert_eq!(
        list(job, field),
        Some(want.iter().map(|s| s.to_string()).collect()),
        "{job}"
    );
    assert!(
        list(job, other).is_none_or(|v| v.is_empty()),
        "both lists stored: {job}"
    );
}

fn client(cv: &Standin) -> Client {
    Client::new(ClientOptions {
        server: cv.server(),
        token: cvslurm::config::Token::new(TOKEN),
        ca_file: Some(cv.ca()),
        pins: Vec::new(),
        insecure: false,
        timeout: Duration::from_secs(10),
    })
    .unwrap()
}

/// What the service sent for job 31's RUNNING when slurmctld still knew its GPUs: by MACs
/// (the first request of the job: no `nodes` to clear).
fn running_by_macs(cv: &Standin) {
    let job = JobConfig {
        key: Key { id: KEY_31.into() },
        name: Some("gpt-training@gpu".into()),
        state: JobState::Running,
        start_time: Some("2025-12-05T10:30:00Z".into()),
        end_time: None,
        location: Some("hpc-cluster-west".into()),
        job_type: None,
        nodes: None,
        interfaces: Some(
            MACS.iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .into(),
        ),
    };
    client(cv).post_job(&job, None).unwrap();
    holds_only(&cv.stored_job(KEY_31).unwrap(), "interfaces", &MACS);
}

fn epilog(id: &str) -> Vec<(&str, &str)> {
    job_env("epilog_slurmctld", id, &[("SLURM_JOB_EXIT_CODE2", "0:0")])
}

/// Job 31's end through the service's engine: a socket bound here stands for a service, so
/// the epilog only queues; `queued` runs then (the hook has returned); `flush` sends it.
fn end_through_the_service(site: &Site, queued: impl FnOnce()) {
    let sock = site.state_dir.join(layout::WAKE_SOCKET);
    let listener = std::os::unix::net::UnixDatagram::bind(&sock).unwrap();
    let (out, _) = site.hook(&epilog("31"));
    assert_eq!(out.status.code(), Some(0));
    drop(listener);
    std::fs::remove_file(&sock).unwrap();
    queued();
    let out = site.run(&["flush", "--no-reconcile"]);
    assert_exit_0(&out);
}

/// The methods and statuses of the requests so far, in order.
fn methods(cv: &Standin) -> Vec<String> {
    cv.requests()
        .iter()
        .map(|r| format!("{} {}", r["method"].as_str().unwrap(), r["status"]))
        .collect()
}

/// What a JobConfig delete is answered by the profile: CloudVision deletes (200); Arista's
/// fake CloudVision has no JobConfig delete (a plain 404, not CloudVision's not-found).
fn delete_answer(profile: &str) -> &'static str {
    if profile == "arista" {
        "DELETE 404"
    } else {
        "DELETE 200"
    }
}

/// The RUNNING went by MACs from elsewhere (the other controller; this host has no record of
/// it); the end, sent by a hook without the service after slurmctld forgot the job, goes by
/// node names: CloudVision's stored record is deleted first and the whole end posted, so the
/// record holds node names only (before: both lists, or a request with an empty list).
#[test]
fn an_end_with_no_record_of_its_running_replaces_the_stored_record() {
    for profile in PROFILES {
        let cv = Standin::start_profile(profile);
        let site = Site::with_standin(&cv, "JobInterfaces=gpu");
        running_by_macs(&cv);
        let (out, _) = site.hook(&epilog("31"));
        assert_eq!(out.status.code(), Some(0));
        let job = cv.stored_job(KEY_31).unwrap();
        assert_eq!(
            job["state"],
            "JOB_STATE_COMPLETED",
            "{profile}: {}",
            site.log()
        );
        holds_only(&job, "nodes", &NODES);
        assert_eq!(
            methods(&cv),
            ["POST 200", delete_answer(profile), "POST 200"],
            "{profile}"
        );
        cv.assert_one_list_each();
    }
}

/// The same end with the record of the MACs the RUNNING went with (what the service keeps in
/// StateDir/reps/ when it sends a RUNNING by interfaces): the end goes by those MACs, both
/// from a hook sending by itself and from the service (`flush`, the same engine), with no
/// delete, and the record is forgotten once the end is out.
#[test]
fn an_end_goes_by_the_macs_its_running_went_with() {
    for profile in PROFILES {
        for by_service in [false, true] {
            let cv = Standin::start_profile(profile);
            let site = Site::with_standin(&cv, "JobInterfaces=gpu");
            running_by_macs(&cv);
            let reps = site.state_dir.join(layout::JOB_REPS);
            std::fs::create_dir_all(&reps).unwrap();
            let record = reps.join(KEY_31);
            std::fs::write(&record, format!("{}\n", MACS.join("\n"))).unwrap();
            if by_service {
                end_through_the_service(&site, || {
                    assert!(cv.accepted("JobConfig").len() == 1, "the hook sent nothing")
                });
            } else {
                let (out, _) = site.hook(&epilog("31"));
                assert_eq!(out.status.code(), Some(0));
            }
            let job = cv.stored_job(KEY_31).unwrap();
            assert_eq!(
                job["state"],
                "JOB_STATE_COMPLETED",
                "{profile}: {}",
                site.log()
            );
            holds_only(&job, "interfaces", &MACS);
            assert_eq!(methods(&cv), ["POST 200", "POST 200"], "{profile}");
            cv.assert_one_list_each();
            assert!(!record.exists(), "the record of the MACs outlived the end");
        }
    }
}

/// A hook without the service sends the RUNNING by node names (it never asks slurmctld) and
/// records that; the job's end, sent later by the service (`flush`), goes the same way with
/// no delete. With JobInterfaces=nodes (the default) the requests are the reference's (only
/// `nodes`) and nothing is recorded.
#[test]
fn a_hooks_running_by_node_names_and_its_end_go_the_same_way() {
    for profile in PROFILES {
        let cv = Standin::start_profile(profile);
        let site = Site::with_standin(&cv, "JobInterfaces=gpu");
        let (out, _) = site.hook(&job_env("prolog_slurmctld", "31", &[]));
        assert_eq!(out.status.code(), Some(0));
        let record = site.state_dir.join(layout::JOB_REPS).join(KEY_31);
        assert_eq!(std::fs::read_to_string(&record).unwrap(), "nodes\n");
        end_through_the_service(&site, || {});
        let job = cv.stored_job(KEY_31).unwrap();
        assert_eq!(
            job["state"],
            "JOB_STATE_COMPLETED",
            "{profile}: {}",
            site.log()
        );
        holds_only(&job, "nodes", &NODES);
        assert_eq!(methods(&cv), ["POST 200", "POST 200"], "{profile}");
        assert!(!record.exists(), "the record outlived the end");
        // JobInterfaces=nodes: the reference's bytes, no record.
        let plain = Site::with_standin(&cv, "");
        let (out, _) = plain.hook(&job_env("prolog_slurmctld", "32", &[]));
        assert_eq!(out.status.code(), Some(0));
        let sent = cv.accepted("JobConfig");
        let last = sent.last().unwrap();
        assert_eq!(last["key"]["id"], "32@hpc-cluster-west");
        assert!(last.get("interfaces").is_none(), "{last}");
        assert!(!plain
            .state_dir
            .join(layout::JOB_REPS)
            .join("32@hpc-cluster-west")
            .exists());
        cv.assert_one_list_each();
    }
}

/// A tenant job sent by node names, then by interfaces, then by node names again (`send
/// --tenant`): each switch deletes the stored record first and posts the whole new one, so
/// the record holds the latest list only, whatever the profile and JobInterfaces; no request
/// names both lists or an empty one.
#[test]
fn a_tenant_job_switched_between_nodes_and_interfaces_holds_the_latest_list() {
    for profile in PROFILES {
        let cv = Standin::start_profile(profile);
        for conf in ["", "JobInterfaces=auto"] {
            cv.reset();
            let site = Site::with_standin(&cv, conf);
            let send = |place: &[&str]| {
                let mut args = vec![
                    "send",
                    "--tenant",
                    "tenant-7",
                    "--name",
                    "train",
                    "--location",
                    "tenant-a",
                    "--state",
                    "running",
                    "--start",
                    "2025-12-05T10:30:00Z",
                ];
                args.extend_from_slice(place);
                let out = site.run(&args);
                assert_exit_0(&out);
                cv.stored_job("tenant-7").unwrap()
            };
            holds_only(&send(&["--nodes", "a[1-2]"]), "nodes", &["a1", "a2"]);
            holds_only(
                &send(&["--interfaces", "02:aa:00:00:00:01"]),
                "interfaces",
                &["02:aa:00:00:00:01"],
            );
            holds_only(&send(&["--nodes", "a3"]), "nodes", &["a3"]);
            let d = delete_answer(profile);
            assert_eq!(
                methods(&cv),
                ["POST 200", d, "POST 200", d, "POST 200"],
                "{profile} {conf}"
            );
            cv.assert_one_list_each();
        }
    }
}

/// A requeued job (SLURM_JOB_RESTART_COUNT 1) sent by a hook without the service: its new
/// RUNNING deletes the earlier run's record first, so the stored record has no `end_time`
/// (before: the COMPLETED run's end stayed beside state RUNNING).
#[test]
fn a_requeued_jobs_running_leaves_no_end_time_from_the_hook() {
    for profile in PROFILES {
        requeued_from_the_hook(profile);
    }
}

fn requeued_from_the_hook(profile: &str) {
    let cv = Standin::start_profile(profile);
    let site = Site::with_standin(&cv, "");
    let key = "41@hpc-cluster-west";
    for vars in [
        job_env("prolog_slurmctld", "41", &[]),
        job_env("epilog_slurmctld", "41", &[("SLURM_JOB_EXIT_CODE2", "0:0")]),
    ] {
        let (out, _) = site.hook(&vars);
        assert_eq!(out.status.code(), Some(0));
    }
    let ended = cv.stored_job(key).unwrap();
    assert_eq!(ended["state"], "JOB_STATE_COMPLETED");
    assert!(ended["end_time"].is_string(), "{ended}");
    let (out, _) = site.hook(&job_env(
        "prolog_slurmctld",
        "41",
        &[("SLURM_JOB_RESTART_COUNT", "1")],
    ));
    assert_eq!(out.status.code(), Some(0));
    let rerun = cv.stored_job(key).unwrap();
    assert_eq!(rerun["state"], "JOB_STATE_RUNNING", "{}", site.log());
    assert!(rerun.get("end_time").is_none(), "{rerun}");
    holds_only(&rerun, "nodes", &NODES);
    let deletes: Vec<Value> = cv
        .requests()
        .into_iter()
        .filter(|r| r["method"] == "DELETE")
        .collect();
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    // The first run's RUNNING deleted nothing.
    assert_eq!(cv.accepted("JobConfig").len(), 3);
    cv.assert_one_list_each();
}

/// The same through the service's delivery engine, with a CloudVision that cannot delete a
/// JobConfig (405: a warning, and the RUNNING is sent anyway), and against Arista's fake
/// CloudVision (no JobConfig delete, but every POST replaces the record: no end_time left).
#[test]
fn a_requeued_jobs_running_leaves_no_end_time_from_the_service() {
    for (profile, deletable) in [
        ("cloudvision", true),
        ("cloudvision", false),
        ("arista", false),
    ] {
        let cv = Standin::start_profile(profile);
        if !deletable && profile == "cloudvision" {
            cv.set_behaviour(json!({"delete_job": "unsupported"}));
        }
        let site = Site::with_standin(&cv, "");
        let key = "42@hpc-cluster-west";
        let _svc = Service::start(&site);
        for vars in [
            job_env("prolog_slurmctld", "42", &[]),
            job_env("epilog_slurmctld", "42", &[("SLURM_JOB_EXIT_CODE2", "3:0")]),
        ] {
            let (out, _) = site.hook(&vars);
            assert_eq!(out.status.code(), Some(0));
        }
        wait_for("the first run's end", Duration::from_secs(20), || {
            cv.stored_job(key)
                .is_some_and(|j| j["state"] == "JOB_STATE_FAILED")
        });
        let (out, _) = site.hook(&job_env(
            "prolog_slurmctld",
            "42",
            &[("SLURM_JOB_RESTART_COUNT", "1")],
        ));
        assert_eq!(out.status.code(), Some(0));
        wait_for("the re-run's RUNNING", Duration::from_secs(20), || {
            cv.stored_job(key)
                .is_some_and(|j| j["state"] == "JOB_STATE_RUNNING")
        });
        let rerun = cv.stored_job(key).unwrap();
        let log = site.log();
        assert!(
            log.contains("queued for the service") && !log.contains("sending directly"),
            "{log}"
        );
        if deletable {
            assert!(rerun.get("end_time").is_none(), "{rerun}");
            assert!(!log.contains("did not delete"), "{log}");
        } else {
            // No delete: the admin is told once; where a Set merges the stale end stays,
            // where every POST is a whole record (Arista's) it is gone.
            assert_eq!(
                rerun["end_time"].is_string(),
                profile == "cloudvision",
                "{rerun}"
            );
            assert_eq!(
                log.matches("a new run (a requeue, or a later job under the same id), but CloudVision did not delete its stored record")
                    .count(),
                1,
                "{log}"
            );
            let why = if profile == "arista" {
                "the server is not answering as CloudVision: HTTP 404"
            } else {
                "HTTP 405"
            };
            assert!(log.contains(why), "{log}");
        }
        cv.assert_one_list_each();
        wait_for("an empty outbox", Duration::from_secs(10), || {
            site.outbox().is_empty()
        });
    }
}

/// A delete that fails for a reason that may pass (HTTP 503) sends no RUNNING (it would
/// show beside the earlier end time): the event stays in the outbox, and `flush` later
/// deletes first, then sends it.
#[test]
fn a_failed_delete_keeps_the_reruns_running_queued() {
    for profile in PROFILES {
        failed_delete(profile);
    }
}

/// A re-run's RUNNING deletes the earlier run's record once: when its POST then fails, the
/// resend posts the RUNNING alone (a second DELETE would take the live record away again, and
/// a failed POST after it would leave the job absent).
#[test]
fn a_reruns_running_resent_after_a_failed_post_deletes_nothing_again() {
    for profile in PROFILES {
        let cv = Standin::start_profile(profile);
        let site = Site::with_standin(&cv, "");
        let key = "44@hpc-cluster-west";
        for vars in [
            job_env("prolog_slurmctld", "44", &[]),
            job_env("epilog_slurmctld", "44", &[("SLURM_JOB_EXIT_CODE2", "0:0")]),
        ] {
            let (out, _) = site.hook(&vars);
            assert_eq!(out.status.code(), Some(0));
        }
        // The DELETE is answered as the profile answers it, the POST after it with a 503.
        cv.set_mode(json!({"mode": "status", "status": 503, "count": 1, "after": 1}));
        let (out, _) = site.hook(&job_env(
            "prolog_slurmctld",
            "44",
            &[("SLURM_JOB_RESTART_COUNT", "1")],
        ));
        assert_eq!(out.status.code(), Some(0));
        assert_eq!(site.outbox().len(), 1, "{}", site.log());
        let out = site.run(&["flush", "--no-reconcile"]);
        assert_exit_0(&out);
        let rerun = cv.stored_job(key).unwrap();
        assert_eq!(rerun["state"], "JOB_STATE_RUNNING", "{}", site.log());
        assert!(rerun.get("end_time").is_none(), "{rerun}");
        assert_eq!(
            methods(&cv),
            [
                "POST 200",
                "POST 200",
                delete_answer(profile),
                "POST 503",
                "POST 200"
            ],
            "{profile}: {}",
            site.log()
        );
    }
}

fn failed_delete(profile: &str) {
    let cv = Standin::start_profile(profile);
    let site = Site::with_standin(&cv, "");
    let key = "43@hpc-cluster-west";
    for vars in [
        job_env("prolog_slurmctld", "43", &[]),
        job_env("epilog_slurmctld", "43", &[("SLURM_JOB_EXIT_CODE2", "0:0")]),
    ] {
        let (out, _) = site.hook(&vars);
        assert_eq!(out.status.code(), Some(0));
    }
    cv.set_mode(json!({"mode": "status", "status": 503, "count": 1}));
    let (out, _) = site.hook(&job_env(
        "prolog_slurmctld",
        "43",
        &[("SLURM_JOB_RESTART_COUNT", "1")],
    ));
    assert_eq!(out.status.code(), Some(0));
    let kept = cv.stored_job(key).unwrap();
    assert_eq!(kept["state"], "JOB_STATE_COMPLETED", "{}", site.log());
    let pending = site.outbox();
    assert_eq!(pending.len(), 1, "{}", site.log());
    assert_eq!(pending[0]["job"]["state"], "JOB_STATE_RUNNING");
    assert!(site.log().contains("HTTP 503"), "{}", site.log());
    let out = site.run(&["flush", "--no-reconcile"]);
    assert_exit_0(&out);
    let rerun = cv.stored_job(key).unwrap();
    assert_eq!(rerun["state"], "JOB_STATE_RUNNING");
    assert!(rerun.get("end_time").is_none(), "{rerun}");
    assert_eq!(
        methods(&cv),
        [
            "POST 200",
            "POST 200",
            "DELETE 503",
            delete_answer(profile),
            "POST 200"
        ]
    );
    cv.assert_one_list_each();
}

//! CloudVision's Set is a partial update (issue 18): a job's stored record holds exactly one of
//! `nodes` and `interfaces` whichever way its events went, and a requeued job's new RUNNING
//! does not keep the earlier run's `end_time`. Each sequence runs through the binary against
//! the strict stand-in, and the assertions are on the record it stores (what a GetOne would
//! answer), not on the requests. No slurmctld here (SlurmBinDir is empty): the job's GPUs can
//! never be asked, as after slurmctld forgot the job. The sequences that need slurmctld's
//! answer (a resend after a node's first inventory; an end the service attributes to MACs
//! after a hook sent the RUNNING by names) are in tests/e2e_gpu.rs.

mod common;
use common::*;
use cvslurm::cloudvision::{Client, ClientOptions};
use cvslurm::internals::state::layout;
use cvslurm::payload::{JobConfig, JobState, Key};
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

/// The RUNNING went by MACs; the end, sent by a hook without the service after slurmctld
/// forgot the job (no GPUs to ask, no record of the MACs), goes by node names and clears the
/// MACs: the record holds node names only (before: both lists).
#[test]
fn an_end_by_node_names_after_a_running_by_macs_clears_the_macs() {
    let cv = Standin::start();
    let site = Site::new(&cv.server(), &cv.ca(), "JobInterfaces=gpu");
    running_by_macs(&cv);
    let (out, _) = site.hook(&epilog("31"));
    assert_eq!(out.status.code(), Some(0));
    let job = cv.stored_job(KEY_31).unwrap();
    assert_eq!(job["state"], "JOB_STATE_COMPLETED", "{}", site.log());
    holds_only(&job, "nodes", &NODES);
}

/// The same end with the record of the MACs the RUNNING went with (what the service keeps in
/// StateDir/macs/ when it sends a RUNNING by interfaces): the end goes by those MACs, both
/// from a hook sending by itself and from the service (`flush`, the same engine), and the
/// record is forgotten once the end is out.
#[test]
fn an_end_goes_by_the_macs_its_running_went_with() {
    for by_service in [false, true] {
        let cv = Standin::start();
        let site = Site::new(&cv.server(), &cv.ca(), "JobInterfaces=gpu");
        running_by_macs(&cv);
        let macs_dir = site.state_dir.join("macs");
        std::fs::create_dir_all(&macs_dir).unwrap();
        let record = macs_dir.join(KEY_31);
        std::fs::write(&record, format!("{}\n", MACS.join("\n"))).unwrap();
        if by_service {
            // A socket bound here stands for a service: the hook only queues; flush sends.
            std::fs::create_dir_all(&site.state_dir).unwrap();
            let sock = site.state_dir.join(layout::WAKE_SOCKET);
            let listener = std::os::unix::net::UnixDatagram::bind(&sock).unwrap();
            let (out, _) = site.hook(&epilog("31"));
            assert_eq!(out.status.code(), Some(0));
            drop(listener);
            std::fs::remove_file(&sock).unwrap();
            assert!(cv.accepted("JobConfig").len() == 1, "the hook sent nothing");
            let out = site.run(&["flush", "--no-reconcile"]);
            assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        } else {
            let (out, _) = site.hook(&epilog("31"));
            assert_eq!(out.status.code(), Some(0));
        }
        let job = cv.stored_job(KEY_31).unwrap();
        assert_eq!(job["state"], "JOB_STATE_COMPLETED", "{}", site.log());
        holds_only(&job, "interfaces", &MACS);
        assert!(!record.exists(), "the record of the MACs outlived the end");
    }
}

/// A hook without the service sends the RUNNING by node names (it never asks slurmctld);
/// with `JobInterfaces=gpu` the request clears `interfaces`, so a record an earlier request
/// stored by MACs is left with node names only.
#[test]
fn a_running_by_node_names_clears_macs_stored_before() {
    let cv = Standin::start();
    let site = Site::new(&cv.server(), &cv.ca(), "JobInterfaces=gpu");
    running_by_macs(&cv);
    let (out, _) = site.hook(&job_env("prolog_slurmctld", "31", &[]));
    assert_eq!(out.status.code(), Some(0));
    let job = cv.stored_job(KEY_31).unwrap();
    assert_eq!(job["state"], "JOB_STATE_RUNNING", "{}", site.log());
    holds_only(&job, "nodes", &NODES);
    // With JobInterfaces=nodes (the default) the request is the reference's: only `nodes`.
    let plain = Site::new(&cv.server(), &cv.ca(), "");
    let (out, _) = plain.hook(&job_env("prolog_slurmctld", "32", &[]));
    assert_eq!(out.status.code(), Some(0));
    let sent = cv.accepted("JobConfig");
    let last = sent.last().unwrap();
    assert_eq!(last["key"]["id"], "32@hpc-cluster-west");
    assert!(last.get("interfaces").is_none(), "{last}");
}

/// A tenant job sent by node names, then by interfaces, then by node names again (`send
/// --tenant`): each request leaves the record with its own list only. With JobInterfaces=nodes
/// a job by node names is sent as the reference sends it (only `nodes`), so there only the
/// switch to interfaces clears.
#[test]
fn a_tenant_job_switched_between_nodes_and_interfaces_holds_the_latest_list() {
    let cv = Standin::start();
    for conf in ["", "JobInterfaces=auto"] {
        let site = Site::new(&cv.server(), &cv.ca(), conf);
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
            assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
            cv.stored_job("tenant-7").unwrap()
        };
        holds_only(&send(&["--nodes", "a[1-2]"]), "nodes", &["a1", "a2"]);
        holds_only(
            &send(&["--interfaces", "02:aa:00:00:00:01"]),
            "interfaces",
            &["02:aa:00:00:00:01"],
        );
        let back = send(&["--nodes", "a3"]);
        if conf.is_empty() {
            assert_eq!(list(&back, "nodes"), Some(vec!["a3".to_string()]), "{back}");
            let sent = cv.accepted("JobConfig");
            assert!(sent.last().unwrap().get("interfaces").is_none(), "{sent:?}");
            // The reset for the next round: the record starts anew.
            cv.reset();
        } else {
            holds_only(&back, "nodes", &["a3"]);
        }
    }
}

/// A requeued job (SLURM_JOB_RESTART_COUNT 1) sent by a hook without the service: its new
/// RUNNING deletes the earlier run's record first, so the stored record has no `end_time`
/// (before: the COMPLETED run's end stayed beside state RUNNING).
#[test]
fn a_requeued_jobs_running_leaves_no_end_time_from_the_hook() {
    let cv = Standin::start();
    let site = Site::new(&cv.server(), &cv.ca(), "");
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
}

/// The same through the service's delivery engine, and with a CloudVision that cannot delete
/// a JobConfig (405): a warning, and the RUNNING is sent anyway.
#[test]
fn a_requeued_jobs_running_leaves_no_end_time_from_the_service() {
    for deletable in [true, false] {
        let cv = Standin::start();
        if !deletable {
            cv.set_behaviour(json!({"delete_job": "unsupported"}));
        }
        let site = Site::new(&cv.server(), &cv.ca(), "");
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
            // CloudVision cannot delete: the stale end stays, and the admin is told.
            assert!(rerun["end_time"].is_string(), "{rerun}");
            assert_eq!(
                log.matches("a re-run, but CloudVision did not delete the earlier run's record")
                    .count(),
                1,
                "{log}"
            );
            assert!(log.contains("HTTP 405"), "{log}");
        }
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
    let cv = Standin::start();
    let site = Site::new(&cv.server(), &cv.ca(), "");
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
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let rerun = cv.stored_job(key).unwrap();
    assert_eq!(rerun["state"], "JOB_STATE_RUNNING");
    assert!(rerun.get("end_time").is_none(), "{rerun}");
    let methods: Vec<String> = cv
        .requests()
        .iter()
        .map(|r| format!("{} {}", r["method"].as_str().unwrap(), r["status"]))
        .collect();
    assert_eq!(
        methods,
        [
            "POST 200",
            "POST 200",
            "DELETE 503",
            "DELETE 200",
            "POST 200"
        ]
    );
}

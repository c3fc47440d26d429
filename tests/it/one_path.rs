//! One path to CloudVision: the hook's own send, `send` and the service's engine (`flush`)
//! finish a job's record the same way, and the one-shot `inventory` retries a NodeConfig by
//! the service's policy.

use crate::common::*;
use cvslurm::internals::state::layout;
use serde_json::json;

const KEY_31: &str = "31@hpc-cluster-west";

/// The methods and statuses of the requests so far, in order.
fn methods(cv: &Standin) -> Vec<String> {
    cv.requests()
        .iter()
        .map(|r| format!("{} {}", r["method"].as_str().unwrap(), r["status"]))
        .collect()
}

/// CloudVision refuses the next request for good (HTTP 400).
fn refuse_once(cv: &Standin) {
    cv.set_mode(json!({"mode": "status", "status": 400, "count": 1}));
}

/// An end CloudVision refuses for good ends the job's record of how it goes
/// (StateDir/reps/), whichever path sent it: the service's engine (`flush`), the hook's own
/// send and `send --tenant` (before, only the engine removed it; the other two kept it until
/// it aged out).
#[test]
fn a_refused_end_ends_the_jobs_record_on_every_path() {
    let epilog = || job_env("epilog_slurmctld", "31", &[("SLURM_JOB_EXIT_CODE2", "0:0")]);
    for path in ["engine", "hook"] {
        let cv = Standin::start();
        let site = Site::with_standin(&cv, "JobInterfaces=gpu");
        let (out, _) = site.hook(&job_env("prolog_slurmctld", "31", &[]));
        assert_eq!(out.status.code(), Some(0));
        let record = site.state_dir.join(layout::JOB_REPS).join(KEY_31);
        assert_eq!(std::fs::read_to_string(&record).unwrap(), "nodes\n");
        refuse_once(&cv);
        if path == "engine" {
            // A bound socket stands for a service: the epilog only queues; flush sends.
            let sock = site.state_dir.join(layout::WAKE_SOCKET);
            let listener = std::os::unix::net::UnixDatagram::bind(&sock).unwrap();
            let (out, _) = site.hook(&epilog());
            assert_eq!(out.status.code(), Some(0));
            drop(listener);
            std::fs::remove_file(&sock).unwrap();
            let _ = site.run(&["flush", "--no-reconcile"]);
        } else {
            let (out, _) = site.hook(&epilog());
            assert_eq!(out.status.code(), Some(0));
        }
        assert_eq!(
            methods(&cv),
            ["POST 200", "POST 400"],
            "{path}: {}",
            site.log()
        );
        assert!(
            !record.exists(),
            "{path}: the record outlived the refused end: {}",
            site.log()
        );
    }
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    let send = |state: &str, end: &[&str]| {
        let mut args = vec![
            "send",
            "--tenant",
            "tenant-7",
            "--name",
            "train",
            "--location",
            "tenant-a",
            "--state",
            state,
            "--start",
            "2025-12-05T10:30:00Z",
            "--interfaces",
            "02:aa:00:00:00:01",
        ];
        args.extend_from_slice(end);
        site.run(&args)
    };
    assert_exit_0(&send("running", &[]));
    let record = site.state_dir.join(layout::JOB_REPS).join("tenant-7");
    assert!(record.exists(), "a tenant job's list is recorded");
    refuse_once(&cv);
    let out = send("completed", &["--end", "2025-12-05T11:30:00Z"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(methods(&cv), ["POST 200", "POST 400"]);
    assert!(
        !record.exists(),
        "send: the record outlived the refused end"
    );
}

/// A site whose Slurm is three scripts: cluster c1, node n1 idle, and a worker answering
/// with one data interface.
fn one_node_site(cv: &Standin) -> Site {
    let site = Site::with_standin(cv, "");
    let worker = r#"0: {"node_name":"n1","hostname":"n1","location":null,"interfaces":[{"name":"eth1","mac_address":"02:99:00:00:01:02","ip_addresses":["10.0.0.2"]}]}"#;
    for (name, body) in [
        ("scontrol", "printf 'ClusterName = c1\\n'".to_string()),
        ("sinfo", "echo 'n1 idle p1'".to_string()),
        ("srun", format!("echo '{worker}'")),
    ] {
        site.command(name, &format!("#!/bin/sh\n{body}\n"));
    }
    site
}

/// The one-shot `inventory` sends a NodeConfig by the service's retry policy: what the
/// service would keep for a retry (a 503) is sent again after the service's backoff, and
/// goes through; what the service rejects (a 400) is final at once (before, only a 429 was
/// tried again and a 503 failed the run).
#[test]
fn a_one_shot_inventory_retries_a_nodeconfig_as_the_service_does() {
    let cv = Standin::start();
    let site = one_node_site(&cv);
    cv.set_mode(json!({"mode": "status", "status": 503, "count": 1}));
    let out = site.run(&["inventory"]);
    assert_exit_0(&out);
    assert!(
        stdout(&out).contains("inventory of cluster c1: 1 sent, 0 failed"),
        "{}",
        stdout(&out)
    );
    assert_eq!(methods(&cv), ["POST 503", "POST 200"]);
    assert!(cv.stored_node("n1").is_some());
    cv.reset();
    refuse_once(&cv);
    let out = site.run(&["inventory"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("inventory of cluster c1: 0 sent, 1 failed (n1)"),
        "{}",
        stdout(&out)
    );
    assert_eq!(methods(&cv), ["POST 400"]);
}

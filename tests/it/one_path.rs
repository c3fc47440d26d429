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

/// `send` of a requeued job's RUNNING (Slurm's restart count 1) goes as the engine sends a
/// re-run's RUNNING: the earlier run's stored record is deleted first, once, so the record
/// holds no `end_time` of that run; a second `send` of the same run deletes nothing. Before,
/// `send` posted it as a plain record, and CloudVision's Set kept the earlier run's end.
#[test]
fn send_of_a_reruns_running_deletes_the_earlier_runs_record_as_the_engine_does() {
    use cvslurm::cloudvision::payload::{JobConfig, JobState, Key};
    use cvslurm::cloudvision::{Client, ClientOptions};
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/slurm-24.11");
    let rerun = site.dir.path().join("job5.json");
    let running =
        std::fs::read_to_string(format!("{fixtures}/scontrol-json-show-job-running.json")).unwrap();
    assert!(running.contains("\"restart_cnt\": 0"));
    std::fs::write(
        &rerun,
        running.replace("\"restart_cnt\": 0", "\"restart_cnt\": 1"),
    )
    .unwrap();
    site.command(
        "scontrol",
        &format!(
            "#!/bin/sh\ncase \"$*\" in\n\
             *--version*) echo 'slurm 24.11.5' ;;\n\
             *'show config'*) echo 'ClusterName = cvlab-trixie' ;;\n\
             *'show job 5') cat {} ;;\n\
             *) echo '{{\"jobs\": []}}' ;;\nesac\n",
            rerun.display()
        ),
    );
    site.command("sacct", "#!/bin/sh\necho '{\"jobs\": []}'\n");
    // The earlier run's end, as CloudVision holds it.
    let client = Client::new(ClientOptions {
        server: cv.server(),
        token: cvslurm::config::Token::new(TOKEN),
        ca_file: Some(cv.ca()),
        pins: Vec::new(),
        insecure: false,
        timeout: std::time::Duration::from_secs(10),
    })
    .unwrap();
    let key = "5@cvlab-trixie";
    let ended = JobConfig {
        key: Key { id: key.into() },
        name: Some("earlier@debug".into()),
        state: JobState::Completed,
        start_time: Some("2025-12-05T10:30:00Z".into()),
        end_time: Some("2025-12-05T10:31:00Z".into()),
        location: Some("cvlab-trixie".into()),
        job_type: None,
        nodes: Some(vec!["n1".to_string()].into()),
        interfaces: None,
    };
    client.post_job(&ended, None).unwrap();
    cv.reset();
    client.post_job(&ended, None).unwrap();
    let out = site.run(&["send", "5"]);
    assert_exit_0(&out);
    let stored = cv.stored_job(key).unwrap();
    assert_eq!(stored["state"], "JOB_STATE_RUNNING", "{stored}");
    assert!(
        stored.get("end_time").is_none(),
        "the earlier run's end stayed: {stored}"
    );
    assert_eq!(methods(&cv), ["POST 200", "DELETE 200", "POST 200"]);
    let out = site.run(&["send", "5"]);
    assert_exit_0(&out);
    assert_eq!(
        methods(&cv),
        ["POST 200", "DELETE 200", "POST 200", "POST 200"],
        "a resend of the same run deletes nothing"
    );
}

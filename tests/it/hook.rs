//! The hook as slurmctld runs it (argv[0] symlink, bare environment) against the stand-in.

use crate::common::*;
use cvslurm::internals::state::layout;
use serde_json::{json, Value};
use std::time::Duration;

#[test]
fn prolog_sends_running_with_expanded_nodes() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    let (out, _) = site.hook(&job_env(
        "prolog_slurmctld",
        "12345",
        &[("SLURM_JOB_START_TIME", "1764930600")],
    ));
    assert_eq!(out.status.code(), Some(0));
    assert!(
        out.stdout.is_empty() && out.stderr.is_empty(),
        "hook printed: {}",
        stderr(&out)
    );
    let jobs = cv.accepted("JobConfig");
    assert_eq!(
        jobs,
        vec![
            json!({"key":{"id":"12345@hpc-cluster-west"},"name":"gpt-training@gpu",
            "state":"JOB_STATE_RUNNING","start_time":"2025-12-05T10:30:00Z","location":"hpc-cluster-west",
            "nodes":{"values":["gpu-node-1","gpu-node-2","gpu-node-3","gpu-node-4"]}})
        ]
    );
    assert!(site.outbox().is_empty(), "a sent event leaves the outbox");
    let log = site.log();
    assert!(
        log.contains("job 12345@hpc-cluster-west: sent RUNNING"),
        "{log}"
    );
    assert!(!log.contains(TOKEN), "the token must never be logged");
}

#[test]
fn epilog_without_times_uses_prolog_record_and_exit_codes() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    // Slurm 22.05: no SLURM_JOB_START_TIME / END_TIME; no scontrol reachable (SlurmBinDir empty).
    let (out, _) = site.hook(&job_env("prolog_slurmctld", "7", &[]));
    assert_eq!(out.status.code(), Some(0));
    let started = cv.accepted("JobConfig")[0]["start_time"]
        .as_str()
        .unwrap()
        .to_string();
    for (id, code, want) in [
        ("7", "0:0", "JOB_STATE_COMPLETED"),
        ("8", "3:0", "JOB_STATE_FAILED"),
        ("9", "0:9", "JOB_STATE_FAILED"),
    ] {
        let (out, _) = site.hook(&job_env(
            "epilog_slurmctld",
            id,
            &[("SLURM_JOB_EXIT_CODE2", code)],
        ));
        assert_eq!(out.status.code(), Some(0));
        let last = cv.accepted("JobConfig").pop().unwrap();
        assert_eq!(last["key"]["id"], format!("{id}@hpc-cluster-west"));
        assert_eq!(last["state"], want, "exit {code}");
        assert!(last["end_time"].as_str().unwrap().ends_with('Z'));
        if id == "7" {
            assert_eq!(
                last["start_time"].as_str().unwrap(),
                started,
                "start comes from the prolog's record"
            );
        }
    }
    let log = site.log();
    assert!(
        log.contains("cannot ask slurmctld for the end state"),
        "{log}"
    );
    assert!(
        !site
            .state_dir
            .join(layout::JOBS)
            .join("7@hpc-cluster-west")
            .exists(),
        "start record removed at the end"
    );
}

#[test]
fn slurm_23_times_are_used_and_prolog_end_time_ignored() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    let times = [
        ("SLURM_JOB_START_TIME", "1764930600"),
        ("SLURM_JOB_END_TIME", "1764934200"),
    ];
    site.hook(&job_env("prolog_slurmctld", "20", &times));
    site.hook(&job_env(
        "epilog_slurmctld",
        "20",
        &[times[0], times[1], ("SLURM_JOB_EXIT_CODE2", "0:0")],
    ));
    let jobs = cv.accepted("JobConfig");
    assert!(
        jobs[0].get("end_time").is_none(),
        "the prolog's END_TIME is the time limit, not an end"
    );
    assert_eq!(jobs[1]["start_time"], "2025-12-05T10:30:00Z");
    assert_eq!(jobs[1]["end_time"], "2025-12-05T11:30:00Z");
}

#[test]
fn odd_nodelists_and_no_partition() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    site.hook(&[
        ("SLURM_SCRIPT_CONTEXT", "prolog_slurmctld"),
        ("SLURM_JOB_ID", "30"),
        ("SLURM_CLUSTER_NAME", "c1"),
        ("SLURM_JOB_NAME", "my job"),
        (
            "SLURM_JOB_NODELIST",
            "rack[1-2]-n[08-10],gpu[1,3]-ib,login.x",
        ),
    ]);
    let j = &cv.accepted("JobConfig")[0];
    assert_eq!(j["name"], "my job");
    assert_eq!(
        j["nodes"]["values"],
        json!([
            "rack1-n08",
            "rack1-n09",
            "rack1-n10",
            "rack2-n08",
            "rack2-n09",
            "rack2-n10",
            "gpu1-ib",
            "gpu3-ib",
            "login.x"
        ])
    );
}

#[test]
fn missing_or_malformed_variables_send_nothing_and_say_what() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    let (out, _) = site.hook(&[
        ("SLURM_SCRIPT_CONTEXT", "prolog_slurmctld"),
        ("SLURM_JOB_ID", "40"),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let (out2, _) = site.hook(&job_env(
        "prolog_slurmctld",
        "41",
        &[("SLURM_JOB_NODELIST", "n[1-2")],
    ));
    assert_eq!(out2.status.code(), Some(0));
    let (out3, _) = site.hook(&[]);
    assert_eq!(out3.status.code(), Some(0));
    assert!(cv.requests().is_empty());
    let log = site.log();
    assert!(
        log.contains(
            "job 40: not sent: missing SLURM_CLUSTER_NAME, SLURM_JOB_NODELIST, SLURM_JOB_NAME"
        ),
        "{log}"
    );
    assert!(
        log.contains("job 41: not sent: SLURM_JOB_NODELIST: bad hostlist \"n[1-2\""),
        "{log}"
    );
    assert!(
        log.contains("job ?: not sent: missing SLURM_SCRIPT_CONTEXT"),
        "{log}"
    );
}

/// A heterogeneous job's components: hostile `SLURM_HET_JOB_*` send nothing and name the
/// variable; without the service each component's event is kept under the leader's key, and
/// `flush` sends one record of the whole job, composed from slurmctld's record of every
/// component, never one keyed by a component's own id.
#[test]
fn het_components_go_as_one_job_and_hostile_values_are_refused() {
    let cv = Standin::start();
    let site = Site::new(&cv.server(), &cv.ca(), "");
    for (leader, offset, says) in [
        ("6;rm", "1", "SLURM_HET_JOB_ID=\"6;rm\" is not a job number"),
        (
            "6",
            "999",
            "SLURM_HET_JOB_OFFSET=\"999\" is not a component index (0 to 127)",
        ),
        (
            "6",
            "0",
            "SLURM_HET_JOB_ID=\"6\" and SLURM_HET_JOB_OFFSET=0 disagree with SLURM_JOB_ID=\"7\"",
        ),
    ] {
        let het = [
            ("SLURM_HET_JOB_ID", leader),
            ("SLURM_HET_JOB_OFFSET", offset),
        ];
        let (out, _) = site.hook(&job_env("prolog_slurmctld", "7", &het));
        assert_eq!(out.status.code(), Some(0));
        assert!(
            site.log().contains(&format!("job 7: not sent: {says}")),
            "{}",
            site.log()
        );
    }
    assert!(site.outbox().is_empty());
    for (id, offset, nodes) in [("6", "0", "n1"), ("7", "1", "n[2-3]"), ("8", "2", "n3")] {
        let het = [
            ("SLURM_HET_JOB_ID", "6"),
            ("SLURM_HET_JOB_OFFSET", offset),
            ("SLURM_JOB_NODELIST", nodes),
        ];
        let (out, _) = site.hook(&job_env("prolog_slurmctld", id, &het));
        assert_eq!(out.status.code(), Some(0));
    }
    assert!(cv.requests().is_empty(), "no component sent by its hook");
    let outbox = site.outbox();
    assert_eq!(outbox.len(), 1, "{outbox:?}");
    assert_eq!(outbox[0]["job"]["key"]["id"], "6@hpc-cluster-west");
    assert!(site.log().contains("job 6@hpc-cluster-west: RUNNING of component 8 (offset 2) of the heterogeneous job kept in outbox for the service or cvslurm flush"), "{}", site.log());
    let comp = |id: u32, offset: u32, nodes: &str| {
        json!({"job_id": id, "name": "gpt-training", "partition": "gpu", "job_state": ["RUNNING"],
               "start_time": {"set": true, "infinite": false, "number": 1_700_000_000},
               "nodes": nodes, "het_job_id": {"set": true, "infinite": false, "number": 6},
               "het_job_offset": {"set": true, "infinite": false, "number": offset}})
    };
    let components = json!({"jobs": [comp(6, 0, "n1"), comp(7, 1, "n[2-3]"), comp(8, 2, "n3")]});
    site.command(
        "scontrol",
        &format!(
            "#!/bin/sh\ncase \"$*\" in\n*--version*) echo 'slurm 24.11.5' ;;\n\
             *'show config'*) echo 'ClusterName = hpc-cluster-west' ;;\n\
             *'show job 6') echo '{components}' ;;\n*) echo '{{\"jobs\": []}}' ;;\nesac\n"
        ),
    );
    site.command("sacct", "#!/bin/sh\necho '{\"jobs\": []}'\n");
    let out = site.run(&["flush", "--no-reconcile"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let jobs = cv.accepted("JobConfig");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["key"]["id"], "6@hpc-cluster-west");
    assert_eq!(jobs[0]["state"], "JOB_STATE_RUNNING");
    assert_eq!(jobs[0]["nodes"]["values"], json!(["n1", "n2", "n3"]));
    assert_eq!(jobs[0]["start_time"], "2023-11-14T22:13:20Z");
}

#[test]
fn filtered_jobs_send_nothing() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "Partitions=cpu,debug");
    site.hook(&job_env(
        "prolog_slurmctld",
        "50",
        &[
            ("SLURM_JOB_NAME", "cv-interface-discovery"),
            ("SLURM_JOB_PARTITION", "debug"),
        ],
    ));
    site.hook(&job_env("prolog_slurmctld", "51", &[]));
    site.hook(&job_env(
        "prolog_slurmctld",
        "52",
        &[("SLURM_JOB_PARTITION", "debug")],
    ));
    let jobs = cv.accepted("JobConfig");
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0]["key"]["id"], "52@hpc-cluster-west");
    let log = site.log();
    assert!(log.contains("job 50@hpc-cluster-west: filtered out (name \"cv-interface-discovery\" matches JobNameExclude)"), "{log}");
    assert!(
        log.contains(
            "job 51@hpc-cluster-west: filtered out (partition \"gpu\" is not in Partitions)"
        ),
        "{log}"
    );
}

#[test]
fn cloudvision_failures_keep_the_event_and_flush_delivers_it() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    cv.set_mode(json!({"mode": "status", "status": 503}));
    let (out, _) = site.hook(&job_env("prolog_slurmctld", "60", &[]));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(site.outbox().len(), 1);
    assert!(
        site.log().contains(
            "job 60@hpc-cluster-west: RUNNING kept in outbox: CloudVision failed: HTTP 503"
        ),
        "{}",
        site.log()
    );
    // The job ends while CloudVision is still down: its end waits behind its RUNNING, and the
    // hook does not send it (that could put it before the RUNNING).
    site.hook(&job_env(
        "epilog_slurmctld",
        "60",
        &[("SLURM_JOB_EXIT_CODE2", "0:0")],
    ));
    let pending = site.outbox();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0]["job"]["state"], "JOB_STATE_RUNNING");
    assert_eq!(pending[0]["then"]["job"]["state"], "JOB_STATE_COMPLETED");
    assert!(site
        .log()
        .contains("COMPLETED queued after its RUNNING, which is still waiting to be sent"));
    cv.set_mode(json!({"mode": "ok"}));
    let out = site.run(&["flush"]);
    assert_exit_0(&out);
    assert_eq!(
        stdout(&out).trim(),
        "outbox: 2 delivered, 0 kept, 0 rejected"
    );
    let states: Vec<Value> = cv
        .accepted("JobConfig")
        .iter()
        .map(|j| j["state"].clone())
        .collect();
    assert_eq!(
        states,
        ["JOB_STATE_RUNNING", "JOB_STATE_COMPLETED"],
        "RUNNING, then the end: never the end alone, never RUNNING after it"
    );
    assert!(site.outbox().is_empty());
    assert_eq!(
        cv.state()["jobs"]["60@hpc-cluster-west"]["state"],
        "JOB_STATE_COMPLETED"
    );
}

#[test]
fn refused_token_is_reported_and_event_kept() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    std::fs::write(&site.token_file, "expired-token\n").unwrap();
    site.hook(&job_env("prolog_slurmctld", "70", &[]));
    let log = site.log();
    assert!(
        log.contains("RUNNING kept in outbox: CloudVision refused the token (expired or lacking JobConfig/NodeConfig permission): HTTP 401"),
        "{log}"
    );
    assert!(!log.contains("expired-token"));
    assert_eq!(site.outbox().len(), 1);
    // Fixed token: flush delivers.
    std::fs::write(&site.token_file, format!("{TOKEN}\n")).unwrap();
    let out = site.run(&["flush"]);
    assert_exit_0(&out);
    assert_eq!(cv.accepted("JobConfig").len(), 1);
}

#[test]
fn rejected_payload_moves_to_rejected() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    cv.set_mode(json!({"mode": "status", "status": 503}));
    site.hook(&job_env("prolog_slurmctld", "75", &[]));
    cv.set_mode(json!({"mode": "status", "status": 400, "message": "bad field"}));
    let out = site.run(&["flush"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("0 delivered, 0 kept, 1 rejected"),
        "{}",
        stdout(&out)
    );
    assert!(site.outbox().is_empty());
    let rejected: Vec<_> = std::fs::read_dir(site.state_dir.join(layout::REJECTED))
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(rejected.len(), 1);
    let text = std::fs::read_to_string(rejected[0].path()).unwrap();
    assert!(text.contains("HTTP 400: bad field"), "{text}");
}

#[test]
fn hanging_cloudvision_never_delays_past_the_budget() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "HookTimeout=1");
    cv.set_mode(json!({"mode": "hang"}));
    let (out, took) = site.hook(&job_env("prolog_slurmctld", "80", &[]));
    assert_eq!(out.status.code(), Some(0));
    // The request was cut at the hook's own deadline (what is left of the 1 s budget), not
    // at some longer timeout; the wall-clock bound is loose on purpose (a loaded CI machine
    // starts processes slowly) and still far below a hang.
    let log = site.log();
    let cut_at: f64 = log
        .split("did not answer within ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no timeout in the log: {log}"));
    assert!(
        cut_at <= 1.0,
        "cut after {cut_at} s with a 1 s budget: {log}"
    );
    assert!(
        took < Duration::from_secs(10),
        "hook took {took:?} with a 1 s budget"
    );
    assert_eq!(site.outbox().len(), 1, "the event is kept");
}

#[test]
fn cloudvision_down_keeps_the_event() {
    let cv = Standin::start();
    let ca = cv.ca();
    let dead = cv.server();
    let site = Site::new(&dead, &ca, "");
    let ca_copy = site.dir.path().join("ca.pem");
    std::fs::copy(&ca, &ca_copy).unwrap();
    drop(cv);
    let text = std::fs::read_to_string(&site.conf)
        .unwrap()
        .replace(&ca.display().to_string(), &ca_copy.display().to_string());
    std::fs::write(&site.conf, text).unwrap();
    let (out, _) = site.hook(&job_env("prolog_slurmctld", "90", &[]));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(site.outbox().len(), 1);
    assert!(
        site.log().contains(&format!(
            "RUNNING kept in outbox: cannot reach CloudVision at {dead}"
        )),
        "{}",
        site.log()
    );
}

#[test]
fn untrusted_certificate_is_refused_unless_insecure() {
    let cv = Standin::start();
    let other = Scratch::new("otherca");
    // A CA that did not sign the stand-in's certificate.
    let status = std::process::Command::new("python3")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/standin/cv_standin.py"))
        .args(["--dir", other.path().to_str().unwrap(), "--gen-certs-only"])
        .status()
        .unwrap();
    assert!(status.success());
    let site = Site::new(&cv.server(), &other.path().join("ca.pem"), "");
    site.hook(&job_env("prolog_slurmctld", "95", &[]));
    assert!(cv.accepted("JobConfig").is_empty());
    assert!(
        site.log().contains("cannot reach CloudVision"),
        "{}",
        site.log()
    );
    let insecure = Site::new(&cv.server(), &other.path().join("ca.pem"), "Insecure=yes");
    insecure.hook(&job_env("prolog_slurmctld", "96", &[]));
    assert_eq!(cv.accepted("JobConfig").len(), 1);
    assert!(insecure
        .log()
        .contains("TLS verification is off (Insecure=yes)"));
}

#[test]
fn world_readable_token_file_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    std::fs::set_permissions(&site.token_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (out, _) = site.hook(&job_env("prolog_slurmctld", "97", &[]));
    assert_eq!(out.status.code(), Some(0));
    assert!(cv.requests().is_empty());
    let log = site.log();
    assert!(
        log.contains(&format!(
            "readable by group or others (mode 0644); run: chmod 600 {}",
            site.token_file.display()
        )),
        "{log}"
    );
    assert_eq!(site.outbox().len(), 1);
}

#[test]
fn broken_config_still_exits_zero_and_says_why() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "Bogus=1");
    let log = site.dir.path().join("fallback.log");
    let link = site.link("cvslurm-hook");
    let out = std::process::Command::new(link)
        .env_clear()
        .env("CVSLURM_CONF", &site.conf)
        .env("CV_LOG_FILE", &log)
        .envs(job_env("prolog_slurmctld", "98", &[]))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&format!(
            "config: {}:10: Bogus: unknown key",
            site.conf.display()
        )),
        "{text}"
    );
}

#[test]
fn unwritable_state_dir_still_sends_directly() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "StateDir=/proc/cvslurm-cannot-exist");
    let (out, _) = site.hook(&job_env("prolog_slurmctld", "99", &[]));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(cv.accepted("JobConfig").len(), 1);
    assert!(
        site.log()
            .contains("cannot queue the event in StateDir /proc/cvslurm-cannot-exist"),
        "{}",
        site.log()
    );
}

#[test]
fn legacy_script_names_dispatch_to_the_hook() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    for (i, name) in ["cv-job-hook", "cv-job-hook.py", "cvslurm-hook"]
        .iter()
        .enumerate()
    {
        let link = site.link(name);
        let id = format!("{}", 200 + i);
        let out = std::process::Command::new(link)
            .env_clear()
            .env("CVSLURM_CONF", &site.conf)
            .envs(job_env("prolog_slurmctld", &id, &[]))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0));
    }
    assert_eq!(cv.accepted("JobConfig").len(), 3);
}

#[test]
fn non_utf8_job_name_and_other_variables_are_sent_lossily_not_a_crash() {
    use std::os::unix::ffi::OsStrExt;
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    let bad = std::ffi::OsStr::from_bytes(b"tr\xffain");
    let out = std::process::Command::new(site.link("cvslurm-hook"))
        .env_clear()
        .env("CVSLURM_CONF", &site.conf)
        .envs(job_env("prolog_slurmctld", "90", &[]))
        .env("SLURM_JOB_NAME", bad)
        .env(
            "SLURM_JOB_WORK_DIR",
            std::ffi::OsStr::from_bytes(b"/home/\xfe"),
        )
        .env("SLURM_JOB_COMMENT", std::ffi::OsStr::from_bytes(b"\xc3"))
        .output()
        .unwrap();
    assert_exit_0(&out);
    let jobs = cv.accepted("JobConfig");
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0]["name"], "tr\u{fffd}ain@gpu");
    let log = site.log();
    assert!(log.contains("SLURM_JOB_NAME is not UTF-8"), "{log}");
}

#[test]
fn a_fifo_at_log_file_neither_hangs_the_hook_nor_loses_the_event() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    nix::unistd::mkfifo(
        &site.log_file,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let mut child = std::process::Command::new(site.link("cvslurm-hook"))
        .env_clear()
        .env("CVSLURM_CONF", &site.conf)
        .envs(job_env("prolog_slurmctld", "91", &[]))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if std::time::Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let status = status.expect("the hook hung on a FIFO at LogFile");
    assert_eq!(status.code(), Some(0));
    assert_eq!(cv.accepted("JobConfig").len(), 1, "the event was sent");
}

/// Another process holding every lock of the outbox (`outbox.lock`, `drainer.lock`) does not
/// stop a hook: it queues without a lock, sends, and removes its own file.
#[test]
fn held_outbox_locks_never_stop_a_hook_from_queueing() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "HookTimeout=1");
    std::fs::create_dir_all(&site.state_dir).unwrap();
    let lock = |name: &str| {
        cvslurm::internals::state::durable::lock_file(&site.state_dir.join(name), None, None)
            .unwrap()
    };
    let held = (lock(layout::OUTBOX_LOCK), lock(layout::DRAINER_LOCK));
    let (out, took) = site.hook(&job_env("prolog_slurmctld", "92", &[]));
    assert_eq!(out.status.code(), Some(0));
    // Loose bound (process start on a loaded machine); a hook blocked on a lock never ends.
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(cv.accepted("JobConfig").len(), 1, "sent directly");
    assert!(site.outbox().is_empty(), "a sent event leaves the outbox");
    // CloudVision down as well: the event is queued all the same, and the log says so.
    cv.set_mode(json!({"mode": "status", "status": 503}));
    let (out, _) = site.hook(&job_env("prolog_slurmctld", "93", &[]));
    assert_eq!(out.status.code(), Some(0));
    drop(held);
    let log = site.log();
    assert!(!log.contains("cannot queue"), "{log}");
    assert!(
        log.contains("job 92@hpc-cluster-west: sent RUNNING"),
        "{log}"
    );
    let l93: Vec<&str> = log.lines().filter(|l| l.contains("job 93@")).collect();
    assert!(l93.iter().any(|l| l.contains("kept in outbox")), "{l93:?}");
    assert!(!l93.iter().any(|l| l.contains("LOST")), "{l93:?}");
    let queued = site.outbox();
    assert_eq!(queued.len(), 1);
    assert_eq!(queued[0]["job"]["key"]["id"], "93@hpc-cluster-west");
}

/// A hook that cannot write the outbox at all (here `outbox` is not a directory) sends
/// directly, and when that fails too it says the event is lost, not that it is kept.
#[test]
fn an_outbox_that_cannot_be_written_makes_the_hook_say_so_truthfully() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "HookTimeout=1");
    std::fs::create_dir_all(&site.state_dir).unwrap();
    std::fs::write(site.state_dir.join(layout::OUTBOX), b"not a directory").unwrap();
    let (out, _) = site.hook(&job_env("prolog_slurmctld", "92", &[]));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(cv.accepted("JobConfig").len(), 1, "sent directly");
    cv.set_mode(json!({"mode": "status", "status": 503}));
    let (out, _) = site.hook(&job_env("prolog_slurmctld", "93", &[]));
    assert_eq!(out.status.code(), Some(0));
    let log = site.log();
    assert!(log.contains("cannot queue the event"), "{log}");
    assert!(
        log.contains("job 92@hpc-cluster-west: sent RUNNING"),
        "{log}"
    );
    let l93: Vec<&str> = log.lines().filter(|l| l.contains("job 93@")).collect();
    assert!(l93.iter().any(|l| l.contains("LOST")), "{l93:?}");
    assert!(
        !l93.iter()
            .any(|l| l.contains("stays in the outbox") || l.contains("kept in outbox")),
        "{l93:?}"
    );
}

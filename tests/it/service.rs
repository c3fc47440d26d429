//! The service as the sender: hooks queue and wake it, it settles ends and delivers. Also the
//! outbox's stress proofs (outage, kill -9 at random points) on this path.

use crate::common::*;
use cvslurm::internals::state::layout;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A second config for the hooks, identical but for an ApiServer nothing listens on: a hook
/// that tried to send would fail and say so.
fn hook_conf_without_server(site: &Site) -> std::path::PathBuf {
    let text = std::fs::read_to_string(&site.conf).unwrap();
    let text: Vec<String> = text
        .lines()
        .map(|l| {
            if l.starts_with("ApiServer=") {
                "ApiServer=127.0.0.1:1".to_string()
            } else {
                l.to_string()
            }
        })
        .collect();
    let p = site.dir.path().join("hook.conf");
    std::fs::write(&p, text.join("\n")).unwrap();
    p
}

fn run_hook(site: &Site, conf: &std::path::Path, vars: &[(&str, &str)]) -> std::process::Output {
    Command::new(site.link("cvslurm-hook"))
        .env_clear()
        .env("CVSLURM_CONF", conf)
        .envs(vars.iter().copied())
        .output()
        .unwrap()
}

/// This host's short name, as slurmctld compares it with a `SlurmctldHost` line.
fn short_hostname() -> String {
    nix::unistd::gethostname()
        .unwrap()
        .into_string()
        .unwrap()
        .split('.')
        .next()
        .unwrap()
        .to_string()
}

fn job_states(cv: &Standin) -> HashMap<String, Vec<String>> {
    let mut m: HashMap<String, Vec<String>> = HashMap::new();
    for r in cv.requests() {
        if r["status"] == 200 && r["method"] == "POST" {
            let id = r["body"]["key"]["id"].as_str().unwrap_or("").to_string();
            let st = r["body"]["state"].as_str().unwrap_or("").to_string();
            m.entry(id).or_default().push(st);
        }
    }
    m
}

#[test]
fn hooks_hand_events_to_the_service_without_network_or_slurmctld() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    let _svc = Service::start(&site);
    let hook_conf = hook_conf_without_server(&site);
    let out = run_hook(
        &site,
        &hook_conf,
        &job_env("prolog_slurmctld", "12345", &[]),
    );
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty() && out.stderr.is_empty());
    wait_for("RUNNING at CloudVision", Duration::from_secs(20), || {
        !cv.accepted("JobConfig").is_empty()
    });
    let running = cv.accepted("JobConfig")[0].clone();
    assert_eq!(running["state"], "JOB_STATE_RUNNING");
    assert_eq!(running["key"]["id"], "12345@hpc-cluster-west");
    let out = run_hook(
        &site,
        &hook_conf,
        &job_env(
            "epilog_slurmctld",
            "12345",
            &[("SLURM_JOB_EXIT_CODE2", "3:0")],
        ),
    );
    assert_eq!(out.status.code(), Some(0));
    wait_for("the end at CloudVision", Duration::from_secs(20), || {
        cv.accepted("JobConfig").len() == 2
    });
    let end = cv.accepted("JobConfig")[1].clone();
    // No slurmctld here: the service judged the end from the exit codes.
    assert_eq!(end["state"], "JOB_STATE_FAILED");
    assert_eq!(
        end["start_time"], running["start_time"],
        "the prolog's start"
    );
    assert!(end["end_time"].as_str().unwrap().ends_with('Z'));
    let log = site.log();
    assert_eq!(
        log.matches("queued for the service").count(),
        2,
        "both hooks handed over: {log}"
    );
    assert!(
        !log.contains("cannot ask slurmctld for the end state"),
        "{log}"
    );
    assert!(!log.contains("sending directly"), "{log}");
    assert!(
        log.contains("outbox: delivered job 12345@hpc-cluster-west FAILED"),
        "{log}"
    );
    wait_for("an empty outbox", Duration::from_secs(10), || {
        site.outbox().is_empty()
    });
}

/// A hook never waits for `service-status.lock` nor makes another hook wait (on 2 cores, hooks
/// queued behind each other there slowed a job array 6 to 12 times: their EpilogSlurmctld
/// ended after the nodes' epilogs, when slurmctld does not schedule): a counter goes to the
/// counter journal. With the lock held throughout, each hook here would have waited 100 ms
/// and lost its counter; `status --json` shows the counters meanwhile, and the service folds
/// them into service-status.json once the lock is free.
#[test]
fn hooks_count_without_the_status_lock() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    let _svc = Service::start(&site);
    let hook_conf = hook_conf_without_server(&site);
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(site.state_dir.join(layout::SERVICE_STATUS_LOCK))
        .unwrap();
    let held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive).unwrap();
    for id in ["7001", "7002"] {
        let out = run_hook(&site, &hook_conf, &job_env("prolog_slurmctld", id, &[]));
        assert_eq!(out.status.code(), Some(0));
    }
    wait_for(
        "both RUNNINGs at CloudVision",
        Duration::from_secs(20),
        || cv.accepted("JobConfig").len() == 2,
    );
    let log = site.log();
    assert_eq!(log.matches("queued for the service").count(), 2, "{log}");
    assert!(!log.contains("status: counter"), "{log}");
    let out = site.run(&["status", "--json"]);
    let st: Value = serde_json::from_slice(&out.stdout).expect("status --json");
    assert_eq!(st["metrics"]["counters"]["events_queued"], 2, "{st}");
    drop(held);
    // The next drain (a third event) writes the file, the journal folded in.
    let out = run_hook(&site, &hook_conf, &job_env("prolog_slurmctld", "7003", &[]));
    assert_eq!(out.status.code(), Some(0));
    let file = site.state_dir.join(layout::SERVICE_STATUS);
    wait_for(
        "the counters in service-status.json",
        Duration::from_secs(20),
        || {
            let v: Value = std::fs::read(&file)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default();
            // (The service's own figures of the drains while the lock was held are lost: it
            // waits 100 ms for the lock, as any writer of the file.)
            v["counters"]["events_queued"] == 3
        },
    );
    assert!(!site.log().contains("status: counter"), "{}", site.log());
}

#[test]
fn a_dead_services_socket_makes_the_hook_send_itself() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    let mut svc = Service::start(&site);
    svc.kill(); // kill -9: wake.sock stays behind, bound by nobody
    assert!(site.state_dir.join(layout::WAKE_SOCKET).exists());
    let (out, _) = site.hook(&job_env("prolog_slurmctld", "77", &[]));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(cv.accepted("JobConfig").len(), 1, "sent by the hook");
    assert!(site.log().contains("job 77@hpc-cluster-west: sent RUNNING"));
    assert!(site.outbox().is_empty());
    // A symlink in its place is not followed, even to a live service's socket: the hook
    // sends itself.
    std::fs::remove_file(site.state_dir.join(layout::WAKE_SOCKET)).unwrap();
    let other_site = Site::with_standin(&cv, "");
    let _other = Service::start(&other_site);
    std::os::unix::fs::symlink(
        other_site.state_dir.join(layout::WAKE_SOCKET),
        site.state_dir.join(layout::WAKE_SOCKET),
    )
    .unwrap();
    let (out, _) = site.hook(&job_env("prolog_slurmctld", "78", &[]));
    assert_eq!(out.status.code(), Some(0));
    assert!(site.log().contains("job 78@hpc-cluster-west: sent RUNNING"));
    assert!(!other_site
        .state_dir
        .join(layout::OUTBOX)
        .join("job.78@hpc-cluster-west.json")
        .exists());
}

#[test]
fn sigterm_ends_the_service_at_once_while_cloudvision_hangs_and_nothing_is_lost() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "RequestTimeout=60");
    let mut svc = Service::start(&site);
    cv.set_mode(json!({"mode": "hang"}));
    let (out, _) = site.hook(&job_env("prolog_slurmctld", "500", &[]));
    assert_eq!(out.status.code(), Some(0));
    let inflight = site
        .state_dir
        .join(layout::INFLIGHT)
        .join("job.500@hpc-cluster-west.json");
    wait_for("the service to send", Duration::from_secs(20), || {
        inflight.exists()
    });
    let t = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(svc.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_for("the service to stop", Duration::from_secs(10), || {
        svc.child.try_wait().unwrap().is_some()
    });
    eprintln!("stopped {} ms after SIGTERM", t.elapsed().as_millis());
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "not held by the hanging request"
    );
    cv.set_mode(json!({"mode": "ok"}));
    let _svc = Service::start(&site);
    wait_for(
        "delivery after the restart",
        Duration::from_secs(20),
        || !cv.accepted("JobConfig").is_empty(),
    );
    assert!(site.log().contains("requeued"), "{}", site.log());
}

#[test]
fn outage_with_the_service_loses_nothing_and_keeps_order() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "MaxConcurrentRequests=4");
    let _svc = Service::start(&site);
    cv.set_mode(json!({"mode": "status", "status": 503}));
    let jobs = 60;
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..20 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs {
                    break;
                }
                let id = (1000 + i).to_string();
                let (out, _) = site.hook(&job_env("prolog_slurmctld", &id, &[]));
                assert_eq!(out.status.code(), Some(0));
                let (out, _) = site.hook(&job_env(
                    "epilog_slurmctld",
                    &id,
                    &[("SLURM_JOB_EXIT_CODE2", final_state(i).0)],
                ));
                assert_eq!(out.status.code(), Some(0));
            });
        }
    });
    cv.set_mode(json!({"mode": "ok"}));
    wait_for("every end delivered", Duration::from_secs(120), || {
        let st = cv.state();
        (0..jobs).all(|i| {
            st["jobs"][format!("{}@hpc-cluster-west", 1000 + i)]["state"] == final_state(i).1
        })
    });
    for (id, states) in job_states(&cv) {
        let ended = states.iter().position(|s| s != "JOB_STATE_RUNNING");
        if let Some(e) = ended {
            assert!(
                states[e..].iter().all(|s| s != "JOB_STATE_RUNNING"),
                "{id}: RUNNING after its end: {states:?}"
            );
        }
    }
    wait_for("an empty outbox", Duration::from_secs(10), || {
        site.outbox().is_empty()
    });
    assert!(!site.log().contains("sending directly"));
}

#[test]
fn service_and_hooks_killed_at_random_points_lose_no_returned_event() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "HookTimeout=2\nRequestTimeout=2");
    cv.set_mode(json!({"mode": "delay", "delay_ms": 15}));
    let mut rng = Rng::new();
    let link = site.link("cvslurm-hook");
    let mut svc = Some(Service::start(&site));
    let started = Instant::now();
    let (mut returned, mut killed, mut service_kills) = (Vec::new(), 0, 0);
    let mut i = 0;
    while i < 600 && started.elapsed() < Duration::from_secs(90) {
        i += 1;
        let job = 5000 + (i % 200);
        let ctx = if rng.below(2) == 0 {
            "prolog_slurmctld"
        } else {
            "epilog_slurmctld"
        };
        let id = job.to_string();
        let mut child = Command::new(&link)
            .env_clear()
            .env("CVSLURM_CONF", &site.conf)
            .envs(job_env(ctx, &id, &[("SLURM_JOB_EXIT_CODE2", "0:0")]))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(rng.below(20_000)));
        match child.try_wait().unwrap() {
            Some(st) => {
                assert_eq!(st.code(), Some(0));
                returned.push(id);
            }
            None => {
                let _ = child.kill();
                let _ = child.wait();
                killed += 1;
            }
        }
        // Now and then the service is killed -9, and started again a little later.
        match rng.below(15) {
            0 if svc.is_some() => {
                svc.take().unwrap().kill();
                service_kills += 1;
            }
            1 if svc.is_none() => svc = Some(Service::start(&site)),
            _ => {}
        }
    }
    eprintln!(
        "{i} hook runs: {} returned, {killed} killed; service killed {service_kills} times",
        returned.len()
    );
    assert!(killed > 0 && service_kills > 0 && !returned.is_empty());
    drop(svc);
    cv.set_mode(json!({"mode": "ok"}));
    let _svc = Service::start(&site);
    wait_for("an empty outbox", Duration::from_secs(60), || {
        site.outbox().is_empty()
            && std::fs::read_dir(site.state_dir.join(layout::INFLIGHT))
                .map(|d| d.count() == 0)
                .unwrap_or(true)
    });
    let state = cv.state();
    for id in &returned {
        let got: &Value = &state["jobs"][format!("{id}@hpc-cluster-west")];
        assert!(
            got.is_object(),
            "job {id}: a returned event never reached CloudVision"
        );
    }
    assert_eq!(
        std::fs::read_dir(site.state_dir.join(layout::REJECTED))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn a_second_drainer_leaves_the_first_ones_event_alone() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "HookTimeout=1\nRequestTimeout=30");
    cv.set_mode(json!({"mode": "status", "status": 503}));
    let (out, _) = site.hook(&job_env("prolog_slurmctld", "600", &[]));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(site.outbox().len(), 1);
    cv.set_mode(json!({"mode": "hang"}));
    let mut first = Command::new(bin())
        .arg("flush")
        .arg("--no-reconcile")
        .env("CVSLURM_CONF", &site.conf)
        .env("SLURM_CONF", site.no_slurm_conf())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let inflight = site
        .state_dir
        .join(layout::INFLIGHT)
        .join("job.600@hpc-cluster-west.json");
    wait_for("the first flush to send", Duration::from_secs(20), || {
        inflight.exists()
    });
    let before = cv.requests().len();
    let out = site.run(&["flush", "--no-reconcile"]);
    assert_exit_0(&out);
    assert!(stdout(&out).contains("another drainer"), "{}", stdout(&out));
    assert_eq!(
        cv.requests().len(),
        before,
        "the event was sent a second time"
    );
    assert!(
        inflight.exists(),
        "the first flush's event was taken from it"
    );
    let _ = first.kill();
    let _ = first.wait();
    cv.set_mode(json!({"mode": "ok"}));
}

#[test]
fn status_and_check_say_which_path_the_hooks_take() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    let st = |site: &Site| -> Value {
        let out = site.run(&["status", "--json", "--offline"]);
        serde_json::from_slice(&out.stdout).unwrap()
    };
    assert_eq!(st(&site)["service_running"], false);
    let check = stdout(&site.run(&["check"]));
    assert!(
        check.contains("WARN no cvslurm service listens")
            && check.contains("sends to CloudVision itself"),
        "{check}"
    );
    let mut svc = Service::start(&site);
    assert_eq!(st(&site)["service_running"], true);
    let check = stdout(&site.run(&["check"]));
    assert!(
        check.contains("ok   the cvslurm service listens"),
        "{check}"
    );
    svc.kill();
    assert_eq!(
        st(&site)["service_running"],
        false,
        "a stale socket is no service"
    );
}

#[test]
fn a_second_service_stands_by_and_takes_over_when_the_first_dies() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    let mut first = Service::start(&site);
    let mut second = Command::new(bin())
        .args(["inventory", "--monitor"])
        .env("CVSLURM_CONF", &site.conf)
        .env("SLURM_CONF", site.no_slurm_conf())
        .env_remove("NOTIFY_SOCKET")
        .env_remove("JOURNAL_STREAM")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(
        "the second service to stand by",
        Duration::from_secs(20),
        || site.log().contains("this service sends once it ends"),
    );
    let (out, _) = site.hook(&job_env("prolog_slurmctld", "700", &[]));
    assert_eq!(out.status.code(), Some(0));
    wait_for("delivery", Duration::from_secs(20), || {
        cv.accepted("JobConfig").len() == 1
    });
    assert!(
        second.try_wait().unwrap().is_none(),
        "the second service exited"
    );
    first.kill();
    wait_for(
        "the second service to take over",
        Duration::from_secs(20),
        || site.log().matches("sender: listening on").count() == 2,
    );
    let (out, _) = site.hook(&job_env("epilog_slurmctld", "700", &[]));
    assert_eq!(out.status.code(), Some(0));
    wait_for("delivery by the second", Duration::from_secs(20), || {
        cv.accepted("JobConfig").len() == 2
    });
    assert!(site.log().contains("queued for the service"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(second.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_for(
        "the second service to stop",
        Duration::from_secs(10),
        || second.try_wait().unwrap().is_some(),
    );
    assert_eq!(second.wait().unwrap().code(), Some(0));
}

/// Every accepted request body, grouped by the key it is for, in the order each key's came.
fn bodies_by_key(cv: &Standin) -> std::collections::BTreeMap<String, Vec<Value>> {
    let mut m: std::collections::BTreeMap<String, Vec<Value>> = Default::default();
    for r in cv.requests() {
        if r["status"] == 200 && r["method"] != "GET" {
            let key = r["body"]["key"]["id"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| r["path"].to_string());
            m.entry(key).or_default().push(r["body"].clone());
        }
    }
    m
}

fn listing(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn flush_and_the_service_send_the_same_bytes_for_the_same_outbox() {
    // The outbox a service leaves when it dies right after the hooks handed their events
    // over: provisional ends (judged from exit codes, to be settled against slurmctld), one
    // chained after its job's RUNNING. A socket bound here stands for that service.
    let extra = "JobInterfaces=gpu\nMaxConcurrentRequests=2";
    let (cv1, cv2) = (Standin::start(), Standin::start());
    let flushed = Site::with_standin(&cv1, extra);
    let served = Site::with_standin(&cv2, extra);
    std::fs::create_dir_all(&flushed.state_dir).unwrap();
    let sock = flushed.state_dir.join("wake.sock");
    let listener = std::os::unix::net::UnixDatagram::bind(&sock).unwrap();
    let hooks: [(&str, &str, &str); 4] = [
        ("prolog_slurmctld", "901", "0:0"),
        ("epilog_slurmctld", "901", "0:15"),
        ("epilog_slurmctld", "902", "0:0"),
        ("epilog_slurmctld", "903", "2:0"),
    ];
    for (ctx, id, code) in hooks {
        let (out, _) = flushed.hook(&job_env(ctx, id, &[("SLURM_JOB_EXIT_CODE2", code)]));
        assert_eq!(out.status.code(), Some(0));
    }
    drop(listener);
    std::fs::remove_file(&sock).unwrap();
    assert_eq!(
        flushed.log().matches("queued for the service").count(),
        4,
        "{}",
        flushed.log()
    );
    let queued = flushed.outbox();
    assert_eq!(queued.len(), 3, "{queued:?}");
    assert!(queued.iter().any(|e| e["then"]["resolve"].is_object()));
    assert!(queued.iter().any(|e| e["resolve"].is_object()));
    std::fs::create_dir_all(served.state_dir.join("outbox")).unwrap();
    for f in listing(&flushed.state_dir.join("outbox")) {
        std::fs::copy(
            flushed.state_dir.join("outbox").join(&f),
            served.state_dir.join("outbox").join(&f),
        )
        .unwrap();
    }

    let out = flushed.run(&["flush"]);
    assert_exit_0(&out);
    assert!(flushed.outbox().is_empty());

    let _svc = Service::start(&served);
    wait_for("the service to send all", Duration::from_secs(30), || {
        served.outbox().is_empty()
            && listing(&served.state_dir.join("inflight")).is_empty()
            && cv2.accepted("JobConfig").len() == cv1.accepted("JobConfig").len()
    });

    let (a, b) = (bodies_by_key(&cv1), bodies_by_key(&cv2));
    assert_eq!(a.len(), 3, "{a:?}");
    assert_eq!(a, b, "flush and the service sent different bodies");
    assert_eq!(
        a["901@hpc-cluster-west"]
            .iter()
            .map(|j| j["state"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["JOB_STATE_RUNNING", "JOB_STATE_FAILED"]
    );
    // Both settled the ends (no slurmctld here: from the exit codes), so both marked them
    // for verification against Slurm's final record; and both asked for the jobs' GPUs.
    let verify = listing(&flushed.state_dir.join("verify"));
    assert_eq!(verify.len(), 3, "{verify:?}");
    assert_eq!(verify, listing(&served.state_dir.join("verify")));
    // (flush logs to its stderr, the service to LogFile.)
    for log in [stderr(&out), served.log()] {
        assert!(
            log.contains("job 902@hpc-cluster-west: nodes (gpu): the job's GPUs are unknown"),
            "{log}"
        );
    }
}

/// An end handed to the service while its job's RUNNING waits in the outbox (CloudVision asks
/// to retry later) is chained after it; the service syncs that file too, and only then is
/// the job's start record forgotten (before: the chained file kept the RUNNING's `seq`, so
/// the service took it for synced and never synced the end).
#[test]
fn an_end_chained_behind_a_waiting_running_is_synced_and_its_start_record_dropped() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    cv.set_mode(json!({"mode": "status", "status": 503, "retry_after": 600}));
    let _service = Service::start(&site);
    let conf = hook_conf_without_server(&site);
    let out = run_hook(&site, &conf, &job_env("prolog_slurmctld", "61", &[]));
    assert_eq!(out.status.code(), Some(0));
    let key = "61@hpc-cluster-west";
    wait_for(
        "the RUNNING to be tried once",
        Duration::from_secs(20),
        || cv.requests().iter().any(|r| r["status"] == 503),
    );
    let out = run_hook(
        &site,
        &conf,
        &job_env("epilog_slurmctld", "61", &[("SLURM_JOB_EXIT_CODE2", "0:0")]),
    );
    assert_eq!(out.status.code(), Some(0));
    assert!(
        site.log().contains("queued after its RUNNING"),
        "{}",
        site.log()
    );
    let record = site.state_dir.join(layout::JOBS).join(key);
    wait_for(
        "the start record to go once the end is on disk",
        Duration::from_secs(20),
        || !record.exists(),
    );
    let pending = site.outbox();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0]["then"]["job"]["state"], "JOB_STATE_COMPLETED");
    assert!(cv.accepted("JobConfig").is_empty(), "nothing delivered yet");
}

/// A scratch slurm.conf (for SLURM_CONF) naming two SlurmctldHosts, `cvslurm-other-ctl`
/// first and this host second, and its empty StateSaveLocation: (slurm.conf, that directory).
fn pair_this_host_second(site: &Site) -> (std::path::PathBuf, std::path::PathBuf) {
    let me = short_hostname();
    assert_ne!(me, "cvslurm-other-ctl");
    let save = site.dir.path().join("statesave");
    std::fs::create_dir_all(&save).unwrap();
    let slurm_conf = site.dir.path().join("slurm.conf");
    std::fs::write(
        &slurm_conf,
        format!(
            "ClusterName=hpc-cluster-west\nSlurmctldHost=cvslurm-other-ctl(10.99.0.2)\n\
             SlurmctldHost={me}\nSlurmctldTimeout=60\nStateSaveLocation={}\nSlurmUser={}\n",
            save.display(),
            this_user()
        ),
    )
    .unwrap();
    (slurm_conf, save)
}

/// Writes Slurm's heartbeat in `save` as the slurmctld in control does (atomically): the time
/// now and `index`, the place in slurm.conf of the controller in control (0 the first).
fn write_heartbeat(save: &std::path::Path, index: u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut b = now.to_be_bytes().to_vec();
    b.extend_from_slice(&index.to_be_bytes());
    let tmp = save.join("heartbeat.new");
    std::fs::write(&tmp, b).unwrap();
    std::fs::rename(&tmp, save.join("heartbeat")).unwrap();
}

/// A process named slurmctld running on this host for 120 s: a copy of sleep of that name in
/// the site's directory (its comm is the file's name; as root the copy is root's, an installed
/// binary), written by `install` ([`install_executable`]): a copy written through this
/// process's descriptor could fail to run with ETXTBSY (seen once in a full run).
fn fake_slurmctld(site: &Site) -> std::process::Child {
    let fake = site.dir.path().join("slurmctld");
    install_executable(std::path::Path::new("/bin/sleep"), &fake, 0o755);
    Command::new(&fake).arg("120").spawn().unwrap()
}

/// This test's user name: SlurmUser in the scratch slurm.confs (the service trusts a
/// slurmctld only as SlurmUser, from a binary only root can write: as root, `fake_slurmctld`).
fn this_user() -> String {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .unwrap()
        .unwrap()
        .name
}

/// The service on each controller of a pair; Slurm's heartbeat decides which one
/// leads. A scratch slurm.conf (SLURM_CONF) names two SlurmctldHosts, this host second, and
/// the site has no Slurm commands: a service that inventories or reconciles says so in its
/// log ("cannot list nodes", "reconcile:"). Old code: every service inventories.
#[test]
fn only_the_controller_in_control_inventories_the_standby_delivers_its_outbox() {
    use std::fs;
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "PollInterval=1\nReconcileInterval=1");
    let (slurm_conf, save) = pair_this_host_second(&site);
    let heartbeat = |index: u64| write_heartbeat(&save, index);
    let status = || {
        let out = Command::new(bin())
            .args(["status", "--offline", "--json"])
            .env("CVSLURM_CONF", &site.conf)
            .env("SLURM_CONF", &slurm_conf)
            .output()
            .unwrap();
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    // The other controller is in control: this one is a standby. It delivers the ends its
    // outbox holds, never a RUNNING (only the controller in control sends one;
    // old code sent it).
    heartbeat(0);
    let _svc = Service::start_with_env(&site, &[("SLURM_CONF", &slurm_conf)]);
    let hook_conf = hook_conf_without_server(&site);
    let out = run_hook(&site, &hook_conf, &job_env("prolog_slurmctld", "776", &[]));
    assert_eq!(out.status.code(), Some(0));
    let out = run_hook(&site, &hook_conf, &job_env("epilog_slurmctld", "777", &[]));
    assert_eq!(out.status.code(), Some(0));
    wait_for(
        "the standby delivers its outbox",
        Duration::from_secs(20),
        || !cv.accepted("JobConfig").is_empty(),
    );
    wait_for("the RUNNING held", Duration::from_secs(20), || {
        site.log()
            .contains("1 RUNNING event(s) held: this host does not lead")
    });
    let sent = cv.accepted("JobConfig");
    assert!(
        sent.iter()
            .all(|j| j["key"]["id"] == "777@hpc-cluster-west" && j["state"] != "JOB_STATE_RUNNING"),
        "a standby sent a RUNNING: {sent:?}"
    );
    wait_for("a standby line", Duration::from_secs(10), || {
        site.log()
            .contains("this host does not lead: the heartbeat")
    });
    // Three polls and reconciliations later: neither ran.
    std::thread::sleep(Duration::from_millis(3500));
    let log = site.log();
    assert!(
        log.contains("(cvslurm-other-ctl is in control); delivering its own outbox only"),
        "{log}"
    );
    assert!(
        !log.contains("cannot list nodes"),
        "inventory on a standby: {log}"
    );
    assert!(
        !log.contains("reconcile:"),
        "reconciliation on a standby: {log}"
    );
    let v = status();
    assert_eq!(v["leader"], false, "{v}");
    assert!(
        v["leader_reason"]
            .as_str()
            .unwrap()
            .contains("names cvslurm-other-ctl, not this host"),
        "{v}"
    );
    assert!(
        v["role"]
            .as_str()
            .unwrap()
            .starts_with("standby: delivers its own outbox only"),
        "{v}"
    );
    let text = stdout(
        &Command::new(bin())
            .args(["status", "--offline"])
            .env("CVSLURM_CONF", &site.conf)
            .env("SLURM_CONF", &slurm_conf)
            .output()
            .unwrap(),
    );
    assert!(
        text.contains("role:             standby: delivers its own outbox only"),
        "{text}"
    );

    // A takeover: the heartbeat names this host, and a process named slurmctld runs here.
    let other_slurmctld =
        cvslurm::internals::slurm::ctld_process::find_here().map_or(true, |v| !v.is_empty());
    let mut slurmctld = fake_slurmctld(&site);
    heartbeat(1);
    if !nix::unistd::getuid().is_root() && !other_slurmctld {
        // Not root: the fake runs from a binary its user can write, as any user could start
        // one: not trusted, this host does not lead. The rest needs root.
        wait_for("cannot tell", Duration::from_secs(10), || {
            site.log()
                .contains("no slurmctld runs here (as SlurmUser, from an installed binary)")
        });
        let _ = slurmctld.kill();
        let _ = slurmctld.wait();
        return;
    }
    wait_for("this host leads", Duration::from_secs(10), || {
        site.log().contains("this host now leads: the heartbeat")
    });
    wait_for("an inventory", Duration::from_secs(10), || {
        let log = site.log();
        log.contains("cannot list nodes") && log.contains("reconcile:")
    });
    let v = status();
    assert_eq!(v["leader"], true, "{v}");
    assert!(
        v["role"].as_str().unwrap().starts_with("leads: inventory"),
        "{v}"
    );

    // Its slurmctld killed: the heartbeat still names this host, but it cannot tell (unless
    // a real slurmctld runs in this host's namespace: a Slurm cluster on this machine).
    let _ = slurmctld.kill();
    let _ = slurmctld.wait();
    if other_slurmctld {
        eprintln!("a slurmctld runs on this machine: the kill -9 step is not checked");
    } else {
        wait_for("cannot tell", Duration::from_secs(10), || {
            site.log().contains(
                "this host does not lead: cannot tell which controller is in control: the heartbeat",
            )
        });
    }
    // A hostile heartbeat: still cannot tell, and no second warning.
    fs::write(save.join("heartbeat"), b"\x1b[31m garbage").unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let v = status();
    assert_eq!(v["leader"], Value::Null, "{v}");
    assert!(
        v["leader_reason"]
            .as_str()
            .unwrap()
            .contains("bytes, not 16"),
        "{v}"
    );
    let log = site.log();
    assert_eq!(
        log.matches("cannot tell which controller is in control")
            .count(),
        1,
        "one warning per change: {log}"
    );
    // Nothing more ran after leadership was lost.
    let inventories = log.matches("cannot list nodes").count();
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(site.log().matches("cannot list nodes").count(), inventories);
}

/// A pair whose slurm.conf is not where the service looks (`SLURM_CONF` names a file that is
/// not there, as /etc/slurm/slurm.conf is not on a site whose Slurm was built for another
/// path): the service asks Slurm (`scontrol show config`, its `SLURM_CONF` line), finds the
/// pair, and the standby does not lead. Old code: no slurm.conf, so this host was taken for
/// the only controller, and both led.
#[test]
fn a_pair_whose_slurm_conf_is_elsewhere_still_has_one_leader() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "PollInterval=1");
    let (slurm_conf, save) = pair_this_host_second(&site);
    site.command(
        "scontrol",
        &format!(
            "#!/bin/sh\ncase \"$*\" in\n*--version*) echo 'slurm 24.11.5' ;;\n\
             *'show config'*) printf 'ClusterName             = hpc-cluster-west\\nSLURM_CONF              = %s\\n' '{}' ;;\n\
             *) exit 1 ;;\nesac\n",
            slurm_conf.display()
        ),
    );
    write_heartbeat(&save, 0);
    let nowhere = site.dir.path().join("no-such-slurm.conf");
    let _svc = Service::start_with_env(&site, &[("SLURM_CONF", &nowhere)]);
    wait_for("a leadership line", Duration::from_secs(20), || {
        let log = site.log();
        log.contains("this host now leads") || log.contains("this host does not lead")
    });
    let log = site.log();
    assert!(!log.contains("this host now leads"), "{log}");
    assert!(
        log.contains(&format!(
            "slurm.conf is {} (scontrol show config, SLURM_CONF)",
            slurm_conf.display()
        )) && log.contains("names cvslurm-other-ctl, not this host"),
        "{log}"
    );
}

/// A process any local user starts under the name `slurmctld` does not make this host lead:
/// the heartbeat names this host, the "slurmctld" runs as a user that is not SlurmUser, from
/// a binary anyone can write. Old code: any process so named counted.
#[test]
fn a_process_merely_named_slurmctld_does_not_make_this_host_lead() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "PollInterval=1");
    let (slurm_conf, save) = pair_this_host_second(&site);
    // SlurmUser is nobody: neither this fake nor another test's (run as this user, beside
    // this one) is SlurmUser's
    let text = std::fs::read_to_string(&slurm_conf).unwrap();
    std::fs::write(
        &slurm_conf,
        text.replace(&format!("SlurmUser={}", this_user()), "SlurmUser=nobody"),
    )
    .unwrap();
    let fake = site.dir.path().join("slurmctld");
    install_executable(std::path::Path::new("/bin/sleep"), &fake, 0o777);
    let mut slurmctld = Command::new(&fake).arg("120").spawn().unwrap();
    write_heartbeat(&save, 1);
    let _svc = Service::start_with_env(&site, &[("SLURM_CONF", &slurm_conf)]);
    wait_for("a leadership line", Duration::from_secs(20), || {
        let log = site.log();
        log.contains("this host now leads") || log.contains("this host does not lead")
    });
    let log = site.log();
    let _ = slurmctld.kill();
    let _ = slurmctld.wait();
    assert!(!log.contains("this host now leads"), "{log}");
    assert!(
        log.contains("no slurmctld runs here (as SlurmUser, from an installed binary)"),
        "{log}"
    );
}

/// a controller that slurm.conf names by its full host name
/// (`SlurmctldHost=ctl1.example.com`, as slurmctld matches a host by its full name or its
/// short one) leads when the heartbeat names it. This host is given that name in a UTS
/// namespace of its own. Old code: the service cut its own name at the first dot, took
/// itself for none of the controllers, and no host led.
#[test]
fn a_controller_named_by_its_full_host_name_leads() {
    let me = "cvslurm-ctl1.example.com";
    let Some(cmd) = with_hostname(me) else {
        eprintln!("skipped: needs unshare --uts (root, or user namespaces)");
        return;
    };
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "PollInterval=1");
    let save = site.dir.path().join("statesave");
    std::fs::create_dir_all(&save).unwrap();
    let slurm_conf = site.dir.path().join("slurm.conf");
    std::fs::write(
        &slurm_conf,
        format!(
            "ClusterName=hpc-cluster-west\nSlurmctldHost=cvslurm-other-ctl(10.99.0.2)\n\
             SlurmctldHost={me}(10.99.0.3)\nSlurmctldTimeout=60\nStateSaveLocation={}\n",
            save.display()
        ),
    )
    .unwrap();
    if !nix::unistd::getuid().is_root() {
        eprintln!("skipped: a slurmctld is trusted only from a binary root owns (run as root)");
        return;
    }
    let mut slurmctld = fake_slurmctld(&site);
    write_heartbeat(&save, 1);
    let _svc = Service::start_command(&site, cmd, &[("SLURM_CONF", &slurm_conf)]);
    wait_for("a leadership line", Duration::from_secs(20), || {
        let log = site.log();
        log.contains("this host now leads") || log.contains("this host does not lead")
    });
    let log = site.log();
    assert!(
        log.contains(&format!(
            "this host now leads: the heartbeat (0 s old) names this host ({me})"
        )) || log.contains(&format!(
            "this host now leads: the heartbeat (1 s old) names this host ({me})"
        )),
        "{log}"
    );
    let _ = slurmctld.kill();
    let _ = slurmctld.wait();
}

/// a FIFO at `StateSaveLocation/heartbeat` (SlurmUser's, or one that
/// exists for a moment) neither stops the poll nor keeps the service from stopping on
/// SIGTERM: who leads cannot be told, said once, and the polls go on. Old code: the poll
/// blocked in the heartbeat's open for good, and SIGTERM was not heeded.
#[test]
fn a_fifo_heartbeat_neither_stops_the_poll_nor_sigterm() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "PollInterval=1");
    let (slurm_conf, save) = pair_this_host_second(&site);
    let heartbeat = save.join("heartbeat");
    nix::unistd::mkfifo(&heartbeat, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let mut svc = Service::start_with_env(&site, &[("SLURM_CONF", &slurm_conf)]);
    let said = format!(
        "this host does not lead: cannot tell which controller is in control: cannot read {}: not a regular file",
        heartbeat.display()
    );
    wait_for("the cannot-tell line", Duration::from_secs(20), || {
        site.log().contains(&said)
    });
    let polls = |log: &str| log.matches("poll: this host does not lead").count();
    let before = polls(&site.log());
    wait_for("two more polls", Duration::from_secs(20), || {
        polls(&site.log()) >= before + 2
    });
    assert_eq!(site.log().matches(&said).count(), 1, "{}", site.log());
    let t = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(svc.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_for("the service to stop", Duration::from_secs(10), || {
        svc.child.try_wait().unwrap().is_some()
    });
    eprintln!("stopped {} ms after SIGTERM", t.elapsed().as_millis());
}

/// Found by CI on 22.05: a leader whose poll outlasts its control (discovery's
/// srun waits for a scheduler that does not schedule at a takeover) asks again who leads
/// before it resends or reconciles: a RUNNING it sent then could land after the new leader's
/// end. Here srun waits while the heartbeat turns to the other controller; the site has
/// no `scontrol`, so every reconciliation pass says `reconcile:` in the log. Old code
/// reconciled once more as leader when srun returned.
#[test]
fn a_leader_whose_discovery_outlasts_its_control_asks_again_before_it_reconciles() {
    use std::fs;
    let cv = Standin::start();
    let site = Site::with_standin(
        &cv,
        "PollInterval=1\nReconcileInterval=1\nDiscoveryTimeout=30",
    );
    let scratch = site.dir.path();
    let started = scratch.join("srun-started");
    let go = scratch.join("srun-returns");
    for (name, body) in [
        ("sinfo", "echo 'n1 idle p1'".to_string()),
        (
            "srun",
            // Returns once the test says so (at most 30 s), and not before 1.5 s: the
            // reconciliation (every second) is due by then.
            format!(
                "touch {}\nsleep 1.5\nfor i in $(seq 300); do [ -e {} ] && exit 1; sleep 0.1; done\nexit 1",
                started.display(),
                go.display()
            ),
        ),
    ] {
        site.command(name, &format!("#!/bin/sh\n{body}\n"));
    }
    let (slurm_conf, save) = pair_this_host_second(&site);
    let heartbeat = |index: u64| write_heartbeat(&save, index);
    // This host in control: the heartbeat names it and a process named slurmctld runs here.
    let mut slurmctld = fake_slurmctld(&site);
    heartbeat(1);
    let _svc = Service::start_with_env(&site, &[("SLURM_CONF", &slurm_conf)]);
    wait_for("discovery's srun", Duration::from_secs(20), || {
        started.exists()
    });
    let during = site.log().len();
    assert!(
        site.log().contains("this host now leads: the heartbeat"),
        "{}",
        site.log()
    );
    // The other controller takes over while srun waits.
    heartbeat(0);
    fs::write(&go, b"").unwrap();
    wait_for("the lost lead said", Duration::from_secs(20), || {
        site.log()[during..].contains("no longer leads")
    });
    let log = site.log();
    let after = &log[during..];
    let lost = after.find("no longer leads").unwrap();
    assert!(
        !after[..lost].contains("reconcile:"),
        "reconciled as leader after control was lost: {after}"
    );
    // And not after either.
    std::thread::sleep(Duration::from_millis(2500));
    let log = site.log();
    assert!(
        !log[during..].contains("reconcile:"),
        "reconciled on a standby: {log}"
    );
    let _ = slurmctld.kill();
    let _ = slurmctld.wait();
}

/// On a controller pair, events this host queued before its service started may be older
/// than what the other controller sent meanwhile: each is checked against Slurm first. Job 3
/// ended while they waited (slurmctld's record, captured on 24.11, says COMPLETED): its
/// RUNNING is never sent, its end from Slurm's record is. Job 5 still runs: its RUNNING goes
/// as it is, from this host, which leads (a host that does not lead sends no RUNNING).
#[test]
fn events_queued_before_the_service_started_on_a_pair_are_checked_against_slurm() {
    use std::fs;
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "PollInterval=1");
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/slurm-24.11");
    let scontrol = format!(
        "#!/bin/sh\ncase \"$*\" in\n\
         *--version*) echo 'slurm 24.11.5' ;;\n\
         *'show config'*) echo 'ClusterName = hpc-cluster-west' ;;\n\
         *'show job 3') cat {fixtures}/scontrol-json-show-job-finished.json ;;\n\
         *'show job 5') cat {fixtures}/scontrol-json-show-job-running.json ;;\n\
         *) echo '{{\"jobs\": []}}' ;;\nesac\n"
    );
    for (name, body) in [
        ("scontrol", scontrol.as_str()),
        ("sacct", "#!/bin/sh\necho '{\"jobs\": []}'\n"),
    ] {
        site.command(name, body);
    }
    let me = short_hostname();
    let save = site.dir.path().join("statesave");
    fs::create_dir_all(&save).unwrap();
    let slurm_conf = site.dir.path().join("slurm.conf");
    fs::write(
        &slurm_conf,
        format!(
            "ClusterName=hpc-cluster-west\nSlurmctldHost={me}\n\
             SlurmctldHost=cvslurm-other-ctl(10.99.0.2)\nStateSaveLocation={}\n",
            save.display()
        ),
    )
    .unwrap();
    // Queued while no service ran and CloudVision could not be reached.
    let hook_conf = hook_conf_without_server(&site);
    for id in ["3", "5"] {
        let out = run_hook(&site, &hook_conf, &job_env("prolog_slurmctld", id, &[]));
        assert_eq!(out.status.code(), Some(0));
    }
    assert_eq!(site.outbox().len(), 2, "{}", site.log());
    // This host leads (the heartbeat names it, a process named slurmctld runs here): only
    // the leader sends a RUNNING, once checked.
    let mut slurmctld = fake_slurmctld(&site);
    write_heartbeat(&save, 0);
    let _svc = Service::start_with_env(&site, &[("SLURM_CONF", &slurm_conf)]);
    wait_for("both jobs delivered", Duration::from_secs(20), || {
        let s = job_states(&cv);
        s.contains_key("3@hpc-cluster-west") && s.contains_key("5@hpc-cluster-west")
    });
    let s = job_states(&cv);
    assert_eq!(s["3@hpc-cluster-west"], ["JOB_STATE_COMPLETED"], "{s:?}");
    assert_eq!(s["5@hpc-cluster-west"], ["JOB_STATE_RUNNING"], "{s:?}");
    let end = cv
        .accepted("JobConfig")
        .into_iter()
        .find(|b| b["key"]["id"] == "3@hpc-cluster-west")
        .unwrap();
    // Slurm's own record: start 1796082835, end 1796082839, on n1.
    assert_eq!(end["start_time"], "2026-11-30T23:53:55Z", "{end}");
    assert_eq!(end["end_time"], "2026-11-30T23:53:59Z", "{end}");
    assert_eq!(end["nodes"]["values"], json!(["n1"]), "{end}");
    let log = site.log();
    assert!(
        log.contains("job events queued before this start are checked against Slurm"),
        "{log}"
    );
    assert!(
        log.contains("has ended (COMPLETED): sending its end from Slurm's record instead"),
        "{log}"
    );
    assert!(site.outbox().is_empty(), "{}", log);
    let _ = slurmctld.kill();
    let _ = slurmctld.wait();
}

/// Slurm 22.05 with a queue past the output bound: no listing of slurmctld's jobs can be had,
/// and the ends the prologs recorded are asked of accounting alone (the PrologSlurmctld-only
/// set-up would otherwise send none). The listing is `yes` (endless output, past
/// `SlurmOutputMaxMiB=1`); accounting answers with a real 22.05 capture, where job 2 is
/// COMPLETED.
#[test]
fn a_listing_past_the_bound_takes_the_recorded_jobs_ends_from_accounting() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "SlurmOutputMaxMiB=1");
    let sacct = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/slurm-22.05/json/sacct.json"
    );
    for (name, body) in [
        (
            "scontrol",
            "#!/bin/sh\ncase \"$*\" in\n*--version*) echo 'slurm 22.05.8' ;;\n\
             *'show config'*) echo 'ClusterName = cvtest' ;;\n*) exit 1 ;;\nesac\n"
                .to_string(),
        ),
        ("squeue", "#!/bin/sh\nexec yes\n".to_string()),
        ("sacct", format!("#!/bin/sh\ncat {sacct}\n")),
    ] {
        site.command(name, &body);
    }
    let out = run_hook(
        &site,
        &site.conf,
        &job_env(
            "prolog_slurmctld",
            "2",
            // Slurm's start of job 2 in the accounting capture above.
            &[
                ("SLURM_CLUSTER_NAME", "cvtest"),
                ("SLURM_JOB_START_TIME", "1796092479"),
            ],
        ),
    );
    assert_eq!(out.status.code(), Some(0));
    wait_for("the RUNNING", Duration::from_secs(10), || {
        job_states(&cv).contains_key("2@cvtest")
    });
    // The record is older than reconciliation's grace (a clock-step guard of 1 s).
    let record = site.state_dir.join("jobs").join("2@cvtest");
    assert!(record.exists(), "{}", site.log());
    let ok = Command::new("touch")
        .args(["-d", "-10 seconds"])
        .arg(&record)
        .status()
        .unwrap();
    assert!(ok.success());
    let out = Command::new(bin())
        .arg("flush")
        .env_remove("CV_API_TOKEN")
        .env_remove("CV_API_SERVER")
        .env("CVSLURM_CONF", &site.conf)
        .output()
        .unwrap();
    let log = site.log();
    assert_eq!(out.status.code(), Some(0), "{}\n{log}", stderr(&out));
    let log = format!("{log}\n{}", stderr(&out));
    assert_eq!(
        job_states(&cv)["2@cvtest"],
        ["JOB_STATE_RUNNING", "JOB_STATE_COMPLETED"],
        "{log}"
    );
    let end = cv
        .accepted("JobConfig")
        .into_iter()
        .rfind(|b| b["key"]["id"] == "2@cvtest")
        .unwrap();
    assert_eq!(end["start_time"], "2026-12-01T02:34:39Z", "{end}");
    assert_eq!(end["end_time"], "2026-12-01T02:34:40Z", "{end}");
    assert!(log.contains("printed more than 1 MiB"), "{log}");
    assert!(
        log.contains("reconcile: job 2@cvtest ended (COMPLETED) but no epilog reported it"),
        "{log}"
    );
}

/// A free TCP port on 127.0.0.1 (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The captured jobcomp/elasticsearch document of job name `name` whose state is `state`
/// (tests/fixtures/slurm-22.05/jobcomp/), made job `id` of cluster hpc-cluster-west.
fn captured_doc(name: &str, state: &str, id: u64) -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/slurm-22.05/jobcomp/requests.jsonl"
    );
    let text = std::fs::read_to_string(path).unwrap();
    for line in text.lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        let mut d: serde_json::Value = serde_json::from_str(r["body"].as_str().unwrap()).unwrap();
        if d["job_name"] == name && d["state"] == state {
            d["jobid"] = json!(id);
            d["cluster"] = json!("hpc-cluster-west");
            // This run's times (a start long before the prolog's record is an earlier run's).
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64;
            let at = |t: i64| cvslurm::internals::timefmt::format_epoch(t).unwrap();
            d["@start"] = json!(at(now));
            d["@end"] = json!(at(now + 1));
            return d.to_string();
        }
    }
    panic!("no {name} {state} in {path}");
}

/// POSTs `body` as libcurl does for jobcomp/elasticsearch (with `Expect: 100-continue`) and
/// returns the final status.
fn post_jobcomp(port: u16, body: &str) -> u16 {
    use std::io::{BufRead, BufReader, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "POST /slurm/jobcomp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: */*\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert_eq!(line, "HTTP/1.1 100 Continue\r\n");
    r.read_line(&mut line).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    line.clear();
    r.read_line(&mut line).unwrap();
    line.split(' ').nth(1).unwrap().parse().unwrap()
}

/// the service's job-completion receiver takes the documents Slurm's
/// jobcomp/elasticsearch plugin posts (real 22.05 captures): an end is answered 200 once it
/// is in the outbox and reaches CloudVision after its run's RUNNING, with Slurm's state and
/// times; a requeue ends the run as FAILED; a resize, a job that never ran, a foreign or
/// malformed document send nothing (200: the plugin would post them forever); an outbox
/// that cannot take the end answers 503, so that the plugin posts it again.
#[test]
fn the_job_completion_receiver_queues_slurms_ends() {
    let cv = Standin::start();
    let port = free_port();
    let site = Site::with_standin(&cv, &format!("JobCompPort={port}"));
    let conf = site.dir.path().join("slurm.conf");
    std::fs::write(&conf, "ClusterName=hpc-cluster-west\n").unwrap();
    let _svc = Service::start_with_env(&site, &[("SLURM_CONF", &conf)]);
    wait_for("the receiver", Duration::from_secs(20), || {
        site.log().contains(&format!(
            "job-completion receiver listening on http://127.0.0.1:{port}/"
        ))
    });
    // Job 1: its RUNNING from the prolog, its end from the plugin.
    let (out, _) = site.hook(&job_env("prolog_slurmctld", "1", &[]));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(post_jobcomp(port, &captured_doc("ok", "COMPLETED", 1)), 200);
    let until = Instant::now() + Duration::from_secs(20);
    while !cv
        .stored_job("1@hpc-cluster-west")
        .is_some_and(|j| j["state"] == "JOB_STATE_COMPLETED")
    {
        assert!(Instant::now() < until, "no end of job 1: {}", site.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let job = cv.stored_job("1@hpc-cluster-west").unwrap();
    assert_eq!(job["name"], "ok@debug", "{job}");
    assert_eq!(job["nodes"]["values"], json!(["n1"]), "{job}");
    let states: Vec<String> = cv
        .accepted("JobConfig")
        .iter()
        .filter(|j| j["key"]["id"] == "1@hpc-cluster-west")
        .map(|j| j["state"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(states, ["JOB_STATE_RUNNING", "JOB_STATE_COMPLETED"]);
    // A requeue ends the run as FAILED.
    assert_eq!(
        post_jobcomp(port, &captured_doc("requeue", "PENDING", 2)),
        200
    );
    wait_for("job 2's end", Duration::from_secs(20), || {
        cv.stored_job("2@hpc-cluster-west")
            .is_some_and(|j| j["state"] == "JOB_STATE_FAILED")
    });
    // Nothing to send: a resize, a job that never ran, another cluster's, not JSON.
    let before = cv.requests().len();
    let mut foreign: serde_json::Value =
        serde_json::from_str(&captured_doc("ok", "COMPLETED", 4)).unwrap();
    foreign["cluster"] = json!("other");
    for doc in [
        captured_doc("resize", "RESIZING", 3),
        captured_doc("held", "CANCELLED", 5),
        foreign.to_string(),
        "{\"jobid\": \"\\u001b[2J\"".to_string(),
    ] {
        assert_eq!(post_jobcomp(port, &doc), 200, "{doc}");
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(cv.requests().len(), before);
    let log = site.log();
    assert!(log.contains("job-completion receiver: a document dropped: job 4 of cluster \"other\", not hpc-cluster-west"), "{log}");
    assert!(
        log.contains("job-completion receiver: a document dropped: not JSON"),
        "{log}"
    );
    // An outbox that cannot take the end: 503, nothing lost on cvslurm's side.
    let outbox = site
        .state_dir
        .join(cvslurm::internals::state::layout::OUTBOX);
    let saved = site.state_dir.join("outbox.saved");
    std::fs::rename(&outbox, &saved).unwrap();
    std::fs::write(&outbox, "not a directory").unwrap();
    assert_eq!(post_jobcomp(port, &captured_doc("fail", "FAILED", 6)), 503);
    assert!(site
        .log()
        .contains("answered 503, slurmctld posts it again in 30 s"));
    std::fs::remove_file(&outbox).unwrap();
    std::fs::rename(&saved, &outbox).unwrap();
    assert_eq!(post_jobcomp(port, &captured_doc("fail", "FAILED", 6)), 200);
    wait_for("job 6's end", Duration::from_secs(20), || {
        cv.stored_job("6@hpc-cluster-west")
            .is_some_and(|j| j["state"] == "JOB_STATE_FAILED")
    });
}

/// One request the stand-in Elasticsearch took.
#[derive(Debug, Clone)]
struct EsRequest {
    head: String,
    body: Vec<u8>,
    /// Answered 201 (indexed).
    taken: bool,
}

/// How the stand-in Elasticsearch answers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum EsMode {
    /// 201 Created, as Elasticsearch indexes a document.
    Up,
    /// Reads the request and never answers.
    Hang,
    /// 503 Service Unavailable, as an Elasticsearch that cannot index.
    Down,
    /// Reads the request and closes the connection without an answer.
    Close,
}

/// A stand-in for the site's Elasticsearch (the target of `JobCompForward`): an HTTP/1.1
/// listener on 127.0.0.1 that records every request it reads.
struct Es {
    port: u16,
    seen: std::sync::Arc<std::sync::Mutex<Vec<EsRequest>>>,
    mode: std::sync::Arc<std::sync::Mutex<EsMode>>,
}

impl Es {
    /// Listens on `port` (0: any).
    fn start(port: u16, mode: EsMode) -> Es {
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mode = std::sync::Arc::new(std::sync::Mutex::new(mode));
        let (s, m) = (seen.clone(), mode.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (s, m) = (s.clone(), m.clone());
                std::thread::spawn(move || {
                    let mut out = conn.try_clone().unwrap();
                    let mut r = BufReader::new(conn);
                    loop {
                        let mut head = String::new();
                        loop {
                            let mut line = String::new();
                            if r.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            if line == "\r\n" {
                                break;
                            }
                            head.push_str(&line);
                        }
                        let len = head
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        let mut body = vec![0; len];
                        r.read_exact(&mut body).unwrap();
                        let mode = *m.lock().unwrap();
                        s.lock().unwrap().push(EsRequest {
                            head,
                            body,
                            taken: mode == EsMode::Up,
                        });
                        let (status, answer) = match mode {
                            EsMode::Hang => {
                                // Holds the connection open, never answering.
                                std::thread::sleep(Duration::from_secs(3600));
                                return;
                            }
                            EsMode::Close => return,
                            EsMode::Down => ("503 Service Unavailable", "{\"status\":503}"),
                            EsMode::Up => ("201 Created", "{\"result\":\"created\"}"),
                        };
                        let _ = write!(
                            out,
                            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
                            answer.len()
                        );
                    }
                });
            }
        });
        Es { port, seen, mode }
    }

    /// Answers as `mode` from now on.
    fn set(&self, mode: EsMode) {
        *self.mode.lock().unwrap() = mode;
    }

    /// The POSTs indexed (answered 201) so far.
    fn taken(&self) -> Vec<EsRequest> {
        self.posts().into_iter().filter(|r| r.taken).collect()
    }

    /// The POSTs read so far.
    fn posts(&self) -> Vec<EsRequest> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.head.starts_with("POST "))
            .cloned()
            .collect()
    }
}

/// A site whose service receives job-completion documents on a free port and forwards them
/// to `forward`, with `extra` config lines; the port.
fn forwarding_site(cv: &Standin, forward: &str, extra: &str) -> (Site, u16, Service) {
    let port = free_port();
    let site = Site::with_standin(
        cv,
        &format!("JobCompPort={port}\nJobCompForward={forward}\n{extra}"),
    );
    let conf = site.dir.path().join("slurm.conf");
    std::fs::write(&conf, "ClusterName=hpc-cluster-west\n").unwrap();
    let svc = Service::start_with_env(&site, &[("SLURM_CONF", &conf)]);
    wait_for("the receiver", Duration::from_secs(20), || {
        site.log().contains(&format!(
            "job-completion receiver listening on http://127.0.0.1:{port}/"
        ))
    });
    (site, port, svc)
}

/// `cvslurm status --json --offline` of `site`.
fn status_json(site: &Site) -> Value {
    serde_json::from_slice(&site.run(&["status", "--json", "--offline"]).stdout).unwrap()
}

/// `JobCompForward`: every document slurmctld posts (ends, a resize, one that is no JSON)
/// reaches the site's Elasticsearch byte for byte, in order, as Slurm's plugin posts it (the
/// configured path, `Content-Type: application/json`, the URL's credentials as Basic auth);
/// while the target is down they wait in the spool (`status` counts them) and the receiver
/// still answers 200 and queues the ends, and a kill -9 of the service loses none of them;
/// once the target is up they all arrive, in order, once.
#[test]
fn job_completion_documents_are_forwarded_unchanged_and_in_order_across_an_outage() {
    let cv = Standin::start();
    let es = Es::start(0, EsMode::Down);
    let es_port = es.port;
    let (site, port, mut svc) = forwarding_site(
        &cv,
        &format!("http://elastic:s%3Acret@127.0.0.1:{es_port}/slurm/_doc"),
        "",
    );
    assert!(
        site.log().contains(&format!(
            "every document goes on, unchanged, to http://elastic:***@127.0.0.1:{es_port}/slurm/_doc"
        )),
        "{}",
        site.log()
    );
    // The target is down (it answers 503): every document is answered and spooled.
    let docs = [
        captured_doc("ok", "COMPLETED", 11),
        captured_doc("resize", "RESIZING", 12),
        "{\"jobid\": \"\\u001b[2J\"".to_string(),
        captured_doc("fail", "FAILED", 13),
        captured_doc("two", "COMPLETED", 14),
    ];
    for d in &docs {
        assert_eq!(post_jobcomp(port, d), 200, "{d}");
    }
    wait_for(
        "job 13's end in CloudVision",
        Duration::from_secs(20),
        || {
            cv.stored_job("13@hpc-cluster-west")
                .is_some_and(|j| j["state"] == "JOB_STATE_FAILED")
        },
    );
    wait_for("the forwarder's failure", Duration::from_secs(20), || {
        site.log().contains("JobCompForward: http://elastic:***@")
            && site.log().contains("did not take a document")
    });
    assert!(!site.log().contains("s:cret"), "{}", site.log());
    let st = status_json(&site);
    assert_eq!(st["metrics"]["jobcomp_forward_spool_documents"], 5, "{st}");
    let text = stdout(&site.run(&["status", "--offline"]));
    assert!(
        text.contains("JobCompForward:   5 document(s) spooled for http://elastic:***@"),
        "{text}"
    );
    // The service killed -9 and started again: the spool is taken up where it was.
    svc.kill();
    let conf = site.dir.path().join("slurm.conf");
    let _svc = Service::start_with_env(&site, &[("SLURM_CONF", &conf)]);
    wait_for("the spool taken up", Duration::from_secs(20), || {
        site.log()
            .contains("JobCompForward: 5 document(s) spooled by an earlier run go first")
    });
    // Up: all of them, in order, unchanged, once; until then only the first was tried.
    assert!(!es.posts().is_empty());
    es.set(EsMode::Up);
    wait_for("the forwarded documents", Duration::from_secs(60), || {
        es.taken().len() >= docs.len()
    });
    assert!(es
        .posts()
        .iter()
        .filter(|r| !r.taken)
        .all(|r| r.body == docs[0].as_bytes()));
    let posts = es.taken();
    let bodies: Vec<&[u8]> = posts.iter().map(|r| r.body.as_slice()).collect();
    let want: Vec<&[u8]> = docs.iter().map(|d| d.as_bytes()).collect();
    assert_eq!(bodies, want);
    for r in &posts {
        let head = r.head.to_ascii_lowercase();
        assert!(
            r.head.starts_with("POST /slurm/_doc HTTP/1.1\r\n"),
            "{}",
            r.head
        );
        assert!(
            head.contains("\r\ncontent-type: application/json\r\n"),
            "{}",
            r.head
        );
        // elastic:s:cret
        assert!(
            r.head
                .contains("\r\nauthorization: Basic ZWxhc3RpYzpzOmNyZXQ=\r\n")
                || r.head
                    .contains("\r\nAuthorization: Basic ZWxhc3RpYzpzOmNyZXQ=\r\n"),
            "{}",
            r.head
        );
    }
    wait_for("an empty spool", Duration::from_secs(20), || {
        status_json(&site)["metrics"]["jobcomp_forward_spool_documents"] == 0
    });
    // Later documents go straight on.
    let more = captured_doc("ok", "COMPLETED", 15);
    assert_eq!(post_jobcomp(port, &more), 200);
    wait_for("the next document", Duration::from_secs(20), || {
        es.taken().len() == docs.len() + 1
    });
    assert_eq!(es.taken().last().unwrap().body, more.as_bytes());
    let st = status_json(&site);
    assert_eq!(
        st["metrics"]["counters"]["jobcomp_forward_dropped"], 0,
        "{st}"
    );
}

/// A forward target that takes the connection and never answers delays neither the
/// receiver's answers to slurmctld nor cvslurm's own ends.
#[test]
fn a_hanging_forward_target_delays_neither_the_receiver_nor_the_ends() {
    let cv = Standin::start();
    let es = Es::start(0, EsMode::Hang);
    // The hanging post is never cut short while the test runs.
    let (_site, port, _svc) = forwarding_site(
        &cv,
        &format!("http://127.0.0.1:{}/slurm/jobcomp", es.port),
        "RequestTimeout=3600",
    );
    assert_eq!(
        post_jobcomp(port, &captured_doc("ok", "COMPLETED", 21)),
        200
    );
    // The forwarder is inside its post, waiting for an answer that does not come.
    wait_for("the hanging post", Duration::from_secs(20), || {
        es.posts().len() == 1
    });
    // Each answered while the forwarder still waits (post_jobcomp gives up after 20 s).
    for id in 22..=24 {
        assert_eq!(post_jobcomp(port, &captured_doc("fail", "FAILED", id)), 200);
    }
    for id in [21, 22, 23, 24] {
        wait_for(&format!("job {id}'s end"), Duration::from_secs(20), || {
            cv.stored_job(&format!("{id}@hpc-cluster-west")).is_some()
        });
    }
    assert_eq!(es.posts().len(), 1, "one document at a time, in order");
    es.set(EsMode::Up);
}

/// The spool's bound: past `JobCompForwardMaxDocs` a document is answered 200 all the same
/// (cvslurm's end is queued), not spooled, counted (`status`, the metrics) and warned about
/// with what to do; the spooled ones still go once the target answers.
#[test]
fn the_forward_spools_bound_drops_with_a_warning_and_a_count() {
    let cv = Standin::start();
    let es = Es::start(0, EsMode::Close);
    let (site, port, _svc) = forwarding_site(
        &cv,
        &format!("http://127.0.0.1:{}/slurm/jobcomp", es.port),
        "JobCompForwardMaxDocs=2",
    );
    let docs: Vec<String> = (31..=34)
        .map(|id| captured_doc("ok", "COMPLETED", id))
        .collect();
    for d in &docs {
        assert_eq!(post_jobcomp(port, d), 200);
    }
    wait_for("job 34's end", Duration::from_secs(20), || {
        cv.stored_job("34@hpc-cluster-west").is_some()
    });
    let log = site.log();
    assert!(
        log.contains("JobCompForward: the spool is full (2 documents")
            && log.contains("raise JobCompForwardMaxDocs, or remove JobCompForward"),
        "{log}"
    );
    assert_eq!(log.matches("the spool is full").count(), 1, "{log}");
    let st = status_json(&site);
    assert_eq!(
        st["metrics"]["counters"]["jobcomp_forward_dropped"], 2,
        "{st}"
    );
    assert_eq!(st["metrics"]["jobcomp_forward_spool_documents"], 2, "{st}");
    let text = stdout(&site.run(&["status", "--offline"]));
    assert!(
        text.contains("2 document(s) spooled for http://127.0.0.1:"),
        "{text}"
    );
    assert!(text.contains(", 2 dropped"), "{text}");
    es.set(EsMode::Up);
    wait_for("the spooled documents", Duration::from_secs(60), || {
        es.taken().len() == 2
    });
    let bodies: Vec<Vec<u8>> = es.taken().into_iter().map(|r| r.body).collect();
    assert_eq!(bodies, [docs[0].as_bytes(), docs[1].as_bytes()]);
}

/// A `JobCompForward` that is no http(s) URL is refused at load, on one line naming the key
/// and what to give; `check` shows a good one and whether it answers.
#[test]
fn a_hostile_forward_target_is_refused_and_check_shows_a_good_one() {
    let cv = Standin::start();
    for bad in [
        "file:///etc/passwd",
        "gopher://127.0.0.1:70/x",
        "http://",
        "http://es.example.com/\u{1b}[2Jx",
    ] {
        let site = Site::with_standin(&cv, &format!("JobCompPort=9250\nJobCompForward={bad}"));
        let out = site.run(&["check"]);
        let text = format!("{}{}", stdout(&out), stderr(&out));
        let line = text
            .lines()
            .find(|l| l.contains("JobCompForward"))
            .unwrap_or_else(|| panic!("{bad}: {text}"));
        assert!(line.contains("JobCompLoc"), "{bad}: {line}");
        assert_ne!(out.status.code(), Some(0), "{bad}: {text}");
        assert!(!text.contains('\u{1b}'), "{bad}: {text}");
    }
    let es = Es::start(0, EsMode::Up);
    let site = Site::with_standin(
        &cv,
        &format!(
            "JobCompPort=9250\nJobCompForward=http://127.0.0.1:{}/slurm/jobcomp",
            es.port
        ),
    );
    let check = stdout(&site.run(&["check"]));
    assert!(
        check.contains(&format!(
            "ok   JobCompForward: http://127.0.0.1:{}/slurm/jobcomp answers (HTTP 201 to GET http://127.0.0.1:{}/); 0 document(s) spooled, 0 dropped",
            es.port, es.port
        )),
        "{check}"
    );
    es.set(EsMode::Close);
    let site = Site::with_standin(
        &cv,
        &format!(
            "JobCompPort=9250\nJobCompForward=http://127.0.0.1:{}/x",
            es.port
        ),
    );
    let check = stdout(&site.run(&["check"]));
    assert!(
        check.contains("WARN JobCompForward: http://127.0.0.1:")
            && check.contains("does not answer"),
        "{check}"
    );
}

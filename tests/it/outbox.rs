//! The outbox under stress, through the binary: an outage with hooks running 20 at a time,
//! and kill -9 of hooks and drainers at random points.

use crate::common::*;
use cvslurm::internals::state::layout;
use serde_json::json;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[test]
fn outage_of_200_events_from_20_concurrent_hooks_loses_nothing() {
    let cv = Standin::start();
    // A budget that CPU starvation alone cannot use up (this test once lost ends with the
    // default 2 s on a machine busy with other builds): what it checks is that no end waits
    // behind the lock for the disk, not how fast a starved machine is. An epilog whose budget
    // does run out is `an_end_that_cannot_be_queued_keeps_its_start_record`.
    let site = Site::with_standin(&cv, "HookTimeout=120");
    cv.set_mode(json!({"mode": "status", "status": 503}));
    let jobs = 100; // a prolog and an epilog each: 200 events
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
                let (code, _) = final_state(i);
                let (out, _) = site.hook(&job_env(
                    "epilog_slurmctld",
                    &id,
                    &[("SLURM_JOB_EXIT_CODE2", code)],
                ));
                assert_eq!(out.status.code(), Some(0));
            });
        }
    });
    assert_eq!(
        site.outbox().len(),
        jobs,
        "one pending file per job: its RUNNING with its end chained after it"
    );
    cv.set_mode(json!({"mode": "ok"}));
    let out = site.run(&["flush"]);
    assert_exit_0(&out);
    assert_eq!(
        stdout(&out).trim(),
        format!("outbox: {} delivered, 0 kept, 0 rejected", 2 * jobs),
        "every job's RUNNING, then its end"
    );
    let state = cv.state();
    for i in 0..jobs {
        let key = format!("{}@hpc-cluster-west", 1000 + i);
        assert_eq!(state["jobs"][&key]["state"], final_state(i).1, "{key}");
    }
    // No RUNNING was delivered after its job's end.
    ended_with_no_running_after(&cv);
    assert!(site.outbox().is_empty());
}

#[test]
fn kill_minus_9_at_random_points_loses_no_returned_event() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "HookTimeout=2\nRequestTimeout=2");
    // Slow answers widen the window in which a kill lands mid-send.
    cv.set_mode(json!({"mode": "delay", "delay_ms": 15}));
    let mut rng = Rng::new();
    let link = site.link("cvslurm-hook");
    let started = Instant::now();
    let (mut returned, mut killed, mut drainer_kills) = (Vec::new(), 0, 0);
    let mut i = 0;
    while i < 1000 && started.elapsed() < Duration::from_secs(120) {
        i += 1;
        let job = 5000 + (i % 300); // jobs recur: later events supersede earlier ones
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
        std::thread::sleep(Duration::from_micros(rng.below(60_000)));
        match child.try_wait().unwrap() {
            Some(st) => {
                assert_eq!(st.code(), Some(0));
                returned.push((id, ctx));
            }
            None => {
                let _ = child.kill();
                let _ = child.wait();
                killed += 1;
            }
        }
        // Now and then a drainer, killed at a random point too.
        if rng.below(10) == 0 {
            let mut d = Command::new(bin())
                .arg("flush")
                .env("CVSLURM_CONF", &site.conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_micros(rng.below(40_000)));
            if d.try_wait().unwrap().is_none() {
                let _ = d.kill();
                drainer_kills += 1;
            }
            let _ = d.wait();
        }
    }
    eprintln!(
        "{i} hook runs: {} returned, {killed} killed; {drainer_kills} drainers killed",
        returned.len()
    );
    assert!(
        killed > 0 && !returned.is_empty(),
        "the loop must both kill and let hooks finish"
    );
    // Afterwards: the outbox parses, and one clean flush delivers everything.
    cv.set_mode(json!({"mode": "ok"}));
    let out = site.run(&["flush"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(site.outbox().is_empty());
    assert_eq!(
        std::fs::read_dir(site.state_dir.join(layout::REJECTED))
            .unwrap()
            .count(),
        0,
        "no unreadable outbox file"
    );
    // Every event a hook returned for reached CloudVision, or was superseded by a later event
    // of the same job that did.
    let state = cv.state();
    for (id, _) in &returned {
        let got = &state["jobs"][format!("{id}@hpc-cluster-west")];
        if !got.is_object() {
            let key = format!("job {id}@");
            let log: Vec<String> = site
                .log()
                .lines()
                .filter(|l| l.contains(&key))
                .map(String::from)
                .collect();
            panic!(
                "job {id}: a returned event never reached CloudVision; its log:\n{}",
                log.join("\n")
            );
        }
    }
}

/// An event a newer cvslurm wrote (a format this one does not know) stays where it is: not
/// sent, not rejected, not deleted; the rest of the outbox is sent around it.
#[test]
fn an_event_of_a_newer_format_is_kept_and_not_sent() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "");
    cv.set_mode(json!({"mode": "status", "status": 503}));
    for id in ["77", "78"] {
        let (out, _) = site.hook(&job_env("prolog_slurmctld", id, &[]));
        assert_eq!(out.status.code(), Some(0));
    }
    let queued = site.outbox();
    assert_eq!(queued.len(), 2);
    assert!(queued.iter().all(|e| e["v"] == 1), "{queued:?}");
    // Job 77's event as a newer cvslurm would have left it (the file its hook handed in).
    let newer = std::fs::read_dir(site.state_dir.join(layout::OUTBOX))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("job.77@hpc-cluster-west.")
        })
        .unwrap();
    let mut ev: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&newer).unwrap()).unwrap();
    ev["v"] = 2.into();
    let bytes = serde_json::to_vec(&ev).unwrap();
    std::fs::write(&newer, &bytes).unwrap();
    cv.set_mode(json!({"mode": "ok"}));
    let out = site.run(&["flush"]);
    assert_exit_0(&out);
    assert_eq!(
        stdout(&out).trim(),
        "outbox: 1 delivered, 0 kept, 0 rejected"
    );
    let state = cv.state();
    assert!(state["jobs"]["78@hpc-cluster-west"].is_object());
    assert!(!state["jobs"]["77@hpc-cluster-west"].is_object());
    assert_eq!(std::fs::read(&newer).unwrap(), bytes, "left as it was");
    assert_eq!(
        std::fs::read_dir(site.state_dir.join(layout::REJECTED))
            .unwrap()
            .count(),
        0
    );
    let said = format!("{}{}", stderr(&out), site.log());
    assert!(
        said.contains("an event of format 2, written by a newer cvslurm"),
        "{said}"
    );
}

/// CPU-bound processes beside the hooks while every job's RUNNING is still waiting to be sent
/// (CloudVision answers 503) and a drainer keeps retrying them: every epilog chains its end
/// behind its RUNNING under `outbox.lock`. No end may be lost: none may wait for the disk
/// under the lock the hooks take. Asserts on what is queued and logged,
/// never on timing.
#[test]
fn ends_behind_waiting_runnings_under_cpu_load_are_never_lost() {
    use std::sync::atomic::AtomicBool;
    let cv = Standin::start();
    // A budget that CPU starvation alone cannot use up (this test once lost ends with the
    // default 2 s on a machine busy with other builds): what it checks is that no end waits
    // behind the lock for the disk, not how fast a starved machine is. An epilog whose budget
    // does run out is `an_end_that_cannot_be_queued_keeps_its_start_record`.
    let site = Site::with_standin(&cv, "HookTimeout=120");
    cv.set_mode(json!({"mode": "status", "status": 503}));
    let jobs = 100;
    let next = AtomicUsize::new(0);
    let run_hooks = |ctx: &'static str| {
        next.store(0, Ordering::Relaxed);
        std::thread::scope(|s| {
            for _ in 0..20 {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= jobs {
                        break;
                    }
                    let id = (3000 + i).to_string();
                    let (out, _) =
                        site.hook(&job_env(ctx, &id, &[("SLURM_JOB_EXIT_CODE2", "0:0")]));
                    assert_eq!(out.status.code(), Some(0));
                });
            }
        });
    };
    run_hooks("prolog_slurmctld");
    assert_eq!(
        site.outbox().len(),
        jobs,
        "every RUNNING waits in the outbox"
    );
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        // Four CPU burners, and a drainer sending (and failing) the RUNNINGs all along.
        for _ in 0..4 {
            s.spawn(|| {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..100_000 {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                }
            });
        }
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let _ = site.run(&["flush"]);
            }
        });
        run_hooks("epilog_slurmctld");
        stop.store(true, Ordering::Relaxed);
    });
    let log = site.log();
    let lost: Vec<&str> = log.lines().filter(|l| l.contains("LOST")).collect();
    assert!(
        lost.is_empty(),
        "{} ends lost:\n{}",
        lost.len(),
        lost.join("\n")
    );
    // Every job's end is queued (chained after its RUNNING, or alone once that went out).
    let mut ended = std::collections::HashSet::new();
    for ev in site.outbox() {
        let id = ev["job"]["key"]["id"].as_str().unwrap().to_string();
        let end = if ev["job"]["state"] == "JOB_STATE_RUNNING" {
            &ev["then"]["job"]["state"]
        } else {
            &ev["job"]["state"]
        };
        if *end == "JOB_STATE_COMPLETED" {
            ended.insert(id);
        }
    }
    for i in 0..jobs {
        let key = format!("{}@hpc-cluster-west", 3000 + i);
        assert!(ended.contains(&key), "the end of {key} is not queued");
    }
}

/// An epilog that cannot queue its end (here the outbox is not a directory any more), and
/// cannot send it either, keeps the job's start record, so that reconciliation finds the job
/// gone and sends its end.
#[test]
fn an_end_that_cannot_be_queued_keeps_its_start_record() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "HookTimeout=1");
    cv.set_mode(json!({"mode": "status", "status": 503}));
    let (out, _) = site.hook(&job_env("prolog_slurmctld", "4242", &[]));
    assert_eq!(out.status.code(), Some(0));
    let record = site
        .state_dir
        .join(layout::JOBS)
        .join("4242@hpc-cluster-west");
    assert!(record.exists(), "the prolog records the start");
    let outbox = site.state_dir.join(layout::OUTBOX);
    std::fs::rename(&outbox, site.state_dir.join("outbox.aside")).unwrap();
    std::fs::write(&outbox, b"not a directory").unwrap();
    let (out, _) = site.hook(&job_env(
        "epilog_slurmctld",
        "4242",
        &[("SLURM_JOB_EXIT_CODE2", "0:0")],
    ));
    assert_eq!(out.status.code(), Some(0));
    assert!(site.log().contains("LOST"), "{}", site.log());
    assert!(
        record.exists(),
        "the start record of a job whose end was lost is kept for reconciliation"
    );
}

/// 50 epilogs at once while their jobs' RUNNINGs still wait in the outbox (CloudVision refused
/// the prologs) and another process holds every lock of the outbox (`outbox.lock`,
/// `drainer.lock`) for as long as they run: a hook never waits for another process, so every
/// end is queued (none LOST), each behind its RUNNING; once the locks go, one flush delivers
/// every RUNNING and then its end. Asserts on what is queued, logged and delivered, never on
/// timing (the budget is one the held locks would use up, not CPU starvation).
#[test]
fn epilogs_queue_while_another_process_holds_every_outbox_lock() {
    let cv = Standin::start();
    let site = Site::with_standin(&cv, "HookTimeout=20");
    cv.set_mode(json!({"mode": "status", "status": 503}));
    let jobs = 50;
    let run = |ctx: &'static str| {
        std::thread::scope(|s| {
            for i in 0..jobs {
                let site = &site;
                s.spawn(move || {
                    let id = (7000 + i).to_string();
                    let (out, _) =
                        site.hook(&job_env(ctx, &id, &[("SLURM_JOB_EXIT_CODE2", "0:0")]));
                    assert_eq!(out.status.code(), Some(0));
                });
            }
        });
    };
    run("prolog_slurmctld");
    assert_eq!(site.outbox().len(), jobs, "every RUNNING waits");
    // Held by a separate process: `flock` from a child that waits on its stdin.
    let mut holder = Command::new("flock")
        .arg(site.state_dir.join(layout::OUTBOX_LOCK))
        .args(["flock"])
        .arg(site.state_dir.join(layout::DRAINER_LOCK))
        .args(["sh", "-c", "echo held; read _; exit 0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()),
        &mut said,
    )
    .unwrap();
    assert_eq!(said.trim(), "held");
    run("epilog_slurmctld");
    let log = site.log();
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    let lost: Vec<&str> = log.lines().filter(|l| l.contains("LOST")).collect();
    assert!(
        lost.is_empty(),
        "{} ends lost:\n{}",
        lost.len(),
        lost.join("\n")
    );
    assert_eq!(
        log.matches("queued after its RUNNING, which is still waiting to be sent")
            .count(),
        jobs,
        "{log}"
    );
    let queued = site.outbox();
    assert_eq!(queued.len(), jobs);
    for ev in &queued {
        assert_eq!(ev["job"]["state"], "JOB_STATE_RUNNING");
        assert_eq!(ev["then"]["job"]["state"], "JOB_STATE_COMPLETED", "{ev}");
    }
    cv.set_mode(json!({"mode": "ok"}));
    let out = site.run(&["flush"]);
    assert_exit_0(&out);
    assert_eq!(
        stdout(&out).trim(),
        format!("outbox: {} delivered, 0 kept, 0 rejected", 2 * jobs)
    );
    let ended = ended_with_no_running_after(&cv);
    assert_eq!(ended.len(), jobs);
    assert!(site.outbox().is_empty());
}

/// The jobs whose end CloudVision took, asserting that no RUNNING of a job was taken after
/// its end (in the stand-in's request log).
fn ended_with_no_running_after(cv: &Standin) -> std::collections::HashSet<String> {
    let mut ended = std::collections::HashSet::new();
    for r in cv.requests() {
        if r["status"] != 200 {
            continue;
        }
        let id = r["body"]["key"]["id"].as_str().unwrap().to_string();
        if r["body"]["state"] == "JOB_STATE_RUNNING" {
            assert!(!ended.contains(&id), "RUNNING of {id} after its end");
        } else {
            ended.insert(id);
        }
    }
    ended
}

//! How a job's end reaches CloudVision: requeue, time limit, `send`, reconciliation and
//! verification, the PrologSlurmctld-only and `--jobcomp` set-ups, `MinJobAge=2`.

use super::*;

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn send_running_job_from_scontrol_and_ended_job_from_sacct() {
    let (f, _g) = shared();
    let run = sbatch(&["-J", "e2e-send", "--wrap", "sleep 60"]);
    let done = sbatch(&["-J", "e2e-sent-later", "--wrap", "true"]);
    wait_job(f, &run, "JOB_STATE_RUNNING", Duration::from_secs(30));
    wait_job(f, &done, "JOB_STATE_COMPLETED", Duration::from_secs(60));
    // Wait until slurmctld forgot the finished job (MinJobAge) so only sacct knows it.
    let until = Instant::now() + Duration::from_secs(60);
    while stdout(&slurm("scontrol", &["show", "job", "-o", &done])).contains("JobId=") {
        assert!(Instant::now() < until, "job {done} never left slurmctld");
        std::thread::sleep(Duration::from_millis(500));
    }
    let out = Command::new(&f.bin)
        .args(["send", "--dry-run", &run, &done])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let bodies = dry_run_bodies(&text);
    assert_eq!(bodies.len(), 2, "{text}");
    assert_eq!(bodies[0]["state"], "JOB_STATE_RUNNING");
    assert_eq!(bodies[0]["type"], "JOB_TYPE_CONFIGURED");
    assert_eq!(bodies[0]["name"], "e2e-send@debug");
    assert_eq!(bodies[1]["state"], "JOB_STATE_COMPLETED");
    assert_eq!(bodies[1]["key"]["id"], key(&done));
    // The hook's record and sacct agree on the times.
    let hooked = f.cv.state()["jobs"][key(&done)].clone();
    assert_eq!(bodies[1]["start_time"], hooked["start_time"]);
    assert_eq!(bodies[1]["nodes"], hooked["nodes"]);
    // And for real, through the one client.
    // (this job's records only: the other shared tests' hooks post at the same time)
    let before = job_events(f, &run).len();
    let out = Command::new(&f.bin).args(["send", &run]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains(&format!(
        "job {}: sent RUNNING on 1 node(s) (HTTP 200)",
        key(&run)
    )));
    assert_eq!(job_events(f, &run).len(), before + 1);
    let pending = sbatch(&[
        "-J",
        "e2e-pending",
        "--begin",
        "now+1hour",
        "--wrap",
        "true",
    ]);
    let out = Command::new(&f.bin)
        .args(["send", &pending])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&format!(
            "job {pending} is PENDING: CloudVision has no such state"
        )),
        "{}",
        stderr(&out)
    );
    slurm("scancel", &[&run, &pending]);
}

/// One node's slurmd dies under a job that may be requeued: the first run ends FAILED, the
/// inventory skips the dead node and sends the others, the rerun is RUNNING with no end time
/// and then COMPLETED.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn dead_node_requeue_ends_right() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    // The first run outlives the node's death (slurmstepd would report a short job's end by
    // itself); the rerun after the requeue runs until this test has looked at its record
    // (a file it creates), so what is looked at is the rerun's RUNNING, whatever the timing.
    // (WORK is the nodes' too.)
    // The first run says when it runs (a file), so n4 dies under a started job.
    let done = Path::new(WORK).join("rerun-looked");
    let started = Path::new(WORK).join("first-run-started");
    for p in [&done, &started] {
        let _ = fs::remove_file(p);
    }
    let script = format!(
        r#"if [ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ]; then i=0; while [ ! -e {} ] && [ $i -lt 600 ]; do sleep 0.2; i=$((i+1)); done; else touch {}; sleep 300; fi"#,
        done.display(),
        started.display()
    );
    let id = sbatch(&[
        "-J",
        "e2e-requeue",
        "--requeue",
        "-w",
        "n4",
        "--wrap",
        &script,
    ]);
    // Dropped after the Restore below: a failure midway leaves no rerun holding n4.
    let _cancel = Cancel(id.clone());
    wait_job(f, &id, "JOB_STATE_RUNNING", Duration::from_secs(30));
    wait_until("the first run's script", Duration::from_secs(60), || {
        started.exists()
    });
    cluster_sh(&["stop-slurmd", "n4"], &[]);
    let _restore = Restore(&["start-slurmd", "n4"]);
    // n4 is set DOWN as slurmctld would after SlurmdTimeout (30 s here) without an answer:
    // both kill its jobs through kill_running_job_by_node_name (node_mgr.c), which requeues
    // this one under the same id.
    let mut down = NodeDown::set("n4", "e2e-dead-slurmd");
    wait_until("the job to be requeued", Duration::from_secs(150), || {
        let s = stdout(&slurm("scontrol", &["show", "job", "-o", &id]));
        s.contains("Restarts=1") || s.contains("JobState=PENDING")
    });
    let requeued = Instant::now();
    // The first run's end reaches CloudVision (FAILED: a node failure), with its end time.
    let first = wait_job(f, &id, "JOB_STATE_FAILED", Duration::from_secs(60));
    assert!(first["end_time"].is_string(), "{first}");
    // A node whose slurmd is dead is reported unavailable by the inventory, with its state
    // (down, or down* once slurmctld's ping has found no slurmd); the others are still sent.
    down.keep();
    let out = Command::new(&f.bin).args(["inventory"]).output().unwrap();
    let text = stdout(&out);
    if text.contains("3 sent, 0 failed, 1 unavailable (n4 (down))")
        || text.contains("3 sent, 0 failed, 1 unavailable (n4 (down*))")
    {
        assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    } else {
        // Unless Slurm itself put n4 back after the look above (see NodeDown: the answer to
        // the job's launch, given before n4's slurmd stopped, recorded late; seen in CI on
        // 24.11). Slurm then lists n4 as idle: the inventory tries it, and says that its
        // discovery failed and why.
        assert!(down.returned(), "{text}\n{}", stderr(&out));
        assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
        assert!(
            text.contains("3 sent, 1 failed (n4), 0 unavailable"),
            "{text}"
        );
        assert!(
            stderr(&out).contains("node n4: discovery failed"),
            "{}",
            stderr(&out)
        );
        say(
            "slurmctld returned n4 to service on an answer from before its slurmd stopped \
             (ReturnToService=2): the inventory tried n4 and said it failed",
        );
    }
    cluster_sh(&["start-slurmd", "n4"], &[]);
    // Slurm holds a requeued job cred_expire + 1 s (16 s here) before it may run again; the
    // rerun then starts at the next scheduling pass. A job submitted starts one at once
    // (queue_job_scheduler, proc_req.c) rather than the periodic one up to 60 s later: an
    // earlier one only means the rerun waits for the periodic pass.
    let hold = Duration::from_secs(17);
    if let Some(rest) = hold.checked_sub(requeued.elapsed()) {
        std::thread::sleep(rest);
    }
    sbatch(&["-J", "e2e-requeue-next", "-w", "n1", "--wrap", "true"]);
    // While the rerun runs, its record holds no end time: the earlier run's record was
    // deleted before its RUNNING (CloudVision's Set would keep the absent end_time).
    let rerun = wait_job(f, &id, "JOB_STATE_RUNNING", Duration::from_secs(300));
    let stored = f.cv.stored_job(&key(&id)).unwrap_or(rerun);
    assert_eq!(stored["state"], "JOB_STATE_RUNNING", "{stored}");
    assert!(stored.get("end_time").is_none(), "{stored}");
    assert!(
        f.cv.requests()
            .iter()
            .any(|r| r["method"] == "DELETE"
                && r["path"].as_str().unwrap_or("").contains("JobConfig")),
        "no DELETE of the earlier run's record"
    );
    fs::write(&done, "").unwrap();
    let v = wait_job(f, &id, "JOB_STATE_COMPLETED", Duration::from_secs(120));
    check_times(&v);
    let states: Vec<String> = job_events(f, &id)
        .iter()
        .map(|j| j["state"].as_str().unwrap().to_string())
        .collect();
    assert!(
        states.iter().filter(|s| *s == "JOB_STATE_RUNNING").count() >= 2,
        "{states:?}"
    );
    assert_eq!(states.last().unwrap(), "JOB_STATE_COMPLETED");
}

/// A job past its time limit ends FAILED, with Slurm's times. The job is the fixture's (see
/// `Fixture::time_limit_job`): Slurm ends it 60-90 s after the cluster came up, while other
/// tests run, so its wait for Slurm's timers holds nobody up. Looking at CloudVision needs no
/// hold on the cluster: an outage another test makes only delays the end, never loses it.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn time_limit_ends_failed() {
    let f = fixture();
    let v = wait_job(
        f,
        &f.time_limit_job,
        "JOB_STATE_FAILED",
        Duration::from_secs(300),
    );
    check_times(&v);
}

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn reconciliation_reports_what_no_hook_did() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    // A finished job whose epilog never reported (its prolog record left behind, aged).
    let ended = sbatch(&["-J", "e2e-noepilog", "--wrap", "exit 4"]);
    wait_job(f, &ended, "JOB_STATE_FAILED", Duration::from_secs(60));
    // A running job no hook reported (as if cvslurm was installed mid-job).
    let running = sbatch(&["-J", "e2e-nohook", "--wrap", "sleep 300"]);
    wait_job(f, &running, "JOB_STATE_RUNNING", Duration::from_secs(30));
    // CloudVision forgets both (their records only: the other tests' stay), then the
    // records say what no hook did.
    f.cv.forget_jobs(&[key(&ended), key(&running)]);
    let record = f.state_dir.join(layout::JOBS).join(key(&ended));
    fs::write(&record, "1700000000\n").unwrap();
    chown_slurm(&record);
    let old = std::time::SystemTime::now() - Duration::from_secs(600);
    fs::File::options()
        .write(true)
        .open(&record)
        .unwrap()
        .set_modified(old)
        .unwrap();
    fs::remove_file(f.state_dir.join(layout::JOBS).join(key(&running))).unwrap();
    let r = wait_job(f, &running, "JOB_STATE_RUNNING", Duration::from_secs(30));
    assert_eq!(r["name"], "e2e-nohook@debug");
    let e = wait_job(f, &ended, "JOB_STATE_FAILED", Duration::from_secs(30));
    let (start, end) = sacct_times(&ended);
    assert_eq!(
        (e["start_time"].as_str(), e["end_time"].as_str()),
        (Some(start.as_str()), Some(end.as_str())),
        "Slurm's own times, not the record's"
    );
    assert!(!f.state_dir.join(layout::JOBS).join(key(&ended)).exists());
    let log = fs::read_to_string(&f.log_file).unwrap();
    assert!(
        log.contains(&format!(
            "reconcile: job {} runs but no hook reported it",
            key(&running)
        )),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "reconcile: job {} ended (FAILED) but no epilog reported it",
            key(&ended)
        )),
        "{log}"
    );
    slurm("scancel", &[&running]);
    wait_job(f, &running, "JOB_STATE_CANCELLED", Duration::from_secs(90));
}

/// A COMPLETED end whose times are not Slurm's (an epilog on 22.05 that could not ask
/// slurmctld in time sends the prolog's start and its own clock) is corrected by the
/// service's verification to Slurm's own start and end.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn verification_corrects_times_to_slurms() {
    let (f, _g) = shared();
    let id = sbatch(&["-J", "e2e-times", "--wrap", "sleep 1"]);
    let done = wait_job(f, &id, "JOB_STATE_COMPLETED", Duration::from_secs(60));
    let (start, end) = sacct_times(&id);
    assert_eq!(done["start_time"].as_str(), Some(start.as_str()));
    // The mark an epilog with a wrong clock would have left, aged past the verification delay.
    let mut wrong = done.clone();
    wrong["start_time"] = json!("2020-01-01T00:00:00Z");
    wrong["end_time"] = json!("2020-01-01T00:00:09Z");
    let mark = f.state_dir.join(layout::VERIFY).join(key(&id));
    fs::write(&mark, json!({"job": wrong, "restart_count": 0}).to_string()).unwrap();
    chown_slurm(&mark);
    fs::File::options()
        .write(true)
        .open(&mark)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(60))
        .unwrap();
    let before = job_events(f, &id).len();
    wait_until("the correction", Duration::from_secs(30), || {
        job_events(f, &id).len() > before
    });
    let fixed = job_events(f, &id).last().unwrap().clone();
    assert_eq!(fixed["state"], "JOB_STATE_COMPLETED");
    assert_eq!(
        (fixed["start_time"].as_str(), fixed["end_time"].as_str()),
        (Some(start.as_str()), Some(end.as_str())),
        "{fixed}"
    );
    assert!(!mark.exists());
}

/// PrologSlurmctld only, no EpilogSlurmctld (README, "Without EpilogSlurmctld"): nothing of
/// cvslurm's runs when a job ends, and the service's reconciliation sends each end from
/// slurmctld's listing (or accounting, once slurmctld forgot the job), with Slurm's own state
/// and times, one listing per pass however many jobs ended.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn prolog_only_set_up_ends_come_from_reconciliation() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let conf = PathBuf::from("/etc/slurm/slurm.conf");
    let saved = fs::read_to_string(&conf).unwrap();
    /// Puts slurm.conf back (and slurmctld on it) however the test ends.
    struct PutBack(PathBuf, String);
    impl Drop for PutBack {
        fn drop(&mut self) {
            let _ = fs::write(&self.0, &self.1);
            let _ = Command::new(repo().join("tests/cluster/cluster.sh"))
                .arg("restart-slurmctld")
                .output();
        }
    }
    let _put_back = PutBack(conf.clone(), saved.clone());
    let without = without_epilog(&saved);
    fs::write(&conf, &without).unwrap();
    cluster_sh(&["restart-slurmctld"], &[]);
    let ok = sbatch(&["-J", "e2e-prolog-only", "--wrap", "true"]);
    let bad = sbatch(&["-J", "e2e-prolog-only", "--wrap", "exit 4"]);
    for (id, state) in [(&ok, "JOB_STATE_COMPLETED"), (&bad, "JOB_STATE_FAILED")] {
        let v = wait_job(f, id, state, Duration::from_secs(60));
        let (start, end) = sacct_times(id);
        assert_eq!(
            (v["start_time"].as_str(), v["end_time"].as_str()),
            (Some(start.as_str()), Some(end.as_str())),
            "job {id}: Slurm's own times"
        );
        let states: Vec<Value> = job_events(f, id)
            .iter()
            .map(|j| j["state"].clone())
            .collect();
        assert_eq!(
            states,
            [json!("JOB_STATE_RUNNING"), json!(state)],
            "job {id}"
        );
    }
    let log = fs::read_to_string(&f.log_file).unwrap();
    for (id, st) in [(&ok, "COMPLETED"), (&bad, "FAILED")] {
        assert!(
            log.contains(&format!(
                "reconcile: job {} ended ({st}) but no epilog reported it",
                key(id)
            )),
            "{log}"
        );
        assert!(
            !log.contains(&format!("job {}: {st} queued", key(id))),
            "an epilog ran for job {id}"
        );
    }
}

/// The `--jobcomp` set-up on a real cluster: no EpilogSlurmctld, slurm.conf's
/// `JobCompType=jobcomp/elasticsearch` posting to the service's receiver. Each job's end
/// reaches CloudVision from Slurm's job-completion record, after its RUNNING, with sacct's
/// state and times; a requeued run ends FAILED and the job's next run is shown running.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn jobcomp_set_up_ends_come_from_slurms_job_completion_plugin() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let conf = PathBuf::from("/etc/slurm/slurm.conf");
    let saved = fs::read_to_string(&conf).unwrap();
    let saved_cv = fs::read_to_string(&f.conf).unwrap();
    /// Puts slurm.conf, cloudvision.conf, slurmctld and the service back however it ends.
    struct PutBack<'a>(&'a Fixture, PathBuf, String, String);
    impl Drop for PutBack<'_> {
        fn drop(&mut self) {
            let _ = fs::write(&self.1, &self.2);
            let _ = fs::write(&self.0.conf, &self.3);
            let _ = Command::new(repo().join("tests/cluster/cluster.sh"))
                .arg("restart-slurmctld")
                .output();
            let _ = restart_service(self.0);
        }
    }
    let _put_back = PutBack(f, conf.clone(), saved.clone(), saved_cv.clone());
    let mut with = without_epilog(&saved).replace("JobCompType=jobcomp/none\n", "");
    with.push_str(&format!(
        "JobCompType=jobcomp/elasticsearch\nJobCompLoc=http://127.0.0.1:{port}/slurm/jobcomp\n"
    ));
    fs::write(&conf, &with).unwrap();
    // ReconcileInterval=0: every end here can only come from the plugin.
    fs::write(
        &f.conf,
        format!("{saved_cv}JobCompPort={port}\nReconcileInterval=0\n"),
    )
    .unwrap();
    restart_service(f).unwrap();
    cluster_sh(&["restart-slurmctld"], &[]);
    let from = log_len(f);
    let ok = sbatch(&["-J", "e2e-jobcomp", "--wrap", "sleep 1"]);
    let bad = sbatch(&["-J", "e2e-jobcomp", "--wrap", "exit 4"]);
    let cancel = sbatch(&["-J", "e2e-jobcomp", "--wrap", "sleep 60"]);
    wait_job(f, &cancel, "JOB_STATE_RUNNING", Duration::from_secs(30));
    assert!(slurm("scancel", &[&cancel]).status.success());
    // slurmctld's first posts after its start come up to ~30 s late (measured 26 s on
    // 22.05; about a second once it runs).
    for (id, state) in [
        (&ok, "JOB_STATE_COMPLETED"),
        (&bad, "JOB_STATE_FAILED"),
        (&cancel, "JOB_STATE_CANCELLED"),
    ] {
        let v = wait_job(f, id, state, Duration::from_secs(90));
        let (start, end) = sacct_times(id);
        assert_eq!(
            (v["start_time"].as_str(), v["end_time"].as_str()),
            (Some(start.as_str()), Some(end.as_str())),
            "job {id}: Slurm's own times"
        );
        let states: Vec<Value> = job_events(f, id)
            .iter()
            .map(|j| j["state"].clone())
            .collect();
        assert_eq!(
            states.first(),
            Some(&json!("JOB_STATE_RUNNING")),
            "job {id}: {states:?}"
        );
        assert_eq!(states.last(), Some(&json!(state)), "job {id}: {states:?}");
        assert!(
            !states[1..states.len() - 1].contains(&json!("JOB_STATE_RUNNING")),
            "job {id}: a RUNNING after an end: {states:?}"
        );
    }
    let log = log_since(f, from);
    for (id, st) in [(&ok, "COMPLETED"), (&bad, "FAILED"), (&cancel, "CANCELLED")] {
        let queued = format!(
            "job {}: {st} queued from Slurm's job-completion record",
            key(id)
        );
        assert!(log.contains(&queued), "{queued}\n{log}");
        assert!(
            !log.contains(&format!("job {}: {st} queued for the service", key(id))),
            "an epilog ran for job {id}"
        );
    }
}

/// slurm.conf's text without its `EpilogSlurmctld=` lines (the PrologSlurmctld-only set-up);
/// the cluster must have one to take away.
fn without_epilog(conf: &str) -> String {
    let without: String = conf
        .lines()
        .filter(|l| !l.starts_with("EpilogSlurmctld="))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(
        without, conf,
        "the cluster has no EpilogSlurmctld to take away"
    );
    without
}

/// `MinJobAge=2`: slurmctld forgets an ended job seconds after it ends (at its next
/// purge), so what the service learns late comes from accounting. (a) Both hooks: each job is
/// RUNNING then its final state with sacct's times. (b) PrologSlurmctld only: the ends come
/// from reconciliation; the service is held (SIGSTOP) until slurmctld has forgotten the jobs,
/// so each end is sacct's record, and the log says so.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn min_job_age_2_ends_from_hooks_and_from_accounting() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let conf = PathBuf::from("/etc/slurm/slurm.conf");
    let saved = fs::read_to_string(&conf).unwrap();
    /// Lets the service run again, cancels the test's jobs and puts slurm.conf back (and
    /// slurmctld on it), however the test ends.
    struct PutBack(PathBuf, String, u32);
    impl Drop for PutBack {
        fn drop(&mut self) {
            let pid = nix::unistd::Pid::from_raw(self.2 as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
            for name in ["e2e-age-a", "e2e-age-b"] {
                let _ = slurm("scancel", &["--name", name]);
            }
            let _ = fs::write(&self.0, &self.1);
            let _ = Command::new(repo().join("tests/cluster/cluster.sh"))
                .arg("restart-slurmctld")
                .output();
        }
    }
    let service_pid = f.service.lock().unwrap_or_else(|e| e.into_inner()).id();
    let _put_back = PutBack(conf.clone(), saved.clone(), service_pid);
    let aged = with_line(&saved, "MinJobAge=", "MinJobAge=2");
    let expect = |ok: &String, bad: &String, cancel: &String| {
        [
            (ok.clone(), "JOB_STATE_COMPLETED"),
            (bad.clone(), "JOB_STATE_FAILED"),
            (cancel.clone(), "JOB_STATE_CANCELLED"),
        ]
    };
    let t = Instant::now();
    // (a) Both hooks.
    fs::write(&conf, &aged).unwrap();
    cluster_sh(&["restart-slurmctld"], &[]);
    let ok = sbatch(&["-J", "e2e-age-a", "--wrap", "sleep 1"]);
    let bad = sbatch(&["-J", "e2e-age-a", "--wrap", "sleep 1; exit 3"]);
    let cancel = sbatch(&["-J", "e2e-age-a", "--wrap", "sleep 300"]);
    wait_job(f, &cancel, "JOB_STATE_RUNNING", Duration::from_secs(60));
    assert!(slurm("scancel", &[&cancel]).status.success());
    for (id, state) in expect(&ok, &bad, &cancel) {
        let events = wait_final_as_sacct(f, &id, state, Duration::from_secs(60));
        assert_eq!(states_of(&events), ["JOB_STATE_RUNNING", state], "job {id}");
    }
    eprintln!(
        "[e2e] MinJobAge=2, both hooks: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    // (b) PrologSlurmctld only.
    let from = log_len(f);
    let prolog_only = without_epilog(&aged);
    fs::write(&conf, &prolog_only).unwrap();
    cluster_sh(&["restart-slurmctld"], &[]);
    // The jobs end when told (WORK is the nodes' too): after the service is held.
    let go = Path::new(WORK).join("age-b-go");
    let _ = fs::remove_file(&go);
    let wait_go = format!("while [ ! -e {} ]; do sleep 0.2; done", go.display());
    let ok = sbatch(&["-J", "e2e-age-b", "--wrap", &wait_go]);
    let bad = sbatch(&["-J", "e2e-age-b", "--wrap", &format!("{wait_go}; exit 3")]);
    let cancel = sbatch(&["-J", "e2e-age-b", "--wrap", "sleep 300"]);
    for id in [&ok, &bad, &cancel] {
        wait_job(f, id, "JOB_STATE_RUNNING", Duration::from_secs(60));
    }
    // The service asks nothing until slurmctld has forgotten the three jobs.
    let pid = nix::unistd::Pid::from_raw(service_pid as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    fs::write(&go, "").unwrap();
    assert!(slurm("scancel", &[&cancel]).status.success());
    for id in [&ok, &bad, &cancel] {
        wait_until(
            &format!("slurmctld to forget job {id}"),
            Duration::from_secs(120),
            || {
                let out = slurm("scontrol", &["show", "job", id]);
                !out.status.success() && stderr(&out).contains("Invalid job id")
            },
        );
        sacct_times(id);
    }
    eprintln!(
        "[e2e] MinJobAge=2: slurmctld forgot the jobs after {:.1} s",
        t.elapsed().as_secs_f64()
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    for (id, state) in expect(&ok, &bad, &cancel) {
        let events = wait_final_as_sacct(f, &id, state, Duration::from_secs(60));
        assert_eq!(states_of(&events), ["JOB_STATE_RUNNING", state], "job {id}");
    }
    let log = log_since(f, from);
    for (id, state) in expect(&ok, &bad, &cancel) {
        let st = state.trim_start_matches("JOB_STATE_");
        assert!(
            log.contains(&format!(
                "reconcile: job {} ended ({st}) but no epilog reported it; sending {st} (Slurm's record from accounting)",
                key(&id)
            )),
            "job {id}:\n{log}"
        );
    }
    eprintln!(
        "[e2e] MinJobAge=2, both set-ups: {:.1} s",
        t.elapsed().as_secs_f64()
    );
}

//! Job shapes through the hooks and the service: batch, array, srun/salloc, multi-node,
//! heterogeneous, resized and suspended jobs, jobs whose node reboots first, and hostile job
//! names.

use super::*;

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn batch_job_success_running_then_completed() {
    let (f, _g) = shared();
    let id = sbatch(&["-J", "e2e-ok", "--wrap", "sleep 2"]);
    let running = wait_job(f, &id, "JOB_STATE_RUNNING", Duration::from_secs(30));
    assert_eq!(running["name"], "e2e-ok@debug");
    assert_eq!(running["location"], CLUSTER);
    assert!(running.get("end_time").is_none());
    let done = wait_job(f, &id, "JOB_STATE_COMPLETED", Duration::from_secs(60));
    check_times(&done);
    // The final record carries Slurm's own start and end, the ones accounting has.
    let (start, end) = sacct_times(&id);
    assert_eq!(done["start_time"].as_str(), Some(start.as_str()));
    assert_eq!(done["end_time"].as_str(), Some(end.as_str()));
    assert_eq!(nodes_of(&done), nodes_of(&running));
    assert_eq!(nodes_of(&done).len(), 1);
    let states: Vec<_> = job_events(f, &id)
        .iter()
        .map(|j| j["state"].clone())
        .collect();
    assert_eq!(states, ["JOB_STATE_RUNNING", "JOB_STATE_COMPLETED"]);
}

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn batch_job_exit_code_and_self_signal_fail() {
    let (f, _g) = shared();
    let exit3 = sbatch(&["-J", "e2e-exit3", "--wrap", "exit 3"]);
    let selfkill = sbatch(&["-J", "e2e-kill", "--wrap", "kill -9 $$"]);
    wait_job(f, &exit3, "JOB_STATE_FAILED", Duration::from_secs(60));
    let v = wait_job(f, &selfkill, "JOB_STATE_FAILED", Duration::from_secs(60));
    check_times(&v);
}

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn scancel_while_running_is_cancelled() {
    let (f, _g) = shared();
    let id = sbatch(&["-J", "e2e-cancel", "--wrap", "sleep 300"]);
    wait_job(f, &id, "JOB_STATE_RUNNING", Duration::from_secs(30));
    assert!(slurm("scancel", &[&id]).status.success());
    // A cancel can reach the epilog looking like a success on 22.05; then reconciliation
    // corrects it from Slurm's record within a few seconds. From 24.11 on, slurmctld's JSON
    // names the final state in the epilog: the epilog itself sends CANCELLED.
    let v = wait_job(f, &id, "JOB_STATE_CANCELLED", Duration::from_secs(90));
    check_times(&v);
    let (start, end) = sacct_times(&id);
    assert_eq!(
        (v["start_time"].as_str(), v["end_time"].as_str()),
        (Some(start.as_str()), Some(end.as_str()))
    );
    if slurm_version() >= (24, 11) {
        let states: Vec<_> = job_events(f, &id)
            .iter()
            .map(|j| j["state"].clone())
            .collect();
        assert_eq!(states, ["JOB_STATE_RUNNING", "JOB_STATE_CANCELLED"]);
    }
}

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn multi_node_and_chosen_nodes() {
    let (f, _g) = shared();
    let three = sbatch(&["-J", "e2e-n3", "-N3", "--wrap", "sleep 1"]);
    let chosen = sbatch(&["-J", "e2e-w", "-w", "n[1,3]", "--wrap", "sleep 1"]);
    let gpu = sbatch(&[
        "-J", "e2e-gpu", "-p", "gpu", "-w", "n3", "--wrap", "sleep 1",
    ]);
    assert_eq!(
        nodes_of(&wait_job(
            f,
            &three,
            "JOB_STATE_COMPLETED",
            Duration::from_secs(60)
        )),
        ["n1", "n2", "n3"]
    );
    assert_eq!(
        nodes_of(&wait_job(
            f,
            &chosen,
            "JOB_STATE_COMPLETED",
            Duration::from_secs(60)
        )),
        ["n1", "n3"]
    );
    let g = wait_job(f, &gpu, "JOB_STATE_COMPLETED", Duration::from_secs(60));
    assert_eq!(g["name"], "e2e-gpu@gpu");
}

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn array_tasks_are_separate_jobs() {
    let (f, _g) = shared();
    let array = sbatch(&["-J", "e2e-array", "-a", "1-3", "--wrap", "sleep 1"]);
    // Each task reaches the hooks with its own SLURM_JOB_ID.
    let until = Instant::now() + Duration::from_secs(60);
    let ids: Vec<String> = loop {
        let out = slurm(
            "sacct",
            &["-j", &array, "-X", "-n", "-P", "--format=JobIDRaw,State"],
        );
        let rows: Vec<(String, String)> = stdout(&out)
            .lines()
            .filter_map(|l| {
                l.split_once('|')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
            })
            .collect();
        if rows.len() == 3 && rows.iter().all(|(_, s)| s == "COMPLETED") {
            break rows.into_iter().map(|(a, _)| a).collect();
        }
        assert!(
            Instant::now() < until,
            "array {array} did not finish: {}",
            stdout(&out)
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3);
    for id in &ids {
        let v = wait_job(f, id, "JOB_STATE_COMPLETED", Duration::from_secs(30));
        assert_eq!(v["name"], "e2e-array@debug");
    }
}

/// A heterogeneous job is one job: one JobConfig keyed by its leader, on the union of the
/// nodes of its running components; a component cancelled alone shrinks it; one end. No
/// record is keyed by a component's own id.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn het_job_is_one_job_keyed_by_its_leader() {
    let (f, _g) = shared();
    let leader = sbatch(&[
        "-J",
        "e2e-het",
        "-N1",
        "-x",
        "n4",
        ":",
        "-N1",
        "-x",
        "n4",
        ":",
        "-N1",
        "-x",
        "n4",
        "--wrap",
        "sleep 300",
    ]);
    // Each component as squeue has it while it runs: (own id, nodes).
    let components = || -> Vec<(String, Vec<String>)> {
        let out = slurm("squeue", &["-h", "-j", &leader, "-t", "R", "-o", "%A|%N"]);
        stdout(&out)
            .lines()
            .filter_map(|l| l.split_once('|'))
            .map(|(id, n)| {
                let nodes = cvslurm::internals::slurm::hostlist::expand(n.trim()).unwrap();
                (id.trim().to_string(), nodes)
            })
            .collect()
    };
    let union = |c: &[(String, Vec<String>)]| {
        let mut v: Vec<String> = c.iter().flat_map(|(_, n)| n.clone()).collect();
        v.sort();
        v.dedup();
        v
    };
    let sorted = |v: &Value| {
        let mut n = nodes_of(v);
        n.sort();
        n
    };
    let stored = || f.cv.stored_job(&key(&leader)).unwrap_or(Value::Null);
    let mut all = Vec::new();
    wait_until(
        "the het job's three components to run",
        Duration::from_secs(60),
        || {
            all = components();
            all.len() == 3
        },
    );
    let ids: Vec<String> = all.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(ids[0], leader, "{all:?}");
    wait_until(
        "CloudVision to hold the het job on all its nodes",
        Duration::from_secs(30),
        || {
            let v = stored();
            v["state"] == "JOB_STATE_RUNNING" && sorted(&v) == union(&all)
        },
    );
    assert_eq!(stored()["name"], "e2e-het@debug");
    // The second component cancelled alone: the job goes on, on fewer nodes.
    assert!(slurm("scancel", &[&format!("{leader}+1")]).status.success());
    let mut rest = Vec::new();
    wait_until(
        "the second component to end",
        Duration::from_secs(30),
        || {
            rest = components();
            rest.len() == 2
        },
    );
    wait_until(
        "CloudVision to drop its nodes",
        Duration::from_secs(30),
        || {
            let v = stored();
            v["state"] == "JOB_STATE_RUNNING" && sorted(&v) == union(&rest)
        },
    );
    assert!(slurm("scancel", &[&leader]).status.success());
    let done = wait_job(f, &leader, "JOB_STATE_CANCELLED", Duration::from_secs(90));
    check_times(&done);
    let (_, end) = sacct_times(&leader);
    assert_eq!(done["end_time"].as_str(), Some(end.as_str()));
    // The end is on the components that ran to the end: those that did not end before the
    // leader, in Slurm's whole seconds (a component cancelled in the leader's second ran to
    // the end as far as Slurm can tell).
    // Accounting records each component's end on its own (slurmdbd may lag behind).
    let mut ends = String::new();
    wait_until(
        "every component's end in sacct",
        Duration::from_secs(60),
        || {
            ends = stdout(&slurm(
                "sacct",
                &["-j", &leader, "-X", "-n", "-P", "--format=JobIDRaw,End"],
            ));
            all.iter().all(|(id, _)| {
                ends.lines().any(|l| {
                    l.strip_prefix(&format!("{id}|"))
                        .is_some_and(|e| !e.is_empty() && e != "Unknown")
                })
            })
        },
    );
    let end_of = |id: &str| {
        ends.lines()
            .find_map(|l| l.strip_prefix(&format!("{id}|")).map(str::to_string))
            .unwrap_or_else(|| panic!("no end of {id} in sacct: {ends}"))
    };
    let ran_to_end: Vec<(String, Vec<String>)> = all
        .iter()
        .filter(|(id, _)| end_of(id) >= end_of(&leader))
        .cloned()
        .collect();
    assert_eq!(sorted(&done), union(&ran_to_end), "{ends}");
    let states: Vec<Value> = job_events(f, &leader)
        .iter()
        .map(|j| j["state"].clone())
        .collect();
    let first_end = states
        .iter()
        .position(|s| s != "JOB_STATE_RUNNING")
        .unwrap();
    assert!(
        states[first_end..].iter().all(|s| s != "JOB_STATE_RUNNING"),
        "a RUNNING after the end: {states:?}"
    );
    for id in &ids[1..] {
        assert!(
            job_events(f, id).is_empty(),
            "a record keyed by component {id}"
        );
    }
}

/// Heterogeneous jobs in numbers, as the other shapes of their life: five `-N1 : -N1 : -N1`
/// jobs at once (Slurm gives a het job's components distinct nodes: three of n1-n3), two with their second component cancelled alone mid-run, one requeued as a
/// whole. CloudVision ends with one record per het job, keyed by its leader, equal to
/// accounting's last run of it (start, end, the nodes of the components that ran to the end),
/// no record keyed by a component's own id, and no RUNNING after a run's end.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn het_jobs_cancelled_alone_and_requeued_stay_one_job_each() {
    // The cluster to itself: only backfill starts a het job, and a pending job of higher
    // priority holds back every later one of its partition (the main scheduler stops there,
    // backfill reserves for it): other tests' jobs would wait behind these.
    let (f, _g) = exclusive();
    // Each run waits for its own gate file (`het-go-<leader>-<restart count>`, 2 minutes at
    // most), so that a job is still running when the test cancels a part of it or requeues it,
    // however slowly the machine goes.
    // Job ids start again with every new cluster: the gates carry this run's own token.
    let token = format!("{}-{}", std::process::id(), epoch_now());
    let gate =
        |leader: &str, run: u32| PathBuf::from(WORK).join(format!("het-go-{token}-{leader}-{run}"));
    let script = format!(
        "g={WORK}/het-go-{token}-$SLURM_JOB_ID-${{SLURM_RESTART_COUNT:-0}}; i=0; \
         while [ ! -e $g ] && [ $i -lt 600 ]; do sleep 0.2; i=$((i+1)); done"
    );
    // Three of n1-n3 each (Slurm gives a het job's components distinct nodes).
    let submit = |name: &str| {
        let part = ["-N1", "-x", "n4"];
        let mut args = vec!["-J", name];
        args.extend(part);
        args.push(":");
        args.extend(part);
        args.push(":");
        args.extend(part);
        args.extend(["--wrap", script.as_str()]);
        sbatch(&args)
    };
    let requeued = submit("e2e-het-requeue");
    let plain: Vec<String> = (0..2).map(|_| submit("e2e-het-many")).collect();
    let split: Vec<String> = (0..2).map(|_| submit("e2e-het-split")).collect();
    for leader in &plain {
        fs::write(gate(leader, 0), "").unwrap();
    }
    let running = |leader: &str| {
        let out = slurm("squeue", &["-h", "-j", leader, "-t", "R", "-o", "%A"]);
        stdout(&out).lines().count()
    };
    let run_all_three = |leader: &str| {
        wait_until(
            &format!("het job {leader}'s three components to run"),
            Duration::from_secs(90),
            || running(leader) == 3,
        )
    };
    // The requeue first (Slurm holds a requeued job 16 s here: the others go on meanwhile),
    // once CloudVision has the first run, so that run is one to end; the first run's gate
    // never opens (the requeue ends it), the second's is open from the start.
    run_all_three(&requeued);
    wait_job(f, &requeued, "JOB_STATE_RUNNING", Duration::from_secs(30));
    fs::write(gate(&requeued, 1), "").unwrap();
    assert_exit_0(&slurm("scontrol", &["requeue", &requeued]));
    for leader in &split {
        run_all_three(leader);
        let part = format!("{leader}+1");
        assert_exit_0(&slurm("scancel", &[&part]));
        // The rest ends in a later second than the part (Slurm's times are whole seconds).
        let mut ended = 0;
        wait_until(
            &format!("sacct to record {part}'s end"),
            Duration::from_secs(60),
            || {
                let out = slurm("sacct", &["-j", &part, "-X", "-n", "-P", "-o", "End"]);
                ended = stdout(&out).trim().parse().unwrap_or(0);
                ended > 0
            },
        );
        while epoch_now() <= ended {
            std::thread::sleep(Duration::from_millis(50));
        }
        fs::write(gate(leader, 0), "").unwrap();
    }

    let mut all: Vec<&String> = plain.iter().chain(&split).collect();
    all.push(&requeued);
    for leader in &all {
        // Accounting's last run, then CloudVision's record of that run (a requeued job's
        // earlier run has an end of its own).
        let (start, end) = sacct_times(leader);
        let mut done = Value::Null;
        wait_until(
            &format!("CloudVision to hold het job {leader}'s last run ended"),
            Duration::from_secs(60),
            || {
                done = f.cv().state()["jobs"][key(leader)].clone();
                done["state"] == "JOB_STATE_COMPLETED" && done["start_time"] == start.as_str()
            },
        );
        // Accounting's last run of each component: JobID `L+O`, raw id, state, end, nodes.
        let mut rows = String::new();
        wait_until(
            &format!("sacct to record every component of {leader}"),
            Duration::from_secs(60),
            || {
                rows = stdout(&slurm(
                    "sacct",
                    &[
                        "-j",
                        leader,
                        "-X",
                        "-n",
                        "-P",
                        "--format=JobID,JobIDRaw,State,End,NodeList",
                    ],
                ));
                let f: Vec<Vec<&str>> = rows.lines().map(|l| l.split('|').collect()).collect();
                f.len() == 3 && f.iter().all(|r| r.len() == 5 && r[3] != "Unknown")
            },
        );
        let comps: Vec<Vec<&str>> = rows.lines().map(|l| l.split('|').collect()).collect();
        assert_eq!(comps[0][0], format!("{leader}+0"), "{rows}");
        assert_eq!(comps[0][1], leader.as_str(), "{rows}");
        let leader_end = comps[0][3];
        let mut nodes: Vec<String> = comps
            .iter()
            .filter(|c| c[3] >= leader_end)
            .flat_map(|c| cvslurm::internals::slurm::hostlist::expand(c[4]).unwrap())
            .collect();
        nodes.sort();
        nodes.dedup();
        let mut got = nodes_of(&done);
        got.sort();
        assert_eq!(got, nodes, "job {leader}: {done}\n{rows}");
        assert_eq!(done["start_time"].as_str(), Some(start.as_str()), "{rows}");
        assert_eq!(done["end_time"].as_str(), Some(end.as_str()), "{rows}");
        if split.contains(leader) {
            // Cancelled alone, before the rest: its nodes are not the end's.
            assert!(comps[1][2].starts_with("CANCELLED"), "{rows}");
            assert!(comps[1][3] < leader_end, "{rows}");
        }
        for c in &comps[1..] {
            assert!(
                job_events(f, c[1]).is_empty(),
                "a record keyed by component {} of {leader}",
                c[1]
            );
        }
        // Every run's events in order: no RUNNING after that run's end.
        let states: Vec<String> = job_events(f, leader)
            .iter()
            .map(|j| j["state"].as_str().unwrap_or("").to_string())
            .collect();
        let ends = states.iter().filter(|s| *s != "JOB_STATE_RUNNING").count();
        let want_ends = if leader == &&requeued { 2 } else { 1 };
        assert!(ends >= want_ends, "job {leader}: {states:?}");
        let last_end = states
            .iter()
            .rposition(|s| s != "JOB_STATE_RUNNING")
            .unwrap();
        assert_eq!(
            last_end,
            states.len() - 1,
            "a RUNNING after the end: {states:?}"
        );
    }
}

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn srun_and_salloc_jobs() {
    let (f, _g) = shared();
    // Found in accounting by name: names of this run only (a reused cluster's accounting
    // has the jobs of earlier runs).
    let (srun_name, salloc_name) = (
        format!("e2e-srun-{}", std::process::id()),
        format!("e2e-salloc-{}", std::process::id()),
    );
    let out = slurm("srun", &["-J", &srun_name, "-N2", "-x", "n4", "hostname"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut hosts: Vec<String> = stdout(&out).lines().map(String::from).collect();
    hosts.sort();
    let out = slurm("salloc", &["-J", &salloc_name, "-N1", "-x", "n4", "true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Accounting records reach slurmdbd asynchronously: wait for them.
    let ids = |name: &str| -> String {
        let mut id = None;
        wait_until(&format!("{name} in sacct"), Duration::from_secs(60), || {
            let out = slurm(
                "sacct",
                &["-n", "-X", "-P", "--name", name, "--format=JobIDRaw"],
            );
            id = stdout(&out).lines().last().map(String::from);
            id.is_some()
        });
        id.unwrap()
    };
    let v = wait_job(
        f,
        &ids(&srun_name),
        "JOB_STATE_COMPLETED",
        Duration::from_secs(60),
    );
    assert_eq!(
        nodes_of(&v),
        hosts,
        "srun ran on the job's nodes (hostname = node name here)"
    );
    wait_job(
        f,
        &ids(&salloc_name),
        "JOB_STATE_COMPLETED",
        Duration::from_secs(60),
    );
}

/// Job names, comments and script lines that a text reader of scontrol/squeue/sacct takes for
/// fields or records of another job: a newline followed by another job's id, `JobState=` and
/// `NodeList=` words, quotes, `|` and non-ASCII. The hooks, `send` and reconciliation deliver
/// each job's own nodes, state and byte-exact name, and never touch the other job.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn hostile_job_names_forge_no_record() {
    let (f, _g) = shared();
    let victim = sbatch(&["-J", "e2e-victim", "-w", "n1", "--wrap", "sleep 120"]);
    wait_job(f, &victim, "JOB_STATE_RUNNING", Duration::from_secs(30));
    let names = [
        format!("x\nJobId={victim} JobState=FAILED NodeList=evil"),
        format!("q\"uo'te ünï JobState=CANCELLED NodeList=n1 |{victim}|"),
        "JobId=1 JobName=e2e JobState=COMPLETED Partition=gpu NodeList=n[1-4]".to_string(),
    ];
    let ids: Vec<String> = names
        .iter()
        .map(|n| {
            sbatch(&[
                "-w",
                "n2",
                &format!("--job-name={n}"),
                "--comment=NodeList=evil JobState=FAKE",
                "--wrap",
                "sleep 8 # NodeList=evil JobState=FAKE",
            ])
        })
        .collect();
    for (id, name) in ids.iter().zip(&names) {
        let r = wait_job(f, id, "JOB_STATE_RUNNING", Duration::from_secs(30));
        assert_eq!(r["name"].as_str(), Some(format!("{name}@debug").as_str()));
        assert_eq!(nodes_of(&r), ["n2"]);
    }
    // send reads slurmctld's JSON: every job is its own.
    let mut args = vec!["send", "--dry-run", victim.as_str()];
    args.extend(ids.iter().map(String::as_str));
    let out = Command::new(&f.bin).args(&args).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let bodies = dry_run_bodies(&text);
    assert_eq!(bodies.len(), 4, "{text}");
    assert_eq!(bodies[0]["key"]["id"], key(&victim));
    assert_eq!(bodies[0]["state"], "JOB_STATE_RUNNING");
    assert_eq!(nodes_of(&bodies[0]), ["n1"]);
    assert_eq!(bodies[0]["name"], "e2e-victim@debug");
    for ((b, id), name) in bodies[1..].iter().zip(&ids).zip(&names) {
        assert_eq!(b["key"]["id"], key(id));
        assert_eq!(b["state"], "JOB_STATE_RUNNING", "{b}");
        assert_eq!(nodes_of(b), ["n2"]);
        assert_eq!(b["name"].as_str(), Some(format!("{name}@debug").as_str()));
    }
    // Reconciliation: the victim's prolog record is gone (as if no hook had reported it), so
    // the service sends its RUNNING from slurmctld's listing, beside the hostile jobs.
    let before = job_events(f, &victim).len();
    fs::remove_file(f.state_dir.join(layout::JOBS).join(key(&victim))).unwrap();
    wait_until(
        "reconciliation to resend the victim's RUNNING",
        Duration::from_secs(30),
        || job_events(f, &victim).len() > before,
    );
    // Every job ends as itself, with Slurm's own times.
    for (id, name) in ids.iter().zip(&names) {
        let done = wait_job(f, id, "JOB_STATE_COMPLETED", Duration::from_secs(60));
        assert_eq!(nodes_of(&done), ["n2"]);
        assert_eq!(
            done["name"].as_str(),
            Some(format!("{name}@debug").as_str())
        );
        let (start, end) = sacct_times(id);
        assert_eq!(
            (done["start_time"].as_str(), done["end_time"].as_str()),
            (Some(start.as_str()), Some(end.as_str())),
            "{done}"
        );
    }
    assert!(slurm("scancel", &[&victim]).status.success());
    let v = wait_job(f, &victim, "JOB_STATE_CANCELLED", Duration::from_secs(90));
    assert_eq!(nodes_of(&v), ["n1"]);
    for e in job_events(f, &victim) {
        assert_eq!(nodes_of(&e), ["n1"], "{e}");
        assert_eq!(e["name"], "e2e-victim@debug");
    }
    let (start, end) = sacct_times(&victim);
    assert_eq!(
        (v["start_time"].as_str(), v["end_time"].as_str()),
        (Some(start.as_str()), Some(end.as_str()))
    );
    let all = f.cv.accepted("JobConfig");
    assert!(
        all.iter()
            .all(|j| !j["nodes"]["values"].to_string().contains("evil")),
        "a forged node list reached CloudVision"
    );
    // Ending jobs keep their records out of reach too: accounting answers send the same way.
    let out = Command::new(&f.bin)
        .args(["send", "--dry-run", &ids[0]])
        .output()
        .unwrap();
    let bodies = dry_run_bodies(&stdout(&out));
    assert_eq!(bodies.len(), 1, "{}{}", stdout(&out), stderr(&out));
    let b = &bodies[0];
    assert_eq!(b["state"], "JOB_STATE_COMPLETED");
    assert_eq!(nodes_of(b), ["n2"]);
}

/// A resize (`scontrol update NumNodes=`) and a suspend/resume run no hook: reconciliation
/// sends the job's new node set within `ReconcileInterval` (3 s here) + 5 s, marks the
/// suspended job's name while it stays RUNNING on its nodes, and sends its plain name again
/// on resume; its end is Slurm's, on its nodes as Slurm has them.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn resized_and_suspended_jobs_follow_slurm() {
    let (f, _g) = shared();
    let id = sbatch(&["-J", "e2e-resize", "-N2", "--wrap", "sleep 300"]);
    let running = wait_job(f, &id, "JOB_STATE_RUNNING", Duration::from_secs(30));
    assert_eq!(nodes_of(&running).len(), 2, "{running}");
    let current = || f.cv().state()["jobs"][key(&id)].clone();

    // Accounting keys a job's record by (id, submit time) and files the resized part under
    // the resize's second (as_mysql_job.c:385-388@22.05): a resize in the submit's own second
    // folds both into one row. Resize in a later second, so Slurm keeps a row per size.
    let submitted_by = epoch_now();
    while epoch_now() <= submitted_by {
        std::thread::sleep(Duration::from_millis(50));
    }
    let job = format!("JobId={id}");
    assert_exit_0(&slurm("scontrol", &["update", &job, "NumNodes=1"]));
    let now = stdout(&slurm("squeue", &["-h", "-j", &id, "-o", "%N"]))
        .trim()
        .to_string();
    assert!(
        nodes_of(&running).contains(&now),
        "{now:?} not in {running}"
    );
    wait_until(
        "CloudVision to hold the resized job on its one node",
        Duration::from_secs(3 + 5),
        || {
            let c = current();
            c["state"] == "JOB_STATE_RUNNING" && nodes_of(&c) == [now.clone()]
        },
    );

    assert_exit_0(&slurm("scontrol", &["suspend", &id]));
    wait_until(
        "CloudVision to hold the suspended job RUNNING, its name marked",
        Duration::from_secs(3 + 5),
        || current()["name"] == "e2e-resize@debug (suspended)",
    );
    let c = current();
    assert_eq!(c["state"], "JOB_STATE_RUNNING", "{c}");
    assert_eq!(nodes_of(&c), std::slice::from_ref(&now));

    assert_exit_0(&slurm("scontrol", &["resume", &id]));
    wait_until(
        "CloudVision to hold the resumed job under its plain name",
        Duration::from_secs(3 + 5),
        || current()["name"] == "e2e-resize@debug",
    );
    assert_eq!(current()["state"], "JOB_STATE_RUNNING");

    assert_exit_0(&slurm("scancel", &[&id]));
    let done = wait_job(f, &id, "JOB_STATE_CANCELLED", Duration::from_secs(60));
    assert_eq!(done["name"], "e2e-resize@debug");
    assert_eq!(nodes_of(&done), [now]);
    // Accounting has a record per size: RESIZING (the 2-node part), then the final one.
    // The job's start is its first record's, its end its last's (sacct_times).
    let (start, end) = sacct_times(&id);
    let states = stdout(&slurm(
        "sacct",
        &["-j", &id, "-X", "-n", "-P", "-o", "JobIDRaw,State"],
    ));
    assert!(states.starts_with(&format!("{id}|RESIZING\n")), "{states}");
    assert_eq!(
        done["start_time"].as_str(),
        Some(start.as_str()),
        "{states}"
    );
    assert_eq!(done["end_time"].as_str(), Some(end.as_str()), "{states}");
}

/// A preemption with `PreemptMode=SUSPEND,GANG` (for this test only, a partition `urgent` on
/// n4 with PriorityTier 2: with gang scheduling on, the steps of a dynamic node's jobs did
/// not start on 24.11, so the other tests run without it): the job in its way is suspended
/// while the urgent job runs on its node and resumed after. CloudVision holds the suspended job RUNNING under its marked name beside the
/// urgent job (README: no suspended state in CloudVision), its plain name again once resumed,
/// and each job's final record is accounting's.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn preempted_job_is_marked_suspended_while_the_preemptor_runs() {
    let (f, _g) = exclusive();
    let _conf = SlurmConfFor::new(
        SlurmConfFor::current()
            + "PreemptType=preempt/partition_prio\nPreemptMode=SUSPEND,GANG\n\
               PartitionName=urgent Nodes=n4 PriorityTier=2 MaxTime=INFINITE State=UP\n",
        "e2e-preempt",
    );
    // Each job runs until the test opens its gate (2 minutes at most).
    let gate = |tag: &str| PathBuf::from(WORK).join(format!("go-{tag}"));
    let script = |tag: &str| {
        let g = gate(tag);
        let _ = fs::remove_file(&g);
        format!(
            "i=0; while [ ! -e {} ] && [ $i -lt 600 ]; do sleep 0.2; i=$((i+1)); done",
            g.display()
        )
    };
    // All of n4's CPUs, in `partition`.
    let on_n4 = |partition: &str, tag: &str| {
        sbatch(&[
            "-J",
            "e2e-preempt",
            "-p",
            partition,
            "-w",
            "n4",
            "-N1",
            "-n",
            "8",
            "--wrap",
            &script(tag),
        ])
    };
    let victim = on_n4("debug", "victim");
    wait_job(f, &victim, "JOB_STATE_RUNNING", Duration::from_secs(30));
    let urgent = on_n4("urgent", "urgent");
    let state = |id: &str| {
        stdout(&slurm("squeue", &["-h", "-j", id, "-o", "%T"]))
            .trim()
            .to_string()
    };
    wait_until(
        "Slurm to suspend the victim and run the urgent job",
        Duration::from_secs(60),
        || state(&victim) == "SUSPENDED" && state(&urgent) == "RUNNING",
    );
    let current = |id: &str| f.cv().state()["jobs"][key(id)].clone();
    wait_until(
        "CloudVision to hold the victim marked suspended beside the urgent job",
        Duration::from_secs(3 + 5),
        || {
            current(&victim)["name"] == "e2e-preempt@debug (suspended)"
                && current(&urgent)["state"] == "JOB_STATE_RUNNING"
        },
    );
    let v = current(&victim);
    assert_eq!(v["state"], "JOB_STATE_RUNNING", "{v}");
    assert_eq!(nodes_of(&v), ["n4"]);
    assert_eq!(nodes_of(&current(&urgent)), ["n4"]);

    fs::write(gate("urgent"), "").unwrap();
    let done = wait_job(f, &urgent, "JOB_STATE_COMPLETED", Duration::from_secs(30));
    wait_until(
        "Slurm to resume the victim",
        Duration::from_secs(60),
        || state(&victim) == "RUNNING",
    );
    wait_until(
        "CloudVision to hold the resumed victim under its plain name",
        Duration::from_secs(3 + 5),
        || current(&victim)["name"] == "e2e-preempt@debug",
    );
    assert_eq!(current(&victim)["state"], "JOB_STATE_RUNNING");
    fs::write(gate("victim"), "").unwrap();
    let ended = wait_job(f, &victim, "JOB_STATE_COMPLETED", Duration::from_secs(30));
    for (id, rec) in [(&urgent, &done), (&victim, &ended)] {
        let (start, end) = sacct_times(id);
        assert_eq!(rec["start_time"].as_str(), Some(start.as_str()), "{rec}");
        assert_eq!(rec["end_time"].as_str(), Some(end.as_str()), "{rec}");
        assert_eq!(nodes_of(rec), ["n4"]);
    }
    assert_eq!(ended["name"], "e2e-preempt@debug");
    for tag in ["victim", "urgent"] {
        let _ = fs::remove_file(gate(tag));
    }
}

/// A job whose node reboots first (`sbatch --reboot`; the cluster's RebootProgram restarts
/// n4's slurmd with `-b`): its prolog runs at the allocation and reports that start; Slurm
/// resets the start once the node is up. Reconciliation notes the job while it waits (n4 is
/// held down until the service's log says so), then sends its RUNNING anew with Slurm's
/// start; the end carries Slurm's start too, all as sacct has them. Beside the shared tests
/// (their jobs run on n1–n3): a discovery srun that waits for n4 while it reboots runs beside
/// the service's loop, which reconciles meanwhile.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn rebooted_node_job_has_slurms_final_start() {
    let (f, _g) = shared();
    // The service's first discovery has n4 (the job is then the only one there).
    wait_until(
        "the service to discover n4",
        Duration::from_secs(60),
        || !f.cv.state()["nodes"]["n4"].is_null(),
    );
    let hold = slurm_bin_dir().join("../run/reboot-n4.hold");
    let release = Path::new(WORK).join("reboot-release");
    let _ = fs::remove_file(&release);
    fs::write(&hold, "").unwrap();
    let from = log_len(f);
    let id = sbatch(&[
        "-J",
        "e2e-reboot",
        "--reboot",
        "-w",
        "n4",
        "--wrap",
        &format!("while [ ! -e {} ]; do sleep 0.2; done", release.display()),
    ]);
    // Puts n4 back and ends the job, whatever happens below.
    struct Undo(PathBuf, PathBuf, String);
    impl Drop for Undo {
        fn drop(&mut self) {
            let _ = fs::remove_file(&self.0);
            let _ = fs::write(&self.1, "");
            let _ = slurm("scancel", &[&self.2]);
        }
    }
    let _undo = Undo(hold.clone(), release.clone(), id.clone());
    let noted = format!("reconcile: job {} waits for its node(s) to boot", key(&id));
    wait_until(
        "reconciliation to see the job wait for n4 to boot",
        Duration::from_secs(60),
        || log_since(f, from).contains(&noted),
    );
    let events = job_events(f, &id);
    let first = events
        .first()
        .unwrap_or_else(|| panic!("job {id}: no RUNNING from its prolog"));
    assert_eq!(first["state"], "JOB_STATE_RUNNING", "{first}");
    let reported = first["start_time"].as_str().unwrap().to_string();
    // n4 comes up in a later second than the prolog's start: Slurm's start differs from it.
    let later = epoch_now() + 1;
    while epoch_now() < later {
        std::thread::sleep(Duration::from_millis(50));
    }
    fs::remove_file(&hold).unwrap();
    wait_until(
        "the job's RUNNING sent anew with the start Slurm set when n4 was up",
        Duration::from_secs(90),
        || {
            job_events(f, &id).iter().any(|e| {
                e["state"] == "JOB_STATE_RUNNING" && e["start_time"].as_str() > Some(&reported)
            })
        },
    );
    fs::write(&release, "").unwrap();
    let events = wait_final_as_sacct(f, &id, "JOB_STATE_COMPLETED", Duration::from_secs(60));
    let (start, _) = sacct_times(&id);
    assert!(
        reported < start,
        "the prolog reported {reported}, Slurm has {start}"
    );
    let anew: Vec<&Value> = events
        .iter()
        .filter(|e| e["state"] == "JOB_STATE_RUNNING" && e["start_time"] != first["start_time"])
        .collect();
    assert!(
        !anew.is_empty() && anew.iter().all(|e| e["start_time"] == start.as_str()),
        "RUNNING records sent anew {anew:?}, Slurm's start {start}"
    );
    assert_eq!(nodes_of(anew[0]), ["n4"]);
    // Never a RUNNING after the end.
    let states = states_of(&events);
    let end = states.iter().position(|s| s != "JOB_STATE_RUNNING");
    assert!(
        end.is_some_and(|e| states[e..].iter().all(|s| s == "JOB_STATE_COMPLETED")),
        "{states:?}"
    );
}

/// Seconds since the epoch, as Slurm's records count them.
fn epoch_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

//! cvslurm's own machinery under strain: CloudVision down or hanging, a queue past the output
//! bound, the service's metrics file.

use super::*;

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn hanging_cloudvision_delays_no_job_and_loses_nothing() {
    let (f, _g) = exclusive();
    // Baseline: how long from allocation to the job's first command with CloudVision fine.
    let delay = |id: &str, stamp: &Path| -> f64 {
        // The shell creates the file before `date` writes into it: wait for a whole number.
        let read = || -> Option<f64> { fs::read_to_string(stamp).ok()?.trim().parse().ok() };
        wait_until("the job's stamp", Duration::from_secs(60), || {
            read().is_some()
        });
        let started: f64 = read().unwrap();
        let out = stdout(&slurm("scontrol", &["show", "job", "-o", id]));
        let alloc: f64 = out
            .split_whitespace()
            .find_map(|t| t.strip_prefix("StartTime="))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no StartTime in {out}"));
        started - alloc
    };
    let dir = Scratch::new("stamps");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let stamp_ok = dir.path().join("ok");
    let ok = sbatch(&[
        "-J",
        "e2e-baseline",
        "--wrap",
        &format!("date +%s.%N > {}; sleep 1", stamp_ok.display()),
    ]);
    let base = delay(&ok, &stamp_ok);
    wait_job(f, &ok, "JOB_STATE_COMPLETED", Duration::from_secs(60));
    f.cv.set_mode(json!({"mode": "hang"}));
    let stamp = dir.path().join("hang");
    let id = sbatch(&[
        "-J",
        "e2e-hang",
        "--wrap",
        &format!("date +%s.%N > {}; sleep 1", stamp.display()),
    ]);
    let hung = delay(&id, &stamp);
    // Slurm stamps StartTime in whole seconds: allow that plus scheduling jitter.
    assert!(
        hung - base < 2.0 + 1.5,
        "job start delayed {hung:.2} s (baseline {base:.2} s) with a 2 s budget"
    );
    wait_until("the job to end", Duration::from_secs(60), || {
        !stdout(&slurm("squeue", &["-h", "-j", &id])).contains(&id)
    });
    // Accounting gets the end after squeue drops the job (seen on 22.05 in a full run:
    // sacct still said PENDING): its final state, once it has one.
    let acct_state = || {
        stdout(&slurm(
            "sacct",
            &["-j", &id, "-X", "-n", "-P", "--format=State"],
        ))
        .trim()
        .to_string()
    };
    wait_until(
        "accounting's final state of the job",
        Duration::from_secs(60),
        || !matches!(acct_state().as_str(), "" | "PENDING" | "RUNNING"),
    );
    assert_eq!(acct_state(), "COMPLETED", "the hook never fails a job");
    // CloudVision comes back: the service delivers what the hooks kept, ending COMPLETED.
    f.cv.set_mode(json!({"mode": "ok"}));
    let v = wait_job(f, &id, "JOB_STATE_COMPLETED", Duration::from_secs(120));
    check_times(&v);
    // With the service running, the hook only queued (it never waited for CloudVision).
    let log = fs::read_to_string(&f.log_file).unwrap();
    assert!(
        log.contains(&format!("job {}: RUNNING queued for the service", key(&id))),
        "hook log lacks the queued event"
    );
}

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn outage_of_cloudvision_loses_no_event() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "status", "status": 503}));
    let ids: Vec<String> = (0..6)
        .map(|i| {
            sbatch(&[
                "-J",
                &format!("e2e-outage-{i}"),
                "--wrap",
                if i % 2 == 0 { "true" } else { "exit 1" },
            ])
        })
        .collect();
    wait_until("the outage jobs to end", Duration::from_secs(90), || {
        let out = stdout(&slurm("squeue", &["-h", "-o", "%i"]));
        ids.iter().all(|id| !out.lines().any(|l| l.trim() == id))
    });
    // Give the last epilogs time to queue their events.
    std::thread::sleep(Duration::from_secs(2));
    f.cv.set_mode(json!({"mode": "ok"}));
    for (i, id) in ids.iter().enumerate() {
        let want = if i % 2 == 0 {
            "JOB_STATE_COMPLETED"
        } else {
            "JOB_STATE_FAILED"
        };
        wait_job(f, id, want, Duration::from_secs(120));
        let events = job_events(f, id);
        assert_eq!(events.last().unwrap()["state"], want, "{events:?}");
    }
    let _ = &f.state_dir;
}

/// The samples of a metrics file: series (with labels) to value.
fn metric_samples(text: &str) -> std::collections::BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(s, v)| (s.to_string(), v.parse::<f64>().unwrap_or(f64::NAN)))
        .collect()
}

/// The service's metrics file: valid for `promtool check metrics`, rewritten while
/// it runs, its deliveries the ones CloudVision took, its inventory the cluster's nodes, the
/// Slurm version detected.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn the_service_metrics_file_tells_what_cloudvision_received() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let path = Path::new(WORK).join("textfile/cvslurm.prom");
    let read = || fs::read_to_string(&path).unwrap_or_default();
    let delivered = |t: &str| metric_samples(t)["cvslurm_events_delivered_total"];
    let taken = || f.cv.accepted("JobConfig").len() + f.cv.accepted("NodeConfig").len();
    // A baseline both sides agree on: the service idle (an empty outbox) and no delivery
    // between two rewrites of the file (every 2 s: MetricsInterval), so the file's counter already holds
    // every POST the stand-in took. Both are read again until they agree after the job: the
    // file is rewritten on its own schedule, so no single reading of both is at one moment.
    let mut baseline = None;
    wait_until(
        "an idle service and two rewrites of the metrics file without a delivery between",
        Duration::from_secs(120),
        || {
            let m = metric_samples(&read());
            if m.get("cvslurm_outbox_events") != Some(&0.0) {
                return false;
            }
            let t = taken();
            let mtime = || fs::metadata(&path).and_then(|m| m.modified()).ok();
            let first = mtime();
            let deadline = std::time::Instant::now() + Duration::from_secs(40);
            while mtime() == first && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(200));
            }
            let d = delivered(&read());
            if mtime() == first || taken() != t {
                return false;
            }
            baseline = Some((d, t));
            true
        },
    );
    let (before, taken_before) = baseline.unwrap();
    let id = sbatch(&["-J", "e2e-metrics", "--wrap", "true"]);
    wait_job(f, &id, "JOB_STATE_COMPLETED", Duration::from_secs(60));
    // The job's two events (and whatever the service sent meanwhile), counted as taken.
    wait_until(
        "the metrics file to count what the stand-in took",
        Duration::from_secs(60),
        || {
            let d = delivered(&read()) - before;
            d >= 2.0 && d == (taken() - taken_before) as f64
        },
    );
    let text = read();
    let out = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(text.as_bytes())?;
            c.wait_with_output()
        })
        .expect("promtool runs (tests/deps.sh installs it)");
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let m = metric_samples(&text);
    assert!(
        m["cvslurm_events_delivered_total"] - before >= 2.0,
        "the job's two deliveries counted:\n{text}"
    );
    assert_eq!(m["cvslurm_service_running"], 1.0, "{text}");
    assert_eq!(m["cvslurm_events_lost_total"], 0.0, "{text}");
    assert_eq!(m["cvslurm_events_dropped_total"], 0.0, "{text}");
    assert_eq!(
        m["cvslurm_inventory_nodes{state=\"known\"}"], NODES as f64,
        "{text}"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    for t in [
        "cvslurm_last_delivery_timestamp_seconds",
        "cvslurm_last_inventory_timestamp_seconds",
        "cvslurm_last_reconcile_timestamp_seconds",
    ] {
        assert!(now - m[t] < 60.0, "{t} is old: {text}");
    }
    let (major, minor) = slurm_version();
    let version = format!("slurm_version=\"{major}.{minor:02}.");
    assert!(
        m.keys()
            .any(|k| k.starts_with("cvslurm_build_info{") && k.contains(&version)),
        "{version}: {text}"
    );
    // `cvslurm status --json` shows the same counters.
    let out = Command::new(&f.bin)
        .args(["status", "--json", "--offline"])
        .output()
        .unwrap();
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        st["metrics"]["counters"]["events_delivered"].as_f64()
            >= Some(m["cvslurm_events_delivered_total"]),
        "{st}"
    );
}

/// Held jobs that fill slurmctld's queue in the output-bound test (cancelled at its end).
const BULK: &str = "e2e-bulk-held";

/// A queue past the output bound: `SlurmOutputMaxMiB=1` for the service and 500
/// held jobs, whose full JSON listing (3 KB a job on 22.05, 7-8 KB on 24.11 and 26.05) passes
/// 1 MiB, as about 10,000 jobs pass the default 64 MiB. From Slurm 23.02 the service asks job by job and (24.11+) lists states
/// only: every job reaches CloudVision as RUNNING then its final state with sacct's times, and
/// no listing is ever too big. On 22.05 every question about jobs is the one full listing: the
/// bound reached is a warning at the default level naming what to do, `cvslurm status` shows
/// it, the ends are judged from exit codes and corrected from accounting, and nothing is lost.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn queue_past_the_output_bound_loses_no_event() {
    const HELD: usize = 500;
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let saved = fs::read_to_string(&f.conf).unwrap();
    /// Cancels the held jobs, puts cloudvision.conf back and restarts the service on it,
    /// however the test ends.
    struct PutBack(&'static Fixture, String);
    impl Drop for PutBack {
        fn drop(&mut self) {
            let _ = slurm("scancel", &["--name", BULK]);
            let _ = fs::write(&self.0.conf, &self.1);
            if let Err(e) = restart_service(self.0) {
                eprintln!("[e2e] the service could not be restarted on its own config: {e}");
            }
        }
    }
    let _put_back = PutBack(f, saved.clone());
    let from = log_len(f);
    fs::write(&f.conf, format!("{saved}SlurmOutputMaxMiB=1\n")).unwrap();
    restart_service(f).unwrap();
    // The queue: one sbatch per job, 8 at a time.
    let t = Instant::now();
    let submit = format!(
        "seq {HELD} | xargs -P 8 -I{{}} {} --hold -J {BULK} -o /dev/null -e /dev/null -x n4 --wrap true >/dev/null",
        slurm_bin_dir().join("sbatch").display()
    );
    let out = Command::new("sh")
        .arg("-c")
        .arg(&submit)
        .current_dir("/tmp")
        .output()
        .unwrap();
    assert!(out.status.success(), "{submit}: {}", stderr(&out));
    let held = stdout(&slurm("squeue", &["-h", "--name", BULK, "-o", "%i"]))
        .lines()
        .count();
    assert_eq!(held, HELD, "held jobs in slurmctld");
    let listing = slurm("squeue", &["--all", "--json"]);
    assert!(
        listing.stdout.len() > 1 << 20,
        "the full listing of {HELD} jobs is {} bytes, not past the 1 MiB bound: the test would prove nothing",
        listing.stdout.len()
    );
    eprintln!(
        "[e2e] {HELD} held jobs in {:.1} s; the full listing is {} bytes",
        t.elapsed().as_secs_f64(),
        listing.stdout.len()
    );
    let ok = sbatch(&["-J", "e2e-bound-ok", "--wrap", "sleep 1"]);
    let bad = sbatch(&["-J", "e2e-bound-fail", "--wrap", "sleep 1; exit 3"]);
    let cancel = sbatch(&["-J", "e2e-bound-cancel", "--wrap", "sleep 300"]);
    wait_job(f, &cancel, "JOB_STATE_RUNNING", Duration::from_secs(60));
    assert!(slurm("scancel", &[&cancel]).status.success());
    let jobs = [
        (&ok, "JOB_STATE_COMPLETED"),
        (&bad, "JOB_STATE_FAILED"),
        (&cancel, "JOB_STATE_CANCELLED"),
    ];
    let by_id = slurm_version() >= (23, 2);
    for (id, state) in jobs {
        let events = wait_final_as_sacct(f, id, state, Duration::from_secs(60));
        let states = states_of(&events);
        // Slurm may run a job twice on a loaded machine (a batch launch that fails is
        // requeued under the same id): each run has its RUNNING, and the last run's end
        // comes last.
        let (runs, rows) = sacct_runs(id);
        if runs > 1 {
            let running = states.iter().filter(|s| *s == "JOB_STATE_RUNNING").count();
            assert!(
                states.first().map(String::as_str) == Some("JOB_STATE_RUNNING")
                    && states.last().map(String::as_str) == Some(state)
                    && states.len() >= 2
                    && states[states.len() - 2] == "JOB_STATE_RUNNING"
                    && running == runs,
                "job {id}, {runs} runs in accounting ({rows}): {states:?}\n{}",
                lines_about_job(&log_since(f, from), id)
            );
        } else if by_id {
            // Delivery is at least once: a RUNNING sent again whole (an answer lost, a pass
            // that looked before the hook's record was in) changes nothing in CloudVision.
            // Said here, so that a run that shows it tells why.
            let mut once = events.clone();
            once.dedup();
            if once.len() != events.len() {
                eprintln!(
                    "[e2e] job {id}: the same record accepted twice in a row: {events:?}\n{}",
                    lines_about_job(&log_since(f, from), id)
                );
            }
            assert_eq!(
                states_of(&once),
                ["JOB_STATE_RUNNING", state],
                "job {id}, one run in accounting ({rows}): {events:?}\n{}",
                lines_about_job(&log_since(f, from), id)
            );
        } else {
            // 22.05: the end judged from exit codes (a cancel can look like a success there),
            // then, where Slurm's record differs, the correction from accounting.
            let log = log_since(f, from);
            if states.len() == 2 {
                assert_eq!(states, ["JOB_STATE_RUNNING", state], "job {id}");
            } else {
                assert_eq!(states.len(), 3, "job {id}: {states:?}");
                assert_eq!(
                    (states[0].as_str(), states[2].as_str()),
                    ("JOB_STATE_RUNNING", state),
                    "job {id}: {states:?}"
                );
                assert_ne!(states[1], "JOB_STATE_RUNNING", "job {id}: {states:?}");
                assert!(
                    log.contains(&format!("reconcile: job {} ended ", key(id)))
                        && log.contains("correction(s) queued from accounting while slurmctld's listing is past the output bound"),
                    "job {id}: no correction from accounting logged:\n{log}"
                );
            }
        }
    }
    let log = log_since(f, from);
    if by_id {
        assert!(
            !log.contains("printed more than"),
            "a listing was too big on Slurm {:?}:\n{log}",
            slurm_version()
        );
    } else {
        let warning = log
            .lines()
            .find(|l| {
                l.contains(
                    "printed more than 1 MiB: slurmctld holds more jobs than one listing may carry",
                )
            })
            .unwrap_or_else(|| panic!("no warning that the listing is too big:\n{log}"));
        assert!(warning.contains(" WARN "), "not a warning: {warning}");
        for what_to_do in [
            "lower MinJobAge",
            "raise SlurmOutputMaxMiB",
            "upgrade Slurm",
        ] {
            assert!(
                warning.contains(what_to_do),
                "{what_to_do:?} not in {warning}"
            );
        }
        // Recorded by the next reconciliation pass (every 3 s here), whoever met the bound.
        let status_text = || {
            let out = Command::new(&f.bin)
                .args(["status", "--offline"])
                .output()
                .unwrap();
            stdout(&out)
        };
        let shows = |text: &str| {
            text.lines()
                .any(|l| l.starts_with("Slurm warning:") && l.contains("printed more than 1 MiB"))
        };
        wait_until("status to show the bound", Duration::from_secs(30), || {
            shows(&status_text())
        });
        let text = status_text();
        assert!(shows(&text), "{text}");
        let out = Command::new(&f.bin)
            .args(["status", "--json", "--offline"])
            .output()
            .unwrap();
        let st: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(
            st["last_slurm_warning"]
                .as_str()
                .is_some_and(|w| w.contains("printed more than 1 MiB")),
            "{st}"
        );
    }
    // Nothing lost: every event delivered (the outbox empties), none rejected.
    wait_until("the outbox to empty", Duration::from_secs(30), || {
        let out = Command::new(&f.bin)
            .args(["status", "--json", "--offline"])
            .output()
            .unwrap();
        let st: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        st["outbox_depth"] == 0
    });
    assert!(!log_since(f, from).contains("rejected, moved to rejected/"));
    eprintln!("[e2e] output bound: {:.1} s", t.elapsed().as_secs_f64());
}

//! End-to-end tests on a Slurm HA pair: `tests/cluster/cluster.sh up --controllers
//! 2 2`, ctl1 (primary) and ctl2 (backup) each a "host" of its own (network, UTS and mount
//! namespaces: its own /opt, /var/spool, /run, /var/log), StateSaveLocation shared,
//! SlurmctldTimeout 10 s, accounting on; two nodes. cvslurm is installed on both controllers
//! before slurm.conf names it (`CVSLURM_CTL_OPT`: the binary, the hook's link, StateDir and
//! the log in each host's own /opt/cvslurm), `cloudvision.conf` is the one both read
//! (/etc/slurm), and each controller runs its own service (`cvslurm inventory --monitor`
//! started inside that host's namespaces). The stand-in listens on the bridge (10.99.0.1),
//! where both controllers reach it.
//!
//! Three scenarios, one after the other on the same pair (each starts with ctl1 in control
//! and both services up, and leaves it so), with a stream of jobs (an array of short jobs and
//! a long one before the change, more jobs while the backup is in control, more after the
//! return):
//! 1. `scontrol takeover` to the backup, then back (the primary's slurmctld started again);
//!    the ends of an array are settled from accounting, several in one question;
//! 2. kill -9 of the primary's slurmctld and of its cvslurm service, CloudVision cut off from
//!    the primary until its service restarted (its slurmctld still down) and the long job
//!    ended under the backup: the primary's queued RUNNING never reaches CloudVision; the
//!    primary comes back; then its service alone restarts, leading: no catch-up;
//! 3. the primary "powered off" (every process of its namespaces killed) while its service
//!    held events it had not sent (CloudVision answering 503 to that host only, so its
//!    hooks' events stay in its own StateDir, which no other host sees; a stopped service is
//!    not enough: its hooks see it stale and send themselves); the backup takes over and must catch up
//!    the ends from Slurm before the primary returns; then it returns and fails back, and its
//!    old events are checked against Slurm before they go out.
//!
//! For every job (slurmctld's record, kept with MinJobAge 600; accounting's too where it has
//! the job: on 26.05 it loses some of the jobs run under the backup after a kill): CloudVision
//! holds its final state with Slurm's start and end; no RUNNING was accepted after an end;
//! its first end came at most SlurmctldTimeout + 2 × ReconcileInterval + 30 s after Slurm's
//! end; the long jobs (running across the change) were RUNNING first. No NodeConfig is deleted. The backup's slurmctld started with
//! cvslurm's hooks configured (fatal on 23.02+ were the hook missing on its disk).
//!
//! Needs root; run by `tests/run-all.sh` once per Slurm version; by hand:
//! `SLURM=24.11 PATH=/var/tmp/cvslurm-cluster/bin:$PATH CVSLURM_E2E_BIN=… cargo test --release
//! --test e2e_pair -- --ignored --test-threads=1`.

#[path = "common/cluster.rs"]
mod cluster;
mod common;
use cluster::*;
use common::*;
use cvslurm::internals::state::layout::SERVICE_STATUS;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

const WORK: &str = "/var/tmp/cvslurm-e2e-pair";
/// Where cvslurm lives on each controller (its own /opt).
const OPT: &str = "/opt/cvslurm";
const SLURMCTLD_TIMEOUT: u64 = 10;
const RECONCILE_INTERVAL: u64 = 3;
/// The bound on an event's lateness a test allows.
const LATE_AT_MOST: f64 = (SLURMCTLD_TIMEOUT + 2 * RECONCILE_INTERVAL + 30) as f64;

struct Pair {
    cv: Standin,
    services: Mutex<BTreeMap<u8, Child>>,
}

static PAIR: OnceLock<Pair> = OnceLock::new();
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A controller's own file (host path) under its /opt/cvslurm.
fn on_host(k: u8, rel: &str) -> PathBuf {
    Path::new(CLUSTER_DIR).join(format!("hosts/ctl{k}/opt/cvslurm/{rel}"))
}

fn log_of(k: u8) -> String {
    fs::read_to_string(on_host(k, "log/cvjob.log")).unwrap_or_default()
}

fn logs() -> String {
    format!(
        "--- ctl1's cvjob.log (tail)\n{}\n--- ctl2's cvjob.log (tail)\n{}",
        tail(&log_of(1), 40),
        tail(&log_of(2), 40)
    )
}

fn tail(s: &str, n: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(n)..].join("\n")
}

fn pair() -> &'static Pair {
    PAIR.get_or_init(|| {
        keep_inherited_fds_to_ourselves();
        let work = PathBuf::from(WORK);
        fresh_work_dir(&work, "KILL");
        // What the admin installs on each controller: /opt/cvslurm with the binary, the
        // hook's link, StateDir and the log directory (SlurmUser's).
        let stage = work.join("opt");
        let dir = stage.join("cvslurm");
        fs::create_dir_all(dir.join("state")).unwrap();
        fs::create_dir_all(dir.join("log")).unwrap();
        let src = std::env::var_os("CVSLURM_E2E_BIN").map(PathBuf::from).unwrap_or_else(bin);
        fs::copy(&src, dir.join("cvslurm")).unwrap();
        fs::set_permissions(dir.join("cvslurm"), fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("cvslurm", dir.join("cvslurm-hook")).unwrap();
        fs::set_permissions(dir.join("state"), fs::Permissions::from_mode(0o700)).unwrap();
        chown_slurm(&dir.join("state"));
        chown_slurm(&dir.join("log"));
        // The stand-in on every address: the controllers reach it through the bridge.
        let cv = Standin::start_with(&["--host", "0.0.0.0"]);
        fs::write(work.join("standin.pid"), format!("{}\n", cv.pid())).unwrap();
        let ca = work.join("ca.pem");
        fs::copy(cv.ca(), &ca).unwrap();
        fs::set_permissions(&ca, fs::Permissions::from_mode(0o644)).unwrap();
        let token = work.join("cloudvision.token");
        fs::write(&token, format!("{TOKEN}\n")).unwrap();
        fs::set_permissions(&token, fs::Permissions::from_mode(0o600)).unwrap();
        chown_slurm(&token);
        // The workers have no /opt/cvslurm: discovery sends the binary along (srun --bcast)
        // into a directory only SlurmUser can write, on every worker.
        let bcast = work.join("bcast");
        fs::create_dir_all(&bcast).unwrap();
        fs::set_permissions(&bcast, fs::Permissions::from_mode(0o700)).unwrap();
        chown_slurm(&bcast);
        fs::create_dir_all("/etc/slurm").unwrap();
        fs::write(
            "/etc/slurm/cloudvision.conf",
            format!(
                "# cvslurm end-to-end tests, a pair of controllers\nApiServer=10.99.0.1:{}\nApiTokenFile={}\n\
                 CaFile={}\nStateDir={OPT}/state\nLogFile={OPT}/log/cvjob.log\nLogLevel=debug\nHookTimeout=2\n\
                 PollInterval=2\nDiscoveryTimeout=30\nInterfacePhysicalOnly=no\nReconcileInterval={RECONCILE_INTERVAL}\n\
                 SlurmBinDir={}\nDiscoveryBcast=yes\nDiscoveryBcastDir={}\n",
                cv.port,
                token.display(),
                ca.display(),
                slurm_bin_dir().display(),
                bcast.display(),
            ),
        )
        .unwrap();
        let t = Instant::now();
        cluster_sh(
            &["up", "--controllers", "2", "2"],
            &[
                ("CVSLURM_HOOK", &format!("{OPT}/cvslurm-hook")),
                ("WITH_DBD", "1"),
                ("CVSLURM_CTL_OPT", stage.to_str().unwrap()),
                // ended jobs stay in slurmctld for the checks (accounting can lose some)
                ("MIN_JOB_AGE", "600"),
                ("CLUSTER_NAME", CLUSTER),
                // backfill every 5 s: jobs submitted just after a takeover wait for the next
                // scheduling pass (Slurm's default: 30 s)
                ("BF_INTERVAL", "5"),
            ],
        );
        eprintln!("[e2e] pair of controllers up in {:.1} s; stand-in at 10.99.0.1:{}", t.elapsed().as_secs_f64(), cv.port);
        let p = Pair { cv, services: Mutex::new(BTreeMap::new()) };
        start_service(&p, 1);
        start_service(&p, 2);
        p
    })
}

/// One scenario at a time, from ctl1 in control with both services up.
fn scenario() -> (&'static Pair, MutexGuard<'static, ()>) {
    let g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let p = pair();
    // After a scenario that failed midway: the primary back, in control.
    if in_control() != Some(1) || !slurm("scontrol", &["ping"]).status.success() {
        let _ = Command::new(repo().join("tests/cluster/cluster.sh"))
            .args(["start-slurmctld", "ctl1"])
            .output();
    }
    wait_in_control(1, Duration::from_secs(90));
    // a scenario that failed midway may have left CloudVision cut off from ctl1
    cloudvision_reachable_from(p, 1, true);
    for k in [1, 2] {
        let alive = p
            .services
            .lock()
            .unwrap()
            .get_mut(&k)
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)));
        if !alive {
            start_service(p, k);
        }
    }
    // Each service has decided since ctl1 is in control, ctl1's to lead and ctl2's to stand
    // by: a scenario starts with one writer (ctl2's may still be in a discovery that began
    // while it led: found in CI on 22.05, where it then caught up the next scenario's jobs).
    let since = epoch_now() as i64;
    wait_until(
        "ctl1's service leads, ctl2's stands by",
        Duration::from_secs(90),
        || {
            let decided = |k: u8| -> Option<bool> {
                let v: Value = serde_json::from_slice(
                    &fs::read(on_host(k, &format!("state/{SERVICE_STATUS}"))).ok()?,
                )
                .ok()?;
                (v["leader_at"].as_i64()? >= since).then(|| v["leader"].as_bool())?
            };
            decided(1) == Some(true) && decided(2) == Some(false)
        },
    );
    (p, g)
}

/// Starts controller `k`'s service inside its namespaces, as systemd there would, and waits
/// until its wake-up socket answers.
fn start_service(p: &Pair, k: u8) {
    let from = log_of(k).len();
    let child = Command::new(repo().join("tests/cluster/cluster.sh"))
        .args([
            "exec",
            &format!("ctl{k}"),
            "env",
            "-i",
            "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
        ])
        .arg(format!("{OPT}/cvslurm"))
        .args(["inventory", "--monitor"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    fs::write(
        Path::new(WORK).join(format!("service-ctl{k}.pid")),
        format!("{}\n", child.id()),
    )
    .unwrap();
    let socket = on_host(k, "state/wake.sock");
    let mut child = child;
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        // The socket of a live service (a dead one's file stays: ask the service too).
        let answers = std::os::unix::net::UnixDatagram::unbound()
            .and_then(|s| s.connect(&socket))
            .is_ok();
        if answers
            && log_of(k)
                .get(from..)
                .is_some_and(|l| l.contains("service starting"))
        {
            break;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("ctl{k}'s service exited ({st})\n{}", logs());
        }
        assert!(
            Instant::now() < until,
            "ctl{k}'s service did not listen in 30 s\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    p.services.lock().unwrap().insert(k, child);
}

/// kill -9 of controller `k`'s service.
fn kill_service(p: &Pair, k: u8) {
    if let Some(mut c) = p.services.lock().unwrap().remove(&k) {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Cuts CloudVision off from controller `k` (`reachable` false: the stand-in answers 503 to
/// requests from that controller's address only), or gives it back.
fn cloudvision_reachable_from(p: &Pair, k: u8, reachable: bool) {
    if reachable {
        p.cv.set_mode(serde_json::json!({"mode": "ok"}));
    } else {
        p.cv.set_mode(serde_json::json!({
            "mode": "status",
            "status": 503,
            "from": format!("10.99.0.{}", 1 + k),
        }));
    }
}

/// The primary back in control, the quick way an admin may take: the backup's slurmctld
/// stopped (it saves its state and exits), the primary's started (`start` names the
/// cluster.sh command: `start-slurmctld`, or `power-on` after a power-off; it reads that state
/// and takes control at once), the backup's started again, as standby. The primary started
/// beside a backup in control instead (`takeover_to_the_backup_and_back`) waits 30 s on 24.11
/// and 26.05 (not on 22.05): the backup answers its REQUEST_CONTROL after CONTROL_TIMEOUT - 1
/// and saves its state only then ("REQUEST_CONTROL reply but backup not completely done
/// relinquishing control"); measured 34 s, against 5 s this way.
fn primary_back_quickly(start: &str) {
    cl(&["stop-slurmctld", "ctl2"]);
    cl(&[start, "ctl1"]);
    wait_in_control(1, Duration::from_secs(90));
    cl(&["start-slurmctld", "ctl2"]);
}

/// The controller the heartbeat names (1 or 2), if any.
fn in_control() -> Option<u8> {
    let out = Command::new(repo().join("tests/cluster/cluster.sh"))
        .arg("in-control")
        .output()
        .ok()?;
    let s = stdout(&out);
    match s.split_whitespace().next() {
        Some("ctl1") => Some(1),
        Some("ctl2") => Some(2),
        _ => None,
    }
}

/// Waits until ctl`k` is in control and answers (squeue).
fn wait_in_control(k: u8, within: Duration) {
    wait_until(&format!("ctl{k} in control"), within, || {
        in_control() == Some(k) && slurm("squeue", &["-h", "-o", "%i"]).status.success()
    });
}

fn cl(args: &[&str]) {
    let t = Instant::now();
    cluster_sh(args, &[]);
    eprintln!(
        "[e2e] cluster.sh {} ({:.1} s)",
        args.join(" "),
        t.elapsed().as_secs_f64()
    );
}

/// Jobs submitted for a scenario: ids as sbatch printed them (array or single).
#[derive(Default)]
struct Stream {
    submitted: Vec<String>,
    long: Vec<String>,
    /// How many jobs: array tasks count one each.
    jobs: usize,
}

impl Stream {
    /// An array of `n` short jobs and, with `long`, one job of `long` seconds.
    fn submit(&mut self, tag: &str, n: u32, long: Option<u32>) {
        let name = format!("--job-name=pair-{tag}");
        let arr = format!("--array=1-{n}");
        // sbatch may have to wait for a controller that is taking over
        let id = submit(&[&name, &arr, "-n1", "--wrap", "sleep 2"]);
        self.submitted.push(id);
        self.jobs += n as usize;
        if let Some(s) = long {
            let id = submit(&[&name, "-n1", "--wrap", &format!("sleep {s}")]);
            self.submitted.push(id.clone());
            self.long.push(id);
            self.jobs += 1;
        }
    }

    /// The stream's first array alone (submitted with `tasks` tasks), as a stream of its own.
    fn first_array(&self, tasks: usize) -> Stream {
        Stream {
            submitted: vec![self.submitted[0].clone()],
            long: Vec::new(),
            jobs: tasks,
        }
    }

    /// Every job (array tasks by their own id) with slurmctld's final state, start and end
    /// (epoch seconds), once all have ended: `squeue -t all` (the pair runs with MinJobAge
    /// 600, so slurmctld still holds the scenario's ended jobs). Slurm's record of them, as
    /// cvslurm reports it; accounting is compared where it has the job (see [`in_sacct`]).
    fn ended(&self, within: Duration) -> Vec<Row> {
        let mut rows = Vec::new();
        let until = Instant::now() + within;
        let ids = self.submitted.join(",");
        let mut done = || {
            let out = slurm(
                "squeue",
                &["-h", "-t", "all", "-j", &ids, "-o", "%A|%T|%S|%e"],
            );
            rows = parse_rows(&stdout(&out));
            rows.len() >= self.jobs
                && rows.iter().all(|(_, st, s, e)| {
                    !matches!(
                        st.as_str(),
                        "RUNNING" | "PENDING" | "REQUEUED" | "COMPLETING" | "CONFIGURING"
                    ) && *s > 0
                        && *e > 0
                })
        };
        while !done() {
            if Instant::now() > until {
                panic!(
                    "the jobs {:?} ({} with the array tasks) did not all end in {within:?}; slurmctld has: {rows:?}\n{}",
                    self.submitted,
                    self.jobs,
                    logs()
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        rows
    }

    /// What accounting holds of the jobs now (final states only), by job id.
    fn in_sacct(&self) -> BTreeMap<String, Row> {
        let out = slurm(
            "sacct",
            &[
                "-X",
                "-n",
                "-P",
                "-j",
                &self.submitted.join(","),
                "--format=JobIDRaw,State,Start,End",
            ],
        );
        parse_rows(&stdout(&out))
            .into_iter()
            .filter(|(_, st, s, e)| {
                !matches!(
                    st.as_str(),
                    "RUNNING" | "PENDING" | "REQUEUED" | "COMPLETING"
                ) && *s > 0
                    && *e > 0
            })
            .map(|r| (r.0.clone(), r))
            .collect()
    }
}

/// A job: id, state, start and end (epoch seconds).
type Row = (String, String, i64, i64);

/// `ID|STATE|START|END` lines (times as epoch seconds: `SLURM_TIME_FORMAT=%s`).
fn parse_rows(text: &str) -> Vec<Row> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.trim().split('|').collect();
            (f.len() == 4).then(|| {
                (
                    f[0].to_string(),
                    f[1].to_string(),
                    f[2].parse().unwrap_or(0),
                    f[3].parse().unwrap_or(0),
                )
            })
        })
        .collect()
}

/// Waits until none of `ids` is pending and slurmctld has saved its job state since (the last
/// of `ids` is a job still running, which gets a comment to make that save happen): what a
/// controller that dies now leaves to the other. (Saved state lags by up to 5 s: measured, a
/// kill -9 within it loses the jobs submitted meanwhile, their ids given again to new jobs,
/// and a job that started meanwhile runs again; Slurm's own limit, see
/// tests/cluster/FACTS-controllers.md.)
fn wait_state_saved(ids: &[String]) {
    wait_until(
        "the scenario's jobs to start",
        Duration::from_secs(60),
        || {
            let out = slurm(
                "squeue",
                &["-h", "-t", "PD,CF", "-o", "%i", "-j", &ids.join(",")],
            );
            out.status.success() && stdout(&out).trim().is_empty()
        },
    );
    // A change of our own (a comment on the long job, the last id), which slurmctld saves
    // with every change before it: once job_state is written after it, the state is whole.
    let state = Path::new(CLUSTER_DIR).join("state/job_state");
    let after = std::time::SystemTime::now();
    let long = ids.last().expect("a job");
    let out = slurm(
        "scontrol",
        &["update", &format!("JobId={long}"), "Comment=state-saved"],
    );
    assert!(out.status.success(), "scontrol update: {}", stderr(&out));
    wait_until(
        "slurmctld to save its job state",
        Duration::from_secs(30),
        || {
            fs::metadata(&state)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t > after)
        },
    );
}

/// Submits a batch job (from /tmp, output discarded) and returns its id.
fn submit(args: &[&str]) -> String {
    let out = slurm_cmd("sbatch")
        .args(["--parsable", "-o", "/dev/null", "-e", "/dev/null"])
        .args(args)
        .current_dir("/tmp")
        .output()
        .unwrap();
    assert!(out.status.success(), "sbatch {args:?}: {}", stderr(&out));
    stdout(&out).trim().split(';').next().unwrap().to_string()
}

fn iso(t: i64) -> String {
    cvslurm::internals::timefmt::format_epoch(t).unwrap()
}

/// Does CloudVision's record `j` hold Slurm's `row`: its final state, start and end?
fn holds(j: &Value, (_, state, start, end): &Row) -> bool {
    let word = state.split_whitespace().next().unwrap_or("");
    j["state"] == format!("JOB_STATE_{word}").as_str()
        && j["start_time"] == iso(*start).as_str()
        && j["end_time"] == iso(*end).as_str()
}

/// The scenario's checks on what CloudVision got, waiting (within the lateness bound past the
/// last end) until every job is there in its final state with sacct's times.
fn check_delivered(p: &Pair, stream: &Stream, what: &str) {
    check_delivered_since(p, stream, what, 0.0)
}

fn epoch_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// [`check_delivered`], lateness counted from `held_until` (epoch seconds) for a job that
/// ended before it: the moment the events held back on purpose could go out again.
fn check_delivered_since(p: &Pair, stream: &Stream, what: &str, held_until: f64) {
    let rows = stream.ended(Duration::from_secs(150));
    let last_end = rows.iter().map(|r| r.3).max().unwrap();
    let deadline = (last_end as f64).max(held_until) + LATE_AT_MOST + 5.0;
    let all_there = |jobs: &Value| rows.iter().all(|r| holds(&jobs[key(&r.0)], r));
    loop {
        let jobs = p.cv.state()["jobs"].clone();
        if all_there(&jobs) {
            break;
        }
        if epoch_now() > deadline {
            let missing: Vec<String> = rows
                .iter()
                .filter(|r| !holds(&jobs[key(&r.0)], r))
                .map(|(id, st, s, e)| {
                    format!(
                        "{id} (Slurm: {st} {} {}): CloudVision has {}",
                        iso(*s),
                        iso(*e),
                        jobs[key(id)]
                    )
                })
                .collect();
            panic!("{what}: {} job(s) not in CloudVision as Slurm has them {LATE_AT_MOST} s after the last end:\n{}\n{}", missing.len(), missing.join("\n"), logs());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // Every accepted JobConfig, in order, with the time the stand-in got it.
    let requests = p.cv.requests();
    for (id, st, _, e) in &rows {
        let k = key(id);
        let events: Vec<(&str, f64)> = requests
            .iter()
            .filter(|r| {
                r["method"] == "POST"
                    && r["status"] == 200
                    && r["path"].as_str().unwrap_or("").ends_with("JobConfig")
                    && r["body"]["key"]["id"] == k.as_str()
            })
            .map(|r| {
                (
                    r["body"]["state"].as_str().unwrap_or(""),
                    r["time"].as_f64().unwrap_or(0.0),
                )
            })
            .collect();
        let first_end = events
            .iter()
            .position(|(s, _)| *s != "JOB_STATE_RUNNING" && !s.is_empty());
        let Some(first_end) = first_end else {
            panic!("{what}: job {id}: no end accepted: {events:?}");
        };
        assert!(
            !events[first_end..]
                .iter()
                .any(|(s, _)| *s == "JOB_STATE_RUNNING"),
            "{what}: job {id} ({st}): RUNNING accepted after its end: {events:?}\n{}",
            logs()
        );
        let late = events[first_end].1 - (*e as f64).max(held_until);
        assert!(
            late <= LATE_AT_MOST,
            "{what}: job {id}: its first end came {late:.1} s after sacct's end (at most {LATE_AT_MOST} s): {events:?}\n{}",
            logs()
        );
        if stream.long.contains(id) {
            assert!(
                first_end > 0,
                "{what}: long job {id}: no RUNNING before its end: {events:?}\n{}",
                logs()
            );
        }
    }
    // Accounting agrees where it has the job (26.05 loses or renames some records of jobs
    // that ran under the backup after a kill: measured, the tasks of an array missing and
    // one record named "allocation"; Slurm's, said here, not hidden).
    let jobs = p.cv.state()["jobs"].clone();
    let acct = stream.in_sacct();
    let mut not_in_sacct = Vec::new();
    for (id, _, _, _) in &rows {
        match acct.get(id) {
            Some(row @ (_, st, s, e)) => {
                let j = &jobs[key(id)];
                assert!(
                    holds(j, row),
                    "{what}: job {id}: sacct has {st} {} {}, CloudVision {j}",
                    iso(*s),
                    iso(*e)
                );
            }
            None => not_in_sacct.push(id.clone()),
        }
    }
    if !not_in_sacct.is_empty() {
        eprintln!(
            "[e2e] {what}: accounting has no final record of job(s) {} (Slurm {}.{:02}); checked against slurmctld's record only",
            not_in_sacct.join(","),
            slurm_version().0,
            slurm_version().1
        );
    }
    let deletes: Vec<&Value> = requests
        .iter()
        .filter(|r| r["method"] == "DELETE")
        .collect();
    assert!(
        deletes.is_empty(),
        "{what}: NodeConfig deleted: {deletes:?}"
    );
    eprintln!(
        "[e2e] {what}: {} jobs in CloudVision as Slurm has them; no RUNNING after an end; latest first end {:.1} s after Slurm's{}",
        rows.len(),
        rows.iter()
            .filter_map(|(id, _, _, e)| {
                requests
                    .iter()
                    .find(|r| r["status"] == 200 && r["body"]["key"]["id"] == key(id).as_str() && r["body"]["state"] != "JOB_STATE_RUNNING" && r["path"].as_str().unwrap_or("").ends_with("JobConfig"))
                    .map(|r| r["time"].as_f64().unwrap_or(0.0) - (*e as f64).max(held_until))
            })
            .fold(f64::MIN, f64::max),
        if held_until > 0.0 { " (or after the power-off, for the ends held on the powered-off host)" } else { "" }
    );
}

/// Both controllers' nodes inventoried before a scenario's NodeConfig check means anything.
fn nodes_sent(p: &Pair) {
    wait_until(
        "the leader's inventory of n1 and n2",
        Duration::from_secs(60),
        || {
            let nodes = p.cv.state()["nodes"].clone();
            ["n1", "n2"]
                .iter()
                .all(|n| nodes.get(*n).is_some() || nodes.get(format!("{n}@{CLUSTER}")).is_some())
        },
    );
}

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn takeover_to_the_backup_and_back() {
    let (p, _g) = scenario();
    nodes_sent(p);
    let mut s = Stream::default();
    s.submit("takeover-a", 6, Some(20));
    std::thread::sleep(Duration::from_secs(3));
    cl(&["takeover"]);
    wait_in_control(2, Duration::from_secs(30));
    s.submit("takeover-b", 4, None);
    // Every version: the primary exits at a takeover; started again, it takes control back.
    cl(&["start-slurmctld", "ctl1"]);
    wait_in_control(1, Duration::from_secs(90));
    s.submit("takeover-c", 3, None);
    check_delivered(p, &s, "takeover and back");
    // The ends were settled from accounting, several in one question (not one scontrol each).
    let batched = [log_of(1), log_of(2)].iter().any(|l| {
        l.lines().any(|line| {
            line.split("settle: ").nth(1).is_some_and(|rest| {
                let n = |w: &str| -> usize {
                    rest.split(w)
                        .next()
                        .and_then(|h| h.split_whitespace().last())
                        .and_then(|x| x.parse().ok())
                        .unwrap_or(0)
                };
                n(" with a final record in accounting") >= 2
            })
        })
    });
    assert!(
        batched,
        "no batch of ends settled from accounting in one question\n{}",
        logs()
    );
    assert!(
        log_of(2).contains("this host now leads"),
        "ctl2 led meanwhile\n{}",
        logs()
    );
    // 25.11 and later: slurmctld's /readyz asked beside the heartbeat.
    if slurm_version() >= (25, 11) {
        assert!(
            log_of(2).contains("answers /readyz: in control"),
            "ctl2's slurmctld asked /readyz\n{}",
            logs()
        );
    }
}

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn kill_9_of_the_primarys_slurmctld_and_service() {
    let (p, _g) = scenario();
    nodes_sent(p);
    // CloudVision cut off from ctl1 from before the stream until after its service restarted
    // and the long job ended under ctl2: ctl1's RUNNINGs stay queued in its StateDir.
    cloudvision_reachable_from(p, 1, false);
    let mut s = Stream::default();
    s.submit("kill-a", 6, Some(30));
    // The array ends first and Slurm has saved that before the kill: a controller killed
    // within its state-save lag after jobs ended makes the backup recover them as running,
    // and Slurm keeps them so (measured on 26.05: the tasks RUNNING 150 s after they ended).
    s.first_array(6).ended(Duration::from_secs(60));
    wait_state_saved(&s.submitted);
    kill_service(p, 1);
    cl(&["kill-slurmctld", "ctl1"]);
    // systemd restarts the service; its slurmctld stays down.
    start_service(p, 1);
    wait_in_control(2, Duration::from_secs(60));
    s.submit("kill-b", 4, None);
    // The long job ends under ctl2, which delivers its end.
    let long = s.long[0].clone();
    wait_until(
        "the long job's end from ctl2",
        Duration::from_secs(90),
        || {
            p.cv.stored_job(&key(&long))
                .is_some_and(|j| j["state"] != "JOB_STATE_RUNNING")
        },
    );
    // CloudVision answers ctl1 again: its service (not in control) delivers what it may,
    // never its queued RUNNING.
    let from = log_of(1).len();
    cloudvision_reachable_from(p, 1, true);
    wait_until(
        "ctl1's restarted service delivers again",
        Duration::from_secs(120),
        || {
            log_of(1)
                .get(from..)
                .is_some_and(|l| l.contains("outbox: delivered"))
        },
    );
    let j = p.cv.stored_job(&key(&long)).unwrap();
    assert_ne!(
        j["state"],
        "JOB_STATE_RUNNING",
        "the long job's RUNNING from ctl1 after ctl2 sent its end: {j}\n{}",
        logs()
    );
    primary_back_quickly("start-slurmctld");
    s.submit("kill-c", 3, None);
    check_delivered(p, &s, "kill -9 of slurmctld and service");
    // A restart of the leader's service is no change of controller: no catch-up.
    let from = log_of(1).len();
    kill_service(p, 1);
    start_service(p, 1);
    wait_until(
        "ctl1's restarted service leads, without a catch-up",
        Duration::from_secs(60),
        || {
            log_of(1)
                .get(from..)
                .is_some_and(|l| l.contains("catch-up: not run") || l.contains("catch-up: job"))
        },
    );
    let since = log_of(1)[from..].to_string();
    assert!(
        since.contains("catch-up: not run") && !since.contains("catch-up: job"),
        "a restart of the leader's service caught up ends:\n{since}"
    );
}

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn power_off_of_the_primary_and_its_return() {
    let (p, _g) = scenario();
    nodes_sent(p);
    // CloudVision unreachable from ctl1 alone: what its hooks queue stays in its StateDir.
    cloudvision_reachable_from(p, 1, false);
    let mut s = Stream::default();
    s.submit("power-a", 4, Some(60));
    // The short jobs end under ctl1; their ends wait in ctl1's StateDir.
    let early = s.first_array(4);
    let rows = early.ended(Duration::from_secs(60));
    // Held in ctl1's StateDir: not in CloudVision. (22.05 may run a hook of the first jobs
    // after a failback on the backup still, which sends it: said, and the others suffice.)
    let reached: Vec<&String> = rows
        .iter()
        .map(|r| &r.0)
        .filter(|id| p.cv.stored_job(&key(id)).is_some())
        .collect();
    assert!(
        reached.len() < rows.len(),
        "every job of {:?} reached CloudVision while ctl1 could not: nothing held to catch up\n{}",
        early.submitted,
        logs()
    );
    if !reached.is_empty() {
        eprintln!("[e2e] power-off: job(s) {reached:?} reached CloudVision before the power-off (not through ctl1)");
    }
    wait_state_saved(&s.submitted);
    cl(&["power-off", "ctl1"]);
    let off = epoch_now();
    kill_service(p, 1); // its process is gone with the power
    wait_in_control(2, Duration::from_secs(60));
    s.submit("power-b", 4, None);
    // Before ctl1 returns: the new leader caught up the ends ctl1 could not send, and the
    // long job's RUNNING (reconciliation: running, no hook reported it here).
    check_delivered_since(
        p,
        &early,
        "power-off: ends caught up by the new leader before the primary returns",
        off,
    );
    let long = s.long[0].clone();
    wait_until(
        "the long job's RUNNING from the new leader",
        Duration::from_secs(LATE_AT_MOST as u64),
        || {
            p.cv.stored_job(&key(&long))
                .is_some_and(|j| j["state"] == "JOB_STATE_RUNNING")
        },
    );
    assert!(
        log_of(2).contains("catch-up: job"),
        "ctl2 caught up\n{}",
        logs()
    );
    // It returns with its network whole.
    cloudvision_reachable_from(p, 1, true);
    primary_back_quickly("power-on");
    start_service(p, 1);
    s.submit("power-c", 3, None);
    check_delivered_since(p, &s, "power-off and return", off);
    let l1 = log_of(1);
    assert!(
        l1.contains("queued before this host's role changed"),
        "ctl1 checked its old events\n{}",
        logs()
    );
}

//! The real Slurm cluster of the end-to-end tests (`tests/cluster/cluster.sh`), shared by
//! `tests/e2e/` and `tests/e2e_gpu.rs` (each includes it as `mod cluster` beside
//! `mod common`): bringing it up or reusing a running one (`CVSLURM_E2E_REUSE=1`), the
//! version's Slurm commands, submitting and watching jobs, and what CloudVision got of them.
#![allow(dead_code)]

use crate::common::{stderr, stdout, Standin};
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The cluster's name (`CLUSTER_NAME`, and the `location` cvslurm reports).
pub const CLUSTER: &str = "cvtest";
/// tests/cluster/cluster.sh's work dir (its default, as in cluster.sh).
pub const CLUSTER_DIR: &str = "/var/tmp/cvslurm-cluster";

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `tests/cluster/cluster.sh ARGS` with `envs` added; panics with its output when it fails.
pub fn cluster_sh(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let asked = Instant::now();
    let out = Command::new(repo().join("tests/cluster/cluster.sh"))
        .args(args)
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cluster.sh {args:?} failed:\n{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    note_wait(&format!("cluster.sh {}", args.join(" ")), asked);
    out
}

/// `CVSLURM_E2E_REUSE=1`: a developer's loop. A running cluster brought up with the same
/// version and settings is used as it is (`cluster.sh up --reuse`) and left up at the end.
pub fn reuse() -> bool {
    std::env::var_os("CVSLURM_E2E_REUSE").is_some_and(|v| v == "1")
}

/// Brings the cluster `CLUSTER` up with `nodes` static nodes and `envs` (cluster.sh's
/// variables); with `CVSLURM_E2E_REUSE=1`, keeps a running one of that shape instead.
pub fn up(nodes: usize, envs: &[(&str, &str)]) {
    let n = nodes.to_string();
    let mut args = vec!["up"];
    if reuse() {
        args.push("--reuse");
    }
    args.push(&n);
    let mut envs = envs.to_vec();
    envs.push(("CLUSTER_NAME", CLUSTER));
    let t = Instant::now();
    let out = cluster_sh(&args, &envs);
    // What it did: why a running cluster was not reused, and its last line.
    let said = stdout(&out);
    let lines: Vec<&str> = said
        .lines()
        .filter(|l| l.starts_with("[cluster] --reuse"))
        .chain(said.lines().last())
        .map(|l| l.trim_start_matches("[cluster] "))
        .collect();
    eprintln!(
        "[e2e] cluster {args:?} in {:.1} s: {}",
        t.elapsed().as_secs_f64(),
        lines.join("; ")
    );
}

/// Takes the cluster down when dropped (the test passed or not), unless
/// `CVSLURM_E2E_REUSE=1`: then it stays up for the next run.
pub struct Down;

impl Drop for Down {
    fn drop(&mut self) {
        if !reuse() {
            let _ = Command::new(repo().join("tests/cluster/cluster.sh"))
                .arg("down")
                .output();
        }
    }
}

/// Runs a cluster.sh command when dropped: puts a node back even when a test fails midway.
pub struct Restore(pub &'static [&'static str]);

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("tests/cluster/cluster.sh"))
            .args(self.0)
            .output();
    }
}

/// Cancels a job when dropped (`scancel`): a test that fails midway leaves no job holding the
/// nodes the next test needs.
pub struct Cancel(pub String);

impl Drop for Cancel {
    fn drop(&mut self) {
        let _ = slurm("scancel", &[&self.0]);
    }
}

/// A node set DOWN after its slurmd was stopped, as slurmctld sets it after SlurmdTimeout
/// without an answer, and kept DOWN ([`NodeDown::keep`]).
///
/// From 23.11 slurmctld records a node's answer to an RPC up to 2 s after it came (agent.c,
/// `_agent_nodes_update`), and with ReturnToService=2 such an answer returns a DOWN node to
/// service (node_mgr.c, `_node_did_resp`): an answer given before the slurmd stopped (a job's
/// launch or end on that node) can undo the DOWN. Measured on 24.11: 8 of 8 DOWNs set right
/// after the launch of a job there were undone; on 26.05 a node the service's discovery had
/// just used came back idle (its slurmd dead) and stayed so until slurmctld's ping found it,
/// 24 s later. Every answer from before the stop is recorded in that one pass, so a DOWN set
/// once more after it stays.
pub struct NodeDown {
    node: String,
    reason: String,
    log_from: u64,
    again: bool,
}

impl NodeDown {
    /// `scontrol update NodeName=NODE State=DOWN Reason=REASON` (its slurmd stopped before).
    pub fn set(node: &str, reason: &str) -> NodeDown {
        let log_from = fs::metadata(Path::new(CLUSTER_DIR).join("log/slurmctld.log"))
            .map(|m| m.len())
            .unwrap_or(0);
        let d = NodeDown {
            node: node.to_string(),
            reason: reason.to_string(),
            log_from,
            again: false,
        };
        d.down();
        d
    }

    fn down(&self) {
        let out = slurm(
            "scontrol",
            &[
                "update",
                &format!("NodeName={}", self.node),
                "State=DOWN",
                &format!("Reason={}", self.reason),
            ],
        );
        assert!(out.status.success(), "{}", stderr(&out));
    }

    /// Whether slurmctld returned the node to service on an answer from before the stop, since
    /// the DOWN (its log says so).
    pub fn returned(&self) -> bool {
        let log = fs::read(Path::new(CLUSTER_DIR).join("log/slurmctld.log")).unwrap_or_default();
        String::from_utf8_lossy(log.get(self.log_from as usize..).unwrap_or_default()).contains(
            &format!("node_did_resp: node {} returned to service", self.node),
        )
    }

    /// Sets the node DOWN once more if slurmctld returned it to service since (once; call it
    /// while waiting for what the DOWN should bring about).
    pub fn keep(&mut self) {
        if !self.again && self.returned() {
            self.again = true;
            say(&format!(
                "slurmctld returned {} to service on an answer from before its slurmd \
                 stopped (ReturnToService=2): set DOWN again",
                self.node
            ));
            self.down();
        }
    }
}

pub fn chown_slurm(p: &Path) {
    let st = Command::new("chown")
        .args(["-R", "slurm:slurm"])
        .arg(p)
        .status()
        .unwrap();
    assert!(st.success());
}

/// Marks every descriptor this process inherited (beyond stdio) close-on-exec. Run inside
/// `flock LOCK cargo test ...`, the lock's descriptor would otherwise pass to the stand-in, the
/// service and the cluster's daemons, which outlive the test process and would hold the lock
/// for good.
pub fn keep_inherited_fds_to_ourselves() {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    use std::os::fd::BorrowedFd;
    let fds: Vec<i32> = fs::read_dir("/proc/self/fd")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .filter(|&fd| fd > 2)
                .collect()
        })
        .unwrap_or_default();
    for fd in fds {
        // SAFETY: only the descriptor's flags change; one that closed meanwhile just fails.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let _ = fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
    }
}

/// Stops what an earlier run of a test binary left running (the processes whose pids are in
/// `WORK/*.pid`, with `kill -SIGNAL`) and makes `work` again, empty, mode 0755. A pid is
/// signalled only while its process is still ours (its command line names cvslurm or the
/// stand-in): pids wrap at `pid_max` (32768 here), so a pid file from an earlier run may name
/// any process by now, the test runner's own included.
pub fn fresh_work_dir(work: &Path, signal: &str) {
    use std::os::unix::fs::PermissionsExt;
    for entry in fs::read_dir(work).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("pid") {
            continue;
        }
        let Some(pid) = fs::read_to_string(&path)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            .filter(|p| *p > 1)
        else {
            continue;
        };
        if still_ours(pid) {
            let _ = Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(pid.to_string())
                .status();
        }
    }
    let _ = fs::remove_dir_all(work);
    fs::create_dir_all(work).unwrap();
    fs::set_permissions(work, fs::Permissions::from_mode(0o755)).unwrap();
}

/// Is process `pid` one the tests start and record (a cvslurm binary or the stand-in)?
fn still_ours(pid: u32) -> bool {
    fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
        let c = String::from_utf8_lossy(&c);
        c.contains("cvslurm") || c.contains("standin")
    })
}

/// The cluster's Slurm commands (the version under test), from the host and from inside the
/// cluster's root filesystem alike.
pub fn slurm_bin_dir() -> PathBuf {
    let dir = std::env::var_os("CVSLURM_CLUSTER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(CLUSTER_DIR));
    dir.join("bin")
}

/// A Slurm command of the version under test, printing times as epoch seconds.
pub fn slurm_cmd(name: &str) -> Command {
    let mut c = Command::new(slurm_bin_dir().join(name));
    c.env("SLURM_TIME_FORMAT", "%s");
    c
}

pub fn slurm(cmd: &str, args: &[&str]) -> Output {
    slurm_cmd(cmd).args(args).output().unwrap()
}

/// Submits a batch job (from /tmp, output discarded) and returns its id. Unless `args` choose
/// nodes (`-w`, `--nodelist`, `-x`), the job is kept off n4, which the e2e tests that take the
/// cluster exclusively stop and start.
pub fn sbatch(args: &[&str]) -> String {
    let mut a = vec!["--parsable", "-o", "/dev/null", "-e", "/dev/null"];
    if !args
        .iter()
        .any(|x| x.starts_with("-w") || x.starts_with("--nodelist") || x.starts_with("-x"))
    {
        a.extend(["-x", "n4"]);
    }
    a.extend(args);
    let out = slurm_cmd("sbatch")
        .args(&a)
        .current_dir("/tmp")
        .output()
        .unwrap();
    assert!(out.status.success(), "sbatch {a:?}: {}", stderr(&out));
    stdout(&out).trim().split(';').next().unwrap().to_string()
}

/// Waits (at most `within`, polling every 250 ms) until `ok` holds; panics naming `what`.
pub fn wait_until(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let asked = Instant::now();
    let until = asked + within;
    while !ok() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
    note_wait(what, asked);
}

/// Prints, past the test harness's capture, a wait of 5 s or more (`[e2e] TEST: 12.3 s
/// waiting for WHAT`): the log of every run then says where the suite's time goes.
pub fn note_wait(what: &str, asked: Instant) {
    use std::io::Write;
    let took = asked.elapsed();
    if took >= Duration::from_secs(5) {
        let name = std::thread::current().name().unwrap_or("?").to_string();
        let _ = writeln!(
            std::io::stderr(),
            "[e2e] {name}: {:.1} s waiting for {what}",
            took.as_secs_f64()
        );
    }
}

/// Prints a line past the test harness's capture (`[e2e] TEST: TEXT`): what a passing test
/// met that the run's log should still say.
pub fn say(text: &str) {
    use std::io::Write;
    let name = std::thread::current().name().unwrap_or("?").to_string();
    let _ = writeln!(std::io::stderr(), "[e2e] {name}: {text}");
}

/// A node's state from the full listing: `sinfo -n NODE` can report a stale state (seen on
/// 24.11: `allocated` for a node that the full listing, and the inventory, saw `mixed`).
pub fn node_state(name: &str) -> String {
    stdout(&slurm("sinfo", &["--all", "-h", "-N", "-o", "%N %T"]))
        .lines()
        .find_map(|l| {
            let (n, st) = l.split_once(' ')?;
            (n == name).then(|| st.trim().to_string())
        })
        .unwrap_or_default()
}

/// The Slurm release the cluster runs, as (major, minor), from `scontrol --version`.
pub fn slurm_version() -> (u32, u32) {
    let text = stdout(&slurm("scontrol", &["--version"]));
    let v = text.split_whitespace().last().unwrap_or("").to_string();
    let mut it = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// Slurm's own Start and End of an ended job's last run (sacct, epoch seconds), once
/// accounting has the final state. Accounting keeps a row per run (`-D`: an earlier run's row
/// ends `REQUEUED`, `NODE_FAIL`, …) and, within a run, a row per size (a resize ends a row
/// `RESIZING` and opens the next): the run's start is its first row's, its end the last row's.
pub fn sacct_times(id: &str) -> (String, String) {
    let mut rows: Vec<Vec<String>> = Vec::new();
    wait_until(
        &format!("sacct to record job {id}'s end"),
        Duration::from_secs(60),
        || {
            let all = sacct_rows(id, "JobIDRaw,State,Start,End");
            // A row that ends other than `RESIZING` ends a run (`REQUEUED`, `NODE_FAIL`, …).
            let run_from = all[..all.len().saturating_sub(1)]
                .iter()
                .rposition(|f| f[1] != "RESIZING")
                .map_or(0, |i| i + 1);
            rows = all[run_from..].to_vec();
            rows.last().is_some_and(|f| {
                !matches!(
                    f[1].as_str(),
                    "RUNNING" | "PENDING" | "REQUEUED" | "RESIZING"
                ) && f[3] != "Unknown"
            })
        },
    );
    let iso = |s: &str| cvslurm::internals::timefmt::format_epoch(s.parse().unwrap()).unwrap();
    (iso(&rows[0][2]), iso(&rows[rows.len() - 1][3]))
}

/// How many times Slurm ran job `id` (accounting's rows, `sacct -D`: a row that ends other than
/// `RESIZING` before the last ends a run, as a requeue after a launch failure or a node
/// failure does), with the rows themselves for a failure's message.
pub fn sacct_runs(id: &str) -> (usize, String) {
    let rows = sacct_rows(id, "JobIDRaw,State,Start,End,Restarts");
    let ended_runs = rows[..rows.len().saturating_sub(1)]
        .iter()
        .filter(|r| r[1] != "RESIZING")
        .count();
    let text: Vec<String> = rows.iter().map(|r| r.join("|")).collect();
    (ended_runs + 1, text.join("\n"))
}

/// Accounting's rows of job `id`, one per run and size (`sacct -j ID -X -D`), each the fields
/// `format` names (only fields no user controls: they are split at `|`).
fn sacct_rows(id: &str, format: &str) -> Vec<Vec<String>> {
    let format = format!("--format={format}");
    let fields = format.split(',').count();
    let out = slurm("sacct", &["-j", id, "-X", "-D", "-n", "-P", &format]);
    stdout(&out)
        .lines()
        .filter(|l| l.starts_with(&format!("{id}|")))
        .map(|l| l.split('|').map(str::to_string).collect::<Vec<_>>())
        .filter(|f| f.len() == fields)
        .collect()
}

/// A job's key in CloudVision (`ID@CLUSTER`).
pub fn key(id: &str) -> String {
    format!("{id}@{CLUSTER}")
}

/// What a test watches: the stand-in CloudVision and cvslurm's log file.
pub trait Watch {
    fn cv(&self) -> &Standin;
    fn log_file(&self) -> &Path;
}

/// Every JobConfig CloudVision accepted for this job, in order.
pub fn job_events(w: &impl Watch, id: &str) -> Vec<Value> {
    w.cv()
        .accepted("JobConfig")
        .into_iter()
        .filter(|j| j["key"]["id"] == key(id))
        .collect()
}

/// The lines of the service log `log` that name job `id`'s key (for a failure's message).
pub fn lines_about_job(log: &str, id: &str) -> String {
    let key = key(id);
    log.lines()
        .filter(|l| l.contains(&key))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until CloudVision holds the job in `state` (its current record), then returns it.
pub fn wait_job(w: &impl Watch, id: &str, state: &str, within: Duration) -> Value {
    let asked = Instant::now();
    let until = asked + within;
    loop {
        let cur = w.cv().state()["jobs"][key(id)].clone();
        if cur["state"] == state {
            note_wait(&format!("job {id} {state}"), asked);
            return cur;
        }
        if Instant::now() > until {
            let log = fs::read_to_string(w.log_file()).unwrap_or_default();
            panic!(
                "job {id}: CloudVision has {cur} after {within:?}, wanted {state}\nlog:\n{}",
                lines_about_job(&log, id)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// When `node`'s slurmd started (`SlurmdStartTime` of `scontrol show node -o`, epoch seconds;
/// the node's own clock, which is the host's here); `None` before it registered.
pub fn slurmd_start(node: &str) -> Option<i64> {
    let out = slurm("scontrol", &["show", "node", "-o", node]);
    stdout(&out)
        .lines()
        .filter(|l| l.starts_with(&format!("NodeName={node} ")))
        .flat_map(|l| l.split_whitespace())
        .find_map(|w| w.strip_prefix("SlurmdStartTime="))
        .and_then(|t| t.parse().ok())
}

/// Waits until the clock is in a later second than every one of `nodes`' slurmd started:
/// a discover record taken from then on is fresh (cvslurm takes a record from the second its
/// slurmd started in for one from before a restart).
pub fn wait_past_slurmd_start(nodes: &[&str]) {
    wait_until(
        "a second past the slurmd starts",
        Duration::from_secs(10),
        || {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64;
            nodes
                .iter()
                .all(|n| slurmd_start(n).is_some_and(|s| now > s))
        },
    );
}

/// Restarts `node`'s slurmd (`cluster.sh stop-slurmd`, `start-slurmd`) and waits until the new
/// one has registered (its `SlurmdStartTime` moved on) and written its pid file, so that a
/// test can enter its namespaces. Returns the new start.
pub fn restart_slurmd(node: &str) -> i64 {
    let pid_file = format!("{CLUSTER_DIR}/run/slurmd-{node}.pid");
    let old_pid = fs::read_to_string(&pid_file).unwrap_or_default();
    // A start in the same second would not show as a new one.
    wait_past_slurmd_start(&[node]);
    let old = slurmd_start(node).unwrap_or(0);
    cluster_sh(&["stop-slurmd", node], &[]);
    cluster_sh(&["start-slurmd", node], &[]);
    let mut new = 0;
    wait_until(
        &format!("{node}'s slurmd to register again"),
        Duration::from_secs(60),
        || {
            new = slurmd_start(node).unwrap_or(0);
            let pid = fs::read_to_string(&pid_file).unwrap_or_default();
            new > old && pid != old_pid && Path::new(&format!("/proc/{}", pid.trim())).exists()
        },
    );
    new
}

/// Prints, uncaptured, how long the running test held the cluster and how long it waited for
/// it (`[e2e] NAME: 12.3 s (waited 4.5 s)`), so that every run's log says where the time goes.
pub fn print_held(since: Instant, waited: Duration) {
    use std::io::Write;
    let name = std::thread::current().name().unwrap_or("?").to_string();
    let _ = writeln!(
        std::io::stderr(),
        "[e2e] {name}: {:.1} s (waited {:.1} s)",
        since.elapsed().as_secs_f64(),
        waited.as_secs_f64()
    );
}

//! End-to-end tests on a real Slurm cluster (slurmctld, slurmd ×4 in network namespaces,
//! slurmdbd + MariaDB), with cvslurm installed as PrologSlurmctld/EpilogSlurmctld through its
//! argv[0] symlink and `cvslurm inventory --monitor` running as the service.
//!
//! Needs root. Run by `tests/run-all.sh` (which builds the static binary and passes it in
//! CVSLURM_E2E_BIN) once per Slurm version; by hand:
//! `SLURM=24.11 cargo test --release --test e2e -- --ignored --test-threads=4`
//! (`SLURM` is passed on to tests/cluster/cluster.sh: 22.05, the default, is the host's Slurm;
//! 24.11 and 26.05 run chrooted in a Debian root filesystem). Every Slurm command, the tests'
//! and cvslurm's own (`SlurmBinDir`), is the version's: the cluster's `bin` directory.
//! Tests that disturb nodes or CloudVision take the cluster exclusively.
//!
//! The tests are in one module per topic: `jobs` (job shapes and hostile names), `ends` (how a
//! job's end reaches CloudVision), `faults` (CloudVision down or hanging, the output bound,
//! metrics), `inventory` (nodes, discovery, the monitor, workers). This file holds the fixture
//! and the helpers they share.
//!
//! A faster loop while developing: `CVSLURM_E2E_REUSE=1` keeps the cluster up at the end and,
//! on the next run, uses a running cluster of the same version and shape as it is
//! (`cluster.sh up --reuse`: its jobs cancelled, each slurmd restarted) instead of building it
//! again; the stand-in, the hook's files and the service are always new. Without it (CI), every
//! run brings a fresh cluster up. Done for the day: `tests/cluster/cluster.sh down`, then kill
//! the stand-in and service whose pids are in /var/tmp/cvslurm-e2e/*.pid.

#[path = "../common/cluster.rs"]
mod cluster;
#[path = "../common/mod.rs"]
mod common;
mod ends;
mod faults;
mod inventory;
mod jobs;
use cluster::*;
use common::*;
use cvslurm::internals::state::layout;
use serde_json::{json, Value};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

const WORK: &str = "/var/tmp/cvslurm-e2e";
const NODES: usize = 4;

struct Fixture {
    cv: Standin,
    bin: PathBuf,
    conf: PathBuf,
    state_dir: PathBuf,
    log_file: PathBuf,
    service: Mutex<Child>,
    /// A job past its time limit (`-t 1` on n1), submitted when the cluster comes up: Slurm
    /// ends it 60-90 s later (a one-minute limit, checked every 30 s), while the other tests
    /// run; `time_limit_ends_failed` looks at its end.
    time_limit_job: String,
}

impl Watch for Fixture {
    fn cv(&self) -> &Standin {
        &self.cv
    }
    fn log_file(&self) -> &Path {
        &self.log_file
    }
}

static FIXTURE: OnceLock<Fixture> = OnceLock::new();
static CLUSTER_LOCK: RwLock<()> = RwLock::new(());

/// Brings the cluster, the stand-in, the hook and the service up once for all tests.
fn fixture() -> &'static Fixture {
    FIXTURE.get_or_init(|| {
        keep_inherited_fds_to_ourselves();
        let work = PathBuf::from(WORK);
        fresh_work_dir(&work, "TERM");
        // The shipped static binary, installed the way an admin would, with the hook symlink.
        let src = std::env::var_os("CVSLURM_E2E_BIN").map(PathBuf::from).unwrap_or_else(bin);
        let bin = work.join("cvslurm");
        fs::copy(&src, &bin).unwrap();
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("cvslurm", work.join("cvslurm-hook")).unwrap();
        // slurmd's HealthCheckProgram: each node publishes its own record at slurmd's start.
        std::os::unix::fs::symlink("cvslurm", work.join("cvslurm-publish")).unwrap();
        let cv = Standin::start();
        fs::write(work.join("standin.pid"), format!("{}\n", cv.pid())).unwrap();
        let ca = work.join("ca.pem");
        fs::copy(cv.ca(), &ca).unwrap();
        fs::set_permissions(&ca, fs::Permissions::from_mode(0o644)).unwrap();
        let token = work.join("cloudvision.token");
        fs::write(&token, format!("{TOKEN}\n")).unwrap();
        fs::set_permissions(&token, fs::Permissions::from_mode(0o600)).unwrap();
        let state_dir = work.join("state");
        let log_dir = work.join("log");
        fs::create_dir_all(&state_dir).unwrap();
        fs::create_dir_all(&log_dir).unwrap();
        for p in [&token, &state_dir, &log_dir] {
            chown_slurm(p);
        }
        let log_file = log_dir.join("cvjob.log");
        // node_exporter's textfile directory, SlurmUser's to write (README: Monitoring).
        let textfile = work.join("textfile");
        fs::create_dir_all(&textfile).unwrap();
        chown_slurm(&textfile);
        let conf = PathBuf::from("/etc/slurm/cloudvision.conf");
        fs::create_dir_all("/etc/slurm").unwrap();
        fs::write(
            &conf,
            format!(
                "# cvslurm end-to-end tests\nApiServer={}\nApiTokenFile={}\nCaFile={}\nStateDir={}\nLogFile={}\n\
                 LogLevel=debug\nHookTimeout=2\nPollInterval=2\nDiscoveryTimeout=30\nInterfacePhysicalOnly=no\n\
                 ReconcileInterval=3\nSlurmBinDir={}\nMetricsFile={}\nMetricsInterval=2\n",
                cv.server(),
                token.display(),
                ca.display(),
                state_dir.display(),
                log_file.display(),
                slurm_bin_dir().display(),
                textfile.join("cvslurm.prom").display()
            ),
        )
        .unwrap();
        let hook = work.join("cvslurm-hook");
        let t0 = Instant::now();
        // Backfill every 5 s (Slurm's default is 30): heterogeneous jobs start only at a
        // backfill pass, and a test holds the cluster while it waits for one.
        up(
            NODES,
            &[
                ("CVSLURM_HOOK", hook.to_str().unwrap()),
                ("HEALTH_CHECK", work.join("cvslurm-publish").to_str().unwrap()),
                ("WITH_DBD", "1"),
                ("BF_INTERVAL", "5"),
            ],
        );
        let service = start_service(&bin).unwrap();
        let time_limit_job = sbatch(&[
            "-J",
            "e2e-timeout",
            "-t",
            "1",
            "-w",
            "n1",
            "--wrap",
            "sleep 600",
        ]);
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!(
                "[e2e] cluster {CLUSTER} up with {NODES} nodes in {:.1} s; stand-in at {}\n",
                t0.elapsed().as_secs_f64(),
                cv.server()
            ),
        );
        Fixture {
            cv,
            bin,
            conf,
            state_dir,
            log_file,
            service: Mutex::new(service),
            time_limit_job,
        }
    })
}

/// Starts the service, as systemd would run it, and records its pid in `WORK/service.pid`.
fn start_service(bin: &Path) -> Result<Child, String> {
    let service = Command::new(bin)
        .args(["inventory", "--monitor"])
        .env_remove("CVSLURM_CONF")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the service: {e}"))?;
    fs::write(
        Path::new(WORK).join("service.pid"),
        format!("{}\n", service.id()),
    )
    .map_err(|e| format!("cannot record the service's pid: {e}"))?;
    Ok(service)
}

/// Stops the service with SIGTERM (as systemd does) and starts it again, so that it reads
/// cloudvision.conf again; returns once its wake-up socket answers (hooks hand it their events
/// from then on). An error, not a panic: it also runs when a test that changed the config is
/// unwinding.
fn restart_service(f: &Fixture) -> Result<(), String> {
    use nix::sys::signal::{kill, Signal};
    let mut service = f.service.lock().unwrap_or_else(|e| e.into_inner());
    let pid = nix::unistd::Pid::from_raw(service.id() as i32);
    let _ = kill(pid, Signal::SIGCONT); // a test may have stopped it
    let _ = kill(pid, Signal::SIGTERM);
    let until = Instant::now() + Duration::from_secs(20);
    while service.try_wait().map_err(|e| e.to_string())?.is_none() {
        if Instant::now() > until {
            let _ = service.kill();
            let _ = service.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    *service = start_service(&f.bin)?;
    let socket = f.state_dir.join(layout::WAKE_SOCKET);
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let answers = std::os::unix::net::UnixDatagram::unbound()
            .and_then(|s| s.connect(&socket))
            .is_ok();
        if answers {
            return Ok(());
        }
        if let Ok(Some(st)) = service.try_wait() {
            return Err(format!(
                "the restarted service exited ({st}); see {}",
                f.log_file.display()
            ));
        }
        if Instant::now() > until {
            return Err(format!(
                "the restarted service did not listen on {} in 30 s",
                socket.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the service's log holds past byte `from` (lines written since then).
fn log_since(f: &Fixture, from: u64) -> String {
    let bytes = fs::read(&f.log_file).unwrap_or_default();
    String::from_utf8_lossy(bytes.get(from as usize..).unwrap_or_default()).into_owned()
}

/// The service log's length now, for [`log_since`].
fn log_len(f: &Fixture) -> u64 {
    fs::metadata(&f.log_file).map(|m| m.len()).unwrap_or(0)
}

/// Shared use of the cluster (jobs on n1–n3, stand-in left alone).
fn shared() -> (&'static Fixture, Timed<RwLockReadGuard<'static, ()>>) {
    let f = fixture();
    let asked = Instant::now();
    let g = CLUSTER_LOCK.read().unwrap_or_else(|e| e.into_inner());
    (f, Timed::new(g, asked))
}

/// A test's hold on the cluster; on drop it prints, uncaptured, how long the test held it
/// and how long it waited for it (`[e2e] NAME: 12.3 s (waited 4.5 s)`), so that every run's
/// log says where the suite's time goes.
struct Timed<G> {
    _guard: G,
    since: Instant,
    waited: Duration,
}

impl<G> Timed<G> {
    fn new(guard: G, asked: Instant) -> Self {
        let since = Instant::now();
        Timed {
            _guard: guard,
            since,
            waited: since - asked,
        }
    }
}

impl<G> Drop for Timed<G> {
    fn drop(&mut self) {
        print_held(self.since, self.waited);
    }
}

/// Exclusive use: may stop nodes or make CloudVision misbehave. It starts on a whole
/// cluster: a node that an earlier test stopped and put back (its `Restore` ran when that
/// test failed midway) is waited for until slurmctld has it responding again, so one failure
/// does not fail the tests after it.
fn exclusive() -> (&'static Fixture, Timed<RwLockWriteGuard<'static, ()>>) {
    let f = fixture();
    let asked = Instant::now();
    let g = Timed::new(
        CLUSTER_LOCK.write().unwrap_or_else(|e| e.into_inner()),
        asked,
    );
    let whole = || {
        (1..=NODES).all(|i| {
            let st = node_state(&format!("n{i}"));
            !st.is_empty()
                && !st.ends_with('*')
                && !["down", "drain", "fail", "unknown", "not_responding"]
                    .iter()
                    .any(|bad| st.starts_with(bad))
        })
    };
    wait_until("every node responding", Duration::from_secs(90), whole);
    (f, g)
}

fn nodes_of(v: &Value) -> Vec<String> {
    v["nodes"]["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect()
}

fn check_times(v: &Value) {
    let s = v["start_time"].as_str().unwrap();
    let e = v["end_time"].as_str().unwrap();
    assert!(
        s.ends_with('Z') && e.ends_with('Z') && s.len() == 20 && e.len() == 20,
        "{v}"
    );
    assert!(s <= e, "start after end: {v}");
}

/// The JobConfig bodies `cvslurm send --dry-run` printed, each after its request line
/// (`POST https://<ApiServer>/api/resources/computejob/v1/JobConfig`).
fn dry_run_bodies(text: &str) -> Vec<Value> {
    let mut bodies = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        if line.starts_with("POST ") {
            assert!(
                line.starts_with("POST https://")
                    && line.ends_with("/api/resources/computejob/v1/JobConfig"),
                "{line}"
            );
            if !cur.trim().is_empty() {
                bodies.push(serde_json::from_str(&cur).unwrap_or_else(|e| panic!("{e}: {cur}")));
            }
            cur.clear();
        } else {
            cur.push_str(line);
            cur.push('\n');
        }
    }
    if !cur.trim().is_empty() {
        bodies.push(serde_json::from_str(&cur).unwrap_or_else(|e| panic!("{e}: {cur}")));
    }
    bodies
}

/// Waits until CloudVision holds job `id` in `state` with sacct's own start and end (at most
/// `within`), then returns every event it accepted for the job, in order.
fn wait_final_as_sacct(f: &Fixture, id: &str, state: &str, within: Duration) -> Vec<Value> {
    wait_job(f, id, state, within);
    let (start, end) = sacct_times(id);
    let times = |v: &Value| {
        (
            v["start_time"].as_str().map(String::from),
            v["end_time"].as_str().map(String::from),
        )
    };
    let want = (Some(start), Some(end));
    let asked = Instant::now();
    let until = asked + within;
    loop {
        let cur = f.cv.state()["jobs"][key(id)].clone();
        if cur["state"] == state && times(&cur) == want {
            note_wait(&format!("job {id}: sacct's times"), asked);
            break;
        }
        assert!(
            Instant::now() < until,
            "job {id}: CloudVision has {cur}, wanted {state} with sacct's times {want:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    job_events(f, id)
}

/// The states of a job's events, in order.
fn states_of(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|j| j["state"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// slurm.conf as one exclusive test needs it, slurmctld restarted on it; on drop (however the
/// test ends) the test's jobs named `jobs_named` are cancelled, slurm.conf is put back and
/// slurmctld restarted on it.
struct SlurmConfFor {
    saved: String,
    jobs_named: &'static str,
}

impl SlurmConfFor {
    const PATH: &'static str = "/etc/slurm/slurm.conf";

    /// The cluster's slurm.conf as it is now.
    fn current() -> String {
        fs::read_to_string(Self::PATH).unwrap()
    }

    fn new(conf: String, jobs_named: &'static str) -> SlurmConfFor {
        let guard = SlurmConfFor {
            saved: Self::current(),
            jobs_named,
        };
        fs::write(Self::PATH, conf).unwrap();
        cluster_sh(&["restart-slurmctld"], &[]);
        guard
    }
}

impl Drop for SlurmConfFor {
    fn drop(&mut self) {
        let _ = slurm("scancel", &["--name", self.jobs_named]);
        let _ = fs::write(Self::PATH, &self.saved);
        let _ = Command::new(repo().join("tests/cluster/cluster.sh"))
            .arg("restart-slurmctld")
            .output();
    }
}

/// `conf` with its line for `key` (`MinJobAge=…`) replaced by `line`; the key must be there.
fn with_line(conf: &str, key: &str, line: &str) -> String {
    assert!(
        conf.lines().any(|l| l.starts_with(key)),
        "slurm.conf has no {key} line to change"
    );
    conf.lines()
        .map(|l| if l.starts_with(key) { line } else { l })
        .map(|l| format!("{l}\n"))
        .collect()
}

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
//! A faster loop while developing: `CVSLURM_E2E_REUSE=1` keeps the cluster up at the end and,
//! on the next run, uses a running cluster of the same version and shape as it is
//! (`cluster.sh up --reuse`: its jobs cancelled, each slurmd restarted) instead of building it
//! again; the stand-in, the hook's files and the service are always new. Without it (CI), every
//! run brings a fresh cluster up. Done for the day: `tests/cluster/cluster.sh down`, then kill
//! the stand-in and service whose pids are in /var/tmp/cvslurm-e2e/*.pid.

#[path = "common/cluster.rs"]
mod cluster;
mod common;
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
        use std::io::Write;
        let name = std::thread::current().name().unwrap_or("?").to_string();
        let _ = writeln!(
            std::io::stderr(),
            "[e2e] {name}: {:.1} s (waited {:.1} s)",
            self.since.elapsed().as_secs_f64(),
            self.waited.as_secs_f64()
        );
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

/// Expected data interfaces of static node `i` (the harness's addressing scheme).
fn expected_interfaces(i: usize) -> Value {
    json!([
        {"name": "ens1f0", "mac_address": format!("02:99:00:00:{i:02x}:02"),
         "ip_addresses": {"values": [format!("10.98.{i}.1"), format!("10.98.{i}.2")]}},
        {"name": "eth0", "mac_address": format!("02:99:00:00:{i:02x}:01"),
         "ip_addresses": {"values": [format!("10.99.0.{}", 10 + i)]}},
    ])
}

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn inventory_sends_each_nodes_own_interfaces() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let out = Command::new(&f.bin)
        .args(["inventory", "--dry-run"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "inventory of cluster {CLUSTER}: {NODES} would send, 0 failed, 0 unavailable"
        )),
        "{text}"
    );
    // Real run: one NodeConfig per node with that node's own MACs and IPs.
    let before = f.cv.requests().len();
    let out = Command::new(&f.bin).args(["inventory"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    let sent: Vec<Value> = f.cv.requests()[before..]
        .iter()
        .filter(|r| r["method"] == "POST" && r["path"].as_str().unwrap().ends_with("NodeConfig"))
        .map(|r| r["body"].clone())
        .collect();
    // One NodeConfig per node from this run (its summary); the service may send a node of
    // its own meanwhile (one an earlier test left failing), so the request log is read as a
    // set of nodes.
    assert!(
        stdout(&out).contains(&format!("{NODES} sent, 0 failed, 0 unavailable")),
        "{}",
        stdout(&out)
    );
    let keys: std::collections::BTreeSet<String> = sent
        .iter()
        .map(|n| n["key"]["id"].as_str().unwrap_or("").to_string())
        .collect();
    let all: std::collections::BTreeSet<String> = (1..=NODES).map(|i| format!("n{i}")).collect();
    assert_eq!(keys, all);
    for i in 1..=NODES {
        let n = sent
            .iter()
            .find(|n| n["key"]["id"] == format!("n{i}"))
            .unwrap_or_else(|| panic!("n{i} not sent"));
        assert_eq!(n["hostname"], format!("n{i}"));
        assert_eq!(n["location"], CLUSTER);
        assert_eq!(
            n["data_interfaces"]["values"],
            expected_interfaces(i),
            "n{i}"
        );
    }
    // A node whose slurmd is dead: dead_node_requeue_and_time_limit_end_right.
    // Discovery through srun --bcast: nothing needs to be installed on the workers but the
    // directory the copy goes to, writable only by SlurmUser (root's inventory runs as
    // StateDir's owner).
    let bdir = PathBuf::from(WORK).join("bcast");
    fs::create_dir_all(&bdir).unwrap();
    fs::set_permissions(&bdir, fs::Permissions::from_mode(0o700)).unwrap();
    chown_slurm(&bdir);
    let conf = fs::read_to_string(&f.conf).unwrap();
    let bcast = Scratch::new("bcast");
    let bconf = bcast.path().join("cv.conf");
    fs::write(
        &bconf,
        format!(
            "{conf}DiscoveryBcast=yes\nDiscoveryBcastDir={}\n",
            bdir.display()
        ),
    )
    .unwrap();
    let out = Command::new(&f.bin)
        .args([
            "inventory",
            "--dry-run",
            "--config",
            bconf.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        stdout(&out).contains(&format!("{NODES} would send, 0 failed")),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    let copies = fs::read_dir(&bdir).unwrap().count();
    assert!(copies >= 1, "no copy in {}", bdir.display());
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
    wait_job(f, &id, "JOB_STATE_RUNNING", Duration::from_secs(30));
    wait_until("the first run's script", Duration::from_secs(60), || {
        started.exists()
    });
    cluster_sh(&["stop-slurmd", "n4"], &[]);
    let _restore = Restore(&["start-slurmd", "n4"]);
    // n4 is set DOWN as slurmctld would after SlurmdTimeout (30 s here) without an answer:
    // both kill its jobs through kill_running_job_by_node_name (node_mgr.c), which requeues
    // this one under the same id.
    let down = slurm(
        "scontrol",
        &[
            "update",
            "NodeName=n4",
            "State=DOWN",
            "Reason=e2e-dead-slurmd",
        ],
    );
    assert!(down.status.success(), "{}", stderr(&down));
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
    let out = Command::new(&f.bin).args(["inventory"]).output().unwrap();
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(
        text.contains("3 sent, 0 failed, 1 unavailable (n4 (down))")
            || text.contains("3 sent, 0 failed, 1 unavailable (n4 (down*))"),
        "{text}"
    );
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

/// Puts the stand-in back to CloudVision's contract when the test ends, passed or not.
struct ContractProfile<'a>(&'a Standin);

impl Drop for ContractProfile<'_> {
    fn drop(&mut self) {
        self.0.set_behaviour(json!({"profile": "cloudvision"}));
    }
}

/// Issue 29, on a real cluster against Arista's own fake CloudVision's rules (every POST a
/// whole record that replaces the stored one; no GET): a job's RUNNING and end from the hooks
/// and the service, and a one-shot inventory, are each accepted and the records held are the
/// job's and the nodes'; a node whose interfaces no filter lets through gets no NodeConfig
/// (a warning naming the filters, exit 0), and its record stays.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn arista_rules_take_every_record_and_a_node_without_nics_is_not_posted() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let from =
        f.cv.requests()
            .last()
            .map_or(0, |r| r["seq"].as_u64().unwrap_or(0));
    f.cv.set_behaviour(json!({"profile": "arista"}));
    let _back = ContractProfile(&f.cv);
    let id = sbatch(&["-J", "e2e-arista", "--wrap", "sleep 1"]);
    let done = wait_job(f, &id, "JOB_STATE_COMPLETED", Duration::from_secs(60));
    check_times(&done);
    assert_eq!(done["name"], "e2e-arista@debug");
    assert_eq!(nodes_of(&done).len(), 1);
    assert!(done.get("interfaces").is_none(), "{done}");
    let out = Command::new(&f.bin).args(["inventory"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stdout(&out).contains(&format!("{NODES} sent, 0 failed, 0 unavailable")),
        "{}",
        stdout(&out)
    );
    for i in 1..=NODES {
        let n = f.cv.stored_node(&format!("n{i}")).unwrap();
        assert_eq!(
            n["data_interfaces"]["values"],
            expected_interfaces(i),
            "{n}"
        );
    }
    // No interface passes InterfaceRegex: nothing posted, one warning per node, exit 0.
    let conf = Scratch::new("no-nics");
    let path = conf.path().join("cv.conf");
    fs::write(
        &path,
        format!(
            "{}InterfaceRegex=^nomatch\n",
            fs::read_to_string(&f.conf).unwrap()
        ),
    )
    .unwrap();
    let posts = |f: &Fixture| {
        f.cv.requests()
            .iter()
            .filter(|r| {
                r["method"] == "POST" && r["path"].as_str().unwrap().ends_with("NodeConfig")
            })
            .count()
    };
    let before = posts(f);
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stdout(&out).contains(&format!(
            "0 sent, 0 failed, 0 unavailable, {NODES} without an interface (n1, n2, n3, n4)"
        )),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains(
            "node n1: no interface passes the filters (InterfaceRegex=^nomatch, \
             InterfacePhysicalOnly="
        ),
        "{}",
        stderr(&out)
    );
    assert_eq!(posts(f), before, "a NodeConfig was posted");
    assert!(f.cv.stored_node("n1").is_some(), "n1's record is gone");
    // Every request since the switch was accepted: whole records, one list each.
    for r in f.cv.requests() {
        if r["seq"].as_u64().unwrap_or(0) <= from || r["method"] != "POST" {
            continue;
        }
        assert_eq!(r["status"], 200, "refused: {r}");
        if r["path"].as_str().unwrap().ends_with("JobConfig") {
            let lists = ["nodes", "interfaces"]
                .iter()
                .filter(|l| r["body"].get(**l).is_some())
                .count();
            assert_eq!(lists, 1, "{r}");
        }
    }
}

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn monitor_follows_nodes_that_appear_leave_and_return() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let nodes = |f: &Fixture| f.cv.state()["nodes"].clone();
    // The service's first inventory sent every node.
    wait_until(
        "the service's first inventory",
        Duration::from_secs(60),
        || (1..=NODES).all(|i| nodes(f)[format!("n{i}")].is_object()),
    );
    cluster_sh(&["add-node", "n5"], &[]);
    let _cleanup = Restore(&["del-node", "n5"]);
    wait_until("n5's NodeConfig", Duration::from_secs(60), || {
        nodes(f)["n5"].is_object()
    });
    assert_eq!(
        nodes(f)["n5"]["data_interfaces"]["values"],
        expected_interfaces(5)
    );
    // n5 goes away for a while and comes back: sent again.
    let sent_before =
        f.cv.accepted("NodeConfig")
            .iter()
            .filter(|n| n["key"]["id"] == "n5")
            .count();
    cluster_sh(&["stop-slurmd", "n5"], &[]);
    // Set DOWN at once, as slurmctld does after SlurmdTimeout (30 s here) without an answer.
    let down = slurm(
        "scontrol",
        &["update", "NodeName=n5", "State=DOWN", "Reason=e2e-stopped"],
    );
    assert!(down.status.success(), "{}", stderr(&down));
    // Wait until the service itself saw n5 unavailable (a blip shorter than a poll goes unseen).
    wait_until(
        "the service to see n5 unavailable",
        Duration::from_secs(120),
        || {
            fs::read_to_string(&f.log_file)
                .unwrap_or_default()
                .contains("node n5: now ")
        },
    );
    cluster_sh(&["start-slurmd", "n5"], &[]);
    wait_until("n5 to be sent again", Duration::from_secs(90), || {
        f.cv.accepted("NodeConfig")
            .iter()
            .filter(|n| n["key"]["id"] == "n5")
            .count()
            > sent_before
    });
    cluster_sh(&["del-node", "n5"], &[]);
    wait_until("n5's DELETE", Duration::from_secs(60), || {
        f.cv.requests()
            .iter()
            .any(|r| r["method"] == "DELETE" && r["query"]["key.id"] == "n5")
    });
    assert!(nodes(f)["n5"].is_null());
    let log = fs::read_to_string(&f.log_file).unwrap();
    assert!(
        log.contains("node n5: appeared; sending NodeConfig"),
        "{log}"
    );
    assert!(
        log.contains("node n5: came back; sending NodeConfig"),
        "{log}"
    );
    assert!(
        log.contains("node n5: left the cluster; deleting its NodeConfig"),
        "{log}"
    );
}

/// `QualifyNodeNames=yes` through a real inventory (issue 18, point 5): every NodeConfig's
/// key is `<node>@<cluster>`, its hostname the node name, and the dry run prints the same
/// keys. The bare keys the service sent stay as they were.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn inventory_qualifies_node_keys_with_the_cluster() {
    use cvslurm::cloudvision::{Client, ClientOptions};
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    wait_until(
        "the service's first inventory",
        Duration::from_secs(60),
        || (1..=NODES).all(|i| f.cv.stored_node(&format!("n{i}")).is_some()),
    );
    let conf = Scratch::new("qualify");
    let path = conf.path().join("cv.conf");
    fs::write(
        &path,
        format!(
            "{}QualifyNodeNames=yes\n",
            fs::read_to_string(&f.conf).unwrap()
        ),
    )
    .unwrap();
    let out = Command::new(&f.bin)
        .args(["inventory", "--dry-run", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for i in 1..=NODES {
        assert!(
            stdout(&out).contains(&format!("\"id\": \"n{i}@{CLUSTER}\"")),
            "{}",
            stdout(&out)
        );
    }
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    let client = Client::new(ClientOptions {
        server: f.cv.server(),
        token: cvslurm::config::Token::new(TOKEN),
        ca_file: Some(f.cv.ca()),
        pins: Vec::new(),
        insecure: false,
        timeout: Duration::from_secs(10),
    })
    .unwrap();
    for i in 1..=NODES {
        let id = format!("n{i}@{CLUSTER}");
        let n =
            f.cv.stored_node(&id)
                .unwrap_or_else(|| panic!("no NodeConfig {id}"));
        assert_eq!(n["key"]["id"], id.as_str());
        assert_eq!(n["hostname"], format!("n{i}"));
        assert_eq!(n["location"], CLUSTER);
        assert_eq!(
            n["data_interfaces"]["values"],
            expected_interfaces(i),
            "{id}"
        );
        // The service's own NodeConfig of the node is still there, under its bare name.
        assert!(f.cv.stored_node(&format!("n{i}")).is_some(), "n{i}");
        client.delete_node(&id, None).unwrap();
    }
}

/// The service deletes a node that left the cluster only when CloudVision's record of it is
/// this cluster's (issue 18, point 5): a NodeConfig another cluster (same node name, no
/// QualifyNodeNames) wrote over is asked for (GetOne), found with the other location, and
/// left alone with a warning.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn monitor_leaves_a_node_another_cluster_holds_alone() {
    use cvslurm::cloudvision::payload::{Key, NodeConfig};
    use cvslurm::cloudvision::{Client, ClientOptions};
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let nodes = |f: &Fixture| f.cv.state()["nodes"].clone();
    wait_until(
        "the service's first inventory",
        Duration::from_secs(60),
        || (1..=NODES).all(|i| nodes(f)[format!("n{i}")].is_object()),
    );
    cluster_sh(&["add-node", "n6"], &[]);
    let _cleanup = Restore(&["del-node", "n6"]);
    wait_until("n6's NodeConfig", Duration::from_secs(60), || {
        nodes(f)["n6"].is_object()
    });
    // Another cluster's n6 (its own location) replaces this one's in CloudVision.
    let other = Client::new(ClientOptions {
        server: f.cv.server(),
        token: cvslurm::config::Token::new(TOKEN),
        ca_file: Some(f.cv.ca()),
        pins: Vec::new(),
        insecure: false,
        timeout: Duration::from_secs(10),
    })
    .unwrap();
    other
        .post_node(
            &NodeConfig {
                key: Key { id: "n6".into() },
                location: Some("othercluster".into()),
                hostname: Some("n6".into()),
                data_interfaces: Vec::new().into(),
            },
            None,
        )
        .unwrap();
    cluster_sh(&["del-node", "n6"], &[]);
    wait_until(
        "the service to leave n6 alone",
        Duration::from_secs(60),
        || {
            fs::read_to_string(&f.log_file).unwrap_or_default().contains(
                "node n6: not deleted: the NodeConfig CloudVision holds is cluster \"othercluster\"'s",
            )
        },
    );
    assert_eq!(nodes(f)["n6"]["location"], "othercluster");
    assert!(
        !f.cv
            .requests()
            .iter()
            .any(|r| r["method"] == "DELETE" && r["query"]["key.id"] == "n6"),
        "n6 was deleted"
    );
    assert!(
        f.cv.requests()
            .iter()
            .any(|r| r["method"] == "GET" && r["query"]["key.id"] == "n6"),
        "CloudVision was not asked for n6"
    );
    other.delete_node("n6", None).unwrap();
}

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn monitor_stops_cleanly_on_sigterm() {
    let (f, _g) = shared();
    let mut child = Command::new(&f.bin)
        .args(["inventory", "--monitor", "--poll-interval", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the monitor stopped by itself"
    );
    let t = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the monitor ignored SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "stopping took {:?}",
        t.elapsed()
    );
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

/// Makes `node`'s copy of the cvslurm binary a script (a bind mount in the mount namespace of
/// that node's slurmd, which srun's tasks inherit), as a broken install on one worker would
/// be. Undone on drop.
struct BrokenWorker {
    pid: String,
}

impl BrokenWorker {
    fn new(f: &Fixture, node: &str, script: &str) -> BrokenWorker {
        let pid =
            fs::read_to_string(slurm_bin_dir().join(format!("../run/slurmd-{node}.pid.ours")))
                .unwrap()
                .trim()
                .to_string();
        let path = PathBuf::from(WORK).join(format!("broken-{node}.sh"));
        fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        let out = Command::new("nsenter")
            // -r: slurmd's own root (a Slurm root filesystem has its own bind of WORK)
            .args(["-t", &pid, "-m", "-r", "--", "mount", "--bind"])
            .arg(&path)
            .arg(&f.bin)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "bind mount on {node}: {}",
            stderr(&out)
        );
        BrokenWorker { pid }
    }
}

impl Drop for BrokenWorker {
    fn drop(&mut self) {
        let bin = PathBuf::from(WORK).join("cvslurm");
        let _ = Command::new("nsenter")
            .args(["-t", &self.pid, "-m", "-r", "--", "umount", "-l"])
            .arg(bin)
            .output();
    }
}

#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn misbehaving_workers_fail_alone() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let slow = BrokenWorker::new(f, "n1", "sleep 600");
    let garbage = BrokenWorker::new(f, "n2", "echo 'not json'; echo '{\"node_name\":\"n3\"'");
    let flood = BrokenWorker::new(f, "n3", "head -c 100000000 /dev/zero | tr '\\000' x");
    let conf = Scratch::new("broken");
    let path = conf.path().join("cv.conf");
    fs::write(
        &path,
        format!(
            "{}DiscoveryTimeout=15\n",
            fs::read_to_string(&f.conf).unwrap()
        ),
    )
    .unwrap();
    let t = Instant::now();
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let took = t.elapsed();
    let (text, err) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "{text}\n{err}");
    assert!(
        text.contains("1 sent, 3 failed (n1, n2, n3), 0 unavailable"),
        "{text}\n{err}"
    );
    assert!(
        err.contains(
            "node n1: discovery failed: no discover record within 15 s (DiscoveryTimeout)"
        ),
        "{err}"
    );
    assert!(err.contains("node n2: discovery failed"), "{err}");
    assert!(err.contains("node n3: discovery failed"), "{err}");
    assert!(
        took < Duration::from_secs(60),
        "inventory took {took:?} with a 15 s DiscoveryTimeout"
    );
    // n4 was sent with its own interfaces.
    let n4 = f.cv.state()["nodes"]["n4"].clone();
    assert_eq!(n4["data_interfaces"]["values"], expected_interfaces(4));
    // A worker that prints nothing at all.
    drop((slow, garbage, flood));
    let _silent = BrokenWorker::new(f, "n2", "exit 0");
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        stdout(&out).contains("3 sent, 1 failed (n2), 0 unavailable"),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("node n2: discovery failed: no discover record"),
        "{}",
        stderr(&out)
    );
}

/// A worker whose discover lies about its node name (here n2 claiming to be n3, with made-up
/// interfaces) cannot set another node's NodeConfig: the record is bound to the node srun
/// ran the task on, the lie is dropped and only n2 fails. Nor can a worker claim another
/// node's MAC under its own name: that record is held.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn lying_worker_cannot_speak_for_another_node() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let lie = r#"{"node_name":"n3","hostname":"n3","location":"cvtest","interfaces":[{"name":"eth0","mac_address":"de:ad:be:ef:00:03","ip_addresses":["6.6.6.6"]}]}"#;
    let liar = BrokenWorker::new(f, "n2", &format!("echo '{lie}'; echo '{lie}'"));
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", f.conf.to_str().unwrap()])
        .output()
        .unwrap();
    let (text, err) = (stdout(&out), stderr(&out));
    assert!(
        text.contains("3 sent, 1 failed (n2), 0 unavailable"),
        "{text}\n{err}"
    );
    assert!(
        err.contains("the worker on node n2 sent a record for node \"n3\"; dropped"),
        "{err}"
    );
    let n3 = f.cv.state()["nodes"]["n3"].clone();
    assert_eq!(
        n3["data_interfaces"]["values"],
        expected_interfaces(3),
        "{n3}"
    );
    let bodies = f.cv.accepted("NodeConfig");
    assert!(
        !bodies.iter().any(|b| b.to_string().contains("de:ad:be:ef")),
        "the lie reached CloudVision"
    );
    // Under its own name, n1 reports n2's NIC beside its own (issue 17, item 9). n2 reported
    // that MAC first (the plain inventory below keeps every node's record in StateDir), so
    // n1's record is held: a MAC belongs to one node, and n1's jobs never go to n2's port.
    drop(liar);
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", f.conf.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        stdout(&out).contains(&format!("{NODES} sent, 0 failed")),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    let thief = json!({"node_name": "n1", "hostname": "n1", "location": CLUSTER, "interfaces": [
        {"name": "eth0", "mac_address": "02:99:00:00:01:01", "ip_addresses": ["10.99.0.11"]},
        {"name": "eth1", "mac_address": "02:99:00:00:02:01", "ip_addresses": ["10.99.0.12"]}]});
    let _thief = BrokenWorker::new(f, "n1", &format!("echo '{thief}'"));
    let before = f.cv.accepted("NodeConfig").len();
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", f.conf.to_str().unwrap()])
        .output()
        .unwrap();
    let (text, err) = (stdout(&out), stderr(&out));
    assert!(
        text.contains("3 sent, 1 failed (n1), 0 unavailable"),
        "{text}\n{err}"
    );
    assert!(
        err.contains(
            "node n1: discovery failed: record held: it claims MAC 02:99:00:00:02:01 (eth1), \
             which node n2 reported too"
        ),
        "{err}"
    );
    assert_eq!(
        f.cv.state()["nodes"]["n1"]["data_interfaces"]["values"],
        expected_interfaces(1)
    );
    let n1_bodies: Vec<String> = f.cv.accepted("NodeConfig")[before..]
        .iter()
        .filter(|b| b["key"]["id"] == "n1")
        .map(|b| b.to_string())
        .collect();
    assert!(
        !n1_bodies.iter().any(|b| b.contains("02:99:00:00:02:01")),
        "n2's MAC reached CloudVision in n1's NodeConfig: {n1_bodies:?}"
    );
}

/// `count` more NICs with IPv4 (`ens3f1`… with MAC `02:96:00:00:<i>:<k>` and address
/// `10.96.<i>.<k>`) in node `n<i>`'s network namespace, which its slurmd and so discover see:
/// macvlans on eth0, as cluster.sh makes ens1f0 (the test kernel has no dummy links).
/// Removed on drop.
struct ExtraNics {
    ns: String,
    names: Vec<String>,
}

impl ExtraNics {
    fn add(i: usize, count: usize) -> ExtraNics {
        let ns = format!("cvslurm-n{i}");
        let mut extra = ExtraNics {
            ns: ns.clone(),
            names: Vec::new(),
        };
        for k in 1..=count {
            let name = format!("ens3f{k}");
            let mac = format!("02:96:00:00:{i:02x}:{k:02x}");
            let ip = format!("10.96.{i}.{k}/32");
            extra.names.push(name.clone());
            for args in [
                &[
                    "link", "add", &name, "link", "eth0", "address", &mac, "type", "macvlan",
                    "mode", "bridge",
                ][..],
                &["addr", "add", &ip, "dev", &name],
                &["link", "set", &name, "up"],
            ] {
                let out = Command::new("ip")
                    .args(["-n", &ns])
                    .args(args)
                    .output()
                    .unwrap();
                assert!(out.status.success(), "ip {args:?}: {}", stderr(&out));
            }
        }
        extra
    }
}

impl Drop for ExtraNics {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("ip")
                .args(["-n", &self.ns, "link", "del", name])
                .output();
        }
    }
}

/// A node with 18 NICs (issue 17, item 0): its plain record (no topology, JobInterfaces=nodes)
/// is over 1 KiB, which slurmstepd forwards in 1024-byte pieces that `srun --label` ends with a
/// newline each; discover sends it as parts and the inventory puts it back together.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn node_with_many_nics_is_discovered() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let nics = ExtraNics::add(1, 16);
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", f.conf.to_str().unwrap()])
        .output()
        .unwrap();
    let (text, err) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{text}\n{err}");
    assert!(
        text.contains(&format!("{NODES} sent, 0 failed, 0 unavailable")),
        "{text}\n{err}"
    );
    let n1 = f.cv.state()["nodes"]["n1"].clone();
    let got = n1["data_interfaces"]["values"].as_array().unwrap().clone();
    assert_eq!(got.len(), 18, "{n1}");
    for k in 1..=16 {
        let name = format!("ens3f{k}");
        let nic = got.iter().find(|v| v["name"] == name.as_str());
        assert_eq!(
            nic,
            Some(
                &json!({"name": name, "mac_address": format!("02:96:00:00:01:{k:02x}"),
                         "ip_addresses": {"values": [format!("10.96.1.{k}")]}})
            ),
            "{n1}"
        );
    }
    assert!(serde_json::to_string(&n1).unwrap().len() > 1024);
    // Put n1's NodeConfig (and its record in StateDir) back as the other tests expect it.
    drop(nics);
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", f.conf.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        f.cv.state()["nodes"]["n1"]["data_interfaces"]["values"],
        expected_interfaces(1)
    );
}

/// Every CPU of every node allocated (one exclusive job on all nodes): discovery does not
/// wait for resources (a new srun would pend until DiscoveryTimeout); it runs as an
/// overlapping step inside the job that holds the nodes, a job of the inventory's own user
/// (root here: its StateDir is its own). A node held by another user's job is not discovered.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn discovery_reaches_fully_allocated_nodes() {
    // Every node is taken below: the fixture's time-limit job (n1, ended by Slurm at most
    // 90 s after the cluster came up) is waited out first, holding no lock, so the other
    // tests run meanwhile.
    let time_limit_job = &fixture().time_limit_job;
    wait_until(
        "the time-limit job to leave n1",
        Duration::from_secs(300),
        || {
            stdout(&slurm("squeue", &["-h", "-j", time_limit_job]))
                .trim()
                .is_empty()
        },
    );
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    let all = format!("n[1-{NODES}]");
    let job = sbatch(&[
        "--exclusive",
        "-w",
        &all,
        "-N",
        &NODES.to_string(),
        "--wrap",
        "sleep 300",
    ]);
    struct Cancel(String);
    impl Drop for Cancel {
        fn drop(&mut self) {
            let _ = slurm("scancel", &[&self.0]);
        }
    }
    let _cancel = Cancel(job.clone());
    // The job itself running (it can wait behind the service's own discovery job, which
    // holds a CPU of every node for a moment at start), then every node allocated.
    wait_until(
        "the whole-cluster job to run",
        Duration::from_secs(60),
        || stdout(&slurm("squeue", &["-h", "-j", &job, "-o", "%T"])).trim() == "RUNNING",
    );
    wait_until("every node allocated", Duration::from_secs(30), || {
        (1..=NODES).all(|i| node_state(&format!("n{i}")) == "allocated")
    });
    let conf = Scratch::new("busy");
    let path = conf.path().join("cv.conf");
    fs::write(
        &path,
        format!(
            "{}DiscoveryTimeout=20\nStateDir={}\n",
            fs::read_to_string(&f.conf).unwrap(),
            conf.path().join("state").display()
        ),
    )
    .unwrap();
    let t = Instant::now();
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let (text, err) = (stdout(&out), stderr(&out));
    assert!(
        text.contains(&format!("{NODES} sent, 0 failed, 0 unavailable")),
        "{text}\n{err}"
    );
    assert!(
        err.contains(&format!(
            "discovery: {NODES} node(s) fully allocated (n[1-{NODES}]); reached through job {job} (n[1-{NODES}])"
        )),
        "{err}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
    for i in 1..=NODES {
        let n = f.cv.state()["nodes"][format!("n{i}")].clone();
        assert_eq!(
            n["data_interfaces"]["values"],
            expected_interfaces(i),
            "{n}"
        );
    }
    // n4 held by another user's job (issue 17, item 14): a step there would run as that user,
    // who could write into its output and forge n4's record, and Slurm refuses root's step in
    // it anyway. n4 fails at once, naming the job, without an srun; the others are sent.
    drop(_cancel);
    wait_until(
        "the whole-cluster job to end",
        Duration::from_secs(60),
        || {
            stdout(&slurm("squeue", &["-h", "-j", &job]))
                .trim()
                .is_empty()
        },
    );
    let out = as_nobody(
        Path::new("sbatch"),
        &[
            "--parsable",
            "-o",
            "/dev/null",
            "-e",
            "/dev/null",
            "--exclusive",
            "-w",
            "n4",
            "--wrap",
            "sleep 300",
        ],
    );
    assert!(out.status.success(), "sbatch as nobody: {}", stderr(&out));
    let theirs = stdout(&out).trim().split(';').next().unwrap().to_string();
    let _cancel = Cancel(theirs.clone());
    wait_until("nobody's job on n4 to run", Duration::from_secs(60), || {
        stdout(&slurm("squeue", &["-h", "-j", &theirs, "-o", "%T"])).trim() == "RUNNING"
    });
    wait_until("n4 allocated", Duration::from_secs(30), || {
        node_state("n4") == "allocated"
    });
    let t = Instant::now();
    let out = Command::new(&f.bin)
        .args(["inventory", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let (text, err) = (stdout(&out), stderr(&out));
    assert!(
        text.contains(&format!("{} sent, 1 failed (n4), 0 unavailable", NODES - 1)),
        "{text}\n{err}"
    );
    assert!(
        err.contains(&format!(
            "node n4: discovery failed: fully allocated by job {theirs} of another user (uid \
             65534): discovery runs no step in another user's job"
        )),
        "{err}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
}

/// Runs `prog args` as `nobody`, a user who is no operator, with the PATH of this test (the
/// cluster's Slurm first), in `/`. Where the cluster's Slurm runs in a root filesystem (its
/// commands are chroot wrappers), the user is switched inside it.
fn as_nobody(prog: &Path, args: &[&str]) -> Output {
    let path = std::env::var("PATH").unwrap_or_default();
    let sinfo = std::env::split_paths(&path)
        .map(|d| d.join("sinfo"))
        .find(|p| p.is_file());
    let rootfs = sinfo
        .and_then(|p| fs::read(p).ok())
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .and_then(|t| {
            // The wrapper's comment names its root: "# Slurm 24.11: sinfo from /var/cache/…".
            let rest = t.lines().nth(1)?.split(": sinfo from ").nth(1)?;
            rest.split_whitespace().next().map(String::from)
        });
    let mut c = match &rootfs {
        Some(r) => {
            let mut c = Command::new("chroot");
            c.arg(r).arg("runuser");
            c
        }
        None => Command::new("runuser"),
    };
    c.args(["-u", "nobody", "--", "env"])
        .arg(format!("PATH={path}:/usr/bin:/bin"))
        .arg(prog)
        .args(args)
        .current_dir("/")
        .output()
        .unwrap()
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

/// `cvslurm check` names the Slurm release and how it is read.
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn check_names_the_slurm_release() {
    let (f, _g) = shared();
    let out = Command::new(&f.bin).arg("check").output().unwrap();
    let text = stdout(&out);
    let (major, minor) = slurm_version();
    let line = text
        .lines()
        .find(|l| l.contains(&format!("Slurm {major}.{minor:02}.")))
        .unwrap_or_else(|| panic!("no Slurm version line:\n{text}"));
    assert!(line.starts_with("ok"), "{line}");
    assert!(line.contains("--json"), "{line}");
}

/// Hidden partitions (Hidden=YES) are inventoried: `sinfo` without `--all` shows them only to
/// operators, so an inventory run by another user missed their nodes (and the service would
/// delete their NodeConfigs when a partition was hidden).
#[test]
#[ignore = "needs root and a real Slurm cluster: tests/run-all.sh"]
fn hidden_partition_nodes_are_inventoried() {
    let (f, _g) = exclusive();
    f.cv.set_mode(json!({"mode": "ok"}));
    struct Unhide;
    impl Drop for Unhide {
        fn drop(&mut self) {
            let _ = slurm("scontrol", &["update", "partitionname=gpu", "hidden=no"]);
            let _ = slurm("scontrol", &["update", "partitionname=debug", "nodes=ALL"]);
        }
    }
    let _unhide = Unhide;
    // n3 and n4 are then only in the hidden partition gpu.
    let ok = |o: Output| assert!(o.status.success(), "{}", stderr(&o));
    ok(slurm(
        "scontrol",
        &["update", "partitionname=debug", "nodes=n1,n2"],
    ));
    ok(slurm(
        "scontrol",
        &["update", "partitionname=gpu", "hidden=yes"],
    ));
    let plain = as_nobody(Path::new("sinfo"), &["-h", "-N", "-o", "%N"]);
    assert!(
        plain.status.success() && !stdout(&plain).contains("n3"),
        "sinfo shows hidden nodes to users, the test would prove nothing: {}{}",
        stdout(&plain),
        stderr(&plain)
    );
    let deletes_before =
        f.cv.requests()
            .iter()
            .filter(|r| r["method"] == "DELETE")
            .count();
    let out = as_nobody(
        &f.bin,
        &[
            "inventory",
            "--dry-run",
            "--config",
            f.conf.to_str().unwrap(),
        ],
    );
    let text = stdout(&out);
    assert!(
        text.contains(&format!("{NODES} would send, 0 failed")),
        "{text}\n{}",
        stderr(&out)
    );
    // The service (a poll every 2 s) deletes nothing while the partition is hidden.
    std::thread::sleep(Duration::from_secs(5));
    let deletes =
        f.cv.requests()
            .iter()
            .filter(|r| r["method"] == "DELETE")
            .count();
    assert_eq!(
        deletes, deletes_before,
        "a hidden partition's nodes were deleted"
    );
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

/// slurm.conf's text without its `EpilogSlurmctld=` lines (the PrologSlurmctld-only set-up);
/// the cluster must have one to take away.
/// Issue 30, the `--jobcomp` set-up on a real cluster: no EpilogSlurmctld, slurm.conf's
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

/// The samples of a metrics file: series (with labels) to value.
fn metric_samples(text: &str) -> std::collections::BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(s, v)| (s.to_string(), v.parse::<f64>().unwrap_or(f64::NAN)))
        .collect()
}

/// The service's metrics file (issue 21): valid for `promtool check metrics`, rewritten while
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

/// Held jobs that fill slurmctld's queue in the output-bound test (cancelled at its end).
const BULK: &str = "e2e-bulk-held";

/// A queue past the output bound (issue 20): `SlurmOutputMaxMiB=1` for the service and 500
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
        if by_id {
            assert_eq!(states, ["JOB_STATE_RUNNING", state], "job {id}");
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

/// `MinJobAge=2` (issue 20): slurmctld forgets an ended job seconds after it ends (at its next
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
    assert!(
        saved.lines().any(|l| l.starts_with("MinJobAge=")),
        "slurm.conf has no MinJobAge line to change"
    );
    let aged: String = saved
        .lines()
        .map(|l| {
            if l.starts_with("MinJobAge=") {
                "MinJobAge=2"
            } else {
                l
            }
        })
        .map(|l| format!("{l}\n"))
        .collect();
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
    // The job's start is its first record's, its end its last's.
    let mut rows: Vec<Vec<String>> = Vec::new();
    wait_until(
        &format!("sacct to record job {id}'s end"),
        Duration::from_secs(60),
        || {
            let out = slurm(
                "sacct",
                &[
                    "-j",
                    &id,
                    "-X",
                    "-n",
                    "-P",
                    "-o",
                    "JobIDRaw,State,Start,End",
                ],
            );
            rows = stdout(&out)
                .lines()
                .filter(|l| l.starts_with(&format!("{id}|")))
                .map(|l| l.split('|').map(str::to_string).collect())
                .collect();
            rows.last()
                .is_some_and(|r| r.len() == 4 && r[1].starts_with("CANCELLED") && r[3] != "Unknown")
        },
    );
    assert!(rows.len() >= 2 && rows[0][1] == "RESIZING", "{rows:?}");
    let iso = |s: &str| cvslurm::internals::timefmt::format_epoch(s.parse().unwrap()).unwrap();
    assert_eq!(done["start_time"].as_str(), Some(iso(&rows[0][2]).as_str()));
    let last = rows.last().unwrap();
    assert_eq!(
        done["end_time"].as_str(),
        Some(iso(&last[3]).as_str()),
        "{rows:?}"
    );
}

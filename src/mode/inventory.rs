//! `cvslurm inventory`: nodes from sinfo, interfaces from `srun … cvslurm discover` on them,
//! one NodeConfig per node. `--monitor` keeps doing it under systemd: nodes that appear or come
//! back are sent, nodes that leave are deleted, and the outbox is drained.

use super::common::{install_signal_handlers, usage, Common, STOP};
use super::discover::{DiscoverRecord, RecordReader};
use crate::cloudvision::Client;
use crate::config::Config;
use crate::delivery;
use crate::logging::Sink;
use crate::reconcile;
use crate::runner::Slurm;
use crate::sender::Sender;
use crate::slurm::{self, SinfoNode, COMMAND_TIMEOUT};
use crate::state::queue::{Event, Item};
use crate::state::StateDir;
use crate::systemd;
use argh::FromArgs;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Send one NodeConfig per node (sinfo + srun discover); --monitor keeps it up to date.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "inventory", help_triggers("-h", "--help", "help"))]
pub struct Args {
    /// config file (default $CVSLURM_CONF or /etc/slurm/cloudvision.conf)
    #[argh(option)]
    config: Option<PathBuf>,
    /// the CloudVision server, host[:port] (overrides ApiServer)
    #[argh(option)]
    api_server: Option<String>,
    /// API token (visible in ps: prefer --api-token-file or CV_API_TOKEN)
    #[argh(option)]
    api_token: Option<String>,
    /// file holding the API token (mode 600)
    #[argh(option)]
    api_token_file: Option<PathBuf>,
    /// print each request instead of sending it (needs no token, no network)
    #[argh(switch)]
    dry_run: bool,
    /// log debug details
    #[argh(switch, short = 'v')]
    verbose: bool,
    /// keep running: send nodes that appear or come back, delete nodes that leave, drain the outbox
    #[argh(switch)]
    monitor: bool,
    /// seconds between polls with --monitor (overrides PollInterval)
    #[argh(option)]
    poll_interval: Option<u64>,
}

/// Runs `cvslurm inventory` (once, or as the service with `--monitor`).
pub fn run(a: Args) -> i32 {
    let common = Common {
        config: a.config,
        api_server: a.api_server,
        api_token: a.api_token,
        api_token_file: a.api_token_file,
        dry_run: a.dry_run,
        verbose: a.verbose,
    };
    // The service logs to LogFile (or the journal under systemd), not to a terminal.
    let sink = if a.monitor { Sink::File } else { Sink::Stderr };
    let mut cfg = match common.load(sink) {
        Ok(c) => c,
        Err(e) => return usage(&e),
    };
    if a.monitor && std::env::var_os("JOURNAL_STREAM").is_none() {
        // Started by hand (or by a supervisor without the journal): say where the log goes.
        eprintln!(
            "cvslurm: inventory --monitor logs to {} (under systemd: the journal)",
            cfg.log_file.display()
        );
    }
    if let Some(p) = a.poll_interval {
        if p == 0 {
            return usage("--poll-interval must be at least 1 second");
        }
        cfg.poll_interval = Duration::from_secs(p);
    }
    if a.monitor && a.dry_run {
        return usage("--monitor and --dry-run do not go together");
    }
    install_signal_handlers();
    let slurm = Slurm::new(cfg.slurm_bin_dir.as_deref());
    let client = match common.client(&cfg) {
        Ok(c) => c,
        Err(e) => {
            log::error!("{e}");
            return 1;
        }
    };
    if a.monitor {
        let Some(client) = client else {
            return usage("--monitor needs a CloudVision client");
        };
        return run_service(&cfg, slurm, client, &STOP);
    }
    let cluster = match slurm::cluster_name(&slurm, slurm::COMMAND_TIMEOUT) {
        Ok(c) => c,
        Err(e) => {
            log::error!("{e}");
            return 1;
        }
    };
    let inv = Inventory {
        cfg: &cfg,
        slurm,
        cluster,
        client,
        stop: &STOP,
    };
    inv.run_once()
}

/// Where a discovery srun runs: a new job in a partition, or a step inside a running job.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    Partition(String),
    Job(String),
}

/// A host file for srun (`SLURM_HOSTFILE`): one node name per line, in a fresh file with an
/// unpredictable name (created with O_EXCL, mode 0600), removed on drop.
struct HostFile(std::path::PathBuf);

impl HostFile {
    fn create(names: &[String]) -> std::io::Result<HostFile> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = std::env::temp_dir().join(format!("cvslurm-hosts.{}", random_hex()?));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)?;
        let h = HostFile(path);
        let mut text = names.join("\n");
        text.push('\n');
        f.write_all(text.as_bytes())?;
        Ok(h)
    }
}

impl Drop for HostFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// 128 random bits as hex, from the kernel.
pub fn random_hex() -> std::io::Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Splits srun's `--label` prefix (`   12: `) off a line: (task, the rest). A line without
/// one has no task.
fn split_label(line: &str) -> (Option<usize>, &str) {
    if let Some((head, rest)) = line.split_once(": ") {
        if let Ok(t) = head.trim_start().parse::<usize>() {
            return (Some(t), rest);
        }
    }
    (None, line)
}

pub use crate::node_record::MAX_RECORD_BYTES;

/// What inventory needs to run.
pub struct Inventory<'a> {
    /// The configuration.
    pub cfg: &'a Config,
    /// The Slurm command runner.
    pub slurm: Slurm,
    /// The cluster name.
    pub cluster: String,
    /// The client; `None` for a dry run.
    pub client: Option<Client>,
    /// Set by SIGTERM/SIGINT.
    pub stop: &'a AtomicBool,
}

/// What the monitor knows of a node since it last listed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Available, and its NodeConfig was queued.
    Sent,
    /// Not available (or its discovery failed): sent again once it is.
    Unavailable,
    /// Due for re-assertion (`NodeReassertInterval`).
    Refresh,
}

/// Per-node outcome of a discovery pass.
pub type Discovered = BTreeMap<String, Result<DiscoverRecord, String>>;

impl Inventory<'_> {
    /// Runs discovery on `nodes` (grouped by partition, one srun per group).
    pub fn discover(&self, nodes: &[&SinfoNode]) -> Discovered {
        // A node whose every CPU is allocated cannot take a new job, however short: srun
        // would wait for it until DiscoveryTimeout. It is reached through a step inside a job
        // that runs there (`srun --jobid=J --overlap`, no resources taken).
        let busy: Vec<String> = nodes
            .iter()
            .filter(|n| n.state.eq_ignore_ascii_case("allocated"))
            .map(|n| n.name.clone())
            .collect();
        let mut in_jobs: BTreeMap<Target, Vec<String>> = BTreeMap::new();
        if !busy.is_empty() {
            match slurm::running_jobs_on(&self.slurm, &busy, COMMAND_TIMEOUT) {
                Ok(jobs) => {
                    let mut left: BTreeSet<&str> = busy.iter().map(String::as_str).collect();
                    for (job, job_nodes) in jobs {
                        for n in job_nodes {
                            if left.remove(n.as_str()) {
                                in_jobs.entry(Target::Job(job.clone())).or_default().push(n);
                            }
                        }
                    }
                }
                Err(e) => log::warn!("discovery: cannot list the jobs on allocated nodes: {e}"),
            }
            let through: Vec<String> = in_jobs
                .iter()
                .map(|(t, ns)| match t {
                    Target::Job(j) => format!("job {j} ({})", crate::hostlist::compress(ns)),
                    Target::Partition(p) => format!("partition {p}"),
                })
                .collect();
            log::debug!(
                "discovery: {} node(s) fully allocated ({}); reached through {}",
                busy.len(),
                crate::hostlist::compress(&busy),
                if through.is_empty() {
                    "no running job".to_string()
                } else {
                    through.join(", ")
                }
            );
        }
        let placed: BTreeSet<&String> = in_jobs.values().flatten().collect();
        let mut groups = in_jobs.clone();
        for n in nodes {
            if placed.contains(&n.name) {
                continue;
            }
            let part = n.partitions.first().cloned().unwrap_or_default();
            groups
                .entry(Target::Partition(part))
                .or_default()
                .push(n.name.clone());
        }
        // One srun per group, all at once: a slow partition does not hold up the others.
        std::thread::scope(|s| {
            let handles: Vec<_> = groups
                .iter()
                .map(|(t, names)| (names, s.spawn(move || self.discover_group(t, names))))
                .collect();
            let mut out = Discovered::new();
            for (names, h) in handles {
                match h.join() {
                    Ok(d) => out.extend(d),
                    Err(_) => out.extend(fail_all(names, "discovery failed (internal error)")),
                }
            }
            out
        })
    }

    fn discover_group(&self, target: &Target, names: &[String]) -> Discovered {
        let cfg = self.cfg;
        let exe = match std::env::current_exe() {
            Ok(p) => p,
            Err(e) => return fail_all(names, &format!("cannot find my own executable: {e}")),
        };
        let minutes = cfg.discovery_timeout.as_secs().div_ceil(60) + 1;
        // Task i runs on the i-th line of the host file (`--distribution=arbitrary`), and
        // `--label` makes srun prefix every line with the task that printed it: a record is
        // believed only for the node its task ran on. The file also keeps thousands of node
        // names out of the argument list.
        let hostfile = match HostFile::create(names) {
            Ok(h) => h,
            Err(e) => return fail_all(names, &format!("cannot write srun's host file: {e}")),
        };
        let mut cmd = self.slurm.command("srun");
        let n = names.len().to_string();
        cmd.env("SLURM_HOSTFILE", &hostfile.0)
            .arg(format!("--job-name={}", cfg.discovery_job_name))
            .arg("--distribution=arbitrary")
            // No --nodes: the host file names them, and Slurm 24.11 and later refuse
            // --nodes beside --distribution=arbitrary.
            .args(["--ntasks", &n])
            .arg(format!("--time={minutes}"))
            .args(["--label", "--quiet", "--no-kill", "--kill-on-bad-exit=0"]);
        match target {
            Target::Partition(p) if !p.is_empty() => {
                cmd.arg(format!("--partition={p}"));
            }
            Target::Partition(_) => {}
            Target::Job(j) => {
                cmd.arg(format!("--jobid={j}")).arg("--overlap");
            }
        }
        let mut copy_checks: Vec<String> = Vec::new();
        if cfg.discovery_bcast {
            // An unpredictable name in the workers' /tmp: no other user there can create it
            // first (and /tmp's sticky bit keeps them from replacing SlurmUser's copy). The
            // copy checks that it is byte for byte what was sent. It is not removed by the
            // copy itself: where /tmp is shared, one task would remove another's binary.
            let (r, sum) = match (random_hex(), super::discover::own_sha256()) {
                (Ok(r), Ok(s)) => (r, s),
                (Err(e), _) | (_, Err(e)) => {
                    return fail_all(names, &format!("cannot prepare --bcast: {e}"))
                }
            };
            cmd.arg(format!("--bcast=/tmp/cvslurm-discover.{r}"));
            copy_checks = vec!["--expect-sha256".into(), sum];
        }
        cmd.arg(&exe).arg("discover").args(&copy_checks);
        // argh takes `--option value`, not `--option=value`.
        cmd.args(["--interface-regex", cfg.interface_regex.as_str()])
            .args(["--physical-only", yes_no(cfg.interface_physical_only)])
            .args(["--require-ip", yes_no(cfg.interface_require_ip)]);
        if cfg.job_interfaces != crate::attribution::JobInterfaces::Nodes {
            // Only then: a worker with an older binary would refuse the flag.
            cmd.arg("--topology");
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        log::debug!("discovery: {cmd:?}");
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => return fail_all(names, &format!("cannot run srun: {e}")),
        };
        let wanted: BTreeSet<String> = names.iter().cloned().collect();
        let (tx, rx) = mpsc::channel::<(Option<usize>, Result<DiscoverRecord, String>)>();
        let stdout = child.stdout.take().expect("piped");
        let reader = std::thread::spawn(move || {
            // Each task's unfinished record is bounded (4 MiB), and there is one reader per
            // task label that appears.
            let mut readers: std::collections::HashMap<Option<usize>, RecordReader> =
                std::collections::HashMap::new();
            read_lines_capped(stdout, MAX_RECORD_BYTES, |line| {
                let (task, text) = split_label(line);
                // discover starts its record on a fresh line: blank lines are not garbage.
                if !text.trim().is_empty() {
                    // One reader per task: a worker's parts never mix with another task's.
                    let r = readers.entry(task).or_insert_with(|| {
                        RecordReader::new(MAX_RECORD_BYTES, 4 * MAX_RECORD_BYTES)
                    });
                    if let Some(r) = r.push(text) {
                        let _ = tx.send((task, r));
                    }
                }
            });
        });
        let stderr = child.stderr.take().expect("piped");
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.take(64 * 1024).read_to_string(&mut s);
            s
        });
        let deadline = Instant::now() + cfg.discovery_timeout;
        let mut got = Discovered::new();
        let mut garbage = 0usize;
        let mut last_garbage = String::new();
        let mut timed_out = false;
        loop {
            if self.stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
                timed_out = !self.stop.load(Ordering::Relaxed);
                terminate(&mut child);
                break;
            }
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok((task, Ok(rec))) => {
                    let ran_on = task.and_then(|t| names.get(t));
                    if ran_on != Some(&rec.node_name) {
                        garbage += 1;
                        last_garbage = match ran_on {
                            Some(n) => format!(
                                "the worker on node {n} sent a record for node {:?}; dropped",
                                rec.node_name
                            ),
                            None => format!(
                                "a record without srun's task label for node {:?}",
                                rec.node_name
                            ),
                        };
                        log::warn!("discovery: {last_garbage}");
                    } else if wanted.contains(&rec.node_name) && !got.contains_key(&rec.node_name) {
                        got.insert(rec.node_name.clone(), Ok(rec));
                    } else {
                        garbage += 1;
                        last_garbage = format!("unexpected record for node {:?}", rec.node_name);
                    }
                }
                Ok((_, Err(e))) => {
                    garbage += 1;
                    last_garbage = e;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        // srun ends soon after its output does; one that lingers (a worker that flooded past
        // the read cap and blocks on a full pipe) is stopped.
        let grace = (Instant::now() + Duration::from_secs(5)).min(deadline.max(Instant::now()));
        while Instant::now() < grace && matches!(child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if matches!(child.try_wait(), Ok(None)) {
            terminate(&mut child);
        }
        let _ = child.wait();
        let _ = reader.join();
        let srun_err = err_reader.join().unwrap_or_default();
        let srun_err: String = srun_err
            .lines()
            .rfind(|l| !l.trim().is_empty())
            .unwrap_or("")
            .to_string();
        if garbage > 0 {
            log::warn!("discovery: {garbage} line(s) from workers were not discover records (last: {last_garbage})");
        }
        for name in names {
            if !got.contains_key(name) {
                let why = if timed_out {
                    format!(
                        "no discover record within {} s (DiscoveryTimeout)",
                        cfg.discovery_timeout.as_secs()
                    )
                } else if garbage > 0 {
                    format!("no valid discover record (workers printed {garbage} bad line(s), last: {last_garbage})")
                } else if !srun_err.is_empty() {
                    format!("no discover record; srun said: {srun_err}")
                } else {
                    "no discover record (the worker printed nothing)".to_string()
                };
                got.insert(name.clone(), Err(why));
            }
        }
        got
    }

    /// One full inventory: prints a summary; returns the exit code (1 if anything failed).
    pub fn run_once(&self) -> i32 {
        let nodes = match slurm::sinfo_nodes(&self.slurm, COMMAND_TIMEOUT) {
            Ok(n) => n,
            Err(e) => {
                log::error!("cannot list nodes: {e}");
                return 1;
            }
        };
        let (avail, unavail): (Vec<&SinfoNode>, Vec<&SinfoNode>) =
            nodes.iter().partition(|n| n.available());
        let found = self.discover(&avail);
        let mut ok_nodes = Vec::new();
        let mut failed: Vec<String> = Vec::new();
        let outbox = self
            .client
            .is_some()
            .then(|| StateDir::new(&self.cfg.state_dir));
        for (name, r) in &found {
            match r {
                Ok(rec) => {
                    if let Some(o) = &outbox {
                        save_record(o, rec);
                    }
                    ok_nodes.push(rec.to_node_config(&self.cluster))
                }
                Err(e) => {
                    log::error!("node {name}: discovery failed: {e}");
                    failed.push(name.clone());
                }
            }
        }
        let mut sent = 0;
        match &self.client {
            None => {
                for n in &ok_nodes {
                    match &self.cfg.api_server {
                        Some(s) => {
                            println!("POST https://{s}{}", crate::cloudvision::NODE_CONFIG_PATH)
                        }
                        None => println!("POST {}", crate::cloudvision::NODE_CONFIG_PATH),
                    }
                    println!("{}", serde_json::to_string_pretty(n).expect("serializes"));
                }
            }
            Some(c) => {
                let results =
                    delivery::send_all(&ok_nodes, self.cfg.max_concurrent_requests, |n| {
                        c.post_node(n, None)
                    });
                for (n, r) in ok_nodes.iter().zip(results) {
                    match r {
                        Ok(_) => sent += 1,
                        Err(e) => {
                            log::error!("node {}: not sent: {e}", n.key.id);
                            failed.push(n.key.id.clone());
                        }
                    }
                }
            }
        }
        let unavailable: Vec<String> = unavail
            .iter()
            .map(|n| format!("{} ({})", n.name, n.state))
            .collect();
        let verb = if self.client.is_some() {
            "sent"
        } else {
            "would send"
        };
        println!(
            "inventory of cluster {}: {} {verb}, {} failed{}, {} unavailable{}",
            self.cluster,
            if self.client.is_some() {
                sent
            } else {
                ok_nodes.len()
            },
            failed.len(),
            if failed.is_empty() {
                String::new()
            } else {
                format!(" ({})", failed.join(", "))
            },
            unavailable.len(),
            if unavailable.is_empty() {
                String::new()
            } else {
                format!(" ({})", unavailable.join(", "))
            },
        );
        i32::from(!failed.is_empty())
    }

    /// The service loop: node polls and reconciliation; the sender (started by
    /// [`run_service`]) delivers what they and the hooks queue. Returns the exit code when
    /// stopped: within 200 ms of SIGTERM (between polls), whatever CloudVision does — what
    /// is in flight stays in `inflight/` and the next start sends it.
    pub fn monitor(&self, outbox: &StateDir, sender: &Sender) -> i32 {
        log::info!(
            "monitoring cluster {} every {} s",
            self.cluster,
            self.cfg.poll_interval.as_secs(),
        );
        let mut known: BTreeMap<String, Seen> = BTreeMap::new();
        let mut next_poll = Instant::now();
        let every = |d: Duration| (!d.is_zero()).then_some(d);
        let mut next_reconcile = Instant::now();
        let mut next_reassert = every(self.cfg.node_reassert_interval).map(|d| Instant::now() + d);
        let follow_records = self.cfg.job_interfaces != crate::attribution::JobInterfaces::Nodes;
        let mut records = crate::resend::RecordWatch::default();
        let mut resend_on: BTreeSet<String> = BTreeSet::new();
        if follow_records {
            records.changed(outbox);
        }
        while !self.stop.load(Ordering::Relaxed) {
            systemd::notify("WATCHDOG=1");
            if next_reassert.is_some_and(|t| Instant::now() >= t) {
                let n = known
                    .values_mut()
                    .filter(|v| **v == Seen::Sent)
                    .map(|v| *v = Seen::Refresh)
                    .count();
                log::info!("re-asserting the NodeConfig of {n} node(s) (NodeReassertInterval)");
                next_reassert = every(self.cfg.node_reassert_interval).map(|d| Instant::now() + d);
                next_poll = Instant::now();
            }
            if Instant::now() >= next_poll {
                self.poll(&mut known, outbox);
                if follow_records {
                    resend_on.extend(records.changed(outbox));
                    self.resend(&mut resend_on, outbox);
                }
                sender.wake();
                next_poll = Instant::now() + self.cfg.poll_interval;
            }
            if !self.cfg.reconcile_interval.is_zero() && Instant::now() >= next_reconcile {
                match reconcile::reconcile(self.cfg, &self.slurm, &self.cluster, outbox) {
                    Ok(r) if r.started + r.ended + r.corrected > 0 => {
                        log::info!(
                            "reconcile: {} RUNNING, {} end(s) and {} correction(s) queued",
                            r.started,
                            r.ended,
                            r.corrected
                        );
                        sender.wake();
                    }
                    Ok(_) => {}
                    Err(e) => log::error!("reconcile: {e}"),
                }
                next_reconcile = Instant::now() + self.cfg.reconcile_interval;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        log::info!("stopping");
        systemd::notify("STOPPING=1");
        0
    }

    /// Queues the RUNNING again of the running jobs on nodes whose record changed (see
    /// [`crate::resend`]); the nodes stay in `nodes` until slurmctld could be asked.
    fn resend(&self, nodes: &mut BTreeSet<String>, outbox: &StateDir) {
        if nodes.is_empty() {
            return;
        }
        match crate::resend::resend_running_on(self.cfg, &self.slurm, &self.cluster, outbox, nodes)
        {
            Ok(n) => {
                if n > 0 {
                    log::info!(
                        "{n} running job(s) queued again: the inventory of their nodes changed"
                    );
                }
                nodes.clear();
            }
            Err(e) => log::error!("cannot resend the jobs on changed nodes yet: {e}"),
        }
    }

    /// One monitor poll: discover nodes that appeared, came back or are due for re-assertion;
    /// delete nodes that left.
    fn poll(&self, known: &mut BTreeMap<String, Seen>, outbox: &StateDir) {
        let nodes = match slurm::sinfo_nodes(&self.slurm, COMMAND_TIMEOUT) {
            Ok(n) => n,
            Err(e) => {
                log::error!("cannot list nodes: {e}");
                return;
            }
        };
        let present: BTreeSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        let gone: Vec<String> = known
            .keys()
            .filter(|k| !present.contains(k.as_str()))
            .cloned()
            .collect();
        for name in gone {
            known.remove(&name);
            outbox.nodes.forget(&name);
            log::info!("node {name}: left the cluster; deleting its NodeConfig");
            self.queue(outbox, Item::NodeDelete { name });
        }
        let mut to_discover = Vec::new();
        for n in &nodes {
            let was = known.get(&n.name).copied();
            if n.available() {
                if was != Some(Seen::Sent) {
                    to_discover.push(n);
                }
                continue;
            }
            match was {
                Some(Seen::Sent) | Some(Seen::Refresh) => log::info!(
                    "node {}: now {}; it will be sent again when it comes back",
                    n.name,
                    n.state
                ),
                None => log::info!("node {}: {} (not available for discovery)", n.name, n.state),
                Some(Seen::Unavailable) => {}
            }
            known.insert(n.name.clone(), Seen::Unavailable);
        }
        if to_discover.is_empty() {
            return;
        }
        for (name, r) in self.discover(&to_discover) {
            match r {
                Ok(rec) => {
                    let verb = match known.get(&name) {
                        None => "appeared",
                        Some(Seen::Refresh) => "re-asserting",
                        Some(_) => "came back",
                    };
                    log::info!(
                        "node {name}: {verb}; sending NodeConfig ({} interface(s))",
                        rec.interfaces.len()
                    );
                    known.insert(name, Seen::Sent);
                    save_record(outbox, &rec);
                    self.queue(
                        outbox,
                        Item::Node {
                            node: rec.to_node_config(&self.cluster),
                        },
                    );
                }
                Err(e) => {
                    log::warn!("node {name}: discovery failed, will retry next poll: {e}");
                    let seen = known.entry(name).or_insert(Seen::Unavailable);
                    if *seen == Seen::Sent {
                        *seen = Seen::Unavailable;
                    }
                }
            }
        }
    }

    fn queue(&self, outbox: &StateDir, item: Item) {
        if let Err(e) = outbox.queue.enqueue(&Event::new(item, (0, 0))) {
            log::error!("outbox: {e}");
        }
    }
}

/// Keeps a node's record in StateDir (for `JobInterfaces`); a failure is logged, not fatal.
fn save_record(outbox: &StateDir, rec: &DiscoverRecord) {
    if let Some(t) = &rec.topology {
        log::debug!(
            "node {}: {} GPU(s); nearest GPUs per NIC: {:?}",
            rec.node_name,
            t.gpus.len(),
            crate::topology::nic_map(t)
        );
    }
    if let Err(e) = outbox.nodes.save(rec) {
        log::error!("node {}: cannot keep its record: {e}", rec.node_name);
    }
}

/// `cvslurm inventory --monitor`, the service: starts the sender first (so hooks hand their
/// events over even while slurmctld cannot be reached), then learns the cluster name
/// (retrying until slurmctld answers) and runs [`Inventory::monitor`].
pub fn run_service(cfg: &Config, slurm: Slurm, client: Client, stop: &'static AtomicBool) -> i32 {
    let outbox = StateDir::new(&cfg.state_dir);
    log::info!("service starting; CloudVision at {}", client.base_url());
    let sender = match crate::sender::start(cfg, client.clone(), outbox.clone(), stop) {
        Ok(s) => s,
        Err(e) => {
            log::error!("cannot start the sender: {e}");
            return 1;
        }
    };
    systemd::notify("READY=1");
    let mut warned = false;
    let cluster = loop {
        match slurm::cluster_name(&slurm, COMMAND_TIMEOUT) {
            Ok(c) => break c,
            Err(e) => {
                if !warned {
                    log::error!(
                        "{e}; sending the outbox meanwhile, asking again every {} s",
                        cfg.poll_interval.as_secs()
                    );
                    warned = true;
                }
            }
        }
        let until = Instant::now() + cfg.poll_interval;
        while Instant::now() < until {
            if stop.load(Ordering::Relaxed) {
                log::info!("stopping");
                systemd::notify("STOPPING=1");
                return 0;
            }
            systemd::notify("WATCHDOG=1");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let inv = Inventory {
        cfg,
        slurm,
        cluster,
        client: Some(client),
        stop,
    };
    inv.monitor(&outbox, &sender)
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn fail_all(names: &[String], why: &str) -> Discovered {
    names
        .iter()
        .map(|n| (n.clone(), Err(why.to_string())))
        .collect()
}

/// Asks srun to stop (it cancels the step), then kills it if it lingers.
fn terminate(child: &mut std::process::Child) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let pid = Pid::from_raw(child.id() as i32);
    let _ = kill(pid, Signal::SIGTERM);
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
}

/// Calls `f` on each line (without the newline) of `r`; lines longer than `max` are passed as
/// a marker that fails to parse. Memory stays within `max` whatever the input; the total read
/// is not capped (discovery bounds it by time), so a worker that floods cannot hide the lines
/// of the others behind it.
pub fn read_lines_capped(r: impl Read, max: usize, mut f: impl FnMut(&str)) {
    let mut reader = BufReader::with_capacity(64 * 1024, r);
    let mut line: Vec<u8> = Vec::new();
    let mut overlong = false;
    loop {
        let buf = match reader.fill_buf() {
            Ok([]) => break,
            Ok(b) => b,
            Err(_) => break,
        };
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        if !overlong {
            if line.len() + chunk.len() > max {
                overlong = true;
                line.clear();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        let used = done.unwrap_or(chunk.len());
        reader.consume(used);
        if done.is_some() {
            if overlong {
                f("<line longer than the limit>");
            } else {
                f(&String::from_utf8_lossy(&line));
            }
            line.clear();
            overlong = false;
        }
    }
    if overlong {
        f("<line longer than the limit>");
    } else if !line.is_empty() {
        f(&String::from_utf8_lossy(&line));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn srun_labels_bind_lines_to_tasks() {
        assert_eq!(split_label("  3: {\"a\":1}"), (Some(3), "{\"a\":1}"));
        assert_eq!(split_label("12: x"), (Some(12), "x"));
        // A worker cannot forge its label: srun puts its own in front of whatever it prints.
        assert_eq!(split_label("2: 0: {}"), (Some(2), "0: {}"));
        assert_eq!(split_label("no label"), (None, "no label"));
        assert_eq!(split_label("n3: x"), (None, "n3: x"));
    }

    #[test]
    fn capped_lines() {
        let mut got = Vec::new();
        let input = format!("a\n{}\nb\nlast", "x".repeat(100));
        read_lines_capped(input.as_bytes(), 10, |l| got.push(l.to_string()));
        assert_eq!(got, ["a", "<line longer than the limit>", "b", "last"]);
        // An overlong last line without a newline is reported too, not dropped.
        got.clear();
        read_lines_capped(format!("a\n{}", "y".repeat(50)).as_bytes(), 10, |l| {
            got.push(l.to_string())
        });
        assert_eq!(got, ["a", "<line longer than the limit>"]);
    }
}

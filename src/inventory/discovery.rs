//! Discovery through srun: `cvslurm discover` runs on the nodes (one srun per partition, or
//! one step inside a running job for fully allocated nodes), and each node's record is read
//! back from srun's labelled output, believed only for the node its task ran on.

use super::{Discovered, Inventory};
use crate::discovery::record::{DiscoverRecord, RecordReader, MAX_RECORD_BYTES};
use crate::slurm::{self, SinfoNode, COMMAND_TIMEOUT};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read};
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

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

/// Reads srun's `--label`led output: each line goes to its task's [`RecordReader`], so a
/// worker's record parts never mix with another task's. Each task's unfinished record is
/// bounded (4 MiB), and there is one reader per task label that appears.
#[derive(Debug, Default)]
pub struct LabelledReader {
    readers: std::collections::HashMap<Option<usize>, RecordReader>,
}

impl LabelledReader {
    /// Takes one line of srun's output (without its newline); returns the task that printed
    /// it (`None`: no label) and a record, or why the line or record is bad, when one is
    /// complete.
    pub fn push(&mut self, line: &str) -> Option<(Option<usize>, Result<DiscoverRecord, String>)> {
        let (task, text) = split_label(line);
        // discover starts its record on a fresh line: blank lines are not garbage.
        if text.trim().is_empty() {
            return None;
        }
        let r = self
            .readers
            .entry(task)
            .or_insert_with(|| RecordReader::new(MAX_RECORD_BYTES, 4 * MAX_RECORD_BYTES));
        r.push(text).map(|r| (task, r))
    }
}

impl Inventory<'_> {
    /// Runs discovery on `nodes` (grouped by partition, one srun per group).
    pub fn discover(&self, nodes: &[&SinfoNode]) -> Discovered {
        // A node whose every CPU is allocated cannot take a new job, however short: srun
        // would wait for it until DiscoveryTimeout. It is reached through a step inside a job
        // that runs there (`srun --jobid=J --overlap`, no resources taken), but only a job of
        // the user running the inventory: a step runs as its job's owner, who could then
        // forge the node's record (see [`reach_busy`]).
        let busy: Vec<String> = nodes
            .iter()
            .filter(|n| n.state.eq_ignore_ascii_case("allocated"))
            .map(|n| n.name.clone())
            .collect();
        let mut in_jobs: BTreeMap<Target, Vec<String>> = BTreeMap::new();
        let mut out_of_reach = Discovered::new();
        if !busy.is_empty() {
            match slurm::running_jobs_on(&self.slurm, &busy, COMMAND_TIMEOUT) {
                Ok(jobs) => {
                    let me = nix::unistd::geteuid().as_raw();
                    let (mine, others) = reach_busy(&busy, &jobs, me);
                    for (job, ns) in mine {
                        in_jobs.insert(Target::Job(job), ns);
                    }
                    out_of_reach = others;
                    // Nodes that published their own record (`WorkerRecords=yes`).
                    if self.cfg.worker_records {
                        super::published::take_published(&self.slurm, self.cfg, &mut out_of_reach);
                    }
                }
                Err(e) => log::warn!("discovery: cannot list the jobs on allocated nodes: {e}"),
            }
            let through: Vec<String> = in_jobs
                .iter()
                .map(|(t, ns)| match t {
                    Target::Job(j) => format!("job {j} ({})", crate::slurm::hostlist::compress(ns)),
                    Target::Partition(p) => format!("partition {p}"),
                })
                .collect();
            log::debug!(
                "discovery: {} node(s) fully allocated ({}); reached through {}",
                busy.len(),
                crate::slurm::hostlist::compress(&busy),
                if through.is_empty() {
                    "no job of this user".to_string()
                } else {
                    through.join(", ")
                }
            );
        }
        let placed: BTreeSet<&String> = in_jobs
            .values()
            .flatten()
            .chain(out_of_reach.keys())
            .collect();
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
            let mut out = out_of_reach;
            for (names, h) in handles {
                match h.join() {
                    Ok(d) => out.extend(d),
                    Err(_) => out.extend(fail_all(names, "discovery failed (internal error)")),
                }
            }
            // A MAC belongs to one node: a record that claims another node's is held.
            let stored = crate::state::StateDir::new(&self.cfg.state_dir).nodes.all();
            super::mac_claims::hold_claimed_macs(&mut out, &stored);
            // So does a host name, where NodeConfigs carry the reported one.
            if self.cfg.node_hostname == crate::config::NodeHostname::HostName {
                for why in super::mac_claims::drop_claimed_hostnames(&mut out, &stored).values() {
                    log::warn!("{}", crate::logging::escape_control(why));
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
        if let (true, Some(dir)) = (cfg.discovery_bcast, &cfg.discovery_bcast_dir) {
            // Into DiscoveryBcastDir, which only root and this user may write on the workers:
            // srun's command line (the copy's name included) is every user's to see, so a
            // shared directory such as /tmp would let another user create the file first
            // (config.rs refuses DiscoveryBcast without it). The random name keeps concurrent
            // discoveries apart. The copy checks its own directory and that it is byte for
            // byte what was sent (against a mistaken directory and a bad transfer; a planted
            // copy would run its own code). It is not removed by the copy itself: where the
            // directory is shared, one task would remove another's binary.
            let (r, sum) = match (random_hex(), crate::discovery::own_sha256()) {
                (Ok(r), Ok(s)) => (r, s),
                (Err(e), _) | (_, Err(e)) => {
                    return fail_all(names, &format!("cannot prepare --bcast: {e}"))
                }
            };
            cmd.arg(format!(
                "--bcast={}",
                dir.join(format!("cvslurm-discover.{r}")).display()
            ));
            copy_checks = vec!["--expect-sha256".into(), sum];
        }
        cmd.arg(&exe).arg("discover").args(&copy_checks);
        // argh takes `--option value`, not `--option=value`.
        cmd.args(["--interface-regex", cfg.interface_regex.as_str()])
            .args(["--physical-only", yes_no(cfg.interface_physical_only)])
            .args(["--require-ip", yes_no(cfg.interface_require_ip)]);
        if cfg.job_interfaces != crate::config::JobInterfaces::Nodes {
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
            let mut records = LabelledReader::default();
            read_lines_capped(stdout, MAX_RECORD_BYTES, |line| {
                if let Some(r) = records.push(line) {
                    let _ = tx.send(r);
                }
            });
        });
        let stderr = child.stderr.take().expect("piped");
        // Read to its end, the first 64 KiB kept: a pipe closed under srun kills it with
        // SIGPIPE, and with it every task of the step (one noisy worker, the whole partition).
        let err_reader = std::thread::spawn(move || {
            crate::slurm::runner::drain_capped(stderr, crate::slurm::runner::STDERR_KEPT)
                .unwrap_or_default()
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
                        if let Some(e) = &rec.topology_error {
                            log::warn!(
                                "node {}: no GPU topology (its jobs go by node name): {e}",
                                rec.node_name
                            );
                        }
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
        let (srun_err, dropped) = err_reader.join().unwrap_or_default();
        if dropped > 0 {
            log::warn!(
                "discovery ({}): srun wrote {} bytes on stderr: the first {} kept, {dropped} dropped",
                target_text(target),
                srun_err.len() as u64 + dropped,
                srun_err.len()
            );
        }
        let srun_err: String = String::from_utf8_lossy(&srun_err)
            .lines()
            .rfind(|l| !l.trim().is_empty())
            .map(|l| crate::text::one_line(l, 300))
            .unwrap_or_default();
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
}

/// Which fully allocated nodes discovery can reach, and how: a step in a running job of the
/// user running the inventory (`me`), one srun per job. A node held only by other users' jobs
/// is not discovered (its error says why): Slurm refuses a step in another user's job (root
/// and SlurmUser alike, measured on 22.05: "Access/permission denied"), and a step there would
/// run as that job's owner, who could write into its output and forge the node's record.
/// Nodes without a running job are in neither list (they get a new job in their partition).
fn reach_busy(
    busy: &[String],
    jobs: &[slurm::RunningJob],
    me: u32,
) -> (BTreeMap<String, Vec<String>>, Discovered) {
    let mut left: BTreeSet<&str> = busy.iter().map(String::as_str).collect();
    let mut mine: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for j in jobs.iter().filter(|j| j.uid == me) {
        for n in &j.nodes {
            if left.remove(n.as_str()) {
                mine.entry(j.id.clone()).or_default().push(n.clone());
            }
        }
    }
    let mut others = Discovered::new();
    for j in jobs.iter().filter(|j| j.uid != me) {
        for n in &j.nodes {
            if left.remove(n.as_str()) {
                others.insert(
                    n.clone(),
                    Err(format!(
                        "fully allocated by job {} of another user (uid {}): discovery runs no \
                         step in another user's job (Slurm refuses it, and the step would run as \
                         that user, who could forge this node's record); it is discovered when \
                         it has a free CPU, and keeps its last NodeConfig and record meanwhile",
                        j.id, j.uid
                    )),
                );
            }
        }
    }
    (mine, others)
}

/// `partition p1`, `job 12`: where a discovery srun ran, for the log.
fn target_text(t: &Target) -> String {
    match t {
        Target::Partition(p) if p.is_empty() => "the default partition".to_string(),
        Target::Partition(p) => format!("partition {}", crate::text::one_line(p, 100)),
        Target::Job(j) => format!("job {}", crate::text::one_line(j, 40)),
    }
}

/// `yes` or `no`, as cloudvision.conf and `discover` write a flag.
pub(crate) fn yes_no(b: bool) -> &'static str {
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

    /// Fully allocated nodes are reached only through jobs of the inventory's own user; a node
    /// held by another user's job fails at once, naming the job and why.
    #[test]
    fn busy_nodes_are_reached_only_through_own_jobs() {
        let job = |id: &str, uid, nodes: &[&str]| slurm::RunningJob {
            id: id.into(),
            uid,
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
        };
        let busy: Vec<String> = ["n1", "n2", "n3", "n4"].map(String::from).to_vec();
        let jobs = [
            job("7", 1000, &["n1", "n2"]),
            job("8", 0, &["n2", "n3"]),
            job("9", 0, &["n3", "n9"]),
        ];
        let (mine, others) = reach_busy(&busy, &jobs, 0);
        assert_eq!(
            mine,
            BTreeMap::from([("8".to_string(), vec!["n2".to_string(), "n3".to_string()])])
        );
        assert_eq!(others.keys().collect::<Vec<_>>(), ["n1"]);
        let e = others["n1"].as_ref().unwrap_err();
        assert!(
            e.starts_with("fully allocated by job 7 of another user (uid 1000): discovery runs no step in another user's job"),
            "{e}"
        );
        // n4 has no running job: neither list (a new job in its partition).
        let (mine, others) = reach_busy(&busy, &jobs, 1000);
        assert_eq!(mine["7"], ["n1", "n2"]);
        assert_eq!(others.keys().collect::<Vec<_>>(), ["n3"]);
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

//! `cvslurm publish`: run on a worker by its slurmd, as `HealthCheckProgram` (link name
//! `cvslurm-publish`), to publish the node's own discover record in its Slurm `Extra` field
//! ([`crate::discovery::published`]), where the controllers' inventory takes it for a node
//! whose every CPU is held by another user's job (`WorkerRecords=yes`,
//! [`crate::inventory::published`]). The token never comes here: Slurm carries the record.
//!
//! slurmd runs its HealthCheckProgram as root with no arguments and only `SLURMD_NODENAME`
//! in the environment, once before it registers (and waits for it, up to 60 s) and then every
//! `HealthCheckInterval`. So the mode returns at once and a child in a session of its own
//! does the work: it waits until slurmctld shows this slurmd's registration (a record is
//! believed only when taken in a later second than `SlurmdStartTime`), discovers, and writes
//! the record with `scontrol update NodeName=… Extra=…` when it changed or is not fresh.
//! It writes nothing over an `Extra` that holds something else (the site's own data).

use crate::config::Config;
use crate::discovery::published;
use crate::discovery::record::DiscoverRecord;
use crate::discovery::topology::Roots;
use crate::discovery::{discover, Filter};
use crate::slurm::{self, runner::Slurm};
use argh::FromArgs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The long flags of `cvslurm publish` (`--help` aside), for `cvslurm --list-flags publish`;
/// a unit test in [`crate::cli`] holds it to [`Args`].
pub const FLAGS: &[&str] = &["--node-name", "--foreground"];

/// Publish this node's network interfaces in its Slurm Extra field (run by slurmd as
/// HealthCheckProgram).
#[derive(FromArgs, Debug, Default)]
#[argh(subcommand, name = "publish", help_triggers("-h", "--help", "help"))]
pub struct Args {
    /// node name (default $SLURMD_NODENAME)
    #[argh(option)]
    node_name: Option<String>,
    /// do the work before returning, and say what happened on stderr (default: return at
    /// once and log to syslog, as slurmd needs)
    #[argh(switch)]
    foreground: bool,
}

/// How long the child waits for slurmctld to show this slurmd's registration.
const WAIT_FOR_REGISTRATION: Duration = Duration::from_secs(180);
/// The time one Slurm command may take here.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs `cvslurm publish`: 0 once the child is on its way (or, with `--foreground`, once the
/// record is published or already there); 1 when it cannot; 2 on a usage error.
pub fn run(a: Args) -> i32 {
    let node = match a
        .node_name
        .clone()
        .or_else(|| std::env::var("SLURMD_NODENAME").ok())
        .filter(|n| !n.is_empty())
    {
        Some(n) if valid_node_name(&n) => n,
        Some(n) => {
            eprintln!(
                "cvslurm publish: node name {:?} refused (1-255 bytes, no whitespace, '=' or control characters)",
                crate::text::one_line(&n, 80)
            );
            return 2;
        }
        None => {
            eprintln!("cvslurm publish: SLURMD_NODENAME is not set: run it as slurmd's HealthCheckProgram, or give --node-name");
            return 2;
        }
    };
    // Read before the fork: the parent is slurmd when slurmd runs this.
    let slurmd = parent_slurmd();
    if !a.foreground {
        match detach() {
            Ok(true) => return 0,
            Ok(false) => {}
            Err(e) => {
                eprintln!(
                    "cvslurm publish: cannot start its worker process ({e}): nothing published"
                );
                return 1;
            }
        }
    }
    let say = |err: bool, msg: &str| {
        if a.foreground {
            eprintln!("cvslurm publish: {msg}");
        } else {
            syslog(err, msg);
        }
    };
    match publish(&node, slurmd.as_ref()) {
        Ok(msg) => {
            say(false, &msg);
            0
        }
        Err(e) => {
            say(true, &format!("node {node}: {e}"));
            1
        }
    }
}

/// The slurmd that runs this program: its start (epoch seconds, rounded down) and the
/// directory of its Slurm commands (`../bin` beside its `sbin`), when the parent is slurmd.
#[derive(Debug)]
struct Slurmd {
    started: i64,
    bin_dir: Option<PathBuf>,
}

fn parent_slurmd() -> Option<Slurmd> {
    let ppid = nix::unistd::getppid().as_raw();
    let comm = std::fs::read_to_string(format!("/proc/{ppid}/comm")).ok()?;
    if comm.trim_end() != "slurmd" {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{ppid}/stat")).ok()?;
    // Field 22 (starttime, clock ticks after boot); fields from 3 on follow the last ')'.
    let ticks: i64 = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()?;
    let btime: i64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|h| *h > 0)
        .unwrap_or(100);
    let bin_dir = std::fs::read_link(format!("/proc/{ppid}/exe"))
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("bin")))
        .filter(|d| d.join("scontrol").is_file());
    Some(Slurmd {
        started: btime + ticks / hz,
        bin_dir,
    })
}

/// Forks: true in the parent (which returns), false in the child, which leads a session of
/// its own with stdin, stdout and stderr on /dev/null (slurmd reads its program's output to
/// the end and kills the program's process group when the program returns).
fn detach() -> Result<bool, String> {
    use nix::unistd::{fork, setsid, ForkResult};
    // SAFETY: no thread has been started yet in this process.
    match unsafe { fork() }.map_err(|e| e.to_string())? {
        ForkResult::Parent { .. } => Ok(true),
        ForkResult::Child => {
            let _ = setsid();
            if let Ok(null) = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
            {
                let _ = nix::unistd::dup2_stdin(&null);
                let _ = nix::unistd::dup2_stdout(&null);
                let _ = nix::unistd::dup2_stderr(&null);
            }
            Ok(false)
        }
    }
}

/// One line to the system log (`/dev/log`, facility daemon), where slurmd's node keeps its
/// logs; nothing when there is none.
fn syslog(err: bool, msg: &str) {
    let pri = 3 * 8 + if err { 3 } else { 6 };
    let line = format!(
        "<{pri}>cvslurm-publish[{}]: {}",
        std::process::id(),
        crate::text::one_line(msg, 900)
    );
    if let Ok(s) = std::os::unix::net::UnixDatagram::unbound() {
        let _ = s.send_to(line.as_bytes(), "/dev/log");
    }
}

fn valid_node_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 255
        && !n
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '=')
}

/// Waits for the registration, discovers and publishes; what it did, or why it could not.
fn publish(node: &str, slurmd: Option<&Slurmd>) -> Result<String, String> {
    let cfg = Config::load(None).unwrap_or_default();
    let bin_dir = slurmd
        .and_then(|s| s.bin_dir.clone())
        .or_else(|| cfg.slurm_bin_dir.clone());
    let slurm = Slurm::new(bin_dir.as_deref());
    let (listed, start) = wait_for_registration(&slurm, node, slurmd.map(|s| s.started))?;
    if let Some(x) = listed.extra.as_deref() {
        if !published::is_published(x) {
            return Err(format!(
                "its Extra field holds the site's own data ({}); not overwritten: clear it \
                 (scontrol update NodeName={node} Extra=) to let cvslurm publish here",
                crate::text::one_line(x, 60)
            ));
        }
    }
    let filter = Filter {
        name_regex: cfg.interface_regex.clone(),
        physical_only: cfg.interface_physical_only,
        require_ip: cfg.interface_require_ip,
    };
    let roots = Roots::under(Path::new("/"));
    let topology = (cfg.job_interfaces != crate::config::JobInterfaces::Nodes).then_some(&roots);
    let rec = discover(Some(node), &roots.sys.join("class/net"), &filter, topology)?;
    let old = listed
        .extra
        .as_deref()
        .and_then(|x| published::decode(x).ok());
    if let Some(old) = old.filter(|o| {
        crate::inventory::freshness::not_fresh(o.taken_at, Some(start)).is_none()
            && same_but_time(o, &rec)
    }) {
        return Ok(format!(
            "node {node}: its published record (taken {}) is fresh and unchanged; nothing to do",
            old.taken_at.unwrap_or_default()
        ));
    }
    let value = published::encode(&rec)?;
    let extra = format!("Extra={value}");
    let name = format!("NodeName={node}");
    slurm
        .run("scontrol", &["update", &name, &extra], COMMAND_TIMEOUT)
        .map_err(|e| format!("scontrol update {name} Extra=… failed: {e}"))?;
    Ok(format!(
        "node {node}: published its record ({} interface(s), {} bytes)",
        rec.interfaces.len(),
        value.len()
    ))
}

fn same_but_time(a: &DiscoverRecord, b: &DiscoverRecord) -> bool {
    let strip = |r: &DiscoverRecord| DiscoverRecord {
        taken_at: None,
        ..r.clone()
    };
    strip(a) == strip(b)
}

/// Waits until slurmctld shows this node's slurmd as registered (its `SlurmdStartTime` not
/// before `started`, the start of the slurmd that runs this program, when known) and the
/// clock is past that second; returns the node's listing and that start.
fn wait_for_registration(
    slurm: &Slurm,
    node: &str,
    started: Option<i64>,
) -> Result<(slurm::Published, i64), String> {
    let until = Instant::now() + WAIT_FOR_REGISTRATION;
    let nodes = [node.to_string()];
    loop {
        let last;
        match slurm::published(slurm, &nodes, COMMAND_TIMEOUT) {
            Ok(mut m) => match m.remove(node) {
                Some(p) => match p.start {
                    Some(s) if started.is_some_and(|st| s < st) => {
                        last = "slurmctld shows the start of an earlier slurmd".into();
                    }
                    Some(s) if crate::timefmt::now_epoch() > s => return Ok((p, s)),
                    Some(_) => last = "its slurmd registered this second".into(),
                    None => last = "its slurmd has not registered".into(),
                },
                None => last = "slurmctld does not list it".into(),
            },
            Err(e) => last = e,
        }
        if Instant::now() >= until {
            return Err(format!(
                "not published: its slurmd's registration not seen in {} s ({last})",
                WAIT_FOR_REGISTRATION.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_from_slurmd_are_checked() {
        assert!(valid_node_name("n4"));
        assert!(valid_node_name("gpu-a100-017"));
        for bad in ["", "n4 Extra=x", "a=b", "n\n4", &"x".repeat(256)] {
            assert!(!valid_node_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_record_differs_only_by_its_time_is_the_same() {
        let r = DiscoverRecord {
            node_name: "n4".into(),
            hostname: "n4".into(),
            location: None,
            interfaces: vec![],
            topology: None,
            topology_error: None,
            taken_at: Some(5),
        };
        let later = DiscoverRecord {
            taken_at: Some(9),
            ..r.clone()
        };
        assert!(same_but_time(&r, &later));
        let other = DiscoverRecord {
            hostname: "n5".into(),
            ..r.clone()
        };
        assert!(!same_but_time(&r, &other));
    }
}

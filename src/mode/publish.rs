//! `cvslurm publish`: run on a worker by its slurmd, as `HealthCheckProgram` (link name
//! `cvslurm-publish`), to publish the node's own discover record in its Slurm `Extra` field
//! ([`crate::discovery::published`]), where the controllers' inventory takes it for a node
//! whose every CPU is held by another user's job (`WorkerRecords=yes`,
//! [`crate::inventory::published`]). The token never comes here: Slurm carries the record.
//!
//! slurmd runs its HealthCheckProgram as root with no arguments and only `SLURMD_NODENAME`
//! in the environment, once before it registers (and waits for it, up to 60 s) and then every
//! `HealthCheckInterval`, on every node at once. So the mode returns at once and a child in a
//! session of its own does the work, at a cost that does not grow with the cluster: no
//! listing of every node (`scontrol show node` asks for all of them), one single-node `sinfo`
//! and one `scontrol update` only when the record changed or the node's slurmd is new, and
//! nothing at all otherwise (a record of what it published, `/run/cvslurm-publish/`). A
//! record is believed only when taken in a later second than the node's `SlurmdStartTime`,
//! which slurmd stamps into its first registration right after the health check returns: at
//! slurmd's start the child first waits [`REGISTRATION_MARGIN`]. It writes nothing over an
//! `Extra` that holds something else (the site's own data).

use crate::config::Config;
use crate::discovery::published;
use crate::discovery::record::DiscoverRecord;
use crate::discovery::topology::Roots;
use crate::discovery::{discover, Filter};
use crate::slurm::runner::Slurm;
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

/// How long after this program was started the child discovers, when slurmd started within
/// [`START_WINDOW`]: slurmd stamps `SlurmdStartTime` into its first registration, which it
/// builds right after its health check returned (`slurmd.c`: `run_script_health_check()`,
/// then `_registration_engine`), so a record taken 2 s later is in a later second than that
/// start as long as slurmd registered within a second of the program's return.
const REGISTRATION_MARGIN: Duration = Duration::from_secs(2);
/// A slurmd started less than this long ago may not have registered yet.
const START_WINDOW: i64 = 180;
/// A record taken this long after slurmd's process started is surely from after its
/// registration (slurmd waits up to 60 s for its health check): one published earlier is
/// published again at the next run, so that a record taken too early does not stay.
const FRESH_AFTER: i64 = 120;
/// The time one Slurm command may take here.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);
/// Where the child keeps what it last published, one file per node (root's, on tmpfs).
const CACHE_DIR: &str = "/run/cvslurm-publish";

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
    // Read before the fork: the parent is slurmd (or a site's health check under it).
    let slurmd = slurmd_ancestor();
    let began = Instant::now();
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
    match publish(&node, slurmd.as_ref(), began) {
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

/// The slurmd that runs this program (its parent, or an ancestor: a site health check that
/// calls `cvslurm-publish`): its start (epoch seconds, rounded down) and the directory of its
/// Slurm commands (`../bin` beside its `sbin`).
#[derive(Debug)]
struct Slurmd {
    started: i64,
    bin_dir: Option<PathBuf>,
}

/// The nearest slurmd among this process's ancestors (at most 8 up).
fn slurmd_ancestor() -> Option<Slurmd> {
    use crate::slurm::ctld_process::{boot_time, parse_stat, ticks_per_second};
    let mut pid = nix::unistd::getppid().as_raw();
    for _ in 0..8 {
        if pid <= 1 {
            return None;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (name, _, ticks) = parse_stat(&stat)?;
        if name == "slurmd" {
            return Some(Slurmd {
                started: i64::try_from(boot_time()? + ticks / ticks_per_second()).ok()?,
                bin_dir: std::fs::read_link(format!("/proc/{pid}/exe"))
                    .ok()
                    .and_then(|exe| Some(exe.parent()?.parent()?.join("bin")))
                    .filter(|d| d.join("sinfo").is_file()),
            });
        }
        // Field 4, the parent, follows the state after the last ')'.
        pid = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
    }
    None
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
            .any(|c| c.is_whitespace() || c.is_control() || c == '=' || c == '/')
}

/// Discovers and publishes (past slurmd's registration); what it did, or why it could not.
fn publish(node: &str, slurmd: Option<&Slurmd>, began: Instant) -> Result<String, String> {
    if slurmd.is_some_and(|s| crate::timefmt::now_epoch() - s.started < START_WINDOW) {
        std::thread::sleep((began + REGISTRATION_MARGIN).saturating_duration_since(Instant::now()));
    }
    let cfg = Config::load(None).unwrap_or_default();
    let filter = Filter {
        name_regex: cfg.interface_regex.clone(),
        physical_only: cfg.interface_physical_only,
        require_ip: cfg.interface_require_ip,
    };
    let roots = Roots::under(Path::new("/"));
    let topology = (cfg.job_interfaces != crate::config::JobInterfaces::Nodes).then_some(&roots);
    let rec = discover(Some(node), &roots.sys.join("class/net"), &filter, topology)?;
    // Unchanged since this slurmd's last run, and published surely after its registration:
    // nothing to ask or write.
    if let Some(s) = slurmd {
        if let Some(c) = read_cache(node).filter(|c| {
            c.slurmd_started == s.started
                && same_but_time(&c.record, &rec)
                && c.record
                    .taken_at
                    .is_some_and(|t| t >= s.started + FRESH_AFTER)
        }) {
            return Ok(format!(
                "node {node}: unchanged since its record of {} was published; nothing to do",
                c.record.taken_at.unwrap_or_default()
            ));
        }
    }
    let bin_dir = slurmd
        .and_then(|s| s.bin_dir.clone())
        .or_else(|| cfg.slurm_bin_dir.clone());
    let slurm = Slurm::new(bin_dir.as_deref());
    if let Some(x) = current_extra(&slurm, node)? {
        if !published::is_published(&x) {
            return Err(format!(
                "its Extra field holds the site's own data ({}); not overwritten: clear it \
                 (scontrol update NodeName={node} Extra=) to let cvslurm publish here",
                crate::text::one_line(&x, 60)
            ));
        }
    }
    let value = published::encode(&rec)?;
    let extra = format!("Extra={value}");
    let name = format!("NodeName={node}");
    slurm
        .run("scontrol", &["update", &name, &extra], COMMAND_TIMEOUT)
        .map_err(|e| format!("scontrol update {name} Extra=… failed: {e}"))?;
    if let Some(s) = slurmd {
        write_cache(
            node,
            &Cache {
                slurmd_started: s.started,
                record: rec.clone(),
            },
        );
    }
    Ok(format!(
        "node {node}: published its record ({} interface(s), {} bytes)",
        rec.interfaces.len(),
        value.len()
    ))
}

/// The node's `Extra` as slurmctld has it, from `sinfo -n NODE -O Extra:0`: one node asked
/// (REQUEST_NODE_INFO_SINGLE), not all of them as `scontrol show node` does. `None`: empty.
fn current_extra(slurm: &Slurm, node: &str) -> Result<Option<String>, String> {
    let out = slurm.run(
        "sinfo",
        &["--all", "-h", "-N", "-n", node, "-O", "Extra:0"],
        COMMAND_TIMEOUT,
    )?;
    parse_extra(&out).ok_or_else(|| {
        format!(
            "sinfo does not list node {node} (one value per line expected): {}",
            crate::text::one_line(&out, 120)
        )
    })
}

/// The one `Extra` value of sinfo's lines (the node once per partition): `None` inside when
/// empty or `(null)`; `None` outside when no line or lines that differ.
fn parse_extra(out: &str) -> Option<Option<String>> {
    let mut lines = out.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next()?;
    if lines.any(|l| l != first) {
        return None;
    }
    Some((first != "(null)").then(|| first.to_string()))
}

/// What the child last published for a node, under the slurmd that ran it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Cache {
    slurmd_started: i64,
    record: DiscoverRecord,
}

fn cache_path(node: &str) -> PathBuf {
    Path::new(CACHE_DIR).join(format!("{node}.json"))
}

/// The cache file, read without following a link, at most 1 MiB, parsed and checked as a
/// record from a worker; `None` when there is none to trust.
fn read_cache(node: &str) -> Option<Cache> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(cache_path(node))
        .ok()?;
    let mut text = String::new();
    f.take(1 << 20).read_to_string(&mut text).ok()?;
    let c: Cache = serde_json::from_str(&text).ok()?;
    c.record.validate().ok()?;
    Some(c)
}

/// Writes the cache file (temp file and rename, in a directory only root writes); a failure
/// costs one more `sinfo` and `scontrol update` next time.
fn write_cache(node: &str, c: &Cache) {
    use std::os::unix::fs::DirBuilderExt;
    let _ = std::fs::DirBuilder::new().mode(0o700).create(CACHE_DIR);
    let Ok(text) = serde_json::to_vec(c) else {
        return;
    };
    let _ = crate::state::durable::replace(&cache_path(node), &text, None);
}

fn same_but_time(a: &DiscoverRecord, b: &DiscoverRecord) -> bool {
    let strip = |r: &DiscoverRecord| DiscoverRecord {
        taken_at: None,
        ..r.clone()
    };
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_from_slurmd_are_checked() {
        assert!(valid_node_name("n4"));
        assert!(valid_node_name("gpu-a100-017"));
        for bad in ["", "n4 Extra=x", "a=b", "n\n4", "../n4", &"x".repeat(256)] {
            assert!(!valid_node_name(bad), "{bad:?}");
        }
    }

    /// `sinfo -h -N -n NODE -O Extra:0` as 24.11 printed it for a node without Extra (one
    /// line per partition the node is in), a published record and a site's words.
    #[test]
    fn extra_from_sinfo() {
        assert_eq!(parse_extra("(null)\n"), Some(None));
        assert_eq!(parse_extra("(null)\n(null)\n"), Some(None));
        assert_eq!(
            parse_extra("cvslurm1:eyJ9\ncvslurm1:eyJ9\n"),
            Some(Some("cvslurm1:eyJ9".into()))
        );
        assert_eq!(
            parse_extra("rack 4, row 2   \n"),
            Some(Some("rack 4, row 2".into()))
        );
        assert_eq!(parse_extra(""), None);
        assert_eq!(parse_extra("a\nb\n"), None);
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

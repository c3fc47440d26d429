//! This host's slurmctld as `/proc` shows it: its process id and when it started.
//!
//! "This host's" is a process named `slurmctld` (`/proc/PID/stat`), not a zombie, in this
//! process's network namespace (the host's network, where its slurmctld listens: a slurmctld
//! in a container or another namespace with a network of its own is another host's; a
//! process whose namespace cannot be read counts).
//!
//! When it started is `/proc/PID/stat`'s start time (clock ticks since boot) plus the boot
//! time (`/proc/stat` `btime`, whole seconds): at most about 1 s earlier than the truth, never
//! later. An `execve` keeps the process's start time: a slurmctld that Slurm 23.11+ restarted
//! in place (`scontrol reconfigure`) shows the time it first started.

use std::io::Read;

/// This host's slurmctld.
#[derive(Debug, Clone, PartialEq)]
pub struct Slurmctld {
    /// Its process id.
    pub pid: u32,
    /// When it started, Unix seconds (at most ~1 s early, see the module's note).
    pub started: f64,
}

/// The parts of `/proc/PID/stat` used here: the name, the state letter and the start time in
/// clock ticks since boot; `None` when the text is not such a line. The name may hold `)` and
/// spaces: it runs from the first `(` to the last `)`.
pub fn parse_stat(stat: &str) -> Option<(&str, char, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    if open >= close {
        return None;
    }
    let name = &stat[open + 1..close];
    let mut rest = stat[close + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    // After the state: fields 4..=21 (18 of them), then field 22, the start time.
    let start = rest.nth(18)?.parse().ok()?;
    Some((name, state, start))
}

/// `/proc/stat`'s `btime`: when this machine booted, Unix seconds.
pub fn boot_time() -> Option<u64> {
    let text = read_capped("/proc/stat", 1 << 20).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
fn ticks_per_second() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|t| u64::try_from(t).ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
}

/// Every process named `slurmctld` on this host (see the module's note), in `/proc`'s order;
/// `Err` when `/proc` cannot be listed.
pub fn find_here() -> Result<Vec<Slurmctld>, String> {
    let entries = std::fs::read_dir("/proc").map_err(|e| format!("cannot list /proc: {e}"))?;
    let net = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
    let mine = net("self");
    let boot = boot_time();
    let hz = ticks_per_second() as f64;
    let mut found = Vec::new();
    for e in entries.flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // At most 4 KiB: `pid (comm) state …`.
        let Ok(stat) = read_capped(&format!("/proc/{pid}/stat"), 4096) else {
            continue;
        };
        let Some((name, state, start)) = parse_stat(&stat) else {
            continue;
        };
        if name != "slurmctld" || matches!(state, 'Z' | 'X') {
            continue;
        }
        if let (Some(a), Some(b)) = (&mine, net(&pid)) {
            if *a != b {
                continue;
            }
        }
        let Ok(pid) = pid.parse() else { continue };
        found.push(Slurmctld {
            pid,
            started: boot.map_or(0.0, |b| b as f64 + start as f64 / hz),
        });
    }
    Ok(found)
}

/// At most `cap` bytes of a text file.
pub(crate) fn read_capped(path: &str, cap: u64) -> std::io::Result<String> {
    let mut s = String::new();
    std::fs::File::open(path)?
        .take(cap)
        .read_to_string(&mut s)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines() {
        let line =
            "3254 (slurmctld) S 1 3254 3254 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 9 0 1853231 1 2";
        assert_eq!(parse_stat(line), Some(("slurmctld", 'S', 1853231)));
        // a name with ") " and spaces inside
        let odd = "7 (a) b (c) Z 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 42 0";
        assert_eq!(parse_stat(odd), Some(("a) b (c", 'Z', 42)));
        assert_eq!(parse_stat("7 (x) S 1 2"), None);
        assert_eq!(parse_stat(") (x"), None);
        assert_eq!(parse_stat(""), None);
    }

    /// This test's own process, seen as `find_here` sees any: its start lies between boot
    /// and now.
    #[test]
    fn own_start_time_from_proc() {
        let stat = read_capped("/proc/self/stat", 4096).unwrap();
        let (_, _, start) = parse_stat(&stat).unwrap();
        let boot = boot_time().unwrap() as f64;
        let started = boot + start as f64 / ticks_per_second() as f64;
        let now = crate::timefmt::now_epoch() as f64;
        assert!(started >= boot && started <= now + 1.0, "{started} {now}");
        assert!(find_here().is_ok());
    }
}

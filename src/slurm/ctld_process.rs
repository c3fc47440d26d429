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
//!
//! Any local user can start a process named `slurmctld`, and listen on SlurmctldPort while the
//! real one is down. [`find_trusted`] keeps only one that runs as SlurmUser (real and
//! effective uid) from an installed binary (owned by root, writable by nobody else, its file
//! name starting with `slurmctld`); [`owns_listening`] tells whether the listening socket an
//! answer on the port comes from is SlurmUser's (its owner uid in `/proc/net/tcp{,6}`, or its
//! inode among such a process's `/proc/PID/fd`).

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
pub fn ticks_per_second() -> u64 {
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

/// Why process `pid` is not a slurmctld to trust, from its uids (real, effective: the `Uid:`
/// line of `/proc/PID/status`), SlurmUser's uid `want`, and its executable's owner, mode and
/// file name (`/proc/PID/exe`; `None`: it cannot be read); `Ok` when it is one.
pub fn trust_verdict(
    uids: Option<(u32, u32)>,
    want: u32,
    exe: Option<(u32, u32, &str)>,
) -> Result<(), String> {
    match uids {
        Some((r, e)) if r == want && e == want => {}
        Some((r, e)) => return Err(format!("it runs as uid {r}/{e}, not SlurmUser's {want}")),
        None => return Err("its uids cannot be read".into()),
    }
    let Some((owner, mode, name)) = exe else {
        return Err("its executable cannot be read".into());
    };
    if owner != 0 || mode & 0o022 != 0 {
        return Err(format!(
            "its executable {name} is not an installed binary (owner uid {owner}, mode {:o})",
            mode & 0o7777
        ));
    }
    if !name.starts_with("slurmctld") {
        return Err(format!("its executable is {name}, not slurmctld"));
    }
    Ok(())
}

/// Why `c` is not a slurmctld to trust ([`trust_verdict`] on what `/proc` shows of it).
pub fn trusted(c: &Slurmctld, slurm_uid: u32) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let uids = read_capped(&format!("/proc/{}/status", c.pid), 64 * 1024)
        .ok()
        .and_then(|t| {
            let mut f = t
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))?
                .split_whitespace();
            Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
        });
    let exe = format!("/proc/{}/exe", c.pid);
    let name = std::fs::read_link(&exe).ok().and_then(|p| {
        let n = p.file_name()?.to_string_lossy().into_owned();
        Some(n.trim_end_matches(" (deleted)").to_string())
    });
    let meta = std::fs::metadata(&exe).ok();
    let exe = match (&meta, &name) {
        (Some(m), Some(n)) => Some((m.uid(), m.mode(), n.as_str())),
        _ => None,
    };
    trust_verdict(uids, slurm_uid, exe)
}

/// This host's slurmctlds ([`find_here`]) that run as SlurmUser (uid `slurm_uid`) from an
/// installed binary ([`trusted`]); `Err` when `/proc` cannot be listed.
pub fn find_trusted(slurm_uid: u32) -> Result<Vec<Slurmctld>, String> {
    Ok(find_here()?
        .into_iter()
        .filter(|c| trusted(c, slurm_uid).is_ok())
        .collect())
}

/// The listening TCP sockets in `/proc/net/tcp` (or `tcp6`) text whose local port is `port`
/// and whose local address is `ip` or the wildcard: (inode, owner uid) each.
pub fn listening_sockets(table: &str, port: u16, ip: std::net::IpAddr) -> Vec<(u64, u32)> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retr uid timeout inode
            let (local, st, uid, inode) = (f.get(1)?, f.get(3)?, f.get(7)?, f.get(9)?);
            if *st != "0A" {
                return None;
            }
            let (a, p) = local.split_once(':')?;
            if u16::from_str_radix(p, 16).ok()? != port {
                return None;
            }
            let bound = proc_net_ip(a)?;
            let v4 = |ip: std::net::IpAddr| match ip {
                std::net::IpAddr::V6(v6) => v6
                    .to_ipv4_mapped()
                    .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
                v4 => v4,
            };
            if !(bound.is_unspecified() || v4(bound) == v4(ip)) {
                return None;
            }
            Some((inode.parse().ok()?, uid.parse().ok()?))
        })
        .collect()
}

/// An address as `/proc/net/tcp{,6}` prints it: 8 hex digits (IPv4, host byte order as four
/// bytes in memory order) or 32 (IPv6, four such 32-bit words).
fn proc_net_ip(hex: &str) -> Option<std::net::IpAddr> {
    let words: Option<Vec<[u8; 4]>> = (0..hex.len() / 8)
        .map(|i| {
            let w = u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok()?;
            Some(w.to_le_bytes())
        })
        .collect();
    let words = words?;
    match (hex.len(), words.as_slice()) {
        (8, [a]) => Some(std::net::Ipv4Addr::from(*a).into()),
        (32, [a, b, c, d]) => {
            let mut o = [0u8; 16];
            for (i, w) in [a, b, c, d].iter().enumerate() {
                o[i * 4..i * 4 + 4].copy_from_slice(*w);
            }
            Some(std::net::Ipv6Addr::from(o).into())
        }
        _ => None,
    }
}

/// Whether the listening TCP socket on `target` (its port, at its address or the wildcard),
/// in this process's network namespace, is SlurmUser's: owned by uid `slurm_uid`
/// (`/proc/net/tcp{,6}`), or held by process `pid` (its inode among `/proc/PID/fd`). Only
/// SlurmUser (or root) can make either so. False when the tables cannot be read.
pub fn owns_listening(pid: u32, slurm_uid: u32, target: std::net::SocketAddr) -> bool {
    let mut sockets = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(t) = read_capped(table, 16 << 20) {
            sockets.extend(listening_sockets(&t, target.port(), target.ip()));
        }
    }
    if sockets.iter().any(|&(_, uid)| uid == slurm_uid) {
        return true;
    }
    if sockets.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|l| {
            l.to_str()
                .and_then(|s| s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok())
                .is_some_and(|i: u64| sockets.iter().any(|&(s, _)| s == i))
        })
    })
}

/// The slurm.conf slurmctld `pid` reads: its `-f FILE` option, else `SLURM_CONF` in its
/// environment, else `default`; `None` when neither its command line nor its environment can
/// be read (another user's process, not as root).
pub fn conf_of(pid: u32, default: &std::path::Path) -> Option<std::path::PathBuf> {
    let read = |what: &str| -> Option<Vec<u8>> {
        let mut v = Vec::new();
        std::fs::File::open(format!("/proc/{pid}/{what}"))
            .ok()?
            .take(1 << 20)
            .read_to_end(&mut v)
            .ok()?;
        Some(v)
    };
    let cmdline = read("cmdline")?;
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    for (i, a) in args.iter().enumerate() {
        let path = match a.strip_prefix(b"-f") {
            Some(b"") => args.get(i + 1).copied(),
            Some(rest) => Some(rest),
            None => None,
        };
        if let Some(p) = path.filter(|p| !p.is_empty()) {
            return Some(std::path::PathBuf::from(
                String::from_utf8_lossy(p).into_owned(),
            ));
        }
    }
    let environ = read("environ")?;
    let from_env = environ
        .split(|&b| b == 0)
        .find_map(|e| e.strip_prefix(b"SLURM_CONF="))
        .filter(|v| !v.is_empty())
        .map(|v| std::path::PathBuf::from(String::from_utf8_lossy(v).into_owned()));
    Some(from_env.unwrap_or_else(|| default.to_path_buf()))
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

    #[test]
    fn trust_only_slurm_user_from_an_installed_binary() {
        let ok = Some((0, 0o100755, "slurmctld"));
        assert_eq!(trust_verdict(Some((64030, 64030)), 64030, ok), Ok(()));
        assert_eq!(
            trust_verdict(
                Some((64030, 64030)),
                64030,
                Some((0, 0o100755, "slurmctld-wlm"))
            ),
            Ok(())
        );
        let no = |uids, exe| trust_verdict(uids, 64030, exe).unwrap_err();
        assert!(no(Some((1000, 1000)), ok).contains("uid 1000/1000, not SlurmUser's 64030"));
        assert!(no(Some((64030, 1000)), ok).contains("not SlurmUser's"));
        assert!(no(None, ok).contains("uids cannot be read"));
        assert!(no(Some((64030, 64030)), None).contains("cannot be read"));
        assert!(
            no(Some((64030, 64030)), Some((1000, 0o100755, "slurmctld")))
                .contains("not an installed binary")
        );
        assert!(no(Some((64030, 64030)), Some((0, 0o100777, "slurmctld"))).contains("mode 777"));
        assert!(no(Some((64030, 64030)), Some((0, 0o100775, "slurmctld"))).contains("775"));
        assert!(no(Some((64030, 64030)), Some((0, 0o100755, "python3"))).contains("not slurmctld"));
    }

    /// `/proc/net/tcp` and `tcp6` as a 24.11 slurmctld's namespace shows them (port 6817 =
    /// 0x1AA1), and an address of each kind.
    #[test]
    fn listening_sockets_from_proc_net() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1AA1 00000000:0000 0A 00000000:00000000 00:00000000 00000000 64030        0 2287987 1 0 100 0 0 10 0
   1: 0100007F:1AA1 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 555 1 0 100 0 0 10 0
   2: 0300630A:1AA1 0200630A:D2F0 01 00000000:00000000 00:00000000 00000000 64030        0 777 1 0 100 0 0 10 0
   3: 0300630A:1AA2 00000000:0000 0A 00000000:00000000 00:00000000 00000000 64030        0 888 1 0 100 0 0 10 0
";
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        // the wildcard listener serves every address; 127.0.0.1's only its own
        assert_eq!(
            listening_sockets(tcp, 6817, ip("10.99.0.3")),
            [(2287987, 64030)]
        );
        assert_eq!(
            listening_sockets(tcp, 6817, ip("127.0.0.1")),
            [(2287987, 64030), (555, 1000)]
        );
        // a connection (st 01) is no listener; a listener on 10.99.0.3 is not on 10.99.0.2
        assert_eq!(
            listening_sockets(tcp, 6818, ip("10.99.0.3")),
            [(888, 64030)]
        );
        assert!(listening_sockets(tcp, 6818, ip("10.99.0.2")).is_empty());
        assert!(listening_sockets(tcp, 6817, ip("10.99.0.3"))
            .iter()
            .all(|&(i, _)| i != 777));
        let tcp6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1AA1 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 64030        0 99 1 0 100 0 0 10 0
   1: 00000000000000000000000001000000:1AA1 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 1000        0 98 1 0 100 0 0 10 0
";
        assert_eq!(
            listening_sockets(tcp6, 6817, ip("::1")),
            [(99, 64030), (98, 1000)]
        );
        assert_eq!(
            listening_sockets(tcp6, 6817, ip("10.99.0.3")),
            [(99, 64030)]
        );
        assert!(listening_sockets(
            "garbage
x y z 0A",
            6817,
            ip("::1")
        )
        .is_empty());
    }

    /// A listener of this test's own: owned by this process, by no other.
    #[test]
    fn the_owner_of_a_listening_socket() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap();
        let me = nix::unistd::getuid().as_raw();
        let other = me.wrapping_add(1);
        // held by this process; owned by this uid
        assert!(owns_listening(std::process::id(), other, at));
        assert!(owns_listening(1, me, at));
        // neither held by pid 1 nor owned by another uid
        assert!(!owns_listening(1, other, at) || std::process::id() == 1);
        // no listener on that address: the same port on another loopback address (read
        // while this one is held, so no other socket can have taken the port meanwhile)
        let elsewhere = std::net::SocketAddr::from(([127, 0, 0, 2], at.port()));
        assert!(!owns_listening(std::process::id(), me, elsewhere));
        drop(l);
    }

    /// A process any user starts under the name `slurmctld` (a copy of `sleep`) is found by
    /// name, and trusted only as SlurmUser from a binary only root can write.
    #[test]
    fn a_fake_slurmctld_is_not_trusted() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("cvslurm-fake-ctld-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("slurmctld");
        std::fs::copy("/bin/sleep", &fake).unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o777)).unwrap();
        let mut child = std::process::Command::new(&fake).arg("60").spawn().unwrap();
        let pid = child.id();
        let seen = |v: Vec<Slurmctld>| v.iter().any(|c| c.pid == pid);
        let me = nix::unistd::getuid().as_raw();
        // spawn() returns once the child has exec'd: it has its name
        let found = seen(find_here().unwrap());
        let other_uid = me.wrapping_add(1);
        let trusted_as_other = seen(find_trusted(other_uid).unwrap());
        // writable by everyone: not an installed binary, even run as SlurmUser
        let trusted_as_me = seen(find_trusted(me).unwrap());
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(found, "a process named slurmctld is not found");
        assert!(!trusted_as_other, "trusted while not SlurmUser");
        assert!(!trusted_as_me, "trusted from a binary anyone can write");
    }

    /// A child's slurm.conf: its `-f`, else its `SLURM_CONF`, else the default.
    #[test]
    fn the_slurm_conf_a_process_reads() {
        let d = std::path::Path::new("/etc/slurm/slurm.conf");
        // a shell that keeps running with these arguments (it does not read them)
        let run = |args: &[&str], env: Option<&str>| {
            let mut c = std::process::Command::new("/bin/sh");
            c.args(["-c", "sleep 60; :"])
                .args(args)
                .env_remove("SLURM_CONF");
            if let Some(e) = env {
                c.env("SLURM_CONF", e);
            }
            let mut child = c.spawn().unwrap();
            // spawn() returns once exec closed its pipe, a moment before the new program's
            // arguments are in place: wait for them
            let cmdline = format!("/proc/{}/cmdline", child.id());
            while !std::fs::read(&cmdline).unwrap().starts_with(b"/bin/sh\0") {
                std::thread::yield_now();
            }
            let got = conf_of(child.id(), d);
            let _ = child.kill();
            let _ = child.wait();
            got
        };
        assert_eq!(
            run(&["-f", "/x/slurm.conf"], None).unwrap().to_str(),
            Some("/x/slurm.conf")
        );
        assert_eq!(
            run(&["-f/y.conf"], Some("/z")).unwrap().to_str(),
            Some("/y.conf")
        );
        assert_eq!(
            run(&[], Some("/z/slurm.conf")).unwrap().to_str(),
            Some("/z/slurm.conf")
        );
        assert_eq!(run(&[], None).unwrap(), d);
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

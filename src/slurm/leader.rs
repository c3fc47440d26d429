//! Which controller of a Slurm HA pair is in control, as Slurm itself records it.
//!
//! With more than one `SlurmctldHost`, the slurmctld in control writes
//! `StateSaveLocation/heartbeat` (Slurm 22.05 and later) every min(SlurmctldTimeout/4, 30) s,
//! with fsync and rename: 16 bytes, a big-endian u64 Unix time and a big-endian u64 index of
//! the writer in the `SlurmctldHost` list (0 = the first line). Measured on 22.05, 24.11 and
//! 26.05 (`tests/cluster/FACTS-controllers.md`, fixtures `tests/fixtures/slurm-*/heartbeat-*`).
//!
//! The file is written by SlurmUser on a shared filesystem: every byte is hostile. A wrong
//! size, a time too old or in the future, an index outside the list: the answer is
//! [`Leader::Unknown`] with the reason, never a guess and never a panic. It is opened as
//! every StateDir file is (no link followed, a regular file only, never blocking on a FIFO),
//! and read within [`HEARTBEAT_READ_TIMEOUT`]: a hung filesystem (NFS) makes the answer
//! "cannot tell", never a poll that waits for good.

use crate::slurm::conf::SlurmConf;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The heartbeat's file name inside StateSaveLocation.
pub const HEARTBEAT_FILE: &str = "heartbeat";
/// The heartbeat's size in bytes.
pub const HEARTBEAT_LEN: usize = 16;
/// SlurmctldTimeout when slurm.conf does not set it (slurm.conf(5)).
pub const DEFAULT_SLURMCTLD_TIMEOUT_S: u64 = 120;
/// How far in the future a heartbeat's time may be (the writer's clock runs ahead of ours)
/// before it is not believed.
pub const MAX_CLOCK_AHEAD_S: u64 = 10;
/// How long one read of the heartbeat may take (StateSaveLocation is often NFS): past it,
/// who is in control cannot be told.
pub const HEARTBEAT_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// One `SlurmctldHost` line: `name` or `name(address)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Controller {
    /// The host name slurmctld compares with its own (`names_this_host`).
    pub name: String,
    /// The address in parentheses, if given.
    pub addr: Option<String>,
}

/// The heartbeat file's two numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// When the controller in control last wrote it (Unix seconds, its clock).
    pub time: u64,
    /// The writer's index in the `SlurmctldHost` list.
    pub index: u64,
}

/// Who is in control.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leader {
    /// The controller at `index` of the `SlurmctldHost` list wrote the heartbeat `age_s`
    /// seconds ago (negative: its clock runs a little ahead of ours).
    InControl {
        /// Index in the `SlurmctldHost` list (0 = primary).
        index: usize,
        /// Its `SlurmctldHost` name.
        name: String,
        /// Seconds since it wrote the heartbeat.
        age_s: i64,
    },
    /// It cannot be told; the reason, one line.
    Unknown(String),
}

/// The `SlurmctldHost` list in slurm.conf order; the pre-18.08 `ControlMachine` (with
/// `ControlAddr`) and `BackupController` (with `BackupAddr`) when there is no SlurmctldHost.
pub fn controllers(conf: &SlurmConf) -> Vec<Controller> {
    let list: Vec<Controller> = conf
        .all("SlurmctldHost")
        .iter()
        .filter_map(|s| parse_controller(&s.value))
        .collect();
    if !list.is_empty() {
        return list;
    }
    let old = |host: &str, addr: &str| {
        conf.last(host)
            .and_then(|s| parse_controller(&s.value))
            .map(|mut c| {
                if c.addr.is_none() {
                    c.addr = conf
                        .last(addr)
                        .map(|a| a.value.clone())
                        .filter(|a| !a.is_empty());
                }
                c
            })
    };
    old("ControlMachine", "ControlAddr")
        .into_iter()
        .chain(old("BackupController", "BackupAddr"))
        .collect()
}

/// `name` or `name(address)` → a [`Controller`]; `None` when there is no name.
pub fn parse_controller(value: &str) -> Option<Controller> {
    let value = value.trim();
    let (name, addr) = match value.split_once('(') {
        Some((n, rest)) => {
            let a = rest.strip_suffix(')').unwrap_or(rest).trim();
            (n.trim(), (!a.is_empty()).then(|| a.to_string()))
        }
        None => (value, None),
    };
    (!name.is_empty()).then(|| Controller {
        name: name.to_string(),
        addr,
    })
}

/// SlurmctldTimeout in seconds (slurm.conf's last value, else the default 120); `None` when
/// the value is not a number.
pub fn slurmctld_timeout_s(conf: &SlurmConf) -> Option<u64> {
    match conf.last("SlurmctldTimeout") {
        None => Some(DEFAULT_SLURMCTLD_TIMEOUT_S),
        Some(s) => s.value.trim().parse().ok(),
    }
}

/// How old a heartbeat may be and still name the controller in control: SlurmctldTimeout.
///
/// The controller in control rewrites the file every min(SlurmctldTimeout/4, 30) s, so a
/// file that old has missed at least four writes: its writer is dead or hung. A standby
/// takes control only after SlurmctldTimeout without an answer from it, so until then no
/// other controller is in control either, and naming the old writer agrees with Slurm; past
/// it, a takeover is due or under way and nobody can be named. At least 2 s (a SlurmctldTimeout
/// of 0 or 1 would make every heartbeat stale).
pub fn stale_after_s(slurmctld_timeout_s: u64) -> u64 {
    slurmctld_timeout_s.max(2)
}

/// The heartbeat's bytes → its two numbers; the reason when they are not a heartbeat.
pub fn parse_heartbeat(bytes: &[u8]) -> Result<Heartbeat, String> {
    let b: &[u8; HEARTBEAT_LEN] = bytes.try_into().map_err(|_| {
        format!(
            "the heartbeat is {} bytes, not {HEARTBEAT_LEN}",
            bytes.len()
        )
    })?;
    let mut t = [0u8; 8];
    let mut i = [0u8; 8];
    t.copy_from_slice(&b[..8]);
    i.copy_from_slice(&b[8..]);
    Ok(Heartbeat {
        time: u64::from_be_bytes(t),
        index: u64::from_be_bytes(i),
    })
}

/// Who is in control, from the heartbeat's bytes, the `SlurmctldHost` list, the current Unix
/// time and SlurmctldTimeout.
pub fn leader_from(
    bytes: &[u8],
    controllers: &[Controller],
    now: u64,
    slurmctld_timeout_s: u64,
) -> Leader {
    let hb = match parse_heartbeat(bytes) {
        Ok(h) => h,
        Err(e) => return Leader::Unknown(e),
    };
    let Some(c) = usize::try_from(hb.index)
        .ok()
        .and_then(|i| controllers.get(i).map(|c| (i, c)))
    else {
        return Leader::Unknown(format!(
            "the heartbeat names controller index {}, but slurm.conf has {} SlurmctldHost line(s)",
            hb.index,
            controllers.len()
        ));
    };
    let (index, controller) = c;
    if hb.time > now.saturating_add(MAX_CLOCK_AHEAD_S) {
        return Leader::Unknown(format!(
            "the heartbeat of {} is dated {} s in the future: are the controllers' clocks synchronised?",
            controller.name,
            hb.time - now
        ));
    }
    let stale = stale_after_s(slurmctld_timeout_s);
    let age = now.saturating_sub(hb.time);
    if age > stale {
        return Leader::Unknown(format!(
            "the heartbeat of {} is {age} s old (more than SlurmctldTimeout, {stale} s): no controller is in control, or a takeover is under way",
            controller.name
        ));
    }
    Leader::InControl {
        index,
        name: controller.name.clone(),
        // both below i64::MAX here: `age` ≤ stale, and the time ahead ≤ MAX_CLOCK_AHEAD_S
        age_s: if hb.time > now {
            -((hb.time - now) as i64)
        } else {
            age as i64
        },
    }
}

/// Who is in control: reads `StateSaveLocation/heartbeat` from the state save location that
/// slurm.conf names (`read_heartbeat`).
pub fn leader(conf: &SlurmConf, now: u64) -> Leader {
    let list = controllers(conf);
    if list.len() < 2 {
        return Leader::Unknown(format!(
            "slurm.conf names {} SlurmctldHost: there is no backup controller and no heartbeat",
            list.len()
        ));
    }
    let Some(timeout) = slurmctld_timeout_s(conf) else {
        return Leader::Unknown("SlurmctldTimeout in slurm.conf is not a number".to_string());
    };
    let Some(dir) = conf.last("StateSaveLocation").map(|s| s.value.clone()) else {
        return Leader::Unknown("slurm.conf sets no StateSaveLocation".to_string());
    };
    let path = Path::new(&dir).join(HEARTBEAT_FILE);
    match read_heartbeat(&path, HEARTBEAT_READ_TIMEOUT) {
        Ok(bytes) => leader_from(&bytes, &list, now, timeout),
        Err(why) => Leader::Unknown(why),
    }
}

/// The heartbeat's bytes at `path`, or why they cannot be had (one line). Opened as every
/// StateDir file ([`crate::state::durable::open_regular`]: no link followed, a FIFO or a
/// device refused without blocking); a file larger than [`HEARTBEAT_LEN`] is refused by its
/// size, unread; the read runs in a thread of its own and is given up after `timeout` (a
/// hung NFS StateSaveLocation). While a read given up is still stuck, no other is started:
/// the answer is "cannot read" at once, and at most one thread waits on the filesystem.
pub fn read_heartbeat(path: &Path, timeout: Duration) -> Result<Vec<u8>, String> {
    static STUCK: AtomicUsize = AtomicUsize::new(0);
    let p = path.to_path_buf();
    let read = move || -> Result<Vec<u8>, String> {
        use std::io::Read;
        let (f, md) = crate::state::durable::open_regular(&p)
            .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
        if md.len() > HEARTBEAT_LEN as u64 {
            return Err(format!(
                "the heartbeat is {} bytes, not {HEARTBEAT_LEN}",
                md.len()
            ));
        }
        let mut out = Vec::with_capacity(HEARTBEAT_LEN + 1);
        f.take(HEARTBEAT_LEN as u64 + 1)
            .read_to_end(&mut out)
            .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
        Ok(out)
    };
    match within(&STUCK, timeout, read) {
        Ok(r) => r,
        Err(Late::TimedOut) => Err(format!(
            "cannot read {}: no answer within {} s: is StateSaveLocation's filesystem hung? (check the mount)",
            path.display(),
            timeout.as_secs_f64()
        )),
        Err(Late::StillStuck) => Err(format!(
            "cannot read {}: an earlier read has still not returned: is StateSaveLocation's filesystem hung? (check the mount)",
            path.display()
        )),
    }
}

/// Why [`within`] gave no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Late {
    /// `f` did not return within the time given.
    TimedOut,
    /// An earlier call's `f` has not returned yet: `f` was not started.
    StillStuck,
}

/// Runs `f` in a thread of its own and waits at most `timeout` for it. `stuck` counts the
/// threads given up on that still run: while one does, no other is started (a hung filesystem
/// or resolver holds one thread, not one per poll). Calls that overlap without timing out do
/// not hold each other up.
fn within<T: Send + 'static>(
    stuck: &'static AtomicUsize,
    timeout: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Late> {
    use std::sync::{Arc, Mutex};
    if stuck.load(Ordering::Acquire) > 0 {
        return Err(Late::StillStuck);
    }
    // (given up on, done): changed under the lock by either side, so a thread that ends just
    // as it is given up on is counted exactly once or not at all.
    let state = Arc::new(Mutex::new((false, false)));
    let theirs = state.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("cvslurm-bounded".into())
        .spawn(move || {
            let out = f();
            let mut s = theirs.lock().unwrap_or_else(|e| e.into_inner());
            s.1 = true;
            if s.0 {
                stuck.fetch_sub(1, Ordering::AcqRel);
            }
            let _ = tx.send(out);
        });
    if spawned.is_err() {
        return Err(Late::TimedOut);
    }
    match rx.recv_timeout(timeout) {
        Ok(v) => Ok(v),
        Err(_) => {
            let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
            if s.1 {
                // it ended just now: its answer is in the channel
                return rx.try_recv().map_err(|_| Late::TimedOut);
            }
            s.0 = true;
            stuck.fetch_add(1, Ordering::AcqRel);
            Err(Late::TimedOut)
        }
    }
}

/// The first Slurm release whose slurmctld answers `GET /readyz` on its own port (25.11).
pub const READYZ_SINCE: (u32, u32) = (25, 11);
/// How long [`readyz`] waits for slurmctld's answer.
pub const READYZ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// `SlurmctldPort` (the first port of a range such as `6817-6818`), else Slurm's 6817; `None`
/// when the value is not a port.
pub fn slurmctld_port(conf: &SlurmConf) -> Option<u16> {
    match conf.last("SlurmctldPort") {
        None => Some(6817),
        Some(s) => s.value.trim().split('-').next()?.trim().parse().ok(),
    }
}

/// `addr:port` as a socket address, within `timeout`: an IP address as it is (no lookup), a
/// name resolved in a thread of its own and given up after `timeout` (a hung resolver holds
/// that one thread, and no second lookup starts while it is stuck); `None` when it does not
/// resolve in time.
pub fn resolve(addr: &str, port: u16, timeout: Duration) -> Option<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    static STUCK: AtomicUsize = AtomicUsize::new(0);
    if let Ok(ip) = addr.parse::<std::net::IpAddr>() {
        return Some(std::net::SocketAddr::new(ip, port));
    }
    let name = addr.to_string();
    within(&STUCK, timeout, move || {
        (name.as_str(), port).to_socket_addrs().ok()?.next()
    })
    .ok()
    .flatten()
}

/// What the slurmctld at `addr:port` answers to `GET /readyz` (25.11 and later, measured on
/// 26.05: 204 from the controller in control, 500 from a standby): `Some(true)` for a 2xx,
/// `Some(false)` for any other status, `None` when it does not answer an HTTP status line
/// within `timeout`, its name lookup included ([`resolve`]; down, older release, not HTTP).
#[cfg(test)]
pub fn readyz(addr: &str, port: u16, timeout: Duration) -> Option<bool> {
    let started = std::time::Instant::now();
    let target = resolve(addr, port, timeout)?;
    readyz_at(target, addr, timeout.checked_sub(started.elapsed())?)
}

/// [`readyz`] at a resolved address (`host` for the Host header): plain HTTP/1.0 on
/// slurmctld's own port; at most 256 bytes of the answer are read, all within `timeout`.
pub fn readyz_at(target: std::net::SocketAddr, host: &str, timeout: Duration) -> Option<bool> {
    use std::io::{Read, Write};
    let started = std::time::Instant::now();
    let mut conn = std::net::TcpStream::connect_timeout(&target, timeout).ok()?;
    let left = timeout.checked_sub(started.elapsed())?;
    conn.set_read_timeout(Some(left.max(Duration::from_millis(10))))
        .ok()?;
    conn.set_write_timeout(Some(left.max(Duration::from_millis(10))))
        .ok()?;
    let host: String = host
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || ".-_:[]".contains(*c))
        .collect();
    conn.write_all(format!("GET /readyz HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .ok()?;
    let mut head = [0u8; 256];
    let mut n = 0;
    while n < head.len() && !head[..n].contains(&b'\n') {
        match conn.read(&mut head[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
        if started.elapsed() > timeout {
            break;
        }
    }
    http_status(&head[..n]).map(|code| (200..300).contains(&code))
}

/// The status code of an HTTP status line (`HTTP/1.1 204 No Content`).
fn http_status(head: &[u8]) -> Option<u16> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split_whitespace();
    if !words.next()?.starts_with("HTTP/") {
        return None;
    }
    words
        .next()?
        .parse()
        .ok()
        .filter(|c| (100..600).contains(c))
}

/// This host's name as slurmctld reads it: `gethostname()` whole (`ctl1.example.com` on a
/// host so named), "" when it cannot be read. Pass it to [`names_this_host`] as it is; never
/// cut it at the first dot first (a `SlurmctldHost` of the full name would not match).
pub fn this_hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default()
}

/// Whether the `SlurmctldHost` name `name` is this host, whose `gethostname()` is `hostname`
/// ([`this_hostname`]), exactly as slurmctld decides which controller it is.
///
/// slurmctld (`_controller_index()` in `src/slurmctld/controller.c`, the same in Slurm 22.05,
/// 24.11 and 26.05: tags `slurm-22-05-2-1`, `slurm-24-11-0-1`, `slurm-26-05-0-1`) compares each
/// `SlurmctldHost` name with `xstrcmp` (case counts) against `gethostname()` whole and against
/// `gethostname_short()` (`src/common/read_config.c`: `gethostname()` cut at its first dot).
/// A `SlurmctldHost` of `localhost` (any case: `xstrcasecmp` in `_load_slurmctld_host()`,
/// `read_config.c`) is replaced by `gethostname_short()`, so it is this host.
/// So `ctl1` and `ctl1.example.com` are both a host named `ctl1.example.com`; a host named
/// `ctl1` is not `ctl1.example.com`, nor `CTL1`, nor `ctl10`.
pub fn names_this_host(name: &str, hostname: &str) -> bool {
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let short = hostname.split('.').next().unwrap_or("");
    !name.is_empty() && (name == hostname || name == short)
}

/// Whether `controller` is this host, whose `gethostname()` is `hostname`
/// (`names_this_host`).
pub fn is_this_host(controller: &Controller, hostname: &str) -> bool {
    names_this_host(&controller.name, hostname)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slurm::conf::parse_slurm_conf;
    use std::path::PathBuf;

    /// A one-shot HTTP server on 127.0.0.1 answering `answer`; its port.
    fn answer_once(answer: &'static [u8]) -> u16 {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            if let Ok((mut c, _)) = l.accept() {
                let mut buf = [0u8; 512];
                let _ = c.read(&mut buf);
                let _ = c.write_all(answer);
            }
        });
        port
    }

    #[test]
    fn readyz_reads_slurmctlds_answer() {
        let t = std::time::Duration::from_secs(2);
        let p = answer_once(b"HTTP/1.1 204 No Content\r\n\r\n");
        assert_eq!(readyz("127.0.0.1", p, t), Some(true));
        let p = answer_once(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n");
        assert_eq!(readyz("127.0.0.1", p, t), Some(false));
        // Not HTTP (an older slurmctld's RPC port), or nothing: no answer.
        let p = answer_once(b"\x00\x00\x00\x10garbage");
        assert_eq!(readyz("127.0.0.1", p, t), None);
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        assert_eq!(readyz("127.0.0.1", closed, t), None);
        assert_eq!(http_status(b"HTTP/1.0 204\r\n"), Some(204));
        assert_eq!(http_status(b"HTTP/1.1 99999 x"), None);
    }

    /// An address is taken as it is, no lookup; a name is looked up within the deadline.
    #[test]
    fn resolve_within_the_deadline() {
        let t = Duration::from_secs(1);
        assert_eq!(
            resolve("10.99.0.2", 6817, t),
            Some("10.99.0.2:6817".parse().unwrap())
        );
        assert_eq!(resolve("::1", 7000, t), Some("[::1]:7000".parse().unwrap()));
        assert!(
            resolve("localhost", 6817, Duration::from_secs(5)).is_some_and(|a| a.port() == 6817)
        );
        assert_eq!(resolve("bad name!", 6817, t), None);
    }

    #[test]
    fn slurmctld_port_from_slurm_conf() {
        let conf = |text: &str| {
            let t = text.to_string();
            parse_slurm_conf(
                std::path::Path::new("/etc/slurm/slurm.conf"),
                &move |_| Ok(t.clone()),
                &|_| Vec::new(),
            )
            .unwrap()
        };
        assert_eq!(slurmctld_port(&conf("ClusterName=a\n")), Some(6817));
        assert_eq!(slurmctld_port(&conf("SlurmctldPort=7000\n")), Some(7000));
        assert_eq!(
            slurmctld_port(&conf("SlurmctldPort=6817-6818\n")),
            Some(6817)
        );
        assert_eq!(slurmctld_port(&conf("SlurmctldPort=x\n")), None);
    }

    fn conf(text: &str) -> SlurmConf {
        let t = text.to_string();
        parse_slurm_conf(
            Path::new("/etc/slurm/slurm.conf"),
            &move |_| Ok(t.clone()),
            &|_| Vec::new(),
        )
        .unwrap()
    }

    fn pair() -> Vec<Controller> {
        controllers(&conf(
            "SlurmctldHost=ctl1(10.99.0.2)\nSlurmctldHost=ctl2(10.99.0.3)\n",
        ))
    }

    fn fixture(ver: &str, name: &str) -> Vec<u8> {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(format!("slurm-{ver}"))
            .join(name);
        std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    fn be(time: u64, index: u64) -> Vec<u8> {
        let mut v = time.to_be_bytes().to_vec();
        v.extend_from_slice(&index.to_be_bytes());
        v
    }

    #[test]
    fn slurmctld_host_lines_in_order_with_addresses() {
        let c = conf(
            "SlurmctldHost=ctl1(10.99.0.2)\nslurmctldhost = ctl2\nSlurmctldHost=ctl3(10.0.0.3)\n",
        );
        assert_eq!(
            controllers(&c),
            vec![
                Controller {
                    name: "ctl1".into(),
                    addr: Some("10.99.0.2".into())
                },
                Controller {
                    name: "ctl2".into(),
                    addr: None
                },
                Controller {
                    name: "ctl3".into(),
                    addr: Some("10.0.0.3".into())
                },
            ]
        );
    }

    #[test]
    fn old_control_machine_keys_when_no_slurmctld_host() {
        let c = conf("ControlMachine=a\nControlAddr=10.0.0.1\nBackupController=b(10.0.0.2)\n");
        assert_eq!(
            controllers(&c),
            vec![
                Controller {
                    name: "a".into(),
                    addr: Some("10.0.0.1".into())
                },
                Controller {
                    name: "b".into(),
                    addr: Some("10.0.0.2".into())
                },
            ]
        );
        assert!(parse_controller("(10.0.0.1)").is_none());
        assert!(parse_controller("  ").is_none());
    }

    #[test]
    fn this_host_by_short_or_full_name() {
        let c = parse_controller("ctl1(10.99.0.2)").unwrap();
        assert!(is_this_host(&c, "ctl1"));
        assert!(is_this_host(&c, "ctl1.example.com"));
        assert!(!is_this_host(&c, "ctl2"));
        assert!(!is_this_host(&c, "ctl10"));
        assert!(!is_this_host(&c, ""));
        let full = parse_controller("ctl1.example.com").unwrap();
        assert!(is_this_host(&full, "ctl1.example.com"));
        assert!(!is_this_host(&full, "ctl1"));
        assert!(is_this_host(
            &parse_controller("localhost").unwrap(),
            "anything"
        ));
    }

    /// As slurmctld's `_controller_index()`: the name equals `gethostname()` whole or cut at
    /// its first dot, case counting; `localhost` in any case is this host.
    #[test]
    fn names_this_host_as_slurmctld_does() {
        // (SlurmctldHost name, this host's gethostname(), slurmctld takes it for this host)
        let cases = [
            ("ctl1", "ctl1", true),                         // short / short
            ("ctl1", "ctl1.example.com", true),             // short name, full host name
            ("ctl1.example.com", "ctl1", false),            // full name, short host name
            ("ctl1.example.com", "ctl1.example.com", true), // full / full
            ("ctl1.example", "ctl1.example.com", false),    // neither whole nor short
            ("CTL1", "ctl1", false),                        // case counts (xstrcmp)
            ("ctl1", "CTL1.example.com", false),
            ("Ctl1.Example.Com", "ctl1.example.com", false),
            ("ctl1", "ctl10", false), // a shared prefix only
            ("ctl10", "ctl1", false),
            ("ctl1", "ctl10.example.com", false),
            ("ctl1.example.com", "ctl1.example.com.evil", false),
            ("", "", false),
            ("ctl1", "", false),
            ("localhost", "anything.example.com", true), // xstrcasecmp
            ("LocalHost", "ctl1", true),
            ("localhost", "", true),
        ];
        for (name, host, this) in cases {
            assert_eq!(names_this_host(name, host), this, "{name:?} on {host:?}");
        }
        // This host's own name is taken whole.
        let me = this_hostname();
        assert_eq!(
            me,
            nix::unistd::gethostname().unwrap().into_string().unwrap()
        );
        assert!(names_this_host(&me, &me));
    }

    /// A read that does not return in time is given up; while it is stuck, no second one
    /// starts; once it returns, reads run again.
    #[test]
    fn a_stuck_read_is_given_up_and_not_repeated() {
        static STUCK: AtomicUsize = AtomicUsize::new(0);
        let t = std::time::Instant::now();
        let slow = within(&STUCK, Duration::from_millis(100), || {
            std::thread::sleep(Duration::from_millis(800));
            1
        });
        assert_eq!(slow, Err(Late::TimedOut));
        assert!(
            t.elapsed() < Duration::from_millis(600),
            "{:?}",
            t.elapsed()
        );
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r = ran.clone();
        let again = within(&STUCK, Duration::from_secs(5), move || {
            r.store(true, Ordering::SeqCst);
            2
        });
        assert_eq!(again, Err(Late::StillStuck));
        assert!(!ran.load(Ordering::SeqCst), "a second read started");
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while STUCK.load(Ordering::Acquire) > 0 {
            assert!(
                std::time::Instant::now() < until,
                "the stuck read never ended"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(within(&STUCK, Duration::from_secs(5), || 3), Ok(3));
    }

    /// Two reads at once (a poll and a recheck, two tests): neither is taken for stuck.
    #[test]
    fn overlapping_reads_do_not_hold_each_other() {
        static STUCK: AtomicUsize = AtomicUsize::new(0);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = std::sync::mpsc::channel::<()>();
        let first = std::thread::spawn(move || {
            within(&STUCK, Duration::from_secs(30), move || {
                let _ = started_tx.send(());
                let _ = rx.recv();
                1
            })
        });
        // the first read is under way (its thread waits for `tx`) while the second runs
        started.recv().unwrap();
        let second = within(&STUCK, Duration::from_secs(30), || 2);
        tx.send(()).unwrap();
        assert_eq!(second, Ok(2));
        assert_eq!(first.join().unwrap(), Ok(1));
        assert_eq!(STUCK.load(Ordering::Acquire), 0);
    }

    #[test]
    fn timeout_and_stale_bound() {
        assert_eq!(slurmctld_timeout_s(&conf("ClusterName=x\n")), Some(120));
        assert_eq!(
            slurmctld_timeout_s(&conf("SlurmctldTimeout=10\n")),
            Some(10)
        );
        assert_eq!(slurmctld_timeout_s(&conf("SlurmctldTimeout=ten\n")), None);
        assert_eq!(stale_after_s(10), 10);
        assert_eq!(stale_after_s(0), 2);
    }

    #[test]
    fn hostile_heartbeats_cannot_tell_never_panic() {
        let list = pair();
        let now = 1_800_000_000;
        let unknown = |bytes: &[u8]| match leader_from(bytes, &list, now, 10) {
            Leader::Unknown(why) => why,
            other => panic!("{bytes:?} taken for {other:?}"),
        };
        assert!(unknown(&[]).contains("0 bytes"), "{}", unknown(&[]));
        assert!(unknown(&be(now, 0)[..15]).contains("15 bytes"));
        let mut long = be(now, 0);
        long.push(0);
        assert!(unknown(&long).contains("17 bytes"));
        assert!(unknown(&be(now, 2)).contains("index 2"));
        assert!(unknown(&be(now, u64::MAX)).contains("index 18446744073709551615"));
        assert!(unknown(&be(now + 11, 1)).contains("in the future"));
        assert!(unknown(&be(u64::MAX, 0)).contains("in the future"));
        assert!(unknown(&be(now - 11, 0)).contains("11 s old"));
        assert!(unknown(&be(0, 1)).contains("old"));
        // no controllers at all
        assert!(matches!(
            leader_from(&be(now, 0), &[], now, 10),
            Leader::Unknown(_)
        ));
    }

    #[test]
    fn fresh_heartbeat_names_its_writer() {
        let list = pair();
        let now = 1_800_000_000;
        assert_eq!(
            leader_from(&be(now - 10, 1), &list, now, 10),
            Leader::InControl {
                index: 1,
                name: "ctl2".into(),
                age_s: 10
            }
        );
        assert_eq!(
            leader_from(&be(now + 10, 0), &list, now, 10),
            Leader::InControl {
                index: 0,
                name: "ctl1".into(),
                age_s: -10
            }
        );
    }

    #[test]
    fn leader_reads_state_save_location_and_caps_the_read() {
        let dir = std::env::temp_dir().join(format!("cvslurm-leader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let text = format!(
            "SlurmctldHost=ctl1(10.99.0.2)\nSlurmctldHost=ctl2(10.99.0.3)\nSlurmctldTimeout=10\nStateSaveLocation={}\n",
            dir.display()
        );
        let c = conf(&text);
        let now = 1_800_000_000;
        assert!(matches!(leader(&c, now), Leader::Unknown(w) if w.contains("cannot read")));
        std::fs::write(dir.join(HEARTBEAT_FILE), be(now - 2, 1)).unwrap();
        assert_eq!(
            leader(&c, now),
            Leader::InControl {
                index: 1,
                name: "ctl2".into(),
                age_s: 2
            }
        );
        // a huge file is refused by its size, unread; 17 bytes are read and refused
        std::fs::write(dir.join(HEARTBEAT_FILE), vec![0u8; 1 << 20]).unwrap();
        assert!(
            matches!(leader(&c, now), Leader::Unknown(w) if w == "the heartbeat is 1048576 bytes, not 16")
        );
        std::fs::write(dir.join(HEARTBEAT_FILE), vec![0u8; 17]).unwrap();
        assert!(matches!(leader(&c, now), Leader::Unknown(w) if w.contains("17 bytes")));
        // a FIFO, a symlink (to a good heartbeat) and a directory: not read, at once (the FIFO
        // read in a thread of the test's own: a regression fails here, it does not hang)
        let hb = dir.join(HEARTBEAT_FILE);
        std::fs::remove_file(&hb).unwrap();
        nix::unistd::mkfifo(&hb, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let fifo_conf = c.clone();
        std::thread::spawn(move || {
            let _ = tx.send(leader(&fifo_conf, now));
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("reading a FIFO heartbeat hung");
        assert!(
            matches!(&got, Leader::Unknown(w) if w.ends_with("heartbeat: not a regular file")),
            "{got:?}"
        );
        std::fs::remove_file(&hb).unwrap();
        let good = dir.join("good");
        std::fs::write(&good, be(now - 2, 1)).unwrap();
        std::os::unix::fs::symlink(&good, &hb).unwrap();
        assert!(
            matches!(leader(&c, now), Leader::Unknown(w) if w.contains("cannot read") && w.contains("symbolic links"))
        );
        std::fs::remove_file(&hb).unwrap();
        std::fs::create_dir(&hb).unwrap();
        assert!(matches!(leader(&c, now), Leader::Unknown(w) if w.contains("cannot read")));
        // one controller: no heartbeat to read
        let one = conf("SlurmctldHost=ctl1\n");
        assert!(matches!(leader(&one, now), Leader::Unknown(w) if w.contains("no backup")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The heartbeats real slurmctlds wrote (tests/cluster/measure-controllers.sh), copied
    /// after each change of control: `heartbeat-<step>-<ctlK>.bin`, ctlK the controller then in
    /// control (ctl1 = index 0, ctl2 = index 1).
    #[test]
    fn real_heartbeats_name_their_writer() {
        let list = pair();
        for ver in ["22.05", "24.11", "26.05"] {
            let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures")
                .join(format!("slurm-{ver}"));
            let mut files: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("heartbeat-") && n.ends_with(".bin"))
                .collect();
            files.sort();
            for must in ["heartbeat-initial-ctl1.bin", "heartbeat-takeover-ctl2.bin"] {
                assert!(files.iter().any(|f| f == must), "{ver}: no {must}");
            }
            for file in &files {
                let name = file.trim_end_matches(".bin").rsplit('-').next().unwrap();
                let index: u64 = match name {
                    "ctl1" => 0,
                    "ctl2" => 1,
                    other => panic!("{ver} {file}: in control: {other}?"),
                };
                let bytes = fixture(ver, file);
                let hb = parse_heartbeat(&bytes).unwrap();
                assert_eq!(hb.index, index, "{ver} {file}");
                // written in 2026 by the test cluster's clock
                assert!(
                    (1_767_225_600..1_798_761_600).contains(&hb.time),
                    "{ver} {file}"
                );
                assert_eq!(
                    leader_from(&bytes, &list, hb.time + 3, 10),
                    Leader::InControl {
                        index: index as usize,
                        name: name.into(),
                        age_s: 3
                    },
                    "{ver} {file}"
                );
                // the same bytes read SlurmctldTimeout + 1 s later: stale
                assert!(
                    matches!(leader_from(&bytes, &list, hb.time + 11, 10), Leader::Unknown(w) if w.contains("11 s old")),
                    "{ver} {file}"
                );
                // a slurm.conf with one SlurmctldHost: the backup's index is out of range
                if index == 1 {
                    assert!(matches!(
                        leader_from(&bytes, &list[..1], hb.time, 10),
                        Leader::Unknown(w) if w.contains("index 1")
                    ));
                }
            }
        }
    }
}

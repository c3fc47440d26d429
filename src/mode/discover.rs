//! `cvslurm discover`: run on a worker (through srun), print its network interfaces as one
//! record (one JSON line, or `cvslurm-part` lines when longer: [`crate::node_record::frame`];
//! the record is [`crate::node_record::DiscoverRecord`]).

use super::startup::usage;
use crate::cloudvision::payload::is_mac;
use crate::config::{parse_bool, Config};
use crate::logging::{self, Sink};
pub use crate::node_record::{frame, valid_interface_name, DiscoverRecord, Interface};
use crate::topology::{self, Roots};
use argh::FromArgs;
use regex_lite::Regex;
use std::collections::BTreeMap;
use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// The long flags of `cvslurm discover` (`--help` aside), for `cvslurm --list-flags discover`, the
/// completion and the documentation tests; a unit test in [`crate::cli`] holds it to [`Args`].
pub const FLAGS: &[&str] = &[
    "--node-name",
    "--interface-regex",
    "--physical-only",
    "--require-ip",
    "--sys-class-net",
    "--sys-root",
    "--topology",
    "--expect-sha256",
];

/// Print this node's network interfaces as one JSON record (run on workers through srun).
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "discover", help_triggers("-h", "--help", "help"))]
pub struct Args {
    /// node name (default $SLURMD_NODENAME)
    #[argh(option)]
    node_name: Option<String>,
    /// interface names to report (default ^(eth|eno|ens|enp|em))
    #[argh(option)]
    interface_regex: Option<String>,
    /// only NICs with a device link in sysfs: yes or no (default yes)
    #[argh(option)]
    physical_only: Option<String>,
    /// skip NICs without an IPv4 address: yes or no (default yes)
    #[argh(option)]
    require_ip: Option<String>,
    /// where to read interfaces (default <sys-root>/sys/class/net)
    #[argh(option)]
    sys_class_net: Option<PathBuf>,
    /// read <DIR>/sys and <DIR>/proc instead of /sys and /proc (default /)
    #[argh(option, default = "PathBuf::from(\"/\")")]
    sys_root: PathBuf,
    /// also report the GPUs and which GPUs each interface is nearest to (JobInterfaces)
    #[argh(switch)]
    topology: bool,
    /// refuse to run unless this executable's SHA-256 (hex) is this one and its directory is
    /// writable only by root and this user (inventory passes it with DiscoveryBcast)
    #[argh(option)]
    expect_sha256: Option<String>,
}

/// SHA-256 (hex) of the running executable (`/proc/self/exe`, which still reads after the
/// file was removed).
pub fn own_sha256() -> std::io::Result<String> {
    let bytes = fs::read("/proc/self/exe")?;
    Ok(crate::cloudvision::tls::sha256(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Checks a broadcast copy of the binary; an error means: do not run. The copy must lie in a
/// directory only root and this user can change ([`private_dir`]) and be byte for byte what
/// inventory sent.
fn check_copy(expect: Option<&str>) -> Result<(), String> {
    if let Some(want) = expect {
        let exe = fs::read_link("/proc/self/exe")
            .map_err(|e| format!("cannot find my own executable: {e}"))?;
        let exe = exe.to_string_lossy();
        let exe = Path::new(exe.strip_suffix(" (deleted)").unwrap_or(&exe));
        if let Some(dir) = exe.parent() {
            private_dir(dir, nix::unistd::geteuid().as_raw())?;
        }
        let got = own_sha256().map_err(|e| format!("cannot read my own executable: {e}"))?;
        if !got.eq_ignore_ascii_case(want.trim()) {
            return Err(format!(
                "this executable (SHA-256 {got}) is not the one inventory sent ({want}); not running"
            ));
        }
    }
    Ok(())
}

/// Checks that only root and `uid` can put or replace files in `dir`: it and every directory
/// above it belong to root or `uid`; `dir` is writable by no one else, and a directory above
/// it only when sticky (others cannot rename what they do not own there).
pub fn private_dir(dir: &Path, uid: u32) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let fix = "set DiscoveryBcastDir to a directory only root and the user running the \
               inventory can write";
    let mut at = Some(dir);
    let mut first = true;
    while let Some(d) = at {
        let m = fs::metadata(d).map_err(|e| format!("cannot check {}: {e}", d.display()))?;
        let others_write = m.mode() & 0o022 != 0;
        let sticky = m.mode() & 0o1000 != 0;
        if m.uid() != 0 && m.uid() != uid {
            return Err(format!(
                "this copy's directory {} is under {}, owned by uid {}: not running; {fix}",
                dir.display(),
                d.display(),
                m.uid()
            ));
        }
        if others_write && (first || !sticky) {
            return Err(format!(
                "this copy's directory {} is open to other users ({} has mode {:o}): not \
                 running; {fix}",
                dir.display(),
                d.display(),
                m.mode() & 0o7777
            ));
        }
        first = false;
        at = d.parent();
    }
    Ok(())
}

/// Runs `cvslurm discover`: prints the record on stdout; 1 when it cannot, 2 on a usage error.
pub fn run(a: Args) -> i32 {
    logging::init(Sink::Stderr, Path::new("/dev/null"), log::LevelFilter::Info);
    if let Err(e) = check_copy(a.expect_sha256.as_deref()) {
        log::error!("{e}");
        return 1;
    }
    let d = Config::default();
    let regex = match a.interface_regex.as_deref().map(Regex::new) {
        None => d.interface_regex,
        Some(Ok(r)) => r,
        Some(Err(e)) => return usage(&format!("--interface-regex: {e}")),
    };
    let flag = |v: Option<&str>, default: bool, name: &str| -> Result<bool, String> {
        v.map_or(Ok(default), |s| {
            parse_bool(s).map_err(|e| format!("{name}: {e}"))
        })
    };
    let filter = match (
        flag(
            a.physical_only.as_deref(),
            d.interface_physical_only,
            "--physical-only",
        ),
        flag(
            a.require_ip.as_deref(),
            d.interface_require_ip,
            "--require-ip",
        ),
    ) {
        (Ok(p), Ok(r)) => Filter {
            name_regex: regex,
            physical_only: p,
            require_ip: r,
        },
        (Err(e), _) | (_, Err(e)) => return usage(&e),
    };
    let roots = Roots::under(&a.sys_root);
    let sys_class_net = a
        .sys_class_net
        .unwrap_or_else(|| roots.sys.join("class/net"));
    match discover(
        a.node_name.as_deref(),
        &sys_class_net,
        &filter,
        a.topology.then_some(&roots),
    ) {
        Ok(rec) => {
            use std::io::Write;
            // One write, starting on a fresh line: srun passes each task's output through as
            // it comes, so another node's unterminated output (a worker printing garbage
            // without a newline) would otherwise swallow this record.
            // A record too long to reach srun in one piece goes as parts (see [`frame`]).
            let json = serde_json::to_string(&rec).expect("serializes");
            let line = frame(&rec.node_name, &json);
            let mut out = std::io::stdout().lock();
            if out
                .write_all(line.as_bytes())
                .and_then(|_| out.flush())
                .is_err()
            {
                return 1;
            }
            0
        }
        Err(e) => {
            log::error!("{e}");
            1
        }
    }
}

/// Which interfaces to report.
#[derive(Debug, Clone)]
pub struct Filter {
    /// Names must match.
    pub name_regex: Regex,
    /// Only NICs with a `device` link (physical).
    pub physical_only: bool,
    /// Skip NICs without an IPv4 address.
    pub require_ip: bool,
}

/// The interfaces under a `/sys/class/net`-like directory, filtered and sorted by name.
/// `ipv4` maps interface names to their addresses (from getifaddrs).
pub fn interfaces(
    sys_class_net: &Path,
    ipv4: &BTreeMap<String, Vec<Ipv4Addr>>,
    filter: &Filter,
) -> Result<Vec<Interface>, String> {
    let rd = fs::read_dir(sys_class_net)
        .map_err(|e| format!("cannot list {}: {e}", sys_class_net.display()))?;
    let mut out = Vec::new();
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let dir = entry.path();
        if name == "lo" || !filter.name_regex.is_match(&name) {
            continue;
        }
        if !valid_interface_name(&name) {
            log::warn!(
                "interface {name:?} skipped: not a valid interface name \
                 (1-15 bytes, no whitespace, '/', ':' or control characters)"
            );
            continue;
        }
        if filter.physical_only && !dir.join("device").exists() {
            continue;
        }
        let mac = fs::read_to_string(dir.join("address"))
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        if !is_mac(&mac) || mac == "00:00:00:00:00:00" {
            continue;
        }
        let ips: Vec<String> = ipv4
            .get(&name)
            .map(|v| v.iter().map(|a| a.to_string()).collect())
            .unwrap_or_default();
        if filter.require_ip && ips.is_empty() {
            continue;
        }
        out.push(Interface {
            name,
            mac_address: mac,
            ip_addresses: ips,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Every IPv4 address of every interface (secondaries too), in the kernel's order.
pub fn ipv4_addresses() -> Result<BTreeMap<String, Vec<Ipv4Addr>>, String> {
    let mut map: BTreeMap<String, Vec<Ipv4Addr>> = BTreeMap::new();
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| format!("getifaddrs failed: {e}"))?;
    for ifa in addrs {
        if let Some(sin) = ifa.address.as_ref().and_then(|a| a.as_sockaddr_in()) {
            let ip = sin.ip();
            let v = map.entry(ifa.interface_name.clone()).or_default();
            if !v.contains(&ip) {
                v.push(ip);
            }
        }
    }
    Ok(map)
}

/// The host name up to the first dot.
pub fn short_hostname() -> String {
    nix::unistd::gethostname()
        .map(|h| {
            h.to_string_lossy()
                .split('.')
                .next()
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_default()
}

/// Builds this node's record. `node_name` overrides `SLURMD_NODENAME`; with `topology`, the
/// GPU nearness of the interfaces is read from those sysfs/procfs roots.
pub fn discover(
    node_name: Option<&str>,
    sys_class_net: &Path,
    filter: &Filter,
    topology: Option<&Roots>,
) -> Result<DiscoverRecord, String> {
    let node_name = match node_name {
        Some(n) => n.to_string(),
        None => std::env::var("SLURMD_NODENAME")
            .ok()
            .filter(|n| !n.is_empty())
            .ok_or("SLURMD_NODENAME is not set: run discover through srun, or give --node-name")?,
    };
    let ipv4 = ipv4_addresses()?;
    let interfaces = interfaces(sys_class_net, &ipv4, filter)?;
    // The node's record never depends on its topology: a topology that cannot be read is
    // left out, and why is said (here on stderr, and in the record for the inventory).
    let (topology, topology_error) = match topology {
        None => (None, None),
        Some(roots) => {
            let names: Vec<&str> = interfaces.iter().map(|i| i.name.as_str()).collect();
            match topology::read(roots, sys_class_net, &names) {
                Ok(t) => (t, None),
                Err(mut e) => {
                    log::warn!("GPU topology not reported: {e}");
                    let mut end = e.len().min(1000);
                    while !e.is_char_boundary(end) {
                        end -= 1;
                    }
                    e.truncate(end);
                    (None, Some(e))
                }
            }
        }
    };
    let rec = DiscoverRecord {
        node_name,
        hostname: short_hostname(),
        location: std::env::var("SLURM_CLUSTER_NAME")
            .ok()
            .filter(|c| !c.is_empty()),
        interfaces,
        topology,
        topology_error,
    };
    rec.validate()?;
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fake_sys(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cvslurm-sys-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        for (name, mac, physical) in [
            ("eth0", "AA:BB:CC:DD:EE:01\n", true),
            ("ens1f0", "aa:bb:cc:dd:ee:02\n", true),
            ("ens2", "aa:bb:cc:dd:ee:03\n", true),
            ("veth9", "aa:bb:cc:dd:ee:04\n", false),
            ("eth1", "aa:bb:cc:dd:ee:05\n", false),
            ("lo", "00:00:00:00:00:00\n", false),
            ("eno1", "00:00:00:00:00:00\n", true),
        ] {
            let p = d.join(name);
            fs::create_dir_all(&p).unwrap();
            fs::write(p.join("address"), mac).unwrap();
            if physical {
                fs::create_dir_all(p.join("device")).unwrap();
            }
        }
        d
    }

    #[test]
    fn filters_and_sorts() {
        let d = fake_sys("filter");
        let mut ips = BTreeMap::new();
        ips.insert(
            "eth0".to_string(),
            vec![Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)],
        );
        ips.insert("ens1f0".to_string(), vec![Ipv4Addr::new(10, 1, 0, 1)]);
        ips.insert("eth1".to_string(), vec![Ipv4Addr::new(10, 2, 0, 1)]);
        ips.insert("eno1".to_string(), vec![Ipv4Addr::new(10, 3, 0, 1)]);
        let f = Filter {
            name_regex: Regex::new("^(eth|eno|ens|enp|em)").unwrap(),
            physical_only: true,
            require_ip: true,
        };
        let got = interfaces(&d, &ips, &f).unwrap();
        let names: Vec<_> = got.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["ens1f0", "eth0"]);
        assert_eq!(got[1].mac_address, "aa:bb:cc:dd:ee:01");
        assert_eq!(got[1].ip_addresses, ["10.0.0.1", "10.0.0.2"]);
        let all = Filter {
            physical_only: false,
            require_ip: false,
            ..f
        };
        let names: Vec<_> = interfaces(&d, &ips, &all)
            .unwrap()
            .into_iter()
            .map(|i| i.name)
            .collect();
        assert_eq!(names, ["ens1f0", "ens2", "eth0", "eth1"]);
        fs::remove_dir_all(&d).unwrap();
    }
}

//! The worker's side of discovery: what `cvslurm discover` reads on a node (its interfaces,
//! addresses, host name and, with `--topology`, its GPU nearness) and the record it builds
//! ([`record::DiscoverRecord`], printed as one line or as `cvslurm-part` lines:
//! [`record::frame`]). The mode's entry point is [`crate::mode::discover`]; the controller's
//! side (srun, collecting the records) is [`crate::inventory::discovery`].

pub mod published;
pub mod record;
pub mod topology;

use crate::cloudvision::payload::is_mac;
use record::{valid_interface_name, DiscoverRecord, Interface};
use regex_lite::Regex;
use std::collections::BTreeMap;
use std::fs;
use std::net::Ipv4Addr;
use std::path::Path;
use topology::Roots;

/// SHA-256 (hex) of the running executable (`/proc/self/exe`, which still reads after the
/// file was removed).
pub fn own_sha256() -> std::io::Result<String> {
    let bytes = fs::read("/proc/self/exe")?;
    Ok(crate::cloudvision::tls::sha256(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
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
    // Before anything is read: what follows is at least as new as this second.
    let taken_at = crate::timefmt::now_epoch();
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
        taken_at: Some(taken_at),
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

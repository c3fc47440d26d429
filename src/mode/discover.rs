//! `cvslurm discover`: run on a worker (through srun), print its network interfaces as one
//! JSON line. Also the record type and its validation, used by `inventory` to read the lines.

use super::common::usage;
use crate::config::{parse_bool, Config};
use crate::logging::{self, Sink};
use crate::payload::{DataInterface, Key, NodeConfig};
use crate::topology::{self, Roots, Topology};
use argh::FromArgs;
use regex_lite::Regex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// Print this node's network interfaces as one JSON line (run on workers through srun).
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
    /// refuse to run unless this executable's SHA-256 (hex) is this one (inventory passes it
    /// with DiscoveryBcast, so a copy that is not what it sent never reports)
    #[argh(option)]
    expect_sha256: Option<String>,
}

/// SHA-256 (hex) of the running executable (`/proc/self/exe`, which still reads after the
/// file was removed).
pub fn own_sha256() -> std::io::Result<String> {
    let bytes = fs::read("/proc/self/exe")?;
    Ok(crate::tls::sha256(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Checks a broadcast copy of the binary; an error means: do not run.
fn check_copy(expect: Option<&str>) -> Result<(), String> {
    if let Some(want) = expect {
        let got = own_sha256().map_err(|e| format!("cannot read my own executable: {e}"))?;
        if !got.eq_ignore_ascii_case(want.trim()) {
            return Err(format!(
                "this executable (SHA-256 {got}) is not the one inventory sent ({want}); not running"
            ));
        }
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
            let json = serde_json::to_string(&rec).expect("serializes");
            let line = if rec.topology.is_some() {
                // Only inventories that asked for --topology read parts.
                format!("\n{}", to_parts(&rec.node_name, &json))
            } else {
                format!("\n{json}\n")
            };
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

/// One interface in a discovery record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interface {
    /// Interface name (`eth0`).
    pub name: String,
    /// Lower-case MAC address.
    pub mac_address: String,
    /// IPv4 addresses, primary first.
    pub ip_addresses: Vec<String>,
}

/// What `discover` prints: one node's identity and data interfaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscoverRecord {
    /// The Slurm node name (`SLURMD_NODENAME`).
    pub node_name: String,
    /// The host name, up to the first dot.
    pub hostname: String,
    /// The cluster name (`SLURM_CLUSTER_NAME`), if known.
    pub location: Option<String>,
    /// The interfaces, sorted by name.
    pub interfaces: Vec<Interface>,
    /// GPUs and the GPU nearness of the interfaces (`discover --topology` on a node with
    /// GPUs). Never part of the NodeConfig; absent in records of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<Topology>,
}

impl DiscoverRecord {
    /// Parses and validates one line of discover output. The error says what is wrong.
    pub fn parse_line(line: &str) -> Result<DiscoverRecord, String> {
        let rec: DiscoverRecord =
            serde_json::from_str(line).map_err(|e| format!("not a discover record: {e}"))?;
        rec.validate()?;
        Ok(rec)
    }

    /// Checks names, MAC and IPv4 syntax.
    pub fn validate(&self) -> Result<(), String> {
        if self.node_name.is_empty() || self.node_name.len() > 255 {
            return Err("empty or overlong node_name".into());
        }
        if self.hostname.len() > 255
            || self
                .hostname
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(format!("bad hostname {:?}", self.hostname));
        }
        if self.interfaces.len() > 4096 {
            return Err("more than 4096 interfaces".into());
        }
        let mut names = std::collections::BTreeSet::new();
        for i in &self.interfaces {
            if !names.insert(i.name.as_str()) {
                return Err(format!("interface {} listed twice", i.name));
            }
            if i.ip_addresses.len() > 1024 {
                return Err(format!("interface {}: more than 1024 addresses", i.name));
            }
            if i.name.is_empty() || i.name.len() > 64 {
                return Err(format!("bad interface name {:?}", i.name));
            }
            if !is_mac(&i.mac_address) {
                return Err(format!("interface {}: bad MAC {:?}", i.name, i.mac_address));
            }
            for ip in &i.ip_addresses {
                if ip.parse::<Ipv4Addr>().is_err() {
                    return Err(format!("interface {}: bad IPv4 address {ip:?}", i.name));
                }
            }
        }
        if let Some(t) = &self.topology {
            t.validate(&names)?;
        }
        Ok(())
    }

    /// The NodeConfig for CloudVision.
    pub fn to_node_config(&self, cluster: &str) -> NodeConfig {
        NodeConfig {
            key: Key {
                id: self.node_name.clone(),
            },
            location: Some(cluster.to_string()),
            hostname: Some(self.hostname.clone()),
            data_interfaces: self
                .interfaces
                .iter()
                .map(|i| DataInterface {
                    name: i.name.clone(),
                    mac_address: i.mac_address.clone(),
                    ip_addresses: i.ip_addresses.clone().into(),
                })
                .collect::<Vec<_>>()
                .into(),
        }
    }
}

/// The prefix of the lines a long record is split into ([`to_parts`]).
pub const PART_PREFIX: &str = "cvslurm-part ";
/// The longest line [`to_parts`] writes. slurmstepd forwards a task's output to srun in
/// messages of at most 1024 bytes, cut at the last newline: a longer line is cut and, when
/// several nodes answer one srun, interleaved with theirs. Shorter lines arrive whole.
const PART_LINE_MAX: usize = 1000;
/// The most parts one record may have.
const MAX_PARTS: usize = 4096;

/// Splits a record's JSON into lines `cvslurm-part <node> <i> <n> <chunk>` of at most
/// [`PART_LINE_MAX`] bytes each, newline included (chunks are cut on character boundaries).
pub fn to_parts(node: &str, json: &str) -> String {
    let room = PART_LINE_MAX
        .saturating_sub(PART_PREFIX.len() + node.len() + 2 * 6 + 1)
        .max(64);
    let mut chunks = Vec::new();
    let mut rest = json;
    while !rest.is_empty() {
        let mut end = room.min(rest.len());
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        chunks.push(&rest[..end]);
        rest = &rest[end..];
    }
    let n = chunks.len();
    chunks
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{PART_PREFIX}{node} {} {n} {c}\n", i + 1))
        .collect()
}

/// Reads discover output: whole records (one JSON line, the old form) and records split into
/// parts by [`to_parts`], which may arrive interleaved with other nodes' lines. Memory stays
/// bounded: each record at most `max_record` bytes, all unfinished records together at most
/// `max_pending`.
#[derive(Debug)]
pub struct RecordReader {
    max_record: usize,
    max_pending: usize,
    pending: BTreeMap<String, (usize, BTreeMap<usize, String>, usize)>,
    pending_bytes: usize,
}

impl RecordReader {
    /// A reader with these bounds.
    pub fn new(max_record: usize, max_pending: usize) -> RecordReader {
        RecordReader {
            max_record,
            max_pending,
            pending: BTreeMap::new(),
            pending_bytes: 0,
        }
    }

    /// Takes one non-empty line; returns a record (or why the line or record is bad) when one
    /// is complete, `None` while a split record still misses parts.
    pub fn push(&mut self, line: &str) -> Option<Result<DiscoverRecord, String>> {
        let Some(rest) = line.strip_prefix(PART_PREFIX) else {
            return Some(DiscoverRecord::parse_line(line));
        };
        let mut f = rest.splitn(4, ' ');
        let (Some(node), Some(i), Some(n), Some(chunk)) = (f.next(), f.next(), f.next(), f.next())
        else {
            return Some(Err("bad record part: too few fields".into()));
        };
        let (Ok(i), Ok(n)) = (i.parse::<usize>(), n.parse::<usize>()) else {
            return Some(Err("bad record part: numbers expected".into()));
        };
        if node.is_empty() || node.len() > 255 || i == 0 || i > n || n > MAX_PARTS {
            return Some(Err(format!("bad record part {i} of {n}")));
        }
        if self.pending_bytes + chunk.len() > self.max_pending {
            return Some(Err("too much unfinished record output; part dropped".into()));
        }
        let entry = self
            .pending
            .entry(node.to_string())
            .or_insert_with(|| (n, BTreeMap::new(), 0));
        if entry.0 != n || entry.1.contains_key(&i) || entry.2 + chunk.len() > self.max_record {
            let (_, _, bytes) = self.pending.remove(node).expect("present");
            self.pending_bytes -= bytes;
            return Some(Err(format!(
                "record parts of node {node:?} disagree, repeat or exceed {} bytes",
                self.max_record
            )));
        }
        entry.1.insert(i, chunk.to_string());
        entry.2 += chunk.len();
        self.pending_bytes += chunk.len();
        if entry.1.len() < n {
            return None;
        }
        let (_, parts, bytes) = self.pending.remove(node).expect("present");
        self.pending_bytes -= bytes;
        let json: String = parts.into_values().collect();
        Some(DiscoverRecord::parse_line(&json).and_then(|r| {
            if r.node_name == node {
                Ok(r)
            } else {
                Err(format!(
                    "record parts of node {node:?} hold node {:?}",
                    r.node_name
                ))
            }
        }))
    }
}

/// True for a lower-case `aa:bb:cc:dd:ee:ff`.
pub fn is_mac(s: &str) -> bool {
    s.len() == 17
        && s.split(':').count() == 6
        && s.split(':').all(|p| {
            p.len() == 2
                && p.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
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
    let topology = topology.and_then(|roots| {
        let names: Vec<&str> = interfaces.iter().map(|i| i.name.as_str()).collect();
        topology::read(roots, sys_class_net, &names)
    });
    let rec = DiscoverRecord {
        node_name,
        hostname: short_hostname(),
        location: std::env::var("SLURM_CLUSTER_NAME")
            .ok()
            .filter(|c| !c.is_empty()),
        interfaces,
        topology,
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

    #[test]
    fn record_validation() {
        let ok = r#"{"node_name":"n1","hostname":"n1","location":"c","interfaces":[{"name":"eth0","mac_address":"02:99:00:00:01:01","ip_addresses":["10.99.0.11"]}]}"#;
        let r = DiscoverRecord::parse_line(ok).unwrap();
        assert_eq!(
            r.to_node_config("c").data_interfaces.values[0]
                .ip_addresses
                .values,
            ["10.99.0.11"]
        );
        for bad in [
            "garbage",
            "",
            r#"{"node_name":"","hostname":"x","location":null,"interfaces":[]}"#,
            r#"{"node_name":"n1","hostname":"x","location":null,"interfaces":[{"name":"eth0","mac_address":"ZZ","ip_addresses":[]}]}"#,
            r#"{"node_name":"n1","hostname":"x","location":null,"interfaces":[{"name":"eth0","mac_address":"02:99:00:00:01:01","ip_addresses":["300.1.1.1"]}]}"#,
            r#"{"node_name":"n1","hostname":"x","location":null,"interfaces":[],"extra":1}"#,
            r#"{"node_name":"n1","hostname":"a b","location":null,"interfaces":[]}"#,
            r#"{"node_name":"n1","hostname":"x","location":null,"interfaces":[{"name":"eth0","mac_address":"02:99:00:00:01:01","ip_addresses":[]},{"name":"eth0","mac_address":"02:99:00:00:01:02","ip_addresses":[]}]}"#,
        ] {
            assert!(DiscoverRecord::parse_line(bad).is_err(), "{bad}");
        }
    }

    /// A DGX record (about 2.6 kB) goes out in lines under 1000 bytes and is put together
    /// again, even interleaved line by line with another node's parts and whole records.
    #[test]
    fn split_records_survive_interleaving() {
        let a = crate::topology::fixtures::record("dgx1", "dgx-a100", "02:dd:00:01");
        let b = crate::topology::fixtures::record("dgx2", "dgx-a100", "02:dd:00:02");
        let (ja, jb) = (
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&b).unwrap(),
        );
        assert!(ja.len() > 2000, "{}", ja.len());
        let pa = to_parts("dgx1", &ja);
        let pb = to_parts("dgx2", &jb);
        assert!(pa.lines().all(|l| l.len() < PART_LINE_MAX), "{pa}");
        assert!(pa.lines().count() >= 3);
        let old = r#"{"node_name":"n1","hostname":"n1","location":null,"interfaces":[]}"#;
        let mut lines: Vec<&str> = Vec::new();
        for (x, y) in pa.lines().zip(pb.lines()) {
            lines.extend([y, x, old]);
        }
        let mut r = RecordReader::new(1 << 20, 1 << 22);
        let got: Vec<DiscoverRecord> = lines
            .iter()
            .filter_map(|l| r.push(l))
            .map(|x| x.unwrap())
            .collect();
        let names: Vec<&str> = got.iter().map(|g| g.node_name.as_str()).collect();
        assert_eq!(
            names.iter().filter(|n| **n == "n1").count(),
            pa.lines().count()
        );
        assert_eq!(got.iter().find(|g| g.node_name == "dgx1"), Some(&a));
        assert_eq!(got.iter().find(|g| g.node_name == "dgx2"), Some(&b));
        assert_eq!(r.pending_bytes, 0);
        // Hostile parts: repeated, inconsistent, oversized, forged node, garbage numbers.
        let first = pa.lines().next().unwrap();
        let mut r = RecordReader::new(1 << 20, 1 << 22);
        assert!(r.push(first).is_none());
        assert!(r.push(first).unwrap().unwrap_err().contains("repeat"));
        assert_eq!(r.pending_bytes, 0);
        let forged = to_parts("dgx9", &ja);
        let mut r = RecordReader::new(1 << 20, 1 << 22);
        let out: Vec<_> = forged.lines().filter_map(|l| r.push(l)).collect();
        assert!(out[0].as_ref().unwrap_err().contains("hold node \"dgx1\""));
        let mut small = RecordReader::new(1500, 1 << 22);
        let errs: Vec<_> = pa.lines().filter_map(|l| small.push(l)).collect();
        assert!(errs[0].as_ref().unwrap_err().contains("exceed 1500 bytes"));
        let mut tight = RecordReader::new(1 << 20, 1200);
        let errs: Vec<_> = pa.lines().filter_map(|l| tight.push(l)).collect();
        assert!(errs[0]
            .as_ref()
            .unwrap_err()
            .contains("too much unfinished"));
        for bad in [
            "cvslurm-part n1 0 2 x",
            "cvslurm-part n1 3 2 x",
            "cvslurm-part n1 x 2 y",
            "cvslurm-part n1 1",
        ] {
            assert!(
                RecordReader::new(1 << 20, 1 << 20)
                    .push(bad)
                    .unwrap()
                    .is_err(),
                "{bad}"
            );
        }
    }

    /// Records with topology: older records still parse, the NodeConfig is byte-identical
    /// with or without it, and hostile topology is refused.
    #[test]
    fn topology_in_records() {
        let rec = crate::topology::fixtures::record("dgx1", "dgx-a100", "02:dd:00:01");
        let line = serde_json::to_string(&rec).unwrap();
        assert_eq!(DiscoverRecord::parse_line(&line).unwrap(), rec);
        let mut plain = rec.clone();
        plain.topology = None;
        let plain_line = serde_json::to_string(&plain).unwrap();
        assert!(!plain_line.contains("topology"));
        assert_eq!(
            serde_json::to_vec(&rec.to_node_config("c")).unwrap(),
            serde_json::to_vec(&plain.to_node_config("c")).unwrap()
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let bad = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut w = v.clone();
            f(&mut w);
            DiscoverRecord::parse_line(&w.to_string()).unwrap_err()
        };
        let e = bad(&|w| w["topology"]["nics"][0]["gpus"][0] = 42.into());
        assert!(e.contains("names an unknown GPU"), "{e}");
        let e = bad(&|w| w["topology"]["nics"][0]["name"] = "eth9".into());
        assert!(e.contains("not a reported interface"), "{e}");
        let e = bad(&|w| w["topology"]["gpus"][1]["index"] = 0.into());
        assert!(e.contains("repeated GPU index"), "{e}");
        let e = bad(&|w| w["topology"]["gpus"][0]["pci"] = "../../etc".into());
        assert!(e.contains("bad GPU PCI address"), "{e}");
        let e = bad(&|w| w["topology"]["nics"][0]["near"] = "adjacent".into());
        assert!(e.contains("not a discover record"), "{e}");
        let e = bad(&|w| w["topology"]["extra"] = 1.into());
        assert!(e.contains("unknown field"), "{e}");
        let e = bad(&|w| {
            let g = w["topology"]["gpus"][0].clone();
            let many: Vec<serde_json::Value> = (0..65)
                .map(|i| {
                    let mut g = g.clone();
                    g["index"] = i.into();
                    g
                })
                .collect();
            w["topology"]["gpus"] = many.into();
        });
        assert!(e.contains("more than 64 GPUs"), "{e}");
    }
}

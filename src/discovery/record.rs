//! The record a worker's `cvslurm discover` prints and the controller's inventory reads: its
//! type, its validation (every byte of it comes from a worker, and is hostile until checked),
//! and the `cvslurm-part` lines that carry long records through srun.

use crate::cloudvision::payload::{is_mac, DataInterface, Key, NodeConfig};
use crate::config::NodeHostname;
use crate::discovery::topology::Topology;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

/// The longest discover line accepted from a worker.
pub const MAX_RECORD_BYTES: usize = 1024 * 1024;

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
    /// Why `discover --topology` reports no topology although asked (the GPUs could not be
    /// read or numbered): the record is kept, without topology. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_error: Option<String>,
    /// When discovery began on the node (epoch seconds, the node's clock, the one its
    /// slurmd's `SlurmdStartTime` comes from): a record is fresh for job attribution only
    /// if taken in a later second than the node's slurmd started
    /// (`inventory::freshness`). Absent in records of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_at: Option<i64>,
}

/// The longest `topology_error` accepted.
const MAX_TOPOLOGY_ERROR: usize = 1024;

/// Is `name` an interface name as Linux allows it (`dev_valid_name`): 1 to 15 bytes, not `.`
/// or `..`, no `/`, `:` or whitespace? Control characters are refused too (the kernel lets
/// them through; a name is printed and logged).
pub fn valid_interface_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() < 16
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control())
}

impl DiscoverRecord {
    /// Parses and validates one line of discover output. The error says what is wrong (with
    /// control characters escaped: serde echoes a worker's unknown key). An interface whose
    /// name Linux would not allow is dropped, with a warning, and the rest of the record kept.
    pub fn parse_line(line: &str) -> Result<DiscoverRecord, String> {
        let mut rec: DiscoverRecord = serde_json::from_str(line).map_err(|e| {
            let e = e.to_string();
            format!(
                "not a discover record: {}",
                crate::logging::escape_control(&e)
            )
        })?;
        rec.drop_invalid_interfaces();
        rec.validate()?;
        Ok(rec)
    }

    /// Removes the interfaces whose name [`valid_interface_name`] refuses (and their topology
    /// entries), logging each.
    fn drop_invalid_interfaces(&mut self) {
        let node = self.node_name.clone();
        let mut dropped: Vec<String> = Vec::new();
        self.interfaces.retain(|i| {
            let ok = valid_interface_name(&i.name);
            if !ok {
                log::warn!(
                    "node {node:?}: interface {:?} dropped: not a valid interface name \
                     (1-15 bytes, no whitespace, '/', ':' or control characters)",
                    i.name
                );
                dropped.push(i.name.clone());
            }
            ok
        });
        if let Some(t) = &mut self.topology {
            t.nics.retain(|n| !dropped.contains(&n.name));
        }
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
            if !valid_interface_name(&i.name) {
                return Err(format!("bad interface name {:?}", i.name));
            }
            if !names.insert(i.name.as_str()) {
                return Err(format!("interface {} listed twice", i.name));
            }
            if i.ip_addresses.len() > 1024 {
                return Err(format!("interface {}: more than 1024 addresses", i.name));
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
        if let Some(t) = self.taken_at {
            if crate::timefmt::format_epoch(t).is_none() || t <= 0 {
                return Err(format!(
                    "taken_at {t} is not a time from 1970 to the end of year 9999"
                ));
            }
        }
        if self
            .topology_error
            .as_ref()
            .is_some_and(|e| e.len() > MAX_TOPOLOGY_ERROR)
        {
            return Err(format!(
                "topology_error longer than {MAX_TOPOLOGY_ERROR} bytes"
            ));
        }
        Ok(())
    }

    /// The NodeConfig for CloudVision. Its `hostname` is decided here, the one place:
    /// the Slurm node name (`NodeHostname=nodename`, as Arista's clients send), or the
    /// worker's own host name (`hostname`; the node name when the worker reported none).
    /// The key is the bare node name; a cluster qualifier is added as it is sent
    /// ([`crate::cloudvision::payload::NodeKeys`]).
    pub fn to_node_config(&self, cluster: &str, hostname: NodeHostname) -> NodeConfig {
        let hostname = match hostname {
            NodeHostname::HostName if !self.hostname.is_empty() => &self.hostname,
            _ => &self.node_name,
        };
        NodeConfig {
            key: Key {
                id: self.node_name.clone(),
            },
            location: Some(cluster.to_string()),
            hostname: Some(hostname.clone()),
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

/// How `discover` writes a record: on a fresh line (so no unterminated output before it can
/// swallow it), as one JSON line when that line reaches srun whole, else as [`to_parts`].
/// slurmstepd forwards a task's output in messages of at most 1024 bytes and `srun --label`
/// ends each message's partial line with a newline, so a longer line would arrive as several
/// labelled lines that no longer parse. Short records keep the old form, which every
/// inventory reads; [`RecordReader`] reads both.
pub fn frame(node: &str, json: &str) -> String {
    if json.len() < PART_LINE_MAX {
        format!("\n{json}\n")
    } else {
        format!("\n{}", to_parts(node, json))
    }
}

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
/// parts by `to_parts`, which may arrive interleaved with other nodes' lines. Memory stays
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

#[cfg(test)]
mod tests {
    use super::*;

    /// NodeConfig `hostname`: the Slurm node name by default, as Arista's
    /// clients send it and their fake server requires (`hostname == key.id`), even where the
    /// worker's host name differs; `NodeHostname=hostname` sends the worker's host name.
    #[test]
    fn node_config_hostname_is_the_node_name_unless_asked() {
        let line = r#"{"node_name":"gpu7","hostname":"r12-u3","location":"c","interfaces":[]}"#;
        let r = DiscoverRecord::parse_line(line).unwrap();
        let n = r.to_node_config("c", NodeHostname::default());
        assert_eq!(n.key.id, "gpu7");
        assert_eq!(n.hostname.as_deref(), Some("gpu7"));
        let n = r.to_node_config("c", NodeHostname::HostName);
        assert_eq!(n.key.id, "gpu7");
        assert_eq!(n.hostname.as_deref(), Some("r12-u3"));
        // A worker that reported no host name: its node name, whatever the setting.
        let line = r#"{"node_name":"gpu7","hostname":"","location":"c","interfaces":[]}"#;
        let r = DiscoverRecord::parse_line(line).unwrap();
        let n = r.to_node_config("c", NodeHostname::HostName);
        assert_eq!(n.hostname.as_deref(), Some("gpu7"));
    }

    #[test]
    fn record_validation() {
        let ok = r#"{"node_name":"n1","hostname":"n1","location":"c","interfaces":[{"name":"eth0","mac_address":"02:99:00:00:01:01","ip_addresses":["10.99.0.11"]}]}"#;
        let r = DiscoverRecord::parse_line(ok).unwrap();
        assert_eq!(
            r.to_node_config("c", NodeHostname::NodeName)
                .data_interfaces
                .values[0]
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

    /// `taken_at`: optional (older records parse), kept, and refused outside 1970
    /// to the end of year 9999 or when not an integer.
    #[test]
    fn taken_at_is_optional_and_bounded() {
        let with = |t: &str| {
            format!(
                r#"{{"node_name":"n1","hostname":"n1","location":null,"interfaces":[],"taken_at":{t}}}"#
            )
        };
        let old = r#"{"node_name":"n1","hostname":"n1","location":null,"interfaces":[]}"#;
        assert_eq!(DiscoverRecord::parse_line(old).unwrap().taken_at, None);
        let r = DiscoverRecord::parse_line(&with("1796524979")).unwrap();
        assert_eq!(r.taken_at, Some(1_796_524_979));
        assert!(serde_json::to_string(&r)
            .unwrap()
            .contains(r#""taken_at":1796524979"#));
        for bad in [
            "0",
            "-1",
            "253402300800",
            "1e9",
            "\"1796524979\"",
            "1796524979.5",
        ] {
            assert!(DiscoverRecord::parse_line(&with(bad)).is_err(), "{bad}");
        }
    }

    /// Interface names follow Linux's rule (dev_valid_name), control characters refused too;
    /// a record from a worker loses a bad interface, not the node.
    #[test]
    fn interface_names_as_linux_allows_them() {
        for ok in [
            "eth0",
            "enp225s0f1",
            "a",
            "ib0.8001",
            "x-y_z@1",
            "123456789012345",
        ] {
            assert!(valid_interface_name(ok), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "1234567890123456",
            "eth0\n<3>x\u{1b}[2J",
            "eth 0",
            "eth\t0",
            "eth/0",
            "eth0:1",
            "eth\u{1b}",
            "eth\u{7f}",
            "eth\u{9b}",
            "eth\u{a0}",
        ] {
            assert!(!valid_interface_name(bad), "{bad:?}");
        }
        let line = r#"{"node_name":"n1","hostname":"n1","location":null,"interfaces":[{"name":"eth0\n<3>x\u001b[2J","mac_address":"02:99:00:00:01:01","ip_addresses":[]},{"name":"eth1","mac_address":"02:99:00:00:01:02","ip_addresses":[]}]}"#;
        let r = DiscoverRecord::parse_line(line).unwrap();
        let names: Vec<&str> = r.interfaces.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["eth1"]);
        // Validation alone (what discover checks before printing) refuses it.
        let mut bad = r.clone();
        bad.interfaces[0].name = "eth1:0".into();
        assert!(bad.validate().unwrap_err().contains("bad interface name"));
        // serde echoes an unknown key; the error carries it escaped.
        let forged = r#"{"node_name":"n1","hostname":"n1","location":null,"interfaces":[],"\n2026-01-01T00:00:00Z cvslurm[1] ERROR forged\u001b[2J":1}"#;
        let e = DiscoverRecord::parse_line(forged).unwrap_err();
        assert!(!e.contains('\n') && !e.contains('\u{1b}'), "{e:?}");
        assert!(
            e.contains("\\n2026-01-01T00:00:00Z cvslurm[1] ERROR forged\\x1b[2J"),
            "{e:?}"
        );
    }

    /// Any record reaches srun whole: short ones as one JSON line (the form older inventories
    /// read), longer ones, with or without topology, as parts under 1000 bytes a line.
    #[test]
    fn frame_keeps_every_line_short() {
        let nic = |i: usize| Interface {
            name: format!("ens3f{i}"),
            mac_address: format!("02:aa:00:00:01:{i:02x}"),
            ip_addresses: vec![format!("10.96.1.{i}")],
        };
        let rec = |n: usize| DiscoverRecord {
            node_name: "n1".into(),
            hostname: "n1".into(),
            location: Some("c".into()),
            interfaces: (0..n).map(nic).collect(),
            topology: None,
            topology_error: None,
            taken_at: None,
        };
        let short = serde_json::to_string(&rec(2)).unwrap();
        assert_eq!(frame("n1", &short), format!("\n{short}\n"));
        for n in [12, 16, 200] {
            let json = serde_json::to_string(&rec(n)).unwrap();
            assert!(json.len() > 1000, "{n}: {}", json.len());
            let framed = frame("n1", &json);
            assert!(framed.starts_with('\n'));
            assert!(framed.lines().all(|l| l.len() < PART_LINE_MAX), "{framed}");
            let mut r = RecordReader::new(1 << 20, 1 << 22);
            let got: Vec<_> = framed
                .lines()
                .filter(|l| !l.is_empty())
                .filter_map(|l| r.push(l))
                .collect();
            assert_eq!(got, [Ok(rec(n))]);
        }
    }

    /// A DGX record (about 2.6 kB) goes out in lines under 1000 bytes and is put together
    /// again, even interleaved line by line with another node's parts and whole records.
    #[test]
    fn split_records_survive_interleaving() {
        let a = crate::discovery::topology::fixtures::record("dgx1", "dgx-a100", "02:dd:00:01");
        let b = crate::discovery::topology::fixtures::record("dgx2", "dgx-a100", "02:dd:00:02");
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
        let rec = crate::discovery::topology::fixtures::record("dgx1", "dgx-a100", "02:dd:00:01");
        let line = serde_json::to_string(&rec).unwrap();
        assert_eq!(DiscoverRecord::parse_line(&line).unwrap(), rec);
        let mut plain = rec.clone();
        plain.topology = None;
        let plain_line = serde_json::to_string(&plain).unwrap();
        assert!(!plain_line.contains("topology"));
        assert_eq!(
            serde_json::to_vec(&rec.to_node_config("c", NodeHostname::NodeName)).unwrap(),
            serde_json::to_vec(&plain.to_node_config("c", NodeHostname::NodeName)).unwrap()
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

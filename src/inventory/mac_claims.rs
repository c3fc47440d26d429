//! A MAC belongs to one node. srun binds a discover record to the node its task ran on, but a
//! worker could still report another node's NICs under its own name: both NodeConfigs would
//! carry those MACs, and with `JobInterfaces=gpu` one node's jobs would be sent on the other's
//! ports. So a fresh record that claims a MAC another node already reported (its record in
//! StateDir, `nodes/<node>.json`) is held: that node fails discovery with a message naming
//! both nodes, and its last record and NodeConfig stay as they were.
//!
//! A host name belongs to one node too. With `NodeHostname=hostname` the NodeConfig carries
//! the host name the worker reported, and a worker could report another node's: two
//! NodeConfigs would then carry it. [`drop_claimed_hostnames`] applies the same ownership
//! rule to names: a claimed name is dropped from the record (its NodeConfig carries the
//! node's Slurm name instead), with a warning.

use super::Discovered;
use crate::discovery::record::DiscoverRecord;
use std::collections::{BTreeMap, BTreeSet};

/// Holds the records in `found` that claim a MAC of another node. `stored` holds the nodes'
/// records from earlier passes (StateDir). For each MAC, the nodes that claim it are those
/// whose record (this pass's if it has one, else the stored one) lists it. When two or more
/// do, the one whose stored record already listed it keeps it, and the others' fresh records
/// are held; when none or several of them listed it before, there is no telling who is right,
/// and every fresh claim is held. Interfaces of one node may share a MAC (VLANs, bonds).
pub fn hold_claimed_macs(found: &mut Discovered, stored: &BTreeMap<String, DiscoverRecord>) {
    let macs_of = |r: &DiscoverRecord| -> BTreeMap<String, String> {
        r.interfaces
            .iter()
            .rev()
            .map(|i| (i.mac_address.clone(), i.name.clone()))
            .collect()
    };
    let fresh: BTreeMap<&str, BTreeMap<String, String>> = found
        .iter()
        .filter_map(|(n, r)| Some((n.as_str(), macs_of(r.as_ref().ok()?))))
        .collect();
    let before: BTreeMap<&str, BTreeMap<String, String>> = stored
        .iter()
        .map(|(n, r)| (n.as_str(), macs_of(r)))
        .collect();
    // MAC -> the nodes that claim it now.
    let mut claims: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (node, macs) in before.iter().filter(|(n, _)| !fresh.contains_key(*n)) {
        for mac in macs.keys() {
            claims.entry(mac).or_default().insert(node);
        }
    }
    for (node, macs) in &fresh {
        for mac in macs.keys() {
            claims.entry(mac).or_default().insert(node);
        }
    }
    // Node held -> why (its first MAC claimed by another node).
    let mut held: BTreeMap<String, String> = BTreeMap::new();
    for (mac, nodes) in claims.iter().filter(|(_, n)| n.len() > 1) {
        let prior: Vec<&str> = nodes
            .iter()
            .copied()
            .filter(|n| before.get(n).is_some_and(|m| m.contains_key(*mac)))
            .collect();
        let owner = (prior.len() == 1).then(|| prior[0]);
        for node in nodes.iter().filter(|n| fresh.contains_key(*n)) {
            if Some(*node) == owner {
                continue;
            }
            let other = owner.unwrap_or_else(|| {
                nodes
                    .iter()
                    .copied()
                    .find(|n| n != node)
                    .expect("two or more")
            });
            let iface = &fresh[node][*mac];
            held.entry(node.to_string()).or_insert_with(|| {
                format!(
            "record held: it claims MAC {mac} ({iface}), which node {other} reported too; a MAC \
             belongs to one node, so this node keeps its last NodeConfig. If that NIC really \
             moved here, remove {other}'s record (StateDir nodes/{other}.json) or let {other} be \
             discovered without it first"
            )
            });
        }
    }
    for (node, why) in held {
        found.insert(node, Err(why));
    }
}

/// The host name a record's NodeConfig carries with `NodeHostname=hostname`: the reported one,
/// else the node's name; lower case (host names are compared without case).
fn effective_hostname(r: &DiscoverRecord) -> String {
    if r.hostname.is_empty() {
        r.node_name.to_ascii_lowercase()
    } else {
        r.hostname.to_ascii_lowercase()
    }
}

/// Drops from the records in `found` a reported host name that another node claims too, as
/// [`hold_claimed_macs`] does for MACs: the claimants of a name are the nodes whose record
/// (this pass's, else the stored one) carries it ([`effective_hostname`]); the one whose
/// stored record already carried it keeps it, the others' fresh records lose it; when none or
/// several carried it before, every fresh claimant loses it. A record that loses its name
/// gets an empty `hostname` (its NodeConfig carries its Slurm node name). Returns each such
/// node with the warning to log.
pub fn drop_claimed_hostnames(
    found: &mut Discovered,
    stored: &BTreeMap<String, DiscoverRecord>,
) -> BTreeMap<String, String> {
    let fresh: BTreeMap<String, String> = found
        .iter()
        .filter_map(|(n, r)| Some((n.clone(), effective_hostname(r.as_ref().ok()?))))
        .collect();
    let before: BTreeMap<&str, String> = stored
        .iter()
        .map(|(n, r)| (n.as_str(), effective_hostname(r)))
        .collect();
    let mut claims: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (node, name) in before.iter().filter(|(n, _)| !fresh.contains_key(**n)) {
        claims.entry(name).or_default().insert(node);
    }
    for (node, name) in &fresh {
        claims.entry(name).or_default().insert(node);
    }
    let mut dropped = BTreeMap::new();
    for (name, nodes) in claims.iter().filter(|(_, n)| n.len() > 1) {
        let prior: Vec<&str> = nodes
            .iter()
            .copied()
            .filter(|n| before.get(n).is_some_and(|b| b == name))
            .collect();
        let owner = (prior.len() == 1).then(|| prior[0]);
        for node in nodes.iter().filter(|n| fresh.contains_key(**n)) {
            if Some(*node) == owner {
                continue;
            }
            let others: Vec<&str> = nodes.iter().copied().filter(|n| n != node).collect();
            dropped.insert(
                node.to_string(),
                format!(
                    "node {node}: reports host name {name}, which node(s) {} report too; a host \
                     name belongs to one node, so {node}'s NodeConfig carries its node name {node} \
                     instead (NodeHostname=hostname). Check the host names of these nodes",
                    others.join(", ")
                ),
            );
        }
    }
    for node in dropped.keys() {
        if let Some(Ok(r)) = found.get_mut(node) {
            r.hostname = String::new();
        }
    }
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::record::Interface;

    fn rec(node: &str, macs: &[&str]) -> DiscoverRecord {
        DiscoverRecord {
            node_name: node.into(),
            hostname: node.into(),
            location: None,
            interfaces: macs
                .iter()
                .enumerate()
                .map(|(i, m)| Interface {
                    name: format!("eth{i}"),
                    mac_address: m.to_string(),
                    ip_addresses: vec![],
                })
                .collect(),
            topology: None,
            topology_error: None,
            taken_at: None,
        }
    }

    fn pass(recs: &[DiscoverRecord]) -> Discovered {
        recs.iter()
            .map(|r| (r.node_name.clone(), Ok(r.clone())))
            .collect()
    }

    fn stored(recs: &[DiscoverRecord]) -> BTreeMap<String, DiscoverRecord> {
        recs.iter()
            .map(|r| (r.node_name.clone(), r.clone()))
            .collect()
    }

    const A: &str = "02:00:00:00:00:0a";
    const B: &str = "02:00:00:00:00:0b";
    const C: &str = "02:00:00:00:00:0c";

    /// n1 reports n2's MAC beside its own: held, naming both nodes; n2 keeps it.
    #[test]
    fn a_mac_another_node_reported_is_held() {
        let before = stored(&[rec("n1", &[A]), rec("n2", &[B])]);
        // n2 not in this pass (busy, down): its stored record still owns B.
        let mut found = pass(&[rec("n1", &[A, B])]);
        hold_claimed_macs(&mut found, &before);
        let e = found["n1"].as_ref().unwrap_err();
        assert!(
            e.starts_with(&format!(
                "record held: it claims MAC {B} (eth1), which node n2 reported too"
            )),
            "{e}"
        );
        assert!(
            e.contains("remove n2's record (StateDir nodes/n2.json)"),
            "{e}"
        );
        // Both in this pass: the same.
        let mut found = pass(&[rec("n1", &[A, B]), rec("n2", &[B])]);
        hold_claimed_macs(&mut found, &before);
        assert!(found["n1"].is_err());
        assert_eq!(found["n2"], Ok(rec("n2", &[B])));
    }

    /// Nodes that report their own MACs, a NIC that moved after its old node was discovered
    /// without it, shared MACs within one node, and failed discoveries pass untouched.
    #[test]
    fn own_and_moved_macs_pass() {
        let before = stored(&[rec("n1", &[A]), rec("n2", &[B, C])]);
        let mut found = pass(&[rec("n1", &[A, A]), rec("n2", &[B])]);
        found.insert("n3".into(), Err("no discover record".into()));
        hold_claimed_macs(&mut found, &before);
        assert_eq!(found["n1"], Ok(rec("n1", &[A, A])));
        assert_eq!(found["n2"], Ok(rec("n2", &[B])));
        // C left n2 in this very pass: n1 may take it now.
        let mut found = pass(&[rec("n1", &[A, C]), rec("n2", &[B])]);
        hold_claimed_macs(&mut found, &before);
        assert!(found.values().all(|r| r.is_ok()), "{found:?}");
        // But not while n2 still reports it (or is not discovered in this pass).
        let mut found = pass(&[rec("n1", &[A, C])]);
        hold_claimed_macs(&mut found, &before);
        assert!(found["n1"].as_ref().unwrap_err().contains("which node n2"));
    }

    /// No earlier record (a first inventory) or both nodes with it before (a lie kept by an
    /// older version): nobody can tell who is right, so every fresh claim is held.
    #[test]
    fn undecidable_claims_hold_all_fresh_claimants() {
        let mut found = pass(&[rec("n1", &[A]), rec("n2", &[A]), rec("n3", &[C])]);
        hold_claimed_macs(&mut found, &BTreeMap::new());
        assert!(found["n1"].as_ref().unwrap_err().contains("which node n2"));
        assert!(found["n2"].as_ref().unwrap_err().contains("which node n1"));
        assert!(found["n3"].is_ok());
        let before = stored(&[rec("n1", &[A]), rec("n2", &[A])]);
        let mut found = pass(&[rec("n1", &[A])]);
        hold_claimed_macs(&mut found, &before);
        assert!(found["n1"].as_ref().unwrap_err().contains("which node n2"));
    }

    fn named(node: &str, hostname: &str) -> DiscoverRecord {
        DiscoverRecord {
            hostname: hostname.into(),
            ..rec(node, &[])
        }
    }

    /// n2 reports n1's host name: with no earlier record, neither keeps it; with n1's earlier
    /// record carrying it, n1 keeps it. Names compare without case; an empty name stands for
    /// the node's own name.
    #[test]
    fn a_host_name_two_nodes_report_is_dropped() {
        let mut found = pass(&[
            named("n1", "h1.example"),
            named("n2", "H1.example"),
            named("n3", "h3"),
        ]);
        let dropped = drop_claimed_hostnames(&mut found, &BTreeMap::new());
        assert_eq!(dropped.keys().collect::<Vec<_>>(), ["n1", "n2"]);
        assert!(
            dropped["n2"]
                .starts_with("node n2: reports host name h1.example, which node(s) n1 report too"),
            "{}",
            dropped["n2"]
        );
        for n in ["n1", "n2"] {
            let r = found[n].as_ref().unwrap();
            assert_eq!(r.hostname, "");
            let nc = r.to_node_config("c", crate::config::NodeHostname::HostName);
            assert_eq!(nc.hostname.as_deref(), Some(n));
        }
        assert_eq!(found["n3"].as_ref().unwrap().hostname, "h3");
        // n1 had it before (n2 not): n1 keeps it, n2 loses it, also when n1 is not in this pass
        let before = stored(&[named("n1", "h1.example"), named("n2", "h2")]);
        for recs in [
            vec![named("n1", "h1.example"), named("n2", "h1.example")],
            vec![named("n2", "h1.example")],
        ] {
            let mut found = pass(&recs);
            let dropped = drop_claimed_hostnames(&mut found, &before);
            assert_eq!(dropped.keys().collect::<Vec<_>>(), ["n2"]);
            assert_eq!(found["n2"].as_ref().unwrap().hostname, "");
            if let Some(Ok(r)) = found.get("n1") {
                assert_eq!(r.hostname, "h1.example");
            }
        }
        // a node that reports no name has its node name: another node claiming that name
        let mut found = pass(&[named("n1", ""), named("n2", "N1")]);
        let dropped = drop_claimed_hostnames(&mut found, &BTreeMap::new());
        assert!(dropped.contains_key("n2"), "{dropped:?}");
        // distinct names, failed discoveries: untouched
        let mut found = pass(&[named("n1", "a"), named("n2", "b")]);
        found.insert("n3".into(), Err("x".into()));
        assert!(drop_claimed_hostnames(&mut found, &BTreeMap::new()).is_empty());
        assert_eq!(found["n1"].as_ref().unwrap().hostname, "a");
    }
}

//! A MAC belongs to one node. srun binds a discover record to the node its task ran on, but a
//! worker could still report another node's NICs under its own name: both NodeConfigs would
//! carry those MACs, and with `JobInterfaces=gpu` one node's jobs would be sent on the other's
//! ports. So a fresh record that claims a MAC another node already reported (its record in
//! StateDir, `nodes/<node>.json`) is held: that node fails discovery with a message naming
//! both nodes, and its last record and NodeConfig stay as they were.

use super::Discovered;
use crate::node_record::DiscoverRecord;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_record::Interface;

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
}

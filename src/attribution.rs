//! Which interfaces a job uses: from the GPUs Slurm gave it on each node and the nodes'
//! topology records, the MACs of the NICs nearest those GPUs (`JobInterfaces=gpu|auto`).
//!
//! [`attribute`] is pure: the caller fetches the job's GPUs ([`crate::slurm::job_gpus`]) and
//! the nodes' records (the inventory's copies in StateDir, [`crate::state::StateDir::load_node_record`]).

use crate::config::JobInterfaces;
use crate::node_record::DiscoverRecord;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The outcome for one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribution {
    /// The MACs to send in `interfaces.values` (sorted), or `None` to send node names.
    pub macs: Option<Vec<String>>,
    /// Which rule gave this, in words (logged at debug, shown by `send --dry-run`).
    pub rule: String,
}

impl fmt::Display for Attribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.rule)
    }
}

fn by_nodes(rule: String) -> Attribution {
    Attribution { macs: None, rule }
}

/// Formats GPU indices compactly: `0-3,6`.
pub fn format_indices(set: &BTreeSet<u32>) -> String {
    let mut out: Vec<String> = Vec::new();
    let v: Vec<u32> = set.iter().copied().collect();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if j > i {
            format!("{}-{}", v[i], v[j])
        } else {
            v[i].to_string()
        });
        i = j + 1;
    }
    out.join(",")
}

/// Decides node names or MACs for a job on `job_nodes`, holding the GPU indices `gpus` per
/// node (a node missing from `gpus` holds none), given the nodes' discover `records`.
///
/// Jobs that hold every GPU of each of their nodes (or run on nodes without GPUs) keep node
/// names in every mode: their payload is what `nodes` mode sends.
pub fn attribute(
    mode: JobInterfaces,
    job_nodes: &[String],
    gpus: &BTreeMap<String, BTreeSet<u32>>,
    records: &BTreeMap<String, DiscoverRecord>,
) -> Attribution {
    if mode == JobInterfaces::Nodes {
        return by_nodes("nodes: JobInterfaces=nodes".into());
    }
    let m = mode.word();
    let none = BTreeSet::new();
    let mut macs: BTreeSet<String> = BTreeSet::new();
    let mut parts: Vec<String> = Vec::new();
    let mut shared = false;
    for node in job_nodes {
        let held = gpus.get(node).unwrap_or(&none);
        let Some(rec) = records.get(node) else {
            // Its MACs are unknown: leaving the node out would hide the job's use of it.
            return by_nodes(format!("nodes ({m}): no inventory record of {node}"));
        };
        let all_macs = rec.interfaces.iter().map(|i| i.mac_address.clone());
        let Some(topo) = &rec.topology else {
            if held.is_empty() {
                // A node without GPUs (or whose topology was not asked for): all its NICs.
                macs.extend(all_macs);
                parts.push(format!(
                    "{node}: no GPUs, all {} NIC(s)",
                    rec.interfaces.len()
                ));
                continue;
            }
            return by_nodes(format!(
                "nodes ({m}): no GPU topology for {node}, where the job holds GPUs {}",
                format_indices(held)
            ));
        };
        let node_gpus: BTreeSet<u32> = topo.gpus.iter().map(|g| g.index).collect();
        if let Some(g) = held.iter().find(|g| !node_gpus.contains(g)) {
            return by_nodes(format!(
                "nodes ({m}): the job holds GPU {g} on {node}, which its topology does not list"
            ));
        }
        if held.is_empty() {
            if mode == JobInterfaces::Auto {
                return by_nodes(format!(
                    "nodes (auto): the job holds none of the GPUs of {node}"
                ));
            }
            parts.push(format!("{node}: no GPU held, no NIC"));
            shared = true;
            continue;
        }
        if *held == node_gpus {
            macs.extend(all_macs);
            parts.push(format!(
                "{node}: all {} GPUs, all {} NIC(s)",
                node_gpus.len(),
                rec.interfaces.len()
            ));
            continue;
        }
        shared = true;
        let mut near: Vec<&crate::topology::NicTopology> = topo
            .nics
            .iter()
            .filter(|n| n.gpus.iter().any(|g| held.contains(g)))
            .collect();
        near.sort_by(|a, b| a.name.cmp(&b.name));
        if near.is_empty() {
            if mode == JobInterfaces::Auto {
                return by_nodes(format!(
                    "nodes (auto): no NIC is near GPUs {} of {node}",
                    format_indices(held)
                ));
            }
            macs.extend(all_macs);
            parts.push(format!(
                "{node}: GPUs {} have no near NIC, all {} NIC(s)",
                format_indices(held),
                rec.interfaces.len()
            ));
            continue;
        }
        let levels: BTreeSet<&str> = near.iter().map(|n| n.near.describe()).collect();
        for n in &near {
            if let Some(i) = rec.interfaces.iter().find(|i| i.name == n.name) {
                macs.insert(i.mac_address.clone());
            }
        }
        parts.push(format!(
            "{node}: GPUs {} -> {} ({})",
            format_indices(held),
            near.iter()
                .map(|n| n.name.as_str())
                .collect::<Vec<_>>()
                .join(","),
            levels.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    if !shared {
        return by_nodes(format!(
            "nodes ({m}): the job holds whole nodes (no node's GPUs are shared)"
        ));
    }
    if macs.is_empty() {
        return by_nodes(format!(
            "nodes ({m}): no interface found ({})",
            parts.join("; ")
        ));
    }
    Attribution {
        rule: format!("interfaces ({m}): {}", parts.join("; ")),
        macs: Some(macs.into_iter().collect()),
    }
}

/// Applies `JobInterfaces` to a job built from Slurm (`send`; the service's enrichment):
/// asks slurmctld which GPUs the job holds on each node, reads the nodes' records the
/// inventory keeps in StateDir, and, when [`attribute`] says so, turns the JobConfig from node
/// names into the MACs of the NICs nearest its GPUs. Never fails: any doubt keeps node names.
/// Returns the rule used (also logged at debug).
pub fn enrich(
    mode: JobInterfaces,
    slurm: &crate::runner::Slurm,
    outbox: &crate::state::StateDir,
    job: &mut crate::payload::JobConfig,
) -> Attribution {
    let nodes: Vec<String> = job
        .nodes
        .as_ref()
        .map(|n| n.values.clone())
        .unwrap_or_default();
    let a = if mode == JobInterfaces::Nodes || nodes.is_empty() {
        attribute(mode, &nodes, &BTreeMap::new(), &BTreeMap::new())
    } else {
        match crate::slurm::job_gpus(slurm, job.job_id(), crate::slurm::COMMAND_TIMEOUT) {
            Err(e) => by_nodes(format!(
                "nodes ({}): the job's GPUs are unknown: {e}",
                mode.word()
            )),
            Ok(gpus) => match gpus.keys().find(|n| !nodes.contains(n)) {
                Some(n) => by_nodes(format!(
                    "nodes ({}): slurmctld lists GPUs on {n}, not a node of the job",
                    mode.word()
                )),
                None => {
                    let mut records = BTreeMap::new();
                    for n in &nodes {
                        match outbox.nodes.load(n) {
                            Ok(Some(r)) => {
                                records.insert(n.clone(), r);
                            }
                            Ok(None) => {}
                            Err(e) => log::warn!("node {n}: inventory record ignored: {e}"),
                        }
                    }
                    attribute(mode, &nodes, &gpus, &records)
                }
            },
        }
    };
    log::debug!("job {}: {}", job.key.id, a.rule);
    if let Some(macs) = &a.macs {
        job.nodes = None;
        job.interfaces = Some(macs.clone().into());
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_indices() {
        assert_eq!(JobInterfaces::parse("GPU"), Ok(JobInterfaces::Gpu));
        assert_eq!(JobInterfaces::parse("auto"), Ok(JobInterfaces::Auto));
        assert_eq!(
            JobInterfaces::parse("nic").unwrap_err(),
            "\"nic\" is not one of nodes, gpu, auto"
        );
        let s: BTreeSet<u32> = [0, 1, 2, 3, 6, 8, 9].into();
        assert_eq!(format_indices(&s), "0-3,6,8-9");
        assert_eq!(format_indices(&BTreeSet::new()), "");
    }

    fn gpus(v: &[(&str, &[u32])]) -> BTreeMap<String, BTreeSet<u32>> {
        v.iter()
            .map(|(n, g)| (n.to_string(), g.iter().copied().collect()))
            .collect()
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn macs_of(rec: &DiscoverRecord, ifs: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = ifs
            .iter()
            .map(|n| {
                rec.interfaces
                    .iter()
                    .find(|i| i.name == *n)
                    .unwrap()
                    .mac_address
                    .clone()
            })
            .collect();
        v.sort();
        v
    }

    fn dgx_cluster() -> BTreeMap<String, DiscoverRecord> {
        use crate::topology::fixtures::record;
        [
            (
                "dgx1".to_string(),
                record("dgx1", "dgx-a100", "02:dd:00:01"),
            ),
            (
                "dgx2".to_string(),
                record("dgx2", "dgx-a100", "02:dd:00:02"),
            ),
        ]
        .into()
    }

    /// Two 4-GPU jobs on one DGX A100: disjoint MAC sets, each the compute NICs behind the
    /// switches of its GPUs (plus, for GPUs 4-7, the storage NICs on their NUMA node).
    #[test]
    fn two_four_gpu_jobs_on_one_dgx() {
        let recs = dgx_cluster();
        let dgx1 = &recs["dgx1"];
        for mode in [JobInterfaces::Gpu, JobInterfaces::Auto] {
            let a = attribute(
                mode,
                &names(&["dgx1"]),
                &gpus(&[("dgx1", &[0, 1, 2, 3])]),
                &recs,
            );
            let b = attribute(
                mode,
                &names(&["dgx1"]),
                &gpus(&[("dgx1", &[4, 5, 6, 7])]),
                &recs,
            );
            let (ma, mb) = (a.macs.clone().unwrap(), b.macs.clone().unwrap());
            assert_eq!(
                ma,
                macs_of(dgx1, &["enp12s0", "enp18s0", "enp75s0", "enp84s0"])
            );
            assert_eq!(
                mb,
                macs_of(
                    dgx1,
                    &[
                        "enp141s0",
                        "enp148s0",
                        "enp186s0",
                        "enp204s0",
                        "enp225s0f0",
                        "enp225s0f1"
                    ]
                )
            );
            assert!(ma.iter().all(|m| !mb.contains(m)));
            assert_eq!(
                a.rule,
                format!(
                    "interfaces ({}): dgx1: GPUs 0-3 -> enp12s0,enp18s0,enp75s0,enp84s0 (same PCIe switch)",
                    mode.word()
                )
            );
            assert!(
                b.rule.contains("(same NUMA node, same PCIe switch)"),
                "{}",
                b.rule
            );
        }
        // One GPU: the two NICs of its switch.
        let one = attribute(
            JobInterfaces::Auto,
            &names(&["dgx1"]),
            &gpus(&[("dgx1", &[5])]),
            &recs,
        );
        assert_eq!(
            one.macs.unwrap(),
            macs_of(dgx1, &["enp141s0", "enp148s0", "enp225s0f0", "enp225s0f1"])
        );
    }

    /// Whole-node jobs, jobs without GPUs and `nodes` mode keep node names.
    #[test]
    fn whole_nodes_and_gpu_less_jobs_keep_node_names() {
        let recs = dgx_cluster();
        let all = [0, 1, 2, 3, 4, 5, 6, 7];
        for mode in [
            JobInterfaces::Nodes,
            JobInterfaces::Gpu,
            JobInterfaces::Auto,
        ] {
            let whole = attribute(
                mode,
                &names(&["dgx1", "dgx2"]),
                &gpus(&[("dgx1", &all), ("dgx2", &all)]),
                &recs,
            );
            assert_eq!(whole.macs, None, "{mode:?}");
            let cpu = attribute(mode, &names(&["dgx1"]), &gpus(&[]), &recs);
            assert_eq!(cpu.macs, None, "{mode:?}");
        }
        let n = attribute(
            JobInterfaces::Nodes,
            &names(&["dgx1"]),
            &gpus(&[("dgx1", &[0])]),
            &recs,
        );
        assert_eq!(
            (n.macs, n.rule.as_str()),
            (None, "nodes: JobInterfaces=nodes")
        );
        let w = attribute(
            JobInterfaces::Auto,
            &names(&["dgx1"]),
            &gpus(&[("dgx1", &all)]),
            &recs,
        );
        assert_eq!(
            w.rule,
            "nodes (auto): the job holds whole nodes (no node's GPUs are shared)"
        );
    }

    /// A job with all of dgx2 and half of dgx1: all of dgx2's NICs plus dgx1's near ones.
    #[test]
    fn whole_node_plus_shared_node() {
        let recs = dgx_cluster();
        let a = attribute(
            JobInterfaces::Auto,
            &names(&["dgx1", "dgx2"]),
            &gpus(&[("dgx1", &[0, 1]), ("dgx2", &[0, 1, 2, 3, 4, 5, 6, 7])]),
            &recs,
        );
        let macs = a.macs.unwrap();
        assert_eq!(macs.len(), 2 + 10);
        let mut want = macs_of(&recs["dgx1"], &["enp12s0", "enp18s0"]);
        want.extend(
            recs["dgx2"]
                .interfaces
                .iter()
                .map(|i| i.mac_address.clone()),
        );
        want.sort();
        assert_eq!(macs, want);
        assert!(
            a.rule.contains("dgx2: all 8 GPUs, all 10 NIC(s)"),
            "{}",
            a.rule
        );
    }

    /// Where `auto` falls back to node names and `gpu` does not.
    #[test]
    fn auto_falls_back_gpu_does_not() {
        let mut recs = dgx_cluster();
        // dgx2: the job holds none of its GPUs.
        let j = gpus(&[("dgx1", &[0, 1])]);
        let auto = attribute(JobInterfaces::Auto, &names(&["dgx1", "dgx2"]), &j, &recs);
        assert_eq!(auto.macs, None);
        assert_eq!(
            auto.rule,
            "nodes (auto): the job holds none of the GPUs of dgx2"
        );
        let gpu = attribute(JobInterfaces::Gpu, &names(&["dgx1", "dgx2"]), &j, &recs);
        assert_eq!(
            gpu.macs.unwrap(),
            macs_of(&recs["dgx1"], &["enp12s0", "enp18s0"])
        );
        // No topology (an older worker binary, or not asked): node names in both modes.
        recs.get_mut("dgx1").unwrap().topology = None;
        for mode in [JobInterfaces::Gpu, JobInterfaces::Auto] {
            let a = attribute(mode, &names(&["dgx1"]), &gpus(&[("dgx1", &[0])]), &recs);
            assert_eq!(a.macs, None);
            assert!(a.rule.contains("no GPU topology for dgx1"), "{}", a.rule);
        }
        // No record at all, or a GPU the record does not know.
        let a = attribute(
            JobInterfaces::Gpu,
            &names(&["dgx9"]),
            &gpus(&[("dgx9", &[0])]),
            &recs,
        );
        assert!(a.rule.contains("no inventory record of dgx9"), "{}", a.rule);
        let a = attribute(
            JobInterfaces::Gpu,
            &names(&["dgx2", "cpu1"]),
            &gpus(&[("dgx2", &[0])]),
            &recs,
        );
        assert_eq!(a.rule, "nodes (gpu): no inventory record of cpu1");
        let a = attribute(
            JobInterfaces::Gpu,
            &names(&["dgx2"]),
            &gpus(&[("dgx2", &[8])]),
            &recs,
        );
        assert!(a.rule.contains("holds GPU 8 on dgx2"), "{}", a.rule);
    }

    /// Two sockets: a job on socket 1's GPUs gets socket 1's NICs only.
    #[test]
    fn two_socket_split_by_numa() {
        let rec = crate::topology::fixtures::record("pcie1", "two-socket", "02:dd:00:03");
        let recs: BTreeMap<String, DiscoverRecord> = [("pcie1".to_string(), rec.clone())].into();
        let a = attribute(
            JobInterfaces::Auto,
            &names(&["pcie1"]),
            &gpus(&[("pcie1", &[2, 3])]),
            &recs,
        );
        assert_eq!(a.macs.unwrap(), macs_of(&rec, &["ens7f0", "ens7f1"]));
        assert_eq!(
            a.rule,
            "interfaces (auto): pcie1: GPUs 2-3 -> ens7f0,ens7f1 (same NUMA node)"
        );
        let b = attribute(
            JobInterfaces::Auto,
            &names(&["pcie1"]),
            &gpus(&[("pcie1", &[0])]),
            &recs,
        );
        assert_eq!(
            b.macs.unwrap(),
            macs_of(&rec, &["eno1", "ens3f0", "ens3f1"])
        );
    }
}

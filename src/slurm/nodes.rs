//! Nodes as `sinfo --all` lists them: their names, states (available or not) and
//! partitions (admin-defined names, read from text).

use super::runner::Slurm;
use std::time::Duration;

/// One node as `sinfo --all -h -N -o '%N %T %P'` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinfoNode {
    /// Slurm node name.
    pub name: String,
    /// State as printed (`idle`, `down*`, `mixed~`, …).
    pub state: String,
    /// The partitions it is in (without the default marker `*`).
    pub partitions: Vec<String>,
}

impl SinfoNode {
    /// Idle, allocated, mixed, completing or planned (idle, held by the backfill scheduler for
    /// a pending job), with no flag that says it is not responding, powered down, powering up,
    /// rebooting or failing.
    pub fn available(&self) -> bool {
        node_state_available(&self.state)
    }
}

/// True for the base states a discovery job can run on, without trouble flags.
pub fn node_state_available(state: &str) -> bool {
    let base = state.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    base.len() == state.len()
        && matches!(
            base.to_ascii_lowercase().as_str(),
            "idle" | "allocated" | "mixed" | "completing" | "planned"
        )
}

/// The sinfo format cvslurm asks for.
pub const SINFO_FORMAT: &str = "%N %T %P";

/// Parses `sinfo -h -N -o '%N %T %P'`: one entry per node (a node in several partitions is
/// listed once, with all its partitions), in the order sinfo printed them.
pub fn parse_sinfo(output: &str) -> Vec<SinfoNode> {
    let mut nodes: Vec<SinfoNode> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for line in output.lines() {
        let mut it = line.split_whitespace();
        let (Some(name), Some(state)) = (it.next(), it.next()) else {
            continue;
        };
        // A bare `*` (nothing but the default marker) names no partition.
        let part = it
            .next()
            .map(|p| p.trim_end_matches('*').to_string())
            .filter(|p| !p.is_empty());
        let i = *index.entry(name.to_string()).or_insert_with(|| {
            nodes.push(SinfoNode {
                name: name.to_string(),
                state: state.to_string(),
                partitions: Vec::new(),
            });
            nodes.len() - 1
        });
        if let Some(p) = part {
            if !nodes[i].partitions.contains(&p) {
                nodes[i].partitions.push(p);
            }
        }
    }
    nodes
}

/// Lists the nodes (`sinfo --all -h -N -o '%N %T %P'`): `--all` includes hidden partitions,
/// whose nodes a user who is not an operator would not see otherwise.
pub fn sinfo_nodes(slurm: &Slurm, timeout: Duration) -> Result<Vec<SinfoNode>, String> {
    let out = slurm.run("sinfo", &["--all", "-h", "-N", "-o", SINFO_FORMAT], timeout)?;
    Ok(parse_sinfo(&out))
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::fixture;
    use super::*;

    #[test]
    fn node_states() {
        for s in ["idle", "allocated", "mixed", "completing", "planned"] {
            assert!(node_state_available(s), "{s}");
        }
        for s in [
            "idle*",
            "down*",
            "down",
            "drained",
            "draining",
            "idle~",
            "idle#",
            "idle%",
            "mixed!",
            "allocated*",
            "planned*",
            "unknown",
            "future",
        ] {
            assert!(!node_state_available(s), "{s}");
        }
    }

    #[test]
    fn sinfo_dedups_nodes_in_two_partitions() {
        let nodes = parse_sinfo("n1 idle debug*\nn3 mixed debug*\nn3 mixed gpu\nn4 down* gpu\n\n");
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[1].partitions, ["debug", "gpu"]);
        assert!(nodes[1].available());
        assert!(!nodes[2].available());
    }

    /// From fuzzing (sinfo target, minimized): a bare `*` in the partition column became an
    /// empty partition name.
    #[test]
    fn sinfo_bare_default_marker_is_no_partition() {
        let nodes = parse_sinfo("1 * *");
        assert_eq!(nodes.len(), 1);
        assert!(nodes[0].partitions.is_empty(), "{:?}", nodes[0].partitions);
    }

    #[test]
    fn sinfo_from_real_output() {
        let normal = parse_sinfo(&fixture("sinfo-normal.txt"));
        assert_eq!(
            normal.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
            ["n1", "n2", "n3", "n4"]
        );
        assert!(normal.iter().all(|n| n.available()));
        let stopped = parse_sinfo(&fixture("sinfo-slurmd-stopped-notresponding.txt"));
        let avail: Vec<_> = stopped
            .iter()
            .filter(|n| n.available())
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(avail, ["n1", "n3", "n4"]);
        let down = parse_sinfo(&fixture("sinfo-slurmd-stopped-down.txt"));
        assert!(!down.iter().find(|n| n.name == "n2").unwrap().available());
        let drain = parse_sinfo(&fixture("sinfo-drain-draining.txt"));
        let avail: Vec<_> = drain
            .iter()
            .filter(|n| n.available())
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(avail, ["n1", "n2"]);
        let dynamic = parse_sinfo(&fixture("sinfo-dynamic-node.txt"));
        assert_eq!(dynamic.last().unwrap().name, "n5");
    }
}

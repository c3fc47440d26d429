//! Nodes as `sinfo --all` lists them: their names, states (available or not) and
//! partitions (admin-defined names, read from text); and when each node's slurmd started
//! (`scontrol show node -o`, [`slurmd_starts`]).

use super::runner::Slurm;
use std::collections::BTreeMap;
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

/// The longest node-list argument given to `scontrol show node`; a longer one (a job on many
/// oddly named nodes) asks for every node instead, and the answer is filtered here.
const MAX_NODE_ARG: usize = 64 * 1024;

/// When each node's slurmd started (`SlurmdStartTime`, epoch seconds on the node's own clock:
/// slurmd stamps it with `time(NULL)` into its first registration), from
/// `scontrol --all show node -o [NODES]`. `nodes`: the nodes to ask about (`None`: every
/// node). A node missing from the answer has no known start (never registered, unknown to
/// Slurm, or listed in a way that cannot be trusted: see [`parse_slurmd_starts`]).
///
/// Cost: scontrol has no single-node request; with or without a node list it asks slurmctld
/// for every node (REQUEST_NODE_INFO, what sinfo asks too) and filters the answer itself
/// (`scontrol_print_node_list`, `src/scontrol/info_node.c` in 22.05, 24.11 and 26.05). The list
/// only keeps the output small.
pub fn slurmd_starts(
    slurm: &Slurm,
    nodes: Option<&[String]>,
    timeout: Duration,
) -> Result<BTreeMap<String, i64>, String> {
    let Some(out) = show_nodes(slurm, nodes, timeout)? else {
        return Ok(BTreeMap::new());
    };
    let mut starts = parse_slurmd_starts(&out);
    if let Some(ns) = nodes {
        starts.retain(|n, _| ns.contains(n));
    }
    Ok(starts)
}

/// `scontrol --all show node -o [NODES]` (`None`: every node), the one listing behind
/// [`slurmd_starts`] and [`published`]; `None` for an empty node list (nothing to ask).
fn show_nodes(
    slurm: &Slurm,
    nodes: Option<&[String]>,
    timeout: Duration,
) -> Result<Option<String>, String> {
    let list = match nodes {
        Some([]) => return Ok(None),
        Some(ns) => Some(super::hostlist::compress(ns)).filter(|l| l.len() <= MAX_NODE_ARG),
        None => None,
    };
    let mut args = vec!["--all", "show", "node", "-o"];
    if let Some(l) = &list {
        args.push(l);
    }
    slurm.run("scontrol", &args, timeout).map(Some)
}

/// Parses `scontrol show node -o` printed with `SLURM_TIME_FORMAT=%s`: one line per node,
/// `NodeName=<name> … SlurmdStartTime=<epoch> …`. The text is read as hostile (an admin's
/// `Reason=`, `Comment=` or `Extra=` can hold any words, even a newline): a node is believed
/// only from a line that starts with `NodeName=` and holds exactly one `SlurmdStartTime=`
/// word, and only when no other line names it; `SlurmdStartTime=None` (never registered)
/// and values outside 1970 to 9999 leave it out.
pub fn parse_slurmd_starts(output: &str) -> BTreeMap<String, i64> {
    believed_lines(output)
        .into_iter()
        .filter_map(|(n, line)| {
            let start = crate::timefmt::parse_slurm_epoch(one_word(line?, "SlurmdStartTime=")?)?;
            Some((n, start))
        })
        .collect()
}

/// Each node's line of `scontrol show node -o`: a line that starts with `NodeName=`; `None`
/// for a node that two lines name (neither is believed).
fn believed_lines(output: &str) -> BTreeMap<String, Option<&str>> {
    let mut seen: BTreeMap<String, Option<&str>> = BTreeMap::new();
    for line in output.lines() {
        let Some(rest) = line.strip_prefix("NodeName=") else {
            continue;
        };
        let name = rest.split(char::is_whitespace).next().unwrap_or("");
        if name.is_empty() || name.len() > 255 {
            continue;
        }
        seen.entry(name.to_string())
            .and_modify(|l| *l = None)
            .or_insert(Some(line));
    }
    seen
}

/// The value of the one word of `line` that begins with `key`; `None` when no word or more
/// than one does.
fn one_word<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let mut words = line.split_whitespace().filter_map(|w| w.strip_prefix(key));
    let first = words.next()?;
    words.next().is_none().then_some(first)
}

/// A node as `cvslurm publish` left it in Slurm: its slurmd's start and its `Extra` field.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Published {
    /// `SlurmdStartTime` (epoch seconds), as [`parse_slurmd_starts`] reads it.
    pub start: Option<i64>,
    /// The node's `Extra` value, when exactly one `Extra=` word is on its line.
    pub extra: Option<String>,
}

/// Each of `nodes`' slurmd start and `Extra` field (`None`: every node's), from one
/// `scontrol --all show node -o` (the cost of [`slurmd_starts`]). A node missing from the
/// answer, or named by two lines, is left out.
pub fn published(
    slurm: &Slurm,
    nodes: Option<&[String]>,
    timeout: Duration,
) -> Result<BTreeMap<String, Published>, String> {
    let Some(out) = show_nodes(slurm, nodes, timeout)? else {
        return Ok(BTreeMap::new());
    };
    let mut listed = parse_published(&out);
    if let Some(ns) = nodes {
        listed.retain(|n, _| ns.contains(n));
    }
    Ok(listed)
}

/// Parses `scontrol show node -o` for `published`: the text is as hostile as for
/// `parse_slurmd_starts` (`Extra=` is printed last, after `Comment=` and `Reason=`, which
/// may hold any words): a node's `Extra` is believed only from its one line and only when that
/// line has exactly one word that begins `Extra=`.
pub fn parse_published(output: &str) -> BTreeMap<String, Published> {
    believed_lines(output)
        .into_iter()
        .filter_map(|(n, line)| {
            let line = line?;
            Some((
                n,
                Published {
                    start: one_word(line, "SlurmdStartTime=")
                        .and_then(crate::timefmt::parse_slurm_epoch),
                    extra: one_word(line, "Extra=").map(str::to_string),
                },
            ))
        })
        .collect()
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

    /// SlurmdStartTime from real `scontrol show node -o` on every tested release: a restart
    /// of n2's slurmd moves its start on, n1's stays.
    #[test]
    fn slurmd_starts_from_real_output() {
        use super::super::fixtures::fixture_of;
        for v in ["22.05", "24.11", "26.05"] {
            let before = parse_slurmd_starts(&fixture_of(v, "scontrol-nodes-epoch.txt"));
            assert_eq!(before.keys().collect::<Vec<_>>(), ["n1", "n2"], "{v}");
            assert!(
                before.values().all(|t| *t > 1_700_000_000),
                "{v}: {before:?}"
            );
            let after =
                parse_slurmd_starts(&fixture_of(v, "scontrol-nodes-epoch-n2-restarted.txt"));
            assert_eq!(after["n1"], before["n1"], "{v}");
            assert!(after["n2"] > before["n2"], "{v}: {before:?} {after:?}");
        }
    }

    /// `Extra` from real `scontrol show node -o` on every tested release (a 2-node cluster
    /// with `HealthCheckProgram=cvslurm-publish`): n1's published record, read whole; n2's
    /// `Extra=rack=2` beside a `Comment=` holding the words `Extra=cvslurm1:AAAA` is not
    /// believed (two `Extra=` words on its line), though its start is.
    #[test]
    fn published_records_from_real_output() {
        use super::super::fixtures::fixture_of;
        for v in ["22.05", "24.11", "26.05"] {
            let got = parse_published(&fixture_of(v, "scontrol-nodes-extra.txt"));
            assert_eq!(got.keys().collect::<Vec<_>>(), ["n1", "n2"], "{v}");
            let n1 = &got["n1"];
            let rec = crate::discovery::published::decode(n1.extra.as_deref().unwrap()).unwrap();
            assert_eq!(rec.node_name, "n1", "{v}");
            assert!(rec.taken_at.unwrap() > n1.start.unwrap(), "{v}: {rec:?}");
            assert!(
                rec.interfaces.iter().any(|i| i.name == "ens1f0"),
                "{v}: {rec:?}"
            );
            assert_eq!(got["n2"].extra, None, "{v}");
            assert!(got["n2"].start.is_some(), "{v}");
        }
    }

    /// Hostile text: a node is believed only from one line starting `NodeName=` with exactly
    /// one `SlurmdStartTime=` word; a second line naming it (an admin's Reason with a newline),
    /// a second start word, `None`, garbage or out-of-range values leave it out.
    #[test]
    fn slurmd_starts_hostile_text() {
        let line = |n: &str, rest: &str| format!("NodeName={n} Arch=x86_64 State=IDLE {rest}\n");
        let text = [
            line("n1", "BootTime=100 SlurmdStartTime=200 LastBusyTime=300"),
            line("n2", "SlurmdStartTime=None"),
            line("n3", "SlurmdStartTime=300 Reason=x SlurmdStartTime=1"),
            line("n4", "SlurmdStartTime=400 Reason=foo"),
            // Injected by an admin's Reason on n1's line after a newline: n4 named twice.
            "NodeName=n4 SlurmdStartTime=1\n".to_string(),
            line("n5", "SlurmdStartTime=-5"),
            line("n6", "SlurmdStartTime=99999999999999"),
            line("n7", "SlurmdStartTime=12abc"),
            "   NodeName=n8 SlurmdStartTime=800\n".to_string(),
            "NodeName= SlurmdStartTime=900\n".to_string(),
            line("n9", "XSlurmdStartTime=5 SlurmdStartTime=900"),
            "Node n10 not found\n".to_string(),
        ]
        .concat();
        let got = parse_slurmd_starts(&text);
        assert_eq!(
            got,
            BTreeMap::from([("n1".to_string(), 200), ("n9".to_string(), 900)])
        );
        assert!(parse_slurmd_starts("").is_empty());
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

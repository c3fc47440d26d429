//! Records the nodes published themselves (`cvslurm publish`, `WorkerRecords=yes`), for the
//! nodes discovery's srun cannot reach: every CPU held by another user's job, in whose job
//! no step may run ([`super::discovery`]). A published record is believed for its node only
//! when it names that node and is fresh (taken in a later second than the node's slurmd
//! started: [`super::freshness`]), and it is held to this controller's interface filters.
//! Who can publish: root and SlurmUser on any host (Slurm takes a node's `Extra` from them
//! only), so root on one node could publish another node's record; root there holds the munge
//! key and can forge Slurm's own messages already. Why this way: docs/design.md.

use super::Discovered;
use crate::config::Config;
use crate::discovery::published;
use crate::discovery::record::DiscoverRecord;
use crate::slurm::{self, runner::Slurm, COMMAND_TIMEOUT};

/// Replaces the failure of each node in `out` (the nodes discovery cannot reach) by the record
/// the node published, when there is a good one; otherwise adds why not to its failure. One
/// `scontrol show node` for all of them.
pub fn take_published(slurm: &Slurm, cfg: &Config, out: &mut Discovered) {
    let names: Vec<String> = out.keys().cloned().collect();
    if names.is_empty() {
        return;
    }
    let listed = match slurm::published(slurm, Some(&names), COMMAND_TIMEOUT) {
        Ok(l) => l,
        Err(e) => {
            for n in &names {
                add_reason(
                    out,
                    n,
                    &format!("the records the nodes published cannot be read: {e}"),
                );
            }
            return;
        }
    };
    for n in &names {
        let node = listed.get(n).cloned().unwrap_or_default();
        match believe(n, &node, cfg) {
            Ok(rec) => {
                log::info!(
                    "node {n}: taken from the record it published (taken {}): discovery runs no step in another user's job",
                    rec.taken_at
                        .and_then(crate::timefmt::format_epoch)
                        .unwrap_or_default()
                );
                out.insert(n.clone(), Ok(rec));
            }
            Err(why) => add_reason(out, n, &why),
        }
    }
}

fn add_reason(out: &mut Discovered, node: &str, why: &str) {
    if let Some(Err(e)) = out.get_mut(node) {
        e.push_str("; ");
        e.push_str(why);
    }
}

/// The record `node` published, if it is one to believe: decoded and checked, naming `node`,
/// fresh, and with only the interfaces this controller's filters keep. The error says why not.
pub fn believe(
    node: &str,
    listed: &slurm::Published,
    cfg: &Config,
) -> Result<DiscoverRecord, String> {
    let Some(extra) = listed.extra.as_deref() else {
        return Err(
            "it has published no record (cvslurm publish as its slurmd's HealthCheckProgram: README, Nodes whose every CPU is held)"
                .into(),
        );
    };
    if !published::is_published(extra) {
        return Err("its Extra field holds something other than a cvslurm record".into());
    }
    let mut rec = published::decode(extra).map_err(|e| {
        format!(
            "its published record is refused: {}",
            crate::text::one_line(&e, 300)
        )
    })?;
    if rec.node_name != node {
        return Err(format!(
            "its published record is refused: it names node {:?}",
            crate::text::one_line(&rec.node_name, 80)
        ));
    }
    if let Some(why) = super::freshness::not_fresh(rec.taken_at, listed.start) {
        return Err(format!("its published record is not used: {why}"));
    }
    // The node published with its own copy of the filters (or the defaults): this
    // controller's name and address filters decide.
    rec.interfaces.retain(|i| {
        cfg.interface_regex.is_match(&i.name)
            && (!cfg.interface_require_ip || !i.ip_addresses.is_empty())
    });
    if let Some(t) = &mut rec.topology {
        let kept: std::collections::BTreeSet<String> =
            rec.interfaces.iter().map(|i| i.name.clone()).collect();
        t.nics.retain(|n| kept.contains(&n.name));
    }
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::record::Interface;

    fn rec(node: &str, taken: i64) -> DiscoverRecord {
        DiscoverRecord {
            node_name: node.into(),
            hostname: node.into(),
            location: None,
            interfaces: vec![
                Interface {
                    name: "ens1f0".into(),
                    mac_address: "02:97:00:00:04:02".into(),
                    ip_addresses: vec!["10.0.0.4".into()],
                },
                Interface {
                    name: "docker0".into(),
                    mac_address: "02:42:00:00:00:01".into(),
                    ip_addresses: vec!["172.17.0.1".into()],
                },
                Interface {
                    name: "ens2".into(),
                    mac_address: "02:97:00:00:04:03".into(),
                    ip_addresses: vec![],
                },
            ],
            topology: None,
            topology_error: None,
            taken_at: Some(taken),
        }
    }

    fn listed(start: Option<i64>, extra: Option<String>) -> slurm::Published {
        slurm::Published { start, extra }
    }

    #[test]
    fn a_fresh_record_of_its_node_is_taken_through_this_controllers_filters() {
        let cfg = Config::default();
        let l = listed(Some(100), Some(published::encode(&rec("n4", 101)).unwrap()));
        let got = believe("n4", &l, &cfg).unwrap();
        // docker0 fails InterfaceRegex, ens2 InterfaceRequireIp.
        let names: Vec<&str> = got.interfaces.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["ens1f0"]);
    }

    #[test]
    fn records_not_to_believe_say_why() {
        let cfg = Config::default();
        let enc = |r: &DiscoverRecord| Some(published::encode(r).unwrap());
        let cases = [
            (listed(Some(100), None), "has published no record"),
            (
                listed(Some(100), Some("site=rack4".into())),
                "something other than a cvslurm record",
            ),
            (
                listed(Some(100), Some(format!("{}!!", published::PREFIX))),
                "refused: not base64url",
            ),
            (
                listed(Some(100), enc(&rec("n3", 101))),
                "it names node \"n3\"",
            ),
            (
                listed(Some(100), enc(&rec("n4", 100))),
                "is not from after its slurmd started",
            ),
            (
                listed(None, enc(&rec("n4", 101))),
                "when its slurmd started is not known",
            ),
        ];
        for (l, want) in cases {
            let e = believe("n4", &l, &cfg).unwrap_err();
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        }
    }

    #[test]
    fn a_listing_that_fails_is_said_on_each_node() {
        // No Slurm to ask: each node keeps its failure, with why no record was taken.
        let slurm = Slurm::new(Some(std::path::Path::new("/nonexistent-slurm-bin")));
        let mut out = Discovered::new();
        out.insert("n3".into(), Err("fully allocated by job 7".into()));
        out.insert("n4".into(), Err("fully allocated by job 8".into()));
        take_published(&slurm, &Config::default(), &mut out);
        for (n, j) in [("n3", 7), ("n4", 8)] {
            let e = out[n].clone().unwrap_err();
            let want = format!(
                "fully allocated by job {j}; the records the nodes published cannot be read"
            );
            assert!(e.starts_with(&want), "{e}");
        }
    }
}

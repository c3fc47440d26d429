//! With `JobInterfaces=gpu|auto`, a running job's interfaces are resent when the inventory of
//! one of its nodes changes: a node inventoried for the first time (its jobs went out by node
//! name), a NIC swapped while the node was drained, a GPU or NIC that moved on the PCIe tree.
//!
//! The service watches the node records in `StateDir/nodes/` (its own polls write them, and so
//! does a `cvslurm inventory` run by hand): each monitor poll compares their inodes,
//! modification times and sizes, and reads only the files that changed. A record counts as
//! changed for jobs when the interface names and MACs or the GPU topology differ (an IP
//! address does not: JobConfig carries MACs). The running jobs on the changed nodes then get their RUNNING
//! queued again, built like the first one, and the sender attributes it anew from the new
//! record. Per change: one `squeue -t RUNNING -w <nodes>` (text, the jobs on those nodes), then
//! each reported job by id ([`crate::slurm::jobs_by_id`], bounded per poll): never the JSON of
//! every job slurmctld holds.
//!
//! A resend never reaches CloudVision after the job's end: see
//! [`Queue::enqueue_resend`](crate::state::queue::Queue::enqueue_resend).

use crate::discovery::record::DiscoverRecord;
use crate::slurm::runner::Slurm;
use crate::slurm::COMMAND_TIMEOUT;
use crate::state::nodes::RecordStamp;
use crate::state::queue::{Event, Item};
use crate::state::StateDir;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// What of a node's record a job's interfaces depend on: its interfaces' names and MACs and
/// its GPU topology, as one comparable string.
pub fn job_view(rec: &DiscoverRecord) -> String {
    let nics: Vec<(&str, &str)> = rec
        .interfaces
        .iter()
        .map(|i| (i.name.as_str(), i.mac_address.as_str()))
        .collect();
    serde_json::to_string(&(nics, &rec.topology)).expect("serializes")
}

/// The service's memory of the node records: file stamp and [`job_view`] per node.
#[derive(Debug, Default)]
pub struct RecordWatch {
    seen: BTreeMap<String, (RecordStamp, Option<String>)>,
    primed: bool,
}

impl RecordWatch {
    /// The nodes whose record changed for jobs since the last call: created, or rewritten
    /// with other interfaces or topology. The first call learns the records and names none
    /// (what changed while no service watched is not known). A record that cannot be read
    /// is logged and skipped.
    pub fn changed(&mut self, outbox: &StateDir) -> BTreeSet<String> {
        let stamps = outbox.nodes.stamps();
        self.seen.retain(|node, _| stamps.contains_key(node));
        let mut changed = BTreeSet::new();
        for (node, stamp) in stamps {
            if self.seen.get(&node).is_some_and(|(s, _)| *s == stamp) {
                continue;
            }
            let view = match outbox.nodes.load(&node) {
                Ok(Some(rec)) => Some(job_view(&rec)),
                Ok(None) => continue,
                Err(e) => {
                    log::warn!("node {node}: its record is not usable: {e}");
                    None
                }
            };
            let before = self.seen.insert(node.clone(), (stamp, view.clone()));
            let differs = match before {
                Some((_, old)) => old != view,
                None => true,
            };
            if self.primed && differs && view.is_some() {
                changed.insert(node);
            }
        }
        self.primed = true;
        changed
    }
}

/// Queues the RUNNING again of each running job on `nodes` that a hook or reconciliation
/// reported (its start record is in StateDir), so that the sender attributes it from the
/// nodes' new records. Jobs completing or still configuring are left alone, like jobs the
/// config filters out. Returns how many were queued.
pub fn resend_running_on(
    cfg: &crate::config::Config,
    slurm: &Slurm,
    cluster: &str,
    outbox: &StateDir,
    nodes: &BTreeSet<String>,
) -> Result<usize, String> {
    if nodes.is_empty() {
        return Ok(0);
    }
    let node_list: Vec<String> = nodes.iter().cloned().collect();
    let on_nodes = crate::slurm::running_jobs_on(slurm, &node_list, COMMAND_TIMEOUT)?;
    let starts: HashMap<String, i64> = outbox
        .starts
        .started_jobs()
        .into_iter()
        .map(|(k, start, _)| (k, start))
        .collect();
    // Only the jobs reported already are asked about (the others are reconciliation's).
    let ids: Vec<String> = on_nodes
        .into_iter()
        .map(|r| r.id)
        .filter(|id| starts.contains_key(&crate::cloudvision::payload::job_key(id, cluster)))
        .collect();
    let answer = crate::slurm::jobs_by_id(slurm, &ids, COMMAND_TIMEOUT)?;
    let mut jobs: Vec<&crate::slurm::JobInfo> = answer.found.values().collect();
    jobs.sort_by(|a, b| a.job_id.cmp(&b.job_id));
    jobs.dedup_by(|a, b| a.job_id == b.job_id);
    let mut queued = 0;
    for j in jobs
        .into_iter()
        .filter(|j| crate::service::reconcile::running_settled(j))
    {
        let key = crate::cloudvision::payload::job_key(&j.job_id, cluster);
        let Some(start) = starts.get(&key).copied() else {
            continue; // not reported yet: reconciliation sends it, from the new record
        };
        if cfg.job_wanted(&j.name, j.partition.as_deref()).is_err() {
            continue;
        }
        let Ok(job_nodes) = j.nodes() else { continue };
        let on: Vec<&str> = job_nodes
            .iter()
            .filter(|n| nodes.contains(*n))
            .map(String::as_str)
            .collect();
        if on.is_empty() {
            continue;
        }
        let on = on.join(",");
        let mut job = crate::cloudvision::payload::running_job(j, cluster, start, job_nodes);
        crate::service::reconcile::mark_suspended(&mut job, j);
        let rank = (j.restarts.unwrap_or(0), 0);
        let mut ev = Event::new(Item::Job { job }, rank);
        ev.anew = true;
        // A heterogeneous job's record is composed from every component as it is sent.
        ev.het = crate::service::het::part_of(j);
        if outbox.queue.enqueue_resend(&ev)? {
            log::info!(
                "job {key}: the inventory of {on} changed; RUNNING queued again for its interfaces"
            );
            queued += 1;
        } else {
            log::debug!("job {key}: not resent (an event of it is queued, in flight or ended)");
        }
    }
    if !answer.later.is_empty() {
        // The nodes stay marked as changed: the next poll asks again (a job already queued
        // again is not queued twice).
        outbox.status.record_slurm_warning(&format!(
            "resend: {} job(s) on changed nodes left for the next poll",
            answer.later.len()
        ));
        return Err(format!(
            "{queued} job(s) queued again, {} more on the changed nodes left for the next poll (at most {} asked of slurmctld per poll)",
            answer.later.len(),
            crate::slurm::JOB_QUERIES_PER_PASS
        ));
    }
    Ok(queued)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::record::Interface;

    fn rec(node: &str, mac: &str, ip: &str) -> DiscoverRecord {
        DiscoverRecord {
            node_name: node.into(),
            hostname: node.into(),
            location: None,
            interfaces: vec![Interface {
                name: "ens1f0".into(),
                mac_address: mac.into(),
                ip_addresses: vec![ip.into()],
            }],
            topology: None,
            topology_error: None,
            taken_at: None,
        }
    }

    fn dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("cvslurm-resend-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// An IP address is not part of what jobs depend on; a MAC is.
    #[test]
    fn job_view_ignores_addresses_not_macs() {
        let a = rec("n1", "02:00:00:00:00:01", "10.0.0.1");
        assert_eq!(
            job_view(&a),
            job_view(&rec("n1", "02:00:00:00:00:01", "10.0.0.9"))
        );
        assert_ne!(
            job_view(&a),
            job_view(&rec("n1", "02:00:00:00:00:02", "10.0.0.1"))
        );
    }

    /// The first look learns; then a new record and a changed MAC count, a rewrite with the
    /// same MACs (new IP) and a removed record do not.
    #[test]
    fn watch_names_the_nodes_whose_record_changed() {
        let d = dir("watch");
        let ob = StateDir::new(&d);
        ob.nodes
            .save(&rec("n1", "02:00:00:00:00:01", "10.0.0.1"))
            .unwrap();
        let mut w = RecordWatch::default();
        assert!(w.changed(&ob).is_empty());
        assert!(w.changed(&ob).is_empty());
        ob.nodes
            .save(&rec("n2", "02:00:00:00:00:02", "10.0.0.2"))
            .unwrap();
        assert_eq!(w.changed(&ob), BTreeSet::from(["n2".to_string()]));
        // Same MACs, another address and a longer file: not a change for jobs.
        ob.nodes
            .save(&rec("n1", "02:00:00:00:00:01", "10.0.100.100"))
            .unwrap();
        assert!(w.changed(&ob).is_empty());
        ob.nodes
            .save(&rec("n1", "02:00:00:00:0a:01", "10.0.100.101"))
            .unwrap();
        assert_eq!(w.changed(&ob), BTreeSet::from(["n1".to_string()]));
        ob.nodes.forget("n2");
        assert!(w.changed(&ob).is_empty());
        // A garbage record is skipped, and a good one after it counts.
        std::fs::write(d.join("nodes/n2.json"), b"{not json").unwrap();
        assert!(w.changed(&ob).is_empty());
        ob.nodes
            .save(&rec("n2", "02:00:00:00:00:02", "10.0.0.2"))
            .unwrap();
        assert_eq!(w.changed(&ob), BTreeSet::from(["n2".to_string()]));
        let _ = std::fs::remove_dir_all(&d);
    }
}

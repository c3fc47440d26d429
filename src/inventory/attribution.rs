//! Which interfaces a job uses: from the GPUs Slurm gave it on each node and the nodes'
//! topology records, the MACs of the NICs nearest those GPUs (`JobInterfaces=gpu|auto`).
//!
//! [`attribute`] is pure: the caller fetches the job's GPUs ([`crate::slurm::job_gpus`]) and
//! the nodes' records (the inventory's copies in StateDir, [`crate::state::StateDir::load_node_record`]).

use crate::config::JobInterfaces;
use crate::discovery::record::DiscoverRecord;
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
        // Slurm's GRES index → physical GPU (a MIG instance's parent).
        let slurm_gpus = topo.slurm_indices();
        let node_gpus: BTreeSet<u32> = slurm_gpus.keys().copied().collect();
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
        let physical: BTreeSet<u32> = held.iter().map(|i| slurm_gpus[i]).collect();
        let held_words = if topo.migs.is_empty() {
            format_indices(held)
        } else {
            format!(
                "{} (on GPUs {})",
                format_indices(held),
                format_indices(&physical)
            )
        };
        let mut near: Vec<&crate::discovery::topology::NicTopology> = topo
            .nics
            .iter()
            .filter(|n| n.gpus.iter().any(|g| physical.contains(g)))
            .collect();
        near.sort_by(|a, b| a.name.cmp(&b.name));
        if near.is_empty() {
            if mode == JobInterfaces::Auto {
                return by_nodes(format!(
                    "nodes (auto): no NIC is near GPUs {held_words} of {node}"
                ));
            }
            macs.extend(all_macs);
            parts.push(format!(
                "{node}: GPUs {held_words} have no near NIC, all {} NIC(s)",
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
            "{node}: GPUs {held_words} -> {} ({})",
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

/// Keeps `a` where every node of the job has a fresh record; else the job goes by node names,
/// never with a MAC from before its node's slurmd restarted. `starts`: each node's slurmd
/// start, or why they could not be had. An attribution by node names is kept as it is.
pub fn fresh_or_nodes(
    mode: JobInterfaces,
    a: Attribution,
    job_nodes: &[String],
    records: &BTreeMap<String, DiscoverRecord>,
    starts: Result<&BTreeMap<String, i64>, &str>,
) -> Attribution {
    if a.macs.is_none() {
        return a;
    }
    let m = mode.word();
    let starts = match starts {
        Ok(s) => s,
        Err(e) => {
            return Attribution {
                macs: None,
                rule: format!("nodes ({m}): when the nodes' slurmd started is not known: {e}"),
            }
        }
    };
    for node in job_nodes {
        let Some(rec) = records.get(node) else {
            continue;
        };
        if let Some(why) = super::freshness::not_fresh(rec.taken_at, starts.get(node).copied()) {
            return Attribution {
                macs: None,
                rule: format!(
                    "nodes ({m}): {node}: {why}; its NICs may have changed, it is discovered \
                     again at the next poll"
                ),
            };
        }
    }
    a
}

/// The first Slurm release whose slurmd lists MIG instances without `Links` (commit
/// 3345d44ae2, "gpu/nvml - Remove links for MIG gres devices"), the order
/// [`crate::discovery::topology::Topology::slurm_indices`] rebuilds.
pub const MIG_ORDER_SINCE: crate::slurm::version::Version = crate::slurm::version::Version {
    major: 23,
    minor: 2,
    micro: 7,
};

/// Node names when one of the nodes has MIG instances and Slurm (`version`, `None` when
/// unknown) is older than [`MIG_ORDER_SINCE`]: its slurmd ordered MIG instances by their
/// position within their GPU as NVML enumerates them, which the driver's files do not show.
pub fn mig_order_unknown(
    mode: JobInterfaces,
    records: &BTreeMap<String, DiscoverRecord>,
    version: Option<crate::slurm::version::Version>,
) -> Option<Attribution> {
    let node = records
        .iter()
        .find(|(_, r)| r.topology.as_ref().is_some_and(|t| !t.migs.is_empty()))?
        .0;
    match version {
        Some(v) if v >= MIG_ORDER_SINCE => None,
        v => Some(by_nodes(format!(
            "nodes ({}): {node} has MIG instances, whose GRES indices Slurm {} numbers in an order not known here (known from {}.{:02}.{})",
            mode.word(),
            v.map_or("(version unknown)".into(), |v| format!("{}.{:02}.{}", v.major, v.minor, v.micro)),
            MIG_ORDER_SINCE.major,
            MIG_ORDER_SINCE.minor,
            MIG_ORDER_SINCE.micro
        ))),
    }
}

/// Applies `JobInterfaces` to a job built from Slurm (`send`; the service's enrichment):
/// asks slurmctld which GPUs the job holds on each node, reads the nodes' records the
/// inventory keeps in StateDir, and, when [`attribute`] says so, turns the JobConfig from node
/// names into the MACs of the NICs nearest its GPUs. Never fails: any doubt keeps node names.
/// Returns the rule used (also logged at debug).
///
/// MACs are sent only from records that are fresh ([`super::freshness`]): a record not taken
/// after its node's slurmd last started (the node rebooted, powered up, registered anew) may
/// name NICs the node no longer has, and the job goes by node names (logged). The nodes'
/// slurmd start times come from a listing that began after `after` (nanoseconds since the
/// epoch: when the job's event was queued, or the command began).
pub fn enrich(
    mode: JobInterfaces,
    slurm: &crate::slurm::runner::Slurm,
    outbox: &crate::state::StateDir,
    job: &mut crate::cloudvision::payload::JobConfig,
    after: u128,
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
            // Every NIC of its nodes is the job's: no per-GPU lookup.
            Ok(g) if g.exclusive => by_nodes(format!(
                "nodes ({}): the job has its nodes to itself (OverSubscribe=NO)",
                mode.word()
            )),
            Ok(crate::slurm::JobGres { gpus, .. }) => {
                match gpus.keys().find(|n| !nodes.contains(n)) {
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
                        match mig_order_unknown(mode, &records, crate::slurm::version(slurm).ok()) {
                            Some(a) => a,
                            None => {
                                let a = attribute(mode, &nodes, &gpus, &records);
                                if a.macs.is_none() {
                                    a
                                } else {
                                    let starts = super::freshness::starts_after(slurm, after);
                                    let a = fresh_or_nodes(
                                        mode,
                                        a,
                                        &nodes,
                                        &records,
                                        starts.as_ref().map_err(String::as_str),
                                    );
                                    if a.macs.is_none() {
                                        log::info!(
                                            "job {}: sent by node names: {}",
                                            job.key.id,
                                            a.rule
                                        );
                                    }
                                    a
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    log::debug!("job {}: {}", job.key.id, a.rule);
    if let Some(macs) = &a.macs {
        job.nodes = None;
        job.interfaces = Some(macs.clone().into());
    }
    a
}

/// Why a job's stored record in CloudVision is deleted before its record is posted whole
/// ([`crate::service::engine::forget_stored_job`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forget {
    /// The RUNNING of a requeued job's later run: the earlier run's `end_time` (which a Set,
    /// a partial update, would keep) must not show the new run as ended.
    Rerun,
    /// An end whose job's representation is not recorded on this host, where jobs may go
    /// either way (`JobInterfaces=gpu|auto`): CloudVision may hold the other list, which a
    /// Set would keep beside this one.
    Representation,
}

/// Why a job's record goes out, as far as its representation is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// A record of the job as it was queued: the representation it was first sent with.
    Plain,
    /// The RUNNING of a requeued job's later run (its restart count): decided anew, the
    /// earlier run's record deleted first, once ([`crate::state::job_reps::JobReps::rerun_deleted`]).
    Rerun(u32),
    /// A RUNNING queued again because the inventory of one of its nodes changed: decided
    /// anew from the new records; where the kind changes (node names ↔ MACs) the stored
    /// record is deleted first.
    Anew,
}

impl Why {
    /// Why a record of `job` goes out that no event carries (`send`'s, from Slurm's record of
    /// the run with restart count `restarts`): a re-run's RUNNING, else as it is, as
    /// [`Why::of`] says for an event of that run.
    pub fn of_run(job: &crate::cloudvision::payload::JobConfig, restarts: u32) -> Why {
        if crate::state::event::starts_a_rerun(job, restarts) {
            Why::Rerun(restarts)
        } else {
            Why::Plain
        }
    }

    /// Why `ev`'s record goes out: a re-run's RUNNING, a RUNNING resent for its nodes' new
    /// inventory ([`crate::state::event::Event::anew`]), or as queued.
    pub fn of(ev: &crate::state::event::Event) -> Why {
        if ev.starts_a_rerun() {
            Why::Rerun(ev.rank.0)
        } else if ev.anew {
            Why::Anew
        } else {
            Why::Plain
        }
    }
}

/// A job's record as it goes out ([`outgoing`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The record: exactly one of `nodes` and `interfaces`.
    pub job: crate::cloudvision::payload::JobConfig,
    /// Delete CloudVision's stored record of the job first, and why.
    pub forget: Option<Forget>,
    /// The rule that decided the representation now (`None`: a recorded one, or a tenant
    /// job's own), for a dry run and the debug log.
    pub rule: Option<String>,
    /// A re-run's restart count, where the earlier run's record is deleted first: once that
    /// delete is done it is noted ([`crate::service::engine::post_outgoing`]), and a resend of
    /// the same run's RUNNING deletes nothing.
    pub rerun: Option<u32>,
}

/// The one rule for how a job's record goes out, for the service's engine, the hook's own
/// send and `send`: one representation per job, never both lists, never an empty one.
///
/// - A tenant job goes as its caller gave it; one whose caller switches lists (recorded as
///   for any job) deletes the stored record first ([`Forget::Representation`]).
/// - A job whose representation is recorded in `reps` goes that way (an end the way its
///   RUNNING went, by the same MACs even once slurmctld has forgotten its GPUs).
/// - Otherwise it is decided now: by node names with `JobInterfaces=nodes`, or where Slurm
///   cannot be asked (`ask` is `None`: the hook never asks), else by [`enrich`]; a list of
///   more than [`crate::state::job_reps::MAX_MACS`] MACs goes by node names. A RUNNING's
///   decision is recorded (when `write`) before the record is sent, so that a retry and the
///   job's later records go the same way.
/// - An end decided here, where jobs may go either way, has no record of how its RUNNING
///   went (sent by the other controller, or the record lost): CloudVision's stored record is
///   deleted first ([`Forget::Representation`]) and the whole new one posted.
/// - A re-run's RUNNING ([`Why::Rerun`]) decides anew and deletes the earlier run's record
///   first, until that delete is done for this run: a resend of the same run's RUNNING (a
///   retry, a reconciliation's, a new inventory's) goes as recorded; a RUNNING resent for its nodes' new inventory ([`Why::Anew`]) decides anew and,
///   where the kind changes, deletes the stored record first.
pub fn outgoing(
    mode: JobInterfaces,
    reps: &crate::state::job_reps::JobReps,
    job: &crate::cloudvision::payload::JobConfig,
    why: Why,
    ask: Option<(&crate::slurm::runner::Slurm, &crate::state::StateDir, u128)>,
    write: bool,
) -> Outgoing {
    use crate::state::job_reps::Representation;
    let key = job.key.id.clone();
    let running = !job.state.is_terminal();
    // The earlier run's record deleted already for this run: this RUNNING is a resend.
    let why = match why {
        Why::Rerun(n) if reps.rerun_deleted(&key) == Some(n) => Why::Plain,
        w => w,
    };
    let rerun = match why {
        Why::Rerun(n) => Some(n),
        _ => None,
    };
    let save = |rep: &Representation| {
        if write && running {
            if let Err(e) = reps.save(&key, rep) {
                log::warn!("job {key}: cannot record how its records go: {e}");
            }
        }
    };
    let same_kind = |a: &Representation, b: &Representation| {
        std::mem::discriminant(a) == std::mem::discriminant(b)
    };
    if job.job_type == Some(crate::cloudvision::payload::JobType::Tenant) {
        // The caller chose the list; one that switches lists replaces the stored record.
        let now = representation_of(job);
        let forget = match (why, reps.load(&key)) {
            (Why::Rerun(_), _) => Some(Forget::Rerun),
            (_, Some(r)) if !same_kind(&r, &now) => Some(Forget::Representation),
            _ => None,
        };
        save(&now);
        return Outgoing {
            job: job.clone(),
            forget,
            rule: None,
            rerun,
        };
    }
    if rerun.is_some() && write {
        reps.forget(&key);
    }
    let recorded = match why {
        Why::Rerun(_) => None,
        _ => reps.load(&key),
    };
    let reassess = why == Why::Anew && ask.is_some() && running;
    if !reassess {
        let has_nodes = job.nodes.as_ref().is_some_and(|n| !n.values.is_empty());
        let mut out = job.clone();
        let the_recorded_way = match &recorded {
            Some(Representation::Interfaces(macs)) => {
                log::debug!(
                    "job {key}: interfaces: the {} MAC(s) of its first record",
                    macs.len()
                );
                out.nodes = None;
                out.interfaces = Some(macs.clone().into());
                true
            }
            Some(Representation::Nodes) if has_nodes => {
                out.interfaces = None;
                true
            }
            // No record, or one by node names of a record without any: decided below.
            _ => false,
        };
        if the_recorded_way {
            return Outgoing {
                job: out,
                forget: None,
                rule: None,
                rerun: None,
            };
        }
    }
    let (out, rep, rule) = decide(mode, job, ask);
    let forget = match (why, &recorded) {
        (Why::Rerun(_), _) => Some(Forget::Rerun),
        (Why::Anew, Some(was)) if reassess && !same_kind(was, &rep) => Some(Forget::Representation),
        (Why::Anew, Some(_)) if reassess => None,
        // An end with no record here, where it may go either way.
        _ if !running && mode != JobInterfaces::Nodes => Some(Forget::Representation),
        _ => None,
    };
    if mode != JobInterfaces::Nodes || recorded.is_some() {
        save(&rep);
    }
    Outgoing {
        job: out,
        forget,
        rule,
        rerun,
    }
}

/// The representation a record names.
fn representation_of(
    job: &crate::cloudvision::payload::JobConfig,
) -> crate::state::job_reps::Representation {
    use crate::state::job_reps::Representation;
    match &job.interfaces {
        Some(i) if job.nodes.is_none() => Representation::Interfaces(i.values.clone()),
        _ => Representation::Nodes,
    }
}

/// Decides a job's representation now: node names with `JobInterfaces=nodes` or without
/// Slurm to ask, else [`enrich`] (more than [`crate::state::job_reps::MAX_MACS`] MACs: node
/// names). Returns the record, its representation and the rule (`None`: nothing was asked).
fn decide(
    mode: JobInterfaces,
    job: &crate::cloudvision::payload::JobConfig,
    ask: Option<(&crate::slurm::runner::Slurm, &crate::state::StateDir, u128)>,
) -> (
    crate::cloudvision::payload::JobConfig,
    crate::state::job_reps::Representation,
    Option<String>,
) {
    use crate::state::job_reps::{Representation, MAX_MACS};
    let mut out = job.clone();
    let by_nodes = job.nodes.as_ref().is_some_and(|n| !n.values.is_empty());
    if mode == JobInterfaces::Nodes || !by_nodes {
        // The reference's bytes: node names as built (or a record built by interfaces).
        if by_nodes {
            out.interfaces = None;
        }
        let rep = representation_of(&out);
        return (out, rep, None);
    }
    let rule = match ask {
        Some((slurm, outbox, after)) => enrich(mode, slurm, outbox, &mut out, after).rule,
        None => format!("nodes ({}): decided without asking Slurm", mode.word()),
    };
    if let Some(i) = &out.interfaces {
        if i.values.len() > MAX_MACS {
            log::warn!(
                "job {}: {} interfaces, more than the {MAX_MACS} a record keeps: sent by node names",
                job.key.id,
                i.values.len()
            );
            out = job.clone();
            out.interfaces = None;
            return (out, Representation::Nodes, Some(rule));
        }
    }
    let rep = representation_of(&out);
    (out, rep, Some(rule))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one rule ([`outgoing`]) where Slurm is not asked (the hook's own send): one list
    /// per record, a job's records the way its first went, a delete first where that cannot
    /// be known or kept, nothing recorded with `JobInterfaces=nodes` or by a dry run.
    #[test]
    fn one_representation_per_job() {
        use crate::cloudvision::payload::{JobConfig, JobState, JobType, Key};
        use crate::state::job_reps::Representation;
        let d = std::env::temp_dir().join(format!("cvslurm-outgoing-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let reps = crate::state::StateDir::new(&d).job_reps;
        let job = |id: &str, state: JobState| JobConfig {
            key: Key { id: id.into() },
            name: Some("j".into()),
            state,
            start_time: Some("2025-12-05T10:30:00Z".into()),
            end_time: state.is_terminal().then(|| "2025-12-05T11:00:00Z".into()),
            location: Some("c".into()),
            job_type: None,
            nodes: Some(vec!["n1".to_string()].into()),
            interfaces: None,
        };
        let run = |mode, j: &JobConfig, why, write| outgoing(mode, &reps, j, why, None, write);
        use JobInterfaces::{Gpu, Nodes};
        use JobState::{Completed, Running};
        // JobInterfaces=nodes: as built, nothing recorded, no delete.
        let o = run(Nodes, &job("1@c", Running), Why::Plain, true);
        assert_eq!((o.job, o.forget), (job("1@c", Running), None));
        assert_eq!(reps.load("1@c"), None);
        let o = run(Nodes, &job("1@c", Completed), Why::Plain, true);
        assert_eq!(o.forget, None);
        // Either way: a RUNNING decided here goes by node names and is recorded; its end the
        // same way, with no delete.
        let o = run(Gpu, &job("2@c", Running), Why::Plain, true);
        assert_eq!((o.job.interfaces, o.forget), (None, None));
        assert_eq!(reps.load("2@c"), Some(Representation::Nodes));
        let o = run(Gpu, &job("2@c", Completed), Why::Plain, true);
        assert_eq!((o.job.nodes.is_some(), o.forget), (true, None));
        // An end with no record here: the stored record is deleted first.
        let o = run(Gpu, &job("3@c", Completed), Why::Plain, true);
        assert_eq!(o.forget, Some(Forget::Representation));
        assert_eq!(o.job.validate(), Ok(()));
        // Recorded MACs: every record goes by them, in any mode.
        let macs = vec!["02:00:00:00:00:01".to_string()];
        reps.save("4@c", &Representation::Interfaces(macs.clone()))
            .unwrap();
        for mode in [Gpu, Nodes] {
            let o = run(mode, &job("4@c", Completed), Why::Plain, true);
            assert_eq!(o.job.nodes, None);
            assert_eq!(o.job.interfaces, Some(macs.clone().into()));
            assert_eq!(o.forget, None);
            assert_eq!(o.job.validate(), Ok(()));
        }
        // A re-run decides anew and deletes the earlier run's record first.
        let o = run(Gpu, &job("4@c", Running), Why::Rerun(1), true);
        assert_eq!((o.job.interfaces, o.forget), (None, Some(Forget::Rerun)));
        assert_eq!(o.rerun, Some(1));
        assert_eq!(reps.load("4@c"), Some(Representation::Nodes));
        // Until that delete is done (a failed DELETE), every resend deletes again; once done,
        // a resend of the same run's RUNNING deletes nothing and goes as recorded; the next
        // run deletes again.
        let o = run(Gpu, &job("4@c", Running), Why::Rerun(1), true);
        assert_eq!((o.forget, o.rerun), (Some(Forget::Rerun), Some(1)));
        reps.note_rerun_deleted("4@c", 1).unwrap();
        assert_eq!(reps.rerun_deleted("4@c"), Some(1));
        let o = run(Gpu, &job("4@c", Running), Why::Rerun(1), true);
        assert_eq!((o.forget, o.rerun), (None, None));
        assert_eq!(o.job.validate(), Ok(()));
        let o = run(Gpu, &job("4@c", Running), Why::Rerun(2), true);
        assert_eq!((o.forget, o.rerun), (Some(Forget::Rerun), Some(2)));
        // The job's end forgets the note with the record.
        reps.note_rerun_deleted("4@c", 2).unwrap();
        reps.forget("4@c");
        assert_eq!(reps.rerun_deleted("4@c"), None);
        // A dry run records nothing.
        let o = run(Gpu, &job("5@c", Running), Why::Plain, false);
        assert_eq!(o.forget, None);
        assert_eq!(reps.load("5@c"), None);
        // A tenant job goes as given; a switch of lists deletes first.
        let mut t = job("tenant-1", Running);
        t.job_type = Some(JobType::Tenant);
        assert_eq!(run(Nodes, &t, Why::Plain, true).forget, None);
        t.nodes = None;
        t.interfaces = Some(macs.clone().into());
        let o = run(Nodes, &t, Why::Plain, true);
        assert_eq!((o.job, o.forget), (t.clone(), Some(Forget::Representation)));
        assert_eq!(run(Nodes, &t, Why::Plain, true).forget, None);
        let _ = std::fs::remove_dir_all(&d);
    }

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
        use crate::discovery::topology::fixtures::record;
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

    /// MIG instances are numbered as Slurm 23.02.7 and later number them; older or unknown
    /// versions send by node names when a node of the job has any.
    #[test]
    fn mig_order_needs_slurm_23_02_7() {
        use crate::slurm::version::Version;
        let v = |major, minor, micro| {
            Some(Version {
                major,
                minor,
                micro,
            })
        };
        let mut recs = dgx_cluster();
        for version in [v(22, 5, 11), v(23, 2, 6), None, v(26, 5, 3)] {
            assert_eq!(mig_order_unknown(JobInterfaces::Gpu, &recs, version), None);
        }
        let mig = crate::discovery::topology::fixtures::record_with(
            "dgx2",
            "dgx-a100",
            "02:dd:00:02",
            &[("MIG", "5:1/0")],
        );
        recs.insert("dgx2".into(), mig);
        for version in [v(23, 2, 7), v(24, 11, 6), v(26, 5, 3)] {
            assert_eq!(mig_order_unknown(JobInterfaces::Gpu, &recs, version), None);
        }
        let a = mig_order_unknown(JobInterfaces::Auto, &recs, v(22, 5, 11)).unwrap();
        assert_eq!(a.macs, None);
        assert_eq!(
            a.rule,
            "nodes (auto): dgx2 has MIG instances, whose GRES indices Slurm 22.05.11 numbers in an order not known here (known from 23.02.7)"
        );
        assert!(mig_order_unknown(JobInterfaces::Auto, &recs, None).is_some());
    }

    /// Two sockets: a job on socket 1's GPUs gets socket 1's NICs only.
    #[test]
    fn two_socket_split_by_numa() {
        let rec =
            crate::discovery::topology::fixtures::record("pcie1", "two-socket", "02:dd:00:03");
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

    fn stamped(node: &str, taken_at: Option<i64>) -> DiscoverRecord {
        let mut r = crate::discovery::topology::fixtures::record(node, "dgx-a100", "02:dd:00:01");
        r.taken_at = taken_at;
        r
    }

    /// A job whose attribution names MACs keeps them only where each node's record is fresh;
    /// one stale node, an unknown start or a failed listing send it by node names. A job by
    /// node names is left alone.
    #[test]
    fn stale_records_send_by_node_names() {
        let nodes: Vec<String> = vec!["n1".into(), "n2".into()];
        let records: BTreeMap<String, DiscoverRecord> = [
            ("n1".to_string(), stamped("n1", Some(2000))),
            ("n2".to_string(), stamped("n2", Some(2000))),
        ]
        .into();
        let macs = Attribution {
            macs: Some(vec!["02:dd:00:01:0c:00".into()]),
            rule: "interfaces (auto): n1: GPUs 0-3 -> enp12s0".into(),
        };
        let starts: BTreeMap<String, i64> = [("n1".into(), 1500), ("n2".into(), 1999)].into();
        let mode = JobInterfaces::Auto;
        let kept = fresh_or_nodes(mode, macs.clone(), &nodes, &records, Ok(&starts));
        assert_eq!(kept, macs);
        let restarted: BTreeMap<String, i64> = [("n1".into(), 1500), ("n2".into(), 2000)].into();
        let a = fresh_or_nodes(mode, macs.clone(), &nodes, &records, Ok(&restarted));
        assert_eq!(a.macs, None);
        assert!(
            a.rule.starts_with("nodes (auto): n2: its record (taken 1970-01-01T00:33:20Z) is not from after its slurmd started"),
            "{}",
            a.rule
        );
        let unknown: BTreeMap<String, i64> = [("n1".into(), 1500)].into();
        let a = fresh_or_nodes(mode, macs.clone(), &nodes, &records, Ok(&unknown));
        assert!(
            a.rule.contains("n2: when its slurmd started is not known"),
            "{}",
            a.rule
        );
        let a = fresh_or_nodes(
            JobInterfaces::Gpu,
            macs.clone(),
            &nodes,
            &records,
            Err("scontrol failed"),
        );
        assert_eq!(
            a.rule,
            "nodes (gpu): when the nodes' slurmd started is not known: scontrol failed"
        );
        let by_nodes = Attribution {
            macs: None,
            rule: "nodes (auto): whole".into(),
        };
        assert_eq!(
            fresh_or_nodes(mode, by_nodes.clone(), &nodes, &records, Err("x")),
            by_nodes
        );
    }
}

//! Is a node's discover record still its node's? A node that reboots, powers up, registers
//! anew or gets other NICs restarts its slurmd, and its record from before says nothing of
//! the NICs it has now. The rule: a record is fresh iff it was taken (`taken_at`, the node's
//! clock as discovery began) in a later second than the node's slurmd started
//! (`SlurmdStartTime`, the same clock: slurmd stamps its own start). A record taken in the
//! same second may be from before the restart, and is not.
//!
//! Where it is used: job attribution (`JobInterfaces=gpu|auto`) sends a job by node names
//! rather than with a MAC from a record that is not fresh
//! ([`super::attribution::fresh_or_nodes`]); the monitor
//! discovers again, at its next poll, each node whose record is not fresh
//! (`crate::service::monitor`), and resends the jobs running there.
//!
//! Slurm is asked with `scontrol show node -o` ([`crate::slurm::slurmd_starts`]), one
//! REQUEST_NODE_INFO (every node, as sinfo asks): at most one a second in a process, shared by
//! every decision it serves ([`starts_after`]).

use crate::discovery::record::DiscoverRecord;
use crate::slurm::runner::Slurm;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

/// Why a record taken at `taken_at` (`None`: a record without one) is not known to describe
/// its node as it is now, given when the node's slurmd started (`start`, `None`: not known);
/// `None` when it is fresh.
pub fn not_fresh(taken_at: Option<i64>, start: Option<i64>) -> Option<String> {
    let fmt = |t: i64| crate::timefmt::format_epoch(t).unwrap_or_else(|| t.to_string());
    match (taken_at, start) {
        (_, None) => Some("when its slurmd started is not known".to_string()),
        (None, Some(_)) => Some(
            "its record has no discovery time (discovered by a cvslurm older than this one)"
                .to_string(),
        ),
        (Some(t), Some(s)) if t > s => None,
        (Some(t), Some(s)) => Some(format!(
            "its record (taken {}) is not from after its slurmd started ({})",
            fmt(t),
            fmt(s)
        )),
    }
}

/// The least time between two listings of one process ([`starts_after`]).
const SPACING: Duration = Duration::from_secs(1);
/// How long a listing serves decisions whose events came before it.
const MAX_AGE: Duration = Duration::from_secs(2);

/// The last listing of this process: when it began (nanoseconds since the epoch) and what it
/// said, for every node.
static LAST: Mutex<Option<(u128, BTreeMap<String, i64>)>> = Mutex::new(None);

/// Every node's slurmd start, from a listing that began after `after` (nanoseconds since the
/// epoch: when the job's event was queued, or when a command began), so that it shows every
/// registration before the job's record was asked for. The last listing serves while it is
/// recent ([`MAX_AGE`]); a new one comes at most once a [`SPACING`] (waiting for the rest of
/// it), so a burst of jobs costs one listing.
pub fn starts_after(slurm: &Slurm, after: u128) -> Result<BTreeMap<String, i64>, String> {
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    let now = crate::timefmt::now_nanos();
    if let Some((began, starts)) = last.as_ref() {
        if *began > after && now.saturating_sub(*began) <= MAX_AGE.as_nanos() {
            return Ok(starts.clone());
        }
        let next = began + SPACING.as_nanos();
        if next > now {
            std::thread::sleep(Duration::from_nanos(
                u64::try_from(next - now).unwrap_or(u64::MAX),
            ));
        }
    }
    list(slurm, &mut last)
}

/// Lists every node's slurmd start now (the monitor's poll), and keeps the listing for the
/// decisions that follow it.
pub fn starts_now(slurm: &Slurm) -> Result<BTreeMap<String, i64>, String> {
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    list(slurm, &mut last)
}

fn list(
    slurm: &Slurm,
    last: &mut Option<(u128, BTreeMap<String, i64>)>,
) -> Result<BTreeMap<String, i64>, String> {
    let began = crate::timefmt::now_nanos();
    let starts = crate::slurm::slurmd_starts(slurm, None, crate::slurm::COMMAND_TIMEOUT)?;
    *last = Some((began, starts.clone()));
    Ok(starts)
}

/// How many records that are still not fresh the monitor takes for one slurmd start before it
/// stops discovering the node again (a node whose clock is behind its slurmd's start, or
/// whose worker is older than this cvslurm, never gives a fresh record): its jobs go by node
/// names meanwhile. A discovery that fails (a busy node) is no try: it is retried every poll.
pub const MAX_TRIES: u32 = 3;

/// The monitor's memory of the records' discovery times and of the nodes it discovered again
/// after a restart ([`Restarts::due`]).
#[derive(Debug, Default)]
pub struct Restarts {
    /// Each node's record's `taken_at`, as last saved or read.
    taken: BTreeMap<String, Option<i64>>,
    /// Per node: the slurmd start it was discovered again for, and how many records that were
    /// still not fresh came back.
    tries: BTreeMap<String, (i64, u32)>,
    /// Nodes due again whose fresh record is not in yet, with their slurmd's start.
    owed: BTreeMap<String, i64>,
    /// Nodes due again whose new record came in since [`Restarts::settled`] was last asked.
    settled: std::collections::BTreeSet<String>,
}

impl Restarts {
    /// A record the monitor just kept for its node.
    pub fn noted(&mut self, rec: &DiscoverRecord) {
        self.taken.insert(rec.node_name.clone(), rec.taken_at);
        let node = &rec.node_name;
        if let Some(&start) = self.owed.get(node) {
            if not_fresh(rec.taken_at, Some(start)).is_none() {
                self.owed.remove(node);
                self.tries.remove(node);
                self.settled.insert(node.clone());
            } else {
                // A discovery that gave a record still not fresh counts as a try.
                let tries = self.tries.entry(node.clone()).or_insert((start, 0));
                if tries.0 != start {
                    *tries = (start, 0);
                }
                tries.1 += 1;
            }
        }
    }

    /// The nodes discovered again after a restart whose new record came in since the last
    /// call (in this poll or, after a failed discovery, a later one): their running jobs are
    /// decided anew.
    pub fn settled(&mut self) -> std::collections::BTreeSet<String> {
        std::mem::take(&mut self.settled)
    }

    /// Forgets a node (it left the cluster, or this host stopped leading).
    pub fn forget(&mut self, node: &str) {
        self.taken.remove(node);
        self.tries.remove(node);
        self.owed.remove(node);
        self.settled.remove(node);
    }

    /// Forgets every node.
    pub fn clear(&mut self) {
        *self = Restarts::default();
    }

    /// Which of `nodes` (sent, available) to discover again now, each with why: those whose
    /// record is not fresh for their slurmd's start in `starts` (one listing per poll). A
    /// record not known yet is read from StateDir once. At most [`MAX_TRIES`] times per
    /// slurmd start, then one warning.
    pub fn due(
        &mut self,
        outbox: &crate::state::StateDir,
        starts: &BTreeMap<String, i64>,
        nodes: &[&str],
    ) -> BTreeMap<String, String> {
        let mut due = BTreeMap::new();
        for node in nodes {
            let Some(&start) = starts.get(*node) else {
                continue;
            };
            let taken = match self.taken.get(*node) {
                Some(t) => *t,
                None => match outbox.nodes.load(node) {
                    Ok(Some(r)) => {
                        self.taken.insert(node.to_string(), r.taken_at);
                        r.taken_at
                    }
                    // No record (or none readable): the monitor's own discovery writes one.
                    _ => continue,
                },
            };
            let Some(why) = not_fresh(taken, Some(start)) else {
                self.tries.remove(*node);
                continue;
            };
            let tries = self.tries.entry(node.to_string()).or_insert((start, 0));
            if tries.0 != start {
                *tries = (start, 0);
            }
            if tries.1 >= MAX_TRIES {
                if tries.1 == MAX_TRIES {
                    log::warn!(
                        "node {node}: {why}, after {MAX_TRIES} discoveries since its slurmd \
                         started: not discovered again until it restarts; its jobs go by node \
                         names (is its clock behind, or its cvslurm older than this one?)"
                    );
                    tries.1 += 1;
                }
                continue;
            }
            self.owed.insert(node.to_string(), start);
            due.insert(node.to_string(), why);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(node: &str, taken_at: Option<i64>) -> DiscoverRecord {
        let mut r = crate::discovery::topology::fixtures::record(node, "dgx-a100", "02:dd:00:01");
        r.taken_at = taken_at;
        r
    }

    /// Fresh only when taken in a later second than slurmd's start; the same second, an
    /// earlier one, no discovery time or no known start are not.
    #[test]
    fn fresh_iff_taken_in_a_later_second() {
        assert_eq!(not_fresh(Some(1001), Some(1000)), None);
        let same = not_fresh(Some(1000), Some(1000)).unwrap();
        assert_eq!(
            same,
            "its record (taken 1970-01-01T00:16:40Z) is not from after its slurmd started (1970-01-01T00:16:40Z)"
        );
        assert!(not_fresh(Some(999), Some(1000)).is_some());
        assert!(not_fresh(None, Some(1000))
            .unwrap()
            .contains("no discovery time"));
        assert!(not_fresh(Some(1001), None).unwrap().contains("not known"));
    }

    /// The monitor's side: a sent node whose slurmd started after its record is due again
    /// (its record read from StateDir once), settled once a fresh record is noted, and given
    /// up after MAX_TRIES discoveries for one start; a new start tries again.
    #[test]
    fn restarted_nodes_are_due_again() {
        let d = std::env::temp_dir().join(format!("cvslurm-fresh-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let outbox = crate::state::StateDir::new(&d);
        outbox.nodes.save(&rec("n1", Some(1000))).unwrap();
        outbox.nodes.save(&rec("n2", Some(1000))).unwrap();
        let mut r = Restarts::default();
        let starts: BTreeMap<String, i64> =
            [("n1".into(), 900), ("n2".into(), 1000), ("n3".into(), 1)].into();
        // n3 has no record (its own discovery writes one); n1 is fresh; n2 is not.
        let due = r.due(&outbox, &starts, &["n1", "n2", "n3"]);
        assert_eq!(due.keys().collect::<Vec<_>>(), ["n2"]);
        assert!(due["n2"].contains("not from after its slurmd started"));
        assert!(r.settled().is_empty());
        // The new record came from the same second: not settled, due again; then settled by a
        // fresh one.
        r.noted(&rec("n2", Some(1000)));
        assert!(r.settled().is_empty());
        assert_eq!(r.due(&outbox, &starts, &["n2"]).len(), 1);
        r.noted(&rec("n2", Some(1001)));
        assert!(r.due(&outbox, &starts, &["n1", "n2"]).is_empty());
        assert_eq!(r.settled().into_iter().collect::<Vec<_>>(), ["n2"]);
        // A worker that never gives a discovery time: MAX_TRIES tries per start, then none.
        let old: BTreeMap<String, i64> = [("n2".into(), 2000)].into();
        for _ in 0..MAX_TRIES {
            assert_eq!(r.due(&outbox, &old, &["n2"]).len(), 1);
            r.noted(&rec("n2", None));
        }
        assert!(r.due(&outbox, &old, &["n2"]).is_empty());
        let newer: BTreeMap<String, i64> = [("n2".into(), 3000)].into();
        assert_eq!(r.due(&outbox, &newer, &["n2"]).len(), 1);
        r.forget("n2");
        r.noted(&rec("n2", Some(3001)));
        // Forgotten: owed nothing any more.
        assert!(r.settled().iter().all(|n| n != "n2"));
        let _ = std::fs::remove_dir_all(&d);
    }
}

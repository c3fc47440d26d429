//! One queued event as it is on disk: what it asks CloudVision to do ([`Item`]), its place in
//! the queue and in its job's life ([`Event`]), and its format ([`EVENT_FORMAT`]): each event
//! file is one JSON object carrying `"v"`; a file without it is format 1, the shape written
//! before `"v"` existed; a file of a newer format is told apart from a corrupt one
//! ([`decode_event`]) and never sent, replaced or deleted ([`super::queue`]).

use super::durable::safe_name;
use crate::cloudvision::payload::{JobConfig, NodeConfig};
use serde::{Deserialize, Serialize};
use std::time::{SystemTime, UNIX_EPOCH};

/// What one event asks CloudVision to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Item {
    /// POST a JobConfig.
    Job {
        /// The record.
        job: JobConfig,
    },
    /// POST a NodeConfig.
    Node {
        /// The record.
        node: NodeConfig,
    },
    /// DELETE a NodeConfig.
    NodeDelete {
        /// The node name (bare; the key CloudVision has is [`crate::cloudvision::payload::NodeKeys`]'s).
        name: String,
        /// The cluster that sent the node (the monitor's): the delete leaves a NodeConfig
        /// CloudVision stores with another location alone. Absent in events of earlier
        /// versions, which are sent without that question.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        location: Option<String>,
    },
}

impl Item {
    /// The outbox file name of this item's key (`job.<id>.json`, `node.<name>.json`).
    pub fn file_name(&self) -> String {
        let (kind, key) = match self {
            Item::Job { job } => ("job", job.key.id.as_str()),
            Item::Node { node } => ("node", node.key.id.as_str()),
            Item::NodeDelete { name, .. } => ("node", name.as_str()),
        };
        format!("{kind}.{}.json", safe_name(key))
    }

    /// A short description for log lines: `job 12345@c COMPLETED`, `node n1`, `delete node n1`.
    pub fn describe(&self) -> String {
        match self {
            Item::Job { job } => format!("job {} {}", job.key.id, job.state),
            Item::Node { node } => format!("node {}", node.key.id),
            Item::NodeDelete { name, .. } => format!("delete node {name}"),
        }
    }
}

/// The format of the events this cvslurm writes: the `"v"` of every event file. A file without
/// `"v"` was written before the field existed, in this same shape: format 1. A file of a
/// higher format (a newer cvslurm wrote it, and this one was installed over it) is left in
/// place, reported and never sent ([`Undecodable::Newer`]).
pub const EVENT_FORMAT: u32 = 1;

fn format_1() -> u32 {
    1
}

/// One queued event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The format it was written in ([`EVENT_FORMAT`]).
    #[serde(default = "format_1")]
    pub v: u32,
    /// Queue order: nanoseconds since the epoch when it was made.
    pub seq: u128,
    /// Supersession order within one key: `(restart count, phase)`, phase 0 running, 1 ended
    /// (2: an end corrected by reconciliation). An event never replaces a pending one of
    /// higher rank. The restart count is Slurm's (`SLURM_JOB_RESTART_COUNT`, slurmctld's
    /// `Restarts`): it also tells a re-run's RUNNING ([`Event::starts_a_rerun`]).
    pub rank: (u32, u8),
    /// Unix seconds when it was queued.
    pub queued_at: i64,
    /// Failed delivery attempts so far.
    #[serde(default)]
    pub attempts: u32,
    /// Set on an epilog's event written while the service runs: its state comes from the exit
    /// codes only, and the service must ask slurmctld how the job ended (and its times) and
    /// fix the record before the first send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolve: Option<EndFacts>,
    /// The job's end, queued while this RUNNING was still waiting: sent right after this one
    /// is delivered, so CloudVision sees RUNNING then the end, never the end alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub then: Option<Box<Event>>,
    /// Set on a RUNNING queued again because the inventory of one of its nodes changed
    /// ([`crate::service::resend`]): the job's representation is decided anew from the new
    /// records, not taken from the record of its first send
    /// ([`crate::inventory::attribution::outgoing`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub anew: bool,
    /// Set on an event of one component of a heterogeneous job, keyed by the job's leader:
    /// its record is composed from Slurm's record of every component as it is sent
    /// ([`crate::service::het`]). A cvslurm that does not know the field sends the record as
    /// queued (the leader's key, this component's nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub het: Option<HetPart>,
    /// What to send.
    #[serde(flatten)]
    pub item: Item,
}

impl Event {
    /// A new event for `item` with the given rank.
    pub fn new(item: Item, rank: (u32, u8)) -> Event {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Event {
            v: EVENT_FORMAT,
            seq: now.as_nanos(),
            rank,
            queued_at: now.as_secs() as i64,
            attempts: 0,
            resolve: None,
            then: None,
            anew: false,
            het: None,
            item,
        }
    }
}

impl Event {
    /// True for the RUNNING of a requeued job's later run (restart count above 0): CloudVision
    /// may still hold the earlier run's record, whose `end_time` a Set (a partial update)
    /// would keep, so the record is deleted before this is sent
    /// ([`crate::service::engine::post_outgoing`]).
    pub fn starts_a_rerun(&self) -> bool {
        matches!(&self.item, Item::Job { job } if starts_a_rerun(job, self.rank.0))
    }
}

/// True when `job`'s record, of the run with Slurm's restart count `restarts`, is the
/// RUNNING of a requeued job's later run ([`Event::starts_a_rerun`]).
pub fn starts_a_rerun(job: &crate::cloudvision::payload::JobConfig, restarts: u32) -> bool {
    restarts > 0 && job.state == crate::cloudvision::payload::JobState::Running
}

/// Which component of a heterogeneous job an event comes from (see [`Event::het`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HetPart {
    /// The component's own job id (`SLURM_JOB_ID` in its hooks), for the log: no record is
    /// ever sent under it.
    pub component: String,
    /// Its index (`SLURM_HET_JOB_OFFSET`), 0 for the leader.
    pub offset: u32,
    /// The component ended while the job goes on (its epilog, or its job-completion record,
    /// with an offset above 0): the job's nodes shrink; the job's own end is its leader's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub left: bool,
}

/// What an epilog knew of a job's end without asking slurmctld (see [`Event::resolve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndFacts {
    /// `SLURM_JOB_EXIT_CODE2` as (exit code, signal).
    pub exit: Option<(i32, i32)>,
    /// `SLURM_JOB_RESTART_COUNT`.
    pub restart_count: u32,
    /// The start time came from Slurm's environment or the prolog's record (else: a guess).
    pub start_known: bool,
    /// The end time came from Slurm's environment (else: the epilog's clock).
    pub end_known: bool,
}

/// Why a file's bytes are no event this cvslurm sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undecodable {
    /// An event of a format newer than [`EVENT_FORMAT`]: written by a newer cvslurm.
    Newer(u64),
    /// Not an event.
    Corrupt(String),
}

impl std::fmt::Display for Undecodable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Undecodable::Newer(v) => write!(
                f,
                "an event of format {v}, written by a newer cvslurm (this one reads formats up \
                 to {EVENT_FORMAT}); left in place: install that cvslurm again to send it"
            ),
            Undecodable::Corrupt(why) => write!(f, "not an event ({why})"),
        }
    }
}

/// Decodes an event file's bytes: formats up to [`EVENT_FORMAT`] (a file without `"v"` is
/// format 1), telling a newer format from a corrupt file.
pub fn decode_event(bytes: &[u8]) -> Result<Event, Undecodable> {
    /// Only the format of whatever JSON object the file holds.
    #[derive(Deserialize)]
    struct Format {
        v: Option<u64>,
    }
    let newer = |v: u64| (v > u64::from(EVENT_FORMAT)).then_some(Undecodable::Newer(v));
    match serde_json::from_slice::<Event>(bytes) {
        Ok(ev) => match newer(ev.v.into()) {
            Some(n) => Err(n),
            None => Ok(ev),
        },
        // A newer format may have changed the shape too: only its "v" is read then.
        Err(e) => match serde_json::from_slice::<Format>(bytes)
            .ok()
            .and_then(|f| f.v)
        {
            Some(v) if newer(v).is_some() => Err(Undecodable::Newer(v)),
            _ => Err(Undecodable::Corrupt(e.to_string())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloudvision::payload::{JobConfig, JobState, Key};

    /// A re-run's RUNNING is told by the restart count in the rank, which every event file
    /// carries (format 1 included): no new field.
    #[test]
    fn a_reruns_running_is_told_by_its_rank() {
        let job = |state| Item::Job {
            job: JobConfig {
                key: Key { id: "5@c".into() },
                name: None,
                state,
                start_time: None,
                end_time: Some("2025-01-01T00:00:00Z".into()).filter(|_| state.is_terminal()),
                location: None,
                job_type: None,
                nodes: Some(vec!["n1".to_string()].into()),
                interfaces: None,
            },
        };
        assert!(!Event::new(job(JobState::Running), (0, 0)).starts_a_rerun());
        assert!(Event::new(job(JobState::Running), (1, 0)).starts_a_rerun());
        assert!(!Event::new(job(JobState::Completed), (1, 1)).starts_a_rerun());
        let old = r#"{"seq":1,"rank":[2,0],"queued_at":1,"kind":"job","job":{"key":{"id":"5@c"},"state":"JOB_STATE_RUNNING","nodes":{"values":["n1"]}}}"#;
        let ev = decode_event(old.as_bytes()).unwrap();
        assert!(ev.starts_a_rerun());
        assert!(!Event::new(
            Item::NodeDelete {
                name: "n1".into(),
                location: None
            },
            (3, 0)
        )
        .starts_a_rerun());
    }
}

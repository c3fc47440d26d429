//! Everything cvslurm keeps in `StateDir`, one store per concern, opened together by
//! [`StateDir::new`].
//!
//! Layout (names in [`layout`]; all files 0600 and directories 0700, owned by whoever wrote
//! them: SlurmUser for the hooks, and StateDir's owner when root writes there):
//! - `outbox/`, `inflight/`, `rejected/`, `outbox.lock`, `drainer.lock` — the outbox: events
//!   waiting to be sent (one file per key, and the events hooks handed in without a lock),
//!   being sent, and refused ([`queue`]).
//! - `nodes/<node>.json` — the inventory's latest record of each node ([`nodes`]).
//! - `jobs/<jobid>@<cluster>` — the start time a prolog saw ([`starts`]).
//! - `jobs/<jobid>@<cluster>%shape` — what CloudVision was last sent for a running job: its
//!   node set's fingerprint, suspended or not ([`starts::Shape`]).
//! - `verify/<jobid>@<cluster>` — an epilog's end to check against Slurm later ([`marks`]).
//! - `reps/<jobid>@<cluster>` — how a job's records go: node names or MACs ([`job_reps`]).
//! - `sent/<jobid>@<cluster>` — the ends this host delivered lately, on a pair ([`ends_sent`]).
//! - `service-status.json`, `service-status.lock` — what cvslurm did (times, counters), for
//!   `cvslurm status` and the metrics file ([`status`]).
//! - `wake.sock` — the service's wake-up socket ([`wake`]).
//!
//! Every store writes through [`durable`]: temp file, rename, and for events and node records
//! `fsync` of the file and of its directory.

pub mod counter_journal;
pub mod durable;
pub mod ends_sent;
pub mod event;
pub mod index;
pub mod job_reps;
pub mod layout;
pub mod marks;
pub mod nodes;
pub mod queue;
pub mod starts;
pub mod status;
pub mod wake;

use std::path::{Path, PathBuf};

/// The stores of one state directory. Cloning it is cheap, and clones share what this
/// process remembers (see [`queue::Queue::recently_ended`]).
#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
    owner: Option<(u32, u32)>,
    /// The outbox: pending, in-flight and rejected events.
    pub queue: queue::Queue,
    /// The inventory's node records.
    pub nodes: nodes::Nodes,
    /// The prologs' start records.
    pub starts: starts::Starts,
    /// The epilogs' ends to verify.
    pub marks: marks::Marks,
    /// `service-status.json`.
    pub status: status::ServiceStatus,
    /// How running jobs' records go (node names or MACs).
    pub job_reps: job_reps::JobReps,
    /// The ends this host delivered lately (controller pairs).
    pub ends_sent: ends_sent::EndsSent,
}

impl StateDir {
    /// The stores under `root` (nothing is created until something is written). When root
    /// opens a StateDir that belongs to someone else (SlurmUser), every file and directory it
    /// creates there is handed to that owner.
    pub fn new(root: &Path) -> StateDir {
        let owner = durable::owner_to_match(root);
        let starts = starts::Starts::new(root, owner);
        let status = status::ServiceStatus::new(root, owner);
        StateDir {
            root: root.to_path_buf(),
            owner,
            queue: queue::Queue::new(root, owner, starts.clone(), status.clone()),
            nodes: nodes::Nodes::new(root, owner),
            starts,
            marks: marks::Marks::new(root, owner),
            status,
            job_reps: job_reps::JobReps::new(root, owner),
            ends_sent: ends_sent::EndsSent::new(root, owner),
        }
    }

    /// The state directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The owner (uid, gid) new files get when running as root in another user's StateDir.
    pub fn owner(&self) -> Option<(u32, u32)> {
        self.owner
    }

    /// Creates the directories ([`layout::DIRS`], mode 0700) if missing (the stores create
    /// theirs as they need them; tests create them all at once).
    #[cfg(test)]
    pub fn ensure_dirs(&self) -> Result<(), String> {
        durable::ensure_dirs(&self.root, self.owner)
    }
}

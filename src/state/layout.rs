//! The name of every directory and file cvslurm keeps in StateDir, in one place.
//!
//! The stores in `crate::state` and the sender's wake-up socket build their paths from these;
//! the tests read the same names.

/// Pending events, one per job or node key: `outbox/<kind>.<key>.json`; and the events hooks
/// handed in, one file each, until the drainer takes them in:
/// `outbox/<kind>.<key>.<seq>.<pid>.<n>.%.json` (see `crate::state::queue`).
pub const OUTBOX: &str = "outbox";
/// Events a drainer is sending right now (same names as in [`OUTBOX`]).
pub const INFLIGHT: &str = "inflight";
/// Events CloudVision refused as malformed, with its answer (same names as in [`OUTBOX`]).
pub const REJECTED: &str = "rejected";
/// Start records: `jobs/<jobid>@<cluster>`, the start time a prolog saw.
pub const JOBS: &str = "jobs";
/// Verification marks: `verify/<jobid>@<cluster>`, an epilog's end to check against Slurm.
pub const VERIFY: &str = "verify";
/// Node records: `nodes/<node>.json`, the inventory's latest discover record of a node.
pub const NODES: &str = "nodes";
/// Representation records: `reps/<jobid>@<cluster>`, how a job's records go (node names or MACs).
pub const JOB_REPS: &str = "reps";
/// The ends this host delivered on a controller pair: `sent/<jobid>@<cluster>`, empty, its
/// modification time the delivery's (see `crate::state::ends_sent`).
pub const SENT: &str = "sent";
/// Every directory above, created (mode 0700) by `state::durable::ensure_dirs`.
pub const DIRS: [&str; 8] = [
    OUTBOX, INFLIGHT, REJECTED, JOBS, VERIFY, NODES, JOB_REPS, SENT,
];

/// `flock`ed for each read-compare-rename of a key's pending file, by the drainer's side only
/// (never by a hook).
pub const OUTBOX_LOCK: &str = "outbox.lock";
/// Held for its whole life by the one process that sends the outbox.
pub const DRAINER_LOCK: &str = "drainer.lock";
/// The last drain passes' outcome, for `cvslurm status`.
pub const SERVICE_STATUS: &str = "service-status.json";
/// `flock`ed for each read-change-write of [`SERVICE_STATUS`] (by the service or `flush`,
/// the inventory; never by a hook: counters go through [`COUNTER_JOURNAL`]).
pub const SERVICE_STATUS_LOCK: &str = "service-status.lock";
/// Counter additions appended without a lock, folded into [`SERVICE_STATUS`] by its next
/// writer (see `crate::state::counter_journal`).
pub const COUNTER_JOURNAL: &str = "counters.journal";
/// The journal's previous file, still read after a rotation.
pub const COUNTER_JOURNAL_OLD: &str = "counters.journal.old";
/// The service's wake-up socket (see `crate::state::wake`).
pub const WAKE_SOCKET: &str = "wake.sock";

/// How every temp file's name starts (a writer's file before its rename): skipped by every
/// reader, removed by `state::queue::Queue::recover` once stale.
pub const TMP_PREFIX: &str = ".tmp.";

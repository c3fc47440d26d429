//! The durable outbox in `StateDir`: what could not be sent now is kept on disk and sent later.
//!
//! Layout (all files 0600, owned by whoever wrote them: SlurmUser for the hook):
//! - `outbox/<kind>.<key>.json` — at most one pending event per job or node: a newer event for
//!   the same key replaces the older one, so a job's later state always wins and a stale
//!   RUNNING can never be delivered after the job's end.
//! - `inflight/<same name>` — an event a drainer is sending right now; moved back on failure,
//!   on start-up after a crash, or deleted once CloudVision took it.
//! - `rejected/<same name>` — events CloudVision refused as malformed (4xx), with its answer.
//! - `jobs/<jobid>@<cluster>` — the start time the prolog saw (Slurm before 23.02 gives the
//!   epilog no start time).
//! - `outbox.lock` — `flock`ed for the few microseconds of each read-compare-rename (the
//!   temp file is written and `fsync`ed before the lock is taken, the directory after it is
//!   released: no disk wait happens under the lock).
//! - `drainer.lock` — held (`flock`) for its whole life by the one process that sends the
//!   outbox (the service, or a `cvslurm flush`): `inflight/` belongs to it until it dies.
//! - `wake.sock` — the service's wake-up socket (see `crate::service::sender`).
//!
//! Every event write is: temp file, `fsync`, `rename`, `fsync` of the directory.

use crate::payload::{JobConfig, NodeConfig};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A temp file older than this is from a writer that died (hooks live for seconds).
const STALE_TMP: Duration = Duration::from_secs(60);

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
        /// The node name.
        name: String,
    },
}

impl Item {
    /// The outbox file name of this item's key (`job.<id>.json`, `node.<name>.json`).
    pub fn file_name(&self) -> String {
        let (kind, key) = match self {
            Item::Job { job } => ("job", job.key.id.as_str()),
            Item::Node { node } => ("node", node.key.id.as_str()),
            Item::NodeDelete { name } => ("node", name.as_str()),
        };
        format!("{kind}.{}.json", safe_name(key))
    }

    /// A short description for log lines: `job 12345@c COMPLETED`, `node n1`, `delete node n1`.
    pub fn describe(&self) -> String {
        match self {
            Item::Job { job } => format!("job {} {}", job.key.id, job.state),
            Item::Node { node } => format!("node {}", node.key.id),
            Item::NodeDelete { name } => format!("delete node {name}"),
        }
    }
}

/// One queued event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Queue order: nanoseconds since the epoch when it was made.
    pub seq: u128,
    /// Supersession order within one key: `(restart count, phase)`, phase 0 running, 1 ended.
    /// An event never replaces a pending one of higher rank.
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
            seq: now.as_nanos(),
            rank,
            queued_at: now.as_secs() as i64,
            attempts: 0,
            resolve: None,
            then: None,
            item,
        }
    }
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

/// How reading one outbox file went.
#[derive(Debug)]
pub enum ReadOutcome {
    /// A valid event.
    Event(Box<Event>),
    /// The file could not be read now (moved by a drainer, out of file descriptors, I/O
    /// error, not a regular file): try again later; never a reason to reject it.
    Transient(String),
    /// The whole file was read and is not an event: corrupt.
    Corrupt(String),
}

/// Reads one outbox file, telling a transient failure from a corrupt file.
pub fn read_event_checked(path: &Path) -> ReadOutcome {
    use std::io::Read;
    let mut f = match OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) => return ReadOutcome::Transient(e.to_string()),
    };
    match f.metadata() {
        Ok(m) if m.is_file() => {}
        Ok(_) => return ReadOutcome::Transient("not a regular file".into()),
        Err(e) => return ReadOutcome::Transient(e.to_string()),
    }
    let mut bytes = Vec::new();
    if let Err(e) = f.read_to_end(&mut bytes) {
        return ReadOutcome::Transient(e.to_string());
    }
    match serde_json::from_slice(&bytes) {
        Ok(ev) => ReadOutcome::Event(Box::new(ev)),
        Err(e) => ReadOutcome::Corrupt(e.to_string()),
    }
}

/// What `enqueue` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// Written; `busy` when a drainer is sending an older event of the same key right now
    /// (then the caller must not send directly: the drainer sends this one next, in order).
    Queued {
        /// A drainer holds this key in flight.
        busy: bool,
    },
    /// Queued to go right after the job's RUNNING, which is still waiting to be sent (the
    /// caller must not send directly: the drainer sends both, in order).
    Chained,
    /// A pending event of higher rank is already queued; this one was dropped.
    Superseded,
}

/// The outbox in one state directory.
#[derive(Debug, Clone)]
pub struct Outbox {
    root: PathBuf,
    /// When running as root in a StateDir owned by someone else (SlurmUser): the owner every
    /// new file and directory gets, so the hooks (running as SlurmUser) can use them.
    owner: Option<(u32, u32)>,
    /// An in-flight file older than this is from a drainer that died: ignore it.
    pub inflight_stale: Duration,
    /// The job keys whose end this process delivered, and when (shared by its clones): the
    /// service's reconciliation never sends a RUNNING for a job whose end is already out.
    delivered_ends: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, Instant>>>,
}

/// A node record file's inode, modification time and size ([`Outbox::node_record_stamps`]).
pub type RecordStamp = (u64, SystemTime, u64);

/// How long [`Outbox::recently_ended`] remembers a delivered end: far longer than a job
/// stays listed as running after it ended.
pub const REMEMBER_ENDS: Duration = Duration::from_secs(600);

impl Outbox {
    /// The outbox under `state_dir` (nothing is created until something is written).
    pub fn new(state_dir: &Path) -> Outbox {
        Outbox {
            root: state_dir.to_path_buf(),
            owner: owner_to_match(state_dir),
            inflight_stale: Duration::from_secs(60),
            delivered_ends: Default::default(),
        }
    }

    /// The job keys whose end this process (and its clones) delivered in the last
    /// [`REMEMBER_ENDS`].
    pub fn recently_ended(&self) -> std::collections::HashSet<String> {
        let mut ends = self
            .delivered_ends
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        ends.retain(|_, at| at.elapsed() < REMEMBER_ENDS);
        ends.keys().cloned().collect()
    }

    /// The state directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The owner (uid, gid) new files get when running as root in another user's StateDir.
    pub fn owner(&self) -> Option<(u32, u32)> {
        self.owner
    }

    /// True when an event for `item`'s key is pending (not in flight).
    pub fn is_pending(&self, item: &Item) -> bool {
        self.dir("outbox").join(item.file_name()).exists()
    }

    /// The pending event of `item`'s key, if any.
    pub fn pending_of(&self, item: &Item) -> Option<Event> {
        read_event(&self.dir("outbox").join(item.file_name()))
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Creates the directories (mode 0700) if missing.
    pub fn ensure_dirs(&self) -> Result<(), String> {
        for d in ["outbox", "inflight", "rejected", "jobs", "verify", "nodes"] {
            let p = self.dir(d);
            if !p.is_dir() {
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&p)
                    .map_err(|e| format!("cannot create {}: {e}", p.display()))?;
            }
            if let Some((uid, gid)) = self.owner {
                // Also repairs directories an earlier root run left owned by root.
                std::os::unix::fs::chown(&p, Some(uid), Some(gid))
                    .map_err(|e| format!("cannot chown {}: {e}", p.display()))?;
            }
        }
        Ok(())
    }

    fn lock(&self) -> Result<Flock<File>, String> {
        self.lock_file("outbox.lock", None)
    }

    /// Locks `name` in StateDir; with a deadline, gives up when it passes.
    fn lock_file(&self, name: &str, deadline: Option<Instant>) -> Result<Flock<File>, String> {
        let p = self.root.join(name);
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&p)
            .map_err(|e| format!("cannot open {}: {e}", p.display()))?;
        if let Some((uid, gid)) = self.owner {
            let _ = std::os::unix::fs::fchown(&f, Some(uid), Some(gid));
        }
        let Some(deadline) = deadline else {
            return Flock::lock(f, FlockArg::LockExclusive)
                .map_err(|(_, e)| format!("cannot lock {}: {e}", p.display()));
        };
        let mut f = f;
        loop {
            match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                Ok(l) => return Ok(l),
                Err((back, nix::errno::Errno::EWOULDBLOCK)) => {
                    if Instant::now() >= deadline {
                        return Err(format!("{} stayed locked past the deadline", p.display()));
                    }
                    f = back;
                    std::thread::sleep(Duration::from_micros(500));
                }
                Err((_, e)) => return Err(format!("cannot lock {}: {e}", p.display())),
            }
        }
    }

    /// Becomes the outbox's one drainer: `Ok(None)` when another live process (the service,
    /// another `flush`) is the drainer and `wait` is false. Held until the returned lock is
    /// dropped or the process dies; only its holder may [`recover`](Self::recover).
    pub fn drainer_lock(&self, wait: bool) -> Result<Option<Flock<File>>, String> {
        self.ensure_dirs()?;
        let deadline = (!wait).then(Instant::now);
        match self.lock_file("drainer.lock", deadline) {
            Ok(l) => Ok(Some(l)),
            Err(e) if !wait && e.ends_with("past the deadline") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes `ev` durably unless a pending event of higher rank for the same key exists.
    pub fn enqueue(&self, ev: &Event) -> Result<Enqueued, String> {
        self.enqueue_by(ev, None, true)
    }

    /// [`enqueue`](Self::enqueue), giving up (with an error, nothing written) when the outbox
    /// lock cannot be had before `deadline`. With `sync`, the data is on disk (`fsync`) before
    /// the lock is taken and the directory is synced after it is released: the lock is held
    /// for a read, a compare and a rename, never across a disk wait. Without `sync` (a hook
    /// that hands the event to the running service, which syncs the whole outbox before it
    /// sends: [`sync_files`](Self::sync_files)) the event is in the page cache: it survives the
    /// kill of any process, not yet a power loss.
    pub fn enqueue_by(
        &self,
        ev: &Event,
        deadline: Option<Instant>,
        sync: bool,
    ) -> Result<Enqueued, String> {
        self.ensure_dirs()?;
        let name = ev.item.file_name();
        let path = self.dir("outbox").join(&name);
        let bytes = serde_json::to_vec(ev).map_err(|e| e.to_string())?;
        let tmp = write_tmp(&path, &bytes, self.owner, sync)?;
        let res = (|| {
            let _lock = self.lock_file("outbox.lock", deadline)?;
            if let Some(old) = read_event(&path) {
                let newest = old.then.as_ref().map_or(old.rank, |t| t.rank);
                if newest > ev.rank {
                    return Ok(Enqueued::Superseded);
                }
                if chains_after(&old, ev) {
                    let mut both = old;
                    both.then = Some(Box::new(ev.clone()));
                    let bytes = serde_json::to_vec(&both).map_err(|e| e.to_string())?;
                    let chained = write_tmp(&path, &bytes, self.owner, sync)?;
                    fs::rename(&chained, &path)
                        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                    return Ok(Enqueued::Chained);
                }
            }
            let inflight = self.dir("inflight").join(&name);
            let busy = match fs::metadata(&inflight).and_then(|m| m.modified()) {
                Ok(t) => t
                    .elapsed()
                    .map(|age| age < self.inflight_stale)
                    .unwrap_or(true),
                Err(_) => false,
            };
            fs::rename(&tmp, &path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Ok(Enqueued::Queued { busy })
        })();
        if !matches!(res, Ok(Enqueued::Queued { .. })) {
            let _ = fs::remove_file(&tmp);
        }
        if sync && matches!(res, Ok(Enqueued::Queued { .. } | Enqueued::Chained)) {
            sync_dir(&self.dir("outbox"));
        }
        res
    }

    /// Makes pending files that hooks wrote without syncing durable (`fdatasync` each, then
    /// the directory). A file already sent and gone is skipped.
    pub fn sync_files(&self, names: &[String]) {
        if names.is_empty() {
            return;
        }
        for name in names {
            let p = self.dir("outbox").join(name);
            if let Ok(f) = OpenOptions::new()
                .read(true)
                .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
                .open(&p)
            {
                let _ = f.sync_data();
            }
        }
        sync_dir(&self.dir("outbox"));
    }

    /// Replaces the pending event `old` by `new` (same key) if `old` is still the pending one;
    /// durably with `sync` (else the caller syncs it: [`sync_files`](Self::sync_files)).
    /// `Ok(false)` when it was replaced or taken meanwhile.
    pub fn replace_if_same(&self, old: &Event, new: &Event, sync: bool) -> Result<bool, String> {
        let path = self.dir("outbox").join(old.item.file_name());
        let bytes = serde_json::to_vec(new).map_err(|e| e.to_string())?;
        let tmp = write_tmp(&path, &bytes, self.owner, sync)?;
        let done = (|| {
            let _lock = self.lock()?;
            match read_event(&path) {
                Some(cur) if cur.seq == old.seq => {
                    fs::rename(&tmp, &path)
                        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                    Ok(true)
                }
                _ => Ok(false),
            }
        })();
        if done != Ok(true) {
            let _ = fs::remove_file(&tmp);
        } else if sync {
            sync_dir(&self.dir("outbox"));
        }
        done
    }

    /// Removes the pending event of `ev`'s key if it is still `ev` (not replaced meanwhile).
    pub fn remove_if_same(&self, ev: &Event) -> Result<bool, String> {
        let _lock = self.lock()?;
        let path = self.dir("outbox").join(ev.item.file_name());
        match read_event(&path) {
            Some(cur) if cur.seq == ev.seq => {
                fs::remove_file(&path)
                    .map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Every pending event, oldest first. A file that was read whole and is not an event is
    /// moved to `rejected/` and logged; one that cannot be read now (a drainer moved it, no
    /// file descriptor left, an I/O error) is skipped and read again next time.
    pub fn pending(&self) -> Vec<Event> {
        let mut evs: Vec<Event> = list_dir(&self.dir("outbox"))
            .into_iter()
            .filter_map(|p| match read_event_checked(&p) {
                ReadOutcome::Event(e) => Some(*e),
                ReadOutcome::Transient(why) => {
                    log::debug!(
                        "outbox file {} not readable now ({why}); later",
                        p.display()
                    );
                    None
                }
                ReadOutcome::Corrupt(why) => {
                    log::error!(
                        "outbox file {} is not an event ({why}); moved to rejected/",
                        p.display()
                    );
                    let _ = fs::rename(
                        &p,
                        self.dir("rejected").join(p.file_name().unwrap_or_default()),
                    );
                    None
                }
            })
            .collect();
        evs.sort_by_key(|e| e.seq);
        evs
    }

    /// Number of pending events and the age in seconds of the oldest.
    pub fn depth(&self) -> (usize, Option<i64>) {
        let evs = self.pending();
        let oldest = evs.iter().map(|e| e.queued_at).min();
        (evs.len(), oldest.map(|t| crate::timefmt::now_epoch() - t))
    }

    /// Number of events in `rejected/`.
    pub fn rejected_count(&self) -> usize {
        list_dir(&self.dir("rejected")).len()
    }

    /// Queues a running job's RUNNING again (its nodes' interfaces changed), only while that
    /// cannot reach CloudVision after the job's end. Checked under the outbox lock, which
    /// every writer and the sender's moves take: the job's start record is still there (an
    /// epilog queues the end before it drops the record), and nothing of the key is pending
    /// (a pending RUNNING is enriched when sent anyway; a pending end must stay last), in
    /// flight, or delivered as an end by this process. True when queued.
    pub fn enqueue_resend(&self, ev: &Event) -> Result<bool, String> {
        let Item::Job { job } = &ev.item else {
            return Err("only a job's RUNNING is resent".into());
        };
        if job.state != crate::payload::JobState::Running {
            return Err("only a job's RUNNING is resent".into());
        }
        self.ensure_dirs()?;
        let name = ev.item.file_name();
        let path = self.dir("outbox").join(&name);
        let bytes = serde_json::to_vec(ev).map_err(|e| e.to_string())?;
        let tmp = write_tmp(&path, &bytes, self.owner, true)?;
        let res = (|| {
            let _lock = self.lock()?;
            let ended = self
                .delivered_ends
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(&job.key.id);
            let busy = path.exists() || self.dir("inflight").join(&name).exists();
            let started = self.dir("jobs").join(safe_name(&job.key.id)).exists();
            if ended || busy || !started {
                return Ok(false);
            }
            fs::rename(&tmp, &path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Ok(true)
        })();
        if !matches!(res, Ok(true)) {
            let _ = fs::remove_file(&tmp);
        } else {
            sync_dir(&self.dir("outbox"));
        }
        res
    }

    /// Takes a pending event for sending: moves it to `inflight/` if it is still the pending
    /// one. `None` when it was replaced or taken meanwhile.
    pub fn take(&self, ev: &Event) -> Result<Option<Event>, String> {
        let _lock = self.lock()?;
        let name = ev.item.file_name();
        let from = self.dir("outbox").join(&name);
        match read_event(&from) {
            Some(cur) if cur.seq == ev.seq => {
                let to = self.dir("inflight").join(&name);
                fs::rename(&from, &to)
                    .map_err(|e| format!("cannot move {}: {e}", from.display()))?;
                if let Ok(f) = File::open(&to) {
                    let _ = f.set_modified(SystemTime::now());
                }
                // No directory fsync: if a crash loses this move, the event is simply still
                // pending; recover() undoes a move that survived.
                Ok(Some(cur))
            }
            _ => Ok(None),
        }
    }

    /// Ends an in-flight event: `Delivered` deletes it, `Retry` puts it back (unless a newer
    /// event for the key arrived meanwhile), `Reject` moves it to `rejected/` with the answer.
    pub fn finish(&self, ev: &Event, outcome: Finish) -> Result<(), String> {
        let name = ev.item.file_name();
        let inflight = self.dir("inflight").join(&name);
        if !matches!(outcome, Finish::Retry) {
            if let Some(next) = &ev.then {
                // The follower becomes the pending event (durably, before the in-flight file
                // goes), unless a newer event of the key arrived meanwhile. Its data is
                // synced before the lock and its directory after it: hooks never wait for
                // an fsync here (a crash in between finds the in-flight file and recovers).
                let pending = self.dir("outbox").join(&name);
                let bytes = serde_json::to_vec(next).map_err(|e| e.to_string())?;
                let tmp = write_synced_tmp(&pending, &bytes, self.owner)?;
                let placed = (|| {
                    let _lock = self.lock()?;
                    if read_event(&pending).is_some_and(|cur| cur.rank >= next.rank) {
                        return Ok(false);
                    }
                    fs::rename(&tmp, &pending)
                        .map(|_| true)
                        .map_err(|e| format!("cannot write {}: {e}", pending.display()))
                })();
                match placed {
                    Ok(true) => sync_dir(&self.dir("outbox")),
                    Ok(false) => {
                        let _ = fs::remove_file(&tmp);
                    }
                    Err(e) => {
                        let _ = fs::remove_file(&tmp);
                        return Err(e);
                    }
                }
            }
        }
        let _lock = self.lock()?;
        match outcome {
            Finish::Delivered => {
                if let Item::Job { job } = &ev.item {
                    if job.state.is_terminal() {
                        self.delivered_ends
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(job.key.id.clone(), Instant::now());
                    }
                }
                // No fsync: if a crash loses this unlink, recover() puts the event back and it
                // is sent again, which is harmless (a POST replaces the record of its key).
                let _ = fs::remove_file(&inflight);
                return Ok(());
            }
            Finish::Retry => {
                let pending = self.dir("outbox").join(&name);
                if pending.exists() {
                    let _ = fs::remove_file(&inflight);
                } else {
                    let mut back = ev.clone();
                    back.attempts += 1;
                    write_durably(
                        &pending,
                        &serde_json::to_vec(&back).map_err(|e| e.to_string())?,
                        self.owner,
                    )?;
                    let _ = fs::remove_file(&inflight);
                }
            }
            Finish::Reject(answer) => {
                let to = self.dir("rejected").join(&name);
                let mut head = ev.clone();
                head.then = None;
                let mut v = serde_json::to_value(&head).map_err(|e| e.to_string())?;
                v["rejected_because"] = serde_json::Value::String(answer);
                write_durably(
                    &to,
                    &serde_json::to_vec_pretty(&v).map_err(|e| e.to_string())?,
                    self.owner,
                )?;
                let _ = fs::remove_file(&inflight);
            }
        }
        sync_dir(&self.dir("inflight"));
        Ok(())
    }

    /// After a crash: puts every in-flight event back in the outbox (unless superseded), and
    /// removes temp files that writers killed mid-write left behind.
    pub fn recover(&self) -> Result<usize, String> {
        self.ensure_dirs()?;
        let _lock = self.lock()?;
        for d in ["outbox", "inflight", "rejected", "jobs", "verify", "nodes"] {
            for e in fs::read_dir(self.dir(d)).into_iter().flatten().flatten() {
                let stale = e.file_name().to_string_lossy().starts_with(".tmp.")
                    && e.metadata()
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age > STALE_TMP);
                if stale {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        let mut n = 0;
        for p in list_dir(&self.dir("inflight")) {
            let name = p.file_name().unwrap_or_default().to_owned();
            let pending = self.dir("outbox").join(&name);
            if pending.exists() || read_event(&p).is_none() {
                let _ = fs::remove_file(&p);
            } else {
                fs::rename(&p, &pending)
                    .map_err(|e| format!("cannot move {}: {e}", p.display()))?;
                n += 1;
            }
        }
        sync_dir(&self.dir("outbox"));
        Ok(n)
    }

    /// Keeps the inventory's latest discover record of a node (its GPU topology included), for
    /// `send` and the service to attribute jobs to interfaces (`JobInterfaces`).
    pub fn save_node_record(&self, rec: &crate::node_record::DiscoverRecord) -> Result<(), String> {
        self.ensure_dirs()?;
        let json = serde_json::to_vec(rec).map_err(|e| format!("cannot encode record: {e}"))?;
        write_durably(
            &self
                .dir("nodes")
                .join(format!("{}.json", safe_name(&rec.node_name))),
            &json,
            self.owner,
        )
    }

    /// The inventory's record of `node`: `Ok(None)` when there is none. The file is hostile
    /// input: a link is not followed, the size is capped, the record is validated and must
    /// name `node`.
    pub fn load_node_record(
        &self,
        node: &str,
    ) -> Result<Option<crate::node_record::DiscoverRecord>, String> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let p = self.dir("nodes").join(format!("{}.json", safe_name(node)));
        let f = match OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&p)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read {}: {e}", p.display())),
        };
        let max = crate::node_record::MAX_RECORD_BYTES;
        let mut s = String::new();
        f.take(max as u64 + 1)
            .read_to_string(&mut s)
            .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
        if s.len() > max {
            return Err(format!("{}: larger than {max} bytes", p.display()));
        }
        let rec = crate::node_record::DiscoverRecord::parse_line(&s)
            .map_err(|e| format!("{}: {e}", p.display()))?;
        if rec.node_name != node {
            return Err(format!(
                "{}: a record of node {:?}",
                p.display(),
                rec.node_name
            ));
        }
        Ok(Some(rec))
    }

    /// The nodes with a record in StateDir, each with its file's inode, modification time and
    /// size: a cheap way to notice a record that changed (see [`crate::service::resend`]). Records are
    /// replaced by a rename, so a rewrite always shows a new inode, even within one clock tick.
    pub fn node_record_stamps(&self) -> BTreeMap<String, RecordStamp> {
        list_dir(&self.dir("nodes"))
            .into_iter()
            .filter_map(|p| {
                let m = fs::symlink_metadata(&p).ok()?;
                if !m.file_type().is_file() {
                    return None;
                }
                let stem = p.file_name()?.to_str()?.strip_suffix(".json")?;
                Some((unsafe_name(stem), (m.ino(), m.modified().ok()?, m.len())))
            })
            .collect()
    }

    /// Forgets a node's record (it left the cluster).
    pub fn forget_node_record(&self, node: &str) {
        let _ = fs::remove_file(self.dir("nodes").join(format!("{}.json", safe_name(node))));
    }

    /// Records the start time the prolog saw for a job. Not fsynced (it survives the kill
    /// of any process, not a power loss): it only supplies a start time on Slurm before 23.02
    /// (where the service asks slurmctld anyway) and a hint for reconciliation, which lists
    /// running jobs from Slurm itself.
    pub fn save_start(&self, key: &str, start: i64) -> Result<(), String> {
        self.ensure_dirs()?;
        let path = self.dir("jobs").join(safe_name(key));
        let tmp = self
            .dir("jobs")
            .join(format!(".tmp.{}", std::process::id()));
        let res = (|| -> std::io::Result<()> {
            let mut f = OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .mode(0o600)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(&tmp)?;
            if let Some((uid, gid)) = self.owner {
                std::os::unix::fs::fchown(&f, Some(uid), Some(gid))?;
            }
            f.write_all(start.to_string().as_bytes())?;
            fs::rename(&tmp, &path)
        })();
        res.map_err(|e| {
            let _ = fs::remove_file(&tmp);
            format!("cannot write {}: {e}", path.display())
        })
    }

    /// The start time the prolog recorded for a job.
    pub fn load_start(&self, key: &str) -> Option<i64> {
        fs::read_to_string(self.dir("jobs").join(safe_name(key)))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }

    /// Forgets a job's start record.
    pub fn forget_start(&self, key: &str) {
        let _ = fs::remove_file(self.dir("jobs").join(safe_name(key)));
    }

    /// Marks an epilog's COMPLETED for verification: on Slurm 22.05 a job cancelled in its
    /// first second reaches the epilog looking exactly like a success, and Slurm records the
    /// truth only after the epilog. Reconciliation checks Slurm's final state later and
    /// corrects CloudVision. Not fsynced: losing a mark only loses a check.
    pub fn mark_for_verification(&self, job: &JobConfig, restart_count: u32) -> Result<(), String> {
        self.ensure_dirs()?;
        let dir = self.dir("verify");
        let rec = serde_json::json!({"job": job, "restart_count": restart_count});
        let path = dir.join(safe_name(&job.key.id));
        write_private(&path, rec.to_string().as_bytes())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    /// Jobs marked for verification: `(job sent, restart count, age of the mark)`.
    pub fn to_verify(&self) -> Vec<(JobConfig, u32, Duration)> {
        self.records("verify")
            .into_iter()
            .filter_map(|(_, bytes, age)| {
                let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
                let job: JobConfig = serde_json::from_value(v["job"].clone()).ok()?;
                let restarts = v["restart_count"].as_u64().unwrap_or(0) as u32;
                Some((job, restarts, age))
            })
            .collect()
    }

    /// Removes a verification mark.
    pub fn verified(&self, key: &str) {
        let _ = fs::remove_file(self.dir("verify").join(safe_name(key)));
    }

    /// The jobs whose start a prolog recorded and whose end no epilog has handled yet:
    /// `(key, start, age of the record)`.
    pub fn started_jobs(&self) -> Vec<(String, i64, Duration)> {
        self.records("jobs")
            .into_iter()
            .filter_map(|(name, bytes, age)| {
                let start = String::from_utf8_lossy(&bytes).trim().parse().ok()?;
                Some((unsafe_name(&name), start, age))
            })
            .collect()
    }

    /// The records in one of the state directories (`jobs`, `verify`): file name, contents and
    /// age, without the temp files of writers still at work (or killed).
    fn records(&self, dir: &str) -> Vec<(String, Vec<u8>, Duration)> {
        let Ok(rd) = fs::read_dir(self.dir(dir)) else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(".tmp.") {
                    return None;
                }
                let bytes = fs::read(e.path()).ok()?;
                let age = e
                    .metadata()
                    .ok()?
                    .modified()
                    .ok()?
                    .elapsed()
                    .unwrap_or_default();
                Some((name, bytes, age))
            })
            .collect()
    }

    /// The keys (`12345@cluster`) of jobs with an event pending or in flight.
    pub fn pending_job_keys(&self) -> std::collections::HashSet<String> {
        ["outbox", "inflight"]
            .iter()
            .flat_map(|d| list_dir(&self.dir(d)))
            .filter_map(|p| {
                let n = p.file_name()?.to_string_lossy().into_owned();
                let key = n.strip_prefix("job.")?.strip_suffix(".json")?;
                Some(unsafe_name(key))
            })
            .collect()
    }

    /// Records the outcome of a drain pass in `service-status.json` for `cvslurm status`:
    /// the last delivery and the last error, with their times.
    pub fn record_drain(&self, delivered: usize, last_error: Option<&str>) {
        let path = self.root.join("service-status.json");
        let mut v: serde_json::Value = fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_else(|| serde_json::json!({}));
        let now = crate::timefmt::now_epoch();
        if delivered > 0 {
            v["last_delivery"] = now.into();
        }
        if let Some(e) = last_error {
            v["last_error"] = e.into();
            v["last_error_at"] = now.into();
        }
        v["last_drain"] = now.into();
        if let Ok(bytes) = serde_json::to_vec(&v) {
            // Not fsynced: it is a report, not an event.
            let _ = write_private(&path, &bytes);
        }
    }

    /// What the last drain passes recorded (`record_drain`), if anything.
    pub fn service_status(&self) -> Option<serde_json::Value> {
        fs::read(self.root.join("service-status.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
    }

    /// Keeps the outbox within `max` events: past it, the oldest node events go first (the
    /// service discovers nodes again), then the oldest RUNNING events (reconciliation sends
    /// RUNNING again for jobs still running), then the oldest events of ended jobs. Each drop
    /// is logged. Returns how many were dropped.
    pub fn enforce_limit(&self, max: usize) -> usize {
        let pending = self.pending();
        if pending.len() <= max {
            return 0;
        }
        let excess = pending.len() - max;
        let class = |e: &Event| match &e.item {
            Item::Node { .. } | Item::NodeDelete { .. } => 0,
            Item::Job { job } if !job.state.is_terminal() => 1,
            Item::Job { .. } => 2,
        };
        let mut order: Vec<&Event> = pending.iter().collect();
        order.sort_by_key(|e| (class(e), e.seq));
        let mut dropped = 0;
        for ev in order.into_iter().take(excess) {
            if self.remove_if_same(ev).unwrap_or(false) {
                log::warn!(
                    "outbox: over OutboxMaxEvents ({max}): dropped {} queued {} s ago",
                    ev.item.describe(),
                    crate::timefmt::now_epoch() - ev.queued_at
                );
                dropped += 1;
            }
        }
        dropped
    }
}

/// How an in-flight event ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// CloudVision took it.
    Delivered,
    /// Try again later.
    Retry,
    /// CloudVision will never take it; keep it in `rejected/` with this answer.
    Reject(String),
}

/// An end that arrives while its run's RUNNING is still pending goes after it, not over it.
fn chains_after(old: &Event, ev: &Event) -> bool {
    matches!(old.item, Item::Job { .. })
        && old.rank.1 == 0
        && ev.rank.0 == old.rank.0
        && ev.rank.1 > 0
}

fn read_event(path: &Path) -> Option<Event> {
    let bytes = fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn list_dir(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    p.extension().is_some_and(|x| x == "json")
                        && !p
                            .file_name()
                            .unwrap_or_default()
                            .to_string_lossy()
                            .starts_with('.')
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Writes a file atomically and durably: temp file, fsync, rename, fsync of the directory.
/// `owner` (uid, gid), when given, is set on the file before it takes its name.
pub fn write_durably(path: &Path, data: &[u8], owner: Option<(u32, u32)>) -> Result<(), String> {
    let tmp = write_synced_tmp(path, data, owner)?;
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(format!("cannot write {}: {e}", path.display()));
    }
    sync_dir(path.parent().unwrap_or(Path::new(".")));
    Ok(())
}

/// Writes `data` to a fresh temp file beside `path` and `fdatasync`s it; returns its path.
fn write_synced_tmp(
    path: &Path,
    data: &[u8],
    owner: Option<(u32, u32)>,
) -> Result<PathBuf, String> {
    write_tmp(path, data, owner, true)
}

/// Writes `data` to a fresh temp file beside `path` (`fdatasync`ed with `sync`).
fn write_tmp(
    path: &Path,
    data: &[u8],
    owner: Option<(u32, u32)>,
    sync: bool,
) -> Result<PathBuf, String> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".tmp.{}.{}.{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        path.file_name().unwrap_or_default().to_string_lossy()
    ));
    let res = (|| -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&tmp)?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&f, Some(uid), Some(gid))?;
        }
        f.write_all(data)?;
        if sync {
            f.sync_data()?;
        }
        Ok(())
    })();
    match res {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(format!("cannot write {}: {e}", path.display()))
        }
    }
}

/// Writes a file (mode 0600, whatever the umask) through a fresh temp file and a rename, not
/// fsynced: for records whose loss costs nothing but a check.
fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".tmp.{}.private", std::process::id()));
    let _ = fs::remove_file(&tmp);
    let res = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(data))
        .and_then(|()| fs::rename(&tmp, path));
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}

/// The owner new files must get: StateDir's, when we are root and it belongs to someone else.
fn owner_to_match(state_dir: &Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    let m = fs::metadata(state_dir).ok()?;
    (m.uid() != 0).then(|| (m.uid(), m.gid()))
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Makes a key safe as a file name: `/`, `%` and a leading `.` are percent-encoded.
fn safe_name(key: &str) -> String {
    let mut s = String::with_capacity(key.len());
    for (i, c) in key.chars().enumerate() {
        match c {
            '/' | '%' | '\0' => s.push_str(&format!("%{:02X}", c as u32)),
            '.' if i == 0 => s.push_str("%2E"),
            _ => s.push(c),
        }
    }
    s
}

/// Undoes [`safe_name`].
fn unsafe_name(name: &str) -> String {
    let mut out = Vec::with_capacity(name.len());
    let b = name.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(hex, 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::{JobState, Key};

    fn job(id: &str, state: JobState) -> Item {
        Item::Job {
            job: JobConfig {
                key: Key { id: id.into() },
                name: None,
                state,
                start_time: None,
                end_time: None,
                location: None,
                job_type: None,
                nodes: Some(vec!["n1".to_string()].into()),
                interfaces: None,
            },
        }
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cvslurm-outbox-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    /// A resend is queued only for a job still recorded as started, with nothing of it
    /// pending or in flight, and whose end this process has not delivered.
    #[test]
    fn a_resend_never_follows_the_jobs_end() {
        let d = tmpdir("resend");
        let ob = Outbox::new(&d);
        let run = || Event::new(job("7@c", JobState::Running), (0, 0));
        // Not reported by a hook (no start record): not resent.
        assert_eq!(ob.enqueue_resend(&run()), Ok(false));
        ob.save_start("7@c", 100).unwrap();
        assert_eq!(ob.enqueue_resend(&run()), Ok(true));
        // Its RUNNING pending: not a second one.
        assert_eq!(ob.enqueue_resend(&run()), Ok(false));
        let first = ob.pending().remove(0);
        // In flight: not resent either.
        let taken = ob.take(&first).unwrap().unwrap();
        assert_eq!(ob.enqueue_resend(&run()), Ok(false));
        ob.finish(&taken, Finish::Delivered).unwrap();
        assert_eq!(ob.enqueue_resend(&run()), Ok(true));
        let again = ob.pending().remove(0);
        let taken = ob.take(&again).unwrap().unwrap();
        ob.finish(&taken, Finish::Delivered).unwrap();
        // The end queued: never a RUNNING after it, pending or delivered, even with the
        // start record still there (an epilog drops it after queueing the end).
        let end = Event::new(job("7@c", JobState::Completed), (0, 1));
        ob.enqueue(&end).unwrap();
        assert_eq!(ob.enqueue_resend(&run()), Ok(false));
        let end = ob.pending().remove(0);
        let taken = ob.take(&end).unwrap().unwrap();
        ob.finish(&taken, Finish::Delivered).unwrap();
        assert!(ob.started_jobs().iter().any(|(k, _, _)| k == "7@c"));
        assert_eq!(ob.enqueue_resend(&run()), Ok(false));
        assert!(ob.pending().is_empty());
        // Only RUNNING is resent.
        assert!(ob.enqueue_resend(&end).is_err());
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn later_state_wins_and_stale_running_is_dropped() {
        let d = tmpdir("wins");
        let ob = Outbox::new(&d);
        let run = Event::new(job("1@c", JobState::Running), (0, 0));
        let done = Event::new(job("1@c", JobState::Completed), (0, 1));
        assert_eq!(ob.enqueue(&done).unwrap(), Enqueued::Queued { busy: false });
        // A RUNNING that arrives late (stuck hook) never replaces the end.
        assert_eq!(ob.enqueue(&run).unwrap(), Enqueued::Superseded);
        let p = ob.pending();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0], done);
        // A requeued job's new run (restart count 1) replaces the earlier end.
        let rerun = Event::new(job("1@c", JobState::Running), (1, 0));
        assert_eq!(
            ob.enqueue(&rerun).unwrap(),
            Enqueued::Queued { busy: false }
        );
        assert_eq!(ob.pending()[0].rank, (1, 0));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn take_finish_recover() {
        let d = tmpdir("flow");
        let ob = Outbox::new(&d);
        let a = Event::new(job("1@c", JobState::Running), (0, 0));
        ob.enqueue(&a).unwrap();
        let taken = ob.take(&a).unwrap().unwrap();
        // While in flight, a new event for the key is queued and marked busy.
        let b = Event::new(job("1@c", JobState::Failed), (0, 1));
        assert_eq!(ob.enqueue(&b).unwrap(), Enqueued::Queued { busy: true });
        ob.finish(&taken, Finish::Retry).unwrap();
        // The retry does not overwrite the newer pending event.
        assert_eq!(ob.pending(), vec![b.clone()]);
        let t = ob.take(&b).unwrap().unwrap();
        // Crash while in flight: recover puts it back.
        assert_eq!(ob.recover().unwrap(), 1);
        assert_eq!(ob.pending(), vec![t.clone()]);
        let t = ob.take(&t).unwrap().unwrap();
        ob.finish(&t, Finish::Reject("HTTP 400: bad".into()))
            .unwrap();
        assert!(ob.pending().is_empty());
        assert_eq!(ob.rejected_count(), 1);
        assert!(ob.remove_if_same(&a).is_ok());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn only_complete_unparsable_files_are_rejected() {
        let d = tmpdir("transient");
        let ob = Outbox::new(&d);
        let good = Event::new(job("1@c", JobState::Running), (0, 0));
        ob.enqueue(&good).unwrap();
        // Not readable as a file now (here: a directory where a file was): kept, not rejected.
        fs::create_dir(d.join("outbox/job.2@c.json")).unwrap();
        // A file a drainer moved away between the listing and the read.
        assert!(matches!(
            read_event_checked(&d.join("outbox/job.3@c.json")),
            ReadOutcome::Transient(_)
        ));
        assert_eq!(ob.pending(), vec![good.clone()]);
        assert!(d.join("outbox/job.2@c.json").is_dir());
        assert_eq!(ob.rejected_count(), 0);
        // A whole file that is not an event is rejected.
        fs::write(d.join("outbox/job.4@c.json"), b"{\"seq\": 1, garbage").unwrap();
        assert_eq!(ob.pending(), vec![good]);
        assert_eq!(ob.rejected_count(), 1);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn one_drainer_at_a_time() {
        let d = tmpdir("drainer");
        let ob = Outbox::new(&d);
        let first = ob.drainer_lock(false).unwrap();
        assert!(first.is_some());
        assert!(ob.drainer_lock(false).unwrap().is_none());
        drop(first);
        assert!(ob.drainer_lock(false).unwrap().is_some());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn replace_if_same_keeps_a_newer_event() {
        let d = tmpdir("replace");
        let ob = Outbox::new(&d);
        let a = Event::new(job("1@c", JobState::Completed), (0, 1));
        ob.enqueue(&a).unwrap();
        let mut fixed = a.clone();
        fixed.item = job("1@c", JobState::Cancelled);
        assert!(ob.replace_if_same(&a, &fixed, true).unwrap());
        assert_eq!(ob.pending(), vec![fixed.clone()]);
        let rerun = Event::new(job("1@c", JobState::Running), (1, 0));
        ob.enqueue(&rerun).unwrap();
        assert!(!ob.replace_if_same(&fixed, &a, true).unwrap());
        assert_eq!(ob.pending(), vec![rerun]);
        assert_eq!(
            fs::read_dir(d.join("outbox")).unwrap().count(),
            1,
            "no temp file left"
        );
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_end_waits_behind_its_pending_running() {
        let d = tmpdir("chain");
        let ob = Outbox::new(&d);
        let run = Event::new(job("1@c", JobState::Running), (0, 0));
        let end = Event::new(job("1@c", JobState::Completed), (0, 1));
        ob.enqueue(&run).unwrap();
        assert_eq!(ob.enqueue(&end).unwrap(), Enqueued::Chained);
        let p = ob.pending();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].seq, run.seq);
        assert_eq!(p[0].then.as_deref(), Some(&end));
        // A late RUNNING of the same run is superseded by the chained end.
        let late = Event::new(job("1@c", JobState::Running), (0, 0));
        assert_eq!(ob.enqueue(&late).unwrap(), Enqueued::Superseded);
        // Delivering the RUNNING makes the end the pending event, durably.
        let t = ob.take(&p[0]).unwrap().unwrap();
        ob.finish(&t, Finish::Delivered).unwrap();
        assert_eq!(ob.pending(), vec![end.clone()]);
        // A requeued run's RUNNING replaces the whole chain of the run before.
        let run2 = Event::new(job("2@c", JobState::Running), (0, 0));
        ob.enqueue(&run2).unwrap();
        ob.enqueue(&Event::new(job("2@c", JobState::Failed), (0, 1)))
            .unwrap();
        let rerun = Event::new(job("2@c", JobState::Running), (1, 0));
        assert_eq!(
            ob.enqueue(&rerun).unwrap(),
            Enqueued::Queued { busy: false }
        );
        assert_eq!(ob.pending_of(&rerun.item), Some(rerun));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn names_are_safe() {
        assert_eq!(safe_name("1@c"), "1@c");
        assert_eq!(safe_name("../x/y"), "%2E.%2Fx%2Fy");
        for k in ["1@c", "../x/y", "a%b", ".%2F", "%", "%aé", "é%"] {
            assert_eq!(unsafe_name(&safe_name(k)), k);
        }
    }

    #[test]
    fn limit_drops_nodes_then_running_then_oldest_ends() {
        let d = tmpdir("limit");
        let ob = Outbox::new(&d);
        let node = |n: &str| Item::NodeDelete { name: n.into() };
        for ev in [
            Event::new(job("1@c", JobState::Completed), (0, 1)),
            Event::new(node("n1"), (0, 0)),
            Event::new(job("2@c", JobState::Running), (0, 0)),
            Event::new(job("3@c", JobState::Failed), (0, 1)),
            Event::new(job("4@c", JobState::Running), (0, 0)),
        ] {
            ob.enqueue(&ev).unwrap();
        }
        assert_eq!(ob.enforce_limit(10), 0);
        assert_eq!(ob.enforce_limit(3), 2);
        let left: Vec<String> = ob.pending().iter().map(|e| e.item.describe()).collect();
        assert_eq!(
            left,
            ["job 1@c COMPLETED", "job 3@c FAILED", "job 4@c RUNNING"]
        );
        assert_eq!(ob.enforce_limit(1), 2);
        assert_eq!(ob.pending()[0].item.describe(), "job 3@c FAILED");
        let keys = ob.pending_job_keys();
        assert!(keys.contains("3@c") && keys.len() == 1);
        ob.save_start("5@c", 100).unwrap();
        let started = ob.started_jobs();
        assert_eq!(started.len(), 1);
        assert_eq!((started[0].0.as_str(), started[0].1), ("5@c", 100));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn root_keeps_state_dir_owned_by_its_owner() {
        use std::os::unix::fs::MetadataExt;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root (CI runs as root)");
            return;
        }
        let d = tmpdir("owner");
        fs::create_dir_all(&d).unwrap();
        // A StateDir owned by SlurmUser (here: nobody), and a subdirectory a root run left behind.
        std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
        fs::DirBuilder::new()
            .mode(0o700)
            .create(d.join("jobs"))
            .unwrap();
        let ob = Outbox::new(&d);
        ob.enqueue(&Event::new(job("1@c", JobState::Running), (0, 0)))
            .unwrap();
        ob.save_start("1@c", 5).unwrap();
        for p in [
            "outbox",
            "inflight",
            "rejected",
            "jobs",
            "outbox.lock",
            "outbox/job.1@c.json",
            "jobs/1@c",
        ] {
            assert_eq!(fs::metadata(d.join(p)).unwrap().uid(), 65534, "{p}");
        }
        fs::remove_dir_all(&d).unwrap();
    }

    /// The inventory's node records: kept, read back, and refused when tampered with.
    #[test]
    fn node_records() {
        let d = std::env::temp_dir().join(format!("cvslurm-noderec-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        let ob = Outbox::new(&d);
        assert_eq!(ob.load_node_record("dgx1").unwrap(), None);
        let rec = crate::topology::fixtures::record("dgx1", "dgx-a100", "02:dd:00:01");
        ob.save_node_record(&rec).unwrap();
        assert_eq!(ob.load_node_record("dgx1").unwrap(), Some(rec.clone()));
        let p = d.join("nodes/dgx1.json");
        // Another node's record under this name.
        let mut other = rec.clone();
        other.node_name = "dgx2".into();
        fs::write(&p, serde_json::to_vec(&other).unwrap()).unwrap();
        assert!(ob
            .load_node_record("dgx1")
            .unwrap_err()
            .contains("a record of node \"dgx2\""));
        // Garbage, an oversized file, a link.
        fs::write(&p, b"{not json").unwrap();
        assert!(ob
            .load_node_record("dgx1")
            .unwrap_err()
            .contains("not a discover record"));
        fs::write(&p, vec![b' '; crate::node_record::MAX_RECORD_BYTES + 1]).unwrap();
        assert!(ob
            .load_node_record("dgx1")
            .unwrap_err()
            .contains("larger than"));
        fs::remove_file(&p).unwrap();
        ob.save_node_record(&other).unwrap();
        std::os::unix::fs::symlink(d.join("nodes/dgx2.json"), &p).unwrap();
        assert!(ob
            .load_node_record("dgx1")
            .unwrap_err()
            .contains("cannot read"));
        ob.forget_node_record("dgx2");
        assert_eq!(ob.load_node_record("dgx2").unwrap(), None);
        fs::remove_dir_all(&d).unwrap();
    }
}

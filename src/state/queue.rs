//! The outbox: what could not be sent now is kept on disk and sent later.
//!
//! - `outbox/<kind>.<key>.json` — at most one pending event per job or node, as the drainer
//!   resolved it: a newer event for the same key replaces the older one, so a job's later
//!   state always wins and a stale RUNNING can never be delivered after the job's end; an end
//!   that comes while its run's RUNNING waits is chained after it (`then`). A previous
//!   release wrote only these: what it left is read and sent the same way.
//! - `outbox/<kind>.<key>.<seq>.<pid>.<n>.%.json` — one event a hook handed in
//!   ([`Queue::hand_in`]), a file of its own (`seq` the event's, `pid` the writer's, `n` a
//!   counter of that process), written without any lock. Only the drainer takes it in
//!   ([`Queue::fold`]: ordering and supersession per key, under `outbox.lock`), and deletes
//!   it then; a hook deletes no file but its own, once it sent that event itself
//!   ([`Queue::withdraw`]). `%` followed by no two hex digits never appears in a key's name
//!   ([`super::durable::safe_name`]): the two kinds of name never mix ([`is_spool_name`]).
//! - `inflight/<kind>.<key>.json` — an event a drainer is sending right now; moved back on
//!   failure, on start-up after a crash, or deleted once CloudVision took it.
//! - `rejected/<name>` — events CloudVision refused as malformed (4xx), with its answer.
//! - `outbox.lock` — `flock`ed for the few microseconds of each read-compare-rename of a key's
//!   pending file by the drainer's side (its moves and folds, and the service's own writers
//!   through [`Queue::enqueue`]); never by a hook. The temp file is written and `fsync`ed
//!   before the lock is taken, the directory after it is released: no disk wait happens
//!   under the lock.
//! - `drainer.lock` — held (`flock`) for its whole life by the one process that sends the
//!   outbox (the service, or a `cvslurm flush`): `inflight/` belongs to it until it dies.
//!
//! Each event file is one JSON object ([`Event`]) carrying its format, `"v"`
//! ([`super::event::EVENT_FORMAT`]); a file without it is format 1, the shape written before `"v"` existed.
//! A file of a newer format is left in place, logged, and never sent, replaced or deleted.
//!
//! Every event write is: temp file, `fsync`, `rename`, `fsync` of the directory
//! ([`super::durable`]); a hook that hands its event to the running service skips the `fsync`
//! and the service syncs it ([`Queue::sync_files`]).

use super::durable::{self, list_dir, sync_dir, unsafe_name, write_tmp_at};
use super::index::{Index, Known, FULL_PASS_EVERY, READ_AT_MOST, STAT_ALL_EVERY};
use super::layout::{DRAINER_LOCK, INFLIGHT, OUTBOX, OUTBOX_LOCK, REJECTED};
use super::starts::Starts;
use nix::fcntl::Flock;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[cfg(test)]
use super::event::EVENT_FORMAT;
pub use super::event::{decode_event, EndFacts, Event, Item, Undecodable};

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
    /// The whole file was read and is an event of a newer format: left as it is.
    Newer(u64),
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
    match decode_event(&bytes) {
        Ok(ev) => ReadOutcome::Event(Box::new(ev)),
        Err(Undecodable::Newer(v)) => ReadOutcome::Newer(v),
        Err(Undecodable::Corrupt(why)) => ReadOutcome::Corrupt(why),
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
    /// A pending event of higher rank is already queued; this one was dropped (a handed-in
    /// one: will be, by the drainer).
    Superseded,
    /// Handed in, but whether an earlier event of the key waits could not be told in time
    /// ([`Look::Full`]): the caller must not send directly (the drainer sends it, in order).
    Unchecked,
}

/// How much [`Queue::hand_in`] looks at the key's other events once its file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// The key's pending file and its file in flight (two reads): enough for a hook that
    /// hands its event to the running service, which resolves the rest.
    Quick,
    /// Also every other handed-in file of the key (a listing of the outbox, given up at this
    /// instant: [`Enqueued::Unchecked`]): a hook that decides whether to send itself.
    Full(Instant),
}

/// Per job key: when its end was delivered, that end's rank, and the end time it carried
/// (epoch seconds, where it had one), which tells a later job under the same id apart.
type DeliveredEnds = std::collections::HashMap<String, (Instant, (u32, u8), Option<i64>)>;

/// The outbox in one state directory: pending, in-flight and rejected events.
#[derive(Debug, Clone)]
pub struct Queue {
    root: PathBuf,
    /// When running as root in a StateDir owned by someone else (SlurmUser): the owner every
    /// new file and directory gets, so the hooks (running as SlurmUser) can use them.
    owner: Option<(u32, u32)>,
    /// The start records, which a resend must find ([`Queue::enqueue_resend`]).
    starts: Starts,
    /// An in-flight file older than this is from a drainer that died: ignore it.
    pub inflight_stale: Duration,
    /// The job keys whose end this process delivered, and when (shared by its clones): the
    /// service's reconciliation never sends a RUNNING for a job whose end is already out.
    /// With the rank and end time of that end: a RUNNING a hook handed in later for the same
    /// or an earlier run is dropped when the outbox takes it in ([`Queue::fold`]); one of a
    /// later job under the same id (started after that end, [`later_run`]) is not.
    delivered_ends: std::sync::Arc<std::sync::Mutex<DeliveredEnds>>,
    /// Where the events queued and dropped are counted.
    status: super::status::ServiceStatus,
}

/// How long [`Queue::recently_ended`] remembers a delivered end: far longer than a job
/// stays listed as running after it ended.
pub const REMEMBER_ENDS: Duration = Duration::from_secs(600);

impl Queue {
    /// The outbox under `root`, new files handed to `owner` (see [`super::StateDir::new`]).
    pub(super) fn new(
        root: &Path,
        owner: Option<(u32, u32)>,
        starts: Starts,
        status: super::status::ServiceStatus,
    ) -> Queue {
        Queue {
            root: root.to_path_buf(),
            owner,
            starts,
            status,
            inflight_stale: Duration::from_secs(60),
            delivered_ends: Default::default(),
        }
    }

    /// The job keys whose end this process (and its clones) delivered in the last
    /// [`REMEMBER_ENDS`].
    pub fn recently_ended(&self) -> std::collections::HashSet<String> {
        self.recently_ended_at().into_keys().collect()
    }

    /// The rank and end time of the end of job `key` this process delivered, if any.
    fn delivered_end(&self, key: &str) -> Option<((u32, u8), Option<i64>)> {
        self.delivered_ends
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .map(|(_, rank, end)| (*rank, *end))
    }

    /// [`Queue::recently_ended`] with the end time each end carried (epoch seconds, where
    /// it had one).
    pub fn recently_ended_at(&self) -> std::collections::HashMap<String, Option<i64>> {
        let mut ends = self
            .delivered_ends
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        ends.retain(|_, (at, _, _)| at.elapsed() < REMEMBER_ENDS);
        ends.iter()
            .map(|(k, (_, _, end))| (k.clone(), *end))
            .collect()
    }

    /// True when `ev` is a RUNNING of a later job under the id of a job whose end this process
    /// delivered ([`later_run`]: same restart count, started after that end): CloudVision may
    /// hold the earlier job's ended record, whose `end_time` a Set (a partial update) would
    /// keep, so it is deleted before this is sent, as for a requeued job's next run.
    pub fn follows_an_earlier_job(&self, ev: &Event) -> bool {
        let Item::Job { job } = &ev.item else {
            return false;
        };
        ev.rank.1 == 0
            && self
                .delivered_end(&job.key.id)
                .is_some_and(|(rank, end)| rank.0 == ev.rank.0 && started_after(ev, end))
    }

    /// True when an event for `item`'s key is pending (not in flight).
    pub fn is_pending(&self, item: &Item) -> bool {
        self.dir(OUTBOX).join(item.file_name()).exists()
    }

    /// The pending event of `item`'s key, if any.
    pub fn pending_of(&self, item: &Item) -> Option<Event> {
        read_event(&self.dir(OUTBOX).join(item.file_name())).and_then(Result::ok)
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn ensure_dirs(&self) -> Result<(), String> {
        durable::ensure_dirs(&self.root, self.owner)
    }

    fn lock(&self) -> Result<Flock<File>, String> {
        self.lock_file(OUTBOX_LOCK, None)
    }

    /// Locks `name` in StateDir; with a deadline, gives up when it passes.
    fn lock_file(&self, name: &str, deadline: Option<Instant>) -> Result<Flock<File>, String> {
        durable::lock_file(&self.root.join(name), self.owner, deadline)
    }

    /// Becomes the outbox's one drainer: `Ok(None)` when another live process (the service,
    /// another `flush`) is the drainer and `wait` is false. Held until the returned lock is
    /// dropped or the process dies; only its holder may [`recover`](Self::recover).
    pub fn drainer_lock(&self, wait: bool) -> Result<Option<Flock<File>>, String> {
        self.ensure_dirs()?;
        let deadline = (!wait).then(Instant::now);
        match self.lock_file(DRAINER_LOCK, deadline) {
            Ok(l) => Ok(Some(l)),
            Err(e) if !wait && e.ends_with("past the deadline") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes `ev` durably as its key's pending event unless a pending event of higher rank
    /// for the same key exists, under `outbox.lock` (which only the drainer's side takes: the
    /// service's own writers and the drainer's moves; never a hook, see [`hand_in`](Self::hand_in)).
    /// An error, nothing written, when the pending event of the key is of a newer format: it
    /// is never replaced by this cvslurm.
    pub fn enqueue(&self, ev: &Event) -> Result<Enqueued, String> {
        self.ensure_dirs()?;
        let path = self.dir(OUTBOX).join(ev.item.file_name());
        let bytes = serde_json::to_vec(ev).map_err(|e| e.to_string())?;
        let tmp = write_event(&path, &bytes, ev.queued_at, self.owner, true)?;
        let res = self.place_from(ev, &tmp, false);
        if matches!(res, Ok(Enqueued::Queued { .. } | Enqueued::Chained)) {
            sync_dir(&self.dir(OUTBOX));
            self.status.count(super::status::counter::QUEUED, 1);
        }
        res
    }

    /// Hands `ev` in without taking any lock: it becomes its own file,
    /// `outbox/<kind>.<key>.<seq>.<pid>.<n>.%.json` (temp file, `fdatasync` with `sync`,
    /// rename; then the directory synced with `sync`), which no other process writes and only
    /// the drainer takes in ([`fold`](Self::fold)): ordering and supersession are resolved
    /// there. `placed` is called as soon as the file has its name. Then looks at what else of
    /// the key is queued (`look`), without a lock: what it returns is what the drainer will
    /// make of the event, unless another event of the key arrives meanwhile. An error, and
    /// the file removed again, when the key's pending event is of a newer format (never
    /// replaced by this cvslurm: the caller sends itself). Returns the file's path too (the
    /// caller's own: [`withdraw`](Self::withdraw) once it sent the event itself).
    pub fn hand_in(
        &self,
        ev: &Event,
        sync: bool,
        look: Look,
        placed: impl FnOnce(),
    ) -> Result<(Enqueued, PathBuf), String> {
        self.ensure_dirs()?;
        let name = spool_name(&ev.item, ev.seq);
        let path = self.dir(OUTBOX).join(&name);
        let bytes = serde_json::to_vec(ev).map_err(|e| e.to_string())?;
        let tmp = write_event(&path, &bytes, ev.queued_at, self.owner, sync)?;
        if let Err(e) = fs::rename(&tmp, &path) {
            let _ = fs::remove_file(&tmp);
            return Err(format!("cannot write {}: {e}", path.display()));
        }
        placed();
        if sync {
            sync_dir(&self.dir(OUTBOX));
        }
        match self.look(ev, &name, look) {
            Ok(r) => {
                self.status.count(super::status::counter::QUEUED, 1);
                Ok((r, path))
            }
            Err(e) => {
                let _ = fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// Removes the file a hook handed in ([`hand_in`](Self::hand_in)) after it sent the event
    /// itself. Only ever that process's own file, by its unique name: when the drainer took
    /// it in first, nothing is removed and the event is sent once more (a POST replaces the
    /// record of its key).
    pub fn withdraw(&self, own: &Path) {
        if own.parent() == Some(self.dir(OUTBOX).as_path())
            && own
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(is_spool_name)
        {
            let _ = fs::remove_file(own);
        }
    }

    /// What the drainer will make of `ev` (handed in as `own`), from the key's pending event,
    /// its event in flight and (with [`Look::Full`]) the other handed-in files of the key;
    /// read without a lock.
    fn look(&self, ev: &Event, own: &str, look: Look) -> Result<Enqueued, String> {
        let canon = ev.item.file_name();
        let path = self.dir(OUTBOX).join(&canon);
        let mut others = Vec::new();
        match read_event(&path) {
            Some(Err(newer @ Undecodable::Newer(_))) => {
                return Err(format!("{}: {newer}", path.display()))
            }
            Some(Ok(e)) => others.push(e),
            _ => {}
        }
        if let Look::Full(by) = look {
            let stem = format!("{}.", canon.strip_suffix(".json").unwrap_or(&canon));
            let Ok(rd) = fs::read_dir(self.dir(OUTBOX)) else {
                return Ok(Enqueued::Unchecked);
            };
            for (i, e) in rd.flatten().enumerate() {
                if i % 256 == 0 && Instant::now() > by {
                    return Ok(Enqueued::Unchecked);
                }
                let n = e.file_name();
                let Some(n) = n.to_str() else { continue };
                if n == own
                    || !n.starts_with(&stem)
                    || canonical_of_spool(n).as_deref() != Some(canon.as_str())
                {
                    continue;
                }
                if let Some(Ok(o)) = read_event(&e.path()) {
                    others.push(o);
                }
            }
        }
        let inflight = self.dir(INFLIGHT).join(&canon);
        if let Some(Ok(f)) = read_event(&inflight) {
            if outranks(&f, ev) {
                return Ok(Enqueued::Superseded);
            }
        }
        if others.iter().any(|o| outranks(o, ev)) {
            return Ok(Enqueued::Superseded);
        }
        if others.iter().any(|o| chains_after(o, ev)) {
            return Ok(Enqueued::Chained);
        }
        let busy = match fs::metadata(&inflight).and_then(|m| m.modified()) {
            Ok(t) => t
                .elapsed()
                .map(|age| age < self.inflight_stale)
                .unwrap_or(true),
            Err(_) => false,
        };
        Ok(Enqueued::Queued { busy })
    }

    /// Takes the handed-in files `names` ([`hand_in`](Self::hand_in)) into the outbox and
    /// makes what they became durable: [`take_in`](Self::take_in), then
    /// [`after_take_in`](Self::after_take_in). For the drainer only. Returns the names of the
    /// pending files it changed.
    pub fn fold(&self, names: &[String]) -> Vec<String> {
        let (placed, chained) = self.take_in(names);
        self.after_take_in(&placed, &chained);
        placed
    }

    /// Takes the handed-in files `names` ([`hand_in`](Self::hand_in)) into the outbox: for
    /// each key, in the order of their ranks and then of their queue times, each becomes the
    /// key's pending event (a rename: its data as the hook wrote it, synced without the
    /// service), is chained after its run's pending RUNNING (the pending file written anew),
    /// or is dropped as superseded (by a pending event, the event in flight, or an end this
    /// process delivered of a higher rank) and deleted. Nothing is synced here: the caller
    /// calls [`after_take_in`](Self::after_take_in) with what this returns, the names of the
    /// pending files it changed and of the handed-in files it chained (kept until the chained
    /// files are synced). For the drainer only (it holds `drainer.lock`): a hook never
    /// deletes a file but its own. A file not readable now stays for the next call; one that
    /// is not an event goes to `rejected/`; one of a newer format, or whose key's pending
    /// event is of a newer format, stays where it is, never sent.
    pub fn take_in(&self, names: &[String]) -> (Vec<String>, Vec<String>) {
        let mut seen = std::collections::HashSet::new();
        let mut evs = Vec::new();
        for name in names {
            if !is_spool_name(name) || !seen.insert(name.as_str()) {
                continue;
            }
            let p = self.dir(OUTBOX).join(name);
            match read_event_checked(&p) {
                ReadOutcome::Event(ev) => evs.push((name.clone(), *ev)),
                ReadOutcome::Transient(_) => {}
                ReadOutcome::Newer(v) => report_newer(&p, v),
                ReadOutcome::Corrupt(why) => {
                    log::error!(
                        "outbox file {} is not an event ({why}); moved to rejected/",
                        p.display()
                    );
                    let _ = fs::rename(&p, self.dir(REJECTED).join(name));
                }
            }
        }
        evs.sort_by(|(_, a), (_, b)| {
            (a.item.file_name(), a.rank, a.seq).cmp(&(b.item.file_name(), b.rank, b.seq))
        });
        let (mut placed, mut chained) = (Vec::new(), Vec::new());
        for (name, ev) in evs {
            let p = self.dir(OUTBOX).join(&name);
            match self.place_from(&ev, &p, true) {
                Ok(Enqueued::Chained) => {
                    placed.push(ev.item.file_name());
                    chained.push(name);
                }
                Ok(Enqueued::Superseded) => log::info!(
                    "outbox: {} superseded by a later event of its key; dropped",
                    ev.item.describe()
                ),
                Ok(_) => placed.push(ev.item.file_name()),
                Err(e) => report_once(&p, &format!("left where it is: {e}")),
            }
        }
        placed.sort();
        placed.dedup();
        (placed, chained)
    }

    /// After [`take_in`](Self::take_in): syncs the pending files `placed` (`fdatasync` each,
    /// then the directory) and forgets the start records of the ends now durably queued
    /// ([`sync_files`](Self::sync_files)), then deletes the handed-in files `chained` (a
    /// crash before leaves them to be taken in again, which changes nothing).
    pub fn after_take_in(&self, placed: &[String], chained: &[String]) {
        self.sync_files(placed);
        for name in chained.iter().filter(|n| is_spool_name(n)) {
            let _ = fs::remove_file(self.dir(OUTBOX).join(name));
        }
    }

    /// Brings `ix` up to date for the pending files `names` this process just changed
    /// ([`take_in`](Self::take_in)) without listing the directory, and forgets the handed-in
    /// files the last [`refresh`](Self::refresh) found (taken in by now). Returns the names
    /// read, oldest first. The next full look sets every count right.
    pub fn note_taken_in(&self, ix: &mut Index, names: &[String]) -> Vec<String> {
        use std::os::unix::fs::MetadataExt;
        ix.files = ix.files.saturating_sub(std::mem::take(&mut ix.spool).len());
        ix.spool_oldest = None;
        let mut changed = Vec::new();
        for name in names {
            let p = self.dir(OUTBOX).join(name);
            let Ok(m) = fs::symlink_metadata(&p) else {
                if ix.known.remove(name.as_str()).is_some() {
                    ix.files = ix.files.saturating_sub(1);
                }
                continue;
            };
            let id = (
                m.ino(),
                m.ctime() * 1_000_000_000 + m.ctime_nsec(),
                m.size(),
            );
            if let ReadOutcome::Event(ev) = read_event_checked(&p) {
                ix.reads += 1;
                let k = Known::of(&ev, id, m.ino(), ix.gen);
                if ix.known.insert(name.as_str().into(), k).is_none() {
                    ix.files += 1;
                }
                changed.push((ev.seq, name.clone()));
            }
        }
        changed.sort();
        changed.into_iter().map(|(_, n)| n).collect()
    }

    /// [`fold`](Self::fold) of every handed-in file in the outbox now (`flush`). Returns the
    /// names of the pending files it changed.
    pub fn fold_all(&self) -> Vec<String> {
        let names: Vec<String> = fs::read_dir(self.dir(OUTBOX))
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().to_str().map(str::to_string))
                    .filter(|n| is_spool_name(n))
                    .collect()
            })
            .unwrap_or_default();
        self.fold(&names)
    }

    /// Puts `ev`, whose bytes are in the file `src` in `outbox/` (a writer's temp file, or a
    /// handed-in file: `handed_in`), in place as its key's pending event. The chained file
    /// (an end after its pending RUNNING) is written (and synced, unless `handed_in`: the
    /// caller syncs it) before the lock; under it, only a read, a compare and a rename. `src`
    /// is gone afterwards, except a handed-in file on an error (it stays for a later
    /// [`fold`](Self::fold)) or once chained (the caller deletes it once the chained file is
    /// synced).
    fn place_from(&self, ev: &Event, src: &Path, handed_in: bool) -> Result<Enqueued, String> {
        // An end of a run older than the recorded one: stale, decided without the lock (a
        // prolog writes its record without it too).
        if self.later_run_recorded(ev) {
            let _ = fs::remove_file(src);
            return Ok(Enqueued::Superseded);
        }
        let path = self.dir(OUTBOX).join(ev.item.file_name());
        // An end that goes after its pending RUNNING replaces that file by both: that file is
        // written (and synced) before the lock too, from the pending event read without the
        // lock, and renamed under the lock only if the pending event is still that one.
        let mut chained: Option<(Event, PathBuf)> = None;
        let mut res;
        loop {
            if let Some(Ok(old)) = read_event(&path) {
                if chains_after(&old, ev) && chained.as_ref().is_none_or(|(o, _)| *o != old) {
                    if let Some((_, t)) = chained.take() {
                        let _ = fs::remove_file(t);
                    }
                    let mut both = old.clone();
                    both.then = Some(Box::new(ev.clone()));
                    let b = serde_json::to_vec(&both).map_err(|e| e.to_string());
                    let sync = !handed_in;
                    match b.and_then(|b| write_event(&path, &b, old.queued_at, self.owner, sync)) {
                        Ok(t) => chained = Some((old, t)),
                        Err(e) => {
                            if !handed_in {
                                let _ = fs::remove_file(src);
                            }
                            return Err(e);
                        }
                    }
                }
            }
            res = self.place(ev, &path, src, chained.as_ref(), handed_in);
            if res != Err(Replaced) {
                break;
            }
        }
        if let Some((_, t)) = &chained {
            if res != Ok(Enqueued::Chained) {
                let _ = fs::remove_file(t);
            }
        }
        let keep_src = matches!(res, Ok(Enqueued::Queued { .. }))
            || (handed_in && matches!(res, Err(_) | Ok(Enqueued::Chained)));
        if !keep_src {
            let _ = fs::remove_file(src);
        }
        res.map_err(|e| match e {
            Replaced => unreachable!("retried above"),
            Failed(e) => e,
        })
    }

    /// The part of [`place_from`](Self::place_from) under the lock: renames only (the files
    /// are written and synced before). `Err(Replaced)`: the pending event is not the one
    /// `chained` was made from (or one to chain after appeared): make it again. A handed-in
    /// event is also dropped when the key's event in flight, or an end of the key this
    /// process delivered, is of a higher rank (a RUNNING never follows its run's end).
    fn place(
        &self,
        ev: &Event,
        path: &Path,
        src: &Path,
        chained: Option<&(Event, PathBuf)>,
        handed_in: bool,
    ) -> Result<Enqueued, PlaceError> {
        let _lock = self.lock().map_err(Failed)?;
        let cur = read_event(path);
        if let Some(Err(newer @ Undecodable::Newer(_))) = &cur {
            return Err(Failed(format!("{}: {newer}", path.display())));
        }
        let name = ev.item.file_name();
        let inflight = self.dir(INFLIGHT).join(&name);
        if handed_in {
            let flying = matches!(read_event(&inflight), Some(Ok(f)) if outranks(&f, ev));
            let delivered = match &ev.item {
                Item::Job { job } => self
                    .delivered_end(&job.key.id)
                    .is_some_and(|(rank, end)| ev.rank < rank && !started_after(ev, end)),
                _ => false,
            };
            if flying || delivered {
                return Ok(Enqueued::Superseded);
            }
        }
        if let Some(Ok(old)) = cur {
            if outranks(&old, ev) {
                return Ok(Enqueued::Superseded);
            }
            if chains_after(&old, ev) {
                return match chained {
                    Some((made_from, both)) if *made_from == old => fs::rename(both, path)
                        .map(|()| Enqueued::Chained)
                        .map_err(|e| Failed(format!("cannot write {}: {e}", path.display()))),
                    _ => Err(Replaced),
                };
            }
        }
        let busy = match fs::metadata(&inflight).and_then(|m| m.modified()) {
            Ok(t) => t
                .elapsed()
                .map(|age| age < self.inflight_stale)
                .unwrap_or(true),
            Err(_) => false,
        };
        fs::rename(src, path)
            .map_err(|e| Failed(format!("cannot write {}: {e}", path.display())))?;
        Ok(Enqueued::Queued { busy })
    }

    /// Makes pending files that hooks wrote without syncing durable (`fdatasync` each, then
    /// the directory). A file already sent and gone is skipped. Then, for each job whose end
    /// is now durably queued (pending or in flight), forgets its start record: a hook that
    /// handed its end to the service leaves that to here, so that until the end is on disk,
    /// reconciliation can still repair it.
    pub fn sync_files(&self, names: &[String]) {
        if names.is_empty() {
            return;
        }
        for name in names {
            let p = self.dir(OUTBOX).join(name);
            if let Ok(f) = OpenOptions::new()
                .read(true)
                .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
                .open(&p)
            {
                let _ = f.sync_data();
            }
        }
        sync_dir(&self.dir(OUTBOX));
        self.forget_starts_of_ends(names);
    }

    /// True when `ev` is a job's end and the start record of its key is of a later run (a
    /// requeue's next run, or a later job under the same id, whose prolog has recorded it):
    /// that start is after `ev`'s end. Such an end is stale: sent now it would show the
    /// running job ended.
    fn later_run_recorded(&self, ev: &Event) -> bool {
        let Item::Job { job } = &ev.item else {
            return false;
        };
        if ev.rank.1 == 0 {
            return false;
        }
        // By time alone: a run starts before its own end, whatever restart count the end's
        // source (a hook, accounting, the plugin) gave it.
        match (self.starts.load(&job.key.id), end_epoch(ev)) {
            (Some(start), Some(end)) => later_run_at(start, end),
            _ => false,
        }
    }

    /// Forgets the start record of each job whose end is in pending (or in-flight) file
    /// `names`, on disk (synced) by now (not one a later run's prolog wrote meanwhile).
    fn forget_starts_of_ends(&self, names: &[String]) {
        for name in names {
            let queued = [OUTBOX, INFLIGHT]
                .iter()
                .find_map(|d| read_event(&self.dir(d).join(name)).and_then(Result::ok));
            if let Some(
                ev @ Event {
                    item: Item::Job { job },
                    then,
                    ..
                },
            ) = &queued
            {
                let end = then.as_deref().unwrap_or(ev);
                if (then.is_some() || job.state.is_terminal()) && !self.later_run_recorded(end) {
                    self.starts.forget(&job.key.id);
                }
            }
        }
    }

    /// Replaces the pending event `old` by `new` (same key) if `old` is still the pending one;
    /// durably with `sync` (else the caller syncs it: [`sync_files`](Self::sync_files)).
    /// `Ok(false)` when it was replaced or taken meanwhile.
    pub fn replace_if_same(&self, old: &Event, new: &Event, sync: bool) -> Result<bool, String> {
        let path = self.dir(OUTBOX).join(old.item.file_name());
        let bytes = serde_json::to_vec(new).map_err(|e| e.to_string())?;
        let tmp = write_event(&path, &bytes, new.queued_at, self.owner, sync)?;
        let done = (|| {
            let _lock = self.lock()?;
            match read_event(&path) {
                Some(Ok(cur)) if cur.seq == old.seq => {
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
            sync_dir(&self.dir(OUTBOX));
        }
        done
    }

    /// Removes the pending event of `ev`'s key if it is still `ev` (not replaced meanwhile).
    pub fn remove_if_same(&self, ev: &Event) -> Result<bool, String> {
        self.remove_if_seq(&ev.item.file_name(), ev.seq)
    }

    /// Removes the pending file `name` if its event is still the one of `seq`.
    fn remove_if_seq(&self, name: &str, seq: u128) -> Result<bool, String> {
        let _lock = self.lock()?;
        let path = self.dir(OUTBOX).join(name);
        match read_event(&path) {
            Some(Ok(cur)) if cur.seq == seq => {
                fs::remove_file(&path)
                    .map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// The pending event in outbox file `name` as it is now (`None`: gone, not readable now,
    /// or no event this cvslurm sends; [`refresh`](Self::refresh) deals with those).
    pub fn read_pending(&self, name: &str) -> Option<Event> {
        match read_event_checked(&self.dir(OUTBOX).join(name)) {
            ReadOutcome::Event(e) => Some(*e),
            _ => None,
        }
    }

    /// Brings `ix` up to date with the outbox directory, reading only the files that are new
    /// or changed since the last call, at most [`READ_AT_MOST`] of them (the rest the next
    /// time: [`Index::complete`] says whether any were left). Every event write is a new file
    /// renamed over the name, so a rewrite shows in the listing as another inode number: a
    /// name listed with the inode number it had is not looked at further. A file rewritten
    /// twice between two calls may get the first one's number back: every
    /// [`STAT_ALL_EVERY`] (or four times as long as such a pass took, if longer) each file is
    /// also told by its `stat` (inode, `ctime`, size), which tells those apart. A directory
    /// whose own `mtime` and `ctime` have not changed since a complete pass is not listed at
    /// all (but at least every [`FULL_PASS_EVERY`]). Names that vanished are forgotten. A
    /// file that is not an event is moved to `rejected/` and logged, one of a newer format is
    /// remembered and never sent, one not readable now is tried again next time. Returns the
    /// names of the events read (new or changed), oldest first.
    pub fn refresh(&self, ix: &mut Index) -> Vec<String> {
        use std::os::unix::fs::MetadataExt;
        let dir = self.dir(OUTBOX);
        let started = SystemTime::now();
        let stamp = match fs::metadata(&dir) {
            Ok(m) => (m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()),
            Err(_) => {
                ix.known.clear();
                ix.files = 0;
                ix.stamp = None;
                ix.complete = true;
                return Vec::new();
            }
        };
        let fresh = ix.full_at.is_some_and(|t| t.elapsed() < FULL_PASS_EVERY);
        let stat_all = ix
            .stat_all_at
            .is_none_or(|t| t.elapsed() >= STAT_ALL_EVERY.max(ix.stat_all_took * 4));
        let began = Instant::now();
        if ix.stamp == Some(stamp) && fresh {
            return Vec::new();
        }
        let Ok(rd) = fs::read_dir(&dir) else {
            ix.stamp = None;
            return Vec::new();
        };
        ix.gen = ix.gen.wrapping_add(1);
        let gen = ix.gen;
        let (mut files, mut reads, mut clean, mut capped) = (0usize, 0usize, true, false);
        // The oldest queue time (the file's mtime, as every writer sets it) of the files this
        // pass counted but did not read, and whether every such file's was told.
        let (mut unread, mut unread_told): (Option<i64>, bool) = (None, true);
        let mut not_read = |mtime: Option<i64>| match mtime {
            Some(t) => unread = Some(unread.map_or(t, |u| u.min(t))),
            None => unread_told = false,
        };
        let mut changed: Vec<(u128, String)> = Vec::new();
        let (mut spool, mut spool_oldest) = (Vec::new(), None::<i64>);
        for e in rd.flatten() {
            let os_name = e.file_name();
            if !is_event_name(&os_name) {
                continue;
            }
            files += 1;
            let path = e.path();
            let Some(name) = os_name.to_str() else {
                // Never a name cvslurm writes (they are ASCII): hostile or broken.
                log::error!(
                    "outbox file {} is not an event (its name is not UTF-8); moved to rejected/",
                    crate::text::escape_control(&path.display().to_string())
                );
                let _ = fs::rename(&path, self.dir(REJECTED).join(&os_name));
                files -= 1;
                continue;
            };
            if is_spool_name(name) {
                // Handed in by a writer: the drainer takes it in (`fold`), and the next pass
                // reads the pending file it became. Listed again until then.
                if let Ok(m) = e.metadata() {
                    spool_oldest = Some(spool_oldest.map_or(m.mtime(), |o: i64| o.min(m.mtime())));
                }
                spool.push(name.to_string());
                clean = false;
                continue;
            }
            let dino = std::os::unix::fs::DirEntryExt::ino(&e);
            if !stat_all {
                if let Some(k) = ix.known.get_mut(name) {
                    if k.dino == dino {
                        k.gen = gen;
                        continue;
                    }
                }
            }
            // Told before it is read: a change after this is seen as one next time.
            let (id, mtime) = match e.metadata() {
                Ok(m) => (
                    (
                        m.ino(),
                        m.ctime() * 1_000_000_000 + m.ctime_nsec(),
                        m.size(),
                    ),
                    m.mtime(),
                ),
                Err(_) => {
                    clean = false;
                    not_read(None);
                    continue;
                }
            };
            if let Some(k) = ix.known.get_mut(name) {
                if k.id == id {
                    k.dino = dino;
                    k.gen = gen;
                    continue;
                }
            }
            if reads >= READ_AT_MOST {
                (clean, capped) = (false, true);
                ix.known.remove(name);
                not_read(Some(mtime));
                continue;
            }
            reads += 1;
            ix.reads += 1;
            match read_event_checked(&path) {
                ReadOutcome::Event(ev) => {
                    ix.known.insert(name.into(), Known::of(&ev, id, dino, gen));
                    changed.push((ev.seq, name.to_string()));
                }
                ReadOutcome::Newer(v) => {
                    report_newer(&path, v);
                    let newer = Known {
                        id,
                        dino,
                        seq: 0,
                        queued_at: 0,
                        class: 0,
                        provisional: false,
                        newer: true,
                        gen,
                    };
                    ix.known.insert(name.into(), newer);
                }
                ReadOutcome::Transient(why) => {
                    log::debug!(
                        "outbox file {} not readable now ({why}); later",
                        path.display()
                    );
                    clean = false;
                    ix.known.remove(name);
                    not_read(Some(mtime));
                }
                ReadOutcome::Corrupt(why) => {
                    log::error!(
                        "outbox file {} is not an event ({why}); moved to rejected/",
                        path.display()
                    );
                    let _ = fs::rename(&path, self.dir(REJECTED).join(name));
                    files -= 1;
                    ix.known.remove(name);
                }
            }
        }
        ix.known.retain(|_, k| k.gen == gen);
        ix.files = files;
        ix.spool = spool;
        ix.spool_oldest = spool_oldest;
        ix.complete = !capped;
        ix.unread = unread_told.then_some(unread);
        // A change within the file system's timestamp granularity of this listing might not
        // move the directory's times: trust them only once they are older than that.
        let settled = started
            .duration_since(UNIX_EPOCH + Duration::new(stamp.2.max(0) as u64, stamp.3 as u32))
            .is_ok_and(|age| age > Duration::from_millis(100));
        ix.stamp = (clean && settled).then_some(stamp);
        if clean {
            ix.full_at = Some(Instant::now());
        }
        if stat_all {
            ix.stat_all_at = Some(Instant::now());
            ix.stat_all_took = began.elapsed();
        }
        changed.sort();
        changed.into_iter().map(|(_, n)| n).collect()
    }

    /// Every pending event, oldest first. A file that was read whole and is not an event is
    /// moved to `rejected/` and logged; one that cannot be read now (a drainer moved it, no
    /// file descriptor left, an I/O error) is skipped and read again next time; one of a newer
    /// format ([`super::event::EVENT_FORMAT`]) is left where it is, logged once per process, never sent.
    /// Files handed in and not taken in yet ([`fold`](Self::fold)) are not among them.
    pub fn pending(&self) -> Vec<Event> {
        let mut evs: Vec<Event> = list_dir(&self.dir(OUTBOX))
            .into_iter()
            .filter(|p| {
                !p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(is_spool_name)
            })
            .filter_map(|p| match read_event_checked(&p) {
                ReadOutcome::Event(e) => Some(*e),
                ReadOutcome::Transient(why) => {
                    log::debug!(
                        "outbox file {} not readable now ({why}); later",
                        p.display()
                    );
                    None
                }
                ReadOutcome::Newer(v) => {
                    report_newer(&p, v);
                    None
                }
                ReadOutcome::Corrupt(why) => {
                    log::error!(
                        "outbox file {} is not an event ({why}); moved to rejected/",
                        p.display()
                    );
                    let _ = fs::rename(
                        &p,
                        self.dir(REJECTED).join(p.file_name().unwrap_or_default()),
                    );
                    None
                }
            })
            .collect();
        evs.sort_by_key(|e| e.seq);
        evs
    }

    /// Number of pending event files and the age in seconds of the oldest, by its file's
    /// modification time (an event file's is its queue time: [`write_event`]). No file is
    /// opened: the directory is streamed, one `stat` per entry, and only the count and the
    /// minimum are kept. Every `*.json` file counts (a writer's temp file does not): one of a
    /// newer format waits too, and one that is not an event waits until the drainer moves it
    /// to `rejected/`.
    pub fn depth(&self) -> (usize, Option<i64>) {
        let (n, oldest) = self.depth_since();
        (n, oldest.map(|t| crate::timefmt::now_epoch() - t))
    }

    /// [`depth`](Self::depth) with the oldest queue time itself (Unix seconds), not its age.
    pub fn depth_since(&self) -> (usize, Option<i64>) {
        use nix::fcntl::AtFlags;
        let dir = self.dir(OUTBOX);
        let Ok(rd) = fs::read_dir(&dir) else {
            return (0, None);
        };
        // Each file's time from the directory's descriptor (`fstatat`, one path component,
        // never through a link), not from its whole path: twice as fast at a million files.
        let Ok(dfd) = fs::File::open(&dir) else {
            return (0, None);
        };
        let (mut n, mut oldest) = (0usize, None::<i64>);
        for e in rd.flatten() {
            let name = e.file_name();
            if !is_event_name(&name) {
                continue;
            }
            n += 1;
            if let Ok(st) =
                nix::sys::stat::fstatat(&dfd, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            {
                oldest = Some(oldest.map_or(st.st_mtime, |o| o.min(st.st_mtime)));
            }
        }
        (n, oldest)
    }

    /// Number of events in `rejected/` (counted, not read).
    pub fn rejected_count(&self) -> usize {
        fs::read_dir(self.dir(REJECTED))
            .map(|rd| {
                rd.flatten()
                    .filter(|e| is_event_name(&e.file_name()))
                    .count()
            })
            .unwrap_or(0)
    }

    /// Queues a running job's RUNNING again (its nodes' interfaces changed), only while that
    /// cannot reach CloudVision after the job's end. Checked under the outbox lock, which
    /// every writer and the sender's moves take: the job's start record is still there (an
    /// epilog queues the end before it drops the record), and nothing of the key is pending
    /// (a pending RUNNING is enriched when sent anyway; a pending end must stay last), in
    /// flight, or delivered as an end by this process. True when queued.
    pub fn enqueue_resend(&self, ev: &Event) -> Result<bool, String> {
        self.resend(ev, None)
    }

    /// [`Queue::enqueue_resend`] for a job whose start Slurm reset when its nodes had booted:
    /// once queued, and under the same lock, `start` (of run `restarts`) replaces the start
    /// its prolog recorded, so that an end built from that record (an epilog without Slurm's
    /// start) carries it too. True when queued.
    pub fn enqueue_resend_with_start(
        &self,
        ev: &Event,
        start: i64,
        restarts: u32,
    ) -> Result<bool, String> {
        self.resend(ev, Some((start, restarts)))
    }

    fn resend(&self, ev: &Event, start: Option<(i64, u32)>) -> Result<bool, String> {
        let Item::Job { job } = &ev.item else {
            return Err("only a job's RUNNING is resent".into());
        };
        if job.state != crate::cloudvision::payload::JobState::Running {
            return Err("only a job's RUNNING is resent".into());
        }
        self.ensure_dirs()?;
        let name = ev.item.file_name();
        let path = self.dir(OUTBOX).join(&name);
        let bytes = serde_json::to_vec(ev).map_err(|e| e.to_string())?;
        let tmp = write_event(&path, &bytes, ev.queued_at, self.owner, true)?;
        let res = (|| {
            let _lock = self.lock()?;
            // An end delivered of this run (or a later one) stops it; that of an earlier job
            // under the same id does not.
            let ended = self
                .delivered_end(&job.key.id)
                .is_some_and(|(rank, end)| ev.rank.0 <= rank.0 && !started_after(ev, end));
            let busy = path.exists() || self.dir(INFLIGHT).join(&name).exists();
            let started = self.starts.exists(&job.key.id);
            if ended || busy || !started {
                return Ok(false);
            }
            fs::rename(&tmp, &path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            if let Some((start, restarts)) = start {
                // Queued: a failure here is said, and the RUNNING goes anyway.
                if let Err(e) = self.starts.save_run(&job.key.id, start, restarts) {
                    log::warn!(
                        "job {}: cannot record Slurm's start in StateDir: {e}",
                        job.key.id
                    );
                }
            }
            Ok(true)
        })();
        if !matches!(res, Ok(true)) {
            let _ = fs::remove_file(&tmp);
        } else {
            sync_dir(&self.dir(OUTBOX));
            self.status.count(super::status::counter::QUEUED, 1);
        }
        res
    }

    /// Takes a pending event for sending: moves it to `inflight/` if it is still the pending
    /// one. `None` when it was replaced or taken meanwhile.
    pub fn take(&self, ev: &Event) -> Result<Option<Event>, String> {
        let _lock = self.lock()?;
        let name = ev.item.file_name();
        let from = self.dir(OUTBOX).join(&name);
        match read_event(&from) {
            Some(Ok(cur)) if cur.seq == ev.seq => {
                let to = self.dir(INFLIGHT).join(&name);
                fs::rename(&from, &to)
                    .map_err(|e| format!("cannot move {}: {e}", from.display()))?;
                if let Ok(f) = OpenOptions::new()
                    .read(true)
                    .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
                    .open(&to)
                {
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
        let inflight = self.dir(INFLIGHT).join(&name);
        if !matches!(outcome, Finish::Retry) {
            if let Some(next) = &ev.then {
                // The follower becomes the pending event (durably, before the in-flight file
                // goes), unless a newer event of the key arrived meanwhile. Its data is
                // synced before the lock and its directory after it: hooks never wait for
                // an fsync here (a crash in between finds the in-flight file and recovers).
                let pending = self.dir(OUTBOX).join(&name);
                let bytes = serde_json::to_vec(next).map_err(|e| e.to_string())?;
                let tmp = write_event(&pending, &bytes, next.queued_at, self.owner, true)?;
                let placed = (|| {
                    let _lock = self.lock()?;
                    // A newer cvslurm's event of the key came after this one: it stays.
                    match read_event(&pending) {
                        Some(Ok(cur)) if cur.rank >= next.rank || later_run(&cur, next) => {
                            return Ok(false)
                        }
                        Some(Err(Undecodable::Newer(_))) => return Ok(false),
                        _ => {}
                    }
                    fs::rename(&tmp, &pending)
                        .map(|_| true)
                        .map_err(|e| format!("cannot write {}: {e}", pending.display()))
                })();
                match placed {
                    Ok(true) => sync_dir(&self.dir(OUTBOX)),
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
        // What goes back to the outbox, or to rejected/, is written and synced before the
        // lock, renamed under it, and its directory synced after it.
        let (dir, bytes) = match &outcome {
            Finish::Delivered => (None, Vec::new()),
            Finish::Retry => {
                let mut back = ev.clone();
                back.attempts += 1;
                let b = serde_json::to_vec(&back).map_err(|e| e.to_string())?;
                (Some(OUTBOX), b)
            }
            Finish::Reject(answer) => {
                let mut head = ev.clone();
                head.then = None;
                let mut v = serde_json::to_value(&head).map_err(|e| e.to_string())?;
                v["rejected_because"] = serde_json::Value::String(answer.clone());
                let b = serde_json::to_vec_pretty(&v).map_err(|e| e.to_string())?;
                (Some(REJECTED), b)
            }
        };
        let Some(dir) = dir else {
            let _lock = self.lock()?;
            if let Item::Job { job } = &ev.item {
                if job.state.is_terminal() {
                    self.delivered_ends
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(job.key.id.clone(), (Instant::now(), ev.rank, end_epoch(ev)));
                    // Delivered: the start record is no longer needed to repair the end
                    // (unless the job's next run, or a later job under its id, is pending).
                    let next_run = matches!(
                        read_event(&self.dir(OUTBOX).join(&name)),
                        Some(Ok(cur)) if cur.rank > ev.rank || later_run(&cur, ev)
                    );
                    if !next_run {
                        self.starts.forget(&job.key.id);
                    }
                }
            }
            // No fsync: if a crash loses this unlink, recover() puts the event back and it
            // is sent again, which is harmless (a POST replaces the record of its key).
            let _ = fs::remove_file(&inflight);
            return Ok(());
        };
        let to = self.dir(dir).join(&name);
        let tmp = write_event(&to, &bytes, ev.queued_at, self.owner, true)?;
        let placed = (|| -> Result<bool, String> {
            let _lock = self.lock()?;
            // A retry never overwrites a newer pending event of the key.
            if dir == OUTBOX && to.exists() {
                let _ = fs::remove_file(&inflight);
                return Ok(false);
            }
            fs::rename(&tmp, &to).map_err(|e| format!("cannot write {}: {e}", to.display()))?;
            let _ = fs::remove_file(&inflight);
            Ok(true)
        })();
        if placed != Ok(true) {
            let _ = fs::remove_file(&tmp);
        }
        if placed? {
            sync_dir(&self.dir(dir));
        }
        sync_dir(&self.dir(INFLIGHT));
        Ok(())
    }

    /// After a crash: puts every in-flight event back in the outbox (unless superseded), and
    /// removes temp files that writers killed mid-write left behind.
    pub fn recover(&self) -> Result<usize, String> {
        self.ensure_dirs()?;
        let lock = self.lock()?;
        durable::remove_stale_tmp(&self.root);
        let mut n = 0;
        for p in list_dir(&self.dir(INFLIGHT)) {
            let name = p.file_name().unwrap_or_default().to_owned();
            let pending = self.dir(OUTBOX).join(&name);
            // An event of a newer format goes back too: it is never deleted here.
            let read = read_event(&p);
            let corrupt = matches!(read, None | Some(Err(Undecodable::Corrupt(_))));
            if pending.exists() || corrupt {
                let _ = fs::remove_file(&p);
            } else {
                // `take` stamped it with the time it was taken: its queue time again.
                if let Some(Ok(ev)) = &read {
                    set_queue_time(&p, ev.queued_at);
                }
                fs::rename(&p, &pending)
                    .map_err(|e| format!("cannot move {}: {e}", p.display()))?;
                n += 1;
            }
        }
        drop(lock);
        sync_dir(&self.dir(OUTBOX));
        Ok(n)
    }

    /// The keys (`12345@cluster`) of jobs with an event pending (handed in included) or in
    /// flight.
    pub fn pending_job_keys(&self) -> std::collections::HashSet<String> {
        [OUTBOX, INFLIGHT]
            .iter()
            .flat_map(|d| list_dir(&self.dir(d)))
            .filter_map(|p| {
                let mut n = p.file_name()?.to_string_lossy().into_owned();
                if let Some(canon) = canonical_of_spool(&n) {
                    n = canon;
                }
                let key = n.strip_prefix("job.")?.strip_suffix(".json")?;
                Some(unsafe_name(key))
            })
            .collect()
    }

    /// Keeps the outbox within `max` events: past it, the oldest node events go first (the
    /// service discovers nodes again), then the oldest RUNNING events (reconciliation sends
    /// RUNNING again for jobs still running), then the oldest events of ended jobs. Each drop
    /// is logged. Returns how many were dropped. Reads the whole outbox: for `flush`; the
    /// service keeps an [`Index`] and uses [`enforce_limit_in`](Self::enforce_limit_in).
    pub fn enforce_limit(&self, max: usize) -> usize {
        let mut ix = Index::default();
        let mut dropped = 0;
        loop {
            self.refresh(&mut ix);
            dropped += self.enforce_limit_in(&mut ix, max, usize::MAX);
            if ix.complete {
                return dropped;
            }
            ix.stamp = None;
        }
    }

    /// [`enforce_limit`](Self::enforce_limit) from what `ix` knows (no file read but the
    /// dropped ones'), dropping at most `at_most` events: the rest on the next call.
    pub fn enforce_limit_in(&self, ix: &mut Index, max: usize, at_most: usize) -> usize {
        let count = ix
            .files
            .saturating_sub(ix.known.values().filter(|k| k.newer).count());
        if count <= max {
            return 0;
        }
        let excess = (count - max).min(at_most);
        let victims = ix.oldest_by(excess, |_, k| !k.newer, |k| (k.class, k.seq));
        let mut dropped = 0;
        for name in victims {
            let Some(k) = ix.known.get(name.as_str()).copied() else {
                continue;
            };
            if self.remove_if_seq(&name, k.seq).unwrap_or(false) {
                log::warn!(
                    "outbox: over OutboxMaxEvents ({max}): dropped {} ({}) queued {} s ago",
                    unsafe_name(&name),
                    ["a node event", "a RUNNING", "a job's end"][usize::from(k.class)],
                    crate::timefmt::now_epoch() - k.queued_at
                );
                ix.known.remove(name.as_str());
                ix.files = ix.files.saturating_sub(1);
                dropped += 1;
            }
        }
        self.status
            .count(super::status::counter::DROPPED, dropped as u64);
        dropped
    }
}

/// An event file's name in the outbox (`*.json`, not a writer's temp file).
fn is_event_name(name: &std::ffi::OsStr) -> bool {
    let b = name.as_encoded_bytes();
    b.ends_with(b".json") && !b.starts_with(b".")
}

/// Why [`Queue::place`] did not place an event.
#[derive(Debug, PartialEq, Eq)]
enum PlaceError {
    /// The pending event changed since the chained file was made: make it again.
    Replaced,
    /// Nothing written: the lock was not had in time, or the outbox failed.
    Failed(String),
}
use PlaceError::{Failed, Replaced};

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

/// True when `old` (a pending or in-flight event, its chained end included) makes `ev`
/// stale: a higher rank, or the same rank queued later (of two events of one state, the
/// later one wins; the same event twice collapses into one).
/// A later job under the same id is never made stale by an earlier one's events, and an
/// earlier job's events are always stale beside a later one's ([`later_run`]).
fn outranks(old: &Event, ev: &Event) -> bool {
    let newest = old.then.as_deref().unwrap_or(old);
    if later_run(ev, newest) {
        return false;
    }
    later_run(newest, ev)
        || newest.rank > ev.rank
        || (newest.rank == ev.rank && newest.seq > ev.seq)
}

/// The end time an event carries (epoch seconds), where it is a job's end with one.
fn end_epoch(ev: &Event) -> Option<i64> {
    match &ev.item {
        Item::Job { job } if ev.rank.1 > 0 => job
            .end_time
            .as_deref()
            .and_then(|t| crate::timefmt::parse_user_time(t).ok()),
        _ => None,
    }
}

/// True when job event `ev` belongs to a run that started after `end` (an end time of its
/// key, epoch seconds): a job Slurm gave the same id later (after `MaxJobId` wrapped, or
/// after a slurmctld restart that lost its last state save). A run's own events never
/// start after its end (its RUNNING carries the prolog's start, or Slurm's once its nodes
/// booted, both before the end), so this never lets a RUNNING follow its own run's end.
fn started_after(ev: &Event, end: Option<i64>) -> bool {
    let Item::Job { job } = &ev.item else {
        return false;
    };
    let start = job
        .start_time
        .as_deref()
        .and_then(|t| crate::timefmt::parse_user_time(t).ok());
    matches!((start, end), (Some(s), Some(e)) if later_run_at(s, e))
}

/// True when a run that started at `start` (epoch seconds) is a later one than the run a
/// time `t` of its key belongs to (its end, or its start): `start` is more than
/// [`SAME_RUN_SECS`] after `t`.
pub fn later_run_at(start: i64, t: i64) -> bool {
    start > t + SAME_RUN_SECS
}

/// How far apart two times of one run may seem: Slurm 22.05's PrologSlurmctld has no
/// `SLURM_JOB_START_TIME`, so its record of a start is the hook's own clock, which a job
/// cancelled while its prolog starts has as its end too. A job Slurm gives the same id starts
/// at least `MinJobAge` after the earlier one's end (the id is free once its record is
/// purged); one that starts within this many seconds of it is taken for the same run.
pub const SAME_RUN_SECS: i64 = 10;

/// True when `a` is an event of a later run of its key than `b`: a higher restart count
/// (a requeue), or the same count and `b` an end that ended before `a`'s run started (a
/// later job under the same id: see [`started_after`]).
fn later_run(a: &Event, b: &Event) -> bool {
    a.rank.0 > b.rank.0 || (a.rank.0 == b.rank.0 && started_after(a, end_epoch(b)))
}

/// What becomes of `ev` when it meets its key's pending event `cur`.
enum Merge {
    /// Dropped: `cur` is later.
    Superseded,
    /// `cur` (a RUNNING) with `ev` (its run's end) chained after it.
    Chain(Box<Event>),
    /// `ev` replaces `cur`.
    Replace,
}

fn merge(cur: Option<&Event>, ev: &Event) -> Merge {
    match cur {
        Some(old) if outranks(old, ev) => Merge::Superseded,
        Some(old) if chains_after(old, ev) => {
            let mut both = old.clone();
            both.then = Some(Box::new(ev.clone()));
            Merge::Chain(Box::new(both))
        }
        _ => Merge::Replace,
    }
}

/// How a handed-in file's name ends ([`Queue::hand_in`]): a `%` followed by no two hex digits
/// never appears in a key's file name ([`super::durable::safe_name`]), so a pending file of a
/// key is never taken for one.
const SPOOL_MARK: &str = ".%.json";

/// True for the name of a file a writer handed in (`Queue::hand_in`):
/// `<kind>.<key>.<seq>.<pid>.<n>.%.json`.
pub fn is_spool_name(name: &str) -> bool {
    canonical_of_spool(name).is_some()
}

/// A new handed-in file's name for `item`'s key, unique on this host: the event's `seq`, the
/// process id and a counter of this process.
fn spool_name(item: &Item, seq: u128) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let canon = item.file_name();
    let stem = canon.strip_suffix(".json").unwrap_or(&canon);
    format!(
        "{stem}.{seq}.{}.{}{SPOOL_MARK}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The pending file's name of the key a handed-in file belongs to; `None` for any other name.
fn canonical_of_spool(name: &str) -> Option<String> {
    if name.starts_with('.') {
        return None;
    }
    let stem = name.strip_suffix(SPOOL_MARK)?;
    let mut parts = stem.rsplitn(4, '.');
    let numbers = [parts.next()?, parts.next()?, parts.next()?];
    let head = parts.next()?;
    let numeric = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    (numbers.iter().all(|p| numeric(p)) && head.contains('.')).then(|| format!("{head}.json"))
}

/// `resolve_view` of the outbox directory `dir` as JSON objects, oldest first; a file that
/// holds JSON but no event of this cvslurm's formats (a newer one) is listed as it is, one
/// that cannot be read now (a drainer took it) is left out. For tests and tools.
pub fn outbox_view(dir: &Path) -> Vec<serde_json::Value> {
    let (mut events, mut other) = (Vec::new(), Vec::new());
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if !is_event_name(e.file_name().as_os_str()) {
            continue;
        }
        let Ok(bytes) = durable::read_file(&e.path()) else {
            continue;
        };
        match decode_event(&bytes) {
            Ok(ev) => events.push((name, ev)),
            Err(_) => {
                if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) {
                    let seq = v["seq"].as_u64().map_or(0, u128::from);
                    other.push((seq, v));
                }
            }
        }
    }
    let mut all: Vec<(u128, serde_json::Value)> = resolve_view(events)
        .into_iter()
        .filter_map(|ev| Some((ev.seq, serde_json::to_value(&ev).ok()?)))
        .collect();
    all.extend(other);
    all.sort_by_key(|(seq, _)| *seq);
    all.into_iter().map(|(_, v)| v).collect()
}

/// The outbox as its drainer will send it, from the files' names and events (a key's pending
/// file, and the files handed in for it, not taken in yet): one event per key, each
/// handed-in event applied in the order of its rank, then of its queue time, as
/// `Queue::fold` does (the checks against what is in flight or delivered aside). Oldest
/// first. For tests and tools that look at an outbox from outside.
pub fn resolve_view(files: Vec<(String, Event)>) -> Vec<Event> {
    let mut keys: std::collections::BTreeMap<String, (Option<Event>, Vec<Event>)> =
        Default::default();
    for (name, ev) in files {
        let slot = keys.entry(ev.item.file_name()).or_default();
        if is_spool_name(&name) {
            slot.1.push(ev);
        } else {
            slot.0 = Some(ev);
        }
    }
    let mut out = Vec::new();
    for (_, (mut cur, mut handed)) in keys {
        handed.sort_by_key(|e| (e.rank, e.seq));
        for ev in handed {
            match merge(cur.as_ref(), &ev) {
                Merge::Superseded => {}
                Merge::Chain(both) => cur = Some(*both),
                Merge::Replace => cur = Some(ev),
            }
        }
        out.extend(cur);
    }
    out.sort_by_key(|e| e.seq);
    out
}

/// [`write_tmp_at`] for an event file: its modification time is its queue time (`queued_at`),
/// which `cvslurm status` reads without opening the file ([`Queue::depth`]).
fn write_event(
    path: &Path,
    bytes: &[u8],
    queued_at: i64,
    owner: Option<(u32, u32)>,
    sync: bool,
) -> Result<PathBuf, String> {
    let at = UNIX_EPOCH + Duration::from_secs(queued_at.max(0).unsigned_abs());
    write_tmp_at(path, bytes, owner, sync, Some(at))
}

/// Sets an event file's modification time to its queue time (see [`write_event`]).
fn set_queue_time(path: &Path, queued_at: i64) {
    if let Ok(f) = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
    {
        let _ = f.set_modified(UNIX_EPOCH + Duration::from_secs(queued_at.max(0).unsigned_abs()));
    }
}

/// The event in `path`; `None` when it cannot be read.
fn read_event(path: &Path) -> Option<Result<Event, Undecodable>> {
    let bytes = durable::read_file(path).ok()?;
    Some(decode_event(&bytes))
}

/// Logs `what` about an outbox file the first time this process meets it (the service looks
/// at the outbox every few seconds).
fn report_once(path: &Path, what: &str) {
    use std::sync::{Mutex, OnceLock};
    static SEEN: OnceLock<Mutex<std::collections::HashSet<PathBuf>>> = OnceLock::new();
    let first = SEEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(path.to_path_buf());
    if first {
        log::error!("outbox file {}: {what}", path.display());
    }
}

/// Logs an outbox file of a newer format the first time this process meets it (the service
/// reads the outbox every few seconds).
fn report_newer(path: &Path, v: u64) {
    use std::sync::{Mutex, OnceLock};
    static SEEN: OnceLock<Mutex<std::collections::HashSet<PathBuf>>> = OnceLock::new();
    let first = SEEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(path.to_path_buf());
    if first {
        log::error!(
            "outbox file {}: {}; not sent",
            path.display(),
            Undecodable::Newer(v)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloudvision::payload::{JobConfig, JobState, Key};
    use crate::state::StateDir;

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
        let sd = StateDir::new(&d);
        let ob = &sd.queue;
        let run = || Event::new(job("7@c", JobState::Running), (0, 0));
        // Not reported by a hook (no start record): not resent.
        assert_eq!(ob.enqueue_resend(&run()), Ok(false));
        sd.starts.save("7@c", 100).unwrap();
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
        // Delivering an end forgets the start record; one a prolog wrote again meanwhile
        // (or an epilog still on its way) does not let a RUNNING follow the end either.
        assert!(sd.starts.started_jobs().is_empty());
        sd.starts.save("7@c", 100).unwrap();
        assert_eq!(ob.enqueue_resend(&run()), Ok(false));
        assert!(ob.pending().is_empty());
        // Only RUNNING is resent.
        assert!(ob.enqueue_resend(&end).is_err());
        let _ = fs::remove_dir_all(&d);
    }

    /// A resend with Slurm's start follows [`Queue::enqueue_resend`]'s rules, and the start
    /// record takes that start only when the resend is queued.
    #[test]
    fn a_resend_with_slurms_start_records_it() {
        let d = tmpdir("resend-start");
        let sd = StateDir::new(&d);
        let ob = &sd.queue;
        let run = || Event::new(job("7@c", JobState::Running), (1, 0));
        assert_eq!(ob.enqueue_resend_with_start(&run(), 130, 1), Ok(false));
        assert_eq!(sd.starts.load_run("7@c"), None);
        sd.starts.save_run("7@c", 100, 1).unwrap();
        assert_eq!(ob.enqueue_resend_with_start(&run(), 130, 1), Ok(true));
        assert_eq!(sd.starts.load_run("7@c"), Some((130, 1)));
        // Its RUNNING pending: not queued, the record left alone.
        assert_eq!(ob.enqueue_resend_with_start(&run(), 140, 1), Ok(false));
        assert_eq!(sd.starts.load_run("7@c"), Some((130, 1)));
        assert_eq!(ob.pending().len(), 1);
        let _ = fs::remove_dir_all(&d);
    }

    /// A job record of `id` in `state` with Slurm's start and end (epoch seconds).
    fn job_at(id: &str, state: JobState, start: i64, end: Option<i64>) -> Item {
        let mut item = job(id, state);
        if let Item::Job { job } = &mut item {
            job.start_time = crate::timefmt::format_epoch(start);
            job.end_time = end.and_then(crate::timefmt::format_epoch);
        }
        item
    }

    /// A later job under the same id (MaxJobId wrapped, or a slurmctld restart lost its last
    /// state save) is told apart from the earlier one by its start, after the earlier one's
    /// end (by more than [`SAME_RUN_SECS`]): its RUNNING goes out although that end was
    /// delivered or is pending, and the earlier job's events never follow it. A RUNNING of
    /// the earlier job (its start before its end, at it, or within the margin) stays dropped.
    #[test]
    fn a_later_job_under_the_same_id_is_told_apart_by_its_start() {
        let d = tmpdir("reuse");
        let sd = StateDir::new(&d);
        let ob = &sd.queue;
        let q = Look::Quick;
        let take_in = |ev: &Event| {
            ob.hand_in(ev, true, q, || {}).unwrap();
            ob.fold_all();
        };
        // The first job: started at 100, ended at 110, its end delivered.
        let a_end = Event::new(job_at("7@c", JobState::Completed, 100, Some(110)), (0, 1));
        ob.enqueue(&a_end).unwrap();
        let t = ob.take(&a_end).unwrap().unwrap();
        ob.finish(&t, Finish::Delivered).unwrap();
        for late in [100, 110, 110 + SAME_RUN_SECS] {
            let a_run = Event::new(job_at("7@c", JobState::Running, late, None), (0, 0));
            take_in(&a_run);
            assert!(
                ob.pending().is_empty(),
                "the first job's RUNNING (start {late}) after its end"
            );
        }
        // The second job under id 7, started at 120: its prolog records it, its RUNNING goes.
        sd.starts.save_run("7@c", 121, 0).unwrap();
        let b_run = Event::new(job_at("7@c", JobState::Running, 121, None), (0, 0));
        take_in(&b_run);
        assert_eq!(ob.pending(), vec![b_run.clone()]);
        assert!(
            ob.follows_an_earlier_job(&b_run),
            "its record is deleted first"
        );
        assert!(!ob.follows_an_earlier_job(&Event::new(
            job_at("7@c", JobState::Running, 120, None),
            (0, 0)
        )));
        // The first job's end again (a late hook, a reconciliation of it): stale beside the
        // second job, pending or not.
        let a_again = Event::new(job_at("7@c", JobState::Failed, 100, Some(110)), (0, 1));
        take_in(&a_again);
        assert_eq!(ob.pending(), vec![b_run.clone()]);
        let t = ob.take(&b_run).unwrap().unwrap();
        ob.finish(&t, Finish::Delivered).unwrap();
        take_in(&a_again);
        assert!(
            ob.pending().is_empty(),
            "the first job's end after the second's RUNNING"
        );
        assert_eq!(
            sd.starts.load_run("7@c"),
            Some((121, 0)),
            "the second job's record stays"
        );
        // A resend of the second job's RUNNING is not stopped by the first job's end.
        assert_eq!(ob.enqueue_resend(&b_run), Ok(true));
        // The second job's end chains after it, and a pending end of the first job is
        // replaced by a RUNNING of a third one (its start after that end).
        let b_end = Event::new(job_at("7@c", JobState::Completed, 121, Some(130)), (0, 1));
        take_in(&b_end);
        let p = ob.pending();
        assert_eq!((p.len(), p[0].then.as_deref()), (1, Some(&b_end)));
        let t = ob.take(&p[0]).unwrap().unwrap();
        ob.finish(&t, Finish::Delivered).unwrap();
        let t = ob.take(&b_end).unwrap().unwrap();
        ob.finish(&t, Finish::Delivered).unwrap();
        assert_eq!(sd.starts.load_run("7@c"), None, "forgotten with its end");
        let c_run = Event::new(job_at("7@c", JobState::Running, 141, None), (0, 0));
        take_in(&c_run);
        assert_eq!(ob.pending(), vec![c_run]);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn later_state_wins_and_stale_running_is_dropped() {
        let d = tmpdir("wins");
        let sd = StateDir::new(&d);
        let ob = &sd.queue;
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
        let sd = StateDir::new(&d);
        let ob = &sd.queue;
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
        let sd = StateDir::new(&d);
        let ob = &sd.queue;
        let good = Event::new(job("1@c", JobState::Running), (0, 0));
        ob.enqueue(&good).unwrap();
        // Not readable as a file now (here: a directory where a file was): kept, not rejected.
        fs::create_dir(d.join(OUTBOX).join("job.2@c.json")).unwrap();
        // A file a drainer moved away between the listing and the read.
        assert!(matches!(
            read_event_checked(&d.join(OUTBOX).join("job.3@c.json")),
            ReadOutcome::Transient(_)
        ));
        assert_eq!(ob.pending(), vec![good.clone()]);
        assert!(d.join(OUTBOX).join("job.2@c.json").is_dir());
        assert_eq!(ob.rejected_count(), 0);
        // A whole file that is not an event is rejected.
        fs::write(d.join(OUTBOX).join("job.4@c.json"), b"{\"seq\": 1, garbage").unwrap();
        assert_eq!(ob.pending(), vec![good]);
        assert_eq!(ob.rejected_count(), 1);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn one_drainer_at_a_time() {
        let d = tmpdir("drainer");
        let sd = StateDir::new(&d);
        let ob = &sd.queue;
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
        let sd = StateDir::new(&d);
        let ob = &sd.queue;
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
            fs::read_dir(d.join(OUTBOX)).unwrap().count(),
            1,
            "no temp file left"
        );
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_end_waits_behind_its_pending_running() {
        let d = tmpdir("chain");
        let sd = StateDir::new(&d);
        let ob = &sd.queue;
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
    fn limit_drops_nodes_then_running_then_oldest_ends() {
        let d = tmpdir("limit");
        let sd = StateDir::new(&d);
        let ob = &sd.queue;
        let node = |n: &str| Item::NodeDelete {
            name: n.into(),
            location: None,
        };
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
        sd.starts.save("5@c", 100).unwrap();
        let started = sd.starts.started_jobs();
        assert_eq!(started.len(), 1);
        assert_eq!((started[0].0.as_str(), started[0].1), ("5@c", 100));
        fs::remove_dir_all(&d).unwrap();
    }

    /// The service's look at the outbox reads only what is new or
    /// changed since the last one, forgets what vanished, and drops over the limit a bounded
    /// number at a time from what it knows.
    #[test]
    fn refresh_reads_only_new_or_changed_files() {
        let d = tmpdir("index");
        let sd = StateDir::new(&d);
        let ob = &sd.queue;
        for i in 1..=3 {
            ob.enqueue(&Event::new(
                job(&format!("{i}@c"), JobState::Running),
                (0, 0),
            ))
            .unwrap();
        }
        // The bound README states: 80 bytes an entry, a map at most ~2.3 buckets per entry
        // just after it grows, plus the name's own allocation.
        assert!(std::mem::size_of::<(Box<str>, Known)>() <= 80);
        let mut ix = Index::default();
        let new = ob.refresh(&mut ix);
        assert_eq!((new.len(), ix.reads), (3, 3));
        assert_eq!(
            new,
            ["job.1@c.json", "job.2@c.json", "job.3@c.json"],
            "oldest first"
        );
        // Nothing new: nothing read, whether the directory is listed again or not.
        assert!(ob.refresh(&mut ix).is_empty());
        ix.stamp = None;
        assert!(ob.refresh(&mut ix).is_empty());
        assert_eq!(ix.reads, 3);
        // One new event, one replaced (a later state of its key, chained): those two read.
        ob.enqueue(&Event::new(job("4@c", JobState::Running), (0, 0)))
            .unwrap();
        ob.enqueue(&Event::new(job("2@c", JobState::Completed), (0, 1)))
            .unwrap();
        ix.stamp = None;
        let new = ob.refresh(&mut ix);
        assert_eq!(new, ["job.2@c.json", "job.4@c.json"]);
        assert_eq!(ix.reads, 5);
        // A file rewritten with its old inode number back (here: the index made to believe
        // the file differs) is seen by the next pass that tells every file by its stat.
        ix.known.get_mut("job.3@c.json").unwrap().id.1 = 0;
        ix.stamp = None;
        assert!(ob.refresh(&mut ix).is_empty());
        ix.stamp = None;
        ix.stat_all_at = None;
        assert_eq!(ob.refresh(&mut ix), ["job.3@c.json"]);
        assert_eq!(ix.reads, 6);
        // What the service hands out is read as it is now.
        assert!(ob.read_pending("job.2@c.json").unwrap().then.is_some());
        // Taken (sent): forgotten. Garbage: moved to rejected/, not kept.
        let one = ob.read_pending("job.1@c.json").unwrap();
        ob.take(&one).unwrap().unwrap();
        fs::write(d.join(OUTBOX).join("job.9@c.json"), b"garbage").unwrap();
        ix.stamp = None;
        assert!(ob.refresh(&mut ix).is_empty());
        assert_eq!(ix.files, 3);
        assert_eq!(ob.rejected_count(), 1);
        let (oldest, more) = ix.oldest(2, |_, _| true);
        // A chained file keeps its RUNNING's seq.
        assert_eq!(oldest, ["job.2@c.json", "job.3@c.json"]);
        assert!(more);
        // The index's summary is what a listing finds (the service's metrics use it).
        assert_eq!(ix.summary(), Some(ob.depth_since()));
        assert_eq!(ix.summary().unwrap().0, 3);
        // Over the limit: at most `at_most` dropped per call, from the index.
        let reads = ix.reads;
        assert_eq!(ob.enforce_limit_in(&mut ix, 1, 1), 1);
        assert_eq!(ob.enforce_limit_in(&mut ix, 1, 1), 1);
        assert_eq!(ob.enforce_limit_in(&mut ix, 1, 1), 0);
        assert_eq!(ix.reads, reads);
        // The oldest went first.
        assert_eq!(ob.pending().len(), 1);
        assert_eq!(ix.summary(), Some(ob.depth_since()));
        // A pass that left files unread counts them by their times; without those, no summary.
        ix.complete = false;
        ix.unread = Some(Some(1));
        assert_eq!(ix.summary(), Some((1, Some(1))));
        ix.unread = None;
        assert_eq!(ix.summary(), None);
        // Nor one with a file of a newer format (its queue time is unknown).
        fs::write(
            d.join(OUTBOX).join("job.8@c.json"),
            format!(r#"{{"v":{}}}"#, super::super::event::EVENT_FORMAT + 1),
        )
        .unwrap();
        ix.stamp = None;
        ob.refresh(&mut ix);
        assert!(ix.complete());
        assert_eq!(ix.summary(), None);
        assert_eq!(ob.pending()[0].item.describe(), "job 4@c RUNNING");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn root_keeps_state_dir_owned_by_its_owner() {
        use crate::state::layout::{JOBS, SERVICE_STATUS, SERVICE_STATUS_LOCK, VERIFY};
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
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
            .create(d.join(JOBS))
            .unwrap();
        let sd = StateDir::new(&d);
        let ob = &sd.queue;
        ob.enqueue(&Event::new(job("1@c", JobState::Running), (0, 0)))
            .unwrap();
        sd.starts.save("1@c", 5).unwrap();
        let Item::Job { job: j } = job("1@c", JobState::Completed) else {
            unreachable!()
        };
        sd.marks.mark_for_verification(&j, 0).unwrap();
        sd.status.record_drain(&crate::state::status::Drained {
            delivered: 1,
            ..Default::default()
        });
        for p in [
            OUTBOX,
            INFLIGHT,
            REJECTED,
            JOBS,
            VERIFY,
            OUTBOX_LOCK,
            SERVICE_STATUS,
            SERVICE_STATUS_LOCK,
            &format!("{OUTBOX}/job.1@c.json"),
            &format!("{JOBS}/1@c"),
            &format!("{VERIFY}/1@c"),
        ] {
            assert_eq!(fs::metadata(d.join(p)).unwrap().uid(), 65534, "{p}");
        }
        fs::remove_dir_all(&d).unwrap();
    }

    /// The files of one key handed in and not taken in yet.
    fn handed(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(d.join(OUTBOX))
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|n| is_spool_name(n))
            .collect();
        v.sort();
        v
    }

    /// A writer hands its event in while other processes hold every lock of the outbox
    /// (`outbox.lock`, `drainer.lock`): it takes none, so it returns (a lock taken here would
    /// never be released: the test would hang).
    #[test]
    fn a_hand_in_takes_no_lock() {
        let d = tmpdir("lockfree");
        let sd = StateDir::new(&d);
        let ob = &sd.queue;
        let drainer = ob.drainer_lock(false).unwrap().unwrap();
        let held = ob.lock().unwrap();
        let run = Event::new(job("1@c", JobState::Running), (0, 0));
        let far = Instant::now() + Duration::from_secs(3600);
        let mut placed = false;
        let (r, own) = ob
            .hand_in(&run, true, Look::Full(far), || placed = true)
            .unwrap();
        assert!(placed);
        assert_eq!(r, Enqueued::Queued { busy: false });
        let end = Event::new(job("1@c", JobState::Completed), (0, 1));
        let (r, _) = ob.hand_in(&end, false, Look::Full(far), || {}).unwrap();
        assert_eq!(r, Enqueued::Chained, "the RUNNING handed in before waits");
        let (r, _) = ob.hand_in(&end, false, Look::Quick, || {}).unwrap();
        assert_eq!(
            r,
            Enqueued::Queued { busy: false },
            "a quick look sees only the pending file"
        );
        assert_eq!(handed(&d).len(), 3, "one file per event, none replaced");
        assert!(own.starts_with(d.join(OUTBOX)));
        drop(held);
        drop(drainer);
        fs::remove_dir_all(&d).unwrap();
    }

    /// For one key, the drainer resolves what was handed in: the later state wins, an end
    /// is chained behind its run's RUNNING whatever order the files came in, identical
    /// duplicates collapse, a RUNNING never follows its run's end (pending, in flight or
    /// delivered), and superseded files are deleted by the drainer.
    #[test]
    fn the_drainer_resolves_order_and_supersession() {
        let d = tmpdir("fold");
        let sd = StateDir::new(&d);
        let ob = &sd.queue;
        let q = Look::Quick;
        // Two processes' events of one key, the end's file written first: both kept until
        // taken in, then the RUNNING goes first and the end after it.
        let run = Event::new(job("1@c", JobState::Running), (0, 0));
        let end = Event::new(job("1@c", JobState::Completed), (0, 1));
        ob.hand_in(&end, true, q, || {}).unwrap();
        ob.hand_in(&run, true, q, || {}).unwrap();
        assert_eq!(handed(&d).len(), 2);
        assert!(
            ob.pending().is_empty(),
            "nothing pending before it is taken in"
        );
        assert!(ob.pending_job_keys().contains("1@c"));
        let view = resolve_view(
            handed(&d)
                .into_iter()
                .map(|n| {
                    let ev = read_event(&d.join(OUTBOX).join(&n)).unwrap().unwrap();
                    (n, ev)
                })
                .collect(),
        );
        assert_eq!(ob.fold_all(), ["job.1@c.json"]);
        assert!(handed(&d).is_empty());
        let p = ob.pending();
        assert_eq!(p, view, "the view from outside is what the drainer makes");
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].seq, p[0].then.as_deref()), (run.seq, Some(&end)));
        // The same end again (a hook that queued twice), and an older end of the same run:
        // one end stays, the latest.
        let older = Event {
            seq: end.seq - 1,
            ..end.clone()
        };
        ob.hand_in(&end, true, q, || {}).unwrap();
        assert_eq!(
            ob.hand_in(&older, true, q, || {}).unwrap().0,
            Enqueued::Superseded
        );
        ob.fold_all();
        assert!(
            handed(&d).is_empty(),
            "the drainer deletes what is superseded"
        );
        assert_eq!(ob.pending()[0].then.as_deref(), Some(&end));
        // A late RUNNING of that run: superseded by the chained end.
        let late = Event::new(job("1@c", JobState::Running), (0, 0));
        assert_eq!(
            ob.hand_in(
                &late,
                true,
                Look::Full(Instant::now() + Duration::from_secs(60)),
                || {}
            )
            .unwrap()
            .0,
            Enqueued::Superseded
        );
        assert!(ob.fold_all().is_empty());
        // Delivered: the RUNNING, then the end; a RUNNING of that run handed in after the
        // end went out is dropped, in flight or delivered.
        let t = ob.take(&ob.pending()[0]).unwrap().unwrap();
        ob.finish(&t, Finish::Delivered).unwrap();
        let e = ob.pending().remove(0);
        assert_eq!(e, end);
        let t = ob.take(&e).unwrap().unwrap();
        let late = Event::new(job("1@c", JobState::Running), (0, 0));
        assert_eq!(
            ob.hand_in(&late, true, q, || {}).unwrap().0,
            Enqueued::Superseded,
            "its end is in flight"
        );
        ob.fold_all();
        assert!(ob.pending().is_empty() && handed(&d).is_empty());
        ob.finish(&t, Finish::Delivered).unwrap();
        ob.hand_in(&late, true, q, || {}).unwrap();
        assert!(ob.fold_all().is_empty(), "its end was delivered");
        assert!(ob.pending().is_empty() && handed(&d).is_empty());
        // Taken in by a look of the service: the handed-in file of a chained end stays until
        // the chained file is synced.
        let run2 = Event::new(job("2@c", JobState::Running), (0, 0));
        ob.enqueue(&run2).unwrap();
        let end2 = Event::new(job("2@c", JobState::Failed), (0, 1));
        ob.hand_in(&end2, false, q, || {}).unwrap();
        let (placed, chained) = ob.take_in(&handed(&d));
        assert_eq!(
            (placed, chained.clone()),
            (vec!["job.2@c.json".to_string()], handed(&d))
        );
        assert_eq!(
            ob.pending_of(&end2.item).unwrap().then.as_deref(),
            Some(&end2)
        );
        ob.after_take_in(&["job.2@c.json".to_string()], &chained);
        assert!(handed(&d).is_empty());
        // The job's next run starts anew.
        let rerun = Event::new(job("1@c", JobState::Running), (1, 0));
        ob.hand_in(&rerun, true, q, || {}).unwrap();
        assert_eq!(ob.fold_all(), ["job.1@c.json"]);
        assert_eq!(ob.pending_of(&rerun.item), Some(rerun));
        fs::remove_dir_all(&d).unwrap();
    }

    /// An outbox a previous release left (one file per key, written under `outbox.lock`) is
    /// read and sent as it is, and what hooks hand in after the upgrade goes behind it.
    #[test]
    fn an_outbox_of_the_previous_release_is_taken_over() {
        let d = tmpdir("upgrade");
        let sd = StateDir::new(&d);
        sd.ensure_dirs().unwrap();
        let old_run = r#"{"seq":1714557600000000000,"rank":[0,0],"queued_at":1714557600,"attempts":0,"kind":"job","job":{"key":{"id":"4242@hpc-cluster-west"},"name":"train","state":"JOB_STATE_RUNNING","start_time":"2024-05-01T10:00:00Z","nodes":{"values":["gpu-node-1"]}}}"#;
        fs::write(d.join(OUTBOX).join(UNVERSIONED_NAME), old_run).unwrap();
        let Item::Job { job: mut j } = job("4242@hpc-cluster-west", JobState::Completed) else {
            unreachable!()
        };
        j.start_time = Some("2024-05-01T10:00:00Z".into());
        let end = Event::new(Item::Job { job: j }, (0, 1));
        let (r, _) = sd.queue.hand_in(&end, true, Look::Quick, || {}).unwrap();
        assert_eq!(r, Enqueued::Chained);
        sd.queue.fold_all();
        let p = sd.queue.pending();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].item.describe(), "job 4242@hpc-cluster-west RUNNING");
        assert_eq!(p[0].then.as_deref(), Some(&end));
        fs::remove_dir_all(&d).unwrap();
    }

    /// The service's index counts what was handed in (its depth is what a listing finds),
    /// hands those files to the drainer to take in, and reads what they became.
    #[test]
    fn the_index_counts_handed_in_files_and_reads_what_they_became() {
        let d = tmpdir("index-handed");
        let sd = StateDir::new(&d);
        let ob = &sd.queue;
        ob.enqueue(&Event::new(job("1@c", JobState::Running), (0, 0)))
            .unwrap();
        ob.hand_in(
            &Event::new(job("2@c", JobState::Running), (0, 0)),
            false,
            Look::Quick,
            || {},
        )
        .unwrap();
        let mut ix = Index::default();
        assert_eq!(ob.refresh(&mut ix), ["job.1@c.json"]);
        assert_eq!(ix.handed_in().len(), 1);
        assert_eq!(ix.summary(), Some(ob.depth_since()));
        assert_eq!(ix.summary().unwrap().0, 2);
        let (oldest, _) = ix.oldest(10, |_, _| true);
        assert_eq!(
            oldest,
            ["job.1@c.json"],
            "a handed-in file is never sent as it is"
        );
        let handed = ix.handed_in().to_vec();
        let (placed, chained) = ob.take_in(&handed);
        assert_eq!(placed, ["job.2@c.json"]);
        assert!(chained.is_empty());
        assert_eq!(ob.note_taken_in(&mut ix, &placed), ["job.2@c.json"]);
        assert!(ix.handed_in().is_empty());
        assert_eq!(ix.summary(), Some(ob.depth_since()));
        ob.after_take_in(&placed, &chained);
        ix.stamp = None;
        assert!(
            ob.refresh(&mut ix).is_empty(),
            "nothing new: the index knows it"
        );
        assert!(ix.handed_in().is_empty());
        assert_eq!(ix.summary(), Some(ob.depth_since()));
        assert_eq!(ix.summary().unwrap().0, 2);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn handed_in_names_are_never_a_keys_pending_file() {
        for (name, canon) in [
            ("job.1@c.17.42.0.%.json", Some("job.1@c.json")),
            ("job.1@a.b.17.42.0.%.json", Some("job.1@a.b.json")),
            ("node.n%2F1.17.42.3.%.json", Some("node.n%2F1.json")),
            ("job.1@c.json", None),
            ("job.1@c.17.42.%.json", None),
            ("job.17.42.0.%.json", None),
            (".tmp.1.2.job.1@c.17.42.0.%.json", None),
            ("job.1@c.1x.42.0.%.json", None),
            (".%.json", None),
        ] {
            assert_eq!(canonical_of_spool(name).as_deref(), canon, "{name}");
        }
        let item = job("1@a.17.42.0", JobState::Running);
        let n = spool_name(&item, 5);
        assert_eq!(canonical_of_spool(&n), Some(item.file_name()));
        assert!(!is_spool_name(&item.file_name()));
        // A key's own `%` is always written as `%25`: no key's file ends like a handed-in one.
        let tricky = job("1@c.1.2.3.%", JobState::Running).file_name();
        assert!(!is_spool_name(&tricky), "{tricky}");
    }

    /// A real event file as cvslurm wrote it before events carried a format: a RUNNING with
    /// its provisional end chained after it (written by `Queue::enqueue` at commit fe59a44).
    const UNVERSIONED: &str = r#"{"seq":1714557600000000000,"rank":[0,0],"queued_at":1714557600,"attempts":0,"then":{"seq":1714557700000000000,"rank":[0,1],"queued_at":1714557700,"attempts":0,"resolve":{"exit":[0,0],"restart_count":0,"start_known":true,"end_known":false},"kind":"job","job":{"key":{"id":"4242@hpc-cluster-west"},"name":"train","state":"JOB_STATE_COMPLETED","start_time":"2024-05-01T10:00:00Z","nodes":{"values":["gpu-node-1"]}}},"kind":"job","job":{"key":{"id":"4242@hpc-cluster-west"},"name":"train","state":"JOB_STATE_RUNNING","start_time":"2024-05-01T10:00:00Z","nodes":{"values":["gpu-node-1"]}}}"#;
    const UNVERSIONED_NAME: &str = "job.4242@hpc-cluster-west.json";

    #[test]
    fn an_event_without_a_format_is_read_as_format_1() {
        let d = tmpdir("format1");
        let sd = StateDir::new(&d);
        sd.ensure_dirs().unwrap();
        let path = d.join(OUTBOX).join(UNVERSIONED_NAME);
        fs::write(&path, UNVERSIONED).unwrap();
        let p = sd.queue.pending();
        assert_eq!(p.len(), 1);
        let run = &p[0];
        assert_eq!((run.v, run.seq, run.rank), (1, 1714557600000000000, (0, 0)));
        assert_eq!(run.item.describe(), "job 4242@hpc-cluster-west RUNNING");
        let end = run.then.as_deref().unwrap();
        assert_eq!(end.v, 1);
        assert_eq!(end.item.describe(), "job 4242@hpc-cluster-west COMPLETED");
        assert_eq!(end.resolve.unwrap().exit, Some((0, 0)));
        // Sent like any other: the end becomes the pending event, now with its format.
        let t = sd.queue.take(run).unwrap().unwrap();
        sd.queue.finish(&t, Finish::Delivered).unwrap();
        assert_eq!(sd.queue.pending(), vec![end.clone()]);
        let v: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(v["v"], 1);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn every_event_is_written_with_its_format() {
        let d = tmpdir("format-written");
        let sd = StateDir::new(&d);
        let run = Event::new(job("1@c", JobState::Running), (0, 0));
        assert_eq!(run.v, EVENT_FORMAT);
        sd.queue.enqueue(&run).unwrap();
        sd.queue
            .enqueue(&Event::new(job("1@c", JobState::Failed), (0, 1)))
            .unwrap();
        let raw = |dir: &str| -> serde_json::Value {
            let p = d.join(dir).join("job.1@c.json");
            serde_json::from_slice(&fs::read(p).unwrap()).unwrap()
        };
        let v = raw(OUTBOX);
        assert_eq!(v["v"], EVENT_FORMAT);
        assert_eq!(v["then"]["v"], EVENT_FORMAT, "the chained end too");
        let t = sd.queue.take(&run).unwrap().unwrap();
        sd.queue
            .finish(&t, Finish::Reject("HTTP 400".into()))
            .unwrap();
        assert_eq!(raw(REJECTED)["v"], EVENT_FORMAT);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_event_of_a_newer_format_is_left_in_place_and_not_sent() {
        let d = tmpdir("format-newer");
        let sd = StateDir::new(&d);
        sd.ensure_dirs().unwrap();
        // The fixture as a newer cvslurm might write it: same shape, and a changed one.
        let same_shape = UNVERSIONED.replacen('{', r#"{"v":2,"#, 1);
        let new_shape = r#"{"v":7,"what":{"job":"5@c"}}"#;
        assert_eq!(
            decode_event(same_shape.as_bytes()),
            Err(Undecodable::Newer(2))
        );
        assert_eq!(
            decode_event(new_shape.as_bytes()),
            Err(Undecodable::Newer(7))
        );
        assert!(matches!(
            decode_event(br#"{"v":1,"what":{}}"#),
            Err(Undecodable::Corrupt(_))
        ));
        let newer = d.join(OUTBOX).join(UNVERSIONED_NAME);
        fs::write(&newer, &same_shape).unwrap();
        fs::write(d.join(OUTBOX).join("job.5@c.json"), new_shape).unwrap();
        let ok = Event::new(job("6@c", JobState::Running), (0, 0));
        sd.queue.enqueue(&ok).unwrap();
        // Not sent, not rejected, not counted, not dropped over the limit.
        assert_eq!(sd.queue.pending(), vec![ok.clone()]);
        assert_eq!(sd.queue.enforce_limit(0), 1);
        assert_eq!(sd.queue.rejected_count(), 0);
        // A later event of its key does not replace it (the hook sends that one itself).
        let later = Event::new(job("5@c", JobState::Completed), (0, 1));
        let err = sd.queue.enqueue(&later).unwrap_err();
        assert!(
            err.contains("format 7, written by a newer cvslurm"),
            "{err}"
        );
        // In flight when a newer drainer died: put back, never deleted.
        fs::rename(&newer, d.join(INFLIGHT).join(UNVERSIONED_NAME)).unwrap();
        assert_eq!(sd.queue.recover().unwrap(), 1);
        assert_eq!(fs::read_to_string(&newer).unwrap(), same_shape);
        assert_eq!(
            fs::read_to_string(d.join(OUTBOX).join("job.5@c.json")).unwrap(),
            new_shape
        );
        fs::remove_dir_all(&d).unwrap();
    }
}

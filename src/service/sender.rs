//! The service's sender: it owns the outbox while the service runs and delivers what the
//! hooks queue, so that the hooks themselves never wait for CloudVision or slurmctld.
//!
//! - A hook writes its event durably to the outbox, then sends one datagram to
//!   `StateDir/wake.sock`, a Unix datagram socket this sender has bound. A socket file that
//!   nobody has bound (the service died) refuses the datagram: the hook then sends itself.
//! - The dispatcher thread wakes on each datagram (and every few seconds regardless), takes
//!   in the files hooks handed in without a lock (renames: each becomes, or is chained into,
//!   its key's pending file, or is dropped as superseded; the sync thread syncs them after),
//!   reads only the outbox files new or rewritten since its last look (an in-memory [`Index`]), and
//!   hands the oldest pending events, at most [`HAND_OUT_AT_MOST`] a look (more when a look
//!   takes long: [`hand_out_limit`]), to
//!   `MaxConcurrentRequests` worker threads; it looks again as their queue runs low. The ends the
//!   epilogs queued go first to the settler thread, which asks slurmctld in one call how all
//!   of them ended ([`Engine::settle`]), fixes their records and hands them out: a RUNNING never
//!   waits behind that question, and the ends that come in while it is asked form the next
//!   batch.
//! - The workers share one client, so at most that many keep-alive TLS connections are open
//!   whatever the number of hooks. One key is never in two workers: a job's events go out in
//!   order. Each worker delivers with the one engine `flush` uses too ([`Engine::deliver_if`]:
//!   enrich, send, classify, finish); a kept event pauses every worker (growing backoff;
//!   429's `Retry-After` honoured).
//!
//! The sender holds the outbox's drainer lock for its whole life: in-flight events are its
//! own until it dies, and a `flush` beside it leaves them alone.

use super::engine::{record_drain, running_head, DrainReport, Engine, Outcome};
use super::leadership::Gate;
use crate::cloudvision::batch::retry_wait;
use crate::cloudvision::Client;
use crate::state::index::Index;
use crate::state::queue::{Event, Item};
use crate::state::wake::{bind, connect, socket_path, wake};
use crate::state::StateDir;
use std::collections::{HashSet, VecDeque};
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How often the dispatcher looks at the outbox even when nobody woke it.
pub const RESCAN_EVERY: Duration = Duration::from_secs(5);

/// The settler asks slurmctld once no end has come for this long (or at [`END_STATE_WAIT`]):
/// not in the middle of a burst of epilogs. Its question (every job's JSON) holds slurmctld's
/// job lock; asked while a wave of jobs ends, it would hold back the nodes' epilog-complete
/// messages and the epilogs' own completions together, and the order they then take decides
/// whether slurmctld schedules the freed CPUs at once (README, "Without EpilogSlurmctld").
pub const END_STATE_QUIET: Duration = Duration::from_millis(100);

/// The longest an end waits for a quiet moment before the settler asks anyway.
pub const END_STATE_WAIT: Duration = Duration::from_millis(1000);

/// The most events one scan hands to the workers, and the most ends it hands to the settler:
/// the rest wait in the outbox for the next scan, which comes as soon as the workers' queue
/// runs low. A scan that takes long (a listing of a large outbox: seconds at a million
/// events) hands out more, see [`hand_out_limit`].
pub const HAND_OUT_AT_MOST: usize = 1000;

/// The most events one scan hands to the workers however long scans take (each one held in
/// memory until sent: about 1 KB each, so at most about 20 MB).
pub const HAND_OUT_MOST: usize = 20_000;

/// How many events a scan hands to the workers when scans take `look`: enough for them to
/// stay busy at 4,000 events a second (32 connections at 8 ms) while the next scan runs, which
/// starts when the queue is down to a quarter; at least [`HAND_OUT_AT_MOST`], at most
/// [`HAND_OUT_MOST`]. Without it a million-event outbox drains at about 250 events a second
/// on 2 cores: one listing of the outbox (seconds) per 1,000 events.
pub fn hand_out_limit(look: Duration) -> usize {
    let per_look = usize::try_from(look.as_millis().saturating_mul(4 * 4)).unwrap_or(usize::MAX);
    per_look.clamp(HAND_OUT_AT_MOST, HAND_OUT_MOST)
}

/// The most events one scan drops to keep the outbox within `OutboxMaxEvents`.
pub const DROP_AT_MOST: usize = 1000;

/// The most events remembered as checked (see [`Sender::check_queued_before`]); past it the
/// memory is cleared, and what is still pending is asked about again (questions, not events,
/// are what it costs).
pub const CHECKED_AT_MOST: usize = 100_000;

/// The dispatcher's own state between scans.
struct Dispatch {
    /// What is known of the outbox: each scan reads only the files new or changed since.
    index: Index,
    /// The sync thread's queue.
    syncer: Sender_<Vec<String>>,
    /// The settler thread's queue: provisional ends to ask slurmctld about.
    settler: Sender_<Vec<Event>>,
    /// The checker thread's queue: events queued before this host's role changed.
    checker: Sender_<Vec<Event>>,
    /// How long recent scans took (the longest, fading by a quarter per scan).
    look: Duration,
}

type Sender_<T> = std::sync::mpsc::Sender<T>;

/// What the dispatcher and the workers share.
struct Shared {
    state: Mutex<State>,
    ready: Condvar,
    stop: &'static AtomicBool,
    /// Settles, enriches, sends and finishes (the same for `flush`).
    engine: Engine,
    /// Job events queued before this (ns since the epoch; 0: none) are checked against Slurm
    /// before they are sent ([`Sender::check_queued_before`]).
    check_before: Arc<AtomicU64>,
}

#[derive(Default)]
struct State {
    /// Events handed out and not yet taken by a worker.
    queue: VecDeque<Event>,
    /// StateDir file names queued or being sent: one key is never in two workers.
    busy: HashSet<String>,
    /// StateDir file names of provisional ends with the settler (asked about once).
    settling: HashSet<String>,
    /// No worker starts a send before this (backoff, 429).
    paused_until: Option<Instant>,
    /// Failed passes in a row (for the backoff).
    failures: u32,
    /// A worker finished something: look at the outbox again.
    rescan: bool,
    /// The last scan left events in the outbox it could have handed out (over
    /// [`HAND_OUT_AT_MOST`]): look again once the workers' queue runs low.
    more: bool,
    /// The last scan left ends the settler could have had: look again once it is done.
    more_ends: bool,
    /// Events (file name, `seq`) queued before `check_before` and already checked, during
    /// the term `checked_term` (cleared when it changes).
    checked: HashSet<(String, u128)>,
    /// The leadership term `checked` belongs to ([`Gate::term`]).
    checked_term: Option<u128>,
    /// The term the dispatcher last saw.
    term: Option<u128>,
    /// The file names of RUNNINGs this host may not send, as it does not lead: not handed out
    /// again until the file changes or this host leads.
    held: HashSet<String>,
    /// The last check could not ask Slurm (said once until one succeeds).
    check_failing: bool,
    /// How many events the last scan could hand out ([`hand_out_limit`]; 0 before the first).
    limit: usize,
}

/// A running sender (threads end with the process, or when `stop` is set).
pub struct Sender {
    state_dir: PathBuf,
    /// Set when no dispatcher runs (any more, or yet: a standby sender).
    idle: Arc<AtomicBool>,
    /// The dispatcher's last [`OutboxSummary`].
    summary: Arc<Mutex<Option<OutboxSummary>>>,
    /// See [`Sender::check_queued_before`].
    check_before: Arc<AtomicU64>,
    /// Whether this host may send a RUNNING now (shared with the monitor).
    gate: Arc<Gate>,
}

/// The outbox as the dispatcher's index knew it at its last look: event files and the oldest
/// queue time (as [`crate::state::queue::Queue::depth_since`] gives them), and when.
#[derive(Debug, Clone, Copy)]
pub struct OutboxSummary {
    /// Event files and the oldest one's queue time (Unix seconds).
    pub depth: (usize, Option<i64>),
    /// When the index said so.
    pub at: Instant,
}

/// How often the dispatcher works out its [`OutboxSummary`] (a pass over the index) and
/// records it in `service-status.json` for `status`.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(5);

fn summary_now(
    idle: &AtomicBool,
    summary: &Mutex<Option<OutboxSummary>>,
) -> Option<(usize, Option<i64>)> {
    if idle.load(Ordering::Relaxed) {
        return None;
    }
    let s = (*summary.lock().unwrap_or_else(|e| e.into_inner()))?;
    if s.at.elapsed() > SUMMARY_EVERY * 2 {
        return None;
    }
    let (n, oldest) = s.depth;
    Some((n, oldest.map(|t| crate::timefmt::now_epoch() - t)))
}

impl Sender {
    /// From now on, the job events queued before `ns` (nanoseconds since the epoch, as an
    /// event's `seq`) are checked against Slurm before they are sent
    /// ([`Engine::check_old`]): on a controller pair, events this host queued before its role
    /// changed (this service started, or this host stopped leading) may be older than what
    /// another controller has sent since. Only moves forward.
    pub fn check_queued_before(&self, ns: u64) {
        self.check_before.fetch_max(ns, Ordering::Relaxed);
    }

    /// Whether this host may send a RUNNING now: the monitor feeds it the role it decides.
    pub fn gate(&self) -> Arc<Gate> {
        self.gate.clone()
    }

    /// Wakes the dispatcher (after the service itself queued something).
    pub fn wake(&self) {
        if let Some(s) = connect(&self.state_dir) {
            wake(&s);
        }
    }

    /// The outbox's depth and oldest age from the dispatcher's memory, as
    /// [`crate::state::queue::Queue::depth`] would find them,
    /// without listing the directory; `None` when no dispatcher runs or its summary is older
    /// than two [`SUMMARY_EVERY`] (then list it).
    /// (A function for another thread: the metrics writer.)
    pub fn summary_source(&self) -> impl Fn() -> Option<(usize, Option<i64>)> + Send + 'static {
        let (idle, summary) = (self.idle.clone(), self.summary.clone());
        move || summary_now(&idle, &summary)
    }

    /// After `stop`: waits (at most `within`) for the dispatcher to record its last figures.
    pub fn wait_stopped(&self, within: Duration) {
        let until = Instant::now() + within;
        while !self.idle.load(Ordering::Relaxed) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// What the sender threads need.
struct Setup {
    summary: Arc<Mutex<Option<OutboxSummary>>>,
    check_before: Arc<AtomicU64>,
    engine: Engine,
    outbox: StateDir,
    workers: usize,
    max_events: usize,
    stop: &'static AtomicBool,
    idle: Arc<AtomicBool>,
}

/// Starts the sender: takes the drainer lock, puts back what a dead drainer left in flight,
/// binds `wake.sock`, then delivers until `stop` is set. When the lock is free it returns
/// once the socket is bound, so hooks that start after it use it. When another process holds
/// it (a `flush`, or a second service on the same StateDir), a thread waits for it and this
/// sender takes over once that process ends; the caller goes on meanwhile.
///
/// `check_before`: job events queued before it (ns since the epoch; 0: none) are checked
/// against Slurm before they are sent (see [`Sender::check_queued_before`]), from the first
/// look on.
pub fn start(
    cfg: &crate::config::Config,
    client: Client,
    outbox: StateDir,
    stop: &'static AtomicBool,
    check_before: u64,
) -> Result<Sender, String> {
    let idle = Arc::new(AtomicBool::new(true));
    let summary = Arc::new(Mutex::new(None));
    let check_before = Arc::new(AtomicU64::new(check_before));
    let engine = Engine::new(cfg, client, outbox.clone());
    let sender = Sender {
        state_dir: outbox.root().to_path_buf(),
        idle: idle.clone(),
        summary: summary.clone(),
        check_before: check_before.clone(),
        gate: engine.gate(),
    };
    let setup = Setup {
        summary,
        check_before,
        idle,
        engine,
        workers: cfg.max_concurrent_requests.max(1),
        max_events: cfg.outbox_max_events,
        stop,
        outbox,
    };
    if let Some(lock) = setup.outbox.queue.drainer_lock(false)? {
        run(setup, lock)?;
        return Ok(sender);
    }
    log::warn!("another process (a cvslurm flush, or a second service) is sending the outbox; this service sends once it ends");
    std::thread::Builder::new()
        .name("standby".into())
        .spawn(move || match setup.outbox.queue.drainer_lock(true) {
            Ok(Some(lock)) => {
                if let Err(e) = run(setup, lock) {
                    log::error!("cannot start the sender: {e}");
                }
            }
            Ok(None) => {}
            Err(e) => log::error!("cannot start the sender: {e}"),
        })
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    Ok(sender)
}

fn run(setup: Setup, lock: nix::fcntl::Flock<std::fs::File>) -> Result<(), String> {
    let Setup {
        summary,
        check_before,
        engine,
        outbox,
        workers,
        max_events,
        stop,
        idle,
    } = setup;
    match outbox.queue.recover() {
        Ok(n) if n > 0 => {
            log::info!("outbox: {n} event(s) were in flight when the last run stopped; requeued")
        }
        Ok(_) => {}
        Err(e) => log::error!("outbox: {e}"),
    }
    let path = socket_path(outbox.root());
    let sock = bind(&path, &outbox)?;
    let shared = Arc::new(Shared {
        state: Mutex::new(State::default()),
        ready: Condvar::new(),
        stop,
        engine,
        check_before,
    });
    for i in 0..workers {
        let sh = shared.clone();
        std::thread::Builder::new()
            .name(format!("send-{i}"))
            .spawn(move || worker(&sh))
            .map_err(|e| format!("cannot start a sender thread: {e}"))?;
    }
    std::thread::Builder::new()
        .name("dispatch".into())
        .spawn({
            idle.store(false, Ordering::Relaxed);
            move || {
                let _lock = lock;
                dispatcher(&shared, &outbox, &sock, max_events, &summary);
                idle.store(true, Ordering::Relaxed);
            }
        })
        .map_err(|e| format!("cannot start the dispatcher thread: {e}"))?;
    log::info!(
        "sender: listening on {} ({workers} connection(s) at most)",
        path.display()
    );
    Ok(())
}

fn lock(sh: &Shared) -> std::sync::MutexGuard<'_, State> {
    sh.state.lock().unwrap_or_else(|e| e.into_inner())
}

fn dispatcher(
    sh: &Arc<Shared>,
    outbox: &StateDir,
    sock: &UnixDatagram,
    max_events: usize,
    summary: &Mutex<Option<OutboxSummary>>,
) {
    let mut summed_at: Option<Instant> = None;
    let mut buf = [0u8; 64];
    let mut next_scan = Instant::now();
    let (syncer, batches) = std::sync::mpsc::channel::<Vec<String>>();
    let (settler, ends) = std::sync::mpsc::channel::<Vec<Event>>();
    let ob = outbox.clone();
    let _ = std::thread::Builder::new()
        .name("sync".into())
        .spawn(move || {
            while let Ok(mut names) = batches.recv() {
                // Everything queued meanwhile goes in the same round.
                while let Ok(more) = batches.try_recv() {
                    names.extend(more);
                }
                sync_round(&ob, names);
            }
        });
    {
        // The settler ends when the dispatcher does (its queue's sender is in `ds`).
        let (sh, ob, sy) = (sh.clone(), outbox.clone(), syncer.clone());
        let _ = std::thread::Builder::new()
            .name("settle".into())
            .spawn(move || settle_loop(&sh, &ob, &ends, &sy));
    }
    let (checker, old) = std::sync::mpsc::channel::<Vec<Event>>();
    {
        // Like the settler, it ends with the dispatcher.
        let sh = sh.clone();
        let _ = std::thread::Builder::new()
            .name("check".into())
            .spawn(move || {
                while let Ok(batch) = old.recv() {
                    check_batch(&sh, batch);
                }
            });
    }
    let mut ds = Dispatch {
        index: Index::default(),
        syncer,
        settler,
        checker,
        look: Duration::ZERO,
    };
    while !sh.stop.load(Ordering::Relaxed) {
        // Sleep until woken, the next periodic scan, or the end of a pause (at most 200 ms,
        // to see `stop`).
        let mut until = next_scan;
        let (paused, rescan) = {
            let st = lock(sh);
            (st.paused_until, st.rescan)
        };
        if let Some(p) = paused {
            until = until.max(p);
        }
        let woken = if rescan && paused.is_none_or(|p| p <= Instant::now()) {
            true
        } else {
            let wait = until
                .saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(1), Duration::from_millis(200));
            let _ = sock.set_read_timeout(Some(wait));
            sock.recv(&mut buf).is_ok()
        };
        if woken {
            // Coalesce: every wake-up already queued is answered by this one scan.
            let _ = sock.set_nonblocking(true);
            while sock.recv(&mut buf).is_ok() {}
            let _ = sock.set_nonblocking(false);
        }
        let now = Instant::now();
        // Also while sending is paused (an outage: when the depth matters most); the index
        // is as fresh as the last scan, and every new file wakes one.
        if summed_at.is_none_or(|t| t.elapsed() >= SUMMARY_EVERY) {
            summed_at = Some(now);
            let s = ds.index.summary();
            if let Some((n, oldest)) = s {
                // For `status`, another process.
                outbox.status.record_outbox(n, oldest);
            }
            *summary.lock().unwrap_or_else(|e| e.into_inner()) =
                s.map(|depth| OutboxSummary { depth, at: now });
        }
        let paused_now = paused.is_some_and(|p| p > now);
        if paused_now {
            // Sending waits, but ends are settled now, while slurmctld still knows the jobs;
            // and a large outbox (a service started during an outage) is read into the index
            // meanwhile, READ_AT_MOST files a look, so that its depth is known.
            if woken || !ds.index.complete() {
                scan(sh, outbox, max_events, false, &mut ds);
            }
            continue;
        }
        if !woken && now < next_scan {
            continue;
        }
        lock(sh).rescan = false;
        scan(sh, outbox, max_events, true, &mut ds);
        next_scan = Instant::now() + RESCAN_EVERY;
        let report = sh.engine.take_report();
        if report != DrainReport::default() {
            record_drain(outbox, &report);
        }
    }
    // What was delivered since the last look counts too (the metrics file written at exit).
    let report = sh.engine.take_report();
    if report != DrainReport::default() {
        record_drain(outbox, &report);
    }
}

/// One look at the outbox: the new files go to the sync thread, the ends that need
/// slurmctld's word to the settler, and (`dispatch`) the rest to the workers, oldest first, at
/// most [`HAND_OUT_AT_MOST`] of each. Only the files new or changed since the last look are
/// read ([`Index`]), and the ones handed out.
fn scan(sh: &Shared, outbox: &StateDir, max_events: usize, dispatch: bool, ds: &mut Dispatch) {
    let began = Instant::now();
    let q = &outbox.queue;
    // The hooks that handed their events over did not sync them: the syncer thread makes
    // the new ones durable, batch by batch, beside the sending (sending need not wait: an
    // event CloudVision has is safe; what matters is how soon a queued one is on disk).
    let mut new = q.refresh(&mut ds.index);
    // The files hooks handed in are taken in now (renames: placed as their keys' pending
    // events, in order) and read into the index; the sync thread syncs what they became and
    // then deletes the handed-in files of chained ends.
    let handed = ds.index.handed_in().to_vec();
    let mut chained = Vec::new();
    if !handed.is_empty() {
        let placed;
        (placed, chained) = q.take_in(&handed);
        new.extend(q.note_taken_in(&mut ds.index, &placed));
    }
    new.extend(chained);
    let term = follow_term(sh);
    if !new.is_empty() {
        let mut st = lock(sh);
        for n in &new {
            st.held.remove(n);
        }
    }
    if !new.is_empty() {
        if let Err(unsent) = ds.syncer.send(new) {
            sync_round(outbox, unsent.0); // no sync thread: here, then
        }
    }
    q.enforce_limit_in(&mut ds.index, max_events, DROP_AT_MOST);
    let (busy, settling, queued, held) = {
        let st = lock(sh);
        (
            st.busy.clone(),
            st.settling.clone(),
            st.queue.len(),
            st.held.clone(),
        )
    };
    // An end is settled even while its job's RUNNING is being sent (its pending file is
    // not the one in flight): it is ready the moment the RUNNING is delivered.
    let (ends, more_ends) = ds.index.oldest(
        HAND_OUT_AT_MOST.saturating_sub(settling.len()),
        |name, provisional| provisional && !settling.contains(name),
    );
    // What needs no word from slurmctld goes out at once (RUNNING never waits for an end).
    // Enough to keep the workers busy through the next scan (its listing is what takes long).
    ds.look = (ds.look * 3 / 4).max(began.elapsed());
    let limit = hand_out_limit(ds.look);
    let (names, more_ready) = if dispatch {
        ds.index
            .oldest(limit.saturating_sub(queued), |name, provisional| {
                !provisional
                    && !busy.contains(name)
                    && !settling.contains(name)
                    && !held.contains(name)
            })
    } else {
        (Vec::new(), false)
    };
    // Each file is read as it is now (it may have changed since the index saw it).
    let (mut provisional, mut ready) = (Vec::new(), Vec::new());
    for name in ends.iter().chain(&names) {
        let Some(ev) = q.read_pending(name) else {
            continue;
        };
        if ev.resolve.is_some() {
            if !settling.contains(name.as_str()) {
                provisional.push(ev);
            }
        } else if dispatch && !busy.contains(name.as_str()) && !settling.contains(name.as_str()) {
            ready.push(ev);
        }
    }
    provisional.sort_by_key(|e| e.seq);
    ready.sort_by_key(|e| e.seq);
    let ready = hold_running(sh, ready, term);
    let ready = hold_back_old(sh, ready, ds);
    {
        let mut st = lock(sh);
        // Left over: looked at again once the workers' queue runs low, once the settler is
        // done, and at once when files were left unread (over the per-scan limit).
        st.more = more_ready;
        st.more_ends = more_ends;
        st.limit = limit;
        st.rescan |= !ds.index.complete();
    }
    hand_out(sh, ready);
    if provisional.is_empty() {
        return;
    }
    lock(sh)
        .settling
        .extend(provisional.iter().map(|e| e.item.file_name()));
    if let Err(back) = ds.settler.send(provisional) {
        // No settler thread: settled here, then.
        settle_batch(sh, outbox, back.0, &ds.syncer);
    }
}

/// One round of the sync thread: the new pending files synced (and the start records of the
/// ends among them forgotten), then the handed-in files of ends chained into them deleted
/// ([`crate::state::queue::Queue::after_take_in`]).
fn sync_round(outbox: &StateDir, names: Vec<String>) {
    let (chained, mut new): (Vec<String>, Vec<String>) = names
        .into_iter()
        .partition(|n| crate::state::queue::is_spool_name(n));
    new.sort();
    new.dedup();
    outbox.queue.after_take_in(&new, &chained);
}

/// The leadership term now ([`Gate::term`]); when it changed since the last look, what was
/// checked or held under the old one is forgotten, and the events queued before a new term
/// are checked against Slurm before they go out ([`Sender::check_queued_before`]).
fn follow_term(sh: &Shared) -> Option<u128> {
    let term = sh.engine.gate().term();
    let mut st = lock(sh);
    if st.term != term {
        st.term = term;
        st.held.clear();
        st.checked.clear();
        st.checked_term = term;
        if let Some(t) = term {
            sh.check_before
                .fetch_max(u64::try_from(t).unwrap_or(u64::MAX), Ordering::Relaxed);
        }
    }
    term
}

/// On a host that does not lead (`term` is `None`), the RUNNINGs among `ready` are held: not
/// sent, kept pending until this host leads again (then checked against Slurm first); an end
/// chained behind one goes alone ([`Engine::end_alone`]). The rest is returned.
fn hold_running(sh: &Shared, ready: Vec<Event>, term: Option<u128>) -> Vec<Event> {
    if term.is_some() {
        return ready;
    }
    let mut out = Vec::with_capacity(ready.len());
    let mut newly = 0;
    for ev in ready {
        if !running_head(&ev) {
            out.push(ev);
            continue;
        }
        if ev.then.is_some() {
            match sh.engine.end_alone(&ev) {
                Some(end) if end.resolve.is_none() => out.push(end),
                // To the settler at the next look, or changed meanwhile.
                _ => lock(sh).rescan = true,
            }
            continue;
        }
        log::debug!(
            "outbox: {} held: this host does not lead",
            ev.item.describe()
        );
        if lock(sh).held.insert(ev.item.file_name()) {
            newly += 1;
        }
    }
    if newly > 0 {
        log::info!(
            "outbox: {newly} RUNNING event(s) held: this host does not lead (only the controller in control sends a RUNNING); each goes out if this host leads again while its job runs, checked against Slurm first"
        );
    }
    out
}

/// Of the events ready to send, the job events queued before [`Shared::check_before`] and not
/// checked yet go to the checker thread (and are kept from the workers until it is done); the
/// rest are returned.
fn hold_back_old(sh: &Shared, ready: Vec<Event>, ds: &Dispatch) -> Vec<Event> {
    let before = u128::from(sh.check_before.load(Ordering::Relaxed));
    if before == 0 || ready.is_empty() {
        return ready;
    }
    let (old, fresh): (Vec<Event>, Vec<Event>) = {
        let mut st = lock(sh);
        let (old, fresh): (Vec<Event>, Vec<Event>) = ready.into_iter().partition(|ev| {
            ev.seq < before
                && matches!(ev.item, Item::Job { .. })
                && !st.checked.contains(&(ev.item.file_name(), ev.seq))
        });
        st.settling.extend(old.iter().map(|e| e.item.file_name()));
        (old, fresh)
    };
    if !old.is_empty() {
        if let Err(back) = ds.checker.send(old) {
            check_batch(sh, back.0); // no checker thread: here, then
        }
    }
    fresh
}

/// Checks `events` ([`Engine::check_old`]) and hands out what may go now; what could not be
/// decided stays pending for a later look.
fn check_batch(sh: &Shared, events: Vec<Event>) {
    let names: Vec<String> = events.iter().map(|e| e.item.file_name()).collect();
    let n = events.len();
    // The term the check counts for: a RUNNING checked under it goes out during it only.
    let term = sh.engine.gate().term();
    let asked = Instant::now();
    let result = sh.engine.check_old(events);
    log::debug!(
        "outbox: {n} event(s) queued before this host's role changed asked of Slurm ({} ms): {}",
        asked.elapsed().as_millis(),
        match &result {
            Ok(c) => format!("{} to send, {} decided", c.send.len(), c.decided.len()),
            Err(e) => e.clone(),
        }
    );
    let mut st = lock(sh);
    for name in &names {
        st.settling.remove(name);
    }
    match result {
        Ok(c) => {
            // Counted only for the term the dispatcher follows now (a check that spanned a
            // change of term is made again under the new one).
            if st.checked_term == term {
                if st.checked.len() + c.decided.len() > CHECKED_AT_MOST {
                    st.checked.clear();
                }
                st.checked.extend(c.decided);
            }
            st.check_failing = false;
            drop(st);
            hand_out(sh, c.send);
        }
        Err(e) => {
            if !std::mem::replace(&mut st.check_failing, true) {
                log::warn!(
                    "outbox: {n} event(s) queued before this host's role changed wait until slurmctld says whether they are still current: {e}"
                );
            }
        }
    }
}

/// The settler thread: asks slurmctld how the queued ends ended, a batch at a time (every
/// end queued until a quiet moment, see [`END_STATE_QUIET`], and every one queued while it
/// asked, is in the batch), and hands the settled events to the workers.
fn settle_loop(
    sh: &Shared,
    outbox: &StateDir,
    ends: &std::sync::mpsc::Receiver<Vec<Event>>,
    syncer: &Sender_<Vec<String>>,
) {
    while let Ok(mut batch) = ends.recv() {
        let by = Instant::now() + END_STATE_WAIT;
        loop {
            let left = by.saturating_duration_since(Instant::now());
            match ends.recv_timeout(END_STATE_QUIET.min(left)) {
                Ok(more) if !left.is_zero() => batch.extend(more),
                Ok(more) => {
                    batch.extend(more);
                    break;
                }
                Err(_) => break, // quiet (or the dispatcher is gone)
            }
        }
        settle_batch(sh, outbox, batch, syncer);
    }
}

/// One question to slurmctld for `provisional` (the ends, see [`Engine::settle`]), their
/// records fixed and made durable (by the sync thread), then handed out. The ones that changed
/// meanwhile are left to the next scan.
fn settle_batch(
    sh: &Shared,
    outbox: &StateDir,
    provisional: Vec<Event>,
    syncer: &Sender_<Vec<String>>,
) {
    let names: Vec<String> = provisional.iter().map(|e| e.item.file_name()).collect();
    let settled = sh.engine.settle(provisional);
    let files: Vec<String> = settled.iter().map(|e| e.item.file_name()).collect();
    if let Err(unsent) = syncer.send(files) {
        outbox.queue.sync_files(&unsent.0);
    }
    let changed = settled.len() < names.len();
    // Sent once any pause is over (the workers wait it out).
    hand_out(sh, settled);
    let mut st = lock(sh);
    for n in &names {
        st.settling.remove(n);
    }
    st.rescan |= changed || st.more_ends;
}

/// Queues events for the workers (each key once).
fn hand_out(sh: &Shared, events: Vec<Event>) {
    if events.is_empty() {
        return;
    }
    let mut st = lock(sh);
    for ev in events {
        if st.busy.insert(ev.item.file_name()) {
            st.queue.push_back(ev);
        }
    }
    drop(st);
    sh.ready.notify_all();
}

fn worker(sh: &Shared) {
    loop {
        let ev = {
            let mut st = lock(sh);
            loop {
                if sh.stop.load(Ordering::Relaxed) {
                    return;
                }
                let paused = st.paused_until.is_some_and(|p| p > Instant::now());
                if !paused {
                    if let Some(ev) = st.queue.pop_front() {
                        break ev;
                    }
                }
                st = sh
                    .ready
                    .wait_timeout(st, Duration::from_millis(200))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        };
        let name = ev.item.file_name();
        let checked = |t: u128| {
            let st = lock(sh);
            st.checked_term == Some(t) && st.checked.contains(&(name.clone(), ev.seq))
        };
        match sh.engine.deliver_if(&ev, &checked) {
            Outcome::Delivered => lock(sh).failures = 0,
            Outcome::Held => {
                // Not leading: held until it leads (an end chained behind it goes alone, at
                // the next look); leading: it waits for its check, at the next look (which
                // follows the new term).
                if sh.engine.gate().term().is_some() {
                    lock(sh).rescan = true;
                } else if ev.then.is_some() {
                    let _ = sh.engine.end_alone(&ev);
                    lock(sh).rescan = true;
                } else {
                    lock(sh).held.insert(name.clone());
                }
            }
            Outcome::Kept {
                why, retry_after, ..
            } => pause(sh, retry_after, &why),
            Outcome::Broken(why) => pause(sh, None, &why),
            Outcome::Gone | Outcome::Rejected => {}
        }
        // A newer event of this key queued meanwhile is sent next, after this one.
        let newer = sh.engine.outbox().queue.is_pending(&ev.item);
        let mut st = lock(sh);
        st.busy.remove(&name);
        st.rescan |= newer || (st.more && st.queue.len() < st.limit.max(HAND_OUT_AT_MOST) / 4);
    }
}

/// A failed send: every worker pauses (the backoff grows with each failure in a row, a 429's
/// `Retry-After` is honoured), and what was handed out goes back to the outbox's order.
fn pause(sh: &Shared, retry_after: Option<Duration>, why: &str) {
    let mut st = lock(sh);
    // The workers that fail together count as one failure: the backoff grows per pause.
    if st.paused_until.is_none_or(|p| p <= Instant::now()) {
        st.failures += 1;
    }
    let wait = retry_wait(st.failures, retry_after);
    let until = Instant::now() + wait;
    if st.paused_until.is_none_or(|p| p < until) {
        if st.paused_until.is_none_or(|p| p <= Instant::now()) {
            log::warn!(
                "outbox: sending paused for {:.0} s: {why}",
                wait.as_secs_f64()
            );
        }
        st.paused_until = Some(until);
    }
    st.rescan = true; // once the pause is over
    let dropped: Vec<Event> = st.queue.drain(..).collect();
    for ev in dropped {
        st.busy.remove(&ev.item.file_name());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_out_grows_with_the_look_within_bounds() {
        assert_eq!(hand_out_limit(Duration::ZERO), HAND_OUT_AT_MOST);
        assert_eq!(hand_out_limit(Duration::from_millis(5)), HAND_OUT_AT_MOST);
        assert_eq!(hand_out_limit(Duration::from_millis(250)), 4000);
        assert_eq!(hand_out_limit(Duration::from_secs(3)), HAND_OUT_MOST);
        assert_eq!(hand_out_limit(Duration::MAX), HAND_OUT_MOST);
    }
}

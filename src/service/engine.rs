//! The delivery engine: what happens to an outbox event on its way to CloudVision, the same for
//! the service's sender threads ([`super::sender`]) and for `cvslurm flush` ([`drain_once`]).
//!
//! - [`Engine::settle`]: the provisional ends (an epilog's event written while the service
//!   ran, judged from exit codes only) are settled against slurmctld, a batch in one question
//!   ([`end_states`]); their records are fixed and written back, and an end slurmctld did not
//!   name as final is marked for verification against Slurm's final record.
//! - [`Engine::deliver`]: takes one event, adds the interface MACs `JobInterfaces=gpu|auto`
//!   asks for ([`crate::attribution::enrich`]), sends it, classifies the answer ([`Outcome`])
//!   and finishes it in the outbox (delivered, kept for a retry, or rejected).
//!
//! What the callers decide is only when to send: the service pauses every worker on a kept
//! event (backoff), `flush` goes through the outbox once and stops at a refused token.

use crate::cloudvision::{Answer, Client, SendError};
use crate::config::JobInterfaces;
use crate::hook_facts as hook;
use crate::runner::Slurm;
use crate::slurm::{self, JobInfo};
use crate::state::queue::{Event, Finish, Item};
use crate::state::StateDir;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The longest slurmctld may take to answer the batch end-state question.
pub const END_STATE_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a refused token is logged as an error (it is kept at debug in between).
const TOKEN_WARN_EVERY: Duration = Duration::from_secs(60);

/// What deliveries did since the report was last taken.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Events CloudVision took.
    pub delivered: usize,
    /// Events kept for a later try.
    pub kept: usize,
    /// Events moved to `rejected/`.
    pub rejected: usize,
    /// CloudVision refused the token.
    pub token_refused: bool,
    /// The longest `Retry-After` CloudVision asked for.
    pub retry_after: Option<Duration>,
    /// The last error, for the log and `status`.
    pub last_error: Option<String>,
}

/// Records a report in the outbox's `service-status.json` for `cvslurm status`.
pub fn record_drain(outbox: &StateDir, r: &DrainReport) {
    outbox
        .status
        .record_drain(r.delivered, r.last_error.as_deref());
}

/// How one delivery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The event was replaced or taken meanwhile: nothing was sent.
    Gone,
    /// CloudVision took it.
    Delivered,
    /// Kept for a later try (CloudVision unreachable or busy, the token refused, no server
    /// configured): the caller waits before sending more.
    Kept {
        /// What went wrong.
        why: String,
        /// A 429's `Retry-After`.
        retry_after: Option<Duration>,
        /// CloudVision refused the token: nothing will go through until it is replaced.
        token_refused: bool,
    },
    /// CloudVision will never take it: moved to `rejected/`.
    Rejected,
    /// The outbox itself failed (the event could not be taken); it stays pending.
    Broken(String),
}

/// Slurm's view of the given jobs: slurmctld asked job by job (at most
/// [`slurm::JOB_QUERIES_PER_PASS`], see [`slurm::jobs_by_id`]), then accounting in bounded
/// `sacct` batches for the jobs slurmctld has already forgotten (a service that was down for a
/// while). Jobs neither knows, and every job when Slurm cannot be asked, are absent from
/// [`found`](slurm::Answer::found) (their ends are then judged from the exit codes, as a hook
/// without slurmctld does); the ids a bound left unasked are in
/// [`later`](slurm::Answer::later), to be asked in the next pass.
pub fn end_states(slurm: &Slurm, ids: &[String], timeout: Duration) -> slurm::Answer {
    if ids.is_empty() {
        return slurm::Answer::default();
    }
    let mut answer = match slurm::jobs_by_id(slurm, ids, timeout) {
        Ok(a) => a,
        Err(e) => {
            log::warn!(
                "cannot ask slurmctld how {} job(s) ended ({e}); using their exit codes",
                ids.len()
            );
            return slurm::Answer::default();
        }
    };
    let missing: Vec<String> = ids
        .iter()
        .filter(|id| !answer.found.contains_key(*id) && !answer.later.contains(id))
        .cloned()
        .collect();
    if !missing.is_empty() {
        match slurm::sacct_jobs(slurm, &missing, timeout) {
            Ok(acct) => {
                answer.found.extend(acct.found);
                answer.later.extend(acct.later);
            }
            Err(e) => log::debug!("accounting not asked about {} job(s): {e}", missing.len()),
        }
    }
    answer
}

/// Sends one outbox item as it is.
pub fn send_item(
    client: &Client,
    item: &Item,
    deadline: Option<Instant>,
) -> Result<Answer, SendError> {
    match item {
        Item::Job { job } => client.post_job(job, deadline),
        Item::Node { node } => client.post_node(node, deadline),
        Item::NodeDelete { name } => client.delete_node(name, deadline),
    }
}

/// Nanoseconds since the epoch (the clock of [`Event::seq`]).
fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

/// The one delivery policy (see the module documentation). Shared by reference between
/// threads.
pub struct Engine {
    client: Client,
    outbox: StateDir,
    slurm: Slurm,
    interfaces: JobInterfaces,
    report: Mutex<DrainReport>,
    token_warned_at: Mutex<Option<Instant>>,
}

impl Engine {
    /// An engine sending to `client` what `outbox` holds, settling and enriching with the
    /// Slurm commands of `cfg` (`SlurmBinDir`) and its `JobInterfaces`.
    pub fn new(cfg: &crate::config::Config, client: Client, outbox: StateDir) -> Engine {
        Engine {
            client,
            outbox,
            slurm: Slurm::new(cfg.slurm_bin_dir.as_deref()),
            interfaces: cfg.job_interfaces,
            report: Mutex::new(DrainReport::default()),
            token_warned_at: Mutex::new(None),
        }
    }

    /// The outbox it sends.
    pub fn outbox(&self) -> &StateDir {
        &self.outbox
    }

    /// What happened since the last call (and starts a new report).
    pub fn take_report(&self) -> DrainReport {
        std::mem::take(&mut *self.report.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn account(&self, f: impl FnOnce(&mut DrainReport)) {
        f(&mut self.report.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Settles the provisional ends in `provisional` against slurmctld ([`end_states`]), writes
    /// their fixed records back (not synced: the caller syncs the returned events' files) and
    /// returns them. An event that changed meanwhile, or whose job a bound left unasked, is
    /// left out (the next look at the outbox finds it).
    pub fn settle(&self, provisional: Vec<Event>) -> Vec<Event> {
        if provisional.is_empty() {
            return provisional;
        }
        let ids: Vec<String> = provisional
            .iter()
            .filter_map(|e| match &e.item {
                Item::Job { job } => Some(job.job_id().to_string()),
                _ => None,
            })
            .collect();
        let asked = Instant::now();
        let slurm::Answer { found: ctl, later } = end_states(&self.slurm, &ids, END_STATE_TIMEOUT);
        log::debug!(
            "settle: {} end(s) asked about ({} ms), {} left for the next pass",
            ids.len() - later.len(),
            asked.elapsed().as_millis(),
            later.len()
        );
        // An end a bound left unasked stays provisional in the outbox: the next look asks.
        if !later.is_empty() {
            self.outbox.status.record_slurm_warning(&format!(
                "{} end(s) left for the next pass: slurmctld is asked about at most {} jobs per pass",
                later.len(),
                slurm::JOB_QUERIES_PER_PASS
            ));
        }
        let later: std::collections::HashSet<String> = later.into_iter().collect();
        provisional
            .into_iter()
            .filter(|ev| match &ev.item {
                Item::Job { job } => !later.contains(job.job_id()),
                _ => true,
            })
            .filter_map(|ev| self.resolve(ev, &ctl))
            .collect()
    }

    /// Turns an epilog's provisional event (itself, or the end chained after a RUNNING) into
    /// its final one (state from slurmctld's answer, Slurm's own start and end times), writes
    /// it back, and marks a COMPLETED for verification. `None` when the event changed
    /// meanwhile.
    fn resolve(&self, ev: Event, ctl: &HashMap<String, JobInfo>) -> Option<Event> {
        let mut new = ev.clone();
        let changed = match new.then.as_deref_mut() {
            Some(next) => self.settle_one(next, ctl),
            None => self.settle_one(&mut new, ctl),
        };
        if !changed {
            return Some(ev);
        }
        // Not synced here (one fsync per end would hold up the batch).
        match self.outbox.queue.replace_if_same(&ev, &new, false) {
            Ok(true) => Some(new),
            Ok(false) => None,
            Err(e) => {
                log::error!("outbox: {e}");
                None
            }
        }
    }

    /// Settles one provisional end in place; false when it was not provisional.
    fn settle_one(&self, ev: &mut Event, ctl: &HashMap<String, JobInfo>) -> bool {
        let Some(facts) = ev.resolve.take() else {
            return false;
        };
        let Item::Job { job } = &ev.item else {
            return false;
        };
        let fixed = hook::finish_end(job, &facts, ctl.get(job.job_id()));
        if fixed.state != job.state {
            log::info!(
                "job {}: slurmctld says it ended {}, not {} as its exit codes say",
                job.key.id,
                fixed.state,
                job.state
            );
        }
        // An end slurmctld did not name as final (22.05 says COMPLETING; or it could not be
        // asked) is checked against Slurm's final record later.
        if !ctl.get(job.job_id()).is_some_and(hook::final_state_named) {
            if let Err(e) = self
                .outbox
                .marks
                .mark_for_verification(&fixed, facts.restart_count)
            {
                log::warn!(
                    "job {}: cannot mark its end for verification: {e}",
                    job.key.id
                );
            }
        }
        ev.item = Item::Job { job: fixed };
        true
    }

    /// With `JobInterfaces=gpu|auto`, the record of a Slurm job as it is sent: the MACs of the
    /// NICs nearest the GPUs it holds on shared nodes (see [`crate::attribution::enrich`]).
    /// Asked at send time, never in the hook. `None`: send the event as queued.
    fn enrich(&self, item: &Item) -> Option<Item> {
        let Item::Job { job } = item else {
            return None;
        };
        if self.interfaces == JobInterfaces::Nodes
            || job.nodes.is_none()
            || job.job_type == Some(crate::payload::JobType::Tenant)
        {
            return None;
        }
        let mut job = job.clone();
        crate::attribution::enrich(self.interfaces, &self.slurm, &self.outbox, &mut job);
        Some(Item::Job { job })
    }

    /// Takes, enriches, sends and finishes one (settled) event.
    pub fn deliver(&self, ev: &Event) -> Outcome {
        let taken = match self.outbox.queue.take(ev) {
            Ok(Some(t)) => t,
            Ok(None) => return Outcome::Gone,
            Err(e) => {
                log::error!("outbox: {e}");
                self.account(|r| {
                    r.kept += 1;
                    r.last_error = Some(e.clone());
                });
                return Outcome::Broken(e);
            }
        };
        let what = taken.item.describe();
        let enriched = self.enrich(&taken.item);
        let result = send_item(&self.client, enriched.as_ref().unwrap_or(&taken.item), None);
        let (finish, outcome) = match result {
            Ok(a) => {
                self.account(|r| r.delivered += 1);
                let delay = now_nanos().saturating_sub(taken.seq) / 1_000_000;
                log::info!(
                    "outbox: delivered {what} (HTTP {}, {delay} ms after it was queued)",
                    a.status
                );
                (Finish::Delivered, Outcome::Delivered)
            }
            Err(e)
                if e.retryable()
                    || matches!(
                        e,
                        SendError::NotConfigured(_) | SendError::TokenRefused { .. }
                    ) =>
            {
                let retry_after = match e {
                    SendError::RateLimited { retry_after } => retry_after,
                    _ => None,
                };
                let token_refused = matches!(e, SendError::TokenRefused { .. });
                if token_refused {
                    let mut at = self
                        .token_warned_at
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    if at.is_none_or(|t| t.elapsed() >= TOKEN_WARN_EVERY) {
                        log::error!("outbox: {what} kept: {e}");
                        *at = Some(Instant::now());
                    }
                }
                log::debug!("outbox: {what} kept: {e}");
                let why = e.to_string();
                self.account(|r| {
                    r.kept += 1;
                    r.token_refused |= token_refused;
                    r.retry_after = r.retry_after.max(retry_after);
                    r.last_error = Some(why.clone());
                });
                (
                    Finish::Retry,
                    Outcome::Kept {
                        why,
                        retry_after,
                        token_refused,
                    },
                )
            }
            Err(e) => {
                let why = e.to_string();
                self.account(|r| {
                    r.rejected += 1;
                    r.last_error = Some(why.clone());
                });
                log::error!("outbox: {what} rejected, moved to rejected/: {e}");
                (Finish::Reject(why), Outcome::Rejected)
            }
        };
        if let Err(e) = self.outbox.queue.finish(&taken, finish) {
            log::error!("outbox: {e}");
        }
        outcome
    }
}

/// `cvslurm flush`: goes through the outbox once with the engine, `concurrency` events at a
/// time, oldest first: the provisional ends are settled first (one question to slurmctld),
/// then everything is sent; an end chained after its job's RUNNING follows in the same pass
/// (settled first when it is provisional). One key is never sent twice at once (the outbox
/// holds one event per key). Stops early when `stop` is set, when CloudVision refuses the
/// token or when the outbox fails; what was not sent counts as kept.
pub fn drain_once(engine: &Engine, concurrency: usize, stop: &AtomicBool) -> DrainReport {
    let outbox = engine.outbox();
    let halt = AtomicBool::new(false);
    let mut round = outbox.queue.pending();
    let mut unsent = 0;
    while !round.is_empty() {
        let (provisional, mut ready): (Vec<Event>, Vec<Event>) =
            round.into_iter().partition(|e| e.resolve.is_some());
        let asked: Vec<Item> = provisional.iter().map(|e| e.item.clone()).collect();
        let settled = engine.settle(provisional);
        let names: Vec<String> = settled.iter().map(|e| e.item.file_name()).collect();
        // Ends left out (changed meanwhile, or past a bound on the questions to Slurm) are
        // taken up again, as they are now, in the next round.
        let again: Vec<Event> = asked
            .iter()
            .filter(|i| !names.contains(&i.file_name()))
            .filter_map(|i| outbox.queue.pending_of(i))
            .collect();
        outbox.queue.sync_files(&names);
        ready.extend(settled);
        ready.sort_by_key(|e| e.seq);
        let queue = Mutex::new(VecDeque::from(ready));
        let followers = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..concurrency.max(1) {
                s.spawn(|| loop {
                    if stop.load(Ordering::Relaxed) || halt.load(Ordering::Relaxed) {
                        break;
                    }
                    let Some(ev) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front()
                    else {
                        break;
                    };
                    match engine.deliver(&ev) {
                        Outcome::Delivered | Outcome::Rejected if ev.then.is_some() => {
                            // The job's end, chained after its RUNNING, goes out in this pass.
                            if let Some(next) = outbox.queue.pending_of(&ev.item) {
                                followers
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .push(next);
                            }
                        }
                        Outcome::Kept {
                            token_refused: true,
                            ..
                        }
                        | Outcome::Broken(_) => halt.store(true, Ordering::Relaxed),
                        _ => {}
                    }
                });
            }
        });
        unsent += queue.into_inner().unwrap_or_else(|e| e.into_inner()).len();
        round = followers.into_inner().unwrap_or_else(|e| e.into_inner());
        round.extend(again);
        if stop.load(Ordering::Relaxed) || halt.load(Ordering::Relaxed) {
            unsent += round.len();
            break;
        }
    }
    let mut r = engine.take_report();
    r.kept += unsent;
    r
}

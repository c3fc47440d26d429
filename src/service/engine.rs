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

pub use crate::attribution::Forget;
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
    /// Of those, the ones whose delivery was tried and failed (the rest were not tried).
    pub retried: usize,
    /// Events moved to `rejected/`.
    pub rejected: usize,
    /// CloudVision refused the token.
    pub token_refused: bool,
    /// The longest `Retry-After` CloudVision asked for.
    pub retry_after: Option<Duration>,
    /// The last error, for the log and `status`.
    pub last_error: Option<String>,
    /// CloudVision's answers to the deliveries, by class
    /// ([`crate::state::status::ANSWER_CLASSES`]).
    pub answers: [u64; 4],
    /// Each delivered event's latency, queued to delivered, in milliseconds.
    pub latencies_ms: Vec<u64>,
}

/// Records a report in the outbox's `service-status.json`, for `cvslurm status` and the
/// metrics file.
pub fn record_drain(outbox: &StateDir, r: &DrainReport) {
    let latencies: Vec<f64> = r
        .latencies_ms
        .iter()
        .map(|ms| *ms as f64 / 1000.0)
        .collect();
    outbox.status.record_drain(&crate::state::status::Drained {
        delivered: r.delivered as u64,
        retried: r.retried as u64,
        rejected: r.rejected as u64,
        answers: r.answers,
        latencies: &latencies,
        last_error: r.last_error.as_deref(),
    });
}

/// The class of the answer that decided a delivery, as an index in
/// [`crate::state::status::ANSWER_CLASSES`]: 2xx, 4xx, 5xx, or none (no answer: unreachable,
/// timeout, caught before sending, no server).
pub fn answer_class(result: &Result<Answer, SendError>) -> usize {
    match result {
        Ok(_) => 0,
        Err(SendError::TokenRefused { .. })
        | Err(SendError::RateLimited { .. })
        | Err(SendError::Rejected { .. }) => 1,
        Err(SendError::Server { .. }) => 2,
        // Not CloudVision's answer (a plain 404, or a 200 page of HTML): counted with the 4xx.
        Err(SendError::NotCloudVision { .. }) => 1,
        Err(SendError::NotConfigured(_))
        | Err(SendError::Unreachable(_))
        | Err(SendError::Timeout(_))
        | Err(SendError::Invalid(_)) => 3,
    }
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
    match records_of(slurm, ids, timeout) {
        Ok(a) => a,
        Err(e) => {
            // A held-back listing was said once, when the backoff started (src/slurm.rs).
            let level = if slurm::held_back(&e) {
                log::Level::Debug
            } else {
                log::Level::Warn
            };
            log::log!(
                level,
                "cannot ask slurmctld how {} job(s) ended ({e}); using their exit codes",
                ids.len()
            );
            slurm::Answer::default()
        }
    }
}

/// Slurm's records of `ids`: slurmctld by id ([`slurm::jobs_by_id`], bounded), then
/// accounting in bounded `sacct` batches for the jobs slurmctld no longer holds (a failed
/// `sacct` leaves them absent). An error when slurmctld cannot be asked at all.
fn records_of(slurm: &Slurm, ids: &[String], timeout: Duration) -> Result<slurm::Answer, String> {
    let mut answer = slurm::jobs_by_id(slurm, ids, timeout)?;
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
    Ok(answer)
}

/// The job ids of the job events among `events`, in their order.
fn job_ids_of(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.item {
            Item::Job { job } => Some(job.job_id().to_string()),
            _ => None,
        })
        .collect()
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
        Item::NodeDelete { name, location } => {
            delete_own_node(client, name, location.as_deref(), deadline)
        }
    }
}

/// Deletes the NodeConfig of `node`, which cluster `cluster` sent. CloudVision is asked
/// first (GetOne): a node it no longer has (CloudVision's not-found answer) needs nothing;
/// one it stores with another `location` is another cluster's (same node name, no
/// `QualifyNodeNames`) and is left alone, with a warning; a question that fails (5xx,
/// timeout, an unreadable answer) keeps the delete for a later pass. A server that does not
/// answer the GetOne as CloudVision does (Arista's fake CloudVision answers every GET with a
/// plain 404), or refuses it, cannot tell the location: the DELETE is sent all the same. A
/// delete queued by an earlier version (no cluster) is sent as it is.
///
/// The answer's `body` says which requests were made and what came back, for the log.
pub fn delete_own_node(
    client: &Client,
    node: &str,
    cluster: Option<&str>,
    deadline: Option<Instant>,
) -> Result<Answer, SendError> {
    let id = client.node_key(node, cluster);
    let delete = |asked: String| {
        client.delete_node(&id, deadline).map(|mut a| {
            a.body = format!("{asked}DELETE answered HTTP {}", a.status);
            a
        })
    };
    let Some(cluster) = cluster else {
        return delete(String::new());
    };
    let stored = match client.get_node_value(&id, deadline) {
        Ok(Some(stored)) => stored,
        Ok(None) => {
            return Ok(Answer {
                status: 404,
                elapsed: Duration::ZERO,
                body: "GET answered CloudVision's not-found: it holds no NodeConfig of it; \
                       no DELETE sent"
                    .into(),
            })
        }
        Err(SendError::NotCloudVision { status, excerpt }) => {
            return delete(format!(
                "GET (its location) answered HTTP {status} {excerpt:?}, not as CloudVision; "
            ));
        }
        Err(e @ SendError::Rejected { .. }) => {
            return delete(format!("GET (its location) refused: {e}; "));
        }
        Err(e) => return Err(e),
    };
    match stored.get("location").and_then(serde_json::Value::as_str) {
        Some(l) if l == cluster => delete(format!("GET answered HTTP 200 (cluster {cluster}'s); ")),
        other => {
            let whose = match other {
                Some(l) => format!("cluster {:?}'s", l.chars().take(100).collect::<String>()),
                None => "one without a location".to_string(),
            };
            log::warn!(
                "node {id}: not deleted: the NodeConfig CloudVision holds is {whose}, not \
                 cluster {cluster}'s; set QualifyNodeNames=yes on every cluster that shares \
                 this CloudVision"
            );
            Ok(Answer {
                status: 200,
                elapsed: Duration::ZERO,
                body: format!("GET answered HTTP 200 ({whose}); no DELETE sent"),
            })
        }
    }
}

/// Set once CloudVision has answered that it cannot delete a JobConfig (warned once).
static DELETE_UNSUPPORTED: AtomicBool = AtomicBool::new(false);

fn forget_words(why: Forget) -> &'static str {
    match why {
        Forget::Rerun => "a re-run",
        Forget::Representation => "sent without a record of how its RUNNING went",
    }
}

/// Deletes the job's stored record before its record is posted whole ([`Forget`] says why). A
/// record already gone (CloudVision's 404) is fine. A CloudVision that cannot delete
/// JobConfigs (405, 501), a server that does not answer the DELETE as CloudVision (Arista's
/// fake CloudVision: a plain 404), or one that refuses this delete otherwise (another 4xx) is
/// warned about (once; logged each time after) and the record is sent anyway. What may pass
/// with time (CloudVision unreachable or busy, the token refused) is returned: the event stays
/// queued and is tried again, delete first.
fn forget_stored_job(
    client: &Client,
    job: &crate::payload::JobConfig,
    why: Forget,
    deadline: Option<Instant>,
) -> Result<(), SendError> {
    let id = &job.key.id;
    let because = forget_words(why);
    match client.delete_job(id, deadline) {
        Ok(a) => {
            log::debug!(
                "job {id}: {because}; its stored record deleted first (HTTP {})",
                a.status
            );
            Ok(())
        }
        Err(SendError::Rejected { status: 404, .. }) => {
            log::debug!("job {id}: {because}; CloudVision holds no record of it (HTTP 404)");
            Ok(())
        }
        Err(
            e @ (SendError::Server { status: 501, .. }
            | SendError::Rejected { .. }
            | SendError::NotCloudVision { .. }),
        ) => {
            if !DELETE_UNSUPPORTED.swap(true, Ordering::Relaxed) {
                log::warn!(
                    "job {id}: {because}, but CloudVision did not delete its stored record \
                     ({e}); its {} is sent anyway{}",
                    job.state,
                    match why {
                        Forget::Rerun => {
                            " and may show the earlier run's end time until the job ends"
                        }
                        Forget::Representation => "",
                    }
                );
            } else {
                log::info!(
                    "job {id}: its stored record not deleted ({e}); {} sent",
                    job.state
                );
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Posts a job's record as [`crate::attribution::outgoing`] decided it: CloudVision's stored
/// record of the job deleted first where it says so ([`forget_stored_job`]), then the record.
/// The one way a job's record is sent (the engine, the hook's own send, `send`).
pub fn post_outgoing(
    client: &Client,
    out: &crate::attribution::Outgoing,
    deadline: Option<Instant>,
) -> Result<Answer, SendError> {
    if let Some(why) = out.forget {
        forget_stored_job(client, &out.job, why, deadline)?;
    }
    client.post_job(&out.job, deadline)
}

/// Nanoseconds since the epoch (the clock of [`Event::seq`]).
pub(crate) fn now_nanos() -> u128 {
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

/// What [`Engine::check_old`] decided.
#[derive(Debug, Default)]
pub struct Checked {
    /// The events to send now (checked; some replaced by their job's end).
    pub send: Vec<Event>,
    /// The files decided on, with the event's `seq`: not checked again.
    pub decided: Vec<(String, u128)>,
}

impl Engine {
    /// An engine sending to `client` what `outbox` holds, settling and enriching with the
    /// Slurm commands of `cfg` (`SlurmBinDir`) and its `JobInterfaces`.
    pub fn new(cfg: &crate::config::Config, client: Client, outbox: StateDir) -> Engine {
        Engine {
            client,
            outbox,
            slurm: Slurm::from_config(cfg),
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
        let ids = job_ids_of(&provisional);
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

    /// Checks job events queued before this host's role changed (see
    /// [`Sender::check_queued_before`](crate::service::sender::Sender::check_queued_before)):
    /// on a controller pair another controller may have sent a newer state of the job
    /// meanwhile, so each job's record is asked of Slurm first (slurmctld by id, bounded; else
    /// accounting). What it decides, per event:
    /// - Slurm's restart count is higher than the event's: the job ran again since, and that
    ///   run reports itself; the event is dropped;
    /// - a RUNNING whose job has ended (Slurm names its final state): replaced by the end from
    ///   Slurm's record, so a RUNNING never follows the end another controller sent;
    /// - a RUNNING whose job ended without a final state named yet (22.05's COMPLETING), and
    ///   every job a bound left unasked: left pending, asked at a later look;
    /// - anything else (still running, an end, a job Slurm no longer knows): sent as it is.
    ///
    /// An error (nothing sent, nothing decided) when slurmctld cannot be asked at all.
    pub fn check_old(&self, events: Vec<Event>) -> Result<Checked, String> {
        let ids = job_ids_of(&events);
        let answer = records_of(&self.slurm, &ids, END_STATE_TIMEOUT)?;
        let later: std::collections::HashSet<String> = answer.later.into_iter().collect();
        let mut checked = Checked::default();
        for ev in events {
            let Item::Job { job } = &ev.item else {
                checked.decided.push((ev.item.file_name(), ev.seq));
                checked.send.push(ev);
                continue;
            };
            if later.contains(job.job_id()) {
                continue;
            }
            let info = answer.found.get(job.job_id());
            let restarts = info.and_then(|i| i.restarts);
            let what = ev.item.describe();
            if restarts.is_some_and(|r| r > ev.rank.0) {
                log::info!(
                    "outbox: {what} queued before this host's role changed is dropped: Slurm has run the job again since (restart {}), and that run reports itself",
                    restarts.unwrap_or_default()
                );
                if let Err(e) = self.outbox.queue.remove_if_same(&ev) {
                    log::error!("outbox: {e}");
                    continue;
                }
                checked.decided.push((ev.item.file_name(), ev.seq));
                continue;
            }
            let running = ev.rank.1 == 0 && job.state == crate::payload::JobState::Running;
            match info.filter(|i| running && i.ended()) {
                Some(i) if hook::final_state_named(i) => {
                    let cluster = job.location.clone().unwrap_or_default();
                    let end = crate::payload::job_config(i, &cluster).map(|mut end| {
                        end.job_type = job.job_type;
                        end
                    });
                    let Ok(end) = end else {
                        continue; // no nodes in Slurm's record: asked again later
                    };
                    let new =
                        Event::new(Item::Job { job: end }, (i.restarts.unwrap_or(ev.rank.0), 1));
                    log::info!(
                        "outbox: {what} was queued before this host's role changed and the job has ended ({}): sending its end from Slurm's record instead",
                        i.state
                    );
                    match self.outbox.queue.replace_if_same(&ev, &new, true) {
                        Ok(true) => {
                            checked.decided.push((new.item.file_name(), new.seq));
                            checked.send.push(new);
                        }
                        Ok(false) => {} // replaced meanwhile: the next look finds it
                        Err(e) => log::error!("outbox: {e}"),
                    }
                }
                Some(_) => {} // ended, its final state not named yet: asked again later
                None => {
                    checked.decided.push((ev.item.file_name(), ev.seq));
                    checked.send.push(ev);
                }
            }
        }
        Ok(checked)
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

    /// The record of an item as it is sent: a job's by the one rule
    /// ([`crate::attribution::outgoing`]: its recorded representation, else decided now, with
    /// `JobInterfaces=gpu|auto` from the GPUs it holds, asked at send time, never in the hook).
    /// `None` for the other items: sent as queued.
    fn outgoing(&self, ev: &Event) -> Option<crate::attribution::Outgoing> {
        let Item::Job { job } = &ev.item else {
            return None;
        };
        Some(crate::attribution::outgoing(
            self.interfaces,
            &self.outbox.job_reps,
            job,
            crate::attribution::Why::of(ev),
            Some((&self.slurm, &self.outbox)),
            true,
        ))
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
        let outgoing = self.outgoing(&taken);
        let result = match &outgoing {
            Some(o) => post_outgoing(&self.client, o, None),
            None => send_item(&self.client, &taken.item, None),
        };
        let class = answer_class(&result);
        self.account(|r| r.answers[class] += 1);
        let (finish, outcome) = match result {
            Ok(a) => {
                let delay = now_nanos().saturating_sub(taken.seq) / 1_000_000;
                self.account(|r| {
                    r.delivered += 1;
                    r.latencies_ms
                        .push(u64::try_from(delay).unwrap_or(u64::MAX));
                });
                if matches!(taken.item, Item::NodeDelete { .. }) {
                    log::info!(
                        "outbox: {what}: {} ({delay} ms after it was queued)",
                        crate::text::one_line(&a.body, 400)
                    );
                } else {
                    log::info!(
                        "outbox: delivered {what} (HTTP {}, {delay} ms after it was queued)",
                        a.status
                    );
                }
                (Finish::Delivered, Outcome::Delivered)
            }
            Err(e)
                if e.retryable()
                    || matches!(
                        e,
                        SendError::NotConfigured(_)
                            | SendError::TokenRefused { .. }
                            | SendError::NotCloudVision { .. }
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
                    r.retried += 1;
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
        // Before the key is free again: a job's record of how it goes ends with its end.
        if let Item::Job { job } = &taken.item {
            if job.state.is_terminal() && matches!(outcome, Outcome::Delivered | Outcome::Rejected)
            {
                self.outbox.job_reps.forget(&job.key.id);
            }
        }
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
    // What hooks handed in is taken in first: ordered and superseded per key.
    outbox.queue.fold_all();
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

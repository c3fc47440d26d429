//! The delivery engine: what happens to an outbox event on its way to CloudVision, the same for
//! the service's sender threads ([`super::sender`]) and for `cvslurm flush` ([`drain_once`]).
//!
//! - [`Engine::settle`]: the provisional ends (an epilog's event written while the service
//!   ran, judged from exit codes only) are settled against slurmctld, a batch in one question
//!   ([`end_states`]); their records are fixed and written back, and an end slurmctld did not
//!   name as final is marked for verification against Slurm's final record.
//! - [`Engine::deliver_if`]: takes one event, adds the interface MACs `JobInterfaces=gpu|auto`
//!   asks for ([`crate::inventory::attribution::enrich`]), sends it, classifies the answer ([`Outcome`])
//!   and finishes it in the outbox (delivered, kept for a retry, or rejected).
//!
//! What the callers decide is only when to send: the service pauses every worker on a kept
//! event (backoff), `flush` goes through the outbox once and stops at a refused token.

use crate::cloudvision::batch::{verdict, Verdict};
use crate::cloudvision::{Answer, Client, SendError};
use crate::config::JobInterfaces;
pub use crate::inventory::attribution::Forget;
use crate::job_end as hook;
use crate::service::leadership::Gate;
use crate::slurm::runner::Slurm;
use crate::slurm::{self, JobInfo};
use crate::state::queue::{Event, Finish, Item};
use crate::state::StateDir;
use crate::timefmt::now_nanos;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The longest slurmctld may take to answer the batch end-state question.
pub const END_STATE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the sender asks Slurm for the components of a heterogeneous job at most
/// ([`crate::slurm::het_components`]).
pub const HET_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// A RUNNING this host may not send now ([`Gate::may_send_running`]: it does not lead,
    /// or the event waits for its check against Slurm): left pending, nothing sent.
    Held,
}

/// Is the event's head a job's RUNNING (what only the leader sends, see [`Gate`])?
pub fn running_head(ev: &Event) -> bool {
    matches!(&ev.item, Item::Job { job } if job.state == crate::cloudvision::payload::JobState::Running)
}

/// How the given jobs ended, for the settler: accounting first, all of them in one question
/// (`sacct -j ID,…`: [`slurm::sacct_jobs`], at most [`slurm::SACCT_IDS_PER_CALL`] ids a call
/// and [`slurm::SACCT_CALLS_PER_PASS`] calls, the ids past that in
/// [`later`](slurm::Answer::later) with a warning), so that the time it takes does not grow
/// with the number of ends and slurmctld is not asked at all for most of them; then
/// slurmctld by id ([`slurm::jobs_by_id`], bounded) for the jobs accounting holds no final
/// record of yet (no accounting, or a record it has not written yet). Jobs neither knows,
/// and every job when neither can be asked, are absent from [`found`](slurm::Answer::found)
/// (their ends are then judged from the exit codes, as a hook without slurmctld does, and
/// marked for verification); the ids a bound left unasked are in
/// [`later`](slurm::Answer::later), to be asked in the next pass.
pub fn end_states(slurm: &Slurm, ids: &[String], timeout: Duration) -> slurm::Answer {
    settle_records(
        ids,
        timeout,
        |ids, left| slurm::sacct_jobs(slurm, ids, left),
        |ids, left| slurm::jobs_by_id(slurm, ids, left),
    )
}

/// [`end_states`] with its two questions given: `acct` (accounting, all the ids at once) and
/// `ctl` (slurmctld, for the ids accounting has no final record of), each with the time left.
fn settle_records(
    ids: &[String],
    timeout: Duration,
    acct: impl FnOnce(&[String], Duration) -> Result<slurm::Answer, String>,
    ctl: impl FnOnce(&[String], Duration) -> Result<slurm::Answer, String>,
) -> slurm::Answer {
    if ids.is_empty() {
        return slurm::Answer::default();
    }
    let started = Instant::now();
    // Half the time at most: slurmctld gets the rest however slow accounting is.
    let mut answer = match acct(ids, timeout / 2) {
        Ok(a) => slurm::Answer {
            found: a
                .found
                .into_iter()
                .filter(|(_, j)| hook::final_state_named(j))
                .collect(),
            later: a.later,
        },
        Err(e) => {
            log::debug!(
                "settle: accounting not asked about {} job(s) ({e}); asking slurmctld",
                ids.len()
            );
            slurm::Answer::default()
        }
    };
    let rest: Vec<String> = ids
        .iter()
        .filter(|id| !answer.found.contains_key(*id) && !answer.later.contains(id))
        .cloned()
        .collect();
    log::debug!(
        "settle: {} end(s): {} with a final record in accounting (one question, {} ms), {} asked of slurmctld by id",
        ids.len(),
        answer.found.len(),
        started.elapsed().as_millis(),
        rest.len()
    );
    if rest.is_empty() {
        return answer;
    }
    match ctl(&rest, timeout.saturating_sub(started.elapsed())) {
        Ok(a) => {
            answer.found.extend(a.found);
            answer.later.extend(a.later);
        }
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
                rest.len()
            );
        }
    }
    answer
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
        Forget::Rerun => "a new run (a requeue, or a later job under the same id)",
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
    job: &crate::cloudvision::payload::JobConfig,
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

/// Posts a job's record as [`crate::inventory::attribution::outgoing`] decided it: CloudVision's stored
/// record of the job deleted first where it says so ([`forget_stored_job`]), then the record.
/// An end CloudVision took, or refused for good ([`Verdict::Reject`]), ends the job's record
/// of how it goes (`reps`). The one way a job's record is sent (the engine, the hook's own
/// send, `send`).
pub fn post_outgoing(
    client: &Client,
    out: &crate::inventory::attribution::Outgoing,
    reps: &crate::state::job_reps::JobReps,
    deadline: Option<Instant>,
) -> Result<Answer, SendError> {
    if let Some(why) = out.forget {
        forget_stored_job(client, &out.job, why, deadline)?;
        // Deleted (or the server cannot delete): a resend of this run's RUNNING keeps the
        // live record.
        if let Some(run) = out.rerun {
            if let Err(e) = reps.note_rerun_deleted(&out.job.key.id, run) {
                log::warn!("job {}: {e}", out.job.key.id);
            }
        }
    }
    let result = client.post_job(&out.job, deadline);
    // Before the key is free again: a job's record of how it goes ends with its end, once
    // CloudVision took the end or refused it for good (a kept end goes the same way again).
    let answered = match &result {
        Ok(_) => true,
        Err(e) => verdict(e) == Verdict::Reject,
    };
    if answered && out.job.state.is_terminal() {
        reps.forget(&out.job.key.id);
    }
    result
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
    /// Whether this host may send a RUNNING now (see [`Gate`]).
    gate: Arc<Gate>,
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
            gate: Arc::new(Gate::new(crate::service::controller_pair())),
        }
    }

    /// The same engine with `gate` deciding whether a RUNNING may go out (tests).
    #[cfg(test)]
    pub fn with_gate(mut self, gate: Arc<Gate>) -> Engine {
        self.gate = gate;
        self
    }

    /// Whether this host may send a RUNNING now, shared with the monitor.
    pub fn gate(&self) -> Arc<Gate> {
        self.gate.clone()
    }

    /// A RUNNING with its job's end chained behind it, on a host that may not send the
    /// RUNNING ([`Gate`]): the end becomes the pending event alone (CloudVision gets the end,
    /// whose record holds the job's start too), and is returned. `None` when the event has no
    /// end chained, or changed meanwhile.
    pub fn end_alone(&self, ev: &Event) -> Option<Event> {
        let end = *ev.then.clone()?;
        match self.outbox.queue.replace_if_same(ev, &end, true) {
            Ok(true) => {
                log::info!(
                    "outbox: {} not sent: this host does not lead (only the controller in control sends a RUNNING); its job's end goes alone",
                    ev.item.describe()
                );
                Some(end)
            }
            Ok(false) => None,
            Err(e) => {
                log::error!("outbox: {e}");
                None
            }
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
                "{} end(s) left for the next pass: accounting is asked about at most {} jobs per pass, slurmctld about at most {} by id",
                later.len(),
                slurm::SACCT_IDS_PER_CALL * slurm::SACCT_CALLS_PER_PASS,
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
            let running =
                ev.rank.1 == 0 && job.state == crate::cloudvision::payload::JobState::Running;
            match info.filter(|i| running && i.ended()) {
                Some(i) if hook::final_state_named(i) => {
                    let cluster = job.location.clone().unwrap_or_default();
                    let end =
                        crate::cloudvision::payload::job_config(i, &cluster).map(|mut end| {
                            end.job_type = job.job_type;
                            end
                        });
                    let Ok(end) = end else {
                        continue; // no nodes in Slurm's record: asked again later
                    };
                    let mut new =
                        Event::new(Item::Job { job: end }, (i.restarts.unwrap_or(ev.rank.0), 1));
                    new.het = crate::service::het::part_of(i);
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
                None if running && info.is_none() => {
                    // slurmctld holds every job that runs: this one runs no more.
                    log::info!(
                        "outbox: {what} queued before this host's role changed is dropped: Slurm no longer knows the job (neither slurmctld nor accounting)"
                    );
                    if let Err(e) = self.outbox.queue.remove_if_same(&ev) {
                        log::error!("outbox: {e}");
                        continue;
                    }
                    checked.decided.push((ev.item.file_name(), ev.seq));
                }
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

    /// An event of one component of a heterogeneous job ([`Event::het`]), taken: its record
    /// composed from Slurm's record of every component ([`crate::service::het::compose`],
    /// asked by the leader's id within [`HET_TIMEOUT`]). `Err` with the outcome when there is
    /// nothing to send (the event is finished as done). Any other event as it is.
    fn compose_het(&self, taken: Event) -> Result<Event, Outcome> {
        let (Some(part), Item::Job { job }) = (&taken.het, &taken.item) else {
            return Ok(taken);
        };
        let components = match slurm::het_components(&self.slurm, job.job_id(), HET_TIMEOUT) {
            Ok(c) => c,
            Err(e) => {
                log::warn!(
                    "job {}: cannot ask slurmctld for the components of the heterogeneous job ({e}); sending what component {} reported",
                    job.key.id,
                    part.component
                );
                Vec::new()
            }
        };
        match crate::service::het::compose(job, part, &components) {
            crate::service::het::Composed::Send(j) => {
                log::debug!(
                    "job {}: {} of component {} sent as the heterogeneous job's record ({} component(s) in Slurm)",
                    j.key.id,
                    j.state,
                    part.component,
                    components.len()
                );
                let mut t = taken;
                t.item = Item::Job { job: j };
                Ok(t)
            }
            crate::service::het::Composed::Drop(why) => {
                log::info!(
                    "outbox: {} (component {}) not sent: {why}",
                    taken.item.describe(),
                    part.component
                );
                if let Err(e) = self.outbox.queue.finish(&taken, Finish::Delivered) {
                    log::error!("outbox: {e}");
                }
                Err(Outcome::Gone)
            }
        }
    }

    /// The record of an item as it is sent: a job's by the one rule
    /// ([`crate::inventory::attribution::outgoing`]: its recorded representation, else decided now, with
    /// `JobInterfaces=gpu|auto` from the GPUs it holds, asked at send time, never in the hook).
    /// `None` for the other items: sent as queued.
    fn outgoing(&self, ev: &Event) -> Option<crate::inventory::attribution::Outgoing> {
        let Item::Job { job } = &ev.item else {
            return None;
        };
        use crate::inventory::attribution::Why;
        // A later job under the id of one whose end went out: the earlier record goes first.
        let why = match Why::of(ev) {
            Why::Plain if self.outbox.queue.follows_an_earlier_job(ev) => Why::Rerun(ev.rank.0),
            w => w,
        };
        Some(crate::inventory::attribution::outgoing(
            self.interfaces,
            &self.outbox.job_reps,
            job,
            why,
            Some((&self.slurm, &self.outbox, ev.seq)),
            true,
        ))
    }

    /// Takes, enriches, sends and finishes one (settled) event. A RUNNING goes out only when
    /// [`Gate::may_send_running`] says so (`checked(term)`: the event was checked against
    /// Slurm during that term), asked before it is taken and again just before it is posted
    /// (after its attribution, which can take a while): else [`Outcome::Held`], the event
    /// left pending.
    pub fn deliver_if(&self, ev: &Event, checked: &dyn Fn(u128) -> bool) -> Outcome {
        let gated = running_head(ev);
        if gated && !self.gate.may_send_running(ev.seq, checked) {
            return Outcome::Held;
        }
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
        let taken = match self.compose_het(taken) {
            Ok(t) => t,
            Err(outcome) => return outcome,
        };
        let what = taken.item.describe();
        let outgoing = self.outgoing(&taken);
        if gated && !self.gate.may_send_running(taken.seq, checked) {
            if let Err(e) = self.outbox.queue.finish(&taken, Finish::Retry) {
                log::error!("outbox: {e}");
            }
            return Outcome::Held;
        }
        let result = match &outgoing {
            Some(o) => post_outgoing(&self.client, o, &self.outbox.job_reps, None),
            None => send_item(&self.client, &taken.item, None),
        };
        let class = answer_class(&result);
        self.account(|r| r.answers[class] += 1);
        let (finish, outcome) = match result.map_err(|e| (verdict(&e), e)) {
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
            Err((
                Verdict::Keep {
                    retry_after,
                    token_refused,
                },
                e,
            )) => {
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
            Err((Verdict::Reject, e)) => {
                let why = e.to_string();
                self.account(|r| {
                    r.rejected += 1;
                    r.last_error = Some(why.clone());
                });
                log::error!("outbox: {what} rejected, moved to rejected/: {e}");
                (Finish::Reject(why), Outcome::Rejected)
            }
        };
        // A job's record of how it goes ended with its end, in post_outgoing.
        if let Item::Job { job } = &taken.item {
            // On a pair: so that a later catch-up here never sends it again.
            if job.state.is_terminal() && outcome == Outcome::Delivered && self.gate.pair() {
                if let Err(e) = self.outbox.ends_sent.record(&job.key.id) {
                    log::debug!("job {}: its delivered end not recorded: {e}", job.key.id);
                }
            }
        }
        if let Err(e) = self.outbox.queue.finish(&taken, finish) {
            log::error!("outbox: {e}");
        }
        outcome
    }
}

/// The RUNNINGs among `ready` as [`Gate`] allows them in a `flush`: on a host that does not
/// lead, held (an end chained behind one goes alone); on the leader, checked against Slurm
/// first ([`Engine::check_old`]: every one of them was queued before this flush's term).
/// Returns what to send, the events checked, and how many were held.
fn gate_for_flush(
    engine: &Engine,
    ready: Vec<Event>,
) -> (Vec<Event>, std::collections::HashSet<(String, u128)>, usize) {
    let (running, mut rest): (Vec<Event>, Vec<Event>) = ready.into_iter().partition(running_head);
    let mut checked = std::collections::HashSet::new();
    if running.is_empty() || !engine.gate.pair() {
        rest.extend(running);
        return (rest, checked, 0);
    }
    let mut held = 0;
    if engine.gate.term().is_none() {
        for ev in running {
            match engine.end_alone(&ev) {
                Some(end) if end.resolve.is_none() => rest.push(end),
                _ => held += 1,
            }
        }
        if held > 0 {
            log::warn!("outbox: {held} RUNNING event(s) not sent: this host does not lead (only the controller in control sends a RUNNING); they go out when it leads again and the job still runs");
        }
        return (rest, checked, held);
    }
    let n = running.len();
    match engine.check_old(running) {
        Ok(c) => {
            checked.extend(c.decided);
            rest.extend(c.send);
        }
        Err(e) => {
            log::warn!("outbox: {n} RUNNING event(s) not sent: slurmctld cannot say whether their jobs still run: {e}");
            held = n;
        }
    }
    (rest, checked, held)
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
        let (ready, checked, held) = gate_for_flush(engine, ready);
        unsent += held;
        let mut ready = ready;
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
                    let name = (ev.item.file_name(), ev.seq);
                    match engine.deliver_if(&ev, &|_| checked.contains(&name)) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloudvision::payload::{JobConfig, JobState, Key};
    use crate::cloudvision::ClientOptions;
    use crate::config::{Config, Token};
    use crate::service::leadership::Role;

    fn job(id: &str, state: JobState) -> Item {
        Item::Job {
            job: JobConfig {
                key: Key { id: id.into() },
                name: Some("j".into()),
                state,
                start_time: Some("2026-01-01T00:00:00Z".into()),
                end_time: state
                    .is_terminal()
                    .then(|| "2026-01-01T00:01:00Z".to_string()),
                location: Some("c".into()),
                job_type: None,
                nodes: Some(vec!["n1".to_string()].into()),
                interfaces: None,
            },
        }
    }

    /// An engine on `dir` whose CloudVision is nobody (a send is tried and kept), and a gate
    /// of a controller pair whose role the test sets.
    fn engine(dir: &std::path::Path) -> (Engine, Arc<Gate>) {
        let _ = std::fs::remove_dir_all(dir);
        let client = Client::new(ClientOptions {
            server: "127.0.0.1:1".into(),
            token: Token::new("t"),
            ca_file: None,
            pins: Vec::new(),
            insecure: true,
            timeout: Duration::from_secs(2),
        })
        .unwrap();
        let cfg = Config {
            state_dir: dir.to_path_buf(),
            ..Config::default()
        };
        // Decided by the test only (observe): a decision of its own would ask this machine.
        let gate = Arc::new(Gate::with(
            true,
            Box::new(|_| Role::CannotTell("the test decides".into())),
        ));
        let e = Engine::new(&cfg, client, StateDir::new(dir)).with_gate(gate.clone());
        (e, gate)
    }

    fn standby() -> Role {
        Role::Standby {
            why: "test".into(),
            in_control: "ctl2".into(),
        }
    }

    /// The race of a kill -9: a RUNNING queued while this host led (and checked while its
    /// job still ran) must not go out once this host no longer leads, however late
    /// CloudVision answers again: it is held, nothing is tried, and it stays pending.
    #[test]
    fn a_host_that_does_not_lead_never_sends_a_running() {
        let d = std::env::temp_dir().join(format!("cvslurm-engine-gate-{}", std::process::id()));
        let (e, gate) = engine(&d);
        let q = &e.outbox().queue;
        gate.observe(&Role::Leads("test".into()));
        let term = gate.term().unwrap();
        q.enqueue(&Event::new(job("1@c", JobState::Running), (0, 0)))
            .unwrap();
        let ev = q.pending_of(&job("1@c", JobState::Running)).unwrap();
        assert!(ev.seq >= term, "queued during the term");
        gate.observe(&standby());
        assert_eq!(e.deliver_if(&ev, &|_| true), Outcome::Held);
        gate.observe(&Role::CannotTell("test".into()));
        assert_eq!(e.deliver_if(&ev, &|_| true), Outcome::Held);
        assert_eq!(e.take_report(), DrainReport::default(), "nothing tried");
        assert!(q.is_pending(&ev.item));
        // Leading again: a new term; the event, queued before it, waits for its check.
        gate.observe(&Role::Leads("again".into()));
        let t2 = gate.term().unwrap();
        assert!(t2 > term);
        assert_eq!(e.deliver_if(&ev, &|_| false), Outcome::Held);
        assert_eq!(
            e.deliver_if(&ev, &|t| t == term),
            Outcome::Held,
            "checked in the old term"
        );
        // Checked in this term: tried (and kept: nobody answers).
        let tried = e.deliver_if(&ev, &|t| t == t2);
        assert!(matches!(tried, Outcome::Kept { .. }), "{tried:?}");
        assert_eq!(e.take_report().retried, 1);
        // An end is never held.
        gate.observe(&standby());
        q.enqueue(&Event::new(job("2@c", JobState::Completed), (0, 1)))
            .unwrap();
        let end = q.pending_of(&job("2@c", JobState::Completed)).unwrap();
        assert!(matches!(
            e.deliver_if(&end, &|_| false),
            Outcome::Kept { .. }
        ));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A RUNNING with its job's end chained behind it, on a host that does not lead: the end
    /// becomes the pending event alone.
    #[test]
    fn the_end_chained_behind_a_held_running_goes_alone() {
        let d = std::env::temp_dir().join(format!("cvslurm-engine-alone-{}", std::process::id()));
        let (e, gate) = engine(&d);
        let q = &e.outbox().queue;
        q.enqueue(&Event::new(job("3@c", JobState::Running), (0, 0)))
            .unwrap();
        q.enqueue(&Event::new(job("3@c", JobState::Completed), (0, 1)))
            .unwrap();
        let both = q.pending_of(&job("3@c", JobState::Running)).unwrap();
        assert!(both.then.is_some(), "chained");
        gate.observe(&standby());
        let end = e.end_alone(&both).unwrap();
        assert!(matches!(&end.item, Item::Job { job } if job.state == JobState::Completed));
        let now = q.pending_of(&both.item).unwrap();
        assert_eq!(now.seq, end.seq);
        assert!(now.then.is_none());
        // Changed meanwhile: nothing done.
        assert!(e.end_alone(&both).is_none());
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The gate of a single controller always lets a RUNNING go.
    #[test]
    fn one_controller_always_sends() {
        let g = Gate::with(false, Box::new(|_| Role::CannotTell("never asked".into())));
        assert_eq!(g.term(), Some(0));
        assert!(g.may_send_running(1, &|_| false));
    }

    fn info(id: &str, state: &str) -> JobInfo {
        JobInfo {
            job_id: id.into(),
            state: state.into(),
            ..JobInfo::default()
        }
    }

    /// A burst of ends is one question to accounting, whatever its size; slurmctld is asked
    /// (by id) only about the jobs accounting holds no final record of.
    #[test]
    fn a_burst_of_ends_is_asked_in_one_question() {
        let ids: Vec<String> = (1..=200).map(|i| i.to_string()).collect();
        let acct_calls = std::cell::Cell::new(0);
        let asked_ctl = std::cell::RefCell::new(Vec::new());
        let a = settle_records(
            &ids,
            END_STATE_TIMEOUT,
            |asked, left| {
                acct_calls.set(acct_calls.get() + 1);
                assert_eq!(asked.len(), 200, "all at once");
                assert!(left <= END_STATE_TIMEOUT / 2);
                // 1..=150 ended; 151..=180 still RUNNING in accounting; the rest unknown.
                let found = asked
                    .iter()
                    .filter_map(|id| {
                        let n: u32 = id.parse().unwrap();
                        let st = match n {
                            1..=150 => "COMPLETED",
                            151..=180 => "RUNNING",
                            _ => return None,
                        };
                        Some((id.clone(), info(id, st)))
                    })
                    .collect();
                Ok(slurm::Answer {
                    found,
                    later: Vec::new(),
                })
            },
            |asked, _| {
                asked_ctl.borrow_mut().extend(asked.iter().cloned());
                Ok(slurm::Answer {
                    found: asked
                        .iter()
                        .map(|id| (id.clone(), info(id, "CANCELLED")))
                        .collect(),
                    later: Vec::new(),
                })
            },
        );
        assert_eq!(acct_calls.get(), 1);
        let ctl = asked_ctl.into_inner();
        assert_eq!(ctl.len(), 50, "only what accounting has no final record of");
        assert!(ctl.iter().all(|id| id.parse::<u32>().unwrap() > 150));
        assert_eq!(a.found.len(), 200);
        assert_eq!(a.found["7"].state, "COMPLETED");
        assert_eq!(a.found["160"].state, "CANCELLED");
        // No accounting: slurmctld for all; neither: nothing known (exit codes then).
        let all = settle_records(
            &ids[..3],
            END_STATE_TIMEOUT,
            |_, _| Err("accounting storage is disabled".into()),
            |asked, _| {
                assert_eq!(asked.len(), 3);
                Ok(slurm::Answer::default())
            },
        );
        assert!(all.found.is_empty() && all.later.is_empty());
        // Past accounting's bound: those left for the next pass, not asked of slurmctld.
        let bound = settle_records(
            &ids[..4],
            END_STATE_TIMEOUT,
            |_, _| {
                Ok(slurm::Answer {
                    found: [("1".to_string(), info("1", "FAILED"))].into(),
                    later: vec!["4".into()],
                })
            },
            |asked, _| {
                assert_eq!(asked, ["2".to_string(), "3".to_string()]);
                Err("slurmctld down".into())
            },
        );
        assert_eq!(bound.later, ["4".to_string()]);
        assert_eq!(bound.found.len(), 1);
    }
}

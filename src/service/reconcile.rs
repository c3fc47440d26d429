//! Reconciliation, run by the service every `ReconcileInterval`: compares the jobs Slurm is
//! running with what the hooks reported, like Slurm's Slingshot plugin's cleanup pass.
//!
//! - A running job no hook reported (cvslurm installed mid-job, a hook that never ran) gets
//!   its RUNNING sent.
//! - A job the prolog recorded whose epilog never came (slurmctld restarted, hook killed, or
//!   no EpilogSlurmctld at all: the PrologSlurmctld-only set-up) gets its end state from
//!   slurmctld or accounting.
//! - A recorded job that waited for its nodes to boot or power up (`sbatch --reboot`, power
//!   saving, cloud nodes) gets its RUNNING sent anew with the start Slurm set once they were
//!   up ([`follow_boots`]): its prolog ran at the allocation, before Slurm reset the start.
//!
//! One pass costs, on Slurm 24.11 and later, one `squeue --only-job-state` (every job's id and
//! state only: the sweep that finds running jobs no hook reported) and the records of the jobs
//! it must act on by id (bounded per pass, see [`crate::slurm::jobs_by_id`]). Once a sweep
//! has listed [`SWEEP_EVERY_PASS_BELOW`] jobs or more, sweeps run at most every
//! [`SWEEP_EVERY`]; the passes between ask slurmctld only about the jobs the prologs recorded,
//! by id (`squeue --only-job-state -j …`, [`crate::slurm::job_states_of`]), so their cost
//! follows the running jobs, not the queue. Before 24.11, one slurmctld listing (every job's
//! record, bounded by the runner's output limit: past it the pass fails with a warning naming
//! what to do). The ended jobs slurmctld has already forgotten (older than `MinJobAge`) are
//! asked of accounting in bounded `sacct` batches.

use crate::cloudvision::payload::JobState;
use crate::config::Config;
use crate::slurm::runner::Slurm;
use crate::state::queue::{Event, Item};
use crate::state::StateDir;

use crate::slurm::JobInfo;
use crate::slurm::COMMAND_TIMEOUT;
use crate::timefmt::format_epoch;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// Slurm's final record of each of `ids` that has ended: slurmctld's (from `listing`, the
/// pass's own) when it names a final state, else accounting's, asked for all the others in
/// bounded `sacct` batches ([`crate::slurm::sacct_jobs`]). Ids with no final record yet are
/// absent from the map; [`Finals::later`] holds the ids a bound left unasked (asked next pass).
fn final_records(slurm: &Slurm, listing: &[JobInfo], ids: &[String]) -> Finals {
    let mut found: HashMap<String, JobInfo> = crate::slurm::pick(listing.to_vec(), ids)
        .into_iter()
        .filter(|(_, j)| j.ended())
        .collect();
    let ask: Vec<String> = ids
        .iter()
        .filter(|id| !found.contains_key(*id))
        .cloned()
        .collect();
    let mut later = HashSet::new();
    let mut from_accounting = HashSet::new();
    if !ask.is_empty() {
        log::debug!(
            "reconcile: asking accounting (sacct) how {} job(s) slurmctld holds no final record of ended: {}",
            ask.len(),
            crate::text::one_line(&ask.join(","), 200)
        );
        match crate::slurm::sacct_jobs(slurm, &ask, COMMAND_TIMEOUT) {
            Ok(acct) => {
                for (id, j) in acct.found.into_iter().filter(|(_, j)| j.ended()) {
                    from_accounting.insert(id.clone());
                    found.insert(id, j);
                }
                later.extend(acct.later);
            }
            Err(e) => log::warn!(
                "reconcile: accounting could not be asked about {} job(s): {e}",
                ask.len()
            ),
        }
    }
    Finals {
        found,
        later,
        from_accounting,
    }
}

/// What [`final_records`] learned.
#[derive(Default)]
struct Finals {
    /// Each ended job's final record, by id.
    found: HashMap<String, JobInfo>,
    /// The ids a bound left unasked (asked next pass).
    later: HashSet<String>,
    /// The ids of `found` whose record is accounting's (slurmctld no longer held the job).
    from_accounting: HashSet<String>,
}

/// Records in `status` that a bound left `n` jobs (`what`) for the next pass (the warning
/// itself is logged where the bound is, [`crate::slurm::bounds`]).
fn note_later(outbox: &StateDir, what: &str, n: usize) {
    if n > 0 {
        outbox.status.record_slurm_warning(&format!(
            "reconcile: {n} {what} left for the next pass (a bound on the questions to Slurm)"
        ));
    }
}

/// Is the job on its nodes: running, suspended, configuring or completing.
fn is_running(j: &JobInfo) -> bool {
    matches!(
        j.state.as_str(),
        "RUNNING" | "SUSPENDED" | "CONFIGURING" | "COMPLETING"
    ) || j.completing()
        || j.states.iter().any(|s| s == "CONFIGURING")
}

/// Can a RUNNING be sent for the job from here: on its nodes, past its PrologSlurmctld (a
/// configuring job's prolog reports it) and not ending (a completing job's epilog, or the
/// next pass, reports its end; never a RUNNING after it).
pub(crate) fn running_settled(j: &JobInfo) -> bool {
    is_running(j) && !j.completing() && !j.states.iter().any(|s| s == "CONFIGURING")
}

/// Does the job wait for its nodes to boot or power up? Slurm's `POWER_UP_NODE` flag, which
/// 23.02 and later list among the state words; 22.05 gives one word, `CONFIGURING`, which a
/// job also is while its PrologSlurmctld runs: such a job is noted too, and costs one look at
/// its start once it runs (nothing is sent when Slurm kept the start).
fn booting(j: &JobInfo) -> bool {
    j.state == "CONFIGURING" || j.states.iter().any(|s| s == "POWER_UP_NODE")
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// RUNNING events queued for jobs no hook reported.
    pub started: usize,
    /// End events queued for jobs whose epilog never came.
    pub ended: usize,
    /// Recorded jobs whose end could not be learned yet.
    pub unknown: usize,
    /// Ends corrected after Slurm recorded a different final state than the epilog saw.
    pub corrected: usize,
    /// Running jobs sent anew: resized, suspended or resumed since their last record.
    pub reshaped: usize,
    /// Running jobs sent anew with the start Slurm set once their nodes had booted.
    pub restamped: usize,
}

/// The most running jobs whose records (node lists) one pass asks slurmctld for by id, on
/// Slurm 24.11 and later (whose sweep gives states only), to find resized jobs: the recorded
/// running jobs take turns, so a resize shows within ⌈running jobs / this⌉ passes. Jobs
/// whose suspension changed are asked besides (within [`crate::slurm::jobs_by_id`]'s bound).
pub const RESIZE_CHECKS_PER_PASS: usize = 16;

/// Where the turns of [`RESIZE_CHECKS_PER_PASS`] stopped: the last job id checked.
static RESIZE_CURSOR: std::sync::Mutex<Option<(u64, String)>> = std::sync::Mutex::new(None);

/// The name CloudVision shows for a suspended job: its name with this after it.
pub const SUSPENDED_MARK: &str = " (suspended)";

/// What the pass knows of the jobs' records, for [`follow_shapes`].
struct Shapes<'a> {
    /// The shape notes read with the start records.
    shapes: &'a HashMap<String, crate::state::starts::Shape>,
    /// The jobs still recorded after the listing, with the start each prolog recorded.
    recorded: &'a HashMap<String, i64>,
    /// The jobs with an event waiting in the outbox.
    pending: &'a HashSet<String>,
    /// The jobs whose end this process delivered lately.
    ended: &'a HashSet<String>,
    /// The start each job's prolog recorded.
    starts: &'a HashMap<String, i64>,
}

/// The recorded running jobs whose records to ask by id this pass (24.11 and later): every
/// one whose suspension differs from what its note says was sent, then up to `turns` others
/// in id order from where the last pass stopped (`cursor`), wrapping. Returns the ids and
/// the new cursor.
fn pick_checks(
    running: &[(&JobInfo, Option<crate::state::starts::Shape>)],
    turns: usize,
    cursor: Option<&(u64, String)>,
) -> (Vec<String>, Option<(u64, String)>) {
    let order = |j: &JobInfo| {
        (
            j.job_id.parse::<u64>().unwrap_or(u64::MAX),
            j.job_id.clone(),
        )
    };
    let mut ids: Vec<String> = Vec::new();
    let mut rest: Vec<(u64, String)> = Vec::new();
    for (j, shape) in running {
        let suspended = j.state == "SUSPENDED";
        if shape.is_none_or(|s| s.suspended != suspended) {
            ids.push(j.job_id.clone());
        } else {
            rest.push(order(j));
        }
    }
    rest.sort();
    let split = cursor.map_or(0, |c| rest.partition_point(|o| o <= c));
    let turn: Vec<(u64, String)> = rest[split..]
        .iter()
        .chain(rest[..split].iter())
        .take(turns)
        .cloned()
        .collect();
    let next = turn.last().cloned().or_else(|| cursor.cloned());
    ids.extend(turn.into_iter().map(|(_, id)| id));
    (ids, next)
}

/// The record CloudVision should hold now for running job `j` (its record from Slurm, with
/// nodes), if it differs from what was last sent (`was`): its nodes as Slurm has them now,
/// its start as its prolog recorded it (`start`: slurmctld moves a resized job's start to
/// the resize),
/// RUNNING, and while Slurm holds it SUSPENDED its name marked [`SUSPENDED_MARK`]
/// (CloudVision's JobConfig has no suspended state). `None` when nothing changed or the job
/// is not one this pass follows (a heterogeneous job, no nodes, not settled on its nodes).
fn reshaped(
    j: &JobInfo,
    cluster: &str,
    start: i64,
    was: Option<crate::state::starts::Shape>,
) -> Option<(
    crate::cloudvision::payload::JobConfig,
    crate::state::starts::Shape,
)> {
    if !running_settled(j) || crate::service::het::part_of(j).is_some() {
        return None;
    }
    let nodes = j.nodes().ok().filter(|n| !n.is_empty())?;
    let suspended = j.state == "SUSPENDED";
    let now = crate::state::starts::Shape::of(&nodes, suspended);
    if was == Some(now) {
        return None;
    }
    let mut job = crate::cloudvision::payload::running_job(j, cluster, start, nodes);
    mark_suspended(&mut job, j);
    Some((job, now))
}

/// Marks the RUNNING record `job` of Slurm's job `j` as suspended ([`SUSPENDED_MARK`] after
/// its name) while Slurm holds the job SUSPENDED.
pub(crate) fn mark_suspended(job: &mut crate::cloudvision::payload::JobConfig, j: &JobInfo) {
    if j.state == "SUSPENDED" {
        if let Some(n) = job.name.as_mut() {
            n.push_str(SUSPENDED_MARK);
        }
    }
}

/// Sends anew each recorded running job whose node set or suspension differs from what
/// CloudVision was last sent for it (the job's shape note): a resize (`scontrol update
/// NumNodes=`/`NodeList=`), a suspend or a resume runs no hook. From a full listing (before
/// 24.11) every running job is compared; from a sweep of states, the records of the jobs
/// [`pick_checks`] names are asked by id. Returns how many were sent.
fn follow_shapes(
    slurm: &Slurm,
    cluster: &str,
    outbox: &StateDir,
    running: &[&JobInfo],
    full: bool,
    sent: &Shapes,
) -> Result<usize, String> {
    let key_of = |id: &str| crate::cloudvision::payload::job_key(id, cluster);
    let followed: Vec<(&JobInfo, Option<crate::state::starts::Shape>)> = running
        .iter()
        .copied()
        .filter(|j| {
            let key = key_of(&j.job_id);
            sent.recorded.contains_key(&key)
                && !sent.pending.contains(&key)
                && !sent.ended.contains(&key)
                && !crate::service::het::is_follower(j)
        })
        .map(|j| {
            // The notes were read before the listing: a job whose prolog recorded it since
            // has its note on disk now (the prolog writes it before the start record).
            let key = key_of(&j.job_id);
            let shape = sent.shapes.get(&key).copied();
            (j, shape.or_else(|| outbox.starts.load_shape(&key)))
        })
        .collect();
    if followed.is_empty() {
        return Ok(0);
    }
    // What each followed job's note says was sent (the records asked by id are among them).
    let notes: HashMap<&str, Option<crate::state::starts::Shape>> = followed
        .iter()
        .map(|(j, shape)| (j.job_id.as_str(), *shape))
        .collect();
    let records: Vec<JobInfo> = if full {
        followed.iter().map(|(j, _)| (*j).clone()).collect()
    } else {
        let mut cursor = RESIZE_CURSOR.lock().unwrap_or_else(|e| e.into_inner());
        let (ids, next) = pick_checks(&followed, RESIZE_CHECKS_PER_PASS, cursor.as_ref());
        *cursor = next;
        drop(cursor);
        match crate::slurm::jobs_by_id(slurm, &ids, COMMAND_TIMEOUT) {
            Ok(a) => a.found.into_values().collect(),
            Err(e) => {
                log::warn!(
                    "reconcile: slurmctld could not be asked for the nodes of {} running job(s) (resized or suspended jobs are looked at next pass): {e}",
                    ids.len()
                );
                return Ok(0);
            }
        }
    };
    let mut n = 0;
    for j in &records {
        let key = key_of(&j.job_id);
        if crate::service::het::part_of(j).is_some() {
            // Not followed here (its record is composed from every component as it is sent):
            // noted, so that the same suspension is not asked about again.
            if let Ok(nodes) = j.nodes() {
                let now = crate::state::starts::Shape::of(&nodes, j.state == "SUSPENDED");
                if sent.shapes.get(&key) != Some(&now) && sent.recorded.contains_key(&key) {
                    outbox.starts.save_shape(&key, now)?;
                }
            }
            continue;
        }
        let was = notes.get(j.job_id.as_str()).copied().flatten();
        let Some((job, now)) = reshaped(
            j,
            cluster,
            sent.starts
                .get(&key)
                .copied()
                .or(j.start)
                .unwrap_or_else(crate::timefmt::now_epoch),
            was,
        ) else {
            continue;
        };
        let count = job.nodes.as_ref().map_or(0, |v| v.values.len());
        let mut ev = Event::new(Item::Job { job }, (j.restarts.unwrap_or(0), 0));
        // Its interfaces, where it goes by them, follow its nodes.
        ev.anew = true;
        // Queued only while it cannot reach CloudVision after the job's end (checked under
        // the outbox lock); else the next pass looks again, or the job has ended.
        if outbox.queue.enqueue_resend(&ev)? {
            log::info!(
                "reconcile: job {key} is {} on {count} node(s) in Slurm, not as CloudVision was last sent; sending its record anew",
                j.state
            );
            outbox.starts.save_shape(&key, now)?;
            n += 1;
        }
    }
    Ok(n)
}

/// Follows the recorded jobs that wait for their nodes to boot or power up (`sbatch
/// --reboot`, power saving, cloud nodes): their prolog ran at the allocation, and Slurm resets
/// the start to the moment the nodes are ready (`job_config_fini`). A job seen [`booting`]
/// gets a boot note ([`crate::state::starts::Starts::note_boot`]); once it runs, its record is
/// looked at (from the full listing, else asked by id, bounded) and, where Slurm's start
/// differs from the one its prolog reported, its RUNNING is sent anew with Slurm's start,
/// which replaces the prolog's in the start record
/// ([`crate::state::queue::Queue::enqueue_resend_with_start`]). The note goes then, or with
/// the job's record at its end (whose record carries Slurm's start already). Returns how many
/// were sent.
fn follow_boots(
    slurm: &Slurm,
    cluster: &str,
    outbox: &StateDir,
    running: &[&JobInfo],
    full: bool,
    boots: &HashSet<String>,
    sent: &Shapes,
) -> Result<usize, String> {
    let key_of = |id: &str| crate::cloudvision::payload::job_key(id, cluster);
    let mut booted: Vec<&JobInfo> = Vec::new();
    for j in running {
        let key = key_of(&j.job_id);
        if !sent.recorded.contains_key(&key) || crate::service::het::part_of(j).is_some() {
            continue;
        }
        if booting(j) {
            if !boots.contains(&key) {
                match outbox.starts.note_boot(&key) {
                    Ok(()) => log::info!(
                        "reconcile: job {key} waits for its node(s) to boot ({}); Slurm sets its start when they are up, and its RUNNING is sent anew with it",
                        j.states.join(",")
                    ),
                    Err(e) => log::warn!(
                        "reconcile: job {key} waits for its node(s) to boot, but cannot be noted in StateDir (its RUNNING keeps the allocation's start until its end): {e}"
                    ),
                }
            }
        } else if boots.contains(&key)
            && running_settled(j)
            && !sent.pending.contains(&key)
            && !sent.ended.contains(&key)
        {
            booted.push(j);
        }
    }
    if booted.is_empty() {
        return Ok(0);
    }
    let records: Vec<JobInfo> = if full {
        booted.into_iter().cloned().collect()
    } else {
        let ids: Vec<String> = booted.iter().map(|j| j.job_id.clone()).collect();
        match crate::slurm::jobs_by_id(slurm, &ids, COMMAND_TIMEOUT) {
            Ok(a) => a.found.into_values().collect(),
            Err(e) => {
                log::warn!(
                    "reconcile: slurmctld could not be asked for the start of {} job(s) whose nodes booted (asked again next pass): {e}",
                    ids.len()
                );
                return Ok(0);
            }
        }
    };
    let mut n = 0;
    for j in &records {
        let key = key_of(&j.job_id);
        if !running_settled(j) || booting(j) {
            continue;
        }
        let (Some(start), Some((was, restarts))) = (j.start, outbox.starts.load_run(&key)) else {
            continue;
        };
        if j.restarts.is_some_and(|r| r != restarts) {
            continue; // another run: its own prolog reports it
        }
        if start == was {
            outbox.starts.drop_boot_note(&key);
            continue;
        }
        let Some(nodes) = j.nodes().ok().filter(|n| !n.is_empty()) else {
            continue;
        };
        let shape = crate::state::starts::Shape::of(&nodes, j.state == "SUSPENDED");
        let mut job = crate::cloudvision::payload::running_job(j, cluster, start, nodes);
        mark_suspended(&mut job, j);
        let mut ev = Event::new(Item::Job { job }, (restarts, 0));
        // Its nodes booted: its interfaces, where it goes by them, are looked up again.
        ev.anew = true;
        // Queued only while it cannot reach CloudVision after the job's end; else the next
        // pass looks again, or the job has ended (its end carries Slurm's start).
        if outbox
            .queue
            .enqueue_resend_with_start(&ev, start, restarts)?
        {
            log::info!(
                "reconcile: job {key} started at {} in Slurm's record (its nodes booted), not {} as its prolog reported; sending its RUNNING anew with Slurm's start",
                format_epoch(start).unwrap_or_else(|| start.to_string()),
                format_epoch(was).unwrap_or_else(|| was.to_string()),
            );
            outbox.starts.save_shape(&key, shape)?;
            outbox.starts.drop_boot_note(&key);
            n += 1;
        }
    }
    Ok(n)
}

/// How long after the epilog Slurm's final state of a job is trusted to be recorded.
pub const VERIFY_AFTER: Duration = Duration::from_secs(5);

/// Checks the ends the epilogs marked for verification (those slurmctld did not name) against Slurm's final state
/// (slurmctld while it remembers the job, else accounting), in one scontrol and one sacct
/// call, and queues a correction where they differ. With `ask_ctl` false slurmctld is not
/// asked (its listing is past the output bound, the only way 22.05 answers): accounting alone.
pub fn verify_ends(slurm: &Slurm, outbox: &StateDir, ask_ctl: bool) -> Result<usize, String> {
    let marks: Vec<_> = outbox
        .marks
        .to_verify()
        .into_iter()
        .filter(|(_, _, age)| *age >= VERIFY_AFTER)
        .collect();
    if marks.is_empty() {
        return Ok(0);
    }
    let ids: Vec<String> = marks
        .iter()
        .map(|(j, _, _)| j.job_id().to_string())
        .collect();
    let asked = if ask_ctl {
        crate::slurm::jobs_by_id(slurm, &ids, COMMAND_TIMEOUT)
    } else {
        // Why was said where the listing failed.
        log::debug!(
            "reconcile: {} end(s) to verify asked of accounting only (no listing of slurmctld's jobs now)",
            ids.len()
        );
        Ok(crate::slurm::Answer::default())
    };
    let ctl = match asked {
        Ok(a) => a,
        Err(e) => {
            if crate::slurm::held_back(&e) {
                log::debug!("reconcile: ends to verify asked of accounting only: {e}");
            } else {
                log::warn!(
                    "reconcile: slurmctld could not be asked about {} end(s) to verify ({e}); asking accounting",
                    ids.len()
                );
            }
            crate::slurm::Answer::default()
        }
    };
    let mut later: HashSet<String> = ctl.later.iter().cloned().collect();
    let ctl = ctl.found;
    // Only the jobs slurmctld no longer holds, or holds without a final state, go to sacct.
    let ask_acct: Vec<String> = ids
        .iter()
        .filter(|id| !later.contains(*id) && ctl.get(*id).is_none_or(|i| !final_state(i)))
        .cloned()
        .collect();
    let acct = match crate::slurm::sacct_jobs(slurm, &ask_acct, COMMAND_TIMEOUT) {
        Ok(a) => a,
        Err(e) => {
            log::warn!(
                "reconcile: accounting could not be asked about {} end(s) to verify: {e}",
                ask_acct.len()
            );
            crate::slurm::Answer::default()
        }
    };
    later.extend(acct.later);
    note_later(outbox, "end(s) to verify", later.len());
    let acct = acct.found;
    let mut corrected = 0;
    for (job, restarts, age) in marks {
        let id = job.job_id().to_string();
        if later.contains(&id) {
            continue; // a bound left it unasked: the next pass asks
        }
        let info = ctl
            .get(&id)
            .filter(|i| final_state(i))
            .or_else(|| acct.get(&id))
            .cloned();
        let Some(info) = info else {
            if age > GIVE_UP_AFTER {
                outbox.marks.verified(&job.key.id);
            }
            continue;
        };
        if info.restarts.is_some_and(|r| r > restarts) {
            outbox.marks.verified(&job.key.id); // requeued since: the rerun reports itself
            continue;
        }
        match JobState::from_slurm(&info.state) {
            Some(state) if state.is_terminal() => {
                // Slurm's own times (an epilog that could not ask slurmctld in time on 22.05
                // sent the prolog's start and its own clock).
                let start = info.start.and_then(format_epoch).or(job.start_time.clone());
                let end = info.end.and_then(format_epoch).or(job.end_time.clone());
                if state != job.state || start != job.start_time || end != job.end_time {
                    log::info!(
                        "reconcile: job {} ended {} {}..{} in Slurm's record, not {} {}..{} as its epilog saw; correcting",
                        job.key.id,
                        info.state,
                        start.as_deref().unwrap_or("?"),
                        end.as_deref().unwrap_or("?"),
                        job.state,
                        job.start_time.as_deref().unwrap_or("?"),
                        job.end_time.as_deref().unwrap_or("?"),
                    );
                    let mut fixed = job.clone();
                    fixed.state = state;
                    fixed.start_time = start;
                    fixed.end_time = end;
                    let mut ev = Event::new(Item::Job { job: fixed }, (restarts, 2));
                    ev.het = crate::service::het::part_of(&info);
                    outbox.queue.enqueue(&ev)?;
                    corrected += 1;
                }
                outbox.marks.verified(&job.key.id);
            }
            _ => {}
        }
    }
    Ok(corrected)
}

/// Does slurmctld name the job's final state (24.11 and later do while it completes; 22.05
/// says only COMPLETING)?
fn final_state(i: &JobInfo) -> bool {
    i.state != "COMPLETING" && JobState::from_slurm(&i.state).is_some_and(JobState::is_terminal)
}

/// How old a prolog record must be before its job's absence from the running jobs means it
/// ended. The records are read before slurmctld is asked, and a job is listed from its
/// allocation on (its PrologSlurmctld runs after it), so a recorded job missing from the
/// listing has left its nodes; the grace only absorbs clock steps.
pub const RECORD_GRACE: Duration = Duration::from_secs(1);

/// After this long without learning a vanished job's end, its record is dropped.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(7 * 86_400);

/// A sweep (the state of every job slurmctld holds, to find running jobs no hook reported)
/// runs at every pass while the queue is small; once a sweep has listed at least this many
/// jobs, the passes between sweeps ask only about the recorded jobs, by id (24.11 and later).
pub const SWEEP_EVERY_PASS_BELOW: usize = 10_000;

/// With a queue of [`SWEEP_EVERY_PASS_BELOW`] jobs or more, the least time between two sweeps.
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// When the last sweep ran and how many jobs it listed (one service per process).
static LAST_SWEEP: std::sync::Mutex<Option<(std::time::Instant, usize)>> =
    std::sync::Mutex::new(None);

/// Is a sweep due: none yet, the last one listed a small queue, or it is [`SWEEP_EVERY`] old.
fn sweep_due() -> bool {
    sweep_due_after(*LAST_SWEEP.lock().unwrap_or_else(|e| e.into_inner()))
}

/// [`sweep_due`] for a last sweep `(how long ago, jobs listed)`.
fn sweep_due_after(last: Option<(std::time::Instant, usize)>) -> bool {
    match last {
        None => true,
        Some((at, listed)) => listed < SWEEP_EVERY_PASS_BELOW || at.elapsed() >= SWEEP_EVERY,
    }
}

/// Notes a sweep that listed `listed` jobs.
fn swept_now(listed: usize) {
    *LAST_SWEEP.lock().unwrap_or_else(|e| e.into_inner()) =
        Some((std::time::Instant::now(), listed));
}

/// One reconciliation pass. Events go through the outbox (the caller drains it).
pub fn reconcile(
    cfg: &Config,
    slurm: &Slurm,
    cluster: &str,
    outbox: &StateDir,
) -> Result<Report, String> {
    // The records are read twice. Before the listing, for the ends: a record written after
    // the listing belongs to a job that is already listed. After it, for the starts: a
    // prolog that recorded its job (and whose RUNNING may already be delivered and gone from
    // the outbox) while the listing was taken has reported it, and a second RUNNING from
    // here could reach CloudVision after the job's end. A job that ended since the listing
    // (its end delivered, its record gone) is in `recently_ended`.
    let (records, shapes, boots) = outbox.starts.started_jobs_and_notes(GIVE_UP_AFTER);
    // slurmctld's view. A sweep: every job's id and state (24.11 and later, cheap), else
    // every job's whole record (one listing, whose size grows with the queue). Between the
    // sweeps of a big queue (24.11 and later): the states of the recorded jobs, by id.
    let recorded_ids: Vec<String> = records
        .iter()
        .filter_map(|(key, _, _)| {
            let (id, c) = key.rsplit_once('@')?;
            (c == cluster).then(|| id.to_string())
        })
        .collect();
    let mut unasked: HashSet<String> = HashSet::new();
    let by_id = if sweep_due() {
        None
    } else {
        crate::slurm::job_states_of(slurm, &recorded_ids, COMMAND_TIMEOUT)?
    };
    let mut no_listing = false;
    let swept = by_id.is_none();
    let (listing, full) = match by_id {
        Some(answer) => {
            note_later(outbox, "started job(s) to look at", answer.later.len());
            unasked.extend(answer.later);
            let mut v: Vec<JobInfo> = answer.found.into_values().collect();
            v.sort_by_key(|j| j.job_id.parse::<u64>().unwrap_or(u64::MAX));
            v.dedup_by(|a, b| a.job_id == b.job_id);
            (v, false)
        }
        None => match crate::slurm::job_states(slurm, COMMAND_TIMEOUT)? {
            Some(states) => {
                swept_now(states.len());
                (states, false)
            }
            None => match crate::slurm::all_jobs(slurm, COMMAND_TIMEOUT) {
                Ok(all) => (all, true),
                Err(e) => {
                    let too_big = crate::slurm::listing_too_big(&e);
                    if too_big {
                        outbox
                            .status
                            .record_slurm_warning(&format!("reconcile: {e}"));
                    }
                    if !(too_big || crate::slurm::held_back(&e)) {
                        return Err(e);
                    }
                    // No listing of a big queue now (said where it failed): the recorded
                    // jobs' ends, and the ends to verify, are asked of accounting alone.
                    log::debug!("reconcile: accounting only this pass: {e}");
                    no_listing = true;
                    (Vec::new(), true)
                }
            },
        },
    };
    // Without a listing, no running job is known: none is taken for unreported.
    let swept = swept && !no_listing;
    let running: Vec<&JobInfo> = listing.iter().filter(|j| is_running(j)).collect();
    // In this order: an epilog queues its end before it drops its record, and the sender
    // moves it outbox → in flight → delivered, so a job missing from one read is in a later.
    let recorded_after: HashMap<String, i64> = outbox
        .starts
        .started_jobs()
        .into_iter()
        .map(|(k, start, _)| (k, start))
        .collect();
    let pending = outbox.queue.pending_job_keys();
    // The ends delivered lately, but not of a key whose recorded run started after its end
    // (a later job under the same id: its record is followed as any other).
    let ended: HashSet<String> = outbox
        .queue
        .recently_ended_at()
        .into_iter()
        .filter(|(key, end)| {
            !matches!((recorded_after.get(key), end),
                (Some(start), Some(end)) if crate::state::queue::later_run_at(*start, *end))
        })
        .map(|(key, _)| key)
        .collect();
    let mut report = Report::default();
    let key_of = |id: &str| crate::cloudvision::payload::job_key(id, cluster);

    // Jobs no hook reported are found by a sweep only (between sweeps only the recorded
    // jobs were asked about).
    let unreported: Vec<&JobInfo> = running
        .iter()
        .copied()
        .filter(|_| swept)
        .filter(|j| {
            let key = key_of(&j.job_id);
            // A heterogeneous job is reported by its leader, on all its components' nodes.
            !(recorded_after.contains_key(&key) || pending.contains(&key) || ended.contains(&key))
                && running_settled(j)
                && !crate::service::het::is_follower(j)
        })
        .collect();
    // With states only, the unreported running jobs' records are asked by id (bounded: the
    // rest are asked in the next pass), and checked again (a job may have moved on since).
    let records_of_unreported: Vec<JobInfo> = if full || unreported.is_empty() {
        unreported.into_iter().cloned().collect()
    } else {
        let ids: Vec<String> = unreported.iter().map(|j| j.job_id.clone()).collect();
        let answer = crate::slurm::jobs_by_id(slurm, &ids, COMMAND_TIMEOUT)?;
        note_later(
            outbox,
            "running job(s) no hook reported",
            answer.later.len(),
        );
        let mut v: Vec<JobInfo> = answer.found.into_values().collect();
        v.sort_by_key(|j| j.job_id.parse::<u64>().unwrap_or(u64::MAX));
        v.dedup_by(|a, b| a.job_id == b.job_id);
        v
    };
    for j in &records_of_unreported {
        let key = key_of(&j.job_id);
        if !running_settled(j) || crate::service::het::is_follower(j) {
            continue;
        }
        if cfg.job_wanted(&j.name, j.partition.as_deref()).is_err() {
            continue;
        }
        let nodes = match j.nodes() {
            Ok(n) if !n.is_empty() => n,
            _ => continue, // not placed yet
        };
        let start = j.start.unwrap_or_else(crate::timefmt::now_epoch);
        let shape = crate::state::starts::Shape::of(&nodes, false);
        let job = crate::cloudvision::payload::running_job(j, cluster, start, nodes);
        log::info!("reconcile: job {key} runs but no hook reported it; sending RUNNING");
        let mut ev = Event::new(Item::Job { job }, (j.restarts.unwrap_or(0), 0));
        ev.het = crate::service::het::part_of(j);
        outbox.queue.enqueue(&ev)?;
        outbox
            .starts
            .save_run(&key, start, j.restarts.unwrap_or(0))?;
        outbox.starts.save_shape(&key, shape)?;
        report.started += 1;
    }

    if !no_listing {
        let starts: HashMap<String, i64> =
            records.iter().map(|(k, s, _)| (k.clone(), *s)).collect();
        let sent = Shapes {
            starts: &starts,
            shapes: &shapes,
            recorded: &recorded_after,
            pending: &pending,
            ended: &ended,
        };
        report.reshaped = follow_shapes(slurm, cluster, outbox, &running, full, &sent)?;
        report.restamped = follow_boots(slurm, cluster, outbox, &running, full, &boots, &sent)?;
    }

    let listed: std::collections::HashSet<String> =
        running.iter().map(|j| key_of(&j.job_id)).collect();
    // The recorded jobs that left their nodes: (key, prolog's start, age, job id).
    let gone: Vec<(&String, i64, Duration, &str)> = records
        .iter()
        .filter(|(key, _, age)| !listed.contains(key) && *age >= RECORD_GRACE)
        .filter_map(|(key, start, age)| {
            let (id, rec_cluster) = key.rsplit_once('@')?;
            (rec_cluster == cluster && !unasked.contains(id)).then_some((key, *start, *age, id))
        })
        .collect();
    let ids: Vec<String> = gone.iter().map(|g| g.3.to_string()).collect();
    let finals = if ids.is_empty() {
        Finals::default()
    } else if full {
        final_records(slurm, &listing, &ids)
    } else {
        // The ones slurmctld still holds with a final state: their records by id.
        let ended_here: HashSet<&str> = listing
            .iter()
            .filter(|j| j.ended())
            .map(|j| j.job_id.as_str())
            .collect();
        let held: Vec<String> = ids
            .iter()
            .filter(|id| ended_here.contains(id.as_str()))
            .cloned()
            .collect();
        let by_id = match crate::slurm::jobs_by_id(slurm, &held, COMMAND_TIMEOUT) {
            Ok(a) => a,
            Err(e) => {
                log::warn!(
                    "reconcile: slurmctld could not be asked about {} ended job(s): {e}",
                    held.len()
                );
                crate::slurm::Answer::default()
            }
        };
        let records: Vec<JobInfo> = by_id.found.into_values().collect();
        let mut finals = final_records(slurm, &records, &ids);
        finals.later.extend(by_id.later);
        finals
    };
    let Finals {
        found: finals,
        later,
        from_accounting,
    } = finals;
    note_later(outbox, "ended job(s)", later.len());
    for (key, start, age, id) in gone {
        let Some(info) = finals.get(id) else {
            if later.contains(id) {
                report.unknown += 1; // a bound left it unasked: the next pass asks
                continue;
            }
            if age > GIVE_UP_AFTER && !no_listing {
                log::warn!("reconcile: job {key} vanished and its end state is unknown after {} days; forgetting it", age.as_secs() / 86_400);
                outbox.starts.forget(key);
            } else {
                // Requeued or suspended between the listing and now, or accounting has not
                // recorded it yet: looked at again next pass.
                log::debug!("reconcile: job {key}: end state not known yet");
            }
            report.unknown += 1;
            continue;
        };
        let Some(state) = JobState::from_slurm(&info.state).filter(|s| s.is_terminal()) else {
            report.unknown += 1;
            continue;
        };
        // Slurm's own start; the prolog's record where Slurm has none.
        let info = JobInfo {
            start: info.start.or(Some(start)),
            ..info.clone()
        };
        let Ok(mut job) = crate::cloudvision::payload::job_config(&info, cluster) else {
            report.unknown += 1; // no nodes known: look again next pass
            continue;
        };
        job.job_type = None; // a hook's record, not a backfill
        log::info!(
            "reconcile: job {key} ended ({}) but no epilog reported it; sending {state} (Slurm's record from {})",
            info.state,
            if from_accounting.contains(id) {
                "accounting"
            } else {
                "slurmctld"
            }
        );
        let rank = (info.restarts.unwrap_or(0), 1);
        let mut ev = Event::new(Item::Job { job }, rank);
        ev.het = crate::service::het::part_of(&info);
        outbox.queue.enqueue(&ev)?;
        outbox.starts.forget(key);
        report.ended += 1;
    }
    report.corrected = verify_ends(slurm, outbox, !no_listing)?;
    if no_listing && report.corrected > 0 {
        log::info!(
            "reconcile: {} correction(s) queued from accounting while slurmctld's listing is past the output bound or held back",
            report.corrected
        );
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jobs(version: &str, name: &str) -> Vec<JobInfo> {
        let p = format!(
            "{}/tests/fixtures/slurm-{version}/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        crate::slurm::json::parse_jobs(&std::fs::read_to_string(&p).unwrap()).unwrap()
    }

    fn job(id: &str, state: &str, nodelist: &str) -> JobInfo {
        JobInfo {
            job_id: id.into(),
            name: "j".into(),
            partition: Some("p".into()),
            state: state.into(),
            states: vec![state.into()],
            start: Some(100),
            nodelist: Some(nodelist.into()),
            ..JobInfo::default()
        }
    }

    /// A resized job's record differs from the note of what was sent: its new nodes go
    /// out; the same nodes send nothing; a suspended job keeps its nodes, RUNNING, its name
    /// marked; resumed, its plain name again; a heterogeneous job is not followed here.
    #[test]
    fn resized_and_suspended_jobs_are_sent_anew() {
        use crate::state::starts::Shape;
        let v = |s: &[&str]| s.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let sent = Some(Shape::of(&v(&["n1", "n2"]), false));
        assert_eq!(reshaped(&job("7", "RUNNING", "n[1-2]"), "c", 1, sent), None);
        // The start is the prolog's (slurmctld's moves to a resize).
        let (cv, now) = reshaped(&job("7", "RUNNING", "n1"), "c", 50, sent).unwrap();
        assert_eq!(cv.nodes.unwrap().values, ["n1"]);
        assert_eq!(cv.state, JobState::Running);
        assert_eq!(cv.name.as_deref(), Some("j@p"));
        assert_eq!(cv.key.id, "7@c");
        assert_eq!(cv.start_time.as_deref(), format_epoch(50).as_deref());
        assert_eq!(now, Shape::of(&v(&["n1"]), false));
        assert_eq!(
            reshaped(&job("7", "RUNNING", "n1"), "c", 1, Some(now)),
            None
        );
        // No note: sent anew.
        assert!(reshaped(&job("7", "RUNNING", "n1"), "c", 1, None).is_some());
        let (cv, sus) = reshaped(&job("7", "SUSPENDED", "n1"), "c", 1, Some(now)).unwrap();
        assert_eq!(cv.state, JobState::Running);
        assert_eq!(cv.nodes.unwrap().values, ["n1"]);
        assert_eq!(cv.name.as_deref(), Some("j@p (suspended)"));
        assert!(sus.suspended);
        assert_eq!(
            reshaped(&job("7", "SUSPENDED", "n1"), "c", 1, Some(sus)),
            None
        );
        let (cv, back) = reshaped(&job("7", "RUNNING", "n1"), "c", 1, Some(sus)).unwrap();
        assert_eq!(cv.name.as_deref(), Some("j@p"));
        assert_eq!(back, now);
        // Not followed: ending, no nodes, heterogeneous.
        let mut ending = job("7", "COMPLETING", "n1");
        ending.states.push("COMPLETING".into());
        assert_eq!(reshaped(&ending, "c", 1, sent), None);
        assert_eq!(reshaped(&job("7", "RUNNING", ""), "c", 1, sent), None);
        let mut het = job("7", "RUNNING", "n1");
        het.het_job_id = Some("7".into());
        assert_eq!(reshaped(&het, "c", 1, sent), None);
    }

    /// The notes are read before the listing: a job whose prolog recorded it and sent its
    /// RUNNING meanwhile is listed with no note in that read. Its note is on disk (the
    /// prolog writes it first): nothing is sent anew (seen in a full run on 24.11: a second
    /// RUNNING). A job whose note is truly missing is sent anew.
    #[test]
    fn a_job_recorded_after_the_notes_were_read_is_not_sent_anew() {
        use crate::state::starts::Shape;
        let d = std::env::temp_dir().join(format!("cvslurm-reshape-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let outbox = StateDir::new(&d);
        let (before, _, _) = outbox.starts.started_jobs_and_notes(GIVE_UP_AFTER);
        assert!(before.is_empty());
        let shapes = HashMap::new();
        // The prolog, after that read: its note, then its start record.
        let listed = job("7", "RUNNING", "n[1-2]");
        let nodes = listed.nodes().unwrap();
        outbox
            .starts
            .save_shape("7@c", Shape::of(&nodes, false))
            .unwrap();
        outbox.starts.save_run("7@c", 100, 0).unwrap();
        let recorded: HashMap<String, i64> =
            [("7@c".to_string(), 100), ("8@c".to_string(), 100)].into();
        let none = HashSet::new();
        let starts = HashMap::new();
        let sent = Shapes {
            shapes: &shapes,
            recorded: &recorded,
            pending: &none,
            ended: &none,
            starts: &starts,
        };
        // Job 8 was recorded with no note (its prolog could not write one): sent anew.
        outbox.starts.save_run("8@c", 100, 0).unwrap();
        let other = job("8", "RUNNING", "n3");
        let slurm = Slurm::new(None);
        let n = follow_shapes(&slurm, "c", &outbox, &[&listed, &other], true, &sent).unwrap();
        assert_eq!(n, 1);
        let queued: Vec<String> = outbox.queue.pending_job_keys().into_iter().collect();
        assert_eq!(queued, ["8@c"]);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// From a sweep of states, the jobs whose suspension changed are always asked; the
    /// others take turns, [`RESIZE_CHECKS_PER_PASS`]-like, in id order, wrapping.
    #[test]
    fn resize_checks_take_turns() {
        use crate::state::starts::Shape;
        let run = Some(Shape::of(&["n1".to_string()], false));
        let jobs: Vec<JobInfo> = (1..=5)
            .map(|i| job(&i.to_string(), "RUNNING", "n1"))
            .chain([job("9", "SUSPENDED", "n1"), job("10", "RUNNING", "n1")])
            .collect();
        let mut with: Vec<(&JobInfo, Option<Shape>)> = jobs.iter().map(|j| (j, run)).collect();
        with[6].1 = None; // no note: asked
        let (ids, c) = pick_checks(&with, 2, None);
        assert_eq!(ids, ["9", "10", "1", "2"]);
        let (ids, c) = pick_checks(&with, 2, c.as_ref());
        assert_eq!(ids, ["9", "10", "3", "4"]);
        let (ids, c) = pick_checks(&with, 2, c.as_ref());
        assert_eq!(ids, ["9", "10", "5", "1"]);
        assert_eq!(c, Some((1, "1".to_string())));
        let (ids, _) = pick_checks(&with, 100, c.as_ref());
        assert_eq!(ids, ["9", "10", "2", "3", "4", "5", "1"]);
        assert!(pick_checks(&[], 2, c.as_ref()).0.is_empty());
    }

    /// A small queue is swept at every pass; a big one at most every [`SWEEP_EVERY`], the
    /// passes between asking by id.
    #[test]
    fn big_queues_are_swept_once_a_minute() {
        use std::time::Instant;
        let now = Instant::now();
        assert!(sweep_due_after(None));
        assert!(sweep_due_after(Some((now, SWEEP_EVERY_PASS_BELOW - 1))));
        assert!(!sweep_due_after(Some((now, SWEEP_EVERY_PASS_BELOW))));
        assert!(!sweep_due_after(Some((now, 1_000_000))));
        if let Some(old) = now.checked_sub(SWEEP_EVERY) {
            assert!(sweep_due_after(Some((old, 1_000_000))));
        }
    }

    /// The states asked by id (24.11, `squeue --only-job-state -j 1,2,3,4,5_2,99999`) answer
    /// the way the sweep does for the same jobs: the running ones are on their nodes, the
    /// ended one (4) is not, the unknown id is absent.
    #[test]
    fn states_by_id_read_like_the_sweep() {
        let read = |f: &str| {
            let p = format!(
                "{}/tests/fixtures/slurm-24.11/by-id/{f}",
                env!("CARGO_MANIFEST_DIR")
            );
            crate::slurm::json::parse_job_states(&std::fs::read_to_string(&p).unwrap()).unwrap()
        };
        let by_id = read("only-job-state-ids.json");
        let all = read("only-job-state-all.json");
        let ids: Vec<String> = ["1", "2", "3", "4", "6", "99999"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let a = crate::slurm::pick(by_id, &ids);
        let b = crate::slurm::pick(all, &ids);
        assert!(!a.contains_key("99999"));
        for id in ["1", "2", "3", "4"] {
            assert_eq!(
                a.get(id).map(|j| (is_running(j), j.ended())),
                b.get(id).map(|j| (is_running(j), j.ended())),
                "job {id}"
            );
        }
        assert!(a.get("4").is_some_and(|j| j.ended() && !is_running(j)));
        assert!(a.get("1").is_some_and(is_running));
    }

    /// A job whose node reboots first (`sbatch --reboot`, captured on every version by
    /// tests/cluster/capture-reboot.sh): while it waits it is on its nodes, booting and not
    /// settled, in every view reconciliation reads (22.05's listing; the state sweep and the
    /// records by id of 24.11 and later); once the node is up it is settled and no longer
    /// booting, and Slurm's start is later than the one it had at the allocation.
    #[test]
    fn a_job_whose_node_reboots_is_booting_until_it_runs() {
        let read = |v: &str, f: &str| {
            let p = format!(
                "{}/tests/fixtures/slurm-{v}/reboot/{f}",
                env!("CARGO_MANIFEST_DIR")
            );
            std::fs::read_to_string(&p).unwrap()
        };
        let full = |v: &str, f: &str| crate::slurm::json::parse_jobs(&read(v, f)).unwrap();
        let states = |v: &str, f: &str| crate::slurm::json::parse_job_states(&read(v, f)).unwrap();
        for (v, before, after) in [
            ("22.05", "booting-squeue.json", "booted-squeue.json"),
            ("24.11", "booting-scontrol.json", "booted-scontrol.json"),
            ("26.05", "booting-scontrol.json", "booted-scontrol.json"),
        ] {
            let (b, a) = (full(v, before), full(v, after));
            assert_eq!((b.len(), a.len()), (1, 1), "{v}");
            let (b, a) = (&b[0], &a[0]);
            assert!(
                is_running(b) && booting(b) && !running_settled(b),
                "{v}: {b:?}"
            );
            assert!(running_settled(a) && !booting(a), "{v}: {a:?}");
            assert!(a.start > b.start, "{v}: {:?} then {:?}", b.start, a.start);
            if v != "22.05" {
                let (b, a) = (
                    states(v, "booting-only-job-state.json"),
                    states(v, "booted-only-job-state.json"),
                );
                assert!(b.iter().all(|j| is_running(j) && booting(j)), "{v}: {b:?}");
                assert!(
                    a.iter().all(|j| running_settled(j) && !booting(j)),
                    "{v}: {a:?}"
                );
            }
        }
    }

    /// Which jobs count as on their nodes, on real listings of every version.
    #[test]
    fn running_jobs_from_real_output() {
        let ids = |v: &[JobInfo]| {
            let mut ids: Vec<u64> = v
                .iter()
                .filter(|j| is_running(j))
                .map(|j| j.job_id.parse().unwrap())
                .collect();
            ids.sort();
            ids
        };
        // 22.05, while the hostile-name jobs ran: 2, 3 and 4 had ended, 7 was completing.
        let run = jobs("22.05", "json/squeue-running.json");
        assert_eq!(ids(&run), [1, 5, 6, 7, 8, 9, 10]);
        // After they ended: none (MinJobAge keeps them listed as COMPLETED, FAILED, …).
        assert!(ids(&jobs("22.05", "json/squeue-all-ended.json")).is_empty());
        // 24.11: RUNNING and COMPLETED+COMPLETING jobs are on their nodes.
        let q = jobs("24.11", "squeue-json.json");
        assert_eq!(ids(&q).len(), q.len());
        assert_eq!(q.iter().filter(|j| j.completing()).count(), 6);
        assert_eq!(
            ids(&jobs("24.11", "scontrol-json-show-job-finished.json")).len(),
            0
        );
        // The state-only view (24.11 and later) finds the same running jobs as the full
        // listing of the same moment, and the same settled ones.
        let p = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/slurm-24.11/by-id/only-job-state-all.json"
        );
        let states =
            crate::slurm::json::parse_job_states(&std::fs::read_to_string(p).unwrap()).unwrap();
        let full = jobs("24.11", "by-id/scontrol-json-all.json");
        assert_eq!(ids(&states), ids(&full));
        assert_eq!(ids(&states), [1, 2, 5, 6]);
        let settled = |v: &[JobInfo]| v.iter().filter(|j| running_settled(j)).count();
        assert_eq!(settled(&states), settled(&full));
    }
}

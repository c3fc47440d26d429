//! Jobs: what cvslurm needs of one ([`JobInfo`]), read by id or in full listings from
//! slurmctld (squeue/scontrol JSON) or accounting (sacct JSON), the running jobs on some
//! nodes, and the lookup that asks both ([`lookup`]).

use super::runner::{listing_too_big, Slurm};
use super::{bounds, hostlist, json, version, Answer, Ctl, Reader, COMMAND_TIMEOUT};
use super::{
    JOB_QUERIES_PER_PASS, SACCT_CALLS_PER_PASS, SACCT_IDS_PER_CALL, STATE_CALLS_PER_PASS,
    STATE_IDS_PER_CALL,
};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What cvslurm needs of one job, from slurmctld (scontrol or squeue) or accounting (sacct),
/// always read from Slurm's JSON ([`json`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobInfo {
    /// The job id (for array tasks, the task's own id).
    pub job_id: String,
    /// The job name, byte for byte as Slurm holds it.
    pub name: String,
    /// The partition it runs in, if known.
    pub partition: Option<String>,
    /// Slurm's base state word (`RUNNING`, `CANCELLED`, …): the first of [`JobInfo::states`].
    pub state: String,
    /// Every state word Slurm gives: the base state, then flags (`["CANCELLED","COMPLETING"]`
    /// inside the epilog on 24.11 and later; 22.05 gives one word, `COMPLETING`).
    pub states: Vec<String>,
    /// Why, if Slurm says (`TimeLimit`, `None`, …).
    pub reason: Option<String>,
    /// `exit:signal`.
    pub exit_code: Option<String>,
    /// How often slurmctld requeued the job (sacct before 23.02 does not say).
    pub restarts: Option<u32>,
    /// Start, epoch seconds: Slurm's own StartTime.
    pub start: Option<i64>,
    /// End, epoch seconds: Slurm's own EndTime (for a running job, the expected end).
    pub end: Option<i64>,
    /// The compressed node list.
    pub nodelist: Option<String>,
    /// For an array task: the array's job id.
    pub array_job_id: Option<String>,
    /// For an array task: its task id.
    pub array_task_id: Option<String>,
    /// For a component of a heterogeneous job: the leader's job id (`het_job_id`; the
    /// leader's own id for the leader itself).
    pub het_job_id: Option<String>,
    /// For a component of a heterogeneous job: its index (`het_job_offset`; 0 for the leader).
    pub het_job_offset: Option<u32>,
}

impl JobInfo {
    /// The expanded node names.
    pub fn nodes(&self) -> Result<Vec<String>, hostlist::HostlistError> {
        match self.nodelist.as_deref() {
            None | Some("") | Some("(null)") | Some("None assigned") => Ok(Vec::new()),
            Some(l) => hostlist::expand(l),
        }
    }

    /// True while slurmctld still winds the job down (the `COMPLETING` word or flag).
    pub fn completing(&self) -> bool {
        self.states.iter().any(|s| s == "COMPLETING")
    }

    /// Has the job reached one of Slurm's final states (COMPLETED, FAILED, CANCELLED,
    /// TIMEOUT, …)? COMPLETING, RUNNING and the pending states are not final.
    pub fn ended(&self) -> bool {
        let word = self
            .state
            .split_whitespace()
            .next()
            .unwrap_or("")
            .trim_end_matches('+')
            .to_ascii_uppercase();
        matches!(
            word.as_str(),
            "COMPLETED"
                | "FAILED"
                | "NODE_FAIL"
                | "BOOT_FAIL"
                | "OUT_OF_MEMORY"
                | "DEADLINE"
                | "TIMEOUT"
                | "PREEMPTED"
                | "LAUNCH_FAILED"
                | "CANCELLED"
                | "REVOKED"
        )
    }

    /// Is this the job users call `id` (`12345`, or array task `12345_7`)?
    pub fn is(&self, id: &str) -> bool {
        match id.split_once('_') {
            Some((a, t)) => {
                self.array_job_id.as_deref() == Some(a) && self.array_task_id.as_deref() == Some(t)
            }
            None => self.job_id == id,
        }
    }
}

/// True for a job id as users give it: `12345`, or an array task `12345_7`.
pub fn valid_job_id(id: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match id.split_once('_') {
        Some((a, t)) => digits(a) && digits(t),
        None => digits(id),
    }
}

/// Picks the jobs asked for out of a job list: id as asked → the job. For an id listed twice
/// (sacct lists a requeued job's runs in order) the last one wins: the latest run.
pub fn pick(jobs: Vec<JobInfo>, ids: &[String]) -> HashMap<String, JobInfo> {
    let mut found = HashMap::new();
    for j in jobs {
        for id in ids.iter().filter(|id| j.is(id)) {
            found.insert(id.clone(), j.clone());
        }
    }
    found
}

/// Runs a Slurm command that prints JSON and reads its job list. A failed command whose
/// output or error says the job is unknown is an empty list.
fn json_jobs(
    slurm: &Slurm,
    cmd: &str,
    args: &[&str],
    timeout: Duration,
) -> Result<Vec<JobInfo>, String> {
    let out = slurm.run_json(cmd, args, timeout)?;
    if !out.success {
        let why = json::error_of(&out.stdout).unwrap_or_else(|| {
            out.stderr
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim()
                .to_string()
        });
        if why.contains("Invalid job id") {
            return Ok(Vec::new());
        }
        return Err(format!(
            "{cmd} {} failed ({}){}",
            args.join(" "),
            out.status,
            if why.is_empty() {
                String::new()
            } else {
                format!(": {why}")
            }
        ));
    }
    json::parse_jobs(&out.stdout).or_else(|e| {
        if e.contains("Invalid job id") {
            Ok(Vec::new())
        } else {
            Err(format!("{cmd} {}: {e}", args.join(" ")))
        }
    })
}

/// What slurmctld knows of these jobs, asked job by job: `scontrol --all --json show job ID`
/// for each id (REQUEST_JOB_INFO_SINGLE: slurmctld's cost does not grow with its queue), at
/// most [`JOB_QUERIES_PER_PASS`] per call and within `timeout`; the ids past the bound or the
/// time come back in [`Answer::later`] (a warning says so). Slurm before 23.02 has no single-job
/// JSON: there one `squeue --all --json` listing answers for every id (see
/// [`Ctl::Squeue`]). Ids as users give them (`12345`, `12345_7`) → the job; ids slurmctld does
/// not know, and strings that are no job id, are absent from both.
///
/// An error when slurmctld cannot be asked at all (its first answer failed).
pub fn jobs_by_id(slurm: &Slurm, ids: &[String], timeout: Duration) -> Result<Answer, String> {
    let ids = job_ids(ids);
    if ids.is_empty() {
        return Ok(Answer::default());
    }
    let started = Instant::now();
    let (reader, left) = reader_within(slurm, timeout)?;
    if reader.ctl == Ctl::Squeue {
        let jobs = listing(slurm, reader, left)?;
        return Ok(Answer {
            found: pick(jobs, &ids),
            later: Vec::new(),
        });
    }
    bounds::ask_bounded(
        &ids,
        1,
        JOB_QUERIES_PER_PASS,
        timeout.saturating_sub(started.elapsed()),
        "slurmctld (by job id)",
        |one, left| {
            let args = ["--all", reader.json_flag, "show", "job", one[0].as_str()];
            json_jobs(slurm, "scontrol", &args, left)
        },
    )
}

/// Every job slurmctld holds (running, pending, and ended ones for `MinJobAge`), in one call:
/// one REQUEST_JOB_INFO, whose cost grows with the queue (about 6 KB of JSON per job). Past
/// the runner's output bound (`SlurmOutputMaxMiB`, [`Slurm::max_output`]: 64 MiB, about 10,000
/// jobs, by default) it fails, and the failure is a warning naming what to do (see
/// [`listing_too_big`]).
pub fn all_jobs(slurm: &Slurm, timeout: Duration) -> Result<Vec<JobInfo>, String> {
    let (reader, left) = reader_within(slurm, timeout)?;
    listing(slurm, reader, left)
}

/// Every job slurmctld holds, with its id and state only, where this Slurm offers that:
/// `squeue --only-job-state --json` (24.11 and later; REQUEST_JOB_STATE, "reducing work
/// required by slurmctld": about 50 bytes of JSON per job, so 100,000 jobs stay far below the
/// output bound). `None` on older releases: ask [`all_jobs`] there. `--all` is not given:
/// 26.05 refuses it with `--only-job-state`, which takes no partition filter.
pub fn job_states(slurm: &Slurm, timeout: Duration) -> Result<Option<Vec<JobInfo>>, String> {
    let (reader, left) = reader_within(slurm, timeout)?;
    if !reader.only_job_state {
        return Ok(None);
    }
    states(slurm, &["--only-job-state", reader.json_flag], left).map(Some)
}

/// The id and state of each of `ids` that slurmctld holds, asked by id where this Slurm
/// offers that: `squeue --only-job-state --json -j ID,…` (24.11 and later). slurmctld looks
/// each id up (REQUEST_JOB_STATE with the ids; from its job-state cache where
/// `SchedulerParameters=enable_job_state_cache`), so the cost follows the ids asked, not the
/// queue. At most [`STATE_IDS_PER_CALL`] ids per call and [`STATE_CALLS_PER_PASS`] calls; the
/// ids past the bound come back in [`Answer::later`] (a warning says so). Ids slurmctld does
/// not hold are absent. `None` before 24.11.
pub fn job_states_of(
    slurm: &Slurm,
    ids: &[String],
    timeout: Duration,
) -> Result<Option<Answer>, String> {
    let started = Instant::now();
    let (reader, left) = reader_within(slurm, timeout)?;
    if !reader.only_job_state {
        return Ok(None);
    }
    let ids = job_ids(ids);
    if ids.is_empty() {
        return Ok(Some(Answer::default()));
    }
    bounds::ask_bounded(
        &ids,
        STATE_IDS_PER_CALL,
        STATE_CALLS_PER_PASS,
        timeout.saturating_sub(started.elapsed()).min(left),
        "slurmctld (job states by id)",
        |chunk, left| {
            let list = chunk.join(",");
            states(
                slurm,
                &["--only-job-state", reader.json_flag, "-j", list.as_str()],
                left,
            )
        },
    )
    .map(Some)
}

/// Runs one `squeue --only-job-state` and reads its JSON.
fn states(slurm: &Slurm, args: &[&str], left: Duration) -> Result<Vec<JobInfo>, String> {
    let out = slurm.run_json("squeue", args, left)?;
    let shown = format!("squeue {}", args.join(" "));
    if !out.success {
        let why = json::error_of(&out.stdout)
            .or_else(|| {
                out.stderr
                    .lines()
                    .find(|l| !l.trim().is_empty())
                    .map(|l| l.trim().to_string())
            })
            .unwrap_or_default();
        if why.contains("Invalid job id") {
            return Ok(Vec::new()); // none of the ids asked is held any more
        }
        return Err(format!("{shown} failed ({}): {why}", out.status));
    }
    json::parse_job_states(&out.stdout).map_err(|e| format!("{shown}: {e}"))
}

/// A listing of at least this many jobs (or one past the output bound) makes the next full
/// listing wait [`LISTING_BACKOFF`]: each costs slurmctld time in proportion to its queue.
pub const BIG_LISTING: usize = 10_000;

/// The least time between two full listings of a big queue (see [`BIG_LISTING`]).
pub const LISTING_BACKOFF: Duration = Duration::from_secs(60);

/// What an error from a listing held back by [`LISTING_BACKOFF`] starts with.
pub const LISTING_HELD_BACK: &str = "a full job listing is held back";

/// When the last full listing ran and how many jobs it listed (`None`: past the output
/// bound). One per process: the service's questions share it.
static LAST_LISTING: std::sync::Mutex<Option<(Instant, Option<usize>)>> =
    std::sync::Mutex::new(None);

/// Why the last full listing failed, when it was too big or too slow: a held-back question
/// carries it, so that what to do is not lost while the backoff lasts.
static LAST_FAILURE: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Why a full listing may not run now, if it may not (see [`BIG_LISTING`]).
fn listing_held_back(last: Option<(Instant, Option<usize>)>) -> Option<String> {
    let (at, listed) = last?;
    if listed.is_some_and(|n| n < BIG_LISTING) {
        return None;
    }
    let wait = LISTING_BACKOFF.checked_sub(at.elapsed())?;
    Some(format!(
        "{LISTING_HELD_BACK} for {} s: slurmctld held {} at the last one, and each costs it time \
         in proportion to its queue (Slurm before 23.02 has no question by job id)",
        wait.as_secs().max(1),
        listed.map_or(
            "more jobs than one listing may carry in its size or time".to_string(),
            |n| format!("{n} jobs")
        )
    ))
}

/// Did a question fail only because a full listing is held back (see [`BIG_LISTING`])?
pub fn held_back(error: &str) -> bool {
    error.starts_with(LISTING_HELD_BACK)
}

/// The one full listing: `scontrol --all --json show job`, or before 23.02 `squeue --all
/// --json` (22.05 ignores squeue's filters with `--json`). `--all` includes hidden partitions.
/// Once a listing holds [`BIG_LISTING`] jobs, the next waits [`LISTING_BACKOFF`] (an error
/// until then: [`held_back`]); a warning says so when it starts.
fn listing(slurm: &Slurm, reader: Reader, timeout: Duration) -> Result<Vec<JobInfo>, String> {
    let last = *LAST_LISTING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(why) = listing_held_back(last) {
        let failure = LAST_FAILURE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        return Err(match failure {
            Some(f) if last.is_some_and(|(_, n)| n.is_none()) => {
                format!("{why}; the last one: {f}")
            }
            _ => why,
        });
    }
    let out = listing_now(slurm, reader, timeout);
    let listed = match &out {
        Ok(jobs) => Some(Some(jobs.len())),
        // Too big, or too slow to come within its time while slurmctld answers: a big queue.
        Err(e) if slow_for_its_size(e, || slurmctld_answers(slurm)) => Some(None),
        Err(_) => None,
    };
    if let Some(listed) = listed {
        let was_big = last.is_some_and(|(_, n)| n.is_none_or(|n| n >= BIG_LISTING));
        if let Some(n) = listed.filter(|n| *n >= BIG_LISTING && !was_big) {
            log::warn!(
                "slurmctld holds {n} jobs: cvslurm lists them all at most every {} s from now on \
                 (each listing costs slurmctld time in proportion to its queue); meanwhile ends \
                 are judged from their exit codes and checked against accounting later{}",
                LISTING_BACKOFF.as_secs(),
                if reader.ctl == Ctl::Squeue {
                    ". Slurm 23.02 and later are asked job by job"
                } else {
                    ""
                }
            );
        }
        *LAST_LISTING.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), listed));
        *LAST_FAILURE.lock().unwrap_or_else(|e| e.into_inner()) =
            out.as_ref().err().filter(|_| listed.is_none()).cloned();
    }
    out
}

/// Whether a failed full listing says the queue is big: its output past the bound, or no
/// answer within its time while slurmctld does answer a small question (`answers`, asked only
/// then). A listing that timed out because no slurmctld answered at all (a takeover under
/// way, slurmctld down or restarting) says nothing of the queue, and holds nothing back: the
/// next question, once a controller answers, is asked at once.
fn slow_for_its_size(error: &str, answers: impl FnOnce() -> bool) -> bool {
    listing_too_big(error) || (error.contains("no answer within") && answers())
}

/// How long the small question of [`slurmctld_answers`] may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether the slurmctld in control answers a small question now (`scontrol show partition`:
/// a standby backup refuses it, a controller in control answers it at once whatever its queue).
fn slurmctld_answers(slurm: &Slurm) -> bool {
    slurm
        .run("scontrol", &["show", "partition", "-o"], PROBE_TIMEOUT)
        .is_ok()
}

/// [`listing`] without the backoff.
fn listing_now(slurm: &Slurm, reader: Reader, timeout: Duration) -> Result<Vec<JobInfo>, String> {
    let out = match reader.ctl {
        Ctl::Scontrol => json_jobs(
            slurm,
            "scontrol",
            &["--all", reader.json_flag, "show", "job"],
            timeout,
        ),
        Ctl::Squeue => json_jobs(slurm, "squeue", &["--all", reader.json_flag], timeout),
    };
    out.map_err(|e| {
        if listing_too_big(&e) {
            let e = format!(
                "{e}: slurmctld holds more jobs than one listing may carry ({} of JSON, \
                 SlurmOutputMaxMiB in cloudvision.conf); lower MinJobAge in slurm.conf so that \
                 ended jobs leave slurmctld sooner, or raise SlurmOutputMaxMiB{}",
                crate::slurm::runner::size_text(slurm.max_output()),
                if reader.only_job_state {
                    ""
                } else {
                    ", or upgrade Slurm to 24.11 or later (jobs asked by id, a state-only listing)"
                }
            );
            log::warn!("{e}");
            e
        } else {
            e
        }
    })
}

/// Only ids that can be jobs reach a command line (record names in StateDir are not trusted),
/// each once.
fn job_ids(ids: &[String]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    ids.iter()
        .filter(|i| valid_job_id(i) && seen.insert(i.as_str()))
        .cloned()
        .collect()
}

/// The reader for this Slurm release, and what is left of `timeout` after asking for it.
fn reader_within(slurm: &Slurm, timeout: Duration) -> Result<(Reader, Duration), String> {
    let started = std::time::Instant::now();
    let reader = version::version(slurm, timeout)?.reader();
    Ok((reader, timeout.saturating_sub(started.elapsed())))
}

/// What slurmctld knows of one job (see [`jobs_by_id`]); `None` when it does not know it.
pub fn job_by_id(slurm: &Slurm, id: &str, timeout: Duration) -> Result<Option<JobInfo>, String> {
    Ok(jobs_by_id(slurm, &[id.to_string()], timeout)?
        .found
        .remove(id))
}

/// What the accounting database knows of these jobs: `sacct --json -j <ids>` with at most
/// [`SACCT_IDS_PER_CALL`] ids per call and at most [`SACCT_CALLS_PER_PASS`] calls; the ids past
/// that, or past a failed call after the first, come back in [`Answer::later`] (with a
/// warning). An error when the first call fails.
pub fn sacct_jobs(slurm: &Slurm, ids: &[String], timeout: Duration) -> Result<Answer, String> {
    let ids = job_ids(ids);
    if ids.is_empty() {
        return Ok(Answer::default());
    }
    let (reader, left) = reader_within(slurm, timeout)?;
    bounds::ask_bounded(
        &ids,
        SACCT_IDS_PER_CALL,
        SACCT_CALLS_PER_PASS,
        left,
        "accounting (sacct)",
        |chunk, left| {
            let list = chunk.join(",");
            json_jobs(slurm, "sacct", &[reader.json_flag, "-j", &list], left)
        },
    )
}

/// Every component of the heterogeneous job led by `leader`, as Slurm holds them, in offset
/// order: slurmctld by id (`scontrol --all --json show job <leader>` answers with every
/// component; before 23.02 the one listing, as [`jobs_by_id`]), else accounting (`sacct
/// --json -j <leader>` lists every component). Empty when neither holds the job; an error
/// when slurmctld cannot be asked. One question of each at most, within `timeout`.
pub fn het_components(
    slurm: &Slurm,
    leader: &str,
    timeout: Duration,
) -> Result<Vec<JobInfo>, String> {
    if !valid_job_id(leader) || leader.contains('_') {
        return Ok(Vec::new());
    }
    let started = Instant::now();
    let (reader, left) = reader_within(slurm, timeout)?;
    let ctl = if reader.ctl == Ctl::Squeue {
        listing(slurm, reader, left)?
    } else {
        let args = ["--all", reader.json_flag, "show", "job", leader];
        json_jobs(slurm, "scontrol", &args, left)?
    };
    let mine = |jobs: Vec<JobInfo>| {
        let mut c: Vec<JobInfo> = jobs
            .into_iter()
            .filter(|j| j.het_job_id.as_deref() == Some(leader))
            .collect();
        c.sort_by_key(|j| j.het_job_offset);
        // sacct lists a requeued job's runs in order: the last run of each component.
        c.reverse();
        c.dedup_by_key(|j| j.het_job_offset);
        c.reverse();
        c
    };
    let found = mine(ctl);
    if !found.is_empty() {
        return Ok(found);
    }
    let left = timeout.saturating_sub(started.elapsed());
    match json_jobs(slurm, "sacct", &[reader.json_flag, "-j", leader], left) {
        Ok(jobs) => Ok(mine(jobs)),
        Err(e) => {
            log::debug!("accounting not asked about heterogeneous job {leader}: {e}");
            Ok(Vec::new())
        }
    }
}

/// The final states asked of accounting by [`sacct_ended_within`] (`sacct --state`).
pub const SACCT_END_STATES: &str = "CA,CD,DL,F,NF,OOM,PR,TO,BF";

/// The jobs accounting recorded as ended in the last `secs` seconds: `sacct --json --allusers
/// -S now-SECS -E now --state SACCT_END_STATES` (Slurm's own relative times: no time zone to
/// get wrong). One call, bounded by the runner's output bound like every other; only the
/// records whose state is final are returned (a state filter matches a job that was in one
/// of those states during the window).
pub fn sacct_ended_within(
    slurm: &Slurm,
    secs: u64,
    timeout: Duration,
) -> Result<Vec<JobInfo>, String> {
    let (reader, left) = reader_within(slurm, timeout)?;
    let since = format!("now-{}", secs.max(1));
    let jobs = json_jobs(
        slurm,
        "sacct",
        &[
            reader.json_flag,
            "--allusers",
            "-S",
            &since,
            "-E",
            "now",
            "--state",
            SACCT_END_STATES,
        ],
        left,
    )?;
    Ok(jobs.into_iter().filter(JobInfo::ended).collect())
}

/// What the accounting database knows of one job (see [`sacct_jobs`]).
pub fn sacct_job(slurm: &Slurm, id: &str, timeout: Duration) -> Result<Option<JobInfo>, String> {
    Ok(sacct_jobs(slurm, &[id.to_string()], timeout)?
        .found
        .remove(id))
}

/// A running job: its id, its owner's uid and its nodes ([`running_jobs_on`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningJob {
    /// The job id.
    pub id: String,
    /// The uid of the job's owner.
    pub uid: u32,
    /// The job's nodes.
    pub nodes: Vec<String>,
}

/// The running jobs on some of `nodes`, from
/// `squeue --all -h -t RUNNING,CONFIGURING -w <nodes> -o '%A %U %N'` (a job id, a numeric uid
/// and a hostlist: no field a user can write). A configuring job (its nodes booting or
/// powering up, or its PrologSlurmctld running) holds its nodes as a running one does.
pub fn running_jobs_on(
    slurm: &Slurm,
    nodes: &[String],
    timeout: Duration,
) -> Result<Vec<RunningJob>, String> {
    let list = crate::slurm::hostlist::compress(nodes);
    let out = slurm.run(
        "squeue",
        &[
            "--all",
            "-h",
            "-t",
            "RUNNING,CONFIGURING",
            "-w",
            &list,
            "-o",
            "%A %U %N",
        ],
        timeout,
    )?;
    Ok(parse_running_jobs(&out))
}

fn parse_running_jobs(out: &str) -> Vec<RunningJob> {
    out.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (id, uid, nodes) = (f.next()?, f.next()?, f.next()?);
            if f.next().is_some() || id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            Some(RunningJob {
                id: id.to_string(),
                uid: uid.parse().ok()?,
                nodes: crate::slurm::hostlist::expand(nodes).ok()?,
            })
        })
        .collect()
}

/// Finds a job in slurmctld (its JSON), else in accounting (`sacct --json`).
pub fn lookup(slurm: &Slurm, job_id: &str) -> Result<JobInfo, String> {
    let from_ctl = job_by_id(slurm, job_id, COMMAND_TIMEOUT);
    if let Ok(Some(j)) = &from_ctl {
        // Slurm 22.05 names an ending job only COMPLETING; accounting has its final state.
        if j.completing() && !j.ended() {
            if let Ok(Some(a)) = sacct_job(slurm, job_id, COMMAND_TIMEOUT) {
                if a.ended() {
                    return Ok(a);
                }
            }
        }
        return Ok(j.clone());
    }
    match sacct_job(slurm, job_id, COMMAND_TIMEOUT) {
        Ok(Some(j)) => Ok(j),
        Ok(None) => Err(match from_ctl {
            Err(e) => format!("job {job_id}: not found in accounting, and slurmctld could not be asked: {e}"),
            Ok(_) => format!("job {job_id} not found in slurmctld or accounting (sacct)"),
        }),
        Err(e) => Err(match from_ctl {
            Err(ce) => format!("job {job_id}: slurmctld could not be asked ({ce}) and neither could accounting ({e})"),
            Ok(_) => format!("job {job_id} not known to slurmctld, and accounting could not be asked: {e}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::fixture_of;
    use super::*;

    /// A full listing of a small queue runs at every question; after a big one (or one past
    /// the output bound) the next waits a minute, and the error says why.
    #[test]
    fn big_listings_are_asked_once_a_minute() {
        let now = Instant::now();
        assert_eq!(listing_held_back(None), None);
        assert_eq!(listing_held_back(Some((now, Some(BIG_LISTING - 1)))), None);
        let e = listing_held_back(Some((now, Some(BIG_LISTING)))).unwrap();
        assert!(held_back(&e), "{e}");
        assert!(e.contains("held 10000 jobs at the last one"), "{e}");
        let e = listing_held_back(Some((now, None))).unwrap();
        assert!(e.contains("more jobs than one listing may carry"), "{e}");
        if let Some(old) = now.checked_sub(LISTING_BACKOFF) {
            assert_eq!(listing_held_back(Some((old, None))), None);
        }
        assert!(!held_back("squeue --all --json failed (exit status: 1)"));
    }

    /// A listing that timed out holds the next one back only when slurmctld answered a small
    /// question meanwhile (a big queue); when none answered (a takeover under way), the next
    /// question is asked at once. One past the output bound is big without asking.
    #[test]
    fn a_listing_timed_out_without_slurmctld_holds_nothing_back() {
        let timed_out = "squeue --all --json: no answer within 5.0 s";
        assert!(slow_for_its_size(timed_out, || true));
        assert!(!slow_for_its_size(timed_out, || false));
        let asked = std::cell::Cell::new(false);
        assert!(!slow_for_its_size(
            "squeue --all --json failed (exit status: 1)",
            || {
                asked.set(true);
                true
            }
        ));
        assert!(
            !asked.get(),
            "asked slurmctld for an error that is no time-out"
        );
        let past = "squeue --all --json: printed more than 64 MiB";
        assert!(crate::slurm::runner::listing_too_big(past));
        assert!(slow_for_its_size(past, || panic!("asked")));
    }

    fn jobs_of(version: &str, name: &str) -> Vec<JobInfo> {
        json::parse_jobs(&fixture_of(version, name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    fn one(jobs: &[JobInfo], id: &str) -> JobInfo {
        let ids = [id.to_string()];
        pick(jobs.to_vec(), &ids)
            .remove(id)
            .unwrap_or_else(|| panic!("no job {id}"))
    }

    /// 22.05 (Debian 12): `squeue --all --json` while jobs with hostile names ran, and
    /// `sacct --json` after they ended (tests/fixtures/slurm-22.05/json/, job-ids.txt).
    #[test]
    fn json_22_05_squeue_and_sacct() {
        use crate::cloudvision::payload::JobState;
        let run = jobs_of("22.05", "json/squeue-running.json");
        let evil = one(&run, "8");
        assert_eq!(evil.name, "x\nJobId=1 JobState=FAILED NodeList=evil");
        assert_eq!(
            (evil.state.as_str(), evil.nodes().unwrap()),
            ("RUNNING", vec!["n2".to_string()])
        );
        let quotes = one(&run, "9");
        assert_eq!(
            quotes.name,
            "q\"uo'te ünï JobState=CANCELLED NodeList=n1 |1|"
        );
        assert_eq!(quotes.nodes().unwrap(), ["n2"]);
        // Job 1 is the time-limit job on n1, whatever job 8's name says.
        let t = one(&run, "1");
        assert_eq!(
            (t.name.as_str(), t.state.as_str()),
            ("timelimit", "RUNNING")
        );
        assert_eq!(t.nodes().unwrap(), ["n1"]);
        assert!(run.iter().all(|j| j.nodelist.as_deref() != Some("evil")));
        assert!(t.start.unwrap() > 1_700_000_000);
        assert_eq!(t.restarts, Some(0));
        let m = one(&run, "6");
        assert_eq!(m.nodes().unwrap(), ["n3", "n4"]);
        // An array task by its own id and as <array>_<task>.
        let all = jobs_of("22.05", "json/squeue-all-ended.json");
        assert_eq!(one(&all, "7_2").job_id, "7");
        assert_eq!(one(&all, "7_1").job_id, "10");
        assert_eq!(one(&all, "7").array_task_id.as_deref(), Some("2"));
        assert!(pick(all.clone(), &["7_3".into(), "99".into()]).is_empty());
        // Accounting agrees with the parsable text on every job whose name has no newline.
        let acct = jobs_of("22.05", "json/sacct.json");
        let text = fixture_of("22.05", "json/sacct-parsable.txt");
        let mut compared = 0;
        for line in text.lines() {
            let f: Vec<&str> = line.split('|').collect();
            if f.len() != 8 || f[1].contains('`') {
                continue; // the newline name's two lines; slurmdbd stores `"` as a backquote
            }
            let j = one(&acct, f[0]);
            assert_eq!(j.name, f[1], "{line}");
            assert_eq!(j.partition.as_deref(), Some(f[2]));
            assert_eq!(
                JobState::from_slurm(&j.state),
                JobState::from_slurm(f[3]),
                "{line}"
            );
            assert_eq!(j.start.unwrap().to_string(), f[4]);
            assert_eq!(j.end.unwrap().to_string(), f[5]);
            assert_eq!(j.nodelist.as_deref(), Some(f[6]));
            // 22.05's sacct JSON reports a non-zero exit as SUCCESS, return_code 0 (exit3 and
            // the array tasks); states are right, and cvslurm never reads sacct's exit code.
            if !f[7].starts_with("0:") {
                assert_eq!(j.exit_code.as_deref(), Some("0:0"), "{line}");
            } else {
                assert_eq!(j.exit_code.as_deref(), Some(f[7]), "{line}");
            }
            compared += 1;
        }
        assert_eq!(compared, 10);
        let e = one(&acct, "8");
        assert_eq!(e.name, "x\nJobId=1 JobState=FAILED NodeList=evil");
        assert_eq!(
            (e.state.as_str(), e.nodelist.as_deref()),
            ("COMPLETED", Some("n2"))
        );
        assert_eq!(one(&acct, "7_1").job_id, "10");
        assert_eq!(one(&acct, "12").partition.as_deref(), Some("hid"));
        assert_eq!(one(&acct, "5").state, "CANCELLED");
    }

    /// The epilog's end time from slurmctld (22.05 has no SLURM_JOB_END_TIME) is sacct's End,
    /// and its start is sacct's Start, for every ending captured.
    #[test]
    fn json_22_05_epilog_times_equal_sacct() {
        let acct = jobs_of("22.05", "json/sacct.json");
        for case in [
            "completed",
            "exit3",
            "sigkill",
            "cancelled",
            "cancelled-at-once",
            "timeout",
            "multinode",
            "evil-newline",
            "evil-quotes",
            "hidden",
        ] {
            let env = fixture_of("22.05", &format!("json/hookenv-{case}-epilog.txt"));
            let id = env
                .lines()
                .find_map(|l| l.strip_prefix("SLURM_JOB_ID="))
                .unwrap();
            // Byte-identical captures are stored once (sigkill's epilog saw what completed's did).
            let squeue = match case {
                "sigkill" => "completed",
                c => c,
            };
            let ctl = one(
                &jobs_of("22.05", &format!("json/squeue-{squeue}-epilog.json")),
                id,
            );
            let a = one(&acct, id);
            assert_eq!((ctl.start, ctl.end), (a.start, a.end), "{case}");
            assert!(ctl.completing(), "{case}: {:?}", ctl.states);
        }
    }

    /// 24.11 and 26.05: scontrol, squeue and sacct JSON, and slurmctld's answer inside every
    /// captured epilog: the final state comes first, then COMPLETING.
    #[test]
    fn json_24_11_and_26_05() {
        for v in ["24.11", "26.05"] {
            let fin = jobs_of(v, "scontrol-json-show-job-finished.json");
            let ok = one(&fin, "3");
            assert_eq!(
                (ok.name.as_str(), ok.state.as_str()),
                ("ok", "COMPLETED"),
                "{v}"
            );
            assert_eq!(ok.nodes().unwrap(), ["n1"]);
            assert_eq!(ok.exit_code.as_deref(), Some("0:0"));
            assert_eq!(ok.restarts, Some(0));
            assert!(ok.end.unwrap() > ok.start.unwrap());
            let run = one(&jobs_of(v, "scontrol-json-show-job-running.json"), "5");
            assert_eq!(
                (run.state.as_str(), run.partition.as_deref()),
                ("RUNNING", Some("debug"))
            );
            assert!(!run.completing());
            // sacct agrees with scontrol on the same job.
            let acct = jobs_of(v, "sacct-json.json");
            let a = one(&acct, "3");
            assert_eq!(
                (a.start, a.end, a.nodelist.clone()),
                (ok.start, ok.end, ok.nodelist.clone()),
                "{v}"
            );
            assert_eq!(one(&acct, "5").state, "CANCELLED");
            assert_eq!(one(&acct, "2").state, "TIMEOUT");
            assert_eq!(a.restarts, Some(0));
            let q = jobs_of(v, "squeue-json.json");
            assert!(q.len() >= 10, "{v}");
            assert!(
                q.iter().all(|j| !j.state.is_empty() && j.start.is_some()),
                "{v}"
            );
            // Array tasks: 14 and 7 are tasks 1 and 2 of array 7.
            assert_eq!(one(&q, "7_1").job_id, "14");
            assert_eq!(one(&q, "7_2").job_id, "7");
            // Every epilog: the state list's first word is what epilog-summary.tsv recorded.
            let summary = fixture_of(v, "epilog-summary.tsv");
            let mut checked = 0;
            for line in summary.lines().skip(1) {
                let f: Vec<&str> = line.split('\t').collect();
                let (id, want) = (f[1], f[12]);
                let p = format!("hookenv/epilog_slurmctld.{id}.dump.json");
                let Ok(text) = std::fs::read_to_string(format!(
                    "{}/tests/fixtures/slurm-{v}/{p}",
                    env!("CARGO_MANIFEST_DIR")
                )) else {
                    continue;
                };
                let j = one(&json::parse_jobs(&text).unwrap(), id);
                assert_eq!(j.states.join(","), want, "{v} {line}");
                assert!(j.completing());
                checked += 1;
            }
            assert!(checked >= 12, "{v}: {checked}");
        }
    }

    /// 24.11 and 26.05: `squeue --only-job-state --json` names the same jobs, in the same
    /// states, as the full listing of the same moment; array task 1 of array 5 (itself job 6)
    /// comes as `"6_1"`, and is job 6.
    #[test]
    fn only_job_state_agrees_with_the_listing() {
        for (v, all) in [
            ("24.11", "scontrol-json-all.json"),
            ("26.05", "scontrol-json-all-2.json"),
        ] {
            only_job_state_agrees_with_the_listing_of(v, all);
        }
        let c = json::parse_job_states(&fixture_of("26.05", "by-id/only-job-state-cancelled.json"))
            .unwrap();
        assert_eq!((c[0].job_id.as_str(), c[0].ended()), ("1", true));
    }

    fn only_job_state_agrees_with_the_listing_of(v: &str, all: &str) {
        let states =
            json::parse_job_states(&fixture_of(v, "by-id/only-job-state-all.json")).unwrap();
        let full = jobs_of(v, &format!("by-id/{all}"));
        assert_eq!(states.len(), full.len());
        for s in &states {
            let f = full.iter().find(|j| j.job_id == s.job_id).unwrap();
            assert_eq!((&f.states, &f.array_task_id), (&s.states, &s.array_task_id));
            assert_eq!(s.ended(), f.ended());
        }
        let six = states.iter().find(|j| j.job_id == "6").unwrap();
        assert_eq!(six.array_task_id.as_deref(), Some("1"));
        let asked =
            json::parse_job_states(&fixture_of(v, "by-id/only-job-state-ids.json")).unwrap();
        let ids: Vec<&str> = asked.iter().map(|j| j.job_id.as_str()).collect();
        assert_eq!(ids, ["1", "2", "3", "4", "5"]);
        assert!(
            json::parse_job_states(&fixture_of("24.11", "by-id/only-job-state-unknown.json"))
                .unwrap()
                .is_empty()
        );
        // Ids that are no job id are skipped, never passed on.
        let odd = json::parse_job_states(
            r#"{"jobs":[{"job_id":"1 2","state":["RUNNING"]},{"job_id":"-h"},{"job_id":"0"},
               {"job_id":"7_x"},{"job_id":7,"state":"RUNNING"}]}"#,
        )
        .unwrap();
        assert_eq!(odd.len(), 1);
        assert_eq!(
            (odd[0].job_id.as_str(), odd[0].state.as_str()),
            ("7", "RUNNING")
        );
        assert!(
            json::parse_job_states("squeue: fatal: Option --only-job-state only works alone")
                .is_err()
        );
    }

    /// 24.11 and 26.05: one job by id (`scontrol --json show job ID`) is the record the
    /// listing holds (the hostile name a JSON string, nothing more); an unknown id is an empty
    /// list with exit 0, no error.
    #[test]
    fn by_id_answers_24_11_and_26_05() {
        for v in ["24.11", "26.05"] {
            let one = jobs_of(v, "by-id/scontrol-json-one.json");
            assert_eq!(one.len(), 1, "{v}");
            assert_eq!(one[0].name, "x\nJobId=1 JobState=FAILED NodeList=evil");
            let all = jobs_of(v, "by-id/scontrol-json-all.json");
            assert_eq!(all.iter().find(|j| j.job_id == "1"), Some(&one[0]), "{v}");
            assert!(
                jobs_of(v, "by-id/scontrol-json-unknown.json").is_empty(),
                "{v}"
            );
        }
    }

    /// A string that is no job id never reaches a command line (no Slurm is asked at all:
    /// this runner has no scontrol).
    #[test]
    fn no_command_for_strings_that_are_no_job_id() {
        let none = Slurm::new(Some(std::path::Path::new("/nonexistent")));
        let bad: Vec<String> = ["-h", "1,2", "--all", "1 2", ""].map(String::from).to_vec();
        assert_eq!(
            jobs_by_id(&none, &bad, COMMAND_TIMEOUT).unwrap(),
            Answer::default()
        );
        assert_eq!(
            sacct_jobs(&none, &bad, COMMAND_TIMEOUT).unwrap(),
            Answer::default()
        );
        let e = jobs_by_id(&none, &["5".to_string()], COMMAND_TIMEOUT).unwrap_err();
        assert!(e.starts_with("scontrol not found"), "{e}");
    }

    /// 26.05 prints the raw submit line in `scontrol show job -o`: Key=Value words a user
    /// wrote after `--wrap` come after the real fields, so a last-wins text reader took
    /// `NodeList=evil JobState=FAKE`. JSON carries the submit line as one string.
    #[test]
    fn submit_line_words_are_not_fields() {
        let text = fixture_of("26.05", "extra-showjob-injection.txt");
        let line = text.lines().find(|l| l.starts_with("JobId=2 ")).unwrap();
        let last = |k: &str| {
            line.split(' ')
                .filter_map(|t| t.strip_prefix(k))
                .next_back()
                .unwrap()
                .to_string()
        };
        // What the text reader of cvslurm up to this change read (last wins).
        assert_eq!(
            (last("NodeList="), last("JobState=")),
            ("evil".into(), "FAKE".into())
        );
        // The JSON reader takes no text form at all.
        assert!(json::parse_jobs(line).is_err());
        // In 26.05's JSON the submit line is a field of its own, never a source of others.
        let fin = fixture_of("26.05", "scontrol-json-show-job-finished.json");
        let doc: serde_json::Value = serde_json::from_str(&fin).unwrap();
        assert!(doc["jobs"][0]["submit_line"]
            .as_str()
            .unwrap()
            .starts_with("sbatch "));
        let mut forged = doc.clone();
        forged["jobs"][0]["submit_line"] =
            "sbatch --wrap 'sleep 20 # NodeList=evil JobState=FAKE'\nJobId=3 NodeList=evil".into();
        forged["jobs"][0]["name"] = "x\nJobId=3 JobState=FAILED NodeList=evil".into();
        let j = one(&json::parse_jobs(&forged.to_string()).unwrap(), "3");
        assert_eq!(
            (j.state.as_str(), j.nodelist.as_deref()),
            ("COMPLETED", Some("n1"))
        );
    }

    /// 22.05's text `scontrol show job -o` of a job named "x\nJobId=1 JobState=FAILED
    /// NodeList=evil" is two lines, the second one a record of job 1 (captured in the prolog of
    /// job 8). The JSON of the same moment names job 1's true state and nodes.
    #[test]
    fn newline_in_a_name_forges_no_record() {
        let text = fixture_of("22.05", "json/scontrol-text-evil-newline-prolog.txt");
        assert!(text
            .lines()
            .any(|l| l.starts_with("JobId=1 JobState=FAILED NodeList=evil")));
        let run = jobs_of("22.05", "json/squeue-evil-newline-prolog.json");
        assert!(run.iter().filter(|j| j.job_id == "1").count() == 1);
        let t = one(&run, "1");
        assert_eq!(
            (t.name.as_str(), t.state.as_str()),
            ("timelimit", "RUNNING")
        );
        assert_eq!(t.nodes().unwrap(), ["n1"]);
        assert!(json::parse_jobs(&text).is_err());
    }

    #[test]
    fn running_jobs_on_nodes() {
        // squeue -h -t RUNNING -o '%A %U %N' on the e2e cluster with every node allocated.
        let got = parse_running_jobs("14 0 n[1-4]\n15 1000 n2\nbad line\n16 x n1\n17 0 n1 n2\n");
        let job = |id: &str, uid, nodes: &[&str]| RunningJob {
            id: id.into(),
            uid,
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
        };
        assert_eq!(
            got,
            [
                job("14", 0, &["n1", "n2", "n3", "n4"]),
                job("15", 1000, &["n2"])
            ]
        );
    }
}

//! What slurmctld tells PrologSlurmctld/EpilogSlurmctld about a job (its `SLURM_*`
//! environment), and how a job's end is judged from it and from slurmctld's record: the
//! end state and Slurm's own start and end times. Used by the hook, and by the service when
//! it settles the ends hooks handed to it.

use crate::cloudvision::payload::{JobConfig, JobState};
use crate::slurm::hostlist;
use crate::slurm::JobInfo;
use crate::state::queue::EndFacts;
use crate::timefmt::{format_epoch, now_epoch};
use std::collections::HashMap;

pub use crate::slurm::HET_MAX_COMPONENTS;

/// The hook runs for one component of a heterogeneous job (`SLURM_HET_JOB_ID`,
/// `SLURM_HET_JOB_OFFSET`): slurmctld runs PrologSlurmctld and EpilogSlurmctld once per
/// component, `SLURM_JOB_ID` being the component's own id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HetComponent {
    /// `SLURM_HET_JOB_ID`: the leader's job id, the one users see and the job's key.
    pub leader: String,
    /// `SLURM_HET_JOB_OFFSET`: the component's index, 0 for the leader.
    pub offset: u32,
}

/// Reads `SLURM_HET_JOB_ID`/`SLURM_HET_JOB_OFFSET` against the component's own `job_id`:
/// `None` for a job that is not heterogeneous (neither set), an error naming the variable for
/// anything else than a job number and an offset below [`HET_MAX_COMPONENTS`] that agree
/// (offset 0 is the leader itself, any other offset another job id).
pub fn het_component(
    job_id: &str,
    leader: Option<&str>,
    offset: Option<&str>,
) -> Result<Option<HetComponent>, String> {
    let (leader, offset) = match (leader, offset) {
        (None, None) => return Ok(None),
        (Some(l), Some(o)) => (l, o),
        (Some(_), None) => {
            return Err("SLURM_HET_JOB_ID is set without SLURM_HET_JOB_OFFSET".into())
        }
        (None, Some(_)) => {
            return Err("SLURM_HET_JOB_OFFSET is set without SLURM_HET_JOB_ID".into())
        }
    };
    let number = |s: &str| {
        (!s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u32>().ok())
            .flatten()
    };
    let Some(leader_id) = number(leader).filter(|n| *n > 0) else {
        return Err(format!("SLURM_HET_JOB_ID={leader:?} is not a job number"));
    };
    let Some(offset) = number(offset).filter(|o| *o < HET_MAX_COMPONENTS) else {
        return Err(format!(
            "SLURM_HET_JOB_OFFSET={offset:?} is not a component index (0 to {})",
            HET_MAX_COMPONENTS - 1
        ));
    };
    if (offset == 0) != (leader == job_id) {
        return Err(format!(
            "SLURM_HET_JOB_ID={leader:?} and SLURM_HET_JOB_OFFSET={offset} disagree with SLURM_JOB_ID={job_id:?} (only the leader, offset 0, has the leader's id)"
        ));
    }
    Ok(Some(HetComponent {
        // As Slurm prints it (no leading zero): the key is the id users see.
        leader: leader_id.to_string(),
        offset,
    }))
}

/// Which of the two hooks is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// PrologSlurmctld: the job was allocated its nodes.
    Prolog,
    /// EpilogSlurmctld: the job ended.
    Epilog,
}

/// What slurmctld told the hook about the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookEnv {
    /// Prolog or epilog.
    pub phase: Phase,
    /// `SLURM_JOB_ID`.
    pub job_id: String,
    /// `SLURM_CLUSTER_NAME`.
    pub cluster: String,
    /// `SLURM_JOB_NAME`.
    pub name: String,
    /// `SLURM_JOB_PARTITION`.
    pub partition: Option<String>,
    /// `SLURM_JOB_NODELIST`, expanded.
    pub nodes: Vec<String>,
    /// `SLURM_JOB_START_TIME` (Slurm 23.02+).
    pub start: Option<i64>,
    /// `SLURM_JOB_END_TIME` (Slurm 23.02+; in the prolog it is the time limit, not an end).
    pub end: Option<i64>,
    /// `SLURM_JOB_EXIT_CODE2` as (exit code, signal).
    pub exit: Option<(i32, i32)>,
    /// `SLURM_JOB_RESTART_COUNT` (a requeued job runs its hooks again under the same id).
    pub restart_count: u32,
    /// Set when the job is one component of a heterogeneous job: the event is the leader's.
    pub het: Option<HetComponent>,
}

impl HookEnv {
    /// Reads the hook environment. The error names every missing or malformed variable.
    pub fn from_vars(vars: &HashMap<String, String>) -> Result<HookEnv, String> {
        let get = |k: &str| vars.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
        let mut missing = Vec::new();
        let mut bad = Vec::new();
        let phase = match get("SLURM_SCRIPT_CONTEXT") {
            Some("prolog_slurmctld") => Some(Phase::Prolog),
            Some("epilog_slurmctld") => Some(Phase::Epilog),
            Some(other) => {
                bad.push(format!(
                    "SLURM_SCRIPT_CONTEXT={other:?} (cvslurm hook runs as PrologSlurmctld or EpilogSlurmctld only)"
                ));
                None
            }
            None => {
                missing.push("SLURM_SCRIPT_CONTEXT");
                None
            }
        };
        let mut need = |k: &'static str| match get(k) {
            Some(v) => v.to_string(),
            None => {
                missing.push(k);
                String::new()
            }
        };
        let job_id = need("SLURM_JOB_ID");
        let cluster = need("SLURM_CLUSTER_NAME");
        let nodelist = need("SLURM_JOB_NODELIST");
        // A job name may legitimately be empty only in theory; Slurm always sets one.
        let name = vars.get("SLURM_JOB_NAME").map(|s| s.to_string());
        if name.is_none() {
            missing.push("SLURM_JOB_NAME");
        }
        if !job_id.is_empty() && !job_id.bytes().all(|b| b.is_ascii_digit()) {
            bad.push(format!("SLURM_JOB_ID={job_id:?} is not a job number"));
        }
        let nodes = if nodelist.is_empty() {
            Vec::new()
        } else {
            match hostlist::expand(&nodelist) {
                Ok(n) if !n.is_empty() => n,
                Ok(_) => {
                    bad.push("SLURM_JOB_NODELIST is empty".to_string());
                    Vec::new()
                }
                Err(e) => {
                    bad.push(format!("SLURM_JOB_NODELIST: {e}"));
                    Vec::new()
                }
            }
        };
        let epoch = |k: &str, bad: &mut Vec<String>| match get(k) {
            None => None,
            Some(v) => match v.parse::<i64>() {
                Ok(n) if n > 0 => Some(n),
                _ => {
                    bad.push(format!("{k}={v:?} is not epoch seconds"));
                    None
                }
            },
        };
        let start = epoch("SLURM_JOB_START_TIME", &mut bad);
        let end = epoch("SLURM_JOB_END_TIME", &mut bad);
        let exit = match get("SLURM_JOB_EXIT_CODE2") {
            None => None,
            Some(v) => match parse_exit_code(v) {
                Some(x) => Some(x),
                None => {
                    bad.push(format!("SLURM_JOB_EXIT_CODE2={v:?} is not exit:signal"));
                    None
                }
            },
        };
        let het = if bad.iter().any(|b| b.starts_with("SLURM_JOB_ID=")) || job_id.is_empty() {
            None
        } else {
            match het_component(
                &job_id,
                get("SLURM_HET_JOB_ID"),
                get("SLURM_HET_JOB_OFFSET"),
            ) {
                Ok(h) => h,
                Err(e) => {
                    bad.push(e);
                    None
                }
            }
        };
        let restart_count = get("SLURM_JOB_RESTART_COUNT")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if !missing.is_empty() || !bad.is_empty() {
            let mut parts = Vec::new();
            if !missing.is_empty() {
                parts.push(format!("missing {}", missing.join(", ")));
            }
            parts.extend(bad);
            return Err(parts.join("; "));
        }
        Ok(HookEnv {
            phase: phase.expect("checked above"),
            job_id,
            cluster,
            name: name.unwrap_or_default(),
            partition: get("SLURM_JOB_PARTITION").map(String::from),
            nodes,
            start,
            end,
            exit,
            restart_count,
            het,
        })
    }

    /// `<jobid>@<cluster>`; for a component of a heterogeneous job, its leader's id: the
    /// job users see, one record for all its components.
    pub fn key(&self) -> String {
        let id = self.het.as_ref().map_or(&self.job_id, |h| &h.leader);
        crate::cloudvision::payload::job_key(id, &self.cluster)
    }
}

/// Parses `exit:signal` (`0:0`, `3:0`, `0:9`).
pub fn parse_exit_code(s: &str) -> Option<(i32, i32)> {
    let (e, sig) = s.trim().split_once(':')?;
    Some((e.parse().ok()?, sig.parse().ok()?))
}

/// The end state of a job in the epilog.
///
/// The exit codes alone cannot tell a success from a cancel, a time limit or a node-failure
/// requeue: all read `0:0`. So slurmctld's view of the job (its JSON, [`slurm::job_by_id`])
/// decides when there is one:
/// - a final state maps directly: from 23.02 on slurmctld names it while the epilog runs
///   (`["CANCELLED","COMPLETING"]`); 22.05 says only `COMPLETING`, and then:
/// - `Restarts` above the environment's restart count: the job was requeued (node failure),
///   this run failed and the job will run again under the same id;
/// - `Reason=TimeLimit`: it hit its time limit (FAILED, as Slurm's TIMEOUT);
/// - a non-zero exit in `ExitCode`: FAILED;
/// - a signal in `ExitCode` that the job's own exit code (`SLURM_JOB_EXIT_CODE2`) does not
///   show came from outside: scancel, CANCELLED; one it does show killed the job from
///   inside (its own `kill -9`, the OOM killer): FAILED, as Slurm records it.
///
/// Without slurmctld's view the exit codes decide: `0:0` completed, anything else failed.
pub fn epilog_state(
    exit: Option<(i32, i32)>,
    restart_count: u32,
    ctl: Option<&JobInfo>,
) -> JobState {
    let (code, sig) = exit.unwrap_or((0, 0));
    if let Some(j) = ctl {
        let word = j.state.split_whitespace().next().unwrap_or("");
        if !matches!(word, "COMPLETING" | "RUNNING" | "CONFIGURING" | "") {
            if let Some(s) = JobState::from_slurm(&j.state) {
                return s;
            }
        }
        if j.restarts.is_some_and(|r| r > restart_count) || matches!(word, "PENDING" | "REQUEUED") {
            return JobState::Failed;
        }
        if j.reason.as_deref() == Some("TimeLimit") {
            return JobState::Failed;
        }
        if let Some((ccode, csig)) = j.exit_code.as_deref().and_then(parse_exit_code) {
            if ccode != 0 {
                return JobState::Failed;
            }
            if csig != 0 {
                return if sig == 0 {
                    JobState::Cancelled
                } else {
                    JobState::Failed
                };
            }
        }
    }
    if (code, sig) == (0, 0) {
        JobState::Completed
    } else {
        JobState::Failed
    }
}

/// Did slurmctld name the job's final state (`["CANCELLED","COMPLETING"]` from 24.11 on), so
/// the epilog's end needs no verification against Slurm's record?
pub fn final_state_named(j: &JobInfo) -> bool {
    !matches!(
        j.state.as_str(),
        "COMPLETING" | "RUNNING" | "CONFIGURING" | "PENDING" | "REQUEUED" | ""
    ) && JobState::from_slurm(&j.state).is_some_and(JobState::is_terminal)
}

/// Was the job requeued since the run whose hook saw `restart_count` (slurmctld counts more
/// restarts, or holds it pending again)? Then slurmctld's times belong to a new run.
fn requeued_since(j: &JobInfo, restart_count: u32) -> bool {
    j.restarts.is_some_and(|r| r > restart_count)
        || matches!(j.state.as_str(), "PENDING" | "REQUEUED")
}

/// The start and end the epilog sends: Slurm's own StartTime and EndTime, the ones sacct
/// records. From the environment where Slurm gives them (23.02 and later), else from
/// slurmctld's record of the job (22.05), else the prolog's record of the start and "now".
/// A job requeued since (slurmctld counts more restarts than this run's environment) has a
/// new start in slurmctld: this run's start is then the prolog's record.
pub fn epilog_times(
    env: &HookEnv,
    ctl: Option<&JobInfo>,
    recorded_start: Option<i64>,
    now: i64,
) -> (i64, i64) {
    let ctl = ctl.filter(|j| !requeued_since(j, env.restart_count));
    let start = env
        .start
        .or_else(|| ctl.and_then(|j| j.start))
        .or(recorded_start)
        .unwrap_or(now);
    let end = env
        .end
        .or_else(|| ctl.and_then(|j| j.end).filter(|e| *e >= start && *e <= now))
        .unwrap_or(now);
    (start, end)
}

/// The final record of an epilog's event queued for the service (see [`EndFacts`]): the end
/// state from the exit codes and slurmctld's view (`ctl`, `None` when it no longer knows the
/// job or could not be asked), and Slurm's own start and end times where the epilog had none.
pub fn finish_end(job: &JobConfig, facts: &EndFacts, ctl: Option<&JobInfo>) -> JobConfig {
    let mut j = job.clone();
    j.state = epilog_state(facts.exit, facts.restart_count, ctl);
    // slurmctld's times are this run's unless the job was requeued since (a new run, a new
    // start): then the epilog's own stay.
    let this_run = ctl.filter(|c| !requeued_since(c, facts.restart_count));
    if let Some(c) = this_run {
        if !facts.start_known {
            if let Some(s) = c.start.and_then(format_epoch) {
                j.start_time = Some(s);
            }
        }
        if !facts.end_known {
            let start = c.start.unwrap_or(0);
            if let Some(e) = c
                .end
                .filter(|e| *e >= start && *e <= now_epoch())
                .and_then(format_epoch)
            {
                j.end_time = Some(e);
            }
        }
    }
    j
}

#[cfg(test)]
pub(crate) mod tests;

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
        })
    }

    /// `<jobid>@<cluster>`.
    pub fn key(&self) -> String {
        crate::cloudvision::payload::job_key(&self.job_id, &self.cluster)
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
pub(crate) mod tests {
    use super::*;
    use crate::slurm;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn reads_prolog_env() {
        let e = HookEnv::from_vars(&vars(&[
            ("SLURM_SCRIPT_CONTEXT", "prolog_slurmctld"),
            ("SLURM_JOB_ID", "12345"),
            ("SLURM_CLUSTER_NAME", "hpc-cluster-west"),
            ("SLURM_JOB_NAME", "gpt-training"),
            ("SLURM_JOB_PARTITION", "gpu"),
            ("SLURM_JOB_NODELIST", "gpu-node-[1-4]"),
        ]))
        .unwrap();
        assert_eq!(e.phase, Phase::Prolog);
        assert_eq!(e.key(), "12345@hpc-cluster-west");
        assert_eq!(e.nodes.len(), 4);
        assert_eq!(e.restart_count, 0);
    }

    #[test]
    fn names_every_missing_or_bad_variable() {
        let e =
            HookEnv::from_vars(&vars(&[("SLURM_SCRIPT_CONTEXT", "epilog_slurmctld")])).unwrap_err();
        assert_eq!(
            e,
            "missing SLURM_JOB_ID, SLURM_CLUSTER_NAME, SLURM_JOB_NODELIST, SLURM_JOB_NAME"
        );
        let e = HookEnv::from_vars(&vars(&[
            ("SLURM_SCRIPT_CONTEXT", "prolog"),
            ("SLURM_JOB_ID", "12x"),
            ("SLURM_CLUSTER_NAME", "c"),
            ("SLURM_JOB_NAME", "j"),
            ("SLURM_JOB_NODELIST", "n[3-1]"),
            ("SLURM_JOB_EXIT_CODE2", "zero"),
            ("SLURM_JOB_START_TIME", "-5"),
        ]))
        .unwrap_err();
        assert!(e.contains("SLURM_SCRIPT_CONTEXT=\"prolog\""), "{e}");
        assert!(
            e.contains("SLURM_JOB_ID=\"12x\" is not a job number"),
            "{e}"
        );
        assert!(e.contains("SLURM_JOB_NODELIST: bad hostlist"), "{e}");
        assert!(e.contains("SLURM_JOB_EXIT_CODE2=\"zero\""), "{e}");
        assert!(e.contains("SLURM_JOB_START_TIME=\"-5\""), "{e}");
    }

    fn ctl(state: &str, reason: &str, exit: &str) -> JobInfo {
        JobInfo {
            job_id: "1".into(),
            name: "j".into(),
            state: state.into(),
            states: vec![state.into()],
            reason: Some(reason.into()),
            exit_code: Some(exit.into()),
            restarts: Some(0),
            ..JobInfo::default()
        }
    }

    #[test]
    fn epilog_state_without_slurmctld_follows_exit_codes() {
        assert_eq!(epilog_state(Some((0, 0)), 0, None), JobState::Completed);
        assert_eq!(epilog_state(Some((3, 0)), 0, None), JobState::Failed);
        assert_eq!(epilog_state(Some((0, 9)), 0, None), JobState::Failed);
        assert_eq!(epilog_state(None, 0, None), JobState::Completed);
    }

    pub(crate) fn env_of(text: &str) -> HookEnv {
        // One variable per line; a line without `=` continues the previous value (a job name
        // with a newline).
        let mut vars: Vec<(String, String)> = Vec::new();
        for l in text.lines() {
            match l.split_once('=').filter(|(k, _)| k.starts_with("SLURM")) {
                Some((k, v)) => vars.push((k.to_string(), v.to_string())),
                None => {
                    if let Some((_, v)) = vars.last_mut() {
                        v.push('\n');
                        v.push_str(l);
                    }
                }
            }
        }
        HookEnv::from_vars(&vars.into_iter().collect()).unwrap()
    }

    pub(crate) fn fixture(path: &str) -> String {
        let p = format!("{}/tests/fixtures/{path}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
    }

    /// Every ending captured on real Slurm 22.05 (tests/fixtures/slurm-22.05/json/): the hook
    /// environment and what `squeue --all --json` said inside the epilog (state COMPLETING
    /// for every ending: the rules on ExitCode, Reason and Restarts decide).
    #[test]
    fn epilog_state_of_every_ending_on_22_05() {
        let want = [
            ("completed", JobState::Completed),
            ("exit3", JobState::Failed),
            ("sigkill", JobState::Failed),
            ("cancelled", JobState::Cancelled),
            ("cancelled-at-once", JobState::Cancelled),
            ("timeout", JobState::Failed),
            ("multinode", JobState::Completed),
            ("array", JobState::Failed), // task 2 exits 2
            ("evil-newline", JobState::Completed),
            ("evil-quotes", JobState::Completed),
            ("hidden", JobState::Completed),
        ];
        for (case, state) in want {
            let env = env_of(&fixture(&format!(
                "slurm-22.05/json/hookenv-{case}-epilog.txt"
            )));
            assert_eq!(env.phase, Phase::Epilog);
            let jobs = slurm::json::parse_jobs(&fixture(&format!(
                "slurm-22.05/json/squeue-{case}-epilog.json"
            )))
            .unwrap();
            let ctl = slurm::pick(jobs, std::slice::from_ref(&env.job_id))
                .remove(&env.job_id)
                .unwrap();
            assert_eq!(ctl.states, ["COMPLETING"], "{case}");
            assert!(!final_state_named(&ctl), "{case}");
            assert_eq!(
                epilog_state(env.exit, env.restart_count, Some(&ctl)),
                state,
                "{case}"
            );
            // The times sent are slurmctld's, which sacct records (checked in slurm/mod.rs).
            let (start, end) = epilog_times(&env, Some(&ctl), Some(1), i64::MAX);
            assert_eq!((Some(start), Some(end)), (ctl.start, ctl.end), "{case}");
        }
        let env = env_of(&fixture("slurm-22.05/json/hookenv-evil-newline-epilog.txt"));
        assert_eq!(env.name, "x\nJobId=1 JobState=FAILED NodeList=evil");
    }

    /// 24.11 and 26.05: slurmctld names the final state inside the epilog, so a cancel is
    /// CANCELLED from the epilog itself, in every captured ending (epilog-summary.tsv).
    #[test]
    fn epilog_state_of_every_ending_on_24_11_and_26_05() {
        for v in ["24.11", "26.05"] {
            let summary = fixture(&format!("slurm-{v}/epilog-summary.tsv"));
            let mut checked = 0;
            for line in summary.lines().skip(1) {
                let f: Vec<&str> = line.split('\t').collect();
                let (case, id) = (f[0], f[1]);
                let want = match case {
                    c if c.starts_with("cancel") => JobState::Cancelled,
                    "exit3" | "sigkill" | "timeout" => JobState::Failed,
                    _ => JobState::Completed,
                };
                let dir = format!("slurm-{v}/hookenv/epilog_slurmctld.{id}.dump");
                let p = format!("{}/tests/fixtures/{dir}.json", env!("CARGO_MANIFEST_DIR"));
                let Ok(json) = std::fs::read_to_string(&p) else {
                    continue;
                };
                let env = env_of(&fixture(&format!("{dir}.env")));
                let jobs = slurm::json::parse_jobs(&json).unwrap();
                let ctl = slurm::pick(jobs, std::slice::from_ref(&env.job_id))
                    .remove(&env.job_id)
                    .unwrap();
                assert_eq!(
                    epilog_state(env.exit, env.restart_count, Some(&ctl)),
                    want,
                    "{v} {case}"
                );
                assert!(final_state_named(&ctl), "{v} {case}");
                // Without slurmctld, a cancel looks like a success.
                if want == JobState::Cancelled {
                    assert_eq!(
                        epilog_state(env.exit, env.restart_count, None),
                        JobState::Completed
                    );
                }
                // The environment's times are Slurm's own and win.
                let (start, end) = epilog_times(&env, Some(&ctl), Some(1), i64::MAX);
                assert_eq!((Some(start), Some(end)), (env.start, env.end), "{v} {case}");
                checked += 1;
            }
            assert!(checked >= 12, "{v}: {checked}");
        }
    }

    #[test]
    fn epilog_times_of_a_requeued_run_are_its_own() {
        let env = HookEnv {
            phase: Phase::Epilog,
            job_id: "1".into(),
            cluster: "c".into(),
            name: "j".into(),
            partition: None,
            nodes: vec!["n1".into()],
            start: None,
            end: None,
            exit: Some((0, 0)),
            restart_count: 0,
        };
        let mut requeued = ctl("PENDING", "BeginTime", "0:0");
        requeued.restarts = Some(1);
        requeued.start = Some(500); // slurmctld's start of the next run
        assert_eq!(
            epilog_times(&env, Some(&requeued), Some(100), 200),
            (100, 200)
        );
        let mut done = ctl("COMPLETING", "None", "0:0");
        done.start = Some(101);
        done.end = Some(150);
        assert_eq!(epilog_times(&env, Some(&done), Some(100), 200), (101, 150));
        // An end in the future (a running job's expected end) is not an end.
        done.end = Some(900);
        assert_eq!(epilog_times(&env, Some(&done), Some(100), 200), (101, 200));
        assert_eq!(epilog_times(&env, None, None, 200), (200, 200));
    }

    #[test]
    fn epilog_state_asks_slurmctld_when_exit_codes_say_nothing() {
        use JobState::*;
        let s = |exit, st, reason, code| epilog_state(Some(exit), 0, Some(&ctl(st, reason, code)));
        // At epilog time slurmctld still says COMPLETING; ExitCode and Reason tell the rest.
        assert_eq!(s((0, 0), "COMPLETING", "None", "0:0"), Completed);
        assert_eq!(s((0, 0), "COMPLETING", "None", "0:15"), Cancelled);
        assert_eq!(s((0, 0), "COMPLETING", "TimeLimit", "0:15"), Failed);
        assert_eq!(s((3, 0), "COMPLETING", "NonZeroExitCode", "3:0"), Failed);
        assert_eq!(s((0, 9), "COMPLETING", "JobLaunchFailure", "0:9"), Failed);
        // A final state maps directly.
        assert_eq!(s((0, 0), "CANCELLED", "None", "0:15"), Cancelled);
        assert_eq!(s((0, 0), "TIMEOUT", "TimeLimit", "0:0"), Failed);
        assert_eq!(s((0, 0), "NODE_FAIL", "None", "0:0"), Failed);
        assert_eq!(s((0, 0), "COMPLETED", "None", "0:0"), Completed);
        // Requeued after a node failure: Restarts went up, the exit codes look like success.
        let mut requeued = ctl("COMPLETING", "None", "0:0");
        requeued.restarts = Some(1);
        assert_eq!(epilog_state(Some((0, 0)), 0, Some(&requeued)), Failed);
        // The requeued run's own epilog (restart count 1 in its environment) is judged normally.
        assert_eq!(epilog_state(Some((0, 0)), 1, Some(&requeued)), Completed);
    }
}

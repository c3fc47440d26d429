//! The job-end judgement's tests: the hook environments and slurmctld records captured on
//! real Slurm (tests/fixtures/), and what each ending is judged.

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
    let e = HookEnv::from_vars(&vars(&[("SLURM_SCRIPT_CONTEXT", "epilog_slurmctld")])).unwrap_err();
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
        // Byte-identical captures are stored once: inside these two epilogs `squeue --all`
        // printed what it printed inside completed's and at the running moment.
        let squeue = match case {
            "sigkill" => "squeue-completed-epilog".to_string(),
            "array" => "squeue-running".to_string(),
            c => format!("squeue-{c}-epilog"),
        };
        let jobs =
            slurm::json::parse_jobs(&fixture(&format!("slurm-22.05/json/{squeue}.json"))).unwrap();
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
        het: None,
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

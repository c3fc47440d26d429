//! Reconciliation, run by the service every `ReconcileInterval`: compares the jobs Slurm is
//! running with what the hooks reported, like Slurm's Slingshot plugin's cleanup pass.
//!
//! - A running job no hook reported (cvslurm installed mid-job, a hook that never ran) gets
//!   its RUNNING sent.
//! - A job the prolog recorded whose epilog never came (slurmctld restarted, hook killed) gets
//!   its end state from slurmctld or accounting.

use crate::config::Config;
use crate::hostlist;
use crate::outbox::{Event, Item, Outbox};
use crate::payload::{JobConfig, JobState, Key};
use crate::runner::Slurm;

use crate::slurm::JobInfo;
use crate::slurm::COMMAND_TIMEOUT;
use crate::timefmt::{format_epoch, parse_slurm_epoch};
use std::collections::HashMap;
use std::time::Duration;

/// The squeue format cvslurm asks for (job name second; it may hold `|`).
pub const SQUEUE_FORMAT: &str = "%i|%j|%P|%T|%S|%N";

/// A job `squeue` lists as running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedJob {
    /// Job id (an array task's own id).
    pub job_id: String,
    /// Job name.
    pub name: String,
    /// Partition.
    pub partition: String,
    /// State word.
    pub state: String,
    /// Start, epoch seconds.
    pub start: Option<i64>,
    /// Compressed node list.
    pub nodelist: String,
}

/// Parses `squeue -h -o '%i|%j|%P|%T|%S|%N'` (with `SLURM_TIME_FORMAT=%s`).
pub fn parse_squeue(output: &str) -> Vec<QueuedJob> {
    output
        .lines()
        .filter_map(|line| {
            let (id, rest) = line.split_once('|')?;
            let mut right: Vec<&str> = rest.rsplitn(5, '|').collect();
            if right.len() != 5 || id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            right.reverse();
            Some(QueuedJob {
                job_id: id.to_string(),
                name: right[0].to_string(),
                partition: right[1].to_string(),
                state: right[2].to_string(),
                start: parse_slurm_epoch(right[3]),
                nodelist: right[4].to_string(),
            })
        })
        .collect()
}

/// The jobs slurmctld has running (configuring, running, completing or suspended).
pub fn squeue_running(slurm: &Slurm) -> Result<Vec<QueuedJob>, String> {
    let out = slurm.run(
        "squeue",
        &[
            "-h",
            "-t",
            "CONFIGURING,RUNNING,COMPLETING,SUSPENDED",
            "-o",
            SQUEUE_FORMAT,
        ],
        COMMAND_TIMEOUT,
    )?;
    Ok(parse_squeue(&out))
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
}

/// How long after the epilog Slurm's final state of a job is trusted to be recorded.
pub const VERIFY_AFTER: Duration = Duration::from_secs(5);

/// Checks the COMPLETED ends the epilogs marked for verification against Slurm's final state
/// (slurmctld while it remembers the job, else accounting), in one scontrol and one sacct
/// call, and queues a correction where they differ.
pub fn verify_ends(slurm: &Slurm, outbox: &Outbox) -> Result<usize, String> {
    let marks: Vec<_> = outbox
        .to_verify()
        .into_iter()
        .filter(|(_, _, age)| *age >= VERIFY_AFTER)
        .collect();
    if marks.is_empty() {
        return Ok(0);
    }
    let ctl = slurm
        .run("scontrol", &["show", "job", "-o"], COMMAND_TIMEOUT)
        .unwrap_or_default();
    let ids: Vec<&str> = marks.iter().map(|(j, _, _)| j.job_id()).collect();
    let acct = slurm
        .run(
            "sacct",
            &[
                "-j",
                &ids.join(","),
                "-X",
                "-P",
                "-n",
                &format!("--format={}", crate::slurm::SACCT_FORMAT),
            ],
            COMMAND_TIMEOUT,
        )
        .unwrap_or_default();
    let mut corrected = 0;
    for (job, restarts, age) in marks {
        let id = job.job_id().to_string();
        let info = crate::slurm::parse_scontrol_job(&ctl, &id)
            .filter(|i| !i.state.starts_with("COMPLETING"))
            .or_else(|| crate::slurm::parse_sacct(&acct, &id));
        let Some(info) = info else {
            if age > GIVE_UP_AFTER {
                outbox.verified(&job.key.id);
            }
            continue;
        };
        if info.restarts.is_some_and(|r| r > restarts) {
            outbox.verified(&job.key.id); // requeued since: the rerun reports itself
            continue;
        }
        match JobState::from_slurm(&info.state) {
            Some(state) if state.is_terminal() => {
                if state != job.state {
                    log::info!(
                        "reconcile: job {} ended {} in Slurm's record, not {} as its epilog saw; correcting",
                        job.key.id,
                        info.state,
                        job.state
                    );
                    let mut fixed = job.clone();
                    fixed.state = state;
                    outbox.enqueue(&Event::new(Item::Job { job: fixed }, (restarts, 2)))?;
                    corrected += 1;
                }
                outbox.verified(&job.key.id);
            }
            _ => {}
        }
    }
    Ok(corrected)
}

/// How old a prolog record must be before its job's absence from squeue means it ended
/// (a job is listed from allocation on, so this only guards against clock and listing races).
pub const RECORD_GRACE: Duration = Duration::from_secs(120);

/// After this long without learning a vanished job's end, its record is dropped.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(7 * 86_400);

/// Whether reconciliation sends RUNNING for a job squeue lists: only when no hook reported it
/// (`reported`: a prolog record or a pending event) and it has not ended. A COMPLETING job
/// has ended: its epilog (or the recorded-job pass) reports the end, and a RUNNING now would
/// undo an end its epilog already delivered.
pub fn needs_running(j: &QueuedJob, reported: bool) -> bool {
    !reported && !j.state.starts_with("COMPLETING")
}

/// One reconciliation pass. Events go through the outbox (the caller drains it).
pub fn reconcile(
    cfg: &Config,
    slurm: &Slurm,
    cluster: &str,
    outbox: &Outbox,
) -> Result<Report, String> {
    // Read the records before listing the jobs: a record written after the listing belongs
    // to a job that is already listed or is younger than the grace period.
    let records = outbox.started_jobs();
    let running = squeue_running(slurm)?;
    let pending = outbox.pending_job_keys();
    let mut report = Report::default();
    let recorded: HashMap<&str, i64> = records.iter().map(|(k, s, _)| (k.as_str(), *s)).collect();
    let key_of = |id: &str| format!("{id}@{cluster}");

    for j in &running {
        let key = key_of(&j.job_id);
        if !needs_running(
            j,
            recorded.contains_key(key.as_str()) || pending.contains(&key),
        ) {
            continue;
        }
        if cfg.job_wanted(&j.name, Some(&j.partition)).is_err() {
            continue;
        }
        let nodes = match hostlist::expand(&j.nodelist) {
            Ok(n) if !n.is_empty() => n,
            _ => continue, // not placed yet
        };
        let start = j.start.unwrap_or_else(crate::timefmt::now_epoch);
        let job = JobConfig {
            key: Key { id: key.clone() },
            name: Some(crate::payload::job_name(&j.name, Some(&j.partition))),
            state: JobState::Running,
            start_time: format_epoch(start),
            end_time: None,
            location: Some(cluster.to_string()),
            job_type: None,
            nodes: Some(nodes.into()),
            interfaces: None,
        };
        log::info!("reconcile: job {key} runs but no hook reported it; sending RUNNING");
        outbox.enqueue(&Event::new(Item::Job { job }, (0, 0)))?;
        outbox.save_start(&key, start)?;
        report.started += 1;
    }

    let listed: std::collections::HashSet<String> =
        running.iter().map(|j| key_of(&j.job_id)).collect();
    for (key, start, age) in &records {
        if listed.contains(key) || *age < RECORD_GRACE {
            continue;
        }
        let Some((id, rec_cluster)) = key.rsplit_once('@') else {
            continue;
        };
        if rec_cluster != cluster {
            continue;
        }
        match crate::slurm::lookup(slurm, id) {
            Ok(info) => match JobState::from_slurm(&info.state) {
                Some(state) if state.is_terminal() => {
                    // The record's start is what the prolog saw and CloudVision was told.
                    let info = JobInfo {
                        start: Some(*start),
                        ..info
                    };
                    let Ok(mut job) = crate::payload::job_config(&info, cluster) else {
                        report.unknown += 1; // no nodes known: look again next pass
                        continue;
                    };
                    job.job_type = None; // a hook's record, not a backfill
                    log::info!("reconcile: job {key} ended ({}) but no epilog reported it; sending {state}", info.state);
                    let rank = (info.restarts.unwrap_or(0), 1);
                    outbox.enqueue(&Event::new(Item::Job { job }, rank))?;
                    outbox.forget_start(key);
                    report.ended += 1;
                }
                // Requeued or suspended between listing and lookup: look again next pass.
                _ => report.unknown += 1,
            },
            Err(e) => {
                if *age > GIVE_UP_AFTER {
                    log::warn!("reconcile: job {key} vanished and its end state is unknown after {} days ({e}); forgetting it", age.as_secs() / 86_400);
                    outbox.forget_start(key);
                } else {
                    log::debug!("reconcile: job {key}: end state not known yet: {e}");
                }
                report.unknown += 1;
            }
        }
    }
    report.corrected = verify_ends(slurm, outbox)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completing_job_gets_no_running() {
        let j = |state: &str| QueuedJob {
            job_id: "5".into(),
            name: "j".into(),
            partition: "debug".into(),
            state: state.into(),
            start: Some(100),
            nodelist: "n1".into(),
        };
        // Its epilog delivered the end and removed its record: nothing says it was reported.
        assert!(!needs_running(&j("COMPLETING"), false));
        assert!(needs_running(&j("RUNNING"), false));
        assert!(needs_running(&j("CONFIGURING"), false));
        assert!(!needs_running(&j("RUNNING"), true));
    }

    #[test]
    fn squeue_from_real_output() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/slurm-22.05/squeue-running-epoch.txt"
        ))
        .unwrap();
        let jobs = parse_squeue(&text);
        assert_eq!(jobs.len(), 5);
        assert_eq!(jobs[3].job_id, "7");
        assert_eq!(jobs[3].nodelist, "n[1-3]");
        assert_eq!(jobs[4].partition, "gpu");
        assert!(jobs
            .iter()
            .all(|j| j.state == "RUNNING" && j.start.is_some()));
        let odd = parse_squeue("9|a|b|debug|RUNNING|100|n1\ngarbage\n|x|y|z|w|v\n");
        assert_eq!(odd.len(), 1);
        assert_eq!(odd[0].name, "a|b");
    }
}

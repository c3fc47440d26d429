//! `cvslurm send`: backfill one job's JobConfig from slurmctld (`scontrol show job`) or, for
//! jobs slurmctld has forgotten, the accounting database (`sacct`); or send a tenant
//! scheduler's job given on the command line.

use crate::cloudvision::{Client, JOB_CONFIG_PATH};
use crate::hostlist;
use crate::payload::{JobConfig, JobState, JobType, Key};
use crate::runner::Slurm;
use crate::slurm::{self, JobInfo, COMMAND_TIMEOUT};
use crate::timefmt::{format_epoch, now_epoch};

/// Builds the JobConfig of a job Slurm described.
pub fn job_config(info: &JobInfo, cluster: &str) -> Result<JobConfig, String> {
    let state = JobState::from_slurm(&info.state).ok_or_else(|| {
        format!(
            "job {} is {}: CloudVision has no such state; send it once it runs or ends",
            info.job_id,
            if info.state.is_empty() {
                "in no known state"
            } else {
                &info.state
            }
        )
    })?;
    let nodes = info
        .nodes()
        .map_err(|e| format!("job {}: {e}", info.job_id))?;
    if nodes.is_empty() {
        return Err(format!("job {} has no nodes", info.job_id));
    }
    let start = info
        .start
        .ok_or_else(|| format!("job {} has no start time", info.job_id))?;
    let end = if state.is_terminal() {
        Some(info.end.unwrap_or_else(now_epoch))
    } else {
        None
    };
    Ok(JobConfig {
        key: Key {
            id: format!("{}@{cluster}", info.job_id),
        },
        name: Some(crate::payload::job_name(
            &info.name,
            info.partition.as_deref(),
        )),
        state,
        start_time: format_epoch(start),
        end_time: end.and_then(format_epoch),
        location: Some(cluster.to_string()),
        job_type: Some(JobType::Configured),
        nodes: Some(nodes.into()),
        interfaces: None,
    })
}

/// Finds a job in slurmctld, else in sacct.
pub fn lookup(slurm: &Slurm, job_id: &str) -> Result<JobInfo, String> {
    let from_ctl = slurm::scontrol_job(slurm, job_id, COMMAND_TIMEOUT);
    if let Ok(Some(j)) = &from_ctl {
        return Ok(j.clone());
    }
    match slurm::sacct_job(slurm, job_id, COMMAND_TIMEOUT) {
        Ok(Some(j)) => Ok(j),
        Ok(None) => Err(match from_ctl {
            Err(e) => format!("job {job_id}: not found in accounting, and slurmctld could not be asked: {e}"),
            Ok(_) => format!("job {job_id} not found in slurmctld (scontrol) or accounting (sacct)"),
        }),
        Err(e) => Err(match from_ctl {
            Err(ce) => format!("job {job_id}: slurmctld could not be asked ({ce}) and neither could accounting ({e})"),
            Ok(_) => format!("job {job_id} not known to slurmctld, and accounting could not be asked: {e}"),
        }),
    }
}

/// Prints what a dry run would send.
pub fn print_dry_run(job: &JobConfig) {
    println!("POST {JOB_CONFIG_PATH}");
    println!("{}", serde_json::to_string_pretty(job).expect("serializes"));
}

/// Sends (or, without a client, prints) one JobConfig; returns whether it went out.
pub fn deliver(client: Option<&Client>, job: &JobConfig) -> bool {
    match client {
        None => {
            print_dry_run(job);
            true
        }
        Some(c) => match c.post_job(job, None) {
            Ok(a) => {
                println!(
                    "job {}: sent {} on {} node(s) (HTTP {})",
                    job.key.id,
                    job.state,
                    job.nodes.as_ref().map_or(0, |n| n.values.len()),
                    a.status
                );
                true
            }
            Err(e) => {
                log::error!("job {}: not sent: {e}", job.key.id);
                false
            }
        },
    }
}

/// A tenant scheduler's job, given on the command line.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// The job id (`key.id` is `<id>@<location>`).
    pub id: String,
    /// The job name.
    pub name: String,
    /// The location (cluster).
    pub location: String,
    /// `running`, `completed`, `failed` or `cancelled`.
    pub state: String,
    /// Start: RFC 3339 or epoch seconds.
    pub start: String,
    /// End: RFC 3339 or epoch seconds (terminal states).
    pub end: Option<String>,
    /// A hostlist.
    pub nodes: Option<String>,
    /// MAC addresses, comma separated.
    pub interfaces: Option<String>,
}

impl Tenant {
    /// Builds the tenant JobConfig, checking every field.
    pub fn job_config(&self) -> Result<JobConfig, String> {
        let state = JobState::from_word(&self.state).ok_or_else(|| {
            format!(
                "--state {:?} is not one of running, completed, failed, cancelled",
                self.state
            )
        })?;
        let start =
            crate::timefmt::parse_user_time(&self.start).map_err(|e| format!("--start: {e}"))?;
        let end = match (&self.end, state.is_terminal()) {
            (Some(e), true) => {
                Some(crate::timefmt::parse_user_time(e).map_err(|e| format!("--end: {e}"))?)
            }
            (None, true) => return Err(format!("--end is needed for state {}", state.word())),
            (Some(_), false) => {
                return Err("--end is only for completed, failed or cancelled jobs".into())
            }
            (None, false) => None,
        };
        let (nodes, interfaces) = match (&self.nodes, &self.interfaces) {
            (Some(n), None) => {
                let v = hostlist::expand(n).map_err(|e| format!("--nodes: {e}"))?;
                if v.is_empty() {
                    return Err("--nodes is empty".into());
                }
                (Some(v.into()), None)
            }
            (None, Some(i)) => {
                let macs: Vec<String> = i
                    .split([',', ' '])
                    .filter(|s| !s.is_empty())
                    .map(|s| s.to_ascii_lowercase())
                    .collect();
                if let Some(bad) = macs.iter().find(|m| !crate::discover::is_mac(m)) {
                    return Err(format!(
                        "--interfaces: {bad:?} is not a MAC address aa:bb:cc:dd:ee:ff"
                    ));
                }
                if macs.is_empty() {
                    return Err("--interfaces is empty".into());
                }
                (None, Some(macs.into()))
            }
            _ => return Err("give exactly one of --nodes and --interfaces".into()),
        };
        for (flag, v) in [
            ("--tenant", &self.id),
            ("--name", &self.name),
            ("--location", &self.location),
        ] {
            if v.trim().is_empty() {
                return Err(format!("{flag} must not be empty"));
            }
        }
        Ok(JobConfig {
            key: Key {
                id: format!("{}@{}", self.id, self.location),
            },
            name: Some(self.name.clone()),
            state,
            start_time: format_epoch(start),
            end_time: end.and_then(format_epoch),
            location: Some(self.location.clone()),
            job_type: Some(JobType::Tenant),
            nodes,
            interfaces,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(state: &str) -> JobInfo {
        JobInfo {
            job_id: "12345".into(),
            name: "gpt-training".into(),
            partition: Some("gpu".into()),
            state: state.into(),
            reason: None,
            exit_code: None,
            restarts: None,
            start: Some(1764930600),
            end: Some(1764934200),
            nodelist: Some("gpu-node-[1-4]".into()),
        }
    }

    #[test]
    fn running_and_ended_jobs() {
        let j = job_config(&info("RUNNING"), "hpc-cluster-west").unwrap();
        let v = serde_json::to_value(&j).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"key":{"id":"12345@hpc-cluster-west"},"name":"gpt-training@gpu",
              "state":"JOB_STATE_RUNNING","start_time":"2025-12-05T10:30:00Z","location":"hpc-cluster-west",
              "type":"JOB_TYPE_CONFIGURED",
              "nodes":{"values":["gpu-node-1","gpu-node-2","gpu-node-3","gpu-node-4"]}})
        );
        let j = job_config(&info("CANCELLED by 0"), "c").unwrap();
        assert_eq!(j.state, JobState::Cancelled);
        assert_eq!(j.end_time.as_deref(), Some("2025-12-05T11:30:00Z"));
        let e = job_config(&info("PENDING"), "c").unwrap_err();
        assert_eq!(
            e,
            "job 12345 is PENDING: CloudVision has no such state; send it once it runs or ends"
        );
    }

    #[test]
    fn tenant_jobs() {
        let t = Tenant {
            id: "t-1".into(),
            name: "train".into(),
            location: "tenant-a".into(),
            state: "completed".into(),
            start: "2025-12-05T10:30:00Z".into(),
            end: Some("1764934200".into()),
            nodes: None,
            interfaces: Some("AA:BB:CC:DD:EE:01,aa:bb:cc:dd:ee:02".into()),
        };
        let v = serde_json::to_value(t.job_config().unwrap()).unwrap();
        assert_eq!(v["type"], "JOB_TYPE_TENANT");
        assert_eq!(v["interfaces"]["values"][0], "aa:bb:cc:dd:ee:01");
        assert!(v.get("nodes").is_none());
        let mut bad = t.clone();
        bad.nodes = Some("n1".into());
        assert_eq!(
            bad.job_config().unwrap_err(),
            "give exactly one of --nodes and --interfaces"
        );
        let mut bad = t.clone();
        bad.end = None;
        assert_eq!(
            bad.job_config().unwrap_err(),
            "--end is needed for state completed"
        );
        let mut bad = t;
        bad.state = "pending".into();
        assert!(bad
            .job_config()
            .unwrap_err()
            .starts_with("--state \"pending\""));
    }
}

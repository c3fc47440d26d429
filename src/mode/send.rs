//! `cvslurm send`: backfill one job's JobConfig from slurmctld's JSON or, for jobs slurmctld
//! has forgotten, the accounting database (`sacct --json`); or send a tenant
//! scheduler's job given on the command line.

use super::startup::{usage, ClientNeed, Options, Startup};
use crate::cloudvision::payload::{JobConfig, JobState, JobType, Key};
use crate::cloudvision::{Client, JOB_CONFIG_PATH};
use crate::config::Config;
use crate::inventory::attribution::Outgoing;
use crate::logging::Sink;
use crate::slurm;
use crate::slurm::hostlist;
use crate::slurm::runner::Slurm;
use crate::state::StateDir;
use crate::timefmt::format_epoch;
use argh::FromArgs;
use std::path::PathBuf;

/// The long flags of `cvslurm send` (`--help` aside), for `cvslurm --list-flags send`, the
/// completion and the documentation tests; a unit test in [`crate::cli`] holds it to [`Args`].
pub const FLAGS: &[&str] = &[
    "--config",
    "--api-server",
    "--api-token",
    "--api-token-file",
    "--dry-run",
    "--verbose",
    "--tenant",
    "--name",
    "--location",
    "--state",
    "--start",
    "--end",
    "--nodes",
    "--interfaces",
];

/// Send (backfill) jobs' JobConfig from slurmctld or sacct, or a tenant scheduler's job.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "send", help_triggers("-h", "--help", "help"))]
pub struct Args {
    /// job ids to send
    #[argh(positional)]
    job_ids: Vec<String>,
    /// config file (default $CVSLURM_CONF or /etc/slurm/cloudvision.conf)
    #[argh(option)]
    config: Option<PathBuf>,
    /// the CloudVision server, host[:port] (overrides ApiServer)
    #[argh(option)]
    api_server: Option<String>,
    /// API token (visible in ps: prefer --api-token-file or CV_API_TOKEN)
    #[argh(option)]
    api_token: Option<String>,
    /// file holding the API token (mode 600)
    #[argh(option)]
    api_token_file: Option<PathBuf>,
    /// print each request instead of sending it (needs no token, no network)
    #[argh(switch)]
    dry_run: bool,
    /// log debug details
    #[argh(switch, short = 'v')]
    verbose: bool,
    /// tenant mode: the tenant job's id (no Slurm lookup)
    #[argh(option)]
    tenant: Option<String>,
    /// tenant mode: job name
    #[argh(option)]
    name: Option<String>,
    /// tenant mode: location (cluster)
    #[argh(option)]
    location: Option<String>,
    /// tenant mode: running, completed, failed or cancelled
    #[argh(option)]
    state: Option<String>,
    /// tenant mode: start time (RFC 3339 or epoch seconds)
    #[argh(option)]
    start: Option<String>,
    /// tenant mode: end time (RFC 3339 or epoch seconds), for ended jobs
    #[argh(option)]
    end: Option<String>,
    /// tenant mode: the job's nodes, a hostlist
    #[argh(option)]
    nodes: Option<String>,
    /// tenant mode: the job's interfaces, comma-separated MAC addresses
    #[argh(option)]
    interfaces: Option<String>,
}

/// Runs `cvslurm send`: 0 when every job was sent (or printed), 1 when any was not, 2 on
/// a usage error.
pub fn run(a: Args) -> i32 {
    let startup = Startup {
        options: Options {
            config: a.config.clone(),
            api_server: a.api_server.clone(),
            api_token: a.api_token.clone(),
            api_token_file: a.api_token_file.clone(),
            dry_run: a.dry_run,
            verbose: a.verbose,
        },
        log: Some(Sink::Stderr),
        client: ClientNeed::UnlessDryRun,
        drop_privileges: true,
    };
    let started = match startup.start() {
        Ok(s) => s,
        Err(e) => return e.report(),
    };
    let tenant_job = match a.check() {
        Ok(t) => t,
        Err(e) => return usage(&e),
    };
    let cfg = &started.cfg;
    let mut failed = 0;
    let outbox = StateDir::new(&cfg.state_dir);
    let jobs: Vec<Outgoing> = match tenant_job {
        Some(j) => vec![crate::inventory::attribution::outgoing(
            cfg.job_interfaces,
            &outbox.job_reps,
            &j,
            crate::inventory::attribution::Why::Plain,
            None,
            !a.dry_run,
        )],
        None => {
            // A node's slurmd start is asked after this: every registration before it shows.
            let began = crate::timefmt::now_nanos();
            let slurm = Slurm::from_config(cfg);
            let cluster = match slurm::cluster_name(&slurm, slurm::COMMAND_TIMEOUT) {
                Ok(c) => c,
                Err(e) => {
                    log::error!("{e}");
                    return 1;
                }
            };
            let mut found = Vec::new();
            for id in &a.job_ids {
                match slurm::lookup(&slurm, id).and_then(|info| whole_job(&slurm, info, &cluster)) {
                    Ok((j, restarts)) => {
                        // The one rule for what goes out: the way the job's first record
                        // went, else decided now (recorded, except in a dry run); a re-run's
                        // RUNNING deletes the earlier run's record first, as the engine's.
                        let out = crate::inventory::attribution::outgoing(
                            cfg.job_interfaces,
                            &outbox.job_reps,
                            &j,
                            crate::inventory::attribution::Why::of_run(&j, restarts),
                            Some((&slurm, &outbox, began)),
                            !a.dry_run,
                        );
                        if a.dry_run {
                            if let Some(rule) = &out.rule {
                                // The rule names interfaces from workers' records.
                                let line = format!("# job {}: {rule}", j.job_id());
                                println!("{}", crate::logging::escape_control(&line));
                            }
                        }
                        found.push(out)
                    }
                    Err(e) => {
                        log::error!("{e}");
                        failed += 1;
                    }
                }
            }
            found
        }
    };
    // After the lookups: what Slurm says about the jobs is reported whatever the client.
    let client = match started.client() {
        Ok(c) => c,
        Err(e) => return e.report(),
    };
    for out in &jobs {
        if !deliver(client.as_ref(), cfg, out, &outbox.job_reps) {
            failed += 1;
        }
    }
    i32::from(failed > 0)
}

/// The record of the job Slurm described as `info`, and the restart count of its run; a
/// heterogeneous job's is its leader's, on the nodes of its components
/// ([`crate::service::het::compose`]), whichever component's id is given.
fn whole_job(
    slurm: &Slurm,
    info: slurm::JobInfo,
    cluster: &str,
) -> Result<(JobConfig, u32), String> {
    let info = match info.het_job_id.clone() {
        Some(leader) if crate::service::het::is_follower(&info) => {
            log::info!(
                "job {} is a component of heterogeneous job {leader}: sending that job",
                info.job_id
            );
            slurm::lookup(slurm, &leader)?
        }
        _ => info,
    };
    let job = crate::cloudvision::payload::job_config(&info, cluster)?;
    let restarts = info.restarts.unwrap_or(0);
    let (Some(part), Some(leader)) = (crate::service::het::part_of(&info), &info.het_job_id) else {
        return Ok((job, restarts));
    };
    let components = slurm::het_components(slurm, leader, slurm::COMMAND_TIMEOUT).map_err(|e| {
        format!("job {leader}: its components could not be asked of slurmctld: {e}")
    })?;
    match crate::service::het::compose(&job, &part, &components) {
        crate::service::het::Composed::Send(j) => Ok((j, restarts)),
        crate::service::het::Composed::Drop(why) => {
            Err(format!("job {leader}: {why}; send it again"))
        }
    }
}

impl Args {
    /// Checks the arguments: the tenant job (`Some`), or valid Slurm job ids (`None`).
    fn check(&self) -> Result<Option<JobConfig>, String> {
        let tenant_flags = self.name.is_some()
            || self.location.is_some()
            || self.state.is_some()
            || self.start.is_some()
            || self.end.is_some()
            || self.nodes.is_some()
            || self.interfaces.is_some();
        if let Some(id) = &self.tenant {
            if !self.job_ids.is_empty() {
                return Err("--tenant sends one tenant job; give no Slurm job ids with it".into());
            }
            let t = Tenant {
                id: id.clone(),
                name: self.name.clone().unwrap_or_default(),
                location: self.location.clone().unwrap_or_default(),
                state: self.state.clone().unwrap_or_default(),
                start: self.start.clone().unwrap_or_default(),
                end: self.end.clone(),
                nodes: self.nodes.clone(),
                interfaces: self.interfaces.clone(),
            };
            return t.job_config().map(Some);
        }
        if tenant_flags {
            return Err("--name, --location, --state, --start, --end, --nodes and --interfaces go with --tenant".into());
        }
        if self.job_ids.is_empty() {
            return Err("give one or more job ids (cvslurm send 12345), or --tenant".into());
        }
        if let Some(bad) = self.job_ids.iter().find(|id| !slurm::valid_job_id(id)) {
            return Err(format!(
                "{bad:?} is not a job id (12345, or 12345_7 for an array task)"
            ));
        }
        Ok(None)
    }
}

/// Prints what a dry run would send (node names as `QualifyNodeNames` says): the full URL
/// when the server is known.
pub fn print_dry_run(job: &JobConfig, cfg: &Config) {
    match &cfg.api_server {
        Some(s) => println!("POST https://{s}{JOB_CONFIG_PATH}"),
        None => println!("POST {JOB_CONFIG_PATH}"),
    }
    let job = crate::cloudvision::payload::NodeKeys {
        qualify: cfg.qualify_node_names,
    }
    .job(job);
    println!(
        "{}",
        serde_json::to_string_pretty(job.as_ref()).expect("serializes")
    );
}

/// Sends (or, without a client, prints) one JobConfig the engine's way
/// ([`crate::service::engine::post_outgoing`]: CloudVision's stored record of the job deleted
/// first where [`Outgoing::forget`] says so; an end taken or refused ends the job's record of
/// how it goes); returns whether it went out.
pub fn deliver(
    client: Option<&Client>,
    cfg: &Config,
    out: &Outgoing,
    reps: &crate::state::job_reps::JobReps,
) -> bool {
    let job = &out.job;
    match client {
        None => {
            if out.forget.is_some() {
                match &cfg.api_server {
                    Some(s) => println!("DELETE https://{s}{JOB_CONFIG_PATH}?key.id=…"),
                    None => println!("DELETE {JOB_CONFIG_PATH}?key.id=…"),
                }
            }
            print_dry_run(job, cfg);
            true
        }
        Some(c) => {
            match crate::service::engine::post_outgoing(c, out, reps, None) {
                Ok(a) => {
                    let place = match (&job.nodes, &job.interfaces) {
                        (_, Some(i)) if job.by_interfaces() => {
                            format!("{} interface(s)", i.values.len())
                        }
                        (n, _) => {
                            format!("{} node(s)", n.as_ref().map_or(0, |n| n.values.len()))
                        }
                    };
                    // A tenant job's id is the --tenant text as given.
                    let line = format!(
                        "job {}: sent {} on {place} (HTTP {})",
                        job.key.id, job.state, a.status
                    );
                    println!("{}", crate::logging::escape_control(&line));
                    true
                }
                Err(e) => {
                    log::error!("job {}: not sent: {e}", job.key.id);
                    false
                }
            }
        }
    }
}

/// A tenant scheduler's job, given on the command line.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// The job id, used as `key.id` exactly as given.
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
                if let Some(bad) = macs
                    .iter()
                    .find(|m| !crate::cloudvision::payload::is_mac(m))
                {
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
                // The id exactly as the tenant scheduler gave it (the reference's job_id).
                id: self.id.clone(),
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
    use crate::cloudvision::payload::job_config;
    use crate::slurm::JobInfo;

    fn info(state: &str) -> JobInfo {
        JobInfo {
            job_id: "12345".into(),
            name: "gpt-training".into(),
            partition: Some("gpu".into()),
            state: state.into(),
            start: Some(1764930600),
            end: Some(1764934200),
            nodelist: Some("gpu-node-[1-4]".into()),
            ..JobInfo::default()
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

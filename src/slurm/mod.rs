//! What cvslurm reads from Slurm, and the lookups built on it.
//!
//! Jobs are read from Slurm's JSON only ([`json`]): a job's name, comment or submit line is
//! the user's, and in any text form it can forge fields or whole records. The commands depend
//! on the Slurm release, detected at run time ([`version()`], [`Version::reader`]). Nodes and
//! partitions (admin-defined names) are read from `sinfo --all` text. Every parser here is fed
//! real Slurm output in its tests (`tests/fixtures/slurm-<version>/`).
//!
//! Topics: [`jobs`] (jobs by id, listings, accounting, the lookup), [`nodes`] (`sinfo`: nodes,
//! their states and partitions), [`gres`] (the GPUs a job holds); below them the readers
//! ([`json`], [`version`](mod@version), [`bounds`]), the commands ([`runner`]), slurm.conf ([`conf`]),
//! hostlists ([`hostlist`]) and the controllers ([`leader`], [`ctld_process`]).

/// Slurm's bound on a heterogeneous job's components (`MAX_HET_JOB_COMPONENTS`, 128 in
/// every supported release): a component's offset is below it.
pub const HET_MAX_COMPONENTS: u32 = 128;

pub mod bounds;
pub mod conf;
pub mod ctld_process;
pub mod gres;
pub mod hostlist;
pub mod jobs;
pub mod json;
pub mod leader;
pub mod nodes;
pub mod runner;
pub mod version;

pub use crate::slurm::runner::listing_too_big;
use crate::slurm::runner::Slurm;
pub use bounds::{
    Answer, JOB_QUERIES_PER_PASS, SACCT_CALLS_PER_PASS, SACCT_IDS_PER_CALL, STATE_CALLS_PER_PASS,
    STATE_IDS_PER_CALL,
};
pub use gres::{job_gpus, parse_job_gpus, JobGres};
pub use jobs::{
    all_jobs, held_back, het_components, job_by_id, job_states, job_states_of, jobs_by_id, lookup,
    pick, running_jobs_on, sacct_ended_within, sacct_jobs, valid_job_id, JobInfo, RunningJob,
};
pub use nodes::{
    node_state_available, parse_sinfo, published, sinfo_nodes, slurmd_starts, Published, SinfoNode,
};
use std::time::Duration;
pub use version::{Ctl, Reader, Version};

/// Budget of one scontrol/sacct/sinfo call outside the hook.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// The Slurm version, asked once per process (`scontrol --version`).
pub fn version(slurm: &Slurm) -> Result<Version, String> {
    version::version(slurm, COMMAND_TIMEOUT)
}

/// `ClusterName` from `scontrol show config`.
pub fn parse_cluster_name(show_config: &str) -> Option<String> {
    show_config.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == "ClusterName")
            .then(|| v.trim().to_string())
            .filter(|v| !v.is_empty() && v != "(null)")
    })
}

/// Looks up the cluster name with `scontrol show config`.
pub fn cluster_name(slurm: &Slurm, timeout: Duration) -> Result<String, String> {
    let out = match slurm.run("scontrol", &["show", "config"], timeout) {
        Ok(out) => out,
        Err(e) => {
            // slurmctld did not answer: slurm.conf says the same name.
            let path = crate::slurm::conf::slurm_conf_path();
            let named = crate::slurm::conf::load_slurm_conf(&path)
                .ok()
                .and_then(|c| {
                    c.last("ClusterName")
                        .map(|s| s.value.trim().to_ascii_lowercase())
                })
                .filter(|n| !n.is_empty());
            return match named {
                Some(n) => {
                    log::warn!("{e}; ClusterName {n} taken from {}", path.display());
                    Ok(n)
                }
                None => Err(e),
            };
        }
    };
    parse_cluster_name(&out).ok_or_else(|| {
        "ClusterName is not set in slurm.conf (scontrol show config); set it, CloudVision needs a cluster name".to_string()
    })
}

/// Real Slurm output the tests read (`tests/fixtures/`).
#[cfg(test)]
mod fixtures {
    pub fn fixture(name: &str) -> String {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/slurm-22.05/");
        std::fs::read_to_string(format!("{p}{name}")).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    pub fn fixture_of(version: &str, name: &str) -> String {
        let p = format!(
            "{}/tests/fixtures/slurm-{version}/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::fixture;
    use super::*;

    #[test]
    fn cluster_name_from_real_config() {
        assert_eq!(
            parse_cluster_name(&fixture("scontrol-config.txt")).as_deref(),
            Some("cvtest")
        );
        assert_eq!(parse_cluster_name("ClusterName = (null)\n"), None);
    }
}

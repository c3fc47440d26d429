//! The node inventory: nodes from sinfo, interfaces from `cvslurm discover` run on them
//! through srun ([`discovery`]), one NodeConfig per node. `cvslurm inventory` runs it once
//! ([`Inventory::run_once`]); the service ([`crate::service`]) polls with it. Which of a node's
//! interfaces a job uses is read from the records kept here ([`attribution`]).

pub mod attribution;
pub mod discovery;
pub mod freshness;
pub mod mac_claims;
pub mod published;

pub use discovery::read_lines_capped;

use crate::cloudvision::batch;
use crate::cloudvision::Client;
use crate::config::Config;
use crate::discovery::record::DiscoverRecord;
use crate::slurm::runner::Slurm;
use crate::slurm::{self, SinfoNode, COMMAND_TIMEOUT};
use crate::state::StateDir;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;

/// What inventory needs to run.
pub struct Inventory<'a> {
    /// The configuration.
    pub cfg: &'a Config,
    /// The Slurm command runner.
    pub slurm: Slurm,
    /// The cluster name.
    pub cluster: String,
    /// The client; `None` for a dry run.
    pub client: Option<Client>,
    /// Set by SIGTERM/SIGINT.
    pub stop: &'a AtomicBool,
}

/// Per-node outcome of a discovery pass.
pub type Discovered = BTreeMap<String, Result<DiscoverRecord, String>>;

impl Inventory<'_> {
    /// One full inventory: prints a summary; returns the exit code (1 if anything failed).
    pub fn run_once(&self) -> i32 {
        let nodes = match slurm::sinfo_nodes(&self.slurm, COMMAND_TIMEOUT) {
            Ok(n) => n,
            Err(e) => {
                log::error!("cannot list nodes: {e}");
                return 1;
            }
        };
        let (avail, unavail): (Vec<&SinfoNode>, Vec<&SinfoNode>) =
            nodes.iter().partition(|n| n.available());
        let found = self.discover(&avail);
        let mut ok_nodes = Vec::new();
        let mut failed: Vec<String> = Vec::new();
        let mut without: Vec<String> = Vec::new();
        let outbox = self
            .client
            .is_some()
            .then(|| StateDir::new(&self.cfg.state_dir));
        for (name, r) in &found {
            match r {
                Ok(rec) => {
                    if let Some(o) = &outbox {
                        save_record(o, rec);
                    }
                    if rec.interfaces.is_empty() {
                        log::warn!(
                            "{}",
                            crate::logging::escape_control(&no_interface(name, self.cfg))
                        );
                        without.push(name.clone());
                        continue;
                    }
                    ok_nodes.push(rec.to_node_config(&self.cluster, self.cfg.node_hostname))
                }
                Err(e) => {
                    log::error!("node {name}: discovery failed: {e}");
                    failed.push(name.clone());
                }
            }
        }
        let mut sent = 0;
        match &self.client {
            None => {
                for n in &ok_nodes {
                    match &self.cfg.api_server {
                        Some(s) => {
                            println!("POST https://{s}{}", crate::cloudvision::NODE_CONFIG_PATH)
                        }
                        None => println!("POST {}", crate::cloudvision::NODE_CONFIG_PATH),
                    }
                    let n = crate::cloudvision::payload::NodeKeys {
                        qualify: self.cfg.qualify_node_names,
                    }
                    .node(n);
                    println!(
                        "{}",
                        serde_json::to_string_pretty(n.as_ref()).expect("serializes")
                    );
                }
            }
            Some(c) => {
                // The service's retry policy, given up where the service would keep a
                // NodeConfig in the outbox.
                let results = batch::send_all_by(
                    &ok_nodes,
                    self.cfg.max_concurrent_requests,
                    None,
                    batch::retry_without_outbox,
                    |n| c.post_node(n, None),
                );
                for (n, r) in ok_nodes.iter().zip(results) {
                    match r {
                        Ok(_) => sent += 1,
                        Err(e) => {
                            log::error!("node {}: not sent: {e}", n.key.id);
                            failed.push(n.key.id.clone());
                        }
                    }
                }
            }
        }
        let unavailable: Vec<String> = unavail
            .iter()
            .map(|n| format!("{} ({})", n.name, n.state))
            .collect();
        let verb = if self.client.is_some() {
            "sent"
        } else {
            "would send"
        };
        // Node names and states come from sinfo: printed with control characters escaped.
        let summary = format!(
            "inventory of cluster {}: {} {verb}, {} failed{}, {} unavailable{}{}",
            self.cluster,
            if self.client.is_some() {
                sent
            } else {
                ok_nodes.len()
            },
            failed.len(),
            if failed.is_empty() {
                String::new()
            } else {
                format!(" ({})", failed.join(", "))
            },
            unavailable.len(),
            if unavailable.is_empty() {
                String::new()
            } else {
                format!(" ({})", unavailable.join(", "))
            },
            if without.is_empty() {
                String::new()
            } else {
                format!(
                    ", {} without an interface ({})",
                    without.len(),
                    without.join(", ")
                )
            },
        );
        println!("{}", crate::logging::escape_control(&summary));
        if let Some(o) = &outbox {
            o.status
                .record_inventory(nodes.len() as u64, sent as u64, failed.len() as u64);
            if let Ok(v) = slurm::version(&self.slurm) {
                o.status.record_slurm_version(&v.to_string());
            }
            crate::metrics::publish(self.cfg.metrics_file.as_deref(), o, self.cfg.poll_interval);
        }
        i32::from(!failed.is_empty())
    }
}

/// Why a node whose discovery found no interface (none passed `InterfaceRegex`,
/// `InterfacePhysicalOnly`, `InterfaceRequireIp`) gets no NodeConfig: CloudVision (and
/// Arista's own fake CloudVision) takes a NodeConfig only with at least one data interface.
/// Not a failure: the node's existing record in CloudVision stays as it is.
pub fn no_interface(node: &str, cfg: &Config) -> String {
    format!(
        "node {node}: no interface passes the filters (InterfaceRegex={}, \
         InterfacePhysicalOnly={}, InterfaceRequireIp={}): no NodeConfig sent (CloudVision \
         needs at least one interface), its existing record stays; widen the filters in \
         cloudvision.conf if it has data NICs",
        cfg.interface_regex.as_str(),
        discovery::yes_no(cfg.interface_physical_only),
        discovery::yes_no(cfg.interface_require_ip),
    )
}

/// Keeps a node's record in StateDir (for `JobInterfaces`); a failure is logged, not fatal.
pub fn save_record(outbox: &StateDir, rec: &DiscoverRecord) {
    if let Some(t) = &rec.topology {
        log::debug!(
            "node {}: {} GPU(s), {} MIG instance(s); nearest GPUs per NIC: {:?}; Slurm GPU index -> GPU: {:?}",
            rec.node_name,
            t.gpus.len(),
            t.migs.len(),
            crate::discovery::topology::nic_map(t),
            t.slurm_indices()
        );
    }
    if let Err(e) = outbox.nodes.save(rec) {
        log::error!("node {}: cannot keep its record: {e}", rec.node_name);
    }
}

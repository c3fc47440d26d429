//! cvslurm: tell Arista CloudVision which Slurm job runs on which nodes.
//!
//! The library carries all the logic; the `cvslurm` binary only dispatches to [`cli::main`].
//! Other Rust tools can reuse the CloudVision client ([`cloudvision::Client`]) and the payload
//! types ([`payload::JobConfig`], [`payload::NodeConfig`]).
//!
//! Layout: [`mode`] holds one module per mode; [`service`] the service (its loop, its sender
//! threads, the delivery engine it shares with `flush`, reconciliation, resends);
//! [`inventory`] the node inventory and its srun discovery; the other modules are the shared
//! pieces (configuration, Slurm, payloads, outbox, HTTP client).

pub mod attribution;
pub mod cli;
pub mod mode;

pub mod cloudvision;
pub mod config;
pub mod delivery;
pub mod hook_facts;
pub mod hostlist;
pub mod inventory;
pub mod logging;
pub mod node_record;
pub mod payload;
pub mod privilege;
pub mod runner;
pub mod service;
pub mod slurm;
pub mod slurm_conf;
pub mod slurm_facts;
pub mod state;
pub mod systemd;
pub mod text;
pub mod timefmt;
pub mod tls;
pub mod topology;

//! cvslurm: tell Arista CloudVision which Slurm job runs on which nodes.
//!
//! The library carries all the logic; the `cvslurm` binary only dispatches to [`cli::main`].
//! Other Rust tools can reuse the CloudVision client ([`cloudvision::Client`]) and the payload
//! types ([`payload::JobConfig`], [`payload::NodeConfig`]).
//!
//! Layout (internal, `pub(crate)`): `mode` holds one module per mode, each starting through
//! `mode::startup`; `service` the service (its loop, its sender threads, the delivery engine
//! it shares with `flush`, reconciliation, resends); `inventory` the node inventory and its
//! srun discovery; the other modules are the shared pieces (configuration, Slurm, payloads,
//! StateDir, HTTP client). See docs/design.md.

#![warn(missing_docs)]

// The library's public surface: the command line (for main.rs), the CloudVision client, its
// configuration (`ClientOptions::from_config`, `Token`) and the payload types.
pub mod cli;
pub mod cloudvision;
pub mod config;
pub mod payload;

pub(crate) mod mode;

pub(crate) mod attribution;
pub(crate) mod contract;
pub(crate) mod delivery;
pub(crate) mod hook_facts;
pub(crate) mod hostlist;
pub(crate) mod inventory;
pub(crate) mod link_names;
pub(crate) mod logging;
pub(crate) mod metrics;
pub(crate) mod node_record;
pub(crate) mod privilege;
pub(crate) mod runner;
pub(crate) mod service;
pub(crate) mod slurm;
pub(crate) mod slurm_conf;
pub(crate) mod slurm_facts;
pub(crate) mod state;
pub(crate) mod systemd;
pub(crate) mod text;
pub(crate) mod timefmt;
pub(crate) mod tls;
pub(crate) mod topology;

/// Not an API: the internal pieces the integration tests (`tests/`) and the fuzz targets
/// (`fuzz/`, a separate crate) reach directly — the parsers of outside input and StateDir's
/// file names. Each path mirrors the internal module it comes from. May change at any time.
#[doc(hidden)]
pub mod internals {
    /// From `crate::hook_facts`.
    pub mod hook_facts {
        pub use crate::hook_facts::{parse_exit_code, HookEnv};
    }
    /// From `crate::hostlist`.
    pub mod hostlist {
        pub use crate::hostlist::{expand, MAX_BYTES, MAX_HOSTS};
    }
    /// From `crate::inventory`.
    pub mod inventory {
        pub use crate::inventory::read_lines_capped;
        /// From `crate::inventory::discovery`.
        pub mod discovery {
            pub use crate::inventory::discovery::LabelledReader;
        }
    }
    /// From `crate::node_record`.
    pub mod node_record {
        pub use crate::node_record::{DiscoverRecord, RecordReader};
    }
    /// From `crate::slurm`.
    pub mod slurm {
        pub use crate::slurm::{
            node_state_available, parse_cluster_name, parse_job_gpus, parse_sinfo, pick,
            valid_job_id,
        };
        /// From `crate::slurm::json`.
        pub mod json {
            pub use crate::slurm::json::parse_jobs;
        }
        /// From `crate::slurm::ctld_process`.
        pub mod ctld_process {
            pub use crate::slurm::ctld_process::find_here;
        }
        /// From `crate::slurm::leader`.
        pub mod leader {
            pub use crate::slurm::leader::{
                controllers, is_this_host, leader, leader_from, parse_controller, parse_heartbeat,
                slurmctld_timeout_s, stale_after_s, Controller, Heartbeat, Leader, HEARTBEAT_LEN,
            };
        }
    }
    /// From `crate::state`.
    pub mod state {
        pub use crate::state::layout;
        /// From `crate::state::durable`.
        pub mod durable {
            pub use crate::state::durable::lock_file;
        }
        /// From `crate::state::queue`.
        pub mod queue {
            pub use crate::state::queue::outbox_view;
        }
    }
    /// From `crate::timefmt`.
    pub mod timefmt {
        pub use crate::timefmt::{format_epoch, parse_slurm_epoch, parse_user_time};
    }
}

/// The layers hold: the ground floor names nothing above it, and no two modules name each
/// other. Read from the sources (code lines only, not comments).
#[cfg(test)]
mod layers {
    /// A module's source and the crate modules its code may name.
    const RULES: &[(&str, &str, &[&str])] = &[
        // Configuration is the ground floor (the pins' parser is the TLS module's).
        ("config", include_str!("config.rs"), &["tls"]),
        // Payloads are built from Slurm's facts; records are built into payloads, not back.
        ("payload", include_str!("payload.rs"), &["slurm", "timefmt"]),
    ];

    fn named(src: &str) -> Vec<String> {
        let mut out = Vec::new();
        for line in src.lines().map(str::trim).filter(|l| !l.starts_with("//")) {
            for part in line.split("crate::").skip(1) {
                let m: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                out.push(m);
            }
        }
        out
    }

    #[test]
    fn ground_floor_names_nothing_above_it() {
        for (module, src, allowed) in RULES {
            for m in named(src) {
                assert!(
                    allowed.contains(&m.as_str()),
                    "{module} names crate::{m}: move what it needs down to it"
                );
            }
        }
    }

    #[test]
    fn the_check_sees_a_slip() {
        assert_eq!(
            named("use crate::attribution::JobInterfaces;\n// crate::x\n"),
            ["attribution"]
        );
    }
}

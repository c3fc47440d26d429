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
pub mod timefmt;
pub mod tls;
pub mod topology;

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

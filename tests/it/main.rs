//! The tests that need neither root nor a Slurm cluster, in one crate: the built binary run
//! as slurmctld, an admin and the service run it, against the CloudVision stand-in
//! (tests/standin). One crate links the library once; its tests run in parallel in one
//! process, so a test changes no process-wide state (environment, current directory) and
//! writes the executables it runs through [`common::install_executable`].
//!
//! Run one file's tests with `cargo test --test it hook::`.

#[path = "../common/mod.rs"]
mod common;

mod cli;
mod contract;
mod docs;
mod hardening;
mod hook;
mod metrics;
mod node_keys;
mod one_path;
mod outbox;
mod representation;
mod service;
mod tls;

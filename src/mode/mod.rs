//! The modes of `cvslurm`, one module each, all of the same shape: an argh `Args` struct and
//! `pub fn run(args: Args) -> i32`. [`crate::cli`] only picks the mode (from argv[0] or the
//! subcommand) and calls its `run`.
//!
//! The modes sit on top of the pieces beside this folder: the service ([`crate::service`]:
//! its loop, its sender threads, the delivery engine `flush` shares, reconciliation and
//! resends), the node inventory ([`crate::inventory`]), and the shared pieces
//! [`crate::config`], [`crate::slurm`] (with [`crate::slurm::runner`] and [`crate::slurm::hostlist`]),
//! [`crate::cloudvision::payload`], [`crate::outbox`], [`crate::cloudvision::batch`], [`crate::cloudvision`],
//! [`crate::logging`], [`crate::timefmt`] and [`crate::systemd`]. Data flows one way: Slurm
//! facts → domain records → payload → outbox → delivery.

pub mod check;
pub mod discover;
pub mod flush;
pub mod hook;
pub mod inventory;
pub mod publish;
pub mod send;
pub mod startup;
pub mod status;

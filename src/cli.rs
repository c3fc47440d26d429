//! Command line: `cvslurm <mode> [options]`, or the mode from argv[0] (busybox-style symlinks).
//!
//! Dispatch only: the argv[0] name table, the subcommand enum and the call to the chosen mode's
//! `run` (each mode lives in [`crate::mode`] with its own `Args`).

use crate::mode::{check, discover, flush, hook, inventory, send, status};
use argh::FromArgs;
use std::path::Path;

/// Tell Arista CloudVision which Slurm job runs on which nodes.
#[derive(FromArgs, Debug)]
#[argh(help_triggers("-h", "--help", "help"))]
pub struct Cli {
    /// print the version and exit
    #[argh(switch)]
    pub version: bool,
    #[argh(subcommand)]
    mode: Option<Mode>,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
enum Mode {
    Hook(hook::Args),
    Send(send::Args),
    Inventory(inventory::Args),
    Discover(discover::Args),
    Flush(flush::Args),
    Status(status::Args),
    Check(check::Args),
}

/// The mode a busybox-style argv[0] names, if any.
pub fn mode_from_argv0(argv0: &str) -> Option<&'static str> {
    let base = Path::new(argv0).file_name()?.to_str()?;
    let base = base.strip_suffix(".py").unwrap_or(base);
    match base {
        "cvslurm-hook" | "cv-job-hook" => Some("hook"),
        "cvslurm-send" | "cv-job-send" => Some("send"),
        "cvslurm-inventory" | "cv-node-inventory" => Some("inventory"),
        "cvslurm-discover" | "interface_discovery" => Some("discover"),
        "cvslurm-flush" => Some("flush"),
        "cvslurm-status" => Some("status"),
        "cvslurm-check" => Some("check"),
        _ => None,
    }
}

/// Runs the program with these arguments (argv[0] first); returns the exit code.
pub fn main(args: Vec<String>) -> i32 {
    let argv0 = args.first().cloned().unwrap_or_else(|| "cvslurm".into());
    let mut rest: Vec<String> = args.into_iter().skip(1).collect();
    let implied = mode_from_argv0(&argv0);
    if let Some(mode) = implied {
        if mode == "hook" {
            // slurmctld passes no arguments; never let a surprise argument fail a job. Only a
            // lone help request, which slurmctld never makes, gets the help.
            if !matches!(rest.as_slice(), [h] if ["-h", "--help", "help"].contains(&h.as_str())) {
                return hook::run(hook::Args::default());
            }
        }
        rest.insert(0, mode.to_string());
    }
    // Interactive output piped into `head` ends quietly, as other tools do, instead of a
    // panic on EPIPE. Not for the hook and the service, whose output is not a pipe to a
    // reader that may leave.
    let service = rest.first().map(String::as_str) == Some("hook")
        || (rest.first().map(String::as_str) == Some("inventory")
            && rest.iter().any(|a| a == "--monitor"));
    if !service {
        // SAFETY: restoring the default disposition of SIGPIPE at start, before any thread.
        unsafe {
            let _ = nix::sys::signal::signal(
                nix::sys::signal::Signal::SIGPIPE,
                nix::sys::signal::SigHandler::SigDfl,
            );
        }
    }
    let strs: Vec<&str> = rest.iter().map(String::as_str).collect();
    let cli = match Cli::from_args(&["cvslurm"], &strs) {
        Ok(c) => c,
        Err(early) => {
            return match early.status {
                Ok(()) => {
                    println!("{}", early.output);
                    0
                }
                Err(()) => {
                    eprintln!(
                        "cvslurm: {}\nRun cvslurm help for more information.",
                        early.output.trim_end()
                    );
                    2
                }
            };
        }
    };
    if cli.version {
        println!("cvslurm {}", env!("CARGO_PKG_VERSION"));
        return 0;
    }
    match cli.mode {
        None => {
            eprintln!("cvslurm: no mode given: cvslurm hook|send|inventory|discover|flush|status|check; cvslurm help for more");
            2
        }
        Some(Mode::Hook(a)) => hook::run(a),
        Some(Mode::Send(a)) => send::run(a),
        Some(Mode::Inventory(a)) => inventory::run(a),
        Some(Mode::Discover(a)) => discover::run(a),
        Some(Mode::Flush(a)) => flush::run(a),
        Some(Mode::Status(a)) => status::run(a),
        Some(Mode::Check(a)) => check::run(a),
    }
}

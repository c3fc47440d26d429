//! Command line: `cvslurm <mode> [options]`, or the mode from argv\[0\] (busybox-style symlinks).
//!
//! Dispatch only: the subcommand enum and the call to the chosen mode's `run` (each mode lives
//! in `crate::mode` with its own `Args`; the argv\[0\] name table is `crate::link_names`).

use crate::link_names::{mode_from_argv0, MODES};
use crate::mode::{check, discover, flush, hook, inventory, publish, send, status};
use argh::FromArgs;

/// Tell Arista CloudVision which Slurm job runs on which nodes.
#[derive(FromArgs, Debug)]
#[argh(help_triggers("-h", "--help", "help"))]
pub(crate) struct Cli {
    /// print the version and exit
    #[argh(switch)]
    pub version: bool,
    /// print each mode and the link names (argv[0]) that select it, one mode per line
    #[argh(switch)]
    pub list_modes: bool,
    /// print every cloudvision.conf key with its default (Key=default), one per line
    #[argh(switch)]
    pub list_config_keys: bool,
    /// print the flags MODE accepts, one per line
    #[argh(option, arg_name = "MODE")]
    pub list_flags: Option<String>,
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
    Publish(publish::Args),
    Flush(flush::Args),
    Status(status::Args),
    Check(check::Args),
}

/// The long flags a mode accepts (`--help` aside), from the table beside its `Args`.
pub(crate) fn mode_flags(mode: &str) -> Option<&'static [&'static str]> {
    Some(match mode {
        "hook" => hook::FLAGS,
        "send" => send::FLAGS,
        "inventory" => inventory::FLAGS,
        "discover" => discover::FLAGS,
        "publish" => publish::FLAGS,
        "flush" => flush::FLAGS,
        "status" => status::FLAGS,
        "check" => check::FLAGS,
        _ => return None,
    })
}

/// `--list-modes`: one line per mode, the mode then its link names.
fn list_modes() -> String {
    MODES
        .iter()
        .map(|(mode, names)| format!("{mode} {}\n", names.join(" ")))
        .collect()
}

/// Runs the program with these arguments (argv\[0\] first); returns the exit code.
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
    if cli.list_modes {
        print!("{}", list_modes());
        return 0;
    }
    if cli.list_config_keys {
        for k in crate::config::KEYS {
            println!("{}={}", k.name, k.default);
        }
        return 0;
    }
    if let Some(mode) = &cli.list_flags {
        let Some(flags) = mode_flags(mode) else {
            let modes: Vec<&str> = MODES.iter().map(|(m, _)| *m).collect();
            eprintln!(
                "cvslurm: --list-flags {mode:?}: no such mode; the modes are {}",
                modes.join(", ")
            );
            return 2;
        };
        for f in flags {
            println!("{f}");
        }
        return 0;
    }
    match cli.mode {
        None => {
            let modes: Vec<&str> = MODES.iter().map(|(m, _)| *m).collect();
            eprintln!(
                "cvslurm: no mode given: cvslurm {}; cvslurm help for more",
                modes.join("|")
            );
            2
        }
        Some(Mode::Hook(a)) => hook::run(a),
        Some(Mode::Send(a)) => send::run(a),
        Some(Mode::Inventory(a)) => inventory::run(a),
        Some(Mode::Discover(a)) => discover::run(a),
        Some(Mode::Publish(a)) => publish::run(a),
        Some(Mode::Flush(a)) => flush::run(a),
        Some(Mode::Status(a)) => status::run(a),
        Some(Mode::Check(a)) => check::run(a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The long flags argh's help for `mode` lists (`--help` aside): those of the usage line
    /// and those opening a line of the Options section (`-v, --verbose`).
    fn help_flags(mode: &str) -> Vec<String> {
        let early = Cli::from_args(&["cvslurm"], &[mode, "--help"]).unwrap_err();
        assert!(early.status.is_ok(), "{mode} --help: {}", early.output);
        let usage = early.output.lines().next().unwrap_or_default().to_string();
        assert!(usage.starts_with("Usage: "), "{usage}");
        let mut words: Vec<String> = usage
            .split(|c: char| c.is_whitespace() || c == '[' || c == ']')
            .map(String::from)
            .collect();
        for line in early.output.lines().skip_while(|l| *l != "Options:") {
            let opening = line
                .split_whitespace()
                .map(|w| w.trim_end_matches(','))
                .take_while(|w| w.starts_with('-'));
            words.extend(opening.map(String::from));
        }
        let mut flags: Vec<String> = words
            .into_iter()
            .filter(|w| w.starts_with("--") && w.len() > 2 && w != "--help")
            .collect();
        flags.sort();
        flags.dedup();
        flags
    }

    #[test]
    fn every_mode_has_a_flag_table_matching_its_parser() {
        for (mode, _) in MODES {
            let table = mode_flags(mode).unwrap_or_else(|| panic!("{mode}: no flag table"));
            let mut sorted: Vec<String> = table.iter().map(|f| f.to_string()).collect();
            sorted.sort();
            assert_eq!(
                sorted,
                help_flags(mode),
                "{mode}: FLAGS and argh's help differ"
            );
            for f in table {
                // A switch parses alone, an option with a value; neither is unrecognized.
                for args in [vec![*mode, f], vec![*mode, f, "1"]] {
                    if let Err(e) = Cli::from_args(&["cvslurm"], &args) {
                        assert!(
                            !e.output.contains(&format!("Unrecognized argument: {f}")),
                            "{args:?}: {}",
                            e.output
                        );
                    }
                }
            }
        }
        assert!(mode_flags("bogus").is_none());
    }

    #[test]
    fn every_mode_is_a_subcommand_and_its_names_select_it() {
        for (mode, names) in MODES {
            assert!(
                Cli::from_args(&["cvslurm"], &[mode, "--help"])
                    .unwrap_err()
                    .status
                    .is_ok(),
                "{mode} is not a subcommand"
            );
            for n in *names {
                assert_eq!(mode_from_argv0(&format!("/opt/x/{n}")), Some(*mode), "{n}");
            }
        }
        assert_eq!(mode_from_argv0("cvslurm-flush.py"), Some("flush"));
        assert_eq!(mode_from_argv0("cvslurm"), None);
        assert_eq!(mode_from_argv0("cvslurm-bogus"), None);
    }
}

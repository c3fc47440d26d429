//! `cvslurm inventory`: the mode. It parses the arguments and runs the one-shot node inventory
//! ([`crate::inventory`]) or, with `--monitor`, the service ([`crate::service`]).

use super::startup::{install_signal_handlers, usage, ClientNeed, Options, Startup, STOP};
use crate::inventory::Inventory;
use crate::logging::Sink;
use crate::slurm;
use crate::slurm::runner::Slurm;
use argh::FromArgs;
use std::path::PathBuf;
use std::time::Duration;

/// The long flags of `cvslurm inventory` (`--help` aside), for `cvslurm --list-flags inventory`, the
/// completion and the documentation tests; a unit test in [`crate::cli`] holds it to [`Args`].
pub const FLAGS: &[&str] = &[
    "--config",
    "--api-server",
    "--api-token",
    "--api-token-file",
    "--dry-run",
    "--verbose",
    "--monitor",
    "--poll-interval",
];

/// Send one NodeConfig per node (sinfo + srun discover); --monitor keeps it up to date.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "inventory", help_triggers("-h", "--help", "help"))]
pub struct Args {
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
    /// keep running: send nodes that appear or come back, delete nodes that leave, drain the outbox
    #[argh(switch)]
    monitor: bool,
    /// seconds between polls with --monitor (overrides PollInterval)
    #[argh(option)]
    poll_interval: Option<u64>,
}

/// Runs `cvslurm inventory` (once, or as the service with `--monitor`).
pub fn run(a: Args) -> i32 {
    let startup = Startup {
        options: Options {
            config: a.config,
            api_server: a.api_server,
            api_token: a.api_token,
            api_token_file: a.api_token_file,
            dry_run: a.dry_run,
            verbose: a.verbose,
        },
        // The service logs to LogFile (or the journal under systemd), not to a terminal.
        log: Some(if a.monitor { Sink::File } else { Sink::Stderr }),
        client: if a.monitor {
            ClientNeed::Required
        } else {
            ClientNeed::UnlessDryRun
        },
        drop_privileges: true,
    };
    let mut started = match startup.start() {
        Ok(s) => s,
        Err(e) => return e.report(),
    };
    if a.monitor && std::env::var_os("JOURNAL_STREAM").is_none() {
        // Started by hand (or by a supervisor without the journal): say where the log goes.
        eprintln!(
            "cvslurm: inventory --monitor logs to {} (under systemd: the journal)",
            started.cfg.log_file.display()
        );
    }
    if let Some(p) = a.poll_interval {
        if p == 0 {
            return usage("--poll-interval must be at least 1 second");
        }
        started.cfg.poll_interval = Duration::from_secs(p);
    }
    if a.monitor && a.dry_run {
        return usage("--monitor and --dry-run do not go together");
    }
    install_signal_handlers();
    let client = match started.client() {
        Ok(c) => c,
        Err(e) => return e.report(),
    };
    let cfg = started.cfg;
    let slurm = Slurm::from_config(&cfg);
    if a.monitor {
        let Some(client) = client else {
            return usage("--monitor needs a CloudVision client");
        };
        return crate::service::run_service(&cfg, slurm, client, &STOP);
    }
    let cluster = match slurm::cluster_name(&slurm, slurm::COMMAND_TIMEOUT) {
        Ok(c) => c,
        Err(e) => {
            log::error!("{e}");
            return 1;
        }
    };
    let inv = Inventory {
        cfg: &cfg,
        slurm,
        cluster,
        client,
        stop: &STOP,
    };
    inv.run_once()
}

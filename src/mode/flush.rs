//! `cvslurm flush`: reconcile with Slurm, then deliver what the outbox holds — for sites that do
//! not run the cvslurm service (run it from cron), or by hand after an outage. It delivers with
//! the service's engine ([`crate::service::engine`]), once through the outbox, and writes the
//! metrics file (`MetricsFile`, [`crate::metrics`]) at the end.

use super::startup::{install_signal_handlers, ClientNeed, Options, Startup, STOP};
use crate::logging::Sink;
use crate::service::engine;
use crate::slurm;
use crate::slurm::runner::Slurm;
use crate::state::StateDir;
use crate::text::escape_control;
use argh::FromArgs;
use std::path::PathBuf;

/// The long flags of `cvslurm flush` (`--help` aside), for `cvslurm --list-flags flush`, the
/// completion and the documentation tests; a unit test in [`crate::cli`] holds it to [`Args`].
pub const FLAGS: &[&str] = &["--no-reconcile", "--config", "--verbose"];

/// Reconcile with Slurm and send what the outbox holds (for sites without the cvslurm service).
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "flush", help_triggers("-h", "--help", "help"))]
pub struct Args {
    /// only send the outbox; do not compare with Slurm's jobs first
    #[argh(switch)]
    no_reconcile: bool,
    /// config file (default $CVSLURM_CONF or /etc/slurm/cloudvision.conf)
    #[argh(option)]
    config: Option<PathBuf>,
    /// log debug details
    #[argh(switch, short = 'v')]
    verbose: bool,
}

/// Runs `cvslurm flush`: 0 when the outbox is empty afterwards, 1 when events were kept or
/// rejected, 2 on a usage error.
pub fn run(a: Args) -> i32 {
    let startup = Startup {
        options: Options {
            config: a.config,
            verbose: a.verbose,
            ..Options::default()
        },
        log: Some(Sink::Stderr),
        client: ClientNeed::Required,
        drop_privileges: true,
    };
    let started = match startup.start() {
        Ok(s) => s,
        Err(e) => return e.report(),
    };
    let client = match started.client() {
        Ok(Some(c)) => c,
        Ok(None) => unreachable!("a required client"),
        Err(e) => return e.report(),
    };
    let cfg = started.cfg;
    install_signal_handlers();
    let outbox = StateDir::new(&cfg.state_dir);
    // One drainer at a time: what the service (or another flush) has in flight is its own.
    let _drainer = match outbox.queue.drainer_lock(false) {
        Ok(Some(l)) => l,
        Ok(None) => {
            println!("outbox: another drainer (the cvslurm service, or another flush) is sending it now; nothing to do");
            return 0;
        }
        Err(e) => {
            log::error!("{e}");
            return 1;
        }
    };
    if let Err(e) = outbox.queue.recover() {
        log::error!("{e}");
        return 1;
    }
    // What the hooks handed in becomes pending (ordered, superseded) before anything else
    // looks at the outbox.
    outbox.queue.fold_all();
    // Sites without the service run flush from cron: reconcile here too (unless switched off
    // or Slurm cannot be asked), so missed hooks and cancels the epilog saw as successes are
    // still put right.
    if !a.no_reconcile && !cfg.reconcile_interval.is_zero() {
        let slurm = Slurm::from_config(&cfg);
        let reconciled = slurm::cluster_name(&slurm, slurm::COMMAND_TIMEOUT)
            .and_then(|c| crate::service::reconcile::reconcile(&cfg, &slurm, &c, &outbox));
        if reconciled.is_ok() {
            outbox.status.record_reconcile();
        }
        match reconciled {
            Ok(r) if r.started + r.ended + r.corrected > 0 => log::info!(
                "reconcile: {} RUNNING, {} end(s) and {} correction(s) queued",
                r.started,
                r.ended,
                r.corrected
            ),
            Ok(_) => {}
            Err(e) => log::debug!("reconcile skipped: {e}"),
        }
    }
    outbox.queue.enforce_limit(cfg.outbox_max_events);
    // The service's own engine: provisional ends settled against slurmctld, interfaces
    // added as JobInterfaces says, the answers classified alike.
    let engine = engine::Engine::new(&cfg, client, outbox.clone());
    let r = engine::drain_once(&engine, cfg.max_concurrent_requests, &STOP);
    engine::record_drain(&outbox, &r);
    crate::metrics::publish(cfg.metrics_file.as_deref(), &outbox, cfg.poll_interval);
    println!(
        "outbox: {} delivered, {} kept, {} rejected{}",
        r.delivered,
        r.kept,
        r.rejected,
        r.last_error
            .as_deref()
            .map(|e| format!(" (last error: {})", escape_control(e)))
            .unwrap_or_default()
    );
    i32::from(r.kept > 0 || r.rejected > 0)
}

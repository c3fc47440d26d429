//! The service, `cvslurm inventory --monitor`: [`run_service`] starts the sender threads that
//! deliver what the hooks, the polls and reconciliation queue ([`sender`], each event through
//! the delivery engine `flush` uses too, [`engine`]), then runs the loop ([`monitor`]): node
//! polls with the inventory ([`crate::inventory`]), resends when a node's record changes
//! ([`resend`]) and reconciliation with Slurm ([`reconcile`]) — these only while this host
//! leads ([`leadership`]: on a Slurm HA pair, the controller in control); the sender, and the
//! job-completion receiver where `JobCompPort` is set ([`jobcomp`]), always.

pub mod catch_up;
pub mod engine;
pub mod forward;
pub mod het;
pub mod jobcomp;
pub mod leadership;
pub mod monitor;
pub mod reconcile;
pub mod resend;
pub mod sender;

use crate::cloudvision::Client;
use crate::config::Config;
use crate::inventory::Inventory;
use crate::slurm::runner::Slurm;
use crate::slurm::{self, COMMAND_TIMEOUT};
use crate::state::StateDir;
use crate::systemd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// `cvslurm inventory --monitor`, the service: starts the sender first (so hooks hand their
/// events over even while slurmctld cannot be reached), then learns the cluster name
/// (retrying until slurmctld answers) and runs [`monitor::monitor`].
pub fn run_service(cfg: &Config, slurm: Slurm, client: Client, stop: &'static AtomicBool) -> i32 {
    let outbox = StateDir::new(&cfg.state_dir);
    log::info!("service starting; CloudVision at {}", client.base_url());
    // On a controller pair, what this host queued before it started may be older than what
    // the other controller has sent since: checked against Slurm first.
    let check_before = if controller_pair() {
        log::info!("slurm.conf names several SlurmctldHost: the job events queued before this start are checked against Slurm before they are sent");
        u64::try_from(crate::timefmt::now_nanos()).unwrap_or(u64::MAX)
    } else {
        0
    };
    let sender = match sender::start(cfg, client.clone(), outbox.clone(), stop, check_before) {
        Ok(s) => s,
        Err(e) => {
            log::error!("cannot start the sender: {e}");
            return 1;
        }
    };
    systemd::notify("READY=1");
    let metrics = crate::metrics::spawn_writer(
        cfg.metrics_file.as_deref(),
        &outbox,
        cfg.poll_interval,
        cfg.metrics_interval,
        stop,
        sender.summary_source(),
    );
    let rc = serve(cfg, slurm, client, stop, &outbox, &sender);
    // The last figures, once the loop and the dispatcher have stopped.
    if let Some(m) = metrics {
        let _ = m.join();
    }
    sender.wait_stopped(Duration::from_millis(300));
    crate::metrics::publish(cfg.metrics_file.as_deref(), &outbox, cfg.poll_interval);
    rc
}

/// Does slurm.conf (`$SLURM_CONF`, else /etc/slurm/slurm.conf) name two or more
/// `SlurmctldHost`? (One, none, or no readable slurm.conf: one controller.)
pub(crate) fn controller_pair() -> bool {
    crate::slurm::conf::load_slurm_conf(&crate::slurm::conf::slurm_conf_path())
        .is_ok_and(|c| crate::slurm::leader::controllers(&c).len() >= 2)
}

/// Learns the cluster name (retrying until slurmctld answers) and runs the loop.
fn serve(
    cfg: &Config,
    slurm: Slurm,
    client: Client,
    stop: &'static AtomicBool,
    outbox: &StateDir,
    sender: &sender::Sender,
) -> i32 {
    let mut warned = false;
    let cluster = loop {
        match slurm::cluster_name(&slurm, COMMAND_TIMEOUT) {
            Ok(c) => break c,
            Err(e) => {
                if !warned {
                    log::error!(
                        "{e}; sending the outbox meanwhile, asking again every {} s",
                        cfg.poll_interval.as_secs()
                    );
                    warned = true;
                }
            }
        }
        let until = Instant::now() + cfg.poll_interval;
        while Instant::now() < until {
            if stop.load(Ordering::Relaxed) {
                log::info!("stopping");
                systemd::notify("STOPPING=1");
                return 0;
            }
            systemd::notify("WATCHDOG=1");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    match slurm::version(&slurm) {
        Ok(v) => outbox.status.record_slurm_version(&v.to_string()),
        Err(e) => log::debug!("Slurm version not known: {e}"),
    }
    // Job ends from Slurm's job-completion plugin (install.sh --jobcomp): on every
    // controller of a pair (each slurmctld posts to its own host), whether it leads or not.
    if cfg.jobcomp_port != 0 {
        if let Err(e) = jobcomp::start(cfg, cfg.jobcomp_port, &cluster, outbox.clone(), stop) {
            log::error!("{e}");
            return 1;
        }
    }
    let inv = Inventory {
        cfg,
        slurm,
        cluster,
        client: Some(client),
        stop,
    };
    monitor::monitor(&inv, outbox, sender)
}

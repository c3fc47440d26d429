//! Command line: `cvslurm <mode> [options]`, or the mode from argv[0] (busybox-style symlinks).

use crate::cloudvision::{Client, ClientOptions};
use crate::config::{parse_bool, Config, Token};
use crate::inventory::Inventory;
use crate::logging::{self, Sink};
use crate::outbox::Outbox;
use crate::runner::Slurm;
use crate::{discover, hook, send, slurm, status};
use argh::FromArgs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

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
    Hook(HookArgs),
    Send(SendArgs),
    Inventory(InventoryArgs),
    Discover(DiscoverArgs),
    Flush(FlushArgs),
    Status(StatusArgs),
    Check(CheckArgs),
}

/// PrologSlurmctld/EpilogSlurmctld: send the job's state from the SLURM_* environment (always exits 0).
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "hook", help_triggers("-h", "--help", "help"))]
struct HookArgs {
    /// config file (default $CVSLURM_CONF or /etc/slurm/cloudvision.conf)
    #[argh(option)]
    config: Option<PathBuf>,
}

/// Send (backfill) jobs' JobConfig from scontrol or sacct, or a tenant scheduler's job.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "send", help_triggers("-h", "--help", "help"))]
struct SendArgs {
    /// job ids to send
    #[argh(positional)]
    job_ids: Vec<String>,
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
    /// tenant mode: the tenant job's id (no Slurm lookup)
    #[argh(option)]
    tenant: Option<String>,
    /// tenant mode: job name
    #[argh(option)]
    name: Option<String>,
    /// tenant mode: location (cluster)
    #[argh(option)]
    location: Option<String>,
    /// tenant mode: running, completed, failed or cancelled
    #[argh(option)]
    state: Option<String>,
    /// tenant mode: start time (RFC 3339 or epoch seconds)
    #[argh(option)]
    start: Option<String>,
    /// tenant mode: end time (RFC 3339 or epoch seconds), for ended jobs
    #[argh(option)]
    end: Option<String>,
    /// tenant mode: the job's nodes, a hostlist
    #[argh(option)]
    nodes: Option<String>,
    /// tenant mode: the job's interfaces, comma-separated MAC addresses
    #[argh(option)]
    interfaces: Option<String>,
}

/// Send one NodeConfig per node (sinfo + srun discover); --monitor keeps it up to date.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "inventory", help_triggers("-h", "--help", "help"))]
struct InventoryArgs {
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

/// Print this node's network interfaces as one JSON line (run on workers through srun).
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "discover", help_triggers("-h", "--help", "help"))]
struct DiscoverArgs {
    /// node name (default $SLURMD_NODENAME)
    #[argh(option)]
    node_name: Option<String>,
    /// interface names to report (default ^(eth|eno|ens|enp|em))
    #[argh(option)]
    interface_regex: Option<String>,
    /// only NICs with a device link in sysfs: yes or no (default yes)
    #[argh(option)]
    physical_only: Option<String>,
    /// skip NICs without an IPv4 address: yes or no (default yes)
    #[argh(option)]
    require_ip: Option<String>,
    /// where to read interfaces (default /sys/class/net)
    #[argh(option, default = "PathBuf::from(\"/sys/class/net\")")]
    sys_class_net: PathBuf,
}

/// Reconcile with Slurm and send what the outbox holds (for sites without the cvslurm service).
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "flush", help_triggers("-h", "--help", "help"))]
struct FlushArgs {
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

/// Show the outbox depth, the oldest event, rejected events and whether CloudVision answers.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "status", help_triggers("-h", "--help", "help"))]
struct StatusArgs {
    /// config file (default $CVSLURM_CONF or /etc/slurm/cloudvision.conf)
    #[argh(option)]
    config: Option<PathBuf>,
    /// print JSON instead of text
    #[argh(switch)]
    json: bool,
    /// exit 1 when the oldest queued event is older than this many seconds (default 3600)
    #[argh(option, default = "3600")]
    max_age: i64,
    /// do not contact CloudVision
    #[argh(switch)]
    offline: bool,
}

/// Check the set-up: config, token, CloudVision, slurm.conf hooks, StateDir and LogFile.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "check", help_triggers("-h", "--help", "help"))]
struct CheckArgs {
    /// config file (default $CVSLURM_CONF or /etc/slurm/cloudvision.conf)
    #[argh(option)]
    config: Option<PathBuf>,
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
            // slurmctld passes no arguments; never let a surprise argument fail a job.
            return hook::main(None);
        }
        rest.insert(0, mode.to_string());
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
                    eprintln!("{}\nRun cvslurm help for more information.", early.output);
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
        Some(Mode::Hook(a)) => hook::main(a.config.as_deref()),
        Some(Mode::Send(a)) => run_send(a),
        Some(Mode::Inventory(a)) => run_inventory(a),
        Some(Mode::Discover(a)) => run_discover(a),
        Some(Mode::Flush(a)) => run_flush(a),
        Some(Mode::Status(a)) => status::main(a.config.as_deref(), a.json, a.max_age, a.offline),
        Some(Mode::Check(a)) => crate::check::main(a.config.as_deref()),
    }
}

/// Loads the config and applies the shared command-line overrides. Errors are usage errors.
fn load(
    config: Option<&Path>,
    api_server: Option<&str>,
    api_token: Option<&str>,
    api_token_file: Option<&Path>,
    verbose: bool,
    sink: Sink,
) -> Result<Config, String> {
    let mut cfg = Config::load(config).map_err(|e| e.to_string())?;
    if verbose {
        cfg.log_level = log::LevelFilter::Debug;
    }
    if let Some(problem) = logging::init(sink, &cfg.log_file, cfg.log_level) {
        log::error!("{problem}");
    }
    if let Some(s) = api_server {
        cfg.set("ApiServer", s)
            .map_err(|e| format!("--api-server: {e}"))?;
    }
    if let Some(f) = api_token_file {
        cfg.api_token_file = Some(f.to_path_buf());
        cfg.api_token = None;
    }
    if let Some(t) = api_token {
        log::warn!(
            "--api-token is visible to every user in ps; prefer --api-token-file or CV_API_TOKEN"
        );
        cfg.api_token = Token::new(t);
    }
    Ok(cfg)
}

/// The client, or `None` for a dry run.
fn client(cfg: &Config, dry_run: bool) -> Result<Option<Client>, String> {
    if dry_run {
        return Ok(None);
    }
    let token = cfg.token().map_err(|e| e.to_string())?.ok_or(
        "no API token: set ApiTokenFile in cloudvision.conf, CV_API_TOKEN, or --api-token-file",
    )?;
    if cfg.insecure {
        log::warn!("TLS verification is off (Insecure=yes)");
    }
    let opts = ClientOptions::from_config(cfg, Some(token), cfg.request_timeout)
        .map_err(|e| e.to_string())?;
    Client::new(opts).map(Some).map_err(|e| e.to_string())
}

fn run_send(a: SendArgs) -> i32 {
    let cfg = match load(
        a.config.as_deref(),
        a.api_server.as_deref(),
        a.api_token.as_deref(),
        a.api_token_file.as_deref(),
        a.verbose,
        Sink::Stderr,
    ) {
        Ok(c) => c,
        Err(e) => return usage(&e),
    };
    let tenant_flags = a.name.is_some()
        || a.location.is_some()
        || a.state.is_some()
        || a.start.is_some()
        || a.end.is_some()
        || a.nodes.is_some()
        || a.interfaces.is_some();
    let jobs: Vec<crate::payload::JobConfig>;
    let mut failed = 0;
    if let Some(id) = a.tenant {
        if !a.job_ids.is_empty() {
            return usage("--tenant sends one tenant job; give no Slurm job ids with it");
        }
        let t = send::Tenant {
            id,
            name: a.name.unwrap_or_default(),
            location: a.location.unwrap_or_default(),
            state: a.state.unwrap_or_default(),
            start: a.start.unwrap_or_default(),
            end: a.end,
            nodes: a.nodes,
            interfaces: a.interfaces,
        };
        match t.job_config() {
            Ok(j) => jobs = vec![j],
            Err(e) => return usage(&e),
        }
    } else {
        if tenant_flags {
            return usage("--name, --location, --state, --start, --end, --nodes and --interfaces go with --tenant");
        }
        if a.job_ids.is_empty() {
            return usage("give one or more job ids (cvslurm send 12345), or --tenant");
        }
        if let Some(bad) = a.job_ids.iter().find(|id| !slurm::valid_job_id(id)) {
            return usage(&format!(
                "{bad:?} is not a job id (12345, or 12345_7 for an array task)"
            ));
        }
        let slurm = Slurm::new(cfg.slurm_bin_dir.as_deref());
        let cluster = match slurm::cluster_name(&slurm, slurm::COMMAND_TIMEOUT) {
            Ok(c) => c,
            Err(e) => {
                log::error!("{e}");
                return 1;
            }
        };
        let mut found = Vec::new();
        for id in &a.job_ids {
            match send::lookup(&slurm, id).and_then(|info| send::job_config(&info, &cluster)) {
                Ok(j) => found.push(j),
                Err(e) => {
                    log::error!("{e}");
                    failed += 1;
                }
            }
        }
        jobs = found;
    }
    let client = match client(&cfg, a.dry_run) {
        Ok(c) => c,
        Err(e) => {
            log::error!("{e}");
            return 1;
        }
    };
    for j in &jobs {
        if !send::deliver(client.as_ref(), j) {
            failed += 1;
        }
    }
    i32::from(failed > 0)
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: nix::libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn install_signal_handlers() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let act = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for s in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        let _ = unsafe { sigaction(s, &act) };
    }
}

fn run_inventory(a: InventoryArgs) -> i32 {
    let mut cfg = match load(
        a.config.as_deref(),
        a.api_server.as_deref(),
        a.api_token.as_deref(),
        a.api_token_file.as_deref(),
        a.verbose,
        // The service logs to LogFile (or the journal under systemd), not to a terminal.
        if a.monitor { Sink::File } else { Sink::Stderr },
    ) {
        Ok(c) => c,
        Err(e) => return usage(&e),
    };
    if let Some(p) = a.poll_interval {
        if p == 0 {
            return usage("--poll-interval must be at least 1 second");
        }
        cfg.poll_interval = Duration::from_secs(p);
    }
    if a.monitor && a.dry_run {
        return usage("--monitor and --dry-run do not go together");
    }
    install_signal_handlers();
    let slurm = Slurm::new(cfg.slurm_bin_dir.as_deref());
    let cluster = match slurm::cluster_name(&slurm, slurm::COMMAND_TIMEOUT) {
        Ok(c) => c,
        Err(e) => {
            log::error!("{e}");
            return 1;
        }
    };
    let client = match client(&cfg, a.dry_run) {
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
    if a.monitor {
        let outbox = Outbox::new(&cfg.state_dir);
        inv.monitor(&outbox)
    } else {
        inv.run_once()
    }
}

fn run_discover(a: DiscoverArgs) -> i32 {
    logging::init(Sink::Stderr, Path::new("/dev/null"), log::LevelFilter::Info);
    let d = Config::default();
    let regex = match a.interface_regex.as_deref().map(regex_lite::Regex::new) {
        None => d.interface_regex,
        Some(Ok(r)) => r,
        Some(Err(e)) => return usage(&format!("--interface-regex: {e}")),
    };
    let flag = |v: Option<&str>, default: bool, name: &str| -> Result<bool, String> {
        v.map_or(Ok(default), |s| {
            parse_bool(s).map_err(|e| format!("{name}: {e}"))
        })
    };
    let filter = match (
        flag(
            a.physical_only.as_deref(),
            d.interface_physical_only,
            "--physical-only",
        ),
        flag(
            a.require_ip.as_deref(),
            d.interface_require_ip,
            "--require-ip",
        ),
    ) {
        (Ok(p), Ok(r)) => discover::Filter {
            name_regex: regex,
            physical_only: p,
            require_ip: r,
        },
        (Err(e), _) | (_, Err(e)) => return usage(&e),
    };
    match discover::discover(a.node_name.as_deref(), &a.sys_class_net, &filter) {
        Ok(rec) => {
            use std::io::Write;
            // One write, starting on a fresh line: srun passes each task's output through as
            // it comes, so another node's unterminated output (a worker printing garbage
            // without a newline) would otherwise swallow this record.
            let line = format!("\n{}\n", serde_json::to_string(&rec).expect("serializes"));
            let mut out = std::io::stdout().lock();
            if out
                .write_all(line.as_bytes())
                .and_then(|_| out.flush())
                .is_err()
            {
                return 1;
            }
            0
        }
        Err(e) => {
            log::error!("{e}");
            1
        }
    }
}

fn run_flush(a: FlushArgs) -> i32 {
    let cfg = match load(
        a.config.as_deref(),
        None,
        None,
        None,
        a.verbose,
        Sink::Stderr,
    ) {
        Ok(c) => c,
        Err(e) => return usage(&e),
    };
    let client = match client(&cfg, false) {
        Ok(Some(c)) => c,
        Ok(None) => unreachable!("not a dry run"),
        Err(e) => {
            log::error!("{e}");
            return 1;
        }
    };
    install_signal_handlers();
    let outbox = Outbox::new(&cfg.state_dir);
    if let Err(e) = outbox.recover() {
        log::error!("{e}");
        return 1;
    }
    // Sites without the service run flush from cron: reconcile here too (unless switched off
    // or Slurm cannot be asked), so missed hooks and cancels the epilog saw as successes are
    // still put right.
    if !a.no_reconcile && !cfg.reconcile_interval.is_zero() {
        let slurm = Slurm::new(cfg.slurm_bin_dir.as_deref());
        match slurm::cluster_name(&slurm, slurm::COMMAND_TIMEOUT)
            .and_then(|c| crate::reconcile::reconcile(&cfg, &slurm, &c, &outbox))
        {
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
    outbox.enforce_limit(cfg.outbox_max_events);
    let r = crate::delivery::drain(&outbox, &client, cfg.max_concurrent_requests, &STOP);
    outbox.record_drain(&r);
    println!(
        "outbox: {} delivered, {} kept, {} rejected{}",
        r.delivered,
        r.kept,
        r.rejected,
        r.last_error
            .as_deref()
            .map(|e| format!(" (last error: {e})"))
            .unwrap_or_default()
    );
    i32::from(r.kept > 0 || r.rejected > 0)
}

fn usage(msg: &str) -> i32 {
    eprintln!("cvslurm: {msg}");
    2
}

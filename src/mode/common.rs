//! What several modes share: the common options (`--config`, `--api-server`, `--api-token`,
//! `--api-token-file`, `--dry-run`, `-v`) as one value, loading the config with them, the
//! CloudVision client, usage errors and the stop signal.

use crate::cloudvision::{Client, ClientOptions};
use crate::config::{Config, Token};
use crate::logging::{self, Sink};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// The options that several modes take, gathered from their `Args`.
#[derive(Debug, Default, Clone)]
pub struct Common {
    /// `--config`: the config file (default `$CVSLURM_CONF` or /etc/slurm/cloudvision.conf).
    pub config: Option<PathBuf>,
    /// `--api-server`: overrides ApiServer.
    pub api_server: Option<String>,
    /// `--api-token`: the token itself (visible in ps).
    pub api_token: Option<String>,
    /// `--api-token-file`: overrides ApiTokenFile.
    pub api_token_file: Option<PathBuf>,
    /// `--dry-run`: print requests instead of sending them.
    pub dry_run: bool,
    /// `-v`: log debug details.
    pub verbose: bool,
}

impl Common {
    /// Loads the config, starts logging to `sink` and applies the command-line overrides.
    /// An error is a usage error (exit 2).
    pub fn load(&self, sink: Sink) -> Result<Config, String> {
        let mut cfg = Config::load(self.config.as_deref()).map_err(|e| e.to_string())?;
        if let Some(e) = &cfg.env_error {
            return Err(e.to_string());
        }
        if self.verbose {
            cfg.log_level = log::LevelFilter::Debug;
        }
        if let Some(s) = &self.api_server {
            cfg.set("ApiServer", s)
                .map_err(|e| format!("--api-server: {e}"))?;
        }
        if let Some(f) = &self.api_token_file {
            cfg.api_token_file = Some(f.clone());
            cfg.api_token = None;
        }
        if let Some(t) = &self.api_token {
            cfg.api_token = Token::new(t);
        }
        // Before anything touches StateDir or LogFile (see crate::privilege).
        let dropped = crate::privilege::drop_to_state_dir_owner(&mut cfg)?;
        if let Some(problem) = logging::init(sink, &cfg.log_file, cfg.log_level) {
            log::error!("{problem}");
        }
        if let Some(d) = dropped {
            log::info!("{d}");
        }
        for p in &cfg.problems {
            log::error!("config: {p}; this line is ignored, the others apply (cvslurm check)");
        }
        if self.api_token.is_some() {
            log::warn!(
                "--api-token is visible to every user in ps; prefer --api-token-file or CV_API_TOKEN"
            );
        }
        Ok(cfg)
    }

    /// The CloudVision client, or `None` for a dry run.
    pub fn client(&self, cfg: &Config) -> Result<Option<Client>, String> {
        client(cfg, self.dry_run)
    }
}

/// The CloudVision client for `cfg`, or `None` for a dry run.
pub fn client(cfg: &Config, dry_run: bool) -> Result<Option<Client>, String> {
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

/// Prints a usage error and returns exit code 2.
pub fn usage(msg: &str) -> i32 {
    eprintln!("cvslurm: {msg}");
    2
}

/// Set by SIGTERM or SIGINT once [`install_signal_handlers`] ran.
pub static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: nix::libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Makes SIGTERM and SIGINT set [`STOP`] instead of killing the process.
pub fn install_signal_handlers() {
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

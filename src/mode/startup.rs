//! The one start-up path of the modes: what a mode needs at start is one [`Startup`] value
//! (its common options, where it logs, whether it needs a CloudVision client, whether it drops
//! root), and [`Startup::start`] does it in one fixed order:
//!
//! 1. load the config (a file that cannot be read, or a bad `CV_*` variable, is a usage error);
//! 2. apply the command-line overrides (`-v`, `--api-server`, `--api-token-file`, `--api-token`);
//! 3. drop root to StateDir's owner ([`crate::privilege`]): after the token file is read, before
//!    anything touches StateDir or LogFile;
//! 4. start logging and report what the config and the start-up found;
//! 5. ([`Started::client`]) build the CloudVision client, as [`ClientNeed`] says.
//!
//! Between 4 and 5 the mode checks its own options against the config (`inventory`'s
//! `--poll-interval`, `send`'s job ids) and may do work that must come first whatever the
//! client (`send` looks its jobs up in Slurm before the client is built, so a bad CA file
//! does not hide what Slurm says about them).
//!
//! The hook cannot fail and must not be delayed, so it starts with [`start_hook`], which never
//! fails. `cvslurm check` does not start this way: it reports each of these steps as a check
//! line rather than stopping at the first, and probes CloudVision with [`client_for`], the
//! one place a client is built from the config. `cvslurm discover` reads no config.
//!
//! Also here: usage errors ([`usage`]) and the stop signal ([`STOP`]).

use crate::cloudvision::{Client, ClientOptions, SendError};
use crate::config::{Config, Token};
use crate::logging::{self, Sink};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The options that several modes take, gathered from their `Args`.
#[derive(Debug, Default, Clone)]
pub struct Options {
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

/// Whether a mode needs a CloudVision client, for [`Started::client`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientNeed {
    /// No client: [`Started::client`] gives `None`.
    Never,
    /// A client with a token, unless `--dry-run` (then `None`).
    UnlessDryRun,
    /// A client with a token.
    Required,
    /// A client, with the token if one is configured (`cvslurm status` probes without).
    Optional,
}

/// How a mode starts.
#[derive(Debug, Clone)]
pub struct Startup {
    /// The common options.
    pub options: Options,
    /// Where log lines go; `None`: no logger (the mode prints its own lines), and the
    /// config's problems are printed on stderr.
    pub log: Option<Sink>,
    /// Whether [`Started::client`] builds a CloudVision client.
    pub client: ClientNeed,
    /// Drop root to StateDir's owner ([`crate::privilege`]).
    pub drop_privileges: bool,
}

/// A started mode: the configuration, and the client still to build.
#[derive(Debug)]
pub struct Started {
    /// The configuration, with the command-line overrides applied.
    pub cfg: Config,
    need: ClientNeed,
    dry_run: bool,
}

/// Why a mode could not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartError {
    /// A usage error: bad options or config (exit 2).
    Usage(String),
    /// Started, but cannot work: no token, no server, bad CA file (exit 1).
    Failed(String),
    /// Run as root, StateDir cannot be used safely or at all (missing, not a directory,
    /// writable by others, owned by another user than SlurmUser: [`crate::privilege`]);
    /// exit 2 like a usage error, and `status` reports it as "cannot know".
    StateDir(String),
}

impl StartError {
    /// Reports the error (a usage error on stderr, a failure in the log, or on stderr when
    /// no logger runs) and returns the exit code: 2 or 1.
    pub fn report(&self) -> i32 {
        match self {
            StartError::Usage(m) | StartError::StateDir(m) => usage(m),
            StartError::Failed(m) if log::max_level() == log::LevelFilter::Off => {
                eprintln!("cvslurm: {}", crate::text::escape_control(m));
                1
            }
            StartError::Failed(m) => {
                log::error!("{m}");
                1
            }
        }
    }
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Usage(m) | StartError::Failed(m) | StartError::StateDir(m) => {
                f.write_str(m)
            }
        }
    }
}

impl Startup {
    /// Steps 1 to 4 (see the module documentation); any error is a usage error. The mode
    /// then checks its own options against the config and calls [`Started::client`].
    pub fn start(&self) -> Result<Started, StartError> {
        let o = &self.options;
        let usage = |e: String| StartError::Usage(e);
        let mut cfg = Config::load(o.config.as_deref()).map_err(|e| usage(e.to_string()))?;
        if let Some(e) = &cfg.env_error {
            return Err(usage(e.to_string()));
        }
        if o.verbose {
            cfg.log_level = log::LevelFilter::Debug;
        }
        if let Some(s) = &o.api_server {
            cfg.set("ApiServer", s)
                .map_err(|e| usage(format!("--api-server: {e}")))?;
        }
        if let Some(f) = &o.api_token_file {
            cfg.api_token_file = Some(f.clone());
            cfg.api_token = None;
        }
        if let Some(t) = &o.api_token {
            cfg.api_token = Token::new(t);
        }
        // Before anything touches StateDir or LogFile (see crate::privilege).
        let dropped = if self.drop_privileges {
            crate::privilege::drop_to_state_dir_owner(&mut cfg).map_err(StartError::StateDir)?
        } else {
            None
        };
        let started = |cfg| Started {
            cfg,
            need: self.client,
            dry_run: o.dry_run,
        };
        let Some(sink) = self.log else {
            for p in &cfg.problems {
                eprintln!(
                    "cvslurm: config: {}; this line is ignored, the others apply (cvslurm check)",
                    crate::text::escape_control(&p.to_string())
                );
            }
            return Ok(started(cfg));
        };
        if let Some(problem) = logging::init(sink, &cfg.log_file, cfg.log_level) {
            log::error!("{problem}");
        }
        if let Some(d) = dropped {
            log::info!("{d}");
        }
        for p in &cfg.problems {
            log::error!("config: {p}; this line is ignored, the others apply (cvslurm check)");
        }
        if o.api_token.is_some() {
            log::warn!(
                "--api-token is visible to every user in ps; prefer --api-token-file or CV_API_TOKEN"
            );
        }
        Ok(started(cfg))
    }
}

impl Started {
    /// Step 5: the CloudVision client as [`Startup::client`] asked (`None`: not asked for,
    /// or a dry run). An error is a failure (exit 1).
    pub fn client(&self) -> Result<Option<Client>, StartError> {
        let cfg = &self.cfg;
        let failed = |e: String| StartError::Failed(e);
        let token = match self.need {
            ClientNeed::Never => return Ok(None),
            ClientNeed::UnlessDryRun if self.dry_run => return Ok(None),
            ClientNeed::Optional => cfg.token().map_err(|e| failed(e.to_string()))?,
            ClientNeed::UnlessDryRun | ClientNeed::Required => Some(
                cfg.token().map_err(|e| failed(e.to_string()))?.ok_or_else(|| {
                    failed("no API token: set ApiTokenFile in cloudvision.conf, CV_API_TOKEN, or --api-token-file".into())
                })?,
            ),
        };
        client_for(cfg, token, cfg.request_timeout)
            .map(Some)
            .map_err(|e| failed(e.to_string()))
    }
}

/// The CloudVision client for `cfg` with `token`, each request within `timeout` unless given
/// a deadline: the one place a client is built from the configuration. Warns (in the log)
/// when TLS verification is off.
pub fn client_for(
    cfg: &Config,
    token: Option<Token>,
    timeout: Duration,
) -> Result<Client, SendError> {
    if cfg.insecure {
        log::warn!("TLS verification is off (Insecure=yes)");
    }
    ClientOptions::from_config(cfg, token, timeout)
        .and_then(Client::new)
        .map(|c| {
            c.with_node_keys(crate::cloudvision::payload::NodeKeys {
                qualify: cfg.qualify_node_names,
            })
        })
}

/// What [`start_hook`] found.
pub struct HookStart {
    /// The configuration; the defaults and the environment when the file could not be read.
    pub cfg: Config,
    /// Why the config file could not be read.
    pub config_error: Option<String>,
    /// Why the log file could not be opened (logging goes to stderr then).
    pub log_problem: Option<String>,
}

/// The hook's start, which never fails: loads the config (on an error, the defaults and the
/// environment, and the error to log), runs `then` on it (the hook arms its timer with
/// HookTimeout before anything can block), and starts logging to LogFile. It does not drop
/// privileges (the hook runs as SlurmUser) and reports nothing itself: the hook logs what was
/// found, in its own order, within its budget.
pub fn start_hook(config: Option<&Path>, then: impl FnOnce(&Config)) -> HookStart {
    let (cfg, config_error) = match Config::load(config) {
        Ok(c) => (c, None),
        Err(e) => {
            let mut c = Config::default();
            c.apply_env();
            (c, Some(e.to_string()))
        }
    };
    then(&cfg);
    let log_problem = logging::init(Sink::File, &cfg.log_file, cfg.log_level);
    HookStart {
        cfg,
        config_error,
        log_problem,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A config file naming a server, in a fresh directory.
    fn site(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cvslurm-startup-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let conf = d.join("cloudvision.conf");
        std::fs::write(
            &conf,
            format!("ApiServer=cv.example.com\nStateDir={}\n", d.display()),
        )
        .unwrap();
        conf
    }

    fn startup(conf: &Path, client: ClientNeed, dry_run: bool) -> Startup {
        Startup {
            options: Options {
                config: Some(conf.to_path_buf()),
                // A file that is not there: the environment's CV_API_TOKEN cannot interfere.
                api_token_file: Some(conf.with_file_name("no-token")),
                dry_run,
                ..Options::default()
            },
            log: None,
            client,
            drop_privileges: false,
        }
    }

    #[test]
    fn the_client_is_built_as_the_mode_needs() {
        let conf = site("need");
        let client = |need, dry| startup(&conf, need, dry).start().unwrap().client();
        assert!(client(ClientNeed::Never, false).unwrap().is_none());
        assert!(client(ClientNeed::UnlessDryRun, true).unwrap().is_none());
        for need in [
            ClientNeed::UnlessDryRun,
            ClientNeed::Required,
            ClientNeed::Optional,
        ] {
            let Err(StartError::Failed(e)) = client(need, false) else {
                panic!("{need:?}: an unreadable token file must fail");
            };
            assert!(e.contains("no-token"), "{e}");
        }
        // Optional: no token at all is still a client (status probes without one).
        let mut s = startup(&conf, ClientNeed::Optional, false);
        s.options.api_token_file = None;
        if std::env::var_os("CV_API_TOKEN").is_none() {
            assert!(s.start().unwrap().client().unwrap().is_some());
            s.client = ClientNeed::Required;
            let Err(StartError::Failed(e)) = s.start().unwrap().client() else {
                panic!("a required client needs a token");
            };
            assert!(e.starts_with("no API token"), "{e}");
        }
        s.client = ClientNeed::Required;
        // --api-token overrides, --api-server too.
        s.options.api_token = Some("t0k3n".into());
        s.options.api_server = Some("other.example.com:8443".into());
        let started = s.start().unwrap();
        assert_eq!(
            started.cfg.api_server.as_deref(),
            Some("other.example.com:8443")
        );
        assert!(started.client().unwrap().is_some());
        let _ = std::fs::remove_dir_all(conf.parent().unwrap());
    }

    #[test]
    fn bad_options_and_config_are_usage_errors() {
        let conf = site("usage");
        let mut s = startup(&conf, ClientNeed::Never, false);
        s.options.api_server = Some("http://cv.example.com".into());
        let Err(StartError::Usage(e)) = s.start() else {
            panic!("a bad --api-server is a usage error");
        };
        assert!(e.starts_with("--api-server: "), "{e}");
        assert_eq!(StartError::Usage(e).report(), 2);
        let s = startup(
            &conf.with_file_name("absent.conf"),
            ClientNeed::Never,
            false,
        );
        let Err(StartError::Usage(e)) = s.start() else {
            panic!("a config file that is not there is a usage error");
        };
        assert!(e.contains("absent.conf"), "{e}");
        assert_eq!(StartError::Failed(e).report(), 1);
        let _ = std::fs::remove_dir_all(conf.parent().unwrap());
    }
}

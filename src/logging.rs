//! Log set-up: the hook and the service append one line per event to `LogFile`; interactive
//! commands write to stderr; under systemd (`JOURNAL_STREAM` set) lines carry `<N>` priority
//! prefixes and no timestamp, so journald keeps the levels.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

/// Where log lines go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    /// Append to the configured log file (falls back to stderr when it cannot be opened).
    File,
    /// Standard error, for commands a person runs.
    Stderr,
}

/// Installs the logger. Returns an error line to log when the log file could not be opened.
pub fn init(sink: Sink, file: &Path, level: log::LevelFilter) -> Option<String> {
    let journald = std::env::var_os("JOURNAL_STREAM").is_some();
    let mut builder = env_logger::Builder::new();
    builder.filter_level(level);
    // Silence the HTTP stack's own chatter unless tracing.
    if level < log::LevelFilter::Trace {
        for noisy in ["ureq", "ureq_proto", "rustls"] {
            builder.filter_module(noisy, log::LevelFilter::Warn);
        }
    }
    let mut problem = None;
    let to_file = sink == Sink::File && !journald;
    if to_file {
        match OpenOptions::new().create(true).append(true).open(file) {
            Ok(f) => {
                builder.target(env_logger::Target::Pipe(Box::new(f)));
            }
            Err(e) => {
                problem = Some(format!(
                    "cannot open LogFile {}: {e}; logging to stderr",
                    file.display()
                ));
                builder.target(env_logger::Target::Stderr);
            }
        }
    } else {
        builder.target(env_logger::Target::Stderr);
    }
    let pid = std::process::id();
    builder.format(move |buf, record| {
        if journald {
            let prio = match record.level() {
                log::Level::Error => 3,
                log::Level::Warn => 4,
                log::Level::Info => 6,
                _ => 7,
            };
            writeln!(buf, "<{prio}>{}", record.args())
        } else if to_file {
            let now = crate::timefmt::format_epoch(crate::timefmt::now_epoch()).unwrap_or_default();
            writeln!(
                buf,
                "{now} cvslurm[{pid}] {:<5} {}",
                record.level(),
                record.args()
            )
        } else {
            writeln!(
                buf,
                "cvslurm: {}: {}",
                record.level().as_str().to_ascii_lowercase(),
                record.args()
            )
        }
    });
    let _ = builder.try_init();
    problem
}

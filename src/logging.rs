//! Log set-up: the hook and the service append one line per event to `LogFile`; interactive
//! commands write to stderr; under systemd (`JOURNAL_STREAM` set) lines carry `<N>` priority
//! prefixes and no timestamp, so journald keeps the levels.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
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
        // O_NONBLOCK: a FIFO (or device) planted at LogFile must not block the hook; only a
        // regular file is used.
        let opened = OpenOptions::new()
            .create(true)
            .append(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(file)
            .and_then(|f| match f.metadata() {
                Ok(m) if m.is_file() => Ok(f),
                Ok(_) => Err(std::io::Error::other("not a regular file")),
                Err(e) => Err(e),
            });
        match opened {
            Ok(f) => {
                give_to_dir_owner(&f, file);
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

/// When root creates the log file in a directory that belongs to someone else (SlurmUser's log
/// directory), the file takes that owner, so the hooks (running as SlurmUser) can append too.
fn give_to_dir_owner(f: &std::fs::File, path: &Path) {
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let (Ok(fm), Some(Ok(dm))) = (f.metadata(), path.parent().map(std::fs::metadata)) else {
        return;
    };
    if fm.uid() == 0 && dm.uid() != 0 && fm.len() == 0 {
        let _ = std::os::unix::fs::fchown(f, Some(dm.uid()), Some(dm.gid()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_created_log_file_takes_the_directory_owner() {
        use std::os::unix::fs::MetadataExt;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root (CI runs as root)");
            return;
        }
        let d = std::env::temp_dir().join(format!("cvslurm-logown-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
        let p = d.join("cvjob.log");
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p)
            .unwrap();
        give_to_dir_owner(&f, &p);
        assert_eq!(std::fs::metadata(&p).unwrap().uid(), 65534);
        // An existing root file with content is left alone.
        let q = d.join("other.log");
        std::fs::write(&q, "x").unwrap();
        let f = OpenOptions::new().append(true).open(&q).unwrap();
        give_to_dir_owner(&f, &q);
        assert_eq!(std::fs::metadata(&q).unwrap().uid(), 0);
        std::fs::remove_dir_all(&d).unwrap();
    }
}

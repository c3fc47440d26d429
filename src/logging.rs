//! Log set-up: the hook and the service append one line per event to `LogFile`; interactive
//! commands write to stderr; under systemd (`JOURNAL_STREAM` set) lines carry `<N>` priority
//! prefixes and no timestamp, so journald keeps the levels.
//!
//! Every record is one line: the formatter escapes control characters in the message
//! ([`escape_control`]), so text from outside (a worker's record, a job's environment) can
//! neither forge a log line (a newline followed by a timestamp, or journald's `<3>`) nor drive
//! the terminal of whoever reads the log (ESC sequences).

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

pub(crate) use crate::text::escape_control;

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
        match open_log(file) {
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
        // One record, one line, whoever wrote the text in it.
        let text = record.args().to_string();
        let msg = escape_control(&text);
        if journald {
            let prio = match record.level() {
                log::Level::Error => 3,
                log::Level::Warn => 4,
                log::Level::Info => 6,
                _ => 7,
            };
            writeln!(buf, "<{prio}>{msg}")
        } else if to_file {
            let now = crate::timefmt::format_epoch(crate::timefmt::now_epoch()).unwrap_or_default();
            writeln!(buf, "{now} cvslurm[{pid}] {:<5} {msg}", record.level(),)
        } else {
            writeln!(
                buf,
                "cvslurm: {}: {msg}",
                record.level().as_str().to_ascii_lowercase(),
            )
        }
    });
    let _ = builder.try_init();
    problem
}

/// Opens (creating with mode 0640) the log file for appending.
///
/// Never through a symbolic link, never a FIFO or device (an open that could hang, or
/// write somewhere else), and as root never chowning a file it did not just create: a file
/// root creates in a directory owned by someone else (SlurmUser's log directory) takes that
/// owner, so the hooks can append too.
fn open_log(file: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let flags = nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK;
    let created = OpenOptions::new()
        .append(true)
        .create_new(true)
        .mode(0o640)
        .custom_flags(flags)
        .open(file);
    let f = match created {
        Ok(f) => {
            give_to_dir_owner(&f, file);
            f
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => OpenOptions::new()
            .append(true)
            .custom_flags(flags)
            .open(file)
            .map_err(|e| match e.raw_os_error() {
                Some(nix::libc::ELOOP) => std::io::Error::other("it is a symbolic link"),
                _ => e,
            })?,
        Err(e) => return Err(e),
    };
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("it is not a regular file"));
    }
    Ok(f)
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
    fn control_characters_are_escaped() {
        assert!(matches!(
            escape_control("plain \\ text é"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(
            escape_control("a\n2026-01-01T00:00:00Z cvslurm[1] ERROR x\r\t\x1b[2J\x00\x7f"),
            "a\\n2026-01-01T00:00:00Z cvslurm[1] ERROR x\\r\\t\\x1b[2J\\x00\\x7f"
        );
        assert_eq!(
            escape_control("\u{85}\u{9b}2J\u{2028}ok"),
            "\\u{85}\\u{9b}2J\\u{2028}ok"
        );
        assert_eq!(escape_control("eth0\n<3>x"), "eth0\\n<3>x");
    }

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
        open_log(&p).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().uid(), 65534);
        // An existing root file is left alone, even an empty one.
        let q = d.join("other.log");
        std::fs::write(&q, "").unwrap();
        open_log(&q).unwrap();
        assert_eq!(std::fs::metadata(&q).unwrap().uid(), 0);
        // A link the directory's owner planted is not followed, even to a file to be created.
        let target = std::env::temp_dir().join(format!("cvslurm-logown-t-{}", std::process::id()));
        let l = d.join("link.log");
        std::os::unix::fs::symlink(&target, &l).unwrap();
        let e = open_log(&l).unwrap_err().to_string();
        assert_eq!(e, "it is a symbolic link");
        assert!(!target.exists());
        // A FIFO is refused at once instead of hanging the open.
        let fifo = d.join("fifo.log");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(open_log(&fifo).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}

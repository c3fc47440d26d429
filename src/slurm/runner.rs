//! The one runner for Slurm commands (scontrol, sinfo, sacct, squeue, srun).
//!
//! It finds the command (`SlurmBinDir`, else `PATH`, else the usual places: the hook runs
//! with no `PATH` at all), asks Slurm for epoch-second times (`SLURM_TIME_FORMAT=%s`), bounds
//! the run time and the output size, and turns every failure into a one-line message.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The most output read from one command by default (`SlurmOutputMaxMiB=64`); more is an error.
pub const MAX_OUTPUT: u64 = crate::config::SLURM_OUTPUT_MAX_DEFAULT;

/// How much of a command's stderr is kept (its first bytes). The rest is read and dropped,
/// never left unread: closing the pipe of a command still writing it kills the command with
/// SIGPIPE (srun then kills every task of its step).
pub const STDERR_KEPT: usize = 64 * 1024;

/// Where Slurm's commands are looked for when `PATH` is not set (as in PrologSlurmctld).
const FALLBACK_DIRS: &[&str] = &[
    "/usr/bin",
    "/usr/local/bin",
    "/opt/slurm/bin",
    "/usr/sbin",
    "/bin",
];

/// Runs Slurm commands.
#[derive(Debug, Clone)]
pub struct Slurm {
    bin_dir: Option<PathBuf>,
    max_output: u64,
}

impl Default for Slurm {
    fn default() -> Self {
        Slurm::new(None)
    }
}

impl Slurm {
    /// A runner that looks in `bin_dir` first (the `SlurmBinDir` key) and reads at most
    /// [`MAX_OUTPUT`] of a command's output.
    pub fn new(bin_dir: Option<&Path>) -> Slurm {
        Slurm {
            bin_dir: bin_dir.map(Path::to_path_buf),
            max_output: MAX_OUTPUT,
        }
    }

    /// The runner `cfg` asks for: its `SlurmBinDir` and its `SlurmOutputMaxMiB`.
    pub fn from_config(cfg: &crate::config::Config) -> Slurm {
        Slurm::new(cfg.slurm_bin_dir.as_deref()).with_max_output(cfg.slurm_output_max)
    }

    /// The same runner reading at most `bytes` of a command's output (at least 1).
    pub fn with_max_output(mut self, bytes: u64) -> Slurm {
        self.max_output = bytes.max(1);
        self
    }

    /// The most output read from one command; more is an error
    /// ("printed more than N MiB", see [`listing_too_big`]).
    pub fn max_output(&self) -> u64 {
        self.max_output
    }

    /// The full path of a Slurm command, or its bare name when it is nowhere to be found.
    pub fn path_of(&self, name: &str) -> PathBuf {
        if let Some(d) = &self.bin_dir {
            return d.join(name);
        }
        let path_var = std::env::var_os("PATH").filter(|p| !p.is_empty());
        let dirs: Vec<PathBuf> = match &path_var {
            Some(p) => std::env::split_paths(p)
                .chain(FALLBACK_DIRS.iter().map(PathBuf::from))
                .collect(),
            None => FALLBACK_DIRS.iter().map(PathBuf::from).collect(),
        };
        dirs.into_iter()
            .map(|d| d.join(name))
            .find(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from(name))
    }

    /// A `Command` for a Slurm tool with `SLURM_TIME_FORMAT=%s` set and without
    /// `CV_API_TOKEN`: srun forwards its environment to every worker, and no Slurm command
    /// needs the token.
    pub fn command(&self, name: &str) -> Command {
        let mut c = Command::new(self.path_of(name));
        c.env("SLURM_TIME_FORMAT", "%s");
        c.env_remove("CV_API_TOKEN");
        c.stdin(Stdio::null());
        c
    }

    /// Runs a Slurm command to completion within `timeout` and returns its stdout.
    ///
    /// A non-zero exit, a time-out, a missing command or too much output is an error that
    /// names the command and shows the first line Slurm printed on stderr.
    pub fn run(&self, name: &str, args: &[&str], timeout: Duration) -> Result<String, String> {
        let shown = format!("{name} {}", args.join(" "));
        let out = self.spawn_wait(self.command(name), name, args, timeout)?;
        if !out.success {
            let first = out
                .stderr
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            return Err(format!(
                "{shown} failed ({}){}",
                out.status,
                if first.is_empty() {
                    String::new()
                } else {
                    format!(": {}", first.trim())
                }
            ));
        }
        Ok(out.stdout)
    }

    /// Runs a Slurm command that prints JSON (`--json`) to completion within `timeout` and
    /// returns what it left, whatever its exit status (Slurm's JSON commands explain a failure
    /// on stdout). JSON times are epoch numbers already, and `SLURM_TIME_FORMAT` is not set:
    /// 22.05's `sacct --json` refuses `%s` ("Unable to parse time format").
    ///
    /// A time-out, a missing command or too much output is an error that names the command.
    pub fn run_json(&self, name: &str, args: &[&str], timeout: Duration) -> Result<Output, String> {
        let mut cmd = self.command(name);
        cmd.env_remove("SLURM_TIME_FORMAT");
        self.spawn_wait(cmd, name, args, timeout)
    }

    /// Runs the command, and again (at most twice more, 0.5 s apart, within `timeout`) while
    /// it fails the way a query does when slurmctld did not answer: nothing on stdout, or
    /// stderr naming a lost connection. A busy slurmctld stops answering for a few seconds
    /// now and then (clients give up after `MessageTimeout`); every command run here only
    /// reads, so asking again is safe. A real answer (an unknown job's JSON error) is not
    /// asked again.
    fn spawn_wait(
        &self,
        cmd: Command,
        name: &str,
        args: &[&str],
        timeout: Duration,
    ) -> Result<Output, String> {
        let by = std::time::Instant::now() + timeout;
        let mut cmd = cmd;
        cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut tries = 0;
        loop {
            tries += 1;
            let left = by.saturating_duration_since(std::time::Instant::now());
            let out = self.spawn_wait_once(&mut cmd, name, args, left)?;
            let unanswered = !out.success
                && (out.stdout.trim().is_empty()
                    || [
                        "Socket timed out",
                        "Unable to contact slurm controller",
                        "Zero Bytes were transmitted",
                    ]
                    .iter()
                    .any(|m| out.stderr.contains(m)));
            let left = by.saturating_duration_since(std::time::Instant::now());
            if !unanswered || tries >= 3 || left < Duration::from_millis(1500) {
                return Ok(out);
            }
            log::debug!(
                "{name}: no answer from slurmctld ({}); asking again",
                out.status
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn spawn_wait_once(
        &self,
        cmd: &mut Command,
        name: &str,
        args: &[&str],
        timeout: Duration,
    ) -> Result<Output, String> {
        let shown = format!("{name} {}", args.join(" "));
        let child = cmd.spawn().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                format!("{name} not found (looked in SlurmBinDir, PATH and /usr/bin, /usr/local/bin, /opt/slurm/bin); set SlurmBinDir in cloudvision.conf")
            } else {
                format!("cannot run {shown}: {e}")
            }
        })?;
        let out = wait_with_output(child, timeout, self.max_output)
            .map_err(|e| format!("{shown}: {e}"))?;
        if out.stderr_dropped > 0 {
            log::warn!(
                "{}: it wrote {} bytes on stderr: the first {} kept, {} dropped",
                crate::text::one_line(&shown, 200),
                STDERR_KEPT as u64 + out.stderr_dropped,
                STDERR_KEPT,
                out.stderr_dropped
            );
        }
        Ok(out)
    }
}

/// Reads `r` to its end, keeping its first `keep` bytes and counting the rest, which is
/// dropped: a pipe a child still writes to is never closed under it (it would die of
/// SIGPIPE). Memory stays within `keep` plus one buffer. (the bytes kept, the count dropped)
pub fn drain_capped(mut r: impl Read, keep: usize) -> std::io::Result<(Vec<u8>, u64)> {
    let mut kept = Vec::new();
    let mut dropped = 0u64;
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let room = keep.saturating_sub(kept.len()).min(n);
        kept.extend_from_slice(&buf[..room]);
        dropped += (n - room) as u64;
    }
    Ok((kept, dropped))
}

/// A bound as the messages write it: whole MiB (`64 MiB`), else bytes.
pub fn size_text(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes % (1 << 20) == 0 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

/// What a finished command left.
#[derive(Debug)]
pub struct Output {
    /// True for exit code 0.
    pub success: bool,
    /// `exit code N` or `killed by signal N`.
    pub status: String,
    /// Standard output (lossy UTF-8).
    pub stdout: String,
    /// Standard error (lossy UTF-8): its first [`STDERR_KEPT`] bytes.
    pub stderr: String,
    /// How many bytes of stderr were read past [`STDERR_KEPT`] and dropped.
    pub stderr_dropped: u64,
}

/// Waits for a child with piped stdout/stderr for at most `timeout`, killing it after that.
/// More than `max_output` bytes on stdout is an error ("printed more than N MiB"); stderr is
/// read to its end, its first [`STDERR_KEPT`] bytes kept ([`drain_capped`]).
pub fn wait_with_output(
    mut child: Child,
    timeout: Duration,
    max_output: u64,
) -> Result<Output, String> {
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let res = match stdout {
            Some(s) => s.take(max_output + 1).read_to_end(&mut buf).map(|_| buf),
            None => Ok(buf),
        };
        let _ = tx.send((0, res.map(|b| (b, None))));
    });
    std::thread::spawn(move || {
        let res = match stderr {
            Some(s) => drain_capped(s, STDERR_KEPT),
            None => Ok((Vec::new(), 0)),
        };
        let _ = tx2.send((1, res.map(|(kept, dropped)| (kept, Some(dropped)))));
    });
    let deadline = std::time::Instant::now() + timeout;
    let mut outs: [Option<Vec<u8>>; 2] = [None, None];
    let mut stderr_dropped = 0;
    for _ in 0..2 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            // Past the bound: the command would block on a full pipe (its stderr still open),
            // so it is stopped now, not at the time-out.
            Ok((0, Ok((b, _)))) if b.len() as u64 > max_output => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("printed more than {}", size_text(max_output)));
            }
            Ok((i, Ok((b, dropped)))) => {
                outs[i] = Some(b);
                stderr_dropped += dropped.unwrap_or(0);
            }
            Ok((_, Err(e))) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("reading its output failed: {e}"));
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {:.1} s", timeout.as_secs_f64()));
            }
        }
    }
    let [out, err] = outs;
    let out = out.unwrap_or_default();
    if out.len() as u64 > max_output {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("printed more than {}", size_text(max_output)));
    }
    let status = child.wait().map_err(|e| format!("wait failed: {e}"))?;
    use std::os::unix::process::ExitStatusExt;
    let status_text = match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => "unknown status".into(),
    };
    Ok(Output {
        success: status.success(),
        status: status_text,
        stdout: String::from_utf8_lossy(&out).into_owned(),
        stderr: String::from_utf8_lossy(&err.unwrap_or_default()).into_owned(),
        stderr_dropped,
    })
}

/// Did a listing fail because it passed the runner's output bound?
pub fn listing_too_big(error: &str) -> bool {
    error.contains("printed more than")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_bounds_and_reports() {
        let s = Slurm::new(Some(Path::new("/bin")));
        assert_eq!(
            s.run("echo", &["hi"], Duration::from_secs(5)).unwrap(),
            "hi\n"
        );
        let e = s.run("false", &[], Duration::from_secs(5)).unwrap_err();
        assert_eq!(e, "false  failed (exit code 1)");
        let e = s
            .run("sleep", &["5"], Duration::from_millis(100))
            .unwrap_err();
        assert_eq!(e, "sleep 5: no answer within 0.1 s");
        let e = s
            .run(
                "sh",
                &["-c", "echo oops >&2; exit 3"],
                Duration::from_secs(5),
            )
            .unwrap_err();
        assert_eq!(e, "sh -c echo oops >&2; exit 3 failed (exit code 3): oops");
        let e = Slurm::new(Some(Path::new("/nonexistent")))
            .run("scontrol", &[], Duration::from_secs(1))
            .unwrap_err();
        assert!(e.starts_with("scontrol not found"), "{e}");
    }

    /// A command that prints past the bound and goes on (stderr still open, as a listing
    /// of a big queue) is stopped as too big, not left to its time-out.
    #[test]
    fn output_past_the_bound_is_too_big_at_once() {
        let s = Slurm::new(Some(Path::new("/usr/bin")));
        let e = s.run("yes", &[], Duration::from_secs(120)).unwrap_err();
        assert_eq!(e, "yes : printed more than 64 MiB");
    }

    /// Stderr past its 64 KiB bound is read and dropped, never closed on
    /// a command still writing it: the command (srun) would die of SIGPIPE, and with it its
    /// answer. Here 512 KiB on stderr, then a marker (only when that write succeeded), then
    /// the answer. Old code: the write failed, and the command with it.
    #[test]
    fn stderr_past_its_bound_is_drained_not_closed() {
        let dir = std::env::temp_dir().join(format!("cvslurm-stderr-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let marker = dir.join("wrote");
        let script = format!(
            "dd if=/dev/zero bs=65536 count=8 status=none >&2 || exit 7; : > {}; echo answer",
            marker.display()
        );
        let s = Slurm::new(Some(Path::new("/bin")));
        let out = s
            .run_json("sh", &["-c", &script], Duration::from_secs(20))
            .unwrap();
        assert!(out.success, "{}", out.status);
        assert_eq!(out.stdout, "answer\n");
        assert!(marker.exists(), "the stderr write failed");
        assert_eq!(out.stderr.len(), STDERR_KEPT);
        assert_eq!(out.stderr_dropped, (512 << 10) - STDERR_KEPT as u64);
        let _ = std::fs::remove_file(&marker);
        assert_eq!(
            s.run("sh", &["-c", &script], Duration::from_secs(20))
                .unwrap(),
            "answer\n"
        );
        assert!(marker.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A query that got no answer (nothing printed) is asked again; a real answer is not.
    #[test]
    fn asks_again_when_slurmctld_did_not_answer() {
        let dir = std::env::temp_dir().join(format!("cvslurm-retry-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let count = dir.join("count");
        let s = Slurm::new(Some(Path::new("/bin")));
        // Fails silently the first time, answers the second.
        let script = format!(
            "if [ -e {c} ]; then echo answered; else : > {c}; exit 1; fi",
            c = count.display()
        );
        let out = s
            .run("sh", &["-c", &script], Duration::from_secs(10))
            .unwrap();
        assert_eq!(out, "answered\n");
        // An error Slurm explains on stdout is final: one run only.
        let _ = std::fs::remove_file(&count);
        let script = format!(
            "echo run >> {c}; echo '{{\"errors\":[1]}}'; exit 1",
            c = count.display()
        );
        let out = s
            .run_json("sh", &["-c", &script], Duration::from_secs(10))
            .unwrap();
        assert!(!out.success);
        assert_eq!(std::fs::read_to_string(&count).unwrap(), "run\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Output past the configured bound is an error naming the bound; up to it is read.
    #[test]
    fn output_bound_is_the_configured_one() {
        let s = Slurm::new(Some(Path::new("/bin"))).with_max_output(1 << 20);
        assert_eq!(s.max_output(), 1 << 20);
        let out = s
            .run(
                "sh",
                &["-c", "head -c 1048576 /dev/zero"],
                Duration::from_secs(10),
            )
            .unwrap();
        assert_eq!(out.len(), 1 << 20);
        let e = s
            .run(
                "sh",
                &["-c", "head -c 1048577 /dev/zero"],
                Duration::from_secs(10),
            )
            .unwrap_err();
        assert_eq!(
            e,
            "sh -c head -c 1048577 /dev/zero: printed more than 1 MiB"
        );
        assert!(listing_too_big(&e));
        assert_eq!(Slurm::new(None).max_output(), MAX_OUTPUT);
        assert_eq!(Slurm::default().max_output(), MAX_OUTPUT);
        assert_eq!(size_text(64 << 20), "64 MiB");
        assert_eq!(size_text(1000), "1000 bytes");
        let mut cfg = crate::config::Config::default();
        assert_eq!(Slurm::from_config(&cfg).max_output(), MAX_OUTPUT);
        cfg.set("SlurmOutputMaxMiB", "2").unwrap();
        assert_eq!(Slurm::from_config(&cfg).max_output(), 2 << 20);
    }

    #[test]
    fn json_commands_get_no_time_format() {
        let s = Slurm::new(Some(Path::new("/bin")));
        let out = s
            .run_json(
                "sh",
                &["-c", "echo ${SLURM_TIME_FORMAT-unset}"],
                Duration::from_secs(5),
            )
            .unwrap();
        assert_eq!(out.stdout, "unset\n");
    }

    #[test]
    fn sets_epoch_time_format() {
        let s = Slurm::new(Some(Path::new("/bin")));
        let out = s
            .run(
                "sh",
                &["-c", "echo $SLURM_TIME_FORMAT"],
                Duration::from_secs(5),
            )
            .unwrap();
        assert_eq!(out, "%s\n");
    }
}

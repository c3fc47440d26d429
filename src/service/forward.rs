//! `JobCompForward=`: every document Slurm's `jobcomp/elasticsearch` plugin posts to the
//! receiver ([`super::jobcomp`]) goes on, unchanged, to the site's own Elasticsearch, as the
//! plugin would have posted it there had cvslurm not taken `JobCompLoc` (a cluster has one
//! `JobCompType`).
//!
//! The receiver writes each document's bytes to a spool under StateDir
//! (`jobcomp-forward/<sequence>.json`, written durably: temp file, fsync, rename, fsync of the
//! directory) before it answers slurmctld, after the job's end is in the outbox; a thread of
//! its own ([`start`]) posts them in order, one at a time, and removes each once the target
//! answers 200 or 201 (what the plugin takes as indexed). A failed post is tried again with a
//! backoff of 1, 2, 4 … up to 30 s (the plugin's own retry interval), the same document first:
//! order is kept. The target never delays the receiver: the spool is local.
//!
//! The spool is bounded ([`Spool::push`]): at most `JobCompForwardMaxDocs` documents and
//! [`MAX_SPOOL_BYTES`] bytes. A document past the bound is not spooled: it is counted
//! (`jobcomp_forward_dropped`, in `cvslurm status` and the metrics) and a warning names the
//! target and what to do. A document the target refuses for good (400, 413, 422: it can never
//! be indexed) is dropped and counted the same way, so that one document cannot stop the rest.
//!
//! Delivery is at least once: a kill between the target's answer and the removal of the file
//! posts that document again at the next start (Elasticsearch gives each post its own id).

pub use crate::config::ForwardTarget as Target;
use crate::state::durable;
use crate::state::status::{counter, ServiceStatus};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// The largest job-completion document the receiver reads (a job's script is in it): larger
/// ones are read to the end and dropped, with an error naming the job's end as
/// reconciliation's. The spool takes no larger one.
pub const MAX_BODY: usize = 16 * 1024 * 1024;
/// The spool's directory under StateDir.
pub const SPOOL_DIR: &str = "jobcomp-forward";
/// The most bytes the spool holds (documents carry the job's script: up to
/// [`MAX_BODY`] each).
pub const MAX_SPOOL_BYTES: u64 = 1 << 30;
/// The largest document taken from the spool (what the receiver reads at most).
const MAX_DOC: u64 = MAX_BODY as u64;
/// The longest wait between two tries of the same document (Slurm's plugin retries every 30 s).
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Posts `body` to `target` as Slurm's plugin does (`POST`, `Content-Type:
/// application/json`); the HTTP status, or why there is none.
pub fn post(target: &Target, agent: &ureq::Agent, body: &[u8]) -> Result<u16, String> {
    let mut req = agent
        .post(target.url())
        .header("Content-Type", "application/json");
    if let Some(a) = target.auth() {
        req = req.header("Authorization", a);
    }
    req.send(body)
        .map(|r| r.status().as_u16())
        .map_err(|e| e.to_string())
}

/// Asks `target`'s base ([`Target::base`]) with a `GET`: the HTTP status, or why there is
/// none.
pub fn probe(target: &Target, agent: &ureq::Agent) -> Result<u16, String> {
    let mut req = agent.get(target.base());
    if let Some(a) = target.auth() {
        req = req.header("Authorization", a);
    }
    req.call()
        .map(|r| r.status().as_u16())
        .map_err(|e| e.to_string())
}

/// An HTTP client for the target, trusting the system CA bundle and `CaFile` (as the
/// CloudVision client does without a pin), with `timeout` per request.
pub fn agent(ca_file: Option<&Path>, timeout: Duration) -> Result<ureq::Agent, String> {
    crate::cloudvision::plain_agent(ca_file, timeout)
}

/// The documents spooled, oldest first.
struct Inner {
    next: u64,
    queue: VecDeque<(u64, u64)>,
    bytes: u64,
    /// Documents dropped since the last warning (one warning per stretch of drops).
    dropping: bool,
}

/// The on-disk spool of documents to forward.
pub struct Spool {
    dir: PathBuf,
    owner: Option<(u32, u32)>,
    max_docs: usize,
    status: ServiceStatus,
    target: String,
    inner: Mutex<Inner>,
    cv: Condvar,
}

/// What [`Spool::push`] did with a document.
#[derive(Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Durable in the spool.
    Spooled,
    /// Past the bound, or not writable: counted as dropped.
    Dropped,
}

fn file_name(seq: u64) -> String {
    format!("{seq:020}.json")
}

/// The number of documents in the spool of StateDir `state_dir` (`None`: no spool, or a
/// spool that is not a directory: a link is never followed).
pub fn depth(state_dir: &Path) -> Option<u64> {
    let dir = state_dir.join(SPOOL_DIR);
    if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
        return None;
    }
    let rd = std::fs::read_dir(&dir).ok()?;
    Some(
        rd.flatten()
            .filter(|e| seq_of(&e.file_name().to_string_lossy()).is_some())
            .count() as u64,
    )
}

fn seq_of(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".json")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

impl Spool {
    /// Opens (creates) the spool of `state_dir`, `max_docs` documents at most, for `target`
    /// (as shown in warnings); what an earlier run left is taken in order. Refuses a spool
    /// directory that is a link or not a directory.
    pub fn open(
        state_dir: &Path,
        owner: Option<(u32, u32)>,
        max_docs: usize,
        status: ServiceStatus,
        target: &str,
    ) -> Result<Arc<Spool>, String> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = state_dir.join(SPOOL_DIR);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(format!(
                    "{} is not a directory (a link?): move it away",
                    dir.display()
                ))
            }
            Err(_) => {
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&dir)
                    .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
                if let Some((uid, gid)) = owner {
                    std::os::unix::fs::lchown(&dir, Some(uid), Some(gid))
                        .map_err(|e| format!("cannot chown {}: {e}", dir.display()))?;
                }
            }
        }
        let mut found = Vec::new();
        for e in std::fs::read_dir(&dir)
            .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(crate::state::layout::TMP_PREFIX) {
                // A write cut short: its document was never acknowledged to slurmctld.
                let _ = std::fs::remove_file(e.path());
                continue;
            }
            let Some(seq) = seq_of(&name) else { continue };
            match std::fs::symlink_metadata(e.path()) {
                Ok(m) if m.is_file() && m.len() <= MAX_DOC => found.push((seq, m.len())),
                _ => log::warn!(
                    "JobCompForward: {} is not a regular file of at most {} MiB: left alone, not forwarded",
                    e.path().display(),
                    MAX_DOC >> 20
                ),
            }
        }
        found.sort_unstable();
        let bytes = found.iter().map(|(_, l)| l).sum();
        if !found.is_empty() {
            log::info!(
                "JobCompForward: {} document(s) spooled by an earlier run go first",
                found.len()
            );
        }
        Ok(Arc::new(Spool {
            dir,
            owner,
            max_docs,
            status,
            target: target.to_string(),
            inner: Mutex::new(Inner {
                next: found.last().map_or(1, |(s, _)| s + 1),
                queue: found.into(),
                bytes,
                dropping: false,
            }),
            cv: Condvar::new(),
        }))
    }

    /// Spools one document durably (its bytes unchanged), or counts it as dropped when the
    /// spool is at its bound or cannot be written (a warning names what to do).
    pub fn push(&self, body: &[u8]) -> Pushed {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let len = body.len() as u64;
        if g.queue.len() >= self.max_docs || g.bytes + len > MAX_SPOOL_BYTES {
            if !g.dropping {
                log::warn!(
                    "JobCompForward: the spool is full ({} documents, {} MiB; bounds \
                     JobCompForwardMaxDocs={} and {} MiB): documents for {} are dropped and \
                     counted (jobcomp_forward_dropped) until it drains; make {} answer (cvslurm \
                     check), raise JobCompForwardMaxDocs, or remove JobCompForward",
                    g.queue.len(),
                    g.bytes >> 20,
                    self.max_docs,
                    MAX_SPOOL_BYTES >> 20,
                    self.target,
                    self.target
                );
                g.dropping = true;
            }
            drop(g);
            self.status.count(counter::JOBCOMP_FORWARD_DROPPED, 1);
            return Pushed::Dropped;
        }
        let seq = g.next;
        let path = self.dir.join(file_name(seq));
        if let Err(e) = durable::write_durably(&path, body, self.owner) {
            drop(g);
            log::error!("JobCompForward: a document not spooled ({e}): it is not forwarded to {}; counted as dropped", self.target);
            self.status.count(counter::JOBCOMP_FORWARD_DROPPED, 1);
            return Pushed::Dropped;
        }
        g.next += 1;
        g.queue.push_back((seq, len));
        g.bytes += len;
        g.dropping = false;
        self.cv.notify_all();
        Pushed::Spooled
    }

    /// The oldest document, waiting up to `wait` for one.
    fn front(&self, wait: Duration) -> Option<(u64, u64)> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (g, _) = self
            .cv
            .wait_timeout_while(g, wait, |i| i.queue.is_empty())
            .unwrap_or_else(|e| e.into_inner());
        g.queue.front().copied()
    }

    /// Removes the oldest document (`seq`).
    fn pop(&self, seq: u64) {
        let _ = std::fs::remove_file(self.dir.join(file_name(seq)));
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.queue.front().is_some_and(|(s, _)| *s == seq) {
            let (_, len) = g.queue.pop_front().expect("front");
            g.bytes -= len;
        }
    }

    /// Documents waiting.
    pub(crate) fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .queue
            .len()
    }
}

/// What the forwarder does with the target's answer to a document.
fn verdict(status: Result<u16, String>) -> Result<(), Option<String>> {
    match status {
        Ok(200 | 201) => Ok(()),
        // The document can never be indexed: kept, it would stop every later one.
        Ok(s @ (400 | 413 | 422)) => Err(Some(format!("HTTP {s}"))),
        Ok(_) => Err(None),
        Err(_) => Err(None),
    }
}

/// Starts the forwarder thread: posts the spool's documents to `target` in order until
/// `stop`.
pub fn start(
    spool: Arc<Spool>,
    target: Target,
    agent: ureq::Agent,
    stop: &'static AtomicBool,
) -> Result<(), String> {
    std::thread::Builder::new()
        .name("jobcomp-forward".into())
        .spawn(move || run(&spool, &target, &agent, stop))
        .map(|_| ())
        .map_err(|e| format!("JobCompForward: cannot start its thread: {e}"))
}

fn run(spool: &Spool, target: &Target, agent: &ureq::Agent, stop: &AtomicBool) {
    let mut backoff = Duration::ZERO;
    let mut failing_since: Option<std::time::Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        let Some((seq, _)) = spool.front(Duration::from_millis(500)) else {
            continue;
        };
        let path = spool.dir.join(file_name(seq));
        let body = match durable::read_file(&path) {
            Ok(b) => b,
            Err(e) => {
                log::error!(
                    "JobCompForward: {} cannot be read ({e}): skipped, counted as dropped",
                    path.display()
                );
                spool.status.count(counter::JOBCOMP_FORWARD_DROPPED, 1);
                spool.pop(seq);
                continue;
            }
        };
        let answer = post(target, agent, &body);
        let shown = match &answer {
            Ok(s) => format!("HTTP {s}"),
            Err(e) => crate::text::one_line(e, 300),
        };
        match verdict(answer) {
            Ok(()) => {
                if failing_since.take().is_some() {
                    log::info!(
                        "JobCompForward: {} answers again; {} document(s) to catch up",
                        target.shown(),
                        spool.len().saturating_sub(1)
                    );
                }
                backoff = Duration::ZERO;
                spool.pop(seq);
            }
            Err(Some(why)) => {
                log::error!("JobCompForward: {} refused a document for good ({why}): dropped and counted (jobcomp_forward_dropped)", target.shown());
                spool.status.count(counter::JOBCOMP_FORWARD_DROPPED, 1);
                spool.pop(seq);
            }
            Err(None) => {
                backoff = (backoff * 2).clamp(Duration::from_secs(1), BACKOFF_MAX);
                if failing_since.is_none() {
                    failing_since = Some(std::time::Instant::now());
                    log::warn!("JobCompForward: {} did not take a document ({shown}): {} wait(s) in the spool, tried again in {} s and backing off up to {} s; cvslurm check asks it",
                        target.shown(), spool.len(), backoff.as_secs(), BACKOFF_MAX.as_secs());
                } else {
                    log::debug!("JobCompForward: {}: {shown}", target.shown());
                }
                // Waits on the stop flag, not the target.
                let until = std::time::Instant::now() + backoff;
                while std::time::Instant::now() < until && !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cvslurm-forward-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn status(d: &Path) -> ServiceStatus {
        crate::state::StateDir::new(d).status
    }

    /// The spool keeps arrival order across a reopen, stops at its bound, and never goes
    /// through a link in its place.
    #[test]
    fn spool_order_bound_and_links() {
        let d = tmpdir("spool");
        let sp = Spool::open(&d, None, 2, status(&d), "t").unwrap();
        assert_eq!(sp.push(b"a"), Pushed::Spooled);
        assert_eq!(sp.push(b"b"), Pushed::Spooled);
        assert_eq!(sp.push(b"c"), Pushed::Dropped);
        assert_eq!(depth(&d), Some(2));
        drop(sp);
        let sp = Spool::open(&d, None, 3, status(&d), "t").unwrap();
        let (first, _) = sp.front(Duration::ZERO).unwrap();
        assert_eq!(
            std::fs::read(d.join(SPOOL_DIR).join(file_name(first))).unwrap(),
            b"a"
        );
        sp.pop(first);
        assert_eq!(sp.push(b"d"), Pushed::Spooled);
        let mut left = Vec::new();
        while let Some((seq, _)) = sp.front(Duration::ZERO) {
            left.push(std::fs::read(d.join(SPOOL_DIR).join(file_name(seq))).unwrap());
            sp.pop(seq);
        }
        assert_eq!(left, [b"b".to_vec(), b"d".to_vec()]);
        let e = tmpdir("link");
        std::os::unix::fs::symlink(d.join(SPOOL_DIR), e.join(SPOOL_DIR)).unwrap();
        assert!(Spool::open(&e, None, 2, status(&e), "t").is_err());
        assert_eq!(depth(&e), None);
        std::fs::remove_dir_all(&d).unwrap();
        std::fs::remove_dir_all(&e).unwrap();
    }
}

//! The counter journal: how a process adds to the counters of `service-status.json` without
//! its lock. Every process (a hook above all, which runs on slurmctld's critical path) appends
//! one line `<counter> <n>\n` to `StateDir/counters.journal` (`O_APPEND`: one `write`, so
//! concurrent writers never interleave a line); whoever next rewrites the status file under its
//! lock (the service, `flush`, the inventory) folds the lines it has not folded yet into the
//! counters and keeps its place (inode and offset) in the status file. Readers (`status`, the
//! metrics file) add the lines not folded yet to what they read, without writing.
//!
//! Why: a hook that took `service-status.lock` for each event made the hooks of a burst of job
//! ends queue behind each other on 2 cores; a slower EpilogSlurmctld finishes after slurmd's
//! epilog, and slurmctld does not schedule when an EpilogSlurmctld ends (only when the nodes'
//! epilog completes while no EpilogSlurmctld runs), so freed nodes waited for the next backfill
//! pass: a 300-task array ran 6 to 12 times slower (tests/bench/array.py).
//!
//! Bounds: a fold reads at most [`READ_MAX`] bytes of each file (the rest at the next fold);
//! the journal is renamed to `counters.journal.old` once [`ROTATE_AT`] bytes are folded and the
//! last rotation is [`OLD_KEEP_SECS`] old, so at most two files of about that size exist. A
//! writer that opened the journal before a rotation may still append to the renamed file: the
//! folds read it too, until the next rotation replaces it (a hook lives seconds, not
//! [`OLD_KEEP_SECS`]). The files are SlurmUser's: a line that is not `<known counter> <n>`
//! (n at most [`LINE_MAX_COUNT`]) is skipped.

use super::layout::{COUNTER_JOURNAL, COUNTER_JOURNAL_OLD};
use serde_json::{json, Value};
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The most bytes a fold reads of each journal file.
pub const READ_MAX: u64 = 1 << 20;
/// The folded size past which the journal is renamed to `counters.journal.old`.
pub const ROTATE_AT: u64 = 256 * 1024;
/// The least time between two rotations (a writer still holding the renamed file has this
/// long to append to it).
pub const OLD_KEEP_SECS: i64 = 600;
/// The largest count one line may add (a larger one is skipped as garbage).
pub const LINE_MAX_COUNT: u64 = 1_000_000;

/// The counters kept in `counters` (the metric `cvslurm_<name>_total`).
pub mod counter {
    /// Events written to the outbox (by the hooks, the service, reconciliation, `flush`).
    pub const QUEUED: &str = "events_queued";
    /// Events CloudVision took.
    pub const DELIVERED: &str = "events_delivered";
    /// Deliveries that failed in a way that may pass (unreachable, timeout, 5xx, 429, token
    /// refused): the event was kept for a later try.
    pub const RETRIED: &str = "events_retried";
    /// Events CloudVision refused for good (4xx but 401/403/429): moved to `rejected/`.
    pub const REJECTED: &str = "events_rejected";
    /// Events dropped because the outbox was over `OutboxMaxEvents`.
    pub const DROPPED: &str = "events_dropped";
    /// Events a hook could neither queue in StateDir nor send.
    pub const LOST: &str = "events_lost";
    /// Hooks that sent their event themselves (the service was not running or did not take it).
    pub const HOOK_DIRECT_SENDS: &str = "hook_direct_sends";
    /// `JobCompForward` documents not forwarded: past the spool's bound, not writable, or
    /// refused for good by the target.
    pub const JOBCOMP_FORWARD_DROPPED: &str = "jobcomp_forward_dropped";
    /// Every counter, in the order the metrics list them.
    pub const ALL: [&str; 8] = [
        QUEUED,
        DELIVERED,
        RETRIED,
        REJECTED,
        DROPPED,
        LOST,
        HOOK_DIRECT_SENDS,
        JOBCOMP_FORWARD_DROPPED,
    ];
}

/// Adds `n` to `counters.<name>` in `v`.
pub(super) fn add(v: &mut Value, name: &str, n: u64) {
    if n == 0 {
        return;
    }
    let c = &mut v["counters"];
    if !c.is_object() {
        *c = json!({});
    }
    c[name] = (c[name].as_u64().unwrap_or(0).saturating_add(n)).into();
}

/// The counter journal of one state directory.
#[derive(Debug, Clone)]
pub struct CounterJournal {
    path: PathBuf,
    old: PathBuf,
    owner: Option<(u32, u32)>,
}

/// Where a fold stopped in one file: its inode and the offset after the last folded line.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Place {
    ino: u64,
    off: u64,
}

impl Place {
    fn from_value(v: &Value) -> Place {
        Place {
            ino: v["ino"].as_u64().unwrap_or(0),
            off: v["off"].as_u64().unwrap_or(0),
        }
    }

    fn to_value(self) -> Value {
        json!({"ino": self.ino, "off": self.off})
    }
}

impl CounterJournal {
    /// The journal under `root`, created for `owner`.
    pub(super) fn new(root: &Path, owner: Option<(u32, u32)>) -> CounterJournal {
        CounterJournal {
            path: root.join(COUNTER_JOURNAL),
            old: root.join(COUNTER_JOURNAL_OLD),
            owner,
        }
    }

    /// Appends `<name> <n>`: no lock, one `write`. Never through a link: a symbolic link is
    /// not followed, a file with other hard links or of another owner is not written.
    pub fn append(&self, name: &str, n: u64) -> Result<(), String> {
        let f = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(&self.path)
            .map_err(|e| format!("cannot open {}: {e}", self.path.display()))?;
        let md = f
            .metadata()
            .map_err(|e| format!("cannot stat {}: {e}", self.path.display()))?;
        if !md.is_file() || md.nlink() != 1 {
            return Err(format!(
                "{} is not a plain file with one link; not written (remove it)",
                self.path.display()
            ));
        }
        if let Some((uid, gid)) = self.owner {
            if md.uid() != uid && md.uid() != 0 {
                return Err(format!(
                    "{} belongs to uid {}, not StateDir's owner; not written (remove it)",
                    self.path.display(),
                    md.uid()
                ));
            }
            if md.uid() != uid || md.gid() != gid {
                let _ = std::os::unix::fs::fchown(&f, Some(uid), Some(gid));
            }
        }
        (&f).write_all(format!("{name} {n}\n").as_bytes())
            .map_err(|e| format!("cannot append to {}: {e}", self.path.display()))
    }

    /// Adds to `v["counters"]` what the journal holds past the place `v["journal"]` records.
    /// With `commit` (the caller holds the status lock and writes `v` back) it also moves that
    /// place and, when due, renames the journal (`now`: Unix seconds).
    pub fn fold(&self, v: &mut Value, commit: bool, now: i64) {
        let book = &v["journal"];
        let mut cur = Place::from_value(&book["cur"]);
        let mut old = Place::from_value(&book["old"]);
        let rotated_at = book["rotated_at"].as_i64().unwrap_or(0);
        let mut counts: Vec<(&'static str, u64)> = Vec::new();
        // A place goes with its file's inode, not its name: a reader that read the status
        // before a rotation finds its `cur` file under the old name.
        let known = [cur, old];
        for (path, place) in [(&self.old, &mut old), (&self.path, &mut cur)] {
            if let Some((ino, start, bytes)) = read_from(path, &known) {
                let used = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
                parse_lines(&bytes[..used], &mut counts);
                *place = Place {
                    ino,
                    off: start + used as u64,
                };
            }
        }
        for (name, n) in counts {
            add(v, name, n);
        }
        if !commit {
            return;
        }
        let mut rotated_at = rotated_at;
        if cur.ino != 0
            && cur.off >= ROTATE_AT
            && now.saturating_sub(rotated_at) >= OLD_KEEP_SECS
            && std::fs::rename(&self.path, &self.old).is_ok()
        {
            // Lines appended after this fold's read stay in the renamed file, past `off`.
            old = cur;
            cur = Place::default();
            rotated_at = now;
        }
        v["journal"] =
            json!({"cur": cur.to_value(), "old": old.to_value(), "rotated_at": rotated_at});
    }
}

/// Reads `path` from the place in `known` of its inode (from its start if none, or if it is
/// shorter: truncated), at most [`READ_MAX`] bytes: its inode, the offset read from, the bytes.
fn read_from(path: &Path, known: &[Place]) -> Option<(u64, u64, Vec<u8>)> {
    let (mut f, md) = super::durable::open_regular(path).ok()?;
    let start = known
        .iter()
        .find(|p| p.ino == md.ino() && p.off <= md.len())
        .map_or(0, |p| p.off);
    f.seek(SeekFrom::Start(start)).ok()?;
    let mut bytes = Vec::new();
    f.take(READ_MAX).read_to_end(&mut bytes).ok()?;
    Some((md.ino(), start, bytes))
}

/// The counts of `<counter> <n>` lines; any other line is skipped.
fn parse_lines(bytes: &[u8], counts: &mut Vec<(&'static str, u64)>) {
    for line in bytes.split(|b| *b == b'\n') {
        let Ok(line) = std::str::from_utf8(line) else {
            continue;
        };
        let Some((name, n)) = line.split_once(' ') else {
            continue;
        };
        let Some(name) = counter::ALL.iter().find(|c| **c == name) else {
            continue;
        };
        match n.parse::<u64>() {
            Ok(n) if n <= LINE_MAX_COUNT => counts.push((name, n)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cvslurm-journal-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn counter_of(v: &Value, name: &str) -> u64 {
        v["counters"][name].as_u64().unwrap_or(0)
    }

    #[test]
    fn concurrent_appends_are_each_folded_once() {
        let d = tmpdir("concurrent");
        let j = CounterJournal::new(&d, None);
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let j = j.clone();
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        j.append(counter::QUEUED, 1).unwrap();
                    }
                    j.append(counter::LOST, 2).unwrap();
                })
            })
            .collect();
        let mut v = json!({});
        // Folds while the writers write: each line exactly once in the end.
        for _ in 0..20 {
            j.fold(&mut v, true, 1000);
        }
        for t in threads {
            t.join().unwrap();
        }
        j.fold(&mut v, true, 1000);
        assert_eq!(counter_of(&v, counter::QUEUED), 4000);
        assert_eq!(counter_of(&v, counter::LOST), 16);
        // A read-only view adds nothing twice, and moves nothing.
        let before = v.clone();
        let mut view = v.clone();
        j.fold(&mut view, false, 1000);
        assert_eq!(view, before);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_view_shows_what_is_not_folded_yet_without_moving() {
        let d = tmpdir("view");
        let j = CounterJournal::new(&d, None);
        j.append(counter::HOOK_DIRECT_SENDS, 1).unwrap();
        let mut v = json!({"counters": {"hook_direct_sends": 4}});
        let mut view = v.clone();
        j.fold(&mut view, false, 0);
        assert_eq!(counter_of(&view, counter::HOOK_DIRECT_SENDS), 5);
        assert!(view.get("journal").is_none());
        j.fold(&mut v, true, 0);
        j.fold(&mut v, true, 0);
        assert_eq!(counter_of(&v, counter::HOOK_DIRECT_SENDS), 5);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn rotation_keeps_lines_written_to_the_renamed_file() {
        let d = tmpdir("rotate");
        let j = CounterJournal::new(&d, None);
        // Past ROTATE_AT in lines of "events_queued 1\n" (16 bytes).
        let lines = ROTATE_AT / 16 + 1;
        for _ in 0..lines {
            j.append(counter::QUEUED, 1).unwrap();
        }
        // A writer that opened the journal before the rotation, and appends after it.
        let mut late = OpenOptions::new()
            .append(true)
            .open(d.join(COUNTER_JOURNAL))
            .unwrap();
        let mut v = json!({});
        j.fold(&mut v, true, 10_000);
        assert_eq!(counter_of(&v, counter::QUEUED), lines);
        assert!(d.join(COUNTER_JOURNAL_OLD).exists(), "rotated");
        assert!(!d.join(COUNTER_JOURNAL).exists());
        late.write_all(b"events_queued 7\n").unwrap();
        j.append(counter::QUEUED, 1).unwrap();
        j.fold(&mut v, true, 10_001);
        assert_eq!(counter_of(&v, counter::QUEUED), lines + 8);
        // Not rotated again before OLD_KEEP_SECS, however large.
        for _ in 0..lines {
            j.append(counter::QUEUED, 1).unwrap();
        }
        j.fold(&mut v, true, 10_002);
        assert_eq!(counter_of(&v, counter::QUEUED), 2 * lines + 8);
        assert!(d.join(COUNTER_JOURNAL).exists(), "not rotated yet");
        j.fold(&mut v, true, 10_000 + OLD_KEEP_SECS);
        assert!(!d.join(COUNTER_JOURNAL).exists(), "rotated again");
        j.fold(&mut v, true, 10_000 + OLD_KEEP_SECS + 1);
        assert_eq!(counter_of(&v, counter::QUEUED), 2 * lines + 8);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_view_from_before_a_rotation_counts_nothing_twice() {
        let d = tmpdir("viewrot");
        let j = CounterJournal::new(&d, None);
        let lines = ROTATE_AT / 16 + 1;
        for _ in 0..lines {
            j.append(counter::QUEUED, 1).unwrap();
        }
        let mut v = json!({});
        j.fold(&mut v, true, 0);
        j.append(counter::QUEUED, 1).unwrap();
        // A reader read the status before this fold rotated the journal.
        let stale = v.clone();
        j.fold(&mut v, true, OLD_KEEP_SECS);
        assert!(d.join(COUNTER_JOURNAL_OLD).exists());
        let mut view = stale;
        j.fold(&mut view, false, OLD_KEEP_SECS);
        assert_eq!(counter_of(&view, counter::QUEUED), lines + 1);
        assert_eq!(counter_of(&v, counter::QUEUED), lines + 1);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn garbage_lines_are_skipped_and_a_replaced_file_is_read_from_its_start() {
        let d = tmpdir("garbage");
        let j = CounterJournal::new(&d, None);
        std::fs::write(
            d.join(COUNTER_JOURNAL),
            b"events_queued 2\nevents_queued x\nnot_a_counter 5\nevents_lost 99999999999\n\xff\xfe 1\nevents_lost 1",
        )
        .unwrap();
        let mut v = json!({});
        j.fold(&mut v, true, 0);
        assert_eq!(counter_of(&v, counter::QUEUED), 2);
        // The last line has no newline yet: a writer's line in the making, folded once whole.
        assert_eq!(counter_of(&v, counter::LOST), 0);
        let mut f = OpenOptions::new()
            .append(true)
            .open(d.join(COUNTER_JOURNAL))
            .unwrap();
        f.write_all(b"\n").unwrap();
        j.fold(&mut v, true, 0);
        assert_eq!(counter_of(&v, counter::LOST), 1);
        // Replaced by another file (SlurmUser may): read from its start.
        std::fs::remove_file(d.join(COUNTER_JOURNAL)).unwrap();
        std::fs::write(d.join(COUNTER_JOURNAL), b"events_lost 3\n").unwrap();
        j.fold(&mut v, true, 0);
        assert_eq!(counter_of(&v, counter::LOST), 4);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn links_are_not_written_through() {
        let d = tmpdir("links");
        let target = d.join("target");
        std::fs::write(&target, b"").unwrap();
        let j = CounterJournal::new(&d, None);
        std::os::unix::fs::symlink(&target, d.join(COUNTER_JOURNAL)).unwrap();
        assert!(j.append(counter::QUEUED, 1).is_err());
        std::fs::remove_file(d.join(COUNTER_JOURNAL)).unwrap();
        std::fs::hard_link(&target, d.join(COUNTER_JOURNAL)).unwrap();
        let e = j.append(counter::QUEUED, 1).unwrap_err();
        assert!(e.contains("one link"), "{e}");
        assert_eq!(std::fs::read(&target).unwrap(), b"");
        std::fs::remove_dir_all(&d).unwrap();
    }
}

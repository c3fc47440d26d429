//! Start records: `jobs/<jobid>@<cluster>`, the start time a prolog saw for a job, as decimal
//! Unix seconds, then (since the job-completion receiver) the run's restart count
//! (`SLURM_JOB_RESTART_COUNT`) after a space. Slurm before 23.02 gives the epilog no start
//! time; reconciliation takes the records as the list of jobs a hook reported running; the
//! job-completion receiver tells a job's runs apart by them ([`Starts::load_run`]).
//!
//! Not fsynced ([`super::durable::replace`]): a record survives the kill of any process, not a
//! power loss, which costs only a start time on old Slurm (the service asks slurmctld anyway)
//! and a hint for reconciliation (which lists running jobs from Slurm itself).
//!
//! Shape notes: `jobs/<jobid>@<cluster>%shape` (`%` followed by no two hex digits never
//! appears in a key's file name, so it names no job), what CloudVision was last sent for the
//! running job ([`Shape`]): written by the prolog and by reconciliation when it sends a
//! resized or suspended job anew, removed with the start record. The bytes are hostile: a
//! note that is not exactly a [`Shape`] is no note.
//!
//! Boot notes: `jobs/<jobid>@<cluster>%boot`, written by reconciliation when it sees a recorded
//! job wait for its nodes to boot or power up (`sbatch --reboot`, power saving, cloud nodes):
//! Slurm resets such a job's start when the nodes are ready, after its prolog reported the
//! allocation's. Reconciliation then sends its RUNNING anew with Slurm's start and drops the
//! note; it goes with the start record too. A note is exactly [`BOOT_TEXT`]; other bytes are
//! no note.

use super::durable::{self, records, safe_name, unsafe_name};
use super::layout::JOBS;
use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The suffix of a shape note's file name.
const SHAPE: &str = "%shape";
/// The suffix of a boot note's file name.
const BOOT: &str = "%boot";
/// A boot note's whole text.
const BOOT_TEXT: &[u8] = b"boot";

/// Is the file `name` a note (no job's start record)?
fn is_note(name: &str) -> bool {
    name.ends_with(SHAPE) || name.ends_with(BOOT)
}

/// What CloudVision was last sent for a running job: a fingerprint of its node set (64-bit
/// FNV-1a of the sorted, de-duplicated node names, each after the first preceded by a NUL byte) and whether it was sent as
/// suspended. Written as `n<16 hex>` (running) or `s<16 hex>` (suspended).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// The fingerprint of the node set.
    pub nodes: u64,
    /// Sent as suspended.
    pub suspended: bool,
}

impl Shape {
    /// The shape of a job on `nodes` (in any order), suspended or not.
    pub fn of(nodes: &[String], suspended: bool) -> Shape {
        let mut sorted: Vec<&str> = nodes.iter().map(String::as_str).collect();
        sorted.sort_unstable();
        sorted.dedup();
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for (i, n) in sorted.iter().enumerate() {
            if i > 0 {
                h = h.wrapping_mul(0x100_0000_01b3); // a NUL byte: in no node name
            }
            for b in n.bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
            }
        }
        Shape {
            nodes: h,
            suspended,
        }
    }

    fn text(self) -> String {
        format!(
            "{}{:016x}",
            if self.suspended { 's' } else { 'n' },
            self.nodes
        )
    }

    /// Reads [`Shape::text`]; anything else (another length, a newline, not hex) is `None`.
    fn parse(bytes: &[u8]) -> Option<Shape> {
        if bytes.len() != 17 || !bytes[1..].iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        let suspended = match bytes[0] {
            b'n' => false,
            b's' => true,
            _ => return None,
        };
        let nodes = u64::from_str_radix(std::str::from_utf8(&bytes[1..]).ok()?, 16).ok()?;
        Some(Shape { nodes, suspended })
    }
}

/// The start records in one state directory.
#[derive(Debug, Clone)]
pub struct Starts {
    root: PathBuf,
    owner: Option<(u32, u32)>,
}

impl Starts {
    /// The start records under `root`, new files handed to `owner`.
    pub(super) fn new(root: &Path, owner: Option<(u32, u32)>) -> Starts {
        Starts {
            root: root.to_path_buf(),
            owner,
        }
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(JOBS).join(safe_name(key))
    }

    /// Records the start time the prolog saw for the job `key` (`12345@cluster`), run 0.
    #[cfg(test)]
    pub(crate) fn save(&self, key: &str, start: i64) -> Result<(), String> {
        self.save_run(key, start, 0)
    }

    /// Records the start time the prolog saw for run `restarts` of the job `key`.
    pub fn save_run(&self, key: &str, start: i64, restarts: u32) -> Result<(), String> {
        durable::ensure_dirs(&self.root, self.owner)?;
        durable::replace(
            &self.path(key),
            format!("{start} {restarts}").as_bytes(),
            self.owner,
        )
    }

    fn shape_path(&self, key: &str) -> PathBuf {
        self.root
            .join(JOBS)
            .join(format!("{}{SHAPE}", safe_name(key)))
    }

    /// Notes what CloudVision was last sent for the running job `key`.
    pub fn save_shape(&self, key: &str, shape: Shape) -> Result<(), String> {
        durable::ensure_dirs(&self.root, self.owner)?;
        durable::replace(&self.shape_path(key), shape.text().as_bytes(), self.owner)
    }

    fn boot_path(&self, key: &str) -> PathBuf {
        self.root
            .join(JOBS)
            .join(format!("{}{BOOT}", safe_name(key)))
    }

    /// Notes that the running job `key` waits for its nodes to boot (its start is Slurm's
    /// only once they are up).
    pub fn note_boot(&self, key: &str) -> Result<(), String> {
        durable::ensure_dirs(&self.root, self.owner)?;
        durable::replace(&self.boot_path(key), BOOT_TEXT, self.owner)
    }

    /// Drops the job's boot note ([`Starts::note_boot`]).
    pub fn drop_boot_note(&self, key: &str) {
        let _ = fs::remove_file(self.boot_path(key));
    }

    /// What CloudVision was last sent for the job, where a note says it.
    pub fn load_shape(&self, key: &str) -> Option<Shape> {
        Shape::parse(&durable::read_file(&self.shape_path(key)).ok()?)
    }

    /// The start time the prolog recorded for a job.
    pub fn load(&self, key: &str) -> Option<i64> {
        self.load_run(key).map(|(start, _)| start)
    }

    /// The start time and restart count the prolog recorded for a job (a record without a
    /// restart count, written before it was kept, is run 0).
    pub fn load_run(&self, key: &str) -> Option<(i64, u32)> {
        durable::read_file(&self.path(key))
            .ok()
            .and_then(|b| parse_record(&String::from_utf8_lossy(&b)))
    }

    /// True when a prolog's start record of the job is there.
    pub(crate) fn exists(&self, key: &str) -> bool {
        self.path(key).exists()
    }

    /// Forgets a job's start record.
    pub fn forget(&self, key: &str) {
        let _ = fs::remove_file(self.path(key));
        let _ = fs::remove_file(self.shape_path(key));
        let _ = fs::remove_file(self.boot_path(key));
    }

    /// The jobs of [`Starts::started_jobs`], the shape notes of those that have one and the
    /// jobs with a boot note, from one read of the directory. A note whose job has no start
    /// record (one written while the job's end removed its record) is removed once older
    /// than `orphan_age`.
    #[allow(clippy::type_complexity)]
    pub fn started_jobs_and_notes(
        &self,
        orphan_age: Duration,
    ) -> (
        Vec<(String, i64, Duration)>,
        HashMap<String, Shape>,
        HashSet<String>,
    ) {
        let dir = self.root.join(JOBS);
        let mut started = Vec::new();
        let mut shapes = HashMap::new();
        let mut boots = HashSet::new();
        let mut orphans = Vec::new();
        for (name, bytes, age) in records(&dir) {
            if let Some(base) = name.strip_suffix(SHAPE) {
                let base = base.to_string();
                let shape = Shape::parse(&bytes);
                if let Some(s) = shape {
                    shapes.insert(unsafe_name(&base), s);
                }
                // Removed below where its job has no start record.
                if shape.is_none() || age > orphan_age {
                    orphans.push((name, base));
                }
                continue;
            }
            if let Some(base) = name.strip_suffix(BOOT) {
                let base = base.to_string();
                let ok = bytes == BOOT_TEXT;
                if ok {
                    boots.insert(unsafe_name(&base));
                }
                if !ok || age > orphan_age {
                    orphans.push((name, base));
                }
                continue;
            }
            if let Some((start, _)) = parse_record(&String::from_utf8_lossy(&bytes)) {
                started.push((unsafe_name(&name), start, age));
            }
        }
        let keys: HashSet<&String> = started.iter().map(|s| &s.0).collect();
        for (name, base) in orphans {
            let key = unsafe_name(&base);
            if !keys.contains(&key) {
                shapes.remove(&key);
                boots.remove(&key);
                let _ = fs::remove_file(dir.join(name));
            }
        }
        (started, shapes, boots)
    }

    /// The jobs whose start a prolog recorded and whose end no epilog has handled yet:
    /// `(key, start, age of the record)`.
    pub fn started_jobs(&self) -> Vec<(String, i64, Duration)> {
        records(&self.root.join(JOBS))
            .into_iter()
            .filter(|(name, _, _)| !is_note(name))
            .filter_map(|(name, bytes, age)| {
                let (start, _) = parse_record(&String::from_utf8_lossy(&bytes))?;
                Some((unsafe_name(&name), start, age))
            })
            .collect()
    }
}

/// `START` or `START RESTARTS`; anything else is no record.
fn parse_record(text: &str) -> Option<(i64, u32)> {
    let mut words = text.split_ascii_whitespace();
    let start = words.next()?.parse().ok()?;
    let restarts = match words.next() {
        Some(w) => w.parse().ok()?,
        None => 0,
    };
    words.next().is_none().then_some((start, restarts))
}

#[cfg(test)]
mod tests {
    use crate::state::StateDir;

    #[test]
    fn start_records() {
        let d = std::env::temp_dir().join(format!("cvslurm-starts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let starts = StateDir::new(&d).starts;
        assert_eq!(starts.load("1@c"), None);
        starts.save("1@c", 100).unwrap();
        starts.save("1@c", 101).unwrap();
        starts.save("../2@c", 200).unwrap();
        assert_eq!(starts.load("1@c"), Some(101));
        assert!(starts.exists("../2@c"));
        let mut all: Vec<(String, i64)> = starts
            .started_jobs()
            .into_iter()
            .map(|(k, s, _)| (k, s))
            .collect();
        all.sort();
        assert_eq!(all, [("../2@c".to_string(), 200), ("1@c".to_string(), 101)]);
        assert_eq!(starts.load_run("1@c"), Some((101, 0)));
        starts.save_run("1@c", 102, 2).unwrap();
        assert_eq!(starts.load_run("1@c"), Some((102, 2)));
        assert_eq!(starts.load("1@c"), Some(102));
        let file = d.join(crate::state::layout::JOBS).join("1@c");
        for (text, want) in [
            ("99", Some((99, 0))),
            ("99 3\n", Some((99, 3))),
            ("99 x", None),
            ("99 1 2", None),
            ("", None),
        ] {
            std::fs::write(&file, text).unwrap();
            assert_eq!(starts.load_run("1@c"), want, "{text:?}");
        }
        starts.save("1@c", 101).unwrap();
        starts.forget("1@c");
        assert_eq!(starts.load("1@c"), None);
        assert_eq!(starts.started_jobs().len(), 1);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Shape notes: the node set's fingerprint ignores order and repeats; a note is read
    /// back with the start records, is no job of its own, goes with its job's record, and
    /// hostile bytes are no note.
    #[test]
    fn shape_notes() {
        use super::Shape;
        use std::time::Duration;
        let v = |s: &[&str]| s.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert_eq!(
            Shape::of(&v(&["n1", "n2"]), false),
            Shape::of(&v(&["n2", "n1", "n1"]), false)
        );
        assert_ne!(
            Shape::of(&v(&["n1", "n2"]), false),
            Shape::of(&v(&["n1"]), false)
        );
        assert_ne!(
            Shape::of(&v(&["n1,n2"]), false),
            Shape::of(&v(&["n1", "n2"]), false)
        );
        assert_ne!(Shape::of(&v(&["n1"]), false), Shape::of(&v(&["n1"]), true));

        let d = std::env::temp_dir().join(format!("cvslurm-shapes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let starts = StateDir::new(&d).starts;
        let two = Shape::of(&v(&["n1", "n2"]), false);
        starts.save("1@c", 100).unwrap();
        starts.save_shape("1@c", two).unwrap();
        starts.save("../2@c", 200).unwrap();
        starts
            .save_shape("../2@c", Shape::of(&v(&["n3"]), true))
            .unwrap();
        assert_eq!(starts.load_shape("1@c"), Some(two));
        assert_eq!(starts.load_run("1@c"), Some((100, 0)));
        assert_eq!(starts.started_jobs().len(), 2);
        let (jobs, shapes, _) = starts.started_jobs_and_notes(Duration::from_secs(3600));
        assert_eq!(jobs.len(), 2);
        assert_eq!(shapes.get("1@c"), Some(&two));
        assert_eq!(shapes.get("../2@c").map(|s| s.suspended), Some(true));
        // Hostile bytes are no note (and are removed where no job is recorded).
        let file = d.join(crate::state::layout::JOBS).join("1@c%shape");
        for bad in [
            "",
            "n0123456789abcdef\n",
            "x0123456789abcdef",
            "n0123456789abcdeg",
            "n0123456789abcde",
            "s0123456789abcdef0",
        ] {
            std::fs::write(&file, bad).unwrap();
            assert_eq!(starts.load_shape("1@c"), None, "{bad:?}");
            let (jobs, shapes, _) = starts.started_jobs_and_notes(Duration::from_secs(3600));
            assert_eq!(jobs.len(), 2, "{bad:?}");
            assert!(!shapes.contains_key("1@c"), "{bad:?}");
        }
        starts.save_shape("1@c", two).unwrap();
        // A note whose job's record is gone is removed once old.
        starts.save_shape("9@c", two).unwrap();
        let (_, shapes, _) = starts.started_jobs_and_notes(Duration::from_secs(3600));
        assert!(shapes.contains_key("9@c"));
        let (_, shapes, _) = starts.started_jobs_and_notes(Duration::ZERO);
        assert!(!shapes.contains_key("9@c"));
        assert_eq!(starts.load_shape("9@c"), None);
        assert_eq!(shapes.len(), 2);
        // It goes with its job's record.
        starts.forget("1@c");
        assert_eq!(starts.load_shape("1@c"), None);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Boot notes: read back with the start records, no job of their own, hostile bytes are
    /// no note, removed on their own, with their job's record, or once old without one.
    #[test]
    fn boot_notes() {
        use std::time::Duration;
        let d = std::env::temp_dir().join(format!("cvslurm-boots-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let starts = StateDir::new(&d).starts;
        let hour = Duration::from_secs(3600);
        starts.save("1@c", 100).unwrap();
        starts.save("../2@c", 200).unwrap();
        starts.note_boot("1@c").unwrap();
        starts.note_boot("../2@c").unwrap();
        assert_eq!(starts.started_jobs().len(), 2);
        let (jobs, _, boots) = starts.started_jobs_and_notes(hour);
        assert_eq!(jobs.len(), 2);
        assert_eq!(boots.len(), 2);
        assert!(boots.contains("1@c") && boots.contains("../2@c"));
        let file = d.join(crate::state::layout::JOBS).join("1@c%boot");
        for bad in ["", "boot\n", "boo", "bootx", "1"] {
            std::fs::write(&file, bad).unwrap();
            let (jobs, _, boots) = starts.started_jobs_and_notes(hour);
            assert_eq!(jobs.len(), 2, "{bad:?}");
            assert!(!boots.contains("1@c"), "{bad:?}");
        }
        starts.note_boot("1@c").unwrap();
        starts.drop_boot_note("1@c");
        assert!(!starts.started_jobs_and_notes(hour).2.contains("1@c"));
        // Without its job's record: kept while young, removed once old.
        starts.note_boot("9@c").unwrap();
        assert!(starts.started_jobs_and_notes(hour).2.contains("9@c"));
        assert!(!starts
            .started_jobs_and_notes(Duration::ZERO)
            .2
            .contains("9@c"));
        assert!(!file.with_file_name("9@c%boot").exists());
        // It goes with its job's record.
        starts.forget("../2@c");
        assert!(starts.started_jobs_and_notes(hour).2.is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }
}

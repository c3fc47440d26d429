//! Start records: `jobs/<jobid>@<cluster>`, the start time a prolog saw for a job, as decimal
//! Unix seconds, then (since the job-completion receiver) the run's restart count
//! (`SLURM_JOB_RESTART_COUNT`) after a space. Slurm before 23.02 gives the epilog no start
//! time; reconciliation takes the records as the list of jobs a hook reported running; the
//! job-completion receiver tells a job's runs apart by them ([`Starts::load_run`]).
//!
//! Not fsynced ([`super::durable::replace`]): a record survives the kill of any process, not a
//! power loss, which costs only a start time on old Slurm (the service asks slurmctld anyway)
//! and a hint for reconciliation (which lists running jobs from Slurm itself).

use super::durable::{self, records, safe_name, unsafe_name};
use super::layout::JOBS;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    }

    /// The jobs whose start a prolog recorded and whose end no epilog has handled yet:
    /// `(key, start, age of the record)`.
    pub fn started_jobs(&self) -> Vec<(String, i64, Duration)> {
        records(&self.root.join(JOBS))
            .into_iter()
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
}

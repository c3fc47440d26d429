//! Representation records: `reps/<jobid>@<cluster>`, how a job's records go to CloudVision —
//! by node names or by the MACs of its interfaces (`JobInterfaces=gpu|auto`). Decided at the
//! job's first send ([`crate::inventory::attribution::outgoing`]) and kept until its end is delivered:
//! every later record of the job (its end, a resend, reconciliation's) goes the same way, so
//! that CloudVision's stored record holds exactly one of `nodes` and `interfaces`.
//!
//! A record is `nodes` on one line, or the MACs one per line. It is written before the
//! job's first record is sent, removed when its end is delivered (or refused) or when a
//! re-run decides anew; one older than [`MAX_AGE`] (its end never went out) is removed by
//! [`JobReps::prune`]. Not fsynced: a record lost with a power failure costs one DELETE
//! before the job's end (the representation is then unknown). The bytes are hostile: a
//! record that is not `nodes` or a short list of lower-case MACs is no record.

use super::durable::{self, records, safe_name};
use super::layout::JOB_REPS;
use crate::cloudvision::payload::is_mac;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The most MACs a record holds (a job on 512 nodes of 8 NICs). A job that would go by more
/// goes by node names ([`crate::inventory::attribution::outgoing`]), with a warning.
pub const MAX_MACS: usize = 4096;

/// How long a record stays without its job's end: longer than any job runs.
pub const MAX_AGE: Duration = Duration::from_secs(60 * 24 * 3600);

/// The word of a record by node names.
const NODES: &str = "nodes";

/// How a job's records go to CloudVision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Representation {
    /// By node names (`nodes.values`).
    Nodes,
    /// By these MACs (`interfaces.values`), lower-case, at most [`MAX_MACS`].
    Interfaces(Vec<String>),
}

/// The representation records in one state directory.
#[derive(Debug, Clone)]
pub struct JobReps {
    root: PathBuf,
    owner: Option<(u32, u32)>,
}

impl JobReps {
    /// The representation records under `root`, new files handed to `owner`.
    pub(super) fn new(root: &Path, owner: Option<(u32, u32)>) -> JobReps {
        JobReps {
            root: root.to_path_buf(),
            owner,
        }
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(JOB_REPS).join(safe_name(key))
    }

    /// Records how the job `key` (`12345@cluster`) goes. Refuses a list of MACs that
    /// [`JobReps::load`] would not take back (empty, too long, not MACs).
    pub fn save(&self, key: &str, rep: &Representation) -> Result<(), String> {
        let text = match rep {
            Representation::Nodes => format!("{NODES}\n"),
            Representation::Interfaces(macs) => {
                if macs.is_empty() || macs.len() > MAX_MACS {
                    return Err(format!(
                        "{} MACs: a record holds 1 to {MAX_MACS}",
                        macs.len()
                    ));
                }
                if let Some(bad) = macs.iter().find(|m| !is_mac(m)) {
                    return Err(format!("{bad:?} is not a MAC address"));
                }
                let mut t = macs.join("\n");
                t.push('\n');
                t
            }
        };
        durable::ensure_dirs(&self.root, self.owner)?;
        durable::replace(&self.path(key), text.as_bytes(), self.owner)
    }

    /// How the job goes; `None` when there is no usable record (none, unreadable, empty, too
    /// long, or a line that is neither `nodes` alone nor a MAC).
    pub fn load(&self, key: &str) -> Option<Representation> {
        let bytes = durable::read_file(&self.path(key)).ok()?;
        if bytes.len() > MAX_MACS * 18 {
            return None;
        }
        let text = std::str::from_utf8(&bytes).ok()?;
        if text == format!("{NODES}\n") {
            return Some(Representation::Nodes);
        }
        let macs: Vec<String> = text.lines().map(str::to_string).collect();
        (!macs.is_empty() && macs.len() <= MAX_MACS && macs.iter().all(|m| is_mac(m)))
            .then_some(Representation::Interfaces(macs))
    }

    /// Forgets a job's record, and its note of a re-run's deleted record.
    pub fn forget(&self, key: &str) {
        let _ = fs::remove_file(self.path(key));
        let _ = fs::remove_file(self.rerun_path(key));
    }

    /// The note of a re-run: `reps/<key>%run` (`%` followed by no two hex digits never
    /// appears in a key's file name, so it names no job).
    fn rerun_path(&self, key: &str) -> PathBuf {
        self.root
            .join(JOB_REPS)
            .join(format!("{}%run", safe_name(key)))
    }

    /// The restart count of the job's run whose RUNNING already deleted the earlier run's
    /// record in CloudVision ([`JobReps::note_rerun_deleted`]), if any. Hostile bytes (a
    /// link, a large file, not a number) are no note.
    pub fn rerun_deleted(&self, key: &str) -> Option<u32> {
        let bytes = durable::read_file(&self.rerun_path(key)).ok()?;
        if bytes.len() > 12 {
            return None;
        }
        std::str::from_utf8(&bytes).ok()?.trim_end().parse().ok()
    }

    /// Notes that run `run` of the job deleted the earlier run's record: a resend of its
    /// RUNNING (a retry after a failed POST, reconciliation's, a new inventory's) must not
    /// delete the live record again. Removed with the job's record ([`JobReps::forget`]).
    pub fn note_rerun_deleted(&self, key: &str, run: u32) -> Result<(), String> {
        durable::ensure_dirs(&self.root, self.owner)?;
        durable::replace(
            &self.rerun_path(key),
            format!("{run}\n").as_bytes(),
            self.owner,
        )
    }

    /// Removes the records older than `max_age`; returns how many.
    pub fn prune(&self, max_age: Duration) -> usize {
        let dir = self.root.join(JOB_REPS);
        records(&dir)
            .into_iter()
            .filter(|(_, _, age)| *age > max_age)
            .filter(|(name, _, _)| fs::remove_file(dir.join(name)).is_ok())
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::Representation::{Interfaces, Nodes};
    use crate::state::StateDir;
    use std::time::Duration;

    #[test]
    fn representation_records() {
        let d = std::env::temp_dir().join(format!("cvslurm-jobreps-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let reps = StateDir::new(&d).job_reps;
        assert_eq!(reps.load("1@c"), None);
        let two = vec!["02:00:00:00:00:01".to_string(), "02:00:00:00:00:02".into()];
        reps.save("1@c", &Interfaces(two.clone())).unwrap();
        assert_eq!(reps.load("1@c"), Some(Interfaces(two.clone())));
        reps.save("../2@c", &Nodes).unwrap();
        assert_eq!(reps.load("../2@c"), Some(Nodes));
        // What load would not take back is not saved.
        let too_many = vec!["02:00:00:00:00:01".to_string(); super::MAX_MACS + 1];
        assert!(reps.save("4@c", &Interfaces(too_many)).is_err());
        assert!(reps.save("4@c", &Interfaces(Vec::new())).is_err());
        assert!(reps.save("4@c", &Interfaces(vec!["n1".into()])).is_err());
        assert_eq!(reps.load("4@c"), None);
        let most = vec!["02:00:00:00:00:01".to_string(); super::MAX_MACS];
        reps.save("5@c", &Interfaces(most.clone())).unwrap();
        assert_eq!(reps.load("5@c"), Some(Interfaces(most)));
        // Hostile bytes: anything but `nodes` alone or MACs, or nothing, is no record.
        let file = d.join(super::JOB_REPS).join("3@c");
        for bad in [
            "02:00:00:00:00:01\nn1\n",
            "",
            "\n",
            "02:00:00:00:00:0G\n",
            "nodes\n02:00:00:00:00:01\n",
            "nodes",
            "NODES\n",
        ] {
            std::fs::write(&file, bad).unwrap();
            assert_eq!(reps.load("3@c"), None, "{bad:?}");
        }
        std::fs::write(&file, "02:00:00:00:00:01\n".repeat(super::MAX_MACS + 1)).unwrap();
        assert_eq!(reps.load("3@c"), None);
        reps.forget("1@c");
        assert_eq!(reps.load("1@c"), None);
        assert_eq!(reps.prune(Duration::from_secs(3600)), 0);
        assert_eq!(reps.prune(Duration::ZERO), 3);
        assert_eq!(reps.load("../2@c"), None);
        std::fs::remove_dir_all(&d).unwrap();
    }
}

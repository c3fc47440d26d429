//! Interface records: `macs/<jobid>@<cluster>`, the MACs a running job's RUNNING was last sent
//! with (`JobInterfaces=gpu|auto`), one per line. The job's end is sent the same way even when
//! slurmctld has forgotten the job by then (its GPUs can no longer be asked): the stored
//! record keeps one representation, the one its RUNNING used.
//!
//! Written by the sender when a RUNNING by interfaces is delivered, removed when a RUNNING by
//! node names or the job's end is delivered (or refused); a record older than
//! [`MAX_AGE`] (its end never went out) is removed by [`JobMacs::prune`]. Not fsynced: a
//! record lost with a power failure costs only that the end is attributed anew. The bytes
//! are hostile: a record that is not a short list of lower-case MACs is ignored.

use super::durable::{self, records, safe_name};
use super::layout::JOB_MACS;
use crate::payload::is_mac;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The most MACs a record holds (a job on 512 nodes of 8 NICs); a longer file is not used.
pub const MAX_MACS: usize = 4096;

/// How long a record stays without its job's end: longer than any job runs.
pub const MAX_AGE: Duration = Duration::from_secs(60 * 24 * 3600);

/// The interface records in one state directory.
#[derive(Debug, Clone)]
pub struct JobMacs {
    root: PathBuf,
    owner: Option<(u32, u32)>,
}

impl JobMacs {
    /// The interface records under `root`, new files handed to `owner`.
    pub(super) fn new(root: &Path, owner: Option<(u32, u32)>) -> JobMacs {
        JobMacs {
            root: root.to_path_buf(),
            owner,
        }
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(JOB_MACS).join(safe_name(key))
    }

    /// Records the MACs the RUNNING of the job `key` (`12345@cluster`) was sent with.
    pub fn save(&self, key: &str, macs: &[String]) -> Result<(), String> {
        durable::ensure_dirs(&self.root, self.owner)?;
        let mut text = macs.join("\n");
        text.push('\n');
        durable::replace(&self.path(key), text.as_bytes(), self.owner)
    }

    /// The MACs the job's RUNNING was sent with; `None` when there is no usable record (none,
    /// unreadable, empty, too long, or a line that is not a MAC).
    pub fn load(&self, key: &str) -> Option<Vec<String>> {
        let bytes = durable::read_file(&self.path(key)).ok()?;
        if bytes.len() > MAX_MACS * 18 {
            return None;
        }
        let text = std::str::from_utf8(&bytes).ok()?;
        let macs: Vec<String> = text.lines().map(str::to_string).collect();
        (!macs.is_empty() && macs.iter().all(|m| is_mac(m))).then_some(macs)
    }

    /// Forgets a job's record.
    pub fn forget(&self, key: &str) {
        let _ = fs::remove_file(self.path(key));
    }

    /// Removes the records older than `max_age`; returns how many.
    pub fn prune(&self, max_age: Duration) -> usize {
        let dir = self.root.join(JOB_MACS);
        records(&dir)
            .into_iter()
            .filter(|(_, _, age)| *age > max_age)
            .filter(|(name, _, _)| fs::remove_file(dir.join(name)).is_ok())
            .count()
    }
}

#[cfg(test)]
mod tests {
    use crate::state::StateDir;
    use std::time::Duration;

    #[test]
    fn interface_records() {
        let d = std::env::temp_dir().join(format!("cvslurm-jobmacs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let macs = StateDir::new(&d).job_macs;
        assert_eq!(macs.load("1@c"), None);
        let two = vec!["02:00:00:00:00:01".to_string(), "02:00:00:00:00:02".into()];
        macs.save("1@c", &two).unwrap();
        assert_eq!(macs.load("1@c"), Some(two.clone()));
        macs.save("../2@c", &two[..1]).unwrap();
        assert_eq!(macs.load("../2@c").unwrap().len(), 1);
        // Hostile bytes: anything but MACs, or nothing, is no record.
        let file = d.join(super::JOB_MACS).join("3@c");
        for bad in ["02:00:00:00:00:01\nn1\n", "", "\n", "02:00:00:00:00:0G\n"] {
            std::fs::write(&file, bad).unwrap();
            assert_eq!(macs.load("3@c"), None, "{bad:?}");
        }
        std::fs::write(&file, "02:00:00:00:00:01\n".repeat(super::MAX_MACS + 1)).unwrap();
        assert_eq!(macs.load("3@c"), None);
        macs.forget("1@c");
        assert_eq!(macs.load("1@c"), None);
        assert_eq!(macs.prune(Duration::from_secs(3600)), 0);
        assert_eq!(macs.prune(Duration::ZERO), 2);
        assert_eq!(macs.load("../2@c"), None);
        std::fs::remove_dir_all(&d).unwrap();
    }
}

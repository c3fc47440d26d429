//! The ends this host delivered lately: `sent/<jobid>@<cluster>`, one empty file per job,
//! its modification time the delivery's. Kept on a controller pair only, so that the catch-up
//! of a host that takes control again ([`crate::service::catch_up`]) never sends an end this
//! host delivered itself, across restarts of its service too (what the process remembers,
//! [`crate::state::queue::Queue::recently_ended`], dies with it).
//!
//! Not synced (a lost file costs one harmless second send of an end). Read by name and time
//! only, never by content; anything in the directory that is not a regular file (a link, a
//! FIFO) is skipped, and a read looks at [`READ_AT_MOST`] entries at most.

use super::durable::{self, safe_name, unsafe_name};
use super::layout::{SENT, TMP_PREFIX};
use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The most entries one read (or prune) of `sent/` looks at: an hour of ends at 25 a second.
pub const READ_AT_MOST: usize = 100_000;

/// The delivered-ends records of one state directory.
#[derive(Debug, Clone)]
pub struct EndsSent {
    root: PathBuf,
    owner: Option<(u32, u32)>,
}

impl EndsSent {
    /// The records under `root`, new files handed to `owner`.
    pub(super) fn new(root: &Path, owner: Option<(u32, u32)>) -> EndsSent {
        EndsSent {
            root: root.to_path_buf(),
            owner,
        }
    }

    /// Records that the end of job `key` (`12345@cluster`) was delivered now.
    pub fn record(&self, key: &str) -> Result<(), String> {
        durable::ensure_dirs(&self.root, self.owner)?;
        durable::replace(&self.root.join(SENT).join(safe_name(key)), b"", self.owner)
    }

    /// The job keys whose end was recorded less than `age` ago.
    pub fn within(&self, age: Duration) -> HashSet<String> {
        self.entries()
            .into_iter()
            .filter(|(_, _, a)| *a < age)
            .map(|(key, _, _)| key)
            .collect()
    }

    /// Removes the records older than `age`; returns how many.
    pub fn prune(&self, age: Duration) -> usize {
        self.entries()
            .into_iter()
            .filter(|(_, _, a)| *a >= age)
            .filter(|(_, path, _)| fs::remove_file(path).is_ok())
            .count()
    }

    /// (key, path, age) of each regular file in `sent/`, at most [`READ_AT_MOST`].
    fn entries(&self) -> Vec<(String, PathBuf, Duration)> {
        let Ok(rd) = fs::read_dir(self.root.join(SENT)) else {
            return Vec::new();
        };
        rd.flatten()
            .take(READ_AT_MOST)
            .filter_map(|e| {
                let name = e.file_name().to_str()?.to_string();
                if name.starts_with(TMP_PREFIX) {
                    return None;
                }
                // Not followed: the entry itself.
                let md = e.metadata().ok()?;
                if !md.is_file() {
                    return None;
                }
                let age = md.modified().ok()?.elapsed().unwrap_or_default();
                Some((unsafe_name(&name), e.path(), age))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::state::layout::SENT;
    use crate::state::StateDir;
    use std::time::Duration;

    #[test]
    fn delivered_ends_are_remembered_by_name_and_age() {
        let d = std::env::temp_dir().join(format!("cvslurm-sent-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let sent = StateDir::new(&d).ends_sent;
        assert!(sent.within(Duration::from_secs(600)).is_empty());
        sent.record("7@c").unwrap();
        sent.record("8_1@c").unwrap();
        // Not records: a link, a directory.
        std::os::unix::fs::symlink("/etc/passwd", d.join(SENT).join("9@c")).unwrap();
        std::fs::create_dir(d.join(SENT).join("10@c")).unwrap();
        let got = sent.within(Duration::from_secs(600));
        assert_eq!(got, ["7@c", "8_1@c"].map(String::from).into());
        assert!(sent.within(Duration::ZERO).is_empty());
        assert_eq!(sent.prune(Duration::from_secs(600)), 0);
        assert_eq!(sent.prune(Duration::ZERO), 2);
        assert!(sent.within(Duration::from_secs(600)).is_empty());
        assert!(std::fs::symlink_metadata(d.join(SENT).join("9@c")).is_ok());
        std::fs::remove_dir_all(&d).unwrap();
    }
}

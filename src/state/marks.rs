//! Verification marks: `verify/<jobid>@<cluster>`, an epilog's end to check against Slurm's
//! final record later (`{"job": <the JobConfig sent>, "restart_count": n}`).
//!
//! On Slurm 22.05 a job cancelled in its first second reaches the epilog looking exactly like
//! a success, and Slurm records the truth only after the epilog: reconciliation
//! ([`crate::reconcile::verify_ends`]) checks the marked jobs and corrects CloudVision. Not
//! fsynced ([`super::durable::replace`]): losing a mark only loses a check.

use super::durable::{self, records, safe_name};
use super::layout::VERIFY;
use crate::cloudvision::payload::JobConfig;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The verification marks in one state directory.
#[derive(Debug, Clone)]
pub struct Marks {
    root: PathBuf,
    owner: Option<(u32, u32)>,
}

impl Marks {
    /// The marks under `root`, new files handed to `owner`.
    pub(super) fn new(root: &Path, owner: Option<(u32, u32)>) -> Marks {
        Marks {
            root: root.to_path_buf(),
            owner,
        }
    }

    /// Marks an epilog's end (`job` as sent) for verification.
    pub fn mark_for_verification(&self, job: &JobConfig, restart_count: u32) -> Result<(), String> {
        durable::ensure_dirs(&self.root, self.owner)?;
        let rec = serde_json::json!({"job": job, "restart_count": restart_count});
        let path = self.root.join(VERIFY).join(safe_name(&job.key.id));
        durable::replace(&path, rec.to_string().as_bytes(), self.owner)
    }

    /// Jobs marked for verification: `(job sent, restart count, age of the mark)`. A mark
    /// that is not one is skipped.
    pub fn to_verify(&self) -> Vec<(JobConfig, u32, Duration)> {
        records(&self.root.join(VERIFY))
            .into_iter()
            .filter_map(|(_, bytes, age)| {
                let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
                let job: JobConfig = serde_json::from_value(v["job"].clone()).ok()?;
                let restarts = v["restart_count"].as_u64().unwrap_or(0) as u32;
                Some((job, restarts, age))
            })
            .collect()
    }

    /// Removes a verification mark.
    pub fn verified(&self, key: &str) {
        let _ = fs::remove_file(self.root.join(VERIFY).join(safe_name(key)));
    }
}

#[cfg(test)]
mod tests {
    use crate::cloudvision::payload::{JobConfig, JobState, Key};
    use crate::state::layout::VERIFY;
    use crate::state::StateDir;

    #[test]
    fn marks_are_kept_until_verified() {
        let d = std::env::temp_dir().join(format!("cvslurm-marks-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let marks = StateDir::new(&d).marks;
        let job = JobConfig {
            key: Key { id: "9@c".into() },
            name: None,
            state: JobState::Completed,
            start_time: None,
            end_time: None,
            location: None,
            job_type: None,
            nodes: Some(vec!["n1".to_string()].into()),
            interfaces: None,
        };
        marks.mark_for_verification(&job, 2).unwrap();
        // Not a mark: skipped.
        std::fs::write(d.join(VERIFY).join("8@c"), b"{\"job\": 1}").unwrap();
        let v = marks.to_verify();
        assert_eq!(v.len(), 1);
        assert_eq!((&v[0].0, v[0].1), (&job, 2));
        marks.verified("9@c");
        assert!(marks.to_verify().is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }
}

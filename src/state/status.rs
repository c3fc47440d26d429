//! Service status: `service-status.json`, what the last drain passes of the service (or of a
//! `flush`) recorded for `cvslurm status`: `last_delivery`, `last_error`, `last_error_at` and
//! `last_drain`, as Unix seconds. A report, not an event: not fsynced.

use super::durable;
use super::layout::SERVICE_STATUS;
use std::path::{Path, PathBuf};

/// The service status file of one state directory.
#[derive(Debug, Clone)]
pub struct ServiceStatus {
    path: PathBuf,
    owner: Option<(u32, u32)>,
}

impl ServiceStatus {
    /// The status file under `root`, written for `owner`.
    pub(super) fn new(root: &Path, owner: Option<(u32, u32)>) -> ServiceStatus {
        ServiceStatus {
            path: root.join(SERVICE_STATUS),
            owner,
        }
    }

    /// Records the outcome of a drain pass: the last delivery and the last error (on one line,
    /// capped), with their times.
    pub fn record_drain(&self, delivered: usize, last_error: Option<&str>) {
        let mut v = self.read().unwrap_or_else(|| serde_json::json!({}));
        let now = crate::timefmt::now_epoch();
        if delivered > 0 {
            v["last_delivery"] = now.into();
        }
        if let Some(e) = last_error {
            // One line, capped: `status` shows it (and escapes it again, as it must anything
            // read from StateDir).
            v["last_error"] = crate::text::one_line(e, 1000).into();
            v["last_error_at"] = now.into();
        }
        v["last_drain"] = now.into();
        if let Ok(bytes) = serde_json::to_vec(&v) {
            let _ = durable::replace(&self.path, &bytes, self.owner);
        }
    }

    /// Records a bound reached or a question Slurm could not answer for its size (a listing
    /// past the runner's output bound, ids left for the next pass): `last_slurm_warning` and
    /// its time, for `status`.
    pub fn record_slurm_warning(&self, warning: &str) {
        let mut v = self.read().unwrap_or_else(|| serde_json::json!({}));
        v["last_slurm_warning"] = crate::text::one_line(warning, 1000).into();
        v["last_slurm_warning_at"] = crate::timefmt::now_epoch().into();
        if let Ok(bytes) = serde_json::to_vec(&v) {
            let _ = durable::replace(&self.path, &bytes, self.owner);
        }
    }

    /// What the last drain passes recorded ([`record_drain`](Self::record_drain)), if anything.
    pub fn read(&self) -> Option<serde_json::Value> {
        durable::read_file(&self.path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
    }
}

#[cfg(test)]
mod tests {
    use crate::state::StateDir;

    #[test]
    fn drains_are_recorded() {
        let d = std::env::temp_dir().join(format!("cvslurm-status-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let status = StateDir::new(&d).status;
        assert_eq!(status.read(), None);
        status.record_drain(0, Some("HTTP 503"));
        status.record_drain(2, None);
        let v = status.read().unwrap();
        assert!(v["last_delivery"].as_i64().is_some());
        assert_eq!(v["last_error"], "HTTP 503");
        assert!(v["last_drain"].as_i64() >= v["last_error_at"].as_i64());
        status.record_slurm_warning("slurmctld (by job id): 70 jobs\nto ask about");
        let v = status.read().unwrap();
        assert_eq!(v["last_error"], "HTTP 503");
        assert!(v["last_slurm_warning"]
            .as_str()
            .unwrap()
            .starts_with("slurmctld (by job id): 70 jobs"));
        assert!(!v["last_slurm_warning"].as_str().unwrap().contains('\n'));
        assert!(v["last_slurm_warning_at"].as_i64().is_some());
        std::fs::remove_dir_all(&d).unwrap();
    }
}

//! `slurm::json::parse_jobs`, `slurm::pick`, `parse_cluster_name`.
#![no_main]

use cvslurm::internals::slurm::{json::parse_jobs, parse_cluster_name, pick, valid_job_id};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(jobs) = parse_jobs(s) {
        for j in &jobs {
            assert!(valid_job_id(&j.job_id) && !j.job_id.contains('_'), "{:?}", j.job_id);
            assert_eq!(j.state, j.states.first().cloned().unwrap_or_default());
            assert!(j.states.iter().all(|s| !s.is_empty()));
            assert!(j.start.is_none_or(|t| t > 0));
            assert!(j.end.is_none_or(|t| t > 0));
            for v in [&j.partition, &j.nodelist, &j.reason, &j.exit_code]
                .into_iter()
                .flatten()
            {
                assert!(!v.is_empty());
            }
            assert_ne!(j.nodelist.as_deref(), Some("None assigned"));
            assert_eq!(j.array_job_id.is_some(), j.array_task_id.is_some());
            // A heterogeneous job's component: a leader's job number and an offset below 128.
            assert_eq!(j.het_job_id.is_some(), j.het_job_offset.is_some());
            assert!(j.het_job_offset.is_none_or(|o| o < 128));
            assert!(j.het_job_id.as_ref().is_none_or(|h| valid_job_id(h) && h != "0"));
            if let Some(e) = &j.exit_code {
                assert!(cvslurm::internals::job_end::parse_exit_code(e).is_some(), "{e}");
            }
            let _ = j.nodes();
            // Every job is found by its own id, and as <array>_<task> when it is a task.
            let ids = [j.job_id.clone()];
            assert!(pick(jobs.clone(), &ids).contains_key(&j.job_id));
            if let (Some(a), Some(t)) = (&j.array_job_id, &j.array_task_id) {
                let id = format!("{a}_{t}");
                assert!(pick(jobs.clone(), std::slice::from_ref(&id)).contains_key(&id));
            }
        }
    }
    if let Some(c) = parse_cluster_name(s) {
        assert!(!c.is_empty() && c != "(null)");
        assert_eq!(c, c.trim());
    }
});

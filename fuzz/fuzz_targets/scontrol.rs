//! `KvRecord::parse`, `parse_scontrol_job`, `parse_cluster_name`.
#![no_main]

use cvslurm::slurm::{parse_cluster_name, parse_scontrol_job, valid_job_id, KvRecord};
use libfuzzer_sys::fuzz_target;

/// Known keys whose value a record may carry.
const KEYS: &[&str] = &[
    "JobId",
    "ArrayJobId",
    "ArrayTaskId",
    "JobName",
    "JobState",
    "Reason",
    "NodeList",
    "StartTime",
    "EndTime",
    "ExitCode",
    "Restarts",
    "Partition",
];

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    for line in s.lines() {
        let r = KvRecord::parse(line);
        // Writing the record back as `Key=Value …` and parsing again gives the same record.
        let mut text = String::new();
        for k in KEYS {
            if let Some(v) = r.get(k) {
                // Tokens are joined by one space: never a trailing or doubled one. (A leading
                // one is possible: `JobName= x` is the name " x".)
                assert!(!v.contains('\n'));
                assert!(!v.ends_with(' ') && !v.contains("  "), "{k}={v:?}");
            }
        }
        let reparsed_keys: Vec<(&str, &str)> = KEYS
            .iter()
            .filter_map(|k| r.get(k).map(|v| (*k, v)))
            .collect();
        for (k, v) in &reparsed_keys {
            text.push_str(&format!("{k}={v} "));
        }
        let r2 = KvRecord::parse(&text);
        for (k, v) in &reparsed_keys {
            assert_eq!(r2.get(k), Some(*v), "round trip of {k} in {line:?}");
        }
        // Every job id the record carries is found by parse_scontrol_job.
        if let Some(id) = r
            .get("JobId")
            .filter(|id| valid_job_id(id) && !id.contains('_'))
        {
            let j = parse_scontrol_job(s, id).expect("a record with this JobId is in the text");
            assert_eq!(j.job_id, id);
            check(&j);
        }
        if let (Some(a), Some(t)) = (r.get("ArrayJobId"), r.get("ArrayTaskId")) {
            let id = format!("{a}_{t}");
            if valid_job_id(&id) {
                let j = parse_scontrol_job(s, &id).expect("array task is in the text");
                check(&j);
            }
        }
    }
    // Whatever job is asked for, no panic.
    let first = s.lines().next().unwrap_or("").trim();
    if let Some(j) = parse_scontrol_job(s, first) {
        check(&j);
    }
    if let Some(c) = parse_cluster_name(s) {
        assert!(!c.is_empty() && c != "(null)");
        assert_eq!(c, c.trim());
    }
});

fn check(j: &cvslurm::slurm::JobInfo) {
    assert!(j.start.is_none_or(|t| t > 0));
    assert!(j.end.is_none_or(|t| t > 0));
    for v in [&j.partition, &j.reason, &j.exit_code, &j.nodelist]
        .into_iter()
        .flatten()
    {
        assert!(!v.is_empty() && v != "(null)");
    }
    let _ = j.nodes();
}

//! `parse_sacct`: every allocation row is found by its id; fields are normalised.
#![no_main]

use cvslurm::slurm::parse_sacct;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    for line in s.lines() {
        let Some((id, _)) = line.split_once('|') else {
            continue;
        };
        let allocation_row = !id.is_empty() && !id.contains('.') && line.matches('|').count() >= 7;
        match parse_sacct(s, id) {
            Some(j) => {
                if !id.contains('_') {
                    assert_eq!(j.job_id, id);
                }
                assert!(j.start.is_none_or(|t| t > 0));
                assert!(j.end.is_none_or(|t| t > 0));
                for v in [&j.partition, &j.exit_code, &j.nodelist]
                    .into_iter()
                    .flatten()
                {
                    assert!(!v.is_empty());
                }
                assert_ne!(j.nodelist.as_deref(), Some("None assigned"));
                assert!(!j.job_id.contains('|') && !j.job_id.contains('.'));
                let _ = j.nodes();
            }
            None => assert!(!allocation_row, "row {line:?} not found by its id"),
        }
    }
    let first = s.lines().next().unwrap_or("");
    let _ = parse_sacct(s, first);
});

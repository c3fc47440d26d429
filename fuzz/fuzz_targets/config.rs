//! `Config::parse` and `Config::parse_lenient_bytes` (the file as it is read, any bytes): never
//! panic; every error names the file (and the line).
#![no_main]

use cvslurm::config::Config;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

const ORIGIN: &str = "/etc/slurm/fuzz-cloudvision.conf";

fuzz_target!(|data: &[u8]| {
    let lenient = Config::parse_lenient_bytes(data, Path::new(ORIGIN));
    for e in &lenient.problems {
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!("{ORIGIN}:")),
            "error without the path: {msg}"
        );
    }
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    match Config::parse(s, Path::new(ORIGIN)) {
        Ok(c) => {
            assert_eq!(c.source.as_deref(), Some(Path::new(ORIGIN)));
            assert!((1..=256).contains(&c.max_concurrent_requests));
            assert!(c.poll_interval.as_secs_f64() >= 1.0);
            assert!(c.hook_timeout.as_secs_f64() >= 0.1);
            assert!(!c.discovery_job_name.is_empty());
            assert!(c.partitions.iter().all(|p| !p.is_empty() && p.trim() == p));
            // The regexes it accepted can be used.
            let _ = c.job_wanted("job", Some("p"));
            let _ = c.interface_regex.is_match("eth0");
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!("{ORIGIN}:")),
                "error without the path: {msg}"
            );
        }
    }
});

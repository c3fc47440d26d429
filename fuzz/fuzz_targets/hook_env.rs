//! `HookEnv::from_vars` and `parse_exit_code`. The environment comes from the fuzz input as
//! `KEY=VALUE` lines (as `env` prints them, like the hookenv-*.txt fixtures).
#![no_main]

use cvslurm::internals::job_end::{parse_exit_code, HookEnv};
use cvslurm::internals::slurm::hostlist;
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let mut vars = HashMap::new();
    for line in s.split('\n') {
        if let Some((k, v)) = line.split_once('=') {
            vars.insert(k.to_string(), v.to_string());
        }
    }
    match HookEnv::from_vars(&vars) {
        Ok(env) => {
            assert!(!env.job_id.is_empty() && env.job_id.bytes().all(|b| b.is_ascii_digit()));
            assert!(!env.cluster.is_empty());
            assert!(!env.nodes.is_empty());
            let list = vars["SLURM_JOB_NODELIST"].trim();
            assert_eq!(hostlist::expand(list).unwrap(), env.nodes);
            assert!(env.start.is_none_or(|t| t > 0));
            assert!(env.end.is_none_or(|t| t > 0));
            // A heterogeneous job's component is keyed by its leader.
            let id = env.het.as_ref().map_or(&env.job_id, |h| &h.leader);
            assert_eq!(env.key(), format!("{id}@{}", env.cluster));
            if let Some(h) = &env.het {
                assert!(!h.leader.is_empty() && h.leader.bytes().all(|b| b.is_ascii_digit()));
                assert!(h.offset < 128);
                assert_eq!(h.offset == 0, h.leader == env.job_id);
            }
            if let Some((e, sig)) = env.exit {
                assert_eq!(parse_exit_code(&format!("{e}:{sig}")), Some((e, sig)));
            }
        }
        Err(e) => assert!(!e.is_empty()),
    }
    if let Some(v) = vars.get("SLURM_JOB_EXIT_CODE2") {
        if let Some((e, sig)) = parse_exit_code(v) {
            assert_eq!(parse_exit_code(&format!("{e}:{sig}")), Some((e, sig)));
        }
    }
    let _ = parse_exit_code(s);
});

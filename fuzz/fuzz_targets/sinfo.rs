//! `parse_sinfo` and `node_state_available`.
#![no_main]

use cvslurm::internals::slurm::{node_state_available, parse_sinfo};
use libfuzzer_sys::fuzz_target;
use std::collections::HashSet;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let nodes = parse_sinfo(s);
    assert!(nodes.len() <= s.lines().count());
    let mut seen = HashSet::new();
    for n in &nodes {
        assert!(seen.insert(n.name.as_str()), "node {} listed twice", n.name);
        assert!(!n.name.is_empty() && !n.name.contains(char::is_whitespace));
        assert!(!n.state.is_empty() && !n.state.contains(char::is_whitespace));
        let mut parts = HashSet::new();
        for p in &n.partitions {
            assert!(!p.is_empty(), "empty partition of {} in {s:?}", n.name);
            assert!(!p.ends_with('*'), "default marker kept in {p:?}");
            assert!(parts.insert(p), "partition {p} twice");
        }
        if n.available() {
            let lower = n.state.to_ascii_lowercase();
            assert!(["idle", "allocated", "mixed", "completing", "planned"].contains(&lower.as_str()));
        }
    }
    let _ = node_state_available(s);
});

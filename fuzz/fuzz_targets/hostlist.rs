//! `hostlist::expand`: never panics, never exceeds MAX_HOSTS or MAX_BYTES, never yields an
//! empty name or a name holding a separator or bracket, and agrees with a plain split when
//! there are no brackets.
#![no_main]

use cvslurm::internals::slurm::hostlist::{expand, MAX_BYTES, MAX_HOSTS};
use libfuzzer_sys::fuzz_target;

const SEPARATORS: &[char] = &[',', ' ', '\t', '\n', '\r'];

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    match expand(s) {
        Ok(hosts) => {
            assert!(hosts.len() <= MAX_HOSTS, "{} hosts", hosts.len());
            let bytes: usize = hosts.iter().map(String::len).sum();
            assert!(bytes <= MAX_BYTES, "{bytes} bytes of names");
            for h in &hosts {
                assert!(!h.is_empty(), "empty name from {s:?}");
                assert!(!h.contains(SEPARATORS), "separator in {h:?} from {s:?}");
                assert!(!h.contains(['[', ']']), "bracket in {h:?} from {s:?}");
            }
            if !s.contains(['[', ']']) {
                let plain: Vec<&str> = s.split(SEPARATORS).filter(|t| !t.is_empty()).collect();
                assert_eq!(hosts, plain, "no-bracket input {s:?}");
            }
            // Expanding the names again, joined by commas, gives the same names.
            if hosts.len() <= 1000 {
                let again = expand(&hosts.join(",")).expect("expanded names re-expand");
                assert_eq!(again, hosts);
            }
        }
        Err(e) => {
            assert_eq!(e.input, s);
            assert!(!e.reason.is_empty());
        }
    }
});

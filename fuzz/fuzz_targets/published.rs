//! `discovery::published::decode` (a node's `Extra` value, which root on any host can write)
//! and `slurm::nodes::parse_published` (`scontrol show node -o` with any text in it).
#![no_main]

use cvslurm::internals::discovery::published::{decode, encode, MAX_PUBLISHED, PREFIX};
use cvslurm::internals::slurm::nodes::parse_published;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    // As an Extra value, with and without the prefix.
    for v in [s.to_string(), format!("{PREFIX}{s}")] {
        let Ok(rec) = decode(&v) else {
            continue;
        };
        assert!(v.len() <= MAX_PUBLISHED);
        assert!(rec.validate().is_ok());
        let again = encode(&rec).expect("a record read back encodes");
        assert!(again.starts_with(PREFIX) && !again.contains(char::is_whitespace));
        assert_eq!(decode(&again).expect("re-decodes"), rec);
    }
    // As scontrol's listing: each node once, an Extra without white space.
    let nodes = parse_published(s);
    assert!(nodes.len() <= s.lines().count());
    for (name, p) in &nodes {
        assert!(!name.is_empty() && !name.contains(char::is_whitespace));
        if let Some(x) = &p.extra {
            assert!(!x.contains(char::is_whitespace), "{x:?}");
        }
    }
});

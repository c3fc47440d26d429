//! `DiscoverRecord::parse_line`: an accepted record is valid, and serializes (serde_json) to a
//! line that parses back to the same record.
#![no_main]

use cvslurm::internals::discovery::record::DiscoverRecord;
use cvslurm::cloudvision::payload::is_mac;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(rec) = DiscoverRecord::parse_line(s) else {
        return;
    };
    assert!(rec.validate().is_ok());
    assert!(!rec.node_name.is_empty());
    for i in &rec.interfaces {
        assert!(is_mac(&i.mac_address));
        for ip in &i.ip_addresses {
            assert!(ip.parse::<std::net::Ipv4Addr>().is_ok());
        }
    }
    let line = serde_json::to_string(&rec).expect("a record serializes");
    assert!(!line.contains('\n'), "one line: {line:?}");
    let back = DiscoverRecord::parse_line(&line).expect("a serialized record re-parses");
    assert_eq!(back, rec);
    let _ = rec.to_node_config("c");
});

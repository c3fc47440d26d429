//! `timefmt::parse_slurm_epoch` and `parse_user_time`.
#![no_main]

use cvslurm::internals::timefmt::{format_epoch, parse_slurm_epoch, parse_user_time};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(n) = parse_slurm_epoch(s) {
        assert!(n > 0);
        assert_eq!(parse_slurm_epoch(&n.to_string()), Some(n));
    }
    match parse_user_time(s) {
        Ok(n) => {
            // Whatever a user may give can be sent to CloudVision, and reads back the same.
            let text =
                format_epoch(n).unwrap_or_else(|| panic!("{s:?} -> {n} cannot be formatted"));
            assert_eq!(parse_user_time(&text), Ok(n), "{s:?} -> {text}");
            assert_eq!(parse_user_time(&n.to_string()), Ok(n));
        }
        Err(e) => assert!(!e.is_empty()),
    }
});

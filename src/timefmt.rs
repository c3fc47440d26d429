//! Time conversion: CloudVision wants UTC `YYYY-MM-DDTHH:MM:SSZ`; Slurm gives epoch seconds
//! (we ask for them with `SLURM_TIME_FORMAT=%s`) and users type RFC 3339 or epoch seconds.

use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::OffsetDateTime;

/// Formats Unix seconds as CloudVision's UTC timestamp, e.g. `2025-12-05T10:30:00Z`.
pub fn format_epoch(secs: i64) -> Option<String> {
    let t = OffsetDateTime::from_unix_timestamp(secs).ok()?;
    let f = format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    t.format(&f).ok()
}

/// The current time as Unix seconds.
pub fn now_epoch() -> i64 {
    OffsetDateTime::now_utc().unix_timestamp()
}

/// Nanoseconds since the epoch (the clock of an event's `seq` in the outbox).
pub(crate) fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

/// Parses a Slurm time field printed under `SLURM_TIME_FORMAT=%s`: epoch seconds, or `None`
/// for Slurm's placeholders (`Unknown`, `None`, `N/A`, empty, `0`).
pub fn parse_slurm_epoch(s: &str) -> Option<i64> {
    let s = s.trim();
    match s.parse::<i64>() {
        // Up to the end of year 9999: what format_epoch can write for CloudVision.
        Ok(n) if n > 0 && n <= 253_402_300_799 => Some(n),
        _ => None,
    }
}

/// Parses a time given by a user: epoch seconds or RFC 3339 (`2025-12-05T10:30:00Z`,
/// `2025-12-05T11:30:00+01:00`). Returns Unix seconds, from 1970 to the end of year 9999 (what
/// [`format_epoch`] can write for CloudVision).
pub fn parse_user_time(s: &str) -> Result<i64, String> {
    let s = s.trim();
    let n = match s.parse::<i64>() {
        Ok(n) if n >= 0 => n,
        _ => OffsetDateTime::parse(s, &Rfc3339)
            .map(|t| t.unix_timestamp())
            .map_err(|_| {
                format!("time {s:?} is neither epoch seconds nor RFC 3339 (2025-12-05T10:30:00Z)")
            })?,
    };
    if n < 0 || format_epoch(n).is_none() {
        return Err(format!(
            "time {s:?} is outside 1970-01-01T00:00:00Z to 9999-12-31T23:59:59Z"
        ));
    }
    Ok(n)
}

/// Parses a time of Slurm's job-completion documents: RFC 3339 (`…Z`, `…+01:00`), or a local
/// time without a zone (`2026-12-03T12:45:11`, what jobcomp/elasticsearch writes on 22.05),
/// read in this host's time zone (the receiver runs beside slurmctld) by the C library's
/// `mktime` (`TZ`, `/etc/localtime`; daylight saving decided by the C library). `None` for
/// anything else, and for times CloudVision cannot take.
pub fn parse_jobcomp_time(s: &str) -> Option<i64> {
    let s = s.trim();
    let secs = match OffsetDateTime::parse(s, &Rfc3339) {
        Ok(t) => t.unix_timestamp(),
        Err(_) => {
            let f = format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]");
            local_to_epoch(time::PrimitiveDateTime::parse(s, &f).ok()?)?
        }
    };
    (secs > 0 && format_epoch(secs).is_some()).then_some(secs)
}

/// A local wall-clock time as Unix seconds (`mktime`, `tm_isdst = -1`: the C library decides).
fn local_to_epoch(p: time::PrimitiveDateTime) -> Option<i64> {
    // SAFETY: `tm` is a plain C struct, zeroed then filled; mktime reads and normalizes it
    // and touches nothing else of ours.
    let mut tm: nix::libc::tm = unsafe { std::mem::zeroed() };
    tm.tm_year = p.year() - 1900;
    tm.tm_mon = i32::from(u8::from(p.month())) - 1;
    tm.tm_mday = i32::from(p.day());
    tm.tm_hour = i32::from(p.hour());
    tm.tm_min = i32::from(p.minute());
    tm.tm_sec = i32::from(p.second());
    tm.tm_isdst = -1;
    // SAFETY: a valid, initialized `tm` (above).
    let t = unsafe { nix::libc::mktime(&mut tm) };
    (t != -1).then_some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Job-completion times: RFC 3339 as it is; a local time in this host's zone (the test
    /// process runs with TZ unset or UTC on CI: compare with the C library's own answer).
    #[test]
    fn parses_jobcomp_times() {
        assert_eq!(parse_jobcomp_time("2025-12-05T10:30:00Z"), Some(1764930600));
        assert_eq!(
            parse_jobcomp_time("2025-12-05T11:30:00+01:00"),
            Some(1764930600)
        );
        let local = parse_jobcomp_time("2025-12-05T10:30:00").unwrap();
        assert!((local - 1764930600).abs() <= 14 * 3600, "{local}");
        for bad in [
            "",
            "Unknown",
            "2025-12-05",
            "2025-13-05T10:30:00",
            "x2025-12-05T10:30:00",
        ] {
            assert_eq!(parse_jobcomp_time(bad), None, "{bad}");
        }
    }

    #[test]
    fn formats_utc() {
        assert_eq!(format_epoch(1764930600).unwrap(), "2025-12-05T10:30:00Z");
        assert_eq!(format_epoch(0).unwrap(), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn parses_slurm_and_user_times() {
        assert_eq!(parse_slurm_epoch("1764930600"), Some(1764930600));
        for none in ["Unknown", "None", "", "0", "N/A", "253402300800"] {
            assert_eq!(parse_slurm_epoch(none), None);
        }
        assert_eq!(parse_user_time("2025-12-05T10:30:00Z").unwrap(), 1764930600);
        assert_eq!(
            parse_user_time("2025-12-05T11:30:00+01:00").unwrap(),
            1764930600
        );
        assert_eq!(parse_user_time("1764930600").unwrap(), 1764930600);
        assert!(parse_user_time("yesterday").is_err());
    }

    /// From fuzzing (times target, minimized): epoch seconds past year 9999 were accepted,
    /// though no CloudVision timestamp can be written for them.
    #[test]
    fn user_time_must_be_writable() {
        assert!(parse_user_time("900606000600").is_err());
        assert!(parse_user_time("253402300799").is_ok());
        assert!(parse_user_time("253402300800").is_err());
        assert!(parse_user_time("1969-12-31T23:59:59Z").is_err());
        assert_eq!(parse_user_time("1970-01-01T00:00:00Z"), Ok(0));
    }
}

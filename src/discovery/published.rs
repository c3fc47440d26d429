//! A node's own record, published by the node in Slurm (`cvslurm publish`, run by slurmd as
//! its `HealthCheckProgram`): the node's Slurm `Extra` field holds `cvslurm1:` and the
//! record's JSON in unpadded base64url, one word with no space, so that `scontrol show node -o`
//! prints it whole, whatever the record holds. The controller reads it back for a node its
//! discovery srun cannot reach (`WorkerRecords=yes`): every byte of it is hostile until
//! [`decode`] has checked it, as a record from srun is.

use super::record::DiscoverRecord;

/// What the `Extra` value of a published record begins with (the format's version).
pub const PREFIX: &str = "cvslurm1:";

/// The longest `Extra` value published or read back (prefix included): 64 KiB, about 48 KiB
/// of JSON, a record of some 300 interfaces. Slurm keeps the field in its node state and
/// sends it with every node listing, so it stays small.
pub const MAX_PUBLISHED: usize = 64 * 1024;

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// The `Extra` value that publishes `rec`; an error when it would be longer than
/// [`MAX_PUBLISHED`].
pub fn encode(rec: &DiscoverRecord) -> Result<String, String> {
    let json = serde_json::to_vec(rec).map_err(|e| e.to_string())?;
    let mut out = String::with_capacity(PREFIX.len() + json.len() * 4 / 3 + 4);
    out.push_str(PREFIX);
    for chunk in json.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    if out.len() > MAX_PUBLISHED {
        return Err(format!(
            "the record is {} bytes published, more than the {MAX_PUBLISHED} a node may publish ({} interfaces)",
            out.len(),
            rec.interfaces.len()
        ));
    }
    Ok(out)
}

/// True when an `Extra` value is a published record of this format (it may still be bad).
pub fn is_published(value: &str) -> bool {
    value.starts_with(PREFIX)
}

/// Reads back a published record: its size, encoding and the record itself checked as
/// [`DiscoverRecord::parse_line`] checks a line from srun. The error says what is wrong.
pub fn decode(value: &str) -> Result<DiscoverRecord, String> {
    let Some(body) = value.strip_prefix(PREFIX) else {
        return Err(format!("not a cvslurm record (it does not begin {PREFIX})"));
    };
    if value.len() > MAX_PUBLISHED {
        return Err(format!(
            "{} bytes, more than the {MAX_PUBLISHED} a published record may have",
            value.len()
        ));
    }
    if body.len() % 4 == 1 {
        return Err("not base64url (a length no encoding gives)".into());
    }
    let mut bytes = Vec::with_capacity(body.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in body.bytes() {
        let Some(v) = ALPHABET.iter().position(|&a| a == c) else {
            return Err("not base64url (a character outside A-Z a-z 0-9 - _)".into());
        };
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            bytes.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    let text = std::str::from_utf8(&bytes).map_err(|_| "its JSON is not UTF-8".to_string())?;
    DiscoverRecord::parse_line(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::record::Interface;

    fn rec(n: usize) -> DiscoverRecord {
        DiscoverRecord {
            node_name: "n4".into(),
            hostname: "n4".into(),
            location: Some("cvtest".into()),
            interfaces: (0..n)
                .map(|i| Interface {
                    name: format!("ens{i}"),
                    mac_address: format!("02:00:00:00:{:02x}:{:02x}", i / 256, i % 256),
                    ip_addresses: vec![format!("10.0.{}.{}", i / 256, i % 256)],
                })
                .collect(),
            topology: None,
            topology_error: None,
            taken_at: Some(1_796_000_000),
        }
    }

    /// Every length of JSON (0, 1 and 2 bytes over a multiple of 3) comes back whole, as one
    /// word scontrol prints unsplit.
    #[test]
    fn records_come_back_whole() {
        for n in 0..6 {
            let mut r = rec(n);
            for pad in 0..3 {
                r.hostname = format!("n4{}", "x".repeat(pad));
                let v = encode(&r).unwrap();
                assert!(
                    v.starts_with(PREFIX) && !v.contains(char::is_whitespace) && !v.contains('=')
                );
                assert_eq!(decode(&v).unwrap(), r, "{v}");
            }
        }
    }

    #[test]
    fn bad_values_are_refused_with_their_reason() {
        let good = encode(&rec(1)).unwrap();
        assert!(decode("site data")
            .unwrap_err()
            .contains("not a cvslurm record"));
        assert!(decode(&format!("{good}*")).unwrap_err().contains("outside"));
        assert!(decode(&format!("{good}A")).is_err());
        let not_json = format!("{PREFIX}aGVsbG8");
        assert!(decode(&not_json)
            .unwrap_err()
            .contains("not a discover record"));
        // A record that fails validation (a bad MAC) is refused as one from srun is.
        let mut r = rec(1);
        r.interfaces[0].mac_address = "zz".into();
        assert!(decode(&encode(&r).unwrap())
            .unwrap_err()
            .contains("bad MAC"));
        let huge = format!("{PREFIX}{}", "A".repeat(MAX_PUBLISHED));
        assert!(decode(&huge).unwrap_err().contains("more than"));
    }

    #[test]
    fn a_record_too_big_to_publish_is_an_error() {
        assert!(encode(&rec(300)).is_ok());
        assert!(encode(&rec(1000))
            .unwrap_err()
            .contains("more than the 65536"));
    }
}

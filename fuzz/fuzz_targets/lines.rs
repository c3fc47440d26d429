//! `inventory::read_lines_capped` (src/inventory/discovery.rs): compared with a simple model,
//! through a reader that hands out the input in small pieces. Byte 0 is the cap, byte 1 the
//! piece size.
#![no_main]

use cvslurm::internals::inventory::read_lines_capped;
use libfuzzer_sys::fuzz_target;
use std::io::Read;

const MARKER: &str = "<line longer than the limit>";

struct Trickle<'a> {
    data: &'a [u8],
    piece: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.piece.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fuzz_target!(|data: &[u8]| {
    let [max, piece, rest @ ..] = data else {
        return;
    };
    let max = *max as usize;
    let piece = (*piece as usize % 16) + 1;
    let mut got = Vec::new();
    read_lines_capped(Trickle { data: rest, piece }, max, |l| {
        got.push(l.to_string())
    });

    // The model: split on '\n'; an overlong line is the marker; a last line without '\n' is
    // passed when non-empty (as the marker when overlong).
    let mut want = Vec::new();
    let mut parts: Vec<&[u8]> = rest.split(|&b| b == b'\n').collect();
    let last = parts.pop().unwrap_or(&[]);
    for p in parts {
        want.push(if p.len() > max {
            MARKER.to_string()
        } else {
            String::from_utf8_lossy(p).into_owned()
        });
    }
    if last.len() > max {
        want.push(MARKER.to_string());
    } else if !last.is_empty() {
        want.push(String::from_utf8_lossy(last).into_owned());
    }
    assert_eq!(got, want);
    for l in &got {
        assert!(!l.contains('\n'));
        // Never longer than the cap in characters (an invalid byte may widen to U+FFFD).
        assert!(l == MARKER || l.chars().count() <= max, "{l:?} over {max}");
    }
});

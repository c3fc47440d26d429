//! Text from outside made safe to print on a terminal or keep on one line.
//!
//! A field that reaches root's terminal (an error CloudVision or a proxy sent, what SlurmUser
//! wrote in `service-status.json`, a config value) may hold escape sequences that move the
//! cursor and rewrite the lines above. [`escape_control`] writes every control character as a
//! visible escape; [`one_line`] is for text that is stored (one line, capped).

use std::borrow::Cow;
use std::fmt::Write;

/// `s` with every control character (Unicode `Cc`: C0 including ESC, CR, LF and TAB; DEL; C1)
/// and the Unicode line and paragraph separators written as a visible escape: `\n`, `\r`,
/// `\t`, `\x1b` for the other C0 and DEL, `\u{9b}` for C1, `\u{2028}`, `\u{2029}`.
/// Everything else, backslashes included, is kept, so escaping twice changes nothing more.
/// Borrowed when there is nothing to escape. The one escaper: the log formatter
/// ([`crate::logging`]) and every printed field from outside use it.
pub fn escape_control(s: &str) -> Cow<'_, str> {
    let special = |c: char| c.is_control() || c == '\u{2028}' || c == '\u{2029}';
    if !s.chars().any(special) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if special(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `s` on one line, at most `max_chars` characters (`…` marks a cut): runs of white space
/// (newlines included) become one space, other control characters are escaped
/// ([`escape_control`]).
pub fn one_line(s: &str, max_chars: usize) -> String {
    let joined = s.split_whitespace().collect::<Vec<_>>().join(" ");
    let escaped = escape_control(&joined);
    if escaped.chars().count() <= max_chars {
        return escaped.into_owned();
    }
    let mut cut: String = escaped.chars().take(max_chars.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert!(matches!(
            escape_control("plain text, ünïcödé \\ kept"),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            escape_control("a\x1b[2J\x1b[1Ab\rc\nd\te\x7ff\u{9b}g\u{85}h\0"),
            "a\\x1b[2J\\x1b[1Ab\\rc\\nd\\te\\x7ff\\u{9b}g\\u{85}h\\x00"
        );
        // Nothing escaped is a control character any more; a second pass changes nothing.
        let once = escape_control("x\x1b]0;title\x07y\u{9d}").into_owned();
        assert!(!once.chars().any(char::is_control), "{once}");
        assert_eq!(escape_control(&once), once);
    }

    #[test]
    fn one_line_joins_escapes_and_caps() {
        assert_eq!(one_line("  bad\r\n  token \t here ", 100), "bad token here");
        assert_eq!(one_line("a\x1b[2Jb", 100), "a\\x1b[2Jb");
        let long = "x".repeat(500);
        let capped = one_line(&long, 200);
        assert_eq!(capped.chars().count(), 200);
        assert!(capped.ends_with('…'));
        assert_eq!(one_line("", 10), "");
    }
}

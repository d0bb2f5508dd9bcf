//! How a message quotes what a user gave (an environment variable's value,
//! a host name, a path, a command-line argument): its control and
//! bidirectional-formatting characters escaped (`\u{1b}`), so that a value
//! cannot drive the terminal or reorder the line it is printed in, and a
//! very long value cut after [`MAX_QUOTED`] characters with its length said
//! (`… (102400 bytes)`), so that a 100 KB `MASTER_ADDR` is not echoed whole
//! into a log line. Every message of the communication layer, the C API
//! and the command that quotes user input goes through these two.

/// The most characters of a value a message quotes.
pub const MAX_QUOTED: usize = 200;

/// `value` as a message quotes it: in double quotes with Rust's escapes
/// (`"a\nb"`, as `{:?}` writes a string) and bidirectional formatting
/// characters escaped too; past [`MAX_QUOTED`] characters, cut, followed by
/// `… (N bytes)`.
pub fn quoted(value: &str) -> String {
    let (kept, cut) = cut(value);
    let mut out = polychip_files::printable(&format!("{kept:?}"));
    if cut {
        out += &format!("… ({} bytes)", value.len());
    }
    out
}

/// `value` as a message shows it inside prose, without quotes (a host in
/// `host:port`, a path): control and bidirectional formatting characters
/// escaped; past [`MAX_QUOTED`] characters, cut, followed by `… (N bytes)`.
pub fn shown(value: &str) -> String {
    let (kept, cut) = cut(value);
    let mut out = polychip_files::printable(kept);
    if cut {
        out += &format!("… ({} bytes)", value.len());
    }
    out
}

/// The first [`MAX_QUOTED`] characters of `value`, and whether that is
/// not all of it.
fn cut(value: &str) -> (&str, bool) {
    match value.char_indices().nth(MAX_QUOTED) {
        Some((at, _)) => (&value[..at], true),
        None => (value, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_printable_values_are_as_debug_writes_them() {
        assert_eq!(quoted("node0"), "\"node0\"");
        assert_eq!(quoted("a\"b"), format!("{:?}", "a\"b"));
        assert_eq!(shown("node0"), "node0");
        assert_eq!(shown("évité 日本"), "évité 日本");
    }

    #[test]
    fn control_characters_are_escaped_and_long_values_cut() {
        assert_eq!(quoted("a\u{1b}[2Jb\n"), "\"a\\u{1b}[2Jb\\n\"");
        assert_eq!(shown("a\u{1b}[2Jb\u{202e}c"), "a\\u{1b}[2Jb\\u{202e}c");
        assert!(!quoted("x\u{202e}y").contains('\u{202e}'));
        let long = "h".repeat(100_000);
        let q = quoted(&long);
        assert_eq!(q, format!("\"{}\"… (100000 bytes)", "h".repeat(MAX_QUOTED)));
        let s = shown(&long);
        assert_eq!(s, format!("{}… (100000 bytes)", "h".repeat(MAX_QUOTED)));
        // Cut on a character boundary, counting characters.
        let wide = "日".repeat(300);
        assert_eq!(
            shown(&wide),
            format!("{}… (900 bytes)", "日".repeat(MAX_QUOTED))
        );
        assert_eq!(shown(&"日".repeat(MAX_QUOTED)), "日".repeat(MAX_QUOTED));
    }
}

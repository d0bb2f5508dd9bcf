//! The files polychip's commands take and make.
//!
//! - Text inputs (model, cluster, settings, plan, profile and waiver files)
//!   are read only from regular files of a bounded size
//!   ([`read_text_file`]): a FIFO named in their place cannot block the
//!   program and `/dev/zero` cannot fill its memory. A leading UTF-8
//!   byte-order mark is dropped, as editors that write one mean it.
//! - Outputs are written whole or not at all ([`write_atomic`]): a private
//!   temporary file beside the target, synced, renamed over it, removed
//!   again when anything fails (a full disk leaves no half-written file and
//!   no stray temporary one).
//! - JSON inputs parsed into a value keep no silent choice between two
//!   values of one key ([`parse_json_value`] refuses a duplicate key, which
//!   `serde_json` would resolve as "the last one wins").
//! - Which paths name the same file ([`check_distinct`]): a command refuses
//!   an output that is one of its inputs, or another of its outputs, before
//!   it starts, instead of overwriting it.
//!
//! - Words from a file shown to the user ([`printable`]) cannot drive the
//!   terminal or reorder the line: control and bidirectional-formatting
//!   characters are written as escapes.
//!
//! - A command running helper processes catches SIGINT, SIGTERM and SIGHUP
//!   ([`signals::SignalGuard`]) to stop them and say why before it exits.
//!
//! - A thread the system refuses (a process limit) is an error naming what
//!   it was for ([`threads::spawn`], [`threads::spawn_scoped`]), not a
//!   panic.
//!
//! Every other crate that reads or writes such files goes through these, so
//! the rules (and their messages) are the same everywhere.

pub mod signals;
pub mod threads;

use std::fs::{File, FileType};
use std::io::{Error, ErrorKind, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The most bytes a text input may have (a model, cluster, settings,
/// profile, waiver or plan file: all of them kilobytes; a fleet's profile
/// a few megabytes).
pub const MAX_TEXT_FILE: u64 = 64 << 20;

/// What a file that is not a regular file is, in words (`a FIFO`), for
/// the messages that refuse it.
pub fn kind(ft: FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// Whether a symbolic link may stand for a file read with
/// [`open_regular`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Follow it (a path the user named; a Hugging Face cache, whose
    /// snapshots are links to blobs).
    Follow,
    /// Refuse it (a file a checkpoint names: it must be inside it); the
    /// open fails with `ELOOP`.
    Refuse,
}

fn not_regular(ft: FileType) -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        format!("it is {}, not a regular file; it was not read", kind(ft)),
    )
}

fn too_long(what: String, max_len: u64) -> Error {
    Error::new(
        ErrorKind::InvalidData,
        format!("{what} more than the {max_len} bytes such a file may have"),
    )
}

/// Opens `path` for reading if it is a regular file of at most `max_len`
/// bytes; returns it and its length, nothing read. It is opened with
/// `O_NONBLOCK`, so a FIFO named in its place does not block the open, and
/// checked with `fstat` before a byte is read. The errors say what the
/// path is (a directory, a FIFO, a device) or how long.
pub fn open_regular(path: &Path, links: Links, max_len: u64) -> std::io::Result<(File, u64)> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut flags = libc::O_NONBLOCK;
    if links == Links::Refuse {
        flags |= libc::O_NOFOLLOW;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(not_regular(meta.file_type()));
    }
    if meta.len() > max_len {
        return Err(too_long(
            format!("it is {} bytes long,", meta.len()),
            max_len,
        ));
    }
    Ok((file, meta.len()))
}

/// All of `path` ([`open_regular`]'s checks), at most `max_len` bytes: a
/// file that grows past the bound while it is read is refused too, so
/// `/dev/zero` or a growing file cannot fill the memory.
pub fn read_regular(path: &Path, links: Links, max_len: u64) -> std::io::Result<Vec<u8>> {
    let (file, len) = open_regular(path, links, max_len)?;
    let mut out = Vec::with_capacity(len as usize);
    // One byte more than the bound: a file that grew since fstat is refused.
    file.take(max_len.saturating_add(1)).read_to_end(&mut out)?;
    if out.len() as u64 > max_len {
        return Err(too_long("it grew while it was read, to".into(), max_len));
    }
    Ok(out)
}

/// Reads the text file `path` if it is a regular file of at most `max_len`
/// bytes ([`read_regular`], links followed). Anything else is refused
/// before it is opened, so that a device named in its place is not even
/// opened; a leading UTF-8 byte-order mark is dropped.
pub fn read_text_file(path: &Path, max_len: u64) -> std::io::Result<String> {
    let meta = std::fs::metadata(path)?;
    if !meta.file_type().is_file() {
        return Err(not_regular(meta.file_type()));
    }
    let bytes = read_regular(path, Links::Follow, max_len)?;
    let mut text = String::from_utf8(bytes)
        .map_err(|_| Error::new(ErrorKind::InvalidData, "stream did not contain valid UTF-8"))?;
    // A UTF-8 byte-order mark (some Windows editors write one) is not
    // part of the text: TOML and JSON parsers would refuse it as the
    // first character.
    if text.starts_with('\u{feff}') {
        text.drain(..'\u{feff}'.len_utf8());
    }
    Ok(text)
}

/// The temporary file [`write_atomic`] writes `path` through:
/// `.<name>.tmp-<pid>` in `path`'s directory.
fn temporary_sibling(path: &Path) -> std::io::Result<PathBuf> {
    let name = path.file_name().ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidInput,
            "the path names no file (it ends in \"..\" or \"/\")",
        )
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    Ok(dir.join(tmp_name))
}

/// Checks, before any work, that [`write_atomic`] could write `path`: its
/// temporary file can be created beside it (it is created and removed
/// again; nothing else changes). A directory where an existing file may be
/// written but no new file created (no write permission on it, an
/// immutable one, `/proc`) passes a check of the file alone and fails only
/// at the write, after the work.
pub fn check_atomic_write(path: &Path) -> std::io::Result<()> {
    let tmp = temporary_sibling(path)?;
    let _ = std::fs::remove_file(&tmp);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|e| {
            Error::new(
                e.kind(),
                format!(
                    "its temporary file {} cannot be created: {e}",
                    shown_path(&tmp)
                ),
            )
        })?;
    std::fs::remove_file(&tmp).map_err(|e| {
        Error::new(
            e.kind(),
            format!(
                "its temporary file {} cannot be removed: {e}",
                shown_path(&tmp)
            ),
        )
    })
}

/// Writes `bytes` to `path` whole or not at all: a private temporary file
/// beside it (`.<name>.tmp-<pid>`, created new: a stale file or a link at
/// that name is removed first, never followed), synced, renamed over
/// `path`, then the directory synced. On any failure the temporary file is
/// removed and an earlier file at `path` is left as it was. A `path` that
/// exists and is not a regular file (a device, a FIFO, a directory) is
/// refused, never replaced.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Ok(m) = std::fs::metadata(path)
        && !m.is_file()
    {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "it is {}, not a regular file; it was not replaced",
                kind(m.file_type())
            ),
        ));
    }
    let tmp = temporary_sibling(path)?;
    let at_tmp = |e: Error| {
        Error::new(
            e.kind(),
            format!("the temporary file {}: {e}", shown_path(&tmp)),
        )
    };
    // A stale one (left by a killed process of the same pid) or a link
    // planted at the name is removed, not followed; `create_new` (O_EXCL)
    // then refuses whatever appears there meanwhile.
    let _ = std::fs::remove_file(&tmp);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(at_tmp)?;
        f.write_all(bytes)
            .and_then(|()| f.sync_all())
            .map_err(at_tmp)?;
        std::fs::rename(&tmp, path).map_err(|e| {
            Error::new(
                e.kind(),
                format!("renaming {} over it: {e}", shown_path(&tmp)),
            )
        })
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if let Some(dir) = tmp.parent()
        && let Ok(d) = std::fs::File::open(dir)
    {
        let _ = d.sync_all();
    }
    Ok(())
}

/// What a path names, to tell whether two paths name one file: an existing
/// file by its device and inode (through links), one not yet made by its
/// directory's identity and its name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Identity {
    File(u64, u64),
    New(Box<Identity>, std::ffi::OsString),
    Unknown(PathBuf),
}

fn identity(path: &Path) -> Identity {
    if let Ok(m) = std::fs::metadata(path) {
        return Identity::File(m.dev(), m.ino());
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match (path.file_name(), std::fs::metadata(dir)) {
        (Some(name), Ok(m)) => Identity::New(
            Box::new(Identity::File(m.dev(), m.ino())),
            name.to_os_string(),
        ),
        _ => Identity::Unknown(path.to_path_buf()),
    }
}

/// Whether `a` and `b` reach one existing file (by device and inode, links
/// followed): an input that must not be another input, such as a runs
/// file's plan file naming the runs file.
pub fn same_file(a: &Path, b: &Path) -> bool {
    matches!(identity(a), Identity::File(..)) && identity(a) == identity(b)
}

/// Refuses an output (a flag and its path) that names the same file as an
/// input or as another output, before a command starts: it would overwrite
/// its own input, or one output the other. Paths are compared by the file
/// they reach (links followed; a file not yet made by its directory and
/// name). The message names both flags and the path.
pub fn check_distinct(inputs: &[(&str, &Path)], outputs: &[(&str, &Path)]) -> Result<(), String> {
    let outs: Vec<(&str, &Path, Identity)> = outputs
        .iter()
        .map(|&(flag, p)| (flag, p, identity(p)))
        .collect();
    for &(flag, p) in inputs {
        let id = identity(p);
        if let Some((out, o, _)) = outs.iter().find(|(_, _, i)| *i == id) {
            return Err(format!(
                "{out} {} is the same file as {flag} {}: writing it would overwrite the input; \
                 write it elsewhere",
                shown_path(o),
                shown_path(p)
            ));
        }
    }
    for (i, (a, pa, ia)) in outs.iter().enumerate() {
        if let Some((b, pb, _)) = outs[i + 1..].iter().find(|(_, _, ib)| ib == ia) {
            return Err(format!(
                "{a} {} and {b} {} name the same path: one would overwrite the other; give each \
                 its own",
                shown_path(pa),
                shown_path(pb)
            ));
        }
    }
    Ok(())
}

/// The most values (numbers, strings, arrays, objects, ...) a JSON file
/// parsed with [`parse_json_value`] may hold: a parsed value takes some
/// 100 bytes and more, so a file of nested empty objects under the 64 MiB
/// a file may have would otherwise take gigabytes before any check of what
/// it says. Plans, device lists and model configurations hold thousands.
pub const MAX_JSON_VALUES: usize = 1 << 20;

thread_local! {
    /// Values [`parse_json_value`] may still make on this thread.
    static JSON_BUDGET: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

/// Parses `text` as JSON into a value, refusing an object with two
/// members of one key (`{"copies": 64, "copies": 1}`), which
/// `serde_json::from_str::<Value>` would silently read as the last, and a
/// document of more than [`MAX_JSON_VALUES`] values. The error names the
/// key and, like `serde_json`'s own, the line and column.
pub fn parse_json_value(text: &str) -> Result<serde_json::Value, serde_json::Error> {
    use serde::Deserialize;
    let mut de = serde_json::Deserializer::from_str(text);
    let before = JSON_BUDGET.replace(MAX_JSON_VALUES);
    let v = Strict::deserialize(&mut de);
    JSON_BUDGET.set(before);
    let v = v?;
    de.end()?;
    Ok(v.0)
}

/// Takes one value from the thread's budget, or says it is spent.
fn spend<E: serde::de::Error>() -> Result<(), E> {
    let left = JSON_BUDGET.get();
    if left == 0 {
        return Err(E::custom(format!(
            "the document holds more than {MAX_JSON_VALUES} values, more than a plan, a device \
             list or a model configuration has"
        )));
    }
    JSON_BUDGET.set(left - 1);
    Ok(())
}

/// A JSON value deserialized with duplicate keys refused.
struct Strict(serde_json::Value);

impl<'de> serde::Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        spend::<D::Error>()?;
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, Into::into))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(out.into())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "the key \"{key}\" appears twice in one object"
                )));
            }
            let Strict(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(out.into())
    }
}

/// `text` with control and bidirectional-formatting characters written as
/// escapes: words from a file (a checkpoint's plan, a plan's device name),
/// printed, cannot drive the terminal or reorder the line around them.
pub fn printable(text: &str) -> String {
    let hidden = |c: char| {
        c.is_control()
            || ('\u{202a}'..='\u{202e}').contains(&c)
            || ('\u{2066}'..='\u{2069}').contains(&c)
    };
    text.chars()
        .flat_map(|c| -> Vec<char> {
            match hidden(c) {
                true => c.escape_unicode().collect(),
                false => vec![c],
            }
        })
        .collect()
}

/// The most characters of a path [`shown_path`] shows: the bound
/// `polychip_comm::text` puts on every other value a message quotes from
/// the user (an argument, a variable, a host).
pub const MAX_SHOWN: usize = 200;

/// `path` as a message shows it, as `polychip_comm::text::shown` shows a
/// value the user gave: control and bidirectional-formatting characters
/// escaped ([`printable`]), a byte that is not UTF-8 written `\xNN` (where
/// `Path::display` writes `�`, which names no byte), and a path of more
/// than [`MAX_SHOWN`] characters cut there, followed by `… (N bytes)`. Every
/// message of the command, the trainer and this crate that names a file
/// or a directory names it so.
pub fn shown_path(path: impl AsRef<Path>) -> String {
    use std::fmt::Write as _;
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_ref().as_os_str().as_bytes();
    let mut out = String::new();
    let mut left = MAX_SHOWN;
    'chunks: for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if left == 0 {
                break 'chunks;
            }
            out.push_str(&printable(c.encode_utf8(&mut [0; 4])));
            left -= 1;
        }
        for b in chunk.invalid() {
            if left == 0 {
                break 'chunks;
            }
            let _ = write!(out, "\\x{b:02x}");
            left -= 1;
        }
    }
    let whole: usize = bytes
        .utf8_chunks()
        .map(|c| c.valid().chars().count() + c.invalid().len())
        .sum();
    if whole > MAX_SHOWN {
        let _ = write!(out, "… ({} bytes)", bytes.len());
    }
    out
}

/// The longest line [`printable_lines`] prints whole.
pub const MAX_PRINTED_LINE: usize = 1000;

/// `text` for a terminal, line by line: each line [`printable`] (control
/// and bidirectional characters escaped) and cut after
/// [`MAX_PRINTED_LINE`] characters, saying how many were left out. For
/// messages and reports that quote a file (a parser's error shows the line
/// it stopped on, which may be megabytes long or drive the terminal) or
/// print names from one.
pub fn printable_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(1 << 20));
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let (kept, rest) = match line.char_indices().nth(MAX_PRINTED_LINE) {
            Some((at, _)) => (&line[..at], line[at..].chars().count()),
            None => (line, 0),
        };
        out.push_str(&printable(kept));
        if rest > 0 {
            out.push_str(&format!("... ({rest} more characters)"));
        }
    }
    out
}

/// A TOML parse or shape error of `text` as [`parse_error_at`] shows it
/// (line, column, a window of the line, a caret); the parser's own
/// message when it names no place.
pub fn toml_error(text: &str, e: &toml::de::Error) -> String {
    match e.span() {
        Some(span) => parse_error_at(text, span, e.message()),
        None => printable(e.message()),
    }
}

/// Characters of a long source line shown either side of a parse error.
const EXCERPT_SIDE: usize = 40;

/// A parser's error at byte range `span` of `text` for a person: "line L,
/// column C: MESSAGE", then the line (at most [`EXCERPT_SIDE`] characters
/// either side of the error, the cut ends marked `...`, escaped by
/// [`printable`]) and a caret under the error. Parsers such as `toml`
/// quote the whole line, which in a hostile file is megabytes long.
pub fn parse_error_at(text: &str, span: std::ops::Range<usize>, message: &str) -> String {
    let at = span.start.min(text.len());
    let at = (0..=at)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[at..].find('\n').map_or(text.len(), |i| at + i);
    let line_no = text[..line_start].matches('\n').count() + 1;
    let line = text[line_start..line_end].trim_end_matches('\r');
    let column = text[line_start..at].chars().count();
    let chars: Vec<char> = line.chars().collect();
    // The error may lie in the carriage returns trimmed off the line's end:
    // the window is of the line as shown.
    let shown_at = column.min(chars.len());
    let from = column.saturating_sub(EXCERPT_SIDE).min(shown_at);
    let to = (column + EXCERPT_SIDE).min(chars.len());
    let before: String = chars[from..shown_at].iter().collect();
    let after: String = chars[shown_at..to].iter().collect();
    let lead = if from > 0 { "..." } else { "" };
    let tail = if to < chars.len() { "..." } else { "" };
    let shown_before = format!("{lead}{}", printable(&before));
    let caret_at = shown_before.chars().count();
    format!(
        "line {line_no}, column {}: {}\n  | {shown_before}{}{tail}\n  | {}^",
        column + 1,
        printable(message.trim_end()),
        printable(&after),
        " ".repeat(caret_at)
    )
}

/// Makes the child `cmd` starts receive `signal` when the thread that
/// started it ends with its process (Linux's `PR_SET_PDEATHSIG`; elsewhere
/// nothing): a helper process (a conformance worker, a plugin-load probe,
/// a launched rank) does not run on as an orphan when its parent is killed
/// (`polychip conform` ended by SIGTERM left its worker running the suite,
/// a hung case for ever, until 2026-12-06).
pub fn die_with_parent(cmd: &mut std::process::Command, signal: i32) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let die = move || {
            // SAFETY: prctl with PR_SET_PDEATHSIG takes an integer signal
            // number and no pointers.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, signal) };
            Ok(())
        };
        // SAFETY: the closure runs in the child between fork and exec and
        // only calls prctl, which is async-signal-safe; it touches no
        // memory shared with the parent.
        unsafe { cmd.pre_exec(die) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (cmd, signal);
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_error_among_a_lines_trailing_carriage_returns_is_shown() {
        // The line as shown drops its trailing `\r`s; an error 50 of them
        // in sliced the window past the line's end.
        let text = format!("dim = 1{}\nx", "\r".repeat(60));
        let at = 7 + 50;
        let out = super::parse_error_at(&text, at..at + 1, "bad");
        assert!(out.starts_with("line 1, column 58: bad\n"), "{out}");
        let out = super::parse_error_at(&text, text.len()..text.len(), "end");
        assert!(out.starts_with("line 2, column 2: end"), "{out}");
    }

    #[test]
    fn parse_errors_show_a_window_of_a_long_line() {
        use super::parse_error_at;
        let text = format!("name = \"x\"\ndim = {}z\n", "1".repeat(100_000));
        let at = text.find('z').unwrap();
        let out = parse_error_at(&text, at..at + 1, "invalid number\n");
        assert!(out.len() < 200, "{out}");
        assert!(
            out.starts_with("line 2, column 100007: invalid number\n"),
            "{out}"
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[1], format!("  | ...{}z", "1".repeat(40)));
        assert_eq!(lines[2].find('^'), Some(4 + 3 + 40));
        // Short lines whole; the start of a file; an escape sequence escaped.
        let out = parse_error_at("a = \u{1b}[2J", 4..5, "bad");
        assert_eq!(out, "line 1, column 5: bad\n  | a = \\u{1b}[2J\n  |     ^");
        assert_eq!(
            parse_error_at("", 0..0, "empty"),
            "line 1, column 1: empty\n  | \n  | ^"
        );
    }

    #[test]
    fn messages_keep_their_lines_but_not_control_characters_or_megabytes() {
        use super::printable_lines;
        assert_eq!(
            printable_lines("a\u{1b}]0;x\u{7}\nb"),
            "a\\u{1b}]0;x\\u{7}\nb"
        );
        let long = format!("{}\nend", "x".repeat(5_000_000));
        let out = printable_lines(&long);
        assert!(
            out.len() < 1100 && out.ends_with("(4999000 more characters)\nend"),
            "{}",
            &out[990..]
        );
    }

    #[test]
    fn paths_are_shown_escaped_byte_by_byte_and_cut() {
        use super::{MAX_SHOWN, shown_path};
        use std::os::unix::ffi::OsStrExt;
        assert_eq!(shown_path("/tmp/évité 日本.json"), "/tmp/évité 日本.json");
        assert_eq!(
            shown_path("/tmp/a\u{1b}[2Jb\u{202e}c\nd"),
            "/tmp/a\\u{1b}[2Jb\\u{202e}c\\u{a}d"
        );
        let odd = std::path::Path::new(std::ffi::OsStr::from_bytes(b"/tmp/x\xff\xfey.toml"));
        assert_eq!(shown_path(odd), "/tmp/x\\xff\\xfey.toml");
        let long = format!("/tmp/{}", "d/".repeat(2000));
        assert_eq!(
            shown_path(&long),
            format!("{}… (4005 bytes)", &long[..MAX_SHOWN])
        );
        assert_eq!(shown_path(&long[..MAX_SHOWN]), long[..MAX_SHOWN]);
        // Cut by characters, a byte that is not UTF-8 counting as one.
        let wide = "日".repeat(MAX_SHOWN + 1);
        assert_eq!(
            shown_path(&wide),
            format!("{}… ({} bytes)", "日".repeat(MAX_SHOWN), wide.len())
        );
        let bytes = [b'\xff'; MAX_SHOWN + 1];
        let shown = shown_path(std::path::Path::new(std::ffi::OsStr::from_bytes(&bytes)));
        assert_eq!(shown, format!("{}… (201 bytes)", "\\xff".repeat(MAX_SHOWN)));
    }

    #[test]
    fn words_from_a_file_are_printed_without_control_or_bidi_characters() {
        use super::printable;
        assert_eq!(printable("1 x [ferrite:0 0..2]"), "1 x [ferrite:0 0..2]");
        assert_eq!(
            printable("a\u{1b}[2Jb\u{202e}c\nd"),
            "a\\u{1b}[2Jb\\u{202e}c\\u{a}d"
        );
        assert_eq!(printable("évité 日本"), "évité 日本");
    }

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("polychip-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn only_regular_files_within_the_bound_are_read() {
        let dir = scratch("read");
        let file = dir.join("a.toml");
        std::fs::write(&file, "x = 1\n").unwrap();
        assert_eq!(read_text_file(&file, 6).unwrap(), "x = 1\n");
        let err = read_text_file(&file, 5).unwrap_err().to_string();
        assert!(err.contains("6 bytes long, more than the 5 bytes"), "{err}");
        let err = read_text_file(&dir, 100).unwrap_err().to_string();
        assert!(err.contains("a directory"), "{err}");
        // Refused without reading (a read would never end).
        let err = read_text_file(Path::new("/dev/zero"), 100)
            .unwrap_err()
            .to_string();
        assert!(err.contains("a character device"), "{err}");
        // Refused without opening (an open would block for a writer).
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let err = read_text_file(&fifo, 100).unwrap_err().to_string();
            assert!(err.contains("a FIFO"), "{err}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_byte_order_mark_is_not_part_of_the_text() {
        let dir = scratch("bom");
        let file = dir.join("a.json");
        std::fs::write(&file, "\u{feff}{\"x\": 1}").unwrap();
        let text = read_text_file(&file, 100).unwrap();
        assert_eq!(text, "{\"x\": 1}");
        assert_eq!(parse_json_value(&text).unwrap()["x"], 1);
        // Only a leading one.
        std::fs::write(&file, "x = \"\u{feff}\"").unwrap();
        assert_eq!(read_text_file(&file, 100).unwrap(), "x = \"\u{feff}\"");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_atomic_write_leaves_the_old_file_and_no_temporary_one_when_it_fails() {
        let dir = scratch("write");
        let file = dir.join("out.json");
        write_atomic(&file, b"one").unwrap();
        write_atomic(&file, b"two").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"two");
        // A directory at the target: refused before anything is written,
        // the directory stays, no temporary file is made (a write that
        // fails midway, on a full disk, is cli/tests/outputs.rs's).
        let blocked = dir.join("blocked");
        std::fs::create_dir(&blocked).unwrap();
        std::fs::write(blocked.join("inside"), "x").unwrap();
        assert!(write_atomic(&blocked, b"three").is_err());
        assert!(blocked.is_dir());
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left.len(), 2, "{left:?}");
        // A device or a directory is never replaced.
        let err = write_atomic(Path::new("/dev/null"), b"x").unwrap_err();
        assert!(err.to_string().contains("a character device"), "{err}");
        assert!(
            Path::new("/dev/null")
                .metadata()
                .unwrap()
                .file_type()
                .is_char_device()
        );
        assert!(write_atomic(Path::new("/"), b"x").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn json_with_a_key_twice_in_one_object_is_refused() {
        let v = parse_json_value(r#"{"a": [1, 2.5, {"b": null}], "c": "d", "e": true}"#).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"a": [1, 2.5, {"b": null}], "c": "d", "e": true})
        );
        let err = parse_json_value("{\"plan\": {\"copies\": 64,\n \"copies\": 1}}")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"copies\" appears twice") && err.contains("line 2"),
            "{err}"
        );
        // The same key in two objects is fine; trailing text is not.
        assert!(parse_json_value(r#"[{"a": 1}, {"a": 2}]"#).is_ok());
        assert!(parse_json_value(r#"{"a": 1} x"#).is_err());
        // Large integers keep their type.
        assert_eq!(parse_json_value("18446744073709551615").unwrap(), u64::MAX);
    }

    #[test]
    fn json_of_more_values_than_any_plan_holds_is_refused_before_it_is_built() {
        // Nested empty objects: 2^20 + 1 values in 21 MB of text.
        let many = format!(
            "[{}{{}}]",
            "{\"a\":{},\"b\":{}},".repeat(MAX_JSON_VALUES / 3)
        );
        let err = parse_json_value(&many).unwrap_err().to_string();
        assert!(err.contains("more than 1048576 values"), "{err}");
        // Just under the bound parses, and the budget is per document.
        let fewer = format!("[{}]", vec!["1"; MAX_JSON_VALUES - 1].join(","));
        assert!(parse_json_value(&fewer).is_ok());
        assert!(parse_json_value(&fewer).is_ok());
    }

    #[test]
    fn outputs_that_are_inputs_or_each_other_are_refused() {
        let dir = scratch("distinct");
        let corpus = dir.join("corpus.txt");
        std::fs::write(&corpus, "text").unwrap();
        let link = dir.join("link.txt");
        std::os::unix::fs::symlink(&corpus, &link).unwrap();
        let log = dir.join("log.json");
        let ok = check_distinct(&[("--corpus", &corpus)], &[("--log-json", &log)]);
        assert_eq!(ok, Ok(()));
        let err = check_distinct(&[("--corpus", &corpus)], &[("--log-json", &link)]).unwrap_err();
        assert!(
            err.contains("--log-json") && err.contains("same file as --corpus"),
            "{err}"
        );
        // Two outputs not yet made, one named through "./".
        let again = dir.join(".").join("log.json");
        let err = check_distinct(&[], &[("--trace", &log), ("--log-json", &again)]).unwrap_err();
        assert!(err.contains("name the same path"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

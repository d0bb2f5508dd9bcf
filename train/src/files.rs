//! Reading files that came from elsewhere (checkpoints, Hugging Face
//! directories) without trusting them, by [`polychip_files`]'s rules (only
//! regular files, opened without blocking, read no further than a bound),
//! its refusals turned into checkpoint errors that name the file.
//!
//! And the seal polychip puts on the files it writes: a CRC-64 of every byte
//! of the file, recorded inside the file itself as 16 hex digits after a
//! fixed key; the digits count as `0` while the CRC is computed.

use std::fs::File;
use std::io::ErrorKind;
use std::path::Path;

use crate::error::{Result, TrainError};
use crate::safetensors::crc64_update;

pub use polychip_files::Links;

/// A refusal of `path` by [`polychip_files::open_regular`] as a checkpoint
/// error: a link where `links` refuses one named as such, the crate's own
/// refusals (not a regular file, too long) with their words, anything else
/// as the I/O error it is.
fn refusal(path: &Path, links: Links, e: std::io::Error) -> TrainError {
    let message = match e.raw_os_error() {
        Some(libc::ELOOP) if links == Links::Refuse => {
            "is a symbolic link; a checkpoint's files must be inside its directory, not \
             links to elsewhere"
                .to_string()
        }
        None if matches!(e.kind(), ErrorKind::InvalidInput | ErrorKind::InvalidData) => {
            e.to_string()
        }
        _ => return TrainError::io(path, e),
    };
    TrainError::Checkpoint {
        path: path.to_path_buf(),
        message,
    }
}

/// Opens `path` for reading if it is a regular file of at most `max_len`
/// bytes ([`polychip_files::open_regular`]); returns it and its length.
/// Nothing is read.
pub fn open_regular(path: &Path, links: Links, max_len: u64) -> Result<(File, u64)> {
    polychip_files::open_regular(path, links, max_len).map_err(|e| refusal(path, links, e))
}

/// Reads all of `path` ([`polychip_files::read_regular`]), at most
/// `max_len` bytes.
pub fn read_regular(path: &Path, links: Links, max_len: u64) -> Result<Vec<u8>> {
    polychip_files::read_regular(path, links, max_len).map_err(|e| refusal(path, links, e))
}

/// The 16 hex digits of a seal: where they are in `bytes` and their value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seal {
    /// Offset of the first digit.
    pub at: usize,
    /// The CRC they record.
    pub recorded: u64,
}

/// Digits a seal has.
pub const SEAL_DIGITS: usize = 16;

/// Finds the seal after `prefix` (e.g. `"polychip.file_crc64":"`) in
/// `bytes`: `Ok(None)` when there is none, an error when there are several
/// or its digits are not 16 lowercase hex digits followed by `"`.
pub fn find_seal(bytes: &[u8], prefix: &[u8]) -> std::result::Result<Option<Seal>, String> {
    let mut found = None;
    let mut from = 0;
    while let Some(i) = find(&bytes[from..], prefix) {
        let at = from + i + prefix.len();
        if found.is_some() {
            return Err(format!(
                "records its checksum {} more than once",
                String::from_utf8_lossy(prefix).trim_matches([':', ' ', '"'])
            ));
        }
        found = Some(at);
        from = at;
    }
    let Some(at) = found else {
        return Ok(None);
    };
    let digits = bytes.get(at..at + SEAL_DIGITS);
    let closed = bytes.get(at + SEAL_DIGITS) == Some(&b'"');
    let recorded = digits
        .filter(|d| closed && d.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')))
        .and_then(|d| u64::from_str_radix(std::str::from_utf8(d).ok()?, 16).ok())
        .ok_or_else(|| "has a checksum that is not 16 lowercase hex digits".to_string())?;
    Ok(Some(Seal { at, recorded }))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Continues a CRC-64 state over `bytes`, the seal's digits (at `seal_at`
/// of the whole, `bytes` starting at `offset`) counted as `0`.
pub fn crc_skipping(state: u64, bytes: &[u8], offset: usize, seal_at: usize) -> u64 {
    let end = offset + bytes.len();
    if seal_at + SEAL_DIGITS <= offset || seal_at >= end {
        return crc64_update(state, bytes);
    }
    let a = seal_at.saturating_sub(offset);
    let b = (seal_at + SEAL_DIGITS - offset).min(bytes.len());
    let mut s = crc64_update(state, &bytes[..a]);
    let zeros = [b'0'; SEAL_DIGITS];
    s = crc64_update(s, &zeros[..b - a]);
    crc64_update(s, &bytes[b..])
}

/// Writes the seal into `bytes`, whose digits after `prefix` are zeros.
///
/// # Panics
///
/// If `bytes` has no single zero seal after `prefix` (a bug of the writer).
pub fn seal(bytes: &mut [u8], prefix: &[u8]) -> u64 {
    let s = find_seal(bytes, prefix)
        .ok()
        .flatten()
        .expect("the writer put one zero seal");
    let crc = !crc_skipping(!0, bytes, 0, s.at);
    bytes[s.at..s.at + SEAL_DIGITS].copy_from_slice(format!("{crc:016x}").as_bytes());
    crc
}

/// Checks the seal of `bytes` (all of a file): an error saying what is
/// wrong when it is missing or differs.
pub fn check_seal(bytes: &[u8], prefix: &[u8]) -> std::result::Result<u64, String> {
    let Some(s) = find_seal(bytes, prefix)? else {
        return Err(missing_seal(bytes, prefix));
    };
    let actual = !crc_skipping(!0, bytes, 0, s.at);
    seal_matches(actual, s.recorded)?;
    Ok(s.recorded)
}

/// The message for a file without its seal in `bytes` (those searched):
/// none at all, or one written in another form than polychip writes it (a
/// tool that re-serialised the JSON with other spacing), so that it cannot
/// be found and checked.
pub fn missing_seal(bytes: &[u8], prefix: &[u8]) -> String {
    let written = String::from_utf8_lossy(prefix);
    let key = written.trim_matches([':', ' ', '"']);
    let quoted = format!("\"{key}\"");
    // The key, as a key (followed by a colon, after any spacing), not a
    // value that happens to be the same word.
    let as_key = (0..bytes.len()).any(|i| {
        bytes[i..].starts_with(quoted.as_bytes())
            && bytes[i + quoted.len()..]
                .iter()
                .find(|c| !c.is_ascii_whitespace())
                == Some(&b':')
    });
    if as_key {
        format!(
            "records its checksum ({quoted}) in another form than polychip writes it \
             (`{written}` followed by 16 lowercase hex digits and `\"`): it was rewritten by \
             another tool, and its bytes cannot be checked against it"
        )
    } else {
        format!(
            "does not record its checksum (it has no {quoted}), which every file polychip \
             writes does; it was not written by polychip, or was edited"
        )
    }
}

/// The message when the recomputed CRC differs.
pub fn seal_matches(actual: u64, recorded: u64) -> std::result::Result<(), String> {
    if actual != recorded {
        return Err(format!(
            "is corrupt: the checksum {actual:016x} of its bytes differs from the \
             {recorded:016x} recorded in it"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::missing_seal;

    #[test]
    fn a_seal_written_otherwise_is_told_from_none_and_from_a_value() {
        let prefix = b"\"checksum\": \"";
        let other = missing_seal(b"{\"checksum\" :\n \"00\"}", prefix);
        assert!(other.contains("in another form"), "{other}");
        for none in [&b"{\"step\": 1}"[..], b"{\"name\": \"checksum\", \"x\": 1}"] {
            let m = missing_seal(none, prefix);
            assert!(m.contains("does not record its checksum"), "{m}");
        }
    }
}

//! The files a command writes: each checked before the command starts
//! (writable, not a directory, FIFO or device, not one of the command's
//! inputs nor another of its outputs), then written whole or not at all
//! ([`polychip_files::write_atomic`]: a full disk leaves neither a
//! half-written file nor a temporary one).

use std::path::{Path, PathBuf};

/// `message`, from a crate that writes the path whole (as `Path::display`
/// does: the planner's loaders, the conformance suite's waivers), with its
/// first occurrence of `path` written as every other message of the
/// command writes a path ([`polychip_files::shown_path`]: escaped, cut
/// after 200 characters).
pub(crate) fn reshown(message: &str, path: &Path) -> String {
    let raw = path.display().to_string();
    message.replacen(&raw, &polychip_files::shown_path(path), 1)
}

/// Writes `bytes` to the output of `flag` at `path` whole or not at all.
pub(crate) fn write(flag: &str, path: &Path, bytes: &[u8]) -> Result<(), String> {
    polychip_files::write_atomic(path, bytes).map_err(|e| {
        format!(
            "{flag} {}: could not write it: {e}",
            polychip_files::shown_path(path)
        )
    })
}

/// The file an argument that is either a preset's name or a file names,
/// when it is a file.
pub(crate) fn file_arg(arg: &str) -> Option<&Path> {
    let p = Path::new(arg);
    p.exists().then_some(p)
}

/// Refuses an output that is one of the inputs or another output
/// ([`polychip_files::check_distinct`]); `None` entries are left out.
pub(crate) fn check_distinct(
    inputs: &[(&str, Option<&Path>)],
    outputs: &[(&str, Option<&Path>)],
) -> Result<(), String> {
    fn given<'a>(v: &[(&'a str, Option<&'a Path>)]) -> Vec<(&'a str, &'a Path)> {
        v.iter().filter_map(|&(f, p)| Some((f, p?))).collect()
    }
    polychip_files::check_distinct(&given(inputs), &given(outputs))
}

/// Checks that `path` can be written as the output file of `flag` without
/// changing it: an existing regular file is opened for writing (not
/// truncated), and the temporary file the write goes through is created
/// beside it and removed again ([`polychip_files::check_atomic_write`]); a
/// new one is created and removed again. A directory, a FIFO or a device
/// is refused (writing to a FIFO blocks).
pub(crate) fn check_file(flag: &str, path: &Path) -> Result<(), String> {
    let fail = |m: String| Err(format!("{flag} {}: {m}", polychip_files::shown_path(path)));
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => fail("is a directory; give a file name".into()),
        Ok(meta) if !meta.is_file() => fail("is not a regular file".into()),
        Ok(_) => match std::fs::OpenOptions::new().write(true).open(path) {
            Ok(_) => polychip_files::check_atomic_write(path)
                .or_else(|e| fail(format!("cannot be replaced: {e}"))),
            Err(e) => fail(format!("cannot be written: {e}")),
        },
        Err(e) if is_missing(&e) => {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
            {
                Ok(_) => std::fs::remove_file(path)
                    .or_else(|e| fail(format!("cannot remove the probe file: {e}"))),
                // Created meanwhile by someone else: it exists, which is fine.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                Err(e) => fail(format!("cannot be created: {e}")),
            }
        }
        Err(e) => fail(format!("cannot be reached: {e}")),
    }
}

/// Whether a path lookup failed because the path, or a directory on it,
/// does not exist.
fn is_missing(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
    )
}

/// Checks that `dir` is, or can be made, a writable directory for `flag`:
/// its nearest existing ancestor (itself when it exists) must be a
/// directory in which a file can be created; the probe file is removed and
/// nothing is created in its place.
pub(crate) fn check_dir(flag: &str, dir: &Path) -> Result<(), String> {
    let fail = |m: String| Err(format!("{flag} {}: {m}", polychip_files::shown_path(dir)));
    let mut existing = dir.to_path_buf();
    loop {
        match std::fs::metadata(&existing) {
            Ok(meta) if meta.is_dir() => break,
            Ok(_) if existing == dir => return fail("exists and is not a directory".into()),
            Ok(_) => {
                return fail(format!(
                    "{} is not a directory, so it cannot be created",
                    polychip_files::shown_path(&existing)
                ));
            }
            Err(e) if is_missing(&e) => {}
            Err(e) => {
                return fail(format!(
                    "{} cannot be reached: {e}",
                    polychip_files::shown_path(&existing)
                ));
            }
        }
        match existing.parent() {
            Some(p) if !p.as_os_str().is_empty() => existing = p.to_path_buf(),
            _ => {
                existing = PathBuf::from(".");
                if std::fs::metadata(&existing).is_ok_and(|m| m.is_dir()) {
                    break;
                }
                return fail("the current directory cannot be reached".into());
            }
        }
    }
    let probe = existing.join(format!(
        ".polychip-write-probe-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => std::fs::remove_file(&probe).or_else(|e| {
            fail(format!(
                "cannot remove the probe file {}: {e}",
                polychip_files::shown_path(&probe)
            ))
        }),
        Err(e) if existing == dir => fail(format!("is not writable: {e}")),
        Err(e) => fail(format!(
            "cannot be created: its parent {} is not writable: {e}",
            polychip_files::shown_path(&existing)
        )),
    }
}

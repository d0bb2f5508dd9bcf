//! Where plugins are found: `POLYCHIP_PLUGIN_PATH`, then the bundled
//! plugins next to the running program.
//!
//! `POLYCHIP_PLUGIN_PATH` is a `:`-separated list of files and directories. A
//! file is loaded whatever its name; a directory contributes every file in it
//! whose name ends in `.so`, in name order. Bundled plugins are the files
//! named `libpolychip_vendor_*.so` in the running program's directory or its
//! parent (cargo puts test binaries in `deps/` below the profile directory),
//! or in `lib/polychip` beside that parent (an installed prefix); set
//! `POLYCHIP_NO_BUNDLED_PLUGINS=1` to skip them. A listed file hides a
//! bundled one of the same file name, and a listed plugin a bundled one
//! of the same vendor (two plugins of one vendor would give their devices
//! the same ids; anywhere else the second is refused).
//!
//! A plugin must resolve (through symlinks) to a regular file: a FIFO, a
//! directory or a device named as a plugin is refused before it is opened.
//! One file reached under two names (a symlink, a hard link, listed twice)
//! is loaded once: files are told apart by the device and inode they
//! resolve to. A plugin file, or a directory it is found in, that a user
//! other than root and the current one could change gets a warning in the
//! log (see `docs/security.md`).

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The environment variable naming plugin files and directories.
pub const PLUGIN_PATH_VAR: &str = "POLYCHIP_PLUGIN_PATH";
/// The environment variable that, set to `1`, skips the bundled plugins.
pub const NO_BUNDLED_VAR: &str = "POLYCHIP_NO_BUNDLED_PLUGINS";
/// The file-name prefix of bundled plugins.
pub const BUNDLED_PREFIX: &str = "libpolychip_vendor_";

/// A path listed in `POLYCHIP_PLUGIN_PATH` that could not be searched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchProblem {
    /// The path.
    pub path: PathBuf,
    /// Why it was skipped.
    pub reason: String,
}

/// The identity of the file a plugin path resolves to: its device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    /// The device the file lives on.
    pub dev: u64,
    /// Its inode on that device.
    pub ino: u64,
}

/// The identity of the regular file `path` resolves to, or why it cannot be
/// a plugin (it does not exist, or is a FIFO, a directory, a device). Never
/// opens the file, so a FIFO cannot block it.
pub fn plugin_file_id(path: &Path) -> Result<FileId, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read it: {e}"))?;
    if !meta.file_type().is_file() {
        return Err(format!(
            "it is {}, not a regular file",
            polychip_files::kind(meta.file_type())
        ));
    }
    Ok(FileId {
        dev: meta.dev(),
        ino: meta.ino(),
    })
}

fn current_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Why users other than root and the current one could change what `meta`
/// describes (`what` names it), if they could: it is world-writable, or
/// another user owns it. A world-writable directory with the sticky bit
/// (like `/tmp`) only counts when `sticky_counts` (a directory searched for
/// plugins, where anyone could add one).
fn writable_by_others(what: &str, meta: &std::fs::Metadata, sticky_counts: bool) -> Option<String> {
    let mode = meta.mode();
    let sticky = mode & 0o1000 != 0;
    if mode & 0o002 != 0 && (sticky_counts || !sticky) {
        return Some(format!(
            "{what} is world-writable (mode {:04o})",
            mode & 0o7777
        ));
    }
    let owner = meta.uid();
    if owner != 0 && owner != current_uid() {
        return Some(format!("{what} is owned by another user (uid {owner})"));
    }
    None
}

/// Logs a warning when a user other than root and the current one could
/// replace the plugin at `path` or the directory it resolves into.
pub fn warn_if_writable_by_others(path: &Path) {
    let resolved = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mut reasons = Vec::new();
    if let Ok(meta) = std::fs::metadata(&resolved) {
        reasons.extend(writable_by_others("the file", &meta, false));
    }
    if let Some(dir) = resolved.parent()
        && let Ok(meta) = std::fs::metadata(dir)
    {
        reasons.extend(writable_by_others(
            &format!("its directory {}", polychip_files::shown_path(dir)),
            &meta,
            false,
        ));
    }
    if !reasons.is_empty() {
        log::warn!(
            "{}: {}: another user could replace this plugin's code, which runs inside polychip",
            polychip_files::shown_path(path),
            reasons.join(" and ")
        );
    }
}

fn warn_if_dir_writable_by_others(dir: &Path, source: &str) {
    if let Ok(meta) = std::fs::metadata(dir)
        && let Some(reason) = writable_by_others("it", &meta, true)
    {
        log::warn!(
            "{}: plugin directory listed in {source}: {reason}: another user could add a plugin, which would run inside polychip",
            polychip_files::shown_path(dir)
        );
    }
}

/// The `*.so` files in `dir` whose names start with `prefix`, in name
/// order, and the entries so named that are not regular files.
fn shared_libraries_in(
    dir: &Path,
    prefix: &str,
) -> std::io::Result<(Vec<PathBuf>, Vec<SearchProblem>)> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".so"))
        })
        .collect();
    found.sort();
    let mut problems = Vec::new();
    found.retain(|p| match plugin_file_id(p) {
        Ok(_) => true,
        Err(reason) => {
            problems.push(SearchProblem {
                path: p.clone(),
                reason: format!("skipped: {reason}"),
            });
            false
        }
    });
    Ok((found, problems))
}

/// The plugin files named by a `POLYCHIP_PLUGIN_PATH`-style list; its
/// problems name where the list came from (`source`: the variable, or a
/// caller's option).
pub fn from_path_list(list: &str, source: &str) -> (Vec<PathBuf>, Vec<SearchProblem>) {
    let mut files = Vec::new();
    let mut problems = Vec::new();
    for entry in list.split(':').filter(|e| !e.is_empty()) {
        let path = PathBuf::from(entry);
        if path.is_dir() {
            warn_if_dir_writable_by_others(&path, source);
            match shared_libraries_in(&path, "") {
                Ok((found, skipped)) => {
                    files.extend(found);
                    problems.extend(skipped);
                }
                Err(e) => problems.push(SearchProblem {
                    path,
                    reason: format!("cannot read the directory: {e}"),
                }),
            }
        } else if path.exists() || path.symlink_metadata().is_ok() {
            // A link that leads nowhere (dangling, or a loop) is named as
            // what it is, not as missing.
            match plugin_file_id(&path) {
                Ok(_) => files.push(path),
                Err(reason) => problems.push(SearchProblem {
                    path,
                    reason: format!("listed in {source} but {reason}"),
                }),
            }
        } else {
            problems.push(SearchProblem {
                path,
                reason: format!("listed in {source} but does not exist"),
            });
        }
    }
    (files, problems)
}

/// The directories bundled plugins are looked for in: the running
/// program's, its parent (cargo puts test binaries in `deps/`), and the
/// parent's `lib/polychip` (an installed `PREFIX/bin/polychip` finds
/// `PREFIX/lib/polychip`; see `scripts/install`).
pub fn program_dirs() -> Vec<PathBuf> {
    let Ok(exe) = std::env::current_exe() else {
        return Vec::new();
    };
    let mut dirs = Vec::new();
    if let Some(dir) = exe.parent() {
        dirs.push(dir.to_path_buf());
        if let Some(parent) = dir.parent() {
            dirs.push(parent.to_path_buf());
            dirs.push(parent.join("lib").join("polychip"));
        }
    }
    dirs
}

/// The bundled plugins (`libpolychip_vendor_*.so`) in `dirs`; of two files
/// with one name, the first directory's.
pub fn bundled_in(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut seen_names = HashSet::new();
    let mut files = Vec::new();
    for dir in dirs {
        let found = shared_libraries_in(dir, BUNDLED_PREFIX).map_or_else(|_| Vec::new(), |f| f.0);
        for file in found {
            if seen_names.insert(file.file_name().map(|n| n.to_owned())) {
                files.push(file);
            }
        }
    }
    files
}

/// Whether `path` is a bundled plugin of `dirs` (a
/// `libpolychip_vendor_*.so` in one of them).
pub fn is_bundled_in(path: &Path, dirs: &[PathBuf]) -> bool {
    let named = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with(BUNDLED_PREFIX));
    named && path.parent().is_some_and(|p| dirs.iter().any(|d| d == p))
}

/// The bundled plugins next to the running program.
pub fn bundled() -> Vec<PathBuf> {
    bundled_in(&program_dirs())
}

/// Every plugin file that a `POLYCHIP_PLUGIN_PATH`-style `list` names, then
/// the bundled ones in `bundled_dirs`, without duplicates: a listed file
/// hides a bundled one of the same name, and of several names of one file
/// (symlinks, hard links, one path listed twice) only the first is kept.
/// `source` names where `list` came from, for its problems.
pub fn discover_from(
    list: &str,
    source: &str,
    bundled_dirs: &[PathBuf],
) -> (Vec<PathBuf>, Vec<SearchProblem>) {
    let (mut files, problems) = from_path_list(list, source);
    let listed_names: HashSet<_> = files
        .iter()
        .filter_map(|f| f.file_name().map(|n| n.to_owned()))
        .collect();
    files.extend(
        bundled_in(bundled_dirs)
            .into_iter()
            .filter(|f| !f.file_name().is_some_and(|n| listed_names.contains(n))),
    );
    let mut seen = HashSet::new();
    files.retain(|f| match plugin_file_id(f) {
        Ok(id) => seen.insert(Ok(id)),
        Err(_) => seen.insert(Err(f.canonicalize().unwrap_or_else(|_| f.clone()))),
    });
    (files, problems)
}

/// Whether [`NO_BUNDLED_VAR`] turns the bundled plugins off: any value but
/// empty and `0` does (`true`, `yes`, one that is not UTF-8), so that a
/// value meant to keep them out never lets them in (only `1` did until
/// 2026-12-06: `=true` loaded them without a word).
pub fn bundled_disabled() -> bool {
    std::env::var_os(NO_BUNDLED_VAR).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Every plugin file to load, from the environment, without duplicates.
pub fn discover() -> (Vec<PathBuf>, Vec<SearchProblem>) {
    let dirs = if bundled_disabled() {
        Vec::new()
    } else {
        program_dirs()
    };
    // A list that is not UTF-8 is said, not skipped as if unset (its
    // directories were not searched, without a word, until 2026-12-06).
    let list = std::env::var_os(PLUGIN_PATH_VAR).unwrap_or_default();
    let Some(text) = list.to_str() else {
        let (files, mut problems) = discover_from("", PLUGIN_PATH_VAR, &dirs);
        problems.insert(
            0,
            SearchProblem {
                path: PathBuf::from(&list),
                reason: format!(
                    "{PLUGIN_PATH_VAR} is not UTF-8 text, so none of its directories was \
                     searched; name them by paths that are"
                ),
            },
        );
        return (files, problems);
    };
    discover_from(text, PLUGIN_PATH_VAR, &dirs)
}

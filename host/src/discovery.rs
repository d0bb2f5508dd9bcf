//! Where plugins are found: `POLYCHIP_PLUGIN_PATH`, then the bundled
//! plugins next to the running program.
//!
//! `POLYCHIP_PLUGIN_PATH` is a `:`-separated list of files and directories. A
//! file is loaded whatever its name; a directory contributes every file in it
//! whose name ends in `.so`, in name order. Bundled plugins are the files
//! named `libpolychip_vendor_*.so` in the running program's directory or its
//! parent (cargo puts test binaries in `deps/` below the profile directory),
//! or in `lib/polychip` beside that parent (an installed prefix); set
//! `POLYCHIP_NO_BUNDLED_PLUGINS=1` to skip them.

use std::collections::HashSet;
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

fn shared_libraries_in(dir: &Path, prefix: &str) -> std::io::Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".so"))
        })
        .collect();
    found.sort();
    Ok(found)
}

/// The plugin files named by a `POLYCHIP_PLUGIN_PATH`-style list.
pub fn from_path_list(list: &str) -> (Vec<PathBuf>, Vec<SearchProblem>) {
    let mut files = Vec::new();
    let mut problems = Vec::new();
    for entry in list.split(':').filter(|e| !e.is_empty()) {
        let path = PathBuf::from(entry);
        if path.is_dir() {
            match shared_libraries_in(&path, "") {
                Ok(found) => files.extend(found),
                Err(e) => problems.push(SearchProblem {
                    path,
                    reason: format!("cannot read the directory: {e}"),
                }),
            }
        } else if path.exists() {
            files.push(path);
        } else {
            problems.push(SearchProblem {
                path,
                reason: format!("listed in {PLUGIN_PATH_VAR} but does not exist"),
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
        for file in shared_libraries_in(dir, BUNDLED_PREFIX).unwrap_or_default() {
            if seen_names.insert(file.file_name().map(|n| n.to_owned())) {
                files.push(file);
            }
        }
    }
    files
}

/// The bundled plugins next to the running program.
pub fn bundled() -> Vec<PathBuf> {
    bundled_in(&program_dirs())
}

/// Every plugin file that a `POLYCHIP_PLUGIN_PATH`-style `list` names, then
/// the bundled ones in `bundled_dirs`, without duplicates: a listed file
/// hides a bundled one of the same name.
pub fn discover_from(list: &str, bundled_dirs: &[PathBuf]) -> (Vec<PathBuf>, Vec<SearchProblem>) {
    let (mut files, problems) = from_path_list(list);
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
    files.retain(|f| seen.insert(f.canonicalize().unwrap_or_else(|_| f.clone())));
    (files, problems)
}

/// Every plugin file to load, from the environment, without duplicates.
pub fn discover() -> (Vec<PathBuf>, Vec<SearchProblem>) {
    let dirs = if std::env::var(NO_BUNDLED_VAR).as_deref() == Ok("1") {
        Vec::new()
    } else {
        program_dirs()
    };
    discover_from(&std::env::var(PLUGIN_PATH_VAR).unwrap_or_default(), &dirs)
}

//! The polychip operator spec, `spec/ops.toml`, and the generator that
//! derives from it everything mechanical about an operator: the ABI's args
//! structs and op table (and through cbindgen the C header), the SDK's
//! checked arguments, `Operators` trait and export shims, the host's call
//! methods, the `op_args` fuzz target's dispatch, and the operator tables
//! of `docs/abi.md`.
//!
//! Why a generator whose output is committed (rather than macros or a build
//! script): cbindgen must see the ABI types as plain Rust source; readers,
//! reviewers and rust-analyzer see the exact code that runs; a clean build
//! does not pay for generation; and the C API and Python bindings to come
//! derive from the same spec by adding an emitter. `cargo test -p
//! polychip-spec` fails when a derived file is stale.

#![forbid(unsafe_code)]

pub mod emit;
pub mod model;

use std::path::{Path, PathBuf};

/// The workspace root (the folder holding `spec/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("spec/ sits in the workspace")
        .to_path_buf()
}

/// Every derived file under `root` with the contents the spec gives it.
pub fn generate(root: &Path) -> Result<Vec<(PathBuf, String)>, String> {
    let spec_path = root.join("spec/ops.toml");
    let text = std::fs::read_to_string(&spec_path)
        .map_err(|e| format!("cannot read {}: {e}", spec_path.display()))?;
    let spec = model::parse(&text)?;
    emit::all(&spec)
        .into_iter()
        .map(|output| {
            let path = root.join(output.path);
            let text = match output.region {
                None => output.text,
                Some((start, end)) => splice(&path, start, end, &output.text)?,
            };
            Ok((path, text))
        })
        .collect()
}

/// The derived files whose committed contents differ from the spec's.
pub fn stale(root: &Path) -> Result<Vec<(PathBuf, String)>, String> {
    Ok(generate(root)?
        .into_iter()
        .filter(|(path, text)| std::fs::read_to_string(path).ok().as_deref() != Some(text.as_str()))
        .collect())
}

/// Rewrites the stale derived files; returns their paths.
pub fn write(root: &Path) -> Result<Vec<PathBuf>, String> {
    let stale = stale(root)?;
    for (path, text) in &stale {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(stale.into_iter().map(|(path, _)| path).collect())
}

/// `path`'s text with the region between its marker lines replaced by `body`.
fn splice(path: &Path, start: &str, end: &str, body: &str) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let missing = || {
        format!(
            "{} has no `{start}` ... `{end}` region for the text derived from spec/ops.toml",
            path.display()
        )
    };
    let from = text.find(start).ok_or_else(missing)? + start.len();
    let to = from + text[from..].find(end).ok_or_else(missing)?;
    Ok(format!("{}{body}{}", &text[..from], &text[to..]))
}

/// The check every generated, committed file gets in `cargo test`: when the
/// file at `path` differs from `generated`, it is rewritten (except under
/// CI) and the test fails with a message saying so, so the fresh file is
/// committed with the change that made it; under CI the message names
/// `regenerate`, the command that rewrites it.
pub fn ensure_fresh(path: &Path, generated: &str, regenerate: &str) -> Result<(), String> {
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    if committed == generated {
        return Ok(());
    }
    if std::env::var_os("CI").is_some() {
        return Err(format!(
            "{} is stale: run `{regenerate}` and commit the result",
            path.display()
        ));
    }
    std::fs::write(path, generated).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Err(format!(
        "{} was stale and has been regenerated; review and commit it, then rerun the tests",
        path.display()
    ))
}

//! What the C-program tests share: where the checkout and the cargo
//! profile directory are, and running a program with only the bundled
//! plugins, failing with its output.

use std::path::PathBuf;
use std::process::Command;

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The cargo profile directory of this test binary (`target/debug`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// Runs `cmd` with only the bundled plugins; returns its stdout.
pub fn run(cmd: &mut Command, what: &str) -> String {
    let output = cmd
        .env_remove("POLYCHIP_PLUGIN_PATH")
        .env_remove("POLYCHIP_NO_BUNDLED_PLUGINS")
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e} (run scripts/install-deps?)"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

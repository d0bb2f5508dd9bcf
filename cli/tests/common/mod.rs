//! Runs the `polychip` binary under test (shared by the CLI's test files).

use std::process::Command;

/// `polychip ARGS` with the extra environment `env` and the shared-memory
/// transport: its exit code, stdout and stderr.
pub fn polychip_env(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_polychip"))
        .args(args)
        .envs(env.iter().copied())
        .env("POLYCHIP_TRANSPORT", "shm")
        .output()
        .expect("run polychip");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `polychip ARGS`.
#[allow(dead_code)] // not every test file needs both
pub fn polychip(args: &[&str]) -> (Option<i32>, String, String) {
    polychip_env(args, &[])
}

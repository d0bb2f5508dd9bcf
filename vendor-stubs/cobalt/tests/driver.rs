//! Runs `tests/driver.c`, a small polychip host written in C against
//! `include/polychip.h` only, against the Cobalt plugin this crate builds;
//! `tests/driver_*.c` add its checks of the operators ABI 1.1 added.
//!
//! The driver is compiled once into `CARGO_TARGET_TMPDIR` with the C compiler
//! the `cc` crate finds (strict C11, warnings as errors), then run with the
//! plugin's path under several configurations. It checks loading, device
//! properties, the encoded memory, copies, streams, events and every
//! operator, prints `ok` and exits 0; on failure this test shows everything it
//! printed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The driver's C files (in `tests/`): the host and the ABI 1.0 checks, the
/// shared helpers, and one file of ABI 1.1 operator checks per concern.
const DRIVER_SOURCES: &[&str] = &[
    "driver.c",
    "driver_util.c",
    "driver_unary.c",
    "driver_reduce.c",
    "driver_norm.c",
    "driver_attention.c",
    "driver_training.c",
];

/// The compiled driver, built on first use.
fn driver() -> &'static Path {
    static DRIVER: OnceLock<PathBuf> = OnceLock::new();
    DRIVER.get_or_init(compile_driver)
}

fn compile_driver() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let include_dir = manifest_dir.join("../../include");
    let executable = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cobalt-driver");
    let target = env!("POLYCHIP_COBALT_TARGET");
    let compiler = cc::Build::new()
        .target(target)
        .host(target)
        .opt_level(0)
        .debug(true)
        .cargo_metadata(false)
        .get_compiler();
    let mut command = compiler.to_command();
    command
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"])
        .arg("-I")
        .arg(&include_dir)
        .args(
            DRIVER_SOURCES
                .iter()
                .map(|file| manifest_dir.join("tests").join(file)),
        )
        .arg("-o")
        .arg(&executable)
        .args(["-ldl", "-lm"]);
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler ({command:?}): {e}"));
    assert!(
        output.status.success(),
        "compiling tests/driver.c failed ({}):\n{command:?}\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    executable
}

/// Runs the driver with the given Cobalt environment (the variables not
/// listed are removed) and expectations, and asserts that it passed.
fn run_driver(env: &[(&str, &str)], expected_devices: u32, expected_mib: u64) -> Output {
    let mut command = Command::new(driver());
    command
        .arg(polychip_vendor_cobalt::LIBRARY_PATH)
        .arg(expected_devices.to_string())
        .arg(expected_mib.to_string())
        .env_remove("POLYCHIP_COBALT_DEVICES")
        .env_remove("POLYCHIP_COBALT_MEMORY_MIB")
        .envs(env.iter().copied());
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", driver().display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.lines().last() == Some("ok"),
        "the C driver failed ({}) with {env:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status
    );
    output
}

#[test]
fn driver_passes_with_the_default_configuration() {
    run_driver(&[], 1, 256);
}

#[test]
fn driver_passes_with_two_small_devices() {
    run_driver(
        &[
            ("POLYCHIP_COBALT_DEVICES", "2"),
            ("POLYCHIP_COBALT_MEMORY_MIB", "16"),
        ],
        2,
        16,
    );
}

#[test]
fn driver_passes_with_no_devices() {
    run_driver(&[("POLYCHIP_COBALT_DEVICES", "0")], 0, 256);
}

#[test]
fn malformed_configuration_falls_back_to_defaults_with_warnings() {
    let output = run_driver(
        &[
            ("POLYCHIP_COBALT_DEVICES", "lots"),
            ("POLYCHIP_COBALT_MEMORY_MIB", "0"),
        ],
        1,
        256,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    for variable in ["POLYCHIP_COBALT_DEVICES", "POLYCHIP_COBALT_MEMORY_MIB"] {
        assert!(
            stderr.contains(&format!("[plugin warn] cobalt: ignoring {variable}=")),
            "no warning about {variable}:\n{stderr}"
        );
    }
}

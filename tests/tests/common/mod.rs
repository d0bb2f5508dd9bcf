//! Helpers shared by the integration tests: finding the bundled plugins and
//! compiling variants of `c/fake_plugin.c`.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use polychip_host::{Device, LoadOptions, Plugin, Runtime};

/// The cargo profile directory (`target/debug` or `target/release`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps directory");
    deps.parent().expect("profile directory").to_path_buf()
}

/// A bundled plugin built by the workspace, by crate lib name.
pub fn bundled(lib_name: &str) -> PathBuf {
    let file = format!("lib{lib_name}.so");
    let dir = profile_dir();
    for candidate in [dir.join(&file), dir.join("deps").join(&file)] {
        if candidate.exists() {
            return candidate;
        }
    }
    panic!(
        "{file} is not in {}: build the workspace first (`cargo build --workspace`), as the README's test command does",
        dir.display()
    );
}

/// The Rust plugin "Ferrite".
pub fn ferrite_path() -> PathBuf {
    bundled("polychip_vendor_ferrite")
}

/// The OpenCL plugin (built by the workspace, not bundled).
#[allow(dead_code)]
pub fn opencl_path() -> PathBuf {
    bundled("polychip_opencl")
}

/// The C plugin "Cobalt".
pub fn cobalt_path() -> PathBuf {
    PathBuf::from(cobalt::LIBRARY_PATH)
}

/// Loads one plugin file with default options, panicking with the error.
pub fn load(path: &Path) -> Arc<Plugin> {
    let mut runtime = Runtime::default();
    runtime
        .add(path, &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The first device of the plugin at `path`.
pub fn first_device(path: &Path) -> Device {
    let runtime = Runtime::load(&[path], &LoadOptions::default());
    assert!(runtime.failures().is_empty(), "{:?}", runtime.failures());
    runtime.devices()[0].clone()
}

/// Compiles `c/fake_plugin.c` with `-D<define>` (or none) into a plugin,
/// once per process and variant. The library is written under a temporary
/// name and renamed into place, so a loaded copy is never overwritten.
pub fn fake_plugin(define: Option<&str>) -> PathBuf {
    static BUILT: Mutex<Option<HashMap<Option<String>, PathBuf>>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let built = built.get_or_insert_with(HashMap::new);
    if let Some(path) = built.get(&define.map(String::from)) {
        return path.clone();
    }
    let path = compile_fake_plugin(define);
    built.insert(define.map(String::from), path.clone());
    path
}

fn compile_fake_plugin(define: Option<&str>) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let name = define.unwrap_or("FAKE_GOOD").to_lowercase();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fake_plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("lib{name}.so"));
    let tmp = dir.join(format!("lib{name}.so.{}.tmp", std::process::id()));
    let compiler = cc::Build::new()
        .cargo_metadata(false)
        .opt_level(0)
        .target(env!("TARGET_TRIPLE"))
        .host(env!("TARGET_TRIPLE"))
        .get_compiler();
    let mut cmd: Command = compiler.to_command();
    cmd.args([
        "-std=c11",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-pedantic",
        "-shared",
        "-fPIC",
        "-fvisibility=hidden",
        "-I",
    ])
    .arg(root.join("../include"))
    .arg(root.join("c/fake_plugin.c"))
    // libm, for a variant's fesetround.
    .arg("-lm")
    .arg("-o")
    .arg(&tmp);
    if let Some(d) = define {
        cmd.arg(format!("-D{d}"));
    }
    let output = cmd.output().expect("run the C compiler");
    assert!(
        output.status.success(),
        "compiling fake plugin {name}:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::rename(&tmp, &out).expect("move the fake plugin into place");
    out
}

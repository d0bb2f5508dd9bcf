//! Shared by the trainer's tests: the bundled plugins, loaded once.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use polychip_host::{Device, LoadOptions, Runtime};

/// Ferrite's library in the build's profile directory.
pub fn ferrite_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("profile dir");
    let file = "libpolychip_vendor_ferrite.so";
    [dir.join(file), dir.join("deps").join(file)]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "{file} is not in {}: run `cargo build --workspace` first",
                dir.display()
            )
        })
}

/// Ferrite and Cobalt, loaded once per process.
pub fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        let files = [ferrite_path(), PathBuf::from(cobalt::LIBRARY_PATH)];
        let rt = Runtime::load(&files, &LoadOptions::default());
        assert!(rt.failures().is_empty(), "{:?}", rt.failures());
        rt
    })
}

/// `vendor`'s device `index`.
pub fn device(vendor: &str, index: usize) -> Device {
    runtime().devices_of(vendor)[index].clone()
}

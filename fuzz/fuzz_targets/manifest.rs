//! libFuzzer entry point of the `manifest` target (see `fuzz/src/manifest.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| polychip_fuzz::manifest::run(data));

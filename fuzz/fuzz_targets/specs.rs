//! libFuzzer entry point of the `specs` target (see `fuzz/src/specs.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| polychip_fuzz::specs::run(data));

//! libFuzzer entry point of the `frames` target (see `fuzz/src/frames.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| polychip_fuzz::frames::run(data));

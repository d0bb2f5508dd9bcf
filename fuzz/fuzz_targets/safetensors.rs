//! libFuzzer entry point of the `safetensors` target (see `fuzz/src/safetensors.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| polychip_fuzz::safetensors::run(data));

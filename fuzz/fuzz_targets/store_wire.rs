//! libFuzzer entry point of the `store_wire` target (see `fuzz/src/store_wire.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| polychip_fuzz::store_wire::run(data));

//! libFuzzer entry point of the `op_args` target (see `fuzz/src/op_args.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| polychip_fuzz::op_args::run(data));

//! polychip's fuzz targets, one module each, each a `run(&[u8])` that must
//! not panic on any input. The libFuzzer binaries in `fuzz_targets/` (built
//! by `scripts/fuzz` with cargo-fuzz and the `libfuzzer` feature) call
//! them; `tests/corpus.rs` replays the kept corpora through them and runs
//! each briefly on mutated inputs in `cargo test`, without cargo-fuzz.

pub mod frames;
pub mod manifest;
pub mod op_args;
pub mod safetensors;
pub mod specs;
pub mod store_wire;

/// A target's entry point.
pub type Target = fn(&[u8]);

/// Every target by name (the corpus folder's name), in a fixed order.
pub const TARGETS: [(&str, Target); 6] = [
    ("frames", frames::run),
    ("manifest", manifest::run),
    ("op_args", op_args::run),
    ("safetensors", safetensors::run),
    ("specs", specs::run),
    ("store_wire", store_wire::run),
];

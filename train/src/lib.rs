//! polychip's trainer: a LLaMA-architecture decoder over byte tokens whose
//! every operator runs through the host on a vendor's plugin, split into
//! pipeline stages (1F1B or zero bubble) and data-parallel replicas across
//! devices of different vendors as the planner says, with checkpoints, a
//! Chrome trace and an op-by-op comparison against the f64 reference.

pub mod auto;
pub mod autocompare;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod dp;
pub mod error;
pub mod files;
pub mod hf;
pub mod links;
pub mod memory;
pub mod model;
pub mod params;
pub mod pin;
pub mod pipeline;
pub mod plan;
pub mod rebalance;
pub mod recut;
pub mod reduce;
pub mod safetensors;
pub mod simulate;
pub mod stop;
pub mod trace;
pub mod trainer;

pub use error::{Result, TrainError};

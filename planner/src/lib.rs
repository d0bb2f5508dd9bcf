//! HeteroAuto, polychip's heterogeneous parallel planner (issue 5, in
//! progress): given a cluster of uneven chips and a LLaMA-family model, how
//! to train it. Pure computation, no FFI.
//!
//! - [`schedule`]: the per-stage timings of one training step that a plan
//!   implies, the interface between the cost model and the simulator, and
//!   the pipeline schedules (1F1B, zero bubble);
//! - [`sim`]: a discrete-event simulator of those schedules with unequal
//!   stages, which also writes a Chrome trace of the timeline;
//! - [`plan`]: a plan (data-parallel groups of pipelines) and its predictions;
//! - [`search`]: the search for the fastest plan, and the HeteroSpeedupRatio;
//! - [`measured`]: the search over a few real devices from measured costs,
//!   and [`uncertainty`]: how it chooses when those costs are uncertain.

#![forbid(unsafe_code)]

pub mod cluster;
pub mod cost;
pub mod error;
pub mod evaluate;
pub mod framework;
pub mod hf;
pub mod measured;
pub mod model;
pub mod overlap;
pub mod placement;
pub mod plan;
pub mod profile;
pub mod schedule;
pub mod search;
pub mod settings;
pub mod sim;
pub mod uncertainty;
pub mod validate;

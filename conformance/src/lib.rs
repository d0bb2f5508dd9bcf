//! The operator conformance suite of polychip: it checks every operator of
//! every plugin against a CPU reference (`docs/conformance.md`).
//!
//! - [`reference`](mod@reference): an obviously correct f64 implementation of
//!   each operator of the op table, written from the ABI's doc comments for
//!   clarity rather than speed and sharing no code with any plugin;
//! - [`cases`]: the seeded cases of every (operator, dtype), the layout and
//!   in-place variants derived from them, and the realistic sizes;
//! - [`tolerance`] and [`compare`]: the error model and the judgement of one
//!   output (worst element, bias test);
//! - [`placement`] and [`runner`]: guarded buffers and running one case;
//!   [`fpenv`]: whether a call left a stream's thread with another
//!   floating-point environment; [`leaks`]: whether memory or threads
//!   keep growing with repeated calls;
//! - [`shrink`], [`suite`], [`report`], [`waivers`]: shrinking a failure,
//!   running a plugin's units in child processes, the report, waivers.

#![forbid(unsafe_code)]

pub mod case;
pub mod cases;
pub mod compare;
pub mod fpenv;
pub mod leaks;
pub mod placement;
pub mod reference;
pub mod report;
pub mod runner;
pub mod shrink;
pub mod suite;
pub mod tolerance;
pub mod values;
pub mod waivers;

//! The operator conformance suite of polychip (issue 3): it checks every
//! operator of every plugin against a CPU reference. This crate holds the
//! reference ([`reference`](mod@reference)), an obviously correct f64
//! implementation of each operator of the op table, written from the ABI's
//! doc comments for clarity rather than speed and sharing no code with any
//! plugin. The seeded test cases, the tolerance table per (operator, dtype)
//! and the runner that checks a plugin in a child process are to come in
//! other modules.

#![forbid(unsafe_code)]

pub mod case;
pub mod cases;
pub mod compare;
pub mod placement;
pub mod reference;
pub mod report;
pub mod runner;
pub mod shrink;
pub mod suite;
pub mod tolerance;
pub mod values;
pub mod waivers;

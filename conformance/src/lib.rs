//! The operator conformance suite (issue 3): a CPU reference of every
//! operator computed in f64, seeded test cases, a tolerance table per
//! (operator, dtype), and a runner that checks a plugin in a child process.
//!
//! Nothing is here yet; the v1 operators are covered for now by the
//! integration tests in `tests/tests/ops.rs`.

#![forbid(unsafe_code)]

//! The `extern "C"` shims of the operators added in ABI 1.1: each reads
//! its args struct, checks the tensors with [`crate::check`], and calls the
//! [`crate::Plugin`] method. Operators that share an args struct share a shim, told
//! apart by a const parameter.

mod elementwise;
mod layers;
mod training;

pub(in crate::__export) use elementwise::*;
pub(in crate::__export) use layers::*;
pub(in crate::__export) use training::*;

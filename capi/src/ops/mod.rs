//! The operator functions of the C API, `polychip_op_<name>`, one per
//! op-table entry, derived from `spec/ops.toml` (`generated.rs`). Each looks
//! up its handles (a NULL, freed or foreign one is an error naming the
//! argument) and runs the host's checked call, so argument errors name the
//! operator, the argument and the shape or dtype, as for Rust callers.

#[rustfmt::skip]
mod generated;

pub use generated::*;

use std::sync::Arc;

use polychip_host::{Exec, Tensor};

use crate::error::ApiResult;
use crate::stream::StreamObject;
use crate::tensor::{TensorObject, polychip_tensor_t, tensor};

/// Runs `f` where the operator runs: on the stream (locked for the call),
/// or on the default stream of the device of `first`, the call's first tensor.
fn with_exec<R>(stream: Option<&StreamObject>, first: &Tensor, f: impl FnOnce(Exec<'_>) -> R) -> R {
    match stream {
        Some(s) => f(s.lock().exec()),
        None => f(first.device().exec()),
    }
}

/// An optional tensor argument: NULL is absent.
fn optional(handle: *const polychip_tensor_t, name: &str) -> ApiResult<Option<Arc<TensorObject>>> {
    if handle.is_null() {
        Ok(None)
    } else {
        tensor(handle, name).map(Some)
    }
}

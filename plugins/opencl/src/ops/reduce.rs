//! sum, mean, max, argmax and sum_squares (`kernels/reduce.cl`).
//!
//! Not written yet: every call answers UNIMPLEMENTED.

use polychip_plugin_sdk::{Error, ReduceArgs, ReduceOp, Result, SumSquaresArgs};

use crate::call::Ctx;

/// `reduce`.
pub fn reduce(ctx: Ctx<'_>, _op: ReduceOp, _args: &ReduceArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

/// `sum_squares`.
pub fn sum_squares(ctx: Ctx<'_>, _args: &SumSquaresArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

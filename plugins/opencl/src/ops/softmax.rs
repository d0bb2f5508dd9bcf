//! softmax and log_softmax with their backwards, cross_entropy and its backward (`kernels/softmax.cl`): one work-group per row.
//!
//! Not written yet: every call answers UNIMPLEMENTED.

use polychip_plugin_sdk::{
    CrossEntropyArgs, CrossEntropyBackwardArgs, Error, Result, SoftmaxArgs, SoftmaxBackwardArgs,
};

use crate::call::Ctx;

/// `softmax`.
pub fn softmax(ctx: Ctx<'_>, _args: &SoftmaxArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

/// `log_softmax`.
pub fn log_softmax(ctx: Ctx<'_>, _args: &SoftmaxArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

/// `softmax_backward`.
pub fn softmax_backward(ctx: Ctx<'_>, _args: &SoftmaxBackwardArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

/// `log_softmax_backward`.
pub fn log_softmax_backward(ctx: Ctx<'_>, _args: &SoftmaxBackwardArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

/// `cross_entropy`.
pub fn cross_entropy(ctx: Ctx<'_>, _args: &CrossEntropyArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

/// `cross_entropy_backward`.
pub fn cross_entropy_backward(ctx: Ctx<'_>, _args: &CrossEntropyBackwardArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

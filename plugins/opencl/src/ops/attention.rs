//! attention and its backward, rope and its backward (`kernels/attention.cl`).
//!
//! Not written yet: every call answers UNIMPLEMENTED.

use polychip_plugin_sdk::{AttentionArgs, AttentionBackwardArgs, Error, Result, RopeArgs};

use crate::call::Ctx;

/// `rope`.
pub fn rope(ctx: Ctx<'_>, _args: &RopeArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

/// `rope_backward`.
pub fn rope_backward(ctx: Ctx<'_>, _args: &RopeArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

/// `attention`.
pub fn attention(ctx: Ctx<'_>, _args: &AttentionArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

/// `attention_backward`.
pub fn attention_backward(ctx: Ctx<'_>, _args: &AttentionBackwardArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

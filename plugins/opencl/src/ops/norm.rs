//! rms_norm and layer_norm with their backwards (`kernels/norm.cl`): one work-group per row.
//!
//! Not written yet: every call answers UNIMPLEMENTED.

use polychip_plugin_sdk::{
    Error, LayerNormArgs, LayerNormBackwardArgs, Result, RmsNormArgs, RmsNormBackwardArgs,
};

use crate::call::Ctx;

/// `rms_norm`.
pub fn rms_norm(ctx: Ctx<'_>, _args: &RmsNormArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

/// `rms_norm_backward`.
pub fn rms_norm_backward(ctx: Ctx<'_>, _args: &RmsNormBackwardArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

/// `layer_norm`.
pub fn layer_norm(ctx: Ctx<'_>, _args: &LayerNormArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

/// `layer_norm_backward`.
pub fn layer_norm_backward(ctx: Ctx<'_>, _args: &LayerNormBackwardArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

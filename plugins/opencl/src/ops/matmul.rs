//! matmul and linear (`kernels/matmul.cl`).
//!
//! Not written yet: every call answers UNIMPLEMENTED.

use polychip_plugin_sdk::{Error, LinearArgs, MatmulArgs, Result};

use crate::call::Ctx;

/// `matmul`.
pub fn matmul(ctx: Ctx<'_>, _args: &MatmulArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

/// `linear`.
pub fn linear(ctx: Ctx<'_>, _args: &LinearArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

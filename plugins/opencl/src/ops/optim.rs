//! adamw (`kernels/optim.cl`).
//!
//! Not written yet: every call answers UNIMPLEMENTED.

use polychip_plugin_sdk::{AdamwArgs, Error, Result};

use crate::call::Ctx;

/// `adamw`.
pub fn adamw(ctx: Ctx<'_>, _args: &AdamwArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

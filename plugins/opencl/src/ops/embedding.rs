//! embedding and embedding_backward (`kernels/embedding.cl`).
//!
//! Not written yet: every call answers UNIMPLEMENTED.

use polychip_plugin_sdk::{EmbeddingArgs, EmbeddingBackwardArgs, Error, Result};

use crate::call::Ctx;

/// `embedding`.
pub fn embedding(ctx: Ctx<'_>, _args: &EmbeddingArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

/// `embedding_backward`.
pub fn embedding_backward(ctx: Ctx<'_>, _args: &EmbeddingBackwardArgs<'_>) -> Result<()> {
    Err(Error::unimplemented(format!(
        "opencl: {} is not written yet",
        ctx.op
    )))
}

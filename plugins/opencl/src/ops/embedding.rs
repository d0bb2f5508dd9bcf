//! embedding and embedding_backward (`kernels/embedding.cl`).
//!
//! The table is used in its own strides (never packed, so a call touches
//! only the rows its ids name); ids and rows are compact. Every id is
//! checked on the device against `[0, V)` and the call waits for that check
//! (a blocking read of 16 bytes, after the call's kernels): an id outside is
//! an INVALID_ARGUMENT error naming its position and value, and the
//! backward kernel, which runs after the check on the in-order queue, then
//! leaves `grad_weight` untouched.
//!
//! The backward is deterministic: the `(id, position)` pairs are sorted on
//! the device (a bitonic sort), and each run of one id is added to its
//! table row by one work-item per column, in position order, in f32, with
//! one rounding per element (no atomics).

use polychip_plugin_sdk::{DType, EmbeddingArgs, EmbeddingBackwardArgs, Error, Result};

use super::indexing::{self, for_index as for_ids};
use crate::call::{Ctx, Operand};

/// Waits for the id check and refuses the call if an id is out of range.
fn refuse_bad_ids(ctx: &Ctx<'_>, status: &Operand, ids: &Operand, table: &Operand) -> Result<()> {
    let vocab = table.shape[0] as usize;
    indexing::refuse_bad(ctx, status, ids, "indices", vocab, || {
        format!("for a table of shape {:?}", table.shape)
    })
}

/// Refuses tables and id counts that the keys `id << 32 | position` of the
/// backward cannot hold.
fn fits_keys(ctx: &Ctx<'_>, vocab: usize, n: usize) -> Result<()> {
    if vocab > u32::MAX as usize || n > u32::MAX as usize {
        return Err(Error::unimplemented(format!(
            "opencl: {}: {n} ids into a table of {vocab} rows; at most 2^32 - 1 of each",
            ctx.op
        )));
    }
    Ok(())
}

/// `embedding`.
pub fn embedding(mut ctx: Ctx<'_>, args: &EmbeddingArgs<'_>) -> Result<()> {
    let weight = ctx.view("weight", &args.weight)?;
    let ids = ctx.input("indices", &args.indices)?;
    let out = ctx.output("out", &args.out)?;
    let flavor = ctx.float(weight.dtype)?;
    let (vocab, h) = (weight.shape[0] as usize, weight.shape[1] as usize);
    let n = ids.numel();
    if n == 0 {
        return ctx.finish();
    }
    let status = indexing::check(&ctx, flavor, &ids, vocab)?;
    ctx.launch(
        flavor,
        &for_ids("pc_emb_gather", &ids),
        &[h, n],
        None,
        |a| {
            a.tensor(&weight)?
                .value(weight.strides[0])?
                .value(weight.strides[1])?
                .value(vocab as i64)?
                .tensor(&ids)?
                .tensor(&out)?
                .value(h as i64)?;
            Ok(())
        },
    )?;
    refuse_bad_ids(&ctx, &status, &ids, &weight)?;
    ctx.finish()
}

/// `embedding_backward`.
pub fn embedding_backward(ctx: Ctx<'_>, args: &EmbeddingBackwardArgs<'_>) -> Result<()> {
    let g = ctx.input("grad_out", &args.grad_out)?;
    let ids = ctx.input("indices", &args.indices)?;
    let w = ctx.view("grad_weight", &args.grad_weight)?;
    let flavor = ctx.float(w.dtype)?;
    let (vocab, h) = (w.shape[0] as usize, w.shape[1] as usize);
    let n = ids.numel();
    if n == 0 {
        return ctx.finish();
    }
    fits_keys(&ctx, vocab, n)?;
    let status = indexing::check(&ctx, flavor, &ids, vocab)?;
    if h > 0 {
        let padded = indexing::padded_keys(&ctx, n);
        let keys = ctx.scratch(DType::I64, &[padded as i64])?;
        ctx.launch(
            flavor,
            &for_ids("pc_emb_keys", &ids),
            &[padded],
            None,
            |a| {
                a.tensor(&ids)?.value(n as i64)?.mem(keys.mem())?;
                Ok(())
            },
        )?;
        indexing::sort_keys(&ctx, flavor, &keys, padded)?;
        ctx.launch(flavor, "pc_emb_accumulate", &[h, n], None, |a| {
            a.tensor(&g)?
                .mem(keys.mem())?
                .value(n as i64)?
                .tensor(&w)?
                .value(w.strides[0])?
                .value(w.strides[1])?
                .value(h as i64)?
                .mem(status.mem())?;
            Ok(())
        })?;
    }
    refuse_bad_ids(&ctx, &status, &ids, &w)?;
    ctx.finish()
}

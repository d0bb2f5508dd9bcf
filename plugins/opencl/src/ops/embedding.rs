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

use cl3::command_queue::enqueue_read_buffer;
use opencl3::event::Event as ClEvent;
use polychip_plugin_sdk::{DType, EmbeddingArgs, EmbeddingBackwardArgs, Error, Result};

use crate::call::{Ctx, Operand};
use crate::driver::ClResult;
use crate::program::Flavor;

/// The kernel `stem` for ids of `ids`' dtype.
fn for_ids(stem: &str, ids: &Operand) -> String {
    let suffix = if ids.dtype == DType::I32 {
        "i32"
    } else {
        "i64"
    };
    format!("{stem}_{suffix}")
}

/// Enqueues the check of `ids` against `[0, vocab)` into new status memory.
fn check_ids(ctx: &Ctx<'_>, flavor: Flavor, ids: &Operand, vocab: usize) -> Result<Operand> {
    let status = ctx.scratch(DType::I64, &[2])?;
    let wg = ctx.programs.wg;
    ctx.launch(
        flavor,
        &for_ids("pc_emb_check", ids),
        &[wg],
        Some(&[wg]),
        |a| {
            a.tensor(ids)?
                .value(ids.numel() as i64)?
                .value(vocab as i64)?
                .mem(status.mem())?;
            Ok(())
        },
    )?;
    Ok(status)
}

/// Waits for the check and refuses the call if an id is out of range.
fn refuse_bad_ids(ctx: &Ctx<'_>, status: &Operand, ids: &Operand, table: &Operand) -> Result<()> {
    let mut found = [0i64; 2];
    // SAFETY: `found` is 16 writable bytes, and the read is blocking, so
    // it is done with them when this returns; `status` holds 2 i64.
    let event = unsafe {
        enqueue_read_buffer(
            ctx.queue.get(),
            status.mem(),
            1,
            0,
            std::mem::size_of_val(&found),
            found.as_mut_ptr().cast(),
            0,
            std::ptr::null(),
        )
    }
    .cl(&format!("clEnqueueReadBuffer ({}: the id check)", ctx.op))?;
    drop(ClEvent::new(event));
    let [first, value] = found;
    if first < ids.numel() as i64 {
        return Err(Error::invalid(format!(
            "opencl: {}: element {first} (row-major) of indices is {value}, outside [0, {}) for a \
             table of shape {:?}",
            ctx.op, table.shape[0], table.shape
        )));
    }
    Ok(())
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
    let status = check_ids(&ctx, flavor, &ids, vocab)?;
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
    let status = check_ids(&ctx, flavor, &ids, vocab)?;
    if h > 0 {
        let wg = ctx.programs.wg;
        let block = 2 * wg;
        let padded = n.next_power_of_two().max(block);
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
        let sort_block = |k: usize| {
            ctx.launch(
                flavor,
                "pc_emb_sort_block",
                &[padded / 2],
                Some(&[wg]),
                |a| {
                    a.mem(keys.mem())?.value(k as i64)?;
                    Ok(())
                },
            )
        };
        sort_block(0)?;
        let mut k = 2 * block;
        while k <= padded {
            let mut j = k / 2;
            while j >= block {
                ctx.launch(flavor, "pc_emb_sort_step", &[padded / 2], None, |a| {
                    a.mem(keys.mem())?.value(k as i64)?.value(j as i64)?;
                    Ok(())
                })?;
                j /= 2;
            }
            sort_block(k)?;
            k *= 2;
        }
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

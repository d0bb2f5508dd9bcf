//! softmax and log_softmax with their backwards, cross_entropy and its
//! backward (`kernels/softmax.cl`): one work-group per row, over compact
//! rows (strided operands are packed, and strided outputs written back, by
//! [`Ctx`]).
//!
//! Cross-entropy reads its targets back to the host first (one blocking
//! read on the call's queue): a target out of range must be refused with
//! `INVALID_ARGUMENT` before anything is computed, and the number of rows
//! that count is needed by both passes. The forward writes one loss per row
//! into scratch and a second one-work-group kernel sums them in a fixed
//! tree (deterministic) and divides by the count.

use cl3::command_queue::enqueue_read_buffer;
use cl3::types::CL_BLOCKING;
use opencl3::event::Event as ClEvent;
use polychip_plugin_sdk::{
    CrossEntropyArgs, CrossEntropyBackwardArgs, DType, Error, Result, SoftmaxArgs,
    SoftmaxBackwardArgs,
};

use crate::call::{Ctx, Operand};
use crate::driver::ClResult;
use crate::ops::scalar;
use crate::program::Flavor;

/// `(rows, C)` of a tensor whose last dimension is the row.
fn rows_of(op: &Operand) -> (usize, usize) {
    let c = op.shape.last().map_or(1, |&d| d as usize);
    let n = op.numel();
    (n.checked_div(c).unwrap_or(0), c)
}

/// softmax (`log` false) or log_softmax.
fn forward(mut ctx: Ctx<'_>, args: &SoftmaxArgs<'_>, log: bool) -> Result<()> {
    let x = ctx.input("input", &args.input)?;
    let y = ctx.output("out", &args.out)?;
    let flavor = ctx.float(x.dtype)?;
    let (rows, c) = rows_of(&x);
    let wg = ctx.programs.wg;
    if x.numel() > 0 {
        ctx.launch(flavor, "pc_softmax_fwd", &[rows * wg], Some(&[wg]), |a| {
            a.tensor(&x)?
                .tensor(&y)?
                .value(c as i64)?
                .value(i32::from(log))?;
            Ok(())
        })?;
    }
    ctx.finish()
}

/// softmax_backward (`log` false) or log_softmax_backward.
fn backward(mut ctx: Ctx<'_>, args: &SoftmaxBackwardArgs<'_>, log: bool) -> Result<()> {
    let y = ctx.input("out", &args.out)?;
    let g = ctx.input("grad_out", &args.grad_out)?;
    let dx = ctx.output("grad_in", &args.grad_in)?;
    let flavor = ctx.float(y.dtype)?;
    let (rows, c) = rows_of(&y);
    let wg = ctx.programs.wg;
    if y.numel() > 0 {
        ctx.launch(flavor, "pc_softmax_bwd", &[rows * wg], Some(&[wg]), |a| {
            a.tensor(&y)?
                .tensor(&g)?
                .tensor(&dx)?
                .value(c as i64)?
                .value(i32::from(log))?;
            Ok(())
        })?;
    }
    ctx.finish()
}

/// `softmax`.
pub fn softmax(ctx: Ctx<'_>, args: &SoftmaxArgs<'_>) -> Result<()> {
    forward(ctx, args, false)
}

/// `log_softmax`.
pub fn log_softmax(ctx: Ctx<'_>, args: &SoftmaxArgs<'_>) -> Result<()> {
    forward(ctx, args, true)
}

/// `softmax_backward`.
pub fn softmax_backward(ctx: Ctx<'_>, args: &SoftmaxBackwardArgs<'_>) -> Result<()> {
    backward(ctx, args, false)
}

/// `log_softmax_backward`.
pub fn log_softmax_backward(ctx: Ctx<'_>, args: &SoftmaxBackwardArgs<'_>) -> Result<()> {
    backward(ctx, args, true)
}

/// The compact targets `t` (i32 or i64), read back to the host after the
/// work queued before them.
fn read_targets(ctx: &Ctx<'_>, t: &Operand) -> Result<Vec<i64>> {
    let n = t.numel();
    if n == 0 {
        return Ok(Vec::new());
    }
    let size = t.dtype.size();
    let mut bytes = vec![0u8; n * size];
    // SAFETY: a blocking read of `n` elements of a compact tensor that lies
    // in its buffer, into `bytes`, which holds that many bytes and outlives
    // the read (it is done when the call returns).
    let event = unsafe {
        enqueue_read_buffer(
            ctx.queue.get(),
            t.mem(),
            CL_BLOCKING,
            t.offset as usize * size,
            n * size,
            bytes.as_mut_ptr().cast(),
            0,
            std::ptr::null(),
        )
    }
    .cl(&format!("clEnqueueReadBuffer of {}'s targets", ctx.op))?;
    drop(ClEvent::new(event));
    Ok(if t.dtype == DType::I64 {
        bytes
            .chunks_exact(8)
            .map(|b| i64::from_ne_bytes(b.try_into().expect("8 bytes")))
            .collect()
    } else {
        bytes
            .chunks_exact(4)
            .map(|b| i64::from(i32::from_ne_bytes(b.try_into().expect("4 bytes"))))
            .collect()
    })
}

/// The targets, checked against `[0, c)` (`ignore_index` aside), and the
/// number of rows that count.
fn checked_targets(ctx: &Ctx<'_>, t: &Operand, c: usize, ignore_index: i64) -> Result<usize> {
    let targets = read_targets(ctx, t)?;
    let mut count = 0usize;
    for (row, &target) in targets.iter().enumerate() {
        if target == ignore_index {
            continue;
        }
        if target < 0 || target as u64 >= c as u64 {
            return Err(Error::invalid(format!(
                "opencl: {}: target {target} of row {row} is outside [0, {c}) and is not \
                 ignore_index ({ignore_index})",
                ctx.op
            )));
        }
        count += 1;
    }
    Ok(count)
}

/// `cross_entropy`.
pub fn cross_entropy(mut ctx: Ctx<'_>, args: &CrossEntropyArgs<'_>) -> Result<()> {
    let x = ctx.input("logits", &args.logits)?;
    let t = ctx.input("targets", &args.targets)?;
    let (n, c) = (x.shape[0] as usize, x.shape[1] as usize);
    let count = checked_targets(&ctx, &t, c, args.ignore_index)?;
    let loss = ctx.output("loss", &args.loss)?;
    let flavor = ctx.float(x.dtype)?;
    let acc = if flavor == Flavor::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let part = ctx.scratch(acc, &[n as i64])?;
    let wg = ctx.programs.wg;
    ctx.launch(flavor, "pc_softmax_ce_rows", &[n * wg], Some(&[wg]), |a| {
        a.tensor(&x)?
            .mem(t.mem())?
            .tensor(&t)?
            .value(i32::from(t.dtype == DType::I64))?
            .value(args.ignore_index)?
            .mem(part.mem())?
            .value(c as i64)?;
        Ok(())
    })?;
    ctx.launch(flavor, "pc_softmax_ce_mean", &[wg], Some(&[wg]), |a| {
        a.mem(part.mem())?
            .value(n as i64)?
            .value(count as i64)?
            .tensor(&loss)?;
        Ok(())
    })?;
    ctx.finish()
}

/// `cross_entropy_backward`.
pub fn cross_entropy_backward(mut ctx: Ctx<'_>, args: &CrossEntropyBackwardArgs<'_>) -> Result<()> {
    let x = ctx.input("logits", &args.logits)?;
    let t = ctx.input("targets", &args.targets)?;
    let (n, c) = (x.shape[0] as usize, x.shape[1] as usize);
    let count = checked_targets(&ctx, &t, c, args.ignore_index)?;
    let dx = ctx.output("grad_logits", &args.grad_logits)?;
    let flavor = ctx.float(x.dtype)?;
    let factor = args.grad_loss / count.max(1) as f64;
    let wg = ctx.programs.wg;
    if n * c > 0 {
        ctx.launch(flavor, "pc_softmax_ce_bwd", &[n * wg], Some(&[wg]), |a| {
            a.tensor(&x)?
                .mem(t.mem())?
                .tensor(&t)?
                .value(i32::from(t.dtype == DType::I64))?
                .value(args.ignore_index)?
                .tensor(&dx)?
                .value(c as i64)?;
            scalar(a, flavor, factor)?;
            Ok(())
        })?;
    }
    ctx.finish()
}

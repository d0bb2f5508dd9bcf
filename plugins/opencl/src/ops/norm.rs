//! rms_norm and layer_norm with their backwards (`kernels/norm.cl`): one
//! work-group per row, the row's sums as per-work-item partial sums added
//! by a tree in local memory, in A (f32, or f64 for f64).
//!
//! Every tensor is taken compact (strided ones are packed into scratch,
//! strided outputs written back by [`Ctx::finish`]). The backwards write
//! (do not accumulate) the parameter gradients, summed over the rows in two
//! deterministic steps: per chunk of rows into scratch, then the chunks of
//! each column in order.

use polychip_plugin_sdk::{
    DType, LayerNormArgs, LayerNormBackwardArgs, Result, RmsNormArgs, RmsNormBackwardArgs,
};

use crate::call::{Ctx, Operand};
use crate::ops::scalar;
use crate::program::Flavor;

/// `(rows, H)` of a `[..., H]` tensor.
fn rows_h(x: &Operand) -> (usize, usize) {
    let (lead, last) = x.shape.split_at(x.shape.len() - 1);
    let rows = lead.iter().map(|&d| d as usize).product();
    (rows, last[0] as usize)
}

/// Rows per chunk of the parameter-gradient sums: at least 32 (a run of
/// rows summed in order by one work-item), at most 256 chunks.
fn chunking(rows: usize) -> (usize, usize) {
    let chunk = rows.div_ceil(256).max(32);
    (chunk, rows.div_ceil(chunk))
}

/// The dtype of the partial sums (the program's A).
fn acc_dtype(flavor: Flavor) -> DType {
    if flavor == Flavor::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Sums the `chunks` partial sums `[chunks, h]` of each column into `out`.
fn colsum(
    ctx: &Ctx<'_>,
    flavor: Flavor,
    part: &Operand,
    chunks: usize,
    out: &Operand,
    h: usize,
) -> Result<()> {
    ctx.launch(flavor, "pc_norm_colsum", &[h], None, |a| {
        a.mem(part.mem())?
            .value(chunks as i64)?
            .tensor(out)?
            .value(h as i64)?;
        Ok(())
    })
}

/// `rms_norm`.
pub fn rms_norm(mut ctx: Ctx<'_>, args: &RmsNormArgs<'_>) -> Result<()> {
    let x = ctx.input("input", &args.input)?;
    let w = ctx.input("weight", &args.weight)?;
    let y = ctx.output("out", &args.out)?;
    let inv = ctx.output("inv_rms", &args.inv_rms)?;
    let flavor = ctx.float(x.dtype)?;
    let (rows, h) = rows_h(&x);
    let wg = ctx.programs.wg;
    ctx.launch(flavor, "pc_norm_rms", &[rows * wg], Some(&[wg]), |a| {
        a.tensor(&x)?
            .tensor(&w)?
            .tensor(&y)?
            .tensor(&inv)?
            .value(h as i64)?;
        scalar(a, flavor, args.eps)?;
        Ok(())
    })?;
    ctx.finish()
}

/// `rms_norm_backward`.
pub fn rms_norm_backward(mut ctx: Ctx<'_>, args: &RmsNormBackwardArgs<'_>) -> Result<()> {
    let g = ctx.input("grad_out", &args.grad_out)?;
    let x = ctx.input("input", &args.input)?;
    let w = ctx.input("weight", &args.weight)?;
    let inv = ctx.input("inv_rms", &args.inv_rms)?;
    let dx = ctx.output("grad_input", &args.grad_input)?;
    let dw = ctx.output("grad_weight", &args.grad_weight)?;
    let flavor = ctx.float(x.dtype)?;
    let (rows, h) = rows_h(&x);
    let wg = ctx.programs.wg;
    ctx.launch(
        flavor,
        "pc_norm_rms_backward",
        &[rows * wg],
        Some(&[wg]),
        |a| {
            a.tensor(&g)?
                .tensor(&x)?
                .tensor(&w)?
                .tensor(&inv)?
                .tensor(&dx)?
                .value(h as i64)?;
            Ok(())
        },
    )?;
    let (chunk, chunks) = chunking(rows);
    let part = ctx.scratch(acc_dtype(flavor), &[chunks as i64, h as i64])?;
    ctx.launch(flavor, "pc_norm_rms_partials", &[h, chunks], None, |a| {
        a.tensor(&g)?
            .tensor(&x)?
            .tensor(&inv)?
            .mem(part.mem())?
            .value(h as i64)?
            .value(rows as i64)?
            .value(chunk as i64)?;
        Ok(())
    })?;
    colsum(&ctx, flavor, &part, chunks, &dw, h)?;
    drop(part);
    ctx.finish()
}

/// `layer_norm`.
pub fn layer_norm(mut ctx: Ctx<'_>, args: &LayerNormArgs<'_>) -> Result<()> {
    let x = ctx.input("input", &args.input)?;
    let w = ctx.input("weight", &args.weight)?;
    let b = ctx.input("bias", &args.bias)?;
    let y = ctx.output("out", &args.out)?;
    let mean = ctx.output("mean", &args.mean)?;
    let rstd = ctx.output("rstd", &args.rstd)?;
    let flavor = ctx.float(x.dtype)?;
    let (rows, h) = rows_h(&x);
    let wg = ctx.programs.wg;
    ctx.launch(flavor, "pc_norm_layer", &[rows * wg], Some(&[wg]), |a| {
        a.tensor(&x)?
            .tensor(&w)?
            .tensor(&b)?
            .tensor(&y)?
            .tensor(&mean)?
            .tensor(&rstd)?
            .value(h as i64)?;
        scalar(a, flavor, args.eps)?;
        Ok(())
    })?;
    ctx.finish()
}

/// `layer_norm_backward`.
pub fn layer_norm_backward(mut ctx: Ctx<'_>, args: &LayerNormBackwardArgs<'_>) -> Result<()> {
    let g = ctx.input("grad_out", &args.grad_out)?;
    let x = ctx.input("input", &args.input)?;
    let w = ctx.input("weight", &args.weight)?;
    let mean = ctx.input("mean", &args.mean)?;
    let rstd = ctx.input("rstd", &args.rstd)?;
    let dx = ctx.output("grad_input", &args.grad_input)?;
    let dw = ctx.output("grad_weight", &args.grad_weight)?;
    let db = ctx.output("grad_bias", &args.grad_bias)?;
    let flavor = ctx.float(x.dtype)?;
    let (rows, h) = rows_h(&x);
    let wg = ctx.programs.wg;
    ctx.launch(
        flavor,
        "pc_norm_layer_backward",
        &[rows * wg],
        Some(&[wg]),
        |a| {
            a.tensor(&g)?
                .tensor(&x)?
                .tensor(&w)?
                .tensor(&mean)?
                .tensor(&rstd)?
                .tensor(&dx)?
                .value(h as i64)?;
            Ok(())
        },
    )?;
    let (chunk, chunks) = chunking(rows);
    let pw = ctx.scratch(acc_dtype(flavor), &[chunks as i64, h as i64])?;
    let pb = ctx.scratch(acc_dtype(flavor), &[chunks as i64, h as i64])?;
    ctx.launch(flavor, "pc_norm_layer_partials", &[h, chunks], None, |a| {
        a.tensor(&g)?
            .tensor(&x)?
            .tensor(&mean)?
            .tensor(&rstd)?
            .mem(pw.mem())?
            .mem(pb.mem())?
            .value(h as i64)?
            .value(rows as i64)?
            .value(chunk as i64)?;
        Ok(())
    })?;
    colsum(&ctx, flavor, &pw, chunks, &dw, h)?;
    colsum(&ctx, flavor, &pb, chunks, &db, h)?;
    drop((pw, pb));
    ctx.finish()
}

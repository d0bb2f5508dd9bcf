//! sum, mean, max, argmax and sum_squares (`kernels/reduce.cl`).
//!
//! A reduction over dimension `dim` sees the (packed, compact) input as
//! `[outer, n, inner]`; output element `o * inner + i` reduces lane
//! `(o, :, i)`, which is also where it sits in the compact output whether
//! `keepdim` keeps an extent-1 dimension or not. Many outputs or short lanes
//! get one work-item per output (a blocked sequential scan); few long lanes
//! get one work-group each (strided partials, then a tree in local memory).
//! `max` is the value of `argmax`'s element, so NaN, the first of equal
//! values and signed zeros come out as the reference scans them.
//!
//! `sum_squares` is two stages, both with a fixed shape for a given length
//! (so the result is reproducible): a grid of work-groups writes one
//! partial sum each, and one work-group adds them up.

use polychip_plugin_sdk::{
    CumsumArgs, DType, Error, ReduceArgs, ReduceBoolArgs, ReduceBoolOp, ReduceOp, Result,
    SumSquaresArgs,
};

use crate::call::Ctx;
use crate::program::Flavor;

/// Lanes this short are scanned by one work-item whatever their number.
const SHORT_LANE: usize = 64;
/// This many outputs keep a device busy with one work-item each.
const MANY_OUTPUTS: usize = 8192;
/// sum_squares: elements per work-item aimed at in stage 1, and the most
/// work-groups stage 1 uses.
const SUMSQ_PER_ITEM: usize = 32;
const SUMSQ_MAX_GROUPS: usize = 512;

/// `sum`, `mean`, `max`, `argmax`.
pub fn reduce(mut ctx: Ctx<'_>, op: ReduceOp, args: &ReduceArgs<'_>) -> Result<()> {
    let x = ctx.input("input", &args.input)?;
    let d = args.dim;
    let dims: Vec<usize> = x.shape.iter().map(|&e| e as usize).collect();
    let outer: usize = dims[..d].iter().product();
    let n = dims[d];
    let inner: usize = dims[d + 1..].iter().product();
    if op == ReduceOp::Argmax && n == 0 {
        return Err(Error::invalid(format!(
            "opencl: argmax: dimension {d} of input {:?} is empty, so there is no maximum",
            x.shape
        )));
    }
    let out = ctx.output("out", &args.out)?;
    let flavor = ctx.float(x.dtype)?;
    let outputs = outer * inner;
    let wg = ctx.programs.wg;
    let lane = n <= SHORT_LANE || outputs >= MANY_OUTPUTS;
    let (n, inner_i, outputs_i) = (n as i64, inner as i64, outputs as i64);
    match op {
        ReduceOp::Sum | ReduceOp::Mean => {
            let mean = i32::from(op == ReduceOp::Mean);
            if lane {
                ctx.launch(flavor, "pc_reduce_sum_lane", &[outputs], None, |a| {
                    a.tensor(&x)?
                        .tensor(&out)?
                        .value(outputs_i)?
                        .value(n)?
                        .value(inner_i)?
                        .value(mean)?;
                    Ok(())
                })?;
            } else {
                ctx.launch(
                    flavor,
                    "pc_reduce_sum_group",
                    &[outputs * wg],
                    Some(&[wg]),
                    |a| {
                        a.tensor(&x)?
                            .tensor(&out)?
                            .value(n)?
                            .value(inner_i)?
                            .value(mean)?;
                        Ok(())
                    },
                )?;
            }
        }
        ReduceOp::Max | ReduceOp::Argmax => {
            let index = i32::from(op == ReduceOp::Argmax);
            if lane {
                ctx.launch(flavor, "pc_reduce_max_lane", &[outputs], None, |a| {
                    a.tensor(&x)?
                        .mem(out.mem())?
                        .tensor(&out)?
                        .value(outputs_i)?
                        .value(n)?
                        .value(inner_i)?
                        .value(index)?;
                    Ok(())
                })?;
            } else {
                ctx.launch(
                    flavor,
                    "pc_reduce_max_group",
                    &[outputs * wg],
                    Some(&[wg]),
                    |a| {
                        a.tensor(&x)?
                            .mem(out.mem())?
                            .tensor(&out)?
                            .value(n)?
                            .value(inner_i)?
                            .value(index)?;
                        Ok(())
                    },
                )?;
            }
        }
    }
    ctx.finish()
}

/// `sum_squares`.
pub fn sum_squares(mut ctx: Ctx<'_>, args: &SumSquaresArgs<'_>) -> Result<()> {
    let x = ctx.input("input", &args.input)?;
    let out = ctx.output("out", &args.out)?;
    let flavor = ctx.float(x.dtype)?;
    let wg = ctx.programs.wg;
    let n = x.numel();
    let groups = n.div_ceil(wg * SUMSQ_PER_ITEM).min(SUMSQ_MAX_GROUPS);
    // Partial sums in the accumulator type of the program.
    let part_dtype = if flavor == Flavor::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let part = ctx.scratch(part_dtype, &[groups.max(1) as i64])?;
    ctx.launch(
        flavor,
        "pc_sumsq_partial",
        &[groups * wg],
        Some(&[wg]),
        |a| {
            a.tensor(&x)?.value(n as i64)?.mem(part.mem())?;
            Ok(())
        },
    )?;
    ctx.launch(flavor, "pc_sumsq_final", &[wg], Some(&[wg]), |a| {
        a.mem(part.mem())?.value(groups as i64)?.tensor(&out)?;
        Ok(())
    })?;
    ctx.finish()
}

/// `[outer, n, inner]` of `shape` around dimension `d`.
fn lanes(shape: &[i64], d: usize) -> (usize, usize, usize) {
    let dims: Vec<usize> = shape.iter().map(|&e| e as usize).collect();
    (
        dims[..d].iter().product(),
        dims[d],
        dims[d + 1..].iter().product(),
    )
}

/// `any` and `all` (ABI 1.4): one work-item per output, over the packed
/// input's lane, by the bits of the element's width.
pub fn reduce_bool(mut ctx: Ctx<'_>, op: ReduceBoolOp, args: &ReduceBoolArgs<'_>) -> Result<()> {
    let x = ctx.input("input", &args.input)?;
    let (outer, n, inner) = lanes(&x.shape, args.dim);
    let out = ctx.output("out", &args.out)?;
    let outputs = outer * inner;
    let every = i32::from(op == ReduceBoolOp::All);
    let is_float = i32::from(Flavor::float(x.dtype).is_some());
    if outputs > 0 {
        ctx.launch(
            Flavor::bits(x.dtype),
            "pc_reduce_bool",
            &[outputs],
            None,
            |a| {
                a.tensor(&x)?
                    .tensor(&out)?
                    .value(outputs as i64)?
                    .value(n as i64)?
                    .value(inner as i64)?
                    .value(every)?
                    .value(is_float)?;
                Ok(())
            },
        )?;
    }
    ctx.finish()
}

/// `cumsum` (ABI 1.4): one work-item per lane, a running sum in f32 (f64
/// for f64) or wrapping integers.
pub fn cumsum(mut ctx: Ctx<'_>, args: &CumsumArgs<'_>) -> Result<()> {
    let x = ctx.input("input", &args.input)?;
    let (outer, n, inner) = lanes(&x.shape, args.dim);
    let out = ctx.output("out", &args.out)?;
    let count = outer * inner;
    let (flavor, kernel) = match Flavor::float(x.dtype) {
        Some(f) => (f, "pc_cumsum"),
        None => (Flavor::bits(x.dtype), "pc_cumsum_int"),
    };
    if count > 0 && n > 0 {
        ctx.launch(flavor, kernel, &[count], None, |a| {
            a.tensor(&x)?
                .tensor(&out)?
                .value(count as i64)?
                .value(n as i64)?
                .value(inner as i64)?;
            Ok(())
        })?;
    }
    ctx.finish()
}

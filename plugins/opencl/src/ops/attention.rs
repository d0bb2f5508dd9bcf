//! attention and its backward, rope and its backward (`kernels/attention.cl`).
//!
//! Every tensor is handed to the kernels compact (strided inputs packed,
//! strided outputs written through scratch). Attention is flash style: a
//! work-group of [`WG`] work-items owns a block of [`ROWS`] rows and
//! streams tiles of [`COLS`] rows of the other side through local memory.
//! The forward pass and the dQ pass of the backward run one work-group per
//! (query block, batch and query head), the dK/dV pass one per (key block,
//! batch and kv head), walking every query head of its group; the backward
//! recomputes the probabilities from the saved log-sum-exp, after a first
//! pass of the row dots `dO . out`. No atomics: every output element is
//! summed by one work-item in a fixed order, so results are deterministic.

use polychip_plugin_sdk::{AttentionArgs, AttentionBackwardArgs, DType, Error, Result, RopeArgs};

use crate::call::{Ctx, Operand};
use crate::ops::scalar;
use crate::program::Args;

/// Rows of a work-group's block (`PC_ATT_R` in the kernels): queries in
/// the forward and dQ passes, keys in the dK/dV pass.
const ROWS: usize = 64;
/// Rows of a streamed tile (`PC_ATT_C`).
const COLS: usize = 32;
/// Work-items per attention work-group (`PC_ATT_WG`).
const WG: usize = 64;

/// `rope`.
pub fn rope(ctx: Ctx<'_>, args: &RopeArgs<'_>) -> Result<()> {
    rotate(ctx, args, 1.0)
}

/// `rope_backward`: the rotation by `-theta`.
pub fn rope_backward(ctx: Ctx<'_>, args: &RopeArgs<'_>) -> Result<()> {
    rotate(ctx, args, -1.0)
}

fn rotate(mut ctx: Ctx<'_>, args: &RopeArgs<'_>, sign: f32) -> Result<()> {
    let x = ctx.input("input", &args.input)?;
    let cos = ctx.input("cos", &args.cos)?;
    let sin = ctx.input("sin", &args.sin)?;
    let out = ctx.output("out", &args.out)?;
    let flavor = ctx.float(x.dtype)?;
    let [_, seq, heads, d] = dims4(&x);
    let n = x.numel() / 2;
    ctx.launch(flavor, "pc_rope", &[n], None, |a| {
        a.tensor(&x)?
            .tensor(&cos)?
            .tensor(&sin)?
            .tensor(&out)?
            .value(seq)?
            .value(heads)?
            .value(d)?
            .value(i32::from(args.interleaved))?
            .value(sign)?
            .value(n as i64)?;
        Ok(())
    })?;
    ctx.finish()
}

/// The four extents of a rank-4 operand.
fn dims4(t: &Operand) -> [i64; 4] {
    [t.shape[0], t.shape[1], t.shape[2], t.shape[3]]
}

/// A `__local` array of an attention kernel: so many rows of `D`, or of
/// `D` rounded up to 8 (the tiles read 8 columns at a time).
#[derive(Debug, Clone, Copy)]
enum Tile {
    /// `rows x D` (or its transpose).
    D(usize),
    /// `rows x round_up(D, 8)`.
    Padded(usize),
}

/// The sizes in bytes of a kernel's `__local` array arguments, after
/// checking that they and the kernel's own `fixed` elements fit the
/// device's local memory (and that it runs work-groups of [`WG`]).
fn local_sizes(
    ctx: &Ctx<'_>,
    dtype: DType,
    d: i64,
    tiles: &[Tile],
    fixed: usize,
) -> Result<Vec<usize>> {
    let elem = if dtype == DType::F64 { 8 } else { 4 };
    let d = d as usize;
    let sizes: Vec<usize> = tiles
        .iter()
        .map(|&t| {
            let elems = match t {
                Tile::D(rows) => rows * d,
                Tile::Padded(rows) => rows * d.div_ceil(8) * 8,
            };
            // OpenCL refuses a 0-byte local argument.
            elems.max(8) * elem
        })
        .collect();
    let need = sizes.iter().sum::<usize>() + fixed * elem;
    if need as u64 > ctx.device.info.local_mem || ctx.device.info.max_work_group < WG {
        return Err(Error::unimplemented(format!(
            "opencl: {}: head_dim {d} needs {need} bytes of local memory and work-groups of {WG} \
             work-items; {} has {} bytes and at most {}",
            ctx.op, ctx.device.info.name, ctx.device.info.local_mem, ctx.device.info.max_work_group
        )));
    }
    Ok(sizes)
}

/// Sizes of an attention call: `[b, hq, sq, d]`, `[hkv, skv]`.
fn geometry(q: &Operand, k: &Operand) -> ([i64; 4], [i64; 2]) {
    let [b, hq, sq, d] = dims4(q);
    let [_, hkv, skv, _] = dims4(k);
    ([b, hq, sq, d], [hkv, skv])
}

/// The global size of one work-group per block of `ROWS` of `n` rows and
/// per `heads`.
fn grid(n: i64, heads: i64) -> [usize; 2] {
    [(n as usize).div_ceil(ROWS) * WG, heads as usize]
}

/// `attention`.
pub fn attention(mut ctx: Ctx<'_>, args: &AttentionArgs<'_>) -> Result<()> {
    let q = ctx.input("q", &args.q)?;
    let k = ctx.input("k", &args.k)?;
    let v = ctx.input("v", &args.v)?;
    let out = ctx.output("out", &args.out)?;
    let lse = ctx.output("lse", &args.lse)?;
    let flavor = ctx.float(q.dtype)?;
    let ([b, hq, sq, d], [hkv, skv]) = geometry(&q, &k);
    // qs, kt, vs, os; then ps and three row vectors.
    let local = local_sizes(
        &ctx,
        q.dtype,
        d,
        &[
            Tile::D(ROWS),
            Tile::D(COLS),
            Tile::Padded(COLS),
            Tile::Padded(ROWS),
        ],
        ROWS * COLS + 3 * ROWS,
    )?;
    ctx.launch(
        flavor,
        "pc_attention_fwd",
        &grid(sq, b * hq),
        Some(&[WG, 1]),
        |a| {
            for t in [&q, &k, &v, &out, &lse] {
                a.tensor(t)?;
            }
            a.value(hq)?.value(hkv)?.value(sq)?.value(skv)?.value(d)?;
            scalar(a, flavor, args.scale)?.value(i32::from(args.causal))?;
            for &bytes in &local {
                a.local(bytes)?;
            }
            Ok(())
        },
    )?;
    ctx.finish()
}

/// `attention_backward`.
pub fn attention_backward(mut ctx: Ctx<'_>, args: &AttentionBackwardArgs<'_>) -> Result<()> {
    let q = ctx.input("q", &args.q)?;
    let k = ctx.input("k", &args.k)?;
    let v = ctx.input("v", &args.v)?;
    let out = ctx.input("out", &args.out)?;
    let lse = ctx.input("lse", &args.lse)?;
    let go = ctx.input("grad_out", &args.grad_out)?;
    let gq = ctx.output("grad_q", &args.grad_q)?;
    let gk = ctx.output("grad_k", &args.grad_k)?;
    let gv = ctx.output("grad_v", &args.grad_v)?;
    let flavor = ctx.float(q.dtype)?;
    let ([b, hq, sq, d], [hkv, skv]) = geometry(&q, &k);
    let causal = i32::from(args.causal);

    // dvec = rowsum(dO * out), f32 [b * hq * sq].
    let rows = (b * hq * sq) as usize;
    let dvec = ctx.scratch(DType::F32, &[rows as i64])?;
    ctx.launch(flavor, "pc_attention_bwd_rowdot", &[rows], None, |a| {
        a.tensor(&go)?
            .tensor(&out)?
            .mem(dvec.mem())?
            .value(d)?
            .value(rows as i64)?;
        Ok(())
    })?;
    // The arguments both passes start with.
    let inputs = |a: &mut Args<'_>| -> Result<()> {
        for t in [&q, &k, &v, &go, &lse] {
            a.tensor(t)?;
        }
        a.mem(dvec.mem())?;
        Ok(())
    };
    // The arguments between the outputs and the local arrays.
    let sizes = |a: &mut Args<'_>| -> Result<()> {
        a.value(hq)?.value(hkv)?.value(sq)?.value(skv)?.value(d)?;
        scalar(a, flavor, args.scale)?.value(causal)?;
        Ok(())
    };

    if gq.numel() > 0 {
        // qs, gos, kt, vt, ks, dqs; then ds and two row vectors.
        let local = local_sizes(
            &ctx,
            q.dtype,
            d,
            &[
                Tile::D(ROWS),
                Tile::D(ROWS),
                Tile::D(COLS),
                Tile::D(COLS),
                Tile::Padded(COLS),
                Tile::Padded(ROWS),
            ],
            ROWS * COLS + 2 * ROWS,
        )?;
        ctx.launch(
            flavor,
            "pc_attention_bwd_dq",
            &grid(sq, b * hq),
            Some(&[WG, 1]),
            |a| {
                inputs(a)?;
                a.tensor(&gq)?;
                sizes(a)?;
                for &bytes in &local {
                    a.local(bytes)?;
                }
                Ok(())
            },
        )?;
    }

    if gk.numel() > 0 {
        // ks, vs, qt, got, qr, gor, dks, dvs; then ps, dss and two row
        // vectors.
        let local = local_sizes(
            &ctx,
            q.dtype,
            d,
            &[
                Tile::D(ROWS),
                Tile::D(ROWS),
                Tile::D(COLS),
                Tile::D(COLS),
                Tile::Padded(COLS),
                Tile::Padded(COLS),
                Tile::Padded(ROWS),
                Tile::Padded(ROWS),
            ],
            2 * ROWS * COLS + 2 * COLS,
        )?;
        ctx.launch(
            flavor,
            "pc_attention_bwd_dkv",
            &grid(skv, b * hkv),
            Some(&[WG, 1]),
            |a| {
                inputs(a)?;
                a.tensor(&gk)?.tensor(&gv)?;
                sizes(a)?;
                for &bytes in &local {
                    a.local(bytes)?;
                }
                Ok(())
            },
        )?;
    }
    ctx.finish()
}

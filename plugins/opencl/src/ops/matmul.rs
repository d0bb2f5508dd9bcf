//! matmul and linear (`kernels/matmul.cl`): one tiled kernel that reads
//! every operand in its own strides, so nothing is packed (a transposed
//! operand, or one transposed in memory, is a swap of its row and column
//! strides; a broadcast batch dimension has stride 0).
//!
//! The batch dimensions and the rows (M) are merged where the strides
//! allow: a batch of `a` over a broadcast `b`, and linear's `[..., K]`
//! input, become one tall product. A product of too few tiles to fill the
//! device but a long K (`[16, 11008] x [11008, 64]`) is split along K: each
//! range of K sums into f32 (f64) scratch, and a second kernel adds the
//! ranges in order and applies alpha, the bias and beta.

use polychip_plugin_sdk::{DType, LinearArgs, MatmulArgs, Result};

use crate::call::{Ctx, Operand, joint_layouts};
use crate::ops::scalar;

/// Per-work-item block edge in `matmul.cl`.
const BLOCK: usize = 8;

/// The shortest range of K worth a separate partial sum.
const MIN_SPLIT: i64 = 256;

/// The most ranges of K one product is split into.
const MAX_SPLITS: i64 = 64;

/// Work-group edge of the kernel for a program built with `PC_WG = wg`
/// (`PC_MM_W` in `matmul.cl`).
fn group_edge(wg: usize) -> usize {
    match wg {
        64.. => 8,
        16.. => 4,
        4.. => 2,
        _ => 1,
    }
}

/// `x / d` rounded up (`x >= 0`, `d > 0`).
fn ceil_div(x: i64, d: i64) -> i64 {
    (x + d - 1) / d
}

/// Strides of a tensor's leading dimensions `shape_t`/`strides_t`
/// broadcast to `batch` (aligned at the end; extent 1 or missing: 0).
fn broadcast(shape_t: &[i64], strides_t: &[i64], batch: &[i64]) -> Vec<i64> {
    let lead = batch.len() - shape_t.len();
    (0..batch.len())
        .map(|d| {
            if d < lead || shape_t[d - lead] == 1 {
                0
            } else {
                strides_t[d - lead]
            }
        })
        .collect()
}

/// One product `out = alpha * a @ b (+ bias) (+ beta * out)` over the rows
/// shape `rows` (the batch dimensions, then M).
struct Gemm<'o> {
    rows: Vec<i64>,
    n: i64,
    k: i64,
    /// `a`, its strides over `rows`, and its stride along K.
    a: (&'o Operand, Vec<i64>, i64),
    /// `b`, its strides over `rows` (0 along M), and its strides along K
    /// and N.
    b: (&'o Operand, Vec<i64>, i64, i64),
    /// `out`, its strides over `rows`, and its stride along N.
    out: (&'o Operand, Vec<i64>, i64),
    /// `bias` and its stride along N.
    bias: Option<(&'o Operand, i64)>,
    alpha: f64,
    beta: f64,
}

impl Gemm<'_> {
    fn run(&self, ctx: &Ctx<'_>) -> Result<()> {
        let out = self.out.0;
        if out.numel() == 0 {
            return Ok(());
        }
        let flavor = ctx.float(out.dtype)?;
        let mut layouts = joint_layouts(
            &self.rows,
            &[
                (self.a.0.offset, &self.a.1),
                (self.b.0.offset, &self.b.1),
                (out.offset, &self.out.1),
            ],
        )?;
        // The innermost dimension left is the rows when b does not move
        // along it (M, merged with the batch dimensions over which b is
        // broadcast); otherwise M is 1.
        let d = layouts[0].ndim as usize;
        let (m, a_rs, o_rs) = if d > 0 && layouts[1].stride[d - 1] == 0 {
            let m = layouts[0].shape[d - 1];
            let strides = (layouts[0].stride[d - 1], layouts[2].stride[d - 1]);
            for l in &mut layouts {
                l.ndim -= 1;
                l.shape[d - 1] = 0;
                l.stride[d - 1] = 0;
            }
            (m, strides.0, strides.1)
        } else {
            (1, 0, 0)
        };
        let batch: i64 = layouts[0].shape[..layouts[0].ndim as usize]
            .iter()
            .product();
        let w = group_edge(ctx.programs.wg);
        let tile = (w * BLOCK) as i64;
        // Short products (M up to a short tile) in tiles of fewer rows.
        let short = (if w >= 2 { 2 } else { 1 }) * BLOCK as i64;
        let (kernel, wy, tile_m) = if m <= short && short < tile {
            ("pc_matmul_gemm_short", short as usize / BLOCK, short)
        } else {
            ("pc_matmul_gemm", w, tile)
        };
        let tiles = ceil_div(self.n, tile) * ceil_div(m, tile_m) * batch;
        let (splits, kc) = self.splits(ctx, tiles);
        let global = [
            ceil_div(self.n, tile) as usize * w,
            ceil_div(m, tile_m) as usize * wy,
            (batch * splits) as usize,
        ];
        let (bias, bias_off, bias_stride, has_bias) = match self.bias {
            Some((b, s)) => (b.mem(), b.offset, s, 1i32),
            None => (out.mem(), 0, 0, 0),
        };
        let part = if splits > 1 {
            let acc = if out.dtype == DType::F64 {
                DType::F64
            } else {
                DType::F32
            };
            Some(ctx.scratch(acc, &[splits, batch, m, self.n])?)
        } else {
            None
        };
        let part_mem = part.as_ref().map_or(out.mem(), Operand::mem);
        ctx.launch(flavor, kernel, &global, Some(&[w, wy, 1]), |k| {
            k.mem(self.a.0.mem())?
                .value(layouts[0])?
                .value(a_rs)?
                .value(self.a.2)?;
            k.mem(self.b.0.mem())?
                .value(layouts[1])?
                .value(self.b.2)?
                .value(self.b.3)?;
            k.mem(out.mem())?
                .value(layouts[2])?
                .value(o_rs)?
                .value(self.out.2)?;
            k.mem(bias)?
                .value(bias_off)?
                .value(bias_stride)?
                .value(has_bias)?;
            k.value(m)?.value(self.n)?.value(self.k)?;
            scalar(k, flavor, self.alpha)?;
            scalar(k, flavor, self.beta)?;
            k.value(splits as i32)?.value(kc)?.mem(part_mem)?;
            Ok(())
        })?;
        if splits == 1 {
            return Ok(());
        }
        let global = [self.n as usize, m as usize, batch as usize];
        ctx.launch(flavor, "pc_matmul_split_sum", &global, None, |k| {
            k.mem(part_mem)?.value(splits as i32)?;
            k.mem(out.mem())?
                .value(layouts[2])?
                .value(o_rs)?
                .value(self.out.2)?;
            k.mem(bias)?
                .value(bias_off)?
                .value(bias_stride)?
                .value(has_bias)?;
            k.value(m)?.value(self.n)?;
            scalar(k, flavor, self.alpha)?;
            scalar(k, flavor, self.beta)?;
            Ok(())
        })
    }

    /// How many ranges of K to sum separately (and each one's length) so
    /// that a product of few `tiles` but a long K still fills the device:
    /// about two work-groups a compute unit, each range at least
    /// [`MIN_SPLIT`] long.
    fn splits(&self, ctx: &Ctx<'_>, tiles: i64) -> (i64, i64) {
        let units = i64::from(ctx.device.info.compute_units.max(1));
        if self.alpha == 0.0 || tiles >= 2 * units || self.k < 2 * MIN_SPLIT {
            return (1, self.k);
        }
        let want = ceil_div(2 * units, tiles);
        let splits = want.min(self.k / MIN_SPLIT).min(MAX_SPLITS);
        if splits < 2 {
            return (1, self.k);
        }
        let kc = ceil_div(ceil_div(self.k, splits), 32) * 32;
        (ceil_div(self.k, kc), kc)
    }
}

/// `matmul`.
pub fn matmul(ctx: Ctx<'_>, args: &MatmulArgs<'_>) -> Result<()> {
    let a = ctx.view("a", &args.a)?;
    let b = ctx.view("b", &args.b)?;
    let out = ctx.view("out", &args.out)?;
    let (ra, rb, ro) = (a.shape.len(), b.shape.len(), out.shape.len());
    // (rows, columns, row stride, column stride) of op(x).
    let last2 = |x: &Operand, r: usize, t: bool| {
        let (d0, d1) = (x.shape[r - 2], x.shape[r - 1]);
        let (s0, s1) = (x.strides[r - 2], x.strides[r - 1]);
        if t {
            (d1, d0, s1, s0)
        } else {
            (d0, d1, s0, s1)
        }
    };
    let (m, k, a_rs, a_cs) = last2(&a, ra, args.transpose_a);
    let (_, n, b_rs, b_cs) = last2(&b, rb, args.transpose_b);
    let batch = &out.shape[..ro - 2];
    let mut rows = batch.to_vec();
    rows.push(m);
    let mut a_rows = broadcast(&a.shape[..ra - 2], &a.strides[..ra - 2], batch);
    a_rows.push(a_rs);
    let mut b_rows = broadcast(&b.shape[..rb - 2], &b.strides[..rb - 2], batch);
    b_rows.push(0);
    let mut o_rows = out.strides[..ro - 2].to_vec();
    o_rows.push(out.strides[ro - 2]);
    Gemm {
        rows,
        n,
        k,
        a: (&a, a_rows, a_cs),
        b: (&b, b_rows, b_rs, b_cs),
        out: (&out, o_rows, out.strides[ro - 1]),
        bias: None,
        alpha: args.alpha,
        beta: args.beta,
    }
    .run(&ctx)?;
    ctx.finish()
}

/// `linear`: `input [..., K] @ weight[N, K]^T (+ bias)`, the weight read
/// through its strides as a `[K, N]` operand.
pub fn linear(ctx: Ctx<'_>, args: &LinearArgs<'_>) -> Result<()> {
    let x = ctx.view("input", &args.input)?;
    let w = ctx.view("weight", &args.weight)?;
    let bias = match &args.bias {
        Some(b) => Some(ctx.view("bias", b)?),
        None => None,
    };
    let out = ctx.view("out", &args.out)?;
    let r = x.shape.len();
    let ro = out.shape.len();
    Gemm {
        rows: x.shape[..r - 1].to_vec(),
        n: w.shape[0],
        k: w.shape[1],
        a: (&x, x.strides[..r - 1].to_vec(), x.strides[r - 1]),
        b: (&w, vec![0; r - 1], w.strides[1], w.strides[0]),
        out: (&out, out.strides[..ro - 1].to_vec(), out.strides[ro - 1]),
        bias: bias.as_ref().map(|b| (b, b.strides[0])),
        alpha: 1.0,
        beta: 0.0,
    }
    .run(&ctx)?;
    ctx.finish()
}

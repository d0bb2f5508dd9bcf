//! `matmul`: batched `out = alpha * op(a) @ op(b) + beta * out` with NumPy
//! broadcasting of the batch dimensions. `f32`/`f64` go straight to the
//! `gemm` crate with the views' own row/column strides (no copies, whatever
//! the transposition); `f16`/`bf16` are handled in `matmul_half`. Many small
//! matrices run in parallel over the batch; one large one lets `gemm` use the
//! rayon pool; tiny ones use a plain loop on the calling thread.

use crate::dtype::DType;
use crate::error::{KernelError, bail};
use crate::float::Real;
use crate::matmul_half;
use crate::parallel::{SyncPtr, chunk_count, for_each_range};
use crate::shape::{SmallDims, broadcast_strides};
use crate::view::View;
use gemm::Parallelism;

/// Flops (m*n*k) from which one matrix is worth threading inside `gemm`.
const GEMM_PAR_FLOPS: usize = 64 * 64 * 64;
/// Flops up to which a plain loop beats `gemm`'s setup cost.
const TINY_FLOPS: usize = 32;

/// Batched matrix product `out = alpha * op(a) @ op(b) + beta * out`, where
/// `op(x)` transposes the last two dimensions when asked. `a` is
/// `[batch.., M, K]` (`[.., K, M]` transposed), `b` is `[batch.., K, N]`
/// (`[.., N, K]` transposed), `out` is `[batch.., M, N]`; batch dimensions of
/// `a` and `b` broadcast to `out`'s. With `beta == 0` `out` is not read;
/// with `alpha == 0` `a` and `b` are not read.
/// Float dtypes only, all the same.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `out` must not overlap `a`, `b` or itself.
pub unsafe fn matmul(
    a: &View,
    b: &View,
    out: &View,
    transpose_a: bool,
    transpose_b: bool,
    alpha: f64,
    beta: f64,
) -> Result<(), KernelError> {
    a.validate("matmul", "a")?;
    b.validate("matmul", "b")?;
    out.validate("matmul", "out")?;
    let dt = out.dtype;
    if !dt.is_float() || a.dtype != dt || b.dtype != dt {
        bail!(
            "matmul: need one float dtype, got a={:?} b={:?} out={:?}",
            a.dtype,
            b.dtype,
            out.dtype
        );
    }
    let mut g = Geometry::new(a, b, out, transpose_a, transpose_b)?;
    if alpha == 0.0 {
        // BLAS convention: `a` and `b` are not read.
        g.k = 0;
    }
    if g.m == 0 || g.n == 0 || g.batch() == 0 {
        return Ok(());
    }
    let ptrs = [out.ptr, a.ptr, b.ptr].map(SyncPtr::new);
    // SAFETY: forwarded from this function's contract.
    unsafe {
        match dt {
            DType::F32 => native::<f32>(&g, ptrs, alpha as f32, beta as f32),
            DType::F64 => native::<f64>(&g, ptrs, alpha, beta),
            _ => matmul_half::run(dt, &g, ptrs, alpha as f32, beta as f32),
        }
    }
    Ok(())
}

/// The batch part (all but the last two dimensions) of a view.
fn batch_of<'v>(v: &View<'v>, r: usize) -> View<'v> {
    View {
        shape: &v.shape[..r - 2],
        strides: &v.strides[..r - 2],
        ..*v
    }
}

/// Sizes and element strides of one matmul problem and its batch.
#[derive(Debug)]
pub(crate) struct Geometry<'a> {
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    /// (row, column) strides of `op(a)` (m x k), `op(b)` (k x n), `out` (m x n).
    pub(crate) a: (isize, isize),
    pub(crate) b: (isize, isize),
    pub(crate) o: (isize, isize),
    batch_shape: &'a [i64],
    /// Batch strides of out, a, b (broadcast to `batch_shape`).
    batch_strides: [SmallDims<i64>; 3],
}

impl<'a> Geometry<'a> {
    fn new(a: &View, b: &View, out: &'a View, ta: bool, tb: bool) -> Result<Self, KernelError> {
        let (ra, rb, ro) = (a.shape.len(), b.shape.len(), out.shape.len());
        if ra < 2 || rb < 2 || ro < 2 {
            bail!("matmul: operands need at least 2 dims, got {ra}, {rb}, {ro}");
        }
        let last2 = |v: &View, r: usize, t: bool| {
            let (d0, d1) = (v.shape[r - 2], v.shape[r - 1]);
            let (s0, s1) = (v.strides[r - 2] as isize, v.strides[r - 1] as isize);
            if t {
                (d1, d0, (s1, s0))
            } else {
                (d0, d1, (s0, s1))
            }
        };
        let (m, k, sa) = last2(a, ra, ta);
        let (k2, n, sb) = last2(b, rb, tb);
        let (mo, no, so) = last2(out, ro, false);
        if k != k2 || m != mo || n != no {
            bail!(
                "matmul: shapes {:?}{} @ {:?}{} do not give {:?}",
                a.shape,
                if ta { "^T" } else { "" },
                b.shape,
                if tb { "^T" } else { "" },
                out.shape
            );
        }
        let batch_shape = &out.shape[..ro - 2];
        let batch_strides = [
            broadcast_strides("matmul: out batch", &batch_of(out, ro), batch_shape)?,
            broadcast_strides("matmul: a batch", &batch_of(a, ra), batch_shape)?,
            broadcast_strides("matmul: b batch", &batch_of(b, rb), batch_shape)?,
        ];
        Ok(Self {
            m: m as usize,
            n: n as usize,
            k: k as usize,
            a: sa,
            b: sb,
            o: so,
            batch_shape,
            batch_strides,
        })
    }

    /// Number of matrices in the batch.
    pub(crate) fn batch(&self) -> usize {
        self.batch_shape.iter().map(|&n| n as usize).product()
    }

    /// Flops-ish work of one matrix (at least 1).
    pub(crate) fn per_matrix(&self) -> usize {
        self.m.saturating_mul(self.n).saturating_mul(self.k).max(1)
    }

    /// Element offsets of batch entry `bi` in out, a and b.
    pub(crate) fn offsets(&self, bi: usize) -> [isize; 3] {
        let mut rem = bi;
        let mut off = [0isize; 3];
        for d in (0..self.batch_shape.len()).rev() {
            let n = self.batch_shape[d] as usize;
            let i = (rem % n) as isize;
            rem /= n;
            for (o, s) in off.iter_mut().zip(&self.batch_strides) {
                *o += i * s.as_slice()[d] as isize;
            }
        }
        off
    }

    /// Runs `f(first, count, parallelism)` over the batch: pieces of the
    /// batch in parallel when there are many smallish matrices, otherwise
    /// everything here with `gemm` threading large matrices itself.
    pub(crate) fn schedule<F>(&self, f: F)
    where
        F: Fn(usize, usize, Parallelism) + Sync,
    {
        let (batch, per) = (self.batch(), self.per_matrix());
        let threads = crate::parallel::threads();
        let over_batch = batch > 1
            && chunk_count(batch, per) > 1
            && (per < 4 * GEMM_PAR_FLOPS || batch >= 2 * threads);
        if over_batch {
            for_each_range(batch, per, |first, count| {
                f(first, count, Parallelism::None)
            });
        } else if per >= GEMM_PAR_FLOPS && threads > 1 {
            f(0, batch, Parallelism::Rayon(threads));
        } else {
            f(0, batch, Parallelism::None);
        }
    }
}

/// # Safety
/// As for [`matmul`], with `T` matching the dtype.
unsafe fn native<T: Real>(g: &Geometry, ptrs: [SyncPtr; 3], alpha: T, beta: T) {
    let tiny = g.per_matrix() <= TINY_FLOPS;
    g.schedule(|first, count, par| {
        for bi in first..first + count {
            let [oo, oa, ob] = g.offsets(bi);
            let o = (ptrs[0].get() as *mut T).wrapping_offset(oo);
            let a = (ptrs[1].get() as *const T).wrapping_offset(oa);
            let b = (ptrs[2].get() as *const T).wrapping_offset(ob);
            // SAFETY: the offsets address matrices inside the caller's views.
            unsafe {
                if tiny {
                    naive(g, o, a, b, alpha, beta);
                } else {
                    gemm::gemm(
                        g.m,
                        g.n,
                        g.k,
                        o,
                        g.o.1,
                        g.o.0,
                        beta != T::ZERO,
                        a,
                        g.a.1,
                        g.a.0,
                        b,
                        g.b.1,
                        g.b.0,
                        beta,
                        alpha,
                        false,
                        false,
                        false,
                        par,
                    );
                }
            }
        }
    });
}

/// Plain triple loop for tiny matrices.
///
/// # Safety
/// The three matrices described by `g` at `o`, `a`, `b` must be valid.
unsafe fn naive<T: Real>(g: &Geometry, o: *mut T, a: *const T, b: *const T, alpha: T, beta: T) {
    for i in 0..g.m as isize {
        for j in 0..g.n as isize {
            let mut acc = T::ZERO;
            for p in 0..g.k as isize {
                // SAFETY: indices stay within the m x k and k x n matrices.
                unsafe {
                    acc = acc + *a.offset(i * g.a.0 + p * g.a.1) * *b.offset(p * g.b.0 + j * g.b.1);
                }
            }
            // SAFETY: (i, j) is inside the m x n output.
            unsafe {
                let dst = o.offset(i * g.o.0 + j * g.o.1);
                *dst = if beta == T::ZERO {
                    alpha * acc
                } else {
                    alpha * acc + beta * *dst
                };
            }
        }
    }
}

//! What attention forward and backward share: argument checks and geometry
//! (grouped-query heads, causal visibility aligned at the end), access to
//! blocks of rows of `[batch, heads, seq, D]` tensors (zero-copy for `f32`
//! rows with unit column stride, otherwise widened into `f32` scratch), and
//! a thin wrapper over `gemm` for the block products.

use crate::convert::{load_f32, store_f32};
use crate::dtype::DType;
use crate::error::{KernelError, bail};
use crate::map::{check_f32, check_float, check_shape};
use crate::parallel::SyncPtr;
use crate::view::View;
use gemm::Parallelism;

/// Query rows per block.
pub(crate) const BR: usize = 64;
/// Key rows per block.
pub(crate) const BC: usize = 128;
/// Row stride of score blocks: [`BC`] padded so rows do not alias in the
/// cache.
pub(crate) const LDS: usize = BC + 16;

/// Sizes of one attention problem.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geom {
    pub(crate) b: usize,
    pub(crate) hq: usize,
    pub(crate) hkv: usize,
    pub(crate) sq: usize,
    pub(crate) skv: usize,
    pub(crate) d: usize,
    pub(crate) scale: f32,
    pub(crate) causal: bool,
}

impl Geom {
    /// Checks `q`, `k`, `v`, `out` (float, one dtype) and `lse` (f32).
    pub(crate) fn new(
        kernel: &str,
        [q, k, v, out, lse]: [&View; 5],
        scale: f64,
        causal: bool,
    ) -> Result<Self, KernelError> {
        for (name, t) in [("q", q), ("k", k), ("v", v), ("out", out)] {
            check_float(kernel, name, t)?;
            if t.dtype != q.dtype {
                bail!("{kernel}: {name} is {:?}, q is {:?}", t.dtype, q.dtype);
            }
        }
        check_f32(kernel, "lse", lse)?;
        let (&[b, hq, sq, d], &[b2, hkv, skv, d2]) = (q.shape, k.shape) else {
            bail!("{kernel}: q {:?} and k {:?} must be 4-d", q.shape, k.shape);
        };
        if b2 != b || d2 != d || (hkv == 0 && hq != 0) || (hkv != 0 && hq % hkv != 0) {
            bail!("{kernel}: k {:?} does not fit q {:?}", k.shape, q.shape);
        }
        check_shape(kernel, "v", v, k.shape)?;
        check_shape(kernel, "out", out, q.shape)?;
        check_shape(kernel, "lse", lse, &q.shape[..3])?;
        let u = |x: i64| x as usize;
        Ok(Self {
            b: u(b),
            hq: u(hq),
            hkv: u(hkv),
            sq: u(sq),
            skv: u(skv),
            d: u(d),
            scale: scale as f32,
            causal,
        })
    }

    /// Query heads per key/value head.
    pub(crate) fn group(&self) -> usize {
        self.hq / self.hkv.max(1)
    }

    /// How many keys (a prefix) query `i` sees.
    #[inline]
    pub(crate) fn visible(&self, i: usize) -> usize {
        if !self.causal {
            return self.skv;
        }
        let v = i as i64 + 1 + self.skv as i64 - self.sq as i64;
        v.clamp(0, self.skv as i64) as usize
    }

    /// The first query that sees key `j` (`sq` when none does).
    #[inline]
    pub(crate) fn first_query(&self, j: usize) -> usize {
        if !self.causal {
            return 0;
        }
        (j as i64 - (self.skv as i64 - self.sq as i64)).clamp(0, self.sq as i64) as usize
    }
}

/// A `[batch, heads, seq, D]` tensor addressed by head and row.
#[derive(Clone, Copy)]
pub(crate) struct Heads {
    base: SyncPtr,
    dt: DType,
    /// Element strides of batch, head, row, column.
    st: [isize; 4],
    d: usize,
}

impl Heads {
    pub(crate) fn new(v: &View) -> Self {
        let s = |i: usize| v.strides[i] as isize;
        Self {
            base: SyncPtr::new(v.ptr),
            dt: v.dtype,
            st: [s(0), s(1), s(2), s(3)],
            d: v.shape[3] as usize,
        }
    }

    /// Address of row `s` of head `(b, h)`.
    #[inline]
    pub(crate) fn row(&self, b: usize, h: usize, s: usize) -> *mut u8 {
        let off = b as isize * self.st[0] + h as isize * self.st[1] + s as isize * self.st[2];
        self.base
            .get()
            .wrapping_offset(off * self.dt.size() as isize)
    }

    /// Whether rows can be handed to `gemm` in place.
    pub(crate) fn direct(&self) -> bool {
        self.dt == DType::F32 && (self.st[3] == 1 || self.d <= 1)
    }

    /// Rows `s0..s0 + n` of head `(b, h)` as an `f32` matrix: its address
    /// and row stride (the tensor itself, or a widened copy in `scratch`).
    ///
    /// # Safety
    /// The rows must be valid; the result lives as long as both the tensor
    /// and `scratch` are untouched.
    pub(crate) unsafe fn block(
        &self,
        b: usize,
        h: usize,
        s0: usize,
        n: usize,
        scratch: &mut Vec<f32>,
    ) -> (*const f32, isize) {
        if self.direct() {
            return (self.row(b, h, s0) as *const f32, self.st[2]);
        }
        let d = self.d;
        scratch.resize(n * d, 0.0);
        for (r, dst) in scratch.chunks_exact_mut(d.max(1)).take(n).enumerate() {
            // SAFETY: row `s0 + r` of the caller's valid head.
            unsafe { load_f32(self.dt, self.row(b, h, s0 + r), self.st[3], &mut dst[..d]) };
        }
        (scratch.as_ptr(), d as isize)
    }

    /// Rounds `src` (`n` rows of `D`, packed) into rows `s0..s0 + n` of
    /// head `(b, h)`.
    ///
    /// # Safety
    /// The rows must be valid, writable and not overlap `src`.
    pub(crate) unsafe fn store(&self, b: usize, h: usize, s0: usize, n: usize, src: &[f32]) {
        let d = self.d;
        for r in 0..n {
            // SAFETY: forwarded from this function's contract.
            unsafe {
                store_f32(
                    self.dt,
                    self.row(b, h, s0 + r),
                    self.st[3],
                    &src[r * d..][..d],
                )
            };
        }
    }
}

/// `f32` statistics `[batch, heads, seq]` (the log-sum-exp).
#[derive(Clone, Copy)]
pub(crate) struct Stats {
    base: SyncPtr,
    st: [isize; 3],
}

impl Stats {
    pub(crate) fn new(v: &View) -> Self {
        let s = |i: usize| v.strides[i] as isize;
        Self {
            base: SyncPtr::new(v.ptr),
            st: [s(0), s(1), s(2)],
        }
    }

    /// Address of entry `(b, h, i)`.
    #[inline]
    pub(crate) fn at(&self, b: usize, h: usize, i: usize) -> *mut f32 {
        let off = b as isize * self.st[0] + h as isize * self.st[1] + i as isize * self.st[2];
        (self.base.get() as *mut f32).wrapping_offset(off)
    }
}

/// A read-only `f32` matrix: address, row stride, column stride.
pub(crate) type Mat = (*const f32, isize, isize);

/// `dst (m x n, row stride ld) = [dst +] alpha * lhs (m x k) @ rhs (k x n)`,
/// single-threaded (callers parallelise over blocks).
///
/// # Safety
/// All three matrices must be valid for their extents and strides; `dst`
/// must not overlap the others.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn mm(
    (m, n, k): (usize, usize, usize),
    dst: *mut f32,
    ld: usize,
    accumulate: bool,
    lhs: Mat,
    rhs: Mat,
    alpha: f32,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                // SAFETY: row `i` of the caller's `dst`.
                unsafe { std::slice::from_raw_parts_mut(dst.add(i * ld), n).fill(0.0) };
            }
        }
        return;
    }
    // SAFETY: forwarded from this function's contract.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            ld as isize,
            accumulate,
            lhs.0,
            lhs.2,
            lhs.1,
            rhs.0,
            rhs.2,
            rhs.1,
            1.0,
            alpha,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}

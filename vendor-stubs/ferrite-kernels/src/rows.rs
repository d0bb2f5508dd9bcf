//! Row-wise kernels' plumbing: [`Rows`] maps a linear row index over the
//! leading dimensions to the row start of every operand (any strides) and
//! splits rows over the rayon pool, optionally collecting per-chunk partial
//! results in a deterministic order; plus `f32` row helpers (zero-copy
//! access to contiguous `f32` rows, otherwise a widened scratch copy) and
//! lane-parallel reductions that vectorize.

use crate::convert::load_f32;
use crate::dtype::DType;
use crate::float::exp_softmax;
use crate::parallel::{SyncPtr, chunk_count, for_each_range};
use crate::view::View;
use rayon::prelude::*;

/// Independent accumulators in the row reductions (two AVX2 registers).
const LANES: usize = 16;

/// The rows of `N` operands sharing a leading shape.
pub(crate) struct Rows<'a, const N: usize> {
    lead: &'a [i64],
    strides: [&'a [i64]; N],
    base: [SyncPtr; N],
    size: [usize; N],
    count: usize,
}

impl<'a, const N: usize> Rows<'a, N> {
    /// Rows over the leading shape `lead`; each view's first `lead.len()`
    /// strides step between rows (views must have at least that rank).
    pub(crate) fn new(lead: &'a [i64], views: [&View<'a>; N]) -> Self {
        let r = lead.len();
        Self {
            lead,
            strides: views.map(|v| &v.strides[..r]),
            base: views.map(|v| SyncPtr::new(v.ptr)),
            size: views.map(|v| v.dtype.size()),
            count: lead.iter().map(|&n| n.max(0) as usize).product(),
        }
    }

    /// Start of row `r` (row-major over the leading shape) in each operand.
    #[inline]
    pub(crate) fn ptrs(&self, r: usize) -> [*mut u8; N] {
        let mut off = [0isize; N];
        let mut rem = r;
        for d in (0..self.lead.len()).rev() {
            let n = self.lead[d] as usize;
            let i = (rem % n) as isize;
            rem /= n;
            for (o, s) in off.iter_mut().zip(&self.strides) {
                *o += i * s[d] as isize;
            }
        }
        std::array::from_fn(|k| {
            self.base[k]
                .get()
                .wrapping_offset(off[k] * self.size[k] as isize)
        })
    }

    /// Calls `f(first, count)` over row ranges, in parallel when
    /// `rows * weight` is large.
    pub(crate) fn for_ranges(&self, weight: usize, f: impl Fn(usize, usize) + Sync) {
        for_each_range(self.count, weight, f);
    }

    /// Like [`Self::for_ranges`], collecting `f`'s result for each range in
    /// row order (the split depends only on the sizes and the pool size).
    pub(crate) fn partials<T: Send>(
        &self,
        weight: usize,
        f: impl Fn(usize, usize) -> T + Sync,
    ) -> Vec<T> {
        split_collect(self.count, weight, f)
    }
}

/// Calls `f(first, count)` over pieces of `0..items` (in parallel when the
/// work is large) and returns the results in order.
pub(crate) fn split_collect<T: Send>(
    items: usize,
    weight: usize,
    f: impl Fn(usize, usize) -> T + Sync,
) -> Vec<T> {
    let chunks = chunk_count(items, weight);
    if chunks <= 1 {
        return vec![f(0, items)];
    }
    let at = |c: usize| (items as u128 * c as u128 / chunks as u128) as usize;
    (0..chunks)
        .into_par_iter()
        .map(|c| f(at(c), at(c + 1) - at(c)))
        .collect()
}

/// The dtype and element stride of the rows of one operand.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowFmt {
    pub(crate) dt: DType,
    pub(crate) stride: isize,
}

impl RowFmt {
    /// The row format of `v`, whose rows run along its last dimension.
    pub(crate) fn of(v: &View) -> Self {
        Self {
            dt: v.dtype,
            stride: v.strides.last().copied().unwrap_or(1) as isize,
        }
    }

    /// The row of `len` elements starting at `p`.
    #[inline(always)]
    pub(crate) fn line(self, p: *mut u8, len: usize) -> Line {
        Line {
            dt: self.dt,
            p,
            stride: self.stride,
            len,
        }
    }
}

/// A strided row of `len` elements of `dt` at `p`.
#[derive(Clone, Copy)]
pub(crate) struct Line {
    pub(crate) dt: DType,
    pub(crate) p: *mut u8,
    pub(crate) stride: isize,
    pub(crate) len: usize,
}

impl Line {
    /// Whether the row is contiguous `f32` (usable in place, no copy). A
    /// row at NULL (of an empty tensor, which the ABI lets have no data) is
    /// not: a slice may not be made from NULL, even of no elements.
    #[inline(always)]
    pub(crate) fn direct(&self) -> bool {
        self.dt == DType::F32 && (self.stride == 1 || self.len <= 1) && !self.p.is_null()
    }

    /// The row as `f32`: the memory itself when contiguous `f32`, else a
    /// widened copy in `scratch`.
    ///
    /// # Safety
    /// The row must be valid; with a direct row, nothing may write it while
    /// the slice is used.
    #[inline(always)]
    pub(crate) unsafe fn read<'s>(&self, scratch: &'s mut Vec<f32>) -> &'s [f32] {
        // SAFETY: the caller guarantees the row is valid.
        unsafe {
            if self.direct() {
                return std::slice::from_raw_parts(self.p as *const f32, self.len);
            }
            scratch.resize(self.len, 0.0);
            load_f32(self.dt, self.p, self.stride, scratch);
        }
        scratch
    }

    /// Rounds `src` into the row.
    ///
    /// # Safety
    /// The row must be valid, writable, and not overlap `src`.
    #[inline(always)]
    pub(crate) unsafe fn write(&self, src: &[f32]) {
        // SAFETY: forwarded from this function's contract.
        unsafe { crate::convert::store_f32(self.dt, self.p, self.stride, &src[..self.len]) };
    }
}

/// Folds `x` (and `y`, same length) with `f` into `LANES` lanes, then sums
/// the lanes pairwise.
#[inline(always)]
fn lane_sum(x: &[f32], y: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &y[..n]);
    let mut acc = [0f32; LANES];
    let (cx, cy) = (x.chunks_exact(LANES), y.chunks_exact(LANES));
    let (rx, ry) = (cx.remainder(), cy.remainder());
    for (a, b) in cx.zip(cy) {
        for j in 0..LANES {
            acc[j] += f(a[j], b[j]);
        }
    }
    for (j, (&a, &b)) in rx.iter().zip(ry).enumerate() {
        acc[j] += f(a, b);
    }
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        for j in 0..w {
            acc[j] += acc[j + w];
        }
    }
    acc[0]
}

/// Sum of `x`.
#[inline(always)]
pub(crate) fn sum(x: &[f32]) -> f32 {
    lane_sum(x, x, |a, _| a)
}

/// Dot product of `x` and `y`.
#[inline(always)]
pub(crate) fn dot(x: &[f32], y: &[f32]) -> f32 {
    lane_sum(x, y, |a, b| a * b)
}

/// Sum of `(x - c)^2`.
#[inline(always)]
pub(crate) fn sum_sq_dev(x: &[f32], c: f32) -> f32 {
    lane_sum(x, x, |a, _| (a - c) * (a - c))
}

/// Replaces each `x` by `exp(x - m)` ([`exp_softmax`]) and returns their
/// sum, in one pass with `LANES` accumulators.
#[inline(always)]
pub(crate) fn exp_sum(x: &mut [f32], m: f32) -> f32 {
    let mut acc = [0f32; LANES];
    let mut c = x.chunks_exact_mut(LANES);
    for a in &mut c {
        for j in 0..LANES {
            a[j] = exp_softmax(a[j] - m);
            acc[j] += a[j];
        }
    }
    for (j, v) in c.into_remainder().iter_mut().enumerate() {
        *v = exp_softmax(*v - m);
        acc[j] += *v;
    }
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        for j in 0..w {
            acc[j] += acc[j + w];
        }
    }
    acc[0]
}

/// Largest element, NaN if any element is NaN, `-inf` when empty.
#[inline(always)]
pub(crate) fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let c = x.chunks_exact(LANES);
    let rest = c.remainder();
    let pick = |m: f32, v: f32| if v > m || v.is_nan() { v } else { m };
    for a in c {
        for j in 0..LANES {
            acc[j] = pick(acc[j], a[j]);
        }
    }
    for (j, &v) in rest.iter().enumerate() {
        acc[j] = pick(acc[j], v);
    }
    acc.into_iter().fold(f32::NEG_INFINITY, pick)
}

/// Loads `v`, a 1-D view of `len` elements (parameters such as norm
/// weights), as `f32`.
///
/// # Safety
/// `v` must be valid for `len` elements of its dtype along `strides[0]`.
pub(crate) unsafe fn load_vec(v: &View, len: usize) -> Vec<f32> {
    let mut out = vec![0f32; len];
    let stride = v.strides.first().copied().unwrap_or(0) as isize;
    // SAFETY: forwarded from this function's contract.
    unsafe { load_f32(v.dtype, v.ptr, stride, &mut out) };
    out
}

//! Strided iteration shared by the elementwise kernels. A [`Plan`] takes a
//! common iteration shape and one stride vector per operand, drops size-1
//! dimensions, flips dimensions the output walks backwards, orders the
//! dimensions so the output is walked as contiguously as possible, and merges
//! neighbouring dimensions that are contiguous with each other in every
//! operand. It then hands the kernel runs along the innermost dimension,
//! splitting the work across the rayon pool when it is large. When an
//! operand is contiguous along the second-innermost dimension instead (a
//! transpose), the last two dimensions are walked in square tiles so both
//! access patterns stay in cache.

use crate::parallel::{SyncPtr, for_each_range};

/// Edge of the square tiles used for transposing walks.
const TILE: usize = 16;
/// Smallest 2-D extent (elements) worth tiling; smaller ones sit in L1.
const TILE_MIN: usize = 4096;

/// Runs `f(ptrs, len, inner_strides)` over every run of the innermost
/// dimension of the iteration space `shape`, for `N` operands (operand 0 is
/// the output) with element `strides` and element sizes `size`. Any rank is
/// accepted: beyond [`MAXD`] non-trivial dimensions the outermost ones are
/// peeled off in plain loops. Work is split across threads when
/// `elements * weight` is large.
///
/// # Safety
/// Every address described by `base`, `shape` and `strides` must be valid
/// for the kernel's accesses, and the output must not overlap itself.
pub(crate) unsafe fn for_each_strided<const N: usize, F>(
    shape: &[i64],
    base: [*mut u8; N],
    strides: [&[i64]; N],
    size: [usize; N],
    weight: usize,
    f: &F,
) where
    F: Fn([*mut u8; N], usize, [isize; N]) + Sync,
{
    if shape.contains(&0) {
        return;
    }
    if shape.iter().filter(|&&n| n != 1).count() > MAXD {
        let d = shape.iter().position(|&n| n != 1).unwrap_or(0);
        let rest: [&[i64]; N] = std::array::from_fn(|k| &strides[k][d + 1..]);
        for i in 0..shape[d] as isize {
            let ptrs: [*mut u8; N] = std::array::from_fn(|k| {
                base[k].wrapping_offset(i * strides[k][d] as isize * size[k] as isize)
            });
            // SAFETY: a sub-space of the caller's iteration space.
            unsafe { for_each_strided(&shape[d + 1..], ptrs, rest, size, weight, f) };
        }
        return;
    }
    let plan = Plan::new(shape, base, strides, size);
    // SAFETY: forwarded from this function's contract.
    unsafe { plan.for_each_run(weight, f) };
}

/// Most non-trivial dimensions a [`Plan`] holds.
const MAXD: usize = 8;

/// An iteration plan over `N` operands (operand 0 is the output), for at
/// most [`MAXD`] dimensions of size > 1 and no empty dimension.
#[derive(Debug)]
struct Plan<const N: usize> {
    nd: usize,
    shape: [usize; MAXD],
    /// Byte strides per operand and dimension.
    bstrides: [[isize; MAXD]; N],
    /// Element strides of the innermost dimension.
    inner: [isize; N],
    base: [SyncPtr; N],
    /// Walk the last two dimensions in tiles.
    tiled: bool,
}

impl<const N: usize> Plan<N> {
    fn new(shape: &[i64], base: [*mut u8; N], strides: [&[i64]; N], size: [usize; N]) -> Self {
        let mut base = base;
        // Non-trivial dimensions, with the output's negative strides flipped.
        let mut nd = 0;
        let mut dims = [0usize; MAXD];
        let mut st = [[0isize; MAXD]; N];
        for (d, &n) in shape.iter().enumerate() {
            if n == 1 {
                continue;
            }
            let flip = strides[0][d] < 0;
            for k in 0..N {
                let mut s = strides[k][d] as isize;
                if flip {
                    base[k] = base[k].wrapping_offset((n as isize - 1) * s * size[k] as isize);
                    s = -s;
                }
                st[k][nd] = s;
            }
            dims[nd] = n as usize;
            nd += 1;
        }
        // Order dimensions by decreasing output stride (stable insertion sort).
        let mut order = [0usize; MAXD];
        for (i, o) in order.iter_mut().enumerate() {
            *o = i;
        }
        for i in 1..nd {
            let mut j = i;
            while j > 0 && st[0][order[j - 1]] < st[0][order[j]] {
                order.swap(j - 1, j);
                j -= 1;
            }
        }
        // Merge dimensions contiguous with their inner neighbour in all operands.
        let mut plan = Self {
            nd: 0,
            shape: [1; MAXD],
            bstrides: [[0; MAXD]; N],
            inner: [0; N],
            base: base.map(SyncPtr::new),
            tiled: false,
        };
        for &d in &order[..nd] {
            let (n, m) = (dims[d], plan.nd);
            if m > 0 && (0..N).all(|k| plan.bstrides[k][m - 1] == st[k][d] * n as isize) {
                plan.shape[m - 1] *= n;
                for (bs, s) in plan.bstrides.iter_mut().zip(&st) {
                    bs[m - 1] = s[d];
                }
            } else {
                plan.shape[m] = n;
                for (bs, s) in plan.bstrides.iter_mut().zip(&st) {
                    bs[m] = s[d];
                }
                plan.nd += 1;
            }
        }
        plan.nd = plan.nd.max(1);
        let last = plan.nd - 1;
        plan.inner = std::array::from_fn(|k| plan.bstrides[k][last]);
        plan.tiled = last >= 1
            && plan.shape[last] * plan.shape[last - 1] >= TILE_MIN
            && plan
                .bstrides
                .iter()
                .any(|s| s[last].abs() > 1 && s[last - 1].abs() == 1);
        for (s, &sz) in plan.bstrides.iter_mut().zip(&size) {
            for v in &mut s[..plan.nd] {
                *v *= sz as isize;
            }
        }
        plan
    }

    /// Calls `f(ptrs, len, inner_strides)` for every run along the innermost
    /// dimension; `inner_strides` are in elements.
    ///
    /// # Safety
    /// As for [`for_each_strided`].
    unsafe fn for_each_run<F>(&self, weight: usize, f: &F)
    where
        F: Fn([*mut u8; N], usize, [isize; N]) + Sync,
    {
        if self.tiled {
            // SAFETY: forwarded from this function's contract.
            unsafe { self.run_tiled(weight, f) };
            return;
        }
        let total: usize = self.shape[..self.nd].iter().product();
        // SAFETY: forwarded from this function's contract.
        for_each_range(total, weight, |start, len| unsafe {
            self.run_range(start, start + len, f)
        });
    }

    /// Tiled walk: work items are (outer index, block of `TILE` rows); each
    /// item visits its rows in column blocks of `TILE`.
    ///
    /// # Safety
    /// As for [`for_each_strided`].
    unsafe fn run_tiled<F>(&self, weight: usize, f: &F)
    where
        F: Fn([*mut u8; N], usize, [isize; N]) + Sync,
    {
        let nd = self.nd;
        let (rows, cols) = (self.shape[nd - 2], self.shape[nd - 1]);
        let row_blocks = rows.div_ceil(TILE);
        let outer: usize = self.shape[..nd - 2].iter().product();
        let item_work = TILE.saturating_mul(cols).saturating_mul(weight);
        for_each_range(outer * row_blocks, item_work, |start, len| {
            for item in start..start + len {
                let (mut rem, rb) = (item / row_blocks, item % row_blocks);
                let mut off = [0isize; N];
                for d in (0..nd - 2).rev() {
                    let i = (rem % self.shape[d]) as isize;
                    rem /= self.shape[d];
                    for (o, s) in off.iter_mut().zip(&self.bstrides) {
                        *o += i * s[d];
                    }
                }
                let r0 = rb * TILE;
                for c0 in (0..cols).step_by(TILE) {
                    let len = TILE.min(cols - c0);
                    for r in r0..rows.min(r0 + TILE) {
                        let ptrs: [*mut u8; N] = std::array::from_fn(|k| {
                            let s = &self.bstrides[k];
                            let o = off[k] + r as isize * s[nd - 2] + c0 as isize * s[nd - 1];
                            self.base[k].get().wrapping_offset(o)
                        });
                        f(ptrs, len, self.inner);
                    }
                }
            }
        });
    }

    /// Runs over linear iteration indices `start..end`.
    ///
    /// # Safety
    /// As for [`for_each_strided`].
    unsafe fn run_range<F>(&self, start: usize, end: usize, f: &F)
    where
        F: Fn([*mut u8; N], usize, [isize; N]),
    {
        let nd = self.nd;
        let shape = &self.shape;
        let inner_n = shape[nd - 1];
        let mut idx = [0usize; MAXD];
        let mut rem = start;
        for d in (0..nd).rev() {
            idx[d] = rem % shape[d];
            rem /= shape[d];
        }
        let mut off = [0isize; N];
        for (o, s) in off.iter_mut().zip(&self.bstrides) {
            *o = (0..nd).map(|d| idx[d] as isize * s[d]).sum();
        }
        let mut left = end - start;
        while left > 0 {
            let len = (inner_n - idx[nd - 1]).min(left);
            let ptrs: [*mut u8; N] =
                std::array::from_fn(|k| self.base[k].get().wrapping_offset(off[k]));
            f(ptrs, len, self.inner);
            left -= len;
            if left == 0 {
                break;
            }
            // The run ended its row: rewind the inner index, then carry.
            for (o, s) in off.iter_mut().zip(&self.bstrides) {
                *o -= idx[nd - 1] as isize * s[nd - 1];
            }
            idx[nd - 1] = 0;
            let mut d = nd - 1;
            while d > 0 {
                d -= 1;
                idx[d] += 1;
                for (o, s) in off.iter_mut().zip(&self.bstrides) {
                    *o += s[d];
                }
                if idx[d] < shape[d] {
                    break;
                }
                for (o, s) in off.iter_mut().zip(&self.bstrides) {
                    *o -= shape[d] as isize * s[d];
                }
                idx[d] = 0;
            }
        }
    }
}

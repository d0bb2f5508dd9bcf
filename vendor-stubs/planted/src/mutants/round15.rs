//! The planted bugs of mutation round 15 (the operators of ABI 1.4): one
//! per class of bug the suite missed before the round's cases. Each
//! returns false where its bug does not apply, and the correct kernel
//! runs.
//!
//! # Safety
//! Every function here takes views that address live host memory of their
//! dtype, as the SDK checked them.
#![allow(clippy::missing_safety_doc)]

use ferrite_kernels::{DType, View};

use super::elems::{addresses, load, load_int, store, store_int};
use super::indexing::{element, indices, inner};

/// The line (output element, row-major) that element `p` of a tensor of
/// `shape` reduces or scans into along `dim`.
pub fn line(shape: &[i64], dim: usize, p: usize) -> usize {
    let (step, n) = (inner(shape, dim), shape[dim] as usize);
    (p / (n * step)) * step + p % step
}

/// `cumsum-starts-negative-zero`: the running sum of a floating dtype
/// starts from -0 (IEEE's additive identity) instead of +0, so a line
/// that starts with -0 keeps it.
pub unsafe fn cumsum_negative_zero_start(input: &View<'_>, out: &View<'_>, dim: usize) -> bool {
    if !input.dtype.is_float() || input.numel() == 0 {
        return false;
    }
    let (x, o) = (addresses(input), addresses(out));
    let mut sums = vec![-0.0f64; x.len() / input.shape[dim] as usize];
    for p in 0..x.len() {
        let l = line(input.shape, dim, p);
        // SAFETY: addresses of live elements; x[p] is read before o[p]
        // (the same element in place) is written.
        unsafe {
            sums[l] += load(input.dtype, x[p]);
            store(out.dtype, o[p], sums[l]);
        }
    }
    true
}

/// `any-tests-low-byte`: `any` of i32 and i64 tests each element's first
/// byte (a bool kernel run on every dtype).
pub unsafe fn any_low_byte(input: &View<'_>, out: &View<'_>, dim: usize) -> bool {
    if !matches!(input.dtype, DType::I32 | DType::I64) {
        return false;
    }
    let (x, o) = (addresses(input), addresses(out));
    let mut any = vec![false; o.len()];
    for (p, &q) in x.iter().enumerate() {
        // SAFETY: addresses of live input elements.
        any[line(input.shape, dim, p)] |= unsafe { q.read() } != 0;
    }
    for (q, a) in o.into_iter().zip(any) {
        // SAFETY: addresses of live out elements.
        unsafe { q.write(u8::from(a)) };
    }
    true
}

/// `scatter-add-int-saturates` (`through_f64` false) and
/// `scatter-add-int-through-f64` (true): integer updates added one at a
/// time with saturation at the dtype's range, or in double.
pub unsafe fn scatter_add_int(
    dst: &View<'_>,
    index: &View<'_>,
    src: &View<'_>,
    dim: usize,
    through_f64: bool,
) -> bool {
    if !matches!(dst.dtype, DType::I32 | DType::I64) {
        return false;
    }
    // SAFETY: forwarded.
    let Some(idx) = (unsafe { indices(index, 0, dst.shape[dim]) }) else {
        return false;
    };
    for (k, s) in addresses(src).into_iter().enumerate() {
        let d = element(dst, index.shape, k, dim, idx[k]);
        // SAFETY: addresses of live elements of `dst` and `src`.
        unsafe {
            let (old, up) = (load_int(dst.dtype, d), load_int(src.dtype, s));
            let v = if through_f64 {
                (old as f64 + up as f64) as i64
            } else if dst.dtype == DType::I32 {
                i64::from((old as i32).saturating_add(up as i32))
            } else {
                old.saturating_add(up)
            };
            store_int(dst.dtype, d, v);
        }
    }
    true
}

/// `gather-index-select-dim0-only`: a 2-D gather whose index has a zero
/// stride on every dimension but `dim` (PyTorch's `index_select`) takes a
/// fast path that copies row `index[r][0]` of `input` into row `r` of
/// `out`: right along dim 0, wrong along dim 1.
pub unsafe fn gather_select_dim0(
    input: &View<'_>,
    index: &View<'_>,
    out: &View<'_>,
    dim: usize,
) -> bool {
    let select = index
        .strides
        .iter()
        .enumerate()
        .all(|(d, &s)| d == dim || s == 0);
    if out.shape.len() != 2 || !select || out.numel() == 0 {
        return false;
    }
    // SAFETY: forwarded.
    let Some(idx) = (unsafe { indices(index, 0, input.shape[dim]) }) else {
        return false;
    };
    let cols = out.shape[1] as usize;
    let fits =
        idx.iter().step_by(cols).all(|&i| i < input.shape[0]) && out.shape[1] <= input.shape[1];
    if !fits {
        return false;
    }
    let size = input.dtype.size();
    for (k, o) in addresses(out).into_iter().enumerate() {
        let (r, c) = (k / cols, k % cols);
        let src = element(input, out.shape, k, 0, idx[r * cols]);
        debug_assert!(c < input.shape[1] as usize);
        // SAFETY: `src` addresses an element of `input` (row idx[r * cols],
        // checked above, column c < input's columns), `o` one of `out`.
        unsafe { std::ptr::copy_nonoverlapping(src, o, size) };
    }
    true
}

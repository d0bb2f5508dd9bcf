//! The hand-written mutants of ABI 1.4's operators (`gather`,
//! `scatter_add`, `cumsum`, `any`, `all` and the bitwise operators). Each
//! returns false where it does not apply, and the correct kernel runs.
//! Safety: every function takes the SDK-checked views of a live call.

#![allow(clippy::missing_safety_doc)]

use ferrite_kernels::{BoolReduceOp, DType, View};

use super::elems::{addresses, load, load_int, store, store_int};
use super::numerics::broadcast_addresses;

/// The row-major multi-index of element `k` of `shape`.
pub(super) fn coords(mut k: usize, shape: &[i64]) -> Vec<i64> {
    let mut c = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        c[d] = (k % shape[d] as usize) as i64;
        k /= shape[d] as usize;
    }
    c
}

/// The address of `data`'s element at the coordinates of element `k` of
/// `shape` with its coordinate along `dim` replaced by `at`.
pub(super) fn element(data: &View<'_>, shape: &[i64], k: usize, dim: usize, at: i64) -> *mut u8 {
    let mut c = coords(k, shape);
    c[dim] = at;
    let off: i64 = c.iter().zip(data.strides).map(|(i, s)| i * s).sum();
    data.ptr
        .wrapping_offset(off as isize * data.dtype.size() as isize)
}

/// The indices of `index` (row-major), or None if one is outside
/// `[lo, n)` (the correct kernel then refuses the call).
pub(super) unsafe fn indices(index: &View<'_>, lo: i64, n: i64) -> Option<Vec<i64>> {
    let idx: Vec<i64> = addresses(index)
        .into_iter()
        // SAFETY: addresses of live index elements.
        .map(|p| unsafe { load_int(index.dtype, p) })
        .collect();
    idx.iter().all(|&i| (lo..n).contains(&i)).then_some(idx)
}

/// `gather-wraps-negative-index`: an index in `[-n, 0)` counts from the
/// end (Python's rule) instead of being refused.
pub unsafe fn gather_wrapping(
    input: &View<'_>,
    index: &View<'_>,
    out: &View<'_>,
    dim: usize,
) -> bool {
    let n = input.shape[dim];
    // SAFETY: forwarded.
    let Some(idx) = (unsafe { indices(index, -n, n) }) else {
        return false;
    };
    if idx.iter().all(|&i| i >= 0) {
        return false;
    }
    let size = input.dtype.size();
    for (k, o) in addresses(out).into_iter().enumerate() {
        let at = idx[k].rem_euclid(n);
        let src = element(input, index.shape, k, dim, at);
        // SAFETY: `src` addresses an element of `input`, `o` one of `out`.
        unsafe { std::ptr::copy_nonoverlapping(src, o, size) };
    }
    true
}

/// `scatter-add-rounds-per-update`: f16 and bf16 updates added one at a
/// time and rounded to the dtype after each (a half-precision atomic add).
pub unsafe fn scatter_add_per_update(
    dst: &View<'_>,
    index: &View<'_>,
    src: &View<'_>,
    dim: usize,
) -> bool {
    if !matches!(dst.dtype, DType::F16 | DType::BF16) {
        return false;
    }
    // SAFETY: forwarded.
    let Some(idx) = (unsafe { indices(index, 0, dst.shape[dim]) }) else {
        return false;
    };
    for (k, s) in addresses(src).into_iter().enumerate() {
        let d = element(dst, index.shape, k, dim, idx[k]);
        // SAFETY: addresses of live elements of `dst` and `src`.
        unsafe { store(dst.dtype, d, load(dst.dtype, d) + load(src.dtype, s)) };
    }
    true
}

/// The row-major distance between neighbours along `dim` of `shape`.
pub(super) fn inner(shape: &[i64], dim: usize) -> usize {
    shape[dim + 1..].iter().product::<i64>() as usize
}

/// `cumsum-accumulates-in-dtype`: the running sum of a floating dtype kept
/// in the dtype (each partial sum rounded), as `out[k] = out[k-1] + x[k]`.
pub unsafe fn cumsum_in_dtype(input: &View<'_>, out: &View<'_>, dim: usize) -> bool {
    if !input.dtype.is_float() {
        return false;
    }
    let (x, o) = (addresses(input), addresses(out));
    let step = inner(input.shape, dim);
    let n = input.shape[dim] as usize;
    for p in 0..x.len() {
        // SAFETY: addresses of live elements; out[p - step] is written.
        unsafe {
            let v = load(input.dtype, x[p]);
            let sum = if (p / step) % n == 0 {
                v
            } else {
                load(out.dtype, o[p - step]) + v
            };
            store(out.dtype, o[p], sum);
        }
    }
    true
}

/// `any-checks-first-1024`: `any` looks at the first 1,024 elements of a
/// row only (one work-group's worth).
pub unsafe fn any_first_block(input: &View<'_>, out: &View<'_>, dim: usize, keepdim: bool) -> bool {
    if input.shape[dim] <= 1024 {
        return false;
    }
    let mut shape = input.shape.to_vec();
    shape[dim] = 1024;
    let first = View {
        shape: &shape,
        ..*input
    };
    // SAFETY: a part of the caller's input.
    unsafe { ferrite_kernels::reduce_bool(BoolReduceOp::Any, &first, out, dim, keepdim).is_ok() }
}

/// `all-nan-as-zero`: `all` tests `x > 0 || x < 0`, under which NaN is
/// zero.
pub unsafe fn all_nan_as_zero(input: &View<'_>, out: &View<'_>, dim: usize) -> bool {
    if !input.dtype.is_float() {
        return false;
    }
    let (x, o) = (addresses(input), addresses(out));
    let (step, n) = (inner(input.shape, dim), input.shape[dim] as usize);
    let mut all = vec![true; o.len()];
    for (p, &q) in x.iter().enumerate() {
        // SAFETY: addresses of live input elements.
        let v = unsafe { load(input.dtype, q) };
        all[(p / (n * step)) * step + p % step] &= !(v.is_nan() || v == 0.0);
    }
    for (q, a) in o.into_iter().zip(all) {
        // SAFETY: addresses of live out elements.
        unsafe { q.write(u8::from(a)) };
    }
    true
}

/// One bitwise mutant over the broadcast operands: `f` of the two
/// elements' addresses gives the result, written as an integer.
unsafe fn bitwise_each(
    a: &View<'_>,
    b: &View<'_>,
    out: &View<'_>,
    f: impl Fn(*mut u8, *mut u8) -> i64,
) {
    let (x, y) = (broadcast_addresses(a, out), broadcast_addresses(b, out));
    for (k, o) in addresses(out).into_iter().enumerate() {
        // SAFETY: addresses of live elements.
        unsafe { store_int(out.dtype, o, f(x[k], y[k])) };
    }
}

/// `bitwise-and-through-f64`: i64 operands converted to double and back
/// (a kernel written for floats): the low bits past 2^53 are lost.
pub unsafe fn and_through_f64(a: &View<'_>, b: &View<'_>, out: &View<'_>) -> bool {
    if out.dtype != DType::I64 {
        return false;
    }
    // SAFETY: forwarded.
    unsafe {
        bitwise_each(a, b, out, |x, y| {
            (load(DType::I64, x) as i64) & (load(DType::I64, y) as i64)
        })
    };
    true
}

/// `bitwise-or-bool-as-sum`: bool `or` as the sum of the bytes (a logical
/// or done as arithmetic): true | true stores 2, not a bool.
pub unsafe fn or_bool_as_sum(a: &View<'_>, b: &View<'_>, out: &View<'_>) -> bool {
    if out.dtype != DType::Bool {
        return false;
    }
    let (x, y) = (broadcast_addresses(a, out), broadcast_addresses(b, out));
    for (k, o) in addresses(out).into_iter().enumerate() {
        // SAFETY: addresses of live bool elements.
        unsafe { o.write(x[k].read().wrapping_add(y[k].read())) };
    }
    true
}

/// `bitwise-xor-low-32-bits`: i64 `xor` by a 32-bit kernel (the low
/// halves, sign-extended).
pub unsafe fn xor_low_32(a: &View<'_>, b: &View<'_>, out: &View<'_>) -> bool {
    if out.dtype != DType::I64 {
        return false;
    }
    // SAFETY: forwarded.
    unsafe {
        bitwise_each(a, b, out, |x, y| {
            i64::from((load_int(DType::I64, x) as i32) ^ (load_int(DType::I64, y) as i32))
        })
    };
    true
}

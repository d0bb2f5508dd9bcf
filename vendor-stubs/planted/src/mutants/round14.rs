//! The planted bugs of mutation round 14 (the operators of ABI 1.3): one
//! per class of bug the suite missed before the round's cases. Each
//! returns false (or is not called) where its bug does not apply, and the
//! correct kernel runs.
//!
//! # Safety
//! Every function here takes views that address live host memory of their
//! dtype, as the SDK checked them.
#![allow(clippy::missing_safety_doc)]

use ferrite_kernels::{DType, View};

use super::elems::{addresses, load, load_int, map, round, store, store_int};
use super::numerics::broadcast_addresses;

/// Copies one element's bytes.
///
/// # Safety
/// Both address live elements of `size` bytes (they may be the same).
unsafe fn move_bytes(size: usize, src: *mut u8, dst: *mut u8) {
    // SAFETY: forwarded; `copy` allows `src == dst`.
    unsafe { std::ptr::copy(src, dst, size) }
}

/// sin with a fast path for zero inputs that writes +0.
pub unsafe fn sin_zero_positive(input: &View<'_>, out: &View<'_>) {
    // SAFETY: forwarded.
    unsafe { map(input, out, round, |x| if x == 0.0 { 0.0 } else { x.sin() }) };
}

/// select with a one-element `b` passed as a double and converted back
/// for every element it fills; false where `b` has more than one element.
pub unsafe fn select_scalar_b_through_double(
    cond: &View<'_>,
    a: &View<'_>,
    b: &View<'_>,
    out: &View<'_>,
) -> bool {
    if b.numel() != 1 {
        return false;
    }
    let size = out.dtype.size();
    // SAFETY: `b` holds one live element.
    let value = unsafe { load(b.dtype, b.ptr) };
    let (c, x) = (broadcast_addresses(cond, out), broadcast_addresses(a, out));
    for (k, &o) in addresses(out).iter().enumerate() {
        // SAFETY: addresses of live elements.
        unsafe {
            if *c[k] != 0 {
                move_bytes(size, x[k], o);
            } else {
                store(out.dtype, o, value);
            }
        }
    }
    true
}

/// lt with a one-element `b` passed as an f32 kernel argument; false where
/// `b` has more than one element.
pub unsafe fn lt_scalar_as_f32(a: &View<'_>, b: &View<'_>, out: &View<'_>) -> bool {
    if b.numel() != 1 {
        return false;
    }
    // SAFETY: `b` holds one live element.
    let y = f64::from(unsafe { load(b.dtype, b.ptr) } as f32);
    let x = broadcast_addresses(a, out);
    for (k, &o) in addresses(out).iter().enumerate() {
        // SAFETY: addresses of live elements.
        unsafe { o.write(u8::from(load(a.dtype, x[k]) < y)) };
    }
    true
}

/// select with a 0-d `cond` filling `out` with the chosen branch's
/// elements in their own order, repeated (a copy that takes the branch for
/// `out`'s shape); false where `cond` is not 0-d.
pub unsafe fn select_scalar_cond_repeats(
    cond: &View<'_>,
    a: &View<'_>,
    b: &View<'_>,
    out: &View<'_>,
) -> bool {
    if !cond.shape.is_empty() {
        return false;
    }
    // SAFETY: `cond` holds one live element.
    let chosen = if unsafe { *cond.ptr } != 0 { a } else { b };
    let src = addresses(chosen);
    let size = out.dtype.size();
    for (k, &o) in addresses(out).iter().enumerate() {
        // SAFETY: addresses of live elements.
        unsafe { move_bytes(size, src[k % src.len()], o) };
    }
    true
}

/// masked_fill reading a 1-D mask per row when the input is square (its
/// length matches the rows); false elsewhere.
pub unsafe fn masked_fill_mask_per_row(
    input: &View<'_>,
    mask: &View<'_>,
    out: &View<'_>,
    value: f64,
) -> bool {
    let s = out.shape;
    if mask.shape.len() != 1 || s.len() != 2 || mask.shape[0] != s[0] {
        return false;
    }
    let column = [s[0], 1];
    let per_row = View {
        shape: &column,
        strides: &[mask.strides[0], 0],
        ..*mask
    };
    let (m, x) = (broadcast_addresses(&per_row, out), addresses(input));
    let size = out.dtype.size();
    for (k, &o) in addresses(out).iter().enumerate() {
        // SAFETY: addresses of live elements.
        unsafe {
            if *m[k] != 0 {
                store(out.dtype, o, value);
            } else {
                move_bytes(size, x[k], o);
            }
        }
    }
    true
}

/// convert from i32 or i64 to bf16 through f32 (two roundings); false for
/// other dtypes.
pub unsafe fn convert_int_bf16_through_f32(src: &View<'_>, dst: &View<'_>) -> bool {
    if !matches!(src.dtype, DType::I32 | DType::I64) || dst.dtype != DType::BF16 {
        return false;
    }
    for (&x, &y) in addresses(src).iter().zip(&addresses(dst)) {
        // SAFETY: addresses of live elements.
        unsafe { store(DType::BF16, y, f64::from(load_int(src.dtype, x) as f32)) };
    }
    true
}

/// arange as one fused multiply-add per element (`i * step + start`
/// rounded once).
pub unsafe fn arange_fused(out: &View<'_>, start: f64, step: f64) {
    for (i, &p) in addresses(out).iter().enumerate() {
        // SAFETY: addresses of live elements.
        unsafe { store(out.dtype, p, (i as f64).mul_add(step, start)) };
    }
}

/// arange in i64 computed in integers when start and step are whole
/// numbers; false elsewhere.
pub unsafe fn arange_i64_in_integers(out: &View<'_>, start: f64, step: f64) -> bool {
    let whole = |v: f64| v.fract() == 0.0 && v.abs() < 9.0e18;
    if out.dtype != DType::I64 || !whole(start) || !whole(step) {
        return false;
    }
    let (s, d) = (start as i64, step as i64);
    for (i, &p) in addresses(out).iter().enumerate() {
        // SAFETY: addresses of live elements.
        unsafe { store_int(DType::I64, p, s.wrapping_add((i as i64).wrapping_mul(d))) };
    }
    true
}

/// convert from a float to f16 overflowing past the largest finite f16
/// (65504) rather than at the rounding threshold (65520); false for other
/// dtypes.
pub unsafe fn convert_f16_overflow_at_max(src: &View<'_>, dst: &View<'_>) -> bool {
    if !src.dtype.is_float() || dst.dtype != DType::F16 {
        return false;
    }
    for (&x, &y) in addresses(src).iter().zip(&addresses(dst)) {
        // SAFETY: addresses of live elements.
        unsafe {
            let v = load(src.dtype, x);
            let v = if v.abs() > 65504.0 {
                f64::INFINITY.copysign(v)
            } else {
                v
            };
            store(DType::F16, y, v);
        }
    }
    true
}

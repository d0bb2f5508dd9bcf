//! `softmax` over the last dimension: subtract the row maximum, exponentiate,
//! normalise. `f16`/`bf16` rows are widened to `f32`, computed, and rounded
//! once; strided rows go through a scratch row (one allocation per
//! batch of rows, none for contiguous `f32`/`f64` rows). Inner loops keep 8
//! independent lanes so the max and sum reductions vectorize.

use crate::convert::{load_f32, load_native, store_f32, store_native};
use crate::dtype::DType;
use crate::error::{KernelError, bail};
use crate::float::Real;
use crate::layout::for_each_strided;
use crate::simd::simd_dispatch;
use crate::view::View;

const LANES: usize = 8;

/// `out = softmax(input)` over the last dimension (same shape and float
/// dtype). A row of all `-inf` gives NaN, as does a row containing `+inf` or
/// NaN. `out` may be exactly `input` (in place).
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `out` must not overlap `input` unless it is exactly the same view, and
/// must not overlap itself.
pub unsafe fn softmax(input: &View, out: &View) -> Result<(), KernelError> {
    input.validate("softmax", "input")?;
    out.validate("softmax", "out")?;
    let dt = out.dtype;
    if !dt.is_float() || input.dtype != dt {
        bail!(
            "softmax: need one float dtype, got {:?} -> {:?}",
            input.dtype,
            dt
        );
    }
    if input.shape != out.shape {
        bail!(
            "softmax: shape mismatch {:?} vs {:?}",
            input.shape,
            out.shape
        );
    }
    let r = out.shape.len();
    let (l, si, so, outer) = match r {
        0 => (1, 0, 0, 0),
        _ => (
            out.shape[r - 1] as usize,
            input.strides[r - 1],
            out.strides[r - 1],
            r - 1,
        ),
    };
    if l == 0 {
        return Ok(());
    }
    let ptrs = [out.ptr, input.ptr];
    let strides = [&out.strides[..outer], &input.strides[..outer]];
    let row = Row {
        dt,
        l,
        si: si as isize,
        so: so as isize,
    };
    // SAFETY: every row lies inside the caller-guaranteed views.
    unsafe {
        let shape = &out.shape[..outer];
        let kernel = |[op, ip]: [*mut u8; 2], rows, [os, is]: [isize; 2]| match dt {
            DType::F32 => rows_native::<f32>(&row, op, ip, rows, os, is),
            DType::F64 => rows_native::<f64>(&row, op, ip, rows, os, is),
            _ => rows_half(&row, op, ip, rows, os, is),
        };
        for_each_strided(shape, ptrs, strides, [dt.size(); 2], l * 4, &kernel);
    }
    Ok(())
}

/// Geometry of the rows: dtype, length and element strides along the row.
struct Row {
    dt: DType,
    l: usize,
    si: isize,
    so: isize,
}

simd_dispatch!(unsafe fn rows_native[T: Real](row: &Row, op: *mut u8, ip: *mut u8, rows: usize, os: isize, is: isize) => native_impl[T]);
simd_dispatch!(unsafe fn rows_half[](row: &Row, op: *mut u8, ip: *mut u8, rows: usize, os: isize, is: isize) => half_impl[]);

/// `rows` rows of a native type starting at `op`/`ip`, `os`/`is` elements
/// apart.
///
/// # Safety
/// All addressed rows must be valid memory of type `T`.
#[inline(always)]
unsafe fn native_impl<T: Real>(
    row: &Row,
    op: *mut u8,
    ip: *mut u8,
    rows: usize,
    os: isize,
    is: isize,
) {
    let (op, ip) = (op as *mut T, ip as *const T);
    let l = row.l;
    let mut scratch = Vec::new();
    for r in 0..rows as isize {
        // SAFETY: row `r` of each view is valid for `l` elements.
        unsafe {
            let (o, i) = (op.offset(r * os), ip.offset(r * is));
            if row.so == 1 && row.si == 1 {
                if std::ptr::eq(o, i) {
                    softmax_in_place(std::slice::from_raw_parts_mut(o, l));
                } else {
                    let src = std::slice::from_raw_parts(i, l);
                    softmax_into(src, std::slice::from_raw_parts_mut(o, l));
                }
            } else {
                scratch.resize(l, T::ZERO);
                let buf = &mut scratch[..];
                load_native(i, row.si, buf);
                softmax_in_place(buf);
                store_native(o, row.so, buf);
            }
        }
    }
}

/// `rows` rows of `f16`/`bf16`, computed in `f32`.
///
/// # Safety
/// All addressed rows must be valid memory of the dtype.
#[inline(always)]
unsafe fn half_impl(row: &Row, op: *mut u8, ip: *mut u8, rows: usize, os: isize, is: isize) {
    let size = row.dt.size() as isize;
    let mut scratch = vec![0f32; row.l];
    let buf = &mut scratch[..];
    for r in 0..rows as isize {
        // SAFETY: row `r` of each view is valid for `l` elements.
        unsafe {
            load_f32(row.dt, ip.offset(r * is * size), row.si, buf);
            softmax_in_place(buf);
            store_f32(row.dt, op.offset(r * os * size), row.so, buf);
        }
    }
}

/// Largest non-NaN element (`-inf` for an empty or all-NaN row).
#[inline(always)]
fn row_max<T: Real>(x: &[T]) -> T {
    let mut lanes = [T::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            lanes[j] = if c[j] > lanes[j] { c[j] } else { lanes[j] };
        }
    }
    for &v in rest {
        lanes[0] = if v > lanes[0] { v } else { lanes[0] };
    }
    lanes
        .into_iter()
        .fold(T::NEG_INFINITY, |m, v| if v > m { v } else { m })
}

/// Sum of the row, accumulated in `LANES` independent lanes.
#[inline(always)]
fn row_sum<T: Real>(x: &[T]) -> T {
    let mut lanes = [T::ZERO; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            lanes[j] = lanes[j] + c[j];
        }
    }
    for &v in rest {
        lanes[0] = lanes[0] + v;
    }
    let [a, b, c, d, e, f, g, h] = lanes;
    ((a + b) + (c + d)) + ((e + f) + (g + h))
}

/// Multiplies the (already exponentiated) row by the reciprocal of its sum.
#[inline(always)]
fn normalise<T: Real>(x: &mut [T]) {
    let inv = T::ONE / row_sum(x);
    for v in x.iter_mut() {
        *v = *v * inv;
    }
}

#[inline(always)]
fn softmax_in_place<T: Real>(x: &mut [T]) {
    let m = row_max(x);
    for v in x.iter_mut() {
        *v = (*v - m).exp();
    }
    normalise(x);
}

#[inline(always)]
fn softmax_into<T: Real>(src: &[T], dst: &mut [T]) {
    let m = row_max(src);
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = (s - m).exp();
    }
    normalise(dst);
}

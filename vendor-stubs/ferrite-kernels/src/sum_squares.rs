//! `sum_squares`: the sum of the squares of every element (the global term
//! of gradient-norm clipping). The order of the elements does not matter,
//! so the view is first put in memory order (strides made positive, sorted,
//! contiguous neighbours merged); a tensor that then forms a single run is
//! summed in parallel pieces of that run, others in parallel groups of
//! lines. Squares accumulate in `f64`; the pieces are added in order.

use crate::convert::{BLOCK, load_f32, load_native};
use crate::dtype::DType;
use crate::error::{KernelError, bail};
use crate::map::check_f32;
use crate::parallel::SyncPtr;
use crate::rows::split_collect;
use crate::simd::simd_dispatch;
use crate::view::View;

/// `out = sum(input^2)` over every element, `out` a 0-d `f32` tensor;
/// `input` may have any float dtype (including `f64`) and shape.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `out` must not overlap `input`.
pub unsafe fn sum_squares(input: &View, out: &View) -> Result<(), KernelError> {
    input.validate("sum_squares", "input")?;
    check_f32("sum_squares", "out", out)?;
    if !input.dtype.is_float() {
        bail!("sum_squares: input must be floating, got {:?}", input.dtype);
    }
    if !out.shape.is_empty() {
        bail!("sum_squares: out must be 0-d, got {:?}", out.shape);
    }
    let (dt, size) = (input.dtype, input.dtype.size() as isize);
    // Memory order: (extent, positive stride), outermost first, merged.
    let mut base = input.ptr;
    let mut dims: Vec<(usize, isize)> = Vec::new();
    for (&n, &s) in input.shape.iter().zip(input.strides) {
        if n == 0 {
            // SAFETY: `out` is a valid f32 scalar.
            unsafe { *(out.ptr as *mut f32) = 0.0 };
            return Ok(());
        }
        if n > 1 {
            if s < 0 {
                base = base.wrapping_offset((n - 1) as isize * s as isize * size);
            }
            dims.push((n as usize, (s as isize).abs()));
        }
    }
    dims.sort_by_key(|d| std::cmp::Reverse(d.1));
    let mut merged: Vec<(usize, isize)> = Vec::new();
    for (n, s) in dims {
        match merged.last_mut() {
            Some(last) if last.1 == s * n as isize => *last = (last.0 * n, s),
            _ => merged.push((n, s)),
        }
    }
    let (inner, stride) = merged.pop().unwrap_or((1, 1));
    let base = SyncPtr::new(base);
    let parts = if merged.is_empty() {
        split_collect(inner, 1, |start, len| {
            let p = base.get().wrapping_offset(start as isize * stride * size);
            let mut acc = 0.0;
            // SAFETY: a piece of the single run of valid elements.
            unsafe { squares(dt, p, stride, len, &mut acc) };
            acc
        })
    } else {
        let lines: usize = merged.iter().map(|d| d.0).product();
        split_collect(lines, inner, |start, len| {
            let mut acc = 0.0;
            for line in start..start + len {
                let (mut rem, mut off) = (line, 0isize);
                for &(n, s) in merged.iter().rev() {
                    off += (rem % n) as isize * s;
                    rem /= n;
                }
                let p = base.get().wrapping_offset(off * size);
                // SAFETY: one line of valid elements of the view.
                unsafe { squares(dt, p, stride, inner, &mut acc) };
            }
            acc
        })
    };
    let total: f64 = parts.iter().sum();
    // SAFETY: `out` is a valid f32 scalar not overlapping the input.
    unsafe { *(out.ptr as *mut f32) = total as f32 };
    Ok(())
}

simd_dispatch!(unsafe fn squares[](dt: DType, p: *mut u8, stride: isize, n: usize, acc: &mut f64) => squares_impl[]);

/// Adds the squares of `n` elements at `p` (element stride `stride`) to
/// `acc`, in blocks with four `f64` lanes.
///
/// # Safety
/// The `n` elements must be valid memory of `dt`.
#[inline(always)]
unsafe fn squares_impl(dt: DType, p: *mut u8, stride: isize, n: usize, acc: &mut f64) {
    let mut lanes = [0f64; 4];
    let (mut b32, mut b64) = ([0f32; BLOCK], [0f64; BLOCK]);
    let size = dt.size() as isize;
    let mut done = 0;
    while done < n {
        let m = BLOCK.min(n - done);
        let q = p.wrapping_offset(done as isize * stride * size);
        if dt == DType::F64 {
            // SAFETY: a block of the caller's valid elements.
            unsafe { load_native(q as *const f64, stride, &mut b64[..m]) };
        } else {
            // SAFETY: as above.
            unsafe { load_f32(dt, q, stride, &mut b32[..m]) };
            for (w, &v) in b64.iter_mut().zip(&b32[..m]) {
                *w = v as f64;
            }
        }
        let c = b64[..m].chunks_exact(4);
        let rest = c.remainder();
        for v in c {
            for j in 0..4 {
                lanes[j] += v[j] * v[j];
            }
        }
        for (j, &v) in rest.iter().enumerate() {
            lanes[j] += v * v;
        }
        done += m;
    }
    *acc += (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

//! `log_softmax` over the last dimension and the backward of `softmax` and
//! `log_softmax`: parallel rows, `f32` lanes, contiguous `f32` rows read in
//! place, the rest through scratch, each output rounded once.

use crate::error::{KernelError, bail};
use crate::float::exp_f32;
use crate::map::check_float;
use crate::rows::{RowFmt, Rows, dot, max, sum};
use crate::simd::simd_dispatch;
use crate::view::View;

/// Checks that every view has `views[0]`'s float dtype and shape; returns
/// the leading shape and the row length (a 0-d tensor is one row of 1).
fn check_rows<'a>(
    kernel: &str,
    views: &[(&str, &View<'a>)],
) -> Result<(&'a [i64], usize), KernelError> {
    let first = views[0].1;
    for &(name, v) in views {
        check_float(kernel, name, v)?;
        if v.dtype != first.dtype || v.shape != first.shape {
            bail!(
                "{kernel}: {name} is {:?} {:?}, expected {:?} {:?}",
                v.dtype,
                v.shape,
                first.dtype,
                first.shape
            );
        }
    }
    Ok(match first.shape.split_last() {
        Some((&l, lead)) => (lead, l as usize),
        None => (first.shape, 1),
    })
}

/// `out = input - logsumexp(input)` over the last dimension (same shape and
/// dtype). A row of all `-inf`, or with `+inf` or NaN, gives NaN. `out` may
/// be exactly `input` (in place).
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `out` must not overlap `input` unless it is exactly the same view, and
/// must not overlap itself.
pub unsafe fn log_softmax(input: &View, out: &View) -> Result<(), KernelError> {
    let (lead, l) = check_rows("log_softmax", &[("out", out), ("input", input)])?;
    let job = Job {
        rows: Rows::new(lead, [out, input, input]),
        views: [out, input, input].map(RowFmt::of),
        l,
        log: true,
    };
    // SAFETY: forwarded from this function's contract.
    job.rows
        .for_ranges(4 * l, |s, n| unsafe { log_softmax_rows(&job, s, n) });
    Ok(())
}

/// Backward over the last dimension, from the forward output `out` (`y`):
/// `grad_in = y * (g - sum(g * y))` for softmax, or, with `log`,
/// `grad_in = g - exp(y) * sum(g)` for log_softmax.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `grad_in` must not overlap the inputs or itself.
pub unsafe fn softmax_backward(
    out: &View,
    grad_out: &View,
    grad_in: &View,
    log: bool,
) -> Result<(), KernelError> {
    let views = [("grad_in", grad_in), ("out", out), ("grad_out", grad_out)];
    let (lead, l) = check_rows("softmax_backward", &views)?;
    let job = Job {
        rows: Rows::new(lead, [grad_in, out, grad_out]),
        views: [grad_in, out, grad_out].map(RowFmt::of),
        l,
        log,
    };
    // SAFETY: forwarded from this function's contract.
    job.rows
        .for_ranges(3 * l, |s, n| unsafe { backward_rows(&job, s, n) });
    Ok(())
}

/// Rows of an output and two inputs (the same one twice for the forward).
struct Job<'a> {
    rows: Rows<'a, 3>,
    views: [RowFmt; 3],
    l: usize,
    log: bool,
}

simd_dispatch!(unsafe fn log_softmax_rows[](job: &Job, start: usize, len: usize) => fwd_impl[]);
simd_dispatch!(unsafe fn backward_rows[](job: &Job, start: usize, len: usize) => bwd_impl[]);

/// # Safety
/// As for [`log_softmax`].
#[inline(always)]
unsafe fn fwd_impl(job: &Job, start: usize, len: usize) {
    let l = job.l;
    let (mut xs, mut ys) = (Vec::new(), vec![0f32; l]);
    for r in start..start + len {
        let [op, ip, _] = job.rows.ptrs(r);
        let ol = job.views[0].line(op, l);
        // SAFETY: the rows lie inside the caller's views. In place, the
        // input slice is dead before the output is written through `ol`.
        unsafe {
            let x = &job.views[1].line(ip, l).read(&mut xs)[..l];
            let m = max(x);
            for (y, &x) in ys.iter_mut().zip(x) {
                *y = exp_f32(x - m);
            }
            let lse = sum(&ys).ln();
            for (y, &x) in ys.iter_mut().zip(x) {
                *y = (x - m) - lse;
            }
            ol.write(&ys);
        }
    }
}

/// # Safety
/// As for [`softmax_backward`].
#[inline(always)]
unsafe fn bwd_impl(job: &Job, start: usize, len: usize) {
    let l = job.l;
    let (mut ys, mut gs, mut dx) = (Vec::new(), Vec::new(), vec![0f32; l]);
    let [vd, vy, vg] = job.views;
    for r in start..start + len {
        let [dp, yp, gp] = job.rows.ptrs(r);
        let dl = vd.line(dp, l);
        // SAFETY: the rows lie inside the caller's views; the output does
        // not overlap the inputs.
        unsafe {
            let y = &vy.line(yp, l).read(&mut ys)[..l];
            let g = &vg.line(gp, l).read(&mut gs)[..l];
            let dst = if dl.direct() {
                std::slice::from_raw_parts_mut(dp as *mut f32, l)
            } else {
                &mut dx[..]
            };
            if job.log {
                let s = sum(g);
                for ((d, &y), &g) in dst.iter_mut().zip(y).zip(g) {
                    *d = g - exp_f32(y) * s;
                }
            } else {
                let s = dot(g, y);
                for ((d, &y), &g) in dst.iter_mut().zip(y).zip(g) {
                    *d = y * (g - s);
                }
            }
            if !dl.direct() {
                dl.write(&dx);
            }
        }
    }
}

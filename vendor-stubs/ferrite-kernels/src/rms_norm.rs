//! RMSNorm over the last dimension, forward and backward. Rows run in
//! parallel for large inputs; each row is read once into registers/L1
//! (contiguous `f32` rows in place, others widened into scratch), reduced
//! with `f32` lanes, and written once. The weight gradient is summed per
//! chunk of rows and the chunks are then added in `f64`.

use crate::error::KernelError;
use crate::norm::{check, store_param_grad};
use crate::rows::{RowFmt, Rows, dot, load_vec};
use crate::simd::simd_dispatch;
use crate::view::View;

/// `out = input * inv_rms * weight` over the last dimension `H`, with
/// `inv_rms = 1 / sqrt(mean(input^2) + eps)` saved per row (f32).
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// the outputs (`out`, `inv_rms`) must not overlap the inputs, each other or
/// themselves.
pub unsafe fn rms_norm(
    input: &View,
    weight: &View,
    out: &View,
    inv_rms: &View,
    eps: f64,
) -> Result<(), KernelError> {
    let rows = [("out", out), ("input", input)];
    let g = check(
        "rms_norm",
        &rows,
        &[("weight", weight)],
        &[("inv_rms", inv_rms)],
    )?;
    let h = g.h;
    // SAFETY: the weight is a valid `[H]` view.
    let w = unsafe { load_vec(weight, h) };
    let job = Fwd {
        rows: Rows::new(g.lead, [out, input, inv_rms]),
        out: RowFmt::of(out),
        input: RowFmt::of(input),
        w,
        eps,
    };
    // SAFETY: forwarded from this function's contract.
    job.rows
        .for_ranges(2 * h, |start, len| unsafe { fwd_rows(&job, start, len) });
    Ok(())
}

struct Fwd<'a> {
    rows: Rows<'a, 3>,
    out: RowFmt,
    input: RowFmt,
    w: Vec<f32>,
    eps: f64,
}

simd_dispatch!(unsafe fn fwd_rows[](job: &Fwd, start: usize, len: usize) => fwd_impl[]);

/// # Safety
/// As for [`rms_norm`].
#[inline(always)]
unsafe fn fwd_impl(job: &Fwd, start: usize, len: usize) {
    let h = job.w.len();
    let w = &job.w[..];
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for r in start..start + len {
        let [op, ip, sp] = job.rows.ptrs(r);
        let (xl, ol) = (job.input.line(ip, h), job.out.line(op, h));
        // SAFETY: the rows lie inside the caller's views; outputs do not
        // overlap inputs.
        unsafe {
            let x = &xl.read(&mut xs)[..h];
            let inv = (1.0 / (dot(x, x) as f64 / h as f64 + job.eps).sqrt()) as f32;
            *(sp as *mut f32) = inv;
            if ol.direct() {
                let y = std::slice::from_raw_parts_mut(op as *mut f32, h);
                for ((y, &x), &w) in y.iter_mut().zip(x).zip(w) {
                    *y = x * inv * w;
                }
            } else {
                ys.resize(h, 0.0);
                for ((y, &x), &w) in ys.iter_mut().zip(x).zip(w) {
                    *y = x * inv * w;
                }
                ol.write(&ys);
            }
        }
    }
}

/// Backward of [`rms_norm`]: writes `grad_input` and `grad_weight` (summed
/// over rows) from the saved `inv_rms`.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// the outputs must not overlap the inputs, each other or themselves.
pub unsafe fn rms_norm_backward(
    grad_out: &View,
    input: &View,
    weight: &View,
    inv_rms: &View,
    grad_input: &View,
    grad_weight: &View,
) -> Result<(), KernelError> {
    let rows = [
        ("grad_input", grad_input),
        ("grad_out", grad_out),
        ("input", input),
    ];
    let params = [("weight", weight), ("grad_weight", grad_weight)];
    let g = check("rms_norm_backward", &rows, &params, &[("inv_rms", inv_rms)])?;
    let h = g.h;
    // SAFETY: the weight is a valid `[H]` view.
    let w = unsafe { load_vec(weight, h) };
    let job = Bwd {
        rows: Rows::new(g.lead, [grad_input, grad_out, input, inv_rms]),
        views: [grad_input, grad_out, input].map(RowFmt::of),
        w,
    };
    let parts = job.rows.partials(4 * h, |start, len| {
        let mut acc = vec![0f32; h];
        // SAFETY: forwarded from this function's contract.
        unsafe { bwd_rows(&job, &mut acc, start, len) };
        acc
    });
    // SAFETY: `grad_weight` is a valid `[H]` output.
    unsafe { store_param_grad(grad_weight, &parts, h) };
    Ok(())
}

struct Bwd<'a> {
    rows: Rows<'a, 4>,
    views: [RowFmt; 3],
    w: Vec<f32>,
}

simd_dispatch!(unsafe fn bwd_rows[](job: &Bwd, acc: &mut [f32], start: usize, len: usize) => bwd_impl[]);

/// # Safety
/// As for [`rms_norm_backward`].
#[inline(always)]
unsafe fn bwd_impl(job: &Bwd, acc: &mut [f32], start: usize, len: usize) {
    let h = job.w.len();
    let (w, acc) = (&job.w[..], &mut acc[..h]);
    let (mut gs, mut xs, mut gw, mut dx) = (Vec::new(), Vec::new(), vec![0f32; h], vec![0f32; h]);
    let [vdx, vg, vx] = job.views;
    for r in start..start + len {
        let [dp, gp, xp, sp] = job.rows.ptrs(r);
        let dl = vdx.line(dp, h);
        // SAFETY: the rows lie inside the caller's views; outputs do not
        // overlap inputs.
        unsafe {
            let g = &vg.line(gp, h).read(&mut gs)[..h];
            let x = &vx.line(xp, h).read(&mut xs)[..h];
            let inv = *(sp as *const f32);
            for ((o, &g), &w) in gw.iter_mut().zip(g).zip(w) {
                *o = g * w;
            }
            let c = inv * inv * inv * (dot(&gw, x) / h as f32);
            for ((a, &g), &x) in acc.iter_mut().zip(g).zip(x) {
                *a += g * x * inv;
            }
            let dst = if dl.direct() {
                std::slice::from_raw_parts_mut(dp as *mut f32, h)
            } else {
                &mut dx[..]
            };
            for ((d, &gw), &x) in dst.iter_mut().zip(&gw).zip(x) {
                *d = inv * gw - c * x;
            }
            if !dl.direct() {
                dl.write(&dx);
            }
        }
    }
}

//! LayerNorm over the last dimension, forward and backward, laid out like
//! `rms_norm`: parallel rows, each read once (mean and biased variance in
//! two passes over the row while it sits in L1), `f32` lanes, parameter
//! gradients summed per chunk of rows and then across chunks in `f64`.

use crate::error::KernelError;
use crate::norm::{check, store_param_grad};
use crate::rows::{RowFmt, Rows, dot, load_vec, sum, sum_sq_dev};
use crate::simd::simd_dispatch;
use crate::view::View;

/// `out = (input - mean) * rstd * weight + bias` over the last dimension
/// `H`, `rstd = 1 / sqrt(var + eps)` (biased variance); `mean` and `rstd`
/// are saved per row (f32).
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// the outputs (`out`, `mean`, `rstd`) must not overlap the inputs, each
/// other or themselves.
pub unsafe fn layer_norm(
    input: &View,
    weight: &View,
    bias: &View,
    out: &View,
    mean: &View,
    rstd: &View,
    eps: f64,
) -> Result<(), KernelError> {
    let rows = [("out", out), ("input", input)];
    let params = [("weight", weight), ("bias", bias)];
    let g = check(
        "layer_norm",
        &rows,
        &params,
        &[("mean", mean), ("rstd", rstd)],
    )?;
    let h = g.h;
    let job = Fwd {
        rows: Rows::new(g.lead, [out, input, mean, rstd]),
        out: RowFmt::of(out),
        input: RowFmt::of(input),
        // SAFETY: the parameters are valid `[H]` views.
        wb: unsafe { [load_vec(weight, h), load_vec(bias, h)] },
        eps,
    };
    // SAFETY: forwarded from this function's contract.
    job.rows
        .for_ranges(3 * h, |start, len| unsafe { fwd_rows(&job, start, len) });
    Ok(())
}

struct Fwd<'a> {
    rows: Rows<'a, 4>,
    out: RowFmt,
    input: RowFmt,
    wb: [Vec<f32>; 2],
    eps: f64,
}

simd_dispatch!(unsafe fn fwd_rows[](job: &Fwd, start: usize, len: usize) => fwd_impl[]);

/// # Safety
/// As for [`layer_norm`].
#[inline(always)]
unsafe fn fwd_impl(job: &Fwd, start: usize, len: usize) {
    let [w, b] = &job.wb;
    let h = w.len();
    let (w, b) = (&w[..h], &b[..h]);
    let (mut xs, mut ys) = (Vec::new(), vec![0f32; h]);
    for r in start..start + len {
        let [op, ip, mp, sp] = job.rows.ptrs(r);
        let (xl, ol) = (job.input.line(ip, h), job.out.line(op, h));
        // SAFETY: the rows lie inside the caller's views; outputs do not
        // overlap inputs.
        unsafe {
            let x = &xl.read(&mut xs)[..h];
            let mu = sum(x) / h as f32;
            let var = sum_sq_dev(x, mu) as f64 / h as f64;
            let rs = (1.0 / (var + job.eps).sqrt()) as f32;
            *(mp as *mut f32) = mu;
            *(sp as *mut f32) = rs;
            let dst = if ol.direct() {
                std::slice::from_raw_parts_mut(op as *mut f32, h)
            } else {
                &mut ys[..]
            };
            for (((y, &x), &w), &b) in dst.iter_mut().zip(x).zip(w).zip(b) {
                *y = (x - mu) * rs * w + b;
            }
            if !ol.direct() {
                ol.write(&ys);
            }
        }
    }
}

/// Backward of [`layer_norm`]: writes `grad_input`, `grad_weight` and
/// `grad_bias` (the latter two summed over rows) from the saved statistics.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// the outputs must not overlap the inputs, each other or themselves.
#[allow(clippy::too_many_arguments)]
pub unsafe fn layer_norm_backward(
    grad_out: &View,
    input: &View,
    weight: &View,
    mean: &View,
    rstd: &View,
    grad_input: &View,
    grad_weight: &View,
    grad_bias: &View,
) -> Result<(), KernelError> {
    let rows = [
        ("grad_input", grad_input),
        ("grad_out", grad_out),
        ("input", input),
    ];
    let params = [
        ("weight", weight),
        ("grad_weight", grad_weight),
        ("grad_bias", grad_bias),
    ];
    let stats = [("mean", mean), ("rstd", rstd)];
    let g = check("layer_norm_backward", &rows, &params, &stats)?;
    let h = g.h;
    let job = Bwd {
        rows: Rows::new(g.lead, [grad_input, grad_out, input, mean, rstd]),
        views: [grad_input, grad_out, input].map(RowFmt::of),
        // SAFETY: the weight is a valid `[H]` view.
        w: unsafe { load_vec(weight, h) },
    };
    let parts = job.rows.partials(5 * h, |start, len| {
        let mut acc = vec![0f32; 2 * h];
        // SAFETY: forwarded from this function's contract.
        unsafe { bwd_rows(&job, &mut acc, start, len) };
        acc
    });
    let (gw, gb): (Vec<_>, Vec<_>) = parts
        .into_iter()
        .map(|mut p| {
            let b = p.split_off(h);
            (p, b)
        })
        .unzip();
    // SAFETY: both are valid `[H]` outputs.
    unsafe {
        store_param_grad(grad_weight, &gw, h);
        store_param_grad(grad_bias, &gb, h);
    }
    Ok(())
}

struct Bwd<'a> {
    rows: Rows<'a, 5>,
    views: [RowFmt; 3],
    w: Vec<f32>,
}

simd_dispatch!(unsafe fn bwd_rows[](job: &Bwd, acc: &mut [f32], start: usize, len: usize) => bwd_impl[]);

/// `acc` holds the weight gradient, then the bias gradient.
///
/// # Safety
/// As for [`layer_norm_backward`].
#[inline(always)]
unsafe fn bwd_impl(job: &Bwd, acc: &mut [f32], start: usize, len: usize) {
    let h = job.w.len();
    let w = &job.w[..];
    let (aw, ab) = acc.split_at_mut(h);
    let (mut gs, mut xs) = (Vec::new(), Vec::new());
    let (mut gy, mut xh, mut dx) = (vec![0f32; h], vec![0f32; h], vec![0f32; h]);
    let [vdx, vg, vx] = job.views;
    for r in start..start + len {
        let [dp, gp, xp, mp, sp] = job.rows.ptrs(r);
        let dl = vdx.line(dp, h);
        // SAFETY: the rows lie inside the caller's views; outputs do not
        // overlap inputs.
        unsafe {
            let g = &vg.line(gp, h).read(&mut gs)[..h];
            let x = &vx.line(xp, h).read(&mut xs)[..h];
            let (mu, rs) = (*(mp as *const f32), *(sp as *const f32));
            for (((o, xo), &g), (&w, &x)) in gy.iter_mut().zip(&mut xh).zip(g).zip(w.iter().zip(x))
            {
                *o = g * w;
                *xo = (x - mu) * rs;
            }
            let a = sum(&gy) / h as f32;
            let b = dot(&gy, &xh) / h as f32;
            for (((aw, ab), &g), &xh) in aw.iter_mut().zip(ab.iter_mut()).zip(g).zip(&xh) {
                *aw += g * xh;
                *ab += g;
            }
            let dst = if dl.direct() {
                std::slice::from_raw_parts_mut(dp as *mut f32, h)
            } else {
                &mut dx[..]
            };
            for ((d, &gy), &xh) in dst.iter_mut().zip(&gy).zip(&xh) {
                *d = rs * (gy - a - xh * b);
            }
            if !dl.direct() {
                dl.write(&dx);
            }
        }
    }
}

//! Mean cross-entropy over class logits with `ignore_index`, forward and
//! backward. Targets are read and range-checked first (an error before any
//! write). Rows run in parallel for large inputs: each row's log-sum-exp is
//! taken with `f32` lanes around the row maximum; per-chunk losses are
//! summed in `f64` and combined in order.

use crate::error::{KernelError, bail};
use crate::float::exp_f32;
use crate::index::read_indices;
use crate::map::{check_f32, check_float};
use crate::rows::{RowFmt, Rows, max, sum};
use crate::simd::simd_dispatch;
use crate::view::View;

/// Checks logits `[N, C]` (and `[N, C]` gradients) against targets `[N]`;
/// returns the targets and the number of rows that count.
///
/// # Safety
/// `targets` must be a valid view.
unsafe fn prepare(
    kernel: &str,
    logits: &View,
    targets: &View,
    ignore_index: i64,
) -> Result<(Vec<i64>, usize), KernelError> {
    check_float(kernel, "logits", logits)?;
    let &[n, c] = logits.shape else {
        bail!("{kernel}: logits must be [N, C], got {:?}", logits.shape);
    };
    if targets.shape != [n] {
        bail!("{kernel}: targets {:?}, expected [{n}]", targets.shape);
    }
    // SAFETY: forwarded from this function's contract.
    let t = unsafe { read_indices(kernel, targets, c as usize, Some(ignore_index))? };
    let count = t.iter().filter(|&&x| x != ignore_index).count();
    Ok((t, count))
}

/// `loss = mean over rows with target != ignore_index of
/// (logsumexp(row) - row[target])`, a 0-d `f32`; NaN when every row is
/// ignored. `logits` is `[N, C]` (`f32`/`f16`/`bf16`), `targets` `[N]`
/// `i32`/`i64`; a target outside `0..C` that is not `ignore_index` is an
/// error.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `loss` must not overlap the inputs.
pub unsafe fn cross_entropy(
    logits: &View,
    targets: &View,
    loss: &View,
    ignore_index: i64,
) -> Result<(), KernelError> {
    let k = "cross_entropy";
    check_f32(k, "loss", loss)?;
    if !loss.shape.is_empty() {
        bail!("{k}: loss must be 0-d, got {:?}", loss.shape);
    }
    // SAFETY: `targets` is valid per this function's contract.
    let (t, count) = unsafe { prepare(k, logits, targets, ignore_index)? };
    let c = logits.shape[1] as usize;
    let job = Job {
        rows: Rows::new(&logits.shape[..1], [logits, logits]),
        views: [logits, logits].map(RowFmt::of),
        t,
        ignore_index,
        c,
        factor: 0.0,
    };
    let parts = job.rows.partials(2 * c, |start, len| {
        let mut acc = 0f64;
        // SAFETY: forwarded from this function's contract.
        unsafe { loss_rows(&job, &mut acc, start, len) };
        acc
    });
    let total: f64 = parts.iter().sum();
    // SAFETY: `loss` is a valid f32 scalar.
    unsafe { *(loss.ptr as *mut f32) = (total / count as f64) as f32 };
    Ok(())
}

/// Backward of [`cross_entropy`]: `grad_logits = grad_loss * (softmax(row)
/// - onehot(target)) / count` for counted rows and 0 for ignored rows
/// (`[N, C]`, the dtype of `logits`).
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `grad_logits` must not overlap the inputs or itself.
pub unsafe fn cross_entropy_backward(
    logits: &View,
    targets: &View,
    grad_logits: &View,
    grad_loss: f64,
    ignore_index: i64,
) -> Result<(), KernelError> {
    let k = "cross_entropy_backward";
    check_float(k, "grad_logits", grad_logits)?;
    if grad_logits.dtype != logits.dtype || grad_logits.shape != logits.shape {
        bail!(
            "{k}: grad_logits {:?} {:?} does not match logits",
            grad_logits.dtype,
            grad_logits.shape
        );
    }
    // SAFETY: `targets` is valid per this function's contract.
    let (t, count) = unsafe { prepare(k, logits, targets, ignore_index)? };
    let c = logits.shape[1] as usize;
    let job = Job {
        rows: Rows::new(&logits.shape[..1], [grad_logits, logits]),
        views: [grad_logits, logits].map(RowFmt::of),
        t,
        ignore_index,
        c,
        factor: (grad_loss / count.max(1) as f64) as f32,
    };
    // SAFETY: forwarded from this function's contract.
    job.rows
        .for_ranges(3 * c, |start, len| unsafe { grad_rows(&job, start, len) });
    Ok(())
}

/// Rows of (output, logits); the forward uses the logits twice.
struct Job<'a> {
    rows: Rows<'a, 2>,
    views: [RowFmt; 2],
    t: Vec<i64>,
    ignore_index: i64,
    c: usize,
    factor: f32,
}

simd_dispatch!(unsafe fn loss_rows[](job: &Job, acc: &mut f64, start: usize, len: usize) => loss_impl[]);
simd_dispatch!(unsafe fn grad_rows[](job: &Job, start: usize, len: usize) => grad_impl[]);

/// `(max, sum of exp(x - max))` of a row, the latter written to `e`.
#[inline(always)]
fn exp_row(x: &[f32], e: &mut [f32]) -> (f32, f32) {
    let m = max(x);
    for (e, &x) in e.iter_mut().zip(x) {
        *e = exp_f32(x - m);
    }
    (m, sum(&e[..x.len()]))
}

/// # Safety
/// As for [`cross_entropy`].
#[inline(always)]
unsafe fn loss_impl(job: &Job, acc: &mut f64, start: usize, len: usize) {
    let c = job.c;
    let (mut xs, mut es) = (Vec::new(), vec![0f32; c]);
    for r in start..start + len {
        let t = job.t[r];
        if t == job.ignore_index {
            continue;
        }
        let [_, xp] = job.rows.ptrs(r);
        // SAFETY: row `r` of the logits.
        let x = unsafe { &job.views[1].line(xp, c).read(&mut xs)[..c] };
        let (m, s) = exp_row(x, &mut es);
        *acc += (m - x[t as usize]) as f64 + (s as f64).ln();
    }
}

/// # Safety
/// As for [`cross_entropy_backward`].
#[inline(always)]
unsafe fn grad_impl(job: &Job, start: usize, len: usize) {
    let c = job.c;
    let (mut xs, mut es) = (Vec::new(), vec![0f32; c]);
    for r in start..start + len {
        let [gp, xp] = job.rows.ptrs(r);
        let gl = job.views[0].line(gp, c);
        let t = job.t[r];
        if t == job.ignore_index {
            es.fill(0.0);
        } else {
            // SAFETY: row `r` of the logits.
            let x = unsafe { &job.views[1].line(xp, c).read(&mut xs)[..c] };
            let (_, s) = exp_row(x, &mut es);
            let f = job.factor / s;
            for e in es.iter_mut() {
                *e *= f;
            }
            es[t as usize] -= job.factor;
        }
        // SAFETY: row `r` of the output, which overlaps no input.
        unsafe { gl.write(&es) };
    }
}

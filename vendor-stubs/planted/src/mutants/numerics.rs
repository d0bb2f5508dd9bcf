//! Hand-written kernels with one planted mistake each (numerics, sizes,
//! rounding, edge values, aliasing). Each is called by `crate::full` only
//! when its bug is selected, and only for the dtypes or sizes the bug is
//! about; otherwise the correct `ferrite-kernels` kernel runs.
//!
//! # Safety
//! Every function here takes views that address live host memory of their
//! dtype, as the SDK checked them.
#![allow(clippy::missing_safety_doc)]

use ferrite_kernels::{DType, View};

use super::elems::{addresses, load, load_int, round, rows, store, store_int, truncate};

fn is_half(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16)
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Row width above which the "vocabulary" code paths run.
pub const WIDE_ROW: usize = 65536;

/// softmax in two passes, the second re-reading the input after the first
/// overwrote the output (wrong when `out` is `input`).
pub unsafe fn softmax_second_pass(input: &View<'_>, out: &View<'_>) {
    let (d, od) = (input.dtype, out.dtype);
    for (ri, ro) in rows(input).iter().zip(rows(out)) {
        // SAFETY: addresses of live elements.
        unsafe {
            let max = ri
                .iter()
                .map(|&p| load(d, p))
                .fold(f64::NEG_INFINITY, f64::max);
            let mut sum = 0.0;
            for (&i, &o) in ri.iter().zip(&ro) {
                let e = if max == f64::NEG_INFINITY {
                    0.0
                } else {
                    (load(d, i) - max).exp()
                };
                sum += e;
                store(od, o, e);
            }
            for (&i, &o) in ri.iter().zip(&ro) {
                // Planted: x[i] is read again; in place it now holds exp(x[i] - max).
                let e = if max == f64::NEG_INFINITY {
                    f64::NAN
                } else {
                    (load(d, i) - max).exp()
                };
                store(od, o, e / sum);
            }
        }
    }
}

/// swiglu_backward writing grad_gate[i] before re-reading gate[i] for grad_up.
pub unsafe fn swiglu_backward_reread(
    gate: &View<'_>,
    up: &View<'_>,
    grad_out: &View<'_>,
    grad_gate: &View<'_>,
    grad_up: &View<'_>,
) {
    let d = gate.dtype;
    let (g, u, go) = (addresses(gate), addresses(up), addresses(grad_out));
    let (gg, gu) = (addresses(grad_gate), addresses(grad_up));
    for i in 0..g.len() {
        // SAFETY: addresses of live elements.
        unsafe {
            let (x, y, o) = (load(d, g[i]), load(d, u[i]), load(d, go[i]));
            let s = sigmoid(x);
            store(grad_gate.dtype, gg[i], o * y * s * (1.0 + x * (1.0 - s)));
            // Planted: gate re-read after grad_gate was written.
            let x2 = load(d, g[i]);
            store(grad_up.dtype, gu[i], o * x2 * sigmoid(x2));
        }
    }
}

/// log_softmax whose wide-row path leaves the last 8192-element tile out of
/// the log-sum-exp. Returns false (not handled) for narrow rows.
pub unsafe fn log_softmax_wide(input: &View<'_>, out: &View<'_>) -> bool {
    let n = input.shape.last().copied().unwrap_or(1) as usize;
    if n <= WIDE_ROW {
        return false;
    }
    const TILE: usize = 8192;
    let kept = (n - 1) / TILE * TILE;
    for (ri, ro) in rows(input).iter().zip(rows(out)) {
        // SAFETY: addresses of live elements.
        unsafe {
            let x: Vec<f64> = ri.iter().map(|&p| load(input.dtype, p)).collect();
            let max = x[..kept].iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + x[..kept].iter().map(|v| (v - max).exp()).sum::<f64>().ln();
            for (v, &o) in x.iter().zip(&ro) {
                store(out.dtype, o, v - lse);
            }
        }
    }
    true
}

/// cross_entropy whose wide-row path computes log-sum-exp in f32 without
/// the max shift. Returns false (not handled) for narrow rows.
pub unsafe fn cross_entropy_wide(
    logits: &View<'_>,
    targets: &View<'_>,
    loss: &View<'_>,
    ignore_index: i64,
) -> bool {
    let n = logits.shape.last().copied().unwrap_or(1) as usize;
    if n <= WIDE_ROW {
        return false;
    }
    let t = addresses(targets);
    let (mut total, mut count) = (0.0f64, 0usize);
    for (row, &tp) in rows(logits).iter().zip(&t) {
        // SAFETY: addresses of live elements.
        unsafe {
            let target = load_int(targets.dtype, tp);
            if target == ignore_index || target < 0 || target as usize >= n {
                continue;
            }
            let sum: f32 = row
                .iter()
                .map(|&p| (load(logits.dtype, p) as f32).exp())
                .sum();
            total += f64::from(sum.ln()) - load(logits.dtype, row[target as usize]);
            count += 1;
        }
    }
    if count == 0 {
        return false;
    }
    // SAFETY: the loss is a live scalar.
    unsafe { store(loss.dtype, loss.ptr, total / count as f64) };
    true
}

/// sum_squares accumulating in the input dtype for half inputs longer than
/// 4096 elements. Returns false (not handled) otherwise.
pub unsafe fn sum_squares_half(input: &View<'_>, out: &View<'_>) -> bool {
    if !is_half(input.dtype) || input.numel() <= 4096 {
        return false;
    }
    let mut acc = 0.0;
    for p in addresses(input) {
        // SAFETY: addresses of live elements.
        let x = unsafe { load(input.dtype, p) };
        acc = round(input.dtype, acc + x * x);
    }
    // SAFETY: the output is a live scalar.
    unsafe { store(out.dtype, out.ptr, acc) };
    true
}

/// Saves the last partial 64-wide column tile of `out` (N > 256, N % 64 != 0)
/// so it can be put back after the kernel ("never written back").
pub unsafe fn linear_tile_edge_save(out: &View<'_>) -> Vec<(*mut u8, Vec<u8>)> {
    let n = out.shape.last().copied().unwrap_or(1) as usize;
    if n <= 256 || n % 64 == 0 {
        return Vec::new();
    }
    let tail = rows(out).into_iter().flat_map(|r| r[n - n % 64..].to_vec());
    // SAFETY: addresses of live elements.
    unsafe { save(tail, out.dtype.size()) }
}

/// The bytes of the elements of `size` bytes at `addresses`, kept with
/// their addresses for [`restore`].
///
/// # Safety
/// Every address is a live element of `size` bytes.
pub unsafe fn save(
    addresses: impl IntoIterator<Item = *mut u8>,
    size: usize,
) -> Vec<(*mut u8, Vec<u8>)> {
    addresses
        .into_iter()
        // SAFETY: forwarded.
        .map(|p| (p, unsafe { std::slice::from_raw_parts(p, size) }.to_vec()))
        .collect()
}

/// Puts back what [`save`] (or a `*_save` of a mutant) saved.
pub unsafe fn restore(saved: Vec<(*mut u8, Vec<u8>)>) {
    for (p, bytes) in saved {
        // SAFETY: the same live elements.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
    }
}

/// silu with half results truncated. Returns false for f32/f64.
pub unsafe fn silu_truncated(input: &View<'_>, out: &View<'_>) -> bool {
    if !is_half(out.dtype) {
        return false;
    }
    // SAFETY: forwarded.
    unsafe { super::elems::map(input, out, truncate, |x| x * sigmoid(x)) };
    true
}

/// erf, Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7).
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    (1.0 - poly * (-x * x).exp()).copysign(x)
}

/// gelu in the erf form.
pub unsafe fn gelu_erf(input: &View<'_>, out: &View<'_>) {
    // SAFETY: forwarded.
    unsafe {
        super::elems::map(input, out, round, |x| {
            if x.is_infinite() {
                if x > 0.0 { x } else { 0.0 }
            } else {
                0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))
            }
        })
    };
}

/// swiglu with sigmoid rounded to f16 precision.
pub unsafe fn swiglu_low_precision(gate: &View<'_>, up: &View<'_>, out: &View<'_>) {
    let (g, u, o) = (addresses(gate), addresses(up), addresses(out));
    for i in 0..o.len() {
        // SAFETY: addresses of live elements.
        unsafe {
            let (x, y) = (load(gate.dtype, g[i]), load(up.dtype, u[i]));
            let s = round(DType::F16, sigmoid(x));
            store(out.dtype, o[i], x * s * y);
        }
    }
}

/// exp as 2^n * p(f) with a quadratic p (about 1e-3 relative error).
pub unsafe fn exp_fast(input: &View<'_>, out: &View<'_>) {
    // SAFETY: forwarded.
    unsafe {
        super::elems::map(input, out, round, |x| {
            if !x.is_finite() || x.abs() > 1000.0 {
                return x.exp();
            }
            let t = x * std::f64::consts::LOG2_E;
            let n = t.floor();
            let f = t - n;
            let p = 1.0 + f * (0.656_57 + 0.343_43 * f);
            p * 2f64.powi(n as i32)
        })
    };
}

/// log_softmax_backward with the row sum accumulated in the output dtype.
/// Returns false for f32/f64.
pub unsafe fn log_softmax_backward_half(y: &View<'_>, g: &View<'_>, gi: &View<'_>) -> bool {
    if !is_half(gi.dtype) {
        return false;
    }
    let d = gi.dtype;
    for ((ry, rg), rgi) in rows(y).iter().zip(rows(g)).zip(rows(gi)) {
        // SAFETY: addresses of live elements.
        unsafe {
            let mut sum = 0.0;
            for &p in &rg {
                sum = round(d, sum + load(g.dtype, p));
            }
            for i in 0..rgi.len() {
                let v = load(g.dtype, rg[i]) - load(y.dtype, ry[i]).exp() * sum;
                store(d, rgi[i], v);
            }
        }
    }
    true
}

/// rms_norm dividing by sqrt(mean(x^2)) + eps.
pub unsafe fn rms_norm_eps_outside(
    input: &View<'_>,
    weight: &View<'_>,
    out: &View<'_>,
    inv_rms: &View<'_>,
    eps: f64,
) {
    // SAFETY: forwarded.
    unsafe {
        rms_norm_rows(input, weight, out, inv_rms, |x| {
            let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len().max(1) as f64;
            1.0 / (ms.sqrt() + eps)
        })
    }
}

/// rms_norm with each row's inverse scale given by `inv_of` (of the row's
/// values): `out = x inv w`, `inv_rms = inv`.
pub unsafe fn rms_norm_rows(
    input: &View<'_>,
    weight: &View<'_>,
    out: &View<'_>,
    inv_rms: &View<'_>,
    inv_of: impl Fn(&[f64]) -> f64,
) {
    let w = addresses(weight);
    let r = addresses(inv_rms);
    for (k, (ri, ro)) in rows(input).iter().zip(rows(out)).enumerate() {
        // SAFETY: addresses of live elements.
        unsafe {
            let x: Vec<f64> = ri.iter().map(|&p| load(input.dtype, p)).collect();
            let inv = inv_of(&x);
            for ((v, &o), &wp) in x.iter().zip(&ro).zip(&w) {
                store(out.dtype, o, v * inv * load(weight.dtype, wp));
            }
            if let Some(&rp) = r.get(k) {
                store(inv_rms.dtype, rp, inv);
            }
        }
    }
}

/// softmax whose running row maximum starts at 0 rather than -inf: rows
/// of logits all far below 0 underflow to 0/0.
pub unsafe fn softmax_max_from_zero(input: &View<'_>, out: &View<'_>) {
    let (d, od) = (input.dtype, out.dtype);
    for (ri, ro) in rows(input).iter().zip(rows(out)) {
        // SAFETY: addresses of live elements.
        unsafe {
            let x: Vec<f64> = ri.iter().map(|&p| load(d, p)).collect();
            // Planted: the maximum starts at 0.
            let max = x.iter().copied().fold(0.0, f64::max);
            let e: Vec<f64> = x.iter().map(|v| (v - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            for (v, &o) in e.iter().zip(&ro) {
                store(od, o, v / sum);
            }
        }
    }
}

/// Softmax in one pass over each row: the maximum starts at the first
/// logit (its sum at 1), and each later logit rescales the sum by
/// `exp(old max - new max)` with no guard for a maximum still at -inf, so a
/// row led by two -inf logits computes `exp(-inf - -inf)`, NaN.
pub unsafe fn softmax_online_unguarded(input: &View<'_>, out: &View<'_>) {
    let (d, od) = (input.dtype, out.dtype);
    for (ri, ro) in rows(input).iter().zip(rows(out)) {
        // SAFETY: addresses of live elements.
        unsafe {
            let x: Vec<f64> = ri.iter().map(|&p| load(d, p)).collect();
            let Some(&first) = x.first() else { continue };
            let (mut max, mut sum) = (first, 1.0);
            for &v in &x[1..] {
                let next = if v > max || v.is_nan() { v } else { max };
                // Planted: exp(-inf - -inf) when both are -inf.
                sum = sum * (max - next).exp() + (v - next).exp();
                max = next;
            }
            for (&v, &o) in x.iter().zip(&ro) {
                store(od, o, (v - max).exp() / sum);
            }
        }
    }
}

/// The process-wide scratch of [`softmax_shared_scratch`]: one row's
/// exponentials, as f64 bits (atomics, so the race is on values, not
/// undefined behaviour).
static SCRATCH: [std::sync::atomic::AtomicU64; SCRATCH_LEN] =
    [const { std::sync::atomic::AtomicU64::new(0) }; SCRATCH_LEN];
const SCRATCH_LEN: usize = 4096;

/// Softmax through [`SCRATCH`] without a lock: each row's exponentials are
/// stored there, the thread pauses for 100 µs (as waiting on a kernel or a
/// page fault would let another call run), and they are read back to
/// normalize.
/// Right alone; two calls at once read each other's rows. Returns false
/// (the correct kernel runs) for rows wider than the scratch.
pub unsafe fn softmax_shared_scratch(input: &View<'_>, out: &View<'_>) -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    let (d, od) = (input.dtype, out.dtype);
    let (ri, ro) = (rows(input), rows(out));
    if ri.iter().any(|r| r.len() > SCRATCH_LEN) {
        return false;
    }
    for (ri, ro) in ri.iter().zip(&ro) {
        // SAFETY: addresses of live elements.
        unsafe {
            let x: Vec<f64> = ri.iter().map(|&p| load(d, p)).collect();
            let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            for (slot, v) in SCRATCH.iter().zip(&x) {
                let e = if max == f64::NEG_INFINITY {
                    f64::NAN
                } else {
                    (v - max).exp()
                };
                slot.store(e.to_bits(), Relaxed);
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
            let e: Vec<f64> = SCRATCH[..x.len()]
                .iter()
                .map(|s| f64::from_bits(s.load(Relaxed)))
                .collect();
            let sum: f64 = e.iter().sum();
            for (v, &o) in e.iter().zip(ro) {
                store(od, o, v / sum);
            }
        }
    }
    true
}

/// silu_backward as `g (1/(1+e) + x e / (1+e)^2)` with `e = exp(-x)`,
/// unguarded: below x = -709 `e` overflows and the result is NaN.
pub unsafe fn silu_backward_unguarded(g: &View<'_>, x: &View<'_>, gi: &View<'_>) {
    let (ga, xa, gia) = (addresses(g), addresses(x), addresses(gi));
    for i in 0..gia.len() {
        // SAFETY: addresses of live elements.
        unsafe {
            let (go, v) = (load(g.dtype, ga[i]), load(x.dtype, xa[i]));
            let e = (-v).exp();
            let d = 1.0 / (1.0 + e) + v * e / ((1.0 + e) * (1.0 + e));
            store(gi.dtype, gia[i], go * d);
        }
    }
}

/// f64 to f16 or bf16 by shifting the mantissa without setting the quiet
/// bit: a NaN whose payload lies only in the bits shifted out becomes
/// infinity. Returns false (not handled) for other pairs of dtypes.
pub unsafe fn cast_nan_payload_inf(src: &View<'_>, dst: &View<'_>) -> bool {
    let kept = match dst.dtype {
        DType::F16 => 10,
        DType::BF16 => 7,
        _ => return false,
    };
    if src.dtype != DType::F64 {
        return false;
    }
    for (&s, &d) in addresses(src).iter().zip(&addresses(dst)) {
        // SAFETY: addresses of live elements.
        unsafe {
            let v = load(src.dtype, s);
            let payload = (v.to_bits() >> (52 - kept)) & ((1 << kept) - 1);
            let r = if v.is_nan() && payload == 0 {
                f64::INFINITY.copysign(v)
            } else {
                v
            };
            store(dst.dtype, d, r);
        }
    }
    true
}

/// layer_norm with the unbiased variance (divides by n - 1).
pub unsafe fn layer_norm_unbiased(
    input: &View<'_>,
    weight: &View<'_>,
    bias: &View<'_>,
    out: &View<'_>,
    mean: &View<'_>,
    rstd: &View<'_>,
    eps: f64,
) {
    // SAFETY: forwarded.
    unsafe {
        layer_norm_by(input, [weight, bias, out, mean, rstd], eps, |x| {
            let n = x.len() as f64;
            let mu = x.iter().sum::<f64>() / n;
            // Planted: n - 1.
            let var = x.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / (n - 1.0).max(1.0);
            (mu, var)
        })
    }
}

/// layer_norm of each row of `input` with the mean and variance `stats`
/// gives for it; `views` are its weight and bias, then its output, mean
/// and rstd.
pub unsafe fn layer_norm_by(
    input: &View<'_>,
    views: [&View<'_>; 5],
    eps: f64,
    stats: impl Fn(&[f64]) -> (f64, f64),
) {
    let [weight, bias, out, mean, rstd] = views;
    let (w, b) = (addresses(weight), addresses(bias));
    let (m, r) = (addresses(mean), addresses(rstd));
    for (k, (ri, ro)) in rows(input).iter().zip(rows(out)).enumerate() {
        // SAFETY: addresses of live elements.
        unsafe {
            let x: Vec<f64> = ri.iter().map(|&p| load(input.dtype, p)).collect();
            let (mu, var) = stats(&x);
            let rs = 1.0 / (var + eps).sqrt();
            for (i, (v, &o)) in x.iter().zip(&ro).enumerate() {
                let y = (v - mu) * rs * load(weight.dtype, w[i]) + load(bias.dtype, b[i]);
                store(out.dtype, o, y);
            }
            if let (Some(&mp), Some(&rp)) = (m.get(k), r.get(k)) {
                store(mean.dtype, mp, mu);
                store(rstd.dtype, rp, rs);
            }
        }
    }
}

/// f32 -> bf16 rounding ties away from zero. Returns false for other casts.
pub unsafe fn cast_bf16_ties_away(src: &View<'_>, dst: &View<'_>) -> bool {
    if (src.dtype, dst.dtype) != (DType::F32, DType::BF16) {
        return false;
    }
    for (s, d) in addresses(src).into_iter().zip(addresses(dst)) {
        // SAFETY: addresses of live elements.
        unsafe {
            let bits = s.cast::<u32>().read_unaligned();
            let out = if f32::from_bits(bits).is_nan() {
                (bits >> 16) as u16 | 0x40
            } else {
                (bits.wrapping_add(0x8000) >> 16) as u16
            };
            d.cast::<u16>().write_unaligned(out);
        }
    }
    true
}

/// f64 -> bf16 through f32 (double rounding). Returns false for other casts.
pub unsafe fn cast_f64_bf16_double(src: &View<'_>, dst: &View<'_>) -> bool {
    if (src.dtype, dst.dtype) != (DType::F64, DType::BF16) {
        return false;
    }
    // SAFETY: forwarded.
    unsafe { super::elems::map(src, dst, round, |x| f64::from(x as f32)) };
    true
}

/// For each element of the reduction's output (row-major), the addresses of
/// the input elements it reduces over `dim`.
pub(super) fn groups(input: &View<'_>, dim: usize) -> Vec<Vec<*mut u8>> {
    if input.shape.is_empty() || dim >= input.shape.len() {
        return vec![vec![input.ptr]];
    }
    let extent = input.shape[dim] as usize;
    let outer: usize = input.shape[..dim].iter().product::<i64>() as usize;
    let inner: usize = input.shape[dim + 1..].iter().product::<i64>() as usize;
    let all = addresses(input);
    let mut out = vec![Vec::with_capacity(extent); outer * inner];
    for o in 0..outer {
        for e in 0..extent {
            for i in 0..inner {
                out[o * inner + i].push(all[(o * extent + e) * inner + i]);
            }
        }
    }
    out
}

/// max with NaN ignored. Returns false when a reduced extent is 0.
pub unsafe fn max_ignoring_nan(input: &View<'_>, out: &View<'_>, dim: usize) -> bool {
    let g = groups(input, dim);
    if g.iter().any(Vec::is_empty) {
        return false;
    }
    for (grp, o) in g.iter().zip(addresses(out)) {
        // SAFETY: addresses of live elements.
        unsafe {
            let m = grp
                .iter()
                .map(|&p| load(input.dtype, p))
                .fold(f64::NEG_INFINITY, |a, b| if b > a { b } else { a });
            store(out.dtype, o, m);
        }
    }
    true
}

/// max that stops scanning a lane at the first +inf (a NaN after it is
/// missed). Returns false when a reduced extent is 0.
pub unsafe fn max_stopping_at_infinity(input: &View<'_>, out: &View<'_>, dim: usize) -> bool {
    let g = groups(input, dim);
    if g.iter().any(Vec::is_empty) {
        return false;
    }
    for (grp, o) in g.iter().zip(addresses(out)) {
        let mut m = f64::NEG_INFINITY;
        for &p in grp {
            // SAFETY: the address of a live element.
            let v = unsafe { load(input.dtype, p) };
            if v.is_nan() || v > m {
                m = v;
            }
            if m == f64::INFINITY || m.is_nan() {
                break;
            }
        }
        // SAFETY: the address of a live output element.
        unsafe { store(out.dtype, o, m) };
    }
    true
}

/// The sum of squares scaled by the largest |x| (NaN never becomes the
/// scale): `scale^2 sum (x / scale)^2`, which an infinity turns into NaN.
pub unsafe fn sum_squares_scaled(input: &View<'_>, out: &View<'_>) {
    let xs: Vec<f64> = addresses(input)
        .into_iter()
        // SAFETY: addresses of live elements.
        .map(|p| unsafe { load(input.dtype, p) })
        .collect();
    let scale = xs
        .iter()
        .fold(0.0f64, |m, &x| if x.abs() > m { x.abs() } else { m });
    let total = if scale > 0.0 {
        xs.iter().map(|x| (x / scale) * (x / scale)).sum::<f64>() * scale * scale
    } else {
        xs.iter().map(|x| x * x).sum::<f64>()
    };
    // SAFETY: the live f32 scalar output.
    unsafe { store(out.dtype, out.ptr, total) };
}

/// argmax returning the last of equal maxima. Returns false when a reduced
/// extent is 0.
pub unsafe fn argmax_last(input: &View<'_>, out: &View<'_>, dim: usize) -> bool {
    let g = groups(input, dim);
    if g.iter().any(Vec::is_empty) {
        return false;
    }
    for (grp, o) in g.iter().zip(addresses(out)) {
        // SAFETY: addresses of live elements.
        unsafe {
            let (mut best, mut at) = (f64::NEG_INFINITY, 0usize);
            for (k, &p) in grp.iter().enumerate() {
                let v = load(input.dtype, p);
                if v.is_nan() {
                    if !best.is_nan() {
                        (best, at) = (v, k);
                    }
                } else if !best.is_nan() && v >= best {
                    (best, at) = (v, k);
                }
            }
            store_int(out.dtype, o, at as i64);
        }
    }
    true
}

/// relu_backward passing the gradient at x == 0.
pub unsafe fn relu_backward_at_zero(g: &View<'_>, x: &View<'_>, gi: &View<'_>) {
    let (ga, xa, gia) = (addresses(g), addresses(x), addresses(gi));
    for i in 0..gia.len() {
        // SAFETY: addresses of live elements.
        unsafe {
            let v = load(x.dtype, xa[i]);
            let r = if v >= 0.0 { load(g.dtype, ga[i]) } else { 0.0 };
            store(gi.dtype, gia[i], if v.is_nan() { f64::NAN } else { r });
        }
    }
}

/// relu_backward as `x > 0 ? g : 0`: 0 for a NaN input.
pub unsafe fn relu_backward_nan_zero(g: &View<'_>, x: &View<'_>, gi: &View<'_>) {
    let (ga, xa, gia) = (addresses(g), addresses(x), addresses(gi));
    for i in 0..gia.len() {
        // SAFETY: addresses of live elements.
        unsafe {
            let r = if load(x.dtype, xa[i]) > 0.0 {
                load(g.dtype, ga[i])
            } else {
                0.0
            };
            store(gi.dtype, gia[i], r);
        }
    }
}

/// pow_scalar at exponent 0.5 as sqrt.
pub unsafe fn pow_half_as_sqrt(input: &View<'_>, out: &View<'_>) {
    // SAFETY: forwarded.
    unsafe { super::elems::map(input, out, round, f64::sqrt) };
}

/// sigmoid as `1 / (1 + exp(-x))` in f32, whose `exp(-x)` overflows to
/// infinity below -88.7 (the result then 0).
pub unsafe fn sigmoid_overflowing_exp(input: &View<'_>, out: &View<'_>) {
    // SAFETY: forwarded.
    unsafe {
        super::elems::map(input, out, round, |x| {
            let e = (-(x as f32)).exp();
            f64::from(1.0 / (1.0 + e))
        })
    };
}

/// log with log(0) = NaN.
pub unsafe fn log_zero_nan(input: &View<'_>, out: &View<'_>) {
    // SAFETY: forwarded.
    unsafe {
        super::elems::map(
            input,
            out,
            round,
            |x| if x == 0.0 { f64::NAN } else { x.ln() },
        )
    };
}

/// sqrt with sqrt(-0) = +0.
pub unsafe fn sqrt_neg_zero(input: &View<'_>, out: &View<'_>) {
    // SAFETY: forwarded.
    unsafe { super::elems::map(input, out, round, |x| if x == 0.0 { 0.0 } else { x.sqrt() }) };
}

/// pow_scalar with NaN^0 = NaN.
pub unsafe fn pow_nan_zero(input: &View<'_>, out: &View<'_>, exponent: f64) {
    // SAFETY: forwarded.
    unsafe {
        super::elems::map(input, out, round, |x| {
            if x.is_nan() {
                f64::NAN
            } else {
                x.powf(exponent)
            }
        })
    };
}

/// A compact copy of `indices` with each index passed through `f` (given
/// the weight's row count), as i64 or i32 like the original.
pub unsafe fn remap_indices(
    indices: &View<'_>,
    rows: i64,
    f: impl Fn(i64, i64) -> i64,
) -> Vec<i64> {
    addresses(indices)
        .into_iter()
        // SAFETY: addresses of live elements.
        .map(|p| f(unsafe { load_int(indices.dtype, p) }, rows))
        .collect()
}

/// Each hand-written mutant is really wrong where its bug says (so a test
/// that the suite misses it is about the suite, not a dead mutant), and
/// right elsewhere.
/// max that keeps a NaN only when it lies in a lane's first block of 64
/// elements: the blocks' (or work-items') maxima are combined with a plain
/// comparison, which a NaN never wins. Returns false when a reduced extent
/// is 0.
pub unsafe fn max_nan_first_block_only(input: &View<'_>, out: &View<'_>, dim: usize) -> bool {
    let g = groups(input, dim);
    if g.iter().any(Vec::is_empty) {
        return false;
    }
    for (grp, o) in g.iter().zip(addresses(out)) {
        let mut m = f64::NEG_INFINITY;
        for (j, &p) in grp.iter().enumerate() {
            // SAFETY: the address of a live element.
            let v = unsafe { load(input.dtype, p) };
            if v.is_nan() {
                if j < 64 {
                    m = v;
                    break;
                }
            } else if v > m {
                m = v;
            }
        }
        // SAFETY: the address of a live output element.
        unsafe { store(out.dtype, o, m) };
    }
    true
}

/// A reduction over a dim of extent 1 taken for a copy: the input's
/// elements read in memory order from its first, as if it were compact,
/// and written to the output in its logical order. Returns false unless
/// the reduced extent is 1.
pub unsafe fn reduce_unit_dim_as_copy(input: &View<'_>, out: &View<'_>, dim: usize) -> bool {
    if input.shape.get(dim) != Some(&1) {
        return false;
    }
    let size = input.dtype.size();
    for (k, o) in addresses(out).into_iter().enumerate() {
        // SAFETY: the element `k` places after the view's first lies in
        // its (padded) buffer: the views this runs on cover that many.
        let v = unsafe { load(input.dtype, input.ptr.wrapping_add(k * size)) };
        // SAFETY: the address of a live output element.
        unsafe { store(out.dtype, o, v) };
    }
    true
}

/// Every element of `out` set to `v` (a row-wise shortcut's constant).
pub unsafe fn fill_value(out: &View<'_>, v: f64) {
    for o in addresses(out) {
        // SAFETY: the address of a live output element.
        unsafe { store(out.dtype, o, v) };
    }
}

/// The first element of `v`.
pub unsafe fn load_one(v: &View<'_>) -> f64 {
    // SAFETY: the caller's live element.
    unsafe { load(v.dtype, v.ptr) }
}

/// max taken with `fmax` into the output, which is never initialised (an
/// atomic-max kernel that counts on a memset): a NaN already there is
/// ignored, so the NaN poison passes, but any number there wins if it is
/// larger. A NaN input still gives NaN. Returns false when a reduced
/// extent is 0.
pub unsafe fn max_into_uninitialised(input: &View<'_>, out: &View<'_>, dim: usize) -> bool {
    let g = groups(input, dim);
    if g.iter().any(Vec::is_empty) {
        return false;
    }
    for (grp, o) in g.iter().zip(addresses(out)) {
        // SAFETY: the address of a live output element.
        let mut m = unsafe { load(out.dtype, o) };
        for &p in grp {
            // SAFETY: the address of a live element.
            let v = unsafe { load(input.dtype, p) };
            if v.is_nan() {
                m = v;
                break;
            }
            m = m.max(v);
        }
        // SAFETY: the address of a live output element.
        unsafe { store(out.dtype, o, m) };
    }
    true
}

/// sin with the argument reduced in f32 (each step rounded to f32): off by
/// about `|x| u(f32)` for large `|x|`.
pub unsafe fn sin_reduced_in_f32(input: &View<'_>, out: &View<'_>) {
    let tau = std::f32::consts::TAU;
    // SAFETY: forwarded.
    unsafe {
        super::elems::map(input, out, round, |x| {
            let x = x as f32;
            let r = x - (x / tau).round() * tau;
            f64::from(r).sin()
        })
    };
}

/// The address of each element of `v` broadcast to `out`'s shape, in
/// `out`'s order (the stride is 0 where `v` broadcasts).
pub(crate) fn broadcast_addresses(v: &View<'_>, out: &View<'_>) -> Vec<*mut u8> {
    let shape = out.shape;
    let lead = shape.len() - v.shape.len();
    let strides: Vec<i64> = (0..shape.len())
        .map(|d| match d.checked_sub(lead) {
            Some(k) if v.shape[k] == shape[d] => v.strides[k],
            _ => 0,
        })
        .collect();
    addresses(&View {
        shape,
        strides: &strides,
        ..*v
    })
}

/// select as the blend `c a + (1 - c) b` in f64 (floating dtypes only:
/// false is returned for the others, which the correct kernel serves).
pub unsafe fn select_blend(cond: &View<'_>, a: &View<'_>, b: &View<'_>, out: &View<'_>) -> bool {
    if !out.dtype.is_float() {
        return false;
    }
    let c = broadcast_addresses(cond, out);
    let (x, y) = (broadcast_addresses(a, out), broadcast_addresses(b, out));
    let o = addresses(out);
    for k in 0..o.len() {
        // SAFETY: addresses of live elements.
        unsafe {
            let t = load(DType::Bool, c[k]);
            let v = t * load(a.dtype, x[k]) + (1.0 - t) * load(b.dtype, y[k]);
            store(out.dtype, o[k], v);
        }
    }
    true
}

/// eq as `(a - b) == 0` in f64 (and ne as its negation).
pub unsafe fn eq_by_subtraction(a: &View<'_>, b: &View<'_>, out: &View<'_>, ne: bool) {
    let (x, y) = (broadcast_addresses(a, out), broadcast_addresses(b, out));
    let o = addresses(out);
    for k in 0..o.len() {
        // SAFETY: addresses of live elements.
        unsafe {
            let equal = load(a.dtype, x[k]) - load(b.dtype, y[k]) == 0.0;
            o[k].write(u8::from(equal != ne));
        }
    }
}

/// Float-to-integer conversion through i64 and a truncation of its bits
/// (the saturation lost for i32 and u8); false where `src` is not a float
/// or `dst` not i32 or u8 (the correct kernel runs).
pub unsafe fn convert_wrapping(src: &View<'_>, dst: &View<'_>) -> bool {
    if !src.dtype.is_float() || !matches!(dst.dtype, DType::I32 | DType::U8) {
        return false;
    }
    let (s, d) = (addresses(src), addresses(dst));
    for (&x, &y) in s.iter().zip(&d) {
        // SAFETY: addresses of live elements.
        unsafe {
            let wide = load(src.dtype, x) as i64;
            store_int(dst.dtype, y, i64::from(wide as i32));
            if dst.dtype == DType::U8 {
                y.write(wide as u8);
            }
        }
    }
    true
}

/// An integer narrowed to a smaller integer with saturation (the ABI keeps
/// the low bits); false where `src` and `dst` are not such a pair (the
/// correct kernel runs).
pub unsafe fn convert_narrowing_saturated(src: &View<'_>, dst: &View<'_>) -> bool {
    let range = |d: DType| match d {
        DType::I32 => Some((i64::from(i32::MIN), i64::from(i32::MAX))),
        DType::U8 => Some((0, 255)),
        _ => None,
    };
    let Some((lo, hi)) = range(dst.dtype) else {
        return false;
    };
    if !matches!(src.dtype, DType::I64 | DType::I32) || src.dtype == dst.dtype {
        return false;
    }
    let (s, d) = (addresses(src), addresses(dst));
    for (&x, &y) in s.iter().zip(&d) {
        // SAFETY: addresses of live elements.
        unsafe {
            let v = load_int(src.dtype, x).clamp(lo, hi);
            match dst.dtype {
                DType::U8 => y.write(v as u8),
                _ => store_int(dst.dtype, y, v),
            }
        }
    }
    true
}

/// arange as a running sum in the output's dtype.
pub unsafe fn arange_accumulated(out: &View<'_>, start: f64, step: f64) {
    let mut v = round(out.dtype, start);
    for &p in &addresses(out) {
        // SAFETY: addresses of live elements.
        unsafe { store(out.dtype, p, v) };
        v = round(out.dtype, v + step);
    }
}

/// Integer add saturating at the ends of the range; false where the
/// dtype is not i32 or i64 (the correct kernel runs).
pub unsafe fn add_int_saturating(a: &View<'_>, b: &View<'_>, out: &View<'_>, alpha: f64) -> bool {
    if !matches!(out.dtype, DType::I32 | DType::I64) {
        return false;
    }
    let (x, y) = (broadcast_addresses(a, out), broadcast_addresses(b, out));
    let o = addresses(out);
    let al = alpha as i64;
    for k in 0..o.len() {
        // SAFETY: addresses of live elements.
        unsafe {
            let p = load_int(a.dtype, x[k]);
            let q = load_int(b.dtype, y[k]);
            let r = p.saturating_add(al.saturating_mul(q));
            let r = if out.dtype == DType::I32 {
                r.clamp(i64::from(i32::MIN), i64::from(i32::MAX))
            } else {
                r
            };
            store_int(out.dtype, o[k], r);
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(data: &'a mut [f32], shape: &'a [i64], strides: &'a [i64]) -> View<'a> {
        View::new(data.as_mut_ptr().cast(), DType::F32, shape, strides)
    }

    #[test]
    fn softmax_is_right_out_of_place_and_wrong_in_place() {
        let x = [1.0f32, 2.0, 3.0, 0.5];
        let (mut a, mut o) = (x, [0.0f32; 4]);
        let (shape, strides) = ([4i64], [1i64]);
        // SAFETY: live local buffers.
        unsafe {
            softmax_second_pass(
                &view(&mut a, &shape, &strides),
                &view(&mut o, &shape, &strides),
            )
        };
        let sum: f32 = x.iter().map(|v| (v - 3.0).exp()).sum();
        assert!((o[2] - 1.0 / sum).abs() < 1e-6);
        let mut b = x;
        let v = view(&mut b, &shape, &strides);
        // SAFETY: as above; out is exactly the input.
        unsafe { softmax_second_pass(&v, &v) };
        assert!((b[2] - 1.0 / sum).abs() > 1e-3, "{b:?}");
    }

    #[test]
    fn swiglu_backward_is_wrong_only_when_grad_gate_aliases_gate() {
        let (shape, strides) = ([3i64], [1i64]);
        let mut gate = [0.5f32, -1.0, 2.0];
        let (mut up, mut go) = ([1.0f32, 2.0, 3.0], [1.0f32; 3]);
        let (mut gg, mut gu) = ([0.0f32; 3], [0.0f32; 3]);
        // SAFETY: live local buffers.
        unsafe {
            swiglu_backward_reread(
                &view(&mut gate, &shape, &strides),
                &view(&mut up, &shape, &strides),
                &view(&mut go, &shape, &strides),
                &view(&mut gg, &shape, &strides),
                &view(&mut gu, &shape, &strides),
            )
        };
        let mut gate2 = [0.5f32, -1.0, 2.0];
        let mut gu2 = [0.0f32; 3];
        let g = view(&mut gate2, &shape, &strides);
        // SAFETY: as above; grad_gate is exactly gate.
        unsafe {
            swiglu_backward_reread(
                &g,
                &view(&mut up, &shape, &strides),
                &view(&mut go, &shape, &strides),
                &g,
                &view(&mut gu2, &shape, &strides),
            )
        };
        assert_ne!(gu, gu2);
    }

    #[test]
    fn wide_rows_lose_their_last_tile_and_overflow_without_the_max_shift() {
        let n = 70_000usize;
        let (shape, strides) = ([n as i64], [1i64]);
        let mut x = vec![0.0f32; n];
        let mut o = vec![0.0f32; n];
        // SAFETY: live local buffers.
        let handled = unsafe {
            log_softmax_wide(
                &view(&mut x, &shape, &strides),
                &view(&mut o, &shape, &strides),
            )
        };
        assert!(handled);
        let want = -(n as f32).ln();
        assert!((o[0] - want).abs() > 1e-3, "{} vs {want}", o[0]);

        let mut logits = vec![100.0f32; n];
        let mut target = [3i64];
        let mut loss = [0.0f32];
        let (tshape, tstrides, lshape, lstrides) = ([1i64], [1i64], [], []);
        let (ls, lst) = ([1, n as i64], [n as i64, 1]);
        let lv = View::new(logits.as_mut_ptr().cast(), DType::F32, &ls, &lst);
        let tv = View::new(target.as_mut_ptr().cast(), DType::I64, &tshape, &tstrides);
        // SAFETY: live local buffers.
        assert!(unsafe {
            cross_entropy_wide(&lv, &tv, &view(&mut loss, &lshape, &lstrides), -100)
        });
        assert!(loss[0].is_infinite(), "{}", loss[0]);
    }

    #[test]
    fn half_accumulation_stalls_on_long_sums() {
        let n = 10_000usize;
        let mut x = vec![half::bf16::ONE; n];
        let mut out = [0.0f32];
        let (shape, strides) = ([n as i64], [1i64]);
        let v = View::new(x.as_mut_ptr().cast(), DType::BF16, &shape, &strides);
        // SAFETY: live local buffers.
        assert!(unsafe { sum_squares_half(&v, &view(&mut out, &[], &[])) });
        assert!(out[0] < 1000.0, "{}", out[0]);
    }

    #[test]
    fn rounding_and_edge_value_mutants_differ_from_the_correct_answer() {
        // A bf16 tie: nearest even rounds up, truncation down.
        let tie = 1.0 + 3.0 / 256.0;
        assert_eq!(round(DType::BF16, tie), 1.0 + 4.0 / 256.0);
        assert_eq!(truncate(DType::BF16, tie), 1.0 + 2.0 / 256.0);
        assert_eq!(truncate(DType::BF16, -tie), -(1.0 + 2.0 / 256.0));

        // f64 -> bf16 through f32: the sticky bit is lost, the tie goes to even.
        let mut src = [1.0 + 2f64.powi(-8) + 2f64.powi(-33)];
        let mut dst = [half::bf16::ZERO];
        let (shape, strides) = ([1i64], [1i64]);
        let s = View::new(src.as_mut_ptr().cast(), DType::F64, &shape, &strides);
        let d = View::new(dst.as_mut_ptr().cast(), DType::BF16, &shape, &strides);
        // SAFETY: live local buffers.
        assert!(unsafe { cast_f64_bf16_double(&s, &d) });
        assert_eq!(dst[0].to_f64(), 1.0);
        assert_eq!(round(DType::BF16, src[0]), 1.0 + 2f64.powi(-7));

        let mut x = [-0.0f32, 0.0, 4.0];
        let mut o = [1.0f32; 3];
        let (shape, strides) = ([3i64], [1i64]);
        // SAFETY: live local buffers.
        unsafe {
            sqrt_neg_zero(
                &view(&mut x, &shape, &strides),
                &view(&mut o, &shape, &strides),
            )
        };
        assert!(o[0].is_sign_positive() && o[2] == 2.0);

        let mut g = [5.0f32; 3];
        let mut gi = [1.0f32; 3];
        let mut x = [0.0f32, -1.0, 1.0];
        // SAFETY: live local buffers.
        unsafe {
            relu_backward_at_zero(
                &view(&mut g, &shape, &strides),
                &view(&mut x, &shape, &strides),
                &view(&mut gi, &shape, &strides),
            )
        };
        assert_eq!(gi, [5.0, 0.0, 5.0]);
    }

    #[test]
    fn the_linear_tile_edge_covers_the_last_partial_tile_only_past_256() {
        let mut out = vec![0.0f32; 2 * 300];
        let (shape, strides) = ([2i64, 300], [300i64, 1]);
        // SAFETY: a live local buffer.
        let saved = unsafe { linear_tile_edge_save(&view(&mut out, &shape, &strides)) };
        assert_eq!(saved.len(), 2 * (300 % 64));
        let mut out = vec![0.0f32; 2 * 200];
        let (shape, strides) = ([2i64, 200], [200i64, 1]);
        // SAFETY: a live local buffer.
        assert!(unsafe { linear_tile_edge_save(&view(&mut out, &shape, &strides)) }.is_empty());
    }
}

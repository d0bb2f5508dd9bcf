//! Kernels wrong only on a path a real kernel special-cases: one class of
//! shapes (a vector remainder, M = 1, K = 1, a partial row tile), one value
//! of an argument (a broadcast column, alpha 0), one range of results
//! (subnormals, overflow), repeated indices, or a call that follows an
//! earlier one (state kept between calls). Each is called by `crate::full`
//! only when its bug is selected; where it returns `false` (or `None`) the
//! correct `ferrite-kernels` kernel runs.
//!
//! # Safety
//! Every function here takes views that address live host memory of their
//! dtype, as the SDK checked them.
#![allow(clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::sync::Mutex;

use ferrite_kernels::{DType, View};

use super::elems::{addresses, load, load_int, map, round, rows, store, store_int};
use super::numerics::{restore, save};

/// The lanes of the vectorised reduction.
const LANES: usize = 8;

/// The origin and strides with which a kernel writes an output whose last
/// dimension runs backwards as if it ran forwards from the row's lowest
/// address (each row reversed). `None` for any other output.
pub fn inner_stride_flipped(out: &View<'_>) -> Option<(*mut u8, Vec<i64>)> {
    let r = out.shape.len();
    let (n, s) = (*out.shape.last()?, *out.strides.last()?);
    if r < 2 || s >= 0 || n < 2 {
        return None;
    }
    let lowest = (n - 1) * s * out.dtype.size() as i64;
    let mut strides = out.strides.to_vec();
    strides[r - 1] = -s;
    Some((out.ptr.wrapping_offset(lowest as isize), strides))
}

/// rms_norm whose sum of squares runs 4 lanes wide and drops the row's
/// remainder (the last `h % 4` elements). Returns false (not handled) for
/// rows of 4 or fewer, or a multiple of 4, elements.
pub unsafe fn rms_norm_vector_tail(
    input: &View<'_>,
    weight: &View<'_>,
    out: &View<'_>,
    inv_rms: &View<'_>,
    eps: f64,
) -> bool {
    let h = input.shape.last().copied().unwrap_or(0) as usize;
    if h <= 4 || h % 4 == 0 {
        return false;
    }
    // SAFETY: forwarded.
    unsafe {
        super::numerics::rms_norm_rows(input, weight, out, inv_rms, |x| {
            let ss: f64 = x[..h / 4 * 4].iter().map(|v| v * v).sum();
            1.0 / (ss / h as f64 + eps).sqrt()
        })
    };
    true
}

/// sum over a contiguous last dimension of more than 8 elements, not a
/// multiple of 8, without the remainder. Returns false (not handled) for
/// every other reduction.
pub unsafe fn sum_vector_tail(input: &View<'_>, out: &View<'_>, dim: usize) -> bool {
    let Some(last) = input.shape.len().checked_sub(1) else {
        return false;
    };
    let n = input.shape[last] as usize;
    if dim != last || input.strides[last] != 1 || n <= LANES || n % LANES == 0 {
        return false;
    }
    let kept = n / LANES * LANES;
    for (row, o) in rows(input).iter().zip(addresses(out)) {
        // SAFETY: addresses of live elements.
        unsafe {
            let s: f64 = row[..kept].iter().map(|&p| load(input.dtype, p)).sum();
            store(out.dtype, o, s);
        }
    }
    true
}

/// The shape and strides with which the GEMV path reads a packed
/// `[..., N, K]` operand `b` (rows of `K` contiguous elements): as
/// `[..., K, N]` row-major over the same memory, as if it were not
/// transposed. `None` when `b` is not packed that way.
pub fn gemv_misread(b: &View<'_>) -> Option<(Vec<i64>, Vec<i64>)> {
    let r = b.shape.len();
    if r < 2 {
        return None;
    }
    let (n, k) = (b.shape[r - 2], b.shape[r - 1]);
    if n < 2 || k < 2 || b.strides[r - 1] != 1 || b.strides[r - 2] != k {
        return None;
    }
    let mut shape = b.shape.to_vec();
    shape.swap(r - 2, r - 1);
    let mut strides = b.strides.to_vec();
    strides[r - 2] = n;
    strides[r - 1] = 1;
    Some((shape, strides))
}

/// Saves the rows of the last partial 128-row tile of `out` (more than 128
/// rows, not a multiple of 128) so they can be put back after the kernel
/// ("never written back"; see `numerics::restore`).
pub unsafe fn linear_row_tile_save(out: &View<'_>) -> Vec<(*mut u8, Vec<u8>)> {
    const TILE: usize = 128;
    let all = rows(out);
    if all.len() <= TILE || all.len() % TILE == 0 {
        return Vec::new();
    }
    let tail = all[all.len() / TILE * TILE..].iter().flatten().copied();
    // SAFETY: addresses of live elements.
    unsafe { save(tail, out.dtype.size()) }
}

/// The strides with which the bias-row fast path reads `b` when it has as
/// many elements as `out` has columns but they lie along another
/// dimension (a column `[N, 1]` against `[N, N]`): as a row broadcast over
/// every row of `out`. `None` when the fast path would be right (or is
/// not taken).
pub fn column_as_row(b: &View<'_>, out: &View<'_>) -> Option<Vec<i64>> {
    let n = *out.shape.last()?;
    if out.shape.len() < 2 || n < 2 || b.numel() != n as usize {
        return None;
    }
    let along: Vec<usize> = (0..b.shape.len()).filter(|&d| b.shape[d] > 1).collect();
    let &[d] = along.as_slice() else {
        return None;
    };
    if d + 1 == b.shape.len() {
        return None;
    }
    let mut strides = vec![0; out.shape.len()];
    *strides.last_mut()? = b.strides[d];
    Some(strides)
}

/// Whether `a` is broadcast along its last dim against an output of the
/// same rank that is wider there (a column against a full `b`).
pub fn column_against_full(a: &View<'_>, out: &View<'_>) -> bool {
    let r = out.shape.len();
    r >= 1 && a.shape.len() == r && a.shape[r - 1] == 1 && out.shape[r - 1] > 1
}

/// scale by 0 as a memset to +0.
pub unsafe fn scale_zero_memset(tensor: &View<'_>) {
    for p in addresses(tensor) {
        // SAFETY: addresses of live elements.
        unsafe { store(tensor.dtype, p, 0.0) };
    }
}

/// exp with results below the smallest normal f32 flushed to +0. Returns
/// false for f64 (computed in f64, no f32 flush).
pub unsafe fn exp_ftz(input: &View<'_>, out: &View<'_>) -> bool {
    if out.dtype == DType::F64 {
        return false;
    }
    let normal = f64::from(f32::MIN_POSITIVE);
    // SAFETY: forwarded.
    unsafe {
        map(input, out, round, |x| {
            let r = x.exp();
            if r < normal { 0.0 } else { r }
        })
    };
    true
}

/// neg as `0 - x`.
pub unsafe fn neg_zero_minus(input: &View<'_>, out: &View<'_>) {
    // SAFETY: forwarded.
    unsafe { map(input, out, round, |x| 0.0 - x) };
}

/// An element-wise copy through a double (for any dtype).
pub unsafe fn copy_through_double(src: &View<'_>, dst: &View<'_>) {
    // SAFETY: forwarded.
    unsafe { map(src, dst, round, |x| x) };
}

/// Floating conversions to f16 that saturate at ±65504. Returns false for
/// other casts.
pub unsafe fn cast_f16_saturating(src: &View<'_>, dst: &View<'_>) -> bool {
    let float = matches!(
        src.dtype,
        DType::F32 | DType::F64 | DType::BF16 | DType::F16
    );
    if dst.dtype != DType::F16 || !float {
        return false;
    }
    // SAFETY: forwarded.
    unsafe {
        map(src, dst, round, |x| {
            if x.is_finite() && round(DType::F16, x).is_infinite() {
                65504f64.copysign(x)
            } else {
                x
            }
        })
    };
    true
}

/// The mean cross-entropy over every row, ignored ones included, written
/// over the correct kernel's loss (which has already refused bad targets);
/// with `odd_tail`, over the counted rows and an odd last row, ignored or
/// not (rows taken in pairs, the odd one on a path without the ignore
/// test).
pub unsafe fn cross_entropy_all_rows(
    logits: &View<'_>,
    targets: &View<'_>,
    loss: &View<'_>,
    ignore_index: i64,
    odd_tail: bool,
) {
    let t = addresses(targets);
    let mut total = 0.0f64;
    let mut count = 0usize;
    for (row, &tp) in rows(logits).iter().zip(&t) {
        // SAFETY: addresses of live elements.
        unsafe {
            let target = load_int(targets.dtype, tp);
            if target == ignore_index || target < 0 || target as usize >= row.len() {
                continue;
            }
            let x: Vec<f64> = row.iter().map(|&p| load(logits.dtype, p)).collect();
            let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + x.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
            total += lse - x[target as usize];
            count += 1;
        }
    }
    // Planted: divided by every row, counted or not; or by the counted rows
    // and an odd last row.
    let rows = if !odd_tail {
        t.len()
    } else if t.len() % 2 == 1
        // SAFETY: the address of a live element.
        && unsafe { load_int(targets.dtype, t[t.len() - 1]) } == ignore_index
    {
        count + 1
    } else {
        count
    };
    // SAFETY: the loss is a live scalar.
    unsafe { store(loss.dtype, loss.ptr, total / rows as f64) };
}

/// embedding_backward as a scatter-add without atomics: every occurrence
/// of an index reads the row as it was before the call, so of repeated
/// indices only the last update lands. Returns false (not handled) when an
/// index is out of range (the correct kernel refuses it) or rows are empty.
pub unsafe fn embedding_backward_racy(
    grad_out: &View<'_>,
    indices: &View<'_>,
    grad_weight: &View<'_>,
) -> bool {
    let (vocab, h) = (grad_weight.shape[0], grad_weight.shape[1] as usize);
    // SAFETY: addresses of live elements.
    let ids: Vec<i64> = addresses(indices)
        .into_iter()
        .map(|p| unsafe { load_int(indices.dtype, p) })
        .collect();
    if h == 0 || ids.iter().any(|&i| i < 0 || i >= vocab) {
        return false;
    }
    let (w, g) = (rows(grad_weight), rows(grad_out));
    // The row of each occurrence as it was before the call.
    let old: Vec<Vec<f64>> = ids
        .iter()
        .map(|&i| {
            w[i as usize]
                .iter()
                // SAFETY: addresses of live elements.
                .map(|&p| unsafe { load(grad_weight.dtype, p) })
                .collect()
        })
        .collect();
    for (k, &i) in ids.iter().enumerate() {
        for j in 0..h {
            // SAFETY: addresses of live elements.
            unsafe {
                let v = old[k][j] + load(grad_out.dtype, g[k][j]);
                store(grad_weight.dtype, w[i as usize][j], v);
            }
        }
    }
    true
}

/// Pre-packed (compact) weights, keyed by address, dtype, shape and
/// strides, as a vendor library caches them between calls.
static PACKED: Mutex<Option<HashMap<String, Vec<u8>>>> = Mutex::new(None);

/// The compact bytes of `weight`, from the cache when a weight of the same
/// address, dtype, shape and strides was packed before (whatever its
/// values are now).
pub unsafe fn packed_weight(weight: &View<'_>) -> Vec<u8> {
    let key = format!(
        "{:p} {:?} {:?} {:?}",
        weight.ptr, weight.dtype, weight.shape, weight.strides
    );
    let mut cache = PACKED.lock().unwrap_or_else(|e| e.into_inner());
    let size = weight.dtype.size();
    cache
        .get_or_insert_with(HashMap::new)
        .entry(key)
        .or_insert_with(|| {
            addresses(weight)
                .into_iter()
                // SAFETY: addresses of live elements.
                .flat_map(|p| unsafe { std::slice::from_raw_parts(p, size) }.to_vec())
                .collect()
        })
        .clone()
}

/// silu with f16 results below the smallest normal f16 (2^-14) flushed to
/// zero (keeping the sign). Returns false for other dtypes.
pub unsafe fn silu_f16_ftz(input: &View<'_>, out: &View<'_>) -> bool {
    if out.dtype != DType::F16 {
        return false;
    }
    let normal = 2f64.powi(-14);
    // SAFETY: forwarded.
    unsafe {
        map(input, out, round, |x| {
            let r = round(DType::F16, x / (1.0 + (-x).exp()));
            if r != 0.0 && r.abs() < normal {
                0f64.copysign(r)
            } else {
                r
            }
        })
    };
    true
}

/// silu_backward with a zero gradient for x < -16 (the saturated tail).
pub unsafe fn silu_backward_cutoff(g: &View<'_>, x: &View<'_>, gi: &View<'_>) {
    let (ga, xa, gia) = (addresses(g), addresses(x), addresses(gi));
    for i in 0..gia.len() {
        // SAFETY: addresses of live elements.
        unsafe {
            let (go, v) = (load(g.dtype, ga[i]), load(x.dtype, xa[i]));
            let r = if v < -16.0 {
                0.0
            } else {
                let s = 1.0 / (1.0 + (-v).exp());
                go * s * (1.0 + v * (1.0 - s))
            };
            store(gi.dtype, gia[i], r);
        }
    }
}

/// Saves the elements of the last partial 128-key tile of `grad` (a
/// `[..., seq_kv, d]` gradient of k or v; seq_kv over 128, not a multiple
/// of 128) so they can be put back after the kernel ("never written
/// back"; see `numerics::restore`).
pub unsafe fn attention_key_tile_save(grad: &View<'_>) -> Vec<(*mut u8, Vec<u8>)> {
    const TILE: usize = 128;
    let r = grad.shape.len();
    if r < 2 {
        return Vec::new();
    }
    let (skv, d) = (grad.shape[r - 2] as usize, grad.shape[r - 1] as usize);
    if skv <= TILE || skv % TILE == 0 || d == 0 {
        return Vec::new();
    }
    let kept = skv / TILE * TILE;
    let tile = addresses(grad)
        .into_iter()
        .enumerate()
        .filter(|(i, _)| (i / d) % skv >= kept)
        .map(|(_, p)| p);
    // SAFETY: addresses of live elements.
    unsafe { save(tile, grad.dtype.size()) }
}

/// rope_backward (half-split pairs) for a head dim over 64, as a kernel
/// written for 64: each 64-wide chunk of a head is rotated on its own, x[j]
/// paired with x[j + 32], table column `chunk * 32 + j`. Returns false
/// (not handled) for interleaved pairs or head dims up to 64.
pub unsafe fn rope_backward_64_pairs(
    input: &View<'_>,
    cos: &View<'_>,
    sin: &View<'_>,
    out: &View<'_>,
    interleaved: bool,
) -> bool {
    let r = input.shape.len();
    if interleaved || r != 4 || input.shape[3] <= 64 || input.shape[3] % 64 != 0 {
        return false;
    }
    let (seq, heads, dim) = (
        input.shape[1] as usize,
        input.shape[2] as usize,
        input.shape[3] as usize,
    );
    let (c, s) = (rows(cos), rows(sin));
    for (k, (ri, ro)) in rows(input).iter().zip(rows(out)).enumerate() {
        let pos = (k / heads) % seq;
        let x: Vec<f64> = ri
            .iter()
            // SAFETY: addresses of live elements.
            .map(|&p| unsafe { load(input.dtype, p) })
            .collect();
        for chunk in 0..dim / 64 {
            for j in 0..32 {
                let (i1, i2, col) = (chunk * 64 + j, chunk * 64 + j + 32, chunk * 32 + j);
                // SAFETY: addresses of live elements.
                unsafe {
                    let (cv, sv) = (load(cos.dtype, c[pos][col]), load(sin.dtype, s[pos][col]));
                    let (a, b) = (x[i1], x[i2]);
                    store(out.dtype, ro[i1], a * cv + b * sv);
                    store(out.dtype, ro[i2], -a * sv + b * cv);
                }
            }
        }
    }
    true
}

/// After the correct rms_norm_backward: grad_input of rows wider than 4096
/// recomputed with the row's dot product `sum(g w x)` over the first 4096
/// elements only.
pub unsafe fn rms_norm_backward_row_4096(
    grad_out: &View<'_>,
    input: &View<'_>,
    weight: &View<'_>,
    inv_rms: &View<'_>,
    grad_input: &View<'_>,
) {
    const BLOCK: usize = 4096;
    let h = input.shape.last().copied().unwrap_or(0) as usize;
    if h <= BLOCK {
        return;
    }
    // SAFETY: addresses of live elements.
    let w: Vec<f64> = addresses(weight)
        .into_iter()
        .map(|p| unsafe { load(weight.dtype, p) })
        .collect();
    let r = addresses(inv_rms);
    for (k, ((rg, rx), rgi)) in rows(grad_out)
        .iter()
        .zip(rows(input))
        .zip(rows(grad_input))
        .enumerate()
    {
        // SAFETY: addresses of live elements.
        unsafe {
            let g: Vec<f64> = rg.iter().map(|&p| load(grad_out.dtype, p)).collect();
            let x: Vec<f64> = rx.iter().map(|&p| load(input.dtype, p)).collect();
            let inv = load(inv_rms.dtype, r[k]);
            let dot: f64 = (0..BLOCK).map(|i| g[i] * w[i] * x[i]).sum();
            for j in 0..h {
                let v = inv * (g[j] * w[j] - x[j] * inv * inv * dot / h as f64);
                store(grad_input.dtype, rgi[j], v);
            }
        }
    }
}

/// argmax from index -1 and a running maximum of -inf, updated on a
/// strict `>` (NaN taken first, as the ABI says). Returns false when a
/// reduced extent is 0.
pub unsafe fn argmax_from_minus_one(input: &View<'_>, out: &View<'_>, dim: usize) -> bool {
    let g = super::numerics::groups(input, dim);
    if g.iter().any(Vec::is_empty) {
        return false;
    }
    for (grp, o) in g.iter().zip(addresses(out)) {
        // SAFETY: addresses of live elements.
        unsafe {
            let (mut best, mut at) = (f64::NEG_INFINITY, -1i64);
            for (k, &p) in grp.iter().enumerate() {
                let v = load(input.dtype, p);
                if best.is_nan() {
                    break;
                }
                if v.is_nan() || v > best {
                    (best, at) = (v, k as i64);
                }
            }
            store_int(out.dtype, o, at);
        }
    }
    true
}

/// AdamW's hyper-parameters, as the kernel takes them.
#[derive(Debug, Clone, Copy)]
pub struct Adamw {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub step: i64,
}

/// One AdamW step whose bias correction uses the step narrowed to i16.
pub unsafe fn adamw_step_i16(
    param: &View<'_>,
    grad: &View<'_>,
    exp_avg: &View<'_>,
    exp_avg_sq: &View<'_>,
    h: Adamw,
) {
    // Planted: a 16-bit signed step.
    let t = i32::from(h.step as i16);
    let (bc1, bc2) = (1.0 - h.beta1.powi(t), 1.0 - h.beta2.powi(t));
    let [p, g, m, v] = [param, grad, exp_avg, exp_avg_sq].map(addresses);
    for i in 0..p.len() {
        // SAFETY: addresses of live elements.
        unsafe {
            let gi = load(grad.dtype, g[i]);
            let mi = h.beta1 * load(exp_avg.dtype, m[i]) + (1.0 - h.beta1) * gi;
            let vi = h.beta2 * load(exp_avg_sq.dtype, v[i]) + (1.0 - h.beta2) * gi * gi;
            let pi = load(param.dtype, p[i]) * (1.0 - h.lr * h.weight_decay);
            let update = h.lr * (mi / bc1) / ((vi / bc2).sqrt() + h.eps);
            store(exp_avg.dtype, m[i], mi);
            store(exp_avg_sq.dtype, v[i], vi);
            store(param.dtype, p[i], pi - update);
        }
    }
}

/// `scale-leaves-ftz-on`: flush-to-zero and denormals-are-zero turned on
/// on the calling thread and left so (x86-64; elsewhere nothing changes).
pub fn leave_ftz_on() {
    #[cfg(target_arch = "x86_64")]
    {
        let mut mxcsr: u32 = 0;
        // SAFETY: stmxcsr and ldmxcsr of the register's own value with its
        // FZ (bit 15) and DAZ (bit 6) bits set: no reserved bit.
        unsafe {
            std::arch::asm!("stmxcsr [{}]", in(reg) &raw mut mxcsr, options(nostack, preserves_flags));
            mxcsr |= (1 << 15) | (1 << 6);
            std::arch::asm!("ldmxcsr [{}]", in(reg) &raw const mxcsr, options(nostack, preserves_flags));
        }
    }
}

/// `layer-norm-leaves-signals-blocked`: SIGINT and SIGTERM blocked on the
/// calling thread and left so.
pub fn leave_signals_blocked() {
    // SAFETY: sigemptyset initialises the set; SIG_BLOCK adds its signals
    // to the calling thread's mask (the old mask is not asked for).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// `adamw-pins-calling-thread`: the calling thread bound to the first CPU
/// of its affinity set (nothing changes on a thread bound to one CPU).
pub fn pin_to_first_cpu() {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity
    // and sched_setaffinity of the calling thread (pid 0) read and write
    // exactly size_of::<cpu_set_t>() bytes of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        if libc::sched_getaffinity(0, size, &mut set) != 0 {
            return;
        }
        let cpus = libc::CPU_SETSIZE as usize;
        if let Some(first) = (0..cpus).find(|&c| libc::CPU_ISSET(c, &set)) {
            libc::CPU_ZERO(&mut set);
            libc::CPU_SET(first, &mut set);
            libc::sched_setaffinity(0, size, &set);
        }
    }
}

/// `rms-norm-leaks-workspace`: a workspace of the input's bytes in f64,
/// written (so resident) and never freed.
pub fn leak_workspace(elements: usize) {
    let workspace = vec![1.0f64; elements.max(1)];
    std::mem::forget(workspace);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(data: &'a mut [f32], shape: &'a [i64], strides: &'a [i64]) -> View<'a> {
        View::new(data.as_mut_ptr().cast(), DType::F32, shape, strides)
    }

    #[test]
    fn the_vector_tail_is_dropped_only_past_the_lane_count() {
        let mut x: Vec<f32> = (1..=2 * 11).map(|v| v as f32).collect();
        let mut o = [0.0f32; 2];
        let (shape, strides) = ([2i64, 11], [11i64, 1]);
        let (oshape, ostrides) = ([2i64], [1i64]);
        // SAFETY: live local buffers.
        assert!(unsafe {
            sum_vector_tail(
                &view(&mut x, &shape, &strides),
                &view(&mut o, &oshape, &ostrides),
                1,
            )
        });
        assert_eq!(o, [36.0, 11.0 * 8.0 + 36.0]);
        let mut x = [1.0f32; 16];
        let (shape, strides) = ([2i64, 8], [8i64, 1]);
        // SAFETY: live local buffers.
        assert!(!unsafe {
            sum_vector_tail(
                &view(&mut x, &shape, &strides),
                &view(&mut o, &oshape, &ostrides),
                1,
            )
        });
    }

    #[test]
    fn the_fast_paths_misread_only_their_own_shapes() {
        let mut b = [0.0f32; 12];
        let v = view(&mut b, &[3, 4], &[4, 1]);
        assert_eq!(gemv_misread(&v), Some((vec![4, 3], vec![3, 1])));
        let mut b = [0.0f32; 12];
        assert_eq!(gemv_misread(&view(&mut b, &[3, 4], &[1, 3])), None);

        let mut out = [0.0f32; 16];
        let o = view(&mut out, &[4, 4], &[4, 1]);
        let mut col = [0.0f32; 4];
        assert_eq!(
            column_as_row(&view(&mut col, &[4, 1], &[1, 1]), &o),
            Some(vec![0, 1])
        );
        assert_eq!(column_as_row(&view(&mut col, &[4], &[1]), &o), None);
        assert_eq!(column_as_row(&view(&mut col, &[1, 4], &[4, 1]), &o), None);
    }

    #[test]
    fn edge_value_mutants_differ_where_their_bug_says() {
        let mut x = [-100.0f32, 0.0, 1.0];
        let mut o = [1.0f32; 3];
        let (shape, strides) = ([3i64], [1i64]);
        // SAFETY: live local buffers.
        assert!(unsafe {
            exp_ftz(
                &view(&mut x, &shape, &strides),
                &view(&mut o, &shape, &strides),
            )
        });
        assert_eq!(o[0], 0.0);
        assert!(((-100f32).exp()) > 0.0);
        assert_eq!(o[1], 1.0);

        let mut x = [0.0f32, -0.0, 2.0];
        // SAFETY: live local buffers.
        unsafe {
            neg_zero_minus(
                &view(&mut x, &shape, &strides),
                &view(&mut o, &shape, &strides),
            )
        };
        assert!(o[0].is_sign_positive() && o[1].is_sign_positive() && o[2] == -2.0);

        let mut x = [1e6f32, -1e6, f32::INFINITY];
        let mut h = [half::f16::ZERO; 3];
        let hv = View::new(h.as_mut_ptr().cast(), DType::F16, &shape, &strides);
        // SAFETY: live local buffers.
        assert!(unsafe { cast_f16_saturating(&view(&mut x, &shape, &strides), &hv) });
        assert_eq!(h.map(half::f16::to_f64), [65504.0, -65504.0, f64::INFINITY]);
    }

    #[test]
    fn tail_index_and_step_mutants_differ_where_their_bug_says() {
        // argmax of a row of -inf is -1; of any other row, the first maximum.
        let inf = f32::NEG_INFINITY;
        let mut x = [inf, inf, inf, 1.0, 3.0, 3.0];
        let mut idx = [7i64; 2];
        let (is, ist) = ([2i64], [1i64]);
        let iv = View::new(idx.as_mut_ptr().cast(), DType::I64, &is, &ist);
        // SAFETY: live local buffers.
        assert!(unsafe { argmax_from_minus_one(&view(&mut x, &[2, 3], &[3, 1]), &iv, 1) });
        assert_eq!(idx, [-1, 1]);

        // silu_backward is 0 below -16 only.
        let mut g = [1.0f32; 2];
        let mut x = [-20.0f32, -10.0];
        let mut gi = [1.0f32; 2];
        let (shape, strides) = ([2i64], [1i64]);
        // SAFETY: live local buffers.
        unsafe {
            silu_backward_cutoff(
                &view(&mut g, &shape, &strides),
                &view(&mut x, &shape, &strides),
                &view(&mut gi, &shape, &strides),
            )
        };
        assert_eq!(gi[0], 0.0);
        assert!(gi[1] < 0.0);

        // A step past 32767 wraps negative: NaN.
        let (mut p, mut gr, mut m, mut v) = ([0.5f32], [0.1f32], [0.0f32], [0.0f32]);
        let (shape, strides) = ([1i64], [1i64]);
        let h = Adamw {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            step: 40_000,
        };
        // SAFETY: live local buffers.
        unsafe {
            adamw_step_i16(
                &view(&mut p, &shape, &strides),
                &view(&mut gr, &shape, &strides),
                &view(&mut m, &shape, &strides),
                &view(&mut v, &shape, &strides),
                h,
            )
        };
        assert!(p[0].is_nan());
    }

    #[test]
    fn racy_scatter_keeps_only_the_last_update_of_a_repeated_index() {
        let mut w = [1.0f32; 4];
        let mut g = [10.0f32, 20.0, 30.0, 40.0, 50.0, 60.0];
        let mut idx = [1i64, 0, 1];
        let (ws, wst) = ([2i64, 2], [2i64, 1]);
        let (gs, gst) = ([3i64, 2], [2i64, 1]);
        let (is, ist) = ([3i64], [1i64]);
        let iv = View::new(idx.as_mut_ptr().cast(), DType::I64, &is, &ist);
        // SAFETY: live local buffers.
        assert!(unsafe {
            embedding_backward_racy(&view(&mut g, &gs, &gst), &iv, &view(&mut w, &ws, &wst))
        });
        assert_eq!(w, [31.0, 41.0, 51.0, 61.0]);
    }

    #[test]
    fn the_packed_weight_cache_serves_stale_values_at_the_same_address() {
        let mut w = [1.0f32, 2.0];
        let (shape, strides) = ([1i64, 2], [2i64, 1]);
        // SAFETY: a live local buffer.
        let first = unsafe { packed_weight(&view(&mut w, &shape, &strides)) };
        w[0] = 5.0;
        // SAFETY: as above.
        let second = unsafe { packed_weight(&view(&mut w, &shape, &strides)) };
        assert_eq!(first, second);
        assert_eq!(second[..4], 1.0f32.to_ne_bytes());
    }
}

/// `kv` (`[b, h, seq_kv, d]`) cut to its first `seq_q` keys (`q`'s third
/// extent), when it has more: the shape to view it with.
#[derive(Debug)]
pub struct FirstKeys<'a> {
    kv: &'a View<'a>,
    shape: Vec<i64>,
}

impl<'a> FirstKeys<'a> {
    /// The cut view (same memory, fewer keys).
    pub fn view(&self) -> View<'_> {
        View {
            ptr: self.kv.ptr,
            dtype: self.kv.dtype,
            shape: &self.shape,
            strides: self.kv.strides,
        }
    }
}

/// [`FirstKeys`] of `kv` for the queries `q`, if `kv` has more keys.
pub fn first_keys<'a>(kv: &'a View<'a>, q: &View<'_>) -> Option<FirstKeys<'a>> {
    if kv.shape.len() != 4 || q.shape.len() != 4 || kv.shape[2] <= q.shape[2] {
        return None;
    }
    let mut shape = kv.shape.to_vec();
    shape[2] = q.shape[2];
    Some(FirstKeys { kv, shape })
}

/// The bytes of each element of `v`, in index order.
unsafe fn elements(v: &View<'_>) -> Vec<(*mut u8, Vec<u8>)> {
    // SAFETY: addresses of live elements (forwarded).
    unsafe { save(addresses(v), v.dtype.size()) }
}

/// Moves head `h` of `v` (`[b, heads, ...]`, index order) to head
/// `to(h)`: each element's bytes written where that head's are.
unsafe fn move_heads(v: &View<'_>, to: impl Fn(usize) -> usize) {
    let (b, heads) = (v.shape[0] as usize, v.shape[1] as usize);
    // SAFETY: forwarded (the view's elements are live).
    let saved = unsafe { elements(v) };
    if b == 0 || heads == 0 || saved.is_empty() {
        return;
    }
    let inner = saved.len() / (b * heads);
    for (i, (_, bytes)) in saved.iter().enumerate() {
        let (bi, rest) = (i / (heads * inner), i % (heads * inner));
        let (h, e) = (rest / inner, rest % inner);
        let (dst, _) = &saved[(bi * heads + to(h)) * inner + e];
        // SAFETY: a live element of the same size.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), *dst, bytes.len()) };
    }
}

/// The query's original bytes and the head count, kept by
/// [`gqa_interleave`] for [`gqa_restore`].
#[derive(Debug)]
pub struct Moved {
    query: Vec<(*mut u8, Vec<u8>)>,
    heads_q: usize,
    heads_kv: usize,
}

fn interleaved(h: usize, heads_q: usize, heads_kv: usize) -> usize {
    // Query head h, meant for kv head h / group, goes to the slot the
    // kernel gives kv head h % heads_kv.
    let group = heads_q / heads_kv;
    (h % heads_kv) * group + h / heads_kv
}

/// Reorders `q`'s heads for [`Bug::AttentionGqaHeadsInterleaved`] (see
/// `full.rs`), when there is grouped-query attention (more than one query
/// head per kv head and more than one kv head); None otherwise.
///
/// # Safety
/// `q`'s elements are live.
pub unsafe fn gqa_interleave(q: &View<'_>, k: &View<'_>) -> Option<Moved> {
    if q.shape.len() != 4 || k.shape.len() != 4 {
        return None;
    }
    let (heads_q, heads_kv) = (q.shape[1] as usize, k.shape[1] as usize);
    if heads_kv < 2 || heads_q <= heads_kv || heads_q % heads_kv != 0 {
        return None;
    }
    // SAFETY: forwarded (q's elements are live).
    let query = unsafe { elements(q) };
    // SAFETY: as above.
    unsafe { move_heads(q, |h| interleaved(h, heads_q, heads_kv)) };
    Some(Moved {
        query,
        heads_q,
        heads_kv,
    })
}

/// Puts `out` and `lse` back in head order and restores the query
/// [`gqa_interleave`] reordered.
///
/// # Safety
/// The views' elements are live; `moved` came from [`gqa_interleave`] of
/// the call's query.
pub unsafe fn gqa_restore(moved: Moved, out: &View<'_>, lse: &View<'_>) {
    let (hq, hkv) = (moved.heads_q, moved.heads_kv);
    // Slot p holds the result of head h with interleaved(h) == p.
    let mut head_of = vec![0; hq];
    for h in 0..hq {
        head_of[interleaved(h, hq, hkv)] = h;
    }
    // SAFETY: forwarded (the outputs' and the query's elements are live).
    unsafe {
        move_heads(out, |p| head_of[p]);
        move_heads(lse, |p| head_of[p]);
        restore(moved.query);
    }
}

/// add with alpha 0 as a copy of `a`, broadcast to `out`'s shape: `b` is
/// never read.
pub unsafe fn add_alpha_zero_copy(a: &View<'_>, out: &View<'_>) {
    let (r, ro) = (a.shape.len(), out.shape.len());
    let strides: Vec<i64> = (0..ro)
        .map(|d| match (d + r).checked_sub(ro) {
            Some(k) if a.shape[k] == out.shape[d] => a.strides[k],
            _ => 0,
        })
        .collect();
    let wide = View {
        shape: out.shape,
        strides: &strides,
        ..*a
    };
    for (s, d) in addresses(&wide).into_iter().zip(addresses(out)) {
        // SAFETY: addresses of live elements of one dtype.
        unsafe { store(out.dtype, d, load(a.dtype, s)) };
    }
}

/// The positions of the indices out of `0..rows` when none of the first
/// 256 is (what a range check of one 256-wide work-group sees), or `None`.
pub unsafe fn ids_bad_past_first_block(indices: &View<'_>, rows: i64) -> Option<Vec<usize>> {
    let ids: Vec<i64> = addresses(indices)
        .into_iter()
        // SAFETY: addresses of live elements.
        .map(|p| unsafe { load_int(indices.dtype, p) })
        .collect();
    let bad: Vec<usize> = (0..ids.len())
        .filter(|&i| ids[i] < 0 || ids[i] >= rows)
        .collect();
    (!bad.is_empty() && bad[0] >= 256 && rows > 0).then_some(bad)
}

/// Writes zeros over rows `bad` of `out` (`[indices..., H]`).
pub unsafe fn zero_rows(out: &View<'_>, bad: &[usize]) {
    let all = rows(out);
    for &r in bad {
        for &p in &all[r] {
            // SAFETY: addresses of live elements.
            unsafe { store(out.dtype, p, 0.0) };
        }
    }
}

/// attention's results with every row whose log-sum-exp is NaN taken for a
/// row that saw no key ([`Bug::AttentionNanRowAsMasked`]): its output row
/// zeroed and its log-sum-exp `-inf`, as a kernel whose running maximum
/// (`fmax`) dropped the NaN scores writes it.
///
/// [`Bug::AttentionNanRowAsMasked`]: super::Bug::AttentionNanRowAsMasked
pub unsafe fn attention_nan_rows_as_masked(out: &View<'_>, lse: &View<'_>) {
    let out_rows = rows(out);
    for (r, p) in addresses(lse).into_iter().enumerate() {
        // SAFETY: addresses of live elements of the outputs.
        unsafe {
            if !load(lse.dtype, p).is_nan() {
                continue;
            }
            store(lse.dtype, p, f64::NEG_INFINITY);
            for &o in out_rows.get(r).into_iter().flatten() {
                store(out.dtype, o, 0.0);
            }
        }
    }
}

//! Work on attention blocks besides the `gemm` products: transposing a
//! head's keys, the forward's online-softmax update of a score block, and
//! the backward's probabilities (recomputed from the log-sum-exp) and
//! score gradients. Score blocks have [`LDS`] floats per row.

use crate::attn_common::{Geom, LDS};
use crate::float::{exp_f32, exp_softmax};
use crate::rows::{exp_sum, max};
use crate::simd::simd_dispatch;

/// Row stride of the transposed keys: `seq_kv` rounded up to 16, plus 16,
/// so rows do not alias in the cache.
pub(crate) fn kt_stride(skv: usize) -> usize {
    skv.div_ceil(16) * 16 + 16
}

/// Writes the `rows x cols` matrix `src` (row stride `src.1`, unit column
/// stride) transposed into `dst` (`cols x rows`, row stride [`kt_stride`]).
///
/// # Safety
/// `src` must be valid for its extent.
pub(crate) unsafe fn transpose(
    src: (*const f32, isize),
    rows: usize,
    cols: usize,
    dst: &mut Vec<f32>,
) {
    let ld = kt_stride(rows);
    dst.resize(ld * cols, 0.0);
    for j0 in (0..rows).step_by(16) {
        for j in j0..rows.min(j0 + 16) {
            // SAFETY: row `j` of the caller's matrix.
            let row = unsafe {
                std::slice::from_raw_parts(src.0.wrapping_offset(j as isize * src.1), cols)
            };
            for (c, &x) in row.iter().enumerate() {
                dst[c * ld + j] = x;
            }
        }
    }
}

simd_dispatch!(pub(crate) unsafe fn online_softmax[](g: &Geom, s: &mut [f32], m: &mut [f32], l: &mut [f32], o: &mut [f32], at: (usize, usize, usize)) => softmax_impl[]);

/// Masks the score block `s` (`m.len()` rows of `bc` at stride [`LDS`],
/// queries from `i0`, keys from `kb`), turns it into `exp(s - new max)`,
/// and rescales the running sums `l` and output rows `o` by
/// `exp(old max - new max)`. Rows that have seen no key yet stay zero; a
/// NaN score, or a +inf one (`inf - inf`), makes the row's maximum or sum
/// NaN, and so its output and log-sum-exp.
///
/// # Safety
/// Plain slice code; `unsafe` only for the dispatch.
#[inline(always)]
unsafe fn softmax_impl(
    g: &Geom,
    s: &mut [f32],
    m: &mut [f32],
    l: &mut [f32],
    o: &mut [f32],
    (i0, kb, bc): (usize, usize, usize),
) {
    let d = g.d;
    for r in 0..m.len() {
        let row = &mut s[r * LDS..][..bc];
        let vis = g.visible(i0 + r);
        if vis < kb + bc {
            row[vis.saturating_sub(kb).min(bc)..].fill(f32::NEG_INFINITY);
        }
        // NaN wins from either side (`f32::max` would drop it and leave a
        // row of NaN scores at -inf, taken below for one that saw no key).
        let m_blk = max(row);
        let m_new = if m_blk > m[r] || m_blk.is_nan() {
            m_blk
        } else {
            m[r]
        };
        if m_new == f32::NEG_INFINITY {
            row.fill(0.0);
            continue;
        }
        let alpha = exp_f32(m[r] - m_new);
        let sum = exp_sum(row, m_new);
        l[r] = l[r] * alpha + sum;
        m[r] = m_new;
        if alpha != 1.0 {
            o[r * d..][..d].iter_mut().for_each(|x| *x *= alpha);
        }
    }
}

simd_dispatch!(pub(crate) unsafe fn probs[](g: &Geom, p: &mut [f32], lse: &[f32], at: (usize, usize, usize)) => probs_impl[]);
simd_dispatch!(pub(crate) unsafe fn grad_scores[](p: &[f32], dp: &mut [f32], dvec: &[f32], bc: usize) => grad_scores_impl[]);

/// Turns the score block `p` (`lse.len()` rows of `bc` at stride [`LDS`],
/// queries from `i0`, keys from `kb`) into probabilities `exp(s - lse)`,
/// zero where masked or where the row saw no key.
///
/// # Safety
/// Plain slice code; `unsafe` only for the dispatch.
#[inline(always)]
unsafe fn probs_impl(g: &Geom, p: &mut [f32], lse: &[f32], (i0, kb, bc): (usize, usize, usize)) {
    for (r, &l) in lse.iter().enumerate() {
        let row = &mut p[r * LDS..][..bc];
        if l == f32::NEG_INFINITY {
            row.fill(0.0);
            continue;
        }
        for x in row.iter_mut() {
            *x = exp_softmax(*x - l);
        }
        let vis = g.visible(i0 + r);
        if vis < kb + bc {
            row[vis.saturating_sub(kb).min(bc)..].fill(0.0);
        }
    }
}

/// `dp = p * (dp - dvec[row])`, the gradient of the scores.
///
/// # Safety
/// Plain slice code; `unsafe` only for the dispatch.
#[inline(always)]
unsafe fn grad_scores_impl(p: &[f32], dp: &mut [f32], dvec: &[f32], bc: usize) {
    for (r, &dr) in dvec.iter().enumerate() {
        let (pr, dr_) = (&p[r * LDS..][..bc], &mut dp[r * LDS..][..bc]);
        for (x, &pv) in dr_.iter_mut().zip(pr) {
            *x = pv * (*x - dr);
        }
    }
}

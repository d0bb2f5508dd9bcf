//! Attention backward, flash style: probabilities are recomputed per block
//! from the saved log-sum-exp (`P = exp(scale q k^T - lse)`), never stored
//! whole. A task owns one (batch, kv head) and a contiguous chunk of its
//! keys: it walks every query head of the group and every query block that
//! sees the chunk, accumulating `dV += P^T dO`, `dK += scale dS^T Q` in its
//! own `f32` buffers (so no two threads ever write the same `grad_k` /
//! `grad_v` rows) and `dQ += scale dS K` per query block, with
//! `dS = P (dO V^T - rowsum(dO O))`; all five block products are `gemm`
//! calls. Keys are split into several chunks only when there are too few
//! (batch, kv head) pairs to fill the pool; each chunk then returns its
//! partial `dQ`, summed in chunk order at the end.

use crate::attn_block::{grad_scores, probs};
use crate::attn_common::{BC, BR, Geom, Heads, LDS, Stats, mm};
use crate::error::{KernelError, bail};
use crate::map::check_float;
use crate::parallel::PAR_THRESHOLD;
use crate::view::View;
use rayon::prelude::*;

/// Backward of [`crate::attention`]: writes (does not accumulate) `grad_q`,
/// `grad_k` and `grad_v` (the latter two summed over the query heads that
/// share each kv head) from the forward inputs, `out` and `lse`.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// the outputs must not overlap the inputs, each other or themselves.
#[allow(clippy::too_many_arguments)]
pub unsafe fn attention_backward(
    q: &View,
    k: &View,
    v: &View,
    out: &View,
    lse: &View,
    grad_out: &View,
    grad_q: &View,
    grad_k: &View,
    grad_v: &View,
    scale: f64,
    causal: bool,
) -> Result<(), KernelError> {
    let name = "attention_backward";
    let g = Geom::new(name, [q, k, v, out, lse], scale, causal)?;
    let grads = [
        ("grad_out", grad_out, q),
        ("grad_q", grad_q, q),
        ("grad_k", grad_k, k),
        ("grad_v", grad_v, k),
    ];
    for (n, t, like) in grads {
        check_float(name, n, t)?;
        if t.dtype != q.dtype || t.shape != like.shape {
            bail!(
                "{name}: {n} is {:?} {:?}, expected {:?} {:?}",
                t.dtype,
                t.shape,
                q.dtype,
                like.shape
            );
        }
    }
    let units = g.b * g.hkv;
    let nkb = g.skv.div_ceil(BC);
    let work = g.b * g.hq * g.sq * g.skv * g.d.max(1);
    let threads = crate::parallel::threads();
    let parallel = threads > 1 && units > 0 && work >= PAR_THRESHOLD;
    let chunks = match parallel {
        true => (2 * threads).div_ceil(units).clamp(1, nkb.max(1)),
        false => 1,
    };
    let h = |v: &View| Heads::new(v);
    let t = Job {
        g,
        ins: [h(q), h(k), h(v), h(out), h(grad_out)],
        outs: [h(grad_q), h(grad_k), h(grad_v)],
        lse: Stats::new(lse),
        chunks,
        nkb,
    };
    let tasks = units * chunks;
    // SAFETY: forwarded from this function's contract; tasks write
    // disjoint rows of grad_k and grad_v (and of grad_q when unchunked).
    let run = |s: &mut Scratch, i| unsafe { task(&t, s, i) };
    let parts: Vec<Option<Vec<f32>>> = if parallel {
        (0..tasks)
            .into_par_iter()
            .map_init(Scratch::default, run)
            .collect()
    } else {
        let mut s = Scratch::default();
        (0..tasks).map(|i| run(&mut s, i)).collect()
    };
    if chunks > 1 {
        let (gs, sqd) = (g.group(), g.sq * g.d);
        (0..units * gs).into_par_iter().for_each(|hh| {
            let (u, gi) = (hh / gs, hh % gs);
            let mut sum = vec![0f32; sqd];
            for p in parts[u * chunks..(u + 1) * chunks].iter().flatten() {
                for (a, &x) in sum.iter_mut().zip(&p[gi * sqd..][..sqd]) {
                    *a += x;
                }
            }
            let (b, hq) = (u / g.hkv, (u % g.hkv) * gs + gi);
            // SAFETY: the rows of head (b, hq) of grad_q, written only here.
            unsafe { t.outs[0].store(b, hq, 0, g.sq, &sum) };
        });
    }
    Ok(())
}

struct Job {
    g: Geom,
    /// q, k, v, out, grad_out.
    ins: [Heads; 5],
    /// grad_q, grad_k, grad_v.
    outs: [Heads; 3],
    lse: Stats,
    chunks: usize,
    nkb: usize,
}

#[derive(Default)]
struct Scratch {
    k: Vec<f32>,
    v: Vec<f32>,
    q: Vec<f32>,
    go: Vec<f32>,
    o: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
    dq: Vec<f32>,
    p: Vec<f32>,
    dp: Vec<f32>,
    rows: Vec<f32>,
}

/// Task `i`: (batch, kv head) `i / chunks`, key chunk `i % chunks`. Returns
/// the partial `dQ` of the group's query heads when keys are chunked.
///
/// # Safety
/// As for [`attention_backward`].
unsafe fn task(t: &Job, s: &mut Scratch, i: usize) -> Option<Vec<f32>> {
    let g = &t.g;
    let (u, c) = (i / t.chunks, i % t.chunks);
    let (b, kvh, d, gs) = (u / g.hkv, u % g.hkv, g.d, g.group());
    let j0 = (c * t.nkb / t.chunks * BC).min(g.skv);
    let j1 = ((c + 1) * t.nkb / t.chunks * BC).min(g.skv);
    let [hq_, hk, hv, ho, hgo] = &t.ins;
    // SAFETY: rows of the caller's valid tensors.
    let (km, vm) = unsafe {
        (
            hk.block(b, kvh, j0, j1 - j0, &mut s.k),
            hv.block(b, kvh, j0, j1 - j0, &mut s.v),
        )
    };
    for buf in [&mut s.dk, &mut s.dv] {
        buf.clear();
        buf.resize((j1 - j0) * d, 0.0);
    }
    let chunked = t.chunks > 1;
    let mut dq_all = if chunked {
        vec![0f32; gs * g.sq * d]
    } else {
        Vec::new()
    };
    s.p.resize(BR * LDS, 0.0);
    s.dp.resize(BR * LDS, 0.0);
    for gi in 0..gs {
        let h = kvh * gs + gi;
        let first = if chunked { g.first_query(j0) / BR } else { 0 };
        for i0 in (first * BR..g.sq).step_by(BR) {
            let br = BR.min(g.sq - i0);
            let jend = j1.min(g.visible(i0 + br - 1));
            s.dq.clear();
            s.dq.resize(br * d, 0.0);
            let dq = if chunked {
                &mut dq_all[(gi * g.sq + i0) * d..][..br * d]
            } else {
                &mut s.dq[..]
            };
            if jend > j0 {
                // SAFETY: rows of the caller's valid tensors, blocks inside
                // the rows gathered above; the accumulators are ours.
                unsafe {
                    let qm = hq_.block(b, h, i0, br, &mut s.q);
                    let gm = hgo.block(b, h, i0, br, &mut s.go);
                    let om = ho.block(b, h, i0, br, &mut s.o);
                    s.rows.clear();
                    for r in 0..br {
                        s.rows.push(*t.lse.at(b, h, i0 + r));
                    }
                    for r in 0..br {
                        let row = |m: (*const f32, isize)| {
                            std::slice::from_raw_parts(m.0.wrapping_offset(r as isize * m.1), d)
                        };
                        s.rows.push(crate::rows::dot(row(gm), row(om)));
                    }
                    for kb in (j0..jend).step_by(BC) {
                        let bc = BC.min(jend - kb);
                        let kp = km.0.wrapping_offset((kb - j0) as isize * km.1);
                        let vp = vm.0.wrapping_offset((kb - j0) as isize * vm.1);
                        let (dkp, dvp) = (
                            s.dk.as_mut_ptr().add((kb - j0) * d),
                            s.dv.as_mut_ptr().add((kb - j0) * d),
                        );
                        let ld = LDS as isize;
                        mm(
                            (br, bc, d),
                            s.p.as_mut_ptr(),
                            LDS,
                            false,
                            (qm.0, qm.1, 1),
                            (kp, 1, km.1),
                            g.scale,
                        );
                        probs(g, &mut s.p, &s.rows[..br], (i0, kb, bc));
                        mm(
                            (bc, d, br),
                            dvp,
                            d,
                            true,
                            (s.p.as_ptr(), 1, ld),
                            (gm.0, gm.1, 1),
                            1.0,
                        );
                        mm(
                            (br, bc, d),
                            s.dp.as_mut_ptr(),
                            LDS,
                            false,
                            (gm.0, gm.1, 1),
                            (vp, 1, vm.1),
                            1.0,
                        );
                        grad_scores(&s.p, &mut s.dp, &s.rows[br..], bc);
                        let dsp = s.dp.as_ptr();
                        mm(
                            (br, d, bc),
                            dq.as_mut_ptr(),
                            d,
                            true,
                            (dsp, ld, 1),
                            (kp, km.1, 1),
                            g.scale,
                        );
                        mm(
                            (bc, d, br),
                            dkp,
                            d,
                            true,
                            (dsp, 1, ld),
                            (qm.0, qm.1, 1),
                            g.scale,
                        );
                    }
                }
            }
            if !chunked {
                // SAFETY: rows of grad_q of a head this task owns.
                unsafe { t.outs[0].store(b, h, i0, br, dq) };
            }
        }
    }
    // SAFETY: rows j0..j1 of grad_k / grad_v, owned by this task.
    unsafe {
        t.outs[1].store(b, kvh, j0, j1 - j0, &s.dk);
        t.outs[2].store(b, kvh, j0, j1 - j0, &s.dv);
    }
    chunked.then_some(dq_all)
}

//! Scaled-dot-product attention, forward: a flash-style tiled kernel. Each
//! task is one block of [`BR`] query rows of one (batch, query head); it
//! walks the visible keys in blocks of [`BC`] (blocks past the causal
//! diagonal are skipped), computes the score block `scale * Q K^T` with one
//! `gemm` call (K read through transposed strides), masks the diagonal
//! block, updates the running row maxima and sums (online softmax), and
//! accumulates `P V` with a second `gemm`. The S x S matrix is never formed.
//! Tasks run on the rayon pool, each with its own scratch (non-`f32` keys
//! and values are widened once per head and reused by the next task).

use crate::attn_block::{kt_stride, online_softmax, transpose};
use crate::attn_common::{BC, BR, Geom, Heads, LDS, Stats, mm};
use crate::error::KernelError;
use crate::parallel::chunk_count;
use crate::view::View;
use rayon::prelude::*;

/// `out = softmax(scale * q k^T + mask) v` and `lse` = the log-sum-exp of
/// each scaled, masked score row (f32 `[batch, heads_q, seq_q]`). `q` is
/// `[batch, heads_q, seq_q, D]`, `k` and `v` `[batch, heads_kv, seq_kv, D]`
/// with `heads_q` a multiple of `heads_kv` (query head `h` uses kv head
/// `h / (heads_q / heads_kv)`). With `causal`, query `i` sees keys
/// `j <= i + seq_kv - seq_q`; a query that sees no key gives zeros and
/// `lse = -inf`. `f32`/`f16`/`bf16`, computed in `f32`.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// the outputs must not overlap the inputs, each other or themselves.
pub unsafe fn attention(
    q: &View,
    k: &View,
    v: &View,
    out: &View,
    lse: &View,
    scale: f64,
    causal: bool,
) -> Result<(), KernelError> {
    let g = Geom::new("attention", [q, k, v, out, lse], scale, causal)?;
    let nqb = g.sq.div_ceil(BR);
    let tasks = g.b * g.hq * nqb;
    let t = Tensors {
        g,
        q: Heads::new(q),
        k: Heads::new(k),
        v: Heads::new(v),
        out: Heads::new(out),
        lse: Stats::new(lse),
        nqb,
    };
    let per_task = BR * g.skv.max(1) * g.d.max(1);
    if chunk_count(tasks, per_task) <= 1 {
        let mut s = Scratch::default();
        for i in 0..tasks {
            // SAFETY: forwarded from this function's contract.
            unsafe { task(&t, &mut s, i) };
        }
    } else {
        // SAFETY: forwarded from this function's contract; tasks write
        // disjoint rows of `out` and `lse`.
        let run = |s: &mut Scratch, i| unsafe { task(&t, s, i) };
        (0..tasks)
            .into_par_iter()
            .for_each_init(Scratch::default, run);
    }
    Ok(())
}

struct Tensors {
    g: Geom,
    q: Heads,
    k: Heads,
    v: Heads,
    out: Heads,
    lse: Stats,
    nqb: usize,
}

/// Per-thread buffers, reused across tasks.
#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    k: Vec<f32>,
    /// Keys of the current head transposed to `[D, seq_kv]`, so the score
    /// product reads them row-major.
    kt: Vec<f32>,
    v: Vec<f32>,
    /// The (batch, kv head) whose widened keys and values `k`/`v` hold.
    kv_of: Option<(usize, usize)>,
    s: Vec<f32>,
    o: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
}

/// Runs task `i`: query block `i % nqb` (last blocks first, they are the
/// heaviest when causal) of head `i / nqb`.
///
/// # Safety
/// As for [`attention`].
unsafe fn task(t: &Tensors, s: &mut Scratch, i: usize) {
    let g = &t.g;
    let (bh, qb) = (i / t.nqb, t.nqb - 1 - i % t.nqb);
    let (b, h) = (bh / g.hq, bh % g.hq);
    let kvh = h / g.group();
    let (i0, d) = (qb * BR, g.d);
    let br = BR.min(g.sq - i0);
    let nk = g.visible(i0 + br - 1);
    // SAFETY: rows of the caller's valid tensors; the transposed keys and
    // widened values are reused only for the same (batch, kv head).
    let (qm, vm) = unsafe {
        let q = t.q.block(b, h, i0, br, &mut s.q);
        let fresh = s.kv_of != Some((b, kvh));
        if fresh {
            let k = t.k.block(b, kvh, 0, g.skv, &mut s.k);
            transpose(k, g.skv, d, &mut s.kt);
        }
        let v = match t.v.direct() || fresh {
            true => t.v.block(b, kvh, 0, g.skv, &mut s.v),
            false => (s.v.as_ptr(), d as isize),
        };
        s.kv_of = Some((b, kvh));
        (q, v)
    };
    s.m.clear();
    s.m.resize(br, f32::NEG_INFINITY);
    s.l.clear();
    s.l.resize(br, 0.0);
    s.o.clear();
    s.o.resize(br * d, 0.0);
    s.s.resize(BR * LDS, 0.0);
    for kb in (0..nk).step_by(BC) {
        let bc = BC.min(nk - kb);
        let kp = s.kt[kb.min(s.kt.len())..].as_ptr();
        let vp = vm.0.wrapping_offset(kb as isize * vm.1);
        // SAFETY: the blocks lie inside the rows gathered or addressed above.
        unsafe {
            mm(
                (br, bc, d),
                s.s.as_mut_ptr(),
                LDS,
                false,
                (qm.0, qm.1, 1),
                (kp, kt_stride(g.skv) as isize, 1),
                g.scale,
            );
            online_softmax(g, &mut s.s, &mut s.m, &mut s.l, &mut s.o, (i0, kb, bc));
            mm(
                (br, d, bc),
                s.o.as_mut_ptr(),
                d,
                true,
                (s.s.as_ptr(), LDS as isize, 1),
                (vp, vm.1, 1),
                1.0,
            );
        }
    }
    for r in 0..br {
        let (m, l) = (s.m[r], s.l[r]);
        let row = &mut s.o[r * d..][..d];
        let lse = if m == f32::NEG_INFINITY {
            row.fill(0.0);
            f32::NEG_INFINITY
        } else {
            let inv = 1.0 / l;
            row.iter_mut().for_each(|x| *x *= inv);
            m + l.ln()
        };
        // SAFETY: entry of the caller's lse, owned by this task.
        unsafe { *t.lse.at(b, h, i0 + r) = lse };
    }
    // SAFETY: rows of `out` owned by this task.
    unsafe { t.out.store(b, h, i0, br, &s.o) };
}

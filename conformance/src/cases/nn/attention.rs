//! Cases of scaled-dot-product attention, forward and backward.

use super::*;

// ---------------------------------------------------------------------------
// Attention.

/// One attention shape: `q [b, hq, sq, d]`, `k`, `v [b, hkv, skv, d]`.
#[derive(Debug, Clone, Copy)]
pub(super) struct AttentionPlan {
    pub(super) label: &'static str,
    pub(super) b: usize,
    pub(super) hq: usize,
    pub(super) hkv: usize,
    pub(super) sq: usize,
    pub(super) skv: usize,
    pub(super) d: usize,
    pub(super) causal: bool,
    /// Layouts of q, k, v and of the outputs.
    pub(super) layouts: [Layout; 4],
    /// Small integers in q (6 to 9) and k (15 to 17) with `scale = 1/8`:
    /// scores of 96 to 160 (exp overflows f32 unless the row maximum is
    /// subtracted) that differ by a few units between keys, so that the
    /// softmax is neither uniform nor one-hot. The scores are exact in any
    /// kernel that accumulates in f32: random scores of that size would
    /// carry rounding errors of about 100 u(f32) each, which the softmax
    /// turns into relative errors of its weights far above the tolerance.
    /// (A one-hot softmax would make the gradients cancel to almost nothing
    /// against the intermediate terms, an ill-conditioned case.)
    pub(super) large_scores: bool,
    /// With `large_scores`, k negated: scores of -96 to -160, every
    /// exponential of which underflows f32 unless the row maximum is
    /// subtracted (a running maximum that starts at 0 rather than -inf
    /// gives 0/0).
    pub(super) negative_scores: bool,
    /// Writes NaN or infinities into the random `q`, `k`, `v` (the cases
    /// of [`SPECIAL_PLANS`]).
    pub(super) special: Option<Special>,
}

/// Writes a plan's special values into its random `q`, `k`, `v`.
pub(super) type Special = fn(&AttentionPlan, &mut [Vec<f64>; 3]);

const fn plan(
    label: &'static str,
    [b, hq, hkv, sq, skv, d]: [usize; 6],
    causal: bool,
    layouts: [Layout; 4],
) -> AttentionPlan {
    AttentionPlan {
        label,
        b,
        hq,
        hkv,
        sq,
        skv,
        d,
        causal,
        layouts,
        large_scores: false,
        negative_scores: false,
        special: None,
    }
}

pub(super) const ATTENTION_PLANS: [AttentionPlan; 20] = [
    plan("[1, 2, 8, 16]", [1, 2, 2, 8, 8, 16], false, [C; 4]),
    // Grouped heads without a mask, three kv heads of two query heads
    // each: a kernel that maps query head h to kv head h % heads_kv
    // instead of h / 2 (planted: attention-gqa-heads-interleaved) fails
    // here as well as in the causal case below.
    plan(
        "gqa 6/3 [2, 6, 9, 16] k transposed",
        [2, 6, 3, 9, 9, 16],
        false,
        [C, T, C, C],
    ),
    plan("causal [2, 2, 16, 32]", [2, 2, 2, 16, 16, 32], true, [C; 4]),
    plan(
        "causal seq_q 8 < seq_kv 16 gqa 4/2",
        [1, 4, 2, 8, 16, 16],
        true,
        [C; 4],
    ),
    plan(
        "seq_q 12 seq_kv 20 gqa 8/1",
        [1, 8, 1, 12, 20, 8],
        false,
        [C; 4],
    ),
    plan(
        "causal seq_q 12 > seq_kv 5 gqa 2/1 (7 queries see no key)",
        [1, 2, 1, 12, 5, 16],
        true,
        [C; 4],
    ),
    plan(
        "causal decoding seq_q 1 seq_kv 48",
        [2, 2, 2, 1, 48, 32],
        true,
        [C; 4],
    ),
    plan("seq_kv 1", [1, 2, 2, 5, 1, 8], false, [C; 4]),
    // Head sizes that are neither at most 4 nor a multiple of 4 or 8: a
    // vectorised dot product over head_dim drops its remainder there.
    plan("head_dim 6", [1, 2, 2, 5, 7, 6], false, [C; 4]),
    plan("causal head_dim 20", [1, 2, 1, 6, 6, 20], true, [C; 4]),
    // Five blocks of 128 keys and a partial sixth: a kernel that tiles the
    // keys must carry its running maximum and sums across every block.
    plan("seq_kv 700", [1, 2, 1, 3, 700, 8], false, [C; 4]),
    plan(
        "causal seq_q 3 seq_kv 660",
        [1, 2, 2, 3, 660, 8],
        true,
        [C; 4],
    ),
    // No key at all: every output row is 0 and its log-sum-exp -inf.
    plan("seq_kv 0", [1, 2, 2, 4, 0, 8], false, [C; 4]),
    plan(
        "single query and key, head_dim 2",
        [1, 1, 1, 1, 1, 2],
        true,
        [C; 4],
    ),
    plan(
        "[1, 2, 10, 16] q transposed k strided",
        [1, 2, 2, 10, 10, 16],
        false,
        [T, S, C, C],
    ),
    plan(
        "causal seq_q 7 seq_kv 9 v transposed outputs strided",
        [1, 2, 2, 7, 9, 8],
        true,
        [C, C, T, S],
    ),
    AttentionPlan {
        large_scores: true,
        ..plan("large scores", [1, 2, 2, 6, 6, 8], false, [C; 4])
    },
    AttentionPlan {
        large_scores: true,
        ..plan("causal large scores", [2, 2, 1, 8, 8, 8], true, [C; 4])
    },
    AttentionPlan {
        large_scores: true,
        negative_scores: true,
        ..plan("large negative scores", [1, 2, 2, 6, 6, 8], false, [C; 4])
    },
    // Groups of three query heads over four kv heads (Qwen2-7B has groups
    // of 7): every grouped plan above has groups of 2, or one kv head, so
    // a head map that assumes groups of 2 (`h / 2`, clamped), or a power of
    // two (`h >> log2(group)`), passed (mutation round 11).
    plan(
        "causal gqa 12/4 (groups of 3)",
        [1, 12, 4, 5, 7, 8],
        true,
        [C; 4],
    ),
];

/// Rows whose scores hold NaN or +inf, run after the other plans (so that
/// they keep their values). Softmax subtracts the row's maximum, and a NaN
/// maximum, or `+inf - +inf`, makes every weight, the output row and its
/// log-sum-exp NaN, as PyTorch's math and flash kernels give. Mutation
/// round 10: Ferrite and OpenCL took a running maximum that skipped NaN
/// (`fmax`), or a maximum that is not finite, for a row that saw no key and
/// wrote zeros (and `lse = -inf`), hiding a diverged run. Only a row that
/// sees no key at all keeps its zeros. Every case also has rows of finite
/// scores, and the backward gets the reference's NaN `out` and `lse` rows.
pub(super) const SPECIAL_PLANS: [AttentionPlan; 4] = [
    AttentionPlan {
        special: Some(nan_in_q),
        ..plan(
            "NaN in q (head 1, query 3)",
            [1, 2, 2, 6, 20, 8],
            false,
            [C; 4],
        )
    },
    // The NaN key in the second block of 128 keys, seen by queries 4 to 7
    // (queries 0 to 3 see keys up to 132 only): a kernel that tiles the
    // keys must carry the NaN from one block's maximum into the next.
    AttentionPlan {
        special: Some(nan_in_k),
        ..plan(
            "causal NaN in k at key 136 of 140 gqa 2/1",
            [1, 2, 1, 8, 140, 8],
            true,
            [C; 4],
        )
    },
    AttentionPlan {
        special: Some(inf_score),
        ..plan(
            "one +inf score, the others -inf (head 0, query 2)",
            [1, 2, 2, 4, 9, 8],
            false,
            [C; 4],
        )
    },
    AttentionPlan {
        special: Some(single_key_nan_inf),
        ..plan(
            "seq_kv 1: the key's score NaN (head 0) and +inf (head 1, query 2)",
            [1, 2, 2, 5, 1, 8],
            false,
            [C; 4],
        )
    },
];

/// The backward's NaN key: key 130, which every query sees. With key 136,
/// queries 0 to 3 (which do not see it) get a NaN `grad_q` from Ferrite's
/// and OpenCL's tiled kernels (and PyTorch's): `dQ = scale dS K` over a
/// block of keys multiplies the masked key's 0 in `dS` by its NaN row of
/// `K`. The reference, skipping masked keys, gives their finite gradient;
/// that NaN is not the class these cases guard (a NaN hidden as zeros) and
/// is left to the ABI (see docs/conformance.md).
const NAN_K_SEEN_BY_ALL: AttentionPlan = AttentionPlan {
    special: Some(nan_in_k_seen_by_all),
    ..plan(
        "causal NaN in k at key 130 of 140 gqa 2/1",
        [1, 2, 1, 8, 140, 8],
        true,
        [C; 4],
    )
};

/// Flat index of `[b, h, s, c]` in a compact `[B, H, S, D]` tensor.
fn flat(shape: [usize; 4], [b, h, s, c]: [usize; 4]) -> usize {
    ((b * shape[1] + h) * shape[2] + s) * shape[3] + c
}

/// One NaN in query 3 of head 1: that row's scores are all NaN.
fn nan_in_q(p: &AttentionPlan, qkv: &mut [Vec<f64>; 3]) {
    let (qs, _) = p.shapes();
    qkv[0][flat(qs, [0, 1, 3, 5])] = f64::NAN;
}

/// One NaN in key 136: one NaN score in each row that sees it.
fn nan_in_k(p: &AttentionPlan, qkv: &mut [Vec<f64>; 3]) {
    let (_, ks) = p.shapes();
    qkv[1][flat(ks, [0, 0, 136, 2])] = f64::NAN;
}

/// One NaN in key 130, in the second block of 128 keys, seen by every
/// query.
fn nan_in_k_seen_by_all(p: &AttentionPlan, qkv: &mut [Vec<f64>; 3]) {
    let (_, ks) = p.shapes();
    qkv[1][flat(ks, [0, 0, 130, 2])] = f64::NAN;
}

/// `q[0, 0, 2, 0] = +inf` and column 0 of head 0's keys -1 but for key 5,
/// where it is 1: query 2's scores are +inf at key 5 and -inf elsewhere.
fn inf_score(p: &AttentionPlan, qkv: &mut [Vec<f64>; 3]) {
    let (qs, ks) = p.shapes();
    qkv[0][flat(qs, [0, 0, 2, 0])] = f64::INFINITY;
    for j in 0..p.skv {
        qkv[1][flat(ks, [0, 0, j, 0])] = if j == 5 { 1.0 } else { -1.0 };
    }
}

/// One key per head: NaN in head 0's (every query of head 0 has the one
/// NaN score), and `q[0, 1, 2, 0] = +inf` against a key of 0.5 (a +inf
/// score for query 2 of head 1).
fn single_key_nan_inf(p: &AttentionPlan, qkv: &mut [Vec<f64>; 3]) {
    let (qs, ks) = p.shapes();
    qkv[1][flat(ks, [0, 0, 0, 3])] = f64::NAN;
    qkv[0][flat(qs, [0, 1, 2, 0])] = f64::INFINITY;
    qkv[1][flat(ks, [0, 1, 0, 0])] = 0.5;
}

impl AttentionPlan {
    fn shapes(&self) -> ([usize; 4], [usize; 4]) {
        (
            [self.b, self.hq, self.sq, self.d],
            [self.b, self.hkv, self.skv, self.d],
        )
    }

    fn scale(&self) -> f64 {
        if self.large_scores {
            0.125
        } else {
            1.0 / (self.d as f64).sqrt()
        }
    }

    /// Random q, k, v (with the plan's special values).
    fn qkv(&self, rng: &mut Rng, dtype: DType) -> [Vec<f64>; 3] {
        let mut qkv = self.random_qkv(rng, dtype);
        if let Some(special) = self.special {
            special(self, &mut qkv);
        }
        qkv
    }

    fn random_qkv(&self, rng: &mut Rng, dtype: DType) -> [Vec<f64>; 3] {
        let (qs, ks) = self.shapes();
        let (nq, nk) = (numel(&qs), numel(&ks));
        if self.large_scores {
            let q = (0..nq).map(|_| 6.0 + rng.below(4) as f64).collect();
            let sign = if self.negative_scores { -1.0 } else { 1.0 };
            let k = (0..nk)
                .map(|_| sign * (15.0 + rng.below(3) as f64))
                .collect();
            [q, k, rng.values(dtype, nk, -1.0, 1.0)]
        } else {
            [
                rng.values(dtype, nq, -1.0, 1.0),
                rng.values(dtype, nk, -1.0, 1.0),
                rng.values(dtype, nk, -1.0, 1.0),
            ]
        }
    }

    fn inputs(&self, dtype: DType, qkv: [Vec<f64>; 3]) -> Vec<TensorSpec> {
        let (qs, ks) = self.shapes();
        let [q, k, v] = qkv;
        vec![
            input("q", dtype, &qs, q, self.layouts[0]),
            input("k", dtype, &ks, k, self.layouts[1]),
            input("v", dtype, &ks, v, self.layouts[2]),
        ]
    }
}

pub(super) fn attention_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("attention", dtype);
    let mut cases = Vec::new();
    let plans = ATTENTION_PLANS
        .iter()
        .map(|p| (*p, p.label.to_string(), None))
        .chain([scale_zero_plan()])
        .chain(
            SPECIAL_PLANS
                .iter()
                .map(|p| (*p, p.label.to_string(), None)),
        );
    for (p, name, scale) in plans {
        let (qs, _) = p.shapes();
        let mut tensors = p.inputs(dtype, p.qkv(&mut rng, dtype));
        tensors.push(output("out", dtype, &qs, p.layouts[3]));
        tensors.push(output("lse", DType::F32, &qs[..3], p.layouts[3]));
        let (scale, causal) = (scale.unwrap_or(p.scale()), p.causal);
        cases.push(case(
            "attention",
            dtype,
            name,
            tensors,
            // Dot products over head_dim, a softmax over seq_kv, and the
            // weighted sum of seq_kv values, accumulated in f32; a
            // flash-attention kernel rounds the probabilities to the dtype
            // before the product with V (one u(out) of each weight, summed
            // over values of the tensor's scale) and the rescaled output
            // accumulator once more per block.
            Tolerance::accumulated(8.0, p.skv + p.d).with_low(2.0),
            move |exec, t| exec.attention(&t[0], &t[1], &t[2], &t[3], &t[4], scale, causal),
            move |d| {
                let (out, lse) = reference::attention(&d[0], &d[1], &d[2], scale, causal)?;
                Ok(vec![out, lse])
            },
        ));
    }
    cases
}

/// The causal plan once more with `scale` 0, run after the others (so that
/// they keep their values): every visible key weighs the same, whatever
/// the scores (mutation round 9: a kernel that took a scale of 0 for
/// "unset", PyTorch's `scale=None`, and used `1/sqrt(D)` passed).
fn scale_zero_plan() -> (AttentionPlan, String, Option<f64>) {
    let p = ATTENTION_PLANS[2];
    (p, format!("{} scale 0", p.label), Some(0.0))
}

pub(super) fn attention_backward_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("attention_backward", dtype);
    let mut cases = Vec::new();
    // Every plan, and the first once more with the saved out transposed
    // and grad_out strided.
    let mut plans: Vec<(AttentionPlan, String, [Layout; 2], Option<f64>)> = ATTENTION_PLANS
        .iter()
        .map(|p| (*p, p.label.to_string(), [C, C], None))
        .collect();
    let first = ATTENTION_PLANS[0];
    plans.push((
        first,
        format!("{} saved out transposed grad_out strided", first.label),
        [T, S],
        None,
    ));
    let (zero, name, scale) = scale_zero_plan();
    plans.push((zero, name, [C, C], scale));
    // The special plans, the NaN key moved to one every query sees.
    let mut special = SPECIAL_PLANS;
    special[1] = NAN_K_SEEN_BY_ALL;
    plans.extend(
        special
            .iter()
            .map(|p| (*p, p.label.to_string(), [C, C], None)),
    );
    for (p, name, [l_out, l_grad], scale) in plans {
        let (qs, ks) = p.shapes();
        let qkv = p.qkv(&mut rng, dtype);
        let (scale, causal) = (scale.unwrap_or(p.scale()), p.causal);
        let (out, lse) = reference::attention(
            &Dense::new(&qs, qkv[0].clone()),
            &Dense::new(&ks, qkv[1].clone()),
            &Dense::new(&ks, qkv[2].clone()),
            scale,
            causal,
        )
        .expect("valid shapes");
        let g = rng.values(dtype, numel(&qs), -1.0, 1.0);
        // grad_q sums over seq_kv; grad_k and grad_v over the seq_q queries
        // of every query head of a group; each term is a dot product over
        // head_dim.
        let mut n = p.skv + p.sq * (p.hq / p.hkv) + p.d;
        if p.large_scores {
            // grad_q = scale sum_j dS_ij k_j with sum_j dS_ij = 0 and k about
            // 16 + (-1, 0 or 1): the common 16 cancels, leaving the f32
            // rounding errors of terms up to 17 times the size of the result
            // (16 let one element of an f32 kernel that passes everywhere
            // else fail by 9% of it under other random data).
            n *= 17;
        }
        let mut tensors = p.inputs(dtype, qkv);
        tensors.extend([
            input("out", dtype, &qs, stored(dtype, &out), l_out),
            input("lse", DType::F32, &qs[..3], stored(DType::F32, &lse), l_out),
            input("grad_out", dtype, &qs, g, l_grad),
            output("grad_q", dtype, &qs, p.layouts[3]),
            output("grad_k", dtype, &ks, p.layouts[3]),
            output("grad_v", dtype, &ks, p.layouts[3]),
        ]);
        cases.push(case(
            "attention_backward",
            dtype,
            name,
            tensors,
            // The same accumulations as the forward pass; P, dS and dP may
            // be rounded to the dtype before the three matmuls that use them.
            Tolerance::accumulated(8.0, n).with_low(3.0),
            move |exec, t| {
                exec.attention_backward(
                    &t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6], &t[7], &t[8], scale, causal,
                )
            },
            move |d| {
                let (gq, gk, gv) = reference::attention_backward(
                    &d[0], &d[1], &d[2], &d[3], &d[4], &d[5], scale, causal,
                )?;
                Ok(vec![gq, gk, gv])
            },
        ));
    }
    cases
}

//! Scaled-dot-product attention of ABI 1.1 (`spec/ops.toml`), forward
//! and backward, with grouped-query heads and the end-aligned causal mask.
//!
//! `q` is `[B, Hq, Sq, D]`, `k` and `v` are `[B, Hkv, Skv, D]` with `Hkv`
//! dividing `Hq`; query head `h` reads key/value head `h / (Hq / Hkv)`. With
//! `causal`, query `i` sees key `j` when `j <= i + (Skv - Sq)`. A query that
//! sees no key gives zeros and `lse = -inf`, and contributes no gradient.

use super::{Dense, RefError, expect_shape};

/// `[B, Hq, Sq, Hkv, Skv, D]`, after checking the shapes.
fn dims(op: &'static str, q: &Dense, k: &Dense, v: &Dense) -> Result<[usize; 6], RefError> {
    for (name, t) in [("q", q), ("k", k), ("v", v)] {
        if t.ndim() != 4 {
            return Err(RefError::new(
                op,
                format!(
                    "{name} has shape {:?}, expected [batch, heads, seq, D]",
                    t.shape
                ),
            ));
        }
    }
    expect_shape(op, "v", v, &k.shape)?;
    let [b, hq, sq, d] = [q.shape[0], q.shape[1], q.shape[2], q.shape[3]];
    let [bk, hkv, skv, dk] = [k.shape[0], k.shape[1], k.shape[2], k.shape[3]];
    if bk != b || dk != d || hkv == 0 || hq % hkv != 0 {
        return Err(RefError::new(
            op,
            format!(
                "k has shape {:?}; expected [{b}, heads_kv, seq_kv, {d}] with heads_kv dividing q's {hq} heads",
                k.shape
            ),
        ));
    }
    Ok([b, hq, sq, hkv, skv, d])
}

/// Whether query `i` sees key `j`.
fn visible(causal: bool, i: usize, j: usize, sq: usize, skv: usize) -> bool {
    !causal || (j as i64) <= i as i64 + (skv as i64 - sq as i64)
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Row `[b, h, s, :]` of a `[B, H, S, D]` tensor.
fn row(t: &Dense, b: usize, h: usize, s: usize) -> &[f64] {
    let [_, nh, ns, d] = [t.shape[0], t.shape[1], t.shape[2], t.shape[3]];
    let start = ((b * nh + h) * ns + s) * d;
    &t.data[start..start + d]
}

fn row_mut(t: &mut Dense, b: usize, h: usize, s: usize) -> &mut [f64] {
    let [_, nh, ns, d] = [t.shape[0], t.shape[1], t.shape[2], t.shape[3]];
    let start = ((b * nh + h) * ns + s) * d;
    &mut t.data[start..start + d]
}

/// `(out, lse)`: `out = softmax(scale q k^T + mask) v` and `lse [B, Hq, Sq]`,
/// the log-sum-exp of each scaled, masked row of scores.
pub fn attention(
    q: &Dense,
    k: &Dense,
    v: &Dense,
    scale: f64,
    causal: bool,
) -> Result<(Dense, Dense), RefError> {
    let [b, hq, sq, hkv, skv, _] = dims("attention", q, k, v)?;
    let group = hq / hkv;
    let mut out = Dense::zeros(&q.shape);
    let mut lse = Dense::zeros(&[b, hq, sq]);
    for bi in 0..b {
        for h in 0..hq {
            let kv = h / group;
            for i in 0..sq {
                let keys: Vec<usize> = (0..skv)
                    .filter(|&j| visible(causal, i, j, sq, skv))
                    .collect();
                if keys.is_empty() {
                    *lse.at_mut(&[bi, h, i]) = f64::NEG_INFINITY;
                    continue;
                }
                let scores: Vec<f64> = keys
                    .iter()
                    .map(|&j| scale * dot(row(q, bi, h, i), row(k, bi, kv, j)))
                    .collect();
                let row_lse = super::logsumexp(&scores);
                *lse.at_mut(&[bi, h, i]) = row_lse;
                let m = super::max_nan(scores.iter().copied());
                let weights: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let total: f64 = weights.iter().sum();
                let o = row_mut(&mut out, bi, h, i);
                for (&j, w) in keys.iter().zip(&weights) {
                    for (o, &x) in o.iter_mut().zip(row(v, bi, kv, j)) {
                        *o += w / total * x;
                    }
                }
            }
        }
    }
    Ok((out, lse))
}

/// Backward of attention: `(grad_q, grad_k, grad_v)` from the forward
/// inputs and the saved `out` and `lse`. With `P = exp(scale q k^T - lse)`
/// on visible keys (0 elsewhere), `dV = P^T dO`, `dP = dO V^T`,
/// `D_i = dO_i . out_i`, `dS = P (dP - D)`, `dQ = scale dS K`,
/// `dK = scale dS^T Q`; `dK` and `dV` sum over the query heads of a group.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    q: &Dense,
    k: &Dense,
    v: &Dense,
    out: &Dense,
    lse: &Dense,
    grad_out: &Dense,
    scale: f64,
    causal: bool,
) -> Result<(Dense, Dense, Dense), RefError> {
    const OP: &str = "attention_backward";
    let [b, hq, sq, hkv, skv, _] = dims(OP, q, k, v)?;
    expect_shape(OP, "out", out, &q.shape)?;
    expect_shape(OP, "grad_out", grad_out, &q.shape)?;
    expect_shape(OP, "lse", lse, &[b, hq, sq])?;
    let group = hq / hkv;
    let mut grad_q = Dense::zeros(&q.shape);
    let mut grad_k = Dense::zeros(&k.shape);
    let mut grad_v = Dense::zeros(&v.shape);
    for bi in 0..b {
        for h in 0..hq {
            let kv = h / group;
            for i in 0..sq {
                let (qi, doi) = (row(q, bi, h, i), row(grad_out, bi, h, i));
                let d_i = dot(doi, row(out, bi, h, i));
                let row_lse = lse.at(&[bi, h, i]);
                for j in (0..skv).filter(|&j| visible(causal, i, j, sq, skv)) {
                    let (kj, vj) = (row(k, bi, kv, j), row(v, bi, kv, j));
                    let p = (scale * dot(qi, kj) - row_lse).exp();
                    let ds = p * (dot(doi, vj) - d_i);
                    for (g, &x) in row_mut(&mut grad_v, bi, kv, j).iter_mut().zip(doi) {
                        *g += p * x;
                    }
                    for (g, &x) in row_mut(&mut grad_q, bi, h, i).iter_mut().zip(kj) {
                        *g += scale * ds * x;
                    }
                    for (g, &x) in row_mut(&mut grad_k, bi, kv, j).iter_mut().zip(qi) {
                        *g += scale * ds * x;
                    }
                }
            }
        }
    }
    Ok((grad_q, grad_k, grad_v))
}

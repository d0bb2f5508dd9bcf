//! The training-step operators of ABI 1.1 (`spec/ops.toml`): linear,
//! embedding lookup and its accumulating backward, mean cross-entropy with
//! `ignore_index` and its backward, one AdamW step, and scaling.
//!
//! An index outside its range (an embedding index outside `[0, V)`, a target
//! outside `[0, C)` that is not `ignore_index`) and an AdamW step below 1 are
//! errors the plugin must report.

use super::{Dense, Indices, RefError, expect_rank, expect_shape, logsumexp, rows_of};

/// `out = input @ weight^T + bias` with `input [..., K]`, `weight [N, K]`,
/// `bias [N]` (none when `None`) and `out [..., N]`.
pub fn linear(input: &Dense, weight: &Dense, bias: Option<&Dense>) -> Result<Dense, RefError> {
    const OP: &str = "linear";
    expect_rank(OP, "input", input, 1)?;
    let (rows, k) = rows_of(input);
    if weight.ndim() != 2 || weight.shape[1] != k {
        return Err(RefError::new(
            OP,
            format!("weight has shape {:?}, expected [N, {k}]", weight.shape),
        ));
    }
    let n = weight.shape[0];
    if let Some(bias) = bias {
        expect_shape(OP, "bias", bias, &[n])?;
    }
    let mut shape = input.shape[..input.ndim() - 1].to_vec();
    shape.push(n);
    let mut out = Dense::zeros(&shape);
    for r in 0..rows {
        for o in 0..n {
            let dot: f64 = (0..k)
                .map(|i| input.data[r * k + i] * weight.data[o * k + i])
                .sum();
            out.data[r * n + o] = dot + bias.map_or(0.0, |b| b.data[o]);
        }
    }
    Ok(out)
}

/// Converts an index to a row of a table of `len` rows, or fails.
fn checked_index(op: &'static str, what: &str, index: i64, len: usize) -> Result<usize, RefError> {
    usize::try_from(index)
        .ok()
        .filter(|&i| i < len)
        .ok_or_else(|| RefError::new(op, format!("{what} {index} is outside [0, {len})")))
}

/// Checks `weight [V, H]` and returns `(V, H)`.
fn table_dims(op: &'static str, name: &str, table: &Dense) -> Result<(usize, usize), RefError> {
    if table.ndim() != 2 {
        return Err(RefError::new(
            op,
            format!("{name} has shape {:?}, expected [V, H]", table.shape),
        ));
    }
    Ok((table.shape[0], table.shape[1]))
}

/// `out[i..., :] = weight[indices[i...], :]`, shape `[indices..., H]`.
pub fn embedding(weight: &Dense, indices: &Indices) -> Result<Dense, RefError> {
    const OP: &str = "embedding";
    let (vocab, h) = table_dims(OP, "weight", weight)?;
    let mut shape = indices.shape.clone();
    shape.push(h);
    let mut out = Dense::zeros(&shape);
    for (n, &index) in indices.data.iter().enumerate() {
        let row = checked_index(OP, "index", index, vocab)?;
        out.data[n * h..(n + 1) * h].copy_from_slice(&weight.data[row * h..(row + 1) * h]);
    }
    Ok(out)
}

/// `grad_weight_prev` plus `grad_out[i..., :]` added into row
/// `indices[i...]` for every `i` (repeated indices add up).
pub fn embedding_backward(
    grad_out: &Dense,
    indices: &Indices,
    grad_weight_prev: &Dense,
) -> Result<Dense, RefError> {
    const OP: &str = "embedding_backward";
    let (vocab, h) = table_dims(OP, "grad_weight", grad_weight_prev)?;
    let mut shape = indices.shape.clone();
    shape.push(h);
    expect_shape(OP, "grad_out", grad_out, &shape)?;
    let mut grad_weight = grad_weight_prev.clone();
    for (n, &index) in indices.data.iter().enumerate() {
        let row = checked_index(OP, "index", index, vocab)?;
        for c in 0..h {
            grad_weight.data[row * h + c] += grad_out.data[n * h + c];
        }
    }
    Ok(grad_weight)
}

/// Checks `logits [N, C]` and `targets [N]`, and returns `(N, C)` and, per
/// row, the target class or `None` for an ignored row.
fn counted_rows(
    op: &'static str,
    logits: &Dense,
    targets: &Indices,
    ignore_index: i64,
) -> Result<(usize, usize, Vec<Option<usize>>), RefError> {
    let (n, c) = table_dims(op, "logits", logits)?;
    if targets.shape != [n] {
        return Err(RefError::new(
            op,
            format!("targets has shape {:?}, expected [{n}]", targets.shape),
        ));
    }
    let classes = targets
        .data
        .iter()
        .map(|&t| {
            if t == ignore_index {
                Ok(None)
            } else {
                checked_index(op, "target", t, c).map(Some)
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((n, c, classes))
}

/// The mean over rows not ignored of `logsumexp(row) - row[target]`, as a
/// 0-dimensional tensor; NaN when every row is ignored (0 / 0).
pub fn cross_entropy(
    logits: &Dense,
    targets: &Indices,
    ignore_index: i64,
) -> Result<Dense, RefError> {
    let (_, c, classes) = counted_rows("cross_entropy", logits, targets, ignore_index)?;
    let (mut total, mut count) = (0.0, 0usize);
    for (r, class) in classes.iter().enumerate() {
        if let Some(t) = *class {
            let row = &logits.data[r * c..(r + 1) * c];
            total += logsumexp(row) - row[t];
            count += 1;
        }
    }
    Ok(Dense::scalar(total / count as f64))
}

/// `grad_logits = grad_loss * (softmax(row) - onehot(target)) / count` for
/// counted rows and 0 for ignored ones (all zeros when every row is ignored).
pub fn cross_entropy_backward(
    logits: &Dense,
    targets: &Indices,
    grad_loss: f64,
    ignore_index: i64,
) -> Result<Dense, RefError> {
    let (_, c, classes) = counted_rows("cross_entropy_backward", logits, targets, ignore_index)?;
    let count = classes.iter().flatten().count() as f64;
    let mut grad = Dense::zeros(&logits.shape);
    for (r, class) in classes.iter().enumerate() {
        let Some(t) = *class else { continue };
        let row = &logits.data[r * c..(r + 1) * c];
        let lse = logsumexp(row);
        for (i, &x) in row.iter().enumerate() {
            let p = (x - lse).exp();
            let onehot = if i == t { 1.0 } else { 0.0 };
            grad.data[r * c + i] = grad_loss * (p - onehot) / count;
        }
    }
    Ok(grad)
}

/// One AdamW step, element by element, returning `(param, exp_avg,
/// exp_avg_sq)`:
///
/// ```text
/// p -= lr * weight_decay * p
/// m = beta1 m + (1 - beta1) g
/// v = beta2 v + (1 - beta2) g^2
/// p -= lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
/// ```
///
/// A step below 1 is an error.
#[allow(clippy::too_many_arguments)]
pub fn adamw(
    param: &Dense,
    grad: &Dense,
    exp_avg: &Dense,
    exp_avg_sq: &Dense,
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    step: i64,
) -> Result<(Dense, Dense, Dense), RefError> {
    const OP: &str = "adamw";
    for (name, t) in [
        ("grad", grad),
        ("exp_avg", exp_avg),
        ("exp_avg_sq", exp_avg_sq),
    ] {
        expect_shape(OP, name, t, &param.shape)?;
    }
    if step < 1 {
        return Err(RefError::new(
            OP,
            format!("step is {step}; bias correction needs a step of at least 1"),
        ));
    }
    let correction1 = 1.0 - beta1.powf(step as f64);
    let correction2 = 1.0 - beta2.powf(step as f64);
    let (mut p, mut m, mut v) = (param.clone(), exp_avg.clone(), exp_avg_sq.clone());
    for i in 0..param.numel() {
        let g = grad.data[i];
        p.data[i] -= lr * weight_decay * p.data[i];
        m.data[i] = beta1 * m.data[i] + (1.0 - beta1) * g;
        v.data[i] = beta2 * v.data[i] + (1.0 - beta2) * g * g;
        p.data[i] -= lr * (m.data[i] / correction1) / ((v.data[i] / correction2).sqrt() + eps);
    }
    Ok((p, m, v))
}

/// `x * alpha`.
pub fn scale(tensor: &Dense, alpha: f64) -> Result<Dense, RefError> {
    Ok(tensor.map(|x| x * alpha))
}

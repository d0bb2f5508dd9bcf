//! The normalisations and rotary embeddings of ABI 1.1 (`spec/ops.toml`).
//!
//! RMSNorm and LayerNorm work over the last dimension `H` of `[..., H]`;
//! their statistics have the leading shape `[...]`. The backward operators
//! take the saved statistics as inputs, as the plugin does, and use them in
//! the gradient formulas instead of recomputing them. Rotary embedding
//! rotates pairs of `[batch, seq, heads, D]` by per-position angles given as
//! `cos`/`sin` tables `[seq, D/2]`; its backward is the rotation by `-theta`.

use super::{Dense, RefError, expect_rank, expect_shape, rows_of};

/// Checks `input [..., H]`, parameters `[H]` and statistics `[...]`, and
/// returns `(rows, H)`.
fn norm_shapes(
    op: &'static str,
    input: &Dense,
    params: &[(&str, &Dense)],
    stats: &[(&str, &Dense)],
) -> Result<(usize, usize), RefError> {
    expect_rank(op, "input", input, 1)?;
    let (rows, h) = rows_of(input);
    for (name, p) in params {
        expect_shape(op, name, p, &[h])?;
    }
    for (name, s) in stats {
        expect_shape(op, name, s, &input.shape[..input.ndim() - 1])?;
    }
    Ok((rows, h))
}

/// RMSNorm: `(out, inv_rms)` with `inv_rms = 1 / sqrt(mean(x^2) + eps)` per
/// row and `out = x * inv_rms * weight`.
pub fn rms_norm(input: &Dense, weight: &Dense, eps: f64) -> Result<(Dense, Dense), RefError> {
    let (rows, h) = norm_shapes("rms_norm", input, &[("weight", weight)], &[])?;
    let mut out = Dense::zeros(&input.shape);
    let mut inv_rms = Dense::zeros(&input.shape[..input.ndim() - 1]);
    for r in 0..rows {
        let x = &input.data[r * h..(r + 1) * h];
        let mean_square = x.iter().map(|v| v * v).sum::<f64>() / h as f64;
        let inv = 1.0 / (mean_square + eps).sqrt();
        inv_rms.data[r] = inv;
        for (i, &xi) in x.iter().enumerate() {
            out.data[r * h + i] = xi * inv * weight.data[i];
        }
    }
    Ok((out, inv_rms))
}

/// Backward of RMSNorm: `(grad_input, grad_weight)`. With `r` the saved
/// `inv_rms` of a row (`dr/dx_j = -r^3 x_j / H`):
/// `grad_input_j = r (g_j w_j - x_j r^2 sum_i(g_i w_i x_i) / H)` and
/// `grad_weight_i = sum over rows of g_i x_i r`.
pub fn rms_norm_backward(
    grad_out: &Dense,
    input: &Dense,
    weight: &Dense,
    inv_rms: &Dense,
) -> Result<(Dense, Dense), RefError> {
    const OP: &str = "rms_norm_backward";
    let (rows, h) = norm_shapes(OP, input, &[("weight", weight)], &[("inv_rms", inv_rms)])?;
    expect_shape(OP, "grad_out", grad_out, &input.shape)?;
    let mut grad_input = Dense::zeros(&input.shape);
    let mut grad_weight = Dense::zeros(&[h]);
    for row in 0..rows {
        let x = &input.data[row * h..(row + 1) * h];
        let g = &grad_out.data[row * h..(row + 1) * h];
        let r = inv_rms.data[row];
        let dot: f64 = (0..h).map(|i| g[i] * weight.data[i] * x[i]).sum();
        for j in 0..h {
            grad_input.data[row * h + j] =
                r * (g[j] * weight.data[j] - x[j] * r * r * dot / h as f64);
            grad_weight.data[j] += g[j] * x[j] * r;
        }
    }
    Ok((grad_input, grad_weight))
}

/// LayerNorm: `(out, mean, rstd)` with the biased variance,
/// `rstd = 1 / sqrt(var + eps)` and `out = (x - mean) * rstd * weight + bias`.
pub fn layer_norm(
    input: &Dense,
    weight: &Dense,
    bias: &Dense,
    eps: f64,
) -> Result<(Dense, Dense, Dense), RefError> {
    let params = [("weight", weight), ("bias", bias)];
    let (rows, h) = norm_shapes("layer_norm", input, &params, &[])?;
    let stats_shape = &input.shape[..input.ndim() - 1];
    let (mut mean, mut rstd) = (Dense::zeros(stats_shape), Dense::zeros(stats_shape));
    let mut out = Dense::zeros(&input.shape);
    for r in 0..rows {
        let x = &input.data[r * h..(r + 1) * h];
        let mu = x.iter().sum::<f64>() / h as f64;
        let var = x.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / h as f64;
        let s = 1.0 / (var + eps).sqrt();
        mean.data[r] = mu;
        rstd.data[r] = s;
        for (i, &xi) in x.iter().enumerate() {
            out.data[r * h + i] = (xi - mu) * s * weight.data[i] + bias.data[i];
        }
    }
    Ok((out, mean, rstd))
}

/// Backward of LayerNorm: `(grad_input, grad_weight, grad_bias)`. With the
/// saved `mean` and `rstd` of a row, `xhat = (x - mean) rstd` and
/// `gy = g * w`: `grad_input = rstd (gy - mean(gy) - xhat mean(gy xhat))`,
/// `grad_weight = sum over rows of g xhat`, `grad_bias = sum over rows of g`.
pub fn layer_norm_backward(
    grad_out: &Dense,
    input: &Dense,
    weight: &Dense,
    mean: &Dense,
    rstd: &Dense,
) -> Result<(Dense, Dense, Dense), RefError> {
    const OP: &str = "layer_norm_backward";
    let stats = [("mean", mean), ("rstd", rstd)];
    let (rows, h) = norm_shapes(OP, input, &[("weight", weight)], &stats)?;
    expect_shape(OP, "grad_out", grad_out, &input.shape)?;
    let mut grad_input = Dense::zeros(&input.shape);
    let (mut grad_weight, mut grad_bias) = (Dense::zeros(&[h]), Dense::zeros(&[h]));
    for r in 0..rows {
        let x = &input.data[r * h..(r + 1) * h];
        let g = &grad_out.data[r * h..(r + 1) * h];
        let s = rstd.data[r];
        let xhat: Vec<f64> = x.iter().map(|v| (v - mean.data[r]) * s).collect();
        let gy: Vec<f64> = (0..h).map(|i| g[i] * weight.data[i]).collect();
        let mean_gy = gy.iter().sum::<f64>() / h as f64;
        let mean_gy_xhat = (0..h).map(|i| gy[i] * xhat[i]).sum::<f64>() / h as f64;
        for i in 0..h {
            grad_input.data[r * h + i] = s * (gy[i] - mean_gy - xhat[i] * mean_gy_xhat);
            grad_weight.data[i] += g[i] * xhat[i];
            grad_bias.data[i] += g[i];
        }
    }
    Ok((grad_input, grad_weight, grad_bias))
}

/// Rotates every pair by the table's angle, with `sign` +1 (forward) or -1.
fn rotate(
    op: &'static str,
    input: &Dense,
    cos: &Dense,
    sin: &Dense,
    interleaved: bool,
    sign: f64,
) -> Result<Dense, RefError> {
    if input.ndim() != 4 {
        return Err(RefError::new(
            op,
            format!(
                "input has shape {:?}, expected [batch, seq, heads, D]",
                input.shape
            ),
        ));
    }
    let [b, s, heads, d] = [
        input.shape[0],
        input.shape[1],
        input.shape[2],
        input.shape[3],
    ];
    if d % 2 != 0 {
        return Err(RefError::new(op, format!("head_dim {d} is odd")));
    }
    let half = d / 2;
    expect_shape(op, "cos", cos, &[s, half])?;
    expect_shape(op, "sin", sin, &[s, half])?;
    let mut out = input.clone();
    for bi in 0..b {
        for pos in 0..s {
            for h in 0..heads {
                for j in 0..half {
                    let (ia, ib) = if interleaved {
                        (2 * j, 2 * j + 1)
                    } else {
                        (j, j + half)
                    };
                    let (c, sn) = (cos.at(&[pos, j]), sign * sin.at(&[pos, j]));
                    let a = input.at(&[bi, pos, h, ia]);
                    let bv = input.at(&[bi, pos, h, ib]);
                    *out.at_mut(&[bi, pos, h, ia]) = a * c - bv * sn;
                    *out.at_mut(&[bi, pos, h, ib]) = a * sn + bv * c;
                }
            }
        }
    }
    Ok(out)
}

/// Rotary embedding of `input [batch, seq, heads, D]`: pair `j` is
/// `(x[2j], x[2j+1])` when `interleaved`, else `(x[j], x[j + D/2])`, rotated
/// to `(a cos - b sin, a sin + b cos)` with `cos[seq, j]`, `sin[seq, j]`.
pub fn rope(input: &Dense, cos: &Dense, sin: &Dense, interleaved: bool) -> Result<Dense, RefError> {
    rotate("rope", input, cos, sin, interleaved, 1.0)
}

/// Backward of `rope`: the rotation by `-theta`,
/// `(a cos + b sin, -a sin + b cos)` (the transpose of the forward rotation).
pub fn rope_backward(
    input: &Dense,
    cos: &Dense,
    sin: &Dense,
    interleaved: bool,
) -> Result<Dense, RefError> {
    rotate("rope_backward", input, cos, sin, interleaved, -1.0)
}

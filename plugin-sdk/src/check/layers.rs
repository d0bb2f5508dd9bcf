//! Argument rules of the ABI 1.1 layer operators: RMSNorm, LayerNorm,
//! rotary embeddings and attention.

use super::nn::{exact_rank, f32_only, last, like, low, rank, rows};
use super::{ArgError, Checked, same_dtype, shape_is, writable};
use crate::tensor::{Shape, TensorDesc};

/// A normalisation's parameter `[H]` and its statistics `[...]` in f32.
fn norm_params(
    op: &'static str,
    input: &TensorDesc,
    params: &[(&'static str, &TensorDesc)],
    stats: &[(&'static str, &TensorDesc)],
) -> Checked {
    low(op, "input", input)?;
    rank(op, "input", input, 1, "at least 1 dimension")?;
    let h = [last(input)];
    for &(name, p) in params {
        same_dtype(op, ("input", input), (name, p))?;
        shape_is(
            op,
            name,
            p,
            &h,
            "it must be [H] where H is input's last dimension:",
        )?;
    }
    for &(name, s) in stats {
        f32_only(op, name, s)?;
        shape_is(
            op,
            name,
            s,
            rows(input),
            "it must be input's shape without its last dimension:",
        )?;
    }
    Ok(())
}

/// `rms_norm`.
pub fn rms_norm(
    input: &TensorDesc,
    weight: &TensorDesc,
    out: &TensorDesc,
    inv_rms: &TensorDesc,
) -> Checked {
    const OP: &str = "rms_norm";
    norm_params(OP, input, &[("weight", weight)], &[("inv_rms", inv_rms)])?;
    like(OP, ("input", input), &[("out", out)])?;
    writable(OP, "out", out)?;
    writable(OP, "inv_rms", inv_rms)
}

/// `rms_norm_backward`.
pub fn rms_norm_backward(
    grad_out: &TensorDesc,
    input: &TensorDesc,
    weight: &TensorDesc,
    inv_rms: &TensorDesc,
    grad_input: &TensorDesc,
    grad_weight: &TensorDesc,
) -> Checked {
    const OP: &str = "rms_norm_backward";
    norm_params(
        OP,
        input,
        &[("weight", weight), ("grad_weight", grad_weight)],
        &[("inv_rms", inv_rms)],
    )?;
    like(
        OP,
        ("input", input),
        &[("grad_out", grad_out), ("grad_input", grad_input)],
    )?;
    writable(OP, "grad_input", grad_input)?;
    writable(OP, "grad_weight", grad_weight)
}

/// `layer_norm`.
pub fn layer_norm(
    input: &TensorDesc,
    weight: &TensorDesc,
    bias: &TensorDesc,
    out: &TensorDesc,
    mean: &TensorDesc,
    rstd: &TensorDesc,
) -> Checked {
    const OP: &str = "layer_norm";
    norm_params(
        OP,
        input,
        &[("weight", weight), ("bias", bias)],
        &[("mean", mean), ("rstd", rstd)],
    )?;
    like(OP, ("input", input), &[("out", out)])?;
    for (name, t) in [("out", out), ("mean", mean), ("rstd", rstd)] {
        writable(OP, name, t)?;
    }
    Ok(())
}

/// `layer_norm_backward`.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_backward(
    grad_out: &TensorDesc,
    input: &TensorDesc,
    weight: &TensorDesc,
    mean: &TensorDesc,
    rstd: &TensorDesc,
    grad_input: &TensorDesc,
    grad_weight: &TensorDesc,
    grad_bias: &TensorDesc,
) -> Checked {
    const OP: &str = "layer_norm_backward";
    norm_params(
        OP,
        input,
        &[
            ("weight", weight),
            ("grad_weight", grad_weight),
            ("grad_bias", grad_bias),
        ],
        &[("mean", mean), ("rstd", rstd)],
    )?;
    like(
        OP,
        ("input", input),
        &[("grad_out", grad_out), ("grad_input", grad_input)],
    )?;
    for (name, t) in [
        ("grad_input", grad_input),
        ("grad_weight", grad_weight),
        ("grad_bias", grad_bias),
    ] {
        writable(OP, name, t)?;
    }
    Ok(())
}

/// `rope` and `rope_backward`: `input [B, S, H, D]` with D even, f32
/// `cos`/`sin` `[S, D/2]`.
pub fn rope(
    op: &'static str,
    input: &TensorDesc,
    cos: &TensorDesc,
    sin: &TensorDesc,
    out: &TensorDesc,
) -> Checked {
    low(op, "input", input)?;
    exact_rank(op, "input", input, 4, "[batch, seq, heads, head_dim]")?;
    let (s, d) = (input.shape[1], input.shape[3]);
    if d % 2 != 0 {
        return Err(ArgError::ShapeMismatch {
            op,
            tensor: "input",
            actual: Shape::from(input.shape),
            expected: format!("its head_dim {d} must be even"),
        });
    }
    for (name, t) in [("cos", cos), ("sin", sin)] {
        f32_only(op, name, t)?;
        shape_is(op, name, t, &[s, d / 2], "it must be [seq, head_dim / 2] =")?;
    }
    like(op, ("input", input), &[("out", out)])?;
    writable(op, "out", out)
}

/// The attention dimensions `(batch, heads_q, seq_q, heads_kv, seq_kv, head_dim)`.
fn attention_dims(
    op: &'static str,
    q: &TensorDesc,
    k: &TensorDesc,
    v: &TensorDesc,
) -> Result<[i64; 6], ArgError> {
    low(op, "q", q)?;
    for (name, t) in [("q", q), ("k", k), ("v", v)] {
        exact_rank(op, name, t, 4, "[batch, heads, seq, head_dim]")?;
    }
    same_dtype(op, ("q", q), ("k", k))?;
    like(op, ("k", k), &[("v", v)])?;
    let [b, hq, sq, d] = [q.shape[0], q.shape[1], q.shape[2], q.shape[3]];
    let [bk, hkv, skv, dk] = [k.shape[0], k.shape[1], k.shape[2], k.shape[3]];
    if bk != b || dk != d || hkv == 0 || hq % hkv != 0 {
        return Err(ArgError::ShapeMismatch {
            op,
            tensor: "k",
            actual: Shape::from(k.shape),
            expected: format!(
                "it must be [{b}, heads_kv, seq_kv, {d}] with heads_kv dividing q's {hq} heads (q has shape {})",
                Shape::from(q.shape)
            ),
        });
    }
    Ok([b, hq, sq, hkv, skv, d])
}

/// `attention`.
pub fn attention(
    q: &TensorDesc,
    k: &TensorDesc,
    v: &TensorDesc,
    out: &TensorDesc,
    lse: &TensorDesc,
) -> Checked {
    const OP: &str = "attention";
    let [b, hq, sq, ..] = attention_dims(OP, q, k, v)?;
    like(OP, ("q", q), &[("out", out)])?;
    f32_only(OP, "lse", lse)?;
    shape_is(
        OP,
        "lse",
        lse,
        &[b, hq, sq],
        "it must be [batch, heads_q, seq_q] =",
    )?;
    writable(OP, "out", out)?;
    writable(OP, "lse", lse)
}

/// `attention_backward`.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    q: &TensorDesc,
    k: &TensorDesc,
    v: &TensorDesc,
    out: &TensorDesc,
    lse: &TensorDesc,
    grad_out: &TensorDesc,
    grad_q: &TensorDesc,
    grad_k: &TensorDesc,
    grad_v: &TensorDesc,
) -> Checked {
    const OP: &str = "attention_backward";
    let [b, hq, sq, ..] = attention_dims(OP, q, k, v)?;
    like(
        OP,
        ("q", q),
        &[("out", out), ("grad_out", grad_out), ("grad_q", grad_q)],
    )?;
    like(OP, ("k", k), &[("grad_k", grad_k), ("grad_v", grad_v)])?;
    f32_only(OP, "lse", lse)?;
    shape_is(
        OP,
        "lse",
        lse,
        &[b, hq, sq],
        "it must be [batch, heads_q, seq_q] =",
    )?;
    for (name, t) in [("grad_q", grad_q), ("grad_k", grad_k), ("grad_v", grad_v)] {
        writable(OP, name, t)?;
    }
    Ok(())
}

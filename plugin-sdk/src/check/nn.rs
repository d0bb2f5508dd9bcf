//! Argument rules of the operators added in ABI 1.1 (elementwise math and
//! activations, reductions, normalisations, rotary embeddings, attention,
//! embedding, cross-entropy, AdamW). Their floating tensors are f32, f16 or
//! bf16; statistics are f32; indices are i32 or i64.

use super::{ArgError, Checked, same_dtype, shape_is, writable};
use crate::dtype::DType;
use crate::tensor::{Shape, TensorDesc};

const LOW: &str = "f32, f16 and bf16";

fn low(op: &'static str, tensor: &'static str, t: &TensorDesc) -> Checked {
    if matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16) {
        Ok(())
    } else {
        Err(ArgError::UnsupportedDType {
            op,
            tensor,
            dtype: t.dtype,
            accepted: LOW,
        })
    }
}

fn f32_only(op: &'static str, tensor: &'static str, t: &TensorDesc) -> Checked {
    if t.dtype == DType::F32 {
        Ok(())
    } else {
        Err(ArgError::UnsupportedDType {
            op,
            tensor,
            dtype: t.dtype,
            accepted: "f32",
        })
    }
}

fn index(op: &'static str, tensor: &'static str, t: &TensorDesc) -> Checked {
    if matches!(t.dtype, DType::I32 | DType::I64) {
        Ok(())
    } else {
        Err(ArgError::UnsupportedDType {
            op,
            tensor,
            dtype: t.dtype,
            accepted: "i32 and i64",
        })
    }
}

fn rank(op: &'static str, tensor: &'static str, t: &TensorDesc, min: usize, what: &str) -> Checked {
    if t.ndim() >= min {
        Ok(())
    } else {
        Err(ArgError::ShapeMismatch {
            op,
            tensor,
            actual: Shape::from(t.shape),
            expected: format!("{op} needs {what}"),
        })
    }
}

fn exact_rank(
    op: &'static str,
    tensor: &'static str,
    t: &TensorDesc,
    n: usize,
    what: &str,
) -> Checked {
    if t.ndim() == n {
        Ok(())
    } else {
        Err(ArgError::ShapeMismatch {
            op,
            tensor,
            actual: Shape::from(t.shape),
            expected: format!("it must be {what}"),
        })
    }
}

/// Every tensor in `others` has `first`'s dtype and shape.
fn like(
    op: &'static str,
    first: (&'static str, &TensorDesc),
    others: &[(&'static str, &TensorDesc)],
) -> Checked {
    for &(name, t) in others {
        same_dtype(op, first, (name, t))?;
        shape_is(
            op,
            name,
            t,
            first.1.shape,
            &format!("it must equal {}'s shape", first.0),
        )?;
    }
    Ok(())
}

/// The shape without its last dimension.
fn rows<'a>(t: &TensorDesc<'a>) -> &'a [i64] {
    &t.shape[..t.ndim().saturating_sub(1)]
}

fn last(t: &TensorDesc) -> i64 {
    t.shape.last().copied().unwrap_or(1)
}

/// Unary operators and `pow_scalar`: `out` like `input`.
pub fn unary(op: &'static str, input: &TensorDesc, out: &TensorDesc) -> Checked {
    low(op, "input", input)?;
    like(op, ("input", input), &[("out", out)])?;
    writable(op, "out", out)
}

/// `relu_backward`, `silu_backward`, `gelu_backward`.
pub fn activation_backward(
    op: &'static str,
    grad_out: &TensorDesc,
    input: &TensorDesc,
    grad_in: &TensorDesc,
) -> Checked {
    low(op, "input", input)?;
    like(
        op,
        ("input", input),
        &[("grad_out", grad_out), ("grad_in", grad_in)],
    )?;
    writable(op, "grad_in", grad_in)
}

/// `swiglu`.
pub fn swiglu(gate: &TensorDesc, up: &TensorDesc, out: &TensorDesc) -> Checked {
    low("swiglu", "gate", gate)?;
    like("swiglu", ("gate", gate), &[("up", up), ("out", out)])?;
    writable("swiglu", "out", out)
}

/// `swiglu_backward`.
pub fn swiglu_backward(
    gate: &TensorDesc,
    up: &TensorDesc,
    grad_out: &TensorDesc,
    grad_gate: &TensorDesc,
    grad_up: &TensorDesc,
) -> Checked {
    const OP: &str = "swiglu_backward";
    low(OP, "gate", gate)?;
    like(
        OP,
        ("gate", gate),
        &[
            ("up", up),
            ("grad_out", grad_out),
            ("grad_gate", grad_gate),
            ("grad_up", grad_up),
        ],
    )?;
    writable(OP, "grad_gate", grad_gate)?;
    writable(OP, "grad_up", grad_up)
}

/// `sum`, `mean`, `max`, `argmax`: returns the reduced dimension, counted
/// from the front.
pub fn reduce(
    op: &'static str,
    input: &TensorDesc,
    out: &TensorDesc,
    dim: i32,
    keepdim: bool,
) -> Result<usize, ArgError> {
    low(op, "input", input)?;
    rank(op, "input", input, 1, "at least 1 dimension")?;
    let n = input.ndim() as i64;
    let d = if dim < 0 {
        i64::from(dim) + n
    } else {
        i64::from(dim)
    };
    if !(0..n).contains(&d) {
        return Err(ArgError::Invalid {
            op,
            message: format!(
                "dim {dim} is out of range for input of shape {}",
                Shape::from(input.shape)
            ),
        });
    }
    let d = d as usize;
    let mut expected = input.shape.to_vec();
    if keepdim {
        expected[d] = 1;
    } else {
        expected.remove(d);
    }
    if op == "argmax" {
        if out.dtype != DType::I64 {
            return Err(ArgError::UnsupportedDType {
                op,
                tensor: "out",
                dtype: out.dtype,
                accepted: "i64",
            });
        }
    } else {
        same_dtype(op, ("input", input), ("out", out))?;
    }
    let why = if keepdim {
        "it must be input's shape with dimension dim set to 1:"
    } else {
        "it must be input's shape without dimension dim:"
    };
    shape_is(op, "out", out, &expected, why)?;
    writable(op, "out", out)?;
    Ok(d)
}

/// `sum_squares`: any low-precision floating input, a 0-dimensional f32 output.
pub fn sum_squares(input: &TensorDesc, out: &TensorDesc) -> Checked {
    const OP: &str = "sum_squares";
    low(OP, "input", input)?;
    f32_only(OP, "out", out)?;
    exact_rank(OP, "out", out, 0, "0-dimensional")
}

/// `linear`: `input [..., K]`, `weight [N, K]`, `bias [N]`, `out [..., N]`.
pub fn linear(
    input: &TensorDesc,
    weight: &TensorDesc,
    bias: Option<&TensorDesc>,
    out: &TensorDesc,
) -> Checked {
    const OP: &str = "linear";
    low(OP, "input", input)?;
    rank(OP, "input", input, 1, "at least 1 dimension")?;
    same_dtype(OP, ("input", input), ("weight", weight))?;
    same_dtype(OP, ("input", input), ("out", out))?;
    exact_rank(OP, "weight", weight, 2, "[N, K]")?;
    let (n, k) = (weight.shape[0], weight.shape[1]);
    if k != last(input) {
        return Err(ArgError::ShapeMismatch {
            op: OP,
            tensor: "weight",
            actual: Shape::from(weight.shape),
            expected: format!(
                "its K {k} differs from input's last dimension {} (input has shape {})",
                last(input),
                Shape::from(input.shape)
            ),
        });
    }
    if let Some(bias) = bias {
        same_dtype(OP, ("input", input), ("bias", bias))?;
        shape_is(OP, "bias", bias, &[n], "it must be [N] =")?;
    }
    let mut expected = rows(input).to_vec();
    expected.push(n);
    shape_is(OP, "out", out, &expected, "it must be")?;
    writable(OP, "out", out)
}

/// `log_softmax`: like `softmax`, in f32, f16 or bf16.
pub fn log_softmax(input: &TensorDesc, out: &TensorDesc) -> Checked {
    const OP: &str = "log_softmax";
    low(OP, "input", input)?;
    rank(OP, "input", input, 1, "at least 1 dimension")?;
    like(OP, ("input", input), &[("out", out)])?;
    writable(OP, "out", out)
}

/// `softmax_backward` and `log_softmax_backward`.
pub fn softmax_backward(
    op: &'static str,
    out: &TensorDesc,
    grad_out: &TensorDesc,
    grad_in: &TensorDesc,
) -> Checked {
    low(op, "out", out)?;
    rank(op, "out", out, 1, "at least 1 dimension")?;
    like(
        op,
        ("out", out),
        &[("grad_out", grad_out), ("grad_in", grad_in)],
    )?;
    writable(op, "grad_in", grad_in)
}

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

/// `embedding` and `embedding_backward`: `table [V, H]`, indices of any
/// shape, `rows [indices..., H]`.
pub fn embedding(
    op: &'static str,
    table: (&'static str, &TensorDesc),
    indices: &TensorDesc,
    rows_t: (&'static str, &TensorDesc),
) -> Checked {
    low(op, table.0, table.1)?;
    exact_rank(op, table.0, table.1, 2, "[V, H]")?;
    index(op, "indices", indices)?;
    same_dtype(op, table, rows_t)?;
    let mut expected = indices.shape.to_vec();
    expected.push(table.1.shape[1]);
    shape_is(
        op,
        rows_t.0,
        rows_t.1,
        &expected,
        "it must be indices' shape followed by H:",
    )?;
    let written = if op == "embedding" { rows_t } else { table };
    writable(op, written.0, written.1)
}

/// `cross_entropy`: `logits [N, C]`, `targets [N]`, a 0-dimensional f32 loss.
pub fn cross_entropy(logits: &TensorDesc, targets: &TensorDesc, loss: &TensorDesc) -> Checked {
    const OP: &str = "cross_entropy";
    logits_targets(OP, logits, targets)?;
    f32_only(OP, "loss", loss)?;
    exact_rank(OP, "loss", loss, 0, "0-dimensional")
}

fn logits_targets(op: &'static str, logits: &TensorDesc, targets: &TensorDesc) -> Checked {
    low(op, "logits", logits)?;
    exact_rank(op, "logits", logits, 2, "[N, C]")?;
    index(op, "targets", targets)?;
    shape_is(
        op,
        "targets",
        targets,
        &logits.shape[..1],
        "it must be [N] =",
    )
}

/// `cross_entropy_backward`.
pub fn cross_entropy_backward(
    logits: &TensorDesc,
    targets: &TensorDesc,
    grad_logits: &TensorDesc,
) -> Checked {
    const OP: &str = "cross_entropy_backward";
    logits_targets(OP, logits, targets)?;
    like(OP, ("logits", logits), &[("grad_logits", grad_logits)])?;
    writable(OP, "grad_logits", grad_logits)
}

/// `adamw`: parameters and gradients of one floating dtype, f32 moments, one
/// shape, and a step of at least 1.
pub fn adamw(
    param: &TensorDesc,
    grad: &TensorDesc,
    exp_avg: &TensorDesc,
    exp_avg_sq: &TensorDesc,
    step: i64,
) -> Checked {
    const OP: &str = "adamw";
    low(OP, "param", param)?;
    like(OP, ("param", param), &[("grad", grad)])?;
    for (name, t) in [("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)] {
        f32_only(OP, name, t)?;
        shape_is(OP, name, t, param.shape, "it must equal param's shape")?;
        writable(OP, name, t)?;
    }
    writable(OP, "param", param)?;
    if step < 1 {
        return Err(ArgError::Invalid {
            op: OP,
            message: format!("step is {step}; bias correction needs a step of at least 1"),
        });
    }
    Ok(())
}

/// `scale`: a floating tensor updated in place.
pub fn scale(tensor: &TensorDesc) -> Checked {
    low("scale", "tensor", tensor)?;
    writable("scale", "tensor", tensor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    fn t(dtype: DType, shape: &[i64]) -> TensorDesc<'_> {
        TensorDesc::new(std::ptr::null_mut(), dtype, shape, None)
    }

    #[test]
    fn reduce_normalises_dim_and_checks_out() {
        let x = t(DType::F32, &[2, 3, 4]);
        assert_eq!(reduce("sum", &x, &t(DType::F32, &[2, 4]), -2, false), Ok(1));
        assert_eq!(
            reduce("max", &x, &t(DType::F32, &[2, 1, 4]), 1, true),
            Ok(1)
        );
        assert_eq!(
            reduce("argmax", &x, &t(DType::I64, &[2, 3]), 2, false),
            Ok(2)
        );
        let err = reduce("argmax", &x, &t(DType::I32, &[2, 3]), 2, false).unwrap_err();
        assert_eq!(err.code(), ErrorCode::DTypeMismatch);
        let err = reduce("mean", &x, &t(DType::F32, &[2, 3]), 3, false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "mean: dim 3 is out of range for input of shape [2, 3, 4]"
        );
    }

    #[test]
    fn norms_name_the_wrong_parameter() {
        let x = t(DType::BF16, &[5, 8]);
        let ok = rms_norm(
            &x,
            &t(DType::BF16, &[8]),
            &t(DType::BF16, &[5, 8]),
            &t(DType::F32, &[5]),
        );
        assert_eq!(ok, Ok(()));
        let err = rms_norm(
            &x,
            &t(DType::BF16, &[7]),
            &t(DType::BF16, &[5, 8]),
            &t(DType::F32, &[5]),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "rms_norm: weight has shape [7], but it must be [H] where H is input's last dimension: [8]"
        );
        let err = rms_norm(
            &x,
            &t(DType::BF16, &[8]),
            &t(DType::BF16, &[5, 8]),
            &t(DType::BF16, &[5]),
        )
        .unwrap_err();
        assert_eq!(err.code(), ErrorCode::DTypeMismatch);
        let err = rms_norm(
            &t(DType::F64, &[5, 8]),
            &t(DType::F64, &[8]),
            &t(DType::F64, &[5, 8]),
            &t(DType::F32, &[5]),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "rms_norm: input has dtype f64, but rms_norm accepts only f32, f16 and bf16"
        );
    }

    #[test]
    fn attention_checks_grouped_heads() {
        let q = t(DType::F16, &[2, 8, 16, 64]);
        let kv = t(DType::F16, &[2, 2, 32, 64]);
        assert_eq!(
            attention(
                &q,
                &kv,
                &kv,
                &t(DType::F16, &[2, 8, 16, 64]),
                &t(DType::F32, &[2, 8, 16])
            ),
            Ok(())
        );
        let bad_kv = t(DType::F16, &[2, 3, 32, 64]);
        let err = attention(&q, &bad_kv, &bad_kv, &q, &t(DType::F32, &[2, 8, 16])).unwrap_err();
        assert!(
            err.to_string().contains("heads_kv dividing q's 8 heads"),
            "{err}"
        );
    }

    #[test]
    fn training_ops() {
        let w = t(DType::F32, &[10, 4]);
        assert_eq!(
            embedding(
                "embedding",
                ("weight", &w),
                &t(DType::I64, &[2, 3]),
                ("out", &t(DType::F32, &[2, 3, 4]))
            ),
            Ok(())
        );
        let err = embedding(
            "embedding",
            ("weight", &w),
            &t(DType::F32, &[2, 3]),
            ("out", &t(DType::F32, &[2, 3, 4])),
        )
        .unwrap_err();
        assert!(err.to_string().contains("indices has dtype f32"), "{err}");
        assert_eq!(
            cross_entropy(
                &t(DType::BF16, &[4, 10]),
                &t(DType::I32, &[4]),
                &t(DType::F32, &[])
            ),
            Ok(())
        );
        let p = t(DType::BF16, &[3]);
        let m = t(DType::F32, &[3]);
        assert!(
            adamw(&p, &p, &m, &m, 0)
                .unwrap_err()
                .to_string()
                .contains("step is 0")
        );
        assert_eq!(
            linear(
                &t(DType::F32, &[2, 5, 4]),
                &w,
                Some(&t(DType::F32, &[10])),
                &t(DType::F32, &[2, 5, 10])
            ),
            Ok(())
        );
        assert_eq!(
            rope(
                "rope",
                &t(DType::F32, &[1, 6, 2, 8]),
                &t(DType::F32, &[6, 4]),
                &t(DType::F32, &[6, 4]),
                &t(DType::F32, &[1, 6, 2, 8])
            ),
            Ok(())
        );
    }
}

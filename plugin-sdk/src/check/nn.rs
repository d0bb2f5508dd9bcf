//! Argument rules of the elementwise, reduction, linear and softmax-family
//! operators added in ABI 1.1, and the helpers every 1.1 rule shares (the
//! layer operators are in `layers.rs`, the training-step ones in
//! `training.rs`). Floating tensors of 1.1 operators are f32, f16 or bf16;
//! statistics are f32; indices are i32 or i64.

use super::{ArgError, Checked, same_dtype, shape_is, writable};
use crate::dtype::DType;
use crate::tensor::{Shape, TensorDesc};

const LOW: &str = "f32, f16 and bf16";

pub(super) fn low(op: &'static str, tensor: &'static str, t: &TensorDesc) -> Checked {
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

pub(super) fn f32_only(op: &'static str, tensor: &'static str, t: &TensorDesc) -> Checked {
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

pub(super) fn index(op: &'static str, tensor: &'static str, t: &TensorDesc) -> Checked {
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

pub(super) fn rank(
    op: &'static str,
    tensor: &'static str,
    t: &TensorDesc,
    min: usize,
    what: &str,
) -> Checked {
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

pub(super) fn exact_rank(
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
pub(super) fn like(
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
pub(super) fn rows<'a>(t: &TensorDesc<'a>) -> &'a [i64] {
    &t.shape[..t.ndim().saturating_sub(1)]
}

pub(super) fn last(t: &TensorDesc) -> i64 {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::*;
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

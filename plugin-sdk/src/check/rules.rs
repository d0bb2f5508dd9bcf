//! The argument rules that are particular to one args struct: what the
//! generic rules of `spec/ops.toml` cannot say. One function per args
//! struct whose spec entry has a `rule`, named like the struct in snake
//! case, in the spec's order; each runs after the generic dtype, rank and
//! shape rules have passed (so ranks are already right) and before the
//! check that outputs do not overlap themselves.

use super::{ArgError, Checked, broadcast_shapes, shape_is};
use crate::DType;
use crate::ops::{
    AdamwArgs, AttentionArgs, AttentionBackwardArgs, BinaryArgs, CrossEntropyArgs,
    CrossEntropyBackwardArgs, EmbeddingArgs, EmbeddingBackwardArgs, GatherArgs, LinearArgs,
    MatmulArgs, Op, ReduceArgs, ReduceBoolArgs, RopeArgs, ScatterAddArgs,
};
use crate::tensor::{Shape, TensorDesc};

/// `add`, `sub`, `mul`, `div`: for i32 and i64 (ABI 1.3), `alpha` is an
/// integer of at most 2^53 in magnitude (every such integer is an exact
/// f64).
pub fn binary(op: Op, args: &BinaryArgs) -> Checked {
    let integer = matches!(args.a.dtype, DType::I32 | DType::I64);
    let alpha = args.alpha;
    if !integer || (alpha.fract() == 0.0 && alpha.abs() <= 9_007_199_254_740_992.0) {
        return Ok(());
    }
    Err(ArgError::Invalid {
        op: op.name(),
        message: format!(
            "alpha {alpha} must be an integer of at most 2^53 in magnitude for {} tensors",
            args.a.dtype
        ),
    })
}

/// The dimensions of a matmul: batch shape of `out`, and M, K, N.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatmulDims {
    /// Batch dimensions (those before the last two) of `out`.
    pub batch: Vec<i64>,
    /// Rows of `op(a)` and `out`.
    pub m: i64,
    /// Columns of `op(a)`, rows of `op(b)`.
    pub k: i64,
    /// Columns of `op(b)` and `out`.
    pub n: i64,
}

/// The dimensions of `op(a) @ op(b)` for matrices of rank >= 2: inner
/// dimensions equal, batch dimensions broadcasting.
pub fn matmul_dims(
    a: &TensorDesc,
    b: &TensorDesc,
    trans_a: bool,
    trans_b: bool,
) -> Result<MatmulDims, ArgError> {
    const OP: &str = "matmul";
    let last2 = |t: &TensorDesc, trans: bool| {
        let (r, c) = (t.shape[t.ndim() - 2], t.shape[t.ndim() - 1]);
        if trans { (c, r) } else { (r, c) }
    };
    let (m, k) = last2(a, trans_a);
    let (kb, n) = last2(b, trans_b);
    if k != kb {
        return Err(ArgError::ShapeMismatch {
            op: OP,
            tensor: "b",
            actual: Shape::from(b.shape),
            expected: format!(
                "its inner dimension {kb} differs from a's {k} (a has shape {}, transpose_a {trans_a}, transpose_b {trans_b})",
                Shape::from(a.shape)
            ),
        });
    }
    let batch_a = &a.shape[..a.ndim() - 2];
    let batch_b = &b.shape[..b.ndim() - 2];
    let Some(batch) = broadcast_shapes(batch_a, batch_b) else {
        return Err(ArgError::ShapeMismatch {
            op: OP,
            tensor: "b",
            actual: Shape::from(b.shape),
            expected: format!(
                "its batch dimensions do not broadcast with a's shape {}",
                Shape::from(a.shape)
            ),
        });
    };
    Ok(MatmulDims { batch, m, k, n })
}

/// `matmul`: `op(a)`'s K equals `op(b)`'s, the batch dimensions broadcast,
/// and `out` is `[batch..., M, N]`.
pub fn matmul(op: Op, args: &MatmulArgs) -> Checked {
    let dims = matmul_dims(&args.a, &args.b, args.transpose_a, args.transpose_b)?;
    let mut expected = dims.batch;
    expected.extend([dims.m, dims.n]);
    shape_is(op.name(), "out", &args.out, &expected, "it must be")
}

/// `linear`: `weight`'s K equals `input`'s last dimension, `bias` is `[N]`
/// and `out` is `[..., N]`.
pub fn linear(op: Op, args: &LinearArgs) -> Checked {
    let (input, weight) = (&args.input, &args.weight);
    let (n, k) = (weight.shape[0], weight.shape[1]);
    let last = input.shape[input.ndim() - 1];
    if k != last {
        return Err(ArgError::ShapeMismatch {
            op: op.name(),
            tensor: "weight",
            actual: Shape::from(weight.shape),
            expected: format!(
                "its K {k} differs from input's last dimension {last} (input has shape {})",
                Shape::from(input.shape)
            ),
        });
    }
    if let Some(bias) = &args.bias {
        shape_is(op.name(), "bias", bias, &[n], "it must be [N] =")?;
    }
    let mut expected = input.shape[..input.ndim() - 1].to_vec();
    expected.push(n);
    shape_is(op.name(), "out", &args.out, &expected, "it must be")
}

/// `sum`, `mean`, `max`, `argmax`: `out` is `input`'s shape without
/// dimension `dim`, or with it set to 1 under `keepdim`.
pub fn reduce(op: Op, args: &ReduceArgs) -> Checked {
    reduced(op, &args.input, &args.out, args.dim, args.keepdim)
}

/// `out` is `input`'s shape without dimension `dim`, or with it set to 1
/// under `keepdim`.
fn reduced(op: Op, input: &TensorDesc, out: &TensorDesc, dim: usize, keepdim: bool) -> Checked {
    let mut expected = input.shape.to_vec();
    if keepdim {
        expected[dim] = 1;
    } else {
        expected.remove(dim);
    }
    let why = if keepdim {
        "it must be input's shape with dimension dim set to 1:"
    } else {
        "it must be input's shape without dimension dim:"
    };
    shape_is(op.name(), "out", out, &expected, why)
}

/// `any` and `all`: as [`reduce`].
pub fn reduce_bool(op: Op, args: &ReduceBoolArgs) -> Checked {
    reduced(op, &args.input, &args.out, args.dim, args.keepdim)
}

/// The index of `gather` and `scatter_add` against the tensor it indexes
/// (`of`): the same rank, and each extent but `dim`'s at most `of`'s.
fn index_within(op: Op, of: (&str, &TensorDesc), index: &TensorDesc, dim: usize) -> Checked {
    let (name, t) = of;
    let fits = index.ndim() == t.ndim()
        && index
            .shape
            .iter()
            .zip(t.shape)
            .enumerate()
            .all(|(d, (&i, &n))| d == dim || i <= n);
    if fits {
        return Ok(());
    }
    Err(ArgError::ShapeMismatch {
        op: op.name(),
        tensor: "index",
        actual: Shape::from(index.shape),
        expected: format!(
            "it must have {name}'s rank {} and no extent but dimension {dim}'s larger than {name}'s shape {}",
            t.ndim(),
            Shape::from(t.shape)
        ),
    })
}

/// `gather`: `index` has `input`'s rank, each extent but `dim`'s at most
/// `input`'s.
pub fn gather(op: Op, args: &GatherArgs) -> Checked {
    index_within(op, ("input", &args.input), &args.index, args.dim)
}

/// `scatter_add`: `index` has `dst`'s rank, each extent but `dim`'s at
/// most `dst`'s.
pub fn scatter_add(op: Op, args: &ScatterAddArgs) -> Checked {
    index_within(op, ("dst", &args.dst), &args.index, args.dim)
}

/// `rope` and `rope_backward`: `head_dim` is even and `cos` and `sin` are
/// `[seq, head_dim / 2]`.
pub fn rope(op: Op, args: &RopeArgs) -> Checked {
    let input = &args.input;
    let (s, d) = (input.shape[1], input.shape[3]);
    if d % 2 != 0 {
        return Err(ArgError::ShapeMismatch {
            op: op.name(),
            tensor: "input",
            actual: Shape::from(input.shape),
            expected: format!("its head_dim {d} must be even"),
        });
    }
    for (name, t) in [("cos", &args.cos), ("sin", &args.sin)] {
        shape_is(
            op.name(),
            name,
            t,
            &[s, d / 2],
            "it must be [seq, head_dim / 2] =",
        )?;
    }
    Ok(())
}

/// Attention's `k` against `q` (`[batch, heads_kv, seq_kv, D]` with
/// `heads_kv` dividing `q`'s heads), and `lse` `[batch, heads_q, seq_q]`.
fn attention_dims(op: Op, q: &TensorDesc, k: &TensorDesc, lse: &TensorDesc) -> Checked {
    let [b, hq, sq, d] = [q.shape[0], q.shape[1], q.shape[2], q.shape[3]];
    let [bk, hkv, _, dk] = [k.shape[0], k.shape[1], k.shape[2], k.shape[3]];
    if bk != b || dk != d || hkv == 0 || hq % hkv != 0 {
        return Err(ArgError::ShapeMismatch {
            op: op.name(),
            tensor: "k",
            actual: Shape::from(k.shape),
            expected: format!(
                "it must be [{b}, heads_kv, seq_kv, {d}] with heads_kv dividing q's {hq} heads (q has shape {})",
                Shape::from(q.shape)
            ),
        });
    }
    shape_is(
        op.name(),
        "lse",
        lse,
        &[b, hq, sq],
        "it must be [batch, heads_q, seq_q] =",
    )
}

/// `attention`: see [`attention_dims`].
pub fn attention(op: Op, args: &AttentionArgs) -> Checked {
    attention_dims(op, &args.q, &args.k, &args.lse)
}

/// `attention_backward`: as for `attention`.
pub fn attention_backward(op: Op, args: &AttentionBackwardArgs) -> Checked {
    attention_dims(op, &args.q, &args.k, &args.lse)
}

/// `rows` (named `name`) is `indices`' shape followed by `table`'s H.
fn embedding_rows(
    op: Op,
    table: &TensorDesc,
    indices: &TensorDesc,
    name: &'static str,
    rows: &TensorDesc,
) -> Checked {
    let mut expected = indices.shape.to_vec();
    expected.push(table.shape[1]);
    shape_is(
        op.name(),
        name,
        rows,
        &expected,
        "it must be indices' shape followed by H:",
    )
}

/// `embedding`: `out` is `indices`' shape followed by `H`.
pub fn embedding(op: Op, args: &EmbeddingArgs) -> Checked {
    embedding_rows(op, &args.weight, &args.indices, "out", &args.out)
}

/// `embedding_backward`: `grad_out` is `indices`' shape followed by `H`.
pub fn embedding_backward(op: Op, args: &EmbeddingBackwardArgs) -> Checked {
    embedding_rows(
        op,
        &args.grad_weight,
        &args.indices,
        "grad_out",
        &args.grad_out,
    )
}

/// `targets` is `[N]` for `logits` `[N, C]`.
fn targets(op: Op, logits: &TensorDesc, targets: &TensorDesc) -> Checked {
    shape_is(
        op.name(),
        "targets",
        targets,
        &logits.shape[..1],
        "it must be [N] =",
    )
}

/// `cross_entropy`: `targets` is `[N]`.
pub fn cross_entropy(op: Op, args: &CrossEntropyArgs) -> Checked {
    targets(op, &args.logits, &args.targets)
}

/// `cross_entropy_backward`: `targets` is `[N]`.
pub fn cross_entropy_backward(op: Op, args: &CrossEntropyBackwardArgs) -> Checked {
    targets(op, &args.logits, &args.targets)
}

/// `adamw`: `step` is at least 1 (bias correction divides by `1 - beta^step`).
pub fn adamw(op: Op, args: &AdamwArgs) -> Checked {
    if args.step < 1 {
        return Err(ArgError::Invalid {
            op: op.name(),
            message: format!(
                "step is {}; bias correction needs a step of at least 1",
                args.step
            ),
        });
    }
    // As torch.optim.AdamW takes them: a beta of 1 divides the bias
    // correction by zero (every weight became NaN, silently).
    let invalid = |message: String| {
        Err(ArgError::Invalid {
            op: op.name(),
            message,
        })
    };
    for (name, beta) in [("beta1", args.beta1), ("beta2", args.beta2)] {
        if !(0.0..1.0).contains(&beta) {
            return invalid(format!(
                "{name} is {beta}; it must be at least 0 and below 1 (at 1 the bias correction \
                 divides by zero)"
            ));
        }
    }
    for (name, value) in [
        ("lr", args.lr),
        ("eps", args.eps),
        ("weight_decay", args.weight_decay),
    ] {
        if !(value.is_finite() && value >= 0.0) {
            return invalid(format!(
                "{name} is {value}; it must be finite and at least 0"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::error::ErrorCode;
    use crate::ops::*;

    /// A tensor at an address of its own (never read: the checks only
    /// compare addresses), 4 GiB from the last one.
    fn t(dtype: DType, shape: &[i64]) -> TensorDesc<'_> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(1 << 40);
        let at = NEXT.fetch_add(1 << 32, Ordering::Relaxed);
        TensorDesc::new(at as *mut u8, dtype, shape, None)
    }

    fn f32s(shape: &[i64]) -> TensorDesc<'_> {
        t(DType::F32, shape)
    }

    #[test]
    fn binary_names_the_op_and_shapes() {
        let err =
            BinaryArgs::new(Op::Add, f32s(&[2, 3]), f32s(&[4]), f32s(&[2, 3]), 1.0).unwrap_err();
        assert_eq!(err.code(), ErrorCode::ShapeMismatch);
        assert_eq!(
            err.to_string(),
            "add: b has shape [4], but it does not broadcast with a's shape [2, 3]"
        );
        let err = BinaryArgs::new(Op::Mul, f32s(&[2]), t(DType::BF16, &[2]), f32s(&[2]), 1.0)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "mul: a is f32 but b is bf16; they must have the same dtype"
        );
        let i = t(DType::I32, &[2]);
        let err = BinaryArgs::new(Op::Div, i, i, i, 1.0).unwrap_err();
        assert_eq!(err.code(), ErrorCode::DTypeMismatch);
        let err =
            BinaryArgs::new(Op::Add, f32s(&[2, 3]), f32s(&[3]), f32s(&[1, 3]), 1.0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "add: out has shape [1, 3], but it must equal the broadcast shape of a and b [2, 3]"
        );
    }

    #[test]
    fn matmul_dims_and_errors() {
        let (a, b) = (f32s(&[5, 3, 4]), f32s(&[6, 4]));
        let dims = matmul_dims(&a, &b, false, true).unwrap();
        assert_eq!(
            dims,
            MatmulDims {
                batch: vec![5],
                m: 3,
                k: 4,
                n: 6
            }
        );
        assert!(MatmulArgs::new(Op::Matmul, a, b, f32s(&[5, 3, 6]), 1.0, 0.0, false, true).is_ok());
        let err =
            MatmulArgs::new(Op::Matmul, a, b, f32s(&[5, 3, 4]), 1.0, 0.0, false, true).unwrap_err();
        assert_eq!(
            err.to_string(),
            "matmul: out has shape [5, 3, 4], but it must be [5, 3, 6]"
        );
        let err = MatmulArgs::new(
            Op::Matmul,
            f32s(&[4]),
            b,
            f32s(&[5, 3, 6]),
            1.0,
            0.0,
            false,
            true,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "matmul: a has shape [4], but matmul needs at least 2 dimensions"
        );
    }

    #[test]
    fn matmul_inner_mismatch() {
        let err = MatmulArgs::new(
            Op::Matmul,
            f32s(&[3, 4]),
            f32s(&[5, 6]),
            f32s(&[3, 6]),
            1.0,
            0.0,
            false,
            false,
        )
        .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ShapeMismatch);
        assert!(
            err.to_string()
                .contains("inner dimension 5 differs from a's 4"),
            "{err}"
        );
    }

    #[test]
    fn outputs_must_not_self_overlap() {
        let out = |shape: &'static [i64], strides: &'static [i64]| {
            TensorDesc::new(std::ptr::null_mut(), DType::F32, shape, Some(strides))
        };
        let fill = |t| FillArgs::new(Op::Fill, t, 0.0).map(|_| ());
        assert_eq!(
            fill(out(&[4], &[0])).unwrap_err().code(),
            ErrorCode::InvalidArgument
        );
        assert!(
            fill(out(&[2, 2], &[1, 1])).is_err(),
            "strides [1, 1] write element 1 twice"
        );
        let err = fill(out(&[3, 2], &[1, 2])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "fill: output out with shape [3, 2] and strides [1, 2] writes some elements more than once; outputs must not overlap themselves"
        );
        assert!(
            fill(out(&[2, 3], &[1, 2])).is_ok(),
            "a transposed compact view"
        );
        assert!(fill(out(&[2, 3], &[-3, 1])).is_ok(), "a flipped view");
        assert!(
            fill(out(&[1, 5], &[0, 1])).is_ok(),
            "size-1 dimensions may have any stride"
        );
        assert!(fill(out(&[4, 2], &[10, 3])).is_ok(), "a sparse view");
    }

    #[test]
    fn reduce_normalises_dim_and_checks_out() {
        let x = f32s(&[2, 3, 4]);
        let dim = |op, out, dim, keepdim| ReduceArgs::new(op, x, out, dim, keepdim).map(|a| a.dim);
        assert_eq!(dim(Op::Sum, f32s(&[2, 4]), -2, false), Ok(1));
        assert_eq!(dim(Op::Max, f32s(&[2, 1, 4]), 1, true), Ok(1));
        assert_eq!(dim(Op::Argmax, t(DType::I64, &[2, 3]), 2, false), Ok(2));
        let err = dim(Op::Argmax, t(DType::I32, &[2, 3]), 2, false).unwrap_err();
        assert_eq!(err.code(), ErrorCode::DTypeMismatch);
        let err = dim(Op::Mean, f32s(&[2, 3]), 3, false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "mean: dim 3 is out of range for input of shape [2, 3, 4]"
        );
        let err = dim(Op::Sum, t(DType::I64, &[2, 3]), 2, false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "sum: input is f32 but out is i64; they must have the same dtype"
        );
    }

    #[test]
    fn norms_name_the_wrong_parameter() {
        let x = t(DType::BF16, &[5, 8]);
        let rms = |weight, inv_rms| {
            RmsNormArgs::new(
                Op::RmsNorm,
                x,
                weight,
                t(DType::BF16, &[5, 8]),
                inv_rms,
                1e-6,
            )
            .map(|_| ())
        };
        assert_eq!(rms(t(DType::BF16, &[8]), f32s(&[5])), Ok(()));
        let err = rms(t(DType::BF16, &[7]), f32s(&[5])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "rms_norm: weight has shape [7], but it must be [H] where H is input's last dimension: [8]"
        );
        let err = rms(t(DType::BF16, &[8]), t(DType::BF16, &[5])).unwrap_err();
        assert_eq!(err.code(), ErrorCode::DTypeMismatch);
        let err = RmsNormArgs::new(
            Op::RmsNorm,
            t(DType::F64, &[5, 8]),
            t(DType::F64, &[8]),
            t(DType::F64, &[5, 8]),
            f32s(&[5]),
            1e-6,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "rms_norm: input has dtype f64, but rms_norm accepts only f32, f16 and bf16"
        );
        let err = rms(t(DType::BF16, &[8]), f32s(&[8])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "rms_norm: inv_rms has shape [8], but it must be input's shape without its last dimension: [5]"
        );
    }

    #[test]
    fn attention_checks_grouped_heads() {
        let q = t(DType::F16, &[2, 8, 16, 64]);
        let kv = t(DType::F16, &[2, 2, 32, 64]);
        let lse = f32s(&[2, 8, 16]);
        let out = t(DType::F16, &[2, 8, 16, 64]);
        assert!(AttentionArgs::new(Op::Attention, q, kv, kv, out, lse, 0.125, true).is_ok());
        let bad_kv = t(DType::F16, &[2, 3, 32, 64]);
        let err = AttentionArgs::new(Op::Attention, q, bad_kv, bad_kv, out, lse, 0.125, true)
            .unwrap_err();
        assert!(
            err.to_string().contains("heads_kv dividing q's 8 heads"),
            "{err}"
        );
    }

    #[test]
    fn training_ops() {
        let w = f32s(&[10, 4]);
        let ids = t(DType::I64, &[2, 3]);
        assert!(EmbeddingArgs::new(Op::Embedding, w, ids, f32s(&[2, 3, 4])).is_ok());
        let err =
            EmbeddingArgs::new(Op::Embedding, w, f32s(&[2, 3]), f32s(&[2, 3, 4])).unwrap_err();
        assert!(err.to_string().contains("indices has dtype f32"), "{err}");
        let err = EmbeddingArgs::new(Op::Embedding, w, ids, f32s(&[2, 4])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "embedding: out has shape [2, 4], but it must be indices' shape followed by H: [2, 3, 4]"
        );
        assert!(
            CrossEntropyArgs::new(
                Op::CrossEntropy,
                t(DType::BF16, &[4, 10]),
                t(DType::I32, &[4]),
                f32s(&[]),
                -100
            )
            .is_ok()
        );
        let (p, g) = (t(DType::BF16, &[3]), t(DType::BF16, &[3]));
        let (m, v) = (f32s(&[3]), f32s(&[3]));
        let adamw = |step| AdamwArgs::new(Op::Adamw, p, g, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.0, step);
        assert!(adamw(0).unwrap_err().to_string().contains("step is 0"));
        assert!(adamw(1).is_ok());
        let with = |beta1, beta2, lr, eps| {
            AdamwArgs::new(Op::Adamw, p, g, m, v, lr, beta1, beta2, eps, 0.0, 1)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert!(
            with(1.0, 0.999, 1e-3, 1e-8)
                .unwrap_err()
                .contains("beta1 is 1; it must be")
        );
        assert!(
            with(0.9, -0.1, 1e-3, 1e-8)
                .unwrap_err()
                .contains("beta2 is -0.1")
        );
        assert!(
            with(0.9, 0.999, f64::NAN, 1e-8)
                .unwrap_err()
                .contains("lr is NaN")
        );
        assert!(
            with(0.9, 0.999, 1e-3, -1.0)
                .unwrap_err()
                .contains("eps is -1")
        );
        assert!(with(0.0, 0.0, 0.0, 0.0).is_ok());
        let linear = |bias, out| LinearArgs::new(Op::Linear, f32s(&[2, 5, 4]), w, bias, out);
        assert!(linear(Some(f32s(&[10])), f32s(&[2, 5, 10])).is_ok());
        assert!(linear(None, f32s(&[2, 5, 10])).is_ok());
        let err = linear(Some(f32s(&[4])), f32s(&[2, 5, 10])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "linear: bias has shape [4], but it must be [N] = [10]"
        );
        let cos = f32s(&[6, 4]);
        assert!(
            RopeArgs::new(
                Op::Rope,
                f32s(&[1, 6, 2, 8]),
                cos,
                cos,
                f32s(&[1, 6, 2, 8]),
                false
            )
            .is_ok()
        );
        let err = RopeArgs::new(
            Op::Rope,
            f32s(&[1, 6, 2, 7]),
            cos,
            cos,
            f32s(&[1, 6, 2, 7]),
            false,
        )
        .unwrap_err();
        assert!(err.to_string().contains("head_dim 7 must be even"), "{err}");
    }

    /// A view at `offset` elements into a buffer at a fixed address.
    fn at<'a>(offset: usize, shape: &'a [i64], strides: &'a [i64]) -> TensorDesc<'a> {
        TensorDesc::new(
            (0x1000_0000 + 4 * offset) as *mut u8,
            DType::F32,
            shape,
            Some(strides),
        )
    }

    #[test]
    fn sharing_is_exact_for_interleaved_and_shifted_views() {
        use crate::check::{Sharing, sharing};
        let same = at(0, &[3, 3], &[3, 1]);
        assert_eq!(sharing(&same, &at(0, &[3, 3], &[3, 1])), Sharing::Same);
        // The transpose of the same memory, a shifted and a strided view.
        assert_eq!(sharing(&same, &at(0, &[3, 3], &[1, 3])), Sharing::Overlap);
        assert_eq!(
            sharing(&at(0, &[4], &[2]), &at(2, &[4], &[2])),
            Sharing::Overlap
        );
        // Even against odd elements, and two halves of each row: apart.
        assert_eq!(
            sharing(&at(0, &[5], &[2]), &at(1, &[5], &[2])),
            Sharing::Apart
        );
        assert_eq!(
            sharing(&at(0, &[64, 32], &[64, 1]), &at(32, &[64, 32], &[64, 1])),
            Sharing::Apart
        );
        // Columns 0..4 against column 4 of the same rows (another shape),
        // and against columns 3..5 (one shared column).
        assert_eq!(
            sharing(&at(0, &[1000, 4], &[8, 1]), &at(4, &[1000, 1], &[8, 1])),
            Sharing::Apart
        );
        assert_eq!(
            sharing(&at(0, &[1000, 4], &[8, 1]), &at(3, &[1000, 2], &[8, 1])),
            Sharing::Overlap
        );
        // A flipped view, an empty one, and a broadcast element inside.
        assert_eq!(
            sharing(&at(0, &[4], &[1]), &at(3, &[4], &[-1])),
            Sharing::Overlap
        );
        assert_eq!(
            sharing(&at(0, &[4], &[1]), &at(1, &[0], &[1])),
            Sharing::Apart
        );
        assert_eq!(
            sharing(&at(0, &[4], &[2]), &at(6, &[7], &[0])),
            Sharing::Overlap
        );
        assert_eq!(
            sharing(&at(0, &[4], &[2]), &at(5, &[7], &[0])),
            Sharing::Apart
        );
        // Bytes, not elements: an f64 view straddles two f32 elements.
        let wide = TensorDesc::new(0x1000_0004 as *mut u8, DType::F64, &[2], Some(&[2]));
        assert_eq!(sharing(&at(0, &[2], &[4]), &wide), Sharing::Apart);
        assert_eq!(sharing(&at(2, &[2], &[4]), &wide), Sharing::Overlap);
    }

    #[test]
    fn outputs_share_memory_with_inputs_only_in_place() {
        let x = at(0, &[4], &[1]);
        // In place where the spec allows it; a copy onto itself it does not.
        assert!(BinaryArgs::new(Op::Add, x, f32s(&[4]), x, 1.0).is_ok());
        let err = CopyArgs::new(Op::Copy, x, x).unwrap_err().to_string();
        assert!(
            err.contains("output dst is input src, and copy does not write dst in place"),
            "{err}"
        );
        let err = CopyArgs::new(Op::Copy, at(2, &[4], &[2]), at(0, &[4], &[2]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("output dst (shape [4] and strides [2]) overlaps input src (shape [4] and strides [2]) in part"),
            "{err}"
        );
        assert!(CopyArgs::new(Op::Copy, at(1, &[5], &[2]), at(0, &[5], &[2])).is_ok());
        // The optimizer's state: two moments in one tensor are refused.
        let (p, g) = (f32s(&[4]), f32s(&[4]));
        let err = AdamwArgs::new(Op::Adamw, p, g, x, x, 0.1, 0.9, 0.99, 1e-8, 0.0, 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("outputs exp_avg"), "{err}");
        assert!(err.contains("and exp_avg_sq"), "{err}");
        let err = AdamwArgs::new(
            Op::Adamw,
            p,
            x,
            at(0, &[4], &[1]),
            f32s(&[4]),
            0.1,
            0.9,
            0.99,
            1e-8,
            0.0,
            1,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("output exp_avg is input grad"), "{err}");
        // A matmul writing into one of its operands.
        let a = at(0, &[2, 2], &[2, 1]);
        let err = MatmulArgs::new(Op::Matmul, a, f32s(&[2, 2]), a, 1.0, 0.0, false, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("matmul does not write out in place of a"),
            "{err}"
        );
    }
}

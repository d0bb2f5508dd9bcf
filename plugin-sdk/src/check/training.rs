//! Argument rules of the ABI 1.1 operators around the layers of a
//! training step: embedding, cross-entropy, AdamW and scale.

use super::nn::{exact_rank, f32_only, index, like, low};
use super::{ArgError, Checked, same_dtype, shape_is, writable};
use crate::tensor::TensorDesc;

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

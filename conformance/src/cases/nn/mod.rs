//! Cases of the ABI 1.1 layer operators: softmax's relatives, RMSNorm,
//! LayerNorm, rotary embeddings and attention, forward and backward.
//!
//! The backward operators get inputs that the forward pass could have
//! produced: the reference forward of random inputs, rounded to the dtype the
//! plugin would have stored them in (the case dtype for outputs, f32 for
//! statistics), so that the saved tensors are consistent with the others.

mod attention;
mod norm;
mod rope;
mod softmax;

pub(crate) use norm::{layer_norm_backward_case, layer_norm_case, rms_norm_case};
pub(crate) use rope::rope_tables;
pub(crate) use softmax::backward_case as softmax_backward_case;
pub(crate) use softmax::log_softmax_case;

use attention::*;
use norm::*;
use rope::*;
use softmax::*;

use polychip_host::{DType, Op};

use super::{Rng, case, input, numel, output, shape_label};
use crate::case::{Case, Layout, TensorSpec};
use crate::reference::{self, Dense};
use crate::tolerance::{Bias, Tolerance};
use crate::values::round_to;

pub(super) const C: Layout = Layout::Contiguous;
pub(super) const T: Layout = Layout::Transposed;
pub(super) const S: Layout = Layout::Strided;
/// The first two dims swapped in memory: with three dims or more, rows that
/// are not evenly spaced (see [`Layout::Permuted`]).
pub(super) const P: Layout = Layout::Permuted;

/// The case generator of each operator of this family.
pub(super) fn cases(op: Op) -> Option<fn(DType) -> Vec<Case>> {
    Some(match op {
        Op::SoftmaxBackward => softmax_backward_cases,
        Op::LogSoftmax => log_softmax_cases,
        Op::LogSoftmaxBackward => log_softmax_backward_cases,
        Op::RmsNorm => rms_norm_cases,
        Op::RmsNormBackward => rms_norm_backward_cases,
        Op::LayerNorm => layer_norm_cases,
        Op::LayerNormBackward => layer_norm_backward_cases,
        Op::Rope => rope_cases,
        Op::RopeBackward => rope_backward_cases,
        Op::Attention => attention_cases,
        Op::AttentionBackward => attention_backward_cases,
        _ => return None,
    })
}

/// `[3, 7] out transposed grad_in strided`: the shape, then every tensor
/// that is not contiguous.
pub(super) fn label(shape: &[usize], layouts: &[(&str, Layout)]) -> String {
    let mut s = shape_label(shape, C);
    for (name, layout) in layouts {
        if *layout != C {
            s.push_str(&format!(" {name} {layout}"));
        }
    }
    s
}

/// The values of `d` rounded to `dtype`, as a plugin would have stored them.
pub(super) fn stored(dtype: DType, d: &Dense) -> Vec<f64> {
    d.data.iter().map(|&v| round_to(dtype, v)).collect()
}

/// The last extent (the row length of the row-wise operators).
pub(super) fn last(shape: &[usize]) -> usize {
    shape.last().copied().unwrap_or(1)
}

/// The number of rows (product of the leading extents).
pub(super) fn rows(shape: &[usize]) -> usize {
    numel(&shape[..shape.len().saturating_sub(1)])
}

// ---------------------------------------------------------------------------
// Softmax's relatives.

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn ops_are_in_op_table_order_and_cases_are_deterministic() {
        let ops: Vec<Op> = Op::ALL
            .into_iter()
            .filter(|&op| cases(op).is_some())
            .collect();
        let names: Vec<&str> = ops.iter().map(|o| o.name()).collect();
        assert_eq!(
            names,
            [
                "softmax_backward",
                "log_softmax",
                "log_softmax_backward",
                "rms_norm",
                "rms_norm_backward",
                "layer_norm",
                "layer_norm_backward",
                "rope",
                "rope_backward",
                "attention",
                "attention_backward",
            ]
        );
        for op in ops {
            let generate = cases(op).unwrap();
            let (a, b) = (generate(DType::BF16), generate(DType::BF16));
            for (x, y) in a.iter().zip(&b) {
                let values = |c: &Case| -> Vec<Vec<u64>> {
                    c.tensors
                        .iter()
                        .map(|t| t.values.iter().map(|v| v.to_bits()).collect())
                        .collect()
                };
                assert_eq!((&x.label, values(x)), (&y.label, values(y)));
            }
        }
    }

    #[test]
    fn attention_cases_stay_small_and_cover_queries_that_see_no_key() {
        // The work is sq x skv x d: long key sequences come with few
        // queries.
        for p in ATTENTION_PLANS {
            assert!(p.sq * p.skv <= 48 * 48 && p.d <= 32, "{}", p.label);
        }
        let c = attention_cases(DType::F32);
        let hidden = c
            .iter()
            .find(|c| c.label.contains("see no key"))
            .expect("the case");
        let dense: Vec<Dense> = hidden.tensors.iter().map(TensorSpec::dense).collect();
        let out = (hidden.reference)(&dense).unwrap();
        assert!(out[1].data.contains(&f64::NEG_INFINITY));
        // Scores of the large-score cases overflow exp in f32.
        let big = c
            .iter()
            .find(|c| c.label == "large scores")
            .expect("the case");
        let dense: Vec<Dense> = big.tensors.iter().map(TensorSpec::dense).collect();
        let lse = &(big.reference)(&dense).unwrap()[1];
        assert!(lse.data.iter().any(|&l| l > 89.0), "{lse:?}");
    }

    #[test]
    fn attention_special_cases_have_nan_rows_and_finite_ones() {
        for c in attention_cases(DType::F32) {
            if !SPECIAL_PLANS.iter().any(|p| p.label == c.label) {
                continue;
            }
            let dense: Vec<Dense> = c.tensors.iter().map(TensorSpec::dense).collect();
            let out = (c.reference)(&dense).unwrap();
            for t in &out {
                assert!(t.data.iter().any(|x| x.is_nan()), "{}", c.label);
                assert!(t.data.iter().any(|x| x.is_finite()), "{}", c.label);
            }
        }
    }
}

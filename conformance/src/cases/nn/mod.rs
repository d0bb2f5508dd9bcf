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

use attention::*;
use norm::*;
use rope::*;
use softmax::*;

use polychip_host::DType;

use super::{FLOATS3, OpInfo, Rng, case, input, numel, output, shape_label};
use crate::case::{Case, Layout, TensorSpec};
use crate::reference::{self, Dense};
use crate::tolerance::Tolerance;
use crate::values::round_to;

pub(super) const C: Layout = Layout::Contiguous;
pub(super) const T: Layout = Layout::Transposed;
pub(super) const S: Layout = Layout::Strided;

pub(super) fn ops() -> Vec<OpInfo> {
    vec![
        OpInfo {
            name: "softmax_backward",
            dtypes: FLOATS3,
            cases: softmax_backward_cases,
        },
        OpInfo {
            name: "log_softmax",
            dtypes: FLOATS3,
            cases: log_softmax_cases,
        },
        OpInfo {
            name: "log_softmax_backward",
            dtypes: FLOATS3,
            cases: log_softmax_backward_cases,
        },
        OpInfo {
            name: "rms_norm",
            dtypes: FLOATS3,
            cases: rms_norm_cases,
        },
        OpInfo {
            name: "rms_norm_backward",
            dtypes: FLOATS3,
            cases: rms_norm_backward_cases,
        },
        OpInfo {
            name: "layer_norm",
            dtypes: FLOATS3,
            cases: layer_norm_cases,
        },
        OpInfo {
            name: "layer_norm_backward",
            dtypes: FLOATS3,
            cases: layer_norm_backward_cases,
        },
        OpInfo {
            name: "rope",
            dtypes: FLOATS3,
            cases: rope_cases,
        },
        OpInfo {
            name: "rope_backward",
            dtypes: FLOATS3,
            cases: rope_backward_cases,
        },
        OpInfo {
            name: "attention",
            dtypes: FLOATS3,
            cases: attention_cases,
        },
        OpInfo {
            name: "attention_backward",
            dtypes: FLOATS3,
            cases: attention_backward_cases,
        },
    ]
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
    use std::collections::HashSet;

    use super::*;
    use crate::case::Role;

    /// Cases whose reference must fail (the plugin must refuse them).
    fn refused(label: &str) -> bool {
        label.contains("out of range") || label.contains("step 0")
    }

    #[test]
    fn every_case_is_well_formed_and_its_reference_runs() {
        for info in ops() {
            for &dtype in info.dtypes {
                let cases = (info.cases)(dtype);
                assert!(!cases.is_empty(), "{} {dtype}: no cases", info.name);
                let mut labels = HashSet::new();
                for c in &cases {
                    assert_eq!((c.op, c.dtype), (info.name, dtype), "{c:?}");
                    assert!(labels.insert(c.label.clone()), "{c:?}: duplicate label");
                    for t in &c.tensors {
                        assert_eq!(t.values.len(), numel(&t.shape), "{c:?} {}", t.name);
                        assert!(numel(&t.shape) <= 20_000, "{c:?} {} is too large", t.name);
                    }
                    let dense: Vec<Dense> = c.tensors.iter().map(TensorSpec::dense).collect();
                    match (c.reference)(&dense) {
                        Ok(out) => {
                            assert!(!refused(&c.label), "{c:?}: the reference accepts it");
                            let written: Vec<&TensorSpec> =
                                c.tensors.iter().filter(|t| t.role != Role::Input).collect();
                            assert_eq!(out.len(), written.len(), "{c:?}");
                            for (o, t) in out.iter().zip(written) {
                                assert_eq!(o.shape, t.shape, "{c:?} {}", t.name);
                            }
                        }
                        Err(e) => assert!(refused(&c.label), "{c:?}: {e}"),
                    }
                }
            }
        }
    }

    #[test]
    fn every_op_has_transposed_and_strided_tensors() {
        for info in ops() {
            let cases = (info.cases)(DType::F32);
            for layout in [Layout::Transposed, Layout::Strided] {
                let found = cases
                    .iter()
                    .flat_map(|c| &c.tensors)
                    .any(|t| t.layout == layout);
                assert!(found, "{}: no {layout} tensor", info.name);
            }
        }
    }

    #[test]
    fn ops_are_in_op_table_order_and_cases_are_deterministic() {
        let names: Vec<&str> = ops().iter().map(|o| o.name).collect();
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
        for info in ops() {
            let (a, b) = ((info.cases)(DType::BF16), (info.cases)(DType::BF16));
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
        for p in ATTENTION_PLANS {
            assert!(p.sq <= 48 && p.skv <= 48 && p.d <= 32, "{}", p.label);
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
}

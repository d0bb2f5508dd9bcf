//! Cases of the ABI 1.1 operators a training step needs around the layers:
//! linear, embedding and its backward, cross-entropy and its backward,
//! AdamW and scaling.
//!
//! Index tensors are `Dense` tensors of integers in the case (i32 in some
//! cases, i64 in others) and become [`Indices`] inside the reference
//! closures. An index out of range must be refused.

mod embedding;
mod linear;
mod loss;
mod optim;

pub(super) use embedding::embedding_call;
pub(super) use loss::cross_entropy_call;
pub(super) use optim::adamw_case;

use embedding::*;
use linear::*;
use loss::*;
use optim::*;

use polychip_host::{AdamwOptions, DType, Op};

use super::{Rng, case, inout, input, numel, output, shape_label, specials, subnormals};
use crate::case::{Case, Layout};
use crate::reference::{self, Dense, Indices};
use crate::tolerance::Tolerance;

pub(super) const C: Layout = Layout::Contiguous;
pub(super) const T: Layout = Layout::Transposed;
pub(super) const S: Layout = Layout::Strided;

/// The case generator of each operator of this family.
pub(super) fn cases(op: Op) -> Option<fn(DType) -> Vec<Case>> {
    Some(match op {
        Op::Linear => linear_cases,
        Op::Embedding => embedding_cases,
        Op::EmbeddingBackward => embedding_backward_cases,
        Op::CrossEntropy => cross_entropy_cases,
        Op::CrossEntropyBackward => cross_entropy_backward_cases,
        Op::Adamw => adamw_cases,
        Op::Scale => scale_cases,
        _ => return None,
    })
}

/// The integer values of an index tensor as the reference takes them.
pub(super) fn indices(d: &Dense) -> Indices {
    Indices::new(&d.shape, d.data.iter().map(|&v| v as i64).collect())
}

/// ` name layout` for every tensor that is not contiguous.
pub(super) fn layouts(layouts: &[(&str, Layout)]) -> String {
    let mut s = String::new();
    for (name, layout) in layouts {
        if *layout != C {
            s.push_str(&format!(" {name} {layout}"));
        }
    }
    s
}

/// The most times one index occurs in `idx`.
pub(super) fn max_repeats(idx: &[f64]) -> usize {
    let mut sorted: Vec<i64> = idx.iter().map(|&v| v as i64).collect();
    sorted.sort_unstable();
    sorted
        .chunk_by(|a, b| a == b)
        .map(<[i64]>::len)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::case::TensorSpec;

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
                "linear",
                "embedding",
                "embedding_backward",
                "cross_entropy",
                "cross_entropy_backward",
                "adamw",
                "scale",
            ]
        );
        for op in ops {
            let generate = cases(op).unwrap();
            let (a, b) = (generate(DType::F16), generate(DType::F16));
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
    fn index_cases_cover_both_index_dtypes_and_the_special_losses() {
        for cases in [
            embedding_cases(DType::F32),
            embedding_backward_cases(DType::F32),
            cross_entropy_cases(DType::F32),
            cross_entropy_backward_cases(DType::F32),
        ] {
            let index_dtypes: HashSet<DType> = cases
                .iter()
                .flat_map(|c| c.tensors.iter().map(|t| t.dtype))
                .filter(|d| matches!(d, DType::I32 | DType::I64))
                .collect();
            assert_eq!(index_dtypes.len(), 2);
        }
        let ce = cross_entropy_cases(DType::BF16);
        let all_ignored = ce
            .iter()
            .find(|c| c.label.starts_with("all rows ignored"))
            .unwrap();
        let dense: Vec<Dense> = all_ignored.tensors.iter().map(TensorSpec::dense).collect();
        assert!((all_ignored.reference)(&dense).unwrap()[0].data[0].is_nan());
        assert_eq!(max_repeats(&[3.0, 7.0, 3.0, 0.0, 3.0]), 3);
        assert_eq!(max_repeats(&[]), 0);
    }
}

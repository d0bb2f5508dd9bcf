//! The rules each v1 operator places on its tensors, checked in one place.
//!
//! The host runs these checks before it calls a plugin (so a framework gets a
//! typed error naming the op and shapes), and the Rust SDK runs them again on
//! the plugin's side of the boundary (so a plugin never trusts its caller).

mod layers;
mod nn;
mod training;

pub use layers::*;
pub use nn::*;
pub use training::*;

use crate::dtype::DType;
use crate::error::ErrorCode;
use crate::tensor::{Shape, TensorDesc};

/// Why an operator's arguments are not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    /// A pointer, size, rank or layout that cannot be used.
    #[error("{op}: {message}")]
    Invalid {
        /// The operator.
        op: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A dtype outside ABI v1's set.
    #[error(
        "{op}: {tensor} has a data type ABI v1 does not define (code {code}, bits {bits}, lanes {lanes})"
    )]
    UnknownDType {
        /// The operator.
        op: &'static str,
        /// The argument's name.
        tensor: &'static str,
        /// DLPack code.
        code: u8,
        /// Bits.
        bits: u8,
        /// Lanes.
        lanes: u16,
    },
    /// A dtype the operator does not accept.
    #[error("{op}: {tensor} has dtype {dtype}, but {op} accepts only {accepted}")]
    UnsupportedDType {
        /// The operator.
        op: &'static str,
        /// The argument's name.
        tensor: &'static str,
        /// Its dtype.
        dtype: DType,
        /// What the operator accepts.
        accepted: &'static str,
    },
    /// Two arguments that must share a dtype do not.
    #[error("{op}: {lhs} is {lhs_dtype} but {rhs} is {rhs_dtype}; they must have the same dtype")]
    DTypeMismatch {
        /// The operator.
        op: &'static str,
        /// First argument.
        lhs: &'static str,
        /// Its dtype.
        lhs_dtype: DType,
        /// Second argument.
        rhs: &'static str,
        /// Its dtype.
        rhs_dtype: DType,
    },
    /// An argument's shape does not fit.
    #[error("{op}: {tensor} has shape {actual}, but {expected}")]
    ShapeMismatch {
        /// The operator.
        op: &'static str,
        /// The argument's name.
        tensor: &'static str,
        /// Its shape.
        actual: Shape,
        /// What was expected, as a clause.
        expected: String,
    },
}

impl ArgError {
    /// The ABI code this error travels as.
    pub fn code(&self) -> ErrorCode {
        match self {
            ArgError::Invalid { .. } => ErrorCode::InvalidArgument,
            ArgError::UnknownDType { .. }
            | ArgError::UnsupportedDType { .. }
            | ArgError::DTypeMismatch { .. } => ErrorCode::DTypeMismatch,
            ArgError::ShapeMismatch { .. } => ErrorCode::ShapeMismatch,
        }
    }
}

pub(crate) type Checked = Result<(), ArgError>;

const FLOATS: &str = "f32, f16, bf16 and f64";

pub(crate) fn float(op: &'static str, tensor: &'static str, t: &TensorDesc) -> Checked {
    if t.dtype.is_float() {
        Ok(())
    } else {
        Err(ArgError::UnsupportedDType {
            op,
            tensor,
            dtype: t.dtype,
            accepted: FLOATS,
        })
    }
}

pub(crate) fn same_dtype(
    op: &'static str,
    lhs: (&'static str, &TensorDesc),
    rhs: (&'static str, &TensorDesc),
) -> Checked {
    if lhs.1.dtype == rhs.1.dtype {
        Ok(())
    } else {
        Err(ArgError::DTypeMismatch {
            op,
            lhs: lhs.0,
            lhs_dtype: lhs.1.dtype,
            rhs: rhs.0,
            rhs_dtype: rhs.1.dtype,
        })
    }
}

pub(crate) fn shape_is(
    op: &'static str,
    tensor: &'static str,
    t: &TensorDesc,
    expected: &[i64],
    why: &str,
) -> Checked {
    if t.shape == expected {
        Ok(())
    } else {
        Err(ArgError::ShapeMismatch {
            op,
            tensor,
            actual: Shape::from(t.shape),
            expected: format!("{why} {}", Shape::from(expected)),
        })
    }
}

/// An output must not write one element twice. The test is the usual
/// sufficient one: ordered by stride magnitude, each dimension's stride must
/// step over everything the smaller dimensions reach. Views it rejects that
/// do not overlap are exotic interleavings no framework produces.
pub(crate) fn writable(op: &'static str, tensor: &'static str, t: &TensorDesc) -> Checked {
    let Some(strides) = t.strides else {
        return Ok(());
    };
    if t.shape.contains(&0) {
        return Ok(());
    }
    let mut dims: [(u64, u64); 16] = [(0, 0); 16];
    let mut n = 0;
    for (&extent, &stride) in t.shape.iter().zip(strides) {
        if extent > 1 {
            if n == dims.len() {
                return Ok(()); // more than 16 non-trivial dimensions: not checked
            }
            dims[n] = (stride.unsigned_abs(), extent as u64);
            n += 1;
        }
    }
    let dims = &mut dims[..n];
    dims.sort_unstable();
    let mut reach = 0u64;
    for &(stride, extent) in dims.iter() {
        if stride <= reach {
            return Err(ArgError::Invalid {
                op,
                message: format!(
                    "output {tensor} with shape {} and strides {} writes some elements more than once; outputs must not overlap themselves",
                    Shape::from(t.shape),
                    Shape::from(strides)
                ),
            });
        }
        reach = reach.saturating_add(stride.saturating_mul(extent - 1));
    }
    Ok(())
}

/// NumPy broadcasting of two shapes, or `None` when they do not broadcast.
pub fn broadcast_shapes(a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i < n - a.len() {
            1
        } else {
            a[i - (n - a.len())]
        };
        let db = if i < n - b.len() {
            1
        } else {
            b[i - (n - b.len())]
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// Whether `a` and `b` broadcast to exactly `out` (no allocation: this runs
/// on every elementwise call).
#[inline]
fn broadcasts_to(a: &[i64], b: &[i64], out: &[i64]) -> bool {
    let n = out.len();
    if a.len() > n || b.len() > n || a.len().max(b.len()) != n {
        return false;
    }
    (0..n).all(|i| {
        let da = if i < n - a.len() {
            1
        } else {
            a[i - (n - a.len())]
        };
        let db = if i < n - b.len() {
            1
        } else {
            b[i - (n - b.len())]
        };
        let d = out[i];
        (da == d || da == 1) && (db == d || db == 1) && (da == d || db == d)
    })
}

#[inline]
/// `fill`: any dtype, a writable output.
pub fn fill(out: &TensorDesc) -> Checked {
    writable("fill", "out", out)
}

#[inline]
/// `copy`: same dtype and shape.
pub fn copy(src: &TensorDesc, dst: &TensorDesc) -> Checked {
    same_dtype("copy", ("src", src), ("dst", dst))?;
    shape_is("copy", "dst", dst, src.shape, "it must equal src's shape")?;
    writable("copy", "dst", dst)
}

#[inline]
/// `cast`: floating dtypes, same shape.
pub fn cast(src: &TensorDesc, dst: &TensorDesc) -> Checked {
    float("cast", "src", src)?;
    float("cast", "dst", dst)?;
    shape_is("cast", "dst", dst, src.shape, "it must equal src's shape")?;
    writable("cast", "dst", dst)
}

#[inline]
/// `add`, `sub`, `mul`, `div`: one floating dtype, `out` has the broadcast shape.
pub fn binary(op: &'static str, a: &TensorDesc, b: &TensorDesc, out: &TensorDesc) -> Checked {
    float(op, "a", a)?;
    same_dtype(op, ("a", a), ("b", b))?;
    same_dtype(op, ("a", a), ("out", out))?;
    if !broadcasts_to(a.shape, b.shape, out.shape) {
        let Some(shape) = broadcast_shapes(a.shape, b.shape) else {
            return Err(ArgError::ShapeMismatch {
                op,
                tensor: "b",
                actual: Shape::from(b.shape),
                expected: format!(
                    "it does not broadcast with a's shape {}",
                    Shape::from(a.shape)
                ),
            });
        };
        shape_is(
            op,
            "out",
            out,
            &shape,
            "it must equal the broadcast shape of a and b",
        )?;
    }
    writable(op, "out", out)
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

/// `matmul`: one floating dtype, matrices of rank >= 2, inner dimensions
/// equal, batch dimensions broadcasting to `out`'s.
pub fn matmul(
    a: &TensorDesc,
    b: &TensorDesc,
    out: &TensorDesc,
    trans_a: bool,
    trans_b: bool,
) -> Result<MatmulDims, ArgError> {
    const OP: &str = "matmul";
    float(OP, "a", a)?;
    same_dtype(OP, ("a", a), ("b", b))?;
    same_dtype(OP, ("a", a), ("out", out))?;
    for (name, t) in [("a", a), ("b", b), ("out", out)] {
        if t.ndim() < 2 {
            return Err(ArgError::ShapeMismatch {
                op: OP,
                tensor: name,
                actual: Shape::from(t.shape),
                expected: "matmul needs at least 2 dimensions".into(),
            });
        }
    }
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
    let mut expected = batch.clone();
    expected.extend([m, n]);
    shape_is(OP, "out", out, &expected, "it must be")?;
    writable(OP, "out", out)?;
    Ok(MatmulDims { batch, m, k, n })
}

#[inline]
/// `softmax`: one floating dtype, same shape, rank >= 1.
pub fn softmax(input: &TensorDesc, out: &TensorDesc) -> Checked {
    const OP: &str = "softmax";
    float(OP, "input", input)?;
    same_dtype(OP, ("input", input), ("out", out))?;
    if input.ndim() == 0 {
        return Err(ArgError::ShapeMismatch {
            op: OP,
            tensor: "input",
            actual: Shape::from(input.shape),
            expected: "softmax needs at least 1 dimension".into(),
        });
    }
    shape_is(OP, "out", out, input.shape, "it must equal input's shape")?;
    writable(OP, "out", out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dtype: DType, shape: &[i64]) -> TensorDesc<'_> {
        TensorDesc::new(std::ptr::null_mut(), dtype, shape, None)
    }

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast_shapes(&[3, 1, 5], &[4, 1]), Some(vec![3, 4, 5]));
        assert_eq!(broadcast_shapes(&[], &[2]), Some(vec![2]));
        assert_eq!(broadcast_shapes(&[0], &[1]), Some(vec![0]));
        assert_eq!(broadcast_shapes(&[2, 3], &[3, 2]), None);
        for (a, b) in [
            (&[3i64, 1, 5][..], &[4i64, 1][..]),
            (&[2, 3], &[3]),
            (&[1], &[0]),
            (&[], &[]),
            (&[2, 1], &[1, 2]),
        ] {
            let out = broadcast_shapes(a, b).unwrap();
            assert!(broadcasts_to(a, b, &out), "{a:?} {b:?}");
            assert!(
                !broadcasts_to(a, b, &[out.as_slice(), &[1]].concat()),
                "an extra dimension is not the broadcast shape"
            );
        }
        assert!(!broadcasts_to(&[2, 3], &[3], &[1, 3]));
        assert!(
            !broadcasts_to(&[1, 3], &[1, 3], &[2, 3]),
            "out may not be larger than both"
        );
    }

    #[test]
    fn binary_names_the_op_and_shapes() {
        let err = binary(
            "add",
            &t(DType::F32, &[2, 3]),
            &t(DType::F32, &[4]),
            &t(DType::F32, &[2, 3]),
        )
        .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ShapeMismatch);
        assert_eq!(
            err.to_string(),
            "add: b has shape [4], but it does not broadcast with a's shape [2, 3]"
        );
        let err = binary(
            "mul",
            &t(DType::F32, &[2]),
            &t(DType::BF16, &[2]),
            &t(DType::F32, &[2]),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "mul: a is f32 but b is bf16; they must have the same dtype"
        );
        let err = binary(
            "div",
            &t(DType::I32, &[2]),
            &t(DType::I32, &[2]),
            &t(DType::I32, &[2]),
        )
        .unwrap_err();
        assert_eq!(err.code(), ErrorCode::DTypeMismatch);
    }

    #[test]
    fn matmul_dims_and_errors() {
        let dims = matmul(
            &t(DType::F32, &[5, 3, 4]),
            &t(DType::F32, &[6, 4]),
            &t(DType::F32, &[5, 3, 6]),
            false,
            true,
        )
        .unwrap();
        assert_eq!(
            dims,
            MatmulDims {
                batch: vec![5],
                m: 3,
                k: 4,
                n: 6
            }
        );
        let err = matmul(
            &t(DType::F32, &[5, 3, 4]),
            &t(DType::F32, &[6, 4]),
            &t(DType::F32, &[5, 3, 4]),
            false,
            true,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "matmul: out has shape [5, 3, 4], but it must be [5, 3, 6]"
        );
    }

    #[test]
    fn matmul_inner_mismatch() {
        let err = matmul(
            &t(DType::F32, &[3, 4]),
            &t(DType::F32, &[5, 6]),
            &t(DType::F32, &[3, 6]),
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
        assert_eq!(
            fill(&out(&[4], &[0])).unwrap_err().code(),
            ErrorCode::InvalidArgument
        );
        assert!(
            fill(&out(&[2, 2], &[1, 1])).is_err(),
            "strides [1, 1] write element 1 twice"
        );
        let err = fill(&out(&[3, 2], &[1, 2])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "fill: output out with shape [3, 2] and strides [1, 2] writes some elements more than once; outputs must not overlap themselves"
        );
        assert!(
            fill(&out(&[2, 3], &[1, 2])).is_ok(),
            "a transposed compact view"
        );
        assert!(fill(&out(&[2, 3], &[-3, 1])).is_ok(), "a flipped view");
        assert!(
            fill(&out(&[1, 5], &[0, 1])).is_ok(),
            "size-1 dimensions may have any stride"
        );
        assert!(fill(&out(&[4, 2], &[10, 3])).is_ok(), "a sparse view");
    }
}

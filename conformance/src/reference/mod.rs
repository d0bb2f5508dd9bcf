//! The CPU reference ("the oracle"): every operator of the op table computed
//! in f64 on dense row-major tensors, written for clarity rather than speed,
//! and sharing no code with any plugin. The suite rounds a case's inputs to
//! the dtype under test, converts them exactly to f64, runs the plugin and
//! this reference on the same values, and compares. The reference never sees
//! dtypes; rounding of outputs is the suite's business.
//!
//! Every function is named like its field in the op table
//! (`spec/ops.toml`) and takes its arguments in the order of
//! the C argument struct, inputs only; outputs are returned. A [`RefError`]
//! marks a case the plugin must refuse with an error object (shapes that do
//! not fit, an index out of range, argmax over an empty dimension, an AdamW
//! step below 1).

mod activation;
mod attention;
mod basic;
mod elementwise;
mod indexing;
mod logic;
mod norm;
mod reduce;
mod training;

pub use activation::{gelu_erf, gelu_erf_backward, sigmoid, sigmoid_backward, tanh_backward};
pub use attention::{attention, attention_backward};
pub use basic::{add, broadcast_shapes, cast, copy, div, fill, matmul, mul, softmax, sub};
pub use elementwise::{
    exp, gelu, gelu_backward, log, neg, pow_scalar, relu, relu_backward, rsqrt, silu,
    silu_backward, sqrt, swiglu, swiglu_backward, tanh,
};
pub use indexing::{bitwise, cumsum, gather, reduce_bool, scatter_add, scatter_add_wrapping};
pub use logic::{arange, compare, compare_fn, convert, cos, masked_fill, select, sin};
pub use norm::{layer_norm, layer_norm_backward, rms_norm, rms_norm_backward, rope, rope_backward};
pub use reduce::{
    argmax, log_softmax, log_softmax_backward, max, mean, softmax_backward, sum, sum_squares,
};
pub use training::{
    adamw, cross_entropy, cross_entropy_backward, embedding, embedding_backward, linear, scale,
};

use std::fmt;

/// A dense row-major tensor of f64 values. A 0-dimensional tensor (empty
/// `shape`) holds one element; a shape with a zero extent holds none.
#[derive(Debug, Clone, PartialEq)]
pub struct Dense {
    /// The extents, outermost first.
    pub shape: Vec<usize>,
    /// The elements in row-major order; `data.len()` is the product of `shape`.
    pub data: Vec<f64>,
}

/// A dense row-major tensor of indices (i32 or i64 on the plugin's side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Indices {
    /// The extents, outermost first.
    pub shape: Vec<usize>,
    /// The indices in row-major order; `data.len()` is the product of `shape`.
    pub data: Vec<i64>,
}

/// A case the plugin must refuse: the message says why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefError {
    /// The operator, as named in the op table.
    pub op: &'static str,
    /// What is wrong with the arguments.
    pub message: String,
}

impl RefError {
    /// An error of operator `op`.
    pub fn new(op: &'static str, message: impl Into<String>) -> RefError {
        RefError {
            op,
            message: message.into(),
        }
    }
}

impl fmt::Display for RefError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.op, self.message)
    }
}

impl std::error::Error for RefError {}

/// The number of elements of a tensor of this shape (1 for 0-d).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The row-major strides (in elements) of a shape.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// The flat row-major position of `index` in `shape`; panics when the index
/// has the wrong rank or is out of range.
pub fn flat_index(shape: &[usize], index: &[usize]) -> usize {
    assert_eq!(
        index.len(),
        shape.len(),
        "index {index:?} for shape {shape:?}"
    );
    let mut flat = 0;
    for (&i, &n) in index.iter().zip(shape) {
        assert!(i < n, "index {index:?} out of range for shape {shape:?}");
        flat = flat * n + i;
    }
    flat
}

/// The multi-index of flat row-major position `flat` in `shape`.
pub fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        index[d] = flat % shape[d];
        flat /= shape[d];
    }
    index
}

impl Dense {
    /// A tensor from its shape and row-major data; panics when
    /// `data.len()` is not the product of `shape`.
    pub fn new(shape: &[usize], data: Vec<f64>) -> Dense {
        assert_eq!(
            data.len(),
            numel(shape),
            "{} elements for shape {shape:?}",
            data.len()
        );
        Dense {
            shape: shape.to_vec(),
            data,
        }
    }

    /// A tensor of zeros.
    pub fn zeros(shape: &[usize]) -> Dense {
        Dense::full(shape, 0.0)
    }

    /// A tensor with every element `value`.
    pub fn full(shape: &[usize], value: f64) -> Dense {
        Dense::new(shape, vec![value; numel(shape)])
    }

    /// A 0-dimensional tensor.
    pub fn scalar(value: f64) -> Dense {
        Dense::new(&[], vec![value])
    }

    /// A tensor whose element at each multi-index is `f(index)`.
    pub fn from_fn(shape: &[usize], mut f: impl FnMut(&[usize]) -> f64) -> Dense {
        let data = (0..numel(shape)).map(|i| f(&unravel(i, shape))).collect();
        Dense::new(shape, data)
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// The element at `index`; panics when it is out of range.
    pub fn at(&self, index: &[usize]) -> f64 {
        self.data[flat_index(&self.shape, index)]
    }

    /// A mutable reference to the element at `index`; panics when it is out
    /// of range.
    pub fn at_mut(&mut self, index: &[usize]) -> &mut f64 {
        let flat = flat_index(&self.shape, index);
        &mut self.data[flat]
    }

    /// The same data with another shape of as many elements.
    pub fn reshape(&self, shape: &[usize]) -> Dense {
        Dense::new(shape, self.data.clone())
    }

    /// The tensor with `f` applied to every element.
    pub fn map(&self, f: impl Fn(f64) -> f64) -> Dense {
        Dense::new(&self.shape, self.data.iter().map(|&x| f(x)).collect())
    }
}

impl Indices {
    /// Indices from their shape and row-major data; panics when `data.len()`
    /// is not the product of `shape`.
    pub fn new(shape: &[usize], data: Vec<i64>) -> Indices {
        assert_eq!(
            data.len(),
            numel(shape),
            "{} indices for shape {shape:?}",
            data.len()
        );
        Indices {
            shape: shape.to_vec(),
            data,
        }
    }

    /// The number of indices.
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The index at `index`; panics when it is out of range.
    pub fn at(&self, index: &[usize]) -> i64 {
        self.data[flat_index(&self.shape, index)]
    }
}

/// Fails unless `t` has exactly `expected` as its shape.
pub(crate) fn expect_shape(
    op: &'static str,
    name: &str,
    t: &Dense,
    expected: &[usize],
) -> Result<(), RefError> {
    if t.shape == expected {
        Ok(())
    } else {
        Err(RefError::new(
            op,
            format!("{name} has shape {:?}, expected {expected:?}", t.shape),
        ))
    }
}

/// Fails unless `t` has at least `min` dimensions.
pub(crate) fn expect_rank(
    op: &'static str,
    name: &str,
    t: &Dense,
    min: usize,
) -> Result<(), RefError> {
    if t.ndim() >= min {
        Ok(())
    } else {
        Err(RefError::new(
            op,
            format!(
                "{name} has shape {:?}, but needs at least {min} dimension(s)",
                t.shape
            ),
        ))
    }
}

/// A tensor seen as rows over its last dimension: `(rows, row_len)`, where
/// `rows` is the product of the leading extents. The caller checks rank >= 1.
pub(crate) fn rows_of(t: &Dense) -> (usize, usize) {
    let h = *t.shape.last().expect("rank checked by the caller");
    (numel(&t.shape[..t.ndim() - 1]), h)
}

/// The largest value, or NaN when any value is NaN; `-inf` when empty.
pub(crate) fn max_nan(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut best = f64::NEG_INFINITY;
    for x in values {
        if x.is_nan() {
            return f64::NAN;
        }
        if x > best {
            best = x;
        }
    }
    best
}

/// `log(sum(exp(x)))` computed around the maximum: `-inf` for an empty row,
/// NaN for a row of `-inf` or with NaN (as the max-subtracting softmax).
pub(crate) fn logsumexp(row: &[f64]) -> f64 {
    if row.is_empty() {
        return f64::NEG_INFINITY;
    }
    let m = max_nan(row.iter().copied());
    let s: f64 = row.iter().map(|&x| (x - m).exp()).sum();
    m + s.ln()
}

//! Arguments of the reductions added in ABI 1.1, and softmax's relatives.

use crate::abi::PolychipTensor;

/// A reduction over one dimension: `sum`, `mean`, `max` and `argmax`.
///
/// `out` has `input`'s shape with dimension `dim` removed, or set to 1 when
/// `keepdim` is nonzero. `sum`, `mean` and `max` keep `input`'s floating
/// dtype and accumulate in at least f32; `argmax` writes i64 indices (the
/// first maximum; the first NaN if there is one). Over an empty dimension:
/// `sum` is 0, `mean` is NaN, `max` is `-inf`, and `argmax` is an
/// `INVALID_ARGUMENT` error. `max` propagates NaN.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipReduceArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// Input.
    pub input: PolychipTensor,
    /// Output.
    pub out: PolychipTensor,
    /// The reduced dimension; negative counts from the end (`-1` is the last).
    pub dim: i32,
    /// Nonzero: keep the reduced dimension with extent 1.
    pub keepdim: u8,
}

/// `out = sum(input^2)` over every element, accumulated in at least f32:
/// the global term of gradient-norm clipping. `out` is a 0-dimensional f32
/// tensor.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipSumSquaresArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// Input, any floating dtype and shape.
    pub input: PolychipTensor,
    /// 0-dimensional f32 output.
    pub out: PolychipTensor,
}

/// Backward of `softmax` (`grad_in = y * (g - sum(g * y))`) or of
/// `log_softmax` (`grad_in = g - exp(y) * sum(g)`), over the last dimension,
/// where `y` is the forward output.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipSoftmaxBackwardArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// The forward output (probabilities, or log-probabilities).
    pub out: PolychipTensor,
    /// Gradient of the forward output.
    pub grad_out: PolychipTensor,
    /// Gradient of the forward input; same shape and dtype.
    pub grad_in: PolychipTensor,
}

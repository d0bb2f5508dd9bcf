//! Arguments of the operators of ABI 1.0: fill, copy, cast, the four
//! elementwise binary operators, matmul and softmax.

use crate::abi::PolychipTensor;

/// `out[...] = value`, converted to `out`'s dtype: round to nearest even for
/// floats; for integers truncation toward zero, saturating at the type's
/// range, NaN giving 0; `value != 0` for bool. Any dtype, any strides.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipFillArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// The tensor to fill.
    pub out: PolychipTensor,
    /// The value.
    pub value: f64,
}

/// `dst = src` element by element: same dtype and shape, any strides on
/// either side (covers transposition and making a tensor contiguous).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipCopyArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// Source.
    pub src: PolychipTensor,
    /// Destination; must not overlap `src`.
    pub dst: PolychipTensor,
}

/// `dst = (dst.dtype) src` between floating dtypes (f32, f16, bf16, f64),
/// rounding to nearest even; same shape, any strides.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipCastArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// Source.
    pub src: PolychipTensor,
    /// Destination; must not overlap `src`.
    pub dst: PolychipTensor,
}

/// Elementwise `out = a OP b` with NumPy broadcasting of `a` and `b` to
/// `out`'s shape. add: `a + alpha * b`; sub: `a - alpha * b`; mul: `a * b`;
/// div: `a / b` (IEEE: `x / 0` is ±inf or NaN). All three tensors have one
/// floating dtype. In place: `out` may be exactly `a` or `b`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipBinaryArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// Left operand.
    pub a: PolychipTensor,
    /// Right operand.
    pub b: PolychipTensor,
    /// Result, with the broadcast shape of `a` and `b`.
    pub out: PolychipTensor,
    /// Scale of `b` for add and sub; ignored by mul and div.
    pub alpha: f64,
}

/// Batched matrix product `out = alpha * op(a) @ op(b) + beta * out`.
///
/// `a` is `[..., M, K]` (`[..., K, M]` when `transpose_a`), `b` is
/// `[..., K, N]` (`[..., N, K]` when `transpose_b`), `out` is `[..., M, N]`.
/// The batch dimensions of `a` and `b` broadcast to those of `out`. When
/// `beta == 0`, `out` is not read (NaN in it does not propagate); when
/// `alpha == 0`, `a` and `b` are not read (BLAS conventions). One floating
/// dtype for all three; f16 and bf16 accumulate in f32.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipMatmulArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// Left operand.
    pub a: PolychipTensor,
    /// Right operand.
    pub b: PolychipTensor,
    /// Result and, when `beta != 0`, accumulator.
    pub out: PolychipTensor,
    /// Scale of the product.
    pub alpha: f64,
    /// Scale of the previous `out`.
    pub beta: f64,
    /// Nonzero: use the transpose of the last two dimensions of `a`.
    pub transpose_a: u8,
    /// Nonzero: use the transpose of the last two dimensions of `b`.
    pub transpose_b: u8,
}

/// Softmax over the last dimension, subtracting the row maximum first so large
/// inputs do not overflow. Same shape and floating dtype. In place: `out` may
/// be exactly `input`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipSoftmaxArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// Logits.
    pub input: PolychipTensor,
    /// Probabilities.
    pub out: PolychipTensor,
}

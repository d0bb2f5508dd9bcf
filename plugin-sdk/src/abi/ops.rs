//! The operator table and each operator's argument struct.
//!
//! Every operator entry has the same shape:
//! `PolychipError *op(uint32_t device, PolychipStream *stream, const Polychip<Op>Args *args)`.
//! `stream` NULL means the device's default stream, on which work completes
//! before the call returns. Each `*Args` struct starts with `struct_size`, so
//! an operator gains optional arguments at the end without a new entry. Every
//! field present in 1.0 is required (`struct_size` must cover it); a field
//! appended by a later minor documents the default a plugin uses when
//! `args->struct_size` does not reach it.
//!
//! A NULL entry means "not implemented". Entries are only ever appended to
//! [`PolychipOpTable`], so a table from an older minor is a prefix of a newer
//! one; the host reads an entry only when `struct_size` covers it.
//!
//! Common rules for all operators:
//! - all tensors are on `device`; outputs are written, inputs are only read;
//! - an output may alias an input only where the operator says "in place";
//! - floating operators accept f32, f16, bf16 and f64; f16 and bf16 are
//!   computed in at least f32 precision and rounded to nearest even once per
//!   output element;
//! - an output must not overlap itself (a zero stride on an extent above one,
//!   or strides that reach one element twice); the host never passes one and
//!   a plugin may refuse it with `POLYCHIP_ERROR_INVALID_ARGUMENT`;
//! - thread safety: calls on different streams may run concurrently; calls on
//!   one stream must be serialized by the caller.

use crate::abi::{PolychipError, PolychipStream, PolychipTensor};

/// `out[...] = value`, converted to `out`'s dtype (round to nearest even for
/// floats, truncation toward zero for integers, `value != 0` for bool).
/// Any dtype, any strides (no zero strides).
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
/// `beta == 0`, `out` is not read (NaN in it does not propagate). One floating
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

/// An operator entry taking [`PolychipFillArgs`].
pub type PolychipFillFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipFillArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipCopyArgs`].
pub type PolychipCopyFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipCopyArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipCastArgs`].
pub type PolychipCastFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipCastArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipBinaryArgs`].
pub type PolychipBinaryFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipBinaryArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipMatmulArgs`].
pub type PolychipMatmulFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipMatmulArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipSoftmaxArgs`].
pub type PolychipSoftmaxFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipSoftmaxArgs,
    ) -> *mut PolychipError,
>;

/// The operator table. Append-only: a new operator is a new field at the end,
/// introduced by a new minor version. NULL entries are "not implemented".
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipOpTable {
    /// Size of this table as the plugin knows it.
    pub struct_size: usize,
    /// Fill a tensor with a scalar. Since 1.0.
    pub fill: PolychipFillFn,
    /// Strided copy. Since 1.0.
    pub copy: PolychipCopyFn,
    /// Floating-point conversion. Since 1.0.
    pub cast: PolychipCastFn,
    /// `a + alpha * b`. Since 1.0.
    pub add: PolychipBinaryFn,
    /// `a - alpha * b`. Since 1.0.
    pub sub: PolychipBinaryFn,
    /// `a * b`. Since 1.0.
    pub mul: PolychipBinaryFn,
    /// `a / b`. Since 1.0.
    pub div: PolychipBinaryFn,
    /// Batched matmul. Since 1.0.
    pub matmul: PolychipMatmulFn,
    /// Softmax over the last dimension. Since 1.0.
    pub softmax: PolychipSoftmaxFn,
}

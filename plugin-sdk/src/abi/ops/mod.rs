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

mod attention;
mod basic;
mod elementwise;
mod norm;
mod reduce;
mod training;

pub use attention::*;
pub use basic::*;
pub use elementwise::*;
pub use norm::*;
pub use reduce::*;
pub use training::*;

use crate::abi::{PolychipError, PolychipStream};

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

/// An operator entry taking [`PolychipUnaryArgs`].
pub type PolychipUnaryFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipUnaryArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipPowScalarArgs`].
pub type PolychipPowScalarFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipPowScalarArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipActivationBackwardArgs`].
pub type PolychipActivationBackwardFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipActivationBackwardArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipSwigluArgs`].
pub type PolychipSwigluFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipSwigluArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipSwigluBackwardArgs`].
pub type PolychipSwigluBackwardFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipSwigluBackwardArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipReduceArgs`].
pub type PolychipReduceFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipReduceArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipSumSquaresArgs`].
pub type PolychipSumSquaresFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipSumSquaresArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipSoftmaxBackwardArgs`].
pub type PolychipSoftmaxBackwardFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipSoftmaxBackwardArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipLinearArgs`].
pub type PolychipLinearFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipLinearArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipRmsNormArgs`].
pub type PolychipRmsNormFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipRmsNormArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipRmsNormBackwardArgs`].
pub type PolychipRmsNormBackwardFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipRmsNormBackwardArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipLayerNormArgs`].
pub type PolychipLayerNormFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipLayerNormArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipLayerNormBackwardArgs`].
pub type PolychipLayerNormBackwardFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipLayerNormBackwardArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipRopeArgs`].
pub type PolychipRopeFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipRopeArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipAttentionArgs`].
pub type PolychipAttentionFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipAttentionArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipAttentionBackwardArgs`].
pub type PolychipAttentionBackwardFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipAttentionBackwardArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipEmbeddingArgs`].
pub type PolychipEmbeddingFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipEmbeddingArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipEmbeddingBackwardArgs`].
pub type PolychipEmbeddingBackwardFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipEmbeddingBackwardArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipCrossEntropyArgs`].
pub type PolychipCrossEntropyFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipCrossEntropyArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipCrossEntropyBackwardArgs`].
pub type PolychipCrossEntropyBackwardFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipCrossEntropyBackwardArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipAdamwArgs`].
pub type PolychipAdamwFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipAdamwArgs,
    ) -> *mut PolychipError,
>;
/// An operator entry taking [`PolychipScaleArgs`].
pub type PolychipScaleFn = Option<
    unsafe extern "C" fn(
        device: u32,
        stream: *mut PolychipStream,
        args: *const PolychipScaleArgs,
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
    /// `-x`. Since 1.1.
    pub neg: PolychipUnaryFn,
    /// `e^x`. Since 1.1.
    pub exp: PolychipUnaryFn,
    /// Natural logarithm. Since 1.1.
    pub log: PolychipUnaryFn,
    /// Square root. Since 1.1.
    pub sqrt: PolychipUnaryFn,
    /// `1 / sqrt(x)`. Since 1.1.
    pub rsqrt: PolychipUnaryFn,
    /// Hyperbolic tangent. Since 1.1.
    pub tanh: PolychipUnaryFn,
    /// `x ^ exponent`. Since 1.1.
    pub pow_scalar: PolychipPowScalarFn,
    /// `max(x, 0)`. Since 1.1.
    pub relu: PolychipUnaryFn,
    /// Backward of `relu`. Since 1.1.
    pub relu_backward: PolychipActivationBackwardFn,
    /// `x * sigmoid(x)`. Since 1.1.
    pub silu: PolychipUnaryFn,
    /// Backward of `silu`. Since 1.1.
    pub silu_backward: PolychipActivationBackwardFn,
    /// GELU, tanh form. Since 1.1.
    pub gelu: PolychipUnaryFn,
    /// Backward of `gelu`. Since 1.1.
    pub gelu_backward: PolychipActivationBackwardFn,
    /// `silu(gate) * up`. Since 1.1.
    pub swiglu: PolychipSwigluFn,
    /// Backward of `swiglu`. Since 1.1.
    pub swiglu_backward: PolychipSwigluBackwardFn,
    /// Sum over a dimension. Since 1.1.
    pub sum: PolychipReduceFn,
    /// Mean over a dimension. Since 1.1.
    pub mean: PolychipReduceFn,
    /// Maximum over a dimension. Since 1.1.
    pub max: PolychipReduceFn,
    /// Index of the maximum over a dimension (i64). Since 1.1.
    pub argmax: PolychipReduceFn,
    /// Global sum of squares (f32 scalar). Since 1.1.
    pub sum_squares: PolychipSumSquaresFn,
    /// `input @ weight^T + bias`. Since 1.1.
    pub linear: PolychipLinearFn,
    /// Backward of `softmax`. Since 1.1.
    pub softmax_backward: PolychipSoftmaxBackwardFn,
    /// Log-softmax over the last dimension (takes [`PolychipSoftmaxArgs`]). Since 1.1.
    pub log_softmax: PolychipSoftmaxFn,
    /// Backward of `log_softmax`. Since 1.1.
    pub log_softmax_backward: PolychipSoftmaxBackwardFn,
    /// RMSNorm, returning the inverse RMS. Since 1.1.
    pub rms_norm: PolychipRmsNormFn,
    /// Backward of `rms_norm`. Since 1.1.
    pub rms_norm_backward: PolychipRmsNormBackwardFn,
    /// LayerNorm, returning mean and rstd. Since 1.1.
    pub layer_norm: PolychipLayerNormFn,
    /// Backward of `layer_norm`. Since 1.1.
    pub layer_norm_backward: PolychipLayerNormBackwardFn,
    /// Rotary position embedding. Since 1.1.
    pub rope: PolychipRopeFn,
    /// Backward of `rope` (rotation by `-theta`). Since 1.1.
    pub rope_backward: PolychipRopeFn,
    /// Scaled-dot-product attention with GQA and causal mask, returning the log-sum-exp. Since 1.1.
    pub attention: PolychipAttentionFn,
    /// Backward of `attention`. Since 1.1.
    pub attention_backward: PolychipAttentionBackwardFn,
    /// Embedding lookup. Since 1.1.
    pub embedding: PolychipEmbeddingFn,
    /// Embedding backward (accumulates). Since 1.1.
    pub embedding_backward: PolychipEmbeddingBackwardFn,
    /// Mean cross-entropy with `ignore_index`. Since 1.1.
    pub cross_entropy: PolychipCrossEntropyFn,
    /// Backward of `cross_entropy`. Since 1.1.
    pub cross_entropy_backward: PolychipCrossEntropyBackwardFn,
    /// One AdamW step in place. Since 1.1.
    pub adamw: PolychipAdamwFn,
    /// `x *= alpha` in place. Since 1.1.
    pub scale: PolychipScaleFn,
}

/// The number of operators in this minor's op table.
pub const POLYCHIP_OP_COUNT: usize = 47;

impl PolychipOpTable {
    /// Every operator's name, in table order, with whether its entry is set.
    pub fn entries(&self) -> [(&'static str, bool); POLYCHIP_OP_COUNT] {
        [
            ("fill", self.fill.is_some()),
            ("copy", self.copy.is_some()),
            ("cast", self.cast.is_some()),
            ("add", self.add.is_some()),
            ("sub", self.sub.is_some()),
            ("mul", self.mul.is_some()),
            ("div", self.div.is_some()),
            ("matmul", self.matmul.is_some()),
            ("softmax", self.softmax.is_some()),
            ("neg", self.neg.is_some()),
            ("exp", self.exp.is_some()),
            ("log", self.log.is_some()),
            ("sqrt", self.sqrt.is_some()),
            ("rsqrt", self.rsqrt.is_some()),
            ("tanh", self.tanh.is_some()),
            ("pow_scalar", self.pow_scalar.is_some()),
            ("relu", self.relu.is_some()),
            ("relu_backward", self.relu_backward.is_some()),
            ("silu", self.silu.is_some()),
            ("silu_backward", self.silu_backward.is_some()),
            ("gelu", self.gelu.is_some()),
            ("gelu_backward", self.gelu_backward.is_some()),
            ("swiglu", self.swiglu.is_some()),
            ("swiglu_backward", self.swiglu_backward.is_some()),
            ("sum", self.sum.is_some()),
            ("mean", self.mean.is_some()),
            ("max", self.max.is_some()),
            ("argmax", self.argmax.is_some()),
            ("sum_squares", self.sum_squares.is_some()),
            ("linear", self.linear.is_some()),
            ("softmax_backward", self.softmax_backward.is_some()),
            ("log_softmax", self.log_softmax.is_some()),
            ("log_softmax_backward", self.log_softmax_backward.is_some()),
            ("rms_norm", self.rms_norm.is_some()),
            ("rms_norm_backward", self.rms_norm_backward.is_some()),
            ("layer_norm", self.layer_norm.is_some()),
            ("layer_norm_backward", self.layer_norm_backward.is_some()),
            ("rope", self.rope.is_some()),
            ("rope_backward", self.rope_backward.is_some()),
            ("attention", self.attention.is_some()),
            ("attention_backward", self.attention_backward.is_some()),
            ("embedding", self.embedding.is_some()),
            ("embedding_backward", self.embedding_backward.is_some()),
            ("cross_entropy", self.cross_entropy.is_some()),
            (
                "cross_entropy_backward",
                self.cross_entropy_backward.is_some(),
            ),
            ("adamw", self.adamw.is_some()),
            ("scale", self.scale.is_some()),
        ]
    }
}

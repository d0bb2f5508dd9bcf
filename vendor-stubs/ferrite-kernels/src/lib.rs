//! Compute kernels of the bundled `ferrite` example plugin, which simulates a
//! fast accelerator on the host CPU. Every kernel works on raw memory
//! described by strided [`View`]s (any strides: transposed, broadcast with
//! stride 0, negative), validates cheaply and returns [`KernelError`] instead
//! of panicking, keeps tiny tensors on the calling thread without allocating,
//! and spreads large ones over the rayon pool.
//!
//! ABI 1.0 kernels: [`fill`], [`copy`], [`cast`], [`binary`], [`matmul`]
//! (through the `gemm` crate) and [`softmax`].
//!
//! ABI 1.1 kernels (`f32`, `f16` and `bf16`; statistics, moments and rope
//! tables in `f32`; indices `i32`/`i64`): pointwise [`unary`],
//! [`pow_scalar`], [`scale`], [`activation_backward`], [`output_backward`], [`swiglu`],
//! [`swiglu_backward`], [`adamw`]; reductions [`reduce`], [`sum_squares`];
//! row kernels [`log_softmax`], [`softmax_backward`], [`rms_norm`],
//! [`rms_norm_backward`], [`layer_norm`], [`layer_norm_backward`],
//! [`rope`], [`cross_entropy`], [`cross_entropy_backward`]; [`linear`]
//! (one `gemm` call); flash-style [`attention`] and [`attention_backward`]
//! (tiled, online softmax, grouped-query heads, causal); [`embedding`] and
//! [`embedding_backward`]. Index and range errors are returned, never
//! read or written out of bounds.
//!
//! `f16`/`bf16` arithmetic is done in `f32` and rounded to nearest even
//! once.

mod activation;
mod adamw;
mod attention;
mod attention_bwd;
mod attn_block;
mod attn_common;
mod binary;
mod convert;
mod copy_cast;
mod cross_entropy;
mod dtype;
mod embedding;
mod error;
mod fill;
mod float;
mod index;
mod indexing;
mod layer_norm;
mod layout;
mod linear;
mod log_softmax;
mod logic;
mod map;
mod matmul;
mod matmul_half;
mod norm;
mod output_backward;
mod parallel;
mod reduce;
mod rms_norm;
mod rope;
mod rounding;
mod rows;
mod shape;
mod simd;
mod softmax;
mod sum_squares;
mod unary;
mod view;

#[doc(hidden)]
pub use activation::erfcf_reference;
pub use activation::{ActivationOp, activation_backward, swiglu, swiglu_backward};
pub use adamw::adamw;
pub use attention::attention;
pub use attention_bwd::attention_backward;
pub use binary::{BinaryOp, binary};
pub use copy_cast::{cast, copy};
pub use cross_entropy::{cross_entropy, cross_entropy_backward};
pub use dtype::DType;
pub use embedding::{embedding, embedding_backward};
pub use error::KernelError;
pub use fill::fill;
pub use indexing::{BitwiseOp, BoolReduceOp, bitwise, cumsum, gather, reduce_bool, scatter_add};
pub use layer_norm::{layer_norm, layer_norm_backward};
pub use linear::linear;
pub use log_softmax::{log_softmax, softmax_backward};
pub use logic::{CompareOp, arange, compare, convert, masked_fill, select};
pub use matmul::matmul;
pub use output_backward::{OutputOp, output_backward};
pub use reduce::{ReduceOp, reduce};
pub use rms_norm::{rms_norm, rms_norm_backward};
pub use rope::rope;
pub use rounding::{bf16_from_f64, f16_from_f64};
#[doc(hidden)]
pub use simd::set_simd_enabled;
pub use softmax::softmax;
pub use sum_squares::sum_squares;
pub use unary::{UnaryOp, pow_scalar, scale, unary};
pub use view::View;

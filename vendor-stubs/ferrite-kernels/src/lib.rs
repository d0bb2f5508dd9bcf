//! Compute kernels of the bundled `ferrite` example plugin, which simulates a
//! fast accelerator on the host CPU. Every kernel works on raw memory
//! described by strided [`View`]s (any strides: transposed, broadcast with
//! stride 0, negative), validates cheaply and returns [`KernelError`] instead
//! of panicking, keeps tiny tensors on the calling thread without allocating,
//! and spreads large ones over the rayon pool.
//!
//! Kernels: [`fill`], [`copy`], [`cast`], [`binary`], [`matmul`] (through the
//! `gemm` crate) and [`softmax`]. `f16`/`bf16` arithmetic is done in `f32`
//! and rounded to nearest even once.

mod binary;
mod convert;
mod copy_cast;
mod dtype;
mod error;
mod fill;
mod float;
mod layout;
mod matmul;
mod matmul_half;
mod parallel;
mod rounding;
mod shape;
mod simd;
mod softmax;
mod view;

pub use binary::{BinaryOp, binary};
pub use copy_cast::{cast, copy};
pub use dtype::DType;
pub use error::KernelError;
pub use fill::fill;
pub use matmul::matmul;
pub use rounding::{bf16_from_f64, f16_from_f64};
#[doc(hidden)]
pub use simd::set_simd_enabled;
pub use softmax::softmax;
pub use view::View;

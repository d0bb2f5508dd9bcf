//! Arguments of the normalisation and position-embedding operators added in
//! ABI 1.1: RMSNorm, LayerNorm and rotary embeddings.
//!
//! Normalisations work over the last dimension, `H`; the rows are every
//! index of the leading dimensions. Statistics (`inv_rms`, `mean`, `rstd`)
//! are f32 tensors with the input's leading shape (the last dimension
//! dropped). Parameters (`weight`, `bias`) have shape `[H]` and the input's
//! dtype.

use crate::abi::PolychipTensor;

/// RMSNorm: `out = input * inv_rms * weight`, `inv_rms = 1 / sqrt(mean(x^2) + eps)`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipRmsNormArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// `[..., H]`.
    pub input: PolychipTensor,
    /// `[H]`.
    pub weight: PolychipTensor,
    /// `[..., H]`.
    pub out: PolychipTensor,
    /// `[...]` f32: saved for the backward pass.
    pub inv_rms: PolychipTensor,
    /// Added to the mean square.
    pub eps: f64,
}

/// Backward of RMSNorm: writes (does not accumulate) `grad_input` and
/// `grad_weight` (summed over rows in at least f32).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipRmsNormBackwardArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// `[..., H]`.
    pub grad_out: PolychipTensor,
    /// `[..., H]`: the forward input.
    pub input: PolychipTensor,
    /// `[H]`.
    pub weight: PolychipTensor,
    /// `[...]` f32 from the forward pass.
    pub inv_rms: PolychipTensor,
    /// `[..., H]`.
    pub grad_input: PolychipTensor,
    /// `[H]`.
    pub grad_weight: PolychipTensor,
}

/// LayerNorm: `out = (input - mean) * rstd * weight + bias`, `rstd = 1 /
/// sqrt(var + eps)` with the biased variance.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipLayerNormArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// `[..., H]`.
    pub input: PolychipTensor,
    /// `[H]`.
    pub weight: PolychipTensor,
    /// `[H]`.
    pub bias: PolychipTensor,
    /// `[..., H]`.
    pub out: PolychipTensor,
    /// `[...]` f32: saved for the backward pass.
    pub mean: PolychipTensor,
    /// `[...]` f32: saved for the backward pass.
    pub rstd: PolychipTensor,
    /// Added to the variance.
    pub eps: f64,
}

/// Backward of LayerNorm: writes `grad_input`, `grad_weight` and `grad_bias`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipLayerNormBackwardArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// `[..., H]`.
    pub grad_out: PolychipTensor,
    /// `[..., H]`: the forward input.
    pub input: PolychipTensor,
    /// `[H]`.
    pub weight: PolychipTensor,
    /// `[...]` f32 from the forward pass.
    pub mean: PolychipTensor,
    /// `[...]` f32 from the forward pass.
    pub rstd: PolychipTensor,
    /// `[..., H]`.
    pub grad_input: PolychipTensor,
    /// `[H]`.
    pub grad_weight: PolychipTensor,
    /// `[H]`.
    pub grad_bias: PolychipTensor,
}

/// Rotary position embedding (`rope`), and its backward (`rope_backward`,
/// the rotation by `-theta`, which is also its inverse).
///
/// `input` is `[batch, seq, heads, head_dim]` with an even `head_dim = D`;
/// `cos` and `sin` are f32 `[seq, D/2]` tables. Pair `j` of a head is
/// `(x[2j], x[2j+1])` when `interleaved` is nonzero (GPT-J layout) and
/// `(x[j], x[j + D/2])` otherwise (GPT-NeoX/LLaMA half-split layout); it is
/// rotated as `(a cos - b sin, a sin + b cos)` with the angle of its position
/// and `j`. In place: `out` may be exactly `input`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipRopeArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// `[batch, seq, heads, D]`.
    pub input: PolychipTensor,
    /// `[seq, D/2]` f32.
    pub cos: PolychipTensor,
    /// `[seq, D/2]` f32.
    pub sin: PolychipTensor,
    /// Same shape and dtype as `input`.
    pub out: PolychipTensor,
    /// Nonzero: interleaved pairs; zero: half-split pairs.
    pub interleaved: u8,
}

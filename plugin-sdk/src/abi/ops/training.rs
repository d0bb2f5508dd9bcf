//! Arguments of the operators added in ABI 1.1 that a training step needs
//! around the layers: linear, embedding, cross-entropy, AdamW and scaling.
//!
//! Index tensors are i32 or i64; an index outside its range is an
//! `INVALID_ARGUMENT` error (plugins must check, never read out of bounds).

use crate::abi::PolychipTensor;

/// `out = input @ weight^T + bias`, with `input` `[..., K]`, `weight`
/// `[N, K]`, `bias` `[N]` (ignored when `has_bias` is zero) and `out`
/// `[..., N]`, one floating dtype. Accumulates in at least f32. Its backward
/// is two matmuls and a `sum`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipLinearArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// `[..., K]`.
    pub input: PolychipTensor,
    /// `[N, K]`.
    pub weight: PolychipTensor,
    /// `[N]`; not read when `has_bias` is zero.
    pub bias: PolychipTensor,
    /// `[..., N]`.
    pub out: PolychipTensor,
    /// Nonzero: add `bias`.
    pub has_bias: u8,
}

/// Embedding lookup, `out[i..., :] = weight[indices[i...], :]`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipEmbeddingArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// `[V, H]`, floating.
    pub weight: PolychipTensor,
    /// Any shape, i32 or i64, each in `[0, V)`.
    pub indices: PolychipTensor,
    /// `[indices..., H]`, the dtype of `weight`.
    pub out: PolychipTensor,
}

/// Embedding backward: `grad_weight[indices[i...], :] += grad_out[i..., :]`,
/// accumulating into `grad_weight` (repeated indices add up; accumulate in
/// at least f32 per update).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipEmbeddingBackwardArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// `[indices..., H]`.
    pub grad_out: PolychipTensor,
    /// Any shape, i32 or i64, each in `[0, V)`.
    pub indices: PolychipTensor,
    /// `[V, H]`: accumulated into.
    pub grad_weight: PolychipTensor,
}

/// Mean cross-entropy of `logits` `[N, C]` against class `targets` `[N]`
/// (i32 or i64): `loss = mean over rows with target != ignore_index of
/// (logsumexp(row) - row[target])`, in at least f32. If every row is ignored
/// the loss is NaN. A target outside `[0, C)` that is not `ignore_index` is
/// an `INVALID_ARGUMENT` error.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipCrossEntropyArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// `[N, C]`, floating.
    pub logits: PolychipTensor,
    /// `[N]`, i32 or i64.
    pub targets: PolychipTensor,
    /// 0-dimensional f32.
    pub loss: PolychipTensor,
    /// Rows whose target equals this are skipped (PyTorch's default is -100).
    pub ignore_index: i64,
}

/// Backward of the mean cross-entropy: `grad_logits = grad_loss *
/// (softmax(row) - onehot(target)) / count` for counted rows, 0 for ignored
/// rows, where `count` is the number of rows not ignored.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipCrossEntropyBackwardArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// `[N, C]`.
    pub logits: PolychipTensor,
    /// `[N]`, i32 or i64.
    pub targets: PolychipTensor,
    /// `[N, C]`, the dtype of `logits`.
    pub grad_logits: PolychipTensor,
    /// The gradient of the loss (1 for a loss that is the objective).
    pub grad_loss: f64,
    /// As in the forward pass.
    pub ignore_index: i64,
}

/// One AdamW step, in place, element by element (decoupled weight decay,
/// bias correction):
///
/// ```text
/// p -= lr * weight_decay * p
/// m = beta1 m + (1 - beta1) g
/// v = beta2 v + (1 - beta2) g^2
/// p -= lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
/// ```
///
/// `param` and `grad` share a floating dtype; `exp_avg` (`m`) and
/// `exp_avg_sq` (`v`) are f32; all four have one shape. Computed in at least f32.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipAdamwArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// Parameters, updated.
    pub param: PolychipTensor,
    /// Gradients, read.
    pub grad: PolychipTensor,
    /// First moment, f32, updated.
    pub exp_avg: PolychipTensor,
    /// Second moment, f32, updated.
    pub exp_avg_sq: PolychipTensor,
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// The 1-based step number, for bias correction.
    pub step: i64,
}

/// `tensor *= alpha` in place (gradient clipping).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipScaleArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// Floating tensor, updated.
    pub tensor: PolychipTensor,
    /// The factor.
    pub alpha: f64,
}

//! Arguments of scaled-dot-product attention (ABI 1.1), forward and
//! backward, with grouped-query heads and an optional causal mask.
//!
//! Layout: `q` is `[batch, heads_q, seq_q, D]`, `k` and `v` are
//! `[batch, heads_kv, seq_kv, D]`, with `heads_q` a multiple of `heads_kv`:
//! query head `h` uses key/value head `h / (heads_q / heads_kv)`. With
//! `causal`, query `i` sees keys `j <= i + (seq_kv - seq_q)` (aligned at the
//! end, so equal lengths give the usual lower triangle). A query that sees no
//! key produces zeros and `lse = -inf`. Softmax statistics accumulate in at
//! least f32.

use crate::abi::PolychipTensor;

/// `out = softmax(scale * q k^T + mask) v`, and the log-sum-exp of each
/// scaled, masked row in `lse` (f32 `[batch, heads_q, seq_q]`) for the
/// backward pass.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipAttentionArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// Queries.
    pub q: PolychipTensor,
    /// Keys.
    pub k: PolychipTensor,
    /// Values.
    pub v: PolychipTensor,
    /// `[batch, heads_q, seq_q, D]`, the dtype of `q`.
    pub out: PolychipTensor,
    /// `[batch, heads_q, seq_q]` f32.
    pub lse: PolychipTensor,
    /// Multiplies `q k^T`; usually `1 / sqrt(D)`.
    pub scale: f64,
    /// Nonzero: apply the causal mask.
    pub causal: u8,
}

/// Backward of attention: writes (does not accumulate) `grad_q`, `grad_k`
/// and `grad_v` (the latter two summed over the query heads that share each
/// key/value head), from the forward inputs, `out` and `lse`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipAttentionBackwardArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// Queries.
    pub q: PolychipTensor,
    /// Keys.
    pub k: PolychipTensor,
    /// Values.
    pub v: PolychipTensor,
    /// The forward output.
    pub out: PolychipTensor,
    /// The forward log-sum-exp, f32.
    pub lse: PolychipTensor,
    /// Gradient of `out`.
    pub grad_out: PolychipTensor,
    /// Gradient of `q`.
    pub grad_q: PolychipTensor,
    /// Gradient of `k`.
    pub grad_k: PolychipTensor,
    /// Gradient of `v`.
    pub grad_v: PolychipTensor,
    /// As in the forward pass.
    pub scale: f64,
    /// As in the forward pass.
    pub causal: u8,
}

//! Whose tensors the memory model counts: the training framework a chip's
//! stages run under. Megatron-LM's count (Korthikanti et al. 2022, which
//! DeepSpeed and most PyTorch stacks approximate) is the default; `polychip
//! train`'s own count, tensor by tensor, is [`polychip`]. That count is the
//! one source of both the trainer's check before it trains
//! (`polychip-train`'s `memory.rs`) and the planner's memory for a chip type
//! whose `framework` is `polychip` (the default of clusters seeded from
//! `polychip devices --json`).

use serde::{Deserialize, Serialize};

/// The framework whose memory a chip type's stages are counted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Framework {
    /// Megatron-LM's activations (`34 s b h` per layer and the score
    /// terms), logits and workspace as `crate::cost` prices them.
    #[default]
    Megatron,
    /// `polychip train`'s tensors ([`polychip`]).
    Polychip,
}

impl Framework {
    /// Its name in a cluster file.
    pub fn name(self) -> &'static str {
        match self {
            Framework::Megatron => "megatron",
            Framework::Polychip => "polychip",
        }
    }
}

/// What `polychip train` allocates, counted from the tensors its model
/// keeps (`train/src/model`): every figure in bytes, for `tokens` tokens
/// (sequences times sequence length) of a micro-batch and `c` bytes per
/// element of the compute dtype.
pub mod polychip {
    /// The sizes of a model the counts need.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Shape {
        /// Hidden size.
        pub hidden: u64,
        /// Width of the keys and of the values (kv heads times head size).
        pub kv_dim: u64,
        /// FFN inner width.
        pub ffn: u64,
        /// Attention heads.
        pub heads: u64,
        /// Vocabulary size.
        pub vocab: u64,
    }

    /// Bytes per parameter of the weights, the gradients and the rest of
    /// the AdamW state: the compute-dtype copy the kernels read (in f32 the
    /// value itself), the gradient in the compute dtype plus, mixed, an f32
    /// one, and the moments plus, mixed, the f32 value: `[4, 4, 8]` in f32,
    /// `[2, 6, 12]` in bf16.
    pub fn state_bytes(c: u64) -> [u64; 3] {
        let mixed = c < 4;
        [
            c,
            c + if mixed { 4 } else { 0 },
            8 + if mixed { 4 } else { 0 },
        ]
    }

    /// Their sum: `12 + c`, `+ 6` mixed.
    pub fn state_bytes_per_param(c: u64) -> u64 {
        state_bytes(c).iter().sum()
    }

    /// What one block keeps for its backward per micro-batch: its two
    /// halves' ([`attention_bytes`] and [`feed_forward_bytes`]).
    pub fn block_bytes(s: Shape, tokens: u64, c: u64) -> u64 {
        attention_bytes(s, tokens, c) + feed_forward_bytes(s, tokens, c)
    }

    /// What a block's attention half keeps: its input, the norm's output,
    /// q, k, v and the attention output in the compute dtype, the norm's
    /// inverse scale and the attention's log-sum-exp per head in f32.
    pub fn attention_bytes(s: Shape, tokens: u64, c: u64) -> u64 {
        tokens * (4 * s.hidden + 2 * s.kv_dim) * c + tokens * (1 + s.heads) * 4
    }

    /// What a block's feed-forward half keeps: its input (the attention
    /// half's residual), the norm's output, gate, up and their product in
    /// the compute dtype, and the norm's inverse scale in f32.
    pub fn feed_forward_bytes(s: Shape, tokens: u64, c: u64) -> u64 {
        tokens * (2 * s.hidden + 3 * s.ffn) * c + tokens * 4
    }

    /// What every stage keeps per micro-batch besides its blocks: the
    /// token ids (or targets) as i32.
    pub fn micro_batch_bytes(tokens: u64) -> u64 {
        tokens * 4
    }

    /// What the stage holding the head keeps per micro-batch: the final
    /// norm's input and output and the logits in the compute dtype, the
    /// norm's inverse scale and the loss's log-sum-exp in f32.
    pub fn head_bytes(s: Shape, tokens: u64, c: u64) -> u64 {
        tokens * (2 * s.hidden + s.vocab) * c + tokens * 8
    }

    /// The largest transient buffers of one pass, on every stage: three of
    /// the wider of the FFN and the vocabulary and four of the hidden size,
    /// per token.
    pub fn transient_bytes(s: Shape, tokens: u64, c: u64) -> u64 {
        tokens * (3 * s.ffn.max(s.vocab) + 4 * s.hidden) * c
    }
}

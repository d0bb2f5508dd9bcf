//! LLaMA-family model shapes: layers, hidden size, SwiGLU FFN width, heads
//! and grouped-query KV heads, vocabulary and sequence length, read from TOML
//! or taken from a preset; their parameter counts and their FLOPs, using
//! Megatron-LM's formula (see `../shared/ANCHORS.md`, "Planning"):
//! `F = 12 B s L h^2 (1 + g/a + (3/2) f/h + s/h + V/(2 L h))` per iteration
//! without recomputation, which is three times the forward pass (backward
//! costs twice the forward).

use std::ops::Range;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{SpecError, read_file};

/// The shape of a decoder-only LLaMA-family transformer: RMSNorm before
/// attention and FFN, grouped-query attention, a SwiGLU FFN, untied input
/// embedding and output head. Its `Default` is every size 0 and every
/// option off: not a model ([`ModelSpec::validate`] refuses it), the base
/// a literal's `..Default::default()` leaves the options at.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// A name for reports.
    pub name: String,
    /// Transformer layers (`L`).
    pub layers: u64,
    /// Hidden size (`h`).
    pub hidden: u64,
    /// FFN inner width of the SwiGLU block (`f`).
    pub ffn: u64,
    /// Attention heads (`a`).
    pub heads: u64,
    /// Key/value heads (`g`, the GQA groups; equal to `heads` without GQA).
    pub kv_heads: u64,
    /// Vocabulary size (`V`).
    pub vocab: u64,
    /// Sequence length in tokens (`s`).
    pub seq_len: u64,
    /// The output head is the input embedding's table (`tie_word_embeddings`
    /// of Hugging Face configs; GPT-2, OPT, BLOOM, Gemma): a chip that holds
    /// both ends holds the table once. Megatron-LM keeps a copy on the
    /// last stage of a pipeline and reduces the two copies' gradients, so
    /// a pipeline of several stages holds it twice, as untied. Off by
    /// default.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tied_embeddings: bool,
    /// Routed experts of every layer's feed-forward block: 0 (the
    /// default) for a dense model; 2 or more make each block a mixture of
    /// experts (Mixtral, Qwen-MoE, OLMoE, GPT-OSS): a router (`h x E`),
    /// `experts` SwiGLU experts of width `ffn` each, of which each token
    /// runs `experts_per_token`, and a shared expert of width
    /// `shared_ffn` that every token runs. Every layer is alike (a model
    /// mixing dense and expert layers is not described).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub experts: u64,
    /// Experts each token is routed to (top-k); with `experts` only.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub experts_per_token: u64,
    /// Width of the shared experts (summed) every token runs beside its
    /// routed ones (Qwen2-MoE, DeepSeek); 0: none. With `experts` only.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shared_ffn: u64,
    /// Width of one attention head where it is not `hidden / heads`
    /// (Qwen3's 128 at hidden 2048 and 32 heads, Gemma 7B's 256 at 3072
    /// and 16): the queries are `heads * head_dim` wide, the keys and
    /// values `kv_heads * head_dim`. 0 (the default): `hidden / heads`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub head_dim: u64,
    /// Of a mixture of experts, the first `dense_layers` layers are dense:
    /// a SwiGLU MLP of width `dense_ffn` where the others have the
    /// router and experts (DeepSeek-V2 and V3's and GLM-4.5's
    /// `first_k_dense_replace`, Kimi K2's, ERNIE 4.5's
    /// `moe_layer_start_index`). 0 (the default): every layer a mixture.
    /// Dense layers among the expert ones in a period (Llama 4 Maverick's
    /// alternate ones): [`Self::moe_layer_step`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dense_layers: u64,
    /// The MLP width of the `dense_layers` dense layers; with them only.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dense_ffn: u64,
    /// Of a mixture of experts, after its dense first layers, every
    /// `moe_layer_step`-th layer is an expert one, those whose index is
    /// `moe_layer_offset` modulo the step, and the others dense (of
    /// `dense_ffn`): Llama 4 Maverick's every other layer (step 2, offset
    /// 1: `interleave_moe_layer_step`), Qwen-MoE's `decoder_sparse_step`,
    /// DeepSeek's `moe_layer_freq`, Megatron-LM's `--moe-layer-freq`. 0 or
    /// 1 (the default): every layer after the dense ones.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub moe_layer_step: u64,
    /// See [`Self::moe_layer_step`]; below the step.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub moe_layer_offset: u64,
    /// Multi-head latent attention (DeepSeek-V2 and V3, Kimi K2): the keys
    /// and values come up from a latent of this width (`h x (r_kv +
    /// rope_head_dim)` down, a norm, `r_kv x a (head_dim -
    /// rope_head_dim + v_head_dim)` up), every head its own (`kv_heads` =
    /// `heads`). 0 (the default): grouped-query attention.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kv_lora_rank: u64,
    /// Under latent attention, the queries' latent width (`h x r_q` down,
    /// a norm, `r_q x a head_dim` up); 0: projected directly (DeepSeek-V2
    /// Lite).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub q_lora_rank: u64,
    /// Under latent attention, the rotary part of `head_dim` (the queries'
    /// and keys' width, DeepSeek's `qk_nope_head_dim + qk_rope_head_dim`),
    /// whose key part all heads share.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rope_head_dim: u64,
    /// Under latent attention, the values' head width where it is not
    /// `head_dim` (DeepSeek's `v_head_dim`); 0: `head_dim`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub v_head_dim: u64,
    /// Multi-token-prediction layers trained beside the model (DeepSeek-V3's
    /// and GLM-4.5's `num_nextn_predict_layers`, Megatron-LM's
    /// `--mtp-num-layers`): each runs after the last layer, on the stage
    /// that holds the head, a projection of the hidden state and the next
    /// token's embedding (`2h` to `h`, two RMSNorms before it and one
    /// after), a transformer layer like the last one, and the output head
    /// again with its loss. The planner counts its layer among the last
    /// stage's ([`Self::stage_layers`]: layers `layers..layers + mtp`) and
    /// the rest with the head ([`Self::head_params`],
    /// [`Self::head_forward_flops`]). 0 (the default): none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mtp_layers: u64,
    /// Attention over a sliding window of the last `sliding_window` keys
    /// (Mistral 7B v0.1's 4,096 on every layer, Gemma 2's and GPT-OSS's on
    /// every other layer, Gemma 3's on five of six), on `window_layers` of
    /// the layers. Priced by the keys each query attends
    /// ([`Self::attention_span`]); Megatron-LM's FLOP count and the
    /// activations stay full attention's. 0 (the default): full.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sliding_window: u64,
    /// Attention within chunks of `attention_chunk` tokens (Llama 4's
    /// chunked layers: a query attends the keys of its chunk before it),
    /// on `window_layers` of the layers; priced as
    /// [`Self::sliding_window`] is. Not beside a sliding window.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attention_chunk: u64,
    /// How many layers attend over [`Self::sliding_window`] or within
    /// [`Self::attention_chunk`] (spread among the others: each stage is
    /// priced at their mean); 0 with a window or chunks: every layer.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub window_layers: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The largest value each size of a model may take: far beyond any model
/// trained today (Llama 3 405B: 126 layers, hidden 16384, FFN 53248, 128
/// heads, vocabulary 128256, sequences of 8192 to 131072), small enough
/// that every count and FLOP figure of the planner stays exact in `u64`
/// and finite in `f64`.
pub const MODEL_LIMITS: [(&str, u64); 7] = [
    // Eight times Llama 3 405B's 126: the search over a 2^20-chip cluster
    // takes half a minute at this depth (ten minutes and more at 10,000).
    ("layers", 1024),
    ("hidden", 1 << 20),
    ("ffn", 1 << 22),
    ("heads", 1 << 16),
    ("kv_heads", 1 << 16),
    ("vocab", 1 << 24),
    ("seq_len", 1 << 20),
];

/// The most routed experts a layer may have ([`ModelSpec::experts`]):
/// far beyond today's (DeepSeek-V3's 256, Qwen3's 128).
pub const MAX_EXPERTS: u64 = 1 << 16;

/// The most multi-token-prediction layers a model may give
/// ([`ModelSpec::mtp_layers`]; DeepSeek-V3 trains 1, MiMo 1 to 3).
pub const MAX_MTP_LAYERS: u64 = 16;

/// The preset names that [`ModelSpec::preset`] knows.
pub const PRESETS: [&str; 5] = [
    "llama-7b",
    "llama-13b",
    "llama-70b",
    "h2-100b",
    "mixtral-8x7b",
];

impl ModelSpec {
    fn new(name: &str, layers: u64, hidden: u64, ffn: u64, heads: u64, kv: u64) -> Self {
        ModelSpec {
            name: name.to_string(),
            layers,
            hidden,
            ffn,
            heads,
            kv_heads: kv,
            vocab: 32000,
            seq_len: 4096,
            ..Default::default()
        }
    }

    /// Llama 2 7B: 32 layers, hidden 4096, FFN 11008, 32 heads (no GQA),
    /// vocabulary 32000, sequence 4096 (Touvron et al. 2023, Llama 2).
    pub fn llama_7b() -> Self {
        Self::new("llama-7b", 32, 4096, 11008, 32, 32)
    }

    /// Llama 2 13B: 40 layers, hidden 5120, FFN 13824, 40 heads (no GQA),
    /// vocabulary 32000, sequence 4096 (Llama 2).
    pub fn llama_13b() -> Self {
        Self::new("llama-13b", 40, 5120, 13824, 40, 40)
    }

    /// Llama 2 70B: 80 layers, hidden 8192, FFN 28672, 64 heads, 8 KV heads,
    /// vocabulary 32000, sequence 4096 (Llama 2). This is the shape of the
    /// ANCHORS.md check: 68.98e9 parameters, 4.45e11 FLOPs per token.
    pub fn llama_70b() -> Self {
        Self::new("llama-70b", 80, 8192, 28672, 64, 8)
    }

    /// H2's 100B model: 96 layers, hidden 8192, 64 heads, FFN 36864,
    /// sequence 4096, as issue 5 gives it (China Mobile's H2 paper).
    ///
    /// Neither source gives the KV heads or the vocabulary. Our choice:
    /// 8 KV heads and a 32000-token vocabulary, the values of Llama 2 70B,
    /// whose hidden size and head count this shape shares (it is a deeper,
    /// wider-FFN version of it). That gives about 102.0e9 parameters.
    pub fn h2_100b() -> Self {
        Self::new("h2-100b", 96, 8192, 36864, 64, 8)
    }

    /// Mixtral 8x7B (Jiang et al. 2024): Mistral 7B's 32 layers of hidden
    /// 4096, 32 heads and 8 KV heads, each feed-forward block 8 SwiGLU
    /// experts of width 14336 of which each token runs 2; vocabulary
    /// 32000, sequences of 4096 here. 46.7e9 parameters, 12.9e9 of them
    /// active for a token.
    pub fn mixtral_8x7b() -> Self {
        ModelSpec {
            experts: 8,
            experts_per_token: 2,
            ..Self::new("mixtral-8x7b", 32, 4096, 14336, 32, 8)
        }
    }

    /// A preset by name (one of [`PRESETS`]; `_` may stand for `-`, case
    /// does not matter).
    pub fn preset(name: &str) -> Result<Self, SpecError> {
        match name.to_ascii_lowercase().replace('_', "-").as_str() {
            "llama-7b" => Ok(Self::llama_7b()),
            "llama-13b" => Ok(Self::llama_13b()),
            "llama-70b" => Ok(Self::llama_70b()),
            "h2-100b" => Ok(Self::h2_100b()),
            "mixtral-8x7b" => Ok(Self::mixtral_8x7b()),
            _ => Err(SpecError::UnknownPreset(name.to_string())),
        }
    }

    /// Parses and validates a model from TOML text.
    pub fn from_toml_str(text: &str) -> Result<Self, SpecError> {
        let model: ModelSpec = toml::from_str(text).map_err(|e| SpecError::Toml {
            what: "model",
            message: polychip_files::toml_error(text, &e),
        })?;
        model.validate()?;
        Ok(model)
    }

    /// Reads, parses and validates a model TOML file.
    pub fn load(path: &Path) -> Result<Self, SpecError> {
        Self::from_toml_str(&read_file(path)?).map_err(|e| SpecError::InFile {
            path: path.to_path_buf(),
            source: Box::new(e),
        })
    }

    /// Checks that every size is positive and at most its
    /// [`MODEL_LIMITS`] bound, and the heads split evenly.
    pub fn validate(&self) -> Result<(), SpecError> {
        let bad = |problem: String| SpecError::Model {
            model: self.name.clone(),
            problem,
        };
        let values = [
            self.layers,
            self.hidden,
            self.ffn,
            self.heads,
            self.kv_heads,
            self.vocab,
            self.seq_len,
        ];
        for ((field, limit), value) in MODEL_LIMITS.into_iter().zip(values) {
            if value == 0 {
                return Err(bad(format!("{field} is 0; it must be at least 1")));
            }
            if value > limit {
                return Err(bad(format!(
                    "{field} is {value}, more than the planner accepts ({limit})"
                )));
            }
        }
        if self.head_dim == 0 && self.hidden % self.heads != 0 {
            return Err(bad(format!(
                "heads {} does not divide hidden {} (give head_dim where the heads are not \
                 hidden / heads wide)",
                self.heads, self.hidden
            )));
        }
        let head_limit = MODEL_LIMITS[1].1;
        if self.head_dim > head_limit {
            return Err(bad(format!(
                "head_dim is {}, more than the planner accepts ({head_limit})",
                self.head_dim
            )));
        }
        if self.heads % self.kv_heads != 0 {
            return Err(bad(format!(
                "kv_heads {} does not divide heads {}",
                self.kv_heads, self.heads
            )));
        }
        self.check_experts().map_err(bad)?;
        self.check_latent().map_err(bad)?;
        if self.sliding_window > 0 && self.attention_chunk > 0 {
            return Err(bad(format!(
                "sliding_window {} and attention_chunk {} are both given; the planner prices \
                 one of them on the window_layers",
                self.sliding_window, self.attention_chunk
            )));
        }
        if self.window_layers > 0 && self.sliding_window == 0 && self.attention_chunk == 0 {
            return Err(bad(format!(
                "window_layers is {} without sliding_window or attention_chunk; give the \
                 window's or the chunks' width in tokens",
                self.window_layers
            )));
        }
        if self.window_layers > self.layers {
            return Err(bad(format!(
                "window_layers is {} of the model's {} layers",
                self.window_layers, self.layers
            )));
        }
        if self.mtp_layers > MAX_MTP_LAYERS {
            return Err(bad(format!(
                "mtp_layers is {}, more than the planner accepts ({MAX_MTP_LAYERS})",
                self.mtp_layers
            )));
        }
        if self.checked_total_params().is_none() {
            return Err(bad("its parameter count does not fit in 64 bits".into()));
        }
        Ok(())
    }

    /// Checks the mixture of experts' fields: none for a dense model;
    /// 2 to [`MAX_EXPERTS`] experts, each token routed to 1 to all of
    /// them, a shared expert of at most the `ffn` limit's width.
    fn check_experts(&self) -> Result<(), String> {
        let (e, k, shared) = (self.experts, self.experts_per_token, self.shared_ffn);
        if e == 0 {
            if self.dense_layers > 0 || self.dense_ffn > 0 {
                return Err(format!(
                    "dense_layers {} and dense_ffn {} are given without experts; they say which \
                     layers of a mixture of experts are dense (every layer of a dense model is)",
                    self.dense_layers, self.dense_ffn
                ));
            }
            if self.moe_layer_step > 1 || self.moe_layer_offset > 0 {
                return Err(format!(
                    "moe_layer_step {} and moe_layer_offset {} are given without experts; they \
                     say which layers of a mixture of experts are expert ones",
                    self.moe_layer_step, self.moe_layer_offset
                ));
            }
            return match (k, shared) {
                (0, 0) => Ok(()),
                (0, _) => Err(format!(
                    "shared_ffn is {shared} without experts; a shared expert belongs to a \
                     mixture of experts (give experts and experts_per_token)"
                )),
                _ => Err(format!(
                    "experts_per_token is {k} without experts; give experts (the routed experts \
                     of a layer) too, or neither for a dense model"
                )),
            };
        }
        if e == 1 {
            return Err(
                "experts is 1; give 0 for a dense model or the routed experts of a layer \
                 (at least 2)"
                    .into(),
            );
        }
        if e > MAX_EXPERTS {
            return Err(format!(
                "experts is {e}, more than the planner accepts ({MAX_EXPERTS})"
            ));
        }
        if k == 0 || k > e {
            return Err(format!(
                "experts_per_token is {k}; each token runs 1 to {e} of the layer's {e} experts"
            ));
        }
        let ffn_limit = MODEL_LIMITS[2].1;
        if shared > ffn_limit {
            return Err(format!(
                "shared_ffn is {shared}, more than the planner accepts ({ffn_limit})"
            ));
        }
        let (dense, dense_ffn) = (self.dense_layers, self.dense_ffn);
        if dense >= self.layers {
            return Err(format!(
                "dense_layers is {dense} of the model's {} layers; a mixture of experts has at \
                 least one layer of experts (give experts = 0 for a dense model)",
                self.layers
            ));
        }
        let (step, offset) = (self.moe_step(), self.moe_layer_offset);
        if offset >= step {
            return Err(format!(
                "moe_layer_offset is {offset}, not below moe_layer_step {step} (the expert \
                 layers are those whose index is the offset modulo the step)"
            ));
        }
        if self.expert_layers_before(self.layers) == 0 {
            return Err(format!(
                "no layer of the model's {} is an expert one (past dense_layers {dense}, those \
                 whose index is moe_layer_offset {offset} modulo moe_layer_step {step}); give \
                 experts = 0 for a dense model",
                self.layers
            ));
        }
        // Dense layers among the expert ones count as dense layers here.
        match (dense > 0 || step > 1, dense_ffn) {
            (false, 0) => {}
            (false, f) => {
                return Err(format!(
                    "dense_ffn is {f} without dense_layers; give how many of the first layers \
                     are dense"
                ));
            }
            (true, 0) if dense > 0 => {
                return Err(format!(
                    "dense_layers is {dense} without dense_ffn; give the dense layers' MLP width"
                ));
            }
            (true, 0) => {
                return Err(format!(
                    "moe_layer_step is {step}, so the layers between the expert ones are dense, \
                     but dense_ffn is not given; give the dense layers' MLP width"
                ));
            }
            (_, f) if f > ffn_limit => {
                return Err(format!(
                    "dense_ffn is {f}, more than the planner accepts ({ffn_limit})"
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// Checks latent attention's fields: none without `kv_lora_rank`;
    /// with it every head its own keys and values, a rotary part within
    /// `head_dim`, each width at most the `hidden` limit.
    fn check_latent(&self) -> Result<(), String> {
        let fields = [
            ("kv_lora_rank", self.kv_lora_rank),
            ("q_lora_rank", self.q_lora_rank),
            ("rope_head_dim", self.rope_head_dim),
            ("v_head_dim", self.v_head_dim),
        ];
        if !self.is_mla() {
            return match fields.iter().find(|(_, v)| *v > 0) {
                None => Ok(()),
                Some((name, v)) => Err(format!(
                    "{name} is {v} without kv_lora_rank; it belongs to multi-head latent \
                     attention (give kv_lora_rank, the keys' and values' latent width)"
                )),
            };
        }
        let limit = MODEL_LIMITS[1].1;
        if let Some((name, v)) = fields.iter().find(|(_, v)| *v > limit) {
            return Err(format!(
                "{name} is {v}, more than the planner accepts ({limit})"
            ));
        }
        if self.kv_heads != self.heads {
            return Err(format!(
                "kv_heads is {} of {} heads, but latent attention gives every head its own \
                 keys and values: give kv_heads = heads",
                self.kv_heads, self.heads
            ));
        }
        if self.rope_head_dim > self.head_dim() {
            return Err(format!(
                "rope_head_dim {} is more than head_dim {}, of which it is the rotary part",
                self.rope_head_dim,
                self.head_dim()
            ));
        }
        Ok(())
    }

    /// Whether its attention is multi-head latent attention
    /// ([`Self::kv_lora_rank`]).
    #[inline]
    pub fn is_mla(&self) -> bool {
        self.kv_lora_rank > 0
    }

    /// Whether its feed-forward blocks are mixtures of experts.
    #[inline]
    pub fn is_moe(&self) -> bool {
        self.experts >= 2
    }

    /// The feed-forward width each token runs: `ffn` (dense), or its
    /// experts' `k f` plus the shared expert's width.
    #[inline]
    pub fn active_ffn(&self) -> u64 {
        match self.is_moe() {
            true => self.experts_per_token * self.ffn + self.shared_ffn,
            false => self.ffn,
        }
    }

    /// How many of `range`'s layers are dense in a mixture of experts
    /// with dense layers ([`Self::dense_layers`], the first ones, and
    /// those between expert ones, [`Self::moe_layer_step`]); 0 otherwise.
    #[inline]
    pub fn dense_layers_in(&self, range: &Range<u64>) -> u64 {
        if self.moe_layer_step <= 1 {
            let end = self.dense_layers.min(range.end);
            return end.saturating_sub(range.start);
        }
        self.alternating_dense_layers_in(range)
    }

    /// [`Self::dense_layers_in`] of a mixture whose expert layers have a
    /// step, out of line (the search's inner loop counts stages of every
    /// layer alike).
    #[cold]
    #[inline(never)]
    fn alternating_dense_layers_in(&self, range: &Range<u64>) -> u64 {
        let n = range.end.saturating_sub(range.start);
        n - (self.expert_layers_before(range.end) - self.expert_layers_before(range.start)).min(n)
    }

    /// The step between a mixture's expert layers ([`Self::moe_layer_step`],
    /// at least 1).
    #[inline]
    pub fn moe_step(&self) -> u64 {
        self.moe_layer_step.max(1)
    }

    /// Whether the model has dense layers beside its expert ones: first
    /// ones, or between them.
    #[inline]
    pub fn has_dense_layers(&self) -> bool {
        // (A dense model's are 0 and 1, as validation checks.)
        (self.dense_layers > 0 || self.moe_layer_step > 1) && self.is_moe()
    }

    /// Whether layer `i` runs the experts: one past the dense first layers
    /// whose index is [`Self::moe_layer_offset`] modulo the step; past the
    /// last layer (multi-token prediction's), as the last layer does.
    pub fn is_expert_layer(&self, i: u64) -> bool {
        let i = i.min(self.layers.saturating_sub(1));
        self.is_moe() && i >= self.dense_layers && i % self.moe_step() == self.moe_layer_offset
    }

    /// A mixture's expert layers among the layers `0..n` (those past the
    /// last, multi-token prediction's, of the last layer's kind).
    pub fn expert_layers_before(&self, n: u64) -> u64 {
        let (step, offset) = (self.moe_step(), self.moe_layer_offset);
        let below = |x: u64| x / step + u64::from(x % step > offset);
        let within = n.min(self.layers);
        let main = below(within).saturating_sub(below(self.dense_layers.min(within)));
        let past = n - within;
        main + match past > 0 && self.is_expert_layer(self.layers.saturating_sub(1)) {
            true => past,
            false => 0,
        }
    }

    /// The model of one of its [`Self::dense_layers`]: its attention, and a
    /// dense MLP of `dense_ffn` in place of the experts. `None` where every
    /// layer is alike.
    pub fn dense_layer_model(&self) -> Option<ModelSpec> {
        // (Field by field: a clone would copy the name, and the search
        // prices layers in its inner loop.)
        self.has_dense_layers().then(|| ModelSpec {
            name: String::new(),
            layers: self.layers,
            hidden: self.hidden,
            ffn: self.dense_ffn,
            heads: self.heads,
            kv_heads: self.kv_heads,
            vocab: self.vocab,
            seq_len: self.seq_len,
            tied_embeddings: self.tied_embeddings,
            experts: 0,
            experts_per_token: 0,
            shared_ffn: 0,
            head_dim: self.head_dim,
            dense_layers: 0,
            dense_ffn: 0,
            moe_layer_step: 0,
            moe_layer_offset: 0,
            kv_lora_rank: self.kv_lora_rank,
            q_lora_rank: self.q_lora_rank,
            rope_head_dim: self.rope_head_dim,
            v_head_dim: self.v_head_dim,
            mtp_layers: 0,
            sliding_window: self.sliding_window,
            attention_chunk: self.attention_chunk,
            window_layers: self.window_layers,
        })
    }

    /// `range`'s layers by kind, each kind's model beside its count: the
    /// dense layers of a mixture of experts that has some
    /// ([`Self::dense_layer_model`]), and the others (this model's).
    pub fn layer_kinds(&self, range: &Range<u64>) -> LayerKinds<'_> {
        let n = range.end.saturating_sub(range.start);
        let dense = self.dense_layers_in(range);
        LayerKinds {
            dense: self.dense_layer_model().map(|m| (m, dense)),
            rest: (self, n - dense),
        }
    }

    /// Parameters of the layers `range` (without the embedding or head).
    #[inline]
    pub fn layers_params(&self, range: &Range<u64>) -> u64 {
        // (The search's inner loop counts stages of every layer alike:
        // the kinds out of line.)
        if !self.has_dense_layers() {
            return range.end.saturating_sub(range.start) * self.layer_params();
        }
        self.mixed_layers_params(range)
    }

    #[cold]
    #[inline(never)]
    fn mixed_layers_params(&self, range: &Range<u64>) -> u64 {
        self.layer_kinds(range)
            .iter()
            .map(|(m, n)| n * m.layer_params())
            .sum()
    }

    /// The layers of `range` whose feed-forward block is a mixture of
    /// experts (0 for a dense model).
    #[inline]
    pub fn expert_layers_in(&self, range: &Range<u64>) -> u64 {
        match self.is_moe() {
            true => range.end.saturating_sub(range.start) - self.dense_layers_in(range),
            false => 0,
        }
    }

    /// [`Self::total_params`] with every product and sum checked: `None`
    /// when it overflows `u64` (never within [`MODEL_LIMITS`]).
    pub fn checked_total_params(&self) -> Option<u64> {
        let h = self.hidden;
        // (Within the fields' limits, which are checked first, one layer's
        // attention stays under 2^60.)
        let attention = self.attention_params();
        let copies = if self.is_moe() { self.experts } else { 1 };
        let ffn = h
            .checked_mul(self.ffn)?
            .checked_mul(3)?
            .checked_mul(copies)?
            .checked_add(h.checked_mul(self.shared_ffn)?.checked_mul(3)?)?
            .checked_add(h.checked_mul(if self.is_moe() { self.experts } else { 0 })?)?;
        let layer = attention.checked_add(ffn)?.checked_add(h.checked_mul(2)?)?;
        let dense = h.checked_mul(self.dense_ffn)?.checked_mul(3)?;
        let dense_layer = attention
            .checked_add(dense)?
            .checked_add(h.checked_mul(2)?)?;
        let vh = self.vocab.checked_mul(h)?;
        let tables = if self.tied_embeddings { 1 } else { 2 };
        // (Multi-token prediction's layers are of the last one's kind.)
        let all = self.layers.checked_add(self.mtp_layers)?;
        let dense = self.dense_layers_in(&(0..all));
        let rest = all.checked_sub(dense)?;
        let mtp = h
            .checked_mul(h)?
            .checked_mul(2)?
            .checked_add(h.checked_mul(3)?)?
            .checked_mul(self.mtp_layers)?;
        rest.checked_mul(layer)?
            .checked_add(dense.checked_mul(dense_layer)?)?
            .checked_add(vh.checked_mul(tables)?)?
            .checked_add(h)?
            .checked_add(mtp)
    }

    /// Width of the key (and of the value) projection: `h * g / a`.
    /// Whether tensor parallelism of degree `tp` splits this model's layers
    /// as Megatron splits them: whole attention heads and key/value heads
    /// per chip. (Not the feed-forward width: a model described by its
    /// FLOPs, a GPT's 4h MLP as a SwiGLU of 8h/3 columns, need not divide;
    /// frameworks pad it.)
    pub fn tp_splits(&self, tp: u64) -> bool {
        tp > 0 && self.heads % tp == 0 && self.kv_heads % tp == 0
    }

    /// Why tensor parallelism of degree `tp` cannot split this model's
    /// layers (`None`: it can; see [`ModelSpec::tp_splits`]).
    pub fn tp_refusal(&self, tp: u64) -> Option<String> {
        (!self.tp_splits(tp)).then(|| {
            format!(
                "tp {tp} does not divide the model's {} attention heads and {} key/value \
                 heads (Megatron-style tensor parallelism gives each chip whole heads, and \
                 refuses such a degree)",
                self.heads, self.kv_heads
            )
        })
    }

    /// Width of the keys: `kv_heads * head_dim`
    /// ([`Self::attention_widths`]).
    #[inline]
    pub fn kv_dim(&self) -> u64 {
        self.attention_widths().kv
    }

    /// Width of the queries: `heads * head_dim`, `h` unless `head_dim`
    /// says otherwise ([`Self::attention_widths`]).
    #[inline]
    pub fn q_dim(&self) -> u64 {
        self.attention_widths().q
    }

    /// The attention's widths, from the heads' and the value heads' widths
    /// computed once (the search prices layers in its inner loop): the
    /// queries' `heads * head_dim`, the keys' `kv_heads * head_dim`, the
    /// values' `kv_heads * v_head_dim` and the context's `heads *
    /// v_head_dim`.
    #[inline]
    pub fn attention_widths(&self) -> AttentionWidths {
        let (d, dv) = (self.head_dim(), self.v_head_dim());
        AttentionWidths {
            q: self.heads * d,
            kv: self.kv_heads * d,
            v: self.kv_heads * dv,
            context: self.heads * dv,
        }
    }

    /// A value head's width: `v_head_dim` (latent attention's), else
    /// `head_dim`.
    #[inline]
    pub fn v_head_dim(&self) -> u64 {
        match self.v_head_dim {
            0 => self.head_dim(),
            d => d,
        }
    }

    /// Width of the values ([`Self::attention_widths`]): [`Self::kv_dim`]
    /// unless latent attention's values are narrower than its keys.
    #[inline]
    pub fn v_dim(&self) -> u64 {
        self.attention_widths().v
    }

    /// Width of the attention's output before its projection
    /// ([`Self::attention_widths`]): [`Self::q_dim`] unless the values are
    /// narrower.
    #[inline]
    pub fn context_dim(&self) -> u64 {
        self.attention_widths().context
    }

    /// Input embedding parameters: `V h`.
    #[inline]
    pub fn embedding_params(&self) -> u64 {
        self.vocab * self.hidden
    }

    /// The attention's weight matrices of one layer, in parameters: Q and
    /// O `h*q` each, K and V `h*kv` each (no biases; `q = h` and `kv = h
    /// g/a` unless `head_dim` says otherwise). Under latent attention: the
    /// queries' `h r_q + r_q a d` (or `h a d` without a query latent), the
    /// keys' and values' down projection `h (r_kv + d_r)` and up projection
    /// `r_kv a (d - d_r + d_v)`, the output's `a d_v h` (`d` the head's
    /// width, `d_r` its rotary part, `d_v` a value head's).
    #[inline]
    pub fn attention_weights(&self) -> u64 {
        let h = self.hidden;
        let AttentionWidths { q, kv, v, context } = self.attention_widths();
        if !self.is_mla() {
            return h * (q + kv + v) + context * h;
        }
        let (rq, rkv, rope) = (self.q_lora_rank, self.kv_lora_rank, self.rope_head_dim);
        let queries = match rq {
            0 => h * q,
            r => h * r + r * q,
        };
        let nope = self.head_dim().saturating_sub(rope);
        queries + h * (rkv + rope) + rkv * self.heads * (nope + self.v_head_dim()) + context * h
    }

    /// The parameters of one layer that tensor parallelism does not split,
    /// whole on each chip of its group: latent attention's down projections
    /// and their norms, `h (r_q + r_kv + d_r) + r_q + r_kv` (Megatron-LM
    /// builds them duplicated); 0 otherwise (a layer's other norms, `2 h`,
    /// are counted split with the rest).
    #[inline]
    pub fn replicated_layer_params(&self) -> u64 {
        match self.is_mla() {
            true => {
                let (rq, rkv) = (self.q_lora_rank, self.kv_lora_rank);
                self.hidden * (rq + rkv + self.rope_head_dim) + rq + rkv
            }
            false => 0,
        }
    }

    /// Attention parameters of one layer: its weights
    /// ([`Self::attention_weights`]) and, under latent attention, its
    /// latents' norms (`r_q + r_kv`).
    #[inline]
    pub fn attention_params(&self) -> u64 {
        self.attention_weights() + self.q_lora_rank + self.kv_lora_rank
    }

    /// FFN parameters of one layer: a SwiGLU's gate, up and down, `3 h
    /// f`; in a mixture of experts, its experts' ([`Self::expert_params`]),
    /// the shared expert's `3 h f_s` and the router's `h E`.
    #[inline]
    pub fn ffn_params(&self) -> u64 {
        match self.is_moe() {
            true => {
                let h = self.hidden;
                self.expert_params() + 3 * h * self.shared_ffn + h * self.experts
            }
            false => 3 * self.hidden * self.ffn,
        }
    }

    /// The routed experts' parameters of one layer, `3 h f E` (0 for a
    /// dense model): what expert parallelism divides over its group.
    #[inline]
    pub fn expert_params(&self) -> u64 {
        match self.is_moe() {
            true => 3 * self.hidden * self.ffn * self.experts,
            false => 0,
        }
    }

    /// RMSNorm parameters of one layer (before attention and before the
    /// FFN): `2 h`.
    #[inline]
    pub fn layer_norm_params(&self) -> u64 {
        2 * self.hidden
    }

    /// All parameters of one transformer layer.
    #[inline]
    pub fn layer_params(&self) -> u64 {
        self.attention_params() + self.ffn_params() + self.layer_norm_params()
    }

    /// The output side: final RMSNorm (`h`) and the untied output head
    /// (`V h`), and each multi-token-prediction layer's projection and
    /// norms (`2 h^2 + 3 h`; its transformer layer is one of
    /// [`Self::stage_layers`]).
    #[inline]
    pub fn head_params(&self) -> u64 {
        let h = self.hidden;
        h + self.vocab * h + self.mtp_layers * (2 * h * h + 3 * h)
    }

    /// The layers a stage of the layers `range` runs: those, and after the
    /// last layer, on the stage holding the head (`head`), the
    /// multi-token-prediction layers ([`Self::mtp_layers`]) as layers
    /// `layers..layers + mtp`, of the last layer's kind.
    #[inline]
    pub fn stage_layers(&self, range: Range<u64>, head: bool) -> Range<u64> {
        match head {
            true => range.start..range.end + self.mtp_layers,
            false => range,
        }
    }

    /// Every parameter: embedding, all layers (multi-token prediction's
    /// too), final norm and head (the table once when tied).
    pub fn total_params(&self) -> u64 {
        self.embedding_params()
            + self.layers_params(&self.stage_layers(0..self.layers, true))
            + self.head_params()
            - self.shared_table_params(true, true)
    }

    /// The parameters a stage holding the embedding (`embedding`) and the
    /// head (`head`) holds once rather than twice: the table (`V h`) when
    /// it holds both and they are tied, else 0.
    #[inline]
    pub fn shared_table_params(&self, embedding: bool, head: bool) -> u64 {
        match self.tied_embeddings && embedding && head {
            true => self.vocab * self.hidden,
            false => 0,
        }
    }

    /// The table a stage holding the head but not the embedding holds
    /// again for multi-token prediction's embedding of the next tokens
    /// (`V h`, Megatron-LM's copy on the last pipeline stage, reduced with
    /// the first's): where the model predicts more tokens and its head is
    /// not the table already (untied).
    #[inline]
    pub fn mtp_table_params(&self, embedding: bool, head: bool) -> u64 {
        match self.mtp_layers > 0 && head && !embedding && !self.tied_embeddings {
            true => self.vocab * self.hidden,
            false => 0,
        }
    }

    /// Megatron-LM's FLOPs of one training iteration (forward and backward,
    /// no recomputation) over `batch` sequences:
    /// `12 B s L h^2 (1 + g/a + (3/2) f/h + s/h + V/(2 L h))`, with `f` the
    /// width each token runs ([`Self::active_ffn`]: a mixture of experts'
    /// `k f + f_s`, as Megatron-LM counts it, the router left out; its
    /// dense layers' `dense_ffn`, each layer at its own width); the
    /// attention's terms `1 + g/a + s/h` times the queries' width over `h`
    /// (Megatron-LM's `query_projection_to_hidden_size_ratio`).
    pub fn flops_per_iteration(&self, batch: u64) -> f64 {
        let (b, s, l, h) = (
            batch as f64,
            self.seq_len as f64,
            self.layers as f64,
            self.hidden as f64,
        );
        // `6 b s` a weight of the layers (each kind's feed-forward width:
        // a mixture's dense layers run `dense_ffn`) and of the head, and
        // `6 b s^2` a query's and a context's element for the attention's
        // two products: with `q = g/a kv`, `12 B s L h^2 (1 + g/a + s/h) q/h
        // + ...` as above.
        // Multi-token prediction's layers count as the last layer's kind,
        // beside their projections, norms and heads (Megatron-LM's
        // `num_floating_point_operations` with `mtp_num_layers`).
        let mtp = self.mtp_layers as f64;
        let dense = self.dense_layers_in(&self.stage_layers(0..self.layers, true)) as f64;
        let l = l + mtp;
        let ffn =
            3.0 * h * ((l - dense) * self.active_ffn() as f64 + dense * self.dense_ffn as f64);
        let heads = (1.0 + mtp) * h * self.vocab as f64 + mtp * (2.0 * h * h + 3.0 * h);
        let weights = l * self.attention_weights() as f64 + ffn + heads;
        let scores = l * (self.q_dim() + self.context_dim()) as f64;
        6.0 * b * s * (weights + s * scores)
    }

    /// Training FLOPs per token: [`Self::flops_per_iteration`] of one
    /// sequence divided by its length.
    pub fn flops_per_token(&self) -> f64 {
        self.flops_per_iteration(1) / self.seq_len as f64
    }

    /// Forward FLOPs of one layer for a micro-batch of `micro_batch`
    /// sequences: `4 b s h^2 (1 + g/a + (3/2) f/h + s/h)`, i.e. two FLOPs
    /// per weight per token plus the attention scores and their product
    /// with the values (`4 b s^2 h`, no causal saving, as Megatron counts).
    /// A stage of n layers costs n times this.
    pub fn layer_forward_flops(&self, micro_batch: u64) -> f64 {
        self.matmul_forward_flops(micro_batch) + self.attention_score_forward_flops(micro_batch)
    }

    /// [`Self::layer_forward_flops`] of the layers `range`, each at its
    /// kind's ([`Self::layer_kinds`]).
    pub fn layers_forward_flops(&self, range: &Range<u64>, micro_batch: u64) -> f64 {
        self.layer_kinds(range)
            .iter()
            .map(|(m, n)| n as f64 * m.layer_forward_flops(micro_batch))
            .sum()
    }

    /// The part of [`Self::layer_forward_flops`] that multiplies by weights:
    /// `2 b s (attention + FFN weights)`, the FFN's a token runs (a
    /// mixture of experts' `3 h (k f + f_s)` and its router's `h E`).
    pub fn matmul_forward_flops(&self, micro_batch: u64) -> f64 {
        let router = if self.is_moe() { self.experts } else { 0 };
        let ffn = 3 * self.hidden * self.active_ffn() + self.hidden * router;
        let weights = (self.attention_weights() + ffn) as f64;
        2.0 * micro_batch as f64 * self.seq_len as f64 * weights
    }

    /// The attention-score part of [`Self::layer_forward_flops`],
    /// `2 b s^2 (q + c)`, `4 b s^2 q` but where latent attention's values
    /// are narrower (`q = h` unless `head_dim` says otherwise, `c` the
    /// context's width): what selective recomputation recomputes.
    pub fn attention_score_forward_flops(&self, micro_batch: u64) -> f64 {
        let (q, s) = (self.q_dim() as f64, self.seq_len as f64);
        let c = self.context_dim() as f64;
        2.0 * micro_batch as f64 * s * s * (q + c)
    }

    /// Forward FLOPs of the output side for a micro-batch: the head's `2 b
    /// s h V`, again for each multi-token-prediction layer with its
    /// projection's `2 b s 2h h`.
    pub fn head_forward_flops(&self, micro_batch: u64) -> f64 {
        let (h, mtp) = (self.hidden as f64, self.mtp_layers as f64);
        let tokens = micro_batch as f64 * self.seq_len as f64;
        (1.0 + mtp) * self.output_head_forward_flops(micro_batch) + mtp * 4.0 * tokens * h * h
    }

    /// Forward FLOPs of one output head for a micro-batch: `2 b s h V`.
    pub fn output_head_forward_flops(&self, micro_batch: u64) -> f64 {
        2.0 * micro_batch as f64 * self.seq_len as f64 * self.hidden as f64 * self.vocab as f64
    }

    /// Forward FLOPs of the input embedding: 0, it is a table lookup (the
    /// Megatron formula counts none either).
    pub fn embedding_forward_flops(&self, _micro_batch: u64) -> f64 {
        0.0
    }
}

/// The widths of a layer's attention ([`ModelSpec::attention_widths`]):
/// the queries', keys', values' and the context's (its output before the
/// projection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionWidths {
    pub q: u64,
    pub kv: u64,
    pub v: u64,
    pub context: u64,
}

impl AttentionWidths {
    /// The four, summed: what flash attention reads and writes a token
    /// (`2 q + 2 kv` but where latent attention's values are narrower).
    pub fn sum(&self) -> u64 {
        self.q + self.kv + self.v + self.context
    }
}

/// How a mixture's experts are split ([`ModelSpec::layer_matmuls`]): over
/// `ep` expert-parallel groups of chips, each expert over `etp` chips
/// (Megatron-LM's `--expert-model-parallel-size` and
/// `--expert-tensor-parallel-size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertSplit {
    pub ep: u64,
    pub etp: u64,
}

/// A range of layers by kind ([`ModelSpec::layer_kinds`]).
#[derive(Debug, Clone)]
pub struct LayerKinds<'m> {
    /// The dense layers of a mixture of experts with some: their model
    /// and how many of the range's they are.
    pub dense: Option<(ModelSpec, u64)>,
    /// The other layers: the model's own, and how many.
    pub rest: (&'m ModelSpec, u64),
}

impl LayerKinds<'_> {
    /// Each kind the range holds (a count above 0), with its count.
    pub fn iter(&self) -> impl Iterator<Item = (&ModelSpec, u64)> {
        self.dense
            .iter()
            .map(|(m, n)| (m, *n))
            .chain(std::iter::once(self.rest))
            .filter(|&(_, n)| n > 0)
    }
}

/// At most `N` items kept in place (a layer's matmuls or memory-bound
/// passes, which the search prices in its inner loop, where a heap
/// allocation each cost a tenth of its time).
#[derive(Debug, Clone, Copy)]
pub struct Few<T: Copy + Default, const N: usize> {
    items: [T; N],
    len: usize,
}

impl<T: Copy + Default, const N: usize> Few<T, N> {
    fn of(items: &[T]) -> Self {
        let mut few = Few {
            items: [T::default(); N],
            len: 0,
        };
        few.extend(items);
        few
    }

    fn extend(&mut self, items: &[T]) {
        self.items[self.len..self.len + items.len()].copy_from_slice(items);
        self.len += items.len();
    }
}

impl<T: Copy + Default, const N: usize> std::ops::Deref for Few<T, N> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.items[..self.len]
    }
}

impl<'a, T: Copy + Default, const N: usize> IntoIterator for &'a Few<T, N> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// One class of matrix multiplication: `batch` independent products of an
/// `m x k` matrix by a `k x n` one (`2 m n k` FLOPs each).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Matmul {
    /// What it computes, for reports and tests.
    pub name: &'static str,
    /// Rows of the result.
    pub m: f64,
    /// Columns of the result.
    pub n: f64,
    /// The inner dimension.
    pub k: f64,
    /// Independent products (heads times sequences for attention; 1 else).
    pub batch: f64,
}

impl Matmul {
    /// `2 m n k` per product.
    pub fn flops(&self) -> f64 {
        2.0 * self.m * self.n * self.k * self.batch
    }

    /// Elements it reads and writes if nothing stays on chip: both
    /// operands and the result, `m k + k n + m n` per product.
    pub fn elements(&self) -> f64 {
        (self.m * self.k + self.k * self.n + self.m * self.n) * self.batch
    }

    /// The smallest of `m`, `n` and `k`.
    pub fn smallest_dim(&self) -> f64 {
        self.m.min(self.n).min(self.k)
    }

    /// The two products of its backward pass, each with its FLOPs: the
    /// input gradient `dX = dY W^T` (`m x k`, inner `n`) and the weight
    /// gradient `dW = X^T dY` (`k x n`, inner `m`).
    pub fn backward(&self) -> [Matmul; 2] {
        let (m, n, k) = (self.m, self.n, self.k);
        [
            Matmul {
                m,
                n: k,
                k: n,
                ..*self
            },
            Matmul {
                m: k,
                n,
                k: m,
                ..*self
            },
        ]
    }
}

/// One memory-bound pass (a kernel that streams tensors: a norm, an
/// elementwise product, a residual add, a softmax): bytes moved forward and
/// in its backward, and whether tensor parallelism splits it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct MemoryPass {
    /// What it computes.
    pub name: &'static str,
    /// Bytes read and written by the forward kernel.
    pub forward_bytes: f64,
    /// Bytes read and written by its backward.
    pub backward_bytes: f64,
}

impl ModelSpec {
    /// Tokens of a micro-batch, `b s`.
    #[inline]
    fn tokens(&self, micro_batch: u64) -> f64 {
        (micro_batch * self.seq_len) as f64
    }

    /// Width of one attention head: `head_dim`, or `h / a`.
    #[inline]
    pub fn head_dim(&self) -> u64 {
        match self.head_dim {
            0 => self.hidden / self.heads.max(1),
            d => d,
        }
    }

    /// The weight matmuls of one layer for a micro-batch on each of `tp`
    /// chips (Megatron's split: QKV and the FFN's gate and up by columns, the
    /// attention output and the FFN's down projection by rows). Their FLOPs
    /// times `tp` are [`Self::matmul_forward_flops`]. Under latent
    /// attention QKV is the latents' down projections (on each chip's `1/t`
    /// of the tokens, not split) and up projections (split by heads).
    ///
    /// In a mixture of experts the FFN is the router (`(b s) x h` by `h x
    /// E`, on each chip's `1/t` of the tokens), each chip's `E / ep` experts
    /// as grouped matmuls (the tokens routed to them from the `ep etp`
    /// slices of `b s / t` tokens of its expert-parallel group, `b s k ep
    /// etp / (t E)` an expert when the router balances them; each expert
    /// split over `etp` chips, `experts.etp`, Megatron-LM's expert tensor
    /// parallelism, the `tp` by default), and the shared expert as a dense
    /// FFN of its width.
    pub fn layer_matmuls(
        &self,
        micro_batch: u64,
        tp: u64,
        experts: ExpertSplit,
    ) -> Few<Matmul, 12> {
        let t = tp.max(1) as f64;
        let m = self.tokens(micro_batch);
        let (h, f) = (self.hidden as f64, self.ffn as f64);
        let w = self.attention_widths();
        let (q, kv, v, context) = (w.q as f64, w.kv as f64, w.v as f64, w.context as f64);
        let mm = |name, m, n, k, batch| Matmul {
            name,
            m,
            n,
            k,
            batch,
        };
        let mut mms = Few::of(&[]);
        if self.is_mla() {
            // The down projections (not split by `tp`, as Megatron-LM
            // runs them) on each chip's `1/t` of the tokens, as under
            // sequence parallelism; the up projections split by heads.
            let (rq, rkv) = (self.q_lora_rank as f64, self.kv_lora_rank as f64);
            let rope = self.rope_head_dim as f64;
            let nope = self.head_dim().saturating_sub(self.rope_head_dim);
            let up = (self.heads * nope) as f64 + v;
            match self.q_lora_rank {
                0 => mms.extend(&[mm("q", m, q / t, h, 1.0)]),
                _ => mms.extend(&[
                    mm("q down", m / t, rq, h, 1.0),
                    mm("q up", m, q / t, rq, 1.0),
                ]),
            }
            mms.extend(&[
                mm("kv down", m / t, rkv + rope, h, 1.0),
                mm("kv up", m, up / t, rkv, 1.0),
            ]);
        } else {
            mms.extend(&[mm("qkv", m, (q + kv + v) / t, h, 1.0)]);
        }
        mms.extend(&[mm("attention output", m, h, context / t, 1.0)]);
        if !self.is_moe() {
            mms.extend(&[
                mm("ffn gate", m, f / t, h, 1.0),
                mm("ffn up", m, f / t, h, 1.0),
                mm("ffn down", m, h, f / t, 1.0),
            ]);
            return mms;
        }
        let (e, k) = (self.experts as f64, self.experts_per_token as f64);
        let ep = experts.ep.clamp(1, self.experts) as f64;
        let etp = experts.etp.max(1) as f64;
        let local = e / ep;
        // Tokens each local expert runs (its group's `ep etp` slices of
        // `b s / t` tokens, `k / E` of them each) and the experts a chip
        // holds, each over `etp` chips.
        let per_expert = m / t * etp * ep * k / e;
        mms.extend(&[
            mm("router", m / t, e, h, 1.0),
            mm("expert gate", per_expert, f / etp, h, local),
            mm("expert up", per_expert, f / etp, h, local),
            mm("expert down", per_expert, h, f / etp, local),
        ]);
        if self.shared_ffn > 0 {
            let fs = self.shared_ffn as f64;
            mms.extend(&[
                mm("shared expert gate", m, fs / t, h, 1.0),
                mm("shared expert up", m, fs / t, h, 1.0),
                mm("shared expert down", m, h, fs / t, 1.0),
            ]);
        }
        mms
    }

    /// The two products of attention for a micro-batch on each of `tp`
    /// chips (`a / t` heads each): the scores `Q K^T` (`s x s`, inner the
    /// head's width, `h / a` unless `head_dim` says otherwise) and the
    /// context `P V` (`s x d_v`, inner `s`), causal masking not exploited
    /// (as Megatron counts): `4 b s^2 h / t` FLOPs together when the heads
    /// are `h / a` wide.
    pub fn attention_matmuls(&self, micro_batch: u64, tp: u64) -> [Matmul; 2] {
        let batch = (micro_batch * self.heads) as f64 / tp.max(1) as f64;
        let (s, d) = (self.seq_len as f64, self.head_dim() as f64);
        let keys = self.attention_span();
        [
            Matmul {
                name: "attention scores",
                m: s,
                n: keys,
                k: d,
                batch,
            },
            Matmul {
                name: "attention context",
                m: s,
                n: self.v_head_dim() as f64,
                k: keys,
                batch,
            },
        ]
    }

    /// The keys a query attends, on average over the layers, in the count
    /// [`Self::attention_matmuls`] takes for full attention (`s`: causal
    /// masking not exploited): a layer over a window of `w < s` keys
    /// ([`Self::sliding_window`]) does `(s w - w^2 / 2) / (s^2 / 2)` of a
    /// full layer's work, so `2 w - w^2 / s`; one within chunks of `c < s`
    /// ([`Self::attention_chunk`]) `(s c / 2) / (s^2 / 2)` of it, so `c`;
    /// `s` without either.
    pub fn attention_span(&self) -> f64 {
        let s = self.seq_len as f64;
        let (w, c) = (self.sliding_window as f64, self.attention_chunk as f64);
        let span = match (self.sliding_window, self.attention_chunk) {
            (0, 0) => return s,
            (_, 0) if w < s => 2.0 * w - w * w / s,
            (0, _) if c < s => c,
            _ => return s,
        };
        if self.layers == 0 {
            return s;
        }
        let l = self.layers as f64;
        let windowed = match self.window_layers {
            0 => l,
            n => n as f64,
        };
        ((l - windowed) * s + windowed * span) / l
    }

    /// The memory-bound passes of one layer with activations of `elem`
    /// bytes, on each of `tp` chips. Replicated under tensor parallelism,
    /// or with `sequence_parallel` split by `tp` along the sequence (as
    /// Megatron's sequence parallelism runs them; Korthikanti et al. 2022
    /// measured a 22B layer's forward 7.7 ms without it, 7.2 with it): the
    /// two RMSNorms (forward reads and writes `b s h`, backward reads the
    /// input and the gradient and writes one) and the two residual adds
    /// (read two, write one, both ways). Split by `tp`: RoPE on Q and K
    /// (read and write, both ways) and the SwiGLU product (forward reads
    /// gate and up and writes their product; backward reads gate, up and
    /// the gradient and writes two). Each is one kernel of its own (the
    /// two norms and the two adds four), so that each pays the chip's
    /// dispatch floor.
    ///
    /// In a mixture of experts the SwiGLU product runs over the width each
    /// token runs ([`Self::active_ffn`]), and two passes more: the router's
    /// softmax and top-k over the `E` scores (replicated), and the tokens'
    /// permutation to their experts and back (each way reading the tokens
    /// and writing their `k` copies, and the reverse; over `t` with
    /// sequence parallelism, whose tokens each chip of the group dispatches
    /// its share of).
    pub fn layer_memory_passes(
        &self,
        micro_batch: u64,
        tp: u64,
        elem: f64,
        sequence_parallel: bool,
    ) -> Few<MemoryPass, 9> {
        let t = tp.max(1) as f64;
        let x = self.tokens(micro_batch) * elem;
        let (h, kv) = (self.hidden as f64, self.kv_dim() as f64);
        // RoPE's elements: the queries' and keys' (under latent attention
        // their rotary parts, the keys' shared by the heads).
        let rope = match self.is_mla() {
            false => (self.q_dim() as f64 + kv) / t,
            true => (self.heads * self.rope_head_dim) as f64 / t + self.rope_head_dim as f64,
        };
        let f = self.active_ffn() as f64;
        let pass = |name, fwd: f64, bwd: f64, width: f64| MemoryPass {
            name,
            forward_bytes: fwd * x * width,
            backward_bytes: bwd * x * width,
        };
        let replicated = if sequence_parallel { h / t } else { h };
        let mut passes = Few::of(&[
            pass("rmsnorm (attention)", 2.0, 3.0, replicated),
            pass("rmsnorm (ffn)", 2.0, 3.0, replicated),
            pass("residual add (attention)", 3.0, 3.0, replicated),
            pass("residual add (ffn)", 3.0, 3.0, replicated),
            pass("rope (q, k)", 2.0, 2.0, rope),
            pass("swiglu", 3.0, 5.0, f / t),
        ]);
        if self.is_mla() {
            let latents = (self.q_lora_rank + self.kv_lora_rank) as f64;
            passes.extend(&[pass("rmsnorm (latents)", 2.0, 3.0, latents)]);
        }
        if self.is_moe() {
            let k = self.experts_per_token as f64;
            let split = if sequence_parallel { t } else { 1.0 };
            let permute = 2.0 * (1.0 + k) * h / split;
            passes.extend(&[
                pass("router softmax and top-k", 2.0, 3.0, self.experts as f64),
                pass("token permutation", permute, permute, 1.0),
            ]);
        }
        passes
    }

    /// The output head's matmul on each of `tp` chips, split by vocabulary
    /// (Megatron's vocabulary-parallel head): `(b s) x h` by `h x V/t`,
    /// [`Self::head_forward_flops`] over `tp`.
    pub fn head_matmul(&self, micro_batch: u64, tp: u64) -> Matmul {
        Matmul {
            name: "output head",
            m: self.tokens(micro_batch),
            n: self.vocab as f64 / tp.max(1) as f64,
            k: self.hidden as f64,
            batch: 1.0,
        }
    }

    /// A multi-token-prediction layer's projection of the hidden state and
    /// the next token's embedding, concatenated, on each of `tp` chips:
    /// `(b s) x 2h` by `2h x h/t` (Megatron-LM's column-parallel
    /// `eh_proj`).
    pub fn mtp_projection_matmul(&self, micro_batch: u64, tp: u64) -> Matmul {
        Matmul {
            name: "mtp projection",
            m: self.tokens(micro_batch),
            n: self.hidden as f64 / tp.max(1) as f64,
            k: 2.0 * self.hidden as f64,
            batch: 1.0,
        }
    }

    /// The memory-bound passes of the output side: the final RMSNorm
    /// (replicated) and the loss over the vocabulary (`b s V / t` logits per
    /// chip), as a fused softmax cross-entropy kernel (Megatron's
    /// vocabulary-parallel one; the statistics are kept in f32 on chip):
    /// forward it reads the logits once (`elem` bytes each), backward it
    /// reads them and writes their gradient.
    pub fn head_memory_passes(&self, micro_batch: u64, tp: u64, elem: f64) -> [MemoryPass; 2] {
        let tokens = self.tokens(micro_batch);
        let logits = tokens * self.vocab as f64 / tp.max(1) as f64 * elem;
        let norm = tokens * self.hidden as f64 * elem;
        [
            MemoryPass {
                name: "final rmsnorm",
                forward_bytes: 2.0 * norm,
                backward_bytes: 3.0 * norm,
            },
            MemoryPass {
                name: "softmax cross-entropy",
                forward_bytes: logits,
                backward_bytes: 2.0 * logits,
            },
        ]
    }

    /// The embedding's memory-bound passes: forward gathers `b s` rows of
    /// `h` (read and write, `elem` bytes); backward reads the output
    /// gradient and adds it into the table's gradient (`grad` bytes, read
    /// and written).
    pub fn embedding_memory_passes(&self, micro_batch: u64, elem: f64, grad: f64) -> MemoryPass {
        let rows = self.tokens(micro_batch) * self.hidden as f64;
        MemoryPass {
            name: "embedding gather",
            forward_bytes: 2.0 * rows * elem,
            backward_bytes: rows * (elem + 2.0 * grad),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ANCHORS.md check. Parameters: exactly 68,976,648,192, which is
    /// 68.98e9 at 4 significant figures (to 1e7). FLOPs per token: exactly
    /// 444,491,366,400 = 12 * 80 * 8192^2 * 6.8994140625, which is 4.445e11
    /// at 4 significant figures; the published 4.45e11 is that figure
    /// rounded half-up once more (rounded once to 3 figures it would read
    /// 4.44e11), and it is within 0.12% of it.
    #[test]
    fn reproduces_the_published_70b_check() {
        let m = ModelSpec::llama_70b();
        assert_eq!(m.total_params(), 68_976_648_192);
        assert_eq!((m.total_params() as f64 / 1e7).round(), 6898.0);
        let per_token = m.flops_per_token();
        // 12 * 80 * 8192^2 * (1 + 0.125 + 5.25 + 0.5 + 0.0244140625)
        assert_eq!(per_token, 444_491_366_400.0);
        assert_eq!(per_token, 64_424_509_440.0 * 6.899_414_062_5);
        let four_figures = (per_token / 1e8).round(); // 4445 (x 1e8)
        assert_eq!(four_figures, 4445.0);
        assert_eq!((four_figures / 10.0).round(), 445.0); // 4.45e11
        assert!((per_token - 4.45e11).abs() / 4.45e11 < 1.2e-3);
    }

    #[test]
    fn per_layer_counts_by_hand() {
        let m = ModelSpec::llama_70b();
        assert_eq!(m.kv_dim(), 1024);
        assert_eq!(m.attention_params(), 150_994_944);
        assert_eq!(m.ffn_params(), 704_643_072);
        assert_eq!(m.layer_params(), 855_654_400);
        assert_eq!(m.embedding_params(), 262_144_000);
        assert_eq!(m.head_params(), 262_152_192);
    }

    #[test]
    fn forward_pieces_add_up_to_a_third_of_megatron() {
        // Qwen3-8B's heads: 32 of 128 at hidden 4096 and 8 key/value
        // heads, its queries as wide as the hidden size; Qwen3-30B-A3B's:
        // 32 of 128 at hidden 2048, twice as wide.
        let wide = ModelSpec {
            hidden: 2048,
            heads: 32,
            kv_heads: 4,
            head_dim: 128,
            ..ModelSpec::llama_7b()
        };
        for m in [
            ModelSpec::llama_7b(),
            ModelSpec::llama_70b(),
            ModelSpec::h2_100b(),
            wide,
        ] {
            let b = 3;
            let forward = m.layers as f64 * m.layer_forward_flops(b)
                + m.head_forward_flops(b)
                + m.embedding_forward_flops(b);
            let megatron = m.flops_per_iteration(b);
            assert!(
                (3.0 * forward - megatron).abs() <= megatron * 1e-12,
                "{}",
                m.name
            );
        }
    }

    #[test]
    fn op_tables_add_up_to_the_flop_counts() {
        let shared = ModelSpec {
            shared_ffn: 5632,
            ..ModelSpec::mixtral_8x7b()
        };
        let wide = ModelSpec {
            head_dim: 256,
            ..ModelSpec::mixtral_8x7b()
        };
        for m in [
            ModelSpec::llama_7b(),
            ModelSpec::llama_70b(),
            ModelSpec::mixtral_8x7b(),
            shared,
            wide,
        ] {
            // (At the default expert tensor-parallel degree, the tp, and
            // at 1.)
            for (b, tp, ep, etp) in [
                (1, 1, 1, 1),
                (2, 2, 1, 2),
                (3, 8, 1, 8),
                (2, 1, 8, 1),
                (2, 2, 4, 2),
                (2, 4, 4, 1),
                (2, 8, 2, 4),
            ] {
                let t = tp as f64;
                let split = ExpertSplit { ep, etp };
                let weights: f64 = m
                    .layer_matmuls(b, tp, split)
                    .iter()
                    .map(Matmul::flops)
                    .sum();
                let want = m.matmul_forward_flops(b);
                assert!(
                    (weights * t - want).abs() <= want * 1e-12,
                    "{} tp {tp}",
                    m.name
                );
                let attn: f64 = m.attention_matmuls(b, tp).iter().map(Matmul::flops).sum();
                let want = m.attention_score_forward_flops(b);
                assert!((attn * t - want).abs() <= want * 1e-12);
                let head = m.head_matmul(b, tp).flops() * t;
                assert!((head - m.head_forward_flops(b)).abs() <= head * 1e-12);
                for mm in m.layer_matmuls(b, tp, split).iter() {
                    let [dx, dw] = mm.backward();
                    assert_eq!((dx.flops(), dw.flops()), (mm.flops(), mm.flops()));
                }
            }
        }
        let m = ModelSpec::llama_70b();
        // Attention's products have head_dim-sized inner (or outer) sides.
        assert_eq!(m.head_dim(), 128);
        for mm in m.attention_matmuls(1, 8) {
            assert_eq!(mm.smallest_dim(), 128.0);
            assert!(mm.backward().iter().all(|x| x.smallest_dim() == 128.0));
        }
        // The o projection is split by rows: its inner dimension shrinks.
        assert_eq!(
            m.layer_matmuls(1, 8, ExpertSplit { ep: 1, etp: 8 })[1].k,
            1024.0
        );
    }

    /// Mixtral 8x7B's published counts (Jiang et al. 2024: 46.7B
    /// parameters, 12.9B active a token), by hand: attention `2 h^2 + 2 h
    /// kv` = 41.9 M and norms 8192 a layer, experts `8 x 3 x 4096 x 14336`
    /// = 1409.3 M, the router `4096 x 8`; embedding and head 131.1 M each.
    /// A chip of an 8-way expert-parallel group runs one expert a layer
    /// over the tokens routed to it: `2 b s` of them when the router
    /// balances, twice the micro-batch's.
    #[test]
    fn a_mixture_of_experts_counts_its_experts_and_runs_its_top_k() {
        let m = ModelSpec::mixtral_8x7b();
        m.validate().unwrap();
        assert_eq!(m.expert_params(), 8 * 3 * 4096 * 14336);
        assert_eq!(
            m.layer_params(),
            41_943_040 + 1_409_286_144 + 4096 * 8 + 8192
        );
        assert_eq!(m.total_params(), 46_702_792_704);
        assert_eq!((m.total_params() as f64 / 1e8).round(), 467.0);
        let active = m.total_params() - 32 * 6 * 3 * 4096 * 14336;
        assert_eq!((active as f64 / 1e8).round(), 129.0);
        assert_eq!(m.active_ffn(), 2 * 14336);
        let mms = m.layer_matmuls(1, 1, ExpertSplit { ep: 8, etp: 1 });
        let gate = mms.iter().find(|mm| mm.name == "expert gate").unwrap();
        assert_eq!((gate.m, gate.batch), (2.0 * 4096.0, 1.0));
        // Without expert parallelism a chip runs all 8 experts, each over
        // a quarter of its tokens.
        let gate = m.layer_matmuls(1, 1, ExpertSplit { ep: 1, etp: 1 })[3];
        assert_eq!((gate.m, gate.batch), (1024.0, 8.0));
        // Megatron-LM's count: the active width in place of the FFN's.
        let dense = ModelSpec {
            experts: 0,
            experts_per_token: 0,
            ffn: 2 * 14336,
            ..m.clone()
        };
        assert_eq!(m.flops_per_iteration(3), dense.flops_per_iteration(3));
    }

    /// GLM-4.5 (zai-org/GLM-4.5's config.json): 92 layers of hidden
    /// 5120, 96 query heads and 8 key/value heads of 128; its first 3
    /// layers a dense MLP of 12288, the other 89 each 160 experts of 1536
    /// (8 a token) and a shared expert of 1536; untied head.
    fn glm_4_5() -> ModelSpec {
        ModelSpec {
            name: "glm-4.5".into(),
            layers: 92,
            hidden: 5120,
            ffn: 1536,
            heads: 96,
            kv_heads: 8,
            head_dim: 128,
            vocab: 151552,
            experts: 160,
            experts_per_token: 8,
            shared_ffn: 1536,
            dense_layers: 3,
            dense_ffn: 12288,
            ..ModelSpec::llama_7b()
        }
    }

    #[test]
    fn a_mixture_with_dense_first_layers_counts_each_kind() {
        let m = glm_4_5();
        m.validate().unwrap();
        let dense = m.dense_layer_model().unwrap();
        let attention = 2 * 5120 * (96 * 128) + 2 * 5120 * (8 * 128);
        assert_eq!(
            dense.layer_params(),
            attention + 3 * 5120 * 12288 + 2 * 5120
        );
        assert_eq!(
            m.layer_params(),
            attention + 3 * 5120 * 1536 * 161 + 5120 * 160 + 2 * 5120
        );
        let tables = 2 * 151552 * 5120 + 5120;
        assert_eq!(
            m.total_params(),
            3 * dense.layer_params() + 89 * m.layer_params() + tables
        );
        assert_eq!(m.checked_total_params(), Some(m.total_params()));
        // Z.ai publishes 355 B parameters, its multi-token-prediction
        // layer (an expert layer and a projection, not trained here)
        // counted: 352.8 B here, 356.7 B with one more expert layer. The
        // attention's biases and the query and key norms (15 k a layer)
        // are not counted.
        assert_eq!((m.total_params() as f64 / 1e8).round(), 3528.0);
        // The layers by kind.
        assert_eq!(m.dense_layers_in(&(0..2)), 2);
        assert_eq!(m.dense_layers_in(&(2..10)), 1);
        assert_eq!(m.dense_layers_in(&(5..9)), 0);
        assert_eq!(m.expert_layers_in(&(0..10)), 7);
        assert_eq!(m.expert_layers_in(&(0..0)), 0);
        assert_eq!(
            m.layers_params(&(1..5)),
            2 * dense.layer_params() + 2 * m.layer_params()
        );
        let kinds: Vec<u64> = m.layer_kinds(&(2..6)).iter().map(|(_, n)| n).collect();
        assert_eq!(kinds, [1, 3]);
        let kinds: Vec<u64> = m.layer_kinds(&(6..9)).iter().map(|(_, n)| n).collect();
        assert_eq!(kinds, [3]);
        // Megatron-LM's count, each layer at its own width, is three times
        // the forward pieces but the routers' (`2 b s h E` forward, which
        // it leaves out).
        let b = 2;
        let forward = m.layers_forward_flops(&(0..92), b) + m.head_forward_flops(b);
        let routers = 89.0 * 2.0 * (b * 4096 * 5120 * 160) as f64;
        let megatron = m.flops_per_iteration(b);
        assert!((3.0 * (forward - routers) - megatron).abs() <= megatron * 1e-12);
        // A dense layer runs an MLP of 12288, an expert layer 9 x 1536 =
        // 13824 (and its router), over a tenth of the parameters.
        assert!(dense.layer_forward_flops(b) < m.layer_forward_flops(b));
        assert!(10 * dense.layer_params() < m.layer_params());
        // The TOML reads back; a model without dense layers writes none.
        let text = toml::to_string(&m).unwrap();
        assert!(text.contains("dense_layers = 3"), "{text}");
        assert_eq!(ModelSpec::from_toml_str(&text).unwrap(), m);
        let text = toml::to_string(&ModelSpec::mixtral_8x7b()).unwrap();
        assert!(!text.contains("dense"), "{text}");
    }

    /// DeepSeek-V3 (deepseek-ai/DeepSeek-V3's config.json): 61 layers of
    /// hidden 7168, latent attention (128 heads of 128 + 64 rotary,
    /// values of 128, latents of 1536 and 512), its first 3 layers a dense
    /// MLP of 18432, the other 58 each 256 experts of 2048 (8 a token)
    /// and a shared expert of 2048; untied head.
    fn deepseek_v3() -> ModelSpec {
        ModelSpec {
            name: "deepseek-v3".into(),
            layers: 61,
            hidden: 7168,
            ffn: 2048,
            heads: 128,
            kv_heads: 128,
            head_dim: 192,
            vocab: 129280,
            experts: 256,
            experts_per_token: 8,
            shared_ffn: 2048,
            dense_layers: 3,
            dense_ffn: 18432,
            kv_lora_rank: 512,
            q_lora_rank: 1536,
            rope_head_dim: 64,
            v_head_dim: 128,
            ..ModelSpec::llama_7b()
        }
    }

    #[test]
    fn latent_attention_counts_its_latents() {
        let m = deepseek_v3();
        m.validate().unwrap();
        assert!(m.is_mla());
        let (h, a) = (7168, 128);
        let weights =
            h * 1536 + 1536 * a * 192 + h * (512 + 64) + 512 * a * (128 + 128) + a * 128 * h;
        assert_eq!(m.attention_weights(), weights);
        assert_eq!(m.attention_params(), weights + 1536 + 512);
        assert_eq!(
            (m.q_dim(), m.kv_dim(), m.v_dim(), m.context_dim()),
            (24576, 24576, 16384, 16384)
        );
        // DeepSeek publishes 671 B parameters, 37 B of them active for a
        // token (without its 14 B multi-token-prediction module): 671.0 B
        // here, and 37.6 B of them run for a token (the 8 routed experts,
        // the shared one, the dense layers, attention, the head; 36.6 B
        // without the embedding's table, which a token reads one row of).
        assert_eq!((m.total_params() as f64 / 1e9).round(), 671.0);
        let idle = 58 * (256 - 8) * 3 * h * 2048;
        assert_eq!(((m.total_params() - idle) as f64 / 1e8).round(), 376.0);
        let read = (m.total_params() - idle - m.embedding_params()) as f64;
        assert_eq!((read / 1e8).round(), 366.0);
        // Its matmuls add up to its FLOPs; the attention's two products
        // take the queries' 192 and the values' 128.
        for tp in [1, 8] {
            let split = ExpertSplit { ep: 8, etp: tp };
            let weights: f64 = m
                .layer_matmuls(2, tp, split)
                .iter()
                .map(Matmul::flops)
                .sum();
            let want = m.matmul_forward_flops(2) / tp as f64;
            assert!((weights - want).abs() <= want * 1e-12, "tp {tp}");
        }
        let [scores, context] = m.attention_matmuls(1, 1);
        assert_eq!((scores.k, context.n), (192.0, 128.0));
        let both = scores.flops() + context.flops();
        assert!((both - m.attention_score_forward_flops(1)).abs() <= both * 1e-12);
        // Megatron-LM's count is three times the forward pieces but the
        // routers' (which it leaves out); its TOML reads back.
        let b = 2;
        let forward = m.layers_forward_flops(&(0..61), b) + m.head_forward_flops(b);
        let routers = 58.0 * 2.0 * (b * 4096 * h * 256) as f64;
        let megatron = m.flops_per_iteration(b);
        assert!((3.0 * (forward - routers) - megatron).abs() <= megatron * 1e-12);
        let text = toml::to_string(&m).unwrap();
        assert_eq!(ModelSpec::from_toml_str(&text).unwrap(), m);
    }

    /// DeepSeek-V3's multi-token-prediction module: one layer like its
    /// last (a mixture), the projection `2h -> h` and three norms, and a
    /// second pass of the head; DeepSeek publishes 14 B parameters for it
    /// in its checkpoint, which also holds copies of the embedding and the
    /// head (1.85 B): 11.6 B here beside them.
    #[test]
    fn multi_token_prediction_is_a_layer_and_a_head_more() {
        let m = deepseek_v3();
        let mtp = ModelSpec {
            mtp_layers: 1,
            ..m.clone()
        };
        mtp.validate().unwrap();
        let h = 7168;
        let module = mtp.total_params() - m.total_params();
        assert_eq!(module, m.layer_params() + 2 * h * h + 3 * h);
        let copies = 2 * 129280 * h;
        assert_eq!(((module + copies) as f64 / 1e8).round(), 135.0);
        // The last stage runs it: layers 61.. of the expert kind.
        assert_eq!(mtp.stage_layers(58..61, true), 58..62);
        assert_eq!(mtp.stage_layers(0..3, false), 0..3);
        assert_eq!(mtp.expert_layers_in(&mtp.stage_layers(58..61, true)), 4);
        // A stage holding the head but not the embedding holds the table
        // again (untied); one holding both, or a tied model's, does not.
        assert_eq!(mtp.mtp_table_params(false, true), 129280 * h);
        assert_eq!(mtp.mtp_table_params(true, true), 0);
        assert_eq!(m.mtp_table_params(false, true), 0);
        // Megatron-LM's count with `mtp_num_layers`: its layer among the
        // layers, its projection and norms, and the logits twice.
        let b = 2;
        let layers = mtp.stage_layers(0..61, true);
        let forward = mtp.layers_forward_flops(&layers, b) + mtp.head_forward_flops(b);
        let routers = 59.0 * 2.0 * (b * 4096 * h * 256) as f64;
        let norms = 6.0 * (b * 4096) as f64 * 3.0 * h as f64;
        let megatron = mtp.flops_per_iteration(b);
        assert!((3.0 * (forward - routers) + norms - megatron).abs() <= megatron * 1e-12);
        let more = megatron / m.flops_per_iteration(b);
        assert!(more > 1.03 && more < 1.05, "{more}");
        // Megatron-LM's newer count halves the causal attention's products:
        // 260.0e9 FLOPs a token with the layer, 249.8e9 without, where the
        // Megatron-Bridge table's DeepSeek-V3 H100 row (338 TFLOP/s a GPU
        // at 1,297 tokens/s) gives 260.6e9 (docs/planner.md).
        let causal = |m: &ModelSpec| {
            let l = (m.layers + m.mtp_layers) as f64;
            let scores = 3.0 * 4096.0 * l * (m.q_dim() + m.context_dim()) as f64;
            (m.flops_per_token() - scores) / 1e8
        };
        assert_eq!((causal(&mtp).round(), causal(&m).round()), (2600.0, 2498.0));
        assert_eq!((338e12 / 1297.0 / 1e8_f64).round(), 2606.0);
        // Read back from TOML; its limit said by name.
        let text = toml::to_string(&mtp).unwrap();
        assert!(text.contains("mtp_layers = 1"), "{text}");
        assert_eq!(ModelSpec::from_toml_str(&text).unwrap(), mtp);
        assert!(!toml::to_string(&m).unwrap().contains("mtp"));
        let over = ModelSpec {
            mtp_layers: 17,
            ..m
        };
        let e = over.validate().unwrap_err().to_string();
        assert!(
            e.contains("mtp_layers is 17, more than the planner accepts (16)"),
            "{e}"
        );
    }

    /// Llama 4 Maverick (meta-llama's config.json): 48 layers of hidden
    /// 5120, every other one (1, 3, ...) 128 experts of 8192 (one a token)
    /// and a shared one, the others a dense MLP of 16384; Meta publishes
    /// 400e9 parameters, 17e9 active. The layers' kinds by their step,
    /// multi-token prediction's of the last one's, and the pattern's
    /// fields checked by name.
    #[test]
    fn expert_layers_every_other_layer_are_counted_by_their_step() {
        let m = ModelSpec {
            name: "llama-4-maverick".into(),
            layers: 48,
            hidden: 5120,
            ffn: 8192,
            heads: 40,
            kv_heads: 8,
            head_dim: 128,
            vocab: 202048,
            seq_len: 4096,
            tied_embeddings: false,
            experts: 128,
            experts_per_token: 1,
            shared_ffn: 8192,
            dense_layers: 1,
            dense_ffn: 16384,
            moe_layer_step: 2,
            moe_layer_offset: 1,
            ..Default::default()
        };
        m.validate().unwrap();
        assert!(m.has_dense_layers());
        assert_eq!(m.expert_layers_before(48), 24);
        assert_eq!(m.dense_layers_in(&(0..5)), 3);
        assert_eq!(m.expert_layers_in(&(1..4)), 2);
        assert!(m.is_expert_layer(47) && !m.is_expert_layer(46) && !m.is_expert_layer(0));
        assert_eq!((m.total_params() as f64 / 1e9).round(), 401.0);
        let idle = 24 * 127 * 3 * 5120 * 8192;
        assert_eq!(((m.total_params() - idle) as f64 / 1e9).round(), 17.0);
        // A stage's parameters are its layers' by kind.
        let dense = m.dense_layer_model().unwrap();
        assert_eq!(
            m.layers_params(&(2..6)),
            2 * dense.layer_params() + 2 * m.layer_params()
        );
        // Multi-token prediction's layer is of the last layer's kind.
        let mtp = ModelSpec {
            mtp_layers: 1,
            ..m.clone()
        };
        assert_eq!(mtp.expert_layers_in(&mtp.stage_layers(46..48, true)), 2);
        let last_dense = ModelSpec {
            moe_layer_offset: 0,
            dense_layers: 0,
            ..mtp.clone()
        };
        // (Layer 46 runs the experts, 47 and the prediction layer not.)
        assert_eq!(
            last_dense.expert_layers_in(&last_dense.stage_layers(46..48, true)),
            1
        );
        // Its TOML reads back.
        let text = toml::to_string(&m).unwrap();
        assert!(
            text.contains("moe_layer_step = 2\nmoe_layer_offset = 1"),
            "{text}"
        );
        assert_eq!(ModelSpec::from_toml_str(&text).unwrap(), m);
        let err = |f: &dyn Fn(&mut ModelSpec)| {
            let mut bad = m.clone();
            f(&mut bad);
            bad.validate().unwrap_err().to_string()
        };
        let e = err(&|b| b.moe_layer_offset = 2);
        assert!(
            e.contains("moe_layer_offset is 2, not below moe_layer_step 2"),
            "{e}"
        );
        let e = err(&|b| (b.dense_layers, b.moe_layer_step) = (46, 4));
        assert!(
            e.contains("no layer of the model's 48 is an expert one"),
            "{e}"
        );
        let e = err(&|b| b.dense_ffn = 0);
        assert!(e.contains("dense_layers is 1 without dense_ffn"), "{e}");
        let e = err(&|b| (b.dense_layers, b.dense_ffn) = (0, 0));
        assert!(
            e.contains("moe_layer_step is 2, so the layers between the expert ones are dense"),
            "{e}"
        );
        let e = err(&|b| {
            (b.experts, b.experts_per_token, b.shared_ffn) = (0, 0, 0);
            (b.dense_layers, b.dense_ffn) = (0, 0);
        });
        assert!(
            e.contains("moe_layer_step 2 and moe_layer_offset 1 are given without experts"),
            "{e}"
        );
    }

    /// A sliding window of `w` keys: a windowed layer's products take
    /// `2 w - w^2 / s` keys of the `s` a full layer's take, a stage the
    /// layers' mean; a window past the sequence changes nothing; the FLOP
    /// count stays full attention's.
    #[test]
    fn a_sliding_window_shortens_the_attention_it_covers() {
        let m = ModelSpec {
            seq_len: 4096,
            ..ModelSpec::llama_7b()
        };
        assert_eq!(m.attention_span(), 4096.0);
        let all = ModelSpec {
            sliding_window: 1024,
            ..m.clone()
        };
        all.validate().unwrap();
        assert_eq!(all.attention_span(), 2048.0 - 256.0);
        let half = ModelSpec {
            window_layers: 16,
            ..all.clone()
        };
        assert_eq!(half.attention_span(), (4096.0 + 1792.0) / 2.0);
        let [scores, context] = half.attention_matmuls(1, 1);
        assert_eq!((scores.m, scores.n, context.k), (4096.0, 2944.0, 2944.0));
        let wide = ModelSpec {
            sliding_window: 8192,
            ..m.clone()
        };
        assert_eq!(wide.attention_span(), 4096.0);
        // GPT-OSS's 128 tokens on 18 of its 36 layers at 4,096: its
        // attention's products 53% of full attention's (docs/planner.md).
        let oss = ModelSpec {
            layers: 36,
            sliding_window: 128,
            window_layers: 18,
            ..m.clone()
        };
        assert_eq!((100.0 * oss.attention_span() / 4096.0).round(), 53.0);
        // Chunks of `c`: `c` keys of `s` (Llama 4's 8,192 at 16,384), and
        // full attention where a chunk holds the sequence.
        let chunked = ModelSpec {
            attention_chunk: 8192,
            window_layers: 24,
            seq_len: 16384,
            ..m.clone()
        };
        chunked.validate().unwrap();
        assert_eq!(
            chunked.attention_span(),
            (8.0 * 16384.0 + 24.0 * 8192.0) / 32.0
        );
        let whole = ModelSpec {
            seq_len: 8192,
            ..chunked.clone()
        };
        assert_eq!(whole.attention_span(), 8192.0);
        assert_eq!(half.flops_per_iteration(2), m.flops_per_iteration(2));
        let text = toml::to_string(&half).unwrap();
        assert!(
            text.contains("sliding_window = 1024\nwindow_layers = 16"),
            "{text}"
        );
        assert_eq!(ModelSpec::from_toml_str(&text).unwrap(), half);
        let err = |f: &dyn Fn(&mut ModelSpec)| {
            let mut bad = all.clone();
            f(&mut bad);
            bad.validate().unwrap_err().to_string()
        };
        assert!(err(&|b| b.window_layers = 33).contains("window_layers is 33 of the model's 32"));
        let e = err(&|b| b.attention_chunk = 64);
        assert!(
            e.contains("sliding_window 1024 and attention_chunk 64 are both given"),
            "{e}"
        );
        let e = err(&|b| (b.sliding_window, b.window_layers) = (0, 3));
        assert!(
            e.contains("window_layers is 3 without sliding_window"),
            "{e}"
        );
    }

    #[test]
    fn latent_attention_fields_are_checked_by_name() {
        let err = |f: &dyn Fn(&mut ModelSpec)| {
            let mut m = deepseek_v3();
            f(&mut m);
            m.validate().unwrap_err().to_string()
        };
        assert!(err(&|m| m.kv_heads = 8).contains("kv_heads is 8 of 128 heads"));
        assert!(
            err(&|m| m.rope_head_dim = 200).contains("rope_head_dim 200 is more than head_dim 192")
        );
        assert!(err(&|m| m.q_lora_rank = (1 << 20) + 1).contains("q_lora_rank is 1048577, more"));
        let e = err(&|m| m.kv_lora_rank = 0);
        assert!(
            e.contains("q_lora_rank is 1536 without kv_lora_rank"),
            "{e}"
        );
        let text = toml::to_string(&ModelSpec::llama_7b()).unwrap();
        assert!(!text.contains("lora"), "{text}");
    }

    #[test]
    fn dense_first_layers_are_checked_by_name() {
        let err = |f: &dyn Fn(&mut ModelSpec)| {
            let mut m = glm_4_5();
            f(&mut m);
            m.validate().unwrap_err().to_string()
        };
        assert!(err(&|m| m.dense_layers = 92).contains("dense_layers is 92 of the model's 92"));
        assert!(err(&|m| m.dense_ffn = 0).contains("dense_layers is 3 without dense_ffn"));
        assert!(err(&|m| m.dense_layers = 0).contains("dense_ffn is 12288 without dense_layers"));
        assert!(err(&|m| m.dense_ffn = (1 << 22) + 1).contains("dense_ffn is 4194305, more"));
        let dense = ModelSpec {
            dense_layers: 2,
            dense_ffn: 100,
            ..ModelSpec::llama_7b()
        };
        let e = dense.validate().unwrap_err().to_string();
        assert!(
            e.contains("dense_layers 2 and dense_ffn 100 are given without experts"),
            "{e}"
        );
    }

    #[test]
    fn the_experts_fields_are_checked_by_name() {
        let m = ModelSpec::mixtral_8x7b();
        let err = |f: &dyn Fn(&mut ModelSpec)| {
            let mut m = m.clone();
            f(&mut m);
            m.validate().unwrap_err().to_string()
        };
        assert!(err(&|m| m.experts = 1).contains("experts is 1"));
        assert!(err(&|m| m.experts_per_token = 9).contains("experts_per_token is 9"));
        assert!(err(&|m| m.experts_per_token = 0).contains("experts_per_token is 0"));
        assert!(err(&|m| m.experts = MAX_EXPERTS + 1).contains("more than the planner accepts"));
        let dense = ModelSpec::llama_7b();
        let mut k = dense.clone();
        k.experts_per_token = 2;
        assert!(
            k.validate()
                .unwrap_err()
                .to_string()
                .contains("without experts")
        );
        let mut s = dense.clone();
        s.shared_ffn = 100;
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .contains("shared_ffn is 100")
        );
        // Every count at its limit overflows 64 bits: refused, not wrapped.
        let huge = ModelSpec {
            experts: MAX_EXPERTS,
            experts_per_token: 1,
            ffn: 1 << 22,
            hidden: 1 << 20,
            heads: 1 << 16,
            kv_heads: 1 << 16,
            layers: 1024,
            ..m.clone()
        };
        assert!(huge.validate().unwrap_err().to_string().contains("64 bits"));
        // A dense model's TOML has none of the fields; a mixture's reads back.
        let text = toml::to_string(&ModelSpec::llama_7b()).unwrap();
        assert!(!text.contains("experts"), "{text}");
        let text = toml::to_string(&m).unwrap();
        assert_eq!(ModelSpec::from_toml_str(&text).unwrap(), m);
    }

    #[test]
    fn presets_validate_and_have_the_expected_sizes() {
        for name in PRESETS {
            let m = ModelSpec::preset(name).unwrap();
            m.validate().unwrap();
            assert_eq!(m.name, name);
        }
        let b = |m: ModelSpec| (m.total_params() as f64 / 1e9).round();
        assert_eq!(b(ModelSpec::llama_7b()), 7.0);
        assert_eq!(b(ModelSpec::llama_13b()), 13.0);
        assert_eq!(b(ModelSpec::h2_100b()), 102.0);
        assert_eq!(ModelSpec::preset("H2_100B").unwrap().layers, 96);
        let err = ModelSpec::preset("gpt-9").unwrap_err().to_string();
        assert!(err.contains("\"gpt-9\""), "{err}");
    }

    #[test]
    fn sizes_beyond_the_limits_are_refused_by_name() {
        let mut m = ModelSpec::llama_7b();
        m.hidden = 1 << 32;
        m.heads = 32;
        let err = m.validate().unwrap_err().to_string();
        assert_eq!(
            err,
            "model \"llama-7b\": hidden is 4294967296, more than the planner accepts (1048576)"
        );
        for (field, limit) in MODEL_LIMITS {
            let mut m = ModelSpec::llama_7b();
            let v = limit + 1;
            match field {
                "layers" => m.layers = v,
                "hidden" => m.hidden = v,
                "ffn" => m.ffn = v,
                "heads" => m.heads = v,
                "kv_heads" => m.kv_heads = v,
                "vocab" => m.vocab = v,
                _ => m.seq_len = v,
            }
            let err = m.validate().unwrap_err().to_string();
            assert!(err.contains(&format!("{field} is {v}, more than")), "{err}");
        }
        // Every size at its limit: the counts are still exact.
        let big = ModelSpec {
            name: "big".into(),
            layers: 1024,
            hidden: 1 << 20,
            ffn: 1 << 22,
            heads: 1 << 16,
            kv_heads: 1 << 16,
            vocab: 1 << 24,
            seq_len: 1 << 20,
            ..Default::default()
        };
        big.validate().unwrap();
        assert_eq!(big.checked_total_params(), Some(big.total_params()));
        assert!(big.flops_per_iteration(65_536).is_finite());
        assert!(big.head_forward_flops(65_536).is_finite());
    }

    #[test]
    fn toml_round_trip_and_validation_messages() {
        let text = toml::to_string(&ModelSpec::llama_13b()).unwrap();
        assert_eq!(
            ModelSpec::from_toml_str(&text).unwrap(),
            ModelSpec::llama_13b()
        );
        let bad = text.replace("kv_heads = 40", "kv_heads = 3");
        let err = ModelSpec::from_toml_str(&bad).unwrap_err().to_string();
        assert_eq!(
            err,
            "model \"llama-13b\": kv_heads 3 does not divide heads 40"
        );
    }
}

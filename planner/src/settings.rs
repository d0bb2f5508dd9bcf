//! Training settings: global batch in sequences, compute dtype,
//! recomputation, optimizer-state sharding and the micro-batch sizes the
//! planner may try; read from TOML with defaults for everything but the
//! global batch.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{SpecError, read_file};
use crate::schedule::PipelineSchedule;

/// The dtype matmuls run in (and activations are stored in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// 32-bit float: no master copy, 4-byte weights and activations.
    F32,
    /// bfloat16 mixed precision (the default).
    #[default]
    Bf16,
    /// float16 mixed precision.
    F16,
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
        })
    }
}

impl Dtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
        }
    }
}

/// How the training framework's loss holds the last stage's logits: the
/// vocabulary-parallel softmax cross-entropy as each generation of the
/// stacks ships it, which decides the bytes a logit takes at the loss's
/// peak ([`crate::cost::logits_bytes`]). With `e` the compute dtype's
/// bytes and mixed precision adding an f32 copy of the 16-bit logits:
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossKernel {
    /// The f32 logits turned into their softmax and then into their
    /// gradient in place, the gradient cast back to the compute dtype:
    /// `e + 4` bytes mixed (the 16-bit logits beside their f32 copy in
    /// the forward, the f32 gradient beside its cast in the backward), 4
    /// in f32. Megatron-LM from March 2020 to September 2022 and again
    /// since June 2024 (Megatron-Core's `vocab_parallel_cross_entropy`
    /// and its `native` fused form; Megatron-Bridge's recipes, NeMo),
    /// BigScience's Megatron-DeepSpeed. The default.
    #[default]
    InPlace,
    /// As [`Self::InPlace`] but the maximum subtracted into a new f32
    /// buffer: `e + 8` mixed, 8 in f32 (the logits, their f32 copy and the
    /// difference in the forward). Megatron-LM from September 2022 to June
    /// 2024, Microsoft's Megatron-DeepSpeed (DeepSpeed's, Sailor's).
    OutOfPlace,
    /// Megatron-LM before March 2020 (v1, whose 3D-parallel copy
    /// DeepSpeed's examples and AMP's runs train): the f32 logits cloned,
    /// then exponentiated into another buffer: `e + 12` mixed, 12 in f32.
    Cloned,
    /// PyTorch's `cross_entropy` over f32 logits, an eager framework's
    /// loss: the logits, the f32 log-probabilities it keeps, their f32
    /// gradient and (mixed) that gradient cast back, 12 bytes in 16-bit
    /// and in f32.
    Eager,
    /// A fused kernel that writes the gradient into the logits' own
    /// buffer in the forward: `e` bytes. Transformer Engine's parallel
    /// cross-entropy (Megatron-LM's `--cross-entropy-fusion-impl te`,
    /// Megatron-Bridge's performance scripts) until July 2026, when it
    /// began keeping the gradient in f32 ([`Self::InPlace`]'s bytes).
    Fused,
}

impl LossKernel {
    /// Every kernel, by its name on the command line and in files.
    pub const ALL: [(&'static str, LossKernel); 5] = [
        ("in-place", LossKernel::InPlace),
        ("out-of-place", LossKernel::OutOfPlace),
        ("cloned", LossKernel::Cloned),
        ("eager", LossKernel::Eager),
        ("fused", LossKernel::Fused),
    ];

    /// Its name on the command line and in files.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, k)| *k == self)
            .map_or("in-place", |(n, _)| n)
    }

    /// Bytes a logit keeps once its loss's forward has run, until its
    /// backward: the f32 softmax (or log-probabilities) the backward reads,
    /// or a fused kernel's gradient in the logits' own buffer (`e`). What
    /// a multi-token-prediction head's logits hold while the next head's
    /// loss runs.
    pub fn kept_per_logit(self, e: f64) -> f64 {
        match self {
            LossKernel::Fused => e,
            _ => 4.0,
        }
    }

    /// Bytes a logit takes at the loss's peak, with `e` bytes an element
    /// of the compute dtype (4: f32, no separate f32 copy).
    pub fn bytes_per_logit(self, e: f64) -> f64 {
        let mixed = e < 4.0;
        let copy = if mixed { 4.0 } else { 0.0 };
        match self {
            LossKernel::InPlace => e + copy,
            LossKernel::OutOfPlace => e + copy + 4.0,
            LossKernel::Cloned => e + copy + 8.0,
            LossKernel::Eager => e + 8.0 + if mixed { e } else { 0.0 },
            LossKernel::Fused => e,
        }
    }
}

impl std::str::FromStr for LossKernel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, k)| *k)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|(n, _)| *n).collect();
                format!(
                    "unknown loss kernel `{s}`: expected one of {}",
                    names.join(", ")
                )
            })
    }
}

/// Activation recomputation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    /// Keep every activation (the default).
    #[default]
    None,
    /// Recompute the attention scores in the backward pass (Korthikanti et
    /// al.): `34 s b h / t` bytes per layer.
    Selective,
    /// Keep only each layer's input and recompute the layer: `2 s b h`.
    Full,
}

/// A part of a layer that selective recomputation recomputes in the
/// backward pass (Megatron-LM's `--recompute-modules`, its names): the
/// activations inside it are not kept, its forward runs again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecomputeModule {
    /// The attention's scores and context (Korthikanti et al.'s selective
    /// recomputation; with flash attention nothing is kept to drop).
    CoreAttn,
    /// The two RMSNorms' outputs.
    Layernorm,
    /// Latent attention's up projections and RoPE (their Q, K and V).
    MlaUpProj,
    /// A dense layer's MLP (its gate, up and product outputs).
    Mlp,
    /// A mixture's whole expert block (router, exchange, experts), its
    /// input kept.
    Moe,
    /// The experts' SwiGLU product.
    MoeAct,
    /// The shared expert.
    SharedExperts,
}

impl RecomputeModule {
    /// Every module, by Megatron-LM's name.
    pub const ALL: [(&'static str, RecomputeModule); 7] = [
        ("core_attn", RecomputeModule::CoreAttn),
        ("layernorm", RecomputeModule::Layernorm),
        ("mla_up_proj", RecomputeModule::MlaUpProj),
        ("mlp", RecomputeModule::Mlp),
        ("moe", RecomputeModule::Moe),
        ("moe_act", RecomputeModule::MoeAct),
        ("shared_experts", RecomputeModule::SharedExperts),
    ];

    /// The module Megatron-LM calls `name`.
    pub fn from_name(name: &str) -> Option<RecomputeModule> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|&(_, m)| m)
    }

    /// Its Megatron-LM name.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, m)| *m == self)
            .map_or("", |(n, _)| n)
    }
}

/// Which layers full recomputation recomputes (Megatron-LM's
/// `--recompute-method`), with [`TrainingSettings::recompute_num_layers`]
/// `N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecomputeMethod {
    /// Every layer, its stage's layers in groups of `N` whose inputs are
    /// kept: a group's activations are rebuilt at once (`N` = 1, the
    /// default: each layer's input kept).
    #[default]
    Uniform,
    /// Only the first `N` layers of each stage (of each model chunk under
    /// interleaving); the others keep all their activations.
    Block,
}

/// What full recomputation ([`TrainingSettings::recompute_split`]) makes of
/// a stage's layers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecomputeSplit {
    /// Inputs kept (`2 s b h` each) per micro-batch in flight.
    pub checkpoints: f64,
    /// Layers whose forward pass runs again in the backward pass.
    pub recomputed: f64,
    /// Layers that keep all their activations per micro-batch in flight.
    pub whole: f64,
    /// Layers whose activations a recomputation holds at once.
    pub working: f64,
}

/// The largest global batch the planner accepts, in sequences: 64 times
/// the 1024 of the largest published runs (at 4096 tokens, 268 M tokens per
/// step). It bounds the micro-batches the simulator schedules.
pub const MAX_GLOBAL_BATCH: u64 = 65_536;

/// The most micro-batch sizes [`TrainingSettings::micro_batch_sizes`] may list.
pub const MAX_MICRO_BATCH_SIZES: usize = 64;

/// How to train: batch, precision, memory savers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingSettings {
    /// Sequences per optimizer step, over all data-parallel replicas.
    pub global_batch: u64,
    /// Compute dtype; `bf16` by default.
    #[serde(default)]
    pub dtype: Dtype,
    /// Recomputation; `none` by default.
    #[serde(default)]
    pub recompute: Recompute,
    /// Which layers full recomputation recomputes: `uniform` (the
    /// default) or `block` (Megatron-LM's `--recompute-method`).
    #[serde(default, skip_serializing_if = "is_uniform")]
    pub recompute_method: RecomputeMethod,
    /// Megatron-LM's `--recompute-num-layers` under full recomputation: the
    /// layers of a group (`uniform`) or the layers recomputed per stage
    /// (`block`); 1 by default.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub recompute_num_layers: u64,
    /// Under selective recomputation, the parts of a layer recomputed
    /// (Megatron-LM's `--recompute-modules`); empty (the default): the
    /// core attention alone, Megatron-LM's default and Korthikanti et
    /// al.'s ([`TrainingSettings::recomputes`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recompute_modules: Vec<RecomputeModule>,
    /// Shard the optimizer state over data-parallel replicas (ZeRO-1):
    /// `6 + 12/d` bytes per parameter instead of 18. Off by default.
    #[serde(default)]
    pub shard_optimizer: bool,
    /// How much of the training state the data-parallel replicas of a
    /// stage shard among themselves (ZeRO's stages, Rajbhandari et al.
    /// 2020): 0, nothing; 1, the optimizer state (as `shard_optimizer`);
    /// 2, the gradients too, reduce-scattered after every micro-batch's
    /// backward pass (DeepSpeed's ZeRO-2); 3, the weights too, gathered
    /// for every forward and backward pass (DeepSpeed's ZeRO-3, PyTorch
    /// FSDP's full sharding). 0 by default; `shard_optimizer` makes it at
    /// least 1. [`TrainingSettings::zero`] is the stage in force.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub zero_stage: u8,
    /// The data-parallel gradient reduction runs in buckets while the last
    /// micro-batch's backward pass produces them (Megatron-LM's
    /// `--overlap-grad-reduce`, PyTorch DDP's default, DeepSpeed's
    /// `overlap_comm`; under ZeRO-2 every micro-batch's reduce-scatter),
    /// instead of after it. Off by default (the frameworks' default in
    /// the outside runs the model was validated on); `polychip train`'s
    /// chips always overlap.
    #[serde(default, skip_serializing_if = "is_false")]
    pub overlap_grad_reduce: bool,
    /// With the optimizer state sharded (ZeRO-1, Megatron-LM's distributed
    /// optimizer), the updated weights' all-gather overlaps the next
    /// step's first forward pass (Megatron-LM's `--overlap-param-gather`)
    /// instead of ending the step. Off by default.
    #[serde(default, skip_serializing_if = "is_false")]
    pub overlap_param_gather: bool,
    /// Context parallelism (Megatron-LM's `--context-parallel-size`,
    /// Transformer Engine's ring attention): each stage's sequences are
    /// split over this many groups of its `tp` chips, which exchange keys
    /// and values for attention and reduce their gradients together with
    /// the data-parallel replicas. 1 (the default): none. Scored by
    /// `polychip plan --evaluate`; the search proposes plans without it.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub context_parallel: u64,
    /// Expert parallelism for a mixture-of-experts model (Megatron-LM's
    /// `--expert-model-parallel-size`): each stage's replicas (times its
    /// context-parallel groups) form groups of this many, each holding `E /
    /// ep` of every layer's experts, exchanging the tokens routed to them
    /// (an all-to-all before and after the experts, each way), and
    /// reducing the experts' gradients over the `d / ep` replicas holding
    /// the same experts. 1 (the default): every replica holds every expert.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub expert_parallel: u64,
    /// The expert tensor-parallel degree (Megatron-LM's
    /// `--expert-tensor-parallel-size`): each expert split over this many
    /// chips of a stage's tensor-parallel group, the expert-parallel groups
    /// taken over the stage's replicas times `tp / e` (Megatron-LM's
    /// parallel folding; DeepSeek-V3's and Qwen3-235B's recipes take 1).
    /// 0 (the default): the stage's `tp`.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub expert_tensor_parallel: u64,
    /// FP8 training (Transformer Engine's recipes, Megatron-LM's
    /// `--fp8-format`): the layers' weight matmuls run in FP8 at the chip's
    /// `peak_flops.fp8`, their inputs (forward) and output gradients
    /// (backward) cast to FP8 first, and each layer's weights kept in FP8
    /// beside the `dtype` copy (with their transposes); attention, the
    /// head, the embedding and the memory-bound passes stay in `dtype`
    /// (bf16 or f16). Off by default.
    #[serde(default, skip_serializing_if = "is_false")]
    pub fp8: bool,
    /// Keep gradients in bf16 (16 bytes per parameter instead of 18).
    #[serde(default)]
    pub bf16_gradients: bool,
    /// Attention runs as flash attention, which stores no `a s^2` score
    /// matrices: `34 s b h / t` bytes per layer. On by default.
    #[serde(default = "yes")]
    pub flash_attention: bool,
    /// Sequence parallelism (Korthikanti et al.) beside tensor parallelism:
    /// the norms' and dropouts' activations are split over the `t` chips
    /// too, `34 s b h / t` bytes per layer; without it (Megatron-LM before
    /// `--sequence-parallel`, DeepSpeed's Megatron) they are not, `s b h (10
    /// + 24 / t)`. On by default.
    #[serde(default = "yes")]
    pub sequence_parallel: bool,
    /// How the loss holds the logits ([`LossKernel`]); `in-place`
    /// (Megatron-Core's) by default.
    #[serde(default, skip_serializing_if = "is_in_place")]
    pub loss: LossKernel,
    /// Micro-batch sizes (sequences) the planner may choose from.
    #[serde(default = "default_micro_batches")]
    pub micro_batch_sizes: Vec<u64>,
    /// The pipelines' schedule; 1F1B (Megatron-LM's and DeepSpeed's) by
    /// default. A plan file that names one is evaluated under its own.
    #[serde(default)]
    pub schedule: PipelineSchedule,
    /// Model chunks per pipeline device under Megatron-LM's interleaved
    /// 1F1B schedule; 1 (the default): not interleaved. Plans that use it
    /// are scored (`polychip plan --evaluate`, whose plan file may name it);
    /// the search proposes plans without it.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub virtual_stages: u64,
    /// How far each pipeline stage runs ahead of the next, as a multiple
    /// of the schedule's lead ([`crate::schedule::Schedule::run_ahead`]):
    /// 1 (the default) to [`crate::schedule::MAX_RUN_AHEAD`]. More holds
    /// more micro-batches' activations on the stages before the last,
    /// which the memory model counts (the search's and `--evaluate`'s). A
    /// plan file that names one (`polychip train --save-plan`'s
    /// `run_ahead`) is evaluated under its own.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub run_ahead: u64,
}

/// What each part of the training state is divided by over a stage's
/// data-parallel replicas ([`TrainingSettings::shards`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shards {
    /// The optimizer state (ZeRO-1 and up).
    pub optimizer: f64,
    /// The gradients (ZeRO-2 and up).
    pub gradients: f64,
    /// The weights (ZeRO-3).
    pub weights: f64,
}

/// The most model chunks per device an interleaved plan may have.
pub const MAX_VIRTUAL_STAGES: u64 = 64;

fn one() -> u64 {
    1
}

fn is_one(v: &u64) -> bool {
    *v == 1
}

fn yes() -> bool {
    true
}

fn is_uniform(v: &RecomputeMethod) -> bool {
    *v == RecomputeMethod::Uniform
}

fn is_in_place(v: &LossKernel) -> bool {
    *v == LossKernel::InPlace
}

fn is_false(v: &bool) -> bool {
    !*v
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

fn is_zero(v: &u8) -> bool {
    *v == 0
}

/// The most layers [`TrainingSettings::recompute_num_layers`] may give.
pub const MAX_RECOMPUTE_NUM_LAYERS: u64 = 1_000_000;

/// The most groups [`TrainingSettings::context_parallel`] may split a
/// sequence over.
pub const MAX_CONTEXT_PARALLEL: u64 = 1024;

/// The largest [`TrainingSettings::expert_parallel`] degree: the most
/// experts a model may have ([`crate::model::MAX_EXPERTS`]).
pub const MAX_EXPERT_PARALLEL: u64 = crate::model::MAX_EXPERTS;

/// The largest [`TrainingSettings::expert_tensor_parallel`] degree: a
/// tensor-parallel group's largest (`polychip plan`'s tp is at most a
/// node's chips).
pub const MAX_EXPERT_TENSOR_PARALLEL: u64 = 1 << 16;

/// The highest ZeRO stage ([`TrainingSettings::zero_stage`]).
pub const MAX_ZERO_STAGE: u8 = 3;

fn default_micro_batches() -> Vec<u64> {
    vec![1, 2, 4, 8]
}

impl TrainingSettings {
    /// What sequence parallelism divides the activations outside a
    /// layer's tensor-parallel matmuls by on each of `tp` chips (norms,
    /// dropouts, a layer's input): `tp` with it, 1 without, where they are
    /// whole on every chip.
    pub fn sequence_split(&self, tp: u64) -> f64 {
        match self.sequence_parallel {
            true => tp.max(1) as f64,
            false => 1.0,
        }
    }

    /// The defaults with a given global batch.
    pub fn new(global_batch: u64) -> Self {
        TrainingSettings {
            global_batch,
            dtype: Dtype::default(),
            recompute: Recompute::default(),
            recompute_method: RecomputeMethod::default(),
            recompute_num_layers: 1,
            recompute_modules: Vec::new(),
            shard_optimizer: false,
            zero_stage: 0,
            overlap_grad_reduce: false,
            overlap_param_gather: false,
            context_parallel: 1,
            expert_parallel: 1,
            expert_tensor_parallel: 0,
            fp8: false,
            bf16_gradients: false,
            flash_attention: true,
            sequence_parallel: true,
            loss: LossKernel::InPlace,
            micro_batch_sizes: default_micro_batches(),
            schedule: PipelineSchedule::default(),
            virtual_stages: 1,
            run_ahead: 1,
        }
    }

    /// Parses and validates settings from TOML text.
    pub fn from_toml_str(text: &str) -> Result<Self, SpecError> {
        let s: TrainingSettings = toml::from_str(text).map_err(|e| SpecError::Toml {
            what: "training settings",
            message: polychip_files::toml_error(text, &e),
        })?;
        s.validate()?;
        Ok(s)
    }

    /// Reads, parses and validates a settings TOML file.
    pub fn load(path: &Path) -> Result<Self, SpecError> {
        Self::from_toml_str(&read_file(path)?)
    }

    /// Checks `virtual_stages`: 1 to [`MAX_VIRTUAL_STAGES`], and above 1
    /// only with the 1F1B schedule; and `run_ahead`: 1 to
    /// [`crate::schedule::MAX_RUN_AHEAD`], and 1 under interleaving (whose
    /// warm-up is Megatron-LM's).
    pub fn check_interleaving(&self) -> Result<(), SpecError> {
        let max = crate::schedule::MAX_RUN_AHEAD as u64;
        if !(1..=max).contains(&self.run_ahead) {
            return Err(SpecError::Settings(format!(
                "run_ahead is {}; it must be 1 (the schedule as published) to {max}",
                self.run_ahead
            )));
        }
        if self.run_ahead > 1 && self.virtual_stages > 1 {
            return Err(SpecError::Settings(format!(
                "run_ahead is {} with virtual_stages {}; an interleaved pipeline runs \
                 Megatron-LM's warm-up, so give run_ahead 1",
                self.run_ahead, self.virtual_stages
            )));
        }
        if !(1..=MAX_VIRTUAL_STAGES).contains(&self.virtual_stages) {
            return Err(SpecError::Settings(format!(
                "virtual_stages is {}; it must be 1 (no interleaving) to {MAX_VIRTUAL_STAGES}",
                self.virtual_stages
            )));
        }
        if self.virtual_stages > 1 && self.schedule != PipelineSchedule::OneFOneB {
            return Err(SpecError::Settings(format!(
                "virtual_stages is {} with the {} schedule; interleaving is modelled for 1f1b \
                 only",
                self.virtual_stages,
                self.schedule.name()
            )));
        }
        Ok(())
    }

    /// Checks `recompute_num_layers` (1 to [`MAX_RECOMPUTE_NUM_LAYERS`])
    /// and that it and `recompute_method` are given only with full
    /// recomputation.
    pub fn check_recompute(&self) -> Result<(), SpecError> {
        let n = self.recompute_num_layers;
        if !(1..=MAX_RECOMPUTE_NUM_LAYERS).contains(&n) {
            return Err(SpecError::Settings(format!(
                "recompute_num_layers is {n}; it must be 1 to {MAX_RECOMPUTE_NUM_LAYERS}"
            )));
        }
        if !self.recompute_modules.is_empty() && self.recompute != Recompute::Selective {
            let names: Vec<&str> = self.recompute_modules.iter().map(|m| m.name()).collect();
            return Err(SpecError::Settings(format!(
                "recompute_modules [{}] apply to selective recomputation, but recompute is {}; \
                 give recompute = \"selective\" (--recompute selective)",
                names.join(", "),
                format!("{:?}", self.recompute).to_lowercase(),
            )));
        }
        let partial = n != 1 || self.recompute_method != RecomputeMethod::Uniform;
        if partial && self.recompute != Recompute::Full {
            return Err(SpecError::Settings(format!(
                "recompute_method {} with recompute_num_layers {n} applies to full \
                 recomputation, but recompute is {}; give recompute = \"full\" (--recompute \
                 full)",
                format!("{:?}", self.recompute_method).to_lowercase(),
                format!("{:?}", self.recompute).to_lowercase(),
            )));
        }
        Ok(())
    }

    /// Whether selective recomputation recomputes `module`: one of
    /// `recompute_modules`, or the core attention where they are empty.
    #[inline]
    pub fn recomputes(&self, module: RecomputeModule) -> bool {
        self.recompute == Recompute::Selective
            && match self.recompute_modules.is_empty() {
                true => module == RecomputeModule::CoreAttn,
                false => self.recompute_modules.contains(&module),
            }
    }

    /// What recomputation makes of a stage's (or model chunk's) `layers`
    /// layers: under full recomputation, `uniform` keeps the input of each
    /// group of `N` (`ceil(n / N)`), recomputes every layer and rebuilds a
    /// group (`min(N, n)` layers) at once; `block` keeps the input of and
    /// recomputes the first `r = min(N, n)` layers, one at a time, and the
    /// other `n - r` keep all their activations. Without it every layer
    /// keeps its activations (selective recomputation's are counted by the
    /// activation formula).
    pub fn recompute_split(&self, layers: u64) -> RecomputeSplit {
        let n = layers as f64;
        let group = self.recompute_num_layers.max(1);
        match (self.recompute, self.recompute_method) {
            (Recompute::Full, RecomputeMethod::Uniform) => RecomputeSplit {
                checkpoints: layers.div_ceil(group) as f64,
                recomputed: n,
                whole: 0.0,
                working: layers.min(group) as f64,
            },
            (Recompute::Full, RecomputeMethod::Block) => {
                let r = layers.min(group) as f64;
                RecomputeSplit {
                    checkpoints: r,
                    recomputed: r,
                    whole: n - r,
                    working: r.min(1.0),
                }
            }
            _ => RecomputeSplit {
                checkpoints: 0.0,
                recomputed: 0.0,
                whole: n,
                working: 0.0,
            },
        }
    }

    /// Checks `context_parallel`: 1 to [`MAX_CONTEXT_PARALLEL`], and above
    /// 1 only with flash attention (Transformer Engine's ring attention,
    /// which Megatron-LM's context parallelism runs on).
    pub fn check_context_parallel(&self) -> Result<(), SpecError> {
        let c = self.context_parallel;
        if !(1..=MAX_CONTEXT_PARALLEL).contains(&c) {
            return Err(SpecError::Settings(format!(
                "context_parallel is {c}; it must be 1 (none) to {MAX_CONTEXT_PARALLEL}"
            )));
        }
        if c > 1 && !self.flash_attention {
            return Err(SpecError::Settings(format!(
                "context_parallel is {c} without flash attention; context parallelism runs on \
                 fused (flash) attention kernels, so drop flash_attention = false \
                 (--no-flash-attention)"
            )));
        }
        Ok(())
    }

    /// Checks `expert_parallel`: 1 to [`MAX_EXPERT_PARALLEL`] (whether the
    /// model has experts it divides is
    /// [`crate::cost::check_cluster_settings`]'s).
    pub fn check_expert_parallel(&self) -> Result<(), SpecError> {
        if !(1..=MAX_EXPERT_PARALLEL).contains(&self.expert_parallel) {
            return Err(SpecError::Settings(format!(
                "expert_parallel is {}; it must be 1 (none) to {MAX_EXPERT_PARALLEL}",
                self.expert_parallel
            )));
        }
        if self.expert_tensor_parallel > MAX_EXPERT_TENSOR_PARALLEL {
            return Err(SpecError::Settings(format!(
                "expert_tensor_parallel is {}; it must be 0 (a stage's tp) to \
                 {MAX_EXPERT_TENSOR_PARALLEL}",
                self.expert_tensor_parallel
            )));
        }
        Ok(())
    }

    /// Checks `fp8`: only beside a 16-bit `dtype` (FP8 training keeps its
    /// activations and the weights' master copy there; whether the chips
    /// have FP8 matmuls is [`crate::cost::check_cluster_settings`]'s).
    pub fn check_fp8(&self) -> Result<(), SpecError> {
        if self.fp8 && self.dtype == Dtype::F32 {
            return Err(SpecError::Settings(
                "fp8 is set with dtype f32; FP8 training runs its matmuls in FP8 beside 16-bit \
                 activations: give dtype bf16 or f16"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Checks `zero_stage`: 0 to [`MAX_ZERO_STAGE`]; and
    /// `overlap_param_gather` only with the optimizer state sharded and
    /// the weights not (ZeRO-1: ZeRO-2 gathers at the step's end as it
    /// always has, ZeRO-3 for every pass).
    pub fn check_zero(&self) -> Result<(), SpecError> {
        if self.zero_stage > MAX_ZERO_STAGE {
            return Err(SpecError::Settings(format!(
                "zero_stage is {}; it must be 0 (nothing sharded), 1 (the optimizer state), 2 \
                 (and the gradients) or 3 (and the weights: ZeRO-3, FSDP)",
                self.zero_stage
            )));
        }
        if self.overlap_param_gather && self.zero() != 1 {
            return Err(SpecError::Settings(format!(
                "overlap_param_gather overlaps the gather of the weights a sharded optimizer \
                 updated (ZeRO-1, Megatron-LM's distributed optimizer), but the ZeRO stage is \
                 {}; give shard_optimizer (--shard-optimizer) or zero_stage 1",
                self.zero()
            )));
        }
        Ok(())
    }

    /// The ZeRO stage in force: `zero_stage`, at least 1 with
    /// `shard_optimizer`.
    pub fn zero(&self) -> u8 {
        self.zero_stage.max(u8::from(self.shard_optimizer))
    }

    /// What the optimizer state, the gradients and the weights of a stage
    /// are each divided by over its `dp` data-parallel replicas under the
    /// ZeRO stage in force ([`TrainingSettings::zero`]).
    pub fn shards(&self, dp: u64) -> Shards {
        let d = dp.max(1) as f64;
        let by = |stage: u8| if self.zero() >= stage { d } else { 1.0 };
        Shards {
            optimizer: by(1),
            gradients: by(2),
            weights: by(3),
        }
    }

    /// Checks the batch and the micro-batch candidates.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.global_batch == 0 {
            return Err(SpecError::Settings(
                "global_batch is 0; it must be at least 1".into(),
            ));
        }
        if self.global_batch > MAX_GLOBAL_BATCH {
            return Err(SpecError::Settings(format!(
                "global_batch is {}, more than the planner accepts ({MAX_GLOBAL_BATCH} sequences)",
                self.global_batch
            )));
        }
        if self.micro_batch_sizes.len() > MAX_MICRO_BATCH_SIZES {
            return Err(SpecError::Settings(format!(
                "micro_batch_sizes lists {} sizes; at most {MAX_MICRO_BATCH_SIZES} are accepted",
                self.micro_batch_sizes.len()
            )));
        }
        if let Some(b) = self
            .micro_batch_sizes
            .iter()
            .find(|&&b| b > MAX_GLOBAL_BATCH)
        {
            return Err(SpecError::Settings(format!(
                "micro_batch_sizes contains {b}, more than the largest global batch \
                 ({MAX_GLOBAL_BATCH})"
            )));
        }
        if self.micro_batch_sizes.is_empty() {
            return Err(SpecError::Settings(
                "micro_batch_sizes is empty; give at least one size".into(),
            ));
        }
        self.check_interleaving()?;
        self.check_zero()?;
        self.check_recompute()?;
        self.check_context_parallel()?;
        self.check_expert_parallel()?;
        self.check_fp8()?;
        if self.micro_batch_sizes.contains(&0) {
            return Err(SpecError::Settings(
                "micro_batch_sizes contains 0; sizes must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// Bytes per gradient element: 2 with bf16 gradients, else 4.
    pub fn grad_bytes(&self) -> f64 {
        if self.bf16_gradients { 2.0 } else { 4.0 }
    }

    /// Optimizer-state bytes per parameter before sharding: fp32 master
    /// copy plus Adam's two moments (12) in mixed precision; the two moments
    /// (8) in f32, where the weights are the master copy.
    pub fn optimizer_bytes(&self) -> f64 {
        match self.dtype {
            Dtype::F32 => 8.0,
            Dtype::Bf16 | Dtype::F16 => 12.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_parsing() {
        let s = TrainingSettings::from_toml_str("global_batch = 512").unwrap();
        assert_eq!(s, TrainingSettings::new(512));
        let s = TrainingSettings::from_toml_str(
            "global_batch = 64\ndtype = \"f16\"\nrecompute = \"selective\"\nshard_optimizer = true",
        )
        .unwrap();
        assert_eq!((s.dtype, s.recompute), (Dtype::F16, Recompute::Selective));
        assert!(s.shard_optimizer);
        let err = TrainingSettings::from_toml_str("global_batch = 0")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "training settings: global_batch is 0; it must be at least 1"
        );
    }

    #[test]
    fn sizes_beyond_the_limits_are_refused() {
        let err = TrainingSettings::new(100_000_000)
            .validate()
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "training settings: global_batch is 100000000, more than the planner accepts (65536 sequences)"
        );
        TrainingSettings::new(MAX_GLOBAL_BATCH).validate().unwrap();
        let mut s = TrainingSettings::new(8);
        s.micro_batch_sizes = vec![1, 1 << 40];
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("contains 1099511627776, more than"), "{err}");
        s.micro_batch_sizes = vec![1; 65];
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("lists 65 sizes"), "{err}");
    }
}

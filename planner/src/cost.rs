//! The cost model of one pipeline stage: memory per device (weights,
//! gradients, optimizer state, 1F1B activations, the logits and loss
//! buffers, the transient workspace, the runtime's reserve) and time per
//! micro-batch and per step (compute priced per operation class, the
//! tensor-parallel all-reduces, point-to-point transfers, the data-parallel
//! gradient all-reduce, the optimizer step). FLOP counts, parameter counts,
//! 18 bytes per parameter and the activation formulas are those of
//! `../shared/ANCHORS.md`, "Planning"; the constants below are documented
//! in `docs/planner.md`, "The cost model". Sizes are bytes, times seconds,
//! rates FLOP/s and bytes/s. The result feeds [`crate::schedule::StageTiming`].

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::cluster::{ChipType, ClusterSpec, Framework};
use crate::model::{ExpertSplit, Matmul, MemoryPass, ModelSpec};
use crate::schedule::StageTiming;
use crate::settings::{Recompute, RecomputeModule, Shards, TrainingSettings};

/// The stage after this one: its chip type and whether the boundary stays
/// inside a node (only possible for the same chip type).
#[derive(Debug, Clone, Copy)]
pub struct Boundary<'a> {
    /// The next stage's chip type.
    pub chip: &'a ChipType,
    /// Both stages' chips share a node, so the transfer uses the intra-node link.
    pub same_node: bool,
    /// Chips of this stage that send out of one node at once (its `tp`
    /// times its replicas there), and of the next stage that receive into
    /// one: across nodes, each end's share of its node's network
    /// ([`ClusterSpec::send_bandwidth`]). `u64::MAX`: the whole node.
    pub senders: u64,
    pub receivers: u64,
}

/// One pipeline stage as the cost model sees it.
#[derive(Debug, Clone)]
pub struct StageShape<'a> {
    /// The chip type all of the stage's chips are.
    pub chip: &'a ChipType,
    /// The model layers it runs, 0-based, end exclusive. The first stage
    /// also holds the embedding, the last the final norm and the output
    /// head; either may hold no layer beside them (a trainer plan's stage
    /// of one end alone).
    pub layers: Range<u64>,
    /// Its position in the pipeline, 0-based.
    pub index: usize,
    /// Stages in the pipeline (`p`).
    pub num_stages: usize,
    /// Data-parallel replicas of this stage (`d`).
    pub dp: u64,
    /// Tensor-parallel degree inside a node (`t`).
    pub tp: u64,
    /// The next stage; `None` for the last.
    pub next: Option<Boundary<'a>>,
    /// The chip types (indices into the cluster) of the replicas its
    /// gradients are reduced with; a type other than its own puts the
    /// all-reduce across nodes ([`dp_bandwidth`]). Empty: only copies of
    /// its own pipeline.
    pub dp_peers: &'a [usize],
    /// All `d` replicas of the stage sit in one node
    /// ([`crate::placement`]), so their all-reduce stays inside it.
    pub dp_one_node: bool,
}

impl StageShape<'_> {
    /// Whether it holds the embedding: the pipeline's first stage (which
    /// may hold no layer beside it).
    pub fn holds_embedding(&self) -> bool {
        self.index == 0
    }

    /// Whether it holds the final norm and the output head: the last stage
    /// (which may hold no layer beside them).
    pub fn holds_head(&self) -> bool {
        self.index + 1 == self.num_stages
    }

    /// Its parameters: its layers', and the embedding's and the head's
    /// where it holds them.
    pub fn params(&self, model: &ModelSpec) -> u64 {
        let (embedding, head) = (self.holds_embedding(), self.holds_head());
        let mut params = model.layers_params(&self.layers);
        if embedding {
            params += model.embedding_params();
        }
        if head {
            params += model.head_params();
        }
        params + model.mtp_table_params(embedding, head)
            - model.shared_table_params(embedding, head)
    }
}

/// The replicas a stage's gradients are reduced over and its training
/// state is sharded over: its data-parallel replicas times the context-
/// parallel groups of each (`TrainingSettings::context_parallel`), as
/// Megatron-LM reduces over its data- and context-parallel group.
#[inline]
pub fn reduction_group(settings: &TrainingSettings, stage: &StageShape) -> u64 {
    stage
        .dp
        .max(1)
        .saturating_mul(settings.context_parallel.max(1))
}

/// How `model`'s experts are split at a stage's `tp`: the expert-parallel
/// and expert tensor-parallel degrees ([`ModelSpec::layer_matmuls`]).
#[inline]
pub fn experts_split(model: &ModelSpec, settings: &TrainingSettings, tp: u64) -> ExpertSplit {
    ExpertSplit {
        ep: expert_parallel(model, settings),
        etp: expert_tensor_parallel(model, settings, tp),
    }
}

/// The expert-parallel degree that divides `model`'s experts: the
/// settings' `expert_parallel` for a mixture of experts, 1 for a dense
/// model (which [`check_cluster_settings`] refuses it for).
#[inline]
pub fn expert_parallel(model: &ModelSpec, settings: &TrainingSettings) -> u64 {
    match model.is_moe() {
        true => settings.expert_parallel.max(1),
        false => 1,
    }
}

/// The expert tensor-parallel degree of a stage at `tp` (Megatron-LM's
/// `--expert-tensor-parallel-size`): the settings'
/// `expert_tensor_parallel` for a mixture of experts where it gives one,
/// else the stage's `tp` (Megatron-LM's default).
#[inline]
pub fn expert_tensor_parallel(model: &ModelSpec, settings: &TrainingSettings, tp: u64) -> u64 {
    match (model.is_moe(), settings.expert_tensor_parallel) {
        (true, e) if e > 0 => e,
        _ => tp.max(1),
    }
}

/// Why a stage at `tp` in `replicas` data-parallel replicas (times its
/// context-parallel groups) cannot hold a mixture's experts as the
/// settings fold them (Megatron-LM's parallel folding: the expert
/// tensor-parallel degree `e` divides the stage's `tp`, and the
/// expert-parallel degree its `replicas tp / e` chips of one slice of the
/// attention); `None` where it can, or for a dense model.
#[inline]
pub fn experts_unfolded(
    model: &ModelSpec,
    settings: &TrainingSettings,
    tp: u64,
    replicas: u64,
) -> Option<String> {
    let (ep, etp) = (
        expert_parallel(model, settings),
        expert_tensor_parallel(model, settings, tp),
    );
    let tp = tp.max(1);
    if tp % etp != 0 {
        return Some(format!(
            "expert_tensor_parallel {etp} does not divide a stage's tp {tp} (the experts are \
             split over a part of the attention's tensor-parallel group)"
        ));
    }
    let chips = replicas.saturating_mul(tp / etp);
    (chips % ep != 0).then(|| {
        format!(
            "expert_parallel is {ep}, which does not divide a stage's {chips} expert slices (its \
             {replicas} replicas, times its context-parallel groups, times tp {tp} over \
             expert_tensor_parallel {etp}): an expert-parallel group is {ep} of them"
        )
    })
}

/// A stage's parameters on each of its chips: the dense ones (attention,
/// norms, router, shared expert, embedding and head) over its `tp`, and a
/// mixture of experts' routed experts over the expert tensor-parallel
/// degree `e` ([`expert_tensor_parallel`], the `tp` by default) times the
/// expert-parallel degree. The dense ones are reduced and sharded over the
/// stage's reduction group ([`reduction_group`]), the experts over its `tp
/// / (e ep)` ([`Self::expert_group`]), the chips that hold the same
/// experts (Megatron-LM's expert data-parallel group).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ChipParams {
    /// Dense parameters a chip holds.
    pub dense: f64,
    /// Routed experts' parameters a chip holds.
    pub experts: f64,
    /// The stage's `tp` over the expert tensor-parallel degree: how many
    /// chips of a replica hold the same experts (1 at the default and for
    /// a dense model; 0, in a `Default` value, is taken as 1).
    pub tp_per_etp: u64,
}

impl ChipParams {
    /// Of `params` parameters of `all` layers, `layers` of them expert
    /// layers whose routed experts are among them, on each of `tp` chips
    /// under the settings' expert-parallel and expert tensor-parallel
    /// degrees; the layers' parameters tensor parallelism does not split
    /// ([`ModelSpec::replicated_layer_params`]) whole on each.
    #[inline]
    pub fn split(
        model: &ModelSpec,
        settings: &TrainingSettings,
        params: u64,
        layers: u64,
        all: u64,
        tp: u64,
    ) -> ChipParams {
        let t = tp.max(1) as f64;
        let whole = all
            .saturating_mul(model.replicated_layer_params())
            .min(params);
        let split = |p: u64| (p - whole) as f64 / t + whole as f64;
        if !model.is_moe() {
            return ChipParams {
                dense: split(params),
                experts: 0.0,
                tp_per_etp: 1,
            };
        }
        let experts = layers
            .saturating_mul(model.expert_params())
            .min(params - whole);
        let etp = expert_tensor_parallel(model, settings, tp);
        ChipParams {
            dense: split(params - experts),
            experts: experts as f64 / etp as f64 / expert_parallel(model, settings) as f64,
            tp_per_etp: (tp.max(1) / etp).max(1),
        }
    }

    /// Of `n` layers like its last (without the embedding or head: a
    /// mixture's expert layers, not its dense first ones), on each of `tp`
    /// chips.
    pub fn layers(model: &ModelSpec, settings: &TrainingSettings, n: u64, tp: u64) -> ChipParams {
        Self::split(
            model,
            settings,
            n.saturating_mul(model.layer_params()),
            n,
            n,
            tp,
        )
    }

    /// The parameters whose optimizer state a chip updates: each part over
    /// its group's optimizer shards (ZeRO-1 and up; `group` the dense
    /// part's, [`Self::over_groups`]).
    pub fn updated(&self, model: &ModelSpec, settings: &TrainingSettings, group: u64) -> f64 {
        self.over_groups(model, settings, group, |p, g| {
            p / settings.shards(g).optimizer
        })
    }

    /// Of the layers `range` (without the embedding or head), each of its
    /// kind, on each of `tp` chips.
    pub fn range(
        model: &ModelSpec,
        settings: &TrainingSettings,
        range: &Range<u64>,
        tp: u64,
    ) -> ChipParams {
        let experts = model.expert_layers_in(range);
        let all = range.end.saturating_sub(range.start);
        Self::split(
            model,
            settings,
            model.layers_params(range),
            experts,
            all,
            tp,
        )
    }

    /// Of `stage`, on each of its chips.
    #[inline]
    pub fn of(model: &ModelSpec, settings: &TrainingSettings, stage: &StageShape) -> ChipParams {
        let experts = model.expert_layers_in(&stage.layers);
        let all = stage.layers.end.saturating_sub(stage.layers.start);
        Self::split(model, settings, stage.params(model), experts, all, stage.tp)
    }

    /// Both parts.
    #[inline]
    pub fn total(&self) -> f64 {
        self.dense + self.experts
    }

    /// The experts' reduction group when the dense part's is `group`:
    /// `group tp / (e ep)`, the chips holding the same experts.
    #[inline]
    pub fn expert_group(&self, model: &ModelSpec, settings: &TrainingSettings, group: u64) -> u64 {
        let chips = group.saturating_mul(self.tp_per_etp.max(1));
        (chips / expert_parallel(model, settings)).max(1)
    }

    /// `f(part, its group)` summed over the two parts, the dense part's
    /// group being `group` and the experts' [`Self::expert_group`].
    #[inline]
    pub fn over_groups(
        &self,
        model: &ModelSpec,
        settings: &TrainingSettings,
        group: u64,
        f: impl Fn(f64, u64) -> f64,
    ) -> f64 {
        let mut total = f(self.dense, group);
        if self.experts > 0.0 {
            total += f(self.experts, self.expert_group(model, settings, group));
        }
        total
    }
}

/// The model as each chip of a context-parallel group sees it: `s / c`
/// tokens of each sequence (its activations, its matmuls' rows, its
/// boundary sends); the model itself without context parallelism. Its
/// attention attends `s` keys, which [`analytic_stage_timing`] adds.
pub fn per_chip_model<'m>(
    model: &'m ModelSpec,
    settings: &TrainingSettings,
) -> std::borrow::Cow<'m, ModelSpec> {
    match settings.context_parallel {
        0 | 1 => std::borrow::Cow::Borrowed(model),
        c => std::borrow::Cow::Owned(ModelSpec {
            seq_len: (model.seq_len / c).max(1),
            ..model.clone()
        }),
    }
}

/// Micro-batch size (sequences, `b`) and count per step (`m`) of one
/// pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Microbatching {
    /// Sequences per micro-batch.
    pub size: u64,
    /// Micro-batches per step.
    pub count: u64,
}

/// Memory of one device of a stage, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct MemoryBreakdown {
    /// Model weights in the compute dtype.
    pub weights: f64,
    /// Gradients.
    pub gradients: f64,
    /// Optimizer state (master copy and Adam moments), after sharding.
    pub optimizer: f64,
    /// Activations kept for the backward pass under 1F1B.
    pub activations: f64,
    /// The last stage only: the logits and loss buffers of the micro-batch
    /// being trained ([`logits_bytes`]) beyond the last layer's recomputed
    /// activations and backward transients, which never coexist with them
    /// (the peak holds the larger).
    #[serde(default)]
    pub logits: f64,
    /// The largest transient buffers of one pass, see [`workspace_bytes`];
    /// on the first stage also what its embedding's backward needs beyond
    /// them ([`embedding_backward_bytes`]).
    #[serde(default)]
    pub workspace: f64,
    /// What the runtime and allocator keep, see
    /// [`ChipType::memory_reserve`].
    #[serde(default)]
    pub reserve: f64,
    /// The sum.
    pub total: f64,
}

/// A count's terms: the parameters' (weights, gradients, optimizer state)
/// and the rest (activations, logits, workspace).
type Terms = ([f64; 3], [f64; 3]);

impl MemoryBreakdown {
    /// One device's memory from the breakdowns of the model chunks it
    /// holds under interleaving: their weights, gradients, optimizer state,
    /// activations and logits add up; the workspace is the largest chunk's
    /// (one pass runs at a time) and the reserve is counted once.
    pub fn of_device(chunks: &[MemoryBreakdown]) -> MemoryBreakdown {
        let mut d = MemoryBreakdown::default();
        for c in chunks {
            d.weights += c.weights;
            d.gradients += c.gradients;
            d.optimizer += c.optimizer;
            d.activations += c.activations;
            d.logits += c.logits;
            d.workspace = d.workspace.max(c.workspace);
            d.reserve = d.reserve.max(c.reserve);
        }
        d.total = d.weights
            + d.gradients
            + d.optimizer
            + d.activations
            + d.logits
            + d.workspace
            + d.reserve;
        d
    }

    /// `terms` with `chip`'s reserve, and `total` their sum.
    fn of(chip: &ChipType, ([weights, gradients, optimizer], rest): Terms) -> Self {
        let reserve = chip.memory_reserve() as f64;
        MemoryBreakdown {
            weights,
            gradients,
            optimizer,
            activations: rest[0],
            logits: rest[1],
            workspace: rest[2],
            reserve,
            total: weights + gradients + optimizer + rest.iter().sum::<f64>() + reserve,
        }
    }
}

/// A chip's matmul library workspace: `matmul_workspace_bytes`, or
/// [`MATMUL_WORKSPACE_BYTES`].
fn matmul_workspace(chip: &ChipType) -> f64 {
    chip.matmul_workspace_bytes
        .map_or(MATMUL_WORKSPACE_BYTES, |b| b as f64)
}

/// Bytes a layer parameter takes beside its `dtype` copy under FP8
/// training: its FP8 copy and that copy's transpose (Transformer Engine
/// keeps both for the forward and backward matmuls on Hopper, across the
/// step's micro-batches).
pub const FP8_WEIGHT_BYTES: f64 = 2.0;

/// A matmul library's own scratch space per device, 32 MiB (cuBLAS asks
/// for up to 32 MiB on Hopper; our choice for every chip).
pub const MATMUL_WORKSPACE_BYTES: f64 = 32.0 * 1024.0 * 1024.0;

/// The side length at which a matmul reaches half its large-shape rate:
/// the shape factor is `d / (d + MATMUL_HALF_DIM)` in the smallest of
/// `m, n, k`. Our estimate from FlashAttention-2 (Dao 2023), whose
/// head-dim-128 forward runs at about 0.8 of a large GEMM's rate on A100
/// (about 0.7 at head dim 64).
pub const MATMUL_HALF_DIM: f64 = 32.0;

/// The fixed cost of every kernel (launch, ramp-up and the last partial
/// wave of thread blocks), seconds. Our estimate: 5 us, the order of a
/// CUDA kernel launch. It is what makes small matmuls slow and what tensor
/// parallelism does not divide.
pub const KERNEL_OVERHEAD: f64 = 5e-6;

/// Latency of one step of a ring collective between the chips of a node,
/// seconds; a ring all-reduce over `t` chips takes `2 (t - 1)` steps. Our
/// estimate (10 us, pessimistic for NVLink, whose small-message all-reduce
/// on 8 GPUs takes 10-20 us in all; it also stands for the tensor-parallel
/// ranks waiting on one another at every all-reduce).
pub const COLLECTIVE_HOP_LATENCY: f64 = 10e-6;

/// The message size at which a tensor-parallel all-reduce reaches half its
/// link's bandwidth, bytes: a ring moves a message in `2 (t - 1)` chunks,
/// each with its own synchronisation and protocol overhead, so small
/// messages get a fraction `m / (m + M)` of the bandwidth. Our estimate, 1
/// MiB, from the shape of nccl-tests' all_reduce_perf curves (bus
/// bandwidth rises with the message size and reaches half its plateau
/// between a few hundred KB on PCIe and a few MB on NVLink). It matters
/// for the per-layer all-reduces of tensor parallelism at small
/// micro-batches (AMP's V100 blocks get slower at tp 2, as measured); a
/// data-parallel gradient all-reduce (hundreds of MB) keeps the exact
/// ring formula.
pub const TP_HALF_BANDWIDTH_BYTES: f64 = 1024.0 * 1024.0;

/// Parameters of the layers `layers`, plus the embedding if it starts at
/// layer 0 and the final norm and head if it ends at the last layer (or
/// past it, with multi-token prediction's: [`ModelSpec::stage_layers`]).
pub fn stage_params(model: &ModelSpec, layers: &Range<u64>) -> u64 {
    let (embedding, head) = (layers.start == 0, layers.end >= model.layers);
    let mut params = model.layers_params(layers);
    if embedding {
        params += model.embedding_params();
    }
    if head {
        params += model.head_params();
    }
    params + model.mtp_table_params(embedding, head) - model.shared_table_params(embedding, head)
}

/// Activation bytes one layer keeps per micro-batch of `micro_batch`
/// sequences on each of `tp` chips (Korthikanti et al., 16-bit; the 34 scaled
/// by the dtype's size over 2): `s b h (34 + 5 a s / h) / t` with sequence
/// parallelism, `s b h (10 + 24 / t + 5 a s / (h t))` without; with flash
/// attention or selective recomputation the score term is 0; with full
/// recomputation `2 s b h` (the layer input only; over `t` with sequence
/// parallelism).
pub fn layer_activation_bytes(
    model: &ModelSpec,
    settings: &TrainingSettings,
    micro_batch: u64,
    tp: u64,
) -> f64 {
    if settings.recompute == Recompute::Full {
        return checkpoint_bytes(model, settings, micro_batch, tp);
    }
    full_layer_activation_bytes(model, settings, micro_batch, tp)
}

/// `2 s b h` (16-bit): the layer input that full recomputation keeps,
/// split over the `tp` chips under sequence parallelism, where the layers'
/// inputs lie split along the sequence (Korthikanti et al. 2022: `2 s b h /
/// t` a layer; until 2026-12-07 whole on every chip, as without it, which
/// every outside set with full recomputation ran).
fn checkpoint_bytes(
    model: &ModelSpec,
    settings: &TrainingSettings,
    micro_batch: u64,
    tp: u64,
) -> f64 {
    let sbh = (model.seq_len * micro_batch * model.hidden) as f64;
    sbh * settings.dtype.bytes() as f64 / settings.sequence_split(tp)
}

/// One layer's activations without full recomputation.
#[inline]
fn full_layer_activation_bytes(
    model: &ModelSpec,
    settings: &TrainingSettings,
    micro_batch: u64,
    tp: u64,
) -> f64 {
    let (s, h, a) = (
        model.seq_len as f64,
        model.hidden as f64,
        model.heads as f64,
    );
    let sbh = s * micro_batch as f64 * h;
    let scale = settings.dtype.bytes() as f64 / 2.0;
    // The score terms (softmax output, dropout mask and output: 5 bytes
    // per score) are not scaled by the dtype: measured fp32 runs keep what
    // Korthikanti's 16-bit figure gives (docs/planner.md, "Memory").
    let scores = if settings.flash_attention || settings.recomputes(RecomputeModule::CoreAttn) {
        0.0
    } else {
        5.0 * a * s / h
    };
    let t = tp.max(1) as f64;
    // Without sequence parallelism the norms' and dropouts' 10 bytes per
    // element are whole on every chip of the group.
    let kept = match settings.sequence_parallel {
        true => 34.0 / t,
        false => 10.0 + 24.0 / t,
    };
    let extra = moe_activation_bytes(model, micro_batch, tp)
        + latent_activation_bytes(model, micro_batch, tp)
        - recomputed_module_bytes(model, settings, micro_batch, tp);
    (sbh * (kept * scale + scores / t) + extra * scale
        - fp8_saved_bytes(model, settings, micro_batch, tp))
    .max(0.0)
}

/// What selective recomputation's modules ([`TrainingSettings::recomputes`])
/// drop of one layer's activations on each of `tp` chips, 16-bit bytes per
/// token times the tokens: the two norms' outputs (`4 h`, over `t` under
/// sequence parallelism), latent attention's Q, K and V (`2 (q + kv + v) /
/// t`), a dense MLP's all but its input (`17 h / t` of the count's `19 h /
/// t`), a mixture's expert block all but its input (all it keeps beyond the
/// count's MLP input, [`moe_activation_bytes`]), else its experts' SwiGLU
/// product (`2 k f / t`) and its shared expert (`6 f_s / t`). 0 without
/// selective recomputation or with the core attention alone (whose
/// scores the activation formula drops).
#[inline]
fn recomputed_module_bytes(
    model: &ModelSpec,
    settings: &TrainingSettings,
    micro_batch: u64,
    tp: u64,
) -> f64 {
    use RecomputeModule::*;
    if settings.recompute_modules.is_empty() || settings.recompute != Recompute::Selective {
        return 0.0;
    }
    let t = tp.max(1) as f64;
    let h = model.hidden as f64;
    let norms = 4.0 * h / settings.sequence_split(tp);
    let mut per_token = 0.0;
    if settings.recomputes(Layernorm) {
        per_token += norms;
    }
    if settings.recomputes(MlaUpProj) && model.is_mla() {
        let w = model.attention_widths();
        per_token += 2.0 * (w.q + w.kv + w.v) as f64 / t;
    }
    let tokens = (model.seq_len * micro_batch) as f64;
    if !model.is_moe() {
        if settings.recomputes(Mlp) {
            per_token += 17.0 * h / t;
        }
        return tokens * per_token;
    }
    if settings.recomputes(Moe) {
        // The count's MLP but its input, and all the expert block keeps
        // beyond it.
        return tokens * (per_token + 17.0 * h / t) + moe_activation_bytes(model, micro_batch, tp);
    }
    if settings.recomputes(MoeAct) {
        per_token += 2.0 * (model.experts_per_token * model.ffn) as f64 / t;
    }
    if settings.recomputes(SharedExperts) {
        per_token += 6.0 * model.shared_ffn as f64 / t;
    }
    tokens * per_token
}

/// The forward time selective recomputation runs again in one layer's
/// backward pass on each of `tp` chips: the recomputed modules' matmuls
/// and passes ([`TrainingSettings::recomputes`]; the core attention `c`
/// times under context parallelism, its keys being every chip's), and a
/// mixture's two all-to-alls (`a2a` each) when its whole expert block is
/// recomputed. 0 without selective recomputation.
fn recomputed_forward(
    model: &ModelSpec,
    settings: &TrainingSettings,
    rates: &ChipRates,
    b: u64,
    tp: u64,
    a2a: f64,
) -> f64 {
    use RecomputeModule::*;
    if settings.recompute != Recompute::Selective {
        return 0.0;
    }
    let mut time = 0.0;
    if settings.recomputes(CoreAttn) {
        let c = settings.context_parallel.max(1) as f64;
        time += c * attention_time(model, rates, b, tp).forward;
    }
    // The core attention alone (the default): nothing else reruns.
    if settings.recompute_modules.iter().all(|&m| m == CoreAttn) {
        return time;
    }
    let (moe, whole_block) = (model.is_moe(), settings.recomputes(Moe));
    // The layer's matmuls and passes each module reruns, by name.
    let reruns_matmul = |name: &str| match name {
        "q up" | "kv up" => settings.recomputes(MlaUpProj),
        "ffn gate" | "ffn up" | "ffn down" => settings.recomputes(Mlp),
        "router" | "expert gate" | "expert up" | "expert down" => whole_block,
        "shared expert gate" | "shared expert up" | "shared expert down" => {
            whole_block || settings.recomputes(SharedExperts)
        }
        _ => false,
    };
    let reruns_pass = |name: &str| match name {
        "rmsnorm (attention)" | "rmsnorm (ffn)" => settings.recomputes(Layernorm),
        "rope (q, k)" => model.is_mla() && settings.recomputes(MlaUpProj),
        "swiglu" => match moe {
            true => whole_block || settings.recomputes(MoeAct),
            false => settings.recomputes(Mlp),
        },
        "router softmax and top-k" | "token permutation" => whole_block,
        _ => false,
    };
    if moe && whole_block {
        time += 2.0 * a2a;
    }
    let layer_rates = rates.for_layer_matmuls();
    for mm in model
        .layer_matmuls(b, tp, experts_split(model, settings, tp))
        .iter()
        .filter(|mm| reruns_matmul(mm.name))
    {
        time += layer_rates.matmul(mm).forward;
    }
    for pass in model
        .layer_memory_passes(b, tp, rates.elem, settings.sequence_parallel)
        .iter()
        .filter(|p| reruns_pass(p.name))
    {
        time += rates.memory_pass(pass).forward;
    }
    time
}

/// What FP8 training keeps a byte smaller per element than the 16-bit
/// count: the inputs of the QKV, gate-and-up and down matmuls, which
/// Transformer Engine saves for the backward pass in FP8 (its
/// `LayerNormLinear` and `Linear` keep their casts), `s b (2 h + f)`
/// elements a layer, `f` the width a token runs; the `2 h` over `t` under
/// sequence parallelism (each chip keeps its part of the sequence), the
/// `f` always (split by the columns); in a mixture of experts also the
/// `k h` permuted copies its experts take. 0 without `fp8`.
#[inline]
fn fp8_saved_bytes(
    model: &ModelSpec,
    settings: &TrainingSettings,
    micro_batch: u64,
    tp: u64,
) -> f64 {
    if !settings.fp8 {
        return 0.0;
    }
    let t = tp.max(1) as f64;
    let sb = (model.seq_len * micro_batch) as f64;
    let h = model.hidden as f64;
    let inputs = 2.0 * h / settings.sequence_split(tp);
    // A mixture's experts take the `k` permuted copies of each token
    // (beside the shared expert's, counted in the `2 h`).
    let permuted = match model.is_moe() {
        true => model.experts_per_token as f64 * h,
        false => 0.0,
    };
    sb * (inputs + permuted + model.active_ffn() as f64 / t)
}

/// What latent attention keeps beyond the attention's part of Korthikanti
/// et al.'s 34 bytes per element (16-bit), on each of `tp` chips: per
/// token its queries, keys, values and context at their widths (`2 (q +
/// kv + v + c)` bytes over `t`, where the count takes `2 h` each), and the
/// queries' and keys' latents and their norms' outputs (`2 (2 r_q +
/// 2 r_kv + d_r)`, whole on every chip: the down projections are not
/// split). 0 without it.
#[inline]
fn latent_activation_bytes(model: &ModelSpec, micro_batch: u64, tp: u64) -> f64 {
    if !model.is_mla() {
        return 0.0;
    }
    let t = tp.max(1) as f64;
    let h = model.hidden as f64;
    let heads = model.attention_widths().sum() as f64;
    let latents = (2 * model.q_lora_rank + 2 * model.kv_lora_rank + model.rope_head_dim) as f64;
    (model.seq_len * micro_batch) as f64 * 2.0 * ((heads - 4.0 * h) / t + latents)
}

/// What a mixture of experts' FFN block keeps beyond the dense MLP's 19
/// bytes per element of Korthikanti et al.'s 34 (16-bit), on each of `tp`
/// chips: per token the normed input (`2 h`), its `k` permuted copies
/// (`2 k h`), each expert's gate, up and product outputs (`6 k f`, over
/// `t`), the shared expert's (`6 f_s`, over `t`) and the router's f32
/// probabilities and routing map (`8 E`); less the dense MLP's `19 h`.
/// 0 for a dense model.
#[inline]
fn moe_activation_bytes(model: &ModelSpec, micro_batch: u64, tp: u64) -> f64 {
    if !model.is_moe() {
        return 0.0;
    }
    let t = tp.max(1) as f64;
    let (h, f, k) = (
        model.hidden as f64,
        model.ffn as f64,
        model.experts_per_token as f64,
    );
    let (fs, e) = (model.shared_ffn as f64, model.experts as f64);
    let per_token = 2.0 * h + 2.0 * k * h + 6.0 * (k * f + fs) / t + 8.0 * e - 19.0 * h / t;
    (model.seq_len * micro_batch) as f64 * per_token
}

/// Bytes of the logits and loss buffers on each of `tp` chips of the last
/// stage, for the one micro-batch whose loss is computed (under 1F1B the
/// last stage runs a micro-batch's backward right after its forward, so
/// only one is alive): `b s V / t` elements (vocabulary-parallel head),
/// each taking what the framework's loss holds at its peak
/// ([`crate::settings::LossKernel::bytes_per_logit`]): 6 bytes in bf16
/// with Megatron-Core's in-place loss, 12 with an eager framework's. With
/// `n` multi-token-prediction heads, whose losses run one after another in
/// the forward, the last one's peak and what the `n` before it keep for
/// their backward ([`crate::settings::LossKernel::kept_per_logit`]).
pub fn logits_bytes(
    model: &ModelSpec,
    settings: &TrainingSettings,
    micro_batch: u64,
    tp: u64,
) -> f64 {
    let elements = (micro_batch * model.seq_len) as f64 * model.vocab as f64 / tp.max(1) as f64;
    let e = settings.dtype.bytes() as f64;
    let earlier = model.mtp_layers as f64 * settings.loss.kept_per_logit(e);
    elements * (settings.loss.bytes_per_logit(e) + earlier)
}

/// The largest transient buffers of one layer's pass on each of `tp` chips
/// of a stage with at least one layer: the larger of one layer's FFN
/// backward (the gradients of gate, up and their product, `3 b s f / t`
/// elements) and its attention backward (flash attention: dQ, dK, dV in the
/// compute dtype and an f32 dQ accumulator; without it, the gradients of the
/// probabilities and of the scores, `2 b (a/t) s^2` elements), plus the
/// matmul library's workspace (`matmul_workspace_bytes`, by default
/// [`MATMUL_WORKSPACE_BYTES`]). The first stage's embedding backward, which
/// runs after its first layer's, is [`embedding_backward_bytes`].
pub fn workspace_bytes(
    model: &ModelSpec,
    settings: &TrainingSettings,
    stage: &StageShape,
    micro_batch: u64,
) -> f64 {
    matmul_workspace(stage.chip) + layer_workspace_bytes(model, settings, stage, micro_batch)
}

/// The embedding backward's transients on each of `tp` chips of the stage
/// that holds the embedding (0 on the others): the gradient of its output
/// (`b s h` elements) and the gradient of the whole `V/t x h` table, which
/// the backward of a (non-sparse) embedding lookup allocates dense, in the
/// weights' dtype, before it is added into the accumulated gradient
/// (PyTorch's `embedding_dense_backward`; Megatron-LM's and DeepSpeed's
/// vocabulary-parallel embeddings use it). At a 250k vocabulary and hidden
/// 14,336 in fp16 that is 3.6 GB a chip at tp 2. It runs after the stage's
/// first layer's backward (and recomputed forward) have freed their
/// buffers, so the stage's peak holds the larger of the two.
pub fn embedding_backward_bytes(
    model: &ModelSpec,
    settings: &TrainingSettings,
    stage: &StageShape,
    micro_batch: u64,
) -> f64 {
    if !stage.holds_embedding() {
        return 0.0;
    }
    let e = settings.dtype.bytes() as f64;
    let tokens = (micro_batch * model.seq_len) as f64;
    let table = model.embedding_params() as f64 / stage.tp.max(1) as f64;
    (tokens * model.hidden as f64 + table) * e
}

/// Bytes of the embedding's dropout mask that the stage holding the
/// embedding keeps per micro-batch in flight (Korthikanti et al.: one byte
/// per element of the embedding's `b s h` output, outside every layer and
/// so not recomputed), split over the `t` chips with sequence parallelism
/// and whole on each without (the output is all-reduced before the
/// dropout); 0 on the other stages.
pub fn embedding_mask_bytes(
    model: &ModelSpec,
    settings: &TrainingSettings,
    stage: &StageShape,
    micro_batch: u64,
) -> f64 {
    if !stage.holds_embedding() {
        return 0.0;
    }
    let elements = (micro_batch * model.seq_len * model.hidden) as f64;
    elements / settings.sequence_split(stage.tp)
}

/// Bytes each multi-token-prediction layer's prologue keeps per micro-batch
/// in flight on the stage holding the head (0 on the others), beyond its
/// transformer layer, which is among the stage's layers: the next tokens'
/// embedding its norm keeps (`h` elements a token) and the concatenation
/// of that norm's and the hidden state's norm's outputs the `2h -> h`
/// projection keeps (`2h`), in the compute dtype; under full recomputation
/// (Megatron-LM checkpoints the projection with the layer) the embedding
/// alone. Split over the `t` chips with sequence parallelism, whole on
/// each without.
pub fn mtp_prologue_bytes(
    model: &ModelSpec,
    settings: &TrainingSettings,
    stage: &StageShape,
    micro_batch: u64,
) -> f64 {
    let width = match settings.recompute {
        Recompute::Full => 1.0,
        _ => 3.0,
    };
    let n = model.mtp_layers as f64 * width;
    kept_beside_head(model, settings, stage, micro_batch, n)
}

/// `n h` elements a token of the compute dtype, for the stage holding the
/// head (0 on the others): split over its `t` chips with sequence
/// parallelism, whole on each without.
fn kept_beside_head(
    model: &ModelSpec,
    settings: &TrainingSettings,
    stage: &StageShape,
    micro_batch: u64,
    n: f64,
) -> f64 {
    if !stage.holds_head() {
        return 0.0;
    }
    let tokens = (micro_batch * model.seq_len) as f64;
    let e = settings.dtype.bytes() as f64;
    n * tokens * model.hidden as f64 * e / settings.sequence_split(stage.tp)
}

/// Bytes the stage holding the head keeps per micro-batch in flight for
/// the head's backward (0 on the other stages): the final norm's input,
/// which its backward reads, and the head's input (the norm's output),
/// which the head's weight gradient reads, `2 h` elements a token in the
/// compute dtype, and as much for each multi-token-prediction layer's
/// final norm and its pass through the shared head. Outside every
/// transformer layer, they are kept under full recomputation too. Split
/// over the `t` chips with sequence parallelism (Megatron-LM's head saves
/// its input sharded and gathers it again for the backward), whole on each
/// without. 134 MB a micro-batch for Llama 2 70B's 4,096 tokens at tp 1.
/// Korthikanti et al. count the head's input (with the loss) for a
/// pipeline of one stage only (Megatron-LM's `theoretical_memory_usage`),
/// and the final norm's not at all.
pub fn head_input_bytes(
    model: &ModelSpec,
    settings: &TrainingSettings,
    stage: &StageShape,
    micro_batch: u64,
) -> f64 {
    let heads = 1.0 + model.mtp_layers as f64;
    kept_beside_head(model, settings, stage, micro_batch, 2.0 * heads)
}

/// A per-layer figure's mean and largest over a range of layers
/// ([`over_kinds`]).
#[derive(Debug, Clone, Copy)]
struct OverKinds {
    mean: f64,
    max: f64,
}

/// `f` over the layers `range` of each kind ([`ModelSpec::layer_kinds`]:
/// a mixture's dense first layers and its expert ones): its mean and its
/// largest; the model's own layer's for an empty range.
#[inline]
fn over_kinds(model: &ModelSpec, range: &Range<u64>, f: impl Fn(&ModelSpec) -> f64) -> OverKinds {
    if !model.has_dense_layers() || model.dense_layers_in(range) == 0 {
        let v = f(model);
        return OverKinds { mean: v, max: v };
    }
    over_mixed_kinds(model, range, &f)
}

/// [`over_kinds`] of a range holding a mixture's dense first layers, out
/// of line (the search's inner loop prices stages of layers alike).
#[cold]
#[inline(never)]
fn over_mixed_kinds(
    model: &ModelSpec,
    range: &Range<u64>,
    f: &dyn Fn(&ModelSpec) -> f64,
) -> OverKinds {
    let n = range.end.saturating_sub(range.start);
    let (mut sum, mut max) = (0.0, f64::MIN);
    for (m, k) in model.layer_kinds(range).iter() {
        let v = f(m);
        sum += k as f64 * v;
        max = max.max(v);
    }
    OverKinds {
        mean: sum / n.max(1) as f64,
        max,
    }
}

/// The layers' part of [`workspace_bytes`]: the larger of one layer's FFN
/// backward and its attention backward on each of `tp` chips of a stage
/// with at least one layer (0 without layers).
#[inline]
fn layer_workspace_bytes(
    model: &ModelSpec,
    settings: &TrainingSettings,
    stage: &StageShape,
    micro_batch: u64,
) -> f64 {
    if stage.layers.end <= stage.layers.start {
        return 0.0;
    }
    let t = stage.tp.max(1) as f64;
    let e = settings.dtype.bytes() as f64;
    let tokens = (micro_batch * model.seq_len) as f64;
    let w = model.attention_widths();
    let (q, kv, v) = (w.q as f64, w.kv as f64, w.v as f64);
    let f = over_kinds(model, &stage.layers, |m| m.active_ffn() as f64).max;
    let ffn = 3.0 * tokens * f / t * e;
    let attention = if settings.flash_attention {
        tokens / t * ((q + kv + v) * e + 4.0 * q)
    } else {
        let s = model.seq_len as f64;
        2.0 * (micro_batch * model.heads) as f64 / t * s * s * e
    };
    ffn.max(attention)
}

/// Memory of one device of `stage`: weights, gradients and optimizer state
/// of its parameters split over `t` (norms included, a slight
/// over-count), `dtype + grad + 12/d` bytes per parameter (18, 16 with bf16
/// gradients, `6 + 12/d` sharded), and the activations of its layers for
/// `min(p - i, m)` micro-batches (on the last stage with the final norm's
/// and the head's inputs, [`head_input_bytes`]). Full recomputation adds
/// the working set of the one layer being recomputed. The last stage adds the logits and loss
/// buffers ([`logits_bytes`]) beyond that working set and the layer's
/// backward transients, which are alive only after the loss's backward has
/// freed them; the first stage its embedding's dropout mask per micro-batch
/// in flight ([`embedding_mask_bytes`]) and what its embedding's backward
/// needs beyond the layer's transients ([`embedding_backward_bytes`]);
/// every stage its transient workspace ([`workspace_bytes`]) and the
/// chip's reserve ([`ChipType::memory_reserve`]).
///
/// A chip type whose `framework` is `polychip` is counted as `polychip
/// train` allocates instead (see `crate::framework::polychip`).
pub fn stage_memory(
    model: &ModelSpec,
    settings: &TrainingSettings,
    stage: &StageShape,
    mb: Microbatching,
) -> MemoryBreakdown {
    let model = &*per_chip_model(model, settings);
    let terms = match stage.chip.framework {
        Framework::Megatron => megatron_terms(model, settings, stage, mb),
        Framework::Polychip => polychip_terms(model, settings, stage, mb),
    };
    MemoryBreakdown::of(stage.chip, terms)
}

/// [`stage_memory`]'s terms by Megatron's count (its description): weights,
/// gradients, optimizer state, activations, logits and workspace.
fn megatron_terms(
    model: &ModelSpec,
    settings: &TrainingSettings,
    stage: &StageShape,
    mb: Microbatching,
) -> Terms {
    let chip_params = ChipParams::of(model, settings, stage);
    let params = chip_params.total();
    let group = reduction_group(settings, stage);
    // Each part over its own group's shards (a mixture's experts over the
    // replicas holding the same experts).
    let shards = settings.shards(group);
    let expert_shards = match chip_params.experts > 0.0 {
        true => settings.shards(chip_params.expert_group(model, settings, group)),
        false => shards,
    };
    let sharded = |of: fn(&Shards) -> f64| {
        chip_params.dense / of(&shards) + chip_params.experts / of(&expert_shards)
    };
    // Under ZeRO-3 a unit's weights are gathered whole for its pass, and
    // the next unit's while it runs (prefetched); under ZeRO-2 and up a
    // unit's gradients are whole until they are reduce-scattered. (Nothing
    // is whole beyond a shard where neither is sharded: the search's
    // usual case, priced without the unit.)
    let unit = match shards.weights > 1.0 || shards.gradients > 1.0 {
        true => largest_unit_params(model, settings, stage, params),
        false => 0.0,
    };
    // What a whole unit adds to a chip's shard of it.
    let beyond_shard = |shard: f64| if shard > 1.0 { 1.0 - 1.0 / shard } else { 0.0 };
    let mut weights = settings.dtype.bytes() as f64
        * (sharded(|s| s.weights) + (2.0 * unit).min(params) * beyond_shard(shards.weights));
    if settings.fp8 {
        // The layers' FP8 weights and their transposes (Transformer
        // Engine keeps both between micro-batches), of a chip's share.
        let held = ChipParams::range(model, settings, &stage.layers, stage.tp);
        weights += FP8_WEIGHT_BYTES * held.total() / shards.weights;
    }
    let gradients =
        settings.grad_bytes() * (sharded(|s| s.gradients) + unit * beyond_shard(shards.gradients));
    let optimizer = sharded(|s| s.optimizer) * settings.optimizer_bytes();
    let kept = kept_micro_batches(settings, stage, mb);
    // Layers that keep every activation, inputs kept for recomputation,
    // and the layers a recomputation rebuilds at once.
    let split = settings.recompute_split(stage.layers.end - stage.layers.start);
    // A profile's measured bytes per block replace the formula for the
    // layers that keep every activation.
    let full = over_kinds(model, &stage.layers, |m| {
        full_layer_activation_bytes(m, settings, mb.size, stage.tp)
    });
    let whole = measured_block_activations(model, settings, stage, mb).unwrap_or(full.mean);
    let recomputed = split.working * full.max;
    let activations = kept
        * (split.whole * whole
            + split.checkpoints * checkpoint_bytes(model, settings, mb.size, stage.tp))
        + recomputed
        + kept * embedding_mask_bytes(model, settings, stage, mb.size)
        + kept * mtp_prologue_bytes(model, settings, stage, mb.size)
        + kept * head_input_bytes(model, settings, stage, mb.size);
    // The loss's buffers are freed before the last layer's backward (and,
    // under full recomputation, its recomputed forward) starts: they never
    // coexist with that layer's working set and backward transients, so
    // the peak holds the larger of the two and `logits` counts what the
    // loss needs beyond them. The embedding's backward runs after the first
    // layer's (and, on a one-stage pipeline, long after the loss's): the
    // workspace adds what it needs beyond both.
    let layer = recomputed + layer_workspace_bytes(model, settings, stage, mb.size);
    let loss = match stage.holds_head() {
        true => logits_bytes(model, settings, mb.size, stage.tp),
        false => 0.0,
    };
    let logits = (loss - layer).max(0.0);
    let embedding =
        (embedding_backward_bytes(model, settings, stage, mb.size) - layer.max(loss)).max(0.0);
    let workspace = workspace_bytes(model, settings, stage, mb.size) + embedding;
    (
        [weights, gradients, optimizer],
        [activations, logits, workspace],
    )
}

/// The micro-batches whose activations `stage` keeps at most, under the
/// settings' schedule ([`crate::schedule::PipelineSchedule::in_flight`]).
/// Under interleaving (`virtual_stages` `v > 1`) `stage` is one of the `p
/// v` chunks, and its share of its device's chunk passes in flight
/// ([`crate::schedule::interleaved_in_flight`]) is that count over `v`: so
/// a device's chunks, summed, keep as many chunk passes' activations as its
/// warm-up holds (exactly, when its chunks are alike).
pub fn kept_micro_batches(
    settings: &TrainingSettings,
    stage: &StageShape,
    mb: Microbatching,
) -> f64 {
    let m = mb.count as usize;
    let v = settings.virtual_stages.max(1) as usize;
    if v == 1 {
        return settings.schedule.in_flight(
            stage.index,
            stage.num_stages,
            m,
            settings.run_ahead as usize,
        ) as f64;
    }
    let p = (stage.num_stages / v).max(1);
    crate::schedule::interleaved_in_flight(stage.index % p, p, v, m.max(1)) as f64 / v as f64
}

/// A profile's measured activation bytes per block of `stage`'s chip at
/// `mb`'s size, when it has them: a block that keeps every activation
/// (full recomputation keeps less than was measured of the blocks it
/// recomputes). At a tensor-parallel degree the profile does
/// not measure, the nearest measured degree's bytes scaled by the formula's
/// ratio between the two degrees (`full_layer_activation_bytes`), as its times
/// are scaled by the FLOP model's (they were ignored there, silently).
fn measured_block_activations(
    model: &ModelSpec,
    settings: &TrainingSettings,
    stage: &StageShape,
    mb: Microbatching,
) -> Option<f64> {
    let tp = stage.tp.max(1);
    let at = |t: u64| {
        stage
            .chip
            .measured_costs(mb.size, t)
            .and_then(|(_, act)| act)
    };
    if let Some(bytes) = at(tp) {
        return Some(bytes);
    }
    let near = stage.chip.nearest_measured_tp(tp)?;
    let bytes = at(near)?;
    let formula = |t: u64| full_layer_activation_bytes(model, settings, mb.size, t);
    (formula(near) > 0.0).then(|| bytes * formula(tp) / formula(near))
}

/// [`stage_memory`]'s terms under `polychip train`, tensor by tensor as
/// the trainer allocates them ([`crate::framework::polychip`],
/// the counts its own check uses): per parameter the f32 value and moments
/// and the gradient (and in bf16 the bf16 copy and an f32 gradient), as
/// weights (the compute-dtype copy), gradients and optimizer state (after
/// sharding); per micro-batch in flight each block's saved tensors (or a
/// profile's measured bytes per block) and the token ids, and on the last
/// stage the head's (as `logits`); the largest transient buffers and the
/// chip's matmul workspace. The trainer has no recomputation: a
/// `recompute` setting does not change the count.
fn polychip_terms(
    model: &ModelSpec,
    settings: &TrainingSettings,
    stage: &StageShape,
    mb: Microbatching,
) -> Terms {
    use crate::framework::polychip as counts;
    let t = stage.tp.max(1) as f64;
    let params = stage.params(model) as f64 / t;
    let c = settings.dtype.bytes();
    let [w, g, o] = counts::state_bytes(c);
    // `polychip train` shards the optimizer state only (ZeRO-1): plans of
    // higher stages on its chips are refused ([`check_cluster_settings`]).
    let shard = settings.shards(stage.dp).optimizer;
    let (weights, gradients) = (params * w as f64, params * g as f64);
    let optimizer = params * o as f64 / shard;
    let shape = counts::Shape {
        hidden: model.hidden,
        kv_dim: model.kv_dim(),
        ffn: model.ffn,
        heads: model.heads,
        vocab: model.vocab,
    };
    let tokens = mb.size * model.seq_len;
    let n = (stage.layers.end - stage.layers.start) as f64;
    let kept = kept_micro_batches(settings, stage, mb);
    let block = measured_block_activations(model, settings, stage, mb)
        .unwrap_or_else(|| counts::block_bytes(shape, tokens, c) as f64 / t);
    let activations = kept * (n * block + counts::micro_batch_bytes(tokens) as f64);
    let logits = if stage.holds_head() {
        kept * counts::head_bytes(shape, tokens, c) as f64 / t
    } else {
        0.0
    };
    let workspace =
        counts::transient_bytes(shape, tokens, c) as f64 / t + matmul_workspace(stage.chip);
    (
        [weights, gradients, optimizer],
        [activations, logits, workspace],
    )
}

/// Seconds to hand one micro-batch's activation (`bytes`, the whole `s b
/// h`) from a stage of `tp` chips to the next over the link `link` gives
/// each chip. Each chip of the group sends `1/t` of it: under sequence
/// parallelism the activation is split along the sequence already; without
/// it the frameworks split it before the send and gather it again inside
/// the next stage's node (Megatron-LM's scatter-gather of pipeline tensors,
/// on by default; DeepSpeed's partitioned pipeline activations), an
/// all-gather of `(t - 1)/t` of it over the chip's intra-node link. Before
/// stop 43 every chip was priced the whole activation over the network:
/// Selene's runs moved from 46.0% to 36.0% off as given (9.0% to 6.6%
/// after one scale), vTrain's 39.1B runs' ranking from 0.702 to 0.748.
pub fn pipeline_send_time(
    settings: &TrainingSettings,
    bytes: f64,
    tp: u64,
    chip: &ChipType,
    link: impl FnOnce() -> f64,
) -> f64 {
    let t = tp.max(1) as f64;
    let gather = if tp > 1 && !settings.sequence_parallel {
        (t - 1.0) / t * bytes / chip.intra_node_bandwidth
    } else {
        0.0
    };
    bytes / t / link() + gather
}

/// Ring all-reduce of `bytes` over `n` members: a reduce-scatter and an
/// all-gather ([`ring_pass_time`] each), `2 (n - 1)/n * bytes / bw`.
pub fn allreduce_time(bytes: f64, n: u64, bandwidth: f64) -> f64 {
    2.0 * ring_pass_time(bytes, n, bandwidth)
}

/// A ring reduce-scatter or all-gather of `bytes` over `n` members: `(n -
/// 1)/n * bytes / bw`; 0 for one member.
pub fn ring_pass_time(bytes: f64, n: u64, bandwidth: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    (n - 1) as f64 / n as f64 * bytes / bandwidth
}

/// A tensor-parallel all-reduce: [`allreduce_time`] at the bandwidth a
/// message of `bytes` gets ([`TP_HALF_BANDWIDTH_BYTES`]) plus
/// [`COLLECTIVE_HOP_LATENCY`] for each of the ring's `2 (n - 1)` steps.
pub fn tp_allreduce_time(bytes: f64, n: u64, bandwidth: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let effective = bandwidth * bytes / (bytes + TP_HALF_BANDWIDTH_BYTES);
    allreduce_time(bytes, n, effective) + 2.0 * (n - 1) as f64 * COLLECTIVE_HOP_LATENCY
}

/// The slowest link of a stage's data-parallel group: with replicas of
/// other chip types (`peers`, indices into the cluster, which may include
/// the stage's own), the slowest cross-node link to them, as different
/// types do not share a node; else the intra-node link when all `d t` chips
/// sit in one node (`one_node`, from [`crate::placement`]), else the
/// cross-node path.
///
/// Across nodes the ring (NCCL's, as every framework's) enters and leaves
/// each node once: the replicas of one tensor-parallel rank that share a
/// node sit next to each other on it, so each of the node's `t` rings
/// crosses its network once and gets the node's NIC bandwidth over `t`,
/// that is the chip's share ([`ChipType::nic_bandwidth`]) times the
/// group's members on a node, `min(d, chips_per_node / t)`, or, where the
/// node's chips share fewer NICs than they are, the node's network over
/// `t` ([`ChipType::nic_share`]); at most the network's per-flow
/// bandwidth. (A pipeline send gets each end's share of its node's network
/// for the chips sending or receiving at once there:
/// [`ClusterSpec::send_bandwidth`].)
pub fn dp_bandwidth(
    cluster: &ClusterSpec,
    chip: &ChipType,
    dp: u64,
    tp: u64,
    peers: &[usize],
    one_node: bool,
) -> f64 {
    let tp = tp.max(1);
    // A node of fewer NICs than chips (`nics_per_node`) lends its `tp`
    // rings its whole network however few of their members it holds.
    let ring = |c: &ChipType| {
        let members = (c.chips_per_node / tp).clamp(1, dp.max(1));
        (c.nic_bandwidth * members as f64).max(c.nic_share(tp))
    };
    let across =
        |a: &ChipType, b: &ChipType| ring(a).min(ring(b)).min(cluster.inter_node_bandwidth);
    peers
        .iter()
        .map(|&t| &cluster.chip_types[t])
        .filter(|c| c.name != chip.name)
        .map(|c| across(chip, c))
        .reduce(f64::min)
        .unwrap_or_else(|| {
            if one_node {
                cluster.link_bandwidth(chip, chip, true)
            } else {
                across(chip, chip)
            }
        })
}

/// Seconds of forward and backward of one part of the model.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PassTime {
    /// Forward.
    pub forward: f64,
    /// Backward.
    pub backward: f64,
}

impl std::ops::Add for PassTime {
    type Output = PassTime;
    fn add(self, o: PassTime) -> PassTime {
        PassTime {
            forward: self.forward + o.forward,
            backward: self.backward + o.backward,
        }
    }
}

impl std::iter::Sum for PassTime {
    fn sum<I: Iterator<Item = PassTime>>(iter: I) -> PassTime {
        iter.fold(PassTime::default(), |a, b| a + b)
    }
}

/// How one chip runs the operation classes, for one dtype.
#[derive(Debug, Clone, Copy)]
pub struct ChipRates {
    /// Large-matmul FLOP/s: `peak[dtype] * efficiency`.
    pub matmul: f64,
    /// The layers' weight matmuls' FLOP/s: `matmul`, or under FP8
    /// training `peak.fp8 * efficiency`.
    pub layer_matmul: f64,
    /// Memory bandwidth, bytes/s
    /// ([`ChipType::memory_bandwidth_or_default`]).
    pub memory: f64,
    /// Bytes per element of the compute dtype.
    pub elem: f64,
    /// The least time one kernel takes: the framework's host-side work to
    /// launch it, which hides behind the kernels before it only when those
    /// run longer ([`ChipType::kernel_dispatch_or_default`]).
    pub dispatch: f64,
}

impl ChipRates {
    /// The rates of `chip` in `settings.dtype`.
    pub fn new(chip: &ChipType, settings: &TrainingSettings) -> Self {
        let matmul = chip.sustained_flops(settings.dtype);
        let layer_matmul = match (settings.fp8, chip.peak_flops.fp8) {
            (true, Some(fp8)) => fp8 * chip.efficiency,
            _ => matmul,
        };
        ChipRates {
            matmul,
            layer_matmul,
            memory: chip.memory_bandwidth_or_default(),
            elem: settings.dtype.bytes() as f64,
            dispatch: chip.kernel_dispatch_or_default(),
        }
    }

    /// These rates with the layers' weight matmuls' as the matmul rate.
    pub fn for_layer_matmuls(&self) -> ChipRates {
        ChipRates {
            matmul: self.layer_matmul,
            ..*self
        }
    }

    /// A kernel that runs `device` seconds on the chip: at least its
    /// dispatch, plus [`KERNEL_OVERHEAD`].
    fn kernel(&self, device: f64) -> f64 {
        (device + KERNEL_OVERHEAD).max(self.dispatch)
    }

    /// The shape factor of `mm`: `d / (d + MATMUL_HALF_DIM)` in its
    /// smallest side `d`.
    pub fn shape_factor(mm: &Matmul) -> f64 {
        let d = mm.smallest_dim();
        d / (d + MATMUL_HALF_DIM)
    }

    /// One matmul kernel, a roofline: the larger of its FLOPs at the
    /// matmul rate times the shape factor and its operands and result
    /// through memory, plus [`KERNEL_OVERHEAD`], at least the dispatch.
    pub fn matmul_time(&self, mm: &Matmul) -> f64 {
        let compute = mm.flops() / (self.matmul * Self::shape_factor(mm));
        self.kernel(compute.max(mm.elements() * self.elem / self.memory))
    }

    /// The weight-gradient kernel of a matmul's backward, which a
    /// zero-bubble schedule runs apart.
    pub fn weight_grad_time(&self, mm: &Matmul) -> f64 {
        let [_, dw] = mm.backward();
        self.matmul_time(&dw)
    }

    /// A matmul forward (one kernel) and backward (two).
    pub fn matmul(&self, mm: &Matmul) -> PassTime {
        let [dx, dw] = mm.backward();
        PassTime {
            forward: self.matmul_time(mm),
            backward: self.matmul_time(&dx) + self.matmul_time(&dw),
        }
    }

    /// A memory-bound kernel: bytes over the memory bandwidth, plus
    /// [`KERNEL_OVERHEAD`] each way, at least the dispatch.
    pub fn memory_pass(&self, pass: &MemoryPass) -> PassTime {
        PassTime {
            forward: self.kernel(pass.forward_bytes / self.memory),
            backward: self.kernel(pass.backward_bytes / self.memory),
        }
    }
}

/// Attention of one layer on each of `tp` chips. With flash attention one
/// fused kernel each way: the scores' and context's FLOPs at the matmul
/// rate with their own (head-dim) shape factor, or, if slower, reading Q,
/// K, V and writing the output (backward: reading those and the output's
/// gradient, writing dQ, dK, dV); backward twice the FLOPs, as Megatron
/// counts. Without it the score matrices go through memory: each product
/// is a matmul kernel, plus the softmax (read and write the scores; its
/// backward reads the probabilities and their gradient, writes one).
pub fn attention_time(model: &ModelSpec, rates: &ChipRates, micro_batch: u64, tp: u64) -> PassTime {
    attention_time_with(model, rates, micro_batch, tp, true)
}

fn attention_time_with(
    model: &ModelSpec,
    rates: &ChipRates,
    micro_batch: u64,
    tp: u64,
    flash: bool,
) -> PassTime {
    let mms = model.attention_matmuls(micro_batch, tp);
    if !flash {
        let probs = mms[0].m * mms[0].n * mms[0].batch * rates.elem;
        let softmax = MemoryPass {
            name: "softmax",
            forward_bytes: 2.0 * probs,
            backward_bytes: 3.0 * probs,
        };
        return mms.iter().map(|mm| rates.matmul(mm)).sum::<PassTime>()
            + rates.memory_pass(&softmax);
    }
    let t = tp.max(1) as f64;
    let tokens = (micro_batch * model.seq_len) as f64;
    // Q, K, V and the output ([`AttentionWidths::sum`]).
    let io = tokens / t * rates.elem * model.attention_widths().sum() as f64;
    let (fwd_io, bwd_io) = (io, 2.0 * io);
    let compute = |mm: &Matmul| mm.flops() / (rates.matmul * ChipRates::shape_factor(mm));
    let fwd: f64 = mms.iter().map(compute).sum();
    let bwd: f64 = mms
        .iter()
        .flat_map(|mm| mm.backward())
        .map(|mm| compute(&mm))
        .sum();
    PassTime {
        forward: rates.kernel(fwd.max(fwd_io / rates.memory)),
        backward: rates.kernel(bwd.max(bwd_io / rates.memory)),
    }
}

/// The compute of one transformer layer on each of `tp` chips, without
/// its all-reduces: the weight matmuls, attention, and the memory-bound
/// passes (norms and residual adds replicated over `tp`, or split by it
/// under sequence parallelism).
pub fn layer_time(
    model: &ModelSpec,
    settings: &TrainingSettings,
    rates: &ChipRates,
    micro_batch: u64,
    tp: u64,
) -> PassTime {
    let layer_rates = rates.for_layer_matmuls();
    let matmuls: PassTime = model
        .layer_matmuls(micro_batch, tp, experts_split(model, settings, tp))
        .iter()
        .map(|mm| layer_rates.matmul(mm))
        .sum();
    let mut passes: PassTime = model
        .layer_memory_passes(micro_batch, tp, rates.elem, settings.sequence_parallel)
        .iter()
        .map(|p| rates.memory_pass(p))
        .sum();
    if settings.fp8 {
        passes = passes + rates.memory_pass(&fp8_casts(model, rates.elem, micro_batch, tp));
    }
    let attention = attention_time_with(model, rates, micro_batch, tp, settings.flash_attention);
    matmuls + attention + passes
}

/// FP8 training's casts of one layer on each of `tp` chips: forward, the
/// weight matmuls' inputs (the attention's and the FFN's normed inputs,
/// the attention's output, the FFN's product: `2 h + c + f` elements a
/// token, `f` the width a token runs, `c` the attention's context, the
/// queries' `q` but where latent attention's values are narrower);
/// backward, their output gradients (`2 h + q + kv + v + 2 f`, `kv` and `v`
/// the keys' and values' widths; latent attention's latents are left
/// out); each read in the dtype and
/// written in one byte, in one pass (the amax taken on the way, as
/// Transformer Engine's fused casts do); split over `t` as the matmuls
/// are.
pub fn fp8_casts(model: &ModelSpec, elem: f64, micro_batch: u64, tp: u64) -> MemoryPass {
    let t = tp.max(1) as f64;
    let tokens = (micro_batch * model.seq_len) as f64;
    let w = model.attention_widths();
    let (h, q, kv) = (model.hidden as f64, w.q as f64, w.kv as f64);
    let (v, c) = (w.v as f64, w.context as f64);
    let f = model.active_ffn() as f64;
    let bytes = tokens / t * (elem + 1.0);
    MemoryPass {
        name: "fp8 casts",
        forward_bytes: bytes * (2.0 * h + c + f),
        backward_bytes: bytes * (2.0 * h + q + kv + v + 2.0 * f),
    }
}

/// The output side on each of `tp` chips, without its all-reduces: the
/// final RMSNorm, the `(b s) x h x V/t` head matmul and the
/// vocabulary-wide softmax cross-entropy.
pub fn head_time(model: &ModelSpec, rates: &ChipRates, micro_batch: u64, tp: u64) -> PassTime {
    let passes: PassTime = model
        .head_memory_passes(micro_batch, tp, rates.elem)
        .iter()
        .map(|p| rates.memory_pass(p))
        .sum();
    rates.matmul(&model.head_matmul(micro_batch, tp)) + passes
}

/// The input embedding: a gather forward, a scatter-add into the table's
/// gradient backward (no FLOPs counted, as Megatron counts none).
pub fn embedding_time(
    model: &ModelSpec,
    settings: &TrainingSettings,
    rates: &ChipRates,
    micro_batch: u64,
) -> PassTime {
    let pass = model.embedding_memory_passes(micro_batch, rates.elem, settings.grad_bytes());
    rates.memory_pass(&pass)
}

/// The timings of `stage` for micro-batches of `mb.size` sequences.
///
/// - compute, per operation class ([`layer_time`], [`head_time`] on the
///   last stage, [`embedding_time`] on the first): matmuls as rooflines
///   with a shape factor, attention at its head-dim shape, memory-bound
///   passes at the memory bandwidth, each kernel [`KERNEL_OVERHEAD`] and
///   at least the chip's dispatch floor;
///   backward twice the matmul FLOPs plus the backward passes, plus the
///   recomputed forward (full) or attention (selective);
/// - tensor parallel: the matmuls split by `t`, norms and residual adds
///   not; per layer 2 all-reduces of `s b h` elements forward and 2
///   backward (4 with full recomputation) at the intra-node bandwidth, ring
///   factor `2 (t-1)/t`, plus [`COLLECTIVE_HOP_LATENCY`] per ring step;
///   the vocabulary-parallel embedding one forward, the head one backward
///   and its loss three of `b s` f32 values forward;
/// - `send_next`: `2 s b h` bytes (16-bit) over the slower link of the two
///   stages (NICs and network across nodes), blocking the sender (for a
///   `polychip` chip type, [`stage_timing`] then sends it asynchronously,
///   as its trainer's sender thread does);
/// - `dp_allreduce`: `2 (d-1)/d * params_stage/t * grad_bytes / bw_slowest`,
///   not overlapped (for a `polychip` chip type, [`stage_timing`] then
///   takes the part its trainer's overlap leaves);
/// - `optimizer`: reading gradients, weights and twice the optimizer state
///   at the chip's memory bandwidth
///   ([`ChipType::memory_bandwidth_or_default`]).
pub fn analytic_stage_timing(
    model: &ModelSpec,
    settings: &TrainingSettings,
    cluster: &ClusterSpec,
    stage: &StageShape,
    mb: Microbatching,
) -> StageTiming {
    let chip = stage.chip;
    let tp = stage.tp.max(1);
    let n = (stage.layers.end - stage.layers.start) as f64;
    let b = mb.size;
    let rates = ChipRates::new(chip, settings);
    let sbh_bytes = (model.seq_len * b * model.hidden * settings.dtype.bytes()) as f64;
    let tp_ar = tp_allreduce_time(sbh_bytes, tp, chip.intra_node_bandwidth);
    let weight_grads = |rates: &ChipRates, mms: &[Matmul]| -> f64 {
        mms.iter().map(|mm| rates.weight_grad_time(mm)).sum()
    };
    let split = settings.recompute_split(stage.layers.end - stage.layers.start);
    let (mut forward, mut backward, mut weight_grad) = (0.0, 0.0, 0.0);
    // Each kind of layer the stage holds (a mixture's dense first layers
    // and its expert ones), `k` of its `n`.
    for (m, k) in model.layer_kinds(&stage.layers).iter() {
        let k = k as f64;
        let mut layer = layer_time(m, settings, &rates, b, tp);
        // A mixture of experts' token exchange, twice each way.
        let a2a = expert_all_to_all_time(m, settings, chip, b, tp);
        layer.forward += 2.0 * a2a;
        layer.backward += 2.0 * a2a;
        // Selective recomputation reruns its modules' forward (the core
        // attention's by default); full recomputation the whole forward of
        // the layers it recomputes (of each kind its share).
        let recompute = match settings.recompute {
            Recompute::None => 0.0,
            Recompute::Selective => k * recomputed_forward(m, settings, &rates, b, tp, a2a),
            Recompute::Full => split.recomputed * k / n * (layer.forward + 2.0 * tp_ar),
        };
        forward += k * (layer.forward + 2.0 * tp_ar);
        backward += k * (layer.backward + 2.0 * tp_ar) + recompute;
        let split = experts_split(m, settings, tp);
        weight_grad += k * weight_grads(&rates.for_layer_matmuls(), &m.layer_matmuls(b, tp, split));
    }
    let (cp_forward, cp_backward) =
        context_parallel_attention(model, settings, cluster, stage, &rates, b);
    forward += n * cp_forward;
    backward += n * cp_backward;
    if stage.holds_head() {
        // The head, again for each multi-token-prediction layer after its
        // projection (whose transformer layer is among the stage's).
        let heads = 1.0 + model.mtp_layers as f64;
        weight_grad += heads * weight_grads(&rates, &[model.head_matmul(b, tp)]);
        let head = head_time(model, &rates, b, tp);
        let loss_bytes = (b * model.seq_len) as f64 * 4.0;
        let loss_ar = 3.0 * tp_allreduce_time(loss_bytes, tp, chip.intra_node_bandwidth);
        forward += heads * (head.forward + loss_ar);
        backward += heads * (head.backward + tp_ar);
        if model.mtp_layers > 0 {
            let mtp = model.mtp_layers as f64;
            let projection = model.mtp_projection_matmul(b, tp);
            let p = rates.matmul(&projection);
            weight_grad += mtp * weight_grads(&rates, &[projection]);
            forward += mtp * (p.forward + tp_ar);
            backward += mtp * p.backward;
        }
    }
    if stage.holds_embedding() {
        let embedding = embedding_time(model, settings, &rates, b);
        forward += embedding.forward + tp_ar;
        backward += embedding.backward;
    }
    let send_next = stage.next.map_or(0.0, |next| {
        pipeline_send_time(settings, sbh_bytes, tp, chip, || {
            cluster.send_bandwidth(
                chip,
                next.senders,
                next.chip,
                next.receivers,
                next.same_node,
            )
        })
    });
    let params = ChipParams::of(model, settings, stage);
    let group = reduction_group(settings, stage);
    let bandwidth = dp_bandwidth(cluster, chip, group, tp, stage.dp_peers, stage.dp_one_node);
    let dp_allreduce = params.over_groups(model, settings, group, |p, g| {
        allreduce_time(p * settings.grad_bytes(), g, bandwidth)
    });
    StageTiming {
        name: format!(
            "stage {} ({} x{}, {})",
            stage.index,
            chip.name,
            tp,
            match (
                stage.layers.is_empty(),
                stage.holds_embedding(),
                stage.holds_head()
            ) {
                (true, true, _) => "the embedding alone".to_string(),
                (true, false, true) => "the head alone".to_string(),
                (true, false, false) => "no layer".to_string(),
                (false, ..) if stage.layers.end > model.layers => {
                    let mtp = stage.layers.end - model.layers;
                    match stage.layers.start < model.layers {
                        true => format!(
                            "layers {}-{} and {mtp} MTP",
                            stage.layers.start,
                            model.layers - 1
                        ),
                        false => format!("the head and {mtp} MTP"),
                    }
                }
                (false, ..) => format!("layers {}-{}", stage.layers.start, stage.layers.end - 1),
            }
        ),
        forward,
        backward,
        send_next,
        dp_allreduce,
        optimizer: optimizer_time(model, settings, chip, params, group),
        sends_async: false,
        weight_grad,
    }
}

/// One all-to-all of a mixture of experts' token exchange on a chip, for a
/// micro-batch of `b` sequences (0 for a dense model or without expert
/// parallelism): each chip sends the `k` copies of its tokens (`b s / t`
/// with sequence parallelism, whose tokens each chip of a tensor-parallel
/// group dispatches its share of; `b s` without) to the experts' holders,
/// all but the `1 / ep` of them it holds itself; a layer runs four (the
/// dispatch and the combination, forward and backward), not overlapped
/// (Megatron-LM's default). The expert-parallel group's `ep` members,
/// `e` chips apart (the expert tensor-parallel degree, the `tp` by
/// default), sit in one node when its `ep e` chips fit there, and exchange
/// over its links; else the
/// share bound for other nodes, `(ep - q) / ep` of it (`q` of the group on
/// a node), goes over the chip's share of its node's network
/// ([`ChipType::nic_share`], every chip of the node sending at once) while
/// the rest crosses the node. Each of the `ep - 1` messages also pays
/// [`COLLECTIVE_HOP_LATENCY`].
pub fn expert_all_to_all_time(
    model: &ModelSpec,
    settings: &TrainingSettings,
    chip: &ChipType,
    b: u64,
    tp: u64,
) -> f64 {
    let ep = expert_parallel(model, settings);
    if ep <= 1 {
        return 0.0;
    }
    let t = tp.max(1);
    let tokens = (b * model.seq_len) as f64 / settings.sequence_split(t);
    let bytes = tokens
        * model.experts_per_token as f64
        * model.hidden as f64
        * settings.dtype.bytes() as f64;
    let etp = expert_tensor_parallel(model, settings, t);
    let per_node = (chip.chips_per_node / etp).clamp(1, ep);
    let inside = (per_node - 1) as f64 / ep as f64 * bytes / chip.intra_node_bandwidth;
    let outside = match ep > per_node {
        true => {
            // Every chip of the node sends out at once: each gets its
            // share of the node's network.
            (ep - per_node) as f64 / ep as f64 * bytes / chip.nic_share(chip.chips_per_node)
        }
        false => 0.0,
    };
    inside.max(outside) + (ep - 1) as f64 * COLLECTIVE_HOP_LATENCY
}

/// What context parallelism adds to one layer's forward and backward pass
/// on each chip, `model` being the per-chip model ([`per_chip_model`]: `s
/// / c` tokens of a sequence): its attention attends all `s` keys, `c`
/// times the per-chip model's scores (the causal work shared evenly, as
/// Megatron-LM's load-balanced split does), and the ring exchanges each
/// chip's keys and values with the `c - 1` others, `(c - 1) 2 b (s / c)
/// kv / t` elements forward and twice that backward (the keys and values
/// again, and their gradients), overlapped with the attention it feeds:
/// only what the exchange takes beyond it is added. The ring runs over
/// the node's links when its `t c` chips fit in a node, else over each
/// chip's NIC (at most the network's bandwidth). Nothing without it.
fn context_parallel_attention(
    model: &ModelSpec,
    settings: &TrainingSettings,
    cluster: &ClusterSpec,
    stage: &StageShape,
    rates: &ChipRates,
    b: u64,
) -> (f64, f64) {
    let c = settings.context_parallel;
    if c <= 1 {
        return (0.0, 0.0);
    }
    let tp = stage.tp.max(1);
    let chip = stage.chip;
    let attention = attention_time(model, rates, b, tp);
    let (compute_f, compute_b) = (c as f64 * attention.forward, c as f64 * attention.backward);
    let chunk =
        (b * model.seq_len * (model.kv_dim() + model.v_dim())) as f64 / tp as f64 * rates.elem;
    let link = match tp.saturating_mul(c) <= chip.chips_per_node {
        true => chip.intra_node_bandwidth,
        false => chip.nic_bandwidth.min(cluster.inter_node_bandwidth),
    };
    let exchange = (c - 1) as f64 * chunk / link;
    (
        compute_f - attention.forward + (exchange - compute_f).max(0.0),
        compute_b - attention.backward + (2.0 * exchange - compute_b).max(0.0),
    )
}

/// The timings of `stage` for micro-batches of `mb.size` sequences: those
/// of the cost model below ([`analytic_stage_timing`]), except that a chip
/// type with measured costs (a profile) is priced from them
/// (`profile::apply_measured`).
pub fn stage_timing(
    model: &ModelSpec,
    settings: &TrainingSettings,
    cluster: &ClusterSpec,
    stage: &StageShape,
    mb: Microbatching,
) -> StageTiming {
    let model = &*per_chip_model(model, settings);
    let mut timing = analytic_stage_timing(model, settings, cluster, stage, mb);
    if !stage.chip.measured.is_empty() {
        crate::profile::apply_measured(&mut timing, model, settings, cluster, stage, mb);
    }
    zero_collectives(model, settings, cluster, stage, &mut timing);
    let polychip = stage.chip.framework == Framework::Polychip;
    // Under ZeRO-2 and 3 the step's end holds the weights' gather, which
    // no backward pass overlaps.
    let reduces_at_end = settings.zero() <= 1;
    if reduces_at_end && timing.dp_allreduce > 0.0 {
        // A sharded optimizer's reduction is a reduce-scatter of the
        // gradients and an all-gather of the updated weights, each half of
        // the all-reduce's time: only the first can overlap the backward
        // pass (the weights are updated after it), and the gather follows
        // the optimizer step, or overlaps the next step's first forward
        // pass but for its first unit (`overlap_param_gather`). Until
        // 2026-12-07 the whole all-reduce was overlapped with the backward
        // pass where the reduction overlapped.
        let (reduce, gather) = match settings.zero() == 1 {
            true => (timing.dp_allreduce / 2.0, timing.dp_allreduce / 2.0),
            false => (timing.dp_allreduce, 0.0),
        };
        let reduce = match polychip || settings.overlap_grad_reduce {
            true => overlapped_reduction(model, settings, stage, &timing, reduce),
            false => reduce,
        };
        let gather = match settings.overlap_param_gather {
            true => {
                let unit = largest_unit_share(model, settings, stage);
                (gather - timing.forward).max(0.0) + unit * gather
            }
            false => gather,
        };
        timing.dp_allreduce = reduce + gather;
    }
    if polychip {
        // `polychip train` sends from a thread of each rank's own.
        timing.sends_async = true;
    }
    timing
}

/// The parameters (per chip of its `tp`) of the largest unit `stage`
/// gathers or reduces whole under ZeRO-2 and ZeRO-3: a layer, or the
/// embedding or the head it holds (vocabulary-wide, often larger); at most
/// the stage's own on a chip, `stage_params`.
#[inline]
fn largest_unit_params(
    model: &ModelSpec,
    settings: &TrainingSettings,
    stage: &StageShape,
    stage_params: f64,
) -> f64 {
    let tp = stage.tp.max(1) as f64;
    let mut unit = match stage.layers.is_empty() {
        true => 0.0,
        false => {
            over_kinds(model, &stage.layers, |m| {
                ChipParams::layers(m, settings, 1, stage.tp).total()
            })
            .max
        }
    };
    if stage.holds_embedding() {
        unit = unit.max(model.embedding_params() as f64 / tp);
    }
    if stage.holds_head() {
        unit = unit.max(model.head_params() as f64 / tp);
    }
    unit.min(stage_params)
}

/// [`largest_unit_params`]' share of the stage's parameters on a chip:
/// the part of a collective over the stage's weights or gradients that no
/// pass overlaps (0 for a stage of no parameters).
fn largest_unit_share(model: &ModelSpec, settings: &TrainingSettings, stage: &StageShape) -> f64 {
    match ChipParams::of(model, settings, stage).total() {
        p if p <= 0.0 => 0.0,
        p => largest_unit_params(model, settings, stage, p) / p,
    }
}

/// The collectives of ZeRO-2 and ZeRO-3 over a stage's data-parallel
/// group of `d` replicas, each an all-gather or a reduce-scatter of
/// `(d - 1)/d` of its bytes over the group's slowest link (the link its
/// all-reduce is priced over, [`dp_bandwidth`]):
///
/// - ZeRO-2 reduce-scatters the stage's gradients after every
///   micro-batch's backward pass, not once a step (DeepSpeed's stage 2
///   keeps only its partition between micro-batches), outside the pass
///   (`overlap_comm` is off by default; with `overlap_grad_reduce` in
///   buckets while it goes on), and gathers the updated weights
///   after the optimizer step, in place of the all-reduce;
/// - ZeRO-3 (DeepSpeed's stage 3, FSDP's full sharding) gathers the
///   weights for every forward pass and again for every backward pass, and
///   reduce-scatters the gradients after it; the gathers and reductions of
///   one unit (a layer, or the embedding or head) overlap the compute of
///   the next (both prefetch by default), so a pass takes the longer of
///   its compute and its collectives plus the one unit's collective that
///   nothing overlaps; nothing is left for the step's end.
///
/// ZeRO-1 (and nothing sharded) keep the step's all-reduce.
fn zero_collectives(
    model: &ModelSpec,
    settings: &TrainingSettings,
    cluster: &ClusterSpec,
    stage: &StageShape,
    timing: &mut StageTiming,
) {
    let zero = settings.zero();
    let d = reduction_group(settings, stage);
    if zero < 2 || d == 1 {
        return;
    }
    let tp = stage.tp.max(1);
    let params = ChipParams::of(model, settings, stage);
    if params.total() <= 0.0 {
        return;
    }
    let bandwidth = dp_bandwidth(
        cluster,
        stage.chip,
        d,
        tp,
        stage.dp_peers,
        stage.dp_one_node,
    );
    let [weights, gradients] = zero_collective_seconds(model, settings, params, d, bandwidth);
    if zero == 2 {
        // With `overlap_grad_reduce` (DeepSpeed's `overlap_comm`) each
        // bucket is reduced while the pass goes on, as the step's
        // all-reduce is below.
        timing.backward += match settings.overlap_grad_reduce {
            true => overlapped_reduction(model, settings, stage, timing, gradients),
            false => gradients,
        };
        timing.dp_allreduce = weights;
        return;
    }
    let unit = largest_unit_share(model, settings, stage);
    timing.forward = timing.forward.max(weights) + unit * weights;
    timing.backward = timing.backward.max(weights + gradients) + unit * gradients;
    timing.dp_allreduce = 0.0;
}

/// Seconds of ZeRO's all-gather of `params` weights (a chip's share) and
/// of its reduce-scatter of their gradients over `d` replicas at
/// `bandwidth` ([`ring_pass_time`] each; [`zero_collectives`]); a mixture's
/// experts over the `d / ep` replicas holding the same ones.
pub fn zero_collective_seconds(
    model: &ModelSpec,
    settings: &TrainingSettings,
    params: ChipParams,
    d: u64,
    bandwidth: f64,
) -> [f64; 2] {
    let pass = |bytes: f64| {
        params.over_groups(model, settings, d, |p, g| {
            ring_pass_time(p * bytes, g, bandwidth)
        })
    };
    [
        pass(settings.dtype.bytes() as f64),
        pass(settings.grad_bytes()),
    ]
}

/// Refuses settings the cluster's chip types cannot be priced under.
/// Chip types of `polychip train`'s (`framework = "polychip"`), which
/// shards the optimizer state only (ZeRO-1), gathers its sharded weights
/// at the step's end and splits no sequence: ZeRO-2 and ZeRO-3, an
/// overlapped parameter gather, context parallelism. Context parallelism
/// also on a chip type priced from a profile (which measures whole
/// sequences), and for sequences that do not split into `2 c` equal chunks
/// (Megatron-LM's load-balanced split needs them).
pub fn check_cluster_settings(
    model: &ModelSpec,
    cluster: &ClusterSpec,
    settings: &TrainingSettings,
) -> Result<(), crate::error::SpecError> {
    let refuse = |m: String| Err(crate::error::SpecError::Settings(m));
    let (zero, c) = (settings.zero(), settings.context_parallel);
    let chip = |keep: &dyn Fn(&ChipType) -> bool| cluster.chip_types.iter().find(|t| keep(t));
    if let Some(chip) = chip(&|t| t.framework == Framework::Polychip) {
        let polychip = format!(
            "chip type {} is priced as polychip train runs it (framework = \"polychip\")",
            chip.name
        );
        if zero >= 2 {
            return refuse(format!(
                "zero_stage is {zero}, but {polychip}, which shards the optimizer state only \
                 (ZeRO-1): give zero_stage 0 or 1 (shard_optimizer)"
            ));
        }
        if settings.overlap_param_gather {
            return refuse(format!(
                "overlap_param_gather is set, but {polychip}, which gathers its sharded weights \
                 at the step's end"
            ));
        }
        if c > 1 {
            return refuse(format!(
                "context_parallel is {c}, but {polychip}, which splits no sequence"
            ));
        }
        if model.is_moe() {
            return refuse(format!(
                "the model is a mixture of {} experts, but {polychip}, which trains dense \
                 models",
                model.experts
            ));
        }
        if model.is_mla() {
            return refuse(format!(
                "the model's attention is latent (kv_lora_rank {}), but {polychip}, whose \
                 attention is grouped-query",
                model.kv_lora_rank
            ));
        }
        if model.mtp_layers > 0 {
            return refuse(format!(
                "the model trains {} multi-token-prediction layers (mtp_layers), but \
                 {polychip}, which predicts the next token only",
                model.mtp_layers
            ));
        }
    }
    if settings.fp8
        && let Some(chip) = chip(&|t| t.peak_flops.fp8.is_none())
    {
        return refuse(format!(
            "fp8 is set, but chip type {} gives no peak_flops.fp8 (a chip without FP8 \
             matmuls, or a cluster file that does not say); give its fp8 peak, or plan \
             without --fp8",
            chip.name
        ));
    }
    let ep = settings.expert_parallel;
    if ep > 1 && !model.is_moe() {
        return refuse(format!(
            "expert_parallel is {ep}, but model \"{}\" is dense (no experts to divide); give \
             expert_parallel 1, or a mixture of experts",
            model.name
        ));
    }
    let etp = settings.expert_tensor_parallel;
    if etp > 0 && !model.is_moe() {
        return refuse(format!(
            "expert_tensor_parallel is {etp}, but model \"{}\" is dense (no experts to split)",
            model.name
        ));
    }
    if ep > 1 && model.experts % ep != 0 {
        return refuse(format!(
            "expert_parallel is {ep}, which does not divide the model's {} experts a layer \
             (each chip of an expert-parallel group holds as many)",
            model.experts
        ));
    }
    if c <= 1 {
        return Ok(());
    }
    if model.seq_len % (2 * c) != 0 {
        return refuse(format!(
            "context_parallel is {c}, but the model's sequences of {} tokens do not split into \
             {} equal chunks (two a group, as Megatron-LM balances the causal work)",
            model.seq_len,
            2 * c
        ));
    }
    if let Some(chip) = chip(&|t| !t.measured.is_empty()) {
        return refuse(format!(
            "context_parallel is {c}, but chip type {} is priced from a profile, which measures \
             whole sequences; score context parallelism without --profile",
            chip.name
        ));
    }
    Ok(())
}

/// The part of a stage's gradient reduction of `reduce` seconds left after
/// its last backward pass when each bucket is reduced as soon as the pass
/// has produced it. `polychip train` does this in buckets of half blocks
/// ([`crate::overlap::BUCKET_BYTES`]); the frameworks the other chip types
/// stand for reduce after the pass unless the settings say they overlap
/// (`overlap_grad_reduce`), as Megatron-LM does in buckets of at least
/// `max(4e7, 1e6 d)` parameters ([`megatron_bucket_params`]). Each block is
/// taken as two halves of equal parameters.
fn overlapped_reduction(
    model: &ModelSpec,
    settings: &TrainingSettings,
    stage: &StageShape,
    timing: &StageTiming,
    reduce: f64,
) -> f64 {
    let per_param = settings.grad_bytes() / stage.tp.max(1) as f64;
    let bytes = |params: u64| (params as f64 * per_param) as u64;
    // A layer's gradients on a chip (a mixture's experts over `ep`), in
    // bytes, as two halves; a mixture's dense first layers' apart.
    let layer_bytes = |m: &ModelSpec| {
        (ChipParams::layers(m, settings, 1, stage.tp).total() * settings.grad_bytes()) as u64
    };
    let dense = model.dense_layer_model().map_or(0, |m| layer_bytes(&m));
    let layer = layer_bytes(model);
    let mut units = Vec::new();
    if stage.holds_embedding() {
        units.push(bytes(model.embedding_params()));
    }
    for l in stage.layers.clone() {
        let layer = match model.has_dense_layers() && !model.is_expert_layer(l) {
            true => dense,
            false => layer,
        };
        units.push(layer / 2);
        units.push(layer - layer / 2);
    }
    if stage.holds_head() {
        let embedding = stage.holds_embedding();
        let shared = model.shared_table_params(embedding, true);
        let again = model.mtp_table_params(embedding, true);
        units.push(bytes(model.head_params() + again - shared));
    }
    let window = crate::overlap::overlap_window(
        settings.schedule,
        stage.index,
        timing.backward,
        timing.weight_grad,
    );
    let min_bytes = match stage.chip.framework {
        Framework::Polychip => crate::overlap::BUCKET_BYTES,
        // A bucket counts the chip's own share of the parameters.
        Framework::Megatron => {
            let group = reduction_group(settings, stage);
            (megatron_bucket_params(group) as f64 * settings.grad_bytes()) as u64
        }
    };
    crate::overlap::exposed_reduction_in_buckets(reduce, window, &units, min_bytes)
}

/// Megatron-LM's gradient bucket, in parameters of a chip's own share: its
/// `--ddp-bucket-size` default, `max(40,000,000, 1,000,000 d)`.
pub fn megatron_bucket_params(dp: u64) -> u64 {
    40_000_000u64.max(1_000_000u64.saturating_mul(dp))
}

/// The optimizer step of `params` parameters (per chip, before sharding
/// over `dp`, a mixture's experts over `dp / ep`): reading gradients and
/// weights and reading and writing the optimizer state, at the chip's
/// memory bandwidth.
pub fn optimizer_time(
    model: &ModelSpec,
    settings: &TrainingSettings,
    chip: &ChipType,
    params: ChipParams,
    dp: u64,
) -> f64 {
    let per_param =
        settings.grad_bytes() + settings.dtype.bytes() as f64 + 2.0 * settings.optimizer_bytes();
    params.updated(model, settings, dp) * per_param / chip.memory_bandwidth_or_default()
}

#[cfg(test)]
#[path = "cost_tests.rs"]
mod tests;

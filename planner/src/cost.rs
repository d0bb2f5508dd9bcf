//! The cost model of one pipeline stage: memory per device (weights,
//! gradients, optimizer state, 1F1B activations) and time per micro-batch
//! and per step (compute, tensor-parallel all-reduces, point-to-point
//! transfers, the data-parallel gradient all-reduce, the optimizer step).
//! Formulas are those of `../shared/ANCHORS.md`, "Planning"; sizes are bytes,
//! times seconds. The result feeds [`crate::schedule::StageTiming`].

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::cluster::{ChipType, ClusterSpec};
use crate::model::ModelSpec;
use crate::schedule::StageTiming;
use crate::settings::{Recompute, TrainingSettings};

/// The stage after this one: its chip type and whether the boundary stays
/// inside a node (only possible for the same chip type).
#[derive(Debug, Clone, Copy)]
pub struct Boundary<'a> {
    /// The next stage's chip type.
    pub chip: &'a ChipType,
    /// Both stages' chips share a node, so the transfer uses the intra-node link.
    pub same_node: bool,
}

/// One pipeline stage as the cost model sees it.
#[derive(Debug, Clone)]
pub struct StageShape<'a> {
    /// The chip type all of the stage's chips are.
    pub chip: &'a ChipType,
    /// The model layers it runs, 0-based, end exclusive. Stage holding layer
    /// 0 also holds the embedding; the one holding the last layer, the final
    /// norm and the output head.
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
    /// The sum.
    pub total: f64,
}

/// Parameters of the layers `layers`, plus the embedding if it starts at
/// layer 0 and the final norm and head if it ends at the last layer.
pub fn stage_params(model: &ModelSpec, layers: &Range<u64>) -> u64 {
    let mut params = (layers.end - layers.start) * model.layer_params();
    if layers.start == 0 {
        params += model.embedding_params();
    }
    if layers.end == model.layers {
        params += model.head_params();
    }
    params
}

/// Micro-batches whose activations stage `index` of `num_stages` keeps
/// under 1F1B: `min(p - i, m)`; the first stage keeps the most.
pub fn inflight_microbatches(index: usize, num_stages: usize, microbatches: u64) -> u64 {
    (num_stages.saturating_sub(index) as u64).min(microbatches)
}

/// Activation bytes one layer keeps per micro-batch of `micro_batch`
/// sequences on each of `tp` chips (Korthikanti et al., 16-bit; scaled by
/// the dtype's size over 2): `s b h (34 + 5 a s / h) / t`; with flash
/// attention or selective recomputation `34 s b h / t`; with full
/// recomputation `2 s b h` (the layer input only).
pub fn layer_activation_bytes(
    model: &ModelSpec,
    settings: &TrainingSettings,
    micro_batch: u64,
    tp: u64,
) -> f64 {
    if settings.recompute == Recompute::Full {
        return checkpoint_bytes(model, settings, micro_batch);
    }
    full_layer_activation_bytes(model, settings, micro_batch, tp)
}

/// `2 s b h` (16-bit): the layer input that full recomputation keeps.
fn checkpoint_bytes(model: &ModelSpec, settings: &TrainingSettings, micro_batch: u64) -> f64 {
    let sbh = (model.seq_len * micro_batch * model.hidden) as f64;
    sbh * settings.dtype.bytes() as f64
}

/// One layer's activations without full recomputation.
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
    let per = if settings.flash_attention || settings.recompute == Recompute::Selective {
        34.0
    } else {
        34.0 + 5.0 * a * s / h
    };
    sbh * per * scale / tp.max(1) as f64
}

/// Memory of one device of `stage`: weights, gradients and optimizer state
/// of its parameters split over `t` (norms included, a slight
/// over-count), `dtype + grad + 12/d` bytes per parameter (18, 16 with bf16
/// gradients, `6 + 12/d` sharded), and the activations of its layers for
/// `min(p - i, m)` micro-batches. Full recomputation adds the working set of
/// the one layer being recomputed. Logits and embedding outputs are not
/// counted.
pub fn stage_memory(
    model: &ModelSpec,
    settings: &TrainingSettings,
    stage: &StageShape,
    mb: Microbatching,
) -> MemoryBreakdown {
    let params = stage_params(model, &stage.layers) as f64 / stage.tp.max(1) as f64;
    let shard = if settings.shard_optimizer {
        stage.dp.max(1) as f64
    } else {
        1.0
    };
    let weights = params * settings.dtype.bytes() as f64;
    let gradients = params * settings.grad_bytes();
    let optimizer = params * settings.optimizer_bytes() / shard;
    let n = (stage.layers.end - stage.layers.start) as f64;
    let kept = inflight_microbatches(stage.index, stage.num_stages, mb.count) as f64;
    let mut activations = n * kept * layer_activation_bytes(model, settings, mb.size, stage.tp);
    if settings.recompute == Recompute::Full && n > 0.0 {
        activations += full_layer_activation_bytes(model, settings, mb.size, stage.tp);
    }
    MemoryBreakdown {
        weights,
        gradients,
        optimizer,
        activations,
        total: weights + gradients + optimizer + activations,
    }
}

/// Ring all-reduce of `bytes` over `n` members: `2 (n - 1)/n * bytes / bw`.
pub fn allreduce_time(bytes: f64, n: u64, bandwidth: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    2.0 * (n - 1) as f64 / n as f64 * bytes / bandwidth
}

/// The slowest link of a stage's data-parallel group: the intra-node link
/// when all `d t` chips fit in one node, else the cross-node path.
pub fn dp_bandwidth(cluster: &ClusterSpec, chip: &ChipType, dp: u64, tp: u64) -> f64 {
    cluster.link_bandwidth(chip, chip, dp * tp <= chip.chips_per_node)
}

/// The timings of `stage` for micro-batches of `mb.size` sequences.
///
/// - compute: forward FLOPs (n layers, plus the head on the last stage) over
///   `peak[dtype] * efficiency * t`; backward is twice the forward, plus
///   the recomputed forward (full) or attention scores (selective);
/// - tensor parallel: per layer 2 all-reduces of `s b h` elements forward
///   and 2 backward (4 with full recomputation) at the intra-node bandwidth,
///   ring factor `2 (t-1)/t`;
/// - `send_next`: `2 s b h` bytes (16-bit) over the slower link of the two
///   stages (NICs and network across nodes);
/// - `dp_allreduce`: `2 (d-1)/d * params_stage/t * grad_bytes / bw_slowest`,
///   not overlapped;
/// - `optimizer`: reading gradients, weights and twice the optimizer state
///   at the chip's memory bandwidth (0 if the chip gives none).
pub fn stage_timing(
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
    let mut fwd_flops = n * model.layer_forward_flops(b);
    if stage.layers.end == model.layers {
        fwd_flops += model.head_forward_flops(b);
    }
    if stage.layers.start == 0 {
        fwd_flops += model.embedding_forward_flops(b);
    }
    let recompute_flops = match settings.recompute {
        Recompute::None => 0.0,
        Recompute::Selective => n * model.attention_score_forward_flops(b),
        Recompute::Full => n * model.layer_forward_flops(b),
    };
    let rate = chip.sustained_flops(settings.dtype) * tp as f64;
    let sbh_bytes = (model.seq_len * b * model.hidden * settings.dtype.bytes()) as f64;
    let tp_ar = allreduce_time(sbh_bytes, tp, chip.intra_node_bandwidth);
    let bwd_ars = if settings.recompute == Recompute::Full {
        4.0
    } else {
        2.0
    };
    let forward = fwd_flops / rate + n * 2.0 * tp_ar;
    let backward = (2.0 * fwd_flops + recompute_flops) / rate + n * bwd_ars * tp_ar;
    let send_next = stage.next.map_or(0.0, |next| {
        sbh_bytes / cluster.link_bandwidth(chip, next.chip, next.same_node)
    });
    let params = stage_params(model, &stage.layers) as f64 / tp as f64;
    let dp_allreduce = allreduce_time(
        params * settings.grad_bytes(),
        stage.dp,
        dp_bandwidth(cluster, chip, stage.dp, tp),
    );
    let shard = if settings.shard_optimizer {
        stage.dp.max(1) as f64
    } else {
        1.0
    };
    let optimizer = chip.memory_bandwidth.map_or(0.0, |bw| {
        let per_param = settings.grad_bytes()
            + settings.dtype.bytes() as f64
            + 2.0 * settings.optimizer_bytes();
        params / shard * per_param / bw
    });
    let mut timing = StageTiming {
        name: format!(
            "stage {} ({} x{}, layers {}-{})",
            stage.index,
            chip.name,
            tp,
            stage.layers.start,
            stage.layers.end.saturating_sub(1)
        ),
        forward,
        backward,
        send_next,
        dp_allreduce,
        optimizer,
    };
    // A chip type with measured costs is priced from them instead.
    crate::profile::apply_measured(&mut timing, model, settings, stage, b, params / shard);
    timing
}

#[cfg(test)]
#[path = "cost_tests.rs"]
mod tests;

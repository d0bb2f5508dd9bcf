//! Planning from measured costs: the search `polychip train --plan auto`
//! runs over the devices at hand, after profiling each kind on the model.
//!
//! The FLOP-based search ([`crate::search`]) plans clusters of thousands of
//! chips from peak rates and efficiencies. On a few real devices the
//! measured times are better inputs: a slow chip's fixed per-operator
//! costs, its output head, its optimizer step do not scale with FLOPs. This
//! search takes per-device forward and backward times of a block, of the
//! embedding and of the head, and the optimizer's time per parameter, and
//! evaluates every candidate layout with the discrete-event 1F1B
//! simulator ([`crate::sim`]):
//! - pipelines over all the devices in every order, with every split of
//!   the blocks into contiguous stages, cut between blocks or halfway
//!   through one, between its attention and feed-forward halves (HeteroPP
//!   with layer counts fitted to speed at half a block's grain, and the
//!   order free, so a slow chip can take the cheap first stage instead of
//!   the head), and where the model gives its feed-forward width or its
//!   key/value heads, the best of them refined with cuts inside a half: a
//!   feed-forward half's hidden columns, or an attention half's kv heads
//!   (each with its query heads), split between the stages on either side
//!   (finer than half a block, which leaves a chip a dozen times slower
//!   than the other a couple of percent short of the balance);
//! - data-parallel replicas, each device the whole model, the micro-batches
//!   of the step dealt out so that the slowest replica finishes first
//!   (China Mobile's DP across types);
//! - each device alone: not a layout of the cluster, only the baseline of
//!   the speedup ratio (`polychip train --device` runs it).

use serde::{Deserialize, Serialize};

use crate::overlap;
use crate::schedule::{PipelineSchedule, Schedule, StageTiming};
use crate::sim;
use crate::uncertainty::SigmaPoints;

/// One device and its measured costs per micro-batch, seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredDevice {
    /// Its name, e.g. `cobalt:0`.
    pub name: String,
    /// Forward of one block.
    pub block_forward: f64,
    /// Backward of one block.
    pub block_backward: f64,
    /// The attention half's part of `block_forward` (the feed-forward
    /// half's is the rest).
    pub attention_forward: f64,
    /// The attention half's part of `block_backward`.
    pub attention_backward: f64,
    /// Forward of the embedding.
    pub embed_forward: f64,
    /// Backward of the embedding.
    pub embed_backward: f64,
    /// Forward of the final norm, head and loss.
    pub head_forward: f64,
    /// Backward of the same.
    pub head_backward: f64,
    /// Optimizer step (with clipping) per parameter.
    pub optimizer_per_param: f64,
    /// The weights' gradients' part of `block_backward` (0: not measured),
    /// which the zero-bubble schedule runs after the send; a half block's
    /// share is its share of the block's parameters.
    pub block_weight_grad: f64,
    /// The weights' gradients' part of `head_backward` (0: not measured).
    pub head_weight_grad: f64,
    /// A backward pass run whole (the weights' gradients with the input's,
    /// as 1F1B, data-parallel replicas and a zero-bubble pipeline's first
    /// stage run it) over the same pass split in two (the input's pass,
    /// then the weights', as the costs above are measured and a zero-bubble
    /// stage runs it): 0 when not measured, taken as 1. On Ferrite the
    /// whole pass measured 5-6% less in training (docs/performance.md).
    #[serde(default)]
    pub fused_backward_ratio: f64,
    /// A block's forward pass run while the stage holds another
    /// micro-batch's activations (as every 1F1B stage but the last does:
    /// it starts the next forward pass before the last one's backward) over
    /// the same pass run with nothing else held, as the costs above are
    /// measured: 0 when not measured, taken as 1. On Ferrite about 1.01
    /// forward and 1.02-1.04 backward (docs/performance.md, stop 48).
    #[serde(default)]
    pub held_forward_ratio: f64,
    /// The same of the backward pass.
    #[serde(default)]
    pub held_backward_ratio: f64,
    /// A fixed forward cost each pipeline stage (or replica) pays per
    /// micro-batch whatever it holds (a launch, a synchronisation, memory
    /// mapped afresh): 0 when the profile found none. The costs above are
    /// of the parts alone, without it.
    #[serde(default)]
    pub stage_forward: f64,
    /// The same of the backward pass.
    #[serde(default)]
    pub stage_backward: f64,
}

impl MeasuredDevice {
    /// Every cost of a device, one accessor each (all but the name): the
    /// one list code that treats the costs alike derives from, so that a
    /// cost added to the struct is added here and nowhere else.
    pub const COSTS: [fn(&mut MeasuredDevice) -> &mut f64; 13] = [
        |d| &mut d.block_forward,
        |d| &mut d.block_backward,
        |d| &mut d.attention_forward,
        |d| &mut d.attention_backward,
        |d| &mut d.embed_forward,
        |d| &mut d.embed_backward,
        |d| &mut d.head_forward,
        |d| &mut d.head_backward,
        |d| &mut d.optimizer_per_param,
        |d| &mut d.block_weight_grad,
        |d| &mut d.head_weight_grad,
        |d| &mut d.stage_forward,
        |d| &mut d.stage_backward,
    ];

    /// What a backward pass run whole costs over its split costs
    /// ([`Self::fused_backward_ratio`], 1 when not measured), within half
    /// to twice (the same work; profile files are held to that range).
    pub fn fused_backward(&self) -> f64 {
        measured_ratio(self.fused_backward_ratio)
    }

    /// What a stage's forward and backward passes cost when it holds
    /// other micro-batches in flight over their costs above
    /// ([`Self::held_forward_ratio`], 1 when not measured), each within
    /// half to twice (profile files are held to that range).
    pub fn held(&self) -> (f64, f64) {
        (
            measured_ratio(self.held_forward_ratio),
            measured_ratio(self.held_backward_ratio),
        )
    }

    /// The same device with every cost multiplied by `f`.
    pub fn scaled(&self, f: f64) -> MeasuredDevice {
        let mut d = self.clone();
        for cost in Self::COSTS {
            *cost(&mut d) *= f;
        }
        d
    }
}

/// A measured ratio of one way of running a pass over another (the same
/// work): 1 when not measured (0, or not finite), else held to half to
/// twice, the range profile files are validated to.
fn measured_ratio(r: f64) -> f64 {
    match r {
        r if r > 0.0 && r.is_finite() => r.clamp(0.5, 2.0),
        _ => 1.0,
    }
}

/// The model as the search needs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeasuredModel {
    /// Blocks.
    pub layers: usize,
    /// Parameters of one block.
    pub block_params: u64,
    /// Those of its attention half (the feed-forward half holds the rest).
    pub attention_params: u64,
    /// Hidden columns of a block's feed-forward half (its SwiGLU width):
    /// the grain of the cuts inside that half ([`MeasuredStage`]); 0 cuts
    /// no feed-forward half.
    pub ffn: usize,
    /// Key/value heads of a block's attention half (its grouped-query
    /// attention's, each with its share of the query heads): the grain of
    /// the cuts inside that half ([`MeasuredStage`]); 0 cuts no attention
    /// half.
    pub kv_heads: usize,
    /// Parameters of the embedding.
    pub embed_params: u64,
    /// Parameters of the final norm and head.
    pub head_params: u64,
    /// Bytes of one micro-batch's activation between stages.
    pub activation_bytes: u64,
    /// Sequences per micro-batch.
    pub micro_batch: usize,
    /// Micro-batches per step (global batch / micro-batch).
    pub micro_batches: usize,
    /// Bytes per gradient element in the reduction.
    pub grad_bytes: u64,
    /// Bandwidth between devices, bytes/s (transfers and reductions).
    pub link_bandwidth: f64,
    /// Whether data-parallel replicas may shard the optimizer step
    /// ([`sharded_optimizer`]).
    pub shard_optimizer: bool,
    /// Whether the gradient reduction overlaps the last backward pass
    /// ([`crate::overlap`]); otherwise it starts after it.
    pub overlap_reduction: bool,
    /// Whether a stage's sends leave it free at once, on a sender thread
    /// that sends them one after another (`polychip train`'s default);
    /// otherwise a stage waits for each of its transfers.
    pub async_sends: bool,
    /// The pipelines' schedule.
    pub schedule: PipelineSchedule,
    /// The relative standard error of each device kind's measured costs:
    /// layouts are chosen by their expected step under it
    /// ([`crate::uncertainty`]); 0 chooses by the nominal step.
    pub profile_error: f64,
}

/// Which layouts to consider. Every layout uses every device: the
/// question is how to train on the whole cluster (a device alone is only
/// the baseline of the speedup ratio).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layouts {
    /// Every layout below.
    All,
    /// Pipelines over all the devices.
    Pipelines,
    /// Whole-model replicas on all the devices.
    Replicas,
}

/// One stage of a measured plan: a device index and the half blocks
/// `[from, to)`: half `h` is block `h / 2`'s attention half when `h` is
/// even, its feed-forward half when odd (blocks `[first, end)` are halves
/// `[2 first, 2 end)`).
///
/// A cut may also fall inside a half, by its columns: a feed-forward
/// half's `ffn` hidden columns ([`MeasuredModel::ffn`]), or an attention
/// half's `kv_heads` key/value heads ([`MeasuredModel::kv_heads`]), each
/// with its query heads. The stage before the cut computes the half's norm
/// and its first `c` columns, the stage after it the others, and two
/// activations cross the cut instead of one (the normed input and the
/// partial residual sum). The stage then holds the span from position
/// `(from, from_cols)` to position `(to, to_cols)`: it starts after the
/// first `from_cols` columns of half `from` (holding its columns
/// `from_cols..ffn`, or `from_cols..kv_heads` when `from` is even), and it
/// also holds the first `to_cols` columns of half `to`. A stage with `from
/// == to` and `from_cols < to_cols` holds columns `from_cols..to_cols` of
/// that half. Both are 0 for a stage cut between halves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeasuredStage {
    /// Index into the devices.
    pub device: usize,
    /// First half block (held in part when `from_cols` is not 0).
    pub from: usize,
    /// One past the last half block held whole.
    pub to: usize,
    /// Columns of half `from` the stage before holds: kv heads when
    /// `from` is even, feed-forward columns when odd; 0 when the stage
    /// starts with the whole half.
    pub from_cols: usize,
    /// Columns of half `to` this stage holds, the first ones: kv heads
    /// when `to` is even, feed-forward columns when odd; 0 when it ends
    /// before half `to`.
    pub to_cols: usize,
}

/// What a stage holds: the half blocks `[from, to)`, cut inside a half at
/// either end by `from_cols` and `to_cols` (kv heads of an attention
/// half, columns of a feed-forward half; see [`MeasuredStage`]), and the
/// embedding or the head (a pipeline's first and last stage, which may
/// hold no block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// First half block (held in part when `from_cols` is not 0).
    pub from: usize,
    /// One past the last half block held whole.
    pub to: usize,
    /// Columns (kv heads when `from` is even) of half `from` not held,
    /// the first ones.
    pub from_cols: usize,
    /// Columns (kv heads when `to` is even) of half `to` held, the first
    /// ones.
    pub to_cols: usize,
    /// Holds the embedding.
    pub embed: bool,
    /// Holds the final norm, head and loss.
    pub head: bool,
}

impl Span {
    /// The whole model of `layers` blocks.
    pub fn whole(layers: usize) -> Span {
        Span {
            from: 0,
            to: 2 * layers,
            from_cols: 0,
            to_cols: 0,
            embed: true,
            head: true,
        }
    }

    /// Stage `s`, the `i`th of `k`.
    pub fn of(s: &MeasuredStage, i: usize, k: usize) -> Span {
        Span {
            from: s.from,
            to: s.to,
            from_cols: s.from_cols,
            to_cols: s.to_cols,
            embed: i == 0,
            head: i + 1 == k,
        }
    }

    /// The attention halves and the feed-forward halves it holds, a half
    /// held in part counted by its share of the columns: of the `kv_heads`
    /// kv heads for an attention half, of the `ffn` columns for a
    /// feed-forward half ([`span_counts`]).
    pub fn counts(&self, ffn: usize, kv_heads: usize) -> (f64, f64) {
        span_counts(
            self.from,
            self.from_cols,
            self.to,
            self.to_cols,
            ffn,
            kv_heads,
        )
    }
}

/// The attention halves (even) and feed-forward halves (odd) of the half
/// blocks `[from, to)`.
pub fn half_counts(from: usize, to: usize) -> (usize, usize) {
    let n = to.saturating_sub(from);
    let attention = match from % 2 {
        0 => n.div_ceil(2),
        _ => n / 2,
    };
    (attention, n - attention)
}

/// The attention halves and the feed-forward halves of the span from
/// position `(from, from_cols)` to position `(to, to_cols)` of a model
/// whose attention halves have `kv_heads` kv heads and whose feed-forward
/// halves are `ffn` columns wide (see [`MeasuredStage`]): a half held in
/// part counts by its share of the columns, an attention half by the kv
/// heads held over `kv_heads`, a feed-forward half by the columns held
/// over `ffn`. With no columns (or a width of 0, which ignores the columns
/// of that kind of half) the counts of [`half_counts`].
pub fn span_counts(
    from: usize,
    from_cols: usize,
    to: usize,
    to_cols: usize,
    ffn: usize,
    kv_heads: usize,
) -> (f64, f64) {
    let (attention, feed_forward) = half_counts(from, to);
    // The part of half `half` its first `cols` columns are, as (attention,
    // feed-forward) halves.
    let share = |half: usize, cols: usize| {
        let s = match half_width(half, ffn, kv_heads) {
            0 => 0.0,
            w => cols as f64 / w as f64,
        };
        match half % 2 {
            0 => (s, 0.0),
            _ => (0.0, s),
        }
    };
    let (lost, held) = (share(from, from_cols), share(to, to_cols));
    (
        attention as f64 - lost.0 + held.0,
        feed_forward as f64 - lost.1 + held.1,
    )
}

/// The columns half `h` is cut by: the `kv_heads` kv heads of an attention
/// half (even), the `ffn` columns of a feed-forward half (odd).
fn half_width(h: usize, ffn: usize, kv_heads: usize) -> usize {
    match h % 2 {
        0 => kv_heads,
        _ => ffn,
    }
}

/// A pipeline with its micro-batch size and count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeasuredPipeline {
    /// Stages in order.
    pub stages: Vec<MeasuredStage>,
    /// Sequences per micro-batch.
    pub micro_batch: usize,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// Sequences per step: `micro_batches` of `micro_batch`, or fewer when
    /// the last micro-batch is smaller (a replica of
    /// [`replicas_by_sequence`] dealt a number of sequences its size does
    /// not divide).
    pub sequences: usize,
}

/// The search's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredPlan {
    /// Replicas (one for a pipeline plan).
    pub pipelines: Vec<MeasuredPipeline>,
    /// Predicted step time, seconds.
    pub step_seconds: f64,
    /// The step it expects when each kind's costs may be off by the
    /// model's `profile_error` ([`crate::uncertainty`]): what the search
    /// minimized (`step_seconds` without an error).
    pub expected_step_seconds: f64,
    /// Each device's best step time alone (the whole model), seconds.
    pub alone_step_seconds: Vec<f64>,
    /// Step throughput over the sum of the alone throughputs.
    pub speedup_ratio: f64,
    /// Layouts evaluated.
    pub candidates: u64,
    /// When the optimizer step is sharded over the replicas: each
    /// pipeline's weight (its device's optimizer speed, 1 / seconds per
    /// parameter); see [`sharded_optimizer`].
    pub optimizer_weights: Option<Vec<f64>>,
}

/// Bytes per master weight gathered after a sharded optimizer step (f32).
const MASTER_BYTES: f64 = 4.0;

/// The optimizer step of `params` parameters sharded over devices whose
/// step costs `per_param` seconds per parameter, each taking a share in
/// proportion to its speed so that all finish together, then the gather
/// of the updated weights over `link_bandwidth` (each share broadcast by
/// its owner: the whole model's f32 weights cross the links once).
/// Returns the seconds and each device's weight (1 / its cost).
pub fn sharded_optimizer(per_param: &[f64], params: u64, link_bandwidth: f64) -> (f64, Vec<f64>) {
    // A device whose step was measured as free still gets a finite weight.
    let weights: Vec<f64> = per_param.iter().map(|&o| 1.0 / o.max(1e-15)).collect();
    let speed: f64 = weights.iter().sum();
    let p = params as f64;
    (p / speed + p * MASTER_BYTES / link_bandwidth, weights)
}

/// Forward and backward seconds of one micro-batch through `attention`
/// attention halves and `feed_forward` feed-forward halves of blocks (a
/// block is one of each) on a device of costs `d`, with the embedding and
/// the head when the stage holds them: the measured price of a stage, for
/// this search and for the cluster planner's measured chip types alike
/// ([`crate::profile`]). A half held in part, a feed-forward half cut by
/// its width or an attention half by its kv heads, counts by its share of
/// the columns ([`span_counts`]): its cost is taken as linear in the
/// columns, the half's norm (which the stage before the cut computes and
/// sends on) being negligible against its matrix products and its
/// attention. Every stage adds the device's fixed cost per stage
/// ([`MeasuredDevice::stage_forward`]).
pub fn stage_passes(
    d: &MeasuredDevice,
    attention: f64,
    feed_forward: f64,
    embed: bool,
    head: bool,
) -> (f64, f64) {
    let (a, f_) = (attention, feed_forward);
    let (mut f, mut b) = (
        d.stage_forward + a * d.attention_forward + f_ * (d.block_forward - d.attention_forward),
        d.stage_backward
            + a * d.attention_backward
            + f_ * (d.block_backward - d.attention_backward),
    );
    if embed {
        f += d.embed_forward;
        b += d.embed_backward;
    }
    if head {
        f += d.head_forward;
        b += d.head_backward;
    }
    (f, b)
}

/// The parameters of each unit of a stage holding `span` (half blocks,
/// the embedding or the head), in model order: the units its gradient
/// reduction is bucketed by ([`overlap::reduction_buckets`]). A half held
/// in part holds its share of the columns' weights (of its kv heads' for
/// an attention half).
fn unit_params(model: &MeasuredModel, span: &Span) -> Vec<u64> {
    let (from, to) = (span.from, span.to);
    let width = |h: usize| half_width(h, model.ffn, model.kv_heads);
    let params = |h: usize| match h % 2 {
        0 => model.attention_params,
        _ => model.block_params - model.attention_params,
    };
    // The parameters of the columns of half `h` held, of `width(h)`.
    let held = |h: usize| {
        let lo = if h == from { span.from_cols } else { 0 };
        let hi = if h == to { span.to_cols } else { width(h) };
        (params(h) as f64 * hi.saturating_sub(lo) as f64 / width(h) as f64).round() as u64
    };
    let partial = width(to) > 0 && span.to_cols > 0;
    let mut units = Vec::with_capacity(to.saturating_sub(from) + 3);
    if span.embed {
        units.push(model.embed_params);
    }
    units.extend(
        (from..to).map(|h| match width(h) > 0 && h == from && span.from_cols > 0 {
            true => held(h),
            false => params(h),
        }),
    );
    if partial {
        units.push(held(to));
    }
    if span.head {
        units.push(model.head_params);
    }
    units
}

/// What stage `i` of a pipeline of `k` running `m` micro-batches under
/// `schedule` pays on its forward and backward passes for the other
/// micro-batches it holds in flight ([`MeasuredDevice::held`]): 1 for a
/// stage that runs each micro-batch's backward pass right after its
/// forward, as a device alone and the profile do.
fn held_factors(
    d: &MeasuredDevice,
    schedule: PipelineSchedule,
    i: usize,
    k: usize,
    m: usize,
) -> (f64, f64) {
    // Any run-ahead holds more than one where the schedule's own lead
    // does. Deferred weights hold one more on the last stage only at the
    // step's end: its passes run as 1F1B's.
    let schedule = match schedule {
        PipelineSchedule::OneFOneBDeferred => PipelineSchedule::OneFOneB,
        s => s,
    };
    match schedule.in_flight(i, k, m, 1) > 1 {
        true => d.held(),
        false => (1.0, 1.0),
    }
}

/// Forward and backward seconds of one micro-batch through stage `s`, the
/// `i`th of a pipeline of `k` running `m` micro-batches, on a device of
/// costs `d`, as the search prices it: its parts' costs
/// ([`stage_passes`]), the backward pass run whole unless the stage splits
/// it (a zero-bubble stage that sends a gradient), and both slower by the
/// device's measured cost of holding other micro-batches in flight where
/// the schedule has the stage hold them ([`MeasuredDevice::held`]; every
/// 1F1B stage but the last): a stage before the last runs the next
/// forward pass before the last one's backward, and reads that one's
/// activations back after the caches have moved on.
pub fn stage_pass_times(
    d: &MeasuredDevice,
    model: &MeasuredModel,
    s: &MeasuredStage,
    i: usize,
    k: usize,
    m: usize,
) -> (f64, f64) {
    let span = Span::of(s, i, k);
    let (attention, ffn) = span.counts(model.ffn, model.kv_heads);
    let (f, b) = stage_passes(d, attention, ffn, span.embed, span.head);
    let (ff, fb) = schedule_factors(d, model.schedule, i, k, m);
    (f * ff, b * fb)
}

/// What stage `i` of a pipeline of `k` running `m` micro-batches under
/// `schedule` pays on a device of costs `d` over its parts' measured
/// passes, forward and backward: the backward pass run whole unless the
/// stage splits every pass ([`MeasuredDevice::fused_backward`];
/// [`PipelineSchedule::splits`]: a zero-bubble stage that sends a
/// gradient, or one deferring weights whose every pass is among its last
/// two), and both passes slower where
/// the stage holds other micro-batches in flight ([`held_factors`]). The
/// measured search ([`stage_pass_times`]) and the cluster planner's
/// measured chip types (`profile::apply_measured`) both price a stage so.
pub fn schedule_factors(
    d: &MeasuredDevice,
    schedule: PipelineSchedule,
    i: usize,
    k: usize,
    m: usize,
) -> (f64, f64) {
    let fused = match schedule.splits(i, 0, m.max(1)) {
        true => 1.0,
        false => d.fused_backward(),
    };
    let held = held_factors(d, schedule, i, k, m);
    (held.0, fused * held.1)
}

/// The simulated step of one pipeline of `m` micro-batches whose every
/// stage then all-reduces the gradients of `reduced_params` parameters,
/// overlapped with its last backward pass when the model says so (the
/// stage's own parameters then give the buckets). A cut inside a half
/// (a stage before it with `to_cols` not 0, whether the half is an
/// attention or a feed-forward one) carries two activations each way.
fn pipeline_time(
    devs: &[MeasuredDevice],
    model: &MeasuredModel,
    stages: &[MeasuredStage],
    m: usize,
    reduced_params: u64,
) -> f64 {
    pipeline_time_ahead(devs, model, stages, m, reduced_params, 1)
}

/// The simulated step of one pipeline of `stages` (on `devs`, priced as
/// the search prices them) running `m` micro-batches with each stage
/// running `ahead` times the schedule's lead ahead of the next
/// ([`crate::schedule::Schedule::run_ahead`]); no data-parallel
/// reduction. With fixed pass times running ahead never lengthened a
/// two-stage step in the simulator and sometimes shortened it, and
/// lengthened some of three stages or more by up to 15% (a stage running
/// ahead delays a backward pass its neighbour waits for): `polychip train
/// --plan auto` runs ahead only as far as this step stays no longer.
pub fn pipeline_step(
    devs: &[MeasuredDevice],
    model: &MeasuredModel,
    stages: &[MeasuredStage],
    m: usize,
    ahead: usize,
) -> f64 {
    pipeline_time_ahead(devs, model, stages, m, 0, ahead)
}

/// [`pipeline_time`] with each stage running `ahead` times the
/// schedule's lead ahead.
fn pipeline_time_ahead(
    devs: &[MeasuredDevice],
    model: &MeasuredModel,
    stages: &[MeasuredStage],
    m: usize,
    reduced_params: u64,
    ahead: usize,
) -> f64 {
    let p = stages.len();
    let send = model.activation_bytes as f64 / model.link_bandwidth;
    let timings: Vec<StageTiming> = stages
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let d = &devs[s.device];
            let span = Span::of(s, i, p);
            let (embed, head) = (span.embed, span.head);
            let (attention, ffn) = span.counts(model.ffn, model.kv_heads);
            let (f, b) = stage_pass_times(d, model, s, i, p, m);
            let mut params = attention * model.attention_params as f64
                + ffn * (model.block_params - model.attention_params) as f64;
            if embed {
                params += model.embed_params as f64;
            }
            if head {
                params += model.head_params as f64;
            }
            let block_share = |params: u64| params as f64 / model.block_params.max(1) as f64;
            let mut weight_grad = d.block_weight_grad
                * (attention * block_share(model.attention_params)
                    + ffn * block_share(model.block_params - model.attention_params));
            if head {
                weight_grad += d.head_weight_grad;
            }
            weight_grad *= held_factors(d, model.schedule, i, p, m).1;
            let reduced = reduced_params as f64 * model.grad_bytes as f64;
            let mut dp_allreduce = 2.0 * reduced / model.link_bandwidth;
            if model.overlap_reduction && reduced_params > 0 {
                let bytes: Vec<u64> = unit_params(model, &span)
                    .into_iter()
                    .map(|u| u * model.grad_bytes)
                    .collect();
                let window = overlap::overlap_window(model.schedule, i, b, weight_grad);
                dp_allreduce = overlap::exposed_reduction_of_units(dp_allreduce, window, &bytes);
            }
            StageTiming {
                name: d.name.clone(),
                forward: f,
                backward: b,
                send_next: match (i + 1 < p, s.to_cols > 0) {
                    (false, _) => 0.0,
                    (true, false) => send,
                    (true, true) => 2.0 * send,
                },
                dp_allreduce,
                optimizer: params * d.optimizer_per_param,
                sends_async: model.async_sends,
                weight_grad: weight_grad.min(b),
            }
        })
        .collect();
    simulated_step(timings, m, model.schedule, ahead)
}

/// The most micro-batches [`simulated_step`] simulates one by one (at
/// least [`STEADY_PER_STAGE`] per stage); a longer step is extrapolated.
const SIMULATED_MICRO_BATCHES: usize = 256;

/// Micro-batches per stage after which a pipeline's step grows by the
/// same time with each micro-batch more (fill and drain are behind it).
const STEADY_PER_STAGE: usize = 8;

/// The simulated step of `stages` running `m` micro-batches. Once a
/// pipeline is steady its step is affine in `m` (fill, drain, reduction
/// and optimizer step fixed, each micro-batch more one period of its
/// slowest stage or link), so a long step is simulated at `k`, `2k` and
/// `4k` micro-batches (`k` [`SIMULATED_MICRO_BATCHES`], or
/// `STEADY_PER_STAGE` per stage) and extended along the line of the last
/// two once the two slopes agree; one whose queues still build up is
/// simulated further in, up to `m`, and one whose links may carry less
/// than its slowest stage computes is simulated whole. The error is a
/// part of one period of the schedule's repeating pattern per `k`
/// micro-batches extended (a relative 1e-5 in the tests). A global batch
/// of 65,536 sequences in micro-batches of 4 then simulates about 1,800
/// micro-batches, not 16,384, for each of the deals the search prices
/// (the planning took minutes).
fn simulated_step(
    stages: Vec<StageTiming>,
    m: usize,
    pipeline: PipelineSchedule,
    ahead: usize,
) -> f64 {
    let p = stages.len().max(1);
    let cap = SIMULATED_MICRO_BATCHES.max(STEADY_PER_STAGE * p);
    let mut schedule = Schedule {
        stages,
        microbatches: m,
        pipeline,
        virtual_stages: 1,
        run_ahead: ahead.max(1),
    };
    // A link that may carry less than the slowest stage computes (its
    // sends both ways against that stage's passes) can build queues whose
    // effect shows late: such a step is simulated whole.
    let slowest = schedule
        .stages
        .iter()
        .map(|s| s.forward + s.backward)
        .fold(0.0, f64::max);
    if schedule.stages.iter().any(|s| 2.0 * s.send_next >= slowest) {
        return sim::step(&schedule).step_time;
    }
    let mut at = |k: usize| {
        schedule.microbatches = k;
        sim::step(&schedule).step_time
    };
    // The mean time a micro-batch adds from `k` to twice `k`, and from
    // there to four times: equal but for the schedule's repeating pattern
    // (a part of one period over `k` micro-batches) once the pipeline is
    // steady. One whose queues still build up is simulated further in, up
    // to `m` itself.
    let mut k = cap;
    let mut t1 = None;
    while 4 * k < m {
        let t1v = t1.unwrap_or_else(|| at(k));
        let (t2, t4) = (at(2 * k), at(4 * k));
        let (near, far) = ((t2 - t1v) / k as f64, (t4 - t2) / (2 * k) as f64);
        if (near - far).abs() <= STEADY_SLOPE_TOLERANCE * far.abs() {
            return t4 + far * (m - 4 * k) as f64;
        }
        // The next window starts where this one ended.
        k *= 4;
        t1 = Some(t4);
    }
    at(m)
}

/// How close (relatively) the two slopes of [`simulated_step`] must be
/// for the pipeline to count as steady.
const STEADY_SLOPE_TOLERANCE: f64 = 1e-3;

/// The stages of a pipeline over the devices `order`, stage `i` ending at
/// half block `split[i]` (and starting where the one before ended).
fn pipeline_stages(order: &[usize], split: &[usize]) -> Vec<MeasuredStage> {
    order
        .iter()
        .enumerate()
        .map(|(i, &d)| MeasuredStage {
            device: d,
            from: if i == 0 { 0 } else { split[i - 1] },
            to: split[i],
            from_cols: 0,
            to_cols: 0,
        })
        .collect()
}

/// The step a pipeline of nominal step `nominal` ([`pipeline_time`])
/// expects under sigma `points` ([`crate::uncertainty`]): simulated again
/// with each point's factors on the devices' costs.
fn expected_pipeline_time(
    devs: &[MeasuredDevice],
    model: &MeasuredModel,
    stages: &[MeasuredStage],
    points: &SigmaPoints,
    nominal: f64,
) -> f64 {
    points.expected(nominal, |f| {
        let scaled: Vec<MeasuredDevice> = devs.iter().zip(f).map(|(d, &f)| d.scaled(f)).collect();
        pipeline_time(&scaled, model, stages, model.micro_batches, 0)
    })
}

/// The grain of the cuts inside a half: its width (feed-forward columns
/// or kv heads) over this many, or one column.
const COLUMN_STEPS: usize = 64;

/// The most sweeps over a pipeline's cuts [`refine`] makes.
const REFINE_SWEEPS: usize = 2;

/// The positions a cut first at half `h` may move to in a model of
/// `halves` half blocks whose feed-forward halves are `ffn` columns wide
/// and whose attention halves have `kv_heads` kv heads, as `(half,
/// columns)` (see [`MeasuredStage`]), in model order: between the halves
/// two either side of `h`, and inside the halves among them at every
/// grain of their columns, a width over [`COLUMN_STEPS`] or one column
/// (every kv head of an attention half of fewer than 128).
fn cut_positions(h: usize, halves: usize, ffn: usize, kv_heads: usize) -> Vec<(usize, usize)> {
    let (lo, hi) = (h.saturating_sub(2), (h + 2).min(halves));
    let mut out = Vec::new();
    for x in lo..=hi {
        out.push((x, 0));
        let width = half_width(x, ffn, kv_heads);
        if x < hi && width > 0 {
            let grain = (width / COLUMN_STEPS).max(1);
            out.extend((grain..width).step_by(grain).map(|c| (x, c)));
        }
    }
    out
}

/// A pipeline priced at half a block's grain (nominal step `nominal`,
/// expected step `expected` under sigma `points`), its cuts then moved by
/// coordinate descent, one at a time, to the position nearby
/// ([`cut_positions`]: inside a feed-forward half by its width, inside an
/// attention half by its kv heads, or between halves) that expects the
/// least step with the others where they are,
/// while one moves (at most [`REFINE_SWEEPS`] sweeps). A cut stays unless
/// a position beats it by a relative 1e-9; every stage keeps a part of the
/// model (or the first the embedding alone, the last the head alone, as
/// [`splits`] allows) and must fit its device (`fits`, as in [`search`]).
/// Returns the expected step, the nominal step, the stages and the number
/// of layouts priced.
fn refine(
    devs: &[MeasuredDevice],
    model: &MeasuredModel,
    points: &SigmaPoints,
    fits: &dyn Fn(usize, Span, usize) -> bool,
    stages: Vec<MeasuredStage>,
    nominal: f64,
    expected: f64,
) -> (f64, f64, Vec<MeasuredStage>, u64) {
    let (k, m, halves, ffn, kv_heads) = (
        stages.len(),
        model.micro_batches,
        2 * model.layers,
        model.ffn,
        model.kv_heads,
    );
    let mut best = (expected, nominal, stages);
    if (ffn == 0 && kv_heads == 0) || k < 2 {
        return (best.0, best.1, best.2, 0);
    }
    let origins: Vec<usize> = best.2[..k - 1].iter().map(|s| s.to).collect();
    let mut priced = 0u64;
    let mut last_moved = None;
    for i in (0..k - 1).cycle().take(REFINE_SWEEPS * (k - 1)) {
        // Every other cut has been tried since this one moved.
        if last_moved == Some(i) {
            break;
        }
        let st = &best.2;
        let lower = (st[i].from, st[i].from_cols);
        let upper = (st[i + 1].to, st[i + 1].to_cols);
        let current = (st[i].to, st[i].to_cols);
        let mut trials: Vec<(f64, Vec<MeasuredStage>)> = Vec::new();
        for at in cut_positions(origins[i], halves, ffn, kv_heads) {
            let before = lower < at || (i == 0 && at == lower);
            let after = at < upper || (i + 2 == k && at == upper);
            if at == current || !before || !after {
                continue;
            }
            let mut trial = st.clone();
            (trial[i].to, trial[i].to_cols) = at;
            (trial[i + 1].from, trial[i + 1].from_cols) = at;
            let ok = [i, i + 1].into_iter().all(|j| {
                let in_flight = model.schedule.in_flight(j, k, m, 1);
                fits(trial[j].device, Span::of(&trial[j], j, k), in_flight)
            });
            if ok {
                priced += 1;
                trials.push((pipeline_time(devs, model, &trial, m, 0), trial));
            }
        }
        // A layout expects at least its nominal step: the expected steps
        // of the lowest nominal ones, until no other can expect less.
        trials.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut found: Option<(f64, f64, Vec<MeasuredStage>)> = None;
        for (t, trial) in trials {
            let bound = found.as_ref().map_or(best.0, |f| f.0.min(best.0));
            if t >= bound {
                break;
            }
            let e = expected_pipeline_time(devs, model, &trial, points, t);
            if e < bound {
                found = Some((e, t, trial));
            }
        }
        if let Some(f) = found.filter(|f| f.0 < best.0 * (1.0 - 1e-9)) {
            best = f;
            last_moved = Some(i);
        }
    }
    (best.0, best.1, best.2, priced)
}

/// Every split of `layers` units (half blocks) into `k` contiguous ranges
/// (each stage's end, the last `layers`). Every stage holds a unit but the
/// first and the last of several: the first may hold the embedding alone
/// (0..0), the last the head alone (`layers..layers`), the finest ends a
/// slow chip can take.
fn splits(layers: usize, k: usize, out: &mut Vec<Vec<usize>>, cur: &mut Vec<usize>) {
    let i = cur.len();
    let start = cur.last().copied().unwrap_or(0);
    if i + 1 == k {
        if start < layers || (i > 0 && start == layers && layers > 0) {
            let mut full = cur.clone();
            full.push(layers);
            out.push(full);
        }
        return;
    }
    let min = if i == 0 { start } else { start + 1 };
    for end in min..=layers {
        cur.push(end);
        splits(layers, k, out, cur);
        cur.pop();
    }
}

/// Ordered selections of `k` of `n` devices.
fn orders(n: usize, k: usize, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
    if cur.len() == k {
        out.push(cur.clone());
        return;
    }
    for d in 0..n {
        if !cur.contains(&d) {
            cur.push(d);
            orders(n, k, cur, out);
            cur.pop();
        }
    }
}

/// Searches the layouts of `which` over `devs`; `fits(device, span,
/// in_flight)` says whether a stage fits its device's memory. `None` when
/// nothing fits. Pipelines are priced at half a block's grain; those whose
/// nominal step leaves them a chance ([`SigmaPoints::window`]) are then
/// refined with cuts inside the halves when the model gives their width:
/// inside the feed-forward halves by their columns ([`MeasuredModel::ffn`]),
/// inside the attention halves by their kv heads
/// ([`MeasuredModel::kv_heads`]), each cut moved in turn to the nearby
/// position that expects the least step.
pub fn search(
    devs: &[MeasuredDevice],
    model: &MeasuredModel,
    which: Layouts,
    fits: &dyn Fn(usize, Span, usize) -> bool,
) -> Option<MeasuredPlan> {
    let (n, m, layers) = (devs.len(), model.micro_batches, model.layers);
    let halves = 2 * layers;
    let whole = |d: usize| MeasuredStage {
        device: d,
        from: 0,
        to: halves,
        from_cols: 0,
        to_cols: 0,
    };
    let mut candidates = 0u64;
    let alone: Vec<f64> = (0..n)
        .map(|d| match fits(d, Span::whole(layers), 1) {
            true => pipeline_time(devs, model, &[whole(d)], m, 0),
            false => f64::INFINITY,
        })
        .collect();
    let points = SigmaPoints::new(devs.iter().map(|d| d.name.as_str()), model.profile_error);
    // (expected, nominal, pipelines) of the best so far.
    let mut best: Option<(f64, f64, Vec<MeasuredPipeline>)> = None;
    let mut weights = None;
    let mut consider = |e: f64, t: f64, p: Vec<MeasuredPipeline>| {
        if best.as_ref().is_none_or(|(be, ..)| e < *be) {
            best = Some((e, t, p));
        }
    };
    if which != Layouts::Replicas {
        // Every pipeline's nominal step, then the expected step of those
        // that may expect less than the nominal best.
        let mut pipes: Vec<(f64, Vec<MeasuredStage>)> = Vec::new();
        for k in [n].into_iter().filter(|&k| k <= halves + 2) {
            let mut os = Vec::new();
            orders(n, k, &mut Vec::new(), &mut os);
            let mut ss = Vec::new();
            splits(halves, k, &mut ss, &mut Vec::new());
            for order in &os {
                for split in &ss {
                    candidates += 1;
                    let stages = pipeline_stages(order, split);
                    let ok = stages.iter().enumerate().all(|(i, s)| {
                        let in_flight = model.schedule.in_flight(i, k, m, 1);
                        fits(s.device, Span::of(s, i, k), in_flight)
                    });
                    if !ok {
                        continue;
                    }
                    pipes.push((pipeline_time(devs, model, &stages, m, 0), stages));
                }
            }
        }
        let nominal_best = pipes.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
        let window = points.window(nominal_best);
        for (t, stages) in pipes.into_iter().filter(|p| p.0 <= window) {
            let e = expected_pipeline_time(devs, model, &stages, &points, t);
            let (e, t, stages, priced) = refine(devs, model, &points, fits, stages, t, e);
            candidates += priced;
            let pipeline = MeasuredPipeline {
                stages,
                micro_batch: model.micro_batch,
                micro_batches: m,
                sequences: m * model.micro_batch,
            };
            consider(e, t, vec![pipeline]);
        }
    }
    if which != Layouts::Pipelines && n >= 2 && m >= n {
        // Deal the micro-batches: each to the replica that would finish it
        // soonest; every replica gets at least one.
        let sized = [SizedCosts {
            devices: devs.to_vec(),
            model: *model,
        }];
        let whole_fits = |d: usize, _: usize| fits(d, Span::whole(layers), 1);
        if let Some(r) = replicas_by_sequence(&sized, m * model.micro_batch, &whole_fits) {
            candidates += 1;
            weights = r.optimizer_weights;
            consider(r.expected_step_seconds, r.step_seconds, r.pipelines);
        }
    }
    let (expected, step, pipelines) = best?;
    let optimizer_weights = match pipelines.len() > 1 {
        true => weights,
        false => None,
    };
    let sum: f64 = alone
        .iter()
        .filter(|t| t.is_finite())
        .map(|t| 1.0 / t)
        .sum();
    Some(MeasuredPlan {
        pipelines,
        step_seconds: step,
        expected_step_seconds: expected,
        alone_step_seconds: alone,
        speedup_ratio: if sum > 0.0 { (1.0 / step) / sum } else { 0.0 },
        candidates,
        optimizer_weights,
    })
}

/// One micro-batch size's costs: every device's (in one order) and the
/// model at that size.
#[derive(Debug, Clone, PartialEq)]
pub struct SizedCosts {
    /// The devices' costs at this size.
    pub devices: Vec<MeasuredDevice>,
    /// The model at this size (its `micro_batch`).
    pub model: MeasuredModel,
}

/// The best data-parallel layout [`replicas_by_sequence`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct Replicas {
    /// Predicted step, seconds.
    pub step_seconds: f64,
    /// The step it expects under the model's `profile_error` (what the
    /// deal minimized; see [`crate::uncertainty`]).
    pub expected_step_seconds: f64,
    /// One whole-model replica per device, in order.
    pub pipelines: Vec<MeasuredPipeline>,
    /// Each replica's weight when the optimizer step is sharded (see
    /// [`sharded_optimizer`]), `None` when every replica steps every
    /// parameter.
    pub optimizer_weights: Option<Vec<f64>>,
}

/// Data parallelism with each device a whole replica at a micro-batch size
/// of its own, the step's `global_batch` sequences dealt in units of each
/// replica's micro-batch (so a slow chip can take a single sequence while
/// a fast one takes micro-batches of four): for every choice of a size per
/// device, units go one at a time to the replica that would finish soonest
/// with it (every replica gets one), and the fastest choice whose units add
/// up to the global batch exactly wins. Each choice is priced twice: with
/// every replica stepping the optimizer over all the parameters after the
/// reduction (the slowest replica's step exposed), and with the step
/// sharded by optimizer speed ([`sharded_optimizer`]), when the deal then
/// balances the passes alone. `fits(device, size)` says whether the whole
/// model fits the device with one micro-batch of `size` in flight. `None`
/// when no choice deals the batch exactly.
pub fn replicas_by_sequence(
    sizes: &[SizedCosts],
    global_batch: usize,
    fits: &dyn Fn(usize, usize) -> bool,
) -> Option<Replicas> {
    let n = sizes.first()?.devices.len();
    if n < 2 || sizes.iter().any(|s| s.devices.len() != n) {
        return None;
    }
    let m0 = &sizes[0].model;
    let all_params = m0.embed_params + m0.layers as u64 * m0.block_params + m0.head_params;
    let per_param: Vec<f64> = sizes[0]
        .devices
        .iter()
        .map(|d| d.optimizer_per_param)
        .collect();
    let (sharded_step, weights) = sharded_optimizer(&per_param, all_params, m0.link_bandwidth);
    let points = SigmaPoints::new(
        sizes[0].devices.iter().map(|d| d.name.as_str()),
        m0.profile_error,
    );
    let dealt = |with_optimizer| {
        deal(
            sizes,
            global_batch,
            fits,
            all_params,
            with_optimizer,
            &points,
        )
    };
    let unsharded = dealt(true).map(|(e, t, p)| Replicas {
        step_seconds: t,
        expected_step_seconds: e,
        pipelines: p,
        optimizer_weights: None,
    });
    let sharded = match m0.shard_optimizer {
        true => dealt(false),
        false => None,
    };
    let sharded = sharded.map(|(e, t, p)| Replicas {
        step_seconds: t + sharded_step,
        expected_step_seconds: e + sharded_step,
        pipelines: p,
        optimizer_weights: Some(weights),
    });
    match (unsharded, sharded) {
        (Some(u), Some(s)) if s.expected_step_seconds < u.expected_step_seconds => Some(s),
        (Some(u), _) => Some(u),
        (None, s) => s,
    }
}

/// Forward and backward seconds of one micro-batch of `r` sequences
/// through the whole model on device `d`: measured where `sizes` holds
/// that micro-batch size, else interpolated linearly between the nearest
/// sizes measured below and above it (in proportion to the nearest one
/// past the ends).
fn whole_model_passes(sizes: &[SizedCosts], d: usize, r: usize) -> f64 {
    let layers = sizes[0].model.layers;
    let at = |s: &SizedCosts| {
        let dev = &s.devices[d];
        let (f, b) = stage_passes(dev, layers as f64, layers as f64, true, true);
        // A replica runs its backward pass whole.
        let b = b * dev.fused_backward();
        (s.model.micro_batch as f64, f + b)
    };
    let r = r as f64;
    let below = sizes
        .iter()
        .map(at)
        .filter(|&(b, _)| b <= r)
        .max_by(|x, y| x.0.total_cmp(&y.0));
    let above = sizes
        .iter()
        .map(at)
        .filter(|&(b, _)| b >= r)
        .min_by(|x, y| x.0.total_cmp(&y.0));
    match (below, above) {
        (Some((b0, t0)), Some((b1, t1))) if b1 > b0 => t0 + (t1 - t0) * (r - b0) / (b1 - b0),
        (Some((b0, t0)), _) => t0 * r / b0,
        (None, Some((b1, t1))) => t1 * r / b1,
        (None, None) => f64::INFINITY,
    }
}

/// The most moves [`deal`] makes per replica after its greedy deal.
const MOVES_PER_REPLICA: usize = 16;

/// [`replicas_by_sequence`]'s deal, each replica's step with its own
/// optimizer step over `params` parameters or (`with_optimizer` false)
/// without one. For every choice of a micro-batch size per device, every
/// replica starts with one micro-batch; then the replica that would finish
/// soonest with more takes sequences up to its next whole micro-batch (or
/// what is left of the batch), so a replica's last micro-batch may be
/// smaller than its others. Sequences then move from replica to replica
/// (one, or a replica's last micro-batch, at a time; at most
/// [`MOVES_PER_REPLICA`] moves per replica) while that lowers the
/// step the deal expects under sigma `points` (without points, its nominal
/// step, which the greedy deal in whole micro-batches does not always
/// minimize): a deal that balances the replicas exactly is the most
/// exposed to an error in either's costs, and one with slack on the slow
/// chip may expect less (a replica's step under a factor is taken as its
/// step times the factor; its share of the gradient reduction, about 1%
/// here, does not scale). Returns the
/// expected step (the nominal one without points), the nominal step and
/// the replicas of the choice expecting the least.
fn deal(
    sizes: &[SizedCosts],
    global_batch: usize,
    fits: &dyn Fn(usize, usize) -> bool,
    params: u64,
    with_optimizer: bool,
    points: &SigmaPoints,
) -> Option<(f64, f64, Vec<MeasuredPipeline>)> {
    let n = sizes[0].devices.len();
    let layers = sizes[0].model.layers;
    let whole = |d: usize| MeasuredStage {
        device: d,
        from: 0,
        to: 2 * layers,
        from_cols: 0,
        to_cols: 0,
    };
    let devices: Vec<Vec<MeasuredDevice>> = sizes
        .iter()
        .map(|s| {
            let mut ds = s.devices.clone();
            if !with_optimizer {
                ds.iter_mut().for_each(|d| d.optimizer_per_param = 0.0);
            }
            ds
        })
        .collect();
    // Each (device, size, micro-batches) simulated once, and each (device,
    // smaller last micro-batch) priced once: the deals of every choice of
    // sizes ask for the same ones again and again.
    let memo = std::cell::RefCell::new(std::collections::HashMap::new());
    let last = std::cell::RefCell::new(std::collections::HashMap::new());
    let time = |d: usize, k: usize, seqs: usize| {
        let b = sizes[k].model.micro_batch;
        let (full, rest) = (seqs / b, seqs % b);
        let whole_ones = *memo.borrow_mut().entry((d, k, full)).or_insert_with(|| {
            pipeline_time(&devices[k], &sizes[k].model, &[whole(d)], full, params)
        });
        let smaller = match rest {
            0 => 0.0,
            r => *last
                .borrow_mut()
                .entry((d, r))
                .or_insert_with(|| whole_model_passes(sizes, d, r)),
        };
        whole_ones + smaller
    };
    let mut best: Option<(f64, f64, Vec<MeasuredPipeline>)> = None;
    let max = |ts: &[f64]| ts.iter().copied().fold(0.0, f64::max);
    let expected = |ts: &[f64]| {
        points.expected(max(ts), |f| {
            ts.iter().zip(f).map(|(t, f)| t * f).fold(0.0, f64::max)
        })
    };
    // Every choice of a size index per device (sizes^n: a few dozen).
    let mut choice = vec![0usize; n];
    'choices: loop {
        let ok = (0..n).all(|d| fits(d, sizes[choice[d]].model.micro_batch));
        let unit = |d: usize| sizes[choice[d]].model.micro_batch;
        let mut seqs: Vec<usize> = (0..n).map(unit).collect();
        let mut total: usize = seqs.iter().sum();
        if ok && total <= global_batch {
            while total < global_batch {
                let more = |d: usize| (unit(d) - seqs[d] % unit(d)).min(global_batch - total);
                let d = (0..n)
                    .min_by(|&a, &b| {
                        time(a, choice[a], seqs[a] + more(a)).total_cmp(&time(
                            b,
                            choice[b],
                            seqs[b] + more(b),
                        ))
                    })
                    .expect("two or more replicas");
                let add = more(d);
                seqs[d] += add;
                total += add;
            }
            let mut times: Vec<f64> = (0..n).map(|d| time(d, choice[d], seqs[d])).collect();
            let mut e = expected(&times);
            // Moves while one lowers the expected step, at most
            // MOVES_PER_REPLICA per replica (each strictly lowers it, so
            // this ends anyway; the greedy deal leaves a few to make). A
            // move changes two replicas' times; the others are kept.
            let mut trial = times.clone();
            for _ in 0..MOVES_PER_REPLICA * n {
                // (expected, from, to, sequences, their two new times)
                let mut better: Option<(f64, usize, usize, usize, f64, f64)> = None;
                for r in 0..n {
                    let last = match seqs[r] % unit(r) {
                        0 => unit(r),
                        rest => rest,
                    };
                    for s in [1, last] {
                        if s >= seqs[r] {
                            continue;
                        }
                        let tr = time(r, choice[r], seqs[r] - s);
                        for q in (0..n).filter(|&q| q != r) {
                            let tq = time(q, choice[q], seqs[q] + s);
                            (trial[r], trial[q]) = (tr, tq);
                            let em = expected(&trial);
                            (trial[r], trial[q]) = (times[r], times[q]);
                            if em < e - 1e-12 && better.is_none_or(|b| em < b.0) {
                                better = Some((em, r, q, s, tr, tq));
                            }
                        }
                    }
                }
                let Some((em, r, q, s, tr, tq)) = better else {
                    break;
                };
                e = em;
                (seqs[r], seqs[q]) = (seqs[r] - s, seqs[q] + s);
                (times[r], times[q]) = (tr, tq);
                (trial[r], trial[q]) = (tr, tq);
            }
            let t = max(&times);
            if best.as_ref().is_none_or(|(be, ..)| e < *be) {
                let pipes = (0..n)
                    .map(|d| MeasuredPipeline {
                        stages: vec![whole(d)],
                        micro_batch: unit(d),
                        micro_batches: seqs[d].div_ceil(unit(d)),
                        sequences: seqs[d],
                    })
                    .collect();
                best = Some((e, t, pipes));
            }
        }
        // The next choice (odometer order).
        for c in choice.iter_mut() {
            *c += 1;
            if *c < sizes.len() {
                continue 'choices;
            }
            *c = 0;
        }
        break;
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_step_is_extrapolated_to_what_its_simulation_gives() {
        let stage = |f: f64, b: f64, send: f64, async_sends: bool| StageTiming {
            name: String::new(),
            forward: f,
            backward: b,
            send_next: send,
            dp_allreduce: 0.01,
            optimizer: 0.02,
            sends_async: async_sends,
            weight_grad: b / 3.0,
        };
        for pipeline in [PipelineSchedule::OneFOneB, PipelineSchedule::ZeroBubble] {
            for async_sends in [false, true] {
                for stages in [
                    vec![stage(1e-3, 2e-3, 0.0, async_sends)],
                    vec![
                        stage(1e-3, 2e-3, 3e-4, async_sends),
                        stage(4e-3, 7e-3, 0.0, async_sends),
                    ],
                    vec![
                        stage(1e-3, 2e-3, 2.5e-3, async_sends),
                        stage(4e-3, 7e-3, 2e-3, async_sends),
                        stage(5e-3, 3e-3, 0.0, async_sends),
                    ],
                    vec![
                        stage(2e-3, 2e-3, 5e-3, async_sends),
                        stage(1e-3, 3e-3, 1e-4, async_sends),
                        stage(3e-3, 1e-3, 0.0, async_sends),
                    ],
                ] {
                    let m = 5001;
                    for ahead in [1, 4] {
                        let full = sim::step(&Schedule {
                            stages: stages.clone(),
                            microbatches: m,
                            pipeline,
                            virtual_stages: 1,
                            run_ahead: ahead,
                        })
                        .step_time;
                        let fast = simulated_step(stages.clone(), m, pipeline, ahead);
                        assert!(
                            ((fast - full) / full).abs() < 1e-5,
                            "{pipeline:?} async {async_sends} ahead {ahead}: {fast} against {full}"
                        );
                    }
                }
            }
        }
    }

    /// Uniforms in [0, 1) from xorshift64 seeded with `seed`.
    fn uniform(mut state: u64) -> impl FnMut() -> f64 {
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// A stage of `device` from half `from` (after `from_cols` of its
    /// columns) to half `to` (after `to_cols`).
    fn stage(
        device: usize,
        from: usize,
        from_cols: usize,
        to: usize,
        to_cols: usize,
    ) -> MeasuredStage {
        MeasuredStage {
            device,
            from,
            to,
            from_cols,
            to_cols,
        }
    }

    /// Device 1 on `0..(h, c)`, device 0 on the rest of `halves` half
    /// blocks: a two-stage pipeline cut inside half `h`.
    fn slow_then_fast(h: usize, c: usize, halves: usize) -> [MeasuredStage; 2] {
        [stage(1, 0, 0, h, c), stage(0, h, c, halves, 0)]
    }

    fn dev(name: &str, block: f64, head: f64) -> MeasuredDevice {
        MeasuredDevice {
            name: name.into(),
            block_forward: block / 3.0,
            block_backward: 2.0 * block / 3.0,
            attention_forward: block / 6.0,
            attention_backward: block / 3.0,
            embed_forward: 0.0,
            embed_backward: 0.0,
            head_forward: head / 3.0,
            head_backward: 2.0 * head / 3.0,
            optimizer_per_param: 0.0,
            block_weight_grad: block / 3.0,
            head_weight_grad: head / 3.0,
            fused_backward_ratio: 0.0,
            held_forward_ratio: 0.0,
            held_backward_ratio: 0.0,
            stage_forward: 0.0,
            stage_backward: 0.0,
        }
    }

    fn model(layers: usize, m: usize) -> MeasuredModel {
        MeasuredModel {
            layers,
            block_params: 1000,
            attention_params: 500,
            ffn: 0,
            kv_heads: 0,
            embed_params: 100,
            head_params: 100,
            activation_bytes: 0,
            micro_batch: 1,
            micro_batches: m,
            grad_bytes: 4,
            link_bandwidth: 1e12,
            shard_optimizer: true,
            overlap_reduction: true,
            async_sends: true,
            schedule: PipelineSchedule::OneFOneB,
            profile_error: 0.0,
        }
    }

    #[test]
    fn the_overlapped_reduction_leaves_only_what_the_last_backward_pass_cannot_hide() {
        // 8 blocks of 1M parameters: 4 MB of gradients each, a bucket per
        // half block or so; the reduction takes 2 x 32 MB / 64 MB/s = 1 s,
        // the whole model's backward pass 8 x 2/3 s.
        let devs = [dev("a", 1.0, 0.0)];
        let mut m = model(8, 1);
        (m.block_params, m.attention_params) = (1 << 20, 1 << 19);
        m.link_bandwidth = 64.0 * (1 << 20) as f64;
        let whole = [MeasuredStage {
            device: 0,
            from: 0,
            to: 16,
            from_cols: 0,
            to_cols: 0,
        }];
        let params = 8 * (1 << 20) + 200;
        let overlapped = pipeline_time(&devs, &m, &whole, 1, params);
        m.overlap_reduction = false;
        let after = pipeline_time(&devs, &m, &whole, 1, params);
        let passes = 8.0;
        assert!((after - passes - 1.0).abs() < 1e-3, "{after}");
        // Reducing is faster than the pass: about the last half block's
        // bucket (2 MiB of 32, 1/16 s) is left, then the embedding's.
        let left = overlapped - passes;
        assert!(left > 0.0 && left < 0.1, "{left}");
        // Without a reduction nothing changes.
        assert_eq!(pipeline_time(&devs, &m, &whole, 1, 0), passes);
    }

    #[test]
    fn queued_sends_leave_the_stages_free_and_blocking_ones_do_not() {
        // Four stages of two blocks, m = 8; each activation takes half a
        // block's forward pass to travel (1 MB at 6 MB/s against 1/3 s).
        let devs = [dev("a", 1.0, 0.0)];
        let mut m = model(8, 8);
        (m.activation_bytes, m.link_bandwidth) = (1_000_000, 6e6);
        let stages: Vec<MeasuredStage> = (0..4)
            .map(|i| MeasuredStage {
                device: 0,
                from: 4 * i,
                to: 4 * i + 4,
                from_cols: 0,
                to_cols: 0,
            })
            .collect();
        let queued = pipeline_time(&devs, &m, &stages, 8, 0);
        m.async_sends = false;
        let blocking = pipeline_time(&devs, &m, &stages, 8, 0);
        // 11 slots of 2 s of compute, plus transfers: fewer of them exposed
        // when the stages do not wait for them.
        assert!(
            queued >= 22.0 && queued < blocking - 0.4,
            "{queued} / {blocking}"
        );
    }

    #[test]
    fn a_slow_chip_with_a_costly_head_takes_the_first_stage() {
        // Fast: 1 per block, 1 for the head; slow: 10 per block, 20 for the
        // head (more than the fast chip's whole stage: it cannot take the
        // head, even alone).
        let devs = [dev("fast", 1.0, 1.0), dev("slow", 10.0, 20.0)];
        let plan = search(&devs, &model(16, 32), Layouts::Pipelines, &|_, _, _| true).unwrap();
        let p = &plan.pipelines[0];
        assert_eq!(p.stages[0].device, 1, "{plan:?}");
        // A block and a half (halves 0..3): slow 15 per micro-batch, fast
        // 14.5 + 1. Whole blocks could only give it one (10 against the
        // fast stage's 16) or two (20).
        assert_eq!((p.stages[0].from, p.stages[0].to), (0, 3));
        let whole = pipeline_time(
            &devs,
            &model(16, 32),
            &[stage(1, 0, 0, 2, 0), stage(0, 2, 0, 32, 0)],
            32,
            0,
        );
        assert!(plan.step_seconds < whole, "{plan:?} against {whole}");
        // The pipeline beats the fast chip alone (17 per micro-batch).
        assert!(plan.step_seconds < plan.alone_step_seconds[0], "{plan:?}");
        assert!(plan.speedup_ratio > 0.95, "{plan:?}");
    }

    #[test]
    fn a_fixed_cost_per_stage_is_paid_once_by_each_stage_and_moves_the_balance() {
        // As above, but the slow chip pays 3 per micro-batch for any stage
        // (1 forward, 2 backward): a block and a half would cost it 18
        // against the fast stage's 15.5; one block 13 against 16.
        let mut slow = dev("slow", 10.0, 20.0);
        slow.stage_forward = 1.0;
        slow.stage_backward = 2.0;
        assert_eq!(stage_passes(&slow, 0.0, 0.0, false, false), (1.0, 2.0));
        let (f, b) = stage_passes(&slow, 2.0, 2.0, true, true);
        assert!((f + b - (3.0 + 20.0 + 20.0)).abs() < 1e-9, "{f} {b}");
        let (m, all) = (32, &|_, _, _| true);
        let devs = [dev("fast", 1.0, 1.0), slow];
        let plan = search(&devs, &model(16, m), Layouts::Pipelines, all).unwrap();
        let p = &plan.pipelines[0];
        assert_eq!(p.stages[0].device, 1, "{plan:?}");
        assert_eq!((p.stages[0].from, p.stages[0].to), (0, 2), "{plan:?}");
        // Alone, the whole model pays it once a micro-batch.
        let free = [dev("fast", 1.0, 1.0), dev("slow", 10.0, 20.0)];
        let without = search(&free, &model(16, m), Layouts::Pipelines, all).unwrap();
        let more = plan.alone_step_seconds[1] - without.alone_step_seconds[1];
        assert!((more - 3.0 * m as f64).abs() < 1e-6, "{more}");
        assert!(plan.step_seconds > without.step_seconds, "{plan:?}");
    }

    #[test]
    fn stages_holding_micro_batches_in_flight_pay_the_measured_cost_of_holding() {
        // Two chips alike but for what holding a second micro-batch costs
        // them: 10% forward and 20% backward on `holds-badly`, nothing on
        // `holds-well`.
        let mut bad = dev("holds-badly", 1.0, 1.0);
        (bad.held_forward_ratio, bad.held_backward_ratio) = (1.1, 1.2);
        assert_eq!(bad.held(), (1.1, 1.2));
        assert_eq!(dev("unmeasured", 1.0, 1.0).held(), (1.0, 1.0));
        let m = 32;
        let whole = |d: usize| [stage(d, 0, 0, 16, 0), stage(1 - d, 16, 0, 32, 0)];
        let devs = [bad.clone(), dev("holds-well", 1.0, 1.0)];
        let pass = |schedule, s: &[MeasuredStage; 2], i: usize, m: usize| {
            let model = MeasuredModel {
                schedule,
                ..model(16, m)
            };
            stage_pass_times(&devs[s[i].device], &model, &s[i], i, 2, m)
        };
        let plain = stage_passes(&bad, 8.0, 8.0, true, false);
        let first = pass(PipelineSchedule::OneFOneB, &whole(0), 0, m);
        assert!(
            (first.0 - 1.1 * plain.0).abs() < 1e-9,
            "{first:?} {plain:?}"
        );
        assert!(
            (first.1 - 1.2 * plain.1).abs() < 1e-9,
            "{first:?} {plain:?}"
        );
        // The last stage runs each backward right after its forward, as
        // does any stage of a single micro-batch; under GPipe it holds
        // them all.
        let last = stage_passes(&bad, 8.0, 8.0, false, true);
        assert_eq!(pass(PipelineSchedule::OneFOneB, &whole(1), 1, m), last);
        assert_eq!(pass(PipelineSchedule::OneFOneB, &whole(0), 0, 1), plain);
        let gpipe = pass(PipelineSchedule::GPipe, &whole(1), 1, m);
        assert!((gpipe.1 - 1.2 * last.1).abs() < 1e-9, "{gpipe:?}");
        // So the search puts the chip that holds well first, where the
        // profile alone could not tell the orders apart, and so pays
        // nothing for holding; the other order would.
        let all = &|_, _, _| true;
        let plan = search(&devs, &model(16, m), Layouts::Pipelines, all).unwrap();
        assert_eq!(plan.pipelines[0].stages[0].device, 1, "{plan:?}");
        let both_well = [dev("a", 1.0, 1.0), dev("b", 1.0, 1.0)];
        let unheld = search(&both_well, &model(16, m), Layouts::Pipelines, all).unwrap();
        assert!(
            (plan.step_seconds - unheld.step_seconds).abs() < 1e-9,
            "{plan:?}"
        );
        let stages = plan.pipelines[0].stages.clone();
        let swapped: Vec<MeasuredStage> = stages
            .iter()
            .map(|s| MeasuredStage {
                device: 1 - s.device,
                ..*s
            })
            .collect();
        let other = pipeline_time(&devs, &model(16, m), &swapped, m, 0);
        assert!(other > 1.05 * plan.step_seconds, "{other} {plan:?}");
    }

    #[test]
    fn a_slow_chip_may_take_an_end_of_the_model_alone() {
        // Slow: 40 per block (20 per half), so any half block on it
        // bounds the pipeline; its embedding costs 2 (fast: 1 per block and
        // for the embedding).
        let mut fast = dev("fast", 1.0, 1.0);
        let mut slow = dev("slow", 40.0, 60.0);
        fast.embed_forward = 0.5;
        fast.embed_backward = 0.5;
        slow.embed_forward = 1.0;
        slow.embed_backward = 1.0;
        let plan = search(
            &[fast, slow],
            &model(16, 32),
            Layouts::Pipelines,
            &|_, _, _| true,
        )
        .unwrap();
        let st = &plan.pipelines[0].stages;
        assert_eq!((st[0].device, st[0].from, st[0].to), (1, 0, 0), "{plan:?}");
        assert_eq!((st[1].from, st[1].to), (0, 32), "{plan:?}");
        // Beats the fast chip alone (18 per micro-batch against 17 + 1).
        assert!(plan.step_seconds < plan.alone_step_seconds[0], "{plan:?}");
        // The splits: each stage a unit but the ends, which may be empty.
        let mut out = Vec::new();
        splits(2, 2, &mut out, &mut Vec::new());
        assert_eq!(out, vec![vec![0, 2], vec![1, 2], vec![2, 2]]);
        let mut out = Vec::new();
        splits(1, 3, &mut out, &mut Vec::new());
        assert_eq!(out, vec![vec![0, 1, 1]]);
    }

    #[test]
    fn replicas_by_sequence_give_a_slow_chip_single_sequences() {
        // Fast: 1 per block-sequence at size 4 (4 per micro-batch of 4),
        // slow: 10 per sequence. Sizes 1 and 4.
        let at = |b: usize, per_seq: [f64; 2]| SizedCosts {
            devices: vec![
                dev("fast", per_seq[0] * b as f64, 0.0),
                dev("slow", per_seq[1] * b as f64, 0.0),
            ],
            model: MeasuredModel {
                micro_batch: b,
                micro_batches: 16 / b,
                ..model(1, 16 / b)
            },
        };
        let sizes = [at(1, [1.5, 10.0]), at(4, [1.0, 10.0])];
        let r = replicas_by_sequence(&sizes, 16, &|_, _| true).unwrap();
        let (t, pipes) = (r.step_seconds, r.pipelines);
        // Free optimizer steps: sharding would only add the gather.
        assert_eq!(r.optimizer_weights, None);
        let got: Vec<(usize, usize, usize)> = pipes
            .iter()
            .map(|p| (p.micro_batch, p.micro_batches, p.sequences))
            .collect();
        // Dealt in sequences: the slow chip one (10), the fast one 15 at
        // its faster size, three micro-batches of 4 (12) and a last one of
        // 3, priced between its sizes 1 and 4 (1.5 + 2.5 x 2/3). In whole
        // micro-batches of 4 the slow chip would take 4 sequences (40); in
        // single sequences the fast one 14 (21) against the slow one's 2.
        assert_eq!(got, vec![(4, 4, 15), (1, 1, 1)]);
        let want = 12.0 + 1.5 + 2.5 * 2.0 / 3.0;
        assert!((t - want).abs() < 1e-6, "{t}");
        // A last micro-batch's price: measured sizes as measured, others
        // between the nearest, in proportion past the ends.
        assert!((whole_model_passes(&sizes, 0, 4) - 4.0).abs() < 1e-12);
        assert!((whole_model_passes(&sizes, 0, 2) - (1.5 + 2.5 / 3.0)).abs() < 1e-12);
        assert!((whole_model_passes(&sizes[1..], 1, 2) - 20.0).abs() < 1e-12);
        assert!((whole_model_passes(&sizes[..1], 0, 3) - 4.5).abs() < 1e-12);
        // Nothing fits the slow chip at size 4: it still gets size 1.
        let r = replicas_by_sequence(&sizes, 16, &|d, b| d == 0 || b == 1).unwrap();
        assert_eq!(r.pipelines[1].micro_batch, 1);
    }

    #[test]
    fn a_slow_optimizer_is_sharded_by_speed() {
        // 100 parameters; the slow chip steps them in 0.5 each (50), the
        // fast one in 0.05 (5). Unsharded, the slow replica's 50 is exposed
        // every step; sharded 10:1, both finish in 100 / 22 = 4.5, plus
        // the gather of 400 bytes at 1000 bytes/s.
        let mut fast = dev("fast", 1.0, 0.0);
        let mut slow = dev("slow", 3.0, 0.0);
        fast.optimizer_per_param = 0.05;
        slow.optimizer_per_param = 0.5;
        let model = MeasuredModel {
            block_params: 100,
            attention_params: 50,
            embed_params: 0,
            head_params: 0,
            link_bandwidth: 1000.0,
            grad_bytes: 0,
            ..model(1, 16)
        };
        let sizes = [SizedCosts {
            devices: vec![fast.clone(), slow.clone()],
            model,
        }];
        let r = replicas_by_sequence(&sizes, 16, &|_, _| true).unwrap();
        let w = r.optimizer_weights.clone().expect("sharded");
        assert!((w[0] / w[1] - 10.0).abs() < 1e-9, "{w:?}");
        let counts: Vec<usize> = r.pipelines.iter().map(|p| p.micro_batches).collect();
        // The passes alone decide the deal: 12 x 1 against 4 x 3.
        assert_eq!(counts, vec![12, 4]);
        let want = 12.0 + 100.0 / 22.0 + 0.4;
        assert!((r.step_seconds - want).abs() < 1e-9, "{r:?}");
        // The search reports the weights with the replicas.
        let plan = search(&[fast, slow], &model, Layouts::Replicas, &|_, _, _| true).unwrap();
        assert_eq!(plan.optimizer_weights, Some(w));
        // Not allowed to shard: the slow replica takes one micro-batch and
        // its whole step (3 + 50).
        let model = MeasuredModel {
            shard_optimizer: false,
            overlap_reduction: false,
            async_sends: false,
            ..model
        };
        let sizes = [SizedCosts {
            model,
            ..sizes[0].clone()
        }];
        let r = replicas_by_sequence(&sizes, 16, &|_, _| true).unwrap();
        assert_eq!(r.optimizer_weights, None);
        assert!((r.step_seconds - 53.0).abs() < 1e-9, "{r:?}");
    }

    #[test]
    fn under_a_profile_error_a_pipeline_balanced_on_the_profile_gives_way_to_one_with_slack() {
        // The slow chip's block a little over 10x the fast one's: a block
        // and a half on it (15.4 per micro-batch) against the fast one's
        // 14.5 blocks and head (15.5) is the shortest predicted step, and
        // either chip running 14% slower than measured lengthens it; one
        // block (10.3 against 16) is 3% longer as predicted and loses
        // only when the fast chip is slower.
        let devs = [dev("fast", 1.0, 1.0), dev("slow", 10.27, 20.0)];
        let slow_stage = |plan: &MeasuredPlan| {
            let s = plan.pipelines[0].stages[0];
            assert_eq!(s.device, 1, "{plan:?}");
            (s.from, s.to)
        };
        let nominal = search(&devs, &model(16, 32), Layouts::Pipelines, &|_, _, _| true).unwrap();
        assert_eq!(slow_stage(&nominal), (0, 3));
        assert_eq!(nominal.expected_step_seconds, nominal.step_seconds);
        let m = MeasuredModel {
            profile_error: 0.1,
            ..model(16, 32)
        };
        let robust = search(&devs, &m, Layouts::Pipelines, &|_, _, _| true).unwrap();
        assert_eq!(slow_stage(&robust), (0, 2));
        // The prediction is the layout's nominal step, longer than the
        // other's; the expected step is shorter than the other's.
        let (t, e) = (robust.step_seconds, robust.expected_step_seconds);
        assert!(
            t > nominal.step_seconds && t < 1.05 * nominal.step_seconds,
            "{t}"
        );
        let other = SigmaPoints::new(["fast", "slow"], 0.1).expected(0.0, |f| {
            let scaled = [devs[0].scaled(f[0]), devs[1].scaled(f[1])];
            pipeline_time(&scaled, &m, &nominal.pipelines[0].stages, 32, 0)
        });
        assert!(e >= t && e < other, "{e} against {other}");
    }

    #[test]
    fn under_a_profile_error_the_deal_leaves_the_slow_replica_slack() {
        // 16 sequences; fast 1 per sequence, slow 7.2. Two on the slow
        // chip balance the deal (14.4 against 14), one leaves it slack
        // (7.2 against 15).
        let sizes = |error| {
            [SizedCosts {
                devices: vec![dev("fast", 1.0, 0.0), dev("slow", 7.2, 0.0)],
                model: MeasuredModel {
                    profile_error: error,
                    ..model(1, 16)
                },
            }]
        };
        let dealt = |error| {
            let r = replicas_by_sequence(&sizes(error), 16, &|_, _| true).unwrap();
            let seqs: Vec<usize> = r.pipelines.iter().map(|p| p.sequences).collect();
            (seqs, r.step_seconds, r.expected_step_seconds)
        };
        let (seqs, t, e) = dealt(0.0);
        assert_eq!(seqs, vec![14, 2]);
        // (The reduction over the test's link adds nanoseconds.)
        assert!((t - 14.4).abs() < 1e-6 && e == t, "{t} {e}");
        let (seqs, t, e) = dealt(0.1);
        assert_eq!(seqs, vec![15, 1]);
        // Expected: the fast replica's 15 at 1 +/- 0.1 sqrt 2 and as is.
        let r = 0.1 * 2f64.sqrt();
        let want = (15.0 * (1.0 + r) + 15.0 * (1.0 - r) + 2.0 * 15.0) / 4.0;
        assert!(
            (t - 15.0).abs() < 1e-6 && (e - want).abs() < 1e-6,
            "{t} {e}"
        );
    }

    #[test]
    fn the_window_never_drops_the_pipeline_expecting_the_least() {
        // Random pipelines of two or three kinds, both schedules, sends
        // queued or not: the search, which re-simulates only the layouts
        // within the window of the best nominal step, keeps the layout
        // a brute force over every layout's expected step finds, and no
        // layout expects less than its nominal step (the convexity the
        // window rests on).
        let mut next = uniform(0x9e37_79b9_7f4a_7c15u64);
        for case in 0..200 {
            let n = 2 + (case % 2);
            let devs: Vec<MeasuredDevice> = (0..n)
                .map(|i| {
                    let mut d = dev(&format!("k{i}:0"), 0.2 + 10.0 * next(), 3.0 * next());
                    d.embed_forward = next();
                    d.embed_backward = next();
                    d
                })
                .collect();
            let layers = 2 + (case % 4);
            let m = MeasuredModel {
                profile_error: 0.05 + 0.2 * next(),
                async_sends: next() < 0.5,
                activation_bytes: (1e6 * next()) as u64,
                link_bandwidth: 1e6,
                schedule: match next() < 0.5 {
                    true => PipelineSchedule::OneFOneB,
                    false => PipelineSchedule::ZeroBubble,
                },
                ..model(layers, 2 + (case % 7))
            };
            let plan = search(&devs, &m, Layouts::Pipelines, &|_, _, _| true).unwrap();
            let points = SigmaPoints::new(devs.iter().map(|d| d.name.as_str()), m.profile_error);
            let (mut os, mut ss) = (Vec::new(), Vec::new());
            orders(n, n, &mut Vec::new(), &mut os);
            splits(2 * layers, n, &mut ss, &mut Vec::new());
            let mut least = f64::INFINITY;
            for order in &os {
                for split in &ss {
                    let stages = pipeline_stages(order, split);
                    let t = pipeline_time(&devs, &m, &stages, m.micro_batches, 0);
                    let e = expected_pipeline_time(&devs, &m, &stages, &points, t);
                    assert!(e >= t * (1.0 - 1e-9), "case {case}: {e} < {t}");
                    least = least.min(e);
                }
            }
            let got = plan.expected_step_seconds;
            assert!(
                (got - least).abs() <= 1e-9 * least,
                "case {case}: the search expects {got}, the brute force {least}"
            );
        }
    }

    #[test]
    fn replicas_share_the_batch_by_speed_and_memory_limits_hold() {
        let devs = [dev("fast", 1.0, 0.0), dev("slow", 3.0, 0.0)];
        let plan = search(&devs, &model(4, 16), Layouts::Replicas, &|_, _, _| true).unwrap();
        let counts: Vec<usize> = plan.pipelines.iter().map(|p| p.micro_batches).collect();
        assert_eq!(counts, vec![12, 4]);
        assert!((plan.speedup_ratio - 1.0).abs() < 1e-9, "{plan:?}");
        // Nothing fits device 1 but one block: it must get exactly one.
        let fits = |d: usize, s: Span, _| d == 0 || s.to - s.from == 2;
        let plan = search(&devs, &model(4, 16), Layouts::Pipelines, &fits).unwrap();
        let slow = plan.pipelines[0]
            .stages
            .iter()
            .find(|s| s.device == 1)
            .unwrap();
        assert_eq!(slow.to - slow.from, 2);
        assert!(search(&devs, &model(4, 16), Layouts::Replicas, &fits).is_none());
    }

    #[test]
    fn span_counts_count_a_feed_forward_half_held_in_part_by_its_columns() {
        // Without columns: the half counts.
        for (from, to) in [(0, 0), (0, 5), (1, 6), (3, 3), (2, 9)] {
            let (a, f) = half_counts(from, to);
            assert_eq!(span_counts(from, 0, to, 0, 176, 0), (a as f64, f as f64));
            assert_eq!(span_counts(from, 0, to, 0, 0, 0), (a as f64, f as f64));
        }
        // Halves 1 (from column 44 of 176) to 4, and 44 columns of 5.
        assert_eq!(span_counts(1, 44, 5, 44, 176, 0), (2.0, 0.75 + 1.0 + 0.25));
        // The first 88 columns of half 3 after halves 0 to 2.
        assert_eq!(span_counts(0, 0, 3, 88, 176, 0), (2.0, 1.5));
        // Columns 44 to 132 of half 3 alone.
        assert_eq!(span_counts(3, 44, 3, 132, 176, 0), (0.0, 0.5));
        // From column 132 of half 3 to the end of block 2.
        assert_eq!(span_counts(3, 132, 6, 0, 176, 0), (1.0, 1.25));
        // A width of 0 ignores the columns.
        assert_eq!(span_counts(3, 44, 5, 88, 0, 0), (1.0, 1.0));
        let span = Span {
            from: 1,
            to: 5,
            from_cols: 44,
            to_cols: 44,
            embed: false,
            head: false,
        };
        assert_eq!(span.counts(176, 0), (2.0, 2.0));
        // Its units: a quarter of half 1's feed-forward weights gone, a
        // quarter of half 5's held.
        let m = MeasuredModel {
            ffn: 176,
            ..model(4, 1)
        };
        assert_eq!(unit_params(&m, &span), vec![375, 500, 500, 500, 125]);
        let inside = Span {
            from: 3,
            to: 3,
            from_cols: 44,
            to_cols: 132,
            ..span
        };
        assert_eq!(unit_params(&m, &inside), vec![250]);
    }

    #[test]
    fn span_counts_count_an_attention_half_held_in_part_by_its_kv_heads() {
        // Halves 0 and 1, and 3 of the 4 kv heads of half 2.
        assert_eq!(span_counts(0, 0, 2, 3, 176, 4), (1.75, 1.0));
        // From the fourth kv head of half 2 to the end of block 2.
        assert_eq!(span_counts(2, 3, 6, 0, 176, 4), (1.25, 2.0));
        // Kv heads 1 to 3 of half 2 alone.
        assert_eq!(span_counts(2, 1, 2, 3, 176, 4), (0.5, 0.0));
        // Both kinds: from the third kv head of half 2 to 44 columns of
        // half 5.
        assert_eq!(span_counts(2, 2, 5, 44, 176, 4), (1.5, 1.25));
        // From 88 columns of half 3 to 1 kv head of half 4.
        assert_eq!(span_counts(3, 88, 4, 1, 176, 4), (0.25, 0.5));
        // No kv heads ignores the columns of attention halves, and a
        // width of 0 those of feed-forward halves.
        assert_eq!(span_counts(2, 2, 4, 1, 176, 0), (1.0, 1.0));
        assert_eq!(span_counts(2, 2, 5, 44, 0, 4), (1.5, 1.0));
        let span = Span {
            from: 2,
            to: 4,
            from_cols: 1,
            to_cols: 3,
            embed: false,
            head: false,
        };
        assert_eq!(span.counts(176, 4), (1.5, 1.0));
        assert_eq!(span.counts(176, 0), (1.0, 1.0));
        // Its units: a quarter of half 2's attention weights gone, three
        // quarters of half 4's held.
        let m = MeasuredModel {
            ffn: 176,
            kv_heads: 4,
            ..model(4, 1)
        };
        assert_eq!(unit_params(&m, &span), vec![375, 500, 375]);
        let inside = Span { to: 2, ..span };
        assert_eq!(unit_params(&m, &inside), vec![250]);
        // Without kv heads the model's units are those of the halves.
        let m = MeasuredModel { kv_heads: 0, ..m };
        assert_eq!(unit_params(&m, &span), vec![500, 500]);
    }

    #[test]
    fn a_cut_inside_a_half_sends_two_activations() {
        // One micro-batch, blocking sends of 1 s each way: a cut inside a
        // feed-forward half by its width, or inside an attention half by
        // its kv heads, adds twice the time the cut between halves adds.
        let devs = [dev("a", 1.0, 0.0), dev("b", 1.0, 0.0)];
        let m = MeasuredModel {
            ffn: 176,
            kv_heads: 8,
            activation_bytes: 1_000_000,
            link_bandwidth: 1e6,
            async_sends: false,
            ..model(2, 1)
        };
        let between = [stage(0, 0, 0, 1, 0), stage(1, 1, 0, 4, 0)];
        let inside = [stage(0, 0, 0, 1, 88), stage(1, 1, 88, 4, 0)];
        let heads = [stage(0, 0, 0, 2, 4), stage(1, 2, 4, 4, 0)];
        let added = |stages: &[MeasuredStage]| {
            let free = MeasuredModel {
                activation_bytes: 0,
                ..m
            };
            pipeline_time(&devs, &m, stages, 1, 0) - pipeline_time(&devs, &free, stages, 1, 0)
        };
        let (one, two, by_heads) = (added(&between), added(&inside), added(&heads));
        assert!(
            (one - 2.0).abs() < 1e-9 && (two - 4.0).abs() < 1e-9 && (by_heads - 4.0).abs() < 1e-9,
            "{one} {two} {by_heads}"
        );
        // Half of half 1 moved: a twelfth of a block's passes of 1 s; or
        // half of half 2's kv heads: a quarter of block 1 on device 0.
        let free = MeasuredModel {
            activation_bytes: 0,
            ..m
        };
        let t = pipeline_time(&devs, &free, &inside, 1, 0);
        assert!((t - 2.0).abs() < 1e-9, "{t}");
        let t = pipeline_time(&devs, &free, &heads, 1, 0);
        assert!((t - 2.0).abs() < 1e-9, "{t}");
    }

    #[test]
    fn cut_positions_take_the_kv_heads_of_attention_halves_and_the_columns_of_feed_forward_ones() {
        // Around half 2 of 8: halves 0 to 4, inside halves 0 to 3.
        let at = cut_positions(2, 8, 4, 2);
        let want = [
            (0, 0),
            (0, 1),
            (1, 0),
            (1, 1),
            (1, 2),
            (1, 3),
            (2, 0),
            (2, 1),
            (3, 0),
            (3, 1),
            (3, 2),
            (3, 3),
            (4, 0),
        ];
        assert_eq!(at, want);
        // No kv heads: only the feed-forward halves are cut inside.
        let at = cut_positions(2, 8, 4, 0);
        assert!(at.iter().all(|&(h, c)| c == 0 || h % 2 == 1), "{at:?}");
        assert_eq!(at.len(), 5 + 2 * 3);
        // At the end of the model: nothing past it, nor inside its last
        // half's end; more than 64 kv heads go by 64ths.
        let at = cut_positions(8, 8, 0, 128);
        let inside: Vec<usize> = at.iter().filter(|p| p.1 > 0).map(|p| p.1).collect();
        assert_eq!(at.first(), Some(&(6, 0)));
        assert_eq!(at.last(), Some(&(8, 0)));
        assert_eq!(inside, (2..128).step_by(2).collect::<Vec<_>>());
    }

    #[test]
    fn a_chip_twelve_times_slower_is_balanced_by_a_cut_inside_a_feed_forward_half() {
        // Fast: 1 per block and for the head; slow: 12 per block, 40 for
        // the head, so it takes the first stage. Balanced, it takes x
        // blocks with 12 x = 24 - x + 1, x = 25 / 13 (1.92: inside block
        // 1's feed-forward half); at half a block's grain it takes 1.5
        // blocks (18 against the fast stage's 23.5) or 2 (24 against 23).
        let devs = [dev("fast", 1.0, 1.0), dev("slow", 12.0, 40.0)];
        let m = 256;
        let at = |ffn| MeasuredModel {
            ffn,
            ..model(24, m)
        };
        let halves = search(&devs, &at(0), Layouts::Pipelines, &|_, _, _| true).unwrap();
        let cols = search(&devs, &at(176), Layouts::Pipelines, &|_, _, _| true).unwrap();
        // The ideal: the two chips' throughputs added, the period of 25 on
        // the fast chip shared 12 : 1; the pipeline's fill and drain add
        // about a period to the m.
        let ideal = m as f64 * 25.0 / (1.0 + 1.0 / 12.0);
        // Without the width the plan is the half blocks' best, no columns.
        let st = &halves.pipelines[0].stages;
        assert!(st.iter().all(|s| s.from_cols == 0 && s.to_cols == 0));
        assert_eq!(
            (st[0].device, st[0].from, st[0].to),
            (1, 0, 3),
            "{halves:?}"
        );
        let (mut os, mut ss) = (Vec::new(), Vec::new());
        orders(2, 2, &mut Vec::new(), &mut os);
        splits(48, 2, &mut ss, &mut Vec::new());
        let least = os
            .iter()
            .flat_map(|o| ss.iter().map(move |s| pipeline_stages(o, s)))
            .map(|stages| pipeline_time(&devs, &at(0), &stages, m, 0))
            .fold(f64::INFINITY, f64::min);
        assert_eq!(halves.step_seconds, least);
        assert!(halves.step_seconds > 1.015 * ideal, "{halves:?}");
        // With it the cut falls inside half 3, the slow chip holding its
        // first 148 columns of 176 (1.5 + 0.5 x 148 / 176 = 1.92 blocks).
        let st = &cols.pipelines[0].stages;
        assert_eq!(st.len(), 2);
        assert_eq!((st[0].device, st[0].from, st[0].to), (1, 0, 3), "{cols:?}");
        assert!(st[0].to_cols > 0 && st[0].from_cols == 0, "{cols:?}");
        assert_eq!((st[1].from, st[1].from_cols), (st[0].to, st[0].to_cols));
        assert_eq!((st[1].to, st[1].to_cols), (48, 0));
        assert_eq!(st[0].to_cols, 148);
        assert!(cols.step_seconds < halves.step_seconds, "{cols:?}");
        assert!(cols.step_seconds < 1.01 * ideal, "{cols:?}");
        assert!(cols.candidates > halves.candidates);
        // No cut of the two stages at that grain (every 2 columns) beats
        // it.
        let mut best = f64::INFINITY;
        for h in (1..48).step_by(2) {
            for c in (2..176).step_by(2) {
                let stages = slow_then_fast(h, c, 48);
                best = best.min(pipeline_time(&devs, &at(176), &stages, m, 0));
            }
        }
        assert!(cols.step_seconds <= best, "{cols:?} against {best}");
        // Under a profile error it expects no more than the half blocks'.
        let err = |ffn| MeasuredModel {
            profile_error: 0.1,
            ..at(ffn)
        };
        let e0 = search(&devs, &err(0), Layouts::Pipelines, &|_, _, _| true).unwrap();
        let e1 = search(&devs, &err(176), Layouts::Pipelines, &|_, _, _| true).unwrap();
        assert!(
            e1.expected_step_seconds <= e0.expected_step_seconds,
            "{e1:?} {e0:?}"
        );
        // A memory limit holds: the slow chip fits no more than its
        // first block and a half.
        let fits = |d: usize, s: Span, _| d == 0 || s.counts(176, 0).0 + s.counts(176, 0).1 <= 3.0;
        let limited = search(&devs, &at(176), Layouts::Pipelines, &fits).unwrap();
        let st = &limited.pipelines[0].stages;
        assert_eq!(
            (st[0].device, st[0].to, st[0].to_cols),
            (1, 3, 0),
            "{limited:?}"
        );
    }

    #[test]
    fn a_balance_inside_an_attention_half_is_reached_by_a_cut_by_its_kv_heads() {
        // Attention four fifths of a block's passes. Fast: 1 per block and
        // for the head; slow: 15 per block, 40 for the head, so it takes
        // the first stage. Balanced, it takes x blocks' passes with 15 x =
        // 23 - x + 1, x = 1.5: block 0 and five eighths of block 1's
        // attention half (half 2). Between halves it takes 1 block (15
        // against the fast stage's 23) or 1.8 (27); a cut inside a
        // feed-forward half moves it only within 0.8 to 1 or 1.8 to 2.
        let heavy = |name: &str, block: f64, head: f64| MeasuredDevice {
            attention_forward: 0.8 * block / 3.0,
            attention_backward: 0.8 * 2.0 * block / 3.0,
            ..dev(name, block, head)
        };
        let devs = [heavy("fast", 1.0, 1.0), heavy("slow", 15.0, 40.0)];
        let m = 256;
        let at = |kv_heads| MeasuredModel {
            ffn: 176,
            kv_heads,
            ..model(23, m)
        };
        let all = |_: usize, _: Span, _: usize| true;
        let columns = search(&devs, &at(0), Layouts::Pipelines, &all).unwrap();
        let heads = search(&devs, &at(8), Layouts::Pipelines, &all).unwrap();
        // The ideal: the two chips' throughputs added, the period of 24 on
        // the fast chip shared 15 : 1.
        let ideal = m as f64 * 24.0 / (1.0 + 1.0 / 15.0);
        let st = &columns.pipelines[0].stages;
        assert!(
            st.iter().all(|s| s.to % 2 == 1 || s.to_cols == 0),
            "{columns:?}"
        );
        assert!(columns.step_seconds > 1.015 * ideal, "{columns:?}");
        // With kv heads the cut falls inside half 2, the slow chip holding
        // its first 5 of 8 kv heads.
        let st = &heads.pipelines[0].stages;
        assert_eq!(st.len(), 2);
        assert_eq!((st[0].device, st[0].from, st[0].from_cols), (1, 0, 0));
        assert_eq!((st[0].to, st[0].to_cols), (2, 5), "{heads:?}");
        assert_eq!((st[1].from, st[1].from_cols), (2, 5));
        assert_eq!((st[1].to, st[1].to_cols), (46, 0));
        assert!(heads.step_seconds < columns.step_seconds, "{heads:?}");
        assert!(heads.step_seconds < 1.01 * ideal, "{heads:?}");
        // No cut of the two stages inside an attention half beats it.
        let mut best = f64::INFINITY;
        for h in (0..46).step_by(2) {
            for c in 1..8 {
                let stages = slow_then_fast(h, c, 46);
                best = best.min(pipeline_time(&devs, &at(8), &stages, m, 0));
            }
        }
        assert!(heads.step_seconds <= best, "{heads:?} against {best}");
        // A memory limit counts the kv heads: the slow chip fits no more
        // than two halves and a half, so 4 of half 2's kv heads.
        let fits = |d: usize, s: Span, _| {
            let (a, f) = s.counts(176, 8);
            d == 0 || a + f <= 2.5
        };
        let limited = search(&devs, &at(8), Layouts::Pipelines, &fits).unwrap();
        let st = &limited.pipelines[0].stages;
        assert_eq!(
            (st[0].device, st[0].to, st[0].to_cols),
            (1, 2, 4),
            "{limited:?}"
        );
    }

    #[test]
    fn refined_pipelines_hold_the_model_once_and_expect_no_more_than_the_half_blocks() {
        // Random pipelines of two or three kinds, with and without a
        // profile error: the refined plan's stages follow one another,
        // each holding a part of the model (or the first the embedding
        // alone, the last the head alone), cut inside feed-forward halves
        // only at their columns and inside attention halves only at their
        // kv heads (none when there is one, or none); its step is its
        // stages' simulated step, and it expects no more than the plan at
        // half a block's grain.
        let mut next = uniform(0x2545_f491_4f6c_dd1du64);
        let (mut width_cuts, mut head_cuts) = (0, 0);
        for case in 0..60 {
            let n = 2 + (case % 2);
            let devs: Vec<MeasuredDevice> = (0..n)
                .map(|i| {
                    let mut d = dev(&format!("k{i}:0"), 0.2 + 12.0 * next(), 3.0 * next());
                    d.embed_forward = next();
                    d.embed_backward = next();
                    d
                })
                .collect();
            let layers = 2 + (case % 5);
            let ffn = [64, 176, 5][case % 3];
            let kv_heads = [2, 4, 1, 0][(case / 3) % 4];
            let m = MeasuredModel {
                profile_error: [0.0, 0.1][(case / 2) % 2],
                async_sends: next() < 0.5,
                activation_bytes: (1e5 * next()) as u64,
                link_bandwidth: 1e6,
                schedule: match next() < 0.5 {
                    true => PipelineSchedule::OneFOneB,
                    false => PipelineSchedule::ZeroBubble,
                },
                ..model(layers, 4 + (case % 9))
            };
            let fine = MeasuredModel { ffn, kv_heads, ..m };
            let coarse = search(&devs, &m, Layouts::Pipelines, &|_, _, _| true).unwrap();
            let plan = search(&devs, &fine, Layouts::Pipelines, &|_, _, _| true).unwrap();
            assert!(
                plan.expected_step_seconds <= coarse.expected_step_seconds,
                "case {case}: {plan:?} against {coarse:?}"
            );
            let st = &plan.pipelines[0].stages;
            let (first, last) = (st[0], st[st.len() - 1]);
            assert_eq!((first.from, first.from_cols), (0, 0), "case {case}");
            assert_eq!((last.to, last.to_cols), (2 * layers, 0), "case {case}");
            for (i, s) in st.iter().enumerate() {
                let (from, to) = ((s.from, s.from_cols), (s.to, s.to_cols));
                let end = i == 0 || i + 1 == st.len();
                assert!(from < to || (end && from == to), "case {case}: {st:?}");
                for (h, c) in [from, to] {
                    let width = half_width(h, ffn, kv_heads);
                    assert!(c == 0 || c < width, "case {case}: {st:?}");
                }
                if let Some(after) = st.get(i + 1) {
                    assert_eq!(to, (after.from, after.from_cols), "case {case}");
                }
                width_cuts += usize::from(s.to_cols > 0 && s.to % 2 == 1);
                head_cuts += usize::from(s.to_cols > 0 && s.to % 2 == 0);
            }
            let t = pipeline_time(&devs, &fine, st, fine.micro_batches, 0);
            assert_eq!(plan.step_seconds, t, "case {case}");
        }
        // The refinement has something to do in most cases.
        assert!(width_cuts + head_cuts >= 20, "{width_cuts} {head_cuts}");
        assert!(head_cuts >= 5, "{width_cuts} {head_cuts}");
    }
}

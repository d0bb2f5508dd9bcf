//! A discrete-event simulator of one training step of one pipeline under the
//! non-interleaved 1F1B schedule (PipeDream-Flush, Megatron-LM), its
//! interleaved form, 1F1B with deferred weights or the zero-bubble one
//! ([`PipelineSchedule`]), with
//! unequal stages, and a writer of its timeline in the Chrome trace-event
//! format.
//!
//! Model. Stage `i` (0-based) of `p` runs `w_i = min(p - i, m)` warm-up
//! forwards (zero bubble: `min(2 (p - i) - 1, m)`), then alternates backward
//! and forward (steady state), then drains the remaining backwards; its
//! order is fixed. Under the zero-bubble schedule a stage `i > 0` splits
//! each backward pass: the input's gradient (`backward - weight_grad`),
//! sent as soon as it is done, then the weights' (`weight_grad`), before
//! the stage's next pass; under 1F1B with deferred weights a stage `i > 0`
//! splits its last two backward passes so, and runs their weights' passes
//! after its last backward pass (the split's own cost, 3-10% of those two
//! passes on the bundled CPU devices, is not counted). An operation starts
//! when its stage is free and its dependency has arrived: the forward of
//! micro-batch `j` on stage `i` waits for that forward on stage `i - 1` plus
//! `send_next[i - 1]`; the backward of `j` on stage `i` waits for that
//! backward on stage `i + 1` plus `send_next[i]` (the gradient travels back
//! over the same link); the last stage's backward waits for its own forward.
//! After its last backward a stage runs its `dp_allreduce`; the
//! `optimizer`s start together once every stage has reduced (clipping
//! needs the whole model's gradient norm: one all-reduce over every stage,
//! Megatron-LM's `clip_grad_norm` over the model-parallel group and
//! `polychip train`'s loss-and-norm all-reduce), and the step ends when
//! every stage has finished.
//!
//! Transfers block their sender: after a forward (backward) that sends, the
//! stage is busy until the activation (its gradient) has arrived, as
//! Megatron-LM's and DeepSpeed's blocking point-to-point exchanges are (a
//! trial on Sailor's measured GH200 runs: 6.7% median error from a profile
//! with transfers as pure latency, 4.6% with them blocking). A stage whose
//! `sends_async` is set (`polychip train`'s sender thread) is free at once
//! instead; its transfers go one after another, each starting when the
//! stage has produced it and the previous one has arrived. Links have no
//! bandwidth contention, and two stages' sends on one link may overlap.
//! Since each stage's order is fixed and nothing else is shared,
//! resolving operations in dependency order (each start is `max(stage
//! free, dependency arrival)`) gives exactly the timeline that a
//! time-ordered event queue would. `m = 0` is treated as one micro-batch,
//! as in [`Schedule::analytic_step_time`].
//!
//! Interleaving (`virtual_stages` `v > 1`, Megatron-LM's interleaved 1F1B,
//! Narayanan et al., 2021): the schedule's stages are the `p v` model
//! chunks in model order, chunk `k` on device `k mod p`, so a micro-batch
//! passes through every device `v` times, the last device's chunk sending
//! to the first device's next one. Everything above holds with "stage" read
//! as chunk for the dependencies and transfers, and as device for being
//! busy: each device runs its chunks' passes in [`interleaved_order`], one
//! at a time, and after its last one reduces and then updates all its
//! chunks' parameters (their `dp_allreduce`s, then their `optimizer`s).

use crate::schedule::{PipelineSchedule, Schedule, interleaved_warm_up};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// What an [`Event`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    /// A micro-batch's forward on a stage.
    Forward,
    /// A micro-batch's backward on a stage (under a split, the input's
    /// gradient).
    Backward,
    /// The weights' gradients of a split backward pass.
    WeightGrad,
    /// Activations sent from `stage` to `stage + 1`.
    SendActivation,
    /// The activation gradient sent from `stage` back to `stage - 1`.
    SendGradient,
    /// The stage's data-parallel gradient all-reduce.
    AllReduce,
    /// The stage's optimizer step.
    Optimizer,
}

impl EventKind {
    /// A short name for traces.
    pub fn name(self) -> &'static str {
        match self {
            Self::Forward => "forward",
            Self::Backward => "backward",
            Self::WeightGrad => "weight gradients",
            Self::SendActivation => "send activation",
            Self::SendGradient => "send gradient",
            Self::AllReduce => "dp all-reduce",
            Self::Optimizer => "optimizer",
        }
    }

    /// Whether the event is a point-to-point transfer (it does not occupy the
    /// stage's compute).
    pub fn is_transfer(self) -> bool {
        matches!(self, Self::SendActivation | Self::SendGradient)
    }
}

/// One interval of the simulated timeline (seconds from the step's start).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The stage that runs it (for transfers: the sending stage); under
    /// interleaving the chunk, except for the all-reduce and optimizer,
    /// which name the device.
    pub stage: usize,
    /// What it is.
    pub kind: EventKind,
    /// The micro-batch, for forwards, backwards and transfers.
    pub microbatch: Option<usize>,
    /// Start time.
    pub start: f64,
    /// End time.
    pub end: f64,
}

/// The outcome of [`simulate`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimResult {
    /// When the last stage finishes its optimizer step.
    pub step_time: f64,
    /// Forward plus backward compute time per stage (`m * (f_i + b_i)`; the
    /// all-reduce and optimizer are not counted); under interleaving per
    /// device, the sum of its chunks'.
    pub stage_busy: Vec<f64>,
    /// `1 - sum(stage_busy) / (p * step_time)`: the share of the stages'
    /// time not spent on forward/backward compute (pipeline bubbles, waiting
    /// on transfers, and the all-reduce and optimizer tail). 0 when
    /// `step_time` is 0. Equals `(p - 1) / (m + p - 1)` for equal stages
    /// without transfers or tail.
    pub bubble_fraction: f64,
    /// Every forward, backward, transfer, all-reduce and optimizer interval,
    /// in the order they were resolved.
    pub events: Vec<Event>,
}

/// One pass in a stage's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// The forward pass.
    Forward,
    /// The backward pass: the whole of it, or under a split the input's
    /// gradient (after which the stage sends it).
    Backward,
    /// The weights' gradients of a split backward pass.
    Weights,
}

/// The fixed order of stage `i` of `p` under `schedule`, running
/// `ahead` times its lead ahead ([`Schedule::run_ahead`]): `(pass,
/// micro-batch)`. A backward pass is split ([`Pass::Weights`] after it)
/// where [`PipelineSchedule::splits`] says: under the zero-bubble schedule
/// on every stage but the first, which sends no gradient; under
/// [`PipelineSchedule::OneFOneBDeferred`] the last two passes of those
/// stages, their weights' passes at the end of the stage's order.
pub fn stage_order(
    i: usize,
    p: usize,
    m: usize,
    schedule: PipelineSchedule,
    ahead: usize,
) -> Vec<(Pass, usize)> {
    let warm = (schedule.warm_up(i, p, m, ahead) + 1).min(m);
    let mut ops: Vec<(Pass, usize)> = (0..warm).map(|j| (Pass::Forward, j)).collect();
    let mut deferred = Vec::new();
    for k in 0..m {
        ops.push((Pass::Backward, k));
        match (schedule.splits(i, k, m), schedule.defers_weights()) {
            (true, true) => deferred.push((Pass::Weights, k)),
            (true, false) => ops.push((Pass::Weights, k)),
            _ => {}
        }
        if warm + k < m {
            ops.push((Pass::Forward, warm + k));
        }
    }
    ops.extend(deferred);
    ops
}

/// The fixed order of device `i` of `p` under Megatron-LM's interleaved
/// 1F1B schedule, `v` model chunks per device and `m` micro-batches (a
/// multiple of `p`): `(pass, chunk, micro-batch)`, the chunk `c` being
/// model chunk `c p + i`. Forward passes go through the micro-batches in
/// groups of `p`, each group through chunk 0 to `v - 1`; backward passes
/// through the same groups, chunk `v - 1` to 0. The device runs
/// [`interleaved_warm_up`] of them and one more before its first backward
/// pass, then alternates as 1F1B does.
pub fn interleaved_order(i: usize, p: usize, v: usize, m: usize) -> Vec<(Pass, usize, usize)> {
    let total = m * v;
    let unit = |u: usize, backward: bool| {
        let (group, within) = (u / (p * v), u % (p * v));
        let chunk = within / p;
        let chunk = if backward { v - 1 - chunk } else { chunk };
        (chunk, group * p + within % p)
    };
    let warm = (interleaved_warm_up(i, p, v, m) + 1).min(total);
    let mut ops: Vec<(Pass, usize, usize)> = (0..warm)
        .map(|u| {
            let (c, j) = unit(u, false);
            (Pass::Forward, c, j)
        })
        .collect();
    for k in 0..total {
        let (c, j) = unit(k, true);
        ops.push((Pass::Backward, c, j));
        if warm + k < total {
            let (c, j) = unit(warm + k, false);
            ops.push((Pass::Forward, c, j));
        }
    }
    ops
}

/// Simulates one step of `schedule` (see the module docs), keeping every
/// event (for a trace).
pub fn simulate(schedule: &Schedule) -> SimResult {
    run(schedule, true)
}

/// [`simulate`] without the events (`events` is empty): the step time and
/// the stages' busy time only, in memory that does not grow with the
/// events' count.
pub fn step(schedule: &Schedule) -> SimResult {
    run(schedule, false)
}

/// Whether `schedule`'s chunks and micro-batches can be simulated
/// ([`check_interleaving`]).
pub fn check(schedule: &Schedule) -> Result<(), String> {
    check_interleaving(
        schedule.stages.len(),
        schedule.virtual_stages,
        schedule.pipeline,
        schedule.microbatches,
    )
}

/// Whether `stages` stages of `v` chunks per device, under `pipeline`, can
/// run `m` micro-batches: without interleaving (`v = 1`) always; under it,
/// when the stages are `p v` chunks of `p >= 2` devices, the schedule is
/// 1F1B, and `m` is a multiple of `p` (Megatron-LM's rule). The reason when
/// not.
pub fn check_interleaving(
    stages: usize,
    v: usize,
    pipeline: PipelineSchedule,
    m: usize,
) -> Result<(), String> {
    if v <= 1 {
        return Ok(());
    }
    let p = stages / v;
    if stages % v != 0 || p < 2 {
        return Err(format!(
            "an interleaved pipeline of {v} chunks per device lists its chunks in model order, \
             a multiple of {v} and at least {}; this one has {stages}",
            2 * v
        ));
    }
    if pipeline != PipelineSchedule::OneFOneB {
        return Err(format!(
            "the {} schedule is not modelled with interleaving (only 1f1b is)",
            pipeline.name()
        ));
    }
    let m = m.max(1);
    if m % p != 0 {
        return Err(format!(
            "the interleaved schedule runs micro-batches in groups of the pipeline's {p} \
             devices, so their count must be a multiple of {p}, not {m} (as Megatron-LM requires)"
        ));
    }
    Ok(())
}

fn run(schedule: &Schedule, keep_events: bool) -> SimResult {
    let st = &schedule.stages;
    let n = st.len();
    let v = schedule.virtual_stages.max(1);
    let p = schedule.devices();
    let m = schedule.microbatches.max(1);
    debug_assert!(check(schedule).is_ok(), "{:?}", check(schedule));
    // Each device's passes as (pass, stage, micro-batch); stage `c p + i`
    // is chunk `c` of device `i`.
    let orders: Vec<Vec<(Pass, usize, usize)>> = (0..p)
        .map(|i| match v {
            1 => stage_order(i, p, m, schedule.pipeline, schedule.run_ahead)
                .into_iter()
                .map(|(pass, j)| (pass, i, j))
                .collect(),
            _ => interleaved_order(i, p, v, m)
                .into_iter()
                .map(|(pass, c, j)| (pass, c * p + i, j))
                .collect(),
        })
        .collect();
    let mut next = vec![0usize; p];
    let mut free = vec![0.0f64; p];
    let mut fwd_end = vec![vec![None::<f64>; m]; n];
    // When stage k's activation (gradient) of micro-batch j has reached
    // stage k + 1 (k - 1).
    let mut arrive_fwd = vec![vec![None::<f64>; m]; n];
    let mut arrive_bwd = vec![vec![None::<f64>; m]; n];
    // When each device's sender thread is next free (asynchronous sends).
    let mut sender_free = vec![0.0f64; p];
    let mut events = Vec::with_capacity(if keep_events { n * m * 5 + 2 * p } else { 0 });
    let mut progress = true;
    while progress {
        progress = false;
        for i in 0..p {
            while let Some(&(pass, k, j)) = orders[i].get(next[i]) {
                let split = schedule.pipeline.splits(k, j, m);
                let ready = match (pass, k) {
                    (Pass::Forward, 0) => Some(0.0),
                    (Pass::Forward, _) => arrive_fwd[k - 1][j],
                    // Right after its backward pass, in the stage's order.
                    (Pass::Weights, _) => Some(0.0),
                    (Pass::Backward, _) if k + 1 == n => fwd_end[k][j],
                    (Pass::Backward, _) => arrive_bwd[k + 1][j],
                };
                let Some(ready) = ready else { break };
                let start = free[i].max(ready);
                let weights = if split { st[k].weight_grad } else { 0.0 };
                let (kind, dur) = match pass {
                    Pass::Forward => (EventKind::Forward, st[k].forward),
                    Pass::Backward => (EventKind::Backward, st[k].backward - weights),
                    Pass::Weights => (EventKind::WeightGrad, weights),
                };
                let end = start + dur;
                free[i] = end;
                if keep_events {
                    events.push(Event {
                        stage: k,
                        kind,
                        microbatch: Some(j),
                        start,
                        end,
                    });
                }
                if pass == Pass::Forward {
                    fwd_end[k][j] = Some(end);
                }
                let send = match pass {
                    Pass::Backward if k > 0 => Some((EventKind::SendGradient, st[k - 1].send_next)),
                    Pass::Forward if k + 1 < n => {
                        Some((EventKind::SendActivation, st[k].send_next))
                    }
                    _ => None,
                };
                if let Some((kind, lat)) = send {
                    let from = match st[k].sends_async {
                        // Queued for the device's sender thread, which
                        // sends one transfer after another; it goes on.
                        true => end.max(sender_free[i]),
                        // The sender waits for its transfer (Megatron and
                        // DeepSpeed block on their point-to-point exchange).
                        false => end,
                    };
                    let arrival = from + lat;
                    match st[k].sends_async {
                        true => sender_free[i] = arrival,
                        false => free[i] = arrival,
                    }
                    match kind {
                        EventKind::SendGradient => arrive_bwd[k][j] = Some(arrival),
                        _ => arrive_fwd[k][j] = Some(arrival),
                    }
                    if keep_events {
                        events.push(Event {
                            stage: k,
                            kind,
                            microbatch: Some(j),
                            start: from,
                            end: arrival,
                        });
                    }
                }
                next[i] += 1;
                progress = true;
            }
        }
    }
    debug_assert!(
        (0..p).all(|i| next[i] == orders[i].len()),
        "the schedule deadlocked"
    );
    // Each device reduces, then updates, all its chunks' parameters.
    let mut step_time = 0.0f64;
    let mut stage_busy = vec![0.0f64; p];
    let mut tails = vec![(0.0f64, 0.0f64); p];
    for (k, s) in st.iter().enumerate() {
        stage_busy[k % p] += m as f64 * (s.forward + s.backward);
        tails[k % p].0 += s.dp_allreduce;
        tails[k % p].1 += s.optimizer;
    }
    // The optimizer steps start together: clipping needs the gradient norm
    // of the whole model, one all-reduce over every stage once each has
    // reduced its gradients (Megatron-LM's `clip_grad_norm` over the
    // model-parallel group, `polychip train`'s loss and norm).
    let barrier = tails
        .iter()
        .enumerate()
        .map(|(i, &(allreduce, _))| free[i] + allreduce)
        .fold(0.0f64, f64::max);
    for (i, &(allreduce, optimizer)) in tails.iter().enumerate() {
        let ar_end = free[i] + allreduce;
        let opt_end = barrier + optimizer;
        if keep_events {
            events.push(Event {
                stage: i,
                kind: EventKind::AllReduce,
                microbatch: None,
                start: free[i],
                end: ar_end,
            });
            events.push(Event {
                stage: i,
                kind: EventKind::Optimizer,
                microbatch: None,
                start: barrier,
                end: opt_end,
            });
        }
        step_time = step_time.max(opt_end);
    }
    let total: f64 = stage_busy.iter().sum();
    let bubble_fraction = if step_time > 0.0 {
        1.0 - total / (p as f64 * step_time)
    } else {
        0.0
    };
    SimResult {
        step_time,
        stage_busy,
        bubble_fraction,
        events,
    }
}

/// The timeline as a Chrome trace (`{"traceEvents": [...]}`, viewable in
/// Perfetto or chrome://tracing): one complete (`"ph": "X"`) event per
/// [`Event`], times in microseconds, `pid` 0. Compute, all-reduce and
/// optimizer events sit on `tid` = stage, named by `names[stage]` (or
/// `"stage i"`); transfers sit on `tid` = `p + link`, link `k` joining stages
/// `k` and `k + 1`, named `"link k-k+1"`, so overlapping sends do not hide
/// the compute rows. Each used `tid` gets a `thread_name` metadata event.
/// Under interleaving a device's chunks share its row (`tid` = chunk mod
/// `p`, named by the device's first chunk), and an event's `args.stage`
/// says which chunk it is.
pub fn chrome_trace(result: &SimResult, names: &[String]) -> Value {
    let p = result.stage_busy.len().max(1);
    let stages = result
        .events
        .iter()
        .map(|e| e.stage + 1)
        .max()
        .unwrap_or(0)
        .max(result.stage_busy.len());
    let mut out = Vec::with_capacity(result.events.len() + 2 * stages);
    for i in 0..p {
        let name = names
            .get(i)
            .cloned()
            .unwrap_or_else(|| format!("stage {i}"));
        out.push(thread_name(i, &name));
        out.push(json!({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": i, "args": {"sort_index": i}}));
    }
    for k in 0..stages.saturating_sub(1) {
        out.push(thread_name(p + k, &format!("link {k}-{}", k + 1)));
    }
    for e in &result.events {
        let (tid, cat) = match e.kind {
            EventKind::SendActivation => (p + e.stage, "transfer"),
            EventKind::SendGradient => (p + e.stage - 1, "transfer"),
            EventKind::Forward | EventKind::Backward | EventKind::WeightGrad => {
                (e.stage % p, "compute")
            }
            EventKind::AllReduce | EventKind::Optimizer => (e.stage % p, "update"),
        };
        let name = match e.microbatch {
            Some(j) => format!("{} {j}", e.kind.name()),
            None => e.kind.name().to_string(),
        };
        out.push(json!({
            "name": name, "cat": cat, "ph": "X", "pid": 0, "tid": tid,
            "ts": e.start * 1e6, "dur": (e.end - e.start) * 1e6,
            "args": {"microbatch": e.microbatch, "stage": e.stage},
        }));
    }
    json!({"traceEvents": out, "displayTimeUnit": "ms"})
}

fn thread_name(tid: usize, name: &str) -> Value {
    json!({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": name}})
}

//! A discrete-event simulator of one training step of one pipeline under the
//! non-interleaved 1F1B schedule (PipeDream-Flush, Megatron-LM), with unequal
//! stages, and a writer of its timeline in the Chrome trace-event format.
//!
//! Model. Stage `i` (0-based) of `p` runs `w_i = min(p - i, m)` warm-up
//! forwards, then alternates backward and forward (steady state), then drains
//! the remaining backwards; its order is fixed. An operation starts when its
//! stage is free and its dependency has arrived: the forward of micro-batch
//! `j` on stage `i` waits for that forward on stage `i - 1` plus
//! `send_next[i - 1]`; the backward of `j` on stage `i` waits for that
//! backward on stage `i + 1` plus `send_next[i]` (the gradient travels back
//! over the same link); the last stage's backward waits for its own forward.
//! After its last backward a stage runs its `dp_allreduce`, then `optimizer`;
//! the step ends when every stage has finished.
//!
//! Transfers block their sender: after a forward (backward) that sends, the
//! stage is busy until the activation (its gradient) has arrived, as
//! Megatron-LM's and DeepSpeed's blocking point-to-point exchanges are (a
//! trial on Sailor's measured GH200 runs: 6.7% median error from a profile
//! with transfers as pure latency, 4.6% with them blocking). A stage whose
//! `sends_async` is set (`polychip train`'s sender thread) is free at once
//! instead; its transfers go one after another, each starting when the
//! stage has produced it and the previous one has arrived. Links have no
//! bandwidth contention, and two stages' sends on one link may overlap. Since each stage's order is fixed and nothing else is
//! shared, resolving operations in dependency order (each start is `max(stage
//! free, dependency arrival)`) gives exactly the timeline that a time-ordered
//! event queue would. `m = 0` is treated as one micro-batch, as in
//! [`Schedule::analytic_step_time`].

use crate::schedule::Schedule;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// What an [`Event`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    /// A micro-batch's forward on a stage.
    Forward,
    /// A micro-batch's backward on a stage.
    Backward,
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
    /// The stage that runs it (for transfers: the sending stage).
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
    /// all-reduce and optimizer are not counted).
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

/// The fixed 1F1B order of stage `i` of `p`: `(is_backward, micro-batch)`.
pub fn stage_order(i: usize, p: usize, m: usize) -> Vec<(bool, usize)> {
    let warm = (p - i).min(m);
    let mut ops: Vec<(bool, usize)> = (0..warm).map(|j| (false, j)).collect();
    for k in 0..m {
        ops.push((true, k));
        if warm + k < m {
            ops.push((false, warm + k));
        }
    }
    ops
}

/// Simulates one step of `schedule` under 1F1B (see the module docs).
pub fn simulate(schedule: &Schedule) -> SimResult {
    let st = &schedule.stages;
    let p = st.len();
    let m = schedule.microbatches.max(1);
    let orders: Vec<Vec<(bool, usize)>> = (0..p).map(|i| stage_order(i, p, m)).collect();
    let mut next = vec![0usize; p];
    let mut free = vec![0.0f64; p];
    let mut fwd_end = vec![vec![None::<f64>; m]; p];
    // When stage i's activation (gradient) of micro-batch j has reached
    // stage i + 1 (i - 1).
    let mut arrive_fwd = vec![vec![None::<f64>; m]; p];
    let mut arrive_bwd = vec![vec![None::<f64>; m]; p];
    // When each stage's sender thread is next free (asynchronous sends).
    let mut sender_free = vec![0.0f64; p];
    let mut events = Vec::with_capacity(p * m * 4 + 2 * p);
    let mut progress = true;
    while progress {
        progress = false;
        for i in 0..p {
            while let Some(&(backward, j)) = orders[i].get(next[i]) {
                let ready = match (backward, i) {
                    (false, 0) => Some(0.0),
                    (false, _) => arrive_fwd[i - 1][j],
                    (true, _) if i + 1 == p => fwd_end[i][j],
                    (true, _) => arrive_bwd[i + 1][j],
                };
                let Some(ready) = ready else { break };
                let start = free[i].max(ready);
                let (kind, dur) = if backward {
                    (EventKind::Backward, st[i].backward)
                } else {
                    (EventKind::Forward, st[i].forward)
                };
                let end = start + dur;
                free[i] = end;
                events.push(Event {
                    stage: i,
                    kind,
                    microbatch: Some(j),
                    start,
                    end,
                });
                if !backward {
                    fwd_end[i][j] = Some(end);
                }
                let send = if backward && i > 0 {
                    Some((EventKind::SendGradient, st[i - 1].send_next))
                } else if !backward {
                    (i + 1 < p).then_some((EventKind::SendActivation, st[i].send_next))
                } else {
                    None
                };
                if let Some((kind, lat)) = send {
                    let from = match st[i].sends_async {
                        // Queued for the stage's sender thread, which sends
                        // one transfer after another; the stage goes on.
                        true => end.max(sender_free[i]),
                        // The sender waits for its transfer (Megatron and
                        // DeepSpeed block on their point-to-point exchange).
                        false => end,
                    };
                    let arrival = from + lat;
                    match st[i].sends_async {
                        true => sender_free[i] = arrival,
                        false => free[i] = arrival,
                    }
                    match kind {
                        EventKind::SendGradient => arrive_bwd[i][j] = Some(arrival),
                        _ => arrive_fwd[i][j] = Some(arrival),
                    }
                    events.push(Event {
                        stage: i,
                        kind,
                        microbatch: Some(j),
                        start: from,
                        end: arrival,
                    });
                }
                next[i] += 1;
                progress = true;
            }
        }
    }
    debug_assert!(
        (0..p).all(|i| next[i] == orders[i].len()),
        "1F1B deadlocked"
    );
    let mut step_time = 0.0f64;
    for (i, s) in st.iter().enumerate() {
        let ar_end = free[i] + s.dp_allreduce;
        let opt_end = ar_end + s.optimizer;
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
            start: ar_end,
            end: opt_end,
        });
        step_time = step_time.max(opt_end);
    }
    let stage_busy: Vec<f64> = st
        .iter()
        .map(|s| m as f64 * (s.forward + s.backward))
        .collect();
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
pub fn chrome_trace(result: &SimResult, names: &[String]) -> Value {
    let p = result.stage_busy.len();
    let mut out = Vec::with_capacity(result.events.len() + 2 * p);
    for i in 0..p {
        let name = names
            .get(i)
            .cloned()
            .unwrap_or_else(|| format!("stage {i}"));
        out.push(thread_name(i, &name));
        out.push(json!({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": i, "args": {"sort_index": i}}));
    }
    for k in 0..p.saturating_sub(1) {
        out.push(thread_name(p + k, &format!("link {k}-{}", k + 1)));
    }
    for e in &result.events {
        let (tid, cat) = match e.kind {
            EventKind::SendActivation => (p + e.stage, "transfer"),
            EventKind::SendGradient => (p + e.stage - 1, "transfer"),
            EventKind::Forward | EventKind::Backward => (e.stage, "compute"),
            EventKind::AllReduce | EventKind::Optimizer => (e.stage, "update"),
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

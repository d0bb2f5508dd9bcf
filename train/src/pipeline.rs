//! One rank's part of a training step under a pipeline schedule, and of a
//! forward-only validation pass.
//!
//! **1F1B.** Stage `s` of `p` with `m` micro-batches runs `w = min(p - s -
//! 1, m)` forward passes, then alternates one forward and one backward
//! pass, then runs the remaining `w` backward passes. Activations go to the
//! next stage and their gradients back through the communication layer
//! (device-direct or staged, as the two devices allow), on the
//! [`crate::links`] of the rank: queued for a sender thread, or blocking.
//! Every link carries activations and gradients strictly alternately in
//! the steady phase: a stage receives its next activation before it sends
//! the gradient of the previous one, so even blocking sends of any size
//! cannot deadlock.
//!
//! **1F1B with deferred weights** (`1f1b-deferred`). As 1F1B, except that
//! a stage after the first splits its last two backward passes: it sends
//! each input gradient as soon as it is computed and runs the two weights'
//! passes after its last backward pass, while the stages before it drain
//! (the first stage's last backward pass, which ends the step under 1F1B,
//! starts a weights' pass or two earlier). Receives and sends keep 1F1B's
//! order, so blocking sends cannot deadlock here either.
//!
//! **Zero bubble** (after ZB-H2 of Qi et al., "Zero Bubble Pipeline
//! Parallelism", 2024). Each backward pass is split: the input's gradient
//! first, sent at once, then the weights' gradients, which fill the time
//! the stage would wait for the next gradient. And stage `s` runs `w =
//! min(2 (p - s - 1), m)` forward passes before its first backward pass,
//! so that it has work while its first gradient comes back. It keeps up to
//! `w + 1` micro-batches' activations (1F1B: `p - s`). Sends must be
//! queued: with more activations in flight than gradients, blocking sends
//! could deadlock.

use std::collections::VecDeque;

use polychip_host::Tensor;
use polychip_planner::schedule::PipelineSchedule;

use crate::data::{Corpus, Split};
use crate::error::Result;
use crate::links::{Io, Peer};
use crate::model::{Saved, Stage, StageInput, WeightGrads};
use crate::plan::Role;
use crate::trace::Tracer;

/// What a step needs to know besides the stage.
#[derive(Debug, Clone, Copy)]
pub struct StepData<'c> {
    /// The corpus.
    pub corpus: &'c Corpus,
    /// The data seed.
    pub seed: u64,
    /// The 0-based step (selects the batch).
    pub step: u64,
    /// Sequences per step over all replicas.
    pub global_batch: usize,
    /// The pipeline schedule.
    pub schedule: PipelineSchedule,
    /// How far the stage runs ahead of the next, as a multiple of the
    /// schedule's lead.
    pub run_ahead: usize,
    /// Added to each forward pass (a slow chip, for tests and drills:
    /// [`crate::trainer::SLOW_VAR`]); zero otherwise.
    pub pass_delay: std::time::Duration,
}

/// The trace category of a split backward pass's weight gradients.
pub const WEIGHTS: &str = "weights";

/// Forward and backward passes of one rank in one step: accumulates the
/// stage's gradients; on a last stage returns its replica's share of the
/// step's mean loss (the micro-batch losses weighted by their share of
/// the global batch), elsewhere 0. The last micro-batch's backward pass
/// calls `done(from)` as the gradients of parameters `from..` become final
/// (see [`Stage::backward_with`]), so that their reduction may start.
pub fn train_step(
    stage: &Stage,
    role: &Role,
    data: StepData<'_>,
    io: &mut Io<'_>,
    tracer: &mut Tracer,
    done: &mut dyn FnMut(usize) -> Result<()>,
) -> Result<f64> {
    let (m, b) = (role.micro_batches, role.micro_batch_size);
    let warm = data
        .schedule
        .warm_up(role.stage, role.stages, m, data.run_ahead);
    // Split backward passes only where a gradient is sent.
    let split = |j: usize| role.prev.is_some() && data.schedule.splits(role.stage, j, m);
    // 1F1B's order of receives and sends (see the module docs): zero
    // bubble sends a split pass's gradient first.
    let receive_first = data.schedule != PipelineSchedule::ZeroBubble;
    // Micro-batch i's sequences (the last may be fewer) and its share of
    // the global batch, the weight of its loss.
    let size = |i: usize| role.micro_batch(i);
    let weight = |i: usize| size(i) as f64 / data.global_batch as f64;
    let mut saved: VecDeque<Saved> = VecDeque::new();
    let mut loss = 0.0;
    let cfg = stage.config().clone();
    let first = |i: usize| role.first_sequence + i * b;
    // Micro-batch i's token ids and targets.
    let batch = |i: usize| {
        data.corpus.batch(
            Split::Train,
            data.seed,
            data.step,
            first(i),
            size(i),
            cfg.seq_len,
        )
    };

    let get_input = |i: usize, io: &mut Io<'_>, tracer: &mut Tracer| -> Result<StageInput> {
        let s = cfg.seq_len as i64;
        match role.prev {
            None => {
                let (inputs, _) = batch(i);
                Ok(StageInput::Tokens(
                    stage.device().from_slice(&inputs, &[size(i) as i64, s])?,
                ))
            }
            Some(_) => {
                let x = stage
                    .device()
                    .empty(stage.dtype(), &stage.input_shape(size(i)))?;
                tracer.span(
                    || format!("recv act {i}"),
                    "p2p",
                    || io.recv(&x, Peer::Prev),
                )?;
                Ok(StageInput::Hidden(x))
            }
        }
    };
    let targets = |i: usize| -> Result<Option<Tensor>> {
        if !role.range.head {
            return Ok(None);
        }
        let (_, t) = batch(i);
        Ok(Some(
            stage
                .device()
                .from_slice(&t, &[(size(i) * cfg.seq_len) as i64])?,
        ))
    };
    let mut forward = |i: usize,
                       x: StageInput,
                       io: &mut Io<'_>,
                       tracer: &mut Tracer,
                       saved: &mut VecDeque<Saved>|
     -> Result<()> {
        let t = targets(i)?;
        let (sv, out, l) = tracer.span(
            || format!("F{i}"),
            "forward",
            || {
                if !data.pass_delay.is_zero() {
                    std::thread::sleep(data.pass_delay);
                }
                stage.forward(x, t)
            },
        )?;
        if let (Some(_), Some(out)) = (role.next, out) {
            io.send(&out, Peer::Next, || format!("send act {i}"), tracer)?;
        }
        if let Some(l) = l {
            loss += f64::from(l) * weight(i);
        }
        saved.push_back(sv);
        Ok(())
    };
    let backward = |j: usize,
                    io: &mut Io<'_>,
                    tracer: &mut Tracer,
                    saved: &mut VecDeque<Saved>,
                    done: &mut dyn FnMut(usize) -> Result<()>|
     -> Result<(Option<Tensor>, Option<WeightGrads>)> {
        let sv = saved
            .pop_front()
            .expect("a forward pass precedes every backward pass");
        let g = match role.next {
            Some(_) => {
                let g = stage
                    .device()
                    .empty(stage.dtype(), &stage.output_shape(size(j)))?;
                tracer.span(
                    || format!("recv grad {j}"),
                    "p2p",
                    || io.recv(&g, Peer::Next),
                )?;
                Some(g)
            }
            None => None,
        };
        let last = j + 1 == m;
        if split(j) {
            let (g, work) = tracer.span(
                || format!("B{j}"),
                "backward",
                || stage.backward_split(sv, g, weight(j)),
            )?;
            return Ok((g, Some(work)));
        }
        let g = tracer.span(
            || format!("B{j}"),
            "backward",
            || match last {
                true => stage.backward_with(sv, g, weight(j), done),
                false => stage.backward(sv, g, weight(j)),
            },
        )?;
        Ok((g, None))
    };
    // The weight gradients of a split backward pass (after its send).
    let weights = |j: usize,
                   work: Option<WeightGrads>,
                   tracer: &mut Tracer,
                   done: &mut dyn FnMut(usize) -> Result<()>|
     -> Result<()> {
        match work {
            Some(work) if j + 1 == m => tracer.span(
                || format!("W{j}"),
                WEIGHTS,
                || stage.weight_pass(work, done),
            ),
            Some(work) => tracer.span(
                || format!("W{j}"),
                WEIGHTS,
                || stage.weight_pass(work, &mut |_| Ok(())),
            ),
            None => Ok(()),
        }
    };
    let send_grad =
        |j: usize, g: Option<Tensor>, io: &mut Io<'_>, tracer: &mut Tracer| match (role.prev, g) {
            (Some(_), Some(g)) => io.send(&g, Peer::Prev, || format!("send grad {j}"), tracer),
            _ => Ok(()),
        };

    // The weights' passes deferred to the end of the step.
    let mut deferred: Vec<(usize, WeightGrads)> = Vec::new();
    let mut weights_after = |j: usize,
                             work: Option<WeightGrads>,
                             tracer: &mut Tracer,
                             done: &mut dyn FnMut(usize) -> Result<()>|
     -> Result<()> {
        match (work, data.schedule.defers_weights()) {
            (Some(work), true) => {
                deferred.push((j, work));
                Ok(())
            }
            (work, _) => weights(j, work, tracer, done),
        }
    };

    for i in 0..warm {
        let x = get_input(i, io, tracer)?;
        forward(i, x, io, tracer, &mut saved)?;
    }
    let mut pending: Option<StageInput> = None;
    for j in 0..m - warm {
        let i = warm + j;
        let x = match pending.take() {
            Some(x) => x,
            None => get_input(i, io, tracer)?,
        };
        forward(i, x, io, tracer, &mut saved)?;
        let (g, work) = backward(j, io, tracer, &mut saved, &mut *done)?;
        if i + 1 < m && role.prev.is_some() && receive_first {
            pending = Some(get_input(i + 1, io, tracer)?);
        }
        send_grad(j, g, io, tracer)?;
        weights_after(j, work, tracer, &mut *done)?;
    }
    for j in m - warm..m {
        let (g, work) = backward(j, io, tracer, &mut saved, &mut *done)?;
        send_grad(j, g, io, tracer)?;
        weights_after(j, work, tracer, &mut *done)?;
    }
    for (j, work) in deferred {
        weights(j, Some(work), tracer, &mut *done)?;
    }
    Ok(loss)
}

/// Forward passes of the validation batch (`sequences` sequences in
/// micro-batches of the rank's size): on a last stage returns their mean
/// loss, elsewhere 0.
pub fn eval_step(
    stage: &Stage,
    role: &Role,
    data: StepData<'_>,
    sequences: usize,
    io: &mut Io<'_>,
    tracer: &mut Tracer,
) -> Result<f64> {
    let cfg = stage.config();
    let s = cfg.seq_len;
    let mut total = 0.0;
    let mut first = 0;
    while first < sequences {
        let b = role.micro_batch_size.min(sequences - first);
        let (inputs, targets) =
            data.corpus
                .batch(Split::Validation, data.seed, data.step, first, b, s);
        let x = match role.prev {
            None => StageInput::Tokens(stage.device().from_slice(&inputs, &[b as i64, s as i64])?),
            Some(_) => {
                let x = stage.device().empty(stage.dtype(), &stage.input_shape(b))?;
                io.recv(&x, Peer::Prev)?;
                StageInput::Hidden(x)
            }
        };
        let t = match role.range.head {
            true => Some(stage.device().from_slice(&targets, &[(b * s) as i64])?),
            false => None,
        };
        let (_, out, l) =
            tracer.span(|| format!("eval {first}"), "eval", || stage.forward(x, t))?;
        if let (Some(_), Some(out)) = (role.next, out) {
            io.send(&out, Peer::Next, || format!("eval send {first}"), tracer)?;
        }
        if let Some(l) = l {
            total += f64::from(l) * b as f64;
        }
        first += b;
    }
    Ok(total / sequences.max(1) as f64)
}

//! One rank's part of a training step under the 1F1B schedule, and of a
//! forward-only validation pass.
//!
//! Stage `s` of `p` with `m` micro-batches runs `w = min(p - s - 1, m)`
//! forward passes, then alternates one forward and one backward pass, then
//! runs the remaining `w` backward passes. Activations go to the next
//! stage and their gradients back through the communication layer
//! (device-direct or staged, as the two devices allow). Every link carries
//! activations and gradients strictly alternately in the steady phase: a
//! stage receives its next activation before it sends the gradient of the
//! previous one, so blocking sends of any size cannot deadlock.

use std::collections::VecDeque;

use polychip_comm::collectives::Communicator;
use polychip_comm::device::{DeviceComm, StagingPool};
use polychip_host::Tensor;

use crate::data::{Corpus, Split};
use crate::error::{Result, TrainError};
use crate::model::{Saved, Stage, StageInput};
use crate::plan::Role;
use crate::trace::Tracer;

/// Point-to-point transfers between this rank's stage and its neighbours.
#[derive(Debug)]
pub struct Links<'a> {
    comm: Option<&'a mut Communicator>,
    pool: StagingPool,
}

impl<'a> Links<'a> {
    /// Transfers over `comm` (none for a single-stage job), staging through `pool`.
    pub fn new(comm: Option<&'a mut Communicator>, pool: StagingPool) -> Links<'a> {
        Links { comm, pool }
    }

    /// The staging pool back, for the next step.
    pub fn into_pool(self) -> StagingPool {
        self.pool
    }

    fn with<T>(
        &mut self,
        f: impl FnOnce(&mut DeviceComm<'_>) -> polychip_comm::Result<T>,
    ) -> Result<T> {
        let comm = self.comm.as_deref_mut().ok_or_else(|| {
            TrainError::Plan("a pipeline of several stages needs a communicator".into())
        })?;
        let pool = std::mem::take(&mut self.pool);
        let mut dc = DeviceComm::with_pool(comm, pool);
        let out = f(&mut dc);
        self.pool = dc.into_pool();
        Ok(out?)
    }

    /// Sends `t` to rank `peer`.
    pub fn send(&mut self, t: &Tensor, peer: usize) -> Result<()> {
        self.with(|dc| dc.send(t, peer))
    }

    /// Receives into `t` from rank `peer`.
    pub fn recv(&mut self, t: &Tensor, peer: usize) -> Result<()> {
        self.with(|dc| dc.recv(t, peer))
    }
}

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
}

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
    links: &mut Links<'_>,
    tracer: &mut Tracer,
    done: &mut dyn FnMut(usize) -> Result<()>,
) -> Result<f64> {
    let (m, b) = (role.micro_batches, role.micro_batch_size);
    let warm = (role.stages - role.stage - 1).min(m);
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

    let get_input = |i: usize, links: &mut Links<'_>, tracer: &mut Tracer| -> Result<StageInput> {
        let s = cfg.seq_len as i64;
        match role.prev {
            None => {
                let (inputs, _) = batch(i);
                Ok(StageInput::Tokens(
                    stage.device().from_slice(&inputs, &[size(i) as i64, s])?,
                ))
            }
            Some(prev) => {
                let x = stage
                    .device()
                    .empty(stage.dtype(), &[size(i) as i64, s, cfg.dim as i64])?;
                tracer.span(|| format!("recv act {i}"), "p2p", || links.recv(&x, prev))?;
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
                       links: &mut Links<'_>,
                       tracer: &mut Tracer,
                       saved: &mut VecDeque<Saved>|
     -> Result<()> {
        let t = targets(i)?;
        let (sv, out, l) = tracer.span(|| format!("F{i}"), "forward", || stage.forward(x, t))?;
        if let (Some(next), Some(out)) = (role.next, out) {
            tracer.span(|| format!("send act {i}"), "p2p", || links.send(&out, next))?;
        }
        if let Some(l) = l {
            loss += f64::from(l) * weight(i);
        }
        saved.push_back(sv);
        Ok(())
    };
    let mut backward = |j: usize,
                        links: &mut Links<'_>,
                        tracer: &mut Tracer,
                        saved: &mut VecDeque<Saved>|
     -> Result<Option<Tensor>> {
        let sv = saved
            .pop_front()
            .expect("a forward pass precedes every backward pass");
        let g = match role.next {
            Some(next) => {
                let s = cfg.seq_len as i64;
                let g = stage
                    .device()
                    .empty(stage.dtype(), &[size(j) as i64, s, cfg.dim as i64])?;
                tracer.span(|| format!("recv grad {j}"), "p2p", || links.recv(&g, next))?;
                Some(g)
            }
            None => None,
        };
        tracer.span(
            || format!("B{j}"),
            "backward",
            || match j + 1 == m {
                true => stage.backward_with(sv, g, weight(j), &mut *done),
                false => stage.backward(sv, g, weight(j)),
            },
        )
    };
    let send_grad = |j: usize, g: Option<Tensor>, links: &mut Links<'_>, tracer: &mut Tracer| match (
        role.prev, g,
    ) {
        (Some(prev), Some(g)) => {
            tracer.span(|| format!("send grad {j}"), "p2p", || links.send(&g, prev))
        }
        _ => Ok(()),
    };

    for i in 0..warm {
        let x = get_input(i, links, tracer)?;
        forward(i, x, links, tracer, &mut saved)?;
    }
    let mut pending: Option<StageInput> = None;
    for j in 0..m - warm {
        let i = warm + j;
        let x = match pending.take() {
            Some(x) => x,
            None => get_input(i, links, tracer)?,
        };
        forward(i, x, links, tracer, &mut saved)?;
        let g = backward(j, links, tracer, &mut saved)?;
        if i + 1 < m && role.prev.is_some() {
            pending = Some(get_input(i + 1, links, tracer)?);
        }
        send_grad(j, g, links, tracer)?;
    }
    for j in m - warm..m {
        let g = backward(j, links, tracer, &mut saved)?;
        send_grad(j, g, links, tracer)?;
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
    links: &mut Links<'_>,
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
            Some(prev) => {
                let x = stage
                    .device()
                    .empty(stage.dtype(), &[b as i64, s as i64, cfg.dim as i64])?;
                links.recv(&x, prev)?;
                StageInput::Hidden(x)
            }
        };
        let t = match role.range.head {
            true => Some(stage.device().from_slice(&targets, &[(b * s) as i64])?),
            false => None,
        };
        let (_, out, l) =
            tracer.span(|| format!("eval {first}"), "eval", || stage.forward(x, t))?;
        if let (Some(next), Some(out)) = (role.next, out) {
            links.send(&out, next)?;
        }
        if let Some(l) = l {
            total += f64::from(l) * b as f64;
        }
        first += b;
    }
    Ok(total / sequences.max(1) as f64)
}

//! The step's data-parallel gradient reduction, overlapped with the last
//! backward pass.
//!
//! A rank's gradients are cut into buckets, runs of consecutive units (the
//! embedding, each half block, the head) inside one reduction group
//! ([`crate::dp`]), of at least [`BUCKET_BYTES`] each
//! ([`polychip_planner::overlap`]). The last micro-batch's backward pass
//! finishes the units from the last to the first; with the overlap on, a
//! reducer thread all-reduces each bucket as soon as the pass has left it,
//! while the pass goes on. Every rank of a group reduces the same buckets
//! in the same order (last unit first) whether or not it overlaps, so a run
//! gives the same bits either way, and ranks of one job may differ.
//!
//! The reducer works on its own sub-communicators (transfers between
//! stages have their own: [`crate::links`]), and on the device only through host-visible
//! memory or, for a staged device, copies on a stream of its own: the ABI
//! asks callers to serialize one stream's calls, and the main thread keeps
//! the default stream.

use std::ops::Range;
use std::sync::mpsc;
use std::thread;

use polychip_comm::collectives::ReduceOp;
use polychip_comm::device::{DeviceComm, Path, StagingPool};
use polychip_files::threads::{ThreadRefused, spawn_scoped};
use polychip_host::{Stream, Tensor};
use polychip_planner::overlap::{BUCKET_BYTES, reduction_buckets};

use crate::dp::{self, ReductionGroup};
use crate::error::{Result, TrainError};
use crate::model::Stage;
use crate::plan::Role;
use crate::trace::{REDUCER_CAT, Span, Tracer, now_us};

/// One bucket: parameters `params` (indices into [`Stage::params`]) of
/// reduction group `group`, and their packed f32 gradients.
#[derive(Debug)]
struct Bucket {
    group: usize,
    params: Range<usize>,
    grads: Tensor,
}

/// A rank's gradient reduction: its buckets in reduction order.
#[derive(Debug)]
pub struct Reducer {
    rank: usize,
    buckets: Vec<Bucket>,
    overlap: bool,
    /// The reducer thread's copy stream, for a staged device.
    stream: Option<Stream>,
}

impl Reducer {
    /// The reduction of `stage`, held by `role`, over its reduction
    /// `groups`; overlapped with the last backward pass when `overlap`.
    pub fn new(
        stage: &Stage,
        role: &Role,
        groups: &[ReductionGroup],
        overlap: bool,
    ) -> Result<Reducer> {
        let mut buckets = Vec::new();
        for (g, group) in groups.iter().enumerate() {
            let elements = |r: Range<usize>| stage.elements(r).len();
            for params in bucket_params(role, stage.config(), group.params.clone(), elements) {
                buckets.push(Bucket {
                    group: g,
                    grads: stage.grad_span(params.clone())?,
                    params,
                });
            }
        }
        // Last units first, across groups too: every rank then meets its
        // groups' collectives in one order (the model's, backwards).
        buckets.sort_by_key(|b| std::cmp::Reverse(b.params.start));
        let overlap = overlap && !buckets.is_empty();
        let stream = match overlap && Path::of(stage.device()) == Path::Staged {
            true => Some(stage.device().stream()?),
            false => None,
        };
        Ok(Reducer {
            rank: role.rank,
            buckets,
            overlap,
            stream,
        })
    }

    /// Runs one step's passes, `passes(tracer, done)`, and the reduction of the
    /// gradients they produce: `passes` must call `done(from)` as the
    /// gradients of parameters `from..` become final (as
    /// [`crate::pipeline::train_step`] does), and leaves them in
    /// `stage`'s gradients (bf16 ones are cast to the f32 ones here, unit
    /// by unit). Returns what `passes` returned once every bucket is
    /// reduced; the main thread's wait is traced as `grad all-reduce`,
    /// the reducer's buckets as `reduce` spans.
    pub fn step<T>(
        &mut self,
        stage: &Stage,
        groups: &mut [ReductionGroup],
        pool: &mut StagingPool,
        tracer: &mut Tracer,
        passes: impl FnOnce(&mut Tracer, &mut dyn FnMut(usize) -> Result<()>) -> Result<T>,
    ) -> Result<T> {
        let all = stage.params().len();
        if !self.overlap {
            let out = passes(tracer, &mut |_| Ok(()))?;
            stage.finish_grads()?;
            tracer.span(
                || "grad all-reduce".into(),
                "allreduce",
                || {
                    let ready = std::iter::once((0, now_us()));
                    let (rank, buckets) = (self.rank, &self.buckets);
                    reduce_in_order(rank, groups, buckets, ready, pool, None, &mut Vec::new())
                },
            )?;
            return Ok(out);
        }
        let (rank, buckets) = (self.rank, &self.buckets);
        let stream = self.stream.take();
        let mut reduced = std::mem::take(pool);
        // A reducer the system refuses fails the step (the rank fails, as
        // when its reduction fails), with the pool and stream it took.
        let (out, joined) = thread::scope(|scope| {
            let (tx, rx) = mpsc::channel::<(usize, f64)>();
            let reducer = spawn_scoped(
                scope,
                "reduce gradients during the backward pass",
                move || {
                    let mut spans = Vec::new();
                    let r = reduce_in_order(
                        rank,
                        groups,
                        buckets,
                        rx.into_iter(),
                        &mut reduced,
                        stream.as_ref(),
                        &mut spans,
                    );
                    (r, reduced, stream, spans)
                },
            )?;
            // The gradients final so far: parameters `from..`.
            let mut from = all;
            let mut done = |next: usize| -> Result<()> {
                if next < from {
                    stage.finish_grads_of(next..from)?;
                    from = next;
                    // A reducer that stopped has its error to report.
                    let _ = tx.send((next, now_us()));
                }
                Ok(())
            };
            let out = passes(tracer, &mut done).and_then(|out| done(0).map(|()| out));
            drop(tx);
            let waited = tracer.span(|| "grad all-reduce".into(), "allreduce", || reducer.join());
            Ok::<_, ThreadRefused>((out, waited))
        })
        .map_err(|e| stopped(self.rank, &e.to_string()))?;
        let (reduction, back, stream, spans) =
            joined.map_err(|_| stopped(self.rank, "the reducer thread panicked"))?;
        *pool = back;
        self.stream = stream;
        for s in spans {
            tracer.push(s);
        }
        // The passes' error comes first: a reducer whose passes stopped
        // only reports that they did.
        let out = out?;
        reduction?;
        Ok(out)
    }
}

/// The buckets of the reduction group holding parameters `group` (indices
/// into the stage's parameters) of `role`'s stage, in reduction order, as
/// parameter ranges; `elements(r)` counts the elements of parameters `r`
/// (their f32 gradients take 4 bytes each).
fn bucket_params(
    role: &Role,
    cfg: &crate::config::ModelConfig,
    group: Range<usize>,
    elements: impl Fn(Range<usize>) -> usize,
) -> Vec<Range<usize>> {
    let inside: Vec<Range<usize>> = dp::unit_params(role, cfg)
        .into_iter()
        .map(|(_, r)| r)
        .filter(|r| group.start <= r.start && r.end <= group.end)
        .collect();
    let bytes: Vec<u64> = inside
        .iter()
        .map(|r| 4 * elements(r.clone()) as u64)
        .collect();
    reduction_buckets(&bytes, BUCKET_BYTES)
        .into_iter()
        .map(|b| inside[b.start].start..inside[b.end - 1].end)
        .collect()
}

/// Reduces `buckets` in order, each once `ready` has said the gradients
/// from its first parameter on are final (the values it yields fall, each
/// with the time it was said); a `ready` that ends first means the passes
/// stopped. A bucket's span starts when it could: when it was ready or the
/// previous bucket done, whichever is later (the thread's waking up, which
/// a loaded machine can delay past the backward pass, is the reduction's
/// time too).
fn reduce_in_order(
    rank: usize,
    groups: &mut [ReductionGroup],
    buckets: &[Bucket],
    mut ready: impl Iterator<Item = (usize, f64)>,
    pool: &mut StagingPool,
    stream: Option<&Stream>,
    spans: &mut Vec<Span>,
) -> Result<()> {
    let (mut from, mut said, mut free) = (usize::MAX, 0.0, 0.0);
    for (k, b) in buckets.iter().enumerate() {
        while from > b.params.start {
            (from, said) = ready.next().ok_or_else(|| {
                stopped(
                    rank,
                    "the backward pass stopped before its gradients were final",
                )
            })?;
        }
        let start = f64::max(said, free).min(now_us());
        let group = &mut groups[b.group];
        let mut dc = DeviceComm::with_pool(&mut group.comm, std::mem::take(pool));
        if let Some(s) = stream {
            dc = dc.on_stream(s);
        }
        let r = dc.all_reduce(&b.grads, ReduceOp::Sum);
        *pool = dc.into_pool();
        r.map_err(|e| {
            let name = format!("the reduction group of ranks {:?}", group.members);
            e.in_group(&group.members, &name)
        })?;
        free = now_us();
        spans.push(Span {
            name: format!("reduce bucket {k}"),
            cat: REDUCER_CAT,
            start_us: start,
            dur_us: free - start,
        });
    }
    Ok(())
}

fn stopped(rank: usize, why: &str) -> TrainError {
    TrainError::Comm(polychip_comm::CommError::Io {
        rank,
        op: "gradient reduction".into(),
        message: why.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;
    use crate::params::stage_params;
    use crate::plan::TrainPlan;

    /// `deep`'s whole model (docs/performance.md quotes these): three
    /// buckets from the head back, of 1.13, 1.11 and 0.85 MB, covering
    /// every parameter once.
    #[test]
    fn deeps_gradients_make_three_buckets_from_the_head_back() {
        let cfg = ModelConfig::preset("deep").unwrap();
        let role = TrainPlan::single("ferrite:0", cfg.layers, 1, 1).roles()[0].clone();
        let specs = stage_params(&cfg, &role.range);
        let elements = |r: Range<usize>| specs[r].iter().map(|p| p.numel()).sum::<usize>();
        let buckets = bucket_params(&role, &cfg, 0..specs.len(), elements);
        let bytes: Vec<usize> = buckets.iter().map(|b| 4 * elements(b.clone())).collect();
        assert_eq!(bytes, [1_125_376, 1_108_992, 854_272]);
        assert_eq!(buckets.last().unwrap().start, 0);
        assert_eq!(buckets[0].end, specs.len());
        assert!(buckets.windows(2).all(|w| w[1].end == w[0].start));
    }
}

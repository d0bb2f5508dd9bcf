//! `--plan auto`: HeteroAuto on the devices at hand. Every device is
//! profiled on the real model, all at once, each on its rank's cores
//! (forward and backward of a micro-batch through the embedding alone, a
//! stage of blocks, each half of a block and the head alone, and the
//! optimizer step, so that each cost is measured, not told apart by
//! subtraction; and the stage of blocks again holding a second
//! micro-batch in flight, as a pipeline's stages before the last run it); the planner's measured-cost search
//! (`polychip_planner::measured`) then evaluates every pipeline order and
//! half-block split and the data-parallel deal of the batch in sequences
//! with its simulator, under each schedule the job allows, and the layout
//! expecting the shortest step when each kind's profile may be off by
//! [`Choices::profile_error`] ([`polychip_planner::uncertainty`]) becomes
//! the job's layout.

use std::time::{Duration, Instant};

use polychip_host::Device;
use polychip_planner::measured::{
    self, Layouts, MeasuredDevice, MeasuredModel, MeasuredPlan, SizedCosts,
};
use polychip_planner::schedule::{AUTO_RUN_AHEAD, PipelineSchedule};

use crate::config::{ModelConfig, TrainConfig};
use crate::error::{Result, TrainError};
use crate::memory;
use crate::model::{Stage, StageInput};
use crate::params::{ATTENTION_PARAMS, Cut, StageRange, stage_params};
use crate::plan::{GroupPlan, StagePlan, TrainPlan};
use crate::trainer::device_name;

/// A device's measured costs on this model, per micro-batch, seconds.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Profile {
    /// The device profiled, `vendor:index`.
    pub device: String,
    /// Sequences per micro-batch.
    pub micro_batch: usize,
    /// Activation bytes one block keeps per micro-batch (measured when
    /// two or more blocks fit the device).
    pub block_activation_bytes: Option<u64>,
    /// The most device memory the host held while profiling.
    pub peak_memory_bytes: u64,
    /// Costs in the planner's terms.
    pub costs: MeasuredDevice,
}

impl Profile {
    /// Forward plus backward of one block.
    pub fn block_seconds(&self) -> f64 {
        self.costs.block_forward + self.costs.block_backward
    }
}

/// Median seconds of a micro-batch through `stage`: its forward pass, its
/// backward pass's input gradients and its weights' gradients (timed
/// apart, as the zero-bubble schedule runs them; together the backward
/// pass), with `whole` the backward pass run whole too (after a forward
/// pass of its own), and the device bytes its forward keeps for the
/// backward (what the host holds after the forward less before it).
///
/// With `held` each micro-batch's backward pass runs after the next
/// micro-batch's forward, as a 1F1B pipeline's stages before the last run
/// them, the stage holding two micro-batches' activations; without it,
/// right after its own forward, as a device alone and the last stage do.
fn time_passes(stage: &Stage, b: usize, reps: usize, whole: bool, held: bool) -> Result<Timed> {
    let cfg = stage.config().clone();
    // Any valid tokens do: the costs do not depend on the values.
    let token = |i: usize| (i * 37 % cfg.vocab) as i32;
    let tokens: Vec<i32> = (0..b * cfg.seq_len).map(token).collect();
    let targets: Vec<i32> = (1..=b * cfg.seq_len).map(token).collect();
    let dev = stage.device();
    let shape = [b as i64, cfg.seq_len as i64, cfg.dim as i64];
    let grad: Vec<f32> = (0..b * cfg.seq_len * cfg.dim)
        .map(|i| ((i % 7) as f32 - 3.0) * 1e-3)
        .collect();
    let (mut fw, mut bw, mut ww, mut fused) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut kept = 0u64;
    // Forward passes run whose backward has not: (what the backward
    // needs, the head's targets, the output gradient, the same input
    // again for the whole pass).
    let mut pending = std::collections::VecDeque::new();
    let depth = 1 + usize::from(held);
    for _ in 0..reps + depth {
        let input = match stage.range().embed {
            true => StageInput::Tokens(dev.from_slice(&tokens, &[b as i64, cfg.seq_len as i64])?),
            false => {
                let x = dev.empty(stage.dtype(), &shape)?;
                dev.exec().fill(&x, 0.5)?;
                StageInput::Hidden(x)
            }
        };
        let t = match stage.range().head {
            true => Some(dev.from_slice(&targets, &[(b * cfg.seq_len) as i64])?),
            false => None,
        };
        let g = match stage.range().head {
            true => None,
            false => {
                let g32 = dev.from_slice(&grad, &shape)?;
                let g = dev.empty(stage.dtype(), &shape)?;
                dev.exec().cast(&g32, &g)?;
                Some(g)
            }
        };
        let again = match &input {
            StageInput::Tokens(x) => StageInput::Tokens(x.clone()),
            StageInput::Hidden(x) => StageInput::Hidden(x.clone()),
        };
        let before = dev.memory_in_use();
        let start = Instant::now();
        let (saved, _, _) = stage.forward(input, t.clone())?;
        fw.push(start.elapsed().as_secs_f64());
        kept = kept.max(dev.memory_in_use().saturating_sub(before));
        pending.push_back((saved, t, g, again));
        if pending.len() < depth {
            continue;
        }
        let Some((saved, t, g, again)) = pending.pop_front() else {
            continue;
        };
        let mid = Instant::now();
        let (_, work) = stage.backward_split(saved, g.clone(), 1.0)?;
        let input_done = Instant::now();
        stage.weight_pass(work, &mut |_| Ok(()))?;
        bw.push((input_done - mid).as_secs_f64());
        ww.push(input_done.elapsed().as_secs_f64());
        if whole {
            // The same backward pass run whole.
            let (saved, _, _) = stage.forward(again, t)?;
            let start = Instant::now();
            stage.backward(saved, g, 1.0)?;
            fused.push(start.elapsed().as_secs_f64());
        }
    }
    let med = |mut v: Vec<f64>| {
        v.remove(0);
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(Timed {
        forward: med(fw),
        input_pass: med(bw),
        weight_pass: med(ww),
        fused: if whole { med(fused) } else { 0.0 },
        kept,
    })
}

/// How far the halves' stages may exceed the long stage's block, as a
/// share of it, before the excess counts as a fixed cost per stage: the
/// machine's noise (two timings of one stage differ by 1-3% here).
const STAGE_OVERHEAD_NOISE: f64 = 0.05;

/// The fixed cost a stage pays per micro-batch whatever it holds, from a
/// stage of each half of a block alone (`attention`, `ffn`) and a stage of
/// `k` blocks (`long`), seconds: with `o` that cost and `B` a block,
/// `attention + ffn = B + 2o` and `long = kB + o`. 0 where the halves
/// exceed the long stage's block by no more than the noise
/// ([`STAGE_OVERHEAD_NOISE`]). A cost of this kind (a launch or a
/// synchronisation per stage, memory mapped afresh) is spread thin over a
/// long stage's blocks and paid whole by a short stage, so a plan balanced
/// on the long stage's blocks alone runs its short stages slow.
fn stage_overhead(attention: f64, ffn: f64, long: f64, k: f64) -> f64 {
    let block = long / k;
    let excess = attention + ffn - block;
    if excess.is_nan() || excess <= STAGE_OVERHEAD_NOISE * block {
        return 0.0;
    }
    (excess / (2.0 - 1.0 / k)).min(long / 2.0)
}

/// One stage's passes as [`time_passes`] measures them: medians, seconds.
struct Timed {
    forward: f64,
    /// The backward pass's input gradients (split as zero bubble runs it).
    input_pass: f64,
    /// Its weights' gradients, right after.
    weight_pass: f64,
    /// The backward pass run whole (0 when not asked for).
    fused: f64,
    /// Device bytes the forward keeps for the backward.
    kept: u64,
}

impl Timed {
    /// The split backward pass.
    fn backward(&self) -> f64 {
        self.input_pass + self.weight_pass
    }
}

/// Profiles `device` on `cfg` with micro-batches of `b` sequences: the
/// embedding alone, a stage of blocks alone (all, up to 16), the head
/// alone, and the optimizer step, each timed as it runs in a pipeline, so
/// that block, embedding, head and optimizer costs are each measured, not
/// told apart by subtraction; and the stage of blocks holding a second
/// micro-batch in flight, for what holding costs a pipeline's stages
/// before the last.
pub fn profile(cfg: &ModelConfig, t: &TrainConfig, device: &Device, b: usize) -> Result<Profile> {
    profile_repeated(cfg, t, device, b, 5)
}

/// [`profile`] with `reps` timed repetitions of each measurement (medians;
/// the stage of many blocks gets `reps / 2 + 1`).
pub fn profile_repeated(
    cfg: &ModelConfig,
    t: &TrainConfig,
    device: &Device,
    b: usize,
    reps: usize,
) -> Result<Profile> {
    let reps = reps.max(1);
    let range = |blocks, embed, head| StageRange {
        start: Cut::at(0),
        end: Cut::block(blocks),
        embed,
        head,
    };
    // Each stage profiled below must fit the device: refused first, in a
    // sentence, where a model too large for it used to take minutes and
    // gigabytes of host memory building weights the device then refused
    // (or the host's allocator aborted).
    let have = device.props().memory_bytes;
    let need = |r: &StageRange| memory::stage_memory(cfg, t.precision, r, b, 1);
    for (what, r) in [
        ("its embedding alone", range(0, true, false)),
        ("its output head alone", range(0, false, true)),
        ("one of its blocks", range(1, false, false)),
    ] {
        let need = need(&r);
        if need.total() > have {
            let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
            return Err(TrainError::Plan(format!(
                "{} cannot hold {what} with micro-batches of {b} sequences of {}: that needs \
                 {:.1} MiB (weights and optimizer {:.1} MiB, activations {:.1} MiB, work \
                 buffers {:.1} MiB) but the device has {:.1} MiB, so the model cannot be \
                 profiled or trained on it; use a smaller model, sequence length or \
                 micro-batch",
                device_name(device),
                cfg.seq_len,
                mib(need.total()),
                mib(need.state),
                mib(need.activations),
                mib(need.transient),
                mib(have)
            )));
        }
    }
    device.reset_peak_memory();
    let st = |r| Stage::new(cfg, r, t.precision, device, 0);
    // Each end of the model alone (a stage of no blocks, as a pipeline may
    // run it): measured directly, where the difference of two noisy
    // stage times moved a slow chip's embedding between 0 and several
    // milliseconds from one profile to the next.
    let e0 = time_passes(&st(range(0, true, false))?, b, reps, false, false)?;
    let h0 = time_passes(&st(range(0, false, true))?, b, reps, false, false)?;
    // Blocks from a stage of all of them (up to 16, fewer when they do not
    // fit the device): a stage of many blocks no longer fits the caches
    // that one or two blocks fit, and its blocks cost more.
    let mut many = cfg.layers.min(16);
    let fits = |n: usize| {
        let need = memory::stage_memory(cfg, t.precision, &range(n, false, false), b, 1);
        need.total() <= device.props().memory_bytes
    };
    while many > 1 && !fits(many) {
        many /= 2;
    }
    let blocks = st(range(many, false, false))?;
    let bn = time_passes(&blocks, b, reps / 2 + 1, true, false)?;
    // The same stage holding a second micro-batch in flight, as a 1F1B
    // pipeline's stages before the last run it: its passes over the
    // stage's alone give what holding costs (at least nothing: holding
    // saves no work, and a ratio under 1 is the machine's noise).
    let bh = time_passes(&blocks, b, reps / 2 + 1, false, true)?;
    let held_ratio = |held: f64, alone: f64| (held / alone.max(f64::MIN_POSITIVE)).clamp(1.0, 2.0);
    let held = (
        held_ratio(bh.forward, bn.forward),
        held_ratio(bh.backward(), bn.backward()),
    );
    drop(blocks);
    let k = many as f64;
    // How a block's time divides between its halves (a pipeline may cut a
    // block between them): each half alone, as a stage of that half only,
    // gives the shares, which apply to the block's time from the stage of
    // many.
    let half = |h: usize| StageRange {
        start: Cut::at(h),
        end: Cut::at(h + 1),
        embed: false,
        head: false,
    };
    let att = time_passes(&st(half(0))?, b, reps, false, false)?;
    let ffn = time_passes(&st(half(1))?, b, reps, false, false)?;
    // What every stage pays besides its parts: each stage timed here pays
    // it once, so the ends and the blocks are of the parts alone without it.
    // Every stage of one part timed here pays it too, so it is no more
    // than the cheapest of them (a larger estimate is the noise's).
    let cheapest = |pass: fn(&Timed) -> f64| {
        [&e0, &h0, &att, &ffn]
            .into_iter()
            .map(pass)
            .fold(f64::INFINITY, f64::min)
    };
    let overhead = (
        stage_overhead(att.forward, ffn.forward, bn.forward, k).min(cheapest(|t| t.forward)),
        stage_overhead(att.backward(), ffn.backward(), bn.backward(), k)
            .min(cheapest(Timed::backward)),
    );
    let embed = (
        (e0.forward - overhead.0).max(0.0),
        (e0.backward() - overhead.1).max(0.0),
    );
    let head = (
        (h0.forward - overhead.0).max(0.0),
        (h0.backward() - overhead.1).max(0.0),
    );
    let block = (
        (bn.forward - overhead.0) / k,
        (bn.backward() - overhead.1) / k,
    );
    // The weights' gradients are part of the backward pass.
    let block_weights = (bn.weight_pass / k).min(block.1);
    let share = |a: f64, f: f64| if a + f > 0.0 { a / (a + f) } else { 0.5 };
    let attention = (
        block.0 * share(att.forward - overhead.0, ffn.forward - overhead.0),
        block.1 * share(att.backward() - overhead.1, ffn.backward() - overhead.1),
    );
    // What the blocks keep, their first block's input included: that one
    // was allocated before the forward (it is the stage's input), so the
    // memory that grew during it misses it.
    let input_bytes = (b * cfg.seq_len * cfg.dim * t.precision.dtype().size()) as u64;
    let block_activation_bytes = Some((bn.kept + input_bytes) / many as u64);
    // The optimizer step of a two-block stage with both ends, per
    // parameter (of one block where that does not fit).
    let both = range(cfg.layers.min(2), true, true);
    let opt_stage = match need(&both).total() <= have {
        true => st(both)?,
        false => st(range(1, false, false))?,
    };
    let params: usize = opt_stage.params().iter().map(|p| p.spec.numel()).sum();
    let mut times = Vec::new();
    for step in 1..=reps as u64 + 1 {
        let start = Instant::now();
        opt_stage.finish_grads()?;
        opt_stage.grad_sum_squares()?;
        opt_stage.scale_grads(1.0)?;
        opt_stage.adamw(t, step, t.lr)?;
        times.push(start.elapsed().as_secs_f64());
    }
    times.remove(0);
    times.sort_by(f64::total_cmp);
    let name = device_name(device);
    Ok(Profile {
        device: name.clone(),
        micro_batch: b,
        block_activation_bytes,
        peak_memory_bytes: device.peak_memory_in_use(),
        costs: MeasuredDevice {
            name,
            block_forward: block.0,
            block_backward: block.1,
            attention_forward: attention.0,
            attention_backward: attention.1,
            embed_forward: embed.0,
            embed_backward: embed.1,
            head_forward: head.0,
            head_backward: head.1,
            optimizer_per_param: times[times.len() / 2] / params as f64,
            block_weight_grad: block_weights,
            head_weight_grad: h0.weight_pass.min(head.1),
            // The same work as the split passes, less their overhead: a
            // ratio above 1 (or far below) is the machine's noise.
            fused_backward_ratio: (bn.fused / bn.backward().max(f64::MIN_POSITIVE)).clamp(0.5, 1.0),
            held_forward_ratio: held.0,
            held_backward_ratio: held.1,
            stage_forward: overhead.0,
            stage_backward: overhead.1,
        },
    })
}

/// Which layouts `--plan auto` may choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoMode {
    /// The fastest of all (`auto`).
    Best,
    /// One pipeline over all the devices (HeteroPP, `auto-pp`).
    Pipeline,
    /// Whole-model replicas on all the devices, the batch dealt by speed
    /// (`auto-dp`).
    Replicas,
}

impl AutoMode {
    /// Parses `auto`, `auto-pp` or `auto-dp`.
    pub fn parse(s: &str) -> Option<AutoMode> {
        match s {
            "auto" => Some(AutoMode::Best),
            "auto-pp" => Some(AutoMode::Pipeline),
            "auto-dp" => Some(AutoMode::Replicas),
            _ => None,
        }
    }
}

/// Whether profile `name` (`vendor:index`) is of the same kind as `d`.
fn same_kind(name: &str, d: &Device) -> bool {
    let vendor = d.plugin().vendor().to_lowercase();
    name.split_once(':').is_some_and(|(v, _)| v == vendor)
}

/// The profile whose every cost is the median of `ps`'s (all of one kind
/// and size; the first's name and size, the largest memory figures).
fn median_profile(ps: &[Profile]) -> Profile {
    let first = &ps[0];
    let mut costs = first.costs.clone();
    let mut all: Vec<MeasuredDevice> = ps.iter().map(|p| p.costs.clone()).collect();
    for cost in MeasuredDevice::COSTS {
        let mut v: Vec<f64> = all.iter_mut().map(|c| *cost(c)).collect();
        v.sort_by(f64::total_cmp);
        *cost(&mut costs) = v[v.len() / 2];
    }
    // The ratios, each the median of the profiles'.
    let ratios: [fn(&mut MeasuredDevice) -> &mut f64; 3] = [
        |c| &mut c.fused_backward_ratio,
        |c| &mut c.held_forward_ratio,
        |c| &mut c.held_backward_ratio,
    ];
    for ratio in ratios {
        let mut v: Vec<f64> = all.iter_mut().map(|c| *ratio(c)).collect();
        v.sort_by(f64::total_cmp);
        *ratio(&mut costs) = v[v.len() / 2];
    }
    Profile {
        device: first.device.clone(),
        micro_batch: first.micro_batch,
        block_activation_bytes: ps.iter().filter_map(|p| p.block_activation_bytes).max(),
        peak_memory_bytes: ps.iter().map(|p| p.peak_memory_bytes).max().unwrap_or(0),
        costs,
    }
}

/// How long [`profile_side_by_side`] profiles at least.
pub const MIN_PROFILE: Duration = Duration::from_secs(2);

/// One device's share of a side-by-side profile: `device` at every size of
/// `sizes`, round after round, from `began` until `stop` says to (checked
/// before each size, once this device has finished a round that ended at
/// least [`MIN_PROFILE`] after `began`, the moment it calls
/// `finished_round`, once). Returns each measurement with the moment it
/// ended.
///
/// A profile that stops when every device has finished such a round has no
/// device's first round on an idle machine, and a fast device's medians
/// over several rounds (one round of Ferrite's takes a fraction of a
/// second, and on a shared machine one round alone once made it pick
/// micro-batches of 1, 25% slower than its best).
pub fn profile_rounds(
    cfg: &ModelConfig,
    t: &TrainConfig,
    device: &Device,
    sizes: &[usize],
    began: Instant,
    stop: &dyn Fn() -> bool,
    finished_round: &mut dyn FnMut(),
) -> Result<Vec<(Profile, Instant)>> {
    let mut out = Vec::new();
    let mut finished = false;
    loop {
        for &b in sizes {
            if finished && stop() {
                return Ok(out);
            }
            out.push((profile(cfg, t, device, b)?, Instant::now()));
        }
        if !finished && began.elapsed() >= MIN_PROFILE {
            finished = true;
            finished_round();
        }
    }
}

/// The profiles of `devices`' kinds at each of `sizes`, from the
/// measurements of a side-by-side profile (each with whether it ended
/// while every device was still profiling): one per kind (vendor) and
/// size, the per-cost median over that kind's devices and rounds. A
/// measurement that ended after some device had stopped counts only where
/// its kind has none that did not.
pub fn kind_medians(
    devices: &[Device],
    sizes: &[usize],
    measured: &[(Profile, bool)],
) -> Result<Vec<Profile>> {
    let mut profiles = Vec::new();
    for d in devices {
        if profiles.iter().any(|p: &Profile| same_kind(&p.device, d)) {
            continue;
        }
        for &b in sizes {
            let of_kind: Vec<&(Profile, bool)> = measured
                .iter()
                .filter(|(p, _)| p.micro_batch == b && same_kind(&p.device, d))
                .collect();
            let beside: Vec<Profile> = of_kind
                .iter()
                .filter(|(_, beside)| *beside)
                .map(|(p, _)| p.clone())
                .collect();
            let chosen = match beside.is_empty() {
                false => beside,
                true => of_kind.iter().map(|(p, _)| p.clone()).collect(),
            };
            if chosen.is_empty() {
                return Err(TrainError::Plan(format!(
                    "the profile of {} has no measurement at a micro-batch size of {b}",
                    device_name(d)
                )));
            }
            profiles.push(median_profile(&chosen));
        }
    }
    Ok(profiles)
}

/// Profiles every device of `devices` at every size of `sizes`, all at
/// once, as the job will run them: one thread per device of this process,
/// pinned (when `cores` is given) to the share of `cores` its rank would
/// get, so that each device is timed while the others load the machine as
/// they will in training. On a machine whose cores share caches, memory
/// bandwidth or a clock budget, a device timed with the other cores idle
/// may run faster than it will beside the others, and a search fed such
/// times balances the stages and deals the batch for a machine that is not
/// the one the job runs on (on this 2-core machine, over 16 rounds,
/// Ferrite alone beside a training load and alone on an idle machine
/// agreed within 2%, inside the machine's own noise; see
/// docs/performance.md). Each device runs [`profile_rounds`] until every
/// one has finished a round; [`kind_medians`] combines them.
///
/// Threads of one process are not ranks of a job: a plugin that runs its
/// kernels on a process-wide thread pool runs them where the pool was
/// started (the first thread to use it), so devices of such a kind share
/// that pool's cores here, and a device may share a core with another
/// than it will in the job. `polychip train --plan auto` profiles each
/// device in a process of its own, bound as its rank will be.
pub fn profile_side_by_side(
    cfg: &ModelConfig,
    t: &TrainConfig,
    devices: &[Device],
    sizes: &[usize],
    cores: Option<&[usize]>,
) -> Result<Vec<Profile>> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let n = devices.len();
    let finished = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let all_done: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let began = Instant::now();
    let runs: Vec<Result<Vec<(Profile, Instant)>>> = std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(n);
        for (i, d) in devices.iter().enumerate() {
            let (finished, failed, all_done) = (&finished, &failed, &all_done);
            let started = polychip_files::threads::spawn_scoped(
                s,
                "profile a device",
                move || -> Result<Vec<(Profile, Instant)>> {
                    if let Some(cores) = cores {
                        let mine = crate::pin::share(cores, i, n);
                        if let Err(e) = crate::pin::pin(&mine) {
                            // The others stop after their first round.
                            failed.store(true, Ordering::Release);
                            return Err(TrainError::Plan(format!(
                                "pinning the profile of {d} to {mine:?}: {e}"
                            )));
                        }
                    }
                    let stop =
                        || finished.load(Ordering::Acquire) == n || failed.load(Ordering::Acquire);
                    let mut count = || {
                        if finished.fetch_add(1, Ordering::AcqRel) + 1 == n {
                            let _ = all_done.set(Instant::now());
                        }
                    };
                    profile_rounds(cfg, t, d, sizes, began, &stop, &mut count)
                        .inspect_err(|_| failed.store(true, Ordering::Release))
                },
            );
            match started {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // The profiles already started stop after their
                    // first round, and are joined before the error.
                    failed.store(true, Ordering::Release);
                    let refused = Err(TrainError::Plan(format!("profiling {d}: {e}")));
                    return vec![refused];
                }
            }
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut all: Vec<(Profile, bool)> = Vec::new();
    let done = all_done.get().copied();
    for r in runs {
        all.extend(
            r?.into_iter()
                .map(|(p, at)| (p, done.is_none_or(|done| at <= done))),
        );
    }
    kind_medians(devices, sizes, &all)
}

/// The relative error `--plan auto` assumes of each kind's profile by
/// default: the bundled devices' passes in training land within 1-4% of
/// their profile, and the efficiency bench's rounds spread by a sigma of
/// 0.3-1.3 points, on a quiet machine (docs/performance.md, stop 34; 10%,
/// the default until then, was set when Cobalt's short stages ran 7-11%
/// over their profile and identical runs differed by about 10% on a busy
/// machine, where `--profile-error 0.1` still suits).
pub const PROFILE_ERROR: f64 = 0.05;

/// What the trainer will do that the search prices.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choices {
    /// Data-parallel replicas may shard the optimizer step (the search
    /// prices both ways and picks).
    pub shard_optimizer: bool,
    /// The gradient reduction overlaps the last backward pass
    /// ([`crate::reduce`]).
    pub overlap_reduction: bool,
    /// Pipeline sends go on the rank's sender thread ([`crate::links`]):
    /// a stage does not wait for its transfers.
    pub async_sends: bool,
    /// The pipelines' schedule: `None` to price each layout under every
    /// schedule the sends allow (zero bubble needs queued sends) and take
    /// the faster.
    pub schedule: Option<PipelineSchedule>,
    /// The relative error assumed of each kind's profile: the search
    /// takes the layout expecting the shortest step under it
    /// ([`polychip_planner::uncertainty`]); 0 takes the shortest
    /// predicted step.
    pub profile_error: f64,
}

impl Choices {
    /// The schedules the search prices for a job whose ranks do or do not
    /// share cores (`oversubscribed`). Zero bubble needs queued sends, and
    /// is left out where ranks share cores: the simulator counts two
    /// stages as computing at once, which two stages on one core do not,
    /// and zero bubble's stages run further ahead, each taking the core
    /// from the other (three vendors on two cores measured its step 1.19x
    /// 1F1B's, docs/performance.md). Asked for, it is priced anyway.
    /// 1F1B with deferred weights is left out there too: what it gains is
    /// the last stages' weights' passes running while the first drains,
    /// two stages computing at once.
    fn schedules(&self, oversubscribed: bool) -> Vec<PipelineSchedule> {
        use PipelineSchedule::{OneFOneB, OneFOneBDeferred, ZeroBubble};
        match (self.schedule, oversubscribed, self.async_sends) {
            (Some(s), ..) => vec![s],
            (None, true, _) => vec![OneFOneB],
            (None, false, false) => vec![OneFOneB, OneFOneBDeferred],
            (None, false, true) => vec![OneFOneB, OneFOneBDeferred, ZeroBubble],
        }
    }
}

/// Where [`auto_plan`]'s profiles of the devices come from.
pub enum Profiles<'a> {
    /// Measured now, every device at once on threads of this process, each
    /// on the share of the cores its rank would get
    /// ([`profile_side_by_side`]).
    SideBySide,
    /// Measured by the caller at the micro-batch sizes it is given, one
    /// profile per kind and size (as [`kind_medians`] gives them):
    /// `polychip train` profiles each device in a process of its own,
    /// bound as its rank will be.
    Measure(&'a mut dyn FnMut(&[usize]) -> Result<Vec<Profile>>),
    /// Read from a profile file ([`from_file`]), named in errors by the
    /// label.
    File(&'a polychip_planner::profile::ProfileFile, &'a str),
}

impl std::fmt::Debug for Profiles<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Profiles::SideBySide => f.write_str("SideBySide"),
            Profiles::Measure(_) => f.write_str("Measure(..)"),
            Profiles::File(_, label) => write!(f, "File({label:?})"),
        }
    }
}

/// Plans `cfg` over `devices` (any mix of vendors): profiles every device
/// on the model at once, each on the share of `cores` its rank would get,
/// or takes their kinds' profiles from where `profiles` says, then
/// searches the layouts `mode` allows with each kind's measured costs
/// ([`polychip_planner::measured`]); data-parallel layouts may shard the
/// optimizer step when `choices` allow it (the search prices both), and
/// pipelines run whichever schedule `choices` allow predicts faster (the
/// plan names it). Returns the plan (with the predicted step time; with
/// `cores`, the order the devices take them in), the search's answer and
/// the profiles (one per kind and micro-batch size).
pub fn auto_plan(
    cfg: &ModelConfig,
    t: &TrainConfig,
    devices: &[Device],
    mode: AutoMode,
    choices: Choices,
    cores: Option<&[usize]>,
    profiles: Profiles<'_>,
) -> Result<(TrainPlan, MeasuredPlan, Vec<Profile>)> {
    if devices.is_empty() {
        return Err(TrainError::Plan(
            "--plan auto: no devices to plan over".into(),
        ));
    }
    let gb = t.global_batch;
    let which = match mode {
        AutoMode::Best => Layouts::All,
        AutoMode::Pipeline => Layouts::Pipelines,
        AutoMode::Replicas => Layouts::Replicas,
    };
    // Micro-batch sizes to try: a chip's speed depends on it, and smaller
    // micro-batches shrink the pipeline bubble and deal the batch finer.
    let sizes: Vec<usize> = [4, 2, 1]
        .into_iter()
        .filter(|b| gb % b == 0 && gb / b >= devices.len())
        .collect();
    if sizes.is_empty() {
        return Err(TrainError::Plan(format!(
            "--plan auto: a global batch of {gb} cannot give each of the {} devices a \
             micro-batch",
            devices.len()
        )));
    }
    let (profiles, sizes) = match profiles {
        Profiles::File(file, label) => from_file(file, label, cfg, t, devices, &sizes)?,
        Profiles::SideBySide => (profile_side_by_side(cfg, t, devices, &sizes, cores)?, sizes),
        Profiles::Measure(measure) => (measure(&sizes)?, sizes),
    };
    // More ranks than the cores they run on (pinned, or the machine's).
    let available = match cores {
        Some(c) => c.len(),
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let schedules = choices.schedules(devices.len() > available);
    let mut best: Option<(MeasuredPlan, Vec<MeasuredDevice>, PipelineSchedule)> = None;
    let mut by_size: Vec<SizedCosts> = Vec::new();
    // Each device's best step alone over the sizes: the speedup ratio's
    // baseline is each chip at its own best micro-batch size.
    let mut alone = vec![f64::INFINITY; devices.len()];
    for &b in &sizes {
        let costs = devices
            .iter()
            .map(|d| {
                let kind = profiles
                    .iter()
                    .find(|p| p.micro_batch == b && same_kind(&p.device, d))
                    .ok_or_else(|| {
                        TrainError::Plan(format!(
                            "--plan auto: no profile of {}'s kind at a micro-batch size of {b}",
                            device_name(d)
                        ))
                    })?;
                Ok(MeasuredDevice {
                    name: device_name(d),
                    ..kind.costs.clone()
                })
            })
            .collect::<Result<Vec<MeasuredDevice>>>()?;
        let fits = |d: usize, s: measured::Span, in_flight: usize| {
            span_fits(cfg, t, &devices[d], s, b, in_flight)
        };
        let model = measured_model(cfg, t, b, gb, choices);
        for &schedule in &schedules {
            let model = MeasuredModel { schedule, ..model };
            let found = measured::search(&costs, &model, which, &fits);
            if let Some(f) = &found {
                for (a, t) in alone.iter_mut().zip(&f.alone_step_seconds) {
                    *a = a.min(*t);
                }
            }
            if let Some(found) = found
                && best
                    .as_ref()
                    .is_none_or(|(f, ..)| found.expected_step_seconds < f.expected_step_seconds)
            {
                best = Some((found, costs.clone(), schedule));
            }
        }
        by_size.push(SizedCosts {
            devices: costs,
            model,
        });
    }
    // Data parallelism dealt in sequences: each replica at a micro-batch
    // size of its own, so a slow chip can take single sequences.
    if which != Layouts::Pipelines && devices.len() >= 2 {
        let fits = |d: usize, b: usize| {
            let range = StageRange::new(0, cfg.layers, cfg.layers);
            let need = memory::stage_memory(cfg, t.precision, &range, b, 1);
            need.total() <= devices[d].props().memory_bytes
        };
        if let Some(r) = measured::replicas_by_sequence(&by_size, gb, &fits)
            && let Some((found, ..)) = &mut best
            && r.expected_step_seconds < found.expected_step_seconds
        {
            found.candidates += 1;
            found.step_seconds = r.step_seconds;
            found.expected_step_seconds = r.expected_step_seconds;
            found.pipelines = r.pipelines;
            found.optimizer_weights = r.optimizer_weights;
        }
    }
    if let Some((found, ..)) = &mut best {
        let sum: f64 = alone
            .iter()
            .filter(|t| t.is_finite())
            .map(|t| 1.0 / t)
            .sum();
        found.speedup_ratio = if sum > 0.0 {
            (1.0 / found.step_seconds) / sum
        } else {
            0.0
        };
        found.alone_step_seconds = alone;
    }
    let Some((found, costs, schedule)) = best else {
        return Err(TrainError::Plan(format!(
            "--plan {}: no layout of the {} model over {} fits the devices' memory with \
             micro-batches of {sizes:?} sequences",
            match mode {
                AutoMode::Best => "auto",
                AutoMode::Pipeline => "auto-pp",
                AutoMode::Replicas => "auto-dp",
            },
            cfg.name,
            devices
                .iter()
                .map(device_name)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    // The weights as shares of the step (they sum to 1): relative is all
    // that counts, and shares read better in a plan file.
    let shares: Option<Vec<f64>> = found.optimizer_weights.as_ref().map(|w| {
        let sum: f64 = w.iter().sum();
        w.iter().map(|x| x / sum).collect()
    });
    // Each pipeline stage's predicted passes (`costs` are at the size the
    // pipeline search found the best at; replicas dealt by sequence are
    // whole models, each at its own size, and get none).
    let passes = |p: &measured::MeasuredPipeline, j: usize| {
        let s = &p.stages[j];
        (p.stages.len() > 1).then(|| {
            let model = MeasuredModel {
                schedule,
                ..measured_model(cfg, t, p.micro_batch, gb, choices)
            };
            let (f, b) = measured::stage_pass_times(
                &costs[s.device],
                &model,
                s,
                j,
                p.stages.len(),
                p.micro_batches,
            );
            [f, b]
        })
    };
    let groups = found
        .pipelines
        .iter()
        .enumerate()
        .map(|(i, p)| GroupPlan {
            copies: 1,
            micro_batch_size: p.micro_batch,
            micro_batches: p.micro_batches,
            sequences: (p.sequences != p.micro_batch * p.micro_batches).then_some(p.sequences),
            stages: p
                .stages
                .iter()
                .enumerate()
                .map(|(j, s)| StagePlan {
                    device: costs[s.device].name.clone(),
                    layers: [
                        Cut::inside(s.from, s.from_cols),
                        Cut::inside(s.to, s.to_cols),
                    ],
                    optimizer_weight: shares.as_ref().map(|w| w[i]),
                    predicted_passes: passes(p, j),
                })
                .collect(),
        })
        .collect();
    let pipelined = found.pipelines.iter().any(|p| p.stages.len() > 1);
    let ahead = match devices.len() > available || !choices.async_sends {
        // Stages sharing a core: one running ahead takes the core from
        // the other (as zero bubble's deeper warm-up did, 1.19x 1F1B's
        // step with three vendors on two cores). Blocking sends could
        // deadlock on the activations it keeps in flight.
        true => 1,
        false => {
            // The model the pipelines were priced under (the size the
            // pipeline search found the best at: `costs`'s).
            let b = found.pipelines.first().map_or(1, |p| p.micro_batch);
            let model = MeasuredModel {
                schedule,
                ..measured_model(cfg, t, b, gb, choices)
            };
            run_ahead(cfg, t, &found, devices, &costs, &model)
        }
    };
    let plan = TrainPlan {
        groups,
        predicted_step_seconds: Some(found.step_seconds),
        // Replicas of one stage each run no pipeline schedule.
        schedule: pipelined.then_some(schedule),
        run_ahead: (pipelined && ahead > 1).then_some(ahead),
        // Each rank on the cores its device was profiled on.
        core_order: cores.map(|_| devices.iter().map(device_name).collect()),
        planned_for: None,
    };
    Ok((plan, found, profiles))
}

/// How far the pipelines of `found` (priced on `costs`) run ahead under
/// the model `model` (its schedule and micro-batches of the pipelines'
/// size): the largest multiple of the schedule's lead up to
/// [`AUTO_RUN_AHEAD`] at which every stage's memory still holds the
/// micro-batches it then keeps in flight and the simulator, with the
/// profile's pass times, gives no pipeline a longer step than at the lead
/// the search laid them out at, 1 ([`measured::pipeline_step`]; the
/// search's prediction stands). Running ahead buffers micro-batches
/// between the stages, so that a stage rides out its neighbour's slow
/// spells (docs/performance.md, "Running ahead").
fn run_ahead(
    cfg: &ModelConfig,
    t: &TrainConfig,
    found: &MeasuredPlan,
    devices: &[Device],
    costs: &[MeasuredDevice],
    model: &MeasuredModel,
) -> usize {
    // Each pipeline's model, and its step at the search's lead.
    let pipelines: Vec<(&measured::MeasuredPipeline, MeasuredModel, f64)> = found
        .pipelines
        .iter()
        .map(|p| {
            let model = MeasuredModel {
                micro_batches: p.micro_batches,
                ..*model
            };
            let at_one = measured::pipeline_step(costs, &model, &p.stages, p.micro_batches, 1);
            (p, model, at_one)
        })
        .collect();
    let runs = |ahead: usize| {
        pipelines.iter().all(|(p, model, at_one)| {
            let k = p.stages.len();
            let fits = p.stages.iter().enumerate().all(|(j, s)| {
                let in_flight = model.schedule.in_flight(j, k, p.micro_batches, ahead);
                let span = measured::Span::of(s, j, k);
                span_fits(cfg, t, &devices[s.device], span, p.micro_batch, in_flight)
            });
            fits && {
                let step = measured::pipeline_step(costs, model, &p.stages, p.micro_batches, ahead);
                step <= at_one * (1.0 + 1e-9)
            }
        })
    };
    (2..=AUTO_RUN_AHEAD).rev().find(|&a| runs(a)).unwrap_or(1)
}

/// Whether a stage holding `s` fits `device`'s memory with `in_flight`
/// micro-batches of `b` sequences in flight (the trainer's count,
/// [`memory::stage_memory`]): the measured search's memory check, and
/// how far `--plan auto` lets a pipeline run ahead.
fn span_fits(
    cfg: &ModelConfig,
    t: &TrainConfig,
    device: &Device,
    s: measured::Span,
    b: usize,
    in_flight: usize,
) -> bool {
    let range = StageRange {
        start: Cut::inside(s.from, s.from_cols),
        end: Cut::inside(s.to, s.to_cols),
        embed: s.embed,
        head: s.head,
    };
    let need = memory::stage_memory(cfg, t.precision, &range, b, in_flight);
    need.total() <= device.props().memory_bytes
}

/// The model in the measured search's terms, micro-batches of `b`, under
/// the trainer's `choices`.
fn measured_model(
    cfg: &ModelConfig,
    t: &TrainConfig,
    b: usize,
    gb: usize,
    choices: Choices,
) -> MeasuredModel {
    let one_block = StageRange {
        start: Cut::at(0),
        end: Cut::at(2),
        embed: false,
        head: false,
    };
    let per_block = stage_params(cfg, &one_block);
    let count = |specs: &[crate::params::ParamSpec]| -> u64 {
        specs.iter().map(|p| p.numel() as u64).sum()
    };
    MeasuredModel {
        layers: cfg.layers,
        ffn: cfg.ffn,
        kv_heads: cfg.kv_heads,
        block_params: count(&per_block),
        attention_params: count(&per_block[..ATTENTION_PARAMS]),
        embed_params: (cfg.vocab * cfg.dim) as u64,
        head_params: (cfg.vocab * cfg.dim + cfg.dim) as u64,
        activation_bytes: (b * cfg.seq_len * cfg.dim * t.precision.dtype().size()) as u64,
        micro_batch: b,
        micro_batches: gb / b,
        grad_bytes: 4,
        link_bandwidth: 2e9,
        shard_optimizer: choices.shard_optimizer,
        overlap_reduction: choices.overlap_reduction,
        async_sends: choices.async_sends,
        schedule: PipelineSchedule::OneFOneB,
        profile_error: choices.profile_error,
    }
}

/// Profiles each of `devices` on `cfg` at each micro-batch size of `sizes`
/// (with [`profile_repeated`], `reps` repetitions, `rounds` rounds) and
/// returns them as a profile file for `polychip
/// plan --profile`: one entry per device kind (its name as `polychip
/// devices` reports it, the chip type of a cluster seeded from devices) and
/// size, at tensor-parallel degree 1.
pub fn profile_file(
    cfg: &ModelConfig,
    t: &TrainConfig,
    devices: &[Device],
    sizes: &[usize],
    reps: usize,
    rounds: usize,
) -> Result<polychip_planner::profile::ProfileFile> {
    let mut kinds: Vec<&Device> = Vec::new();
    for d in devices {
        if !kinds.iter().any(|k| k.props().name == d.props().name) {
            kinds.push(d);
        }
    }
    // Every (device, size) once per round, rounds interleaved, so that a
    // slow spell of a shared machine spreads over all entries; each field
    // is then the median over the rounds.
    let mut runs: Vec<Vec<Profile>> = vec![Vec::new(); kinds.len() * sizes.len()];
    for _ in 0..rounds.max(1) {
        for (k, d) in kinds.iter().enumerate() {
            for (i, &b) in sizes.iter().enumerate() {
                runs[k * sizes.len() + i].push(profile_repeated(cfg, t, d, b, reps)?);
            }
        }
    }
    let mut medians = Vec::new();
    for (k, d) in kinds.iter().enumerate() {
        for i in 0..sizes.len() {
            let m = median_profile(&runs[k * sizes.len() + i]);
            medians.push(Profile {
                device: device_name(d),
                ..m
            });
        }
    }
    let source = format!("polychip profile {} on", env!("CARGO_PKG_VERSION"));
    Ok(to_file(cfg, t, devices, &medians, &source))
}

/// `profiles` (of `devices`' kinds, as [`profile_side_by_side`] or
/// [`profile_file`] measure them) as a profile file: one entry per profile,
/// its chip the kind's device name as `polychip devices` reports it.
/// `source` begins the file's `source`, which goes on with the devices.
pub fn to_file(
    cfg: &ModelConfig,
    t: &TrainConfig,
    devices: &[Device],
    profiles: &[Profile],
    source: &str,
) -> polychip_planner::profile::ProfileFile {
    use polychip_planner::profile::{FORMAT, Passes, ProfileEntry, ProfileFile};
    let passes = |forward, backward, weights: f64| Passes {
        forward,
        backward,
        weight_grad: (weights > 0.0).then_some(weights),
        fused_backward: None,
        held: None,
    };
    let entries = profiles
        .iter()
        .map(|p| {
            let c = &p.costs;
            let chip = devices
                .iter()
                .find(|d| device_name(d) == p.device)
                .or_else(|| devices.iter().find(|d| same_kind(&p.device, d)))
                .map_or_else(|| p.device.clone(), |d| d.props().name.clone());
            ProfileEntry {
                chip,
                micro_batch: p.micro_batch as u64,
                tp: 1,
                embedding: Some(passes(c.embed_forward, c.embed_backward, 0.0)),
                block: Passes {
                    fused_backward: (c.fused_backward_ratio > 0.0)
                        .then_some(c.fused_backward_ratio * c.block_backward),
                    held: (c.held_forward_ratio > 0.0 && c.held_backward_ratio > 0.0).then_some(
                        polychip_planner::profile::Held {
                            forward: c.held_forward_ratio * c.block_forward,
                            backward: c.held_backward_ratio * c.block_backward,
                        },
                    ),
                    ..passes(c.block_forward, c.block_backward, c.block_weight_grad)
                },
                attention: Some(passes(c.attention_forward, c.attention_backward, 0.0)),
                head: Some(passes(c.head_forward, c.head_backward, c.head_weight_grad)),
                stage_overhead: (c.stage_forward > 0.0 || c.stage_backward > 0.0).then_some(
                    polychip_planner::profile::StageOverhead {
                        forward: c.stage_forward,
                        backward: c.stage_backward,
                    },
                ),
                optimizer_per_param: Some(c.optimizer_per_param),
                block_activation_bytes: p.block_activation_bytes,
                peak_memory_bytes: Some(p.peak_memory_bytes),
            }
        })
        .collect();
    ProfileFile {
        format: FORMAT.into(),
        model: cfg.planner_spec(),
        dtype: dtype(t),
        source: format!(
            "{source} {}",
            devices
                .iter()
                .map(device_name)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        entries,
        core_order: None,
    }
}

/// The planner's name of the run's compute dtype.
fn dtype(t: &TrainConfig) -> polychip_planner::settings::Dtype {
    match t.precision {
        crate::config::Precision::F32 => polychip_planner::settings::Dtype::F32,
        crate::config::Precision::Bf16 => polychip_planner::settings::Dtype::Bf16,
    }
}

/// Whether a profile file's `chip` names device `d`'s kind: its name as
/// `polychip devices` reports it, its vendor, or one of its devices
/// (`ferrite:0`), ignoring case.
fn names_kind(chip: &str, d: &Device) -> bool {
    let chip = chip.trim().to_lowercase();
    chip == d.props().name.to_lowercase()
        || chip == d.plugin().vendor().to_lowercase()
        || same_kind(&chip, d)
}

/// The profiles of `devices`' kinds at `sizes` read from `file` (as
/// [`to_file`] writes it, or `polychip profile`, or by hand), in place of
/// measuring them: the file must be of this model and precision, and give
/// every kind at one size or more of `sizes` (tp 1); errors begin with
/// `label` (the file's name). Returns the profiles and the sizes every kind
/// has.
pub fn from_file(
    file: &polychip_planner::profile::ProfileFile,
    label: &str,
    cfg: &ModelConfig,
    t: &TrainConfig,
    devices: &[Device],
    sizes: &[usize],
) -> Result<(Vec<Profile>, Vec<usize>)> {
    file.check_matches(&cfg.planner_spec(), dtype(t), "--precision")
        .map_err(|e| TrainError::Plan(format!("{label}: {e}")))?;
    let mut kinds: Vec<&Device> = Vec::new();
    for d in devices {
        if !kinds
            .iter()
            .any(|k| k.plugin().vendor() == d.plugin().vendor())
        {
            kinds.push(d);
        }
    }
    let entry = |d: &Device, b: usize| {
        file.entries
            .iter()
            .find(|e| e.tp == 1 && e.micro_batch == b as u64 && names_kind(&e.chip, d))
    };
    // Two entries for one kind and size: which one holds is not for this
    // file's reader to guess (the cluster planner refuses them alike).
    for d in &kinds {
        for &b in sizes {
            let same: Vec<usize> = (file.entries.iter().enumerate())
                .filter(|(_, e)| e.tp == 1 && e.micro_batch == b as u64 && names_kind(&e.chip, d))
                .map(|(i, _)| i)
                .collect();
            if let [first, second, ..] = same[..] {
                return Err(TrainError::Plan(format!(
                    "{label}: entries {first} and {second} both give {} ({}) at a micro-batch \
                     size of {b} and tp 1; keep one",
                    device_name(d),
                    d.props().name
                )));
            }
        }
    }
    let have: Vec<usize> = sizes
        .iter()
        .copied()
        .filter(|&b| kinds.iter().all(|d| entry(d, b).is_some()))
        .collect();
    if have.is_empty() {
        let missing: Vec<String> = kinds
            .iter()
            .filter(|d| sizes.iter().all(|&b| entry(d, b).is_none()))
            .map(|d| format!("{} ({})", device_name(d), d.props().name))
            .collect();
        return Err(TrainError::Plan(format!(
            "{label}: the profile has no entry at tp 1 and a micro-batch size of {sizes:?} for {}{}",
            match missing.is_empty() {
                true => "every device kind at one size".to_string(),
                false => missing.join(", "),
            },
            "; profile these devices on this model (polychip profile, or polychip train \
             --plan auto --save-profile)"
        )));
    }
    let mut profiles = Vec::new();
    let model = cfg.planner_spec();
    for d in &kinds {
        let name = device_name(d);
        let mine: Vec<_> = (file.entries.iter())
            .filter(|e| e.tp == 1 && names_kind(&e.chip, d))
            .collect();
        for note in polychip_planner::profile::slower_per_sequence(&name, &mine) {
            eprintln!("note: {label}: {note}");
        }
        for &b in &have {
            let e = entry(d, b).expect("checked above");
            for note in entry_notes(e, d.props().memory_bytes, &model) {
                eprintln!("note: {label}: {name} at a micro-batch of {b}: {note}");
            }
            profiles.push(Profile {
                device: name.clone(),
                micro_batch: b,
                block_activation_bytes: e.block_activation_bytes,
                peak_memory_bytes: e.peak_memory_bytes.unwrap_or(0),
                costs: e.costs(&name),
            });
        }
    }
    Ok((profiles, have))
}

/// What a profile entry leaves to be taken as free, and figures no device
/// with `memory_bytes` of memory can have measured on `model` (times in
/// another unit than seconds, activations beyond its memory): the notes
/// `--profile` prints (the cluster planner's `plan --profile` warns of the
/// same).
fn entry_notes(
    e: &polychip_planner::profile::ProfileEntry,
    memory_bytes: u64,
    model: &polychip_planner::model::ModelSpec,
) -> Vec<String> {
    let mut notes = Vec::new();
    for (what, missing) in [
        ("embedding", e.embedding.is_none()),
        ("head", e.head.is_none()),
        ("optimizer_per_param", e.optimizer_per_param.is_none()),
    ] {
        if missing {
            notes.push(format!(
                "it gives no {what}, which is taken as free; profile the device with polychip \
                 profile for a measured one"
            ));
        }
    }
    notes.extend(polychip_planner::profile::unusable(e, memory_bytes, model));
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_entrys_missing_parts_and_hour_long_times_are_noted() {
        let text = r#"{"chip": "x", "micro_batch": 1, "tp": 1,
                       "block": {"forward": 2e6, "backward": 0.01}}"#;
        let entry: polychip_planner::profile::ProfileEntry = serde_json::from_str(text).unwrap();
        let model = crate::config::ModelConfig::preset("tiny")
            .unwrap()
            .planner_spec();
        let notes = entry_notes(&entry, 1 << 30, &model).join("\n");
        for want in [
            "no embedding, which is taken as free",
            "no head",
            "no optimizer_per_param",
            "its block takes over an hour",
        ] {
            assert!(notes.contains(want), "{notes}");
        }
        // Activations beyond the device's memory, or none.
        for (bytes, want) in [
            (2u64 << 30, "more than a chip's memory"),
            (0, "keeps no activations"),
        ] {
            let text = format!(
                r#"{{"chip": "x", "micro_batch": 1, "tp": 1, "block_activation_bytes": {bytes},
                    "block": {{"forward": 0.01, "backward": 0.02}}}}"#
            );
            let entry: polychip_planner::profile::ProfileEntry =
                serde_json::from_str(&text).unwrap();
            let notes = entry_notes(&entry, 1 << 30, &model).join("\n");
            assert!(notes.contains(want), "{notes}");
        }
    }

    #[test]
    fn a_fixed_cost_per_stage_is_what_the_halves_alone_pay_beyond_the_long_stage() {
        // Block 10 (attention 4, feed-forward 6), 1 per stage: the halves
        // alone cost 5 and 7, a stage of 16 blocks 161, of one block 11.
        let o = stage_overhead(5.0, 7.0, 161.0, 16.0);
        assert!((o - 1.0).abs() < 1e-12, "{o}");
        assert!((stage_overhead(5.0, 7.0, 11.0, 1.0) - 1.0).abs() < 1e-12);
        // Within the noise (5% of the block), or below it: none.
        assert_eq!(stage_overhead(4.2, 6.2, 160.0, 16.0), 0.0);
        assert_eq!(stage_overhead(3.0, 5.0, 160.0, 16.0), 0.0);
        assert_eq!(stage_overhead(f64::NAN, 5.0, 160.0, 16.0), 0.0);
        // Never more than half the long stage.
        assert_eq!(stage_overhead(1e3, 1e3, 16.0, 16.0), 8.0);
    }

    #[test]
    fn zero_bubble_is_priced_only_with_queued_sends_and_a_core_per_rank_unless_asked_for() {
        use PipelineSchedule::{OneFOneB, OneFOneBDeferred, ZeroBubble};
        let choices = |async_sends, schedule| Choices {
            shard_optimizer: true,
            overlap_reduction: true,
            async_sends,
            schedule,
            profile_error: 0.1,
        };
        assert_eq!(
            choices(true, None).schedules(false),
            [OneFOneB, OneFOneBDeferred, ZeroBubble]
        );
        assert_eq!(
            choices(false, None).schedules(false),
            [OneFOneB, OneFOneBDeferred]
        );
        assert_eq!(choices(true, None).schedules(true), [OneFOneB]);
        assert_eq!(
            choices(true, Some(ZeroBubble)).schedules(true),
            [ZeroBubble]
        );
        assert_eq!(choices(true, Some(OneFOneB)).schedules(false), [OneFOneB]);
    }
}

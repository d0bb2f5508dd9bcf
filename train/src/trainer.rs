//! A training job on one rank: its role in the plan, its stage on its
//! device, the communicators it needs (the world for pipeline transfers and
//! the step's scalars, one per group of ranks holding the same parameters
//! for the gradient reduction), and the step loop: 1F1B passes, gradient
//! reduction weighted by batch share, clipping, AdamW, validation,
//! checkpoints, logs and the trace.

use std::ops::Range;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use polychip_comm::bootstrap::Job;
use polychip_comm::collectives::{Communicator, DType as CommDType, ReduceOp};
use polychip_comm::device::{DeviceComm, StagingPool};
use polychip_host::ffi::procstate::{self, ProcStateChange};
use polychip_host::{Device, Runtime};
use serde::Serialize;
use serde_json::Value;

use crate::checkpoint::{self, Manifest};
use crate::config::{ModelConfig, TrainConfig};
use crate::data::Corpus;
use crate::dp;
use crate::error::{Result, TrainError};
use crate::hf;
use crate::links::Links;
use crate::memory;
use crate::model::Stage;
use crate::model::ops::OpRecord;
use crate::params::StageRange;
use crate::pipeline::{self, StepData};
use crate::plan::{Role, TrainPlan};
use crate::rebalance;
use crate::recut;
use crate::reduce::Reducer;
use crate::trace::{self, Tracer};
use polychip_planner::schedule::PipelineSchedule;

/// Everything a run needs besides the devices and the communicator.
#[derive(Debug, Clone)]
pub struct Options {
    /// The model's shape.
    pub model: ModelConfig,
    /// Hyper-parameters and schedule.
    pub train: TrainConfig,
    /// The layout.
    pub plan: TrainPlan,
    /// The text.
    pub corpus: Corpus,
    /// Where checkpoints go.
    pub checkpoint_dir: Option<PathBuf>,
    /// Save every this many steps (and after the last); 0 = after the last only.
    pub save_every: u64,
    /// Resume from this checkpoint (a step directory or a root).
    pub resume: Option<PathBuf>,
    /// Resume even when the checkpoint was saved with other training
    /// settings (see [`checkpoint::train_differences`]); they are printed.
    pub allow_changed_settings: bool,
    /// Start from the weights of this Hugging Face LLaMA directory instead
    /// of the seeded initialization (AdamW moments at zero); the model must
    /// be the one its `config.json` describes. Not with `resume`.
    pub init_from: Option<PathBuf>,
    /// After the run, write the final weights here as a Hugging Face LLaMA
    /// directory (rank 0; through the final checkpoint, in `checkpoint_dir`
    /// or else in a staging directory beside it that is removed after).
    pub export_hf: Option<PathBuf>,
    /// Write the run's Chrome trace here (rank 0 gathers every rank's).
    pub trace: Option<PathBuf>,
    /// Stop after this many steps of the schedule (the schedule still ends
    /// at `train.steps`); for tests and interrupted runs.
    pub stop_after: Option<u64>,
    /// Print one line per this many steps on rank 0 (0 = none).
    pub log_every: u64,
    /// Record every op of the first step run (for `--autocompare`).
    pub record_first_step: bool,
    /// Reduce each bucket of gradients while the last backward pass goes
    /// on ([`crate::reduce`]), not after it.
    pub overlap_reduction: bool,
    /// Send activations and gradients from a thread of the rank's own
    /// while its stage goes on ([`crate::links`]), not blocking.
    pub async_sends: bool,
    /// The pipeline schedule; [`PipelineSchedule::ZeroBubble`] needs `async_sends`.
    pub schedule: PipelineSchedule,
    /// How far each stage runs ahead of the next, as a multiple of the
    /// schedule's lead ([`polychip_planner::schedule::Schedule::run_ahead`]).
    pub run_ahead: usize,
    /// Deal the batch between the data-parallel replicas again every this
    /// many steps by their measured speeds ([`crate::rebalance`]); `None`
    /// keeps the plan's deal.
    pub rebalance_every: Option<u64>,
}

/// One step's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepRecord {
    /// The 1-based optimizer step.
    pub step: u64,
    /// Mean training loss of the global batch.
    pub loss: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Validation loss, when validated after this step.
    pub val_loss: Option<f64>,
    /// Wall-clock seconds of the step (validation and saving excluded).
    pub seconds: f64,
}

/// One rank's medians, as rank 0 gathers them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StageTimes {
    /// The rank, its device, replica, stage and blocks.
    pub label: String,
    /// Forward pass per micro-batch, seconds.
    pub forward: f64,
    /// Backward pass per micro-batch (a split one's two parts), seconds.
    pub backward: f64,
    /// The weights' gradients' part of `backward` under a split, seconds.
    pub weight_grad: f64,
    /// The wait for the gradient reduction per step, seconds.
    pub reduction: f64,
    /// The optimizer step (and the sharded step's all-gather), seconds.
    pub optimizer: f64,
}

/// What a rank's run produced.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    /// Per step, in order.
    pub steps: Vec<StepRecord>,
    /// Median step time, seconds (steps after the first).
    pub median_step_seconds: f64,
    /// Tokens per second at the median step time.
    pub tokens_per_s: f64,
    /// This rank's median forward and backward time per micro-batch, seconds.
    pub forward_seconds: f64,
    /// See `forward_seconds` (a split backward pass's two parts; where
    /// only some passes are split, as under deferred weights, their
    /// weights' parts spread over every pass).
    pub backward_seconds: f64,
    /// A split backward pass's weights' gradients (the zero-bubble
    /// schedule, and deferred weights' last passes), else 0.
    pub weight_grad_seconds: f64,
    /// The pipeline schedule the run used.
    pub schedule: PipelineSchedule,
    /// The run-ahead it ran at.
    pub run_ahead: usize,
    /// This rank's median wait for the gradient reduction after the passes
    /// (what the overlap left), seconds per step.
    pub reduction_seconds: f64,
    /// This rank's median optimizer step (with the sharded step's
    /// all-gather), seconds per step.
    pub optimizer_seconds: f64,
    /// Every rank's medians (rank 0 only; empty elsewhere).
    pub stage_times: Vec<StageTimes>,
    /// The last checkpoint written.
    pub checkpoint: Option<PathBuf>,
    /// The Hugging Face directory the final weights were exported to.
    pub exported: Option<PathBuf>,
    /// The recorded ops of the first step (when asked).
    #[serde(skip)]
    pub records: Vec<OpRecord>,
    /// The step the run started from (0, or the resumed checkpoint's).
    pub start_step: u64,
    /// Each new deal of the batch (`rebalance_every`): after which step,
    /// and each replica's sequences.
    pub deals: Vec<(u64, Vec<usize>)>,
    /// Each move of a pipeline's cuts (`rebalance_every` on a plan of one
    /// pipeline): after which step, and the plan it trained on from then.
    pub recuts: Vec<(u64, String)>,
    /// What this rank's plugin changed of the process state it does not
    /// own during the steps (ABI rule 13), each said once, as printed.
    pub process_state: Vec<String>,
}

/// `vendor:index` of every device, lower case.
pub fn device_names(runtime: &Runtime) -> Vec<String> {
    runtime.devices().iter().map(device_name).collect()
}

/// `vendor:index`, lower case.
pub fn device_name(d: &Device) -> String {
    format!("{}:{}", d.plugin().vendor().to_lowercase(), d.index())
}

fn all_reduce_f32(comm: Option<&mut Communicator>, values: &mut [f32]) -> Result<()> {
    let Some(comm) = comm else {
        return Ok(());
    };
    let mut bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    comm.all_reduce(&mut bytes, CommDType::F32, ReduceOp::Sum)?;
    for (v, c) in values.iter_mut().zip(bytes.chunks_exact(4)) {
        *v = f32::from_ne_bytes(c.try_into().expect("4 bytes"));
    }
    Ok(())
}

/// Fault injection for tests and drills: `RANK:STEP` makes that rank kill
/// itself (SIGKILL, no cleanup) when it starts that 1-based step.
pub const KILL_VAR: &str = "POLYCHIP_TRAIN_KILL_AT";

/// `RANK:STEP`: that rank's first pipeline send of that step fails (a
/// test hook for what a failed send does).
pub const FAIL_SEND_VAR: &str = "POLYCHIP_TRAIN_FAIL_SEND_AT";

/// `RANK:MS`: that rank's every forward pass takes MS milliseconds more (a
/// slow chip, for tests and drills of `--rebalance-every`).
pub const SLOW_VAR: &str = "POLYCHIP_TRAIN_SLOW_RANK";

/// The step at which a `RANK:STEP` hook in `var` is set for `rank`.
fn step_hook(var: &str, rank: usize) -> Option<u64> {
    let v = std::env::var(var).ok()?;
    let (r, s) = v.split_once(':')?;
    (r.trim().parse::<usize>().ok()? == rank)
        .then(|| s.trim().parse().ok())
        .flatten()
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A rank's backward seconds per micro-batch and its weights' passes'
/// seconds, from the durations of its `backward` passes (under a split,
/// the input's gradient) and of its split passes' `weights`: the
/// weights' part counts where passes are split, every one under zero
/// bubble, the last two under deferred weights, so it is spread over
/// the passes by the share of them split.
fn backward_per_pass(backward: Vec<f64>, weights: Vec<f64>) -> (f64, f64) {
    let split_share = weights.len() as f64 / backward.len().max(1) as f64;
    let w = median(weights);
    (median(backward) + w * split_share, w)
}

/// Refuses the zero-bubble schedule, and any stage running further ahead
/// than 1F1B's lead (`run_ahead` above 1), with blocking sends: each keeps
/// more activations in flight than gradients, which blocking sends could
/// deadlock on.
pub fn check_schedule(
    schedule: PipelineSchedule,
    run_ahead: usize,
    async_sends: bool,
) -> Result<()> {
    if async_sends {
        return Ok(());
    }
    match schedule {
        PipelineSchedule::ZeroBubble => Err(TrainError::Plan(format!(
            "the zero-bubble schedule needs queued sends: it keeps more activations in flight \
             than gradients, which blocking sends could deadlock on (drop --blocking-sends or \
             use --schedule 1f1b{})",
            if run_ahead > 1 {
                " with --run-ahead 1"
            } else {
                ""
            }
        ))),
        PipelineSchedule::OneFOneB | PipelineSchedule::OneFOneBDeferred if run_ahead > 1 => {
            Err(TrainError::Plan(format!(
                "a run-ahead of {run_ahead} needs queued sends: its stages keep more \
                 activations in flight than gradients, which blocking sends could deadlock on \
                 (drop --blocking-sends or give --run-ahead 1)"
            )))
        }
        _ => Ok(()),
    }
}

/// Runs the job's part on this rank: `job` is `None` for a single-rank plan.
pub fn run(opts: &Options, runtime: &Runtime, mut job: Option<&mut Job>) -> Result<Summary> {
    let cfg = &opts.model;
    let t = &opts.train;
    cfg.validate().map_err(TrainError::Config)?;
    t.validate()?;
    opts.plan.validate(cfg, t.global_batch)?;
    opts.corpus.check_seq_len(cfg.seq_len)?;
    check_schedule(opts.schedule, opts.run_ahead, opts.async_sends)?;
    let (rank, world) = match job.as_deref() {
        Some(j) => (j.rank(), j.world_size()),
        None => (0, 1),
    };
    if world != opts.plan.world_size() {
        return Err(TrainError::Plan(format!(
            "the plan needs {} ranks ({}) but the job has {world}",
            opts.plan.world_size(),
            opts.plan.describe()
        )));
    }
    let mut roles = opts.plan.roles();
    let mut role = roles[rank].clone();
    // The roles as planned, whose memory was checked (rebalancing deals
    // `roles` again).
    let planned = roles.clone();
    // The plan as the run has it now (moving a pipeline's cuts changes it).
    let mut plan_now = opts.plan.clone();
    let mut rebalancer = match opts.rebalance_every {
        Some(every) => {
            rebalance::check_rebalancing(&roles)?;
            Some(rebalance::Rebalancer::new(every))
        }
        None => None,
    };
    crate::plan::check_devices(&[&role], &device_names(runtime))?;
    let device = runtime
        .devices()
        .iter()
        .find(|d| device_name(d) == role.device)
        .expect("roles only name present devices")
        .clone();
    memory::check_role(
        cfg,
        t.precision,
        &role,
        opts.schedule,
        opts.run_ahead,
        &device,
    )?;
    if let Some(out) = &opts.export_hf {
        hf::check_new_dir(out)?;
    }
    let mut stage = match &opts.init_from {
        None => Stage::new(cfg, role.range, t.precision, &device, t.seed)?,
        Some(dir) => {
            if opts.resume.is_some() {
                return Err(TrainError::Config(
                    "start from a Hugging Face model (init_from) or resume a checkpoint, not both"
                        .into(),
                ));
            }
            let model = hf::HfModel::open(dir, Some(cfg.seq_len))?;
            if let Some(diff) = checkpoint::model_difference(model.model(), cfg) {
                return Err(TrainError::Checkpoint {
                    path: dir.clone(),
                    message: format!("holds a different model than the one to train: {diff}"),
                });
            }
            let specs = crate::params::stage_params(cfg, &role.range);
            let mut weights = model.initial_weights(&specs)?;
            Stage::with_weights(cfg, role.range, t.precision, &device, &mut weights)?
        }
    };

    // Communicators: deterministic reductions (resuming is bit-exact), and
    // one sub-communicator per set of ranks holding the same parameters.
    let mut dp = match job.as_deref_mut() {
        Some(j) => {
            j.set_deterministic(true);
            dp::reduction_groups(j, &roles, cfg)?
        }
        None => Vec::new(),
    };
    // The pipeline links: two communicators per pair of neighbouring
    // stages, one per direction (the reduction has its groups).
    let mut links = match job.as_deref_mut() {
        Some(j) => Links::connect(j, &roles, &device, opts.async_sends)?,
        None => Links::none(0),
    };
    let sharding = dp::Sharding::new(&opts.plan, &dp, &roles, &stage);
    let mut reducer = Reducer::new(&stage, &role, &dp, opts.overlap_reduction)?;
    // Whether rebalancing moves the pipeline's cuts (a plan of one
    // pipeline) rather than dealing the batch; fixed for the run.
    let moves_cuts = rebalancer.is_some() && rebalance::moves_cuts(&roles);
    // Each stage's device memory in bytes, for the cuts its pipeline may
    // move to: every rank checks every stage's new range.
    let capacities: Vec<u64> = match (moves_cuts, job.as_deref_mut()) {
        (true, Some(j)) => {
            let mine = device.props().memory_bytes.to_le_bytes();
            let mut all = vec![0u8; 8 * world];
            j.all_gather(&mine, &mut all)?;
            all.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect()
        }
        _ => Vec::new(),
    };
    let mut start = 0;
    if let Some(path) = &opts.resume {
        let (mut loaded, changed) =
            checkpoint::load_for_resume(path, cfg, t, opts.allow_changed_settings)?;
        loaded.restore(&stage)?;
        start = loaded.manifest.step;
        if rank == 0 {
            for c in &changed {
                eprintln!("resuming with a changed setting (--allow-changed-settings): {c}");
            }
            eprintln!(
                "resumed from {} (step {start}, saved with plan {})",
                polychip_files::shown_path(&loaded.dir),
                polychip_files::printable_lines(&loaded.manifest.plan)
            );
        }
    }
    let end = opts.stop_after.map_or(t.steps, |s| s.min(t.steps));
    if let Some(s) = opts.stop_after
        && s <= start
    {
        // Nothing would run, and the checkpoint would be saved again.
        return Err(TrainError::Config(format!(
            "--stop-after {s} is at or before the checkpoint's step {start}: nothing would be \
             trained (it counts the schedule's steps from its start, a resumed run's too); \
             give a step after {start}"
        )));
    }
    let mut summary = Summary {
        start_step: start,
        ..Summary::default()
    };
    let mut tracer = Tracer::new(true, opts.trace.is_some());
    let mut reduce_pool = StagingPool::new();
    let replicas = opts.plan.replicas() as f64;
    let tokens_per_step = (t.global_batch * cfg.seq_len) as f64;
    // At most a minute a pass.
    let pass_delay =
        std::time::Duration::from_millis(step_hook(SLOW_VAR, rank).unwrap_or(0).min(60_000));
    let data = |step| StepData {
        corpus: &opts.corpus,
        seed: t.seed,
        step,
        global_batch: t.global_batch,
        schedule: opts.schedule,
        run_ahead: opts.run_ahead,
        pass_delay,
    };
    let (kill_at, fail_send_at) = (step_hook(KILL_VAR, rank), step_hook(FAIL_SEND_VAR, rank));
    // Exporting goes through the final checkpoint; without a checkpoint
    // directory, through a staging one beside the export (on every rank the
    // same path, so that every stage's file lands there).
    let staging = match (&opts.export_hf, &opts.checkpoint_dir) {
        (Some(out), None) => Some(export_staging(out)),
        _ => None,
    };
    let saves_to = opts.checkpoint_dir.as_ref().or(staging.as_ref());
    // The rank that commits the checkpoints holds the directory for the
    // run, so that a second run saving there now is refused.
    let _lock = match &opts.checkpoint_dir {
        Some(dir) if rank == 0 => Some(checkpoint::RootLock::take(dir)?),
        _ => None,
    };
    // ABI rule 13 during training: the process state compared once a step
    // (a few tens of microseconds; every call would cost more than small
    // operators), what the plugin changed put back and said once.
    let mut watch = procstate::Watch::new();
    let vendor = device.plugin().vendor().to_string();
    // A change made again every step (a plugin that re-binds its thread
    // on every call) is said at its first step only.
    let mut said = std::collections::HashSet::new();
    for s in start..end {
        if kill_at == Some(s + 1) {
            eprintln!(
                "rank {rank}: {KILL_VAR} says to die at step {}: SIGKILL",
                s + 1
            );
            // SAFETY: raising a signal in this process has no memory effects.
            unsafe { libc::raise(libc::SIGKILL) };
        }
        if fail_send_at == Some(s + 1) {
            links.fail_next_step();
        }
        let began = Instant::now();
        let began_us = trace::now_us();
        if opts.record_first_step && s == start {
            stage.record(true);
        }
        stage.zero_grads()?;
        // The passes, their sends on the links' sender thread, and the
        // gradient reduction overlapped with the last backward pass.
        let part = reducer.step(
            &stage,
            &mut dp,
            &mut reduce_pool,
            &mut tracer,
            |tr, done| {
                links.step(tr, |io, tr| {
                    pipeline::train_step(&stage, &role, data(s), io, tr, done)
                })
            },
        )?;
        // With the loss and the norm, each replica's measured speed when a
        // new deal is due (one collective either way).
        let mut scalars = vec![part as f32, stage.grad_sum_squares()? as f32];
        let speeds = rebalancer.as_mut().and_then(|rb| {
            let busy = rebalance::busy_seconds(tracer.spans(), began_us);
            rb.record(s + 1, busy, &role, roles.len())
        });
        scalars.extend(speeds.iter().flatten());
        all_reduce_f32(job.as_deref_mut().map(|j| &mut **j), &mut scalars)?;
        let loss = f64::from(scalars[0]);
        let norm = (f64::from(scalars[1]) / replicas).sqrt();
        if !loss.is_finite() || !norm.is_finite() {
            return Err(TrainError::Diverged(format!(
                "step {}: the loss ({loss}) or gradient norm ({norm}) is not finite; lower the \
                 learning rate or check the plugins with `polychip conform` and --autocompare",
                s + 1
            )));
        }
        if t.clip > 0.0 && norm > t.clip {
            stage.scale_grads(t.clip / (norm + 1e-6))?;
        }
        let lr = t.lr_at(s + 1);
        tracer.span(
            || "optimizer".into(),
            "optimizer",
            || match &sharding {
                None => stage.adamw(t, s + 1, lr),
                Some(sh) => stage.adamw_except(t, s + 1, lr, &sh.others),
            },
        )?;
        if let Some(sh) = &sharding {
            tracer.span(
                || "weights all-gather".into(),
                "allgather",
                || {
                    gather_shares(
                        &stage,
                        &mut dp,
                        &sh.shares,
                        &mut reduce_pool,
                        Gathered::Values,
                    )
                },
            )?;
        }
        if opts.record_first_step && s == start {
            summary.records = stage.take_records();
            stage.record(false);
        }
        let seconds = began.elapsed().as_secs_f64();
        let step = s + 1;
        let due = |every: u64| step == end || (every > 0 && step % every == 0);
        let val_loss = if due(t.eval_every) && t.eval_sequences > 0 {
            let v = pipeline::eval_step(
                &stage,
                &role,
                data(0),
                t.eval_sequences,
                &mut links.direct(),
                &mut tracer,
            )?;
            let mut vv = [(v / replicas) as f32];
            all_reduce_f32(job.as_deref_mut().map(|j| &mut **j), &mut vv)?;
            Some(f64::from(vv[0]))
        } else {
            None
        };
        if let Some(v) = val_loss
            && !v.is_finite()
        {
            return Err(TrainError::Diverged(format!(
                "step {step}: the validation loss is {v}; nothing of this step was saved; lower \
                 the learning rate or check the plugins with `polychip conform` and \
                 --autocompare"
            )));
        }
        let save_now = match (&opts.checkpoint_dir, &staging) {
            (Some(_), _) => due(opts.save_every),
            (None, Some(_)) => step == end,
            (None, None) => false,
        };
        if let Some(dir) = saves_to
            && save_now
        {
            check_finite_weights(step, &stage, job.as_deref_mut().map(|j| &mut **j))?;
            if let Some(sh) = &sharding {
                // Each rank's moments are current only in its own shares.
                gather_shares(
                    &stage,
                    &mut dp,
                    &sh.shares,
                    &mut reduce_pool,
                    Gathered::Moments,
                )?;
            }
            let saved = save(
                dir,
                step,
                &stage,
                &role,
                opts,
                &plan_now,
                job.as_deref_mut(),
            );
            if let (Err(_), Some(st)) = (&saved, &staging) {
                // A failed save of the export's staging checkpoint (a full
                // disk) leaves nothing beside the export.
                let _ = std::fs::remove_dir_all(st);
            }
            summary.checkpoint = Some(saved?);
        }
        let changes = watch.look();
        for change in ProcStateChange::split(&vendor, &format!("training step {step}"), changes) {
            if !said.insert(change.what.clone()) {
                continue;
            }
            let text = change.to_string();
            eprintln!("rank {rank}: warning: {text}");
            summary.process_state.push(text);
        }
        let rec = StepRecord {
            step,
            loss,
            grad_norm: norm,
            lr,
            val_loss,
            seconds,
        };
        if rank == 0
            && opts.log_every > 0
            && (step % opts.log_every == 0 || step == end || val_loss.is_some())
        {
            let val = val_loss.map_or(String::new(), |v| format!("  val {v:.4}"));
            println!(
                "step {step:>5}/{}  loss {loss:.4}{val}  lr {lr:.2e}  |g| {norm:.3}  {:.0} ms  {:.0} tok/s",
                t.steps,
                seconds * 1e3,
                tokens_per_step / seconds
            );
        }
        summary.steps.push(rec);
        let measured = speeds.map(|_| rebalance::Speeds::from(&scalars[2..]));
        let dealt = measured
            .as_ref()
            .filter(|_| !moves_cuts)
            .and_then(|speeds| {
                rebalance::better_deal(
                    &roles,
                    &planned,
                    &speeds.per_rank,
                    speeds.noise,
                    t.global_batch,
                    opts.schedule,
                    opts.run_ahead,
                )
            });
        if let Some((deal, _)) = dealt {
            rebalance::apply(&mut roles, &deal);
            role = roles[rank].clone();
            if rank == 0 && opts.log_every > 0 {
                println!(
                    "step {step:>5}: the batch dealt again by measured speed: {}",
                    rebalance::describe(&roles, &deal)
                );
            }
            summary.deals.push((step, deal));
        }
        let recut = measured.as_ref().filter(|_| moves_cuts).and_then(|speeds| {
            let now: Vec<StageRange> = roles.iter().map(|r| r.range).collect();
            let fits = |s: usize, range: &StageRange| {
                let mut r = roles[s].clone();
                r.range = *range;
                let have = capacities.get(s).copied().unwrap_or(0);
                memory::role_fits(cfg, t.precision, &r, opts.schedule, opts.run_ahead, have)
            };
            recut::better_cuts(cfg, &now, &speeds.per_rank, speeds.noise, &fits)
        });
        if let (Some(r), Some(j)) = (recut, job.as_deref_mut()) {
            // Every stage fits its device's memory at the new cuts
            // (`better_cuts` checked each against the gathered capacities,
            // as `memory::check_role` would on its rank).
            let moved_plan = recut::replan(&plan_now, &r.cuts);
            let moved = moved_plan.roles();
            let old = std::mem::take(&mut roles);
            let moving = Instant::now();
            stage = tracer.span(
                || "move the pipeline's cuts".into(),
                "recut",
                || recut::move_stage(stage, &old, &moved, rank, j, t.seed),
            )?;
            roles = moved;
            role = roles[rank].clone();
            reducer = Reducer::new(&stage, &role, &dp, opts.overlap_reduction)?;
            plan_now = moved_plan;
            // The speeds measured at the old cuts say nothing of the new.
            rebalancer = opts.rebalance_every.map(rebalance::Rebalancer::new);
            if rank == 0 && opts.log_every > 0 {
                println!(
                    "step {step:>5}: the pipeline's cuts moved by measured speed: {} (the \
                     slowest stage took {:.1} ms a micro-batch; {:.1} predicted at these \
                     cuts; moved in {:.0} ms)",
                    plan_now.describe(),
                    r.now * 1e3,
                    r.slowest * 1e3,
                    moving.elapsed().as_secs_f64() * 1e3
                );
            }
            summary.recuts.push((step, plan_now.describe()));
        }
    }
    if start >= end
        && let Some(dir) = saves_to
    {
        // No step ran (`--steps 0`, or resuming at the end): the checkpoint
        // "after the last step" is of the starting weights.
        check_finite_weights(start, &stage, job.as_deref_mut().map(|j| &mut **j))?;
        summary.checkpoint = Some(save(
            dir,
            start,
            &stage,
            &role,
            opts,
            &plan_now,
            job.as_deref_mut(),
        )?);
    }
    let times: Vec<f64> = summary.steps.iter().skip(1).map(|r| r.seconds).collect();
    summary.median_step_seconds = median(if times.is_empty() {
        summary.steps.iter().map(|r| r.seconds).collect()
    } else {
        times
    });
    if summary.median_step_seconds > 0.0 {
        summary.tokens_per_s = tokens_per_step / summary.median_step_seconds;
    }
    let spans_of = |cat: &str| -> Vec<f64> {
        tracer
            .spans()
            .iter()
            .filter(|s| s.cat == cat)
            .map(|s| s.dur_us / 1e6)
            .collect()
    };
    let of = |cat: &str| median(spans_of(cat));
    summary.forward_seconds = of("forward");
    (summary.backward_seconds, summary.weight_grad_seconds) =
        backward_per_pass(spans_of("backward"), spans_of(crate::pipeline::WEIGHTS));
    summary.schedule = opts.schedule;
    summary.run_ahead = opts.run_ahead;
    summary.reduction_seconds = of("allreduce");
    summary.optimizer_seconds = of("optimizer") + of("allgather");
    gather(opts, &role, &tracer, &mut summary, job)?;
    if let Some(out) = &opts.export_hf {
        // Every rank has passed the save's barrier: the checkpoint is complete.
        if rank == 0 {
            let exported = match summary.checkpoint.clone() {
                Some(from) => hf::export(&from, out).map(|_| ()),
                None => Err(TrainError::Plan(
                    "no final checkpoint was saved to export from".into(),
                )),
            };
            if let Some(dir) = &staging {
                let _ = std::fs::remove_dir_all(dir);
            }
            exported?;
            summary.exported = Some(out.clone());
        }
        if staging.is_some() {
            summary.checkpoint = None;
        }
    }
    Ok(summary)
}

/// The checkpoint directory a run that exports without `checkpoint_dir`
/// saves its final checkpoint in: `.NAME.polychip-staging` beside `out`.
pub fn export_staging(out: &std::path::Path) -> PathBuf {
    let mut name = std::ffi::OsString::from(".");
    name.push(out.file_name().unwrap_or_default());
    name.push(".polychip-staging");
    match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.join(name),
        _ => PathBuf::from(name),
    }
}

/// Before a checkpoint of `step` is saved (and so before an export, which
/// goes through it): every rank checks that its stage's weights are finite
/// (one read of them) and the ranks agree (one all-reduce, so all refuse
/// together and none waits in the save's barrier). Diverged weights are
/// refused with [`TrainError::Diverged`] and nothing of them is saved: the
/// last good checkpoint stays `latest`.
fn check_finite_weights(step: u64, stage: &Stage, comm: Option<&mut Communicator>) -> Result<()> {
    let bad = stage.first_non_finite_weight()?;
    let mut ranks_bad = [f32::from(u8::from(bad.is_some()))];
    all_reduce_f32(comm, &mut ranks_bad)?;
    if ranks_bad[0] == 0.0 {
        return Ok(());
    }
    let which = match bad {
        Some((name, i, v)) => format!("`{name}` element {i} is {v}"),
        None => "another rank's stage holds a weight that is not finite".into(),
    };
    Err(TrainError::Diverged(format!(
        "step {step}: the weights are not finite ({which}); the checkpoint of step {step} was \
         not saved (the last good one stays `latest`) and nothing was exported; lower the \
         learning rate or check the plugins with `polychip conform` and --autocompare"
    )))
}

fn save(
    dir: &std::path::Path,
    step: u64,
    stage: &Stage,
    role: &Role,
    opts: &Options,
    plan: &TrainPlan,
    job: Option<&mut Job>,
) -> Result<PathBuf> {
    if role.replica == 0 {
        checkpoint::write_stage(dir, step, stage, role.stage, role.stages)?;
    }
    if let Some(j) = job {
        j.barrier()?;
        if j.rank() != 0 {
            j.barrier()?;
            return Ok(checkpoint::step_dir(dir, step));
        }
        let done = commit(dir, step, opts, plan);
        if done.is_err() {
            checkpoint::discard_partial(dir, step);
        }
        j.barrier()?;
        return done;
    }
    let done = commit(dir, step, opts, plan);
    if done.is_err() {
        checkpoint::discard_partial(dir, step);
    }
    done
}

/// What [`gather_shares`] gathers.
#[derive(Debug, Clone, Copy)]
enum Gathered {
    /// The master values, after each step.
    Values,
    /// The AdamW moments, before a checkpoint.
    Moments,
}

/// After a sharded optimizer step: every rank of each reduction group
/// receives the others' shares (their owner broadcasts each), so every
/// replica holds the same updated weights (and, for a checkpoint, moments).
fn gather_shares(
    stage: &Stage,
    dp: &mut [dp::ReductionGroup],
    shares: &[Vec<Range<usize>>],
    pool: &mut StagingPool,
    what: Gathered,
) -> Result<()> {
    for (g, pieces) in dp.iter_mut().zip(shares) {
        let mut dc = DeviceComm::with_pool(&mut g.comm, std::mem::take(pool));
        let mut run = || -> Result<()> {
            for (owner, piece) in pieces.iter().enumerate() {
                if piece.is_empty() {
                    continue;
                }
                let spans = match what {
                    Gathered::Values => vec![stage.value_span(piece.clone())?],
                    Gathered::Moments => stage.moment_spans(piece.clone())?.to_vec(),
                };
                for span in &spans {
                    dc.broadcast(span, owner)?;
                }
            }
            Ok(())
        };
        let r = run();
        *pool = dc.into_pool();
        r?;
    }
    if matches!(what, Gathered::Values) {
        stage.refresh_compute_weights()?;
    }
    Ok(())
}

fn commit(dir: &std::path::Path, step: u64, opts: &Options, plan: &TrainPlan) -> Result<PathBuf> {
    let stages = plan.groups[0].stages.len();
    let manifest = Manifest {
        format: checkpoint::FORMAT.into(),
        step,
        model: opts.model.clone(),
        train: opts.train.clone(),
        plan: plan.describe(),
        files: (0..stages)
            .map(|i| checkpoint::stage_file(i, stages))
            .collect(),
        sums: Vec::new(),
    };
    checkpoint::commit(dir, &manifest)
}

/// Gathers every rank's stage times (and spans, for the trace) on rank 0.
fn gather(
    opts: &Options,
    role: &Role,
    tracer: &Tracer,
    summary: &mut Summary,
    job: Option<&mut Job>,
) -> Result<()> {
    let label = format!(
        "rank {} {} (replica {}, stage {}, blocks {}..{})",
        role.rank, role.device, role.replica, role.stage, role.range.start, role.range.end
    );
    let mine = serde_json::json!({
        "label": label,
        "forward": summary.forward_seconds,
        "backward": summary.backward_seconds,
        "weight_grad": summary.weight_grad_seconds,
        "reduction": summary.reduction_seconds,
        "optimizer": summary.optimizer_seconds,
        "spans": if opts.trace.is_some() { tracer.to_json() } else { Value::Null },
    });
    let all: Vec<Value> = match job {
        None => vec![mine],
        Some(j) => {
            let store = j.store();
            let (rank, world) = (j.rank(), j.world_size());
            store.set(
                &format!("polychip/train/gather/{rank}"),
                mine.to_string().as_bytes(),
            )?;
            if rank != 0 {
                j.barrier()?;
                return Ok(());
            }
            let mut all = Vec::new();
            for r in 0..world {
                let raw = store.get(
                    &format!("polychip/train/gather/{r}"),
                    Duration::from_secs(120),
                )?;
                all.push(serde_json::from_slice(&raw).unwrap_or(Value::Null));
            }
            j.barrier()?;
            all
        }
    };
    let seconds = |v: &Value, key: &str| v[key].as_f64().unwrap_or(0.0);
    summary.stage_times = all
        .iter()
        .map(|v| StageTimes {
            label: v["label"].as_str().unwrap_or("?").to_string(),
            forward: seconds(v, "forward"),
            backward: seconds(v, "backward"),
            weight_grad: seconds(v, "weight_grad"),
            reduction: seconds(v, "reduction"),
            optimizer: seconds(v, "optimizer"),
        })
        .collect();
    if let Some(path) = &opts.trace {
        let ranks: Vec<(String, Value)> = all
            .iter()
            .map(|v| {
                (
                    v["label"].as_str().unwrap_or("?").to_string(),
                    v["spans"].clone(),
                )
            })
            .collect();
        let text = serde_json::to_string(&trace::chrome_trace(&ranks)).expect("json");
        crate::checkpoint::write_atomic(path, text.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::backward_per_pass;

    #[test]
    fn a_split_passes_weights_count_by_the_share_of_passes_split() {
        // Zero bubble: every pass split, its two parts add up.
        let (b, w) = backward_per_pass(vec![10.0; 8], vec![5.0; 8]);
        assert_eq!((b, w), (15.0, 5.0));
        // Deferred weights: two of sixteen split (their input's parts
        // shorter), the rest whole.
        let mut passes = vec![15.0; 14];
        passes.extend([10.0, 10.0]);
        let (b, w) = backward_per_pass(passes, vec![5.0, 5.0]);
        assert_eq!((b, w), (15.0 + 5.0 / 8.0, 5.0));
        // Nothing split, or nothing run.
        assert_eq!(backward_per_pass(vec![15.0; 4], vec![]), (15.0, 0.0));
        assert_eq!(backward_per_pass(vec![], vec![]), (0.0, 0.0));
    }
}

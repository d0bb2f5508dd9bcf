//! `polychip train`: trains the LLaMA-architecture model on the bundled
//! text (or `--corpus`) across the devices of every loaded plugin, as the
//! plan says: `--plan auto` (the default: HeteroAuto over `--devices`, after
//! profiling each vendor's device on the model), `--plan FILE`, `--stages
//! SPEC` or `--device D` (the whole model on one device). It starts from
//! seeded weights, a checkpoint (`--resume`) or a Hugging Face LLaMA model
//! (`--init-from`), and can write the result as one (`--export-hf`).
//!
//! Outside a launcher a plan of several ranks starts itself as a local job
//! (`polychip launch` underneath); inside one (torchrun, srun, mpirun,
//! `polychip launch`) each process is one rank. Each rank is pinned to its
//! own share of the CPU cores before its plugins start any thread.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use polychip_comm::launch::{LaunchOptions, launch};
use polychip_files::printable_lines;
use polychip_host::{Device, Runtime};
use polychip_planner::measured::MeasuredPlan;
use polychip_planner::profile::ProfileFile;
use polychip_planner::schedule::PipelineSchedule;
use polychip_planner::uncertainty;
use polychip_train::config::{ModelConfig, Precision, TrainConfig};
use polychip_train::data::Corpus;
use polychip_train::plan::TrainPlan;
use polychip_train::trainer::{self, Options, Summary};
use polychip_train::{TrainError, auto, autocompare, checkpoint, hf, memory, pin};

/// Options of `polychip train`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Model preset (mini, tiny, small, deep) or a model TOML file
    /// (default: tiny, or with --resume the checkpoint's model).
    #[arg(long, value_name = "PRESET_OR_FILE")]
    model: Option<String>,
    /// Start from the weights of a Hugging Face LLaMA directory
    /// (config.json and model.safetensors or its shards), which also gives
    /// the model's shape; AdamW starts from zero.
    #[arg(long, value_name = "HF_DIR", conflicts_with_all = ["resume", "model"])]
    init_from: Option<PathBuf>,
    /// Tokens per training sequence (default: the model's; with
    /// --init-from, min(max_position_embeddings, 128)).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<usize>(1))]
    seq_len: Option<usize>,
    /// After training, write the final weights as a Hugging Face LLaMA
    /// directory (config.json, model.safetensors) that transformers'
    /// LlamaForCausalLM.from_pretrained loads; with --steps 0, the initial
    /// weights. The directory must not exist or be empty.
    #[arg(long, value_name = "DIR")]
    export_hf: Option<PathBuf>,
    /// Training settings TOML file (the flags below override it).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Optimizer steps.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<u64>(0))]
    steps: Option<u64>,
    /// Sequences per step over all replicas.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<usize>(1))]
    global_batch: Option<usize>,
    /// Peak learning rate.
    #[arg(long, value_name = "LR", allow_hyphen_values = true, value_parser = crate::numbers::Number)]
    lr: Option<f64>,
    /// Seed of initialization and data order.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<u64>(0))]
    seed: Option<u64>,
    /// Compute precision: f32 or bf16.
    #[arg(long, value_name = "TYPE")]
    precision: Option<String>,
    /// Validate every N steps (0: at the end only).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<u64>(0))]
    eval_every: Option<u64>,
    /// The layout: `auto` (HeteroAuto over --devices), `auto-pp` (pipelines
    /// mixing types only), `auto-dp` (replicas of one type each only), or a
    /// plan file (TOML with [[group]] tables, or JSON).
    #[arg(long, value_name = "auto|auto-pp|auto-dp|FILE", conflicts_with_all = ["stages", "device"])]
    plan: Option<String>,
    /// One pipeline: `DEVICE=FIRST..END,...` (e.g. `ferrite:0=0..3,cobalt:0=3..4`).
    #[arg(long, value_name = "SPEC", conflicts_with = "device")]
    stages: Option<String>,
    /// The whole model on one device (e.g. `ferrite:0`).
    #[arg(long, value_name = "DEVICE")]
    device: Option<String>,
    /// Replicas of the --stages/--device pipeline.
    /// (default 1; not with --plan, whose file or search sets it).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<usize>(1))]
    copies: Option<usize>,
    /// Sequences per micro-batch for --stages/--device.
    /// (default 2; not with --plan, whose file or search sets it).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<usize>(1))]
    micro_batch_size: Option<usize>,
    /// Devices --plan auto may use (default: the first device of every vendor).
    #[arg(long, value_name = "LIST")]
    devices: Option<String>,
    /// A text file to train on (default: the bundled Tiny Shakespeare).
    #[arg(long, value_name = "FILE")]
    corpus: Option<PathBuf>,
    /// Save checkpoints under this directory.
    #[arg(long, value_name = "DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// Save every N steps (and after the last).
    #[arg(long, value_name = "N", default_value_t = 0, allow_negative_numbers = true, value_parser = crate::numbers::whole::<u64>(0))]
    save_every: u64,
    /// Resume from a checkpoint (a step directory, or a directory with
    /// `latest`; `polychip checkpoint import-hf` makes one of a Hugging
    /// Face model).
    #[arg(long, value_name = "PATH")]
    resume: Option<PathBuf>,
    /// With --resume: continue even though the checkpoint was saved with
    /// other training settings (--lr, --seed, --global-batch, --precision or
    /// the --config values that shape the run); each change is printed.
    /// Without it such a resume is refused, naming the setting.
    #[arg(long, requires = "resume")]
    allow_changed_settings: bool,
    /// Stop after step N of the schedule, counted from its start (a resumed
    /// run's too: N must be after the checkpoint's step); the schedule still
    /// ends at --steps.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<u64>(1))]
    stop_after: Option<u64>,
    /// Write a Chrome trace of the run here (and of the simulator's step for
    /// the same plan beside it, `.sim.json`).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Replay every op of the first step on the f64 reference and name the
    /// first whose output diverges beyond its tolerance (exit status 1 then).
    #[arg(long)]
    autocompare: bool,
    /// Write the run's summary (loss curve, step times, plan) as JSON here.
    #[arg(long, value_name = "FILE")]
    log_json: Option<PathBuf>,
    /// Print one line every N steps.
    #[arg(long, value_name = "N", default_value_t = 10, allow_negative_numbers = true, value_parser = crate::numbers::whole::<u64>(0))]
    log_every: u64,
    /// The CPU cores the job may use (e.g. `0`, `0-1`, `0,2`); each rank
    /// gets its own share (default: every core this process may use).
    #[arg(long, value_name = "LIST", allow_hyphen_values = true)]
    cores: Option<String>,
    /// Do not pin ranks to CPU cores.
    #[arg(long)]
    no_pin: bool,
    /// With `--plan auto` and more ranks than cores (or cores that do not
    /// divide evenly among them): `auto` (the default) profiles and plans each distinct
    /// way the devices can share the cores and keeps the plan expecting
    /// the shortest step (at most 6 ways; more: the listed order's);
    /// `listed` keeps the `--devices` order's: the device at place `p`
    /// gets the cores rank `p` would.
    #[arg(long, value_enum, value_name = "HOW")]
    core_order: Option<CoreOrder>,
    /// Write the resolved plan (JSON) here and exit without training: plan
    /// once, then start the ranks under any launcher with `--plan FILE`.
    #[arg(long, value_name = "FILE")]
    save_plan: Option<PathBuf>,
    /// Shard the optimizer step over the data-parallel replicas: each
    /// updates a share of the parameters in proportion to its stage's
    /// `optimizer_weight` (given in the plan file, or else its replica's
    /// share of the batch) and the updated weights are gathered. `--plan
    /// auto` does this by itself where its measured search predicts it
    /// faster.
    #[arg(long, conflicts_with = "no_shard_optimizer")]
    shard_optimizer: bool,
    /// Never shard the optimizer step (not even where `--plan auto` would,
    /// nor where the plan file gives weights).
    #[arg(long)]
    no_shard_optimizer: bool,
    /// Reduce the gradients after the whole backward pass, instead of
    /// reducing each bucket (about 1 MiB of consecutive layers) while the
    /// last micro-batch's backward pass goes on through the layers before
    /// it. The results are the same bits either way; this is for
    /// comparison, or for a plugin whose streams misbehave.
    #[arg(long)]
    reduce_after_backward: bool,
    /// Send each activation and gradient from the stage's own thread,
    /// waiting for its transfer, instead of queueing it for the rank's
    /// sender thread and going on. The results are the same bits either
    /// way; this is for comparison.
    #[arg(long)]
    blocking_sends: bool,
    /// The pipeline schedule: `1f1b`; `1f1b-deferred`, 1f1b whose stages
    /// after the first send the input gradients of their last two
    /// micro-batches before computing those weights' gradients, at the end
    /// of the step, so that the pipeline drains sooner (the last stage
    /// holds one micro-batch more at its end); `zero-bubble`, which does so
    /// for every micro-batch, each weights' pass right after, and runs
    /// deeper warm-up, so that a stage waits less (it keeps more
    /// activations, and needs queued sends); or `gpipe` (every forward
    /// pass, then every backward pass: the same bubble as 1f1b, and the
    /// activations of every micro-batch held). The results are the same
    /// bits. Default: the plan's; `--plan auto` prices 1f1b, 1f1b-deferred
    /// and zero-bubble and takes the fastest; otherwise 1f1b.
    #[arg(long, value_name = "SCHEDULE")]
    schedule: Option<PipelineSchedule>,
    /// How far each pipeline stage may run ahead of the next, as a multiple
    /// of the schedule's own lead (1f1b: one micro-batch per later stage;
    /// zero-bubble: two), from 1 (the schedule as published) to 64. A stage
    /// running further ahead holds more micro-batches' activations, and
    /// the micro-batches it buffers carry the next stage through its
    /// neighbour's slow spells (a busy machine). The results are the same
    /// bits. Default: the plan's; `--plan auto` gives 4 where every stage's
    /// memory allows (else the most that fits); otherwise 1.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<usize>(1).most(polychip_planner::schedule::MAX_RUN_AHEAD as u64))]
    run_ahead: Option<usize>,
    /// With `--plan auto`: the relative error assumed of each device
    /// kind's profile (0 to 0.5). The search takes the layout expecting
    /// the shortest step when any kind may run that much slower or faster
    /// than profiled, rather than the layout of the shortest predicted
    /// step, which is often one balanced on the profile's errors. 0 takes
    /// the shortest predicted step. Default 0.05 (how far the bundled
    /// devices' passes in training land from their profile on a quiet
    /// machine; 0.1 suits a busy one).
    #[arg(long, value_name = "FRACTION", allow_hyphen_values = true, value_parser = crate::numbers::Number)]
    profile_error: Option<f64>,
    /// With `--plan auto`: plan from this profile file (as `--save-profile`
    /// or `polychip profile` writes it, or written by hand; format in
    /// docs/planner.md) instead of profiling the devices. It must be of
    /// this model and precision and give every device kind.
    #[arg(long, value_name = "FILE")]
    profile: Option<PathBuf>,
    /// With `--plan auto`: write the profiles the plan was made from (one
    /// entry per device kind and micro-batch size) to this file, for
    /// `--profile` (planning again without profiling) or `polychip plan
    /// --profile`.
    #[arg(long, value_name = "FILE")]
    save_profile: Option<PathBuf>,
    /// Rebalance every N steps by the measured speeds: deal the batch
    /// between the data-parallel replicas (one stage each, or pipelines)
    /// again (each keeps its micro-batch size and at least one sequence, a
    /// pipeline its memory), or, for a plan of one pipeline, move the cuts
    /// between its stages (each keeps a key/value head or a column of
    /// blocks and must fit its memory). A change is taken when it is
    /// predicted to shorten the step by more than three times the
    /// measurements' noise and at least 1% (5% until four steps are
    /// measured). A new deal moves the losses' last bits (the sequences
    /// are grouped differently); moved cuts leave f32 losses as they were.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<u64>(1))]
    rebalance_every: Option<u64>,
    /// Internal: the resolved plan (JSON) handed to the ranks.
    #[arg(long, hide = true, value_name = "FILE")]
    resolved_plan: Option<PathBuf>,
}

/// Runs `polychip train`.
pub fn run(args: &Args) -> ExitCode {
    match train(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("polychip train: {}", printable_lines(&e.to_string()));
            ExitCode::from(2)
        }
    }
}

/// The model: the Hugging Face directory's (`--init-from`), `--model`, the
/// resumed checkpoint's, or the `tiny` preset; `--seq-len` replaces its
/// sequence length.
fn model(args: &Args) -> Result<ModelConfig, TrainError> {
    if let Some(dir) = &args.init_from {
        // Reads the config and every header: all is checked before training.
        return Ok(hf::HfModel::open(dir, args.seq_len)?.model().clone());
    }
    let mut model = match (&args.model, &args.resume) {
        (Some(m), _) => ModelConfig::from_arg(m)?,
        (None, Some(r)) => checkpoint::read_manifest(r)?.1.model,
        (None, None) => ModelConfig::preset("tiny")?,
    };
    if let Some(s) = args.seq_len {
        model.seq_len = s;
        model
            .validate()
            .map_err(|m| TrainError::Config(format!("--seq-len: {m}")))?;
    }
    Ok(model)
}

fn settings(args: &Args) -> Result<(ModelConfig, TrainConfig), TrainError> {
    let model = model(args)?;
    let mut t = match &args.config {
        Some(p) => TrainConfig::load(p)?,
        None => TrainConfig::default(),
    };
    if let Some(v) = args.steps {
        t.steps = v;
    }
    if let Some(v) = args.global_batch {
        t.global_batch = v;
    }
    if let Some(v) = args.lr {
        t.lr = v;
        t.min_lr = t.min_lr.min(v);
    }
    if let Some(v) = args.seed {
        t.seed = v;
    }
    if let Some(v) = &args.precision {
        t.precision = Precision::parse(v)?;
    }
    if let Some(v) = args.eval_every {
        t.eval_every = v;
    }
    t.validate()?;
    Ok((model, t))
}

fn corpus(args: &Args) -> Result<Corpus, TrainError> {
    match &args.corpus {
        Some(p) => Corpus::load(p),
        None => Ok(Corpus::bundled()),
    }
}

/// The devices `--plan auto` plans over.
pub(crate) fn device_pool(rt: &Runtime, spec: Option<&str>) -> Result<Vec<Device>, TrainError> {
    let names = trainer::device_names(rt);
    match spec {
        None => {
            let mut seen = Vec::new();
            let mut out = Vec::new();
            for d in rt.devices() {
                let v = d.plugin().vendor().to_lowercase();
                if !seen.contains(&v) {
                    seen.push(v);
                    out.push(d.clone());
                }
            }
            Ok(out)
        }
        Some(list) => {
            if list.trim().is_empty() {
                return Err(TrainError::Config(format!(
                    "--devices is empty; give a comma-separated list of devices (the devices are \
                     {})",
                    names.join(", ")
                )));
            }
            let mut picked: Vec<usize> = Vec::new();
            for (at, s) in list.split(',').enumerate() {
                let want = s.trim().to_lowercase();
                if want.is_empty() {
                    let ql = polychip_comm::text::quoted(list);
                    return Err(TrainError::Config(format!(
                        "--devices {ql}: entry {} is empty; give a comma-separated list of \
                         devices such as ferrite:0,cobalt:0",
                        at + 1
                    )));
                }
                let i = names.iter().position(|n| *n == want).ok_or_else(|| {
                    TrainError::Plan(format!(
                        "--devices names {}, which is not present; the devices are {}",
                        polychip_comm::text::quoted(&want),
                        names.join(", ")
                    ))
                })?;
                if picked.contains(&i) {
                    return Err(TrainError::Config(format!(
                        "--devices names {want} twice; list each device once"
                    )));
                }
                picked.push(i);
            }
            Ok(picked
                .into_iter()
                .map(|i| rt.devices()[i].clone())
                .collect())
        }
    }
}

/// How `--plan auto` places the devices on the cores (`--core-order`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CoreOrder {
    /// Try each distinct pairing.
    Auto,
    /// The `--devices` order's.
    Listed,
}

/// The most pairings of devices on cores `--core-order auto` profiles.
const MAX_PAIRINGS: usize = 6;

/// The plan, resolved once (in the launching process).
fn resolve_plan(
    args: &Args,
    rt: &Runtime,
    model: &ModelConfig,
    t: &TrainConfig,
    cores: &[usize],
) -> Result<TrainPlan, TrainError> {
    if let Some(p) = &args.resolved_plan {
        return TrainPlan::load(p);
    }
    if args.schedule.is_some() || args.run_ahead.is_some() {
        let (s, a) = (
            args.schedule.unwrap_or_default(),
            args.run_ahead.unwrap_or(1),
        );
        trainer::check_schedule(s, a, !args.blocking_sends)?;
    }
    let auto_mode = plans_automatically(args);
    for (flag, given) in [
        ("--profile", args.profile.is_some()),
        ("--save-profile", args.save_profile.is_some()),
        ("--core-order", args.core_order.is_some()),
    ] {
        if given && !auto_mode {
            return Err(TrainError::Plan(format!(
                "{flag} applies to --plan auto, auto-pp or auto-dp only; this job's layout is \
                 given"
            )));
        }
    }
    let profile_error = match args.profile_error {
        Some(e) if !auto_mode => {
            return Err(TrainError::Plan(format!(
                "--profile-error {} applies to --plan auto, auto-pp or auto-dp only; this \
                 job's layout is given",
                polychip_planner::cluster::fmt_num(e)
            )));
        }
        Some(e) if !(0.0..=uncertainty::MAX_SIGMA).contains(&e) => {
            return Err(TrainError::Plan(format!(
                "--profile-error {} is not a fraction between 0 and {}",
                polychip_planner::cluster::fmt_num(e),
                uncertainty::MAX_SIGMA
            )));
        }
        Some(e) => e,
        None => auto::PROFILE_ERROR,
    };
    let (mbs, copies) = (micro_batch_size(args), copies(args));
    let per_replica = t.global_batch / copies;
    let micro = |what: &str| -> Result<usize, TrainError> {
        if per_replica * copies != t.global_batch || per_replica % mbs != 0 {
            return Err(TrainError::Plan(format!(
                "{what}: a global batch of {} does not split into {} replicas of micro-batches of {mbs}",
                t.global_batch, copies
            )));
        }
        Ok(per_replica / mbs)
    };
    if let Some(d) = &args.device {
        let mut plan = TrainPlan::single(d, model.layers, mbs, micro("--device")?);
        plan.groups[0].copies = copies;
        return Ok(plan);
    }
    if let Some(s) = &args.stages {
        return TrainPlan::parse_stages(s, copies, mbs, micro("--stages")?);
    }
    match args.plan.as_deref() {
        Some(file) if auto::AutoMode::parse(file).is_none() => TrainPlan::load(Path::new(file)),
        mode => {
            let mode = mode
                .and_then(auto::AutoMode::parse)
                .unwrap_or(auto::AutoMode::Best);
            let devices = device_pool(rt, args.devices.as_deref())?;
            // Every device profiled at once, each in a process of its own
            // bound to the share of the cores its rank will get.
            let pinned = (!args.no_pin).then_some(cores);
            let choices = auto::Choices {
                shard_optimizer: !args.no_shard_optimizer,
                overlap_reduction: !args.reduce_after_backward,
                async_sends: !args.blocking_sends,
                schedule: args.schedule,
                profile_error,
            };
            if args.core_order == Some(CoreOrder::Auto) && (args.profile.is_some() || args.no_pin) {
                return Err(TrainError::Plan(format!(
                    "--core-order auto profiles each way the devices can share the cores; {}",
                    match args.profile.is_some() {
                        true => {
                            "--profile gives a profile measured under one (the file's \
                             core_order, else the listed order's)"
                        }
                        false => "--no-pin leaves the ranks unbound",
                    }
                )));
            }
            let given = match &args.profile {
                Some(path) => Some(ProfileFile::load(path).map_err(|e| {
                    TrainError::Plan(format!("--profile: {}", crate::plan::file_error(&e, path)))
                })?),
                None => None,
            };
            let label = args
                .profile
                .as_ref()
                .map(|p| format!("--profile {}", polychip_files::shown_path(p)))
                .unwrap_or_default();
            // Which devices share a core (with more ranks than cores, or
            // cores that do not divide evenly) decides much of the step:
            // each distinct pairing is profiled and planned, and the plan
            // expecting the shortest step is kept. A profile file was
            // measured under one pairing: the file's core order, else the
            // listed one.
            let identity: Vec<usize> = (0..devices.len()).collect();
            let orders = match (pinned, &given, args.core_order.unwrap_or(CoreOrder::Auto)) {
                (Some(cores), None, CoreOrder::Auto) => {
                    let kinds: Vec<String> = devices
                        .iter()
                        .map(|d| d.plugin().vendor().to_lowercase())
                        .collect();
                    let kinds: Vec<&str> = kinds.iter().map(String::as_str).collect();
                    pin::distinct_orders(&kinds, cores, MAX_PAIRINGS).unwrap_or_else(|| {
                        eprintln!(
                            "the {} devices can share the {} cores in more than {MAX_PAIRINGS} \
                             ways: planning for the listed order's only",
                            devices.len(),
                            cores.len()
                        );
                        vec![identity.clone()]
                    })
                }
                // A profile file's own pairing, where it gives one for
                // these devices.
                _ => vec![match given.as_ref().and_then(|f| f.core_order.as_ref()) {
                    Some(order) => file_order(order, &devices).unwrap_or_else(|| {
                        eprintln!(
                            "{label}: its core order ({}) is not of the devices planned; they \
                             take the cores in the --devices order",
                            order.join(", ")
                        );
                        identity.clone()
                    }),
                    None => identity.clone(),
                }],
            };
            let mut best: Option<(TrainPlan, MeasuredPlan, Vec<auto::Profile>, Vec<Device>)> = None;
            for order in &orders {
                let devices: Vec<Device> = order.iter().map(|&i| devices[i].clone()).collect();
                let mut measure = |sizes: &[usize]| {
                    crate::profile_ranks::profile(model, t, &devices, sizes, pinned)
                };
                let source = match &given {
                    Some(f) => auto::Profiles::File(f, &label),
                    None => auto::Profiles::Measure(&mut measure),
                };
                let (plan, found, profiles) =
                    auto::auto_plan(model, t, &devices, mode, choices, pinned, source)?;
                if orders.len() > 1 {
                    let names: Vec<String> = devices.iter().map(trainer::device_name).collect();
                    let n = names.len();
                    let placed: Vec<(&str, Vec<usize>)> = names
                        .iter()
                        .enumerate()
                        .map(|(at, name)| (name.as_str(), pin::share(cores, at, n)))
                        .collect();
                    eprintln!(
                        "{}: predicted step {:.1} ms, expected {:.1} ms under a {:.0}% profile \
                         error",
                        sharing(&placed),
                        found.step_seconds * 1e3,
                        found.expected_step_seconds * 1e3,
                        profile_error * 100.0
                    );
                }
                if best
                    .as_ref()
                    .is_none_or(|(_, f, ..)| found.expected_step_seconds < f.expected_step_seconds)
                {
                    best = Some((plan, found, profiles, devices));
                }
            }
            let (plan, found, profiles, devices) = best.expect("one order at least");
            if let Some(path) = &args.save_profile {
                let source = match &args.profile {
                    Some(p) => format!("polychip train --profile {} (read back) on", polychip_files::shown_path(p)),
                    None => "polychip train --plan auto, profiled side by side (a process per device) on"
                        .into(),
                };
                let mut file = auto::to_file(model, t, &devices, &profiles, &source);
                // Which devices shared a core while profiled.
                file.core_order = plan.core_order.clone();
                let text = serde_json::to_string_pretty(&file)
                    .map_err(|e| TrainError::Plan(format!("--save-profile: {e}")))?;
                polychip_train::checkpoint::write_atomic(path, text.as_bytes()).map_err(|e| {
                    TrainError::Plan(format!(
                        "--save-profile {}: {e}",
                        polychip_files::shown_path(path)
                    ))
                })?;
                eprintln!("profile written to {}", polychip_files::shown_path(path));
            }
            for p in &profiles {
                let c = &p.costs;
                let stage = c.stage_forward + c.stage_backward;
                eprintln!(
                    "{} {} (micro-batch {}): block {:.2} ms, embedding {:.2} ms, head {:.2} \
                     ms (forward + backward), optimizer {:.1} ns per parameter{}{}",
                    match given {
                        Some(_) => "profile read for",
                        None => "profiled",
                    },
                    p.device,
                    p.micro_batch,
                    p.block_seconds() * 1e3,
                    (c.embed_forward + c.embed_backward) * 1e3,
                    (c.head_forward + c.head_backward) * 1e3,
                    c.optimizer_per_param * 1e9,
                    match stage > 0.0 {
                        true => format!(", {:.2} ms more for any stage", stage * 1e3),
                        false => String::new(),
                    },
                    match c.held() {
                        (1.0, 1.0) => String::new(),
                        (f, b) => format!(
                            ", blocks {:+.1}%/{:+.1}% (forward/backward) holding a second \
                             micro-batch",
                            100.0 * (f - 1.0),
                            100.0 * (b - 1.0)
                        ),
                    }
                );
            }
            let expected = match found.expected_step_seconds > found.step_seconds * (1.0 + 1e-9) {
                true => format!(
                    " (expected {:.1} ms under a {:.0}% profile error)",
                    found.expected_step_seconds * 1e3,
                    profile_error * 100.0
                ),
                false => String::new(),
            };
            eprintln!(
                "plan (HeteroAuto, measured costs, {} layouts): {}; predicted step {:.1} ms{expected}, \
                 {:.0} tokens/s, HeteroSpeedupRatio {:.1}%",
                found.candidates,
                plan.describe(),
                found.step_seconds * 1e3,
                (t.global_batch * model.seq_len) as f64 / found.step_seconds,
                found.speedup_ratio * 100.0
            );
            Ok(plan)
        }
    }
}

/// The cores a launched rank binds to: its share of `cores` among the
/// ranks of its machine, by its device's place in the plan's `core_order`
/// (where `--plan auto` profiled it) when the job runs on one machine and
/// its plan file gives one, else by its local rank.
fn rank_cores(
    args: &Args,
    info: &polychip_comm::env::RankInfo,
    cores: &[usize],
) -> Result<Vec<usize>, TrainError> {
    let by_rank = || pin::share(cores, info.local_rank, info.local_world_size.max(1));
    let file = args.resolved_plan.as_deref().or(args
        .plan
        .as_deref()
        .filter(|p| auto::AutoMode::parse(p).is_none())
        .map(Path::new));
    let (Some(file), true) = (file, info.local_world_size == info.world_size) else {
        return Ok(by_rank());
    };
    // Read again (and checked) when the plan is resolved.
    let plan = TrainPlan::load(file)?;
    if plan.core_order.is_none() || plan.world_size() != info.world_size {
        return Ok(by_rank());
    }
    let (at, n) = plan.core_positions()[info.rank];
    Ok(pin::share(cores, at, n))
}

/// The order of `devices` that `order` (device names) gives, when it
/// names each of them once.
fn file_order(order: &[String], devices: &[Device]) -> Option<Vec<usize>> {
    let names: Vec<String> = devices.iter().map(trainer::device_name).collect();
    let at: Vec<usize> = order
        .iter()
        .map(|o| names.iter().position(|n| n == o))
        .collect::<Option<_>>()?;
    let mut sorted = at.clone();
    sorted.sort_unstable();
    sorted.dedup();
    (sorted.len() == names.len() && at.len() == names.len()).then_some(at)
}

/// With more ranks than `cores`, which devices' ranks share which core
/// (each rank pinned as [`rank_cores`] pins it).
fn print_core_sharing(plan: &TrainPlan, cores: &[usize]) {
    let roles = plan.roles();
    if roles.len() <= cores.len() {
        return;
    }
    let placed: Vec<(&str, Vec<usize>)> = roles
        .iter()
        .zip(plan.core_positions())
        .map(|(r, (at, n))| (r.device.as_str(), pin::share(cores, at, n)))
        .collect();
    eprintln!(
        "{} ranks on {} cores: {}",
        roles.len(),
        cores.len(),
        sharing(&placed)
    );
}

/// Which devices run on which cores (`core 0: cobalt:0, opencl:0; core 1:
/// ferrite:0`), from each device's name and cores.
fn sharing(placed: &[(&str, Vec<usize>)]) -> String {
    let mut groups: Vec<(&[usize], Vec<&str>)> = Vec::new();
    for (name, on) in placed {
        match groups.iter_mut().find(|(c, _)| *c == on.as_slice()) {
            Some((_, names)) => names.push(name),
            None => groups.push((on, vec![name])),
        }
    }
    groups.sort_by_key(|(on, _)| on.first().copied());
    groups
        .iter()
        .map(|(on, names)| {
            let list: Vec<String> = on.iter().map(usize::to_string).collect();
            format!(
                "{} {}: {}",
                if on.len() == 1 { "core" } else { "cores" },
                list.join(","),
                names.join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Whether the job's layout is searched (`--plan auto`, `auto-pp`,
/// `auto-dp`, or no layout given), not given (`--device`, `--stages`, a
/// plan file).
fn plans_automatically(args: &Args) -> bool {
    args.device.is_none()
        && args.stages.is_none()
        && args
            .plan
            .as_deref()
            .is_none_or(|p| auto::AutoMode::parse(p).is_some())
}

/// The pipeline schedule: `--schedule`, else the plan's, else 1F1B.
fn schedule(args: &Args, plan: &TrainPlan) -> PipelineSchedule {
    args.schedule.or(plan.schedule).unwrap_or_default()
}

/// How far each stage runs ahead: `--run-ahead`, else the plan's, else 1.
fn run_ahead(args: &Args, plan: &TrainPlan) -> usize {
    args.run_ahead.or(plan.run_ahead).unwrap_or(1)
}

fn train(args: &Args) -> Result<ExitCode, TrainError> {
    check_distinct_files(args)?;
    if let Some(out) = &args.export_hf {
        // Refuse before training, not after, naming the flag as the other
        // outputs' checks do.
        hf::check_new_dir(out).map_err(|e| TrainError::Config(format!("--export-hf {e}")))?;
    }
    let (model, t) = settings(args)?;
    check_flags(args, &t)?;
    let launched = polychip_comm::env::launched();
    let info = polychip_comm::env::from_env()?;
    polychip_comm::env::timeout_from_env()?;
    // Every output path is checked before anything is planned or trained:
    // the checkpoint directory by every rank (each writes its own part), the
    // files by the process that writes them (rank 0, or the launching one).
    if let Some(dir) = &args.checkpoint_dir {
        check_output_dir("--checkpoint-dir", dir)?;
        polychip_train::checkpoint::check_lock_file(dir).map_err(|m| {
            TrainError::Config(format!(
                "--checkpoint-dir {}: {m}",
                polychip_files::shown_path(dir)
            ))
        })?;
        polychip_train::checkpoint::check_root_for_run(dir, args.resume.as_deref())?;
    }
    if !launched || info.rank == 0 {
        let mut files: Vec<(&str, PathBuf)> = Vec::new();
        if let Some(p) = &args.trace {
            files.push(("--trace", p.clone()));
            files.push(("--trace", p.with_extension("sim.json")));
        }
        if let Some(p) = &args.log_json {
            files.push(("--log-json", p.clone()));
        }
        if let Some(p) = &args.save_plan {
            files.push(("--save-plan", p.clone()));
        }
        if let Some(p) = &args.save_profile {
            files.push(("--save-profile", p.clone()));
        }
        for (flag, path) in &files {
            check_output_file(flag, path)?;
        }
    }
    let corpus = corpus(args)?;
    // Pin before any plugin starts a thread: ranks share the cores out.
    let cores = match &args.cores {
        Some(list) => parse_cores(list)?,
        None => pin::allowed_cores(),
    };
    if !args.no_pin {
        let mine = match launched {
            true => rank_cores(args, &info, &cores)?,
            false => cores.clone(),
        };
        pin_to(&mine)?;
    }
    // Each plugin is loaded in a child process first: one that crashes or
    // hangs while loading is reported by name instead of ending the run.
    let rt = crate::devices::runtime_from_env().map_err(TrainError::Config)?;
    for f in rt.failures() {
        eprintln!("polychip train: a plugin failed to load: {}", f.error);
    }
    // ABI rules 12 and 13: what loading a plugin changed that it must not
    // (put back by the host). Handlers and variables, which real drivers
    // set, are `polychip devices`' notes, not repeated on every run.
    if !launched || info.rank == 0 {
        for finding in rt.plugins().iter().flat_map(|p| p.load_findings()) {
            eprintln!("polychip train: warning: {finding}");
        }
    }
    let planned_here = args.resolved_plan.is_none() && plans_automatically(args);
    if launched && planned_here && args.save_plan.is_none() {
        return Err(TrainError::Plan(
            "under a launcher every rank must run the same plan: write it once with \
             `polychip train --plan auto --save-plan plan.json` (same model and batch), then \
             give each rank --plan plan.json (or use --stages / --device)"
                .into(),
        ));
    }
    let mut plan = resolve_plan(args, &rt, &model, &t, &cores)?;
    let kinds: Vec<(String, String)> = rt
        .devices()
        .iter()
        .map(|d| (d.props().name.clone(), d.plugin().vendor().to_string()))
        .collect();
    plan.name_vendors(&kinds)?;
    if args.no_shard_optimizer && plan.shards_optimizer() {
        plan.unshard_optimizer();
        plan.predicted_step_seconds = None;
    }
    if args.shard_optimizer && !plan.shards_optimizer() {
        plan.shard_optimizer_by_batch();
        // A plan searched without it was priced without it.
        plan.predicted_step_seconds = None;
    }
    if let Some(s) = args.schedule {
        if plan.schedule.is_some_and(|p| p != s) {
            // Priced under the other schedule.
            plan.predicted_step_seconds = None;
        }
        plan.schedule = Some(s);
    }
    if let Some(r) = args.run_ahead {
        plan.run_ahead = Some(r);
    }
    let (sched, ahead) = (schedule(args, &plan), run_ahead(args, &plan));
    trainer::check_schedule(sched, ahead, !args.blocking_sends)?;
    plan.validate(&model, t.global_batch)?;
    if args.rebalance_every.is_some() {
        polychip_train::rebalance::check_rebalancing(&plan.roles())?;
    }
    if !launched && !args.no_pin {
        print_core_sharing(&plan, &cores);
    }
    if let Some(path) = &args.save_plan {
        let text = serde_json::to_string_pretty(&plan).expect("a plan serializes");
        crate::outputs::write("--save-plan", path, text.as_bytes()).map_err(TrainError::Config)?;
        println!(
            "plan written to {}: {}",
            polychip_files::shown_path(path),
            plan.describe()
        );
        return Ok(ExitCode::SUCCESS);
    }
    if !launched {
        // Check every stage's memory here, once, where all devices are known.
        let roles = plan.roles();
        let all: Vec<_> = roles.iter().collect();
        polychip_train::plan::check_devices(&all, &trainer::device_names(&rt))?;
        for r in &roles {
            let d = rt
                .devices()
                .iter()
                .find(|d| trainer::device_name(d) == r.device)
                .expect("roles name present devices");
            memory::check_role(&model, t.precision, r, sched, ahead, d)?;
        }
        if plan.world_size() > 1 {
            return relaunch(&plan);
        }
    }
    let mut job = if launched || plan.world_size() > 1 {
        Some(polychip_comm::bootstrap::init()?)
    } else {
        None
    };
    let opts = Options {
        model: model.clone(),
        train: t.clone(),
        plan: plan.clone(),
        corpus,
        checkpoint_dir: args.checkpoint_dir.clone(),
        save_every: args.save_every,
        resume: args.resume.clone(),
        allow_changed_settings: args.allow_changed_settings,
        init_from: args.init_from.clone(),
        export_hf: args.export_hf.clone(),
        trace: args.trace.clone(),
        stop_after: args.stop_after,
        log_every: args.log_every,
        record_first_step: args.autocompare,
        rebalance_every: args.rebalance_every,
        overlap_reduction: !args.reduce_after_backward,
        async_sends: !args.blocking_sends,
        schedule: sched,
        run_ahead: ahead,
    };
    let rank = job.as_ref().map_or(0, |j| j.rank());
    if let Some(j) = &job {
        polychip_train::stop::on_termination(rank, j.world_size());
    }
    if rank == 0 {
        println!(
            "training {} ({}) on {} for {} steps of {} sequences of {} bytes, {:?}; plan {}",
            model.name,
            model.size_text(),
            corpus_name(args),
            t.steps,
            t.global_batch,
            model.seq_len,
            t.precision,
            plan.describe()
        );
    }
    let summary = match trainer::run(&opts, &rt, job.as_mut()) {
        Ok(s) => s,
        Err(e) => {
            // Report at once instead of after an exit barrier the others
            // never reach (they find this rank gone instead), and before
            // leaving: a peer that finds this rank gone fails, and the
            // launcher then stops this rank, perhaps before it has printed.
            eprintln!("polychip train: {}", printable_lines(&e.to_string()));
            if let Some(j) = job {
                j.abandon();
            }
            return Ok(ExitCode::from(2));
        }
    };
    let mut diverged = false;
    if args.autocompare {
        let report = autocompare::compare(&summary.records);
        let device = &plan.roles()[rank].device;
        println!("{device}: {}", report.summary());
        diverged = !report.passed();
    }
    if rank == 0 {
        report(args, &model, &plan, &summary)?;
    }
    if let Some(j) = job {
        j.finish()?;
    }
    // A divergence found by --autocompare fails the command (after the job
    // has ended cleanly on every rank), so scripts can rely on it.
    Ok(if diverged {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Refuses flag values that would train nothing, or silently do something
/// other than asked, before anything starts.
fn check_flags(args: &Args, t: &TrainConfig) -> Result<(), TrainError> {
    let bad = |m: String| Err(TrainError::Config(m));
    if args.plan.is_some() {
        for (flag, given) in [
            ("--micro-batch-size", args.micro_batch_size.is_some()),
            ("--copies", args.copies.is_some()),
        ] {
            if given {
                return bad(format!(
                    "{flag} applies to --stages and --device only; with --plan the plan file \
                     or the search sets it"
                ));
            }
        }
    }
    let (micro_batch, copies) = (micro_batch_size(args), copies(args));
    if micro_batch == 0 {
        return bad("--micro-batch-size is 0; a micro-batch holds at least 1 sequence".into());
    }
    if micro_batch > polychip_train::config::MAX_GLOBAL_BATCH {
        return bad(format!(
            "--micro-batch-size is {}, more than the {} sequences a global batch may hold",
            micro_batch,
            polychip_train::config::MAX_GLOBAL_BATCH
        ));
    }
    if copies == 0 {
        return bad("--copies is 0; a plan has at least 1 replica".into());
    }
    if args.rebalance_every == Some(0) {
        return bad(
            "--rebalance-every is 0; deal again every 1 step or more, or leave it out".into(),
        );
    }
    if args.run_ahead == Some(0) {
        return bad(format!(
            "--run-ahead is 0; it must be a whole number from 1 (the schedule as published) to {}",
            polychip_planner::schedule::MAX_RUN_AHEAD
        ));
    }
    if copies > polychip_comm::env::MAX_WORLD_SIZE {
        return bad(format!(
            "--copies is {}, more than the {} ranks a job may have",
            copies,
            polychip_comm::env::MAX_WORLD_SIZE
        ));
    }
    if t.steps == 0
        && args.checkpoint_dir.is_none()
        && args.export_hf.is_none()
        && args.save_plan.is_none()
    {
        return bad(
            "--steps is 0, so nothing would be trained or written; give --steps 1 or more, \
             or --checkpoint-dir / --export-hf to write the initial weights"
                .into(),
        );
    }
    if args.save_every > 0 && args.checkpoint_dir.is_none() {
        return bad(format!(
            "--save-every {} needs --checkpoint-dir: there is nowhere to save the checkpoints",
            args.save_every
        ));
    }
    if args.stop_after == Some(0) {
        return bad("--stop-after is 0, so no step would run; give 1 or more".into());
    }
    Ok(())
}

/// `--micro-batch-size`, 2 by default.
fn micro_batch_size(args: &Args) -> usize {
    args.micro_batch_size.unwrap_or(2)
}

/// `--copies`, 1 by default.
fn copies(args: &Args) -> usize {
    args.copies.unwrap_or(1)
}

/// Refuses an output that is one of the run's input files, or another of
/// its outputs (`--log-json` over the corpus, `--trace` and `--log-json`
/// at one path, `--export-hf` into the checkpoint directory), before
/// anything runs. (`--resume` from the checkpoint directory it saves into
/// is how a run goes on, and stays allowed.)
fn check_distinct_files(args: &Args) -> Result<(), TrainError> {
    fn file(a: &Option<String>) -> Option<&Path> {
        a.as_deref().and_then(crate::outputs::file_arg)
    }
    let sim = args.trace.as_ref().map(|p| p.with_extension("sim.json"));
    crate::outputs::check_distinct(
        &[
            ("--config", args.config.as_deref()),
            ("--model", file(&args.model)),
            ("--plan", file(&args.plan)),
            ("--corpus", args.corpus.as_deref()),
            ("--profile", args.profile.as_deref()),
            ("--init-from", args.init_from.as_deref()),
        ],
        &[
            ("--trace", args.trace.as_deref()),
            ("--trace (its simulated step)", sim.as_deref()),
            ("--log-json", args.log_json.as_deref()),
            ("--save-plan", args.save_plan.as_deref()),
            ("--save-profile", args.save_profile.as_deref()),
            ("--checkpoint-dir", args.checkpoint_dir.as_deref()),
            ("--export-hf", args.export_hf.as_deref()),
        ],
    )
    .map_err(TrainError::Config)
}

/// [`crate::outputs::check_file`], as a configuration error.
pub(crate) fn check_output_file(flag: &str, path: &Path) -> Result<(), TrainError> {
    crate::outputs::check_file(flag, path).map_err(TrainError::Config)
}

/// [`crate::outputs::check_dir`], as a configuration error.
fn check_output_dir(flag: &str, dir: &Path) -> Result<(), TrainError> {
    crate::outputs::check_dir(flag, dir).map_err(TrainError::Config)
}

pub(crate) fn pin_to(cores: &[usize]) -> Result<(), TrainError> {
    pin::pin(cores).map_err(|e| TrainError::Plan(format!("pinning to cores {cores:?}: {e}")))
}

pub(crate) fn parse_cores(list: &str) -> Result<Vec<usize>, TrainError> {
    let allowed = pin::allowed_cores();
    let mut out = Vec::new();
    let ql = polychip_comm::text::quoted(list);
    for part in list.split(',') {
        let part = part.trim();
        let qp = polychip_comm::text::quoted(part);
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (Ok(a), Ok(b)) = (a.trim().parse::<usize>(), b.trim().parse::<usize>()) else {
            return Err(TrainError::Config(format!(
                "--cores {ql}: {qp} is not a core number or range like 0-3"
            )));
        };
        if a > b {
            return Err(TrainError::Config(format!(
                "--cores {ql}: the range {qp} is empty (its first core is above its last)"
            )));
        }
        for c in a..=b {
            if !allowed.contains(&c) {
                return Err(TrainError::Config(format!(
                    "--cores {ql}: core {c} is not available to this process (allowed: {allowed:?})"
                )));
            }
            out.push(c);
        }
    }
    Ok(out)
}

fn corpus_name(args: &Args) -> String {
    args.corpus
        .as_ref()
        .map_or("the bundled Tiny Shakespeare".into(), |p| {
            polychip_files::shown_path(p)
        })
}

fn report(args: &Args, cfg: &ModelConfig, plan: &TrainPlan, s: &Summary) -> Result<(), TrainError> {
    if let (Some(predicted), true) = (plan.predicted_step_seconds, s.median_step_seconds > 0.0) {
        println!(
            "the planner predicted {:.1} ms per step; measured {:.1} ms ({:+.1}%)",
            predicted * 1e3,
            s.median_step_seconds * 1e3,
            (s.median_step_seconds / predicted - 1.0) * 100.0
        );
    }
    if let Some(last) = s.steps.last() {
        println!(
            "done: step {} loss {:.4}{}; median step {:.1} ms, {:.0} tokens/s",
            last.step,
            last.loss,
            last.val_loss
                .map_or(String::new(), |v| format!(", validation loss {v:.4}")),
            s.median_step_seconds * 1e3,
            s.tokens_per_s
        );
    }
    // Ranks in order, as the plan numbers them.
    let roles = plan.roles();
    for (r, t) in s.stage_times.iter().enumerate() {
        let predicted = roles
            .get(r)
            .and_then(|role| plan.groups[role.group].stages[role.stage].predicted_passes)
            // The plan's predictions are of its cuts, not of moved ones.
            .filter(|[f, b]| *f > 0.0 && *b > 0.0 && s.recuts.is_empty())
            .map_or(String::new(), |[f, b]| {
                format!(
                    " (predicted {:.2} and {:.2}: {:+.1}%, {:+.1}%)",
                    f * 1e3,
                    b * 1e3,
                    (t.forward / f - 1.0) * 100.0,
                    (t.backward / b - 1.0) * 100.0
                )
            });
        println!(
            "  {}: forward {:.2} ms, backward {:.2} ms per micro-batch{predicted}",
            t.label,
            t.forward * 1e3,
            t.backward * 1e3
        );
    }
    suggest_rebalancing(args, cfg, plan, s);
    if let Some(c) = &s.checkpoint {
        println!("checkpoint: {}", polychip_files::shown_path(c));
    }
    if let Some(out) = &s.exported {
        println!(
            "exported the weights after step {} as a Hugging Face LLaMA model: {}",
            s.steps.last().map_or(s.start_step, |r| r.step),
            polychip_files::shown_path(out)
        );
    }
    if let Some(trace) = &args.trace {
        let (step, sim) = polychip_train::simulate::simulated(plan, s);
        let sim_path = trace.with_extension("sim.json");
        crate::outputs::write("--trace", &sim_path, sim.to_string().as_bytes())
            .map_err(TrainError::Config)?;
        println!(
            "trace: {} (the simulator's step for this plan with the measured stage times, \
             {:.1} ms against {:.1} ms measured: {})",
            polychip_files::shown_path(trace),
            step * 1e3,
            s.median_step_seconds * 1e3,
            polychip_files::shown_path(&sim_path)
        );
    }
    if let Some(path) = &args.log_json {
        let json = serde_json::json!({
            "plan": plan,
            "summary": s,
        });
        let text = serde_json::to_string_pretty(&json).expect("json");
        crate::outputs::write("--log-json", path, text.as_bytes()).map_err(TrainError::Config)?;
    }
    Ok(())
}

/// For a run without `--rebalance-every` of data-parallel replicas or of
/// one pipeline: when the measured passes say the deal (or the pipeline's
/// cuts) holds the step back by more than 5%, says by how much and what
/// would deal (or cut) by measured speed.
fn suggest_rebalancing(args: &Args, cfg: &ModelConfig, plan: &TrainPlan, s: &Summary) {
    use polychip_train::rebalance;
    let roles = plan.roles();
    if args.rebalance_every.is_some() || s.stage_times.len() != roles.len() {
        return;
    }
    let per_rank: Vec<f64> = s
        .stage_times
        .iter()
        .map(|t| t.forward + t.backward)
        .collect();
    if rebalance::moves_cuts(&roles) {
        let now: Vec<_> = roles.iter().map(|r| r.range).collect();
        // The run's medians, whose spread is not kept: a gain over 5%.
        // (Every stage's memory is checked when the cuts move.)
        let better = polychip_train::recut::better_cuts(
            cfg,
            &now,
            &per_rank,
            rebalance::UNKNOWN_NOISE,
            &|_, _| true,
        );
        if let Some(r) = better {
            println!(
                "the stages' measured passes (the slowest {:.1} ms a micro-batch) say the cuts \
                 hold the step back: cut as {} the slowest would take {:.0}% less; \
                 --rebalance-every 10 moves the cuts so while training",
                r.now * 1e3,
                polychip_train::recut::replan(plan, &r.cuts).describe(),
                r.gain() * 100.0
            );
        }
        return;
    }
    if rebalance::check(&roles).is_err() {
        return;
    }
    let now: Vec<usize> = roles
        .iter()
        .filter(|r| r.stage == 0)
        .map(|r| r.sequences)
        .collect();
    let (sched, ahead) = (schedule(args, plan), run_ahead(args, plan));
    let global = now.iter().sum();
    let (Some(replicas), Some((deal, gain))) = (
        rebalance::replicas(&roles, &per_rank, sched, ahead),
        // The run's medians, whose spread is not kept: a gain over 5%.
        rebalance::better_deal(
            &roles,
            &roles,
            &per_rank,
            rebalance::UNKNOWN_NOISE,
            global,
            sched,
            ahead,
        ),
    ) else {
        return;
    };
    let paces: Vec<String> = replicas
        .iter()
        .map(|r| format!("{:.1} ms", r.slowest * 1e3))
        .collect();
    println!(
        "the replicas' measured passes ({} a micro-batch at the slowest stage) say the deal ({}) \
         holds the step back: dealt {} the slowest would take {:.0}% less; \
         --rebalance-every 10 deals so while training",
        rebalance::describe(&roles, &paces),
        rebalance::describe(&roles, &now),
        rebalance::describe(&roles, &deal),
        gain * 100.0
    );
}

/// Starts this command again as the ranks of a local job, handing them the
/// resolved plan.
fn relaunch(plan: &TrainPlan) -> Result<ExitCode, TrainError> {
    // A new file only this user can read, under a name no other process
    // can guess (pid and 64 random bits), never following a planted link.
    let file = std::env::temp_dir().join(format!(
        "polychip-train-plan-{}.json",
        polychip_comm::shm::unique_job_name()
    ));
    polychip_comm::auth::write_private(
        &file,
        serde_json::to_string(plan).expect("json").as_bytes(),
    )
    .map_err(|e| {
        TrainError::Config(format!(
            "the job's plan could not be written to {} for its ranks: {e} (the temporary \
             directory, from TMPDIR or /tmp, must exist and be writable)",
            polychip_files::shown_path(&file)
        ))
    })?;
    let exe = std::env::current_exe().map_err(|e| TrainError::io("polychip", e))?;
    let mut command = vec![exe.display().to_string()];
    command.extend(std::env::args().skip(1));
    command.push("--resolved-plan".into());
    command.push(file.display().to_string());
    let outcome = launch(&LaunchOptions::new(plan.world_size(), command));
    let _ = std::fs::remove_file(&file);
    let outcome = outcome?;
    if outcome.stdout_closed {
        return Ok(crate::closed_pipe_exit());
    }
    if !outcome.success() {
        eprintln!("polychip train: {}", outcome.description);
        let code = u8::try_from(outcome.exit_code)
            .ok()
            .filter(|&c| c != 0)
            .unwrap_or(1);
        return Ok(ExitCode::from(code));
    }
    Ok(ExitCode::SUCCESS)
}

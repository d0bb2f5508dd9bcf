//! `polychip plan --cluster FILE --model PRESET_OR_FILE [--seq-len N] [--global-batch N]
//! [--dtype bf16] [--recompute none|selective|full] [--recompute-method uniform|block]
//! [--recompute-num-layers N] [--recompute-modules core_attn,mlp,...] [--shard-optimizer]
//! [--zero-stage N] [--overlap-grad-reduce] [--overlap-param-gather] [--context-parallel N]
//! [--expert-parallel N] [--expert-tensor-parallel N] [--fp8] [--half-gradients]
//! [--no-flash-attention] [--schedule 1f1b|1f1b-deferred|zero-bubble|gpipe]
//! [--profile FILE] [--exhaustive] [--json] [--trace out.json]`: runs the
//! HeteroAuto search (`polychip_planner::search`) and prints the plan as a
//! table (or JSON), optionally writing a Chrome trace of its simulated
//! step; with `--evaluate PLAN` it scores that plan instead
//! (`polychip_planner::evaluate`), with `--score RUNS` a file of measured
//! runs (`polychip_planner::validate`). The cluster is a cluster TOML file or
//! `polychip devices --json` output (`.json`); the model a planner preset,
//! a trainer preset (tiny, deep, ...), a model TOML file or a Hugging Face
//! model's directory or `config.json` (`polychip_planner::hf`). Exit status 2
//! when an input is invalid or no plan fits, with the reason on stderr.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use polychip_files::{MAX_TEXT_FILE, printable_lines, read_text_file};
use polychip_planner::cluster::ClusterSpec;
use polychip_planner::error::SpecError;
use polychip_planner::evaluate::{self, Evaluation, PlanSpec};
use polychip_planner::model::ModelSpec;
use polychip_planner::profile::ProfileFile;
use polychip_planner::schedule::PipelineSchedule;
use polychip_planner::search::{self, PlanOptions, PlanReport, fmt_bytes};
use polychip_planner::settings::{
    Dtype, LossKernel, Recompute, RecomputeMethod, RecomputeModule, TrainingSettings,
};
use polychip_planner::validate::{self, RunsFile, ScoredRun, Scores};
use polychip_train::config::ModelConfig;

/// Options of `polychip plan`.
/// `--global-batch` when it is not given (and no plan is evaluated).
const DEFAULT_GLOBAL_BATCH: u64 = 1024;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The cluster file (TOML; see examples/clusters/), or `polychip
    /// devices --json` output (a `.json` file: one chip type per device
    /// name).
    #[arg(long, value_name = "FILE")]
    cluster: PathBuf,
    /// A model preset (llama-7b, llama-13b, llama-70b, h2-100b; or the
    /// trainer's mini, tiny, small, deep), a model TOML file, or a Hugging
    /// Face model: its directory or its config.json (any dense decoder:
    /// LLaMA, Mistral, Qwen, GPT-2, OPT, Falcon, ...).
    #[arg(long, value_name = "PRESET_OR_FILE")]
    model: String,
    /// The training sequence length, in place of the model's [default: the
    /// model's; a Hugging Face config's context, at most 4096].
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<u64>(1))]
    seq_len: Option<u64>,
    /// Multi-token-prediction layers trained beside the model (DeepSeek-V3's
    /// 1, a Hugging Face config's `num_nextn_predict_layers`; Megatron-LM's
    /// `--mtp-num-layers`), in place of the model's [default: the model
    /// TOML's `mtp_layers`; none for a Hugging Face config].
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<u64>(0))]
    mtp_layers: Option<u64>,
    /// Score this plan (`polychip plan --json` or `polychip train
    /// --save-plan` output, or a plan TOML) instead of searching.
    #[arg(long, value_name = "PLAN")]
    evaluate: Option<PathBuf>,
    /// Score the cost model against measured runs: a runs file (JSON: each
    /// run's plan, measured seconds per step or `"ran": false`; see
    /// docs/planner.md) evaluated run by run, with Spearman, regret, median
    /// error and fit/no-fit agreement.
    #[arg(long, value_name = "RUNS", conflicts_with_all = ["evaluate", "trace", "exhaustive", "global_batch"])]
    score: Option<PathBuf>,
    /// Price the chip types this profile covers (`polychip profile`
    /// output) from its measurements.
    #[arg(long, value_name = "FILE")]
    profile: Option<PathBuf>,
    /// Sequences per optimizer step [default: 1024; with --evaluate, the
    /// plan's own: its groups' copies x micro-batch size x micro-batches].
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<u64>(1))]
    global_batch: Option<u64>,
    /// Compute dtype: f32, bf16 or f16 [default: bf16; with --evaluate of a
    /// `polychip plan --json` report, the report's].
    #[arg(long, value_name = "TYPE")]
    dtype: Option<String>,
    /// Activation recomputation: none, selective or full [default: none;
    /// with --evaluate of a report, the report's].
    #[arg(long, value_name = "KIND")]
    recompute: Option<String>,
    /// Under --recompute full, which layers are recomputed: uniform (every
    /// layer, inputs kept per group of --recompute-num-layers) or block
    /// (only the first --recompute-num-layers of each stage), as
    /// Megatron-LM's --recompute-method [default: uniform; with --evaluate
    /// of a report, the report's].
    #[arg(long, value_name = "METHOD")]
    recompute_method: Option<String>,
    /// Megatron-LM's --recompute-num-layers under --recompute full [default:
    /// 1; with --evaluate of a report, the report's].
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<u64>(1))]
    recompute_num_layers: Option<u64>,
    /// Selective recomputation of these parts of a layer, comma-separated,
    /// as Megatron-LM's --recompute-modules names them: core_attn,
    /// layernorm, mla_up_proj, mlp, moe, moe_act, shared_experts; implies
    /// --recompute selective [default: core_attn; with --evaluate of a
    /// report, the report's].
    #[arg(long, value_name = "MODULES", value_delimiter = ',')]
    recompute_modules: Option<Vec<String>>,
    /// Shard the optimizer state over data-parallel replicas (ZeRO-1).
    #[arg(long)]
    shard_optimizer: bool,
    /// The ZeRO stage the replicas shard the training state to: 0, 1 (the
    /// optimizer state, as --shard-optimizer), 2 (and the gradients,
    /// reduce-scattered every micro-batch) or 3 (and the weights, gathered
    /// for every pass: DeepSpeed's ZeRO-3, FSDP) [default: 0; with
    /// --evaluate of a report, the report's].
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<u8>(0))]
    zero_stage: Option<u8>,
    /// Context parallelism with --evaluate: each stage's sequences split over
    /// this many groups of its tp chips (Megatron-LM's
    /// --context-parallel-size) [default: 1; with --evaluate of a report,
    /// the report's].
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<u64>(1))]
    context_parallel: Option<u64>,
    /// Expert parallelism for a mixture-of-experts model: each stage's
    /// replicas in groups of N, each chip holding 1/N of every layer's
    /// experts (Megatron-LM's --expert-model-parallel-size) [default: 1;
    /// with --evaluate of a report, the report's].
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<u64>(1))]
    expert_parallel: Option<u64>,
    /// With expert parallelism, each expert split over N chips of a stage's
    /// tensor-parallel group (Megatron-LM's --expert-tensor-parallel-size;
    /// DeepSeek-V3's and Qwen3-235B's recipes take 1) [default: each
    /// stage's tp; with --evaluate of a report, the report's].
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<u64>(1))]
    expert_tensor_parallel: Option<u64>,
    /// With a mixture of experts, search each expert-parallel degree that
    /// divides its experts (1, 2, 4, ... up to 64), each at the tp and with
    /// every expert whole on a chip (unless --expert-tensor-parallel gives
    /// a degree), and keep the fastest plan, naming the degrees tried.
    #[arg(long, conflicts_with_all = ["expert_parallel", "evaluate", "score"])]
    search_expert_parallel: bool,
    /// FP8 training: the layers' weight matmuls in FP8 at each chip type's
    /// peak_flops.fp8 (Transformer Engine's recipes, Megatron-LM's
    /// --fp8-format), beside a bf16 or f16 --dtype.
    #[arg(long)]
    fp8: bool,
    /// The data-parallel gradient reduction overlaps the last backward pass
    /// in buckets (Megatron-LM's --overlap-grad-reduce, PyTorch DDP's
    /// default, DeepSpeed's overlap_comm) instead of following it.
    #[arg(long)]
    overlap_grad_reduce: bool,
    /// With the optimizer state sharded (--shard-optimizer), the updated
    /// weights' all-gather overlaps the next step's first forward pass
    /// (Megatron-LM's --overlap-param-gather).
    #[arg(long)]
    overlap_param_gather: bool,
    /// Gradients kept and all-reduced in 16 bits (2 bytes a parameter, not
    /// 4): Megatron-LM's fp16/bf16 gradient buffer without
    /// `--accumulate-allreduce-grads-in-fp32`, DeepSpeed's fp16 and bf16
    /// optimizers' `.grad`; not PyTorch AMP, whose gradients are f32.
    #[arg(long)]
    half_gradients: bool,
    /// Attention without a fused (flash) kernel: the `a s^2` scores go
    /// through memory and are kept for the backward pass.
    #[arg(long)]
    no_flash_attention: bool,
    /// Tensor parallelism without sequence parallelism (Megatron-LM without
    /// `--sequence-parallel`, DeepSpeed's Megatron): the norms' and
    /// dropouts' activations are whole on every chip of a group.
    #[arg(long)]
    no_sequence_parallel: bool,
    /// How the framework's loss holds the last stage's logits, bytes a
    /// logit in bf16: in-place (Megatron-LM's vocabulary-parallel
    /// cross-entropy of 2020-22 and since June 2024, Megatron-Core's; 6),
    /// out-of-place (Megatron-LM 2022-24, Microsoft's Megatron-DeepSpeed;
    /// 10), cloned (Megatron-LM v1; 14), eager (PyTorch's cross_entropy
    /// over f32 logits; 12) or fused (Transformer Engine's before July
    /// 2026, the gradient written into the logits; 2). Chip types counted
    /// as `polychip train` runs (`framework = "polychip"`) keep their own.
    /// See docs/planner.md.
    #[arg(long, value_name = "KIND")]
    loss: Option<LossKernel>,
    /// The pipelines' schedule: 1f1b (Megatron-LM's and DeepSpeed's, the
    /// default), 1f1b-deferred and zero-bubble (as `polychip train
    /// --schedule` runs them) or gpipe (all forward passes, then all backward passes: PyTorch's
    /// `ScheduleGPipe`; more activations held).
    /// With --evaluate it overrides the plan file's `schedule`.
    #[arg(long, value_name = "SCHEDULE")]
    schedule: Option<PipelineSchedule>,
    /// Enumerate every plan of the space without pruning (small cases).
    #[arg(long)]
    exhaustive: bool,
    /// Stop searching after this many seconds and report the best plan
    /// found so far, with a note (0: no limit).
    #[arg(long, value_name = "SECS", default_value_t = search::DEFAULT_TIME_LIMIT_SECONDS,
          allow_negative_numbers = true,
          value_parser = crate::numbers::whole::<u64>(0).most(604_800))]
    search_timeout: u64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Write a Chrome trace (Perfetto) of the plan's simulated step here.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
}

/// Runs `polychip plan`.
pub fn run(args: &Args) -> ExitCode {
    match plan(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("polychip plan: {}", printable_lines(&e));
            ExitCode::from(2)
        }
    }
}

/// A cluster TOML file, or `polychip devices --json` output.
fn load_cluster(path: &Path) -> Result<ClusterSpec, String> {
    if path.extension().is_some_and(|e| e == "json") {
        let text = read_text_file(path, MAX_TEXT_FILE)
            .map_err(|e| format!("could not read {}: {e}", polychip_files::shown_path(path)))?;
        let json: serde_json::Value = polychip_files::parse_json_value(&text)
            .map_err(|e| format!("{} is not JSON: {e}", polychip_files::shown_path(path)))?;
        let (cluster, notes) = ClusterSpec::from_devices_json_with_notes(&json)
            .map_err(|e| format!("{}: {e}", polychip_files::shown_path(path)))?;
        for note in notes {
            eprintln!(
                "{}",
                printable_lines(&format!(
                    "note: {}: {note}",
                    polychip_files::shown_path(path)
                ))
            );
        }
        return Ok(cluster);
    }
    ClusterSpec::load(path).map_err(|e| file_error(&e, path))
}

/// The planner's error about the file `path`, with the path written as
/// every other message of the command writes one
/// ([`polychip_files::shown_path`]: escaped, cut after 200 characters): the
/// planner's loaders write it whole, as `Path::display` does (its first
/// occurrence in the message is the one they wrote).
pub(crate) fn file_error(e: &SpecError, path: &Path) -> String {
    crate::outputs::reshown(&e.to_string(), path)
}

/// A planner preset, a trainer preset, a model TOML file (the planner's
/// fields, or the trainer's), or a Hugging Face model (its directory or
/// its `config.json`); `seq_len` and `mtp_layers` in place of the
/// model's.
fn load_model(
    arg: &str,
    seq_len: Option<u64>,
    mtp_layers: Option<u64>,
) -> Result<ModelSpec, String> {
    let mut model = read_model(arg, seq_len)?;
    if let Some(s) = seq_len {
        model.seq_len = s;
        model
            .validate()
            .map_err(|e| format!("--seq-len {s}: {e}"))?;
    }
    if let Some(n) = mtp_layers {
        model.mtp_layers = n;
        model
            .validate()
            .map_err(|e| format!("--mtp-layers {n}: {e}"))?;
    }
    Ok(model)
}

fn read_model(arg: &str, seq_len: Option<u64>) -> Result<ModelSpec, String> {
    let path = Path::new(arg);
    // A directory with a config.json of any kind (a FIFO there is refused
    // by name, unread, as any file the planner reads).
    let config = path.join("config.json");
    if arg.ends_with(".json") || config.symlink_metadata().is_ok() {
        let (model, notes) = ModelSpec::load_hf(path, seq_len).map_err(|e| match e {
            SpecError::Io { .. } => file_error(&e, path),
            e => e.to_string(),
        })?;
        for note in notes {
            eprintln!("note: {}: {note}", polychip_files::shown_path(path));
        }
        return Ok(model);
    }
    // A name that can only be a file (a directory in it, or `.toml`) is
    // read as one, so that a missing file is said to be missing.
    if path.is_file() || arg.contains('/') || arg.ends_with(".toml") {
        return match ModelSpec::load(path) {
            Ok(m) => Ok(m),
            // Either format is read: when neither reads it, both say why
            // (a trainer model's `dim` is "unknown" to the planner's).
            Err(planner) => ModelConfig::from_arg(arg)
                .map(|c| c.planner_spec())
                .map_err(|trainer| match planner {
                    SpecError::Io { .. } => file_error(&planner, path),
                    _ => format!(
                        "{}\nread as polychip train's model format instead (`dim` for \
                         `hidden`): {trainer}",
                        file_error(&planner, path)
                    ),
                }),
        };
    }
    match ModelSpec::preset(arg) {
        Ok(m) => Ok(m),
        Err(planner) => ModelConfig::preset(arg)
            .map(|c| c.planner_spec())
            .map_err(|_| format!("{planner}, nor a trainer preset (mini, tiny, small, deep)")),
    }
}

fn plan(args: &Args) -> Result<(), String> {
    let mut cluster = load_cluster(&args.cluster)?;
    let model = load_model(&args.model, args.seq_len, args.mtp_layers)?;
    if let Some(trace) = &args.trace {
        // Before searching, not after.
        crate::outputs::check_file("--trace", trace)?;
        crate::outputs::check_distinct(
            &[
                ("--cluster", Some(&args.cluster)),
                ("--model", crate::outputs::file_arg(&args.model)),
                ("--evaluate", args.evaluate.as_deref()),
                ("--profile", args.profile.as_deref()),
            ],
            &[("--trace", Some(trace))],
        )?;
    }
    let max = polychip_planner::settings::MAX_GLOBAL_BATCH;
    let global_batch = args.global_batch.unwrap_or(DEFAULT_GLOBAL_BATCH);
    if global_batch > max {
        return Err(format!(
            "--global-batch is {global_batch}, more than the planner accepts ({max} sequences)"
        ));
    }
    // A plan to evaluate is read first: a `polychip plan --json` report
    // records the settings it was made under, which are the defaults here
    // (a flag given overrides its own).
    let spec = match &args.evaluate {
        Some(p) => Some(PlanSpec::load(p).map_err(|e| file_error(&e, p))?),
        None => None,
    };
    let runs = match &args.score {
        Some(p) => Some(RunsFile::load(p).map_err(|e| e.to_string())?),
        None => None,
    };
    let recorded = spec.as_ref().and_then(|s| s.settings.clone());
    let mut settings = recorded
        .clone()
        .or_else(|| runs.as_ref().and_then(|r| r.settings.clone()))
        .unwrap_or_else(|| TrainingSettings::new(global_batch));
    settings.global_batch = global_batch;
    if let Some(d) = &args.dtype {
        settings.dtype = match d.as_str() {
            "f32" => Dtype::F32,
            "bf16" => Dtype::Bf16,
            "f16" => Dtype::F16,
            d => return Err(format!("--dtype {d}: expected f32, bf16 or f16")),
        };
    }
    if let Some(r) = &args.recompute {
        settings.recompute = match r.as_str() {
            "none" => Recompute::None,
            "selective" => Recompute::Selective,
            "full" => Recompute::Full,
            r => return Err(format!("--recompute {r}: expected none, selective or full")),
        };
    }
    if let Some(m) = &args.recompute_method {
        settings.recompute_method = match m.as_str() {
            "uniform" => RecomputeMethod::Uniform,
            "block" => RecomputeMethod::Block,
            m => return Err(format!("--recompute-method {m}: expected uniform or block")),
        };
    }
    if let Some(n) = args.recompute_num_layers {
        settings.recompute_num_layers = n;
    }
    if let Some(names) = &args.recompute_modules {
        let mut modules = Vec::new();
        for name in names {
            let module = RecomputeModule::from_name(name.trim()).ok_or_else(|| {
                let known: Vec<&str> = RecomputeModule::ALL.iter().map(|(n, _)| *n).collect();
                format!(
                    "--recompute-modules {name}: expected some of {}",
                    known.join(", ")
                )
            })?;
            if !modules.contains(&module) {
                modules.push(module);
            }
        }
        settings.recompute_modules = modules;
        if args.recompute.is_none() {
            settings.recompute = Recompute::Selective;
        }
    }
    settings.shard_optimizer |= args.shard_optimizer;
    if let Some(z) = args.zero_stage {
        settings.zero_stage = z;
    }
    settings.overlap_grad_reduce |= args.overlap_grad_reduce;
    settings.overlap_param_gather |= args.overlap_param_gather;
    if let Some(c) = args.context_parallel {
        settings.context_parallel = c;
    }
    if let Some(e) = args.expert_parallel {
        settings.expert_parallel = e;
    }
    if let Some(e) = args.expert_tensor_parallel {
        settings.expert_tensor_parallel = e;
    }
    settings.fp8 |= args.fp8;
    settings.bf16_gradients |= args.half_gradients;
    settings.flash_attention &= !args.no_flash_attention;
    settings.sequence_parallel &= !args.no_sequence_parallel;
    if let Some(loss) = args.loss {
        settings.loss = loss;
    }
    if let Some(schedule) = args.schedule {
        settings.schedule = schedule;
    }
    if let (Some(recorded), Some(p)) = (&recorded, &args.evaluate) {
        let changed = flags_changing(recorded, &settings);
        if !changed.is_empty() {
            eprintln!(
                "{}",
                printable_lines(&format!(
                    "note: {}: made under other settings than the flags give ({}); evaluated \
                     under the flags'",
                    polychip_files::shown_path(p),
                    changed.join(", ")
                ))
            );
        }
    }
    if let (Some((name, seq_len)), Some(p)) = (
        spec.as_ref().and_then(|s| s.made_for.clone()),
        &args.evaluate,
    ) {
        if name != model.name || seq_len != model.seq_len {
            eprintln!(
                "{}",
                printable_lines(&format!(
                    "note: {}: planned for model {name:?} with sequences of {seq_len}; evaluated for \
                     {:?} with sequences of {}",
                    polychip_files::shown_path(p),
                    model.name,
                    model.seq_len
                ))
            );
        }
    }
    if let Some(p) = &args.profile {
        let profile = ProfileFile::load(p).map_err(|e| file_error(&e, p))?;
        let applied = cluster
            .apply_profile(&profile, &model, &settings)
            .map_err(|e| format!("{}: {e}", polychip_files::shown_path(p)))?;
        let mut notes = Vec::new();
        if !applied.ignored.is_empty() {
            notes.push(format!(
                "note: {} has entries for chips the cluster does not have ({}); they are left out",
                polychip_files::shown_path(p),
                applied.ignored.join(", ")
            ));
        }
        notes.extend(applied.estimated.iter().map(|e| {
            format!(
                "note: {}: {e} not given; estimated by the cost model, scaled to the measured block",
                polychip_files::shown_path(p)
            )
        }));
        notes.extend(
            applied
                .implausible
                .iter()
                .map(|e| format!("warning: {}: {e}", polychip_files::shown_path(p))),
        );
        // A profile of thousands of entries gives as many notes: the first
        // few, and how many more.
        const SHOWN: usize = 20;
        for n in notes.iter().take(SHOWN) {
            eprintln!("{}", printable_lines(n));
        }
        if notes.len() > SHOWN {
            eprintln!(
                "note: {}: {} more notes and warnings like these",
                polychip_files::shown_path(p),
                notes.len() - SHOWN
            );
        }
    }
    if let Some(mut runs) = runs {
        // --schedule overrides a run's plan's own, as with --evaluate (it
        // was silently left to the plan's).
        if args.schedule.is_some() {
            for run in &mut runs.runs {
                run.plan.schedule = None;
            }
        }
        let score = args.score.as_deref().unwrap_or(Path::new(""));
        let made_for_other = |r: &validate::MeasuredRun| {
            r.plan
                .made_for
                .as_ref()
                .is_some_and(|(name, seq_len)| *name != model.name || *seq_len != model.seq_len)
        };
        note_runs(
            score,
            &runs,
            made_for_other,
            &format!(
                "made for another model or sequence length; all are evaluated for {:?} with \
                 sequences of {}",
                model.name, model.seq_len
            ),
        );
        // A report's recorded settings are left aside for the runs file's
        // and the flags': said, as --evaluate says it.
        note_runs(
            score,
            &runs,
            |r| {
                r.plan
                    .settings
                    .as_ref()
                    .is_some_and(|s| !flags_changing(s, &settings).is_empty())
            },
            "made under other training settings than the runs file's and the flags'; all are \
             evaluated under those",
        );
        let runs = &runs;
        let scored = validate::score_runs(runs, &model, &cluster, &settings).map_err(|e| {
            format!(
                "{}: {e}",
                polychip_files::shown_path(args.score.as_deref().unwrap_or(Path::new("")))
            )
        })?;
        let scores = validate::scores(&scored);
        if args.json {
            let doc = serde_json::json!({ "settings": settings, "runs": scored, "scores": scores });
            println!(
                "{}",
                serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?
            );
        } else {
            // The settings every run was priced under, as the other
            // outputs open.
            let text = format!(
                "{}{}",
                settings_line(&settings),
                scores_table(&scored, &scores)
            );
            print!("{}", printable_lines(&text));
        }
        return Ok(());
    }
    if let (Some(mut spec), Some(plan_file)) = (spec, args.evaluate.as_deref()) {
        if args.schedule.is_some() {
            spec.schedule = None;
        }
        // What the plan says against the model and the cluster is said of
        // the plan file.
        let ev = evaluate::evaluate(&spec, &model, &cluster, &settings)
            .map_err(|e| e.of_plan_file(plan_file).to_string())?;
        // The plan's groups fix its batch; a --global-batch that differs
        // is said, not silently dropped.
        if let Some(n) = args.global_batch
            && n != ev.plan.global_batch
        {
            eprintln!(
                "{}",
                printable_lines(&format!(
                    "note: {}: its groups take {} sequences per step (copies x micro-batch size \
                     x micro-batches), not --global-batch {n}; the plan's are evaluated",
                    polychip_files::shown_path(plan_file),
                    ev.plan.global_batch
                ))
            );
        }
        if let Some(trace) = &args.trace {
            let text = serde_json::to_string(
                &ev.plan
                    .chrome_trace()
                    .map_err(|e| format!("--trace: {e}"))?,
            )
            .map_err(|e| e.to_string())?;
            crate::outputs::write("--trace", trace, text.as_bytes())?;
        }
        if args.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&ev).map_err(|e| e.to_string())?
            );
        } else {
            let text = format!("{}{}", settings_line(&settings), evaluation_table(&ev));
            print!("{}", printable_lines(&text));
        }
        return Ok(());
    }
    let options = PlanOptions {
        exhaustive: args.exhaustive,
        time_limit_seconds: args.search_timeout,
        ..PlanOptions::default()
    };
    let report = match args.search_expert_parallel {
        false => search::plan(&model, &cluster, &settings, &options).map_err(|e| e.to_string())?,
        true => search_expert_degrees(&model, &cluster, &settings, &options)?,
    };
    if report.time_limited {
        eprintln!(
            "note: the search reached its time limit of {} s after {} candidates and stopped: \
             the plan is the best of those, not necessarily the best of the space (allow more \
             with --search-timeout)",
            args.search_timeout, report.candidates
        );
    }
    if let Some(trace) = &args.trace {
        let text = serde_json::to_string(
            &report
                .plan
                .chrome_trace()
                .map_err(|e| format!("--trace: {e}"))?,
        )
        .map_err(|e| e.to_string())?;
        crate::outputs::write("--trace", trace, text.as_bytes())?;
    }
    if args.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        println!("{text}");
    } else {
        let text = format!("{}{}", settings_line(&report.settings), table(&report));
        print!("{}", printable_lines(&text));
    }
    Ok(())
}

/// `--search-expert-parallel`: [`search::plan_expert_degrees`], with a
/// note naming what each degree gave.
fn search_expert_degrees(
    model: &ModelSpec,
    cluster: &ClusterSpec,
    settings: &TrainingSettings,
    options: &PlanOptions,
) -> Result<PlanReport, String> {
    let (best, tried) = search::plan_expert_degrees(model, cluster, settings, options)
        .map_err(|e| format!("--search-expert-parallel: {e}"))?;
    let degrees = |ep: u64, etp: u64| match etp {
        0 => ep.to_string(),
        e => format!("{ep} (expert tp {e})"),
    };
    let tried: Vec<String> = tried
        .iter()
        .map(|(d, tokens)| match tokens {
            Some(t) => format!("{}: {t:.0} tokens/s", degrees(d.ep, d.etp)),
            None => format!("{}: no plan", degrees(d.ep, d.etp)),
        })
        .collect();
    eprintln!(
        "note: expert parallelism searched at {}; the plan is at {}",
        tried.join(", "),
        degrees(
            best.settings.expert_parallel,
            best.settings.expert_tensor_parallel
        )
    );
    Ok(best)
}

/// The line that opens the text outputs: the settings a plan is priced
/// under, those at their defaults left out but the dtype.
fn settings_line(s: &TrainingSettings) -> String {
    use polychip_planner::settings::RecomputeMethod;
    let mut parts = vec![match s.fp8 {
        true => format!("{} with FP8 matmuls", s.dtype),
        false => s.dtype.to_string(),
    }];
    match s.zero() {
        0 => {}
        1 => parts.push("ZeRO-1 (optimizer state sharded)".into()),
        z => parts.push(format!("ZeRO-{z}")),
    }
    if s.overlap_grad_reduce {
        parts.push("gradient reduction overlapped".into());
    }
    if s.overlap_param_gather {
        parts.push("weight gather overlapped".into());
    }
    if s.bf16_gradients {
        parts.push("16-bit gradients".into());
    }
    match (s.recompute, s.recompute_method, s.recompute_num_layers) {
        (Recompute::None, ..) => {}
        (Recompute::Selective, ..) if s.recompute_modules.is_empty() => {
            parts.push("selective recomputation".into())
        }
        (Recompute::Selective, ..) => {
            let names: Vec<&str> = s.recompute_modules.iter().map(|m| m.name()).collect();
            parts.push(format!("selective recomputation of {}", names.join(", ")))
        }
        (Recompute::Full, RecomputeMethod::Uniform, 1) => parts.push("full recomputation".into()),
        (Recompute::Full, RecomputeMethod::Uniform, n) => {
            parts.push(format!("full recomputation in groups of {n} layers"))
        }
        (Recompute::Full, RecomputeMethod::Block, n) => {
            parts.push(format!("full recomputation of {n} layer(s) a stage"))
        }
    }
    if s.context_parallel > 1 {
        parts.push(format!("context parallel {}", s.context_parallel));
    }
    if s.expert_parallel > 1 {
        parts.push(format!("expert parallel {}", s.expert_parallel));
    }
    if s.expert_tensor_parallel > 0 {
        parts.push(format!(
            "expert tensor parallel {}",
            s.expert_tensor_parallel
        ));
    }
    if !s.flash_attention {
        parts.push("no flash attention".into());
    }
    if !s.sequence_parallel {
        parts.push("no sequence parallelism".into());
    }
    if s.loss != LossKernel::default() {
        parts.push(format!("{} loss", s.loss.name()));
    }
    format!("settings: {}\n", parts.join(", "))
}

/// A note naming the runs of `runs` that `pick` picks (the first five),
/// saying their plans were `what`.
fn note_runs(
    score: &Path,
    runs: &RunsFile,
    pick: impl Fn(&validate::MeasuredRun) -> bool,
    what: &str,
) {
    let picked: Vec<&str> = runs
        .runs
        .iter()
        .filter(|r| pick(r))
        .map(|r| r.name.as_str())
        .collect();
    if picked.is_empty() {
        return;
    }
    let more = if picked.len() > 5 { ", ..." } else { "" };
    eprintln!(
        "{}",
        printable_lines(&format!(
            "note: {}: the plans of {} run{} ({}{more}) were {what}",
            polychip_files::shown_path(score),
            picked.len(),
            if picked.len() == 1 { "" } else { "s" },
            picked[..picked.len().min(5)].join(", "),
        ))
    );
}

/// The flags that changed `recorded` into `given` (the settings a flag
/// sets; the others are the report's own).
fn flags_changing(recorded: &TrainingSettings, given: &TrainingSettings) -> Vec<String> {
    let (a, b) = (recorded, given);
    let mut out = Vec::new();
    // A flag with a value: "--flag NEW for OLD"; a switch: its name.
    fn valued<T: PartialEq + std::fmt::Debug>(out: &mut Vec<String>, flag: &str, a: &T, b: &T) {
        if a != b {
            out.push(format!("{flag} {b:?} for {a:?}").to_lowercase());
        }
    }
    let switched = |out: &mut Vec<String>, flag: &str, a: bool, b: bool| {
        if a != b {
            out.push(flag.to_string());
        }
    };
    valued(&mut out, "--dtype", &a.dtype, &b.dtype);
    valued(&mut out, "--recompute", &a.recompute, &b.recompute);
    valued(
        &mut out,
        "--recompute-modules",
        &a.recompute_modules,
        &b.recompute_modules,
    );
    valued(
        &mut out,
        "--recompute-method",
        &a.recompute_method,
        &b.recompute_method,
    );
    valued(
        &mut out,
        "--recompute-num-layers",
        &a.recompute_num_layers,
        &b.recompute_num_layers,
    );
    switched(
        &mut out,
        "--shard-optimizer",
        a.shard_optimizer,
        b.shard_optimizer,
    );
    valued(
        &mut out,
        "--context-parallel",
        &a.context_parallel,
        &b.context_parallel,
    );
    valued(
        &mut out,
        "--expert-parallel",
        &a.expert_parallel,
        &b.expert_parallel,
    );
    valued(
        &mut out,
        "--expert-tensor-parallel",
        &a.expert_tensor_parallel,
        &b.expert_tensor_parallel,
    );
    switched(&mut out, "--fp8", a.fp8, b.fp8);
    switched(
        &mut out,
        "--overlap-grad-reduce",
        a.overlap_grad_reduce,
        b.overlap_grad_reduce,
    );
    switched(
        &mut out,
        "--overlap-param-gather",
        a.overlap_param_gather,
        b.overlap_param_gather,
    );
    valued(&mut out, "--zero-stage", &a.zero_stage, &b.zero_stage);
    switched(
        &mut out,
        "--half-gradients",
        a.bf16_gradients,
        b.bf16_gradients,
    );
    switched(
        &mut out,
        "--no-flash-attention",
        a.flash_attention,
        b.flash_attention,
    );
    switched(
        &mut out,
        "--no-sequence-parallel",
        a.sequence_parallel,
        b.sequence_parallel,
    );
    valued(&mut out, "--schedule", &a.schedule, &b.schedule);
    if a.loss != b.loss {
        out.push(format!("--loss {} for {}", b.loss.name(), a.loss.name()));
    }
    out
}

fn table(r: &PlanReport) -> String {
    let p = &r.plan;
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    for (g, rep) in p.replicas.iter().enumerate() {
        if p.replicas.len() > 1 {
            line(format!(
                "group {g}: {} replicas, {} sequences per step",
                rep.copies, rep.sequences
            ));
        }
        line(format!(
            "{:>5}  {:<24} {:>5} {:>3}  {:<9} {:>21}  {:>6}",
            "stage", "chip", "chips", "tp", "layers", "memory used/capacity", "MFU"
        ));
        for (i, s) in rep.stages.iter().enumerate() {
            line(format!(
                "{:>5}  {:<24} {:>5} {:>3}  {:<9} {:>21}  {:>5.1}%",
                i,
                s.chip,
                s.tp * rep.copies,
                s.tp,
                match s.mtp_layers {
                    0 => format!("{}-{}", s.first_layer, s.end_layer.saturating_sub(1)),
                    n => format!(
                        "{}-{} +{n} MTP",
                        s.first_layer,
                        s.end_layer.saturating_sub(1)
                    ),
                },
                format!(
                    "{} / {}",
                    fmt_bytes(s.memory.total),
                    fmt_bytes(s.memory_capacity as f64)
                ),
                100.0 * s.mfu
            ));
        }
        line(format!(
            "micro-batch size {}, count {}, step {:.3} s analytic / {:.3} s simulated, idle {:.1}% (bubble, all-reduce and optimizer)",
            rep.micro_batch_size,
            rep.micro_batches,
            rep.step_time_analytic,
            rep.step_time_simulated,
            100.0 * rep.bubble_fraction
        ));
    }
    let kind = match p.kind {
        polychip_planner::plan::PlanKind::HeteroPp => "HeteroPP (one pipeline, identical replicas)",
        polychip_planner::plan::PlanKind::MixedReplicas => {
            "mixed data-parallel groups (batch split in proportion to speed)"
        }
    };
    line(format!("plan: {kind}"));
    line(format!(
        "data-parallel degree {}, chips used {}, global batch {} x {} tokens",
        p.dp, p.chips_used, p.global_batch, p.seq_len
    ));
    line(format!(
        "predicted step time: {:.3} s analytic, {:.3} s simulated",
        p.step_time_analytic, p.step_time_simulated
    ));
    line(format!(
        "tokens/s: {:.0} (simulated {:.0}), MFU {:.1}%, idle {:.1}% (bubble, all-reduce and optimizer)",
        p.tokens_per_s,
        p.tokens_per_s_simulated,
        100.0 * p.mfu,
        100.0 * p.bubble_fraction
    ));
    for a in &r.alone {
        line(match &a.cannot_hold {
            Some(why) => format!(
                "  {} alone ({} chips): cannot hold the model: {why}",
                a.chip, a.chips
            ),
            None => format!(
                "  {} alone ({} chips): {:.0} tokens/s",
                a.chip, a.chips, a.tokens_per_s
            ),
        });
    }
    line(match r.hetero_speedup_ratio {
        Some(x) => format!("HeteroSpeedupRatio: {:.2}%", 100.0 * x),
        None => "HeteroSpeedupRatio: undefined (no chip type fits the model alone)".to_string(),
    });
    line(format!(
        "candidates evaluated: {}, search time {:.3} s{}",
        r.candidates,
        r.search_seconds,
        if r.exhaustive { " (exhaustive)" } else { "" }
    ));
    out
}

/// `--evaluate`'s table: every stage's memory terms and timings, the step,
/// the bottleneck and what does not fit.
/// `--score`'s table: each run, then the figures.
fn scores_table(runs: &[ScoredRun], s: &Scores) -> String {
    let mut out = String::new();
    let width = runs
        .iter()
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(3)
        .clamp(3, 60);
    out.push_str(&format!(
        "{:<width$}  {:>6}  {:>12}  {:>12}  {:>6}  {:>10}  {:>5}\n",
        "run", "seqs", "predicted s", "measured s", "ratio", "pred. peak", "fits"
    ));
    for r in runs {
        let measured = r.measured_step_seconds;
        let ran = match (r.predicted_fits, r.ran) {
            (true, true) => "yes",
            (false, false) => "no",
            (true, false) => "yes, failed",
            (false, true) => "no, ran",
        };
        out.push_str(&format!(
            "{:<width$}  {:>6}  {:>12.4}  {:>12}  {:>6}  {:>10}  {ran}\n",
            r.name,
            r.global_batch,
            r.predicted_step_seconds,
            measured.map_or("-".into(), |m| format!("{m:.4}")),
            measured.map_or("-".into(), |m| format!(
                "{:.3}",
                r.predicted_step_seconds / m
            )),
            fmt_bytes(r.predicted_peak_memory_bytes),
        ));
    }
    let pct = |x: Option<f64>| x.map_or("-".into(), |v| format!("{:.1}%", 100.0 * v));
    out.push_str(&format!(
        "{} runs that ran (ranked by seconds per sequence): Spearman {}, top-1 regret {}, top-3 \
         regret {}, median error {} as given, {} after scaling by {}\n",
        s.ran,
        s.spearman
            .map_or("- (fewer than two runs, or all alike)".into(), |v| format!(
                "{v:.3}"
            )),
        pct(s.top1_regret),
        pct(s.top3_regret),
        pct(s.median_error),
        pct(s.median_error_scaled),
        s.scale.map_or("-".into(), |v| format!("{v:.3}")),
    ));
    out.push_str(&format!(
        "fit/no-fit agreement: {} of {} runs",
        s.fit_agreement, s.runs
    ));
    if !s.predicted_to_fit_but_failed.is_empty() {
        out.push_str(&format!(
            "; predicted to fit but did not run: {}",
            s.predicted_to_fit_but_failed.join(", ")
        ));
    }
    if !s.predicted_not_to_fit_but_ran.is_empty() {
        out.push_str(&format!(
            "; predicted not to fit but ran: {}",
            s.predicted_not_to_fit_but_ran.join(", ")
        ));
    }
    out.push('\n');
    if let Some(m) = s.median_memory_error {
        out.push_str(&format!(
            "median peak-memory error: {:+.1}% over the {} run(s) that ran and gave a peak (a \
             failed run's peak is not counted)\n",
            100.0 * m,
            s.memory_runs
        ));
    }
    out
}

fn evaluation_table(ev: &Evaluation) -> String {
    let p = &ev.plan;
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    let label = |g: usize| {
        ev.group_labels
            .get(g)
            .cloned()
            .unwrap_or_else(|| format!("group {g}"))
    };
    for (g, r) in p.replicas.iter().enumerate() {
        let schedule = match (r.stages.len(), r.virtual_stages) {
            (1, _) => String::new(),
            (_, 1) => format!(", {} schedule", r.pipeline.name()),
            (_, v) => format!(
                ", interleaved {} schedule, {v} chunks on each of {} devices",
                r.pipeline.name(),
                r.devices()
            ),
        };
        line(format!(
            "{}: {} replica(s), micro-batch {} x {}, step {:.4} s analytic / {:.4} s \
             simulated, idle {:.1}%{schedule}",
            label(g),
            r.copies,
            r.micro_batch_size,
            r.micro_batches,
            r.step_time_analytic,
            r.step_time_simulated,
            100.0 * r.bubble_fraction
        ));
        for (i, s) in r.stages.iter().enumerate() {
            let m = serde_json::to_value(s.memory).unwrap_or_default();
            let terms: Vec<String> = m
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, _)| *k != "total")
                .filter_map(|(k, v)| Some(format!("{k} {}", fmt_bytes(v.as_f64()?))))
                .collect();
            let name = match r.virtual_stages {
                1 => format!("stage {i}"),
                _ => format!(
                    "stage {i} (chunk {} of device {})",
                    i / r.devices(),
                    i % r.devices()
                ),
            };
            let mtp = match s.mtp_layers {
                0 => String::new(),
                n => format!(" and {n} MTP"),
            };
            line(format!(
                "  {name}: {} x{} layers {}..{}{mtp}: forward {:.3} ms, backward {:.3} ms, send \
                 {:.3} ms, all-reduce {:.3} ms, optimizer {:.3} ms",
                s.chip,
                s.tp,
                s.first_layer,
                s.end_layer,
                1e3 * s.timing.forward,
                1e3 * s.timing.backward,
                1e3 * s.timing.send_next,
                1e3 * s.timing.dp_allreduce,
                1e3 * s.timing.optimizer
            ));
            let devices = r.devices();
            if r.virtual_stages > 1 && i >= devices {
                // A later chunk: its device's memory is shown once, above.
                line(format!("    memory: device {}'s, above", i % devices));
                continue;
            }
            let device = match r.virtual_stages {
                1 => String::new(),
                _ => format!(" for device {i}, all its chunks"),
            };
            line(format!(
                "    memory{device} {} of {} ({}): {}",
                fmt_bytes(s.memory.total),
                fmt_bytes(s.memory_capacity as f64),
                if s.memory.total <= s.memory_capacity as f64 {
                    "fits"
                } else {
                    "DOES NOT FIT"
                },
                terms.join(", ")
            ));
        }
    }
    line(format!(
        "predicted step: {:.4} s analytic, {:.4} s simulated; {:.0} tokens/s (simulated)",
        p.step_time_analytic, p.step_time_simulated, p.tokens_per_s_simulated
    ));
    let b = &ev.bottleneck;
    let interleaved = p
        .replicas
        .get(b.group)
        .is_some_and(|r| r.virtual_stages > 1);
    line(format!(
        "bottleneck: {} {} {} ({}), {:.3} ms per micro-batch",
        label(b.group),
        if interleaved { "device" } else { "stage" },
        b.stage,
        b.chip,
        1e3 * b.seconds_per_micro_batch
    ));
    if !ev.measured_chips.is_empty() {
        line(format!(
            "priced from the profile: {}",
            ev.measured_chips.join(", ")
        ));
    }
    if !ev.polychip_count_chips.is_empty() {
        line(format!(
            "memory counted as polychip train allocates it: {}",
            ev.polychip_count_chips.join(", ")
        ));
    }
    if ev.fits {
        line("fits: every stage fits its chips".into());
    } else {
        for why in &ev.cannot_run {
            line(format!("cannot run: {why}"));
        }
        for o in &ev.overflows {
            line(format!(
                "does not fit: {} stage {} ({}) is {} short",
                label(o.group),
                o.stage,
                o.chip,
                fmt_bytes(o.short_bytes)
            ));
        }
    }
    out
}

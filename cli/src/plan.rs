//! `polychip plan --cluster FILE --model PRESET_OR_FILE [--global-batch N]
//! [--dtype bf16] [--recompute none|selective|full] [--shard-optimizer]
//! [--exhaustive] [--json] [--trace out.json]`: runs the HeteroAuto search
//! (`polychip_planner::search`) and prints the plan as a table (or JSON),
//! optionally writing a Chrome trace of its simulated step. Exit status 2
//! when an input is invalid or no plan fits, with the reason on stderr.

use std::path::PathBuf;
use std::process::ExitCode;

use polychip_planner::cluster::ClusterSpec;
use polychip_planner::model::ModelSpec;
use polychip_planner::search::{self, PlanOptions, PlanReport, fmt_bytes};
use polychip_planner::settings::{Dtype, Recompute, TrainingSettings};

/// Options of `polychip plan`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The cluster file (TOML; see examples/clusters/).
    #[arg(long, value_name = "FILE")]
    cluster: PathBuf,
    /// A model preset (llama-7b, llama-13b, llama-70b, h2-100b) or a model
    /// TOML file.
    #[arg(long, value_name = "PRESET_OR_FILE")]
    model: String,
    /// Sequences per optimizer step.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    global_batch: u64,
    /// Compute dtype: f32, bf16 or f16.
    #[arg(long, value_name = "TYPE", default_value = "bf16")]
    dtype: String,
    /// Activation recomputation: none, selective or full.
    #[arg(long, value_name = "KIND", default_value = "none")]
    recompute: String,
    /// Shard the optimizer state over data-parallel replicas (ZeRO-1).
    #[arg(long)]
    shard_optimizer: bool,
    /// Enumerate every plan of the space without pruning (small cases).
    #[arg(long)]
    exhaustive: bool,
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
            eprintln!("polychip plan: {e}");
            ExitCode::from(2)
        }
    }
}

fn plan(args: &Args) -> Result<(), String> {
    let cluster = ClusterSpec::load(&args.cluster).map_err(|e| e.to_string())?;
    let path = std::path::Path::new(&args.model);
    let model = if path.is_file() {
        ModelSpec::load(path)
    } else {
        ModelSpec::preset(&args.model)
    }
    .map_err(|e| e.to_string())?;
    if let Some(trace) = &args.trace {
        // Before searching, not after.
        crate::train::check_output_file("--trace", trace).map_err(|e| e.to_string())?;
    }
    let max = polychip_planner::settings::MAX_GLOBAL_BATCH;
    if args.global_batch > max {
        return Err(format!(
            "--global-batch is {}, more than the planner accepts ({max} sequences)",
            args.global_batch
        ));
    }
    let mut settings = TrainingSettings::new(args.global_batch);
    settings.dtype = match args.dtype.as_str() {
        "f32" => Dtype::F32,
        "bf16" => Dtype::Bf16,
        "f16" => Dtype::F16,
        d => return Err(format!("--dtype {d}: expected f32, bf16 or f16")),
    };
    settings.recompute = match args.recompute.as_str() {
        "none" => Recompute::None,
        "selective" => Recompute::Selective,
        "full" => Recompute::Full,
        r => return Err(format!("--recompute {r}: expected none, selective or full")),
    };
    settings.shard_optimizer = args.shard_optimizer;
    let options = PlanOptions {
        exhaustive: args.exhaustive,
        ..PlanOptions::default()
    };
    let report = search::plan(&model, &cluster, &settings, &options).map_err(|e| e.to_string())?;
    if let Some(trace) = &args.trace {
        let text = serde_json::to_string(&report.plan.chrome_trace()).map_err(|e| e.to_string())?;
        std::fs::write(trace, text)
            .map_err(|e| format!("could not write {}: {e}", trace.display()))?;
    }
    if args.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        println!("{text}");
    } else {
        print!("{}", table(&report));
    }
    Ok(())
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
                format!("{}-{}", s.first_layer, s.end_layer.saturating_sub(1)),
                format!(
                    "{} / {}",
                    fmt_bytes(s.memory.total),
                    fmt_bytes(s.memory_capacity as f64)
                ),
                100.0 * s.mfu
            ));
        }
        line(format!(
            "micro-batch size {}, count {}, step {:.3} s analytic / {:.3} s simulated, bubble {:.1}%",
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
        "tokens/s: {:.0} (simulated {:.0}), MFU {:.1}%, bubble fraction {:.1}%",
        p.tokens_per_s,
        p.tokens_per_s_simulated,
        100.0 * p.mfu,
        100.0 * p.bubble_fraction
    ));
    for a in &r.alone {
        line(format!(
            "  {} alone ({} chips): {:.0} tokens/s",
            a.chip, a.chips, a.tokens_per_s
        ));
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

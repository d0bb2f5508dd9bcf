//! `polychip profile --model M [--devices LIST] [--micro-batch-sizes 1,2,4]
//! [--precision f32] --out FILE`: measures, on one device of each kind,
//! the forward and backward time of the embedding, a block and the head,
//! the optimizer's time per parameter, the activation bytes a block keeps
//! and the peak memory, at each micro-batch size, and writes a profile file
//! for `polychip plan --profile` (format: docs/planner.md).

use std::path::PathBuf;
use std::process::ExitCode;

use polychip_files::printable_lines;
use polychip_train::auto;
use polychip_train::config::{ModelConfig, Precision, TrainConfig};

/// Options of `polychip profile`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model preset (mini, tiny, small, deep) or a model TOML file.
    #[arg(long, value_name = "PRESET_OR_FILE", default_value = "tiny")]
    model: String,
    /// Tokens per sequence (default: the model's).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<usize>(1))]
    seq_len: Option<usize>,
    /// Devices to profile (`vendor:index`, comma-separated; default: the
    /// first device of each vendor). One device per device name is
    /// profiled.
    #[arg(long, value_name = "LIST")]
    devices: Option<String>,
    /// Micro-batch sizes to measure, comma-separated.
    #[arg(
        long,
        value_name = "LIST",
        default_value = "1,2,4",
        allow_hyphen_values = true
    )]
    micro_batch_sizes: String,
    /// Timed repetitions of each measurement (their median is kept).
    #[arg(long, value_name = "N", default_value_t = 9, allow_negative_numbers = true, value_parser = crate::numbers::whole::<usize>(1))]
    repeats: usize,
    /// Rounds over all the entries, interleaved (each field is the median
    /// over the rounds: steadier on a shared machine).
    #[arg(long, value_name = "N", default_value_t = 1, allow_negative_numbers = true, value_parser = crate::numbers::whole::<usize>(1))]
    rounds: usize,
    /// Compute precision: f32 or bf16.
    #[arg(long, value_name = "P", default_value = "f32")]
    precision: String,
    /// The CPU cores the profile runs on (e.g. `0`); default: the share of
    /// the allowed cores one rank gets when a job spreads over the devices
    /// profiled, as `polychip train` pins its ranks (each simulated chip
    /// its own cores).
    #[arg(long, value_name = "LIST", allow_hyphen_values = true)]
    cores: Option<String>,
    /// Where to write the profile (JSON).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

/// Runs `polychip profile`.
pub fn run(args: &Args) -> ExitCode {
    match profile(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("polychip profile: {}", printable_lines(&e.to_string()));
            ExitCode::from(2)
        }
    }
}

fn profile(args: &Args) -> Result<(), String> {
    crate::outputs::check_file("--out", &args.out)?;
    crate::outputs::check_distinct(
        &[("--model", crate::outputs::file_arg(&args.model))],
        &[("--out", Some(&args.out))],
    )?;
    let mut cfg = ModelConfig::from_arg(&args.model).map_err(|e| e.to_string())?;
    if let Some(s) = args.seq_len {
        cfg.seq_len = s;
        cfg.validate().map_err(|m| format!("--seq-len: {m}"))?;
    }
    for (flag, v, max) in [
        ("--repeats", args.repeats, 1000),
        ("--rounds", args.rounds, 100),
    ] {
        if !(1..=max).contains(&v) {
            return Err(format!("{flag} is {v}; it must be 1 to {max}"));
        }
    }
    let t = TrainConfig {
        precision: Precision::parse(&args.precision).map_err(|e| e.to_string())?,
        ..TrainConfig::default()
    };
    let mut sizes = Vec::new();
    for part in args.micro_batch_sizes.split(',') {
        let b: usize = part
            .trim()
            .parse()
            .ok()
            .filter(|&b| (1..=1024).contains(&b))
            .ok_or_else(|| {
                let qp = polychip_comm::text::quoted(part);
                format!("--micro-batch-sizes: {qp} is not a size from 1 to 1024")
            })?;
        if !sizes.contains(&b) {
            sizes.push(b);
        }
    }
    sizes.sort_unstable();
    let rt = crate::devices::runtime_from_env()?;
    let devices =
        crate::train::device_pool(&rt, args.devices.as_deref()).map_err(|e| e.to_string())?;
    if devices.is_empty() {
        return Err("no devices to profile: no plugin reports any".into());
    }
    let cores = match &args.cores {
        Some(list) => crate::train::parse_cores(list).map_err(|e| e.to_string())?,
        None => polychip_train::pin::share(&polychip_train::pin::allowed_cores(), 0, devices.len()),
    };
    crate::train::pin_to(&cores).map_err(|e| e.to_string())?;
    eprintln!("profiling on cores {cores:?}");
    let file =
        auto::profile_file(&cfg, &t, &devices, &sizes, args.repeats, args.rounds).map_err(|e| {
            let hint = if e.to_string().contains("out of memory") {
                format!(
                    " (the model {} at sequences of {} and micro-batches up to {} does not fit \
                     a device: give a smaller --seq-len or --micro-batch-sizes)",
                    cfg.name,
                    cfg.seq_len,
                    sizes.last().copied().unwrap_or(1)
                )
            } else {
                String::new()
            };
            format!("profiling: {e}{hint}")
        })?;
    for e in &file.entries {
        // The profiler measures every part.
        let (embedding, head) = (e.embedding.unwrap_or_default(), e.head.unwrap_or_default());
        eprintln!(
            "{} (micro-batch {}): embedding {:.2}/{:.2} ms, block {:.2}/{:.2} ms, head \
             {:.2}/{:.2} ms (forward/backward), optimizer {:.2} ns per parameter{}{}",
            e.chip,
            e.micro_batch,
            1e3 * embedding.forward,
            1e3 * embedding.backward,
            1e3 * e.block.forward,
            1e3 * e.block.backward,
            1e3 * head.forward,
            1e3 * head.backward,
            1e9 * e.optimizer_per_param.unwrap_or(0.0),
            e.stage_overhead.map_or_else(String::new, |o| format!(
                ", {:.2}/{:.2} ms more for any stage",
                1e3 * o.forward,
                1e3 * o.backward
            )),
            e.block.held.map_or_else(String::new, |h| format!(
                ", block {:.2}/{:.2} ms holding a second micro-batch",
                1e3 * h.forward,
                1e3 * h.backward
            ))
        );
    }
    let text = serde_json::to_string_pretty(&file).map_err(|e| e.to_string())?;
    crate::outputs::write("--out", &args.out, text.as_bytes())?;
    eprintln!("profile: {}", polychip_files::shown_path(&args.out));
    Ok(())
}

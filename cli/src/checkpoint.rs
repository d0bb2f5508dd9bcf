//! `polychip checkpoint`: Hugging Face LLaMA models in and out of polychip
//! checkpoints, and the logits of either kind, for comparing them.
//!
//! - `export-hf CHECKPOINT OUT_DIR`: a polychip checkpoint (a step
//!   directory, or a root with `latest`; of any stage split) as a Hugging
//!   Face directory, `config.json` and an F32 `model.safetensors`, that
//!   `transformers.LlamaForCausalLM.from_pretrained` loads.
//! - `import-hf HF_DIR OUT_CHECKPOINT_DIR`: a Hugging Face LLaMA directory
//!   as a step-0 polychip checkpoint that `polychip train --resume` takes.
//! - `logits PATH --tokens 1,2,3`: the model's forward pass on one device
//!   through the host (the trainer's own model code), the output head's
//!   logits printed as JSON, `[seq][vocab]`.
//!
//! Outputs are written all-or-nothing into a new (or empty) directory; see
//! `polychip_train::hf`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use polychip_files::printable_lines;
use polychip_train::config::Precision;
use polychip_train::model::Stage;
use polychip_train::params::{InitialWeights, StageRange};
use polychip_train::{TrainError, hf, memory, trainer};

/// Options of `polychip checkpoint`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// Write a polychip checkpoint as a Hugging Face LLaMA directory
    /// (config.json and an F32 model.safetensors) that
    /// transformers.LlamaForCausalLM.from_pretrained loads.
    ExportHf(ExportArgs),
    /// Write a Hugging Face LLaMA directory as a step-0 polychip checkpoint
    /// that `polychip train --resume` continues from.
    ImportHf(ImportArgs),
    /// Print the logits of a token sequence as JSON ([seq][vocab] floats),
    /// computed by the trainer's model on one device.
    Logits(LogitsArgs),
}

/// Options of `polychip checkpoint export-hf`.
#[derive(Debug, clap::Args)]
struct ExportArgs {
    /// The polychip checkpoint: a step directory, or a checkpoint directory
    /// whose `latest` names one.
    #[arg(value_name = "CHECKPOINT")]
    checkpoint: PathBuf,
    /// The Hugging Face directory to write; it must not exist or be empty.
    #[arg(value_name = "OUT_DIR")]
    out: PathBuf,
}

/// Options of `polychip checkpoint import-hf`.
#[derive(Debug, clap::Args)]
struct ImportArgs {
    /// The Hugging Face LLaMA directory: config.json and model.safetensors
    /// (or shards listed by model.safetensors.index.json).
    #[arg(value_name = "HF_DIR")]
    hf_dir: PathBuf,
    /// The checkpoint directory to write; it must not exist or be empty.
    #[arg(value_name = "OUT_CHECKPOINT_DIR")]
    out: PathBuf,
    /// Tokens per training sequence (default min(max_position_embeddings, 128)).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<usize>(1))]
    seq_len: Option<usize>,
}

/// Options of `polychip checkpoint logits`.
#[derive(Debug, clap::Args)]
struct LogitsArgs {
    /// A polychip checkpoint or a Hugging Face LLaMA directory (one with
    /// config.json).
    #[arg(value_name = "CHECKPOINT_OR_HF_DIR")]
    path: PathBuf,
    /// The token ids, comma-separated (e.g. `72,101,108,108,111`): at most
    /// the model's sequence length (a Hugging Face model's
    /// max_position_embeddings).
    #[arg(long, value_name = "IDS", required = true, allow_hyphen_values = true)]
    tokens: String,
    /// The device to run on (default: the first device found).
    #[arg(long, value_name = "DEVICE")]
    device: Option<String>,
}

/// Runs `polychip checkpoint`.
pub fn run(args: &Args) -> ExitCode {
    let done = match &args.what {
        What::ExportHf(a) => export(a),
        What::ImportHf(a) => import(a),
        What::Logits(a) => logits(a),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("polychip checkpoint: {}", printable_lines(&e.to_string()));
            ExitCode::from(2)
        }
    }
}

fn export(a: &ExportArgs) -> Result<(), TrainError> {
    let model = hf::export(&a.checkpoint, &a.out)?;
    println!(
        "exported {} ({}: {}) as a Hugging Face LLaMA model: {}",
        polychip_files::shown_path(&a.checkpoint),
        model.name,
        model.size_text(),
        polychip_files::shown_path(&a.out)
    );
    Ok(())
}

fn import(a: &ImportArgs) -> Result<(), TrainError> {
    let model = hf::import(&a.hf_dir, a.seq_len, &a.out)?;
    println!(
        "imported {} ({}, vocabulary {}, sequences of {}) as the step-0 checkpoint {}; \
         continue with: polychip train --resume {}",
        polychip_files::shown_path(&a.hf_dir),
        model.size_text(),
        model.vocab,
        model.seq_len,
        polychip_files::shown_path(&a.out),
        polychip_files::shown_path(&a.out)
    );
    Ok(())
}

fn parse_tokens(list: &str, vocab: usize) -> Result<Vec<i32>, TrainError> {
    // Quoted escaped and cut (a list of 60,000 ids was echoed whole).
    let bad = |m: String| {
        TrainError::Config(format!(
            "--tokens {}: {m}",
            polychip_comm::text::quoted(list)
        ))
    };
    let ids = list
        .split(',')
        .map(|t| {
            let t = t.trim();
            match t.parse::<i64>() {
                Ok(v) if (0..vocab as i64).contains(&v) => Ok(v as i32),
                Ok(v) => Err(bad(format!(
                    "token {v} is outside the model's vocabulary 0..{vocab}"
                ))),
                Err(_) => Err(bad(format!(
                    "{} is not a token id",
                    polychip_comm::text::quoted(t)
                ))),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ids)
}

fn logits(a: &LogitsArgs) -> Result<(), TrainError> {
    let count = a.tokens.split(',').count();
    // The model built for exactly this many positions (checked against the
    // model's limit), with the weights from the directory.
    let (model, weights) = hf::any_weights(&a.path, Some(count))?;
    let tokens = parse_tokens(&a.tokens, model.vocab)?;
    // Each plugin is loaded in a child process first: one that crashes or
    // hangs while loading is reported by name instead of ending the run.
    let rt = crate::devices::runtime_from_env().map_err(TrainError::Config)?;
    for f in rt.failures() {
        eprintln!("polychip checkpoint: a plugin failed to load: {}", f.error);
    }
    let names = trainer::device_names(&rt);
    let device = match &a.device {
        Some(want) => {
            let want = want.trim().to_lowercase();
            let i = names.iter().position(|n| *n == want).ok_or_else(|| {
                TrainError::Plan(format!(
                    "--device {want} is not present; the devices are {}",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ))
            })?;
            rt.devices()[i].clone()
        }
        None => rt.devices().first().cloned().ok_or_else(|| {
            TrainError::Plan("no device: no plugin is loaded (see `polychip devices`)".into())
        })?,
    };
    let range = StageRange::whole(&model);
    let need = memory::stage_memory(&model, Precision::F32, &range, 1, 1).total();
    let have = device.props().memory_bytes;
    if need > have {
        return Err(TrainError::Plan(format!(
            "the model needs {:.1} MiB on {} but the device has {:.1} MiB",
            need as f64 / (1u64 << 20) as f64,
            trainer::device_name(&device),
            have as f64 / (1u64 << 20) as f64
        )));
    }
    let mut init = InitialWeights::Given {
        values: weights,
        source: polychip_files::shown_path(&a.path),
    };
    let stage = Stage::with_weights(&model, range, Precision::F32, &device, &mut init)?;
    let ids = device.from_slice(&tokens, &[1, tokens.len() as i64])?;
    let values = stage.logits(ids)?.to_vec::<f32>()?;
    let rows: Vec<&[f32]> = values.chunks_exact(model.vocab).collect();
    println!(
        "{}",
        serde_json::to_string(&rows).expect("finite or not, floats serialize")
    );
    Ok(())
}

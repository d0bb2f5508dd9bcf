//! `polychip`: the command-line tool for cluster operators and vendors.
//!
//! Each subcommand lives in its own module; this file parses the command line,
//! installs the logger (`POLYCHIP_LOG`, e.g. `debug`), and dispatches.

#![forbid(unsafe_code)]

mod bench;
mod checkpoint;
mod conform;
mod devices;
mod launch;
mod plan;
mod profile;
mod profile_ranks;
mod train;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Use AI chips from several vendors in one job.
#[derive(Debug, Parser)]
#[command(name = "polychip", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List every device of every loaded plugin, and plugins that failed to load.
    Devices(devices::Args),
    /// Check every operator of a plugin against the CPU reference.
    Conform(conform::Args),
    /// Start N local ranks of a command, like torchrun --standalone.
    Launch(launch::Args),
    /// Benchmarks: `polychip bench comm` times the collectives.
    Bench(bench::Args),
    /// Plan how to train a model on a cluster of uneven chips (HeteroAuto),
    /// or score a given plan (--evaluate).
    Plan(plan::Args),
    /// Measure each device kind's costs on a model for `polychip plan --profile`.
    Profile(profile::Args),
    /// Internal: profile one device for `polychip train --plan auto`, in a
    /// process of its own (the job on standard input).
    #[command(hide = true)]
    ProfileWorker,
    /// Train a LLaMA-architecture model across every vendor's devices (the main job).
    ///
    /// It starts from seeded weights, from a polychip checkpoint (--resume) or
    /// from a Hugging Face LLaMA model (--init-from), and can write the
    /// result as a Hugging Face model (--export-hf) as well as checkpoints
    /// (--checkpoint-dir).
    Train(Box<train::Args>),
    /// Hugging Face LLaMA models in and out of checkpoints, and their logits:
    /// `export-hf`, `import-hf`, `logits`.
    ///
    /// `export-hf` writes any polychip checkpoint (a step directory or a
    /// checkpoint directory with `latest`, of any stage split) as a
    /// directory that transformers' LlamaForCausalLM.from_pretrained loads;
    /// `import-hf` writes a Hugging Face LLaMA directory (config.json and
    /// model.safetensors, or shards with model.safetensors.index.json) as a
    /// step-0 checkpoint that `polychip train --resume` continues; `logits`
    /// prints a model's logits for a token sequence, to compare the two.
    /// Outputs are written whole or not at all, into a directory that does
    /// not exist or is empty; what the trainer cannot represent (another
    /// architecture, biases, scaled rotary embeddings, ...) is refused
    /// naming the file and the field or tensor. See docs/training.md.
    Checkpoint(checkpoint::Args),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("POLYCHIP_LOG", "warn")).init();
    let cli = Cli::parse();
    match cli.command {
        Command::Devices(args) => devices::run(&args),
        Command::Conform(args) => conform::run(&args),
        Command::Launch(args) => launch::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Plan(args) => plan::run(&args),
        Command::Profile(args) => profile::run(&args),
        Command::ProfileWorker => profile_ranks::worker(),
        Command::Train(args) => train::run(&args),
        Command::Checkpoint(args) => checkpoint::run(&args),
    }
}

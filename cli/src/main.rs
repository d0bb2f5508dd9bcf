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
mod numbers;
mod outputs;
mod plan;
mod profile;
mod profile_ranks;
mod train;

use std::io::Write as _;
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

/// `POLYCHIP_LOG` as a log filter: levels (`off`, `error`, `warn`,
/// `info`, `debug`, `trace`) or `MODULE=LEVEL`, comma-separated, perhaps
/// followed by `/REGEX`; `warn` when unset. A value that is not one is said on stderr (env_logger
/// would drop it without a word) and `warn` taken.
fn log_filter(value: Option<String>) -> String {
    let Some(v) = value.filter(|v| !v.trim().is_empty()) else {
        return "warn".into();
    };
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    let level = |l: &str| LEVELS.contains(&l.trim().to_ascii_lowercase().as_str());
    let module = |m: &str| {
        !m.is_empty()
            && m.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    // After a `/`, env_logger takes a regular expression on the messages.
    let directives = v.split_once('/').map_or(v.as_str(), |(d, _)| d);
    let ok = directives.split(',').all(|d| {
        d.trim().is_empty()
            || match d.split_once('=') {
                Some((m, l)) => module(m.trim()) && level(l),
                None => level(d) || module(d.trim()),
            }
    });
    if ok {
        v
    } else {
        // Quoted escaped and cut (a 6,000-character value was echoed whole).
        eprintln!(
            "polychip: POLYCHIP_LOG={} is not a log filter (levels off, error, warn, info, \
             debug, trace, or MODULE=LEVEL, comma-separated); logging at warn",
            polychip_comm::text::quoted(&v)
        );
        "warn".into()
    }
}

fn main() -> ExitCode {
    install_stdout_hook();
    env_logger::Builder::new()
        .parse_filters(&log_filter(std::env::var("POLYCHIP_LOG").ok()))
        .init();
    let cli = Cli::try_parse().unwrap_or_else(|e| parse_failed(&e));
    let code = match cli.command {
        Command::Devices(args) => devices::run(&args),
        Command::Conform(args) => conform::run(&args),
        Command::Launch(args) => launch::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Plan(args) => plan::run(&args),
        Command::Profile(args) => profile::run(&args),
        Command::ProfileWorker => profile_ranks::worker(),
        Command::Train(args) => train::run(&args),
        Command::Checkpoint(args) => checkpoint::run(&args),
    };
    // What is still buffered (a last line without a newline) is written
    // now, so that a failure is reported rather than lost at exit.
    if let Err(e) = std::io::stdout().flush() {
        stdout_failed(&e);
    }
    code
}

/// Ends the program for a command line clap refused (or `--help`,
/// `--version`) as clap does, except that a refusal quoting an argument
/// with control characters, or a very long one, is printed with them
/// escaped and cut ([`polychip_files::printable_lines`]), as every other
/// message of the command is: clap echoes the argument raw.
fn parse_failed(e: &clap::Error) -> ! {
    if e.use_stderr() {
        // Without styles, and without the escape sequences an argument
        // held (which clap passes on to a terminal as they are).
        let plain = e.render().to_string();
        let shown = polychip_files::printable_lines(&plain);
        let hostile = std::env::args_os().any(|a| {
            let a = a.to_string_lossy();
            a.len() > polychip_files::MAX_PRINTED_LINE || polychip_files::printable(&a) != a
        });
        if hostile || shown != plain {
            eprint!("{shown}");
            std::process::exit(e.exit_code());
        }
    }
    e.exit()
}

/// The exit code when standard output is closed under the program (`EPIPE`,
/// as with `polychip ... | head`): what a shell reports for a Unix tool
/// that SIGPIPE ended, so `set -o pipefail` scripts see the same.
const CLOSED_PIPE_CODE: u8 = 141;

/// Ends quietly with [`CLOSED_PIPE_CODE`] (a launcher whose output was
/// closed, after stopping its ranks).
pub(crate) fn closed_pipe_exit() -> ExitCode {
    ExitCode::from(CLOSED_PIPE_CODE)
}

/// Ends the program for a failed write to standard output: quietly for a
/// closed pipe, else (a full disk, an I/O error) with one line on stderr
/// and exit code 1.
fn stdout_failed(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(i32::from(CLOSED_PIPE_CODE));
    }
    eprintln!("polychip: cannot write to standard output: {e}");
    std::process::exit(1)
}

/// Makes a failed write to standard output end the program cleanly, in
/// every subcommand. Why a panic hook: every subcommand, and libraries
/// under them (the trainer's step log), write with `print!`/`println!`,
/// which panic when the write fails; wrapping each call would miss some.
/// Rust starts programs with SIGPIPE ignored, so such writes fail with
/// `EPIPE` instead of killing the process; that must stay so process-wide:
/// the comm layer writes to sockets (the rendezvous store with plain
/// `write_all`) and must get `EPIPE` there as an error, not die of it. The
/// hook recognises std's panic message `failed printing to stdout:
/// {error}` (checked by cli/tests/input_limits.rs, so a change in std is
/// caught) and exits from the panicking thread, whichever it is, without
/// unwinding: unwinding a rank's job would wait on its peers. Output is
/// written at step boundaries, after a checkpoint's atomic commit, so
/// nothing is left half-written. Launched ranks' output goes through the
/// launcher, which stops the ranks when its own stdout fails
/// ([`polychip_comm::launch`]). Other panics go to the default hook.
fn install_stdout_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied());
        if let Some(e) = message.and_then(stdout_error) {
            stdout_failed(&e);
        }
        default(info);
    }));
}

/// The error in std's `failed printing to stdout: {error}` panic message:
/// the OS error of its `(os error N)`, else the text.
fn stdout_error(message: &str) -> Option<std::io::Error> {
    let detail = message.strip_prefix("failed printing to stdout: ")?;
    let code = detail
        .rsplit_once("(os error ")
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .and_then(|n| n.parse::<i32>().ok());
    Some(match code {
        Some(c) => std::io::Error::from_raw_os_error(c),
        None => std::io::Error::other(detail.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::log_filter;

    #[test]
    fn a_log_filter_that_is_not_one_is_said_and_warn_taken() {
        assert_eq!(log_filter(None), "warn");
        assert_eq!(log_filter(Some("debug".into())), "debug");
        assert_eq!(
            log_filter(Some("polychip_comm=trace,warn".into())),
            "polychip_comm=trace,warn"
        );
        assert_eq!(log_filter(Some("info/rank 0".into())), "info/rank 0");
        assert_eq!(log_filter(Some("[[[".into())), "warn");
        assert_eq!(log_filter(Some("x=loud".into())), "warn");
    }
}

//! `polychip launch -n N [--devices SPEC] -- CMD ARGS...`: starts N local
//! ranks of a command with the variables torchrun sets, prefixes their
//! output with `[rank K] `, and when one fails stops the others and exits
//! with that rank's exit code (1 when it was killed by a signal).

use std::process::ExitCode;

use polychip_comm::CommError;
use polychip_comm::launch::{LaunchOptions, launch};
use polychip_files::printable_lines;

/// Options of `polychip launch`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Number of ranks (processes) to start.
    #[arg(short = 'n', long = "nproc", value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<usize>(1))]
    nproc: usize,
    /// Devices, one per rank (`ferrite:0,ferrite:1,cobalt:0`) or one for all;
    /// each rank finds its entry in `POLYCHIP_DEVICE`.
    #[arg(long, value_name = "SPEC")]
    devices: Option<String>,
    /// The command to run and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Runs `polychip launch`.
pub fn run(args: &Args) -> ExitCode {
    let mut opts = LaunchOptions::new(args.nproc, args.command.clone());
    opts.devices = args.devices.clone();
    match launch(&opts) {
        Ok(outcome) if outcome.success() => ExitCode::SUCCESS,
        Ok(outcome) if outcome.stdout_closed => crate::closed_pipe_exit(),
        Ok(outcome) => {
            eprintln!("polychip launch: {}", outcome.description);
            let code = u8::try_from(outcome.exit_code)
                .ok()
                .filter(|&c| c != 0)
                .unwrap_or(1);
            ExitCode::from(code)
        }
        Err(CommError::Usage(message)) => {
            eprintln!("polychip launch: {}", printable_lines(&message));
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("polychip launch: {}", printable_lines(&e.to_string()));
            ExitCode::FAILURE
        }
    }
}

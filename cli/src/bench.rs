//! `polychip bench comm [--ops LIST] [--sizes LIST] [--transport shm|tcp|auto]
//! [--dtype f32] [-n N]`: times the collectives of `polychip-comm` and prints
//! nccl-tests columns (see `polychip_comm::bench`). Run outside a launcher
//! (no `RANK`, `OMPI_COMM_WORLD_RANK` or `SLURM_PROCID`), it starts itself as
//! `-n` ranks (default `POLYCHIP_BENCH_RANKS`, else 2) through the
//! `polychip launch` library, with `POLYCHIP_TRANSPORT` set when
//! `--transport` is given; rank 0 writes the table to a file that this
//! process prints, so the table comes without the launcher's `[rank 0] `
//! prefix. Inside a launcher each process is one rank: it starts the job
//! with `polychip_comm::bootstrap` (store, transport choice, clean
//! shutdown), runs the benchmark, and rank 0 prints the table.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use polychip_comm::CommError;
use polychip_comm::bench::{self, BenchOptions};
use polychip_comm::bootstrap::{self, InitOptions, TransportKind};
use polychip_comm::launch::{LaunchOptions, launch};
use polychip_files::printable_lines;

/// Options of `polychip bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// Time the collectives (all-reduce, all-gather, ...) across local ranks.
    Comm(CommArgs),
}

/// Options of `polychip bench comm`.
#[derive(Debug, clap::Args)]
struct CommArgs {
    /// Operations, comma-separated: all_reduce, all_gather, reduce_scatter,
    /// broadcast, reduce, all_to_all, sendrecv (a group), sendrecv_blocking
    /// (its baseline: blocking calls in turns), barrier, or `all`.
    #[arg(long, value_name = "LIST", default_value = "all")]
    ops: String,
    /// Buffer sizes, comma-separated, in bytes or with K, M, G (default
    /// 4K,64K,1M,16M,64M): each a whole number of elements, at most 1G (a
    /// rank allocates a send and a receive buffer of the size).
    #[arg(long, value_name = "LIST", allow_hyphen_values = true)]
    sizes: Option<String>,
    /// The transport: shm (one machine), tcp, verbs (RDMA) or auto (shm when
    /// every rank is on this machine). Default: `POLYCHIP_TRANSPORT`, else auto.
    #[arg(long, value_name = "KIND")]
    transport: Option<String>,
    /// Element type: f32, bf16, f16, i32, i64, f64, u8 or bool.
    #[arg(long, value_name = "TYPE", default_value = "f32")]
    dtype: String,
    /// Ranks to start when not already inside a launcher (default
    /// `POLYCHIP_BENCH_RANKS`, else 2).
    #[arg(short = 'n', long = "nproc", value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<usize>(1))]
    nproc: Option<usize>,
    /// Timed iterations per row, 1 to 100000 (default about 2e9 / bytes,
    /// 20..=20000).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = crate::numbers::whole::<usize>(1))]
    iters: Option<usize>,
    /// Where rank 0 writes the table instead of stdout (used when this
    /// command launches itself).
    #[arg(long, value_name = "PATH", hide = true)]
    table_out: Option<PathBuf>,
}

/// Runs `polychip bench`.
pub fn run(args: &Args) -> ExitCode {
    let What::Comm(args) = &args.what;
    let result = match polychip_comm::env::launched() {
        true => rank(args),
        false => relaunch(args),
    };
    match result {
        Ok(code) => code,
        Err(CommError::Usage(message)) => {
            eprintln!("polychip bench comm: {}", printable_lines(&message));
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("polychip bench comm: {}", printable_lines(&e.to_string()));
            ExitCode::FAILURE
        }
    }
}

fn options(args: &CommArgs) -> polychip_comm::Result<BenchOptions> {
    let mut options = BenchOptions {
        ops: bench::parse_ops(&args.ops)?,
        dtype: bench::parse_dtype(&args.dtype)?,
        iters: args.iters,
        ..BenchOptions::default()
    };
    if let Some(sizes) = &args.sizes {
        options.sizes = bench::parse_sizes(sizes)?;
    }
    Ok(options)
}

/// The transport asked for, and what asked: the `--transport` flag, else
/// `POLYCHIP_TRANSPORT`, else `auto` (named as the variable).
fn transport_kind(args: &CommArgs) -> polychip_comm::Result<(String, &'static str)> {
    let (value, by) = match (&args.transport, std::env::var(bootstrap::TRANSPORT_ENV)) {
        (Some(flag), _) => (flag.clone(), "--transport"),
        (None, Ok(env)) => (env, bootstrap::TRANSPORT_ENV),
        (None, Err(std::env::VarError::NotUnicode(_))) => {
            return Err(CommError::Usage(format!(
                "{} is not UTF-8 text; expected shm, tcp, verbs or auto",
                bootstrap::TRANSPORT_ENV
            )));
        }
        (None, Err(std::env::VarError::NotPresent)) => ("auto".into(), bootstrap::TRANSPORT_ENV),
    };
    let quoted = polychip_comm::text::quoted(&value);
    let kind = value.trim().to_ascii_lowercase();
    match kind.as_str() {
        "shm" | "tcp" | "verbs" | "auto" => Ok((kind, by)),
        _ => Err(CommError::Usage(match by {
            "--transport" => {
                format!("--transport {quoted} is not a transport: expected shm, tcp, verbs or auto")
            }
            _ => format!("{by}={quoted} is not a transport: expected shm, tcp, verbs or auto"),
        })),
    }
}

/// The largest amount of memory the ranks' buffers would take (two
/// buffers of the largest size per rank), refused when it is more than
/// the machine has available (`MemAvailable` of /proc/meminfo, where
/// readable), so that a job is not killed for memory half-way.
fn check_memory(options: &BenchOptions, nproc: usize) -> polychip_comm::Result<()> {
    let Some(&largest) = options.sizes.iter().max() else {
        return Ok(());
    };
    let need = (largest as u128) * 2 * nproc as u128;
    let Some(available) = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
            line.split_whitespace().nth(1)?.parse::<u128>().ok()
        })
        .map(|kib| kib * 1024)
    else {
        return Ok(());
    };
    if need > available {
        let gib = |b: u128| b as f64 / f64::from(1u32 << 30);
        return Err(CommError::Usage(format!(
            "--sizes {largest} with -n {nproc}: the ranks need {:.1} GiB (a send and a receive \
             buffer of {largest} bytes each) but this machine has {:.1} GiB available; give \
             smaller sizes or fewer ranks",
            gib(need),
            gib(available)
        )));
    }
    Ok(())
}

/// Starts this command again as the ranks of a local job and prints the
/// table rank 0 leaves in a file.
fn relaunch(args: &CommArgs) -> polychip_comm::Result<ExitCode> {
    // Check the options here, so that mistakes are reported once.
    let checked = options(args)?;
    let (kind, _) = transport_kind(args)?;
    let (nproc, named) = match args.nproc {
        Some(n) => (n, "-n".to_string()),
        None => match std::env::var("POLYCHIP_BENCH_RANKS") {
            // Quoted escaped and cut, like every value from the user.
            Ok(s) => (
                s.trim().parse().map_err(|_| {
                    CommError::Usage(format!(
                        "POLYCHIP_BENCH_RANKS={} is not a whole number of ranks (1 or more)",
                        polychip_comm::text::quoted(&s)
                    ))
                })?,
                format!("POLYCHIP_BENCH_RANKS={}", polychip_comm::text::quoted(&s)),
            ),
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(CommError::Usage(
                    "POLYCHIP_BENCH_RANKS is not UTF-8 text; give a whole number of ranks".into(),
                ));
            }
            Err(std::env::VarError::NotPresent) => (2, "-n".to_string()),
        },
    };
    // The ranks' communicators take 1 to MAX_WORLD ranks: refused here,
    // naming where the count came from, before any rank starts.
    let most = polychip_comm::collectives::MAX_WORLD;
    if !(1..=most).contains(&nproc) {
        return Err(CommError::Usage(format!(
            "{named} gives {nproc} ranks; the benchmark runs 1 to {most} (the most a \
             communicator takes)"
        )));
    }
    checked.check(nproc)?;
    check_memory(&checked, nproc)?;
    let exe = std::env::current_exe().map_err(|e| CommError::Io {
        rank: 0,
        op: "bench".into(),
        message: format!("cannot find the polychip executable: {e}"),
    })?;
    let table = std::env::temp_dir().join(format!(
        "polychip-bench-comm-{}-{}.txt",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    // `env` passes the transport choice on: the launcher copies this
    // process's environment, which safe code cannot change.
    let mut command = vec!["env".to_string(), format!("POLYCHIP_TRANSPORT={kind}")];
    command.push(exe.display().to_string());
    command.extend(std::env::args().skip(1));
    command.push("--table-out".into());
    command.push(table.display().to_string());
    let outcome = launch(&LaunchOptions::new(nproc, command));
    let printed = print_table(&table);
    let _ = std::fs::remove_file(&table);
    let outcome = outcome?;
    if outcome.stdout_closed {
        return Ok(crate::closed_pipe_exit());
    }
    if !outcome.success() {
        eprintln!("polychip bench comm: {}", outcome.description);
        let code = u8::try_from(outcome.exit_code)
            .ok()
            .filter(|&c| c != 0)
            .unwrap_or(1);
        return Ok(ExitCode::from(code));
    }
    printed.map_err(|e| CommError::Io {
        rank: 0,
        op: "bench".into(),
        message: format!(
            "rank 0 left no table in {}: {e}",
            polychip_files::shown_path(&table)
        ),
    })?;
    Ok(ExitCode::SUCCESS)
}

fn print_table(path: &Path) -> std::io::Result<()> {
    let text = std::fs::read_to_string(path)?;
    print!("{text}");
    Ok(())
}

/// One rank of the job: connect, time, and (rank 0) report.
fn rank(args: &CommArgs) -> polychip_comm::Result<ExitCode> {
    let options = options(args)?;
    let info = polychip_comm::env::from_env()?;
    options.check(info.world_size)?;
    let mut init = InitOptions::from_env()?;
    if args.transport.is_some() {
        let (kind, by) = transport_kind(args)?;
        init.transport = TransportKind::parse(&kind)?;
        init.requested_by = by.into();
    }
    let mut job = bootstrap::init_with(info, init)?;
    let (rank, world) = (job.info().rank, job.info().world_size);
    let transport = job.transport_choice().0.name();
    let rows = bench::run(&mut job, &options)?;
    if rank == 0 {
        let text = format!(
            "# polychip bench comm: {world} ranks, transport {transport}, redop sum\n{}",
            bench::format_table(&rows)
        );
        match &args.table_out {
            Some(path) => std::fs::write(path, text).map_err(|e| CommError::Io {
                rank,
                op: "bench".into(),
                message: format!("cannot write {}: {e}", polychip_files::shown_path(path)),
            })?,
            None => print!("{text}"),
        }
    }
    // A final store barrier, then the transport closes (see `bootstrap`).
    job.finish()?;
    Ok(ExitCode::SUCCESS)
}

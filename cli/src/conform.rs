//! `polychip conform`: the operator conformance suite on one plugin (or every
//! plugin found), run in a child process so that a crash or a hang fails a
//! case instead of the run (a new child goes on from the next case; a case
//! with no result within `--case-timeout` is a hang). Prints a summary
//! table; `--json` and `--junit` write machine reports. Exits 1 when any implemented, unwaived case fails
//! or a plugin found through the environment failed to load, 2 when the
//! command line or a file is wrong. Each plugin is loaded in a child process
//! first (as `polychip devices` does), so one that crashes or hangs while
//! loading is reported by name instead of ending the run; `--no-isolate`
//! loads it in this process directly.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use polychip_conformance::cases::Tier;
use polychip_conformance::report::Report;
use polychip_conformance::runner::CaseResult;
use polychip_conformance::suite::{self, Isolation, Stopped, Unit};
use polychip_conformance::waivers::Waivers;
use polychip_files::printable_lines;
use polychip_host::{DType, LoadOptions, Runtime};
use regex::Regex;

/// Options of `polychip conform`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The plugin to check (default: every plugin polychip devices would load).
    #[arg(long)]
    plugin: Option<PathBuf>,
    /// The plugin's device to run on (an index, 0 or more).
    // A negative index is taken as a value and refused by name (clap took
    // `-1` for a flag: "unexpected argument").
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    device: i64,
    /// Only operators whose name matches this regular expression.
    #[arg(long)]
    ops: Option<String>,
    /// Only these dtypes (comma-separated: f32,f16,bf16,f64,...).
    #[arg(long, value_delimiter = ',')]
    dtype: Vec<String>,
    /// Run only case number N of the selected operator and dtype (replay).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::numbers::whole::<usize>(0))]
    case: Option<usize>,
    /// A TOML file of waivers: skipped cases and loosened tolerances, each with a reason.
    #[arg(long)]
    waivers: Option<PathBuf>,
    /// Write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the report as JUnit XML to this file.
    #[arg(long)]
    junit: Option<PathBuf>,
    /// Also run the largest sizes (the nightly tier: rows of 152K classes
    /// in 32 rows, 16M-element tensors, 4096-deep matmuls, 2048-token attention).
    #[arg(long)]
    full: bool,
    /// Run the plugin in this process (faster; a crash or a hang ends the run).
    #[arg(long)]
    no_isolate: bool,
    /// Seconds a case may run before it is taken to hang: its worker is
    /// killed, the case fails and the suite goes on (not with --no-isolate).
    #[arg(long, default_value_t = DEFAULT_CASE_TIMEOUT, value_name = "SECONDS", allow_hyphen_values = true, value_parser = crate::numbers::Number)]
    case_timeout: f64,
    /// Internal: run the selected units and print JSON lines (the child
    /// process).
    #[arg(long, hide = true)]
    worker: bool,
    /// Internal: the first unit (of those selected) for a worker.
    #[arg(long, hide = true, default_value_t = 0, allow_negative_numbers = true, value_parser = crate::numbers::whole::<usize>(0))]
    start_unit: usize,
    /// Internal: the first case of that unit for a worker.
    #[arg(long, hide = true, default_value_t = 0, allow_negative_numbers = true, value_parser = crate::numbers::whole::<usize>(0))]
    start: usize,
}

/// `--case-timeout`'s default, seconds: far beyond any case of the suite
/// on a working plugin (the largest of `--full` take seconds even on the
/// bundled CPU plugins in a debug build), so that only a hang reaches it.
pub const DEFAULT_CASE_TIMEOUT: f64 = 120.0;

/// The longest `--case-timeout`, seconds (a day).
const MAX_CASE_TIMEOUT: f64 = 86_400.0;

fn usage(message: String) -> ExitCode {
    eprintln!("polychip conform: {}", printable_lines(&message));
    ExitCode::from(2)
}

/// `--device`'s value as an index: 0 or more, at most `u32::MAX`.
fn device_index(device: i64) -> Result<u32, String> {
    u32::try_from(device).map_err(|_| match device < 0 {
        true => format!("--device {device}: a device index is 0 or more"),
        false => format!("--device {device}: a device index is at most {}", u32::MAX),
    })
}

impl Args {
    /// `--device`, checked by [`run`] first.
    fn device(&self) -> u32 {
        device_index(self.device).expect("checked by run")
    }
}

fn parse_dtypes(names: &[String]) -> Result<Vec<DType>, String> {
    names
        .iter()
        .map(|n| {
            DType::from_name(n.trim()).ok_or_else(|| {
                format!("unknown dtype {n:?} (expected f32, f16, bf16, f64, i32, i64, u8 or bool)")
            })
        })
        .collect()
}

/// Runs the subcommand.
pub fn run(args: &Args) -> ExitCode {
    if let Err(e) = device_index(args.device) {
        return usage(e);
    }
    let ops = match args.ops.as_deref().map(Regex::new).transpose() {
        Ok(r) => r,
        Err(e) => return usage(format!("--ops is not a valid regular expression: {e}")),
    };
    let dtypes = match parse_dtypes(&args.dtype) {
        Ok(d) => d,
        Err(e) => return usage(e),
    };
    let waivers = match &args.waivers {
        Some(p) => match Waivers::load(p) {
            Ok(w) => w,
            Err(e) => return usage(crate::outputs::reshown(&e, p)),
        },
        None => Waivers::default(),
    };
    if !(args.case_timeout > 0.0 && args.case_timeout <= MAX_CASE_TIMEOUT) {
        return usage(format!(
            "--case-timeout {} is not a number of seconds in (0, {MAX_CASE_TIMEOUT}]",
            polychip_planner::cluster::fmt_num(args.case_timeout)
        ));
    }
    let tier = if args.full { Tier::Full } else { Tier::Default };
    let units = suite::select(ops.as_ref(), &dtypes, tier);
    if units.is_empty() {
        return usage("no operator and dtype match --ops and --dtype".into());
    }
    if args.case.is_some() && units.len() != 1 {
        return usage(format!(
            "--case replays one case, but --ops and --dtype select {} (operator, dtype) pairs",
            units.len()
        ));
    }
    if let Some(case) = args.case {
        let unit = &units[0];
        let n = unit.len();
        if case >= n {
            let tier = if args.full { "" } else { " without --full" };
            let has = match n {
                0 => format!("has no cases{tier}"),
                1 => format!("has 1 case{tier}, case 0"),
                n => format!("has {n} cases{tier}, numbered 0 to {}", n - 1),
            };
            return usage(format!(
                "--case {case} is beyond the cases: {} in {} {has}",
                unit.op.name,
                unit.dtype.name()
            ));
        }
    }
    if args.worker {
        return worker(args, &units, &waivers);
    }
    // The reports' files, before the suite runs, not after it.
    let reports_to = [
        ("--json", args.json.as_deref()),
        ("--junit", args.junit.as_deref()),
    ];
    for (flag, path) in reports_to {
        if let Some(p) = path
            && let Err(e) = crate::outputs::check_file(flag, p)
        {
            return usage(e);
        }
    }
    let inputs = [
        ("--waivers", args.waivers.as_deref()),
        ("--plugin", args.plugin.as_deref()),
    ];
    if let Err(e) = crate::outputs::check_distinct(&inputs, &reports_to) {
        return usage(e);
    }
    let mut load_failed = false;
    let plugins = match &args.plugin {
        Some(p) => vec![p.clone()],
        None => {
            let runtime = match crate::devices::runtime_from_env() {
                Ok(r) => r,
                Err(e) => return usage(e),
            };
            for failure in runtime.failures() {
                eprintln!("polychip conform: failed to load: {}", failure.error);
                load_failed = true;
            }
            runtime
                .plugins()
                .iter()
                .map(|p| p.path().to_path_buf())
                .collect()
        }
    };
    if plugins.is_empty() {
        return usage("no plugin to check: give --plugin PATH or build the bundled plugins".into());
    }
    let mut reports = Vec::new();
    let mut all_results = Vec::new();
    for plugin in &plugins {
        match check_plugin(args, plugin, &units, &waivers) {
            Ok(Checked::Done(report, results)) => {
                print!("{}", report.table());
                reports.push(*report);
                all_results.push(results);
            }
            Ok(Checked::Stopped { why, done, total }) => {
                // Nothing half-done is written: no table, no reports.
                let plugin = polychip_files::shown_path(plugin);
                return match why {
                    Stopped::Signal(signal) => {
                        eprintln!(
                            "polychip conform: stopped by {} after {done} of {total} cases of \
                             {plugin}; its worker was stopped, and no report was written",
                            polychip_files::signals::signal_name(signal),
                        );
                        ExitCode::from(128 + signal.clamp(1, 127) as u8)
                    }
                    Stopped::Refused {
                        message,
                        unit,
                        dtype,
                        case,
                    } => {
                        eprintln!(
                            "polychip conform: could not go on checking {plugin} after {done} of \
                             {total} cases (next: {unit} {dtype} case {case}): {message}. The \
                             system refused what conform needs to run the plugin (a process or \
                             thread limit?), so this is no verdict on the plugin: no report was \
                             written"
                        );
                        ExitCode::from(HARNESS_REFUSED)
                    }
                };
            }
            Err(e) => return usage(e),
        }
    }
    if let Some(path) = &args.json {
        let doc = if reports.len() == 1 {
            serde_json::to_string_pretty(&reports[0])
        } else {
            serde_json::to_string_pretty(&reports)
        };
        let doc = doc.expect("reports serialize");
        if let Err(e) = crate::outputs::write("--json", path, doc.as_bytes()) {
            return usage(e);
        }
    }
    if let Some(path) = &args.junit {
        let xml: String = reports
            .iter()
            .zip(&all_results)
            .map(|(r, res)| r.junit(res))
            .collect();
        if let Err(e) = crate::outputs::write("--junit", path, xml.as_bytes()) {
            return usage(e);
        }
    }
    if !load_failed && reports.iter().all(Report::ok) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The exit status when the system refused conform's worker or a thread
/// to read it: neither a plugin's failure (1) nor a wrong command (2).
const HARNESS_REFUSED: u8 = 3;

/// What checking one plugin came to.
enum Checked {
    /// Every selected case ran.
    Done(Box<Report>, Vec<CaseResult>),
    /// The suite stopped after `done` of `total` cases: a signal, or the
    /// system refused the worker or a thread to read it.
    Stopped {
        why: Stopped,
        done: usize,
        total: usize,
    },
}

fn check_plugin(
    args: &Args,
    plugin: &Path,
    units: &[Unit],
    waivers: &Waivers,
) -> Result<Checked, String> {
    let runtime = if args.no_isolate {
        Runtime::load(&[plugin], &LoadOptions::default())
    } else {
        Runtime::load_probed(
            &[plugin],
            &LoadOptions::default(),
            &crate::devices::probe()?,
        )
    };
    if let Some(f) = runtime.failures().first() {
        return Err(f.error.to_string());
    }
    let loaded = &runtime.plugins()[0];
    let vendor = format!("{} {}", loaded.vendor(), loaded.version());
    let device_count = loaded.devices().len() as u32;
    if args.device() >= device_count {
        return Err(format!(
            "{}: device {} does not exist; {vendor} has {device_count} device(s)",
            polychip_files::shown_path(plugin),
            args.device
        ));
    }
    let total: usize = units
        .iter()
        .map(|u| if args.case.is_some() { 1 } else { u.len() })
        .sum();
    let progress = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut results = Vec::new();
    let mut on_result = |r: CaseResult| {
        if progress {
            let done = results.len() + 1;
            let width = 30;
            let filled = done * width / total.max(1);
            eprint!(
                "\r[{}{}] {done}/{total} {} {}          ",
                "#".repeat(filled),
                " ".repeat(width - filled),
                r.op,
                r.dtype
            );
            let _ = std::io::stderr().flush();
        }
        results.push(r);
    };
    if args.no_isolate {
        let device = runtime.devices()[args.device() as usize].clone();
        for &unit in units {
            suite::run_unit(&device, unit, 0, args.case, waivers, &mut on_result);
        }
    } else {
        let exe = std::env::current_exe()
            .map_err(|e| format!("cannot find the polychip executable to start workers: {e}"))?;
        let iso = Isolation {
            exe,
            plugin: plugin.to_path_buf(),
            device: args.device(),
            waivers: args.waivers.clone(),
            selection: selection_args(args),
            case_timeout: Duration::from_secs_f64(args.case_timeout),
        };
        // A signal stops the worker with the suite: it ran on as an orphan
        // when conform was ended by a signal it did not die of (SIGINT
        // ignored in a background job) until 2026-12-06.
        let signals = polychip_files::signals::SignalGuard::install();
        let stopped =
            suite::run_isolated(&iso, units, args.case, &mut on_result, || signals.caught());
        if let Some(why) = stopped {
            if progress {
                eprint!("\r{}\r", " ".repeat(80));
            }
            let done = results.len();
            return Ok(Checked::Stopped { why, done, total });
        }
    }
    if progress {
        eprint!("\r{}\r", " ".repeat(80));
    }
    let report = Report::new(
        &plugin.display().to_string(),
        &vendor,
        args.device(),
        &results,
        waivers,
        started.elapsed().as_secs_f64(),
    )
    .with_load_findings(loaded.load_findings(), loaded.load_notes());
    Ok(Checked::Done(Box::new(report), results))
}

/// The arguments that select the units, for a worker to select the same.
fn selection_args(args: &Args) -> Vec<String> {
    let mut out = Vec::new();
    // `--name=value`: a value may start with a dash.
    if let Some(ops) = &args.ops {
        out.push(format!("--ops={ops}"));
    }
    if !args.dtype.is_empty() {
        out.push(format!("--dtype={}", args.dtype.join(",")));
    }
    if args.full {
        out.push("--full".into());
    }
    out
}

fn worker(args: &Args, units: &[Unit], waivers: &Waivers) -> ExitCode {
    let Some(plugin) = &args.plugin else {
        return usage("--worker needs --plugin".into());
    };
    let runtime = Runtime::load(&[plugin], &LoadOptions::default());
    if let Some(f) = runtime.failures().first() {
        return usage(f.error.to_string());
    }
    let Some(device) = runtime.devices().get(args.device() as usize).cloned() else {
        return usage(format!("device {} does not exist", args.device()));
    };
    let mut out = std::io::stdout().lock();
    suite::run_worker(
        &device,
        units,
        args.start_unit,
        args.start,
        args.case,
        waivers,
        &mut out,
    );
    ExitCode::SUCCESS
}

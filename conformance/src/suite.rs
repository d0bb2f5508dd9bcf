//! Running the suite on one plugin: which (operator, dtype) units are
//! selected, running a unit in this process (the worker side), and running
//! it in a child process so that a crash in the plugin fails that case and
//! the suite goes on (the parent side).
//!
//! The child is the same program started with the arguments that
//! [`worker_args`] builds; it loads the plugin, rebuilds the unit's cases
//! (they are deterministic) and prints one JSON [`CaseResult`] per line.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use polychip_host::{DType, Device};
use regex::Regex;

use crate::cases::{self, OpInfo, Tier};
use crate::runner::{CaseResult, Status, run_case};
use crate::waivers::{Action, Waivers};

/// One operator in one dtype.
#[derive(Debug, Clone, Copy)]
pub struct Unit {
    /// The operator.
    pub op: OpInfo,
    /// The dtype.
    pub dtype: DType,
    /// Which sizes run.
    pub tier: Tier,
}

impl Unit {
    /// Number of cases.
    pub fn len(&self) -> usize {
        self.op.count(self.dtype, self.tier)
    }

    /// Whether it has no cases.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The units whose operator matches `ops` (a regex; `None`: all) and whose
/// dtype is in `dtypes` (empty: all), with the sizes of `tier`.
pub fn select(ops: Option<&Regex>, dtypes: &[DType], tier: Tier) -> Vec<Unit> {
    let mut units = Vec::new();
    for op in cases::registry() {
        if ops.is_some_and(|re| !re.is_match(op.name)) {
            continue;
        }
        for &dtype in op.dtypes {
            if dtypes.is_empty() || dtypes.contains(&dtype) {
                units.push(Unit { op, dtype, tier });
            }
        }
    }
    units
}

/// Runs the cases of `unit` from `start` (only case `only` when given) on
/// `device` in this process, applying `waivers`, and hands each result to `emit`.
pub fn run_unit(
    device: &Device,
    unit: Unit,
    start: usize,
    only: Option<usize>,
    waivers: &Waivers,
    mut emit: impl FnMut(CaseResult),
) {
    let waiver = waivers.find(unit.op.name, unit.dtype.name());
    for (index, case) in unit
        .op
        .cases(unit.dtype, unit.tier)
        .iter()
        .enumerate()
        .skip(start)
    {
        if only.is_some_and(|o| o != index) {
            continue;
        }
        let result = match waiver {
            Some(w) if w.action == Action::Skip => CaseResult {
                op: unit.op.name.into(),
                dtype: unit.dtype.name().into(),
                index,
                label: case.label.clone(),
                status: Status::Skipped,
                message: format!("waived: {}", w.reason),
                stats: Default::default(),
                plugin_seconds: 0.0,
                reference_seconds: 0.0,
            },
            _ => {
                let factor = waiver.and_then(|w| w.factor).unwrap_or(1.0);
                let mut r = run_case(device, case, index, factor);
                if r.status == Status::Failed {
                    if let Some(summary) = crate::shrink::shrink(device, case, index, factor) {
                        r.message = format!("{}; {summary}", r.message);
                    }
                }
                r
            }
        };
        emit(result);
    }
}

/// The arguments that make `polychip` a worker for one unit.
pub fn worker_args(
    plugin: &Path,
    device: u32,
    unit: Unit,
    start: usize,
    only: Option<usize>,
    waivers: Option<&Path>,
) -> Vec<String> {
    let mut args = vec![
        "conform".to_string(),
        "--worker".into(),
        "--plugin".into(),
        plugin.display().to_string(),
        "--device".into(),
        device.to_string(),
        "--ops".into(),
        format!("^{}$", unit.op.name),
        "--dtype".into(),
        unit.dtype.name().into(),
        "--start".into(),
        start.to_string(),
    ];
    if let Some(i) = only {
        args.extend(["--case".into(), i.to_string()]);
    }
    if unit.tier == Tier::Full {
        args.push("--full".into());
    }
    if let Some(w) = waivers {
        args.extend(["--waivers".into(), w.display().to_string()]);
    }
    args
}

/// Writes one result as a line of JSON (the worker's output).
pub fn emit_line(out: &mut impl Write, result: &CaseResult) {
    let line = serde_json::to_string(result).expect("results serialize");
    // The parent reads until end of file; a closed pipe means it is gone.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// How to start a worker: the program and the waiver file to pass on.
#[derive(Debug, Clone)]
pub struct Isolation {
    /// The `polychip` executable.
    pub exe: PathBuf,
    /// The plugin under test.
    pub plugin: PathBuf,
    /// Its device index.
    pub device: u32,
    /// The waiver file, if any.
    pub waivers: Option<PathBuf>,
}

/// Runs `unit` in child processes: when one dies, the case it was running
/// fails with the signal or exit status and a new child continues with the
/// next case.
pub fn run_unit_isolated(
    iso: &Isolation,
    unit: Unit,
    only: Option<usize>,
    mut emit: impl FnMut(CaseResult),
) {
    let labels = unit.op.labels(unit.dtype, unit.tier);
    let total = labels.len();
    let mut next = only.unwrap_or(0);
    while next < total {
        let mut child = match Command::new(&iso.exe)
            .args(worker_args(
                &iso.plugin,
                iso.device,
                unit,
                next,
                only,
                iso.waivers.as_deref(),
            ))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                emit(crashed(
                    unit,
                    next,
                    &labels,
                    format!("could not start the worker {}: {e}", iso.exe.display()),
                ));
                return;
            }
        };
        let stdout = child.stdout.take().expect("piped");
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            match serde_json::from_str::<CaseResult>(&line) {
                Ok(result) => {
                    next = result.index + 1;
                    emit(result);
                }
                Err(e) => {
                    let mut r = crashed(unit, next, &labels, String::new());
                    r.message = format!(
                        "internal: the worker's result line could not be read ({e}): {line}"
                    );
                    emit(r);
                    next += 1;
                }
            }
        }
        let output = child.wait_with_output();
        if only.is_some() || next >= total {
            if let Ok(out) = &output {
                if !out.status.success() && next < total {
                    emit(crashed(
                        unit,
                        next,
                        &labels,
                        describe_exit(&out.status, &out.stderr),
                    ));
                }
            }
            return;
        }
        let why = match &output {
            Ok(out) => describe_exit(&out.status, &out.stderr),
            Err(e) => format!("the worker could not be waited for: {e}"),
        };
        emit(crashed(unit, next, &labels, why));
        next += 1;
    }
}

fn crashed(unit: Unit, index: usize, labels: &[String], why: String) -> CaseResult {
    CaseResult {
        op: unit.op.name.into(),
        dtype: unit.dtype.name().into(),
        index,
        label: labels.get(index).cloned().unwrap_or_default(),
        status: Status::Failed,
        message: format!("the plugin crashed: {why}"),
        stats: Default::default(),
        plugin_seconds: 0.0,
        reference_seconds: 0.0,
    }
}

fn describe_exit(status: &std::process::ExitStatus, stderr: &[u8]) -> String {
    use std::os::unix::process::ExitStatusExt;
    let what = match status.signal() {
        Some(11) => "killed by signal 11 (SIGSEGV)".to_string(),
        Some(6) => "killed by signal 6 (SIGABRT)".to_string(),
        Some(7) => "killed by signal 7 (SIGBUS)".to_string(),
        Some(8) => "killed by signal 8 (SIGFPE)".to_string(),
        Some(s) => format!("killed by signal {s}"),
        None => format!("exited with {status}"),
    };
    let tail = String::from_utf8_lossy(stderr);
    let tail = tail.trim().lines().last().unwrap_or("").to_string();
    if tail.is_empty() {
        what
    } else {
        format!("{what}; last words: {tail}")
    }
}

//! Running the suite on one plugin: which (operator, dtype) units are
//! selected, running units in this process (the worker side), and running
//! them in a child process so that a crash or a hang in the plugin fails
//! that case and the suite goes on (the parent side).
//!
//! The child is the same program started with the arguments that
//! [`Isolation::worker_args`] builds; it loads the plugin once, selects the
//! same units as its parent, rebuilds their cases (they are deterministic)
//! and prints one JSON [`WorkerLine`] per case. One child runs the whole
//! list; only a crash or a hang starts another, from the next case.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use polychip_files::threads::{self, ThreadRefused};
use polychip_host::ffi::procstate::{self, ProcStateChange};
use polychip_host::{DType, Device};
use regex::Regex;

use crate::cases::{self, OpInfo, Tier};
use crate::runner::{CaseResult, Status, run_case};
use crate::waivers::{Action, Waivers};
use serde::{Deserialize, Serialize};

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
                // The process state the plugin must leave alone (ABI rule
                // 13), read once around all of the case's calls (uploads,
                // the call, reading back, from several threads, again and
                // again): a forbidden change fails the case, and this
                // thread is put back so that no case starts from what the
                // one before left. (Handlers and variables are reported at
                // load only.)
                let (mut r, changes) = procstate::around(|| run_case(device, case, index, factor));
                let forbidden = changes.forbidden;
                if !forbidden.is_empty() {
                    let change = ProcStateChange {
                        plugin: device.plugin().vendor().to_string(),
                        during: "running this case".into(),
                        what: forbidden,
                        forbidden: true,
                    }
                    .to_string();
                    r.message = if r.status == Status::Failed {
                        format!("{}; {change}", r.message)
                    } else {
                        change
                    };
                    r.status = Status::Failed;
                }
                if r.status == Status::Failed {
                    let (summary, _) =
                        procstate::around(|| crate::shrink::shrink(device, case, index, factor));
                    if let Some(summary) = summary {
                        r.message = format!("{}; {summary}", r.message);
                    }
                }
                r
            }
        };
        emit(result);
    }
}

/// How to start a worker: the program, the plugin, and the arguments that
/// select the units (the worker selects the same list as its parent).
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
    /// The arguments that select the units (`--ops`, `--dtype`, `--full`),
    /// as the parent was given them.
    pub selection: Vec<String>,
    /// How long a worker may go without a result before it is taken to
    /// hang, is killed, and the case it was running fails.
    pub case_timeout: Duration,
}

impl Isolation {
    /// The arguments that make `polychip` a worker running the selected
    /// units from case `start` of unit `unit` on (only case `only` of the
    /// one unit when given).
    pub fn worker_args(&self, unit: usize, start: usize, only: Option<usize>) -> Vec<String> {
        let mut args = vec![
            "conform".to_string(),
            "--worker".into(),
            format!("--plugin={}", self.plugin.display()),
            "--device".into(),
            self.device.to_string(),
            "--start-unit".into(),
            unit.to_string(),
            "--start".into(),
            start.to_string(),
        ];
        args.extend(self.selection.iter().cloned());
        if let Some(i) = only {
            args.extend(["--case".into(), i.to_string()]);
        }
        if let Some(w) = &self.waivers {
            args.push(format!("--waivers={}", w.display()));
        }
        args
    }
}

/// One line of a worker's output: a result and the index of its unit in
/// the selected list.
#[derive(Debug, Serialize, Deserialize)]
pub struct WorkerLine {
    /// The unit's index in the list both sides select.
    pub unit: usize,
    /// The case's result.
    pub result: CaseResult,
}

/// Runs the selected `units` in this process from case `start` of unit
/// `first` on (the worker side), writing each result as a [`WorkerLine`]
/// of JSON to `out`.
pub fn run_worker(
    device: &Device,
    units: &[Unit],
    first: usize,
    start: usize,
    only: Option<usize>,
    waivers: &Waivers,
    out: &mut impl Write,
) {
    for (u, &unit) in units.iter().enumerate().skip(first) {
        let from = if u == first { start } else { 0 };
        run_unit(device, unit, from, only, waivers, |result| {
            let line =
                serde_json::to_string(&WorkerLine { unit: u, result }).expect("results serialize");
            // The parent reads until end of file; a closed pipe means it is
            // gone, and the worker stops (it ran the rest of the suite).
            if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
                std::process::exit(1);
            }
        });
    }
}

/// The most bytes of a worker's standard error kept for the message of a
/// crash (its last words); the rest is read and dropped, so that a plugin
/// that logs without end neither blocks on a full pipe nor fills memory.
const STDERR_TAIL: usize = 4096;

/// The longest line of a worker's output kept, bytes (a result is a few
/// KB; a longer line is the plugin's own output and is cut).
const MAX_LINE: usize = 1 << 20;

/// The next line of `r` (without reading more than `max` bytes of it into
/// memory: the rest of a longer line is read and dropped), `None` at the
/// end.
fn read_line_bounded(r: &mut impl BufRead, max: usize) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok((!line.is_empty()).then_some(line));
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        let room = max.saturating_sub(line.len()).min(take);
        line.extend_from_slice(&buf[..room]);
        r.consume(take);
        if done {
            return Ok(Some(line));
        }
    }
}

/// The result a line of a worker's output holds, if any. The plugin shares
/// the worker's standard output: a line without a result is the plugin's
/// own, and the plugin's unfinished output may precede a result on its line.
fn parse_worker_line(line: &str) -> Option<WorkerLine> {
    let at = line.find("{\"unit\":")?;
    serde_json::from_str(line[at..].trim_end()).ok()
}

/// Runs `units` in child processes, one for the whole list: when one dies,
/// the case it was running fails with the signal or exit status; when one
/// gives no result for [`Isolation::case_timeout`], it is killed and that
/// case fails as hung. Either way a new child continues with the next case.
/// With `only`, `units` is one unit and only that case runs.
///
/// `interrupted` is asked about every 50 ms and after each result: when it
/// gives a signal (not 0), the worker is killed and waited for, and the
/// suite stops unfinished ([`Stopped::Signal`]). When the system refuses
/// the worker or a thread to read it, the suite stops too
/// ([`Stopped::Refused`]): the cases left are not judged, as no plugin
/// code ran them. `None`: every case ran.
pub fn run_isolated(
    iso: &Isolation,
    units: &[Unit],
    only: Option<usize>,
    mut emit: impl FnMut(CaseResult),
    mut interrupted: impl FnMut() -> i32,
) -> Option<Stopped> {
    // The cases each unit runs: [first, end).
    let first = only.unwrap_or(0);
    let ends: Vec<usize> = units
        .iter()
        .map(|u| only.map_or(u.len(), |o| (o + 1).min(u.len())))
        .collect();
    // The next case to run from `at` on, past units that are finished;
    // `None` when every case has run.
    let next = |mut at: (usize, usize)| {
        while at.0 < units.len() && at.1 >= ends[at.0] {
            at = (at.0 + 1, first);
        }
        (at.0 < units.len()).then_some(at)
    };
    // A case that failed without a result of its own. Its label is built
    // only then: building a unit's labels builds its realistic cases.
    let failed = |(u, index): (usize, usize), message: String| {
        let unit = units[u];
        let labels = unit.op.labels(unit.dtype, unit.tier);
        failed_case(unit, index, &labels, message)
    };
    let mut at = (0, first);
    while let Some((u, case)) = next(at) {
        at = (u, case);
        let mut cmd = Command::new(&iso.exe);
        cmd.args(iso.worker_args(u, case, only))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // A worker dies with `polychip conform` (SIGKILL: a plugin may
        // block other signals): it ran on through the suite, or in a hung
        // case for ever, when conform was killed.
        polychip_files::die_with_parent(&mut cmd, 9);
        // The system refused the worker or a thread to read it (a process
        // limit, a missing executable): the suite stops there. Until
        // 2026-12-07 every case left failed with the sentence, a harness
        // failure reported as the plugin's.
        let refused_at = |message: String| {
            Some(Stopped::Refused {
                message,
                unit: units[u].op.name,
                dtype: units[u].dtype.name(),
                case,
            })
        };
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                return refused_at(format!(
                    "could not start the worker {}: {e}",
                    iso.exe.display()
                ));
            }
        };
        // A thread refused: the worker is killed, which ends a reader
        // already started (its pipe closes).
        let refused = |child: &mut std::process::Child, e: ThreadRefused| {
            let _ = child.kill();
            let _ = child.wait();
            refused_at(e.to_string())
        };
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped");
        // Sends each line of the worker's output; the channel closes at its end.
        let reader = threads::spawn("read the conformance worker's results", move || {
            let mut stdout = BufReader::new(stdout);
            while let Ok(Some(line)) = read_line_bounded(&mut stdout, MAX_LINE) {
                if tx
                    .send(String::from_utf8_lossy(&line).into_owned())
                    .is_err()
                {
                    return;
                }
            }
        });
        let reader = match reader {
            Ok(r) => r,
            Err(e) => return refused(&mut child, e),
        };
        let mut stderr = child.stderr.take().expect("piped");
        let tail = threads::spawn("keep the conformance worker's last words", move || {
            let mut kept: Vec<u8> = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > 2 * STDERR_TAIL {
                    kept.drain(..kept.len() - STDERR_TAIL);
                }
            }
            kept
        });
        let tail = match tail {
            Ok(t) => t,
            Err(e) => return refused(&mut child, e),
        };
        let mut hung = false;
        // The time counts from the last result: what the plugin prints
        // meanwhile does not extend it.
        let mut deadline = Instant::now() + iso.case_timeout;
        loop {
            let signal = interrupted();
            if signal != 0 {
                // Stopped from outside (SIGINT, SIGTERM): the worker goes
                // with the suite instead of running on as an orphan.
                let _ = child.kill();
                let _ = child.wait();
                return Some(Stopped::Signal(signal));
            }
            let now = Instant::now();
            if now >= deadline {
                hung = true;
                let _ = child.kill();
                break;
            }
            match rx.recv_timeout((deadline - now).min(Duration::from_millis(50))) {
                Ok(line) => match parse_worker_line(&line) {
                    // What the plugin itself printed: not a result.
                    None => {}
                    Some(l) if l.unit < units.len() => {
                        // Cases between the last result and this one gave
                        // none (a line too long to keep, or garbled, is not
                        // read as a result): each fails, naming why, instead
                        // of vanishing from the report (until 2026-12-06 a
                        // plugin whose every failure said more than 1 MiB
                        // passed with 0 cases failed).
                        while let Some(missing) = next(at).filter(|&m| m < (l.unit, l.result.index))
                        {
                            emit(failed(
                                missing,
                                format!(
                                    "no result came back from the worker for this case: a \
                                     line of its output that was not a whole result (more \
                                     than {MAX_LINE} bytes, or garbled) was dropped"
                                ),
                            ));
                            at = (missing.0, missing.1 + 1);
                        }
                        at = (l.unit, l.result.index + 1);
                        emit(l.result);
                        deadline = Instant::now() + iso.case_timeout;
                    }
                    Some(l) => {
                        let message = format!(
                            "internal: the worker reported unit {}, but {} are selected",
                            l.unit,
                            units.len()
                        );
                        emit(failed(at, message));
                        at.1 += 1;
                    }
                },
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
        let status = child.wait();
        // After a kill, a process the plugin started may still hold the
        // pipes open: the readers are then left to finish on their own.
        let stderr = if hung {
            Vec::new()
        } else {
            let _ = reader.join();
            tail.join().unwrap_or_default()
        };
        let now = next(at)?;
        let message = if hung {
            format!(
                "the plugin hung: no result within {} s (--case-timeout), so the worker was killed",
                iso.case_timeout.as_secs_f64()
            )
        } else {
            match &status {
                Ok(s) if s.success() => format!(
                    "the worker exited with status 0 without a result for this case: the \
                     plugin ended the process, or the case's result line (more than \
                     {MAX_LINE} bytes, or garbled) was dropped"
                ),
                Ok(s) => format!("the plugin crashed: {}", describe_exit(s, &stderr)),
                Err(e) => format!("the plugin crashed: the worker could not be waited for: {e}"),
            }
        };
        emit(failed(now, message));
        at = (now.0, now.1 + 1);
    }
    None
}

/// Why [`run_isolated`] stopped before every case ran.
#[derive(Debug, Clone, PartialEq)]
pub enum Stopped {
    /// A signal from outside (SIGINT, SIGTERM, SIGHUP).
    Signal(i32),
    /// The system refused what the suite needs to run the plugin: the
    /// worker process or a thread to read it (`message`), before case
    /// `case` of `unit` in `dtype`. No verdict on the plugin.
    Refused {
        message: String,
        unit: &'static str,
        dtype: &'static str,
        case: usize,
    },
}

/// Case `index` of `unit` failed without a result of its own (the worker
/// died or hung), for `message`.
fn failed_case(unit: Unit, index: usize, labels: &[String], message: String) -> CaseResult {
    CaseResult {
        op: unit.op.name.into(),
        dtype: unit.dtype.name().into(),
        index,
        label: labels.get(index).cloned().unwrap_or_default(),
        status: Status::Failed,
        message,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn line(unit: usize, index: usize) -> String {
        let result = CaseResult {
            op: "neg".into(),
            dtype: "f32".into(),
            index,
            label: "small".into(),
            status: Status::Passed,
            message: String::new(),
            stats: Default::default(),
            plugin_seconds: 0.0,
            reference_seconds: 0.0,
        };
        serde_json::to_string(&WorkerLine { unit, result }).unwrap()
    }

    /// What the plugin prints on the worker's standard output is not taken
    /// for a result, nor does it hide one that follows it on its line.
    #[test]
    fn a_plugins_own_output_is_told_from_the_results() {
        assert!(parse_worker_line("vendor kernel cache warmed up").is_none());
        assert!(parse_worker_line("{\"unit\": not json").is_none());
        let r = parse_worker_line(&line(3, 7)).unwrap();
        assert_eq!((r.unit, r.result.index), (3, 7));
        let r = parse_worker_line(&format!("[vendor] partial log {}\n", line(1, 2))).unwrap();
        assert_eq!((r.unit, r.result.index), (1, 2));
    }

    /// A line longer than the bound is cut, not held whole in memory, and
    /// the lines after it are read as usual.
    #[test]
    fn long_lines_are_cut_and_the_next_ones_read() {
        let text = format!("{}\nshort\n{}", "x".repeat(10_000), "tail");
        let mut r = BufReader::with_capacity(64, text.as_bytes());
        let first = read_line_bounded(&mut r, 100).unwrap().unwrap();
        assert_eq!(first, vec![b'x'; 100]);
        assert_eq!(read_line_bounded(&mut r, 100).unwrap().unwrap(), b"short\n");
        assert_eq!(read_line_bounded(&mut r, 100).unwrap().unwrap(), b"tail");
        assert!(read_line_bounded(&mut r, 100).unwrap().is_none());
    }

    /// A worker the system does not start stops the suite without a
    /// verdict on any case (until 2026-12-07 every case failed with the
    /// sentence, as if the plugin had failed them).
    #[test]
    fn a_worker_that_cannot_start_stops_the_suite_without_judging_a_case() {
        let re = Regex::new("^neg$").unwrap();
        let units = select(Some(&re), &[DType::F32], Tier::Default);
        assert_eq!(units.len(), 1);
        let iso = Isolation {
            exe: PathBuf::from("/nonexistent/polychip"),
            plugin: PathBuf::from("/nonexistent/libplugin.so"),
            device: 0,
            waivers: None,
            selection: Vec::new(),
            case_timeout: Duration::from_secs(5),
        };
        let mut emitted = 0;
        let stopped = run_isolated(&iso, &units, None, |_| emitted += 1, || 0);
        assert_eq!(emitted, 0, "a case was judged");
        match stopped {
            Some(Stopped::Refused {
                message,
                unit,
                dtype,
                case,
            }) => {
                assert!(
                    message.starts_with("could not start the worker /nonexistent/polychip: "),
                    "{message}"
                );
                assert_eq!((unit, dtype, case), ("neg", "f32", 0));
            }
            other => panic!("{other:?}"),
        }
    }
}

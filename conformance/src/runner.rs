//! Running one case on one device: place every tensor in its layout inside
//! a guarded buffer (`crate::placement`; an in-place output is its input's
//! view), poison the outputs, call the plugin, read every buffer back whole,
//! check that inputs and guards are unchanged, run again with a second
//! poison where an output still holds the first (so "never wrote" is
//! exact), judge a refusal by its error code, and compare each output with
//! the exact reference under its error model.

use std::time::Instant;

use polychip_host::ffi::fpenv;
use polychip_host::{DType, Device, ErrorCode, HostError, Stream, Tensor};
use serde::{Deserialize, Serialize};

use crate::case::{Case, Role, StreamSync, TensorSpec};
use crate::compare::{Stats, bias_failure, compare};
use crate::placement::Placement;
use crate::reference::RefError;
use crate::values::{FINITE_POISON_BYTE, POISON_BYTE, from_bytes};

/// How a case ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Every output within tolerance, inputs unchanged.
    Passed,
    /// Wrong values, a modified input, an unwritten output, a missing or
    /// unexpected error, or a crash.
    Failed,
    /// The op-table entry is NULL, or the plugin answered
    /// `POLYCHIP_ERROR_UNIMPLEMENTED` for this dtype.
    NotImplemented,
    /// Skipped by the vendor's waiver file, or too large for the device
    /// (its tensors need more than a quarter of the device's memory).
    Skipped,
}

/// The outcome of one case.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaseResult {
    /// Operator.
    pub op: String,
    /// Dtype under test.
    pub dtype: String,
    /// Index of the case in its (op, dtype) list.
    pub index: usize,
    /// What the case exercises.
    pub label: String,
    /// Outcome.
    pub status: Status,
    /// Why it failed or was not run.
    pub message: String,
    /// Error statistics over all outputs.
    pub stats: Stats,
    /// Seconds in the plugin call.
    pub plugin_seconds: f64,
    /// Seconds in the reference.
    pub reference_seconds: f64,
}

/// How many guard elements a call changed, and where the first one is.
type GuardDamage = (usize, String);

/// One tensor as uploaded: the view the plugin gets, the buffer the suite
/// allocated around it, where the view sits in it, and the buffer's bytes
/// as written (guards included).
struct Uploaded {
    view: Tensor,
    buffer: Tensor,
    placement: Placement,
    written: Vec<u8>,
}

impl Uploaded {
    /// Reads the whole buffer back: the view's elements in row-major order,
    /// and what happened to the guard zones around and between them.
    fn read(&self, spec: &TensorSpec) -> polychip_host::Result<(Vec<u8>, Option<GuardDamage>)> {
        let size = spec.dtype.size();
        let after = self.buffer.read_bytes()?;
        Ok((
            self.placement.gather(size, &after),
            self.placement.guard_damage(size, &self.written, &after),
        ))
    }
}

/// Uploads one tensor in its layout inside a guarded buffer; outputs are
/// filled with poison. A case with a warm-up call puts its views one
/// element further in (see [`warm_up`]).
fn upload(
    device: &Device,
    spec: &TensorSpec,
    poison: u8,
    warm_up: bool,
) -> polychip_host::Result<Uploaded> {
    upload_elements(device, spec, &elements(spec, poison), warm_up)
}

/// The bytes of `spec`'s elements before a call: its values, or `poison`
/// in every byte of an output.
fn elements(spec: &TensorSpec, poison: u8) -> Vec<u8> {
    match spec.role {
        Role::Output => vec![poison; numel(&spec.shape) * spec.dtype.size()],
        Role::Input | Role::InOut => spec.bytes(),
    }
}

/// [`upload`] of elements already encoded ([`elements`]): a case called
/// again and again encodes its values once.
fn upload_elements(
    device: &Device,
    spec: &TensorSpec,
    elements: &[u8],
    warm_up: bool,
) -> polychip_host::Result<Uploaded> {
    let placement = Placement::new(&spec.shape, spec.layout).with_lead(usize::from(warm_up));
    let written = placement.fill(spec.dtype.size(), elements);
    let buffer = device.empty(spec.dtype, &[placement.buffer_len as i64])?;
    buffer.write_bytes(&written)?;
    let view = buffer.as_strided(
        &placement.shape,
        &placement.strides,
        placement.offset as i64,
    )?;
    Ok(Uploaded {
        view,
        buffer,
        placement,
        written,
    })
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn result(case: &Case, index: usize, status: Status, message: String) -> CaseResult {
    CaseResult {
        op: case.op.to_string(),
        dtype: case.dtype.name().to_string(),
        index,
        label: case.label.clone(),
        status,
        message,
        stats: Stats::default(),
        plugin_seconds: 0.0,
        reference_seconds: 0.0,
    }
}

/// How a case that does not fit in the device starts its message. Such a
/// case is skipped, not failed: only when its tensors need more than a
/// quarter of the device's memory, so a plugin cannot dodge ordinary cases
/// by running out of memory.
const TOO_LARGE: &str = "too large for this device";

/// The bytes of every buffer a case allocates, guards included.
fn case_bytes(case: &Case) -> u64 {
    case.tensors
        .iter()
        .filter(|t| t.alias_of.is_none())
        .map(|t| (Placement::new(&t.shape, t.layout).buffer_len * t.dtype.size()) as u64)
        .sum()
}

/// The second poison: an output element that shows the first poison's
/// bytes after the call is run again with this one, and only an element that
/// shows this one too was never written (a plugin may legitimately write a
/// NaN whose bits are the first poison's, or a zero).
const SECOND_POISON: u8 = 0x00;

/// Runs `case` (number `index` of its list) on `device`, scaling every
/// tolerance by `factor` (1 unless a waiver loosens it). A stream case that
/// passed when its timing could not show a wait that returns early runs
/// again, its busy stream kept busy longer ([`STREAM_RETRIES`]).
pub fn run_case(device: &Device, case: &Case, index: usize, factor: f64) -> CaseResult {
    let mut busy = STREAM_BUSY_SECONDS;
    let mut tries = 0;
    let mut result = loop {
        let mut missed = false;
        let result = run_case_once(device, case, index, factor, busy, &mut missed);
        if result.status != Status::Passed || !missed || tries == STREAM_RETRIES {
            break result;
        }
        tries += 1;
        busy *= 2.0;
    };
    if case.concurrent
        && result.status == Status::Passed
        && let Some(why) = concurrent_problem(device, case, factor)
    {
        result.status = Status::Failed;
        result.message = why;
    }
    if case.concurrent
        && result.status == Status::Passed
        && let Some(why) = leak_problem(device, case)
    {
        result.status = Status::Failed;
        result.message = why;
    }
    result
}

/// Calls `case` (which passed) again and again on one upload and says what
/// keeps growing ([`crate::leaks`]).
fn leak_problem(device: &Device, case: &Case) -> Option<String> {
    let uploaded: Vec<Option<Uploaded>> = case
        .tensors
        .iter()
        .map(|spec| match spec.alias_of {
            Some(_) => Ok(None),
            None => upload(device, spec, POISON_BYTE, false).map(Some),
        })
        .collect::<Result<_, HostError>>()
        .ok()?;
    let tensors = views(case, &uploaded);
    let exec = device.exec();
    crate::leaks::growth(|| (case.call)(&exec, &tensors).map_err(|e| e.to_string()))
}

/// Rounds of a [`Case::concurrent`] case; in each, every thread's call is
/// released at once.
const CONCURRENT_ROUNDS: usize = 8;

/// The threads of a [`Case::concurrent`] case: as many as the machine runs
/// at once, from 2 (a race needs two) to 4.
fn concurrent_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 4))
}

/// Calls `case` (which passed alone) from several threads at once, each
/// with buffers of its own and a stream of its own (the ABI lets two
/// threads use two streams at once, never one), for
/// [`CONCURRENT_ROUNDS`] rounds, and judges every output as a single call
/// is judged. `None` when every call was right; else what went wrong, the
/// first failure named.
fn concurrent_problem(device: &Device, case: &Case, factor: f64) -> Option<String> {
    let dense: Vec<_> = case.tensors.iter().map(TensorSpec::dense).collect();
    let expected = (case.reference)(&dense).ok()?;
    let threads = concurrent_threads();
    let barrier = std::sync::Barrier::new(threads);
    let encoded: Vec<Vec<u8>> = case
        .tensors
        .iter()
        .map(|spec| match spec.alias_of {
            Some(_) => Vec::new(),
            None => elements(spec, POISON_BYTE),
        })
        .collect();
    // One thread's calls: the problems of each, with its round, and the
    // set-ups (its stream, its buffers) that failed.
    let calls = |thread: usize| -> (Vec<String>, Vec<String>) {
        let stream = device.stream();
        let (mut problems, mut setups) = (Vec::new(), Vec::new());
        for round in 0..CONCURRENT_ROUNDS {
            let uploaded: Result<Vec<Option<Uploaded>>, HostError> = case
                .tensors
                .iter()
                .zip(&encoded)
                .map(|(spec, bytes)| match spec.alias_of {
                    Some(_) => Ok(None),
                    None => upload_elements(device, spec, bytes, false).map(Some),
                })
                .collect();
            // Every thread waits once a round, whatever failed, so that
            // none waits for ever.
            barrier.wait();
            let at = format!("thread {thread}, round {}", round + 1);
            let (stream, uploaded) = match (&stream, &uploaded) {
                (Ok(s), Ok(u)) => (s, u),
                (Err(e), _) | (_, Err(e)) => {
                    setups.push(format!("{at}: could not set up the call: {e}"));
                    continue;
                }
            };
            let tensors = views(case, uploaded);
            if let Err(e) =
                (case.call)(&stream.exec(), &tensors).and_then(|()| stream.synchronize())
            {
                problems.push(format!("{at}: the call failed: {e}"));
                continue;
            }
            let mut outputs = expected.iter();
            for (t, spec) in case.tensors.iter().enumerate() {
                if spec.role == Role::Input {
                    continue;
                }
                let want = outputs.next().expect("one expected tensor per output");
                let bytes = match holder(case, uploaded, t).read(spec) {
                    Ok((bytes, None)) => bytes,
                    Ok((_, Some((count, first)))) => {
                        problems.push(format!(
                            "{at}: the plugin wrote outside {}: {count} guard element(s) \
                             changed, the first {first}",
                            spec.name
                        ));
                        continue;
                    }
                    Err(e) => {
                        problems.push(format!("{at}: could not read {} back: {e}", spec.name));
                        continue;
                    }
                };
                if let (_, Some(w)) = judge_output(case, spec, &bytes, &want.data, factor) {
                    problems.push(format!(
                        "{at}: output {}: {}",
                        spec.name,
                        w.describe(&spec.shape, spec.dtype)
                    ));
                } else if let Some(why) = exact_bits_mismatch(spec, &bytes) {
                    problems.push(format!("{at}: output {}: {why}", spec.name));
                }
            }
        }
        (problems, setups)
    };
    let outcomes = std::thread::scope(|s| {
        // Each thread starts calling once every one has started: one the
        // system refuses would leave the others waiting at the barrier
        // for ever. Refused, the senders drop and the started ones return.
        let mut starts = Vec::with_capacity(threads);
        let mut handles = Vec::with_capacity(threads);
        for t in 0..threads {
            let (start, started) = std::sync::mpsc::channel::<()>();
            let calls = &calls;
            let h = polychip_files::threads::spawn_scoped(
                s,
                "call the op from several threads at once",
                move || match started.recv() {
                    Ok(()) => calls(t),
                    Err(_) => (Vec::new(), Vec::new()),
                },
            )
            .map_err(|e| e.to_string())?;
            starts.push(start);
            handles.push(h);
        }
        for start in starts {
            let _ = start.send(());
        }
        Ok(handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| (vec!["a calling thread panicked".to_string()], Vec::new()))
            })
            .collect::<Vec<_>>())
    });
    let (problems, setups): (Vec<String>, Vec<String>) = match outcomes {
        Ok(o) => {
            let (p, s): (Vec<_>, Vec<_>) = o.into_iter().unzip();
            (p.concat(), s.concat())
        }
        Err(refused) => return Some(refused),
    };
    concurrency_verdict(&problems, &setups, threads)
}

/// What [`concurrent_problem`] says of its calls' `problems` (wrong or
/// failed calls) and failed `setups` (a stream or buffers that could not
/// be had), from `threads` threads: `None` when there are neither. Wrong
/// calls point at shared state; set-ups that failed only at the thread's
/// stream or buffers do not (a stream thread or memory the system
/// refused), so they are said as what they are.
fn concurrency_verdict(problems: &[String], setups: &[String], threads: usize) -> Option<String> {
    let calls = threads * CONCURRENT_ROUNDS;
    let not_set_up = match setups.len() {
        0 => String::new(),
        n => format!(" ({n} more could not be set up)"),
    };
    if let Some(first) = problems.first() {
        return Some(format!(
            "right when called alone, but wrong when called from {threads} threads at once \
             (each with its own buffers and stream; the ABI makes every plugin function \
             thread-safe): {} of {calls} calls went wrong{not_set_up}; the first, {first}. \
             State shared between calls without a lock (a global scratch buffer, a cached \
             handle or workspace) does this",
            problems.len(),
        ));
    }
    let first = setups.first()?;
    Some(format!(
        "right when called alone, but {} of {calls} calls from {threads} threads at once could \
         not be set up (each needs a stream and buffers of its own: the ABI lets every thread \
         have its own stream); the first, {first}. Every call that was set up was right",
        setups.len(),
    ))
}

/// [`run_case`] once, a stream case's busy stream kept busy for `busy`
/// seconds; sets `missed` when that case's timing missed its window.
fn run_case_once(
    device: &Device,
    case: &Case,
    index: usize,
    factor: f64,
    busy: f64,
    missed: &mut bool,
) -> CaseResult {
    let dense: Vec<_> = case.tensors.iter().map(TensorSpec::dense).collect();
    let started = Instant::now();
    let expected = (case.reference)(&dense);
    let reference_seconds = started.elapsed().as_secs_f64();
    let fail = |message: String| result(case, index, Status::Failed, message);
    let poison = if case.finite_poison {
        FINITE_POISON_BYTE
    } else {
        POISON_BYTE
    };
    let first = match execute(device, case, poison, busy) {
        Ok(run) => run,
        Err(message) if message.starts_with(TOO_LARGE) => {
            return result(case, index, Status::Skipped, message);
        }
        Err(message) => return fail(message),
    };
    *missed = first.window_missed;
    let timed = |mut r: CaseResult| {
        r.plugin_seconds = first.plugin_seconds;
        r.reference_seconds = reference_seconds;
        r
    };
    let expected = match (&first.outcome, &expected) {
        (Err(HostError::OpUnimplemented { .. }), _) => {
            return result(
                case,
                index,
                Status::NotImplemented,
                "the op-table entry is NULL".into(),
            );
        }
        (Err(e), _) if e.code() == ErrorCode::Unimplemented => {
            return result(case, index, Status::NotImplemented, e.to_string());
        }
        (Err(e @ HostError::Contract { .. }), _) => {
            return timed(fail(format!("the plugin broke the ABI's contract: {e}")));
        }
        (Err(e), Ok(_)) => return timed(fail(format!("the plugin refused a valid call: {e}"))),
        (Ok(()), Err(why)) => {
            return timed(fail(format!(
                "the plugin accepted a call it must refuse ({why})"
            )));
        }
        (Err(e), Err(why)) => return timed(judge_refusal(case, index, &first, e, why)),
        (Ok(()), Ok(expected)) => expected,
    };

    let mut problems = first.problems.clone();
    // Output elements that still hold the poison: written as exactly those
    // bytes, or never written. A second run with another poison tells.
    let candidates: Vec<(usize, Vec<usize>)> = case
        .tensors
        .iter()
        .enumerate()
        .filter(|(_, spec)| spec.role == Role::Output && spec.alias_of.is_none())
        .map(|(t, spec)| (t, poisoned(&first.elements[t], spec.dtype.size(), poison)))
        .filter(|(_, at)| !at.is_empty())
        .collect();
    if !candidates.is_empty() {
        match execute(device, case, SECOND_POISON, busy) {
            Ok(second) if second.outcome.is_ok() => {
                for (t, at) in &candidates {
                    let spec = &case.tensors[*t];
                    let again = poisoned(&second.elements[*t], spec.dtype.size(), SECOND_POISON);
                    let unwritten: Vec<usize> = at
                        .iter()
                        .copied()
                        .filter(|i| again.binary_search(i).is_ok())
                        .collect();
                    if let Some(first) = unwritten.first() {
                        problems.push(format!(
                            "output {} has {} element(s) the plugin never wrote (first at element {first})",
                            spec.name,
                            unwritten.len()
                        ));
                    }
                }
            }
            Ok(second) => problems.push(format!(
                "the plugin refused the same call when run a second time: {}",
                second.outcome.expect_err("checked above")
            )),
            Err(message) => problems.push(message),
        }
    }

    let mut stats = Stats::default();
    let mut outputs = expected.iter();
    // The bias test needs independent samples: a zero-stride input repeats
    // its values (and so the output's errors), so such a case is not tested.
    let independent = !case
        .tensors
        .iter()
        .any(|t| matches!(t.layout, crate::case::Layout::Broadcast(_)));
    for (t, spec) in case.tensors.iter().enumerate() {
        if spec.role == Role::Input {
            continue;
        }
        let bytes = &first.elements[t];
        let want = outputs
            .next()
            .expect("the reference returns one tensor per output");
        if want.data.len() != bytes.len() / spec.dtype.size() {
            return timed(fail(format!(
                "internal: the reference's {} has {} elements",
                spec.name,
                want.data.len()
            )));
        }
        let (s, worst) = judge_output(case, spec, bytes, &want.data, factor);
        if let Some(w) = worst {
            problems.push(format!(
                "output {}: {} of {} element(s) outside tolerance; {}",
                spec.name,
                s.failures,
                s.elements,
                w.describe(&spec.shape, spec.dtype)
            ));
        } else if let Some(why) = (factor <= 1.0 && independent)
            .then(|| bias_failure(&s, &case.tolerance, spec.dtype))
            .flatten()
        {
            problems.push(format!("output {}: {why}", spec.name));
        }
        if let Some(why) = exact_bits_mismatch(spec, bytes) {
            problems.push(format!("output {}: {why}", spec.name));
        }
        stats.merge(&s);
    }
    let (status, message) = if problems.is_empty() {
        (Status::Passed, String::new())
    } else {
        (Status::Failed, problems.join("; "))
    };
    let mut r = timed(result(case, index, status, message));
    r.stats = stats;
    r
}

/// The sorted indices of the elements whose bytes are all `poison`.
fn poisoned(bytes: &[u8], size: usize, poison: u8) -> Vec<usize> {
    bytes
        .chunks(size)
        .enumerate()
        .filter(|(_, c)| c.iter().all(|&b| b == poison))
        .map(|(i, _)| i)
        .collect()
}

/// Judges a refusal of a call the reference also refuses: it must carry a
/// code that says the arguments are wrong (not an internal error or a
/// panic), and leave every input, in-place tensor and guard as it was.
fn judge_refusal(
    case: &Case,
    index: usize,
    run: &Run,
    e: &HostError,
    why: &RefError,
) -> CaseResult {
    let mut r = result(case, index, Status::Passed, String::new());
    r.plugin_seconds = run.plugin_seconds;
    let code = e.code();
    let mut problems = Vec::new();
    if !matches!(
        code,
        ErrorCode::InvalidArgument | ErrorCode::ShapeMismatch | ErrorCode::DTypeMismatch
    ) {
        problems.push(format!(
            "refused with code \"{}\" ({e}), but a call with invalid arguments ({why}) must be refused with POLYCHIP_ERROR_INVALID_ARGUMENT",
            code.name()
        ));
    }
    problems.extend(run.problems.iter().cloned());
    for (t, spec) in case.tensors.iter().enumerate() {
        if spec.role == Role::InOut && run.elements[t] != spec.bytes() {
            problems.push(format!("in-place tensor {} was modified", spec.name));
        }
    }
    if problems.is_empty() {
        r.message = format!("refused, as it must be: {e}");
    } else {
        r.status = Status::Failed;
        r.message = format!("refused, but not cleanly: {}", problems.join("; "));
    }
    r
}

/// The upload that holds tensor `t` of `case`: its own, or for an in-place
/// output its input's.
fn holder<'a>(case: &Case, uploaded: &'a [Option<Uploaded>], t: usize) -> &'a Uploaded {
    let at = case.tensors[t].alias_of.unwrap_or(t);
    uploaded[at]
        .as_ref()
        .expect("aliases name uploaded tensors")
}

/// The views the plugin is called with, in the case's order.
fn views(case: &Case, uploaded: &[Option<Uploaded>]) -> Vec<Tensor> {
    (0..case.tensors.len())
        .map(|t| {
            let view = &holder(case, uploaded, t).view;
            if case.bare { view.bare() } else { view.clone() }
        })
        .collect()
}

/// Compares the bytes of `spec`, an output of `case`, with its exact
/// reference `want` (see `crate::tolerance`): an in-place update may be
/// judged relative to its change.
fn judge_output(
    case: &Case,
    spec: &TensorSpec,
    bytes: &[u8],
    want: &[f64],
    factor: f64,
) -> (Stats, Option<crate::compare::Worst>) {
    let before = (spec.role == Role::InOut && case.tolerance.change_relative.contains(&spec.name))
        .then_some(&spec.values[..]);
    let got = from_bytes(spec.dtype, bytes);
    compare(spec.dtype, &got, want, before, &case.tolerance, factor)
}

/// Where an output with exact bits (i64s beyond what f64 holds, NaN
/// payloads, see [`TensorSpec::exact_bits`]) came back other than them bit
/// for bit: the count and the first, with its index. A kernel that moves
/// i64 through a double rounds such values, and one that moves floats
/// through a conversion quiets signalling NaNs, which the comparison in f64
/// cannot see.
fn exact_bits_mismatch(spec: &TensorSpec, bytes: &[u8]) -> Option<String> {
    let want = spec.exact_bits.as_ref()?;
    let got = bytes
        .chunks_exact(spec.dtype.size())
        .map(crate::case::element_bits);
    let wrong: Vec<(usize, i64, i64)> = got
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| g != *w)
        .map(|(i, (g, &w))| (i, g, w))
        .collect();
    let &(i, g, w) = wrong.first()?;
    let at = crate::compare::index_label(&spec.shape, i);
    let (n, of) = (wrong.len(), want.len());
    Some(if spec.dtype.is_float() {
        let width = 2 * spec.dtype.size() + 2;
        format!(
            "{n} of {of} element(s) differ from the exact bits; the first, {at}, is \
             {g:#0width$x} where it must be {w:#0width$x} (a NaN's payload and signalling bit \
             must survive: a copy through a floating conversion quiets a signalling NaN)"
        )
    } else {
        format!(
            "{n} of {of} element(s) differ from the exact i64 values; the first, {at}, is {g} \
             where it must be {w} (integers beyond 2^53 do not survive a trip through a double)"
        )
    })
}

/// What one call of the plugin did to the case's tensors.
struct Run {
    /// The call's result.
    outcome: polychip_host::Result<()>,
    /// Seconds in the call.
    plugin_seconds: f64,
    /// Per tensor of the case: its elements' bytes after the call, in
    /// row-major order (an in-place output's are its input's).
    elements: Vec<Vec<u8>>,
    /// Inputs that changed and guard zones that were overwritten.
    problems: Vec<String>,
    /// A stream case whose timing could not show a wait that returns early
    /// ([`Window::missed`]).
    window_missed: bool,
}

/// Writes an input's values rotated by one element into its buffer (the
/// guards as uploaded): other values, each of which the input can hold.
fn write_other_values(spec: &TensorSpec, u: &Uploaded) -> polychip_host::Result<()> {
    let bytes = u.placement.fill(spec.dtype.size(), &spec.bytes_rotated(1));
    u.buffer.write_bytes(&bytes)
}

/// The warm-up call of [`Case::warm_up`]: the inputs' values rotated by
/// one element (so every index stays valid and every value in its
/// domain), the plugin called and its result discarded, then every buffer
/// written back as uploaded (inputs, in-place tensors, poisoned outputs
/// and guards), for the call that is judged. The case's views sit one
/// element further into their buffers than any other case's: a cache
/// keyed by address would otherwise be hit, when the device hands back
/// the same memory, by the base case that ran earlier with the judged
/// values themselves, and serve them right.
fn warm_up(
    case: &Case,
    uploaded: &[Option<Uploaded>],
    exec: &polychip_host::Exec<'_>,
    tensors: &[Tensor],
) -> Result<(), String> {
    for (spec, u) in case.tensors.iter().zip(uploaded) {
        let Some(u) = u else { continue };
        if spec.role != Role::Output {
            write_other_values(spec, u)
                .map_err(|e| format!("could not write {}: {e}", spec.name))?;
        }
    }
    // Its result is not judged: only the call after it is.
    let _ = (case.call)(exec, tensors);
    for (spec, u) in case.tensors.iter().zip(uploaded) {
        if let Some(u) = u {
            u.buffer
                .write_bytes(&u.written)
                .map_err(|e| format!("could not write {} back: {e}", spec.name))?;
        }
    }
    Ok(())
}

/// How long the stream that restores a stream case's inputs is kept busy
/// first, so that a call that does not wait for it reads the other values.
const STREAM_BUSY_SECONDS: f64 = 0.005;

/// How many times a stream case that passed is run again, each time with
/// the busy stream kept busy twice as long, when this thread was held up
/// long enough that the busy stream may have finished before the call was
/// queued or before the outputs were read (a loaded machine): such a pass
/// says nothing about a wait that returns early.
const STREAM_RETRIES: usize = 3;

/// What a stream case keeps alive until its buffers have been read: the
/// streams (destroying one waits for its work) and the buffers their work
/// copies; and the timing that says whether the case could see a wait that
/// returns early.
struct StreamCase {
    /// The stream that kept the inputs busy, then (unless the case destroys
    /// it) the one the call ran on.
    streams: Vec<Stream>,
    _buffers: Vec<Tensor>,
    window: Window,
    /// Whether the call ran on the last of `streams` and returned: then an
    /// `add` queued behind it checks the floating-point environment of the
    /// stream's thread ([`crate::fpenv`]).
    probe: bool,
}

/// A stream case's timing: the busy stream's estimated work, the time this
/// thread took from queueing its first copy to queueing the call, and when
/// the wait for the call returned.
struct Window {
    busy: f64,
    queued: f64,
    awaited: Instant,
}

impl Window {
    /// Whether this thread's own delays, before the call was queued and
    /// between the wait and the end of the reads, ate half of the busy
    /// stream's work: then a call that did not wait, or a wait that
    /// returned early, might still have found the inputs restored.
    fn missed(&self) -> bool {
        self.queued + self.awaited.elapsed().as_secs_f64() >= self.busy / 2.0
    }
}

/// The call of [`Case::on_stream`]: every input's buffer is overwritten
/// with other values (rotated by one element, as a warm-up's); a stream is
/// kept busy for [`STREAM_BUSY_SECONDS`] with copies and then copies each
/// input's buffer back as uploaded, and records an event; a second stream
/// waits for the event, runs the call, and is awaited as `sync` says. The
/// outputs are then read on the default stream, which waits for neither.
fn on_stream(
    device: &Device,
    case: &Case,
    uploaded: &[Option<Uploaded>],
    tensors: &[Tensor],
    (sync, busy_seconds): (StreamSync, f64),
) -> Result<(polychip_host::Result<()>, StreamCase), String> {
    let setup = |what: &str, e: HostError| {
        format!("could not set up the call on a stream: {what} failed: {e}")
    };
    let mut buffers = Vec::new();
    let mut restores = Vec::new();
    for (spec, u) in case.tensors.iter().zip(uploaded) {
        let Some(u) = u else { continue };
        if spec.role == Role::Output {
            continue;
        }
        let saved = device
            .empty(spec.dtype, &[u.placement.buffer_len as i64])
            .and_then(|t| t.write_bytes(&u.written).map(|()| t))
            .map_err(|e| setup(&format!("saving {}", spec.name), e))?;
        write_other_values(spec, u).map_err(|e| setup(&format!("overwriting {}", spec.name), e))?;
        restores.push((saved.clone(), u.buffer.clone(), spec.name));
        buffers.push(saved);
    }
    let restore = device.stream().map_err(|e| setup("stream_create", e))?;
    let (busy, started, busy_buffers) = keep_busy(device, &restore, busy_seconds)
        .map_err(|e| setup("copy (keeping a stream busy)", e))?;
    buffers.extend(busy_buffers);
    for (saved, buffer, name) in &restores {
        restore
            .exec()
            .copy(saved, buffer)
            .map_err(|e| setup(&format!("copy of {name} on a stream"), e))?;
    }
    let ready = restore.record().map_err(|e| setup("event_record", e))?;
    let run = device.stream().map_err(|e| setup("stream_create", e))?;
    run.wait(&ready)
        .map_err(|e| setup("stream_wait_event", e))?;
    let called = (case.call)(&run.exec(), tensors);
    let queued = started.elapsed().as_secs_f64();
    let mut streams = vec![restore];
    let awaited = match sync {
        StreamSync::Event => {
            let outcome = run.record().and_then(|done| done.synchronize());
            streams.push(run);
            outcome
        }
        StreamSync::Stream => {
            let outcome = run.synchronize();
            streams.push(run);
            outcome
        }
        StreamSync::Destroy => {
            drop(run);
            Ok(())
        }
    };
    // The call's own refusal first; else an error its work reported when
    // awaited.
    let outcome = called.and(awaited);
    // After a call that ran, the stream it ran on is probed for its
    // thread's floating-point environment once the outputs have been read
    // (a probe before would wait for a call whose wait returned early).
    let probe = outcome.is_ok() && matches!(sync, StreamSync::Event | StreamSync::Stream);
    Ok((
        outcome,
        StreamCase {
            streams,
            _buffers: buffers,
            probe,
            window: Window {
                busy,
                queued,
                awaited: Instant::now(),
            },
        },
    ))
}

/// Queues copies on `stream` that take about `seconds` (the quickest of
/// three timed on the default stream first, so that one this thread was
/// held up in does not cut the count); returns the estimated time they
/// take, when the first was queued, and their buffers, which must outlive
/// the copies.
fn keep_busy(
    device: &Device,
    stream: &Stream,
    seconds: f64,
) -> polychip_host::Result<(f64, Instant, Vec<Tensor>)> {
    // Filled on the device: a host-to-device copy can be slow on a device
    // whose memory is not the host's.
    const ELEMENTS: i64 = 1 << 18;
    let from = device.empty(DType::F32, &[ELEMENTS])?;
    device.exec().fill(&from, 0.0)?;
    let to = device.empty(DType::F32, &[ELEMENTS])?;
    let mut once = f64::INFINITY;
    for _ in 0..3 {
        let started = Instant::now();
        device.exec().copy(&from, &to)?;
        once = once.min(started.elapsed().as_secs_f64().max(1e-6));
    }
    let copies = (seconds / once).ceil().clamp(1.0, 4096.0) as usize;
    let started = Instant::now();
    for _ in 0..copies {
        stream.exec().copy(&from, &to)?;
    }
    Ok((copies as f64 * once, started, vec![from, to]))
}

/// Uploads the case's tensors (outputs poisoned with `poison`), calls the
/// plugin, and reads every buffer back whole. `Err` when the suite itself
/// could not upload or read a tensor.
fn execute(device: &Device, case: &Case, poison: u8, busy: f64) -> Result<Run, String> {
    // What an earlier case's calls left (already reported there).
    let _ = fpenv::take_change();
    let mut uploaded: Vec<Option<Uploaded>> = Vec::with_capacity(case.tensors.len());
    for spec in &case.tensors {
        if spec.alias_of.is_some() {
            uploaded.push(None);
            continue;
        }
        let u = upload(device, spec, poison, case.warm_up).map_err(|e| {
            let needed = case_bytes(case);
            let memory = device.props().memory_bytes;
            if e.code() == ErrorCode::OutOfMemory && needed.saturating_mul(4) > memory {
                format!(
                    "{TOO_LARGE}: its tensors take {} MiB, more than a quarter of the device's {} MiB, and uploading {} ran out of memory ({e})",
                    needed >> 20,
                    memory >> 20,
                    spec.name
                )
            } else {
                format!("could not upload {}: {e}", spec.name)
            }
        })?;
        uploaded.push(Some(u));
    }
    let tensors = views(case, &uploaded);
    let exec = device.exec();
    if case.warm_up {
        warm_up(case, &uploaded, &exec, &tensors)?;
    }
    let started = Instant::now();
    // A stream case's streams stay alive until its buffers are read:
    // destroying one waits for its work, which would hide a wait that
    // returned early.
    let (outcome, stream_case) = match case.on_stream {
        None => ((case.call)(&exec, &tensors), None),
        Some(sync) => {
            let (outcome, streams) = on_stream(device, case, &uploaded, &tensors, (sync, busy))?;
            (outcome, Some(streams))
        }
    };
    let plugin_seconds = started.elapsed().as_secs_f64();

    let mut elements = vec![Vec::new(); case.tensors.len()];
    let mut problems = Vec::new();
    let aliased: Vec<usize> = case.tensors.iter().filter_map(|s| s.alias_of).collect();
    for (t, spec) in case.tensors.iter().enumerate() {
        let Some(u) = &uploaded[t] else { continue };
        let (bytes, damage) = u
            .read(spec)
            .map_err(|e| format!("could not read {} back: {e}", spec.name))?;
        let what = match spec.role {
            Role::Input if aliased.contains(&t) => "in-place output",
            Role::Input => "input",
            Role::Output => "output",
            Role::InOut => "in-place tensor",
        };
        // On a stream the suite restores inputs with the plugin's own copy
        // of their dtype: a broken copy shows here too.
        let restored = if case.on_stream.is_some() && spec.role == Role::Input {
            format!(
                " (the suite restored it on a stream with the plugin's {} copy: if copy fails \
                 its own cases, fix that first)",
                spec.dtype
            )
        } else {
            String::new()
        };
        if let Some((count, first)) = damage {
            problems.push(format!(
                "the plugin wrote outside {what} {}: {count} guard element(s) changed, the first {first}{restored}",
                spec.name
            ));
        }
        if spec.role == Role::Input && !aliased.contains(&t) {
            let written = spec.bytes();
            if bytes != written {
                let size = spec.dtype.size();
                let at = bytes
                    .chunks(size)
                    .zip(written.chunks(size))
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                problems.push(format!(
                    "input {} was modified (first at element {at}){restored}",
                    spec.name
                ));
            }
        }
        elements[t] = bytes;
    }
    // The host puts back a floating-point environment a call changed on
    // the calling thread (ABI rule 12) and records it; the case fails.
    if let Some(change) = fpenv::take_change() {
        problems.push(change.to_string());
    }
    // Timed before the probe below, whose calls are not the case's.
    let window_missed = stream_case.as_ref().is_some_and(|s| s.window.missed());
    if let Some(what) = stream_case
        .as_ref()
        .filter(|s| s.probe)
        .and_then(|s| s.streams.last())
        .and_then(|run| crate::fpenv::left_changed(device, run))
    {
        problems.push(what);
    }
    for (t, spec) in case.tensors.iter().enumerate() {
        if let Some(source) = spec.alias_of {
            elements[t] = elements[source].clone();
        }
    }
    Ok(Run {
        outcome,
        plugin_seconds,
        elements,
        problems,
        window_missed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_concurrent_call_that_could_not_be_set_up_is_not_blamed_on_shared_state() {
        let (wrong, setup) = (
            vec!["thread 1, round 2: output out: 3 elements differ".to_string()],
            vec!["thread 0, round 1: could not set up the call: stream_create failed".to_string()],
        );
        assert_eq!(concurrency_verdict(&[], &[], 2), None);
        // Wrong results: shared state, the set-ups that failed counted.
        let said = concurrency_verdict(&wrong, &setup, 2).unwrap();
        assert!(
            said.contains("1 of 16 calls went wrong (1 more could not be set up)")
                && said.contains("the first, thread 1, round 2")
                && said.contains("State shared"),
            "{said}"
        );
        // Only set-ups failed (a stream thread the system refused): said
        // as that, not as a race.
        let said = concurrency_verdict(&[], &setup, 2).unwrap();
        assert!(
            said.contains("1 of 16 calls from 2 threads at once could not be set up")
                && said.contains("stream_create failed")
                && said.contains("Every call that was set up was right")
                && !said.contains("State shared"),
            "{said}"
        );
    }
}

//! Running one case on one device: upload the inputs in the case's layout,
//! poison the outputs, call the plugin, read everything back, check that the
//! inputs are unchanged and that every output element was written, compute
//! the reference, and compare.

use std::time::Instant;

use polychip_host::{Device, ErrorCode, HostError, Tensor};
use serde::{Deserialize, Serialize};

use crate::case::{Case, Layout, Role, TensorSpec};
use crate::compare::{Stats, bias_failure, compare};
use crate::reference::{Dense, RefError};
use crate::values::{POISON_BYTE, from_bytes, round_to, to_bytes};

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
    /// Skipped by the vendor's waiver file.
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

/// Uploads one tensor in its layout; outputs are filled with poison.
fn upload(
    device: &Device,
    spec: &TensorSpec,
    poison: u8,
) -> polychip_host::Result<(Tensor, Vec<u8>)> {
    let shape: Vec<i64> = spec.shape.iter().map(|&d| d as i64).collect();
    let n = shape.len();
    let view = match spec.layout {
        Layout::Transposed if n >= 2 => {
            let mut stored = shape.clone();
            stored.swap(n - 2, n - 1);
            device.empty(spec.dtype, &stored)?.transpose(n - 2, n - 1)?
        }
        Layout::Strided if n >= 1 => {
            let mut stored = shape.clone();
            stored[n - 1] = 2 * stored[n - 1].max(1);
            let base = device.zeros(spec.dtype, &stored)?;
            let mut strides = base.strides().to_vec();
            strides[n - 1] = 2;
            base.as_strided(&shape, &strides, 0)?
        }
        _ => device.empty(spec.dtype, &shape)?,
    };
    let bytes = match spec.role {
        Role::Output => vec![poison; view.numel() * spec.dtype.size()],
        Role::Input | Role::InOut => to_bytes(spec.dtype, &spec.values),
    };
    view.write_bytes(&bytes)?;
    Ok((view, bytes))
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

/// Runs `case` (number `index` of its list) on `device`, scaling every
/// tolerance by `factor` (1 unless a waiver loosens it).
pub fn run_case(device: &Device, case: &Case, index: usize, factor: f64) -> CaseResult {
    // The reference depends only on the case, so it runs once for both passes.
    let dense: Vec<_> = case.tensors.iter().map(TensorSpec::dense).collect();
    let started = Instant::now();
    let expected = (case.reference)(&dense);
    let reference = Reference {
        expected: &expected,
        seconds: started.elapsed().as_secs_f64(),
    };
    let first = run_with_poison(device, case, index, factor, POISON_BYTE, &reference);
    // The usual poison is NaN, so an output element whose expected value is
    // NaN cannot show it was never written: run once more with zeros.
    let expects_nan = expected
        .as_ref()
        .is_ok_and(|outs| outs.iter().any(|o| o.data.iter().any(|v| v.is_nan())));
    if first.status == Status::Passed && expects_nan {
        let second = run_with_poison(device, case, index, factor, 0, &reference);
        if second.status == Status::Failed {
            return second;
        }
    }
    first
}

/// The reference's answer for a case, computed once, and how long it took.
struct Reference<'a> {
    expected: &'a Result<Vec<Dense>, RefError>,
    seconds: f64,
}

/// Reads back every tensor that is not an output and names those that
/// differ from what was written.
fn modified_inputs(case: &Case, uploaded: &[(Tensor, Vec<u8>)], roles: &[Role]) -> Vec<String> {
    let mut problems = Vec::new();
    for (spec, (tensor, written)) in case.tensors.iter().zip(uploaded) {
        if !roles.contains(&spec.role) {
            continue;
        }
        match tensor.read_bytes() {
            Ok(bytes) if bytes == *written => {}
            Ok(bytes) => {
                let at = bytes
                    .chunks(spec.dtype.size())
                    .zip(written.chunks(spec.dtype.size()))
                    .position(|(a, b)| a != b);
                let what = if spec.role == Role::Input {
                    "input"
                } else {
                    "in-place tensor"
                };
                problems.push(format!(
                    "{what} {} was modified (first at element {})",
                    spec.name,
                    at.unwrap_or(0)
                ));
            }
            Err(e) => problems.push(format!("could not read {} back: {e}", spec.name)),
        }
    }
    problems
}

fn run_with_poison(
    device: &Device,
    case: &Case,
    index: usize,
    factor: f64,
    poison: u8,
    reference: &Reference<'_>,
) -> CaseResult {
    let fail = |message: String| result(case, index, Status::Failed, message);
    let mut uploaded = Vec::new();
    for spec in &case.tensors {
        match upload(device, spec, poison) {
            Ok(t) => uploaded.push(t),
            Err(e) => return fail(format!("could not upload {}: {e}", spec.name)),
        }
    }
    let tensors: Vec<Tensor> = uploaded.iter().map(|(t, _)| t.clone()).collect();
    let exec = device.exec();
    let started = Instant::now();
    let outcome = (case.call)(&exec, &tensors);
    let plugin_seconds = started.elapsed().as_secs_f64();

    let (expected, reference_seconds) = (reference.expected, reference.seconds);
    let timed = |mut r: CaseResult| {
        r.plugin_seconds = plugin_seconds;
        r.reference_seconds = reference_seconds;
        r
    };

    match (&outcome, expected) {
        (Err(HostError::OpUnimplemented { .. }), _) => {
            return result(
                case,
                index,
                Status::NotImplemented,
                "the op-table entry is NULL".into(),
            );
        }
        (Err(e), Ok(_)) if e.code() == ErrorCode::Unimplemented => {
            return result(case, index, Status::NotImplemented, e.to_string());
        }
        (Err(e), Ok(_)) => return timed(fail(format!("the plugin refused a valid call: {e}"))),
        (Ok(()), Err(why)) => {
            return timed(fail(format!(
                "the plugin accepted a call it must refuse ({why})"
            )));
        }
        (Err(e), Err(_)) if e.code() == ErrorCode::Unimplemented => {
            return result(case, index, Status::NotImplemented, e.to_string());
        }
        (Err(_), Err(_)) => {
            // A refusal must leave every tensor as it was.
            let problems = modified_inputs(case, &uploaded, &[Role::Input, Role::InOut]);
            return timed(if problems.is_empty() {
                result(case, index, Status::Passed, "refused, as it must be".into())
            } else {
                fail(format!("refused, but not cleanly: {}", problems.join("; ")))
            });
        }
        (Ok(()), Ok(_)) => {}
    }
    let expected = expected.as_ref().expect("checked above");

    let mut stats = Stats::default();
    let mut problems = modified_inputs(case, &uploaded, &[Role::Input]);
    let mut outputs = expected.iter();
    for (spec, (tensor, _)) in case.tensors.iter().zip(&uploaded) {
        if spec.role == Role::Input {
            continue;
        }
        let bytes = match tensor.read_bytes() {
            Ok(b) => b,
            Err(e) => return timed(fail(format!("could not read {} back: {e}", spec.name))),
        };
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
        if spec.role == Role::Output {
            // Only elements whose expected value differs from the poison's
            // (NaN in floating dtypes, -1 or 255 or true in the others) can
            // show that they were never written.
            let poison_value = from_bytes(spec.dtype, &vec![poison; spec.dtype.size()])[0];
            let looks_poisoned =
                |w: f64| w == poison_value || (w.is_nan() && poison_value.is_nan());
            let unwritten: Vec<usize> = bytes
                .chunks(spec.dtype.size())
                .enumerate()
                .filter(|(i, c)| {
                    c.iter().all(|&b| b == poison)
                        && !looks_poisoned(round_to(spec.dtype, want.data[*i]))
                })
                .map(|(i, _)| i)
                .collect();
            if let Some(first) = unwritten.first() {
                problems.push(format!(
                    "output {} has {} element(s) the plugin never wrote (first at element {first})",
                    spec.name,
                    unwritten.len()
                ));
            }
        }
        let got = from_bytes(spec.dtype, &bytes);
        // Judged against the exact reference (see `crate::tolerance`); an
        // in-place update may be judged relative to its change.
        let before = (spec.role == Role::InOut
            && case.tolerance.change_relative.contains(&spec.name))
        .then_some(&spec.values[..]);
        let (s, worst) = compare(
            spec.dtype,
            &got,
            &want.data,
            before,
            &case.tolerance,
            factor,
        );
        if let Some(w) = worst {
            problems.push(format!(
                "output {}: {} of {} element(s) outside tolerance; {}",
                spec.name,
                s.failures,
                s.elements,
                w.describe(&spec.shape, spec.dtype)
            ));
        } else if let Some(why) = (factor <= 1.0)
            .then(|| bias_failure(&s, &case.tolerance, spec.dtype))
            .flatten()
        {
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

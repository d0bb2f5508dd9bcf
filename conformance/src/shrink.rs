//! Shrinking a failing case, in two steps, so that the report ends at a
//! small case:
//!
//! 1. a case of a sized family (the realistic tier) is rebuilt with each of
//!    its size parameters halved as long as it still fails, so an
//!    accumulation or tile bug ends at the smallest size that shows it;
//! 2. inputs are replaced, chunk by chunk, with the plain value 1 as long as
//!    the case still fails, so that the report can name the few input values
//!    that matter (delta debugging over values); only for cases small enough
//!    for that to be quick.
//!
//! Runs in the process that ran the case, so it never shrinks a crash.

use polychip_host::Device;

use crate::case::{Case, Layout, Role};
use crate::runner::{Status, run_case};
use crate::values::round_to;

/// At most this many extra runs per shrink of values.
const BUDGET: usize = 300;
/// At most this many extra runs per shrink of sizes.
const SIZE_BUDGET: usize = 48;
/// Values are shrunk only in cases with at most this many input elements.
const VALUE_LIMIT: usize = 20_000;

/// Shrinks `case` (which failed) and describes the smallest failing case
/// found, or `None` when nothing could be simplified.
pub fn shrink(device: &Device, case: &Case, index: usize, factor: f64) -> Option<String> {
    let (case, size) = match shrink_size(device, case, index, factor) {
        Some((smaller, what)) => (smaller, Some(what)),
        None => (case.clone(), None),
    };
    let inputs: usize = case
        .tensors
        .iter()
        .filter(|t| t.role != Role::Output)
        .map(|t| t.values.len())
        .sum();
    let values = if inputs <= VALUE_LIMIT {
        shrink_values(device, &case, index, factor)
    } else {
        None
    };
    match (size, values) {
        (None, None) => None,
        (Some(size), None) => Some(format!(
            "shrunk: still fails at {size}: {}",
            run_case(device, &case, index, factor).message
        )),
        (None, Some(values)) => Some(format!("shrunk: {values}")),
        (Some(size), Some(values)) => Some(format!("shrunk: at {size}, {values}")),
    }
}

/// Halves the size parameters of a sized case while it still fails; the
/// smallest failing case and its description, or `None` when it is not
/// sized or no smaller size fails.
fn shrink_size(device: &Device, case: &Case, index: usize, factor: f64) -> Option<(Case, String)> {
    let resize = case.resize.clone()?;
    let mut params = resize.params.clone();
    let mut best = None;
    let mut runs = 0;
    let mut progress = true;
    while progress && runs < SIZE_BUDGET {
        progress = false;
        for i in 0..params.len() {
            if params[i] <= 1 || runs >= SIZE_BUDGET {
                continue;
            }
            let mut trial_params = params.clone();
            trial_params[i] = params[i].div_ceil(2);
            let trial = crate::cases::realistic::sized(resize.build, case.dtype, &trial_params);
            runs += 1;
            if run_case(device, &trial, index, factor).status == Status::Failed {
                params = trial_params;
                best = Some(trial);
                progress = true;
            }
        }
    }
    best.map(|c| {
        let what = format!("the smaller size {} (parameters {params:?})", c.label);
        (c, what)
    })
}

/// Replaces input values with 1 while the case still fails, and names the
/// values left, or `None` when none could be replaced.
fn shrink_values(device: &Device, case: &Case, index: usize, factor: f64) -> Option<String> {
    let mut current = case.clone();
    let mut runs = 0;
    let mut changed = false;
    for t in 0..current.tensors.len() {
        let spec = &current.tensors[t];
        // A broadcast tensor's values must stay equal along its zero stride.
        if spec.role == Role::Output
            || !spec.dtype.is_float()
            || matches!(spec.layout, Layout::Broadcast(_))
        {
            continue;
        }
        let plain = round_to(spec.dtype, 1.0);
        let len = spec.values.len();
        let mut chunk = len.div_ceil(2).max(1);
        loop {
            let mut start = 0;
            while start < len && runs < BUDGET {
                let end = (start + chunk).min(len);
                if current.tensors[t].values[start..end]
                    .iter()
                    .any(|&v| v != plain)
                {
                    let mut trial = current.clone();
                    trial.tensors[t].values[start..end].fill(plain);
                    runs += 1;
                    if run_case(device, &trial, index, factor).status == Status::Failed {
                        current = trial;
                        changed = true;
                    }
                }
                start = end;
            }
            if chunk == 1 || runs >= BUDGET {
                break;
            }
            chunk = chunk.div_ceil(2);
        }
    }
    if !changed {
        return None;
    }
    let mut kept = Vec::new();
    let mut total = 0;
    // Inputs the shrinking leaves as they are (integers, broadcast views).
    let mut as_given = Vec::new();
    for spec in &current.tensors {
        if spec.role == Role::Output {
            continue;
        }
        // A broadcast tensor's values must stay equal along its zero stride.
        if !spec.dtype.is_float() || matches!(spec.layout, Layout::Broadcast(_)) {
            as_given.push(spec.name);
            continue;
        }
        let plain = round_to(spec.dtype, 1.0);
        for (i, &v) in spec.values.iter().enumerate() {
            if v != plain {
                total += 1;
                if kept.len() < 8 {
                    kept.push(format!("{}[{i}] = {v}", spec.name));
                }
            }
        }
    }
    let why = run_case(device, &current, index, factor).message;
    let mut values = if total == 0 {
        "every input value set to 1".to_string()
    } else {
        format!(
            "only {total} input value(s) other than 1: {}{}",
            kept.join(", "),
            if total > kept.len() { ", ..." } else { "" }
        )
    };
    if !as_given.is_empty() {
        values.push_str(&format!(" ({} as given)", as_given.join(", ")));
    }
    Some(format!("still fails with {values}: {why}"))
}

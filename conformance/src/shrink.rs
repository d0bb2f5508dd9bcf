//! Shrinking a failing case: inputs are replaced, chunk by chunk, with the
//! plain value 1 as long as the case still fails, so that the report can
//! name the few input values that matter (delta debugging over values).
//! Runs in the process that ran the case, so it never shrinks a crash.

use polychip_host::Device;

use crate::case::{Case, Layout, Role};
use crate::runner::{Status, run_case};
use crate::values::round_to;

/// At most this many extra runs per shrink.
const BUDGET: usize = 300;

/// Shrinks `case` (which failed) and describes the smallest failing input
/// found, or `None` when nothing could be simplified.
pub fn shrink(device: &Device, case: &Case, index: usize, factor: f64) -> Option<String> {
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
    for spec in &current.tensors {
        // A broadcast tensor's values must stay equal along its zero stride.
        if spec.role == Role::Output
            || !spec.dtype.is_float()
            || matches!(spec.layout, Layout::Broadcast(_))
        {
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
    let values = if total == 0 {
        "every input value set to 1".to_string()
    } else {
        format!(
            "only {total} input value(s) other than 1: {}{}",
            kept.join(", "),
            if total > kept.len() { ", ..." } else { "" }
        )
    };
    Some(format!("shrunk: still fails with {values}: {why}"))
}

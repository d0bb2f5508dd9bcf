//! Cases derived from an operator's own cases, the same way for every
//! operator: each layout the ABI allows on each tensor, and each in-place
//! call its spec permits.
//!
//! From up to two base cases per (operator, dtype) (plain compact cases the
//! reference accepts: the first and the largest), the suite derives
//!
//! - for every input, a zero stride on its first and on its last dimension
//!   (a broadcast input: the values are made equal along that dimension, so
//!   the reference sees what the plugin reads) and a negative stride on each,
//!   and, with two dimensions or more, a row slice of wider rows (the last
//!   dimension contiguous, padding between rows: a slice of a fused
//!   projection), and gaps between its elements (stride 2: a view whose
//!   dimensions collapse into one stride that is not 1);
//! - for every written tensor, a negative stride on its first and on its
//!   last dimension, gaps between its elements (stride 2) and gaps between
//!   its rows (a row slice);
//! - one case with every tensor non-compact at once;
//! - for every output that the operator's spec lets be exactly one of its
//!   inputs (`alias` in `spec/ops.toml`), the call run in place;
//! - the call run after a warm-up call on the same buffers with other
//!   input values (`Case::warm_up`), so that a result kept from an earlier
//!   call (a cache keyed by address) shows;
//! - from the first base only, the call run on a stream of its own behind
//!   another stream's work (`Case::on_stream`), awaited by one of the three
//!   ways a caller waits for a stream (which one depends on the operator
//!   and dtype, so that every way is taken across the suite);
//! - from the first base, and from every eligible case with an empty
//!   tensor, the call given the sparest descriptors the ABI allows
//!   (`Case::bare`: NULL strides for compact tensors, NULL data for empty
//!   ones, as DLPack producers pass them);
//! - from the first base, the call made with every output holding a large
//!   finite value before it rather than the NaN poison
//!   (`Case::finite_poison`), so that a kernel reading an output before
//!   writing it (`fmax` into an output it never initialised) shows;
//! - from the largest base, the call made from several threads at once,
//!   each with its own buffers and stream (`Case::concurrent`): state the
//!   plugin shares between calls without a lock shows.
//!
//! Every tensor also sits at a non-zero offset inside a guarded buffer
//! (`crate::placement`), so offsets and writes outside an output are
//! checked on every case, derived or not.

use polychip_host::Op;

use crate::case::{Case, Layout, Role, StreamSync, TensorSpec};

/// Base cases are at most this large (elements over all tensors), so the
/// derived cases stay quick.
const MAX_BASE_ELEMENTS: usize = 20_000;

/// (operator, input) pairs whose rows are not broadcast along their last
/// dimension: a constant row makes the exact result a cancellation to zero
/// (layer_norm's variance is 0; softmax_backward's `y * (g - sum(y * g))`
/// is 0 when `g` is constant), where a correct kernel's rounding is
/// amplified without bound, so no tolerance could tell a bug from it.
const CONSTANT_ROWS_CANCEL: &[(&str, &str)] = &[
    ("layer_norm", "input"),
    ("layer_norm_backward", "input"),
    ("softmax_backward", "grad_out"),
];

/// The cases derived from `base` (the operator's own cases in one dtype).
pub fn derive(base: &[Case]) -> Vec<Case> {
    let mut out = Vec::new();
    let eligible = eligible_bases(base);
    let bases = pick_bases(&eligible);
    // Every other eligible case in place too where another operand is
    // broadcast against the output (a scalar or a row): a kernel's
    // broadcast fast path that re-reads the full operand after writing it.
    for b in &eligible {
        if !bases.iter().any(|p| std::ptr::eq(*p, *b)) && broadcasts(b) {
            out.extend(in_place(b));
        }
    }
    for b in &bases {
        out.extend(layouts(b));
        out.extend(in_place(b));
        out.push(variant(
            b,
            "after a call with other values in the same buffers".into(),
            |_| {},
        ));
        out.last_mut().expect("just pushed").warm_up = true;
    }
    if let Some(b) = bases.first() {
        let sync = stream_sync_for(b);
        out.push(variant(
            b,
            format!(
                "on a stream, behind another stream's work through an event, then {}",
                sync.function()
            ),
            |_| {},
        ));
        out.last_mut().expect("just pushed").on_stream = Some(sync);
    }
    // The first base, and every eligible case with an empty tensor, given
    // the sparest descriptors the ABI allows (DLPack's): NULL strides for
    // compact tensors, NULL data for empty ones (mutation round 9: a C
    // plugin that dereferenced NULL strides, and one that refused an
    // empty tensor's NULL data, passed every case).
    for b in &eligible {
        let first = bases.first().is_some_and(|f| std::ptr::eq(*f, *b));
        let empty = b.tensors.iter().any(|t| super::numel(&t.shape) == 0);
        if first || empty {
            out.push(variant(
                b,
                "NULL strides for compact tensors, NULL data for empty ones".into(),
                |_| {},
            ));
            out.last_mut().expect("just pushed").bare = true;
        }
    }
    // The first base with its outputs holding a large finite value rather
    // than the NaN poison (mutation round 10: a max kernel that took `fmax`
    // of an output it never initialised and each lane's maximum ignored the
    // NaN poison and passed every case).
    if let Some(b) = bases.first() {
        out.push(variant(
            b,
            "outputs holding a large finite value before the call".into(),
            |_| {},
        ));
        out.last_mut().expect("just pushed").finite_poison = true;
    }
    // The largest base from several threads at once: the longest calls,
    // so the likeliest to overlap.
    if let Some(b) = bases.last() {
        out.push(variant(
            b,
            "called from several threads at once, each with its own buffers and stream".into(),
            |_| {},
        ));
        out.last_mut().expect("just pushed").concurrent = true;
    }
    out
}

/// Which way the stream case of `b`'s (operator, dtype) is awaited: drawn
/// from the pair's own generator, so that each way is taken by about a
/// third of the units.
fn stream_sync_for(b: &Case) -> StreamSync {
    StreamSync::ALL[super::Rng::for_case(b.op, b.dtype).below(StreamSync::ALL.len())]
}

fn total_elements(c: &Case) -> usize {
    c.tensors.iter().map(|t| t.values.len()).sum()
}

/// Whether an input of `c` has fewer elements than one of its outputs.
fn broadcasts(c: &Case) -> bool {
    let largest_output = c
        .tensors
        .iter()
        .filter(|t| t.role == Role::Output)
        .map(|t| t.values.len().max(super::numel(&t.shape)))
        .max()
        .unwrap_or(0);
    c.tensors
        .iter()
        .any(|t| t.role == Role::Input && super::numel(&t.shape) < largest_output)
}

/// The first and the largest of the eligible cases (once if they are the
/// same).
fn pick_bases<'a>(eligible: &[&'a Case]) -> Vec<&'a Case> {
    let mut picked: Vec<&Case> = eligible.first().copied().into_iter().collect();
    if let Some(largest) = eligible.iter().max_by_key(|c| total_elements(c)) {
        if !std::ptr::eq(*largest, picked[0]) {
            picked.push(largest);
        }
    }
    picked
}

/// The compact cases the reference accepts, small enough to derive from.
fn eligible_bases(cases: &[Case]) -> Vec<&Case> {
    cases
        .iter()
        .filter(|c| {
            c.tensors
                .iter()
                .all(|t| t.layout == Layout::Contiguous && t.alias_of.is_none())
                && total_elements(c) <= MAX_BASE_ELEMENTS
                && c.tensors.iter().any(|t| t.values.len() > 1)
        })
        .filter(|c| {
            let dense: Vec<_> = c.tensors.iter().map(TensorSpec::dense).collect();
            (c.reference)(&dense).is_ok()
        })
        .collect()
}

/// `values` (row-major, of `shape`) made equal along dimension `d`: every
/// element takes the value of its slice-0 counterpart.
pub(super) fn constant_along(values: &[f64], shape: &[usize], d: usize) -> Vec<f64> {
    let inner: usize = shape[d + 1..].iter().product();
    let block = inner * shape[d];
    (0..values.len())
        .map(|i| values[(i / block) * block + i % inner])
        .collect()
}

fn variant(b: &Case, what: String, edit: impl FnOnce(&mut Vec<TensorSpec>)) -> Case {
    let mut c = b.clone();
    c.label = format!("{}; {what}", b.label);
    edit(&mut c.tensors);
    c
}

/// The first and last dimension of a shape, each once, where the extent
/// is more than 1.
fn ends(shape: &[usize]) -> Vec<usize> {
    let mut dims = vec![0, shape.len().saturating_sub(1)];
    dims.dedup();
    dims.retain(|&d| d < shape.len() && shape[d] > 1);
    dims
}

fn layouts(b: &Case) -> Vec<Case> {
    let mut out = Vec::new();
    for (t, spec) in b.tensors.iter().enumerate() {
        let name = spec.name;
        match spec.role {
            Role::Input => {
                for d in ends(&spec.shape) {
                    let cancels =
                        d + 1 == spec.shape.len() && CONSTANT_ROWS_CANCEL.contains(&(b.op, name));
                    if !cancels {
                        out.push(variant(
                            b,
                            format!("{name} broadcast along dim {d} (stride 0)"),
                            |ts| {
                                ts[t].values = constant_along(&ts[t].values, &ts[t].shape, d);
                                ts[t].layout = Layout::Broadcast(d);
                                // New values: the exact bits (and an
                                // output's expected ones) no longer hold.
                                ts.iter_mut().for_each(|s| s.exact_bits = None);
                            },
                        ));
                    }
                    out.push(variant(
                        b,
                        format!("{name} reversed along dim {d} (negative stride)"),
                        |ts| ts[t].layout = Layout::Reversed(d),
                    ));
                }
            }
            Role::Output | Role::InOut => {
                for d in ends(&spec.shape) {
                    out.push(variant(
                        b,
                        format!("{name} reversed along dim {d} (negative stride)"),
                        |ts| ts[t].layout = Layout::Reversed(d),
                    ));
                }
            }
        }
        // Gaps (an input needs an extent over 1 for them to be read), then
        // a row slice, for inputs and outputs alike.
        let gaps = match spec.role {
            Role::Input => spec.shape.iter().any(|&e| e > 1),
            Role::Output | Role::InOut => !spec.shape.is_empty(),
        };
        if gaps {
            out.push(variant(b, format!("{name} with gaps (stride 2)"), |ts| {
                ts[t].layout = Layout::Strided
            }));
        }
        if spec.shape.len() >= 2 {
            out.push(variant(
                b,
                format!("{name} a row slice of wider rows"),
                |ts| ts[t].layout = Layout::RowSlice,
            ));
        }
    }
    out.push(variant(b, "every tensor non-compact".into(), |ts| {
        for spec in ts.iter_mut() {
            spec.layout = match (spec.role, spec.shape.len()) {
                (_, 0) => Layout::Contiguous,
                (Role::Input, 1) => Layout::Reversed(0),
                (Role::Input, _) => Layout::Transposed,
                (_, 1) => Layout::Strided,
                _ => Layout::RowSlice,
            };
        }
    }));
    out
}

/// One case per (output, input) pair the operator's spec lets alias.
fn in_place(b: &Case) -> Vec<Case> {
    let Some(op) = Op::from_name(b.op) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for field in op.info().fields {
        let Some(o) = b
            .tensors
            .iter()
            .position(|t| t.name == field.name && t.role == Role::Output)
        else {
            continue;
        };
        for &alias in field.alias {
            let Some(i) = b.tensors.iter().position(|t| t.name == alias) else {
                continue;
            };
            let (output, input) = (&b.tensors[o], &b.tensors[i]);
            if input.role != Role::Input
                || input.dtype != output.dtype
                || input.shape != output.shape
            {
                continue;
            }
            out.push(variant(
                b,
                format!("in place ({} is {})", output.name, input.name),
                |ts| {
                    ts[o].alias_of = Some(i);
                    ts[o].layout = ts[i].layout;
                },
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_along_copies_slice_zero() {
        let v: Vec<f64> = (0..6).map(f64::from).collect();
        assert_eq!(constant_along(&v, &[2, 3], 0), vec![0., 1., 2., 0., 1., 2.]);
        assert_eq!(constant_along(&v, &[2, 3], 1), vec![0., 0., 0., 3., 3., 3.]);
    }
}

//! Layout bugs (how a kernel sees an operand's strides) and writes outside
//! the output, as hooks around the correct kernel call of
//! [`crate::full::launch`].

use ferrite_kernels::View;
use polychip_plugin_sdk::contiguous_strides;

use super::{Bug, elems, is};

/// Before the kernel: rewrites the strides the kernel sees for operand
/// `name` of `op` (`shape` is the operand's shape).
pub fn strides(op: &str, name: &str, shape: &[i64], strides: &mut Vec<i64>) {
    let compact = || contiguous_strides(shape);
    match (op, name) {
        ("div", "b") if is(Bug::DivZeroStrideAsCompact) && strides.contains(&0) => {
            *strides = compact();
        }
        ("tanh", "input") if is(Bug::TanhNegativeStrideAbs) => {
            for s in strides.iter_mut() {
                *s = s.abs();
            }
        }
        ("relu", "out") if is(Bug::ReluOutputAssumedCompact) => *strides = compact(),
        // Only positive strides (a permutation, or gaps), so the compact
        // reads stay inside the operand's memory.
        ("silu_backward", "grad_out")
            if is(Bug::SiluBackwardGradOutAsCompact) && strides.iter().all(|&s| s > 0) =>
        {
            *strides = compact();
        }
        // Dimensions that collapse into one of stride s > 1 (a gapped
        // view): the 1-D path indexes it with stride 1.
        ("gelu_backward", "grad_out")
            if is(Bug::GeluBackwardGradOutGapsAsCompact) && collapses_to_gaps(shape, strides) =>
        {
            *strides = compact();
        }
        // Last dimension contiguous: rows assumed packed.
        ("rms_norm", "input" | "out")
            if is(Bug::RmsNormIgnoresRowStride) && strides.last() == Some(&1) =>
        {
            *strides = compact();
        }
        // The fast path is taken for rows that are contiguous and padded
        // (every stride positive, the row stride at least the row's
        // length), and then indexes them as packed.
        ("layer_norm", "input")
            if is(Bug::LayerNormInputRowsAssumedPacked)
                && strides.last() == Some(&1)
                && strides.iter().all(|&s| s > 0)
                && shape.len() >= 2
                && strides[shape.len() - 2] > shape[shape.len() - 1] =>
        {
            *strides = compact();
        }
        // Rows evenly spaced at the second-to-last dim's stride (positive
        // strides whose rows then span no more memory than the view's, so
        // the reads stay inside the operand).
        ("softmax", "input") if is(Bug::SoftmaxRowsOneStride) && shape.len() >= 3 => {
            let n = shape.len();
            let mut rows = strides.clone();
            for d in (0..n - 2).rev() {
                rows[d] = rows[d + 1] * shape[d + 1];
            }
            let span = |s: &[i64]| -> i64 { s.iter().zip(shape).map(|(s, e)| s * (e - 1)).sum() };
            if strides.iter().all(|&s| s > 0) && span(&rows) <= span(strides) {
                *strides = rows;
            }
        }
        ("matmul", "b") if is(Bug::MatmulTransposedBAsCompact) => {
            let n = strides.len();
            if n >= 2 && strides[n - 2] == 1 && shape[n - 2] > 1 && shape[n - 1] > 1 {
                *strides = compact();
            }
        }
        _ => {}
    }
}

/// Whether a view of `shape` with `strides` collapses into one dimension
/// of a stride over 1 (every stride the next one's times its extent, the
/// last one above 1): a gapped view, read compactly within its span.
fn collapses_to_gaps(shape: &[i64], strides: &[i64]) -> bool {
    let Some(&last) = strides.last() else {
        return false;
    };
    last > 1 && (1..shape.len()).all(|d| shape[d] <= 1 || strides[d - 1] == strides[d] * shape[d])
}

/// After the kernel: writes outside `out`, the output of `op`.
///
/// # Safety
/// `out` addresses live memory; the bytes the bug writes outside it are in
/// the padding that `Planted::alloc` adds around every allocation (or in
/// the caller's guard zone, which is the point).
pub unsafe fn after(op: &str, out: &View<'_>) {
    // The operator's bug of this kind, and the elements' addresses only
    // where it is planted (gathered for every call of every operator, they
    // were a quarter of a conformance run's time with no bug planted).
    let bug = match op {
        "add" => Bug::AddWritesOnePastEnd,
        "embedding" => Bug::EmbeddingHalfPairStorePastEnd,
        "neg" => Bug::NegZeroesElementBefore,
        "gelu_backward" => Bug::GeluBackwardWritesGaps,
        _ => return,
    };
    if !is(bug) {
        return;
    }
    let size = out.dtype.size();
    let addrs = elems::addresses(out);
    let (Some(&first), Some(&last)) = (addrs.iter().min(), addrs.iter().max()) else {
        return;
    };
    match bug {
        Bug::AddWritesOnePastEnd => {
            // The element just after the highest one in memory.
            // SAFETY: see the function's contract.
            unsafe { last.add(size).write_bytes(0x3f, size) };
        }
        // 16-bit elements stored in pairs: an odd count's last pair runs
        // one element past the highest one.
        Bug::EmbeddingHalfPairStorePastEnd if size == 2 && addrs.len() % 2 == 1 => {
            // SAFETY: see the function's contract.
            unsafe { last.add(size).write_bytes(0, size) };
        }
        Bug::NegZeroesElementBefore => {
            // SAFETY: see the function's contract.
            unsafe { first.sub(size).write_bytes(0, size) };
        }
        Bug::GeluBackwardWritesGaps => {
            let written: std::collections::HashSet<usize> =
                addrs.iter().map(|&p| p as usize).collect();
            for &p in &addrs {
                let gap = p.wrapping_add(size);
                if gap <= last && !written.contains(&(gap as usize)) {
                    // SAFETY: the gap lies between two elements of the view,
                    // inside its allocation.
                    unsafe { gap.write_bytes(0, size) };
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_views_that_collapse_into_one_gapped_stride_are_misread() {
        assert!(collapses_to_gaps(&[7], &[2]));
        assert!(collapses_to_gaps(&[4, 6], &[12, 2]));
        assert!(collapses_to_gaps(&[2, 3, 67], &[402, 134, 2]));
        assert!(!collapses_to_gaps(&[4, 6], &[6, 1]));
        assert!(!collapses_to_gaps(&[4, 6], &[1, 4]));
        assert!(!collapses_to_gaps(&[4, 6], &[9, 1]));
        assert!(!collapses_to_gaps(&[], &[]));
    }
}

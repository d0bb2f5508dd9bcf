//! Overlapping the data-parallel gradient reduction with the last backward
//! pass: how a stage's gradients are cut into buckets, and how much of the
//! reduction the overlap leaves after the backward pass.
//!
//! A stage's gradients are final only once the last micro-batch's backward
//! pass has run through them, which it does from the last unit (the head)
//! back to the first (the embedding). Each bucket, a run of consecutive
//! units, can be reduced as soon as the pass has left it, while the pass
//! goes on through the units before it. `polychip train` does this (its
//! `reduce` module), and the measured search prices it with
//! [`exposed_reduction`] so that its predictions see the same overlap.

use std::ops::Range;

/// The smallest bucket, bytes of gradients: consecutive units are merged
/// from the last one back until they hold this much. PyTorch's
/// DistributedDataParallel takes 1 MiB for its first bucket (25 MiB after);
/// one size here keeps the model simple, and on shared memory a collective's
/// fixed cost (tens of microseconds) is then a few percent of a bucket's
/// time. Units larger than this are buckets of their own.
pub const BUCKET_BYTES: u64 = 1 << 20;

/// A stage's buckets, in the order they are reduced (last unit first): each
/// a range of indices into `unit_bytes` (the stage's units in model order,
/// bytes of gradients each). Every unit is in exactly one bucket; each
/// bucket but possibly the last reduced (holding the first units) holds at
/// least `min_bytes`.
pub fn reduction_buckets(unit_bytes: &[u64], min_bytes: u64) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut end = unit_bytes.len();
    let mut held = 0;
    for u in (0..unit_bytes.len()).rev() {
        held += unit_bytes[u];
        if held >= min_bytes {
            out.push(u..end);
            end = u;
            held = 0;
        }
    }
    if end > 0 {
        out.push(0..end);
    }
    out
}

/// Seconds of a stage's gradient reduction left after its last backward
/// pass ends, when each bucket's reduction starts as soon as the pass has
/// produced it and the buckets are reduced one after another: `reduce` is
/// the whole reduction's time, `backward` the last micro-batch's backward
/// pass, and `buckets` the buckets' bytes in reduction order. The pass is
/// taken to produce gradients at an even rate over their bytes, and a
/// bucket's reduction to take its share of `reduce` by bytes. With one
/// bucket nothing overlaps: the whole `reduce` is left.
pub fn exposed_reduction(reduce: f64, backward: f64, buckets: &[u64]) -> f64 {
    let total: u64 = buckets.iter().sum();
    if total == 0 || buckets.len() < 2 {
        return reduce;
    }
    let (mut produced, mut finish) = (0u64, 0.0f64);
    for &bytes in buckets {
        produced += bytes;
        let ready = backward * produced as f64 / total as f64;
        finish = finish.max(ready) + reduce * bytes as f64 / total as f64;
    }
    (finish - backward).max(0.0)
}

/// The time a stage's gradients become final over, which its reduction
/// can overlap: its last backward pass (`backward`), or, where the
/// schedule splits that pass (zero bubble, and 1F1B with deferred weights,
/// on every stage but the first), its weights' part (`weight_grad`, when
/// known): the input's part before it finishes no weight's gradient.
pub fn overlap_window(
    schedule: crate::schedule::PipelineSchedule,
    stage: usize,
    backward: f64,
    weight_grad: f64,
) -> f64 {
    match schedule.splits_last(stage) && weight_grad > 0.0 {
        true => weight_grad.min(backward),
        false => backward,
    }
}

/// [`exposed_reduction`] of a stage whose units (in model order) hold
/// `unit_bytes` of gradients, bucketed as the trainer buckets them
/// ([`reduction_buckets`] at [`BUCKET_BYTES`]).
pub fn exposed_reduction_of_units(reduce: f64, backward: f64, unit_bytes: &[u64]) -> f64 {
    exposed_reduction_in_buckets(reduce, backward, unit_bytes, BUCKET_BYTES)
}

/// [`exposed_reduction`] of a stage whose units (in model order) hold
/// `unit_bytes` of gradients, in buckets of at least `min_bytes`
/// ([`reduction_buckets`]).
pub fn exposed_reduction_in_buckets(
    reduce: f64,
    backward: f64,
    unit_bytes: &[u64],
    min_bytes: u64,
) -> f64 {
    let buckets: Vec<u64> = reduction_buckets(unit_bytes, min_bytes)
        .into_iter()
        .map(|r| unit_bytes[r].iter().sum())
        .collect();
    exposed_reduction(reduce, backward, &buckets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_merge_units_from_the_last_back_and_cover_every_unit() {
        assert_eq!(reduction_buckets(&[5, 5, 5, 5], 10), vec![2..4, 0..2]);
        // A large unit is a bucket alone; the first units may be short.
        assert_eq!(
            reduction_buckets(&[3, 30, 4, 4, 4], 10),
            vec![2..5, 1..2, 0..1]
        );
        assert_eq!(reduction_buckets(&[1, 1], 10), vec![0..2]);
        assert!(reduction_buckets(&[], 10).is_empty());
    }

    #[test]
    fn a_split_last_pass_overlaps_the_reduction_with_its_weights_part_only() {
        use crate::schedule::PipelineSchedule::*;
        for s in [OneFOneB, GPipe, ZeroBubble, OneFOneBDeferred] {
            // The first stage runs its passes whole under every schedule.
            assert_eq!(overlap_window(s, 0, 12.0, 4.0), 12.0);
        }
        assert_eq!(overlap_window(OneFOneB, 1, 12.0, 4.0), 12.0);
        assert_eq!(overlap_window(ZeroBubble, 1, 12.0, 4.0), 4.0);
        assert_eq!(overlap_window(OneFOneBDeferred, 2, 12.0, 4.0), 4.0);
        // Not known: the whole pass.
        assert_eq!(overlap_window(ZeroBubble, 1, 12.0, 0.0), 12.0);
        // The shorter window leaves more of the reduction exposed.
        let exposed = |w| exposed_reduction(8.0, w, &[1, 1, 1, 1]);
        assert!(
            exposed(4.0) > exposed(12.0),
            "{} {}",
            exposed(4.0),
            exposed(12.0)
        );
    }

    #[test]
    fn the_overlap_hides_all_but_the_last_bucket_when_the_reduction_is_faster() {
        // Four equal buckets, the reduction at half the backward's pace:
        // each bucket's reduction ends before the next is ready, so only
        // the last bucket's reduction (1/4 of it) is left.
        let left = exposed_reduction(4.0, 16.0, &[1, 1, 1, 1]);
        assert!((left - 1.0).abs() < 1e-12, "{left}");
        // Slower than the backward: the first bucket is ready after a
        // quarter of it, then the reduction runs back to back.
        let left = exposed_reduction(32.0, 16.0, &[1, 1, 1, 1]);
        assert!((left - (4.0 + 32.0 - 16.0)).abs() < 1e-12, "{left}");
        // One bucket: nothing to overlap.
        assert_eq!(exposed_reduction(3.0, 16.0, &[7]), 3.0);
        assert_eq!(exposed_reduction(3.0, 16.0, &[]), 3.0);
        // Never more than without the overlap, never less than nothing.
        for (r, b) in [(0.5, 9.0), (9.0, 0.5), (1.0, 1.0)] {
            let left = exposed_reduction(r, b, &[3, 1, 4, 1, 5]);
            assert!((0.0..=r).contains(&left), "{r} {b} {left}");
        }
    }
}

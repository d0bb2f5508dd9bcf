//! Comparing a plugin's output with the reference: pass or fail under the
//! tolerance, and the error statistics the report shows.

use polychip_host::DType;
use serde::{Deserialize, Serialize};

use crate::values::ulp;

/// Error statistics of one output tensor (or, merged, of many).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Elements compared.
    pub elements: usize,
    /// Largest `|got - want|` over finite pairs.
    pub max_abs: f64,
    /// Largest `|got - want| / |want|` over finite pairs with `want != 0`.
    pub max_rel: f64,
    /// Largest error in ULPs of the output dtype at `want`.
    pub max_ulp: f64,
    /// Sum of signed errors in ULPs (for the mean; a biased rounding shows).
    pub sum_signed_ulp: f64,
    /// Finite pairs counted in `sum_signed_ulp`.
    pub finite: usize,
    /// Elements where NaN or an infinity on one side is not matched on the other.
    pub nan_inf_mismatches: usize,
    /// Elements outside the tolerance.
    pub failures: usize,
}

impl Stats {
    /// The mean signed error in ULPs.
    pub fn mean_signed_ulp(&self) -> f64 {
        if self.finite == 0 {
            0.0
        } else {
            self.sum_signed_ulp / self.finite as f64
        }
    }

    /// Adds another tensor's or case's statistics.
    pub fn merge(&mut self, other: &Stats) {
        self.elements += other.elements;
        self.max_abs = self.max_abs.max(other.max_abs);
        self.max_rel = self.max_rel.max(other.max_rel);
        self.max_ulp = self.max_ulp.max(other.max_ulp);
        self.sum_signed_ulp =
            (self.sum_signed_ulp + other.sum_signed_ulp).clamp(-f64::MAX, f64::MAX);
        self.finite += other.finite;
        self.nan_inf_mismatches += other.nan_inf_mismatches;
        self.failures += other.failures;
    }
}

/// The first element that failed, for the message.
#[derive(Debug, Clone, PartialEq)]
pub struct FirstFailure {
    /// Row-major element index.
    pub index: usize,
    /// The plugin's value.
    pub got: f64,
    /// The reference's value.
    pub want: f64,
    /// The allowed absolute error at that element.
    pub allowed: f64,
}

/// Root-mean-square of the finite values, computed without overflow.
fn rms(values: &[f64]) -> f64 {
    let finite = values.iter().copied().filter(|w| w.is_finite());
    let max = finite.clone().fold(0.0f64, |m, w| m.max(w.abs()));
    let count = finite.clone().count();
    if max == 0.0 || count == 0 {
        return 0.0;
    }
    max * (finite.map(|w| (w / max) * (w / max)).sum::<f64>() / count as f64).sqrt()
}

/// Compares `got` with `want` (same length) for an output of `dtype` under
/// relative tolerance `rtol` (see [`crate::tolerance`]).
pub fn compare(
    dtype: DType,
    got: &[f64],
    want: &[f64],
    rtol: f64,
) -> (Stats, Option<FirstFailure>) {
    let scale = rms(want);
    let mut stats = Stats {
        elements: got.len(),
        ..Stats::default()
    };
    let mut first = None;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (ok, allowed) = if w.is_nan() || g.is_nan() {
            let ok = w.is_nan() && g.is_nan();
            if !ok {
                stats.nan_inf_mismatches += 1;
            }
            (ok, 0.0)
        } else if w.is_infinite() || g.is_infinite() {
            let ok = w == g;
            if !ok {
                stats.nan_inf_mismatches += 1;
            }
            (ok, 0.0)
        } else {
            // Clamped so that statistics stay finite (and serialisable) when
            // the difference of two huge values overflows.
            let err = (g - w).clamp(-f64::MAX, f64::MAX);
            stats.max_abs = stats.max_abs.max(err.abs());
            if w != 0.0 {
                stats.max_rel = stats.max_rel.max((err / w).abs().min(f64::MAX));
            }
            let in_ulps = (err / ulp(dtype, w)).clamp(-f64::MAX, f64::MAX);
            stats.max_ulp = stats.max_ulp.max(in_ulps.abs());
            stats.sum_signed_ulp = (stats.sum_signed_ulp + in_ulps).clamp(-f64::MAX, f64::MAX);
            stats.finite += 1;
            let allowed = if rtol == 0.0 {
                0.0
            } else {
                rtol * (w.abs() + scale)
            };
            (err.abs() <= allowed, allowed)
        };
        if !ok {
            stats.failures += 1;
            if first.is_none() {
                first = Some(FirstFailure {
                    index: i,
                    got: g,
                    want: w,
                    allowed,
                });
            }
        }
    }
    (stats, first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_tolerance_demands_equal_values_and_matching_specials() {
        let (s, f) = compare(
            DType::F32,
            &[1.0, f64::NAN, f64::INFINITY],
            &[1.0, f64::NAN, f64::INFINITY],
            0.0,
        );
        assert_eq!((s.failures, f), (0, None));
        let (s, f) = compare(DType::F32, &[1.0, 2.0], &[1.0, f64::NAN], 0.0);
        assert_eq!(s.nan_inf_mismatches, 1);
        assert_eq!(f.unwrap().index, 1);
    }

    #[test]
    fn a_biased_rounding_shows_in_the_mean_signed_error() {
        let u = ulp(DType::BF16, 1.0);
        let want = vec![1.0; 8];
        let got = vec![1.0 - u; 8];
        let (s, _) = compare(DType::BF16, &got, &want, 1.0);
        assert!((s.mean_signed_ulp() + 1.0).abs() < 1e-12);
        assert_eq!(s.max_ulp, 1.0);
    }
}

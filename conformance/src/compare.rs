//! Comparing a plugin's output with the reference: pass or fail under the
//! error model of [`crate::tolerance`], the worst failing element, the error
//! statistics the report shows, and the test for a systematic bias.

use polychip_host::DType;
use serde::{Deserialize, Serialize};

use crate::tolerance::{Bias, Tolerance};
use crate::values::{round_to, ulp};

/// Error statistics of one output tensor (or, merged, of many).
///
/// Errors are measured against the exact reference value `x`, in ULPs of the
/// output dtype at `x`: a correctly rounded result is within 0.5.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Elements compared.
    pub elements: usize,
    /// Largest `|got - x|` over finite pairs.
    pub max_abs: f64,
    /// Largest `|got - x| / |x|` over finite pairs with `x != 0`.
    pub max_rel: f64,
    /// Largest error in ULPs of the output dtype at `x`.
    pub max_ulp: f64,
    /// Sum of signed errors `got - x` in ULPs.
    pub sum_signed_ulp: f64,
    /// Sum of their squares.
    #[serde(default)]
    pub sum_sq_signed_ulp: f64,
    /// Sum of errors in ULPs signed by magnitude: `(got - x) sign(x)`,
    /// negative toward zero (truncation shows here whatever the signs of the
    /// values).
    #[serde(default)]
    pub sum_magnitude_ulp: f64,
    /// Sum of their squares (the same as of the signed errors).
    #[serde(default)]
    pub sum_sq_magnitude_ulp: f64,
    /// Finite pairs counted in the sums.
    pub finite: usize,
    /// Elements where NaN or an infinity on one side is not matched on the other.
    pub nan_inf_mismatches: usize,
    /// Elements outside the tolerance.
    pub failures: usize,
}

impl Stats {
    /// The mean error in ULPs signed by magnitude (negative: toward zero).
    pub fn mean_signed_ulp(&self) -> f64 {
        if self.finite == 0 {
            0.0
        } else {
            self.sum_magnitude_ulp / self.finite as f64
        }
    }

    /// Adds another tensor's or case's statistics.
    pub fn merge(&mut self, other: &Stats) {
        let add = |a: f64, b: f64| (a + b).clamp(-f64::MAX, f64::MAX);
        self.elements += other.elements;
        self.max_abs = self.max_abs.max(other.max_abs);
        self.max_rel = self.max_rel.max(other.max_rel);
        self.max_ulp = self.max_ulp.max(other.max_ulp);
        self.sum_signed_ulp = add(self.sum_signed_ulp, other.sum_signed_ulp);
        self.sum_sq_signed_ulp = add(self.sum_sq_signed_ulp, other.sum_sq_signed_ulp);
        self.sum_magnitude_ulp = add(self.sum_magnitude_ulp, other.sum_magnitude_ulp);
        self.sum_sq_magnitude_ulp = add(self.sum_sq_magnitude_ulp, other.sum_sq_magnitude_ulp);
        self.finite += other.finite;
        self.nan_inf_mismatches += other.nan_inf_mismatches;
        self.failures += other.failures;
    }
}

/// The worst failing element of an output, for the message: the largest
/// error relative to its allowed error, NaN and infinity mismatches first.
#[derive(Debug, Clone, PartialEq)]
pub struct Worst {
    /// Row-major (flat) element index.
    pub index: usize,
    /// The plugin's value.
    pub got: f64,
    /// The exact reference value.
    pub want: f64,
    /// The exact value rounded to the output dtype.
    pub rounded: f64,
    /// The allowed absolute error at that element.
    pub allowed: f64,
    /// `|got - want| / allowed` (infinite for a NaN or infinity mismatch
    /// or where nothing is allowed).
    pub ratio: f64,
    /// Whether it is a NaN or infinity mismatch.
    pub nan_inf: bool,
}

impl Worst {
    /// `worst at element [i, j] (flat k): got .., want .., allowed ..` for
    /// an output of `shape` and `dtype`.
    pub fn describe(&self, shape: &[usize], dtype: DType) -> String {
        let rounded = if self.rounded == self.want || self.want.is_nan() {
            String::new()
        } else {
            format!(" (= {} in {dtype})", self.rounded)
        };
        format!(
            "worst at {}: got {}, want {}{rounded}, allowed error {:.3e}",
            index_label(shape, self.index),
            self.got,
            self.want,
            self.allowed
        )
    }
}

/// `element [i, j] (flat k)`: where row-major element `flat` of `shape` is.
pub fn index_label(shape: &[usize], flat: usize) -> String {
    let at: Vec<String> = unravel(flat, shape).iter().map(usize::to_string).collect();
    format!("element [{}] (flat {flat})", at.join(", "))
}

/// The multi-dimensional index of row-major element `flat` of `shape`.
pub fn unravel(flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut at = vec![0; shape.len()];
    let mut rest = flat;
    for (i, &d) in shape.iter().enumerate().rev() {
        let d = d.max(1);
        at[i] = rest % d;
        rest /= d;
    }
    at
}

/// Root-mean-square of the finite values, computed without overflow.
fn rms(values: impl Iterator<Item = f64> + Clone) -> f64 {
    let (mut max, mut count) = (0.0f64, 0usize);
    for w in values.clone().filter(|w| w.is_finite()) {
        max = max.max(w.abs());
        count += 1;
    }
    if max == 0.0 || count == 0 {
        return 0.0;
    }
    // Scaled by the largest (no square overflows); by its reciprocal where
    // that is finite (a division per element was most of this pass).
    let inv = 1.0 / max;
    let scaled = |w: f64| if inv.is_finite() { w * inv } else { w / max };
    let sum: f64 = values
        .filter(|w| w.is_finite())
        .map(|w| scaled(w) * scaled(w))
        .sum();
    max * (sum / count as f64).sqrt()
}

/// The overflow threshold of a floating dtype: the smallest magnitude that
/// rounds to infinity (the largest finite value plus half its ULP).
fn overflow_threshold(dtype: DType) -> f64 {
    let max = match dtype {
        DType::F64 => return f64::MAX,
        DType::F32 => f64::from(f32::MAX),
        DType::F16 => 65504.0,
        DType::BF16 => f64::from(half::bf16::MAX),
        _ => return f64::INFINITY,
    };
    max + 0.5 * ulp(dtype, max)
}

/// Compares `got` with the exact reference `exact` (same length) for an
/// output of `dtype` under `tol` (see [`crate::tolerance`]), every allowed
/// error times `factor` (1 unless a waiver loosens it). `before` is the
/// tensor's value before the call when `tol` judges it relative to its
/// change (an in-place update), else `None`.
pub fn compare(
    dtype: DType,
    got: &[f64],
    exact: &[f64],
    before: Option<&[f64]>,
    tol: &Tolerance,
    factor: f64,
) -> (Stats, Option<Worst>) {
    let magnitude = |i: usize| match before {
        Some(b) => exact[i] - b[i],
        None => exact[i],
    };
    let scale = rms((0..exact.len()).map(magnitude));
    let (per_ulp, per_x, per_scale) = tol.coefficients(dtype, factor);
    let pure = tol.is_pure_rounding() && factor <= 1.0;
    let threshold = overflow_threshold(dtype);
    let mut stats = Stats {
        elements: got.len(),
        ..Stats::default()
    };
    let mut worst: Option<Worst> = None;
    // The exact value rounded to the dtype is needed only to judge a pure
    // rounding or an integer output (and to report a failure), not for
    // every element of every float output.
    let float = dtype.is_float();
    let needs_rounding = pure || !float;
    for (i, (&g, &x)) in got.iter().zip(exact).enumerate() {
        let rounded = if needs_rounding {
            round_to(dtype, x)
        } else {
            x
        };
        // An integer output is its conversion (NaN filled into i32 is 0).
        let x = if float { x } else { rounded };
        let x_ulp = ulp(dtype, x);
        let allowed = if x.is_finite() {
            per_ulp * x_ulp + per_x * magnitude(i).abs() + per_scale * scale
        } else {
            0.0
        };
        let (ok, nan_inf, ratio) = if x.is_nan() || g.is_nan() {
            let ok = x.is_nan() && g.is_nan();
            (ok, !ok, f64::INFINITY)
        } else if x.is_infinite() {
            let ok = g == x;
            (ok, !ok, f64::INFINITY)
        } else if g.is_infinite() {
            // An overflow is right only where the exact value, within its
            // allowed error, reaches the threshold with the same sign.
            let ok = if pure {
                g == rounded
            } else {
                g.signum() == x.signum() && x.abs() + allowed >= threshold
            };
            (ok, !ok, f64::INFINITY)
        } else {
            // Clamped so that statistics stay finite (and serialisable) when
            // the difference of two huge values overflows.
            let err = (g - x).clamp(-f64::MAX, f64::MAX);
            stats.max_abs = stats.max_abs.max(err.abs());
            if x != 0.0 {
                stats.max_rel = stats.max_rel.max((err / x).abs().min(f64::MAX));
            }
            let in_ulps = (err / x_ulp).clamp(-f64::MAX, f64::MAX);
            let toward = if x < 0.0 { -in_ulps } else { in_ulps };
            let sq = (in_ulps * in_ulps).min(f64::MAX);
            stats.max_ulp = stats.max_ulp.max(in_ulps.abs());
            stats.sum_signed_ulp = (stats.sum_signed_ulp + in_ulps).clamp(-f64::MAX, f64::MAX);
            stats.sum_magnitude_ulp = (stats.sum_magnitude_ulp + toward).clamp(-f64::MAX, f64::MAX);
            stats.sum_sq_signed_ulp = (stats.sum_sq_signed_ulp + sq).min(f64::MAX);
            stats.sum_sq_magnitude_ulp = stats.sum_sq_signed_ulp;
            stats.finite += 1;
            // Where the operator is exactly an IEEE operation or a pure
            // rounding, a zero's sign is part of the answer (sqrt(-0) is -0,
            // -0 * 1 is -0, a copy keeps it) unless the tolerance leaves
            // it open (`relu_backward`); elsewhere it is not judged.
            // Only an exact zero is judged: a tiny exact value that rounds
            // to zero may come out as either zero from a correct kernel
            // (`0 + 0.5 * -2^-149` is +0 in f32).
            let zero_sign = (pure || tol.bias == Bias::Always)
                && tol.zero_sign
                && g == 0.0
                && x == 0.0
                && g.is_sign_negative() != x.is_sign_negative();
            let ok = !zero_sign
                && if pure {
                    g == rounded
                } else {
                    err.abs() <= allowed
                };
            let ratio = if zero_sign {
                f64::INFINITY
            } else if err == 0.0 {
                0.0
            } else if allowed == 0.0 {
                f64::INFINITY
            } else {
                err.abs() / allowed
            };
            (ok, false, ratio)
        };
        if nan_inf {
            stats.nan_inf_mismatches += 1;
        }
        if !ok {
            stats.failures += 1;
            let worse = worst
                .as_ref()
                .is_none_or(|w| (nan_inf, ratio) > (w.nan_inf, w.ratio));
            if worse {
                worst = Some(Worst {
                    index: i,
                    got: g,
                    want: x,
                    rounded: round_to(dtype, x),
                    allowed: if pure { 0.0 } else { allowed },
                    ratio,
                    nan_inf,
                });
            }
        }
    }
    (stats, worst)
}

/// The threshold of the bias test, in standard errors of the mean.
pub const BIAS_Z: f64 = 6.0;
/// The smallest mean error, in ULPs, that the bias test reports.
pub const BIAS_FLOOR_ULP: f64 = 0.05;
/// The smallest variance of one element's error the test assumes, in
/// ULPs squared: that of an error uniform over one ULP (rounding noise),
/// so that a handful of equal errors is not taken for a bias.
pub const BIAS_MIN_VARIANCE: f64 = 1.0 / 12.0;

/// The bias test: `Some(why)` when the mean signed error of an output of
/// `dtype` (in ULPs, either signed or signed by magnitude) is beyond what
/// rounding noise allows for its sample size, `|mean| > z s / sqrt(N)` with
/// `z = BIAS_Z` and `s` the sample standard deviation (at least that of
/// uniform rounding noise), and above `BIAS_FLOOR_ULP`; only where `tol`
/// says a correct kernel is unbiased ([`Tolerance::tests_bias`]).
pub fn bias_failure(stats: &Stats, tol: &Tolerance, dtype: DType) -> Option<String> {
    if !tol.tests_bias(dtype) || stats.finite == 0 {
        return None;
    }
    let n = stats.finite as f64;
    let test = |sum: f64, sum_sq: f64| {
        let mean = sum / n;
        let variance = (sum_sq / n - mean * mean).max(BIAS_MIN_VARIANCE);
        let se = (variance / n).sqrt();
        let failed = mean.abs() > BIAS_FLOOR_ULP && mean.abs() > BIAS_Z * se;
        failed.then_some((mean, mean / se))
    };
    let (what, (mean, t)) = test(stats.sum_magnitude_ulp, stats.sum_sq_magnitude_ulp)
        .map(|r| ("toward zero or away from it", r))
        .or_else(|| {
            test(stats.sum_signed_ulp, stats.sum_sq_signed_ulp).map(|r| ("in one direction", r))
        })?;
    let toward = if what.starts_with("toward") {
        if mean < 0.0 {
            "toward zero"
        } else {
            "away from zero"
        }
    } else if mean < 0.0 {
        "downward"
    } else {
        "upward"
    };
    Some(format!(
        "biased rounding: mean error {mean:+.3} ULP {toward} over {} element(s), {:.1} standard errors (a correct kernel is unbiased here; the test fails beyond {BIAS_Z} and {BIAS_FLOOR_ULP} ULP)",
        stats.finite,
        t.abs()
    ))
}

/// The first element that failed under the earlier model, for
/// [`compare_scaled`].
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

/// The earlier suite's comparison, kept for `polychip train --autocompare`:
/// `|got - want| <= rtol (|want| + rms(want))` against the reference already
/// rounded to `dtype`.
pub fn compare_scaled(
    dtype: DType,
    got: &[f64],
    want: &[f64],
    rtol: f64,
) -> (Stats, Option<FirstFailure>) {
    let scale = rms(want.iter().copied());
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
            let err = (g - w).clamp(-f64::MAX, f64::MAX);
            stats.max_abs = stats.max_abs.max(err.abs());
            if w != 0.0 {
                stats.max_rel = stats.max_rel.max((err / w).abs().min(f64::MAX));
            }
            let in_ulps = (err / ulp(dtype, w)).clamp(-f64::MAX, f64::MAX);
            stats.max_ulp = stats.max_ulp.max(in_ulps.abs());
            stats.sum_signed_ulp = (stats.sum_signed_ulp + in_ulps).clamp(-f64::MAX, f64::MAX);
            let toward = if w < 0.0 { -in_ulps } else { in_ulps };
            stats.sum_magnitude_ulp = (stats.sum_magnitude_ulp + toward).clamp(-f64::MAX, f64::MAX);
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
    use half::bf16;

    use super::*;
    use crate::cases::Rng;

    fn cmp(dtype: DType, got: &[f64], exact: &[f64], tol: Tolerance) -> (Stats, Option<Worst>) {
        compare(dtype, got, exact, None, &tol, 1.0)
    }

    #[test]
    fn exact_tolerance_demands_the_rounded_value_and_matching_specials() {
        let (s, f) = cmp(
            DType::F32,
            &[1.0, f64::NAN, f64::INFINITY],
            &[1.0, f64::NAN, f64::INFINITY],
            Tolerance::EXACT,
        );
        assert_eq!((s.failures, f), (0, None));
        let (s, f) = cmp(DType::F32, &[1.0, 2.0], &[1.0, f64::NAN], Tolerance::EXACT);
        assert_eq!(s.nan_inf_mismatches, 1);
        assert_eq!(f.unwrap().index, 1);
        // A tie in bf16: 1 + 2^-8 rounds to 1 (even); 1 + 2^-7 is as close
        // but odd, so it fails although within half an ULP.
        let tie = 1.0 + 2f64.powi(-8);
        let (s, _) = cmp(DType::BF16, &[1.0], &[tie], Tolerance::EXACT);
        assert_eq!(s.failures, 0);
        let (s, _) = cmp(
            DType::BF16,
            &[1.0 + 2f64.powi(-7)],
            &[tie],
            Tolerance::EXACT,
        );
        assert_eq!(s.failures, 1);
        // Overflow: the exact value beyond the threshold must be infinity.
        let (s, _) = cmp(
            DType::F16,
            &[f64::INFINITY, 65504.0],
            &[65520.0, 65519.0],
            Tolerance::EXACT,
        );
        assert_eq!(s.failures, 0);
    }

    #[test]
    fn the_worst_element_is_reported_with_its_index() {
        let tol = Tolerance::computed(1.0);
        let u = ulp(DType::F32, 1.0);
        let exact = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut got = exact;
        got[1] += 4.0 * u; // ratio about 2
        got[4] += 64.0 * u; // the worst finite one
        let (s, w) = cmp(DType::F32, &got, &exact, tol);
        let w = w.unwrap();
        assert_eq!((s.failures, w.index), (2, 4));
        let text = w.describe(&[2, 3], DType::F32);
        assert!(
            text.starts_with("worst at element [1, 1] (flat 4): got"),
            "{text}"
        );
        got[5] = f64::NAN; // a NaN mismatch ranks above every finite error
        let (_, w) = cmp(DType::F32, &got, &exact, tol);
        assert_eq!(w.unwrap().index, 5);
        assert_eq!(unravel(7, &[2, 2, 3]), [1, 0, 1]);
    }

    #[test]
    fn correctly_rounded_bounds_have_no_tensor_scale_term() {
        // A small element next to large ones is judged on its own size.
        let tol = Tolerance::computed(1.0);
        let exact = [1000.0, 1e-3];
        let got = [1000.0, 1e-3 * (1.0 + 1e-5)];
        let (s, _) = cmp(DType::F32, &got, &exact, tol);
        assert_eq!(s.failures, 1);
    }

    /// `n` values in [lo, hi) that are not representable in bf16.
    fn samples(n: usize, lo: f64, hi: f64) -> Vec<f64> {
        let mut rng = Rng::for_case("bias test", DType::F32);
        (0..n)
            .map(|_| f64::from(rng.uniform(lo, hi) as f32))
            .collect()
    }

    #[test]
    fn a_truncating_bf16_rounding_fails_the_bias_test_and_a_correct_one_passes() {
        let exact = samples(2000, -4.0, 4.0);
        let nearest: Vec<f64> = exact.iter().map(|&x| round_to(DType::BF16, x)).collect();
        let truncated: Vec<f64> = exact
            .iter()
            .map(|&x| f64::from(bf16::from_bits(((x as f32).to_bits() >> 16) as u16)))
            .collect();
        // A faithful bound (1 ULP) that truncation meets element by element.
        let tol = Tolerance {
            round: 1.0,
            ..Tolerance::computed(1.0)
        };
        let (s, w) = cmp(DType::BF16, &nearest, &exact, tol);
        assert_eq!((s.failures, w), (0, None));
        assert_eq!(bias_failure(&s, &tol, DType::BF16), None);
        let (s, w) = cmp(DType::BF16, &truncated, &exact, tol);
        assert_eq!((s.failures, w), (0, None));
        assert!(s.mean_signed_ulp() < -0.4, "{s:?}");
        let why = bias_failure(&s, &tol, DType::BF16).expect("biased");
        assert!(why.contains("toward zero"), "{why}");
        // Not tested where a correct kernel may be biased.
        assert_eq!(
            bias_failure(&s, &Tolerance::accumulated(0.0, 4), DType::BF16),
            None
        );
        // And truncation fails a correctly rounded bound outright.
        let (s, _) = cmp(DType::BF16, &truncated, &exact, Tolerance::computed(1.0));
        assert!(s.failures > 500, "{s:?}");
    }

    #[test]
    fn a_handful_of_equal_errors_is_not_a_bias() {
        let tol = Tolerance::computed(1.0);
        let u = ulp(DType::BF16, 1.0);
        let exact = [1.0 + 0.4 * u; 4];
        let got = [1.0; 4];
        let (s, _) = cmp(DType::BF16, &got, &exact, tol);
        assert_eq!(bias_failure(&s, &tol, DType::BF16), None);
    }

    fn gelu_tanh(x: f64) -> f64 {
        let c = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
    }

    /// erf by Abramowitz and Stegun 7.1.26 refined: accurate to 1e-7,
    /// enough to tell the two GELU forms apart.
    fn erf(x: f64) -> f64 {
        // Midpoint rule on exp(-t^2) with many panels.
        let n = 4000;
        let h = x / n as f64;
        let sum: f64 = (0..n)
            .map(|i| {
                let t = (i as f64 + 0.5) * h;
                (-t * t).exp()
            })
            .sum();
        2.0 / std::f64::consts::PI.sqrt() * sum * h
    }

    #[test]
    fn gelu_by_erf_instead_of_tanh_fails_in_bf16() {
        let x = samples(400, -4.0, 4.0);
        let exact: Vec<f64> = x.iter().map(|&v| gelu_tanh(v)).collect();
        let erf_form: Vec<f64> = x
            .iter()
            .map(|&v| round_to(DType::BF16, 0.5 * v * (1.0 + erf(v / 2f64.sqrt()))))
            .collect();
        // The suite's gelu bound (see cases/elementwise.rs).
        let tol = Tolerance::accumulated(32.0, 1).with_bias(crate::tolerance::Bias::LowPrecision);
        let (s, _) = cmp(DType::BF16, &erf_form, &exact, tol);
        assert!(s.failures > 10, "{s:?}");
        // The tanh form computed in f32 and rounded once passes.
        let right: Vec<f64> = x
            .iter()
            .map(|&v| round_to(DType::BF16, f64::from(gelu_tanh(v) as f32)))
            .collect();
        let (s, _) = cmp(DType::BF16, &right, &exact, tol);
        assert_eq!(s.failures, 0, "{s:?}");
        assert_eq!(bias_failure(&s, &tol, DType::BF16), None);
    }
}

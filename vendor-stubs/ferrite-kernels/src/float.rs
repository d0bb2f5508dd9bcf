//! The natively computed floating-point types (`f32`, `f64`) behind one small
//! trait so arithmetic kernels can be written once, plus `exp`, `tanh` and
//! the logistic sigmoid for `f32` built only from operations the compiler
//! can vectorize.

use std::ops::{Add, Div, Mul, Sub};

/// `f32` or `f64`: the types kernels compute in.
pub(crate) trait Real:
    Copy
    + Default
    + PartialOrd
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    /// `e^self`, accurate to a few ulps; NaN stays NaN.
    fn exp(self) -> Self;
}

impl Real for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f32::NEG_INFINITY;
    #[inline(always)]
    fn exp(self) -> Self {
        exp_f32(self)
    }
}

impl Real for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f64::NEG_INFINITY;
    #[inline(always)]
    fn exp(self) -> Self {
        f64::exp(self)
    }
}

/// `e^x` for `f32` within about 2 ulps, branch-free so loops over it
/// vectorize: Cody-Waite reduction `x = n ln2 + r`, the Cephes minimax
/// polynomial for `e^r`, and a two-step scaling by `2^n` that handles both
/// overflow to infinity and gradual underflow. NaN in gives NaN out,
/// `-inf` gives 0 and `+inf` gives `+inf`.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    // Clamp to where the result saturates (NaN stays NaN).
    let x = x.clamp(-105.0, 89.0);
    let (y, ni) = exp_reduced(x);
    let n1 = ni >> 1;
    let n2 = ni.wrapping_sub(n1);
    let s1 = f32::from_bits((n1.wrapping_add(127) as u32) << 23);
    let s2 = f32::from_bits((n2.wrapping_add(127) as u32) << 23);
    y * s1 * s2
}

/// `e^x` like [`exp_f32`] but for softmax arguments (`x <= 88`): one
/// scaling step, and results below the normal range flushed to zero
/// (`-inf` gives exactly 0). A few operations cheaper per element.
#[inline(always)]
pub(crate) fn exp_softmax(x: f32) -> f32 {
    const LOW: f32 = -87.33;
    let (y, ni) = exp_reduced(x.clamp(LOW, 88.0));
    let r = y * f32::from_bits((ni.wrapping_add(127) as u32) << 23);
    if x < LOW { 0.0 } else { r }
}

/// `(e^r, n)` with `x = n ln2 + r`, `|r| <= ln2 / 2`, for clamped `x`.
#[inline(always)]
fn exp_reduced(x: f32) -> (f32, i32) {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer.
    const LN2_HI: f32 = 0.693_359_4; // 355/512, exact in few bits.
    const LN2_LO: f32 = -2.121_944_4e-4;
    let t = x * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    let ni = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    (p * r * r + r + 1.0, ni)
}

/// The pieces of the standard normal distribution at `x` that
/// [`normal_parts`] returns: `Phi(-|x|) = (m * s1) * s2` (the lower tail at
/// `-|x|`) and `e^(-x^2 / 2) = (e * s1) * s2`, each a mantissa near 1 (`m`
/// about 0.05 to 0.5, `e` from 0.7 to 1.5) times a two-step power-of-two
/// scale, so that a product with the mantissa rounds only once, at the
/// final (possibly subnormal) scaling.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NormalParts {
    pub m: f32,
    pub e: f32,
    pub s1: f32,
    pub s2: f32,
}

impl NormalParts {
    /// `Phi(-|x|)`, the lower tail.
    #[inline(always)]
    pub(crate) fn tail(self) -> f32 {
        self.m * self.s1 * self.s2
    }
    /// `Phi(x)`, the standard normal CDF.
    #[inline(always)]
    pub(crate) fn cdf(self, x: f32) -> f32 {
        let h = self.tail();
        if x < 0.0 { h } else { 1.0 - h }
    }
}

/// `|x|` from which `Phi(-|x|)` (and `|x| Phi(-|x|)`, `e^(-x^2/2)`) are
/// below half the smallest `f32` subnormal (`Phi(-14.5) = 4e-48`): there
/// the mantissas are 0, and the fit of [`NORMAL_TAIL`] ends.
const NORMAL_W_MAX: f32 = 14.9;
/// `q` of `t = 1 / (1 + q |x|)` in [`normal_parts`] (exact in binary).
const NORMAL_Q: f32 = 0.3125;
/// `Phi(-w) e^(w^2 / 2) = t P(t)`, `t = 1 / (1 + q w)`, for `w` in
/// `[0, 14.9]`: the coefficients of `P` from `t^0` up, fitted minimax for
/// the relative error (Lawson's iteration on a Chebyshev basis, 3000
/// points, against 40-digit `mpmath`) and rounded to `f32`: at most 2.1e-8
/// (0.35 ulp) relative before the `f32` evaluation, which adds a few ulps
/// (at most 7.1 ulps of `Phi(-|x|)` measured, near `x = 0`).
const NORMAL_TAIL: [f32; 10] = [
    0.124_665_84,
    0.124_740_74,
    0.111_964_75,
    0.089_704_305,
    0.056_672_59,
    -0.004_677_050_7,
    0.076_889_36,
    -0.153_054_95,
    0.092_275_33,
    -0.019_180_916,
];

/// The standard normal's tail `Phi(-|x|)` and `e^(-x^2 / 2)` at `x` as
/// [`NormalParts`], branch-free (the exact GELU and its derivative over
/// blocks vectorize): `Phi(-w) = e^(-w^2 / 2) t P(t)` with the fit
/// [`NORMAL_TAIL`], and `e^(-w^2 / 2)` from the exact split `w^2 = hi^2 +
/// lo (w + hi)` (`hi` the top 12 bits of `w`) and `exp_f32`'s reduction
/// taking the low part in its reduced argument, so the square's rounding
/// (36 ulps at `w = 12`) never reaches the result: relative accuracy of a
/// few ulps down into the subnormals. Past [`NORMAL_W_MAX`], at infinity
/// and at NaN the mantissas are 0 (so `x * m` is NaN at `±inf` and NaN,
/// `-0` for large negative `x`); NaN is left to the caller's `x`.
#[inline(always)]
pub(crate) fn normal_parts(x: f32) -> NormalParts {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23, as in `exp_reduced`.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let w = x.abs();
    let inside = w <= NORMAL_W_MAX; // false for NaN
    let w = if inside { w } else { NORMAL_W_MAX };
    let t = 1.0 / (1.0 + NORMAL_Q * w);
    // Estrin's scheme: a dependency chain of 5 steps instead of Horner's
    // 18 (the kernel is bound by latency, not by the count of operations).
    let c = NORMAL_TAIL;
    let (t2, t4) = (t * t, (t * t) * (t * t));
    let p01 = c[0] + c[1] * t;
    let p23 = c[2] + c[3] * t;
    let p45 = c[4] + c[5] * t;
    let p67 = c[6] + c[7] * t;
    let p89 = c[8] + c[9] * t;
    let p03 = p01 + p23 * t2;
    let p47 = p45 + p67 * t2;
    let p = (p03 + p47 * t4) + p89 * (t4 * t4);
    // -w^2 / 2 = e_hi + e_lo, e_hi exact (12-bit hi squared, halved).
    let hi = f32::from_bits(w.to_bits() & 0xffff_f000);
    let lo = w - hi;
    let e_hi = -0.5 * (hi * hi);
    let e_lo = -0.5 * (lo * (w + hi));
    // e^(e_hi + e_lo) = 2^n e^r; e_hi - n ln2_hi is exact (Cody-Waite).
    let tn = e_hi * std::f32::consts::LOG2_E + MAGIC;
    let n = tn - MAGIC;
    let ni = (tn.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let r = (e_hi - n * LN2_HI) - n * LN2_LO + e_lo;
    // `exp_reduced`'s polynomial, by Estrin's scheme as above.
    let r2 = r * r;
    let q45 = 1.398_199_9e-3 + 1.987_569_1e-4_f32 * r;
    let q23 = 4.166_579_6e-2 + 8.333_452e-3 * r;
    let q01 = 0.5 + 1.666_666_5e-1 * r;
    let q = (q01 + q23 * r2) + q45 * (r2 * r2);
    let e = q * r2 + r + 1.0;
    let e = if inside { e } else { 0.0 };
    // -161 <= n <= 0 (w <= 14.9): 2^n as the normal 2^(n + 64) times a
    // constant 2^-64, the second step the only one that can round.
    NormalParts {
        m: t * p * e,
        e,
        s1: f32::from_bits((ni.wrapping_add(127 + 64) as u32) << 23),
        s2: f32::from_bits((127 - 64) << 23),
    }
}

/// `tanh(x)` for `f32` within a few ulps, branch-free: an odd minimax
/// polynomial (Cephes) below `|x| = 0.625`, where `1 - 2/(e^{2x} + 1)` would
/// cancel, and that expression above it (saturating to 1 once `e^{2x}`
/// overflows). The sign is copied back, so `tanh(-0) = -0`; NaN stays NaN.
#[inline(always)]
pub(crate) fn tanh_f32(x: f32) -> f32 {
    let a = x.abs();
    let z = a * a;
    let mut p = -5.704_988_7e-3_f32;
    p = p * z + 2.063_909e-2;
    p = p * z - 5.373_971_6e-2;
    p = p * z + 1.333_144_2e-1;
    p = p * z - 3.333_328e-1;
    let small = a + a * (z * p);
    let large = 1.0 - 2.0 / (exp_f32(a + a) + 1.0);
    (if a < 0.625 { small } else { large }).copysign(x)
}

/// The logistic sigmoid `1 / (1 + e^-x)`: 0 at `-inf`, 1 at `+inf`, relative
/// accuracy of a few ulps everywhere (no cancellation on either side).
#[inline(always)]
pub(crate) fn sigmoid_f32(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

#[cfg(test)]
mod tests {
    use super::{exp_f32, exp_softmax, sigmoid_f32, tanh_f32};

    #[test]
    fn exp_matches_std() {
        let mut worst = 0.0f64;
        let mut x = -104.0f32;
        while x < 88.7 {
            let want = (x as f64).exp();
            let got = exp_f32(x) as f64;
            if want > f32::MIN_POSITIVE as f64 {
                worst = worst.max(((got - want) / want).abs());
            } else {
                assert!(
                    (got - want).abs() <= 2.0 * 1.5e-45,
                    "x={x} got={got} want={want}"
                );
            }
            x += 0.0137;
        }
        assert!(worst < 3.0 * f32::EPSILON as f64, "worst rel err {worst}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(88.5), (88.5f64).exp() as f32);
        let mut x = -87.3f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = exp_softmax(x) as f64;
            assert!(
                ((got - want) / want).abs() < 3.0 * f32::EPSILON as f64,
                "x={x}"
            );
            x += 0.0173;
        }
        assert_eq!(exp_softmax(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_softmax(-100.0), 0.0);
        assert!(exp_softmax(f32::NAN).is_nan());
    }

    #[test]
    fn tanh_and_sigmoid_match_std() {
        let mut worst = (0.0f64, 0.0f64);
        let mut x = -30.0f32;
        while x < 30.0 {
            let t = (x as f64).tanh();
            let s = 1.0 / (1.0 + (-(x as f64)).exp());
            let rel = |got: f32, want: f64| ((got as f64 - want) / want).abs();
            if t != 0.0 {
                worst.0 = worst.0.max(rel(tanh_f32(x), t));
            }
            worst.1 = worst.1.max(rel(sigmoid_f32(x), s));
            x += 0.000_731;
        }
        for x in [1e-30f32, 1e-6, 0.3, 0.624, 0.626, 5.0] {
            let want = (x as f64).tanh();
            worst.0 = worst.0.max(((tanh_f32(x) as f64 - want) / want).abs());
        }
        assert!(
            worst.0 < 4.0 * f32::EPSILON as f64,
            "tanh worst {}",
            worst.0
        );
        assert!(
            worst.1 < 4.0 * f32::EPSILON as f64,
            "sigmoid worst {}",
            worst.1
        );
        assert_eq!(tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
        assert_eq!(tanh_f32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert!(tanh_f32(f32::NAN).is_nan() && sigmoid_f32(f32::NAN).is_nan());
        assert_eq!(sigmoid_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(sigmoid_f32(f32::INFINITY), 1.0);
    }
}

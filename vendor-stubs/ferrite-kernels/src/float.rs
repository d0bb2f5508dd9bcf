//! The natively computed floating-point types (`f32`, `f64`) behind one small
//! trait so arithmetic kernels can be written once, plus an `exp` for `f32`
//! built only from operations the compiler can vectorize.

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
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer.
    const LN2_HI: f32 = 0.693_359_4; // 355/512, exact in few bits.
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Clamp to where the result saturates (NaN stays NaN).
    let x = x.clamp(-105.0, 89.0);
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
    let y = p * r * r + r + 1.0;
    let n1 = ni >> 1;
    let n2 = ni.wrapping_sub(n1);
    let s1 = f32::from_bits((n1.wrapping_add(127) as u32) << 23);
    let s2 = f32::from_bits((n2.wrapping_add(127) as u32) << 23);
    y * s1 * s2
}

#[cfg(test)]
mod tests {
    use super::exp_f32;

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
    }
}

//! Correctly rounded scalar conversions between the float formats: `f16`
//! and `bf16` from `f32` (round to nearest even, branch-free so loops over
//! them vectorize) and back (exact), and `f64` to `f16`/`bf16` with a single
//! rounding: the `f64` is first rounded to `f32` with round-to-odd, which
//! makes the second (RNE) rounding exact.

use half::{bf16, f16};

/// Rounds an `f64` to `f32` with round-to-odd (truncate, then set the last
/// bit if anything was discarded). Followed by an RNE rounding to a format of
/// at most 22 significant bits, it yields the correctly rounded result.
#[inline]
pub(crate) fn f64_to_f32_odd(x: f64) -> f32 {
    let r = x as f32;
    if r as f64 == x || x.is_nan() {
        return r;
    }
    let toward_zero = if (r as f64).abs() > x.abs() {
        // |r| > 0 here, so decrementing the bit pattern shrinks the magnitude.
        f32::from_bits(r.to_bits() - 1)
    } else {
        r
    };
    f32::from_bits(toward_zero.to_bits() | 1)
}

/// `f64` to `f16`, correctly rounded (RNE).
#[inline]
pub fn f16_from_f64(x: f64) -> f16 {
    f16::from_f32(f64_to_f32_odd(x))
}

/// `f64` to `bf16`, correctly rounded (RNE).
#[inline]
pub fn bf16_from_f64(x: f64) -> bf16 {
    bf16::from_bits(bf16_bits_from_f32(f64_to_f32_odd(x)))
}

/// `f32` to `bf16` bits, RNE, NaN kept quiet; branch-free so it vectorizes.
#[inline(always)]
pub(crate) fn bf16_bits_from_f32(v: f32) -> u16 {
    let x = v.to_bits();
    let rounded = x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16;
    let nan = (x >> 16) | 0x40;
    (if x & 0x7FFF_FFFF > 0x7F80_0000 {
        nan
    } else {
        rounded
    }) as u16
}

/// `f32` to `f16` bits, RNE, overflow to infinity, NaN to the quiet NaN
/// `0x7E00` (sign kept); branch-free so it vectorizes (after F. Giesen's
/// `float_to_half_fast3_rtne`).
#[inline(always)]
pub(crate) fn f16_bits_from_f32(v: f32) -> u16 {
    const DENORM_MAGIC: u32 = ((127 - 15) + (23 - 10) + 1) << 23;
    let x = v.to_bits();
    let sign = x & 0x8000_0000;
    let a = x ^ sign;
    // Result subnormal or zero: let an f32 addition do the RNE shift.
    let sub = (f32::from_bits(a) + f32::from_bits(DENORM_MAGIC))
        .to_bits()
        .wrapping_sub(DENORM_MAGIC);
    // Normal result: rebias, add the rounding bias, truncate (a carry out of
    // the mantissa correctly bumps the exponent, up to infinity).
    let mant_odd = (a >> 13) & 1;
    let norm = a.wrapping_sub(112 << 23).wrapping_add(0xFFF + mant_odd) >> 13;
    let special = if a > 0x7F80_0000 { 0x7E00 } else { 0x7C00 };
    let r = if a >= (143 << 23) {
        special
    } else if a < (113 << 23) {
        sub
    } else {
        norm
    };
    (r | (sign >> 16)) as u16
}

/// `f16` bits to `f32` (exact); branch-free so it vectorizes.
#[inline(always)]
pub(crate) fn f16_bits_to_f32(h: u16) -> f32 {
    const SHIFTED_EXP: u32 = 0x7C00 << 13;
    let o = ((h & 0x7FFF) as u32) << 13;
    let exp = o & SHIFTED_EXP;
    let base = o + (112 << 23);
    let special = base + (112 << 23);
    let denorm = (f32::from_bits(base + (1 << 23)) - f32::from_bits(113 << 23)).to_bits();
    let r = if exp == SHIFTED_EXP {
        special
    } else if exp == 0 {
        denorm
    } else {
        base
    };
    f32::from_bits(r | (((h & 0x8000) as u32) << 16))
}

/// `bf16` bits to `f32` (exact).
#[inline(always)]
pub(crate) fn bf16_bits_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_matches_half_crate() {
        let mut bits: u32 = 0;
        loop {
            let v = f32::from_bits(bits);
            let ours = bf16_bits_from_f32(v);
            let theirs = bf16::from_f32(v).to_bits();
            assert_eq!(ours, theirs, "bits {bits:#x}");
            bits = match bits.checked_add(0x0001_2345) {
                Some(b) => b,
                None => break,
            };
        }
    }

    #[test]
    fn f16_matches_half_crate() {
        for h in 0..=u16::MAX {
            let ours = f16_bits_to_f32(h);
            let theirs = f16::from_bits(h).to_f32();
            if theirs.is_nan() {
                assert!(ours.is_nan(), "bits {h:#x}");
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "bits {h:#x}");
            }
        }
        let mut bits: u32 = 0;
        loop {
            for b in [
                bits,
                bits | 0x1000,
                bits | 0x0FFF,
                bits | 0x2000,
                bits & !0x1FFF,
            ] {
                let v = f32::from_bits(b);
                let ours = f16_bits_from_f32(v);
                let theirs = f16::from_f32(v);
                if v.is_nan() {
                    assert!(f16::from_bits(ours).is_nan(), "bits {b:#x}");
                } else {
                    assert_eq!(ours, theirs.to_bits(), "bits {b:#x} ({v:e})");
                }
            }
            bits = match bits.checked_add(0x0000_3457) {
                Some(b) => b,
                None => break,
            };
        }
    }

    #[test]
    fn f64_narrowing_is_single_rounding() {
        // 1 + 2^-11 + 2^-40 lies just above the f16 tie between 1 and 1+2^-10:
        // double rounding through f32 would give 1.0.
        let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(f16_from_f64(x).to_bits(), 0x3C01);
        let y = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
        assert_eq!(bf16_from_f64(y).to_bits(), 0x3F81);
        // Exact ties still go to even.
        assert_eq!(f16_from_f64(1.0 + 2f64.powi(-11)).to_bits(), 0x3C00);
        assert_eq!(bf16_from_f64(1.0 + 2f64.powi(-8)).to_bits(), 0x3F80);
        assert_eq!(f16_from_f64(1e10).to_bits(), 0x7C00);
        assert_eq!(bf16_from_f64(1e300).to_bits(), 0x7F80);
        assert_eq!(bf16_from_f64(-1e300).to_bits(), 0xFF80);
        assert_eq!(f16_from_f64(1e-300).to_bits(), 0);
        assert_eq!(f16_from_f64(-1e-300).to_bits(), 0x8000);
        assert!(f16_from_f64(f64::NAN).is_nan());
        assert!(bf16_from_f64(f64::NAN).is_nan());
        // Agrees with the direct f32 path whenever f64 -> f32 is exact.
        for v in [0.1f32, 3.25, 65504.0, 65520.0, 1e-7, -2.5e-5, 1e38] {
            assert_eq!(f16_from_f64(v as f64), f16::from_f32(v));
            assert_eq!(bf16_from_f64(v as f64), bf16::from_f32(v));
        }
    }
}

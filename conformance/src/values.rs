//! Values as the suite handles them: f64 numbers rounded to a dtype, their
//! bytes on a device, the poison pattern written into outputs, and the
//! dtype's unit roundoff and ULP.
//!
//! The rounding here is the suite's own (round-to-odd to f32, then the
//! `half` crate's round-to-nearest-even from f32, which is exact), so it
//! shares nothing with any plugin's conversion code.

use half::{bf16, f16};
use polychip_host::DType;

/// `x` rounded to f32 with round-to-odd: correct as a first step of a
/// double rounding to a narrower format.
fn f32_round_to_odd(x: f64) -> f32 {
    let nearest = x as f32;
    if !x.is_finite() || f64::from(nearest) == x || nearest.to_bits() & 1 == 1 {
        return nearest;
    }
    // The two f32 neighbours of x are adjacent; the odd one is the result.
    let toward = if f64::from(nearest) > x { -1i32 } else { 1 };
    let bits = nearest.to_bits() as i32;
    let step = if nearest.is_sign_negative() {
        -toward
    } else {
        toward
    };
    f32::from_bits((bits + step) as u32)
}

/// `x` rounded to nearest-even in `dtype`, back in f64. Integers truncate
/// toward zero (values the suite generates are already integral).
pub fn round_to(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F64 => x,
        DType::F32 => f64::from(x as f32),
        DType::F16 => f64::from(f16::from_f32(f32_round_to_odd(x))),
        DType::BF16 => f64::from(bf16::from_f32(f32_round_to_odd(x))),
        DType::I32 => f64::from(x as i32),
        DType::I64 => (x as i64) as f64,
        DType::U8 => f64::from(x as u8),
        DType::Bool => f64::from(u8::from(x != 0.0)),
    }
}

/// Native-endian bytes of `values` in `dtype` (rounding as [`round_to`]).
pub fn to_bytes(dtype: DType, values: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size());
    to_bytes_into(dtype, values, &mut out);
    out
}

/// [`to_bytes`] appended to `out`.
pub fn to_bytes_into(dtype: DType, values: &[f64], out: &mut Vec<u8>) {
    // One loop per dtype (the dtype matched once, not per element).
    fn each<const N: usize>(values: &[f64], out: &mut Vec<u8>, f: impl Fn(f64) -> [u8; N]) {
        out.reserve(values.len() * N);
        for &x in values {
            out.extend_from_slice(&f(x));
        }
    }
    match dtype {
        DType::F64 => each(values, out, f64::to_ne_bytes),
        DType::F32 => each(values, out, |x| (x as f32).to_ne_bytes()),
        DType::F16 => each(values, out, |x| {
            f16::from_f32(f32_round_to_odd(x)).to_ne_bytes()
        }),
        DType::BF16 => each(values, out, |x| {
            bf16::from_f32(f32_round_to_odd(x)).to_ne_bytes()
        }),
        DType::I32 => each(values, out, |x| (x as i32).to_ne_bytes()),
        DType::I64 => each(values, out, |x| (x as i64).to_ne_bytes()),
        DType::U8 => each(values, out, |x| [x as u8]),
        DType::Bool => each(values, out, |x| [u8::from(x != 0.0)]),
    }
}

/// Decodes native-endian bytes of `dtype` into f64 values.
pub fn from_bytes(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    let chunks = bytes.chunks_exact(dtype.size());
    match dtype {
        DType::F64 => chunks
            .map(|c| f64::from_ne_bytes(c.try_into().unwrap()))
            .collect(),
        DType::F32 => chunks
            .map(|c| f64::from(f32::from_ne_bytes(c.try_into().unwrap())))
            .collect(),
        DType::F16 => chunks
            .map(|c| f64::from(f16::from_ne_bytes(c.try_into().unwrap())))
            .collect(),
        DType::BF16 => chunks
            .map(|c| f64::from(bf16::from_ne_bytes(c.try_into().unwrap())))
            .collect(),
        DType::I32 => chunks
            .map(|c| f64::from(i32::from_ne_bytes(c.try_into().unwrap())))
            .collect(),
        DType::I64 => chunks
            .map(|c| i64::from_ne_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        DType::U8 | DType::Bool => bytes.iter().map(|&b| f64::from(b)).collect(),
    }
}

/// The byte written into every output element before a call: all ones,
/// which is a NaN in every floating dtype and -1 in every signed integer,
/// so an element the plugin leaves unwritten is recognisable.
pub const POISON_BYTE: u8 = 0xFF;

/// The byte outputs are filled with instead in the cases that ask for a
/// finite poison (`Case::finite_poison`): a large finite value in every
/// floating dtype (about 1.3e36 in f32 and bf16, 61,280 in f16, 1e286 in
/// f64).
pub const FINITE_POISON_BYTE: u8 = 0x7B;

/// Unit roundoff (half an ULP of 1) of a floating dtype; 0 for integers.
pub fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 2f64.powi(-53),
        DType::F32 => 2f64.powi(-24),
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        _ => 0.0,
    }
}

/// The spacing of `dtype` values at `x` (the ULP), counting subnormals.
pub fn ulp(dtype: DType, x: f64) -> f64 {
    let (mantissa_bits, min_exp) = match dtype {
        DType::F64 => (52, -1022),
        DType::F32 => (23, -126),
        DType::F16 => (10, -14),
        DType::BF16 => (7, -126),
        _ => return 1.0,
    };
    let x = x.abs();
    let e = if x == 0.0 || !x.is_finite() {
        min_exp
    } else {
        // The binary exponent, floor(log2 x), read from the bits (an f64
        // subnormal reads as -1023, below every format's min_exp).
        let biased = ((x.to_bits() >> 52) & 0x7ff) as i32;
        (biased - 1023).max(min_exp)
    };
    let spacing = e - mantissa_bits;
    if spacing >= -1022 {
        f64::from_bits(((spacing + 1023) as u64) << 52)
    } else {
        // Two factors: 2^(e - mantissa_bits) alone underflows for f64 subnormals.
        2f64.powi(e) * 2f64.powi(-mantissa_bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_correct_where_double_rounding_would_not_be() {
        // Just above a tie in f16: rounding through f32 with RNE would lose
        // the 2^-40 and round the tie down to 1.0.
        let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(round_to(DType::F16, x), 1.0 + 2f64.powi(-10));
        assert_eq!(round_to(DType::F16, -x), -(1.0 + 2f64.powi(-10)));
        assert_eq!(
            round_to(DType::BF16, 1.0 + 2f64.powi(-8)),
            1.0,
            "a tie goes to even"
        );
        assert_eq!(
            round_to(DType::BF16, 1.0 + 3.0 * 2f64.powi(-8)),
            1.0 + 2f64.powi(-6)
        );
        assert!(round_to(DType::F16, 1e6).is_infinite());
    }

    #[test]
    fn bytes_round_trip_and_poison_is_nan() {
        for dtype in DType::ALL {
            let values = [0.0, 1.0, -2.0, 3.0];
            let back = from_bytes(dtype, &to_bytes(dtype, &values));
            let expected: Vec<f64> = values.iter().map(|&v| round_to(dtype, v)).collect();
            assert_eq!(back, expected, "{dtype}");
        }
        for dtype in DType::FLOATS {
            assert!(from_bytes(dtype, &vec![POISON_BYTE; dtype.size()])[0].is_nan());
        }
    }

    #[test]
    fn ulp_from_the_bits_matches_the_definition() {
        let mut x = 1.0e-300f64;
        while x < 1.0e300 {
            for dtype in DType::FLOATS {
                let (m, min_exp) = match dtype {
                    DType::F64 => (52, -1022),
                    DType::F32 => (23, -126),
                    DType::F16 => (10, -14),
                    _ => (7, -126),
                };
                let e = (x.log2().floor() as i32).max(min_exp);
                let want = 2f64.powi(e) * 2f64.powi(-m);
                assert_eq!(ulp(dtype, x), want, "{dtype} {x}");
                assert_eq!(ulp(dtype, -x), want, "{dtype} -{x}");
            }
            x *= 3.7;
        }
        assert_eq!(ulp(DType::F64, f64::from_bits(1)), f64::from_bits(1));
    }

    #[test]
    fn ulps() {
        assert_eq!(ulp(DType::F32, 1.0), 2f64.powi(-23));
        assert_eq!(ulp(DType::BF16, 3.0), 2f64.powi(-6));
        assert_eq!(ulp(DType::F16, 0.0), 2f64.powi(-24));
    }
}

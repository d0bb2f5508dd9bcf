//! `cast` between the float dtypes: exact round-to-nearest-even results,
//! checked against an independent nearest-value search.

mod common;

use common::{FLOATS, Layout, Tensor};
use ferrite_kernels::{DType, cast};
use half::{bf16, f16};

/// All non-negative finite values of a 16-bit format plus its "next" value
/// past the maximum (standing for infinity), sorted.
fn grid(dt: DType) -> Vec<f64> {
    let (to_f64, max_bits, next): (fn(u16) -> f64, u16, f64) = match dt {
        DType::F16 => (|b| f16::from_bits(b).to_f64(), 0x7BFF, 65536.0),
        _ => (|b| bf16::from_bits(b).to_f64(), 0x7F7F, 2f64.powi(128)),
    };
    let mut v: Vec<f64> = (0..=max_bits).map(to_f64).collect();
    v.push(next);
    v
}

/// Independent RNE reference for f64 -> 16-bit formats (bits of the result).
fn reference_bits(dt: DType, x: f64, grid: &[f64]) -> u16 {
    let inf = if dt == DType::F16 { 0x7C00u16 } else { 0x7F80 };
    let sign = if x.is_sign_negative() { 0x8000u16 } else { 0 };
    if x.is_nan() {
        return 0xFFFF;
    }
    let a = x.abs();
    if a >= *grid.last().unwrap() {
        return sign | inf;
    }
    let hi = grid.partition_point(|&g| g < a);
    if grid[hi] == a {
        return sign | hi as u16;
    }
    let lo = hi - 1;
    let (dl, dh) = (a - grid[lo], grid[hi] - a);
    let pick = if dl < dh || (dl == dh && lo % 2 == 0) {
        lo
    } else {
        hi
    };
    sign | pick as u16
}

fn interesting_f64() -> Vec<f64> {
    let mut v = vec![
        0.0, -0.0, 1.0, -1.5, 65504.0, 65519.99, 65520.0, 1e-8, 6e-8, 3e-5, 1e38, 3.4e38, 3.5e38,
        1e-40, 1e-45,
    ];
    v.extend([f64::INFINITY, f64::NEG_INFINITY, f64::NAN]);
    // Values just around 16-bit ties, where double rounding would go wrong.
    for e in [-20i32, -3, 0, 7, 14] {
        let s = 2f64.powi(e);
        for tie in [2f64.powi(-11), 2f64.powi(-8)] {
            for d in [-2f64.powi(-40), 0.0, 2f64.powi(-40)] {
                v.push(s * (1.0 + tie + d));
                v.push(-s * (1.0 + 3.0 * tie + d));
            }
        }
    }
    for i in 0..2000 {
        v.push(common::rnd(11, i) * 10f64.powi((i % 13) as i32 - 6));
    }
    v
}

#[test]
fn f64_to_half_is_correctly_rounded() {
    let xs = interesting_f64();
    for dt in [DType::F16, DType::BF16] {
        let g = grid(dt);
        let mut src = Tensor::new(DType::F64, &[xs.len() as i64], &Layout::contiguous());
        for (i, &x) in xs.iter().enumerate() {
            src.set_bits(i, x.to_bits());
        }
        let mut dst = Tensor::new(dt, &[xs.len() as i64], &Layout::flipped(&[0]));
        // SAFETY: distinct buffers owned by the test.
        unsafe { cast(&src.view(), &dst.view()).unwrap() };
        for (i, &x) in xs.iter().enumerate() {
            let got = dst.bits(i) as u16;
            let want = reference_bits(dt, x, &g);
            if x.is_nan() {
                assert!(dst.get(i).is_nan(), "{dt:?} NaN");
            } else {
                assert_eq!(
                    got, want,
                    "{dt:?} from {x:e}: got {got:#06x} want {want:#06x}"
                );
            }
        }
    }
}

#[test]
fn f32_to_half_specific_bit_patterns() {
    let cases: [(u32, DType, u16); 10] = [
        (0x3F80_8000, DType::BF16, 0x3F80), // tie, to even
        (0x3F81_8000, DType::BF16, 0x3F82), // tie, to even (up)
        (0x3F80_8001, DType::BF16, 0x3F81), // above the tie
        (0x7F7F_FFFF, DType::BF16, 0x7F80), // max f32 rounds up to inf
        (0x4780_0000, DType::F16, 0x7C00),  // 65536 -> inf
        (0x477F_F000, DType::F16, 0x7C00),  // 65520 (tie) -> inf
        (0x477F_EFFF, DType::F16, 0x7BFF),  // just below -> 65504
        (0x3F80_1000, DType::F16, 0x3C00),  // 1 + 2^-11 tie -> 1
        (0x3F80_3000, DType::F16, 0x3C02),  // 1 + 3*2^-11 tie -> even up
        (0xC780_0000, DType::F16, 0xFC00),  // -65536 -> -inf
    ];
    for (bits, dt, want) in cases {
        let mut src = Tensor::new(DType::F32, &[1], &Layout::contiguous());
        src.set_bits(0, bits as u64);
        let mut dst = Tensor::new(dt, &[1], &Layout::contiguous());
        // SAFETY: distinct buffers owned by the test.
        unsafe { cast(&src.view(), &dst.view()).unwrap() };
        assert_eq!(dst.bits(0) as u16, want, "{bits:#010x} -> {dt:?}");
    }
    for dt in [DType::F16, DType::BF16] {
        let mut src = Tensor::new(DType::F32, &[2], &Layout::contiguous());
        src.set_bits(0, 0x7FC0_0000);
        src.set_bits(1, 0xFF80_0001); // signalling NaN
        let mut dst = Tensor::new(dt, &[2], &Layout::contiguous());
        // SAFETY: distinct buffers owned by the test.
        unsafe { cast(&src.view(), &dst.view()).unwrap() };
        assert!(
            dst.get(0).is_nan() && dst.get(1).is_nan(),
            "{dt:?} NaN must stay NaN"
        );
    }
}

#[test]
fn all_pairs_all_layouts_match_reference() {
    let shapes: [&[i64]; 5] = [&[0], &[7], &[3, 1, 5], &[2, 0, 3], &[130, 600]];
    let (g16, gb16) = (grid(DType::F16), grid(DType::BF16));
    for s in FLOATS {
        for d in FLOATS {
            for shape in shapes {
                let r = shape.len();
                for (sl, dl) in [
                    (Layout::contiguous(), Layout::contiguous()),
                    (Layout::transposed(r), Layout::contiguous()),
                    (Layout::contiguous(), Layout::messy(r)),
                    (Layout::messy(r), Layout::padded(1)),
                ] {
                    let mut src = Tensor::from_fn(s, shape, &sl, |i| common::rnd(5, i) * 100.0);
                    let mut dst = Tensor::new(d, shape, &dl);
                    // SAFETY: distinct buffers owned by the test.
                    unsafe { cast(&src.view(), &dst.view()).unwrap() };
                    for i in 0..src.numel() {
                        let x = src.get(i);
                        let want = match d {
                            DType::F64 => x,
                            DType::F32 => x as f32 as f64,
                            DType::F16 => f16::from_bits(reference_bits(d, x, &g16)).to_f64(),
                            _ => bf16::from_bits(reference_bits(d, x, &gb16)).to_f64(),
                        };
                        assert_eq!(dst.get(i), want, "{s:?}->{d:?} {shape:?} elem {i}");
                    }
                }
            }
        }
    }
}

#[test]
fn cast_rejects_integers() {
    let mut src = Tensor::new(DType::I32, &[2], &Layout::contiguous());
    let mut dst = Tensor::new(DType::F32, &[2], &Layout::contiguous());
    // SAFETY: distinct buffers owned by the test.
    let r = unsafe { cast(&src.view(), &dst.view()) };
    assert!(r.is_err());
}

//! SIMD parity test support: awkward data (normal, subnormal-range, huge,
//! zero, infinite and NaN values) and NaN-normalised element bits.

use super::{Layout, Tensor};
use ferrite_kernels::{DType, set_simd_enabled};

/// Data with normal, subnormal-range, huge, zero, infinite and NaN values
/// (specials only in some stretches, so most softmax rows stay finite).
pub fn awkward(dt: DType, shape: &[i64], layout: &Layout, seed: u64) -> Tensor {
    let specials = [
        0.0,
        -0.0,
        1e-6,
        -3e-5,
        6e4,
        7e4,
        1e30,
        f64::INFINITY,
        f64::NAN,
        1e-40,
    ];
    Tensor::from_fn(dt, shape, layout, |i| {
        if i % 7 == 3 && (i / 256) % 3 == 0 {
            specials[(i / 7) % specials.len()]
        } else {
            super::rnd(seed, i) * 40.0
        }
    })
}

/// Element bits, with every NaN mapped to one value (NaN sign and payload
/// depend on operand order, which the compiler may choose differently).
pub fn bits(t: &Tensor) -> Vec<u64> {
    (0..t.numel())
        .map(|i| {
            if t.get(i).is_nan() {
                u64::MAX
            } else {
                t.bits(i)
            }
        })
        .collect()
}

/// Runs `f` with and without the AVX2 paths on fresh outputs and asserts
/// that every output tensor is bit-identical both ways.
pub fn both_ways_all(what: &str, mut f: impl FnMut() -> Vec<Tensor>) {
    set_simd_enabled(true);
    let fast: Vec<Vec<u64>> = f().iter().map(bits).collect();
    set_simd_enabled(false);
    let base: Vec<Vec<u64>> = f().iter().map(bits).collect();
    set_simd_enabled(true);
    for (k, (x, y)) in fast.iter().zip(&base).enumerate() {
        if let Some(i) = x.iter().zip(y).position(|(a, b)| a != b) {
            panic!(
                "{what}: output {k} element {i}: SIMD {:#x} vs baseline {:#x}",
                x[i], y[i]
            );
        }
    }
}

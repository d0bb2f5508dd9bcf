//! How close a plugin's output must be to the reference: one rule, derived
//! from the output dtype's unit roundoff and the operator's accumulation
//! length, never a magic number per test.
//!
//! A plugin's output element `got` passes against the reference `want` when
//!
//! ```text
//! |got - want| <= rtol * (|want| + scale)      rtol = k * u(out) + c * n * u(acc)
//! ```
//!
//! - `u(out)` is the output dtype's unit roundoff: the final rounding;
//! - `k` counts the roundings and ULP-level errors of the operator's own
//!   arithmetic (1 for a correctly rounded elementwise op, a few for
//!   transcendental functions, more for composite kernels such as attention);
//! - `n` is the accumulation length (a matmul's K, a reduction's extent) and
//!   `u(acc)` the unit roundoff of the accumulator (f32 for f32, f16 and bf16;
//!   f64 for f64), with `c = 2`, the usual worst-case constant of summation
//!   error;
//! - `scale` is the root-mean-square of the expected tensor, so that an
//!   element that cancels to nearly zero is judged on the tensor's magnitude
//!   rather than its own.
//!
//! Exact operators (copy, cast, fill, neg, relu, argmax, embedding lookup)
//! have `k = n = 0`: the bits must match. NaN must meet NaN and an infinity
//! the same infinity.

use polychip_host::DType;

use crate::values::unit_roundoff;

/// An operator's error model for one case.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// ULP-level errors of the operator's arithmetic, in units of the output
    /// dtype's unit roundoff.
    pub k: f64,
    /// Accumulation length.
    pub n: usize,
}

impl Tolerance {
    /// Bit-exact.
    pub const EXACT: Tolerance = Tolerance { k: 0.0, n: 0 };

    /// `k` roundings, no accumulation.
    pub const fn ulps(k: f64) -> Tolerance {
        Tolerance { k, n: 0 }
    }

    /// `k` roundings and an accumulation over `n` terms.
    pub const fn sum(k: f64, n: usize) -> Tolerance {
        Tolerance { k, n }
    }

    /// The relative tolerance for an output of `dtype` (see the module docs),
    /// times a vendor's loosening factor (1 when none).
    pub fn rtol(&self, dtype: DType, factor: f64) -> f64 {
        let acc = if dtype == DType::F64 {
            unit_roundoff(DType::F64)
        } else {
            unit_roundoff(DType::F32)
        };
        factor * (self.k * unit_roundoff(dtype) + 2.0 * self.n as f64 * acc)
    }
}

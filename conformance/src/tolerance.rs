//! How close a plugin's output must be to the reference: one error model,
//! with coefficients derived per operator family from what a correct kernel
//! must do, never a magic number per test.
//!
//! Every element is judged against the *exact* (unrounded, f64) reference
//! value `x`. The plugin's `got` passes when `|got - x| <= allowed(x)`, with
//!
//! ```text
//! allowed(x) = round * ulp_out(x)                                  final rounding
//!            + (rel * u(acc) + low * u(out)) * |x|                 relative to the element
//!            + (low * u(out) + 2 * n * u(acc)) * scale             relative to the tensor
//! ```
//!
//! - `ulp_out(x)` is the spacing of the output dtype at `x` (subnormals
//!   included), so `round = 0.5` is "correctly rounded": the exact value
//!   rounded to nearest lands within half an ULP of it;
//! - `u(out)` is the output dtype's unit roundoff (2^-24 f32, 2^-11 f16,
//!   2^-8 bf16, 2^-53 f64) and `u(acc)` the accumulator's: f32's for f32,
//!   f16 and bf16, f64's for f64 ("computed in at least f32");
//! - `rel` counts the computation's own errors relative to the element, in
//!   units of `u(acc)`: a correctly rounded f32 operation whose result is then
//!   rounded to bf16 or f16 is off by `u(f32) |x|` before the final rounding
//!   (the double rounding), an f32 `exp` by a few `u(f32) |x|`;
//! - `low` counts intermediates that a correct kernel may legitimately round
//!   to the output dtype (attention's probabilities in bf16 before the
//!   product with V, an accumulator stored in bf16 after each update), each
//!   an error of `u(out)` relative to the element and to the tensor;
//! - `n` is the accumulation length (a matmul's K, a reduction's extent, the
//!   terms of a formula that cancels): `2 n' u(acc)` relative to `|x| +
//!   scale`, where `n' = min(n, 8 sqrt(n))` is the probabilistic bound of
//!   [`Tolerance::effective_length`] (the worst case `n` for short sums, the
//!   bound that holds with probability 1 - 2.5e-14 for long ones);
//! - `scale` is the root-mean-square of the exact tensor, so that an element
//!   that cancels to nearly zero is judged on the magnitude of what was
//!   summed rather than its own. It appears only with `low` or `n`: an
//!   elementwise operator is judged on each element alone.
//!
//! When every term but `round <= 0.5` is zero the operator is a pure
//! rounding (copy, cast, fill, neg, relu, max, embedding, scaling by a power
//! of two): `got` must then be exactly the exact value rounded to nearest,
//! ties to even, in the output dtype, so a tie rounded the wrong way,
//! truncation, or a double rounding through f32 fails.
//!
//! For an in-place update named in `change_relative` (AdamW's parameter)
//! the relative terms use the size of the change, `|x - before|`, in place
//! of `|x|`: the step must be right relative to the step, not to the
//! parameter, so a missing weight decay or bias correction shows even when
//! the update is far below the parameter's own precision.
//!
//! NaN must meet NaN and an infinity the same infinity; a finite exact
//! value may come out as an infinity only when `|x| + allowed(x)` reaches
//! the dtype's overflow threshold.
//!
//! Separately, [`crate::compare::bias_failure`] tests the mean signed error
//! of an output for a systematic bias where `bias` says a correct kernel is
//! unbiased (see [`Bias`]).

use polychip_host::DType;

use crate::values::unit_roundoff;

/// Where a correct kernel's errors average to zero, so that a mean signed
/// error far beyond rounding noise is a bug (truncation, a wrong formula
/// that errs one way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bias {
    /// Never tested (composite kernels, pure roundings that are bit-exact
    /// anyway).
    Never,
    /// Tested where the output is narrower than the accumulator (bf16 and
    /// f16 outputs of a computation in f32): the final rounding dominates and
    /// round-to-nearest is unbiased, whatever the f32 algorithm.
    LowPrecision,
    /// Tested in every dtype: the operator is correctly rounded in each.
    Always,
}

/// An operator's error model for one case (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// The final rounding, in ULPs of the output dtype at the exact value.
    pub round: f64,
    /// The computation's own error relative to the element, in `u(acc)`.
    pub rel: f64,
    /// Intermediates rounded to the output dtype, in `u(out)`, relative to
    /// the element and to the tensor's scale.
    pub low: f64,
    /// Accumulation length: `2 n u(acc)` relative to `|x| + scale`.
    pub n: usize,
    /// Where the bias test applies.
    pub bias: Bias,
    /// In-place outputs whose relative error is judged against their change.
    pub change_relative: &'static [&'static str],
    /// Whether an exact zero's sign is judged where the operator is a pure
    /// rounding (see `compare`): false where the ABI leaves it open.
    pub zero_sign: bool,
}

impl Tolerance {
    /// A pure rounding: exactly the exact value rounded to nearest-even in
    /// the output dtype (bit-exact for exact operators).
    pub const EXACT: Tolerance = Tolerance {
        round: 0.5,
        rel: 0.0,
        low: 0.0,
        n: 0,
        bias: Bias::Never,
        change_relative: &[],
        zero_sign: true,
    };

    /// Computed in f32 (f64 for f64) with an error of `rel` units of
    /// `u(acc)` relative to the element, then rounded once to the output
    /// dtype. `rel = 1` is a correctly rounded f32 operation (whose result is
    /// rounded again in bf16 and f16); a few for transcendental functions.
    pub const fn computed(rel: f64) -> Tolerance {
        Tolerance {
            rel,
            bias: Bias::LowPrecision,
            ..Tolerance::EXACT
        }
    }

    /// A composite or accumulating kernel computed in f32: the final
    /// rounding, an accumulation over `n` terms relative to `|x| + scale`,
    /// and `rel` units of `u(acc)` relative to the element.
    pub const fn accumulated(rel: f64, n: usize) -> Tolerance {
        Tolerance {
            rel,
            n,
            bias: Bias::Never,
            ..Tolerance::EXACT
        }
    }

    /// The model of the earlier suite, `(k u(out) + 2 n u(acc)) (|x| +
    /// scale)` plus the final rounding, for tools that keep it
    /// (`polychip train --autocompare`).
    pub const fn sum(k: f64, n: usize) -> Tolerance {
        Tolerance {
            low: k,
            n,
            bias: Bias::Never,
            ..Tolerance::EXACT
        }
    }

    /// [`Tolerance::sum`] without accumulation.
    pub const fn ulps(k: f64) -> Tolerance {
        Tolerance::sum(k, 0)
    }

    /// With `low` intermediates rounded to the output dtype.
    pub const fn with_low(self, low: f64) -> Tolerance {
        Tolerance { low, ..self }
    }

    /// With the bias test applying as `bias` says.
    pub const fn with_bias(self, bias: Bias) -> Tolerance {
        Tolerance { bias, ..self }
    }

    /// With the relative error of the named in-place outputs judged against
    /// their change.
    pub const fn change_relative(self, names: &'static [&'static str]) -> Tolerance {
        Tolerance {
            change_relative: names,
            ..self
        }
    }

    /// Without judging the sign of an exact zero (`relu_backward`'s zeros,
    /// which a select gives as +0 and a product by 0 as -0).
    pub const fn any_zero_sign(self) -> Tolerance {
        Tolerance {
            zero_sign: false,
            ..self
        }
    }

    /// Whether this is a pure rounding (see the module docs).
    pub fn is_pure_rounding(&self) -> bool {
        self.round <= 0.5 && self.rel == 0.0 && self.low == 0.0 && self.n == 0
    }

    /// Whether the bias test applies to an output of `dtype`.
    pub fn tests_bias(&self, dtype: DType) -> bool {
        match self.bias {
            Bias::Never => false,
            Bias::Always => dtype.is_float(),
            Bias::LowPrecision => matches!(dtype, DType::BF16 | DType::F16),
        }
    }

    /// The accumulator's unit roundoff for an output of `dtype`.
    pub fn u_acc(dtype: DType) -> f64 {
        if dtype == DType::F64 {
            unit_roundoff(DType::F64)
        } else {
            unit_roundoff(DType::F32)
        }
    }

    /// The accumulation length the bound charges for `n` terms:
    /// `min(n, LAMBDA sqrt(n))`. The worst case of a sum of `n` terms, `n u`,
    /// needs every rounding error to have the same sign and its largest
    /// size; with round-to-nearest the errors of a sum over seeded random
    /// values behave as independent, mean-zero variables, and the sum's
    /// error stays below `LAMBDA sqrt(n) u` except with probability about
    /// `2 exp(-LAMBDA^2 / 2)` (Higham and Mary, "A new approach to
    /// probabilistic rounding error analysis", SIAM J. Sci. Comput. 2019).
    /// With `LAMBDA = 8` that is 2.5e-14 per sum, while a kernel that drops
    /// a tile of a 152K-wide row, or accumulates in bf16, is outside it.
    pub fn effective_length(n: usize) -> f64 {
        const LAMBDA: f64 = 8.0;
        (n as f64).min(LAMBDA * (n as f64).sqrt())
    }

    /// `(per ulp_out(x), per |x|, per scale)`: the coefficients of
    /// `allowed(x) = a ulp_out(x) + b |x| + c scale` for an output of
    /// `dtype`, times a vendor's loosening factor (1 when none).
    pub fn coefficients(&self, dtype: DType, factor: f64) -> (f64, f64, f64) {
        let (u_out, u_acc) = (unit_roundoff(dtype), Tolerance::u_acc(dtype));
        let acc = 2.0 * Tolerance::effective_length(self.n) * u_acc;
        (
            factor * self.round,
            factor * (self.rel * u_acc + self.low * u_out + acc),
            factor * (self.low * u_out + acc),
        )
    }

    /// The relative tolerance of the earlier model, `k u(out) + 2 n
    /// u(acc)` (with `k = low`), times `factor`; for
    /// [`crate::compare::compare_scaled`].
    pub fn rtol(&self, dtype: DType, factor: f64) -> f64 {
        factor * (self.low * unit_roundoff(dtype) + 2.0 * self.n as f64 * Tolerance::u_acc(dtype))
    }
}

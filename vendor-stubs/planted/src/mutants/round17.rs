//! The planted bugs of mutation round 17: formulas that are exact in real
//! arithmetic and fail in the kernel's: a one-pass variance (`E[x^2] -
//! E[x]^2` in f32, which cancels catastrophically on rows far from zero
//! mean), a log-softmax taken as the log of a softmax (whose terms
//! underflow to zero past a spread of about 104 in f32, giving -inf where
//! the answer is finite) and a power taken as `exp(e ln x)` (NaN for every
//! negative base, squares and cubes included).
//!
//! # Safety
//! Every function here takes views that address live host memory of their
//! dtype, as the SDK checked them.
#![allow(clippy::missing_safety_doc)]

use ferrite_kernels::View;

use super::elems::{load, round, rows, store};

/// The mean and variance of a layer_norm row from one pass of f32 sums of
/// `x` and `x^2` (for [`super::numerics::layer_norm_by`]; Welford's update
/// or a second pass avoids the cancellation).
pub fn one_pass_stats(x: &[f64]) -> (f64, f64) {
    let n = x.len() as f32;
    let (sum, squares) = x.iter().fold((0f32, 0f32), |(s, q), &v| {
        let v = v as f32;
        (s + v, q + v * v)
    });
    let mu = sum / n;
    // Planted: E[x^2] - E[x]^2, in f32.
    (f64::from(mu), f64::from(squares / n - mu * mu))
}

/// log_softmax as `ln(softmax(x))`, in f32.
pub unsafe fn log_softmax_of_softmax(input: &View<'_>, out: &View<'_>) {
    for (ri, ro) in rows(input).iter().zip(rows(out)) {
        // SAFETY: addresses of live elements.
        unsafe {
            let x: Vec<f32> = ri.iter().map(|&p| load(input.dtype, p) as f32).collect();
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = x.iter().map(|&v| (v - max).exp()).collect();
            let sum: f32 = e.iter().sum();
            for (&v, &o) in e.iter().zip(&ro) {
                // Planted: the log of the quotient, not x - max - ln(sum).
                store(out.dtype, o, f64::from((v / sum).ln()));
            }
        }
    }
}

/// pow_scalar as `exp(e ln x)`.
pub unsafe fn pow_via_exp_log(input: &View<'_>, out: &View<'_>, exponent: f64) {
    // SAFETY: forwarded.
    unsafe { super::elems::map(input, out, round, |x| (exponent * x.ln()).exp()) };
}

//! Activations and their gradients: the scalar `silu`/`gelu`/`gelu_erf`/
//! `sigmoid` formulas (and derivatives) shared with `unary`,
//! `activation_backward`, and fused SwiGLU forward and backward. All in
//! `f32`, rounded once, any strides, in place
//! allowed (an output exactly one of the inputs).

use crate::error::{KernelError, bail};
use crate::float::{exp_f32, normal_parts, sigmoid_f32};
use crate::map::{Access, check_float, map_blocks};
use crate::simd::simd_dispatch;
use crate::view::View;

/// An activation for [`activation_backward`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActivationOp {
    /// `max(x, 0)`: derivative 1 where `x > 0`, else 0.
    Relu,
    /// `x * sigmoid(x)`.
    Silu,
    /// GELU, tanh form.
    Gelu,
    /// GELU, exact (erf) form.
    GeluErf,
}

/// `sqrt(2 / pi)`.
const GELU_K: f32 = 0.797_884_6;
/// The cubic coefficient of the tanh-form GELU.
const GELU_C: f32 = 0.044_715;

/// `(sigmoid(x), 1 - sigmoid(x))`, both without cancellation.
#[inline(always)]
fn sigmoid_pair(x: f32) -> (f32, f32) {
    let e = exp_f32(-x);
    let s = 1.0 / (1.0 + e);
    // 1 - s = e / (1 + e); when `e` overflowed, s = 0 and 1 - s = 1.
    let c = if e < f32::INFINITY { e * s } else { 1.0 };
    (s, c)
}

/// `x * sigmoid(x)`.
#[inline(always)]
pub(crate) fn silu(x: f32) -> f32 {
    x * sigmoid_f32(x)
}

/// d silu / dx `= s (1 + x (1 - s))`.
#[inline(always)]
fn silu_grad(x: f32) -> f32 {
    let (s, c) = sigmoid_pair(x);
    s * (1.0 + x * c)
}

/// GELU (tanh form) as `x * sigmoid(2u)`, `u = k (x + c x^3)`, which equals
/// `0.5 x (1 + tanh(u))` without its cancellation for negative `x`.
#[inline(always)]
pub(crate) fn gelu(x: f32) -> f32 {
    let u = GELU_K * (x + GELU_C * x * x * x);
    x * sigmoid_f32(u + u)
}

/// d gelu / dx `= s + 2 x s (1 - s) u'`, `s = sigmoid(2u)`.
#[inline(always)]
fn gelu_grad(x: f32) -> f32 {
    // Past |x| = 20 the derivative is 1 (or 0) to every float's precision
    // (sigmoid(2u) at |2u| > 600), and x^2 overflows from 1.8e19 on, which
    // made the product below 0 * inf: NaN.
    if x.abs() > 20.0 {
        return if x > 0.0 { 1.0 } else { 0.0 };
    }
    let x2 = x * x;
    let u = GELU_K * (x + GELU_C * x2 * x);
    let du = GELU_K * (1.0 + 3.0 * GELU_C * x2);
    let (s, c) = sigmoid_pair(u + u);
    s + 2.0 * x * s * c * du
}

/// `1 / sqrt(2 pi)`, the standard normal density at 0.
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

/// Exact GELU, `x Phi(x)`, in `f32`, branch-free so blocks vectorize:
/// `x Phi(-|x|)` for negative `x` (the tail's mantissa times `x`, scaled
/// once at the end: relative accuracy of a few ulps into the subnormals),
/// `x (1 - Phi(-|x|))` otherwise (see [`normal_parts`]). `-inf` gives
/// `-inf * 0`, NaN, as the ABI says; large negative inputs `-0`.
#[inline(always)]
pub(crate) fn gelu_erf(x: f32) -> f32 {
    let n = normal_parts(x);
    let lower = x * n.m * n.s1 * n.s2;
    let upper = x * (1.0 - n.tail());
    if x < 0.0 { lower } else { upper }
}

/// d gelu_erf / dx `= Phi(x) + x phi(x)`, in `f32` (NaN at ±inf, where the
/// density is exactly 0: `inf * 0`). Past `|x| = 14.9` the density is
/// taken as 0 (it is below 1e-48), so `x^2` never overflows.
#[inline(always)]
fn gelu_erf_grad(x: f32) -> f32 {
    let n = normal_parts(x);
    let density = FRAC_1_SQRT_2PI * n.e * n.s1 * n.s2;
    n.cdf(x) + x * density
}

/// `unary(GeluErf)`'s block function. The exact GELU's body is large
/// enough that the compiler leaves a block function out of line, compiled
/// for the baseline target, even when the block driver runs its AVX2 copy;
/// so the loop dispatches on the CPU's features itself.
#[inline(always)]
pub(crate) fn gelu_erf_block([o, x]: [&mut [f32]; 2]) {
    // SAFETY: `gelu_erf_run` has no contract beyond the CPU features its
    // dispatch checks.
    unsafe { gelu_erf_run(o, x) }
}

simd_dispatch!(unsafe fn gelu_erf_run[](o: &mut [f32], x: &[f32]) => gelu_erf_loop[]);

/// `o[i] = gelu_erf(x[i])`.
///
/// # Safety
/// None (`unsafe` for [`simd_dispatch!`]'s signature).
#[inline(always)]
unsafe fn gelu_erf_loop(o: &mut [f32], x: &[f32]) {
    for (o, &x) in o.iter_mut().zip(x.iter()) {
        *o = gelu_erf(x);
    }
}

/// `activation_backward(GeluErf)`'s block function, dispatching for the
/// same reason as [`gelu_erf_block`].
#[inline(always)]
fn gelu_erf_grad_block([d, g, x]: [&mut [f32]; 3]) {
    // SAFETY: as in `gelu_erf_block`.
    unsafe { gelu_erf_grad_run(d, g, x) }
}

simd_dispatch!(unsafe fn gelu_erf_grad_run[](d: &mut [f32], g: &[f32], x: &[f32]) => gelu_erf_grad_loop[]);

/// `d[i] = g[i] * gelu_erf'(x[i])`.
///
/// # Safety
/// None (`unsafe` for [`simd_dispatch!`]'s signature).
#[inline(always)]
unsafe fn gelu_erf_grad_loop(d: &mut [f32], g: &[f32], x: &[f32]) {
    for ((d, &g), &x) in d.iter_mut().zip(g.iter()).zip(x.iter()) {
        *d = g * gelu_erf_grad(x);
    }
}

/// The scalar `libm::erfcf` forms of the exact GELU and its derivative that
/// the vectorized [`gelu_erf`] replaced (12 to 14 times its time), kept so
/// the benchmark times both in one run and the tests compare them. Not part
/// of the plugin.
#[doc(hidden)]
pub mod erfcf_reference {
    use super::{FRAC_1_SQRT_2PI, backward_ops};
    use crate::error::KernelError;
    use crate::float::exp_f32;
    use crate::map::{Access, map_blocks};
    use crate::unary::check_pair;
    use crate::view::View;
    use std::f32::consts::FRAC_1_SQRT_2;

    /// `x Phi(x)` with `Phi(x) = erfcf(-x / sqrt 2) / 2`.
    pub fn gelu_erf(x: f32) -> f32 {
        x * (0.5 * libm::erfcf(-x * FRAC_1_SQRT_2))
    }

    /// `Phi(x) + x phi(x)`, the density 0 past `|x| = 13`.
    pub fn gelu_erf_grad(x: f32) -> f32 {
        let density = if x.abs() > 13.0 {
            0.0
        } else {
            FRAC_1_SQRT_2PI * exp_f32(-0.5 * x * x)
        };
        0.5 * libm::erfcf(-x * FRAC_1_SQRT_2) + x * density
    }

    /// `unary(GeluErf, input, out)` through [`gelu_erf`] above.
    ///
    /// # Safety
    /// As for `unary`.
    pub unsafe fn unary_gelu_erf(input: &View, out: &View) -> Result<(), KernelError> {
        check_pair("unary", input, out)?;
        let ops = [(out, Access::Write), (input, Access::Read)];
        // SAFETY: forwarded from this function's contract.
        unsafe {
            map_blocks(ops, 4, |[o, x]| {
                for (o, &x) in o.iter_mut().zip(x.iter()) {
                    *o = gelu_erf(x);
                }
            })
        };
        Ok(())
    }

    /// `activation_backward(GeluErf, ..)` through [`gelu_erf_grad`] above.
    ///
    /// # Safety
    /// As for `activation_backward`.
    pub unsafe fn gelu_erf_backward(
        grad_out: &View,
        input: &View,
        grad_in: &View,
    ) -> Result<(), KernelError> {
        let ops = backward_ops(grad_out, input, grad_in)?;
        // SAFETY: forwarded from this function's contract.
        unsafe {
            map_blocks(ops, 4, |[d, g, x]| {
                for ((d, &g), &x) in d.iter_mut().zip(g.iter()).zip(x.iter()) {
                    *d = g * gelu_erf_grad(x);
                }
            })
        };
        Ok(())
    }
}

/// `1 / (1 + e^-x)`, as `e^x / (1 + e^x)` for negative `x` so the negative
/// tail stays accurate down to the subnormals (`e^-x` would overflow first).
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    if x < 0.0 {
        let e = exp_f32(x);
        e / (1.0 + e)
    } else {
        1.0 / (1.0 + exp_f32(-x))
    }
}

/// Checks that all views share `views[0]`'s float dtype and shape.
pub(crate) fn check_same(kernel: &str, views: &[(&str, &View)]) -> Result<(), KernelError> {
    let (_, first) = views[0];
    for &(name, v) in views {
        check_float(kernel, name, v)?;
        if v.dtype != first.dtype || v.shape != first.shape {
            bail!(
                "{kernel}: {name} is {:?} {:?}, expected {:?} {:?}",
                v.dtype,
                v.shape,
                first.dtype,
                first.shape
            );
        }
    }
    Ok(())
}

/// The blocks an activation's backward maps over, `[grad_in, grad_out,
/// input]`, once every view is checked to share the first's float dtype
/// and shape.
pub(crate) fn backward_ops<'v, 'a>(
    grad_out: &'v View<'a>,
    input: &'v View<'a>,
    grad_in: &'v View<'a>,
) -> Result<[(&'v View<'a>, Access); 3], KernelError> {
    let views = [
        ("grad_in", grad_in),
        ("grad_out", grad_out),
        ("input", input),
    ];
    check_same("activation_backward", &views)?;
    Ok([
        (grad_in, Access::Write),
        (grad_out, Access::Read),
        (input, Access::Read),
    ])
}

/// `grad_in = grad_out * f'(input)` for the activation `op`.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `grad_in` must not overlap the inputs unless it is exactly one of them,
/// and must not overlap itself.
pub unsafe fn activation_backward(
    op: ActivationOp,
    grad_out: &View,
    input: &View,
    grad_in: &View,
) -> Result<(), KernelError> {
    let ops = backward_ops(grad_out, input, grad_in)?;
    // SAFETY: forwarded from this function's contract.
    unsafe {
        match op {
            ActivationOp::Relu => map_blocks(ops, 1, |[d, g, x]| {
                for ((d, &g), &x) in d.iter_mut().zip(g.iter()).zip(x.iter()) {
                    // A select, as PyTorch's threshold_backward.
                    *d = if x <= 0.0 { 0.0 } else { g };
                }
            }),
            ActivationOp::Silu => map_blocks(ops, 2, |[d, g, x]| {
                for ((d, &g), &x) in d.iter_mut().zip(g.iter()).zip(x.iter()) {
                    *d = g * silu_grad(x);
                }
            }),
            ActivationOp::Gelu => map_blocks(ops, 2, |[d, g, x]| {
                for ((d, &g), &x) in d.iter_mut().zip(g.iter()).zip(x.iter()) {
                    *d = g * gelu_grad(x);
                }
            }),
            ActivationOp::GeluErf => map_blocks(ops, 4, gelu_erf_grad_block),
        }
    }
    Ok(())
}

/// Fused SwiGLU, `out = silu(gate) * up`.
///
/// # Safety
/// As for [`activation_backward`], with `out` the output.
pub unsafe fn swiglu(gate: &View, up: &View, out: &View) -> Result<(), KernelError> {
    check_same("swiglu", &[("out", out), ("gate", gate), ("up", up)])?;
    let ops = [
        (out, Access::Write),
        (gate, Access::Read),
        (up, Access::Read),
    ];
    // SAFETY: forwarded from this function's contract.
    unsafe {
        map_blocks(ops, 2, |[o, g, u]| {
            for ((o, &g), &u) in o.iter_mut().zip(g.iter()).zip(u.iter()) {
                *o = silu(g) * u;
            }
        })
    };
    Ok(())
}

/// Backward of fused SwiGLU: `grad_gate = grad_out * up * silu'(gate)`,
/// `grad_up = grad_out * silu(gate)`.
///
/// # Safety
/// As for [`activation_backward`], with `grad_gate` and `grad_up` the
/// outputs (distinct from each other).
pub unsafe fn swiglu_backward(
    gate: &View,
    up: &View,
    grad_out: &View,
    grad_gate: &View,
    grad_up: &View,
) -> Result<(), KernelError> {
    let views = [
        ("grad_gate", grad_gate),
        ("grad_up", grad_up),
        ("gate", gate),
        ("up", up),
        ("grad_out", grad_out),
    ];
    check_same("swiglu_backward", &views)?;
    let ops = [
        (grad_gate, Access::Write),
        (grad_up, Access::Write),
        (gate, Access::Read),
        (up, Access::Read),
        (grad_out, Access::Read),
    ];
    // SAFETY: forwarded from this function's contract.
    unsafe {
        map_blocks(ops, 3, |[dg, du, g, u, go]| {
            let n = dg.len();
            let (du, g, u, go) = (&mut du[..n], &g[..n], &u[..n], &go[..n]);
            for i in 0..n {
                let (x, s) = (g[i], sigmoid_pair(g[i]));
                let gu = go[i] * u[i];
                du[i] = go[i] * (x * s.0);
                dg[i] = gu * (s.0 * (1.0 + x * s.1));
            }
        })
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{erfcf_reference, gelu_erf, gelu_erf_grad};
    use crate::float::normal_parts;

    /// `Phi(x)` in f64.
    fn cdf(x: f64) -> f64 {
        0.5 * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
    }

    /// The error of `got` in ulps of `f32` at `want` (subnormal spacing
    /// below the normal range).
    fn ulps(got: f32, want: f64) -> f64 {
        let spacing = if want.abs() < f32::MIN_POSITIVE as f64 {
            2f64.powi(-149)
        } else {
            2f64.powi(want.abs().log2().floor() as i32 - 23)
        };
        (got as f64 - want).abs() / spacing
    }

    /// Every `step`-th f32 in `[lo, hi]`.
    fn sweep(lo: f32, hi: f32, step: usize) -> impl Iterator<Item = f32> {
        let mut x = lo;
        std::iter::from_fn(move || {
            let cur = x;
            if cur > hi {
                return None;
            }
            for _ in 0..step {
                x = x.next_up();
            }
            Some(cur)
        })
    }

    #[test]
    fn normal_tail_and_gelu_erf_match_f64() {
        // Worst ulps of Phi(-|x|) and gelu_erf (subnormal results in units
        // of the smallest subnormal), their worst relative error where the
        // result is normal, and the derivative's worst absolute error.
        let (mut tail, mut gelu, mut rel, mut grad) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
        let xs = sweep(-15.0, -1e-3, 997).chain(sweep(1e-3, 15.0, 997));
        for x in xs.chain([-1e-30, 1e-30, -1e-5, 1e-5]) {
            let xd = x as f64;
            let (want_tail, want) = (cdf(-xd.abs()), xd * cdf(xd));
            let (got_tail, got) = (normal_parts(x).tail(), gelu_erf(x));
            tail = tail.max(ulps(got_tail, want_tail));
            gelu = gelu.max(ulps(got, want));
            for (g, w) in [(got_tail, want_tail), (got, want)] {
                if w.abs() >= f32::MIN_POSITIVE as f64 {
                    rel = rel.max(((g as f64 - w) / w).abs());
                }
            }
            let density = (-0.5 * xd * xd).exp() / (2.0 * std::f64::consts::PI).sqrt();
            grad = grad.max((gelu_erf_grad(x) as f64 - (cdf(xd) + xd * density)).abs());
        }
        println!(
            "Phi(-|x|) {tail:.2} ulps, gelu_erf {gelu:.2} ulps, relative {:.2} u(f32), \
             derivative {:.2} u(f32) absolute",
            rel * 2f64.powi(24),
            grad * 2f64.powi(24)
        );
        assert!(tail < 8.0, "Phi tail {tail} ulps");
        assert!(gelu < 8.0, "gelu_erf {gelu} ulps");
        assert!(grad < 8.0 * 2f64.powi(-24), "derivative {grad}");
    }

    #[test]
    fn gelu_erf_edges_match_the_scalar_form() {
        let edges = [
            0.0,
            -0.0,
            f32::from_bits(1),
            -f32::from_bits(1),
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            1.0,
            -1.0,
            13.5,
            -14.5,
            -14.9,
            -15.0,
            -20.0,
            -110.0,
            -1e10,
            -1e20,
            -1e30,
            f32::MIN,
            f32::MAX,
            1e10,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        for x in edges {
            let (new, old) = (gelu_erf(x), erfcf_reference::gelu_erf(x));
            let (dnew, dold) = (gelu_erf_grad(x), erfcf_reference::gelu_erf_grad(x));
            let same = |a: f32, b: f32| {
                a.to_bits() == b.to_bits()
                    || (a.is_nan() && b.is_nan())
                    || (a != 0.0 && ((a - b) / b).abs() < 1e-6)
            };
            assert!(same(new, old), "gelu_erf({x:e}) = {new:e}, scalar {old:e}");
            assert!(
                same(dnew, dold) || (dnew - dold).abs() < 1e-7,
                "gelu_erf'({x:e}) = {dnew:e}, scalar {dold:e}"
            );
        }
        assert!(gelu_erf(f32::NEG_INFINITY).is_nan());
        assert!(gelu_erf(f32::NAN).is_nan());
        assert_eq!(gelu_erf(f32::INFINITY), f32::INFINITY);
        assert_eq!(gelu_erf(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(gelu_erf(-1e30).to_bits(), (-0.0f32).to_bits());
        assert_eq!(gelu_erf(f32::MIN).to_bits(), (-0.0f32).to_bits());
        assert_eq!(gelu_erf(f32::MAX), f32::MAX);
        assert!(gelu_erf_grad(f32::INFINITY).is_nan());
        assert!(gelu_erf_grad(f32::NEG_INFINITY).is_nan());
        assert!(gelu_erf_grad(f32::NAN).is_nan());
        assert_eq!(gelu_erf_grad(0.0), 0.5);
        assert_eq!(gelu_erf_grad(f32::MAX), 1.0);
        assert_eq!(gelu_erf_grad(f32::MIN), 0.0);
        // A subnormal result, not flushed, and more accurate than the scalar
        // `erfcf`'s (-1.18e-43): -14 Phi(-14) = -1.0908e-43.
        let want = -14.0 * cdf(-14.0);
        assert!(ulps(gelu_erf(-14.0), want) <= 0.5, "{}", gelu_erf(-14.0));
    }
}

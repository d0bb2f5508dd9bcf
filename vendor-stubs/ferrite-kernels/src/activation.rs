//! Activations and their gradients: the scalar `silu`/`gelu`/`gelu_erf`/
//! `sigmoid` formulas (and derivatives) shared with `unary`,
//! `activation_backward`, and fused SwiGLU forward and backward. All in
//! `f32`, rounded once, any strides, in place
//! allowed (an output exactly one of the inputs).

use crate::error::{KernelError, bail};
use crate::float::{exp_f32, sigmoid_f32};
use crate::map::{Access, check_float, map_blocks};
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

/// `1 / sqrt(2)`.
const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// `1 / sqrt(2 pi)`, the standard normal density at 0.
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

/// Exact GELU, `x Phi(x)` with `Phi(x) = erfc(-x / sqrt 2) / 2` (`erfc`
/// keeps the negative tail's relative accuracy, where `1 + erf` would
/// cancel), in `f32`. `-inf` gives `-inf * 0`, NaN, as the ABI says.
#[inline(always)]
pub(crate) fn gelu_erf(x: f32) -> f32 {
    x * (0.5 * libm::erfcf(-x * FRAC_1_SQRT_2))
}

/// d gelu_erf / dx `= Phi(x) + x phi(x)`, in `f32` (NaN at ±inf). Past
/// `|x| = 13` the density is below 1e-36 and taken as 0 (`x^2` would
/// overflow from 1.8e19 on, and `exp_f32` saturates at its lowest input),
/// so `x phi(x)` is exactly 0 there, and `inf * 0`, NaN, at ±inf.
#[inline(always)]
fn gelu_erf_grad(x: f32) -> f32 {
    let density = if x.abs() > 13.0 {
        0.0
    } else {
        FRAC_1_SQRT_2PI * exp_f32(-0.5 * x * x)
    };
    0.5 * libm::erfcf(-x * FRAC_1_SQRT_2) + x * density
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
    let views = [
        ("grad_in", grad_in),
        ("grad_out", grad_out),
        ("input", input),
    ];
    check_same("activation_backward", &views)?;
    let ops = [
        (grad_in, Access::Write),
        (grad_out, Access::Read),
        (input, Access::Read),
    ];
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
            ActivationOp::GeluErf => map_blocks(ops, 4, |[d, g, x]| {
                for ((d, &g), &x) in d.iter_mut().zip(g.iter()).zip(x.iter()) {
                    *d = g * gelu_erf_grad(x);
                }
            }),
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

//! Pointwise math of ABI 1.1 and 1.2: `unary` (`neg`, `exp`, `log`,
//! `sqrt`, `rsqrt`, `tanh`, `relu`, `silu`, `gelu`; `gelu_erf`, `sigmoid`;
//! 1.3's `sin`, `cos`),
//! `pow_scalar` and the in-place `scale`. `f32`/`f16`/`bf16`, computed in
//! `f32` (`pow` in `f64`) and rounded once; any strides; in place allowed.

use crate::activation::{gelu, gelu_erf_block, sigmoid, silu};
use crate::dtype::DType;
use crate::error::{KernelError, bail};
use crate::float::{exp_f32, tanh_f32};
use crate::map::{Access, check_float, map_blocks};
use crate::rounding::f64_to_f32_odd;
use crate::view::View;

/// A pointwise function for [`unary`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryOp {
    /// `-x`
    Neg,
    /// `e^x`
    Exp,
    /// Natural logarithm (`log(0) = -inf`, negative gives NaN).
    Log,
    /// Square root (`sqrt(-0) = -0`).
    Sqrt,
    /// `1 / sqrt(x)` (`rsqrt(0) = +inf`).
    Rsqrt,
    /// Hyperbolic tangent.
    Tanh,
    /// `max(x, 0)`; NaN stays NaN.
    Relu,
    /// `x * sigmoid(x)`.
    Silu,
    /// GELU, tanh form.
    Gelu,
    /// GELU, exact form `x Phi(x)` (ABI 1.2).
    GeluErf,
    /// `1 / (1 + e^-x)` (ABI 1.2).
    Sigmoid,
    /// Sine (ABI 1.3), computed in f64 (exact argument reduction) and
    /// rounded once.
    Sin,
    /// Cosine (ABI 1.3), likewise.
    Cos,
}

/// Checks a same-shape (input, output) pair of one float dtype.
pub(crate) fn check_pair(kernel: &str, a: &View, out: &View) -> Result<(), KernelError> {
    check_float(kernel, "input", a)?;
    check_float(kernel, "out", out)?;
    if a.dtype != out.dtype || a.shape != out.shape {
        bail!(
            "{kernel}: input {:?} {:?} does not match out {:?} {:?}",
            a.dtype,
            a.shape,
            out.dtype,
            out.shape
        );
    }
    Ok(())
}

/// Applies `f` to every element of `input`, writing `out`.
///
/// # Safety
/// As for [`unary`].
#[inline(always)]
unsafe fn pointwise(input: &View, out: &View, weight: usize, f: impl Fn(f32) -> f32 + Sync) {
    let ops = [(out, Access::Write), (input, Access::Read)];
    // SAFETY: forwarded from the caller's contract.
    unsafe {
        map_blocks(ops, weight, |[o, x]| {
            for (o, &x) in o.iter_mut().zip(x.iter()) {
                *o = f(x);
            }
        })
    };
}

/// `out = op(input)` elementwise (same shape and dtype: `f32`, `f16` or
/// `bf16`). IEEE semantics at the edges.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `out` must not overlap `input` unless it is exactly the same view, and
/// must not overlap itself.
pub unsafe fn unary(op: UnaryOp, input: &View, out: &View) -> Result<(), KernelError> {
    check_pair("unary", input, out)?;
    // SAFETY: forwarded from this function's contract.
    unsafe {
        match op {
            UnaryOp::Neg => pointwise(input, out, 1, |x| -x),
            UnaryOp::Exp => pointwise(input, out, 2, exp_f32),
            UnaryOp::Log => pointwise(input, out, 4, f32::ln),
            UnaryOp::Sqrt => pointwise(input, out, 1, f32::sqrt),
            UnaryOp::Rsqrt => pointwise(input, out, 1, |x| 1.0 / x.sqrt()),
            UnaryOp::Tanh => pointwise(input, out, 2, tanh_f32),
            UnaryOp::Relu => pointwise(input, out, 1, |x| if x <= 0.0 { 0.0 } else { x }),
            UnaryOp::Silu => pointwise(input, out, 2, silu),
            UnaryOp::Gelu => pointwise(input, out, 2, gelu),
            UnaryOp::GeluErf => {
                let ops = [(out, Access::Write), (input, Access::Read)];
                map_blocks(ops, 4, gelu_erf_block)
            }
            UnaryOp::Sigmoid => pointwise(input, out, 2, sigmoid),
            // f64's sin and cos reduce any f32 argument exactly (a rotary
            // table's 1e5 rad included); rounding the f64 result to f32 and
            // then to f16 or bf16 stays within 1 ULP of the output dtype.
            UnaryOp::Sin => pointwise(input, out, 8, |x| f64::from(x).sin() as f32),
            UnaryOp::Cos => pointwise(input, out, 8, |x| f64::from(x).cos() as f32),
        }
    }
    Ok(())
}

/// `out = input ^ exponent` with C `pow` semantics (`pow(x, 0) = 1`, also
/// for NaN). Exponents 0, 1, 2 and -1 are computed exactly in `f32`; any
/// other goes through `f64` `powf`, rounded once to the output dtype.
///
/// # Safety
/// As for [`unary`].
pub unsafe fn pow_scalar(input: &View, out: &View, exponent: f64) -> Result<(), KernelError> {
    check_pair("pow_scalar", input, out)?;
    let half = out.dtype != DType::F32;
    // SAFETY: forwarded from this function's contract.
    unsafe {
        match exponent {
            0.0 => pointwise(input, out, 1, |_| 1.0),
            1.0 => pointwise(input, out, 1, |x| x),
            2.0 => pointwise(input, out, 1, |x| x * x),
            -1.0 => pointwise(input, out, 1, |x| 1.0 / x),
            e => pointwise(input, out, 16, |x| {
                let p = (x as f64).powf(e);
                if half { f64_to_f32_odd(p) } else { p as f32 }
            }),
        }
    }
    Ok(())
}

/// `tensor *= alpha` in place (`f32`, `f16` or `bf16`; `alpha` is rounded
/// to `f32`).
///
/// # Safety
/// Every element addressed by `tensor` must be valid memory of its dtype,
/// and `tensor` must not overlap itself.
pub unsafe fn scale(tensor: &View, alpha: f64) -> Result<(), KernelError> {
    check_float("scale", "tensor", tensor)?;
    let a = alpha as f32;
    // SAFETY: forwarded from this function's contract.
    unsafe {
        map_blocks([(tensor, Access::Update)], 1, |[x]| {
            for v in x.iter_mut() {
                *v *= a;
            }
        })
    };
    Ok(())
}

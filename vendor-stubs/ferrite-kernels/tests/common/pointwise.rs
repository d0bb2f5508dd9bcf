//! Pointwise test support: f64 references of the unary functions and
//! activation derivatives, rounding to a dtype, and the tolerance rule
//! (one rounding to the dtype plus a few f32 ulps).

use super::{Layout, assert_close, eps};
use ferrite_kernels::{ActivationOp, DType, UnaryOp};
use half::{bf16, f16};

pub const OPS: [UnaryOp; 11] = [
    UnaryOp::Neg,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
    UnaryOp::Tanh,
    UnaryOp::Relu,
    UnaryOp::Silu,
    UnaryOp::Gelu,
    UnaryOp::GeluErf,
    UnaryOp::Sigmoid,
];

pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

pub fn gelu_u(x: f64) -> (f64, f64) {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    (
        k * (x + 0.044715 * x * x * x),
        k * (1.0 + 3.0 * 0.044715 * x * x),
    )
}

/// The standard normal CDF, `erfc(-x / sqrt 2) / 2`.
pub fn phi_cdf(x: f64) -> f64 {
    0.5 * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
}

pub fn unary_ref(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Relu => {
            if x <= 0.0 {
                0.0
            } else {
                x
            }
        }
        UnaryOp::Silu => x * sigmoid(x),
        // 0.5 x (1 + tanh(u)) == x sigmoid(2u), without cancellation.
        UnaryOp::Gelu => x * sigmoid(2.0 * gelu_u(x).0),
        UnaryOp::GeluErf => x * phi_cdf(x),
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
    }
}

pub fn grad_ref(op: ActivationOp, x: f64) -> f64 {
    match op {
        ActivationOp::Relu => {
            if x > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        ActivationOp::Silu => {
            let s = sigmoid(x);
            s * (1.0 + x * (1.0 - s))
        }
        ActivationOp::Gelu => {
            let (u, du) = gelu_u(x);
            let s = sigmoid(2.0 * u);
            s + 2.0 * x * s * (1.0 - s) * du
        }
        ActivationOp::GeluErf => {
            let density = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
            phi_cdf(x) + x * density
        }
    }
}

/// `v` rounded to `dt` (overflowing to infinity).
pub fn to_dt(dt: DType, v: f64) -> f64 {
    match dt {
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        _ => v as f32 as f64,
    }
}

/// Checks `got` against exact `want`: one rounding to `dt` plus a few f32
/// ulps (times `cond`, the conditioning of an f32-computed intermediate),
/// plus `abs` and f32's smallest normal (results below it may flush).
pub fn close_c(dt: DType, got: f64, want: f64, abs: f64, cond: f64, ctx: &str) {
    let w = to_dt(dt, want);
    let rel = 2.0 * eps(dt) + 8.0 * cond * eps(DType::F32);
    assert_close(got, w, rel * w.abs() + abs + f32::MIN_POSITIVE as f64, ctx);
}

pub fn close(dt: DType, got: f64, want: f64, abs: f64, ctx: &str) {
    close_c(dt, got, want, abs, 1.0, ctx);
}

/// GELU's exponent `2u ~ x^3` is computed in f32: its rounding error is
/// amplified by about `1 + x^2`; so is the exact GELU's `x / sqrt(2)` (the
/// condition number of `x Phi(x)` is about `1 + x^2` for negative `x`).
pub fn cond(op: UnaryOp, x: f64) -> f64 {
    if op == UnaryOp::Gelu || op == UnaryOp::GeluErf {
        1.0 + x * x
    } else {
        1.0
    }
}

pub const SHAPES: [&[i64]; 7] = [&[], &[1], &[0], &[3, 0], &[5, 7], &[2, 3, 40], &[300, 301]];

pub fn layouts(r: usize) -> [Layout; 3] {
    [
        Layout::contiguous(),
        Layout::transposed(r),
        Layout::messy(r),
    ]
}

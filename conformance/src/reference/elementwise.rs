//! The elementwise operators of ABI 1.1 (`spec/ops.toml`): unary
//! math and activations, their backward operators and fused SwiGLU. Shapes
//! are equal (no broadcasting). Each formula is the one the ABI states, in
//! IEEE f64, so the edges (`log(0) = -inf`, `sqrt(-0) = -0`, `rsqrt(0) =
//! +inf`, NaN through `relu`) follow from it.

use super::{Dense, RefError, expect_shape};

/// `sqrt(2 / pi)`, the constant of the tanh form of GELU.
const GELU_C: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the tanh form of GELU.
const GELU_A: f64 = 0.044_715;

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn silu_of(x: f64) -> f64 {
    x * sigmoid(x)
}

/// `d silu / dx = s (1 + x (1 - s))`, `s = sigmoid(x)`.
fn silu_derivative(x: f64) -> f64 {
    let s = sigmoid(x);
    s * (1.0 + x * (1.0 - s))
}

fn gelu_of(x: f64) -> f64 {
    0.5 * x * (1.0 + (GELU_C * (x + GELU_A * x * x * x)).tanh())
}

/// The exact derivative of the tanh form: with `u = c (x + a x^3)` and
/// `t = tanh(u)`, `0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2)`.
fn gelu_derivative(x: f64) -> f64 {
    let t = (GELU_C * (x + GELU_A * x * x * x)).tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * GELU_A * x * x)
}

/// `out = -x`.
pub fn neg(input: &Dense) -> Result<Dense, RefError> {
    Ok(input.map(|x| -x))
}

/// `out = e^x`.
pub fn exp(input: &Dense) -> Result<Dense, RefError> {
    Ok(input.map(f64::exp))
}

/// `out = ln(x)`.
pub fn log(input: &Dense) -> Result<Dense, RefError> {
    Ok(input.map(f64::ln))
}

/// `out = sqrt(x)`.
pub fn sqrt(input: &Dense) -> Result<Dense, RefError> {
    Ok(input.map(f64::sqrt))
}

/// `out = 1 / sqrt(x)`.
pub fn rsqrt(input: &Dense) -> Result<Dense, RefError> {
    Ok(input.map(|x| 1.0 / x.sqrt()))
}

/// `out = tanh(x)`.
pub fn tanh(input: &Dense) -> Result<Dense, RefError> {
    Ok(input.map(f64::tanh))
}

/// `out = x ^ exponent` with C's `pow` semantics (`pow(x, 0) = 1`, even for NaN).
pub fn pow_scalar(input: &Dense, exponent: f64) -> Result<Dense, RefError> {
    Ok(input.map(|x| x.powf(exponent)))
}

/// `out = max(x, 0)`; NaN stays NaN, and `-0` gives `+0`.
pub fn relu(input: &Dense) -> Result<Dense, RefError> {
    Ok(input.map(|x| if x > 0.0 || x.is_nan() { x } else { 0.0 }))
}

/// `out = x * sigmoid(x)`, literally (so `silu(-inf)` is `-inf * 0`, NaN).
pub fn silu(input: &Dense) -> Result<Dense, RefError> {
    Ok(input.map(silu_of))
}

/// `out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub fn gelu(input: &Dense) -> Result<Dense, RefError> {
    Ok(input.map(gelu_of))
}

/// `grad_in = grad_out * f'(input)` over equal shapes.
fn activation_backward(
    op: &'static str,
    grad_out: &Dense,
    input: &Dense,
    derivative: impl Fn(f64) -> f64,
) -> Result<Dense, RefError> {
    expect_shape(op, "grad_out", grad_out, &input.shape)?;
    let data = grad_out
        .data
        .iter()
        .zip(&input.data)
        .map(|(&g, &x)| g * derivative(x))
        .collect();
    Ok(Dense::new(&input.shape, data))
}

/// `grad_in = 0 if input <= 0 else grad_out`, a select as PyTorch's
/// `threshold_backward` (since 2026-12-05; before, a product): where
/// `input <= 0` the gradient is 0 even when `grad_out` is infinite or NaN,
/// and a NaN `input` passes `grad_out` through.
pub fn relu_backward(grad_out: &Dense, input: &Dense) -> Result<Dense, RefError> {
    expect_shape("relu_backward", "grad_out", grad_out, &input.shape)?;
    let data = grad_out
        .data
        .iter()
        .zip(&input.data)
        .map(|(&g, &x)| if x <= 0.0 { 0.0 } else { g })
        .collect();
    Ok(Dense::new(&input.shape, data))
}

/// `grad_in = grad_out * s (1 + x (1 - s))`, `s = sigmoid(input)`.
pub fn silu_backward(grad_out: &Dense, input: &Dense) -> Result<Dense, RefError> {
    activation_backward("silu_backward", grad_out, input, silu_derivative)
}

/// `grad_in = grad_out * gelu'(input)`, the derivative of the tanh form.
pub fn gelu_backward(grad_out: &Dense, input: &Dense) -> Result<Dense, RefError> {
    activation_backward("gelu_backward", grad_out, input, gelu_derivative)
}

/// `out = silu(gate) * up`.
pub fn swiglu(gate: &Dense, up: &Dense) -> Result<Dense, RefError> {
    expect_shape("swiglu", "up", up, &gate.shape)?;
    let data = gate
        .data
        .iter()
        .zip(&up.data)
        .map(|(&g, &u)| silu_of(g) * u)
        .collect();
    Ok(Dense::new(&gate.shape, data))
}

/// `(grad_gate, grad_up) = (grad_out * up * silu'(gate), grad_out * silu(gate))`.
pub fn swiglu_backward(
    gate: &Dense,
    up: &Dense,
    grad_out: &Dense,
) -> Result<(Dense, Dense), RefError> {
    const OP: &str = "swiglu_backward";
    expect_shape(OP, "up", up, &gate.shape)?;
    expect_shape(OP, "grad_out", grad_out, &gate.shape)?;
    let mut grad_gate = Dense::zeros(&gate.shape);
    let mut grad_up = Dense::zeros(&gate.shape);
    for i in 0..gate.numel() {
        let (x, u, g) = (gate.data[i], up.data[i], grad_out.data[i]);
        grad_gate.data[i] = g * u * silu_derivative(x);
        grad_up.data[i] = g * silu_of(x);
    }
    Ok((grad_gate, grad_up))
}

//! Arguments of the elementwise operators added in ABI 1.1: unary math and
//! activations, their backward operators, and fused SwiGLU.
//!
//! All of them take and produce one floating dtype (f32, f16 or bf16; f64 is
//! not required of these operators), compute in at least f32 and round once.
//! Shapes are equal (no broadcasting) and any strides are accepted. In place:
//! an output may be exactly one of the inputs.

use crate::abi::PolychipTensor;

/// `out = f(input)` for `neg`, `exp`, `log`, `sqrt`, `rsqrt` (`1/sqrt(x)`),
/// `tanh`, `relu` (`max(x, 0)`, NaN stays NaN), `silu` (`x * sigmoid(x)`) and
/// `gelu` (the tanh form, `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`).
/// IEEE semantics at the edges: `log(0) = -inf`, `log(-1) = NaN`,
/// `sqrt(-0) = -0`, `rsqrt(0) = +inf`, `exp(large) = +inf`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipUnaryArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// Input.
    pub input: PolychipTensor,
    /// Output: same shape and dtype.
    pub out: PolychipTensor,
}

/// `out = input ^ exponent` (C's `pow` semantics, including `pow(x, 0) = 1`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipPowScalarArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// Base.
    pub input: PolychipTensor,
    /// Output: same shape and dtype.
    pub out: PolychipTensor,
    /// The exponent.
    pub exponent: f64,
}

/// `grad_in = grad_out * f'(input)` for `relu_backward` (derivative 1 where
/// `input > 0`, else 0), `silu_backward` (`s (1 + x (1 - s))`, `s =
/// sigmoid(x)`) and `gelu_backward` (derivative of the tanh form).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipActivationBackwardArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// Gradient of the activation's output.
    pub grad_out: PolychipTensor,
    /// The activation's input (saved from the forward pass).
    pub input: PolychipTensor,
    /// Gradient of the activation's input; same shape and dtype.
    pub grad_in: PolychipTensor,
}

/// Fused SwiGLU, `out = silu(gate) * up`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipSwigluArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// Gate projection.
    pub gate: PolychipTensor,
    /// Up projection; same shape and dtype as `gate`.
    pub up: PolychipTensor,
    /// Output; same shape and dtype.
    pub out: PolychipTensor,
}

/// Backward of fused SwiGLU: `grad_gate = grad_out * up * silu'(gate)`,
/// `grad_up = grad_out * silu(gate)`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipSwigluBackwardArgs {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// Gate projection (forward input).
    pub gate: PolychipTensor,
    /// Up projection (forward input).
    pub up: PolychipTensor,
    /// Gradient of the output.
    pub grad_out: PolychipTensor,
    /// Gradient of `gate`.
    pub grad_gate: PolychipTensor,
    /// Gradient of `up`.
    pub grad_up: PolychipTensor,
}

//! The checked, safe arguments a Rust plugin's operator methods receive,
//! one struct per ABI args struct, and the enums that tell operators sharing
//! an args struct apart.

use crate::tensor::TensorDesc;

/// Arguments of `fill`, checked by [`crate::check::fill`].
#[derive(Debug, Clone, Copy)]
pub struct FillArgs<'a> {
    /// Output.
    pub out: TensorDesc<'a>,
    /// The value.
    pub value: f64,
}

/// Arguments of `copy` and `cast`, checked by [`crate::check::copy`] or
/// [`crate::check::cast`].
#[derive(Debug, Clone, Copy)]
pub struct CopyArgs<'a> {
    /// Source.
    pub src: TensorDesc<'a>,
    /// Destination.
    pub dst: TensorDesc<'a>,
}

/// Which elementwise binary operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    /// `a + alpha * b`.
    Add,
    /// `a - alpha * b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
}

impl BinaryOp {
    /// The operator's name in the op table.
    pub const fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
        }
    }
}

/// Arguments of `add`, `sub`, `mul`, `div`, checked by [`crate::check::binary`].
#[derive(Debug, Clone, Copy)]
pub struct BinaryArgs<'a> {
    /// Which operator.
    pub op: BinaryOp,
    /// Left operand.
    pub a: TensorDesc<'a>,
    /// Right operand.
    pub b: TensorDesc<'a>,
    /// Result.
    pub out: TensorDesc<'a>,
    /// Scale of `b` for add and sub.
    pub alpha: f64,
}

/// Arguments of `matmul`, checked by [`crate::check::matmul`].
#[derive(Debug, Clone, Copy)]
pub struct MatmulArgs<'a> {
    /// Left operand.
    pub a: TensorDesc<'a>,
    /// Right operand.
    pub b: TensorDesc<'a>,
    /// Result and accumulator.
    pub out: TensorDesc<'a>,
    /// Scale of the product.
    pub alpha: f64,
    /// Scale of the previous `out`; 0 means `out` is not read.
    pub beta: f64,
    /// Transpose the last two dimensions of `a`.
    pub transpose_a: bool,
    /// Transpose the last two dimensions of `b`.
    pub transpose_b: bool,
}

/// Arguments of `softmax`, checked by [`crate::check::softmax`].
#[derive(Debug, Clone, Copy)]
pub struct SoftmaxArgs<'a> {
    /// Logits.
    pub input: TensorDesc<'a>,
    /// Probabilities.
    pub out: TensorDesc<'a>,
}

/// Which unary operator ([`crate::Plugin::unary`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    /// `-x`.
    Neg,
    /// `e^x`.
    Exp,
    /// `ln x`.
    Log,
    /// `sqrt x`.
    Sqrt,
    /// `1 / sqrt x`.
    Rsqrt,
    /// `tanh x`.
    Tanh,
    /// `max(x, 0)`.
    Relu,
    /// `x sigmoid(x)`.
    Silu,
    /// GELU, tanh form.
    Gelu,
}

impl UnaryOp {
    /// Every unary operator.
    pub const ALL: [UnaryOp; 9] = [
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Tanh,
        UnaryOp::Relu,
        UnaryOp::Silu,
        UnaryOp::Gelu,
    ];

    /// The operator's name in the op table.
    pub const fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Relu => "relu",
            UnaryOp::Silu => "silu",
            UnaryOp::Gelu => "gelu",
        }
    }
}

/// Which activation a backward operator differentiates ([`crate::Plugin::activation_backward`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivationOp {
    /// `relu_backward`.
    Relu,
    /// `silu_backward`.
    Silu,
    /// `gelu_backward`.
    Gelu,
}

impl ActivationOp {
    /// Every activation with a backward operator.
    pub const ALL: [ActivationOp; 3] = [ActivationOp::Relu, ActivationOp::Silu, ActivationOp::Gelu];

    /// The backward operator's name in the op table.
    pub const fn name(self) -> &'static str {
        match self {
            ActivationOp::Relu => "relu_backward",
            ActivationOp::Silu => "silu_backward",
            ActivationOp::Gelu => "gelu_backward",
        }
    }
}

/// Which reduction ([`crate::Plugin::reduce`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// `sum`.
    Sum,
    /// `mean`.
    Mean,
    /// `max`.
    Max,
    /// `argmax` (i64 output).
    Argmax,
}

impl ReduceOp {
    /// Every reduction.
    pub const ALL: [ReduceOp; 4] = [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Argmax,
    ];

    /// The operator's name in the op table.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Argmax => "argmax",
        }
    }
}

/// Arguments of the unary operators, checked by [`crate::check::unary`].
#[derive(Debug, Clone, Copy)]
pub struct UnaryArgs<'a> {
    /// Input.
    pub input: TensorDesc<'a>,
    /// Output.
    pub out: TensorDesc<'a>,
}

/// Arguments of `pow_scalar`.
#[derive(Debug, Clone, Copy)]
pub struct PowScalarArgs<'a> {
    /// Base.
    pub input: TensorDesc<'a>,
    /// Output.
    pub out: TensorDesc<'a>,
    /// Exponent.
    pub exponent: f64,
}

/// Arguments of the activation backward operators.
#[derive(Debug, Clone, Copy)]
pub struct ActivationBackwardArgs<'a> {
    /// Gradient of the output.
    pub grad_out: TensorDesc<'a>,
    /// The forward input.
    pub input: TensorDesc<'a>,
    /// Gradient of the input.
    pub grad_in: TensorDesc<'a>,
}

/// Arguments of `swiglu`.
#[derive(Debug, Clone, Copy)]
pub struct SwigluArgs<'a> {
    /// Gate.
    pub gate: TensorDesc<'a>,
    /// Up.
    pub up: TensorDesc<'a>,
    /// Output.
    pub out: TensorDesc<'a>,
}

/// Arguments of `swiglu_backward`.
#[derive(Debug, Clone, Copy)]
pub struct SwigluBackwardArgs<'a> {
    /// Gate.
    pub gate: TensorDesc<'a>,
    /// Up.
    pub up: TensorDesc<'a>,
    /// Gradient of the output.
    pub grad_out: TensorDesc<'a>,
    /// Gradient of `gate`.
    pub grad_gate: TensorDesc<'a>,
    /// Gradient of `up`.
    pub grad_up: TensorDesc<'a>,
}

/// Arguments of the reductions; `dim` is already counted from the front.
#[derive(Debug, Clone, Copy)]
pub struct ReduceArgs<'a> {
    /// Input.
    pub input: TensorDesc<'a>,
    /// Output.
    pub out: TensorDesc<'a>,
    /// The reduced dimension, `0..input.ndim()`.
    pub dim: usize,
    /// Keep the reduced dimension with extent 1.
    pub keepdim: bool,
}

/// Arguments of `sum_squares`.
#[derive(Debug, Clone, Copy)]
pub struct SumSquaresArgs<'a> {
    /// Input.
    pub input: TensorDesc<'a>,
    /// 0-dimensional f32 output.
    pub out: TensorDesc<'a>,
}

/// Arguments of `linear`.
#[derive(Debug, Clone, Copy)]
pub struct LinearArgs<'a> {
    /// `[..., K]`.
    pub input: TensorDesc<'a>,
    /// `[N, K]`.
    pub weight: TensorDesc<'a>,
    /// `[N]`, when present.
    pub bias: Option<TensorDesc<'a>>,
    /// `[..., N]`.
    pub out: TensorDesc<'a>,
}

/// Arguments of `softmax_backward` and `log_softmax_backward`.
#[derive(Debug, Clone, Copy)]
pub struct SoftmaxBackwardArgs<'a> {
    /// The forward output.
    pub out: TensorDesc<'a>,
    /// Gradient of the forward output.
    pub grad_out: TensorDesc<'a>,
    /// Gradient of the forward input.
    pub grad_in: TensorDesc<'a>,
}

/// Arguments of `rms_norm`.
#[derive(Debug, Clone, Copy)]
pub struct RmsNormArgs<'a> {
    /// `[..., H]`.
    pub input: TensorDesc<'a>,
    /// `[H]`.
    pub weight: TensorDesc<'a>,
    /// `[..., H]`.
    pub out: TensorDesc<'a>,
    /// `[...]` f32.
    pub inv_rms: TensorDesc<'a>,
    /// Epsilon.
    pub eps: f64,
}

/// Arguments of `rms_norm_backward`.
#[derive(Debug, Clone, Copy)]
pub struct RmsNormBackwardArgs<'a> {
    /// `[..., H]`.
    pub grad_out: TensorDesc<'a>,
    /// `[..., H]`.
    pub input: TensorDesc<'a>,
    /// `[H]`.
    pub weight: TensorDesc<'a>,
    /// `[...]` f32.
    pub inv_rms: TensorDesc<'a>,
    /// `[..., H]`.
    pub grad_input: TensorDesc<'a>,
    /// `[H]`.
    pub grad_weight: TensorDesc<'a>,
}

/// Arguments of `layer_norm`.
#[derive(Debug, Clone, Copy)]
pub struct LayerNormArgs<'a> {
    /// `[..., H]`.
    pub input: TensorDesc<'a>,
    /// `[H]`.
    pub weight: TensorDesc<'a>,
    /// `[H]`.
    pub bias: TensorDesc<'a>,
    /// `[..., H]`.
    pub out: TensorDesc<'a>,
    /// `[...]` f32.
    pub mean: TensorDesc<'a>,
    /// `[...]` f32.
    pub rstd: TensorDesc<'a>,
    /// Epsilon.
    pub eps: f64,
}

/// Arguments of `layer_norm_backward`.
#[derive(Debug, Clone, Copy)]
pub struct LayerNormBackwardArgs<'a> {
    /// `[..., H]`.
    pub grad_out: TensorDesc<'a>,
    /// `[..., H]`.
    pub input: TensorDesc<'a>,
    /// `[H]`.
    pub weight: TensorDesc<'a>,
    /// `[...]` f32.
    pub mean: TensorDesc<'a>,
    /// `[...]` f32.
    pub rstd: TensorDesc<'a>,
    /// `[..., H]`.
    pub grad_input: TensorDesc<'a>,
    /// `[H]`.
    pub grad_weight: TensorDesc<'a>,
    /// `[H]`.
    pub grad_bias: TensorDesc<'a>,
}

/// Arguments of `rope` and `rope_backward`.
#[derive(Debug, Clone, Copy)]
pub struct RopeArgs<'a> {
    /// `[batch, seq, heads, D]`.
    pub input: TensorDesc<'a>,
    /// `[seq, D/2]` f32.
    pub cos: TensorDesc<'a>,
    /// `[seq, D/2]` f32.
    pub sin: TensorDesc<'a>,
    /// Like `input`.
    pub out: TensorDesc<'a>,
    /// Interleaved pairs (else half-split).
    pub interleaved: bool,
}

/// Arguments of `attention`.
#[derive(Debug, Clone, Copy)]
pub struct AttentionArgs<'a> {
    /// `[batch, heads_q, seq_q, D]`.
    pub q: TensorDesc<'a>,
    /// `[batch, heads_kv, seq_kv, D]`.
    pub k: TensorDesc<'a>,
    /// `[batch, heads_kv, seq_kv, D]`.
    pub v: TensorDesc<'a>,
    /// Like `q`.
    pub out: TensorDesc<'a>,
    /// `[batch, heads_q, seq_q]` f32.
    pub lse: TensorDesc<'a>,
    /// Score scale.
    pub scale: f64,
    /// Causal mask.
    pub causal: bool,
}

/// Arguments of `attention_backward`.
#[derive(Debug, Clone, Copy)]
pub struct AttentionBackwardArgs<'a> {
    /// Queries.
    pub q: TensorDesc<'a>,
    /// Keys.
    pub k: TensorDesc<'a>,
    /// Values.
    pub v: TensorDesc<'a>,
    /// Forward output.
    pub out: TensorDesc<'a>,
    /// Forward log-sum-exp.
    pub lse: TensorDesc<'a>,
    /// Gradient of `out`.
    pub grad_out: TensorDesc<'a>,
    /// Gradient of `q`.
    pub grad_q: TensorDesc<'a>,
    /// Gradient of `k`.
    pub grad_k: TensorDesc<'a>,
    /// Gradient of `v`.
    pub grad_v: TensorDesc<'a>,
    /// Score scale.
    pub scale: f64,
    /// Causal mask.
    pub causal: bool,
}

/// Arguments of `embedding`.
#[derive(Debug, Clone, Copy)]
pub struct EmbeddingArgs<'a> {
    /// `[V, H]`.
    pub weight: TensorDesc<'a>,
    /// i32 or i64 indices.
    pub indices: TensorDesc<'a>,
    /// `[indices..., H]`.
    pub out: TensorDesc<'a>,
}

/// Arguments of `embedding_backward`.
#[derive(Debug, Clone, Copy)]
pub struct EmbeddingBackwardArgs<'a> {
    /// `[indices..., H]`.
    pub grad_out: TensorDesc<'a>,
    /// i32 or i64 indices.
    pub indices: TensorDesc<'a>,
    /// `[V, H]`, accumulated into.
    pub grad_weight: TensorDesc<'a>,
}

/// Arguments of `cross_entropy`.
#[derive(Debug, Clone, Copy)]
pub struct CrossEntropyArgs<'a> {
    /// `[N, C]`.
    pub logits: TensorDesc<'a>,
    /// `[N]` i32 or i64.
    pub targets: TensorDesc<'a>,
    /// 0-dimensional f32.
    pub loss: TensorDesc<'a>,
    /// Skipped target value.
    pub ignore_index: i64,
}

/// Arguments of `cross_entropy_backward`.
#[derive(Debug, Clone, Copy)]
pub struct CrossEntropyBackwardArgs<'a> {
    /// `[N, C]`.
    pub logits: TensorDesc<'a>,
    /// `[N]` i32 or i64.
    pub targets: TensorDesc<'a>,
    /// `[N, C]`.
    pub grad_logits: TensorDesc<'a>,
    /// Gradient of the loss.
    pub grad_loss: f64,
    /// Skipped target value.
    pub ignore_index: i64,
}

/// Arguments of `adamw`.
#[derive(Debug, Clone, Copy)]
pub struct AdamwArgs<'a> {
    /// Parameters.
    pub param: TensorDesc<'a>,
    /// Gradients.
    pub grad: TensorDesc<'a>,
    /// First moment (f32).
    pub exp_avg: TensorDesc<'a>,
    /// Second moment (f32).
    pub exp_avg_sq: TensorDesc<'a>,
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// 1-based step.
    pub step: i64,
}

/// Arguments of `scale`.
#[derive(Debug, Clone, Copy)]
pub struct ScaleArgs<'a> {
    /// Updated in place.
    pub tensor: TensorDesc<'a>,
    /// Factor.
    pub alpha: f64,
}

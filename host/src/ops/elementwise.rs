//! Operator calls of ABI 1.1: elementwise math and activations,
//! reductions, linear and the softmax family here; the layer operators in
//! `layers.rs`, the training-step operators in `training.rs`. Each checks
//! its arguments with [`polychip_plugin_sdk::check`] and calls the plugin's
//! entry.

use std::mem::size_of;

use polychip_plugin_sdk::abi::*;
use polychip_plugin_sdk::check;
use polychip_plugin_sdk::{ActivationOp, ReduceOp, UnaryOp};

use crate::error::Result;
use crate::ops::Exec;
use crate::tensor::Tensor;

fn unary_entry(ops: &PolychipOpTable, op: UnaryOp) -> PolychipUnaryFn {
    match op {
        UnaryOp::Neg => ops.neg,
        UnaryOp::Exp => ops.exp,
        UnaryOp::Log => ops.log,
        UnaryOp::Sqrt => ops.sqrt,
        UnaryOp::Rsqrt => ops.rsqrt,
        UnaryOp::Tanh => ops.tanh,
        UnaryOp::Relu => ops.relu,
        UnaryOp::Silu => ops.silu,
        UnaryOp::Gelu => ops.gelu,
    }
}

impl Exec<'_> {
    /// A unary operator (`neg`, `exp`, `log`, `sqrt`, `rsqrt`, `tanh`, `relu`, `silu`, `gelu`).
    pub fn unary(&self, op: UnaryOp, input: &Tensor, out: &Tensor) -> Result<()> {
        let name = op.name();
        let tensors = [("input", input), ("out", out)];
        self.on_device(name, &tensors)?;
        check::unary(op.name(), &input.desc(), &out.desc()).map_err(|e| self.invalid(e))?;
        let args = PolychipUnaryArgs {
            struct_size: size_of::<PolychipUnaryArgs>(),
            input: input.raw(),
            out: out.raw(),
        };
        let ops = &self.device().plugin().ops;
        self.call(name, unary_entry(ops, op), &args, &tensors)
    }

    /// `out = input ^ exponent`.
    pub fn pow_scalar(&self, input: &Tensor, out: &Tensor, exponent: f64) -> Result<()> {
        let name = "pow_scalar";
        let tensors = [("input", input), ("out", out)];
        self.on_device(name, &tensors)?;
        check::unary("pow_scalar", &input.desc(), &out.desc()).map_err(|e| self.invalid(e))?;
        let args = PolychipPowScalarArgs {
            struct_size: size_of::<PolychipPowScalarArgs>(),
            input: input.raw(),
            out: out.raw(),
            exponent,
        };
        let ops = &self.device().plugin().ops;
        self.call(name, ops.pow_scalar, &args, &tensors)
    }

    /// `grad_in = grad_out * f'(input)` for relu, silu or gelu.
    pub fn activation_backward(
        &self,
        op: ActivationOp,
        grad_out: &Tensor,
        input: &Tensor,
        grad_in: &Tensor,
    ) -> Result<()> {
        let name = op.name();
        let tensors = [
            ("grad_out", grad_out),
            ("input", input),
            ("grad_in", grad_in),
        ];
        self.on_device(name, &tensors)?;
        check::activation_backward(op.name(), &grad_out.desc(), &input.desc(), &grad_in.desc())
            .map_err(|e| self.invalid(e))?;
        let args = PolychipActivationBackwardArgs {
            struct_size: size_of::<PolychipActivationBackwardArgs>(),
            grad_out: grad_out.raw(),
            input: input.raw(),
            grad_in: grad_in.raw(),
        };
        let ops = &self.device().plugin().ops;
        self.call(
            name,
            match op {
                ActivationOp::Relu => ops.relu_backward,
                ActivationOp::Silu => ops.silu_backward,
                ActivationOp::Gelu => ops.gelu_backward,
            },
            &args,
            &tensors,
        )
    }

    /// `out = silu(gate) * up`.
    pub fn swiglu(&self, gate: &Tensor, up: &Tensor, out: &Tensor) -> Result<()> {
        let name = "swiglu";
        let tensors = [("gate", gate), ("up", up), ("out", out)];
        self.on_device(name, &tensors)?;
        check::swiglu(&gate.desc(), &up.desc(), &out.desc()).map_err(|e| self.invalid(e))?;
        let args = PolychipSwigluArgs {
            struct_size: size_of::<PolychipSwigluArgs>(),
            gate: gate.raw(),
            up: up.raw(),
            out: out.raw(),
        };
        let ops = &self.device().plugin().ops;
        self.call(name, ops.swiglu, &args, &tensors)
    }

    /// Backward of `swiglu`.
    pub fn swiglu_backward(
        &self,
        gate: &Tensor,
        up: &Tensor,
        grad_out: &Tensor,
        grad_gate: &Tensor,
        grad_up: &Tensor,
    ) -> Result<()> {
        let name = "swiglu_backward";
        let tensors = [
            ("gate", gate),
            ("up", up),
            ("grad_out", grad_out),
            ("grad_gate", grad_gate),
            ("grad_up", grad_up),
        ];
        self.on_device(name, &tensors)?;
        check::swiglu_backward(
            &gate.desc(),
            &up.desc(),
            &grad_out.desc(),
            &grad_gate.desc(),
            &grad_up.desc(),
        )
        .map_err(|e| self.invalid(e))?;
        let args = PolychipSwigluBackwardArgs {
            struct_size: size_of::<PolychipSwigluBackwardArgs>(),
            gate: gate.raw(),
            up: up.raw(),
            grad_out: grad_out.raw(),
            grad_gate: grad_gate.raw(),
            grad_up: grad_up.raw(),
        };
        let ops = &self.device().plugin().ops;
        self.call(name, ops.swiglu_backward, &args, &tensors)
    }

    /// `sum`, `mean`, `max` or `argmax` over dimension `dim` (negative counts from the end).
    pub fn reduce(
        &self,
        op: ReduceOp,
        input: &Tensor,
        out: &Tensor,
        dim: i32,
        keepdim: bool,
    ) -> Result<()> {
        let name = op.name();
        let tensors = [("input", input), ("out", out)];
        self.on_device(name, &tensors)?;
        check::reduce(op.name(), &input.desc(), &out.desc(), dim, keepdim)
            .map(|_| ())
            .map_err(|e| self.invalid(e))?;
        let args = PolychipReduceArgs {
            struct_size: size_of::<PolychipReduceArgs>(),
            input: input.raw(),
            out: out.raw(),
            dim,
            keepdim: u8::from(keepdim),
        };
        let ops = &self.device().plugin().ops;
        self.call(
            name,
            match op {
                ReduceOp::Sum => ops.sum,
                ReduceOp::Mean => ops.mean,
                ReduceOp::Max => ops.max,
                ReduceOp::Argmax => ops.argmax,
            },
            &args,
            &tensors,
        )
    }

    /// `out = sum(input^2)` into a 0-dimensional f32 tensor.
    pub fn sum_squares(&self, input: &Tensor, out: &Tensor) -> Result<()> {
        let name = "sum_squares";
        let tensors = [("input", input), ("out", out)];
        self.on_device(name, &tensors)?;
        check::sum_squares(&input.desc(), &out.desc()).map_err(|e| self.invalid(e))?;
        let args = PolychipSumSquaresArgs {
            struct_size: size_of::<PolychipSumSquaresArgs>(),
            input: input.raw(),
            out: out.raw(),
        };
        let ops = &self.device().plugin().ops;
        self.call(name, ops.sum_squares, &args, &tensors)
    }

    /// Log-softmax over the last dimension.
    pub fn log_softmax(&self, input: &Tensor, out: &Tensor) -> Result<()> {
        let name = "log_softmax";
        let tensors = [("input", input), ("out", out)];
        self.on_device(name, &tensors)?;
        check::log_softmax(&input.desc(), &out.desc()).map_err(|e| self.invalid(e))?;
        let args = PolychipSoftmaxArgs {
            struct_size: size_of::<PolychipSoftmaxArgs>(),
            input: input.raw(),
            out: out.raw(),
        };
        let ops = &self.device().plugin().ops;
        self.call(name, ops.log_softmax, &args, &tensors)
    }

    /// Backward of `softmax` (or of `log_softmax` when `log`).
    pub fn softmax_backward(
        &self,
        log: bool,
        out: &Tensor,
        grad_out: &Tensor,
        grad_in: &Tensor,
    ) -> Result<()> {
        let name = if log {
            "log_softmax_backward"
        } else {
            "softmax_backward"
        };
        let tensors = [("out", out), ("grad_out", grad_out), ("grad_in", grad_in)];
        self.on_device(name, &tensors)?;
        check::softmax_backward(name, &out.desc(), &grad_out.desc(), &grad_in.desc())
            .map_err(|e| self.invalid(e))?;
        let args = PolychipSoftmaxBackwardArgs {
            struct_size: size_of::<PolychipSoftmaxBackwardArgs>(),
            out: out.raw(),
            grad_out: grad_out.raw(),
            grad_in: grad_in.raw(),
        };
        let ops = &self.device().plugin().ops;
        self.call(
            name,
            if log {
                ops.log_softmax_backward
            } else {
                ops.softmax_backward
            },
            &args,
            &tensors,
        )
    }

    /// `out = input @ weight^T + bias` (no bias when `bias` is `None`).
    pub fn linear(
        &self,
        input: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
    ) -> Result<()> {
        let name = "linear";
        let tensors = [("input", input), ("weight", weight), ("out", out)];
        self.on_device(name, &tensors)?;
        if let Some(b) = bias {
            self.on_device(name, &[("bias", b)])?;
        }
        let bias_desc = bias.map(Tensor::desc);
        check::linear(
            &input.desc(),
            &weight.desc(),
            bias_desc.as_ref(),
            &out.desc(),
        )
        .map_err(|e| self.invalid(e))?;
        let args = PolychipLinearArgs {
            struct_size: size_of::<PolychipLinearArgs>(),
            input: input.raw(),
            weight: weight.raw(),
            bias: bias.map_or(weight.raw(), Tensor::raw),
            out: out.raw(),
            has_bias: u8::from(bias.is_some()),
        };
        self.call(name, self.device().plugin().ops.linear, &args, &tensors)?;
        if let Some(b) = bias {
            self.pin(b);
        }
        Ok(())
    }
}

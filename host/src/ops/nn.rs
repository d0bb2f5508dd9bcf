//! Operator calls of ABI 1.1: elementwise math and activations,
//! reductions, normalisations, rotary embeddings, attention, embedding,
//! cross-entropy, AdamW and scaling. Each checks its arguments with
//! [`polychip_plugin_sdk::check`] and calls the plugin's entry.

use std::mem::size_of;

use polychip_plugin_sdk::abi::*;
use polychip_plugin_sdk::check;
use polychip_plugin_sdk::{ActivationOp, ReduceOp, UnaryOp};

use crate::error::Result;
use crate::ops::Exec;
use crate::tensor::Tensor;

/// Hyper-parameters of [`Exec::adamw`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamwOptions {
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
    /// The 1-based step number.
    pub step: i64,
}

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

    /// RMSNorm over the last dimension, saving the inverse RMS.
    pub fn rms_norm(
        &self,
        input: &Tensor,
        weight: &Tensor,
        out: &Tensor,
        inv_rms: &Tensor,
        eps: f64,
    ) -> Result<()> {
        let name = "rms_norm";
        let tensors = [
            ("input", input),
            ("weight", weight),
            ("out", out),
            ("inv_rms", inv_rms),
        ];
        self.on_device(name, &tensors)?;
        check::rms_norm(&input.desc(), &weight.desc(), &out.desc(), &inv_rms.desc())
            .map_err(|e| self.invalid(e))?;
        let args = PolychipRmsNormArgs {
            struct_size: size_of::<PolychipRmsNormArgs>(),
            input: input.raw(),
            weight: weight.raw(),
            out: out.raw(),
            inv_rms: inv_rms.raw(),
            eps,
        };
        let ops = &self.device().plugin().ops;
        self.call(name, ops.rms_norm, &args, &tensors)
    }

    /// Backward of `rms_norm`.
    pub fn rms_norm_backward(
        &self,
        grad_out: &Tensor,
        input: &Tensor,
        weight: &Tensor,
        inv_rms: &Tensor,
        grad_input: &Tensor,
        grad_weight: &Tensor,
    ) -> Result<()> {
        let name = "rms_norm_backward";
        let tensors = [
            ("grad_out", grad_out),
            ("input", input),
            ("weight", weight),
            ("inv_rms", inv_rms),
            ("grad_input", grad_input),
            ("grad_weight", grad_weight),
        ];
        self.on_device(name, &tensors)?;
        check::rms_norm_backward(
            &grad_out.desc(),
            &input.desc(),
            &weight.desc(),
            &inv_rms.desc(),
            &grad_input.desc(),
            &grad_weight.desc(),
        )
        .map_err(|e| self.invalid(e))?;
        let args = PolychipRmsNormBackwardArgs {
            struct_size: size_of::<PolychipRmsNormBackwardArgs>(),
            grad_out: grad_out.raw(),
            input: input.raw(),
            weight: weight.raw(),
            inv_rms: inv_rms.raw(),
            grad_input: grad_input.raw(),
            grad_weight: grad_weight.raw(),
        };
        let ops = &self.device().plugin().ops;
        self.call(name, ops.rms_norm_backward, &args, &tensors)
    }

    /// LayerNorm over the last dimension, saving mean and rstd.
    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm(
        &self,
        input: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        out: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
        eps: f64,
    ) -> Result<()> {
        let name = "layer_norm";
        let tensors = [
            ("input", input),
            ("weight", weight),
            ("bias", bias),
            ("out", out),
            ("mean", mean),
            ("rstd", rstd),
        ];
        self.on_device(name, &tensors)?;
        check::layer_norm(
            &input.desc(),
            &weight.desc(),
            &bias.desc(),
            &out.desc(),
            &mean.desc(),
            &rstd.desc(),
        )
        .map_err(|e| self.invalid(e))?;
        let args = PolychipLayerNormArgs {
            struct_size: size_of::<PolychipLayerNormArgs>(),
            input: input.raw(),
            weight: weight.raw(),
            bias: bias.raw(),
            out: out.raw(),
            mean: mean.raw(),
            rstd: rstd.raw(),
            eps,
        };
        let ops = &self.device().plugin().ops;
        self.call(name, ops.layer_norm, &args, &tensors)
    }

    /// Backward of `layer_norm`.
    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm_backward(
        &self,
        grad_out: &Tensor,
        input: &Tensor,
        weight: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
        grad_input: &Tensor,
        grad_weight: &Tensor,
        grad_bias: &Tensor,
    ) -> Result<()> {
        let name = "layer_norm_backward";
        let tensors = [
            ("grad_out", grad_out),
            ("input", input),
            ("weight", weight),
            ("mean", mean),
            ("rstd", rstd),
            ("grad_input", grad_input),
            ("grad_weight", grad_weight),
            ("grad_bias", grad_bias),
        ];
        self.on_device(name, &tensors)?;
        check::layer_norm_backward(
            &grad_out.desc(),
            &input.desc(),
            &weight.desc(),
            &mean.desc(),
            &rstd.desc(),
            &grad_input.desc(),
            &grad_weight.desc(),
            &grad_bias.desc(),
        )
        .map_err(|e| self.invalid(e))?;
        let args = PolychipLayerNormBackwardArgs {
            struct_size: size_of::<PolychipLayerNormBackwardArgs>(),
            grad_out: grad_out.raw(),
            input: input.raw(),
            weight: weight.raw(),
            mean: mean.raw(),
            rstd: rstd.raw(),
            grad_input: grad_input.raw(),
            grad_weight: grad_weight.raw(),
            grad_bias: grad_bias.raw(),
        };
        let ops = &self.device().plugin().ops;
        self.call(name, ops.layer_norm_backward, &args, &tensors)
    }

    /// Rotary position embedding (its inverse when `backward`).
    pub fn rope(
        &self,
        backward: bool,
        input: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        out: &Tensor,
        interleaved: bool,
    ) -> Result<()> {
        let name = if backward { "rope_backward" } else { "rope" };
        let tensors = [("input", input), ("cos", cos), ("sin", sin), ("out", out)];
        self.on_device(name, &tensors)?;
        check::rope(name, &input.desc(), &cos.desc(), &sin.desc(), &out.desc())
            .map_err(|e| self.invalid(e))?;
        let args = PolychipRopeArgs {
            struct_size: size_of::<PolychipRopeArgs>(),
            input: input.raw(),
            cos: cos.raw(),
            sin: sin.raw(),
            out: out.raw(),
            interleaved: u8::from(interleaved),
        };
        let ops = &self.device().plugin().ops;
        self.call(
            name,
            if backward {
                ops.rope_backward
            } else {
                ops.rope
            },
            &args,
            &tensors,
        )
    }

    /// Scaled-dot-product attention with grouped-query heads, saving the log-sum-exp.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        lse: &Tensor,
        scale: f64,
        causal: bool,
    ) -> Result<()> {
        let name = "attention";
        let tensors = [("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse)];
        self.on_device(name, &tensors)?;
        check::attention(&q.desc(), &k.desc(), &v.desc(), &out.desc(), &lse.desc())
            .map_err(|e| self.invalid(e))?;
        let args = PolychipAttentionArgs {
            struct_size: size_of::<PolychipAttentionArgs>(),
            q: q.raw(),
            k: k.raw(),
            v: v.raw(),
            out: out.raw(),
            lse: lse.raw(),
            scale,
            causal: u8::from(causal),
        };
        let ops = &self.device().plugin().ops;
        self.call(name, ops.attention, &args, &tensors)
    }

    /// Backward of `attention`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        lse: &Tensor,
        grad_out: &Tensor,
        grad_q: &Tensor,
        grad_k: &Tensor,
        grad_v: &Tensor,
        scale: f64,
        causal: bool,
    ) -> Result<()> {
        let name = "attention_backward";
        let tensors = [
            ("q", q),
            ("k", k),
            ("v", v),
            ("out", out),
            ("lse", lse),
            ("grad_out", grad_out),
            ("grad_q", grad_q),
            ("grad_k", grad_k),
            ("grad_v", grad_v),
        ];
        self.on_device(name, &tensors)?;
        check::attention_backward(
            &q.desc(),
            &k.desc(),
            &v.desc(),
            &out.desc(),
            &lse.desc(),
            &grad_out.desc(),
            &grad_q.desc(),
            &grad_k.desc(),
            &grad_v.desc(),
        )
        .map_err(|e| self.invalid(e))?;
        let args = PolychipAttentionBackwardArgs {
            struct_size: size_of::<PolychipAttentionBackwardArgs>(),
            q: q.raw(),
            k: k.raw(),
            v: v.raw(),
            out: out.raw(),
            lse: lse.raw(),
            grad_out: grad_out.raw(),
            grad_q: grad_q.raw(),
            grad_k: grad_k.raw(),
            grad_v: grad_v.raw(),
            scale,
            causal: u8::from(causal),
        };
        let ops = &self.device().plugin().ops;
        self.call(name, ops.attention_backward, &args, &tensors)
    }

    /// Embedding lookup.
    pub fn embedding(&self, weight: &Tensor, indices: &Tensor, out: &Tensor) -> Result<()> {
        let name = "embedding";
        let tensors = [("weight", weight), ("indices", indices), ("out", out)];
        self.on_device(name, &tensors)?;
        check::embedding(
            "embedding",
            ("weight", &weight.desc()),
            &indices.desc(),
            ("out", &out.desc()),
        )
        .map_err(|e| self.invalid(e))?;
        let args = PolychipEmbeddingArgs {
            struct_size: size_of::<PolychipEmbeddingArgs>(),
            weight: weight.raw(),
            indices: indices.raw(),
            out: out.raw(),
        };
        let ops = &self.device().plugin().ops;
        self.call(name, ops.embedding, &args, &tensors)
    }

    /// Embedding backward, accumulating into `grad_weight`.
    pub fn embedding_backward(
        &self,
        grad_out: &Tensor,
        indices: &Tensor,
        grad_weight: &Tensor,
    ) -> Result<()> {
        let name = "embedding_backward";
        let tensors = [
            ("grad_out", grad_out),
            ("indices", indices),
            ("grad_weight", grad_weight),
        ];
        self.on_device(name, &tensors)?;
        check::embedding(
            "embedding_backward",
            ("grad_weight", &grad_weight.desc()),
            &indices.desc(),
            ("grad_out", &grad_out.desc()),
        )
        .map_err(|e| self.invalid(e))?;
        let args = PolychipEmbeddingBackwardArgs {
            struct_size: size_of::<PolychipEmbeddingBackwardArgs>(),
            grad_out: grad_out.raw(),
            indices: indices.raw(),
            grad_weight: grad_weight.raw(),
        };
        let ops = &self.device().plugin().ops;
        self.call(name, ops.embedding_backward, &args, &tensors)
    }

    /// Mean cross-entropy into a 0-dimensional f32 `loss`.
    pub fn cross_entropy(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        loss: &Tensor,
        ignore_index: i64,
    ) -> Result<()> {
        let name = "cross_entropy";
        let tensors = [("logits", logits), ("targets", targets), ("loss", loss)];
        self.on_device(name, &tensors)?;
        check::cross_entropy(&logits.desc(), &targets.desc(), &loss.desc())
            .map_err(|e| self.invalid(e))?;
        let args = PolychipCrossEntropyArgs {
            struct_size: size_of::<PolychipCrossEntropyArgs>(),
            logits: logits.raw(),
            targets: targets.raw(),
            loss: loss.raw(),
            ignore_index,
        };
        let ops = &self.device().plugin().ops;
        self.call(name, ops.cross_entropy, &args, &tensors)
    }

    /// Backward of `cross_entropy`.
    pub fn cross_entropy_backward(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        grad_logits: &Tensor,
        grad_loss: f64,
        ignore_index: i64,
    ) -> Result<()> {
        let name = "cross_entropy_backward";
        let tensors = [
            ("logits", logits),
            ("targets", targets),
            ("grad_logits", grad_logits),
        ];
        self.on_device(name, &tensors)?;
        check::cross_entropy_backward(&logits.desc(), &targets.desc(), &grad_logits.desc())
            .map_err(|e| self.invalid(e))?;
        let args = PolychipCrossEntropyBackwardArgs {
            struct_size: size_of::<PolychipCrossEntropyBackwardArgs>(),
            logits: logits.raw(),
            targets: targets.raw(),
            grad_logits: grad_logits.raw(),
            grad_loss,
            ignore_index,
        };
        let ops = &self.device().plugin().ops;
        self.call(name, ops.cross_entropy_backward, &args, &tensors)
    }

    /// One AdamW step in place.
    pub fn adamw(
        &self,
        param: &Tensor,
        grad: &Tensor,
        exp_avg: &Tensor,
        exp_avg_sq: &Tensor,
        h: &AdamwOptions,
    ) -> Result<()> {
        let name = "adamw";
        let tensors = [
            ("param", param),
            ("grad", grad),
            ("exp_avg", exp_avg),
            ("exp_avg_sq", exp_avg_sq),
        ];
        self.on_device(name, &tensors)?;
        check::adamw(
            &param.desc(),
            &grad.desc(),
            &exp_avg.desc(),
            &exp_avg_sq.desc(),
            h.step,
        )
        .map_err(|e| self.invalid(e))?;
        let args = PolychipAdamwArgs {
            struct_size: size_of::<PolychipAdamwArgs>(),
            param: param.raw(),
            grad: grad.raw(),
            exp_avg: exp_avg.raw(),
            exp_avg_sq: exp_avg_sq.raw(),
            lr: h.lr,
            beta1: h.beta1,
            beta2: h.beta2,
            eps: h.eps,
            weight_decay: h.weight_decay,
            step: h.step,
        };
        let ops = &self.device().plugin().ops;
        self.call(name, ops.adamw, &args, &tensors)
    }

    /// `tensor *= alpha` in place.
    pub fn scale(&self, tensor: &Tensor, alpha: f64) -> Result<()> {
        let name = "scale";
        let tensors = [("tensor", tensor)];
        self.on_device(name, &tensors)?;
        check::scale(&tensor.desc()).map_err(|e| self.invalid(e))?;
        let args = PolychipScaleArgs {
            struct_size: size_of::<PolychipScaleArgs>(),
            tensor: tensor.raw(),
            alpha,
        };
        let ops = &self.device().plugin().ops;
        self.call(name, ops.scale, &args, &tensors)
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

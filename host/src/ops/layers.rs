//! Operator calls of the ABI 1.1 layer operators: RMSNorm, LayerNorm,
//! rotary embeddings and attention, forward and backward.

use std::mem::size_of;

use polychip_plugin_sdk::abi::*;
use polychip_plugin_sdk::check;

use crate::error::Result;
use crate::ops::Exec;
use crate::tensor::Tensor;

impl Exec<'_> {
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
}

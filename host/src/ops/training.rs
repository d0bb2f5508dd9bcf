//! Operator calls of the ABI 1.1 operators around the layers of a
//! training step: embedding, cross-entropy, AdamW and scale.

use std::mem::size_of;

use polychip_plugin_sdk::abi::*;
use polychip_plugin_sdk::check;

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

impl Exec<'_> {
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
}

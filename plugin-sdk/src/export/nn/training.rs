//! The `extern "C"` shims of the ABI 1.1 training-step operators (embedding, cross-entropy, AdamW, scale).

use crate::__export::{args_ref, guard, plugin, queue, tensor};
use crate::abi::{self, PolychipError, PolychipStream};
use crate::args::*;
use crate::check;
use crate::plugin::Plugin;

pub(in crate::__export) unsafe extern "C" fn embedding<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipEmbeddingArgs,
) -> *mut PolychipError {
    let name = "embedding";
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let weight = tensor(name, "weight", device, &raw.weight)?;
            let indices = tensor(name, "indices", device, &raw.indices)?;
            let out = tensor(name, "out", device, &raw.out)?;
            check::embedding(name, ("weight", &weight), &indices, ("out", &out))?;
            plugin::<P>().embedding(
                queue,
                &EmbeddingArgs {
                    weight,
                    indices,
                    out,
                },
            )
        }
    })
}

pub(in crate::__export) unsafe extern "C" fn embedding_backward<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipEmbeddingBackwardArgs,
) -> *mut PolychipError {
    let name = "embedding_backward";
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let grad_out = tensor(name, "grad_out", device, &raw.grad_out)?;
            let indices = tensor(name, "indices", device, &raw.indices)?;
            let grad_weight = tensor(name, "grad_weight", device, &raw.grad_weight)?;
            check::embedding(
                name,
                ("grad_weight", &grad_weight),
                &indices,
                ("grad_out", &grad_out),
            )?;
            plugin::<P>().embedding_backward(
                queue,
                &EmbeddingBackwardArgs {
                    grad_out,
                    indices,
                    grad_weight,
                },
            )
        }
    })
}

pub(in crate::__export) unsafe extern "C" fn cross_entropy<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipCrossEntropyArgs,
) -> *mut PolychipError {
    let name = "cross_entropy";
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let logits = tensor(name, "logits", device, &raw.logits)?;
            let targets = tensor(name, "targets", device, &raw.targets)?;
            let loss = tensor(name, "loss", device, &raw.loss)?;
            check::cross_entropy(&logits, &targets, &loss)?;
            plugin::<P>().cross_entropy(
                queue,
                &CrossEntropyArgs {
                    logits,
                    targets,
                    loss,
                    ignore_index: raw.ignore_index,
                },
            )
        }
    })
}

pub(in crate::__export) unsafe extern "C" fn cross_entropy_backward<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipCrossEntropyBackwardArgs,
) -> *mut PolychipError {
    let name = "cross_entropy_backward";
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let logits = tensor(name, "logits", device, &raw.logits)?;
            let targets = tensor(name, "targets", device, &raw.targets)?;
            let grad_logits = tensor(name, "grad_logits", device, &raw.grad_logits)?;
            check::cross_entropy_backward(&logits, &targets, &grad_logits)?;
            plugin::<P>().cross_entropy_backward(
                queue,
                &CrossEntropyBackwardArgs {
                    logits,
                    targets,
                    grad_logits,
                    grad_loss: raw.grad_loss,
                    ignore_index: raw.ignore_index,
                },
            )
        }
    })
}

pub(in crate::__export) unsafe extern "C" fn adamw<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipAdamwArgs,
) -> *mut PolychipError {
    let name = "adamw";
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let param = tensor(name, "param", device, &raw.param)?;
            let grad = tensor(name, "grad", device, &raw.grad)?;
            let exp_avg = tensor(name, "exp_avg", device, &raw.exp_avg)?;
            let exp_avg_sq = tensor(name, "exp_avg_sq", device, &raw.exp_avg_sq)?;
            check::adamw(&param, &grad, &exp_avg, &exp_avg_sq, raw.step)?;
            plugin::<P>().adamw(
                queue,
                &AdamwArgs {
                    param,
                    grad,
                    exp_avg,
                    exp_avg_sq,
                    lr: raw.lr,
                    beta1: raw.beta1,
                    beta2: raw.beta2,
                    eps: raw.eps,
                    weight_decay: raw.weight_decay,
                    step: raw.step,
                },
            )
        }
    })
}

pub(in crate::__export) unsafe extern "C" fn scale<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipScaleArgs,
) -> *mut PolychipError {
    let name = "scale";
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let tensor = tensor(name, "tensor", device, &raw.tensor)?;
            check::scale(&tensor)?;
            plugin::<P>().scale(
                queue,
                &ScaleArgs {
                    tensor,
                    alpha: raw.alpha,
                },
            )
        }
    })
}

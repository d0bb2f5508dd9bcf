//! The `extern "C"` shims of the operators added in ABI 1.1: each reads
//! its args struct, checks the tensors with [`crate::check`], and calls the
//! [`Plugin`] method. Operators that share an args struct share a shim, told
//! apart by a const parameter.

use super::{args_ref, guard, plugin, queue, tensor};
use crate::abi::{self, PolychipError, PolychipStream};
use crate::args::*;
use crate::check;
use crate::plugin::Plugin;

pub(super) unsafe extern "C" fn unary<P: Plugin, const OP: u8>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipUnaryArgs,
) -> *mut PolychipError {
    let name = UnaryOp::ALL[OP as usize].name();
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let input = tensor(name, "input", device, &raw.input)?;
            let out = tensor(name, "out", device, &raw.out)?;
            check::unary(name, &input, &out)?;
            plugin::<P>().unary(queue, UnaryOp::ALL[OP as usize], &UnaryArgs { input, out })
        }
    })
}

pub(super) unsafe extern "C" fn pow_scalar<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipPowScalarArgs,
) -> *mut PolychipError {
    let name = "pow_scalar";
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let input = tensor(name, "input", device, &raw.input)?;
            let out = tensor(name, "out", device, &raw.out)?;
            check::unary(name, &input, &out)?;
            plugin::<P>().pow_scalar(
                queue,
                &PowScalarArgs {
                    input,
                    out,
                    exponent: raw.exponent,
                },
            )
        }
    })
}

pub(super) unsafe extern "C" fn activation_backward<P: Plugin, const OP: u8>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipActivationBackwardArgs,
) -> *mut PolychipError {
    let name = ActivationOp::ALL[OP as usize].name();
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let grad_out = tensor(name, "grad_out", device, &raw.grad_out)?;
            let input = tensor(name, "input", device, &raw.input)?;
            let grad_in = tensor(name, "grad_in", device, &raw.grad_in)?;
            check::activation_backward(name, &grad_out, &input, &grad_in)?;
            plugin::<P>().activation_backward(
                queue,
                ActivationOp::ALL[OP as usize],
                &ActivationBackwardArgs {
                    grad_out,
                    input,
                    grad_in,
                },
            )
        }
    })
}

pub(super) unsafe extern "C" fn swiglu<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipSwigluArgs,
) -> *mut PolychipError {
    let name = "swiglu";
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let gate = tensor(name, "gate", device, &raw.gate)?;
            let up = tensor(name, "up", device, &raw.up)?;
            let out = tensor(name, "out", device, &raw.out)?;
            check::swiglu(&gate, &up, &out)?;
            plugin::<P>().swiglu(queue, &SwigluArgs { gate, up, out })
        }
    })
}

pub(super) unsafe extern "C" fn swiglu_backward<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipSwigluBackwardArgs,
) -> *mut PolychipError {
    let name = "swiglu_backward";
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let gate = tensor(name, "gate", device, &raw.gate)?;
            let up = tensor(name, "up", device, &raw.up)?;
            let grad_out = tensor(name, "grad_out", device, &raw.grad_out)?;
            let grad_gate = tensor(name, "grad_gate", device, &raw.grad_gate)?;
            let grad_up = tensor(name, "grad_up", device, &raw.grad_up)?;
            check::swiglu_backward(&gate, &up, &grad_out, &grad_gate, &grad_up)?;
            plugin::<P>().swiglu_backward(
                queue,
                &SwigluBackwardArgs {
                    gate,
                    up,
                    grad_out,
                    grad_gate,
                    grad_up,
                },
            )
        }
    })
}

pub(super) unsafe extern "C" fn reduce<P: Plugin, const OP: u8>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipReduceArgs,
) -> *mut PolychipError {
    let name = ReduceOp::ALL[OP as usize].name();
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let input = tensor(name, "input", device, &raw.input)?;
            let out = tensor(name, "out", device, &raw.out)?;
            let keepdim = raw.keepdim != 0;
            let dim = check::reduce(name, &input, &out, raw.dim, keepdim)?;
            plugin::<P>().reduce(
                queue,
                ReduceOp::ALL[OP as usize],
                &ReduceArgs {
                    input,
                    out,
                    dim,
                    keepdim,
                },
            )
        }
    })
}

pub(super) unsafe extern "C" fn sum_squares<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipSumSquaresArgs,
) -> *mut PolychipError {
    let name = "sum_squares";
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let input = tensor(name, "input", device, &raw.input)?;
            let out = tensor(name, "out", device, &raw.out)?;
            check::sum_squares(&input, &out)?;
            plugin::<P>().sum_squares(queue, &SumSquaresArgs { input, out })
        }
    })
}

pub(super) unsafe extern "C" fn linear<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipLinearArgs,
) -> *mut PolychipError {
    let name = "linear";
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let input = tensor(name, "input", device, &raw.input)?;
            let weight = tensor(name, "weight", device, &raw.weight)?;
            let out = tensor(name, "out", device, &raw.out)?;
            let bias = if raw.has_bias != 0 {
                Some(tensor(name, "bias", device, &raw.bias)?)
            } else {
                None
            };
            check::linear(&input, &weight, bias.as_ref(), &out)?;
            plugin::<P>().linear(
                queue,
                &LinearArgs {
                    input,
                    weight,
                    bias,
                    out,
                },
            )
        }
    })
}

pub(super) unsafe extern "C" fn log_softmax<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipSoftmaxArgs,
) -> *mut PolychipError {
    let name = "log_softmax";
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let input = tensor(name, "input", device, &raw.input)?;
            let out = tensor(name, "out", device, &raw.out)?;
            check::log_softmax(&input, &out)?;
            plugin::<P>().log_softmax(queue, &SoftmaxArgs { input, out })
        }
    })
}

pub(super) unsafe extern "C" fn softmax_backward<P: Plugin, const OP: u8>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipSoftmaxBackwardArgs,
) -> *mut PolychipError {
    let name = if OP == 1 {
        "log_softmax_backward"
    } else {
        "softmax_backward"
    };
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let out = tensor(name, "out", device, &raw.out)?;
            let grad_out = tensor(name, "grad_out", device, &raw.grad_out)?;
            let grad_in = tensor(name, "grad_in", device, &raw.grad_in)?;
            check::softmax_backward(name, &out, &grad_out, &grad_in)?;
            plugin::<P>().softmax_backward(
                queue,
                OP == 1,
                &SoftmaxBackwardArgs {
                    out,
                    grad_out,
                    grad_in,
                },
            )
        }
    })
}

pub(super) unsafe extern "C" fn rms_norm<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipRmsNormArgs,
) -> *mut PolychipError {
    let name = "rms_norm";
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let input = tensor(name, "input", device, &raw.input)?;
            let weight = tensor(name, "weight", device, &raw.weight)?;
            let out = tensor(name, "out", device, &raw.out)?;
            let inv_rms = tensor(name, "inv_rms", device, &raw.inv_rms)?;
            check::rms_norm(&input, &weight, &out, &inv_rms)?;
            plugin::<P>().rms_norm(
                queue,
                &RmsNormArgs {
                    input,
                    weight,
                    out,
                    inv_rms,
                    eps: raw.eps,
                },
            )
        }
    })
}

pub(super) unsafe extern "C" fn rms_norm_backward<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipRmsNormBackwardArgs,
) -> *mut PolychipError {
    let name = "rms_norm_backward";
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let grad_out = tensor(name, "grad_out", device, &raw.grad_out)?;
            let input = tensor(name, "input", device, &raw.input)?;
            let weight = tensor(name, "weight", device, &raw.weight)?;
            let inv_rms = tensor(name, "inv_rms", device, &raw.inv_rms)?;
            let grad_input = tensor(name, "grad_input", device, &raw.grad_input)?;
            let grad_weight = tensor(name, "grad_weight", device, &raw.grad_weight)?;
            check::rms_norm_backward(
                &grad_out,
                &input,
                &weight,
                &inv_rms,
                &grad_input,
                &grad_weight,
            )?;
            plugin::<P>().rms_norm_backward(
                queue,
                &RmsNormBackwardArgs {
                    grad_out,
                    input,
                    weight,
                    inv_rms,
                    grad_input,
                    grad_weight,
                },
            )
        }
    })
}

pub(super) unsafe extern "C" fn layer_norm<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipLayerNormArgs,
) -> *mut PolychipError {
    let name = "layer_norm";
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let input = tensor(name, "input", device, &raw.input)?;
            let weight = tensor(name, "weight", device, &raw.weight)?;
            let bias = tensor(name, "bias", device, &raw.bias)?;
            let out = tensor(name, "out", device, &raw.out)?;
            let mean = tensor(name, "mean", device, &raw.mean)?;
            let rstd = tensor(name, "rstd", device, &raw.rstd)?;
            check::layer_norm(&input, &weight, &bias, &out, &mean, &rstd)?;
            plugin::<P>().layer_norm(
                queue,
                &LayerNormArgs {
                    input,
                    weight,
                    bias,
                    out,
                    mean,
                    rstd,
                    eps: raw.eps,
                },
            )
        }
    })
}

pub(super) unsafe extern "C" fn layer_norm_backward<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipLayerNormBackwardArgs,
) -> *mut PolychipError {
    let name = "layer_norm_backward";
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let grad_out = tensor(name, "grad_out", device, &raw.grad_out)?;
            let input = tensor(name, "input", device, &raw.input)?;
            let weight = tensor(name, "weight", device, &raw.weight)?;
            let mean = tensor(name, "mean", device, &raw.mean)?;
            let rstd = tensor(name, "rstd", device, &raw.rstd)?;
            let grad_input = tensor(name, "grad_input", device, &raw.grad_input)?;
            let grad_weight = tensor(name, "grad_weight", device, &raw.grad_weight)?;
            let grad_bias = tensor(name, "grad_bias", device, &raw.grad_bias)?;
            check::layer_norm_backward(
                &grad_out,
                &input,
                &weight,
                &mean,
                &rstd,
                &grad_input,
                &grad_weight,
                &grad_bias,
            )?;
            plugin::<P>().layer_norm_backward(
                queue,
                &LayerNormBackwardArgs {
                    grad_out,
                    input,
                    weight,
                    mean,
                    rstd,
                    grad_input,
                    grad_weight,
                    grad_bias,
                },
            )
        }
    })
}

pub(super) unsafe extern "C" fn rope<P: Plugin, const OP: u8>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipRopeArgs,
) -> *mut PolychipError {
    let name = if OP == 1 { "rope_backward" } else { "rope" };
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let input = tensor(name, "input", device, &raw.input)?;
            let cos = tensor(name, "cos", device, &raw.cos)?;
            let sin = tensor(name, "sin", device, &raw.sin)?;
            let out = tensor(name, "out", device, &raw.out)?;
            check::rope(name, &input, &cos, &sin, &out)?;
            plugin::<P>().rope(
                queue,
                OP == 1,
                &RopeArgs {
                    input,
                    cos,
                    sin,
                    out,
                    interleaved: raw.interleaved != 0,
                },
            )
        }
    })
}

pub(super) unsafe extern "C" fn attention<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipAttentionArgs,
) -> *mut PolychipError {
    let name = "attention";
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let q = tensor(name, "q", device, &raw.q)?;
            let k = tensor(name, "k", device, &raw.k)?;
            let v = tensor(name, "v", device, &raw.v)?;
            let out = tensor(name, "out", device, &raw.out)?;
            let lse = tensor(name, "lse", device, &raw.lse)?;
            check::attention(&q, &k, &v, &out, &lse)?;
            plugin::<P>().attention(
                queue,
                &AttentionArgs {
                    q,
                    k,
                    v,
                    out,
                    lse,
                    scale: raw.scale,
                    causal: raw.causal != 0,
                },
            )
        }
    })
}

pub(super) unsafe extern "C" fn attention_backward<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipAttentionBackwardArgs,
) -> *mut PolychipError {
    let name = "attention_backward";
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let q = tensor(name, "q", device, &raw.q)?;
            let k = tensor(name, "k", device, &raw.k)?;
            let v = tensor(name, "v", device, &raw.v)?;
            let out = tensor(name, "out", device, &raw.out)?;
            let lse = tensor(name, "lse", device, &raw.lse)?;
            let grad_out = tensor(name, "grad_out", device, &raw.grad_out)?;
            let grad_q = tensor(name, "grad_q", device, &raw.grad_q)?;
            let grad_k = tensor(name, "grad_k", device, &raw.grad_k)?;
            let grad_v = tensor(name, "grad_v", device, &raw.grad_v)?;
            check::attention_backward(
                &q, &k, &v, &out, &lse, &grad_out, &grad_q, &grad_k, &grad_v,
            )?;
            plugin::<P>().attention_backward(
                queue,
                &AttentionBackwardArgs {
                    q,
                    k,
                    v,
                    out,
                    lse,
                    grad_out,
                    grad_q,
                    grad_k,
                    grad_v,
                    scale: raw.scale,
                    causal: raw.causal != 0,
                },
            )
        }
    })
}

pub(super) unsafe extern "C" fn embedding<P: Plugin>(
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

pub(super) unsafe extern "C" fn embedding_backward<P: Plugin>(
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

pub(super) unsafe extern "C" fn cross_entropy<P: Plugin>(
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

pub(super) unsafe extern "C" fn cross_entropy_backward<P: Plugin>(
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

pub(super) unsafe extern "C" fn adamw<P: Plugin>(
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

pub(super) unsafe extern "C" fn scale<P: Plugin>(
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

//! The `extern "C"` shims of the ABI 1.1 layer operators (norms, rotary embeddings, attention).

use crate::__export::{args_ref, guard, plugin, queue, tensor};
use crate::abi::{self, PolychipError, PolychipStream};
use crate::args::*;
use crate::check;
use crate::plugin::Plugin;

pub(in crate::__export) unsafe extern "C" fn rms_norm<P: Plugin>(
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

pub(in crate::__export) unsafe extern "C" fn rms_norm_backward<P: Plugin>(
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

pub(in crate::__export) unsafe extern "C" fn layer_norm<P: Plugin>(
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

pub(in crate::__export) unsafe extern "C" fn layer_norm_backward<P: Plugin>(
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

pub(in crate::__export) unsafe extern "C" fn rope<P: Plugin, const OP: u8>(
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

pub(in crate::__export) unsafe extern "C" fn attention<P: Plugin>(
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

pub(in crate::__export) unsafe extern "C" fn attention_backward<P: Plugin>(
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

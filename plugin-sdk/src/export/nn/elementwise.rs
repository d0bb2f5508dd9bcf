//! The `extern "C"` shims of the ABI 1.1 elementwise, reduction, linear and softmax-family operators.

use crate::__export::{args_ref, guard, plugin, queue, tensor};
use crate::abi::{self, PolychipError, PolychipStream};
use crate::args::*;
use crate::check;
use crate::plugin::Plugin;

pub(in crate::__export) unsafe extern "C" fn unary<P: Plugin, const OP: u8>(
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

pub(in crate::__export) unsafe extern "C" fn pow_scalar<P: Plugin>(
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

pub(in crate::__export) unsafe extern "C" fn activation_backward<P: Plugin, const OP: u8>(
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

pub(in crate::__export) unsafe extern "C" fn swiglu<P: Plugin>(
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

pub(in crate::__export) unsafe extern "C" fn swiglu_backward<P: Plugin>(
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

pub(in crate::__export) unsafe extern "C" fn reduce<P: Plugin, const OP: u8>(
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

pub(in crate::__export) unsafe extern "C" fn sum_squares<P: Plugin>(
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

pub(in crate::__export) unsafe extern "C" fn linear<P: Plugin>(
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

pub(in crate::__export) unsafe extern "C" fn log_softmax<P: Plugin>(
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

pub(in crate::__export) unsafe extern "C" fn softmax_backward<P: Plugin, const OP: u8>(
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

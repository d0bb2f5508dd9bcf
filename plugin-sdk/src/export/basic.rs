//! The `extern "C"` shims of the operators of ABI 1.0: fill, copy, cast,
//! the elementwise binary operators, matmul and softmax.

use super::{args_ref, guard, plugin, queue, tensor};
use crate::abi::{self, PolychipError, PolychipStream};
use crate::args::{BinaryArgs, BinaryOp, CopyArgs, FillArgs, MatmulArgs, SoftmaxArgs};
use crate::check;
use crate::plugin::Plugin;

pub(super) unsafe extern "C" fn fill<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipFillArgs,
) -> *mut PolychipError {
    guard::<P>("fill", || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref("fill", args)?;
            let queue = queue::<P>("fill", device, stream)?;
            let out = tensor("fill", "out", device, &raw.out)?;
            check::fill(&out)?;
            plugin::<P>().fill(
                queue,
                &FillArgs {
                    out,
                    value: raw.value,
                },
            )
        }
    })
}

pub(super) unsafe extern "C" fn copy<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipCopyArgs,
) -> *mut PolychipError {
    guard::<P>("copy", || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref("copy", args)?;
            let queue = queue::<P>("copy", device, stream)?;
            let src = tensor("copy", "src", device, &raw.src)?;
            let dst = tensor("copy", "dst", device, &raw.dst)?;
            check::copy(&src, &dst)?;
            plugin::<P>().copy(queue, &CopyArgs { src, dst })
        }
    })
}

pub(super) unsafe extern "C" fn cast<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipCastArgs,
) -> *mut PolychipError {
    guard::<P>("cast", || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref("cast", args)?;
            let queue = queue::<P>("cast", device, stream)?;
            let src = tensor("cast", "src", device, &raw.src)?;
            let dst = tensor("cast", "dst", device, &raw.dst)?;
            check::cast(&src, &dst)?;
            plugin::<P>().cast(queue, &CopyArgs { src, dst })
        }
    })
}

const fn binary_op(code: u8) -> BinaryOp {
    match code {
        0 => BinaryOp::Add,
        1 => BinaryOp::Sub,
        2 => BinaryOp::Mul,
        _ => BinaryOp::Div,
    }
}

pub(super) unsafe extern "C" fn binary<P: Plugin, const OP: u8>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipBinaryArgs,
) -> *mut PolychipError {
    let op = binary_op(OP);
    let name = op.name();
    guard::<P>(name, || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref(name, args)?;
            let queue = queue::<P>(name, device, stream)?;
            let a = tensor(name, "a", device, &raw.a)?;
            let b = tensor(name, "b", device, &raw.b)?;
            let out = tensor(name, "out", device, &raw.out)?;
            check::binary(name, &a, &b, &out)?;
            plugin::<P>().binary(
                queue,
                &BinaryArgs {
                    op,
                    a,
                    b,
                    out,
                    alpha: raw.alpha,
                },
            )
        }
    })
}

pub(super) unsafe extern "C" fn matmul<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipMatmulArgs,
) -> *mut PolychipError {
    guard::<P>("matmul", || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref("matmul", args)?;
            let queue = queue::<P>("matmul", device, stream)?;
            let a = tensor("matmul", "a", device, &raw.a)?;
            let b = tensor("matmul", "b", device, &raw.b)?;
            let out = tensor("matmul", "out", device, &raw.out)?;
            let (transpose_a, transpose_b) = (raw.transpose_a != 0, raw.transpose_b != 0);
            check::matmul(&a, &b, &out, transpose_a, transpose_b)?;
            let args = MatmulArgs {
                a,
                b,
                out,
                alpha: raw.alpha,
                beta: raw.beta,
                transpose_a,
                transpose_b,
            };
            plugin::<P>().matmul(queue, &args)
        }
    })
}

pub(super) unsafe extern "C" fn softmax<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    args: *const abi::PolychipSoftmaxArgs,
) -> *mut PolychipError {
    guard::<P>("softmax", || {
        // SAFETY: the host passes readable args and live handles per the ABI.
        unsafe {
            let raw = args_ref("softmax", args)?;
            let queue = queue::<P>("softmax", device, stream)?;
            let input = tensor("softmax", "input", device, &raw.input)?;
            let out = tensor("softmax", "out", device, &raw.out)?;
            check::softmax(&input, &out)?;
            plugin::<P>().softmax(queue, &SoftmaxArgs { input, out })
        }
    })
}

//! ABI 1.2's backward operators computed from an activation's output `y`,
//! as PyTorch's autograd saves it: `sigmoid_backward` (`g y (1 - y)`) and
//! `tanh_backward` (`g (1 - y^2)`, as `(1 - y) (1 + y)`, which does not
//! cancel near `|y| = 1`). In `f32`, rounded once, any strides, in place
//! allowed (`grad_in` exactly one of the inputs).

use crate::activation::check_same;
use crate::error::KernelError;
use crate::map::{Access, map_blocks};
use crate::view::View;

/// An activation for [`output_backward`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputOp {
    /// `sigmoid`: the factor `y (1 - y)`.
    Sigmoid,
    /// `tanh`: the factor `1 - y^2`.
    Tanh,
}

/// `grad_in = grad_out * f'` with `f'` a function of the activation's
/// output `output`.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `grad_in` must not overlap the inputs unless it is exactly one of them,
/// and must not overlap itself.
pub unsafe fn output_backward(
    op: OutputOp,
    grad_out: &View,
    output: &View,
    grad_in: &View,
) -> Result<(), KernelError> {
    let views = [
        ("grad_in", grad_in),
        ("grad_out", grad_out),
        ("output", output),
    ];
    check_same("output_backward", &views)?;
    let ops = [
        (grad_in, Access::Write),
        (grad_out, Access::Read),
        (output, Access::Read),
    ];
    // SAFETY: forwarded from this function's contract.
    unsafe {
        match op {
            OutputOp::Sigmoid => map_blocks(ops, 1, |[d, g, y]| {
                for ((d, &g), &y) in d.iter_mut().zip(g.iter()).zip(y.iter()) {
                    *d = g * (y * (1.0 - y));
                }
            }),
            OutputOp::Tanh => map_blocks(ops, 1, |[d, g, y]| {
                for ((d, &g), &y) in d.iter_mut().zip(g.iter()).zip(y.iter()) {
                    *d = g * ((1.0 - y) * (1.0 + y));
                }
            }),
        }
    }
    Ok(())
}

//! The elementwise operators (`kernels/elementwise.cl`): every operand in
//! its own strides (stride 0 broadcasts), so nothing is packed. One
//! work-item per output element.

use polychip_plugin_sdk::{
    ActivationBackwardArgs, ActivationBackwardOp, BinaryArgs, BinaryOp, OutputBackwardArgs,
    OutputBackwardOp, PowScalarArgs, Result, ScaleArgs, SwigluArgs, SwigluBackwardArgs, UnaryArgs,
    UnaryOp,
};

use crate::call::{Ctx, Operand, joint_layouts};
use crate::ops::scalar;
use crate::program::{Args, Flavor, Layout};

/// The layouts of `operands` iterated over `shape` (each broadcast to it).
fn layouts(shape: &[i64], operands: &[&Operand]) -> Result<Vec<Layout>> {
    let strides: Vec<Vec<i64>> = operands
        .iter()
        .map(|o| o.broadcast_strides(shape))
        .collect();
    let parts: Vec<(i64, &[i64])> = operands
        .iter()
        .zip(&strides)
        .map(|(o, s)| (o.offset, s.as_slice()))
        .collect();
    joint_layouts(shape, &parts)
}

/// Launches `kernel` with `(buffer, layout)` for each operand (the last
/// is the output, whose shape is iterated), then `extra`, then `n`.
fn pointwise(
    ctx: &Ctx<'_>,
    kernel: &str,
    operands: &[&Operand],
    extra: impl FnOnce(&mut Args<'_>, Flavor) -> Result<()>,
) -> Result<()> {
    let out = operands[operands.len() - 1];
    let flavor = ctx.float(out.dtype)?;
    let n = out.numel();
    let layouts = layouts(&out.shape, operands)?;
    ctx.launch(flavor, kernel, &[n], None, |a| {
        for (o, l) in operands.iter().zip(&layouts) {
            a.mem(o.mem())?.value(*l)?;
        }
        extra(a, flavor)?;
        a.value(n as i64)?;
        Ok(())
    })
}

/// `add`, `sub`, `mul`, `div`.
pub fn binary(ctx: Ctx<'_>, op: BinaryOp, args: &BinaryArgs<'_>) -> Result<()> {
    let a = ctx.view("a", &args.a)?;
    let b = ctx.view("b", &args.b)?;
    let out = ctx.view("out", &args.out)?;
    let code: i32 = match op {
        BinaryOp::Add => 0,
        BinaryOp::Sub => 1,
        BinaryOp::Mul => 2,
        BinaryOp::Div => 3,
    };
    pointwise(&ctx, "pc_binary", &[&a, &b, &out], |k, flavor| {
        k.value(code)?;
        scalar(k, flavor, args.alpha)?;
        Ok(())
    })?;
    ctx.finish()
}

/// The unary operators.
pub fn unary(ctx: Ctx<'_>, op: UnaryOp, args: &UnaryArgs<'_>) -> Result<()> {
    let x = ctx.view("input", &args.input)?;
    let out = ctx.view("out", &args.out)?;
    let code: i32 = match op {
        UnaryOp::Neg => 0,
        UnaryOp::Exp => 1,
        UnaryOp::Log => 2,
        UnaryOp::Sqrt => 3,
        UnaryOp::Rsqrt => 4,
        UnaryOp::Tanh => 5,
        UnaryOp::Relu => 6,
        UnaryOp::Silu => 7,
        UnaryOp::Gelu => 8,
        UnaryOp::GeluErf => 9,
        UnaryOp::Sigmoid => 10,
    };
    pointwise(&ctx, "pc_unary", &[&x, &out], |k, _| {
        k.value(code)?;
        Ok(())
    })?;
    ctx.finish()
}

/// `pow_scalar`.
pub fn pow_scalar(ctx: Ctx<'_>, args: &PowScalarArgs<'_>) -> Result<()> {
    let x = ctx.view("input", &args.input)?;
    let out = ctx.view("out", &args.out)?;
    pointwise(&ctx, "pc_pow_scalar", &[&x, &out], |k, flavor| {
        scalar(k, flavor, args.exponent)?;
        Ok(())
    })?;
    ctx.finish()
}

/// `relu_backward`, `silu_backward`, `gelu_backward`, `gelu_erf_backward`.
pub fn activation_backward(
    ctx: Ctx<'_>,
    op: ActivationBackwardOp,
    args: &ActivationBackwardArgs<'_>,
) -> Result<()> {
    let g = ctx.view("grad_out", &args.grad_out)?;
    let x = ctx.view("input", &args.input)?;
    let out = ctx.view("grad_in", &args.grad_in)?;
    let code: i32 = match op {
        ActivationBackwardOp::ReluBackward => 0,
        ActivationBackwardOp::SiluBackward => 1,
        ActivationBackwardOp::GeluBackward => 2,
        ActivationBackwardOp::GeluErfBackward => 3,
    };
    pointwise(&ctx, "pc_activation_backward", &[&g, &x, &out], |k, _| {
        k.value(code)?;
        Ok(())
    })?;
    ctx.finish()
}

/// `sigmoid_backward`, `tanh_backward` (ABI 1.2): from the activation's
/// output.
pub fn output_backward(
    ctx: Ctx<'_>,
    op: OutputBackwardOp,
    args: &OutputBackwardArgs<'_>,
) -> Result<()> {
    let g = ctx.view("grad_out", &args.grad_out)?;
    let y = ctx.view("output", &args.output)?;
    let out = ctx.view("grad_in", &args.grad_in)?;
    let code: i32 = match op {
        OutputBackwardOp::SigmoidBackward => 0,
        OutputBackwardOp::TanhBackward => 1,
    };
    pointwise(&ctx, "pc_output_backward", &[&g, &y, &out], |k, _| {
        k.value(code)?;
        Ok(())
    })?;
    ctx.finish()
}

/// `swiglu`.
pub fn swiglu(ctx: Ctx<'_>, args: &SwigluArgs<'_>) -> Result<()> {
    let gate = ctx.view("gate", &args.gate)?;
    let up = ctx.view("up", &args.up)?;
    let out = ctx.view("out", &args.out)?;
    pointwise(&ctx, "pc_swiglu", &[&gate, &up, &out], |_, _| Ok(()))?;
    ctx.finish()
}

/// `swiglu_backward`: both gradients from one pass (the iteration shape is
/// `gate`'s, which every operand has).
pub fn swiglu_backward(ctx: Ctx<'_>, args: &SwigluBackwardArgs<'_>) -> Result<()> {
    let gate = ctx.view("gate", &args.gate)?;
    let up = ctx.view("up", &args.up)?;
    let go = ctx.view("grad_out", &args.grad_out)?;
    let dg = ctx.view("grad_gate", &args.grad_gate)?;
    let du = ctx.view("grad_up", &args.grad_up)?;
    pointwise(
        &ctx,
        "pc_swiglu_backward",
        &[&gate, &up, &go, &dg, &du],
        |_, _| Ok(()),
    )?;
    ctx.finish()
}

/// `scale`, in place.
pub fn scale(ctx: Ctx<'_>, args: &ScaleArgs<'_>) -> Result<()> {
    let t = ctx.view("tensor", &args.tensor)?;
    pointwise(&ctx, "pc_scale", &[&t], |k, flavor| {
        scalar(k, flavor, args.alpha)?;
        Ok(())
    })?;
    ctx.finish()
}

//! The elementwise operators (`kernels/elementwise.cl`): every operand in
//! its own strides (stride 0 broadcasts), so nothing is packed. One
//! work-item per output element.

use polychip_plugin_sdk::{
    ActivationBackwardArgs, ActivationBackwardOp, BinaryArgs, BinaryOp, BitwiseArgs, BitwiseOp,
    CompareArgs, CompareOp, DType, MaskedFillArgs, OutputBackwardArgs, OutputBackwardOp,
    PowScalarArgs, Result, ScaleArgs, SelectArgs, SwigluArgs, SwigluBackwardArgs, UnaryArgs,
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
    if matches!(out.dtype, DType::I32 | DType::I64) {
        // ABI 1.3: add, sub and mul on integers, wrapping.
        let sign: i32 = match op {
            BinaryOp::Add => 1,
            BinaryOp::Sub => -1,
            _ => 0,
        };
        let n = out.numel();
        let layouts = layouts(&out.shape, &[&a, &b, &out])?;
        ctx.launch(Flavor::bits(out.dtype), "pc_binary_int", &[n], None, |k| {
            for (o, l) in [&a, &b, &out].iter().zip(&layouts) {
                k.mem(o.mem())?.value(*l)?;
            }
            // An integer of at most 2^53 (the host checks it).
            k.value(sign)?.value(args.alpha as i64)?.value(n as i64)?;
            Ok(())
        })?;
        return ctx.finish();
    }
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
        UnaryOp::Sin => 11,
        UnaryOp::Cos => 12,
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

/// `select` (ABI 1.3, any dtype): by element width, bits moved unchanged.
pub fn select(ctx: Ctx<'_>, args: &SelectArgs<'_>) -> Result<()> {
    let c = ctx.view("cond", &args.cond)?;
    let a = ctx.view("a", &args.a)?;
    let b = ctx.view("b", &args.b)?;
    let out = ctx.view("out", &args.out)?;
    let n = out.numel();
    let layouts = layouts(&out.shape, &[&c, &a, &b, &out])?;
    ctx.launch(Flavor::bits(out.dtype), "pc_select", &[n], None, |k| {
        for (o, l) in [&c, &a, &b, &out].iter().zip(&layouts) {
            k.mem(o.mem())?.value(*l)?;
        }
        k.value(n as i64)?;
        Ok(())
    })?;
    ctx.finish()
}

/// `masked_fill` (ABI 1.3, any dtype): the value converted as `fill`
/// converts it, then bits moved by element width.
pub fn masked_fill(ctx: Ctx<'_>, args: &MaskedFillArgs<'_>) -> Result<()> {
    let x = ctx.view("input", &args.input)?;
    let m = ctx.view("mask", &args.mask)?;
    let out = ctx.view("out", &args.out)?;
    let n = out.numel();
    let layouts = layouts(&out.shape, &[&x, &m, &out])?;
    let bits = crate::ops::data::bits_of(out.dtype, args.value);
    ctx.launch(Flavor::bits(out.dtype), "pc_masked_fill", &[n], None, |k| {
        for (o, l) in [&x, &m, &out].iter().zip(&layouts) {
            k.mem(o.mem())?.value(*l)?;
        }
        match out.dtype.size() {
            1 => k.value(bits as u8)?,
            2 => k.value(bits as u16)?,
            4 => k.value(bits as u32)?,
            _ => k.value(bits)?,
        };
        k.value(n as i64)?;
        Ok(())
    })?;
    ctx.finish()
}

/// `eq`, `ne`, `lt`, `le`, `gt`, `ge` (ABI 1.3): floating dtypes in their
/// operator program, integers by width and signedness.
pub fn compare(ctx: Ctx<'_>, op: CompareOp, args: &CompareArgs<'_>) -> Result<()> {
    let a = ctx.view("a", &args.a)?;
    let b = ctx.view("b", &args.b)?;
    let out = ctx.view("out", &args.out)?;
    let code: i32 = match op {
        CompareOp::Eq => 0,
        CompareOp::Ne => 1,
        CompareOp::Lt => 2,
        CompareOp::Le => 3,
        CompareOp::Gt => 4,
        CompareOp::Ge => 5,
    };
    let n = out.numel();
    let layouts = layouts(&out.shape, &[&a, &b, &out])?;
    let (flavor, kernel) = match Flavor::float(a.dtype) {
        Some(f) => (f, "pc_compare"),
        None => (Flavor::bits(a.dtype), "pc_compare_int"),
    };
    let signed = i32::from(matches!(a.dtype, DType::I32 | DType::I64));
    ctx.launch(flavor, kernel, &[n], None, |k| {
        for (o, l) in [&a, &b, &out].iter().zip(&layouts) {
            k.mem(o.mem())?.value(*l)?;
        }
        k.value(code)?;
        if kernel == "pc_compare_int" {
            k.value(signed)?;
        }
        k.value(n as i64)?;
        Ok(())
    })?;
    ctx.finish()
}

/// `bitwise_and`, `bitwise_or`, `bitwise_xor` (ABI 1.4): bits of the
/// element's width, operands broadcast.
pub fn bitwise(ctx: Ctx<'_>, op: BitwiseOp, args: &BitwiseArgs<'_>) -> Result<()> {
    let a = ctx.view("a", &args.a)?;
    let b = ctx.view("b", &args.b)?;
    let out = ctx.view("out", &args.out)?;
    let code: i32 = match op {
        BitwiseOp::BitwiseAnd => 0,
        BitwiseOp::BitwiseOr => 1,
        BitwiseOp::BitwiseXor => 2,
    };
    let n = out.numel();
    let layouts = layouts(&out.shape, &[&a, &b, &out])?;
    ctx.launch(Flavor::bits(out.dtype), "pc_bitwise", &[n], None, |k| {
        for (o, l) in [&a, &b, &out].iter().zip(&layouts) {
            k.mem(o.mem())?.value(*l)?;
        }
        k.value(code)?.value(n as i64)?;
        Ok(())
    })?;
    ctx.finish()
}

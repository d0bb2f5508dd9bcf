//! fill, copy and cast: strided kernels of `kernels/data.cl` (by element
//! width) and `kernels/cast.cl`.

use polychip_plugin_sdk::{ArangeArgs, CastArgs, ConvertArgs, CopyArgs, DType, FillArgs, Result};

use crate::call::{Ctx, joint_layouts};
use crate::program::Flavor;

/// `value` in `dtype`'s bits, as the spec converts it: floats rounded to
/// nearest even (directly from f64), integers truncated toward zero and
/// saturated with NaN giving 0, bool `value != 0`.
pub fn bits_of(dtype: DType, value: f64) -> u64 {
    match dtype {
        DType::F32 => u64::from((value as f32).to_bits()),
        DType::F16 => u64::from(half::f16::from_f32(round_to_odd(value)).to_bits()),
        DType::BF16 => u64::from(half::bf16::from_f32(round_to_odd(value)).to_bits()),
        DType::F64 => value.to_bits(),
        DType::I32 => (value as i32) as u32 as u64,
        DType::I64 => (value as i64) as u64,
        DType::U8 => u64::from(value as u8),
        DType::Bool => u64::from(value != 0.0),
    }
}

/// `v` in f32 rounded to odd: truncated, with the last bit set when
/// inexact. Rounding that to nearest even in a format of at most 11
/// significant bits (f16, bf16) gives exactly `v` rounded to nearest even
/// there (f32 keeps more than 2 x 11 + 2 bits), which `half`'s own
/// `from_f64` does not (it rounds twice).
fn round_to_odd(v: f64) -> f32 {
    let mut f = v as f32;
    if v.is_nan() || f64::from(f) == v {
        return f;
    }
    if f64::from(f).abs() > v.abs() {
        f = f32::from_bits(f.to_bits() - 1);
    }
    f32::from_bits(f.to_bits() | 1)
}

/// `fill`.
pub fn fill(ctx: Ctx<'_>, args: &FillArgs<'_>) -> Result<()> {
    let out = ctx.view("out", &args.out)?;
    let n = out.numel();
    let layout = out.layout()?;
    let bits = bits_of(out.dtype, args.value);
    ctx.launch(Flavor::bits(out.dtype), "pc_fill", &[n], None, |a| {
        a.mem(out.mem())?.value(layout)?;
        match out.dtype.size() {
            1 => a.value(bits as u8)?,
            2 => a.value(bits as u16)?,
            4 => a.value(bits as u32)?,
            _ => a.value(bits)?,
        };
        a.value(n as i64)?;
        Ok(())
    })?;
    ctx.finish()
}

/// `copy`.
pub fn copy(ctx: Ctx<'_>, args: &CopyArgs<'_>) -> Result<()> {
    let src = ctx.view("src", &args.src)?;
    let dst = ctx.view("dst", &args.dst)?;
    ctx.copy(&src, &dst)?;
    ctx.finish()
}

fn cast_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "F32",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        _ => "F64",
    }
}

/// `cast`.
pub fn cast(ctx: Ctx<'_>, args: &CastArgs<'_>) -> Result<()> {
    let src = ctx.view("src", &args.src)?;
    let dst = ctx.view("dst", &args.dst)?;
    if (src.dtype == DType::F64 || dst.dtype == DType::F64) && !ctx.device.info.fp64 {
        return Err(polychip_plugin_sdk::Error::unimplemented(format!(
            "opencl: cast: {} has no double precision (cl_khr_fp64)",
            ctx.device.info.name
        )));
    }
    let n = src.numel();
    let layouts = joint_layouts(
        &src.shape,
        &[(src.offset, &src.strides), (dst.offset, &dst.strides)],
    )?;
    let name = format!("pc_cast_{}_{}", cast_name(src.dtype), cast_name(dst.dtype));
    ctx.launch(Flavor::Cast, &name, &[n], None, |a| {
        a.mem(src.mem())?
            .value(layouts[0])?
            .mem(dst.mem())?
            .value(layouts[1])?
            .value(n as i64)?;
        Ok(())
    })?;
    ctx.finish()
}

/// `convert`'s code for a dtype (`kernels/cast.cl`).
fn convert_code(dtype: DType) -> i32 {
    match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        DType::F64 => 3,
        DType::I32 => 4,
        DType::I64 => 5,
        DType::U8 => 6,
        DType::Bool => 7,
    }
}

/// `convert` (ABI 1.3): any dtype to any, one kernel on byte buffers.
/// Needs double precision (cl_khr_fp64), through which floats pass.
pub fn convert(ctx: Ctx<'_>, args: &ConvertArgs<'_>) -> Result<()> {
    let src = ctx.view("src", &args.src)?;
    let dst = ctx.view("dst", &args.dst)?;
    if !ctx.device.info.fp64 {
        return Err(polychip_plugin_sdk::Error::unimplemented(format!(
            "opencl: convert: {} has no double precision (cl_khr_fp64)",
            ctx.device.info.name
        )));
    }
    let n = src.numel();
    let layouts = joint_layouts(
        &src.shape,
        &[(src.offset, &src.strides), (dst.offset, &dst.strides)],
    )?;
    ctx.launch(Flavor::Cast, "pc_convert", &[n], None, |a| {
        a.mem(src.mem())?
            .value(layouts[0])?
            .value(convert_code(src.dtype))?
            .mem(dst.mem())?
            .value(layouts[1])?
            .value(convert_code(dst.dtype))?
            .value(n as i64)?;
        Ok(())
    })?;
    ctx.finish()
}

/// `arange` (ABI 1.3): one work-item per element, computed in double.
/// Needs double precision (cl_khr_fp64).
pub fn arange(ctx: Ctx<'_>, args: &ArangeArgs<'_>) -> Result<()> {
    let out = ctx.view("out", &args.out)?;
    if !ctx.device.info.fp64 {
        return Err(polychip_plugin_sdk::Error::unimplemented(format!(
            "opencl: arange: {} has no double precision (cl_khr_fp64)",
            ctx.device.info.name
        )));
    }
    let n = out.numel();
    let layout = out.layout()?;
    ctx.launch(Flavor::Cast, "pc_arange", &[n], None, |a| {
        a.mem(out.mem())?
            .value(layout)?
            .value(convert_code(out.dtype))?
            .value(args.start)?
            .value(args.step)?
            .value(n as i64)?;
        Ok(())
    })?;
    ctx.finish()
}

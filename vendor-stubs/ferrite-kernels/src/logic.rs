//! The selection and comparison kernels of ABI 1.3: `select` (`cond ? a :
//! b`, PyTorch's `where`), `masked_fill` and the comparisons `eq`, `ne`,
//! `lt`, `le`, `gt`, `ge`. Every operand may broadcast (stride 0) or have
//! any strides; `select` and `masked_fill` move element bits unchanged, in
//! any dtype; the comparisons read their operands exactly (f16 and bf16
//! widen to f64 exactly, integers compare as integers) and write bools.

use half::{bf16, f16};

use crate::dtype::DType;
use crate::error::{KernelError, bail};
use crate::layout::for_each_strided;
use crate::rounding::{bf16_from_f64, f16_from_f64};
use crate::shape::broadcast_strides;
use crate::view::View;

/// An elementwise comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    /// `a == b`
    Eq,
    /// `a != b`
    Ne,
    /// `a < b`
    Lt,
    /// `a <= b`
    Le,
    /// `a > b`
    Gt,
    /// `a >= b`
    Ge,
}

impl CompareOp {
    /// The comparison of two values of one ordered type, with IEEE
    /// semantics for floats (every comparison but `!=` is false with NaN).
    #[inline(always)]
    fn apply<T: PartialOrd>(self, a: T, b: T) -> bool {
        match self {
            CompareOp::Eq => a == b,
            CompareOp::Ne => a != b,
            CompareOp::Lt => a < b,
            CompareOp::Le => a <= b,
            CompareOp::Gt => a > b,
            CompareOp::Ge => a >= b,
        }
    }
}

/// Reads element `i` (in elements from `p`) of `dtype` as a number that
/// orders as the element does: floats as f64 (exact), integers as i64
/// (exact), so that one comparison serves every dtype.
#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Num {
    F(f64),
    I(i64),
}

/// # Safety
/// `p` offset by `i` elements must be a valid element of `dtype`.
#[inline(always)]
unsafe fn load(dtype: DType, p: *const u8, i: isize) -> Num {
    // SAFETY: forwarded from the caller.
    unsafe {
        match dtype {
            DType::F32 => Num::F(f64::from(*(p as *const f32).offset(i))),
            DType::F64 => Num::F(*(p as *const f64).offset(i)),
            DType::F16 => Num::F(f64::from(f16::from_bits(*(p as *const u16).offset(i)))),
            DType::BF16 => Num::F(f64::from(bf16::from_bits(*(p as *const u16).offset(i)))),
            DType::I32 => Num::I(i64::from(*(p as *const i32).offset(i))),
            DType::I64 => Num::I(*(p as *const i64).offset(i)),
            DType::U8 | DType::Bool => Num::I(i64::from(*p.offset(i))),
        }
    }
}

/// Checks every view and returns each operand's strides over `out`'s shape
/// (0 where it broadcasts).
fn strides_over<'v>(
    kernel: &str,
    out: &View<'v>,
    inputs: &[(&str, &View)],
) -> Result<Vec<Vec<i64>>, KernelError> {
    out.validate(kernel, "out")?;
    let mut all = Vec::with_capacity(inputs.len());
    for (name, v) in inputs {
        v.validate(kernel, name)?;
        all.push(broadcast_strides(name, v, out.shape)?.as_slice().to_vec());
    }
    Ok(all)
}

/// Copies one element of `size` bytes from `src` to `dst`.
///
/// # Safety
/// Both must be valid for `size` bytes, aligned for it.
#[inline(always)]
unsafe fn move_element(size: usize, src: *const u8, dst: *mut u8) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match size {
            1 => *dst = *src,
            2 => *(dst as *mut u16) = *(src as *const u16),
            4 => *(dst as *mut u32) = *(src as *const u32),
            _ => *(dst as *mut u64) = *(src as *const u64),
        }
    }
}

/// `out = cond ? a : b` elementwise, the three broadcast to `out`'s shape;
/// `cond` bool, `a`, `b` and `out` of one dtype (any). Bits are copied.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `out` must not overlap an input unless it is exactly `a` or `b`, and
/// must not overlap itself.
pub unsafe fn select(cond: &View, a: &View, b: &View, out: &View) -> Result<(), KernelError> {
    let s = strides_over("select", out, &[("cond", cond), ("a", a), ("b", b)])?;
    if cond.dtype != DType::Bool || a.dtype != out.dtype || b.dtype != out.dtype {
        bail!(
            "select: need a bool cond and one dtype for a, b and out, got {:?}, {:?}, {:?}, {:?}",
            cond.dtype,
            a.dtype,
            b.dtype,
            out.dtype
        );
    }
    let size = out.dtype.size();
    // SAFETY: forwarded from this function's contract; each run lies in
    // its views.
    unsafe {
        for_each_strided(
            out.shape,
            [out.ptr, cond.ptr, a.ptr, b.ptr],
            [out.strides, &s[0], &s[1], &s[2]],
            [size, 1, size, size],
            1,
            &|[o, c, x, y], len, [so, sc, sx, sy]| {
                for i in 0..len as isize {
                    let src = if *c.offset(i * sc) != 0 {
                        x.offset(i * sx * size as isize)
                    } else {
                        y.offset(i * sy * size as isize)
                    };
                    move_element(size, src, o.offset(i * so * size as isize));
                }
            },
        );
    }
    Ok(())
}

/// `value` converted to `dtype` as `fill` converts it, as the element's
/// bits (little end first, `size` bytes).
pub(crate) fn fill_bits(dtype: DType, value: f64) -> u64 {
    match dtype {
        DType::F32 => u64::from((value as f32).to_bits()),
        DType::F64 => value.to_bits(),
        DType::F16 => u64::from(f16_from_f64(value).to_bits()),
        DType::BF16 => u64::from(bf16_from_f64(value).to_bits()),
        // `as` truncates toward zero, saturates and gives 0 for NaN.
        DType::I32 => u64::from((value as i32) as u32),
        DType::I64 => (value as i64) as u64,
        DType::U8 => u64::from(value as u8),
        DType::Bool => u64::from(value != 0.0),
    }
}

/// `out = mask ? value : input` elementwise, `mask` (bool) broadcast to
/// `input`'s shape, `value` converted as `fill` converts it. `out` may be
/// `input` (in place).
///
/// # Safety
/// As for [`select`], with `out` allowed to be exactly `input`.
pub unsafe fn masked_fill(
    input: &View,
    mask: &View,
    out: &View,
    value: f64,
) -> Result<(), KernelError> {
    let s = strides_over("masked_fill", out, &[("input", input), ("mask", mask)])?;
    if mask.dtype != DType::Bool || input.dtype != out.dtype || input.shape != out.shape {
        bail!(
            "masked_fill: need a bool mask and input like out, got {:?}, {:?} {:?}, {:?} {:?}",
            mask.dtype,
            input.dtype,
            input.shape,
            out.dtype,
            out.shape
        );
    }
    let size = out.dtype.size();
    let bits = fill_bits(out.dtype, value).to_le_bytes();
    // SAFETY: forwarded from this function's contract.
    unsafe {
        for_each_strided(
            out.shape,
            [out.ptr, input.ptr, mask.ptr],
            [out.strides, &s[0], &s[1]],
            [size, size, 1],
            1,
            &|[o, x, m], len, [so, sx, sm]| {
                for i in 0..len as isize {
                    let src = if *m.offset(i * sm) != 0 {
                        bits.as_ptr()
                    } else {
                        x.offset(i * sx * size as isize)
                    };
                    move_element_unaligned(size, src, o.offset(i * so * size as isize));
                }
            },
        );
    }
    Ok(())
}

/// [`move_element`] from a source that may be unaligned, and may be `dst`
/// itself (an unmasked element of an in-place `masked_fill`).
///
/// # Safety
/// `src` valid for `size` bytes; `dst` valid and aligned.
#[inline(always)]
unsafe fn move_element_unaligned(size: usize, src: *const u8, dst: *mut u8) {
    // SAFETY: forwarded from the caller; `copy` allows the two to overlap
    // (`copy_nonoverlapping` of an element onto itself is undefined).
    unsafe { std::ptr::copy(src, dst, size) }
}

/// `out = a (op) b` elementwise (bool 0/1), `a` and `b` of one dtype
/// (not bool) broadcast to `out`'s shape.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `out` must not overlap `a`, `b` or itself.
pub unsafe fn compare(op: CompareOp, a: &View, b: &View, out: &View) -> Result<(), KernelError> {
    let s = strides_over("compare", out, &[("a", a), ("b", b)])?;
    if out.dtype != DType::Bool || a.dtype != b.dtype || a.dtype == DType::Bool {
        bail!(
            "compare: need one non-bool dtype for a and b and a bool out, got {:?}, {:?}, {:?}",
            a.dtype,
            b.dtype,
            out.dtype
        );
    }
    let dt = a.dtype;
    // SAFETY: forwarded from this function's contract.
    unsafe {
        for_each_strided(
            out.shape,
            [out.ptr, a.ptr, b.ptr],
            [out.strides, &s[0], &s[1]],
            [1, dt.size(), dt.size()],
            1,
            &|[o, x, y], len, [so, sx, sy]| {
                for i in 0..len as isize {
                    let l = load(dt, x, i * sx);
                    let r = load(dt, y, i * sy);
                    *o.offset(i * so) = u8::from(op.apply(l, r));
                }
            },
        );
    }
    Ok(())
}

/// An integer as the nearest f64 rounded to odd (toward zero, the last
/// bit set when inexact): followed by a rounding to nearest even into a
/// format of at most 51 significant bits (f32, f16, bf16) it gives the
/// integer correctly rounded there, which `as f64` then `as f32` (two
/// roundings to nearest) does not for i64s past 2^53.
fn i64_to_f64_odd(x: i64) -> f64 {
    let r = x as f64;
    // `r as i128` is exact: |r| <= 2^63.
    let back = r as i128;
    let x = i128::from(x);
    if back == x {
        return r;
    }
    let toward_zero = if back.abs() > x.abs() {
        f64::from_bits(r.to_bits() - 1)
    } else {
        r
    };
    f64::from_bits(toward_zero.to_bits() | 1)
}

/// Writes `v` as element `i` (in elements from `p`) of `dtype` with the
/// ABI's conversion rules (`convert`).
///
/// # Safety
/// `p` offset by `i` elements must be a valid, writable element of `dtype`.
#[inline(always)]
unsafe fn store(dtype: DType, p: *mut u8, i: isize, v: Num) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match (dtype, v) {
            (DType::Bool, Num::F(x)) => *p.offset(i) = u8::from(x != 0.0),
            (DType::Bool, Num::I(x)) => *p.offset(i) = u8::from(x != 0),
            // `as` from a float truncates toward zero, saturates and gives 0
            // for NaN; between integers it wraps (keeps the low bits), as
            // the ABI and PyTorch do.
            (DType::I32, Num::F(x)) => *(p as *mut i32).offset(i) = x as i32,
            (DType::I32, Num::I(x)) => *(p as *mut i32).offset(i) = x as i32,
            (DType::I64, Num::F(x)) => *(p as *mut i64).offset(i) = x as i64,
            (DType::I64, Num::I(x)) => *(p as *mut i64).offset(i) = x,
            (DType::U8, Num::F(x)) => *p.offset(i) = x as u8,
            (DType::U8, Num::I(x)) => *p.offset(i) = x as u8,
            // Floats: one rounding to nearest even (i64 to f64 and f32 are
            // correctly rounded by `as`; to f16 and bf16 through values
            // rounded to odd).
            (DType::F64, Num::F(x)) => *(p as *mut f64).offset(i) = x,
            (DType::F64, Num::I(x)) => *(p as *mut f64).offset(i) = x as f64,
            (DType::F32, Num::F(x)) => *(p as *mut f32).offset(i) = x as f32,
            (DType::F32, Num::I(x)) => *(p as *mut f32).offset(i) = x as f32,
            (DType::F16, v) => {
                let x = match v {
                    Num::F(x) => x,
                    Num::I(x) => i64_to_f64_odd(x),
                };
                *(p as *mut u16).offset(i) = f16_from_f64(x).to_bits();
            }
            (DType::BF16, v) => {
                let x = match v {
                    Num::F(x) => x,
                    Num::I(x) => i64_to_f64_odd(x),
                };
                *(p as *mut u16).offset(i) = bf16_from_f64(x).to_bits();
            }
        }
    }
}

/// `dst = (dst.dtype) src` between any two dtypes (ABI 1.3's `convert`):
/// floats round once to nearest even, floats to integers truncate toward
/// zero and saturate (NaN gives 0), integers to narrower ones wrap (their
/// low bits), anything to bool is `!= 0`. Same shape, any strides.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `dst` must not overlap `src` or itself.
pub unsafe fn convert(src: &View, dst: &View) -> Result<(), KernelError> {
    src.validate("convert", "src")?;
    dst.validate("convert", "dst")?;
    if src.shape != dst.shape {
        bail!(
            "convert: src has shape {:?} but dst has shape {:?}",
            src.shape,
            dst.shape
        );
    }
    let (sd, dd) = (src.dtype, dst.dtype);
    // SAFETY: forwarded from this function's contract.
    unsafe {
        for_each_strided(
            dst.shape,
            [dst.ptr, src.ptr],
            [dst.strides, src.strides],
            [dd.size(), sd.size()],
            1,
            &|[o, x], len, [so, sx]| {
                for i in 0..len as isize {
                    store(dd, o, i * so, load(sd, x, i * sx));
                }
            },
        );
    }
    Ok(())
}

/// `out[i] = start + i * step` (ABI 1.3's `arange`): computed in f64 (a
/// product and a sum, not fused), then converted as `convert` converts a
/// float (floats round once, integers truncate and saturate). `out` is 1-D
/// of any dtype but bool, any stride.
///
/// # Safety
/// Every element addressed by `out` must be valid, writable memory of its
/// dtype, and `out` must not overlap itself.
pub unsafe fn arange(out: &View, start: f64, step: f64) -> Result<(), KernelError> {
    out.validate("arange", "out")?;
    if out.shape.len() != 1 || out.dtype == DType::Bool {
        bail!(
            "arange: out must be 1-D and not bool, got {:?} {:?}",
            out.dtype,
            out.shape
        );
    }
    let (dt, n, s) = (out.dtype, out.shape[0], out.strides[0] as isize);
    for i in 0..n {
        let v = start + (i as f64) * step;
        // SAFETY: element i of the caller-guaranteed view.
        unsafe { store(dt, out.ptr, i as isize * s, Num::F(v)) };
    }
    Ok(())
}

/// `out = a (op) b` on i32 or i64 (ABI 1.3's integer `add`, `sub`, `mul`),
/// broadcast to `out`'s shape, wrapping in two's complement: `a + alpha
/// b` and `a - alpha b` with `alpha` converted to the dtype (wrapping).
///
/// # Safety
/// As for [`crate::binary`].
pub(crate) unsafe fn binary_int(
    op: crate::BinaryOp,
    a: &View,
    b: &View,
    out: &View,
    alpha: f64,
) -> Result<(), KernelError> {
    use crate::BinaryOp;
    let s = strides_over("binary", out, &[("a", a), ("b", b)])?;
    let dt = out.dtype;
    if !matches!(dt, DType::I32 | DType::I64)
        || a.dtype != dt
        || b.dtype != dt
        || op == BinaryOp::Div
    {
        bail!(
            "binary: {op:?} on integers needs i32 or i64 throughout, got a={:?} b={:?} out={:?}",
            a.dtype,
            b.dtype,
            out.dtype
        );
    }
    // `alpha` is an integer of at most 2^53 (the host checks it): exact
    // in i64, and wrapped to i32 as C's conversion of the i64 would.
    let al = alpha as i64;
    let f = move |x: i64, y: i64| -> i64 {
        match op {
            BinaryOp::Add => x.wrapping_add(al.wrapping_mul(y)),
            BinaryOp::Sub => x.wrapping_sub(al.wrapping_mul(y)),
            _ => x.wrapping_mul(y),
        }
    };
    // SAFETY: forwarded from this function's contract.
    unsafe {
        for_each_strided(
            out.shape,
            [out.ptr, a.ptr, b.ptr],
            [out.strides, &s[0], &s[1]],
            [dt.size(), dt.size(), dt.size()],
            1,
            &|[o, x, y], len, [so, sx, sy]| {
                for i in 0..len as isize {
                    if dt == DType::I32 {
                        let (x, y) = (
                            *(x as *const i32).offset(i * sx),
                            *(y as *const i32).offset(i * sy),
                        );
                        // Wrapping in i64 then truncating is i32 wrapping.
                        *(o as *mut i32).offset(i * so) = f(i64::from(x), i64::from(y)) as i32;
                    } else {
                        let (x, y) = (
                            *(x as *const i64).offset(i * sx),
                            *(y as *const i64).offset(i * sy),
                        );
                        *(o as *mut i64).offset(i * so) = f(x, y);
                    }
                }
            },
        );
    }
    Ok(())
}

//! The kernels of ABI 1.4: `gather` and `scatter_add` along one dimension
//! by i32/i64 indices (every index checked before anything is written),
//! `cumsum` (a running sum in f64 for the floating dtypes, wrapping for
//! the integers), the boolean reductions `any` and `all`, and the bitwise
//! operators on integers and bools. Every view may have any strides.

use crate::dtype::DType;
use crate::error::{KernelError, bail};
use crate::index::read_indices;
use crate::layout::for_each_strided;
use crate::rounding::{bf16_from_f64, f16_from_f64};
use crate::shape::broadcast_strides;
use crate::view::View;

use half::{bf16, f16};

/// Calls `f` with each view's element offset (in elements) for every index
/// of `shape`, in row-major order.
fn walk<const N: usize>(shape: &[i64], strides: [&[i64]; N], mut f: impl FnMut([isize; N])) {
    if shape.contains(&0) {
        return;
    }
    let r = shape.len();
    let mut idx = vec![0i64; r];
    let mut off = [0isize; N];
    loop {
        f(off);
        let mut d = r;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            for (o, s) in off.iter_mut().zip(strides) {
                *o += s[d] as isize;
            }
            if idx[d] < shape[d] {
                break;
            }
            for (o, s) in off.iter_mut().zip(strides) {
                *o -= (shape[d] * s[d]) as isize;
            }
            idx[d] = 0;
        }
    }
}

/// The address of element `off` (in elements) of `v`.
fn at(v: &View, off: isize) -> *mut u8 {
    v.ptr.wrapping_offset(off * v.dtype.size() as isize)
}

/// A floating element as f64 (exact).
///
/// # Safety
/// `p` must address a valid element of `dtype`, a floating one.
unsafe fn load_f64(dtype: DType, p: *const u8) -> f64 {
    // SAFETY: forwarded from the caller.
    unsafe {
        match dtype {
            DType::F32 => f64::from(*(p as *const f32)),
            DType::F16 => f64::from(f16::from_bits(*(p as *const u16))),
            DType::BF16 => f64::from(bf16::from_bits(*(p as *const u16))),
            _ => *(p as *const f64),
        }
    }
}

/// Stores `x` rounded once to the floating `dtype`.
///
/// # Safety
/// `p` must address a valid, writable element of `dtype`.
unsafe fn store_f64(dtype: DType, p: *mut u8, x: f64) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match dtype {
            DType::F32 => *(p as *mut f32) = x as f32,
            DType::F16 => *(p as *mut u16) = f16_from_f64(x).to_bits(),
            DType::BF16 => *(p as *mut u16) = bf16_from_f64(x).to_bits(),
            _ => *(p as *mut f64) = x,
        }
    }
}

/// An element of any dtype as its bits, zero-extended.
///
/// # Safety
/// `p` must address a valid element of `dtype`.
unsafe fn load_bits(dtype: DType, p: *const u8) -> u64 {
    // SAFETY: forwarded from the caller.
    unsafe {
        match dtype.size() {
            1 => u64::from(*p),
            2 => u64::from(*(p as *const u16)),
            4 => u64::from(*(p as *const u32)),
            _ => *(p as *const u64),
        }
    }
}

/// Stores the low bits of `bits` as an element of `dtype`.
///
/// # Safety
/// `p` must address a valid, writable element of `dtype`.
unsafe fn store_bits(dtype: DType, p: *mut u8, bits: u64) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match dtype.size() {
            1 => *p = bits as u8,
            2 => *(p as *mut u16) = bits as u16,
            4 => *(p as *mut u32) = bits as u32,
            _ => *(p as *mut u64) = bits,
        }
    }
}

/// An i32 or i64 element, sign-extended.
///
/// # Safety
/// `p` must address a valid element of `dtype`.
unsafe fn load_int(dtype: DType, p: *const u8) -> i64 {
    // SAFETY: forwarded from the caller.
    unsafe {
        if dtype == DType::I32 {
            i64::from(*(p as *const i32))
        } else {
            *(p as *const i64)
        }
    }
}

/// Checks the views of `gather` or `scatter_add`: `data` (the tensor
/// indexed), `index` and `other` (`out` or `src`) of one shape and
/// `data`'s rank and dtype, every extent but `dim`'s at most `data`'s; and
/// reads the indices (row-major), each checked in `[0, data.shape[dim])`.
///
/// # Safety
/// Every element addressed by `index` must be valid memory of its dtype.
unsafe fn indexed(
    kernel: &str,
    data: &View,
    index: &View,
    other: (&str, &View),
    dim: usize,
) -> Result<Vec<i64>, KernelError> {
    data.validate(kernel, "data")?;
    other.1.validate(kernel, other.0)?;
    let r = data.shape.len();
    if dim >= r
        || index.shape.len() != r
        || other.1.shape != index.shape
        || other.1.dtype != data.dtype
        || index
            .shape
            .iter()
            .zip(data.shape)
            .enumerate()
            .any(|(d, (&i, &n))| d != dim && i > n)
    {
        bail!(
            "{kernel}: need index and {} of one shape of the data's rank, no extent but dim {dim}'s \
             above the data's {:?}, and one dtype; got index {:?}, {} {:?} {:?}, data {:?}",
            other.0,
            data.shape,
            index.shape,
            other.0,
            other.1.shape,
            other.1.dtype,
            data.dtype
        );
    }
    // SAFETY: forwarded from the caller.
    unsafe { read_indices(kernel, index, data.shape[dim] as usize, None) }
}

/// The strides of `data` with dimension `dim`'s set to 0 (the index
/// supplies that coordinate).
fn without_dim(data: &View, dim: usize) -> Vec<i64> {
    let mut s = data.strides.to_vec();
    s[dim] = 0;
    s
}

/// `out[i] = input[i with dimension dim replaced by index[i]]`; bits
/// copied. An index outside `[0, input.shape[dim])` is an error, nothing
/// written.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `out` must not overlap `input`, `index` or itself.
pub unsafe fn gather(
    input: &View,
    index: &View,
    out: &View,
    dim: usize,
) -> Result<(), KernelError> {
    // SAFETY: forwarded from this function's contract.
    let idx = unsafe { indexed("gather", input, index, ("out", out), dim)? };
    let base = without_dim(input, dim);
    let step = input.strides[dim] as isize;
    let size = out.dtype.size();
    let mut k = 0;
    walk(out.shape, [out.strides, &base], |[o, i]| {
        let src = at(input, i + idx[k] as isize * step);
        // SAFETY: `src` addresses an element of `input` (the index was
        // checked) and `o` one of `out`.
        unsafe { std::ptr::copy_nonoverlapping(src, at(out, o), size) };
        k += 1;
    });
    Ok(())
}

/// `dst[i with dimension dim replaced by index[i]] += src[i]` for every
/// `i`. Floating dtypes add each element's updates to its old value in
/// f64 and round once; integers wrap. An index out of range is an error,
/// nothing written.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `dst` must not overlap `index`, `src` or itself.
pub unsafe fn scatter_add(
    dst: &View,
    index: &View,
    src: &View,
    dim: usize,
) -> Result<(), KernelError> {
    // SAFETY: forwarded from this function's contract.
    let idx = unsafe { indexed("scatter_add", dst, index, ("src", src), dim)? };
    let dt = dst.dtype;
    if !(dt.is_float() || matches!(dt, DType::I32 | DType::I64)) {
        bail!("scatter_add: dtype {dt:?} is not floating, i32 or i64");
    }
    // Each destination element once, by its row-major position: the sum
    // of its updates in f64 (or i64, wrapping), then one store.
    let mut dense = vec![0i64; dst.shape.len()];
    let mut n = 1i64;
    for d in (0..dst.shape.len()).rev() {
        dense[d] = n;
        n *= dst.shape[d];
    }
    let mut sums: Vec<Option<(isize, u64)>> = vec![None; n.max(0) as usize];
    let (base, step) = (without_dim(dst, dim), dst.strides[dim] as isize);
    let dense_base = without_dim(
        &View {
            strides: &dense,
            ..*dst
        },
        dim,
    );
    let dense_step = dense[dim] as isize;
    let mut k = 0;
    walk(src.shape, [src.strides, &base, &dense_base], |[s, d, l]| {
        let at_dst = d + idx[k] as isize * step;
        let slot = &mut sums[(l + idx[k] as isize * dense_step) as usize];
        // SAFETY: `s` addresses an element of `src`, `at_dst` one of `dst`
        // (the index was checked).
        unsafe {
            let (p, q) = (at(src, s), at(dst, at_dst));
            if dt.is_float() {
                let old = slot.map_or_else(|| load_f64(dt, q), |(_, b)| f64::from_bits(b));
                *slot = Some((at_dst, (old + load_f64(dt, p)).to_bits()));
            } else {
                let old = slot.map_or_else(|| load_int(dt, q), |(_, b)| b as i64);
                *slot = Some((at_dst, old.wrapping_add(load_int(dt, p)) as u64));
            }
        }
        k += 1;
    });
    for (off, bits) in sums.into_iter().flatten() {
        let q = at(dst, off);
        // SAFETY: `off` addresses an element of `dst`.
        unsafe {
            if dt.is_float() {
                store_f64(dt, q, f64::from_bits(bits));
            } else {
                store_bits(dt, q, bits);
            }
        }
    }
    Ok(())
}

/// The positions of a line along `dim` of `v`: `v`'s shape with `dim`'s
/// extent 1.
fn lines(v: &View, dim: usize) -> Vec<i64> {
    let mut s = v.shape.to_vec();
    s[dim] = 1;
    s
}

/// `out[..., k, ...] = input[..., 0, ...] + ... + input[..., k, ...]`
/// along `dim`: floating dtypes as a running sum in f64 (starting from
/// +0, as PyTorch's) rounded once per output, integers wrapping. `out`
/// may be `input`.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `out` must not overlap `input` unless it is exactly `input`, nor itself.
pub unsafe fn cumsum(input: &View, out: &View, dim: usize) -> Result<(), KernelError> {
    input.validate("cumsum", "input")?;
    out.validate("cumsum", "out")?;
    let dt = input.dtype;
    if dim >= input.shape.len()
        || out.shape != input.shape
        || out.dtype != dt
        || !(dt.is_float() || matches!(dt, DType::I32 | DType::I64))
    {
        bail!(
            "cumsum: need out like input (floating, i32 or i64) and dim {dim} in range, got {:?} {:?} and {:?} {:?}",
            input.dtype,
            input.shape,
            out.dtype,
            out.shape
        );
    }
    let n = input.shape[dim];
    let (si, so) = (input.strides[dim] as isize, out.strides[dim] as isize);
    walk(
        &lines(input, dim),
        [input.strides, out.strides],
        |[i, o]| {
            let (mut f, mut w) = (0.0f64, 0i64);
            for k in 0..n as isize {
                let (p, q) = (at(input, i + k * si), at(out, o + k * so));
                // SAFETY: both address elements of their views; element k of
                // the input is read before element k of the output is written.
                unsafe {
                    if dt.is_float() {
                        f += load_f64(dt, p);
                        store_f64(dt, q, f);
                    } else {
                        w = w.wrapping_add(load_int(dt, p));
                        store_bits(dt, q, w as u64);
                    }
                }
            }
        },
    );
    Ok(())
}

/// `any` or `all` of [`reduce_bool`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoolReduceOp {
    /// Whether any element is nonzero (false over an empty dimension).
    Any,
    /// Whether every element is nonzero (true over an empty dimension).
    All,
}

/// Whether an element is nonzero as a conversion to bool judges it (NaN
/// true, -0 false).
///
/// # Safety
/// `p` must address a valid element of `dtype`.
unsafe fn nonzero(dtype: DType, p: *const u8) -> bool {
    // SAFETY: forwarded from the caller.
    unsafe {
        if dtype.is_float() {
            load_f64(dtype, p) != 0.0
        } else {
            load_bits(dtype, p) != 0
        }
    }
}

/// `any` or `all` of `input` over `dim` into the bool `out` (`input`'s
/// shape without `dim`, or with it 1 under `keepdim`).
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `out` must not overlap `input` or itself.
pub unsafe fn reduce_bool(
    op: BoolReduceOp,
    input: &View,
    out: &View,
    dim: usize,
    keepdim: bool,
) -> Result<(), KernelError> {
    input.validate("reduce_bool", "input")?;
    out.validate("reduce_bool", "out")?;
    let r = input.shape.len();
    let mut expect: Vec<i64> = input.shape.to_vec();
    if dim < r {
        if keepdim {
            expect[dim] = 1;
        } else {
            expect.remove(dim);
        }
    }
    if dim >= r || out.dtype != DType::Bool || out.shape != expect.as_slice() {
        bail!(
            "reduce_bool: need a bool out of shape {expect:?} (dim {dim}, keepdim {keepdim}), got {:?} {:?}",
            out.dtype,
            out.shape
        );
    }
    // `out`'s strides over the lines of `input` (0 along `dim`).
    let mut os = input.strides.to_vec();
    let mut k = 0;
    for (d, s) in os.iter_mut().enumerate() {
        if d == dim {
            *s = 0;
            k += usize::from(keepdim);
        } else {
            *s = out.strides[k];
            k += 1;
        }
    }
    let (n, si) = (input.shape[dim], input.strides[dim] as isize);
    let want = op == BoolReduceOp::Any;
    walk(&lines(input, dim), [input.strides, &os], |[i, o]| {
        // SAFETY: each `i + k si` addresses an element of `input`, `o` one
        // of `out`.
        unsafe {
            let hit = (0..n as isize).any(|k| nonzero(input.dtype, at(input, i + k * si)) == want);
            *at(out, o) = u8::from(hit == want);
        }
    });
    Ok(())
}

/// A bitwise operator of [`bitwise`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BitwiseOp {
    /// `a & b`
    And,
    /// `a | b`
    Or,
    /// `a ^ b`
    Xor,
}

/// `out = a OP b` on the bits of i32, i64, u8 or bool elements, `a` and
/// `b` broadcast to `out`'s shape. `out` may be exactly `a` or `b`.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `out` must not overlap an input unless it is exactly that input, nor
/// itself.
pub unsafe fn bitwise(op: BitwiseOp, a: &View, b: &View, out: &View) -> Result<(), KernelError> {
    out.validate("bitwise", "out")?;
    a.validate("bitwise", "a")?;
    b.validate("bitwise", "b")?;
    let dt = out.dtype;
    if a.dtype != dt || b.dtype != dt || dt.is_float() {
        bail!(
            "bitwise: need one integer or bool dtype for a, b and out, got {:?}, {:?}, {:?}",
            a.dtype,
            b.dtype,
            dt
        );
    }
    let sa = broadcast_strides("a", a, out.shape)?;
    let sb = broadcast_strides("b", b, out.shape)?;
    let size = dt.size();
    // SAFETY: forwarded from this function's contract.
    unsafe {
        for_each_strided(
            out.shape,
            [out.ptr, a.ptr, b.ptr],
            [out.strides, sa.as_slice(), sb.as_slice()],
            [size; 3],
            1,
            &|[o, x, y], len, [so, sx, sy]| {
                for i in 0..len as isize {
                    let s = size as isize;
                    let l = load_bits(dt, x.offset(i * sx * s));
                    let r = load_bits(dt, y.offset(i * sy * s));
                    let v = match op {
                        BitwiseOp::And => l & r,
                        BitwiseOp::Or => l | r,
                        BitwiseOp::Xor => l ^ r,
                    };
                    store_bits(dt, o.offset(i * so * s), v);
                }
            },
        );
    }
    Ok(())
}

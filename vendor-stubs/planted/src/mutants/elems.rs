//! Element access for the hand-written (mutated) kernels: element addresses
//! of a strided view in row-major order, and loads and stores of every dtype
//! through `f64`.

use ferrite_kernels::{DType, View, bf16_from_f64, f16_from_f64};

/// Element addresses of `v` in row-major index order.
pub fn addresses(v: &View<'_>) -> Vec<*mut u8> {
    let n = v.numel();
    let size = v.dtype.size() as isize;
    let mut out = Vec::with_capacity(n);
    let mut index = vec![0i64; v.shape.len()];
    for _ in 0..n {
        let offset: i64 = index.iter().zip(v.strides).map(|(i, s)| i * s).sum();
        out.push(v.ptr.wrapping_offset(offset as isize * size));
        for k in (0..index.len()).rev() {
            index[k] += 1;
            if index[k] < v.shape[k] {
                break;
            }
            index[k] = 0;
        }
    }
    out
}

/// The rows (last dimension) of `v`, each as its element addresses.
pub fn rows(v: &View<'_>) -> Vec<Vec<*mut u8>> {
    let n = v.shape.last().copied().unwrap_or(1).max(1) as usize;
    addresses(v).chunks(n).map(<[_]>::to_vec).collect()
}

/// Reads one element as `f64`.
///
/// # Safety
/// `p` addresses a live element of `dtype`.
pub unsafe fn load(dtype: DType, p: *mut u8) -> f64 {
    // SAFETY: guaranteed by the caller.
    unsafe {
        match dtype {
            DType::F32 => f64::from(p.cast::<f32>().read_unaligned()),
            DType::F64 => p.cast::<f64>().read_unaligned(),
            DType::F16 => half::f16::from_bits(p.cast::<u16>().read_unaligned()).to_f64(),
            DType::BF16 => half::bf16::from_bits(p.cast::<u16>().read_unaligned()).to_f64(),
            DType::I32 => f64::from(p.cast::<i32>().read_unaligned()),
            DType::I64 => p.cast::<i64>().read_unaligned() as f64,
            DType::U8 | DType::Bool => f64::from(p.read()),
        }
    }
}

/// Reads one integer element.
///
/// # Safety
/// `p` addresses a live element of `dtype`.
pub unsafe fn load_int(dtype: DType, p: *mut u8) -> i64 {
    // SAFETY: guaranteed by the caller.
    unsafe {
        match dtype {
            DType::I32 => i64::from(p.cast::<i32>().read_unaligned()),
            DType::I64 => p.cast::<i64>().read_unaligned(),
            _ => load(dtype, p) as i64,
        }
    }
}

/// Writes one integer element.
///
/// # Safety
/// `p` addresses a live, writable element of `dtype`.
pub unsafe fn store_int(dtype: DType, p: *mut u8, v: i64) {
    // SAFETY: guaranteed by the caller.
    unsafe {
        match dtype {
            DType::I32 => p.cast::<i32>().write_unaligned(v as i32),
            DType::I64 => p.cast::<i64>().write_unaligned(v),
            _ => store(dtype, p, v as f64),
        }
    }
}

/// The raw bits of `v` rounded to nearest even in `dtype` (a float type).
pub fn bits(dtype: DType, v: f64) -> u64 {
    match dtype {
        DType::F32 => u64::from((v as f32).to_bits()),
        DType::F64 => v.to_bits(),
        DType::F16 => u64::from(f16_from_f64(v).to_bits()),
        DType::BF16 => u64::from(bf16_from_f64(v).to_bits()),
        _ => v as i64 as u64,
    }
}

/// `v` rounded to nearest even in `dtype`.
pub fn round(dtype: DType, v: f64) -> f64 {
    from_bits(dtype, bits(dtype, v))
}

fn from_bits(dtype: DType, b: u64) -> f64 {
    match dtype {
        DType::F32 => f64::from(f32::from_bits(b as u32)),
        DType::F64 => f64::from_bits(b),
        DType::F16 => half::f16::from_bits(b as u16).to_f64(),
        DType::BF16 => half::bf16::from_bits(b as u16).to_f64(),
        _ => b as i64 as f64,
    }
}

/// `v` rounded toward zero in `dtype` (the truncation bug).
pub fn truncate(dtype: DType, v: f64) -> f64 {
    let r = round(dtype, v);
    if v.is_finite() && r.abs() > v.abs() {
        // One step toward zero: the magnitude's bit pattern minus one.
        from_bits(dtype, bits(dtype, v) - 1)
    } else {
        r
    }
}

/// Writes `v` rounded to nearest even.
///
/// # Safety
/// `p` addresses a live, writable element of `dtype`.
pub unsafe fn store(dtype: DType, p: *mut u8, v: f64) {
    let b = bits(dtype, v);
    // SAFETY: guaranteed by the caller.
    unsafe {
        match dtype {
            DType::F32 => p.cast::<u32>().write_unaligned(b as u32),
            DType::F64 => p.cast::<u64>().write_unaligned(b),
            DType::F16 | DType::BF16 => p.cast::<u16>().write_unaligned(b as u16),
            DType::I32 => p.cast::<i32>().write_unaligned(v as i32),
            DType::I64 => p.cast::<i64>().write_unaligned(v as i64),
            DType::U8 | DType::Bool => p.write(v as u8),
        }
    }
}

/// Writes `v` exactly (it must already be representable).
///
/// # Safety
/// As for [`store`].
pub unsafe fn store_exact(dtype: DType, p: *mut u8, v: f64) {
    // SAFETY: forwarded.
    unsafe { store(dtype, p, v) }
}

/// Applies `f` elementwise from `input` to `out` (same shape), through
/// `f64`, rounding each result with `rounding`.
///
/// # Safety
/// Both views address live memory of their dtype.
pub unsafe fn map(
    input: &View<'_>,
    out: &View<'_>,
    rounding: fn(DType, f64) -> f64,
    f: impl Fn(f64) -> f64,
) {
    let (i, o) = (addresses(input), addresses(out));
    for (&x, &y) in i.iter().zip(&o) {
        // SAFETY: addresses of live elements.
        unsafe {
            let v = f(load(input.dtype, x));
            store_exact(out.dtype, y, rounding(out.dtype, v));
        }
    }
}

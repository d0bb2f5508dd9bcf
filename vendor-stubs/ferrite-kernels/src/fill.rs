//! `fill`: set every element of a strided view to one value, converted to the
//! view's dtype (floats round to nearest even, integers saturate, `Bool` is
//! `value != 0`).

use crate::dtype::DType;
use crate::error::KernelError;
use crate::layout::for_each_strided;
use crate::parallel::{SyncPtr, for_each_range};
use crate::rounding::{bf16_from_f64, f16_from_f64};
use crate::shape::contiguous_len;
use crate::view::View;

/// Sets every element addressed by `out` to `value` converted to its dtype.
///
/// # Safety
/// Every element addressed by `out` must be valid, writable memory of its
/// dtype, and `out` must not overlap itself.
pub unsafe fn fill(out: &View, value: f64) -> Result<(), KernelError> {
    out.validate("fill", "out")?;
    // SAFETY: forwarded from this function's contract.
    unsafe {
        match out.dtype {
            DType::F32 => fill_typed(out, value as f32),
            DType::F64 => fill_typed(out, value),
            DType::F16 => fill_typed(out, f16_from_f64(value).to_bits()),
            DType::BF16 => fill_typed(out, bf16_from_f64(value).to_bits()),
            DType::I32 => fill_typed(out, value as i32),
            DType::I64 => fill_typed(out, value as i64),
            DType::U8 => fill_typed(out, value as u8),
            DType::Bool => fill_typed(out, u8::from(value != 0.0)),
        }
    }
    Ok(())
}

/// # Safety
/// As for [`fill`], with `T` the size of `out`'s dtype.
#[inline]
unsafe fn fill_typed<T: Copy + Send + Sync>(out: &View, v: T) {
    if let Some(n) = contiguous_len(out.shape, out.strides) {
        let base = SyncPtr::new(out.ptr);
        // SAFETY: the view is contiguous, so `n` elements from `ptr` are valid.
        for_each_range(n, 1, |start, len| unsafe {
            let p = (base.get() as *mut T).add(start);
            std::slice::from_raw_parts_mut(p, len).fill(v);
        });
        return;
    }
    let size = std::mem::size_of::<T>();
    // SAFETY: every run lies inside the caller-guaranteed view.
    unsafe {
        for_each_strided(
            out.shape,
            [out.ptr],
            [out.strides],
            [size],
            1,
            &|[p], len, [s]| {
                let p = p as *mut T;
                if s == 1 {
                    std::slice::from_raw_parts_mut(p, len).fill(v);
                } else {
                    for i in 0..len {
                        *p.offset(i as isize * s) = v;
                    }
                }
            },
        );
    }
}

//! `copy` (same dtype, any strides to any strides) and `cast` (between the
//! float dtypes, rounding to nearest even once).

use crate::convert::{BLOCK, load_f32, load_native, store_f32};
use crate::dtype::DType;
use crate::error::{KernelError, bail};
use crate::layout::for_each_strided;
use crate::parallel::{SyncPtr, for_each_range};
use crate::rounding::f64_to_f32_odd;
use crate::shape::contiguous_len;
use crate::simd::simd_dispatch;
use crate::view::View;

/// Copies `src` into `dst` (same dtype, same shape, any strides).
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `dst` must not overlap `src` unless both views are identical, and must not
/// overlap itself.
pub unsafe fn copy(src: &View, dst: &View) -> Result<(), KernelError> {
    check_pair("copy", src, dst)?;
    if src.dtype != dst.dtype {
        bail!("copy: dtype mismatch {:?} -> {:?}", src.dtype, dst.dtype);
    }
    if src.ptr == dst.ptr && src.strides == dst.strides {
        return Ok(());
    }
    // SAFETY: forwarded from this function's contract.
    unsafe {
        match dst.dtype.size() {
            1 => copy_typed::<u8>(src, dst),
            2 => copy_typed::<u16>(src, dst),
            4 => copy_typed::<u32>(src, dst),
            _ => copy_typed::<u64>(src, dst),
        }
    }
    Ok(())
}

fn check_pair(what: &str, src: &View, dst: &View) -> Result<(), KernelError> {
    src.validate(what, "src")?;
    dst.validate(what, "dst")?;
    if src.shape != dst.shape {
        bail!("{what}: shape mismatch {:?} vs {:?}", src.shape, dst.shape);
    }
    Ok(())
}

/// # Safety
/// As for [`copy`], with `T` the size of the dtype.
unsafe fn copy_typed<T: Copy + Send + Sync>(src: &View, dst: &View) {
    let (s, d) = (SyncPtr::new(src.ptr), SyncPtr::new(dst.ptr));
    if let (Some(n), Some(_)) = (
        contiguous_len(src.shape, src.strides),
        contiguous_len(dst.shape, dst.strides),
    ) {
        // SAFETY: both views are contiguous with `n` valid elements.
        for_each_range(n, 1, |start, len| unsafe {
            let sp = (s.get() as *const T).add(start);
            let dp = (d.get() as *mut T).add(start);
            std::ptr::copy_nonoverlapping(sp, dp, len);
        });
        return;
    }
    let size = std::mem::size_of::<T>();
    let ptrs = [dst.ptr, src.ptr];
    let strides = [dst.strides, src.strides];
    // SAFETY: every run lies inside the caller-guaranteed views.
    unsafe {
        for_each_strided(
            dst.shape,
            ptrs,
            strides,
            [size; 2],
            1,
            &|[dp, sp], len, [ds, ss]| {
                let (dp, sp) = (dp as *mut T, sp as *const T);
                if ds == 1 && ss == 1 {
                    std::ptr::copy_nonoverlapping(sp, dp, len);
                } else {
                    for i in 0..len as isize {
                        *dp.offset(i * ds) = *sp.offset(i * ss);
                    }
                }
            },
        );
    }
}

/// Converts `src` into `dst` (same shape, any strides) between the float
/// dtypes, rounding to nearest even once. Same-dtype casts are copies.
///
/// # Safety
/// As for [`copy`].
pub unsafe fn cast(src: &View, dst: &View) -> Result<(), KernelError> {
    check_pair("cast", src, dst)?;
    if src.dtype == dst.dtype {
        // SAFETY: forwarded from this function's contract.
        return unsafe { copy(src, dst) };
    }
    if !src.dtype.is_float() || !dst.dtype.is_float() {
        bail!("cast: unsupported {:?} -> {:?}", src.dtype, dst.dtype);
    }
    let (sdt, ddt) = (src.dtype, dst.dtype);
    let (s, d) = (SyncPtr::new(src.ptr), SyncPtr::new(dst.ptr));
    if let (Some(n), Some(_)) = (
        contiguous_len(src.shape, src.strides),
        contiguous_len(dst.shape, dst.strides),
    ) {
        // SAFETY: both views are contiguous with `n` valid elements.
        for_each_range(n, 1, |start, len| unsafe {
            let sp = s.get().add(start * sdt.size());
            let dp = d.get().add(start * ddt.size());
            cast_run(sdt, ddt, sp, 1, dp, 1, len);
        });
        return Ok(());
    }
    let ptrs = [dst.ptr, src.ptr];
    let sizes = [ddt.size(), sdt.size()];
    let strides = [dst.strides, src.strides];
    // SAFETY: every run lies inside the caller-guaranteed views.
    unsafe {
        for_each_strided(
            dst.shape,
            ptrs,
            strides,
            sizes,
            1,
            &|[dp, sp], len, [ds, ss]| {
                cast_run(sdt, ddt, sp, ss, dp, ds, len);
            },
        );
    }
    Ok(())
}

simd_dispatch!(unsafe fn cast_run[](sdt: DType, ddt: DType, sp: *const u8, ss: isize, dp: *mut u8, ds: isize, n: usize) => cast_run_impl[]);

/// Converts one strided run of `n` elements.
///
/// # Safety
/// Both runs must be valid for their dtypes and must not overlap.
#[inline(always)]
unsafe fn cast_run_impl(
    sdt: DType,
    ddt: DType,
    sp: *const u8,
    ss: isize,
    dp: *mut u8,
    ds: isize,
    n: usize,
) {
    let mut wide = [0f64; BLOCK];
    let mut narrow = [0f32; BLOCK];
    let mut done = 0usize;
    while done < n {
        let m = BLOCK.min(n - done);
        // SAFETY: offsets stay within the `n`-element runs the caller vouched for.
        unsafe {
            let sp = sp.offset(done as isize * ss * sdt.size() as isize);
            let dp = dp.offset(done as isize * ds * ddt.size() as isize);
            match (sdt, ddt) {
                (DType::F64, DType::F32) => {
                    load_native(sp as *const f64, ss, &mut wide[..m]);
                    for (o, &w) in narrow[..m].iter_mut().zip(&wide[..m]) {
                        *o = w as f32;
                    }
                    store_f32(DType::F32, dp, ds, &narrow[..m]);
                }
                (DType::F64, _) => {
                    load_native(sp as *const f64, ss, &mut wide[..m]);
                    for (o, &w) in narrow[..m].iter_mut().zip(&wide[..m]) {
                        *o = f64_to_f32_odd(w);
                    }
                    store_f32(ddt, dp, ds, &narrow[..m]);
                }
                // Every other pair widens exactly to f32 (also into F64).
                _ => {
                    load_f32(sdt, sp, ss, &mut narrow[..m]);
                    store_f32(ddt, dp, ds, &narrow[..m]);
                }
            }
        }
        done += m;
    }
}

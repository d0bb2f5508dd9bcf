//! Block loaders and storers that move a strided run of any float dtype
//! into an `f32` buffer and back (rounding to nearest even once), plus
//! strided gathers/scatters of native types. Contiguous `f16` runs use the
//! F16C instructions when the CPU has them.

use crate::dtype::DType;
use crate::rounding::{bf16_bits_from_f32, bf16_bits_to_f32, f16_bits_from_f32, f16_bits_to_f32};
use crate::simd::has_avx2;

/// Elements per stack block in blocked kernels.
pub(crate) const BLOCK: usize = 64;

/// Reads `dst.len()` elements of `dt` (F32, F16 or BF16) from `p` with
/// element stride `stride`, widening exactly to `f32`.
///
/// # Safety
/// Every addressed element must be readable memory of type `dt`.
#[inline(always)]
pub(crate) unsafe fn load_f32(dt: DType, p: *const u8, stride: isize, dst: &mut [f32]) {
    let n = dst.len();
    if n == 0 {
        return;
    }
    // SAFETY: the caller guarantees `n` valid elements at `stride` from `p`.
    unsafe {
        if stride == 0 {
            let v = match dt {
                DType::F16 => f16_bits_to_f32(*(p as *const u16)),
                DType::BF16 => bf16_bits_to_f32(*(p as *const u16)),
                DType::F64 => *(p as *const f64) as f32,
                _ => *(p as *const f32),
            };
            dst.fill(v);
            return;
        }
        match dt {
            DType::F16 if stride == 1 && has_avx2() => {
                f16c::widen(std::slice::from_raw_parts(p as *const u16, n), dst)
            }
            DType::F16 => widen(p as *const u16, stride, dst, f16_bits_to_f32),
            DType::BF16 => widen(p as *const u16, stride, dst, bf16_bits_to_f32),
            DType::F64 => {
                let p = p as *const f64;
                for (i, d) in dst.iter_mut().enumerate() {
                    *d = *p.offset(i as isize * stride) as f32;
                }
            }
            _ => load_native(p as *const f32, stride, dst),
        }
    }
}

/// Writes `src` to `n` elements of `dt` (F32, F16, BF16 or F64) at `p` with
/// element stride `stride`, rounding to nearest even once.
///
/// # Safety
/// Every addressed element must be writable memory of type `dt`, not
/// overlapping `src`.
#[inline(always)]
pub(crate) unsafe fn store_f32(dt: DType, p: *mut u8, stride: isize, src: &[f32]) {
    let n = src.len();
    if n == 0 {
        return;
    }
    // SAFETY: the caller guarantees `n` valid elements at `stride` from `p`.
    unsafe {
        match dt {
            DType::F16 if stride == 1 && has_avx2() => {
                f16c::narrow(src, std::slice::from_raw_parts_mut(p as *mut u16, n))
            }
            DType::F16 => narrow(p as *mut u16, stride, src, f16_bits_from_f32),
            DType::BF16 => narrow(p as *mut u16, stride, src, bf16_bits_from_f32),
            DType::F64 => {
                let p = p as *mut f64;
                for (i, &s) in src.iter().enumerate() {
                    *p.offset(i as isize * stride) = s as f64;
                }
            }
            _ => store_native(p as *mut f32, stride, src),
        }
    }
}

/// Widens `dst.len()` 16-bit floats at `p` (element stride `stride`).
///
/// # Safety
/// Every addressed element must be readable.
#[inline(always)]
unsafe fn widen(p: *const u16, stride: isize, dst: &mut [f32], f: impl Fn(u16) -> f32) {
    // SAFETY: the caller guarantees `dst.len()` readable elements at `stride`.
    unsafe {
        if stride == 1 {
            let src = std::slice::from_raw_parts(p, dst.len());
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = f(s);
            }
        } else {
            for (i, d) in dst.iter_mut().enumerate() {
                *d = f(*p.offset(i as isize * stride));
            }
        }
    }
}

/// Rounds `src` into 16-bit floats at `p` (element stride `stride`).
///
/// # Safety
/// Every addressed element must be writable and not overlap `src`.
#[inline(always)]
unsafe fn narrow(p: *mut u16, stride: isize, src: &[f32], f: impl Fn(f32) -> u16) {
    // SAFETY: the caller guarantees `src.len()` writable elements at `stride`.
    unsafe {
        if stride == 1 {
            let dst = std::slice::from_raw_parts_mut(p, src.len());
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = f(s);
            }
        } else {
            for (i, &s) in src.iter().enumerate() {
                *p.offset(i as isize * stride) = f(s);
            }
        }
    }
}

/// Hardware `f16` conversions (F16C, eight lanes at a time).
#[cfg(target_arch = "x86_64")]
mod f16c {
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must support AVX and F16C; lengths must match.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn widen(src: &[u16], dst: &mut [f32]) {
        let n = dst.len().min(src.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` keeps both accesses in bounds.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        for j in i..n {
            dst[j] = crate::rounding::f16_bits_to_f32(src[j]);
        }
    }

    /// # Safety
    /// The CPU must support AVX and F16C; lengths must match.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn narrow(src: &[f32], dst: &mut [u16]) {
        let n = dst.len().min(src.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` keeps both accesses in bounds.
            unsafe {
                let v = _mm256_loadu_ps(src.as_ptr().add(i));
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
            }
            i += 8;
        }
        for j in i..n {
            dst[j] = crate::rounding::f16_bits_from_f32(src[j]);
        }
    }
}

/// Portable stand-ins, never called (`has_avx2` is false off x86-64).
#[cfg(not(target_arch = "x86_64"))]
mod f16c {
    pub(super) unsafe fn widen(src: &[u16], dst: &mut [f32]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = crate::rounding::f16_bits_to_f32(s);
        }
    }
    pub(super) unsafe fn narrow(src: &[f32], dst: &mut [u16]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = crate::rounding::f16_bits_from_f32(s);
        }
    }
}

/// Gathers `dst.len()` elements of `T` from `p` with element stride `stride`.
///
/// # Safety
/// Every addressed element must be readable memory of type `T`.
#[inline(always)]
pub(crate) unsafe fn load_native<T: Copy>(p: *const T, stride: isize, dst: &mut [T]) {
    // SAFETY: the caller guarantees `dst.len()` readable elements at `stride`.
    unsafe {
        if stride == 1 {
            dst.copy_from_slice(std::slice::from_raw_parts(p, dst.len()));
        } else {
            for (i, d) in dst.iter_mut().enumerate() {
                *d = *p.offset(i as isize * stride);
            }
        }
    }
}

/// Scatters `src` to elements of `T` at `p` with element stride `stride`.
///
/// # Safety
/// Every addressed element must be writable memory of type `T`, not
/// overlapping `src`.
#[inline(always)]
pub(crate) unsafe fn store_native<T: Copy>(p: *mut T, stride: isize, src: &[T]) {
    // SAFETY: the caller guarantees `src.len()` writable elements at `stride`.
    unsafe {
        if stride == 1 {
            std::slice::from_raw_parts_mut(p, src.len()).copy_from_slice(src);
        } else {
            for (i, &s) in src.iter().enumerate() {
                *p.offset(i as isize * stride) = s;
            }
        }
    }
}

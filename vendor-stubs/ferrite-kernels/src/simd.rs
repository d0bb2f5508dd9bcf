//! Runtime selection of wider vector instructions. The crate is compiled for
//! the baseline target (SSE2 on x86-64); [`simd_dispatch!`] wraps a hot
//! `#[inline(always)]` kernel so it is compiled a second time with AVX2, FMA
//! and F16C enabled and that copy is called when the CPU has them. No fused
//! multiply-adds are formed implicitly, so both copies give bit-identical
//! results.

use std::sync::atomic::{AtomicBool, Ordering};

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Allows (the default) or forbids the AVX2 code paths, e.g. to compare
/// both builds of a kernel in tests. Results are bit-identical either way.
#[doc(hidden)]
pub fn set_simd_enabled(enabled: bool) {
    ENABLED.store(enabled, Ordering::Relaxed);
}

/// Whether the AVX2/FMA/F16C paths are enabled and the CPU supports them
/// (detection is cached by `std`).
#[inline(always)]
pub(crate) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        ENABLED.load(Ordering::Relaxed)
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `simd_dispatch!(vis unsafe fn name[generics](args) => imp[type args]);`
/// defines `name`, which calls the `#[inline(always)]` function `imp`
/// (same arguments, unit result) compiled for AVX2/FMA/F16C when the CPU
/// supports it, and the baseline build otherwise. `name` has `imp`'s
/// safety contract.
macro_rules! simd_dispatch {
    ($vis:vis unsafe fn $name:ident[$($gen:tt)*]($($arg:ident: $ty:ty),* $(,)?) => $imp:ident[$($targs:ty),*]) => {
        /// Dispatching wrapper; see the inner implementation for the
        /// safety contract.
        #[inline(always)]
        $vis unsafe fn $name<$($gen)*>($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn avx2<$($gen)*>($($arg: $ty),*) {
                // SAFETY: forwarded from the wrapper's contract.
                unsafe { $imp::<$($targs),*>($($arg),*) }
            }
            #[cfg(target_arch = "x86_64")]
            if $crate::simd::has_avx2() {
                // SAFETY: the CPU features were detected; the rest is
                // forwarded from the wrapper's contract.
                return unsafe { avx2::<$($targs),*>($($arg),*) };
            }
            // SAFETY: forwarded from the wrapper's contract.
            unsafe { $imp::<$($targs),*>($($arg),*) }
        }
    };
}
pub(crate) use simd_dispatch;

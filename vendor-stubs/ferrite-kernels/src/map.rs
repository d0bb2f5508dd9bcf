//! The elementwise driver behind the ABI 1.1 pointwise operators: `N`
//! same-shaped operands (any strides, per-operand dtype), each read, written
//! or both, are walked in stack blocks of [`BLOCK`] elements widened to
//! `f32`; a block function computes on the `f32` blocks, and the written
//! operands are rounded back once. Contiguous operands take one linear walk,
//! anything else goes through the strided planner; both split the work over
//! the rayon pool when it is large. Every block is fully read before it is
//! written, so an output may be exactly one of the inputs.

use crate::convert::{BLOCK, load_f32, store_f32};
use crate::dtype::DType;
use crate::error::{KernelError, bail};
use crate::layout::for_each_strided;
use crate::parallel::{SyncPtr, for_each_range};
use crate::shape::contiguous_len;
use crate::simd::simd_dispatch;
use crate::view::View;

/// How a kernel uses one operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Only read.
    Read,
    /// Only written.
    Write,
    /// Read, then written (updated in place).
    Update,
}

impl Access {
    fn reads(self) -> bool {
        self != Access::Write
    }
    fn writes(self) -> bool {
        self != Access::Read
    }
}

/// Checks that `v` is well formed and has an `f32`, `f16` or `bf16` dtype.
pub(crate) fn check_float(kernel: &str, name: &str, v: &View) -> Result<(), KernelError> {
    v.validate(kernel, name)?;
    if !matches!(v.dtype, DType::F32 | DType::F16 | DType::BF16) {
        bail!("{kernel}: {name}: need f32, f16 or bf16, got {:?}", v.dtype);
    }
    Ok(())
}

/// Checks that `v` is a well-formed `f32` view.
pub(crate) fn check_f32(kernel: &str, name: &str, v: &View) -> Result<(), KernelError> {
    v.validate(kernel, name)?;
    if v.dtype != DType::F32 {
        bail!("{kernel}: {name}: need f32, got {:?}", v.dtype);
    }
    Ok(())
}

/// Checks that `v` has `shape`.
pub(crate) fn check_shape(
    kernel: &str,
    name: &str,
    v: &View,
    shape: &[i64],
) -> Result<(), KernelError> {
    if v.shape != shape {
        bail!("{kernel}: {name}: shape {:?}, expected {shape:?}", v.shape);
    }
    Ok(())
}

/// Runs `f` over every block of the operands `ops` (operand 0 should be
/// written: the walk follows its layout). All shapes must be equal and the
/// views checked. `weight` is the relative cost per element.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// written operands must not overlap themselves or any other operand unless
/// they are exactly the same view.
pub(crate) unsafe fn map_blocks<const N: usize, F>(ops: [(&View, Access); N], weight: usize, f: F)
where
    F: Fn([&mut [f32]; N]) + Sync,
{
    let shape = ops[0].0.shape;
    let dts = ops.map(|(v, _)| v.dtype);
    let access = ops.map(|(_, a)| a);
    let sizes = dts.map(|d| d.size());
    let kernel = Kernel { dts, access, f: &f };
    if ops.iter().all(|(v, _)| v.is_contiguous()) {
        let n = contiguous_len(shape, ops[0].0.strides).unwrap_or(0);
        let base = ops.map(|(v, _)| SyncPtr::new(v.ptr));
        for_each_range(n, weight, |start, len| {
            let p = std::array::from_fn(|k| base[k].get().wrapping_add(start * sizes[k]));
            // SAFETY: contiguous views of `n` elements each; this is a sub-run.
            unsafe { run(&kernel, p, len, [1; N]) };
        });
        return;
    }
    let ptrs = ops.map(|(v, _)| v.ptr);
    let strides = ops.map(|(v, _)| v.strides);
    // SAFETY: forwarded from this function's contract.
    unsafe {
        for_each_strided(shape, ptrs, strides, sizes, weight, &|p, len, s| {
            run(&kernel, p, len, s)
        });
    }
}

/// The per-run state: dtypes, access modes and the block function.
struct Kernel<'f, const N: usize, F> {
    dts: [DType; N],
    access: [Access; N],
    f: &'f F,
}

simd_dispatch!(unsafe fn run[const N: usize, F: Fn([&mut [f32]; N])](k: &Kernel<N, F>, p: [*mut u8; N], n: usize, s: [isize; N]) => run_impl[N, F]);

/// One run of `n` elements per operand, in blocks.
///
/// # Safety
/// `p[i]` must address `n` valid elements of `k.dts[i]` with stride `s[i]`.
#[inline(always)]
unsafe fn run_impl<const N: usize, F: Fn([&mut [f32]; N])>(
    k: &Kernel<N, F>,
    p: [*mut u8; N],
    n: usize,
    s: [isize; N],
) {
    let mut bufs = [[0f32; BLOCK]; N];
    let mut done = 0usize;
    while done < n {
        let m = BLOCK.min(n - done);
        let at = |i: usize| p[i].wrapping_offset(done as isize * s[i] * k.dts[i].size() as isize);
        // Whole contiguous f32 blocks move as fixed-size copies (inlined
        // vector moves instead of a `memcpy` call per block).
        let whole = |i: usize| m == BLOCK && s[i] == 1 && k.dts[i] == DType::F32;
        for (i, b) in bufs.iter_mut().enumerate() {
            if k.access[i].reads() {
                // SAFETY: a sub-run of the caller's valid run.
                unsafe {
                    match whole(i) {
                        true => *b = std::ptr::read_unaligned(at(i) as *const [f32; BLOCK]),
                        false => load_f32(k.dts[i], at(i), s[i], &mut b[..m]),
                    }
                }
            }
        }
        (k.f)(bufs.each_mut().map(|b| &mut b[..m]));
        for (i, b) in bufs.iter().enumerate() {
            if k.access[i].writes() {
                // SAFETY: as above; the blocks are stack memory.
                unsafe {
                    match whole(i) {
                        true => std::ptr::write_unaligned(at(i) as *mut [f32; BLOCK], *b),
                        false => store_f32(k.dts[i], at(i), s[i], &b[..m]),
                    }
                }
            }
        }
        done += m;
    }
}

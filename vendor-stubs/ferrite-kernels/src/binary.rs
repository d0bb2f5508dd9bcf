//! `binary`: elementwise `Add`/`Sub`/`Mul`/`Div` with NumPy broadcasting of
//! both inputs to the output's shape. `f32`/`f64` compute natively; `f16` and
//! `bf16` compute in `f32` blocks and round once.

use crate::convert::{BLOCK, load_f32, store_f32};
use crate::dtype::DType;
use crate::error::{KernelError, bail};
use crate::float::Real;
use crate::layout::for_each_strided;
use crate::parallel::{SyncPtr, for_each_range};
use crate::shape::{broadcast_strides, contiguous_len};
use crate::simd::simd_dispatch;
use crate::view::View;

/// An elementwise binary operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    /// `a + alpha * b`
    Add,
    /// `a - alpha * b`
    Sub,
    /// `a * b`
    Mul,
    /// `a / b`
    Div,
}

/// `out = a (op) b` elementwise, with `a` and `b` broadcast NumPy-style to
/// `out`'s shape. `alpha` scales `b` for `Add`/`Sub` and is ignored otherwise.
/// Float dtypes only, all three the same.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `out` must not overlap `a` or `b` unless it is exactly the same view (same
/// pointer, shape and strides), and must not overlap itself.
pub unsafe fn binary(
    op: BinaryOp,
    a: &View,
    b: &View,
    out: &View,
    alpha: f64,
) -> Result<(), KernelError> {
    a.validate("binary", "a")?;
    b.validate("binary", "b")?;
    out.validate("binary", "out")?;
    let dt = out.dtype;
    if matches!(dt, DType::I32 | DType::I64) {
        // SAFETY: forwarded from this function's contract.
        return unsafe { crate::logic::binary_int(op, a, b, out, alpha) };
    }
    if !dt.is_float() || a.dtype != dt || b.dtype != dt {
        bail!(
            "binary: need one float dtype, got a={:?} b={:?} out={:?}",
            a.dtype,
            b.dtype,
            out.dtype
        );
    }
    let contiguous = a.shape == out.shape
        && b.shape == out.shape
        && a.is_contiguous()
        && b.is_contiguous()
        && out.is_contiguous();
    let (sa, sb);
    let strides = if contiguous {
        [out.strides; 3]
    } else {
        sa = broadcast_strides("a", a, out.shape)?;
        sb = broadcast_strides("b", b, out.shape)?;
        [out.strides, sa.as_slice(), sb.as_slice()]
    };
    let ops = Operands {
        out,
        strides,
        contiguous,
    };
    // SAFETY: forwarded from this function's contract.
    unsafe {
        match dt {
            DType::F32 => native::<f32>(op, alpha as f32, &ops, a.ptr, b.ptr),
            DType::F64 => native::<f64>(op, alpha, &ops, a.ptr, b.ptr),
            _ => {
                let al = alpha as f32;
                let (ap, bp) = (a.ptr, b.ptr);
                match op {
                    BinaryOp::Add => {
                        ops.drive(ap, bp, |p, n, s| half_run(dt, p, n, s, |x, y| x + al * y))
                    }
                    BinaryOp::Sub => {
                        ops.drive(ap, bp, |p, n, s| half_run(dt, p, n, s, |x, y| x - al * y))
                    }
                    BinaryOp::Mul => {
                        ops.drive(ap, bp, |p, n, s| half_run(dt, p, n, s, |x, y| x * y))
                    }
                    BinaryOp::Div => {
                        ops.drive(ap, bp, |p, n, s| half_run(dt, p, n, s, |x, y| x / y))
                    }
                }
            }
        }
    }
    Ok(())
}

struct Operands<'a> {
    out: &'a View<'a>,
    strides: [&'a [i64]; 3],
    contiguous: bool,
}

impl Operands<'_> {
    /// Runs `kernel(ptrs [out, a, b], len, strides)` over the whole output.
    ///
    /// # Safety
    /// As for [`binary`].
    unsafe fn drive<F>(&self, a: *mut u8, b: *mut u8, kernel: F)
    where
        F: Fn([*mut u8; 3], usize, [isize; 3]) + Sync,
    {
        let size = self.out.dtype.size();
        if self.contiguous {
            let n = contiguous_len(self.out.shape, self.out.strides).unwrap_or(0);
            let p = [self.out.ptr, a, b].map(SyncPtr::new);
            for_each_range(n, 1, |start, len| {
                let ptrs = p.map(|q| q.get().wrapping_add(start * size));
                kernel(ptrs, len, [1, 1, 1]);
            });
            return;
        }
        let ptrs = [self.out.ptr, a, b];
        // SAFETY: forwarded from this function's contract.
        unsafe { for_each_strided(self.out.shape, ptrs, self.strides, [size; 3], 1, &kernel) };
    }
}

/// # Safety
/// As for [`binary`], with `T` matching the dtype.
unsafe fn native<T: Real>(op: BinaryOp, al: T, ops: &Operands, ap: *mut u8, bp: *mut u8) {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        match op {
            BinaryOp::Add => ops.drive(ap, bp, |p, n, s| native_run(p, n, s, |x: T, y| x + al * y)),
            BinaryOp::Sub => ops.drive(ap, bp, |p, n, s| native_run(p, n, s, |x: T, y| x - al * y)),
            BinaryOp::Mul => ops.drive(ap, bp, |p, n, s| native_run(p, n, s, |x: T, y| x * y)),
            BinaryOp::Div => ops.drive(ap, bp, |p, n, s| native_run(p, n, s, |x: T, y| x / y)),
        }
    }
}

simd_dispatch!(unsafe fn native_run[T: Copy, F: Fn(T, T) -> T](p: [*mut u8; 3], n: usize, s: [isize; 3], f: F) => native_run_impl[T, F]);

/// One run of a native-type kernel, specialised for the contiguous and
/// scalar-broadcast cases so they vectorize. In place is allowed when the
/// output pointer equals an input pointer with the same stride.
///
/// # Safety
/// `p` must address runs of `n` valid `T` elements with strides `s`.
#[inline(always)]
unsafe fn native_run_impl<T: Copy, F: Fn(T, T) -> T>(
    p: [*mut u8; 3],
    n: usize,
    s: [isize; 3],
    f: F,
) {
    let (o, a, b) = (p[0] as *mut T, p[1] as *const T, p[2] as *const T);
    let oc = o as *const T;
    // SAFETY: the plan hands out runs of `n` valid elements per operand;
    // mutable and shared slices are only formed over distinct memory.
    unsafe {
        match s {
            [1, 1, 1] if oc == a && oc == b => {
                for x in std::slice::from_raw_parts_mut(o, n) {
                    *x = f(*x, *x);
                }
            }
            [1, 1, 1] if oc == a => {
                let bs = std::slice::from_raw_parts(b, n);
                for (x, &y) in std::slice::from_raw_parts_mut(o, n).iter_mut().zip(bs) {
                    *x = f(*x, y);
                }
            }
            [1, 1, 1] if oc == b => {
                let as_ = std::slice::from_raw_parts(a, n);
                for (y, &x) in std::slice::from_raw_parts_mut(o, n).iter_mut().zip(as_) {
                    *y = f(x, *y);
                }
            }
            [1, 1, 1] => {
                let (as_, bs) = (
                    std::slice::from_raw_parts(a, n),
                    std::slice::from_raw_parts(b, n),
                );
                let os = std::slice::from_raw_parts_mut(o, n);
                for ((z, &x), &y) in os.iter_mut().zip(as_).zip(bs) {
                    *z = f(x, y);
                }
            }
            [1, 1, 0] | [1, 0, 1] => {
                let scalar_b = s[2] == 0;
                let (v, src) = if scalar_b { (*b, a) } else { (*a, b) };
                let os = std::slice::from_raw_parts_mut(o, n);
                if oc == src {
                    for x in os {
                        *x = if scalar_b { f(*x, v) } else { f(v, *x) };
                    }
                } else {
                    let ss = std::slice::from_raw_parts(src, n);
                    if scalar_b {
                        for (z, &x) in os.iter_mut().zip(ss) {
                            *z = f(x, v);
                        }
                    } else {
                        for (z, &y) in os.iter_mut().zip(ss) {
                            *z = f(v, y);
                        }
                    }
                }
            }
            _ => {
                for i in 0..n as isize {
                    *o.offset(i * s[0]) = f(*a.offset(i * s[1]), *b.offset(i * s[2]));
                }
            }
        }
    }
}

simd_dispatch!(unsafe fn half_run[F: Fn(f32, f32) -> f32](dt: DType, p: [*mut u8; 3], n: usize, s: [isize; 3], f: F) => half_run_impl[F]);

/// One run of an `f16`/`bf16` kernel: widen blocks of both inputs to `f32`,
/// apply `f`, round once into the output. Each block is fully read before it
/// is written, so in place is fine.
///
/// # Safety
/// `p` must address runs of `n` valid elements of `dt` with strides `s`.
#[inline(always)]
unsafe fn half_run_impl<F: Fn(f32, f32) -> f32>(
    dt: DType,
    p: [*mut u8; 3],
    n: usize,
    s: [isize; 3],
    f: F,
) {
    let mut xa = [0f32; BLOCK];
    let mut xb = [0f32; BLOCK];
    let size = dt.size() as isize;
    let mut done = 0usize;
    while done < n {
        let m = BLOCK.min(n - done);
        let at = |k: usize| p[k].wrapping_offset(done as isize * s[k] * size);
        // SAFETY: the plan hands out runs of `n` valid elements per operand.
        unsafe {
            load_f32(dt, at(1), s[1], &mut xa[..m]);
            load_f32(dt, at(2), s[2], &mut xb[..m]);
            for (x, &y) in xa[..m].iter_mut().zip(&xb[..m]) {
                *x = f(*x, y);
            }
            store_f32(dt, at(0), s[0], &xa[..m]);
        }
        done += m;
    }
}

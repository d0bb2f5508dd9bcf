//! The `f16`/`bf16` matmul path: widen `op(a)` and `op(b)` into `f32`
//! scratch (keeping each source's orientation so the widening reads memory in
//! order), multiply with `gemm` in `f32` with `f32` accumulation, then round
//! `alpha * acc + beta * out` to the output dtype once. A batch entry whose
//! input matrix is the same as the previous one's (broadcast) is not widened
//! again.

use crate::convert::{load_f32, store_f32};
use crate::dtype::DType;
use crate::matmul::Geometry;
use crate::parallel::SyncPtr;
use crate::simd::simd_dispatch;

/// An `f32` copy of one strided matrix, in the orientation of its source.
struct Widened {
    data: Vec<f32>,
    /// (row, column) strides into `data`.
    strides: (isize, isize),
    /// Source address the data was widened from (to skip repeated work).
    source: Option<*const u8>,
}

/// A strided matrix of dtype `dt`: address, rows, columns, element strides.
#[derive(Clone, Copy)]
struct Matrix {
    dt: DType,
    p: *mut u8,
    rows: usize,
    cols: usize,
    strides: (isize, isize),
}

impl Matrix {
    /// Visits the matrix as lines along its denser direction:
    /// `f(line index, line address, element stride, line length)`; returns
    /// whether the lines are rows.
    fn lines(&self, mut f: impl FnMut(usize, *mut u8, isize, usize)) -> bool {
        let (rs, cs) = self.strides;
        let size = self.dt.size() as isize;
        let by_rows = cs.abs() <= rs.abs();
        let (count, len, step, along) = if by_rows {
            (self.rows, self.cols, rs, cs)
        } else {
            (self.cols, self.rows, cs, rs)
        };
        for i in 0..count {
            f(
                i,
                self.p.wrapping_offset(i as isize * step * size),
                along,
                len,
            );
        }
        by_rows
    }
}

simd_dispatch!(unsafe fn widen[](w: &mut Widened, m: Matrix) => widen_impl[]);

/// Widens `m` into `w` unless `w` already holds it.
///
/// # Safety
/// `m` must describe valid memory of its dtype.
#[inline(always)]
unsafe fn widen_impl(w: &mut Widened, m: Matrix) {
    if w.source == Some(m.p as *const u8) {
        return;
    }
    w.data.resize(m.rows * m.cols, 0.0);
    let data = &mut w.data;
    let by_rows = m.lines(|i, line, stride, len| {
        // SAFETY: each line lies inside the caller's matrix; the scratch
        // slice is in bounds because it holds rows * cols values.
        unsafe { load_f32(m.dt, line, stride, &mut data[i * len..(i + 1) * len]) };
    });
    w.strides = if by_rows {
        (m.cols as isize, 1)
    } else {
        (1, m.rows as isize)
    };
    w.source = Some(m.p as *const u8);
}

simd_dispatch!(unsafe fn finish[](acc: &mut [f32], line: &mut Vec<f32>, out: Matrix, beta: f32) => finish_impl[]);

/// `out = round(acc + beta * out)` (`out` not read when `beta == 0`), with
/// `acc` laid out along `out`'s denser direction.
///
/// # Safety
/// `out` must describe valid memory of its dtype.
#[inline(always)]
unsafe fn finish_impl(acc: &mut [f32], line: &mut Vec<f32>, out: Matrix, beta: f32) {
    out.lines(|i, dst, stride, len| {
        let acc_line = &mut acc[i * len..(i + 1) * len];
        // SAFETY: each line lies inside the caller's output matrix.
        unsafe {
            if beta != 0.0 {
                line.resize(len, 0.0);
                load_f32(out.dt, dst, stride, line);
                for (x, &y) in acc_line.iter_mut().zip(line.iter()) {
                    *x += beta * y;
                }
            }
            store_f32(out.dt, dst, stride, acc_line);
        }
    });
}

/// Runs the whole batched half-precision matmul.
///
/// # Safety
/// As for [`crate::matmul`].
pub(crate) unsafe fn run(dt: DType, g: &Geometry, ptrs: [SyncPtr; 3], alpha: f32, beta: f32) {
    let size = dt.size() as isize;
    let (m, n, k) = (g.m, g.n, g.k);
    g.schedule(|first, count, par| {
        let new = || Widened {
            data: Vec::new(),
            strides: (0, 0),
            source: None,
        };
        let (mut wa, mut wb) = (new(), new());
        let mut acc = vec![0f32; m * n];
        let mut line = Vec::new();
        // The accumulator follows the output's orientation.
        let acc_strides = if g.o.1.abs() <= g.o.0.abs() {
            (n as isize, 1)
        } else {
            (1, m as isize)
        };
        for bi in first..first + count {
            let [oo, oa, ob] = g.offsets(bi);
            let at = |i: usize, off: isize| ptrs[i].get().wrapping_offset(off * size);
            let ma = Matrix {
                dt,
                p: at(1, oa),
                rows: m,
                cols: k,
                strides: g.a,
            };
            let mb = Matrix {
                dt,
                p: at(2, ob),
                rows: k,
                cols: n,
                strides: g.b,
            };
            let mo = Matrix {
                dt,
                p: at(0, oo),
                rows: m,
                cols: n,
                strides: g.o,
            };
            // SAFETY: the offsets address matrices inside the caller's views;
            // the scratch buffers hold exactly the sizes gemm is told.
            unsafe {
                widen(&mut wa, ma);
                widen(&mut wb, mb);
                gemm::gemm(
                    m,
                    n,
                    k,
                    acc.as_mut_ptr(),
                    acc_strides.1,
                    acc_strides.0,
                    false,
                    wa.data.as_ptr(),
                    wa.strides.1,
                    wa.strides.0,
                    wb.data.as_ptr(),
                    wb.strides.1,
                    wb.strides.0,
                    0.0,
                    alpha,
                    false,
                    false,
                    false,
                    par,
                );
                finish(&mut acc, &mut line, mo, beta);
            }
        }
    });
}

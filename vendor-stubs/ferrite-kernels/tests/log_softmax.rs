//! `log_softmax` (in place; rows of -inf, +inf, NaN and huge values) and
//! `softmax_backward` for both softmax and log_softmax, against f64
//! references on f32/f16/bf16: scalar, empty, size-1, transposed,
//! padded/flipped and large (threaded) row sets.

mod common;

use common::{FLOATS32, Layout, Tensor, assert_close, eps, rnd};
use ferrite_kernels::{DType, log_softmax, softmax_backward};

fn log_softmax_ref(row: &[f64]) -> Vec<f64> {
    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + row.iter().map(|&x| (x - m).exp()).sum::<f64>().ln();
    row.iter().map(|&x| x - lse).collect()
}

const ROW_SHAPES: [&[i64]; 7] = [&[], &[1], &[5], &[3, 7], &[2, 0], &[2, 3, 10], &[257, 300]];

#[test]
fn log_softmax_rows() {
    for dt in FLOATS32 {
        for shape in ROW_SHAPES {
            let r = shape.len();
            for (li, lo) in [
                (Layout::contiguous(), Layout::contiguous()),
                (Layout::transposed(r), Layout::messy(r)),
            ] {
                let mut x = Tensor::from_fn(dt, shape, &li, |i| rnd(3, i) * 6.0);
                let mut y = Tensor::new(dt, shape, &lo);
                // SAFETY: distinct buffers owned by the test.
                unsafe { log_softmax(&x.view(), &y.view()).unwrap() };
                check_log_softmax(&x, &y, &format!("{dt:?} {shape:?}"));
            }
        }
        // In place, with special rows.
        let (inf, nan) = (f64::INFINITY, f64::NAN);
        let rows = [
            [-inf; 4],
            [1.0, -inf, 2.0, -inf],
            [inf, 1.0, 2.0, 3.0],
            [nan, 1.0, 2.0, 3.0],
            [1e4, 0.0, -1e4, 1e4],
        ];
        let f = |i: usize| rows[i / 4][i % 4];
        let (mut t, x) = (
            Tensor::from_fn(dt, &[5, 4], &Layout::padded(2), f),
            Tensor::from_fn(dt, &[5, 4], &Layout::contiguous(), f),
        );
        let v = t.view();
        // SAFETY: in place, out is exactly the input.
        unsafe { log_softmax(&v, &v).unwrap() };
        check_log_softmax(&x, &t, &format!("{dt:?} special rows in place"));
        assert!(
            (0..4).all(|j| t.get(j).is_nan() && t.get(8 + j).is_nan() && t.get(12 + j).is_nan())
        );
        assert_eq!(t.get(5), -inf);
    }
}

fn check_log_softmax(x: &Tensor, y: &Tensor, ctx: &str) {
    let r = x.shape.len();
    let l = if r == 0 { 1 } else { x.shape[r - 1] as usize };
    let dt = x.dtype;
    for row in 0..x.numel() / l.max(1) {
        let xs: Vec<f64> = (0..l).map(|j| x.get(row * l + j)).collect();
        let m = xs.iter().fold(0f64, |a, v| a.max(v.abs()));
        for (j, w) in log_softmax_ref(&xs).into_iter().enumerate() {
            let abs = 8.0 * eps(DType::F32) * (m + (l as f64).ln() + 1.0);
            assert_close(
                y.get(row * l + j),
                w,
                2.0 * eps(dt) * w.abs() + abs,
                &format!("{ctx} row {row} col {j}"),
            );
        }
    }
}

#[test]
fn softmax_backward_both_forms() {
    for dt in FLOATS32 {
        for shape in ROW_SHAPES {
            let r = shape.len();
            let l = if r == 0 { 1 } else { shape[r - 1] as usize };
            for log in [false, true] {
                for (ly, lg) in [
                    (Layout::contiguous(), Layout::contiguous()),
                    (Layout::messy(r), Layout::transposed(r)),
                ] {
                    // y: a real (log-)softmax output of random logits.
                    let logits: Vec<f64> = (0..shape.iter().product::<i64>() as usize)
                        .map(|i| rnd(4, i) * 3.0)
                        .collect();
                    let yv: Vec<f64> = logits
                        .chunks(l.max(1))
                        .flat_map(|row| {
                            log_softmax_ref(row)
                                .into_iter()
                                .map(|v| if log { v } else { v.exp() })
                        })
                        .collect();
                    let mut y = Tensor::from_fn(dt, shape, &ly, |i| yv[i]);
                    let mut g = Tensor::from_fn(dt, shape, &lg, |i| rnd(5, i));
                    let mut dx = Tensor::new(dt, shape, &ly);
                    // SAFETY: distinct buffers owned by the test.
                    unsafe { softmax_backward(&y.view(), &g.view(), &dx.view(), log).unwrap() };
                    for row in 0..y.numel() / l.max(1) {
                        let ys: Vec<f64> = (0..l).map(|j| y.get(row * l + j)).collect();
                        let gs: Vec<f64> = (0..l).map(|j| g.get(row * l + j)).collect();
                        let (s, mag) = if log {
                            (
                                gs.iter().sum::<f64>(),
                                gs.iter().map(|v| v.abs()).sum::<f64>(),
                            )
                        } else {
                            let s = gs.iter().zip(&ys).map(|(a, b)| a * b).sum::<f64>();
                            (
                                s,
                                gs.iter().zip(&ys).map(|(a, b)| (a * b).abs()).sum::<f64>() + 2.0,
                            )
                        };
                        for j in 0..l {
                            let want = if log {
                                gs[j] - ys[j].exp() * s
                            } else {
                                ys[j] * (gs[j] - s)
                            };
                            let tol = 2.0 * eps(dt) * want.abs()
                                + 4.0 * (l + 1) as f64 * eps(DType::F32) * mag;
                            assert_close(
                                dx.get(row * l + j),
                                want,
                                tol,
                                &format!("{dt:?} {shape:?} log={log} row {row} col {j}"),
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn rejects_bad_arguments() {
    let l = Layout::contiguous();
    let mut x = Tensor::random(DType::F32, &[3, 4], &l, 1);
    let mut y = Tensor::new(DType::F32, &[4, 3], &l);
    let mut h = Tensor::new(DType::F16, &[3, 4], &l);
    let mut d = Tensor::new(DType::F64, &[3, 4], &l);
    // SAFETY: test-owned buffers; every call must fail before touching memory.
    unsafe {
        assert!(log_softmax(&x.view(), &y.view()).is_err(), "shape");
        assert!(log_softmax(&x.view(), &h.view()).is_err(), "dtype");
        let dv = d.view();
        assert!(log_softmax(&dv, &dv).is_err(), "f64 is not required");
        assert!(softmax_backward(&x.view(), &h.view(), &y.view(), true).is_err());
    }
}

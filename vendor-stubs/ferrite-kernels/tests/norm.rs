//! RMSNorm and LayerNorm, forward and backward, against f64 references
//! (the backward references are checked by finite differences): f32, f16
//! and bf16; transposed and padded/flipped rows; strided (flipped)
//! parameters and statistics; H = 0, no rows, size-1 rows, threaded sizes.

mod common;

use common::norm::{norm_row, norm_row_grad, red};
use common::{FLOATS32, Layout, Tensor, assert_close, eps, rnd};
use ferrite_kernels::{DType, layer_norm, layer_norm_backward, rms_norm, rms_norm_backward};

#[test]
fn backward_references_match_finite_differences() {
    let x: Vec<f64> = (0..5).map(|i| rnd(1, i)).collect();
    let w: Vec<f64> = (0..5).map(|i| rnd(2, i)).collect();
    let g: Vec<f64> = (0..5).map(|i| rnd(3, i)).collect();
    for layer in [false, true] {
        let zeros = [0.0; 5];
        let loss = |x: &[f64], w: &[f64]| {
            let (y, _) = norm_row(x, w, layer.then_some(&zeros[..]), 1e-3);
            y.iter().zip(&g).map(|(a, b)| a * b).sum::<f64>()
        };
        let (dx, dw, _) = norm_row_grad(&x, &w, &g, layer, 1e-3);
        for e in 0..5 {
            let (mut xp, mut xm, mut wp, mut wm) = (x.clone(), x.clone(), w.clone(), w.clone());
            xp[e] += 1e-6;
            xm[e] -= 1e-6;
            wp[e] += 1e-6;
            wm[e] -= 1e-6;
            let fx = (loss(&xp, &w) - loss(&xm, &w)) / 2e-6;
            let fw = (loss(&x, &wp) - loss(&x, &wm)) / 2e-6;
            assert!(
                (fx - dx[e]).abs() < 1e-7 && (fw - dw[e]).abs() < 1e-7,
                "layer={layer} elem {e}"
            );
        }
    }
}

const SHAPES: [&[i64]; 7] = [
    &[1],
    &[5],
    &[3, 7],
    &[2, 3, 16],
    &[4, 0],
    &[0, 8],
    &[300, 257],
];

fn stats_layout() -> Layout {
    Layout::padded(1)
}

/// Runs one norm forward and backward on `shape` and checks everything.
fn run(layer: bool, dt: DType, shape: &[i64], li: &Layout, lo: &Layout) {
    let r = shape.len();
    let (hh, lead) = (shape[r - 1], &shape[..r - 1]);
    let h = hh as usize;
    let rows = lead.iter().product::<i64>() as usize;
    let ctx = format!("layer={layer} {dt:?} {shape:?} {li:?}");
    let mut x = Tensor::from_fn(dt, shape, li, |i| rnd(4, i) * 2.0 + 0.5);
    let mut w = Tensor::from_fn(dt, &[hh], &Layout::flipped(&[0]), |i| 1.0 + rnd(5, i) / 4.0);
    let mut b = Tensor::from_fn(dt, &[hh], &Layout::contiguous(), |i| rnd(6, i));
    let mut y = Tensor::new(dt, shape, lo);
    let mut s0 = Tensor::new(DType::F32, lead, &stats_layout());
    let mut s1 = Tensor::new(DType::F32, lead, &Layout::contiguous());
    // SAFETY: distinct buffers owned by the test.
    unsafe {
        if layer {
            layer_norm(
                &x.view(),
                &w.view(),
                &b.view(),
                &y.view(),
                &s0.view(),
                &s1.view(),
                1e-5,
            )
            .unwrap();
        } else {
            rms_norm(&x.view(), &w.view(), &y.view(), &s0.view(), 1e-5).unwrap();
        }
    }
    let (u, wv, bv) = (eps(dt), common::values(&w), common::values(&b));
    let mut g = Tensor::from_fn(dt, shape, lo, |i| rnd(7, i));
    let (mut dx, mut dw, mut db) = (
        Tensor::new(dt, shape, li),
        Tensor::new(dt, &[hh], &Layout::contiguous()),
        Tensor::new(dt, &[hh], &Layout::flipped(&[0])),
    );
    // SAFETY: distinct buffers owned by the test.
    unsafe {
        if layer {
            layer_norm_backward(
                &g.view(),
                &x.view(),
                &w.view(),
                &s0.view(),
                &s1.view(),
                &dx.view(),
                &dw.view(),
                &db.view(),
            )
            .unwrap();
        } else {
            rms_norm_backward(
                &g.view(),
                &x.view(),
                &w.view(),
                &s0.view(),
                &dx.view(),
                &dw.view(),
            )
            .unwrap();
        }
    }
    let (mut dw_want, mut db_want, mut dw_mag) = (vec![0.0; h], vec![0.0; h], vec![0.0; h]);
    for row in 0..rows {
        let xs: Vec<f64> = (0..h).map(|j| x.get(row * h + j)).collect();
        let gs: Vec<f64> = (0..h).map(|j| g.get(row * h + j)).collect();
        let (want, st) = norm_row(&xs, &wv, layer.then_some(&bv[..]), 1e-5);
        for j in 0..h {
            let tol = (2.0 * u + red(h)) * want[j].abs() + red(h) * (xs[j].abs() * 2.0 + 1.0);
            assert_close(
                y.get(row * h + j),
                want[j],
                tol,
                &format!("y {ctx} row {row} col {j}"),
            );
        }
        if layer {
            assert_close(
                s0.get(row),
                st[0],
                red(h) * 2.0,
                &format!("mean {ctx} row {row}"),
            );
            assert_close(
                s1.get(row),
                st[1],
                red(h) * st[1] * 4.0,
                &format!("rstd {ctx} row {row}"),
            );
        } else {
            assert_close(
                s0.get(row),
                st[0],
                red(h) * st[0],
                &format!("inv_rms {ctx} row {row}"),
            );
        }
        let (dxw, dwr, sc) = norm_row_grad(&xs, &wv, &gs, layer, 1e-5);
        for j in 0..h {
            let tol = 2.0 * u * dxw[j].abs() + 4.0 * red(h) * sc[j];
            assert_close(
                dx.get(row * h + j),
                dxw[j],
                tol,
                &format!("dx {ctx} row {row} col {j}"),
            );
            dw_want[j] += dwr[j];
            db_want[j] += gs[j];
            dw_mag[j] += dwr[j].abs() + gs[j].abs();
        }
    }
    for j in 0..h {
        let allow = |w: f64| 2.0 * u * w.abs() + (rows as f64 + 8.0) * eps(DType::F32) * dw_mag[j];
        assert_close(
            dw.get(j),
            dw_want[j],
            allow(dw_want[j]),
            &format!("dw {ctx} col {j}"),
        );
        if layer {
            assert_close(
                db.get(j),
                db_want[j],
                allow(db_want[j]),
                &format!("db {ctx} col {j}"),
            );
        }
    }
}

#[test]
fn rms_and_layer_norm_forward_backward() {
    for dt in FLOATS32 {
        for shape in SHAPES {
            let r = shape.len();
            for (li, lo) in [
                (Layout::contiguous(), Layout::contiguous()),
                (Layout::transposed(r), Layout::messy(r)),
                (Layout::messy(r), Layout::padded(2)),
            ] {
                run(false, dt, shape, &li, &lo);
                run(true, dt, shape, &li, &lo);
            }
        }
    }
}

#[test]
fn rejects_bad_arguments() {
    let l = Layout::contiguous();
    let mut x = Tensor::random(DType::F32, &[3, 4], &l, 1);
    let mut w3 = Tensor::random(DType::F32, &[3], &l, 2);
    let mut w4 = Tensor::random(DType::F32, &[4], &l, 2);
    let mut y = Tensor::new(DType::F32, &[3, 4], &l);
    let mut s3 = Tensor::new(DType::F32, &[3], &l);
    let mut s16 = Tensor::new(DType::F16, &[3], &l);
    let mut s3b = Tensor::new(DType::F32, &[3], &l);
    let (xv, yv) = (x.view(), y.view());
    // SAFETY: test-owned buffers; every call must fail before touching memory.
    unsafe {
        let r = rms_norm(&xv, &w3.view(), &yv, &s3.view(), 1e-5);
        assert!(r.is_err(), "weight must be [H]");
        let r = rms_norm(&xv, &w4.view(), &yv, &s16.view(), 1e-5);
        assert!(r.is_err(), "statistics must be f32");
        let r = layer_norm(
            &xv,
            &w4.view(),
            &w3.view(),
            &yv,
            &s3.view(),
            &s3b.view(),
            1e-5,
        );
        assert!(r.is_err(), "bias must be [H]");
    }
}

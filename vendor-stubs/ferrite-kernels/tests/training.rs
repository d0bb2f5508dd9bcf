//! The loss and optimizer of a training step against f64 references:
//! `cross_entropy` and its backward (ignored rows, ignore_index inside the
//! class range, every row ignored giving NaN and zero gradients, target
//! errors, strided logits) and `adamw` (several steps against the formula,
//! strided moments, step < 1 refused), on f32/f16/bf16.

mod common;

use common::{FLOATS32, Layout, Tensor, assert_close, eps, rnd, tiny, values};
use ferrite_kernels::{DType, adamw, cross_entropy, cross_entropy_backward};

/// Reference loss and per-row probabilities.
fn ce_ref(x: &Tensor, t: &[i64], ignore: i64) -> (f64, Vec<Vec<f64>>, usize) {
    let (n, c) = (x.shape[0] as usize, x.shape[1] as usize);
    let (mut total, mut count, mut probs) = (0.0, 0, Vec::new());
    for r in 0..n {
        let row: Vec<f64> = (0..c).map(|j| x.get(r * c + j)).collect();
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        probs.push(row.iter().map(|v| (v - lse).exp()).collect());
        if t[r] != ignore {
            total += lse - row[t[r] as usize];
            count += 1;
        }
    }
    (total / count as f64, probs, count)
}

#[test]
fn cross_entropy_forward_backward() {
    for dt in FLOATS32 {
        for (n, c, ignore) in [
            (1, 1, -100),
            (6, 5, -100),
            (6, 5, 2),
            (4, 3, 0),
            (0, 4, -100),
            (300, 513, -100),
        ] {
            for tdt in [DType::I32, DType::I64] {
                let tv: Vec<i64> = (0..n)
                    .map(|i| {
                        if i % 4 == 3 {
                            ignore
                        } else {
                            ((i * 7) % c) as i64
                        }
                    })
                    .collect();
                let mut t =
                    Tensor::from_fn(tdt, &[n as i64], &Layout::flipped(&[0]), |i| tv[i] as f64);
                for lx in [
                    Layout::contiguous(),
                    Layout::transposed(2),
                    Layout::messy(2),
                ] {
                    let mut x =
                        Tensor::from_fn(dt, &[n as i64, c as i64], &lx, |i| rnd(7, i) * 4.0);
                    let mut loss = Tensor::new(DType::F32, &[], &Layout::contiguous());
                    let mut dx = Tensor::new(dt, &[n as i64, c as i64], &Layout::padded(1));
                    dx.fill_storage(f64::NAN);
                    // SAFETY: distinct buffers owned by the test.
                    unsafe {
                        cross_entropy(&x.view(), &t.view(), &loss.view(), ignore).unwrap();
                        cross_entropy_backward(&x.view(), &t.view(), &dx.view(), 0.7, ignore)
                            .unwrap();
                    }
                    let (want, probs, count) = ce_ref(&x, &tv, ignore);
                    let ctx = format!("{dt:?} {tdt:?} n={n} c={c} ignore={ignore}");
                    let red = (c as f64 / 8.0 + 8.0) * eps(DType::F32);
                    // lse and the target logit are at most about 2 * 8 in magnitude.
                    assert_close(loss.get(0), want, 4.0 * red * 17.0, &format!("loss {ctx}"));
                    for r in 0..n {
                        for (j, &p) in probs[r].iter().enumerate() {
                            let w = match tv[r] == ignore {
                                true => 0.0,
                                false => 0.7 * (p - f64::from(tv[r] == j as i64)) / count as f64,
                            };
                            let tol = 2.0 * eps(dt) * w.abs()
                                + 4.0 * red * 0.7 / count.max(1) as f64
                                + tiny(dt);
                            assert_close(dx.get(r * c + j), w, tol, &format!("grad {ctx} {r} {j}"));
                        }
                    }
                }
            }
        }
        // Every row ignored: NaN loss, zero gradient. A bad target: error.
        let mut x = Tensor::random(dt, &[3, 4], &Layout::contiguous(), 8);
        let mut t = Tensor::from_fn(DType::I64, &[3], &Layout::contiguous(), |_| -100.0);
        let mut bad = Tensor::from_fn(DType::I64, &[3], &Layout::contiguous(), |i| {
            [0.0, 4.0, 1.0][i]
        });
        let mut loss = Tensor::new(DType::F32, &[], &Layout::contiguous());
        let mut dx = Tensor::new(dt, &[3, 4], &Layout::contiguous());
        dx.fill_storage(5.0);
        // SAFETY: distinct buffers owned by the test.
        unsafe {
            cross_entropy(&x.view(), &t.view(), &loss.view(), -100).unwrap();
            assert!(loss.get(0).is_nan());
            cross_entropy_backward(&x.view(), &t.view(), &dx.view(), 1.0, -100).unwrap();
            assert!(values(&dx).iter().all(|&v| v == 0.0));
            assert!(cross_entropy(&x.view(), &bad.view(), &loss.view(), -100).is_err());
            assert!(cross_entropy_backward(&x.view(), &bad.view(), &dx.view(), 1.0, -100).is_err());
        }
    }
}

#[test]
fn adamw_matches_formula() {
    let (lr, b1, b2, eps_, wd) = (1e-2, 0.9, 0.999, 1e-8, 0.1);
    for dt in FLOATS32 {
        for shape in [vec![0i64], vec![1], vec![7, 5], vec![300, 300]] {
            let r = shape.len();
            let mut p = Tensor::from_fn(dt, &shape, &Layout::messy(r), |i| rnd(9, i));
            let mut m = Tensor::from_fn(DType::F32, &shape, &Layout::padded(1), |i| {
                rnd(10, i) / 10.0
            });
            let mut v = Tensor::from_fn(DType::F32, &shape, &Layout::contiguous(), |i| {
                rnd(11, i).abs() / 10.0
            });
            for step in [1i64, 2, 10] {
                let mut g = Tensor::from_fn(dt, &shape, &Layout::transposed(r), |i| {
                    rnd(12 + step as u64, i)
                });
                let (p0, m0, v0, gv) = (values(&p), values(&m), values(&v), values(&g));
                // SAFETY: distinct buffers owned by the test.
                unsafe {
                    adamw(
                        &p.view(),
                        &g.view(),
                        &m.view(),
                        &v.view(),
                        lr,
                        b1,
                        b2,
                        eps_,
                        wd,
                        step,
                    )
                    .unwrap()
                };
                let (bc1, bc2) = (1.0 - b1.powi(step as i32), 1.0 - b2.powi(step as i32));
                for i in 0..p0.len() {
                    let mw = b1 * m0[i] + (1.0 - b1) * gv[i];
                    let vw = b2 * v0[i] + (1.0 - b2) * gv[i] * gv[i];
                    let upd = lr * (mw / bc1) / ((vw / bc2).sqrt() + eps_);
                    let pw = p0[i] - lr * wd * p0[i] - upd;
                    let u32_ = eps(DType::F32);
                    let ctx = format!("{dt:?} {shape:?} step {step} elem {i}");
                    assert_close(
                        m.get(i),
                        mw,
                        4.0 * u32_ * (m0[i].abs() + gv[i].abs()),
                        &format!("m {ctx}"),
                    );
                    assert_close(
                        v.get(i),
                        vw,
                        4.0 * u32_ * (v0[i] + gv[i] * gv[i]),
                        &format!("v {ctx}"),
                    );
                    // The update inherits m's rounding (m may cancel).
                    let m_mag = b1 * m0[i].abs() + (1.0 - b1) * gv[i].abs();
                    let upd_mag = lr * (m_mag / bc1) / ((vw / bc2).sqrt() + eps_);
                    let tol =
                        2.0 * eps(dt) * pw.abs() + 8.0 * u32_ * (p0[i].abs() + upd_mag) + tiny(dt);
                    assert_close(p.get(i), pw, tol, &ctx);
                }
            }
            let mut g = Tensor::new(dt, &shape, &Layout::contiguous());
            // SAFETY: test-owned buffers; must fail before touching memory.
            unsafe {
                assert!(
                    adamw(
                        &p.view(),
                        &g.view(),
                        &m.view(),
                        &v.view(),
                        lr,
                        b1,
                        b2,
                        eps_,
                        wd,
                        0
                    )
                    .is_err()
                )
            };
        }
    }
}

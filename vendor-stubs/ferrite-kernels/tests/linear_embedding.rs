//! `linear` (1-d, 2-d and batched inputs; leading strides that fold and
//! that do not; transposed weights; with and without bias; empty extents;
//! a threaded size) and `embedding` with its accumulating backward
//! (repeated indices add up, i32/i64 indices of any shape, index errors
//! leave the outputs untouched), against f64 references on f32/f16/bf16.

mod common;

use common::{FLOATS32, Layout, Tensor, assert_close, eps, rnd, tiny, values};
use ferrite_kernels::{DType, embedding, embedding_backward, linear};

#[test]
fn linear_matches_reference() {
    let cases: [(&[i64], i64); 8] = [
        (&[5], 3),
        (&[4, 6], 7),
        (&[2, 3, 8], 5),
        (&[3, 0], 4),
        (&[0, 5], 2),
        (&[2, 4], 0),
        (&[1, 1, 1], 1),
        (&[64, 128], 256),
    ];
    for dt in FLOATS32 {
        for (ishape, n) in cases {
            let r = ishape.len();
            let kk = ishape[r - 1];
            let mut oshape = ishape.to_vec();
            oshape[r - 1] = n;
            // Storage [S, B, K] for 3-d inputs: the leading dims do not fold.
            let unfold = Layout {
                order: Some(if r == 3 {
                    vec![1, 0, 2]
                } else {
                    (0..r).collect()
                }),
                ..Layout::default()
            };
            for (li, lw, lo) in [
                (
                    Layout::contiguous(),
                    Layout::contiguous(),
                    Layout::contiguous(),
                ),
                (unfold, Layout::transposed(2), Layout::padded(2)),
                (Layout::messy(r), Layout::messy(2), Layout::flipped(&[0])),
            ] {
                for with_bias in [false, true] {
                    let mut x = Tensor::from_fn(dt, ishape, &li, |i| rnd(1, i));
                    let mut w = Tensor::from_fn(dt, &[n, kk], &lw, |i| rnd(2, i));
                    let mut b = Tensor::from_fn(dt, &[n], &Layout::flipped(&[0]), |i| rnd(3, i));
                    let mut out = Tensor::new(dt, &oshape, &lo);
                    out.fill_storage(f64::NAN);
                    let bv = b.view();
                    // SAFETY: distinct buffers owned by the test.
                    unsafe {
                        linear(&x.view(), &w.view(), with_bias.then_some(&bv), &out.view()).unwrap()
                    };
                    let (m, k, n) = (x.numel() / kk.max(1) as usize, kk as usize, n as usize);
                    for i in 0..m * n {
                        let (row, col) = (i / n.max(1), i % n.max(1));
                        let terms: Vec<f64> = (0..k)
                            .map(|p| x.get(row * k + p) * w.at(&[col, p]))
                            .collect();
                        let bias = if with_bias { b.get(col) } else { 0.0 };
                        let want = terms.iter().sum::<f64>() + bias;
                        let mag = terms.iter().map(|t| t.abs()).sum::<f64>() + bias.abs();
                        let tol =
                            2.0 * eps(dt) * want.abs() + (k as f64 + 8.0) * eps(DType::F32) * mag;
                        assert_close(
                            out.get(i),
                            want,
                            tol,
                            &format!("{dt:?} {ishape:?} n={n} bias={with_bias} {i}"),
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn embedding_forward_and_accumulating_backward() {
    for dt in FLOATS32 {
        for idt in [DType::I32, DType::I64] {
            let ishapes: [&[i64]; 4] = [&[], &[0], &[2, 3], &[5000]];
            for ishape in ishapes {
                let (v, h) = (
                    if ishape == [5000] { 100 } else { 7 },
                    if ishape == [5000] { 64 } else { 5 },
                );
                let li = Layout::flipped(if ishape.is_empty() { &[] } else { &[0] });
                let mut idx = Tensor::from_fn(idt, ishape, &li, |i| ((i * 5 + i / 3) % v) as f64);
                let mut oshape = ishape.to_vec();
                oshape.push(h as i64);
                let mut w =
                    Tensor::from_fn(dt, &[v as i64, h as i64], &Layout::transposed(2), |i| {
                        rnd(4, i)
                    });
                let mut out = Tensor::new(dt, &oshape, &Layout::messy(oshape.len()));
                // SAFETY: distinct buffers owned by the test.
                unsafe { embedding(&w.view(), &idx.view(), &out.view()).unwrap() };
                for i in 0..out.numel() {
                    let (row, col) = (i / h, i % h);
                    assert_eq!(
                        out.get(i),
                        w.at(&[idx.get(row) as usize, col]),
                        "{dt:?} {idt:?} {ishape:?} {i}"
                    );
                }
                let mut g = Tensor::from_fn(dt, &oshape, &Layout::contiguous(), |i| rnd(5, i));
                let mut gw =
                    Tensor::from_fn(dt, &[v as i64, h as i64], &Layout::padded(1), |i| rnd(6, i));
                let before = values(&gw);
                // SAFETY: distinct buffers owned by the test.
                unsafe { embedding_backward(&g.view(), &idx.view(), &gw.view()).unwrap() };
                let (mut want, mut mag) = (
                    before.clone(),
                    before.iter().map(|x| x.abs()).collect::<Vec<_>>(),
                );
                let mut count = vec![0usize; v];
                for row in 0..idx.numel() {
                    let t = idx.get(row) as usize;
                    count[t] += 1;
                    for c in 0..h {
                        want[t * h + c] += g.get(row * h + c);
                        mag[t * h + c] += g.get(row * h + c).abs();
                    }
                }
                for i in 0..want.len() {
                    let tol = 2.0 * eps(dt) * want[i].abs()
                        + (count[i / h] as f64 + 2.0) * eps(DType::F32) * mag[i]
                        + tiny(dt);
                    assert_close(
                        gw.get(i),
                        want[i],
                        tol,
                        &format!("grad {dt:?} {idt:?} {ishape:?} {i}"),
                    );
                }
            }
            // Out of range: an error, and nothing written.
            for bad in [-1.0, 7.0] {
                let mut idx = Tensor::from_fn(idt, &[3], &Layout::contiguous(), |i| {
                    if i == 2 { bad } else { 1.0 }
                });
                let mut w = Tensor::random(dt, &[7, 2], &Layout::contiguous(), 1);
                let mut out = Tensor::new(dt, &[3, 2], &Layout::contiguous());
                out.fill_storage(9.0);
                let mut gw = Tensor::new(dt, &[7, 2], &Layout::contiguous());
                // SAFETY: test-owned buffers.
                unsafe {
                    assert!(embedding(&w.view(), &idx.view(), &out.view()).is_err());
                    assert!(embedding_backward(&out.view(), &idx.view(), &gw.view()).is_err());
                }
                assert!(
                    values(&out).iter().all(|&x| x == 9.0) && values(&gw).iter().all(|&x| x == 0.0)
                );
            }
        }
    }
}

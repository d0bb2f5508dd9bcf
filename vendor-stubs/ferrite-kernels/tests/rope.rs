//! Rotary embeddings against an f64 reference: f32/f16/bf16, both pair
//! layouts (interleaved and half-split), forward and backward, strided
//! (transposed [B, H, S, D] storage) inputs and padded/flipped outputs,
//! strided cos/sin tables, D = 0 and empty batches, a threaded size; in
//! place, backward after forward gives the input back.

mod common;

use common::{FLOATS32, Layout, Tensor, assert_close, eps, rnd};
use ferrite_kernels::{DType, rope};

/// cos/sin tables `[seq, half]` of the usual rotary frequencies.
fn tables(seq: i64, half: i64) -> (Tensor, Tensor) {
    let angle = |i: usize| {
        let (s, j) = (i as i64 / half.max(1), i as i64 % half.max(1));
        s as f64 * 10000f64.powf(-(j as f64) / half.max(1) as f64)
    };
    let c = Tensor::from_fn(DType::F32, &[seq, half], &Layout::padded(3), |i| {
        angle(i).cos()
    });
    let s = Tensor::from_fn(DType::F32, &[seq, half], &Layout::transposed(2), |i| {
        angle(i).sin()
    });
    (c, s)
}

#[test]
fn rope_layouts_in_place_and_inverse() {
    let shapes: [[i64; 4]; 5] = [
        [2, 5, 3, 8],
        [1, 1, 1, 2],
        [1, 3, 2, 0],
        [0, 4, 2, 6],
        [2, 70, 8, 64],
    ];
    for dt in FLOATS32 {
        for shape in shapes {
            let (seq, d) = (shape[1], shape[3]);
            let half = (d / 2) as usize;
            let (mut c, mut s) = (tables(seq, d / 2).0, tables(seq, d / 2).1);
            let bshd = Layout {
                order: Some(vec![0, 2, 1, 3]),
                ..Layout::default()
            };
            for interleaved in [false, true] {
                for backward in [false, true] {
                    let mut x = Tensor::from_fn(dt, &shape, &bshd, |i| rnd(8, i));
                    let mut y = Tensor::new(dt, &shape, &Layout::messy(4));
                    // SAFETY: distinct buffers owned by the test.
                    unsafe {
                        rope(
                            &x.view(),
                            &c.view(),
                            &s.view(),
                            &y.view(),
                            interleaved,
                            backward,
                        )
                        .unwrap()
                    };
                    let sign = if backward { -1.0 } else { 1.0 };
                    for i in 0..x.numel() / d.max(1) as usize {
                        let pos = (i / shape[2] as usize) % seq as usize;
                        for j in 0..half {
                            let (ia, ib) = if interleaved {
                                (2 * j, 2 * j + 1)
                            } else {
                                (j, j + half)
                            };
                            let base = i * d as usize;
                            let (a, b) = (x.get(base + ia), x.get(base + ib));
                            let (cv, sv) = (c.at(&[pos, j]), sign * s.at(&[pos, j]));
                            let (wa, wb) = (a * cv - b * sv, a * sv + b * cv);
                            let abs =
                                4.0 * eps(DType::F32) * (a.abs() + b.abs()) + common::tiny(dt);
                            let ctx = format!(
                                "{dt:?} {shape:?} il={interleaved} bw={backward} head {i} pair {j}"
                            );
                            assert_close(
                                y.get(base + ia),
                                wa,
                                2.0 * eps(dt) * wa.abs() + abs,
                                &ctx,
                            );
                            assert_close(
                                y.get(base + ib),
                                wb,
                                2.0 * eps(dt) * wb.abs() + abs,
                                &ctx,
                            );
                        }
                    }
                }
                // Forward then backward, in place, gives the input back.
                let mut t = Tensor::from_fn(dt, &shape, &Layout::padded(1), |i| rnd(9, i));
                let orig = common::values(&t);
                let v = t.view();
                // SAFETY: in place, out is exactly the input.
                unsafe {
                    rope(&v, &c.view(), &s.view(), &v, interleaved, false).unwrap();
                    rope(&v, &c.view(), &s.view(), &v, interleaved, true).unwrap();
                }
                for (i, &o) in orig.iter().enumerate() {
                    assert_close(
                        t.get(i),
                        o,
                        8.0 * eps(dt) * 2.0 + 1e-6,
                        &format!("{dt:?} {shape:?} inverse {i}"),
                    );
                }
            }
        }
    }
}

#[test]
fn rejects_bad_arguments() {
    let l = Layout::contiguous();
    let (mut c, mut s) = tables(3, 2);
    let mut odd = Tensor::random(DType::F32, &[1, 3, 1, 3], &l, 3);
    let mut x = Tensor::random(DType::F32, &[1, 3, 1, 4], &l, 3);
    let mut short = tables(2, 2).0;
    let (cv, sv) = (c.view(), s.view());
    // SAFETY: test-owned buffers; every call must fail before touching memory.
    unsafe {
        let ov = odd.view();
        assert!(rope(&ov, &cv, &sv, &ov, false, false).is_err(), "odd D");
        let xv = x.view();
        assert!(
            rope(&xv, &short.view(), &sv, &xv, true, false).is_err(),
            "table rows"
        );
    }
}

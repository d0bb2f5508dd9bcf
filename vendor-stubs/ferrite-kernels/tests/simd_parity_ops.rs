//! The AVX2 builds of the ABI 1.1 kernels must give bit-identical results
//! to the baseline builds (no implicit FMA, same lane order in every
//! reduction). Runs each dispatched kernel both ways on awkward data and
//! compares the bits of every output.

mod common;

use common::parity::{awkward, both_ways_all};
use common::{FLOATS32, Layout, Tensor, rnd};
use ferrite_kernels::*;

#[test]
fn simd_and_baseline_agree_bit_for_bit() {
    let shape = [37i64, 129];
    let l = Layout::contiguous();
    for dt in FLOATS32 {
        for (k, layout) in [Layout::contiguous(), Layout::messy(2)].iter().enumerate() {
            let x = || awkward(dt, &shape, layout, 1);
            let y = |seed| awkward(dt, &shape, &l, seed);
            let new = || Tensor::new(dt, &shape, layout);
            let stat = || Tensor::new(DType::F32, &shape[..1], &l);
            let ctx = format!("{dt:?} #{k}");
            let ops = [
                UnaryOp::Exp,
                UnaryOp::Log,
                UnaryOp::Rsqrt,
                UnaryOp::Tanh,
                UnaryOp::Silu,
                UnaryOp::Gelu,
                UnaryOp::GeluErf,
            ];
            for op in ops {
                both_ways_all(&format!("unary {op:?} {ctx}"), || {
                    let (mut a, mut o) = (x(), new());
                    // SAFETY: distinct buffers owned by the test.
                    unsafe { unary(op, &a.view(), &o.view()).unwrap() };
                    vec![o]
                });
            }
            for op in [
                ActivationOp::Silu,
                ActivationOp::Gelu,
                ActivationOp::GeluErf,
            ] {
                both_ways_all(&format!("activation_backward {op:?} {ctx}"), || {
                    let (mut g, mut a, mut o) = (y(2), x(), new());
                    // SAFETY: distinct buffers owned by the test.
                    unsafe { activation_backward(op, &g.view(), &a.view(), &o.view()).unwrap() };
                    vec![o]
                });
            }
            both_ways_all(&format!("swiglu_backward {ctx}"), || {
                let (mut g, mut u, mut go, mut dg, mut du) = (x(), y(3), y(4), new(), new());
                // SAFETY: distinct buffers owned by the test.
                unsafe {
                    swiglu_backward(&g.view(), &u.view(), &go.view(), &dg.view(), &du.view())
                        .unwrap()
                };
                vec![dg, du]
            });
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Argmax] {
                for dim in [0, 1] {
                    both_ways_all(&format!("reduce {op:?} dim {dim} {ctx}"), || {
                        let odt = if op == ReduceOp::Argmax {
                            DType::I64
                        } else {
                            dt
                        };
                        let (mut a, mut o) = (x(), Tensor::new(odt, &[shape[1 - dim]], &l));
                        // SAFETY: distinct buffers owned by the test.
                        unsafe { reduce(op, &a.view(), &o.view(), dim, false).unwrap() };
                        vec![o]
                    });
                }
            }
            both_ways_all(&format!("sum_squares {ctx}"), || {
                let (mut a, mut o) = (y(5), Tensor::new(DType::F32, &[], &l));
                // SAFETY: distinct buffers owned by the test.
                unsafe { sum_squares(&a.view(), &o.view()).unwrap() };
                vec![o]
            });
            for log in [false, true] {
                both_ways_all(&format!("log_softmax + backward log={log} {ctx}"), || {
                    let (mut a, mut o, mut g, mut d) = (x(), new(), y(6), new());
                    // SAFETY: distinct buffers owned by the test.
                    unsafe {
                        log_softmax(&a.view(), &o.view()).unwrap();
                        softmax_backward(&o.view(), &g.view(), &d.view(), log).unwrap();
                    }
                    vec![o, d]
                });
            }
            both_ways_all(&format!("norms {ctx}"), || {
                let w = |seed| Tensor::from_fn(dt, &shape[1..], &l, move |i| rnd(seed, i));
                let (mut a, mut w1, mut b1, mut g) = (y(7), w(8), w(9), y(10));
                let (mut o1, mut o2, mut s1, mut s2, mut s3) =
                    (new(), new(), stat(), stat(), stat());
                let (mut dx, mut dw, mut db) = (new(), w(0), w(0));
                // SAFETY: distinct buffers owned by the test.
                unsafe {
                    let (av, wv, gv) = (a.view(), w1.view(), g.view());
                    rms_norm(&av, &wv, &o1.view(), &s1.view(), 1e-5).unwrap();
                    layer_norm(
                        &av,
                        &wv,
                        &b1.view(),
                        &o2.view(),
                        &s2.view(),
                        &s3.view(),
                        1e-5,
                    )
                    .unwrap();
                    layer_norm_backward(
                        &gv,
                        &av,
                        &wv,
                        &s2.view(),
                        &s3.view(),
                        &dx.view(),
                        &dw.view(),
                        &db.view(),
                    )
                    .unwrap();
                }
                vec![o1, o2, s1, s2, s3, dx, dw, db]
            });
            both_ways_all(&format!("cross_entropy {ctx}"), || {
                let t = Tensor::from_fn(DType::I64, &shape[..1], &l, |i| ((i * 7) % 129) as f64);
                let (mut a, mut t, mut loss, mut d) =
                    (y(11), t, Tensor::new(DType::F32, &[], &l), new());
                // SAFETY: distinct buffers owned by the test.
                unsafe {
                    cross_entropy(&a.view(), &t.view(), &loss.view(), -100).unwrap();
                    cross_entropy_backward(&a.view(), &t.view(), &d.view(), 1.0, -100).unwrap();
                }
                vec![loss, d]
            });
            both_ways_all(&format!("adamw {ctx}"), || {
                let f32t = |seed: u64| {
                    Tensor::from_fn(DType::F32, &shape, &l, move |i| rnd(seed, i).abs())
                };
                let (mut p, mut g, mut m, mut v) = (y(12), y(13), f32t(14), f32t(15));
                // SAFETY: distinct buffers owned by the test.
                unsafe {
                    adamw(
                        &p.view(),
                        &g.view(),
                        &m.view(),
                        &v.view(),
                        1e-3,
                        0.9,
                        0.99,
                        1e-8,
                        0.1,
                        3,
                    )
                    .unwrap()
                };
                vec![p, m, v]
            });
            both_ways_all(&format!("attention {ctx}"), || {
                let qs = [1i64, 2, 37, 16];
                let t = |seed| Tensor::from_fn(dt, &qs, &l, move |i| rnd(seed, i));
                let (mut q, mut k, mut v, mut o) = (t(16), t(17), t(18), Tensor::new(dt, &qs, &l));
                let mut lse = Tensor::new(DType::F32, &qs[..3], &l);
                // SAFETY: distinct buffers owned by the test.
                unsafe {
                    attention(
                        &q.view(),
                        &k.view(),
                        &v.view(),
                        &o.view(),
                        &lse.view(),
                        0.25,
                        true,
                    )
                    .unwrap()
                };
                vec![o, lse]
            });
        }
    }
}

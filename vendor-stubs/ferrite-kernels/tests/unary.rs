//! Pointwise math of ABI 1.1 against f64 references: `unary` (every op),
//! `pow_scalar` and `scale`, for f32/f16/bf16, on empty, scalar, size-1,
//! transposed, padded/flipped and large (threaded) shapes, in place, with
//! IEEE special values (log(0), sqrt(-0), rsqrt(0), overflow, NaN, inf).

mod common;

use common::pointwise::{OPS, SHAPES, close, close_c, cond, layouts, to_dt, unary_ref};
use common::{FLOATS32, Layout, Tensor, rnd};
use ferrite_kernels::{DType, UnaryOp, pow_scalar, scale, swiglu, unary};

#[test]
fn unary_ops_all_shapes_and_layouts() {
    for dt in FLOATS32 {
        for shape in SHAPES {
            for (li, lo) in layouts(shape.len())
                .iter()
                .zip(layouts(shape.len()).iter().rev())
            {
                let mut x = Tensor::from_fn(dt, shape, li, |i| rnd(1, i) * 3.0);
                for op in OPS {
                    let mut out = Tensor::new(dt, shape, lo);
                    out.fill_storage(7.0);
                    // SAFETY: distinct buffers owned by the test.
                    unsafe { unary(op, &x.view(), &out.view()).unwrap() };
                    for i in 0..x.numel() {
                        let (xi, ctx) = (x.get(i), format!("{op:?} {dt:?} {shape:?} {i}"));
                        close_c(dt, out.get(i), unary_ref(op, xi), 0.0, cond(op, xi), &ctx);
                    }
                    for p in out.padding_positions() {
                        assert_eq!(out.get_raw(p), 7.0);
                    }
                }
            }
        }
    }
}

#[test]
fn unary_special_values_and_in_place() {
    let inf = f64::INFINITY;
    let specials = [
        0.0,
        -0.0,
        inf,
        -inf,
        f64::NAN,
        1.0,
        -1.0,
        100.0,
        -100.0,
        1e-3,
        -20.0,
        9.5,
    ];
    for dt in FLOATS32 {
        for op in OPS {
            let f = |i: usize| specials[i % specials.len()];
            let mut t = Tensor::from_fn(dt, &[2, 12], &Layout::padded(1), f);
            let v = t.view();
            // SAFETY: in place: out is exactly the input.
            unsafe { unary(op, &v, &v).unwrap() };
            for i in 0..24 {
                let x = to_dt(dt, f(i));
                let ctx = format!("{op:?} {dt:?} x={x}");
                close_c(dt, t.get(i), unary_ref(op, x), 0.0, cond(op, x), &ctx);
            }
        }
        let mut t = Tensor::from_fn(dt, &[4], &Layout::contiguous(), |i| {
            [-0.0, 0.0, -1.0, 0.0][i]
        });
        let mut out = Tensor::new(dt, &[4], &Layout::contiguous());
        // SAFETY: distinct buffers owned by the test.
        unsafe {
            unary(UnaryOp::Sqrt, &t.view(), &out.view()).unwrap();
            assert!(
                out.get(0) == 0.0 && out.get(0).is_sign_negative(),
                "sqrt(-0) = -0"
            );
            unary(UnaryOp::Log, &t.view(), &out.view()).unwrap();
            assert_eq!(
                (out.get(1), out.get(2).is_nan()),
                (-inf, true),
                "log(0), log(-1)"
            );
            unary(UnaryOp::Rsqrt, &t.view(), &out.view()).unwrap();
            assert_eq!(out.get(3), inf, "rsqrt(0)");
        }
    }
}

#[test]
fn pow_scalar_matches_powf() {
    let inf = f64::INFINITY;
    let specials = [0.0, -0.0, inf, -inf, f64::NAN, 1.0, -1.0, 0.5, 3.0, -2.0];
    for dt in FLOATS32 {
        for e in [0.0, 1.0, 2.0, -1.0, 0.5, 3.0, -2.5, 1.0 / 3.0, 7.25] {
            let f = |i: usize| if i < 10 { specials[i] } else { rnd(2, i) * 2.0 };
            for layout in [Layout::contiguous(), Layout::messy(2)] {
                let mut x = Tensor::from_fn(dt, &[10, 13], &layout, f);
                let mut out = Tensor::new(dt, &[10, 13], &Layout::transposed(2));
                // SAFETY: distinct buffers owned by the test.
                unsafe { pow_scalar(&x.view(), &out.view(), e).unwrap() };
                for i in 0..130 {
                    let want = x.get(i).powf(e);
                    close(
                        dt,
                        out.get(i),
                        want,
                        1e-30,
                        &format!("pow {dt:?} x={} e={e}", x.get(i)),
                    );
                    if want == 0.0 || want.is_infinite() {
                        assert_eq!(
                            out.get(i).is_sign_negative(),
                            want.is_sign_negative(),
                            "sign"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn scale_in_place() {
    for dt in FLOATS32 {
        for shape in SHAPES {
            for layout in layouts(shape.len()) {
                let mut t = Tensor::from_fn(dt, shape, &layout, |i| rnd(3, i));
                let orig: Vec<f64> = (0..t.numel()).map(|i| t.get(i)).collect();
                // SAFETY: a buffer owned by the test.
                unsafe { scale(&t.view(), -0.37).unwrap() };
                for (i, &o) in orig.iter().enumerate() {
                    close(
                        dt,
                        t.get(i),
                        o * (-0.37f32) as f64,
                        0.0,
                        &format!("scale {dt:?} {i}"),
                    );
                }
            }
        }
    }
}

#[test]
fn rejects_bad_arguments() {
    let l = Layout::contiguous();
    let mut a = Tensor::random(DType::F32, &[3, 4], &l, 1);
    let mut b = Tensor::new(DType::F32, &[4, 3], &l);
    let mut c = Tensor::new(DType::F64, &[3, 4], &l);
    let mut h = Tensor::new(DType::F16, &[3, 4], &l);
    // SAFETY: test-owned buffers; every call must fail before touching memory.
    unsafe {
        assert!(unary(UnaryOp::Exp, &a.view(), &b.view()).is_err());
        let cv = c.view();
        assert!(
            unary(UnaryOp::Exp, &cv, &cv).is_err(),
            "f64 is not required"
        );
        assert!(pow_scalar(&a.view(), &h.view(), 2.0).is_err());
        assert!(swiglu(&a.view(), &h.view(), &b.view()).is_err());
        assert!(scale(&cv, 2.0).is_err());
    }
}

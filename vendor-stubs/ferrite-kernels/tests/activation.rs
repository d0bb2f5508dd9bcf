//! Activation gradients and SwiGLU against f64 references:
//! `activation_backward` (relu, silu, gelu, gelu_erf), `output_backward`
//! (sigmoid, tanh), `swiglu` and
//! `swiglu_backward`, for f32/f16/bf16 on empty, scalar, transposed,
//! padded/flipped and large shapes; the derivative references are checked
//! by finite differences of the forward references.

mod common;

use common::pointwise::{SHAPES, close, grad_ref, layouts, unary_ref};
use common::{FLOATS32, Layout, Tensor, eps, rnd};
use ferrite_kernels::{
    ActivationOp, DType, OutputOp, UnaryOp, activation_backward, output_backward, swiglu,
    swiglu_backward,
};

#[test]
fn derivative_references_match_finite_differences() {
    for op in [
        ActivationOp::Silu,
        ActivationOp::Gelu,
        ActivationOp::GeluErf,
        ActivationOp::Relu,
    ] {
        let unary_op = match op {
            ActivationOp::Relu => UnaryOp::Relu,
            ActivationOp::Silu => UnaryOp::Silu,
            ActivationOp::Gelu => UnaryOp::Gelu,
            ActivationOp::GeluErf => UnaryOp::GeluErf,
        };
        for i in 0..200 {
            let x = rnd(4, i) * 4.0 + 1e-3;
            let h = 1e-6;
            let fd = (unary_ref(unary_op, x + h) - unary_ref(unary_op, x - h)) / (2.0 * h);
            assert!((fd - grad_ref(op, x)).abs() < 1e-6, "{op:?} x={x}");
        }
    }
}

#[test]
fn output_backward_matches_its_formulas() {
    for dt in FLOATS32 {
        for shape in SHAPES {
            let r = shape.len();
            let [l0, l1, l2] = layouts(r);
            let mut g = Tensor::from_fn(dt, shape, &l0, |i| rnd(5, i));
            let mut y = Tensor::from_fn(dt, shape, &l1, |i| rnd(6, i));
            for (op, factor) in [
                (OutputOp::Sigmoid, (|y| y * (1.0 - y)) as fn(f64) -> f64),
                (OutputOp::Tanh, |y| 1.0 - y * y),
            ] {
                let mut d = Tensor::new(dt, shape, &l2);
                // SAFETY: distinct buffers owned by the test.
                unsafe { output_backward(op, &g.view(), &y.view(), &d.view()).unwrap() };
                for i in 0..d.numel() {
                    let want = g.get(i) * factor(y.get(i));
                    close(
                        dt,
                        d.get(i),
                        want,
                        0.0,
                        &format!("{op:?} {dt:?} {shape:?} {i}"),
                    );
                }
            }
        }
    }
}

#[test]
fn activation_backward_and_swiglu() {
    for dt in FLOATS32 {
        for shape in SHAPES {
            let r = shape.len();
            let [l0, l1, l2] = layouts(r);
            let mut g = Tensor::from_fn(dt, shape, &l0, |i| rnd(5, i));
            let mut x = Tensor::from_fn(dt, shape, &l1, |i| rnd(6, i) * 4.0);
            let mut u = Tensor::from_fn(dt, shape, &l2, |i| rnd(7, i));
            let ctx = format!("{dt:?} {shape:?}");
            for op in [
                ActivationOp::Relu,
                ActivationOp::Silu,
                ActivationOp::Gelu,
                ActivationOp::GeluErf,
            ] {
                let mut d = Tensor::new(dt, shape, &l2);
                // SAFETY: distinct buffers owned by the test.
                unsafe { activation_backward(op, &g.view(), &x.view(), &d.view()).unwrap() };
                for i in 0..d.numel() {
                    let (gi, xi) = (g.get(i), x.get(i));
                    let want = gi * grad_ref(op, xi);
                    let abs = 8.0 * eps(DType::F32) * gi.abs() * (1.0 + xi.abs());
                    close(dt, d.get(i), want, abs, &format!("{op:?} {ctx} {i}"));
                }
            }
            let mut out = Tensor::new(dt, shape, &l0);
            let (mut dg, mut du) = (Tensor::new(dt, shape, &l1), Tensor::new(dt, shape, &l0));
            // SAFETY: distinct buffers owned by the test.
            unsafe {
                swiglu(&x.view(), &u.view(), &out.view()).unwrap();
                swiglu_backward(&x.view(), &u.view(), &g.view(), &dg.view(), &du.view()).unwrap();
            }
            for i in 0..out.numel() {
                let (xi, ui, gi) = (x.get(i), u.get(i), g.get(i));
                let silu = unary_ref(UnaryOp::Silu, xi);
                let abs = 8.0 * eps(DType::F32) * gi.abs() * ui.abs() * (1.0 + xi.abs());
                close(
                    dt,
                    out.get(i),
                    silu * ui,
                    1e-30,
                    &format!("swiglu {ctx} {i}"),
                );
                close(
                    dt,
                    du.get(i),
                    gi * silu,
                    1e-30,
                    &format!("grad_up {ctx} {i}"),
                );
                let want = gi * ui * grad_ref(ActivationOp::Silu, xi);
                close(dt, dg.get(i), want, abs, &format!("grad_gate {ctx} {i}"));
            }
        }
    }
}

#[test]
fn in_place_outputs() {
    for dt in FLOATS32 {
        let l = Layout::messy(2);
        let shape = [9i64, 70];
        let gate = |i| rnd(8, i) * 4.0;
        let up = |i| rnd(9, i);
        let (g0, u0) = (
            Tensor::from_fn(dt, &shape, &l, gate),
            Tensor::from_fn(dt, &shape, &l, up),
        );
        let mut go = Tensor::from_fn(dt, &shape, &Layout::contiguous(), |i| rnd(10, i));
        let (mut g, mut u) = (
            Tensor::from_fn(dt, &shape, &l, gate),
            Tensor::from_fn(dt, &shape, &l, up),
        );
        let (gv, uv) = (g.view(), u.view());
        // SAFETY: each output is exactly one of the inputs.
        unsafe { swiglu_backward(&gv, &uv, &go.view(), &gv, &uv).unwrap() };
        let mut x = Tensor::from_fn(dt, &shape, &l, gate);
        let xv = x.view();
        // SAFETY: grad_in is exactly the input.
        unsafe { activation_backward(ActivationOp::Gelu, &go.view(), &xv, &xv).unwrap() };
        for i in 0..g0.numel() {
            let (xi, ui, gi) = (g0.get(i), u0.get(i), go.get(i));
            let abs = 8.0 * eps(DType::F32) * gi.abs() * (1.0 + ui.abs()) * (1.0 + xi.abs());
            let ctx = format!("{dt:?} in place {i}");
            close(dt, u.get(i), gi * unary_ref(UnaryOp::Silu, xi), 1e-30, &ctx);
            close(
                dt,
                g.get(i),
                gi * ui * grad_ref(ActivationOp::Silu, xi),
                abs,
                &ctx,
            );
            close(
                dt,
                x.get(i),
                gi * grad_ref(ActivationOp::Gelu, xi),
                abs,
                &ctx,
            );
        }
    }
}

//! `binary` against an f64 reference: all ops and float dtypes, NumPy
//! broadcasting, strided/transposed/negative-stride views, in place, empty
//! tensors, IEEE special values, and large (multi-threaded) tensors.

mod common;

use common::{FLOATS, Layout, Tensor, assert_close, eps, unravel};
use ferrite_kernels::{BinaryOp, DType, View, binary};

const OPS: [BinaryOp; 4] = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div];

fn apply(op: BinaryOp, x: f64, y: f64, alpha: f64) -> f64 {
    match op {
        BinaryOp::Add => x + alpha * y,
        BinaryOp::Sub => x - alpha * y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
    }
}

/// Element of `t` (shape broadcastable to `out_shape`) at the output index.
fn bcast_get(t: &Tensor, idx: &[usize]) -> f64 {
    let off = idx.len() - t.shape.len();
    let own: Vec<usize> = t
        .shape
        .iter()
        .enumerate()
        .map(|(d, &n)| if n == 1 { 0 } else { idx[off + d] })
        .collect();
    t.at(&own)
}

fn check(op: BinaryOp, a: &Tensor, b: &Tensor, out: &Tensor, alpha: f64, ctx: &str) {
    let dt = out.dtype;
    // Intermediate f32 rounding (alpha*b) plus the final rounding.
    let u = eps(dt).max(if dt == DType::F64 {
        0.0
    } else {
        eps(DType::F32)
    });
    for i in 0..out.numel() {
        let idx = unravel(i, &out.shape);
        let (x, y) = (bcast_get(a, &idx), bcast_get(b, &idx));
        let want = apply(op, x, y, alpha);
        let scale = match op {
            BinaryOp::Add | BinaryOp::Sub => x.abs() + (alpha * y).abs(),
            _ => want.abs(),
        };
        assert_close(
            out.get(i),
            want,
            3.0 * u * scale + 1e-300,
            &format!("{ctx} {op:?} {dt:?} elem {i}"),
        );
    }
}

fn nonzero(seed: u64) -> impl Fn(usize) -> f64 {
    move |i| {
        let v = common::rnd(seed, i);
        if v.abs() < 0.05 { 0.5 } else { v }
    }
}

#[test]
fn broadcasting_and_layouts() {
    let cases: [(&[i64], &[i64], &[i64]); 10] = [
        (&[7], &[7], &[7]),
        (&[3, 1, 5], &[4, 1], &[3, 4, 5]),
        (&[2, 3, 4], &[4], &[2, 3, 4]),
        (&[], &[2, 3], &[2, 3]),
        (&[2, 3], &[], &[2, 3]),
        (&[1], &[5, 1], &[5, 1]),
        (&[4, 1, 3], &[1, 6, 1], &[4, 6, 3]),
        (&[0, 3], &[3], &[0, 3]),
        (&[2, 0], &[2, 1], &[2, 0]),
        (&[1, 1], &[1, 1], &[1, 1]),
    ];
    for dt in FLOATS {
        for op in OPS {
            for (sa, sb, so) in cases {
                let layouts = [
                    (
                        Layout::contiguous(),
                        Layout::contiguous(),
                        Layout::contiguous(),
                    ),
                    (
                        Layout::transposed(sa.len()),
                        Layout::flipped(&[]),
                        Layout::contiguous(),
                    ),
                    (
                        Layout::messy(sa.len()),
                        Layout::messy(sb.len()),
                        Layout::messy(so.len()),
                    ),
                    (
                        Layout::contiguous(),
                        Layout::transposed(sb.len()),
                        Layout::transposed(so.len()),
                    ),
                ];
                for (k, (la, lb, lo)) in layouts.iter().enumerate() {
                    let mut a = Tensor::random(dt, sa, la, 1);
                    let mut b = Tensor::from_fn(dt, sb, lb, nonzero(2));
                    let mut out = Tensor::new(dt, so, lo);
                    out.fill_storage(9.0);
                    // SAFETY: distinct buffers owned by the test.
                    unsafe { binary(op, &a.view(), &b.view(), &out.view(), 2.5).unwrap() };
                    check(
                        op,
                        &a,
                        &b,
                        &out,
                        2.5,
                        &format!("{sa:?}.{sb:?}->{so:?} layouts#{k}"),
                    );
                    for p in out.padding_positions() {
                        assert_eq!(out.get_raw(p), 9.0);
                    }
                }
            }
        }
    }
}

#[test]
fn in_place() {
    for dt in FLOATS {
        for op in OPS {
            for layout in [Layout::contiguous(), Layout::messy(2)] {
                let shape = [5i64, 9];
                // out == a
                let mut a = Tensor::random(dt, &shape, &layout, 3);
                let orig = Tensor::random(dt, &shape, &layout, 3);
                let mut b = Tensor::from_fn(dt, &shape, &Layout::transposed(2), nonzero(4));
                let av = a.view();
                // SAFETY: out is exactly a.
                unsafe { binary(op, &av, &b.view(), &av, 0.5).unwrap() };
                check(op, &orig, &b, &a, 0.5, "out==a");
                // out == b, with a broadcast row
                let mut a = Tensor::random(dt, &[9], &Layout::contiguous(), 5);
                let mut b = Tensor::from_fn(dt, &shape, &layout, nonzero(6));
                let orig = Tensor::from_fn(dt, &shape, &layout, nonzero(6));
                let bv = b.view();
                // SAFETY: out is exactly b.
                unsafe { binary(op, &a.view(), &bv, &bv, 0.5).unwrap() };
                check(op, &a, &orig, &b, 0.5, "out==b");
                // out == a == b
                let mut a = Tensor::from_fn(dt, &shape, &layout, nonzero(7));
                let orig = Tensor::from_fn(dt, &shape, &layout, nonzero(7));
                let av = a.view();
                // SAFETY: all three views are identical.
                unsafe { binary(op, &av, &av, &av, 1.0).unwrap() };
                check(op, &orig, &orig, &a, 1.0, "out==a==b");
            }
        }
    }
}

#[test]
fn ieee_special_values() {
    let xs = [f64::INFINITY, f64::NAN, 1.0, 0.0, -1.0, f64::INFINITY, 0.0];
    let ys = [f64::NEG_INFINITY, 1.0, 0.0, 0.0, 0.0, 2.0, -0.0];
    for dt in FLOATS {
        for op in OPS {
            let n = xs.len() as i64;
            let mut a = Tensor::from_fn(dt, &[n], &Layout::contiguous(), |i| xs[i]);
            let mut b = Tensor::from_fn(dt, &[n], &Layout::contiguous(), |i| ys[i]);
            let mut out = Tensor::new(dt, &[n], &Layout::contiguous());
            // SAFETY: distinct buffers owned by the test.
            unsafe { binary(op, &a.view(), &b.view(), &out.view(), 1.0).unwrap() };
            for i in 0..xs.len() {
                let want = apply(op, xs[i], ys[i], 1.0);
                let got = out.get(i);
                assert!(
                    got == want || (got.is_nan() && want.is_nan()),
                    "{dt:?} {op:?} {} {} -> {got}",
                    xs[i],
                    ys[i]
                );
            }
        }
    }
}

#[test]
fn large_tensors_use_all_paths() {
    for dt in FLOATS {
        // Contiguous, same shape (parallel fast path).
        let shape = [300i64, 301];
        let mut a = Tensor::random(dt, &shape, &Layout::contiguous(), 8);
        let mut b = Tensor::from_fn(dt, &shape, &Layout::contiguous(), nonzero(9));
        let mut out = Tensor::new(dt, &shape, &Layout::contiguous());
        // SAFETY: distinct buffers owned by the test.
        unsafe { binary(BinaryOp::Div, &a.view(), &b.view(), &out.view(), 1.0).unwrap() };
        check(BinaryOp::Div, &a, &b, &out, 1.0, "large contiguous");
        // Transposed input (tiled walk).
        let mut a = Tensor::random(dt, &shape, &Layout::transposed(2), 12);
        let mut b = Tensor::from_fn(dt, &[301], &Layout::contiguous(), nonzero(13));
        let mut out = Tensor::new(dt, &shape, &Layout::padded(1));
        // SAFETY: distinct buffers owned by the test.
        unsafe { binary(BinaryOp::Mul, &a.view(), &b.view(), &out.view(), 1.0).unwrap() };
        check(BinaryOp::Mul, &a, &b, &out, 1.0, "large transposed");
        // Broadcast + strided (parallel plan path).
        let mut a = Tensor::random(dt, &[7, 1, 129], &Layout::messy(3), 10);
        let mut b = Tensor::random(dt, &[130, 1], &Layout::transposed(2), 11);
        let mut out = Tensor::new(dt, &[7, 130, 129], &Layout::messy(3));
        // SAFETY: distinct buffers owned by the test.
        unsafe { binary(BinaryOp::Sub, &a.view(), &b.view(), &out.view(), -1.5).unwrap() };
        check(BinaryOp::Sub, &a, &b, &out, -1.5, "large strided");
    }
}

#[test]
fn rejects_bad_arguments() {
    let mut a = Tensor::random(DType::F32, &[3, 4], &Layout::contiguous(), 1);
    let mut b = Tensor::random(DType::F32, &[5], &Layout::contiguous(), 1);
    let mut i = Tensor::new(DType::I32, &[3, 4], &Layout::contiguous());
    let mut h = Tensor::new(DType::F16, &[3, 4], &Layout::contiguous());
    let mut out = Tensor::new(DType::F32, &[3, 4], &Layout::contiguous());
    let (av, bv, iv, hv, ov) = (a.view(), b.view(), i.view(), h.view(), out.view());
    // SAFETY: all views address test-owned buffers; every call must fail early.
    unsafe {
        assert!(
            binary(BinaryOp::Add, &av, &bv, &ov, 1.0).is_err(),
            "non-broadcastable"
        );
        // Integers since ABI 1.3: add, sub and mul, not div, and one
        // integer dtype throughout.
        assert!(
            binary(BinaryOp::Div, &iv, &iv, &iv, 1.0).is_err(),
            "integer division"
        );
        assert!(
            binary(BinaryOp::Add, &iv, &av, &iv, 1.0).is_err(),
            "integer and float operands"
        );
        assert!(
            binary(BinaryOp::Add, &av, &hv, &ov, 1.0).is_err(),
            "mixed dtypes"
        );
        assert!(
            binary(BinaryOp::Add, &ov, &av, &bv, 1.0).is_err(),
            "out smaller than inputs"
        );
        let strides = [1i64];
        let bad = View {
            strides: &strides,
            ..av
        };
        assert!(
            binary(BinaryOp::Add, &bad, &av, &ov, 1.0).is_err(),
            "rank mismatch"
        );
        let misaligned = View {
            ptr: av.ptr.wrapping_add(1),
            ..av
        };
        assert!(
            binary(BinaryOp::Add, &misaligned, &av, &ov, 1.0).is_err(),
            "misaligned"
        );
        let shape = [-1i64, 4];
        let neg = View {
            shape: &shape,
            ..av
        };
        assert!(
            binary(BinaryOp::Add, &neg, &av, &ov, 1.0).is_err(),
            "negative extent"
        );
    }
}

/// More non-collapsible dimensions than a plan holds inline, with
/// broadcasting.
#[test]
fn many_dimensions() {
    let so = [2i64, 3, 2, 2, 3, 2, 2, 2, 3, 2];
    let sa = [3i64, 1, 2, 3, 2, 1, 2, 3, 1];
    let sb = [2i64, 3, 2, 2, 1, 2, 2, 2, 3, 2];
    let reversed = |r: usize| Layout {
        order: Some((0..r).rev().collect()),
        pad: 2,
        flip: vec![0],
    };
    for dt in FLOATS {
        let mut a = Tensor::random(dt, &sa, &reversed(sa.len()), 1);
        let mut b = Tensor::from_fn(dt, &sb, &Layout::messy(sb.len()), nonzero(2));
        let mut out = Tensor::new(dt, &so, &reversed(so.len()));
        // SAFETY: distinct buffers owned by the test.
        unsafe { binary(BinaryOp::Mul, &a.view(), &b.view(), &out.view(), 1.0).unwrap() };
        check(BinaryOp::Mul, &a, &b, &out, 1.0, "10-d");
    }
}

//! `matmul` against a naive f64 reference: every float dtype, transposes,
//! strided/negative/transposed outputs, batch broadcasting, alpha/beta,
//! `beta == 0` not reading NaN-filled outputs, `K == 0`, empty shapes, and
//! sizes that take the tiny, single-gemm, threaded-gemm and batch-parallel
//! paths.

mod common;

use common::{FLOATS, Layout, Tensor, assert_close, eps, unravel};
use ferrite_kernels::{DType, View, matmul};

struct Case {
    a: Vec<i64>,
    b: Vec<i64>,
    out: Vec<i64>,
    ta: bool,
    tb: bool,
}

fn case(a: &[i64], b: &[i64], out: &[i64], ta: bool, tb: bool) -> Case {
    Case {
        a: a.to_vec(),
        b: b.to_vec(),
        out: out.to_vec(),
        ta,
        tb,
    }
}

/// Element (i, j) of op(x) in the batch entry matching `bidx` (broadcast).
fn op_get(x: &Tensor, bidx: &[usize], i: usize, j: usize, t: bool) -> f64 {
    let r = x.shape.len();
    let off = bidx.len() + 2 - r;
    let mut idx: Vec<usize> = (0..r - 2)
        .map(|d| if x.shape[d] == 1 { 0 } else { bidx[off + d] })
        .collect();
    if t {
        idx.extend([j, i]);
    } else {
        idx.extend([i, j]);
    }
    x.at(&idx)
}

fn run_case(dt: DType, c: &Case, layouts: [&Layout; 3], alpha: f64, beta: f64, out_init: f64) {
    let mut a = Tensor::random(dt, &c.a, layouts[0], 1);
    let mut b = Tensor::random(dt, &c.b, layouts[1], 2);
    let mut out = Tensor::from_fn(dt, &c.out, layouts[2], |i| {
        if out_init.is_nan() {
            f64::NAN
        } else {
            common::rnd(3, i)
        }
    });
    let before: Vec<f64> = (0..out.numel()).map(|i| out.get(i)).collect();
    // SAFETY: distinct buffers owned by the test.
    unsafe { matmul(&a.view(), &b.view(), &out.view(), c.ta, c.tb, alpha, beta).unwrap() };
    let r = c.out.len();
    let (m, n) = (c.out[r - 2] as usize, c.out[r - 1] as usize);
    let k = if c.ta {
        c.a[c.a.len() - 2]
    } else {
        c.a[c.a.len() - 1]
    } as usize;
    let u = if dt == DType::F64 {
        eps(dt)
    } else {
        eps(DType::F32)
    };
    for (e, &prev) in before.iter().enumerate() {
        let idx = unravel(e, &c.out);
        let (bidx, i, j) = (&idx[..r - 2], idx[r - 2], idx[r - 1]);
        let (mut acc, mut mag) = (0.0, 0.0);
        for p in 0..k {
            let prod = op_get(&a, bidx, i, p, c.ta) * op_get(&b, bidx, p, j, c.tb);
            acc += prod;
            mag += prod.abs();
        }
        let (want, scale) = if beta == 0.0 {
            (alpha * acc, (alpha * mag).abs())
        } else {
            (
                alpha * acc + beta * prev,
                (alpha * mag).abs() + (beta * prev).abs(),
            )
        };
        let tol = scale * (2.0 * eps(dt) + 2.0 * (k as f64 + 2.0) * u) + 1e-300;
        assert_close(
            out.get(e),
            want,
            tol,
            &format!(
                "{dt:?} a{:?}{} b{:?}{} elem {e} m{m} n{n} k{k}",
                c.a, c.ta, c.b, c.tb
            ),
        );
    }
}

fn layouts_for(c: &Case) -> Vec<[Layout; 3]> {
    let (ra, rb, ro) = (c.a.len(), c.b.len(), c.out.len());
    vec![
        [
            Layout::contiguous(),
            Layout::contiguous(),
            Layout::contiguous(),
        ],
        [
            Layout::transposed(ra),
            Layout::transposed(rb),
            Layout::contiguous(),
        ],
        [Layout::messy(ra), Layout::padded(1), Layout::transposed(ro)],
        [
            Layout::flipped(&[ra - 1]),
            Layout::flipped(&[rb - 2]),
            Layout::messy(ro),
        ],
    ]
}

#[test]
fn shapes_transposes_and_layouts() {
    let cases = [
        case(&[3, 5], &[5, 4], &[3, 4], false, false),
        case(&[5, 3], &[5, 4], &[3, 4], true, false),
        case(&[3, 5], &[4, 5], &[3, 4], false, true),
        case(&[5, 3], &[4, 5], &[3, 4], true, true),
        case(&[1, 1], &[1, 1], &[1, 1], false, false),
        case(&[17, 33], &[33, 9], &[17, 9], false, false),
        case(&[33, 17], &[9, 33], &[17, 9], true, true),
        case(&[1, 40], &[40, 1], &[1, 1], false, false),
        case(&[70, 64], &[64, 65], &[70, 65], false, false),
        case(&[64, 70], &[65, 64], &[70, 65], true, true),
    ];
    for dt in FLOATS {
        for c in &cases {
            for l in layouts_for(c) {
                run_case(dt, c, [&l[0], &l[1], &l[2]], 1.0, 0.0, 0.0);
                run_case(dt, c, [&l[0], &l[1], &l[2]], -1.5, 0.75, 0.0);
            }
        }
    }
}

#[test]
fn batch_broadcasting() {
    let cases = [
        case(&[2, 1, 3, 4], &[3, 4, 5], &[2, 3, 3, 5], false, false),
        case(&[3, 4], &[6, 4, 5], &[6, 3, 5], false, false),
        case(&[6, 4, 3], &[4, 5], &[6, 3, 5], true, false),
        case(&[1, 3, 4], &[2, 5, 4], &[2, 3, 5], false, true),
        case(&[2, 3, 3, 4], &[4, 5], &[2, 3, 3, 5], false, false),
        case(&[0, 3, 4], &[4, 5], &[0, 3, 5], false, false),
    ];
    for dt in FLOATS {
        for c in &cases {
            for l in layouts_for(c) {
                run_case(dt, c, [&l[0], &l[1], &l[2]], 2.0, 0.0, 0.0);
                run_case(dt, c, [&l[0], &l[1], &l[2]], 1.0, -1.0, 0.0);
            }
        }
    }
}

#[test]
fn many_small_matrices_run_in_parallel() {
    let cases = [
        case(&[300, 4, 4], &[300, 4, 4], &[300, 4, 4], false, true),
        case(&[200, 16, 16], &[16, 16], &[200, 16, 16], true, false),
        case(&[5, 40, 50], &[5, 50, 60], &[5, 40, 60], false, false),
    ];
    for dt in FLOATS {
        for c in &cases {
            let l = Layout::contiguous();
            run_case(dt, c, [&l, &l, &l], 1.0, 0.5, 0.0);
            let l = layouts_for(c).pop().unwrap();
            run_case(dt, c, [&l[0], &l[1], &l[2]], 1.0, 0.0, f64::NAN);
        }
    }
}

#[test]
fn beta_zero_ignores_nan_in_out() {
    for dt in FLOATS {
        for (m, k, n) in [(2, 3, 2), (9, 10, 11), (70, 70, 70)] {
            let c = case(&[m, k], &[k, n], &[m, n], false, false);
            for l in layouts_for(&c) {
                run_case(dt, &c, [&l[0], &l[1], &l[2]], 1.0, 0.0, f64::NAN);
            }
        }
    }
}

#[test]
fn k_zero_and_empty() {
    for dt in FLOATS {
        for (m, n) in [(3, 4), (80, 90)] {
            let c = case(&[m, 0], &[0, n], &[m, n], false, false);
            // beta == 0: zeros even over NaN.
            run_case(
                dt,
                &c,
                [
                    &Layout::contiguous(),
                    &Layout::contiguous(),
                    &Layout::messy(2),
                ],
                1.0,
                0.0,
                f64::NAN,
            );
            // beta != 0: out = beta * out.
            run_case(
                dt,
                &c,
                [
                    &Layout::contiguous(),
                    &Layout::contiguous(),
                    &Layout::transposed(2),
                ],
                1.0,
                0.5,
                0.0,
            );
        }
        let l = Layout::contiguous();
        run_case(
            dt,
            &case(&[0, 3], &[3, 4], &[0, 4], false, false),
            [&l, &l, &l],
            1.0,
            0.0,
            0.0,
        );
        run_case(
            dt,
            &case(&[2, 3], &[3, 0], &[2, 0], false, false),
            [&l, &l, &l],
            1.0,
            0.0,
            0.0,
        );
    }
}

#[test]
fn rejects_bad_shapes() {
    let mut a = Tensor::random(DType::F32, &[3, 4], &Layout::contiguous(), 1);
    let mut b = Tensor::random(DType::F32, &[5, 6], &Layout::contiguous(), 1);
    let mut out = Tensor::new(DType::F32, &[3, 6], &Layout::contiguous());
    let mut v = Tensor::new(DType::F32, &[4], &Layout::contiguous());
    let mut i = Tensor::new(DType::I64, &[3, 4], &Layout::contiguous());
    let (av, bv, ov, vv, iv) = (a.view(), b.view(), out.view(), v.view(), i.view());
    // SAFETY: test-owned buffers; every call must fail before touching memory.
    unsafe {
        assert!(
            matmul(&av, &bv, &ov, false, false, 1.0, 0.0).is_err(),
            "K mismatch"
        );
        assert!(
            matmul(&av, &vv, &ov, false, false, 1.0, 0.0).is_err(),
            "1-D operand"
        );
        assert!(
            matmul(&iv, &iv, &iv, false, true, 1.0, 0.0).is_err(),
            "integers"
        );
        let shape = [2i64, 3, 4];
        let strides = [12i64, 4, 1];
        let batched = View {
            shape: &shape,
            strides: &strides,
            ..av
        };
        assert!(
            matmul(&batched, &av, &ov, false, true, 1.0, 0.0).is_err(),
            "out has fewer batch dims"
        );
    }
}

#[test]
fn alpha_zero_does_not_read_inputs() {
    for dt in FLOATS {
        for n in [3i64, 80] {
            let mut a = Tensor::from_fn(dt, &[n, n], &Layout::contiguous(), |_| f64::NAN);
            let mut b = Tensor::from_fn(dt, &[n, n], &Layout::transposed(2), |_| f64::INFINITY);
            let mut out = Tensor::random(dt, &[n, n], &Layout::contiguous(), 4);
            let before: Vec<f64> = (0..out.numel()).map(|i| out.get(i)).collect();
            // SAFETY: distinct buffers owned by the test.
            unsafe { matmul(&a.view(), &b.view(), &out.view(), false, false, 0.0, 0.5).unwrap() };
            for (i, &v) in before.iter().enumerate() {
                assert_close(
                    out.get(i),
                    0.5 * v,
                    2.0 * eps(dt) * v.abs(),
                    &format!("{dt:?} alpha=0"),
                );
            }
        }
    }
}

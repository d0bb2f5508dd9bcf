//! `reduce` (sum/mean/max/argmax over every dim, keepdim or not, NaN
//! propagation, first max and first NaN, empty dims) and `sum_squares` (any
//! layout, f64 input, large threaded inputs) against f64 references, on
//! f32/f16/bf16 with transposed and padded/flipped views.

mod common;

use common::{FLOATS, FLOATS32, Layout, Tensor, assert_close, eps, rnd, unravel};
use ferrite_kernels::{DType, ReduceOp, reduce, sum_squares};

/// A generator of element values.
type Gen<'a> = Box<dyn Fn(usize) -> f64 + 'a>;

const OPS: [ReduceOp; 4] = [
    ReduceOp::Sum,
    ReduceOp::Mean,
    ReduceOp::Max,
    ReduceOp::Argmax,
];

/// Reference over `dim` for output index `oidx` (dim removed): the result
/// and the sum of absolute values.
fn reduce_ref(op: ReduceOp, x: &Tensor, dim: usize, oidx: &[usize]) -> (f64, f64) {
    let l = if x.shape.is_empty() {
        1
    } else {
        x.shape[dim] as usize
    };
    let vals: Vec<f64> = (0..l)
        .map(|j| {
            let mut idx = oidx.to_vec();
            if !x.shape.is_empty() {
                idx.insert(dim, j);
            }
            x.at(&idx)
        })
        .collect();
    let abs: f64 = vals.iter().map(|v| v.abs()).sum();
    let r = match op {
        ReduceOp::Sum => vals.iter().sum(),
        ReduceOp::Mean => vals.iter().sum::<f64>() / l as f64,
        ReduceOp::Max => vals.iter().fold(f64::NEG_INFINITY, |m, &v| {
            if m.is_nan() || !(v > m || v.is_nan()) {
                m
            } else {
                v
            }
        }),
        ReduceOp::Argmax => {
            let mut best = 0;
            for (j, &v) in vals.iter().enumerate() {
                let b = vals[best];
                if (v > b || (v.is_nan() && !b.is_nan())) && j > 0 {
                    best = j;
                }
            }
            best as f64
        }
    };
    (r, abs)
}

fn check_reduce(op: ReduceOp, x: &mut Tensor, dim: usize, keepdim: bool, lo: &Layout) {
    let dt = x.dtype;
    let r = x.shape.len();
    let oshape: Vec<i64> = (0..r)
        .filter_map(|d| {
            if d != dim {
                Some(x.shape[d])
            } else if keepdim {
                Some(1)
            } else {
                None
            }
        })
        .collect();
    let odt = if op == ReduceOp::Argmax {
        DType::I64
    } else {
        dt
    };
    let mut out = Tensor::new(odt, &oshape, lo);
    // SAFETY: distinct buffers owned by the test.
    unsafe { reduce(op, &x.view(), &out.view(), dim, keepdim).unwrap() };
    let rshape: Vec<i64> = (0..r).filter(|&d| d != dim).map(|d| x.shape[d]).collect();
    for i in 0..out.numel() {
        let (want, abs) = reduce_ref(op, x, dim, &unravel(i, &rshape));
        let tol = 2.0 * eps(dt) * want.abs() + 1e-12 * abs;
        assert_close(
            out.get(i),
            want,
            tol,
            &format!(
                "{op:?} {dt:?} {:?} dim {dim} keep {keepdim} out {i}",
                x.shape
            ),
        );
    }
}

#[test]
fn reduce_all_dims_layouts_and_dtypes() {
    let shapes: [&[i64]; 8] = [
        &[],
        &[1],
        &[5, 7],
        &[2, 3, 4],
        &[3, 1, 5],
        &[4, 0],
        &[0, 3],
        &[300, 257],
    ];
    for dt in FLOATS32 {
        for shape in shapes {
            let r = shape.len();
            for (k, li) in [
                Layout::contiguous(),
                Layout::transposed(r),
                Layout::messy(r),
            ]
            .iter()
            .enumerate()
            {
                let mut x = Tensor::from_fn(dt, shape, li, |i| rnd(1, i) * 3.0);
                for dim in 0..r.max(1) {
                    for keepdim in [false, true] {
                        for op in OPS {
                            if op == ReduceOp::Argmax && shape.get(dim) == Some(&0) {
                                continue;
                            }
                            let lo = if k == 2 {
                                Layout::padded(1)
                            } else {
                                Layout::contiguous()
                            };
                            check_reduce(op, &mut x, dim, keepdim, &lo);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn reduce_empty_dim_nan_and_ties() {
    let mut x = Tensor::new(DType::F32, &[3, 0], &Layout::contiguous());
    let mut out = Tensor::new(DType::F32, &[3], &Layout::contiguous());
    let mut idx = Tensor::new(DType::I64, &[3], &Layout::contiguous());
    // SAFETY: distinct buffers owned by the test.
    unsafe {
        reduce(ReduceOp::Sum, &x.view(), &out.view(), 1, false).unwrap();
        assert_eq!(out.get(2), 0.0);
        reduce(ReduceOp::Mean, &x.view(), &out.view(), 1, false).unwrap();
        assert!(out.get(2).is_nan());
        reduce(ReduceOp::Max, &x.view(), &out.view(), 1, false).unwrap();
        assert_eq!(out.get(2), f64::NEG_INFINITY);
        assert!(reduce(ReduceOp::Argmax, &x.view(), &idx.view(), 1, false).is_err());
    }
    let (inf, nan) = (f64::INFINITY, f64::NAN);
    let rows = [
        [1.0, 3.0, 3.0, 2.0, 0.0],
        [1.0, nan, 5.0, nan, 9.0],
        [-inf; 5],
        [2.0, 2.0, inf, inf, 1.0],
    ];
    for dt in FLOATS32 {
        for transposed in [false, true] {
            // Rows along dim 1, or (transposed storage) along dim 0.
            let (shape, dim, f): ([i64; 2], usize, Gen<'_>) = if transposed {
                ([5, 4], 0, Box::new(|i| rows[i % 4][i / 4]))
            } else {
                ([4, 5], 1, Box::new(|i| rows[i / 5][i % 5]))
            };
            let mut x = Tensor::from_fn(dt, &shape, &Layout::contiguous(), f);
            let mut m = Tensor::new(dt, &[4], &Layout::contiguous());
            let mut a = Tensor::new(DType::I64, &[4], &Layout::contiguous());
            // SAFETY: distinct buffers owned by the test.
            unsafe {
                reduce(ReduceOp::Max, &x.view(), &m.view(), dim, false).unwrap();
                reduce(ReduceOp::Argmax, &x.view(), &a.view(), dim, false).unwrap();
            }
            let got: Vec<f64> = (0..4).map(|i| a.get(i)).collect();
            assert_eq!(
                got,
                [1.0, 1.0, 0.0, 2.0],
                "{dt:?} argmax (first max, first NaN)"
            );
            assert_eq!((m.get(0), m.get(2), m.get(3)), (3.0, -inf, inf));
            assert!(m.get(1).is_nan(), "max propagates NaN");
        }
    }
}

#[test]
fn sum_squares_any_layout() {
    let shapes: [&[i64]; 7] = [
        &[],
        &[0],
        &[1],
        &[7, 9],
        &[2, 3, 5],
        &[1000, 1000],
        &[600, 500],
    ];
    for dt in FLOATS {
        for shape in shapes {
            let r = shape.len();
            for li in [
                Layout::contiguous(),
                Layout::transposed(r),
                Layout::messy(r),
                Layout::padded(5),
            ] {
                if shape.iter().product::<i64>() > 1000 && dt != DType::F32 && li.pad == 0 {
                    continue;
                }
                let mut x = Tensor::from_fn(dt, shape, &li, |i| rnd(2, i));
                let mut out = Tensor::new(DType::F32, &[], &Layout::contiguous());
                // SAFETY: distinct buffers owned by the test.
                unsafe { sum_squares(&x.view(), &out.view()).unwrap() };
                let want: f64 = (0..x.numel()).map(|i| x.get(i) * x.get(i)).sum();
                assert_close(
                    out.get(0),
                    want,
                    2.0 * eps(DType::F32) * want,
                    &format!("{dt:?} {shape:?} {li:?}"),
                );
            }
        }
    }
}

#[test]
fn rejects_bad_arguments() {
    let l = Layout::contiguous();
    let mut x = Tensor::random(DType::F32, &[3, 4], &l, 1);
    let mut o3 = Tensor::new(DType::F32, &[3], &l);
    let mut o4 = Tensor::new(DType::F32, &[4], &l);
    let mut i3 = Tensor::new(DType::I32, &[3], &l);
    let mut s = Tensor::new(DType::F32, &[1], &l);
    let xv = x.view();
    // SAFETY: test-owned buffers; every call must fail before touching memory.
    unsafe {
        let sum = ReduceOp::Sum;
        assert!(
            reduce(sum, &xv, &o3.view(), 0, false).is_err(),
            "wrong out shape"
        );
        assert!(
            reduce(sum, &xv, &o4.view(), 2, false).is_err(),
            "dim out of range"
        );
        let am = reduce(ReduceOp::Argmax, &xv, &i3.view(), 1, false);
        assert!(am.is_err(), "argmax writes i64");
        assert!(sum_squares(&xv, &s.view()).is_err(), "out must be 0-d");
    }
}

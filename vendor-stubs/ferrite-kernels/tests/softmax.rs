//! `softmax` over the last dimension against a stable f64 reference: every
//! float dtype, strided and transposed rows, in place, empty and scalar
//! shapes, large inputs (1000.0) that would overflow a naive version, rows of
//! `-inf`/`+inf`/NaN, long rows and many rows (multi-threaded).

mod common;

use common::{FLOATS, Layout, Tensor, assert_close, eps};
use ferrite_kernels::{DType, softmax};

fn reference(row: &[f64]) -> Vec<f64> {
    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = row.iter().map(|&x| (x - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|&v| v / s).collect()
}

fn check(input: &Tensor, out: &Tensor, ctx: &str) {
    let dt = out.dtype;
    let r = out.shape.len();
    let l = if r == 0 { 1 } else { out.shape[r - 1] as usize };
    if l == 0 || out.numel() == 0 {
        return;
    }
    let rows = out.numel() / l;
    let (rel, abs) = match dt {
        DType::F64 => (1e-12, 0.0),
        DType::F32 => (1e-5, 1e-40),
        DType::F16 => (4.0 * eps(dt), 2f64.powi(-24)),
        _ => (4.0 * eps(dt), 1e-38),
    };
    for row in 0..rows {
        let xs: Vec<f64> = (0..l).map(|j| input.get(row * l + j)).collect();
        let want = reference(&xs);
        for (j, &w) in want.iter().enumerate() {
            assert_close(
                out.get(row * l + j),
                w,
                rel * w.abs() + abs,
                &format!("{ctx} {dt:?} row {row} col {j}"),
            );
        }
    }
}

#[test]
fn shapes_and_layouts() {
    let shapes: [&[i64]; 9] = [
        &[],
        &[1],
        &[5],
        &[3, 7],
        &[2, 3, 10],
        &[4, 0],
        &[0, 4],
        &[2, 1, 9],
        &[3, 600],
    ];
    for dt in FLOATS {
        for shape in shapes {
            let r = shape.len();
            let last: Vec<usize> = (r.saturating_sub(1)..r).collect();
            let layouts = [
                (Layout::contiguous(), Layout::contiguous()),
                (Layout::transposed(r), Layout::contiguous()),
                (Layout::contiguous(), Layout::messy(r)),
                (Layout::flipped(&last), Layout::padded(2)),
            ];
            for (k, (li, lo)) in layouts.iter().enumerate() {
                let mut input = Tensor::from_fn(dt, shape, li, |i| common::rnd(4, i) * 5.0);
                let mut out = Tensor::new(dt, shape, lo);
                out.fill_storage(9.0);
                // SAFETY: distinct buffers owned by the test.
                unsafe { softmax(&input.view(), &out.view()).unwrap() };
                check(&input, &out, &format!("{shape:?} layouts#{k}"));
                for p in out.padding_positions() {
                    assert_eq!(out.get_raw(p), 9.0);
                }
            }
        }
    }
}

#[test]
fn in_place() {
    for dt in FLOATS {
        for layout in [Layout::contiguous(), Layout::messy(2)] {
            let f = |i: usize| common::rnd(8, i) * 3.0;
            let mut t = Tensor::from_fn(dt, &[6, 33], &layout, f);
            let orig = Tensor::from_fn(dt, &[6, 33], &layout, f);
            let v = t.view();
            // SAFETY: out is exactly the input.
            unsafe { softmax(&v, &v).unwrap() };
            check(&orig, &t, "in place");
        }
    }
}

#[test]
fn large_values_do_not_overflow() {
    for dt in FLOATS {
        let vals = [1000.0, 1000.0, 999.0, 990.0, -1000.0];
        let mut input = Tensor::from_fn(dt, &[2, 5], &Layout::contiguous(), |i| vals[i % 5]);
        let mut out = Tensor::new(dt, &[2, 5], &Layout::contiguous());
        // SAFETY: distinct buffers owned by the test.
        unsafe { softmax(&input.view(), &out.view()).unwrap() };
        for i in 0..10 {
            assert!(out.get(i).is_finite(), "{dt:?} elem {i} = {}", out.get(i));
        }
        check(&input, &out, "1000.0 inputs");
        if dt == DType::BF16 {
            continue; // 999 and 990 are not representable; `check` covered it.
        }
        let e1 = (-1f64).exp();
        let want0 = 1.0 / (2.0 + e1 + (-10f64).exp());
        assert!(
            (out.get(0) - want0).abs() < 4.0 * eps(dt),
            "{dt:?} {} vs {want0}",
            out.get(0)
        );
    }
}

#[test]
fn infinities_and_nan() {
    let inf = f64::INFINITY;
    let rows: [[f64; 4]; 5] = [
        [-inf, -inf, -inf, -inf], // all -inf: NaN
        [1.0, -inf, 2.0, -inf],   // some -inf: zeros there
        [inf, 1.0, 2.0, 3.0],     // +inf: NaN (inf - inf)
        [f64::NAN, 1.0, 2.0, 3.0],
        [0.0, 0.0, 0.0, 0.0],
    ];
    for dt in FLOATS {
        let mut input = Tensor::from_fn(dt, &[5, 4], &Layout::contiguous(), |i| rows[i / 4][i % 4]);
        let mut out = Tensor::new(dt, &[5, 4], &Layout::contiguous());
        // SAFETY: distinct buffers owned by the test.
        unsafe { softmax(&input.view(), &out.view()).unwrap() };
        for j in 0..4 {
            assert!(out.get(j).is_nan(), "{dt:?} all -inf row");
            assert!(out.get(8 + j).is_nan(), "{dt:?} +inf row");
            assert!(out.get(12 + j).is_nan(), "{dt:?} NaN row");
            assert_eq!(out.get(16 + j), 0.25);
        }
        assert_eq!(out.get(5), 0.0);
        assert_eq!(out.get(7), 0.0);
        check(&input, &out, "infinities");
    }
}

#[test]
fn many_rows_and_long_rows() {
    for dt in FLOATS {
        for (shape, layout) in [
            (vec![300i64, 257], Layout::contiguous()),
            (vec![257, 300], Layout::transposed(2)),
            (vec![4, 20000], Layout::contiguous()),
            (vec![2, 3000], Layout::messy(2)),
        ] {
            let mut input = Tensor::from_fn(dt, &shape, &layout, |i| common::rnd(9, i) * 8.0);
            let mut out = Tensor::new(dt, &shape, &Layout::contiguous());
            // SAFETY: distinct buffers owned by the test.
            unsafe { softmax(&input.view(), &out.view()).unwrap() };
            check(&input, &out, &format!("{shape:?}"));
        }
    }
}

#[test]
fn rejects_bad_arguments() {
    let mut a = Tensor::random(DType::F32, &[3, 4], &Layout::contiguous(), 1);
    let mut b = Tensor::new(DType::F32, &[4, 3], &Layout::contiguous());
    let mut c = Tensor::new(DType::F64, &[3, 4], &Layout::contiguous());
    let mut i = Tensor::new(DType::I32, &[3, 4], &Layout::contiguous());
    // SAFETY: test-owned buffers; every call must fail before touching memory.
    unsafe {
        assert!(softmax(&a.view(), &b.view()).is_err());
        assert!(softmax(&a.view(), &c.view()).is_err());
        let iv = i.view();
        assert!(softmax(&iv, &iv).is_err());
    }
}

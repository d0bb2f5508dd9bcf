//! `fill` and `copy` on every dtype and a variety of layouts.

mod common;

use common::{Layout, Tensor};
use ferrite_kernels::{DType, copy, fill};

const ALL: [DType; 8] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::F64,
    DType::I32,
    DType::I64,
    DType::U8,
    DType::Bool,
];

fn shapes() -> Vec<Vec<i64>> {
    vec![
        vec![],
        vec![1],
        vec![16],
        vec![0, 3],
        vec![3, 0],
        vec![2, 1, 5],
        vec![4, 7, 3],
        vec![300, 257],
    ]
}

fn layouts(rank: usize) -> Vec<Layout> {
    vec![
        Layout::contiguous(),
        Layout::transposed(rank),
        Layout::padded(2),
        Layout::flipped(if rank > 0 { &[0] } else { &[] }),
        Layout::messy(rank),
    ]
}

#[test]
fn fill_sets_every_element_and_nothing_else() {
    for dt in ALL {
        for shape in shapes() {
            for layout in layouts(shape.len()) {
                let mut t = Tensor::new(dt, &shape, &layout);
                t.fill_storage(7.0);
                // SAFETY: the view addresses the tensor's own buffer.
                unsafe { fill(&t.view(), 1.0).unwrap() };
                for i in 0..t.numel() {
                    assert_eq!(t.get(i), 1.0, "{dt:?} {shape:?} {layout:?} elem {i}");
                }
                for p in t.padding_positions() {
                    assert_eq!(t.get_raw(p), 7.0, "{dt:?} {shape:?} padding touched");
                }
            }
        }
    }
}

#[test]
fn fill_converts_the_value() {
    let cases: [(DType, f64, f64); 9] = [
        (DType::F32, 0.1, 0.1f32 as f64),
        (
            DType::F16,
            1.0 / 3.0,
            ferrite_kernels::f16_from_f64(1.0 / 3.0).to_f64(),
        ),
        (
            DType::BF16,
            1.0 / 3.0,
            ferrite_kernels::bf16_from_f64(1.0 / 3.0).to_f64(),
        ),
        (DType::F16, 1e6, f64::INFINITY),
        (DType::I32, -3.7, -3.0),
        (DType::I64, 1e30, i64::MAX as f64),
        (DType::U8, 300.0, 255.0),
        (DType::U8, -5.0, 0.0),
        (DType::Bool, 0.25, 1.0),
    ];
    for (dt, v, want) in cases {
        let mut t = Tensor::new(dt, &[5], &Layout::contiguous());
        // SAFETY: the view addresses the tensor's own buffer.
        unsafe { fill(&t.view(), v).unwrap() };
        for i in 0..5 {
            assert_eq!(t.get(i), want, "{dt:?} fill {v}");
        }
    }
    let mut t = Tensor::new(DType::F32, &[3], &Layout::contiguous());
    // SAFETY: the view addresses the tensor's own buffer.
    unsafe { fill(&t.view(), f64::NAN).unwrap() };
    assert!(t.get(2).is_nan());
}

#[test]
fn copy_between_layouts() {
    for dt in ALL {
        for shape in shapes() {
            let r = shape.len();
            for (si, sl) in layouts(r).iter().enumerate() {
                for dl in layouts(r) {
                    let src_val = |i: usize| {
                        if dt == DType::Bool {
                            (i % 2) as f64
                        } else {
                            (i % 97) as f64
                        }
                    };
                    let mut src = Tensor::from_fn(dt, &shape, sl, src_val);
                    let mut dst = Tensor::new(dt, &shape, &dl);
                    dst.fill_storage(3.0);
                    // SAFETY: distinct buffers owned by the test.
                    unsafe { copy(&src.view(), &dst.view()).unwrap() };
                    for i in 0..src.numel() {
                        assert_eq!(
                            dst.bits(i),
                            src.bits(i),
                            "{dt:?} {shape:?} src#{si} -> {dl:?} elem {i}"
                        );
                    }
                    for p in dst.padding_positions() {
                        assert_eq!(dst.get_raw(p), 3.0);
                    }
                }
            }
        }
    }
}

#[test]
fn copy_preserves_nan_payloads_and_in_place_is_a_no_op() {
    let mut src = Tensor::new(DType::F32, &[4], &Layout::contiguous());
    for (i, bits) in [0x7FC0_0001u64, 0xFF80_0001, 0x8000_0000, 0x0000_0001]
        .into_iter()
        .enumerate()
    {
        src.set_bits(i, bits);
    }
    let mut dst = Tensor::new(DType::F32, &[4], &Layout::flipped(&[0]));
    // SAFETY: distinct buffers owned by the test.
    unsafe { copy(&src.view(), &dst.view()).unwrap() };
    for i in 0..4 {
        assert_eq!(dst.bits(i), src.bits(i));
    }
    let v = src.view();
    // SAFETY: identical views are allowed.
    unsafe { copy(&v, &v).unwrap() };
    assert_eq!(src.bits(0), 0x7FC0_0001);
}

#[test]
fn copy_from_broadcast_source() {
    // A [3] source expanded to [4, 3] with a zero stride.
    let mut src = Tensor::from_fn(DType::F64, &[3], &Layout::contiguous(), |i| i as f64 + 1.0);
    let mut dst = Tensor::new(DType::F64, &[4, 3], &Layout::transposed(2));
    let sv = src.view();
    let shape = [4i64, 3];
    let strides = [0i64, 1];
    let expanded = ferrite_kernels::View {
        shape: &shape,
        strides: &strides,
        ..sv
    };
    // SAFETY: distinct buffers owned by the test.
    unsafe { copy(&expanded, &dst.view()).unwrap() };
    for i in 0..12 {
        assert_eq!(dst.get(i), (i % 3) as f64 + 1.0);
    }
}

/// More non-collapsible dimensions than a plan holds inline.
#[test]
fn many_dimensions() {
    let shape = [2i64, 3, 2, 2, 3, 2, 2, 2, 3, 2];
    let r = shape.len();
    let reversed = Layout {
        order: Some((0..r).rev().collect()),
        pad: 1,
        flip: vec![1, 4],
    };
    for dt in [DType::F32, DType::F16, DType::U8] {
        let mut src = Tensor::from_fn(dt, &shape, &reversed, |i| (i % 200) as f64);
        let mut dst = Tensor::new(dt, &shape, &Layout::messy(r));
        // SAFETY: distinct buffers owned by the test.
        unsafe { copy(&src.view(), &dst.view()).unwrap() };
        for i in 0..src.numel() {
            assert_eq!(dst.get(i), src.get(i), "{dt:?} elem {i}");
        }
        // SAFETY: the view addresses the tensor's own buffer.
        unsafe { fill(&src.view(), 5.0).unwrap() };
        assert!((0..src.numel()).all(|i| src.get(i) == 5.0));
    }
}

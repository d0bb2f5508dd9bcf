//! The AVX2 builds of the kernels must give bit-identical results to the
//! baseline builds (no implicit FMA, same reduction order). Runs every
//! dispatched kernel both ways on awkward data and compares the bits.

mod common;

use common::parity::{awkward, bits};
use common::{FLOATS, Layout, Tensor};
use ferrite_kernels::{BinaryOp, binary, cast, matmul, set_simd_enabled, softmax};

/// Runs `f` with and without SIMD on fresh outputs and compares the bits.
fn both_ways(what: &str, mut f: impl FnMut() -> Tensor) {
    set_simd_enabled(true);
    let fast = bits(&f());
    set_simd_enabled(false);
    let base = bits(&f());
    set_simd_enabled(true);
    let diff = fast.iter().zip(&base).position(|(x, y)| x != y);
    if let Some(i) = diff {
        panic!(
            "{what}: element {i}: SIMD {:#x} vs baseline {:#x}",
            fast[i], base[i]
        );
    }
    assert!(fast.iter().any(|&b| b != u64::MAX), "{what}: all NaN");
}

#[test]
fn simd_and_baseline_agree_bit_for_bit() {
    let shape = [37i64, 129];
    for dt in FLOATS {
        for (k, layout) in [Layout::contiguous(), Layout::messy(2)].iter().enumerate() {
            for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
                both_ways(&format!("binary {op:?} {dt:?} #{k}"), || {
                    let mut a = awkward(dt, &shape, layout, 1);
                    let mut b = awkward(dt, &shape[1..], &Layout::contiguous(), 2);
                    let mut out = Tensor::new(dt, &shape, layout);
                    // SAFETY: distinct buffers owned by the test.
                    unsafe { binary(op, &a.view(), &b.view(), &out.view(), 0.75).unwrap() };
                    out
                });
            }
            both_ways(&format!("softmax {dt:?} #{k}"), || {
                let mut a = awkward(dt, &shape, layout, 3);
                let mut out = Tensor::new(dt, &shape, &Layout::contiguous());
                // SAFETY: distinct buffers owned by the test.
                unsafe { softmax(&a.view(), &out.view()).unwrap() };
                out
            });
            both_ways(&format!("matmul {dt:?} #{k}"), || {
                let mut a = Tensor::random(dt, &[19, 23], layout, 4);
                let mut b = Tensor::random(dt, &[23, 17], &Layout::transposed(2), 5);
                let mut out = Tensor::random(dt, &[19, 17], layout, 6);
                // SAFETY: distinct buffers owned by the test.
                unsafe {
                    matmul(&a.view(), &b.view(), &out.view(), false, false, 1.5, 0.5).unwrap()
                };
                out
            });
            for dst in FLOATS {
                both_ways(&format!("cast {dt:?}->{dst:?} #{k}"), || {
                    let mut a = awkward(dt, &shape, layout, 7);
                    let mut out = Tensor::new(dst, &shape, &Layout::contiguous());
                    // SAFETY: distinct buffers owned by the test.
                    unsafe { cast(&a.view(), &out.view()).unwrap() };
                    out
                });
            }
        }
    }
}

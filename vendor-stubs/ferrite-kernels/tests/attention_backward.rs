//! `attention_backward` against the analytic f64 reference (itself checked
//! by finite differences in `attention.rs`), fed by the forward kernel's
//! `out` and `lse`: f32/f16/bf16, causal offsets both ways, GQA 8/2 (grad_k
//! and grad_v summed over the query heads of a group), empty dimensions,
//! strided layouts, outputs fully overwritten (NaN-filled before), several
//! blocks, and the threaded, key-chunked path inside a 4-thread pool.

mod common;

use common::attention::{backward, block_cases, case, forward, layouts, small_cases};
use common::{FLOATS32, Layout, Tensor};
use ferrite_kernels::{DType, attention_backward};

#[test]
fn small_shapes_all_dtypes_and_layouts() {
    for dt in FLOATS32 {
        for c in small_cases() {
            for [lq, lk, lo] in layouts() {
                backward(&mut forward(&c, dt, &lq, &lk, &lo));
            }
        }
    }
}

#[test]
fn several_blocks() {
    let l = Layout::contiguous;
    for dt in FLOATS32 {
        for c in block_cases() {
            backward(&mut forward(&c, dt, &l(), &l(), &l()));
        }
    }
    let c = case(1, 4, 2, 100, 200, 16, true);
    backward(&mut forward(
        &c,
        DType::F32,
        &Layout::messy(4),
        &Layout::transposed(4),
        &Layout::padded(1),
    ));
}

#[test]
fn threaded_and_key_chunked() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(4)
        .build()
        .unwrap();
    pool.install(|| {
        let l = Layout::contiguous;
        // One (batch, kv head): keys split into chunks whose partial dQ are
        // summed; then enough kv heads for one task each.
        for c in [
            case(1, 2, 1, 300, 300, 32, true),
            case(2, 4, 2, 200, 256, 24, false),
        ] {
            for dt in [DType::F32, DType::BF16] {
                backward(&mut forward(&c, dt, &l(), &l(), &l()));
            }
        }
    });
}

#[test]
fn rejects_bad_arguments() {
    let c = case(1, 2, 1, 4, 4, 4, false);
    let (qs, ks) = (c.q_shape(), c.k_shape());
    let l = Layout::contiguous();
    let t = |dt, s: &[i64]| Tensor::new(dt, s, &l);
    let (mut q, mut k, mut v) = (t(DType::F32, &qs), t(DType::F32, &ks), t(DType::F32, &ks));
    let (mut o, mut lse, mut go) = (
        t(DType::F32, &qs),
        t(DType::F32, &qs[..3]),
        t(DType::F32, &qs),
    );
    let (mut dq, mut dk, mut dv) = (t(DType::F32, &qs), t(DType::F32, &ks), t(DType::F32, &ks));
    let mut dk_wrong = t(DType::F32, &qs);
    let mut dq16 = t(DType::F16, &qs);
    let (qv, kv, vv, ov, lv, gv) = (
        q.view(),
        k.view(),
        v.view(),
        o.view(),
        lse.view(),
        go.view(),
    );
    // SAFETY: test-owned buffers; every call must fail before touching memory.
    unsafe {
        let bad_shape = attention_backward(
            &qv,
            &kv,
            &vv,
            &ov,
            &lv,
            &gv,
            &dq.view(),
            &dk_wrong.view(),
            &dv.view(),
            1.0,
            false,
        );
        assert!(bad_shape.is_err(), "grad_k must have k's shape");
        let bad_dtype = attention_backward(
            &qv,
            &kv,
            &vv,
            &ov,
            &lv,
            &gv,
            &dq16.view(),
            &dk.view(),
            &dv.view(),
            1.0,
            false,
        );
        assert!(bad_dtype.is_err(), "grad_q must have q's dtype");
    }
}

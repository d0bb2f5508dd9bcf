//! `attention` (forward) against a naive f64 reference: f32/f16/bf16,
//! causal masks with seq_q < seq_kv and seq_q > seq_kv (queries that see no
//! key give zeros and lse = -inf), grouped-query heads (8 query / 2 kv),
//! size-1 and empty dimensions, [B, S, H, D] storage and padded/flipped
//! layouts, sizes spanning several blocks, a 4-thread pool. The reference's
//! own backward is checked here by finite differences.

mod common;

use common::attention::{
    Case, backward_ref, block_cases, case, forward, forward_ref, layouts, small_cases,
};
use common::{FLOATS32, Layout, Tensor, rnd};
use ferrite_kernels::{DType, attention};

#[test]
fn reference_backward_matches_finite_differences() {
    for causal in [false, true] {
        let c = Case {
            b: 1,
            hq: 2,
            hkv: 1,
            sq: 3,
            skv: 4,
            d: 2,
            causal,
        };
        let make = |seed, n: usize| (0..n).map(|i| rnd(seed, i)).collect::<Vec<f64>>();
        let (nq, nk) = (c.b * c.hq * c.sq * c.d, c.b * c.hkv * c.skv * c.d);
        let (q, k, v, go) = (make(1, nq), make(2, nk), make(3, nk), make(4, nq));
        let loss = |q: &[f64], k: &[f64], v: &[f64]| {
            let (o, _) = forward_ref(&c, q, k, v, 0.6);
            o.iter().zip(&go).map(|(a, b)| a * b).sum::<f64>()
        };
        let grads = backward_ref(&c, &q, &k, &v, &go, 0.6);
        let inputs = [q, k, v];
        for (which, grad) in grads.iter().enumerate() {
            for e in 0..grad.len() {
                let mut plus = inputs.clone();
                let mut minus = inputs.clone();
                plus[which][e] += 1e-6;
                minus[which][e] -= 1e-6;
                let fd = (loss(&plus[0], &plus[1], &plus[2])
                    - loss(&minus[0], &minus[1], &minus[2]))
                    / 2e-6;
                assert!(
                    (fd - grad[e]).abs() < 1e-7,
                    "input {which} elem {e}: {fd} vs {}",
                    grad[e]
                );
            }
        }
    }
}

#[test]
fn small_shapes_all_dtypes_and_layouts() {
    for dt in FLOATS32 {
        for c in small_cases() {
            for [lq, lk, lo] in layouts() {
                forward(&c, dt, &lq, &lk, &lo);
            }
        }
    }
}

#[test]
fn several_blocks_and_threads() {
    let l = Layout::contiguous;
    for dt in FLOATS32 {
        for c in block_cases() {
            forward(&c, dt, &l(), &l(), &l());
        }
    }
    let c = case(1, 4, 2, 100, 200, 16, true);
    forward(
        &c,
        DType::F32,
        &Layout::messy(4),
        &Layout::transposed(4),
        &Layout::padded(1),
    );
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(4)
        .build()
        .unwrap();
    pool.install(|| {
        forward(
            &case(2, 4, 2, 200, 256, 24, true),
            DType::BF16,
            &l(),
            &l(),
            &l(),
        )
    });
}

#[test]
fn rejects_bad_arguments() {
    let c = case(1, 3, 2, 4, 4, 4, false);
    let (qs, ks) = (c.q_shape(), c.k_shape());
    let l = Layout::contiguous();
    let mut q = Tensor::new(DType::F32, &qs, &l);
    let mut k = Tensor::new(DType::F32, &ks, &l);
    let mut v = Tensor::new(DType::F32, &ks, &l);
    let mut out = Tensor::new(DType::F32, &qs, &l);
    let mut lse = Tensor::new(DType::F32, &qs[..3], &l);
    let mut k64 = Tensor::new(DType::F64, &ks, &l);
    let mut lse16 = Tensor::new(DType::F16, &qs[..3], &l);
    let (qv, vv, ov) = (q.view(), v.view(), out.view());
    // SAFETY: test-owned buffers; every call must fail before touching memory.
    unsafe {
        // 3 query heads do not share 2 kv heads.
        assert!(attention(&qv, &k.view(), &vv, &ov, &lse.view(), 1.0, false).is_err());
        assert!(attention(&qv, &k64.view(), &vv, &ov, &lse.view(), 1.0, false).is_err());
        assert!(attention(&qv, &k.view(), &vv, &ov, &lse16.view(), 1.0, false).is_err());
    }
}

//! Every backward operator of the reference checked against central finite
//! differences of its forward operator (or, for the linear operators rope
//! and embedding, against the transpose of the forward), on small random
//! inputs: the loss is `L = <forward(x), W>` for a random `W`, whose
//! gradient the backward operator computes from `grad_out = W`.

mod common;

use common::{Rng, assert_close, check_grad, inner};
use polychip_conformance::reference::{self as r, Dense, Indices};

#[test]
fn relu_silu_gelu_backward() {
    let mut rng = Rng::new(1);
    let shape = [3, 5];
    // relu away from its kink at 0.
    let x = Dense::from_fn(&shape, |_| {
        let v = rng.uniform(0.1, 2.0);
        if rng.below(2) == 0 { v } else { -v }
    });
    let w = rng.dense(&shape, -1.0, 1.0);
    type Op = fn(&Dense) -> Result<Dense, r::RefError>;
    type Bwd = fn(&Dense, &Dense) -> Result<Dense, r::RefError>;
    let ops: [(&str, Op, Bwd); 3] = [
        ("relu", r::relu, r::relu_backward),
        ("silu", r::silu, r::silu_backward),
        ("gelu", r::gelu, r::gelu_backward),
    ];
    for (name, forward, backward) in ops {
        let analytic = backward(&w, &x).unwrap();
        check_grad(&analytic, &x, name, |x| inner(&forward(x).unwrap(), &w));
    }
    // Wider inputs for the smooth ones.
    let x = rng.dense(&shape, -5.0, 5.0);
    check_grad(&r::gelu_backward(&w, &x).unwrap(), &x, "gelu wide", |x| {
        inner(&r::gelu(x).unwrap(), &w)
    });
    check_grad(&r::silu_backward(&w, &x).unwrap(), &x, "silu wide", |x| {
        inner(&r::silu(x).unwrap(), &w)
    });
}

#[test]
fn swiglu_backward() {
    let mut rng = Rng::new(2);
    let shape = [2, 3, 4];
    let gate = rng.dense(&shape, -3.0, 3.0);
    let up = rng.dense(&shape, -2.0, 2.0);
    let w = rng.dense(&shape, -1.0, 1.0);
    let (grad_gate, grad_up) = r::swiglu_backward(&gate, &up, &w).unwrap();
    check_grad(&grad_gate, &gate, "swiglu gate", |g| {
        inner(&r::swiglu(g, &up).unwrap(), &w)
    });
    check_grad(&grad_up, &up, "swiglu up", |u| {
        inner(&r::swiglu(&gate, u).unwrap(), &w)
    });
}

#[test]
fn softmax_and_log_softmax_backward() {
    let mut rng = Rng::new(3);
    let shape = [2, 3, 5];
    let x = rng.dense(&shape, -3.0, 3.0);
    let w = rng.dense(&shape, -1.0, 1.0);
    let y = r::softmax(&x).unwrap();
    check_grad(&r::softmax_backward(&y, &w).unwrap(), &x, "softmax", |x| {
        inner(&r::softmax(x).unwrap(), &w)
    });
    let y = r::log_softmax(&x).unwrap();
    check_grad(
        &r::log_softmax_backward(&y, &w).unwrap(),
        &x,
        "log_softmax",
        |x| inner(&r::log_softmax(x).unwrap(), &w),
    );
}

#[test]
fn rms_norm_backward() {
    let mut rng = Rng::new(4);
    let (x, weight) = (rng.dense(&[2, 3, 6], -2.0, 2.0), rng.dense(&[6], 0.5, 1.5));
    let w = rng.dense(&[2, 3, 6], -1.0, 1.0);
    let eps = 1e-3;
    let (_, inv_rms) = r::rms_norm(&x, &weight, eps).unwrap();
    let (grad_input, grad_weight) = r::rms_norm_backward(&w, &x, &weight, &inv_rms).unwrap();
    check_grad(&grad_input, &x, "rms_norm input", |x| {
        inner(&r::rms_norm(x, &weight, eps).unwrap().0, &w)
    });
    check_grad(&grad_weight, &weight, "rms_norm weight", |wt| {
        inner(&r::rms_norm(&x, wt, eps).unwrap().0, &w)
    });
}

#[test]
fn layer_norm_backward() {
    let mut rng = Rng::new(5);
    let x = rng.dense(&[4, 7], -2.0, 2.0);
    let (weight, bias) = (rng.dense(&[7], 0.5, 1.5), rng.dense(&[7], -1.0, 1.0));
    let w = rng.dense(&[4, 7], -1.0, 1.0);
    let eps = 1e-3;
    let (_, mean, rstd) = r::layer_norm(&x, &weight, &bias, eps).unwrap();
    let (gi, gw, gb) = r::layer_norm_backward(&w, &x, &weight, &mean, &rstd).unwrap();
    let loss =
        |x: &Dense, wt: &Dense, b: &Dense| inner(&r::layer_norm(x, wt, b, eps).unwrap().0, &w);
    check_grad(&gi, &x, "layer_norm input", |x| loss(x, &weight, &bias));
    check_grad(&gw, &weight, "layer_norm weight", |wt| loss(&x, wt, &bias));
    check_grad(&gb, &bias, "layer_norm bias", |b| loss(&x, &weight, b));
}

/// cos/sin tables of real angles, so the rotation is orthogonal.
fn rope_tables(rng: &mut Rng, seq: usize, half: usize) -> (Dense, Dense) {
    let angles = rng.dense(&[seq, half], -3.0, 3.0);
    (angles.map(f64::cos), angles.map(f64::sin))
}

#[test]
fn rope_backward_is_the_transpose_and_the_inverse() {
    let mut rng = Rng::new(6);
    let shape = [2, 3, 2, 8];
    let (cos, sin) = rope_tables(&mut rng, 3, 4);
    for interleaved in [false, true] {
        let x = rng.dense(&shape, -1.0, 1.0);
        let y = rng.dense(&shape, -1.0, 1.0);
        let fx = r::rope(&x, &cos, &sin, interleaved).unwrap();
        let bty = r::rope_backward(&y, &cos, &sin, interleaved).unwrap();
        let (lhs, rhs) = (inner(&fx, &y), inner(&x, &bty));
        assert!(
            (lhs - rhs).abs() < 1e-12,
            "<rope x, y> {lhs} != <x, rope_backward y> {rhs}"
        );
        // The backward is also the gradient of <rope(x), y> by differences.
        check_grad(&bty, &x, "rope", |x| {
            inner(&r::rope(x, &cos, &sin, interleaved).unwrap(), &y)
        });
        let back = r::rope_backward(&fx, &cos, &sin, interleaved).unwrap();
        assert_close(&back, &x, 0.0, 1e-12, "rope_backward(rope(x)) == x");
    }
    // With arbitrary tables (not rotations) it is still the transpose.
    let (cos, sin) = (rng.dense(&[3, 4], -2.0, 2.0), rng.dense(&[3, 4], -2.0, 2.0));
    for interleaved in [false, true] {
        let (x, y) = (rng.dense(&shape, -1.0, 1.0), rng.dense(&shape, -1.0, 1.0));
        let lhs = inner(&r::rope(&x, &cos, &sin, interleaved).unwrap(), &y);
        let rhs = inner(&x, &r::rope_backward(&y, &cos, &sin, interleaved).unwrap());
        assert!((lhs - rhs).abs() < 1e-12);
    }
}

/// `op(a) @ b` through the reference matmul (`beta == 0`: a NaN `out` is not read).
fn product(a: &Dense, b: &Dense, out_shape: &[usize], transpose_a: bool) -> Dense {
    let out = Dense::full(out_shape, f64::NAN);
    r::matmul(a, b, &out, transpose_a, false, 1.0, 0.0).unwrap()
}

fn check_attention(seed: u64, shapes: [usize; 6], causal: bool) {
    let [b, hq, sq, hkv, skv, d] = shapes;
    let mut rng = Rng::new(seed);
    let q = rng.dense(&[b, hq, sq, d], -1.0, 1.0);
    let k = rng.dense(&[b, hkv, skv, d], -1.0, 1.0);
    let v = rng.dense(&[b, hkv, skv, d], -1.0, 1.0);
    let w = rng.dense(&[b, hq, sq, d], -1.0, 1.0);
    let scale = 1.0 / (d as f64).sqrt() * 1.7;
    let (out, lse) = r::attention(&q, &k, &v, scale, causal).unwrap();
    let (gq, gk, gv) = r::attention_backward(&q, &k, &v, &out, &lse, &w, scale, causal).unwrap();
    let what = format!("attention {shapes:?} causal {causal}");
    let loss = |q: &Dense, k: &Dense, v: &Dense| {
        inner(&r::attention(q, k, v, scale, causal).unwrap().0, &w)
    };
    check_grad(&gq, &q, &format!("{what} q"), |q| loss(q, &k, &v));
    check_grad(&gk, &k, &format!("{what} k"), |k| loss(&q, k, &v));
    check_grad(&gv, &v, &format!("{what} v"), |v| loss(&q, &k, v));
}

#[test]
fn attention_backward() {
    for causal in [false, true] {
        // [B, Hq, Sq, Hkv, Skv, D]
        check_attention(7, [1, 1, 3, 1, 3, 4], causal);
        check_attention(8, [2, 4, 3, 2, 5, 3], causal); // GQA, seq_q < seq_kv
        check_attention(9, [1, 3, 4, 1, 2, 2], causal); // MQA, seq_q > seq_kv
    }
}

#[test]
fn attention_queries_that_see_nothing_have_zero_gradient() {
    let mut rng = Rng::new(10);
    let (q, k, v) = (
        rng.dense(&[1, 2, 3, 2], -1.0, 1.0),
        rng.dense(&[1, 1, 1, 2], -1.0, 1.0),
        rng.dense(&[1, 1, 1, 2], -1.0, 1.0),
    );
    let w = rng.dense(&[1, 2, 3, 2], -1.0, 1.0);
    let (out, lse) = r::attention(&q, &k, &v, 0.5, true).unwrap();
    let (gq, _, _) = r::attention_backward(&q, &k, &v, &out, &lse, &w, 0.5, true).unwrap();
    for h in 0..2 {
        for i in 0..2 {
            // Query i sees keys j <= i - 2: none for i < 2.
            assert_eq!(lse.at(&[0, h, i]), f64::NEG_INFINITY);
            for c in 0..2 {
                assert_eq!(out.at(&[0, h, i, c]), 0.0);
                assert_eq!(gq.at(&[0, h, i, c]), 0.0);
            }
        }
    }
}

#[test]
fn embedding_backward_is_the_transpose_of_a_one_hot_matmul() {
    let mut rng = Rng::new(11);
    let (vocab, h) = (5, 3);
    let indices = Indices::new(&[2, 3], vec![4, 0, 4, 2, 4, 1]);
    let weight = rng.dense(&[vocab, h], -1.0, 1.0);
    let g = rng.dense(&[2, 3, h], -1.0, 1.0);
    let prev = rng.dense(&[vocab, h], -1.0, 1.0);
    // embedding(weight) == onehot @ weight, onehot [6, V].
    let onehot = Dense::from_fn(&[6, vocab], |i| {
        f64::from(indices.data[i[0]] == i[1] as i64)
    });
    let dense = product(&onehot, &weight, &[6, h], false);
    let looked_up = r::embedding(&weight, &indices).unwrap();
    assert_close(
        &looked_up,
        &dense.reshape(&[2, 3, h]),
        0.0,
        0.0,
        "embedding",
    );
    // Its backward, accumulated: prev + onehot^T @ g.
    let expected = r::matmul(&onehot, &g.reshape(&[6, h]), &prev, true, false, 1.0, 1.0).unwrap();
    let got = r::embedding_backward(&g, &indices, &prev).unwrap();
    assert_close(&got, &expected, 1e-15, 1e-15, "embedding_backward");
    // And the gradient by differences, from a zero previous gradient.
    let zero = Dense::zeros(&[vocab, h]);
    let analytic = r::embedding_backward(&g, &indices, &zero).unwrap();
    check_grad(&analytic, &weight, "embedding", |w| {
        inner(&r::embedding(w, &indices).unwrap(), &g)
    });
}

#[test]
fn cross_entropy_backward() {
    let mut rng = Rng::new(12);
    let logits = rng.dense(&[5, 4], -3.0, 3.0);
    let targets = Indices::new(&[5], vec![3, -100, 0, 2, -100]);
    let grad_loss = 0.75;
    let analytic = r::cross_entropy_backward(&logits, &targets, grad_loss, -100).unwrap();
    check_grad(&analytic, &logits, "cross_entropy", |l| {
        grad_loss * r::cross_entropy(l, &targets, -100).unwrap().data[0]
    });
    for c in 0..4 {
        assert_eq!(analytic.at(&[1, c]), 0.0);
        assert_eq!(analytic.at(&[4, c]), 0.0);
    }
    // An in-range ignore_index.
    let analytic = r::cross_entropy_backward(&logits, &targets, 1.0, 3).unwrap_err();
    assert!(analytic.message.contains("-100"), "{analytic}");
    let targets = Indices::new(&[5], vec![3, 1, 0, 3, 2]);
    let analytic = r::cross_entropy_backward(&logits, &targets, 1.0, 3).unwrap();
    check_grad(&analytic, &logits, "cross_entropy ignore 3", |l| {
        r::cross_entropy(l, &targets, 3).unwrap().data[0]
    });
}

#[test]
fn linear_backward_through_matmul_and_sum() {
    let mut rng = Rng::new(13);
    let (x, weight, bias) = (
        rng.dense(&[2, 3, 4], -1.0, 1.0),
        rng.dense(&[5, 4], -1.0, 1.0),
        rng.dense(&[5], -1.0, 1.0),
    );
    let g = rng.dense(&[2, 3, 5], -1.0, 1.0);
    let loss = |x: &Dense, w: &Dense, b: &Dense| inner(&r::linear(x, w, Some(b)).unwrap(), &g);
    // grad_input = g @ W; grad_weight = g^T @ x (rows flattened); grad_bias = sum of g over rows.
    let grad_input = product(&g, &weight, &[2, 3, 4], false);
    let g2 = g.reshape(&[6, 5]);
    let grad_weight = product(&g2, &x.reshape(&[6, 4]), &[5, 4], true);
    let grad_bias = r::sum(&g2, 0, false).unwrap();
    check_grad(&grad_input, &x, "linear input", |x| loss(x, &weight, &bias));
    check_grad(&grad_weight, &weight, "linear weight", |w| {
        loss(&x, w, &bias)
    });
    check_grad(&grad_bias, &bias, "linear bias", |b| loss(&x, &weight, b));
    // Without bias the bias does not matter.
    let no_bias = r::linear(&x, &weight, None).unwrap();
    let with_zero = r::linear(&x, &weight, Some(&Dense::zeros(&[5]))).unwrap();
    assert_eq!(no_bias, with_zero);
}

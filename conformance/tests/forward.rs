//! Hand-computed values of every forward operator of the reference on tiny
//! inputs, its edge cases (NaN, infinities, empty dimensions) and the cases
//! it refuses.

mod common;

use common::{assert_close, assert_values};
use polychip_conformance::reference::{self as r, Dense, Indices};

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;

fn v(data: &[f64]) -> Dense {
    Dense::new(&[data.len()], data.to_vec())
}

#[test]
fn dense_basics() {
    let t = Dense::new(&[2, 3], vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(t.at(&[1, 2]), 5.0);
    assert_eq!(t.numel(), 6);
    assert_eq!(Dense::scalar(7.0).numel(), 1);
    assert_eq!(Dense::zeros(&[2, 0, 3]).numel(), 0);
    assert_eq!(r::strides(&[2, 3, 4]), vec![12, 4, 1]);
    assert_eq!(r::unravel(17, &[2, 3, 4]), vec![1, 1, 1]);
    assert!(std::panic::catch_unwind(|| t.at(&[2, 0])).is_err());
}

#[test]
fn fill_copy_cast() {
    assert_eq!(r::fill(&[2], 1.5).unwrap(), v(&[1.5, 1.5]));
    assert_eq!(r::fill(&[], -2.0).unwrap(), Dense::scalar(-2.0));
    let x = v(&[1.0, -0.0, 3.0]);
    assert_eq!(r::copy(&x).unwrap(), x);
    assert_eq!(r::cast(&x).unwrap(), x);
}

#[test]
fn binary_broadcasting() {
    // [3, 1, 5] + 2 * [4, 1] -> [3, 4, 5].
    let a = Dense::from_fn(&[3, 1, 5], |i| (10 * i[0] + i[2]) as f64);
    let b = Dense::from_fn(&[4, 1], |i| 100.0 * i[0] as f64);
    let out = r::add(&a, &b, 2.0).unwrap();
    assert_eq!(out.shape, vec![3, 4, 5]);
    assert_eq!(out.at(&[2, 3, 4]), 24.0 + 600.0);
    assert_eq!(out.at(&[1, 0, 2]), 12.0);
    let out = r::sub(&a, &b, 0.5).unwrap();
    assert_eq!(out.at(&[2, 1, 3]), 23.0 - 50.0);
    assert_eq!(
        r::mul(&v(&[2.0, 3.0]), &Dense::scalar(4.0), 9.0).unwrap(),
        v(&[8.0, 12.0])
    );
    let q = r::div(&v(&[1.0, -1.0, 0.0]), &Dense::scalar(0.0), 1.0).unwrap();
    assert_eq!(q.data[..2], [INF, -INF]);
    assert!(q.data[2].is_nan());
    assert!(r::add(&Dense::zeros(&[2, 3]), &Dense::zeros(&[3, 2]), 1.0).is_err());
    assert_eq!(r::broadcast_shapes(&[0], &[1]), Some(vec![0]));
    assert_eq!(r::broadcast_shapes(&[], &[2]), Some(vec![2]));
    assert_eq!(
        r::add(&Dense::zeros(&[0, 3]), &v(&[1.0, 2.0, 3.0]), 1.0)
            .unwrap()
            .shape,
        [0, 3]
    );
}

#[test]
fn matmul_values_transposes_and_batches() {
    let a = Dense::new(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = Dense::new(&[3, 2], vec![7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
    let ab = [58.0, 64.0, 139.0, 154.0];
    // With beta == 0 the previous out is not read: NaN in it does not matter.
    let nan_out = Dense::full(&[2, 2], NAN);
    let out = r::matmul(&a, &b, &nan_out, false, false, 1.0, 0.0).unwrap();
    assert_values(&out, &[2, 2], &ab, 0.0, "a@b");
    let at = Dense::from_fn(&[3, 2], |i| a.at(&[i[1], i[0]]));
    let bt = Dense::from_fn(&[2, 3], |i| b.at(&[i[1], i[0]]));
    let out = r::matmul(&at, &bt, &nan_out, true, true, 1.0, 0.0).unwrap();
    assert_values(&out, &[2, 2], &ab, 0.0, "at^T @ bt^T");
    let out = r::matmul(&a, &bt, &nan_out, false, true, 2.0, 0.0).unwrap();
    assert_values(&out, &[2, 2], &ab.map(|x| 2.0 * x), 0.0, "alpha 2");
    let prev = Dense::new(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]);
    let out = r::matmul(&a, &b, &prev, false, false, 1.0, -1.0).unwrap();
    assert_values(&out, &[2, 2], &[57.0, 62.0, 136.0, 150.0], 0.0, "beta -1");
    // With alpha == 0, a and b are not read.
    let nan_a = Dense::full(&[2, 3], NAN);
    let out = r::matmul(&nan_a, &b, &prev, false, false, 0.0, 0.5).unwrap();
    assert_values(&out, &[2, 2], &[0.5, 1.0, 1.5, 2.0], 0.0, "alpha 0");
    let wrong_out = Dense::zeros(&[2, 3]);
    assert!(r::matmul(&a, &b, &wrong_out, false, false, 1.0, 0.0).is_err());
    assert!(r::matmul(&a, &a, &nan_out, false, false, 1.0, 0.0).is_err());
    assert!(r::matmul(&v(&[1.0]), &b, &nan_out, false, false, 1.0, 0.0).is_err());
    // Batch broadcasting: [2, 1, 2, 3] @ [3, 3, 2] -> [2, 3, 2, 2].
    let ba = Dense::from_fn(&[2, 1, 2, 3], |i| a.at(&i[2..]) * (i[0] + 1) as f64);
    let bb = Dense::from_fn(&[3, 3, 2], |i| b.at(&i[1..]) * (i[0] + 1) as f64);
    let out_shape = [2, 3, 2, 2];
    let out = r::matmul(&ba, &bb, &Dense::zeros(&out_shape), false, false, 1.0, 0.0).unwrap();
    assert_eq!(out.shape, out_shape);
    assert_eq!(out.at(&[1, 2, 1, 0]), 139.0 * 2.0 * 3.0);
    assert_eq!(out.at(&[0, 1, 0, 1]), 64.0 * 2.0);
    let bad_batch = Dense::zeros(&[3, 3, 3, 2]); // batch [3, 3] vs [2, 1]
    assert!(
        r::matmul(
            &ba,
            &bad_batch,
            &Dense::zeros(&out_shape),
            false,
            false,
            1.0,
            0.0
        )
        .is_err()
    );
    // K = 0: the product is 0.
    let (a0, b0) = (Dense::zeros(&[2, 0]), Dense::zeros(&[0, 3]));
    let out = r::matmul(&a0, &b0, &Dense::full(&[2, 3], NAN), false, false, 1.0, 0.0);
    assert_eq!(out.unwrap(), Dense::zeros(&[2, 3]));
}

#[test]
fn softmax_and_log_softmax() {
    let p = [0.09003057317038046, 0.24472847105479764, 0.6652409557748218];
    let out = r::softmax(&v(&[1000.0, 1001.0, 1002.0])).unwrap();
    assert_values(&out, &[3], &p, 1e-15, "softmax large");
    let out = r::log_softmax(&v(&[1000.0, 1001.0, 1002.0])).unwrap();
    assert_values(&out, &[3], &p.map(f64::ln), 1e-14, "log_softmax large");
    let out = r::softmax(&v(&[0.0, -INF])).unwrap();
    assert_values(&out, &[2], &[1.0, 0.0], 0.0, "masked");
    let all_masked = Dense::new(&[2, 2], vec![-INF, -INF, 0.0, 0.0]);
    let out = r::softmax(&all_masked).unwrap();
    assert_values(&out, &[2, 2], &[NAN, NAN, 0.5, 0.5], 0.0, "row of -inf");
    let out = r::log_softmax(&all_masked).unwrap();
    assert_values(
        &out,
        &[2, 2],
        &[NAN, NAN, -2f64.ln(), -2f64.ln()],
        1e-15,
        "log row of -inf",
    );
    assert!(r::softmax(&Dense::scalar(1.0)).is_err());
    assert_eq!(r::softmax(&Dense::zeros(&[3, 0])).unwrap().shape, [3, 0]);
}

#[test]
fn softmax_backward_values() {
    // y = [0.25, 0.75], g = [1, 0]: sum(g y) = 0.25, grad = y (g - 0.25).
    let y = v(&[0.25, 0.75]);
    let out = r::softmax_backward(&y, &v(&[1.0, 0.0])).unwrap();
    assert_values(&out, &[2], &[0.1875, -0.1875], 1e-16, "softmax_backward");
    let ly = y.map(f64::ln);
    let out = r::log_softmax_backward(&ly, &v(&[1.0, 2.0])).unwrap();
    assert_values(
        &out,
        &[2],
        &[1.0 - 0.75, 2.0 - 2.25],
        1e-15,
        "log_softmax_backward",
    );
}

#[test]
fn unary_values_and_edges() {
    let x = v(&[-1.0, 0.0, 1.0, 2.0]);
    assert_eq!(r::neg(&x).unwrap(), v(&[1.0, -0.0, -1.0, -2.0]));
    assert_values(
        &r::exp(&x).unwrap(),
        &[4],
        &[(-1f64).exp(), 1.0, 1f64.exp(), 2f64.exp()],
        0.0,
        "exp",
    );
    let edges = v(&[0.0, -1.0, -0.0, INF]);
    let l = r::log(&edges).unwrap();
    assert_eq!(l.data[0], -INF);
    assert!(l.data[1].is_nan());
    let s = r::sqrt(&edges).unwrap();
    assert!(
        s.data[2] == 0.0 && s.data[2].is_sign_negative(),
        "sqrt(-0) = -0"
    );
    assert_eq!(r::rsqrt(&v(&[0.0, 4.0])).unwrap(), v(&[INF, 0.5]));
    assert_eq!(r::exp(&v(&[1000.0])).unwrap(), v(&[INF]));
    assert_values(
        &r::tanh(&v(&[0.5])).unwrap(),
        &[1],
        &[0.46211715726000974],
        1e-16,
        "tanh",
    );
    let relu = r::relu(&v(&[-2.0, 3.0, NAN, -0.0])).unwrap();
    assert_values(&relu, &[4], &[0.0, 3.0, NAN, 0.0], 0.0, "relu");
    assert_values(
        &r::silu(&v(&[1.0, 0.0])).unwrap(),
        &[2],
        &[0.7310585786300049, 0.0],
        1e-16,
        "silu",
    );
    let gelu = r::gelu(&v(&[1.0, -1.0, 2.0])).unwrap();
    let expected = [0.8411919906082768, -0.15880800939172324, 1.954597694087775];
    assert_values(&gelu, &[3], &expected, 1e-15, "gelu");
    let p = r::pow_scalar(&v(&[2.0, NAN, -8.0, 0.0]), 0.0).unwrap();
    assert_eq!(p, v(&[1.0, 1.0, 1.0, 1.0]), "pow(x, 0) = 1");
    let p = r::pow_scalar(&v(&[2.0, -8.0, 0.0]), 3.0).unwrap();
    assert_eq!(p, v(&[8.0, -512.0, 0.0]));
    assert!(r::pow_scalar(&v(&[-8.0]), 1.0 / 3.0).unwrap().data[0].is_nan());
    assert_eq!(r::pow_scalar(&v(&[0.0]), -1.0).unwrap(), v(&[INF]));
    let sw = r::swiglu(&v(&[1.0, 0.0]), &v(&[2.0, 5.0])).unwrap();
    assert_values(&sw, &[2], &[2.0 * 0.7310585786300049, 0.0], 1e-15, "swiglu");
    assert!(r::swiglu(&v(&[1.0]), &v(&[1.0, 2.0])).is_err());
}

#[test]
fn activation_backward_values() {
    let g = v(&[2.0, 2.0, 2.0]);
    let x = v(&[-1.0, 0.0, 3.0]);
    assert_eq!(r::relu_backward(&g, &x).unwrap(), v(&[0.0, 0.0, 2.0]));
    // silu'(0) = 1/2, gelu'(0) = 1/2.
    assert_eq!(r::silu_backward(&v(&[1.0]), &v(&[0.0])).unwrap(), v(&[0.5]));
    assert_eq!(r::gelu_backward(&v(&[1.0]), &v(&[0.0])).unwrap(), v(&[0.5]));
    let (gg, gu) = r::swiglu_backward(&v(&[0.0]), &v(&[3.0]), &v(&[2.0])).unwrap();
    assert_eq!((gg, gu), (v(&[3.0]), v(&[0.0])));
}

#[test]
fn reductions() {
    let x = Dense::from_fn(&[2, 3], |i| (3 * i[0] + i[1]) as f64); // [[0,1,2],[3,4,5]]
    assert_values(
        &r::sum(&x, 1, false).unwrap(),
        &[2],
        &[3.0, 12.0],
        0.0,
        "sum",
    );
    assert_values(
        &r::sum(&x, -2, true).unwrap(),
        &[1, 3],
        &[3.0, 5.0, 7.0],
        0.0,
        "sum keepdim",
    );
    assert_values(
        &r::mean(&x, 0, false).unwrap(),
        &[3],
        &[1.5, 2.5, 3.5],
        0.0,
        "mean",
    );
    assert_values(
        &r::max(&x, -1, true).unwrap(),
        &[2, 1],
        &[2.0, 5.0],
        0.0,
        "max",
    );
    let idx = r::argmax(&x, 0, false).unwrap();
    assert_eq!(idx, Indices::new(&[3], vec![1, 1, 1]));
    assert!(r::sum(&x, 2, false).is_err() && r::sum(&x, -3, false).is_err());
    assert!(r::sum(&Dense::scalar(1.0), 0, false).is_err());

    let with_nan = Dense::new(&[2, 4], vec![1.0, NAN, 3.0, NAN, 1.0, 3.0, 3.0, -INF]);
    assert_eq!(r::argmax(&with_nan, 1, false).unwrap().data, vec![1, 1]);
    assert_values(
        &r::max(&with_nan, 1, false).unwrap(),
        &[2],
        &[NAN, 3.0],
        0.0,
        "max NaN",
    );
    let neg_inf = v(&[-INF, -INF]);
    assert_eq!(r::argmax(&neg_inf, 0, false).unwrap().data, vec![0]);
    assert_eq!(r::argmax(&neg_inf, 0, true).unwrap().shape, vec![1]);

    let empty = Dense::zeros(&[2, 0]);
    assert_values(
        &r::sum(&empty, 1, false).unwrap(),
        &[2],
        &[0.0, 0.0],
        0.0,
        "sum empty",
    );
    assert_values(
        &r::mean(&empty, 1, false).unwrap(),
        &[2],
        &[NAN, NAN],
        0.0,
        "mean empty",
    );
    assert_values(
        &r::max(&empty, 1, false).unwrap(),
        &[2],
        &[-INF, -INF],
        0.0,
        "max empty",
    );
    assert!(r::argmax(&empty, 1, false).is_err());
    // Reducing a non-empty dimension of an empty tensor is fine.
    assert_eq!(r::argmax(&empty, 0, false).unwrap().shape, vec![0]);

    let ss = r::sum_squares(&Dense::new(&[2, 2], vec![1.0, -2.0, 3.0, 0.5])).unwrap();
    assert_eq!(ss, Dense::scalar(14.25));
    assert_eq!(
        r::sum_squares(&Dense::zeros(&[0])).unwrap(),
        Dense::scalar(0.0)
    );
}

#[test]
fn linear_values() {
    let x = Dense::new(&[1, 2], vec![1.0, 2.0]);
    let w = Dense::new(&[3, 2], vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    let b = v(&[0.5, -0.5, 0.0]);
    assert_values(
        &r::linear(&x, &w, Some(&b)).unwrap(),
        &[1, 3],
        &[1.5, 1.5, 3.0],
        0.0,
        "linear",
    );
    assert_values(
        &r::linear(&v(&[1.0, 2.0]), &w, None).unwrap(),
        &[3],
        &[1.0, 2.0, 3.0],
        0.0,
        "1-d",
    );
    assert!(r::linear(&x, &Dense::zeros(&[3, 3]), None).is_err());
    assert!(r::linear(&x, &w, Some(&v(&[1.0]))).is_err());
}

#[test]
fn rms_norm_and_layer_norm_values() {
    let x = v(&[1.0, 2.0, 3.0, 4.0]);
    // mean(x^2) = 7.5.
    let inv = 0.3651483716701107;
    let (out, inv_rms) = r::rms_norm(&x, &v(&[1.0, 1.0, 2.0, 0.5]), 0.0).unwrap();
    assert_eq!(inv_rms.shape, Vec::<usize>::new());
    assert_values(&inv_rms, &[], &[inv], 1e-16, "inv_rms");
    assert_values(
        &out,
        &[4],
        &[inv, 2.0 * inv, 6.0 * inv, 2.0 * inv],
        1e-15,
        "rms_norm",
    );
    // mean(x^2) = 0.25, + eps 0.75 = 1.
    let (_, inv_rms) = r::rms_norm(&v(&[0.5, -0.5, 0.5, 0.5]), &v(&[1.0; 4]), 0.75).unwrap();
    assert_values(&inv_rms, &[], &[1.0], 1e-16, "rms_norm eps");
    // mean 2.5, biased variance 1.25.
    let rstd = 0.8944271909999159;
    let (out, mean, rs) = r::layer_norm(
        &x,
        &v(&[1.0, 2.0, 1.0, 1.0]),
        &v(&[0.0, 0.0, 1.0, 0.0]),
        0.0,
    )
    .unwrap();
    assert_values(&mean, &[], &[2.5], 0.0, "mean");
    assert_values(&rs, &[], &[rstd], 1e-16, "rstd");
    let expected = [-1.5 * rstd, -rstd, 0.5 * rstd + 1.0, 1.5 * rstd];
    assert_values(&out, &[4], &expected, 1e-15, "layer_norm");
    // Several rows: statistics have the leading shape.
    let rows = Dense::new(&[2, 1, 2], vec![1.0, 3.0, -2.0, -2.0]);
    let (_, mean, rs) = r::layer_norm(&rows, &v(&[1.0, 1.0]), &v(&[0.0, 0.0]), 1.0).unwrap();
    assert_values(&mean, &[2, 1], &[2.0, -2.0], 0.0, "row means");
    assert_values(&rs, &[2, 1], &[0.5f64.sqrt(), 1.0], 1e-15, "row rstd");
    assert!(r::rms_norm(&x, &v(&[1.0; 3]), 0.0).is_err());
}

#[test]
fn norm_backward_values() {
    // H = 1, no eps: rms_norm(x) = sign(x) w, so grad_input = 0, grad_weight = g sign(x).
    let (gi, gw) =
        r::rms_norm_backward(&v(&[3.0]), &v(&[2.0]), &v(&[5.0]), &Dense::scalar(0.5)).unwrap();
    assert_eq!((gi, gw), (v(&[0.0]), v(&[3.0])));
    // layer_norm with a constant grad_out: grad_input 0, grad_bias = g.
    let x = v(&[1.0, 2.0, 4.0]);
    let (_, mean, rstd) = r::layer_norm(&x, &v(&[1.0; 3]), &v(&[0.0; 3]), 1e-5).unwrap();
    let (gi, gw, gb) =
        r::layer_norm_backward(&v(&[2.0; 3]), &x, &v(&[1.0; 3]), &mean, &rstd).unwrap();
    assert_close(&gi, &Dense::zeros(&[3]), 0.0, 1e-15, "grad_input");
    // grad_weight = g xhat; xhat = (x - 7/3) / sqrt(14/9 + 1e-5).
    let xhat = x.map(|x| (x - 7.0 / 3.0) / (14.0f64 / 9.0 + 1e-5).sqrt());
    assert_close(&gw, &xhat.map(|x| 2.0 * x), 1e-14, 0.0, "grad_weight");
    assert_eq!(gb, v(&[2.0; 3]));
}

#[test]
fn rope_single_pairs_in_both_layouts() {
    // D = 4: pair 0 at angle pi/2 (cos 0, sin 1), pair 1 at angle 0.
    let x = Dense::new(&[1, 1, 1, 4], vec![1.0, 2.0, 3.0, 4.0]);
    let (cos, sin) = (
        Dense::new(&[1, 2], vec![0.0, 1.0]),
        Dense::new(&[1, 2], vec![1.0, 0.0]),
    );
    // Interleaved: pairs (x0, x1), (x2, x3); (1, 2) -> (-2, 1).
    let out = r::rope(&x, &cos, &sin, true).unwrap();
    assert_values(
        &out,
        &[1, 1, 1, 4],
        &[-2.0, 1.0, 3.0, 4.0],
        0.0,
        "interleaved",
    );
    // Half-split: pairs (x0, x2), (x1, x3); (1, 3) -> (-3, 1).
    let out = r::rope(&x, &cos, &sin, false).unwrap();
    assert_values(
        &out,
        &[1, 1, 1, 4],
        &[-3.0, 2.0, 1.0, 4.0],
        0.0,
        "half-split",
    );
    // Backward rotates by -theta: (1, 3) -> (3, -1).
    let out = r::rope_backward(&x, &cos, &sin, false).unwrap();
    assert_values(&out, &[1, 1, 1, 4], &[3.0, 2.0, -1.0, 4.0], 0.0, "backward");
    // A general angle, position 1 of 2, on every head and batch.
    let (c, s) = (0.6, 0.8);
    let x = Dense::from_fn(&[2, 2, 3, 2], |i| if i[3] == 0 { 1.0 } else { 2.0 });
    let cos = Dense::new(&[2, 1], vec![1.0, c]);
    let sin = Dense::new(&[2, 1], vec![0.0, s]);
    let out = r::rope(&x, &cos, &sin, true).unwrap();
    assert_eq!(out.at(&[1, 0, 2, 0]), 1.0);
    assert_eq!(out.at(&[1, 1, 2, 0]), c - 2.0 * s);
    assert_eq!(out.at(&[0, 1, 1, 1]), s + 2.0 * c);
    assert!(
        r::rope(
            &Dense::zeros(&[1, 1, 1, 3]),
            &Dense::zeros(&[1, 1]),
            &Dense::zeros(&[1, 1]),
            true
        )
        .is_err()
    );
    assert!(r::rope(&x, &Dense::zeros(&[1, 1]), &sin, true).is_err());
}

#[test]
fn attention_values() {
    // One key: out = v, lse = scale q.k.
    let q = Dense::new(&[1, 1, 1, 2], vec![1.0, 2.0]);
    let k = Dense::new(&[1, 1, 1, 2], vec![3.0, -1.0]);
    let val = Dense::new(&[1, 1, 1, 2], vec![5.0, 7.0]);
    let (out, lse) = r::attention(&q, &k, &val, 0.5, false).unwrap();
    assert_eq!(out, val);
    assert_values(&lse, &[1, 1, 1], &[0.5], 0.0, "lse one key");

    // Causal, seq_q 2 < seq_kv 3, zero queries (uniform weights): query 0
    // sees keys 0..=1, query 1 sees 0..=2.
    let q = Dense::zeros(&[1, 1, 2, 1]);
    let k = Dense::zeros(&[1, 1, 3, 1]);
    let val = Dense::new(&[1, 1, 3, 1], vec![1.0, 2.0, 6.0]);
    let (out, lse) = r::attention(&q, &k, &val, 1.0, true).unwrap();
    assert_values(&out, &[1, 1, 2, 1], &[1.5, 3.0], 1e-15, "causal out");
    assert_values(
        &lse,
        &[1, 1, 2],
        &[2f64.ln(), 3f64.ln()],
        1e-15,
        "causal lse",
    );
    let (out, _) = r::attention(&q, &k, &val, 1.0, false).unwrap();
    assert_values(&out, &[1, 1, 2, 1], &[3.0, 3.0], 1e-15, "not causal");

    // Causal, seq_q 3 > seq_kv 2: query 0 sees nothing.
    let q = Dense::zeros(&[1, 1, 3, 1]);
    let (out, lse) = r::attention(
        &q,
        &Dense::zeros(&[1, 1, 2, 1]),
        &Dense::full(&[1, 1, 2, 1], 4.0),
        1.0,
        true,
    )
    .unwrap();
    assert_values(&out, &[1, 1, 3, 1], &[0.0, 4.0, 4.0], 1e-15, "no key out");
    assert_values(
        &lse,
        &[1, 1, 3],
        &[-INF, 0.0, 2f64.ln()],
        1e-15,
        "no key lse",
    );

    // GQA: 4 query heads on 2 kv heads; heads 0, 1 read kv 0 and 2, 3 read kv 1.
    let q = Dense::zeros(&[1, 4, 1, 1]);
    let k = Dense::zeros(&[1, 2, 1, 1]);
    let val = Dense::new(&[1, 2, 1, 1], vec![10.0, 20.0]);
    let (out, _) = r::attention(&q, &k, &val, 1.0, false).unwrap();
    assert_values(&out, &[1, 4, 1, 1], &[10.0, 10.0, 20.0, 20.0], 0.0, "gqa");
    assert!(r::attention(&Dense::zeros(&[1, 3, 1, 1]), &k, &val, 1.0, false).is_err());

    // Two keys with scores 0 and ln 3: weights 1/4, 3/4.
    let q = Dense::new(&[1, 1, 1, 1], vec![1.0]);
    let k = Dense::new(&[1, 1, 2, 1], vec![0.0, 3f64.ln()]);
    let val = Dense::new(&[1, 1, 2, 1], vec![4.0, 8.0]);
    let (out, lse) = r::attention(&q, &k, &val, 1.0, false).unwrap();
    assert_values(&out, &[1, 1, 1, 1], &[7.0], 1e-15, "weights");
    assert_values(&lse, &[1, 1, 1], &[4f64.ln()], 1e-15, "lse");
}

#[test]
fn embedding_values_and_errors() {
    let w = Dense::new(&[3, 2], vec![0.0, 1.0, 10.0, 11.0, 20.0, 21.0]);
    let idx = Indices::new(&[2, 2], vec![2, 0, 2, 1]);
    let out = r::embedding(&w, &idx).unwrap();
    assert_values(
        &out,
        &[2, 2, 2],
        &[20.0, 21.0, 0.0, 1.0, 20.0, 21.0, 10.0, 11.0],
        0.0,
        "lookup",
    );
    assert!(r::embedding(&w, &Indices::new(&[1], vec![3])).is_err());
    assert!(r::embedding(&w, &Indices::new(&[1], vec![-1])).is_err());
    assert_eq!(
        r::embedding(&w, &Indices::new(&[0], vec![])).unwrap().shape,
        vec![0, 2]
    );
    let g = Dense::new(&[2, 2, 2], vec![1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]);
    let prev = Dense::full(&[3, 2], 0.5);
    let gw = r::embedding_backward(&g, &idx, &prev).unwrap();
    assert_values(
        &gw,
        &[3, 2],
        &[2.5, 2.5, 4.5, 4.5, 4.5, 4.5],
        0.0,
        "accumulates",
    );
    let bad = Indices::new(&[2, 2], vec![2, 0, 2, 3]);
    assert!(r::embedding_backward(&g, &bad, &prev).is_err());
}

#[test]
fn cross_entropy_values_and_errors() {
    let logits = Dense::new(&[3, 2], vec![0.0, 0.0, 1.0, 2.0, 5.0, 5.0]);
    let targets = Indices::new(&[3], vec![0, -100, 1]);
    let loss = r::cross_entropy(&logits, &targets, -100).unwrap();
    assert_values(&loss, &[], &[2f64.ln()], 1e-15, "ignored row");
    let loss = r::cross_entropy(
        &Dense::new(&[1, 2], vec![0.0, 3f64.ln()]),
        &Indices::new(&[1], vec![1]),
        -100,
    )
    .unwrap();
    assert_values(&loss, &[], &[0.2876820724517808], 1e-16, "ln 4 - ln 3");
    let all_ignored = Indices::new(&[3], vec![-100; 3]);
    assert!(r::cross_entropy(&logits, &all_ignored, -100).unwrap().data[0].is_nan());
    let grad = r::cross_entropy_backward(&logits, &all_ignored, 1.0, -100).unwrap();
    assert_eq!(grad, Dense::zeros(&[3, 2]));
    assert!(r::cross_entropy(&logits, &Indices::new(&[3], vec![0, 2, 1]), -100).is_err());
    assert!(r::cross_entropy(&logits, &Indices::new(&[3], vec![0, -1, 1]), -100).is_err());
    assert!(
        r::cross_entropy_backward(&logits, &Indices::new(&[3], vec![0, 2, 1]), 1.0, -100).is_err()
    );
    // An out-of-range target equal to ignore_index is fine.
    assert!(r::cross_entropy(&logits, &Indices::new(&[3], vec![0, 7, 1]), 7).is_ok());
    // Backward: rows 0 and 2 counted, softmax [1/2, 1/2].
    let grad = r::cross_entropy_backward(&logits, &targets, 2.0, -100).unwrap();
    assert_values(
        &grad,
        &[3, 2],
        &[-0.5, 0.5, 0.0, 0.0, 0.5, -0.5],
        1e-16,
        "backward",
    );
}

#[test]
fn adamw_one_step_by_hand() {
    let (p, g) = (v(&[1.0]), v(&[0.5]));
    let zero = v(&[0.0]);
    let (p1, m1, v1) = r::adamw(&p, &g, &zero, &zero, 0.1, 0.9, 0.999, 1e-8, 0.01, 1).unwrap();
    // p = 1 - 0.1*0.01 = 0.999; m = 0.05; v = 0.00025; m_hat = 0.5; v_hat = 0.25;
    // p -= 0.1 * 0.5 / (0.5 + 1e-8).
    assert_values(&m1, &[1], &[0.05], 1e-16, "m");
    assert_values(&v1, &[1], &[0.00025], 1e-18, "v");
    assert_values(&p1, &[1], &[0.899000002], 1e-15, "p");
    // Step 2 from there: bias corrections 1 - 0.81 and 1 - 0.999^2.
    let (p2, m2, v2) = r::adamw(&p1, &g, &m1, &v1, 0.1, 0.9, 0.999, 0.0, 0.0, 2).unwrap();
    assert_values(&m2, &[1], &[0.095], 1e-16, "m2");
    assert_values(&v2, &[1], &[0.999 * 0.00025 + 0.001 * 0.25], 1e-17, "v2");
    let (m_hat, v_hat): (f64, f64) = (0.095 / 0.19, (0.999 * 0.00025 + 0.00025) / (1.0 - 0.998001));
    assert_values(
        &p2,
        &[1],
        &[0.899000002 - 0.1 * m_hat / v_hat.sqrt()],
        1e-14,
        "p2",
    );
    assert!(r::adamw(&p, &g, &zero, &zero, 0.1, 0.9, 0.999, 1e-8, 0.01, 0).is_err());
    assert!(r::adamw(&p, &g, &zero, &zero, 0.1, 0.9, 0.999, 1e-8, 0.01, -3).is_err());
    assert!(
        r::adamw(
            &p,
            &v(&[1.0, 2.0]),
            &zero,
            &zero,
            0.1,
            0.9,
            0.999,
            1e-8,
            0.01,
            1
        )
        .is_err()
    );
}

#[test]
fn scale_values() {
    assert_eq!(r::scale(&v(&[1.0, -2.0]), 0.5).unwrap(), v(&[0.5, -1.0]));
    let err = r::adamw(
        &v(&[1.0]),
        &v(&[1.0]),
        &v(&[0.0]),
        &v(&[0.0]),
        0.1,
        0.9,
        0.9,
        0.0,
        0.0,
        0,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "adamw: step is 0; bias correction needs a step of at least 1"
    );
}

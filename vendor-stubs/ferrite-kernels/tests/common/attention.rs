//! Attention test support: a naive f64 reference (forward, and the analytic
//! backward of `sum(out * grad_out)`), and drivers that run the kernels on a
//! problem and check them against it.

use super::{Layout, Tensor, assert_all_close, eps, max_abs, rnd, values};
use ferrite_kernels::{DType, attention, attention_backward};

/// Sizes of one attention problem.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub b: usize,
    pub hq: usize,
    pub hkv: usize,
    pub sq: usize,
    pub skv: usize,
    pub d: usize,
    pub causal: bool,
}

impl Case {
    pub fn q_shape(&self) -> Vec<i64> {
        [self.b, self.hq, self.sq, self.d]
            .map(|x| x as i64)
            .to_vec()
    }
    pub fn k_shape(&self) -> Vec<i64> {
        [self.b, self.hkv, self.skv, self.d]
            .map(|x| x as i64)
            .to_vec()
    }
    pub fn visible(&self, i: usize) -> usize {
        if !self.causal {
            return self.skv;
        }
        (i as i64 + 1 + self.skv as i64 - self.sq as i64).clamp(0, self.skv as i64) as usize
    }
    fn qi(&self, b: usize, h: usize, i: usize) -> usize {
        ((b * self.hq + h) * self.sq + i) * self.d
    }
    fn ki(&self, b: usize, h: usize, j: usize) -> usize {
        ((b * self.hkv + h / (self.hq / self.hkv)) * self.skv + j) * self.d
    }
    /// Probabilities of row `(b, h, i)` over its visible keys, and its lse.
    fn probs(
        &self,
        q: &[f64],
        k: &[f64],
        (b, h, i): (usize, usize, usize),
        scale: f64,
    ) -> (Vec<f64>, f64) {
        let (d, vis) = (self.d, self.visible(i));
        let s: Vec<f64> = (0..vis)
            .map(|j| {
                let (qo, ko) = (self.qi(b, h, i), self.ki(b, h, j));
                scale * (0..d).map(|x| q[qo + x] * k[ko + x]).sum::<f64>()
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let l: f64 = s.iter().map(|&x| (x - m).exp()).sum();
        let lse = if vis == 0 {
            f64::NEG_INFINITY
        } else {
            m + l.ln()
        };
        (s.iter().map(|&x| (x - lse).exp()).collect(), lse)
    }
}

/// Reference forward: (out, lse).
pub fn forward_ref(c: &Case, q: &[f64], k: &[f64], v: &[f64], scale: f64) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![0.0; c.b * c.hq * c.sq * c.d];
    let mut lse = vec![0.0; c.b * c.hq * c.sq];
    for b in 0..c.b {
        for h in 0..c.hq {
            for i in 0..c.sq {
                let (p, l) = c.probs(q, k, (b, h, i), scale);
                lse[(b * c.hq + h) * c.sq + i] = l;
                for (j, &pj) in p.iter().enumerate() {
                    for x in 0..c.d {
                        out[c.qi(b, h, i) + x] += pj * v[c.ki(b, h, j) + x];
                    }
                }
            }
        }
    }
    (out, lse)
}

/// Reference backward (analytic): (dq, dk, dv) of `sum(out * go)`.
pub fn backward_ref(
    c: &Case,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    go: &[f64],
    scale: f64,
) -> [Vec<f64>; 3] {
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    let d = c.d;
    for b in 0..c.b {
        for h in 0..c.hq {
            for i in 0..c.sq {
                let (p, _) = c.probs(q, k, (b, h, i), scale);
                let qo = c.qi(b, h, i);
                let dp: Vec<f64> = (0..p.len())
                    .map(|j| (0..d).map(|x| go[qo + x] * v[c.ki(b, h, j) + x]).sum())
                    .collect();
                let di: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for j in 0..p.len() {
                    let ds = p[j] * (dp[j] - di);
                    let ko = c.ki(b, h, j);
                    for x in 0..d {
                        dq[qo + x] += scale * ds * k[ko + x];
                        dk[ko + x] += scale * ds * q[qo + x];
                        dv[ko + x] += p[j] * go[qo + x];
                    }
                }
            }
        }
    }
    [dq, dk, dv]
}

pub fn case(
    b: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    skv: usize,
    d: usize,
    causal: bool,
) -> Case {
    Case {
        b,
        hq,
        hkv,
        sq,
        skv,
        d,
        causal,
    }
}

/// The tensors of one attention problem after the forward pass.
pub struct Problem {
    pub c: Case,
    pub dt: DType,
    pub layouts: [Layout; 3],
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub out: Tensor,
    pub lse: Tensor,
    pub scale: f64,
}

/// Runs the forward kernel on `c` with layouts (q, k/v, out) and checks
/// `out` and `lse` against the reference.
pub fn forward(c: &Case, dt: DType, lq: &Layout, lk: &Layout, lo: &Layout) -> Problem {
    let scale = 1.0 / (c.d.max(1) as f64).sqrt();
    let (qs, ks) = (c.q_shape(), c.k_shape());
    let ctx = format!("{c:?} {dt:?} layouts {lq:?}/{lk:?}/{lo:?}");
    let mut q = Tensor::from_fn(dt, &qs, lq, |i| rnd(11, i));
    let mut k = Tensor::from_fn(dt, &ks, lk, |i| rnd(12, i));
    let mut v = Tensor::from_fn(dt, &ks, lk, |i| rnd(13, i));
    let mut out = Tensor::new(dt, &qs, lo);
    let mut lse = Tensor::new(DType::F32, &qs[..3], &Layout::padded(1));
    out.fill_storage(f64::NAN);
    lse.fill_storage(f64::NAN);
    // SAFETY: distinct buffers owned by the test.
    unsafe {
        attention(
            &q.view(),
            &k.view(),
            &v.view(),
            &out.view(),
            &lse.view(),
            scale,
            c.causal,
        )
        .unwrap()
    };
    let (qv, kv, vv) = (values(&q), values(&k), values(&v));
    let (want_o, want_l) = forward_ref(c, &qv, &kv, &vv, scale);
    let (u, u32_) = (eps(dt), eps(DType::F32));
    let red = 4.0 * (c.d + c.skv) as f64 * u32_;
    let mag = max_abs(&vv).max(1.0);
    assert_all_close(
        &out,
        &want_o,
        2.0 * u,
        (2.0 * u + red) * mag,
        &format!("out {ctx}"),
    );
    assert_all_close(&lse, &want_l, red, red, &format!("lse {ctx}"));
    Problem {
        c: *c,
        dt,
        layouts: [lq.clone(), lk.clone(), lo.clone()],
        q,
        k,
        v,
        out,
        lse,
        scale,
    }
}

/// Runs the backward kernel on a forward `p` and checks the gradients.
pub fn backward(p: &mut Problem) {
    let (c, dt, scale) = (&p.c, p.dt, p.scale);
    let [lq, lk, lo] = &p.layouts;
    let (qs, ks) = (c.q_shape(), c.k_shape());
    let ctx = format!("{c:?} {dt:?} layouts {lq:?}/{lk:?}/{lo:?}");
    let (u, u32_) = (eps(dt), eps(DType::F32));
    let (qv, kv, vv) = (values(&p.q), values(&p.k), values(&p.v));
    let mut go = Tensor::from_fn(dt, &qs, lo, |i| rnd(14, i));
    let mut dq = Tensor::new(dt, &qs, lq);
    let mut dk = Tensor::new(dt, &ks, lk);
    let mut dv = Tensor::new(dt, &ks, lo);
    for t in [&mut dq, &mut dk, &mut dv] {
        t.fill_storage(f64::NAN);
    }
    // SAFETY: distinct buffers owned by the test.
    unsafe {
        attention_backward(
            &p.q.view(),
            &p.k.view(),
            &p.v.view(),
            &p.out.view(),
            &p.lse.view(),
            &go.view(),
            &dq.view(),
            &dk.view(),
            &dv.view(),
            scale,
            c.causal,
        )
        .unwrap()
    };
    let grads = backward_ref(c, &qv, &kv, &vv, &values(&go), scale);
    let n = (c.sq * (c.hq / c.hkv.max(1)) + c.skv + c.d) as f64;
    for (name, got, want) in [
        ("dq", &dq, &grads[0]),
        ("dk", &dk, &grads[1]),
        ("dv", &dv, &grads[2]),
    ] {
        let mag = max_abs(want).max(1e-3);
        let abs = (16.0 * u + 8.0 * n * u32_) * mag;
        assert_all_close(got, want, 4.0 * u, abs, &format!("{name} {ctx}"));
    }
}

/// Small problems: size-1, causal with seq_q < seq_kv and seq_q > seq_kv,
/// GQA 8/2, and empty batch, query, key and head dimensions.
pub fn small_cases() -> Vec<Case> {
    vec![
        case(1, 1, 1, 1, 1, 1, false),
        case(1, 1, 1, 1, 1, 1, true),
        case(2, 2, 1, 5, 7, 3, true),
        case(1, 2, 2, 7, 5, 4, true),
        case(1, 8, 2, 9, 9, 8, true),
        case(1, 8, 2, 6, 11, 8, false),
        case(0, 2, 1, 4, 4, 4, true),
        case(1, 2, 1, 0, 5, 4, true),
        case(1, 2, 1, 4, 0, 4, false),
        case(1, 1, 1, 3, 5, 0, true),
    ]
}

/// Problems spanning several query and key blocks.
pub fn block_cases() -> Vec<Case> {
    vec![
        case(1, 2, 1, 130, 300, 8, true),
        case(1, 2, 1, 300, 130, 8, true),
        case(1, 8, 2, 70, 140, 16, true),
        case(2, 2, 2, 65, 129, 5, false),
    ]
}

/// (q, k/v, out) layouts: contiguous; [B, S, H, D] storage (each head's
/// rows strided); transposed/padded/flipped.
pub fn layouts() -> [[Layout; 3]; 3] {
    let bshd = Layout {
        order: Some(vec![0, 2, 1, 3]),
        ..Layout::default()
    };
    let c = Layout::contiguous;
    [
        [c(), c(), c()],
        [bshd.clone(), bshd.clone(), bshd],
        [Layout::messy(4), Layout::padded(2), Layout::flipped(&[2])],
    ]
}

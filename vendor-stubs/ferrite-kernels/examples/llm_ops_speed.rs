//! Speed check of the LLM operators: median GFLOP/s of f32 causal attention
//! forward and backward (B=1, H=8, S=1024, D=64; causal flops counted as
//! `4 B H S^2 D / 2` forward and 2.5x that backward), and median GB/s of
//! f32 RMSNorm forward on [4096, 4096] (bytes read plus written).
//! Run with `cargo run --release -p ferrite-kernels --example llm_ops_speed`.

use ferrite_kernels::{DType, View, attention, attention_backward, rms_norm};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median seconds of `runs` timed calls after two warm-up calls.
fn time(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut times = Vec::new();
    for i in 0..runs + 2 {
        let t = Instant::now();
        f();
        if i >= 2 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    median(times)
}

/// A contiguous f32 tensor with deterministic values in about [-1, 1].
struct T {
    data: Vec<f32>,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

impl T {
    fn new(shape: &[i64], seed: u32) -> Self {
        let n: i64 = shape.iter().product();
        let data = (0..n as u32)
            .map(|i| {
                let x = i
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed.wrapping_mul(40_503));
                ((x >> 8) % 2001) as f32 / 1000.0 - 1.0
            })
            .collect();
        let mut strides = vec![1i64; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1];
        }
        Self {
            data,
            shape: shape.to_vec(),
            strides,
        }
    }

    fn view(&mut self) -> View<'_> {
        let p = self.data.as_mut_ptr() as *mut u8;
        View::new(p, DType::F32, &self.shape, &self.strides)
    }
}

fn main() {
    println!("threads: {}", rayon::current_num_threads());
    let (b, h, s, d) = (1i64, 8i64, 1024i64, 64i64);
    let shape = [b, h, s, d];
    let (mut q, mut k, mut v) = (T::new(&shape, 1), T::new(&shape, 2), T::new(&shape, 3));
    let (mut out, mut go) = (T::new(&shape, 4), T::new(&shape, 5));
    let (mut dq, mut dk, mut dv) = (T::new(&shape, 0), T::new(&shape, 0), T::new(&shape, 0));
    let mut lse = T::new(&[b, h, s], 0);
    let scale = 1.0 / (d as f64).sqrt();
    let flops = 4.0 * (b * h * s * s * d) as f64 / 2.0;
    let fwd = time(9, || {
        // SAFETY: distinct live buffers of the stated shapes.
        unsafe {
            attention(
                &q.view(),
                &k.view(),
                &v.view(),
                &out.view(),
                &lse.view(),
                scale,
                true,
            )
            .expect("attention")
        };
    });
    let bwd = time(5, || {
        // SAFETY: distinct live buffers of the stated shapes.
        unsafe {
            attention_backward(
                &q.view(),
                &k.view(),
                &v.view(),
                &out.view(),
                &lse.view(),
                &go.view(),
                &dq.view(),
                &dk.view(),
                &dv.view(),
                scale,
                true,
            )
            .expect("attention_backward")
        };
    });
    println!(
        "attention fwd f32 B1 H8 S1024 D64 causal: {:7.1} GFLOP/s ({:.2} ms, median of 9)",
        flops / fwd / 1e9,
        fwd * 1e3
    );
    println!(
        "attention bwd f32 B1 H8 S1024 D64 causal: {:7.1} GFLOP/s ({:.2} ms, 2.5x fwd flops, median of 5)",
        2.5 * flops / bwd / 1e9,
        bwd * 1e3
    );
    let (rows, hid) = (4096i64, 4096i64);
    let mut x = T::new(&[rows, hid], 6);
    let mut w = T::new(&[hid], 7);
    let mut y = T::new(&[rows, hid], 0);
    let mut inv = T::new(&[rows], 0);
    let secs = time(9, || {
        // SAFETY: distinct live buffers of the stated shapes.
        unsafe { rms_norm(&x.view(), &w.view(), &y.view(), &inv.view(), 1e-6).expect("rms_norm") };
    });
    let bytes = (2 * rows * hid * 4) as f64;
    println!(
        "rms_norm fwd f32 [4096, 4096]:             {:7.1} GB/s ({:.2} ms, median of 9)",
        bytes / secs / 1e9,
        secs * 1e3
    );
}

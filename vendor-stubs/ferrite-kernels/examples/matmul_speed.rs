//! Quick speed check: median GFLOP/s of an f32 1024^3 matmul (plus the
//! transposed-operand case, and the per-call cost of a 16-element fill).
//! Run with `cargo run --release -p ferrite-kernels --example matmul_speed`.

use ferrite_kernels::{DType, View, fill, matmul};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn gflops(n: usize, ta: bool, tb: bool, runs: usize) -> f64 {
    let a: Vec<f32> = (0..n * n).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
    let b: Vec<f32> = (0..n * n).map(|i| ((i % 13) as f32 - 6.0) / 6.0).collect();
    let mut out = vec![0f32; n * n];
    let shape = [n as i64, n as i64];
    let strides = [n as i64, 1];
    let view = |p: *const f32| View::new(p as *mut u8, DType::F32, &shape, &strides);
    let (av, bv, ov) = (view(a.as_ptr()), view(b.as_ptr()), view(out.as_mut_ptr()));
    let mut times = Vec::new();
    for i in 0..runs + 2 {
        let t = Instant::now();
        // SAFETY: three distinct, live n x n buffers.
        unsafe { matmul(&av, &bv, &ov, ta, tb, 1.0, 0.0).expect("matmul") };
        if i >= 2 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    2.0 * (n as f64).powi(3) / median(times) / 1e9
}

fn fill_ns() -> f64 {
    let mut buf = [0f32; 16];
    let shape = [16i64];
    let strides = [1i64];
    let v = View::new(buf.as_mut_ptr() as *mut u8, DType::F32, &shape, &strides);
    let iters = 1_000_000;
    let mut samples = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        for i in 0..iters {
            // SAFETY: a live 16-element buffer.
            unsafe { fill(std::hint::black_box(&v), i as f64).expect("fill") };
        }
        samples.push(t.elapsed().as_secs_f64() * 1e9 / iters as f64);
    }
    std::hint::black_box(&buf);
    median(samples)
}

fn main() {
    println!("threads: {}", rayon::current_num_threads());
    println!(
        "f32 1024^3 matmul:            {:.1} GFLOP/s (median of 9)",
        gflops(1024, false, false, 9)
    );
    println!(
        "f32 1024^3 matmul A^T B^T:    {:.1} GFLOP/s (median of 9)",
        gflops(1024, true, true, 9)
    );
    println!("fill 16 x f32:                {:.1} ns/call", fill_ns());
}

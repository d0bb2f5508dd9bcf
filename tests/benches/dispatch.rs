//! Host dispatch overhead and matmul throughput through the host, each
//! measured side by side with the same Ferrite kernel called directly, in
//! interleaved rounds of the same run; prints medians and ratios.
//!
//! Run: `cargo bench -p polychip-tests --bench dispatch` (after
//! `cargo build --release --workspace`, which builds the plugin).
//! `POLYCHIP_BENCH_ROUNDS` sets the number of rounds (default 15).

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

use ferrite_kernels::{DType as KDType, View};
use polychip_host::{DType, LoadOptions, MatmulOptions, Runtime, Tensor};

fn ferrite_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().unwrap().parent().unwrap();
    for p in [
        profile.join("libpolychip_vendor_ferrite.so"),
        profile.join("deps/libpolychip_vendor_ferrite.so"),
    ] {
        if p.exists() {
            return p;
        }
    }
    panic!(
        "libpolychip_vendor_ferrite.so not found under {}: run `cargo build --release --workspace` first",
        profile.display()
    );
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    xs[xs.len() / 2]
}

/// Seconds per call of `f`, timing `calls` calls.
fn per_call(calls: usize, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..calls {
        f();
    }
    start.elapsed().as_secs_f64() / calls as f64
}

/// The kernels' view of an f32 tensor on a host-visible device.
fn view(t: &Tensor) -> View<'_> {
    View {
        ptr: t
            .buffer()
            .ptr()
            .cast::<u8>()
            .wrapping_add(t.byte_offset() as usize),
        dtype: KDType::F32,
        shape: t.shape(),
        strides: t.strides(),
    }
}

fn main() {
    let rounds: usize = std::env::var("POLYCHIP_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15);
    let runtime = Runtime::load(&[ferrite_path()], &LoadOptions::default());
    assert!(runtime.failures().is_empty(), "{:?}", runtime.failures());
    let device = runtime.devices()[0].clone();
    let exec = device.exec();

    // 1. Per-call overhead: fill of 16 f32 elements.
    let tiny = device.zeros(DType::F32, &[16]).unwrap();
    let tiny_view = view(&tiny);
    let calls = 200_000;
    let (mut host, mut direct) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        host.push(per_call(calls, || {
            exec.fill(black_box(&tiny), black_box(1.0)).unwrap()
        }));
        // SAFETY: the view addresses the live, host-visible tensor above.
        direct.push(per_call(calls, || unsafe {
            ferrite_kernels::fill(black_box(&tiny_view), black_box(1.0)).unwrap()
        }));
    }
    let (h, d) = (median(host) * 1e9, median(direct) * 1e9);
    println!("dispatch: fill of 16 f32, median of {rounds} rounds x {calls} calls");
    println!("  through the host   {h:8.1} ns/call");
    println!("  kernel called directly {d:4.1} ns/call");
    println!(
        "  host overhead      {:8.1} ns/call (target < 100), ratio host/direct {:.2}",
        h - d,
        h / d
    );

    // 2. f32 matmul 1024^3 through the host vs the kernel directly.
    let n = 1024i64;
    let a = device.zeros(DType::F32, &[n, n]).unwrap();
    let b = device.zeros(DType::F32, &[n, n]).unwrap();
    let c = device.zeros(DType::F32, &[n, n]).unwrap();
    exec.fill(&a, 0.5).unwrap();
    exec.fill(&b, 0.25).unwrap();
    let (va, vb, vc) = (view(&a), view(&b), view(&c));
    let flops = 2.0 * (n as f64).powi(3);
    let (mut host, mut direct) = (Vec::new(), Vec::new());
    let mm_rounds = rounds.min(9);
    for _ in 0..mm_rounds {
        host.push(per_call(3, || {
            exec.matmul(&a, &b, &c, MatmulOptions::default()).unwrap()
        }));
        // SAFETY: the views address the live, host-visible tensors above.
        direct.push(per_call(3, || unsafe {
            ferrite_kernels::matmul(&va, &vb, &vc, false, false, 1.0, 0.0).unwrap()
        }));
    }
    let (h, d) = (flops / median(host) / 1e9, flops / median(direct) / 1e9);
    // ANCHORS.md's estimate of the machine's f32 FMA peak (2 cores); a good
    // kernel exceeds it, so it is a yardstick rather than a ceiling.
    let peak = 190.0;
    println!("matmul: f32 1024x1024x1024, median of {mm_rounds} rounds x 3 calls");
    println!(
        "  through the host   {h:7.1} GFLOP/s ({:.2}x the {peak} GFLOP/s peak estimate)",
        h / peak
    );
    println!(
        "  kernel called directly {d:3.1} GFLOP/s ({:.2}x the estimate)",
        d / peak
    );
    println!("  ratio host/direct  {:.3} (target >= 0.97)", h / d);
    assert_eq!(c.to_vec::<f32>().unwrap()[0], 0.5 * 0.25 * n as f32);
}

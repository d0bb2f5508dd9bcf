//! Throughput of the fast plugin's (Ferrite's) LLM kernels through the host,
//! side by side with the conformance reference (f64, written for clarity) on
//! the same inputs, and against the machine's f32 peak estimate.
//!
//! Run: `cargo bench -p polychip-tests --bench kernels` (after
//! `cargo build --release --workspace`). `POLYCHIP_BENCH_ROUNDS` sets the
//! rounds of the plugin side (default 7; the reference runs 3 times).

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

use polychip_conformance::reference::{self, Dense};
use polychip_host::{DType, Device, LoadOptions, MatmulOptions, Runtime, Tensor};

const PEAK_GFLOPS: f64 = 190.0;

fn ferrite() -> Device {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let path: PathBuf = [
        profile.join("libpolychip_vendor_ferrite.so"),
        profile.join("deps/libpolychip_vendor_ferrite.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .expect("build the workspace in release first");
    let rt = Runtime::load(&[path], &LoadOptions::default());
    assert!(rt.failures().is_empty(), "{:?}", rt.failures());
    rt.devices()[0].clone()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn time(rounds: usize, mut f: impl FnMut()) -> f64 {
    f();
    median(
        (0..rounds)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn tensor(d: &Device, shape: &[usize], seed: u64) -> (Tensor, Dense) {
    let n = shape.iter().product();
    let v = values(n, seed);
    let t = d
        .from_slice(&v, &shape.iter().map(|&s| s as i64).collect::<Vec<_>>())
        .unwrap();
    (
        t,
        Dense {
            shape: shape.to_vec(),
            data: v.into_iter().map(f64::from).collect(),
        },
    )
}

fn report(name: &str, unit: &str, work: f64, plugin: f64, reference: f64, flops: bool) {
    let (p, r) = (work / plugin / 1e9, work / reference / 1e9);
    let peak = if flops {
        format!(
            ", {:.0}% of the {PEAK_GFLOPS} GFLOP/s estimate",
            100.0 * p / PEAK_GFLOPS
        )
    } else {
        String::new()
    };
    println!(
        "{name:<34} Ferrite {p:8.2} {unit}{peak}; reference {r:7.3} {unit}; Ferrite/reference {:.0}x",
        p / r
    );
}

fn main() {
    let rounds: usize = std::env::var("POLYCHIP_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let d = ferrite();
    let exec = d.exec();
    println!(
        "Ferrite through the host vs the f64 conformance reference; medians of {rounds} (Ferrite) and 3 (reference) runs"
    );

    // matmul 512^3.
    let n = 512;
    let (a, ra) = tensor(&d, &[n, n], 1);
    let (b, rb) = tensor(&d, &[n, n], 2);
    let c = d.zeros(DType::F32, &[n as i64, n as i64]).unwrap();
    let rc = Dense::zeros(&[n, n]);
    let work = 2.0 * (n as f64).powi(3);
    let p = time(rounds, || {
        exec.matmul(&a, &b, &c, MatmulOptions::default()).unwrap()
    });
    let r = time(3, || {
        drop(black_box(
            reference::matmul(&ra, &rb, &rc, false, false, 1.0, 0.0).unwrap(),
        ))
    });
    report("matmul f32 512x512x512", "GFLOP/s", work, p, r, true);

    // Causal attention, B=1, H=8, S=512, D=64.
    let (bh, s, dh) = (8usize, 512usize, 64usize);
    let (q, rq) = tensor(&d, &[1, bh, s, dh], 3);
    let (k, rk) = tensor(&d, &[1, bh, s, dh], 4);
    let (v, rv) = tensor(&d, &[1, bh, s, dh], 5);
    let out = d
        .zeros(DType::F32, &[1, bh as i64, s as i64, dh as i64])
        .unwrap();
    let lse = d.zeros(DType::F32, &[1, bh as i64, s as i64]).unwrap();
    let scale = 1.0 / (dh as f64).sqrt();
    // Causal: half of the S x S scores, two matmuls (QK^T and PV).
    let work = 4.0 * bh as f64 * (s * s) as f64 * dh as f64 / 2.0;
    let p = time(rounds, || {
        exec.attention(&q, &k, &v, &out, &lse, scale, true).unwrap()
    });
    let r = time(3, || {
        drop(black_box(
            reference::attention(&rq, &rk, &rv, scale, true).unwrap(),
        ))
    });
    report(
        "attention fwd f32 causal 8x512x64",
        "GFLOP/s",
        work,
        p,
        r,
        true,
    );
    let grad = out.clone();
    let (gq, gk, gv) = (
        d.zeros(DType::F32, q.shape()).unwrap(),
        d.zeros(DType::F32, k.shape()).unwrap(),
        d.zeros(DType::F32, v.shape()).unwrap(),
    );
    let (ro, rl) = reference::attention(&rq, &rk, &rv, scale, true).unwrap();
    let p = time(rounds, || {
        exec.attention_backward(&q, &k, &v, &out, &lse, &grad, &gq, &gk, &gv, scale, true)
            .unwrap()
    });
    let r = time(3, || {
        drop(black_box(
            reference::attention_backward(&rq, &rk, &rv, &ro, &rl, &ro, scale, true).unwrap(),
        ))
    });
    report(
        "attention bwd f32 causal 8x512x64",
        "GFLOP/s",
        2.5 * work,
        p,
        r,
        true,
    );

    // RMSNorm forward over [4096, 4096]: bytes read and written.
    let (rows, h) = (4096usize, 4096usize);
    let (x, rx) = tensor(&d, &[rows, h], 6);
    let (w, rw) = tensor(&d, &[h], 7);
    let y = d.zeros(DType::F32, &[rows as i64, h as i64]).unwrap();
    let inv = d.zeros(DType::F32, &[rows as i64]).unwrap();
    let bytes = (2 * rows * h * 4) as f64;
    let p = time(rounds, || exec.rms_norm(&x, &w, &y, &inv, 1e-6).unwrap());
    let r = time(3, || {
        drop(black_box(reference::rms_norm(&rx, &rw, 1e-6).unwrap()))
    });
    report("rms_norm fwd f32 4096x4096", "GB/s", bytes, p, r, false);
}

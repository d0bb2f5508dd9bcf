//! The OpenCL plugin against Ferrite on the same cores, side by side in one
//! run: matmul in f32 and bf16, causal attention forward and backward,
//! index_select, index_add and scatter_add (ABI 1.4's gather and
//! scatter_add), and the cost of one small operator call (synchronous on the default stream,
//! and queued on a stream then synchronized once per batch), which is where
//! an asynchronous driver queue shows its cost.
//!
//! Run: `cargo bench -p polychip-tests --bench opencl` (after `cargo build
//! --release --workspace`; needs an OpenCL device: PoCL gives one on the
//! CPU). `POLYCHIP_BENCH_ROUNDS` sets the rounds (default 7): medians are
//! printed with the spread (min..max), and the ratio OpenCL / Ferrite.
//! `POLYCHIP_OPENCL_DEVICES` picks the OpenCL device (e.g. `nvidia`).

use std::path::PathBuf;
use std::time::Instant;

use polychip_host::{DType, Device, LoadOptions, MatmulOptions, Runtime, Tensor};

fn built(file: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().unwrap().parent().unwrap().to_path_buf();
    [profile.join(file), profile.join("deps").join(file)]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{file}: build the workspace in release first"))
}

/// Medians and spread of `rounds` timings of `f` (after one warm-up call).
fn time(rounds: usize, mut f: impl FnMut()) -> (f64, f64, f64) {
    f();
    let mut v: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[v.len() / 2], v[0], v[v.len() - 1])
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

/// A tensor of `dtype` with seeded values in [-1, 1).
fn tensor(d: &Device, dtype: DType, shape: &[i64], seed: u64) -> Tensor {
    let n = shape.iter().product::<i64>() as usize;
    let f = d.from_slice(&values(n, seed), shape).unwrap();
    if dtype == DType::F32 {
        return f;
    }
    let t = d.empty(dtype, shape).unwrap();
    d.exec().cast(&f, &t).unwrap();
    t
}

struct Row {
    name: String,
    unit: &'static str,
    /// Work per call (FLOP or calls), and the timings per device.
    work: f64,
    times: Vec<(f64, f64, f64)>,
}

fn print(rows: &[Row], names: &[String]) {
    for r in rows {
        let rate = |t: f64| r.work / t;
        let mut line = format!("{:<36}", r.name);
        for (name, &(med, lo, hi)) in names.iter().zip(&r.times) {
            if r.unit == "us/call" {
                line += &format!(
                    " {name} {:8.1} us ({:.1}..{:.1})",
                    med * 1e6 / r.work,
                    lo * 1e6 / r.work,
                    hi * 1e6 / r.work
                );
            } else {
                // G... or M... per second.
                let per = if r.unit.starts_with('M') { 1e6 } else { 1e9 };
                line += &format!(
                    " {name} {:7.2} {} ({:.2}..{:.2})",
                    rate(med) / per,
                    r.unit,
                    rate(hi) / per,
                    rate(lo) / per
                );
            }
        }
        let ratio = r.times[0].0 / r.times[1].0;
        if r.unit == "us/call" {
            line += &format!("  OpenCL/Ferrite time {:.1}x", 1.0 / ratio);
        } else {
            line += &format!("  OpenCL/Ferrite speed {ratio:.2}");
        }
        println!("{line}");
    }
}

fn main() {
    let rounds: usize = std::env::var("POLYCHIP_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let rt = Runtime::load(
        &[
            built("libpolychip_vendor_ferrite.so"),
            built("libpolychip_opencl.so"),
        ],
        &LoadOptions::default(),
    );
    assert!(rt.failures().is_empty(), "{:?}", rt.failures());
    let Some(opencl) = rt.devices_of("opencl").first().cloned() else {
        eprintln!("no OpenCL device: install a driver (scripts/install-deps installs PoCL)");
        return;
    };
    let ferrite = rt.devices_of("ferrite")[0].clone();
    let devices = [ferrite, opencl];
    let names: Vec<String> = vec!["Ferrite".into(), "OpenCL".into()];
    println!(
        "OpenCL ({}) vs Ferrite on the same machine; medians of {rounds} rounds (spread min..max)",
        devices[1].props().name
    );
    let mut rows = Vec::new();

    for (dtype, n) in [(DType::F32, 512i64), (DType::F32, 1024), (DType::BF16, 512)] {
        let mut times = Vec::new();
        for d in &devices {
            let a = tensor(d, dtype, &[n, n], 1);
            let b = tensor(d, dtype, &[n, n], 2);
            let c = d.zeros(dtype, &[n, n]).unwrap();
            let exec = d.exec();
            times.push(time(rounds, || {
                exec.matmul(&a, &b, &c, MatmulOptions::default()).unwrap()
            }));
        }
        rows.push(Row {
            name: format!("matmul {dtype} {n}x{n}x{n}"),
            unit: "GFLOP/s",
            work: 2.0 * (n as f64).powi(3),
            times,
        });
    }

    // Causal attention, B=1, H=8, S=512, D=64: half the S x S scores.
    let (h, s, dh) = (8i64, 512i64, 64i64);
    let work = 4.0 * (h * s * s * dh) as f64 / 2.0;
    for dtype in [DType::F32, DType::BF16] {
        let (mut fwd, mut bwd) = (Vec::new(), Vec::new());
        for d in &devices {
            let q = tensor(d, dtype, &[1, h, s, dh], 3);
            let k = tensor(d, dtype, &[1, h, s, dh], 4);
            let v = tensor(d, dtype, &[1, h, s, dh], 5);
            let out = d.zeros(dtype, &[1, h, s, dh]).unwrap();
            let lse = d.zeros(DType::F32, &[1, h, s]).unwrap();
            let scale = 1.0 / (dh as f64).sqrt();
            let exec = d.exec();
            fwd.push(time(rounds, || {
                exec.attention(&q, &k, &v, &out, &lse, scale, true).unwrap()
            }));
            let (gq, gk, gv) = (
                d.zeros(dtype, q.shape()).unwrap(),
                d.zeros(dtype, k.shape()).unwrap(),
                d.zeros(dtype, v.shape()).unwrap(),
            );
            bwd.push(time(rounds, || {
                exec.attention_backward(&q, &k, &v, &out, &lse, &out, &gq, &gk, &gv, scale, true)
                    .unwrap()
            }));
        }
        rows.push(Row {
            name: format!("attention fwd {dtype} causal 8x512x64"),
            unit: "GFLOP/s",
            work,
            times: fwd,
        });
        rows.push(Row {
            name: format!("attention bwd {dtype} causal 8x512x64"),
            unit: "GFLOP/s",
            work: 2.5 * work,
            times: bwd,
        });
    }

    // ABI 1.4's indexing: index_select and index_add of 8,192 rows of a
    // [4096, 256] f32 table (one line of indices expanded by a zero
    // stride; OpenCL's scatter_add sorts it), and scatter_add of per-column
    // indices into 16 places (OpenCL's walks).
    let (places, cols, n) = (4096i64, 256i64, 8192i64);
    let (mut select, mut add, mut few) = (Vec::new(), Vec::new(), Vec::new());
    for d in &devices {
        let ids: Vec<i64> = values(n as usize, 6)
            .iter()
            .map(|&x| ((x + 1.0) / 2.0 * places as f32) as i64 % places)
            .collect();
        let index = d.from_slice(&ids, &[n]).unwrap();
        let index = index.as_strided(&[n, cols], &[1, 0], 0).unwrap();
        let table = tensor(d, DType::F32, &[places, cols], 7);
        let picked = d.zeros(DType::F32, &[n, cols]).unwrap();
        let exec = d.exec();
        select.push(time(rounds, || {
            exec.gather(&table, &index, &picked, 0).unwrap()
        }));
        add.push(time(rounds, || {
            exec.scatter_add(&table, &index, &picked, 0).unwrap()
        }));
        let (k, c) = (65536i64, 64i64);
        let ids: Vec<i64> = values((k * c) as usize, 8)
            .iter()
            .map(|&x| ((x + 1.0) * 8.0) as i64 % 16)
            .collect();
        let index = d.from_slice(&ids, &[k, c]).unwrap();
        let src = tensor(d, DType::F32, &[k, c], 9);
        let dst = d.zeros(DType::F32, &[16, c]).unwrap();
        few.push(time(rounds, || {
            exec.scatter_add(&dst, &index, &src, 0).unwrap()
        }));
    }
    rows.push(Row {
        name: "index_select f32 8192 of 4096x256".into(),
        unit: "M elem/s",
        work: (n * cols) as f64,
        times: select,
    });
    rows.push(Row {
        name: "index_add f32 8192 into 4096x256".into(),
        unit: "M elem/s",
        work: (n * cols) as f64,
        times: add,
    });
    rows.push(Row {
        name: "scatter_add f32 65536x64 into 16".into(),
        unit: "M elem/s",
        work: (65536 * 64) as f64,
        times: few,
    });

    // One small call: scale of 16 f32.
    let calls = 200usize;
    let (mut sync, mut queued) = (Vec::new(), Vec::new());
    for d in &devices {
        let t = d.zeros(DType::F32, &[16]).unwrap();
        let exec = d.exec();
        sync.push(time(rounds, || {
            for _ in 0..calls {
                exec.scale(&t, 1.0).unwrap();
            }
        }));
        let stream = d.stream().unwrap();
        let on = stream.exec();
        queued.push(time(rounds, || {
            for _ in 0..calls {
                on.scale(&t, 1.0).unwrap();
            }
            stream.synchronize().unwrap();
        }));
    }
    rows.push(Row {
        name: "scale of 16 f32, default stream".into(),
        unit: "us/call",
        work: calls as f64,
        times: sync,
    });
    rows.push(Row {
        name: format!("scale of 16 f32, {calls} queued + sync"),
        unit: "us/call",
        work: calls as f64,
        times: queued,
    });
    print(&rows, &names);
}

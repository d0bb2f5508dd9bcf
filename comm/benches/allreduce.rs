//! All-reduce bandwidth over shared memory, 2 ranks as 2 processes (the
//! bench spawns itself as rank 1), f32 sum, out of place, printing the
//! nccl-tests columns. Iterations follow `peers/mpi_allreduce_bench.c`
//! (about 2e9 / bytes, 20..=20000, warm-up iters/10 >= 5); the time shown is
//! the slowest rank's. `POLYCHIP_BENCH_SIZES` (comma-separated bytes)
//! overrides the sizes. With `POLYCHIP_BENCH_PARTS=1` it prints instead
//! where a small all-reduce spends its time (see [`parts`]).

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use polychip_comm::collectives::{Communicator, DType, ReduceOp};
use polychip_comm::shm::{RegionView, ShmTransport, unique_job_name};
use polychip_comm::transport::{SignalId, Transport};

const ROLE: &str = "POLYCHIP_BENCH_RANK";
const JOB: &str = "POLYCHIP_BENCH_JOB";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rank: usize = std::env::var(ROLE)
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let world = 2;
    let job = std::env::var(JOB).unwrap_or_else(|_| unique_job_name());
    let child = match rank {
        0 => Some(
            Command::new(std::env::current_exe()?)
                .env(ROLE, "1")
                .env(JOB, &job)
                .spawn()?,
        ),
        _ => None,
    };
    let transport = Arc::new(ShmTransport::with_job_name(
        &job,
        rank,
        world,
        Duration::from_secs(30),
    )?);
    let mut c = Communicator::new(transport.clone())?;
    if std::env::var_os("POLYCHIP_BENCH_PARTS").is_some() {
        parts(&transport, &mut c)?;
        drop(c);
        return wait_for(child);
    }
    let sizes: Vec<usize> = match std::env::var("POLYCHIP_BENCH_SIZES") {
        Ok(s) => s.split(',').filter_map(|x| x.trim().parse().ok()).collect(),
        Err(_) => vec![4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20],
    };
    if rank == 0 {
        println!("# polychip shm all-reduce, {world} ranks (processes), out of place");
        println!(
            "{:>12} {:>10} {:>6} {:>6} {:>7} {:>11} {:>11} {:>11} {:>7}",
            "size(B)",
            "count",
            "type",
            "redop",
            "iters",
            "time(us)",
            "algbw(GB/s)",
            "busbw(GB/s)",
            "#wrong"
        );
    }
    for bytes in sizes {
        let count = bytes / 4;
        let send: Vec<u8> = (0..count)
            .flat_map(|i| ((rank + 1) as f32 + (i % 7) as f32).to_ne_bytes())
            .collect();
        let mut recv = vec![0u8; count * 4];
        let iters = ((2e9 / bytes as f64) as usize).clamp(20, 20000);
        for _ in 0..(iters / 10).max(5) {
            c.all_reduce_into(&send, &mut recv, DType::F32, ReduceOp::Sum)?;
        }
        c.barrier()?;
        let start = Instant::now();
        for _ in 0..iters {
            c.all_reduce_into(&send, &mut recv, DType::F32, ReduceOp::Sum)?;
        }
        let mine = start.elapsed().as_secs_f64() / iters as f64;
        let wrong = recv
            .chunks_exact(4)
            .enumerate()
            .filter(|(i, b)| {
                f32::from_ne_bytes((*b).try_into().expect("4 bytes")) != 3.0 + 2.0 * (i % 7) as f32
            })
            .count();
        let mut stats = [
            ((mine * 1e12) as i64).to_ne_bytes(),
            (wrong as i64).to_ne_bytes(),
        ]
        .concat();
        c.all_reduce(&mut stats, DType::I64, ReduceOp::Max)?;
        let time = i64::from_ne_bytes(stats[..8].try_into()?) as f64 * 1e-12;
        let wrong = i64::from_ne_bytes(stats[8..].try_into()?);
        let algbw = bytes as f64 / time / 1e9;
        let busbw = algbw * 2.0 * (world - 1) as f64 / world as f64;
        if rank == 0 {
            println!(
                "{bytes:>12} {count:>10} {:>6} {:>6} {iters:>7} {:>11.2} {algbw:>11.3} {busbw:>11.3} {wrong:>7}",
                "float",
                "sum",
                time * 1e6
            );
        }
    }
    drop(c);
    wait_for(child)
}

fn wait_for(child: Option<std::process::Child>) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(mut child) = child {
        let status = child.wait()?;
        if !status.success() {
            return Err(format!("rank 1 failed: {status}").into());
        }
    }
    Ok(())
}

/// Nanoseconds per call of `f`, after a tenth as many warm-up calls.
fn per_call(iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..iters / 10 {
        f();
    }
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    start.elapsed().as_secs_f64() * 1e9 / iters as f64
}

/// Where a small all-reduce spends its time: both ranks time, per call,
/// the bare transport (a 4 KiB write and signal each way, then the same
/// plus summing what arrived: the floor of a one-step all-reduce), the
/// barrier, all-reduces of 4 B to 32 KiB and, on rank 0, a clock read and a
/// local 4 KiB copy. `POLYCHIP_BENCH_ITERS` calls each (default 200000).
fn parts(t: &Arc<ShmTransport>, c: &mut Communicator) -> Result<(), Box<dyn std::error::Error>> {
    let rank = t.rank();
    let iters: usize = std::env::var("POLYCHIP_BENCH_ITERS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(200_000);
    let peer = 1 - rank;
    let deadline = Instant::now() + Duration::from_secs(60);
    let (region, base) = t.register(4 * 4096)?;
    // SAFETY: the transport keeps the region mapped while `t` lives.
    let view = unsafe { RegionView::new(base, 4 * 4096) };
    let payload = vec![1u8; 4096];
    let mut report = Vec::new();

    // Bare transport: both ranks write 4 KiB + signal, then wait for the other's.
    c.barrier()?;
    let mut n = 0;
    report.push((
        "transport exchange 4 KiB",
        per_call(iters, || {
            t.write(peer, region, 0, &payload, SignalId(10)).unwrap();
            n += 1;
            t.wait(SignalId(10), n, deadline).unwrap();
        }),
    ));
    c.barrier()?;
    let mut n = 0;
    report.push((
        "transport exchange 0 B",
        per_call(iters, || {
            t.write(peer, region, 0, &[], SignalId(11)).unwrap();
            n += 1;
            t.wait(SignalId(11), n, deadline).unwrap();
        }),
    ));
    c.barrier()?;
    let mut n = 0;
    let own: Vec<f32> = (0..1024).map(|i| i as f32).collect();
    let mut sum = vec![0f32; 1024];
    report.push((
        "transport all-reduce floor",
        per_call(iters, || {
            let slot = (n % 4) * 4096;
            t.write(peer, region, slot, &payload, SignalId(12)).unwrap();
            n += 1;
            t.wait(SignalId(12), n as u64, deadline).unwrap();
            let got = view.bytes(slot, 4096).chunks_exact(4);
            for ((s, o), g) in sum.iter_mut().zip(&own).zip(got) {
                *s = o + f32::from_ne_bytes(g.try_into().unwrap());
            }
            std::hint::black_box(&sum);
        }),
    ));
    c.barrier()?;
    report.push(("barrier", per_call(iters, || c.barrier().unwrap())));
    let mut tiny = [0u8; 4];
    c.barrier()?;
    report.push((
        "all_reduce 4 B",
        per_call(iters, || {
            c.all_reduce(&mut tiny, DType::F32, ReduceOp::Sum).unwrap()
        }),
    ));
    let send: Vec<u8> = (0..1024).flat_map(|i| (i as f32).to_ne_bytes()).collect();
    let mut recv = vec![0u8; 4096];
    for size in [4096, 16384, 32768] {
        c.barrier()?;
        let name = match size {
            4096 => "all_reduce_into 4 KiB",
            16384 => "all_reduce_into 16 KiB",
            _ => "all_reduce_into 32 KiB",
        };
        let send: Vec<u8> = (0..size / 4)
            .flat_map(|i| (i as f32).to_ne_bytes())
            .collect();
        let mut recv = vec![0u8; size];
        report.push((
            name,
            per_call(iters, || {
                c.all_reduce_into(&send, &mut recv, DType::F32, ReduceOp::Sum)
                    .unwrap()
            }),
        ));
    }
    c.barrier()?;
    if rank == 0 {
        report.push((
            "Instant::now",
            per_call(iters, || {
                std::hint::black_box(Instant::now());
            }),
        ));
        report.push((
            "memcpy 4 KiB",
            per_call(iters, || {
                recv.copy_from_slice(std::hint::black_box(&send));
            }),
        ));

        for (name, ns) in &report {
            println!("{name:>28}: {ns:8.1} ns");
        }
    }
    c.barrier()?;
    Ok(())
}

//! All-reduce bandwidth over shared memory, 2 ranks as 2 processes (the
//! bench spawns itself as rank 1), f32 sum, out of place, printing the
//! nccl-tests columns. Iterations follow `peers/mpi_allreduce_bench.c`
//! (about 2e9 / bytes, 20..=20000, warm-up iters/10 >= 5); the time shown is
//! the slowest rank's. `POLYCHIP_BENCH_SIZES` (comma-separated bytes)
//! overrides the sizes.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use polychip_comm::collectives::{Communicator, DType, ReduceOp};
use polychip_comm::shm::{ShmTransport, unique_job_name};

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
    let transport = ShmTransport::with_job_name(&job, rank, world, Duration::from_secs(30))?;
    let mut c = Communicator::new(Arc::new(transport))?;
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
    if let Some(mut child) = child {
        let status = child.wait()?;
        if !status.success() {
            return Err(format!("rank 1 failed: {status}").into());
        }
    }
    Ok(())
}

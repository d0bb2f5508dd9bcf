//! Rendezvous at scale: how long N local processes take to meet through the
//! rendezvous store (connect, with the job-secret handshake) and pass one
//! barrier, for N = 2 to 256. Rank 0 is this process; the other ranks are
//! copies of this benchmark started as children. Prints, for each N, the
//! median and spread of 3 runs, and the time per rank. A baseline in the
//! same run: the same N processes started and exited with no rendezvous
//! (what process creation alone costs).
//!
//! Run: `cargo bench -p polychip-comm --bench rendezvous`
//! (`POLYCHIP_BENCH_MAX_RANKS` caps N, default 256).

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use polychip_comm::auth::JobAuth;
use polychip_comm::env::RankInfo;
use polychip_comm::tcp_store::{TcpStore, barrier};

const TIMEOUT: Duration = Duration::from_secs(120);

fn auth() -> JobAuth {
    JobAuth::new("rendezvous benchmark secret", "bench").unwrap()
}

/// In a child: join as RANK of WORLD, pass the barrier, leave.
fn child() -> bool {
    let Ok(rank) = std::env::var("BENCH_RANK") else {
        return false;
    };
    let rank: usize = rank.parse().unwrap();
    let world: usize = std::env::var("BENCH_WORLD").unwrap().parse().unwrap();
    if world == 0 {
        return true; // the baseline: start and exit
    }
    let port: u16 = std::env::var("BENCH_PORT").unwrap().parse().unwrap();
    let store =
        TcpStore::connect_with(&RankInfo::local(rank, world, port), &auth(), TIMEOUT).unwrap();
    barrier(&store, "bench", rank, world, TIMEOUT).unwrap();
    true
}

fn spawn(n: usize, world: usize, port: u16) -> Vec<Child> {
    let exe = std::env::current_exe().unwrap();
    (1..n)
        .map(|r| {
            Command::new(&exe)
                .env("BENCH_RANK", r.to_string())
                .env("BENCH_WORLD", world.to_string())
                .env("BENCH_PORT", port.to_string())
                .spawn()
                .unwrap()
        })
        .collect()
}

fn reap(children: Vec<Child>) {
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
}

/// Seconds for N ranks to meet and pass a barrier (rank 0 here).
fn rendezvous(n: usize) -> f64 {
    let t = Instant::now();
    let store = TcpStore::connect_with(&RankInfo::local(0, n, 0), &auth(), TIMEOUT).unwrap();
    let children = spawn(n, n, store.port());
    barrier(&store, "bench", 0, n, TIMEOUT).unwrap();
    let took = t.elapsed().as_secs_f64();
    reap(children);
    store.wait_for_others_to_leave(TIMEOUT).unwrap();
    took
}

/// Seconds to start N - 1 processes that exit at once, and see them go.
fn baseline(n: usize) -> f64 {
    let t = Instant::now();
    reap(spawn(n, 0, 0));
    t.elapsed().as_secs_f64()
}

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    if child() {
        return;
    }
    let max: usize = std::env::var("POLYCHIP_BENCH_MAX_RANKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    println!(
        "rendezvous: N local processes connect to rank 0's store and pass one barrier (medians of 3, min..max)"
    );
    println!(
        "{:>5} {:>22} {:>12} {:>24} {:>8}",
        "N", "rendezvous", "per rank", "start+exit baseline", "ratio"
    );
    let mut n = 2;
    while n <= max {
        let (r, rlo, rhi) = stats((0..3).map(|_| rendezvous(n)).collect());
        let (b, blo, bhi) = stats((0..3).map(|_| baseline(n)).collect());
        println!(
            "{n:>5} {:>9.1} ms ({:.1}..{:.1}) {:>9.2} ms {:>9.1} ms ({:.1}..{:.1}) {:>8.2}",
            r * 1e3,
            rlo * 1e3,
            rhi * 1e3,
            r * 1e3 / n as f64,
            b * 1e3,
            blo * 1e3,
            bhi * 1e3,
            r / b
        );
        n *= 2;
    }
}

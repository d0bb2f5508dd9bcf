//! TCP transport micro-benchmark: two ranks as threads of one process over
//! loopback. Prints the one-way latency of 4 KiB writes (half a ping-pong
//! round trip) and the bandwidth of 64 MiB writes, one way and both ways at
//! once (what a 2-rank all-reduce does), each the median of several runs.
//! Run with `cargo bench -p polychip-comm --bench tcp_pingpong`.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use polychip_comm::store::{MemoryStore, Store};
use polychip_comm::tcp::{TcpOptions, TcpTransport};
use polychip_comm::transport::{SignalId, Transport};

const RUNS: usize = 7;
const SMALL: usize = 4 << 10;
const ROUND_TRIPS: u64 = 2000;
const LARGE: usize = 64 << 20;

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// What each rank measures; rank 0's figures are reported.
fn rank_main(t: &TcpTransport, barrier: &Barrier) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (me, peer) = (t.rank(), 1 - t.rank());
    let (small, _) = t.register(SMALL).expect("register");
    let (large, _) = t.register(LARGE).expect("register");
    let payload = vec![me as u8; LARGE];
    let (ping, bulk, ack, both) = (SignalId(0), SignalId(1), SignalId(2), SignalId(3));
    let (mut latency, mut one_way, mut two_way) = (Vec::new(), Vec::new(), Vec::new());
    let mut pings = 0;
    for run in 0..=RUNS {
        // 4 KiB ping-pong (run 0 warms up).
        barrier.wait();
        let start = Instant::now();
        for _ in 0..ROUND_TRIPS {
            if me == 1 {
                pings += 1;
                t.wait(ping, pings, deadline()).expect("ping");
            }
            t.write(peer, small, 0, &payload[..SMALL], ping)
                .expect("write");
            if me == 0 {
                pings += 1;
                t.wait(ping, pings, deadline()).expect("pong");
            }
        }
        let us = start.elapsed().as_secs_f64() * 1e6 / ROUND_TRIPS as f64 / 2.0;
        // 64 MiB one way, acknowledged by an empty write.
        barrier.wait();
        let start = Instant::now();
        if me == 0 {
            t.write(peer, large, 0, &payload, bulk).expect("write");
            t.wait(ack, run as u64 + 1, deadline()).expect("ack");
        } else {
            t.wait(bulk, run as u64 + 1, deadline()).expect("bulk");
            t.write(peer, small, 0, &[], ack).expect("ack");
        }
        let one = start.elapsed().as_secs_f64();
        // 64 MiB both ways at once.
        barrier.wait();
        let start = Instant::now();
        t.write(peer, large, 0, &payload, both).expect("write");
        t.wait(both, run as u64 + 1, deadline()).expect("both");
        let two = start.elapsed().as_secs_f64();
        if run > 0 {
            latency.push(us);
            one_way.push(one);
            two_way.push(two);
        }
    }
    barrier.wait();
    (latency, one_way, two_way)
}

fn main() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
            thread::spawn(move || {
                let t = TcpTransport::with_options(
                    store,
                    rank,
                    2,
                    Duration::from_secs(30),
                    TcpOptions::default(),
                )
                .expect("mesh");
                rank_main(&t, &barrier)
            })
        })
        .collect();
    let results: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("rank"))
        .collect();
    let (latency, one_way, two_way) = results.into_iter().next().expect("rank 0");
    let gbps = |secs: f64| LARGE as f64 / secs / 1e9;
    println!("tcp loopback, 2 ranks as threads, median of {RUNS} runs");
    println!("  4 KiB one-way latency      {:8.1} us", median(latency));
    let one = median(one_way);
    println!(
        "  64 MiB one way             {:8.2} ms  {:5.2} GB/s",
        one * 1e3,
        gbps(one)
    );
    let two = median(two_way);
    println!(
        "  64 MiB both ways at once   {:8.2} ms  {:5.2} GB/s per direction",
        two * 1e3,
        gbps(two)
    );
}

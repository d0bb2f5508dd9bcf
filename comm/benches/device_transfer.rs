//! Moving a device tensor between two ranks (threads) with
//! `DeviceComm::send` / `recv`: device-direct (Ferrite to Ferrite) against
//! CPU-mediated (Cobalt to Cobalt, Ferrite to Cobalt), at 4 KiB and 64 MiB.
//! Each iteration is a round trip (0 sends, 1 receives and sends back);
//! one-way time = round trip / 2; prints medians, bandwidth and the ratio to
//! device-direct. Cobalt's "staged, one chunk" row disables the chunked
//! overlap to show what it buys. Needs `cargo build --workspace --release`
//! first (for Ferrite's library). Not a test: `cargo bench --bench device_transfer`.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use polychip_comm::collectives::Communicator;
use polychip_comm::device::DeviceComm;
use polychip_comm::shm::ShmTransport;
use polychip_comm::store::MemoryStore;
use polychip_host::{DType, Device, LoadOptions, Runtime};

fn ferrite_path() -> PathBuf {
    let exe = std::env::current_exe().expect("bench executable path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("profile dir");
    let file = "libpolychip_vendor_ferrite.so";
    [dir.join(file), dir.join("deps").join(file)]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{file} not in {}: build the workspace first", dir.display()))
}

/// Median one-way seconds of moving `bytes` between `a` (rank 0) and `b`.
fn one_way(a: &Device, b: &Device, bytes: usize, iters: usize, chunk: Option<usize>) -> f64 {
    let store = Arc::new(MemoryStore::new());
    let times = thread::scope(|s| {
        let hs: Vec<_> = [a, b]
            .into_iter()
            .enumerate()
            .map(|(r, d)| {
                let store = store.clone();
                s.spawn(move || {
                    let t = ShmTransport::new(&*store, r, 2, Duration::from_secs(20)).unwrap();
                    let mut c = Communicator::new(Arc::new(t)).unwrap();
                    let mut dc = DeviceComm::new(&mut c);
                    if let Some(chunk) = chunk {
                        dc.set_chunk_bytes(chunk);
                    }
                    let t = d.zeros(DType::U8, &[bytes as i64]).unwrap();
                    let mut times = Vec::with_capacity(iters);
                    for i in 0..iters + 2 {
                        let start = Instant::now();
                        if r == 0 {
                            dc.send(&t, 1).unwrap();
                            dc.recv(&t, 1).unwrap();
                        } else {
                            dc.recv(&t, 0).unwrap();
                            dc.send(&t, 0).unwrap();
                        }
                        if i >= 2 {
                            times.push(start.elapsed().as_secs_f64() / 2.0);
                        }
                    }
                    times
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).next().unwrap()
    });
    let mut times = times;
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let files = [ferrite_path(), PathBuf::from(cobalt::LIBRARY_PATH)];
    let rt = Runtime::load(&files, &LoadOptions::default());
    assert!(rt.failures().is_empty(), "{:?}", rt.failures());
    let (f, c) = (rt.devices_of("ferrite"), rt.devices_of("cobalt"));
    let cases: [(&str, &Device, &Device, Option<usize>); 4] = [
        ("Ferrite -> Ferrite (device-direct)", &f[0], &f[1], None),
        ("Cobalt -> Cobalt (staged)", &c[0], &c[0], None),
        (
            "Cobalt -> Cobalt (staged, one chunk)",
            &c[0],
            &c[0],
            Some(1 << 30),
        ),
        ("Ferrite -> Cobalt (direct + staged)", &f[0], &c[0], None),
    ];
    for (bytes, iters) in [(4usize << 10, 500), (64 << 20, 12)] {
        println!(
            "\n{} KiB, median one-way of {iters} round trips:",
            bytes >> 10
        );
        println!(
            "{:<40} {:>12} {:>12} {:>8}",
            "path", "time (us)", "GB/s", "ratio"
        );
        let mut base = None;
        for (name, a, b, chunk) in &cases {
            let t = one_way(a, b, bytes, iters, *chunk);
            let base = *base.get_or_insert(t);
            let gbs = bytes as f64 / t / 1e9;
            println!("{name:<40} {:>12.1} {gbs:>12.3} {:>8.2}", t * 1e6, t / base);
        }
    }
}

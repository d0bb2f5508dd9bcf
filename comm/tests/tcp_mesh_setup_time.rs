//! How long a normal TCP mesh takes to build (threads as ranks over
//! loopback), printed as the median of a few runs; compared before and after
//! the mesh's handshake changed. A measurement, not a check: ignored by
//! default; `cargo test --release -p polychip-comm --test
//! tcp_mesh_setup_time -- --ignored --nocapture` prints the figures.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use polychip_comm::store::{MemoryStore, Store};
use polychip_comm::tcp::{TcpOptions, TcpTransport};

fn build(n: usize) -> Duration {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let start = Instant::now();
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let store = Arc::clone(&store);
            thread::spawn(move || {
                TcpTransport::with_options(
                    store,
                    rank,
                    n,
                    Duration::from_secs(20),
                    TcpOptions::default(),
                )
            })
        })
        .collect();
    let meshes: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("rank thread").expect("mesh"))
        .collect();
    let took = start.elapsed();
    drop(meshes);
    took
}

#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn mesh_setup_time() {
    for n in [2, 8, 16] {
        let mut runs: Vec<Duration> = (0..9).map(|_| build(n)).collect();
        runs.sort();
        println!(
            "tcp mesh of {n} ranks: median {:?} (min {:?}, max {:?})",
            runs[runs.len() / 2],
            runs[0],
            runs[runs.len() - 1]
        );
        assert!(runs[runs.len() / 2] < Duration::from_secs(10));
    }
}

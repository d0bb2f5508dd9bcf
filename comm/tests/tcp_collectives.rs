//! The collectives are written once over the `Transport` trait: with 3
//! thread ranks, a communicator over TCP gives bit-identical all-reduce,
//! all-gather, broadcast and all-to-all results to one over shared memory,
//! for small and pipelined sizes. Splitting works over TCP too.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use polychip_comm::collectives::{Communicator, DType, ReduceOp};
use polychip_comm::shm::ShmTransport;
use polychip_comm::store::{MemoryStore, Store};
use polychip_comm::tcp::TcpTransport;
use polychip_comm::tcp_store::barrier;
use polychip_comm::transport::Transport;

const N: usize = 3;
const TIMEOUT: Duration = Duration::from_secs(20);

fn bytes(rank: usize, len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let x = (i as u64 ^ seed << 20).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
            (x as u8).wrapping_add(rank as u8 * 31)
        })
        .collect()
}

/// Rank `rank`'s f32 input: small integers / 8, so sums are exact too.
fn floats(rank: usize, count: usize) -> Vec<u8> {
    (0..count)
        .flat_map(|i| (((i * 7 + rank * 13) % 97) as f32 / 8.0 - 6.0).to_ne_bytes())
        .collect()
}

/// Every collective once, for `count` elements; returns all outputs.
fn run(c: &mut Communicator, count: usize) -> Vec<Vec<u8>> {
    let r = c.rank();
    let mut out = Vec::new();
    let mut f = floats(r, count);
    c.all_reduce(&mut f, DType::F32, ReduceOp::Sum).unwrap();
    out.push(f);
    let mut m = bytes(r, count * 8, 1);
    c.all_reduce(&mut m, DType::I64, ReduceOp::Max).unwrap();
    out.push(m);
    let send = bytes(r, count, 2);
    let mut all = vec![0; count * N];
    c.all_gather(&send, &mut all).unwrap();
    out.push(all);
    let mut b = bytes(r, count + 5, 3);
    c.broadcast(&mut b, 1).unwrap();
    out.push(b);
    let send = bytes(r, count * N, 4);
    let mut recv = vec![0; count * N];
    c.all_to_all(&send, &mut recv).unwrap();
    out.push(recv);
    out
}

fn world(make: impl Fn(Arc<dyn Store>, usize) -> Arc<dyn Transport> + Sync) -> Vec<Vec<Vec<u8>>> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    thread::scope(|s| {
        let handles: Vec<_> = (0..N)
            .map(|r| {
                let (store, make) = (store.clone(), &make);
                s.spawn(move || {
                    let mut c = Communicator::new(make(store.clone(), r)).unwrap();
                    c.set_timeout(TIMEOUT);
                    c.set_store(store.clone());
                    let mut out = Vec::new();
                    for count in [1, 1000, 200_003] {
                        out.extend(run(&mut c, count));
                    }
                    // A group over the same kind of transport: {0, 2} and {1}.
                    let mut g = c.split((r % 2) as u32, 0).unwrap();
                    let mut v = floats(r, 50_000);
                    g.all_reduce(&mut v, DType::F32, ReduceOp::Sum).unwrap();
                    out.push(v);
                    // Keep every transport alive until all ranks are done, as
                    // `bootstrap::Job` does, so this test does not depend on
                    // shutdown timing (shutdown itself is tested in tcp.rs).
                    barrier(&*store, "done", r, N, TIMEOUT).unwrap();
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn tcp_matches_shared_memory() {
    let tcp = world(|store, r| Arc::new(TcpTransport::new(store, r, N, TIMEOUT).unwrap()));
    let shm = world(|store, r| Arc::new(ShmTransport::new(&*store, r, N, TIMEOUT).unwrap()));
    for r in 0..N {
        assert_eq!(tcp[r].len(), shm[r].len());
        for (i, (t, s)) in tcp[r].iter().zip(&shm[r]).enumerate() {
            assert!(t == s, "rank {r}: result {i} differs between tcp and shm");
        }
    }
    // Spot-check against a host reference: the f32 sum of 1000 elements.
    let want: Vec<u8> = (0..1000)
        .flat_map(|i| {
            let x: f32 = (0..N)
                .map(|r| ((i * 7 + r * 13) % 97) as f32 / 8.0 - 6.0)
                .sum();
            x.to_ne_bytes()
        })
        .collect();
    assert_eq!(tcp[2][5], want);
    // The broadcast of root 1 reached everyone.
    assert_eq!(tcp[0][8], bytes(1, 1005, 3));
}

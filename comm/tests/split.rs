//! Sub-communicators with threads as ranks (a `MemoryStore`, shared-memory
//! transports): 4 ranks split into even/odd and into {0,1},{2,3}; each
//! group's all-reduce sees only its members, groups run at the same time
//! without interfering, and the parent stays usable.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use polychip_comm::CommError;
use polychip_comm::collectives::{Communicator, DType, ReduceOp};
use polychip_comm::shm::ShmTransport;
use polychip_comm::store::{MemoryStore, Store};

/// Runs `f` on `n` thread ranks whose communicators know the store.
fn world<T: Send>(n: usize, f: impl Fn(&mut Communicator) -> T + Sync) -> Vec<T> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (store, f) = (store.clone(), &f);
                s.spawn(move || {
                    let t = ShmTransport::new(&*store, r, n, Duration::from_secs(20)).unwrap();
                    let mut c = Communicator::new(Arc::new(t)).unwrap();
                    c.set_timeout(Duration::from_secs(10));
                    c.set_store(store);
                    f(&mut c)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// All-reduces (sum) `count` i64 values `base + i` and returns the result.
fn sum(c: &mut Communicator, base: i64, count: usize) -> Vec<i64> {
    let mut buf: Vec<u8> = (0..count as i64)
        .flat_map(|i| (base + i).to_ne_bytes())
        .collect();
    c.all_reduce(&mut buf, DType::I64, ReduceOp::Sum).unwrap();
    buf.chunks_exact(8)
        .map(|b| i64::from_ne_bytes(b.try_into().unwrap()))
        .collect()
}

fn expect(bases: &[i64], count: usize) -> Vec<i64> {
    (0..count as i64)
        .map(|i| bases.iter().map(|b| b + i).sum())
        .collect()
}

#[test]
fn even_odd_and_halves_reduce_independently() {
    // Large enough for the pipelined algorithm (several chunks).
    let count = 300_000;
    let results = world(4, |c| {
        let r = c.rank();
        let base = 1000 * (r as i64 + 1);
        let mut parity = c.split((r % 2) as u32, r as u32).unwrap();
        // Keys reversed: rank 1 leads {0, 1}, rank 3 leads {2, 3}.
        let mut half = c.split((r / 2) as u32, (3 - r) as u32).unwrap();
        let p = (
            parity.rank(),
            parity.world_size(),
            sum(&mut parity, base, count),
        );
        let h = (half.rank(), half.world_size(), sum(&mut half, base, 5));
        // The parent still works after its children were used.
        let whole = sum(c, base, 3);
        (p, h, whole)
    });
    let bases = [1000, 2000, 3000, 4000];
    for (r, ((pr, pw, p), (hr, hw, h), whole)) in results.into_iter().enumerate() {
        assert_eq!((pr, pw), (r / 2, 2), "rank {r} parity group");
        let members: Vec<i64> = (0..4)
            .filter(|o| o % 2 == r % 2)
            .map(|o| bases[o])
            .collect();
        assert_eq!(p, expect(&members, count), "rank {r} parity sum");
        assert_eq!((hr, hw), (1 - r % 2, 2), "rank {r} half group");
        let members = &bases[(r / 2) * 2..(r / 2) * 2 + 2];
        assert_eq!(h, expect(members, 5), "rank {r} half sum");
        assert_eq!(whole, expect(&bases, 3), "rank {r} world sum");
    }
}

#[test]
fn groups_of_one_and_nested_splits() {
    let results = world(3, |c| {
        let r = c.rank();
        // {0, 1} and {2} alone.
        let mut g = c.split(u32::from(r == 2), 0).unwrap();
        let alone = sum(&mut g, r as i64, 2);
        // Split the group again: everyone alone.
        let mut single = g.split(r as u32, 0).unwrap();
        assert_eq!((single.rank(), single.world_size()), (0, 1));
        (g.world_size(), alone, sum(&mut single, 7, 1))
    });
    assert_eq!(results[0], (2, vec![1, 3], vec![7]));
    assert_eq!(results[1], (2, vec![1, 3], vec![7]));
    assert_eq!(results[2], (1, vec![2, 3], vec![7]));
}

#[test]
fn split_without_a_store_is_a_usage_error() {
    let store = MemoryStore::new();
    let t = ShmTransport::new(&store, 0, 1, Duration::from_secs(5)).unwrap();
    let mut c = Communicator::new(Arc::new(t)).unwrap();
    let e = c.split(0, 0).unwrap_err();
    assert!(matches!(e, CommError::Usage(_)), "{e:?}");
    assert!(e.to_string().contains("no store"), "{e}");
}

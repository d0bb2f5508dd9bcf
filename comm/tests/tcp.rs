//! The TCP transport with threads as ranks over loopback: meshes of 2, 3 and
//! 4 ranks, signalled writes (ping-pong, 64 MiB, both directions at once),
//! a dropped rank surfacing as `PeerLost`, a wait with no writer timing out,
//! and a peer's out-of-bounds write failing the receiver instead of crashing.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use polychip_comm::CommError;
use polychip_comm::store::{MemoryStore, Store};
use polychip_comm::tcp::{TcpOptions, TcpTransport};
use polychip_comm::transport::{RegionId, SignalId, Transport};

const SETUP: Duration = Duration::from_secs(10);

fn soon(secs: u64) -> Instant {
    Instant::now() + Duration::from_secs(secs)
}

/// Builds an `n`-rank mesh, one thread per rank; entry i is rank i.
fn mesh_with(n: usize, timeout: Duration) -> Vec<TcpTransport> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let store = Arc::clone(&store);
            thread::spawn(move || {
                TcpTransport::with_options(store, rank, n, timeout, TcpOptions::default())
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread").expect("mesh"))
        .collect()
}

fn mesh(n: usize) -> Vec<TcpTransport> {
    mesh_with(n, SETUP)
}

/// Runs `f(&transport)` for every rank on its own thread and returns the
/// results by rank. The transports are dropped only after every rank is
/// done: a rank that drops early is a lost peer to the others.
fn each<T: Send + 'static>(
    ranks: Vec<TcpTransport>,
    f: impl Fn(&TcpTransport) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let f = Arc::new(f);
    let handles: Vec<_> = ranks
        .into_iter()
        .map(|t| {
            let f = Arc::clone(&f);
            thread::spawn(move || (f(&t), t))
        })
        .collect();
    let done: Vec<(T, TcpTransport)> = handles
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect();
    done.into_iter()
        .map(|(result, _transport)| result)
        .collect()
}

/// This rank's copy of a registered region.
struct Mem(*mut u8, usize);

impl Mem {
    /// Copies out `range`; call it only after the writes to `range` are signalled.
    fn read(&self, range: std::ops::Range<usize>) -> Vec<u8> {
        assert!(range.start <= range.end && range.end <= self.1);
        // SAFETY: the range lies in a region that lives as long as its
        // transport (the caller's borrow), and the tests read a range only
        // after waiting for the signal its writer raises.
        unsafe { std::slice::from_raw_parts(self.0.add(range.start), range.len()) }.to_vec()
    }
}

fn region(t: &TcpTransport, len: usize) -> (RegionId, Mem) {
    let (id, ptr) = t.register(len).expect("register");
    (id, Mem(ptr, len))
}

#[test]
fn meshes_of_2_3_and_4_ranks_exchange_writes() {
    for n in 2..=4 {
        let got = each(mesh(n), move |t| {
            let (id, mem) = region(t, 64);
            // A fast peer may already write into `mem`; nobody writes `quiet`.
            let (_, quiet) = region(t, 10_000);
            assert!(
                quiet.read(0..10_000).iter().all(|&b| b == 0),
                "registered memory is zeroed"
            );
            assert_eq!(quiet.0 as usize % 4096, 0, "page-aligned");
            let me = t.rank();
            for peer in 0..n {
                t.write(peer, id, me * 8, &[me as u8 + 1; 8], SignalId(3))
                    .expect("write");
            }
            t.wait(SignalId(3), n as u64, soon(10)).expect("wait");
            assert_eq!(t.signal_value(SignalId(3)), n as u64);
            (t.world_size(), t.name(), mem.read(0..n * 8))
        });
        for (world, name, mem) in got {
            assert_eq!((world, name), (n, "tcp"));
            let want: Vec<u8> = (0..n).flat_map(|r| [r as u8 + 1; 8]).collect();
            assert_eq!(mem, want, "{n} ranks");
        }
    }
}

#[test]
fn ping_pong_round_trips() {
    const ROUNDS: u64 = 500;
    each(mesh(2), |t| {
        let (id, mem) = region(t, 4096);
        let (me, peer) = (t.rank(), 1 - t.rank());
        for round in 1..=ROUNDS {
            if me == 1 {
                t.wait(SignalId(0), round, soon(10)).expect("ping");
                assert_eq!(mem.read(0..8), round.to_le_bytes());
            }
            t.write(peer, id, 0, &round.to_le_bytes(), SignalId(0))
                .expect("write");
            if me == 0 {
                t.wait(SignalId(0), round, soon(10)).expect("pong");
                assert_eq!(mem.read(0..8), round.to_le_bytes());
            }
        }
    });
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn a_64_mib_write_arrives_intact() {
    const LEN: usize = 64 << 20;
    let ok = each(mesh(2), |t| {
        let (id, mem) = region(t, LEN + 4096);
        if t.rank() == 0 {
            t.write(1, id, 4096, &pattern(LEN, 7), SignalId(1))
                .expect("write");
            t.wait(SignalId(2), 1, soon(60)).expect("ack");
            true
        } else {
            t.wait(SignalId(1), 1, soon(60)).expect("wait");
            let ok = mem.read(0..4096).iter().all(|&b| b == 0)
                && mem.read(4096..LEN + 4096) == pattern(LEN, 7);
            t.write(0, id, 0, &[], SignalId(2)).expect("ack");
            ok
        }
    });
    assert_eq!(ok, [true, true]);
}

#[test]
fn large_writes_both_ways_at_once_do_not_deadlock() {
    const LEN: usize = 16 << 20;
    let ok = each(mesh(2), |t| {
        let (id, mem) = region(t, LEN);
        let (me, peer) = (t.rank(), 1 - t.rank());
        for chunk in 0..4 {
            let part = LEN / 4;
            t.write(
                peer,
                id,
                chunk * part,
                &pattern(part, (me * 4 + chunk) as u64 + 1),
                SignalId(0),
            )
            .expect("write");
        }
        t.wait(SignalId(0), 4, soon(60)).expect("wait");
        (0..4).all(|chunk| {
            mem.read(chunk * LEN / 4..(chunk + 1) * LEN / 4)
                == pattern(LEN / 4, (peer * 4 + chunk) as u64 + 1)
        })
    });
    assert_eq!(ok, [true, true]);
}

#[test]
fn a_crashed_rank_is_peer_lost_on_the_others() {
    let mut ranks = mesh(3);
    let dropped = ranks.pop().expect("rank 2");
    let survivors = thread::spawn(move || {
        each(ranks, |t| {
            let start = Instant::now();
            let err = t.wait(SignalId(0), 1, soon(30)).expect_err("nobody writes");
            let waited = start.elapsed();
            // The loss is remembered for later calls too.
            let (id, _) = t.register(8).expect("register");
            let later = t
                .write(1 - t.rank(), id, 0, &[1], SignalId(0))
                .expect_err("failed transport");
            let again = t.wait(SignalId(0), 1, soon(30)).expect_err("still failed");
            (err, waited, later, again)
        })
    });
    thread::sleep(Duration::from_millis(100));
    // A crash: no goodbye (a clean drop is a departure, tested below).
    dropped.abort_for_test();
    for (rank, (err, waited, later, again)) in
        survivors.join().expect("survivors").into_iter().enumerate()
    {
        assert!(waited < Duration::from_secs(10), "noticed after {waited:?}");
        for e in [err, later, again] {
            match e {
                CommError::PeerLost { rank: r, peer, .. } => {
                    assert_eq!((r, peer), (rank, 2), "{e}")
                }
                other => panic!("rank {rank}: expected PeerLost, got {other}"),
            }
        }
    }
}

#[test]
fn a_wait_with_no_writer_times_out_at_the_deadline() {
    each(mesh(2), |t| {
        let start = Instant::now();
        let err = t
            .wait(SignalId(9), 1, start + Duration::from_millis(300))
            .expect_err("nobody writes");
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_secs(10),
            "{waited:?}"
        );
        match &err {
            CommError::Timeout {
                rank,
                op,
                waiting_for,
                ..
            } => {
                assert_eq!(*rank, t.rank());
                assert!(
                    op.contains("wait")
                        && waiting_for.contains("signal 9")
                        && waiting_for.contains('1'),
                    "{err}"
                );
            }
            other => panic!("expected Timeout, got {other}"),
        }
        thread::sleep(Duration::from_millis(200));
    });
}

#[test]
fn an_out_of_bounds_write_from_a_peer_fails_the_receiver() {
    // Rank 1 breaks the collective convention and registers a smaller region,
    // so rank 0's write passes its own checks but overflows rank 1's copy.
    let results = each(mesh(2), |t| {
        let len = if t.rank() == 0 { 1024 } else { 16 };
        let (id, _) = region(t, len);
        if t.rank() == 0 {
            t.write(1, id, 512, &[7; 100], SignalId(0))
                .expect("local checks pass");
            // Rank 1 hangs up on the offender.
            t.wait(SignalId(0), 1, soon(10))
                .expect_err("rank 1 closed the connection")
        } else {
            t.wait(SignalId(0), 1, soon(10)).expect_err("invalid write")
        }
    });
    assert!(
        matches!(
            &results[0],
            CommError::PeerLost {
                rank: 0,
                peer: 1,
                ..
            }
        ),
        "{}",
        results[0]
    );
    match &results[1] {
        CommError::Mismatch {
            rank: 1, message, ..
        } => assert!(
            message.contains("peer rank 0") && message.contains("overflows region 0"),
            "{message}"
        ),
        other => panic!("expected Mismatch, got {other}"),
    }
}

#[test]
fn a_write_to_a_region_the_peer_never_registers_fails() {
    let results = each(mesh_with(2, Duration::from_millis(500)), |t| {
        let (first, _) = region(t, 16);
        if t.rank() == 0 {
            let (second, _) = region(t, 16);
            assert_ne!(first, second);
            t.write(1, second, 0, &[1; 16], SignalId(0))
                .expect("local checks pass");
            t.wait(SignalId(0), 1, soon(10))
                .expect_err("rank 1 closed the connection")
        } else {
            t.wait(SignalId(0), 1, soon(10))
                .expect_err("unknown region")
        }
    });
    assert!(
        matches!(
            &results[0],
            CommError::PeerLost {
                rank: 0,
                peer: 1,
                ..
            }
        ),
        "{}",
        results[0]
    );
    match &results[1] {
        CommError::Mismatch {
            rank: 1, message, ..
        } => assert!(
            message.contains("region 1") && message.contains("not registered"),
            "{message}"
        ),
        other => panic!("expected Mismatch, got {other}"),
    }
}

#[test]
fn bad_arguments_are_usage_errors() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    assert!(matches!(
        TcpTransport::new(Arc::clone(&store), 2, 2, SETUP),
        Err(CommError::Usage(_))
    ));
    each(mesh(2), |t| {
        let (id, _) = region(t, 16);
        assert!(matches!(
            t.write(5, id, 0, &[1], SignalId(0)),
            Err(CommError::Usage(_))
        ));
        assert!(matches!(
            t.write(1 - t.rank(), id, 10, &[1; 7], SignalId(0)),
            Err(CommError::Usage(_))
        ));
        assert!(matches!(
            t.write(1 - t.rank(), RegionId(9), 0, &[1], SignalId(0)),
            Err(CommError::Usage(_))
        ));
        assert!(matches!(
            t.write(1 - t.rank(), id, 0, &[1], SignalId(1 << 20)),
            Err(CommError::Usage(_))
        ));
        assert!(matches!(
            t.wait(SignalId(1 << 20), 1, soon(1)),
            Err(CommError::Usage(_))
        ));
    });
}

/// Rank 1 of a 2-rank communicator drops everything right after its last
/// all-reduce, while rank 0 may still be finishing the call and returning
/// credits: rank 0 sees no error. Later writes to the departed rank are
/// discarded, and a wait only it could satisfy fails at once as "left the
/// job".
#[test]
fn a_rank_leaving_right_after_its_last_collective_is_not_an_error() {
    use polychip_comm::collectives::{Communicator, DType, ReduceOp};
    for (round, count) in [1usize, 1000, 300_000]
        .into_iter()
        .cycle()
        .take(12)
        .enumerate()
    {
        let ranks = mesh(2);
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|t| {
                thread::spawn(move || {
                    let t = Arc::new(t);
                    let me = t.rank();
                    let mut c = Communicator::new(t.clone()).expect("communicator");
                    c.set_timeout(Duration::from_secs(20));
                    let mut v: Vec<u8> = (0..count)
                        .flat_map(|i| ((i + me) as f32).to_ne_bytes())
                        .collect();
                    for _ in 0..3 {
                        c.all_reduce(&mut v, DType::F32, ReduceOp::Sum)
                            .unwrap_or_else(|e| panic!("round {round}: rank {me}: {e}"));
                    }
                    drop(c);
                    if me == 1 {
                        // Leave at once.
                        drop(t);
                        return;
                    }
                    // Rank 0: wait until the departure is visible, then
                    // check what writes and waits do.
                    let (id, _) = t.register(16).expect("register");
                    let start = Instant::now();
                    let err = t
                        .wait(SignalId(4000), 1, soon(20))
                        .expect_err("rank 1 left");
                    assert!(start.elapsed() < Duration::from_secs(5));
                    match &err {
                        CommError::PeerLost {
                            rank: 0,
                            peer: 1,
                            why,
                            ..
                        } => {
                            assert_eq!(why, "left the job", "{err}")
                        }
                        other => panic!("expected PeerLost, got {other}"),
                    }
                    t.write(1, id, 0, &[1; 16], SignalId(0))
                        .expect("a write to a departed peer is discarded");
                })
            })
            .collect();
        for h in handles {
            h.join().expect("rank thread");
        }
    }
}

/// A rank that goes away without a goodbye (a crash) is still a lost peer
/// on writes and waits.
#[test]
fn a_crash_without_goodbye_is_still_peer_lost() {
    let mut ranks = mesh(2);
    let crashed = ranks.pop().expect("rank 1");
    let survivor = ranks.pop().expect("rank 0");
    crashed.abort_for_test();
    let (id, _) = survivor.register(16).expect("register");
    let err = survivor
        .wait(SignalId(0), 1, soon(20))
        .expect_err("rank 1 crashed");
    let later = survivor
        .write(1, id, 0, &[1], SignalId(0))
        .expect_err("failed transport");
    for e in [err, later] {
        match &e {
            CommError::PeerLost {
                rank: 0,
                peer: 1,
                why,
                ..
            } => {
                assert_ne!(why, "left the job", "{e}")
            }
            other => panic!("expected PeerLost, got {other}"),
        }
    }
}

/// In a 3-rank mesh, rank 2 leaves cleanly: the others can still talk to
/// each other, writes to rank 2 are discarded, and a wait nobody satisfies
/// ends at its deadline as PeerLost naming rank 2 ("left the job").
#[test]
fn a_clean_departure_fails_waits_only_at_the_deadline() {
    let mut ranks = mesh(3);
    drop(ranks.pop().expect("rank 2"));
    let results = each(ranks, |t| {
        let (id, mem) = region(t, 16);
        let (me, peer) = (t.rank(), 1 - t.rank());
        // Writes to the departed rank are discarded (once its goodbye is
        // in, and before: the socket is merely shut down).
        for _ in 0..3 {
            t.write(2, id, 0, &[9; 16], SignalId(5)).expect("discarded");
            thread::sleep(Duration::from_millis(20));
        }
        t.write(peer, id, me * 8, &[me as u8 + 1; 8], SignalId(1))
            .expect("write");
        t.wait(SignalId(1), 1, soon(10))
            .expect("the live peer still writes");
        let got = mem.read(peer * 8..peer * 8 + 8);
        let start = Instant::now();
        let err = t
            .wait(SignalId(7), 1, start + Duration::from_millis(300))
            .expect_err("nobody writes");
        let waited = start.elapsed();
        thread::sleep(Duration::from_millis(100));
        (got, err, waited, peer)
    });
    for (rank, (got, err, waited, peer)) in results.into_iter().enumerate() {
        assert_eq!(got, [peer as u8 + 1; 8]);
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_secs(10),
            "{waited:?}"
        );
        match &err {
            CommError::PeerLost {
                rank: r,
                peer: 2,
                why,
                ..
            } => {
                assert_eq!((*r, why.as_str()), (rank, "left the job"), "{err}")
            }
            other => panic!("rank {rank}: expected PeerLost, got {other}"),
        }
    }
}

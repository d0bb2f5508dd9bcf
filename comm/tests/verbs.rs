//! The RDMA verbs transport on a machine without RDMA (this one: no
//! InfiniBand support in the kernel): availability is reported as a reason,
//! building the transport fails with `Unavailable` instead of panicking;
//! and the hardware-free parts: store records round-trip, writes split into
//! staging-slot pieces, immediates and work ids encode and decode, and the
//! queue pair attributes follow the options; the failure and departure
//! notices, which travel through the store, over a memory store and the
//! TCP store. The tests of the transport itself between ranks need an RDMA
//! device and say so when they skip.

use polychip_comm::verbs::options::{
    GidEntry, GidKind, VerbsOptions, choose_gid_index, initial_psn, mtu_code, path_mtu, qp_attrs,
};
use polychip_comm::verbs::wire::{
    Chunk, Endpoint, RemoteRegion, WorkId, chunks, decode_imm, encode_imm,
};
use polychip_comm::verbs::{RdmaAvailability, rdma_availability};

fn rdma_present() -> bool {
    std::path::Path::new("/sys/class/infiniband")
        .read_dir()
        .is_ok_and(|mut d| d.next().is_some())
}

#[test]
fn availability_is_a_reason_here() {
    let answer = rdma_availability();
    if rdma_present() {
        eprintln!("this machine has RDMA devices: {answer:?}");
        return;
    }
    match answer {
        RdmaAvailability::Unavailable { reason } => {
            eprintln!("{reason}");
            assert!(reason.contains("RDMA"), "{reason}");
            if cfg!(feature = "verbs") {
                assert!(!reason.contains("feature"), "{reason}");
            } else {
                assert!(reason.contains("`verbs` feature"), "{reason}");
            }
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[cfg(feature = "verbs")]
#[test]
fn transport_is_unavailable_not_a_panic() {
    use std::sync::Arc;
    use std::time::Duration;

    use polychip_comm::CommError;
    use polychip_comm::store::{MemoryStore, Store};
    use polychip_comm::verbs::VerbsTransport;

    if rdma_present() {
        return;
    }
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let err = VerbsTransport::new(store, 0, 2, Duration::from_secs(1), VerbsOptions::default())
        .expect_err("no RDMA here");
    match &err {
        CommError::Unavailable { transport, reason } => {
            assert_eq!(*transport, "verbs");
            assert!(reason.starts_with("RDMA unavailable"), "{reason}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(err.to_string().contains("RDMA unavailable"), "{err}");
}

#[test]
fn endpoint_round_trips() {
    let e = Endpoint {
        lid: 0x1234,
        gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 7],
        qpn: 0x00ab_cdef,
        psn: 0x00fe_dcba,
        mtu: 5,
        ethernet: true,
    };
    let bytes = e.to_bytes();
    assert_eq!(bytes.len(), Endpoint::LEN);
    assert_eq!(Endpoint::from_bytes(&bytes), Ok(e));
    assert!(Endpoint::from_bytes(&bytes[1..]).is_err());
    let mut bad = bytes;
    bad[0] ^= 1;
    assert!(Endpoint::from_bytes(&bad).unwrap_err().contains("magic"));
    let mut bad = bytes;
    bad[31] = 1; // PSN above 24 bits
    assert!(Endpoint::from_bytes(&bad).is_err());
}

#[test]
fn region_round_trips() {
    let r = RemoteRegion {
        addr: 0x7f00_dead_b000,
        len: 1 << 33,
        rkey: 0x8765_4321,
    };
    assert_eq!(RemoteRegion::from_bytes(&r.to_bytes()), Ok(r));
    assert!(RemoteRegion::from_bytes(&[0; 3]).is_err());
    assert!(RemoteRegion::from_bytes(&Endpoint::default().to_bytes()[..24]).is_err());
}

#[test]
fn writes_split_into_slots() {
    let pieces: Vec<Chunk> = chunks(100, 10, 4).collect();
    assert_eq!(
        pieces,
        [
            Chunk {
                src: 0,
                dst: 100,
                len: 4,
                last: false
            },
            Chunk {
                src: 4,
                dst: 104,
                len: 4,
                last: false
            },
            Chunk {
                src: 8,
                dst: 108,
                len: 2,
                last: true
            },
        ]
    );
    assert_eq!(chunks(0, 8, 4).count(), 2);
    assert_eq!(
        chunks(7, 0, 4).collect::<Vec<_>>(),
        [Chunk {
            src: 0,
            dst: 7,
            len: 0,
            last: true
        }]
    );
    let total: usize = chunks(0, (64 << 20) + 3, 1 << 20).map(|c| c.len).sum();
    assert_eq!(total, (64 << 20) + 3);
}

#[test]
fn immediates_and_work_ids() {
    for s in [0, 1, 4095, 0x00ff_ffff] {
        assert_eq!(decode_imm(encode_imm(s).unwrap()), Ok(s));
    }
    assert_eq!(encode_imm(1 << 24), None);
    assert!(decode_imm(7).is_err());
    for w in [
        WorkId::Send { peer: 0, slot: 0 },
        WorkId::Send {
            peer: 1023,
            slot: u32::MAX,
        },
        WorkId::Recv { peer: 0 },
        WorkId::Recv { peer: 77 },
    ] {
        assert_eq!(WorkId::decode(w.encode()), w);
    }
}

#[test]
fn options_from_env_and_attrs() {
    let vars = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let o = VerbsOptions::from_vars(vars(&[
        ("POLYCHIP_RDMA_DEVICE", "mlx5_1"),
        ("POLYCHIP_RDMA_GID_INDEX", "3"),
    ]))
    .unwrap();
    assert_eq!(o.device.as_deref(), Some("mlx5_1"));
    assert_eq!((o.gid_index, o.port), (Some(3), 1));
    assert!(VerbsOptions::from_vars(vars(&[("POLYCHIP_RDMA_GID_INDEX", "x")])).is_err());
    assert!(VerbsOptions::from_vars(vars(&[("POLYCHIP_RDMA_PORT", "0")])).is_err());

    assert_eq!(mtu_code(4096).unwrap(), 5);
    assert!(mtu_code(1500).is_err());
    assert_eq!(path_mtu(5, 3, None).unwrap(), 3);
    assert_eq!(path_mtu(5, 5, Some(1024)).unwrap(), 3);

    let v4 = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1];
    let link_local = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
    let table = [
        GidEntry {
            index: 0,
            gid: link_local,
            kind: GidKind::IbOrRoceV1,
        },
        GidEntry {
            index: 1,
            gid: link_local,
            kind: GidKind::RoceV2,
        },
        GidEntry {
            index: 2,
            gid: v4,
            kind: GidKind::IbOrRoceV1,
        },
        GidEntry {
            index: 3,
            gid: v4,
            kind: GidKind::RoceV2,
        },
    ];
    assert_eq!(choose_gid_index(None, true, &table), 3);
    assert_eq!(choose_gid_index(None, true, &table[..3]), 1);
    assert_eq!(choose_gid_index(None, false, &table), 0);
    assert_eq!(choose_gid_index(Some(2), true, &table), 2);

    let roce = Endpoint {
        gid: v4,
        mtu: 5,
        ethernet: true,
        ..Endpoint::default()
    };
    let a = qp_attrs(
        &VerbsOptions::default(),
        3,
        &roce,
        &Endpoint { mtu: 3, ..roce },
    )
    .unwrap();
    assert!(a.global);
    assert_eq!((a.path_mtu, a.gid_index, a.port), (3, 3, 1));
    assert_eq!((a.retry_cnt, a.rnr_retry), (7, 7));
    let ib = Endpoint {
        lid: 4,
        mtu: 4,
        ..Endpoint::default()
    };
    assert!(
        !qp_attrs(&VerbsOptions::default(), 0, &ib, &Endpoint { lid: 9, ..ib })
            .unwrap()
            .global
    );

    let psn = initial_psn(0, 1, 1, 42);
    assert!(psn < 1 << 24);
    assert_ne!(psn, initial_psn(1, 0, 1, 42));
}

mod notices {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use polychip_comm::CommError;
    use polychip_comm::store::{MemoryStore, Store};
    use polychip_comm::transport::{Departure, SignalId};
    use polychip_comm::verbs::notices::{
        ANNOUNCE_WITHIN, Notices, POLL_EVERY, decode_departure, encode_departure,
    };

    fn board(n: usize) -> (Arc<dyn Store>, Vec<Notices>) {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let all = (0..n)
            .map(|r| Notices::new(store.clone(), "polychip/verbs/1", r, n))
            .collect();
        (store, all)
    }

    /// Rank 1's failure reaches ranks 0 and 2 at their next poll, naming
    /// rank 1 and its reason, as a TCP ABORT frame does; a second
    /// announcement (of either kind) is not posted.
    #[test]
    fn a_failure_notice_reaches_every_peer() {
        let (_, n) = board(3);
        assert!(n[0].failure("wait").is_none());
        assert!(!n[0].poll().unwrap(), "nothing posted yet");
        assert!(n[1].announce_failure("rank 1: all_reduce: it broke"));
        assert!(!n[1].announce_failure("again"));
        assert!(!n[1].announce_departure(&|_| Departure::default()));
        for r in [0, 2] {
            assert!(n[r].poll().unwrap());
            let e = n[r].failure("wait").expect("the failure arrived");
            assert!(e.is_peer_failure(), "{e}");
            assert_eq!(
                e.to_string(),
                format!(
                    "rank {r}: wait: peer rank 1 is gone: it failed: rank 1: all_reduce: it broke"
                )
            );
            assert!(!n[r].poll().unwrap(), "nothing new");
        }
        assert!(n[1].failure("wait").is_none(), "a rank is not its own peer");
    }

    /// Rank 2 leaves after 3 calls, declaring per peer the final value of
    /// one counter: each peer reads its own, a wait for more than it fails
    /// naming rank 2 as departed, a wait it satisfies does not.
    #[test]
    fn a_departure_notice_carries_its_calls_and_finals() {
        let (_, n) = board(3);
        let note = |peer: usize| Departure {
            calls: 3,
            finals: vec![(SignalId(peer as u32), 5 + peer as u64)],
        };
        assert!(n[2].announce_departure(&note));
        for r in [0, 1] {
            assert_eq!(n[r].departures(), 0);
            assert!(n[r].poll().unwrap());
            assert_eq!(n[r].departures(), 1);
            assert_eq!(n[r].departed(2), Some(3));
            assert_eq!(n[r].departed(1 - r), None);
            assert_eq!(n[r].finals(2), [(SignalId(r as u32), 5 + r as u64)]);
            let signal = SignalId(r as u32);
            assert!(n[r].left_short("wait", signal, 5 + r as u64).is_none());
            assert!(n[r].left_short("wait", SignalId(9), 100).is_none());
            let e = n[r].left_short("wait", signal, 6 + r as u64).unwrap();
            assert!(e.is_peer_departure(), "{e}");
            assert!(
                e.to_string().contains("peer rank 2 is gone: it left"),
                "{e}"
            );
            assert!(n[r].failure("wait").is_none(), "a departure is no failure");
        }
    }

    #[test]
    fn departure_records_round_trip_and_bad_ones_are_errors() {
        let note = |peer: usize| Departure {
            calls: 7,
            finals: (0..6)
                .map(|k| (SignalId(k * 10 + peer as u32), k as u64))
                .collect(),
        };
        let raw = encode_departure(4, &note);
        for r in 0..4 {
            let (calls, finals) = decode_departure(&raw, r, 4).unwrap();
            assert_eq!(calls, 7);
            // At most four counters per peer are declared.
            assert_eq!(finals, note(r).finals[..4]);
        }
        let empty = encode_departure(2, &|_| Departure::default());
        assert_eq!(decode_departure(&empty, 1, 2).unwrap(), (0, Vec::new()));
        assert!(
            decode_departure(&raw, 0, 3)
                .unwrap_err()
                .contains("world of 4")
        );
        assert!(decode_departure(&raw[..raw.len() - 1], 0, 4).is_err());
        assert!(decode_departure(&raw[..5], 0, 4).is_err());
        assert!(decode_departure(&[], 0, 1).is_err());
        assert!(decode_departure(&raw, 4, 4).is_err());
    }

    /// A store that takes every request but never answers a SET in time.
    struct Hung;

    impl Store for Hung {
        fn set(&self, _: &str, _: &[u8]) -> polychip_comm::Result<()> {
            std::thread::sleep(Duration::from_secs(5));
            Ok(())
        }
        fn get(&self, key: &str, _: Duration) -> polychip_comm::Result<Vec<u8>> {
            Err(CommError::Io {
                rank: 0,
                op: "store get".into(),
                message: format!("{key}: connection refused"),
            })
        }
        fn add(&self, key: &str, _: i64) -> polychip_comm::Result<i64> {
            self.get(key, Duration::ZERO).map(|_| 0)
        }
    }

    /// A store that hangs bounds an announcement to about a second (a
    /// failing rank must not wait on it), and a store that fails is no
    /// failure of the job: a poll reports it, nothing is noticed.
    #[test]
    fn a_hung_or_failing_store_is_given_up_on() {
        let n = Notices::new(Arc::new(Hung), "polychip/verbs/1", 0, 2);
        let start = Instant::now();
        assert!(!n.announce_failure("rank 0: it broke"));
        let took = start.elapsed();
        assert!(took >= ANNOUNCE_WITHIN / 2, "{took:?}");
        assert!(took < ANNOUNCE_WITHIN * 3, "{took:?}");
        assert!(n.poll().is_err());
        assert!(n.failure("wait").is_none());
        assert_eq!(n.departures(), 0);
    }

    /// Over the TCP rendezvous store the ranks of a job use: rank 1's
    /// failure reaches ranks 0 (the store's host) and 2; once rank 0's
    /// store is gone, rank 2's polls fail (no failure of the job: what it
    /// learned stays) and its own announcement gives up within a second.
    #[test]
    fn notices_travel_through_the_tcp_store_and_outlive_it() {
        use polychip_comm::env::RankInfo;
        use polychip_comm::tcp_store::TcpStore;

        let timeout = Duration::from_secs(20);
        let host = TcpStore::connect(&RankInfo::local(0, 3, 0), timeout).unwrap();
        let port = host.port();
        let stores: Vec<Arc<dyn Store>> = std::iter::once(Arc::new(host) as Arc<dyn Store>)
            .chain((1..3).map(|r| {
                Arc::new(TcpStore::connect(&RankInfo::local(r, 3, port), timeout).unwrap())
                    as Arc<dyn Store>
            }))
            .collect();
        let mut n: Vec<Option<Notices>> = stores
            .iter()
            .enumerate()
            .map(|(r, s)| Some(Notices::new(s.clone(), "polychip/verbs/1", r, 3)))
            .collect();
        drop(stores);
        assert!(
            n[1].as_ref()
                .unwrap()
                .announce_failure("rank 1: barrier: it broke")
        );
        for r in [0, 2] {
            assert!(n[r].as_ref().unwrap().poll().unwrap());
            let e = n[r].as_ref().unwrap().failure("wait").unwrap();
            assert!(
                e.to_string()
                    .contains("it failed: rank 1: barrier: it broke"),
                "{e}"
            );
        }
        // Rank 0's store (the server) goes.
        n[0] = None;
        let e = n[2].as_ref().unwrap().poll().unwrap_err();
        eprintln!("rank 2's poll without the store: {e}");
        assert!(
            n[2].as_ref().unwrap().failure("wait").is_some(),
            "what it learned stays"
        );
        let start = Instant::now();
        let n2 = n[2].take().unwrap();
        assert!(!n2.announce_departure(&|_| Departure::default()));
        assert!(
            start.elapsed() < ANNOUNCE_WITHIN * 3,
            "{:?}",
            start.elapsed()
        );
    }

    /// The notice thread finds a notice within about [`POLL_EVERY`], and
    /// ends at once when closed.
    #[test]
    fn the_notice_thread_finds_notices_and_stops_when_closed() {
        let (_, n) = board(2);
        let n: Vec<Arc<Notices>> = n.into_iter().map(Arc::new).collect();
        let reader = n[0].clone();
        let thread = std::thread::spawn(move || reader.run());
        n[1].announce_departure(&|_| Departure {
            calls: 1,
            finals: Vec::new(),
        });
        let start = Instant::now();
        while n[0].departed(1).is_none() && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let found = start.elapsed();
        eprintln!("found after {found:?}");
        assert_eq!(n[0].departed(1), Some(1));
        assert!(found < POLL_EVERY * 10, "{found:?}");
        let start = Instant::now();
        n[0].close();
        thread.join().unwrap();
        assert!(start.elapsed() < POLL_EVERY, "{:?}", start.elapsed());
    }
}

/// Three ranks over RDMA verbs (threads): rank 2 leaves after one
/// all-reduce, and the others' next all-reduce fails at once naming it;
/// then rank 0 fails on purpose, and rank 1's next call fails naming it.
/// Needs an RDMA device: skips (saying so) without one.
#[cfg(feature = "verbs")]
#[test]
fn verbs_departures_and_failures_reach_the_peers() {
    use std::sync::{Arc, Barrier};
    use std::time::{Duration, Instant};

    use polychip_comm::collectives::{Communicator, DType, ReduceOp};
    use polychip_comm::store::{MemoryStore, Store};
    use polychip_comm::verbs::VerbsTransport;

    if !rdma_present() {
        eprintln!(
            "skipped: no RDMA device here (/sys/class/infiniband is empty or missing); \
             this test needs one (or soft-RoCE: rdma link add rxe0 type rxe netdev eth0)"
        );
        return;
    }
    let timeout = Duration::from_secs(20);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (left, aborted) = (Barrier::new(3), Barrier::new(2));
    std::thread::scope(|s| {
        for r in 0..3 {
            let (store, left, aborted) = (store.clone(), &left, &aborted);
            s.spawn(move || {
                let t = VerbsTransport::new(store, r, 3, timeout, VerbsOptions::default())
                    .expect("verbs transport");
                let mut c = Communicator::new(Arc::new(t)).expect("communicator");
                c.set_timeout(timeout);
                let mut buf = 1i64.to_ne_bytes().to_vec();
                c.all_reduce(&mut buf, DType::I64, ReduceOp::Sum).unwrap();
                assert_eq!(i64::from_ne_bytes(buf[..].try_into().unwrap()), 3);
                if r == 2 {
                    drop(c);
                    left.wait();
                    return;
                }
                left.wait();
                let start = Instant::now();
                let e = c
                    .all_reduce(&mut [0u8; 16], DType::F32, ReduceOp::Sum)
                    .expect_err("an all-reduce without rank 2");
                eprintln!("rank {r} after {:?}: {e}", start.elapsed());
                assert!(start.elapsed() < Duration::from_secs(2));
                assert!(
                    e.to_string().contains("peer rank 2 is gone: it left"),
                    "{e}"
                );
                drop(c);
                aborted.wait();
            });
        }
    });
    // A failure, between two ranks that stay.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let failed = Barrier::new(2);
    std::thread::scope(|s| {
        for r in 0..2 {
            let (store, failed) = (store.clone(), &failed);
            s.spawn(move || {
                let t = VerbsTransport::new(store, r, 2, timeout, VerbsOptions::default())
                    .expect("verbs transport");
                let mut c = Communicator::new(Arc::new(t)).expect("communicator");
                c.set_timeout(timeout);
                c.barrier().unwrap();
                if r == 0 {
                    c.abort("it gave up");
                    failed.wait();
                    std::thread::sleep(Duration::from_secs(3));
                    return;
                }
                failed.wait();
                let start = Instant::now();
                let e = c
                    .recv(&mut [0u8; 8], 0)
                    .expect_err("a receive from a failed rank");
                eprintln!("rank 1 after {:?}: {e}", start.elapsed());
                assert!(start.elapsed() < Duration::from_secs(2));
                assert!(e.is_peer_failure(), "{e}");
                assert!(e.to_string().contains("rank 0: it gave up"), "{e}");
            });
        }
    });
}

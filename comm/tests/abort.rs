//! A failure on one rank reaches its peers at once: a rank whose
//! communicator fails (a mismatch it detects, a panic, `Job::abandon`)
//! announces it to every peer, and a peer blocked in a receive, an
//! all-reduce, a barrier or its job's exit barrier fails within a second or
//! two naming that rank and its error, instead of waiting out its timeout
//! (20 s here); so does a peer that arrives later. Over shared memory and
//! TCP, with threads as ranks; a failure in a split group reaches that
//! group only, and the parent stays usable.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use polychip_comm::CommError;
use polychip_comm::bootstrap::{InitOptions, Job, TransportKind, init_with};
use polychip_comm::collectives::{Communicator, DType, ReduceOp};
use polychip_comm::env::RankInfo;
use polychip_comm::launch::free_port;
use polychip_comm::shm::ShmTransport;
use polychip_comm::store::{MemoryStore, Store};
use polychip_comm::tcp::{TcpOptions, TcpTransport};
use polychip_comm::transport::Transport;

/// Every wait's deadline: a test that waits it out has failed.
const TIMEOUT: Duration = Duration::from_secs(20);
/// How soon a peer must learn of a failure.
const PROMPT: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug)]
enum Kind {
    Shm,
    Tcp,
}

/// Runs `f(rank, communicator)` on `n` thread ranks over `kind`; results
/// in rank order.
fn world<T: Send>(kind: Kind, n: usize, f: impl Fn(usize, Communicator) -> T + Sync) -> Vec<T> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (store, f) = (store.clone(), &f);
                s.spawn(move || {
                    let t: Arc<dyn Transport> = match kind {
                        Kind::Shm => Arc::new(ShmTransport::new(&*store, r, n, TIMEOUT).unwrap()),
                        Kind::Tcp => Arc::new(
                            TcpTransport::with_options(
                                store.clone(),
                                r,
                                n,
                                TIMEOUT,
                                TcpOptions::default(),
                            )
                            .unwrap(),
                        ),
                    };
                    let mut c = Communicator::new(t).unwrap();
                    c.set_timeout(TIMEOUT);
                    c.set_store(store);
                    f(r, c)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// What rank 1 is blocked in when rank 0 fails.
#[derive(Clone, Copy, Debug)]
enum Blocked {
    Recv,
    AllReduce,
    Barrier,
}

impl Blocked {
    fn run(self, c: &mut Communicator) -> polychip_comm::Result<()> {
        match self {
            Blocked::Recv => c.recv(&mut [0u8; 8], 0),
            Blocked::AllReduce => c.all_reduce(&mut [0u8; 16], DType::F32, ReduceOp::Sum),
            Blocked::Barrier => c.barrier(),
        }
    }
}

/// Checks that `e` (taking `took`) names rank 0's failure and came fast.
fn names_rank_0(e: &CommError, took: Duration, rank0_said: &str) {
    eprintln!("rank 1 after {took:?}: {e}");
    assert!(took < PROMPT, "took {took:?}: {e}");
    assert!(e.is_peer_failure(), "{e}");
    let text = e.to_string();
    assert!(
        text.starts_with("rank 1: ") && text.contains("peer rank 0 is gone: it failed: "),
        "{text}"
    );
    assert!(text.contains(rank0_said), "{text} lacks {rank0_said:?}");
}

/// Rank 1 sends 8 bytes and then blocks; rank 0 receives 16 and fails
/// with a mismatch only it sees: rank 1 hears of it at once.
fn mismatch_reaches_a_blocked_peer(kind: Kind, blocked: Blocked) {
    let results = world(kind, 2, |rank, mut c| {
        let start = Instant::now();
        let r = match rank {
            0 => {
                let e = c.recv(&mut [0u8; 16], 1).unwrap_err();
                assert!(matches!(e, CommError::Mismatch { .. }), "{e}");
                // Rank 0 stays in the job a while: rank 1 learns through
                // the transport, not from rank 0 leaving.
                thread::sleep(Duration::from_millis(2500));
                Err(e)
            }
            _ => {
                c.send(&[1u8; 8], 0).unwrap();
                blocked.run(&mut c)
            }
        };
        (r, start.elapsed())
    });
    let (rank0, _) = &results[0];
    let said = rank0.as_ref().unwrap_err().to_string();
    assert!(
        said.contains("rank 1 called send/recv of 8 bytes"),
        "{said}"
    );
    let (r, took) = &results[1];
    let e = r.as_ref().expect_err("rank 1 succeeded");
    names_rank_0(e, *took, &said);
}

#[test]
fn shm_a_mismatch_fails_a_peer_blocked_in_recv_at_once() {
    mismatch_reaches_a_blocked_peer(Kind::Shm, Blocked::Recv);
}

#[test]
fn shm_a_mismatch_fails_a_peer_blocked_in_all_reduce_at_once() {
    mismatch_reaches_a_blocked_peer(Kind::Shm, Blocked::AllReduce);
}

#[test]
fn shm_a_mismatch_fails_a_peer_blocked_in_barrier_at_once() {
    mismatch_reaches_a_blocked_peer(Kind::Shm, Blocked::Barrier);
}

#[test]
fn tcp_a_mismatch_fails_a_peer_blocked_in_recv_at_once() {
    mismatch_reaches_a_blocked_peer(Kind::Tcp, Blocked::Recv);
}

#[test]
fn tcp_a_mismatch_fails_a_peer_blocked_in_all_reduce_at_once() {
    mismatch_reaches_a_blocked_peer(Kind::Tcp, Blocked::AllReduce);
}

#[test]
fn tcp_a_mismatch_fails_a_peer_blocked_in_barrier_at_once() {
    mismatch_reaches_a_blocked_peer(Kind::Tcp, Blocked::Barrier);
}

/// Rank 0 fails and closes its communicator before rank 1 makes its next
/// call: the late call fails at once too, naming rank 0 (three ranks, so
/// that rank 0's departure alone would not end rank 1's wait).
fn a_late_peer_fails_at_once(kind: Kind) {
    let failed = Barrier::new(3);
    let results = world(kind, 3, |rank, mut c| {
        let r = match rank {
            0 => {
                let e = c.recv(&mut [0u8; 16], 1).unwrap_err();
                failed.wait();
                drop(c);
                Err(e)
            }
            1 => {
                c.send(&[1u8; 8], 0).unwrap();
                failed.wait();
                thread::sleep(Duration::from_millis(300));
                let start = Instant::now();
                let r = c.all_reduce(&mut [0u8; 16], DType::F32, ReduceOp::Sum);
                return (r, start.elapsed());
            }
            _ => {
                failed.wait();
                // Rank 2 joins rank 1's all-reduce and waits in it too.
                let start = Instant::now();
                let r = c.all_reduce(&mut [0u8; 16], DType::F32, ReduceOp::Sum);
                return (r, start.elapsed());
            }
        };
        (r, Duration::ZERO)
    });
    let said = results[0].0.as_ref().unwrap_err().to_string();
    let (r, took) = &results[1];
    names_rank_0(r.as_ref().unwrap_err(), *took, &said);
    let (r, took) = &results[2];
    let e = r.as_ref().unwrap_err();
    assert!(*took < PROMPT, "took {took:?}: {e}");
    assert!(
        e.to_string().contains("peer rank 0 is gone: it failed: "),
        "{e}"
    );
}

#[test]
fn shm_a_peer_arriving_after_a_failure_fails_at_once() {
    a_late_peer_fails_at_once(Kind::Shm);
}

#[test]
fn tcp_a_peer_arriving_after_a_failure_fails_at_once() {
    a_late_peer_fails_at_once(Kind::Tcp);
}

/// A rank's thread panics mid-job (its communicator dropped while
/// unwinding): its peer blocked in an all-reduce fails at once naming it.
fn a_panic_reaches_a_blocked_peer(kind: Kind) {
    let results = world(kind, 3, |rank, mut c| {
        let start = Instant::now();
        let r = match rank {
            0 => {
                let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                    let _held = c;
                    thread::sleep(Duration::from_millis(200));
                    panic!("rank 0 gives up");
                }));
                assert!(panicked.is_err());
                Ok(())
            }
            _ => c.all_reduce(&mut [0u8; 16], DType::F32, ReduceOp::Sum),
        };
        (r, start.elapsed())
    });
    for (r, took) in &results[1..] {
        let e = r.as_ref().unwrap_err();
        assert!(*took < PROMPT, "took {took:?}: {e}");
        assert!(
            e.to_string()
                .contains("peer rank 0 is gone: it failed: rank 0: its thread panicked"),
            "{e}"
        );
    }
}

#[test]
fn shm_a_rank_that_panics_fails_its_peers_at_once() {
    a_panic_reaches_a_blocked_peer(Kind::Shm);
}

#[test]
fn tcp_a_rank_that_panics_fails_its_peers_at_once() {
    a_panic_reaches_a_blocked_peer(Kind::Tcp);
}

/// A mismatch inside the group {0, 1} of four ranks fails that group's
/// other member at once; the group {2, 3} and the parent are unaffected.
fn a_groups_failure_stays_in_the_group(kind: Kind) {
    let results = world(kind, 4, |rank, mut c| {
        let mut group = c.split((rank / 2) as u32, rank as u32).unwrap();
        let start = Instant::now();
        let r = match (rank, group.rank()) {
            (0 | 1, 0) => group.recv(&mut [0u8; 16], 1).map(|_| 0),
            (0 | 1, _) => group
                .send(&[1u8; 8], 0)
                .and_then(|()| group.recv(&mut [0u8; 8], 0))
                .map(|_| 0),
            _ => {
                let mut buf = 1i64.to_ne_bytes().to_vec();
                group
                    .all_reduce(&mut buf, DType::I64, ReduceOp::Sum)
                    .map(|()| i64::from_ne_bytes(buf[..].try_into().unwrap()))
            }
        };
        let took = start.elapsed();
        // The parent still works on every rank.
        let mut buf = 1i64.to_ne_bytes().to_vec();
        c.all_reduce(&mut buf, DType::I64, ReduceOp::Sum).unwrap();
        assert_eq!(i64::from_ne_bytes(buf[..].try_into().unwrap()), 4);
        c.barrier().unwrap();
        drop(group);
        (r, took)
    });
    let (r, _) = &results[0];
    assert!(matches!(r, Err(CommError::Mismatch { .. })), "{r:?}");
    let (r, took) = &results[1];
    let e = r.as_ref().unwrap_err();
    assert!(*took < PROMPT, "took {took:?}: {e}");
    // In the group's ranks: group rank 0 (parent rank 0) failed.
    assert!(
        e.to_string().contains("peer rank 0 is gone: it failed: "),
        "{e}"
    );
    for (r, _) in &results[2..] {
        assert_eq!(r.as_ref().unwrap(), &2);
    }
}

#[test]
fn shm_a_failure_in_a_group_reaches_its_members_only() {
    a_groups_failure_stays_in_the_group(Kind::Shm);
}

#[test]
fn tcp_a_failure_in_a_group_reaches_its_members_only() {
    a_groups_failure_stays_in_the_group(Kind::Tcp);
}

/// Runs `body(rank, job)` on both ranks of a whole job of two thread ranks
/// (a real TCP store, `init_with`) over `transport`; results in rank order.
fn two_rank_job<T: Send>(
    transport: TransportKind,
    body: impl Fn(usize, Job) -> T + Sync,
) -> Vec<T> {
    let port = free_port().unwrap();
    let body = &body;
    thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                s.spawn(move || {
                    let mut options = InitOptions::from_env().unwrap();
                    options.transport = Some(transport);
                    options.timeout = TIMEOUT;
                    let info = RankInfo {
                        local_rank: rank,
                        local_world_size: 2,
                        ..RankInfo::local(rank, 2, port)
                    };
                    body(rank, init_with(info, options).unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Whole jobs (a real TCP store, `init_with`) of two thread ranks: rank
/// `failing` fails a receive with a mismatch; the other, which sent and
/// went on to finish the job, gets an error naming the failed rank within
/// a second or two at its exit barrier, whether the failed rank stays a
/// while (`linger`) or leaves at once (it announces its failure at the
/// barrier). The failed rank's own finish returns at once.
fn job_exit_fails_at_once(transport: TransportKind, failing: usize, linger: Duration) {
    let results = two_rank_job(transport, |rank, mut job| {
        let other = 1 - rank;
        if rank == failing {
            let e = job.recv(&mut [0u8; 16], other).unwrap_err();
            thread::sleep(linger);
            let start = Instant::now();
            job.finish().unwrap();
            (Err(e), start.elapsed())
        } else {
            job.send(&[1u8; 8], other).unwrap();
            let start = Instant::now();
            (job.finish(), start.elapsed())
        }
    });
    let (failed, took) = &results[failing];
    assert!(*took < PROMPT, "the failed rank's finish took {took:?}");
    let said = failed.as_ref().unwrap_err().to_string();
    let (r, took) = &results[1 - failing];
    let e = r.as_ref().expect_err("the job ended cleanly");
    assert!(*took < PROMPT + linger, "took {took:?}: {e}");
    let text = e.to_string();
    assert!(
        text.contains(&format!("peer rank {failing} is gone: it failed: ")) && text.contains(&said),
        "{text} lacks {said:?}"
    );
}

#[test]
fn shm_a_failed_rank_leaving_at_once_fails_the_others_exit() {
    job_exit_fails_at_once(TransportKind::Shm, 1, Duration::ZERO);
    job_exit_fails_at_once(TransportKind::Shm, 0, Duration::ZERO);
}

#[test]
fn shm_a_failed_rank_that_lingers_fails_the_others_exit_at_once() {
    job_exit_fails_at_once(TransportKind::Shm, 1, Duration::from_secs(3));
}

#[test]
fn tcp_a_failed_rank_leaving_at_once_fails_the_others_exit() {
    job_exit_fails_at_once(TransportKind::Tcp, 1, Duration::ZERO);
    job_exit_fails_at_once(TransportKind::Tcp, 0, Duration::ZERO);
}

#[test]
fn tcp_a_failed_rank_that_lingers_fails_the_others_exit_at_once() {
    job_exit_fails_at_once(TransportKind::Tcp, 0, Duration::from_secs(3));
}

/// `Job::abandon` on one rank while the other waits in a receive: the
/// receive fails at once naming the rank that abandoned.
#[test]
fn an_abandoned_job_fails_a_peers_receive_at_once() {
    for transport in [TransportKind::Shm, TransportKind::Tcp] {
        let results = two_rank_job(transport, |rank, mut job| {
            job.barrier().unwrap();
            if rank == 1 {
                thread::sleep(Duration::from_millis(200));
                job.abandon();
                return None;
            }
            let start = Instant::now();
            let e = job.recv(&mut [0u8; 8], 1).unwrap_err();
            let took = start.elapsed();
            let _ = job.finish();
            Some((e, took))
        });
        let (e, took) = results[0].as_ref().unwrap();
        assert!(*took < PROMPT, "{transport:?}: took {took:?}: {e}");
        assert!(
            e.to_string()
                .contains("peer rank 1 is gone: it failed: rank 1: it abandoned the job"),
            "{transport:?}: {e}"
        );
    }
}

/// What every survivor's error says of a rank that left before the call
/// (its own finding, or another survivor's announced one quoting it).
fn names_departure(e: &CommError, took: Duration, peer: usize) {
    let text = e.to_string();
    eprintln!("after {took:?}: {text}");
    assert!(took < PROMPT, "took {took:?}: {text}");
    assert!(
        text.contains(&format!(
            "peer rank {peer} is gone: it left (destroyed its communicator) before this call"
        )),
        "{text}"
    );
}

/// Three ranks make one all-reduce; rank 2 then drops its healthy
/// communicator (`blocked`: while ranks 0 and 1 already wait in their next
/// all-reduce; otherwise before they begin it). Ranks 0 and 1 fail within
/// milliseconds naming rank 2 and saying it left, instead of waiting out
/// the timeout (a clean departure of one rank among three used to be no
/// failure until every peer had left).
fn a_departure_fails_the_next_collective(kind: Kind, blocked: bool) {
    let left = Barrier::new(3);
    let results = world(kind, 3, |rank, mut c| {
        let mut buf = 1i64.to_ne_bytes().to_vec();
        c.all_reduce(&mut buf, DType::I64, ReduceOp::Sum).unwrap();
        assert_eq!(i64::from_ne_bytes(buf[..].try_into().unwrap()), 3);
        if rank == 2 {
            if blocked {
                thread::sleep(Duration::from_millis(300));
            }
            drop(c);
            left.wait();
            return None;
        }
        if !blocked {
            left.wait();
        }
        let start = Instant::now();
        let r = c.all_reduce(&mut [0u8; 16], DType::F32, ReduceOp::Sum);
        let took = start.elapsed();
        if blocked {
            left.wait();
        }
        // Later calls fail too (the communicator is broken).
        assert!(c.barrier().is_err());
        Some((r, took))
    });
    for (rank, r) in results.iter().enumerate().take(2) {
        let (r, took) = r.as_ref().unwrap();
        let e = r
            .as_ref()
            .expect_err("the all-reduce succeeded without rank 2");
        let wait = if blocked {
            // It began 300 ms before rank 2 left.
            took.saturating_sub(Duration::from_millis(300))
        } else {
            *took
        };
        eprint!("rank {rank} ");
        names_departure(e, wait, 2);
    }
}

#[test]
fn shm_a_rank_that_left_fails_the_next_collective_at_once() {
    a_departure_fails_the_next_collective(Kind::Shm, false);
}

#[test]
fn shm_a_rank_leaving_fails_a_collective_waiting_for_it_at_once() {
    a_departure_fails_the_next_collective(Kind::Shm, true);
}

#[test]
fn tcp_a_rank_that_left_fails_the_next_collective_at_once() {
    a_departure_fails_the_next_collective(Kind::Tcp, false);
}

#[test]
fn tcp_a_rank_leaving_fails_a_collective_waiting_for_it_at_once() {
    a_departure_fails_the_next_collective(Kind::Tcp, true);
}

/// Rank 2 sends rank 0 one message and leaves: rank 0 still receives it
/// (sent before it left), and its next receive from rank 2 fails at once;
/// rank 1's send to rank 2 fails at once; ranks 0 and 1 go on between
/// themselves (a departure fails only what involves the departed rank).
fn a_departure_fails_point_to_point_with_it(kind: Kind) {
    let left = Barrier::new(3);
    let results = world(kind, 3, |rank, mut c| {
        // Every rank has mapped every other's memory before one leaves.
        c.barrier().unwrap();
        if rank == 2 {
            c.send(&7u64.to_ne_bytes(), 0).unwrap();
            drop(c);
            left.wait();
            return Vec::new();
        }
        left.wait();
        let mut errors = Vec::new();
        if rank == 0 {
            let mut got = [0u8; 8];
            c.recv(&mut got, 2).unwrap();
            assert_eq!(u64::from_ne_bytes(got), 7);
            c.send(&[1u8; 8], 1).unwrap();
            c.recv(&mut got, 1).unwrap();
            let start = Instant::now();
            let r = c.recv(&mut got, 2);
            errors.push((r, start.elapsed()));
        } else {
            let mut got = [0u8; 8];
            c.recv(&mut got, 0).unwrap();
            c.send(&[2u8; 8], 0).unwrap();
            // Over TCP the departure comes as a frame: let it be read.
            thread::sleep(Duration::from_millis(100));
            let start = Instant::now();
            let r = c.send(&[0u8; 8], 2);
            errors.push((r, start.elapsed()));
        }
        errors
    });
    for r in &results[..2] {
        let (r, took) = &r[0];
        names_departure(r.as_ref().unwrap_err(), *took, 2);
    }
}

#[test]
fn shm_a_rank_that_left_fails_sends_and_receives_with_it() {
    a_departure_fails_point_to_point_with_it(Kind::Shm);
}

#[test]
fn tcp_a_rank_that_left_fails_sends_and_receives_with_it() {
    a_departure_fails_point_to_point_with_it(Kind::Tcp);
}

/// The normal end: three ranks make a pipelined all-reduce (4 MiB) and a
/// small one, then drop their communicators as each finishes, without a
/// barrier, the first at once: the departures leave the others' last call
/// whole and error-free.
fn ranks_leaving_after_their_last_call_is_clean(kind: Kind) {
    world(kind, 3, |rank, mut c| {
        let mut big = vec![0u8; 4 << 20];
        c.all_reduce(&mut big, DType::F32, ReduceOp::Sum).unwrap();
        let mut buf = 1i64.to_ne_bytes().to_vec();
        if rank != 0 {
            thread::sleep(Duration::from_millis(50 * rank as u64));
        }
        c.all_reduce(&mut buf, DType::I64, ReduceOp::Sum).unwrap();
        assert_eq!(i64::from_ne_bytes(buf[..].try_into().unwrap()), 3);
        let mut b = vec![rank as u8; 300 << 10];
        c.broadcast(&mut b, 1).unwrap();
        assert!(b.iter().all(|&x| x == 1));
    });
}

#[test]
fn shm_ranks_leaving_after_their_last_call_end_cleanly() {
    ranks_leaving_after_their_last_call_is_clean(Kind::Shm);
}

#[test]
fn tcp_ranks_leaving_after_their_last_call_end_cleanly() {
    ranks_leaving_after_their_last_call_is_clean(Kind::Tcp);
}

/// Whole jobs of three ranks: rank 2 finishes the job (its exit barrier)
/// while ranks 0 and 1 make another all-reduce. They fail at once naming
/// rank 2, and then fail its exit barrier too as they leave (rank 2's
/// finish used to wait out its timeout at the barrier, the others theirs
/// in the all-reduce).
#[test]
fn a_rank_finishing_early_fails_the_others_next_collective_at_once() {
    for transport in [TransportKind::Shm, TransportKind::Tcp] {
        let port = free_port().unwrap();
        let handles: Vec<_> = (0..3)
            .map(|rank| {
                thread::spawn(move || {
                    let mut options = InitOptions::from_env().unwrap();
                    options.transport = Some(transport);
                    options.timeout = TIMEOUT;
                    let info = RankInfo {
                        local_rank: rank,
                        local_world_size: 3,
                        ..RankInfo::local(rank, 3, port)
                    };
                    let mut job = init_with(info, options).unwrap();
                    job.barrier().unwrap();
                    let start = Instant::now();
                    if rank == 2 {
                        let r = job.finish();
                        return (r, start.elapsed());
                    }
                    thread::sleep(Duration::from_millis(100));
                    let start = Instant::now();
                    let r = job.all_reduce(&mut [0u8; 16], DType::F32, ReduceOp::Sum);
                    let took = start.elapsed();
                    drop(job);
                    (r, took)
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        for (r, took) in &results[..2] {
            eprint!("{transport:?}: ");
            names_departure(r.as_ref().unwrap_err(), *took, 2);
        }
        let (r, took) = &results[2];
        let e = r
            .as_ref()
            .expect_err("rank 2's exit succeeded without the others");
        eprintln!("{transport:?}: rank 2 after {took:?}: {e}");
        assert!(
            *took < PROMPT + Duration::from_millis(100),
            "took {took:?}: {e}"
        );
        assert!(e.to_string().contains("it failed: "), "{e}");
    }
}

/// Host reduce and broadcast (root 0) of three ranks where rank 1's buffer
/// is twice the others': the rank that sees the mismatch (the reduce's
/// root, the broadcast's rank 1) fails with `Mismatch`; every other rank
/// fails the call or, at the latest, its next call at once, naming the
/// mismatch (the announcement), never waiting out the timeout.
fn a_rooted_mismatch_fails_every_rank(kind: Kind, reduce: bool) {
    let results = world(kind, 3, |rank, mut c| {
        // (A rank still in this barrier may hear of the failure already.)
        let ready = c.barrier();
        let mut buf = vec![0u8; if rank == 1 { 32 } else { 16 }];
        let start = Instant::now();
        let first = ready.and_then(|()| match reduce {
            true => c.reduce(&mut buf, DType::F32, ReduceOp::Sum, 0),
            false => c.broadcast(&mut buf, 0),
        });
        // The others stay a while, so that no one learns it from a
        // departure.
        thread::sleep(Duration::from_millis(300));
        let next = c.barrier();
        (first, next, start.elapsed())
    });
    let what = if reduce { "reduce" } else { "broadcast" };
    for (rank, (first, next, took)) in results.iter().enumerate() {
        eprintln!("{kind:?} {what}: rank {rank}: {first:?}; next call: {next:?}");
        assert!(*took < PROMPT + Duration::from_millis(300), "took {took:?}");
        let e = first
            .as_ref()
            .err()
            .unwrap_or_else(|| next.as_ref().unwrap_err());
        let text = e.to_string();
        assert!(
            text.contains(&format!("{what} of 32")) || text.contains(&format!("{what} of 8 x")),
            "rank {rank}: {text}"
        );
    }
    let mismatch = if reduce { 0 } else { 1 };
    assert!(
        matches!(results[mismatch].0, Err(CommError::Mismatch { .. })),
        "{:?}",
        results[mismatch].0
    );
}

#[test]
fn shm_a_rooted_mismatch_fails_every_rank_by_its_next_call() {
    a_rooted_mismatch_fails_every_rank(Kind::Shm, true);
    a_rooted_mismatch_fails_every_rank(Kind::Shm, false);
}

#[test]
fn tcp_a_rooted_mismatch_fails_every_rank_by_its_next_call() {
    a_rooted_mismatch_fails_every_rank(Kind::Tcp, true);
    a_rooted_mismatch_fails_every_rank(Kind::Tcp, false);
}

/// Rank 1 drops its communicator straight after setup while rank 0 is
/// slow between creating its files and opening its peers' (descheduled
/// there, simulated): rank 0's setup still succeeds, and its first
/// collective fails at once naming rank 1 as departed. Rank 1 used to
/// remove its files before rank 0 opened them, and rank 0 waited for them
/// until its timeout ("waiting for rank 1 to register region 0").
#[test]
fn shm_a_rank_leaving_straight_after_setup_is_a_departure_not_a_timeout() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let timeout = Duration::from_secs(5);
    let results: Vec<_> = thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|r| {
                let store = store.clone();
                s.spawn(move || {
                    if r == 0 {
                        polychip_comm::shm::set_attach_delay_for_test(Duration::from_millis(300));
                    }
                    let start = Instant::now();
                    let t = ShmTransport::new(&*store, r, 2, timeout)
                        .map_err(|e| format!("rank {r}'s transport: {e}"))?;
                    let mut c = Communicator::new(Arc::new(t))
                        .map_err(|e| format!("rank {r}'s communicator: {e}"))?;
                    c.set_timeout(timeout);
                    let setup = start.elapsed();
                    if r == 1 {
                        drop(c);
                        return Ok((None, setup));
                    }
                    let start = Instant::now();
                    let e = c.all_reduce(&mut [0u8; 16], DType::F32, ReduceOp::Sum);
                    Ok((Some((e, start.elapsed())), setup))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let results: Vec<(_, Duration)> = results
        .into_iter()
        .map(|r: Result<_, String>| r.unwrap())
        .collect();
    let (r, took) = results[0].0.as_ref().unwrap();
    eprintln!("setups took {:?}, {:?}", results[0].1, results[1].1);
    names_departure(r.as_ref().unwrap_err(), *took, 1);
    assert!(r.as_ref().unwrap_err().is_peer_departure());
}

/// Rank 0 sends rank 1 a message rank 1 never receives; rank 1 then drops
/// its communicator (the send returned: rank 1 was there). Rank 0's next
/// call, a receive from rank 2 that rank 2 satisfies, fails naming rank 1
/// and the message it never took, as does the call after; the send used to
/// go nowhere unnoticed (over TCP, a send in the window before the leave
/// frame is read).
fn an_untaken_send_to_a_departed_rank_fails_the_next_call(kind: Kind) {
    let left = Barrier::new(3);
    let results = world(kind, 3, |rank, mut c| {
        c.barrier().unwrap();
        match rank {
            0 => {
                c.send(&[1u8; 8], 1).unwrap();
                left.wait();
                let start = Instant::now();
                let r = c.recv(&mut [0u8; 8], 2);
                let took = start.elapsed();
                let next = c.barrier();
                Some((r, took, next))
            }
            1 => {
                left.wait();
                drop(c);
                None
            }
            _ => {
                left.wait();
                thread::sleep(Duration::from_millis(300));
                // Rank 0 may have failed (and said so) already.
                let _ = c.send(&[2u8; 8], 0);
                None
            }
        }
    });
    let (r, took, next) = results[0].as_ref().unwrap();
    let e = r
        .as_ref()
        .expect_err("the message rank 1 never took went unnoticed");
    eprintln!("{kind:?}: after {took:?}: {e}");
    assert!(e.is_peer_departure(), "{e}");
    let text = e.to_string();
    assert!(
        text.starts_with("rank 0: send/recv: peer rank 1 is gone: it left")
            && text.contains("it never took 1 message this rank sent it"),
        "{text}"
    );
    assert!(*took < PROMPT, "took {took:?}");
    assert!(next.is_err(), "the communicator stays failed: {next:?}");
}

#[test]
fn shm_an_untaken_send_to_a_departed_rank_fails_the_next_call() {
    an_untaken_send_to_a_departed_rank_fails_the_next_call(Kind::Shm);
}

#[test]
fn tcp_an_untaken_send_to_a_departed_rank_fails_the_next_call() {
    an_untaken_send_to_a_departed_rank_fails_the_next_call(Kind::Tcp);
}

/// Sets up `ranks` ((rank, world) each) over shared memory as threads and
/// makes one all-reduce of 1 each: each rank's result (the sum, or the
/// error's words) and how long it took. A rank whose all-reduce succeeded
/// keeps its transport until every thread's set-up has returned (at most
/// `timeout`): a thread started late on a loaded machine (CI, once) then
/// still meets the job running, not a job that has ended and removed its
/// files.
fn shm_ranks(ranks: &[(usize, usize)], timeout: Duration) -> Vec<(Result<i64, String>, Duration)> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let set_up = std::sync::atomic::AtomicUsize::new(0);
    thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|&(r, w)| {
                let (store, set_up) = (store.clone(), &set_up);
                s.spawn(move || {
                    let start = Instant::now();
                    let t = ShmTransport::new(&*store, r, w, timeout);
                    set_up.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let sum = t
                        .and_then(|t| Communicator::new(Arc::new(t)))
                        .and_then(|mut c| {
                            c.set_timeout(timeout);
                            let mut b = 1i64.to_ne_bytes().to_vec();
                            c.all_reduce(&mut b, DType::I64, ReduceOp::Sum)?;
                            let took = start.elapsed();
                            while set_up.load(std::sync::atomic::Ordering::SeqCst) < ranks.len()
                                && start.elapsed() < timeout
                            {
                                thread::sleep(Duration::from_millis(1));
                            }
                            Ok((i64::from_ne_bytes(b[..].try_into().unwrap()), took))
                        });
                    match sum {
                        Ok((sum, took)) => (Ok(sum), took),
                        Err(e) => (Err(e.to_string()), start.elapsed()),
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Without the launcher's checks (a bare `ShmTransport`, as a split group
/// or an embedding builds): a second thread given rank 1 fails at once
/// naming the rank given twice, and ranks 0 and 1 run the job (it replaced
/// the first one's files: one rank 1 failed with a `Mismatch` about a
/// "call #0", the other with "it closed its transport"); ranks started
/// with different world sizes fail at once naming both sizes (they waited
/// out the timeout naming a rank).
#[test]
fn shm_a_rank_given_twice_or_a_world_that_differs_fails_at_once() {
    // A side of a world mismatch that misses the other's size waits this
    // long, naming a rank.
    let timeout = Duration::from_secs(4);
    let results = shm_ranks(&[(0, 2), (1, 2), (1, 2)], timeout);
    eprintln!("{results:?}");
    assert_eq!(results[0].0, Ok(2), "{results:?}");
    let refused: Vec<_> = results[1..]
        .iter()
        .filter_map(|(r, took)| Some((r.as_ref().err()?, took)))
        .collect();
    assert_eq!(refused.len(), 1, "{results:?}");
    let (e, took) = refused[0];
    assert!(
        e.contains("rank 1: shm map: ") && e.contains("has taken rank 1 (a rank given twice)"),
        "{e}"
    );
    assert!(*took < PROMPT, "took {took:?}");
    assert!(results[1..].iter().any(|(r, _)| *r == Ok(2)), "{results:?}");

    let results = shm_ranks(&[(0, 2), (1, 3)], timeout);
    eprintln!("{results:?}");
    let named =
        |e: &String| e.contains("was started with a world of") && e.contains("the same world size");
    assert!(
        results
            .iter()
            .any(|(r, took)| r.as_ref().is_err_and(named) && *took < PROMPT),
        "{results:?}"
    );
    assert!(results.iter().all(|(r, _)| r.is_err()), "{results:?}");
    // Usually both (the first to see it keeps its files a moment for the
    // other); one may still wait out the timeout on a loaded machine.
    let both = results.iter().all(|(r, _)| r.as_ref().is_err_and(named));
    eprintln!("both sides named the sizes: {both}");
}

/// Whole jobs of two ranks: rank 0 sends rank 1 a message that rank 1
/// never receives, and rank 1 finishes its job. Rank 0's finish fails
/// naming rank 1 and the message it never took, and announces it at the
/// exit barrier, where rank 1 fails too (both used to finish cleanly, the
/// message lost unnoticed).
#[test]
fn a_job_whose_message_was_never_taken_fails_its_exit() {
    for transport in [TransportKind::Shm, TransportKind::Tcp] {
        let sent = Barrier::new(2);
        let results = two_rank_job(transport, |rank, mut job| {
            job.barrier().unwrap();
            if rank == 0 {
                job.send(&[1u8; 8], 1).unwrap();
                sent.wait();
                // Until rank 1's departure has arrived.
                thread::sleep(Duration::from_millis(300));
            } else {
                sent.wait();
            }
            let start = Instant::now();
            (job.finish(), start.elapsed())
        });
        eprintln!("{transport:?}: {results:?}");
        let (r, took) = &results[0];
        let e = r
            .as_ref()
            .expect_err("rank 0's lost message went unnoticed");
        assert!(e.is_peer_departure(), "{e}");
        assert!(
            e.to_string()
                .contains("it never took 1 message this rank sent it"),
            "{e}"
        );
        assert!(*took < PROMPT, "took {took:?}");
        let (r, took) = &results[1];
        let e = r.as_ref().expect_err("rank 1's exit succeeded");
        assert!(
            e.to_string().contains("it never took 1 message"),
            "{transport:?}: {e}"
        );
        assert!(*took < PROMPT + Duration::from_millis(300), "took {took:?}");
    }
}

/// Over TCP, rank 2 drops its communicator straight after setup while
/// rank 0 joins 300 ms late: ranks 0 and 1 set up, and their first
/// collective fails at once naming rank 2 as departed (the mesh is
/// complete once every connection is, and the departure comes over it).
#[test]
fn tcp_a_rank_leaving_straight_after_setup_is_a_departure_not_a_timeout() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let timeout = Duration::from_secs(5);
    let results: Vec<_> = thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|r| {
                let store = store.clone();
                s.spawn(move || {
                    if r == 0 {
                        thread::sleep(Duration::from_millis(300));
                    }
                    let options = TcpOptions::default();
                    let t = TcpTransport::with_options(store, r, 3, timeout, options)
                        .map_err(|e| format!("rank {r}'s transport: {e}"))?;
                    let mut c = Communicator::new(Arc::new(t))
                        .map_err(|e| format!("rank {r}'s communicator: {e}"))?;
                    c.set_timeout(timeout);
                    if r == 2 {
                        drop(c);
                        return Ok(None);
                    }
                    let start = Instant::now();
                    let e = c.all_reduce(&mut [0u8; 16], DType::F32, ReduceOp::Sum);
                    Ok(Some((e, start.elapsed())))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in results.into_iter().take(2) {
        let r: Result<_, String> = r;
        let (e, took) = r.unwrap().unwrap();
        names_departure(e.as_ref().unwrap_err(), took, 2);
    }
}

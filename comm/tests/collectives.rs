//! Collectives with threads as ranks (a `MemoryStore` shared through an Arc,
//! one `ShmTransport` per thread), checked against host references: exact
//! for integers, within a few ulps scaled by the world size for floats.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use half::{bf16, f16};
use polychip_comm::CommError;
use polychip_comm::collectives::{Communicator, DType, ReduceOp};
use polychip_comm::shm::ShmTransport;
use polychip_comm::store::{MemoryStore, Store};

/// The dtypes reduced by arithmetic (bools, as logic, are the kernel's
/// unit tests' and the device tests').
fn dtypes() -> impl Iterator<Item = DType> {
    DType::ALL.into_iter().filter(|&d| d != DType::Bool)
}
const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];
const SIZES: [usize; 5] = [0, 1, 7, 1000, 65537];

/// Runs `f` on `n` thread ranks and returns their results in rank order,
/// each operation bounded at 20 s (a loaded machine can hold a debug rank
/// back for seconds between two operations).
fn world<T: Send>(n: usize, f: impl Fn(&mut Communicator) -> T + Sync) -> Vec<T> {
    world_timing_out(n, Duration::from_secs(20), f)
}

/// [`world`] with operations bounded at `timeout`, for tests of timeouts.
fn world_timing_out<T: Send>(
    n: usize,
    timeout: Duration,
    f: impl Fn(&mut Communicator) -> T + Sync,
) -> Vec<T> {
    let store = Arc::new(MemoryStore::new());
    thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (store, f) = (store.clone(), &f);
                s.spawn(move || {
                    let t =
                        ShmTransport::new(&*store, r, n, Duration::from_secs(20)).expect("connect");
                    let mut c = Communicator::new(Arc::new(t)).expect("communicator");
                    c.set_timeout(timeout);
                    // Every rank finishes connecting before any starts its
                    // part: a rank that leaves at once (the lost-peer test)
                    // must not vanish while a slower peer is still mapping
                    // its regions.
                    store.set(&format!("ready/{r}"), b"1").expect("store");
                    for k in 0..n {
                        store
                            .get(&format!("ready/{k}"), Duration::from_secs(30))
                            .expect("peers ready");
                    }
                    f(&mut c)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    })
}

fn hash(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Rank `rank`'s input of `count` elements for call `seed`.
fn input(dtype: DType, rank: usize, count: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(count * dtype.size());
    for i in 0..count {
        let h = hash(seed << 40 ^ (rank as u64) << 32 ^ i as u64);
        let f = ((h % 2001) as f64 - 1000.0) / 256.0;
        match dtype {
            DType::F32 => out.extend((f as f32).to_ne_bytes()),
            DType::F16 => out.extend(f16::from_f64(f).to_ne_bytes()),
            DType::BF16 => out.extend(bf16::from_f64(f).to_ne_bytes()),
            DType::I32 => out.extend((h as i32).to_ne_bytes()),
            DType::I64 => out.extend((h as i64).to_ne_bytes()),
            DType::F64 => out.extend(f.to_ne_bytes()),
            DType::U8 => out.push(h as u8),
            DType::Bool => unreachable!("bools are tested elsewhere"),
        }
    }
    out
}

fn float(dtype: DType, b: &[u8], i: usize) -> f64 {
    match dtype {
        DType::F32 => f32::from_ne_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()) as f64,
        DType::F16 => f16::from_ne_bytes(b[i * 2..i * 2 + 2].try_into().unwrap()).to_f64(),
        DType::BF16 => bf16::from_ne_bytes(b[i * 2..i * 2 + 2].try_into().unwrap()).to_f64(),
        DType::F64 => f64::from_ne_bytes(b[i * 8..i * 8 + 8].try_into().unwrap()),
        _ => unreachable!(),
    }
}

fn int(dtype: DType, b: &[u8], i: usize) -> i64 {
    match dtype {
        DType::I32 => i32::from_ne_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()) as i64,
        DType::U8 => b[i] as i64,
        _ => i64::from_ne_bytes(b[i * 8..i * 8 + 8].try_into().unwrap()),
    }
}

/// Checks `got` (elements `first..first + len` of the reduction) against a reference.
fn check(dtype: DType, op: ReduceOp, inputs: &[Vec<u8>], first: usize, got: &[u8], what: &str) {
    let n = inputs.len();
    for k in 0..got.len() / dtype.size() {
        let i = first + k;
        if matches!(dtype, DType::I32 | DType::I64 | DType::U8) {
            let xs = inputs.iter().map(|b| int(dtype, b, i));
            let want = match (dtype, op) {
                (DType::U8, ReduceOp::Sum | ReduceOp::Avg) => {
                    xs.fold(0u8, |a, x| a.wrapping_add(x as u8)) as i64
                        / if op == ReduceOp::Avg { n as i64 } else { 1 }
                }
                (DType::I32, ReduceOp::Sum | ReduceOp::Avg) => {
                    xs.fold(0i32, |a, x| a.wrapping_add(x as i32)) as i64
                        / if op == ReduceOp::Avg { n as i64 } else { 1 }
                }
                (_, ReduceOp::Sum | ReduceOp::Avg) => {
                    xs.fold(0i64, |a, x| a.wrapping_add(x))
                        / if op == ReduceOp::Avg { n as i64 } else { 1 }
                }
                (_, ReduceOp::Max) => xs.max().unwrap(),
                (_, ReduceOp::Min) => xs.min().unwrap(),
                // The kernel's own unit test and the device tests have
                // the products and bitwise operators.
                (_, op) => unreachable!("{op:?} is not among OPS"),
            };
            assert_eq!(int(dtype, got, k), want, "{what}: element {i}");
            continue;
        }
        let xs: Vec<f64> = inputs.iter().map(|b| float(dtype, b, i)).collect();
        let want = match op {
            ReduceOp::Sum => xs.iter().sum(),
            ReduceOp::Avg => xs.iter().sum::<f64>() / n as f64,
            ReduceOp::Max => xs.iter().copied().fold(f64::MIN, f64::max),
            ReduceOp::Min => xs.iter().copied().fold(f64::MAX, f64::min),
            op => unreachable!("{op:?} is not among OPS"),
        };
        let eps = match dtype {
            DType::F64 => f64::EPSILON,
            DType::F32 => f32::EPSILON as f64,
            DType::F16 => 2f64.powi(-10),
            _ => 2f64.powi(-7),
        };
        let tol = 2.0 * n as f64 * eps * xs.iter().map(|x| x.abs()).sum::<f64>() + 1e-30;
        let g = float(dtype, got, k);
        assert!(
            (g - want).abs() <= tol,
            "{what}: element {i}: got {g}, want {want}"
        );
    }
}

fn every_operation(n: usize) {
    world(n, |c| {
        let (me, mut seed) = (c.rank(), 0u64);
        for dtype in dtypes() {
            for count in SIZES {
                seed += 1;
                let what =
                    |op: &str| format!("world {n} rank {me} {op} {} x {count}", dtype.name());
                let inputs: Vec<Vec<u8>> = (0..n).map(|r| input(dtype, r, count, seed)).collect();
                for op in OPS {
                    let mut buf = inputs[me].clone();
                    c.all_reduce(&mut buf, dtype, op).unwrap();
                    check(dtype, op, &inputs, 0, &buf, &what(op.name()));
                }
                let mut out = vec![0u8; inputs[me].len()];
                c.all_reduce_into(&inputs[me], &mut out, dtype, ReduceOp::Sum)
                    .unwrap();
                check(
                    dtype,
                    ReduceOp::Sum,
                    &inputs,
                    0,
                    &out,
                    &what("all_reduce_into"),
                );
                let mut buf = inputs[me].clone();
                let root = count % n;
                c.reduce(&mut buf, dtype, ReduceOp::Max, root).unwrap();
                match me == root {
                    true => check(dtype, ReduceOp::Max, &inputs, 0, &buf, &what("reduce")),
                    false => assert_eq!(buf, inputs[me], "{}", what("reduce (non-root)")),
                }
                // reduce_scatter: each rank's send holds n blocks of `count`.
                let big: Vec<Vec<u8>> = (0..n).map(|r| input(dtype, r, count * n, seed)).collect();
                let mut part = vec![0u8; count * dtype.size()];
                c.reduce_scatter(&big[me], &mut part, dtype, ReduceOp::Sum)
                    .unwrap();
                check(
                    dtype,
                    ReduceOp::Sum,
                    &big,
                    me * count,
                    &part,
                    &what("reduce_scatter"),
                );
                let mut all = vec![0u8; inputs[me].len() * n];
                c.all_gather(&inputs[me], &mut all).unwrap();
                assert_eq!(all, inputs.concat(), "{}", what("all_gather"));
                let mut a2a = vec![0u8; big[me].len()];
                c.all_to_all(&big[me], &mut a2a).unwrap();
                let b = count * dtype.size();
                let want: Vec<u8> = (0..n)
                    .flat_map(|j| big[j][me * b..(me + 1) * b].to_vec())
                    .collect();
                assert_eq!(a2a, want, "{}", what("all_to_all"));
                let mut buf = inputs[me].clone();
                c.broadcast(&mut buf, root).unwrap();
                assert_eq!(buf, inputs[root], "{}", what("broadcast"));
                c.send(&inputs[me], (me + 1) % n).unwrap();
                let mut got = vec![0u8; b];
                c.recv(&mut got, (me + n - 1) % n).unwrap();
                assert_eq!(got, inputs[(me + n - 1) % n], "{}", what("send/recv"));
                c.barrier().unwrap();
            }
        }
    });
}

#[test]
fn every_operation_world_2() {
    every_operation(2);
}

#[test]
fn every_operation_world_3() {
    every_operation(3);
}

#[test]
fn every_operation_world_4() {
    every_operation(4);
}

#[test]
fn all_reduce_64_mib_f32() {
    let count = 16 << 20;
    world(2, |c| {
        c.set_timeout(Duration::from_secs(60)); // a debug build reduces slowly
        let me = c.rank();
        let mut buf: Vec<u8> = (0..count)
            .flat_map(|i| ((i % 1000) as f32 * (me as f32 + 1.0)).to_ne_bytes())
            .collect();
        c.all_reduce(&mut buf, DType::F32, ReduceOp::Sum).unwrap();
        for (i, b) in buf.chunks_exact(4).enumerate() {
            assert_eq!(
                f32::from_ne_bytes(b.try_into().unwrap()),
                (i % 1000) as f32 * 3.0,
                "element {i}"
            );
        }
    });
}

#[test]
fn deterministic_mode_is_bit_identical() {
    let count = 300_001;
    let runs: Vec<Vec<Vec<u8>>> = (0..2)
        .map(|_| {
            world(3, |c| {
                c.set_deterministic(true);
                let mut buf = input(DType::F32, c.rank(), count, 7);
                c.all_reduce(&mut buf, DType::F32, ReduceOp::Sum).unwrap();
                buf
            })
        })
        .collect();
    assert!(runs[0].iter().all(|r| *r == runs[0][0]), "ranks disagree");
    assert_eq!(runs[0], runs[1], "runs differ");
}

#[test]
fn missing_rank_times_out() {
    let gate = Barrier::new(3);
    let results = world_timing_out(3, Duration::from_secs(2), |c| {
        let start = Instant::now();
        let r = if c.rank() == 2 {
            Ok(())
        } else {
            c.all_reduce(&mut [0u8; 64], DType::F32, ReduceOp::Sum)
        };
        gate.wait();
        (r, start.elapsed())
    });
    for (rank, (r, took)) in results.iter().take(2).enumerate() {
        let e = r.clone().expect_err("a rank never arrived");
        // The first rank to time out announces it: the other may learn of
        // it from that rank ("peer rank 0 is gone: it failed: rank 0:
        // all_reduce: timed out ... waiting for rank 2's message").
        let announced = e.is_peer_failure() && e.to_string().contains("timed out");
        assert!(matches!(e, CommError::Timeout { .. }) || announced, "{e}");
        assert!(
            e.to_string()
                .starts_with(&format!("rank {rank}: all_reduce:"))
                && e.to_string().contains("rank 2"),
            "{e}"
        );
        assert!(*took < Duration::from_secs(15), "took {took:?}");
    }
}

#[test]
fn lost_peer_is_reported() {
    let results = world(2, |c| match c.rank() {
        0 => Some(c.all_reduce(&mut [0u8; 1 << 20], DType::F32, ReduceOp::Sum)),
        _ => None,
    });
    let e = results[0].clone().unwrap().expect_err("rank 1 left");
    assert!(matches!(e, CommError::PeerLost { peer: 1, .. }), "{e}");
    assert!(
        e.to_string()
            .starts_with("rank 0: all_reduce: peer rank 1 is gone"),
        "{e}"
    );
}

/// Ranks that disagree on a broadcast's root (each its own) fail at once,
/// naming both calls: each used to return its own data as if broadcast.
#[test]
fn a_broadcast_whose_ranks_disagree_on_the_root_fails_on_every_rank() {
    for len in [16usize, 3 << 20] {
        let results = world(2, |c| {
            let me = c.rank();
            let mut buf = vec![me as u8 + 1; len];
            let started = std::time::Instant::now();
            (c.broadcast(&mut buf, me), started.elapsed())
        });
        for (r, took) in results {
            let e = r.expect_err("the roots differ");
            assert!(matches!(e, CommError::Mismatch { .. }), "{e}");
            assert!(e.to_string().contains("(as its root)"), "{e}");
            assert!(took < std::time::Duration::from_secs(5), "{took:?}");
        }
    }
    // Agreeing ranks still broadcast, the root included.
    let results = world(3, |c| {
        let mut buf = vec![c.rank() as u8; 5000];
        c.broadcast(&mut buf, 2).map(|()| buf)
    });
    for r in results {
        assert!(r.unwrap().iter().all(|&b| b == 2));
    }
}

#[test]
fn mismatched_counts_and_dtypes() {
    for dtype_differs in [false, true] {
        let results = world(2, |c| {
            let me = c.rank();
            let (len, dtype) = match (dtype_differs, me) {
                (false, _) => (4000 + 4 * me, DType::F32),
                (true, 0) => (4000, DType::F32),
                (true, _) => (4000, DType::I32),
            };
            let r = c.all_reduce(&mut vec![0u8; len], dtype, ReduceOp::Sum);
            let again = c.barrier();
            (r, again)
        });
        for (r, again) in results {
            let e = r.expect_err("mismatch");
            assert!(matches!(e, CommError::Mismatch { .. }), "{e}");
            assert!(
                e.to_string().contains("rank") && e.to_string().contains("this rank called"),
                "{e}"
            );
            assert!(
                again.is_err(),
                "a broken communicator must refuse further calls"
            );
        }
    }
}

/// Message `k` from rank `from` to rank `to`: bytes that say whose it is.
fn message(from: usize, to: usize, k: usize, len: usize) -> Vec<u8> {
    input(DType::U8, from * 64 + to, len, k as u64)
}

/// A group's sends and receives run together: two ranks that each send 4
/// MiB before receiving (a swap, which blocks with plain calls past 1 MiB)
/// and a ring of three with several messages a lane, of sizes from 0 to
/// 3 MiB, arrive intact and in order; a rank may take a group's sends
/// with plain receives.
#[test]
fn a_group_of_sends_and_receives_does_not_wait_on_itself() {
    use polychip_comm::collectives::P2p;
    let results = world(2, |c| {
        let (me, peer) = (c.rank(), 1 - c.rank());
        let out = message(me, peer, 0, 4 << 20);
        let mut got = vec![0u8; 4 << 20];
        c.p2p_group(&mut [P2p::Send(&out, peer), P2p::Recv(&mut got, peer)])
            .map(|()| got == message(peer, me, 0, 4 << 20))
    });
    assert!(results.into_iter().all(|r| r.unwrap()), "the swap");
    let sizes = [3 << 20, 0, 17, 1 << 20];
    let results = world(3, |c| {
        let (me, n) = (c.rank(), 3);
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let outs: Vec<Vec<u8>> = (0..sizes.len())
            .map(|k| message(me, next, k, sizes[k]))
            .collect();
        let mut ins: Vec<Vec<u8>> = sizes.iter().map(|&s| vec![0u8; s]).collect();
        if me == 2 {
            // Plain calls on this rank, in the group's order per lane: it
            // sends first, which its group-running peers let it do.
            for o in &outs {
                c.send(o, next)?;
            }
            for i in ins.iter_mut() {
                c.recv(i, prev)?;
            }
        } else {
            let mut ops: Vec<P2p<'_>> = Vec::new();
            for (o, i) in outs.iter().zip(ins.iter_mut()) {
                ops.push(P2p::Recv(i, prev));
                ops.push(P2p::Send(o, next));
            }
            c.p2p_group(&mut ops)?;
        }
        Ok::<_, CommError>((0..sizes.len()).all(|k| ins[k] == message(prev, me, k, sizes[k])))
    });
    for (r, ok) in results.into_iter().enumerate() {
        assert!(ok.unwrap(), "rank {r}'s messages");
    }
}

#[test]
fn a_group_refuses_a_peer_outside_it_and_names_a_size_mismatch() {
    use polychip_comm::collectives::P2p;
    let results = world(2, |c| {
        let e = c.p2p_group(&mut [P2p::Send(&[1, 2], 5)]);
        let mut back = [0u8; 2];
        let unpaired = c.p2p_group(&mut [P2p::Send(&[1, 2], c.rank())]);
        let sizes = c.p2p_group(&mut [
            P2p::Send(&[1, 2, 3], c.rank()),
            P2p::Recv(&mut back, c.rank()),
        ]);
        (
            e.unwrap_err().to_string(),
            unpaired.unwrap_err().to_string(),
            sizes.unwrap_err().to_string(),
        )
    });
    for (e, unpaired, sizes) in results {
        assert!(
            e.contains("with rank 5, not a rank of this communicator (ranks 0 to 1)"),
            "{e}"
        );
        assert!(
            unpaired.contains("sends this rank 1 message(s) and receives 0"),
            "{unpaired}"
        );
        assert!(
            sizes.contains("has 3 bytes but the receive it pairs with (operation 1) has 2"),
            "{sizes}"
        );
    }
    let results = world(2, |c| {
        let (me, peer) = (c.rank(), 1 - c.rank());
        let out = vec![0u8; 100 + me];
        let mut got = vec![0u8; 100 + peer + 1];
        c.p2p_group(&mut [P2p::Send(&out, peer), P2p::Recv(&mut got, peer)])
    });
    for r in results {
        let e = r.expect_err("the sizes differ");
        assert!(matches!(e, CommError::Mismatch { .. }), "{e}");
        // In bytes, with no root or call number (they are a collective's).
        let m = e.to_string();
        assert!(
            m.contains("send/recv of 10") && m.contains(" bytes (") && !m.contains("root"),
            "{m}"
        );
    }
}

#[test]
fn a_group_that_cannot_move_times_out_naming_what_it_waits_for() {
    use polychip_comm::collectives::P2p;
    let results = world_timing_out(2, Duration::from_secs(2), |c| {
        if c.rank() == 1 {
            // Never sends; stays until rank 0 has given up (timeout 2 s).
            thread::sleep(Duration::from_millis(2500));
            return None;
        }
        let mut got = vec![0u8; 10];
        Some(c.p2p_group(&mut [P2p::Send(&[7u8; 10], 1), P2p::Recv(&mut got, 1)]))
    });
    let e = results[0].as_ref().unwrap().as_ref().unwrap_err();
    assert!(matches!(e, CommError::Timeout { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("rank 1's next message (a group of sends and receives)"),
        "{e}"
    );
}

/// Sends to this rank go to its receives from this rank, the first to the
/// first, beside the sends and receives with the other ranks.
#[test]
fn a_group_pairs_its_sends_to_this_rank_with_its_receives_in_order() {
    use polychip_comm::collectives::P2p;
    let results = world(2, |c| {
        let (me, peer) = (c.rank(), 1 - c.rank());
        let (a, b) = (message(me, me, 0, 3000), message(me, me, 1, 5));
        let out = message(me, peer, 0, 2 << 20);
        let (mut x, mut y, mut got) = (vec![0u8; 3000], vec![0u8; 5], vec![0u8; 2 << 20]);
        c.p2p_group(&mut [
            P2p::Recv(&mut x, me),
            P2p::Send(&out, peer),
            P2p::Send(&a, me),
            P2p::Recv(&mut got, peer),
            P2p::Recv(&mut y, me),
            P2p::Send(&b, me),
        ])
        .unwrap();
        x == a && y == b && got == message(peer, me, 0, 2 << 20)
    });
    assert!(results.into_iter().all(|ok| ok));
}

/// A group waiting for a late peer sleeps: a second of waiting costs its
/// thread well under a second of CPU (the project's rule: spin briefly,
/// then sleep).
#[test]
fn a_group_waiting_for_a_late_peer_does_not_burn_its_core() {
    use polychip_comm::collectives::P2p;
    fn cpu_seconds() -> f64 {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `t` is writable.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
        t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
    }
    let results = world(2, |c| {
        let (me, peer) = (c.rank(), 1 - c.rank());
        if me == 1 {
            thread::sleep(Duration::from_secs(1));
        }
        let (out, mut got) = (vec![me as u8; 100], vec![0u8; 100]);
        let (cpu, wall) = (cpu_seconds(), Instant::now());
        c.p2p_group(&mut [P2p::Send(&out, peer), P2p::Recv(&mut got, peer)])
            .unwrap();
        (cpu_seconds() - cpu, wall.elapsed(), got[0] as usize == peer)
    });
    let (cpu, wall, ok) = &results[0];
    assert!(ok);
    assert!(wall.as_secs_f64() > 0.8, "rank 0 waited {wall:?}");
    assert!(
        *cpu < 0.3,
        "rank 0 spent {cpu:.3} s of CPU waiting {wall:?}"
    );
}

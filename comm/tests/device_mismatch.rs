//! Device collectives whose ranks disagree on the whole call while their
//! first chunks agree (sizes that differ past the first 4 MiB chunk, a
//! broadcast's root, dtype): every rank fails at once with a `Mismatch`
//! naming both calls (or with the announced failure of the rank that found
//! the mismatch first, which names them), never a partial success on one
//! rank and a timeout on another. Threads as ranks, Ferrite (device-direct) beside Cobalt
//! (staged). Needs `cargo build --workspace` first (for Ferrite's library).

mod common;
use common::{device, tensor, values, world_of_failures};

use std::time::{Duration, Instant};

use polychip_comm::CommError;
use polychip_comm::collectives::ReduceOp;
use polychip_comm::device::{CHUNK, DeviceComm};
use polychip_host::{DType, Device};

/// Long enough that a rank left waiting is told apart from one that failed
/// at once (see [`FAST`]).
const TIMEOUT: Duration = Duration::from_secs(20);
/// A mismatch is reported within this on every rank.
const FAST: Duration = Duration::from_secs(10);
/// Elements of f32 in one chunk.
const C: usize = CHUNK / 4;

/// Ferrite:0 (direct), Cobalt:0 (staged), Ferrite:1, ... for `n` ranks.
fn devices(n: usize) -> Vec<Device> {
    (0..n)
        .map(|r| match r % 2 {
            0 => device("ferrite", r / 2),
            _ => device("cobalt", 0),
        })
        .collect()
}

/// What each rank's call returned: its error's text, whether a
/// `Mismatch`, and how long the call took.
type Outcome = (Option<String>, bool, Duration);

fn run(
    n: usize,
    f: impl Fn(&Device, &mut DeviceComm) -> Result<(), CommError> + Sync,
) -> Vec<Outcome> {
    world_of_failures(&devices(n), TIMEOUT, |d, dc| {
        let start = Instant::now();
        let r = f(d, dc);
        let took = start.elapsed();
        // A rank may hear of the mismatch from the rank that found it
        // first (its announced failure) before it finds it itself.
        let mismatch = match &r {
            Err(CommError::Mismatch { .. }) => true,
            Err(e) => e.is_peer_failure() && e.to_string().contains("this rank called"),
            Ok(()) => false,
        };
        (r.err().map(|e| e.to_string()), mismatch, took)
    })
}

/// Every rank failed at once with a mismatch whose message holds each of
/// `want` (rank `r`'s message also names another rank's call).
fn every_rank_mismatches(what: &str, outcomes: &[Outcome], want: &[&str]) {
    for (r, (e, mismatch, took)) in outcomes.iter().enumerate() {
        let e = e
            .as_deref()
            .unwrap_or_else(|| panic!("{what}: rank {r} returned success: {outcomes:?}"));
        assert!(*mismatch, "{what}: rank {r} failed otherwise: {e}");
        assert!(*took < FAST, "{what}: rank {r} took {took:?}: {e}");
        assert!(e.contains("this rank called"), "{what}: rank {r}: {e}");
        for w in want {
            assert!(e.contains(w), "{what}: rank {r}: no {w:?} in {e}");
        }
    }
}

#[test]
fn all_reduce_sizes_that_differ_past_the_first_chunk_fail_on_every_rank() {
    for n in [2, 3] {
        let outcomes = run(n, |d, dc| {
            let me = dc.comm().rank();
            // The last rank has one element more: a second chunk.
            let count = C + usize::from(me == n - 1);
            let t = tensor(d, DType::F32, &values(me, count));
            dc.all_reduce(&t, ReduceOp::Sum)
        });
        let (a, b) = (
            format!("all_reduce of {C} x f32"),
            format!("all_reduce of {} x f32", C + 1),
        );
        every_rank_mismatches(&format!("{n} ranks"), &outcomes, &[&a, &b]);
    }
}

#[test]
fn all_reduce_into_sizes_that_differ_past_the_first_chunk_fail_on_every_rank() {
    let outcomes = run(2, |d, dc| {
        let me = dc.comm().rank();
        let count = C + 5 * me;
        let (s, r) = (
            tensor(d, DType::F32, &values(me, count)),
            d.zeros(DType::F32, &[count as i64]).unwrap(),
        );
        dc.all_reduce_into(&s, &r, ReduceOp::Max)
    });
    let (a, b) = (format!("of {C} x f32"), format!("of {} x f32", C + 5));
    every_rank_mismatches("all_reduce_into", &outcomes, &[&a, &b]);
}

#[test]
fn broadcast_sizes_that_differ_past_the_first_chunk_fail_on_every_rank() {
    // (root's count, the others' count): a longer root, a shorter root, a
    // root of one chunk and peers of two (and the reverse).
    for (root_count, peer_count) in [(C + 1, C), (C, C + 1), (C, 2 * C), (2 * C, 100)] {
        for n in [2, 3] {
            let outcomes = run(n, |d, dc| {
                let me = dc.comm().rank();
                let count = if me == 0 { root_count } else { peer_count };
                let t = tensor(d, DType::F32, &values(me, count));
                dc.broadcast(&t, 0)
            });
            let (a, b) = (
                format!("broadcast of {root_count} x f32"),
                format!("broadcast of {peer_count} x f32"),
            );
            let what = format!("{n} ranks, root {root_count}, peers {peer_count}");
            every_rank_mismatches(&what, &outcomes, &[&a, &b]);
        }
    }
}

#[test]
fn broadcast_roots_or_dtypes_that_differ_fail_on_every_rank() {
    let outcomes = run(2, |d, dc| {
        let me = dc.comm().rank();
        let t = tensor(d, DType::F32, &values(me, 2 * C));
        // Each rank names itself the root.
        dc.broadcast(&t, me)
    });
    every_rank_mismatches("roots", &outcomes, &["root 0", "root 1"]);
    let outcomes = run(2, |d, dc| {
        let me = dc.comm().rank();
        let dtype = [DType::F32, DType::I32][me];
        let t = tensor(d, dtype, &values(me, 2 * C));
        dc.broadcast(&t, 0)
    });
    let (a, b) = (format!("{} x f32", 2 * C), format!("{} x i32", 2 * C));
    every_rank_mismatches("dtypes", &outcomes, &[&a, &b]);
}

#[test]
fn reduce_sizes_that_differ_past_the_first_chunk_fail_on_every_rank() {
    for (root_count, peer_count) in [(C, 2 * C), (2 * C, C), (C + 3, C), (100, 2 * C)] {
        for (n, root) in [(2, 0), (2, 1), (3, 2)] {
            let outcomes = run(n, |d, dc| {
                let me = dc.comm().rank();
                let count = if me == root { root_count } else { peer_count };
                let t = tensor(d, DType::F32, &values(me, count));
                dc.reduce(&t, ReduceOp::Sum, root)
            });
            let (a, b) = (
                format!("reduce of {root_count} x f32 (sum), root {root}"),
                format!("reduce of {peer_count} x f32 (sum), root {root}"),
            );
            let what = format!("{n} ranks, root {root} of {root_count}, peers {peer_count}");
            every_rank_mismatches(&what, &outcomes, &[&a, &b]);
        }
    }
}

#[test]
fn reduce_ops_or_roots_that_differ_fail_on_every_rank() {
    let outcomes = run(2, |d, dc| {
        let me = dc.comm().rank();
        let t = tensor(d, DType::F32, &values(me, 2 * C));
        dc.reduce(&t, [ReduceOp::Sum, ReduceOp::Max][me], 0)
    });
    every_rank_mismatches("ops", &outcomes, &["(sum)", "(max)"]);
    let outcomes = run(3, |d, dc| {
        let me = dc.comm().rank();
        let t = tensor(d, DType::F32, &values(me, 2 * C));
        // Rank 2 names another root.
        dc.reduce(&t, ReduceOp::Sum, usize::from(me == 2))
    });
    every_rank_mismatches("roots", &outcomes, &["root 0", "root 1"]);
}

/// Calls of different kinds: a broadcast against a reduce or an
/// all-reduce, each above the chunk size.
#[test]
fn different_chunked_collectives_fail_on_every_rank() {
    for other in ["reduce", "all_reduce"] {
        let outcomes = run(2, |d, dc| {
            let me = dc.comm().rank();
            let t = tensor(d, DType::F32, &values(me, 2 * C));
            match (me, other) {
                (0, _) => dc.broadcast(&t, 0),
                (_, "reduce") => dc.reduce(&t, ReduceOp::Sum, 0),
                _ => dc.all_reduce(&t, ReduceOp::Sum),
            }
        });
        every_rank_mismatches(other, &outcomes, &["broadcast of", &format!("{other} of")]);
    }
}

/// The calls that run as one host collective (staged whole) already carry
/// the whole size: a mismatch above the chunk size fails on every rank.
#[test]
fn all_gather_reduce_scatter_and_all_to_all_sizes_that_differ_fail_on_every_rank() {
    for kind in ["all_gather", "reduce_scatter", "all_to_all"] {
        let outcomes = run(2, |d, dc| {
            let me = dc.comm().rank();
            // Blocks of a chunk and a bit, one element more on rank 1.
            let block = C + 2 + 2 * me;
            let (s, r) = match kind {
                "all_gather" => (block, 2 * block),
                "reduce_scatter" => (2 * block, block),
                _ => (2 * block, 2 * block),
            };
            let send = tensor(d, DType::F32, &values(me, s));
            let recv = d.zeros(DType::F32, &[r as i64]).unwrap();
            match kind {
                "all_gather" => dc.all_gather(&send, &recv),
                "reduce_scatter" => dc.reduce_scatter(&send, &recv, ReduceOp::Sum),
                _ => dc.all_to_all(&send, &recv),
            }
        });
        every_rank_mismatches(kind, &outcomes, &[&format!("{kind} of")]);
    }
}

/// Calls that agree still give the right results after the check, and a
/// mismatch leaves no rank's later calls out of step: the check is one
/// header each way, not a change of what the chunks carry.
#[test]
fn agreeing_calls_above_the_chunk_size_are_unchanged() {
    let n = 3;
    let outcomes = run(n, |d, dc| {
        let me = dc.comm().rank();
        let count = 2 * C + 7;
        for root in 0..n {
            let t = tensor(d, DType::F32, &values(me, count));
            dc.broadcast(&t, root)?;
            let got = t.read_bytes().unwrap();
            assert!(
                got == common::encode(DType::F32, &values(root, count)),
                "broadcast root {root}"
            );
            let t = tensor(d, DType::F32, &values(me, count));
            dc.reduce(&t, ReduceOp::Sum, root)?;
            let want: Vec<f32> = match me == root {
                true => {
                    let inputs: Vec<Vec<f32>> = (0..n).map(|r| values(r, count)).collect();
                    (0..count)
                        .map(|i| inputs.iter().map(|x| x[i]).sum())
                        .collect()
                }
                false => values(me, count),
            };
            assert!(
                t.read_bytes().unwrap() == common::encode(DType::F32, &want),
                "reduce root {root}"
            );
        }
        dc.comm().barrier()
    });
    for (r, o) in outcomes.iter().enumerate() {
        assert!(o.0.is_none(), "rank {r}: {o:?}");
    }
}

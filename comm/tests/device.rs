//! Collectives on device tensors with threads as ranks whose devices mix
//! vendors: Ferrite (host-visible memory: device-direct) and Cobalt (private,
//! encoded memory: staged through host buffers). Values are small integers,
//! so every reduction is exact and results compare bit for bit with a host
//! reference. Needs `cargo build --workspace` first (for Ferrite's library).

mod common;
use common::{device, encode, tensor, values, world, world_of_failures};

use std::time::Duration;

use polychip_comm::CommError;
use polychip_comm::collectives::ReduceOp;
use polychip_comm::device::{DeviceComm, Path};
use polychip_host::{DType, Device};

const SIZES: [usize; 5] = [0, 1, 1000, 1 << 20, (1 << 21) + 3];

/// [`world`] with this file's 20 s timeouts.
fn world20<T: Send>(
    devices: &[Device],
    f: impl Fn(&Device, &mut DeviceComm) -> T + Sync,
) -> Vec<T> {
    world(devices, Duration::from_secs(20), f)
}

/// The mixed world: Ferrite:0 (direct), Cobalt:0 (staged), Ferrite:1 (direct).
fn mixed() -> Vec<Device> {
    vec![
        device("ferrite", 0),
        device("cobalt", 0),
        device("ferrite", 1),
    ]
}

fn sum(n: usize, count: usize) -> Vec<f32> {
    let inputs: Vec<Vec<f32>> = (0..n).map(|r| values(r, count)).collect();
    (0..count)
        .map(|i| inputs.iter().map(|x| x[i]).sum())
        .collect()
}

fn expect_paths(devices: &[Device]) -> Vec<Path> {
    devices.iter().map(Path::of).collect()
}

#[test]
fn all_reduce_across_direct_and_staged_ranks() {
    let devices = mixed();
    let paths = world20(&devices, |d, dc| {
        let me = dc.comm().rank();
        for dtype in [DType::F32, DType::BF16] {
            for count in SIZES {
                let t = tensor(d, dtype, &values(me, count));
                dc.all_reduce(&t, ReduceOp::Sum).unwrap();
                let want = encode(dtype, &sum(3, count));
                assert!(
                    t.read_bytes().unwrap() == want,
                    "rank {me} {dtype} x {count}"
                );
            }
        }
        dc.last_path().unwrap()
    });
    assert_eq!(
        paths,
        [Path::DeviceDirect, Path::Staged, Path::DeviceDirect]
    );
    assert_eq!(paths, expect_paths(&devices));
}

#[test]
fn all_reduce_into_pipelines_many_small_chunks() {
    let devices = mixed();
    world20(&devices, |d, dc| {
        let me = dc.comm().rank();
        dc.set_chunk_bytes(1000);
        let count = 10_007;
        // Send staged on the Cobalt rank, receive always on Ferrite (direct).
        let recv_dev = device("ferrite", me % 2);
        let send = tensor(d, DType::F32, &values(me, count));
        let recv = recv_dev.zeros(DType::F32, &[count as i64]).unwrap();
        dc.all_reduce_into(&send, &recv, ReduceOp::Max).unwrap();
        let inputs: Vec<Vec<f32>> = (0..3).map(|r| values(r, count)).collect();
        let want: Vec<f32> = (0..count)
            .map(|i| inputs.iter().map(|x| x[i]).fold(f32::MIN, f32::max))
            .collect();
        assert_eq!(recv.to_vec::<f32>().unwrap(), want, "rank {me}");
        assert_eq!(
            send.to_vec::<f32>().unwrap(),
            values(me, count),
            "send unchanged"
        );
        // In place, staged on the Cobalt rank, many chunks.
        dc.all_reduce(&send, ReduceOp::Sum).unwrap();
        assert_eq!(send.to_vec::<f32>().unwrap(), sum(3, count), "rank {me}");
    });
}

#[test]
fn all_gather_reduce_scatter_and_broadcast_across_mixed_ranks() {
    let devices = mixed();
    world20(&devices, |d, dc| {
        let me = dc.comm().rank();
        for count in [0, 1, 1000, 300_001] {
            let send = tensor(d, DType::F32, &values(me, count));
            let recv = d.zeros(DType::F32, &[3 * count as i64]).unwrap();
            dc.all_gather(&send, &recv).unwrap();
            let want: Vec<f32> = (0..3).flat_map(|r| values(r, count)).collect();
            assert_eq!(
                recv.to_vec::<f32>().unwrap(),
                want,
                "all_gather rank {me} x {count}"
            );

            let out = d.zeros(DType::F32, &[count as i64]).unwrap();
            dc.reduce_scatter(&recv, &out, ReduceOp::Sum).unwrap();
            let want: Vec<f32> = values(me, count).iter().map(|x| 3.0 * x).collect();
            assert_eq!(
                out.to_vec::<f32>().unwrap(),
                want,
                "reduce_scatter rank {me}"
            );

            for root in 0..3 {
                let t = tensor(d, DType::BF16, &values(me, count));
                dc.broadcast(&t, root).unwrap();
                let want = encode(DType::BF16, &values(root, count));
                assert!(
                    t.read_bytes().unwrap() == want,
                    "broadcast from {root} to {me} x {count}"
                );
            }
        }
    });
}

#[test]
fn send_recv_between_vendors() {
    let devices = [device("cobalt", 0), device("ferrite", 0)];
    world20(&devices, |d, dc| {
        let me = dc.comm().rank();
        for count in [0, 5, (3 << 20) + 1] {
            let t = if me == 0 {
                let t = tensor(d, DType::F32, &values(7, count));
                dc.send(&t, 1).unwrap();
                t
            } else {
                let t = d.zeros(DType::F32, &[count as i64]).unwrap();
                dc.recv(&t, 0).unwrap();
                t
            };
            assert_eq!(
                t.to_vec::<f32>().unwrap(),
                values(7, count),
                "rank {me} x {count}"
            );
            assert_eq!(dc.last_path(), Some(Path::of(d)));
        }
    });
}

/// A group swaps tensors larger than a chunk between a staged (Cobalt)
/// and a device-direct (Ferrite) rank, whose plain calls would each wait
/// for the other's receive; a rank may take a group's sends with plain
/// receives, chunk by chunk; a receive that shares memory with another
/// operation of the group is refused before anything moves.
#[test]
fn a_group_swaps_between_vendors_and_matches_plain_calls() {
    use polychip_comm::device::DeviceP2p;
    let devices = [device("cobalt", 0), device("ferrite", 0)];
    world20(&devices, |d, dc| {
        dc.set_chunk_bytes(1 << 20);
        let (me, peer) = (dc.comm().rank(), 1 - dc.comm().rank());
        for count in [0, 5, (3 << 20) + 1] {
            let out = tensor(d, DType::F32, &values(me, count));
            let got = d.zeros(DType::F32, &[count as i64]).unwrap();
            dc.p2p_group(&[DeviceP2p::Send(&out, peer), DeviceP2p::Recv(&got, peer)])
                .unwrap();
            assert_eq!(
                got.to_vec::<f32>().unwrap(),
                values(peer, count),
                "rank {me} x {count}"
            );
            assert_eq!(dc.last_path(), Some(Path::of(d)));
        }
        // Rank 0 sends in a group, rank 1 receives with a plain call.
        let count = (2 << 20) + 9;
        if me == 0 {
            let out = tensor(d, DType::F32, &values(5, count));
            dc.p2p_group(&[DeviceP2p::Send(&out, 1)]).unwrap();
        } else {
            let got = d.zeros(DType::F32, &[count as i64]).unwrap();
            dc.recv(&got, 0).unwrap();
            assert_eq!(got.to_vec::<f32>().unwrap(), values(5, count));
        }
        let t = d.zeros(DType::F32, &[8]).unwrap();
        let e = dc
            .p2p_group(&[DeviceP2p::Send(&t, peer), DeviceP2p::Recv(&t, peer)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("operations 0 and 1 share memory"), "{e}");
    });
}

/// A send and a receive whose sizes differ only past the first chunk (a
/// tensor is sent a chunk at a time): the receiver fails at the first
/// chunk naming both sizes, in plain calls and in groups, where comparing
/// the chunks alone took the first 1 MiB and lost the rest silently. An
/// 8 MiB send is not two 4 MiB receives either.
#[test]
fn sizes_that_differ_past_the_first_chunk_are_a_mismatch() {
    use polychip_comm::device::DeviceP2p;
    let devices = [device("ferrite", 0), device("cobalt", 0)];
    let chunk = 1usize << 20;
    let world = |f: &(dyn Fn(&Device, &mut DeviceComm) -> Option<String> + Sync)| {
        world_of_failures(&devices, Duration::from_secs(3), f)
    };
    for group in [false, true] {
        let errors = world(&|d, dc| {
            dc.set_chunk_bytes(chunk);
            let me = dc.comm().rank();
            // Rank 0 sends a chunk and 4 bytes; rank 1 receives a chunk.
            let count = chunk / 4 + if me == 0 { 1 } else { 0 };
            let t = tensor(d, DType::F32, &values(me, count));
            let op = match me {
                0 => DeviceP2p::Send(&t, 1),
                _ => DeviceP2p::Recv(&t, 0),
            };
            match (group, op) {
                (true, op) => dc.p2p_group(&[op]),
                (false, DeviceP2p::Send(t, p)) => dc.send(t, p),
                (false, DeviceP2p::Recv(t, p)) => dc.recv(t, p),
            }
            .err()
            .map(|e| e.to_string())
        });
        // The sender's part fits the 1 MiB in flight and returns.
        let e = errors[1].as_deref().unwrap_or_else(|| {
            panic!("group {group}: a 1 MiB receive took part of a larger send: {errors:?}")
        });
        assert!(e.contains("send/recv of 1048580 bytes"), "{e}");
        assert!(e.contains("send/recv of 1048576 bytes"), "{e}");
    }
    let errors = world(&|d, dc| {
        dc.set_chunk_bytes(chunk);
        let me = dc.comm().rank();
        if me == 0 {
            let t = tensor(d, DType::F32, &values(0, chunk / 2));
            // The receiver fails at the first part; this rank then waits
            // for the rest to be taken, and is told its peer left or
            // times out.
            let _ = dc.send(&t, 1);
            None
        } else {
            let t = d.zeros(DType::F32, &[(chunk / 4) as i64]).unwrap();
            dc.recv(&t, 0).err().map(|e| e.to_string())
        }
    });
    let e = errors[1]
        .as_deref()
        .expect("two halves of a send were taken as sends");
    assert!(e.contains("send/recv of 2097152 bytes"), "{e}");
}

/// f32 sent and received as i32 (the same byte size) is refused by the
/// receiver naming both dtypes, in plain calls and in groups, direct and
/// staged: it was taken silently (1.0 read back as 1065353216). A group's
/// send to this rank and the receive it pairs with are checked alike.
#[test]
fn a_dtype_that_differs_between_send_and_recv_is_a_mismatch() {
    use polychip_comm::device::DeviceP2p;
    for devices in [
        [device("ferrite", 0), device("cobalt", 0)],
        [device("cobalt", 0), device("ferrite", 0)],
    ] {
        for group in [false, true] {
            let outcomes = world_of_failures(&devices, Duration::from_secs(3), |d, dc| {
                let me = dc.comm().rank();
                let t = match me {
                    0 => tensor(d, DType::F32, &[1.0, 2.0, 3.0]),
                    _ => d.zeros(DType::I32, &[3]).unwrap(),
                };
                let op = match me {
                    0 => DeviceP2p::Send(&t, 1),
                    _ => DeviceP2p::Recv(&t, 0),
                };
                let r = match (group, op) {
                    (true, op) => dc.p2p_group(&[op]),
                    (false, DeviceP2p::Send(t, p)) => dc.send(t, p),
                    (false, DeviceP2p::Recv(t, p)) => dc.recv(t, p),
                };
                let read = (me == 1).then(|| t.to_vec::<i32>().unwrap());
                (
                    r.map_err(|e| (matches!(e, CommError::Mismatch { .. }), e.to_string())),
                    read,
                )
            });
            let (r, read) = &outcomes[1];
            let Err((mismatch, e)) = r else {
                panic!("group {group}: f32 was received as i32: {read:?}");
            };
            assert!(mismatch, "group {group}: {e}");
            assert!(e.contains("send/recv of 12 bytes of f32"), "{e}");
            assert!(e.contains("send/recv of 12 bytes of i32"), "{e}");
            assert!(
                e.contains("the dtypes differ (f32 sent, i32 received)"),
                "{e}"
            );
            assert_eq!(read.as_deref(), Some(&[0, 0, 0][..]), "nothing written");
        }
    }
    // Within one rank's group.
    let d = device("ferrite", 0);
    world20(std::slice::from_ref(&d), |d, dc| {
        let (a, b) = (
            tensor(d, DType::F32, &[1.0]),
            d.zeros(DType::I32, &[1]).unwrap(),
        );
        let e = dc
            .p2p_group(&[DeviceP2p::Send(&a, 0), DeviceP2p::Recv(&b, 0)])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("(operation 0) is f32 but the receive it pairs with (operation 1) is i32"),
            "{e}"
        );
    });
}

#[test]
fn staging_pool_does_not_grow_on_repeated_calls() {
    let devices = mixed();
    world20(&devices, |d, dc| {
        let me = dc.comm().rank();
        let count = (3 << 20) + 17;
        let t = tensor(d, DType::F32, &values(me, count));
        let g = d.zeros(DType::F32, &[3 * 1000]).unwrap();
        let s = tensor(d, DType::F32, &values(me, 1000));
        dc.all_reduce(&t, ReduceOp::Sum).unwrap();
        dc.all_gather(&s, &g).unwrap();
        let after_first = dc.pool().allocations();
        for _ in 0..5 {
            dc.all_reduce(&t, ReduceOp::Sum).unwrap();
            dc.all_gather(&s, &g).unwrap();
            let small = tensor(d, DType::F32, &values(me, 10));
            dc.all_reduce(&small, ReduceOp::Sum).unwrap();
        }
        assert_eq!(dc.pool().allocations(), after_first, "rank {me}");
        if Path::of(d) == Path::Staged {
            assert!(after_first > 0 && dc.pool().bytes() >= 4 << 20);
        } else {
            assert_eq!(after_first, 0, "a device-direct rank stages nothing");
        }
    });
}

#[test]
fn non_compact_and_unsupported_dtypes_are_usage_errors() {
    world20(&[device("cobalt", 0)], |d, dc| {
        let t = d
            .zeros(DType::F32, &[2, 3])
            .unwrap()
            .transpose(0, 1)
            .unwrap();
        let Err(CommError::Usage(m)) = dc.all_reduce(&t, ReduceOp::Sum) else {
            panic!("a strided tensor was accepted")
        };
        assert!(
            m.contains("[3, 2]") && m.contains("[1, 3]") && m.contains("not compact"),
            "{m}"
        );
        let bools = d.zeros(DType::Bool, &[4]).unwrap();
        let Err(CommError::Usage(m)) = dc.all_reduce(&bools, ReduceOp::Avg) else {
            panic!("an average of bools was accepted")
        };
        assert!(m.contains("bool tensors reduce with sum (or)"), "{m}");
        let a = d.zeros(DType::F32, &[8]).unwrap();
        let view = a.as_strided(&[4], &[1], 2).unwrap();
        let Err(CommError::Usage(m)) =
            dc.all_reduce_into(&a.as_strided(&[4], &[1], 0).unwrap(), &view, ReduceOp::Sum)
        else {
            panic!("overlapping send and recv were accepted")
        };
        assert!(m.contains("share memory"), "{m}");
        // A peer outside the world (or this rank) is refused, not an
        // index out of bounds.
        for peer in [0, 3] {
            let Err(CommError::Usage(m)) = dc.send(&a, peer) else {
                panic!("a send to rank {peer} of a world of 1 was accepted")
            };
            assert!(
                m.contains(&format!("peer {peer} is not another rank")),
                "{m}"
            );
            let Err(CommError::Usage(_)) = dc.recv(&a, peer) else {
                panic!("a recv from rank {peer} of a world of 1 was accepted")
            };
        }
        // A view whose counts overflow 64 bits is refused where it is made.
        let huge = a.as_strided(&[1 << 40, 1 << 40], &[0, 0], 0).unwrap_err();
        assert!(
            huge.to_string().contains("overflows 64-bit sizes"),
            "{huge}"
        );
        let far = a.as_strided(&[2], &[1], i64::MAX).unwrap_err();
        assert!(far.to_string().contains("overflows 64-bit sizes"), "{far}");
    });
}

/// Every dtype the device collectives reduce by arithmetic (bools, which
/// reduce as logic, have a test of their own).
const DTYPES: [DType; 7] = [
    DType::F32,
    DType::BF16,
    DType::F16,
    DType::I32,
    DType::I64,
    DType::F64,
    DType::U8,
];

#[test]
fn reduce_to_every_root_across_direct_and_staged_ranks() {
    let devices = mixed();
    let paths = world20(&devices, |d, dc| {
        let me = dc.comm().rank();
        for (i, dtype) in DTYPES.into_iter().enumerate() {
            for count in SIZES {
                let (mine, total) = (
                    encode(dtype, &values(me, count)),
                    encode(dtype, &sum(3, count)),
                );
                // Every root for small tensors; one root per dtype (each rank
                // in turn: staged and direct) for the multi-chunk ones.
                let roots = if count <= 1000 {
                    vec![2, 1, 0]
                } else {
                    vec![(i + 1) % 3]
                };
                for root in roots {
                    let t = d.empty(dtype, &[count as i64]).unwrap();
                    t.write_bytes(&mine).unwrap();
                    dc.reduce(&t, ReduceOp::Sum, root).unwrap();
                    let want = if me == root { &total } else { &mine };
                    assert!(
                        &t.read_bytes().unwrap() == want,
                        "reduce to {root}: rank {me} {dtype} x {count}"
                    );
                }
            }
        }
        dc.last_path().unwrap()
    });
    assert_eq!(paths, expect_paths(&devices));
}

#[test]
fn reduce_pipelines_many_small_chunks_and_reuses_the_pool() {
    let devices = mixed();
    world20(&devices, |d, dc| {
        let me = dc.comm().rank();
        dc.set_chunk_bytes(1000);
        let count = 10_007;
        let inputs: Vec<Vec<f32>> = (0..3).map(|r| values(r, count)).collect();
        let max: Vec<f32> = (0..count)
            .map(|i| inputs.iter().map(|x| x[i]).fold(f32::MIN, f32::max))
            .collect();
        let mut after_first = None;
        for _ in 0..3 {
            // The root is the staged Cobalt rank, then a direct Ferrite one.
            for (root, op, want) in [(1, ReduceOp::Max, &max), (2, ReduceOp::Sum, &sum(3, count))] {
                let t = tensor(d, DType::F32, &values(me, count));
                dc.reduce(&t, op, root).unwrap();
                let want = if me == root { want } else { &inputs[me] };
                assert_eq!(&t.to_vec::<f32>().unwrap(), want, "to {root}: rank {me}");
            }
            let allocations = dc.pool().allocations();
            assert_eq!(*after_first.get_or_insert(allocations), allocations);
        }
        if Path::of(d) == Path::DeviceDirect {
            assert_eq!(after_first, Some(0), "a device-direct rank stages nothing");
        }
    });
}

/// What rank `me` receives from an all-to-all of `values(rank, 3 * block)`.
fn all_to_all_want(me: usize, block: usize) -> Vec<f32> {
    (0..3)
        .flat_map(|r| values(r, 3 * block)[me * block..(me + 1) * block].to_vec())
        .collect()
}

#[test]
fn all_to_all_across_direct_and_staged_ranks() {
    let devices = mixed();
    let paths = world20(&devices, |d, dc| {
        let me = dc.comm().rank();
        // Blocks of 0, 1, an odd count, and (in f32) more than a 4 MiB chunk.
        for dtype in DTYPES {
            for block in [0, 1, 333, (1 << 20) + 1] {
                let send = tensor(d, dtype, &values(me, 3 * block));
                let recv = d.zeros(dtype, &[3 * block as i64]).unwrap();
                dc.all_to_all(&send, &recv).unwrap();
                assert!(
                    recv.read_bytes().unwrap() == encode(dtype, &all_to_all_want(me, block)),
                    "rank {me} {dtype} x 3 x {block}"
                );
                assert!(
                    send.read_bytes().unwrap() == encode(dtype, &values(me, 3 * block)),
                    "send unchanged"
                );
            }
        }
        dc.last_path().unwrap()
    });
    assert_eq!(paths, expect_paths(&devices));
}

#[test]
fn all_to_all_between_devices_of_two_vendors_reuses_the_pool() {
    let devices = mixed();
    world20(&devices, |d, dc| {
        let me = dc.comm().rank();
        let block = 70_001;
        // Send on this rank's device (staged on Cobalt), receive on Ferrite
        // (direct); then the other way round.
        let other = device("ferrite", me % 2);
        let mut after_first = None;
        for _ in 0..3 {
            for (from, to) in [(d, &other), (&other, d)] {
                let send = tensor(from, DType::I32, &values(me, 3 * block));
                let recv = to.zeros(DType::I32, &[3, block as i64]).unwrap();
                dc.all_to_all(&send, &recv).unwrap();
                let want: Vec<i32> = all_to_all_want(me, block)
                    .iter()
                    .map(|&x| x as i32)
                    .collect();
                assert_eq!(recv.to_vec::<i32>().unwrap(), want, "rank {me}");
                assert_eq!(dc.last_path(), Some(Path::of(d)));
            }
            let allocations = dc.pool().allocations();
            assert_eq!(*after_first.get_or_insert(allocations), allocations);
        }
    });
}

#[test]
fn reduce_and_all_to_all_usage_errors_name_op_rank_and_tensor() {
    world20(&[device("ferrite", 0), device("cobalt", 0)], |d, dc| {
        let me = dc.comm().rank();
        let t = d.zeros(DType::F32, &[6]).unwrap();
        let Err(CommError::Usage(m)) = dc.reduce(&t, ReduceOp::Sum, 2) else {
            panic!("root 2 of a world of 2 was accepted")
        };
        assert!(
            m.contains(&format!("rank {me}: reduce")) && m.contains("root 2") && m.contains("[6]"),
            "{m}"
        );
        let bools = d.zeros(DType::Bool, &[4]).unwrap();
        let Err(CommError::Usage(m)) = dc.reduce(&bools, ReduceOp::Avg, 0) else {
            panic!("an average of bools was accepted")
        };
        assert!(
            m.contains(&format!("rank {me}: reduce")) && m.contains("not avg"),
            "{m}"
        );
        let strided = d
            .zeros(DType::F32, &[2, 3])
            .unwrap()
            .transpose(0, 1)
            .unwrap();
        let Err(CommError::Usage(m)) = dc.reduce(&strided, ReduceOp::Sum, 0) else {
            panic!("a strided tensor was accepted")
        };
        assert!(m.contains("reduce") && m.contains("not compact"), "{m}");

        let cases = [
            (d.zeros(DType::BF16, &[6]).unwrap(), "bf16 [6]"),
            (d.zeros(DType::F32, &[8]).unwrap(), "f32 [8]"),
            (d.zeros(DType::F32, &[2, 3]).unwrap(), "f32 [2, 3]"),
        ];
        for (recv, named) in cases {
            let send = if recv.numel() == 6 && recv.dtype() == DType::F32 {
                d.zeros(DType::F32, &[5]).unwrap()
            } else {
                d.zeros(DType::F32, &[6]).unwrap()
            };
            let Err(CommError::Usage(m)) = dc.all_to_all(&send, &recv) else {
                panic!("all_to_all of {send:?} into {recv:?} was accepted")
            };
            assert!(
                m.contains(&format!("rank {me}: all_to_all")) && m.contains(named),
                "{m}"
            );
        }
        let Err(CommError::Usage(m)) = dc.all_to_all(
            &d.zeros(DType::I32, &[3]).unwrap(),
            &d.zeros(DType::I32, &[3]).unwrap(),
        ) else {
            panic!("3 elements in 2 blocks were accepted")
        };
        assert!(m.contains("multiple of the world size 2"), "{m}");
        let a = d.zeros(DType::F32, &[8]).unwrap();
        let Err(CommError::Usage(m)) = dc.all_to_all(
            &a.as_strided(&[4], &[1], 0).unwrap(),
            &a.as_strided(&[4], &[1], 2).unwrap(),
        ) else {
            panic!("overlapping send and recv were accepted")
        };
        assert!(
            m.contains("all_to_all") && m.contains("share memory"),
            "{m}"
        );
        // The communicator is still in step after the refusals.
        let t = tensor(d, DType::F32, &values(me, 4));
        dc.all_to_all(&t, &d.zeros(DType::F32, &[4]).unwrap())
            .unwrap();
        dc.reduce(&t, ReduceOp::Sum, 1).unwrap();
    });
}

#[test]
fn staged_copies_go_on_the_callers_stream_while_the_default_stream_works() {
    let devices = mixed();
    world20(&devices, |d, dc| {
        let me = dc.comm().rank();
        let stream = d.stream().unwrap();
        // Another thread keeps the device's default stream busy meanwhile,
        // as the trainer's passes do beside its reducer thread.
        let busy = tensor(d, DType::F32, &values(me, 1 << 16));
        let negated = d.zeros(DType::F32, &[1 << 16]).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    d.exec().neg(&busy, &negated).unwrap();
                }
            });
            let mut on = DeviceComm::new(dc.comm()).on_stream(&stream);
            // Many chunks: a staged rank copies them one after another on
            // its stream; and a whole (unchunked) call.
            on.set_chunk_bytes(1000);
            let count = 10_007;
            let t = tensor(d, DType::F32, &values(me, count));
            on.all_reduce(&t, ReduceOp::Sum).unwrap();
            assert_eq!(t.to_vec::<f32>().unwrap(), sum(3, count), "rank {me}");
            let all = d.zeros(DType::F32, &[3 * count as i64]).unwrap();
            let mine = tensor(d, DType::F32, &values(me, count));
            on.all_gather(&mine, &all).unwrap();
            let want: Vec<f32> = (0..3).flat_map(|r| values(r, count)).collect();
            assert_eq!(all.to_vec::<f32>().unwrap(), want, "rank {me}");
            assert_eq!(on.last_path(), Some(Path::of(d)));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    });
}

#[test]
fn byte_range_copies_refuse_what_they_cannot_copy_naming_it() {
    let (ferrite, cobalt) = (device("ferrite", 0), device("cobalt", 0));
    let t = tensor(&cobalt, DType::F32, &values(0, 10));
    let mut out = [0u8; 8];
    t.read_range(32, &mut out, None).unwrap();
    assert_eq!(
        out[..4],
        values(0, 10)[8].to_ne_bytes()[..],
        "bytes 32..36: element 8"
    );
    let e = t.read_range(36, &mut out, None).unwrap_err().to_string();
    assert!(
        e.contains("bytes 36..44") && e.contains("past its end"),
        "{e}"
    );
    let e = t
        .write_range(usize::MAX, &out, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("past its end"), "{e}");
    let other = ferrite.stream().unwrap();
    let e = t
        .read_range(0, &mut out, Some(&other))
        .unwrap_err()
        .to_string();
    assert!(e.contains("stream of"), "{e}");
    let strided = t.as_strided(&[5], &[2], 0).unwrap();
    let e = strided
        .read_range(0, &mut out, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("only compact tensors"), "{e}");
    // On the tensor's own stream: written, then read back.
    let own = cobalt.stream().unwrap();
    t.write_range(4, &7f32.to_ne_bytes(), Some(&own)).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap()[1], 7.0);
}

/// Bools reduce as logic across vendors: sum and max are or, min is and.
#[test]
fn bools_reduce_as_or_and_and_across_vendors() {
    let devices = mixed();
    world20(&devices, |d, dc| {
        let me = dc.comm().rank();
        // Element i is true on rank r when bit r of i is set.
        let mine: Vec<u8> = (0..8).map(|i| (i >> me) as u8 & 1).collect();
        for (op, want) in [
            (ReduceOp::Sum, [0u8, 1, 1, 1, 1, 1, 1, 1]),
            (ReduceOp::Max, [0, 1, 1, 1, 1, 1, 1, 1]),
            (ReduceOp::Min, [0, 0, 0, 0, 0, 0, 0, 1]),
        ] {
            let t = d.empty(DType::Bool, &[8]).unwrap();
            t.write_bytes(&mine).unwrap();
            dc.all_reduce(&t, op).unwrap();
            assert_eq!(t.read_bytes().unwrap(), want, "rank {me} {op:?}");
        }
    });
}

/// Products and the bitwise operators across vendors: products wrap in
/// integers; bitwise operators refuse floats.
#[test]
fn products_and_bitwise_operators_across_vendors() {
    let devices = mixed();
    world20(&devices, |d, dc| {
        let me = dc.comm().rank() as i64;
        let ints: Vec<u8> = [me + 5, 1 << (me + 1), -(me + 1)]
            .iter()
            .flat_map(|x| x.to_ne_bytes())
            .collect();
        for (op, want) in [
            (ReduceOp::Prod, [5 * 6 * 7, 2 * 4 * 8, -6]),
            (ReduceOp::BitAnd, [5 & 6 & 7, 0, -4]),
            (ReduceOp::BitOr, [7, 14, -1]),
            (ReduceOp::BitXor, [5 ^ 6 ^ 7, 14, -1 ^ -2 ^ -3]),
        ] {
            let t = d.empty(DType::I64, &[3]).unwrap();
            t.write_bytes(&ints).unwrap();
            dc.all_reduce(&t, op).unwrap();
            let want: Vec<u8> = want.iter().flat_map(|x: &i64| x.to_ne_bytes()).collect();
            assert_eq!(t.read_bytes().unwrap(), want, "rank {me} {op:?}");
        }
        let f = tensor(d, DType::F32, &[1.5, 2.0]);
        dc.all_reduce(&f, ReduceOp::Prod).unwrap();
        assert_eq!(f.to_vec::<f32>().unwrap(), [3.375, 8.0]);
        let Err(CommError::Usage(m)) = dc.all_reduce(&f, ReduceOp::BitXor) else {
            panic!("a bitwise reduction of floats was accepted")
        };
        assert!(
            m.contains("bxor is bitwise: it reduces integer and bool tensors, not f32"),
            "{m}"
        );
    });
}

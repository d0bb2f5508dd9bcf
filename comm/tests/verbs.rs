//! The RDMA verbs transport on a machine without RDMA (this one: no
//! InfiniBand support in the kernel): availability is reported as a reason,
//! building the transport fails with `Unavailable` instead of panicking;
//! and the hardware-free parts: store records round-trip, writes split into
//! staging-slot pieces, immediates and work ids encode and decode, and the
//! queue pair attributes follow the options.

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

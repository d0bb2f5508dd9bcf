//! Setting up a verbs transport: open the device (the named one or the
//! first), check the port, pick the GID, create the PD, the CQ and one RC
//! queue pair per peer, publish each queue pair's [`Endpoint`] in the store
//! under a per-job generation, read the peers' ones and move every queue
//! pair INIT → RTR → RTS with the attributes [`qp_attrs`] chooses.

use std::ffi::CStr;
use std::io;
use std::time::{Duration, Instant};

use ibverbs_sys as ffi;

use super::options::{
    GidEntry, GidKind, QpAttrs, VerbsOptions, choose_gid_index, initial_psn, qp_attrs,
};
use super::probe::device_list_failure;
use super::sys::{Context, Cq, Pd, Qp};
use super::wire::{Endpoint, WorkId};
use crate::error::{CommError, Result};
use crate::store::Store;

/// Access rights of every queue pair and region: peers write, nobody reads.
pub(crate) fn access() -> ffi::ibv_access_flags {
    ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
}

pub(crate) fn unavailable(reason: String) -> CommError {
    CommError::Unavailable {
        transport: "verbs",
        reason,
    }
}

/// The opened device and what the port told about itself.
pub(crate) struct Device {
    pub ctx: Context,
    pub name: String,
    pub lid: u16,
    pub mtu: u8,
    pub ethernet: bool,
    pub gid_index: u8,
    pub gid: [u8; 16],
}

/// Opens the device and port the options name.
pub(crate) fn open(options: &VerbsOptions) -> Result<Device> {
    let mut n = 0i32;
    // SAFETY: `n` is a live out-parameter.
    let list = unsafe { ffi::ibv_get_device_list(&raw mut n) };
    if list.is_null() {
        return Err(unavailable(
            device_list_failure(&io::Error::last_os_error()),
        ));
    }
    // SAFETY: a non-null list holds `n` device pointers.
    let devices = unsafe { std::slice::from_raw_parts(list, n.max(0) as usize) };
    let name_of = |d: *mut ffi::ibv_device| {
        // SAFETY: `d` is in the live list; the name is NUL-terminated.
        let p = unsafe { ffi::ibv_get_device_name(d) };
        // SAFETY: non-null names point into the device struct.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    let names: Vec<String> = devices
        .iter()
        .map(|&d| name_of(d).unwrap_or_default())
        .collect();
    let chosen = match &options.device {
        None => devices.first().map(|&d| (d, names[0].clone())),
        Some(want) => names
            .iter()
            .position(|n| n == want)
            .map(|i| (devices[i], want.clone())),
    };
    let opened = chosen.map(|(d, name)| {
        // SAFETY: `d` is in the list, which is freed only after this.
        (unsafe { Context::open(d) }, name)
    });
    // SAFETY: the list came from ibv_get_device_list; opened contexts stay valid.
    unsafe { ffi::ibv_free_device_list(list) };
    let (ctx, name) = match (opened, &options.device) {
        (None, None) => {
            return Err(unavailable(
                "RDMA unavailable: no RDMA devices found".into(),
            ));
        }
        (None, Some(want)) => {
            return Err(unavailable(format!(
                "RDMA unavailable: no RDMA device named {want:?} (devices: {names:?})"
            )));
        }
        (Some((ctx, name)), _) => (
            ctx.map_err(|e| unavailable(format!("RDMA unavailable: cannot open {name}: {e}")))?,
            name,
        ),
    };
    let port = ctx.port(options.port).map_err(|e| {
        unavailable(format!(
            "RDMA unavailable: {name} port {}: {e}",
            options.port
        ))
    })?;
    if port.state != ffi::ibv_port_state::IBV_PORT_ACTIVE {
        return Err(unavailable(format!(
            "RDMA unavailable: {name} port {} is not active (state {})",
            options.port, port.state
        )));
    }
    let ethernet = u32::from(port.link_layer) == ffi::IBV_LINK_LAYER_ETHERNET;
    let table = ctx
        .gid_table(port.gid_tbl_len.max(0) as usize)
        .map_err(|e| unavailable(format!("RDMA unavailable: {name}: GID table: {e}")))?;
    let entries: Vec<GidEntry> = table
        .iter()
        .filter(|e| e.port_num == u32::from(options.port) && e.gid_index < 256)
        .map(|e| GidEntry {
            index: e.gid_index as u8,
            // SAFETY: every bit pattern is a valid `raw` view of the union.
            gid: unsafe { e.gid.raw },
            kind: if e.gid_type == ffi::IBV_GID_TYPE_ROCE_V2 {
                GidKind::RoceV2
            } else {
                GidKind::IbOrRoceV1
            },
        })
        .collect();
    let gid_index = choose_gid_index(options.gid_index, ethernet, &entries);
    let gid = entries.iter().find(|e| e.index == gid_index).map(|e| e.gid);
    if ethernet && gid.is_none() {
        return Err(unavailable(format!(
            "RDMA unavailable: {name} port {} has no GID at index {gid_index} (RoCE needs one)",
            options.port
        )));
    }
    Ok(Device {
        ctx,
        name,
        lid: port.lid,
        mtu: port.active_mtu.clamp(1, 5) as u8,
        ethernet,
        gid_index,
        gid: gid.unwrap_or_default(),
    })
}

/// A connected queue pair per peer (`None` for this rank), the PD and CQ.
pub(crate) struct Mesh {
    pub qps: Vec<Option<Qp>>,
    pub cq: Cq,
    pub pd: Pd,
    /// `{prefix}/{generation}`: the store namespace of this transport.
    pub base: String,
}

pub(crate) fn connect(
    dev: &Device,
    store: &dyn Store,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    options: &VerbsOptions,
) -> Result<Mesh> {
    let deadline = Instant::now() + timeout;
    let io_err = |op: &str, e: io::Error| CommError::Io {
        rank,
        op: format!("verbs {op}"),
        message: format!("{}: {e}", dev.name),
    };
    let peers = world_size - 1;
    let cqe = peers * (options.slots + options.recv_depth) + 16;
    let cq = dev
        .ctx
        .create_cq(i32::try_from(cqe).unwrap_or(i32::MAX))
        .map_err(|e| io_err("create CQ", e))?;
    let pd = dev.ctx.alloc_pd().map_err(|e| io_err("allocate PD", e))?;
    let prefix = &options.key_prefix;
    let generation = store.add(&format!("{prefix}/generation/{rank}"), 1)?;
    let base = format!("{prefix}/{generation}");
    let salt = std::process::id();

    let mut qps: Vec<Option<Qp>> = (0..world_size).map(|_| None).collect();
    let mut mine: Vec<Endpoint> = vec![Endpoint::default(); world_size];
    for peer in (0..world_size).filter(|&p| p != rank) {
        let qp = pd
            .create_rc_qp(&cq, options.slots as u32 + 1, options.recv_depth as u32)
            .map_err(|e| io_err("create QP", e))?;
        to_init(&qp, options.port).map_err(|e| io_err("QP to INIT", e))?;
        for _ in 0..options.recv_depth {
            qp.post_empty_recv(WorkId::Recv { peer: peer as u32 }.encode())
                .map_err(|e| io_err("post receive", e))?;
        }
        mine[peer] = Endpoint {
            lid: dev.lid,
            gid: dev.gid,
            qpn: qp.num(),
            psn: initial_psn(rank, peer, generation, salt),
            mtu: dev.mtu,
            ethernet: dev.ethernet,
        };
        store.set(&format!("{base}/qp/{rank}/{peer}"), &mine[peer].to_bytes())?;
        qps[peer] = Some(qp);
    }
    for peer in (0..world_size).filter(|&p| p != rank) {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let raw = store.get(&format!("{base}/qp/{peer}/{rank}"), left)?;
        let theirs = Endpoint::from_bytes(&raw).map_err(|why| CommError::Mismatch {
            rank,
            op: "verbs connect".into(),
            message: format!("rank {peer} published a bad endpoint: {why}"),
        })?;
        let attrs = qp_attrs(options, dev.gid_index, &mine[peer], &theirs)?;
        let qp = qps[peer].as_ref().expect("created above");
        to_rtr(qp, &attrs, &theirs).map_err(|e| io_err(&format!("QP to RTR (peer {peer})"), e))?;
        to_rts(qp, &attrs, mine[peer].psn)
            .map_err(|e| io_err(&format!("QP to RTS (peer {peer})"), e))?;
    }
    Ok(Mesh { qps, cq, pd, base })
}

fn to_init(qp: &Qp, port: u8) -> io::Result<()> {
    use ffi::ibv_qp_attr_mask as m;
    let mut attr = ffi::ibv_qp_attr {
        qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
        pkey_index: 0,
        port_num: port,
        qp_access_flags: access().0,
        ..Default::default()
    };
    qp.modify(
        &mut attr,
        m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS,
    )
}

fn to_rtr(qp: &Qp, a: &QpAttrs, remote: &Endpoint) -> io::Result<()> {
    use ffi::ibv_qp_attr_mask as m;
    let mut attr = ffi::ibv_qp_attr {
        qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
        path_mtu: u32::from(a.path_mtu),
        dest_qp_num: remote.qpn,
        rq_psn: remote.psn,
        max_dest_rd_atomic: a.max_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        ah_attr: ffi::ibv_ah_attr {
            dlid: remote.lid,
            sl: 0,
            src_path_bits: 0,
            port_num: a.port,
            is_global: u8::from(a.global),
            ..Default::default()
        },
        ..Default::default()
    };
    if a.global {
        attr.ah_attr.grh.dgid = ffi::ibv_gid { raw: remote.gid };
        attr.ah_attr.grh.sgid_index = a.gid_index;
        attr.ah_attr.grh.hop_limit = a.hop_limit;
    }
    qp.modify(
        &mut attr,
        m::IBV_QP_STATE
            | m::IBV_QP_AV
            | m::IBV_QP_PATH_MTU
            | m::IBV_QP_DEST_QPN
            | m::IBV_QP_RQ_PSN
            | m::IBV_QP_MAX_DEST_RD_ATOMIC
            | m::IBV_QP_MIN_RNR_TIMER,
    )
}

fn to_rts(qp: &Qp, a: &QpAttrs, psn: u32) -> io::Result<()> {
    use ffi::ibv_qp_attr_mask as m;
    let mut attr = ffi::ibv_qp_attr {
        qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
        sq_psn: psn,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        max_rd_atomic: a.max_rd_atomic,
        ..Default::default()
    };
    qp.modify(
        &mut attr,
        m::IBV_QP_STATE
            | m::IBV_QP_SQ_PSN
            | m::IBV_QP_TIMEOUT
            | m::IBV_QP_RETRY_CNT
            | m::IBV_QP_RNR_RETRY
            | m::IBV_QP_MAX_QP_RD_ATOMIC,
    )
}

//! How a verbs transport is set up ([`VerbsOptions`], from the environment)
//! and the pure choices made from it once the device is known: which GID
//! index to route with, the path MTU, and the queue pair attributes for the
//! INIT → RTR → RTS transitions. Nothing here touches hardware.

use std::time::Duration;

use crate::error::{CommError, Result};

/// Environment variable naming the RDMA device to open (e.g. `mlx5_0`); the
/// first device when unset.
pub const DEVICE_ENV: &str = "POLYCHIP_RDMA_DEVICE";
/// Environment variable choosing the GID index (RoCE); chosen from the GID
/// table when unset (see [`choose_gid_index`]).
pub const GID_INDEX_ENV: &str = "POLYCHIP_RDMA_GID_INDEX";
/// Environment variable choosing the device port (default 1).
pub const PORT_ENV: &str = "POLYCHIP_RDMA_PORT";

/// How a verbs transport is set up.
#[derive(Debug, Clone)]
pub struct VerbsOptions {
    /// Device name; `None` opens the first device.
    pub device: Option<String>,
    /// Port number on the device (1-based).
    pub port: u8,
    /// GID index; `None` picks one from the GID table.
    pub gid_index: Option<u8>,
    /// Largest path MTU in bytes (256, 512, 1024, 2048 or 4096); the port's
    /// active MTU caps it. `None` uses the active MTU.
    pub mtu: Option<u32>,
    /// Bytes of one staging slot: writes are copied into registered staging
    /// memory and sent in pieces of at most this size.
    pub chunk_bytes: usize,
    /// Staging slots per peer (RDMA writes in flight to one peer).
    pub slots: usize,
    /// Receives kept posted per queue pair (each write with immediate
    /// consumes one).
    pub recv_depth: usize,
    /// How long `wait` polls before sleeping between polls.
    pub spin: Duration,
    /// Prefix of the store keys (keep distinct per job sharing one store).
    pub key_prefix: String,
}

impl Default for VerbsOptions {
    fn default() -> VerbsOptions {
        VerbsOptions {
            device: None,
            port: 1,
            gid_index: None,
            mtu: None,
            chunk_bytes: 1 << 20,
            slots: 8,
            recv_depth: 256,
            spin: Duration::from_micros(200),
            key_prefix: "polychip/verbs".into(),
        }
    }
}

impl VerbsOptions {
    /// The defaults, with the device, GID index and port from
    /// `POLYCHIP_RDMA_DEVICE`, `POLYCHIP_RDMA_GID_INDEX` and
    /// `POLYCHIP_RDMA_PORT` when set.
    pub fn from_env() -> Result<VerbsOptions> {
        crate::env::with_env_vars(|get| VerbsOptions::from_vars(get))
    }

    /// Like [`VerbsOptions::from_env`], reading variables through `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<VerbsOptions> {
        let mut options = VerbsOptions::default();
        if let Some(device) = var(DEVICE_ENV).filter(|d| !d.trim().is_empty()) {
            options.device = Some(device.trim().to_string());
        }
        let number = |name: &str, text: String| {
            text.trim().parse::<u8>().map_err(|e| {
                CommError::Environment(format!("{name}={text:?} is not a number below 256: {e}"))
            })
        };
        if let Some(text) = var(GID_INDEX_ENV) {
            options.gid_index = Some(number(GID_INDEX_ENV, text)?);
        }
        if let Some(text) = var(PORT_ENV) {
            options.port = number(PORT_ENV, text)?;
        }
        options.validate()?;
        Ok(options)
    }

    /// Checks the sizes and the MTU.
    pub fn validate(&self) -> Result<()> {
        if self.port == 0 {
            return Err(CommError::Usage("verbs: ports are numbered from 1".into()));
        }
        if let Some(mtu) = self.mtu {
            mtu_code(mtu)?;
        }
        if self.chunk_bytes == 0 || self.chunk_bytes > 1 << 30 {
            return Err(CommError::Usage(format!(
                "verbs: chunk_bytes {} is not in 1..=1 GiB",
                self.chunk_bytes
            )));
        }
        if self.slots == 0 || self.slots > 4096 || self.recv_depth == 0 || self.recv_depth > 16384 {
            return Err(CommError::Usage(format!(
                "verbs: {} slots / {} receives per peer is out of range",
                self.slots, self.recv_depth
            )));
        }
        Ok(())
    }
}

/// The `ibv_mtu` code of an MTU in bytes (256 → 1 ... 4096 → 5).
pub fn mtu_code(bytes: u32) -> Result<u8> {
    match bytes {
        256 => Ok(1),
        512 => Ok(2),
        1024 => Ok(3),
        2048 => Ok(4),
        4096 => Ok(5),
        _ => Err(CommError::Usage(format!(
            "verbs: MTU {bytes} is not 256, 512, 1024, 2048 or 4096"
        ))),
    }
}

/// The path MTU code both ends can use: the smaller active MTU, capped by the
/// option.
pub fn path_mtu(local: u8, remote: u8, cap: Option<u32>) -> Result<u8> {
    let cap = cap.map(mtu_code).transpose()?.unwrap_or(5);
    Ok(local.min(remote).min(cap).max(1))
}

/// The kind of a GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GidKind {
    /// InfiniBand or RoCE v1.
    IbOrRoceV1,
    /// RoCE v2 (routable, UDP encapsulated).
    RoceV2,
}

/// A populated entry of the port's GID table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    /// Its index.
    pub index: u8,
    /// The GID.
    pub gid: [u8; 16],
    /// Its kind.
    pub kind: GidKind,
}

fn ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// The GID index to use: the option when given; else on Ethernet (RoCE) the
/// first RoCE v2 entry with an IPv4-mapped address, then any RoCE v2 entry,
/// then the first entry; on InfiniBand index 0.
pub fn choose_gid_index(option: Option<u8>, ethernet: bool, table: &[GidEntry]) -> u8 {
    if let Some(index) = option {
        return index;
    }
    if !ethernet {
        return 0;
    }
    let v2 = |e: &&GidEntry| e.kind == GidKind::RoceV2;
    table
        .iter()
        .filter(v2)
        .find(|e| ipv4_mapped(&e.gid))
        .or_else(|| table.iter().find(v2))
        .or_else(|| table.first())
        .map_or(0, |e| e.index)
}

/// The queue pair attributes of one connection, chosen from the options and
/// both endpoints; applied by the INIT → RTR → RTS transitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttrs {
    /// Local port.
    pub port: u8,
    /// Path MTU code.
    pub path_mtu: u8,
    /// Route through the GRH (always on RoCE; on InfiniBand when the peer
    /// published a GID outside this subnet).
    pub global: bool,
    /// Local GID index for the GRH.
    pub gid_index: u8,
    /// GRH hop limit.
    pub hop_limit: u8,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout (14 ≈ 67 ms).
    pub timeout: u8,
    /// Transport retries before a send fails (7 at most).
    pub retry_cnt: u8,
    /// Receiver-not-ready retries (7 = retry forever; a peer that stops
    /// polling is caught by the waiter's deadline instead).
    pub rnr_retry: u8,
    /// Minimum RNR NAK timer code (12 ≈ 0.64 ms).
    pub min_rnr_timer: u8,
    /// Outstanding RDMA reads/atomics (unused; writes only): 1.
    pub max_rd_atomic: u8,
}

/// Chooses the attributes of the connection from `local` to `remote`.
pub fn qp_attrs(
    options: &VerbsOptions,
    gid_index: u8,
    local: &super::wire::Endpoint,
    remote: &super::wire::Endpoint,
) -> Result<QpAttrs> {
    let remote_has_gid = remote.gid.iter().any(|&b| b != 0);
    let other_subnet = remote_has_gid && remote.gid[..8] != local.gid[..8];
    Ok(QpAttrs {
        port: options.port,
        path_mtu: path_mtu(local.mtu, remote.mtu, options.mtu)?,
        global: local.ethernet || remote.ethernet || other_subnet,
        gid_index,
        hop_limit: 64,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 12,
        max_rd_atomic: 1,
    })
}

/// A starting packet sequence number (24 bits) for the connection from
/// `rank` to `peer`, varied by generation and process so a stale packet of
/// an earlier connection is unlikely to fit.
pub fn initial_psn(rank: usize, peer: usize, generation: i64, salt: u32) -> u32 {
    let mut x =
        (rank as u64) << 40 ^ (peer as u64) << 20 ^ generation as u64 ^ u64::from(salt) << 8;
    // splitmix64 finalizer.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((x ^ (x >> 31)) & 0x00ff_ffff) as u32
}

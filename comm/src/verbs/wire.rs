//! What verbs ranks tell each other through the store, as fixed little-endian
//! byte layouts: a queue pair's endpoint (LID, GID, QP number, starting PSN,
//! MTU) and a registered region's remote address and key. Also the 32-bit
//! immediate that names the signal a write raises, and the work-request ids
//! that tell send completions (peer, staging slot) from receive completions.

/// Magic that opens an endpoint record ("PCVE").
const ENDPOINT_MAGIC: u32 = 0x5043_5645;
/// Magic that opens a region record ("PCVR").
const REGION_MAGIC: u32 = 0x5043_5652;

/// One end of a reliable-connected queue pair, as its peer needs it to move
/// its own queue pair to ready-to-receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Endpoint {
    /// The port's local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The GID of the chosen GID index (all zero when not routed globally).
    pub gid: [u8; 16],
    /// The queue pair number.
    pub qpn: u32,
    /// The first packet sequence number this end sends (24 bits).
    pub psn: u32,
    /// The port's active MTU as an `ibv_mtu` code (1 = 256 ... 5 = 4096).
    pub mtu: u8,
    /// Whether the port's link layer is Ethernet (RoCE): the peer must then
    /// address it through the GRH.
    pub ethernet: bool,
}

impl Endpoint {
    /// Encoded length in bytes.
    pub const LEN: usize = 32;

    /// The record as bytes, for the store.
    pub fn to_bytes(&self) -> [u8; Endpoint::LEN] {
        let mut b = [0u8; Endpoint::LEN];
        b[0..4].copy_from_slice(&ENDPOINT_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&self.lid.to_le_bytes());
        b[6] = self.mtu;
        b[7] = u8::from(self.ethernet);
        b[8..24].copy_from_slice(&self.gid);
        b[24..28].copy_from_slice(&self.qpn.to_le_bytes());
        b[28..32].copy_from_slice(&self.psn.to_le_bytes());
        b
    }

    /// Parses a record written by [`Endpoint::to_bytes`].
    pub fn from_bytes(b: &[u8]) -> Result<Endpoint, String> {
        let b: &[u8; Endpoint::LEN] = b.try_into().map_err(|_| {
            format!(
                "endpoint record of {} bytes, not {}",
                b.len(),
                Endpoint::LEN
            )
        })?;
        let magic = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
        if magic != ENDPOINT_MAGIC {
            return Err(format!("not a verbs endpoint record (magic {magic:#x})"));
        }
        let psn = u32::from_le_bytes(b[28..32].try_into().expect("4 bytes"));
        if psn >> 24 != 0 || !(1..=5).contains(&b[6]) || b[7] > 1 {
            return Err("verbs endpoint record has out-of-range fields".into());
        }
        Ok(Endpoint {
            lid: u16::from_le_bytes([b[4], b[5]]),
            mtu: b[6],
            ethernet: b[7] == 1,
            gid: b[8..24].try_into().expect("16 bytes"),
            qpn: u32::from_le_bytes(b[24..28].try_into().expect("4 bytes")),
            psn,
        })
    }
}

/// A rank's copy of a registered region, as peers address it in RDMA writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteRegion {
    /// Virtual address of the region's first byte in the owner's process.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// The memory region's remote key.
    pub rkey: u32,
}

impl RemoteRegion {
    /// Encoded length in bytes.
    pub const LEN: usize = 24;

    /// The record as bytes, for the store.
    pub fn to_bytes(&self) -> [u8; RemoteRegion::LEN] {
        let mut b = [0u8; RemoteRegion::LEN];
        b[0..4].copy_from_slice(&REGION_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.rkey.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Parses a record written by [`RemoteRegion::to_bytes`].
    pub fn from_bytes(b: &[u8]) -> Result<RemoteRegion, String> {
        let b: &[u8; RemoteRegion::LEN] = b.try_into().map_err(|_| {
            format!(
                "region record of {} bytes, not {}",
                b.len(),
                RemoteRegion::LEN
            )
        })?;
        let magic = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
        if magic != REGION_MAGIC {
            return Err(format!("not a verbs region record (magic {magic:#x})"));
        }
        Ok(RemoteRegion {
            rkey: u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")),
            addr: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            len: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
        })
    }
}

/// Tag in the immediate's top byte that marks a polychip signal.
const IMM_TAG: u32 = 0x5a << 24;

/// The immediate carried by the last RDMA write of a transfer: a tag byte and
/// the signal id in the low 24 bits. `None` when the id does not fit.
pub fn encode_imm(signal: u32) -> Option<u32> {
    (signal >> 24 == 0).then_some(IMM_TAG | signal)
}

/// The signal id named by an immediate written by [`encode_imm`].
pub fn decode_imm(imm: u32) -> Result<u32, String> {
    if imm & 0xff00_0000 != IMM_TAG {
        return Err(format!("immediate {imm:#x} is not a polychip signal"));
    }
    Ok(imm & 0x00ff_ffff)
}

/// What a work completion belongs to, packed into its 64-bit `wr_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkId {
    /// An RDMA write to `peer` from staging slot `slot`.
    Send {
        /// The peer written to.
        peer: u32,
        /// The staging slot to free when it completes.
        slot: u32,
    },
    /// A receive posted on the queue pair connected to `peer`.
    Recv {
        /// The peer whose writes it absorbs.
        peer: u32,
    },
}

const RECV_BIT: u64 = 1 << 63;

impl WorkId {
    /// The `wr_id` to post.
    pub fn encode(self) -> u64 {
        match self {
            WorkId::Send { peer, slot } => (u64::from(peer & 0x7fff_ffff) << 32) | u64::from(slot),
            WorkId::Recv { peer } => RECV_BIT | (u64::from(peer & 0x7fff_ffff) << 32),
        }
    }

    /// The work a completion's `wr_id` names.
    pub fn decode(wr_id: u64) -> WorkId {
        let peer = ((wr_id >> 32) & 0x7fff_ffff) as u32;
        if wr_id & RECV_BIT != 0 {
            WorkId::Recv { peer }
        } else {
            WorkId::Send {
                peer,
                slot: wr_id as u32,
            }
        }
    }
}

/// One RDMA write of a transfer: `len` bytes from `data[src..]` to the
/// region offset `dst`; the last one carries the immediate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Offset in the caller's data.
    pub src: usize,
    /// Offset in the destination region.
    pub dst: usize,
    /// Bytes in this piece.
    pub len: usize,
    /// Whether this piece is the last (the write with immediate).
    pub last: bool,
}

/// Splits a write of `len` bytes at region offset `offset` into pieces of at
/// most `chunk` bytes (a staging slot). A zero-byte write is one empty piece:
/// the signal still has to travel.
pub fn chunks(offset: usize, len: usize, chunk: usize) -> impl Iterator<Item = Chunk> {
    let chunk = chunk.max(1);
    let count = len.div_ceil(chunk).max(1);
    (0..count).map(move |i| {
        let src = i * chunk;
        Chunk {
            src,
            dst: offset + src,
            len: chunk.min(len - src),
            last: i + 1 == count,
        }
    })
}

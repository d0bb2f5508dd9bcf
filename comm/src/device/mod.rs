//! Collectives on device tensors of any vendor's plugin (see DESIGN.md,
//! "Communication"). A [`DeviceComm`] borrows a host [`Communicator`] and
//! owns a [`StagingPool`]; each tensor argument takes one of two paths,
//! chosen from its device's properties:
//!
//! - [`Path::DeviceDirect`] when the plugin reports host-visible memory: the
//!   collective reads and writes the device memory in place through a host
//!   slice; no plugin copy at all. (`rdma_exportable` alone does not qualify:
//!   the transports here register their own regions.)
//! - [`Path::Staged`] otherwise (CPU-mediated): the plugin's `memcpy_d2h`
//!   copies into pooled, page-aligned, pre-faulted host buffers, the host
//!   collective runs there, and `memcpy_h2d` copies the result back,
//!   overlapped chunk by chunk for large tensors (see `pipeline.rs`).
//!
//! Ranks of one call may take different paths (a Ferrite rank device-direct,
//! a Cobalt rank staged): every rank issues the same host collectives, one
//! per chunk of [`DeviceComm::chunk_bytes`], which must therefore be equal
//! on every rank (the default is). Tensors must be compact; while a call
//! runs, no device work or other thread may use their memory (synchronize
//! the streams that produce them first).
//!
//! A chunk's host collective checks only that chunk against the peers', so
//! every chunked call makes the ranks agree on the whole call first or with
//! its first chunk: an all-reduce's chunks each carry the whole element
//! count in their headers (every rank takes from every other in the first
//! chunk, so all see a difference at once); a broadcast or a reduce, whose
//! chunks go one way only, first exchanges one header-only message per pair
//! of ranks describing the whole call (kind, element count, dtype, op,
//! root). Ranks whose calls differ then fail at once with
//! [`CommError::Mismatch`] naming both calls, instead of one returning a
//! partial result while another waits out the timeout. Send and receive
//! carry the tensor's size in each chunk; all-gather, reduce-scatter and
//! all-to-all run as one host collective, which carries the whole size.

mod p2p;
mod pipeline;
mod staging;

use polychip_host::{Device, Stream, Tensor};

pub use p2p::{DeviceP2p, MAX_GROUP};
pub use pipeline::DEPTH;
pub use staging::StagingPool;

use crate::collectives::{Communicator, DType, ReduceOp};
use crate::error::{CommError, Result};
use pipeline::{Chunked, Ctx, overlap};

/// Default bytes per chunk of a chunkable call.
pub const CHUNK: usize = 4 << 20;

/// How a tensor's bytes reach the host collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Path {
    /// In place, through host-visible device memory.
    DeviceDirect,
    /// Copied through host staging buffers by the plugin.
    Staged,
}

impl Path {
    /// The path tensors on `device` take.
    pub fn of(device: &Device) -> Path {
        if device.props().host_visible {
            Path::DeviceDirect
        } else {
            Path::Staged
        }
    }
}

/// The communication dtype of a device dtype (every dtype of the ABI has
/// one: a dtype a later ABI adds fails to compile here until it does).
pub fn comm_dtype(dtype: polychip_host::DType) -> DType {
    use polychip_host::DType as H;
    match dtype {
        H::F32 => DType::F32,
        H::F16 => DType::F16,
        H::BF16 => DType::BF16,
        H::F64 => DType::F64,
        H::I32 => DType::I32,
        H::I64 => DType::I64,
        H::U8 => DType::U8,
        H::Bool => DType::Bool,
    }
}

/// Collectives on device tensors over a borrowed [`Communicator`].
pub struct DeviceComm<'c> {
    comm: &'c mut Communicator,
    pool: StagingPool,
    chunk: usize,
    last: Option<Path>,
    stream: Option<&'c Stream>,
}

impl std::fmt::Debug for DeviceComm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (c, p, l) = (&self.comm, &self.pool, self.last);
        write!(
            f,
            "DeviceComm {{ {c:?}, {p:?}, chunk {}, last {l:?} }}",
            self.chunk
        )
    }
}

impl<'c> DeviceComm<'c> {
    /// Device collectives over `comm`, with an empty staging pool.
    pub fn new(comm: &'c mut Communicator) -> DeviceComm<'c> {
        DeviceComm::with_pool(comm, StagingPool::new())
    }

    /// Device collectives over `comm`, reusing `pool` (see [`Self::into_pool`]).
    pub fn with_pool(comm: &'c mut Communicator, pool: StagingPool) -> DeviceComm<'c> {
        DeviceComm {
            comm,
            pool,
            chunk: CHUNK,
            last: None,
            stream: None,
        }
    }

    /// Makes staged tensors' copies go on `stream` (waited for after each
    /// copy) instead of the device's default stream, one chunk after
    /// another on this thread: for a thread that reduces while another
    /// runs work on the device's default stream. Every tensor staged in a
    /// call must then be on the stream's device.
    pub fn on_stream(mut self, stream: &'c Stream) -> DeviceComm<'c> {
        self.stream = Some(stream);
        self
    }

    /// Gives the staging pool back, to keep it across borrows of the communicator.
    pub fn into_pool(self) -> StagingPool {
        self.pool
    }

    /// The host communicator.
    pub fn comm(&mut self) -> &mut Communicator {
        self.comm
    }

    /// The staging pool.
    pub fn pool(&self) -> &StagingPool {
        &self.pool
    }

    /// Sets the chunk size (rounded up to a multiple of 8 bytes). Every rank
    /// must use the same value.
    pub fn set_chunk_bytes(&mut self, bytes: usize) {
        self.chunk = bytes.max(1).next_multiple_of(8);
    }

    /// Bytes per chunk of a chunkable call.
    pub fn chunk_bytes(&self) -> usize {
        self.chunk
    }

    /// The path of the last call: [`Path::Staged`] when any of its tensors
    /// was staged. `None` before the first call.
    pub fn last_path(&self) -> Option<Path> {
        self.last
    }

    fn ctx(&self, op: &'static str) -> Ctx {
        Ctx {
            rank: self.comm.rank(),
            op,
        }
    }

    /// Checks `t` is compact and inside its buffer; returns its byte length.
    /// Refuses a `peer` that is this rank or not a rank of the
    /// communicator, before any transfer starts.
    fn check_peer(&self, op: &str, peer: usize) -> Result<()> {
        let (rank, world) = (self.comm.rank(), self.comm.world_size());
        if peer == rank || peer >= world {
            return Err(CommError::Usage(format!(
                "rank {rank}: {op}: peer {peer} is not another rank of this communicator \
                 (ranks 0 to {})",
                world - 1
            )));
        }
        Ok(())
    }

    fn check(&self, op: &str, t: &Tensor) -> Result<usize> {
        let rank = self.comm.rank();
        if !t.is_compact() {
            return Err(CommError::Usage(format!(
                "rank {rank}: {op}: the tensor on {} of shape {:?} with strides {:?} is not compact",
                t.device(),
                t.shape(),
                t.strides()
            )));
        }
        let bytes = t.numel() * t.dtype().size();
        if t.byte_offset() + bytes as u64 > t.buffer().len() {
            return Err(CommError::Usage(format!(
                "rank {rank}: {op}: a {bytes}-byte tensor at offset {} passes the end of its {}-byte buffer",
                t.byte_offset(),
                t.buffer().len()
            )));
        }
        Ok(bytes)
    }

    fn record(&mut self, tensors: &[&Tensor]) {
        let staged = tensors.iter().any(|t| Path::of(t.device()) == Path::Staged);
        self.last = Some(if staged {
            Path::Staged
        } else {
            Path::DeviceDirect
        });
    }

    fn distinct(&self, op: &str, a: (&Tensor, usize), b: (&Tensor, usize)) -> Result<()> {
        if overlap(a.0, a.1, b.0, b.1) {
            return Err(CommError::Usage(format!(
                "rank {}: {op}: the send and receive tensors share memory",
                self.comm.rank()
            )));
        }
        Ok(())
    }

    /// Reduces `t` across ranks in place.
    pub fn all_reduce(&mut self, t: &Tensor, op: ReduceOp) -> Result<()> {
        let (bytes, dtype) = (self.check("all_reduce", t)?, comm_dtype(t.dtype()));
        self.record(&[t]);
        let args = Chunked {
            src: None,
            dst: Some(t),
            load: true,
            store: true,
            bytes,
        };
        // Every chunk's header carries the whole count (see `agree`).
        let total = t.numel();
        let mut f = |c: &mut Communicator, _: Option<&[u8]>, d: Option<&mut [u8]>| {
            c.all_reduce_part(None, d.expect("dst"), dtype, op, total)
        };
        self.chunked(self.ctx("all_reduce"), args, &mut f)
    }

    /// Reduces every rank's `send` into every rank's `recv` (same dtype and
    /// size; the same tensor twice means in place).
    pub fn all_reduce_into(&mut self, send: &Tensor, recv: &Tensor, op: ReduceOp) -> Result<()> {
        let sb = self.check("all_reduce", send)?;
        let (rb, dtype) = (self.check("all_reduce", recv)?, comm_dtype(recv.dtype()));
        if send.dtype() != recv.dtype() || sb != rb {
            return Err(CommError::Usage(format!(
                "rank {}: all_reduce: send is {} {:?}, recv {} {:?}",
                self.comm.rank(),
                send.dtype(),
                send.shape(),
                recv.dtype(),
                recv.shape()
            )));
        }
        if std::sync::Arc::ptr_eq(send.buffer(), recv.buffer())
            && send.byte_offset() == recv.byte_offset()
        {
            return self.all_reduce(recv, op);
        }
        self.distinct("all_reduce", (send, sb), (recv, rb))?;
        self.record(&[send, recv]);
        let args = Chunked {
            src: Some(send),
            dst: Some(recv),
            load: false,
            store: true,
            bytes: rb,
        };
        let total = recv.numel();
        let mut f = |c: &mut Communicator, s: Option<&[u8]>, d: Option<&mut [u8]>| {
            c.all_reduce_part(s, d.expect("dst"), dtype, op, total)
        };
        self.chunked(self.ctx("all_reduce"), args, &mut f)
    }

    /// Concatenates every rank's `send` into `recv` (world times as many
    /// elements, in rank order).
    pub fn all_gather(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
        let (sb, rb) = (
            self.check("all_gather", send)?,
            self.check("all_gather", recv)?,
        );
        self.same_dtype("all_gather", send, recv)?;
        self.distinct("all_gather", (send, sb), (recv, rb))?;
        self.record(&[send, recv]);
        self.whole(self.ctx("all_gather"), (send, sb), (recv, rb), |c, s, d| {
            c.all_gather(s, d)
        })
    }

    /// Reduces every rank's `send` (world blocks) and leaves block `rank`
    /// of the result in `recv`.
    pub fn reduce_scatter(&mut self, send: &Tensor, recv: &Tensor, op: ReduceOp) -> Result<()> {
        let (sb, rb) = (
            self.check("reduce_scatter", send)?,
            self.check("reduce_scatter", recv)?,
        );
        self.same_dtype("reduce_scatter", send, recv)?;
        let dtype = comm_dtype(recv.dtype());
        self.distinct("reduce_scatter", (send, sb), (recv, rb))?;
        self.record(&[send, recv]);
        self.whole(
            self.ctx("reduce_scatter"),
            (send, sb),
            (recv, rb),
            |c, s, d| c.reduce_scatter(s, d, dtype, op),
        )
    }

    /// Makes every rank agree on the whole call before its first chunk
    /// (see the module documentation): a call whose chunks go one way only
    /// (a broadcast's from the root, a reduce's to it) would otherwise let
    /// a rank that reads nothing from a peer return, or wait until the
    /// timeout, when their sizes differ.
    fn agree(
        &mut self,
        kind: &'static str,
        dtype: DType,
        op: Option<ReduceOp>,
        root: usize,
        t: &Tensor,
    ) -> Result<()> {
        self.comm.agree(kind, Some(dtype), op, root, t.numel())
    }

    fn same_dtype(&self, op: &str, a: &Tensor, b: &Tensor) -> Result<()> {
        if a.dtype() != b.dtype() {
            return Err(CommError::Usage(format!(
                "rank {}: {op}: send is {}, recv {}",
                self.comm.rank(),
                a.dtype(),
                b.dtype()
            )));
        }
        Ok(())
    }

    /// Copies `root`'s `t` into every rank's `t`.
    pub fn broadcast(&mut self, t: &Tensor, root: usize) -> Result<()> {
        let bytes = self.check("broadcast", t)?;
        let dtype = comm_dtype(t.dtype());
        self.agree("broadcast", dtype, None, root, t)?;
        self.record(&[t]);
        let load = self.comm.rank() == root;
        let args = Chunked {
            src: None,
            dst: Some(t),
            load,
            store: true,
            bytes,
        };
        let mut f = |c: &mut Communicator, _: Option<&[u8]>, d: Option<&mut [u8]>| {
            c.broadcast(d.expect("dst"), root)
        };
        self.chunked(self.ctx("broadcast"), args, &mut f)
    }

    /// Reduces every rank's `t` into `root`'s `t`, in place, like
    /// [`Communicator::reduce`]: only `root`'s tensor is written; every other
    /// rank's `t` is read and left as it was. Chunk-pipelined like
    /// [`Self::all_reduce`]; a staged tensor off the root is copied to the
    /// host chunk by chunk but never back.
    pub fn reduce(&mut self, t: &Tensor, op: ReduceOp, root: usize) -> Result<()> {
        let (bytes, dtype) = (self.check("reduce", t)?, comm_dtype(t.dtype()));
        let (rank, world) = (self.comm.rank(), self.comm.world_size());
        if root >= world {
            return Err(CommError::Usage(format!(
                "rank {rank}: reduce: root {root} out of range (world {world}) for the {} {:?} tensor on {}",
                t.dtype(),
                t.shape(),
                t.device()
            )));
        }
        self.agree("reduce", dtype, Some(op), root, t)?;
        self.record(&[t]);
        let args = Chunked {
            src: None,
            dst: Some(t),
            load: true,
            store: rank == root,
            bytes,
        };
        let mut f = |c: &mut Communicator, _: Option<&[u8]>, d: Option<&mut [u8]>| {
            c.reduce(d.expect("dst"), dtype, op, root)
        };
        self.chunked(self.ctx("reduce"), args, &mut f)
    }

    /// Sends block `j` of `send` to rank `j`; block `j` of `recv` gets what
    /// rank `j` sent here (its block `rank`), like [`Communicator::all_to_all`]:
    /// `send` and `recv` have the same dtype and size, a multiple of the
    /// world size in elements (blocks of whole elements), and do not share
    /// memory. Not chunk-pipelined: a chunk of every block would be `world`
    /// separate ranges of each tensor, so a staged tensor goes through the
    /// staging pool whole (one copy out, one back), as in
    /// [`Self::all_gather`].
    pub fn all_to_all(&mut self, send: &Tensor, recv: &Tensor) -> Result<()> {
        let (sb, rb) = (
            self.check("all_to_all", send)?,
            self.check("all_to_all", recv)?,
        );
        let (rank, world) = (self.comm.rank(), self.comm.world_size());
        if send.dtype() != recv.dtype() || sb != rb || send.numel() % world != 0 {
            return Err(CommError::Usage(format!(
                "rank {rank}: all_to_all: send is {} {:?}, recv {} {:?}; both need the same dtype and \
                 size, a multiple of the world size {world} in elements",
                send.dtype(),
                send.shape(),
                recv.dtype(),
                recv.shape()
            )));
        }
        self.distinct("all_to_all", (send, sb), (recv, rb))?;
        self.record(&[send, recv]);
        self.whole(self.ctx("all_to_all"), (send, sb), (recv, rb), |c, s, d| {
            c.all_to_all(s, d)
        })
    }

    /// Sends `t` to `peer`, which calls [`DeviceComm::recv`] with a tensor of
    /// the same byte size and dtype (the receiver refuses another dtype,
    /// naming both; this rank learns of it only if it is still waiting for
    /// the receiver to take its chunks).
    pub fn send(&mut self, t: &Tensor, peer: usize) -> Result<()> {
        let (bytes, dtype) = (self.check("send", t)?, comm_dtype(t.dtype()));
        self.check_peer("send", peer)?;
        self.record(&[t]);
        let args = Chunked {
            src: Some(t),
            dst: None,
            load: false,
            store: false,
            bytes,
        };
        // Each chunk's header carries the tensor's size and dtype, which
        // the peer's must equal.
        let mut f = |c: &mut Communicator, s: Option<&[u8]>, _: Option<&mut [u8]>| {
            c.send_part(s.expect("src"), peer, bytes, Some(dtype))
        };
        self.chunked(self.ctx("send"), args, &mut f)
    }

    /// Receives into `t` what `peer` sent with [`DeviceComm::send`]: a
    /// send of another byte size or dtype is a [`CommError::Mismatch`]
    /// naming both.
    pub fn recv(&mut self, t: &Tensor, peer: usize) -> Result<()> {
        let (bytes, dtype) = (self.check("recv", t)?, comm_dtype(t.dtype()));
        self.check_peer("recv", peer)?;
        self.record(&[t]);
        let args = Chunked {
            src: None,
            dst: Some(t),
            load: false,
            store: true,
            bytes,
        };
        let mut f = |c: &mut Communicator, _: Option<&[u8]>, d: Option<&mut [u8]>| {
            c.recv_part(d.expect("dst"), peer, bytes, Some(dtype))
        };
        self.chunked(self.ctx("recv"), args, &mut f)
    }
}

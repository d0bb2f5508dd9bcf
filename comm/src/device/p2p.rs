//! Sends and receives run together ([`DeviceComm::p2p_group`]): the
//! device side of [`Communicator::p2p_group`](crate::collectives::Communicator::p2p_group),
//! each tensor split into the chunks the plain calls send, staged tensors
//! copied whole.

use polychip_host::Tensor;

use super::pipeline::{d2h, h2d, host_slice, host_slice_ref, overlap, staged};
use super::{DeviceComm, comm_dtype};
use crate::collectives::P2p;
use crate::error::{CommError, Result};

/// One operation of a [`DeviceComm::p2p_group`].
#[derive(Debug, Clone, Copy)]
pub enum DeviceP2p<'t> {
    /// Sends the tensor to the rank.
    Send(&'t Tensor, usize),
    /// Receives into the tensor what the rank sends.
    Recv(&'t Tensor, usize),
}

impl<'t> DeviceP2p<'t> {
    fn tensor(&self) -> &'t Tensor {
        match *self {
            DeviceP2p::Send(t, _) | DeviceP2p::Recv(t, _) => t,
        }
    }

    fn receives(&self) -> bool {
        matches!(self, DeviceP2p::Recv(..))
    }
}

/// The most operations one [`DeviceComm::p2p_group`] takes.
pub const MAX_GROUP: usize = 4096;

/// A group operation's bytes on the host: read (a send) or written (a
/// receive). Sends are only ever read, so two sends of one tensor are two
/// shared borrows of its memory.
enum Bytes<'a> {
    Read(&'a [u8]),
    Write(&'a mut [u8]),
}

impl Bytes<'_> {
    fn len(&self) -> usize {
        match self {
            Bytes::Read(b) => b.len(),
            Bytes::Write(b) => b.len(),
        }
    }
}

impl DeviceComm<'_> {
    /// Runs sends and receives together, so that ranks that send to each
    /// other before they receive do not wait on each other (see
    /// [`Communicator::p2p_group`](crate::collectives::Communicator::p2p_group));
    /// a peer takes each send with a [`DeviceComm::recv`] or a group's
    /// receive of the same byte size, and a send to this rank goes to its
    /// receive from this rank. Staged tensors are copied whole through the
    /// staging pool (which keeps the memory for later calls).
    pub fn p2p_group(&mut self, ops: &[DeviceP2p<'_>]) -> Result<()> {
        let ctx = self.ctx("send/recv group");
        let (rank, world) = (ctx.rank, self.comm.world_size());
        if ops.len() > MAX_GROUP {
            return Err(CommError::Usage(format!(
                "rank {rank}: a send/recv group of {} operations; the most is {MAX_GROUP}",
                ops.len()
            )));
        }
        let mut bytes = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            let (name, peer) = match *op {
                DeviceP2p::Send(_, p) => ("send", p),
                DeviceP2p::Recv(_, p) => ("recv", p),
            };
            bytes.push(self.check(name, op.tensor())?);
            if peer >= world {
                return Err(CommError::Usage(format!(
                    "rank {rank}: send/recv group: operation {i}'s peer {peer} is not a rank of \
                     this communicator (ranks 0 to {})",
                    world - 1
                )));
            }
        }
        // A receive may share memory with nothing else in the group.
        for (i, a) in ops.iter().enumerate() {
            for (j, b) in ops.iter().enumerate().skip(i + 1) {
                let writes = a.receives() || b.receives();
                if writes && overlap(a.tensor(), bytes[i], b.tensor(), bytes[j]) {
                    return Err(CommError::Usage(format!(
                        "rank {rank}: send/recv group: operations {i} and {j} share memory, and \
                         one of them receives"
                    )));
                }
            }
        }
        let tensors: Vec<&Tensor> = ops.iter().map(DeviceP2p::tensor).collect();
        self.record(&tensors);
        let staged: Vec<bool> = tensors.iter().map(|t| staged(Some(t)).is_some()).collect();
        let sizes: Vec<usize> = (0..ops.len())
            .map(|i| if staged[i] { bytes[i] } else { 0 })
            .collect();
        let (stream, chunk) = (self.stream, self.chunk);
        let bufs = self.pool.try_take(&sizes).map_err(|bytes| CommError::Io {
            rank,
            op: ctx.op.into(),
            message: format!(
                "could not allocate {bytes} bytes of host memory to stage a tensor of the group \
                 (a group stages each staged tensor whole; send it in parts)"
            ),
        })?;
        let mut bufs = bufs.into_iter();
        let mut host: Vec<Bytes<'_>> = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            let buf = bufs.next().expect("one per operation");
            let t = tensors[i];
            host.push(match (staged[i], op.receives()) {
                (true, false) => {
                    d2h(ctx, t, 0, buf, stream)?;
                    Bytes::Read(buf)
                }
                (true, true) => Bytes::Write(buf),
                // SAFETY: `check` verified compactness and extent; memory a
                // receive writes is shared with no other operation (above)
                // and sends only read; the API documents exclusive use
                // during the call.
                (false, false) => Bytes::Read(unsafe { host_slice_ref(t, bytes[i]) }),
                // SAFETY: as above.
                (false, true) => Bytes::Write(unsafe { host_slice(t, bytes[i]) }),
            });
        }
        // Each tensor as the plain calls send it: one message per chunk,
        // each carrying the tensor's size and dtype (`parts`).
        let (mut pieces, mut parts) = (Vec::new(), Vec::new());
        for (op, buf) in ops.iter().zip(host.iter_mut()) {
            let peer = match *op {
                DeviceP2p::Send(_, p) | DeviceP2p::Recv(_, p) => p,
            };
            let (before, total) = (pieces.len(), buf.len());
            // An empty tensor is one empty message, as in the plain calls.
            match buf {
                Bytes::Read(b) if b.is_empty() => pieces.push(P2p::Send(b, peer)),
                Bytes::Read(b) => pieces.extend(b.chunks(chunk).map(|c| P2p::Send(c, peer))),
                Bytes::Write(b) => match b.is_empty() {
                    true => pieces.push(P2p::Recv(b, peer)),
                    false => pieces.extend(b.chunks_mut(chunk).map(|c| P2p::Recv(c, peer))),
                },
            }
            let part = (total, Some(comm_dtype(op.tensor().dtype())));
            parts.resize(parts.len() + pieces.len() - before, part);
        }
        self.comm.p2p_group_parts(&mut pieces, Some(&parts))?;
        drop(pieces);
        for (i, buf) in host.iter().enumerate() {
            if let (true, Bytes::Write(b)) = (staged[i], buf) {
                h2d(ctx, tensors[i], 0, b, stream)?;
            }
        }
        Ok(())
    }
}

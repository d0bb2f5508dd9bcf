//! Sends and receives run together ([`DeviceComm::p2p_group`]): the
//! device side of [`Communicator::p2p_group`](crate::collectives::Communicator::p2p_group), each tensor split into the
//! chunks the plain calls send, staged tensors copied whole.

use polychip_host::Tensor;

use super::DeviceComm;
use super::pipeline::{d2h, h2d, host_slice, overlap, staged};
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

/// The most operations one [`DeviceComm::p2p_group`] takes.
pub const MAX_GROUP: usize = 4096;

impl DeviceComm<'_> {
    /// Runs sends and receives together, so that ranks that send to each
    /// other before they receive do not wait on each other (see
    /// [`Communicator::p2p_group`](crate::collectives::Communicator::p2p_group)); a peer takes each send with a
    /// [`DeviceComm::recv`] or a group's receive of the same byte size.
    /// Staged tensors are copied whole through the staging pool.
    pub fn p2p_group(&mut self, ops: &[DeviceP2p<'_>]) -> Result<()> {
        let ctx = self.ctx("send/recv group");
        if ops.len() > MAX_GROUP {
            return Err(CommError::Usage(format!(
                "rank {}: a send/recv group of {} operations; the most is {MAX_GROUP}",
                ctx.rank,
                ops.len()
            )));
        }
        let mut bytes = Vec::with_capacity(ops.len());
        for op in ops {
            let (name, t, peer) = match *op {
                DeviceP2p::Send(t, p) => ("send", t, p),
                DeviceP2p::Recv(t, p) => ("recv", t, p),
            };
            bytes.push(self.check(name, t)?);
            self.check_peer(name, peer)?;
        }
        // A receive may share memory with nothing else in the group.
        for (i, a) in ops.iter().enumerate() {
            for (j, b) in ops.iter().enumerate().skip(i + 1) {
                let (DeviceP2p::Send(x, _) | DeviceP2p::Recv(x, _)) = *a;
                let (DeviceP2p::Send(y, _) | DeviceP2p::Recv(y, _)) = *b;
                let writes = matches!(a, DeviceP2p::Recv(..)) || matches!(b, DeviceP2p::Recv(..));
                if writes && overlap(x, bytes[i], y, bytes[j]) {
                    return Err(CommError::Usage(format!(
                        "rank {}: send/recv group: operations {i} and {j} share memory, and one of \
                         them receives",
                        ctx.rank
                    )));
                }
            }
        }
        let tensors: Vec<&Tensor> = ops
            .iter()
            .map(|op| match *op {
                DeviceP2p::Send(t, _) | DeviceP2p::Recv(t, _) => t,
            })
            .collect();
        self.record(&tensors);
        let staged: Vec<bool> = tensors.iter().map(|t| staged(Some(t)).is_some()).collect();
        let sizes: Vec<usize> = (0..ops.len())
            .map(|i| if staged[i] { bytes[i] } else { 0 })
            .collect();
        let stream = self.stream;
        let chunk = self.chunk;
        let mut bufs = self.pool.take(&sizes).into_iter();
        let mut host: Vec<&mut [u8]> = Vec::with_capacity(ops.len());
        for (i, t) in tensors.iter().enumerate() {
            let buf = bufs.next().expect("one per operation");
            if staged[i] {
                if matches!(ops[i], DeviceP2p::Send(..)) {
                    d2h(ctx, t, 0, buf, stream)?;
                }
                host.push(buf);
            } else {
                // SAFETY: `check` verified compactness and extent; no two
                // operations share memory where one writes (above); the
                // API documents exclusive use during the call.
                host.push(unsafe { host_slice(t, bytes[i]) });
            }
        }
        // Each tensor as the plain calls send it: one message per chunk.
        let mut pieces = Vec::new();
        for (op, buf) in ops.iter().zip(host.iter_mut()) {
            let chunks: Vec<&mut [u8]> = match buf.len() {
                0 => vec![&mut buf[..]],
                _ => buf.chunks_mut(chunk).collect(),
            };
            for c in chunks {
                pieces.push(match *op {
                    DeviceP2p::Send(_, p) => P2p::Send(&*c, p),
                    DeviceP2p::Recv(_, p) => P2p::Recv(c, p),
                });
            }
        }
        self.comm.p2p_group(&mut pieces)?;
        drop(pieces);
        for (i, t) in tensors.iter().enumerate() {
            if staged[i] && matches!(ops[i], DeviceP2p::Recv(..)) {
                h2d(ctx, t, 0, host[i], stream)?;
            }
        }
        Ok(())
    }
}

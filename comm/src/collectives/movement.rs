//! Operations that move data without reducing it: all-gather, all-to-all,
//! broadcast, send/recv and the barrier.

use super::channel::Header;
use super::ops::piece;
use super::{Communicator, NSLOT};
use crate::error::Result;

impl Communicator {
    /// Concatenates every rank's `send` into `recv` (`world` blocks, in rank order).
    pub fn all_gather(&mut self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        if recv.len() != send.len() * self.world {
            return Err(self.usage(format!(
                "all_gather: recv has {} bytes, expected world x {}",
                recv.len(),
                send.len()
            )));
        }
        let h = self.begin("all_gather", None, None, 0, send.len(), true)?;
        self.exchange(&h, |_| send, recv)
    }

    /// Sends block `j` of `send` to rank `j` and receives block `j` of `recv` from rank `j`.
    pub fn all_to_all(&mut self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        if send.len() != recv.len() || send.len() % self.world != 0 {
            return Err(self.usage(format!(
                "all_to_all: send {} and recv {} bytes must be equal multiples of the world size",
                send.len(),
                recv.len()
            )));
        }
        let b = send.len() / self.world;
        let h = self.begin("all_to_all", None, None, 0, b, true)?;
        self.exchange(&h, |j| &send[j * b..(j + 1) * b], recv)
    }

    /// Every rank sends `part(peer)` to each peer; block `j` of `recv` gets rank `j`'s part.
    fn exchange<'a>(
        &mut self,
        h: &Header,
        part: impl Fn(usize) -> &'a [u8],
        recv: &mut [u8],
    ) -> Result<()> {
        let (me, view, b) = (self.rank, self.view, h.count);
        let (seg, pieces) = Self::segments(b, None);
        recv[me * b..(me + 1) * b].copy_from_slice(part(me));
        for p in 0..=pieces {
            if p < pieces {
                for peer in self.peers() {
                    self.put(0, peer, h, &part(peer)[piece(b, seg, p)])?;
                }
            }
            let Some(p) = p.checked_sub(1) else { continue };
            let r = piece(b, seg, p);
            for peer in self.peers() {
                let off = self.take(0, peer, h, r.len())?;
                recv[peer * b + r.start..peer * b + r.end]
                    .copy_from_slice(view.bytes(off, r.len()));
                self.release(0, peer)?;
            }
        }
        Ok(())
    }

    /// Copies `root`'s `buf` into every rank's `buf`.
    pub fn broadcast(&mut self, buf: &mut [u8], root: usize) -> Result<()> {
        let h = self.begin("broadcast", None, None, root, buf.len(), true)?;
        let (seg, pieces) = Self::segments(buf.len(), None);
        let view = self.view;
        for p in 0..pieces {
            let r = piece(buf.len(), seg, p);
            if self.rank == root {
                for peer in self.peers() {
                    // A free slot first, waited for as below (a peer that
                    // is not taking may be in another call).
                    self.await_taken(0, peer, &h, r.len(), NSLOT - 1)?;
                    self.put(0, peer, &h, &buf[r.clone()])?;
                }
            } else {
                let off = self.take(0, root, &h, r.len())?;
                buf[r.clone()].copy_from_slice(view.bytes(off, r.len()));
                self.release(0, root)?;
            }
        }
        // The root returns once every peer has taken the first piece (so is
        // in this broadcast, from this root): ranks that disagree on the
        // root then fail, instead of each returning its own data. Not the
        // last piece: the root need not wait for its peers' copies.
        if self.rank == root {
            let last = piece(buf.len(), seg, pieces.saturating_sub(1)).len();
            for peer in self.peers() {
                self.await_taken(0, peer, &h, last, pieces.saturating_sub(1) as u64)?;
            }
        }
        Ok(())
    }

    /// Sends `buf` to `peer`, which must call [`Communicator::recv`] with the
    /// same length. Returns once the last piece is written; blocks while
    /// more than 1 MiB is unconsumed.
    pub fn send(&mut self, buf: &[u8], peer: usize) -> Result<()> {
        let h = self.begin("send/recv", None, None, 0, buf.len(), false)?;
        if peer == self.rank {
            return Err(self.usage("send to self".into()));
        }
        if peer >= self.world {
            return Err(self.usage(format!(
                "send to rank {peer}, not a rank of this communicator (ranks 0 to {})",
                self.world - 1
            )));
        }
        let (seg, pieces) = Self::segments(buf.len(), None);
        (0..pieces).try_for_each(|p| self.put(1, peer, &h, &buf[piece(buf.len(), seg, p)]))
    }

    /// Receives into `buf` what `peer` sent with [`Communicator::send`].
    pub fn recv(&mut self, buf: &mut [u8], peer: usize) -> Result<()> {
        let h = self.begin("send/recv", None, None, 0, buf.len(), false)?;
        if peer == self.rank || peer >= self.world {
            return Err(self.usage(format!("recv from rank {peer}")));
        }
        let (seg, pieces) = Self::segments(buf.len(), None);
        let view = self.view;
        for p in 0..pieces {
            let r = piece(buf.len(), seg, p);
            let off = self.take(1, peer, &h, r.len())?;
            buf[r.clone()].copy_from_slice(view.bytes(off, r.len()));
            self.release(1, peer)?;
        }
        Ok(())
    }

    /// Returns once every rank has entered the barrier.
    pub fn barrier(&mut self) -> Result<()> {
        let h = self.begin("barrier", None, None, 0, 0, true)?;
        for peer in self.peers() {
            self.put(0, peer, &h, &[])?;
        }
        for peer in self.peers() {
            self.take(0, peer, &h, 0)?;
            self.release(0, peer)?;
        }
        Ok(())
    }
}

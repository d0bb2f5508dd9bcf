//! The reductions (all-reduce, reduce-scatter, reduce), over the message
//! layer of `channel.rs`. Large buffers move in
//! pieces of at most [`SLOT`] bytes; a rank sends piece `p + 1` before it
//! consumes piece `p`, so copies and reductions overlap across ranks.

use std::ops::Range;

use super::reduce::fold;
use super::{Communicator, DType, ReduceOp, SLOT};
use crate::error::{CommError, Result};

/// All-reduce buffers up to this many bytes take the one-step path.
const SMALL: usize = 32 << 10;

/// Element range of piece `p` (pieces of `seg` elements) clipped to `count`.
pub(super) fn piece(count: usize, seg: usize, p: usize) -> Range<usize> {
    (p * seg).min(count)..((p + 1) * seg).min(count)
}

/// Elements of segment `j` of chunk `k` (chunks of `chunk` elements, the
/// last one possibly short): an even split of the chunk among the `n`
/// ranks, in whole 64-byte lines, so that a short chunk (a buffer of less
/// than `n x SLOT` bytes, or the tail of a longer one) keeps every rank
/// busy instead of leaving the work to the first ones.
fn share(count: usize, chunk: usize, n: usize, es: usize, k: usize, j: usize) -> Range<usize> {
    let start = k * chunk;
    let len = count.saturating_sub(start).min(chunk);
    let line = (64 / es).max(1);
    let per = len.div_ceil(n).div_ceil(line) * line;
    let end = start + len;
    (start + j * per).min(end)..(start + (j + 1) * per).min(end)
}

fn bytes(r: Range<usize>, es: usize) -> Range<usize> {
    r.start * es..r.end * es
}

impl Communicator {
    pub(super) fn peers(&self) -> impl Iterator<Item = usize> + use<> {
        let (me, n) = (self.rank, self.world);
        (1..n).map(move |i| (me + i) % n)
    }

    fn count(&self, len: usize, dtype: Option<DType>, kind: &str) -> Result<usize> {
        let es = dtype.map_or(1, DType::size);
        match len % es {
            0 => Ok(len / es),
            _ => Err(self.usage(format!(
                "{kind}: {len} bytes is not a whole number of {}",
                dtype.map_or("bytes", DType::name)
            ))),
        }
    }

    /// Pieces of `count` elements: (elements per piece, number of pieces >= 1).
    /// Refuses a reduction no kernel defines (the average of bools).
    fn check_reduction(&self, dtype: DType, op: ReduceOp, kind: &str) -> Result<()> {
        super::reduce::check_op(dtype, op)
            .map_err(|why| CommError::Usage(format!("rank {}: {kind}: {why}", self.rank)))
    }

    pub(super) fn segments(count: usize, dtype: Option<DType>) -> (usize, usize) {
        let seg = SLOT / dtype.map_or(1, DType::size);
        (seg, count.div_ceil(seg).max(1))
    }

    /// Reduces `buf` across ranks in place: every rank ends with the result.
    pub fn all_reduce(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        self.all_reduce_impl(None, buf, dtype, op, None)
    }

    /// [`Communicator::all_reduce`] (`src` given: `all_reduce_into`) of one
    /// part of a call of `total` elements run in several (a device tensor
    /// in chunks): every message's header carries the total, so ranks whose
    /// totals differ fail at the first part, every rank (each takes from
    /// every other first), naming both, where parts of equal sizes alone
    /// would let one rank return with a partial result.
    pub(crate) fn all_reduce_part(
        &mut self,
        src: Option<&[u8]>,
        out: &mut [u8],
        dtype: DType,
        op: ReduceOp,
        total: usize,
    ) -> Result<()> {
        if src.is_some_and(|s| s.len() != out.len()) {
            return Err(self.usage(format!(
                "all_reduce: send has {} bytes, recv {}",
                src.map_or(0, <[u8]>::len),
                out.len()
            )));
        }
        self.all_reduce_impl(src, out, dtype, op, Some(total))
    }

    /// Reduces every rank's `send` into every rank's `recv` (same length).
    pub fn all_reduce_into(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        if send.len() != recv.len() {
            return Err(self.usage(format!(
                "all_reduce: send has {} bytes, recv {}",
                send.len(),
                recv.len()
            )));
        }
        self.all_reduce_impl(Some(send), recv, dtype, op, None)
    }

    /// `total`: the element count headers carry, when `out` is one part of
    /// a larger call (see [`Communicator::all_reduce_part`]).
    fn all_reduce_impl(
        &mut self,
        src: Option<&[u8]>,
        out: &mut [u8],
        dtype: DType,
        op: ReduceOp,
        total: Option<usize>,
    ) -> Result<()> {
        let count = self.count(out.len(), Some(dtype), "all_reduce")?;
        self.check_reduction(dtype, op, "all_reduce")?;
        let whole = total.unwrap_or(count);
        let h = self.begin("all_reduce", Some(dtype), Some(op), 0, whole, true)?;
        let (me, n, es, view) = (self.rank, self.world, dtype.size(), self.view);
        let mut inputs: [&[u8]; super::MAX_WORLD] = [&[]; super::MAX_WORLD];
        if n == 1 || out.len() <= SMALL {
            for peer in self.peers() {
                self.put(0, peer, &h, src.unwrap_or(out))?;
            }
            for peer in self.peers() {
                inputs[peer] = view.bytes(self.take(0, peer, &h, out.len())?, out.len());
            }
            fold(dtype, op, out, src, me, &inputs[..n]);
            return self.peers().try_for_each(|peer| self.release(0, peer));
        }
        // Chunk k = n segments of at most `SLOT` bytes; rank j reduces segment j.
        let chunk = SLOT / es * n;
        let chunks = count.div_ceil(chunk);
        let range = |k: usize, j: usize| bytes(share(count, chunk, n, es, k, j), es);
        let scatter = |c: &mut Communicator, out: &[u8], k: usize| -> Result<()> {
            for peer in c.peers() {
                c.put(0, peer, &h, &src.unwrap_or(out)[range(k, peer)])?;
            }
            Ok(())
        };
        scatter(self, out, 0)?;
        for k in 0..chunks {
            if k + 1 < chunks {
                scatter(self, out, k + 1)?;
            }
            let mine = range(k, me);
            for peer in self.peers() {
                inputs[peer] = view.bytes(self.take(0, peer, &h, mine.len())?, mine.len());
            }
            fold(
                dtype,
                op,
                &mut out[mine.clone()],
                src.map(|s| &s[mine.clone()]),
                me,
                &inputs[..n],
            );
            for peer in self.peers() {
                self.release(0, peer)?;
                self.put(1, peer, &h, &out[mine.clone()])?;
            }
            for peer in self.peers() {
                let theirs = range(k, peer);
                let off = self.take(1, peer, &h, theirs.len())?;
                out[theirs.clone()].copy_from_slice(view.bytes(off, theirs.len()));
                self.release(1, peer)?;
            }
        }
        Ok(())
    }

    /// Reduces every rank's `send` (`world` blocks) and leaves block `rank`
    /// of the result in `recv`.
    pub fn reduce_scatter(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let count = self.count(recv.len(), Some(dtype), "reduce_scatter")?;
        self.check_reduction(dtype, op, "reduce_scatter")?;
        if send.len() != recv.len() * self.world {
            return Err(self.usage(format!(
                "send has {} bytes, expected world x {}",
                send.len(),
                recv.len()
            )));
        }
        let h = self.begin("reduce_scatter", Some(dtype), Some(op), 0, count, true)?;
        let (me, n, es, view) = (self.rank, self.world, dtype.size(), self.view);
        let (seg, pieces) = Self::segments(count, Some(dtype));
        let rl = recv.len();
        let block = |j: usize, p: usize| {
            let r = bytes(piece(count, seg, p), es);
            r.start + j * rl..r.end + j * rl
        };
        let mut inputs: [&[u8]; super::MAX_WORLD] = [&[]; super::MAX_WORLD];
        for p in 0..=pieces {
            if p < pieces {
                for peer in self.peers() {
                    self.put(0, peer, &h, &send[block(peer, p)])?;
                }
            }
            let Some(p) = p.checked_sub(1) else { continue };
            let r = bytes(piece(count, seg, p), es);
            for peer in self.peers() {
                inputs[peer] = view.bytes(self.take(0, peer, &h, r.len())?, r.len());
            }
            fold(
                dtype,
                op,
                &mut recv[r],
                Some(&send[block(me, p)]),
                me,
                &inputs[..n],
            );
            for peer in self.peers() {
                self.release(0, peer)?;
            }
        }
        Ok(())
    }

    /// Reduces every rank's `buf` into `root`'s `buf` (the others' are unchanged).
    pub fn reduce(
        &mut self,
        buf: &mut [u8],
        dtype: DType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let count = self.count(buf.len(), Some(dtype), "reduce")?;
        self.check_reduction(dtype, op, "reduce")?;
        let h = self.begin("reduce", Some(dtype), Some(op), root, count, true)?;
        let (me, n, es, view) = (self.rank, self.world, dtype.size(), self.view);
        let (seg, pieces) = Self::segments(count, Some(dtype));
        let mut inputs: [&[u8]; super::MAX_WORLD] = [&[]; super::MAX_WORLD];
        for p in 0..pieces {
            let r = bytes(piece(count, seg, p), es);
            if me != root {
                self.put(0, root, &h, &buf[r])?;
                continue;
            }
            for peer in self.peers() {
                inputs[peer] = view.bytes(self.take(0, peer, &h, r.len())?, r.len());
            }
            fold(dtype, op, &mut buf[r], None, me, &inputs[..n]);
            for peer in self.peers() {
                self.release(0, peer)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_split_every_chunk_evenly_within_a_slot() {
        for (n, es) in [(1, 4), (2, 4), (2, 2), (3, 8), (4, 4), (7, 2)] {
            let chunk = SLOT / es * n;
            for count in [
                0,
                1,
                15,
                1000,
                chunk - 1,
                chunk,
                chunk + 17,
                3 * chunk + 12345,
            ] {
                let mut next = 0;
                for k in 0..count.div_ceil(chunk) {
                    let len = (count - k * chunk).min(chunk);
                    for j in 0..n {
                        let r = share(count, chunk, n, es, k, j);
                        assert_eq!(r.start, next, "n {n} count {count} chunk {k} rank {j}");
                        assert!(r.len() * es <= SLOT);
                        assert!(r.len() <= len.div_ceil(n) + 64 / es);
                        next = r.end;
                    }
                }
                assert_eq!(next, count, "n {n} count {count}");
            }
        }
    }
}

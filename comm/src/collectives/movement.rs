//! Operations that move data without reducing it: all-gather, all-to-all,
//! broadcast, send/recv (alone and in groups) and the barrier.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::channel::Header;
use super::ops::piece;
use super::{Communicator, DType, NSLOT};
use crate::error::Result;
use crate::transport::Transport;

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
        self.send_part(buf, peer, buf.len(), None)
    }

    /// [`Communicator::send`] of `buf`, one part of a message of `total`
    /// bytes sent in several (a device tensor in chunks): every part's
    /// header carries the total, so a receiver expecting another size fails
    /// at the first part, naming both, where parts of equal sizes alone
    /// would let it take a prefix and lose the rest. With a `dtype` (a
    /// device tensor's), every part's header carries it too, and a
    /// receiver expecting another dtype fails at the first part naming
    /// both (bytes sent or received without one match any dtype).
    pub(crate) fn send_part(
        &mut self,
        buf: &[u8],
        peer: usize,
        total: usize,
        dtype: Option<DType>,
    ) -> Result<()> {
        let h = self.begin("send/recv", dtype, None, 0, total, false)?;
        if peer == self.rank {
            return Err(self.usage("send to self".into()));
        }
        if peer >= self.world {
            return Err(self.usage(format!(
                "send to rank {peer}, not a rank of this communicator (ranks 0 to {})",
                self.world - 1
            )));
        }
        self.check_not_left(peer)?;
        let (seg, pieces) = Self::segments(buf.len(), None);
        (0..pieces).try_for_each(|p| self.put(1, peer, &h, &buf[piece(buf.len(), seg, p)]))
    }

    /// Receives into `buf` what `peer` sent with [`Communicator::send`].
    pub fn recv(&mut self, buf: &mut [u8], peer: usize) -> Result<()> {
        let total = buf.len();
        self.recv_part(buf, peer, total, None)
    }

    /// [`Communicator::recv`] into `buf`, one part of a message of `total`
    /// bytes of `dtype` (see [`Communicator::send_part`]).
    pub(crate) fn recv_part(
        &mut self,
        buf: &mut [u8],
        peer: usize,
        total: usize,
        dtype: Option<DType>,
    ) -> Result<()> {
        let h = self.begin("send/recv", dtype, None, 0, total, false)?;
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

/// One operation of a [`Communicator::p2p_group`]: a send of a buffer to a
/// rank, or a receive into a buffer from one.
#[derive(Debug)]
pub enum P2p<'a> {
    /// Sends the bytes to the rank, which receives them with a
    /// [`Communicator::recv`] or a group's [`P2p::Recv`] of the same length.
    Send(&'a [u8], usize),
    /// Receives into the bytes what the rank sends.
    Recv(&'a mut [u8], usize),
}

impl P2p<'_> {
    fn peer(&self) -> usize {
        match self {
            P2p::Send(_, p) | P2p::Recv(_, p) => *p,
        }
    }

    fn len(&self) -> usize {
        match self {
            P2p::Send(b, _) => b.len(),
            P2p::Recv(b, _) => b.len(),
        }
    }
}

/// The operations of a group between this rank and one peer in one
/// direction, run one after another (in the order of the plain calls):
/// `at` is the current operation, `piece` its next piece.
struct Lane {
    peer: usize,
    send: bool,
    ops: Vec<usize>,
    at: usize,
    piece: usize,
}

/// A transport in [`Transport::polling`] mode while this lives.
struct Polling(Arc<dyn Transport>);

impl Polling {
    fn new(transport: &Arc<dyn Transport>) -> Polling {
        transport.polling(true);
        Polling(transport.clone())
    }
}

impl Drop for Polling {
    fn drop(&mut self) {
        self.0.polling(false);
    }
}

/// Times a group looks at its signals, nothing having moved, before it
/// yields its core (as the shared-memory transport's wait spins first).
const SPINS: usize = 256;

/// A group that cannot move yields its core for this long, then sleeps
/// between looks at its signals, from the first to the second nap,
/// doubling; it asks the transport whether its peers are still there (and
/// the deadline whether it has passed) at the third interval.
const IDLE: (Duration, Duration, Duration, Duration) = (
    Duration::from_millis(2),
    Duration::from_micros(50),
    Duration::from_millis(1),
    Duration::from_millis(100),
);

impl Communicator {
    /// Runs sends and receives together: whichever operation can move
    /// does, a piece at a time, so that ranks that each send before they
    /// receive (a swap, a ring, both directions of a pipeline) do not wait
    /// on each other as blocking [`Communicator::send`] and
    /// [`Communicator::recv`] of more than 1 MiB would. Operations with the
    /// same peer in the same direction run in their order in `ops`, so a
    /// peer may take them with plain calls in that order, or with a group
    /// of its own. Sends to this rank go to its receives from this rank,
    /// in order. The timeout bounds a wait in which nothing moves.
    pub fn p2p_group(&mut self, ops: &mut [P2p<'_>]) -> Result<()> {
        self.p2p_group_parts(ops, None)
    }

    /// [`Communicator::p2p_group`] where operation `i` is a part of a
    /// message of `parts[i].0` bytes of dtype `parts[i].1` (see
    /// [`Communicator::send_part`]).
    pub(crate) fn p2p_group_parts(
        &mut self,
        ops: &mut [P2p<'_>],
        parts: Option<&[(usize, Option<DType>)]>,
    ) -> Result<()> {
        self.begin("send/recv", None, None, 0, 0, false)?;
        for op in ops.iter() {
            let peer = op.peer();
            if peer >= self.world {
                return Err(self.usage(format!(
                    "a group's {} with rank {peer}, not a rank of this communicator \
                     (ranks 0 to {})",
                    if matches!(op, P2p::Send(..)) {
                        "send"
                    } else {
                        "receive"
                    },
                    self.world - 1
                )));
            }
        }
        for op in ops.iter() {
            if let P2p::Send(_, peer) = op
                && *peer != self.rank
            {
                self.check_not_left(*peer)?;
            }
        }
        if ops.iter().any(|op| op.peer() == self.rank) {
            self.to_self(ops, parts)?;
        }
        let mut lanes: Vec<Lane> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let (peer, send) = (op.peer(), matches!(op, P2p::Send(..)));
            if peer == self.rank {
                continue;
            }
            match lanes.iter_mut().find(|l| (l.peer, l.send) == (peer, send)) {
                Some(lane) => lane.ops.push(i),
                None => lanes.push(Lane {
                    peer,
                    send,
                    ops: vec![i],
                    at: 0,
                    piece: 0,
                }),
            }
        }
        let peers: Vec<usize> = lanes.iter().map(|l| l.peer).collect();
        let _polling = Polling::new(&self.transport);
        let view = self.view;
        let (mut idle_since, mut asked, mut nap) = (None, Instant::now(), IDLE.1);
        let mut spins = 0;
        loop {
            self.transport.progress();
            let mut moved = false;
            for lane in lanes.iter_mut() {
                while lane.at < lane.ops.len() && self.lane_ready(lane) {
                    let at = lane.ops[lane.at];
                    let op = &mut ops[at];
                    let len = op.len();
                    let (seg, pieces) = Self::segments(len, None);
                    let r = piece(len, seg, lane.piece);
                    let (count, dtype) = parts.map_or((len, None), |p| p[at]);
                    let h = Header {
                        kind: "send/recv",
                        dtype,
                        op: None,
                        root: 0,
                        count,
                        seq: 0,
                        whole: false,
                    };
                    match op {
                        P2p::Send(buf, _) => self.put(1, lane.peer, &h, &buf[r])?,
                        P2p::Recv(buf, _) => {
                            let off = self.take(1, lane.peer, &h, r.len())?;
                            buf[r.clone()].copy_from_slice(view.bytes(off, r.len()));
                            self.release(1, lane.peer)?;
                        }
                    }
                    lane.piece += 1;
                    if lane.piece == pieces {
                        (lane.at, lane.piece) = (lane.at + 1, 0);
                    }
                    moved = true;
                }
            }
            let Some(lane) = lanes.iter().find(|l| l.at < l.ops.len()) else {
                return Ok(());
            };
            if moved {
                // The timeout bounds a wait without progress.
                self.deadline = None;
                (idle_since, nap, spins) = (None, IDLE.1, 0);
                continue;
            }
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            // Nothing can move: yield a while, then sleep between looks (a
            // rank waiting for a late peer must not burn its core), and
            // now and then ask whether the peers are still there.
            let now = Instant::now();
            if now - *idle_since.get_or_insert(now) < IDLE.0 {
                std::thread::yield_now();
                continue;
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(IDLE.2);
            if asked.elapsed() < IDLE.3 && self.deadline.is_some() {
                continue;
            }
            asked = Instant::now();
            let (signal, value) = match lane.send {
                true => self
                    .credit_needed(1, lane.peer)
                    .expect("a send that cannot move"),
                false => self.data_needed(1, lane.peer),
            };
            let lanes = &lanes;
            let what = || {
                let open: Vec<String> = lanes
                    .iter()
                    .filter(|l| l.at < l.ops.len())
                    .map(|l| match l.send {
                        true => format!("rank {} to free a staging slot", l.peer),
                        false => format!("rank {}'s next message", l.peer),
                    })
                    .collect();
                format!("{} (a group of sends and receives)", open.join(", "))
            };
            self.check_waiting(signal, value, &peers, what)?;
        }
    }

    /// Copies a group's sends to this rank into its receives from this
    /// rank, the first to the first; refuses counts, sizes or dtypes that
    /// differ.
    fn to_self(&self, ops: &mut [P2p<'_>], parts: Option<&[(usize, Option<DType>)]>) -> Result<()> {
        let me = self.rank;
        let sends: Vec<usize> = (0..ops.len())
            .filter(|&i| matches!(ops[i], P2p::Send(_, p) if p == me))
            .collect();
        let recvs: Vec<usize> = (0..ops.len())
            .filter(|&i| matches!(ops[i], P2p::Recv(_, p) if p == me))
            .collect();
        if sends.len() != recvs.len() {
            return Err(self.usage(format!(
                "a group sends this rank {} message(s) and receives {} from it; they pair in \
                 order, so the counts must match",
                sends.len(),
                recvs.len()
            )));
        }
        for (&s, &r) in sends.iter().zip(&recvs) {
            // The messages' sizes (of which these may be parts).
            let size = |i: usize| parts.map_or(ops[i].len(), |p| p[i].0);
            let (a, b) = (size(s), size(r));
            if a != b || ops[s].len() != ops[r].len() {
                return Err(self.usage(format!(
                    "a group's send to this rank (operation {s}) has {a} bytes but the receive \
                     it pairs with (operation {r}) has {b}"
                )));
            }
            let dtype = |i: usize| parts.and_then(|p| p[i].1);
            if let (Some(a), Some(b)) = (dtype(s), dtype(r))
                && a != b
            {
                return Err(self.usage(format!(
                    "a group's send to this rank (operation {s}) is {} but the receive it pairs \
                     with (operation {r}) is {}: the dtypes differ",
                    a.name(),
                    b.name()
                )));
            }
        }
        for (&s, &r) in sends.iter().zip(&recvs) {
            let (lo, hi) = ops.split_at_mut(s.max(r));
            let (send, recv) = match s < r {
                true => (&lo[s], &mut hi[0]),
                false => (&hi[0], &mut lo[r]),
            };
            if let (P2p::Send(from, _), P2p::Recv(to, _)) = (send, recv) {
                to.copy_from_slice(from);
            }
        }
        Ok(())
    }
    /// Whether `lane`'s next piece can move without waiting.
    fn lane_ready(&self, lane: &Lane) -> bool {
        match lane.send {
            true => self
                .credit_needed(1, lane.peer)
                .is_none_or(|(s, v)| self.reached(s, v)),
            false => {
                let (s, v) = self.data_needed(1, lane.peer);
                self.reached(s, v)
            }
        }
    }
}

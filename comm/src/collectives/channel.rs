//! The message layer under every operation: a sender writes a header and a
//! payload into its slot on the receiver and raises the receiver's data
//! signal for (class, sender); the receiver checks the header, reads the
//! payload in place and returns a credit that frees the slot.

use std::time::{Duration, Instant};

use super::{Communicator, DType, HDR, NSLOT, ReduceOp, SCRATCH, SLOT};
use crate::error::{CommError, Result};
use crate::transport::SignalId;

/// Payloads up to this size are copied next to their header and sent in one
/// write (unless the transport writes the two in place).
pub(super) const SMALL_WRITE: usize = 4096;

/// Operation names, in header-code order.
pub(crate) const KINDS: [&str; 8] = [
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "broadcast",
    "reduce",
    "all_to_all",
    "send/recv",
    "barrier",
];

/// What a message belongs to; compared by the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(super) kind: &'static str,
    pub(super) dtype: Option<DType>,
    pub(super) op: Option<ReduceOp>,
    pub(super) root: usize,
    pub(super) count: usize,
    pub(super) seq: u64,
    /// A whole-call check ([`Communicator::agree`]): a header-only message
    /// describing a call that runs as several collectives, not one of them.
    pub(super) whole: bool,
}

impl Header {
    pub(super) fn words(&self, len: usize) -> [u64; 4] {
        let kind = KINDS.iter().position(|k| *k == self.kind).unwrap_or(0) as u64 + 1;
        let w0 = kind
            | self.dtype.map_or(0, DType::code) << 8
            | self.op.map_or(0, ReduceOp::code) << 16
            | u64::from(self.whole) << 24
            | (self.root as u64) << 32;
        [w0, self.count as u64, self.seq, len as u64]
    }

    pub(crate) fn describe(w: &[u64; 4]) -> String {
        // A peer's header is whatever it wrote: code 0 or past the list is "?".
        let kind = ((w[0] & 0xff) as usize)
            .checked_sub(1)
            .and_then(|i| KINDS.get(i))
            .copied()
            .unwrap_or("?");
        let dtype = DType::ALL
            .into_iter()
            .find(|d| d.code() == (w[0] >> 8) & 0xff);
        let op = ReduceOp::ALL
            .into_iter()
            .find(|o| o.code() == (w[0] >> 16) & 0xff);
        if kind == "send/recv" {
            // Counted in bytes, with no root or call number; of a dtype
            // when the buffer has one (a device tensor).
            let of = dtype.map_or(String::new(), |d| format!(" of {}", d.name()));
            return format!("send/recv of {} bytes{of} ({}-byte message)", w[1], w[3]);
        }
        let mut s = format!(
            "{kind} of {} x {}",
            w[1],
            dtype.map_or("bytes", DType::name)
        );
        if let Some(op) = op {
            s += &format!(" ({})", op.name());
        }
        if (w[0] >> 24) & 1 == 1 {
            // A whole-call check: header only, describing the whole call.
            return format!(
                "{s}, root {}, call #{} (whole-call check)",
                w[0] >> 32,
                w[2]
            );
        }
        format!(
            "{s}, root {}, call #{}, {}-byte message",
            w[0] >> 32,
            w[2],
            w[3]
        )
    }

    /// The dtype code of header words `w` (0: none).
    fn dtype_code(w: &[u64; 4]) -> u64 {
        (w[0] >> 8) & 0xff
    }

    /// Whether a message whose header is `got` is the one a receiver
    /// expecting `want` waits for: the same words, or a send/recv whose
    /// only difference is that one side gave no dtype (a host buffer of
    /// bytes, which takes or gives any dtype).
    pub(super) fn matches(got: &[u64; 4], want: &[u64; 4]) -> bool {
        if got == want {
            return true;
        }
        let p2p = KINDS.iter().position(|k| *k == "send/recv").unwrap_or(0) as u64 + 1;
        let untyped = |w: &[u64; 4]| [w[0] & !(0xff << 8), w[1], w[2], w[3]];
        want[0] & 0xff == p2p
            && (Self::dtype_code(got) == 0 || Self::dtype_code(want) == 0)
            && untyped(got) == untyped(want)
    }

    /// What a send/recv's headers `theirs` (the sender's) and `mine` (this
    /// receiver's) say of their dtypes when both have one and they differ:
    /// a clause naming both.
    pub(super) fn dtypes_differ(theirs: &[u64; 4], mine: &[u64; 4]) -> Option<String> {
        let p2p = KINDS.iter().position(|k| *k == "send/recv").unwrap_or(0) as u64 + 1;
        let name = |w: &[u64; 4]| {
            DType::ALL
                .into_iter()
                .find(|d| d.code() == Self::dtype_code(w))
                .map_or("?", DType::name)
        };
        let (a, b) = (Self::dtype_code(theirs), Self::dtype_code(mine));
        (mine[0] & 0xff == p2p && theirs[0] & 0xff == p2p && a != 0 && b != 0 && a != b).then(
            || {
                format!(
                    "the dtypes differ ({} sent, {} received)",
                    name(theirs),
                    name(mine)
                )
            },
        )
    }
}

/// The peer a `PeerLost` names.
fn lost_peer(e: &CommError) -> usize {
    match e {
        CommError::PeerLost { peer, .. } => *peer,
        _ => usize::MAX,
    }
}

impl Communicator {
    /// Waits for this rank's `signal` to reach `value`. The operation's
    /// deadline is set (timeout from now) by its first wait that has to
    /// block, so an operation whose messages are already there never reads
    /// the clock.
    pub(super) fn wait(
        &mut self,
        signal: SignalId,
        value: u64,
        what: impl Fn() -> String,
    ) -> Result<()> {
        if self.transport.signal_value(signal) >= value {
            return Ok(());
        }
        let (op, timeout) = (self.op, self.timeout);
        let deadline = *self
            .deadline
            .get_or_insert_with(|| Instant::now() + timeout);
        let r = self.transport.wait(signal, value, deadline);
        r.map_err(|e| {
            let e = Self::restate(e, op, timeout, what);
            self.fail(e)
        })?;
        // A departure that arrived meanwhile may have left a message this
        // rank sent undelivered: found now, not at some later call.
        self.check_undelivered()
    }

    /// A transport's error as the operation `op` reports it.
    fn restate(
        e: CommError,
        op: &'static str,
        timeout: Duration,
        what: impl Fn() -> String,
    ) -> CommError {
        match e {
            CommError::Timeout { rank, .. } => CommError::Timeout {
                rank,
                op: op.into(),
                after: timeout,
                waiting_for: what(),
            },
            CommError::PeerLost {
                rank, peer, why, ..
            } => CommError::PeerLost {
                rank,
                op: op.into(),
                peer,
                why,
            },
            CommError::Io { rank, message, .. } => CommError::Io {
                rank,
                op: op.into(),
                message,
            },
            e => e,
        }
    }

    /// For a caller that polls several signals and sleeps itself: fails
    /// as [`Self::wait`] would if `peers` holds a peer the transport sees
    /// gone (a peer outside `peers` that left is no concern of the
    /// caller's), or once the operation's deadline (set by the first call)
    /// has passed with `signal` short of `value`. Returns at once.
    pub(super) fn check_waiting(
        &mut self,
        signal: SignalId,
        value: u64,
        peers: &[usize],
        what: impl Fn() -> String,
    ) -> Result<()> {
        let timeout = self.timeout;
        let deadline = *self
            .deadline
            .get_or_insert_with(|| Instant::now() + timeout);
        if Instant::now() >= deadline {
            return self.wait(signal, value, what);
        }
        match self.transport.wait(signal, value, Instant::now()) {
            Ok(()) | Err(CommError::Timeout { .. }) => Ok(()),
            Err(e @ CommError::PeerLost { .. })
                if !e.is_peer_failure() && !peers.contains(&lost_peer(&e)) =>
            {
                Ok(())
            }
            Err(e) => {
                let e = Self::restate(e, self.op, timeout, what);
                Err(self.fail(e))
            }
        }
    }

    /// The signal a `put` to `peer` on `class` waits on, and the value.
    pub(super) fn credit_needed(&self, class: usize, peer: usize) -> Option<(SignalId, u64)> {
        let m = self.sent[peer][class];
        (m >= NSLOT).then(|| (SignalId((128 + class * 64 + peer) as u32), m - NSLOT + 1))
    }

    /// The signal a `take` from `peer` on `class` waits on, and the value.
    pub(super) fn data_needed(&self, class: usize, peer: usize) -> (SignalId, u64) {
        let m = self.received[peer][class];
        (SignalId((class * 64 + peer) as u32), m + 1)
    }

    /// Whether `signal` has reached `value` (no wait).
    pub(super) fn reached(&self, signal: SignalId, value: u64) -> bool {
        self.transport.signal_value(signal) >= value
    }

    fn slot(&self, class: usize, sender: usize, index: u64) -> usize {
        ((class * self.world + sender) * NSLOT as usize + (index % NSLOT) as usize) * (HDR + SLOT)
    }

    /// Sends one message (at most [`SLOT`] bytes) to `peer`.
    pub(crate) fn put(
        &mut self,
        class: usize,
        peer: usize,
        h: &Header,
        payload: &[u8],
    ) -> Result<()> {
        let m = self.sent[peer][class];
        if m >= NSLOT {
            let credit = SignalId((128 + class * 64 + peer) as u32);
            self.wait(credit, m - NSLOT + 1, || {
                format!("rank {peer} to free a staging slot (message {m})")
            })?;
        }
        let off = self.slot(class, self.rank, m);
        let words = h.words(payload.len());
        let data = SignalId((class * 64 + self.rank) as u32);
        let mut head = [0u8; HDR];
        head.chunks_exact_mut(8)
            .zip(words)
            .for_each(|(b, w)| b.copy_from_slice(&w.to_ne_bytes()));
        if self.in_place {
            // Header and payload straight from where they are, one signal.
            let parts: [&[u8]; 2] = [&head, payload];
            let r = self
                .transport
                .write_parts(peer, self.region, off, &parts, data);
            r.map_err(|e| self.fail(e))?;
            self.sent[peer][class] = m + 1;
            return Ok(());
        }
        // Small messages go as one write (header and payload contiguous).
        let small = payload.len() <= SMALL_WRITE;
        let mut scratch = std::mem::take(&mut self.scratch);
        let r = if small {
            scratch[..HDR].copy_from_slice(&head);
            scratch[HDR..HDR + payload.len()].copy_from_slice(payload);
            let whole = &scratch[..HDR + payload.len()];
            self.transport.write(peer, self.region, off, whole, data)
        } else {
            let r = self
                .transport
                .write(peer, self.region, off, &head[..32], SCRATCH);
            r.and_then(|()| {
                self.transport
                    .write(peer, self.region, off + HDR, payload, data)
            })
        };
        self.scratch = scratch;
        r.map_err(|e| self.fail(e))?;
        self.sent[peer][class] = m + 1;
        Ok(())
    }

    /// Waits for the next message from `peer` and returns the offset of its
    /// payload (of `len` bytes) in the staging view; call [`Self::release`]
    /// when done with it.
    pub(crate) fn take(
        &mut self,
        class: usize,
        peer: usize,
        h: &Header,
        len: usize,
    ) -> Result<usize> {
        let off = self.next_message(class, peer, h.kind)?;
        let got = self.header_at(off);
        let want = h.words(len);
        if !Header::matches(&got, &want) {
            return Err(self.mismatch(h.kind, peer, &got, &want));
        }
        Ok(off + HDR)
    }

    /// Waits for the next message from `peer` on `class` and returns the
    /// offset of its header in the staging view (`kind` names the call in
    /// a timeout).
    fn next_message(&mut self, class: usize, peer: usize, kind: &'static str) -> Result<usize> {
        let m = self.received[peer][class];
        let data = SignalId((class * 64 + peer) as u32);
        self.wait(data, m + 1, || {
            format!("rank {peer}'s message #{m} for {kind}")
        })?;
        Ok(self.slot(class, peer, m))
    }

    /// Fails the communicator with [`CommError::Mismatch`]: `peer`'s call
    /// (header words `theirs`) is not this rank's (`mine`).
    pub(crate) fn mismatch(
        &mut self,
        kind: &'static str,
        peer: usize,
        theirs: &[u64; 4],
        mine: &[u64; 4],
    ) -> CommError {
        let mut message = format!(
            "rank {peer} called {}, this rank called {}",
            Header::describe(theirs),
            Header::describe(mine)
        );
        if let Some(dtypes) = Header::dtypes_differ(theirs, mine) {
            message = format!("{message}: {dtypes}");
        }
        self.fail(CommError::Mismatch {
            rank: self.rank,
            op: kind.into(),
            message,
        })
    }

    /// Waits for the next message from `peer` on `class` (as [`Self::take`],
    /// for `h`'s call) and returns its header words, whatever they are,
    /// releasing its slot: for [`Communicator::agree`], which compares the
    /// headers of every rank itself.
    pub(crate) fn take_header(
        &mut self,
        class: usize,
        peer: usize,
        h: &Header,
    ) -> Result<[u64; 4]> {
        let off = self.next_message(class, peer, h.kind)?;
        let got = self.header_at(off);
        self.release(class, peer)?;
        Ok(got)
    }

    /// Waits until `peer` has taken all but `pending` of the messages of
    /// `class` this rank sent it (`h`'s call, as a root that receives
    /// nothing from `peer`). A root that returned without waiting would let
    /// a collective whose ranks disagree on the root succeed on every rank,
    /// each keeping its own data: if `peer` sends this rank a message of
    /// `class` meanwhile, it is in another call, and the mismatch is
    /// reported at once with both calls described.
    pub(crate) fn await_taken(
        &mut self,
        class: usize,
        peer: usize,
        h: &Header,
        len: usize,
        pending: u64,
    ) -> Result<()> {
        let sent = self.sent[peer][class].saturating_sub(pending);
        let credit = SignalId((128 + class * 64 + peer) as u32);
        let data = SignalId((class * 64 + peer) as u32);
        let deadline = *self
            .deadline
            .get_or_insert_with(|| Instant::now() + self.timeout);
        let what = || format!("rank {peer} to take this rank's {}", h.kind);
        let mut lost = false;
        loop {
            if self.transport.signal_value(credit) >= sent {
                return Ok(());
            }
            let m = self.received[peer][class];
            // The peer releases before it sends again, so a credit that
            // came with its message is seen here.
            if self.transport.signal_value(data) > m {
                if self.transport.signal_value(credit) >= sent {
                    return Ok(());
                }
                let got = self.header_at(self.slot(class, peer, m));
                let message = format!(
                    "rank {peer} called {}, this rank called {} (as its root)",
                    Header::describe(&got),
                    Header::describe(&h.words(len))
                );
                return Err(self.fail(CommError::Mismatch {
                    rank: self.rank,
                    op: h.kind.into(),
                    message,
                }));
            }
            let slice = (Instant::now() + Duration::from_millis(10)).min(deadline);
            if slice >= deadline || lost {
                return self.wait(credit, sent, what);
            }
            match self.transport.wait(credit, sent, slice) {
                Ok(()) => return Ok(()),
                Err(CommError::Timeout { .. }) => {}
                // A peer that found the mismatch first may have left
                // already: look once more for its message before saying so.
                Err(_) => lost = true,
            }
        }
    }

    /// The header of the message in the slot at `off`.
    fn header_at(&self, off: usize) -> [u64; 4] {
        let mut words = [0u64; 4];
        let raw = self.view.bytes(off, 32).chunks_exact(8);
        words
            .iter_mut()
            .zip(raw)
            .for_each(|(w, b)| *w = u64::from_ne_bytes(b.try_into().expect("8 bytes")));
        words
    }

    /// Returns the slot of `peer`'s oldest unreleased message.
    pub(crate) fn release(&mut self, class: usize, peer: usize) -> Result<()> {
        self.received[peer][class] += 1;
        let credit = SignalId((128 + class * 64 + self.rank) as u32);
        self.transport
            .write(peer, self.region, 0, &[], credit)
            .map_err(|e| self.fail(e))
    }
}

//! The wire format of one-sided writes (a 32-byte header, then the payload)
//! and its reading end: an [`Inbox`] holds, per peer, the bytes read ahead
//! and the frame being received, so that whichever thread drives the
//! sockets (a waiting caller, a blocked sender or the progress thread) can
//! read with non-blocking `recv` calls and stop at any byte. Headers are
//! checked against the registered regions; small payloads come through a
//! read-ahead buffer (one `recv` can bring several frames), large ones are
//! read straight into the region; the signal is raised once the whole
//! payload is in place.

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use super::state::{MAX_SIGNALS, Shared};
use crate::error::MAX_ABORT_REASON;
use crate::transport::{MAX_FINALS, RegionId, SignalId};

const MAGIC: u32 = 0x5043_5457; // "PCTW"
/// The magic of the GOODBYE frame a transport sends every peer when it is
/// dropped: the rest of its header is zero and no payload follows.
const GOODBYE_MAGIC: u32 = 0x5043_5447; // "PCTG"
/// The magic of the ABORT frame a transport sends every peer when its
/// communicator fails: the header's last word is the length of the reason
/// (UTF-8, at most [`MAX_ABORT_REASON`] bytes) that follows, the rest zero.
const ABORT_MAGIC: u32 = 0x5043_5441; // "PCTA"
/// The magic of the FINALS frame a transport sends every peer when its
/// communicator leaves cleanly ([`crate::transport::Transport::leave`]):
/// bytes 8..16 hold its number of collective calls, the last word the
/// number of (signal, final value) pairs that follow (16 bytes each, at
/// most [`MAX_FINALS`]), the rest zero.
const FINALS_MAGIC: u32 = 0x5043_5446; // "PCTF"
pub(crate) const HEADER_LEN: usize = 32;
/// Size of each peer's read-ahead buffer.
const READ_BUFFER: usize = 64 << 10;
/// Payload remainders at least this large are read straight into the
/// region; smaller ones come through the read-ahead buffer (fewer calls).
const DIRECT: usize = 16 << 10;

/// The header of one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub region: u32,
    pub signal: u32,
    pub offset: u64,
    pub len: u64,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.region.to_le_bytes());
        b[8..12].copy_from_slice(&self.signal.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// The GOODBYE frame.
    pub fn goodbye() -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&GOODBYE_MAGIC.to_le_bytes());
        b
    }

    /// The header of an ABORT frame whose reason is `len` bytes (at most
    /// [`MAX_ABORT_REASON`]); the reason follows it.
    pub fn abort(len: usize) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&ABORT_MAGIC.to_le_bytes());
        b[24..32].copy_from_slice(&(len as u64).to_le_bytes());
        b
    }

    /// The FINALS frame (header and pairs) of a rank that made `calls`
    /// collective calls and leaves `finals` (at most [`MAX_FINALS`] are
    /// sent).
    pub fn finals(calls: u64, finals: &[(SignalId, u64)]) -> Vec<u8> {
        let finals = &finals[..finals.len().min(MAX_FINALS)];
        let mut b = vec![0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&FINALS_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&calls.to_le_bytes());
        b[24..32].copy_from_slice(&(finals.len() as u64).to_le_bytes());
        for (signal, value) in finals {
            b.extend_from_slice(&u64::from(signal.0).to_le_bytes());
            b.extend_from_slice(&value.to_le_bytes());
        }
        b
    }

    /// The frame a header starts.
    fn decode(b: &[u8]) -> Result<Frame, String> {
        let b: &[u8; HEADER_LEN] = b.try_into().map_err(|_| "short header".to_string())?;
        Self::decode_exact(b)
    }

    fn decode_exact(b: &[u8; HEADER_LEN]) -> Result<Frame, String> {
        let word = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let long = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if word(0) == GOODBYE_MAGIC && b[4..].iter().all(|&x| x == 0) {
            return Ok(Frame::Goodbye);
        }
        if word(0) == ABORT_MAGIC && b[4..24].iter().all(|&x| x == 0) {
            let len = long(24);
            if len > MAX_ABORT_REASON as u64 {
                return Err(format!(
                    "an abort reason of {len} bytes, more than {MAX_ABORT_REASON}"
                ));
            }
            return Ok(Frame::Abort { len: len as usize });
        }
        if word(0) == FINALS_MAGIC && b[4..8].iter().chain(&b[16..24]).all(|&x| x == 0) {
            let pairs = long(24);
            if pairs > MAX_FINALS as u64 {
                return Err(format!(
                    "a departure with {pairs} final counters, more than {MAX_FINALS}"
                ));
            }
            return Ok(Frame::Finals {
                calls: long(8),
                pairs: pairs as usize,
            });
        }
        if word(0) != MAGIC {
            return Err(format!("bad frame magic {:#x}", word(0)));
        }
        Ok(Frame::Write(Header {
            region: word(4),
            signal: word(8),
            offset: long(16),
            len: long(24),
        }))
    }
}

/// What a header starts.
enum Frame {
    Write(Header),
    /// The peer left cleanly.
    Goodbye,
    /// The peer's communicator failed; `len` bytes of reason follow.
    Abort {
        len: usize,
    },
    /// The peer's communicator left after `calls` collective calls;
    /// `pairs` (signal, final value) pairs of 16 bytes follow.
    Finals {
        calls: u64,
        pairs: usize,
    },
}

/// What one `recv` brought.
enum Got {
    Bytes(usize),
    /// Nothing available now.
    Empty,
    /// The peer closed its end.
    Eof,
    Failed(io::Error),
}

fn recv_into(fd: RawFd, ptr: *mut u8, len: usize) -> Got {
    loop {
        // SAFETY: `ptr..ptr + len` is writable memory the caller owns for
        // the duration of the call; the fd is an open socket.
        let n = unsafe { libc::recv(fd, ptr.cast(), len, libc::MSG_DONTWAIT) };
        if n > 0 {
            return Got::Bytes(n as usize);
        }
        if n == 0 {
            return Got::Eof;
        }
        let err = io::Error::last_os_error();
        match err.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Got::Empty,
            _ => return Got::Failed(err),
        }
    }
}

/// The payload of a frame being received.
struct Payload {
    /// Where the next byte goes.
    at: *mut u8,
    left: usize,
    signal: u32,
    len: u64,
}

/// The reading state of one connection.
struct PeerIn {
    fd: RawFd,
    /// False once the connection ended (or was closed for a violation).
    open: bool,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    payload: Option<Payload>,
    /// Set while a header names a region this rank has not registered yet:
    /// the connection is not read further until it is (or the timeout).
    stalled_since: Option<Instant>,
    /// Regions are never unregistered, so (len, base) pairs stay valid.
    regions: Vec<(usize, *mut u8)>,
}

/// The reading state of every connection; held (under a mutex) by the one
/// thread reading the sockets at a time.
pub(crate) struct Inbox {
    peers: Vec<Option<(usize, PeerIn)>>,
    /// Scratch for `poll`, reused.
    fds: Vec<libc::pollfd>,
}

// SAFETY: the raw pointers are into regions owned by the transport's shared
// state, which outlives the inbox; they are only dereferenced by the thread
// holding the inbox lock, under the transport contract (see `drain`).
unsafe impl Send for Inbox {}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Inbox({} peers)", self.peers.iter().flatten().count())
    }
}

/// What one progress step saw.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Progress {
    /// Bytes were read.
    pub read: bool,
    /// Some frame completed (a signal was raised).
    pub raised: bool,
}

impl Inbox {
    /// An inbox for the connections `fds[peer]` (`None` for this rank).
    pub fn new(fds: &[Option<RawFd>]) -> Inbox {
        let peers = fds
            .iter()
            .enumerate()
            .map(|(peer, fd)| {
                fd.map(|fd| {
                    (
                        peer,
                        PeerIn {
                            fd,
                            open: true,
                            buf: vec![0u8; READ_BUFFER].into_boxed_slice(),
                            start: 0,
                            end: 0,
                            payload: None,
                            stalled_since: None,
                            regions: Vec::new(),
                        },
                    )
                })
            })
            .collect();
        Inbox {
            peers,
            fds: Vec::new(),
        }
    }

    /// Reads whatever every connection has ready, without blocking.
    pub fn drain_all(&mut self, shared: &Shared) -> Progress {
        let mut total = Progress::default();
        for (peer, conn) in self.peers.iter_mut().flatten() {
            if conn.open {
                let p = conn.drain(shared, *peer);
                total.read |= p.read;
                total.raised |= p.raised;
            }
        }
        total
    }

    /// Reads what `peer`'s connection has ready, without blocking.
    pub fn drain_peer(&mut self, shared: &Shared, peer: usize) -> Progress {
        match self.peers.get_mut(peer) {
            Some(Some((_, conn))) if conn.open => conn.drain(shared, peer),
            _ => Progress::default(),
        }
    }

    /// Blocks in `poll` until a connection has data, `extra` (a socket,
    /// awaited for writing) is writable, the transport's eventfd is kicked,
    /// or `timeout`; returns whether `extra` is writable. The caller holds
    /// the inbox and counted itself in [`Shared::polling`].
    pub fn poll(&mut self, shared: &Shared, extra: Option<RawFd>, timeout: Duration) -> bool {
        self.fds.clear();
        self.fds.push(libc::pollfd {
            fd: shared.kick_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        if let Some(fd) = extra {
            self.fds.push(libc::pollfd {
                fd,
                events: libc::POLLOUT,
                revents: 0,
            });
        }
        for (_, conn) in self.peers.iter().flatten() {
            if conn.open && conn.stalled_since.is_none() {
                self.fds.push(libc::pollfd {
                    fd: conn.fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
        }
        // A stalled connection is retried every few milliseconds.
        let stalled = self
            .peers
            .iter()
            .flatten()
            .any(|(_, c)| c.open && c.stalled_since.is_some());
        let timeout = if stalled {
            timeout.min(Duration::from_millis(5))
        } else {
            timeout
        };
        poll_fds(&mut self.fds, timeout);
        if self.fds[0].revents != 0 {
            shared.clear_kick();
        }
        extra.is_some() && self.fds[1].revents != 0
    }

    /// The open, unstalled connections (for a poll without the inbox);
    /// returns whether an open connection is stalled (to be retried soon).
    pub fn poll_set(&self, out: &mut Vec<libc::pollfd>) -> bool {
        out.clear();
        let mut stalled = false;
        for (_, conn) in self.peers.iter().flatten() {
            if !conn.open {
                continue;
            }
            if conn.stalled_since.is_some() {
                stalled = true;
                continue;
            }
            out.push(libc::pollfd {
                fd: conn.fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        stalled
    }
}

/// `poll` on `fds` for at most `timeout` (EINTR is a wake-up like any other).
pub(crate) fn poll_fds(fds: &mut [libc::pollfd], timeout: Duration) {
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `fds` is a live, correctly sized array of pollfd.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
}

impl PeerIn {
    /// Reads frames until the socket has nothing more ready.
    ///
    /// SAFETY argument for the payload writes: a payload's range lies inside
    /// a live region (checked when its header is parsed; regions live as
    /// long as the shared state), and by the transport contract only this
    /// peer writes that range until it raises the signal, and the local
    /// rank does not read it before the signal.
    fn drain(&mut self, shared: &Shared, peer: usize) -> Progress {
        let mut progress = Progress::default();
        loop {
            if let Some(p) = &mut self.payload {
                let buffered = (self.end - self.start).min(p.left);
                if buffered > 0 {
                    // SAFETY: see above; the source is inside `buf`.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            self.buf.as_ptr().add(self.start),
                            p.at,
                            buffered,
                        );
                        p.at = p.at.add(buffered);
                    }
                    self.start += buffered;
                    p.left -= buffered;
                }
                if p.left == 0 {
                    let signal = p.signal;
                    self.payload = None;
                    shared.raise(SignalId(signal));
                    progress.raised = true;
                    continue;
                }
                let (direct, at, left, len) = (p.left >= DIRECT, p.at, p.left, p.len);
                let got = if direct {
                    recv_into(self.fd, at, left)
                } else {
                    self.fill()
                };
                match got {
                    Got::Bytes(n) => {
                        progress.read = true;
                        if let (true, Some(p)) = (direct, &mut self.payload) {
                            // SAFETY: `n <= left`, so `at` stays in range.
                            p.at = unsafe { p.at.add(n) };
                            p.left -= n;
                        }
                    }
                    Got::Empty => return progress,
                    Got::Eof | Got::Failed(_) => {
                        let why = match got {
                            Got::Failed(e) => e.to_string(),
                            _ => "connection closed".into(),
                        };
                        self.ended(
                            shared,
                            peer,
                            format!("connection failed in the middle of a {len}-byte write: {why}"),
                        );
                        return progress;
                    }
                }
                continue;
            }
            if self.end - self.start < HEADER_LEN {
                match self.fill() {
                    Got::Bytes(_) => {
                        progress.read = true;
                        continue;
                    }
                    Got::Empty => return progress,
                    Got::Eof => {
                        self.ended(shared, peer, "connection closed".into());
                        return progress;
                    }
                    Got::Failed(e) => {
                        self.ended(shared, peer, format!("receive failed: {e}"));
                        return progress;
                    }
                }
            }
            let raw = &self.buf[self.start..self.start + HEADER_LEN];
            let frame = Header::decode(raw);
            // A frame with a payload read through the read-ahead buffer
            // (which always has room for it, see `fill`): its length.
            let extra = match frame {
                Ok(Frame::Abort { len }) => len,
                Ok(Frame::Finals { pairs, .. }) => pairs * 16,
                _ => 0,
            };
            if extra > 0 && self.end - self.start < HEADER_LEN + extra {
                match self.fill() {
                    Got::Bytes(_) => progress.read = true,
                    Got::Empty => return progress,
                    Got::Eof => self.ended(shared, peer, "connection closed".into()),
                    Got::Failed(e) => {
                        self.ended(shared, peer, format!("receive failed: {e}"));
                    }
                }
                if !self.open {
                    return progress;
                }
                continue;
            }
            let header = match frame {
                Ok(Frame::Write(h)) => h,
                Ok(Frame::Finals { calls, pairs }) => {
                    let at = self.start + HEADER_LEN;
                    let long = |i: usize| {
                        u64::from_le_bytes(self.buf[i..i + 8].try_into().expect("8 bytes"))
                    };
                    let finals: Vec<(SignalId, u64)> = (0..pairs)
                        .filter_map(|k| {
                            let signal = u32::try_from(long(at + 16 * k)).ok()?;
                            Some((SignalId(signal), long(at + 16 * k + 8)))
                        })
                        .collect();
                    self.start = at + pairs * 16;
                    shared.peer_departing(peer, calls, finals);
                    continue;
                }
                Ok(Frame::Goodbye) => {
                    self.start += HEADER_LEN;
                    shared.peer_left(peer);
                    continue;
                }
                Ok(Frame::Abort { len }) => {
                    let at = self.start + HEADER_LEN;
                    let why = String::from_utf8_lossy(&self.buf[at..at + len]).into_owned();
                    self.start = at + len;
                    shared.peer_aborted(peer, why);
                    continue;
                }
                Err(message) => {
                    self.violation(shared, peer, message);
                    return progress;
                }
            };
            let id = header.region as usize;
            while self.regions.len() <= id {
                match shared.region(RegionId(self.regions.len() as u32)) {
                    Some(region) => self.regions.push(region),
                    None => break,
                }
            }
            if self.regions.len() <= id {
                // A peer may write to a region before this rank registers
                // it (registration is collective, the peer got there first).
                let since = *self.stalled_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= shared.timeout {
                    let message = format!(
                        "write to region {id}, which this rank has not registered (it has {})",
                        self.regions.len()
                    );
                    self.violation(shared, peer, message);
                }
                return progress;
            }
            self.stalled_since = None;
            let (len, base) = self.regions[id];
            let end = header.offset.checked_add(header.len);
            if end.is_none_or(|end| end > len as u64) {
                let message = format!(
                    "write of {} bytes at offset {} overflows region {id} of {len} bytes",
                    header.len, header.offset
                );
                self.violation(shared, peer, message);
                return progress;
            }
            if header.signal as usize >= MAX_SIGNALS {
                let message = format!("signal {} is not below {MAX_SIGNALS}", header.signal);
                self.violation(shared, peer, message);
                return progress;
            }
            self.start += HEADER_LEN;
            self.payload = Some(Payload {
                // SAFETY: `offset <= len` (checked above).
                at: unsafe { base.add(header.offset as usize) },
                left: header.len as usize,
                signal: header.signal,
                len: header.len,
            });
        }
    }

    /// Reads into the free end of the read-ahead buffer (moving what is
    /// left of it to the front first).
    fn fill(&mut self) -> Got {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.start > 0 && self.buf.len() - self.end < HEADER_LEN.max(self.buf.len() / 4) {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let room = self.buf.len() - self.end;
        // SAFETY: the range is inside `buf`.
        let got = recv_into(
            self.fd,
            unsafe { self.buf.as_mut_ptr().add(self.end) },
            room,
        );
        if let Got::Bytes(n) = got {
            self.end += n;
        }
        got
    }

    /// The connection ended: a clean exit after a goodbye, a loss otherwise.
    fn ended(&mut self, shared: &Shared, peer: usize, why: String) {
        self.open = false;
        if shared.has_left(peer) {
            // The peer said goodbye: whatever ends the connection now (its
            // FIN, or a reset because it did not read our last credits) is
            // part of a clean exit.
            return;
        }
        shared.fail_lost(peer, why);
        shared.peer_gone(peer);
    }

    fn violation(&mut self, shared: &Shared, peer: usize, message: String) {
        self.open = false;
        shared.fail_protocol(peer, message);
        shared.peer_gone(peer);
        // Close the connection so the peer fails too instead of writing on.
        // SAFETY: the fd is an open socket owned by the transport.
        unsafe { libc::shutdown(self.fd, libc::SHUT_RDWR) };
    }
}

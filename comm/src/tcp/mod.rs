//! The TCP transport: a full mesh of TCP connections (one per pair of ranks)
//! carrying framed one-sided writes. A write sends a header (region, offset,
//! length, signal) and then the payload straight from the caller's slice in
//! one `sendmsg`; tiny writes (credits, message headers: at most 64 bytes)
//! are queued and go out in front of the next frame to that peer.
//!
//! Progress without hand-offs: there is no receiver thread per peer. The
//! thread that waits reads the sockets itself (non-blocking `recv` straight
//! into the regions), spinning for [`TcpOptions::spin`] and then blocking in
//! `poll`, so a message costs no thread wake-up beyond the waiter's own. A
//! sender whose peer's buffers are full reads its own connections while it
//! waits for room, so two ranks writing to each other cannot deadlock. Only
//! one thread reads at a time (the inbox lock); other waiters sleep on a
//! condition variable until a signal is raised or the reader lets go. A
//! progress thread per transport covers the gaps: once no caller has driven
//! the sockets for 1 ms it sends queued writes and reads incoming frames,
//! and it parks while callers drive (idle, it sleeps in `poll` on the
//! connections and the eventfd that a deferred write, a failure or `close`
//! kicks, so an idle rank's thread wakes about ten times a second, not a
//! hundred: docs/communication.md). Before a wait blocks, it sends every
//! queued write. The first lost peer or protocol violation fails every
//! later `wait` and `write`; a send to a live peer that accepts nothing for
//! the transport's timeout fails with `Timeout`.
//!
//! Shutdown: a dropped transport first sends a GOODBYE frame to every peer
//! (bounded as an ABORT frame is, below).
//! A peer that said goodbye has left the job cleanly, which is not a
//! failure: it can no longer receive, so later writes to it return `Ok` and
//! are discarded (collectives only write to a departed peer when returning
//! the credits of their last call), and nothing more will come from it, so
//! a wait fails with `PeerLost` ("left the job") once it cannot be satisfied:
//! at once when every peer has left, otherwise at the deadline. A connection
//! that ends without a GOODBYE (a crash) is a lost peer, as above.
//!
//! Failure: a rank whose communicator fails sends every peer an ABORT frame
//! carrying its reason ([`Transport::abort`]), behind what it already
//! queued; whichever thread reads that connection (a waiter, a blocked
//! sender, the progress thread) records it as the transport's failure,
//! which wakes every waiter and fails it, and every later call, naming the
//! rank and its reason. The frames go to every peer at once (non-blocking
//! sends, one deadline of [`ANNOUNCE_WITHIN`] for all of them): a peer
//! whose connection has not taken its frame by then has it shut down
//! instead (it then sees a lost peer), so a failing rank never waits more
//! than that however many peers read nothing (it used to wait a second per
//! such peer, one after another).
//!
//! Leaving: a communicator dropped healthy (or one whose job begins its
//! exit) sends every peer a FINALS frame, the same way: its number of
//! collective calls and the final values of the peer's counters it raises
//! ([`Transport::leave`]). A peer's wait for more than a final value fails
//! at once naming it, as does its next collective (see
//! [`crate::collectives`]); waits its last writes satisfy go on.

#[doc(hidden)]
pub mod fuzzing;
mod mesh;
mod recv;
mod send;
mod state;

use std::net::{IpAddr, Ipv4Addr, Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{CommError, Result};
use crate::store::Store;
use crate::transport::{RegionId, SignalId, Transport};

use recv::Inbox;
use send::Outbox;
pub use state::MAX_SIGNALS;
use state::Shared;

/// How long no caller must have driven the sockets before the progress
/// thread reads them (and sends deferred writes) itself.
const IDLE: Duration = Duration::from_millis(1);
/// How long the progress thread blocks in `poll` at a time while a
/// connection is stalled (retried that often).
const BACKGROUND_POLL: Duration = Duration::from_millis(10);
/// How long it blocks otherwise: data, a deferred write, a failure or
/// `close` wakes it at once (the sockets and the eventfd are in the poll
/// set), so this only bounds how often an idle rank's progress thread
/// wakes for nothing. At 10 ms it woke 100 times a second all job long,
/// preempting the rank's compute thread on its core (stop 48 measured
/// what such wake-ups cost: docs/communication.md).
const QUIET_POLL: Duration = Duration::from_millis(100);
/// How long a waiter blocks in `poll` before re-checking its deadline.
const POLL_SLICE: Duration = Duration::from_millis(50);
/// How long an announcement (an ABORT, FINALS or GOODBYE frame to every
/// peer) may take in all: a peer whose connection has not taken its frame
/// by then has the connection shut down instead.
const ANNOUNCE_WITHIN: Duration = Duration::from_secs(1);

/// The local address this machine sends from to reach `host:port` (the
/// kernel's route; nothing is sent), or `None` when it has no route.
pub fn route_to(host: &str, port: u16) -> Option<IpAddr> {
    use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
    let target = (crate::env::bare_host(host), port.max(1))
        .to_socket_addrs()
        .ok()?
        .next()?;
    let any: SocketAddr = if target.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(any).ok()?;
    socket.connect(target).ok()?;
    Some(socket.local_addr().ok()?.ip())
}

/// Environment variable naming the address this rank listens on (and
/// publishes to its peers); when unset, 127.0.0.1, or in a job whose
/// `MASTER_ADDR` is not a loopback address the local address that reaches
/// it (see [`route_to`]).
pub const ADDR_ENV: &str = "POLYCHIP_COMM_ADDR";

/// How a [`TcpTransport`] is set up.
#[derive(Debug, Clone)]
pub struct TcpOptions {
    /// The address to listen on; peers connect to it, so it must be one they
    /// can reach (not 0.0.0.0).
    pub bind_addr: IpAddr,
    /// SO_SNDBUF / SO_RCVBUF for every connection; `None` leaves the kernel's
    /// autotuning alone.
    pub socket_buffer: Option<usize>,
    /// How long `wait` polls the sockets (yielding the core between polls)
    /// before blocking in `poll`.
    pub spin: Duration,
    /// Prefix of the store keys (keep distinct per job sharing one store).
    pub key_prefix: String,
    /// The job's secret and id, which the ranks prove to each other before
    /// a connection joins the mesh (see the `mesh` module's handshake);
    /// `None`: the job's own from the environment
    /// ([`JobAuth::from_env`](crate::auth::JobAuth::from_env)), as the
    /// rendezvous store reads them.
    pub auth: Option<crate::auth::JobAuth>,
}

impl Default for TcpOptions {
    fn default() -> TcpOptions {
        TcpOptions {
            bind_addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
            socket_buffer: Some(4 << 20),
            spin: Duration::from_micros(50),
            key_prefix: "polychip/tcp".into(),
            auth: None,
        }
    }
}

impl TcpOptions {
    /// The defaults, with the bind address from `POLYCHIP_COMM_ADDR` when set.
    pub fn from_env() -> Result<TcpOptions> {
        let mut options = TcpOptions::default();
        if let Some(addr) = crate::env::var(ADDR_ENV)? {
            options.bind_addr = addr.trim().parse().map_err(|e| {
                CommError::Environment(format!(
                    "{ADDR_ENV}={} is not an IP address: {e}",
                    crate::text::quoted(&addr)
                ))
            })?;
        }
        Ok(options)
    }
}

/// What the transport's callers and its progress thread share.
#[derive(Debug)]
pub(crate) struct Inner {
    pub shared: Shared,
    /// The reading state of every connection: whoever holds it reads.
    pub inbox: Mutex<Inbox>,
    /// Per peer (`None` for this rank).
    outboxes: Vec<Option<Mutex<Outbox>>>,
    /// The connections (kept open here; the inbox and outboxes use their fds).
    streams: Vec<Option<TcpStream>>,
    /// The progress thread's kernel thread id, once it runs (the tests
    /// count its wake-ups in /proc).
    #[cfg(test)]
    progress_tid: std::sync::atomic::AtomicI32,
}

impl Inner {
    fn inbox(&self) -> Option<MutexGuard<'_, Inbox>> {
        match self.inbox.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    fn outbox(&self, peer: usize) -> Option<MutexGuard<'_, Outbox>> {
        let out = self.outboxes[peer].as_ref()?;
        Some(out.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Sends `out`'s queue followed by `parts`; on failure, tells a peer
    /// that left (its frames are discarded: `Ok`) from a lost one (recorded,
    /// and returned as the error of `op`).
    fn send(&self, peer: usize, out: &mut Outbox, parts: &[&[u8]], op: &str) -> Result<()> {
        let shared = &self.shared;
        let queue = std::mem::take(&mut out.queue);
        let mut all: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
        all.push(&queue);
        all.extend_from_slice(parts);
        let sent = send::send_all(self, out.fd, &all);
        out.queue = queue;
        out.queue.clear();
        sent.or_else(|e| {
            if shared.has_left(peer) {
                return Ok(());
            }
            if e.kind() == std::io::ErrorKind::TimedOut {
                // A half-sent frame leaves the stream unusable: close it,
                // so that nothing more (an ABORT frame) is read as its rest.
                shared.fail_lost(peer, format!("send stalled: {e}"));
                shared.peer_gone(peer);
                // SAFETY: plain syscall on a socket the transport owns.
                unsafe { libc::shutdown(out.fd, libc::SHUT_RDWR) };
                return Err(CommError::Timeout {
                    rank: shared.rank,
                    op: format!("tcp {op}"),
                    after: shared.timeout,
                    waiting_for: format!("rank {peer} to accept data"),
                });
            }
            // The peer may have said goodbye and shut its socket down
            // before this rank read the GOODBYE.
            if self.left_after_send_failure(peer) {
                return Ok(());
            }
            shared.fail_lost(peer, format!("send failed: {e}"));
            Err(shared.failure_error(op).unwrap_or_else(|| shared.io(op, e)))
        })
    }

    /// Sends every deferred write (failures are recorded for later calls).
    fn flush_all(&self) {
        for peer in 0..self.outboxes.len() {
            if let Some(mut out) = self.outbox(peer)
                && !out.queue.is_empty()
            {
                let _ = self.send(peer, &mut out, &[], "write");
            }
        }
    }

    /// Sends every peer for which `frame` gives one its frame, behind
    /// what is queued for it, to all at once: non-blocking sends, reading
    /// this rank's connections meanwhile (a peer blocked sending to this
    /// rank reads nothing until it can), one deadline `within` for all. A
    /// peer whose connection has not taken the whole frame by then, or
    /// whose connection another thread holds that long, has it shut down
    /// (a half-sent frame leaves the stream unusable; the peer sees a lost
    /// peer). Returns how many were shut down.
    fn announce(&self, frame: &dyn Fn(usize) -> Option<Vec<u8>>, within: Duration) -> usize {
        struct Pending<'a> {
            peer: usize,
            guard: Option<MutexGuard<'a, Outbox>>,
            bytes: Vec<u8>,
            frame: Vec<u8>,
            at: usize,
        }
        let deadline = Instant::now() + within;
        let mut pending: Vec<Pending<'_>> = (0..self.outboxes.len())
            .filter(|&p| self.outboxes[p].is_some())
            .filter_map(|peer| {
                Some(Pending {
                    peer,
                    guard: None,
                    bytes: Vec::new(),
                    frame: frame(peer)?,
                    at: 0,
                })
            })
            .collect();
        let mut fds: Vec<libc::pollfd> = Vec::new();
        loop {
            for p in pending.iter_mut() {
                if p.guard.is_none() {
                    let Some(out) = self.outboxes[p.peer].as_ref() else {
                        continue;
                    };
                    let mut guard = match out.try_lock() {
                        Ok(guard) => guard,
                        Err(TryLockError::Poisoned(e)) => e.into_inner(),
                        Err(TryLockError::WouldBlock) => continue,
                    };
                    p.bytes = std::mem::take(&mut guard.queue);
                    p.bytes.extend_from_slice(&p.frame);
                    p.guard = Some(guard);
                }
                let Some(guard) = &p.guard else { continue };
                while p.at < p.bytes.len() {
                    let rest = &p.bytes[p.at..];
                    // SAFETY: `rest` is readable memory of `rest.len()`
                    // bytes; the fd is an open socket the transport owns.
                    let n = unsafe {
                        libc::send(
                            guard.fd,
                            rest.as_ptr().cast(),
                            rest.len(),
                            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                        )
                    };
                    if n > 0 {
                        p.at += n as usize;
                        continue;
                    }
                    let e = std::io::Error::last_os_error();
                    match e.kind() {
                        std::io::ErrorKind::Interrupted => continue,
                        std::io::ErrorKind::WouldBlock => break,
                        // A broken connection tells the peer itself.
                        _ => p.at = p.bytes.len(),
                    }
                }
            }
            pending.retain(|p| p.at < p.bytes.len() || p.guard.is_none());
            if pending.is_empty() {
                return 0;
            }
            let now = Instant::now();
            if now >= deadline {
                for p in &pending {
                    if let Some(stream) = &self.streams[p.peer] {
                        // SAFETY: plain syscall on a socket the transport owns.
                        unsafe { libc::shutdown(stream.as_raw_fd(), libc::SHUT_RDWR) };
                    }
                }
                return pending.len();
            }
            if let Some(mut inbox) = self.inbox() {
                inbox.drain_all(&self.shared);
            }
            fds.clear();
            fds.extend(pending.iter().filter_map(|p| {
                Some(libc::pollfd {
                    fd: p.guard.as_ref()?.fd,
                    events: libc::POLLOUT,
                    revents: 0,
                })
            }));
            let nap = (deadline - now).min(Duration::from_millis(2));
            if fds.is_empty() {
                std::thread::sleep(nap);
            } else {
                recv::poll_fds(&mut fds, nap);
            }
        }
    }

    /// After a failed send to `peer`: reads its connection (briefly) to
    /// tell a goodbye (the peer shut its socket after leaving) from a loss,
    /// and returns whether the peer left cleanly.
    fn left_after_send_failure(&self, peer: usize) -> bool {
        let shared = &self.shared;
        let deadline = Instant::now() + shared.timeout.min(Duration::from_secs(2));
        loop {
            if shared.has_left(peer) {
                return true;
            }
            if shared.is_gone(peer)
                || Instant::now() >= deadline
                || shared.closing.load(Ordering::Relaxed)
            {
                return false;
            }
            if let Some(mut inbox) = self.inbox() {
                inbox.drain_peer(shared, peer);
                continue;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// `wait`'s loop: reads the sockets itself (spinning for `spin`, then
    /// blocking in `poll`) unless another thread is reading them, in which
    /// case it sleeps until that thread raises a signal or lets go.
    fn drive(
        &self,
        signal: SignalId,
        counter: &AtomicU64,
        value: u64,
        deadline: Instant,
        spin: Duration,
    ) -> Result<()> {
        let shared = &self.shared;
        self.flush_all();
        let mut spin_until = Instant::now() + spin;
        loop {
            if counter.load(Ordering::Acquire) >= value {
                return Ok(());
            }
            if let Err(e) = shared.check("wait") {
                // Bytes that arrived before the loss still count.
                return match counter.load(Ordering::SeqCst) >= value {
                    true => Ok(()),
                    false => Err(e),
                };
            }
            // A peer's communicator left without raising it that far (its
            // earlier frames are all applied).
            if let Some(e) = shared.left_short(signal, value) {
                return match counter.load(Ordering::SeqCst) >= value {
                    true => Ok(()),
                    false => Err(e),
                };
            }
            let now = Instant::now();
            if let Some(e) = shared.departure_error(now >= deadline) {
                return Err(e);
            }
            if now >= deadline {
                return Err(CommError::Timeout {
                    rank: shared.rank,
                    op: "tcp wait".into(),
                    after: Duration::ZERO,
                    waiting_for: String::new(),
                });
            }
            let Some(mut inbox) = self.inbox() else {
                if now < spin_until {
                    std::thread::yield_now();
                } else {
                    let until = deadline.min(now + Duration::from_millis(2));
                    shared.block_briefly(counter, value, until);
                }
                continue;
            };
            let progress = inbox.drain_all(shared);
            if progress.read || counter.load(Ordering::Acquire) >= value {
                spin_until = Instant::now() + spin;
                continue;
            }
            if now < spin_until {
                drop(inbox);
                std::thread::yield_now();
                continue;
            }
            shared.polling(true);
            // Re-check after counting as a poller: a signal raised or a
            // failure recorded from now on kicks the poll.
            if counter.load(Ordering::SeqCst) < value && shared.check("wait").is_ok() {
                inbox.poll(shared, None, (deadline - now).min(POLL_SLICE));
            }
            shared.polling(false);
        }
    }
}

/// The progress thread: while no caller has driven the sockets for
/// [`IDLE`], it sends deferred writes and reads incoming frames, so peers
/// are never held up by a rank busy elsewhere; it parks while callers drive.
fn progress(inner: Arc<Inner>) {
    #[cfg(test)]
    {
        // SAFETY: plain syscall without arguments.
        let tid = unsafe { libc::gettid() };
        inner.progress_tid.store(tid, Ordering::Relaxed);
    }
    let shared = &inner.shared;
    let mut fds = Vec::new();
    while !shared.closing.load(Ordering::SeqCst) {
        if shared.active.load(Ordering::SeqCst) > 0 {
            // A caller reads and writes itself; the last to leave wakes
            // this thread (it used to nap 0.5-1 ms at a time meanwhile,
            // up to 2,000 wake-ups a second, on the core where a rank's
            // compute thread runs while its communication thread waits).
            shared.park_while_active(QUIET_POLL);
            continue;
        }
        let idle = shared.idle_for();
        if idle < IDLE {
            // At least half of IDLE.
            shared.nap((IDLE - idle).max(IDLE / 2));
            continue;
        }
        shared.take_deferred();
        inner.flush_all();
        let stalled = match inner.inbox() {
            Some(inbox) => inbox.poll_set(&mut fds),
            None => continue,
        };
        if shared.active.load(Ordering::SeqCst) > 0 {
            continue;
        }
        fds.push(libc::pollfd {
            fd: shared.kick_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        shared.polling(true);
        // Re-check after counting as a poller: a write deferred or a
        // transport closed from now on kicks the poll.
        if !shared.has_deferred() && !shared.closing.load(Ordering::SeqCst) {
            let wait = if stalled { BACKGROUND_POLL } else { QUIET_POLL };
            recv::poll_fds(&mut fds, wait);
        }
        shared.polling(false);
        if fds.last().is_some_and(|k| k.revents != 0) {
            shared.clear_kick();
        }
        if shared.has_deferred() {
            // Let a burst of tiny writes gather for IDLE, then flush them
            // at the loop's top.
            shared.nap(IDLE);
            continue;
        }
        if shared.active.load(Ordering::SeqCst) > 0 {
            continue;
        }
        if let Some(mut inbox) = inner.inbox() {
            inbox.drain_all(shared);
        }
    }
}

/// A one-sided [`Transport`] over TCP: a full mesh, one connection per pair.
#[derive(Debug)]
pub struct TcpTransport {
    inner: Arc<Inner>,
    progress: Option<JoinHandle<()>>,
    spin: Duration,
    /// The address it listens on (and published).
    bind_addr: IpAddr,
    /// The secret its peers proved they hold (groups split from it use it).
    auth: Option<crate::auth::JobAuth>,
    /// Whether `Drop` says goodbye (cleared only by `abort_for_test`).
    goodbye: bool,
}

impl TcpTransport {
    /// Builds the mesh with [`TcpOptions::from_env`]: every rank of the job
    /// calls this with the same store, `world_size` and `timeout`.
    pub fn new(
        store: Arc<dyn Store>,
        rank: usize,
        world_size: usize,
        timeout: Duration,
    ) -> Result<TcpTransport> {
        TcpTransport::with_options(store, rank, world_size, timeout, TcpOptions::from_env()?)
    }

    /// Builds the mesh: listens, publishes `host:port` in the store, connects
    /// to every lower rank and accepts every higher one, all within `timeout`.
    /// A connection joins only once both ends proved they hold the job's
    /// secret ([`TcpOptions::auth`]); others are dropped, each within 5 s,
    /// without holding up the rest.
    pub fn with_options(
        store: Arc<dyn Store>,
        rank: usize,
        world_size: usize,
        timeout: Duration,
        options: TcpOptions,
    ) -> Result<TcpTransport> {
        if world_size == 0 || rank >= world_size {
            return Err(CommError::Usage(format!(
                "tcp: rank {rank} is not in a world of {world_size}"
            )));
        }
        let mut options = options;
        if options.auth.is_none() {
            options.auth = Some(mesh::job_auth(&options, rank)?);
        }
        let streams = mesh::connect(store.as_ref(), rank, world_size, timeout, &options)?;
        let shared = Shared::new(rank, world_size, timeout).map_err(|e| CommError::Io {
            rank,
            op: "tcp setup".into(),
            message: format!("eventfd: {e}"),
        })?;
        let fds: Vec<_> = streams
            .iter()
            .map(|s| s.as_ref().map(|s| s.as_raw_fd()))
            .collect();
        let outboxes = fds
            .iter()
            .map(|fd| {
                fd.map(|fd| {
                    Mutex::new(Outbox {
                        fd,
                        queue: Vec::new(),
                    })
                })
            })
            .collect();
        let inner = Arc::new(Inner {
            shared,
            inbox: Mutex::new(Inbox::new(&fds)),
            outboxes,
            streams,
            #[cfg(test)]
            progress_tid: std::sync::atomic::AtomicI32::new(0),
        });
        let progress = if world_size > 1 {
            let thread_inner = Arc::clone(&inner);
            let handle = std::thread::Builder::new()
                .name(format!("tcp-progress-{rank}"))
                .spawn(move || progress(thread_inner))
                .map_err(|e| inner.shared.io("spawn progress thread", e))?;
            Some(handle)
        } else {
            None
        };
        Ok(TcpTransport {
            inner,
            progress,
            spin: options.spin,
            bind_addr: options.bind_addr,
            auth: options.auth,
            goodbye: true,
        })
    }

    /// Drops the transport like a crash would: the sockets are shut down
    /// without a GOODBYE, so peers see a lost peer. For tests.
    #[doc(hidden)]
    pub fn abort_for_test(mut self) {
        self.goodbye = false;
        drop(self);
    }
}

impl Transport for TcpTransport {
    fn rank(&self) -> usize {
        self.inner.shared.rank
    }

    fn world_size(&self) -> usize {
        self.inner.shared.world_size
    }

    fn name(&self) -> &'static str {
        "tcp"
    }

    fn listen_addr(&self) -> Option<IpAddr> {
        Some(self.bind_addr)
    }

    fn job_auth(&self) -> Option<crate::auth::JobAuth> {
        self.auth.clone()
    }

    fn register(&self, len: usize) -> Result<(RegionId, *mut u8)> {
        self.inner.shared.register(len)
    }

    fn write(
        &self,
        peer: usize,
        region: RegionId,
        offset: usize,
        data: &[u8],
        signal: SignalId,
    ) -> Result<()> {
        let inner = &*self.inner;
        let shared = &inner.shared;
        if peer >= shared.world_size {
            return Err(CommError::Usage(format!(
                "tcp write: peer {peer} is not in a world of {}",
                shared.world_size
            )));
        }
        if signal.0 as usize >= MAX_SIGNALS {
            return Err(CommError::Usage(format!(
                "tcp write: signal {} is not below {MAX_SIGNALS}",
                signal.0
            )));
        }
        let (len, base) = shared.region(region).ok_or_else(|| {
            CommError::Usage(format!("tcp write: region {} is not registered", region.0))
        })?;
        if offset.checked_add(data.len()).is_none_or(|end| end > len) {
            return Err(CommError::Usage(format!(
                "tcp write: {} bytes at offset {offset} overflow region {} of {len} bytes",
                data.len(),
                region.0
            )));
        }
        shared.check("write")?;
        if shared.has_left(peer) {
            // A peer that left can no longer receive: discard.
            return Ok(());
        }
        let Some(mut out) = inner.outbox(peer) else {
            // SAFETY: the range is inside this rank's copy (checked above),
            // and by the transport contract nobody else touches it until
            // `signal` is raised.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), base.add(offset), data.len()) };
            shared.raise(signal);
            return Ok(());
        };
        let header = recv::Header {
            region: region.0,
            signal: signal.0,
            offset: offset as u64,
            len: data.len() as u64,
        }
        .encode();
        if data.len() <= send::DEFER_MAX {
            // Tiny writes (credits, message headers) wait for the next
            // frame to this peer, this rank's next wait, or the progress
            // thread, unless a waiter is already blocked (it may be waiting
            // for the answer to this very write).
            out.queue.extend_from_slice(&header);
            out.queue.extend_from_slice(data);
            if out.queue.len() < send::QUEUE_MAX && shared.active.load(Ordering::SeqCst) == 0 {
                drop(out);
                shared.note_deferred();
                return Ok(());
            }
            return inner.send(peer, &mut out, &[], "write");
        }
        inner.send(peer, &mut out, &[&header, data], "write")
    }

    fn wait(&self, signal: SignalId, value: u64, deadline: Instant) -> Result<()> {
        let shared = &self.inner.shared;
        let counter = shared.counter(signal).ok_or_else(|| {
            CommError::Usage(format!(
                "tcp wait: signal {} is not below {MAX_SIGNALS}",
                signal.0
            ))
        })?;
        if counter.load(Ordering::Acquire) >= value {
            return Ok(());
        }
        let start = Instant::now();
        shared.enter();
        let result = self
            .inner
            .drive(signal, counter, value, deadline, self.spin);
        shared.leave();
        result.map_err(|e| match e {
            CommError::Timeout { rank, op, .. } => CommError::Timeout {
                rank,
                op,
                after: start.elapsed(),
                waiting_for: format!(
                    "signal {} to reach {value} (it is at {})",
                    signal.0,
                    counter.load(Ordering::Acquire)
                ),
            },
            other => other,
        })
    }

    fn signal_value(&self, signal: SignalId) -> u64 {
        self.inner
            .shared
            .counter(signal)
            .map_or(0, |c| c.load(Ordering::Acquire))
    }

    fn polling(&self, on: bool) {
        // A caller driving the sockets: writes go out at once, and the
        // progress thread parks.
        match on {
            true => self.inner.shared.enter(),
            false => self.inner.shared.leave(),
        }
    }

    fn progress(&self) {
        let inner = &*self.inner;
        inner.flush_all();
        if let Some(mut inbox) = inner.inbox() {
            inbox.drain_all(&inner.shared);
        }
    }

    fn abort(&self, why: &str) {
        let inner = &*self.inner;
        let shared = &inner.shared;
        if shared.aborted.swap(true, Ordering::SeqCst) {
            return;
        }
        let why = crate::error::abort_reason(why).as_bytes();
        let mut frame = recv::Header::abort(why.len()).to_vec();
        frame.extend_from_slice(why);
        // Behind the writes already queued, so the peer reads the frames
        // before it in order; a peer that takes nothing in time sees its
        // connection closed instead.
        let frame =
            |peer: usize| (!shared.has_left(peer) && !shared.is_gone(peer)).then(|| frame.clone());
        let stuck = inner.announce(&frame, ANNOUNCE_WITHIN);
        if stuck > 0 {
            log::debug!(
                "tcp rank {}: {stuck} peer(s) took no failure notice in time: connections closed",
                shared.rank
            );
        }
    }

    fn leave(&self, note: &dyn Fn(usize) -> crate::transport::Departure) {
        let inner = &*self.inner;
        let shared = &inner.shared;
        if shared.leaving.swap(true, Ordering::SeqCst) || shared.aborted.load(Ordering::SeqCst) {
            return;
        }
        let frame = |peer: usize| {
            if shared.has_left(peer) || shared.is_gone(peer) {
                return None;
            }
            let d = note(peer);
            Some(recv::Header::finals(d.calls, &d.finals))
        };
        inner.announce(&frame, ANNOUNCE_WITHIN);
    }

    fn departures(&self) -> usize {
        self.inner.shared.leavers()
    }

    fn departed(&self, peer: usize) -> Option<u64> {
        self.inner.shared.departed(peer)
    }

    fn finals(&self, peer: usize) -> Vec<(SignalId, u64)> {
        self.inner.shared.finals_of(peer)
    }

    fn peer_failure(&self) -> Option<CommError> {
        self.inner.shared.announced_failure("wait")
    }

    fn peer_lost(&self) -> Option<CommError> {
        // What has arrived first: a caller that found the store gone asks
        // why, and the ABORT frame sent before may still be unread.
        if let Some(mut inbox) = self.inner.inbox() {
            inbox.drain_all(&self.inner.shared);
        }
        self.inner.shared.check("wait").err()
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        let inner = &*self.inner;
        inner.shared.close();
        if let Some(handle) = self.progress.take() {
            let _ = handle.join();
        }
        if self.goodbye {
            // Best effort, bounded: a peer that is already gone needs no
            // goodbye.
            let shared = &inner.shared;
            let frame = |peer: usize| {
                (!shared.has_left(peer) && !shared.is_gone(peer))
                    .then(|| recv::Header::goodbye().to_vec())
            };
            inner.announce(&frame, ANNOUNCE_WITHIN);
        }
        for peer in 0..inner.outboxes.len() {
            if let Some(mut out) = inner.outbox(peer) {
                out.queue.clear();
            }
            if let Some(stream) = &inner.streams[peer] {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    /// Fills `t`'s connection to `peer` (which reads nothing) until it
    /// takes no more without blocking: writes to a region the peer never
    /// registered, so its reader stops at the first one.
    fn stuff(t: &TcpTransport, peer: usize) -> usize {
        let out = t.inner.outbox(peer).expect("a connection");
        let mut frame = recv::Header {
            region: 0,
            signal: 0,
            offset: 0,
            len: 1 << 20,
        }
        .encode()
        .to_vec();
        frame.resize(1 << 20, 0);
        let mut sent = 0;
        loop {
            // SAFETY: `frame` is readable for its length; the fd is an open
            // socket of the transport.
            let n = unsafe {
                libc::send(
                    out.fd,
                    frame.as_ptr().cast(),
                    frame.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n <= 0 {
                return sent;
            }
            sent += n as usize;
        }
    }

    /// Rank 0 announces its failure while `STUCK` peers read nothing (their
    /// connections full) and the last peer reads: the announcement takes
    /// about a second in all, not a second per stuck peer (it took
    /// `STUCK` seconds, peer after peer), and the reading peer learns of
    /// the failure at once, not after the stuck ones.
    #[test]
    fn an_announcement_is_bounded_however_many_peers_read_nothing() {
        const STUCK: usize = 6;
        let world = STUCK + 2;
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let timeout = Duration::from_secs(60);
        let options = TcpOptions {
            socket_buffer: Some(256 << 10),
            ..TcpOptions::default()
        };
        let ts: Vec<Arc<TcpTransport>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..world)
                .map(|r| {
                    let (store, options) = (store.clone(), options.clone());
                    s.spawn(move || {
                        TcpTransport::with_options(store, r, world, timeout, options).unwrap()
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| Arc::new(h.join().unwrap()))
                .collect()
        });
        ts[0].register(1 << 20).unwrap();
        // Until the peers' readers have stopped (each reads ahead a while).
        let mut quiet = 0;
        while quiet < 3 {
            let sent: usize = (1..=STUCK).map(|peer| stuff(&ts[0], peer)).sum();
            quiet = if sent == 0 { quiet + 1 } else { 0 };
            std::thread::sleep(Duration::from_millis(100));
        }
        let reader = ts[world - 1].clone();
        let start = Instant::now();
        let heard = std::thread::spawn(move || {
            let e = reader
                .wait(SignalId(7), 1, Instant::now() + Duration::from_secs(30))
                .unwrap_err();
            (e, start.elapsed())
        });
        ts[0].abort("rank 0: it gave up");
        let took = start.elapsed();
        let (e, heard_after) = heard.join().unwrap();
        eprintln!("announced in {took:?}; the reading peer heard after {heard_after:?}: {e}");
        assert!(
            e.to_string().contains("it failed: rank 0: it gave up"),
            "{e}"
        );
        // About 1 s; it took STUCK (6) s. Generous: the machine is loaded.
        assert!(
            took < Duration::from_secs(3),
            "the announcement took {took:?}"
        );
        assert!(took >= ANNOUNCE_WITHIN / 2, "no peer was stuck: {took:?}");
        assert!(
            heard_after < Duration::from_millis(900),
            "the reading peer heard after {heard_after:?}"
        );
        let start = Instant::now();
        drop(ts);
        eprintln!("dropped in {:?}", start.elapsed());
    }
    /// A job of two ranks in this process, each with `len` bytes registered.
    fn pair(len: usize) -> Vec<TcpTransport> {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let ts: Vec<TcpTransport> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    let store = store.clone();
                    s.spawn(move || {
                        let timeout = Duration::from_secs(30);
                        TcpTransport::with_options(store, r, 2, timeout, TcpOptions::default())
                            .unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for t in &ts {
            t.register(len).unwrap();
        }
        ts
    }

    /// The voluntary context switches of `t`'s progress thread (from
    /// /proc), or `None` where /proc does not say.
    fn switches_of(t: &TcpTransport) -> Option<u64> {
        let tid = t.inner.progress_tid.load(Ordering::Relaxed);
        let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
    }

    /// An idle rank's progress thread, and one whose caller waits a long
    /// time, wake a few times a second, not 100 (the 10 ms poll until
    /// stop 49) or up to 2,000 (its 0.5-1 ms naps while a caller waited):
    /// each wake-up preempts whatever computes on the rank's core.
    #[test]
    fn the_progress_thread_sleeps_while_nothing_happens() {
        let ts = pair(256);
        std::thread::sleep(Duration::from_millis(300));
        let Some(before) = switches_of(&ts[0]) else {
            eprintln!("skipped: /proc does not show the threads' context switches");
            return;
        };
        std::thread::sleep(Duration::from_secs(1));
        let idle = switches_of(&ts[0]).unwrap() - before;
        // Rank 0 waits 1 s for a signal rank 1 raises at its end.
        let before = switches_of(&ts[0]).unwrap();
        let waiter = std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                ts[0]
                    .wait(SignalId(3), 1, Instant::now() + Duration::from_secs(20))
                    .unwrap();
                switches_of(&ts[0]).unwrap()
            });
            std::thread::sleep(Duration::from_secs(1));
            ts[1]
                .write(0, RegionId(0), 0, &[0; 256], SignalId(3))
                .unwrap();
            waiter.join().unwrap()
        }) - before;
        eprintln!(
            "progress thread: {idle} wake-ups idle for 1 s, {waiter} while a caller waited 1 s"
        );
        // 10 a second at most by design; before, 100 and 1,000-2,000.
        assert!(idle <= 30, "{idle} wake-ups in 1 s idle");
        assert!(waiter <= 30, "{waiter} wake-ups in 1 s of a caller waiting");
    }

    /// A tiny write that the writer defers (it then computes instead of
    /// waiting) still reaches its peer within milliseconds: the progress
    /// thread is woken for it, not left in its 100 ms poll.
    #[test]
    fn a_deferred_write_goes_out_without_waiting_for_the_idle_poll() {
        let ts = pair(64);
        let mut took = Vec::new();
        for i in 1..=7u64 {
            // Let rank 0's progress thread settle into its idle poll.
            std::thread::sleep(Duration::from_millis(150));
            let start = Instant::now();
            std::thread::scope(|s| {
                let reader = s.spawn(|| {
                    ts[1]
                        .wait(SignalId(5), i, Instant::now() + Duration::from_secs(20))
                        .unwrap();
                    start.elapsed()
                });
                std::thread::sleep(Duration::from_millis(5));
                // At most DEFER_MAX bytes: queued, not sent.
                ts[0]
                    .write(1, RegionId(0), 0, &[1; 8], SignalId(5))
                    .unwrap();
                took.push(reader.join().unwrap() - Duration::from_millis(5));
            });
        }
        took.sort();
        eprintln!("deferred writes arrived after {took:?}");
        // About IDLE (1 ms) each; up to the idle poll (100 ms) if the
        // progress thread were not woken.
        assert!(took[3] < Duration::from_millis(40), "median {:?}", took[3]);
    }
}

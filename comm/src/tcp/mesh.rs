//! Building the TCP mesh: each rank listens on an ephemeral port, publishes
//! `host:port` in the store under a key scoped by a per-job generation
//! number, connects to every lower rank and accepts every higher one.
//!
//! A connection takes a rank's place only once both ends proved they hold
//! the job's secret: the port is open to whoever can reach this machine, and
//! the generation is a counter anyone can guess. The handshake is a mutual
//! challenge-response over HMAC-SHA256 under the job's [`JobAuth`] (the
//! secret the rendezvous store checks; it never crosses the wire), all
//! integers little endian:
//!
//! 1. both ends send a hello: magic, rank (u32), world size (u64),
//!    generation (i64) and a fresh 16-byte nonce; the acceptor as soon as it
//!    accepts, the connector as soon as it is connected;
//! 2. the connector checks that the hello is from the rank it meant to reach
//!    in this mesh, and sends `HMAC(secret, "polychip tcp mesh: connector",
//!    job id, generation, world size, its rank, the acceptor's rank, its
//!    nonce, the acceptor's nonce)`;
//! 3. the acceptor checks the connector's hello (a higher rank of this mesh,
//!    not yet connected) and its tag, and answers with `HMAC(secret,
//!    "polychip tcp mesh: acceptor", job id, generation, world size, its
//!    rank, the connector's rank, its nonce, the connector's nonce)`, which
//!    the connector checks.
//!
//! A connection that fails a check, or has not finished within
//! [`HELLO_LIMIT`] of being accepted (never past the mesh's deadline), is
//! dropped and logged, and the rank's place stays open for the real rank.
//! The acceptor handles its unfinished connections together (non-blocking,
//! in one `poll` loop), at most [`MAX_PENDING`] at once: a stalled stranger
//! delays nobody, and when the table is full its oldest entry is dropped
//! once it is [`EVICT_AGE`] old. A connector whose connection is closed
//! before the handshake ends (dropped to make room) connects again.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::TcpOptions;
use crate::auth::JobAuth;
use crate::error::{CommError, Result};
use crate::store::Store;

const HELLO_MAGIC: u32 = 0x3248_4350; // "PCH2": the authenticated hello
/// Bytes of a handshake nonce.
const NONCE: usize = 16;
/// A hello: magic, rank, world size, generation, nonce.
const HELLO_LEN: usize = 24 + NONCE;
/// An HMAC-SHA256 tag.
const TAG_LEN: usize = 32;
/// How long an accepted connection has to finish its handshake.
pub(crate) const HELLO_LIMIT: Duration = Duration::from_secs(5);
/// Most connections the acceptor handshakes with at once.
pub(crate) const MAX_PENDING: usize = 64;
/// How old the oldest unfinished connection must be before a new one
/// replaces it when [`MAX_PENDING`] are open.
pub(crate) const EVICT_AGE: Duration = Duration::from_millis(250);

const CONNECTOR: &[u8] = b"polychip tcp mesh: connector";
const ACCEPTOR: &[u8] = b"polychip tcp mesh: acceptor";

fn hello(rank: usize, world_size: usize, generation: i64, nonce: &[u8]) -> [u8; HELLO_LEN] {
    let mut b = [0u8; HELLO_LEN];
    b[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&(rank as u32).to_le_bytes());
    b[8..16].copy_from_slice(&(world_size as u64).to_le_bytes());
    b[16..24].copy_from_slice(&generation.to_le_bytes());
    b[24..].copy_from_slice(nonce);
    b
}

/// Checks a hello and returns the sender's rank and nonce.
fn parse_hello(
    b: &[u8],
    world_size: usize,
    generation: i64,
) -> std::result::Result<(usize, [u8; NONCE]), String> {
    let magic = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
    let rank = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")) as usize;
    let world = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
    let generation_seen = i64::from_le_bytes(b[16..24].try_into().expect("8 bytes"));
    if magic != HELLO_MAGIC {
        return Err(format!(
            "not a polychip tcp hello of this version (magic {magic:#x})"
        ));
    }
    if world != world_size as u64 || generation_seen != generation || rank >= world_size {
        return Err(format!(
            "hello from rank {rank} of {world} (generation {generation_seen}) does not match this mesh of {world_size} (generation {generation})"
        ));
    }
    Ok((rank, b[24..HELLO_LEN].try_into().expect("a nonce")))
}

/// The tag `from` sends `to` (`role` says which end it is): every field
/// that names this connection, under the job's secret.
fn tag_parts<'a>(
    role: &'a [u8],
    auth: &'a JobAuth,
    numbers: &'a [[u8; 8]; 4],
    from_nonce: &'a [u8],
    to_nonce: &'a [u8],
) -> [&'a [u8]; 8] {
    [
        role,
        auth.job_id.as_bytes(),
        &numbers[0],
        &numbers[1],
        &numbers[2],
        &numbers[3],
        from_nonce,
        to_nonce,
    ]
}

/// Generation, world size, the sender's rank and the receiver's, as bytes.
fn numbers(generation: i64, world_size: usize, from: usize, to: usize) -> [[u8; 8]; 4] {
    [
        generation.to_le_bytes(),
        (world_size as u64).to_le_bytes(),
        (from as u64).to_le_bytes(),
        (to as u64).to_le_bytes(),
    ]
}

fn set_buffers(stream: &TcpStream, size: Option<usize>) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let Some(size) = size else { return Ok(()) };
    let value = libc::c_int::try_from(size).unwrap_or(libc::c_int::MAX);
    for option in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        // SAFETY: the fd is an open socket; `value` is a live c_int whose
        // size is passed as the option length.
        let rc = unsafe {
            libc::setsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                (&raw const value).cast::<libc::c_void>(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// The job's secret and id the ranks prove to each other: the options'
/// own, else the job's from the environment ([`JobAuth::from_env`], as the
/// rendezvous store reads them).
pub(crate) fn job_auth(options: &TcpOptions, rank: usize) -> Result<JobAuth> {
    if let Some(auth) = &options.auth {
        return Ok(auth.clone());
    }
    let info = crate::env::from_env().unwrap_or_else(|_| crate::env::RankInfo::single());
    JobAuth::from_env(&info).map_err(|e| match e {
        CommError::Usage(m) => CommError::Usage(format!("rank {rank}: tcp: {m}")),
        e => e,
    })
}

/// Why a connector's handshake failed.
enum Failed {
    /// The acceptor closed the connection before the handshake ended (it
    /// may have dropped it to make room): worth connecting again.
    Closed(String),
    /// Final.
    Fatal(String),
}

/// What every handshake of this rank shares.
struct Mesh<'a> {
    auth: &'a JobAuth,
    rank: usize,
    world_size: usize,
    generation: i64,
}

impl Mesh<'_> {
    /// The connector's half of the handshake with `peer` on `stream`.
    fn connect_handshake(
        &self,
        stream: &TcpStream,
        peer: usize,
        addr: SocketAddr,
        deadline: Instant,
    ) -> std::result::Result<(), Failed> {
        let io_failed = |what: &str, e: io::Error| match e.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => Failed::Closed(format!(
                "{what} {addr}: {e}: rank {peer} closed the connection during the handshake: it \
                 did not accept this rank's proof (do both ranks hold the same job secret, {}?) \
                 or dropped the connection to make room",
                crate::auth::SECRET_VAR
            )),
            _ => Failed::Fatal(format!("{what} {addr}: {e}")),
        };
        stream
            .set_read_timeout(Some(remaining(deadline)))
            .map_err(|e| io_failed("setting up", e))?;
        let nonce = crate::auth::random_bytes(NONCE).map_err(|e| Failed::Fatal(e.to_string()))?;
        let mut s = stream;
        s.write_all(&hello(self.rank, self.world_size, self.generation, &nonce))
            .map_err(|e| io_failed("sending hello to", e))?;
        let mut theirs = [0u8; HELLO_LEN];
        s.read_exact(&mut theirs)
            .map_err(|e| io_failed("no hello back from", e))?;
        let their_nonce = match parse_hello(&theirs, self.world_size, self.generation) {
            Ok((r, n)) if r == peer => n,
            Ok((r, _)) => return Err(Failed::Fatal(format!("{addr} answered as rank {r}"))),
            Err(why) => return Err(Failed::Fatal(format!("{addr}: {why}"))),
        };
        let mine = numbers(self.generation, self.world_size, self.rank, peer);
        let proof = self.auth.tag(&tag_parts(
            CONNECTOR,
            self.auth,
            &mine,
            &nonce,
            &their_nonce,
        ));
        s.write_all(&proof)
            .map_err(|e| io_failed("sending proof to", e))?;
        let mut tag = [0u8; TAG_LEN];
        s.read_exact(&mut tag)
            .map_err(|e| io_failed("no proof back from", e))?;
        let theirs = numbers(self.generation, self.world_size, peer, self.rank);
        if !self.auth.verify(
            &tag_parts(ACCEPTOR, self.auth, &theirs, &their_nonce, &nonce),
            &tag,
        ) {
            return Err(Failed::Fatal(format!(
                "{addr} could not prove it holds this job's secret (an impostor at rank \
                 {peer}'s address, or the ranks were given different {} values)",
                crate::auth::SECRET_VAR
            )));
        }
        stream
            .set_read_timeout(None)
            .map_err(|e| io_failed("setting up", e))?;
        Ok(())
    }
}

/// A connection the acceptor is handshaking with.
struct Pending {
    stream: TcpStream,
    from: SocketAddr,
    since: Instant,
    /// When it is dropped if unfinished.
    expires: Instant,
    nonce: Vec<u8>,
    /// Its hello and proof, as they arrive.
    buf: [u8; HELLO_LEN + TAG_LEN],
    have: usize,
}

/// What reading a pending connection came to.
enum Step {
    /// More bytes to come.
    Waiting,
    /// Authenticated as this rank.
    Done(usize),
    /// Dropped, for this reason.
    Drop(String),
}

impl Mesh<'_> {
    /// Accepts `stream`: sends this rank's hello. `Err` (why) when even
    /// that fails.
    fn start(
        &self,
        stream: TcpStream,
        from: SocketAddr,
        deadline: Instant,
    ) -> std::result::Result<Pending, String> {
        let nonce = crate::auth::random_bytes(NONCE).map_err(|e| e.to_string())?;
        let hello = hello(self.rank, self.world_size, self.generation, &nonce);
        // A fresh socket's send buffer takes a hello whole.
        let sent = stream
            .set_nonblocking(true)
            .and_then(|()| stream.set_nodelay(true))
            .and_then(|()| (&stream).write(&hello));
        match sent {
            Ok(HELLO_LEN) => {}
            Ok(n) => return Err(format!("sending hello: only {n} bytes went")),
            Err(e) => return Err(format!("sending hello: {e}")),
        }
        let now = Instant::now();
        Ok(Pending {
            stream,
            from,
            since: now,
            expires: (now + HELLO_LIMIT).min(deadline),
            nonce,
            buf: [0; HELLO_LEN + TAG_LEN],
            have: 0,
        })
    }

    /// Reads what `p` sent so far and checks it.
    fn step(&self, p: &mut Pending, taken: &[Option<TcpStream>]) -> Step {
        loop {
            let want = if p.have < HELLO_LEN {
                HELLO_LEN
            } else {
                HELLO_LEN + TAG_LEN
            };
            match (&p.stream).read(&mut p.buf[p.have..want]) {
                Ok(0) => return Step::Drop("it closed the connection during the handshake".into()),
                Ok(n) => p.have += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Waiting,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Step::Drop(format!("reading its handshake: {e}")),
            }
            if p.have >= 4 && p.buf[..4] != HELLO_MAGIC.to_le_bytes() {
                // Not worth waiting for the rest.
                let magic = u32::from_le_bytes(p.buf[..4].try_into().expect("4 bytes"));
                return Step::Drop(format!(
                    "not a polychip tcp hello of this version (magic {magic:#x})"
                ));
            }
            if p.have < want {
                continue;
            }
            let (peer, their_nonce) =
                match parse_hello(&p.buf[..HELLO_LEN], self.world_size, self.generation) {
                    Ok(hello) => hello,
                    Err(why) => return Step::Drop(why),
                };
            if peer <= self.rank || taken[peer].is_some() {
                return Step::Drop(format!(
                    "it claims rank {peer}, which does not connect to rank {} or already did",
                    self.rank
                ));
            }
            if p.have < HELLO_LEN + TAG_LEN {
                continue;
            }
            let theirs = numbers(self.generation, self.world_size, peer, self.rank);
            if !self.auth.verify(
                &tag_parts(CONNECTOR, self.auth, &theirs, &their_nonce, &p.nonce),
                &p.buf[HELLO_LEN..],
            ) {
                return Step::Drop(format!(
                    "it claims rank {peer} but could not prove it holds this job's secret"
                ));
            }
            let mine = numbers(self.generation, self.world_size, self.rank, peer);
            let proof = self.auth.tag(&tag_parts(
                ACCEPTOR,
                self.auth,
                &mine,
                &p.nonce,
                &their_nonce,
            ));
            let sent = p
                .stream
                .set_nonblocking(false)
                .and_then(|()| p.stream.set_write_timeout(Some(remaining(p.expires))))
                .and_then(|()| (&p.stream).write_all(&proof))
                .and_then(|()| p.stream.set_write_timeout(None));
            return match sent {
                Ok(()) => Step::Done(peer),
                Err(e) => Step::Drop(format!("rank {peer}: sending proof: {e}")),
            };
        }
    }
}

/// Connects this rank to every other; entry `rank` of the result is `None`.
pub(crate) fn connect(
    store: &dyn Store,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    options: &TcpOptions,
) -> Result<Vec<Option<TcpStream>>> {
    let deadline = Instant::now() + timeout;
    let io_err = |op: &str, e: &dyn std::fmt::Display| CommError::Io {
        rank,
        op: format!("tcp {op}"),
        message: e.to_string(),
    };
    let auth = job_auth(options, rank)?;
    let prefix = &options.key_prefix;
    // Every rank creates its transports in the same order, so the n-th one
    // of each rank gets the same generation.
    let generation = store.add(&format!("{prefix}/generation/{rank}"), 1)?;
    let mesh = Mesh {
        auth: &auth,
        rank,
        world_size,
        generation,
    };
    let listener = TcpListener::bind(SocketAddr::new(options.bind_addr, 0)).map_err(|e| {
        io_err(
            &format!(
                "listen on {} (the address {} gives, or this machine's default; it must be one \
                 of this machine's own)",
                options.bind_addr,
                super::ADDR_ENV
            ),
            &e,
        )
    })?;
    let local = listener.local_addr().map_err(|e| io_err("listen", &e))?;
    store.set(
        &format!("{prefix}/{generation}/addr/{rank}"),
        local.to_string().as_bytes(),
    )?;

    let mut streams: Vec<Option<TcpStream>> = (0..world_size).map(|_| None).collect();
    for (peer, slot) in streams.iter_mut().enumerate().take(rank) {
        let raw = store.get(
            &format!("{prefix}/{generation}/addr/{peer}"),
            remaining(deadline),
        )?;
        let text = String::from_utf8_lossy(&raw);
        let addr: SocketAddr = text
            .parse()
            .map_err(|e| io_err("connect", &format!("rank {peer} published {text:?}: {e}")))?;
        let lost = |why: String| CommError::PeerLost {
            rank,
            op: "tcp connect".into(),
            peer,
            why,
        };
        // Why the last handshake was cut off, and how long to wait before
        // the next (it doubles: a peer that keeps refusing is not hammered).
        let mut closed: Option<String> = None;
        let mut backoff = Duration::from_millis(10);
        let stream = loop {
            let stream = match TcpStream::connect_timeout(&addr, remaining(deadline)) {
                Ok(s) => s,
                Err(e) if Instant::now() < deadline => {
                    log::debug!("tcp rank {rank}: connect to rank {peer} at {addr}: {e}; retrying");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Err(e) => {
                    let why = match &closed {
                        Some(last) => format!("{last}; then cannot connect to {addr}: {e}"),
                        None => format!("cannot connect to {addr}: {e}"),
                    };
                    return Err(lost(why));
                }
            };
            set_buffers(&stream, options.socket_buffer).map_err(|e| io_err("connect", &e))?;
            match mesh.connect_handshake(&stream, peer, addr, deadline) {
                Ok(()) => break stream,
                Err(Failed::Closed(why)) if Instant::now() < deadline => {
                    log::debug!("tcp rank {rank}: handshake with rank {peer}: {why}; retrying");
                    closed = Some(why);
                    std::thread::sleep(backoff.min(remaining(deadline)));
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                Err(Failed::Closed(why) | Failed::Fatal(why)) => return Err(lost(why)),
            }
        };
        *slot = Some(stream);
    }

    listener
        .set_nonblocking(true)
        .map_err(|e| io_err("accept", &e))?;
    accept_all(&mesh, &listener, &mut streams, deadline, timeout, options)?;
    Ok(streams)
}

/// Accepts every higher rank: handshakes with up to [`MAX_PENDING`]
/// connections at once, each within [`HELLO_LIMIT`].
fn accept_all(
    mesh: &Mesh<'_>,
    listener: &TcpListener,
    streams: &mut [Option<TcpStream>],
    deadline: Instant,
    timeout: Duration,
    options: &TcpOptions,
) -> Result<()> {
    let rank = mesh.rank;
    let world_size = mesh.world_size;
    let io_err = |e: &dyn std::fmt::Display| CommError::Io {
        rank,
        op: "tcp accept".into(),
        message: e.to_string(),
    };
    let mut pending: Vec<Pending> = Vec::new();
    let mut missing = world_size - rank - 1;
    let mut dropped = 0usize;
    let mut pollfds: Vec<libc::pollfd> = Vec::new();
    while missing > 0 {
        let now = Instant::now();
        if now >= deadline {
            let waiting: Vec<usize> = (rank + 1..world_size)
                .filter(|&p| streams[p].is_none())
                .collect();
            return Err(CommError::Timeout {
                rank,
                op: "tcp accept".into(),
                after: timeout,
                waiting_for: format!("connections from ranks {waiting:?}"),
            });
        }
        pending.retain(|p| {
            let keep = now < p.expires;
            if !keep {
                let why = format!(
                    "no authenticated hello within {:?} of being accepted",
                    p.expires - p.since
                );
                note_drop(rank, &mut dropped, p.from, &why);
            }
            keep
        });
        // The listener is watched while there is room, or once the oldest
        // unfinished connection is old enough to give its place up.
        let oldest = pending.iter().map(|p| p.since).min();
        let room = pending.len() < MAX_PENDING;
        let evict_at = oldest.map(|t| t + EVICT_AGE);
        let watch_listener = room || evict_at.is_some_and(|t| t <= now);
        let mut wake = pending
            .iter()
            .map(|p| p.expires)
            .min()
            .unwrap_or(deadline)
            .min(deadline);
        if !watch_listener && let Some(t) = evict_at {
            wake = wake.min(t);
        }
        pollfds.clear();
        pollfds.extend(pending.iter().map(|p| libc::pollfd {
            fd: p.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
        if watch_listener {
            pollfds.push(libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let ms = wake
            .saturating_duration_since(now)
            .as_millis()
            .clamp(1, 100) as libc::c_int;
        // SAFETY: `pollfds` is a live array of `len` pollfd structs whose fds
        // stay open for the call.
        let rc = unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as libc::nfds_t, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(io_err(&e));
        }
        // The pending connections with something to read (or an error).
        let mut ready: Vec<bool> = pollfds[..pending.len()]
            .iter()
            .map(|f| f.revents != 0)
            .collect();
        let mut k = 0;
        while k < pending.len() {
            if !ready[k] {
                k += 1;
                continue;
            }
            match mesh.step(&mut pending[k], streams) {
                Step::Waiting => k += 1,
                Step::Done(peer) => {
                    let p = pending.remove(k);
                    ready.remove(k);
                    match set_buffers(&p.stream, options.socket_buffer) {
                        Ok(()) => {
                            streams[peer] = Some(p.stream);
                            missing -= 1;
                        }
                        Err(e) => {
                            note_drop(rank, &mut dropped, p.from, &format!("rank {peer}: {e}"))
                        }
                    }
                }
                Step::Drop(why) => {
                    let p = pending.remove(k);
                    ready.remove(k);
                    note_drop(rank, &mut dropped, p.from, &why);
                }
            }
        }
        if watch_listener && pollfds.last().is_some_and(|f| f.revents != 0) {
            // Accept what fits; a full table gives its oldest entry up.
            loop {
                if pending.len() >= MAX_PENDING {
                    let (at, oldest) = pending
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, p)| p.since)
                        .map(|(i, p)| (i, p.since))
                        .expect("a full table");
                    if Instant::now() < oldest + EVICT_AGE {
                        break;
                    }
                    let p = pending.swap_remove(at);
                    note_drop(
                        rank,
                        &mut dropped,
                        p.from,
                        &format!(
                            "{MAX_PENDING} connections were handshaking at once; the oldest \
                             gave its place up"
                        ),
                    );
                }
                match listener.accept() {
                    Ok((s, from)) => match mesh.start(s, from, deadline) {
                        Ok(p) => pending.push(p),
                        Err(why) => note_drop(rank, &mut dropped, from, &why),
                    },
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        // A connection that died in the backlog, or out of
                        // descriptors: neither ends the mesh.
                        log::debug!("tcp rank {rank}: accept: {e}");
                        break;
                    }
                }
            }
        }
    }
    if dropped > 10 {
        log::warn!(
            "tcp rank {rank}: dropped {dropped} connections in all that did not authenticate as \
             ranks of this job"
        );
    }
    // The unfinished ones close here.
    drop(pending);
    Ok(())
}

/// Logs a dropped connection: a flood by its first lines and a count at the
/// end.
fn note_drop(rank: usize, dropped: &mut usize, from: SocketAddr, why: &str) {
    *dropped += 1;
    if *dropped <= 10 {
        log::warn!("tcp rank {rank}: dropped a connection from {from}: {why}");
    }
}

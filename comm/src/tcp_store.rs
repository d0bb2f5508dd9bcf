//! The rendezvous [`Store`] across processes: rank 0 serves a key-value map
//! on `MASTER_ADDR:MASTER_PORT` and every rank (rank 0 too) is a client of
//! it. The wire protocol is small and length-prefixed (all integers little
//! endian):
//!
//! * handshake, a mutual challenge-response over the job's secret (see
//!   [`crate::auth`]): the client sends `PCST`, a version byte and a 16-byte
//!   nonce; the server answers the same five bytes, its own nonce and
//!   `HMAC(secret, "server", client nonce, job id)`, which the client checks
//!   (a store of another job, or with another secret, is refused); the
//!   client sends its rank, its job id and `HMAC(secret, "client", server
//!   nonce, job id, rank)`; the server answers a status byte (and on error a
//!   message: another job's rank, or a wrong secret). A connection that does
//!   not finish this within 5 s of being accepted is dropped (the 5 s cover
//!   the whole handshake, however the client spreads its bytes), and only
//!   members count as connected ranks. At most [`MAX_HANDSHAKING`]
//!   connections are in their handshake at once: beyond that the oldest is
//!   dropped once it is [`EVICT_AGE`] old, else the new one is closed at
//!   once (a rank whose connection is closed tries again).
//! * request: an op byte (`1` SET, `2` GET, `3` ADD), the key (u32 length
//!   and bytes), then SET: the value (u32 length and bytes); GET: the
//!   timeout in milliseconds (u64); ADD: the delta (i64).
//! * reply: a status byte (`0` ok, `1` timed out, `2` error), then ok: SET
//!   nothing, GET the value (u32 length and bytes), ADD the new value
//!   (i64); error: a message (u32 length and UTF-8 bytes).
//!
//! The server runs one thread per client, so a GET waiting for its key
//! blocks nobody else. Dropping rank 0's [`TcpStore`] stops the server and
//! closes every connection: the other ranks then see errors, not hangs. To
//! end a job cleanly, every rank passes a final [`barrier`], the others drop
//! their stores, and rank 0 calls [`TcpStore::wait_for_others_to_leave`]
//! before dropping its own.
//! Every socket read and write has a deadline. One value is at most 16 MiB
//! and the store holds at most 256 MiB in all, so no client can make rank 0
//! allocate without bound.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::auth::JobAuth;
use crate::env::RankInfo;
use crate::error::{CommError, Result};
use crate::store::Store;
use crate::text::{quoted, shown};

const MAGIC: &[u8; 5] = b"PCST\x02";
/// How long a new connection has to prove it belongs to the job, in all.
const HANDSHAKE: Duration = Duration::from_secs(5);
/// Most connections in their handshake at once (each holds a thread).
pub const MAX_HANDSHAKING: usize = 64;
/// How old the oldest connection in its handshake must be before a new one
/// takes its place when [`MAX_HANDSHAKING`] are open; a rank's own handshake
/// takes one round trip.
pub const EVICT_AGE: Duration = Duration::from_millis(250);
/// Refusals logged one by one before they are only counted.
const LOGGED_REFUSALS: usize = 10;
/// Bytes of a handshake nonce.
const NONCE: usize = 16;
const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_ADD: u8 = 3;
const STATUS_OK: u8 = 0;
const STATUS_TIMEOUT: u8 = 1;
const STATUS_ERROR: u8 = 2;
/// Longest key accepted.
const MAX_KEY: usize = 64 << 10;
/// Largest value accepted.
const MAX_VALUE: usize = 16 << 20;
/// Most bytes (keys and values) the store holds in all.
const MAX_TOTAL: usize = 256 << 20;
/// How long SET and ADD may take, and how much longer than its own timeout
/// a GET's reply may take, before the connection is declared dead.
const IO_GRACE: Duration = Duration::from_secs(30);

/// A [`Store`] shared by the processes of a job through rank 0's server.
#[derive(Debug)]
pub struct TcpStore {
    rank: usize,
    addr: String,
    port: u16,
    /// The job's secret and id its ranks proved.
    auth: JobAuth,
    client: Mutex<Client>,
    server: Option<Server>,
}

#[derive(Debug)]
struct Client {
    stream: TcpStream,
    /// Set when a reply was cut off: the stream is out of step for good.
    broken: Option<String>,
}

impl TcpStore {
    /// Joins the job's store: rank 0 first starts the server on
    /// `info.master_addr:info.master_port` (port 0 picks a free one; see
    /// [`TcpStore::port`]); then every rank connects, retrying with a short
    /// backoff until `timeout` has passed.
    ///
    /// The job's secret and id come from the environment
    /// ([`JobAuth::from_env`]); [`TcpStore::connect_with`] takes them.
    pub fn connect(info: &RankInfo, timeout: Duration) -> Result<TcpStore> {
        let auth = JobAuth::from_env(info).map_err(|e| match e {
            CommError::Usage(m) => CommError::Usage(format!("rank {}: {m}", info.rank)),
            e => e,
        })?;
        TcpStore::connect_with(info, &auth, timeout)
    }

    /// [`TcpStore::connect`] with the job's secret and id given.
    pub fn connect_with(info: &RankInfo, auth: &JobAuth, timeout: Duration) -> Result<TcpStore> {
        let rank = info.rank;
        let deadline = Instant::now().checked_add(timeout);
        let (server, port) = if rank == 0 {
            let server = Server::start(&info.master_addr, info.master_port, auth.clone())?;
            let port = server.port;
            (Some(server), port)
        } else {
            if info.master_port == 0 {
                return Err(CommError::Usage(format!(
                    "rank {rank}: MASTER_PORT is 0, which only rank 0 may use (to pick a free \
                     port); the other ranks need the port rank 0 serves on"
                )));
            }
            (None, info.master_port)
        };
        let addr = info.master_addr.clone();
        let stream = connect_with_retry(rank, auth, &addr, port, timeout, deadline)?;
        let store = TcpStore {
            rank,
            addr,
            port,
            auth: auth.clone(),
            client: Mutex::new(Client {
                stream,
                broken: None,
            }),
            server,
        };
        Ok(store)
    }

    /// The port the store is served on (the one picked when rank 0 was
    /// given port 0).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The job's secret and id its ranks proved (the transports built on
    /// it prove the same).
    pub fn auth(&self) -> &JobAuth {
        &self.auth
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// On rank 0: waits until every other rank has closed its connection
    /// (dropped its store), so that dropping this store (which stops the
    /// server) cannot cut off a rank still finishing its last request. Call
    /// it last, after the ranks' final [`barrier`].
    pub fn wait_for_others_to_leave(&self, timeout: Duration) -> Result<()> {
        let op = "store shutdown";
        let Some(server) = &self.server else {
            return Err(CommError::Usage(format!(
                "rank {}: {op}: only rank 0 serves the store and can wait for the others to leave",
                self.rank
            )));
        };
        let shared = &server.shared;
        let deadline = Instant::now().checked_add(timeout);
        let mut live = shared.live.lock().unwrap_or_else(|e| e.into_inner());
        // Rank 0's own connection stays.
        while *live > 1 {
            live = match deadline {
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(CommError::Timeout {
                            rank: self.rank,
                            op: op.to_string(),
                            after: timeout,
                            waiting_for: format!(
                                "{} other rank(s) still connected to the rendezvous store at {} \
                                 to disconnect",
                                *live - 1,
                                self.where_()
                            ),
                        });
                    }
                    shared
                        .left
                        .wait_timeout(live, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => shared.left.wait(live).unwrap_or_else(|e| e.into_inner()),
            };
        }
        Ok(())
    }

    /// `host:port` of the store, for messages.
    fn where_(&self) -> String {
        format!("{}:{}", shown(&self.addr), self.port)
    }

    /// Sends one request and reads its reply status, holding the connection
    /// for the whole exchange. `read_reply` reads the payload after an ok.
    fn call<T>(
        &self,
        op: &str,
        request: &[u8],
        reply_deadline: Option<Duration>,
        read_reply: impl FnOnce(&mut TcpStream) -> io::Result<T>,
    ) -> Result<Reply<T>> {
        let mut client = self.client.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &client.broken {
            return Err(self.lost(op, why.clone()));
        }
        let result = (|| {
            client.stream.set_write_timeout(Some(IO_GRACE))?;
            client.stream.write_all(request)?;
            client.stream.set_read_timeout(reply_deadline)?;
            let status = read_u8(&mut client.stream)?;
            match status {
                STATUS_OK => Ok(Reply::Ok(read_reply(&mut client.stream)?)),
                STATUS_TIMEOUT => Ok(Reply::TimedOut),
                STATUS_ERROR => {
                    let message = read_bytes(&mut client.stream, MAX_VALUE)?;
                    // The server's words: escaped, and cut if very long.
                    let message = String::from_utf8_lossy(&message);
                    Ok(Reply::Error(polychip_files::printable_lines(&message)))
                }
                other => Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("the store answered with unknown status {other}"),
                )),
            }
        })();
        result.map_err(|e| {
            let why = describe_io(&e);
            let why = if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                "it stopped answering".to_string()
            } else if e.kind() == io::ErrorKind::UnexpectedEof {
                "it closed the connection (rank 0 exited or dropped its store)".to_string()
            } else {
                why
            };
            client.broken = Some(why.clone());
            self.lost(op, why)
        })
    }

    fn lost(&self, op: &str, why: String) -> CommError {
        CommError::PeerLost {
            rank: self.rank,
            op: op.to_string(),
            peer: 0,
            why: format!("the rendezvous store at {} failed: {why}", self.where_()),
        }
    }

    fn refused(&self, op: &str, message: String) -> CommError {
        CommError::Io {
            rank: self.rank,
            op: op.to_string(),
            message,
        }
    }
}

enum Reply<T> {
    Ok(T),
    TimedOut,
    Error(String),
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let op = "store set";
        check_key(self.rank, op, key)?;
        if value.len() > MAX_VALUE {
            return Err(CommError::Usage(format!(
                "rank {}: {op}: the value for key {} is {} bytes; the store takes at most {MAX_VALUE}",
                self.rank,
                quoted(key),
                value.len()
            )));
        }
        let mut request = vec![OP_SET];
        put_bytes(&mut request, key.as_bytes());
        put_bytes(&mut request, value);
        match self.call(op, &request, Some(IO_GRACE), |_| Ok(()))? {
            Reply::Ok(()) => Ok(()),
            Reply::TimedOut => Err(self.lost(op, "it answered a SET with a timeout".into())),
            Reply::Error(m) => Err(self.refused(op, m)),
        }
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let op = "store get";
        check_key(self.rank, op, key)?;
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let mut request = vec![OP_GET];
        put_bytes(&mut request, key.as_bytes());
        request.extend_from_slice(&ms.to_le_bytes());
        let reply_deadline = timeout.checked_add(IO_GRACE);
        match self.call(op, &request, reply_deadline, |s| read_bytes(s, MAX_VALUE))? {
            Reply::Ok(v) => Ok(v),
            Reply::TimedOut => Err(CommError::Timeout {
                rank: self.rank,
                op: op.to_string(),
                after: timeout,
                waiting_for: format!(
                    "key {} in the rendezvous store at {}",
                    quoted(key),
                    self.where_()
                ),
            }),
            Reply::Error(m) => Err(self.refused(op, m)),
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let op = "store add";
        check_key(self.rank, op, key)?;
        let mut request = vec![OP_ADD];
        put_bytes(&mut request, key.as_bytes());
        request.extend_from_slice(&delta.to_le_bytes());
        match self.call(op, &request, Some(IO_GRACE), read_i64)? {
            Reply::Ok(v) => Ok(v),
            Reply::TimedOut => Err(self.lost(op, "it answered an ADD with a timeout".into())),
            Reply::Error(m) => Err(self.refused(op, m)),
        }
    }
}

impl Drop for TcpStore {
    fn drop(&mut self) {
        let client = self.client.get_mut().unwrap_or_else(|e| e.into_inner());
        let _ = client.stream.shutdown(Shutdown::Both);
        if let Some(server) = self.server.take() {
            server.stop();
        }
    }
}

/// Waits until every one of `world` ranks has called `barrier` with the
/// same `key_prefix` (at most `timeout`). Each barrier needs its own prefix:
/// the keys `{key_prefix}/arrived` and `{key_prefix}/done` are used once.
pub fn barrier(
    store: &dyn Store,
    key_prefix: &str,
    rank: usize,
    world: usize,
    timeout: Duration,
) -> Result<()> {
    let arrived_key = format!("{key_prefix}/arrived");
    let done_key = format!("{key_prefix}/done");
    let arrived = store.add(&arrived_key, 1)?;
    if arrived == world as i64 {
        store.set(&done_key, b"1")?;
    }
    match store.get(&done_key, timeout) {
        Ok(_) => Ok(()),
        Err(CommError::Timeout { .. }) => {
            let arrived = store.add(&arrived_key, 0).unwrap_or(arrived);
            Err(CommError::Timeout {
                rank,
                op: "barrier".to_string(),
                after: timeout,
                waiting_for: format!(
                    "all {world} ranks at barrier {key_prefix:?} (only {arrived} arrived)"
                ),
            })
        }
        Err(e) => Err(e),
    }
}

/// How the done key of a barrier begins when a rank announced that it will
/// not come ([`announce_failure`]): then `<rank>\n<why>`.
const FAILED_MARK: &str = "failed ";
/// How long [`barrier_watching`] waits on the store between looks at its
/// other source of failures.
const WATCH_SLICE: Duration = Duration::from_millis(100);

/// Tells the ranks waiting at the barrier `key_prefix` (see [`barrier`]),
/// and those that arrive later, that `rank` will not come because of `why`
/// (its communicator failed): their [`barrier_watching`] fails at once
/// naming it. The first rank to announce is the one named.
pub fn announce_failure(store: &dyn Store, key_prefix: &str, rank: usize, why: &str) -> Result<()> {
    if store.add(&format!("{key_prefix}/failed"), 1)? == 1 {
        let why = crate::error::abort_reason(why);
        store.set(
            &format!("{key_prefix}/done"),
            format!("{FAILED_MARK}{rank}\n{why}").as_bytes(),
        )?;
    }
    Ok(())
}

/// [`barrier`], failing at once when a rank announced it will not come
/// ([`announce_failure`]) or, checked every 100 ms while it waits, when
/// `failed` returns an error (a failure its transport heard of): the error
/// is returned as it is.
pub fn barrier_watching(
    store: &dyn Store,
    key_prefix: &str,
    rank: usize,
    world: usize,
    timeout: Duration,
    failed: &dyn Fn() -> Option<CommError>,
) -> Result<()> {
    let arrived_key = format!("{key_prefix}/arrived");
    let done_key = format!("{key_prefix}/done");
    let done = |value: Vec<u8>| -> Result<()> {
        let text = String::from_utf8_lossy(&value);
        let Some(rest) = text.strip_prefix(FAILED_MARK) else {
            return Ok(());
        };
        let (peer, why) = rest.split_once('\n').unwrap_or((rest, ""));
        let peer = peer.parse().unwrap_or(usize::MAX);
        Err(CommError::peer_failed(rank, "barrier", peer, why))
    };
    if let Some(e) = failed() {
        return Err(e);
    }
    let arrived = store.add(&arrived_key, 1)?;
    if arrived == world as i64 {
        // Unless a rank announced its failure first: it will never come.
        match store.get(&done_key, Duration::ZERO) {
            Ok(value) => return done(value),
            Err(CommError::Timeout { .. }) => store.set(&done_key, b"1")?,
            Err(e) => return Err(e),
        }
    }
    let start = Instant::now();
    loop {
        let left = timeout.saturating_sub(start.elapsed());
        match store.get(&done_key, left.min(WATCH_SLICE)) {
            Ok(value) => return done(value),
            Err(CommError::Timeout { .. }) if !left.is_zero() => {}
            Err(CommError::Timeout { .. }) => {
                let arrived = store.add(&arrived_key, 0).unwrap_or(arrived);
                return Err(CommError::Timeout {
                    rank,
                    op: "barrier".to_string(),
                    after: timeout,
                    waiting_for: format!(
                        "all {world} ranks at barrier {key_prefix:?} (only {arrived} arrived)"
                    ),
                });
            }
            // The store is gone (its rank 0 left): why, if the transport
            // knows.
            Err(e) => return Err(failed().unwrap_or(e)),
        }
        if let Some(e) = failed() {
            // Every rank may have arrived and left meanwhile.
            return match store.get(&done_key, Duration::ZERO) {
                Ok(value) => done(value),
                Err(_) => Err(e),
            };
        }
    }
}

fn check_key(rank: usize, op: &str, key: &str) -> Result<()> {
    if key.len() > MAX_KEY {
        return Err(CommError::Usage(format!(
            "rank {rank}: {op}: a key of {} bytes is longer than the store's limit of {MAX_KEY}",
            key.len()
        )));
    }
    Ok(())
}

/// The OS's words for an I/O error, without the "(os error N)" tail, in
/// lower case: "connection refused".
fn describe_io(e: &io::Error) -> String {
    let text = e.to_string();
    let text = match text.find(" (os error") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// "30s" for whole seconds, Debug form otherwise.
fn human(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{d:?}")
    }
}

fn connect_with_retry(
    rank: usize,
    auth: &JobAuth,
    addr: &str,
    port: u16,
    timeout: Duration,
    deadline: Option<Instant>,
) -> Result<TcpStream> {
    let mut backoff = Duration::from_millis(10);
    let host = shown(addr);
    loop {
        let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let last_error = match try_connect(rank, auth, addr, port, remaining) {
            Ok(stream) => return Ok(stream),
            Err(Attempt::Refused(why)) => {
                return Err(CommError::Usage(format!(
                    "rank {rank}: the rendezvous store at {host}:{port} {why}"
                )));
            }
            Err(Attempt::Failed(e)) => e,
        };
        let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if remaining.is_some_and(|r| r.is_zero()) {
            return Err(CommError::Io {
                rank,
                op: format!(
                    "could not reach the rendezvous store at {host}:{port} within {}",
                    human(timeout)
                ),
                message: last_error,
            });
        }
        let sleep = remaining.map_or(backoff, |r| r.min(backoff));
        std::thread::sleep(sleep);
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
}

/// Why one attempt to join the store failed.
enum Attempt {
    /// Worth retrying (nothing listens yet, a reset, a timeout): the reason.
    Failed(String),
    /// Final: the store is another job's, or the secrets differ.
    Refused(String),
}

/// One attempt: resolve, connect and handshake (see the module docs).
fn try_connect(
    rank: usize,
    auth: &JobAuth,
    addr: &str,
    port: u16,
    remaining: Option<Duration>,
) -> std::result::Result<TcpStream, Attempt> {
    let addrs: Vec<SocketAddr> = (crate::env::bare_host(addr), port)
        .to_socket_addrs()
        .map_err(|e| {
            let why = describe_io(&e);
            Attempt::Failed(format!("cannot resolve {}: {why}", quoted(addr)))
        })?
        .collect();
    let limit = remaining
        .unwrap_or(Duration::from_secs(10))
        .clamp(Duration::from_millis(10), Duration::from_secs(10));
    let mut last = format!("{} resolves to no address", quoted(addr));
    let nonce = crate::auth::random_bytes(NONCE).map_err(|e| Attempt::Failed(e.to_string()))?;
    for sa in addrs {
        match TcpStream::connect_timeout(&sa, limit) {
            Ok(mut stream) => {
                let _ = stream.set_nodelay(true);
                match client_handshake(&mut stream, rank, auth, &nonce, limit) {
                    Ok(()) => return Ok(stream),
                    Err(Attempt::Failed(why)) => last = why,
                    Err(refused) => return Err(refused),
                }
            }
            Err(e) => last = describe_io(&e),
        }
    }
    Err(Attempt::Failed(last))
}

fn client_handshake(
    stream: &mut TcpStream,
    rank: usize,
    auth: &JobAuth,
    nonce: &[u8],
    limit: Duration,
) -> std::result::Result<(), Attempt> {
    let failed = |e: io::Error| Attempt::Failed(format!("handshake failed: {}", describe_io(&e)));
    stream.set_write_timeout(Some(limit)).map_err(failed)?;
    stream.set_read_timeout(Some(limit)).map_err(failed)?;
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(nonce);
    stream.write_all(&hello).map_err(failed)?;
    let mut answer = [0u8; 5 + NONCE + 32];
    stream.read_exact(&mut answer[..5]).map_err(failed)?;
    if &answer[..5] != MAGIC {
        let what = if answer[..4] == MAGIC[..4] {
            "speaks another version of the polychip store protocol (a polychip of another \
             version?)"
        } else {
            "is something else (it does not speak the polychip store protocol)"
        };
        return Err(Attempt::Refused(what.into()));
    }
    stream.read_exact(&mut answer[5..]).map_err(failed)?;
    let (server_nonce, server_tag) = answer[5..].split_at(NONCE);
    let job = auth.job_id.as_bytes();
    if !auth.verify(&[b"server", nonce, job], server_tag) {
        return Err(Attempt::Refused(format!(
            "cannot prove it belongs to this job (job id {}): it is another job's store on the \
             same port, or the ranks were given different {} values",
            quoted(&auth.job_id),
            crate::auth::SECRET_VAR
        )));
    }
    let rank_bytes = (rank as u64).to_le_bytes();
    let mut proof = rank_bytes.to_vec();
    put_bytes(&mut proof, job);
    proof.extend_from_slice(&auth.tag(&[b"client", server_nonce, job, &rank_bytes]));
    stream.write_all(&proof).map_err(failed)?;
    match read_u8(stream).map_err(failed)? {
        STATUS_OK => Ok(()),
        _ => {
            let message = read_bytes(stream, MAX_KEY).map_err(failed)?;
            // The server's words: escaped, and cut if very long.
            Err(Attempt::Refused(format!(
                "refused this rank: {}",
                polychip_files::printable_lines(&String::from_utf8_lossy(&message))
            )))
        }
    }
}

// ---------------------------------------------------------------- server

#[derive(Debug)]
struct Shared {
    auth: JobAuth,
    map: Mutex<HashMap<String, Vec<u8>>>,
    /// Bytes of keys and values in `map` (under its lock).
    total: std::sync::atomic::AtomicUsize,
    changed: Condvar,
    stop: AtomicBool,
    /// Open connections (to shut down on stop) and their threads.
    clients: Mutex<Vec<(TcpStream, JoinHandle<()>)>>,
    /// Number of connected members (rank 0's own included): clients that
    /// passed the handshake.
    live: Mutex<usize>,
    left: Condvar,
    /// The connections in their handshake: an id, when accepted, and a
    /// handle to drop it by.
    handshaking: Mutex<Vec<(u64, Instant, TcpStream)>>,
    /// Connections refused or dropped before they proved themselves.
    refused: std::sync::atomic::AtomicUsize,
}

impl Shared {
    /// Logs why a connection that did not prove itself was dropped: the
    /// first few one by one, then one line per thousand.
    fn note_refusal(&self, why: std::fmt::Arguments<'_>) {
        let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        if n <= LOGGED_REFUSALS {
            log::warn!("rendezvous store: {why}");
        } else if n % 1000 == 0 {
            log::warn!(
                "rendezvous store: {n} connections refused or dropped so far before proving \
                 they belong to the job (the latest: {why})"
            );
        }
    }

    /// Makes room for a new connection in its handshake: `false` when it
    /// must be refused.
    fn admit(&self, id: u64, peer: SocketAddr, stream: TcpStream) -> bool {
        let mut handshaking = self.handshaking.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if handshaking.len() >= MAX_HANDSHAKING {
            let (at, since) = handshaking
                .iter()
                .enumerate()
                .min_by_key(|(_, h)| h.1)
                .map(|(i, h)| (i, h.1))
                .expect("a full table");
            if now.duration_since(since) < EVICT_AGE {
                drop(handshaking);
                self.note_refusal(format_args!(
                    "refused a connection from {peer}: {MAX_HANDSHAKING} connections are already \
                     proving they belong to the job"
                ));
                return false;
            }
            let (_, _, oldest) = handshaking.swap_remove(at);
            let _ = oldest.shutdown(Shutdown::Both);
            let from = oldest
                .peer_addr()
                .map_or_else(|_| "?".to_string(), |a| a.to_string());
            self.note_refusal(format_args!(
                "dropped a connection from {from} after {:?} of handshake to make room: \
                 {MAX_HANDSHAKING} connections were proving they belong to the job",
                now.duration_since(since)
            ));
        }
        handshaking.push((id, now, stream));
        true
    }

    /// The connection `id` finished its handshake (either way).
    fn handshake_over(&self, id: u64) {
        let mut handshaking = self.handshaking.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = handshaking.iter().position(|h| h.0 == id) {
            handshaking.swap_remove(at);
        }
    }
}

#[derive(Debug)]
struct Server {
    port: u16,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl Server {
    fn start(addr: &str, port: u16, auth: JobAuth) -> Result<Server> {
        let host = shown(addr);
        if addr == "0.0.0.0" || crate::env::bare_host(addr) == "::" {
            log::warn!(
                "rendezvous store: MASTER_ADDR={host} serves on every network interface: anyone \
                 who can reach port {port} can try to join (only holders of the job's secret \
                 get in); give rank 0's own address to serve only there"
            );
        }
        let listener =
            TcpListener::bind((crate::env::bare_host(addr), port)).map_err(|e| CommError::Io {
                rank: 0,
                op: format!("could not serve the rendezvous store on {host}:{port}"),
                message: describe_io(&e),
            })?;
        let io_err = |e: io::Error| CommError::Io {
            rank: 0,
            op: format!("rendezvous store on {host}:{port}"),
            message: describe_io(&e),
        };
        let port = listener.local_addr().map_err(io_err)?.port();
        listener.set_nonblocking(true).map_err(io_err)?;
        let shared = Arc::new(Shared {
            auth,
            map: Mutex::default(),
            total: Default::default(),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            clients: Mutex::default(),
            live: Mutex::new(0),
            left: Condvar::new(),
            handshaking: Mutex::default(),
            refused: Default::default(),
        });
        let accept_shared = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name(format!("store-server:{port}"))
            .spawn(move || accept_loop(listener, accept_shared))
            .map_err(io_err)?;
        log::debug!("rendezvous store serving on {host}:{port}");
        Ok(Server {
            port,
            shared,
            accept: Some(accept),
        })
    }

    fn stop(mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            // Take the map lock so no GET is between its stop check and its
            // wait when we notify.
            let _map = self.shared.map.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.changed.notify_all();
        }
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        let clients = std::mem::take(
            &mut *self
                .shared
                .clients
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        // Shutting down only the reading side wakes handlers waiting for a
        // request but lets one that is answering finish its reply.
        for (stream, _) in &clients {
            let _ = stream.shutdown(Shutdown::Read);
        }
        for (_, handle) in clients {
            let _ = handle.join();
        }
    }
}

/// How long the accept loop waits for a client before it looks at the
/// stop flag again (so `Server::stop` takes at most this long).
const ACCEPT_WAIT: Duration = Duration::from_millis(100);

/// Waits until a client knocks on `listener` or [`ACCEPT_WAIT`] has passed.
/// The loop slept 5 ms between nonblocking accepts until stop 48: 200
/// wake-ups a second for the whole job, on the cores rank 0 computes on
/// (its threads share its binding), which preempted its compute thread
/// and cost its passes 2-5% in a data-parallel job (docs/performance.md).
fn wait_for_client(listener: &TcpListener) {
    use std::os::fd::AsRawFd;
    let mut fd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the listener's open descriptor, which
    // outlives the call; poll only writes its `revents`.
    let ready = unsafe { libc::poll(&mut fd, 1, ACCEPT_WAIT.as_millis() as libc::c_int) };
    if ready < 0 {
        // Interrupted or failing: do not spin on it.
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut next_id = 0u64;
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, peer)) => {
                let (Ok(clone), Ok(handle)) = (stream.try_clone(), stream.try_clone()) else {
                    continue;
                };
                next_id += 1;
                let id = next_id;
                if !shared.admit(id, peer, handle) {
                    continue;
                }
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_nodelay(true);
                let thread_shared = Arc::clone(&shared);
                let spawned = std::thread::Builder::new()
                    .name(format!("store-client:{peer}"))
                    .spawn(move || {
                        let mut member = false;
                        if let Err(e) = serve_client(stream, &thread_shared, id, &mut member) {
                            if member {
                                log::debug!("rendezvous store: client {peer}: {e}");
                            } else {
                                thread_shared
                                    .note_refusal(format_args!("refused a client at {peer}: {e}"));
                            }
                        }
                        if member {
                            *thread_shared.live.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
                            thread_shared.left.notify_all();
                        }
                    });
                if let Err(e) = &spawned {
                    // The connection closes; a rank's client retries
                    // until its deadline, so this delays it, and says why.
                    shared.handshake_over(id);
                    shared.note_refusal(format_args!(
                        "dropped a connection from {peer}: could not start a thread to serve \
                         it ({e}); the client retries"
                    ));
                }
                if let Ok(handle) = spawned {
                    let mut clients = shared.clients.lock().unwrap_or_else(|e| e.into_inner());
                    // Reap finished clients so the list does not grow.
                    let (done, live): (Vec<_>, Vec<_>) =
                        clients.drain(..).partition(|(_, h)| h.is_finished());
                    *clients = live;
                    clients.push((clone, handle));
                    drop(clients);
                    for (_, h) in done {
                        let _ = h.join();
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_for_client(&listener),
            Err(e) => {
                log::debug!("rendezvous store: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// The server's half of the handshake: `Ok` once the client proved it is
/// a rank of this job (the caller then tells it so); `Err` (after telling
/// it why, when it got that far) otherwise.
fn server_handshake(stream: &TcpStream, shared: &Shared) -> io::Result<()> {
    let bad = |m: String| io::Error::new(io::ErrorKind::PermissionDenied, m);
    // Every read and write waits only for what is left of the 5 s, so a
    // client trickling its bytes is cut off at the deadline all the same.
    let stream = &mut Deadlined {
        stream,
        deadline: Instant::now() + HANDSHAKE,
    };
    let mut hello = [0u8; 5 + NONCE];
    stream.read_exact(&mut hello[..5])?;
    if &hello[..5] != MAGIC {
        return Err(bad("not a polychip store client of this version".into()));
    }
    stream.read_exact(&mut hello[5..])?;
    let client_nonce = &hello[5..];
    let auth = &shared.auth;
    let job = auth.job_id.as_bytes();
    let nonce = crate::auth::random_bytes(NONCE).map_err(|e| bad(e.to_string()))?;
    let mut answer = MAGIC.to_vec();
    answer.extend_from_slice(&nonce);
    answer.extend_from_slice(&auth.tag(&[b"server", client_nonce, job]));
    stream.write_all(&answer)?;
    let rank = read_u64(stream)?;
    let their_job = read_bytes(stream, MAX_KEY)?;
    let mut tag = [0u8; 32];
    stream.read_exact(&mut tag)?;
    let refuse = |stream: &mut Deadlined<'_>, why: String| {
        let mut reply = vec![STATUS_ERROR];
        put_bytes(&mut reply, why.as_bytes());
        let _ = stream.write_all(&reply);
        Err(bad(why))
    };
    if their_job != job {
        let why = format!(
            "it is a rank of job {}, and this store serves job {} (two jobs given the same \
             MASTER_ADDR:MASTER_PORT?)",
            quoted(&String::from_utf8_lossy(&their_job)),
            quoted(&auth.job_id)
        );
        return refuse(stream, why);
    }
    if !auth.verify(&[b"client", &nonce, job, &rank.to_le_bytes()], &tag) {
        let why = format!(
            "rank {rank} could not prove it holds this job's secret ({} differs)",
            crate::auth::SECRET_VAR
        );
        return refuse(stream, why);
    }
    Ok(())
}

/// A stream whose reads and writes fail with `TimedOut` once `deadline` has
/// passed (a socket's own timeouts bound each call, not their sum).
struct Deadlined<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl Deadlined<'_> {
    /// What is left until the deadline; `TimedOut` when nothing is.
    fn left(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the handshake did not finish within {}", human(HANDSHAKE)),
            ));
        }
        Ok(left)
    }
}

impl Read for Deadlined<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        match self.stream.read(buf) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                // Reported the same way whichever call ran out.
                self.left()?;
                Err(e)
            }
            other => other,
        }
    }
}

impl Write for Deadlined<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.left()?))?;
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Serves one client until it disconnects or the server stops; `member` is
/// set (and the client counted live) once it passed the handshake. `id` is
/// its entry among the connections in their handshake.
fn serve_client(
    mut stream: TcpStream,
    shared: &Shared,
    id: u64,
    member: &mut bool,
) -> io::Result<()> {
    let result = serve(&mut stream, shared, id, member);
    // The accept loop holds a clone of the socket until it reaps this
    // thread: hang up now, so a refused client is not left waiting.
    let _ = stream.shutdown(Shutdown::Both);
    result
}

/// [`serve_client`]'s work.
fn serve(stream: &mut TcpStream, shared: &Shared, id: u64, member: &mut bool) -> io::Result<()> {
    let handshake = server_handshake(stream, shared);
    shared.handshake_over(id);
    handshake?;
    // Counted before the client hears it is in, so a rank that got in is
    // always among those rank 0 waits for.
    *shared.live.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    *member = true;
    stream.write_all(&[STATUS_OK])?;
    stream.set_write_timeout(Some(IO_GRACE))?;
    // Between requests a member may stay quiet for as long as it likes.
    loop {
        stream.set_read_timeout(None)?;
        let op = match read_u8(stream) {
            Ok(op) => op,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        if shared.stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        stream.set_read_timeout(Some(IO_GRACE))?;
        let key = read_bytes(stream, MAX_KEY)?;
        let key = String::from_utf8_lossy(&key).into_owned();
        let mut reply = Vec::new();
        match op {
            OP_SET => {
                let value = read_bytes(stream, MAX_VALUE)?;
                let mut map = shared.map.lock().unwrap_or_else(|e| e.into_inner());
                let old = map.get(&key).map_or(0, |v| key.len() + v.len());
                let total = shared.total.load(Ordering::Relaxed) - old + key.len() + value.len();
                if total > MAX_TOTAL {
                    drop(map);
                    reply.push(STATUS_ERROR);
                    let message = format!(
                        "the store holds at most {MAX_TOTAL} bytes of keys and values, and \
                         setting key {} to {} bytes would make it {total}",
                        quoted(&key),
                        value.len()
                    );
                    put_bytes(&mut reply, message.as_bytes());
                } else {
                    shared.total.store(total, Ordering::Relaxed);
                    map.insert(key, value);
                    drop(map);
                    shared.changed.notify_all();
                    reply.push(STATUS_OK);
                }
            }
            OP_GET => {
                let ms = read_u64(stream)?;
                match wait_for(shared, &key, Duration::from_millis(ms)) {
                    Some(value) => {
                        reply.push(STATUS_OK);
                        put_bytes(&mut reply, &value);
                    }
                    None if shared.stop.load(Ordering::SeqCst) => return Ok(()),
                    None => reply.push(STATUS_TIMEOUT),
                }
            }
            OP_ADD => {
                let delta = read_i64(stream)?;
                let mut map = shared.map.lock().unwrap_or_else(|e| e.into_inner());
                let old = match map.get(&key) {
                    None => Some(0),
                    Some(v) => std::str::from_utf8(v)
                        .ok()
                        .and_then(|s| s.trim().parse::<i64>().ok()),
                };
                match old {
                    Some(old) => {
                        let new = old.wrapping_add(delta);
                        let text = new.to_string().into_bytes();
                        let before = map.get(&key).map_or(0, |v| key.len() + v.len());
                        let after = key.len() + text.len();
                        let total = shared.total.load(Ordering::Relaxed) - before + after;
                        if total > MAX_TOTAL {
                            drop(map);
                            reply.push(STATUS_ERROR);
                            let message = format!(
                                "the store holds at most {MAX_TOTAL} bytes of keys and values, \
                                 and a new key {} would make it {total}",
                                quoted(&key)
                            );
                            put_bytes(&mut reply, message.as_bytes());
                            stream.write_all(&reply)?;
                            continue;
                        }
                        shared.total.store(total, Ordering::Relaxed);
                        map.insert(key, text);
                        drop(map);
                        shared.changed.notify_all();
                        reply.push(STATUS_OK);
                        reply.extend_from_slice(&new.to_le_bytes());
                    }
                    None => {
                        drop(map);
                        reply.push(STATUS_ERROR);
                        let message = format!(
                            "key {} holds a value that is not an integer, so ADD cannot add to it",
                            quoted(&key)
                        );
                        put_bytes(&mut reply, message.as_bytes());
                    }
                }
            }
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unknown op {other}"),
                ));
            }
        }
        stream.write_all(&reply)?;
    }
}

/// Waits (at most `timeout`) for `key`; `None` on timeout or server stop.
fn wait_for(shared: &Shared, key: &str, timeout: Duration) -> Option<Vec<u8>> {
    let deadline = Instant::now().checked_add(timeout);
    let mut map = shared.map.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if let Some(value) = map.get(key) {
            return Some(value.clone());
        }
        if shared.stop.load(Ordering::SeqCst) {
            return None;
        }
        map = match deadline {
            Some(deadline) => {
                let now = Instant::now();
                if now >= deadline {
                    return None;
                }
                shared
                    .changed
                    .wait_timeout(map, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => shared.changed.wait(map).unwrap_or_else(|e| e.into_inner()),
        };
    }
}

// ------------------------------------------------------------- wire format

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    // Lengths are checked against MAX_KEY / MAX_VALUE (< 4 GiB) first.
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn read_u8(r: &mut impl Read) -> io::Result<u8> {
    let mut b = [0u8; 1];
    r.read_exact(&mut b)?;
    Ok(b[0])
}

fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn read_i64(r: &mut impl Read) -> io::Result<i64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(i64::from_le_bytes(b))
}

fn read_bytes(r: &mut impl Read, max: usize) -> io::Result<Vec<u8>> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    let len = u32::from_le_bytes(b) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a field of {len} bytes is longer than the limit of {max}"),
        ));
    }
    let mut v = vec![0u8; len];
    r.read_exact(&mut v)?;
    Ok(v)
}

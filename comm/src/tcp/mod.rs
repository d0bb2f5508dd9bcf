//! The TCP transport: a full mesh of TCP connections (one per pair of ranks)
//! carrying framed one-sided writes. A write sends a header (region, offset,
//! length, signal) and then the payload straight from the caller's slice; a
//! receiver thread per peer reads the payload straight into the local copy
//! of the region and then raises the signal. Waiters spin briefly, then block
//! on a condition variable; the first lost peer or protocol violation fails
//! every later `wait` and `write`.
//!
//! Shutdown: a dropped transport first sends a GOODBYE frame to every peer.
//! A peer that said goodbye has left the job cleanly, which is not a
//! failure: it can no longer receive, so later writes to it return `Ok` and
//! are discarded (collectives only write to a departed peer when returning
//! the credits of their last call), and nothing more will come from it, so
//! a wait fails with `PeerLost` ("left the job") once it cannot be satisfied:
//! at once when every peer has left, otherwise at the deadline. A connection
//! that ends without a GOODBYE (a crash) is a lost peer, as above.

mod mesh;
mod recv;
mod state;

use std::net::{IpAddr, Ipv4Addr, Shutdown, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{CommError, Result};
use crate::store::Store;
use crate::transport::{RegionId, SignalId, Transport};

pub use state::MAX_SIGNALS;
use state::Shared;

/// Environment variable naming the address this rank listens on (and
/// publishes to its peers); 127.0.0.1 when unset.
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
    /// How long `wait` polls (yielding the core) before blocking.
    pub spin: Duration,
    /// Prefix of the store keys (keep distinct per job sharing one store).
    pub key_prefix: String,
}

impl Default for TcpOptions {
    fn default() -> TcpOptions {
        TcpOptions {
            bind_addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
            socket_buffer: Some(4 << 20),
            spin: Duration::from_micros(50),
            key_prefix: "polychip/tcp".into(),
        }
    }
}

impl TcpOptions {
    /// The defaults, with the bind address from `POLYCHIP_COMM_ADDR` when set.
    pub fn from_env() -> Result<TcpOptions> {
        let mut options = TcpOptions::default();
        if let Ok(addr) = std::env::var(ADDR_ENV) {
            options.bind_addr = addr.trim().parse().map_err(|e| {
                CommError::Environment(format!("{ADDR_ENV}={addr:?} is not an IP address: {e}"))
            })?;
        }
        Ok(options)
    }
}

/// A one-sided [`Transport`] over TCP: a full mesh, one connection per pair.
#[derive(Debug)]
pub struct TcpTransport {
    shared: Arc<Shared>,
    /// Sending halves, one per peer (`None` for this rank); a write holds
    /// the lock for its whole frame so frames never interleave.
    senders: Vec<Option<Mutex<TcpStream>>>,
    receivers: Vec<JoinHandle<()>>,
    spin: Duration,
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
        let streams = mesh::connect(store.as_ref(), rank, world_size, timeout, &options)?;
        let shared = Arc::new(Shared::new(rank, world_size, timeout));
        let mut senders = Vec::with_capacity(world_size);
        let mut receivers = Vec::with_capacity(world_size);
        for (peer, stream) in streams.into_iter().enumerate() {
            let Some(stream) = stream else {
                senders.push(None);
                continue;
            };
            let reader = stream.try_clone().map_err(|e| shared.io("connect", e))?;
            let thread_shared = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name(format!("tcp-recv-{rank}<-{peer}"))
                .spawn(move || recv::run(thread_shared, peer, reader))
                .map_err(|e| shared.io("spawn receiver", e))?;
            receivers.push(handle);
            senders.push(Some(Mutex::new(stream)));
        }
        Ok(TcpTransport {
            shared,
            senders,
            receivers,
            spin: options.spin,
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
        self.shared.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world_size
    }

    fn name(&self) -> &'static str {
        "tcp"
    }

    fn register(&self, len: usize) -> Result<(RegionId, *mut u8)> {
        self.shared.register(len)
    }

    fn write(
        &self,
        peer: usize,
        region: RegionId,
        offset: usize,
        data: &[u8],
        signal: SignalId,
    ) -> Result<()> {
        let shared = &self.shared;
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
        let Some(sender) = &self.senders[peer] else {
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
        };
        let stream = sender.lock().unwrap_or_else(|e| e.into_inner());
        let sent = recv::send_frame(&stream, &header.encode(), data);
        drop(stream);
        sent.or_else(|e| {
            // The peer may have said goodbye and shut its socket down
            // before its receiver here read the GOODBYE.
            if shared.left_after_send_failure(peer) {
                return Ok(());
            }
            shared.fail_lost(peer, format!("send failed: {e}"));
            Err(shared
                .failure_error("write")
                .unwrap_or_else(|| shared.io("write", e)))
        })
    }

    fn wait(&self, signal: SignalId, value: u64, deadline: Instant) -> Result<()> {
        let shared = &self.shared;
        let counter = shared.counter(signal).ok_or_else(|| {
            CommError::Usage(format!(
                "tcp wait: signal {} is not below {MAX_SIGNALS}",
                signal.0
            ))
        })?;
        let start = Instant::now();
        let spin_until = start + self.spin;
        while Instant::now() < spin_until {
            if counter.load(Ordering::Acquire) >= value {
                return Ok(());
            }
            if shared.check("wait").is_err() {
                break;
            }
            // Yield, not spin_loop: on a busy machine the receiver thread
            // that will raise the signal may need this core.
            std::thread::yield_now();
        }
        shared
            .block_until(counter, value, deadline)
            .map_err(|e| match e {
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
        self.shared
            .counter(signal)
            .map_or(0, |c| c.load(Ordering::Acquire))
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.shared.close();
        for sender in self.senders.iter().flatten() {
            let stream = sender.lock().unwrap_or_else(|e| e.into_inner());
            if self.goodbye {
                // Best effort: a peer that is already gone needs no goodbye.
                let _ = recv::send_frame(&stream, &recv::Header::goodbye(), &[]);
            }
            let _ = stream.shutdown(Shutdown::Both);
        }
        for handle in self.receivers.drain(..) {
            let _ = handle.join();
        }
    }
}

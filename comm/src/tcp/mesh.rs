//! Building the TCP mesh: each rank listens on an ephemeral port, publishes
//! `host:port` in the store under a key scoped by a per-job generation
//! number, connects to every lower rank and accepts every higher one. A
//! hello (magic, rank, world size, generation) and its echo check that both
//! ends belong to the same mesh.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::TcpOptions;
use crate::error::{CommError, Result};
use crate::store::Store;

const HELLO_MAGIC: u32 = 0x5043_5448; // "PCTH"
const HELLO_LEN: usize = 24;

fn hello(rank: usize, world_size: usize, generation: i64) -> [u8; HELLO_LEN] {
    let mut b = [0u8; HELLO_LEN];
    b[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&(rank as u32).to_le_bytes());
    b[8..16].copy_from_slice(&(world_size as u64).to_le_bytes());
    b[16..24].copy_from_slice(&generation.to_le_bytes());
    b
}

/// Checks a hello and returns the sender's rank.
fn parse_hello(
    b: &[u8; HELLO_LEN],
    world_size: usize,
    generation: i64,
) -> std::result::Result<usize, String> {
    let magic = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
    let rank = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")) as usize;
    let world = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
    let generation_seen = i64::from_le_bytes(b[16..24].try_into().expect("8 bytes"));
    if magic != HELLO_MAGIC {
        return Err(format!("not a polychip tcp hello (magic {magic:#x})"));
    }
    if world != world_size as u64 || generation_seen != generation || rank >= world_size {
        return Err(format!(
            "hello from rank {rank} of {world} (generation {generation_seen}) does not match this mesh of {world_size} (generation {generation})"
        ));
    }
    Ok(rank)
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
    let prefix = &options.key_prefix;
    // Every rank creates its transports in the same order, so the n-th one
    // of each rank gets the same generation.
    let generation = store.add(&format!("{prefix}/generation/{rank}"), 1)?;
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
    let my_hello = hello(rank, world_size, generation);
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
        let stream = loop {
            match TcpStream::connect_timeout(&addr, remaining(deadline)) {
                Ok(s) => break s,
                Err(e) if Instant::now() < deadline => {
                    log::debug!("tcp rank {rank}: connect to rank {peer} at {addr}: {e}; retrying");
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(lost(format!("cannot connect to {addr}: {e}"))),
            }
        };
        set_buffers(&stream, options.socket_buffer).map_err(|e| io_err("connect", &e))?;
        stream
            .set_read_timeout(Some(remaining(deadline)))
            .map_err(|e| io_err("connect", &e))?;
        (&stream)
            .write_all(&my_hello)
            .map_err(|e| lost(format!("sending hello: {e}")))?;
        let mut echo = [0u8; HELLO_LEN];
        (&stream)
            .read_exact(&mut echo)
            .map_err(|e| lost(format!("no hello back from {addr}: {e}")))?;
        match parse_hello(&echo, world_size, generation) {
            Ok(r) if r == peer => {}
            Ok(r) => return Err(lost(format!("{addr} answered as rank {r}"))),
            Err(why) => return Err(lost(why)),
        }
        stream
            .set_read_timeout(None)
            .map_err(|e| io_err("connect", &e))?;
        *slot = Some(stream);
    }

    listener
        .set_nonblocking(true)
        .map_err(|e| io_err("accept", &e))?;
    let mut missing = world_size - rank - 1;
    while missing > 0 {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
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
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            Err(e) => return Err(io_err("accept", &e)),
        };
        stream
            .set_nonblocking(false)
            .map_err(|e| io_err("accept", &e))?;
        set_buffers(&stream, options.socket_buffer).map_err(|e| io_err("accept", &e))?;
        stream
            .set_read_timeout(Some(remaining(deadline)))
            .map_err(|e| io_err("accept", &e))?;
        let mut theirs = [0u8; HELLO_LEN];
        let peer = match (&stream)
            .read_exact(&mut theirs)
            .map_err(|e| e.to_string())
            .and_then(|()| parse_hello(&theirs, world_size, generation))
        {
            Ok(peer) if peer > rank && streams[peer].is_none() => peer,
            Ok(peer) => {
                log::warn!("tcp rank {rank}: unexpected connection claiming rank {peer}; dropped");
                continue;
            }
            Err(why) => {
                log::warn!("tcp rank {rank}: dropped a connection: {why}");
                continue;
            }
        };
        (&stream)
            .write_all(&my_hello)
            .map_err(|e| CommError::PeerLost {
                rank,
                op: "tcp accept".into(),
                peer,
                why: e.to_string(),
            })?;
        stream
            .set_read_timeout(None)
            .map_err(|e| io_err("accept", &e))?;
        streams[peer] = Some(stream);
        missing -= 1;
    }
    Ok(streams)
}

//! The wire format of one-sided writes and both ends of it: `send_frame`
//! writes a 32-byte header and the payload with one `sendmsg` (no copy of
//! the payload), and a receiver thread per peer reads headers, checks them
//! against the registered regions and reads each payload straight into the
//! region before raising the signal.

use std::io::{self, BufReader, IoSlice, Read};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Instant;

use super::state::{MAX_SIGNALS, Shared};
use crate::transport::{RegionId, SignalId};

const MAGIC: u32 = 0x5043_5457; // "PCTW"
/// The magic of the GOODBYE frame a transport sends every peer when it is
/// dropped: the rest of its header is zero and no payload follows.
const GOODBYE_MAGIC: u32 = 0x5043_5447; // "PCTG"
pub(crate) const HEADER_LEN: usize = 32;
/// Payloads below this size come through the receiver's buffer (fewer system
/// calls); larger ones are read straight into the region.
const READ_BUFFER: usize = 64 << 10;

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

    /// The header of a write, or `None` for a GOODBYE frame.
    fn decode(b: &[u8; HEADER_LEN]) -> Result<Option<Header>, String> {
        let word = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let long = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if word(0) == GOODBYE_MAGIC && b[4..].iter().all(|&x| x == 0) {
            return Ok(None);
        }
        if word(0) != MAGIC {
            return Err(format!("bad frame magic {:#x}", word(0)));
        }
        Ok(Some(Header {
            region: word(4),
            signal: word(8),
            offset: long(16),
            len: long(24),
        }))
    }
}

/// Writes `header` then `payload` as one frame; the caller holds the peer's
/// send lock. Uses `MSG_NOSIGNAL` so a dead peer is an error, not SIGPIPE.
pub(crate) fn send_frame(stream: &TcpStream, header: &[u8], payload: &[u8]) -> io::Result<()> {
    let mut storage = [IoSlice::new(header), IoSlice::new(payload)];
    let mut slices: &mut [IoSlice<'_>] = &mut storage;
    if payload.is_empty() {
        slices = &mut slices[..1];
    }
    while !slices.is_empty() {
        // SAFETY: an all-zero msghdr is valid (no name, no control data).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        // IoSlice is guaranteed ABI-compatible with iovec on Unix.
        msg.msg_iov = slices.as_mut_ptr().cast::<libc::iovec>();
        msg.msg_iovlen = slices.len().min(2) as _;
        // SAFETY: `msg` points at live iovecs describing borrowed, readable
        // memory; the fd is an open socket for the duration of the call.
        let sent = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if sent < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if sent == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "sendmsg wrote nothing",
            ));
        }
        IoSlice::advance_slices(&mut slices, sent as usize);
    }
    Ok(())
}

/// The receiver thread for `peer`: runs until the connection ends, then
/// records the loss (unless the transport is closing or the peer said
/// goodbye first).
pub(crate) fn run(shared: Arc<Shared>, peer: usize, stream: TcpStream) {
    receive(&shared, peer, stream);
    shared.peer_gone(peer);
}

fn receive(shared: &Shared, peer: usize, stream: TcpStream) {
    let mut reader = BufReader::with_capacity(READ_BUFFER, stream);
    // Regions are never unregistered, so (len, base) pairs stay valid.
    let mut regions: Vec<(usize, *mut u8)> = Vec::new();
    loop {
        let mut raw = [0u8; HEADER_LEN];
        if let Err(e) = reader.read_exact(&mut raw) {
            if shared.has_left(peer) {
                // The peer said goodbye: whatever ends the connection now
                // (its FIN, or a reset because it did not read our last
                // credits) is part of a clean exit.
                return;
            }
            let why = if e.kind() == io::ErrorKind::UnexpectedEof {
                "connection closed".to_string()
            } else {
                format!("receive failed: {e}")
            };
            shared.fail_lost(peer, why);
            return;
        }
        let header = match Header::decode(&raw) {
            Ok(Some(h)) => h,
            Ok(None) => {
                shared.peer_left(peer);
                continue;
            }
            Err(message) => return violation(shared, peer, &reader, message),
        };
        let id = header.region as usize;
        while regions.len() <= id {
            let deadline = Instant::now() + shared.timeout;
            match shared.region_when_registered(RegionId(regions.len() as u32), deadline) {
                Some(region) => regions.push(region),
                None => {
                    let message = format!(
                        "write to region {id}, which this rank has not registered (it has {})",
                        regions.len()
                    );
                    return violation(shared, peer, &reader, message);
                }
            }
        }
        let (len, base) = regions[id];
        let end = header.offset.checked_add(header.len);
        if end.is_none_or(|end| end > len as u64) {
            let message = format!(
                "write of {} bytes at offset {} overflows region {id} of {len} bytes",
                header.len, header.offset
            );
            return violation(shared, peer, &reader, message);
        }
        if header.signal as usize >= MAX_SIGNALS {
            let message = format!("signal {} is not below {MAX_SIGNALS}", header.signal);
            return violation(shared, peer, &reader, message);
        }
        // SAFETY: [offset, offset + len) lies inside the live region (checked
        // above; regions live as long as `shared`). By the transport contract
        // only this peer writes that range until it raises the signal, and
        // the local rank does not read it before the signal, so this is the
        // only reference to those bytes while it exists.
        let target = unsafe {
            std::slice::from_raw_parts_mut(base.add(header.offset as usize), header.len as usize)
        };
        if let Err(e) = reader.read_exact(target) {
            shared.fail_lost(
                peer,
                format!(
                    "connection failed in the middle of a {}-byte write: {e}",
                    header.len
                ),
            );
            return;
        }
        shared.raise(SignalId(header.signal));
    }
}

fn violation(shared: &Shared, peer: usize, reader: &BufReader<TcpStream>, message: String) {
    shared.fail_protocol(peer, message);
    // Close the connection so the peer fails too instead of writing on.
    let _ = reader.get_ref().shutdown(std::net::Shutdown::Both);
}

//! The sending end: one `sendmsg` per frame (header and payload from the
//! caller's slice, no copy), non-blocking so that a sender whose peer's
//! buffers are full reads its own connections while it waits for room (two
//! ranks writing large buffers to each other at once cannot deadlock, with
//! or without the progress thread), and a small per-peer queue of deferred
//! tiny writes (credits, acknowledgements, message headers), which go out
//! in front of the next frame to that peer, or when this rank waits, or
//! when it has been idle for a moment.

use std::io::{self, IoSlice};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use super::Inner;
use super::recv::poll_fds;

/// Writes of at most this many payload bytes may be deferred.
pub(crate) const DEFER_MAX: usize = 64;
/// A queue longer than this is sent at once.
pub(crate) const QUEUE_MAX: usize = 4096;

/// The sending state of one connection (under its mutex, held for a whole
/// frame so frames never interleave).
#[derive(Debug)]
pub(crate) struct Outbox {
    pub fd: RawFd,
    /// Deferred frames, complete (header and payload), in order.
    pub queue: Vec<u8>,
}

/// Sends `parts` (empty ones allowed) as consecutive bytes on `fd`, reading
/// this rank's connections while the socket has no room. Fails when the
/// socket fails, or when the peer accepted nothing for the transport's
/// timeout (a `TimedOut` error).
pub(crate) fn send_all(inner: &Inner, fd: RawFd, parts: &[&[u8]]) -> io::Result<()> {
    send_all_within(inner, fd, parts, inner.shared.timeout)
}

/// [`send_all`], failing once the peer accepted nothing for `stall`.
fn send_all_within(inner: &Inner, fd: RawFd, parts: &[&[u8]], stall: Duration) -> io::Result<()> {
    let mut storage: Vec<IoSlice<'_>> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| IoSlice::new(p))
        .collect();
    let mut slices: &mut [IoSlice<'_>] = &mut storage;
    let mut last_progress = Instant::now();
    let mut driving = false;
    let result = loop {
        if slices.is_empty() {
            break Ok(());
        }
        // SAFETY: an all-zero msghdr is valid (no name, no control data).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        // IoSlice is guaranteed ABI-compatible with iovec on Unix.
        msg.msg_iov = slices.as_mut_ptr().cast::<libc::iovec>();
        msg.msg_iovlen = slices.len() as _;
        // SAFETY: `msg` points at live iovecs describing borrowed, readable
        // memory; the fd is an open socket for the duration of the call.
        let sent = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
        if sent > 0 {
            IoSlice::advance_slices(&mut slices, sent as usize);
            last_progress = Instant::now();
            continue;
        }
        if sent == 0 {
            break Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "sendmsg wrote nothing",
            ));
        }
        let err = io::Error::last_os_error();
        match err.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => {}
            _ => break Err(err),
        }
        let stalled = last_progress.elapsed();
        if stalled >= stall {
            break Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the peer accepted no data for {stalled:?}"),
            ));
        }
        if !driving {
            inner.shared.enter();
            driving = true;
        }
        wait_for_room(inner, fd);
    };
    if driving {
        inner.shared.leave();
    }
    result
}

/// Waits (briefly) until `fd` can take more bytes, reading this rank's
/// connections meanwhile when no other thread is.
fn wait_for_room(inner: &Inner, fd: RawFd) {
    let shared = &inner.shared;
    match inner.inbox.try_lock() {
        Ok(mut inbox) => {
            shared.polling(true);
            inbox.poll(shared, Some(fd), Duration::from_millis(50));
            shared.polling(false);
            inbox.drain_all(shared);
        }
        Err(_) => {
            let mut fds = [libc::pollfd {
                fd,
                events: libc::POLLOUT,
                revents: 0,
            }];
            poll_fds(&mut fds, Duration::from_millis(1));
        }
    }
}

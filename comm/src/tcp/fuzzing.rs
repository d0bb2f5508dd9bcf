//! The receiving end of a connection, driven by bytes a test chooses: what
//! the fuzz target `frames` (in `fuzz/`) feeds arbitrary input to. Not part
//! of the transport's API.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use super::recv::Inbox;
use super::state::Shared;
use crate::transport::SignalId;

/// What the receiver made of a peer's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// How many frames completed (signals raised).
    pub frames: u64,
    /// The failure that closed the connection, if any (a protocol
    /// violation, or the connection ending in the middle of a frame).
    pub failure: Option<String>,
    /// Whether the peer said goodbye.
    pub left: bool,
}

/// Feeds `chunks` (what a peer sends, in that many pieces) to the reading
/// end of a connection whose rank registered regions of the lengths
/// `regions` (at most 16, each at most 1 MiB), then closes the connection;
/// returns what the reader made of it. Each chunk is at most 64 KiB (the
/// socket takes it without blocking).
///
/// # Panics
///
/// If a frame wrote outside its region (the bytes of a region's last page
/// past its length must stay zero), or on arguments beyond the bounds above.
pub fn receive(regions: &[usize], chunks: &[&[u8]]) -> Received {
    assert!(regions.len() <= 16 && regions.iter().all(|&l| l <= 1 << 20));
    assert!(chunks.iter().all(|c| c.len() <= 64 << 10));
    // Timeout zero: a write to a region not registered is refused at once.
    let shared = Shared::new(1, 2, Duration::ZERO).expect("eventfd");
    let mut bases = Vec::new();
    for &len in regions {
        let (_, base) = shared.register(len).expect("register");
        bases.push((len, base));
    }
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors.
    let rc = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) };
    assert_eq!(rc, 0, "socketpair: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors are fresh and owned here alone.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: plain syscall on a descriptor we own.
    unsafe {
        let size: libc::c_int = 1 << 20;
        libc::setsockopt(
            theirs.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    let mut inbox = Inbox::new(&[Some(ours.as_raw_fd()), None]);
    for chunk in chunks {
        // MSG_NOSIGNAL: the reader may have shut the connection down after
        // a violation (then the rest is not sent).
        // SAFETY: `chunk` is readable for its length; the fd is ours.
        let n = unsafe {
            libc::send(
                theirs.as_raw_fd(),
                chunk.as_ptr().cast(),
                chunk.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        if n != chunk.len() as isize {
            break;
        }
        inbox.drain_peer(&shared, 0);
    }
    drop(theirs);
    inbox.drain_peer(&shared, 0);
    for (len, base) in bases {
        let end = len.max(1).next_multiple_of(super::state::PAGE);
        // SAFETY: the region's allocation is `end` bytes from `base`, alive
        // as long as `shared`.
        let tail = unsafe { std::slice::from_raw_parts(base.add(len), end - len) };
        assert!(
            tail.iter().all(|&b| b == 0),
            "a frame wrote past the end of a {len}-byte region"
        );
    }
    let frames = (0..super::state::MAX_SIGNALS as u32)
        .filter_map(|s| shared.counter(SignalId(s)))
        .map(|c| c.load(std::sync::atomic::Ordering::SeqCst))
        .sum();
    Received {
        frames,
        failure: shared.failure_error("receive").map(|e| e.to_string()),
        left: shared.has_left(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::recv::Header;

    fn frame(region: u32, signal: u32, offset: u64, payload: &[u8]) -> Vec<u8> {
        let mut v = Header {
            region,
            signal,
            offset,
            len: payload.len() as u64,
        }
        .encode()
        .to_vec();
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn good_frames_complete_and_a_goodbye_is_a_clean_end() {
        let mut bytes = frame(0, 3, 8, &[1; 100]);
        bytes.extend(frame(1, 4, 0, &[2; 40_000]));
        bytes.extend(Header::goodbye());
        // Split at every awkward place: inside a header, inside a payload.
        let (a, rest) = bytes.split_at(17);
        let (b, c) = rest.split_at(20_000);
        let got = receive(&[4096, 40_000], &[a, b, c]);
        assert_eq!(
            got,
            Received {
                frames: 2,
                failure: None,
                left: true
            }
        );
    }

    /// An ABORT frame's reason is the failure every later call reports,
    /// and the goodbye after it is no clean departure.
    #[test]
    fn an_abort_frame_fails_the_receiver_with_its_reason() {
        let why = "rank 0: all_reduce: rank 1 called ×";
        let mut bytes = frame(0, 3, 0, &[1; 10]);
        bytes.extend(Header::abort(why.len()));
        bytes.extend(why.as_bytes());
        bytes.extend(Header::goodbye());
        // Split inside the abort header and inside its reason.
        let (a, rest) = bytes.split_at(10 + 32 + 5);
        let (b, c) = rest.split_at(32 + 10);
        let got = receive(&[4096], &[a, b, c]);
        assert_eq!(got.frames, 1);
        assert!(!got.left);
        let failure = got.failure.unwrap_or_default();
        assert!(
            failure.ends_with(&format!("peer rank 0 is gone: it failed: {why}")),
            "{failure}"
        );
        let mut long = Header::abort(1 << 20).to_vec();
        long.extend([b'x'; 64]);
        let got = receive(&[4096], &[&long]);
        assert!(
            got.failure
                .unwrap_or_default()
                .contains("an abort reason of 1048576 bytes")
        );
    }

    #[test]
    fn bad_frames_are_refused_with_what_is_wrong() {
        let cases: [(Vec<u8>, &str); 5] = [
            (vec![7; 32], "bad frame magic"),
            (
                frame(0, 0, 4000, &[1; 100]),
                "overflows region 0 of 4096 bytes",
            ),
            (
                frame(5, 0, 0, &[1; 4]),
                "region 5, which this rank has not registered",
            ),
            (frame(0, 5000, 0, &[1; 4]), "signal 5000 is not below 4096"),
            (frame(0, 0, 0, &[1; 4])[..30].to_vec(), "connection closed"),
        ];
        for (bytes, want) in cases {
            let got = receive(&[4096], &[&bytes]);
            let failure = got.failure.unwrap_or_default();
            assert!(failure.contains(want), "{want:?} not in {failure:?}");
        }
        let mut huge = Header {
            region: 0,
            signal: 0,
            offset: u64::MAX - 3,
            len: 8,
        }
        .encode()
        .to_vec();
        huge.extend([0; 8]);
        let got = receive(&[4096], &[&huge]);
        assert!(got.failure.unwrap().contains("overflows"));
    }
}

//! Shared-memory files mapped into this process, the bounds-checked view
//! collectives read their staging through, and the futex call: the unsafe
//! half of the shared-memory transport.

use std::fs::{self, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use crate::error::{CommError, Result};

/// One mapping of a shared-memory file.
#[derive(Debug)]
pub(super) struct Map {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
}

impl Map {
    pub(super) fn open(path: &str, len: usize, create: bool, rank: usize) -> Result<Map> {
        let io = |e: std::io::Error| CommError::Io {
            rank,
            op: "shm map".into(),
            message: format!("{path}: {e}"),
        };
        let file = if create {
            // A temporary name of this call's own, so that two processes
            // claiming the same file do not remove each other's.
            let tmp = format!("{path}.{:016x}.tmp", super::random_u64());
            // Private to this user (a job's activations and gradients pass
            // through these files), created new: a file or symlink planted
            // under the temporary name makes this fail rather than be
            // followed.
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp)
                .map_err(io)?;
            let placed = f.set_len(len as u64).and_then(|()| claim(&tmp, path, rank));
            let _ = fs::remove_file(&tmp);
            placed.map_err(io)?;
            f
        } else {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(path)
                .map_err(io)?;
            let meta = f.metadata().map_err(io)?;
            // SAFETY: geteuid has no preconditions.
            let me = unsafe { libc::geteuid() };
            if !meta.is_file() || meta.uid() != me {
                return Err(CommError::Io {
                    rank,
                    op: "shm map".into(),
                    message: format!(
                        "{path} is not a regular file of this user (uid {me}): a peer's \
                         shared-memory file must be; refusing to map it"
                    ),
                });
            }
            let got = meta.len() as usize;
            if got != len {
                return Err(CommError::Mismatch {
                    rank,
                    op: "register".into(),
                    message: format!("{path} has {got} bytes, this rank registered {len}"),
                });
            }
            f
        };
        let maplen = len.max(1);
        // SAFETY: a fresh shared mapping of a file we hold open, of its length (at least 1 byte).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                maplen,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io(std::io::Error::last_os_error()));
        }
        Ok(Map {
            ptr: ptr.cast(),
            len,
        })
    }

    pub(super) fn word(&self, index: usize) -> &AtomicU64 {
        assert!(index * 8 + 8 <= self.len);
        // SAFETY: in bounds (checked), 8-aligned (page-aligned base), shared memory is only accessed atomically at these offsets.
        unsafe { &*(self.ptr.add(index * 8) as *const AtomicU64) }
    }
}

/// Gives the file at `tmp` the name `path`, which must be free: job names
/// are unique, so a regular file of this user there is another process's
/// or thread's of this job that took the same rank (a rank given twice),
/// which fails naming it; anything else there (a planted symlink, another
/// user's file) is replaced, not followed. The caller removes `tmp`.
fn claim(tmp: &str, path: &str, rank: usize) -> std::io::Result<()> {
    match fs::hard_link(tmp, path) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        other => return other,
    }
    let meta = fs::symlink_metadata(path)?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.is_file() && meta.uid() == me {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!(
                "it exists already: another process or thread of this job has taken rank \
                 {rank} (a rank given twice); give each rank a number of its own"
            ),
        ));
    }
    fs::remove_file(path)?;
    fs::hard_link(tmp, path)
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `open`; no references outlive `self`.
        unsafe { libc::munmap(self.ptr.cast(), self.len.max(1)) };
    }
}

/// A bounds-checked view of this rank's copy of a registered region.
///
/// Reading is sound under the collectives' protocol: a peer writes a staging
/// slot only after this rank returned the credit for it.
#[derive(Debug, Clone, Copy)]
pub struct RegionView {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the view points into a mapping that lives as long as the transport; access is coordinated by signals.
unsafe impl Send for RegionView {}
// SAFETY: as above; the view only hands out shared slices.
unsafe impl Sync for RegionView {}

impl RegionView {
    /// Wraps the pointer [`crate::transport::Transport::register`] returned for `len` bytes.
    ///
    /// # Safety
    /// `ptr` must be valid for `len` bytes for as long as the view is used.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> RegionView {
        RegionView { ptr, len }
    }

    /// Bytes `offset..offset + len` of the region.
    pub fn bytes(&self, offset: usize, len: usize) -> &[u8] {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "region view out of bounds"
        );
        // SAFETY: in bounds of a live mapping (constructor contract); peers do not write while the slot is held.
        unsafe { std::slice::from_raw_parts(self.ptr.add(offset), len) }
    }
}

/// Waits on (`FUTEX_WAIT`) or wakes (`FUTEX_WAKE`) the low 32 bits of a
/// shared counter; shared (not private) futexes work across processes.
pub(super) fn futex(word: &AtomicU64, op: libc::c_int, val: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: the futex word is the low half (little-endian) of a live, aligned shared atomic; `tsp` is null or points to `ts`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr() as *const u32,
            op,
            val,
            tsp,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
}

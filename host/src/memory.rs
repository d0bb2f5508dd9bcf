//! Device memory owned by the host: a [`Buffer`] frees itself through its
//! plugin's table when the last reference goes.

use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::Ordering;

use crate::device::Device;
use crate::error::Result;

/// What frees a [`Buffer`]'s memory when it is dropped.
enum Release {
    /// The plugin's `mem_free`: the buffer came from `mem_alloc`.
    Plugin,
    /// The owner's callback: the memory belongs to someone else (a DLPack
    /// producer) and is only borrowed.
    Foreign(Mutex<Option<Box<dyn FnOnce() + Send>>>),
}

/// A device allocation, or device memory borrowed from another owner.
pub struct Buffer {
    device: Device,
    ptr: *mut c_void,
    bytes: u64,
    release: Release,
    /// Its serial among the device's borrowed buffers (foreign ones).
    borrowed: Option<u64>,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("device", &self.device)
            .field("ptr", &self.ptr)
            .field("bytes", &self.bytes)
            .field("foreign", &matches!(self.release, Release::Foreign(_)))
            .finish()
    }
}

// SAFETY: a device address is an opaque token the host never dereferences
// (except for host-visible memory, through explicit copies); plugin functions
// are thread-safe per the ABI.
unsafe impl Send for Buffer {}
// SAFETY: as above.
unsafe impl Sync for Buffer {}

impl Buffer {
    pub(crate) fn alloc(device: &Device, bytes: u64) -> Result<Buffer> {
        let ptr = device.plugin().mem_alloc(device.index(), bytes)?;
        if let Some(u) = device.plugin().usage.get(device.index() as usize) {
            let now = u.in_use.fetch_add(bytes, Ordering::Relaxed) + bytes;
            u.peak.fetch_max(now, Ordering::Relaxed);
            // (An empty allocation holds no address, and may share one
            // with a real one: it is not kept.)
            if !ptr.is_null() && bytes > 0 {
                lock(&u.live).allocations.insert(ptr as usize, bytes);
            }
        }
        Ok(Buffer {
            device: device.clone(),
            ptr,
            bytes,
            release: Release::Plugin,
            borrowed: None,
        })
    }

    /// `bytes` of `device`'s memory at `ptr` that another owner allocated
    /// (a tensor imported through DLPack): the host uses it like its own and
    /// calls `release` instead of freeing it when the last reference goes.
    ///
    /// # Safety
    /// `ptr..ptr + bytes` is memory of `device` (an address its plugin's
    /// operators and copies accept) that stays valid until `release` runs.
    pub unsafe fn foreign(
        device: &Device,
        ptr: *mut c_void,
        bytes: u64,
        release: Box<dyn FnOnce() + Send>,
    ) -> Buffer {
        let borrowed = device.plugin().usage.get(device.index() as usize).map(|u| {
            let mut live = lock(&u.live);
            let serial = live.serial;
            live.serial += 1;
            live.borrowed.insert((ptr as usize, serial), bytes);
            serial
        });
        Buffer {
            device: device.clone(),
            ptr,
            bytes,
            release: Release::Foreign(Mutex::new(Some(release))),
            borrowed,
        }
    }

    /// The device it lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Its device address (NULL for an empty buffer).
    pub fn ptr(&self) -> *mut c_void {
        self.ptr
    }

    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        self.bytes
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `ptr..ptr + bytes` lies inside one live allocation the host made
/// on `device` (an empty range: at any address).
pub(crate) fn inside_live_allocation(device: &Device, ptr: *const c_void, bytes: u64) -> bool {
    if bytes == 0 {
        return true;
    }
    let Some(u) = device.plugin().usage.get(device.index() as usize) else {
        return false;
    };
    let at = ptr as usize;
    let holds = |start: usize, len: u64| {
        let into = (at - start) as u64;
        into <= len && len - into >= bytes
    };
    let live = lock(&u.live);
    // Allocations do not overlap: only the last one starting at or before
    // `at` can hold it. Borrowed buffers may: each starting there is asked.
    live.allocations
        .range(..=at)
        .next_back()
        .is_some_and(|(&start, &len)| holds(start, len))
        || live
            .borrowed
            .range(..=(at, u64::MAX))
            .rev()
            .any(|(&(start, _), &len)| holds(start, len))
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let usage = self.device.plugin().usage.get(self.device.index() as usize);
        if let (Some(u), Some(serial)) = (usage, self.borrowed) {
            lock(&u.live).borrowed.remove(&(self.ptr as usize, serial));
        }
        if let Release::Foreign(release) = &self.release {
            let release = release.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(release) = release {
                release();
            }
            return;
        }
        if let Some(u) = usage {
            u.in_use.fetch_sub(self.bytes, Ordering::Relaxed);
            if !self.ptr.is_null() && self.bytes > 0 {
                lock(&u.live).allocations.remove(&(self.ptr as usize));
            }
        }
        if self.ptr.is_null() {
            return;
        }
        // SAFETY: the pointer came from mem_alloc on this device; every stream
        // that used it holds an Arc to the buffer until it synchronizes, so no
        // work still uses it.
        if let Err(e) = unsafe { self.device.plugin().mem_free(self.device.index(), self.ptr) } {
            log::error!("freeing {} bytes on {}: {e}", self.bytes, self.device);
        }
    }
}

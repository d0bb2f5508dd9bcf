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
            // (An empty allocation holds no address, and may share one
            // with a real one: it is not kept.)
            if !ptr.is_null() && bytes > 0 {
                let mut live = lock(&u.live);
                if let Some(what) = overlap(&live.allocations, ptr as usize, bytes) {
                    // Not freed: freeing it could free the memory of the
                    // buffer it overlaps. Until 2026-12-06 two buffers
                    // shared it, and each overwrote the other's values.
                    return Err(crate::error::HostError::Contract {
                        plugin: device.plugin().vendor().to_string(),
                        function: "mem_alloc",
                        what: format!("returned {bytes} bytes at {ptr:p} for {device}, {what}"),
                    });
                }
                live.allocations.insert(ptr as usize, bytes);
            }
            let now = u.in_use.fetch_add(bytes, Ordering::Relaxed) + bytes;
            u.peak.fetch_max(now, Ordering::Relaxed);
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

/// Why `bytes` at `at` cannot be a new allocation among the live
/// `allocations` (which do not overlap): they pass the end of the address
/// space, or overlap one still in use.
fn overlap(
    allocations: &std::collections::BTreeMap<usize, u64>,
    at: usize,
    bytes: u64,
) -> Option<String> {
    let Some(end) = u64::try_from(at)
        .ok()
        .and_then(|a| a.checked_add(bytes))
        .and_then(|e| usize::try_from(e).ok())
    else {
        return Some("which pass the end of the address space".into());
    };
    // The last allocation starting before `end` is the only one that can
    // reach into [at, end).
    let (&start, &len) = allocations.range(..end).next_back()?;
    let other_end = start as u64 + len;
    (other_end > at as u64).then(|| {
        format!(
            "which overlap the {len} bytes at {:p} it returned before and that are still in \
             use (two buffers would share memory)",
            start as *const u8
        )
    })
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

/// What a dropped [`Buffer`] still has to do (free its memory, or call its
/// owner's release) once nothing borrows inside its range.
pub(crate) struct Deferred {
    start: usize,
    bytes: u64,
    action: Box<dyn FnOnce() + Send>,
}

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Deferred({:#x}, {} bytes)", self.start, self.bytes)
    }
}

/// Whether a borrowed range of `live` overlaps `start..start + bytes`.
fn borrowed_inside(
    borrowed: &std::collections::BTreeMap<(usize, u64), u64>,
    start: usize,
    bytes: u64,
) -> bool {
    let end = start as u128 + u128::from(bytes);
    borrowed.iter().any(|(&(at, _), &len)| {
        len > 0 && (at as u128) < end && at as u128 + u128::from(len) > start as u128
    })
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let usage = self.device.plugin().usage.get(self.device.index() as usize);
        let (start, bytes) = (self.ptr as usize, self.bytes);
        // What freeing it means: the owner's release, or the plugin's free.
        let action: Option<Box<dyn FnOnce() + Send>> = match &self.release {
            Release::Foreign(release) => release
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .map(|r| Box::new(r) as Box<dyn FnOnce() + Send>),
            Release::Plugin => {
                let device = self.device.clone();
                Some(Box::new(move || {
                    if let Some(u) = device.plugin().usage.get(device.index() as usize) {
                        u.in_use.fetch_sub(bytes, Ordering::Relaxed);
                    }
                    if start == 0 {
                        return;
                    }
                    let ptr = start as *mut c_void;
                    // SAFETY: the pointer came from mem_alloc on this device;
                    // every stream that used it holds an Arc to the buffer
                    // until it synchronizes, and nothing borrows inside it
                    // any more, so no work still uses it.
                    if let Err(e) = unsafe { device.plugin().mem_free(device.index(), ptr) } {
                        log::error!("freeing {bytes} bytes on {device}: {e}");
                    }
                }))
            }
        };
        let Some(u) = usage else {
            if let Some(action) = action {
                action();
            }
            return;
        };
        let mut ready = Vec::new();
        {
            let mut live = lock(&u.live);
            if let Some(serial) = self.borrowed {
                live.borrowed.remove(&(start, serial));
            }
            if matches!(self.release, Release::Plugin) && !self.ptr.is_null() && bytes > 0 {
                live.allocations.remove(&start);
            }
            // Memory a DLPack import borrows inside this buffer stays until
            // the import is gone (an import of memory polychip allocated,
            // whose capsule keeps nothing alive, read the next allocation
            // that took the freed address).
            if let Some(action) = action {
                if bytes > 0 && borrowed_inside(&live.borrowed, start, bytes) {
                    live.deferred.push(Deferred {
                        start,
                        bytes,
                        action,
                    });
                } else {
                    ready.push(action);
                }
            }
            // This borrower's end may release buffers that waited for it.
            if self.borrowed.is_some() && !live.deferred.is_empty() {
                let waiting = std::mem::take(&mut live.deferred);
                for d in waiting {
                    if borrowed_inside(&live.borrowed, d.start, d.bytes) {
                        live.deferred.push(d);
                    } else {
                        ready.push(d.action);
                    }
                }
            }
        }
        for action in ready {
            action();
        }
    }
}

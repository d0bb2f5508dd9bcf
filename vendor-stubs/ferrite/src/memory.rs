//! Device memory. A Ferrite device's memory is ordinary host memory from the
//! global allocator, 64-byte aligned, with a per-device capacity. Each device
//! keeps a map of its live allocations (base address -> size) so that `free`
//! of a pointer it never handed out is an error rather than undefined
//! behaviour, and so that copies and operators can cheaply check that the
//! bytes they touch lie inside one live allocation (a `BTreeMap` range query
//! under a read lock, released before any data moves).
//!
//! Freed blocks are kept in a per-device cache by size and handed out again
//! to allocations of the same size, as a GPU driver's memory pool does: a
//! training step frees and allocates the same activation sizes every
//! micro-batch, and returning them to the system allocator each time makes
//! large blocks go back to the kernel and fault in again (a 20% slower step
//! on the bundled model, depending on the allocator's history). The cache
//! holds at most a quarter of the device's capacity; cached blocks are not
//! live (freeing or touching one is still an error) and do not count as
//! used.

use std::alloc::{Layout, alloc, dealloc};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use polychip_plugin_sdk::{Error, Result};

/// Alignment of every allocation (the ABI asks for at least 64).
pub const ALIGN: usize = 64;

/// The memory of every device.
#[derive(Debug)]
pub struct Memory {
    devices: Vec<DeviceMemory>,
}

#[derive(Debug)]
struct DeviceMemory {
    capacity: u64,
    live: RwLock<Live>,
    cache: Mutex<Cache>,
}

/// Freed blocks kept for reuse: size -> base addresses.
#[derive(Debug, Default)]
struct Cache {
    blocks: HashMap<usize, Vec<usize>>,
    bytes: u64,
}

#[derive(Debug, Default)]
struct Live {
    /// Bytes allocated or being allocated.
    used: u64,
    /// Base address -> size in bytes.
    allocations: BTreeMap<usize, usize>,
}

impl Live {
    /// The live allocation containing `addr`, as `(base, size)`.
    fn containing(&self, addr: usize) -> Option<(usize, usize)> {
        let (&base, &size) = self.allocations.range(..=addr).next_back()?;
        (addr - base < size).then_some((base, size))
    }

    /// Whether `[start, end)` (non-empty) lies inside one live allocation.
    fn covers(&self, start: usize, end: usize) -> bool {
        self.containing(start)
            .is_some_and(|(base, size)| end - base <= size)
    }
}

impl Cache {
    /// A cached block of exactly `size` bytes.
    fn take(&mut self, size: usize) -> Option<usize> {
        let addr = self.blocks.get_mut(&size)?.pop()?;
        self.bytes -= size as u64;
        Some(addr)
    }

    /// Keeps a freed block unless the cache would exceed `limit` bytes.
    fn keep(&mut self, addr: usize, size: usize, limit: u64) -> bool {
        if self.bytes + size as u64 > limit {
            return false;
        }
        self.blocks.entry(size).or_default().push(addr);
        self.bytes += size as u64;
        true
    }
}

impl Memory {
    /// `devices` devices of `capacity` bytes each.
    pub fn new(devices: u32, capacity: u64) -> Memory {
        Memory {
            devices: (0..devices)
                .map(|_| DeviceMemory {
                    capacity,
                    live: RwLock::default(),
                    cache: Mutex::default(),
                })
                .collect(),
        }
    }

    fn device(&self, device: u32) -> Result<&DeviceMemory> {
        self.devices.get(device as usize).ok_or_else(|| {
            Error::invalid(format!(
                "Ferrite has no device {device} ({} devices)",
                self.devices.len()
            ))
        })
    }

    fn read(&self, device: u32) -> Result<RwLockReadGuard<'_, Live>> {
        Ok(self
            .device(device)?
            .live
            .read()
            .unwrap_or_else(PoisonError::into_inner))
    }

    fn write(&self, device: u32) -> Result<RwLockWriteGuard<'_, Live>> {
        Ok(self
            .device(device)?
            .live
            .write()
            .unwrap_or_else(PoisonError::into_inner))
    }

    /// Allocates `bytes` (> 0) uninitialised bytes aligned to [`ALIGN`] on
    /// `device`.
    pub fn alloc(&self, device: u32, bytes: u64) -> Result<*mut u8> {
        if bytes == 0 {
            return Err(Error::invalid("mem_alloc: Ferrite cannot allocate 0 bytes"));
        }
        let capacity = self.device(device)?.capacity;
        // Reserve the bytes first, so the system allocator runs without the lock.
        {
            let mut live = self.write(device)?;
            if bytes > capacity - live.used {
                return Err(Error::out_of_memory(format!(
                    "mem_alloc: Ferrite device {device} cannot allocate {bytes} bytes: \
                     {} of its {capacity} bytes are in use",
                    live.used
                )));
            }
            live.used += bytes;
        }
        let unreserve = |why: &str| {
            let mut live = self.write(device)?;
            live.used -= bytes;
            Err(Error::out_of_memory(format!(
                "mem_alloc: Ferrite device {device} cannot allocate {bytes} bytes: {why} \
                 ({} of its {capacity} bytes are in use)",
                live.used
            )))
        };
        let Some(layout) = usize::try_from(bytes)
            .ok()
            .and_then(|size| Layout::from_size_align(size, ALIGN).ok())
        else {
            return unreserve("the size exceeds the address space");
        };
        let cached = self
            .device(device)?
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take(layout.size());
        // SAFETY: the layout has a non-zero size (bytes > 0 was checked above).
        let ptr = cached.map_or_else(|| unsafe { alloc(layout) }, |addr| addr as *mut u8);
        if ptr.is_null() {
            return unreserve("the host allocator is out of memory");
        }
        self.write(device)?
            .allocations
            .insert(ptr as usize, layout.size());
        Ok(ptr)
    }

    /// Frees an allocation of `device`; a pointer that is not the base of one
    /// of its live allocations is an [`Error::invalid`] and changes nothing.
    pub fn free(&self, device: u32, ptr: *mut u8) -> Result<()> {
        let addr = ptr as usize;
        let mut live = self.write(device)?;
        let Some(size) = live.allocations.remove(&addr) else {
            let why = match live.containing(addr) {
                Some((base, size)) => format!(
                    "it points inside the allocation at {base:#x} of {size} bytes, not at its start"
                ),
                None => match self.owner(device, addr) {
                    Some(other) => format!("it belongs to device {other}"),
                    None => {
                        "it is not a live allocation (never allocated, or already freed)".to_owned()
                    }
                },
            };
            return Err(Error::invalid(format!(
                "mem_free: cannot free {ptr:p} on Ferrite device {device}: {why}"
            )));
        };
        live.used -= size as u64;
        drop(live);
        let dev = self.device(device)?;
        let kept = dev
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keep(addr, size, dev.capacity / 4);
        if !kept {
            // SAFETY: `addr` was returned by `alloc` with this layout (size and
            // ALIGN were valid then) and was live until removed from the map
            // just now, so it is freed exactly once.
            unsafe { dealloc(ptr, Layout::from_size_align_unchecked(size, ALIGN)) };
        }
        Ok(())
    }

    /// Another device whose live allocations contain `addr`.
    fn owner(&self, except: u32, addr: usize) -> Option<u32> {
        (0..self.devices.len() as u32)
            .filter(|&d| d != except)
            .find(|&d| {
                self.devices[d as usize]
                    .live
                    .try_read()
                    .is_ok_and(|live| live.containing(addr).is_some())
            })
    }

    /// Checks that each non-empty byte range `[start, end)` lies inside one
    /// live allocation of `device`, under a single lock; on failure returns the
    /// index of the first range that does not.
    pub fn check(&self, device: u32, ranges: &[(usize, usize)]) -> Result<(), usize> {
        let Ok(live) = self.read(device) else {
            return Err(0);
        };
        match ranges
            .iter()
            .position(|&(start, end)| start < end && !live.covers(start, end))
        {
            Some(bad) => Err(bad),
            None => Ok(()),
        }
    }

    /// Bytes in use on `device`.
    #[cfg(test)]
    pub fn used(&self, device: u32) -> u64 {
        self.read(device).map_or(0, |live| live.used)
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        for device in &mut self.devices {
            let cache = device
                .cache
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner);
            for (&size, addrs) in &cache.blocks {
                for &addr in addrs {
                    // SAFETY: a cached block was made by `alloc` with this
                    // layout and is not live, so it is freed once, here.
                    unsafe {
                        dealloc(
                            addr as *mut u8,
                            Layout::from_size_align_unchecked(size, ALIGN),
                        )
                    };
                }
            }
            let live = device
                .live
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner);
            for (&addr, &size) in &live.allocations {
                // SAFETY: every entry is a live allocation made by `alloc` with
                // this layout; the map is dropped with the memory, so each is
                // freed once.
                unsafe {
                    dealloc(
                        addr as *mut u8,
                        Layout::from_size_align_unchecked(size, ALIGN),
                    )
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use polychip_plugin_sdk::ErrorCode;

    #[test]
    fn accounting_and_out_of_memory() {
        let memory = Memory::new(2, 1000);
        let a = memory.alloc(0, 600).unwrap();
        assert_eq!(a as usize % ALIGN, 0);
        assert_eq!(memory.used(0), 600);
        assert_eq!(memory.used(1), 0);

        let err = memory.alloc(0, 401).unwrap_err();
        assert_eq!(err.code, ErrorCode::OutOfMemory);
        for needle in ["device 0", "401 bytes", "600", "1000"] {
            assert!(err.message.contains(needle), "{needle} in {}", err.message);
        }
        assert_eq!(memory.used(0), 600, "a failed allocation takes nothing");

        // The other device has its own capacity.
        let c = memory.alloc(1, 1000).unwrap();
        let b = memory.alloc(0, 400).unwrap();
        assert_eq!(memory.used(0), 1000);
        // SAFETY: both allocations are 400+ bytes and nothing else uses them.
        unsafe {
            b.write_bytes(7, 400);
            a.write_bytes(1, 600);
        }
        memory.free(0, a).unwrap();
        assert_eq!(memory.used(0), 400);
        let a = memory.alloc(0, 600).unwrap();
        memory.free(0, a).unwrap();
        memory.free(0, b).unwrap();
        memory.free(1, c).unwrap();
        assert_eq!((memory.used(0), memory.used(1)), (0, 0));
        assert_eq!(
            memory.alloc(0, u64::MAX).unwrap_err().code,
            ErrorCode::OutOfMemory
        );
        assert_eq!(
            memory.alloc(0, 0).unwrap_err().code,
            ErrorCode::InvalidArgument
        );
    }

    #[test]
    fn huge_capacity_beyond_the_address_space_is_out_of_memory() {
        let memory = Memory::new(1, u64::MAX);
        let err = memory.alloc(0, u64::MAX - 10).unwrap_err();
        assert_eq!(err.code, ErrorCode::OutOfMemory);
        assert_eq!(memory.used(0), 0);
    }

    #[test]
    fn free_of_unknown_pointers_is_an_error() {
        let memory = Memory::new(2, 1 << 20);
        let a = memory.alloc(0, 256).unwrap();
        let mut local = [0u8; 16];
        let err = memory.free(0, local.as_mut_ptr()).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        assert!(
            err.message.contains("not a live allocation"),
            "{}",
            err.message
        );

        let err = memory.free(0, a.wrapping_add(8)).unwrap_err();
        assert!(
            err.message.contains("inside the allocation"),
            "{}",
            err.message
        );

        let err = memory.free(1, a).unwrap_err();
        assert!(
            err.message.contains("belongs to device 0"),
            "{}",
            err.message
        );
        assert_eq!(memory.used(0), 256);

        memory.free(0, a).unwrap();
        let err = memory.free(0, a).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArgument, "double free");
        assert_eq!(memory.used(0), 0);
    }

    #[test]
    fn ranges_must_lie_in_one_live_allocation() {
        let memory = Memory::new(1, 1 << 20);
        let a = memory.alloc(0, 128).unwrap() as usize;
        let b = memory.alloc(0, 128).unwrap() as usize;
        assert_eq!(memory.check(0, &[(a, a + 128), (b + 64, b + 128)]), Ok(()));
        assert_eq!(memory.check(0, &[(a, a + 128), (b, b + 129)]), Err(1));
        assert_eq!(memory.check(0, &[(a - 1, a + 4)]), Err(0));
        // Empty ranges are not checked.
        assert_eq!(memory.check(0, &[(7, 7)]), Ok(()));
        memory.free(0, b as *mut u8).unwrap();
        assert_eq!(memory.check(0, &[(b, b + 1)]), Err(0));
        // Allocation `a` is left live; dropping `memory` frees it.
    }

    #[test]
    fn freed_blocks_are_reused_but_not_live() {
        let memory = Memory::new(1, 4000);
        let a = memory.alloc(0, 500).unwrap();
        memory.free(0, a).unwrap();
        assert_eq!(memory.used(0), 0);
        assert!(memory.check(0, &[(a as usize, a as usize + 1)]).is_err());
        assert!(memory.free(0, a).is_err(), "a cached block is not live");
        let b = memory.alloc(0, 500).unwrap();
        assert_eq!(a, b, "the same size reuses the block");
        assert_eq!(memory.used(0), 500);
        // The cache keeps at most a quarter of the capacity (1000 bytes).
        let c = memory.alloc(0, 1200).unwrap();
        memory.free(0, c).unwrap();
        memory.free(0, b).unwrap();
        let d = memory.alloc(0, 500).unwrap();
        assert_eq!(d, b);
        memory.free(0, d).unwrap();
    }
}

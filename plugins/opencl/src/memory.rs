//! Device memory: OpenCL buffers behind the ABI's device addresses.
//!
//! An OpenCL buffer has no address the host can see, so the plugin gives
//! each one a range of a virtual address space of its own: device `d` owns
//! `[(d + 1) << 44, (d + 2) << 44)`, allocations are placed first-fit in it
//! with a 4 KiB gap between neighbours (so one allocation's end is never
//! another's start), and freed ranges are reused. The host and the
//! frameworks above it treat these as opaque device pointers: they add
//! byte offsets (views) and hand them back, and [`Memory::resolve`] turns an
//! address back into its buffer and the byte offset inside it. Nothing ever
//! dereferences them; the devices report their memory as private.
//!
//! The plugin also keeps the device's total within
//! `CL_DEVICE_GLOBAL_MEM_SIZE` and every allocation within
//! `CL_DEVICE_MAX_MEM_ALLOC_SIZE`, so that running out is an
//! `OUT_OF_MEMORY` with those figures rather than a driver's late failure.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use cl3::memory::{CL_MEM_READ_WRITE, create_buffer, release_mem_object};
use cl3::types::cl_mem;
use polychip_plugin_sdk::{Error, Result};

use crate::driver::{Device, cl_error};

/// The size of each device's address range.
const RANGE: u64 = 1 << 44;
/// The gap kept between allocations.
const GAP: u64 = 4096;

/// An OpenCL buffer, released when the last holder drops it (a queued
/// command also holds the driver's own reference, so releasing while work
/// is in flight is safe: OpenCL frees it when that work is done).
#[derive(Debug)]
pub struct Buffer {
    /// The driver's object.
    pub mem: cl_mem,
    /// Its size in bytes.
    pub bytes: u64,
}

// SAFETY: cl_mem objects are thread-safe (OpenCL 1.2 appendix A.2).
unsafe impl Send for Buffer {}
// SAFETY: as above.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// A new read-write buffer of `bytes` bytes on `device`'s context.
    pub fn new(device: &Device, bytes: u64) -> Result<Buffer> {
        let size = usize::try_from(bytes)
            .map_err(|_| Error::out_of_memory(format!("{bytes} bytes exceed the address space")))?;
        // SAFETY: a plain device buffer with no host pointer.
        let mem = unsafe {
            create_buffer(
                device.context.get(),
                CL_MEM_READ_WRITE,
                size,
                std::ptr::null_mut(),
            )
        }
        .map_err(|e| cl_error(&format!("clCreateBuffer of {bytes} bytes"), e))?;
        Ok(Buffer { mem, bytes })
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: `mem` is a buffer this object created and owns.
        if let Err(e) = unsafe { release_mem_object(self.mem) } {
            log::warn!("opencl: clReleaseMemObject failed: {e}");
        }
    }
}

/// A device address resolved to its allocation.
#[derive(Debug, Clone)]
pub struct Place {
    /// The allocation's buffer.
    pub buffer: Arc<Buffer>,
    /// Bytes from the buffer's start to the address.
    pub offset: u64,
}

#[derive(Debug, Default)]
struct Space {
    /// Live allocations by base address.
    live: BTreeMap<u64, Arc<Buffer>>,
    /// Bytes allocated.
    used: u64,
}

/// The address spaces of every device.
#[derive(Debug)]
pub struct Memory {
    spaces: Vec<Mutex<Space>>,
}

fn base_of(device: u32) -> u64 {
    (u64::from(device) + 1) * RANGE
}

impl Memory {
    /// Empty address spaces for `devices` devices.
    pub fn new(devices: usize) -> Memory {
        Memory {
            spaces: (0..devices).map(|_| Mutex::default()).collect(),
        }
    }

    fn space(&self, device: u32) -> std::sync::MutexGuard<'_, Space> {
        self.spaces[device as usize]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Allocates `bytes` on `device` (plugin index `index`).
    pub fn alloc(&self, index: u32, device: &Device, bytes: u64) -> Result<*mut u8> {
        let info = &device.info;
        if bytes > info.max_alloc {
            return Err(Error::out_of_memory(format!(
                "opencl: device {index} ({}): {bytes} bytes exceed the driver's largest \
                 allocation (CL_DEVICE_MAX_MEM_ALLOC_SIZE = {} bytes)",
                info.name, info.max_alloc
            )));
        }
        let rounded = bytes.div_ceil(64) * 64;
        {
            let space = self.space(index);
            if space.used.saturating_add(rounded) > info.memory_bytes {
                return Err(Error::out_of_memory(format!(
                    "opencl: device {index} ({}): {bytes} bytes requested but only {} of its {} \
                     bytes are free",
                    info.name,
                    info.memory_bytes - space.used,
                    info.memory_bytes
                )));
            }
        }
        let buffer = Arc::new(Buffer::new(device, bytes)?);
        let mut space = self.space(index);
        let base = base_of(index);
        // First fit: the lowest gap between live ranges that holds `rounded`.
        let mut cursor = base + GAP;
        for (&start, buf) in &space.live {
            if start >= cursor + rounded + GAP {
                break;
            }
            cursor = start + buf.bytes.div_ceil(64) * 64 + GAP;
        }
        if cursor + rounded > base + RANGE {
            return Err(Error::out_of_memory(format!(
                "opencl: device {index}: its address range is exhausted"
            )));
        }
        space.used += rounded;
        space.live.insert(cursor, buffer);
        Ok(cursor as *mut u8)
    }

    /// Frees the allocation at `ptr`.
    pub fn free(&self, index: u32, ptr: *mut u8) -> Result<()> {
        let mut space = self.space(index);
        match space.live.remove(&(ptr as u64)) {
            Some(buffer) => {
                space.used -= buffer.bytes.div_ceil(64) * 64;
                Ok(())
            }
            None => Err(Error::invalid(format!(
                "opencl: mem_free: {ptr:p} is not the start of a live allocation of device {index}"
            ))),
        }
    }

    /// The allocation holding `[addr, addr + bytes)` on `device`, and the
    /// offset of `addr` in it; `what` names the tensor or copy side in the
    /// error when there is none.
    pub fn resolve(&self, index: u32, addr: u64, bytes: u64, what: &str) -> Result<Place> {
        let space = self.space(index);
        let found = space.live.range(..=addr).next_back();
        match found {
            Some((&start, buffer))
                if addr - start <= buffer.bytes && bytes <= buffer.bytes - (addr - start) =>
            {
                Ok(Place {
                    buffer: Arc::clone(buffer),
                    offset: addr - start,
                })
            }
            _ => Err(Error::invalid(format!(
                "opencl: {what}: the {bytes} byte(s) at {addr:#x} are not inside one live \
                 allocation of device {index}"
            ))),
        }
    }
}

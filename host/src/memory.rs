//! Device memory owned by the host: a [`Buffer`] frees itself through its
//! plugin's table when the last reference goes.

use std::ffi::c_void;

use crate::device::Device;
use crate::error::Result;

/// A device allocation.
#[derive(Debug)]
pub struct Buffer {
    device: Device,
    ptr: *mut c_void,
    bytes: u64,
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
        Ok(Buffer {
            device: device.clone(),
            ptr,
            bytes,
        })
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

impl Drop for Buffer {
    fn drop(&mut self) {
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

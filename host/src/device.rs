//! A device of some plugin, and the ways to put memory and work on it.

use std::fmt;
use std::sync::Arc;

use polychip_plugin_sdk::{DType, DeviceProps};

use crate::element::Element;
use crate::error::{HostError, Result};
use crate::ffi::Plugin;
use crate::memory::Buffer;
use crate::ops::Exec;
use crate::stream::Stream;
use crate::tensor::Tensor;

/// One device of one loaded plugin. Cheap to clone.
#[derive(Clone)]
pub struct Device {
    plugin: Arc<Plugin>,
    index: u32,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({self})")
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.plugin.vendor(), self.index)
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.plugin, &other.plugin) && self.index == other.index
    }
}
impl Eq for Device {}

impl Device {
    pub(crate) fn new(plugin: Arc<Plugin>, index: u32) -> Device {
        Device { plugin, index }
    }

    /// The plugin that drives it.
    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.plugin
    }

    /// Its index within its plugin.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Its properties, as reported at load time.
    pub fn props(&self) -> &DeviceProps {
        &self.plugin.devices()[self.index as usize]
    }

    /// Whether `ptr..ptr + bytes` lies inside one live allocation this
    /// host made on this device (what an address handed in from outside,
    /// a DLPack import's, must be; an empty range always does).
    pub fn holds(&self, ptr: *const std::ffi::c_void, bytes: u64) -> bool {
        crate::memory::inside_live_allocation(self, ptr, bytes)
    }

    /// Bytes of device memory the host's buffers on this device hold now
    /// (allocations made through this host; not the plugin's own
    /// workspace, nor memory borrowed through DLPack).
    pub fn memory_in_use(&self) -> u64 {
        self.usage()
            .in_use
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The most [`Self::memory_in_use`] has been since the plugin loaded or
    /// since [`Self::reset_peak_memory`].
    pub fn peak_memory_in_use(&self) -> u64 {
        self.usage().peak.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Starts a new peak at what is in use now.
    pub fn reset_peak_memory(&self) {
        let u = self.usage();
        u.peak.store(
            u.in_use.load(std::sync::atomic::Ordering::Relaxed),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    fn usage(&self) -> &crate::ffi::MemoryUsage {
        &self.plugin.usage[self.index as usize]
    }

    /// Allocates `bytes` of device memory.
    pub fn alloc(&self, bytes: u64) -> Result<Buffer> {
        Buffer::alloc(self, bytes)
    }

    /// An uninitialised compact tensor.
    pub fn empty(&self, dtype: DType, shape: &[i64]) -> Result<Tensor> {
        if let Some(d) = shape.iter().find(|&&d| d < 0) {
            return Err(HostError::Usage(format!(
                "shape {shape:?} has a negative extent {d}"
            )));
        }
        let bytes = shape
            .iter()
            .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d as u64))
            .ok_or_else(|| {
                HostError::Usage(format!(
                    "a {dtype} tensor of shape {shape:?} overflows 64-bit sizes"
                ))
            })?;
        Ok(Tensor::compact(Arc::new(self.alloc(bytes)?), dtype, shape))
    }

    /// A compact tensor holding a copy of `data`.
    pub fn from_slice<T: Element>(&self, data: &[T], shape: &[i64]) -> Result<Tensor> {
        let t = self.empty(T::DTYPE, shape)?;
        if t.numel() != data.len() {
            return Err(HostError::Usage(format!(
                "{} elements do not fill a tensor of shape {shape:?} ({} elements)",
                data.len(),
                t.numel()
            )));
        }
        let mut bytes = Vec::new();
        T::extend_bytes(data, &mut bytes);
        t.write_bytes(&bytes)?;
        Ok(t)
    }

    /// A compact tensor of zeros.
    pub fn zeros(&self, dtype: DType, shape: &[i64]) -> Result<Tensor> {
        let t = self.empty(dtype, shape)?;
        t.write_bytes(&vec![0u8; t.numel() * dtype.size()])?;
        Ok(t)
    }

    /// A new stream on this device.
    pub fn stream(&self) -> Result<Stream> {
        Stream::new(self)
    }

    /// Runs operators on the device's default stream: each completes before
    /// its call returns.
    pub fn exec(&self) -> Exec<'_> {
        Exec::new(self, None)
    }
}

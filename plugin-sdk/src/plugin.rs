//! The trait a Rust vendor implements for its devices, memory, streams and
//! events; its operators are the methods of [`crate::Operators`], derived
//! from `spec/ops.toml`.

use std::ffi::CStr;

use crate::device::DeviceProps;
use crate::error::Result;
use crate::host::Host;

/// Where work goes: a device and one of its streams (`None`: the device's
/// default stream, whose work must complete before the call returns).
#[derive(Debug)]
pub struct Queue<'a, S> {
    /// The plugin's device index (already checked to exist).
    pub device: u32,
    /// The stream, created by [`Plugin::stream_create`] for this device.
    pub stream: Option<&'a S>,
}

impl<S> Clone for Queue<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S> Copy for Queue<'_, S> {}

/// The direction of a [`Plugin::memcpy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// Host memory to device memory.
    HostToDevice,
    /// Device memory to host memory.
    DeviceToHost,
    /// Device memory to device memory on one device.
    DeviceToDevice,
}

/// A vendor plugin written in Rust: its devices, memory, streams and events.
/// Its operators are the methods of [`crate::Operators`]; export it with
/// [`crate::export_plugin!`], listing the operators it implements (the
/// others are NULL in its op table).
///
/// Every method may be called from several threads at once (the type is
/// `Sync`), except that calls on one stream are serialized by the host. The
/// SDK has already checked device indices, NULL pointers, struct sizes and
/// operator arguments (with [`crate::check`]) before a method runs, and turns
/// an `Err` or a panic into an error object.
pub trait Plugin: Sized + Send + Sync + 'static {
    /// The plugin's stream object.
    type Stream: Send + Sync + 'static;
    /// The plugin's event object.
    type Event: Send + Sync + 'static;

    /// The vendor's name.
    const VENDOR: &'static CStr;
    /// The plugin's own version.
    const VERSION: &'static CStr;
    /// The oldest host ABI minor this plugin works with.
    const MIN_HOST_MINOR: u32 = 0;

    /// Creates the plugin, once per process.
    fn new(host: &Host) -> Result<Self>;
    /// Number of devices.
    fn device_count(&self) -> u32;
    /// Properties of an existing device.
    fn device_props(&self, device: u32) -> Result<DeviceProps>;
    /// Allocates `bytes` (> 0) of device memory aligned to 64 bytes;
    /// [`Error::out_of_memory`] beyond the capacity.
    fn alloc(&self, device: u32, bytes: u64) -> Result<*mut u8>;
    /// Frees an allocation.
    ///
    /// # Safety
    /// `ptr` is non-NULL and came from [`Plugin::alloc`] on `device`, and no
    /// work still uses it.
    unsafe fn free(&self, device: u32, ptr: *mut u8) -> Result<()>;
    /// Copies `bytes` bytes, asynchronously on `queue`.
    ///
    /// # Safety
    /// `src` and `dst` address `bytes` valid bytes of the kinds `kind` names,
    /// and host memory stays valid until the queue reaches the copy.
    unsafe fn memcpy(
        &self,
        queue: Queue<'_, Self::Stream>,
        kind: CopyKind,
        dst: *mut u8,
        src: *const u8,
        bytes: usize,
    ) -> Result<()>;

    /// Creates a stream on `device`.
    fn stream_create(&self, device: u32) -> Result<Self::Stream>;
    /// Blocks until the stream's work has completed.
    fn stream_synchronize(&self, stream: &Self::Stream) -> Result<()>;
    /// Creates an event on `device`, initially complete.
    fn event_create(&self, device: u32) -> Result<Self::Event>;
    /// Records `event` at the current end of `queue`.
    fn event_record(&self, event: &Self::Event, queue: Queue<'_, Self::Stream>) -> Result<()>;
    /// Makes later work on `queue` wait for `event`.
    fn stream_wait_event(&self, queue: Queue<'_, Self::Stream>, event: &Self::Event) -> Result<()>;
    /// Blocks until `event` has completed.
    fn event_synchronize(&self, event: &Self::Event) -> Result<()>;
}

//! The trait a Rust vendor implements, and the checked arguments its
//! operators receive.

use std::ffi::CStr;

use crate::device::DeviceProps;
use crate::error::{Error, Result};
use crate::host::Host;
use crate::tensor::TensorDesc;

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

/// Arguments of `fill`, checked by [`crate::check::fill`].
#[derive(Debug, Clone, Copy)]
pub struct FillArgs<'a> {
    /// Output.
    pub out: TensorDesc<'a>,
    /// The value.
    pub value: f64,
}

/// Arguments of `copy` and `cast`, checked by [`crate::check::copy`] or
/// [`crate::check::cast`].
#[derive(Debug, Clone, Copy)]
pub struct CopyArgs<'a> {
    /// Source.
    pub src: TensorDesc<'a>,
    /// Destination.
    pub dst: TensorDesc<'a>,
}

/// Which elementwise binary operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    /// `a + alpha * b`.
    Add,
    /// `a - alpha * b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
}

impl BinaryOp {
    /// The operator's name in the op table.
    pub const fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
        }
    }
}

/// Arguments of `add`, `sub`, `mul`, `div`, checked by [`crate::check::binary`].
#[derive(Debug, Clone, Copy)]
pub struct BinaryArgs<'a> {
    /// Which operator.
    pub op: BinaryOp,
    /// Left operand.
    pub a: TensorDesc<'a>,
    /// Right operand.
    pub b: TensorDesc<'a>,
    /// Result.
    pub out: TensorDesc<'a>,
    /// Scale of `b` for add and sub.
    pub alpha: f64,
}

/// Arguments of `matmul`, checked by [`crate::check::matmul`].
#[derive(Debug, Clone, Copy)]
pub struct MatmulArgs<'a> {
    /// Left operand.
    pub a: TensorDesc<'a>,
    /// Right operand.
    pub b: TensorDesc<'a>,
    /// Result and accumulator.
    pub out: TensorDesc<'a>,
    /// Scale of the product.
    pub alpha: f64,
    /// Scale of the previous `out`; 0 means `out` is not read.
    pub beta: f64,
    /// Transpose the last two dimensions of `a`.
    pub transpose_a: bool,
    /// Transpose the last two dimensions of `b`.
    pub transpose_b: bool,
}

/// Arguments of `softmax`, checked by [`crate::check::softmax`].
#[derive(Debug, Clone, Copy)]
pub struct SoftmaxArgs<'a> {
    /// Logits.
    pub input: TensorDesc<'a>,
    /// Probabilities.
    pub out: TensorDesc<'a>,
}

fn unimplemented_op(op: &str) -> Error {
    Error::unimplemented(format!("{op} is not implemented by this plugin"))
}

/// A vendor plugin written in Rust. Export it with [`crate::export_plugin!`],
/// listing the operators it implements; the others are NULL in its op table.
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

    /// `fill`.
    ///
    /// # Safety
    /// Every tensor in `args` addresses valid memory of this device (the
    /// host's side of the ABI contract).
    unsafe fn fill(&self, queue: Queue<'_, Self::Stream>, args: &FillArgs<'_>) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("fill"))
    }
    /// `copy`.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn copy(&self, queue: Queue<'_, Self::Stream>, args: &CopyArgs<'_>) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("copy"))
    }
    /// `cast`.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn cast(&self, queue: Queue<'_, Self::Stream>, args: &CopyArgs<'_>) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("cast"))
    }
    /// `add`, `sub`, `mul` and `div`.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn binary(&self, queue: Queue<'_, Self::Stream>, args: &BinaryArgs<'_>) -> Result<()> {
        let _ = queue;
        Err(unimplemented_op(args.op.name()))
    }
    /// `matmul`.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn matmul(&self, queue: Queue<'_, Self::Stream>, args: &MatmulArgs<'_>) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("matmul"))
    }
    /// `softmax`.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn softmax(&self, queue: Queue<'_, Self::Stream>, args: &SoftmaxArgs<'_>) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("softmax"))
    }
}

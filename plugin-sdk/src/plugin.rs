//! The trait a Rust vendor implements, and the checked arguments its
//! operators receive.

use std::ffi::CStr;

use crate::args::*;
use crate::device::DeviceProps;
use crate::error::{Error, Result};
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
    /// The unary operators (`neg` … `gelu`). Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn unary(
        &self,
        queue: Queue<'_, Self::Stream>,
        op: UnaryOp,
        args: &UnaryArgs<'_>,
    ) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op(op.name()))
    }
    /// `pow_scalar`. Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn pow_scalar(
        &self,
        queue: Queue<'_, Self::Stream>,
        args: &PowScalarArgs<'_>,
    ) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("pow_scalar"))
    }
    /// `relu_backward`, `silu_backward`, `gelu_backward`. Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn activation_backward(
        &self,
        queue: Queue<'_, Self::Stream>,
        op: ActivationOp,
        args: &ActivationBackwardArgs<'_>,
    ) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op(op.name()))
    }
    /// `swiglu`. Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn swiglu(&self, queue: Queue<'_, Self::Stream>, args: &SwigluArgs<'_>) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("swiglu"))
    }
    /// `swiglu_backward`. Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn swiglu_backward(
        &self,
        queue: Queue<'_, Self::Stream>,
        args: &SwigluBackwardArgs<'_>,
    ) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("swiglu_backward"))
    }
    /// `sum`, `mean`, `max`, `argmax`. Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn reduce(
        &self,
        queue: Queue<'_, Self::Stream>,
        op: ReduceOp,
        args: &ReduceArgs<'_>,
    ) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op(op.name()))
    }
    /// `sum_squares`. Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn sum_squares(
        &self,
        queue: Queue<'_, Self::Stream>,
        args: &SumSquaresArgs<'_>,
    ) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("sum_squares"))
    }
    /// `linear`. Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn linear(&self, queue: Queue<'_, Self::Stream>, args: &LinearArgs<'_>) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("linear"))
    }
    /// `log_softmax`. Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn log_softmax(
        &self,
        queue: Queue<'_, Self::Stream>,
        args: &SoftmaxArgs<'_>,
    ) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("log_softmax"))
    }
    /// `softmax_backward` (`log` false) and `log_softmax_backward` (`log` true). Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn softmax_backward(
        &self,
        queue: Queue<'_, Self::Stream>,
        log: bool,
        args: &SoftmaxBackwardArgs<'_>,
    ) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op(if log {
            "log_softmax_backward"
        } else {
            "softmax_backward"
        }))
    }
    /// `rms_norm`. Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn rms_norm(
        &self,
        queue: Queue<'_, Self::Stream>,
        args: &RmsNormArgs<'_>,
    ) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("rms_norm"))
    }
    /// `rms_norm_backward`. Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn rms_norm_backward(
        &self,
        queue: Queue<'_, Self::Stream>,
        args: &RmsNormBackwardArgs<'_>,
    ) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("rms_norm_backward"))
    }
    /// `layer_norm`. Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn layer_norm(
        &self,
        queue: Queue<'_, Self::Stream>,
        args: &LayerNormArgs<'_>,
    ) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("layer_norm"))
    }
    /// `layer_norm_backward`. Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn layer_norm_backward(
        &self,
        queue: Queue<'_, Self::Stream>,
        args: &LayerNormBackwardArgs<'_>,
    ) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("layer_norm_backward"))
    }
    /// `rope` (`backward` false) and `rope_backward` (`backward` true). Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn rope(
        &self,
        queue: Queue<'_, Self::Stream>,
        backward: bool,
        args: &RopeArgs<'_>,
    ) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op(if backward {
            "rope_backward"
        } else {
            "rope"
        }))
    }
    /// `attention`. Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn attention(
        &self,
        queue: Queue<'_, Self::Stream>,
        args: &AttentionArgs<'_>,
    ) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("attention"))
    }
    /// `attention_backward`. Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn attention_backward(
        &self,
        queue: Queue<'_, Self::Stream>,
        args: &AttentionBackwardArgs<'_>,
    ) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("attention_backward"))
    }
    /// `embedding`. Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn embedding(
        &self,
        queue: Queue<'_, Self::Stream>,
        args: &EmbeddingArgs<'_>,
    ) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("embedding"))
    }
    /// `embedding_backward`. Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn embedding_backward(
        &self,
        queue: Queue<'_, Self::Stream>,
        args: &EmbeddingBackwardArgs<'_>,
    ) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("embedding_backward"))
    }
    /// `cross_entropy`. Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn cross_entropy(
        &self,
        queue: Queue<'_, Self::Stream>,
        args: &CrossEntropyArgs<'_>,
    ) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("cross_entropy"))
    }
    /// `cross_entropy_backward`. Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn cross_entropy_backward(
        &self,
        queue: Queue<'_, Self::Stream>,
        args: &CrossEntropyBackwardArgs<'_>,
    ) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("cross_entropy_backward"))
    }
    /// `adamw`. Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn adamw(&self, queue: Queue<'_, Self::Stream>, args: &AdamwArgs<'_>) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("adamw"))
    }
    /// `scale`. Since ABI 1.1.
    ///
    /// # Safety
    /// As for [`Plugin::fill`].
    unsafe fn scale(&self, queue: Queue<'_, Self::Stream>, args: &ScaleArgs<'_>) -> Result<()> {
        let _ = (queue, args);
        Err(unimplemented_op("scale"))
    }
}

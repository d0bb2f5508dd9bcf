//! The polychip plugin over OpenCL: a real accelerator driver, with its
//! opaque device memory, asynchronous command queues and events, and
//! kernels compiled at run time.
//!
//! - [`driver`]: loading OpenCL (at run time), the devices and what they
//!   report, OpenCL errors as polychip errors.
//! - [`memory`]: buffers behind the ABI's device addresses.
//! - [`stream`]: streams as command queues, events as OpenCL events.
//! - [`program`]: the OpenCL C sources in `kernels/`, built once per device
//!   and dtype, and kernel launches.
//! - [`call`]: one operator call's operands (views, packing).
//! - [`ops`]: the operators, one module per family.
//!
//! Environment: `POLYCHIP_OPENCL_DEVICES` (comma-separated words; only
//! devices whose name holds one), `POLYCHIP_OPENCL_PEAK_GFLOPS` (the peak
//! to report instead of the derived one). See docs/opencl.md.

pub mod call;
pub mod driver;
pub mod memory;
pub mod ops;
pub mod program;
pub mod stream;

use std::ffi::CStr;
use std::sync::Arc;

use cl3::command_queue::{enqueue_copy_buffer, enqueue_read_buffer, enqueue_write_buffer};
use opencl3::event::Event as ClEvent;
use polychip_plugin_sdk::{
    ActivationBackwardArgs, ActivationBackwardOp, AdamwArgs, ArangeArgs, AttentionArgs,
    AttentionBackwardArgs, BinaryArgs, BinaryOp, BitwiseArgs, BitwiseOp, CastArgs, CompareArgs,
    CompareOp, ConvertArgs, CopyArgs, CopyKind, CrossEntropyArgs, CrossEntropyBackwardArgs,
    CumsumArgs, DeviceProps, EmbeddingArgs, EmbeddingBackwardArgs, Error, FillArgs, GatherArgs,
    Host, LayerNormArgs, LayerNormBackwardArgs, LinearArgs, MaskedFillArgs, MatmulArgs, Operators,
    OutputBackwardArgs, OutputBackwardOp, Plugin, PowScalarArgs, Queue, ReduceArgs, ReduceBoolArgs,
    ReduceBoolOp, ReduceOp, Result, RmsNormArgs, RmsNormBackwardArgs, RopeArgs, ScaleArgs,
    ScatterAddArgs, SelectArgs, SoftmaxArgs, SoftmaxBackwardArgs, SumSquaresArgs, SwigluArgs,
    SwigluBackwardArgs, UnaryArgs, UnaryOp, export_plugin,
};

use call::Ctx;
use driver::{ClResult, Device};
use memory::{Buffer, Memory};
use program::Programs;
use stream::{Event, Stream};

/// The plugin: the devices discovery opened, their programs and memory.
#[derive(Debug)]
pub struct OpenCl {
    /// The devices, GPUs first.
    pub devices: Vec<Device>,
    /// Their programs.
    pub programs: Vec<Programs>,
    /// Their address spaces.
    pub memory: Memory,
    /// A small buffer per device that empty tensors point into (a kernel
    /// argument must be a valid buffer even when nothing is read).
    pub empty: Vec<Arc<Buffer>>,
    /// Why there are no devices, or fewer than the driver has.
    pub problems: Vec<String>,
}

impl OpenCl {
    /// Discovers and opens the devices.
    pub fn open() -> OpenCl {
        let found = driver::discover();
        let mut devices = Vec::new();
        let mut empty = Vec::new();
        let mut problems = found.problems;
        for device in found.devices {
            match Buffer::new(&device, 64) {
                Ok(b) => {
                    empty.push(Arc::new(b));
                    devices.push(device);
                }
                Err(e) => problems.push(format!("{}: {e}", device.info.name)),
            }
        }
        let programs = devices.iter().map(Programs::new).collect();
        OpenCl {
            memory: Memory::new(devices.len()),
            programs,
            devices,
            empty,
            problems,
        }
    }

    fn queue_of<'a>(
        &'a self,
        queue: &Queue<'a, Stream>,
    ) -> &'a opencl3::command_queue::CommandQueue {
        queue
            .stream
            .map_or(&self.devices[queue.device as usize].queue, |s| &s.queue)
    }

    fn platform_of(&self, queue: &Queue<'_, Stream>) -> usize {
        queue
            .stream
            .map_or(self.devices[queue.device as usize].platform, |s| s.platform)
    }
}

impl Plugin for OpenCl {
    type Stream = Stream;
    type Event = Event;

    const VENDOR: &'static CStr = c"OpenCL";
    const VERSION: &'static CStr = c"1.0.0";

    fn new(_host: &Host) -> Result<Self> {
        let plugin = OpenCl::open();
        for problem in &plugin.problems {
            log::warn!("opencl: {problem}");
        }
        for (i, d) in plugin.devices.iter().enumerate() {
            log::info!("opencl: device {i}: {} ({})", d.info.name, d.info.version);
        }
        Ok(plugin)
    }

    fn device_count(&self) -> u32 {
        self.devices.len() as u32
    }

    fn device_props(&self, device: u32) -> Result<DeviceProps> {
        Ok(self.devices[device as usize].info.props())
    }

    fn alloc(&self, device: u32, bytes: u64) -> Result<*mut u8> {
        self.memory
            .alloc(device, &self.devices[device as usize], bytes)
    }

    unsafe fn free(&self, device: u32, ptr: *mut u8) -> Result<()> {
        self.memory.free(device, ptr)
    }

    unsafe fn memcpy(
        &self,
        queue: Queue<'_, Stream>,
        kind: CopyKind,
        dst: *mut u8,
        src: *const u8,
        bytes: usize,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let q = self.queue_of(&queue);
        let blocking = u32::from(queue.stream.is_none());
        let n = bytes as u64;
        let event = match kind {
            CopyKind::HostToDevice => {
                let to = self
                    .memory
                    .resolve(queue.device, dst as u64, n, "memcpy: dst")?;
                // SAFETY: `src` holds `bytes` readable bytes until the queue
                // reaches the copy (the caller's contract); `to` lies in the
                // buffer.
                unsafe {
                    enqueue_write_buffer(
                        q.get(),
                        to.buffer.mem,
                        blocking,
                        to.offset as usize,
                        bytes,
                        src.cast(),
                        0,
                        std::ptr::null(),
                    )
                }
                .cl("clEnqueueWriteBuffer")?
            }
            CopyKind::DeviceToHost => {
                let from = self
                    .memory
                    .resolve(queue.device, src as u64, n, "memcpy: src")?;
                // SAFETY: as above, for `dst`.
                unsafe {
                    enqueue_read_buffer(
                        q.get(),
                        from.buffer.mem,
                        blocking,
                        from.offset as usize,
                        bytes,
                        dst.cast(),
                        0,
                        std::ptr::null(),
                    )
                }
                .cl("clEnqueueReadBuffer")?
            }
            CopyKind::DeviceToDevice => {
                let from = self
                    .memory
                    .resolve(queue.device, src as u64, n, "memcpy: src")?;
                let to = self
                    .memory
                    .resolve(queue.device, dst as u64, n, "memcpy: dst")?;
                if Arc::ptr_eq(&from.buffer, &to.buffer)
                    && from.offset < to.offset + n
                    && to.offset < from.offset + n
                {
                    return Err(Error::invalid(
                        "opencl: memcpy: the source and destination overlap",
                    ));
                }
                // SAFETY: both ranges lie in live buffers of this device.
                unsafe {
                    enqueue_copy_buffer(
                        q.get(),
                        from.buffer.mem,
                        to.buffer.mem,
                        from.offset as usize,
                        to.offset as usize,
                        bytes,
                        0,
                        std::ptr::null(),
                    )
                }
                .cl("clEnqueueCopyBuffer")?
            }
        };
        drop(ClEvent::new(event));
        if queue.stream.is_none() {
            q.finish().cl("clFinish after memcpy")?;
        }
        Ok(())
    }

    fn stream_create(&self, device: u32) -> Result<Stream> {
        let d = &self.devices[device as usize];
        Ok(Stream {
            device,
            platform: d.platform,
            // SAFETY: `d.id` is one of its context's devices.
            queue: unsafe { driver::new_queue(&d.context, d.id) }?,
        })
    }

    fn stream_synchronize(&self, stream: &Stream) -> Result<()> {
        stream.queue.finish().cl("clFinish")
    }

    fn event_create(&self, _device: u32) -> Result<Event> {
        Ok(Event::new())
    }

    fn event_record(&self, event: &Event, queue: Queue<'_, Stream>) -> Result<()> {
        event.record(self.queue_of(&queue), self.platform_of(&queue))
    }

    fn stream_wait_event(&self, queue: Queue<'_, Stream>, event: &Event) -> Result<()> {
        if queue.stream.is_none() {
            // The default stream's work is done before each call returns,
            // so its later work waits by blocking here.
            return event.synchronize();
        }
        event.wait_on(self.queue_of(&queue), self.platform_of(&queue))
    }

    fn event_synchronize(&self, event: &Event) -> Result<()> {
        event.synchronize()
    }
}

/// Forwards each operator method to its family's function in [`ops`] with
/// a fresh [`Ctx`].
macro_rules! forward {
    ($($method:ident($args:ty) => $module:ident::$func:ident;)*) => {
        $(
            unsafe fn $method(&self, queue: Queue<'_, Stream>, args: &$args) -> Result<()> {
                ops::$module::$func(Ctx::new(self, queue, stringify!($method)), args)
            }
        )*
    };
}

/// The operators: OpenCL C kernels (`kernels/`) launched by `ops`.
impl Operators for OpenCl {
    forward! {
        fill(FillArgs<'_>) => data::fill;
        copy(CopyArgs<'_>) => data::copy;
        cast(CastArgs<'_>) => data::cast;
        matmul(MatmulArgs<'_>) => matmul::matmul;
        linear(LinearArgs<'_>) => matmul::linear;
        softmax(SoftmaxArgs<'_>) => softmax::softmax;
        log_softmax(SoftmaxArgs<'_>) => softmax::log_softmax;
        softmax_backward(SoftmaxBackwardArgs<'_>) => softmax::softmax_backward;
        log_softmax_backward(SoftmaxBackwardArgs<'_>) => softmax::log_softmax_backward;
        rms_norm(RmsNormArgs<'_>) => norm::rms_norm;
        rms_norm_backward(RmsNormBackwardArgs<'_>) => norm::rms_norm_backward;
        layer_norm(LayerNormArgs<'_>) => norm::layer_norm;
        layer_norm_backward(LayerNormBackwardArgs<'_>) => norm::layer_norm_backward;
        cross_entropy(CrossEntropyArgs<'_>) => softmax::cross_entropy;
        cross_entropy_backward(CrossEntropyBackwardArgs<'_>) => softmax::cross_entropy_backward;
        pow_scalar(PowScalarArgs<'_>) => elementwise::pow_scalar;
        swiglu(SwigluArgs<'_>) => elementwise::swiglu;
        swiglu_backward(SwigluBackwardArgs<'_>) => elementwise::swiglu_backward;
        scale(ScaleArgs<'_>) => elementwise::scale;
        sum_squares(SumSquaresArgs<'_>) => reduce::sum_squares;
        rope(RopeArgs<'_>) => attention::rope;
        rope_backward(RopeArgs<'_>) => attention::rope_backward;
        attention(AttentionArgs<'_>) => attention::attention;
        attention_backward(AttentionBackwardArgs<'_>) => attention::attention_backward;
        embedding(EmbeddingArgs<'_>) => embedding::embedding;
        embedding_backward(EmbeddingBackwardArgs<'_>) => embedding::embedding_backward;
        gather(GatherArgs<'_>) => indexing::gather;
        scatter_add(ScatterAddArgs<'_>) => indexing::scatter_add;
        adamw(AdamwArgs<'_>) => optim::adamw;
    }

    unsafe fn binary(
        &self,
        queue: Queue<'_, Stream>,
        op: BinaryOp,
        args: &BinaryArgs<'_>,
    ) -> Result<()> {
        ops::elementwise::binary(Ctx::new(self, queue, op.op().name()), op, args)
    }

    unsafe fn unary(
        &self,
        queue: Queue<'_, Stream>,
        op: UnaryOp,
        args: &UnaryArgs<'_>,
    ) -> Result<()> {
        ops::elementwise::unary(Ctx::new(self, queue, op.op().name()), op, args)
    }

    unsafe fn activation_backward(
        &self,
        queue: Queue<'_, Stream>,
        op: ActivationBackwardOp,
        args: &ActivationBackwardArgs<'_>,
    ) -> Result<()> {
        ops::elementwise::activation_backward(Ctx::new(self, queue, op.op().name()), op, args)
    }

    unsafe fn output_backward(
        &self,
        queue: Queue<'_, Stream>,
        op: OutputBackwardOp,
        args: &OutputBackwardArgs<'_>,
    ) -> Result<()> {
        ops::elementwise::output_backward(Ctx::new(self, queue, op.op().name()), op, args)
    }

    unsafe fn convert(&self, queue: Queue<'_, Stream>, args: &ConvertArgs<'_>) -> Result<()> {
        ops::data::convert(Ctx::new(self, queue, "convert"), args)
    }

    unsafe fn arange(&self, queue: Queue<'_, Stream>, args: &ArangeArgs<'_>) -> Result<()> {
        ops::data::arange(Ctx::new(self, queue, "arange"), args)
    }

    unsafe fn select(&self, queue: Queue<'_, Stream>, args: &SelectArgs<'_>) -> Result<()> {
        ops::elementwise::select(Ctx::new(self, queue, "select"), args)
    }

    unsafe fn masked_fill(
        &self,
        queue: Queue<'_, Stream>,
        args: &MaskedFillArgs<'_>,
    ) -> Result<()> {
        ops::elementwise::masked_fill(Ctx::new(self, queue, "masked_fill"), args)
    }

    unsafe fn compare(
        &self,
        queue: Queue<'_, Stream>,
        op: CompareOp,
        args: &CompareArgs<'_>,
    ) -> Result<()> {
        ops::elementwise::compare(Ctx::new(self, queue, op.op().name()), op, args)
    }

    unsafe fn cumsum(&self, queue: Queue<'_, Stream>, args: &CumsumArgs<'_>) -> Result<()> {
        ops::reduce::cumsum(Ctx::new(self, queue, "cumsum"), args)
    }

    unsafe fn reduce_bool(
        &self,
        queue: Queue<'_, Stream>,
        op: ReduceBoolOp,
        args: &ReduceBoolArgs<'_>,
    ) -> Result<()> {
        ops::reduce::reduce_bool(Ctx::new(self, queue, op.op().name()), op, args)
    }

    unsafe fn bitwise(
        &self,
        queue: Queue<'_, Stream>,
        op: BitwiseOp,
        args: &BitwiseArgs<'_>,
    ) -> Result<()> {
        ops::elementwise::bitwise(Ctx::new(self, queue, op.op().name()), op, args)
    }

    unsafe fn reduce(
        &self,
        queue: Queue<'_, Stream>,
        op: ReduceOp,
        args: &ReduceArgs<'_>,
    ) -> Result<()> {
        ops::reduce::reduce(Ctx::new(self, queue, op.op().name()), op, args)
    }
}

export_plugin!(
    OpenCl,
    ops: [
        fill, copy, cast, add, sub, mul, div, matmul, softmax, neg, exp, log, sqrt, rsqrt, tanh,
        pow_scalar, relu, relu_backward, silu, silu_backward, gelu, gelu_backward, swiglu,
        swiglu_backward, sum, mean, max, argmax, sum_squares, linear, softmax_backward,
        log_softmax, log_softmax_backward, rms_norm, rms_norm_backward, layer_norm,
        layer_norm_backward, rope, rope_backward, attention, attention_backward, embedding,
        embedding_backward, cross_entropy, cross_entropy_backward, adamw, scale, gelu_erf,
        gelu_erf_backward, sigmoid, sigmoid_backward, tanh_backward, sin, cos, select,
        masked_fill, convert, arange, eq, ne, lt, le, gt, ge, gather, scatter_add, cumsum, any,
        all, bitwise_and, bitwise_or, bitwise_xor
    ]
);

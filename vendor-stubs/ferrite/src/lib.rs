//! Ferrite, the bundled example plugin of polychip: a fast simulated chip
//! whose devices are the host CPU. Device memory is ordinary host memory (so
//! it is host-visible and RDMA-registrable), streams are real asynchronous
//! queues each served by a worker thread, and the operators are the
//! `ferrite-kernels` CPU kernels. It is written through the Rust plugin SDK:
//! [`Ferrite`] implements [`Plugin`] and [`export_plugin!`] exports it as
//! `polychip_plugin_init_v1`.
//!
//! Environment (read once, at load): `POLYCHIP_FERRITE_DEVICES` (default 2,
//! at most 64), `POLYCHIP_FERRITE_MEMORY_MIB` per device (default 4096) and
//! `POLYCHIP_FERRITE_PEAK_GFLOPS` per device (default 200, one core's f32 ceiling).

/// Launches an operator's kernel on its views through
/// [`ops::launch_outputs`]. `launch!(self, queue, op, args => |[views...]|
/// kernel call)` takes the operands of a checked args struct (inputs first,
/// then what it writes, as `operands()` lists them); `launch!(self, queue,
/// op, outputs, operands, |[views...]| kernel call)` takes them from an
/// array whose last `outputs` operands are the outputs.
macro_rules! launch {
    ($self:ident, $queue:ident, $op:expr, $args:expr => |[$($v:ident),* $(,)?]| $call:expr) => {{
        let operands = $args.operands();
        let outputs = $args.outputs();
        launch!($self, $queue, $op, outputs, operands, |[$($v),*]| $call)
    }};
    ($self:ident, $queue:ident, $op:expr, $outputs:expr, $operands:ident, |[$($v:ident),* $(,)?]| $call:expr) => {{
        let kernel = move |[$($v),*]: &[View<'_>; _]| {
            // SAFETY: `launch_outputs` checked that every view lies inside one
            // live allocation of this device and that outputs do not partly
            // overlap inputs; the host keeps the memory alive for the call.
            unsafe { $call }
        };
        // SAFETY: forwarded from the calling trait method's contract.
        unsafe { ops::launch_outputs(&$self.memory, $queue, $op, $operands, $outputs, kernel) }
    }};
}

mod config;
mod memory;
mod ops;
mod stream;

use std::ffi::CStr;

use ferrite_kernels::{self as kernels, View};
use polychip_plugin_sdk::{
    ActivationBackwardArgs, ActivationBackwardOp, AdamwArgs, ArangeArgs, AttentionArgs,
    AttentionBackwardArgs, BinaryArgs, BinaryOp, BitwiseArgs, BitwiseOp, CastArgs, CompareArgs,
    CompareOp, ConvertArgs, CopyArgs, CopyKind, CrossEntropyArgs, CrossEntropyBackwardArgs,
    CumsumArgs, DeviceProps, EmbeddingArgs, EmbeddingBackwardArgs, FillArgs, GatherArgs, Host,
    LayerNormArgs, LayerNormBackwardArgs, LinearArgs, MaskedFillArgs, MatmulArgs, Operators,
    OutputBackwardArgs, OutputBackwardOp, Plugin, PowScalarArgs, Queue, ReduceArgs, ReduceBoolArgs,
    ReduceBoolOp, ReduceOp, Result, RmsNormArgs, RmsNormBackwardArgs, RopeArgs, ScaleArgs,
    ScatterAddArgs, SelectArgs, SoftmaxArgs, SoftmaxBackwardArgs, SumSquaresArgs, SwigluArgs,
    SwigluBackwardArgs, UnaryArgs, UnaryOp, export_plugin,
};

pub use config::Config;
pub use stream::{Event, Stream};

use memory::Memory;

/// The name every Ferrite device reports.
pub const DEVICE_NAME: &str = "Ferrite F1";
/// Reported memory and link bandwidth, bytes/s.
const BANDWIDTH: f64 = 10e9;

/// The plugin: its configuration and the memory of its devices.
#[derive(Debug)]
pub struct Ferrite {
    config: Config,
    memory: Memory,
    compute_units: u32,
}

impl Ferrite {
    /// A plugin with the given configuration (what [`Plugin::new`] builds
    /// from the environment).
    pub fn with_config(config: Config) -> Ferrite {
        let compute_units = std::thread::available_parallelism()
            .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX));
        Ferrite {
            memory: Memory::new(config.devices, config.memory_bytes),
            config,
            compute_units,
        }
    }
}

impl Plugin for Ferrite {
    type Stream = Stream;
    type Event = Event;

    const VENDOR: &'static CStr = c"Ferrite";
    const VERSION: &'static CStr = c"1.0.0";

    fn new(_host: &Host) -> Result<Self> {
        // The SDK forwards `log` records to the host from before `new` runs.
        let config = Config::from_env(|w| log::warn!("Ferrite: {w}"));
        log::info!(
            "Ferrite 1.0.0: {} device(s) of {} MiB",
            config.devices,
            config.memory_bytes >> 20
        );
        Ok(Ferrite::with_config(config))
    }

    fn device_count(&self) -> u32 {
        self.config.devices
    }

    fn device_props(&self, _device: u32) -> Result<DeviceProps> {
        Ok(DeviceProps {
            name: DEVICE_NAME.to_owned(),
            memory_bytes: self.config.memory_bytes,
            host_visible: true,
            rdma_exportable: true,
            compute_units: self.compute_units,
            peak_flops_f32: self.config.peak_flops,
            peak_flops_bf16: self.config.peak_flops,
            peak_flops_f16: self.config.peak_flops,
            memory_bandwidth: BANDWIDTH,
            link_bandwidth: BANDWIDTH,
        })
    }

    fn alloc(&self, device: u32, bytes: u64) -> Result<*mut u8> {
        self.memory.alloc(device, bytes)
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
        // SAFETY: forwarded from this method's contract.
        unsafe { ops::memcpy(&self.memory, queue, kind, dst, src, bytes) }
    }

    fn stream_create(&self, device: u32) -> Result<Stream> {
        Stream::new(device)
    }

    fn stream_synchronize(&self, stream: &Stream) -> Result<()> {
        stream.synchronize()
    }

    fn event_create(&self, _device: u32) -> Result<Event> {
        Ok(Event::new())
    }

    fn event_record(&self, event: &Event, queue: Queue<'_, Stream>) -> Result<()> {
        event.record(queue.stream);
        Ok(())
    }

    fn stream_wait_event(&self, queue: Queue<'_, Stream>, event: &Event) -> Result<()> {
        event.wait_on(queue.stream);
        Ok(())
    }

    fn event_synchronize(&self, event: &Event) -> Result<()> {
        event.synchronize();
        Ok(())
    }
}

/// The operators: each launches its `ferrite-kernels` kernel on the views of
/// its checked arguments.
impl Operators for Ferrite {
    unsafe fn fill(&self, queue: Queue<'_, Stream>, args: &FillArgs<'_>) -> Result<()> {
        let value = args.value;
        launch!(self, queue, "fill", args => |[out]| kernels::fill(out, value))
    }

    unsafe fn copy(&self, queue: Queue<'_, Stream>, args: &CopyArgs<'_>) -> Result<()> {
        launch!(self, queue, "copy", args => |[src, dst]| kernels::copy(src, dst))
    }

    unsafe fn cast(&self, queue: Queue<'_, Stream>, args: &CastArgs<'_>) -> Result<()> {
        launch!(self, queue, "cast", args => |[src, dst]| kernels::cast(src, dst))
    }

    unsafe fn binary(
        &self,
        queue: Queue<'_, Stream>,
        op: BinaryOp,
        args: &BinaryArgs<'_>,
    ) -> Result<()> {
        let k = match op {
            BinaryOp::Add => kernels::BinaryOp::Add,
            BinaryOp::Sub => kernels::BinaryOp::Sub,
            BinaryOp::Mul => kernels::BinaryOp::Mul,
            BinaryOp::Div => kernels::BinaryOp::Div,
        };
        let alpha = args.alpha;
        launch!(self, queue, op.name(), args => |[a, b, out]| kernels::binary(k, a, b, out, alpha))
    }

    unsafe fn matmul(&self, queue: Queue<'_, Stream>, args: &MatmulArgs<'_>) -> Result<()> {
        let &MatmulArgs {
            alpha,
            beta,
            transpose_a,
            transpose_b,
            ..
        } = args;
        launch!(self, queue, "matmul", args => |[a, b, out]| {
            kernels::matmul(a, b, out, transpose_a, transpose_b, alpha, beta)
        })
    }

    unsafe fn softmax(&self, queue: Queue<'_, Stream>, args: &SoftmaxArgs<'_>) -> Result<()> {
        launch!(self, queue, "softmax", args => |[i, o]| kernels::softmax(i, o))
    }

    unsafe fn unary(
        &self,
        queue: Queue<'_, Stream>,
        op: UnaryOp,
        args: &UnaryArgs<'_>,
    ) -> Result<()> {
        let k = match op {
            UnaryOp::Neg => kernels::UnaryOp::Neg,
            UnaryOp::Exp => kernels::UnaryOp::Exp,
            UnaryOp::Log => kernels::UnaryOp::Log,
            UnaryOp::Sqrt => kernels::UnaryOp::Sqrt,
            UnaryOp::Rsqrt => kernels::UnaryOp::Rsqrt,
            UnaryOp::Tanh => kernels::UnaryOp::Tanh,
            UnaryOp::Relu => kernels::UnaryOp::Relu,
            UnaryOp::Silu => kernels::UnaryOp::Silu,
            UnaryOp::Gelu => kernels::UnaryOp::Gelu,
            UnaryOp::GeluErf => kernels::UnaryOp::GeluErf,
            UnaryOp::Sigmoid => kernels::UnaryOp::Sigmoid,
            UnaryOp::Sin => kernels::UnaryOp::Sin,
            UnaryOp::Cos => kernels::UnaryOp::Cos,
        };
        launch!(self, queue, op.name(), args => |[i, o]| kernels::unary(k, i, o))
    }

    unsafe fn convert(&self, queue: Queue<'_, Stream>, args: &ConvertArgs<'_>) -> Result<()> {
        launch!(self, queue, "convert", args => |[src, dst]| kernels::convert(src, dst))
    }

    unsafe fn arange(&self, queue: Queue<'_, Stream>, args: &ArangeArgs<'_>) -> Result<()> {
        let (start, step) = (args.start, args.step);
        launch!(self, queue, "arange", args => |[out]| kernels::arange(out, start, step))
    }

    unsafe fn select(&self, queue: Queue<'_, Stream>, args: &SelectArgs<'_>) -> Result<()> {
        launch!(self, queue, "select", args => |[c, a, b, o]| kernels::select(c, a, b, o))
    }

    unsafe fn masked_fill(
        &self,
        queue: Queue<'_, Stream>,
        args: &MaskedFillArgs<'_>,
    ) -> Result<()> {
        let value = args.value;
        launch!(self, queue, "masked_fill", args => |[i, m, o]| kernels::masked_fill(i, m, o, value))
    }

    unsafe fn compare(
        &self,
        queue: Queue<'_, Stream>,
        op: CompareOp,
        args: &CompareArgs<'_>,
    ) -> Result<()> {
        let k = compare_kernel(op);
        launch!(self, queue, op.name(), args => |[a, b, o]| kernels::compare(k, a, b, o))
    }

    unsafe fn gather(&self, queue: Queue<'_, Stream>, args: &GatherArgs<'_>) -> Result<()> {
        let dim = args.dim;
        launch!(self, queue, "gather", args => |[i, x, o]| kernels::gather(i, x, o, dim))
    }

    unsafe fn scatter_add(
        &self,
        queue: Queue<'_, Stream>,
        args: &ScatterAddArgs<'_>,
    ) -> Result<()> {
        let dim = args.dim;
        launch!(self, queue, "scatter_add", args => |[x, s, d]| kernels::scatter_add(d, x, s, dim))
    }

    unsafe fn cumsum(&self, queue: Queue<'_, Stream>, args: &CumsumArgs<'_>) -> Result<()> {
        let dim = args.dim;
        launch!(self, queue, "cumsum", args => |[i, o]| kernels::cumsum(i, o, dim))
    }

    unsafe fn reduce_bool(
        &self,
        queue: Queue<'_, Stream>,
        op: ReduceBoolOp,
        args: &ReduceBoolArgs<'_>,
    ) -> Result<()> {
        let k = match op {
            ReduceBoolOp::Any => kernels::BoolReduceOp::Any,
            ReduceBoolOp::All => kernels::BoolReduceOp::All,
        };
        let (dim, keepdim) = (args.dim, args.keepdim);
        launch!(self, queue, op.name(), args => |[i, o]| kernels::reduce_bool(k, i, o, dim, keepdim))
    }

    unsafe fn bitwise(
        &self,
        queue: Queue<'_, Stream>,
        op: BitwiseOp,
        args: &BitwiseArgs<'_>,
    ) -> Result<()> {
        let k = bitwise_kernel(op);
        launch!(self, queue, op.name(), args => |[a, b, o]| kernels::bitwise(k, a, b, o))
    }

    unsafe fn pow_scalar(&self, queue: Queue<'_, Stream>, args: &PowScalarArgs<'_>) -> Result<()> {
        let e = args.exponent;
        launch!(self, queue, "pow_scalar", args => |[i, o]| kernels::pow_scalar(i, o, e))
    }

    unsafe fn activation_backward(
        &self,
        queue: Queue<'_, Stream>,
        op: ActivationBackwardOp,
        args: &ActivationBackwardArgs<'_>,
    ) -> Result<()> {
        let k = match op {
            ActivationBackwardOp::ReluBackward => kernels::ActivationOp::Relu,
            ActivationBackwardOp::SiluBackward => kernels::ActivationOp::Silu,
            ActivationBackwardOp::GeluBackward => kernels::ActivationOp::Gelu,
            ActivationBackwardOp::GeluErfBackward => kernels::ActivationOp::GeluErf,
        };
        launch!(self, queue, op.name(), args => |[g, i, gi]| {
            kernels::activation_backward(k, g, i, gi)
        })
    }

    unsafe fn output_backward(
        &self,
        queue: Queue<'_, Stream>,
        op: OutputBackwardOp,
        args: &OutputBackwardArgs<'_>,
    ) -> Result<()> {
        let k = match op {
            OutputBackwardOp::SigmoidBackward => kernels::OutputOp::Sigmoid,
            OutputBackwardOp::TanhBackward => kernels::OutputOp::Tanh,
        };
        launch!(self, queue, op.name(), args => |[g, y, gi]| {
            kernels::output_backward(k, g, y, gi)
        })
    }

    unsafe fn swiglu(&self, queue: Queue<'_, Stream>, args: &SwigluArgs<'_>) -> Result<()> {
        launch!(self, queue, "swiglu", args => |[g, u, o]| kernels::swiglu(g, u, o))
    }

    unsafe fn swiglu_backward(
        &self,
        queue: Queue<'_, Stream>,
        args: &SwigluBackwardArgs<'_>,
    ) -> Result<()> {
        launch!(self, queue, "swiglu_backward", args => |[g, u, go, gg, gu]| {
            kernels::swiglu_backward(g, u, go, gg, gu)
        })
    }

    unsafe fn reduce(
        &self,
        queue: Queue<'_, Stream>,
        op: ReduceOp,
        args: &ReduceArgs<'_>,
    ) -> Result<()> {
        let k = match op {
            ReduceOp::Sum => kernels::ReduceOp::Sum,
            ReduceOp::Mean => kernels::ReduceOp::Mean,
            ReduceOp::Max => kernels::ReduceOp::Max,
            ReduceOp::Argmax => kernels::ReduceOp::Argmax,
        };
        let (dim, keepdim) = (args.dim, args.keepdim);
        launch!(self, queue, op.name(), args => |[i, o]| kernels::reduce(k, i, o, dim, keepdim))
    }

    unsafe fn sum_squares(
        &self,
        queue: Queue<'_, Stream>,
        args: &SumSquaresArgs<'_>,
    ) -> Result<()> {
        launch!(self, queue, "sum_squares", args => |[i, o]| kernels::sum_squares(i, o))
    }

    unsafe fn linear(&self, queue: Queue<'_, Stream>, args: &LinearArgs<'_>) -> Result<()> {
        match &args.bias {
            Some(bias) => {
                let operands = [
                    ("input", &args.input),
                    ("weight", &args.weight),
                    ("bias", bias),
                    ("out", &args.out),
                ];
                launch!(self, queue, "linear", 1, operands, |[i, w, b, o]| {
                    kernels::linear(i, w, Some(b), o)
                })
            }
            None => {
                let operands = [
                    ("input", &args.input),
                    ("weight", &args.weight),
                    ("out", &args.out),
                ];
                launch!(self, queue, "linear", 1, operands, |[i, w, o]| {
                    kernels::linear(i, w, None, o)
                })
            }
        }
    }

    unsafe fn log_softmax(&self, queue: Queue<'_, Stream>, args: &SoftmaxArgs<'_>) -> Result<()> {
        launch!(self, queue, "log_softmax", args => |[i, o]| kernels::log_softmax(i, o))
    }

    unsafe fn softmax_backward(
        &self,
        queue: Queue<'_, Stream>,
        args: &SoftmaxBackwardArgs<'_>,
    ) -> Result<()> {
        launch!(self, queue, "softmax_backward", args => |[y, g, gi]| {
            kernels::softmax_backward(y, g, gi, false)
        })
    }

    unsafe fn log_softmax_backward(
        &self,
        queue: Queue<'_, Stream>,
        args: &SoftmaxBackwardArgs<'_>,
    ) -> Result<()> {
        launch!(self, queue, "log_softmax_backward", args => |[y, g, gi]| {
            kernels::softmax_backward(y, g, gi, true)
        })
    }

    unsafe fn rms_norm(&self, queue: Queue<'_, Stream>, args: &RmsNormArgs<'_>) -> Result<()> {
        let eps = args.eps;
        launch!(self, queue, "rms_norm", args => |[i, w, o, r]| kernels::rms_norm(i, w, o, r, eps))
    }

    unsafe fn rms_norm_backward(
        &self,
        queue: Queue<'_, Stream>,
        args: &RmsNormBackwardArgs<'_>,
    ) -> Result<()> {
        launch!(self, queue, "rms_norm_backward", args => |[g, i, w, r, gi, gw]| {
            kernels::rms_norm_backward(g, i, w, r, gi, gw)
        })
    }

    unsafe fn layer_norm(&self, queue: Queue<'_, Stream>, args: &LayerNormArgs<'_>) -> Result<()> {
        let eps = args.eps;
        launch!(self, queue, "layer_norm", args => |[i, w, b, o, m, r]| {
            kernels::layer_norm(i, w, b, o, m, r, eps)
        })
    }

    unsafe fn layer_norm_backward(
        &self,
        queue: Queue<'_, Stream>,
        args: &LayerNormBackwardArgs<'_>,
    ) -> Result<()> {
        launch!(self, queue, "layer_norm_backward", args => |[g, i, w, m, r, gi, gw, gb]| {
            kernels::layer_norm_backward(g, i, w, m, r, gi, gw, gb)
        })
    }

    unsafe fn rope(&self, queue: Queue<'_, Stream>, args: &RopeArgs<'_>) -> Result<()> {
        let interleaved = args.interleaved;
        launch!(self, queue, "rope", args => |[i, c, s, o]| {
            kernels::rope(i, c, s, o, interleaved, false)
        })
    }

    unsafe fn rope_backward(&self, queue: Queue<'_, Stream>, args: &RopeArgs<'_>) -> Result<()> {
        let interleaved = args.interleaved;
        launch!(self, queue, "rope_backward", args => |[i, c, s, o]| {
            kernels::rope(i, c, s, o, interleaved, true)
        })
    }

    unsafe fn attention(&self, queue: Queue<'_, Stream>, args: &AttentionArgs<'_>) -> Result<()> {
        let (scale, causal) = (args.scale, args.causal);
        launch!(self, queue, "attention", args => |[q, k, v, o, l]| {
            kernels::attention(q, k, v, o, l, scale, causal)
        })
    }

    unsafe fn attention_backward(
        &self,
        queue: Queue<'_, Stream>,
        args: &AttentionBackwardArgs<'_>,
    ) -> Result<()> {
        let (scale, causal) = (args.scale, args.causal);
        launch!(self, queue, "attention_backward", args => |[q, k, v, o, l, g, gq, gk, gv]| {
            kernels::attention_backward(q, k, v, o, l, g, gq, gk, gv, scale, causal)
        })
    }

    unsafe fn embedding(&self, queue: Queue<'_, Stream>, args: &EmbeddingArgs<'_>) -> Result<()> {
        launch!(self, queue, "embedding", args => |[w, i, o]| kernels::embedding(w, i, o))
    }

    unsafe fn embedding_backward(
        &self,
        queue: Queue<'_, Stream>,
        args: &EmbeddingBackwardArgs<'_>,
    ) -> Result<()> {
        launch!(self, queue, "embedding_backward", args => |[g, i, w]| {
            kernels::embedding_backward(g, i, w)
        })
    }

    unsafe fn cross_entropy(
        &self,
        queue: Queue<'_, Stream>,
        args: &CrossEntropyArgs<'_>,
    ) -> Result<()> {
        let ignore = args.ignore_index;
        launch!(self, queue, "cross_entropy", args => |[l, t, o]| {
            kernels::cross_entropy(l, t, o, ignore)
        })
    }

    unsafe fn cross_entropy_backward(
        &self,
        queue: Queue<'_, Stream>,
        args: &CrossEntropyBackwardArgs<'_>,
    ) -> Result<()> {
        let (ignore, grad_loss) = (args.ignore_index, args.grad_loss);
        launch!(self, queue, "cross_entropy_backward", args => |[l, t, g]| {
            kernels::cross_entropy_backward(l, t, g, grad_loss, ignore)
        })
    }

    unsafe fn adamw(&self, queue: Queue<'_, Stream>, args: &AdamwArgs<'_>) -> Result<()> {
        let a = *args;
        let (lr, b1, b2, eps, wd, step) = (a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.step);
        launch!(self, queue, "adamw", args => |[g, p, m, v]| {
            kernels::adamw(p, g, m, v, lr, b1, b2, eps, wd, step)
        })
    }

    unsafe fn scale(&self, queue: Queue<'_, Stream>, args: &ScaleArgs<'_>) -> Result<()> {
        let alpha = args.alpha;
        launch!(self, queue, "scale", args => |[t]| kernels::scale(t, alpha))
    }
}

export_plugin!(
    Ferrite,
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

/// The kernel of a comparison.
fn compare_kernel(op: CompareOp) -> kernels::CompareOp {
    match op {
        CompareOp::Eq => kernels::CompareOp::Eq,
        CompareOp::Ne => kernels::CompareOp::Ne,
        CompareOp::Lt => kernels::CompareOp::Lt,
        CompareOp::Le => kernels::CompareOp::Le,
        CompareOp::Gt => kernels::CompareOp::Gt,
        CompareOp::Ge => kernels::CompareOp::Ge,
    }
}

/// The kernel of a bitwise operator.
fn bitwise_kernel(op: BitwiseOp) -> kernels::BitwiseOp {
    match op {
        BitwiseOp::BitwiseAnd => kernels::BitwiseOp::And,
        BitwiseOp::BitwiseOr => kernels::BitwiseOp::Or,
        BitwiseOp::BitwiseXor => kernels::BitwiseOp::Xor,
    }
}

#[cfg(test)]
mod tests;

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
//! `POLYCHIP_FERRITE_PEAK_GFLOPS` per device (default 95).

/// Launches an operator's kernel on its views through
/// [`ops::launch_outputs`]: `launch!(self, queue, op, outputs, [name: desc,
/// ...], |[views...]| kernel call)`, the last `outputs` operands being the
/// outputs.
macro_rules! launch {
    ($self:ident, $queue:ident, $op:expr, $outputs:expr, [$($name:literal: $desc:expr),* $(,)?], |[$($v:ident),* $(,)?]| $call:expr) => {{
        let operands = [$(($name, $desc)),*];
        launch!($self, $queue, $op, $outputs, operands, |[$($v),*]| $call)
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
    ActivationBackwardArgs, ActivationOp, AdamwArgs, AttentionArgs, AttentionBackwardArgs,
    BinaryArgs, BinaryOp, CopyArgs, CopyKind, CrossEntropyArgs, CrossEntropyBackwardArgs,
    DeviceProps, EmbeddingArgs, EmbeddingBackwardArgs, FillArgs, Host, LayerNormArgs,
    LayerNormBackwardArgs, LinearArgs, MatmulArgs, Plugin, PowScalarArgs, Queue, ReduceArgs,
    ReduceOp, Result, RmsNormArgs, RmsNormBackwardArgs, RopeArgs, ScaleArgs, SoftmaxArgs,
    SoftmaxBackwardArgs, SumSquaresArgs, SwigluArgs, SwigluBackwardArgs, UnaryArgs, UnaryOp,
    export_plugin,
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

    unsafe fn fill(&self, queue: Queue<'_, Stream>, args: &FillArgs<'_>) -> Result<()> {
        let value = args.value;
        let kernel = move |[out]: &[View<'_>; 1]| {
            // SAFETY: `launch` checked that `out` lies in live memory of the
            // device, which the host keeps valid until the work has run.
            unsafe { kernels::fill(out, value) }
        };
        // SAFETY: forwarded from this method's contract.
        unsafe { ops::launch(&self.memory, queue, "fill", [("out", &args.out)], kernel) }
    }

    unsafe fn copy(&self, queue: Queue<'_, Stream>, args: &CopyArgs<'_>) -> Result<()> {
        let operands = [("src", &args.src), ("dst", &args.dst)];
        let kernel = |[src, dst]: &[View<'_>; 2]| {
            // SAFETY: `launch` checked both views lie in live memory and do
            // not partly overlap when dense; the host keeps them valid.
            unsafe { kernels::copy(src, dst) }
        };
        // SAFETY: forwarded from this method's contract.
        unsafe { ops::launch(&self.memory, queue, "copy", operands, kernel) }
    }

    unsafe fn cast(&self, queue: Queue<'_, Stream>, args: &CopyArgs<'_>) -> Result<()> {
        let operands = [("src", &args.src), ("dst", &args.dst)];
        let kernel = |[src, dst]: &[View<'_>; 2]| {
            // SAFETY: as for `copy`.
            unsafe { kernels::cast(src, dst) }
        };
        // SAFETY: forwarded from this method's contract.
        unsafe { ops::launch(&self.memory, queue, "cast", operands, kernel) }
    }

    unsafe fn binary(&self, queue: Queue<'_, Stream>, args: &BinaryArgs<'_>) -> Result<()> {
        let op = match args.op {
            BinaryOp::Add => kernels::BinaryOp::Add,
            BinaryOp::Sub => kernels::BinaryOp::Sub,
            BinaryOp::Mul => kernels::BinaryOp::Mul,
            BinaryOp::Div => kernels::BinaryOp::Div,
        };
        let alpha = args.alpha;
        let operands = [("a", &args.a), ("b", &args.b), ("out", &args.out)];
        let kernel = move |[a, b, out]: &[View<'_>; 3]| {
            // SAFETY: `launch` checked the views lie in live memory and that
            // `out` is exactly `a`/`b` or does not partly overlap them when
            // dense; the host keeps them valid.
            unsafe { kernels::binary(op, a, b, out, alpha) }
        };
        // SAFETY: forwarded from this method's contract.
        unsafe { ops::launch(&self.memory, queue, args.op.name(), operands, kernel) }
    }

    unsafe fn matmul(&self, queue: Queue<'_, Stream>, args: &MatmulArgs<'_>) -> Result<()> {
        let &MatmulArgs {
            alpha,
            beta,
            transpose_a,
            transpose_b,
            ..
        } = args;
        let operands = [("a", &args.a), ("b", &args.b), ("out", &args.out)];
        let kernel = move |[a, b, out]: &[View<'_>; 3]| {
            // SAFETY: as for `binary`.
            unsafe { kernels::matmul(a, b, out, transpose_a, transpose_b, alpha, beta) }
        };
        // SAFETY: forwarded from this method's contract.
        unsafe { ops::launch(&self.memory, queue, "matmul", operands, kernel) }
    }

    unsafe fn softmax(&self, queue: Queue<'_, Stream>, args: &SoftmaxArgs<'_>) -> Result<()> {
        let operands = [("input", &args.input), ("out", &args.out)];
        let kernel = |[input, out]: &[View<'_>; 2]| {
            // SAFETY: as for `binary`.
            unsafe { kernels::softmax(input, out) }
        };
        // SAFETY: forwarded from this method's contract.
        unsafe { ops::launch(&self.memory, queue, "softmax", operands, kernel) }
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
        };
        launch!(self, queue, op.name(), 1, ["input": &args.input, "out": &args.out], |[i, o]| kernels::unary(k, i, o))
    }

    unsafe fn pow_scalar(&self, queue: Queue<'_, Stream>, args: &PowScalarArgs<'_>) -> Result<()> {
        let e = args.exponent;
        launch!(self, queue, "pow_scalar", 1, ["input": &args.input, "out": &args.out], |[i, o]| kernels::pow_scalar(i, o, e))
    }

    unsafe fn activation_backward(
        &self,
        queue: Queue<'_, Stream>,
        op: ActivationOp,
        args: &ActivationBackwardArgs<'_>,
    ) -> Result<()> {
        let k = match op {
            ActivationOp::Relu => kernels::ActivationOp::Relu,
            ActivationOp::Silu => kernels::ActivationOp::Silu,
            ActivationOp::Gelu => kernels::ActivationOp::Gelu,
        };
        let operands = [
            ("grad_out", &args.grad_out),
            ("input", &args.input),
            ("grad_in", &args.grad_in),
        ];
        launch!(self, queue, op.name(), 1, operands, |[g, i, gi]| {
            kernels::activation_backward(k, g, i, gi)
        })
    }

    unsafe fn swiglu(&self, queue: Queue<'_, Stream>, args: &SwigluArgs<'_>) -> Result<()> {
        launch!(self, queue, "swiglu", 1, ["gate": &args.gate, "up": &args.up, "out": &args.out], |[g, u, o]| kernels::swiglu(g, u, o))
    }

    unsafe fn swiglu_backward(
        &self,
        queue: Queue<'_, Stream>,
        args: &SwigluBackwardArgs<'_>,
    ) -> Result<()> {
        let operands = [
            ("gate", &args.gate),
            ("up", &args.up),
            ("grad_out", &args.grad_out),
            ("grad_gate", &args.grad_gate),
            ("grad_up", &args.grad_up),
        ];
        launch!(self, queue, "swiglu_backward", 2, operands, |[
            g,
            u,
            go,
            gg,
            gu,
        ]| {
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
        launch!(self, queue, op.name(), 1, ["input": &args.input, "out": &args.out], |[i, o]| kernels::reduce(k, i, o, dim, keepdim))
    }

    unsafe fn sum_squares(
        &self,
        queue: Queue<'_, Stream>,
        args: &SumSquaresArgs<'_>,
    ) -> Result<()> {
        launch!(self, queue, "sum_squares", 1, ["input": &args.input, "out": &args.out], |[i, o]| kernels::sum_squares(i, o))
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
        launch!(self, queue, "log_softmax", 1, ["input": &args.input, "out": &args.out], |[i, o]| kernels::log_softmax(i, o))
    }

    unsafe fn softmax_backward(
        &self,
        queue: Queue<'_, Stream>,
        log: bool,
        args: &SoftmaxBackwardArgs<'_>,
    ) -> Result<()> {
        let operands = [
            ("out", &args.out),
            ("grad_out", &args.grad_out),
            ("grad_in", &args.grad_in),
        ];
        launch!(self, queue, "softmax_backward", 1, operands, |[
            y,
            g,
            gi,
        ]| {
            kernels::softmax_backward(y, g, gi, log)
        })
    }

    unsafe fn rms_norm(&self, queue: Queue<'_, Stream>, args: &RmsNormArgs<'_>) -> Result<()> {
        let eps = args.eps;
        let operands = [
            ("input", &args.input),
            ("weight", &args.weight),
            ("out", &args.out),
            ("inv_rms", &args.inv_rms),
        ];
        launch!(self, queue, "rms_norm", 2, operands, |[i, w, o, r]| {
            kernels::rms_norm(i, w, o, r, eps)
        })
    }

    unsafe fn rms_norm_backward(
        &self,
        queue: Queue<'_, Stream>,
        args: &RmsNormBackwardArgs<'_>,
    ) -> Result<()> {
        let a = args;
        let operands = [
            ("grad_out", &a.grad_out),
            ("input", &a.input),
            ("weight", &a.weight),
            ("inv_rms", &a.inv_rms),
            ("grad_input", &a.grad_input),
            ("grad_weight", &a.grad_weight),
        ];
        launch!(self, queue, "rms_norm_backward", 2, operands, |[
            g,
            i,
            w,
            r,
            gi,
            gw,
        ]| {
            kernels::rms_norm_backward(g, i, w, r, gi, gw)
        })
    }

    unsafe fn layer_norm(&self, queue: Queue<'_, Stream>, args: &LayerNormArgs<'_>) -> Result<()> {
        let (a, eps) = (args, args.eps);
        let operands = [
            ("input", &a.input),
            ("weight", &a.weight),
            ("bias", &a.bias),
            ("out", &a.out),
            ("mean", &a.mean),
            ("rstd", &a.rstd),
        ];
        launch!(self, queue, "layer_norm", 3, operands, |[
            i,
            w,
            b,
            o,
            m,
            r,
        ]| {
            kernels::layer_norm(i, w, b, o, m, r, eps)
        })
    }

    unsafe fn layer_norm_backward(
        &self,
        queue: Queue<'_, Stream>,
        args: &LayerNormBackwardArgs<'_>,
    ) -> Result<()> {
        let a = args;
        let operands = [
            ("grad_out", &a.grad_out),
            ("input", &a.input),
            ("weight", &a.weight),
            ("mean", &a.mean),
            ("rstd", &a.rstd),
            ("grad_input", &a.grad_input),
            ("grad_weight", &a.grad_weight),
            ("grad_bias", &a.grad_bias),
        ];
        launch!(self, queue, "layer_norm_backward", 3, operands, |[
            g,
            i,
            w,
            m,
            r,
            gi,
            gw,
            gb,
        ]| {
            kernels::layer_norm_backward(g, i, w, m, r, gi, gw, gb)
        })
    }

    unsafe fn rope(
        &self,
        queue: Queue<'_, Stream>,
        backward: bool,
        args: &RopeArgs<'_>,
    ) -> Result<()> {
        let interleaved = args.interleaved;
        let op = if backward { "rope_backward" } else { "rope" };
        let operands = [
            ("input", &args.input),
            ("cos", &args.cos),
            ("sin", &args.sin),
            ("out", &args.out),
        ];
        launch!(self, queue, op, 1, operands, |[i, c, s, o]| kernels::rope(
            i,
            c,
            s,
            o,
            interleaved,
            backward
        ))
    }

    unsafe fn attention(&self, queue: Queue<'_, Stream>, args: &AttentionArgs<'_>) -> Result<()> {
        let (a, scale, causal) = (args, args.scale, args.causal);
        let operands = [
            ("q", &a.q),
            ("k", &a.k),
            ("v", &a.v),
            ("out", &a.out),
            ("lse", &a.lse),
        ];
        launch!(self, queue, "attention", 2, operands, |[q, k, v, o, l]| {
            kernels::attention(q, k, v, o, l, scale, causal)
        })
    }

    unsafe fn attention_backward(
        &self,
        queue: Queue<'_, Stream>,
        args: &AttentionBackwardArgs<'_>,
    ) -> Result<()> {
        let (a, scale, causal) = (args, args.scale, args.causal);
        let operands = [
            ("q", &a.q),
            ("k", &a.k),
            ("v", &a.v),
            ("out", &a.out),
            ("lse", &a.lse),
            ("grad_out", &a.grad_out),
            ("grad_q", &a.grad_q),
            ("grad_k", &a.grad_k),
            ("grad_v", &a.grad_v),
        ];
        launch!(self, queue, "attention_backward", 3, operands, |[
            q,
            k,
            v,
            o,
            l,
            g,
            gq,
            gk,
            gv,
        ]| {
            kernels::attention_backward(q, k, v, o, l, g, gq, gk, gv, scale, causal)
        })
    }

    unsafe fn embedding(&self, queue: Queue<'_, Stream>, args: &EmbeddingArgs<'_>) -> Result<()> {
        let operands = [
            ("weight", &args.weight),
            ("indices", &args.indices),
            ("out", &args.out),
        ];
        launch!(self, queue, "embedding", 1, operands, |[w, i, o]| {
            kernels::embedding(w, i, o)
        })
    }

    unsafe fn embedding_backward(
        &self,
        queue: Queue<'_, Stream>,
        args: &EmbeddingBackwardArgs<'_>,
    ) -> Result<()> {
        let operands = [
            ("grad_out", &args.grad_out),
            ("indices", &args.indices),
            ("grad_weight", &args.grad_weight),
        ];
        launch!(self, queue, "embedding_backward", 1, operands, |[
            g,
            i,
            w,
        ]| {
            kernels::embedding_backward(g, i, w)
        })
    }

    unsafe fn cross_entropy(
        &self,
        queue: Queue<'_, Stream>,
        args: &CrossEntropyArgs<'_>,
    ) -> Result<()> {
        let ignore = args.ignore_index;
        let operands = [
            ("logits", &args.logits),
            ("targets", &args.targets),
            ("loss", &args.loss),
        ];
        launch!(self, queue, "cross_entropy", 1, operands, |[l, t, o]| {
            kernels::cross_entropy(l, t, o, ignore)
        })
    }

    unsafe fn cross_entropy_backward(
        &self,
        queue: Queue<'_, Stream>,
        args: &CrossEntropyBackwardArgs<'_>,
    ) -> Result<()> {
        let (ignore, grad_loss) = (args.ignore_index, args.grad_loss);
        let operands = [
            ("logits", &args.logits),
            ("targets", &args.targets),
            ("grad_logits", &args.grad_logits),
        ];
        launch!(
            self,
            queue,
            "cross_entropy_backward",
            1,
            operands,
            |[l, t, g]| kernels::cross_entropy_backward(l, t, g, grad_loss, ignore)
        )
    }

    unsafe fn adamw(&self, queue: Queue<'_, Stream>, args: &AdamwArgs<'_>) -> Result<()> {
        let a = *args;
        let (lr, b1, b2, eps, wd, step) = (a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.step);
        let operands = [
            ("grad", &args.grad),
            ("param", &args.param),
            ("exp_avg", &args.exp_avg),
            ("exp_avg_sq", &args.exp_avg_sq),
        ];
        launch!(self, queue, "adamw", 3, operands, |[g, p, m, v]| {
            kernels::adamw(p, g, m, v, lr, b1, b2, eps, wd, step)
        })
    }

    unsafe fn scale(&self, queue: Queue<'_, Stream>, args: &ScaleArgs<'_>) -> Result<()> {
        let alpha = args.alpha;
        launch!(self, queue, "scale", 1, ["tensor": &args.tensor], |[t]| kernels::scale(t, alpha))
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
        embedding_backward, cross_entropy, cross_entropy_backward, adamw, scale
    ]
);

#[cfg(test)]
mod tests;

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

mod config;
mod memory;
mod ops;
mod stream;

use std::ffi::CStr;

use ferrite_kernels::{self as kernels, View};
use polychip_plugin_sdk::{
    BinaryArgs, BinaryOp, CopyArgs, CopyKind, DeviceProps, FillArgs, Host, MatmulArgs, Plugin,
    Queue, Result, SoftmaxArgs, export_plugin,
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
}

export_plugin!(Ferrite, ops: [fill, copy, cast, add, sub, mul, div, matmul, softmax]);

#[cfg(test)]
mod tests;

//! "Planted": a test-only plugin whose bugs are planted on purpose, so that
//! tests can prove the host and the conformance suite catch them. One device
//! of ordinary host memory; streams with a worker thread each (see
//! [`streams`]).
//!
//! Planted bugs, each of which the conformance suite must flag by name:
//!
//! - `matmul` panics (the SDK must turn it into an error object and the host
//!   must keep working);
//! - `softmax` does not subtract the row maximum, so large logits overflow;
//! - `cast` to bf16 truncates instead of rounding to nearest even;
//! - `add` ignores `a`'s strides (treats it as compact);
//! - `exp` also writes its result into its input;
//! - `mul` leaves the last output element unwritten;
//! - `sqrt` dereferences NULL (a segfault) when the tensor has 7 elements.
//!
//! `fill` and `copy` are correct. Only f32 is implemented (and f32 to bf16
//! or f32 for `cast`); other dtypes answer "unimplemented".
//!
//! That is the plugin when `POLYCHIP_PLANTED_BUG` is unset. When it is set
//! (read once, at plugin init), the plugin is instead a correct
//! implementation of every operator in every dtype the bundled Ferrite
//! plugin supports ([`full`], through the `ferrite-kernels` crate), except
//! for the one bug it names from the catalog in [`mutants`] (one operator
//! each: layouts, aliasing, writes outside the output, size thresholds,
//! numerics, rounding ties, edge values, refusals and the error-object
//! contract). `POLYCHIP_PLANTED_BUG=none` plants nothing; an unknown name
//! makes plugin init fail with a message listing the known names. With
//! `POLYCHIP_PLANTED_OPS=1.1` (or `1.2`, `1.3`) as well, the op table leaves
//! the operators ABI 1.2 to 1.4 (or 1.3 and 1.4, or 1.4) added NULL, as a
//! plugin built before them has it (the PyTorch tests check that those aten operators then
//! fall back to the CPU).
//!
//! Contract bugs that the SDK's checks would prevent are raw `extern "C"`
//! op-table entries ([`mutants::contract`]), patched into the table after
//! the SDK fills it: this crate exports its own `polychip_plugin_init_v1`,
//! which is `export_plugin!`'s with that one extra step.
//!
//! Every allocation has 64 bytes of padding on each side, so that a bug
//! writing just outside its output stays memory safe (and shows only to a
//! suite that checks guard zones).

pub mod full;
pub mod mutants;
pub mod streams;

use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::Mutex;

use polychip_plugin_sdk::{
    ActivationBackwardArgs, ActivationBackwardOp, AdamwArgs, ArangeArgs, AttentionArgs,
    AttentionBackwardArgs, BinaryArgs, BinaryOp, BitwiseArgs, BitwiseOp, CastArgs, CompareArgs,
    CompareOp, ConvertArgs, CopyArgs, CopyKind, CrossEntropyArgs, CrossEntropyBackwardArgs,
    CumsumArgs, DType, DeviceProps, EmbeddingArgs, EmbeddingBackwardArgs, Error, FillArgs,
    GatherArgs, Host, LayerNormArgs, LayerNormBackwardArgs, LinearArgs, MaskedFillArgs, MatmulArgs,
    Operators, OutputBackwardArgs, OutputBackwardOp, Plugin, PowScalarArgs, Queue, ReduceArgs,
    ReduceBoolArgs, ReduceBoolOp, ReduceOp, Result, RmsNormArgs, RmsNormBackwardArgs, RopeArgs,
    ScaleArgs, ScatterAddArgs, SelectArgs, SoftmaxArgs, SoftmaxBackwardArgs, SumSquaresArgs,
    SwigluArgs, SwigluBackwardArgs, TensorDesc, UnaryArgs, UnaryOp,
};

use mutants::{Bug, Mode, is};
use streams::{Event, OwnedDesc, Stream};

/// The plugin's state: live allocations and their sizes.
#[derive(Debug, Default)]
pub struct Planted {
    allocations: Mutex<HashMap<usize, Layout>>,
}

/// Legacy mode's capacity; full mode's is larger (realistic sizes).
const CAPACITY: u64 = 64 << 20;
const FULL_CAPACITY: u64 = 16 << 30;
/// Padding before and after every allocation.
const PAD: usize = 64;

fn capacity() -> u64 {
    if full() { FULL_CAPACITY } else { CAPACITY }
}

/// Whether `POLYCHIP_PLANTED_BUG` selected full mode.
fn full() -> bool {
    mutants::mode() != Mode::Legacy
}

impl Plugin for Planted {
    type Stream = Stream;
    type Event = Event;
    const VENDOR: &'static std::ffi::CStr = c"Planted";
    const VERSION: &'static std::ffi::CStr = c"0.1.0";

    fn new(_host: &Host) -> Result<Self> {
        mutants::init_mode().map_err(Error::invalid)?;
        Ok(Planted::default())
    }

    fn device_count(&self) -> u32 {
        1
    }

    fn device_props(&self, _device: u32) -> Result<DeviceProps> {
        Ok(DeviceProps {
            name: "Planted P0".into(),
            memory_bytes: capacity(),
            host_visible: true,
            ..DeviceProps::default()
        })
    }

    fn alloc(&self, _device: u32, bytes: u64) -> Result<*mut u8> {
        let capacity = capacity();
        if bytes > capacity {
            return Err(Error::out_of_memory(format!(
                "planted: {bytes} bytes exceed {capacity}"
            )));
        }
        let layout = Layout::from_size_align(bytes as usize + 2 * PAD, 64)
            .map_err(|e| Error::invalid(e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let base = unsafe { std::alloc::alloc(layout) };
        if base.is_null() {
            return Err(Error::out_of_memory("planted: the system allocator failed"));
        }
        // SAFETY: PAD < the allocation's size.
        let ptr = unsafe { base.add(PAD) };
        self.allocations
            .lock()
            .unwrap()
            .insert(ptr as usize, layout);
        Ok(ptr)
    }

    unsafe fn free(&self, _device: u32, ptr: *mut u8) -> Result<()> {
        let layout = self
            .allocations
            .lock()
            .unwrap()
            .remove(&(ptr as usize))
            .ok_or_else(|| Error::invalid("planted: free of an unknown pointer"))?;
        // SAFETY: the allocation starts PAD bytes before the pointer handed
        // out, has this layout and is freed once.
        unsafe { std::alloc::dealloc(ptr.sub(PAD), layout) };
        Ok(())
    }

    unsafe fn memcpy(
        &self,
        q: Queue<'_, Stream>,
        kind: CopyKind,
        dst: *mut u8,
        src: *const u8,
        bytes: usize,
    ) -> Result<()> {
        enter(q);
        let src = if kind == CopyKind::DeviceToDevice && is(Bug::MemcpyD2dFromAllocationStart) {
            // The start of the allocation holding `src` (the greatest
            // handed-out pointer at or below it).
            let allocations = self.allocations.lock().unwrap();
            let start = allocations.keys().filter(|&&p| p <= src as usize).max();
            start.map_or(src, |&p| p as *const u8)
        } else {
            src
        };
        // SAFETY: the caller guarantees both ranges (all memory here is host memory).
        unsafe { std::ptr::copy_nonoverlapping(src, dst, bytes) };
        Ok(())
    }

    fn stream_create(&self, _device: u32) -> Result<Stream> {
        Stream::new()
    }
    fn stream_synchronize(&self, stream: &Stream) -> Result<()> {
        stream.synchronize()
    }
    fn event_create(&self, _device: u32) -> Result<Event> {
        Ok(Event::default())
    }
    fn event_record(&self, event: &Event, q: Queue<'_, Stream>) -> Result<()> {
        event.record(q.stream);
        Ok(())
    }
    fn stream_wait_event(&self, q: Queue<'_, Stream>, event: &Event) -> Result<()> {
        event.wait_on(q.stream);
        Ok(())
    }
    fn event_synchronize(&self, event: &Event) -> Result<()> {
        event.synchronize();
        Ok(())
    }
}

/// Full mode's `copy` and `fill`: queued on their stream, or run at once
/// on the default stream.
fn queue_or_run(
    q: Queue<'_, Stream>,
    job: impl FnOnce() -> Result<()> + Send + 'static,
) -> Result<()> {
    match q.stream {
        Some(stream) => {
            stream.enqueue(Box::new(job));
            Ok(())
        }
        None => job(),
    }
}

/// Before an operator runs on the calling thread: the work queued on its
/// stream first (see [`streams`]).
fn enter(q: Queue<'_, Stream>) {
    if let Some(stream) = q.stream {
        stream.drain();
    }
}

impl Operators for Planted {
    unsafe fn fill(&self, q: Queue<'_, Stream>, args: &FillArgs<'_>) -> Result<()> {
        if full() {
            let (out, value) = (OwnedDesc::new(&args.out), args.value);
            return queue_or_run(q, move || {
                let args = FillArgs {
                    out: out.desc(),
                    value,
                };
                // SAFETY: forwarded contract; the host keeps the memory
                // alive until the stream is synchronised.
                unsafe { full::ops::fill(&args) }
            });
        }
        enter(q);
        if args.out.dtype != DType::F32 || !args.out.is_contiguous() {
            return Err(Error::unimplemented(
                "planted: fill supports compact f32 only",
            ));
        }
        let n = args.out.numel();
        if n == 0 {
            return Ok(());
        }
        // SAFETY: the host passes a live, compact f32 tensor of n elements.
        let out = unsafe { std::slice::from_raw_parts_mut(args.out.data.cast::<f32>(), n) };
        out.fill(args.value as f32);
        Ok(())
    }

    unsafe fn matmul(&self, q: Queue<'_, Stream>, args: &MatmulArgs<'_>) -> Result<()> {
        enter(q);
        if full() {
            // SAFETY: forwarded contract.
            return unsafe { full::ops::matmul(args) };
        }
        panic!("planted bug: matmul panics on shape {:?}", args.a.shape);
    }

    unsafe fn copy(&self, q: Queue<'_, Stream>, args: &CopyArgs<'_>) -> Result<()> {
        if full() {
            let (src, dst) = (OwnedDesc::new(&args.src), OwnedDesc::new(&args.dst));
            return queue_or_run(q, move || {
                let args = CopyArgs {
                    src: src.desc(),
                    dst: dst.desc(),
                };
                // SAFETY: as `fill`'s.
                unsafe { full::ops::copy(&args) }
            });
        }
        enter(q);
        let size = args.src.dtype.size();
        for (s, d) in addresses(&args.src, size)
            .into_iter()
            .zip(addresses(&args.dst, size))
        {
            // SAFETY: addresses of live tensors of one dtype.
            unsafe { std::ptr::copy_nonoverlapping(s, d, size) };
        }
        Ok(())
    }

    unsafe fn cast(&self, q: Queue<'_, Stream>, args: &CastArgs<'_>) -> Result<()> {
        enter(q);
        if full() {
            // SAFETY: forwarded contract.
            return unsafe { full::ops::cast(args) };
        }
        f32_only("cast", &args.src)?;
        let src = addresses(&args.src, 4);
        match args.dst.dtype {
            DType::F32 => {
                for (s, d) in src.into_iter().zip(addresses(&args.dst, 4)) {
                    // SAFETY: addresses of live f32 tensors.
                    unsafe { set(d, get(s)) };
                }
            }
            DType::BF16 => {
                for (s, d) in src.into_iter().zip(addresses(&args.dst, 2)) {
                    // SAFETY: addresses of live tensors. Planted: truncation,
                    // not round-to-nearest-even.
                    unsafe {
                        d.cast::<u16>()
                            .write_unaligned((get(s).to_bits() >> 16) as u16)
                    };
                }
            }
            _ => {
                return Err(Error::unimplemented(
                    "planted: cast from f32 to f32 or bf16 only",
                ));
            }
        }
        Ok(())
    }

    unsafe fn binary(
        &self,
        q: Queue<'_, Stream>,
        op: BinaryOp,
        args: &BinaryArgs<'_>,
    ) -> Result<()> {
        if !(op == BinaryOp::Add && is(Bug::AddIgnoresStream)) {
            enter(q);
        }
        if full() {
            // SAFETY: forwarded contract.
            return unsafe { full::ops::binary(op, args) };
        }
        f32_only(op.name(), &args.a)?;
        if args.a.shape != args.out.shape || args.b.shape != args.out.shape {
            return Err(Error::unimplemented("planted: no broadcasting"));
        }
        // Planted (add): a's strides are ignored, as if it were compact.
        let a = if op == BinaryOp::Add {
            addresses(
                &TensorDesc::new(args.a.data, DType::F32, args.a.shape, None),
                4,
            )
        } else {
            addresses(&args.a, 4)
        };
        let b = addresses(&args.b, 4);
        let out = addresses(&args.out, 4);
        // Planted (mul): the last element is never written.
        let n = if op == BinaryOp::Mul {
            out.len().saturating_sub(1)
        } else {
            out.len()
        };
        for i in 0..n {
            // SAFETY: addresses of live f32 tensors.
            unsafe {
                let (x, y) = (get(a[i]), get(b[i]));
                let r = match op {
                    BinaryOp::Add => x + args.alpha as f32 * y,
                    BinaryOp::Mul => x * y,
                    _ => return Err(Error::unimplemented("planted: add and mul only")),
                };
                set(out[i], r);
            }
        }
        Ok(())
    }

    unsafe fn softmax(&self, q: Queue<'_, Stream>, args: &SoftmaxArgs<'_>) -> Result<()> {
        enter(q);
        if full() {
            // SAFETY: forwarded contract.
            return unsafe { full::ops::softmax(args) };
        }
        f32_only("softmax", &args.input)?;
        let n = *args.input.shape.last().unwrap_or(&1) as usize;
        let input = addresses(&args.input, 4);
        let out = addresses(&args.out, 4);
        for (rows_in, rows_out) in input.chunks(n.max(1)).zip(out.chunks(n.max(1))) {
            // Planted: no subtraction of the row maximum.
            // SAFETY: addresses of live f32 tensors.
            let sum: f32 = rows_in.iter().map(|&p| unsafe { get(p) }.exp()).sum();
            for (&i, &o) in rows_in.iter().zip(rows_out) {
                // SAFETY: as above.
                unsafe { set(o, get(i).exp() / sum) };
            }
        }
        Ok(())
    }

    unsafe fn unary(&self, q: Queue<'_, Stream>, op: UnaryOp, args: &UnaryArgs<'_>) -> Result<()> {
        enter(q);
        if full() {
            // SAFETY: forwarded contract.
            return unsafe { full::ops::unary(op, args) };
        }
        // SAFETY: forwarded contract.
        unsafe { self.planted_unary(op, args) }
    }

    unsafe fn activation_backward(
        &self,
        q: Queue<'_, Stream>,
        op: ActivationBackwardOp,
        args: &ActivationBackwardArgs<'_>,
    ) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::activation_backward(op, args) }
    }

    unsafe fn output_backward(
        &self,
        q: Queue<'_, Stream>,
        op: OutputBackwardOp,
        args: &OutputBackwardArgs<'_>,
    ) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::output_backward(op, args) }
    }

    unsafe fn convert(&self, q: Queue<'_, Stream>, args: &ConvertArgs<'_>) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::convert(args) }
    }

    unsafe fn arange(&self, q: Queue<'_, Stream>, args: &ArangeArgs<'_>) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::arange(args) }
    }

    unsafe fn select(&self, q: Queue<'_, Stream>, args: &SelectArgs<'_>) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::select(args) }
    }

    unsafe fn masked_fill(&self, q: Queue<'_, Stream>, args: &MaskedFillArgs<'_>) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::masked_fill(args) }
    }

    unsafe fn compare(
        &self,
        q: Queue<'_, Stream>,
        op: CompareOp,
        args: &CompareArgs<'_>,
    ) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::compare(op, args) }
    }

    unsafe fn gather(&self, q: Queue<'_, Stream>, args: &GatherArgs<'_>) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::gather(args) }
    }

    unsafe fn scatter_add(&self, q: Queue<'_, Stream>, args: &ScatterAddArgs<'_>) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::scatter_add(args) }
    }

    unsafe fn cumsum(&self, q: Queue<'_, Stream>, args: &CumsumArgs<'_>) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::cumsum(args) }
    }

    unsafe fn reduce_bool(
        &self,
        q: Queue<'_, Stream>,
        op: ReduceBoolOp,
        args: &ReduceBoolArgs<'_>,
    ) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::reduce_bool(op, args) }
    }

    unsafe fn bitwise(
        &self,
        q: Queue<'_, Stream>,
        op: BitwiseOp,
        args: &BitwiseArgs<'_>,
    ) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::bitwise(op, args) }
    }

    unsafe fn reduce(
        &self,
        q: Queue<'_, Stream>,
        op: ReduceOp,
        args: &ReduceArgs<'_>,
    ) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::reduce(op, args) }
    }

    unsafe fn pow_scalar(&self, q: Queue<'_, Stream>, args: &PowScalarArgs<'_>) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::pow_scalar(args) }
    }

    unsafe fn swiglu(&self, q: Queue<'_, Stream>, args: &SwigluArgs<'_>) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::swiglu(args) }
    }

    unsafe fn swiglu_backward(
        &self,
        q: Queue<'_, Stream>,
        args: &SwigluBackwardArgs<'_>,
    ) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::swiglu_backward(args) }
    }

    unsafe fn sum_squares(&self, q: Queue<'_, Stream>, args: &SumSquaresArgs<'_>) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::sum_squares(args) }
    }

    unsafe fn linear(&self, q: Queue<'_, Stream>, args: &LinearArgs<'_>) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::linear(args) }
    }

    unsafe fn log_softmax(&self, q: Queue<'_, Stream>, args: &SoftmaxArgs<'_>) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::log_softmax(args) }
    }

    unsafe fn softmax_backward(
        &self,
        q: Queue<'_, Stream>,
        args: &SoftmaxBackwardArgs<'_>,
    ) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::softmax_backward(args) }
    }

    unsafe fn log_softmax_backward(
        &self,
        q: Queue<'_, Stream>,
        args: &SoftmaxBackwardArgs<'_>,
    ) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::log_softmax_backward(args) }
    }

    unsafe fn rms_norm(&self, q: Queue<'_, Stream>, args: &RmsNormArgs<'_>) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::rms_norm(args) }
    }

    unsafe fn rms_norm_backward(
        &self,
        q: Queue<'_, Stream>,
        args: &RmsNormBackwardArgs<'_>,
    ) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::rms_norm_backward(args) }
    }

    unsafe fn layer_norm(&self, q: Queue<'_, Stream>, args: &LayerNormArgs<'_>) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::layer_norm(args) }
    }

    unsafe fn layer_norm_backward(
        &self,
        q: Queue<'_, Stream>,
        args: &LayerNormBackwardArgs<'_>,
    ) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::layer_norm_backward(args) }
    }

    unsafe fn rope(&self, q: Queue<'_, Stream>, args: &RopeArgs<'_>) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::rope(args, false) }
    }

    unsafe fn rope_backward(&self, q: Queue<'_, Stream>, args: &RopeArgs<'_>) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::rope(args, true) }
    }

    unsafe fn attention(&self, q: Queue<'_, Stream>, args: &AttentionArgs<'_>) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::attention(args) }
    }

    unsafe fn attention_backward(
        &self,
        q: Queue<'_, Stream>,
        args: &AttentionBackwardArgs<'_>,
    ) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::attention_backward(args) }
    }

    unsafe fn embedding(&self, q: Queue<'_, Stream>, args: &EmbeddingArgs<'_>) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::embedding(args) }
    }

    unsafe fn embedding_backward(
        &self,
        q: Queue<'_, Stream>,
        args: &EmbeddingBackwardArgs<'_>,
    ) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::embedding_backward(args) }
    }

    unsafe fn cross_entropy(
        &self,
        q: Queue<'_, Stream>,
        args: &CrossEntropyArgs<'_>,
    ) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::cross_entropy(args) }
    }

    unsafe fn cross_entropy_backward(
        &self,
        q: Queue<'_, Stream>,
        args: &CrossEntropyBackwardArgs<'_>,
    ) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::cross_entropy_backward(args) }
    }

    unsafe fn adamw(&self, q: Queue<'_, Stream>, args: &AdamwArgs<'_>) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::adamw(args) }
    }

    unsafe fn scale(&self, q: Queue<'_, Stream>, args: &ScaleArgs<'_>) -> Result<()> {
        enter(q);
        // SAFETY: forwarded contract (only full mode lists this operator).
        unsafe { full::ops::scale(args) }
    }
}

/// Element addresses of an f32 (or any 4-byte) tensor in row-major order.
fn addresses(t: &TensorDesc<'_>, size: usize) -> Vec<*mut u8> {
    let strides = t.strides();
    let n = t.numel();
    let mut out = Vec::with_capacity(n);
    let mut index = vec![0i64; t.ndim()];
    for _ in 0..n {
        let offset: i64 = index.iter().zip(strides.iter()).map(|(i, s)| i * s).sum();
        out.push(t.data.wrapping_offset(offset as isize * size as isize));
        for k in (0..index.len()).rev() {
            index[k] += 1;
            if index[k] < t.shape[k] {
                break;
            }
            index[k] = 0;
        }
    }
    out
}

fn f32_only(op: &str, t: &TensorDesc<'_>) -> Result<()> {
    if t.dtype == DType::F32 {
        Ok(())
    } else {
        Err(Error::unimplemented(format!(
            "planted: {op} supports f32 only"
        )))
    }
}

/// # Safety
/// `p` addresses a live f32.
unsafe fn get(p: *mut u8) -> f32 {
    // SAFETY: guaranteed by the caller.
    unsafe { p.cast::<f32>().read_unaligned() }
}

/// # Safety
/// `p` addresses a live, writable f32.
unsafe fn set(p: *mut u8, v: f32) {
    // SAFETY: guaranteed by the caller.
    unsafe { p.cast::<f32>().write_unaligned(v) }
}

impl Planted {
    /// # Safety
    /// The tensors address live host memory.
    unsafe fn planted_unary(&self, op: UnaryOp, args: &UnaryArgs<'_>) -> Result<()> {
        f32_only(op.name(), &args.input)?;
        let input = addresses(&args.input, 4);
        let out = addresses(&args.out, 4);
        if op == UnaryOp::Sqrt && input.len() == 7 {
            // Planted: a segfault on one shape.
            // SAFETY: none; this is the bug the suite must survive.
            unsafe { std::ptr::null_mut::<f32>().write_volatile(1.0) };
        }
        for (i, (&x, &o)) in input.iter().zip(&out).enumerate() {
            // SAFETY: addresses of live tensors.
            unsafe {
                let v = get(x);
                let r = match op {
                    UnaryOp::Exp => v.exp(),
                    UnaryOp::Sqrt => v.sqrt(),
                    _ => return Err(Error::unimplemented("planted: only exp and sqrt")),
                };
                set(o, r);
                if op == UnaryOp::Exp && i == 0 {
                    // Planted: the result also lands in the input.
                    set(x, r);
                }
            }
        }
        Ok(())
    }
}

/// `1.1`: full mode's op table leaves ABI 1.2's, 1.3's and 1.4's operators
/// NULL; `1.2`: it leaves ABI 1.3's and 1.4's NULL; `1.3`: ABI 1.4's.
const OPS_ENV: &str = "POLYCHIP_PLANTED_OPS";

/// The op table: legacy mode's nine operators, or every operator (of ABI
/// 1.1 only under `POLYCHIP_PLANTED_OPS=1.1`) with the selected contract
/// bug's raw entry patched in.
fn set_ops(table: &mut polychip_plugin_sdk::abi::PolychipOpTable) {
    use polychip_plugin_sdk::__export::generated as g;
    macro_rules! set {
        ($($op:ident),* $(,)?) => { $( table.$op = Some(g::$op::<Planted>); )* };
    }
    if !full() {
        set!(fill, copy, cast, add, mul, matmul, softmax, exp, sqrt);
        return;
    }
    set!(
        fill,
        copy,
        cast,
        add,
        sub,
        mul,
        div,
        matmul,
        softmax,
        neg,
        exp,
        log,
        sqrt,
        rsqrt,
        tanh,
        pow_scalar,
        relu,
        relu_backward,
        silu,
        silu_backward,
        gelu,
        gelu_backward,
        swiglu,
        swiglu_backward,
        sum,
        mean,
        max,
        argmax,
        sum_squares,
        linear,
        softmax_backward,
        log_softmax,
        log_softmax_backward,
        rms_norm,
        rms_norm_backward,
        layer_norm,
        layer_norm_backward,
        rope,
        rope_backward,
        attention,
        attention_backward,
        embedding,
        embedding_backward,
        cross_entropy,
        cross_entropy_backward,
        adamw,
        scale
    );
    let ops = std::env::var(OPS_ENV).unwrap_or_default();
    if ops != "1.1" {
        set!(
            gelu_erf,
            gelu_erf_backward,
            sigmoid,
            sigmoid_backward,
            tanh_backward
        );
    }
    if ops != "1.1" && ops != "1.2" {
        set!(
            sin,
            cos,
            select,
            masked_fill,
            convert,
            arange,
            eq,
            ne,
            lt,
            le,
            gt,
            ge
        );
    }
    if ops != "1.1" && ops != "1.2" && ops != "1.3" {
        set!(
            gather,
            scatter_add,
            cumsum,
            any,
            all,
            bitwise_and,
            bitwise_or,
            bitwise_xor
        );
    }
    mutants::contract::patch(table);
}

/// The plugin's entry symbol (ABI major 1): `export_plugin!`'s entry, plus
/// keeping the host's table for the raw entries of [`mutants::contract`]
/// and [`set_ops`] choosing the table by mode.
///
/// # Safety
/// Called by a polychip host following the ABI's entry contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_plugin_init_v1(
    host: *const polychip_plugin_sdk::abi::PolychipHostApi,
    out_plugin: *mut *const polychip_plugin_sdk::abi::PolychipPluginApi,
) -> *mut polychip_plugin_sdk::abi::PolychipError {
    if !host.is_null() {
        mutants::contract::HOST.store(host.cast_mut(), std::sync::atomic::Ordering::Release);
    }
    // SAFETY: the host follows the entry contract, which `init` requires.
    unsafe { polychip_plugin_sdk::__export::init::<Planted>(host, out_plugin, set_ops) }
}

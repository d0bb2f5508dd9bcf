//! "Planted": a test-only plugin whose bugs are planted on purpose, so that
//! tests can prove the host and the conformance suite catch them. One device
//! of ordinary host memory, synchronous streams.
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

use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::Mutex;

use polychip_plugin_sdk::{
    BinaryArgs, BinaryOp, CastArgs, CopyArgs, CopyKind, DType, DeviceProps, Error, FillArgs, Host,
    MatmulArgs, Operators, Plugin, Queue, Result, SoftmaxArgs, TensorDesc, UnaryArgs, UnaryOp,
};

/// The plugin's state: live allocations and their sizes.
#[derive(Debug, Default)]
pub struct Planted {
    allocations: Mutex<HashMap<usize, Layout>>,
}

const CAPACITY: u64 = 64 << 20;

impl Plugin for Planted {
    type Stream = ();
    type Event = ();
    const VENDOR: &'static std::ffi::CStr = c"Planted";
    const VERSION: &'static std::ffi::CStr = c"0.1.0";

    fn new(_host: &Host) -> Result<Self> {
        Ok(Planted::default())
    }

    fn device_count(&self) -> u32 {
        1
    }

    fn device_props(&self, _device: u32) -> Result<DeviceProps> {
        Ok(DeviceProps {
            name: "Planted P0".into(),
            memory_bytes: CAPACITY,
            host_visible: true,
            ..DeviceProps::default()
        })
    }

    fn alloc(&self, _device: u32, bytes: u64) -> Result<*mut u8> {
        if bytes > CAPACITY {
            return Err(Error::out_of_memory(format!(
                "planted: {bytes} bytes exceed {CAPACITY}"
            )));
        }
        let layout = Layout::from_size_align(bytes as usize, 64)
            .map_err(|e| Error::invalid(e.to_string()))?;
        // SAFETY: the layout has a non-zero size (the SDK never asks for 0 bytes).
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(Error::out_of_memory("planted: the system allocator failed"));
        }
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
        // SAFETY: the pointer was allocated with this layout and is freed once.
        unsafe { std::alloc::dealloc(ptr, layout) };
        Ok(())
    }

    unsafe fn memcpy(
        &self,
        _q: Queue<'_, ()>,
        _kind: CopyKind,
        dst: *mut u8,
        src: *const u8,
        bytes: usize,
    ) -> Result<()> {
        // SAFETY: the caller guarantees both ranges (all memory here is host memory).
        unsafe { std::ptr::copy_nonoverlapping(src, dst, bytes) };
        Ok(())
    }

    fn stream_create(&self, _device: u32) -> Result<()> {
        Ok(())
    }
    fn stream_synchronize(&self, _stream: &()) -> Result<()> {
        Ok(())
    }
    fn event_create(&self, _device: u32) -> Result<()> {
        Ok(())
    }
    fn event_record(&self, _event: &(), _q: Queue<'_, ()>) -> Result<()> {
        Ok(())
    }
    fn stream_wait_event(&self, _q: Queue<'_, ()>, _event: &()) -> Result<()> {
        Ok(())
    }
    fn event_synchronize(&self, _event: &()) -> Result<()> {
        Ok(())
    }
}

impl Operators for Planted {
    unsafe fn fill(&self, _q: Queue<'_, ()>, args: &FillArgs<'_>) -> Result<()> {
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

    unsafe fn matmul(&self, _q: Queue<'_, ()>, args: &MatmulArgs<'_>) -> Result<()> {
        panic!("planted bug: matmul panics on shape {:?}", args.a.shape);
    }

    unsafe fn copy(&self, _q: Queue<'_, ()>, args: &CopyArgs<'_>) -> Result<()> {
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

    unsafe fn cast(&self, _q: Queue<'_, ()>, args: &CastArgs<'_>) -> Result<()> {
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

    unsafe fn binary(&self, _q: Queue<'_, ()>, op: BinaryOp, args: &BinaryArgs<'_>) -> Result<()> {
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

    unsafe fn softmax(&self, _q: Queue<'_, ()>, args: &SoftmaxArgs<'_>) -> Result<()> {
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

    unsafe fn unary(&self, _q: Queue<'_, ()>, op: UnaryOp, args: &UnaryArgs<'_>) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.planted_unary(op, args) }
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

polychip_plugin_sdk::export_plugin!(Planted, ops: [fill, copy, cast, add, mul, matmul, softmax, exp, sqrt]);

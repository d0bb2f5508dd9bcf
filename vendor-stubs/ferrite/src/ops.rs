//! Operators and copies: argument checks against live device memory, then
//! dispatch to the `ferrite-kernels` crate, inline for the default stream or
//! as a job on a stream.
//!
//! Each [`TensorDesc`] becomes a kernel [`View`]. On the default stream the
//! views borrow the descriptors and the kernel runs on the calling thread,
//! with no allocation and no thread handoff. On a stream the descriptors are
//! only borrowed for the call, so the job owns a copy of each operand's
//! address, dtype, shape and strides (one small `Vec` per operand).
//!
//! Before anything runs, every operand's byte extent must lie inside one live
//! allocation of the call's device, and an output that is dense must not
//! partly overlap a dense input (being exactly the same view is allowed).
//! Views with gaps are not checked for overlap: that stays the host's side of
//! the contract.

use ferrite_kernels::{self as kernels, KernelError, View};
use polychip_plugin_sdk::{CopyKind, DType, Error, Queue, Result, TensorDesc};

use crate::memory::Memory;
use crate::stream::Stream;

/// The kernels' name for a dtype.
pub fn kernel_dtype(dtype: DType) -> kernels::DType {
    match dtype {
        DType::F32 => kernels::DType::F32,
        DType::F16 => kernels::DType::F16,
        DType::BF16 => kernels::DType::BF16,
        DType::F64 => kernels::DType::F64,
        DType::I32 => kernels::DType::I32,
        DType::I64 => kernels::DType::I64,
        DType::U8 => kernels::DType::U8,
        DType::Bool => kernels::DType::Bool,
    }
}

/// A kernel refusal as a plugin error, prefixed with the operator's name.
fn kernel_error(op: &str, error: KernelError) -> Error {
    let message = error.0;
    if message.starts_with(op) && message[op.len()..].starts_with(':') {
        Error::invalid(message)
    } else {
        Error::invalid(format!("{op}: {message}"))
    }
}

/// An operand a job owns: address, dtype, and `shape ++ strides`.
struct Owned {
    ptr: usize,
    dtype: kernels::DType,
    dims: Vec<i64>,
}

impl Owned {
    fn new(view: &View<'_>) -> Owned {
        let mut dims = Vec::with_capacity(2 * view.shape.len());
        dims.extend_from_slice(view.shape);
        dims.extend_from_slice(view.strides);
        Owned {
            ptr: view.ptr as usize,
            dtype: view.dtype,
            dims,
        }
    }

    fn view(&self) -> View<'_> {
        let (shape, strides) = self.dims.split_at(self.dims.len() / 2);
        View {
            ptr: self.ptr as *mut u8,
            dtype: self.dtype,
            shape,
            strides,
        }
    }
}

/// The absolute byte range `[start, end)` a view's elements occupy; `(0, 0)`
/// when it is empty; `None` when it falls outside the address space.
fn byte_range(view: &View<'_>) -> Option<(usize, usize)> {
    let (mut lo, mut hi) = (0i128, 0i128);
    for (&extent, &stride) in view.shape.iter().zip(view.strides) {
        if extent == 0 {
            return Some((0, 0));
        }
        let reach = i128::from(extent - 1) * i128::from(stride);
        if reach < 0 {
            lo = lo.checked_add(reach)?;
        } else {
            hi = hi.checked_add(reach)?;
        }
    }
    let size = view.dtype.size() as i128;
    let base = view.ptr as usize as i128;
    let start = usize::try_from(base.checked_add(lo.checked_mul(size)?)?).ok()?;
    let end = usize::try_from(base.checked_add(hi.checked_add(1)?.checked_mul(size)?)?).ok()?;
    Some((start, end))
}

/// Whether two views are the same view of the same memory.
fn same_view(a: &View<'_>, b: &View<'_>) -> bool {
    a.ptr == b.ptr && a.dtype == b.dtype && a.shape == b.shape && a.strides == b.strides
}

/// Checks that every operand lies in live memory of `device` and that the
/// output (the last operand) does not partly overlap a dense input.
fn check<const N: usize>(
    memory: &Memory,
    device: u32,
    op: &str,
    names: &[&str; N],
    views: &[View<'_>; N],
) -> Result<()> {
    let mut ranges = [(0usize, 0usize); N];
    for i in 0..N {
        ranges[i] = byte_range(&views[i]).ok_or_else(|| {
            Error::invalid(format!(
                "{op}: {} at {:p} with shape {:?} and strides {:?} reaches outside the address \
                 space",
                names[i], views[i].ptr, views[i].shape, views[i].strides
            ))
        })?;
    }
    if let Err(bad) = memory.check(device, &ranges) {
        let (start, end) = ranges[bad];
        return Err(Error::invalid(format!(
            "{op}: {} (bytes {start:#x}..{end:#x}, shape {:?}, strides {:?}) does not lie inside \
             one live allocation of Ferrite device {device}",
            names[bad], views[bad].shape, views[bad].strides
        )));
    }
    let (out, out_range) = (&views[N - 1], ranges[N - 1]);
    for i in 0..N - 1 {
        let intersect = ranges[i].0 < out_range.1 && out_range.0 < ranges[i].1;
        if intersect
            && !same_view(&views[i], out)
            && out.is_contiguous()
            && views[i].is_contiguous()
        {
            return Err(Error::invalid(format!(
                "{op}: {} partly overlaps {}; an output may only be exactly the same view as an \
                 input",
                names[N - 1],
                names[i]
            )));
        }
    }
    Ok(())
}

/// Checks the operands, then runs `kernel` on their views: inline for the
/// default stream, as a job for a stream. The last `outputs` operands are
/// the operator's outputs; the kernel is skipped only when every output is
/// empty (an operator with an empty input may still have to write zeros
/// elsewhere, e.g. a weight gradient over zero rows).
///
/// # Safety
/// The host's side of the ABI contract: each operand's memory stays valid
/// until the work has run, and outputs overlap inputs only as the operator
/// allows.
pub unsafe fn launch_outputs<const N: usize, K>(
    memory: &Memory,
    queue: Queue<'_, Stream>,
    op: &'static str,
    args: [(&'static str, &TensorDesc<'_>); N],
    outputs: usize,
    kernel: K,
) -> Result<()>
where
    K: FnOnce(&[View<'_>; N]) -> Result<(), KernelError> + Send + 'static,
{
    let strides = args.each_ref().map(|(_, desc)| desc.strides());
    let views: [View<'_>; N] = std::array::from_fn(|i| View {
        ptr: args[i].1.data,
        dtype: kernel_dtype(args[i].1.dtype),
        shape: args[i].1.shape,
        strides: &strides[i],
    });
    check(
        memory,
        queue.device,
        op,
        &args.map(|(name, _)| name),
        &views,
    )?;
    if views[N - outputs.min(N)..]
        .iter()
        .all(|v| v.shape.contains(&0))
    {
        // An empty output: nothing to compute (and an empty operand may
        // carry any pointer, even NULL, which the kernels need not expect).
        return Ok(());
    }
    match queue.stream {
        None => kernel(&views).map_err(|e| kernel_error(op, e)),
        Some(stream) => {
            let owned = views.each_ref().map(Owned::new);
            stream.enqueue(Box::new(move || {
                let views = owned.each_ref().map(Owned::view);
                kernel(&views).map_err(|e| kernel_error(op, e))
            }));
            Ok(())
        }
    }
}

/// A memcpy between host and device memory (which is host memory too).
///
/// # Safety
/// `src` and `dst` address `bytes` bytes of the kinds `kind` names, which
/// stay valid until the queue reaches the copy.
pub unsafe fn memcpy(
    memory: &Memory,
    queue: Queue<'_, Stream>,
    kind: CopyKind,
    dst: *mut u8,
    src: *const u8,
    bytes: usize,
) -> Result<()> {
    let op = match kind {
        CopyKind::HostToDevice => "memcpy_h2d",
        CopyKind::DeviceToHost => "memcpy_d2h",
        CopyKind::DeviceToDevice => "memcpy_d2d",
    };
    let device = queue.device;
    let (dst, src) = (dst as usize, src as usize);
    let end = |start: usize, name: &str| {
        start.checked_add(bytes).ok_or_else(|| {
            Error::invalid(format!(
                "{op}: {name} {start:#x} + {bytes} bytes overflows the address space"
            ))
        })
    };
    let dst_range = (dst, end(dst, "dst")?);
    let src_range = (src, end(src, "src")?);
    let on_device: &[(&str, (usize, usize))] = match kind {
        CopyKind::HostToDevice => &[("dst", dst_range)],
        CopyKind::DeviceToHost => &[("src", src_range)],
        CopyKind::DeviceToDevice => &[("dst", dst_range), ("src", src_range)],
    };
    let ranges = [on_device[0].1, on_device.get(1).map_or((0, 0), |r| r.1)];
    if let Err(bad) = memory.check(device, &ranges) {
        let (name, (start, _)) = on_device[bad];
        return Err(Error::invalid(format!(
            "{op}: {name} {start:#x}..+{bytes} bytes does not lie inside one live allocation of \
             Ferrite device {device}"
        )));
    }
    if dst_range.0 < src_range.1 && src_range.0 < dst_range.1 {
        return Err(Error::invalid(format!(
            "{op}: the source {src:#x} and destination {dst:#x} of {bytes} bytes overlap"
        )));
    }
    let copy = move || {
        // SAFETY: the caller guarantees both ranges are valid until the copy
        // runs; the device-side ones were checked to be live, and they do not
        // overlap (checked above).
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes) };
        Ok(())
    };
    match queue.stream {
        None => copy(),
        Some(stream) => {
            stream.enqueue(Box::new(copy));
            Ok(())
        }
    }
}

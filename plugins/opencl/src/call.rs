//! One operator call: its device, queue and operands.
//!
//! A [`Ctx`] resolves each tensor descriptor to its buffer and element
//! offset ([`Operand`]), and gives a kernel what it wants:
//! - strided kernels (the elementwise ones, copies) take any view, with a
//!   [`Layout`] from [`joint_layouts`] that merges the dimensions all
//!   operands keep contiguous;
//! - the other kernels take compact row-major tensors at an offset.
//!   [`Ctx::input`] packs a strided input into scratch memory first (one
//!   strided copy on the same queue), [`Ctx::output`] lets the kernel
//!   write compact scratch that [`Ctx::finish`] copies into the strided
//!   view, and [`Ctx::inout`] does both.
//!
//! An output that is exactly one of its inputs (in place) works either way:
//! the kernels read each element before writing it, and scratch is copied
//! back only after the kernel. Scratch buffers are released as soon as the
//! last command using them is queued; OpenCL frees them when that command
//! is done. On the default stream the call waits for its work before it
//! returns, also when it fails half-way (so no queued command outlives the
//! call's borrowed host memory).

use std::sync::Arc;

use cl3::types::cl_mem;
use opencl3::command_queue::CommandQueue;
use polychip_plugin_sdk::{DType, Error, Queue, Result, TensorDesc};

use crate::OpenCl;
use crate::driver::{ClResult, Device};
use crate::memory::Buffer;
use crate::program::{Args, Flavor, Layout, MAX_RANK, Programs};
use crate::stream::Stream;

/// A tensor on the device: its buffer, the element offset of element
/// (0, ..., 0), and its extents and strides in elements.
#[derive(Debug, Clone)]
pub struct Operand {
    /// The allocation (or scratch) holding it.
    pub buffer: Arc<Buffer>,
    /// Element type.
    pub dtype: DType,
    /// Elements from the buffer's start to element (0, ..., 0).
    pub offset: i64,
    /// Extents.
    pub shape: Vec<i64>,
    /// Strides in elements.
    pub strides: Vec<i64>,
}

impl Operand {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().map(|&d| d as usize).product()
    }

    /// The driver's buffer.
    pub fn mem(&self) -> cl_mem {
        self.buffer.mem
    }

    /// Whether the elements are compact and row-major.
    pub fn is_compact(&self) -> bool {
        let mut expected = 1i64;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected = expected.saturating_mul(d);
        }
        true
    }

    /// Its own layout, dimensions merged where possible.
    pub fn layout(&self) -> Result<Layout> {
        Ok(joint_layouts(&self.shape, &[(self.offset, &self.strides)])?[0])
    }

    /// Strides that broadcast it to `shape` (NumPy rules: dimensions
    /// aligned at the end; a missing or extent-1 dimension gets stride 0).
    pub fn broadcast_strides(&self, shape: &[i64]) -> Vec<i64> {
        let lead = shape.len() - self.shape.len();
        (0..shape.len())
            .map(|d| {
                if d < lead || self.shape[d - lead] == 1 {
                    0
                } else {
                    self.strides[d - lead]
                }
            })
            .collect()
    }
}

/// Layouts of operands that share one iteration `shape`, each given as its
/// element offset and strides over `shape`: extent-1 dimensions dropped,
/// neighbours merged where every operand's strides allow it. More than
/// [`MAX_RANK`] dimensions left is refused.
pub fn joint_layouts(shape: &[i64], parts: &[(i64, &[i64])]) -> Result<Vec<Layout>> {
    // Dimensions kept: (extent, stride of each part).
    let mut dims: Vec<(i64, Vec<i64>)> = Vec::new();
    for (d, &extent) in shape.iter().enumerate() {
        if extent == 1 {
            continue;
        }
        let strides: Vec<i64> = parts.iter().map(|(_, s)| s[d]).collect();
        if let Some((prev, prev_strides)) = dims.last_mut()
            && prev_strides
                .iter()
                .zip(&strides)
                .all(|(&p, &s)| p == s.saturating_mul(extent))
        {
            *prev *= extent;
            *prev_strides = strides;
            continue;
        }
        dims.push((extent, strides));
    }
    if dims.len() > MAX_RANK {
        return Err(Error::invalid(format!(
            "opencl: a view of shape {shape:?} keeps {} dimensions after merging; the kernels \
             take at most {MAX_RANK}",
            dims.len()
        )));
    }
    Ok(parts
        .iter()
        .enumerate()
        .map(|(p, &(offset, _))| {
            let mut layout = Layout {
                offset,
                ndim: dims.len() as i32,
                ..Layout::default()
            };
            for (d, (extent, strides)) in dims.iter().enumerate() {
                layout.shape[d] = *extent;
                layout.stride[d] = strides[p];
            }
            layout
        })
        .collect())
}

/// Compact row-major strides of `shape`.
pub fn compact_strides(shape: &[i64]) -> Vec<i64> {
    polychip_plugin_sdk::contiguous_strides(shape)
}

/// A call in progress: see the module docs.
#[derive(Debug)]
pub struct Ctx<'a> {
    /// The plugin device index.
    pub index: u32,
    /// The device.
    pub device: &'a Device,
    /// Its programs.
    pub programs: &'a Programs,
    /// The queue the call's work goes to.
    pub queue: &'a CommandQueue,
    /// The operator, for messages.
    pub op: &'static str,
    plugin: &'a OpenCl,
    default: bool,
    /// Scratch outputs to copy into their views at the end: (scratch, view).
    unpack: Vec<(Operand, Operand)>,
    finished: bool,
}

impl<'a> Ctx<'a> {
    /// A call of `op` on `queue`.
    pub fn new(plugin: &'a OpenCl, queue: Queue<'a, Stream>, op: &'static str) -> Ctx<'a> {
        let index = queue.device;
        let device = &plugin.devices[index as usize];
        Ctx {
            index,
            device,
            programs: &plugin.programs[index as usize],
            queue: queue.stream.map_or(&device.queue, |s| &s.queue),
            op,
            plugin,
            default: queue.stream.is_none(),
            unpack: Vec::new(),
            finished: false,
        }
    }

    /// The operand a descriptor names, as it is (any strides).
    pub fn view(&self, name: &str, desc: &TensorDesc<'_>) -> Result<Operand> {
        let strides = desc.strides().to_vec();
        let size = desc.dtype.size() as i64;
        let Some((lo, hi)) = desc.byte_span() else {
            return Ok(Operand {
                buffer: Arc::clone(&self.plugin.empty[self.index as usize]),
                dtype: desc.dtype,
                offset: 0,
                shape: desc.shape.to_vec(),
                strides,
            });
        };
        let addr = desc.data as u64;
        let first = addr.wrapping_add_signed(lo);
        let place = self.plugin.memory.resolve(
            self.index,
            first,
            (hi - lo) as u64,
            &format!("{}: {name}", self.op),
        )?;
        let start = place.offset as i64 - lo;
        if start % size != 0 {
            return Err(Error::invalid(format!(
                "opencl: {}: {name} starts {start} bytes into its allocation, which is not a \
                 multiple of its {} element size",
                self.op, desc.dtype
            )));
        }
        Ok(Operand {
            buffer: place.buffer,
            dtype: desc.dtype,
            offset: start / size,
            shape: desc.shape.to_vec(),
            strides,
        })
    }

    /// New compact scratch of `dtype` and `shape` (uninitialised).
    pub fn scratch(&self, dtype: DType, shape: &[i64]) -> Result<Operand> {
        let numel: usize = shape.iter().map(|&d| d.max(0) as usize).product();
        let buffer = if numel == 0 {
            Arc::clone(&self.plugin.empty[self.index as usize])
        } else {
            Arc::new(Buffer::new(self.device, (numel * dtype.size()) as u64)?)
        };
        Ok(Operand {
            buffer,
            dtype,
            offset: 0,
            shape: shape.to_vec(),
            strides: compact_strides(shape),
        })
    }

    /// A compact copy of `src` (itself when it is compact already).
    pub fn compact(&self, src: Operand) -> Result<Operand> {
        if src.is_compact() {
            return Ok(src);
        }
        let dst = self.scratch(src.dtype, &src.shape)?;
        self.copy(&src, &dst)?;
        Ok(dst)
    }

    /// An input as a compact tensor (packed into scratch when strided).
    pub fn input(&self, name: &str, desc: &TensorDesc<'_>) -> Result<Operand> {
        let view = self.view(name, desc)?;
        self.compact(view)
    }

    /// An output as a compact tensor: the view itself when it is compact,
    /// else scratch copied into the view by [`Ctx::finish`].
    pub fn output(&mut self, name: &str, desc: &TensorDesc<'_>) -> Result<Operand> {
        let view = self.view(name, desc)?;
        if view.is_compact() {
            return Ok(view);
        }
        let scratch = self.scratch(view.dtype, &view.shape)?;
        self.unpack.push((scratch.clone(), view));
        Ok(scratch)
    }

    /// A tensor read and written, as a compact tensor (packed, and copied
    /// back by [`Ctx::finish`], when strided).
    pub fn inout(&mut self, name: &str, desc: &TensorDesc<'_>) -> Result<Operand> {
        let view = self.view(name, desc)?;
        if view.is_compact() {
            return Ok(view);
        }
        let scratch = self.compact(view.clone())?;
        self.unpack.push((scratch.clone(), view));
        Ok(scratch)
    }

    /// Enqueues kernel `name` of `flavor` with the arguments `set` gives.
    pub fn launch(
        &self,
        flavor: Flavor,
        name: &str,
        global: &[usize],
        local: Option<&[usize]>,
        set: impl FnOnce(&mut Args<'_>) -> Result<()>,
    ) -> Result<()> {
        if global.contains(&0) {
            return Ok(());
        }
        let built = self.programs.get(self.device, flavor)?;
        let (kernel, most) = built.kernel(name, self.device)?;
        if let Some(group) = local.map(|l| l.iter().product::<usize>())
            && group > most
        {
            return Err(Error::unimplemented(format!(
                "opencl: {}: the kernel {name} runs at most {most} work-items in a group on {}, \
                 fewer than the {group} it is launched with; set {}={} (a power of two no \
                 larger) to build the row kernels for smaller groups",
                self.op,
                self.device.info.name,
                crate::program::WORK_GROUP_VAR,
                1usize << most.max(1).ilog2()
            )));
        }
        let mut args = Args::new(&kernel, name);
        set(&mut args)?;
        args.run(self.queue, global, local)
    }

    /// The program of the floating dtype `dtype`.
    pub fn float(&self, dtype: DType) -> Result<Flavor> {
        Flavor::float(dtype).ok_or_else(|| {
            Error::invalid(format!(
                "opencl: {}: {dtype} is not a floating dtype",
                self.op
            ))
        })
    }

    /// Copies `src` into `dst` element by element (same dtype and shape,
    /// any strides).
    pub fn copy(&self, src: &Operand, dst: &Operand) -> Result<()> {
        let n = src.numel();
        if n == 0 {
            return Ok(());
        }
        let layouts = joint_layouts(
            &src.shape,
            &[(src.offset, &src.strides), (dst.offset, &dst.strides)],
        )?;
        self.launch(Flavor::bits(src.dtype), "pc_copy", &[n], None, |a| {
            a.mem(src.mem())?
                .value(layouts[0])?
                .mem(dst.mem())?
                .value(layouts[1])?
                .value(n as i64)?;
            Ok(())
        })
    }

    /// Copies scratch outputs into their views and, on the default stream,
    /// waits for the call's work.
    pub fn finish(mut self) -> Result<()> {
        for (scratch, view) in std::mem::take(&mut self.unpack) {
            self.copy(&scratch, &view)?;
        }
        self.finished = true;
        if self.default {
            self.queue
                .finish()
                .cl(&format!("clFinish after {}", self.op))?;
        }
        Ok(())
    }
}

impl Drop for Ctx<'_> {
    fn drop(&mut self) {
        if self.default && !self.finished {
            let _ = self.queue.finish();
        }
    }
}

impl Args<'_> {
    /// A compact tensor argument: its buffer, then its element offset
    /// (`__global S *p, long off` in the kernels).
    pub fn tensor(&mut self, o: &Operand) -> Result<&mut Self> {
        self.mem(o.mem())?.value(o.offset)
    }
}

//! The OpenCL C programs: their sources, built once per device and flavour
//! (on first use, then cached for the life of the plugin), their kernel
//! objects, and setting a kernel's arguments and launching it.
//!
//! A flavour is one storage type: the floating dtypes each get a program of
//! every operator kernel (`-DPC_F32`, ...), the four element widths a
//! program of copies and fills and the operators that move bits or do
//! integer arithmetic (`-DPC_BITS=uint`, ...: gather, integer
//! scatter_add, ...), and the casts one program of their own. A build that fails is remembered with its build
//! log, and every call that needs the program reports it.
//!
//! Kernel objects are not thread-safe while their arguments are set, so
//! each one sits behind a mutex held from the first `clSetKernelArg` to the
//! `clEnqueueNDRangeKernel` (which captures the arguments).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use cl3::command_queue::enqueue_nd_range_kernel;
use cl3::kernel::set_kernel_arg;
use cl3::types::{cl_kernel, cl_mem};
use opencl3::command_queue::CommandQueue;
use opencl3::event::Event as ClEvent;
use opencl3::kernel::Kernel;
use opencl3::program::Program;
use polychip_plugin_sdk::{DType, Error, Result};

use crate::driver::{ClResult, Device, cl_error};

/// The sources, in the order they are concatenated. `common.cl` first.
const COMMON: &str = include_str!("../kernels/common.cl");
const DATA: &str = include_str!("../kernels/data.cl");
const CAST: &str = include_str!("../kernels/cast.cl");
/// The index check, gather and scatter_add: in the floating programs and
/// in those by element width.
const INDEXING: &str = include_str!("../kernels/indexing.cl");
/// The operator kernels of the floating programs.
const OPERATORS: &[&str] = &[
    include_str!("../kernels/elementwise.cl"),
    include_str!("../kernels/reduce.cl"),
    include_str!("../kernels/matmul.cl"),
    include_str!("../kernels/softmax.cl"),
    include_str!("../kernels/norm.cl"),
    include_str!("../kernels/attention.cl"),
    include_str!("../kernels/embedding.cl"),
    include_str!("../kernels/optim.cl"),
    INDEXING,
];

/// One program's storage type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// Every operator kernel, in f32.
    F32,
    /// In f16 (stored as half, computed in f32).
    F16,
    /// In bf16 (stored as 16-bit words, computed in f32).
    BF16,
    /// In f64 (needs cl_khr_fp64).
    F64,
    /// Copies and fills of 1-byte elements.
    Bits8,
    /// Of 2-byte elements.
    Bits16,
    /// Of 4-byte elements.
    Bits32,
    /// Of 8-byte elements.
    Bits64,
    /// The conversions between floating dtypes.
    Cast,
}

const FLAVORS: usize = 9;

impl Flavor {
    /// The operator program of a floating dtype; `None` for the others.
    pub fn float(dtype: DType) -> Option<Flavor> {
        match dtype {
            DType::F32 => Some(Flavor::F32),
            DType::F16 => Some(Flavor::F16),
            DType::BF16 => Some(Flavor::BF16),
            DType::F64 => Some(Flavor::F64),
            _ => None,
        }
    }

    /// The copy-and-fill program for elements of `dtype`'s width.
    pub fn bits(dtype: DType) -> Flavor {
        match dtype.size() {
            1 => Flavor::Bits8,
            2 => Flavor::Bits16,
            4 => Flavor::Bits32,
            _ => Flavor::Bits64,
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    fn define(self) -> &'static str {
        match self {
            Flavor::F32 => "-DPC_F32",
            Flavor::F16 => "-DPC_F16",
            Flavor::BF16 => "-DPC_BF16",
            Flavor::F64 => "-DPC_F64",
            Flavor::Bits8 => "-DPC_BITS=uchar",
            Flavor::Bits16 => "-DPC_BITS=ushort",
            Flavor::Bits32 => "-DPC_BITS=uint",
            Flavor::Bits64 => "-DPC_BITS=ulong",
            Flavor::Cast => "-DPC_BITS=uchar",
        }
    }

    fn sources(self) -> Vec<&'static str> {
        let mut sources = vec![COMMON];
        match self {
            Flavor::F32 | Flavor::F16 | Flavor::BF16 | Flavor::F64 => {
                sources.extend_from_slice(OPERATORS)
            }
            Flavor::Cast => sources.push(CAST),
            _ => sources.extend_from_slice(&[DATA, INDEXING]),
        }
        sources
    }
}

/// The variable that sets the work-group size of the row kernels.
pub const WORK_GROUP_VAR: &str = "POLYCHIP_OPENCL_WORK_GROUP";

/// The row kernels' work-group size on a device of `limit` work-items a
/// group: 256 or the largest power of two under `limit`, or `var` (the
/// value of [`WORK_GROUP_VAR`]) when it is a power of two from 16 to
/// `limit` (anything else is ignored with a warning naming `device`).
fn work_group(limit: usize, var: Option<&str>, device: &str) -> usize {
    let limit = limit.max(1);
    let mut wg = 256usize.min(limit);
    if let Some(text) = var {
        match text.trim().parse::<usize>() {
            Ok(n) if n.is_power_of_two() && (16..=limit).contains(&n) => wg = n,
            _ => log::warn!(
                "opencl: {WORK_GROUP_VAR}={text:?} is not a power of two from 16 to {device}'s \
                 limit of {limit}; ignored"
            ),
        }
    }
    1 << wg.ilog2()
}

/// A built program and the kernels taken from it so far.
#[derive(Debug)]
pub struct Built {
    program: Program,
    /// Each kernel taken so far, and the most work-items a group of it may
    /// have on the device (`CL_KERNEL_WORK_GROUP_SIZE`, which a kernel that
    /// needs many registers has below the device's own limit).
    kernels: Mutex<HashMap<String, (SharedKernel, usize)>>,
}

/// A kernel object, shared by the calls that launch it (one at a time).
type SharedKernel = Arc<Mutex<Kernel>>;

// SAFETY: program objects are thread-safe; the kernels are behind mutexes.
unsafe impl Send for Built {}
// SAFETY: as above.
unsafe impl Sync for Built {}

/// The programs of one device.
#[derive(Debug)]
pub struct Programs {
    slots: [OnceLock<std::result::Result<Built, String>>; FLAVORS],
    building: Mutex<()>,
    /// The work-group size row kernels are built for.
    pub wg: usize,
}

impl Programs {
    /// No program built yet; `wg` from the device's limit, or from
    /// `POLYCHIP_OPENCL_WORK_GROUP` (a power of two from 16 to the device's
    /// limit; anything else is ignored with a warning) where a kernel allows
    /// fewer work-items than the device.
    pub fn new(device: &Device) -> Programs {
        let wg = work_group(
            device.info.max_work_group,
            std::env::var(WORK_GROUP_VAR).ok().as_deref(),
            &device.info.name,
        );
        Programs {
            slots: Default::default(),
            building: Mutex::new(()),
            wg,
        }
    }

    fn options(&self, device: &Device, flavor: Flavor) -> String {
        let mut options = format!("-cl-std=CL1.2 {} -DPC_WG={}", flavor.define(), self.wg);
        if device.info.correct_div_sqrt {
            options.push_str(" -cl-fp32-correctly-rounded-divide-sqrt");
        }
        if device.info.fp64 {
            options.push_str(" -DPC_HAS_FP64");
        }
        options
    }

    /// The program of `flavor`, built on first use.
    pub fn get(&self, device: &Device, flavor: Flavor) -> Result<&Built> {
        if flavor == Flavor::F64 && !device.info.fp64 {
            return Err(Error::unimplemented(format!(
                "opencl: {} has no double precision (cl_khr_fp64), so f64 is not implemented on it",
                device.info.name
            )));
        }
        let slot = &self.slots[flavor.index()];
        if slot.get().is_none() {
            let _one = self.building.lock().unwrap_or_else(PoisonError::into_inner);
            if slot.get().is_none() {
                let built = self.build(device, flavor);
                let _ = slot.set(built);
            }
        }
        match slot.get() {
            Some(Ok(built)) => Ok(built),
            Some(Err(message)) => Err(Error::internal(message.clone())),
            None => Err(Error::internal("opencl: a program build was lost")),
        }
    }

    fn build(&self, device: &Device, flavor: Flavor) -> std::result::Result<Built, String> {
        let options = self.options(device, flavor);
        // One string: cl3 0.13's `create_program_with_source` passes an
        // array of `&str` (fat pointers) where OpenCL reads an array of
        // `char *`, which only works for a single source.
        let source = flavor.sources().concat();
        let mut program = Program::create_from_source(&device.context, &source)
            .map_err(|e| format!("opencl: clCreateProgramWithSource failed: {e} ({})", e.0))?;
        let started = std::time::Instant::now();
        if let Err(e) = program.build(&[device.id], &options) {
            let log = program.get_build_log(device.id).unwrap_or_default();
            return Err(format!(
                "opencl: building the {flavor:?} kernels for {} failed: {e} ({}); options `{options}`; build log:\n{}",
                device.info.name,
                e.0,
                log.trim()
            ));
        }
        log::debug!(
            "opencl: built the {flavor:?} kernels for {} in {:.2} s",
            device.info.name,
            started.elapsed().as_secs_f64()
        );
        Ok(Built {
            program,
            kernels: Mutex::new(HashMap::new()),
        })
    }
}

impl Built {
    /// The kernel named `name`, created on first use, and the most
    /// work-items a group of it may have on `device`.
    pub fn kernel(&self, name: &str, device: &Device) -> Result<(SharedKernel, usize)> {
        let mut kernels = self.kernels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((k, most)) = kernels.get(name) {
            return Ok((Arc::clone(k), *most));
        }
        let kernel = Kernel::create(&self.program, name)
            .map_err(|e| cl_error(&format!("clCreateKernel({name})"), e.0))?;
        let most = kernel
            .get_work_group_size(device.id)
            .map_err(|e| cl_error(&format!("clGetKernelWorkGroupInfo({name})"), e.0))?;
        let kernel = Arc::new(Mutex::new(kernel));
        kernels.insert(name.to_owned(), (Arc::clone(&kernel), most));
        Ok((kernel, most))
    }
}

/// A view for a kernel: `pc_layout` in `common.cl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Layout {
    /// Element offset of element (0, ..., 0) in the buffer.
    pub offset: i64,
    /// Extents, outer first.
    pub shape: [i64; 8],
    /// Strides in elements.
    pub stride: [i64; 8],
    /// Number of dimensions used.
    pub ndim: i32,
    /// Padding (zero).
    pub pad: i32,
}

/// The largest rank a kernel's layout takes.
pub const MAX_RANK: usize = 8;

/// A kernel whose arguments are being set; launched by [`Args::run`].
pub struct Args<'k> {
    kernel: MutexGuard<'k, Kernel>,
    name: &'k str,
    next: u32,
}

impl std::fmt::Debug for Args<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Args({}, {})", self.name, self.next)
    }
}

impl<'k> Args<'k> {
    /// Starts setting `kernel`'s arguments (locks it).
    pub fn new(kernel: &'k Mutex<Kernel>, name: &'k str) -> Args<'k> {
        Args {
            kernel: kernel.lock().unwrap_or_else(PoisonError::into_inner),
            name,
            next: 0,
        }
    }

    fn raw(&self) -> cl_kernel {
        self.kernel.get()
    }

    fn set(&mut self, size: usize, value: *const c_void) -> Result<&mut Self> {
        // SAFETY: `value` points to `size` readable bytes, the argument's
        // size in the kernel's signature (a mismatch is an error, not UB).
        unsafe { set_kernel_arg(self.raw(), self.next, size, value) }.map_err(|e| {
            cl_error(
                &format!("clSetKernelArg({}, argument {})", self.name, self.next),
                e,
            )
        })?;
        self.next += 1;
        Ok(self)
    }

    /// A plain value argument (`long`, `int`, `float`, `double`, a struct).
    pub fn value<T: Copy>(&mut self, v: T) -> Result<&mut Self> {
        self.set(std::mem::size_of::<T>(), (&raw const v).cast())
    }

    /// A buffer argument.
    pub fn mem(&mut self, mem: cl_mem) -> Result<&mut Self> {
        self.set(std::mem::size_of::<cl_mem>(), (&raw const mem).cast())
    }

    /// A `__local` array of `bytes` bytes.
    pub fn local(&mut self, bytes: usize) -> Result<&mut Self> {
        self.set(bytes, std::ptr::null())
    }

    /// Enqueues the kernel over `global` work-items in groups of `local`
    /// (`None`: the driver's choice). Nothing is enqueued when any global
    /// extent is 0.
    pub fn run(
        &mut self,
        queue: &CommandQueue,
        global: &[usize],
        local: Option<&[usize]>,
    ) -> Result<()> {
        if global.contains(&0) {
            return Ok(());
        }
        let local_ptr = local.map_or(std::ptr::null(), <[usize]>::as_ptr);
        // SAFETY: the kernel's arguments are all set (a missing one is a
        // CL_INVALID_KERNEL_ARGS error), and the sizes are valid arrays of
        // the given dimension count.
        let event = unsafe {
            enqueue_nd_range_kernel(
                queue.get(),
                self.raw(),
                global.len() as u32,
                std::ptr::null(),
                global.as_ptr(),
                local_ptr,
                0,
                std::ptr::null(),
            )
        }
        .cl(&format!("clEnqueueNDRangeKernel({})", self.name))?;
        drop(ClEvent::new(event));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::work_group;

    #[test]
    fn the_work_group_is_the_variables_when_the_device_allows_it() {
        assert_eq!(work_group(1024, None, "d"), 256);
        assert_eq!(work_group(200, None, "d"), 128);
        assert_eq!(work_group(1024, Some("32"), "d"), 32);
        assert_eq!(work_group(1024, Some(" 512 "), "d"), 512);
        // Not a power of two, below 16, past the device's limit, not a
        // number: the default.
        for bad in ["48", "8", "2048", "x", ""] {
            assert_eq!(work_group(1024, Some(bad), "d"), 256, "{bad}");
        }
        assert_eq!(work_group(64, Some("128"), "d"), 64);
    }
}

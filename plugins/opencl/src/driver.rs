//! The OpenCL driver as the plugin sees it: discovery of platforms and
//! devices, what each device reports, and OpenCL error codes as polychip
//! errors.
//!
//! The OpenCL library is loaded at run time (the `opencl3` crate's
//! `dynamic` feature, through the ICD loader `libOpenCL.so.1`), so a machine
//! without it gives zero devices and a reason, never a load failure.
//! Devices are ordered GPUs first, then accelerators, then CPUs (so a
//! machine's real accelerators get the low indices), and within a kind by
//! platform and driver order. The devices of one platform share one
//! context, so events of one device can be waited on by the queues of
//! another.

use std::sync::Arc;

use cl3::error_codes::error_text;
use cl3::types::{cl_device_id, cl_int};
use opencl3::command_queue::CommandQueue;
use opencl3::context::Context;
use opencl3::device::{
    CL_DEVICE_TYPE_ACCELERATOR, CL_DEVICE_TYPE_CPU, CL_DEVICE_TYPE_GPU, Device as ClDevice,
};
use opencl3::platform::get_platforms;
use polychip_plugin_sdk::{DeviceProps, Error, ErrorCode};

/// An OpenCL error code as a polychip error: `what` failed with the code's
/// name. Allocation failures are `OUT_OF_MEMORY`; a lost device or context
/// is `DEVICE_LOST`; a malformed call the plugin made is `INTERNAL`.
pub fn cl_error(what: &str, code: cl_int) -> Error {
    let kind = match code {
        cl3::error_codes::CL_MEM_OBJECT_ALLOCATION_FAILURE
        | cl3::error_codes::CL_OUT_OF_HOST_MEMORY
        | cl3::error_codes::CL_INVALID_BUFFER_SIZE => ErrorCode::OutOfMemory,
        cl3::error_codes::CL_DEVICE_NOT_AVAILABLE => ErrorCode::DeviceLost,
        _ => ErrorCode::Internal,
    };
    Error::new(
        kind,
        format!("opencl: {what} failed: {} ({code})", error_text(code)),
    )
}

/// `Result<T, ClError>` from opencl3 as a polychip result naming `what`.
pub trait ClResult<T> {
    /// Maps an OpenCL error with [`cl_error`].
    fn cl(self, what: &str) -> polychip_plugin_sdk::Result<T>;
}

impl<T> ClResult<T> for Result<T, cl3::error_codes::ClError> {
    fn cl(self, what: &str) -> polychip_plugin_sdk::Result<T> {
        self.map_err(|e| cl_error(what, e.0))
    }
}

impl<T> ClResult<T> for Result<T, cl_int> {
    fn cl(self, what: &str) -> polychip_plugin_sdk::Result<T> {
        self.map_err(|e| cl_error(what, e))
    }
}

/// What a device reported when it was opened.
#[derive(Debug, Clone)]
pub struct Info {
    /// "NVIDIA H200 (NVIDIA CUDA)": device name and platform.
    pub name: String,
    /// CL_DEVICE_TYPE_*.
    pub kind: u64,
    /// CL_DEVICE_GLOBAL_MEM_SIZE.
    pub memory_bytes: u64,
    /// CL_DEVICE_MAX_MEM_ALLOC_SIZE.
    pub max_alloc: u64,
    /// CL_DEVICE_MAX_COMPUTE_UNITS.
    pub compute_units: u32,
    /// CL_DEVICE_MAX_CLOCK_FREQUENCY, MHz.
    pub clock_mhz: u32,
    /// CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT.
    pub float_lanes: u32,
    /// CL_DEVICE_MAX_WORK_GROUP_SIZE.
    pub max_work_group: usize,
    /// CL_DEVICE_LOCAL_MEM_SIZE.
    pub local_mem: u64,
    /// The device computes in double precision (cl_khr_fp64).
    pub fp64: bool,
    /// CL_DEVICE_HOST_UNIFIED_MEMORY.
    pub unified: bool,
    /// f32 division and square root can be correctly rounded
    /// (CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT).
    pub correct_div_sqrt: bool,
    /// CL_DEVICE_VERSION and CL_DRIVER_VERSION, for messages.
    pub version: String,
}

impl Info {
    fn read(device: &ClDevice, platform: &str) -> Result<Info, cl3::error_codes::ClError> {
        let extensions = device.extensions()?;
        Ok(Info {
            name: format!("{} ({platform})", device.name()?.trim()),
            kind: device.dev_type()?,
            memory_bytes: device.global_mem_size()?,
            max_alloc: device.max_mem_alloc_size()?,
            compute_units: device.max_compute_units()?,
            clock_mhz: device.max_clock_frequency()?,
            float_lanes: device.native_vector_width_float()?.max(1),
            max_work_group: device.max_work_group_size()?,
            local_mem: device.local_mem_size()?,
            fp64: extensions.split_whitespace().any(|e| e == "cl_khr_fp64"),
            unified: device.host_unified_memory().unwrap_or(false),
            correct_div_sqrt: device.single_fp_config().unwrap_or(0)
                & cl3::device::CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT
                != 0,
            version: format!(
                "{}, driver {}",
                device.version()?.trim(),
                device.driver_version()?.trim()
            ),
        })
    }

    /// The name the ABI carries (at most 63 bytes): "device (platform)", or
    /// the device's name alone when both do not fit, rather than a name cut
    /// in the middle.
    pub fn short_name(&self) -> &str {
        if self.name.len() <= 63 {
            &self.name
        } else {
            self.name[..self.name.rfind(" (").unwrap_or(self.name.len())].trim()
        }
    }

    /// Peak f32 FLOP/s as the driver's figures give it: compute units x
    /// clock x native float lanes x 2 (a fused multiply-add). For a CPU
    /// that is the SIMD peak; for a GPU, whose drivers report one lane per
    /// compute unit, it is far below the hardware's (see docs/opencl.md:
    /// `POLYCHIP_OPENCL_PEAK_GFLOPS` overrides it, and `--plan auto`
    /// measures instead).
    pub fn derived_peak(&self) -> f64 {
        f64::from(self.compute_units)
            * f64::from(self.clock_mhz)
            * 1e6
            * f64::from(self.float_lanes)
            * 2.0
    }

    /// The props the plugin reports. Memory is private: the host reaches it
    /// only through copies (OpenCL gives the host no coherent access to a
    /// buffer outside a map, whatever the memory's physical home).
    pub fn props(&self) -> DeviceProps {
        let raw = std::env::var_os(PEAK_VAR).map(|v| v.to_string_lossy().into_owned());
        let peak = match peak_override(raw.as_deref()) {
            Ok(Some(flops)) => flops,
            Ok(None) => self.derived_peak(),
            Err(problem) => {
                log::warn!("opencl: {problem}");
                self.derived_peak()
            }
        };
        DeviceProps {
            name: self.short_name().to_owned(),
            memory_bytes: self.memory_bytes,
            host_visible: false,
            rdma_exportable: false,
            compute_units: self.compute_units,
            peak_flops_f32: peak,
            // f16 and bf16 are stored in 16 bits and computed in f32.
            peak_flops_bf16: peak,
            peak_flops_f16: peak,
            memory_bandwidth: 0.0,
            link_bandwidth: 0.0,
        }
    }
}

/// One OpenCL device, opened: its context (shared with its platform's other
/// devices), its default queue and what it reported.
#[derive(Debug)]
pub struct Device {
    /// The driver's device.
    pub id: cl_device_id,
    /// The platform's context.
    pub context: Arc<Context>,
    /// The queue of the default stream (in order).
    pub queue: CommandQueue,
    /// Index of the platform (devices of one platform share `context`).
    pub platform: usize,
    /// What it reported.
    pub info: Info,
}

// SAFETY: OpenCL objects are thread-safe (OpenCL 1.2 appendix A.2), except
// kernel objects, which the plugin never shares unguarded.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

/// The outcome of discovery: the devices, and why there are none or fewer
/// than the driver has.
#[derive(Debug, Default)]
pub struct Discovery {
    /// The devices opened, GPUs first.
    pub devices: Vec<Device>,
    /// What went wrong on the way (no library, no platform, a device that
    /// would not open), for the log and `polychip devices`.
    pub problems: Vec<String>,
}

fn kind_rank(kind: u64) -> u32 {
    if kind & CL_DEVICE_TYPE_GPU != 0 {
        0
    } else if kind & CL_DEVICE_TYPE_ACCELERATOR != 0 {
        1
    } else if kind & CL_DEVICE_TYPE_CPU != 0 {
        2
    } else {
        3
    }
}

/// Opens every device of every platform. `POLYCHIP_OPENCL_DEVICES` limits
/// them to those whose name contains one of its comma-separated words (case
/// blind), e.g. `nvidia` or `pthread`.
pub fn discover() -> Discovery {
    let mut found = Discovery::default();
    let platforms = match get_platforms() {
        Ok(p) if !p.is_empty() => p,
        Ok(_) => {
            found.problems.push(
                "no OpenCL platform: the ICD loader found no driver (install one, e.g. \
                 Debian's pocl-opencl-icd, or a GPU vendor's OpenCL runtime)"
                    .into(),
            );
            return found;
        }
        Err(e) => {
            let why = if e.0 == cl3::error_codes::CL_PLATFORM_NOT_FOUND_KHR {
                "the ICD loader found no driver (CL_PLATFORM_NOT_FOUND_KHR); install one, e.g. \
                 Debian's pocl-opencl-icd, or a GPU vendor's OpenCL runtime"
                    .to_owned()
            } else if e.0 == cl3::error_codes::DLOPEN_RUNTIME_LOAD_FAILED {
                "the OpenCL library (libOpenCL.so.1) could not be loaded; install an ICD \
                 loader and a driver (Debian: ocl-icd-libopencl1 and pocl-opencl-icd)"
                    .to_owned()
            } else {
                format!("listing platforms failed: {} ({})", error_text(e.0), e.0)
            };
            found.problems.push(format!("no OpenCL platform: {why}"));
            return found;
        }
    };
    let filter: Vec<String> = std::env::var("POLYCHIP_OPENCL_DEVICES")
        .unwrap_or_default()
        .split(',')
        .map(|w| w.trim().to_lowercase())
        .filter(|w| !w.is_empty())
        .collect();
    let mut devices = Vec::new();
    for (p, platform) in platforms.iter().enumerate() {
        let pname = platform.name().unwrap_or_else(|_| format!("platform {p}"));
        let ids = match platform.get_devices(opencl3::device::CL_DEVICE_TYPE_ALL) {
            Ok(ids) => ids,
            Err(e) => {
                found.problems.push(format!(
                    "platform {pname}: listing devices failed: {} ({})",
                    error_text(e.0),
                    e.0
                ));
                continue;
            }
        };
        let mut infos = Vec::new();
        for id in ids {
            let dev = ClDevice::new(id);
            match Info::read(&dev, pname.trim()) {
                Ok(info) => {
                    let lower = info.name.to_lowercase();
                    if filter.is_empty() || filter.iter().any(|w| lower.contains(w)) {
                        infos.push((id, info));
                    }
                }
                Err(e) => found.problems.push(format!(
                    "platform {pname}: a device would not report its properties: {} ({})",
                    error_text(e.0),
                    e.0
                )),
            }
        }
        if infos.is_empty() {
            continue;
        }
        let ids: Vec<cl_device_id> = infos.iter().map(|(id, _)| *id).collect();
        let context = match Context::from_devices(&ids, &[], None, std::ptr::null_mut()) {
            Ok(c) => Arc::new(c),
            Err(e) => {
                found.problems.push(format!(
                    "platform {pname}: creating a context failed: {} ({})",
                    error_text(e.0),
                    e.0
                ));
                continue;
            }
        };
        for (id, info) in infos {
            // SAFETY: the context was made from these devices.
            match unsafe { new_queue(&context, id) } {
                Ok(queue) => devices.push(Device {
                    id,
                    context: Arc::clone(&context),
                    queue,
                    platform: p,
                    info,
                }),
                Err(e) => found.problems.push(format!("{}: {e}", info.name)),
            }
        }
    }
    devices.sort_by_key(|d| kind_rank(d.info.kind));
    if devices.is_empty() && found.problems.is_empty() {
        found.problems.push(
            "no OpenCL device: the platforms list none (or none matches POLYCHIP_OPENCL_DEVICES)"
                .into(),
        );
    }
    found.devices = devices;
    found
}

/// An in-order command queue on `device`.
///
/// # Safety
/// `device` is one of `context`'s devices.
pub unsafe fn new_queue(
    context: &Context,
    device: cl_device_id,
) -> polychip_plugin_sdk::Result<CommandQueue> {
    // SAFETY: the caller's contract; 0 asks for an in-order queue without
    // profiling.
    #[allow(deprecated)]
    unsafe { CommandQueue::create(context, device, 0) }.cl("clCreateCommandQueue")
}

/// The variable that overrides the peak the driver's figures give.
pub const PEAK_VAR: &str = "POLYCHIP_OPENCL_PEAK_GFLOPS";

/// [`PEAK_VAR`]'s value as FLOP/s: `None` when unset or empty, an error
/// naming the variable and its range when it is not a number of GFLOP/s
/// the planner takes (1e-3 to 1e11: 1e6 to 1e20 FLOP/s). A bad value was
/// ignored without a word, and 1e300 reported as infinite FLOP/s, until
/// 2026-12-06.
pub fn peak_override(raw: Option<&str>) -> Result<Option<f64>, String> {
    let Some(text) = raw.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    match text.parse::<f64>() {
        Ok(g) if (1e-3..=1e11).contains(&g) => Ok(Some(g * 1e9)),
        _ => Err(format!(
            "ignoring {PEAK_VAR}={:?}: expected a number of GFLOP/s from 0.001 to 1e11; using the \
             peak the driver's figures give",
            text.chars().take(64).collect::<String>()
        )),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_peak_override_is_bounded_and_named() {
        assert_eq!(super::peak_override(None), Ok(None));
        assert_eq!(super::peak_override(Some(" ")), Ok(None));
        assert_eq!(super::peak_override(Some("2.5")), Ok(Some(2.5e9)));
        for bad in ["1e300", "inf", "NaN", "0", "-3", "1e12", "lots"] {
            let e = super::peak_override(Some(bad)).unwrap_err();
            assert!(
                e.contains(super::PEAK_VAR) && e.contains("to 1e11"),
                "{bad}: {e}"
            );
        }
    }
    use super::*;

    #[test]
    fn errors_carry_the_opencl_name_and_a_fitting_code() {
        let e = cl_error(
            "clEnqueueNDRangeKernel(pc_x)",
            cl3::error_codes::CL_OUT_OF_RESOURCES,
        );
        assert_eq!(e.code, ErrorCode::Internal);
        assert!(
            e.message
                .contains("clEnqueueNDRangeKernel(pc_x) failed: CL_OUT_OF_RESOURCES (-5)"),
            "{}",
            e.message
        );
        let e = cl_error(
            "clCreateBuffer",
            cl3::error_codes::CL_MEM_OBJECT_ALLOCATION_FAILURE,
        );
        assert_eq!(e.code, ErrorCode::OutOfMemory);
        assert!(e.message.contains("CL_MEM_OBJECT_ALLOCATION_FAILURE"));
        let e = cl_error("clFinish", cl3::error_codes::CL_DEVICE_NOT_AVAILABLE);
        assert_eq!(e.code, ErrorCode::DeviceLost);
    }
}

//! DLPack exchange, both ways: the versioned 1.x form
//! (`DLManagedTensorVersioned`, with the read-only and is-copied flags) and
//! the legacy unversioned one (`DLManagedTensor`).
//!
//! The structs here have exactly DLPack's layout under polychip names (so
//! `libpolychip.h` can be included beside `dlpack.h`): a framework casts its
//! `DLManagedTensorVersioned *` to `polychip_dlpack_versioned_t *` and back.
//!
//! Devices: a tensor on a plugin device is `kDLExtDev` (12) with
//! `device_id` = the device's index in the runtime (what
//! `polychip_runtime_device_info` describes; PyTorch's `polychip:N`). A
//! consumer may ask for `kDLCPU` (1): memory the host can read
//! (`host_visible`) is then handed over as it is, zero-copy; private memory
//! is copied into host memory and flagged `IS_COPIED`, unless the caller
//! forbade copies.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use polychip_host::{Buffer, DType, Device, Tensor, contiguous_strides};

use crate::error::{
    ApiError, ApiResult, POLYCHIP_API_ERROR_OUT_OF_MEMORY, POLYCHIP_API_ERROR_VERSION_MISMATCH,
    guard, polychip_error_t,
};
use crate::out_param;
use crate::runtime::{RUNTIMES, RuntimeObject, polychip_runtime_t};
use crate::stream::{STREAMS, polychip_stream_t};
use crate::tensor::{TensorObject, give, polychip_tensor_t, tensor};

/// `DLDevice`.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct polychip_dlpack_device_t {
    /// `DLDeviceType`: 1 CPU, 12 ext (a polychip plugin device), ...
    pub device_type: i32,
    /// The device's index (for `kDLExtDev`: in the runtime).
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct polychip_dlpack_dtype_t {
    /// `DLDataTypeCode`: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes (polychip: 1).
    pub lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct polychip_dlpack_tensor_t {
    /// The address of the data (before `byte_offset`).
    pub data: *mut c_void,
    /// Where the data is.
    pub device: polychip_dlpack_device_t,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: polychip_dlpack_dtype_t,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// `ndim` strides in elements (NULL: compact row-major).
    pub strides: *mut i64,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// `DLPackVersion`.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct polychip_dlpack_version_t {
    /// Major version (1).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// `DLManagedTensorVersioned`.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct polychip_dlpack_versioned_t {
    /// The DLPack version of this struct.
    pub version: polychip_dlpack_version_t,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees the tensor; the consumer calls it exactly once when done.
    pub deleter: Option<unsafe extern "C" fn(managed: *mut polychip_dlpack_versioned_t)>,
    /// `POLYCHIP_DLPACK_FLAG_READ_ONLY`, `POLYCHIP_DLPACK_FLAG_IS_COPIED`.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: polychip_dlpack_tensor_t,
}

/// `DLManagedTensor` (legacy, unversioned).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct polychip_dlpack_managed_t {
    /// The tensor.
    pub dl_tensor: polychip_dlpack_tensor_t,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees the tensor; the consumer calls it exactly once when done.
    pub deleter: Option<unsafe extern "C" fn(managed: *mut polychip_dlpack_managed_t)>,
}

/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write the data.
pub const POLYCHIP_DLPACK_FLAG_READ_ONLY: u64 = 1;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the data is a copy the consumer owns.
pub const POLYCHIP_DLPACK_FLAG_IS_COPIED: u64 = 2;
/// `kDLCPU`.
pub const POLYCHIP_DLPACK_CPU: i32 = 1;
/// `kDLExtDev`: a polychip plugin device.
pub const POLYCHIP_DLPACK_EXT_DEV: i32 = 12;
/// The DLPack major version polychip speaks.
pub const POLYCHIP_DLPACK_MAJOR: u32 = 1;
/// The DLPack minor version polychip produces.
pub const POLYCHIP_DLPACK_MINOR: u32 = 0;

/// Whether an export may copy.
pub type polychip_dlpack_copy_t = i32;
/// Copy only when the requested device cannot see the memory.
pub const POLYCHIP_DLPACK_COPY_IF_NEEDED: polychip_dlpack_copy_t = -1;
/// Never copy: refuse instead.
pub const POLYCHIP_DLPACK_COPY_NEVER: polychip_dlpack_copy_t = 0;
/// Always hand over a copy.
pub const POLYCHIP_DLPACK_COPY_ALWAYS: polychip_dlpack_copy_t = 1;

/// What an exported tensor keeps alive until its deleter runs.
struct Export {
    /// The view (and through it the buffer, device and plugin).
    _tensor: Option<Tensor>,
    /// A host copy, when the data was copied.
    _copy: Option<Vec<u8>>,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

/// The managed structs handed out and not yet deleted (a second deleter
/// call is detected and ignored instead of freeing twice), with the buffer
/// of each zero-copy export: a consumer's own re-export of that memory (a
/// torch tensor made from it, exported again as kDLCPU) is recognised on
/// import and comes back as the same memory.
/// A zero-copy export's buffer and the runtime index of its device.
type Shared = (Arc<Buffer>, u32);

/// What is known of one managed struct polychip handed out.
struct Exported {
    /// The buffer, for a zero-copy export.
    shared: Option<Shared>,
    /// A legacy `DLManagedTensor` (else a `DLManagedTensorVersioned`).
    legacy: bool,
    /// An import owns it now (a second import would be a second owner:
    /// its deleter would run twice, and the memory would be freed under
    /// one of them).
    imported: bool,
}

static LIVE: Mutex<Option<HashMap<usize, Exported>>> = Mutex::new(None);

fn track(ptr: usize, shared: Option<Shared>, legacy: bool) {
    LIVE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(
            ptr,
            Exported {
                shared,
                legacy,
                imported: false,
            },
        );
}

fn untrack(ptr: usize) -> bool {
    LIVE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()
        .is_some_and(|live| live.remove(&ptr).is_some())
}

/// Takes `ptr` for an import (through the function for `legacy` structs)
/// when polychip exported it: refuses one imported already (until its
/// deleter runs) and one of the other layout. `Ok(true)` when it was ours
/// (then [`unclaim`] gives it back if the import fails).
fn claim(ptr: usize, legacy: bool) -> ApiResult<bool> {
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(export) = live.as_mut().and_then(|l| l.get_mut(&ptr)) else {
        return Ok(false);
    };
    if export.legacy != legacy {
        return Err(ApiError::invalid(if export.legacy {
            "managed is a legacy DLManagedTensor (made by polychip_tensor_to_dlpack_legacy); \
             import it with polychip_tensor_from_dlpack_legacy"
        } else {
            "managed is a DLPack 1.x DLManagedTensorVersioned (made by \
             polychip_tensor_to_dlpack); import it with polychip_tensor_from_dlpack"
        }));
    }
    if export.imported {
        return Err(ApiError::invalid(
            "managed was imported already: a DLPack tensor is consumed once (the first \
             import owns it and calls its deleter), so import it once and share the tensor \
             handle, or make a view of it",
        ));
    }
    export.imported = true;
    Ok(true)
}

/// Gives back an export [`claim`] took, after a failed import.
fn unclaim(ptr: usize) {
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(export) = live.as_mut().and_then(|l| l.get_mut(&ptr)) {
        export.imported = false;
    }
}

/// The exported buffer that holds the bytes `start..end`, with its device.
fn exported_buffer(start: usize, end: usize) -> Option<Shared> {
    let live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.as_ref()?
        .values()
        .filter_map(|e| e.shared.as_ref())
        .find_map(|(buffer, device)| {
            let base = buffer.ptr() as usize;
            (base <= start && end <= base + buffer.len() as usize)
                .then(|| (buffer.clone(), *device))
        })
}

/// The export's `DLTensor` and the context it points into.
fn describe(
    t: &TensorObject,
    requested: i32,
    copy: polychip_dlpack_copy_t,
) -> ApiResult<(polychip_dlpack_tensor_t, Box<Export>, u64)> {
    if !matches!(
        copy,
        POLYCHIP_DLPACK_COPY_IF_NEEDED | POLYCHIP_DLPACK_COPY_NEVER | POLYCHIP_DLPACK_COPY_ALWAYS
    ) {
        return Err(ApiError::invalid(format!(
            "copy {copy} is neither POLYCHIP_DLPACK_COPY_IF_NEEDED (-1), _NEVER (0) nor _ALWAYS (1)"
        )));
    }
    let v = &t.tensor;
    let host_visible = v.device().props().host_visible;
    let device_type = match requested {
        0 => {
            if host_visible {
                POLYCHIP_DLPACK_CPU
            } else {
                POLYCHIP_DLPACK_EXT_DEV
            }
        }
        POLYCHIP_DLPACK_CPU | POLYCHIP_DLPACK_EXT_DEV => requested,
        other => {
            return Err(ApiError::invalid(format!(
                "device_type {other} is neither 0 (the tensor's own), kDLCPU (1) nor kDLExtDev (12)"
            )));
        }
    };
    let must_copy = copy == POLYCHIP_DLPACK_COPY_ALWAYS
        || (device_type == POLYCHIP_DLPACK_CPU && !host_visible);
    if must_copy && device_type == POLYCHIP_DLPACK_EXT_DEV {
        return Err(ApiError::invalid(
            "a copy on the device is not a DLPack export; copy with polychip_op_copy first",
        ));
    }
    if must_copy && copy == POLYCHIP_DLPACK_COPY_NEVER {
        return Err(ApiError::invalid(format!(
            "the tensor lives in {}'s private memory, which a kDLCPU consumer cannot read without a copy, and copies were forbidden",
            v.device()
        )));
    }
    let raw = v.raw();
    let (mut export, data, byte_offset, flags) = if must_copy {
        // A broadcast view of a few bytes may name terabytes: a copy the
        // host cannot hold is an error, not an abort in the allocator.
        let len = v.numel() * v.dtype().size();
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(len).map_err(|_| {
            ApiError::new(
                POLYCHIP_API_ERROR_OUT_OF_MEMORY,
                format!(
                    "exporting a copy of the tensor ({}, shape {:?}) needs {len} bytes of host memory, which could not be allocated",
                    v.dtype(),
                    v.shape()
                ),
            )
        })?;
        bytes.resize(len, 0);
        v.read_into(&mut bytes)?;
        let strides = contiguous_strides(v.shape());
        let data = bytes.as_mut_ptr().cast::<c_void>();
        let export = Export {
            _tensor: None,
            _copy: Some(bytes),
            shape: v.shape().to_vec(),
            strides,
        };
        (export, data, 0, POLYCHIP_DLPACK_FLAG_IS_COPIED)
    } else {
        let export = Export {
            _tensor: Some(v.clone()),
            _copy: None,
            shape: v.shape().to_vec(),
            strides: v.strides().to_vec(),
        };
        (export, raw.data, raw.byte_offset, 0)
    };
    let device_id = if device_type == POLYCHIP_DLPACK_CPU {
        0
    } else {
        t.device as i32
    };
    let dl = polychip_dlpack_tensor_t {
        data,
        device: polychip_dlpack_device_t {
            device_type,
            device_id,
        },
        ndim: export.shape.len() as i32,
        dtype: polychip_dlpack_dtype_t {
            code: raw.dtype.code,
            bits: raw.dtype.bits,
            lanes: raw.dtype.lanes,
        },
        shape: export.shape.as_mut_ptr(),
        strides: export.strides.as_mut_ptr(),
        byte_offset,
    };
    Ok((dl, Box::new(export), flags))
}

/// Waits for `producer`'s work (when given) so a consumer sees it done.
fn settle(producer: *const polychip_stream_t) -> ApiResult<()> {
    if producer.is_null() {
        return Ok(());
    }
    Ok(STREAMS
        .get(producer.cast(), "producer")?
        .lock()
        .synchronize()?)
}

unsafe extern "C" fn delete_versioned(this: *mut polychip_dlpack_versioned_t) {
    if this.is_null() || !untrack(this as usize) {
        log::warn!("a DLPack deleter ran for a tensor polychip does not own (twice?); ignored");
        return;
    }
    // SAFETY: `this` was made by `Box::into_raw` in an export and is
    // deleted once (it was still tracked); its context likewise.
    unsafe {
        let managed = Box::from_raw(this);
        drop(Box::from_raw(managed.manager_ctx.cast::<Export>()));
    }
}

unsafe extern "C" fn delete_managed(this: *mut polychip_dlpack_managed_t) {
    if this.is_null() || !untrack(this as usize) {
        log::warn!("a DLPack deleter ran for a tensor polychip does not own (twice?); ignored");
        return;
    }
    // SAFETY: as for `delete_versioned`.
    unsafe {
        let managed = Box::from_raw(this);
        drop(Box::from_raw(managed.manager_ctx.cast::<Export>()));
    }
}

/// Exports `tensor` as a DLPack 1.x managed tensor.
///
/// `device_type`: 0 for the natural one (kDLCPU when the device's memory is
/// host-visible, else kDLExtDev), or kDLCPU / kDLExtDev. `copy`:
/// `POLYCHIP_DLPACK_COPY_IF_NEEDED`, `_NEVER` or `_ALWAYS`. `producer`, when
/// not NULL, is the stream that wrote the tensor: the export waits for its
/// work first.
///
/// Ownership: `*out` is the consumer's; it calls `(*out)->deleter(*out)`
/// exactly once. The data stays valid until then, whatever happens to the
/// tensor handle and the runtime.
/// Thread safety: any thread.
///
/// # Safety
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_tensor_to_dlpack(
    tensor: *const polychip_tensor_t,
    device_type: i32,
    copy: polychip_dlpack_copy_t,
    producer: *const polychip_stream_t,
    out: *mut *mut polychip_dlpack_versioned_t,
) -> *mut polychip_error_t {
    guard("polychip_tensor_to_dlpack", || {
        let out = out_param(out, "out")?;
        let t = self::tensor(tensor, "tensor")?;
        settle(producer)?;
        let (dl_tensor, export, flags) = describe(&t, device_type, copy)?;
        let shared = export
            ._tensor
            .as_ref()
            .map(|v| (v.buffer().clone(), t.device));
        let managed = Box::into_raw(Box::new(polychip_dlpack_versioned_t {
            version: polychip_dlpack_version_t {
                major: POLYCHIP_DLPACK_MAJOR,
                minor: POLYCHIP_DLPACK_MINOR,
            },
            manager_ctx: Box::into_raw(export).cast(),
            deleter: Some(delete_versioned),
            flags,
            dl_tensor,
        }));
        track(managed as usize, shared, false);
        // SAFETY: checked non-NULL; writable per the contract.
        unsafe { out.write(managed) };
        Ok(())
    })
}

/// Exports `tensor` as a legacy (unversioned) DLPack managed tensor, for
/// consumers older than DLPack 1.0. As `polychip_tensor_to_dlpack`, except
/// that a copy cannot be flagged: `copy` `POLYCHIP_DLPACK_COPY_IF_NEEDED`
/// refuses what would need one.
///
/// Ownership, thread safety: as for `polychip_tensor_to_dlpack`.
///
/// # Safety
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_tensor_to_dlpack_legacy(
    tensor: *const polychip_tensor_t,
    device_type: i32,
    copy: polychip_dlpack_copy_t,
    producer: *const polychip_stream_t,
    out: *mut *mut polychip_dlpack_managed_t,
) -> *mut polychip_error_t {
    guard("polychip_tensor_to_dlpack_legacy", || {
        let out = out_param(out, "out")?;
        let t = self::tensor(tensor, "tensor")?;
        settle(producer)?;
        if copy == POLYCHIP_DLPACK_COPY_IF_NEEDED
            && device_type == POLYCHIP_DLPACK_CPU
            && !t.tensor.device().props().host_visible
        {
            return Err(ApiError::invalid(format!(
                "the tensor lives in {}'s private memory, which a kDLCPU consumer reads only \
                 through a copy, and a legacy (unversioned) DLPack tensor cannot say it is one: \
                 export DLPack 1.x (polychip_tensor_to_dlpack; Python: max_version=(1, 0)), or \
                 ask for the copy (POLYCHIP_DLPACK_COPY_ALWAYS; Python: copy=True)",
                t.tensor.device()
            )));
        }
        let copy = if copy == POLYCHIP_DLPACK_COPY_IF_NEEDED {
            POLYCHIP_DLPACK_COPY_NEVER
        } else {
            copy
        };
        let (dl_tensor, export, _) = describe(&t, device_type, copy)?;
        let shared = export
            ._tensor
            .as_ref()
            .map(|v| (v.buffer().clone(), t.device));
        let managed = Box::into_raw(Box::new(polychip_dlpack_managed_t {
            dl_tensor,
            manager_ctx: Box::into_raw(export).cast(),
            deleter: Some(delete_managed),
        }));
        track(managed as usize, shared, true);
        // SAFETY: checked non-NULL; writable per the contract.
        unsafe { out.write(managed) };
        Ok(())
    })
}

/// A producer's tensor as seen by an import, with how to release it.
struct Incoming {
    dl: polychip_dlpack_tensor_t,
    read_only: bool,
    release: Box<dyn FnOnce() + Send>,
}

/// The polychip dtype of a DLPack dtype.
fn dtype_of(dl: polychip_dlpack_dtype_t) -> ApiResult<DType> {
    DType::ALL
        .into_iter()
        .find(|d| {
            let r = d.to_raw();
            (r.code, r.bits, r.lanes) == (dl.code, dl.bits, dl.lanes)
        })
        .ok_or_else(|| {
            ApiError::invalid(format!(
                "DLPack dtype (code {}, bits {}, lanes {}: {}) has no polychip dtype; polychip \
                 takes float32, float16, bfloat16, float64, int32, int64, uint8 and bool, of 1 lane",
                dl.code,
                dl.bits,
                dl.lanes,
                dlpack_dtype_name(dl)
            ))
        })
}

/// What a DLPack dtype is, in words (for messages).
fn dlpack_dtype_name(dl: polychip_dlpack_dtype_t) -> String {
    let kind = match dl.code {
        0 => "int",
        1 => "uint",
        2 => "float",
        3 => "opaque handle",
        4 => "bfloat",
        5 => "complex",
        6 => "bool",
        7..=13 => "float8/float6/float4",
        _ => return format!("type code {} is not a DLPack type code", dl.code),
    };
    let base = if dl.code == 3 || dl.code >= 6 {
        format!("{kind} of {} bits", dl.bits)
    } else {
        format!("{kind}{}", dl.bits)
    };
    match dl.lanes {
        1 => base,
        0 => format!("{base} with lanes 0, which is no vector width"),
        n => format!("a vector of {n} {base} lanes"),
    }
}

/// A DLPack device type's name (for messages): other libraries' devices
/// are named, so a caller sees whose memory it passed.
fn dlpack_device_name(device_type: i32) -> String {
    let name = match device_type {
        1 => "kDLCPU",
        2 => "kDLCUDA",
        3 => "kDLCUDAHost",
        4 => "kDLOpenCL",
        7 => "kDLVulkan",
        8 => "kDLMetal",
        9 => "kDLVPI",
        10 => "kDLROCM",
        11 => "kDLROCMHost",
        12 => "kDLExtDev",
        13 => "kDLCUDAManaged",
        14 => "kDLOneAPI",
        15 => "kDLWebGPU",
        16 => "kDLHexagon",
        17 => "kDLMAIA",
        _ => return format!("device type {device_type}, which is no DLPack device type"),
    };
    format!("{name} ({device_type})")
}

/// Imports `incoming`: zero-copy onto the runtime device it names
/// (kDLExtDev), or a copy onto `target` (kDLCPU data, or read-only data).
///
/// # Safety
/// `incoming.dl` describes valid memory until `release` runs.
unsafe fn import(rt: &RuntimeObject, incoming: Incoming, target: i64) -> ApiResult<(Tensor, u32)> {
    if target < -1 {
        return Err(ApiError::invalid(format!(
            "device {target} is not a device index; give one from 0, or -1 for device 0 or \
             the tensor's own"
        )));
    }
    let dl = incoming.dl;
    let dtype = dtype_of(dl.dtype)?;
    let ndim = usize::try_from(dl.ndim)
        .ok()
        .filter(|&n| n <= 64)
        .ok_or_else(|| ApiError::invalid(format!("DLPack ndim {} is out of range", dl.ndim)))?;
    if ndim > 0 && dl.shape.is_null() {
        return Err(ApiError::invalid("DLPack shape is NULL"));
    }
    if ndim > 0 {
        crate::address(dl.shape, "the DLPack tensor's shape")?;
        crate::address(dl.strides, "the DLPack tensor's strides")?;
    }
    let shape: Vec<i64> = if ndim == 0 {
        Vec::new()
    } else {
        // SAFETY: per the contract, `ndim` readable extents (checked non-NULL).
        unsafe { std::slice::from_raw_parts(dl.shape, ndim) }.to_vec()
    };
    let strides: Vec<i64> = if dl.strides.is_null() || ndim == 0 {
        contiguous_strides(&shape)
    } else {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(dl.strides, ndim) }.to_vec()
    };
    if shape.iter().any(|&d| d < 0) {
        return Err(ApiError::invalid(format!(
            "DLPack shape {shape:?} has a negative extent"
        )));
    }
    // Every sum and product below fits in 64 bits once this passes.
    crate::tensor::check_view_sizes(
        || {
            format!(
                "the DLPack tensor ({dtype}, shape {shape:?}, strides {strides:?}, byte_offset {})",
                dl.byte_offset
            )
        },
        dtype,
        &shape,
        &strides,
        i128::from(dl.byte_offset),
    )?;
    let numel: usize = shape.iter().map(|&d| d as usize).product();
    let size = dtype.size();
    if numel > 0 && dl.data.is_null() {
        return Err(ApiError::invalid(format!(
            "the DLPack tensor's data is NULL but its shape {shape:?} has {numel} elements"
        )));
    }
    if numel > 0 && dl.device.device_type == POLYCHIP_DLPACK_CPU {
        // Host memory (a device address is checked against the device's
        // allocations below).
        crate::address(dl.data, "the DLPack tensor's data")?;
    }
    // The elements' byte span relative to the first element.
    let (mut lo, mut hi) = (0i64, 0i64);
    if numel > 0 {
        for (&d, &s) in shape.iter().zip(&strides) {
            let reach = (d - 1) * s;
            if reach < 0 {
                lo += reach;
            } else {
                hi += reach;
            }
        }
    }
    let device_of = |index: i64| -> ApiResult<(Device, u32)> {
        let index = u32::try_from(index)
            .map_err(|_| ApiError::invalid(format!("device {index} does not exist")))?;
        Ok((rt.device(index)?.clone(), index))
    };
    match dl.device.device_type {
        POLYCHIP_DLPACK_EXT_DEV if !incoming.read_only => {
            let (device, index) = device_of(i64::from(dl.device.device_id))?;
            if target >= 0 && target != i64::from(index) {
                return Err(ApiError::invalid(format!(
                    "the DLPack tensor is on device {index} but device {target} was asked for; move it with polychip_tensor_to_device"
                )));
            }
            let first = dl.byte_offset as i64 + lo * size as i64;
            if first < 0 {
                return Err(ApiError::invalid(
                    "the DLPack tensor's strides reach before its data",
                ));
            }
            if dl.byte_offset % size as u64 != 0 {
                return Err(ApiError::invalid(format!(
                    "the DLPack tensor's byte_offset {} is not a multiple of its {size}-byte elements",
                    dl.byte_offset
                )));
            }
            let bytes = (dl.byte_offset as i64 + (hi + 1) * size as i64) as u64;
            // kDLExtDev is shared with other libraries: memory another
            // library (or a forged capsule) names would be handed to the
            // plugin, and a host-visible device's reads would dereference
            // it. Only memory this process's polychip allocated on the
            // device, and still holds, is taken.
            if numel > 0 && !device.holds(dl.data, bytes) {
                return Err(ApiError::invalid(format!(
                    "the DLPack tensor on device {index} ({}) names {bytes} bytes at {:p}, which are \
                     not inside memory polychip allocated on that device and still holds (kDLExtDev \
                     is shared with other libraries); import it from the CPU, or through the \
                     library that made it",
                    device, dl.data
                )));
            }
            // Nothing below fails: the buffer takes over `release` and must
            // not run it on an error path (the caller would still own it).
            // SAFETY: the producer promises the memory until `release`, which
            // the buffer calls when the last view of it is gone.
            let buffer = unsafe {
                Buffer::foreign(
                    &device,
                    dl.data,
                    if numel == 0 { 0 } else { bytes },
                    incoming.release,
                )
            };
            let tensor =
                Tensor::from_buffer(Arc::new(buffer), dtype, &shape, &strides, dl.byte_offset)
                    .expect("the buffer was sized to hold the view");
            Ok((tensor, index))
        }
        POLYCHIP_DLPACK_CPU
            if !incoming.read_only && shared_view(rt, &dl, lo, hi, size, numel).is_some() =>
        {
            let (buffer, index, offset) =
                shared_view(rt, &dl, lo, hi, size, numel).expect("checked");
            if target >= 0 && target != i64::from(index) {
                return Err(ApiError::invalid(format!(
                    "the DLPack tensor is memory of device {index} but device {target} was asked for; move it with polychip_tensor_to_device"
                )));
            }
            let tensor = Tensor::from_buffer(buffer, dtype, &shape, &strides, offset)?;
            // The view holds the buffer itself: the producer's view of it
            // can go now.
            (incoming.release)();
            Ok((tensor, index))
        }
        POLYCHIP_DLPACK_CPU | POLYCHIP_DLPACK_EXT_DEV => {
            if dl.device.device_type == POLYCHIP_DLPACK_EXT_DEV {
                return Err(ApiError::invalid(
                    "a read-only kDLExtDev tensor cannot be imported: polychip tensors are writable",
                ));
            }
            let (device, index) = device_of(target.max(0))?;
            // The device tensor first: a shape the device cannot hold (a
            // broadcast NumPy array of 2^40 elements is a few bytes of host
            // memory) fails here as out of device memory, before the host
            // gathers that many bytes.
            let tensor = device.empty(dtype, &shape)?;
            let mut bytes = Vec::new();
            bytes.try_reserve_exact(numel * size).map_err(|_| {
                ApiError::new(
                    POLYCHIP_API_ERROR_OUT_OF_MEMORY,
                    format!(
                        "copying the DLPack tensor ({dtype}, shape {shape:?}) needs {} bytes of host memory, which could not be allocated",
                        numel * size
                    ),
                )
            })?;
            let base = dl.data.cast::<u8>().wrapping_add(dl.byte_offset as usize);
            let mut at = vec![0i64; ndim];
            for _ in 0..numel {
                let offset: i64 = at.iter().zip(&strides).map(|(i, s)| i * s).sum();
                // SAFETY: the producer's host memory holds every element the
                // shape and strides reach, valid until `release`.
                let element = unsafe {
                    std::slice::from_raw_parts(
                        base.wrapping_offset(offset as isize * size as isize),
                        size,
                    )
                };
                bytes.extend_from_slice(element);
                for k in (0..ndim).rev() {
                    at[k] += 1;
                    if at[k] < shape[k] {
                        break;
                    }
                    at[k] = 0;
                }
            }
            tensor.write_bytes(&bytes)?;
            (incoming.release)();
            Ok((tensor, index))
        }
        other => Err(ApiError::invalid(format!(
            "the DLPack tensor is on {}, not on kDLCPU (1) nor kDLExtDev (12): polychip \
             reads host memory and its own devices' only; copy it to the CPU first",
            dlpack_device_name(other)
        ))),
    }
}

/// When host data lies inside a buffer polychip exported (zero-copy) and
/// still shares: that buffer, its device and the data's offset in it.
fn shared_view(
    rt: &RuntimeObject,
    dl: &polychip_dlpack_tensor_t,
    lo: i64,
    hi: i64,
    size: usize,
    numel: usize,
) -> Option<(Arc<Buffer>, u32, u64)> {
    if numel == 0 || dl.data.is_null() {
        return None;
    }
    let first = (dl.data as usize as i64).checked_add(dl.byte_offset as i64)?;
    let start = first.checked_add(lo.checked_mul(size as i64)?)?;
    let end = first.checked_add((hi + 1).checked_mul(size as i64)?)?;
    let (buffer, _) = exported_buffer(usize::try_from(start).ok()?, usize::try_from(end).ok()?)?;
    // The device's index in the importing runtime (another runtime, which
    // numbers its devices otherwise, may have exported it); a runtime
    // without that device takes a copy.
    let device = rt
        .runtime
        .devices()
        .iter()
        .position(|d| d == buffer.device())?;
    let offset = (first as usize).checked_sub(buffer.ptr() as usize)? as u64;
    (offset % size as u64 == 0).then_some((buffer, device as u32, offset))
}

/// A tensor from a DLPack 1.x managed tensor. Data on a polychip device
/// (kDLExtDev, `device_id` = runtime index), and host data that lies in
/// host-visible device memory polychip exported (a consumer handing it
/// back, e.g. a torch tensor made from a polychip one), become a tensor
/// sharing it, zero-copy; other host data (kDLCPU), or read-only data, is
/// copied onto device `device` of `runtime` (-1: device 0, or the tensor's
/// own; another negative value is refused).
///
/// Ownership: on success libpolychip owns `managed` and calls its deleter
/// once, when the last view of the data is gone (at once after a copy); on
/// failure the caller still owns it. A managed tensor of another DLPack
/// major is refused (`POLYCHIP_API_ERROR_VERSION_MISMATCH`) without reading
/// more than its version. A managed tensor polychip exported is consumed
/// once: imported again while the first import owns it, or made by
/// `polychip_tensor_to_dlpack_legacy`, it is refused without being read.
/// Another library's device, a dtype polychip has not, an `ndim` out of
/// range and sizes that overflow 64 bits are refused naming the field and
/// its value. Thread safety: any thread.
///
/// # Safety
/// `managed` points to a live DLPack 1.x managed tensor whose data is
/// valid until its deleter runs; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_tensor_from_dlpack(
    runtime: *const polychip_runtime_t,
    managed: *mut polychip_dlpack_versioned_t,
    device: i64,
    out: *mut *mut polychip_tensor_t,
) -> *mut polychip_error_t {
    guard("polychip_tensor_from_dlpack", || {
        let out = out_param(out, "out")?;
        let rt = RUNTIMES.get(runtime.cast(), "runtime")?;
        if managed.is_null() {
            return Err(ApiError::invalid("managed is NULL"));
        }
        crate::address(managed, "managed")?;
        let ours = claim(managed as usize, false)?;
        // SAFETY: forwarded contract.
        let result = unsafe { import_versioned(&rt, managed, device, out) };
        if result.is_err() && ours {
            unclaim(managed as usize);
        }
        result
    })
}

/// The body of `polychip_tensor_from_dlpack`, once `managed` is claimed.
///
/// # Safety
/// As for `polychip_tensor_from_dlpack`, `managed` non-NULL.
unsafe fn import_versioned(
    rt: &RuntimeObject,
    managed: *mut polychip_dlpack_versioned_t,
    device: i64,
    out: std::ptr::NonNull<*mut polychip_tensor_t>,
) -> ApiResult<()> {
    // SAFETY: per the contract, a live managed tensor; its version comes first.
    let version = unsafe { (*managed).version };
    if version.major != POLYCHIP_DLPACK_MAJOR {
        return Err(ApiError::new(
            POLYCHIP_API_ERROR_VERSION_MISMATCH,
            format!(
                "the DLPack tensor is version {}.{} but polychip reads major {POLYCHIP_DLPACK_MAJOR}",
                version.major, version.minor
            ),
        ));
    }
    // SAFETY: as above.
    let (dl, flags, deleter) =
        unsafe { ((*managed).dl_tensor, (*managed).flags, (*managed).deleter) };
    let incoming = Incoming {
        dl,
        read_only: flags & POLYCHIP_DLPACK_FLAG_READ_ONLY != 0,
        release: release_of(managed, deleter),
    };
    // SAFETY: forwarded contract.
    unsafe { finish_import(rt, incoming, device, out) }
}

/// A tensor from a legacy (unversioned) DLPack managed tensor; as
/// `polychip_tensor_from_dlpack` (legacy tensors carry no read-only flag;
/// one polychip made with `polychip_tensor_to_dlpack` is refused).
///
/// # Safety
/// `managed` points to a live managed tensor whose data is valid until its
/// deleter runs; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_tensor_from_dlpack_legacy(
    runtime: *const polychip_runtime_t,
    managed: *mut polychip_dlpack_managed_t,
    device: i64,
    out: *mut *mut polychip_tensor_t,
) -> *mut polychip_error_t {
    guard("polychip_tensor_from_dlpack_legacy", || {
        let out = out_param(out, "out")?;
        let rt = RUNTIMES.get(runtime.cast(), "runtime")?;
        if managed.is_null() {
            return Err(ApiError::invalid("managed is NULL"));
        }
        crate::address(managed, "managed")?;
        let ours = claim(managed as usize, true)?;
        // SAFETY: per the contract, a live managed tensor.
        let (dl, deleter) = unsafe { ((*managed).dl_tensor, (*managed).deleter) };
        let incoming = Incoming {
            dl,
            read_only: false,
            release: release_of(managed, deleter),
        };
        // SAFETY: forwarded contract.
        let result = unsafe { finish_import(&rt, incoming, device, out) };
        if result.is_err() && ours {
            unclaim(managed as usize);
        }
        result
    })
}

/// Calls the producer's deleter once, when the import lets go of its tensor.
fn release_of<M: 'static>(
    managed: *mut M,
    deleter: Option<unsafe extern "C" fn(*mut M)>,
) -> Box<dyn FnOnce() + Send> {
    let addr = managed as usize;
    Box::new(move || {
        if let Some(delete) = deleter {
            // SAFETY: the producer's deleter, called once for its own tensor.
            unsafe { delete(addr as *mut M) };
        }
    })
}

/// Imports `incoming` and hands the tensor to the caller.
///
/// # Safety
/// As for [`import`]; `out` is writable.
unsafe fn finish_import(
    rt: &RuntimeObject,
    incoming: Incoming,
    device: i64,
    out: std::ptr::NonNull<*mut polychip_tensor_t>,
) -> ApiResult<()> {
    // SAFETY: forwarded contract.
    let (tensor, index) = unsafe { import(rt, incoming, device)? };
    // SAFETY: writable per the contract.
    unsafe { out.write(give(tensor, index)) };
    Ok(())
}

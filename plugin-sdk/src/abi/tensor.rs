//! Tensors cross the boundary as a descriptor laid out exactly like DLPack's
//! `DLTensor`, so a framework can hand over a `DLTensor *` without copying.

use std::ffi::c_void;

/// A data type, laid out like DLPack's `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PolychipDataType {
    /// One of the `POLYCHIP_DTYPE_CODE_*` constants (DLPack's type codes).
    pub code: u8,
    /// Bits per element: 8, 16, 32 or 64.
    pub bits: u8,
    /// Vector lanes; always 1 in ABI v1.
    pub lanes: u16,
}

/// Signed integer (DLPack `kDLInt`).
pub const POLYCHIP_DTYPE_CODE_INT: u8 = 0;
/// Unsigned integer (DLPack `kDLUInt`).
pub const POLYCHIP_DTYPE_CODE_UINT: u8 = 1;
/// IEEE binary floating point (DLPack `kDLFloat`).
pub const POLYCHIP_DTYPE_CODE_FLOAT: u8 = 2;
/// bfloat16 (DLPack `kDLBfloat`).
pub const POLYCHIP_DTYPE_CODE_BFLOAT: u8 = 4;
/// Boolean, one byte holding 0 or 1 (DLPack `kDLBool`).
pub const POLYCHIP_DTYPE_CODE_BOOL: u8 = 6;

/// A device, laid out like DLPack's `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PolychipDevice {
    /// DLPack device type. Plugin devices use [`POLYCHIP_DEVICE_TYPE_EXT`];
    /// host memory is [`POLYCHIP_DEVICE_TYPE_CPU`].
    pub device_type: i32,
    /// The device's index within its plugin (not across plugins).
    pub device_id: i32,
}

/// Host memory (DLPack `kDLCPU`).
pub const POLYCHIP_DEVICE_TYPE_CPU: i32 = 1;
/// A plugin's device (DLPack `kDLExtDev`).
pub const POLYCHIP_DEVICE_TYPE_EXT: i32 = 12;

/// A tensor descriptor, laid out exactly like DLPack's `DLTensor`.
///
/// The element at index `(i0, i1, ...)` lives at byte address
/// `data + byte_offset + sizeof(dtype) * sum(ik * strides[k])`. Strides are in
/// elements and may be zero (broadcast inputs) or negative; NULL `strides`
/// means compact row-major. `shape` has `ndim` entries, each `>= 0`.
///
/// Lifetime: every pointer in a descriptor passed to a plugin is borrowed for
/// the duration of that call only; the memory `data` points to must stay valid
/// until the work enqueued by the call has completed on its stream.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipTensor {
    /// A device address returned by `mem_alloc` (or inside such an
    /// allocation). Not dereferenceable by the host unless the device's memory
    /// is host-visible.
    pub data: *mut c_void,
    /// The device that holds `data`.
    pub device: PolychipDevice,
    /// Number of dimensions, `>= 0`.
    pub ndim: i32,
    /// Element type.
    pub dtype: PolychipDataType,
    /// `ndim` extents; may be NULL when `ndim == 0`.
    pub shape: *const i64,
    /// `ndim` strides in elements, or NULL for compact row-major.
    pub strides: *const i64,
    /// Bytes added to `data` before indexing.
    pub byte_offset: u64,
}

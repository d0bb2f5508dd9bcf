//! What a plugin reports about each of its devices: the facts a host, a
//! communication layer and a planner need.

use std::ffi::c_char;

/// Bytes in [`PolychipDeviceProps::name`], including the terminating NUL.
pub const POLYCHIP_DEVICE_NAME_BYTES: usize = 64;

/// Device memory may be read and written by the host through ordinary loads
/// and stores at the addresses `mem_alloc` returns (unified or host memory).
pub const POLYCHIP_MEMORY_HOST_VISIBLE: u32 = 1;
/// Device memory can be exported for RDMA registration (dma-buf or
/// equivalent), so a NIC can read and write it directly.
pub const POLYCHIP_MEMORY_RDMA_EXPORTABLE: u32 = 2;

/// Properties of one device.
///
/// The caller sets `struct_size` to the size it allocated and zeroes the rest;
/// the plugin writes only the fields that end within that size and sets
/// `struct_size` to the number of bytes it wrote. Fields added by later minors
/// are appended at the end.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipDeviceProps {
    /// Size of this struct as the writer knows it (see above).
    pub struct_size: usize,
    /// Human-readable device name, NUL-terminated, UTF-8.
    pub name: [c_char; POLYCHIP_DEVICE_NAME_BYTES],
    /// Device memory capacity in bytes.
    pub memory_bytes: u64,
    /// A bitwise OR of `POLYCHIP_MEMORY_*` flags.
    pub memory_flags: u32,
    /// Independent compute units (cores, SMs); 0 if not meaningful.
    pub compute_units: u32,
    /// Peak dense matmul throughput in FLOP/s for f32 inputs.
    pub peak_flops_f32: f64,
    /// Peak dense matmul throughput in FLOP/s for bf16 inputs.
    pub peak_flops_bf16: f64,
    /// Peak dense matmul throughput in FLOP/s for f16 inputs.
    pub peak_flops_f16: f64,
    /// Device memory bandwidth in bytes/s.
    pub memory_bandwidth: f64,
    /// Bandwidth of the device's link to the host or its peers in bytes/s,
    /// per direction.
    pub link_bandwidth: f64,
}

impl Default for PolychipDeviceProps {
    fn default() -> Self {
        PolychipDeviceProps {
            struct_size: std::mem::size_of::<Self>(),
            name: [0; POLYCHIP_DEVICE_NAME_BYTES],
            memory_bytes: 0,
            memory_flags: 0,
            compute_units: 0,
            peak_flops_f32: 0.0,
            peak_flops_bf16: 0.0,
            peak_flops_f16: 0.0,
            memory_bandwidth: 0.0,
            link_bandwidth: 0.0,
        }
    }
}

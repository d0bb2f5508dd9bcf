//! Device properties as a Rust struct, converted to and from the ABI's
//! size-prefixed [`PolychipDeviceProps`].

use std::ffi::c_char;

use crate::abi::{
    POLYCHIP_DEVICE_NAME_BYTES, POLYCHIP_MEMORY_HOST_VISIBLE, POLYCHIP_MEMORY_RDMA_EXPORTABLE,
    PolychipDeviceProps,
};

/// What a device reports about itself; see [`PolychipDeviceProps`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DeviceProps {
    /// Human-readable name (at most 63 bytes cross the ABI).
    pub name: String,
    /// Memory capacity in bytes.
    pub memory_bytes: u64,
    /// The host can load and store device memory directly.
    pub host_visible: bool,
    /// Device memory can be registered for RDMA.
    pub rdma_exportable: bool,
    /// Independent compute units; 0 if not meaningful.
    pub compute_units: u32,
    /// Peak FLOP/s for f32 matmul.
    pub peak_flops_f32: f64,
    /// Peak FLOP/s for bf16 matmul.
    pub peak_flops_bf16: f64,
    /// Peak FLOP/s for f16 matmul.
    pub peak_flops_f16: f64,
    /// Memory bandwidth in bytes/s.
    pub memory_bandwidth: f64,
    /// Link bandwidth in bytes/s per direction.
    pub link_bandwidth: f64,
}

impl DeviceProps {
    /// The ABI form, `struct_size` set to the full v1 size. A name longer
    /// than 63 bytes is cut at a character boundary.
    pub fn to_raw(&self) -> PolychipDeviceProps {
        let mut raw = PolychipDeviceProps::default();
        let mut len = self.name.len().min(POLYCHIP_DEVICE_NAME_BYTES - 1);
        while !self.name.is_char_boundary(len) {
            len -= 1;
        }
        for (dst, &src) in raw.name.iter_mut().zip(&self.name.as_bytes()[..len]) {
            *dst = src as c_char;
        }
        raw.memory_bytes = self.memory_bytes;
        raw.memory_flags = (if self.host_visible {
            POLYCHIP_MEMORY_HOST_VISIBLE
        } else {
            0
        }) | (if self.rdma_exportable {
            POLYCHIP_MEMORY_RDMA_EXPORTABLE
        } else {
            0
        });
        raw.compute_units = self.compute_units;
        raw.peak_flops_f32 = self.peak_flops_f32;
        raw.peak_flops_bf16 = self.peak_flops_bf16;
        raw.peak_flops_f16 = self.peak_flops_f16;
        raw.memory_bandwidth = self.memory_bandwidth;
        raw.link_bandwidth = self.link_bandwidth;
        raw
    }

    /// Reads the ABI form. Fields beyond `raw.struct_size` must already be
    /// zero (the reader zeroes the struct before the plugin writes it), so
    /// they read as 0 / false.
    pub fn from_raw(raw: &PolychipDeviceProps) -> DeviceProps {
        let name_bytes: Vec<u8> = raw
            .name
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        DeviceProps {
            name: String::from_utf8_lossy(&name_bytes).into_owned(),
            memory_bytes: raw.memory_bytes,
            host_visible: raw.memory_flags & POLYCHIP_MEMORY_HOST_VISIBLE != 0,
            rdma_exportable: raw.memory_flags & POLYCHIP_MEMORY_RDMA_EXPORTABLE != 0,
            compute_units: raw.compute_units,
            peak_flops_f32: raw.peak_flops_f32,
            peak_flops_bf16: raw.peak_flops_bf16,
            peak_flops_f16: raw.peak_flops_f16,
            memory_bandwidth: raw.memory_bandwidth,
            link_bandwidth: raw.link_bandwidth,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_cuts_long_names_on_char_boundaries() {
        let props = DeviceProps {
            name: "é".repeat(40),
            memory_bytes: 1 << 30,
            host_visible: true,
            peak_flops_f32: 1e12,
            ..DeviceProps::default()
        };
        let back = DeviceProps::from_raw(&props.to_raw());
        assert_eq!(back.name, "é".repeat(31));
        assert_eq!(back.memory_bytes, 1 << 30);
        assert!(back.host_visible && !back.rdma_exportable);
        assert_eq!(back.peak_flops_f32, 1e12);
    }
}

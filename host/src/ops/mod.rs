//! Operator calls: check the arguments with the same rules the SDK applies
//! (so errors name the op and shapes before anything crosses the boundary),
//! build the ABI args struct, and call the plugin's op-table entry. One
//! method per operator, derived from `spec/ops.toml` (`generated.rs`); this
//! file holds [`Exec`] and what every call shares.

use std::ptr::null_mut;

use polychip_plugin_sdk::abi::{
    POLYCHIP_DEVICE_TYPE_EXT, PolychipDevice, PolychipError, PolychipOpTable, PolychipStream,
    PolychipTensor,
};
use polychip_plugin_sdk::check::ArgError;
use polychip_plugin_sdk::{DType, Op};

#[rustfmt::skip]
mod generated;

pub use generated::{AdamwOptions, MatmulOptions};

use crate::device::Device;
use crate::error::{HostError, Result};
use crate::stream::Stream;
use crate::tensor::Tensor;

/// Where operators run: a device's default stream or one of its streams.
#[derive(Debug, Clone, Copy)]
pub struct Exec<'a> {
    device: &'a Device,
    stream: Option<&'a Stream>,
}

impl<'a> Exec<'a> {
    pub(crate) fn new(device: &'a Device, stream: Option<&'a Stream>) -> Exec<'a> {
        Exec { device, stream }
    }

    /// The device the operators run on.
    pub fn device(&self) -> &Device {
        self.device
    }

    /// Keeps a buffer alive until the stream synchronizes.
    fn pin(&self, t: &Tensor) {
        if let Some(stream) = self.stream {
            stream.pin(t.buffer());
        }
    }

    pub(crate) fn on_device(
        &self,
        op: &'static str,
        tensors: &[(&'static str, &Tensor)],
    ) -> Result<()> {
        for (name, t) in tensors {
            if t.device() != self.device {
                return Err(HostError::Usage(format!(
                    "{op}: {name} is on {} but the call runs on {}; copy it to that device first (Tensor::to_device, polychip_tensor_to_device)",
                    t.device(),
                    self.device
                )));
            }
        }
        Ok(())
    }

    pub(crate) fn invalid(&self, source: ArgError) -> HostError {
        HostError::InvalidArguments {
            plugin: self.device.plugin().vendor().to_string(),
            source,
        }
    }

    /// Refuses, as not implemented (counted), a `T` dtype the operator
    /// took on in a later ABI minor than the plugin's: a plugin never
    /// receives a dtype its minor did not define for the operator (ABI
    /// 1.3's integer `add`, `sub`, `mul` never reach a 1.2 plugin).
    pub(crate) fn dtype_since(&self, op: Op, t: &Tensor) -> Result<()> {
        let since = op.dtype_since(t.dtype());
        let plugin = self.device.plugin();
        let abi = plugin.abi_version();
        if abi >= since {
            return Ok(());
        }
        plugin.count_unimplemented();
        Err(HostError::DtypeUnimplemented {
            plugin: plugin.vendor().to_string(),
            op: op.name(),
            dtype: t.dtype(),
            since,
            abi,
        })
    }

    /// The op table of the device's plugin.
    fn ops(&self) -> &PolychipOpTable {
        &self.device.plugin().ops
    }

    /// The descriptor passed for an optional tensor the call does not give:
    /// no data, no dimensions, on the call's device.
    fn absent(&self) -> PolychipTensor {
        PolychipTensor {
            data: null_mut(),
            device: PolychipDevice {
                device_type: POLYCHIP_DEVICE_TYPE_EXT,
                device_id: self.device.index() as i32,
            },
            ndim: 0,
            dtype: DType::F32.to_raw(),
            shape: std::ptr::null(),
            strides: std::ptr::null(),
            byte_offset: 0,
        }
    }

    pub(crate) fn call<A>(
        &self,
        op: &'static str,
        entry: Option<
            unsafe extern "C" fn(u32, *mut PolychipStream, *const A) -> *mut PolychipError,
        >,
        args: &A,
        tensors: &[(&'static str, &Tensor)],
    ) -> Result<()> {
        let plugin = self.device.plugin();
        // SAFETY: every tensor was checked to be on this device, its view lies
        // inside its live buffer, and a stream pins the buffers until it
        // synchronizes (below), so the memory outlives the work.
        unsafe {
            plugin.call_op(
                op,
                entry,
                self.device.index(),
                self.stream.map(Stream::raw),
                args,
            )?
        };
        for (_, t) in tensors {
            self.pin(t);
        }
        Ok(())
    }
}

//! The polychip host: loads every vendor's plugin into one process and
//! drives all their devices through one safe API.
//!
//! A [`Runtime`] finds plugin libraries ([`discovery`]), loads each once per
//! process with `RTLD_NOW | RTLD_LOCAL`, negotiates the ABI version and checks
//! the plugin's tables ([`ffi`]), and lists every [`Device`]. Devices hand out
//! [`Tensor`]s in their memory and [`Stream`]s of work; [`Exec`] calls
//! operators after checking their arguments with the same rules the plugin SDK
//! applies; tensors move between any two devices, of any vendors, with
//! [`Tensor::to_device`]. Errors are [`HostError`]s naming the plugin, the
//! function or operator, and the cause. All `unsafe` code is in [`ffi`].

mod device;
pub mod discovery;
mod element;
mod error;
pub mod ffi;
mod memory;
mod ops;
pub mod probe;
mod runtime;
mod stream;
mod tensor;

pub use device::Device;
pub use element::Element;
pub use error::{HostError, Result};
pub use ffi::{LoadOptions, OpSet, Plugin};
pub use memory::Buffer;
pub use ops::{AdamwOptions, Exec, MatmulOptions};
pub use polychip_plugin_sdk::{
    ActivationBackwardOp, BinaryOp, BitwiseOp, CompareOp, DType, DeviceProps, ErrorCode, FieldInfo,
    FieldKind, Op, OpInfo, OutputBackwardOp, ReduceBoolOp, ReduceOp, UnaryOp, contiguous_strides,
};
pub use runtime::{LoadFailure, Runtime};
pub use stream::{Event, Stream};
pub use tensor::Tensor;

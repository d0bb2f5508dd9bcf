//! The polychip plugin SDK.
//!
//! [`abi`] holds the `#[repr(C)]` types of the plugin ABI, from which
//! `include/polychip.h` is generated: the contract between the polychip host
//! and every vendor plugin, whatever language it is written in. The rest of the
//! crate is a safe layer for writing a plugin in Rust: implement [`Plugin`]
//! and export it with [`export_plugin!`]; the macro exports the entry symbol,
//! checks every pointer and struct size the host passes, and turns panics into
//! error objects so that none unwinds into the host.

pub mod abi;
mod args;
pub mod check;
mod device;
mod dtype;
mod error;
mod host;
mod plugin;
mod tensor;

#[doc(hidden)]
#[path = "export/mod.rs"]
pub mod __export;

pub use args::*;
pub use device::DeviceProps;
pub use dtype::DType;
pub use error::{Error, ErrorCode, Result};
pub use host::{Host, has_field};
pub use plugin::{CopyKind, Plugin, Queue};
pub use tensor::{Shape, Strides, TensorDesc, contiguous_strides};

//! The polychip plugin SDK.
//!
//! [`abi`] holds the `#[repr(C)]` types of the plugin ABI, from which
//! `include/polychip.h` is generated: the contract between the polychip host
//! and every vendor plugin, whatever language it is written in. The rest of the
//! crate is a safe layer for writing a plugin in Rust: implement [`Plugin`]
//! (devices, memory, streams) and [`Operators`], and export it with
//! [`export_plugin!`]; the macro exports the entry symbol,
//! checks every pointer and struct size the host passes, and turns panics into
//! error objects so that none unwinds into the host.
//!
//! Everything per operator (the ABI's args structs and op table, [`Op`],
//! the checked argument structs, [`Operators`], the export shims) is derived
//! from `spec/ops.toml` by `polychip-spec`, in the `generated.rs` files.

pub mod abi;
pub mod check;
mod device;
mod dtype;
mod error;
mod host;
mod ops;
mod plugin;
mod tensor;

#[doc(hidden)]
#[path = "export/mod.rs"]
pub mod __export;

pub use device::DeviceProps;
pub use dtype::DType;
pub use error::{Error, ErrorCode, Result};
pub use host::{Host, has_field};
pub use ops::*;
pub use plugin::{CopyKind, Plugin, Queue};
pub use tensor::{Shape, Strides, TensorDesc, contiguous_strides};

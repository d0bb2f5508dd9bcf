//! The polychip plugin ABI, version 1: every type that crosses the boundary
//! between the host and a vendor plugin, as `#[repr(C)]` Rust.
//!
//! This module is the single source of truth for the C header
//! `include/polychip.h`, which cbindgen generates from it (a test fails when
//! the committed header is stale). Rules every item here follows (see
//! `docs/abi.md`):
//!
//! - one exported entry symbol per ABI major, [`POLYCHIP_PLUGIN_INIT_V1_SYMBOL`];
//! - `struct_size` is the first field of every struct that crosses the
//!   boundary (except the DLPack-compatible tensor descriptor, which is always
//!   embedded in a sized struct); readers check `struct_size >=` the end of a
//!   field before reading it; structs only grow at the end;
//! - a fallible call returns a `PolychipError *`, NULL meaning success;
//!   out-params are written only on success;
//! - closed code sets are integer constants, never Rust enums, so an unknown
//!   value from a newer peer is representable;
//! - function-pointer fields are nullable (`Option<fn>`), so a missing one is
//!   detected instead of called.

mod device;
mod error;
mod ops;
mod tables;
mod tensor;

pub use device::*;
pub use error::*;
pub use ops::*;
pub use tables::*;
pub use tensor::*;

/// The ABI major version this header describes. A host refuses a plugin of
/// any other major.
pub const POLYCHIP_ABI_MAJOR: u32 = 1;
/// The ABI minor version this header describes. Minors only append: new
/// fields at the end of structs, new entries at the end of tables, new codes.
pub const POLYCHIP_ABI_MINOR: u32 = 4;
/// The oldest minor of major 1 that a host built from this header accepts.
pub const POLYCHIP_ABI_MIN_MINOR: u32 = 0;

/// The name of the entry symbol of ABI major 1, without a trailing NUL.
pub const POLYCHIP_PLUGIN_INIT_V1_SYMBOL: &str = "polychip_plugin_init_v1";

//! The host's unsafe boundary: loading plugin libraries, the host table and
//! its callbacks, error objects, and every call through a plugin's table.
//! Everything outside this module is safe Rust.

pub(crate) mod errors;
pub mod fpenv;
pub mod heap;
mod load;
mod plugin;
pub mod procstate;

pub use load::{LoadOptions, load_plugin};
pub(crate) use plugin::MemoryUsage;
pub use plugin::{OpSet, Plugin, RawEvent, RawStream};

/// The number of operators in the ABI this host speaks.
pub const OP_COUNT: usize = polychip_plugin_sdk::abi::POLYCHIP_OP_COUNT;

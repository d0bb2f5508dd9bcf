//! The host's unsafe boundary: loading plugin libraries, the host table and
//! its callbacks, error objects, and every call through a plugin's table.
//! Everything outside this module is safe Rust.

pub(crate) mod errors;
mod load;
mod plugin;

pub use load::{LoadOptions, load_plugin};
pub use plugin::{OpSet, Plugin, RawEvent, RawStream};

//! Cobalt, the polychip example plugin written in plain C11.
//!
//! The plugin itself is C (`src-c/`), written against `include/polychip.h`,
//! libc and libm only, and it models a slow, synchronous chip with a small
//! private memory whose bytes are stored encoded, so its memory is not
//! host-visible and every transfer must go through the plugin's copies. This
//! crate exists so that the workspace's ordinary `cargo build` compiles it:
//! the build script links the C into the shared library
//! `libpolychip_vendor_cobalt.so`, places it in the build script's `OUT_DIR`
//! and copies it next to the workspace's binaries (for example
//! `target/debug/`), where the `polychip` command finds it. The crate has no
//! Rust API beyond the path of that library.
//!
//! Runtime configuration: `POLYCHIP_COBALT_DEVICES` (number of devices,
//! 0 to 16, default 1) and `POLYCHIP_COBALT_MEMORY_MIB` (memory per device in
//! MiB, 1 to 65536, default 256).

#![forbid(unsafe_code)]

/// Absolute path of the Cobalt plugin (`libpolychip_vendor_cobalt.so`) built
/// for this crate, in the build script's `OUT_DIR`.
pub const LIBRARY_PATH: &str = env!("POLYCHIP_COBALT_LIBRARY");

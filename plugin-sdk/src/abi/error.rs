//! Errors cross the boundary as opaque objects created by the host.
//!
//! A plugin makes one with the host's `error_new` callback and returns it; the
//! host reads it and frees it. NULL means success. Codes form a closed set
//! that is never renumbered; a reader maps a code it does not know to
//! [`POLYCHIP_ERROR_INTERNAL`].

/// An error object. Opaque: created by the host's `error_new`, owned by
/// whoever holds the pointer, freed by the host's `error_destroy`.
#[derive(Debug)]
pub struct PolychipError {
    _private: [u8; 0],
}

/// A code from the closed set of `POLYCHIP_ERROR_*` constants.
pub type PolychipErrorCode = u32;

/// An argument is invalid: NULL where a pointer is required, a struct too
/// small, an index out of range.
pub const POLYCHIP_ERROR_INVALID_ARGUMENT: PolychipErrorCode = 1;
/// An allocation exceeds the device's remaining memory.
pub const POLYCHIP_ERROR_OUT_OF_MEMORY: PolychipErrorCode = 2;
/// The plugin does not implement this function for these arguments.
pub const POLYCHIP_ERROR_UNIMPLEMENTED: PolychipErrorCode = 3;
/// A bug or an unexpected state inside the plugin.
pub const POLYCHIP_ERROR_INTERNAL: PolychipErrorCode = 4;
/// The two sides' ABI versions are not compatible.
pub const POLYCHIP_ERROR_VERSION_MISMATCH: PolychipErrorCode = 5;
/// Tensor shapes do not fit the operation.
pub const POLYCHIP_ERROR_SHAPE_MISMATCH: PolychipErrorCode = 6;
/// A tensor's data type does not fit the operation or is not supported.
pub const POLYCHIP_ERROR_DTYPE_MISMATCH: PolychipErrorCode = 7;
/// The device failed and can no longer be used.
pub const POLYCHIP_ERROR_DEVICE_LOST: PolychipErrorCode = 8;
/// Code inside the plugin panicked (Rust) or threw (C++); the call was
/// abandoned. The plugin's state may be inconsistent.
pub const POLYCHIP_ERROR_PANIC: PolychipErrorCode = 9;

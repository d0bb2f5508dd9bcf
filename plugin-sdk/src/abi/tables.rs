//! The two function tables exchanged at load time, the opaque stream and
//! event handles, and the entry symbol's type.
//!
//! Loading a plugin: the host resolves the entry symbol
//! `polychip_plugin_init_v1`, calls it once with its [`PolychipHostApi`], and
//! receives the plugin's [`PolychipPluginApi`]. The plugin is never unloaded,
//! so every pointer in its table stays valid for the life of the process.

use std::ffi::{c_char, c_void};

use crate::abi::{PolychipDeviceProps, PolychipError, PolychipErrorCode, PolychipOpTable};

/// A plugin's stream: an in-order queue of work on one device. Opaque to the
/// host; created and destroyed by the plugin.
#[derive(Debug)]
pub struct PolychipStream {
    _private: [u8; 0],
}

/// A plugin's event: a marker recorded on a stream that other streams or the
/// host can wait for. Opaque to the host; created and destroyed by the plugin.
#[derive(Debug)]
pub struct PolychipEvent {
    _private: [u8; 0],
}

/// A log level for the host's `log` callback (the `log` crate's numbering).
pub type PolychipLogLevel = u32;
/// Something failed.
pub const POLYCHIP_LOG_ERROR: PolychipLogLevel = 1;
/// Something is suspicious.
pub const POLYCHIP_LOG_WARN: PolychipLogLevel = 2;
/// Useful information.
pub const POLYCHIP_LOG_INFO: PolychipLogLevel = 3;
/// Details for debugging.
pub const POLYCHIP_LOG_DEBUG: PolychipLogLevel = 4;
/// Very detailed tracing.
pub const POLYCHIP_LOG_TRACE: PolychipLogLevel = 5;

/// What the host gives a plugin at load time.
///
/// Lifetime: the table and the context it carries stay valid for the life of
/// the process; a plugin may keep the pointer. All callbacks are thread-safe.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipHostApi {
    /// Size of this struct as the host knows it.
    pub struct_size: usize,
    /// The host's ABI major (equal to `POLYCHIP_ABI_MAJOR` for `_v1`).
    pub abi_major: u32,
    /// The host's ABI minor. A plugin that needs host features from a later
    /// minor refuses to load with `POLYCHIP_ERROR_VERSION_MISMATCH`.
    pub abi_minor: u32,
    /// Opaque; passed back as `ctx` to every callback below.
    pub context: *mut c_void,
    /// Write a log record. `message` is UTF-8, `len` bytes, not necessarily
    /// NUL-terminated, borrowed for the call.
    pub log: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            level: PolychipLogLevel,
            message: *const c_char,
            len: usize,
        ),
    >,
    /// The most verbose `POLYCHIP_LOG_*` level the host records; a plugin may
    /// skip formatting records above it.
    pub log_level: PolychipLogLevel,
    /// Create an error object with a code and a UTF-8 message of `len` bytes
    /// (borrowed for the call). Never returns NULL: when memory runs out it
    /// returns a static out-of-memory error that `error_destroy` ignores.
    /// Ownership passes to the caller, who returns it to the host or destroys it.
    pub error_new: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            code: PolychipErrorCode,
            message: *const c_char,
            len: usize,
        ) -> *mut PolychipError,
    >,
    /// Destroy an error the plugin created but will not return. NULL is a no-op.
    pub error_destroy: Option<unsafe extern "C" fn(ctx: *mut c_void, error: *mut PolychipError)>,
}

/// What a plugin gives the host.
///
/// Lifetime: static (plugins are never unloaded). Every function is required
/// (non-NULL) unless marked optional. Unless stated otherwise, every function
/// is thread-safe; functions taking a stream may be called concurrently for
/// different streams, and must be serialized by the caller for one stream.
/// Out-params are written only on success. `stream` NULL means the device's
/// default stream, whose work completes before the call returns; the default
/// stream does not wait for work queued on other streams (synchronize them,
/// or wait for an event, first).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PolychipPluginApi {
    /// Size of this struct as the plugin knows it.
    pub struct_size: usize,
    /// The ABI major the plugin was built for.
    pub abi_major: u32,
    /// The ABI minor the plugin was built for.
    pub abi_minor: u32,
    /// The vendor's name, NUL-terminated, static: 1 to 64 ASCII letters,
    /// digits, `-`, `_` and `.`, starting with a letter or digit (it names
    /// the plugin's devices, `vendor:N`). The host refuses any other, and a
    /// second plugin whose name equals (ignoring case) one already loaded.
    pub vendor: *const c_char,
    /// The plugin's own version, NUL-terminated UTF-8, static; at most 256
    /// bytes.
    pub plugin_version: *const c_char,
    /// Number of devices this plugin drives (may be 0; the host refuses
    /// more than 4096).
    pub device_count: Option<unsafe extern "C" fn(out_count: *mut u32) -> *mut PolychipError>,
    /// Properties of device `device` (see [`PolychipDeviceProps`] for the
    /// `struct_size` protocol).
    pub device_props: Option<
        unsafe extern "C" fn(
            device: u32,
            out_props: *mut PolychipDeviceProps,
        ) -> *mut PolychipError,
    >,
    /// Allocate `bytes` of device memory, aligned to at least 64 bytes.
    /// More than the device has left is `POLYCHIP_ERROR_OUT_OF_MEMORY`. Zero
    /// bytes may return NULL. The allocation belongs to the caller until
    /// `mem_free`.
    pub mem_alloc: Option<
        unsafe extern "C" fn(
            device: u32,
            bytes: u64,
            out_ptr: *mut *mut c_void,
        ) -> *mut PolychipError,
    >,
    /// Free memory from `mem_alloc` on the same device, after all work using
    /// it has completed. NULL is a no-op.
    pub mem_free: Option<unsafe extern "C" fn(device: u32, ptr: *mut c_void) -> *mut PolychipError>,
    /// Create a stream on `device`.
    pub stream_create: Option<
        unsafe extern "C" fn(
            device: u32,
            out_stream: *mut *mut PolychipStream,
        ) -> *mut PolychipError,
    >,
    /// Wait for a stream's work, then destroy it. NULL is `INVALID_ARGUMENT`.
    pub stream_destroy:
        Option<unsafe extern "C" fn(stream: *mut PolychipStream) -> *mut PolychipError>,
    /// Block until all work enqueued on `stream` has completed. Errors from
    /// that work are reported here if not reported earlier. NULL (the
    /// default stream, which never has pending work) returns success.
    pub stream_synchronize:
        Option<unsafe extern "C" fn(stream: *mut PolychipStream) -> *mut PolychipError>,
    /// Create an event on `device`. A new event counts as completed.
    pub event_create: Option<
        unsafe extern "C" fn(device: u32, out_event: *mut *mut PolychipEvent) -> *mut PolychipError,
    >,
    /// Destroy an event. Pending waits on it still complete. NULL is
    /// `INVALID_ARGUMENT`.
    pub event_destroy:
        Option<unsafe extern "C" fn(event: *mut PolychipEvent) -> *mut PolychipError>,
    /// Record `event` at the current end of `stream` (NULL: default stream).
    pub event_record: Option<
        unsafe extern "C" fn(
            event: *mut PolychipEvent,
            stream: *mut PolychipStream,
        ) -> *mut PolychipError,
    >,
    /// Make later work on `stream` wait until `event` completes, without
    /// blocking the caller (NULL `stream`: the caller blocks, since the default
    /// stream runs work at once).
    pub stream_wait_event: Option<
        unsafe extern "C" fn(
            stream: *mut PolychipStream,
            event: *mut PolychipEvent,
        ) -> *mut PolychipError,
    >,
    /// Block the caller until `event` completes.
    pub event_synchronize:
        Option<unsafe extern "C" fn(event: *mut PolychipEvent) -> *mut PolychipError>,
    /// Copy `bytes` from host memory `src` to device address `dst`,
    /// asynchronously on `stream`: `src` must stay valid and unchanged until the
    /// stream reaches the copy.
    pub memcpy_h2d: Option<
        unsafe extern "C" fn(
            device: u32,
            stream: *mut PolychipStream,
            dst: *mut c_void,
            src: *const c_void,
            bytes: u64,
        ) -> *mut PolychipError,
    >,
    /// Copy `bytes` from device address `src` to host memory `dst`,
    /// asynchronously on `stream`: `dst` must stay valid until the stream
    /// reaches the copy.
    pub memcpy_d2h: Option<
        unsafe extern "C" fn(
            device: u32,
            stream: *mut PolychipStream,
            dst: *mut c_void,
            src: *const c_void,
            bytes: u64,
        ) -> *mut PolychipError,
    >,
    /// Copy `bytes` between two device addresses of the same device,
    /// asynchronously on `stream`. The ranges must not overlap.
    pub memcpy_d2d: Option<
        unsafe extern "C" fn(
            device: u32,
            stream: *mut PolychipStream,
            dst: *mut c_void,
            src: *const c_void,
            bytes: u64,
        ) -> *mut PolychipError,
    >,
    /// The operator table, static. Required; entries may be NULL.
    pub ops: *const PolychipOpTable,
}

/// The type of the entry symbol `polychip_plugin_init_v1`.
///
/// Called once per process, from one thread. `host` is valid for the life of
/// the process. On success the plugin writes a pointer to its static table to
/// `*out_plugin` and returns NULL; on failure it returns an error made with
/// `host->error_new` and leaves `*out_plugin` untouched. When it cannot make
/// an error (`host` or `out_plugin` NULL, or the host table too small to hold
/// `error_new`), it returns NULL without writing `*out_plugin`: a host sets
/// `*out_plugin = NULL` before the call and treats "no error and still NULL"
/// as a failure.
pub type PolychipPluginInitV1 = unsafe extern "C" fn(
    host: *const PolychipHostApi,
    out_plugin: *mut *const PolychipPluginApi,
) -> *mut PolychipError;

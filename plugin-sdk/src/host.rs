//! The host as a Rust plugin sees it: logging and error objects, through
//! the callbacks in the host's [`PolychipHostApi`].

use std::ffi::c_char;
use std::mem::{offset_of, size_of};

use crate::abi::{PolychipError, PolychipHostApi, PolychipLogLevel};
use crate::error::Error;

/// The host's table, copied at load time. Only fields that the host's
/// `struct_size` covers are kept; the rest read as absent.
#[derive(Debug)]
pub struct Host {
    api: PolychipHostApi,
}

// SAFETY: the ABI states that the host's table and context live for the whole
// process and that every host callback is thread-safe.
unsafe impl Send for Host {}
// SAFETY: as above.
unsafe impl Sync for Host {}

/// Whether a struct whose writer reported `struct_size` contains the field
/// that starts at `offset` and is `size` bytes long.
pub const fn has_field(struct_size: usize, offset: usize, size: usize) -> bool {
    struct_size >= offset + size
}

impl Host {
    /// Copies the host's table, keeping only the fields `struct_size` covers.
    ///
    /// # Safety
    /// `api` points to a readable table of at least `api.struct_size` bytes
    /// (and at least `size_of::<usize>()`).
    pub(crate) unsafe fn from_raw(api: *const PolychipHostApi) -> Host {
        // SAFETY: the caller guarantees the first field is readable.
        let reported = unsafe { std::ptr::addr_of!((*api).struct_size).read() };
        let mut copy = std::mem::MaybeUninit::<PolychipHostApi>::zeroed();
        let n = reported.min(size_of::<PolychipHostApi>());
        // SAFETY: both sides have at least `n` bytes; an all-zero
        // PolychipHostApi is valid (NULL pointers, `None` callbacks, zeros).
        let api = unsafe {
            std::ptr::copy_nonoverlapping(api.cast::<u8>(), copy.as_mut_ptr().cast::<u8>(), n);
            copy.assume_init()
        };
        Host { api }
    }

    /// The host's ABI major.
    pub fn abi_major(&self) -> u32 {
        self.api.abi_major
    }

    /// The host's ABI minor.
    pub fn abi_minor(&self) -> u32 {
        self.api.abi_minor
    }

    /// The host table's reported size.
    pub fn struct_size(&self) -> usize {
        self.api.struct_size
    }

    /// Whether the host table is large enough to create error objects.
    pub fn can_make_errors(&self) -> bool {
        has_field(
            self.api.struct_size,
            offset_of!(PolychipHostApi, error_destroy),
            size_of::<usize>(),
        ) && self.api.error_new.is_some()
    }

    /// The most verbose level the host records.
    pub fn log_level(&self) -> log::LevelFilter {
        match self.api.log_level {
            0 => log::LevelFilter::Off,
            1 => log::LevelFilter::Error,
            2 => log::LevelFilter::Warn,
            3 => log::LevelFilter::Info,
            4 => log::LevelFilter::Debug,
            _ => log::LevelFilter::Trace,
        }
    }

    /// Sends a log record to the host.
    pub fn log(&self, level: log::Level, message: &str) {
        if let Some(log) = self.api.log {
            // SAFETY: the callback is thread-safe and borrows `message` for the call only.
            unsafe {
                log(
                    self.api.context,
                    level as PolychipLogLevel,
                    message.as_ptr().cast::<c_char>(),
                    message.len(),
                )
            };
        }
    }

    /// Makes an ABI error object from `error`; NULL if the host cannot make
    /// errors (then the caller has no way to report one).
    pub(crate) fn make_error(&self, error: &Error) -> *mut PolychipError {
        match self.api.error_new {
            // SAFETY: the callback is thread-safe and borrows the message for the call only.
            Some(new) if self.can_make_errors() => unsafe {
                new(
                    self.api.context,
                    error.code.to_raw(),
                    error.message.as_ptr().cast::<c_char>(),
                    error.message.len(),
                )
            },
            _ => std::ptr::null_mut(),
        }
    }
}

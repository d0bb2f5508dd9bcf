//! The host's error type: every failure names the plugin file or vendor,
//! the function or operator, and the cause.

use std::path::PathBuf;

use polychip_plugin_sdk::check::ArgError;
use polychip_plugin_sdk::{DType, ErrorCode};

/// Why a plugin could not be loaded, or a call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HostError {
    /// The file could not be opened as a shared library.
    #[error(
        "{}: not a loadable shared library: {reason}",
        polychip_files::shown_path(path)
    )]
    NotALibrary {
        /// The plugin file.
        path: PathBuf,
        /// The dynamic loader's message.
        reason: String,
    },
    /// Loading the plugin in a child process killed that process (a crash in
    /// its initialisers or its entry function, or a truncated file).
    #[error(
        "{}: the plugin crashed while loading ({reason}); polychip goes on without it",
        polychip_files::shown_path(path)
    )]
    LoadCrashed {
        /// The plugin file.
        path: PathBuf,
        /// How the child process ended, e.g. `signal 11, SIGSEGV`.
        reason: String,
    },
    /// Loading the plugin in a child process did not finish within the deadline.
    #[error(
        "{}: the plugin did not finish loading within {seconds} s (its initialisers or its entry function hang; POLYCHIP_PLUGIN_LOAD_TIMEOUT_SECS sets the deadline); polychip goes on without it",
        polychip_files::shown_path(path)
    )]
    LoadTimedOut {
        /// The plugin file.
        path: PathBuf,
        /// The deadline, in seconds.
        seconds: f64,
    },
    /// The library has no polychip entry symbol at all.
    #[error(
        "{}: no entry symbol polychip_plugin_init_v1; this is not a polychip plugin (or it hides its entry symbol)",
        polychip_files::shown_path(path)
    )]
    NoEntrySymbol {
        /// The plugin file.
        path: PathBuf,
    },
    /// The plugin speaks an ABI version this host does not accept.
    #[error(
        "{}: plugin ABI {plugin_major}.{plugin_minor} is not compatible with this host's ABI {host_major}.{host_minor} (accepts {host_major}.{min_minor} and newer minors of major {host_major})",
        polychip_files::shown_path(path)
    )]
    VersionMismatch {
        /// The plugin file.
        path: PathBuf,
        /// The plugin's major.
        plugin_major: u32,
        /// The plugin's minor (0 when unknown).
        plugin_minor: u32,
        /// This host's major.
        host_major: u32,
        /// This host's minor.
        host_minor: u32,
        /// The oldest minor this host accepts.
        min_minor: u32,
    },
    /// The plugin's entry function reported an error.
    #[error(
        "{}: initialisation failed ({code}): {message}",
        polychip_files::shown_path(path)
    )]
    InitFailed {
        /// The plugin file.
        path: PathBuf,
        /// The error's code.
        code: ErrorCode,
        /// The plugin's message.
        message: String,
    },
    /// A struct the plugin returned is smaller than the ABI requires.
    #[error(
        "{}: {structure}.struct_size is {size} bytes but ABI 1.0 requires at least {required}",
        polychip_files::shown_path(path)
    )]
    StructTooSmall {
        /// The plugin file.
        path: PathBuf,
        /// Which struct.
        structure: &'static str,
        /// Its reported size.
        size: usize,
        /// The minimum.
        required: usize,
    },
    /// The plugin's table lacks a function every plugin must provide.
    #[error(
        "{}: required function {function} is NULL in the plugin table",
        polychip_files::shown_path(path)
    )]
    MissingFunction {
        /// The plugin file.
        path: PathBuf,
        /// The function's field name.
        function: &'static str,
    },
    /// The plugin broke the ABI contract in a way the host detected.
    #[error("{plugin}: {function}: broke the ABI contract: {what}")]
    Contract {
        /// The plugin's vendor or file.
        plugin: String,
        /// The function.
        function: &'static str,
        /// What happened.
        what: String,
    },
    /// A plugin function returned an error object.
    #[error("{plugin}: {function} failed ({code}): {message}")]
    Plugin {
        /// The plugin's vendor.
        plugin: String,
        /// The function or operator.
        function: &'static str,
        /// The error's code.
        code: ErrorCode,
        /// The plugin's message.
        message: String,
    },
    /// The plugin's op table has no entry for this operator.
    #[error("{plugin}: operator {op} is not implemented (its op-table entry is NULL)")]
    OpUnimplemented {
        /// The plugin's vendor.
        plugin: String,
        /// The operator.
        op: &'static str,
    },
    /// The operator took on this dtype in a later ABI minor than the
    /// plugin's (ABI 1.3's integer `add`, `sub` and `mul` on a 1.2
    /// plugin): the host does not pass it, and counts the call as not
    /// implemented.
    #[error(
        "{plugin}: operator {op} takes {dtype} since ABI {}.{}, and this plugin speaks ABI {}.{} \
         (not implemented for this dtype)",
        since.0, since.1, abi.0, abi.1
    )]
    DtypeUnimplemented {
        /// The plugin's vendor.
        plugin: String,
        /// The operator.
        op: &'static str,
        /// The dtype.
        dtype: DType,
        /// The ABI version that added the dtype to the operator.
        since: (u32, u32),
        /// The plugin's ABI version.
        abi: (u32, u32),
    },
    /// The host refused an operator's arguments before calling the plugin.
    #[error("{plugin}: {source}")]
    InvalidArguments {
        /// The plugin's vendor.
        plugin: String,
        /// What is wrong.
        source: ArgError,
    },
    /// A second plugin of a vendor already loaded from another file: device
    /// ids are `vendor:N`, so the two could not be told apart.
    #[error(
        "{}: its vendor name {vendor:?} is already taken by {other}, loaded before it (devices are named vendor:N, so two plugins cannot share one); polychip goes on without it",
        polychip_files::shown_path(path)
    )]
    VendorTaken {
        /// The plugin file refused.
        path: PathBuf,
        /// Its vendor name.
        vendor: String,
        /// The file whose plugin has that vendor name.
        other: PathBuf,
    },
    /// A host-side misuse: wrong device, wrong buffer size, bad index.
    #[error("{0}")]
    Usage(String),
}

impl HostError {
    /// The same error with the plugin named by `label` (at load time, the
    /// file and vendor rather than the vendor alone).
    pub(crate) fn with_plugin_label(self, label: String) -> HostError {
        match self {
            HostError::Contract { function, what, .. } => HostError::Contract {
                plugin: label,
                function,
                what,
            },
            HostError::Plugin {
                function,
                code,
                message,
                ..
            } => HostError::Plugin {
                plugin: label,
                function,
                code,
                message,
            },
            other => other,
        }
    }

    /// The ABI error code closest to this error, for callers that branch on it.
    pub fn code(&self) -> ErrorCode {
        match self {
            HostError::Plugin { code, .. } | HostError::InitFailed { code, .. } => *code,
            HostError::VersionMismatch { .. } => ErrorCode::VersionMismatch,
            HostError::OpUnimplemented { .. } | HostError::DtypeUnimplemented { .. } => {
                ErrorCode::Unimplemented
            }
            HostError::InvalidArguments { source, .. } => source.code(),
            HostError::Usage(_) => ErrorCode::InvalidArgument,
            HostError::NotALibrary { .. }
            | HostError::LoadCrashed { .. }
            | HostError::LoadTimedOut { .. }
            | HostError::NoEntrySymbol { .. }
            | HostError::StructTooSmall { .. }
            | HostError::MissingFunction { .. }
            | HostError::VendorTaken { .. }
            | HostError::Contract { .. } => ErrorCode::Internal,
        }
    }
}

/// The host's result type.
pub type Result<T, E = HostError> = std::result::Result<T, E>;

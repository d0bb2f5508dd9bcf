//! Opening a plugin library, calling its entry symbol, and checking what it
//! returns: versions, struct sizes, required functions.
//!
//! Libraries are opened with `RTLD_NOW | RTLD_LOCAL` (so one vendor's symbols
//! never satisfy another's, and a missing symbol fails at load, not at first
//! call) and never unloaded. Each file is initialised once per process;
//! loading it again, under any name (a symlink, a hard link), returns the
//! same [`Plugin`]. A path that does not resolve to a regular file (a FIFO,
//! a directory, `/dev/zero`) is refused before `dlopen` sees it.
//!
//! Loading in-process trusts the plugin: a crash in its initialisers or
//! entry function ends the process, and a hang hangs it. Callers that must
//! survive that (the `polychip` command) first load each file in a child
//! process with [`crate::probe`].

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::mem::{offset_of, size_of};
use std::path::Path;
use std::sync::{Arc, Mutex};

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use polychip_plugin_sdk::Op;
use polychip_plugin_sdk::abi::{
    POLYCHIP_ABI_MAJOR, POLYCHIP_ABI_MIN_MINOR, POLYCHIP_ABI_MINOR, POLYCHIP_PLUGIN_INIT_V1_SYMBOL,
    PolychipHostApi, PolychipLogLevel, PolychipOpTable, PolychipPluginApi, PolychipPluginInitV1,
};

use crate::discovery::{self, FileId};
use crate::error::{HostError, Result};
use crate::ffi::errors;
use crate::ffi::fpenv::FpEnv;
use crate::ffi::plugin::Plugin;
use crate::ffi::procstate::{self, ProcStateChange};

/// How to load plugins.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The oldest ABI minor accepted; defaults to `POLYCHIP_ABI_MIN_MINOR`.
    pub min_minor: u32,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            min_minor: POLYCHIP_ABI_MIN_MINOR,
        }
    }
}

/// What the host's log callback knows about the plugin it serves.
struct LogContext {
    label: String,
}

unsafe extern "C" fn log_callback(
    ctx: *mut c_void,
    level: PolychipLogLevel,
    message: *const c_char,
    len: usize,
) {
    // SAFETY: `ctx` is the leaked LogContext this host table was built with.
    let label = unsafe { &(*ctx.cast::<LogContext>()).label };
    // SAFETY: the ABI says `message` has `len` readable bytes for the call.
    // At most 64 KiB of it, its control characters escaped: the record goes
    // to a terminal or a log file (until 2026-12-06 a plugin's terminal
    // escapes reached stderr as they were, and a record of any length was
    // copied whole).
    let message = printable_keeping_lines(&unsafe { errors::bounded_message(message, len) });
    let level = match level {
        0 | 1 => log::Level::Error,
        2 => log::Level::Warn,
        3 => log::Level::Info,
        4 => log::Level::Debug,
        _ => log::Level::Trace,
    };
    log::log!(target: "polychip::plugin", level, "{label}: {message}");
}

fn host_table(label: String) -> &'static PolychipHostApi {
    let context = Box::into_raw(Box::new(LogContext { label })).cast::<c_void>();
    let log_level = match log::max_level() {
        log::LevelFilter::Off => 0,
        level => level as PolychipLogLevel,
    };
    Box::leak(Box::new(PolychipHostApi {
        struct_size: size_of::<PolychipHostApi>(),
        abi_major: POLYCHIP_ABI_MAJOR,
        abi_minor: POLYCHIP_ABI_MINOR,
        context,
        log: Some(log_callback),
        log_level,
        error_new: Some(errors::error_new),
        error_destroy: Some(errors::error_destroy),
    }))
}

static LOADED: Mutex<Option<HashMap<FileId, Arc<Plugin>>>> = Mutex::new(None);

/// Loads the plugin at `path` (or returns it if this process loaded that
/// file already, under this name or another) and checks it against `options`.
pub fn load_plugin(path: &Path, options: &LoadOptions) -> Result<Arc<Plugin>> {
    let key = discovery::plugin_file_id(path).map_err(|reason| HostError::NotALibrary {
        path: path.to_path_buf(),
        reason,
    })?;
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    let cache = loaded.get_or_insert_with(HashMap::new);
    let plugin = match cache.get(&key) {
        Some(p) => p.clone(),
        None => {
            let p = Arc::new(open(path)?);
            cache.insert(key, p.clone());
            p
        }
    };
    let (major, minor) = plugin.abi_version();
    if minor < options.min_minor {
        return Err(version_mismatch(path, major, minor, options.min_minor));
    }
    Ok(plugin)
}

fn version_mismatch(
    path: &Path,
    plugin_major: u32,
    plugin_minor: u32,
    min_minor: u32,
) -> HostError {
    HostError::VersionMismatch {
        path: path.to_path_buf(),
        plugin_major,
        plugin_minor,
        host_major: POLYCHIP_ABI_MAJOR,
        host_minor: POLYCHIP_ABI_MINOR,
        min_minor,
    }
}

/// [`open_checked`], with the process state it does not own read before
/// and after (ABI rule 13, [`crate::ffi::procstate`]): a change is put back
/// where the host may, and recorded on the plugin as a load finding.
fn open(path: &Path) -> Result<Plugin> {
    let (result, changes) = procstate::around(|| open_checked(path));
    if !changes.is_empty() {
        let plugin = match &result {
            Ok(p) => p.vendor().to_string(),
            Err(_) => polychip_files::shown_path(path),
        };
        let during = "loading (its initialisers, entry and device queries)";
        for change in ProcStateChange::split(&plugin, during, changes) {
            match &result {
                Ok(p) => p.note_load_finding(change.to_string(), change.forbidden),
                Err(_) => log::warn!("{change}"),
            }
        }
    }
    result
}

fn open_checked(path: &Path) -> Result<Plugin> {
    let path_buf = path.to_path_buf();
    discovery::warn_if_writable_by_others(path);
    // dlopen searches the library path for a name without a slash; a plugin
    // path always means that file.
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path_buf.clone());
    // A library's initialisers may change the floating-point environment
    // (one built with `-ffast-math` by an older GCC turns on FTZ/DAZ): put
    // back once the entry has run, and reported once the plugin has a name.
    let fp_before = FpEnv::current();
    // SAFETY: loading a library runs its initialisers. Plugins are trusted code
    // by design (like any driver); RTLD_LOCAL keeps their symbols apart.
    let library =
        unsafe { Library::open(Some(&absolute), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| {
            // dlerror's text repeats the path: shown as the message's own
            // path is (escaped, cut), not raw.
            let raw = absolute.display().to_string();
            HostError::NotALibrary {
                path: path_buf.clone(),
                reason: error_chain(&e).replace(&raw, &polychip_files::shown_path(&absolute)),
            }
        })?;
    let library: &'static Library = Box::leak(Box::new(library));
    // SAFETY: the symbol, if present, has the entry type the ABI defines.
    let entry = match unsafe {
        library.get::<PolychipPluginInitV1>(POLYCHIP_PLUGIN_INIT_V1_SYMBOL.as_bytes())
    } {
        Ok(symbol) => *symbol,
        Err(_) => {
            fp_before.restore();
            return Err(missing_entry(library, path));
        }
    };
    let label = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let host = host_table(label);
    let mut out: *const PolychipPluginApi = std::ptr::null();
    // SAFETY: `host` is a complete, immortal host table and `out` is writable;
    // this is the entry contract.
    let error = unsafe { entry(host, &mut out) };
    let fp_after = FpEnv::current();
    if fp_after != fp_before {
        fp_before.restore();
    }
    match errors::take(error) {
        Ok(None) => {}
        Ok(Some((code, message))) => {
            // Escaped as the plugin's other words are: every command prints
            // it (`polychip devices` did so as it was until 2026-12-06).
            return Err(HostError::InitFailed {
                path: path_buf,
                code,
                message: printable_keeping_lines(&message),
            });
        }
        Err(misuse) => {
            return Err(HostError::Contract {
                plugin: path.display().to_string(),
                function: "polychip_plugin_init_v1",
                what: misuse.what().into(),
            });
        }
    }
    if out.is_null() {
        return Err(HostError::Contract {
            plugin: path.display().to_string(),
            function: "polychip_plugin_init_v1",
            what: "returned success but did not write its plugin table".into(),
        });
    }
    // SAFETY: the plugin wrote a pointer to its static table, which starts
    // with struct_size, abi_major and abi_minor in every major.
    let api = unsafe { read_plugin_table(path, out)? };
    // SAFETY: a non-NULL ops pointer addresses a static table starting with struct_size.
    let ops = unsafe { read_op_table(path, api.ops, api.abi_minor)? };
    // SAFETY: the vendor and version strings are static NUL-terminated strings per the ABI.
    let (vendor, version) = unsafe {
        (
            read_str(path, "vendor", api.vendor)?,
            read_str(path, "plugin_version", api.plugin_version)?,
        )
    };
    check_vendor(path, &vendor)?;
    if version.len() > MAX_VERSION_BYTES {
        return Err(HostError::Contract {
            plugin: path.display().to_string(),
            function: "polychip_plugin_init_v1",
            what: format!(
                "the plugin table's plugin_version is {} bytes long; the host accepts at most \
                 {MAX_VERSION_BYTES}",
                version.len()
            ),
        });
    }
    let version = printable(&version);
    let label = format!("{} ({vendor})", path.display());
    let plugin =
        Plugin::new(path_buf, vendor, version, api, ops).map_err(|e| e.with_plugin_label(label))?;
    if fp_after != fp_before {
        plugin.note_fp_env_change("loading (its initialisers and entry)", fp_before, fp_after);
    }
    Ok(plugin)
}

/// An error's message followed by its sources' (libloading puts the dynamic
/// loader's own words in the source).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn missing_entry(library: &Library, path: &Path) -> HostError {
    for major in 2..=9u32 {
        let name = format!("polychip_plugin_init_v{major}");
        // SAFETY: only the symbol's presence is checked; it is never called.
        if unsafe { library.get::<*const c_void>(name.as_bytes()) }.is_ok() {
            return version_mismatch(path, major, 0, POLYCHIP_ABI_MIN_MINOR);
        }
    }
    HostError::NoEntrySymbol {
        path: path.to_path_buf(),
    }
}

/// # Safety
/// `ptr` addresses a readable plugin table of at least its own `struct_size`.
unsafe fn read_plugin_table(
    path: &Path,
    ptr: *const PolychipPluginApi,
) -> Result<PolychipPluginApi> {
    let too_small = |size: usize, required: usize| HostError::StructTooSmall {
        path: path.to_path_buf(),
        structure: "PolychipPluginApi",
        size,
        required,
    };
    // SAFETY: struct_size is the first field of every plugin table.
    let size = unsafe { ptr.cast::<usize>().read() };
    let version_end = offset_of!(PolychipPluginApi, abi_minor) + size_of::<u32>();
    if size < version_end {
        return Err(too_small(size, size_of::<PolychipPluginApi>()));
    }
    // SAFETY: the table is at least `version_end` bytes, which covers both versions.
    let (major, minor) = unsafe { ((*ptr).abi_major, (*ptr).abi_minor) };
    if major != POLYCHIP_ABI_MAJOR {
        return Err(version_mismatch(path, major, minor, POLYCHIP_ABI_MIN_MINOR));
    }
    if size < size_of::<PolychipPluginApi>() {
        return Err(too_small(size, size_of::<PolychipPluginApi>()));
    }
    // SAFETY: the table holds every 1.0 field; a newer minor only appends.
    let api = unsafe { *ptr };
    let required = [
        ("device_count", api.device_count.is_some()),
        ("device_props", api.device_props.is_some()),
        ("mem_alloc", api.mem_alloc.is_some()),
        ("mem_free", api.mem_free.is_some()),
        ("stream_create", api.stream_create.is_some()),
        ("stream_destroy", api.stream_destroy.is_some()),
        ("stream_synchronize", api.stream_synchronize.is_some()),
        ("event_create", api.event_create.is_some()),
        ("event_destroy", api.event_destroy.is_some()),
        ("event_record", api.event_record.is_some()),
        ("stream_wait_event", api.stream_wait_event.is_some()),
        ("event_synchronize", api.event_synchronize.is_some()),
        ("memcpy_h2d", api.memcpy_h2d.is_some()),
        ("memcpy_d2h", api.memcpy_d2h.is_some()),
        ("memcpy_d2d", api.memcpy_d2d.is_some()),
        ("ops", !api.ops.is_null()),
    ];
    if let Some((function, _)) = required.iter().find(|(_, present)| !present) {
        return Err(HostError::MissingFunction {
            path: path.to_path_buf(),
            function,
        });
    }
    Ok(api)
}

/// The bytes of the op table that ABI `1.minor` defines: through the last
/// entry of an operator that minor (or an earlier one) introduced. The
/// table only grows at the end, so that is a prefix.
fn op_table_end(minor: u32) -> usize {
    Op::ALL
        .into_iter()
        .map(Op::info)
        .filter(|info| info.since <= (POLYCHIP_ABI_MAJOR, minor))
        .map(|info| info.table_offset + size_of::<Option<unsafe extern "C" fn()>>())
        .max()
        .unwrap_or(size_of::<usize>())
}

/// Reads the op table of a plugin of ABI `1.minor`. Entries past the
/// table's `struct_size` read as NULL ("not implemented"), and so do the
/// entries of operators newer than `minor`, whatever the table holds there:
/// a plugin of an older minor cannot have meant an operator it never saw
/// (a table padded or reused from a newer header's layout), so the host
/// treats that slot as absent, falls back where the caller allows it, and
/// never calls into it.
///
/// # Safety
/// `ptr` is non-NULL and addresses a readable op table of at least its own `struct_size`.
unsafe fn read_op_table(
    path: &Path,
    ptr: *const PolychipOpTable,
    minor: u32,
) -> Result<PolychipOpTable> {
    // SAFETY: struct_size is the first field.
    let size = unsafe { ptr.cast::<usize>().read() };
    if size < size_of::<usize>() {
        return Err(HostError::StructTooSmall {
            path: path.to_path_buf(),
            structure: "PolychipOpTable",
            size,
            required: size_of::<usize>(),
        });
    }
    let mut table = std::mem::MaybeUninit::<PolychipOpTable>::zeroed();
    let n = size
        .min(size_of::<PolychipOpTable>())
        .min(op_table_end(minor));
    // SAFETY: the plugin's table has `size >= n` readable bytes; an all-zero
    // table is valid (every entry None), so entries a shorter (older) table
    // lacks, or its minor does not define, read as "not implemented".
    Ok(unsafe {
        std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), table.as_mut_ptr().cast::<u8>(), n);
        table.assume_init()
    })
}

/// The longest vendor name the host accepts, bytes.
pub const MAX_VENDOR_BYTES: usize = 64;
/// The longest plugin version the host accepts, bytes.
pub const MAX_VERSION_BYTES: usize = 256;

/// A vendor name names the plugin's devices (`vendor:N`), on command lines
/// and in lists (`--devices a:0,b:0`, `--stages "a:0 0..8 | b:0 8..16"`):
/// 1 to [`MAX_VENDOR_BYTES`] ASCII letters, digits, `-`, `_` and `.`,
/// starting with a letter or digit. Anything else is refused, naming what.
fn check_vendor(path: &Path, vendor: &str) -> Result<()> {
    let what = if vendor.is_empty() {
        Some("is empty".to_string())
    } else if vendor.len() > MAX_VENDOR_BYTES {
        Some(format!(
            "is {} bytes long; the host accepts at most {MAX_VENDOR_BYTES}",
            vendor.len()
        ))
    } else if let Some(c) = vendor
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        Some(format!(
            "\"{}\" holds {:?}; a vendor name is ASCII letters, digits, '-', '_' and '.' (it names \
             the devices, vendor:N)",
            printable(vendor),
            c
        ))
    } else if !vendor.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        Some(format!("{vendor:?} does not start with a letter or digit"))
    } else {
        None
    };
    match what {
        Some(what) => Err(HostError::Contract {
            plugin: path.display().to_string(),
            function: "polychip_plugin_init_v1",
            what: format!("the plugin table's vendor {what}"),
        }),
        None => Ok(()),
    }
}

/// `text` with its control characters escaped (`\u{1b}`, `\n`), and its
/// bidirectional-formatting characters (`\u{202e}`, which reorders the rest
/// of a line on a terminal: they were kept until 2026-12-06, where every
/// word from a file was escaped), as a plugin's strings are printed to
/// terminals and logs.
pub(crate) fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                polychip_files::printable(c.encode_utf8(&mut [0; 4]))
            }
        })
        .collect()
}

/// `text` as [`printable`] writes it, but its line breaks kept: a message
/// or a record of several lines (a plugin listing what it knows, one a
/// line) stays readable.
pub(crate) fn printable_keeping_lines(text: &str) -> String {
    text.split('\n')
        .map(printable)
        .collect::<Vec<_>>()
        .join("\n")
}

/// # Safety
/// `ptr` is NULL or a NUL-terminated string valid for the process.
unsafe fn read_str(path: &Path, field: &'static str, ptr: *const c_char) -> Result<String> {
    if ptr.is_null() {
        return Err(HostError::Contract {
            plugin: path.display().to_string(),
            function: "polychip_plugin_init_v1",
            what: format!("the plugin table's {field} is NULL"),
        });
    }
    // SAFETY: guaranteed by the caller.
    Ok(unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned())
}

//! The runtime: the plugins a framework loads and every device they drive,
//! the API version handshake, the log callback, and device properties.

use std::ffi::{CStr, CString, c_char, c_void};
use std::path::PathBuf;

use polychip_host::{LoadOptions, Runtime, discovery};

use crate::error::{
    ApiError, ApiResult, POLYCHIP_API_ERROR_VERSION_MISMATCH, guard, polychip_error_t, quiet,
};
use crate::handle::{Handle, Registry};
use crate::{POLYCHIP_API_MAJOR, POLYCHIP_API_MINOR, out_param, struct_prefix};

/// A runtime: loaded plugins and their devices. Opaque.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct polychip_runtime_t {
    _private: [u8; 0],
}

/// A log record's level (the `log` crate's numbering, as in the plugin ABI).
pub type polychip_log_level_t = u32;
/// No records.
pub const POLYCHIP_API_LOG_OFF: polychip_log_level_t = 0;
/// Something failed.
pub const POLYCHIP_API_LOG_ERROR: polychip_log_level_t = 1;
/// Something is suspicious (a plugin that did not load, ...).
pub const POLYCHIP_API_LOG_WARN: polychip_log_level_t = 2;
/// Useful information.
pub const POLYCHIP_API_LOG_INFO: polychip_log_level_t = 3;
/// Details for debugging.
pub const POLYCHIP_API_LOG_DEBUG: polychip_log_level_t = 4;
/// Very detailed tracing.
pub const POLYCHIP_API_LOG_TRACE: polychip_log_level_t = 5;

/// Receives a log record: `message` is UTF-8, `len` bytes, not
/// NUL-terminated, borrowed for the call. Called from any thread that logs,
/// possibly several at once.
pub type polychip_log_fn = Option<
    unsafe extern "C" fn(
        context: *mut c_void,
        level: polychip_log_level_t,
        message: *const c_char,
        len: usize,
    ),
>;

/// How to make a runtime. Set `struct_size = sizeof(polychip_runtime_options_t)`
/// and call `polychip_runtime_options_init`, then change what you need.
/// Fields beyond `struct_size` take their defaults.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct polychip_runtime_options_t {
    /// Size of this struct as the caller knows it.
    pub struct_size: usize,
    /// `POLYCHIP_API_MAJOR` of the header the caller was built with; the
    /// library refuses another major.
    pub api_major: u32,
    /// `POLYCHIP_API_MINOR` of that header; the library refuses a newer minor
    /// than its own (the caller could use functions it lacks).
    pub api_minor: u32,
    /// A `:`-separated list of plugin files and directories (every `.so` in
    /// a directory), UTF-8, borrowed for the call. NULL: the
    /// `POLYCHIP_PLUGIN_PATH` environment variable. Default NULL.
    pub plugin_path: *const c_char,
    /// Also load the bundled plugins (`libpolychip_vendor_*.so`) found beside
    /// libpolychip or in its `polychip` folder (an installed prefix), and
    /// beside the running program. Default true.
    pub bundled: bool,
    /// A plugin that fails to load fails `polychip_runtime_new` (the error
    /// lists every failure). Default false: failures are listed by
    /// `polychip_runtime_failure` and the other plugins work.
    pub strict: bool,
    /// Where log records go (process-wide: the latest runtime made with a
    /// callback sets it; with the last runtime destroyed, records are
    /// dropped again). A record made inside a C API call reaches `log` on
    /// that thread just before the call returns, when libpolychip holds no
    /// lock (so `log` may call the C API); one its own calls make is
    /// dropped. Default NULL: records are dropped.
    pub log: polychip_log_fn,
    /// Passed back to `log`; must stay valid while any runtime lives, and
    /// is not used after.
    pub log_context: *mut c_void,
    /// The most detailed level passed to `log`. Default `POLYCHIP_API_LOG_WARN`.
    pub log_level: polychip_log_level_t,
}

/// Properties of one device. Strings are UTF-8, NUL-terminated, owned by
/// the runtime and valid until it is destroyed.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct polychip_device_info_t {
    /// Size of this struct as the caller knows it; the library writes only
    /// the fields that fit.
    pub struct_size: usize,
    /// The plugin's vendor name.
    pub vendor: *const c_char,
    /// The device's name.
    pub name: *const c_char,
    /// The plugin file it was loaded from.
    pub plugin_path: *const c_char,
    /// The plugin's own version.
    pub plugin_version: *const c_char,
    /// The device's index within its plugin (the `device_id` of its DLPack
    /// tensors).
    pub plugin_device: u32,
    /// The plugin ABI major the plugin was built for.
    pub abi_major: u32,
    /// The plugin ABI minor the plugin was built for.
    pub abi_minor: u32,
    /// Operators the plugin implements.
    pub ops_implemented: u32,
    /// Operators in the op table of this host.
    pub ops_total: u32,
    /// Device memory capacity in bytes.
    pub memory_bytes: u64,
    /// Device memory is directly readable and writable by the host CPU.
    pub host_visible: bool,
    /// Device memory can be registered for RDMA.
    pub rdma_exportable: bool,
    /// Compute units.
    pub compute_units: u32,
    /// Peak f32 matmul throughput, FLOP/s.
    pub peak_flops_f32: f64,
    /// Peak bf16 matmul throughput, FLOP/s.
    pub peak_flops_bf16: f64,
    /// Peak f16 matmul throughput, FLOP/s.
    pub peak_flops_f16: f64,
    /// Memory bandwidth, bytes/s.
    pub memory_bandwidth: f64,
    /// Link bandwidth to other devices, bytes/s.
    pub link_bandwidth: f64,
}

/// What a runtime handle holds: the host runtime and the strings its
/// device infos and failures point to.
#[derive(Debug)]
pub(crate) struct RuntimeObject {
    pub(crate) runtime: Runtime,
    failures: Vec<CString>,
    strings: Vec<[CString; 4]>,
}

pub(crate) static RUNTIMES: Registry<RuntimeObject> = Registry::new(Handle::RUNTIME);

fn cstring(s: &str) -> CString {
    CString::new(s.replace('\0', "\\0")).unwrap_or_default()
}

/// The API version this library implements.
///
/// Thread safety: any thread.
///
/// # Safety
/// `major` and `minor` are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_api_version(major: *mut u32, minor: *mut u32) {
    // SAFETY: per this function's contract, each is NULL or writable.
    unsafe {
        if let Some(m) = major.as_mut() {
            *m = POLYCHIP_API_MAJOR;
        }
        if let Some(m) = minor.as_mut() {
            *m = POLYCHIP_API_MINOR;
        }
    }
}

fn defaults() -> polychip_runtime_options_t {
    polychip_runtime_options_t {
        struct_size: size_of::<polychip_runtime_options_t>(),
        api_major: POLYCHIP_API_MAJOR,
        api_minor: POLYCHIP_API_MINOR,
        plugin_path: std::ptr::null(),
        bundled: true,
        strict: false,
        log: None,
        log_context: std::ptr::null_mut(),
        log_level: POLYCHIP_API_LOG_WARN,
    }
}

/// Fills `options` (whose `struct_size` the caller has set) with the
/// defaults and this header's version.
///
/// Thread safety: any thread.
///
/// # Safety
/// `options` is NULL or points to `options->struct_size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_runtime_options_init(
    options: *mut polychip_runtime_options_t,
) -> *mut polychip_error_t {
    guard("polychip_runtime_options_init", || {
        let options = out_param(options, "options")?;
        // SAFETY: per this function's contract, struct_size bytes are writable.
        unsafe { struct_prefix::write(options, &defaults(), "options") }
    })
}

/// Reads the caller's options: the fields its `struct_size` covers, the
/// defaults for the others.
///
/// # Safety
/// `options` is NULL or points to a readable struct of its own `struct_size`.
unsafe fn read_options(
    options: *const polychip_runtime_options_t,
) -> ApiResult<polychip_runtime_options_t> {
    if options.is_null() {
        return Ok(defaults());
    }
    let mut out = defaults();
    // SAFETY: forwarded contract.
    unsafe { struct_prefix::read(options, &mut out, "options")? };
    if out.log_level > POLYCHIP_API_LOG_TRACE {
        return Err(ApiError::invalid(format!(
            "options->log_level is {}, not a level (POLYCHIP_API_LOG_OFF 0 to \
             POLYCHIP_API_LOG_TRACE 5)",
            out.log_level
        )));
    }
    if out.api_major != POLYCHIP_API_MAJOR || out.api_minor > POLYCHIP_API_MINOR {
        return Err(ApiError::new(
            POLYCHIP_API_ERROR_VERSION_MISMATCH,
            format!(
                "the caller was built for polychip API {}.{} but this libpolychip is {POLYCHIP_API_MAJOR}.{POLYCHIP_API_MINOR} (it accepts {POLYCHIP_API_MAJOR}.0 to {POLYCHIP_API_MAJOR}.{POLYCHIP_API_MINOR})",
                out.api_major, out.api_minor
            ),
        ));
    }
    Ok(out)
}

/// The directory holding this library (the bundled plugins sit beside it).
fn library_dir() -> Option<PathBuf> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    let addr = polychip_api_version as *const c_void;
    // SAFETY: dladdr only reads the address and writes `info`.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr returned a NUL-terminated path that lives with the library.
    let path = unsafe { CStr::from_ptr(info.dli_fname) };
    PathBuf::from(path.to_string_lossy().into_owned())
        .parent()
        .map(PathBuf::from)
}

/// The plugin files the options name, the problems of listed paths, and
/// the directories bundled plugins were looked for in.
fn plugin_files(
    options: &polychip_runtime_options_t,
) -> ApiResult<(Vec<PathBuf>, Vec<String>, Vec<PathBuf>)> {
    let list = if options.plugin_path.is_null() {
        std::env::var(discovery::PLUGIN_PATH_VAR).unwrap_or_default()
    } else {
        crate::address(options.plugin_path, "options->plugin_path")?;
        // SAFETY: the options' contract: a NUL-terminated string borrowed for the call.
        unsafe { CStr::from_ptr(options.plugin_path) }
            .to_str()
            .map_err(|_| ApiError::invalid("options->plugin_path is not UTF-8"))?
            .to_owned()
    };
    let mut dirs = Vec::new();
    if options.bundled && !discovery::bundled_disabled() {
        if let Some(dir) = library_dir() {
            // Beside the library (a build tree), or in its `polychip`
            // folder (an installed prefix: `PREFIX/lib/polychip`).
            dirs.push(dir.join("polychip"));
            dirs.push(dir);
        }
        dirs.extend(discovery::program_dirs());
    }
    let source = match options.plugin_path.is_null() {
        true => discovery::PLUGIN_PATH_VAR,
        false => "the plugin path given (options->plugin_path)",
    };
    let (files, problems) = discovery::discover_from(&list, source, &dirs);
    let problems = problems
        .into_iter()
        .map(|p| format!("{}: {}", p.path.display(), p.reason))
        .collect();
    Ok((files, problems, dirs))
}

/// Makes a runtime: loads the plugins `options` names (NULL: the defaults)
/// and lists their devices. Plugins that fail to load are listed by
/// `polychip_runtime_failure` (or, with `strict`, fail the call).
///
/// Ownership: on success `*out` is a new runtime the caller destroys with
/// `polychip_runtime_destroy`; on failure `*out` is untouched.
/// Thread safety: any thread.
///
/// # Safety
/// `options` is NULL or a readable struct of its own `struct_size` whose
/// strings are NUL-terminated; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_runtime_new(
    options: *const polychip_runtime_options_t,
    out: *mut *mut polychip_runtime_t,
) -> *mut polychip_error_t {
    let error = guard("polychip_runtime_new", || {
        let out = out_param(out, "out")?;
        // SAFETY: forwarded contract.
        let options = unsafe { read_options(options)? };
        if options.log.is_some() {
            crate::log::install(options.log, options.log_context, options.log_level);
        }
        let (files, problems, bundled_dirs) = plugin_files(&options)?;
        let mut runtime = Runtime::load(&files, &LoadOptions::default());
        runtime.forgive_hidden_bundled(&bundled_dirs);
        let mut failures: Vec<String> = problems;
        failures.extend(runtime.failures().iter().map(|f| f.error.to_string()));
        if options.strict && !failures.is_empty() {
            return Err(ApiError::new(
                crate::error::POLYCHIP_API_ERROR_UNAVAILABLE,
                format!(
                    "strict: {} plugin(s) failed to load: {}",
                    failures.len(),
                    failures.join("; ")
                ),
            ));
        }
        let strings = runtime
            .devices()
            .iter()
            .map(|d| {
                let plugin = d.plugin();
                [
                    cstring(plugin.vendor()),
                    cstring(&d.props().name),
                    cstring(&plugin.path().display().to_string()),
                    cstring(plugin.version()),
                ]
            })
            .collect();
        let object = RuntimeObject {
            runtime,
            failures: failures.iter().map(|f| cstring(f)).collect(),
            strings,
        };
        // SAFETY: `out` was checked non-NULL and is writable per the contract.
        unsafe { out.write(RUNTIMES.insert(object).cast()) };
        crate::log::runtimes(Some(true));
        Ok(())
    });
    if !error.is_null() {
        crate::log::runtimes(None);
    }
    error
}

/// Destroys a runtime handle. Tensors, streams and communicators made from
/// it stay valid: they keep what they need alive. NULL is ignored; a handle
/// that is not a live runtime is logged and ignored.
///
/// Thread safety: any thread, not concurrently with other calls on this
/// runtime.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_runtime_destroy(runtime: *mut polychip_runtime_t) {
    quiet("polychip_runtime_destroy", (), || {
        if !runtime.is_null() {
            match RUNTIMES.remove(runtime.cast(), "runtime") {
                Ok(_) => crate::log::runtimes(Some(false)),
                Err(e) => log::warn!("polychip_runtime_destroy: {}", e.message),
            }
        }
    })
}

/// The number of devices of every loaded plugin, in load order.
///
/// Thread safety: any thread.
///
/// # Safety
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_runtime_device_count(
    runtime: *const polychip_runtime_t,
    out: *mut u32,
) -> *mut polychip_error_t {
    guard("polychip_runtime_device_count", || {
        let out = out_param(out, "out")?;
        let rt = RUNTIMES.get(runtime.cast(), "runtime")?;
        // SAFETY: checked non-NULL; writable per the contract.
        unsafe { out.write(rt.runtime.devices().len() as u32) };
        Ok(())
    })
}

/// The properties of device `index` (`0..polychip_runtime_device_count`).
/// Writes the fields that `info->struct_size` covers.
///
/// Thread safety: any thread.
///
/// # Safety
/// `info` points to a writable struct of its own `struct_size`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_runtime_device_info(
    runtime: *const polychip_runtime_t,
    index: u32,
    info: *mut polychip_device_info_t,
) -> *mut polychip_error_t {
    guard("polychip_runtime_device_info", || {
        let info = out_param(info, "info")?;
        let rt = RUNTIMES.get(runtime.cast(), "runtime")?;
        let device = rt.device(index)?;
        let strings = &rt.strings[index as usize];
        let (props, plugin) = (device.props(), device.plugin());
        let (abi_major, abi_minor) = plugin.abi_version();
        let ops = plugin.ops();
        let full = polychip_device_info_t {
            struct_size: size_of::<polychip_device_info_t>(),
            vendor: strings[0].as_ptr(),
            name: strings[1].as_ptr(),
            plugin_path: strings[2].as_ptr(),
            plugin_version: strings[3].as_ptr(),
            plugin_device: device.index(),
            abi_major,
            abi_minor,
            ops_implemented: ops.implemented().len() as u32,
            ops_total: ops.total() as u32,
            memory_bytes: props.memory_bytes,
            host_visible: props.host_visible,
            rdma_exportable: props.rdma_exportable,
            compute_units: props.compute_units,
            peak_flops_f32: props.peak_flops_f32,
            peak_flops_bf16: props.peak_flops_bf16,
            peak_flops_f16: props.peak_flops_f16,
            memory_bandwidth: props.memory_bandwidth,
            link_bandwidth: props.link_bandwidth,
        };
        // SAFETY: per this function's contract, struct_size bytes are writable.
        unsafe { struct_prefix::write(info, &full, "info") }
    })
}

/// The number of plugins (or listed paths) that failed to load.
///
/// Thread safety: any thread.
///
/// # Safety
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_runtime_failure_count(
    runtime: *const polychip_runtime_t,
    out: *mut usize,
) -> *mut polychip_error_t {
    guard("polychip_runtime_failure_count", || {
        let out = out_param(out, "out")?;
        let rt = RUNTIMES.get(runtime.cast(), "runtime")?;
        // SAFETY: checked non-NULL; writable per the contract.
        unsafe { out.write(rt.failures.len()) };
        Ok(())
    })
}

/// Why the `index`-th failure happened, naming the file: UTF-8,
/// NUL-terminated, owned by the runtime and valid until it is destroyed.
///
/// Thread safety: any thread.
///
/// # Safety
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_runtime_failure(
    runtime: *const polychip_runtime_t,
    index: usize,
    out: *mut *const c_char,
) -> *mut polychip_error_t {
    guard("polychip_runtime_failure", || {
        let out = out_param(out, "out")?;
        let rt = RUNTIMES.get(runtime.cast(), "runtime")?;
        let failure = rt.failures.get(index).ok_or_else(|| {
            ApiError::invalid(format!(
                "index {index} is out of range: the runtime has {} failure(s)",
                rt.failures.len()
            ))
        })?;
        // SAFETY: checked non-NULL; writable per the contract. The string
        // lives in the runtime object, which the registry keeps alive.
        unsafe { out.write(failure.as_ptr()) };
        Ok(())
    })
}

impl RuntimeObject {
    /// Device `index`, or an error naming the range.
    pub(crate) fn device(&self, index: u32) -> ApiResult<&polychip_host::Device> {
        self.runtime.devices().get(index as usize).ok_or_else(|| {
            ApiError::invalid(format!(
                "device {index} does not exist: the runtime has {} device(s)",
                self.runtime.devices().len()
            ))
        })
    }
}

//! A loaded plugin: its checked tables, and one safe method per table
//! function that turns the returned error object into a [`HostError`].

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::ptr::{NonNull, null_mut};
use std::sync::atomic::{AtomicU64, Ordering};

use polychip_plugin_sdk::DeviceProps;
use polychip_plugin_sdk::abi::{
    PolychipDeviceProps, PolychipError, PolychipEvent, PolychipOpTable, PolychipPluginApi,
    PolychipStream,
};

use crate::error::{HostError, Result};
use crate::ffi::errors;
use crate::ffi::fpenv::{FpEnv, FpEnvChange};

/// A plugin's stream handle.
#[derive(Debug)]
pub struct RawStream(pub(crate) NonNull<PolychipStream>);
/// A plugin's event handle.
#[derive(Debug)]
pub struct RawEvent(pub(crate) NonNull<PolychipEvent>);

// SAFETY: handles are opaque tokens; the ABI makes plugin functions
// thread-safe and the host serializes calls per stream.
unsafe impl Send for RawStream {}
// SAFETY: as above.
unsafe impl Send for RawEvent {}

/// Which operators a plugin implements (non-NULL op-table entries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpSet {
    entries: Vec<(&'static str, bool)>,
}

impl OpSet {
    fn of(ops: &PolychipOpTable) -> OpSet {
        OpSet {
            entries: ops.entries().to_vec(),
        }
    }

    /// Names of implemented operators.
    pub fn implemented(&self) -> Vec<&'static str> {
        self.entries.iter().filter(|e| e.1).map(|e| e.0).collect()
    }

    /// Names of operators whose entry is NULL.
    pub fn missing(&self) -> Vec<&'static str> {
        self.entries.iter().filter(|e| !e.1).map(|e| e.0).collect()
    }

    /// Number of operators in the ABI this host speaks.
    pub fn total(&self) -> usize {
        self.entries.len()
    }
}

/// A loaded, checked plugin. Never unloaded; shared by every device it drives.
#[derive(Debug)]
pub struct Plugin {
    path: PathBuf,
    vendor: String,
    version: String,
    api: PolychipPluginApi,
    pub(crate) ops: PolychipOpTable,
    devices: Vec<DeviceProps>,
    unimplemented_calls: AtomicU64,
    /// Calls that returned with the calling thread's floating-point
    /// environment changed ([`super::fpenv`]).
    fp_env_changes: AtomicU64,
    /// The functions already warned about such a change (once each).
    fp_env_warned: std::sync::Mutex<Vec<String>>,
    /// What loading the plugin did that the ABI forbids (a changed
    /// floating-point environment or process state), each a sentence.
    load_findings: std::sync::Mutex<Vec<String>>,
    /// What loading it did that the ABI discourages (signal handlers
    /// installed, the environment changed), each a sentence.
    load_notes: std::sync::Mutex<Vec<String>>,
    /// Per device: bytes of host-owned buffers allocated now, and the most
    /// since the last reset ([`crate::Device::peak_memory_in_use`]).
    pub(crate) usage: Vec<MemoryUsage>,
}

/// Bytes a device's host-owned buffers hold now and at most, and where
/// they are.
#[derive(Debug, Default)]
pub(crate) struct MemoryUsage {
    pub in_use: AtomicU64,
    pub peak: AtomicU64,
    /// Where the live buffers are (for checking an address handed in from
    /// outside, a DLPack import's).
    pub live: std::sync::Mutex<LiveMemory>,
}

/// A device's live buffers by address.
#[derive(Debug, Default)]
pub(crate) struct LiveMemory {
    /// The host's allocations (which do not overlap): address to bytes.
    pub allocations: std::collections::BTreeMap<usize, u64>,
    /// Memory borrowed from other owners (which may overlap, or lie inside
    /// an allocation): (address, serial) to bytes.
    pub borrowed: std::collections::BTreeMap<(usize, u64), u64>,
    /// The next borrowed buffer's serial.
    pub serial: u64,
    /// Buffers whose last reference went while memory borrowed from them
    /// was still in use (a DLPack import naming memory inside them): their
    /// free, or release, waits for the last such borrower.
    pub deferred: Vec<crate::memory::Deferred>,
}

// SAFETY: the table's pointers are static (plugins are never unloaded) and the
// ABI requires every plugin function to be thread-safe.
unsafe impl Send for Plugin {}
// SAFETY: as above.
unsafe impl Sync for Plugin {}

/// The most devices the host takes from one plugin (a count beyond it is a
/// broken plugin, whose properties the host would otherwise query and keep
/// one by one).
pub const MAX_PLUGIN_DEVICES: u32 = 4096;

/// The largest peak throughput a device may report, in FLOP/s (the
/// planner's bound on a chip's peak).
pub const MAX_PEAK_FLOPS: f64 = 1e20;

/// The largest memory or link bandwidth a device may report, in bytes/s
/// (the planner's bound on a chip's bandwidths).
pub const MAX_BANDWIDTH: f64 = 1e18;

/// Puts a device's peak throughputs and bandwidths that are not
/// numbers a device can have (NaN, infinite, negative, or beyond
/// [`MAX_PEAK_FLOPS`] / [`MAX_BANDWIDTH`]) to 0, the ABI's "not known",
/// and says which, each a sentence to end `plugin X device N `. Until
/// 2026-12-06 they reached `polychip devices` as they were (a FLOP/s of
/// 1e300 in 301 digits, `NaN G`, a negative bandwidth) and its JSON as
/// `null`.
fn sanitize_figures(props: &mut DeviceProps) -> Vec<String> {
    let mut problems = Vec::new();
    let fields: [(&str, &mut f64, f64, &str); 5] = [
        (
            "peak_flops_f32",
            &mut props.peak_flops_f32,
            MAX_PEAK_FLOPS,
            "FLOP/s",
        ),
        (
            "peak_flops_bf16",
            &mut props.peak_flops_bf16,
            MAX_PEAK_FLOPS,
            "FLOP/s",
        ),
        (
            "peak_flops_f16",
            &mut props.peak_flops_f16,
            MAX_PEAK_FLOPS,
            "FLOP/s",
        ),
        (
            "memory_bandwidth",
            &mut props.memory_bandwidth,
            MAX_BANDWIDTH,
            "bytes/s",
        ),
        (
            "link_bandwidth",
            &mut props.link_bandwidth,
            MAX_BANDWIDTH,
            "bytes/s",
        ),
    ];
    for (field, value, max, unit) in fields {
        if !(*value >= 0.0 && *value <= max) {
            problems.push(format!(
                "reported {field} = {value:e}, not a figure from 0 (not known) to {max:e} \
                 {unit}; it is taken as 0 (not known)"
            ));
            *value = 0.0;
        }
    }
    problems
}

type Entry<A> =
    Option<unsafe extern "C" fn(u32, *mut PolychipStream, *const A) -> *mut PolychipError>;

impl Plugin {
    pub(crate) fn new(
        path: PathBuf,
        vendor: String,
        version: String,
        api: PolychipPluginApi,
        ops: PolychipOpTable,
    ) -> Result<Plugin> {
        let mut plugin = Plugin {
            path,
            vendor,
            version,
            api,
            ops,
            devices: Vec::new(),
            unimplemented_calls: AtomicU64::new(0),
            fp_env_changes: AtomicU64::new(0),
            fp_env_warned: std::sync::Mutex::new(Vec::new()),
            load_findings: std::sync::Mutex::new(Vec::new()),
            load_notes: std::sync::Mutex::new(Vec::new()),
            usage: Vec::new(),
        };
        let count = plugin.device_count()?;
        if count > MAX_PLUGIN_DEVICES {
            return Err(HostError::Contract {
                plugin: plugin.vendor.clone(),
                function: "device_count",
                what: format!(
                    "reported {count} devices, more than the host accepts from one plugin \
                     ({MAX_PLUGIN_DEVICES})"
                ),
            });
        }
        plugin.devices = (0..count)
            .map(|i| plugin.query_props(i))
            .collect::<Result<_>>()?;
        plugin.usage = (0..count).map(|_| MemoryUsage::default()).collect();
        Ok(plugin)
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The vendor's name.
    pub fn vendor(&self) -> &str {
        &self.vendor
    }

    /// The plugin's own version.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The ABI (major, minor) the plugin was built for.
    pub fn abi_version(&self) -> (u32, u32) {
        (self.api.abi_major, self.api.abi_minor)
    }

    /// Properties of each device, queried at load time.
    pub fn devices(&self) -> &[DeviceProps] {
        &self.devices
    }

    /// Which operators it implements.
    pub fn ops(&self) -> OpSet {
        OpSet::of(&self.ops)
    }

    /// How many operator calls found a NULL entry.
    pub fn unimplemented_calls(&self) -> u64 {
        self.unimplemented_calls.load(Ordering::Relaxed)
    }

    /// Counts a call refused as not implemented before the plugin ran (a
    /// dtype newer than the plugin's minor).
    pub(crate) fn count_unimplemented(&self) {
        self.unimplemented_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// How many calls returned with the calling thread's floating-point
    /// environment changed (each restored by the host; ABI rule 12).
    pub fn fp_env_changes(&self) -> u64 {
        self.fp_env_changes.load(Ordering::Relaxed)
    }

    /// What loading the plugin did that the ABI forbids, each a sentence
    /// (rules 12 and 13: its initialisers or entry left the floating-point
    /// environment or process state changed; the host undid what it could).
    /// `polychip conform` fails a plugin with any.
    pub fn load_findings(&self) -> Vec<String> {
        self.load_findings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// What loading the plugin did that the ABI discourages but real
    /// drivers do (rule 13: signal handlers installed, the environment
    /// changed), each a sentence. `polychip conform` reports them without
    /// failing.
    pub fn load_notes(&self) -> Vec<String> {
        self.load_notes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Records a finding of loading (`forbidden`) or a note, and warns
    /// about a finding (a note is logged at info level: PoCL's LLVM makes
    /// one for every OpenCL user).
    #[cold]
    pub(crate) fn note_load_finding(&self, finding: String, forbidden: bool) {
        let list = if forbidden {
            log::warn!("{finding}");
            &self.load_findings
        } else {
            log::info!("{finding}");
            &self.load_notes
        };
        list.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(finding);
    }

    /// Runs `call` (one call into the plugin's tables) and puts the calling
    /// thread's floating-point environment back as it was if the call
    /// changed it: counted, warned about once per function, and recorded
    /// for [`super::fpenv::take_change`].
    #[inline(always)]
    fn guarded<T>(&self, function: &str, call: impl FnOnce() -> T) -> T {
        let before = FpEnv::current();
        let result = call();
        let after = FpEnv::current();
        if after != before {
            self.fp_env_changed(function, before, after);
        }
        result
    }

    #[cold]
    fn fp_env_changed(&self, function: &str, before: FpEnv, after: FpEnv) {
        before.restore();
        self.note_fp_env_change(function, before, after);
    }

    /// Counts, warns about and records a change the host already undid.
    #[cold]
    pub(crate) fn note_fp_env_change(&self, function: &str, before: FpEnv, after: FpEnv) {
        self.fp_env_changes.fetch_add(1, Ordering::Relaxed);
        let change = FpEnvChange {
            plugin: self.vendor.clone(),
            function: function.to_string(),
            what: before.changes_to(after),
        };
        let mut warned = self
            .fp_env_warned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !warned.iter().any(|f| f == function) {
            warned.push(function.to_string());
            log::warn!("{change} (warned once for {function})");
        }
        drop(warned);
        if function.starts_with("loading") {
            self.load_findings
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(change.to_string());
        }
        super::fpenv::record(change);
    }

    fn check(&self, function: &'static str, error: *mut PolychipError) -> Result<()> {
        match errors::take(error) {
            Ok(None) => Ok(()),
            Ok(Some((code, message))) => Err(HostError::Plugin {
                plugin: self.vendor.clone(),
                function,
                code,
                message,
            }),
            Err(misuse) => Err(HostError::Contract {
                plugin: self.vendor.clone(),
                function,
                what: misuse.what().into(),
            }),
        }
    }

    fn device_count(&self) -> Result<u32> {
        let mut count = 0u32;
        // SAFETY: required function (checked at load); `count` is writable.
        let e = self.guarded("device_count", || unsafe {
            self.api.device_count.expect("checked at load")(&mut count)
        });
        self.check("device_count", e)?;
        Ok(count)
    }

    fn query_props(&self, device: u32) -> Result<DeviceProps> {
        let mut raw = PolychipDeviceProps::default();
        // SAFETY: required function; `raw` is a writable, zeroed struct whose
        // struct_size says how much the plugin may write.
        let e = self.guarded("device_props", || unsafe {
            self.api.device_props.expect("checked at load")(device, &mut raw)
        });
        self.check("device_props", e)?;
        let mut props = DeviceProps::from_raw(&raw);
        props.name = super::load::printable(&props.name);
        for problem in sanitize_figures(&mut props) {
            self.note_load_finding(
                format!("plugin {} device {device} {problem}", self.vendor),
                true,
            );
        }
        Ok(props)
    }

    /// `mem_alloc`.
    pub fn mem_alloc(&self, device: u32, bytes: u64) -> Result<*mut c_void> {
        let mut ptr = null_mut();
        // SAFETY: required function; `ptr` is writable.
        let e = self.guarded("mem_alloc", || unsafe {
            self.api.mem_alloc.expect("checked at load")(device, bytes, &mut ptr)
        });
        self.check("mem_alloc", e)?;
        if ptr.is_null() && bytes > 0 {
            return Err(HostError::Contract {
                plugin: self.vendor.clone(),
                function: "mem_alloc",
                what: format!("returned success and a NULL pointer for {bytes} bytes"),
            });
        }
        Ok(ptr)
    }

    /// `mem_free`.
    ///
    /// # Safety
    /// `ptr` came from [`Plugin::mem_alloc`] on `device` and no work uses it.
    pub unsafe fn mem_free(&self, device: u32, ptr: *mut c_void) -> Result<()> {
        // SAFETY: required function; the caller guarantees `ptr`.
        let e = self.guarded("mem_free", || unsafe {
            self.api.mem_free.expect("checked at load")(device, ptr)
        });
        self.check("mem_free", e)
    }

    /// `memcpy_h2d`, `memcpy_d2h` or `memcpy_d2d`, chosen by `function`.
    ///
    /// # Safety
    /// The ABI's copy contract: valid ranges, host memory alive until the stream reaches the copy.
    pub unsafe fn memcpy(
        &self,
        function: &'static str,
        device: u32,
        stream: Option<&RawStream>,
        dst: *mut c_void,
        src: *const c_void,
        bytes: u64,
    ) -> Result<()> {
        let f = match function {
            "memcpy_h2d" => self.api.memcpy_h2d,
            "memcpy_d2h" => self.api.memcpy_d2h,
            _ => self.api.memcpy_d2d,
        };
        let stream = stream.map_or(null_mut(), |s| s.0.as_ptr());
        // SAFETY: required function; the caller guarantees the ranges.
        let e = self.guarded(function, || unsafe {
            f.expect("checked at load")(device, stream, dst, src, bytes)
        });
        self.check(function, e)
    }

    /// `stream_create`.
    pub fn stream_create(&self, device: u32) -> Result<RawStream> {
        let mut out = null_mut();
        // SAFETY: required function; `out` is writable.
        let e = self.guarded("stream_create", || unsafe {
            self.api.stream_create.expect("checked at load")(device, &mut out)
        });
        self.check("stream_create", e)?;
        NonNull::new(out)
            .map(RawStream)
            .ok_or_else(|| self.null_handle("stream_create"))
    }

    /// `stream_destroy`.
    pub fn stream_destroy(&self, stream: RawStream) -> Result<()> {
        // SAFETY: required function; the handle came from stream_create and is given up.
        let e = self.guarded("stream_destroy", || unsafe {
            self.api.stream_destroy.expect("checked at load")(stream.0.as_ptr())
        });
        self.check("stream_destroy", e)
    }

    /// `stream_synchronize`.
    pub fn stream_synchronize(&self, stream: &RawStream) -> Result<()> {
        // SAFETY: required function; a live handle.
        let e = self.guarded("stream_synchronize", || unsafe {
            self.api.stream_synchronize.expect("checked at load")(stream.0.as_ptr())
        });
        self.check("stream_synchronize", e)
    }

    /// `event_create`.
    pub fn event_create(&self, device: u32) -> Result<RawEvent> {
        let mut out = null_mut();
        // SAFETY: required function; `out` is writable.
        let e = self.guarded("event_create", || unsafe {
            self.api.event_create.expect("checked at load")(device, &mut out)
        });
        self.check("event_create", e)?;
        NonNull::new(out)
            .map(RawEvent)
            .ok_or_else(|| self.null_handle("event_create"))
    }

    /// `event_destroy`.
    pub fn event_destroy(&self, event: RawEvent) -> Result<()> {
        // SAFETY: required function; the handle came from event_create and is given up.
        let e = self.guarded("event_destroy", || unsafe {
            self.api.event_destroy.expect("checked at load")(event.0.as_ptr())
        });
        self.check("event_destroy", e)
    }

    /// `event_record`.
    pub fn event_record(&self, event: &RawEvent, stream: Option<&RawStream>) -> Result<()> {
        let stream = stream.map_or(null_mut(), |s| s.0.as_ptr());
        // SAFETY: required function; live handles.
        let e = self.guarded("event_record", || unsafe {
            self.api.event_record.expect("checked at load")(event.0.as_ptr(), stream)
        });
        self.check("event_record", e)
    }

    /// `stream_wait_event`.
    pub fn stream_wait_event(&self, stream: Option<&RawStream>, event: &RawEvent) -> Result<()> {
        let stream = stream.map_or(null_mut(), |s| s.0.as_ptr());
        // SAFETY: required function; live handles.
        let e = self.guarded("stream_wait_event", || unsafe {
            self.api.stream_wait_event.expect("checked at load")(stream, event.0.as_ptr())
        });
        self.check("stream_wait_event", e)
    }

    /// `event_synchronize`.
    pub fn event_synchronize(&self, event: &RawEvent) -> Result<()> {
        // SAFETY: required function; a live handle.
        let e = self.guarded("event_synchronize", || unsafe {
            self.api.event_synchronize.expect("checked at load")(event.0.as_ptr())
        });
        self.check("event_synchronize", e)
    }

    fn null_handle(&self, function: &'static str) -> HostError {
        HostError::Contract {
            plugin: self.vendor.clone(),
            function,
            what: "returned success and a NULL handle".into(),
        }
    }

    /// Calls operator entry `entry` named `op`.
    ///
    /// # Safety
    /// `args` satisfies the operator's contract: its tensors address live
    /// memory of `device` that stays alive until the stream reaches the op.
    #[inline]
    pub(crate) unsafe fn call_op<A>(
        &self,
        op: &'static str,
        entry: Entry<A>,
        device: u32,
        stream: Option<&RawStream>,
        args: &A,
    ) -> Result<()> {
        let Some(f) = entry else {
            self.unimplemented_calls.fetch_add(1, Ordering::Relaxed);
            return Err(HostError::OpUnimplemented {
                plugin: self.vendor.clone(),
                op,
            });
        };
        let stream = stream.map_or(null_mut(), |s| s.0.as_ptr());
        // SAFETY: a non-NULL entry of a checked table; the caller guarantees `args`.
        let e = self.guarded(op, || unsafe { f(device, stream, args) });
        if e.is_null() {
            return Ok(());
        }
        self.check(op, e)
    }
}

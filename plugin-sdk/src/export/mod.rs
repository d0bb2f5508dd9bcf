//! The unsafe boundary of a Rust plugin: the entry point and one `extern "C"`
//! shim per table function, each checking its pointers and struct sizes,
//! running the [`Plugin`] or [`Operators`] method inside a panic firewall,
//! and turning the result into an error object. The operator entries are
//! derived from `spec/ops.toml` (`generated.rs`); each is one [`call`]. Used
//! through [`crate::export_plugin!`].
//!
//! One cdylib exports one plugin; the SDK's statics are per cdylib.

use std::ffi::c_void;
use std::mem::size_of;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::{NonNull, null_mut};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::abi::{
    self, PolychipDeviceProps, PolychipError, PolychipEvent, PolychipHostApi, PolychipOpTable,
    PolychipPluginApi, PolychipStream,
};
use crate::error::{Error, ErrorCode, Result};
use crate::host::Host;
use crate::ops::{Op, Operators, RawArgs};
use crate::plugin::{CopyKind, Plugin, Queue};

static HOST: OnceLock<Host> = OnceLock::new();
static PLUGIN: AtomicPtr<()> = AtomicPtr::new(null_mut());
static TABLE: AtomicPtr<PolychipPluginApi> = AtomicPtr::new(null_mut());
static INIT_LOCK: Mutex<()> = Mutex::new(());

fn host() -> &'static Host {
    HOST.get()
        .expect("the plugin table is handed out only after HOST is set")
}

fn plugin<P: Plugin>() -> &'static P {
    let ptr = PLUGIN.load(Ordering::Acquire).cast::<P>();
    // SAFETY: PLUGIN is written once, by `init::<P>` with a leaked `Box<P>`, before
    // any table whose shims call `plugin::<P>` is returned; a cdylib exports one
    // plugin type, so the pointer has type P and lives forever.
    unsafe { &*ptr }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_owned()
    }
}

/// Runs `f` inside the panic firewall and converts its result to an error
/// object (NULL on success).
fn guard<P: Plugin>(function: &str, f: impl FnOnce() -> Result<()>) -> *mut PolychipError {
    let error = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => return null_mut(),
        Ok(Err(e)) => e,
        Err(payload) => Error::new(
            ErrorCode::Panic,
            format!(
                "{}: {function} panicked: {}",
                P::VENDOR.to_string_lossy(),
                panic_message(&*payload)
            ),
        ),
    };
    host().make_error(&error)
}

fn non_null<T>(ptr: *mut T, function: &str, name: &str) -> Result<NonNull<T>> {
    NonNull::new(ptr).ok_or_else(|| Error::invalid(format!("{function}: {name} is NULL")))
}

fn check_device<P: Plugin>(function: &str, device: u32) -> Result<()> {
    let count = plugin::<P>().device_count();
    if device < count {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{function}: device {device} does not exist; {} has {count} device(s)",
            P::VENDOR.to_string_lossy()
        )))
    }
}

struct StreamBox<S> {
    device: u32,
    stream: S,
}

struct EventBox<E> {
    device: u32,
    event: E,
}

/// # Safety
/// `stream` is NULL or came from `stream_create` of this plugin and is alive.
unsafe fn stream_ref<'a, P: Plugin>(
    stream: *mut PolychipStream,
) -> Option<&'a StreamBox<P::Stream>> {
    // SAFETY: per the contract above, a non-NULL handle is a live StreamBox<P::Stream>.
    unsafe { stream.cast::<StreamBox<P::Stream>>().as_ref() }
}

/// # Safety
/// As for [`stream_ref`].
unsafe fn queue<'a, P: Plugin>(
    function: &str,
    device: u32,
    stream: *mut PolychipStream,
) -> Result<Queue<'a, P::Stream>> {
    check_device::<P>(function, device)?;
    // SAFETY: forwarded contract.
    let stream = unsafe { stream_ref::<P>(stream) };
    if let Some(s) = stream {
        if s.device != device {
            return Err(Error::invalid(format!(
                "{function}: the stream belongs to device {} but the call is for device {device}",
                s.device
            )));
        }
    }
    Ok(Queue {
        device,
        stream: stream.map(|s| &s.stream),
    })
}

/// # Safety
/// `event` is non-NULL, from `event_create` of this plugin, and alive.
unsafe fn event_ref<'a, P: Plugin>(
    function: &str,
    event: *mut PolychipEvent,
) -> Result<&'a EventBox<P::Event>> {
    let event = non_null(event, function, "event")?;
    // SAFETY: per the contract above.
    Ok(unsafe { event.cast::<EventBox<P::Event>>().as_ref() })
}

/// Reads an args struct whose every field exists since 1.0.
///
/// # Safety
/// `args` is NULL or points to a readable struct of at least its own
/// `struct_size` bytes.
unsafe fn args_ref<'a, T>(function: &str, args: *const T) -> Result<&'a T> {
    let args = non_null(args.cast_mut(), function, "args")?;
    // SAFETY: every args struct starts with a readable `usize` struct_size.
    let size = unsafe { args.cast::<usize>().read() };
    if size < size_of::<T>() {
        return Err(Error::invalid(format!(
            "{function}: args->struct_size is {size} but ABI 1.0 needs at least {}",
            size_of::<T>()
        )));
    }
    // SAFETY: the struct is at least size_of::<T>() bytes and readable for the call.
    Ok(unsafe { args.as_ref() })
}

/// The entry point behind [`crate::export_plugin!`].
///
/// # Safety
/// Called by a host following the entry contract of `polychip_plugin_init_v1`.
pub unsafe fn init<P: Plugin>(
    host_api: *const PolychipHostApi,
    out_plugin: *mut *const PolychipPluginApi,
    set_ops: fn(&mut PolychipOpTable),
) -> *mut PolychipError {
    let _lock = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if host_api.is_null() || out_plugin.is_null() {
        // Without a host table there is no way to make an error object; the
        // host sees NULL with `*out_plugin` unwritten and reports that.
        return null_mut();
    }
    let existing = TABLE.load(Ordering::Acquire);
    if !existing.is_null() {
        // SAFETY: out_plugin is non-NULL and writable per the entry contract.
        unsafe { out_plugin.write(existing) };
        return null_mut();
    }
    // SAFETY: the host passes a readable table of its own struct_size.
    let candidate = unsafe { Host::from_raw(host_api) };
    if !candidate.can_make_errors() {
        return null_mut();
    }
    let host = HOST.get_or_init(|| candidate);
    let vendor = P::VENDOR.to_string_lossy();
    if host.abi_major() != abi::POLYCHIP_ABI_MAJOR {
        return host.make_error(&Error::new(
            ErrorCode::VersionMismatch,
            format!(
                "{vendor} speaks plugin ABI major {} but the host speaks major {}",
                abi::POLYCHIP_ABI_MAJOR,
                host.abi_major()
            ),
        ));
    }
    if host.abi_minor() < P::MIN_HOST_MINOR {
        return host.make_error(&Error::new(
            ErrorCode::VersionMismatch,
            format!(
                "{vendor} needs a host of ABI 1.{} or newer but the host is 1.{}",
                P::MIN_HOST_MINOR,
                host.abi_minor()
            ),
        ));
    }
    if log::set_logger(&FORWARD).is_ok() {
        log::set_max_level(host.log_level());
    }
    // This cdylib has its own copy of std, so this hook sees only the
    // plugin's panics: report them through the host's log instead of stderr.
    // The firewall in `guard` still turns each one into an error object.
    std::panic::set_hook(Box::new(|info| {
        if let Some(host) = HOST.get() {
            host.log(log::Level::Error, &format!("panic: {info}"));
        }
    }));
    let created = match catch_unwind(|| P::new(host)) {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => return host.make_error(&e),
        Err(payload) => {
            return host.make_error(&Error::new(
                ErrorCode::Panic,
                format!(
                    "{vendor}: initialisation panicked: {}",
                    panic_message(&*payload)
                ),
            ));
        }
    };
    PLUGIN.store(
        Box::into_raw(Box::new(created)).cast::<()>(),
        Ordering::Release,
    );
    let mut ops = empty_op_table();
    set_ops(&mut ops);
    let table = Box::into_raw(Box::new(plugin_table::<P>(Box::leak(Box::new(ops)))));
    TABLE.store(table, Ordering::Release);
    // SAFETY: out_plugin is non-NULL and writable per the entry contract.
    unsafe { out_plugin.write(table) };
    null_mut()
}

struct Forward;
static FORWARD: Forward = Forward;

impl log::Log for Forward {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }
    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            if let Some(host) = HOST.get() {
                host.log(record.level(), &record.args().to_string());
            }
        }
    }
    fn flush(&self) {}
}

fn empty_op_table() -> PolychipOpTable {
    // SAFETY: every entry is an `Option<fn>`, for which all-zero bytes are
    // `None`, and struct_size is an integer; the table is valid zeroed.
    let mut table: PolychipOpTable = unsafe { std::mem::zeroed() };
    table.struct_size = size_of::<PolychipOpTable>();
    table
}

fn plugin_table<P: Plugin>(ops: &'static PolychipOpTable) -> PolychipPluginApi {
    PolychipPluginApi {
        struct_size: size_of::<PolychipPluginApi>(),
        abi_major: abi::POLYCHIP_ABI_MAJOR,
        abi_minor: abi::POLYCHIP_ABI_MINOR,
        vendor: P::VENDOR.as_ptr(),
        plugin_version: P::VERSION.as_ptr(),
        device_count: Some(device_count::<P>),
        device_props: Some(device_props::<P>),
        mem_alloc: Some(mem_alloc::<P>),
        mem_free: Some(mem_free::<P>),
        stream_create: Some(stream_create::<P>),
        stream_destroy: Some(stream_destroy::<P>),
        stream_synchronize: Some(stream_synchronize::<P>),
        event_create: Some(event_create::<P>),
        event_destroy: Some(event_destroy::<P>),
        event_record: Some(event_record::<P>),
        stream_wait_event: Some(stream_wait_event::<P>),
        event_synchronize: Some(event_synchronize::<P>),
        memcpy_h2d: Some(memcpy_h2d::<P>),
        memcpy_d2h: Some(memcpy_d2h::<P>),
        memcpy_d2d: Some(memcpy_d2d::<P>),
        ops,
    }
}

unsafe extern "C" fn device_count<P: Plugin>(out_count: *mut u32) -> *mut PolychipError {
    guard::<P>("device_count", || {
        let out = non_null(out_count, "device_count", "out_count")?;
        // SAFETY: a non-NULL out-param is writable per the ABI.
        unsafe { out.write(plugin::<P>().device_count()) };
        Ok(())
    })
}

unsafe extern "C" fn device_props<P: Plugin>(
    device: u32,
    out_props: *mut PolychipDeviceProps,
) -> *mut PolychipError {
    guard::<P>("device_props", || {
        let out = non_null(out_props, "device_props", "out_props")?;
        check_device::<P>("device_props", device)?;
        // SAFETY: the caller's struct starts with a readable struct_size.
        let caller_size = unsafe { out.cast::<usize>().read() };
        if caller_size < size_of::<usize>() {
            return Err(Error::invalid(format!(
                "device_props: out_props->struct_size is {caller_size}"
            )));
        }
        let raw = plugin::<P>().device_props(device)?.to_raw();
        let n = caller_size.min(size_of::<PolychipDeviceProps>());
        // SAFETY: the caller's struct is writable for `caller_size >= n` bytes; ours has n.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&raw as *const PolychipDeviceProps).cast::<u8>(),
                out.as_ptr().cast::<u8>(),
                n,
            );
            out.cast::<usize>().write(n);
        }
        Ok(())
    })
}

unsafe extern "C" fn mem_alloc<P: Plugin>(
    device: u32,
    bytes: u64,
    out_ptr: *mut *mut c_void,
) -> *mut PolychipError {
    guard::<P>("mem_alloc", || {
        let out = non_null(out_ptr, "mem_alloc", "out_ptr")?;
        check_device::<P>("mem_alloc", device)?;
        let ptr = if bytes == 0 {
            null_mut()
        } else {
            plugin::<P>().alloc(device, bytes)?
        };
        // SAFETY: a non-NULL out-param is writable per the ABI.
        unsafe { out.write(ptr.cast::<c_void>()) };
        Ok(())
    })
}

unsafe extern "C" fn mem_free<P: Plugin>(device: u32, ptr: *mut c_void) -> *mut PolychipError {
    guard::<P>("mem_free", || {
        check_device::<P>("mem_free", device)?;
        if ptr.is_null() {
            return Ok(());
        }
        // SAFETY: the host passes back a pointer from mem_alloc on this device.
        unsafe { plugin::<P>().free(device, ptr.cast::<u8>()) }
    })
}

unsafe extern "C" fn stream_create<P: Plugin>(
    device: u32,
    out_stream: *mut *mut PolychipStream,
) -> *mut PolychipError {
    guard::<P>("stream_create", || {
        let out = non_null(out_stream, "stream_create", "out_stream")?;
        check_device::<P>("stream_create", device)?;
        let stream = plugin::<P>().stream_create(device)?;
        let boxed = Box::into_raw(Box::new(StreamBox { device, stream }));
        // SAFETY: a non-NULL out-param is writable per the ABI.
        unsafe { out.write(boxed.cast::<PolychipStream>()) };
        Ok(())
    })
}

unsafe extern "C" fn stream_destroy<P: Plugin>(stream: *mut PolychipStream) -> *mut PolychipError {
    guard::<P>("stream_destroy", || {
        let ptr = non_null(stream, "stream_destroy", "stream")?;
        // SAFETY: the host passes a live handle from stream_create and gives up ownership.
        let boxed = unsafe { Box::from_raw(ptr.as_ptr().cast::<StreamBox<P::Stream>>()) };
        plugin::<P>().stream_synchronize(&boxed.stream)
    })
}

unsafe extern "C" fn stream_synchronize<P: Plugin>(
    stream: *mut PolychipStream,
) -> *mut PolychipError {
    guard::<P>("stream_synchronize", || {
        // SAFETY: a non-NULL handle is a live stream of this plugin per the ABI.
        match unsafe { stream_ref::<P>(stream) } {
            Some(s) => plugin::<P>().stream_synchronize(&s.stream),
            // The default stream completes its work before each call returns.
            None => Ok(()),
        }
    })
}

unsafe extern "C" fn event_create<P: Plugin>(
    device: u32,
    out_event: *mut *mut PolychipEvent,
) -> *mut PolychipError {
    guard::<P>("event_create", || {
        let out = non_null(out_event, "event_create", "out_event")?;
        check_device::<P>("event_create", device)?;
        let event = plugin::<P>().event_create(device)?;
        let boxed = Box::into_raw(Box::new(EventBox { device, event }));
        // SAFETY: a non-NULL out-param is writable per the ABI.
        unsafe { out.write(boxed.cast::<PolychipEvent>()) };
        Ok(())
    })
}

unsafe extern "C" fn event_destroy<P: Plugin>(event: *mut PolychipEvent) -> *mut PolychipError {
    guard::<P>("event_destroy", || {
        let ptr = non_null(event, "event_destroy", "event")?;
        // SAFETY: the host passes a live handle from event_create and gives up ownership.
        drop(unsafe { Box::from_raw(ptr.as_ptr().cast::<EventBox<P::Event>>()) });
        Ok(())
    })
}

unsafe extern "C" fn event_record<P: Plugin>(
    event: *mut PolychipEvent,
    stream: *mut PolychipStream,
) -> *mut PolychipError {
    guard::<P>("event_record", || {
        // SAFETY: handles come from this plugin per the ABI.
        let event = unsafe { event_ref::<P>("event_record", event)? };
        // SAFETY: as above.
        let queue = unsafe { queue::<P>("event_record", event.device, stream)? };
        plugin::<P>().event_record(&event.event, queue)
    })
}

unsafe extern "C" fn stream_wait_event<P: Plugin>(
    stream: *mut PolychipStream,
    event: *mut PolychipEvent,
) -> *mut PolychipError {
    guard::<P>("stream_wait_event", || {
        // SAFETY: handles come from this plugin per the ABI.
        let event = unsafe { event_ref::<P>("stream_wait_event", event)? };
        // SAFETY: as above. A stream may wait for an event of another device of this plugin.
        let device = unsafe { stream_ref::<P>(stream) }.map_or(event.device, |s| s.device);
        // SAFETY: as above.
        let queue = unsafe { queue::<P>("stream_wait_event", device, stream)? };
        plugin::<P>().stream_wait_event(queue, &event.event)
    })
}

unsafe extern "C" fn event_synchronize<P: Plugin>(event: *mut PolychipEvent) -> *mut PolychipError {
    guard::<P>("event_synchronize", || {
        // SAFETY: handles come from this plugin per the ABI.
        let event = unsafe { event_ref::<P>("event_synchronize", event)? };
        plugin::<P>().event_synchronize(&event.event)
    })
}

/// # Safety
/// The ABI's memcpy contract.
unsafe fn memcpy<P: Plugin>(
    function: &'static str,
    kind: CopyKind,
    device: u32,
    stream: *mut PolychipStream,
    dst: *mut c_void,
    src: *const c_void,
    bytes: u64,
) -> *mut PolychipError {
    guard::<P>(function, || {
        // SAFETY: forwarded contract.
        let queue = unsafe { queue::<P>(function, device, stream)? };
        if bytes == 0 {
            return Ok(());
        }
        if dst.is_null() || src.is_null() {
            return Err(Error::invalid(format!(
                "{function}: dst or src is NULL for a copy of {bytes} bytes"
            )));
        }
        let bytes = usize::try_from(bytes).map_err(|_| {
            Error::invalid(format!(
                "{function}: {bytes} bytes exceed the address space"
            ))
        })?;
        // SAFETY: forwarded contract.
        unsafe { plugin::<P>().memcpy(queue, kind, dst.cast::<u8>(), src.cast::<u8>(), bytes) }
    })
}

unsafe extern "C" fn memcpy_h2d<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    dst: *mut c_void,
    src: *const c_void,
    bytes: u64,
) -> *mut PolychipError {
    // SAFETY: forwarded contract.
    unsafe {
        memcpy::<P>(
            "memcpy_h2d",
            CopyKind::HostToDevice,
            device,
            stream,
            dst,
            src,
            bytes,
        )
    }
}

unsafe extern "C" fn memcpy_d2h<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    dst: *mut c_void,
    src: *const c_void,
    bytes: u64,
) -> *mut PolychipError {
    // SAFETY: forwarded contract.
    unsafe {
        memcpy::<P>(
            "memcpy_d2h",
            CopyKind::DeviceToHost,
            device,
            stream,
            dst,
            src,
            bytes,
        )
    }
}

unsafe extern "C" fn memcpy_d2d<P: Plugin>(
    device: u32,
    stream: *mut PolychipStream,
    dst: *mut c_void,
    src: *const c_void,
    bytes: u64,
) -> *mut PolychipError {
    // SAFETY: forwarded contract.
    unsafe {
        memcpy::<P>(
            "memcpy_d2d",
            CopyKind::DeviceToDevice,
            device,
            stream,
            dst,
            src,
            bytes,
        )
    }
}

/// The body of every operator entry (`generated.rs` has one per operator):
/// reads the args struct (NULL and `struct_size` checked), resolves the
/// stream, converts and checks the arguments with the spec's rules, and runs
/// `method` on the plugin, all inside the panic firewall.
///
/// # Safety
/// The ABI's operator contract: `args` is NULL or points to a readable
/// struct of at least its own `struct_size` whose tensor descriptors'
/// `shape` and `strides` stay valid for the call; `stream` is NULL or a live
/// stream of this plugin; every tensor addresses memory of `device` that
/// stays valid until the stream reaches the work.
pub unsafe fn call<P: Operators, R: RawArgs>(
    op: Op,
    device: u32,
    stream: *mut PolychipStream,
    args: *const R,
    method: impl for<'a> FnOnce(&P, Queue<'_, P::Stream>, &R::Checked<'a>) -> Result<()>,
) -> *mut PolychipError {
    let name = op.name();
    guard::<P>(name, || {
        // SAFETY: forwarded contract.
        let raw = unsafe { args_ref(name, args)? };
        // SAFETY: forwarded contract.
        let queue = unsafe { queue::<P>(name, device, stream)? };
        // SAFETY: forwarded contract: the descriptors' arrays outlive `raw`'s borrow.
        let checked = unsafe { raw.check(op, device)? };
        method(plugin::<P>(), queue, &checked)
    })
}

#[rustfmt::skip]
pub mod generated;

/// Exports a [`Plugin`] that implements [`crate::Operators`] as this
/// cdylib's `polychip_plugin_init_v1`, with the listed operators in its op
/// table (the others are NULL, "not implemented"). Operators are listed by
/// their op-table names, also for those that share one trait method.
///
/// ```ignore
/// polychip_plugin_sdk::export_plugin!(MyChip, ops: [fill, copy, matmul]);
/// ```
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty, ops: [$($op:ident),* $(,)?]) => {
        /// The plugin's entry symbol (ABI major 1).
        ///
        /// # Safety
        /// Called by a polychip host following the ABI's entry contract.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn polychip_plugin_init_v1(
            host: *const $crate::abi::PolychipHostApi,
            out_plugin: *mut *const $crate::abi::PolychipPluginApi,
        ) -> *mut $crate::abi::PolychipError {
            fn set_ops(table: &mut $crate::abi::PolychipOpTable) {
                $( table.$op = Some($crate::__export::generated::$op::<$plugin>); )*
            }
            // SAFETY: the host follows the entry contract, which `init` requires.
            unsafe { $crate::__export::init::<$plugin>(host, out_plugin, set_ops) }
        }
    };
}

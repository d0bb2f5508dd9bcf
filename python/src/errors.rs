//! API errors as Python exceptions. The classes are defined in Python
//! (`polychip/errors.py`, so they can also derive from `ValueError`,
//! `TimeoutError`, ...); the class follows the error code and the text is
//! the host's message.

use std::ffi::CStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use polychip::*;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// The exception class name of an error code.
fn class_of(code: polychip_error_code_t) -> &'static str {
    match code {
        POLYCHIP_API_ERROR_INVALID_ARGUMENT => "InvalidArgument",
        POLYCHIP_API_ERROR_OUT_OF_MEMORY => "OutOfMemory",
        POLYCHIP_API_ERROR_UNIMPLEMENTED => "Unimplemented",
        POLYCHIP_API_ERROR_VERSION_MISMATCH => "VersionMismatch",
        POLYCHIP_API_ERROR_SHAPE_MISMATCH => "ShapeMismatch",
        POLYCHIP_API_ERROR_DTYPE_MISMATCH => "DTypeMismatch",
        POLYCHIP_API_ERROR_DEVICE_LOST => "DeviceLost",
        POLYCHIP_API_ERROR_PANIC => "Panic",
        POLYCHIP_API_ERROR_TIMEOUT => "Timeout",
        POLYCHIP_API_ERROR_PEER_LOST => "PeerLost",
        POLYCHIP_API_ERROR_UNAVAILABLE => "Unavailable",
        POLYCHIP_API_ERROR_IO => "IOError",
        _ => "Internal",
    }
}

/// The exception for `code` with `message`.
pub(crate) fn exception(py: Python<'_>, code: polychip_error_code_t, message: String) -> PyErr {
    let class = py
        .import("polychip.errors")
        .and_then(|m| m.getattr(class_of(code)));
    match class {
        Ok(class) => match class.call1(PyTuple::new(py, [message.clone()]).expect("a tuple")) {
            Ok(instance) => {
                let _ = instance.setattr("code", code);
                PyErr::from_value(instance)
            }
            Err(e) => e,
        },
        Err(_) => pyo3::exceptions::PyRuntimeError::new_err(message),
    }
}

/// `Ok` for NULL; the error's exception otherwise (the error is freed).
pub(crate) fn check(py: Python<'_>, error: Handle) -> PyResult<()> {
    if error == 0 {
        return Ok(());
    }
    let error = error as *mut polychip_error_t;
    let code = polychip_error_code(error);
    // SAFETY: a live error's message is a NUL-terminated string until destroy.
    let message = unsafe { CStr::from_ptr(polychip_error_message(error)) }
        .to_string_lossy()
        .into_owned();
    polychip_error_destroy(error);
    Err(exception(py, code, message))
}

use crate::Handle;

/// An error pointer as a handle, to leave a `Python::detach` closure (that
/// is, without the GIL): the last thing every such closure does. At
/// interpreter exit it keeps a daemon thread from re-entering Python (see
/// [`at_exit`]).
pub(crate) fn handle(error: *mut polychip_error_t) -> Handle {
    if EXITING.load(Ordering::Acquire) && exiting_thread() != Some(std::thread::current().id()) {
        // Python 3.9 to 3.13 end a thread that takes the GIL once the
        // interpreter finalizes with pthread_exit, whose forced unwind
        // through pyo3's frames aborted the whole process ("FATAL:
        // exception not rethrown") at the exit of any program whose daemon
        // threads were in a polychip call. Such a thread stops here
        // instead, as Python 3.14 stops it itself; the process exits
        // without it.
        loop {
            std::thread::park();
        }
    }
    error as Handle
}

/// An error pointer as a handle, in a call that holds the GIL.
pub(crate) fn held(error: *mut polychip_error_t) -> Handle {
    error as Handle
}

static EXITING: AtomicBool = AtomicBool::new(false);
static EXIT_THREAD: Mutex<Option<std::thread::ThreadId>> = Mutex::new(None);

fn exiting_thread() -> Option<std::thread::ThreadId> {
    *EXIT_THREAD.lock().unwrap_or_else(|e| e.into_inner())
}

/// Registered with `atexit` when the module loads: from now on the only
/// thread left to return into Python from a polychip call is the one
/// exiting (other threads still running are daemon threads, which the
/// interpreter is about to end). Waits a moment without the GIL so that
/// threads already waiting for it get it before the interpreter finalizes.
#[pyfunction]
pub(crate) fn _at_exit(py: Python<'_>) {
    *EXIT_THREAD.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current().id());
    EXITING.store(true, Ordering::Release);
    py.detach(|| std::thread::sleep(std::time::Duration::from_millis(20)));
}

/// An integer argument of type `T`. An int outside `T`'s range made pyo3
/// raise a bare `OverflowError` ("Python int too large to convert to C
/// long", "can't convert negative int to unsigned") that named no argument:
/// pyo3 names the argument in a `TypeError` only, so that is what this
/// raises, with the value and the range (`argument 'device': -1 is out of
/// range: expected an integer from 0 to 4294967295`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Int<T>(pub T);

/// The integer types [`Int`] takes, with their range.
pub(crate) trait IntRange: for<'py> FromPyObject<'py> {
    const MIN: i128;
    const MAX: i128;
}

macro_rules! int_range {
    ($($t:ty),*) => {$(
        impl IntRange for $t {
            const MIN: i128 = <$t>::MIN as i128;
            const MAX: i128 = <$t>::MAX as i128;
        }
    )*};
}
int_range!(i32, i64, u16, u32, u64, usize);

impl<'py, T: IntRange> FromPyObject<'py> for Int<T> {
    fn extract_bound(ob: &Bound<'py, PyAny>) -> PyResult<Self> {
        match ob.extract::<T>() {
            Ok(v) => Ok(Int(v)),
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(ob.py()) => {
                let shown = ob
                    .repr()
                    .map(|r| r.to_string())
                    .unwrap_or_else(|_| "the value".into());
                let n = shown.chars().count();
                let shown = if n > 60 {
                    let head: String = shown.chars().take(40).collect();
                    let digits = shown.chars().all(|c| c.is_ascii_digit() || c == '-');
                    format!(
                        "{head}... ({n} {})",
                        if digits { "digits" } else { "characters" }
                    )
                } else {
                    shown
                };
                Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "{shown} is out of range: expected an integer from {} to {}",
                    T::MIN,
                    T::MAX
                )))
            }
            Err(e) => Err(e),
        }
    }
}

/// The values of a list of [`Int`] arguments.
pub(crate) fn ints<T: Copy>(v: &[Int<T>]) -> Vec<T> {
    v.iter().map(|i| i.0).collect()
}

/// A text argument. A `str` holding a lone surrogate (what `os.fsdecode`
/// makes of bytes that are not UTF-8) made pyo3 raise a bare
/// `UnicodeEncodeError` that named no argument; this raises a `TypeError`,
/// which pyo3 prefixes with the argument's name, showing the text (cut).
#[derive(Debug, Clone)]
pub(crate) struct Text(pub String);

impl<'py> FromPyObject<'py> for Text {
    fn extract_bound(ob: &Bound<'py, PyAny>) -> PyResult<Self> {
        match ob.extract::<String>() {
            Ok(s) => Ok(Text(s)),
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyUnicodeError>(ob.py()) => {
                let shown = ob
                    .repr()
                    .map(|r| r.to_string())
                    .unwrap_or_else(|_| "the text".into());
                let n = shown.chars().count();
                let shown = if n > 80 {
                    let head: String = shown.chars().take(60).collect();
                    format!("{head}... ({} characters)", n - 2)
                } else {
                    shown
                };
                Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "{shown} is not UTF-8 text (it holds a lone surrogate, as os.fsdecode makes \
                     of bytes that are not UTF-8); polychip takes UTF-8 only"
                )))
            }
            Err(e) => Err(e),
        }
    }
}

//! DLPack for Python: `Tensor.__dlpack__` / `__dlpack_device__` (the array
//! API protocol) and `from_dlpack(runtime, obj, device)`, over libpolychip's
//! DLPack functions. Capsules follow the convention every consumer relies
//! on: named `dltensor_versioned` (DLPack 1.x) or `dltensor` (legacy), the
//! consumer renames a capsule it took to `used_...`, and a capsule nobody
//! took calls the tensor's deleter when it is collected.

use std::ffi::{CStr, c_void};
use std::ptr::null_mut;

use polychip::*;
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use pyo3::{IntoPyObjectExt, ffi};

use crate::Handle;
use crate::errors::{Int, check, handle};
use crate::runtime::Runtime;
use crate::stream::Stream;
use crate::tensor::Tensor;

const VERSIONED: &CStr = c"dltensor_versioned";
const USED_VERSIONED: &CStr = c"used_dltensor_versioned";
const LEGACY: &CStr = c"dltensor";
const USED_LEGACY: &CStr = c"used_dltensor";

/// A DLPack managed tensor type and the capsule name it travels under.
trait Managed {
    const NAME: &'static CStr;
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)>;
}

impl Managed for polychip_dlpack_versioned_t {
    const NAME: &'static CStr = VERSIONED;
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)> {
        self.deleter
    }
}

impl Managed for polychip_dlpack_managed_t {
    const NAME: &'static CStr = LEGACY;
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)> {
        self.deleter
    }
}

/// A capsule's destructor: a capsule still under its unused name was not
/// taken by a consumer, so it owns the managed tensor and deletes it once.
unsafe extern "C" fn free_capsule<M: Managed>(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with a live capsule; the pointer is read only
    // under the unused name, which the producer gave it.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, M::NAME.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, M::NAME.as_ptr()).cast::<M>();
            if let Some(delete) = m.as_ref().and_then(Managed::deleter) {
                delete(m);
            }
        }
    }
}

/// A capsule owning `ptr` under `name`, freed by `destructor` unless taken.
fn capsule(
    py: Python<'_>,
    ptr: *mut c_void,
    name: &'static CStr,
    destructor: unsafe extern "C" fn(*mut ffi::PyObject),
) -> PyResult<Py<PyAny>> {
    // SAFETY: a static name, a non-NULL pointer and a destructor that
    // tolerates a taken capsule.
    let raw = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(destructor)) };
    // SAFETY: PyCapsule_New returns a new reference or NULL with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, raw) }.map(Bound::unbind)
}

/// Whether a device's memory is host-visible.
fn host_visible(py: Python<'_>, runtime: &Runtime, device: u32) -> PyResult<bool> {
    let info = runtime.device_info(py, Int(device))?;
    match info.get_item("host_visible")? {
        Some(v) => v.extract(),
        None => Ok(false),
    }
}

impl Tensor {
    /// `(device_type, device_id)`: kDLCPU (1, 0) when the memory is
    /// host-visible, else kDLExtDev (12, runtime index).
    pub(crate) fn dlpack_device(&self, py: Python<'_>) -> PyResult<(i32, i32)> {
        let index = self.info(py)?.device;
        if host_visible(py, self.runtime.get(), index)? {
            Ok((POLYCHIP_DLPACK_CPU, 0))
        } else {
            Ok((POLYCHIP_DLPACK_EXT_DEV, index as i32))
        }
    }

    /// The `__dlpack__` protocol.
    pub(crate) fn dlpack(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let producer: Handle = match stream {
            None => 0,
            Some(s) if s.is_none() => 0,
            Some(s) => match s.cast::<Stream>() {
                Ok(s) => s.get().handle,
                Err(_) => match s.extract::<i64>() {
                    Ok(-1) => 0,
                    _ => {
                        return Err(PyBufferError::new_err(
                            "stream must be None, -1 or a polychip.Stream whose work the export waits for",
                        ));
                    }
                },
            },
        };
        let index = self.info(py)?.device;
        let device_type = match dl_device {
            None => 0,
            Some((POLYCHIP_DLPACK_CPU, 0)) => POLYCHIP_DLPACK_CPU,
            Some((POLYCHIP_DLPACK_EXT_DEV, id)) if id == index as i32 => POLYCHIP_DLPACK_EXT_DEV,
            Some(other) => {
                return Err(PyBufferError::new_err(format!(
                    "dl_device {other:?} cannot be given: the tensor is on polychip device {index} ({}, {index}) and can also be read on the CPU (1, 0)",
                    POLYCHIP_DLPACK_EXT_DEV
                )));
            }
        };
        let copy = match copy {
            None => POLYCHIP_DLPACK_COPY_IF_NEEDED,
            Some(true) => POLYCHIP_DLPACK_COPY_ALWAYS,
            Some(false) => POLYCHIP_DLPACK_COPY_NEVER,
        };
        let t = self.handle;
        let versioned = max_version.is_some_and(|(major, _)| major >= POLYCHIP_DLPACK_MAJOR);
        let (ptr, error) = py.detach(move || {
            if versioned {
                let mut out = null_mut();
                // SAFETY: `out` writable.
                let e = unsafe {
                    polychip_tensor_to_dlpack(
                        t as *const _,
                        device_type,
                        copy,
                        producer as *const _,
                        &mut out,
                    )
                };
                (out as Handle, handle(e))
            } else {
                let mut out = null_mut();
                // SAFETY: `out` writable.
                let e = unsafe {
                    polychip_tensor_to_dlpack_legacy(
                        t as *const _,
                        device_type,
                        copy,
                        producer as *const _,
                        &mut out,
                    )
                };
                (out as Handle, handle(e))
            }
        });
        check(py, error).map_err(|e| PyBufferError::new_err(e.value(py).to_string()))?;
        if versioned {
            capsule(
                py,
                ptr as *mut c_void,
                VERSIONED,
                free_capsule::<polychip_dlpack_versioned_t>,
            )
        } else {
            capsule(
                py,
                ptr as *mut c_void,
                LEGACY,
                free_capsule::<polychip_dlpack_managed_t>,
            )
        }
    }
}

/// A polychip tensor from any DLPack producer (a NumPy array, a torch
/// tensor, a polychip tensor, a capsule): zero-copy when the data is on a
/// polychip device, else copied onto `device` (default device 0).
#[pyfunction]
#[pyo3(signature = (runtime, obj, device = None))]
pub(crate) fn from_dlpack(
    py: Python<'_>,
    runtime: &Bound<'_, Runtime>,
    obj: &Bound<'_, PyAny>,
    device: Option<Int<u32>>,
) -> PyResult<Tensor> {
    let device = device.map(|d| d.0);
    let capsule = if obj.cast::<PyCapsule>().is_ok() {
        obj.clone()
    } else if obj.hasattr("__dlpack__")? {
        let kwargs = [("max_version", (1u32, 0u32).into_bound_py_any(py)?)];
        let kwargs = pyo3::types::IntoPyDict::into_py_dict(kwargs, py)?;
        match obj.call_method("__dlpack__", (), Some(&kwargs)) {
            Ok(c) => c,
            // A producer older than DLPack 1.0 takes no max_version.
            Err(e) if e.is_instance_of::<PyTypeError>(py) => obj.call_method0("__dlpack__")?,
            Err(e) => return Err(e),
        }
    } else {
        return Err(PyTypeError::new_err(format!(
            "from_dlpack takes an object with __dlpack__ (a NumPy array, a torch tensor, a polychip.Tensor) or a DLPack capsule, not {}",
            obj.get_type().name()?
        )));
    };
    let capsule = capsule.cast_into::<PyCapsule>().map_err(|e| {
        PyTypeError::new_err(format!(
            "__dlpack__ returned {}, not a DLPack capsule",
            e.into_inner().get_type()
        ))
    })?;
    let raw = capsule.as_ptr();
    let target = device.map_or(-1, i64::from);
    let rt = runtime.get().handle;
    // SAFETY: a live capsule; IsValid only reads its name.
    let (versioned, legacy) = unsafe {
        (
            ffi::PyCapsule_IsValid(raw, VERSIONED.as_ptr()) == 1,
            ffi::PyCapsule_IsValid(raw, LEGACY.as_ptr()) == 1,
        )
    };
    let (name, used) = match (versioned, legacy) {
        (true, _) => (VERSIONED, USED_VERSIONED),
        (_, true) => (LEGACY, USED_LEGACY),
        _ => {
            return Err(PyTypeError::new_err(
                "the capsule is not an unused DLPack tensor (named dltensor_versioned or dltensor)",
            ));
        }
    };
    // SAFETY: the capsule is valid under `name` (checked above).
    let managed = unsafe { ffi::PyCapsule_GetPointer(raw, name.as_ptr()) } as Handle;
    // Take the capsule before the GIL is released: another thread importing
    // the same capsule meanwhile must find it used, not import it a second
    // time (two owners of one managed tensor: its deleter would run twice).
    // A failed import gives it back under its unused name.
    // SAFETY: a live capsule; the name is static.
    unsafe { ffi::PyCapsule_SetName(raw, used.as_ptr()) };
    let (out, error) = py.detach(move || {
        let mut out = null_mut();
        // SAFETY: a live managed tensor owned by the capsule; `out` writable.
        let e = unsafe {
            if versioned {
                polychip_tensor_from_dlpack(rt as *const _, managed as *mut _, target, &mut out)
            } else {
                polychip_tensor_from_dlpack_legacy(
                    rt as *const _,
                    managed as *mut _,
                    target,
                    &mut out,
                )
            }
        };
        (out as Handle, handle(e))
    });
    if error != 0 {
        // The caller still owns the managed tensor: the capsule's destructor
        // deletes it again when nobody takes it.
        // SAFETY: a live capsule; the name is static.
        unsafe { ffi::PyCapsule_SetName(raw, name.as_ptr()) };
    }
    // On success libpolychip owns the managed tensor, and the capsule's
    // used name keeps its destructor away from it.
    check(py, error)?;
    Ok(Tensor::new(out, runtime.clone().unbind()))
}

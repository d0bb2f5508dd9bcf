//! `Runtime`: the loaded plugins and their devices.

use std::ffi::{CStr, CString, c_char};
use std::ptr::{null, null_mut};

use polychip::*;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::Handle;
use crate::errors::{Int, Text, check, handle, held, ints};
use crate::tensor::{Tensor, dtype_code};

/// The polychip API version of the native module, `(major, minor)`.
#[pyfunction]
pub(crate) fn api_version() -> (u32, u32) {
    (POLYCHIP_API_MAJOR, POLYCHIP_API_MINOR)
}

/// Loaded plugins and every device they drive.
#[pyclass(frozen, module = "polychip._native")]
pub(crate) struct Runtime {
    pub(crate) handle: Handle,
}

fn text(ptr: *const c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: libpolychip's strings are NUL-terminated and owned by the runtime.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

#[pymethods]
impl Runtime {
    /// The `polychip_runtime_t *`, for native code in the same process
    /// (valid while this object lives).
    #[getter]
    fn _handle(&self) -> usize {
        self.handle
    }

    /// Loads the plugins `plugin_path` names (`:`-separated files and
    /// directories; None: `POLYCHIP_PLUGIN_PATH`) and, with `bundled`, the
    /// bundled ones. With `strict`, a plugin that fails to load raises.
    #[new]
    #[pyo3(signature = (plugin_path = None, bundled = true, strict = false))]
    fn new(
        py: Python<'_>,
        plugin_path: Option<Text>,
        bundled: bool,
        strict: bool,
    ) -> PyResult<Runtime> {
        let path = plugin_path
            .map(|p| CString::new(p.0))
            .transpose()
            .map_err(|_| {
                pyo3::exceptions::PyValueError::new_err("plugin_path contains a NUL byte")
            })?;
        // SAFETY: an all-zero options struct is a valid value to fill.
        let mut options: polychip_runtime_options_t = unsafe { std::mem::zeroed() };
        options.struct_size = size_of::<polychip_runtime_options_t>();
        // SAFETY: writable for its struct_size.
        let e = unsafe { polychip_runtime_options_init(&mut options) };
        check(py, held(e))?;
        options.plugin_path = path.as_ref().map_or(null(), |p| p.as_ptr());
        options.bundled = bundled;
        options.strict = strict;
        let mut out = null_mut();
        // SAFETY: readable options whose string lives for the call; `out` writable.
        let e = unsafe { polychip_runtime_new(&options, &mut out) };
        check(py, held(e))?;
        Ok(Runtime {
            handle: out as Handle,
        })
    }

    /// The number of devices, every vendor's, in load order.
    pub(crate) fn device_count(&self, py: Python<'_>) -> PyResult<u32> {
        let mut n = 0;
        // SAFETY: `n` is writable.
        let e = unsafe { polychip_runtime_device_count(self.ptr(), &mut n) };
        check(py, held(e))?;
        Ok(n)
    }

    /// The properties of device `index`, as a dict.
    pub(crate) fn device_info<'py>(
        &self,
        py: Python<'py>,
        index: Int<u32>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let index = index.0;
        // SAFETY: an all-zero info with its struct_size is a valid out-param.
        let mut i: polychip_device_info_t = unsafe { std::mem::zeroed() };
        i.struct_size = size_of::<polychip_device_info_t>();
        // SAFETY: writable for its struct_size.
        let e = unsafe { polychip_runtime_device_info(self.ptr(), index, &mut i) };
        check(py, held(e))?;
        let d = PyDict::new(py);
        d.set_item("index", index)?;
        d.set_item("vendor", text(i.vendor))?;
        d.set_item("name", text(i.name))?;
        d.set_item("plugin_path", text(i.plugin_path))?;
        d.set_item("plugin_version", text(i.plugin_version))?;
        d.set_item("plugin_device", i.plugin_device)?;
        d.set_item("abi", (i.abi_major, i.abi_minor))?;
        d.set_item("ops_implemented", i.ops_implemented)?;
        d.set_item("ops_total", i.ops_total)?;
        d.set_item("memory_bytes", i.memory_bytes)?;
        d.set_item("host_visible", i.host_visible)?;
        d.set_item("rdma_exportable", i.rdma_exportable)?;
        d.set_item("compute_units", i.compute_units)?;
        d.set_item("peak_flops_f32", i.peak_flops_f32)?;
        d.set_item("peak_flops_bf16", i.peak_flops_bf16)?;
        d.set_item("peak_flops_f16", i.peak_flops_f16)?;
        d.set_item("memory_bandwidth", i.memory_bandwidth)?;
        d.set_item("link_bandwidth", i.link_bandwidth)?;
        Ok(d)
    }

    /// Why each plugin (or listed path) that did not load failed.
    fn failures(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let mut n = 0;
        // SAFETY: `n` is writable.
        let e = unsafe { polychip_runtime_failure_count(self.ptr(), &mut n) };
        check(py, held(e))?;
        (0..n)
            .map(|i| {
                let mut s = null();
                // SAFETY: `s` is writable; the string lives with the runtime.
                let e = unsafe { polychip_runtime_failure(self.ptr(), i, &mut s) };
                check(py, held(e))?;
                Ok(text(s))
            })
            .collect()
    }

    /// A new compact tensor on device `device`: zeros with `zero`, else
    /// uninitialised.
    #[pyo3(signature = (device, dtype, shape, zero = false))]
    fn tensor(
        slf: &Bound<'_, Self>,
        device: Int<u32>,
        dtype: Text,
        shape: Vec<Int<i64>>,
        zero: bool,
    ) -> PyResult<Tensor> {
        let (device, shape) = (device.0, ints(&shape));
        let py = slf.py();
        let code = dtype_code(&dtype.0)?;
        let rt = slf.get().handle;
        let (out, error) = py.detach(move || {
            let mut out = null_mut();
            // SAFETY: `shape` has `len` extents; `out` writable.
            let e = unsafe {
                polychip_tensor_new(
                    rt as *const _,
                    device,
                    code,
                    shape.len() as i32,
                    shape.as_ptr(),
                    zero,
                    &mut out,
                )
            };
            (out as Handle, handle(e))
        });
        check(py, error)?;
        Ok(Tensor::new(out, slf.clone().unbind()))
    }
}

impl Runtime {
    pub(crate) fn ptr(&self) -> *const polychip_runtime_t {
        self.handle as *const polychip_runtime_t
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        polychip_runtime_destroy(self.handle as *mut polychip_runtime_t);
    }
}

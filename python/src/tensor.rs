//! `Tensor`: a strided view of one device's memory.

use std::ptr::null_mut;

use polychip::*;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::Handle;
use crate::errors::{Int, Text, check, exception, handle, held, ints};
use crate::runtime::Runtime;

/// The dtype names Python uses, in `polychip_dtype_t` order.
pub(crate) const DTYPES: [&str; 8] = [
    "float32", "float16", "bfloat16", "float64", "int32", "int64", "uint8", "bool",
];

/// The `polychip_dtype_t` of a dtype name.
pub(crate) fn dtype_code(name: &str) -> PyResult<polychip_dtype_t> {
    DTYPES
        .iter()
        .position(|d| *d == name)
        .map(|i| i as polychip_dtype_t)
        .ok_or_else(|| {
            PyTypeError::new_err(format!(
                "{name:?} is not a polychip dtype (one of {})",
                DTYPES.join(", ")
            ))
        })
}

/// A tensor on a polychip device (any vendor's).
#[pyclass(frozen, module = "polychip._native")]
pub(crate) struct Tensor {
    pub(crate) handle: Handle,
    /// The runtime that made it (device indices are its).
    #[pyo3(get)]
    pub(crate) runtime: Py<Runtime>,
}

impl Tensor {
    pub(crate) fn new(handle: Handle, runtime: Py<Runtime>) -> Tensor {
        Tensor { handle, runtime }
    }

    pub(crate) fn ptr(&self) -> *const polychip_tensor_t {
        self.handle as *const polychip_tensor_t
    }

    pub(crate) fn info(&self, py: Python<'_>) -> PyResult<polychip_tensor_info_t> {
        info_of(py, self.ptr())
    }
}

fn info_of(py: Python<'_>, tensor: *const polychip_tensor_t) -> PyResult<polychip_tensor_info_t> {
    // SAFETY: an all-zero info with its struct_size is a valid out-param.
    let mut info: polychip_tensor_info_t = unsafe { std::mem::zeroed() };
    info.struct_size = size_of::<polychip_tensor_info_t>();
    // SAFETY: writable for its struct_size; libpolychip checks the handle.
    let e = unsafe { polychip_tensor_info(tensor, &mut info) };
    check(py, held(e))?;
    Ok(info)
}

fn dims(ptr: *const i64, ndim: i32) -> Vec<i64> {
    if ndim <= 0 {
        return Vec::new();
    }
    // SAFETY: libpolychip's info points to `ndim` extents owned by the tensor.
    unsafe { std::slice::from_raw_parts(ptr, ndim as usize) }.to_vec()
}

#[pymethods]
impl Tensor {
    /// Its extents.
    #[getter]
    pub(crate) fn shape(&self, py: Python<'_>) -> PyResult<Vec<i64>> {
        let i = self.info(py)?;
        Ok(dims(i.shape, i.ndim))
    }

    /// Its strides, in elements.
    #[getter]
    fn strides(&self, py: Python<'_>) -> PyResult<Vec<i64>> {
        let i = self.info(py)?;
        Ok(dims(i.strides, i.ndim))
    }

    /// Its dtype name (`"float32"`, ...).
    #[getter]
    fn dtype(&self, py: Python<'_>) -> PyResult<&'static str> {
        Ok(DTYPES[self.info(py)?.dtype as usize])
    }

    /// The index of its device in its runtime.
    #[getter]
    fn device_index(&self, py: Python<'_>) -> PyResult<u32> {
        Ok(self.info(py)?.device)
    }

    /// Its number of elements.
    #[getter]
    fn numel(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.info(py)?.numel)
    }

    /// The device address of its first element (host-readable only on
    /// host-visible devices).
    #[getter]
    fn data_ptr(&self, py: Python<'_>) -> PyResult<usize> {
        let i = self.info(py)?;
        Ok(i.data as usize + i.byte_offset as usize)
    }

    /// Whether its elements are compact and row-major.
    #[getter]
    fn is_contiguous(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.info(py)?.contiguous)
    }

    /// Its elements as bytes, row-major (a copy to host memory).
    fn read_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let i = self.info(py)?;
        let n = i.numel as usize * element_size(i.dtype);
        // A view with zero strides can have far more elements than memory
        // (2^40 of one float): refuse it instead of aborting on allocation.
        let mut bytes = Vec::new();
        if bytes.try_reserve_exact(n).is_err() {
            let message = format!(
                "reading the {} tensor of shape {:?} needs {n} bytes of host memory, which could not be allocated",
                DTYPES[i.dtype as usize],
                dims(i.shape, i.ndim)
            );
            return Err(exception(py, POLYCHIP_API_ERROR_OUT_OF_MEMORY, message));
        }
        let t = self.handle;
        let (bytes, error) = py.detach(move || {
            bytes.resize(n, 0);
            // SAFETY: `bytes` is writable for n bytes.
            let e = unsafe { polychip_tensor_read(t as *const _, bytes.as_mut_ptr().cast(), n) };
            (bytes, handle(e))
        });
        check(py, error)?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Writes `data` (bytes: exactly numel x element size, row-major) into
    /// its elements.
    fn write_bytes(&self, py: Python<'_>, data: &[u8]) -> PyResult<()> {
        let bytes = data.to_vec();
        let t = self.handle;
        let error = py.detach(move || {
            // SAFETY: `bytes` is readable for its length.
            handle(unsafe {
                polychip_tensor_write(t as *const _, bytes.as_ptr().cast(), bytes.len())
            })
        });
        check(py, error)
    }

    /// The tensor's `polychip.Device`.
    #[getter]
    fn device<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let index = self.info(py)?.device;
        py.import("polychip")?
            .getattr("Device")?
            .call1((index, self.runtime.clone_ref(py)))
    }

    /// A NumPy array of the tensor: sharing its memory (zero-copy, through
    /// DLPack) when the device's memory is host-visible, else a copy.
    fn numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let np = py.import("numpy")?;
        let me = slf.get();
        let info = me.info(py)?;
        if info.dtype == POLYCHIP_DTYPE_BF16 {
            return Err(PyTypeError::new_err(
                "NumPy has no bfloat16; cast to float32 first (polychip.ops.cast)",
            ));
        }
        if me.dlpack_device(py)?.0 == polychip::POLYCHIP_DLPACK_CPU {
            return np.call_method1("from_dlpack", (slf,));
        }
        let bytes = me.read_bytes(py)?;
        let dtype = DTYPES[info.dtype as usize];
        np.call_method1("frombuffer", (bytes, dtype))?
            .call_method1("reshape", (dims(info.shape, info.ndim),))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let i = self.info(py)?;
        let vendor = self
            .runtime
            .get()
            .device_info(py, Int(i.device))?
            .get_item("vendor")?
            .map(|v| v.to_string())
            .unwrap_or_default();
        Ok(format!(
            "polychip.Tensor(shape={:?}, dtype={}, device={} {vendor})",
            dims(i.shape, i.ndim),
            DTYPES[i.dtype as usize],
            i.device
        ))
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        let i = self.info(py)?;
        match dims(i.shape, i.ndim).first() {
            Some(&d) => Ok(d as usize),
            None => Err(PyTypeError::new_err("len() of a 0-d tensor")),
        }
    }

    /// A compact copy on `device` (an index or a `polychip.Device`) of the
    /// same runtime, of any vendor.
    fn to(&self, py: Python<'_>, device: &Bound<'_, PyAny>) -> PyResult<Tensor> {
        let device = device_index(py, &self.runtime, device)?;
        let (t, rt) = (self.handle, self.runtime.get().handle);
        let (out, error) = py.detach(move || {
            let mut out = null_mut();
            // SAFETY: `out` writable.
            let e = unsafe {
                polychip_tensor_to_device(t as *const _, rt as *const _, device, &mut out)
            };
            (out as Handle, handle(e))
        });
        check(py, error)?;
        Ok(Tensor::new(out, self.runtime.clone_ref(py)))
    }

    /// Copies `src` (same dtype and shape, any device) into this tensor.
    fn copy_(&self, py: Python<'_>, src: &Tensor) -> PyResult<()> {
        let (s, d) = (src.handle, self.handle);
        let error = py.detach(move || handle(polychip_tensor_copy(s as *const _, d as *const _)));
        check(py, error)
    }

    /// `(device_type, device_id)` for DLPack consumers: (1, 0), the CPU,
    /// when the device's memory is host-visible; else (12, index), kDLExtDev
    /// with the device's index in the runtime.
    fn __dlpack_device__(&self, py: Python<'_>) -> PyResult<(i32, i32)> {
        self.dlpack_device(py)
    }

    /// The array API's DLPack export: a `dltensor_versioned` capsule when
    /// `max_version` allows DLPack 1.x, else a legacy `dltensor` one.
    /// Zero-copy where the memory allows; with `dl_device=(1, 0)` on private
    /// memory, a copy flagged as one (`copy=False` refuses it). `stream`: a
    /// `polychip.Stream` whose work the export waits for, or None / -1.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<(Int<u32>, Int<u32>)>,
        dl_device: Option<(Int<i32>, Int<i32>)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let max_version = max_version.map(|(a, b)| (a.0, b.0));
        let dl_device = dl_device.map(|(a, b)| (a.0, b.0));
        self.dlpack(py, stream, max_version, dl_device, copy)
    }

    /// A view of the same memory with its own shape, strides (elements) and
    /// element offset from this view's first element.
    #[pyo3(signature = (shape, strides, offset = Int(0)))]
    fn view(
        &self,
        py: Python<'_>,
        shape: Vec<Int<i64>>,
        strides: Vec<Int<i64>>,
        offset: Int<i64>,
    ) -> PyResult<Tensor> {
        let (shape, strides, offset) = (ints(&shape), ints(&strides), offset.0);
        if shape.len() != strides.len() {
            return Err(PyValueError::new_err(format!(
                "view: shape has {} dimensions but strides {}",
                shape.len(),
                strides.len()
            )));
        }
        let mut out = null_mut();
        // SAFETY: both arrays have `len` entries; `out` writable.
        let e = unsafe {
            polychip_tensor_view(
                self.ptr(),
                shape.len() as i32,
                shape.as_ptr(),
                strides.as_ptr(),
                offset,
                &mut out,
            )
        };
        check(py, held(e))?;
        Ok(Tensor::new(out as Handle, self.runtime.clone_ref(py)))
    }

    /// A view of the same buffer as elements of `dtype`, with its own shape
    /// and strides (in elements of `dtype`), starting `byte_offset` bytes
    /// from the start of the buffer.
    #[pyo3(signature = (dtype, shape, strides, byte_offset = Int(0)))]
    fn reinterpret(
        &self,
        py: Python<'_>,
        dtype: Text,
        shape: Vec<Int<i64>>,
        strides: Vec<Int<i64>>,
        byte_offset: Int<u64>,
    ) -> PyResult<Tensor> {
        let (shape, strides, byte_offset) = (ints(&shape), ints(&strides), byte_offset.0);
        if shape.len() != strides.len() {
            return Err(PyValueError::new_err(format!(
                "reinterpret: shape has {} dimensions but strides {}",
                shape.len(),
                strides.len()
            )));
        }
        let code = dtype_code(&dtype.0)?;
        let mut out = null_mut();
        // SAFETY: both arrays have `len` entries; `out` writable.
        let e = unsafe {
            polychip_tensor_view_as(
                self.ptr(),
                code,
                shape.len() as i32,
                shape.as_ptr(),
                strides.as_ptr(),
                byte_offset,
                &mut out,
            )
        };
        check(py, held(e))?;
        Ok(Tensor::new(out as Handle, self.runtime.clone_ref(py)))
    }

    /// The `polychip_tensor_t *` of this tensor, for native code in the
    /// same process (valid while this object lives).
    #[getter]
    fn _handle(&self) -> usize {
        self.handle
    }

    /// Takes ownership of a `polychip_tensor_t *` that native code in this
    /// process made with `runtime`'s library (checked: a handle that is not
    /// a live tensor is refused).
    #[staticmethod]
    fn _adopt(py: Python<'_>, runtime: Py<Runtime>, handle: Int<usize>) -> PyResult<Tensor> {
        let handle = handle.0;
        info_of(py, handle as *const polychip_tensor_t)?;
        Ok(Tensor::new(handle, runtime))
    }
}

/// A device argument (an index, a `polychip.Device` or a `polychip:N`
/// torch.device) checked against `runtime`'s devices.
fn device_index(py: Python<'_>, runtime: &Py<Runtime>, device: &Bound<'_, PyAny>) -> PyResult<u32> {
    // A polychip.Device (which knows its runtime), or a torch.device of
    // type "polychip"; any other object with an `index` (a torch.device of
    // "cuda" or "meta") names no polychip device, and a bool is no index.
    let torch_polychip = device.get_type().name()? == "device"
        && device
            .getattr("type")
            .and_then(|t| t.extract::<String>())
            .is_ok_and(|t| t == "polychip");
    let refuse = || {
        Err(PyTypeError::new_err(format!(
            "device must be a device index (an int) or a polychip.Device, not {}",
            device
                .repr()
                .map_or_else(|_| "that".to_string(), |r| r.to_string())
        )))
    };
    if device.is_instance_of::<pyo3::types::PyBool>() {
        return refuse();
    }
    let index = if device.hasattr("_runtime")? || torch_polychip {
        if let Ok(other) = device.getattr("_runtime") {
            if !other.is(runtime.bind(py)) {
                let message = format!(
                    "{} belongs to another runtime than the tensor's; its index may name another device there",
                    device.repr()?
                );
                return Err(exception(py, POLYCHIP_API_ERROR_INVALID_ARGUMENT, message));
            }
        }
        device.getattr("index")?
    } else {
        device.clone()
    };
    let count = runtime.get().device_count(py)?;
    let Ok(index) = index
        .call_method0("__index__")
        .and_then(|i| i.extract::<i64>())
    else {
        return refuse();
    };
    u32::try_from(index)
        .ok()
        .filter(|&i| i < count)
        .ok_or_else(|| {
            let message = format!(
                "device {index} does not exist: the runtime has {count} device(s), 0 to {}",
                count.saturating_sub(1)
            );
            exception(py, POLYCHIP_API_ERROR_INVALID_ARGUMENT, message)
        })
}

pub(crate) fn element_size(dtype: polychip_dtype_t) -> usize {
    match dtype {
        POLYCHIP_DTYPE_F32 | POLYCHIP_DTYPE_I32 => 4,
        POLYCHIP_DTYPE_F16 | POLYCHIP_DTYPE_BF16 => 2,
        POLYCHIP_DTYPE_F64 | POLYCHIP_DTYPE_I64 => 8,
        _ => 1,
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        polychip_tensor_destroy(self.handle as *mut polychip_tensor_t);
    }
}

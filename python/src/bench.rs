//! Timing loops for `python/bench/overhead.py`, so that one run measures an
//! operator through the Rust host, through the C API and through Python
//! side by side (hidden from the package's API: `_native._bench_fill`).

use std::path::PathBuf;
use std::time::Instant;

use polychip::polychip_op_fill;
use polychip_host::{DType, LoadOptions, Runtime};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::errors::Int;
use crate::tensor::Tensor;

/// `(ns per call through the Rust host, ns per call through the C API)` of
/// `fill` on `tensor` (the C API) and on a tensor of its shape on the same
/// plugin's device `plugin_device` (the Rust host), `calls` calls each.
#[pyfunction]
pub(crate) fn _bench_fill(
    py: Python<'_>,
    tensor: &Tensor,
    plugin: PathBuf,
    plugin_device: Int<u32>,
    calls: Int<usize>,
) -> PyResult<(f64, f64)> {
    let (plugin_device, calls) = (plugin_device.0, calls.0);
    let shape: Vec<i64> = tensor.shape(py)?;
    let handle = tensor.handle;
    py.detach(move || {
        let runtime = Runtime::load(&[plugin], &LoadOptions::default());
        let device = runtime
            .devices()
            .get(plugin_device as usize)
            .ok_or_else(|| PyRuntimeError::new_err("the plugin has no such device"))?;
        let host = device
            .empty(DType::F32, &shape)
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let exec = device.exec();
        let start = Instant::now();
        for _ in 0..calls {
            exec.fill(std::hint::black_box(&host), 1.0)
                .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        }
        let rust = start.elapsed().as_secs_f64() * 1e9 / calls as f64;
        let start = Instant::now();
        for _ in 0..calls {
            let e = polychip_op_fill(
                std::ptr::null(),
                std::hint::black_box(handle) as *const _,
                1.0,
            );
            if !e.is_null() {
                polychip::polychip_error_destroy(e);
                return Err(PyRuntimeError::new_err("polychip_op_fill failed"));
            }
        }
        let capi = start.elapsed().as_secs_f64() * 1e9 / calls as f64;
        Ok((rust, capi))
    })
}

//! `polychip._native`: libpolychip's C API for Python. The package
//! `polychip` (python/polychip) wraps it; this module holds the handles and
//! turns each API error into the Python exception of its code.
//!
//! Every call into libpolychip that can take a while (operators, copies,
//! collectives, DLPack copies) releases the GIL. Handles cross into those
//! closures as integers: libpolychip checks every handle, so a stale one is
//! an exception, never a crash.

mod bench;
mod comm;
mod dlpack;
mod errors;
mod ops;
mod runtime;
mod stream;
mod tensor;

use pyo3::prelude::*;

/// Handles travel as integers across `Python::detach`.
pub(crate) type Handle = usize;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<runtime::Runtime>()?;
    m.add_class::<tensor::Tensor>()?;
    m.add_class::<stream::Stream>()?;
    m.add_class::<stream::Event>()?;
    m.add_class::<comm::Comm>()?;
    m.add_function(wrap_pyfunction!(dlpack::from_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::api_version, m)?)?;
    m.add_function(wrap_pyfunction!(bench::_bench_fill, m)?)?;
    // Daemon threads in a polychip call at interpreter exit (see
    // errors::handle).
    let at_exit = wrap_pyfunction!(errors::_at_exit, m)?;
    m.py()
        .import("atexit")?
        .call_method1("register", (at_exit,))?;
    let ops = PyModule::new(m.py(), "ops")?;
    ops::register(&ops)?;
    m.add_submodule(&ops)?;
    Ok(())
}

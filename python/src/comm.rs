//! `Comm`: a communicator, and collectives on polychip tensors.

use std::ffi::CString;
use std::ptr::null_mut;

use polychip::*;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::Handle;
use crate::errors::{Int, Text, check, exception, handle, held};
use crate::tensor::Tensor;

/// This process's place in a job of ranks.
#[pyclass(frozen, module = "polychip._native")]
pub(crate) struct Comm {
    handle: std::sync::atomic::AtomicUsize,
}

fn reduce_op(op: &str) -> PyResult<polychip_reduce_op_t> {
    Ok(match op {
        "sum" => POLYCHIP_REDUCE_SUM,
        "avg" => POLYCHIP_REDUCE_AVG,
        "max" => POLYCHIP_REDUCE_MAX,
        "min" => POLYCHIP_REDUCE_MIN,
        "prod" => POLYCHIP_REDUCE_PROD,
        "band" => POLYCHIP_REDUCE_BAND,
        "bor" => POLYCHIP_REDUCE_BOR,
        "bxor" => POLYCHIP_REDUCE_BXOR,
        other => {
            return Err(PyValueError::new_err(format!(
                "op {other:?} is not a reduction (sum, avg, max, min, prod, band, bor, bxor)"
            )));
        }
    })
}

impl Comm {
    fn h(&self) -> Handle {
        self.handle.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The live handle, or the error a closed communicator raises.
    fn live(&self, py: Python<'_>) -> PyResult<Handle> {
        match self.h() {
            0 => Err(exception(
                py,
                POLYCHIP_API_ERROR_INVALID_ARGUMENT,
                "the Comm was closed (Comm.close); join again with polychip.comm.init()".into(),
            )),
            c => Ok(c),
        }
    }

    fn run(&self, py: Python<'_>, f: impl FnOnce(Handle) -> Handle + Send) -> PyResult<()> {
        let c = self.live(py)?;
        let error = py.detach(move || f(c));
        check(py, error)
    }
}

#[pymethods]
impl Comm {
    /// Joins the job the launcher's environment describes (torchrun,
    /// `polychip launch`, mpirun, srun), or, given `rank`, `world_size` and
    /// `master_addr`/`master_port`, the job they describe.
    #[new]
    #[pyo3(signature = (rank = None, world_size = None, master_addr = None, master_port = Int(0)))]
    fn new(
        py: Python<'_>,
        rank: Option<Int<u32>>,
        world_size: Option<Int<u32>>,
        master_addr: Option<Text>,
        master_port: Int<u16>,
    ) -> PyResult<Comm> {
        let (rank, world_size, master_port) =
            (rank.map(|r| r.0), world_size.map(|w| w.0), master_port.0);
        let addr = master_addr
            .map(|a| CString::new(a.0))
            .transpose()
            .map_err(|_| PyValueError::new_err("master_addr contains a NUL byte"))?;
        let (out, error) = match (rank, world_size) {
            (None, None) => py.detach(|| {
                let mut out = null_mut();
                // SAFETY: `out` writable.
                let e = unsafe { polychip_comm_init_env(&mut out) };
                (out as Handle, handle(e))
            }),
            (Some(rank), Some(world_size)) => {
                let addr_ptr = addr.as_ref().map_or(0, |a| a.as_ptr() as usize);
                py.detach(move || {
                    let options = polychip_comm_options_t {
                        struct_size: size_of::<polychip_comm_options_t>(),
                        rank,
                        world_size,
                        master_addr: addr_ptr as *const _,
                        master_port,
                    };
                    let mut out = null_mut();
                    // SAFETY: readable options (the address string outlives the call); `out` writable.
                    let e = unsafe { polychip_comm_init(&options, &mut out) };
                    (out as Handle, handle(e))
                })
            }
            _ => {
                return Err(PyValueError::new_err(
                    "give both rank and world_size, or neither",
                ));
            }
        };
        check(py, error)?;
        Ok(Comm {
            handle: std::sync::atomic::AtomicUsize::new(out),
        })
    }

    /// This rank.
    #[getter]
    fn rank(&self, py: Python<'_>) -> PyResult<u32> {
        let (mut r, mut w) = (0, 0);
        // SAFETY: both writable.
        let e = unsafe { polychip_comm_rank(self.live(py)? as *const _, &mut r, &mut w) };
        check(py, held(e))?;
        Ok(r)
    }

    /// The number of ranks.
    #[getter]
    fn world_size(&self, py: Python<'_>) -> PyResult<u32> {
        let (mut r, mut w) = (0, 0);
        // SAFETY: both writable.
        let e = unsafe { polychip_comm_rank(self.live(py)? as *const _, &mut r, &mut w) };
        check(py, held(e))?;
        Ok(w)
    }

    /// A communicator of the ranks that pass the same `color`, ordered by `key`.
    #[pyo3(signature = (color, key = Int(0)))]
    fn split(&self, py: Python<'_>, color: Int<u32>, key: Int<u32>) -> PyResult<Comm> {
        let (color, key) = (color.0, key.0);
        let c = self.live(py)?;
        let (out, error) = py.detach(move || {
            let mut out = null_mut();
            // SAFETY: `out` writable.
            let e = unsafe { polychip_comm_split(c as *const _, color, key, &mut out) };
            (out as Handle, handle(e))
        });
        check(py, error)?;
        Ok(Comm {
            handle: std::sync::atomic::AtomicUsize::new(out),
        })
    }

    /// Reduces `tensor` across ranks in place.
    #[pyo3(signature = (tensor, op = "sum"))]
    fn all_reduce(&self, py: Python<'_>, tensor: &Tensor, op: &str) -> PyResult<()> {
        let (t, op) = (tensor.handle, reduce_op(op)?);
        self.run(py, move |c| {
            handle(polychip_comm_all_reduce(c as *const _, t as *const _, op))
        })
    }

    /// Every rank's `send`, concatenated in rank order, into `recv`.
    fn all_gather(&self, py: Python<'_>, send: &Tensor, recv: &Tensor) -> PyResult<()> {
        let (s, r) = (send.handle, recv.handle);
        self.run(py, move |c| {
            handle(polychip_comm_all_gather(
                c as *const _,
                s as *const _,
                r as *const _,
            ))
        })
    }

    /// Reduces `send` across ranks; rank r receives the r-th part in `recv`.
    #[pyo3(signature = (send, recv, op = "sum"))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        send: &Tensor,
        recv: &Tensor,
        op: &str,
    ) -> PyResult<()> {
        let (s, r, op) = (send.handle, recv.handle, reduce_op(op)?);
        self.run(py, move |c| {
            handle(polychip_comm_reduce_scatter(
                c as *const _,
                s as *const _,
                r as *const _,
                op,
            ))
        })
    }

    /// Rank `root`'s `tensor` into every rank's.
    #[pyo3(signature = (tensor, root = Int(0)))]
    fn broadcast(&self, py: Python<'_>, tensor: &Tensor, root: Int<u32>) -> PyResult<()> {
        let root = root.0;
        let t = tensor.handle;
        self.run(py, move |c| {
            handle(polychip_comm_broadcast(c as *const _, t as *const _, root))
        })
    }

    /// Reduces `tensor` across ranks into rank `root`'s.
    #[pyo3(signature = (tensor, op = "sum", root = Int(0)))]
    fn reduce(&self, py: Python<'_>, tensor: &Tensor, op: &str, root: Int<u32>) -> PyResult<()> {
        let root = root.0;
        let (t, op) = (tensor.handle, reduce_op(op)?);
        self.run(py, move |c| {
            handle(polychip_comm_reduce(c as *const _, t as *const _, op, root))
        })
    }

    /// Part p of `send` to rank p; rank p's part into part p of `recv`.
    fn all_to_all(&self, py: Python<'_>, send: &Tensor, recv: &Tensor) -> PyResult<()> {
        let (s, r) = (send.handle, recv.handle);
        self.run(py, move |c| {
            handle(polychip_comm_all_to_all(
                c as *const _,
                s as *const _,
                r as *const _,
            ))
        })
    }

    /// Sends `tensor` to rank `peer`.
    fn send(&self, py: Python<'_>, tensor: &Tensor, peer: Int<u32>) -> PyResult<()> {
        let peer = peer.0;
        let t = tensor.handle;
        self.run(py, move |c| {
            handle(polychip_comm_send(c as *const _, t as *const _, peer))
        })
    }

    /// Receives into `tensor` what rank `peer` sends.
    fn recv(&self, py: Python<'_>, tensor: &Tensor, peer: Int<u32>) -> PyResult<()> {
        let peer = peer.0;
        let t = tensor.handle;
        self.run(py, move |c| {
            handle(polychip_comm_recv(c as *const _, t as *const _, peer))
        })
    }

    /// Runs sends and receives together: `ops` is a list of `("send" or
    /// "recv", tensor, peer)`. Ranks that each send before they receive
    /// (a swap, a ring, both directions of a pipeline) do not wait on each
    /// other, as `send` and `recv` of more than 1 MiB would; operations
    /// with one peer in one direction are matched in their order, and a
    /// send to this rank goes to a receive from this rank.
    fn p2p_group(
        &self,
        py: Python<'_>,
        ops: Vec<(Text, PyRef<'_, Tensor>, Int<u32>)>,
    ) -> PyResult<()> {
        let mut raw = Vec::with_capacity(ops.len());
        for (i, (kind, tensor, peer)) in ops.iter().enumerate() {
            let kind = match kind.0.as_str() {
                "send" => POLYCHIP_P2P_SEND,
                "recv" => POLYCHIP_P2P_RECV,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "ops[{i}] is a {other:?}, not a \"send\" or a \"recv\""
                    )));
                }
            };
            raw.push(polychip_comm_p2p_t {
                struct_size: size_of::<polychip_comm_p2p_t>(),
                kind,
                peer: peer.0,
                tensor: tensor.handle as *const _,
            });
        }
        let (at, count) = (raw.as_ptr() as usize, raw.len());
        self.run(py, move |c| {
            // SAFETY: `raw` (at `at`) holds `count` operations and outlives
            // the call; the tensors are held by `ops`.
            handle(unsafe { polychip_comm_p2p_group(c as *const _, at as *const _, count) })
        })
    }

    /// Waits until every rank has called it.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |c| handle(polychip_comm_barrier(c as *const _)))
    }

    /// Leaves the job (a final barrier with the other ranks, then the
    /// connections close). Later calls raise.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let c = self.handle.swap(0, std::sync::atomic::Ordering::AcqRel);
        if c == 0 {
            return Ok(());
        }
        let error = py.detach(move || handle(polychip_comm_destroy(c as *mut _)));
        check(py, error)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        let c = *self.handle.get_mut();
        if c != 0 {
            let e = polychip_comm_destroy(c as *mut polychip_comm_t);
            polychip_error_destroy(e);
        }
    }
}

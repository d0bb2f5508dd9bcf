//! Owning wrappers over the raw `ibverbs-sys` objects the transport uses:
//! device context, protection domain, completion queue, queue pair and
//! memory registrations (with their page-aligned memory). Each frees its
//! object on drop; the owner drops them in dependency order (queue pairs and
//! registrations before the CQ and PD, those before the context). The data
//! path calls (`post_send`, `post_recv`, `poll_cq`) are inline functions in
//! `verbs.h`, so they go through the context's ops table like the C header.

use std::alloc::Layout;
use std::io;
use std::ptr::{self, NonNull};

use ibverbs_sys as ffi;

const PAGE: usize = 4096;

fn check_errno(rc: i32) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc.abs()))
    }
}

fn non_null<T>(p: *mut T) -> io::Result<NonNull<T>> {
    NonNull::new(p).ok_or_else(io::Error::last_os_error)
}

macro_rules! owned {
    ($(#[$doc:meta])* $name:ident, $raw:ty, $free:path) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub(crate) struct $name(NonNull<$raw>);

        // SAFETY: libibverbs objects may be used from any thread; the
        // transport serializes the calls that the verbs API does not allow
        // concurrently on one object (posting to one QP, polling one CQ).
        unsafe impl Send for $name {}
        // SAFETY: as above.
        unsafe impl Sync for $name {}

        impl $name {
            pub fn as_ptr(&self) -> *mut $raw {
                self.0.as_ptr()
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: the object was created by the matching libibverbs
                // call, is freed exactly once, and its owner drops everything
                // created from it first.
                let rc = unsafe { $free(self.0.as_ptr()) };
                if rc != 0 {
                    log::warn!(
                        "verbs: {} failed: {}",
                        stringify!($free),
                        io::Error::from_raw_os_error(rc.abs())
                    );
                }
            }
        }
    };
}

owned!(
    /// An open device.
    Context, ffi::ibv_context, ffi::ibv_close_device
);
owned!(
    /// A protection domain.
    Pd, ffi::ibv_pd, ffi::ibv_dealloc_pd
);
owned!(
    /// A completion queue.
    Cq, ffi::ibv_cq, ffi::ibv_destroy_cq
);
owned!(
    /// A queue pair.
    Qp, ffi::ibv_qp, ffi::ibv_destroy_qp
);

impl Context {
    /// Opens `device`.
    ///
    /// # Safety
    ///
    /// `device` must come from a device list that is still alive.
    pub unsafe fn open(device: *mut ffi::ibv_device) -> io::Result<Context> {
        // SAFETY: the caller guarantees `device` is valid.
        non_null(unsafe { ffi::ibv_open_device(device) }).map(Context)
    }

    /// The attributes of `port`.
    pub fn port(&self, port: u8) -> io::Result<ffi::ibv_port_attr> {
        let mut attr = ffi::ibv_port_attr::default();
        // SAFETY: the context is open; the exported `ibv_query_port` fills
        // at most the compat layout, a prefix of `ibv_port_attr` (the same
        // call the `ibverbs` crate makes).
        check_errno(unsafe { ffi::ibv_query_port(self.as_ptr(), port, (&raw mut attr).cast()) })?;
        Ok(attr)
    }

    /// The populated entries of the GID tables of every port.
    pub fn gid_table(&self, len: usize) -> io::Result<Vec<ffi::ibv_gid_entry>> {
        let mut table = vec![ffi::ibv_gid_entry::default(); len];
        // SAFETY: `table` has room for `len` entries of the size passed.
        let n = unsafe {
            ffi::_ibv_query_gid_table(
                self.as_ptr(),
                table.as_mut_ptr(),
                table.len(),
                0,
                size_of::<ffi::ibv_gid_entry>(),
            )
        };
        if n < 0 {
            return Err(io::Error::from_raw_os_error((-n) as i32));
        }
        table.truncate(n as usize);
        Ok(table)
    }

    pub fn alloc_pd(&self) -> io::Result<Pd> {
        // SAFETY: the context is open.
        non_null(unsafe { ffi::ibv_alloc_pd(self.as_ptr()) }).map(Pd)
    }

    pub fn create_cq(&self, entries: i32) -> io::Result<Cq> {
        // SAFETY: the context is open; no context pointer, channel or vector.
        non_null(unsafe {
            ffi::ibv_create_cq(self.as_ptr(), entries, ptr::null_mut(), ptr::null_mut(), 0)
        })
        .map(Cq)
    }
}

impl Pd {
    /// Creates a reliable-connected queue pair on `cq` (send and receive).
    pub fn create_rc_qp(&self, cq: &Cq, send_wr: u32, recv_wr: u32) -> io::Result<Qp> {
        let mut init = ffi::ibv_qp_init_attr {
            send_cq: cq.as_ptr(),
            recv_cq: cq.as_ptr(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: send_wr,
                max_recv_wr: recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
            ..Default::default()
        };
        // SAFETY: the PD and CQ are alive; `init` is a valid attribute set.
        non_null(unsafe { ffi::ibv_create_qp(self.as_ptr(), &raw mut init) }).map(Qp)
    }
}

impl Cq {
    /// Polls up to `wcs.len()` completions; returns how many were written.
    pub fn poll(&self, wcs: &mut [ffi::ibv_wc]) -> io::Result<usize> {
        let cq = self.as_ptr();
        // SAFETY: the CQ is alive, so its context is too; `poll_cq` is set by
        // every provider. The caller serializes polls of this CQ.
        let n = unsafe {
            let poll = (*(*cq).context).ops.poll_cq.ok_or_else(|| {
                io::Error::new(io::ErrorKind::Unsupported, "provider has no poll_cq")
            })?;
            poll(cq, wcs.len() as i32, wcs.as_mut_ptr())
        };
        if n < 0 {
            return Err(io::Error::other(format!("ibv_poll_cq failed ({n})")));
        }
        Ok(n as usize)
    }
}

impl Qp {
    pub fn num(&self) -> u32 {
        // SAFETY: the QP is alive; `qp_num` is set at creation and constant.
        unsafe { (*self.as_ptr()).qp_num }
    }

    pub fn modify(
        &self,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
    ) -> io::Result<()> {
        // SAFETY: the QP is alive; `attr` is valid for the fields in `mask`.
        check_errno(unsafe { ffi::ibv_modify_qp(self.as_ptr(), attr, mask.0 as i32) })
    }

    /// Posts one send work request.
    ///
    /// # Safety
    ///
    /// The memory `wr` gathers from must stay registered and unchanged until
    /// its completion is polled; the caller serializes posts to this QP.
    pub unsafe fn post_send(&self, wr: &mut ffi::ibv_send_wr) -> io::Result<()> {
        let qp = self.as_ptr();
        let mut bad = ptr::null_mut();
        // SAFETY: the QP and its context are alive; the caller upholds the
        // buffer rules; `post_send` is set by every provider.
        check_errno(unsafe {
            let post = (*(*qp).context).ops.post_send.ok_or_else(|| {
                io::Error::new(io::ErrorKind::Unsupported, "provider has no post_send")
            })?;
            post(qp, wr, &mut bad)
        })
    }

    /// Posts one receive with no scatter entries (for writes with immediate,
    /// which consume a receive but deliver no bytes into it).
    pub fn post_empty_recv(&self, wr_id: u64) -> io::Result<()> {
        let qp = self.as_ptr();
        let mut wr = ffi::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: ptr::null_mut(),
            num_sge: 0,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: the QP and its context are alive; the request gathers no
        // memory; posts to one QP's receive queue are serialized by the
        // caller (the CQ poller, or setup before any poller exists).
        check_errno(unsafe {
            let post = (*(*qp).context).ops.post_recv.ok_or_else(|| {
                io::Error::new(io::ErrorKind::Unsupported, "provider has no post_recv")
            })?;
            post(qp, &mut wr, &mut bad)
        })
    }
}

/// Page-aligned, zeroed, pre-faulted memory registered with a PD.
#[derive(Debug)]
pub(crate) struct Registered {
    mr: NonNull<ffi::ibv_mr>,
    mem: NonNull<u8>,
    layout: Layout,
    len: usize,
}

// SAFETY: the registration and its memory are owned here; which thread
// touches which bytes when is governed by the transport contract.
unsafe impl Send for Registered {}
// SAFETY: as above; the struct itself is not mutated after creation.
unsafe impl Sync for Registered {}

impl Registered {
    /// Allocates `len` bytes and registers them with `access`.
    pub fn new(pd: &Pd, len: usize, access: ffi::ibv_access_flags) -> io::Result<Registered> {
        let layout = Layout::from_size_align(len.max(1).next_multiple_of(PAGE), PAGE)
            .map_err(io::Error::other)?;
        // SAFETY: the layout has a non-zero size.
        let mem = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        for page in (0..layout.size()).step_by(PAGE) {
            // SAFETY: `page` is inside the allocation.
            unsafe { mem.as_ptr().add(page).write_volatile(0) };
        }
        // SAFETY: the PD is alive and [mem, mem + size) is owned memory that
        // outlives the registration (deregistered first in `drop`).
        let mr = unsafe {
            ffi::ibv_reg_mr(
                pd.as_ptr(),
                mem.as_ptr().cast(),
                layout.size(),
                access.0 as i32,
            )
        };
        match NonNull::new(mr) {
            Some(mr) => Ok(Registered {
                mr,
                mem,
                layout,
                len,
            }),
            None => {
                let e = io::Error::last_os_error();
                // SAFETY: allocated above with `layout`, not registered.
                unsafe { std::alloc::dealloc(mem.as_ptr(), layout) };
                Err(e)
            }
        }
    }

    pub fn ptr(&self) -> *mut u8 {
        self.mem.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: the registration is alive; keys are constant.
        unsafe { self.mr.as_ref().lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { self.mr.as_ref().rkey }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        // SAFETY: the registration is deregistered once, before its memory
        // (allocated with `self.layout`) is freed.
        unsafe {
            let rc = ffi::ibv_dereg_mr(self.mr.as_ptr());
            if rc != 0 {
                log::warn!("verbs: ibv_dereg_mr failed ({rc}); leaking its memory");
                return;
            }
            std::alloc::dealloc(self.mem.as_ptr(), self.layout);
        }
    }
}

/// The text libibverbs gives a work completion status.
pub(crate) fn wc_status_str(status: ffi::ibv_wc_status::Type) -> String {
    // SAFETY: returns a pointer to a static string for any status.
    let p = unsafe { ffi::ibv_wc_status_str(status) };
    if p.is_null() {
        return format!("status {status}");
    }
    // SAFETY: non-null, NUL-terminated, static.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

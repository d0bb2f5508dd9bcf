//! Hostile input at the C API, as a framework with a bug (or a fuzzer)
//! would pass it: NULL out-params, handles freed twice or of the wrong kind,
//! destroyed from several threads at once, DLPack tensors imported twice or
//! through the wrong function, lying about their device, dtype, layout or
//! version, host buffers overlapping the tensor they fill, roots that are no
//! rank, allocations no device holds. Each call either works or fails with
//! an error naming the argument and the bad value: no crash, no abort, no
//! hang.
//!
//! Needs the bundled plugins built (`cargo build --workspace`).

use std::ffi::c_void;
use std::ptr::{null, null_mut};

use polychip::*;

mod calls;
use calls::{device_of, ok, read, refused, runtime, take, tensor};

/// Refused with `code`, the message containing every one of `says`.
fn refused_saying(error: *mut polychip_error_t, code: u32, says: &[&str]) -> String {
    let (got, message) = refused(error);
    assert_eq!(got, code, "{message}");
    for s in says {
        assert!(message.contains(s), "wanted {s:?} in: {message}");
    }
    message
}

fn info(t: *const polychip_tensor_t) -> polychip_tensor_info_t {
    // SAFETY: an all-zero info with its struct_size is a valid out-param.
    let mut info: polychip_tensor_info_t = unsafe { std::mem::zeroed() };
    info.struct_size = size_of::<polychip_tensor_info_t>();
    // SAFETY: writable for its struct_size.
    ok(unsafe { polychip_tensor_info(t, &mut info) });
    info
}

/// Every function with an out-param refuses a NULL one, naming it, and
/// writes nothing.
#[test]
fn every_null_out_param_is_refused_naming_it() {
    let rt = runtime();
    let f = device_of(rt, "Ferrite");
    let t = tensor(rt, f, &[1.0, 2.0]);
    let shape = [2i64];
    let mut stream = null_mut();
    // SAFETY: `stream` writable.
    ok(unsafe { polychip_stream_new(rt, f, &mut stream) });
    // SAFETY: each call gets a NULL out-param, which is checked first.
    let calls: Vec<(&str, *mut polychip_error_t, &str)> = unsafe {
        vec![
            (
                "runtime_new",
                polychip_runtime_new(null(), null_mut()),
                "out is NULL",
            ),
            (
                "options_init",
                polychip_runtime_options_init(null_mut()),
                "options is NULL",
            ),
            (
                "device_count",
                polychip_runtime_device_count(rt, null_mut()),
                "out is NULL",
            ),
            (
                "device_info",
                polychip_runtime_device_info(rt, 0, null_mut()),
                "info is NULL",
            ),
            (
                "failure_count",
                polychip_runtime_failure_count(rt, null_mut()),
                "out is NULL",
            ),
            (
                "failure",
                polychip_runtime_failure(rt, 0, null_mut()),
                "out is NULL",
            ),
            (
                "tensor_new",
                polychip_tensor_new(
                    rt,
                    f,
                    POLYCHIP_DTYPE_F32,
                    1,
                    shape.as_ptr(),
                    false,
                    null_mut(),
                ),
                "out is NULL",
            ),
            (
                "tensor_view",
                polychip_tensor_view(t, 1, shape.as_ptr(), [1i64].as_ptr(), 0, null_mut()),
                "out is NULL",
            ),
            (
                "tensor_view_as",
                polychip_tensor_view_as(t, 0, 1, shape.as_ptr(), [1i64].as_ptr(), 0, null_mut()),
                "out is NULL",
            ),
            (
                "tensor_info",
                polychip_tensor_info(t, null_mut()),
                "info is NULL",
            ),
            (
                "tensor_to_device",
                polychip_tensor_to_device(t, rt, f, null_mut()),
                "out is NULL",
            ),
            (
                "to_dlpack",
                polychip_tensor_to_dlpack(t, 0, -1, null(), null_mut()),
                "out is NULL",
            ),
            (
                "to_dlpack_legacy",
                polychip_tensor_to_dlpack_legacy(t, 0, -1, null(), null_mut()),
                "out is NULL",
            ),
            (
                "from_dlpack",
                polychip_tensor_from_dlpack(rt, null_mut(), -1, null_mut()),
                "out is NULL",
            ),
            (
                "from_dlpack (managed)",
                polychip_tensor_from_dlpack(rt, null_mut(), -1, &mut null_mut()),
                "managed is NULL",
            ),
            (
                "from_dlpack_legacy (managed)",
                polychip_tensor_from_dlpack_legacy(rt, null_mut(), -1, &mut null_mut()),
                "managed is NULL",
            ),
            (
                "stream_new",
                polychip_stream_new(rt, f, null_mut()),
                "out is NULL",
            ),
            (
                "stream_record",
                polychip_stream_record(stream, null_mut()),
                "out is NULL",
            ),
            (
                "comm_init",
                polychip_comm_init(null(), null_mut()),
                "out is NULL",
            ),
            (
                "comm_init (options)",
                polychip_comm_init(null(), &mut null_mut()),
                "options is NULL",
            ),
            (
                "comm_init_env",
                polychip_comm_init_env(null_mut()),
                "out is NULL",
            ),
            (
                "comm_split",
                polychip_comm_split(null(), 0, 0, null_mut()),
                "out is NULL",
            ),
            (
                "tensor_view (shape)",
                polychip_tensor_view(t, 1, null(), [1i64].as_ptr(), 0, &mut null_mut()),
                "shape is NULL for ndim 1",
            ),
            (
                "tensor_view_as (strides)",
                polychip_tensor_view_as(t, 0, 1, shape.as_ptr(), null(), 0, &mut null_mut()),
                "strides is NULL for ndim 1",
            ),
            (
                "tensor_new (shape)",
                polychip_tensor_new(rt, f, 0, 2, null(), false, &mut null_mut()),
                "shape is NULL for ndim 2",
            ),
            (
                "tensor_write",
                polychip_tensor_write(t, null(), 8),
                "src is NULL for 8 bytes",
            ),
            (
                "tensor_read",
                polychip_tensor_read(t, null_mut(), 8),
                "dst is NULL for 8 bytes",
            ),
        ]
    };
    for (what, error, says) in calls {
        let (code, message) = refused(error);
        assert_eq!(
            code, POLYCHIP_API_ERROR_INVALID_ARGUMENT,
            "{what}: {message}"
        );
        assert!(message.contains(says), "{what}: {message}");
    }
    polychip_stream_destroy(stream);
    polychip_tensor_destroy(t);
    polychip_runtime_destroy(rt);
}

/// Every destroy takes NULL, a handle of another kind, a made-up value and
/// a handle destroyed already without crashing, and without destroying
/// the other kind's object.
#[test]
fn destroys_of_wrong_dead_or_made_up_handles_are_ignored() {
    let rt = runtime();
    let f = device_of(rt, "Ferrite");
    let t = tensor(rt, f, &[5.0]);
    let mut stream = null_mut();
    // SAFETY: `stream` writable.
    ok(unsafe { polychip_stream_new(rt, f, &mut stream) });
    let mut event = null_mut();
    // SAFETY: `event` writable.
    ok(unsafe { polychip_stream_record(stream, &mut event) });
    let made_up: *mut c_void = std::ptr::without_provenance_mut(0x5300_0000_0000_1234);
    let wild: *mut c_void = std::ptr::without_provenance_mut(usize::MAX);
    for h in [
        null_mut(),
        made_up,
        wild,
        t.cast(),
        stream.cast(),
        event.cast(),
        rt.cast(),
    ] {
        // Each destroy gets handles of every kind; only its own kind's is
        // destroyed (and those come last, below).
        if h != rt.cast() {
            polychip_runtime_destroy(h.cast());
        }
        if h != t.cast() {
            polychip_tensor_destroy(h.cast());
        }
        if h != stream.cast() {
            polychip_stream_destroy(h.cast());
        }
        if h != event.cast() {
            polychip_event_destroy(h.cast());
        }
        polychip_error_destroy(h.cast());
        if !h.is_null() {
            let (code, message) = refused(polychip_comm_destroy(h.cast()));
            assert_eq!(code, POLYCHIP_API_ERROR_INVALID_ARGUMENT, "{message}");
            assert!(message.contains("comm is "), "{message}");
        }
    }
    // Everything is still alive and works.
    assert_eq!(read(t, 1), [5.0]);
    ok(polychip_stream_synchronize(stream));
    ok(polychip_event_synchronize(event));
    polychip_event_destroy(event);
    polychip_event_destroy(event);
    let (_, message) = refused(polychip_event_synchronize(event));
    assert!(
        message.contains("event is not a live polychip_event_t"),
        "{message}"
    );
    polychip_stream_destroy(stream);
    polychip_tensor_destroy(t);
    polychip_tensor_destroy(t);
    let (_, message) = refused(polychip_op_fill(null(), t, 1.0));
    assert!(
        message.contains("out is not a live polychip_tensor_t"),
        "{message}"
    );
    polychip_runtime_destroy(rt);
    polychip_runtime_destroy(rt);
    let mut n = 0;
    // SAFETY: `n` writable.
    let (_, message) = refused(unsafe { polychip_runtime_device_count(rt, &mut n) });
    assert!(
        message.contains("runtime is not a live polychip_runtime_t"),
        "{message}"
    );
}

/// One handle destroyed by eight threads at once is destroyed once; the
/// others are ignored. Handles used by some threads while others destroy
/// theirs stay consistent (each call works or names a dead handle).
#[test]
fn handles_destroyed_and_used_from_several_threads_at_once() {
    let rt = runtime();
    let (f, c) = (device_of(rt, "Ferrite"), device_of(rt, "Cobalt"));
    let rt_addr = rt as usize;
    for round in 0..20 {
        let t = tensor(rt, if round % 2 == 0 { f } else { c }, &[1.0, 2.0, 3.0]) as usize;
        let threads: Vec<_> = (0..8)
            .map(|k| {
                std::thread::spawn(move || {
                    let t = t as *mut polychip_tensor_t;
                    if k % 2 == 0 {
                        polychip_tensor_destroy(t);
                    } else {
                        // Works or names the dead handle; never a crash.
                        if let Err((code, message)) = take(polychip_op_scale(null(), t, 2.0)) {
                            assert_eq!(code, POLYCHIP_API_ERROR_INVALID_ARGUMENT, "{message}");
                            assert!(
                                message.contains("not a live polychip_tensor_t"),
                                "{message}"
                            );
                        }
                        let mut out = null_mut();
                        // SAFETY: `out` writable.
                        let e = unsafe {
                            polychip_tensor_to_device(t, rt_addr as *const _, 0, &mut out)
                        };
                        match take(e) {
                            Ok(()) => polychip_tensor_destroy(out),
                            Err((_, message)) => {
                                assert!(message.contains("not a live"), "{message}")
                            }
                        }
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().expect("no thread panics");
        }
    }
    polychip_runtime_destroy(rt);
}

/// A host buffer that is the tensor's own memory (a host-visible device's,
/// found through `polychip_tensor_info`), or overlaps it shifted, fills and
/// is filled correctly: the copies used to be `memcpy`s of overlapping
/// ranges (undefined; a debug build aborts on it).
#[test]
fn a_host_buffer_overlapping_the_tensor_it_fills_is_copied_correctly() {
    let rt = runtime();
    let f = device_of(rt, "Ferrite");
    let values: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let t = tensor(rt, f, &values);
    let i = info(t);
    // SAFETY: Ferrite's memory is host-visible: the data pointer addresses
    // the tensor's 8 floats.
    let data = unsafe { i.data.cast::<u8>().add(i.byte_offset as usize) };
    // The tensor's own bytes, written onto themselves.
    // SAFETY: 32 readable bytes.
    ok(unsafe { polychip_tensor_write(t, data.cast(), 32) });
    assert_eq!(read(t, 8), values);
    // A view of the last 4 floats filled from the first 4 (overlapping
    // neither) and then the first 6 from floats 2..8 (overlapping).
    let (six, one) = ([6i64], [1i64]);
    let mut head = null_mut();
    // SAFETY: one extent and stride; `head` writable.
    ok(unsafe { polychip_tensor_view(t, 1, six.as_ptr(), one.as_ptr(), 0, &mut head) });
    // SAFETY: floats 2..8 are 24 readable bytes of the same buffer.
    ok(unsafe { polychip_tensor_write(head, data.add(8).cast(), 24) });
    assert_eq!(read(t, 8), [2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 6.0, 7.0]);
    // And read into itself shifted the other way.
    let mut tail = null_mut();
    // SAFETY: as above.
    ok(unsafe { polychip_tensor_view(t, 1, six.as_ptr(), one.as_ptr(), 2, &mut tail) });
    // SAFETY: floats 0..6 are 24 writable bytes of the same buffer.
    ok(unsafe { polychip_tensor_read(tail, data.cast(), 24) });
    assert_eq!(read(t, 8), [4.0, 5.0, 6.0, 7.0, 6.0, 7.0, 6.0, 7.0]);
    for h in [head, tail, t] {
        polychip_tensor_destroy(h);
    }
    polychip_runtime_destroy(rt);
}

/// A DLPack tensor polychip exported, imported a second time (the first
/// import owns it), or through the function of the other struct layout
/// (a versioned struct read as a legacy one), is refused naming why: the
/// second import used to share memory the first one's deleter freed.
#[test]
fn a_polychip_export_imported_twice_or_as_the_other_layout_is_refused() {
    let rt = runtime();
    let c = device_of(rt, "Cobalt");
    let t = tensor(rt, c, &[1.0, 2.0]);
    let mut m = null_mut();
    // SAFETY: `m` writable.
    ok(unsafe { polychip_tensor_to_dlpack(t, POLYCHIP_DLPACK_EXT_DEV, -1, null(), &mut m) });
    let (mut first, mut second) = (null_mut(), null_mut());
    // SAFETY: a live managed tensor; `first` writable.
    ok(unsafe { polychip_tensor_from_dlpack(rt, m, -1, &mut first) });
    // SAFETY: still live: the first import holds it.
    refused_saying(
        unsafe { polychip_tensor_from_dlpack(rt, m, -1, &mut second) },
        POLYCHIP_API_ERROR_INVALID_ARGUMENT,
        &["managed was imported already", "once"],
    );
    assert!(second.is_null());
    // SAFETY: as above, read through the other layout.
    refused_saying(
        unsafe { polychip_tensor_from_dlpack_legacy(rt, m.cast(), -1, &mut second) },
        POLYCHIP_API_ERROR_INVALID_ARGUMENT,
        &["managed is a DLPack 1.x", "polychip_tensor_from_dlpack"],
    );
    polychip_tensor_destroy(t);
    assert_eq!(read(first, 2), [1.0, 2.0]);
    polychip_tensor_destroy(first);

    // A legacy export handed to the versioned import, then to its own.
    let t = tensor(rt, c, &[3.0]);
    let mut legacy = null_mut();
    // SAFETY: `legacy` writable.
    ok(unsafe {
        polychip_tensor_to_dlpack_legacy(t, POLYCHIP_DLPACK_EXT_DEV, -1, null(), &mut legacy)
    });
    let mut out = null_mut();
    // SAFETY: a live legacy managed tensor, passed as a versioned one.
    refused_saying(
        unsafe { polychip_tensor_from_dlpack(rt, legacy.cast(), -1, &mut out) },
        POLYCHIP_API_ERROR_INVALID_ARGUMENT,
        &["managed is a legacy", "polychip_tensor_from_dlpack_legacy"],
    );
    // SAFETY: the same, through its own function.
    ok(unsafe { polychip_tensor_from_dlpack_legacy(rt, legacy, -1, &mut out) });
    // SAFETY: imported already.
    refused_saying(
        unsafe { polychip_tensor_from_dlpack_legacy(rt, legacy, -1, &mut second) },
        POLYCHIP_API_ERROR_INVALID_ARGUMENT,
        &["managed was imported already"],
    );
    polychip_tensor_destroy(t);
    assert_eq!(read(out, 1), [3.0]);
    polychip_tensor_destroy(out);
    polychip_runtime_destroy(rt);
}

/// A managed tensor over `data` with `shape` (and `strides`, NULL for
/// compact), no deleter.
fn managed(
    data: *mut c_void,
    shape: &mut [i64],
    strides: Option<&mut [i64]>,
    device: (i32, i32),
    dtype: (u8, u8, u16),
) -> polychip_dlpack_versioned_t {
    polychip_dlpack_versioned_t {
        version: polychip_dlpack_version_t { major: 1, minor: 0 },
        manager_ctx: null_mut(),
        deleter: None,
        flags: 0,
        dl_tensor: polychip_dlpack_tensor_t {
            data,
            device: polychip_dlpack_device_t {
                device_type: device.0,
                device_id: device.1,
            },
            ndim: shape.len() as i32,
            dtype: polychip_dlpack_dtype_t {
                code: dtype.0,
                bits: dtype.1,
                lanes: dtype.2,
            },
            shape: shape.as_mut_ptr(),
            strides: strides.map_or(null_mut(), |s| s.as_mut_ptr()),
            byte_offset: 0,
        },
    }
}

/// DLPack tensors that lie (another vendor's device, a dtype of lanes or
/// bits polychip has not, an ndim out of range, a device index no runtime
/// has) are refused naming the field and its value, and what polychip
/// takes instead.
#[test]
fn lying_dlpack_tensors_are_refused_naming_the_field_and_value() {
    let rt = runtime();
    let mut data = [1.0f32, 2.0, 3.0, 4.0];
    let ptr = data.as_mut_ptr().cast::<c_void>();
    let mut out = null_mut();
    let f32_ = (2, 32, 1);
    let mut shape = [4i64];
    for (device, says) in [
        ((2, 0), "kDLCUDA (2)"),
        ((10, 0), "kDLROCM (10)"),
        ((4, 0), "kDLOpenCL (4)"),
        ((14, 0), "kDLOneAPI (14)"),
        ((-5, 0), "device type -5"),
        ((99, 0), "device type 99"),
    ] {
        let mut m = managed(ptr, &mut shape, None, device, f32_);
        // SAFETY: a readable managed tensor; `out` writable.
        refused_saying(
            unsafe { polychip_tensor_from_dlpack(rt, &mut m, -1, &mut out) },
            POLYCHIP_API_ERROR_INVALID_ARGUMENT,
            &[says, "kDLCPU (1)", "kDLExtDev (12)"],
        );
    }
    for (dtype, says) in [
        ((2, 32, 4), "lanes 4"),
        ((2, 7, 1), "bits 7"),
        ((0, 16, 1), "int16"),
        ((1, 32, 1), "uint32"),
        ((5, 64, 1), "complex"),
        ((200, 8, 1), "code 200"),
        ((2, 32, 0), "lanes 0"),
    ] {
        let mut m = managed(ptr, &mut shape, None, (1, 0), dtype);
        // SAFETY: as above.
        refused_saying(
            unsafe { polychip_tensor_from_dlpack(rt, &mut m, -1, &mut out) },
            POLYCHIP_API_ERROR_INVALID_ARGUMENT,
            &[says, "has no polychip dtype", "float32"],
        );
    }
    for ndim in [-1, -2_147_483_648, 65, i32::MAX] {
        let mut m = managed(ptr, &mut shape, None, (1, 0), f32_);
        m.dl_tensor.ndim = ndim;
        // SAFETY: the extents are not read for an ndim out of range.
        refused_saying(
            unsafe { polychip_tensor_from_dlpack(rt, &mut m, -1, &mut out) },
            POLYCHIP_API_ERROR_INVALID_ARGUMENT,
            &[&format!("ndim {ndim} is out of range")],
        );
    }
    for (device, target, says) in [
        ((12, 99), -1, "device 99 does not exist"),
        ((12, -1), -1, "device -1 does not exist"),
        (
            (1, 0),
            i64::MAX,
            "device 9223372036854775807 does not exist",
        ),
        (
            (1, 0),
            i64::from(u32::MAX) + 1,
            "device 4294967296 does not exist",
        ),
        (
            (1, 0),
            i64::MIN,
            "device -9223372036854775808 is not a device index",
        ),
    ] {
        let mut m = managed(ptr, &mut shape, None, device, f32_);
        // SAFETY: as above.
        refused_saying(
            unsafe { polychip_tensor_from_dlpack(rt, &mut m, target, &mut out) },
            POLYCHIP_API_ERROR_INVALID_ARGUMENT,
            &[says],
        );
    }
    // Device memory polychip holds, named with a misaligned offset, as
    // read-only (it would be written), past its end, or on another device.
    let c = device_of(rt, "Cobalt");
    let f = device_of(rt, "Ferrite");
    let owner = tensor(rt, c, &[1.0, 2.0, 3.0, 4.0]);
    let on_cobalt = info(owner).data;
    for (device, offset, flags, extent, says) in [
        (
            c,
            2u64,
            0u64,
            1i64,
            "byte_offset 2 is not a multiple of its 4-byte elements",
        ),
        (
            c,
            0,
            POLYCHIP_DLPACK_FLAG_READ_ONLY,
            4,
            "read-only kDLExtDev tensor cannot be imported",
        ),
        (c, 0, 0, 5, "not inside memory polychip allocated"),
        (c, 16, 0, 1, "not inside memory polychip allocated"),
        (f, 0, 0, 4, "not inside memory polychip allocated"),
    ] {
        let mut shape = [extent];
        let mut m = managed(on_cobalt, &mut shape, None, (12, device as i32), f32_);
        m.dl_tensor.byte_offset = offset;
        m.flags = flags;
        // SAFETY: a readable managed tensor (its memory is checked before use).
        refused_saying(
            unsafe { polychip_tensor_from_dlpack(rt, &mut m, -1, &mut out) },
            POLYCHIP_API_ERROR_INVALID_ARGUMENT,
            &[says],
        );
    }
    polychip_tensor_destroy(owner);
    // Zero and negative strides over host memory in range are copied as
    // the layout says; 0-size and 0-d tensors import.
    let mut strides = [-1i64];
    let mut m = managed(ptr, &mut shape, Some(&mut strides), (1, 0), f32_);
    m.dl_tensor.byte_offset = 12;
    // SAFETY: elements 3, 2, 1, 0 of `data`.
    ok(unsafe { polychip_tensor_from_dlpack(rt, &mut m, -1, &mut out) });
    assert_eq!(read(out, 4), [4.0, 3.0, 2.0, 1.0]);
    polychip_tensor_destroy(out);
    let mut zero = [0i64, 3];
    let mut m = managed(null_mut(), &mut zero, None, (1, 0), f32_);
    // SAFETY: no element is read.
    ok(unsafe { polychip_tensor_from_dlpack(rt, &mut m, -1, &mut out) });
    assert_eq!(info(out).numel, 0);
    polychip_tensor_destroy(out);
    let mut m = managed(ptr, &mut [], None, (1, 0), f32_);
    m.dl_tensor.shape = null_mut();
    // SAFETY: one element of `data`, no extents read for ndim 0.
    ok(unsafe { polychip_tensor_from_dlpack(rt, &mut m, -1, &mut out) });
    assert_eq!((info(out).ndim, read(out, 1)[0]), (0, 1.0));
    polychip_tensor_destroy(out);
    polychip_runtime_destroy(rt);
}

/// Tensors, streams, events and exports outlive the runtime that made
/// them: every call on them after `polychip_runtime_destroy` works, and
/// the runtime's own calls name it destroyed.
#[test]
fn calls_after_the_runtime_is_destroyed_work_or_name_it() {
    let rt = runtime();
    let c = device_of(rt, "Cobalt");
    let t = tensor(rt, c, &[1.0, 2.0]);
    let mut s = null_mut();
    // SAFETY: `s` writable.
    ok(unsafe { polychip_stream_new(rt, c, &mut s) });
    polychip_runtime_destroy(rt);
    ok(polychip_op_scale(s, t, 3.0));
    ok(polychip_stream_synchronize(s));
    assert_eq!(read(t, 2), [3.0, 6.0]);
    let mut m = null_mut();
    // SAFETY: `m` writable.
    ok(unsafe { polychip_tensor_to_dlpack(t, POLYCHIP_DLPACK_CPU, -1, null(), &mut m) });
    // SAFETY: a live managed tensor of 2 floats in host memory (a copy).
    unsafe {
        assert_eq!(*(*m).dl_tensor.data.cast::<f32>().add(1), 6.0);
        ((*m).deleter.unwrap())(m);
    }
    let mut out = null_mut();
    // SAFETY: `out` writable.
    refused_saying(
        unsafe { polychip_tensor_to_device(t, rt, 0, &mut out) },
        POLYCHIP_API_ERROR_INVALID_ARGUMENT,
        &["runtime is not a live polychip_runtime_t (it was destroyed)"],
    );
    // SAFETY: as above.
    refused_saying(
        unsafe { polychip_stream_new(rt, 0, &mut s.cast()) },
        POLYCHIP_API_ERROR_INVALID_ARGUMENT,
        &["runtime is not a live"],
    );
    polychip_stream_destroy(s);
    polychip_tensor_destroy(t);
}

/// Allocations no device or host holds fail with OUT_OF_MEMORY naming the
/// size (they never reach the allocator as an abort), on both vendors.
#[test]
fn allocations_no_device_holds_fail_with_a_message() {
    let rt = runtime();
    for name in ["Ferrite", "Cobalt"] {
        let d = device_of(rt, name);
        for shape in [[1i64 << 40], [1i64 << 36]] {
            let mut t = null_mut();
            // SAFETY: one extent; `t` writable.
            let message = refused_saying(
                unsafe {
                    polychip_tensor_new(rt, d, POLYCHIP_DTYPE_F32, 1, shape.as_ptr(), true, &mut t)
                },
                POLYCHIP_API_ERROR_OUT_OF_MEMORY,
                &[name, &format!("{} bytes", shape[0] * 4)],
            );
            assert!(t.is_null(), "{message}");
        }
        // ndim out of range, extents negative or overflowing.
        for (ndim, shape, says) in [
            (-1, vec![1i64], "ndim -1 is negative"),
            (65, vec![1; 65], "ndim 65 is above the 64"),
            (1, vec![-3], "negative extent -3"),
            (2, vec![1 << 62, 4], "overflows 64-bit sizes"),
        ] {
            let mut t = null_mut();
            // SAFETY: `shape` holds `ndim` extents where ndim is positive.
            refused_saying(
                unsafe {
                    polychip_tensor_new(
                        rt,
                        d,
                        POLYCHIP_DTYPE_F32,
                        ndim,
                        shape.as_ptr(),
                        false,
                        &mut t,
                    )
                },
                POLYCHIP_API_ERROR_INVALID_ARGUMENT,
                &[says],
            );
        }
    }
    polychip_runtime_destroy(rt);
}

/// A broadcast or reduce root that is no rank is refused naming it, at
/// once (it used to be indexed into the connections, or waited for).
#[test]
fn a_root_that_is_no_rank_is_refused() {
    let options = polychip_comm_options_t {
        struct_size: size_of::<polychip_comm_options_t>(),
        rank: 0,
        world_size: 1,
        master_addr: null(),
        master_port: 0,
    };
    let mut comm = null_mut();
    // SAFETY: readable options; `comm` writable.
    ok(unsafe { polychip_comm_init(&options, &mut comm) });
    let rt = runtime();
    let t = tensor(rt, device_of(rt, "Cobalt"), &[1.0]);
    for root in [1u32, 7, u32::MAX] {
        let start = std::time::Instant::now();
        refused_saying(
            polychip_comm_broadcast(comm, t, root),
            POLYCHIP_API_ERROR_INVALID_ARGUMENT,
            &[&format!("root {root}")],
        );
        refused_saying(
            polychip_comm_reduce(comm, t, POLYCHIP_REDUCE_SUM, root),
            POLYCHIP_API_ERROR_INVALID_ARGUMENT,
            &[&format!("root {root}")],
        );
        assert!(start.elapsed().as_secs() < 5);
    }
    refused_saying(
        polychip_comm_all_reduce(comm, t, 99),
        POLYCHIP_API_ERROR_INVALID_ARGUMENT,
        &["op 99 is not a polychip_reduce_op_t"],
    );
    // Groups of send and receive: NULL, too many, lying sizes, kinds and
    // peers.
    // SAFETY: the array is not read for a NULL or a count over the limit.
    unsafe {
        refused_saying(
            polychip_comm_p2p_group(comm, null(), 3),
            POLYCHIP_API_ERROR_INVALID_ARGUMENT,
            &["ops is NULL with count 3"],
        );
        refused_saying(
            polychip_comm_p2p_group(comm, null(), usize::MAX),
            POLYCHIP_API_ERROR_INVALID_ARGUMENT,
            &["a group of 18446744073709551615 operations; the most is 4096"],
        );
    }
    let op = |struct_size, kind, peer| polychip_comm_p2p_t {
        struct_size,
        kind,
        peer,
        tensor: t,
    };
    for (ops, says) in [
        (vec![op(0, POLYCHIP_P2P_SEND, 0)], "ops[0].struct_size is 0"),
        (
            vec![op(1 << 40, POLYCHIP_P2P_SEND, 0)],
            "ops[0].struct_size is 1099511627776",
        ),
        (
            vec![op(size_of::<polychip_comm_p2p_t>(), 7, 0)],
            "ops[0].kind is 7",
        ),
        (
            vec![op(size_of::<polychip_comm_p2p_t>(), POLYCHIP_P2P_RECV, 3)],
            "ops[0].peer 3",
        ),
    ] {
        // SAFETY: `ops` holds its elements (of the size checked first).
        refused_saying(
            unsafe { polychip_comm_p2p_group(comm, ops.as_ptr(), ops.len()) },
            POLYCHIP_API_ERROR_INVALID_ARGUMENT,
            &[says],
        );
    }
    let mut split = null_mut();
    // SAFETY: `split` writable; any color and key are a valid choice.
    if take(unsafe { polychip_comm_split(comm, u32::MAX, u32::MAX, &mut split) }).is_ok() {
        ok(polychip_comm_destroy(split));
    }
    ok(polychip_comm_broadcast(comm, t, 0));
    ok(polychip_comm_destroy(comm));
    // Destroyed: every call names it.
    refused_saying(
        polychip_comm_barrier(comm),
        POLYCHIP_API_ERROR_INVALID_ARGUMENT,
        &["comm is not a live polychip_comm_t"],
    );
    polychip_tensor_destroy(t);
    polychip_runtime_destroy(rt);
}

/// Options whose strings are no UTF-8 or very long, whose struct_size is
/// too small, or whose log level is none are refused naming the field.
#[test]
fn runtime_options_that_lie_are_refused_naming_the_field() {
    // SAFETY: zeroed options are then filled by options_init.
    let mut o: polychip_runtime_options_t = unsafe { std::mem::zeroed() };
    o.struct_size = size_of::<polychip_runtime_options_t>();
    // SAFETY: writable for its struct_size.
    ok(unsafe { polychip_runtime_options_init(&mut o) });
    let bad = c"/tmp/\xff\xfe.so";
    o.plugin_path = bad.as_ptr();
    let mut rt = null_mut();
    // SAFETY: readable options; `rt` writable.
    refused_saying(
        unsafe { polychip_runtime_new(&o, &mut rt) },
        POLYCHIP_API_ERROR_INVALID_ARGUMENT,
        &["options->plugin_path is not UTF-8"],
    );
    // 1 MB of path: a listed path that does not exist, quoted short.
    let long = std::ffi::CString::new(format!("/{}", "x".repeat(1 << 20))).unwrap();
    o.plugin_path = long.as_ptr();
    o.bundled = false;
    // SAFETY: as above.
    ok(unsafe { polychip_runtime_new(&o, &mut rt) });
    let mut n = 0;
    // SAFETY: `n` writable.
    ok(unsafe { polychip_runtime_failure_count(rt, &mut n) });
    assert_eq!(n, 1);
    polychip_runtime_destroy(rt);
    o.plugin_path = null();
    for (size, says) in [(0usize, "struct_size is 0"), (8, "struct_size is 8")] {
        let mut small = o;
        small.struct_size = size;
        // SAFETY: as above.
        refused_saying(
            unsafe { polychip_runtime_new(&small, &mut rt) },
            POLYCHIP_API_ERROR_INVALID_ARGUMENT,
            &[says],
        );
    }
    let mut level = o;
    level.log_level = 99;
    // SAFETY: as above.
    refused_saying(
        unsafe { polychip_runtime_new(&level, &mut rt) },
        POLYCHIP_API_ERROR_INVALID_ARGUMENT,
        &["options->log_level is 99"],
    );
}

unsafe extern "C" fn count_records(
    context: *mut c_void,
    _level: polychip_log_level_t,
    _message: *const std::ffi::c_char,
    _len: usize,
) {
    // SAFETY: the context is the static counter below.
    unsafe { &*context.cast::<std::sync::atomic::AtomicUsize>() }
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Runtimes made and destroyed by several threads at once, each with a
/// log callback (process-wide state), while they make tensors, log (a
/// dead handle destroyed is a warning) and destroy them: no crash, no
/// deadlock, and every call works.
#[test]
fn runtimes_made_and_destroyed_from_several_threads_at_once() {
    static RECORDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(|| {
                for _ in 0..5 {
                    // SAFETY: zeroed options are filled by options_init.
                    let mut o: polychip_runtime_options_t = unsafe { std::mem::zeroed() };
                    o.struct_size = size_of::<polychip_runtime_options_t>();
                    // SAFETY: writable for its struct_size.
                    ok(unsafe { polychip_runtime_options_init(&mut o) });
                    o.log = Some(count_records);
                    o.log_context = (&raw const RECORDS).cast_mut().cast();
                    let mut rt = null_mut();
                    // SAFETY: readable options; `rt` writable.
                    ok(unsafe { polychip_runtime_new(&o, &mut rt) });
                    let t = tensor(rt, device_of(rt, "Cobalt"), &[1.0, 2.0]);
                    ok(polychip_op_scale(null(), t, 2.0));
                    polychip_tensor_destroy(t);
                    polychip_tensor_destroy(t);
                    polychip_runtime_destroy(rt);
                    assert_eq!(read_dead(t), "tensor is not a live polychip_tensor_t");
                }
            })
        })
        .collect();
    for th in threads {
        th.join().expect("no thread panics");
    }
}

/// The message a dead tensor gives, without the function's name.
fn read_dead(t: *const polychip_tensor_t) -> String {
    let mut x = [0f32; 2];
    // SAFETY: `x` is writable for 8 bytes.
    let (_, message) = refused(unsafe { polychip_tensor_read(t, x.as_mut_ptr().cast(), 8) });
    message
        .trim_start_matches("polychip_tensor_read: ")
        .trim_end_matches(" (it was destroyed)")
        .to_owned()
}

/// A handle passed where a pointer belongs (both are opaque pointers to C:
/// a `polychip_tensor_t *` given as the `DLManagedTensorVersioned *`, the
/// host buffer, the options or an out-param), or a small integer, is
/// refused naming the argument; reading through it crashed the process.
#[test]
fn handles_and_small_integers_passed_as_pointers_are_refused() {
    let rt = runtime();
    let f = device_of(rt, "Ferrite");
    let t = tensor(rt, f, &[1.0, 2.0]);
    let small: *mut c_void = std::ptr::without_provenance_mut(8);
    for (bogus, says) in [
        (t.cast::<c_void>(), "is a polychip_tensor_t handle"),
        (rt.cast::<c_void>(), "is a polychip_runtime_t handle"),
        (small, "is not an address (it lies in the first page)"),
    ] {
        let mut out = null_mut();
        // SAFETY: every pointer argument below is checked before it is read.
        unsafe {
            for (what, error) in [
                (
                    "managed",
                    polychip_tensor_from_dlpack(rt, bogus.cast(), -1, &mut out),
                ),
                (
                    "managed",
                    polychip_tensor_from_dlpack_legacy(rt, bogus.cast(), -1, &mut out),
                ),
                ("src", polychip_tensor_write(t, bogus, 8)),
                ("dst", polychip_tensor_read(t, bogus, 8)),
                (
                    "options",
                    polychip_runtime_new(bogus.cast(), &mut null_mut()),
                ),
                ("options", polychip_runtime_options_init(bogus.cast())),
                ("info", polychip_tensor_info(t, bogus.cast())),
                ("info", polychip_runtime_device_info(rt, 0, bogus.cast())),
                ("out", polychip_tensor_to_device(t, rt, f, bogus.cast())),
                ("out", polychip_runtime_device_count(rt, bogus.cast())),
                (
                    "shape",
                    polychip_tensor_new(rt, f, 0, 1, bogus.cast(), false, &mut out),
                ),
                (
                    "strides",
                    polychip_tensor_view(t, 1, [2i64].as_ptr(), bogus.cast(), 0, &mut out),
                ),
                ("options", polychip_comm_init(bogus.cast(), &mut null_mut())),
            ] {
                let message = refused_saying(error, POLYCHIP_API_ERROR_INVALID_ARGUMENT, &[says]);
                assert!(message.contains(what), "{what}: {message}");
            }
        }
        assert!(out.is_null());
        // A DLPack tensor whose host data, shape or strides are handles.
        let mut data = [0f32; 2];
        let mut shape = [2i64];
        let mut m = managed(
            data.as_mut_ptr().cast(),
            &mut shape,
            None,
            (1, 0),
            (2, 32, 1),
        );
        for field in ["data", "shape", "strides"] {
            let mut lying = polychip_dlpack_versioned_t { ..m };
            match field {
                "data" => lying.dl_tensor.data = bogus,
                "shape" => lying.dl_tensor.shape = bogus.cast(),
                _ => lying.dl_tensor.strides = bogus.cast(),
            }
            // SAFETY: the lying pointer is checked before it is read.
            refused_saying(
                unsafe { polychip_tensor_from_dlpack(rt, &mut lying, -1, &mut out) },
                POLYCHIP_API_ERROR_INVALID_ARGUMENT,
                &[&format!("the DLPack tensor's {field}"), says],
            );
        }
        // SAFETY: the honest one imports.
        ok(unsafe { polychip_tensor_from_dlpack(rt, &mut m, -1, &mut out) });
        polychip_tensor_destroy(out);
    }
    polychip_tensor_destroy(t);
    polychip_runtime_destroy(rt);
}

/// Empty host buffers and groups may come with the dangling pointers of
/// empty arrays (Rust's `0x1`, `0x4`): nothing is read through them.
#[test]
fn empty_buffers_with_dangling_pointers_are_taken() {
    let rt = runtime();
    let f = device_of(rt, "Cobalt");
    let zero = [0i64];
    let mut t = null_mut();
    // SAFETY: one extent; `t` writable.
    ok(unsafe { polychip_tensor_new(rt, f, POLYCHIP_DTYPE_F32, 1, zero.as_ptr(), false, &mut t) });
    let dangling: *mut c_void = std::ptr::without_provenance_mut(4);
    // SAFETY: no byte is read or written.
    unsafe {
        ok(polychip_tensor_write(t, dangling, 0));
        ok(polychip_tensor_read(t, dangling, 0));
    }
    polychip_tensor_destroy(t);
    polychip_runtime_destroy(rt);
}

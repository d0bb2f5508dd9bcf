//! The C API's contract, called from Rust through the same functions a C
//! program links: versions, options, handles (NULL, freed, foreign, of the
//! wrong kind), streams and events across vendors, every DLPack path and
//! its lifetimes, strict loading and the log callback.
//!
//! Needs the bundled plugins built (`cargo build --workspace`).

use std::ffi::{CStr, c_char, c_void};
use std::ptr::{null, null_mut};

use polychip::*;

mod calls;
use calls::{device_of, info, ok, read, refused, runtime, take, tensor};

fn data_of(t: *const polychip_tensor_t) -> *mut c_void {
    // SAFETY: an all-zero info with its struct_size is a valid out-param.
    let mut info: polychip_tensor_info_t = unsafe { std::mem::zeroed() };
    info.struct_size = size_of::<polychip_tensor_info_t>();
    // SAFETY: writable for its struct_size.
    ok(unsafe { polychip_tensor_info(t, &mut info) });
    info.data
}

#[test]
fn versions_and_options_are_checked() {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both writable.
    unsafe { polychip_api_version(&mut major, &mut minor) };
    assert_eq!((major, minor), (POLYCHIP_API_MAJOR, POLYCHIP_API_MINOR));
    // SAFETY: an all-zero options struct is a valid value to fill.
    let mut options: polychip_runtime_options_t = unsafe { std::mem::zeroed() };
    options.struct_size = 8;
    // SAFETY: writable for its (too small) struct_size.
    let (code, message) = refused(unsafe { polychip_runtime_options_init(&mut options) });
    assert_eq!(code, POLYCHIP_API_ERROR_INVALID_ARGUMENT);
    assert!(message.contains("options->struct_size is 8"), "{message}");
    options.struct_size = size_of::<polychip_runtime_options_t>();
    // SAFETY: writable for its struct_size.
    ok(unsafe { polychip_runtime_options_init(&mut options) });
    assert!(options.bundled && !options.strict);
    options.api_major = 2;
    let mut rt = null_mut();
    // SAFETY: readable options; `rt` writable.
    let (code, message) = refused(unsafe { polychip_runtime_new(&options, &mut rt) });
    assert_eq!(code, POLYCHIP_API_ERROR_VERSION_MISMATCH);
    assert!(
        message.contains(&format!("built for polychip API 2.{POLYCHIP_API_MINOR}")),
        "{message}"
    );
    assert!(rt.is_null(), "out-params are untouched on failure");
    options.api_major = 1;
    options.api_minor = POLYCHIP_API_MINOR + 1;
    // SAFETY: as above.
    let (code, _) = refused(unsafe { polychip_runtime_new(&options, &mut rt) });
    assert_eq!(code, POLYCHIP_API_ERROR_VERSION_MISMATCH);
    // A log level past trace is refused, not taken as trace.
    options.api_minor = POLYCHIP_API_MINOR;
    options.log_level = 999;
    // SAFETY: as above.
    let (code, message) = refused(unsafe { polychip_runtime_new(&options, &mut rt) });
    assert_eq!(code, POLYCHIP_API_ERROR_INVALID_ARGUMENT);
    assert!(message.contains("options->log_level is 999"), "{message}");
}

#[test]
fn a_plugin_that_fails_is_listed_or_with_strict_fatal() {
    let dir = std::env::temp_dir().join(format!("polychip-capi-bogus-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bogus = dir.join("libbogus.so");
    std::fs::write(&bogus, b"not an ELF file").unwrap();
    let path = std::ffi::CString::new(bogus.to_str().unwrap()).unwrap();
    // SAFETY: an all-zero options struct is a valid value to fill.
    let mut options: polychip_runtime_options_t = unsafe { std::mem::zeroed() };
    options.struct_size = size_of::<polychip_runtime_options_t>();
    // SAFETY: writable for its struct_size.
    ok(unsafe { polychip_runtime_options_init(&mut options) });
    options.plugin_path = path.as_ptr();
    let mut rt = null_mut();
    // SAFETY: readable options; `rt` writable.
    ok(unsafe { polychip_runtime_new(&options, &mut rt) });
    let mut failures = 0;
    // SAFETY: writable.
    ok(unsafe { polychip_runtime_failure_count(rt, &mut failures) });
    assert_eq!(failures, 1);
    let mut text: *const c_char = null();
    // SAFETY: writable; the string lives with the runtime.
    ok(unsafe { polychip_runtime_failure(rt, 0, &mut text) });
    // SAFETY: as above.
    let text = unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned();
    assert!(
        text.contains("libbogus.so: not a loadable shared library"),
        "{text}"
    );
    // SAFETY: writable.
    let (_, message) = refused(unsafe { polychip_runtime_failure(rt, 1, &mut null()) });
    assert!(message.contains("index 1 is out of range"), "{message}");
    assert!(
        device_of(rt, "Ferrite") < 8,
        "the bundled plugins still load"
    );
    polychip_runtime_destroy(rt);
    options.strict = true;
    let mut strict = null_mut();
    // SAFETY: as above.
    let (code, message) = refused(unsafe { polychip_runtime_new(&options, &mut strict) });
    assert_eq!(code, POLYCHIP_API_ERROR_UNAVAILABLE);
    assert!(
        message.contains("strict: 1 plugin(s) failed to load"),
        "{message}"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn handles_of_every_kind_are_checked() {
    let rt = runtime();
    let f = device_of(rt, "Ferrite");
    let t = tensor(rt, f, &[1.0, 2.0]);
    let mut stream = null_mut();
    // SAFETY: `stream` writable.
    ok(unsafe { polychip_stream_new(rt, f, &mut stream) });
    // A stream passed as a tensor, a NULL tensor, a made-up pointer.
    let (code, message) = refused(polychip_op_neg(null(), stream.cast(), t));
    assert_eq!(code, POLYCHIP_API_ERROR_INVALID_ARGUMENT);
    assert_eq!(
        message,
        "polychip_op_neg: input is a polychip_stream_t, not a polychip_tensor_t"
    );
    let (_, message) = refused(polychip_op_neg(null(), null(), t));
    assert_eq!(message, "polychip_op_neg: input is NULL");
    let bogus = std::ptr::without_provenance::<polychip_tensor_t>(0xdead_beef);
    let (_, message) = refused(polychip_op_neg(null(), bogus, t));
    assert!(
        message.contains("is not a polychip_tensor_t made by libpolychip"),
        "{message}"
    );
    // Destroying twice is logged, not a crash; using a destroyed one is an error.
    polychip_stream_destroy(stream);
    polychip_stream_destroy(stream);
    let (_, message) = refused(polychip_op_neg(stream, t, t));
    assert!(
        message.contains("stream is not a live polychip_stream_t"),
        "{message}"
    );
    polychip_error_destroy(bogus.cast_mut().cast());
    // SAFETY: a message is returned even for a handle that is not an error.
    let text = unsafe { CStr::from_ptr(polychip_error_message(bogus.cast())) };
    assert!(
        text.to_string_lossy()
            .contains("not a live polychip_error_t")
    );
    // Argument errors from the host name the operator and the shapes.
    let u = tensor(rt, f, &[1.0, 2.0, 3.0]);
    let (code, message) = refused(polychip_op_add(null(), t, u, t, 1.0));
    assert_eq!(code, POLYCHIP_API_ERROR_SHAPE_MISMATCH);
    assert!(
        message.contains("add: b has shape [3], but it does not broadcast with a's shape [2]"),
        "{message}"
    );
    // SAFETY: a dtype code out of range is refused before anything is read.
    let (_, message) =
        refused(unsafe { polychip_tensor_new(rt, f, 99, 0, null(), false, &mut null_mut()) });
    assert!(
        message.contains("dtype 99 is not a polychip_dtype_t"),
        "{message}"
    );
    // SAFETY: as above; a device out of range.
    let (_, message) =
        refused(unsafe { polychip_tensor_new(rt, 999, 0, 0, null(), false, &mut null_mut()) });
    assert!(message.contains("device 999 does not exist"), "{message}");
    polychip_tensor_destroy(t);
    polychip_tensor_destroy(u);
    polychip_runtime_destroy(rt);
}

#[test]
fn ops_run_on_streams_and_wait_for_another_vendors_events() {
    let rt = runtime();
    let (f, c) = (device_of(rt, "Ferrite"), device_of(rt, "Cobalt"));
    let (mut sf, mut sc) = (null_mut(), null_mut());
    // SAFETY: writable out-params.
    unsafe {
        ok(polychip_stream_new(rt, f, &mut sf));
        ok(polychip_stream_new(rt, c, &mut sc));
    }
    let x = tensor(rt, f, &[1.0, 4.0, 9.0]);
    ok(polychip_op_sqrt(sf, x, x));
    let mut done = null_mut();
    // SAFETY: writable.
    ok(unsafe { polychip_stream_record(sf, &mut done) });
    ok(polychip_stream_wait(sc, done));
    let y = tensor(rt, c, &[0.0; 3]);
    ok(polychip_tensor_copy(x, y));
    ok(polychip_op_scale(sc, y, 2.0));
    ok(polychip_stream_synchronize(sc));
    ok(polychip_event_synchronize(done));
    assert_eq!(read(y, 3), [2.0, 4.0, 6.0]);
    // A stream of one device cannot run an operator on another's tensors.
    let (_, message) = refused(polychip_op_scale(sf, y, 2.0));
    assert!(message.contains("but the call runs on"), "{message}");
    polychip_event_destroy(done);
    polychip_stream_destroy(sf);
    polychip_stream_destroy(sc);
    for t in [x, y] {
        polychip_tensor_destroy(t);
    }
    polychip_runtime_destroy(rt);
}

#[test]
fn dlpack_is_zero_copy_where_memory_allows_and_a_flagged_copy_elsewhere() {
    let rt = runtime();
    let (f, c) = (device_of(rt, "Ferrite"), device_of(rt, "Cobalt"));
    assert!(info(rt, f).1 && !info(rt, c).1);
    // Ferrite's memory is host-visible: a CPU consumer gets it as it is.
    let x = tensor(rt, f, &[1.0, 2.0, 3.0, 4.0]);
    let mut managed = null_mut();
    // SAFETY: writable.
    ok(unsafe {
        polychip_tensor_to_dlpack(x, 0, POLYCHIP_DLPACK_COPY_IF_NEEDED, null(), &mut managed)
    });
    // SAFETY: a live managed tensor until its deleter runs.
    let m = unsafe { &mut *managed };
    assert_eq!((m.version.major, m.version.minor), (1, 0));
    assert_eq!(
        m.dl_tensor.device,
        polychip_dlpack_device_t {
            device_type: POLYCHIP_DLPACK_CPU,
            device_id: 0
        }
    );
    assert_eq!(m.flags, 0);
    assert_eq!(m.dl_tensor.data, data_of(x), "zero-copy: the same address");
    // A write through the consumer's view is seen by polychip.
    // SAFETY: the CPU view addresses four live f32 (host-visible memory).
    unsafe {
        *m.dl_tensor
            .data
            .cast::<u8>()
            .add(m.dl_tensor.byte_offset as usize)
            .cast::<f32>() = 42.0
    };
    assert_eq!(read(x, 4)[0], 42.0);
    // The data outlives the tensor handle and the runtime.
    polychip_tensor_destroy(x);
    polychip_runtime_destroy(rt);
    // SAFETY: still valid: the export keeps the buffer alive.
    assert_eq!(unsafe { *m.dl_tensor.data.cast::<f32>().add(1) }, 2.0);
    let deleter = m.deleter.unwrap();
    // SAFETY: the consumer calls the deleter once...
    unsafe { deleter(managed) };
    // ...and a second call is detected and ignored.
    // SAFETY: the deleter checks its own records before touching anything.
    unsafe { deleter(managed) };

    let rt = runtime();
    let c = device_of(rt, "Cobalt");
    let y = tensor(rt, c, &[5.0, 6.0]);
    // Cobalt's memory is private: CPU means a copy, flagged, or a refusal.
    let mut managed = null_mut();
    // SAFETY: writable.
    let (_, message) = refused(unsafe {
        polychip_tensor_to_dlpack(
            y,
            POLYCHIP_DLPACK_CPU,
            POLYCHIP_DLPACK_COPY_NEVER,
            null(),
            &mut managed,
        )
    });
    assert!(message.contains("private memory"), "{message}");
    // SAFETY: writable.
    ok(unsafe {
        polychip_tensor_to_dlpack(
            y,
            POLYCHIP_DLPACK_CPU,
            POLYCHIP_DLPACK_COPY_IF_NEEDED,
            null(),
            &mut managed,
        )
    });
    // SAFETY: live until its deleter runs.
    let m = unsafe { &*managed };
    assert_eq!(m.flags, POLYCHIP_DLPACK_FLAG_IS_COPIED);
    // SAFETY: the copy holds two f32.
    let copied = unsafe { std::slice::from_raw_parts(m.dl_tensor.data.cast::<f32>(), 2) };
    assert_eq!(copied, [5.0, 6.0]);
    // Its natural device is kDLExtDev with the runtime index.
    let mut native = null_mut();
    // SAFETY: writable.
    ok(unsafe { polychip_tensor_to_dlpack(y, 0, POLYCHIP_DLPACK_COPY_NEVER, null(), &mut native) });
    // SAFETY: live until its deleter runs.
    let n = unsafe { &*native };
    assert_eq!(
        n.dl_tensor.device,
        polychip_dlpack_device_t {
            device_type: POLYCHIP_DLPACK_EXT_DEV,
            device_id: c as i32
        }
    );
    // Importing it back shares the memory, and the deleter runs once, when
    // the imported tensor is gone.
    let mut back = null_mut();
    // SAFETY: a live managed tensor; `back` writable.
    ok(unsafe { polychip_tensor_from_dlpack(rt, native, -1, &mut back) });
    assert_eq!(data_of(back), data_of(y));
    ok(polychip_op_scale(null(), back, 10.0));
    assert_eq!(read(y, 2), [50.0, 60.0]);
    polychip_tensor_destroy(back);
    // The host copy imports onto any device (CPU data is copied).
    let mut onto_ferrite = null_mut();
    let f = device_of(rt, "Ferrite");
    // SAFETY: as above.
    ok(unsafe { polychip_tensor_from_dlpack(rt, managed, i64::from(f), &mut onto_ferrite) });
    assert_eq!(read(onto_ferrite, 2), [5.0, 6.0]);
    // Legacy tensors go both ways too; a copy cannot be flagged there.
    let mut legacy = null_mut();
    // SAFETY: writable.
    let (_, message) = refused(unsafe {
        polychip_tensor_to_dlpack_legacy(
            y,
            POLYCHIP_DLPACK_CPU,
            POLYCHIP_DLPACK_COPY_IF_NEEDED,
            null(),
            &mut legacy,
        )
    });
    assert!(
        message.contains("a legacy (unversioned) DLPack tensor cannot say it is one"),
        "{message}"
    );
    // SAFETY: writable.
    ok(unsafe {
        polychip_tensor_to_dlpack_legacy(
            onto_ferrite,
            0,
            POLYCHIP_DLPACK_COPY_IF_NEEDED,
            null(),
            &mut legacy,
        )
    });
    let mut again = null_mut();
    // SAFETY: a live legacy managed tensor.
    ok(unsafe { polychip_tensor_from_dlpack_legacy(rt, legacy, -1, &mut again) });
    assert_eq!(read(again, 2), [5.0, 6.0]);
    for t in [y, onto_ferrite, again] {
        polychip_tensor_destroy(t);
    }
    polychip_runtime_destroy(rt);
}

#[test]
fn dlpack_imports_refuse_what_they_cannot_read() {
    let rt = runtime();
    let mut shape = [2i64];
    let mut data = [1.0f32, 2.0];
    let mut foreign = polychip_dlpack_versioned_t {
        version: polychip_dlpack_version_t { major: 2, minor: 0 },
        manager_ctx: null_mut(),
        deleter: None,
        flags: 0,
        dl_tensor: polychip_dlpack_tensor_t {
            data: data.as_mut_ptr().cast(),
            device: polychip_dlpack_device_t {
                device_type: POLYCHIP_DLPACK_CPU,
                device_id: 0,
            },
            ndim: 1,
            dtype: polychip_dlpack_dtype_t {
                code: 2,
                bits: 32,
                lanes: 1,
            },
            shape: shape.as_mut_ptr(),
            strides: null_mut(),
            byte_offset: 0,
        },
    };
    let mut out = null_mut();
    // SAFETY: a readable managed tensor; `out` writable.
    let (code, _) = refused(unsafe { polychip_tensor_from_dlpack(rt, &mut foreign, -1, &mut out) });
    assert_eq!(code, POLYCHIP_API_ERROR_VERSION_MISMATCH);
    foreign.version.major = 1;
    foreign.dl_tensor.dtype.lanes = 4;
    // SAFETY: as above.
    let (_, message) =
        refused(unsafe { polychip_tensor_from_dlpack(rt, &mut foreign, -1, &mut out) });
    assert!(
        message.contains("lanes 4: a vector of 4 float32 lanes) has no polychip dtype"),
        "{message}"
    );
    foreign.dl_tensor.dtype.lanes = 1;
    // A negative device other than -1 names no device (it was read as -1).
    // SAFETY: as above.
    let (code, message) =
        refused(unsafe { polychip_tensor_from_dlpack(rt, &mut foreign, -7, &mut out) });
    assert_eq!(code, POLYCHIP_API_ERROR_INVALID_ARGUMENT, "{message}");
    assert!(
        message.contains("device -7 is not a device index"),
        "{message}"
    );
    foreign.dl_tensor.device.device_type = 2;
    // SAFETY: as above.
    let (_, message) =
        refused(unsafe { polychip_tensor_from_dlpack(rt, &mut foreign, -1, &mut out) });
    assert!(
        message.contains("is on kDLCUDA (2), not on kDLCPU"),
        "{message}"
    );
    foreign.dl_tensor.device.device_type = POLYCHIP_DLPACK_CPU;
    // Host data with no deleter is copied onto device 0.
    // SAFETY: as above.
    ok(unsafe { polychip_tensor_from_dlpack(rt, &mut foreign, -1, &mut out) });
    assert_eq!(read(out, 2), [1.0, 2.0]);
    polychip_tensor_destroy(out);
    polychip_runtime_destroy(rt);
}

#[test]
fn byte_buffers_are_viewed_as_typed_tensors_within_bounds() {
    let rt = runtime();
    for vendor in ["Ferrite", "Cobalt"] {
        let dev = device_of(rt, vendor);
        // 16 floats, then viewed as raw bytes and back at an offset.
        let values: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let t = tensor(rt, dev, &values);
        let mut v = null_mut();
        let (shape, strides) = ([2i64, 3], [1i64, 2]);
        // SAFETY: two extents and strides; `v` is writable.
        ok(unsafe {
            polychip_tensor_view_as(
                t,
                POLYCHIP_DTYPE_F32,
                2,
                shape.as_ptr(),
                strides.as_ptr(),
                16,
                &mut v,
            )
        });
        // Elements 4 + i + 2 j, read back compact through a copy.
        let mut c = null_mut();
        // SAFETY: as above.
        ok(unsafe {
            polychip_tensor_new(
                rt,
                dev,
                POLYCHIP_DTYPE_F32,
                2,
                shape.as_ptr(),
                false,
                &mut c,
            )
        });
        ok(polychip_op_copy(null(), v, c));
        assert_eq!(read(c, 6), [4.0, 6.0, 8.0, 5.0, 7.0, 9.0], "{vendor}");
        let bytes = [64i64];
        let one = [1i64];
        let mut u = null_mut();
        // SAFETY: one extent; `u` is writable.
        ok(unsafe {
            polychip_tensor_view_as(
                t,
                POLYCHIP_DTYPE_U8,
                1,
                bytes.as_ptr(),
                one.as_ptr(),
                0,
                &mut u,
            )
        });
        // Misaligned, out of bounds, past the end, bad dtype: refused.
        for (dtype, extent, offset, says) in [
            (POLYCHIP_DTYPE_F32, 2, 2, "not a multiple of 4"),
            (POLYCHIP_DTYPE_F32, 16, 4, "outside"),
            (POLYCHIP_DTYPE_U8, 0, 65, "past the end"),
            (99, 1, 0, "not a polychip_dtype_t"),
        ] {
            let shape = [extent];
            let mut w = null_mut();
            // SAFETY: one extent; `w` is writable.
            let (_, message) = refused(unsafe {
                polychip_tensor_view_as(t, dtype, 1, shape.as_ptr(), one.as_ptr(), offset, &mut w)
            });
            assert!(message.contains(says), "{vendor}: {message}");
            assert!(w.is_null());
        }
        for h in [t, v, c, u] {
            polychip_tensor_destroy(h);
        }
    }
    polychip_runtime_destroy(rt);
}

/// A host-memory managed tensor of f32 `shape` and `strides` over `data`,
/// with no deleter.
fn host_managed(
    data: *mut c_void,
    shape: &mut [i64],
    strides: &mut [i64],
    device_type: i32,
) -> polychip_dlpack_versioned_t {
    polychip_dlpack_versioned_t {
        version: polychip_dlpack_version_t { major: 1, minor: 0 },
        manager_ctx: null_mut(),
        deleter: None,
        flags: 0,
        dl_tensor: polychip_dlpack_tensor_t {
            data,
            device: polychip_dlpack_device_t {
                device_type,
                device_id: 0,
            },
            ndim: shape.len() as i32,
            dtype: polychip_dlpack_dtype_t {
                code: 2,
                bits: 32,
                lanes: 1,
            },
            shape: shape.as_mut_ptr(),
            strides: strides.as_mut_ptr(),
            byte_offset: 0,
        },
    }
}

#[test]
fn sizes_that_overflow_or_exceed_memory_are_refused_not_crashing() {
    let rt = runtime();
    let cobalt = device_of(rt, "Cobalt");
    let mut x = 1.0f32;
    let mut out = null_mut();
    // Each of these used to abort the process (a 4 TiB host allocation for
    // a broadcast of one float; a NULL data pointer read) or panic inside
    // the call (a product or sum of extents and strides overflowing).
    type Case<'a> = (&'a mut [i64], &'a mut [i64], *mut c_void, i32, &'a str);
    let cases: [Case; 5] = [
        (
            &mut [1 << 20, 1 << 20],
            &mut [0, 0],
            (&raw mut x).cast(),
            POLYCHIP_DLPACK_CPU,
            "requested 4398046511104 bytes",
        ),
        (
            &mut [4],
            &mut [1],
            null_mut(),
            POLYCHIP_DLPACK_CPU,
            "data is NULL but its shape [4] has 4 elements",
        ),
        (
            &mut [1 << 32, 1 << 32, 1 << 32],
            &mut [0, 0, 0],
            (&raw mut x).cast(),
            POLYCHIP_DLPACK_CPU,
            "overflows 64-bit sizes",
        ),
        (
            &mut [3, 3],
            &mut [i64::MAX / 2, i64::MAX / 2],
            (&raw mut x).cast(),
            POLYCHIP_DLPACK_EXT_DEV,
            "overflows 64-bit sizes",
        ),
        (
            &mut [3, 3],
            &mut [i64::MIN / 2 + 1, i64::MIN / 2 + 1],
            (&raw mut x).cast(),
            POLYCHIP_DLPACK_CPU,
            "overflows 64-bit sizes",
        ),
    ];
    for (shape, strides, data, device_type, says) in cases {
        let mut m = host_managed(data, shape, strides, device_type);
        m.dl_tensor.device.device_id = cobalt as i32;
        // SAFETY: a readable managed tensor (the data is never read past
        // its one float); `out` writable.
        let (_, message) = refused(unsafe {
            polychip_tensor_from_dlpack(rt, &mut m, i64::from(cobalt), &mut out)
        });
        assert!(message.contains(says), "{says}: {message}");
        assert!(out.is_null());
    }

    let t = tensor(rt, cobalt, &[1.0, 2.0, 3.0, 4.0]);
    for (shape, strides, offset) in [
        ([1i64 << 40, 1 << 40], [0i64, 0], 0i64),
        ([2, 1], [1, 1], i64::MAX),
        ([2, 1], [1, 1], i64::MIN),
        ([3, 3], [i64::MAX / 2, i64::MAX / 2], 0),
    ] {
        let mut v = null_mut();
        // SAFETY: two extents and strides; `v` writable.
        let (_, message) = refused(unsafe {
            polychip_tensor_view(t, 2, shape.as_ptr(), strides.as_ptr(), offset, &mut v)
        });
        assert!(
            message.contains("overflows 64-bit sizes"),
            "{shape:?} {strides:?} {offset}: {message}"
        );
        assert!(v.is_null());
    }
    // A length no buffer can have is refused before a slice of it is made.
    let mut buf = [0f32; 4];
    // SAFETY: the length is wrong on purpose; it is checked before any use.
    let (_, message) =
        refused(unsafe { polychip_tensor_read(t, buf.as_mut_ptr().cast(), usize::MAX) });
    assert!(
        message.contains("bytes do not hold a f32 tensor of shape [4] (16 bytes)"),
        "{message}"
    );
    // SAFETY: as above.
    let (_, message) =
        refused(unsafe { polychip_tensor_write(t, buf.as_ptr().cast(), usize::MAX) });
    assert!(message.contains("bytes do not fill"), "{message}");
    // A copy of a broadcast view of terabytes, on export: an error, not an
    // abort in the allocator (legacy and versioned exports, and a copy
    // asked for of host-visible memory).
    let ferrite = device_of(rt, "Ferrite");
    let f = tensor(rt, ferrite, &[1.0]);
    for (base, copy) in [
        (t, POLYCHIP_DLPACK_COPY_IF_NEEDED),
        (f, POLYCHIP_DLPACK_COPY_ALWAYS),
    ] {
        let (shape, strides) = ([1i64 << 40], [0i64]);
        let mut v = null_mut();
        // SAFETY: one extent and stride; `v` writable.
        ok(unsafe { polychip_tensor_view(base, 1, shape.as_ptr(), strides.as_ptr(), 0, &mut v) });
        let mut m = null_mut();
        // SAFETY: `m` writable.
        let (code, message) = refused(unsafe {
            polychip_tensor_to_dlpack(v, POLYCHIP_DLPACK_CPU, copy, null(), &mut m)
        });
        assert_eq!(code, POLYCHIP_API_ERROR_OUT_OF_MEMORY, "{message}");
        assert!(
            message.contains("shape [1099511627776]") && message.contains("4398046511104 bytes"),
            "{message}"
        );
        assert!(m.is_null());
        let mut legacy = null_mut();
        // SAFETY: `legacy` writable.
        let (code, _) = refused(unsafe {
            polychip_tensor_to_dlpack_legacy(
                v,
                POLYCHIP_DLPACK_CPU,
                POLYCHIP_DLPACK_COPY_ALWAYS,
                null(),
                &mut legacy,
            )
        });
        assert_eq!(code, POLYCHIP_API_ERROR_OUT_OF_MEMORY);
        polychip_tensor_destroy(v);
    }
    polychip_tensor_destroy(f);
    // An export's copy mode outside the three is refused, not taken as -1.
    let mut m = null_mut();
    // SAFETY: `m` writable.
    let (_, message) = refused(unsafe { polychip_tensor_to_dlpack(t, 0, 5, null(), &mut m) });
    assert!(message.contains("copy 5 is neither"), "{message}");
    polychip_tensor_destroy(t);
    polychip_runtime_destroy(rt);
}

/// A world larger than a communicator takes is refused at once, naming
/// the field (it used to wait out the rendezvous timeout for rank 1).
#[test]
fn a_world_larger_than_a_communicator_takes_is_refused_at_once() {
    for world_size in [64, 65_537, u32::MAX] {
        let options = polychip_comm_options_t {
            struct_size: size_of::<polychip_comm_options_t>(),
            rank: 0,
            world_size,
            master_addr: null(),
            master_port: 0,
        };
        let mut comm = null_mut();
        let start = std::time::Instant::now();
        // SAFETY: readable options; `comm` writable.
        let (code, message) = refused(unsafe { polychip_comm_init(&options, &mut comm) });
        assert_eq!(code, POLYCHIP_API_ERROR_INVALID_ARGUMENT, "{message}");
        assert!(
            message.contains(&format!(
                "options->world_size {world_size} is more than the 63 ranks"
            )),
            "{message}"
        );
        assert!(start.elapsed().as_secs() < 5, "{:?}", start.elapsed());
        assert!(comm.is_null());
    }
}

#[test]
fn a_peer_that_is_not_a_rank_is_refused() {
    let rt = runtime();
    let t = tensor(rt, device_of(rt, "Ferrite"), &[1.0]);
    let comm = comm_alone();
    // Used to panic in the transport (an index out of bounds).
    for call in [polychip_comm_send, polychip_comm_recv] {
        let (code, message) = refused(call(comm, t, 3));
        assert_eq!(code, POLYCHIP_API_ERROR_INVALID_ARGUMENT, "{message}");
        assert!(
            message.contains("peer 3 is not a rank of this communicator (ranks 0 to 0)"),
            "{message}"
        );
    }
    // A group checks every operation before anything moves.
    let op = |kind, peer| polychip_comm_p2p_t {
        struct_size: size_of::<polychip_comm_p2p_t>(),
        kind,
        peer,
        tensor: t,
    };
    let sized = |struct_size| polychip_comm_p2p_t {
        struct_size,
        ..op(POLYCHIP_P2P_SEND, 0)
    };
    let cases = [
        (
            vec![op(POLYCHIP_P2P_SEND, 3)],
            "ops[0].peer 3 is not a rank of this communicator",
        ),
        (
            vec![op(7, 0)],
            "ops[0].kind is 7, not a polychip_p2p_kind_t",
        ),
        (
            vec![op(POLYCHIP_P2P_RECV, 0)],
            "sends this rank 0 message(s) and receives 1",
        ),
        (
            vec![sized(8)],
            "ops[0].struct_size is 8; this library needs 24 to 4096",
        ),
        (
            vec![op(POLYCHIP_P2P_SEND, 0), sized(32)],
            "ops[1].struct_size is 32, but ops[0]'s is 24",
        ),
    ];
    for (ops, want) in cases {
        // SAFETY: `ops` holds `ops.len()` operations.
        let (_, message) =
            refused(unsafe { polychip_comm_p2p_group(comm, ops.as_ptr(), ops.len()) });
        assert!(message.contains(want), "{message}");
    }
    // SAFETY: NULL with a count is refused before it is read.
    let (_, message) = refused(unsafe { polychip_comm_p2p_group(comm, null(), 2) });
    assert!(message.contains("ops is NULL with count 2"), "{message}");
    // SAFETY: as above; the count is refused before the pointer is read.
    let (_, message) = refused(unsafe { polychip_comm_p2p_group(comm, null(), 1 << 40) });
    assert!(message.contains("the most is 4096"), "{message}");
    // SAFETY: an empty group reads nothing.
    ok(unsafe { polychip_comm_p2p_group(comm, null(), 0) });
    // A send to this rank goes to its receive from this rank.
    let back = tensor(rt, device_of(rt, "Ferrite"), &[0.0]);
    let recv = polychip_comm_p2p_t {
        tensor: back,
        ..op(POLYCHIP_P2P_RECV, 0)
    };
    let pair = [op(POLYCHIP_P2P_SEND, 0), recv];
    // SAFETY: `pair` holds two operations.
    ok(unsafe { polychip_comm_p2p_group(comm, pair.as_ptr(), 2) });
    let mut got = [0f32; 1];
    // SAFETY: `got` holds the tensor's 4 bytes.
    ok(unsafe { polychip_tensor_read(back, got.as_mut_ptr().cast(), 4) });
    assert_eq!(got, [1.0]);
    polychip_tensor_destroy(back);
    ok(polychip_comm_destroy(comm));
    polychip_tensor_destroy(t);
    polychip_runtime_destroy(rt);
}

/// A kDLExtDev capsule without a deleter that names memory polychip
/// allocated keeps that memory: the owner's destruction waits for the
/// import (it freed it, and the import then read and wrote the next
/// tensor given that address).
#[test]
fn a_device_import_keeps_the_memory_it_names_until_it_is_gone() {
    let rt = runtime();
    for vendor in ["Ferrite", "Cobalt"] {
        let dev = device_of(rt, vendor);
        let owner = tensor(rt, dev, &[1.0, 2.0, 3.0, 4.0]);
        let (mut shape, mut strides) = ([4i64], [1i64]);
        let mut m = host_managed(
            data_of(owner),
            &mut shape,
            &mut strides,
            POLYCHIP_DLPACK_EXT_DEV,
        );
        m.dl_tensor.device.device_id = dev as i32;
        let mut import = null_mut();
        // SAFETY: a readable managed tensor without a deleter; `import` writable.
        ok(unsafe { polychip_tensor_from_dlpack(rt, &mut m, -1, &mut import) });
        polychip_tensor_destroy(owner);
        // New tensors do not get the memory the import still uses.
        let others: Vec<_> = (0..8).map(|_| tensor(rt, dev, &[9.0; 4])).collect();
        assert_eq!(read(import, 4), [1.0, 2.0, 3.0, 4.0], "{vendor}");
        ok(polychip_op_scale(null(), import, 10.0));
        for &o in &others {
            assert_eq!(read(o, 4), [9.0; 4], "{vendor}");
        }
        assert_eq!(read(import, 4), [10.0, 20.0, 30.0, 40.0], "{vendor}");
        polychip_tensor_destroy(import);
        for o in others {
            polychip_tensor_destroy(o);
        }
    }
    polychip_runtime_destroy(rt);
}

/// A zeroed tensor of `dtype` and `shape` on `device`.
fn zeros(
    rt: *const polychip_runtime_t,
    device: u32,
    dtype: polychip_dtype_t,
    shape: &[i64],
) -> *mut polychip_tensor_t {
    let mut t = null_mut();
    // SAFETY: `shape` has `shape.len()` extents; `t` is writable.
    ok(unsafe {
        polychip_tensor_new(
            rt,
            device,
            dtype,
            shape.len() as i32,
            shape.as_ptr(),
            true,
            &mut t,
        )
    });
    t
}

/// A copy between tensors of two dtypes (or two shapes) fails with the
/// same code on one device and across devices: DTYPE_MISMATCH (the
/// cross-device copy said INVALID_ARGUMENT), SHAPE_MISMATCH for shapes.
#[test]
fn a_copy_of_mismatched_dtypes_or_shapes_has_one_code_on_any_devices() {
    let rt = runtime();
    let (f, c) = (device_of(rt, "Ferrite"), device_of(rt, "Cobalt"));
    let src = tensor(rt, f, &[1.0, 2.0]);
    for (dst_device, dtype, shape, want) in [
        (
            f,
            POLYCHIP_DTYPE_I32,
            [2],
            POLYCHIP_API_ERROR_DTYPE_MISMATCH,
        ),
        (
            c,
            POLYCHIP_DTYPE_I32,
            [2],
            POLYCHIP_API_ERROR_DTYPE_MISMATCH,
        ),
        (
            f,
            POLYCHIP_DTYPE_F32,
            [3],
            POLYCHIP_API_ERROR_SHAPE_MISMATCH,
        ),
        (
            c,
            POLYCHIP_DTYPE_F32,
            [3],
            POLYCHIP_API_ERROR_SHAPE_MISMATCH,
        ),
    ] {
        let dst = zeros(rt, dst_device, dtype, &shape);
        let (code, message) = refused(polychip_tensor_copy(src, dst));
        assert_eq!(code, want, "to device {dst_device}, {shape:?}: {message}");
        polychip_tensor_destroy(dst);
    }
    polychip_tensor_destroy(src);
    polychip_runtime_destroy(rt);
}

/// One rank alone: a communicator of world 1.
fn comm_alone() -> *mut polychip_comm_t {
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
    comm
}

/// The comm functions name a NULL tensor as the header names the
/// parameter (`t`; they said "tensor").
#[test]
fn a_null_tensor_is_named_as_the_header_names_it() {
    let comm = comm_alone();
    let calls: [(&str, *mut polychip_error_t); 5] = [
        (
            "all_reduce",
            polychip_comm_all_reduce(comm, null(), POLYCHIP_REDUCE_SUM),
        ),
        ("broadcast", polychip_comm_broadcast(comm, null(), 0)),
        (
            "reduce",
            polychip_comm_reduce(comm, null(), POLYCHIP_REDUCE_SUM, 0),
        ),
        ("send", polychip_comm_send(comm, null(), 0)),
        ("recv", polychip_comm_recv(comm, null(), 0)),
    ];
    for (what, error) in calls {
        let (code, message) = refused(error);
        assert_eq!(
            code, POLYCHIP_API_ERROR_INVALID_ARGUMENT,
            "{what}: {message}"
        );
        assert!(message.contains("t is NULL"), "{what}: {message}");
        assert!(!message.contains("tensor is NULL"), "{what}: {message}");
    }
    ok(polychip_comm_destroy(comm));
}

/// A master_addr no socket call could take (control characters, 100 KB)
/// is refused at once naming the field, quoted escaped and cut.
#[test]
fn a_master_addr_that_is_no_host_is_refused_naming_the_field() {
    let long = std::ffi::CString::new("h".repeat(100_000)).unwrap();
    let escape = std::ffi::CString::new("node\u{1b}]0;x\u{7}").unwrap();
    for (addr, want) in [
        (&long, "… (100000 bytes), longer than the 255 bytes"),
        (
            &escape,
            r#""node\u{1b}]0;x\u{7}", which is not a host name"#,
        ),
    ] {
        let options = polychip_comm_options_t {
            struct_size: size_of::<polychip_comm_options_t>(),
            rank: 0,
            world_size: 2,
            master_addr: addr.as_ptr(),
            master_port: 1,
        };
        let mut comm = null_mut();
        // SAFETY: readable options with a NUL-terminated address.
        let (code, message) = refused(unsafe { polychip_comm_init(&options, &mut comm) });
        assert_eq!(code, POLYCHIP_API_ERROR_INVALID_ARGUMENT, "{message}");
        assert!(message.contains("options->master_addr is "), "{message}");
        assert!(message.contains(want), "{message}");
        assert!(
            message.len() < 600 && !message.contains('\u{1b}'),
            "{message:?}"
        );
        assert!(comm.is_null());
    }
}

/// f32 sent with polychip_comm_send and received with polychip_comm_recv
/// into an i32 tensor of the same byte size: the receiver is refused,
/// naming both dtypes (it read 1065353216 for 1.0).
#[test]
fn a_recv_of_another_dtype_than_the_send_is_refused_naming_both() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let results: Vec<Result<(), (u32, String)>> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..2u32)
            .map(|rank| {
                s.spawn(move || {
                    let addr = c"127.0.0.1";
                    let options = polychip_comm_options_t {
                        struct_size: size_of::<polychip_comm_options_t>(),
                        rank,
                        world_size: 2,
                        master_addr: addr.as_ptr(),
                        master_port: port,
                    };
                    let mut comm = null_mut();
                    // SAFETY: readable options; `comm` writable.
                    ok(unsafe { polychip_comm_init(&options, &mut comm) });
                    let rt = runtime();
                    let d = device_of(rt, "Ferrite");
                    let (t, r) = match rank {
                        0 => {
                            let t = tensor(rt, d, &[1.0, 2.0]);
                            (t, take(polychip_comm_send(comm, t, 1)))
                        }
                        _ => {
                            let t = zeros(rt, d, POLYCHIP_DTYPE_I32, &[2]);
                            (t, take(polychip_comm_recv(comm, t, 0)))
                        }
                    };
                    // Rank 1's communicator is broken and skips the final
                    // barrier; it told rank 0, whose destroy fails at once
                    // naming it (it used to wait out the 60 s timeout).
                    let start = std::time::Instant::now();
                    let destroyed = take(polychip_comm_destroy(comm));
                    let took = start.elapsed();
                    assert!(
                        took < std::time::Duration::from_secs(2),
                        "destroy took {took:?}"
                    );
                    match rank {
                        0 => {
                            let (code, message) = destroyed.expect_err("rank 1 failed");
                            assert_eq!(code, POLYCHIP_API_ERROR_PEER_LOST, "{message}");
                            assert!(
                                message.contains("peer rank 1 is gone: it failed: rank 1: ")
                                    && message.contains("the dtypes differ"),
                                "{message}"
                            );
                        }
                        _ => destroyed.unwrap(),
                    }
                    polychip_tensor_destroy(t);
                    polychip_runtime_destroy(rt);
                    r
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    });
    results[0].clone().expect("the send succeeded");
    let (code, message) = results[1].clone().expect_err("f32 was received as i32");
    assert_eq!(code, POLYCHIP_API_ERROR_INVALID_ARGUMENT, "{message}");
    assert!(
        message.contains("the dtypes differ (f32 sent, i32 received)"),
        "{message}"
    );
}

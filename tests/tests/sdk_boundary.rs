//! The Rust SDK's side of the boundary, driven through the raw C ABI with no
//! host checks in front: NULL pointers, short structs, bad device indices and
//! bad handles each come back as an error object with the right code, never
//! a crash. This test is its own host, so it loads Ferrite itself.

mod common;

use std::ffi::{c_char, c_void};
use std::mem::size_of;
use std::ptr::{null, null_mut};

use polychip_plugin_sdk::abi::*;

struct Obj {
    code: u32,
    message: String,
}

unsafe extern "C" fn error_new(
    _: *mut c_void,
    code: u32,
    msg: *const c_char,
    len: usize,
) -> *mut PolychipError {
    // SAFETY: the ABI gives `len` readable bytes.
    let bytes = unsafe { std::slice::from_raw_parts(msg.cast::<u8>(), len) };
    let message = String::from_utf8_lossy(bytes).into_owned();
    Box::into_raw(Box::new(Obj { code, message })).cast()
}

unsafe extern "C" fn error_destroy(_: *mut c_void, e: *mut PolychipError) {
    if !e.is_null() {
        // SAFETY: made by error_new above.
        drop(unsafe { Box::from_raw(e.cast::<Obj>()) });
    }
}

fn take(e: *mut PolychipError) -> Option<(u32, String)> {
    if e.is_null() {
        return None;
    }
    // SAFETY: every error the plugin returns was made by our error_new.
    let obj = unsafe { Box::from_raw(e.cast::<Obj>()) };
    Some((obj.code, obj.message))
}

fn plugin() -> &'static PolychipPluginApi {
    let path = common::ferrite_path();
    // SAFETY: a trusted test plugin.
    let lib = unsafe { libloading::Library::new(&path) }.unwrap();
    let lib: &'static libloading::Library = Box::leak(Box::new(lib));
    // SAFETY: the entry symbol has the ABI's type.
    let init = unsafe { lib.get::<PolychipPluginInitV1>(b"polychip_plugin_init_v1") }.unwrap();
    let host = Box::leak(Box::new(PolychipHostApi {
        struct_size: size_of::<PolychipHostApi>(),
        abi_major: POLYCHIP_ABI_MAJOR,
        abi_minor: POLYCHIP_ABI_MINOR,
        context: null_mut(),
        log: None,
        log_level: 0,
        error_new: Some(error_new),
        error_destroy: Some(error_destroy),
    }));
    let mut out: *const PolychipPluginApi = null();
    // SAFETY: a complete host table and a writable out-param.
    assert!(take(unsafe { init(host, &mut out) }).is_none());
    // SAFETY: the plugin returned its static table.
    unsafe { &*out }
}

#[test]
fn the_sdk_refuses_bad_arguments_with_error_objects() {
    let api = plugin();
    // SAFETY: each call passes deliberately bad arguments that the SDK must
    // detect before touching them; every pointer that is not NULL is valid.
    unsafe {
        // NULL out-params.
        let (code, msg) = take(api.device_count.unwrap()(null_mut())).unwrap();
        assert_eq!(code, POLYCHIP_ERROR_INVALID_ARGUMENT);
        assert!(msg.contains("out_count is NULL"), "{msg}");
        // A device that does not exist.
        let mut ptr = null_mut();
        let (code, msg) = take(api.mem_alloc.unwrap()(99, 64, &mut ptr)).unwrap();
        assert_eq!(code, POLYCHIP_ERROR_INVALID_ARGUMENT);
        assert!(msg.contains("device 99 does not exist"), "{msg}");
        assert!(ptr.is_null(), "out-params are untouched on failure");
        // A device_props struct too small to hold even struct_size.
        let mut props = PolychipDeviceProps {
            struct_size: 4,
            ..PolychipDeviceProps::default()
        };
        let (code, _) = take(api.device_props.unwrap()(0, &mut props)).unwrap();
        assert_eq!(code, POLYCHIP_ERROR_INVALID_ARGUMENT);
        // A caller from an older minor with a shorter props struct gets only what fits.
        let short = std::mem::offset_of!(PolychipDeviceProps, memory_flags);
        let mut props = PolychipDeviceProps {
            struct_size: short,
            ..PolychipDeviceProps::default()
        };
        assert!(take(api.device_props.unwrap()(0, &mut props)).is_none());
        assert_eq!(props.struct_size, short);
        assert!(props.memory_bytes > 0);
        assert_eq!(
            props.memory_flags, 0,
            "fields past the caller's size are not written"
        );

        let ops = &*api.ops;
        // NULL args.
        let (code, msg) = take(ops.fill.unwrap()(0, null_mut(), null())).unwrap();
        assert_eq!(code, POLYCHIP_ERROR_INVALID_ARGUMENT);
        assert_eq!(msg, "fill: args is NULL");
        // An args struct shorter than ABI 1.0's.
        let shape = [4i64];
        let mut data = [0f32; 4];
        let tensor = PolychipTensor {
            data: data.as_mut_ptr().cast(),
            device: PolychipDevice {
                device_type: POLYCHIP_DEVICE_TYPE_EXT,
                device_id: 0,
            },
            ndim: 1,
            dtype: PolychipDataType {
                code: POLYCHIP_DTYPE_CODE_FLOAT,
                bits: 32,
                lanes: 1,
            },
            shape: shape.as_ptr(),
            strides: null(),
            byte_offset: 0,
        };
        let args = PolychipFillArgs {
            struct_size: 8,
            out: tensor,
            value: 1.0,
        };
        let (code, msg) = take(ops.fill.unwrap()(0, null_mut(), &args)).unwrap();
        assert_eq!(code, POLYCHIP_ERROR_INVALID_ARGUMENT);
        assert!(msg.contains("args->struct_size is 8"), "{msg}");
        // A tensor with ndim > 0 and a NULL shape.
        let bad = PolychipFillArgs {
            struct_size: size_of::<PolychipFillArgs>(),
            out: PolychipTensor {
                shape: null(),
                ..tensor
            },
            value: 1.0,
        };
        let (code, msg) = take(ops.fill.unwrap()(0, null_mut(), &bad)).unwrap();
        assert_eq!(code, POLYCHIP_ERROR_INVALID_ARGUMENT);
        assert!(msg.contains("out has ndim 1 but a NULL shape"), "{msg}");
        // A dtype outside ABI v1.
        let bad = PolychipFillArgs {
            struct_size: size_of::<PolychipFillArgs>(),
            out: PolychipTensor {
                dtype: PolychipDataType {
                    code: 2,
                    bits: 8,
                    lanes: 1,
                },
                ..tensor
            },
            value: 1.0,
        };
        let (code, msg) = take(ops.fill.unwrap()(0, null_mut(), &bad)).unwrap();
        assert_eq!(code, POLYCHIP_ERROR_DTYPE_MISMATCH);
        assert!(msg.contains("code 2, bits 8, lanes 1"), "{msg}");
        // Memory the plugin never allocated: Ferrite refuses it rather than writing.
        let foreign = PolychipFillArgs {
            struct_size: size_of::<PolychipFillArgs>(),
            out: tensor,
            value: 1.0,
        };
        let (code, _) = take(ops.fill.unwrap()(0, null_mut(), &foreign)).unwrap();
        assert_eq!(code, POLYCHIP_ERROR_INVALID_ARGUMENT);
        assert_eq!(data, [0.0; 4]);
        // A NULL event handle.
        let (code, _) = take(api.event_synchronize.unwrap()(null_mut())).unwrap();
        assert_eq!(code, POLYCHIP_ERROR_INVALID_ARGUMENT);
        // The plugin still works after all of that.
        let mut count = 0;
        assert!(take(api.device_count.unwrap()(&mut count)).is_none());
        assert!(count >= 1);
    }
}

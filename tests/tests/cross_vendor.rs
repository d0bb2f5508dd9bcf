//! Moving tensors between devices of different vendors, and proof that
//! Cobalt's device memory really is private: a host that read a device
//! pointer instead of copying would get garbage.

mod common;

use std::sync::{Mutex, MutexGuard};

use polychip_host::{DType, LoadOptions, Runtime};

/// The plugins are loaded once per process, so their devices (and their
/// memory counts) are shared by this file's tests, which run on threads
/// of one process: each holds this while it uses them, so that one test's
/// buffers never show in another's count.
static DEVICES: Mutex<()> = Mutex::new(());

fn runtime() -> (MutexGuard<'static, ()>, Runtime) {
    let serial = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    let runtime = Runtime::load(
        &[common::ferrite_path(), common::cobalt_path()],
        &LoadOptions::default(),
    );
    assert!(runtime.failures().is_empty(), "{:?}", runtime.failures());
    (serial, runtime)
}

#[test]
fn one_runtime_drives_both_vendors() {
    let (_serial, runtime) = runtime();
    let vendors: Vec<&str> = runtime.plugins().iter().map(|p| p.vendor()).collect();
    assert_eq!(vendors, ["Ferrite", "Cobalt"]);
    let ferrite = &runtime.devices_of("ferrite")[0];
    let cobalt = &runtime.devices_of("cobalt")[0];
    assert!(ferrite.props().host_visible);
    assert!(!cobalt.props().host_visible);
    assert!(
        ferrite.props().peak_flops_f32 > cobalt.props().peak_flops_f32,
        "Ferrite is the fast chip"
    );
    assert!(
        ferrite.props().memory_bytes > cobalt.props().memory_bytes,
        "Cobalt has the smaller memory"
    );
}

#[test]
fn cobalt_memory_is_encoded_so_dereferencing_a_device_pointer_gives_garbage() {
    let (_serial, runtime) = runtime();
    let cobalt = &runtime.devices_of("cobalt")[0];
    let plain: Vec<u8> = (0..64u8).collect();
    let t = cobalt.empty(DType::U8, &[64]).unwrap();
    t.write_bytes(&plain).unwrap();
    assert_eq!(
        t.read_bytes().unwrap(),
        plain,
        "the plugin's own copies round-trip"
    );
    // SAFETY: Cobalt's device addresses are real addresses inside its private
    // arena; reading 64 bytes there is what a buggy host would do.
    let raw = unsafe { std::slice::from_raw_parts(t.buffer().ptr().cast::<u8>(), 64) };
    assert_ne!(
        raw,
        plain.as_slice(),
        "device bytes must not be stored in the clear"
    );
}

#[test]
fn tensors_move_between_vendors_in_both_directions_and_strided() {
    let (_serial, runtime) = runtime();
    let ferrite = &runtime.devices_of("ferrite")[0];
    let cobalt = &runtime.devices_of("cobalt")[0];
    let values: Vec<f32> = (0..24).map(|i| i as f32 * 0.5).collect();
    let on_ferrite = ferrite.from_slice(&values, &[4, 6]).unwrap();
    let on_cobalt = on_ferrite.to_device(cobalt).unwrap();
    assert_eq!(on_cobalt.to_vec::<f32>().unwrap(), values);
    let back = on_cobalt.to_device(ferrite).unwrap();
    assert_eq!(back.to_vec::<f32>().unwrap(), values);
    // A transposed view crosses through host staging and arrives compact.
    let transposed = on_cobalt.transpose(0, 1).unwrap();
    let moved = transposed.to_device(ferrite).unwrap();
    assert!(moved.is_compact());
    assert_eq!(
        moved.to_vec::<f32>().unwrap(),
        transposed.to_vec::<f32>().unwrap()
    );
    // Work on one vendor's result continues on the other's device.
    let doubled = cobalt.empty(DType::F32, &[4, 6]).unwrap();
    cobalt
        .exec()
        .add(&on_cobalt, &on_cobalt, &doubled, 1.0)
        .unwrap();
    let on_ferrite2 = doubled.to_device(ferrite).unwrap();
    let expected: Vec<f32> = values.iter().map(|v| v * 2.0).collect();
    assert_eq!(on_ferrite2.to_vec::<f32>().unwrap(), expected);
}

#[test]
fn ferrite_devices_copy_between_each_other() {
    let (_serial, runtime) = runtime();
    let ferrite = runtime.devices_of("ferrite");
    assert!(
        ferrite.len() >= 2,
        "Ferrite exposes several devices by default"
    );
    let t = ferrite[0].from_slice(&[1i64, 2, 3], &[3]).unwrap();
    let u = t.to_device(&ferrite[1]).unwrap();
    assert_eq!(u.device(), &ferrite[1]);
    assert_eq!(u.to_vec::<i64>().unwrap(), [1, 2, 3]);
}

#[test]
fn each_device_counts_the_memory_its_buffers_hold_and_the_peak() {
    let (_serial, runtime) = runtime();
    let ferrite = &runtime.devices_of("ferrite")[0];
    let cobalt = &runtime.devices_of("cobalt")[0];
    let base = ferrite.memory_in_use();
    ferrite.reset_peak_memory();
    let a = ferrite.empty(DType::F32, &[1000]).unwrap();
    let b = ferrite.empty(DType::F32, &[500]).unwrap();
    assert_eq!(ferrite.memory_in_use(), base + 6000);
    drop(a);
    assert_eq!(ferrite.memory_in_use(), base + 2000);
    assert_eq!(ferrite.peak_memory_in_use(), base + 6000);
    // Views share their buffer: no new bytes.
    let v = b.clone();
    assert_eq!(ferrite.memory_in_use(), base + 2000);
    drop((b, v));
    assert_eq!(ferrite.memory_in_use(), base);
    ferrite.reset_peak_memory();
    assert_eq!(ferrite.peak_memory_in_use(), base);
    // Another device's count is its own.
    let c = cobalt.empty(DType::F32, &[10]).unwrap();
    assert_eq!(ferrite.memory_in_use(), base);
    assert!(cobalt.memory_in_use() >= 40);
    drop(c);
}

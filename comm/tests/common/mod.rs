//! What the device-collective tests share: the plugin libraries the
//! workspace built, one thread rank per device, and exact inputs.

#![allow(dead_code)] // not every test file needs every helper

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::Duration;

use half::{bf16, f16};
use polychip_comm::collectives::Communicator;
use polychip_comm::device::DeviceComm;
use polychip_comm::shm::ShmTransport;
use polychip_comm::store::MemoryStore;
use polychip_host::{DType, Device, LoadOptions, Runtime, Tensor};

/// A plugin library the workspace built beside this test's profile.
pub fn built(file: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("profile dir");
    [dir.join(file), dir.join("deps").join(file)]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "{file} is not in {}: run `cargo build --workspace` first",
                dir.display()
            )
        })
}

/// Loads Ferrite and Cobalt once per process; returns `vendor:index`.
pub fn device(vendor: &str, index: usize) -> Device {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    let rt = RUNTIME.get_or_init(|| {
        let files = [
            built("libpolychip_vendor_ferrite.so"),
            PathBuf::from(cobalt::LIBRARY_PATH),
        ];
        let rt = Runtime::load(&files, &LoadOptions::default());
        assert!(rt.failures().is_empty(), "{:?}", rt.failures());
        rt
    });
    rt.devices_of(vendor)[index].clone()
}

/// Runs `f` on one thread rank per device (connect and collective
/// timeouts `timeout`); results in rank order.
pub fn world<T: Send>(
    devices: &[Device],
    timeout: Duration,
    f: impl Fn(&Device, &mut DeviceComm) -> T + Sync,
) -> Vec<T> {
    world_ending(devices, timeout, f, true)
}

/// [`world`] for ranks whose calls may fail: they end in step on a
/// thread barrier rather than the communicator's.
#[allow(dead_code)]
pub fn world_of_failures<T: Send>(
    devices: &[Device],
    timeout: Duration,
    f: impl Fn(&Device, &mut DeviceComm) -> T + Sync,
) -> Vec<T> {
    world_ending(devices, timeout, f, false)
}

fn world_ending<T: Send>(
    devices: &[Device],
    timeout: Duration,
    f: impl Fn(&Device, &mut DeviceComm) -> T + Sync,
    barrier: bool,
) -> Vec<T> {
    let (store, n) = (Arc::new(MemoryStore::new()), devices.len());
    let ended = std::sync::Barrier::new(n);
    thread::scope(|s| {
        let handles: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(r, d)| {
                let (store, f, ended) = (store.clone(), &f, &ended);
                s.spawn(move || {
                    let t = ShmTransport::new(&*store, r, n, timeout).expect("connect");
                    let mut c = Communicator::new(Arc::new(t)).expect("communicator");
                    c.set_timeout(timeout);
                    let out = f(d, &mut DeviceComm::new(&mut c));
                    // No rank leaves while another may still read from it
                    // (a reduce's non-root ranks finish first).
                    match barrier {
                        true => c.barrier().expect("final barrier"),
                        false => _ = ended.wait(),
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    })
}

/// Rank `rank`'s input: small integers, exact in every float dtype.
pub fn values(rank: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| ((i * 7 + rank * 5) % 17) as f32 - 8.0)
        .collect()
}

pub fn encode(dtype: DType, xs: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F32 => xs.iter().flat_map(|x| x.to_ne_bytes()).collect(),
        DType::BF16 => xs
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_ne_bytes())
            .collect(),
        DType::F16 => xs
            .iter()
            .flat_map(|&x| f16::from_f32(x).to_ne_bytes())
            .collect(),
        DType::I32 => xs.iter().flat_map(|&x| (x as i32).to_ne_bytes()).collect(),
        DType::I64 => xs.iter().flat_map(|&x| (x as i64).to_ne_bytes()).collect(),
        DType::F64 => xs.iter().flat_map(|&x| (x as f64).to_ne_bytes()).collect(),
        // Wrapping, as the reduction does.
        DType::U8 => xs.iter().map(|&x| x as i64 as u8).collect(),
        _ => unreachable!(),
    }
}

pub fn tensor(d: &Device, dtype: DType, xs: &[f32]) -> Tensor {
    let t = d.empty(dtype, &[xs.len() as i64]).unwrap();
    t.write_bytes(&encode(dtype, xs)).unwrap();
    t
}

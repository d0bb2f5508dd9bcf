//! The OpenCL plugin's devices in collectives beside Ferrite and Cobalt:
//! its memory is private (opaque OpenCL buffers), so the communication
//! layer moves its tensors by the staged path. Needs `cargo build
//! --workspace` first and an OpenCL driver (`scripts/install-deps`
//! installs PoCL); without a device the tests say why and pass, unless
//! `POLYCHIP_REQUIRE_OPENCL=1` (as `scripts/test` sets) makes that a failure.

mod common;
use common::{built, encode, tensor, values, world};

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use polychip_comm::collectives::ReduceOp;
use polychip_comm::device::Path;
use polychip_host::{DType, Device, LoadOptions, Runtime};

fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        let files = [
            built("libpolychip_vendor_ferrite.so"),
            PathBuf::from(cobalt::LIBRARY_PATH),
            built("libpolychip_opencl.so"),
        ];
        let rt = Runtime::load(&files, &LoadOptions::default());
        assert!(rt.failures().is_empty(), "{:?}", rt.failures());
        rt
    })
}

/// Ferrite:0, Cobalt:0 and OpenCL:0, or `None` (with the reason printed)
/// when the machine has no OpenCL device.
fn three_vendors() -> Option<Vec<Device>> {
    let rt = runtime();
    let Some(opencl) = rt.devices_of("opencl").first().cloned() else {
        let why = "no OpenCL device (install an OpenCL driver: scripts/install-deps installs PoCL)";
        assert!(
            std::env::var("POLYCHIP_REQUIRE_OPENCL").as_deref() != Ok("1"),
            "{why}, and POLYCHIP_REQUIRE_OPENCL=1"
        );
        eprintln!("skipped: {why}");
        return None;
    };
    Some(vec![
        rt.devices_of("ferrite")[0].clone(),
        rt.devices_of("cobalt")[0].clone(),
        opencl,
    ])
}

#[test]
fn all_reduce_mixes_opencl_with_ferrite_and_cobalt() {
    let Some(devices) = three_vendors() else {
        return;
    };
    let paths = world(&devices, Duration::from_secs(30), |d, dc| {
        let me = dc.comm().rank();
        for dtype in [DType::F32, DType::BF16] {
            for count in [0, 1, 1000, 1 << 20, (1 << 21) + 3] {
                let t = tensor(d, dtype, &values(me, count));
                dc.all_reduce(&t, ReduceOp::Sum).unwrap();
                let inputs: Vec<Vec<f32>> = (0..3).map(|r| values(r, count)).collect();
                let want: Vec<f32> = (0..count)
                    .map(|i| inputs.iter().map(|x| x[i]).sum())
                    .collect();
                assert!(
                    t.read_bytes().unwrap() == encode(dtype, &want),
                    "rank {me} ({d}) {dtype} x {count}"
                );
            }
        }
        dc.last_path().unwrap()
    });
    assert_eq!(paths, [Path::DeviceDirect, Path::Staged, Path::Staged]);
}

#[test]
fn broadcast_and_all_gather_from_and_to_the_opencl_rank() {
    let Some(devices) = three_vendors() else {
        return;
    };
    world(&devices, Duration::from_secs(30), |d, dc| {
        let me = dc.comm().rank();
        let count = 10_007;
        let t = tensor(d, DType::F32, &values(me, count));
        dc.broadcast(&t, 2).unwrap();
        assert!(t.read_bytes().unwrap() == encode(DType::F32, &values(2, count)));
        let mine = tensor(d, DType::F32, &values(me, count));
        let all = d.empty(DType::F32, &[3 * count as i64]).unwrap();
        dc.all_gather(&mine, &all).unwrap();
        let want: Vec<f32> = (0..3).flat_map(|r| values(r, count)).collect();
        assert!(
            all.read_bytes().unwrap() == encode(DType::F32, &want),
            "rank {me}"
        );
    });
}

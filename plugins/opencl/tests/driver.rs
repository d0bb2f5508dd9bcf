//! The plugin's driver side through the host: the props the driver gives,
//! allocations past the driver's limits, views at byte offsets inside an
//! allocation, copies both ways and on the device, streams ordered by
//! events across queues. Needs an OpenCL device (PoCL on a CPU is enough);
//! without one each test says why and passes, unless
//! `POLYCHIP_REQUIRE_OPENCL=1` makes that a failure.

use std::path::PathBuf;
use std::sync::OnceLock;

use polychip_host::{DType, Device, ErrorCode, LoadOptions, Runtime};

fn plugin_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("profile dir");
    let file = "libpolychip_opencl.so";
    // `cargo test` refreshes the copy in deps/, `cargo build` both: the
    // newer one is this source's.
    [dir.join(file), dir.join("deps").join(file)]
        .into_iter()
        .filter(|p| p.exists())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| {
            panic!(
                "{file} is not in {}: run `cargo build` first",
                dir.display()
            )
        })
}

fn device() -> Option<Device> {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    let rt = RUNTIME.get_or_init(|| {
        let rt = Runtime::load(&[plugin_path()], &LoadOptions::default());
        assert!(rt.failures().is_empty(), "{:?}", rt.failures());
        rt
    });
    let found = rt.devices().first().cloned();
    if found.is_none() {
        let why = "no OpenCL device (install a driver: scripts/install-deps installs PoCL)";
        assert!(
            std::env::var("POLYCHIP_REQUIRE_OPENCL").as_deref() != Ok("1"),
            "{why}, and POLYCHIP_REQUIRE_OPENCL=1"
        );
        eprintln!("skipped: {why}");
    }
    found
}

#[test]
fn props_come_from_the_driver_and_memory_is_private() {
    let Some(d) = device() else { return };
    let p = d.props();
    assert!(p.memory_bytes > 1 << 20, "{p:?}");
    assert!(p.compute_units > 0 && p.peak_flops_f32 > 0.0, "{p:?}");
    assert!(!p.host_visible && !p.rdma_exportable, "{p:?}");
    // "device (platform)", or the device alone: never a name cut short.
    assert!(!p.name.contains(" (") || p.name.ends_with(')'), "{p:?}");
    // Every operator but ABI 1.4's gather and scatter_add, not written for
    // OpenCL yet (docs/abi.md).
    assert_eq!(d.plugin().ops().missing(), ["gather", "scatter_add"]);
}

#[test]
fn allocations_past_the_drivers_limits_are_out_of_memory_with_the_figures() {
    let Some(d) = device() else { return };
    let e = d.alloc(d.props().memory_bytes + 1).unwrap_err();
    assert_eq!(e.code(), ErrorCode::OutOfMemory, "{e}");
    let text = e.to_string();
    assert!(
        text.contains("CL_DEVICE_MAX_MEM_ALLOC_SIZE") || text.contains("bytes are free"),
        "{text}"
    );
    // Memory freed is usable again: many allocations in a row do not run
    // out of address space.
    for _ in 0..2000 {
        drop(d.alloc(1 << 20).unwrap());
    }
}

#[test]
fn views_at_byte_offsets_read_and_write_their_own_elements() {
    let Some(d) = device() else { return };
    let all = d.zeros(DType::F32, &[1000]).unwrap();
    // Elements 37..137, written through the view, land there.
    let view = all.as_strided(&[100], &[1], 37).unwrap();
    let xs: Vec<f32> = (0..100).map(|i| i as f32 + 0.5).collect();
    view.write_bytes(&xs.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<_>>())
        .unwrap();
    let back = all.to_vec::<f32>().unwrap();
    assert!(back[..37].iter().all(|&x| x == 0.0));
    assert_eq!(&back[37..137], &xs[..]);
    assert!(back[137..].iter().all(|&x| x == 0.0));
    // An operator on a strided view at an offset: every third element of
    // 500..800 doubled, the rest untouched.
    let every_third = all.as_strided(&[100], &[3], 500).unwrap();
    d.exec().fill(&every_third, 2.0).unwrap();
    let back = all.to_vec::<f32>().unwrap();
    for (i, &x) in back.iter().enumerate() {
        let want = if (500..800).contains(&i) && (i - 500) % 3 == 0 {
            2.0
        } else if (37..137).contains(&i) {
            xs[i - 37]
        } else {
            0.0
        };
        assert_eq!(x, want, "element {i}");
    }
    // A device-to-device copy into another allocation, at an offset.
    let other = d.zeros(DType::F32, &[300]).unwrap();
    let dst = other.as_strided(&[100], &[1], 200).unwrap();
    d.exec().copy(&view, &dst).unwrap();
    assert_eq!(&other.to_vec::<f32>().unwrap()[200..], &xs[..]);
}

#[test]
fn streams_are_ordered_by_events_across_queues() {
    let Some(d) = device() else { return };
    let n = 1 << 22;
    let t = d.zeros(DType::F32, &[n]).unwrap();
    let (s1, s2) = (d.stream().unwrap(), d.stream().unwrap());
    for round in 0..5 {
        s1.exec().fill(&t, f64::from(round)).unwrap();
        let done = s1.record().unwrap();
        s2.wait(&done).unwrap();
        s2.exec().scale(&t, 2.0).unwrap();
        s2.synchronize().unwrap();
        let back = t.to_vec::<f32>().unwrap();
        let want = 2.0 * round as f32;
        assert!(back.iter().all(|&x| x == want), "round {round}");
    }
}

#[test]
fn a_refused_call_on_a_stream_names_the_problem() {
    let Some(d) = device() else { return };
    let table = d.zeros(DType::F32, &[10, 4]).unwrap();
    let ids = d.from_slice(&[1i64, 12, 3], &[3]).unwrap();
    let out = d.zeros(DType::F32, &[3, 4]).unwrap();
    let s = d.stream().unwrap();
    let e = s
        .exec()
        .embedding(&table, &ids, &out)
        .and_then(|()| s.synchronize())
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert!(e.to_string().contains("12"), "{e}");
}

//! The plugin's driver side through the host: the props the driver gives,
//! allocations past the driver's limits, views at byte offsets inside an
//! allocation, copies both ways and on the device, streams ordered by
//! events across queues; and `gather` and `scatter_add` at sizes past the
//! conformance suite's (index_select and index_add with many places,
//! reproducible, nothing written on a bad index). Needs an OpenCL device (PoCL on a CPU is enough);
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
    // Every operator of the ABI.
    assert_eq!(d.plugin().ops().missing(), Vec::<&str>::new());
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

/// Numbers from a fixed linear congruential sequence.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn below(&mut self, n: usize) -> i64 {
        (self.next() % n as u64) as i64
    }

    fn unit(&mut self) -> f32 {
        (self.next() % 2001) as f32 / 1000.0 - 1.0
    }
}

/// `dst[.., idx[k, j], ..] += src[k, j]` along dim 0 of a [places, cols]
/// dst, in f64 and rounded once (what the plugin computes where the
/// device has f64; within an f32 sum's rounding of it elsewhere).
fn index_add_reference(
    dst: &[f32],
    cols: usize,
    idx: &[i64],
    per_col: bool,
    src: &[f32],
) -> Vec<f32> {
    let mut sums: Vec<f64> = dst.iter().map(|&x| f64::from(x)).collect();
    let k_len = src.len() / cols;
    for k in 0..k_len {
        for j in 0..cols {
            let i = if per_col { idx[k * cols + j] } else { idx[k] };
            sums[i as usize * cols + j] += f64::from(src[k * cols + j]);
        }
    }
    sums.into_iter().map(|x| x as f32).collect()
}

/// Elements of `got` within `rel` of the sum of magnitudes of `want`'s
/// terms (bounded by the largest magnitude times the updates a place
/// gets; a loose bound is enough here: the conformance suite holds the
/// exact one).
fn assert_close(got: &[f32], want: &[f32], what: &str) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * w.abs().max(1.0),
            "{what}: element {i}: {g} against {w}"
        );
    }
}

#[test]
fn index_select_and_index_add_with_many_places_match_the_reference_and_repeat() {
    let Some(d) = device() else { return };
    let (places, cols, k_len) = (1000usize, 37usize, 5000usize);
    let mut rng = Lcg(7);
    let table: Vec<f32> = (0..places * cols).map(|_| rng.unit()).collect();
    let ids: Vec<i64> = (0..k_len).map(|_| rng.below(places)).collect();
    let src: Vec<f32> = (0..k_len * cols).map(|_| rng.unit()).collect();
    let (p, c, k) = (places as i64, cols as i64, k_len as i64);
    let index = d.from_slice(&ids, &[k]).unwrap();
    // index_select: one line of ids expanded over the columns.
    let expanded = index.as_strided(&[k, c], &[1, 0], 0).unwrap();
    let input = d.from_slice(&table, &[p, c]).unwrap();
    let out = d.zeros(DType::F32, &[k, c]).unwrap();
    d.exec().gather(&input, &expanded, &out, 0).unwrap();
    let got = out.to_vec::<f32>().unwrap();
    for (r, &id) in ids.iter().enumerate() {
        let row = &table[id as usize * cols..][..cols];
        assert_eq!(&got[r * cols..][..cols], row, "row {r}");
    }
    // index_add: 5,000 updates into 1,000 places of each column, twice
    // from the same start: the same bits both times.
    let updates = d.from_slice(&src, &[k, c]).unwrap();
    let want = index_add_reference(&table, cols, &ids, false, &src);
    let mut runs = Vec::new();
    for _ in 0..2 {
        let dst = d.from_slice(&table, &[p, c]).unwrap();
        d.exec().scatter_add(&dst, &expanded, &updates, 0).unwrap();
        runs.push(dst.to_vec::<f32>().unwrap());
    }
    assert_close(&runs[0], &want, "index_add");
    assert!(
        runs[0]
            .iter()
            .zip(&runs[1])
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "two runs differ"
    );
    // Each column its own indices, into many places and into few.
    for places in [1000usize, 8] {
        let p = places as i64;
        let ids: Vec<i64> = (0..k_len * cols).map(|_| rng.below(places)).collect();
        let index = d.from_slice(&ids, &[k, c]).unwrap();
        let start = &table[..places * cols];
        let dst = d.from_slice(start, &[p, c]).unwrap();
        d.exec().scatter_add(&dst, &index, &updates, 0).unwrap();
        let want = index_add_reference(start, cols, &ids, true, &src);
        assert_close(
            &dst.to_vec::<f32>().unwrap(),
            &want,
            &format!("{places} places"),
        );
    }
}

#[test]
fn a_bad_index_after_many_good_ones_writes_nothing() {
    let Some(d) = device() else { return };
    let (places, k_len) = (1000i64, 5000usize);
    let mut ids: Vec<i64> = (0..k_len as i64).map(|i| (i * 7) % places).collect();
    ids[k_len - 3] = places;
    let index = d.from_slice(&ids, &[k_len as i64]).unwrap();
    let src = d.from_slice(&vec![1.0f32; k_len], &[k_len as i64]).unwrap();
    let start: Vec<f32> = (0..places).map(|i| i as f32).collect();
    let s = d.stream().unwrap();
    for few in [false, true] {
        // Many places (the sorted runs) and, through a view of the first
        // 8 with the index's values kept, few (the walk).
        let dst = d.from_slice(&start, &[places]).unwrap();
        let view = if few {
            dst.as_strided(&[8], &[1], 0).unwrap()
        } else {
            dst.clone()
        };
        // The call and the stream's wait: an INVALID_ARGUMENT error.
        let refused = |call: polychip_host::Result<()>| {
            let e = call.and_then(|()| s.synchronize()).unwrap_err();
            assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
            e.to_string()
        };
        let text = refused(s.exec().scatter_add(&view, &index, &src, 0));
        let bad = if few {
            "element 2 (row-major) of index is 14"
        } else {
            "element 4997 (row-major) of index is 1000"
        };
        assert!(text.contains(bad), "{text}");
        assert_eq!(dst.to_vec::<f32>().unwrap(), start, "dst written");
        let out = d.zeros(DType::F32, &[k_len as i64]).unwrap();
        let text = refused(s.exec().gather(&view, &index, &out, 0));
        assert!(text.contains(bad), "{text}");
        assert!(
            out.to_vec::<f32>().unwrap().iter().all(|&x| x == 0.0),
            "out written"
        );
    }
}

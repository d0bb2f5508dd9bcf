//! The staged collectives keep the ABI's rule that one stream's calls are
//! serialized: with Cobalt's strict streams on (a copy fails while another
//! thread's copy runs on the same stream, and each copy lasts 200 us), a
//! pipelined all-reduce of many chunks and one on a caller's stream run
//! clean. Before the copy threads had streams of their own, the loader and
//! the storer copied on the default stream at once and this failed. The
//! file holds one test, so that the variable is set before any thread
//! starts or the plugin loads. Needs `cargo build --workspace` first.

mod common;
use common::{built, tensor, values, world};

use std::path::PathBuf;
use std::time::Duration;

use polychip_comm::collectives::ReduceOp;
use polychip_host::{DType, LoadOptions, Runtime};

#[test]
fn staged_copy_threads_never_share_a_stream_and_strict_streams_catch_one_that_does() {
    // SAFETY: this binary's only test sets it first, before any other
    // thread exists and before the plugin reads it at load.
    unsafe { std::env::set_var("POLYCHIP_COBALT_STRICT_STREAMS", "1") };
    let files = [
        built("libpolychip_vendor_ferrite.so"),
        PathBuf::from(cobalt::LIBRARY_PATH),
    ];
    let rt = Runtime::load(&files, &LoadOptions::default());
    assert!(rt.failures().is_empty(), "{:?}", rt.failures());
    let cobalt = rt.devices_of("cobalt")[0].clone();
    let devices = [
        rt.devices_of("ferrite")[0].clone(),
        cobalt.clone(),
        rt.devices_of("ferrite")[1].clone(),
    ];
    let count = 10_007;
    let want: Vec<f32> = (0..count)
        .map(|i| (0..3).map(|r| values(r, count)[i]).sum())
        .collect();
    world(&devices, Duration::from_secs(30), |d, dc| {
        let me = dc.comm().rank();
        // Many chunks: the staged rank's loader and storer copy at once.
        dc.set_chunk_bytes(4000);
        let t = tensor(d, DType::F32, &values(me, count));
        dc.all_reduce(&t, ReduceOp::Sum).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), want, "rank {me}");
    });

    // The detector itself: two threads copying on the default stream at
    // once are refused, naming the rule.
    let src = tensor(&cobalt, DType::F32, &values(0, 1 << 14));
    let barrier = std::sync::Barrier::new(2);
    let errors: Vec<String> = std::thread::scope(|s| {
        let copy = || {
            barrier.wait();
            (0..50)
                .filter_map(|_| src.to_vec::<f32>().err().map(|e| e.to_string()))
                .collect::<Vec<_>>()
        };
        let a = s.spawn(copy);
        let b = s.spawn(copy);
        [a.join().unwrap(), b.join().unwrap()].concat()
    });
    assert!(
        errors
            .iter()
            .any(|e| e.contains("in use by another thread") && e.contains("serialize")),
        "two threads on one stream went unnoticed: {errors:?}"
    );
}

//! `fill` of 16 f32 through the host, N times: the dispatch path alone, for
//! counting instructions with callgrind (repeatable on a noisy machine,
//! unlike wall-clock time). docs/performance.md quotes the count per call:
//!
//! ```sh
//! cargo build --release --workspace && cargo build --release -p polychip-tests --example fill_loop
//! for n in 20000 40000; do valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!   target/release/examples/fill_loop target/release/libpolychip_vendor_ferrite.so $n 2>&1 | grep Collected; done
//! ```
//!
//! The difference of the two totals over 20000 is the count per call.

use std::hint::black_box;

use polychip_host::{DType, LoadOptions, Runtime};

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(plugin), Some(calls)) = (
        args.next(),
        args.next().and_then(|n| n.parse::<usize>().ok()),
    ) else {
        eprintln!("usage: fill_loop PLUGIN.so CALLS");
        std::process::exit(2);
    };
    let runtime = Runtime::load(&[plugin], &LoadOptions::default());
    assert!(runtime.failures().is_empty(), "{:?}", runtime.failures());
    let device = runtime.devices()[0].clone();
    let exec = device.exec();
    let tiny = device.zeros(DType::F32, &[16]).unwrap();
    for _ in 0..calls {
        exec.fill(black_box(&tiny), black_box(1.0)).unwrap();
    }
}

//! What the shared-memory check (`check::apart`) costs one call of a
//! three-tensor operator (an `add` of `[64, 1024]` f32): with the tensors
//! apart, and in place (the output is its first input). Prints the median
//! of 7 rounds of 10 million calls each.
//!
//! `cargo run --release -p polychip-plugin-sdk --example apart_cost`

use std::hint::black_box;
use std::time::Instant;

use polychip_plugin_sdk::{DType, TensorDesc, check};

fn per_call(f: impl Fn()) -> f64 {
    const CALLS: usize = 10_000_000;
    let mut rounds: Vec<f64> = (0..7)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..CALLS {
                f();
            }
            start.elapsed().as_secs_f64() * 1e9 / CALLS as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[rounds.len() / 2]
}

fn main() {
    let shape = [64i64, 1024];
    let at = |addr: usize| TensorDesc::new(addr as *mut u8, DType::F32, &shape, None);
    let (a, b, out) = (at(0x1000_0000), at(0x2000_0000), at(0x3000_0000));
    let apart = per_call(|| {
        let (a, b, out) = (black_box(&a), black_box(&b), black_box(&out));
        let inputs = [("a", Some(a)), ("b", Some(b))];
        black_box(check::apart(
            "add",
            &inputs,
            &[("out", Some(out), &["a", "b"])],
        ))
        .unwrap();
    });
    let in_place = per_call(|| {
        let (a, b) = (black_box(&a), black_box(&b));
        let inputs = [("a", Some(a)), ("b", Some(b))];
        black_box(check::apart(
            "add",
            &inputs,
            &[("out", Some(a), &["a", "b"])],
        ))
        .unwrap();
    });
    println!(
        "check::apart, add of three [64, 1024] f32 tensors: {apart:.1} ns a call apart, {in_place:.1} ns in place (median of 7 rounds)"
    );
}

//! One pipeline stage of `deep`'s blocks timed in a plain loop, no
//! pipeline around it: the figures of docs/performance.md, stop 34 (a
//! short stage's cost per block against a long one's; a micro-batch held in
//! flight). Build first (`cargo build --release --workspace`), then
//!
//! ```sh
//! cargo run --release -p polychip-train --example stage_loop -- VENDOR BLOCKS [held]
//! ```
//!
//! `VENDOR` is `ferrite` or `cobalt`, `BLOCKS` the stage's blocks (from 1
//! to 16); `held` runs each micro-batch's forward pass before the previous
//! one's backward pass, as 1F1B's first stage holds one more in flight.
//! Four sequences a micro-batch, f32, 15 rounds (the first dropped); prints
//! the medians of the forward and the whole backward pass, and per block.
//! Pin it (`taskset -c 0`): Ferrite spreads over the free cores otherwise.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Instant;

use polychip_host::{LoadOptions, Runtime};
use polychip_train::config::{ModelConfig, Precision};
use polychip_train::model::{Stage, StageInput};
use polychip_train::params::{Cut, StageRange};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: stage_loop ferrite|cobalt BLOCKS [held]";
    let (vendor, blocks) = match &args[..] {
        [v, n, ..] => (v.as_str(), n.parse::<usize>().expect(usage)),
        _ => panic!("{usage}"),
    };
    let held = args.get(2).is_some_and(|a| a == "held");
    let cfg = ModelConfig::preset("deep").expect("deep");
    assert!((1..=cfg.layers).contains(&blocks), "{usage}");
    // Ferrite's library beside the example's directory (target/release).
    let exe = std::env::current_exe().expect("the example's path");
    let profile_dir = exe.ancestors().nth(2).expect("target/<profile>");
    let ferrite = profile_dir.join("libpolychip_vendor_ferrite.so");
    let rt = Runtime::load(
        &[ferrite, PathBuf::from(cobalt::LIBRARY_PATH)],
        &LoadOptions::default(),
    );
    let dev = rt
        .devices_of(vendor)
        .first()
        .cloned()
        .unwrap_or_else(|| panic!("no {vendor} device: {:?}", rt.failures()));
    let range = StageRange {
        start: Cut::at(0),
        end: Cut::block(blocks),
        embed: false,
        head: false,
    };
    let stage = Stage::new(&cfg, range, Precision::F32, &dev, 3).expect("the stage");
    let b = 4;
    let n = b * cfg.seq_len * cfg.dim;
    let shape = [b as i64, cfg.seq_len as i64, cfg.dim as i64];
    let x: Vec<f32> = vec![0.5; n];
    let g: Vec<f32> = (0..n).map(|i| ((i % 7) as f32 - 3.0) * 1e-3).collect();
    let (mut forward, mut backward) = (Vec::new(), Vec::new());
    let mut in_flight = VecDeque::new();
    let depth = if held { 2 } else { 1 };
    for _ in 0..15 + depth - 1 {
        let input = dev.from_slice(&x, &shape).expect("an input");
        let start = Instant::now();
        let (saved, _, _) = stage
            .forward(StageInput::Hidden(input), None)
            .expect("forward");
        forward.push(start.elapsed().as_secs_f64() * 1e3);
        in_flight.push_back(saved);
        if in_flight.len() == depth {
            let grad = dev.from_slice(&g, &shape).expect("a gradient");
            let saved = in_flight.pop_front().expect("one in flight");
            let start = Instant::now();
            stage.backward(saved, Some(grad), 1.0).expect("backward");
            backward.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    let median = |mut v: Vec<f64>| {
        v.remove(0);
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (f, bw) = (median(forward), median(backward));
    let k = blocks as f64;
    println!(
        "{vendor} {blocks} block(s){}: forward {f:.2} ms, backward {bw:.2} ms a micro-batch; \
         per block {:.2} + {:.2} = {:.2} ms",
        if held { ", one micro-batch held" } else { "" },
        f / k,
        bw / k,
        (f + bw) / k
    );
}

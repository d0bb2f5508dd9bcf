//! Search time of `polychip_planner::search::plan` against the number of
//! chip types (issue 15): 1 to 12 types of 64 chips each (8 per node),
//! derived from the three types of `examples/clusters/china-mobile-3-vendor.toml`
//! with their peak FLOP/s and memory varied per copy, Llama 2 70B, global
//! batch 1,024. `cargo bench -p polychip-planner --bench types`.

use std::time::Instant;

use polychip_planner::cluster::ClusterSpec;
use polychip_planner::model::ModelSpec;
use polychip_planner::search::{PlanOptions, plan};
use polychip_planner::settings::TrainingSettings;

/// A cluster of `n` chip types, 64 chips each.
pub fn cluster_of(base: &ClusterSpec, n: usize) -> ClusterSpec {
    let mut out = base.clone();
    out.chip_types = (0..n)
        .map(|i| {
            let mut c = base.chip_types[i % base.chip_types.len()].clone();
            let f = 1.0 + 0.07 * i as f64;
            c.name = format!("{}-{i}", c.name);
            c.count = 64;
            c.peak_flops.f32 *= f;
            c.peak_flops.bf16 *= f;
            c.peak_flops.f16 *= f;
            c.memory_bytes += (i as u64) << 30;
            c
        })
        .collect();
    out
}

fn main() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/clusters/china-mobile-3-vendor.toml"
    );
    let base = ClusterSpec::load(path.as_ref()).expect("example cluster");
    let model = ModelSpec::llama_70b();
    let settings = TrainingSettings::new(1024);
    let limit: f64 = std::env::var("TYPES_BENCH_LIMIT_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60.0);
    println!(
        "{:>5}  {:>10}  {:>12}  {:>12}",
        "types", "search s", "candidates", "tokens/s"
    );
    for n in 1..=12 {
        let cluster = cluster_of(&base, n);
        let start = Instant::now();
        let result = plan(&model, &cluster, &settings, &PlanOptions::default());
        let secs = start.elapsed().as_secs_f64();
        match result {
            Ok(r) => println!(
                "{n:>5}  {secs:>10.3}  {:>12}  {:>12.0}",
                r.candidates, r.plan.tokens_per_s
            ),
            Err(e) => println!("{n:>5}  {secs:>10.3}  error: {e}"),
        }
        if secs > limit {
            println!("stopping: {secs:.1} s is over the limit of {limit} s");
            break;
        }
    }
}

//! Search time of `polychip_planner::search::plan` against the number of
//! chip types (issue 15): 1 to 12 types of 64 chips each (8 per node),
//! derived from the three types of `examples/clusters/china-mobile-3-vendor.toml`
//! with their peak FLOP/s and memory varied per copy, Llama 2 70B, global
//! batch 1,024. `cargo bench -p polychip-planner --bench types`.

use std::time::Instant;

#[path = "../tests/common/mod.rs"]
mod common;

use common::cluster_of;
use polychip_planner::model::ModelSpec;
use polychip_planner::search::{PlanOptions, plan};
use polychip_planner::settings::TrainingSettings;

fn main() {
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
        let cluster = cluster_of(n);
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

//! Search time of `polychip_planner::search::plan` for 16, 256, 1,024 and
//! 4,096 chips of 4 types (the types of `examples/clusters/h2-like-1024.toml`,
//! a quarter of the chips each) and the 100B model, global batch 2,048, with
//! the candidate plans evaluated. Targets (issue 5): 1,024 chips under 1 s,
//! 4,096 under 10 s. `cargo bench -p polychip-planner --bench search`.

use std::time::Instant;

use polychip_planner::cluster::ClusterSpec;
use polychip_planner::model::ModelSpec;
use polychip_planner::search::{PlanOptions, plan};
use polychip_planner::settings::TrainingSettings;

fn main() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/clusters/h2-like-1024.toml"
    );
    let base = ClusterSpec::load(path.as_ref()).expect("example cluster");
    let model = ModelSpec::h2_100b();
    let settings = TrainingSettings::new(2048);
    println!(
        "{:>6}  {:>10}  {:>12}  {:>12}  {:>7}  outcome",
        "chips", "search s", "candidates", "tokens/s", "ratio"
    );
    for chips in [16u64, 256, 1024, 4096] {
        let mut cluster = base.clone();
        for c in &mut cluster.chip_types {
            c.count = chips / 4;
            c.chips_per_node = c.chips_per_node.min(c.count);
        }
        let start = Instant::now();
        let result = plan(&model, &cluster, &settings, &PlanOptions::default());
        let secs = start.elapsed().as_secs_f64();
        match result {
            Ok(r) => println!(
                "{chips:>6}  {secs:>10.3}  {:>12}  {:>12.0}  {:>6.2}%  {:?}, dp {}",
                r.candidates,
                r.plan.tokens_per_s,
                100.0 * r.hetero_speedup_ratio.unwrap_or(f64::NAN),
                r.plan.kind,
                r.plan.dp
            ),
            Err(e) => println!(
                "{chips:>6}  {secs:>10.3}  {:>12}  {:>12}  {:>7}  {e}",
                0, "-", "-"
            ),
        }
    }
}

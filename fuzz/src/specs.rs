//! The planner's cluster, model (TOML or a Hugging Face config.json),
//! profile and plan-to-evaluate files and the trainer's model and plan
//! files from arbitrary text: parsed and
//! validated, or refused with an error naming the field, never a panic, an
//! overflow or an unbounded allocation.

use polychip_planner::cluster::ClusterSpec;
use polychip_planner::evaluate::{PlanSpec, evaluate};
use polychip_planner::model::ModelSpec;
use polychip_planner::profile::ProfileFile;
use polychip_planner::settings::TrainingSettings;
use polychip_train::config::ModelConfig;
use polychip_train::plan::TrainPlan;

/// The three-vendor example cluster (parsed once).
fn example_cluster() -> ClusterSpec {
    static CLUSTER: std::sync::OnceLock<ClusterSpec> = std::sync::OnceLock::new();
    CLUSTER
        .get_or_init(|| {
            ClusterSpec::from_toml_str(include_str!(
                "../../examples/clusters/china-mobile-3-vendor.toml"
            ))
            .expect("the example cluster parses")
        })
        .clone()
}

/// Prices a valid model's first layers (see [`run`]'s selector 1).
fn price(m: &ModelSpec) {
    use polychip_planner::cost::{
        Microbatching, StageShape, analytic_stage_timing, check_cluster_settings, stage_memory,
    };
    let cluster = example_cluster();
    let chip = &cluster.chip_types[0];
    for tp in [1, 2] {
        for ep in [1, 2, 8] {
            let mut settings = TrainingSettings::new(8);
            settings.expert_parallel = ep;
            settings.recompute = polychip_planner::settings::Recompute::Full;
            if check_cluster_settings(m, &cluster, &settings).is_err() {
                continue;
            }
            let stage = StageShape {
                chip,
                layers: 0..m.layers.min(2),
                index: 0,
                num_stages: 2,
                dp: 8,
                tp,
                next: None,
                dp_peers: &[],
                dp_one_node: false,
            };
            let mb = Microbatching { size: 2, count: 4 };
            let memory = stage_memory(m, &settings, &stage, mb);
            let timing = analytic_stage_timing(m, &settings, &cluster, &stage, mb);
            for v in [
                memory.total,
                timing.forward,
                timing.backward,
                timing.dp_allreduce,
            ] {
                assert!(
                    !v.is_nan(),
                    "{m:?} at tp {tp}, ep {ep}: {memory:?} {timing:?}"
                );
            }
        }
    }
}

/// One input: a selector byte (cluster, planner model, trainer model,
/// profile, plan to evaluate, trainer plan), then the text.
pub fn run(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    match which % 6 {
        0 => {
            let _ = ClusterSpec::from_toml_str(text);
        }
        1 => {
            // A planner model: TOML, or a Hugging Face config.json; one
            // that validates is priced (a stage of its first layers on
            // the example's first chip type, at tp 1 and 2, each expert-
            // parallel degree that divides its experts up to 8): memory
            // and times are numbers, never NaN.
            let model = match text.trim_start().starts_with('{') {
                true => ModelSpec::from_hf_config(text, "fuzz", None),
                false => ModelSpec::from_toml_str(text),
            };
            if let Ok(m) = model {
                price(&m);
            }
        }
        2 => {
            if let Ok(cfg) = toml::from_str::<ModelConfig>(text) {
                let _ = cfg.validate();
            }
        }
        4 => {
            // A profile file, applied to a cluster of the example's types
            // for a model of its own shape.
            if let Ok(p) = ProfileFile::from_json_str(text) {
                let mut c = example_cluster();
                let mut settings = TrainingSettings::new(1);
                settings.dtype = p.dtype;
                let _ = c.apply_profile(&p, &p.model, &settings);
            }
        }
        5 => {
            // A plan to evaluate (TOML or JSON), scored on the example
            // cluster for the 7B model.
            let json = text.trim_start().starts_with('{');
            if let Ok(spec) = PlanSpec::parse(text, json) {
                let m = ModelSpec::llama_7b();
                let _ = evaluate(&spec, &m, &example_cluster(), &TrainingSettings::new(1));
            }
        }
        _ => {
            // A plan file (TOML, or JSON when it starts with `{`), checked
            // against the `tiny` model and a batch of 8.
            let ext = if text.trim_start().starts_with('{') {
                "json"
            } else {
                "toml"
            };
            let dir = std::env::temp_dir().join(format!("polychip-fuzz-{}", std::process::id()));
            let _ = std::fs::create_dir_all(&dir);
            let file = dir.join(format!("plan.{ext}"));
            if std::fs::write(&file, text).is_ok()
                && let Ok(plan) = TrainPlan::load(&file)
            {
                let cfg = ModelConfig::preset("tiny").unwrap();
                let _ = plan.world_size();
                let _ = plan.describe();
                if plan.validate(&cfg, 8).is_ok() {
                    // A valid plan's roles: each micro-batch's size, and
                    // the parameters each stage's range holds.
                    for r in plan.roles() {
                        let sizes: usize = (0..r.micro_batches).map(|i| r.micro_batch(i)).sum();
                        assert_eq!(sizes, r.sequences, "{plan:?}");
                        let _ = polychip_train::params::stage_params(&cfg, &r.range);
                    }
                }
            }
        }
    }
}

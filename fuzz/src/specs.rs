//! The planner's cluster and model files and the trainer's plan files from
//! arbitrary text: parsed and validated, or refused with an error naming
//! the field, never a panic, an overflow or an unbounded allocation.

use polychip_planner::cluster::ClusterSpec;
use polychip_planner::model::ModelSpec;
use polychip_train::config::ModelConfig;
use polychip_train::plan::TrainPlan;

/// One input.
pub fn run(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    match which % 4 {
        0 => {
            let _ = ClusterSpec::from_toml_str(text);
        }
        1 => {
            let _ = ModelSpec::from_toml_str(text);
        }
        2 => {
            if let Ok(cfg) = toml::from_str::<ModelConfig>(text) {
                let _ = cfg.validate();
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
                let _ = plan.validate(&cfg, 8);
                let _ = plan.world_size();
            }
        }
    }
}

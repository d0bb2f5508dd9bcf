//! The model's shape and the training hyper-parameters: presets, TOML files
//! and their validation (every message names the field and the value).

use std::path::Path;

use polychip_files::{MAX_TEXT_FILE, read_text_file};
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};

/// The shape of a LLaMA-architecture decoder over byte tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// A name for reports and checkpoints.
    pub name: String,
    /// Vocabulary size; 256 for byte-level tokens.
    #[serde(default = "byte_vocab")]
    pub vocab: usize,
    /// Hidden size.
    pub dim: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention); divides `heads`.
    pub kv_heads: usize,
    /// Inner width of the SwiGLU feed-forward block.
    pub ffn: usize,
    /// Tokens per training sequence.
    pub seq_len: usize,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub norm_eps: f64,
    /// Rotary embedding base.
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
}

fn byte_vocab() -> usize {
    256
}
fn default_eps() -> f64 {
    1e-5
}
fn default_theta() -> f64 {
    10000.0
}

/// The largest value of each size of a [`ModelConfig`], in the order
/// `vocab, dim, layers, heads, kv_heads, ffn, seq_len`: the planner's
/// bounds ([`polychip_planner::model::MODEL_LIMITS`]), under which every
/// parameter and FLOP count is exact.
pub const MODEL_LIMITS: [(&str, usize); 7] = [
    ("vocab", 1 << 24),
    ("dim", 1 << 20),
    ("layers", 1024),
    ("heads", 1 << 16),
    ("kv_heads", 1 << 16),
    ("ffn", 1 << 22),
    ("seq_len", 1 << 20),
];

/// The largest global batch, in sequences (the planner's
/// [`polychip_planner::settings::MAX_GLOBAL_BATCH`]).
pub const MAX_GLOBAL_BATCH: usize = polychip_planner::settings::MAX_GLOBAL_BATCH as usize;

/// The smallest vocabulary a model may have: the trainer's data are byte
/// tokens ([`crate::data::VOCAB`] ids, 0..256, whatever the corpus), so the
/// embedding needs a row for each. An `--init-from` model keeps its larger
/// vocabulary; the byte ids index its first 256 rows.
pub const MIN_VOCAB: usize = crate::data::VOCAB;

/// Why a vocabulary of `vocab` entries cannot be trained, if it cannot:
/// the one rule for model files, checkpoints and Hugging Face configs.
pub fn vocab_too_small(vocab: usize) -> Option<String> {
    (vocab < MIN_VOCAB).then(|| {
        format!(
            "the trainer's data are byte tokens (0..{MIN_VOCAB}, the bundled byte-level \
             tokenizer), so the vocabulary must have at least {MIN_VOCAB} entries"
        )
    })
}

/// The longest model name accepted.
pub const MAX_NAME_CHARS: usize = 128;

/// The model presets [`ModelConfig::preset`] knows.
pub const MODEL_PRESETS: [&str; 4] = ["mini", "tiny", "small", "deep"];

impl ModelConfig {
    fn new(name: &str, dim: usize, layers: usize, heads: usize, kv: usize, ffn: usize) -> Self {
        ModelConfig {
            name: name.into(),
            vocab: 256,
            dim,
            layers,
            heads,
            kv_heads: kv,
            ffn,
            seq_len: 64,
            norm_eps: default_eps(),
            rope_theta: default_theta(),
        }
    }

    /// A preset: `mini` (tests: 2 blocks of width 32, sequences of 16),
    /// `tiny` (the default: 4 blocks of width 64, 0.2 M parameters) or
    /// `small` (6 blocks of width 128, sequences of 128) or `deep` (16
    /// blocks of width 64: fine-grained stage splits for the benchmarks).
    pub fn preset(name: &str) -> Result<Self> {
        Ok(match name {
            "mini" => ModelConfig {
                seq_len: 16,
                ..Self::new("mini", 32, 2, 4, 2, 64)
            },
            "tiny" => Self::new("tiny", 64, 4, 4, 2, 176),
            "deep" => Self::new("deep", 64, 16, 4, 2, 176),
            "small" => ModelConfig {
                seq_len: 128,
                ..Self::new("small", 128, 6, 8, 4, 352)
            },
            other => {
                return Err(TrainError::Config(format!(
                    "unknown model preset {}; the presets are {}, or give a TOML file",
                    polychip_comm::text::quoted(other),
                    MODEL_PRESETS.join(", ")
                )));
            }
        })
    }

    /// A preset name or the path of a TOML file with the fields of this struct.
    pub fn from_arg(arg: &str) -> Result<Self> {
        if MODEL_PRESETS.contains(&arg) {
            return Self::preset(arg);
        }
        let path = Path::new(arg);
        // A name that can only be a file (a directory in it, or `.toml`)
        // is read as one, so that a missing file is said to be missing
        // (it was "unknown model preset"), as `polychip plan` says it.
        if !path.exists() && !arg.contains('/') && !arg.ends_with(".toml") {
            return Self::preset(arg);
        }
        let text = read_text_file(path, MAX_TEXT_FILE).map_err(|e| TrainError::io(path, e))?;
        let cfg: ModelConfig = toml::from_str(&text).map_err(|e| {
            TrainError::Config(format!(
                "model file {}: {}",
                polychip_files::shown_path(path),
                polychip_files::toml_error(&text, &e)
            ))
        })?;
        cfg.validate().map_err(|e| {
            TrainError::Config(format!(
                "model file {}: {e}",
                polychip_files::shown_path(path)
            ))
        })?;
        Ok(cfg)
    }

    /// Checks that the shape is usable; the message names the field.
    pub fn validate(&self) -> std::result::Result<(), String> {
        // Printed in logs, plans and checkpoints: no control characters
        // (an escape sequence would drive the terminal), and a bounded
        // length.
        if self.name.chars().count() > MAX_NAME_CHARS || self.name.chars().any(char::is_control) {
            return Err(format!(
                "name {:?} must be at most {MAX_NAME_CHARS} characters, none of them control \
                 characters",
                self.name.chars().take(40).collect::<String>()
            ));
        }
        let positive = [
            ("vocab", self.vocab),
            ("dim", self.dim),
            ("layers", self.layers),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("ffn", self.ffn),
            ("seq_len", self.seq_len),
        ];
        for ((field, v), (_, limit)) in positive.into_iter().zip(MODEL_LIMITS) {
            if v == 0 {
                return Err(format!("{field} must be positive, not 0"));
            }
            if v > limit {
                return Err(format!("{field} is {v}, more than the {limit} accepted"));
            }
        }
        if let Some(why) = vocab_too_small(self.vocab) {
            return Err(format!("vocab is {}; {why}", self.vocab));
        }
        if self.dim % self.heads != 0 {
            return Err(format!(
                "dim {} is not a multiple of heads {}",
                self.dim, self.heads
            ));
        }
        if self.heads % self.kv_heads != 0 {
            return Err(format!(
                "heads {} is not a multiple of kv_heads {}",
                self.heads, self.kv_heads
            ));
        }
        if self.head_dim() % 2 != 0 {
            return Err(format!(
                "the head dimension dim / heads = {} must be even for rotary embeddings",
                self.head_dim()
            ));
        }
        if self.vocab > i32::MAX as usize {
            return Err(format!("vocab {} does not fit i32 token ids", self.vocab));
        }
        if let Some(why) = eps_problem(self.norm_eps, MAX_NORM_EPS) {
            return Err(format!(
                "norm_eps is {why} (RMSNorm's epsilon: a large one flattens every row)"
            ));
        }
        if !(self.rope_theta > 1.0 && self.rope_theta.is_finite()) {
            return Err(format!("rope_theta must exceed 1, not {}", self.rope_theta));
        }
        Ok(())
    }

    /// Its size for messages: "41256 parameters, 3 blocks, dim 36".
    pub fn size_text(&self) -> String {
        let plural = |n: usize, one: &str| format!("{n} {one}{}", if n == 1 { "" } else { "s" });
        format!(
            "{}, {}, dim {}",
            plural(self.parameters(), "parameter"),
            plural(self.layers, "block"),
            self.dim
        )
    }

    /// `dim / heads`.
    pub fn head_dim(&self) -> usize {
        self.dim / self.heads
    }

    /// Parameters of the whole model.
    pub fn parameters(&self) -> usize {
        let (d, kv) = (self.dim, self.kv_heads * self.head_dim());
        let layer = 2 * d + 2 * d * d + 2 * d * kv + 3 * d * self.ffn;
        2 * self.vocab * d + d + self.layers * layer
    }

    /// The same shape as the planner describes models.
    pub fn planner_spec(&self) -> polychip_planner::model::ModelSpec {
        polychip_planner::model::ModelSpec {
            name: self.name.clone(),
            layers: self.layers as u64,
            hidden: self.dim as u64,
            ffn: self.ffn as u64,
            heads: self.heads as u64,
            kv_heads: self.kv_heads as u64,
            vocab: self.vocab as u64,
            seq_len: self.seq_len as u64,
            ..Default::default()
        }
    }
}

/// The numeric format of activations, weights' compute copies and gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in f32.
    #[default]
    F32,
    /// Compute in bf16 (activations, weight copies, per-step gradients);
    /// f32 master weights, optimizer state, gradient reduction and loss.
    Bf16,
}

impl Precision {
    /// The compute dtype.
    pub fn dtype(self) -> polychip_host::DType {
        match self {
            Precision::F32 => polychip_host::DType::F32,
            Precision::Bf16 => polychip_host::DType::BF16,
        }
    }

    /// Parses `f32` or `bf16`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "f32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            other => Err(TrainError::Config(format!(
                "unknown precision {}; use f32 or bf16",
                polychip_comm::text::quoted(other)
            ))),
        }
    }
}

/// The largest AdamW epsilon accepted, 0.1 (PyTorch's default is 1e-8;
/// some recipes use up to 1e-3): one far larger divides every update away.
pub const MAX_EPS: f64 = 0.1;

/// The largest RMSNorm epsilon accepted, 0.1 (models use 1e-12 to 1e-5):
/// one far larger than the mean square of the activations flattens every
/// normalized row to about 0, and training then learns nothing.
pub const MAX_NORM_EPS: f64 = 0.1;

/// Why an epsilon (AdamW's or a norm's) of `value` is refused, if it is:
/// it must lie from f32's smallest normal number (below it the training
/// precision rounds it to a subnormal or to 0, and the division it guards
/// overflows to inf or NaN) to `max`. The text completes "`name` is ..".
pub fn eps_problem(value: f64, max: f64) -> Option<String> {
    let min = f64::from(f32::MIN_POSITIVE);
    (!(min..=max).contains(&value)).then(|| {
        format!(
            "{}; it must be from {min:.2e} (f32's smallest normal number: a smaller one \
             rounds to 0 in training) to {max}",
            polychip_planner::cluster::fmt_num(value)
        )
    })
}

/// The most warm-up steps accepted, a billion: more than any run takes, so
/// that a resumed run may keep a warm-up longer than its `steps`, while a
/// value like 2^64 - 1 (a learning rate of 1e-22 for good) is refused.
pub const MAX_WARMUP: u64 = 1_000_000_000;

/// The most optimizer steps a run may have, a billion (hostile sweep 6:
/// `--steps 18446744073709551615` was taken and trained as good as for
/// ever).
pub const MAX_STEPS: u64 = 1_000_000_000;

/// Optimizer, schedule, batch and bookkeeping settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Optimizer steps to run (the schedule ends here).
    pub steps: u64,
    /// Sequences per optimizer step, over all replicas.
    pub global_batch: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Final learning rate of the cosine decay.
    pub min_lr: f64,
    /// Linear warm-up steps.
    pub warmup: u64,
    /// Decoupled weight decay (AdamW) of matrices; norms and embeddings
    /// are not decayed.
    pub weight_decay: f64,
    /// AdamW beta1.
    pub beta1: f64,
    /// AdamW beta2.
    pub beta2: f64,
    /// AdamW epsilon.
    pub eps: f64,
    /// Gradient-norm clipping threshold; 0 turns clipping off.
    pub clip: f64,
    /// Seed of initialization and data order.
    pub seed: u64,
    /// Compute precision.
    pub precision: Precision,
    /// Validate every this many steps (and after the last); 0 = only at the end.
    pub eval_every: u64,
    /// Sequences of the validation batch.
    pub eval_sequences: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            steps: 400,
            global_batch: 64,
            lr: 3e-3,
            min_lr: 3e-4,
            warmup: 20,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            clip: 1.0,
            seed: 1234,
            precision: Precision::F32,
            eval_every: 100,
            eval_sequences: 16,
        }
    }
}

impl TrainConfig {
    /// Checks the values; the message names the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(TrainError::Config(m));
        if self.global_batch == 0 {
            return bad("global_batch must be positive".into());
        }
        if self.global_batch > MAX_GLOBAL_BATCH {
            return bad(format!(
                "global_batch is {}, more than the {MAX_GLOBAL_BATCH} sequences accepted",
                self.global_batch
            ));
        }
        if self.eval_sequences > MAX_GLOBAL_BATCH {
            return bad(format!(
                "eval_sequences is {}, more than the {MAX_GLOBAL_BATCH} sequences accepted",
                self.eval_sequences
            ));
        }
        // Numbers as the planner prints them: 1e-300 in 300 digits hid the
        // sentence.
        let num = polychip_planner::cluster::fmt_num;
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return bad(format!("lr must be positive, not {}", num(self.lr)));
        }
        if !(self.min_lr >= 0.0 && self.min_lr <= self.lr) {
            return bad(format!(
                "min_lr {} must lie in [0, lr = {}]",
                num(self.min_lr),
                num(self.lr)
            ));
        }
        for (name, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return bad(format!("{name} must lie in [0, 1), not {}", num(b)));
            }
        }
        if !(self.clip >= 0.0 && self.clip.is_finite()) {
            return bad(format!(
                "clip must be 0 (off) or positive, not {}",
                num(self.clip)
            ));
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            return bad(format!(
                "weight_decay must be non-negative and finite, not {}",
                num(self.weight_decay)
            ));
        }
        // Decoupled decay multiplies each weight by 1 - lr * weight_decay
        // a step: at 1 or more it zeroes or flips the weights (the run
        // diverged, blamed on the learning rate). Refused where the decay
        // is what is out of scale (a learning rate beyond reason with a
        // usual decay diverges, and says so).
        if self.weight_decay > 1.0 && self.lr * self.weight_decay >= 1.0 {
            return bad(format!(
                "lr x weight_decay is {} ({} x {}): AdamW's decoupled decay multiplies the \
                 weights by 1 - lr x weight_decay each step, so it must be below 1",
                num(self.lr * self.weight_decay),
                num(self.lr),
                num(self.weight_decay)
            ));
        }
        if let Some(why) = eps_problem(self.eps, MAX_EPS) {
            return bad(format!(
                "eps is {why} (AdamW's epsilon guards a division: a large one stops the \
                 updates)"
            ));
        }
        if self.steps > MAX_STEPS {
            return bad(format!(
                "steps is {}, more than the {MAX_STEPS} accepted (at a millisecond a step, \
                 some 12 days; 2^64 - 1 ran as good as for ever)",
                self.steps
            ));
        }
        if self.warmup > MAX_WARMUP {
            return bad(format!(
                "warmup is {} steps, more than the {MAX_WARMUP} accepted (the learning rate \
                 would stay near 0)",
                self.warmup
            ));
        }
        Ok(())
    }

    /// The learning rate of 1-based step `step`: linear warm-up to `lr`,
    /// then cosine decay to `min_lr` at `steps`.
    pub fn lr_at(&self, step: u64) -> f64 {
        if self.warmup > 0 && step <= self.warmup {
            return self.lr * step as f64 / self.warmup as f64;
        }
        let span = self.steps.saturating_sub(self.warmup).max(1) as f64;
        let t = ((step - self.warmup.min(step)) as f64 / span).min(1.0);
        self.min_lr + 0.5 * (self.lr - self.min_lr) * (1.0 + (std::f64::consts::PI * t).cos())
    }

    /// Reads a TOML file of these fields (missing ones take defaults).
    pub fn load(path: &Path) -> Result<Self> {
        let text = read_text_file(path, MAX_TEXT_FILE).map_err(|e| TrainError::io(path, e))?;
        let in_file = |e: String| {
            TrainError::Config(format!(
                "training file {}: {e}",
                polychip_files::shown_path(path)
            ))
        };
        let cfg: TrainConfig =
            toml::from_str(&text).map_err(|e| in_file(polychip_files::toml_error(&text, &e)))?;
        cfg.validate().map_err(|e| match e {
            TrainError::Config(m) => in_file(m),
            e => e,
        })?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_weight_decay_out_of_scale_is_refused_and_numbers_print_compactly() {
        let t = |lr: f64, weight_decay: f64| {
            TrainConfig {
                lr,
                min_lr: 0.0,
                weight_decay,
                ..TrainConfig::default()
            }
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
        };
        assert_eq!(t(3e-3, 0.1), "");
        let e = t(3e-3, 1e30);
        assert!(
            e.contains("lr x weight_decay is 3.0000000000000003e27"),
            "{e}"
        );
        // A learning rate beyond reason with a usual decay diverges, and
        // the run says so.
        assert_eq!(t(1e300, 0.1), "");
        let e = TrainConfig {
            lr: 1e-300,
            ..TrainConfig::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("lr = 1e-300]"), "{e}");
    }

    #[test]
    fn presets_validate_and_count_parameters() {
        for name in MODEL_PRESETS {
            let m = ModelConfig::preset(name).unwrap();
            m.validate().unwrap();
            assert_eq!(
                m.parameters() as u64,
                m.planner_spec().total_params(),
                "{name}"
            );
        }
        let err = ModelConfig::preset("huge").unwrap_err().to_string();
        assert!(err.contains("\"huge\"") && err.contains("tiny"), "{err}");
    }

    #[test]
    fn bad_shapes_are_named() {
        let mut m = ModelConfig::preset("tiny").unwrap();
        m.kv_heads = 3;
        assert!(m.validate().unwrap_err().contains("kv_heads 3"));
        m.kv_heads = 2;
        m.dim = 62;
        assert!(m.validate().unwrap_err().contains("dim 62"));
        m.dim = 1 << 32;
        let e = m.validate().unwrap_err();
        assert_eq!(e, "dim is 4294967296, more than the 1048576 accepted");
        // The limits agree with the planner's, field by field.
        for ((ours, a), (theirs, b)) in MODEL_LIMITS.iter().zip(sorted_planner_limits()) {
            assert_eq!(*a as u64, b, "{ours} vs {theirs}");
        }
    }

    #[test]
    fn a_vocabulary_smaller_than_the_byte_tokens_is_refused() {
        let dir = std::env::temp_dir().join(format!("polychip-vocab-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("v10.toml");
        std::fs::write(
            &file,
            "name=\"v10\" vocab=10 dim=64 layers=1 heads=4 kv_heads=2 ffn=64 seq_len=16\n"
                .replace(' ', "\n"),
        )
        .unwrap();
        let e = ModelConfig::from_arg(file.to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&polychip_files::shown_path(&file))
                && e.contains("vocab is 10")
                && e.contains("256"),
            "{e}"
        );
        let mut m = ModelConfig::preset("tiny").unwrap();
        m.vocab = 255;
        assert!(m.validate().unwrap_err().contains("vocab is 255"));
        m.vocab = 256;
        m.validate().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn sorted_planner_limits() -> Vec<(&'static str, u64)> {
        let p = polychip_planner::model::MODEL_LIMITS;
        let get = |n: &str| *p.iter().find(|(f, _)| *f == n).unwrap();
        [
            "vocab", "hidden", "layers", "heads", "kv_heads", "ffn", "seq_len",
        ]
        .into_iter()
        .map(get)
        .collect()
    }

    #[test]
    fn huge_batches_are_refused_by_name() {
        let c = TrainConfig {
            global_batch: 100_000_000,
            ..TrainConfig::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("global_batch is 100000000, more than the 65536 sequences accepted"),
            "{e}"
        );
        let c = TrainConfig {
            eval_sequences: usize::MAX,
            ..TrainConfig::default()
        };
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("eval_sequences")
        );
    }

    #[test]
    fn an_eps_or_warmup_that_stops_training_is_refused_by_name() {
        // 1e-46 is positive in f64 and 0 in f32: the division it guards
        // gave NaN, reported as a learning rate too high.
        for eps in [f64::INFINITY, f64::NAN, 0.0, -1e-8, 1.0, 1e-46] {
            let c = TrainConfig {
                eps,
                ..TrainConfig::default()
            };
            let e = c.validate().unwrap_err().to_string();
            assert!(
                e.contains("eps is ") && e.contains("to 0.1") && e.contains("smallest normal"),
                "{eps}: {e}"
            );
        }
        // A model's RMSNorm epsilon alike: 1e38 trained nothing (every
        // normalized row about 0), with a loss stuck at ln 256 and exit 0.
        for norm_eps in [1e38, 1.0, 1e-46, f64::NAN] {
            let m = ModelConfig {
                norm_eps,
                ..ModelConfig::preset("mini").unwrap()
            };
            let e = m.validate().unwrap_err();
            assert!(
                e.starts_with("norm_eps is ") && e.contains("to 0.1"),
                "{norm_eps}: {e}"
            );
        }
        for norm_eps in [1e-12, 1e-5, 0.1] {
            let m = ModelConfig {
                norm_eps,
                ..ModelConfig::preset("mini").unwrap()
            };
            assert_eq!(m.validate(), Ok(()), "{norm_eps}");
        }
        // A warm-up or a run of 2^64 - 1 steps (the run trained as good as
        // for ever until hostile sweep 6).
        let warmup = TrainConfig {
            warmup: u64::MAX,
            ..TrainConfig::default()
        };
        let steps = TrainConfig {
            steps: u64::MAX,
            ..TrainConfig::default()
        };
        for (c, says) in [
            (
                warmup,
                "warmup is 18446744073709551615 steps, more than the 1000000000",
            ),
            (
                steps,
                "steps is 18446744073709551615, more than the 1000000000 accepted",
            ),
        ] {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
        // A warm-up longer than the steps (a run resumed with more) is fine.
        let c = TrainConfig {
            steps: 10,
            warmup: 100,
            eps: 1e-3,
            ..TrainConfig::default()
        };
        c.validate().unwrap();
        let path = std::env::temp_dir().join(format!("train-{}.toml", std::process::id()));
        std::fs::write(&path, "eps = inf\n").unwrap();
        let e = TrainConfig::load(&path).unwrap_err().to_string();
        std::fs::remove_file(&path).ok();
        assert!(
            e.starts_with(&format!(
                "configuration: training file {}: eps is inf",
                polychip_files::shown_path(&path)
            )),
            "{e}"
        );
    }

    #[test]
    fn schedule_warms_up_then_decays() {
        let c = TrainConfig {
            steps: 100,
            warmup: 10,
            ..TrainConfig::default()
        };
        assert!((c.lr_at(5) - c.lr / 2.0).abs() < 1e-12);
        assert!((c.lr_at(10) - c.lr).abs() < 1e-12);
        assert!((c.lr_at(100) - c.min_lr).abs() < 1e-12);
        assert!(c.lr_at(55) < c.lr && c.lr_at(55) > c.min_lr);
    }
}

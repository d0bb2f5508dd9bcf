//! The model's parameters: their names (Meta's LLaMA names, so checkpoints
//! read like any LLaMA checkpoint), shapes, which stage holds them, and
//! where their initial values come from: a deterministic initialization
//! keyed by (seed, name), or weights given by name (a Hugging Face
//! checkpoint, `--init-from`). Either way a parameter's start depends on its
//! name only, so that every split of the model over stages starts from the
//! same weights.

use std::collections::BTreeMap;

use crate::config::ModelConfig;
use crate::error::{Result, TrainError};

/// A place where the model may be cut between two pipeline stages,
/// counted in half blocks: `Cut(2 * l)` is the start of block `l`,
/// `Cut(2 * l + 1)` its middle, between its attention half (norm,
/// projections, attention, residual) and its feed-forward half (norm,
/// SwiGLU, residual). Written as a block number, `l` or `l.5`, in plan
/// files and on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Cut(pub usize);

impl Cut {
    /// The start of block `l`.
    pub fn block(l: usize) -> Cut {
        Cut(l.saturating_mul(2))
    }

    /// Whether it falls between two blocks.
    pub fn is_whole(self) -> bool {
        self.0 % 2 == 0
    }

    /// Parses `l` or `l.5` (a block number, whole or halfway); `None` for
    /// anything else.
    pub fn parse(s: &str) -> Option<Cut> {
        let s = s.trim();
        let (whole, half) = match s.split_once('.') {
            None => (s, false),
            Some((w, "5")) => (w, true),
            Some((w, "0")) => (w, false),
            Some(_) => return None,
        };
        if whole.is_empty() || !whole.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        let l: usize = whole.parse().ok()?;
        Some(Cut(l.checked_mul(2)? + usize::from(half)))
    }

    /// A block number from a plan file: a non-negative multiple of 0.5.
    pub fn from_f64(x: f64) -> Option<Cut> {
        let halves = x * 2.0;
        (x.is_finite() && x >= 0.0 && halves.fract() == 0.0 && halves < 2f64.powi(52))
            .then_some(Cut(halves as usize))
    }
}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.is_whole() {
            true => write!(f, "{}", self.0 / 2),
            false => write!(f, "{}.5", self.0 / 2),
        }
    }
}

impl serde::Serialize for Cut {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self.is_whole() {
            true => s.serialize_u64((self.0 / 2) as u64),
            false => s.serialize_f64(self.0 as f64 / 2.0),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Cut {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Cut, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Cut;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a block number, whole or halfway (e.g. 3 or 3.5)")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<Cut, E> {
                usize::try_from(v)
                    .ok()
                    .and_then(|l| l.checked_mul(2))
                    .map(Cut)
                    .ok_or_else(|| E::custom(format!("block {v} is out of range")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<Cut, E> {
                match u64::try_from(v) {
                    Ok(u) => self.visit_u64(u),
                    Err(_) => Err(E::custom(format!("block {v} is negative"))),
                }
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> std::result::Result<Cut, E> {
                Cut::from_f64(v).ok_or_else(|| {
                    E::custom(format!(
                        "block {v} is not a block number, whole or halfway (e.g. 3 or 3.5)"
                    ))
                })
            }
        }
        d.deserialize_any(V)
    }
}

/// The part of the model one pipeline stage holds: the half blocks
/// `start..end` (see [`Cut`]), plus the token embedding when it starts at
/// the model's start and the final norm and output head when it ends at
/// its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageRange {
    /// Where it starts.
    pub start: Cut,
    /// Where it ends.
    pub end: Cut,
    /// Holds the token embedding (it is the first stage).
    pub embed: bool,
    /// Holds the final norm, the output head and the loss (the last stage).
    pub head: bool,
}

impl StageRange {
    /// Blocks `first..end` of a model of `layers` blocks, with the
    /// embedding when it starts at block 0 and the head when it ends at the
    /// last (a plan's stage of no blocks holds one end by its position
    /// instead: [`crate::plan::TrainPlan::roles`]).
    pub fn new(first: usize, end: usize, layers: usize) -> StageRange {
        StageRange::between(Cut::block(first), Cut::block(end), layers)
    }

    /// From `start` to `end` of a model of `layers` blocks, with the
    /// embedding when it starts at the model's start and the head when it
    /// ends at its end.
    pub fn between(start: Cut, end: Cut, layers: usize) -> StageRange {
        StageRange {
            start,
            end,
            embed: start == Cut(0),
            head: end == Cut::block(layers),
        }
    }

    /// The whole model on one stage.
    pub fn whole(cfg: &ModelConfig) -> StageRange {
        StageRange::new(0, cfg.layers, cfg.layers)
    }

    /// The half blocks held, in order: half `h` is block `h / 2`'s
    /// attention half when `h` is even, its feed-forward half when odd.
    pub fn halves(&self) -> std::ops::Range<usize> {
        self.start.0..self.end.0.max(self.start.0)
    }

    /// The blocks of which it holds a half or both.
    pub fn layers(&self) -> std::ops::Range<usize> {
        let h = self.halves();
        h.start / 2..h.end.div_ceil(2).max(h.start / 2)
    }

    /// Attention halves and feed-forward halves held.
    pub fn half_counts(&self) -> (usize, usize) {
        polychip_planner::measured::half_counts(self.start.0, self.end.0)
    }
}

/// How a parameter starts and whether weight decay applies to it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Normal with this standard deviation; a decayed matrix.
    Normal(f64),
    /// Normal with this standard deviation; not decayed (embedding).
    Embedding(f64),
    /// All ones; not decayed (norm weights).
    Ones,
}

/// One parameter's name, shape and initialization.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// Its name, e.g. `layers.3.attention.wq.weight`.
    pub name: String,
    /// Its shape.
    pub shape: Vec<i64>,
    /// How it starts.
    pub init: Init,
}

impl ParamSpec {
    /// Elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product::<i64>() as usize
    }

    /// Whether AdamW's weight decay applies.
    pub fn decayed(&self) -> bool {
        matches!(self.init, Init::Normal(_))
    }

    /// Its initial values for `seed`: the same on every rank and in every
    /// plan.
    pub fn initial_values(&self, seed: u64) -> Vec<f32> {
        let n = self.numel();
        let std = match self.init {
            Init::Ones => return vec![1.0; n],
            Init::Normal(s) | Init::Embedding(s) => s,
        };
        let mut rng = SplitMix64::new(seed ^ fnv1a(self.name.as_bytes()));
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            // Box-Muller: two uniforms in (0, 1] give two normals.
            let u1 = ((rng.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
            let u2 = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            let r = (-2.0 * u1.ln()).sqrt();
            let t = 2.0 * std::f64::consts::PI * u2;
            out.push((std * r * t.cos()) as f32);
            if out.len() < n {
                out.push((std * r * t.sin()) as f32);
            }
        }
        out
    }
}

/// Where a stage's initial weights come from.
#[derive(Debug, Clone, PartialEq)]
pub enum InitialWeights {
    /// [`ParamSpec::initial_values`] of this seed.
    Seed(u64),
    /// These values, by parameter name (each taken when used); a parameter
    /// missing from the map is an error naming it and `source`.
    Given {
        /// Values by parameter name, row-major.
        values: BTreeMap<String, Vec<f32>>,
        /// Where they came from, for errors (a directory, a file).
        source: String,
    },
}

impl InitialWeights {
    /// The initial values of `spec`: generated from the seed, or taken
    /// from the given ones (checking their number).
    pub fn take(&mut self, spec: &ParamSpec) -> Result<Vec<f32>> {
        match self {
            InitialWeights::Seed(seed) => Ok(spec.initial_values(*seed)),
            InitialWeights::Given { values, source } => {
                let v = values.remove(&spec.name).ok_or_else(|| {
                    TrainError::Config(format!(
                        "the initial weights from {source} have no `{}`",
                        spec.name
                    ))
                })?;
                if v.len() != spec.numel() {
                    return Err(TrainError::Config(format!(
                        "the initial weights from {source} give `{}` {} values, but its shape \
                         {:?} has {}",
                        spec.name,
                        v.len(),
                        spec.shape,
                        spec.numel()
                    )));
                }
                Ok(v)
            }
        }
    }
}

/// The names of block `i`'s parameters, in the order [`stage_params`] lists them.
pub const BLOCK_PARAMS: [&str; 9] = [
    "attention_norm.weight",
    "attention.wq.weight",
    "attention.wk.weight",
    "attention.wv.weight",
    "attention.wo.weight",
    "ffn_norm.weight",
    "feed_forward.w1.weight",
    "feed_forward.w3.weight",
    "feed_forward.w2.weight",
];

/// Index of each block parameter in [`BLOCK_PARAMS`].
pub mod block {
    /// RMSNorm before attention.
    pub const ATTN_NORM: usize = 0;
    /// Query projection.
    pub const WQ: usize = 1;
    /// Key projection.
    pub const WK: usize = 2;
    /// Value projection.
    pub const WV: usize = 3;
    /// Output projection.
    pub const WO: usize = 4;
    /// RMSNorm before the FFN.
    pub const FFN_NORM: usize = 5;
    /// FFN gate.
    pub const W1: usize = 6;
    /// FFN up.
    pub const W3: usize = 7;
    /// FFN down.
    pub const W2: usize = 8;
}

/// Parameters of a block's attention half: the first [`ATTENTION_PARAMS`]
/// of [`BLOCK_PARAMS`]; its feed-forward half holds the rest.
pub const ATTENTION_PARAMS: usize = 5;

/// The parameters a stage holds: embedding (first stage), those of each
/// half block it holds in order (5 for an attention half, 4 for a
/// feed-forward half: 9 per block, in [`BLOCK_PARAMS`] order), then final
/// norm and output head (last stage).
pub fn stage_params(cfg: &ModelConfig, range: &StageRange) -> Vec<ParamSpec> {
    let (d, v, f) = (cfg.dim as i64, cfg.vocab as i64, cfg.ffn as i64);
    let q = (cfg.heads * cfg.head_dim()) as i64;
    let kv = (cfg.kv_heads * cfg.head_dim()) as i64;
    let std = 0.02;
    // GPT-2's scaling of the projections that feed the residual stream.
    let out_std = std / (2.0 * cfg.layers as f64).sqrt();
    let mut specs = Vec::new();
    let mut push = |name: String, shape: Vec<i64>, init| {
        specs.push(ParamSpec { name, shape, init });
    };
    if range.embed {
        push(
            "tok_embeddings.weight".into(),
            vec![v, d],
            Init::Embedding(std),
        );
    }
    for h in range.halves() {
        let i = h / 2;
        let shapes: [(Vec<i64>, Init); 9] = [
            (vec![d], Init::Ones),
            (vec![q, d], Init::Normal(std)),
            (vec![kv, d], Init::Normal(std)),
            (vec![kv, d], Init::Normal(std)),
            (vec![d, q], Init::Normal(out_std)),
            (vec![d], Init::Ones),
            (vec![f, d], Init::Normal(std)),
            (vec![f, d], Init::Normal(std)),
            (vec![d, f], Init::Normal(out_std)),
        ];
        let half = match h % 2 {
            0 => 0..ATTENTION_PARAMS,
            _ => ATTENTION_PARAMS..BLOCK_PARAMS.len(),
        };
        for (name, (shape, init)) in BLOCK_PARAMS[half.clone()]
            .iter()
            .zip(shapes.into_iter().skip(half.start))
        {
            push(format!("layers.{i}.{name}"), shape, init);
        }
    }
    if range.head {
        push("norm.weight".into(), vec![d], Init::Ones);
        push("output.weight".into(), vec![v, d], Init::Normal(std));
    }
    specs
}

/// FNV-1a of bytes (seeds per parameter name).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Steele, Lea and Flood's SplitMix64 generator.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_partition_the_parameters() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let whole = stage_params(&cfg, &StageRange::whole(&cfg));
        // Whole blocks, and cuts halfway through blocks.
        let split: Vec<_> = [(0, 2), (2, 3), (3, 7), (7, 8)]
            .iter()
            .flat_map(|&(a, b)| {
                stage_params(&cfg, &StageRange::between(Cut(a), Cut(b), cfg.layers))
            })
            .collect();
        assert_eq!(split[0].name, "tok_embeddings.weight");
        assert_eq!(split.last().unwrap().name, "output.weight");
        let mut a: Vec<_> = whole.iter().map(|p| &p.name).collect();
        let mut b: Vec<_> = split.iter().map(|p| &p.name).collect();
        a.sort();
        b.sort();
        assert_eq!(a, b);
        let total: usize = whole.iter().map(ParamSpec::numel).sum();
        assert_eq!(total, cfg.parameters());
        // The same order as the whole model's.
        let names = |v: &[ParamSpec]| v.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&whole), names(&split));
        let attention = StageRange::between(Cut(2), Cut(3), cfg.layers);
        assert_eq!(
            names(&stage_params(&cfg, &attention)),
            BLOCK_PARAMS[..ATTENTION_PARAMS]
                .iter()
                .map(|n| format!("layers.1.{n}"))
                .collect::<Vec<_>>()
        );
        assert_eq!(attention.layers(), 1..2);
        assert_eq!(attention.half_counts(), (1, 0));
        assert_eq!(StageRange::between(Cut(1), Cut(6), 4).half_counts(), (2, 3));
    }

    #[test]
    fn cuts_read_and_write_as_block_numbers() {
        assert_eq!(Cut::parse("3"), Some(Cut(6)));
        assert_eq!(Cut::parse("3.5"), Some(Cut(7)));
        assert_eq!(Cut::parse(" 0.5 "), Some(Cut(1)));
        for bad in [
            "",
            "3.25",
            "-1",
            "x",
            ".5",
            "3.",
            "1e3",
            "99999999999999999999",
        ] {
            assert_eq!(Cut::parse(bad), None, "{bad:?}");
        }
        assert_eq!(Cut(7).to_string(), "3.5");
        assert_eq!(Cut(6).to_string(), "3");
        let v: Vec<Cut> = serde_json::from_str("[0, 3, 3.5, 16.0]").unwrap();
        assert_eq!(v, vec![Cut(0), Cut(6), Cut(7), Cut(32)]);
        assert_eq!(serde_json::to_string(&v).unwrap(), "[0,3,3.5,16]");
        for bad in ["[-1]", "[0.25]", "[1e300]", "[\"3\"]"] {
            let e = serde_json::from_str::<Vec<Cut>>(bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("block"), "{bad}: {e}");
        }
    }

    #[test]
    fn initialization_depends_on_seed_and_name_only() {
        let cfg = ModelConfig::preset("mini").unwrap();
        let p = &stage_params(&cfg, &StageRange::new(1, 2, 2))[1];
        let q = stage_params(&cfg, &StageRange::whole(&cfg))
            .into_iter()
            .find(|s| s.name == p.name)
            .unwrap();
        assert_eq!(p.initial_values(7), q.initial_values(7));
        assert_ne!(p.initial_values(7), p.initial_values(8));
        let v = p.initial_values(7);
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
        let var = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / v.len() as f64;
        assert!(
            mean.abs() < 0.003 && (var.sqrt() - 0.02).abs() < 0.003,
            "{mean} {var}"
        );
    }
}

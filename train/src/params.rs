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
/// counted in half blocks: `half == 2 * l` is the start of block `l`,
/// `2 * l + 1` its middle, between its attention half (norm, projections,
/// attention, residual) and its feed-forward half (norm, SwiGLU,
/// residual). A cut may also fall inside a half, by its width (`cols >
/// 0`): inside a feed-forward half after its first `cols` hidden columns
/// (rows of `w1` and `w3`, columns of `w2`), inside an attention half
/// after its first `cols` key/value heads (with their query heads: rows of
/// `wq`, `wk` and `wv`, columns of `wo`). The half's norm goes with its
/// first part, and the boundary carries two activations (the normed input
/// and the residual sum so far). Written as a block number, `l`, `l.5`,
/// `l+heads` or `l.5+cols`, in plan files and on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Cut {
    /// Half blocks before it (the half it falls in when `cols > 0`).
    pub half: usize,
    /// Columns (a feed-forward half) or key/value heads (an attention
    /// half) of half `half` before it (0: a cut between halves).
    pub cols: usize,
}

impl Cut {
    /// The cut before half block `half`.
    pub fn at(half: usize) -> Cut {
        Cut { half, cols: 0 }
    }

    /// The start of block `l`.
    pub fn block(l: usize) -> Cut {
        Cut::at(l.saturating_mul(2))
    }

    /// The cut inside half `half` after its first `cols` columns (a
    /// feed-forward half) or key/value heads (an attention half).
    pub fn inside(half: usize, cols: usize) -> Cut {
        Cut { half, cols }
    }

    /// Whether it falls between two blocks.
    pub fn is_whole(self) -> bool {
        self.half % 2 == 0 && self.cols == 0
    }

    /// Whether it falls inside a half, by its width.
    pub fn is_inside(self) -> bool {
        self.cols > 0
    }

    /// Parses `l`, `l.5`, `l+heads` or `l.5+cols` (a block number, whole,
    /// halfway, inside the attention half after `heads` key/value heads or
    /// inside the feed-forward half after `cols` columns); `None` for
    /// anything else.
    pub fn parse(s: &str) -> Option<Cut> {
        let s = s.trim();
        let (s, cols) = match s.split_once('+') {
            None => (s, 0),
            Some((b, c)) => {
                if c.is_empty() || !c.bytes().all(|x| x.is_ascii_digit()) {
                    return None;
                }
                (b, c.parse::<usize>().ok().filter(|&c| c > 0)?)
            }
        };
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
        Some(Cut::inside(l.checked_mul(2)? + usize::from(half), cols))
    }

    /// A block number from a plan file: a non-negative multiple of 0.5.
    pub fn from_f64(x: f64) -> Option<Cut> {
        let halves = x * 2.0;
        (x.is_finite() && x >= 0.0 && halves.fract() == 0.0 && halves < 2f64.powi(52))
            .then_some(Cut::at(halves as usize))
    }
}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.half % 2, self.cols) {
            (0, 0) => write!(f, "{}", self.half / 2),
            (0, c) => write!(f, "{}+{c}", self.half / 2),
            (_, 0) => write!(f, "{}.5", self.half / 2),
            (_, c) => write!(f, "{}.5+{c}", self.half / 2),
        }
    }
}

impl serde::Serialize for Cut {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match (self.half % 2, self.cols) {
            (0, 0) => s.serialize_u64((self.half / 2) as u64),
            (_, 0) => s.serialize_f64(self.half as f64 / 2.0),
            _ => s.serialize_str(&self.to_string()),
        }
    }
}

/// What a plan file's cut must be.
const CUT_EXPECTED: &str = "a block number, whole or halfway (e.g. 3 or 3.5), or \"3+HEADS\" or \"3.5+COLS\" to \
     cut block 3's attention half after HEADS of its key/value heads or its feed-forward \
     half after COLS of its columns (HEADS and COLS from 1)";

impl<'de> serde::Deserialize<'de> for Cut {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Cut, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Cut;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(CUT_EXPECTED)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<Cut, E> {
                usize::try_from(v)
                    .ok()
                    .and_then(|l| l.checked_mul(2))
                    .map(Cut::at)
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
                    let v = polychip_planner::cluster::fmt_num(v);
                    E::custom(format!("block {v} is not {CUT_EXPECTED}"))
                })
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<Cut, E> {
                Cut::parse(v).ok_or_else(|| {
                    let shown: String = v.chars().take(40).collect();
                    E::custom(format!("block {shown:?} is not {CUT_EXPECTED}"))
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
            embed: start == Cut::at(0),
            head: end == Cut::block(layers),
        }
    }

    /// The whole model on one stage.
    pub fn whole(cfg: &ModelConfig) -> StageRange {
        StageRange::new(0, cfg.layers, cfg.layers)
    }

    /// The half blocks held, whole or in part, in order: half `h` is block
    /// `h / 2`'s attention half when `h` is even, its feed-forward half
    /// when odd (a half cut by its width is held in part: [`Self::held`]).
    pub fn halves(&self) -> std::ops::Range<usize> {
        let end = self.end.half + usize::from(self.end.is_inside());
        self.start.half..end.max(self.start.half)
    }

    /// The part of half block `half` (one of [`Self::halves`]) held, of
    /// its `width` ([`half_width`]: key/value heads or hidden columns).
    pub fn held(&self, half: usize, width: usize) -> std::ops::Range<usize> {
        let lo = if half == self.start.half {
            self.start.cols
        } else {
            0
        };
        let hi = match self.end.is_inside() && half == self.end.half {
            true => self.end.cols,
            false => width,
        };
        lo..hi
    }

    /// Whether it holds half `half`'s norm (the half's first part).
    pub fn holds_norm(&self, half: usize) -> bool {
        !(half == self.start.half && self.start.is_inside())
    }

    /// Whether its input is the pair a cut inside a feed-forward half
    /// sends (the normed activation and the partial residual sum).
    pub fn takes_pair(&self) -> bool {
        self.start.is_inside()
    }

    /// Whether its output is such a pair.
    pub fn gives_pair(&self) -> bool {
        self.end.is_inside()
    }

    /// The blocks of which it holds a half or both.
    pub fn layers(&self) -> std::ops::Range<usize> {
        let h = self.halves();
        h.start / 2..h.end.div_ceil(2).max(h.start / 2)
    }

    /// Attention halves and feed-forward halves held, a half held in part
    /// counted by its share of its width.
    pub fn half_counts(&self, cfg: &ModelConfig) -> (f64, f64) {
        // The planner's count of the same span, so the two agree.
        let (s, e) = (self.start, self.end);
        polychip_planner::measured::span_counts(
            s.half,
            s.cols,
            e.half,
            e.cols,
            cfg.ffn,
            cfg.kv_heads,
        )
    }
}

/// The width a cut inside half block `half` is counted in: key/value
/// heads for an attention half (even), hidden columns for a feed-forward
/// half (odd).
pub fn half_width(cfg: &ModelConfig, half: usize) -> usize {
    match half % 2 {
        0 => cfg.kv_heads,
        _ => cfg.ffn,
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

/// The part of a parameter a stage holds when a cut inside a feed-forward
/// half splits it by its hidden columns: indices `start..end` of axis
/// `axis` of the whole parameter, of shape `full`.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    /// The axis cut (0: rows of `w1` and `w3`, 1: columns of `w2`).
    pub axis: usize,
    /// The first index held.
    pub start: usize,
    /// One past the last.
    pub end: usize,
    /// The whole parameter's shape (two axes).
    pub full: Vec<i64>,
}

impl Part {
    /// The part of `whole` (row-major values of shape `full`).
    pub fn slice<T: Copy>(&self, whole: &[T]) -> Vec<T> {
        let (rows, cols) = (self.full[0] as usize, self.full[1] as usize);
        match self.axis {
            0 => whole[self.start * cols..self.end * cols].to_vec(),
            _ => (0..rows)
                .flat_map(|r| {
                    whole[r * cols + self.start..r * cols + self.end]
                        .iter()
                        .copied()
                })
                .collect(),
        }
    }

    /// The suffix naming it in a checkpoint's stage file,
    /// `@axis:start..end/whole` (`whole` the whole parameter's extent along
    /// `axis`).
    pub fn tag(&self) -> String {
        let whole = self.full[self.axis];
        format!("@{}:{}..{}/{whole}", self.axis, self.start, self.end)
    }
}

/// One parameter's name, shape and initialization.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// Its name, e.g. `layers.3.attention.wq.weight`.
    pub name: String,
    /// Its shape (the part's, when it is a part).
    pub shape: Vec<i64>,
    /// How it starts.
    pub init: Init,
    /// The part held, when a cut splits it by its width.
    pub part: Option<Part>,
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

    /// Elements of the whole parameter (of its part's whole when a part).
    pub fn full_numel(&self) -> usize {
        match &self.part {
            Some(p) => p.full.iter().product::<i64>() as usize,
            None => self.numel(),
        }
    }

    /// The part of the whole parameter's values `whole` it holds.
    pub fn take_part(&self, whole: Vec<f32>) -> Vec<f32> {
        match &self.part {
            Some(p) => p.slice(&whole),
            None => whole,
        }
    }

    /// Its initial values for `seed`: the same on every rank and in every
    /// plan (a part's are those of its place in the whole parameter).
    pub fn initial_values(&self, seed: u64) -> Vec<f32> {
        self.try_initial_values(seed)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Self::initial_values`], or an error naming the parameter when the
    /// host cannot hold them (a model larger than the host's memory used
    /// to abort the process inside the allocator).
    pub fn try_initial_values(&self, seed: u64) -> Result<Vec<f32>> {
        let whole = self.whole_initial_values(seed)?;
        Ok(self.take_part(whole))
    }

    fn whole_initial_values(&self, seed: u64) -> Result<Vec<f32>> {
        let n = self.full_numel();
        let mut out: Vec<f32> = Vec::new();
        out.try_reserve_exact(n).map_err(|_| {
            TrainError::Config(format!(
                "the host cannot hold the {n} initial values of `{}` ({:.1} MiB): the model is \
                 too large for this machine's memory",
                self.name,
                n as f64 * 4.0 / (1u64 << 20) as f64
            ))
        })?;
        let std = match self.init {
            Init::Ones => {
                out.resize(n, 1.0);
                return Ok(out);
            }
            Init::Normal(s) | Init::Embedding(s) => s,
        };
        let mut rng = SplitMix64::new(seed ^ fnv1a(self.name.as_bytes()));
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
        Ok(out)
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
            InitialWeights::Seed(seed) => spec.try_initial_values(*seed),
            InitialWeights::Given { values, source } => {
                // A part leaves the whole in place for the other parts.
                let v = match spec.part {
                    Some(_) => values.get(&spec.name).cloned(),
                    None => values.remove(&spec.name),
                };
                let v = v.ok_or_else(|| {
                    TrainError::Config(format!(
                        "the initial weights from {source} have no `{}`",
                        spec.name
                    ))
                })?;
                let shape = spec.part.as_ref().map_or(&spec.shape, |p| &p.full);
                if v.len() != spec.full_numel() {
                    return Err(TrainError::Config(format!(
                        "the initial weights from {source} give `{}` {} values, but its shape \
                         {:?} has {}",
                        spec.name,
                        v.len(),
                        shape,
                        spec.full_numel()
                    )));
                }
                Ok(spec.take_part(v))
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
/// feed-forward half: 9 per block, in [`BLOCK_PARAMS`] order; a half held
/// from a part past its first holds its matrices' parts and no norm),
/// then final norm and output head (last stage).
pub fn stage_params(cfg: &ModelConfig, range: &StageRange) -> Vec<ParamSpec> {
    let (d, v, f) = (cfg.dim as i64, cfg.vocab as i64, cfg.ffn as i64);
    let q = (cfg.heads * cfg.head_dim()) as i64;
    let kv = (cfg.kv_heads * cfg.head_dim()) as i64;
    let std = 0.02;
    // GPT-2's scaling of the projections that feed the residual stream.
    let out_std = std / (2.0 * cfg.layers as f64).sqrt();
    let mut specs = Vec::new();
    let mut push = |name: String, shape: Vec<i64>, init, part| {
        specs.push(ParamSpec {
            name,
            shape,
            init,
            part,
        });
    };
    if range.embed {
        push(
            "tok_embeddings.weight".into(),
            vec![v, d],
            Init::Embedding(std),
            None,
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
        let width = half_width(cfg, h);
        let cols = range.held(h, width);
        let whole = cols == (0..width);
        // Elements along a matrix's cut axis per unit of width: a
        // key/value head's query heads' rows (wq, wo), its own (wk, wv),
        // or one hidden column (w1, w3, w2).
        let hd = cfg.head_dim();
        let per = |which: usize| match which {
            block::WQ | block::WO => hd * cfg.heads / cfg.kv_heads.max(1),
            block::WK | block::WV => hd,
            _ => 1,
        };
        for (which, (shape, init)) in shapes
            .into_iter()
            .enumerate()
            .take(half.end)
            .skip(half.start)
        {
            let name = format!("layers.{i}.{}", BLOCK_PARAMS[which]);
            if whole {
                push(name, shape, init, None);
                continue;
            }
            // A half held in part: its norm goes with its first part, and
            // each matrix is cut along its heads' or hidden axis.
            let axis = match which {
                block::ATTN_NORM | block::FFN_NORM if cols.start == 0 => {
                    push(name, shape, init, None);
                    continue;
                }
                block::ATTN_NORM | block::FFN_NORM => continue,
                block::WO | block::W2 => 1,
                _ => 0,
            };
            let (start, end) = (cols.start * per(which), cols.end * per(which));
            let mut part_shape = shape.clone();
            part_shape[axis] = (end - start) as i64;
            let part = Part {
                axis,
                start,
                end,
                full: shape,
            };
            push(name, part_shape, init, Some(part));
        }
    }
    if range.head {
        push("norm.weight".into(), vec![d], Init::Ones, None);
        push("output.weight".into(), vec![v, d], Init::Normal(std), None);
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
    fn initial_values_the_host_cannot_hold_are_an_error_naming_the_parameter() {
        let huge = ParamSpec {
            name: "tok_embeddings.weight".into(),
            shape: vec![1 << 31, 1 << 31],
            init: Init::Normal(0.02),
            part: None,
        };
        let e = huge.try_initial_values(1).unwrap_err().to_string();
        assert!(
            e.contains(
                "cannot hold the 4611686018427387904 initial values of `tok_embeddings.weight`"
            ),
            "{e}"
        );
    }

    #[test]
    fn stages_partition_the_parameters() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let whole = stage_params(&cfg, &StageRange::whole(&cfg));
        // Whole blocks, and cuts halfway through blocks.
        let split: Vec<_> = [(0, 2), (2, 3), (3, 7), (7, 8)]
            .iter()
            .flat_map(|&(a, b)| {
                stage_params(
                    &cfg,
                    &StageRange::between(Cut::at(a), Cut::at(b), cfg.layers),
                )
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
        let attention = StageRange::between(Cut::at(2), Cut::at(3), cfg.layers);
        assert_eq!(
            names(&stage_params(&cfg, &attention)),
            BLOCK_PARAMS[..ATTENTION_PARAMS]
                .iter()
                .map(|n| format!("layers.1.{n}"))
                .collect::<Vec<_>>()
        );
        assert_eq!(attention.layers(), 1..2);
        assert_eq!(attention.half_counts(&cfg), (1.0, 0.0));
        assert_eq!(
            StageRange::between(Cut::at(1), Cut::at(6), 4).half_counts(&cfg),
            (2.0, 3.0)
        );
    }

    #[test]
    fn cuts_read_and_write_as_block_numbers() {
        assert_eq!(Cut::parse("3"), Some(Cut::at(6)));
        assert_eq!(Cut::parse("3.5"), Some(Cut::at(7)));
        assert_eq!(Cut::parse(" 0.5 "), Some(Cut::at(1)));
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
        assert_eq!(Cut::at(7).to_string(), "3.5");
        assert_eq!(Cut::at(6).to_string(), "3");
        let v: Vec<Cut> = serde_json::from_str("[0, 3, 3.5, 16.0]").unwrap();
        assert_eq!(v, vec![Cut::at(0), Cut::at(6), Cut::at(7), Cut::at(32)]);
        assert_eq!(serde_json::to_string(&v).unwrap(), "[0,3,3.5,16]");
        for bad in ["[-1]", "[0.25]", "[1e300]", "[\"3.25\"]", "[true]"] {
            let e = serde_json::from_str::<Vec<Cut>>(bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("block"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_cut_by_width_reads_writes_and_partitions_the_feed_forward_half() {
        assert_eq!(Cut::parse("3.5+40"), Some(Cut::inside(7, 40)));
        assert_eq!(Cut::parse("3+1"), Some(Cut::inside(6, 1)));
        assert_eq!(Cut::inside(6, 1).to_string(), "3+1");
        for bad in ["3.5+0", "3.5+", "3.5+x", "3.5+-1", "+4", "3.25+1"] {
            assert_eq!(Cut::parse(bad), None, "{bad:?}");
        }
        assert_eq!(Cut::inside(7, 40).to_string(), "3.5+40");
        let v: Vec<Cut> = serde_json::from_str(r#"[3.5, "3.5+40", "4"]"#).unwrap();
        assert_eq!(v, vec![Cut::at(7), Cut::inside(7, 40), Cut::at(8)]);
        assert_eq!(serde_json::to_string(&v).unwrap(), r#"[3.5,"3.5+40",4]"#);
        assert!(Cut::at(7) < Cut::inside(7, 1) && Cut::inside(7, 175) < Cut::at(8));
        let e = serde_json::from_str::<Vec<Cut>>(r#"["3+x"]"#).unwrap_err();
        assert!(
            e.to_string().contains("feed-forward half after COLS"),
            "{e}"
        );

        // Three stages share block 1's feed-forward half: its norm goes
        // with the first columns, each matrix is cut along its width, and
        // the parts' initial values are those of their place in the whole.
        let cfg = ModelConfig::preset("tiny").unwrap();
        let cuts = [
            Cut::at(0),
            Cut::inside(3, 50),
            Cut::inside(3, 120),
            Cut::at(8),
        ];
        let ranges: Vec<StageRange> = cuts
            .windows(2)
            .map(|w| StageRange::between(w[0], w[1], cfg.layers))
            .collect();
        assert_eq!(ranges[1].halves(), 3..4);
        assert_eq!(ranges[1].held(3, cfg.ffn), 50..120);
        assert_eq!(ranges[0].held(3, cfg.ffn), 0..50);
        assert_eq!(ranges[2].held(3, cfg.ffn), 120..176);
        assert!(ranges[0].gives_pair() && ranges[1].takes_pair() && !ranges[2].gives_pair());
        let (a, f) = ranges[1].half_counts(&cfg);
        assert_eq!(a, 0.0);
        assert!((f - 70.0 / 176.0).abs() < 1e-12);
        let whole = stage_params(&cfg, &StageRange::whole(&cfg));
        let seed = 11;
        let mut total = 0;
        for (i, r) in ranges.iter().enumerate() {
            let specs = stage_params(&cfg, r);
            let norms = specs
                .iter()
                .filter(|p| p.name == "layers.1.ffn_norm.weight");
            assert_eq!(norms.count(), usize::from(i == 0), "stage {i}");
            for p in &specs {
                total += p.numel();
                let w = whole.iter().find(|w| w.name == p.name).unwrap();
                let want = match &p.part {
                    Some(part) => {
                        assert_eq!(part.full, w.shape);
                        part.slice(&w.initial_values(seed))
                    }
                    None => w.initial_values(seed),
                };
                assert_eq!(p.initial_values(seed), want, "{}", p.name);
            }
        }
        assert_eq!(total, cfg.parameters());
        let w2 = stage_params(&cfg, &ranges[1])
            .into_iter()
            .find(|p| p.name == "layers.1.feed_forward.w2.weight")
            .unwrap();
        assert_eq!(w2.shape, vec![64, 70]);
        assert_eq!(w2.part.as_ref().unwrap().tag(), "@1:50..120/176");

        // An attention half cut after its first key/value head (tiny has
        // 2, each with 2 query heads of 16): its heads' rows of wq, wk and
        // wv and columns of wo; the norm with the first part.
        let later = StageRange::between(Cut::inside(2, 1), Cut::at(8), cfg.layers);
        assert_eq!(later.held(2, cfg.kv_heads), 1..2);
        let specs = stage_params(&cfg, &later);
        let shapes: Vec<(&str, &[i64], String)> = specs[..4]
            .iter()
            .map(|p| {
                (
                    p.name.as_str(),
                    p.shape.as_slice(),
                    p.part.as_ref().unwrap().tag(),
                )
            })
            .collect();
        assert_eq!(
            shapes,
            vec![
                (
                    "layers.1.attention.wq.weight",
                    &[32, 64][..],
                    "@0:32..64/64".to_string()
                ),
                (
                    "layers.1.attention.wk.weight",
                    &[16, 64][..],
                    "@0:16..32/32".to_string()
                ),
                (
                    "layers.1.attention.wv.weight",
                    &[16, 64][..],
                    "@0:16..32/32".to_string()
                ),
                (
                    "layers.1.attention.wo.weight",
                    &[64, 32][..],
                    "@1:32..64/64".to_string()
                ),
            ]
        );
        assert_eq!(specs[4].name, "layers.1.ffn_norm.weight");
        let (a, f) = later.half_counts(&cfg);
        assert_eq!((a, f), (2.5, 3.0));
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

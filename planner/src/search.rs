//! The HeteroAuto search: from a cluster, a model and training settings to
//! the fastest [`Plan`] the cost model predicts.
//!
//! The space (HeteroPP's rules plus relaxations):
//!
//! - `d` data-parallel replicas of one pipeline, `d` a divisor of the global
//!   batch `B` (chosen first);
//! - per chip type: unused, or `k` stages of `t` chips each (`t` in
//!   {1, 2, 4, 8} dividing its chips per node, `d k t` at most its count):
//!   a large group of one type forms several stages. `--exhaustive` tries
//!   every `k`; so does the default search for a `d` whose (type, t, k)
//!   combinations number at most [`PlanOptions::full_enumeration_budget`]
//!   (every cluster of up to about 32 chips); beyond that it takes, for
//!   each `t`, only the largest `k` (HeteroPP's rule: all of the type's
//!   chips that `d` replicas can use); and where even those combinations
//!   number more than [`LARGEST_K_LIMIT`] (7 or more types of 8-chip
//!   nodes), it tries as the set of types used every single type, every
//!   pair, and every prefix of the memory-first and of the speed-first
//!   order, each with the option that uses the most chips per type, or with
//!   one tp for all types: quadratic in the number of types, not
//!   exponential. `--exhaustive`
//!   refuses a space of more than [`EXHAUSTIVE_LIMIT`] combinations;
//! - the order of the types along the pipeline: HeteroPP's (more memory
//!   first) and, as a relaxation, every other order (all permutations for up
//!   to 4 used types; beyond that, memory-first and speed-first only);
//! - layers per stage: the min-max placement (binary search on the
//!   bottleneck time, greedy fill, which is exact for contiguous stages)
//!   under each stage's memory cap ([`stage_memory`] must fit
//!   `memory_bytes`); the same in both modes (placements are not
//!   enumerated);
//! - micro-batch size `b` from `settings.micro_batch_sizes` with `d b`
//!   dividing `B`, count `m = B / (d b)`.
//!
//! The default search prunes combinations whose total memory cannot hold
//! the weights, gradients and optimizer state (a lower bound), skips those
//! whose lower bound on the step time is no better than the best so far
//! (both sound), and stops trying larger micro-batches once none fits (a
//! heuristic). Where every `k` is tried, a cluster with more chips offers
//! every HeteroPP plan of the smaller one, so the predicted throughput does
//! not drop when chips are added; above the budget this is not guaranteed.
//!
//! The relaxation "mixed data-parallel groups": each chip type's best plan
//! alone becomes a group of replicas, and the global batch is split among
//! the groups in proportion to speed (micro-batch by micro-batch to the
//! group that would finish soonest); all replicas share one gradient
//! all-reduce. It is kept when it is faster.
//!
//! HeteroSpeedupRatio: the plan's tokens/s over the sum, over chip types, of
//! the best tokens/s that type reaches alone (planned by this same search on
//! a cluster of only that type, with the same global batch). A type that
//! cannot hold the model alone contributes 0; when no type can, the ratio
//! is undefined (`None`). A single-type cluster gives exactly 1. Each type
//! alone gets the whole global batch (more micro-batches, a smaller
//! bubble), so the ratio can fall below 1 even for a good mixed plan.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::cluster::{ChipType, ClusterSpec};
use crate::cost::{
    ChipParams, Microbatching, StageShape, allreduce_time, dp_bandwidth, experts_unfolded,
    optimizer_time, pipeline_send_time, stage_memory, stage_params, stage_timing,
    zero_collective_seconds,
};
use crate::error::SpecError;
use crate::evaluate::{Layout, LayoutStage, assemble};
use crate::model::ModelSpec;
use crate::placement::{StagePlacement, place};
use crate::plan::{Plan, PlanKind};
use crate::settings::TrainingSettings;

/// Tensor-parallel degrees the search tries (those dividing chips per node).
pub const TP_DEGREES: [u64; 4] = [1, 2, 4, 8];

/// How to search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanOptions {
    /// Enumerate every plan of the space without pruning.
    pub exhaustive: bool,
    /// Try the mixed data-parallel groups relaxation.
    pub mixed_replicas: bool,
    /// Search pipelines that mix chip types (HeteroPP). Turning it off
    /// (with `mixed_replicas` on) plans data parallelism across types
    /// only: each group of replicas one type.
    pub heteropp: bool,
    /// Compute the HeteroSpeedupRatio (plans each chip type alone).
    pub speedup_ratio: bool,
    /// The default search tries every stage count per type (as
    /// `exhaustive` does) for a data-parallel degree whose combinations of
    /// (type, tp, stage count) number at most this; above it, only the
    /// largest stage count per tp. 0: always the largest only (HeteroPP's
    /// rule).
    pub full_enumeration_budget: u64,
    /// The most seconds the search may take (0: no limit). Past it, the
    /// search stops trying candidates and returns the best found so far,
    /// and the report says it was cut short
    /// ([`PlanReport::time_limited`]); a cluster and batch inside the input
    /// limits can otherwise take minutes (a 1,024-layer model on a million
    /// chips with a global batch of 120 divisors).
    #[serde(default = "default_time_limit")]
    pub time_limit_seconds: u64,
}

/// The default [`PlanOptions::time_limit_seconds`]: a minute, some sixty
/// times what the 4,096-chip example takes.
pub const DEFAULT_TIME_LIMIT_SECONDS: u64 = 60;

fn default_time_limit() -> u64 {
    DEFAULT_TIME_LIMIT_SECONDS
}

/// The default [`PlanOptions::full_enumeration_budget`]: every cluster of
/// up to about 32 chips is searched over every stage count.
pub const FULL_ENUMERATION_BUDGET: u64 = 100_000;

/// The most combinations of the largest stage count per (type, tp) that
/// the default search enumerates for one data-parallel degree (every
/// subset of the types, each with each of its tensor-parallel degrees):
/// up to 6 types of 8-chip nodes (5 options each, 15,625 combinations).
/// Above it, a polynomial selection of the types is tried instead (see
/// the module documentation), so that the search time grows with the
/// square of the number of types, not exponentially.
pub const LARGEST_K_LIMIT: u64 = 20_000;

/// The most combinations `--exhaustive` may enumerate over all the
/// data-parallel degrees it tries; a larger space is refused (the default
/// search handles it). Each combination costs about half a millisecond
/// (its layer splits and micro-batch sizes), so this bounds an exhaustive
/// search to some ten seconds. (Until 2026-12-05 the bound was 10^6 for
/// the first degree alone, which let four types of 16 chips run for eight
/// minutes.)
pub const EXHAUSTIVE_LIMIT: u64 = 20_000;

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            exhaustive: false,
            mixed_replicas: true,
            heteropp: true,
            speedup_ratio: true,
            full_enumeration_budget: FULL_ENUMERATION_BUDGET,
            time_limit_seconds: DEFAULT_TIME_LIMIT_SECONDS,
        }
    }
}

/// Why no plan came out.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// An input was invalid.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The whole cluster's memory cannot hold the model's training state.
    #[error(
        "the {model} model needs at least {} for weights, gradients and optimizer state; the cluster has {} of memory in total: {} short",
        fmt_bytes(*.needed),
        fmt_bytes(*.available),
        fmt_bytes(.needed - .available)
    )]
    DoesNotFit {
        /// The model's name.
        model: String,
        /// Bytes the training state needs at least.
        needed: f64,
        /// Bytes the cluster has.
        available: f64,
    },
    /// The state fits in total, but no plan of the space fits every stage.
    #[error("{0}")]
    NoFeasiblePlan(String),
    /// The space asked for is too large to search.
    #[error("{0}")]
    TooLarge(String),
}

/// Bytes as TB (decimal) with two decimals, GB below 1 TB, MB below
/// 0.1 GB.
pub fn fmt_bytes(b: f64) -> String {
    if b >= 1e12 {
        format!("{:.2} TB", b / 1e12)
    } else if b >= 1e8 {
        format!("{:.2} GB", b / 1e9)
    } else {
        format!("{:.2} MB", b / 1e6)
    }
}

/// One chip type's best throughput alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AloneThroughput {
    /// The chip type.
    pub chip: String,
    /// Its chips.
    pub chips: u64,
    /// Best predicted tokens/s alone; 0 when the model does not fit it.
    pub tokens_per_s: f64,
    /// Why the type cannot hold the model alone (then `tokens_per_s` is
    /// 0); absent when it can.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cannot_hold: Option<String>,
}

/// The search's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanReport {
    /// The fastest plan found.
    pub plan: Plan,
    /// Tokens/s over the sum of each type's best alone; `None` when no type
    /// fits the model alone (or the ratio was not asked for).
    pub hetero_speedup_ratio: Option<f64>,
    /// Each type's best alone (empty when the ratio was not asked for).
    pub alone: Vec<AloneThroughput>,
    /// Candidate plans evaluated (layer placement and step time), including
    /// those of the alone searches.
    pub candidates: u64,
    /// Wall-clock search time, seconds.
    pub search_seconds: f64,
    /// Whether the search was exhaustive.
    pub exhaustive: bool,
    /// Whether the search reached its time limit
    /// ([`PlanOptions::time_limit_seconds`]) and stopped early: the plan
    /// is the best of the candidates tried, not necessarily the search's
    /// best.
    #[serde(default)]
    pub time_limited: bool,
    /// The training settings the plan was made under (so that `--evaluate`
    /// of this report scores it under the same ones).
    pub settings: TrainingSettings,
}

/// Bytes of weights, gradients and optimizer state of the whole model when
/// held once (the least any plan needs, `d = 1`).
pub fn training_state_bytes(model: &ModelSpec, settings: &TrainingSettings) -> f64 {
    model.total_params() as f64
        * (settings.dtype.bytes() as f64 + settings.grad_bytes() + settings.optimizer_bytes())
}

/// Each pair of degrees [`plan_expert_degrees`] tried and the simulated
/// tokens per second its plan gave (`None`: no plan).
pub type DegreesTried = Vec<(ExpertDegrees, Option<f64>)>;

/// One pair of degrees [`plan_expert_degrees`] tried: expert-parallel and
/// expert tensor-parallel (0: each stage's tp).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertDegrees {
    pub ep: u64,
    pub etp: u64,
}

/// The expert-parallel degrees [`plan_expert_degrees`] tries for a
/// mixture of `experts`: the powers of two that divide it, up to 64.
pub fn expert_degrees(experts: u64) -> Vec<u64> {
    (0..=6)
        .map(|k| 1u64 << k)
        .filter(|&d| d <= experts && experts % d == 0)
        .collect()
}

/// Plans a mixture of experts at each of [`expert_degrees`] (the
/// settings' `expert_parallel` replaced), each at the settings' expert
/// tensor-parallel degree, and where they leave it at the tp also at 1
/// (every expert whole on a chip, as Megatron-LM's MoE recipes run them),
/// and keeps the fastest plan by simulated tokens per second; with it,
/// each pair of degrees and the tokens per second it gave (`None`: no
/// plan). Refuses a dense model; with no plan at any degree, the last
/// degree's refusal.
pub fn plan_expert_degrees(
    model: &ModelSpec,
    cluster: &ClusterSpec,
    settings: &TrainingSettings,
    options: &PlanOptions,
) -> Result<(PlanReport, DegreesTried), PlanError> {
    if !model.is_moe() {
        return Err(SpecError::Settings(format!(
            "model \"{}\" is dense (no experts to divide); plan it at one expert-parallel degree",
            model.name
        ))
        .into());
    }
    let (mut best, mut tried, mut refusal): (Option<PlanReport>, Vec<_>, _) =
        (None, Vec::new(), None);
    let etps: &[u64] = match settings.expert_tensor_parallel {
        0 => &[0, 1],
        _ => &[settings.expert_tensor_parallel],
    };
    for ep in expert_degrees(model.experts) {
        for &etp in etps {
            let s = TrainingSettings {
                expert_parallel: ep,
                expert_tensor_parallel: etp,
                ..settings.clone()
            };
            let degrees = ExpertDegrees { ep, etp };
            match plan(model, cluster, &s, options) {
                Ok(r) => {
                    let tokens = r.plan.tokens_per_s_simulated;
                    tried.push((degrees, Some(tokens)));
                    if best
                        .as_ref()
                        .is_none_or(|b| tokens > b.plan.tokens_per_s_simulated)
                    {
                        best = Some(r);
                    }
                }
                Err(e) => {
                    tried.push((degrees, None));
                    refusal = Some(e);
                }
            }
        }
    }
    match (best, refusal) {
        (Some(best), _) => Ok((best, tried)),
        (None, Some(e)) => Err(e),
        // A mixture has at least 2 experts, so degrees 1 and 2 are tried.
        (None, None) => unreachable!("no expert-parallel degree tried"),
    }
}

/// Plans `model` on `cluster`.
pub fn plan(
    model: &ModelSpec,
    cluster: &ClusterSpec,
    settings: &TrainingSettings,
    options: &PlanOptions,
) -> Result<PlanReport, PlanError> {
    let start = Instant::now();
    model.validate()?;
    cluster.validate()?;
    settings.validate()?;
    if settings.context_parallel > 1 {
        return Err(crate::error::SpecError::Settings(format!(
            "context_parallel is {}, but the search proposes plans without context \
             parallelism; score such a plan with polychip plan --evaluate",
            settings.context_parallel
        ))
        .into());
    }
    crate::cost::check_cluster_settings(model, cluster, settings)?;
    if settings.virtual_stages > 1 {
        return Err(crate::error::SpecError::Settings(format!(
            "virtual_stages is {}, but the search proposes plans without interleaving; score \
             an interleaved plan with polychip plan --evaluate",
            settings.virtual_stages
        ))
        .into());
    }
    let needed = training_state_bytes(model, settings);
    let available: f64 = cluster
        .chip_types
        .iter()
        .map(|c| c.count as f64 * c.memory_bytes as f64)
        .sum();
    if available < needed {
        return Err(PlanError::DoesNotFit {
            model: model.name.clone(),
            needed,
            available,
        });
    }
    if options.exhaustive {
        let ctx = Ctx::new(model, cluster, settings, options);
        let combos = ctx.exhaustive_combinations();
        if combos > EXHAUSTIVE_LIMIT {
            return Err(PlanError::TooLarge(format!(
                "an exhaustive search of this cluster would enumerate {} combinations of chip \
                 types, tensor-parallel degrees and stage counts over its data-parallel \
                 degrees, more than the {EXHAUSTIVE_LIMIT} it may (about half a millisecond \
                 each); plan without --exhaustive",
                if combos == u64::MAX {
                    "more than 2^64".to_string()
                } else {
                    combos.to_string()
                }
            )));
        }
    }
    let mut candidates = 0u64;
    let deadline = (options.time_limit_seconds > 0)
        .then(|| start + std::time::Duration::from_secs(options.time_limit_seconds));
    let mut time_limited = false;
    // Each type alone: for the ratio and the mixed-groups relaxation. A
    // single-type cluster is planned alone too, so that its ratio of exactly
    // 1 is a result of the search, not an assumption.
    let mut alone_best: Vec<Option<Best>> = Vec::new();
    if options.speedup_ratio || options.mixed_replicas {
        let n = cluster.chip_types.len() as u32;
        for (i, chip) in cluster.chip_types.iter().enumerate() {
            let sub = ClusterSpec {
                chip_types: vec![chip.clone()],
                inter_node_bandwidth: cluster.inter_node_bandwidth,
            };
            let mut ctx = Ctx::new(model, &sub, settings, options);
            // The types alone share half the time, one after another; the
            // search over all of them has the rest.
            ctx.deadline = deadline.map(|_| {
                start
                    + std::time::Duration::from_secs(options.time_limit_seconds) * (i as u32 + 1)
                        / (2 * n)
            });
            let best = ctx.search_heteropp();
            candidates += ctx.candidates;
            time_limited |= ctx.time_limited;
            alone_best.push(best.map(|b| b.with_types(&[cluster_index(cluster, &chip.name)])));
        }
    }
    let mut ctx = Ctx::new(model, cluster, settings, options);
    ctx.deadline = deadline;
    let mut best = match options.heteropp {
        true => ctx.search_heteropp().map(Choice::Pp),
        false => None,
    };
    if options.mixed_replicas {
        let groups: Vec<Best> = alone_best.iter().flatten().cloned().collect();
        if groups.len() >= 2
            && let Some(mixed) = ctx.mixed(&groups)
        {
            let better = match &best {
                Some(b) => mixed.time < b.time(),
                None => true,
            };
            if better {
                best = Some(Choice::Mixed(mixed));
            }
        }
    }
    candidates += ctx.candidates;
    time_limited |= ctx.time_limited;
    let Some(best) = best else {
        if time_limited {
            return Err(PlanError::TooLarge(format!(
                "the search found no plan within its time limit of {} s ({candidates} \
                 candidates tried); allow it more (polychip plan --search-timeout), or give a \
                 global batch with fewer divisors or fewer chip types",
                options.time_limit_seconds
            )));
        }
        let b_min = smallest_micro_batch(settings);
        return Err(PlanError::NoFeasiblePlan(format!(
            "no plan fits the {} model on this cluster: its weights, gradients and optimizer state need {} of the cluster's {}, but no split into at most {} stages of one chip type each (tensor parallel up to 8 inside a node) whose data-parallel degree divides the global batch of {} leaves room for the activations of {b_min}-sequence micro-batches; try --recompute full, --shard-optimizer or another global batch",
            model.name,
            fmt_bytes(needed),
            fmt_bytes(available),
            model.layers,
            settings.global_batch
        )));
    };
    let plan = ctx.build(&best);
    let (alone, ratio) = if !options.speedup_ratio {
        (Vec::new(), None)
    } else {
        let alone: Vec<AloneThroughput> = cluster
            .chip_types
            .iter()
            .zip(&alone_best)
            .map(|(c, b)| {
                let tokens = (settings.global_batch * model.seq_len) as f64;
                let step = |b: &Best| ctx.build(&Choice::Pp(b.clone())).step_time_simulated;
                match b.as_ref().map(|b| tokens / step(b)) {
                    Some(t) if t.is_finite() && t > 0.0 => AloneThroughput {
                        chip: c.name.clone(),
                        chips: c.count,
                        tokens_per_s: t,
                        cannot_hold: None,
                    },
                    _ => AloneThroughput {
                        chip: c.name.clone(),
                        chips: c.count,
                        tokens_per_s: 0.0,
                        cannot_hold: Some(why_not_alone(c, model, settings)),
                    },
                }
            })
            .collect();
        let sum: f64 = alone.iter().map(|a| a.tokens_per_s).sum();
        // Both sides from the assembled plans' simulated steps (what the
        // report prints; the search ranks by its analytic estimate, which
        // may differ by a few percent), through one formula, so that equal
        // plans give a ratio of exactly 1.
        let mixed = (settings.global_batch * model.seq_len) as f64 / plan.step_time_simulated;
        let ratio = (sum > 0.0).then(|| mixed / sum);
        (alone, ratio)
    };
    Ok(PlanReport {
        plan,
        hetero_speedup_ratio: ratio,
        alone,
        candidates,
        search_seconds: start.elapsed().as_secs_f64(),
        exhaustive: options.exhaustive,
        time_limited,
        settings: settings.clone(),
    })
}

/// Why `chip`'s chips alone hold no plan of `model`: too little memory
/// for the training state at all, or none left for the activations.
fn why_not_alone(chip: &ChipType, model: &ModelSpec, settings: &TrainingSettings) -> String {
    // Small figures in bytes: "0.00 MB" would hide what is left.
    let fmt_bytes = |b: f64| {
        if b < 1e5 {
            format!("{b:.0} B")
        } else {
            fmt_bytes(b)
        }
    };
    let needed = training_state_bytes(model, settings);
    let usable = chip.usable_memory();
    let total = usable as f64 * chip.count as f64;
    let usable_is = format!(
        "{} usable per chip: memory_bytes {} less the reserve {} and the matmul workspace {}",
        fmt_bytes(usable as f64),
        fmt_bytes(chip.memory_bytes as f64),
        fmt_bytes(chip.memory_reserve() as f64),
        fmt_bytes(chip.matmul_workspace() as f64)
    );
    if total < needed {
        return format!(
            "its {} chips have {} in all ({usable_is}), less than the {} its weights, gradients \
             and optimizer state need",
            chip.count,
            fmt_bytes(total),
            fmt_bytes(needed)
        );
    }
    let b_min = smallest_micro_batch(settings);
    format!(
        "no split over its {} chips ({usable_is}) whose data-parallel degree divides the \
         global batch of {} leaves room for the activations of {b_min}-sequence micro-batches",
        chip.count, settings.global_batch
    )
}

fn cluster_index(cluster: &ClusterSpec, name: &str) -> usize {
    cluster
        .chip_types
        .iter()
        .position(|c| c.name == name)
        .unwrap_or(0)
}

/// `k` consecutive stages of chip type `ty` (an index into the cluster's
/// types), `tp` chips each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seg {
    ty: usize,
    tp: u64,
    k: u64,
}

/// A pipeline's stages in order: (chip type, tp, where its chips sit).
type StageList = Vec<(usize, u64, StagePlacement)>;

/// The best HeteroPP candidate of a search.
#[derive(Debug, Clone)]
struct Best {
    segs: Vec<Seg>,
    d: u64,
    b: u64,
    m: u64,
    layers: Vec<u64>,
    time: f64,
}

impl Best {
    /// Re-indexes the chip types of a single-type search into the full
    /// cluster's.
    fn with_types(mut self, map: &[usize]) -> Self {
        for s in &mut self.segs {
            s.ty = map[s.ty];
        }
        self
    }
}

/// One group of a mixed plan: a pipeline, its replicas and its share.
#[derive(Debug, Clone)]
struct Group {
    segs: Vec<Seg>,
    d: u64,
    b: u64,
    m: u64,
    layers: Vec<u64>,
}

#[derive(Debug, Clone)]
struct Mixed {
    groups: Vec<Group>,
    time: f64,
}

#[derive(Debug, Clone)]
enum Choice {
    Pp(Best),
    Mixed(Mixed),
}

impl Choice {
    fn time(&self) -> f64 {
        match self {
            Choice::Pp(b) => b.time,
            Choice::Mixed(m) => m.time,
        }
    }
}

/// Per-stage costs of one placement: `t_i(n) = n c_i + extra_i` (the
/// embedding on the first stage, the head on the last), memory cap
/// `nmax_i` layers.
struct StageCoef {
    c: f64,
    extra: f64,
    nmax: u64,
}

/// One chip type's per-layer time and the fixed extras of the first and
/// last stages, for one tp and micro-batch size.
#[derive(Debug, Clone, Copy)]
struct LayerTime {
    c: f64,
    first: f64,
    head: f64,
}

/// Summary of a placed pipeline for the analytic step time.
struct Placed {
    layers: Vec<u64>,
    max_t: f64,
    sum_t: f64,
    p2p: f64,
    tail: f64,
}

impl Placed {
    fn time(&self, m: u64) -> f64 {
        (m.max(1) - 1) as f64 * self.max_t + self.sum_t + self.p2p + self.tail
    }
}

struct Ctx<'a> {
    model: &'a ModelSpec,
    cluster: &'a ClusterSpec,
    settings: &'a TrainingSettings,
    exhaustive: bool,
    budget: u64,
    /// Per (type, tp, micro-batch size): forward + backward time of one
    /// layer, the extra of the first stage (the embedding) and of the last
    /// (the head).
    layer_time: std::collections::HashMap<(usize, u64, u64), LayerTime>,
    /// The model with 4 more layers, every one like its last (a mixture's
    /// expert layers), for per-layer coefficients away from the embedding
    /// and head.
    big: ModelSpec,
    /// A mixture with dense first layers: the model with 4 more layers,
    /// those first, for what they change of the first stage's time.
    big_dense: Option<ModelSpec>,
    candidates: u64,
    /// When the search must stop ([`PlanOptions::time_limit_seconds`]).
    deadline: Option<Instant>,
    /// Whether it stopped there.
    time_limited: bool,
}

impl<'a> Ctx<'a> {
    fn new(
        model: &'a ModelSpec,
        cluster: &'a ClusterSpec,
        settings: &'a TrainingSettings,
        options: &PlanOptions,
    ) -> Self {
        let mut big = model.clone();
        big.layers += 4;
        // (A mixture's dense layers between its expert ones are priced as
        // expert ones here, as wide or wider in the models that have them;
        // the plan kept is priced layer by layer.)
        let big_dense = (model.is_moe() && model.dense_layers > 0).then(|| big.clone());
        big.dense_layers = 0;
        big.dense_ffn = 0;
        big.moe_layer_step = 0;
        big.moe_layer_offset = 0;
        Ctx {
            model,
            cluster,
            settings,
            exhaustive: options.exhaustive,
            budget: options.full_enumeration_budget,
            layer_time: Default::default(),
            big,
            big_dense,
            candidates: 0,
            deadline: None,
            time_limited: false,
        }
    }

    /// Whether the deadline has passed (and so the search stops).
    fn out_of_time(&mut self) -> bool {
        if !self.time_limited && self.deadline.is_some_and(|d| Instant::now() >= d) {
            self.time_limited = true;
        }
        self.time_limited
    }

    fn chip(&self, ty: usize) -> &'a ChipType {
        &self.cluster.chip_types[ty]
    }

    /// Expands segments into the stages of `d` copies of the pipeline:
    /// (type, tp, where its chips sit).
    fn stages(&self, segs: &[Seg], d: u64) -> StageList {
        let types: Vec<(usize, u64)> = segs
            .iter()
            .flat_map(|s| (0..s.k).map(move |_| (s.ty, s.tp)))
            .collect();
        let placed = place(self.cluster, d, &types);
        types
            .into_iter()
            .zip(placed)
            .map(|((ty, tp), at)| (ty, tp, at))
            .collect()
    }

    fn shape<'c>(
        &self,
        chip: &'c ChipType,
        layers: std::ops::Range<u64>,
        index: usize,
        p: usize,
        dp: u64,
        tp: u64,
    ) -> StageShape<'c> {
        StageShape {
            chip,
            layers: self.model.stage_layers(layers, index + 1 == p),
            index,
            num_stages: p,
            dp,
            tp,
            next: None,
            dp_peers: &[],
            dp_one_node: crate::placement::first_stage_one_node(chip, dp, tp),
        }
    }

    fn layer_time(&mut self, ty: usize, tp: u64, b: u64) -> LayerTime {
        if let Some(&v) = self.layer_time.get(&(ty, tp, b)) {
            return v;
        }
        let (chip, lb) = (self.chip(ty), self.big.layers);
        let mbt = Microbatching { size: b, count: 1 };
        // One layer as the first, a middle and the last of three stages.
        let time = |model: &ModelSpec, layers: std::ops::Range<u64>, index: usize| {
            let shape = self.shape(chip, layers, index, 3, 1, tp);
            let t = stage_timing(model, self.settings, self.cluster, &shape, mbt);
            t.forward + t.backward
        };
        let c = time(&self.big, 1..2, 1);
        // A mixture's dense first layers, which the first stage holds
        // (when it holds as many layers), beside the embedding: what they
        // take beyond as many expert layers.
        let first = match &self.big_dense {
            Some(big) => {
                let k = big.dense_layers;
                time(big, 0..k, 0) - k as f64 * c
            }
            None => time(&self.big, 0..1, 0) - c,
        };
        let v = LayerTime {
            c,
            first,
            head: time(&self.big, lb - 1..lb, 2) - c,
        };
        self.layer_time.insert((ty, tp, b), v);
        v
    }

    /// A lower bound on one layer's time a micro-batch on type `ty` at
    /// `tp` in stages of `d` replicas: its compute, and under ZeRO-2 and 3
    /// its collectives over the fastest link its group could have (the
    /// node's, or the network's), as [`Self::place`] adds them. Without
    /// them the bound of a ZeRO-2 search pruned almost nothing (754 k
    /// candidates, 3.7 s, on the 1,024-chip example).
    fn layer_floor(&mut self, ty: usize, tp: u64, b: u64, d: u64) -> f64 {
        let c = self.layer_time(ty, tp, b).c;
        let zero = self.settings.zero();
        if zero < 2 || d <= 1 {
            return c;
        }
        let fastest = self
            .chip(ty)
            .intra_node_bandwidth
            .max(self.cluster.inter_node_bandwidth);
        let params = ChipParams::layers(&self.big, self.settings, 1, tp);
        let [gather, scatter] =
            zero_collective_seconds(&self.big, self.settings, params, d, fastest);
        match zero {
            2 if self.settings.overlap_grad_reduce => c,
            2 => c + scatter,
            _ => c.max(2.0 * gather + scatter),
        }
    }

    /// Places the layers on the stages `st` (min-max under memory caps) for
    /// `dp` replicas in all, micro-batches of `b`, `m` per step (`None`:
    /// assume the most in flight), and sums up the step-time terms; `peers`
    /// are the chip types of every replica the gradients are reduced with
    /// (none: only this pipeline's copies).
    fn place(
        &mut self,
        st: &[(usize, u64, StagePlacement)],
        dp: u64,
        b: u64,
        m: Option<u64>,
        peers: &[usize],
    ) -> Option<Placed> {
        let (model, settings) = (self.model, self.settings);
        let l = model.layers;
        let p = st.len();
        if p as u64 > l || p == 0 {
            return None;
        }
        // A mixture's expert-parallel groups divide each stage's replicas
        // (times its `tp` over the expert tensor-parallel degree).
        if model.is_moe()
            && st
                .iter()
                .any(|&(_, tp, _)| experts_unfolded(model, settings, tp, dp).is_some())
        {
            return None;
        }
        let mb = Microbatching {
            size: b,
            count: m.unwrap_or(u64::MAX),
        };
        let lb = self.big.layers;
        let mut coefs = Vec::with_capacity(p);
        for (i, &(ty, tp, at)) in st.iter().enumerate() {
            let chip = self.chip(ty);
            let cap = chip.memory_bytes as f64;
            let nmax = if p == 1 {
                let mem = stage_memory(model, settings, &self.shape(chip, 0..l, 0, 1, dp, tp), mb);
                if mem.total <= cap { l } else { 0 }
            } else {
                let (r1, r2) = if i == 0 {
                    (0..1, 0..2)
                } else if i + 1 == p {
                    (lb - 1..lb, lb - 2..lb)
                } else {
                    (1..2, 1..3)
                };
                let m1 = stage_memory(&self.big, settings, &self.shape(chip, r1, i, p, dp, tp), mb)
                    .total;
                let m2 = stage_memory(&self.big, settings, &self.shape(chip, r2, i, p, dp, tp), mb)
                    .total;
                let per = m2 - m1;
                if m1 > cap {
                    0
                } else if per <= 0.0 {
                    l
                } else {
                    (1 + ((cap - m1) / per).floor() as u64).min(l)
                }
            };
            if nmax == 0 {
                return None;
            }
            let lt = self.layer_time(ty, tp, b);
            let mut extra = 0.0;
            if i == 0 {
                extra += lt.first;
            }
            if i + 1 == p {
                extra += lt.head;
            }
            let mut c = lt.c;
            if settings.zero() >= 2 && dp > 1 {
                // ZeRO-2 and 3's collectives every micro-batch, per layer
                // and for the embedding's and head's parameters, as
                // `cost::zero_collectives` prices a stage's (ZeRO-3's
                // overlap taken per layer; the unit nothing overlaps and
                // ZeRO-2's buckets under `overlap_grad_reduce` left to
                // the plan's own evaluation).
                let bandwidth =
                    dp_bandwidth(self.cluster, chip, dp, tp, peers, at.replicas_same_node);
                let per = |params: u64, layers: u64| {
                    let params = ChipParams::split(&self.big, settings, params, layers, layers, tp);
                    zero_collective_seconds(&self.big, settings, params, dp, bandwidth)
                };
                let mut ends = 0;
                if i == 0 {
                    ends += stage_params(&self.big, &(0..1)) - self.big.layer_params();
                }
                if i + 1 == p {
                    let last = self.big.stage_layers(lb - 1..lb, true);
                    ends += stage_params(&self.big, &last) - self.big.layer_params();
                }
                let ([lg, ls], [eg, es]) = (per(self.big.layer_params(), 1), per(ends, 0));
                if settings.zero() == 2 {
                    if !settings.overlap_grad_reduce {
                        c += ls;
                        extra += es;
                    }
                } else {
                    c = c.max(2.0 * lg + ls);
                    extra = extra.max(2.0 * eg + es);
                }
            }
            coefs.push(StageCoef { c, extra, nmax });
        }
        let layers = min_max(&coefs, l)?;
        // The step-time terms, as cost::stage_timing computes them.
        let sbh = (model.seq_len * b * model.hidden * settings.dtype.bytes()) as f64;
        let (mut max_t, mut sum_t, mut p2p, mut tail) = (0.0f64, 0.0, 0.0, 0.0f64);
        let mut start = 0;
        for (i, (&(ty, tp, at), &n)) in st.iter().zip(&layers).enumerate() {
            let chip = self.chip(ty);
            let t = n as f64 * coefs[i].c + coefs[i].extra;
            if i + 1 < p {
                let (nty, ntp, _) = st[i + 1];
                p2p += 2.0
                    * pipeline_send_time(settings, sbh, tp, chip, || {
                        self.cluster.send_bandwidth(
                            chip,
                            tp.saturating_mul(dp),
                            self.chip(nty),
                            ntp.saturating_mul(dp),
                            at.send_same_node,
                        )
                    });
            }
            max_t = max_t.max(t);
            sum_t += t;
            let range = model.stage_layers(start..start + n, i + 1 == p);
            let experts = model.expert_layers_in(&range);
            let all = range.end - range.start;
            let params = ChipParams::split(
                model,
                settings,
                stage_params(model, &range),
                experts,
                all,
                tp,
            );
            let bandwidth = dp_bandwidth(self.cluster, chip, dp, tp, peers, at.replicas_same_node);
            // The step's end: ZeRO-2 gathers the updated weights, ZeRO-3
            // nothing; below, the gradients' all-reduce.
            let ar = match settings.zero() {
                0 | 1 => params.over_groups(model, settings, dp, |p, g| {
                    allreduce_time(p * settings.grad_bytes(), g, bandwidth)
                }),
                2 => zero_collective_seconds(model, settings, params, dp, bandwidth)[0],
                _ => 0.0,
            };
            let opt = optimizer_time(model, settings, chip, params, dp);
            tail = tail.max(ar + opt);
            start += n;
        }
        Some(Placed {
            layers,
            max_t,
            sum_t,
            p2p,
            tail,
        })
    }

    /// The best HeteroPP plan over every chip type of the cluster.
    fn search_heteropp(&mut self) -> Option<Best> {
        let big_b = self.settings.global_batch;
        let l = self.model.layers;
        let nty = self.cluster.chip_types.len();
        let max_count = self.cluster.chip_types.iter().map(|c| c.count).max()?;
        let mut sizes = self.settings.micro_batch_sizes.clone();
        sizes.sort_unstable();
        sizes.dedup();
        let mut best: Option<Best> = None;
        // Under a time limit, a first pass over every degree with only the
        // largest stage count per (type, tp) (HeteroPP's rule, quick) finds
        // a plan to return if the full pass runs out of time, and gives
        // the full pass's lower bound a plan to prune against from its
        // first degree. (Without a limit the pass is skipped, so the search
        // and its candidate count are as they were.)
        let passes: &[bool] = match self.deadline.is_some() && !self.exhaustive {
            true => &[true, false],
            false => &[false],
        };
        for (&quick, d) in passes.iter().flat_map(|q| {
            (1..=max_count.min(big_b))
                .filter(move |d| big_b % d == 0)
                .map(move |d| (q, d))
        }) {
            if self.out_of_time() {
                break;
            }
            // Options per type: None (unused) or (tp, k).
            let combos = self.combinations(d, true);
            let every_k = !quick && (self.exhaustive || combos <= self.budget);
            // A degree the full pass would try with the largest stage
            // counts only is what the quick pass already tried: the same
            // candidates, pruned against no better a plan then than now.
            if !quick && !every_k && passes.len() > 1 {
                continue;
            }
            let opts: Vec<Vec<Option<(u64, u64)>>> = (0..nty)
                .map(|ty| {
                    // Most stages first, so that good plans come early and
                    // the lower bound prunes more.
                    let mut o = Vec::new();
                    for (tp, maxk) in self.largest_ks(ty, d) {
                        if every_k {
                            o.extend((1..=maxk).rev().map(|k| Some((tp, k))));
                        } else {
                            o.push(Some((tp, maxk)));
                        }
                    }
                    o.push(None);
                    o
                })
                .collect();
            let product = opts
                .iter()
                .fold(1u64, |acc, o| acc.saturating_mul(o.len() as u64));
            if !every_k && product > LARGEST_K_LIMIT {
                // Too many types to try every subset: a polynomial
                // selection (see `reduced_space`).
                for used in self.reduced_space(&opts) {
                    let stages: u64 = used.iter().map(|s| s.k).sum();
                    if self.out_of_time() {
                        break;
                    }
                    if stages <= l && self.memory_may_fit(&used, d) {
                        self.try_sizes(&used, d, &sizes, &mut best);
                    }
                }
                continue;
            }
            let mut idx = vec![0usize; nty];
            loop {
                let used: Vec<Seg> = (0..nty)
                    .filter_map(|ty| opts[ty][idx[ty]].map(|(tp, k)| Seg { ty, tp, k }))
                    .collect();
                let stages: u64 = used.iter().map(|s| s.k).sum();
                if self.out_of_time() {
                    break;
                }
                if !used.is_empty() && stages <= l && self.memory_may_fit(&used, d) {
                    self.try_sizes(&used, d, &sizes, &mut best);
                }
                // Next combination.
                let mut t = 0;
                while t < nty {
                    idx[t] += 1;
                    if idx[t] < opts[t].len() {
                        break;
                    }
                    idx[t] = 0;
                    t += 1;
                }
                if t == nty {
                    break;
                }
            }
        }
        best
    }

    /// Per type, the (tp, largest k) options for `d` replicas.
    fn largest_ks(&self, ty: usize, d: u64) -> Vec<(u64, u64)> {
        let chip = self.chip(ty);
        TP_DEGREES
            .iter()
            .filter(|&&tp| chip.chips_per_node % tp == 0 && self.model.tp_splits(tp))
            .map(|&tp| (tp, (chip.count / (d * tp)).min(self.model.layers)))
            .filter(|&(_, k)| k > 0)
            .collect()
    }

    /// Combinations of one option per type (unused included) for `d`
    /// replicas: with every stage count (`every_k`) or the largest only.
    fn exhaustive_combinations(&self) -> u64 {
        let big_b = self.settings.global_batch;
        let max_count = self
            .cluster
            .chip_types
            .iter()
            .map(|c| c.count)
            .max()
            .unwrap_or(0);
        (1..=max_count.min(big_b))
            .filter(|d| big_b % d == 0)
            .map(|d| self.combinations(d, true))
            .fold(0u64, u64::saturating_add)
    }

    fn combinations(&self, d: u64, every_k: bool) -> u64 {
        (0..self.cluster.chip_types.len()).fold(1u64, |acc, ty| {
            let ks = self.largest_ks(ty, d);
            let n: u64 = match every_k {
                true => ks.iter().map(|&(_, k)| k).sum(),
                false => ks.len() as u64,
            };
            acc.saturating_mul(1 + n)
        })
    }

    /// The candidates of the default search when the combinations of the
    /// largest stage counts exceed [`LARGEST_K_LIMIT`]: as the types used,
    /// every single type, every pair, and every prefix of the memory-first
    /// and of the speed-first order; for each such set, every type with the
    /// option using the most chips (the smaller tp on a tie), and every type
    /// with the same tp (where it offers it). Quadratic in the number of
    /// types instead of exponential.
    fn reduced_space(&self, opts: &[Vec<Option<(u64, u64)>>]) -> Vec<Vec<Seg>> {
        let dtype = self.settings.dtype;
        let pick: Vec<Option<Seg>> = opts
            .iter()
            .enumerate()
            .map(|(ty, o)| {
                o.iter()
                    .flatten()
                    .max_by(|a, b| (a.0 * a.1).cmp(&(b.0 * b.1)).then(b.0.cmp(&a.0)))
                    .map(|&(tp, k)| Seg { ty, tp, k })
            })
            .collect();
        let avail: Vec<usize> = (0..pick.len()).filter(|&t| pick[t].is_some()).collect();
        let mut subsets = std::collections::BTreeSet::new();
        for (i, &a) in avail.iter().enumerate() {
            subsets.insert(vec![a]);
            for &b in &avail[i + 1..] {
                subsets.insert(vec![a, b]);
            }
        }
        let mut by_memory = avail.clone();
        by_memory.sort_by(|&a, &b| {
            let (ca, cb) = (self.chip(a), self.chip(b));
            cb.memory_bytes.cmp(&ca.memory_bytes).then(a.cmp(&b))
        });
        let mut by_speed = avail.clone();
        by_speed.sort_by(|&a, &b| {
            let (ca, cb) = (self.chip(a), self.chip(b));
            cb.sustained_flops(dtype)
                .total_cmp(&ca.sustained_flops(dtype))
                .then(a.cmp(&b))
        });
        for order in [by_memory, by_speed] {
            for n in 3..=order.len() {
                let mut set = order[..n].to_vec();
                set.sort_unstable();
                subsets.insert(set);
            }
        }
        // Each subset with the per-type pick, and with one tensor-parallel
        // degree for every type that offers it (the pick for the others).
        let with_tp = |ty: usize, tp: u64| -> Option<Seg> {
            opts[ty]
                .iter()
                .flatten()
                .filter(|o| o.0 == tp)
                .max_by_key(|o| o.1)
                .map(|&(tp, k)| Seg { ty, tp, k })
                .or(pick[ty])
        };
        let mut out = Vec::new();
        for set in subsets {
            let mut variants: Vec<Vec<Seg>> = vec![set.iter().filter_map(|&t| pick[t]).collect()];
            for tp in TP_DEGREES {
                let v: Vec<Seg> = set.iter().filter_map(|&t| with_tp(t, tp)).collect();
                if !variants.contains(&v) {
                    variants.push(v);
                }
            }
            out.extend(variants);
        }
        out
    }

    /// Lower bound: the chips of one replica must hold the training state
    /// (always true in exhaustive mode, which does not prune).
    fn memory_may_fit(&self, used: &[Seg], d: u64) -> bool {
        if self.exhaustive {
            return true;
        }
        let s = self.settings;
        let shards = s.shards(d);
        let need = self.model.total_params() as f64
            * (s.dtype.bytes() as f64 / shards.weights
                + s.grad_bytes() / shards.gradients
                + s.optimizer_bytes() / shards.optimizer);
        let have: f64 = used
            .iter()
            .map(|g| (g.k * g.tp) as f64 * self.chip(g.ty).memory_bytes as f64)
            .sum();
        have >= need
    }

    /// Type orders to try: HeteroPP's (more memory first) first, then every
    /// other permutation (up to 4 types) or faster-first.
    fn orders(&self, used: &[Seg]) -> Vec<Vec<Seg>> {
        let dtype = self.settings.dtype;
        let mut base = used.to_vec();
        base.sort_by(|a, b| {
            let (ca, cb) = (self.chip(a.ty), self.chip(b.ty));
            cb.memory_bytes.cmp(&ca.memory_bytes).then(a.ty.cmp(&b.ty))
        });
        let mut out = vec![base.clone()];
        if used.len() <= 4 {
            let mut perms = Vec::new();
            permutations(&mut base.clone(), 0, &mut perms);
            out.extend(perms.into_iter().filter(|p| *p != base));
        } else {
            let mut fast = base.clone();
            fast.sort_by(|a, b| {
                let (ca, cb) = (self.chip(a.ty), self.chip(b.ty));
                cb.sustained_flops(dtype)
                    .total_cmp(&ca.sustained_flops(dtype))
                    .then(a.ty.cmp(&b.ty))
            });
            if fast != base {
                out.push(fast);
            }
        }
        out
    }

    /// Tries every micro-batch size and type order for one choice of
    /// `d` and (type, tp, stage count). The default search skips a size
    /// whose lower bound on the step time is no better than the best so far,
    /// and stops at the first size for which no order fits in memory. The
    /// bound, the same for every order, with `c_i` a layer's time on stage
    /// `i` ([`Self::layer_floor`]) and at least one layer per stage:
    /// `(m - 1) max(L / sum_i (1 / c_i), max_i c_i) + sum_i c_i +
    /// (L - p) min_i c_i` (no head, transfers or tail).
    fn try_sizes(&mut self, used: &[Seg], d: u64, sizes: &[u64], best: &mut Option<Best>) {
        let big_b = self.settings.global_batch;
        let mut orders: Vec<(Vec<Seg>, StageList)> = Vec::new();
        for &b in sizes {
            if big_b % (d * b) != 0 {
                continue;
            }
            let m = big_b / (d * b);
            if !self.exhaustive
                && let Some(x) = best.as_ref()
            {
                let l = self.model.layers as f64;
                let (mut speed, mut sum_c, mut max_c, mut min_c, mut p) =
                    (0.0, 0.0, 0.0f64, f64::INFINITY, 0.0);
                for g in used {
                    let c = self.layer_floor(g.ty, g.tp, b, d);
                    speed += g.k as f64 / c;
                    sum_c += g.k as f64 * c;
                    max_c = max_c.max(c);
                    min_c = min_c.min(c);
                    p += g.k as f64;
                }
                let bottleneck = (l / speed).max(max_c);
                let bound = (m - 1) as f64 * bottleneck + sum_c + (l - p) * min_c;
                if bound >= x.time {
                    continue;
                }
            }
            if orders.is_empty() {
                orders = self
                    .orders(used)
                    .into_iter()
                    .map(|o| {
                        let st = self.stages(&o, d);
                        (o, st)
                    })
                    .collect();
            }
            let mut any = false;
            for (order, st) in &orders {
                self.candidates += 1;
                let Some(placed) = self.place(st, d, b, Some(m), &[]) else {
                    continue;
                };
                any = true;
                let time = placed.time(m);
                if best.as_ref().is_none_or(|x| time < x.time) {
                    *best = Some(Best {
                        segs: order.clone(),
                        d,
                        b,
                        m,
                        layers: placed.layers,
                        time,
                    });
                }
            }
            if !any && !self.exhaustive {
                break;
            }
        }
    }

    /// Mixed groups: each of `alone` (one type's best pipeline) keeps its
    /// pipeline and replicas; the batch is split micro-batch by micro-batch.
    fn mixed(&mut self, alone: &[Best]) -> Option<Mixed> {
        let dp: u64 = alone.iter().map(|g| g.d).sum();
        // Every layer's gradients are reduced across the groups' types.
        let types = |groups: &mut dyn Iterator<Item = &[Seg]>| {
            let mut t: Vec<usize> = groups.flat_map(|s| s.iter().map(|s| s.ty)).collect();
            t.sort_unstable();
            t.dedup();
            t
        };
        let peers = types(&mut alone.iter().map(|g| g.segs.as_slice()));
        let mut placed = Vec::new();
        for g in alone {
            let st = self.stages(&g.segs, g.d);
            self.candidates += 1;
            placed.push(self.place(&st, dp, g.b, None, &peers)?);
        }
        let big_b = self.settings.global_batch;
        let mut m = vec![0u64; alone.len()];
        let mut total = 0;
        while total < big_b {
            let mut pick: Option<(usize, f64)> = None;
            for (i, g) in alone.iter().enumerate() {
                if total + g.d * g.b > big_b {
                    continue;
                }
                let t = placed[i].time(m[i] + 1);
                if pick.is_none_or(|(_, bt)| t < bt) {
                    pick = Some((i, t));
                }
            }
            let (i, _) = pick?;
            m[i] += 1;
            total += alone[i].d * alone[i].b;
        }
        let groups: Vec<Group> = alone
            .iter()
            .zip(placed)
            .zip(&m)
            .filter(|(_, m)| **m > 0)
            .map(|((g, p), &m)| Group {
                segs: g.segs.clone(),
                d: g.d,
                b: g.b,
                m,
                layers: p.layers,
            })
            .collect();
        if groups.len() < 2 {
            return None;
        }
        // Re-place with the real replica count and micro-batch counts.
        let dp: u64 = groups.iter().map(|g| g.d).sum();
        let peers = types(&mut groups.iter().map(|g| g.segs.as_slice()));
        let mut time = 0.0f64;
        let mut out = Vec::new();
        for g in groups {
            let st = self.stages(&g.segs, g.d);
            let p = self.place(&st, dp, g.b, Some(g.m), &peers)?;
            time = time.max(p.time(g.m));
            out.push(Group {
                layers: p.layers.clone(),
                ..g
            });
        }
        Some(Mixed { groups: out, time })
    }

    /// The full plan with every prediction.
    fn build(&self, choice: &Choice) -> Plan {
        let (groups, kind) = match choice {
            Choice::Pp(b) => (
                vec![Group {
                    segs: b.segs.clone(),
                    d: b.d,
                    b: b.b,
                    m: b.m,
                    layers: b.layers.clone(),
                }],
                PlanKind::HeteroPp,
            ),
            Choice::Mixed(m) => (m.groups.clone(), PlanKind::MixedReplicas),
        };
        let layouts: Vec<Layout> = groups
            .iter()
            .map(|g| Layout {
                copies: g.d,
                micro_batch_size: g.b,
                micro_batches: g.m,
                stages: self
                    .stages(&g.segs, g.d)
                    .into_iter()
                    .zip(&g.layers)
                    .map(|((ty, tp, _), &layers)| LayoutStage { ty, tp, layers })
                    .collect(),
            })
            .collect();
        assemble(self.model, self.cluster, self.settings, &layouts, kind)
    }
}

/// Every permutation of `v[k..]` (with `v[..k]` fixed), appended to `out`.
fn permutations(v: &mut Vec<Seg>, k: usize, out: &mut Vec<Vec<Seg>>) {
    if k == v.len() {
        out.push(v.clone());
        return;
    }
    for i in k..v.len() {
        v.swap(k, i);
        permutations(v, k + 1, out);
        v.swap(k, i);
    }
}

/// Min-max contiguous placement of `l` layers on stages with per-layer time
/// `c_i`, a fixed `extra_i` and at most `nmax_i` layers each, at least one
/// each: binary search on the bottleneck time; for a bound, each stage
/// greedily takes as many layers as fit (optimal for contiguous stages,
/// since taking more never hurts the later ones).
fn min_max(coefs: &[StageCoef], l: u64) -> Option<Vec<u64>> {
    let p = coefs.len();
    let fill = |bound: f64, mut out: Option<&mut Vec<u64>>| -> bool {
        let mut left = l;
        for (i, s) in coefs.iter().enumerate() {
            let later = (p - 1 - i) as u64;
            if i + 1 == p {
                if left == 0 || left > s.nmax || left as f64 * s.c + s.extra > bound {
                    return false;
                }
                if let Some(o) = out.as_mut() {
                    o.push(left);
                }
            } else {
                let room = bound - s.extra;
                let by_time = if room < 0.0 {
                    0
                } else if s.c > 0.0 {
                    (room / s.c).floor().min(l as f64) as u64
                } else {
                    l
                };
                let n = s.nmax.min(by_time).min(left.saturating_sub(later));
                if n == 0 {
                    return false;
                }
                if let Some(o) = out.as_mut() {
                    o.push(n);
                }
                left -= n;
            }
        }
        true
    };
    let maxc = coefs.iter().map(|s| s.c).fold(0.0, f64::max);
    let extras: f64 = coefs.iter().map(|s| s.extra.max(0.0)).sum();
    let mut hi = l as f64 * maxc + extras;
    hi *= 1.0 + 1e-12;
    if !fill(hi, None) {
        return None;
    }
    let mut lo = 0.0;
    for _ in 0..64 {
        if hi - lo <= hi * 1e-12 {
            break;
        }
        let mid = 0.5 * (lo + hi);
        if fill(mid, None) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let mut out = Vec::with_capacity(p);
    fill(hi, Some(&mut out));
    Some(out)
}

/// The smallest micro-batch size the search tries (1 without any).
fn smallest_micro_batch(settings: &TrainingSettings) -> u64 {
    settings
        .micro_batch_sizes
        .iter()
        .min()
        .copied()
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cluster::example;

    /// The search's own step-time sum equals the analytic step time of the
    /// schedule built from `cost::stage_timing`.
    #[test]
    fn fast_step_time_matches_the_schedule() {
        let settings = TrainingSettings::new(1024);
        let opts = PlanOptions::default();
        let mut mixed_checked = 0;
        for file in ["h2-like-1024.toml", "china-mobile-3-vendor.toml"] {
            let cluster = example(file);
            for model in [ModelSpec::llama_70b(), ModelSpec::h2_100b()] {
                let mut ctx = Ctx::new(&model, &cluster, &settings, &opts);
                let best = ctx.search_heteropp().unwrap();
                let time = best.time;
                let plan = ctx.build(&Choice::Pp(best.clone()));
                let rel = (plan.step_time_analytic - time).abs() / time;
                assert!(rel < 1e-9, "{file}: {time} vs {}", plan.step_time_analytic);
                assert!(plan.fits());
                let alone: Vec<Best> = (0..cluster.chip_types.len())
                    .map(|ty| {
                        let mut b = best.clone();
                        b.segs = vec![Seg { ty, tp: 8, k: 8 }];
                        b.d = 2;
                        b.b = 1;
                        b
                    })
                    .collect();
                if let Some(mixed) = ctx.mixed(&alone) {
                    let plan = ctx.build(&Choice::Mixed(mixed.clone()));
                    let rel = (plan.step_time_analytic - mixed.time).abs() / mixed.time;
                    assert!(
                        rel < 1e-9,
                        "{file} mixed: {} vs {}",
                        mixed.time,
                        plan.step_time_analytic
                    );
                    assert_eq!(plan.replicas.iter().map(|r| r.sequences).sum::<u64>(), 1024);
                    assert!(plan.fits());
                    mixed_checked += 1;
                }
            }
        }
        assert!(mixed_checked >= 2, "{mixed_checked}");
    }

    /// A type that cannot hold the model alone says why, instead of "0
    /// tokens/s"; the ratio still counts the types that can.
    #[test]
    fn a_type_that_cannot_hold_the_model_alone_says_why() {
        let mut cluster = example("china-mobile-3-vendor.toml");
        let t = &mut cluster.chip_types[2];
        t.matmul_workspace_bytes = Some(0);
        t.memory_reserve_bytes = Some(t.memory_bytes - 1);
        cluster.validate().unwrap();
        let r = plan(
            &ModelSpec::llama_7b(),
            &cluster,
            &TrainingSettings::new(256),
            &PlanOptions::default(),
        )
        .unwrap();
        let a = &r.alone[2];
        assert_eq!(a.tokens_per_s, 0.0);
        let why = a.cannot_hold.as_deref().unwrap();
        assert!(
            why.starts_with("its 256 chips have 256 B in all (1 B usable per chip")
                && why.contains("less than the"),
            "{why}"
        );
        assert!(
            r.alone[..2]
                .iter()
                .all(|a| a.cannot_hold.is_none() && a.tokens_per_s > 0.0)
        );
        assert!(
            r.hetero_speedup_ratio
                .is_some_and(|x| x.is_finite() && x > 0.0)
        );
    }

    #[test]
    fn min_max_balances_and_respects_caps() {
        let s = |c: f64, nmax: u64| StageCoef {
            c,
            extra: 0.0,
            nmax,
        };
        assert_eq!(min_max(&[s(1.0, 100), s(1.0, 100)], 10), Some(vec![5, 5]));
        // A twice-as-fast first stage takes twice the layers.
        assert_eq!(min_max(&[s(0.5, 100), s(1.0, 100)], 9), Some(vec![6, 3]));
        // A memory cap moves layers on.
        assert_eq!(min_max(&[s(1.0, 2), s(1.0, 100)], 10), Some(vec![2, 8]));
        assert_eq!(min_max(&[s(1.0, 2), s(1.0, 2)], 10), None);
        // A head worth two layers on the last stage moves a layer off it.
        let head = StageCoef {
            extra: 2.0,
            ..s(1.0, 100)
        };
        assert_eq!(min_max(&[s(1.0, 100), head], 10), Some(vec![6, 4]));
    }
}

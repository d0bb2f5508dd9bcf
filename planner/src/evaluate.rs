//! Scoring a given plan with the model the search uses (`polychip plan
//! --evaluate PLAN`): the plan's groups of identical pipelines (stages of
//! one chip type each, a tensor-parallel degree, a layer range), their
//! micro-batching, and for each stage every memory term against its chips'
//! capacity, its timings, the analytic and simulated step, and the
//! bottleneck stage.
//!
//! A plan file is any of: `polychip plan --json` output (the report, or its
//! `plan`), `polychip train --save-plan` output (TOML `[[group]]` tables or
//! JSON, stages naming devices such as `ferrite:0`), or the same form with
//! `chip` (a chip type) and `tp` in place of `device` (`dp` may stand for
//! `copies`, and `layers` may be a count: the layers after the previous
//! stage's). A stage's chip is resolved by [`ClusterSpec::resolve_chip`].
//!
//! A stage whose data-parallel group mixes chip types lists the chip of
//! every replica (`"chip": ["A", "B"]`, or `[{"chip": "A", "copies": 2},
//! "B"]`; `tp` one degree or a list as long), the form measured
//! heterogeneous runs are written in: replica `j` runs entry
//! `j` of every such stage, and replicas with the same pipeline become one
//! group of copies ([`GroupOrigin`] says which). All groups share the
//! gradient all-reduce, and a stage's all-reduce among several chip types
//! runs at the slowest link between them across nodes.

use std::ops::Range;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cluster::ClusterSpec;
use crate::cost::{
    Boundary, MemoryBreakdown, Microbatching, StageShape, stage_memory, stage_timing,
};
use crate::error::SpecError;
use crate::model::ModelSpec;
use crate::plan::{Plan, PlanKind, Replica, StagePlan};
use crate::schedule::PipelineSchedule;
use crate::settings::TrainingSettings;

/// The most groups and stages per pipeline a plan may have.
const MAX_GROUPS: usize = 4096;
const MAX_STAGES: usize = 10_000;
/// The most stage-micro-batch pairs the simulator runs for one plan (each
/// group's stages times its micro-batches, summed; about 100 bytes and a
/// microsecond each): beyond it a plan is refused rather than simulated for
/// long in gigabytes. (128 stages of 16,384 micro-batches stay inside.)
const MAX_SIMULATED: u64 = 1 << 21;

/// One stage of a pipeline: a chip type (an index into the cluster), its
/// tensor-parallel degree and its layer count. Which node its chips sit in
/// follows from the group's order ([`crate::placement`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LayoutStage {
    pub ty: usize,
    pub tp: u64,
    pub layers: u64,
}

/// `copies` identical pipelines and their micro-batching.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    pub copies: u64,
    pub micro_batch_size: u64,
    pub micro_batches: u64,
    pub stages: Vec<LayoutStage>,
}

/// Prices every stage of `groups` and predicts the step: the one path from
/// a layout to a [`Plan`], for the search's answer and for a plan given to
/// evaluate. All replicas of all groups share one gradient all-reduce.
pub(crate) fn assemble(
    model: &ModelSpec,
    cluster: &ClusterSpec,
    settings: &TrainingSettings,
    groups: &[Layout],
    kind: PlanKind,
) -> Plan {
    let dp: u64 = groups.iter().map(|g| g.copies).sum();
    let chip = |ty: usize| &cluster.chip_types[ty];
    let holders = Holders::new(cluster.chip_types.len(), groups);
    let mut replicas: Vec<Replica> = groups
        .iter()
        .map(|g| {
            let p = g.stages.len();
            let mb = Microbatching {
                size: g.micro_batch_size,
                count: g.micro_batches,
            };
            let mut start = 0;
            let mut stages = Vec::with_capacity(p);
            // Under interleaving the stages are the chunks of `devices`
            // devices, chunk `i` on device `i % devices`, which are placed.
            let v = settings.virtual_stages.max(1) as usize;
            let devices = (p / v).max(1);
            // A stage's replica is `tp` chips times its context-parallel
            // groups, adjacent (Megatron-LM's tp-cp-dp-pp order).
            let cp = settings.context_parallel.max(1);
            let types: Vec<(usize, u64)> = g.stages[..devices]
                .iter()
                .map(|s| (s.ty, s.tp.saturating_mul(cp)))
                .collect();
            let placed = crate::placement::place(cluster, g.copies, &types);
            // The last device's send to the first one's next chunk stays in
            // a node when the whole pipeline does.
            let wraps_in_node = placed[..devices - 1].iter().all(|d| d.send_same_node);
            for (i, s) in g.stages.iter().enumerate() {
                let c = chip(s.ty);
                let device = i % devices;
                // The types its gradients are reduced with, over all groups.
                let peers: Vec<usize> = holders
                    .other_types(s.ty, Holders::units(start, s.layers, i, p))
                    .collect();
                let shape = StageShape {
                    chip: c,
                    layers: model.stage_layers(start..start + s.layers, i + 1 == p),
                    index: i,
                    num_stages: p,
                    dp,
                    tp: s.tp,
                    next: g.stages.get(i + 1).map(|n| Boundary {
                        chip: chip(n.ty),
                        same_node: match device + 1 < devices {
                            true => placed[device].send_same_node,
                            false => wraps_in_node,
                        },
                        // The group's replicas of each stage send at once
                        // (each context-parallel group its part).
                        senders: s.tp.saturating_mul(cp).saturating_mul(g.copies),
                        receivers: n.tp.saturating_mul(cp).saturating_mul(g.copies),
                    }),
                    dp_peers: &peers,
                    // Replicas of other groups sit elsewhere.
                    dp_one_node: placed[device].replicas_same_node && dp == g.copies,
                };
                stages.push(StagePlan {
                    chip: c.name.clone(),
                    tp: s.tp,
                    first_layer: start,
                    end_layer: start + s.layers,
                    mtp_layers: shape.layers.end.saturating_sub(model.layers),
                    memory: stage_memory(model, settings, &shape, mb),
                    memory_capacity: c.memory_bytes,
                    mfu: 0.0,
                    timing: stage_timing(model, settings, cluster, &shape, mb),
                });
                start += s.layers;
            }
            if v > 1 {
                // Each chunk shows its device's memory: all its chunks'.
                for d in 0..devices {
                    let chunks: Vec<MemoryBreakdown> = stages
                        .iter()
                        .skip(d)
                        .step_by(devices)
                        .map(|s| s.memory)
                        .collect();
                    let memory = MemoryBreakdown::of_device(&chunks);
                    for s in stages.iter_mut().skip(d).step_by(devices) {
                        s.memory = memory;
                    }
                }
            }
            let mut r = Replica {
                copies: g.copies,
                stages,
                micro_batch_size: g.micro_batch_size,
                micro_batches: g.micro_batches,
                sequences: g.copies * g.micro_batch_size * g.micro_batches,
                step_time_analytic: 0.0,
                step_time_simulated: 0.0,
                bubble_fraction: 0.0,
                pipeline: settings.schedule,
                virtual_stages: v as u64,
                run_ahead: settings.run_ahead.max(1),
            };
            r.step_time_analytic = r.schedule().analytic_step_time();
            let sim = crate::sim::step(&r.schedule());
            r.step_time_simulated = sim.step_time;
            r.bubble_fraction = sim.bubble_fraction;
            r
        })
        .collect();
    let slowest = |f: fn(&Replica) -> f64| replicas.iter().map(f).fold(0.0, f64::max);
    let step_a = slowest(|r| r.step_time_analytic);
    let step_s = slowest(|r| r.step_time_simulated);
    let global_batch: u64 = replicas.iter().map(|r| r.sequences).sum();
    let tokens = (global_batch * model.seq_len) as f64;
    let dtype = settings.dtype;
    let mut peak = 0.0;
    for r in &mut replicas {
        let last = r.stages.len().saturating_sub(1);
        let devices = r.devices();
        for (si, s) in r.stages.iter_mut().enumerate() {
            let c = cluster.chip(&s.chip).expect("chip of the plan");
            let layers = model.stage_layers(s.first_layer..s.end_layer, si == last);
            let mut fwd = model.layers_forward_flops(&layers, r.micro_batch_size);
            if si == last {
                fwd += model.head_forward_flops(r.micro_batch_size);
            }
            let stage_peak =
                c.peak_flops.get(dtype) * (s.tp * settings.context_parallel.max(1)) as f64;
            s.mfu = 3.0 * fwd * r.micro_batches as f64 / (step_s * stage_peak);
            // A device's chips once, not once per chunk.
            if si < devices {
                peak += stage_peak * r.copies as f64;
            }
        }
    }
    let bubble = replicas
        .iter()
        .max_by(|a, b| a.step_time_simulated.total_cmp(&b.step_time_simulated))
        .map_or(0.0, |r| r.bubble_fraction);
    let chips_used =
        replicas.iter().map(Replica::chips).sum::<u64>() * settings.context_parallel.max(1);
    Plan {
        model: model.name.clone(),
        kind,
        dp,
        replicas,
        global_batch,
        seq_len: model.seq_len,
        step_time_analytic: step_a,
        step_time_simulated: step_s,
        tokens_per_s: tokens / step_a,
        tokens_per_s_simulated: tokens / step_s,
        bubble_fraction: bubble,
        mfu: model.flops_per_iteration(global_batch) / (step_s * peak),
        chips_used,
    }
}

/// Which chip types hold each part of the model over all groups, to find
/// the types a stage's gradients are reduced with. A stage's parameters are
/// numbered as units: 0 the embedding, `1 + l` layer `l`, then the head;
/// each type keeps the merged unit ranges its stages hold.
struct Holders {
    by_type: Vec<Vec<Range<u64>>>,
}

impl Holders {
    fn new(types: usize, groups: &[Layout]) -> Holders {
        let mut by_type: Vec<Vec<Range<u64>>> = vec![Vec::new(); types];
        for g in groups {
            let mut start = 0;
            for (i, s) in g.stages.iter().enumerate() {
                by_type[s.ty].push(Self::units(start, s.layers, i, g.stages.len()));
                start += s.layers;
            }
        }
        for ranges in &mut by_type {
            ranges.sort_by_key(|r| r.start);
            let mut merged: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
            for r in ranges.drain(..) {
                match merged.last_mut() {
                    Some(m) if r.start <= m.end => m.end = m.end.max(r.end),
                    _ => merged.push(r),
                }
            }
            *ranges = merged;
        }
        Holders { by_type }
    }

    /// The units of stage `index` of `stages`, holding `layers` layers
    /// from `first`.
    fn units(first: u64, layers: u64, index: usize, stages: usize) -> Range<u64> {
        let head = u64::from(index + 1 == stages);
        let embedding = u64::from(index == 0);
        (first + 1 - embedding)..(first + layers + 1 + head)
    }

    /// The chip types other than `ty` that hold any of `units`.
    fn other_types(&self, ty: usize, units: Range<u64>) -> impl Iterator<Item = usize> + '_ {
        self.by_type
            .iter()
            .enumerate()
            .filter_map(move |(t, ranges)| {
                // The first merged range ending after `units` starts.
                let k = ranges.partition_point(|r| r.end <= units.start);
                (t != ty && ranges.get(k).is_some_and(|r| r.start < units.end)).then_some(t)
            })
    }
}

/// One stage of a plan to evaluate, as written in the plan file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageSpec {
    /// A chip type, a device of it, or a vendor.
    pub chip: String,
    /// Tensor-parallel degree.
    pub tp: u64,
    /// Layers `[first, end)`.
    pub layers: [u64; 2],
}

/// `copies` identical pipelines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupSpec {
    /// Identical replicas.
    pub copies: u64,
    /// Sequences per micro-batch.
    pub micro_batch_size: u64,
    /// Micro-batches per step per replica.
    pub micro_batches: u64,
    /// Stages, first to last.
    pub stages: Vec<StageSpec>,
    /// Where a stage of the plan file mixed chip types: the file's group
    /// and the replicas of it that this group holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<GroupOrigin>,
}

/// The replicas of a plan file's group that one [`GroupSpec`] holds, when
/// a stage of that group mixed chip types.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupOrigin {
    /// The group's index in the file.
    pub group: usize,
    /// Its replicas (0-based) that run this pipeline.
    pub replicas: Vec<usize>,
}

impl GroupSpec {
    /// How errors name this group: `group 2`, or `group 0 (replicas 1, 3)`
    /// for one dealt out of a file's group with a mixed stage.
    pub fn label(&self, index: usize) -> String {
        match &self.origin {
            None => format!("group {index}"),
            Some(o) => {
                let r: Vec<String> = o.replicas.iter().map(usize::to_string).collect();
                format!(
                    "group {} (replica{} {})",
                    o.group,
                    if r.len() == 1 { "" } else { "s" },
                    r.join(", ")
                )
            }
        }
    }
}

/// A plan to evaluate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanSpec {
    /// Its groups of replicas.
    pub groups: Vec<GroupSpec>,
    /// The pipelines' schedule the file names (`"schedule"`, as `polychip
    /// train --save-plan` writes it), which it is evaluated under.
    pub schedule: Option<PipelineSchedule>,
    /// Model chunks per device under the interleaved schedule, as the file
    /// names it (`"virtual_stages"`; its stages are then the chunks in
    /// model order), which it is evaluated under.
    pub virtual_stages: Option<u64>,
    /// How far each stage runs ahead of the next, as the file names it
    /// (`"run_ahead"`, a `polychip train --save-plan` plan's), which it is
    /// evaluated under.
    pub run_ahead: Option<u64>,
    /// The training settings a `polychip plan --json` report records (its
    /// `settings`), for a caller to evaluate it under the same ones.
    pub settings: Option<TrainingSettings>,
    /// The model and sequence length a planner's plan names (its `model`
    /// and `seq_len`), for a caller to compare with the model evaluated.
    pub made_for: Option<(String, u64)>,
}

/// The stage-micro-batch pairs the simulator runs for groups of `(stages,
/// micro-batches)`: their products, summed (saturating).
fn simulated_pairs(groups: impl Iterator<Item = (usize, u64)>) -> u64 {
    groups
        .map(|(stages, m)| (stages as u64).saturating_mul(m))
        .fold(0, u64::saturating_add)
}

fn plan_err(m: String) -> SpecError {
    SpecError::Plan(m)
}

/// A non-negative whole number, written as an integer or as a float with
/// no fraction (`128.0`, as `polychip train` reads a plan's layers), up to
/// 2^53 (beyond it a float is not exact).
fn whole_number(x: &Value) -> Option<u64> {
    x.as_u64().or_else(|| {
        x.as_f64()
            .filter(|f| *f >= 0.0 && f.fract() == 0.0 && *f <= (1u64 << 53) as f64)
            .map(|f| f as u64)
    })
}

/// An unsigned field of `v`, or `default` when absent.
fn field_u64(v: &Value, key: &str, at: &str, default: Option<u64>) -> Result<u64, SpecError> {
    match v.get(key) {
        None => default.ok_or_else(|| plan_err(format!("{at} has no {key}"))),
        // null is not "absent": a plan that nulled a count meant something
        // else than the default (it was silently 1).
        Some(Value::Null) => Err(plan_err(match default {
            Some(d) => format!("{at}: {key} is null; give a number, or leave it out for {d}"),
            None => format!("{at}: {key} is null, not a non-negative integer"),
        })),
        Some(x) => x
            .as_u64()
            .ok_or_else(|| plan_err(format!("{at}: {key} is {x}, not a non-negative integer"))),
    }
}

/// The number of elements of a JSON array, read without keeping them
/// (`None` for a value that is not an array).
struct ArrayLen(Option<usize>);

impl<'de> Deserialize<'de> for ArrayLen {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Counter;
        impl<'de> serde::de::Visitor<'de> for Counter {
            type Value = ArrayLen;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any value")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<ArrayLen, A::Error> {
                let mut n = 0;
                while a.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(ArrayLen(Some(n)))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<ArrayLen, A::Error> {
                while a
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(ArrayLen(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<ArrayLen, E> {
                Ok(ArrayLen(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<ArrayLen, E> {
                Ok(ArrayLen(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<ArrayLen, E> {
                Ok(ArrayLen(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<ArrayLen, E> {
                Ok(ArrayLen(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<ArrayLen, E> {
                Ok(ArrayLen(None))
            }
            fn visit_unit<E>(self) -> Result<ArrayLen, E> {
                Ok(ArrayLen(None))
            }
        }
        d.deserialize_any(Counter)
    }
}

/// The group lists of a JSON plan, counted without building them: at the
/// top or under `plan`, as [`PlanSpec::from_value`] looks for them.
#[derive(Deserialize, Default)]
struct GroupCounts {
    #[serde(default)]
    replicas: Option<ArrayLen>,
    #[serde(default)]
    group: Option<ArrayLen>,
    #[serde(default)]
    groups: Option<ArrayLen>,
    #[serde(default)]
    plan: Option<Box<PlanCounts>>,
}

/// `plan` of [`GroupCounts`]: an object's lists, or nothing for another
/// value.
struct PlanCounts(GroupCounts);

impl<'de> Deserialize<'de> for PlanCounts {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Plan;
        impl<'de> serde::de::Visitor<'de> for Plan {
            type Value = PlanCounts;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any value")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, a: A) -> Result<PlanCounts, A::Error> {
                GroupCounts::deserialize(serde::de::value::MapAccessDeserializer::new(a))
                    .map(PlanCounts)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<PlanCounts, A::Error> {
                while a.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(PlanCounts(GroupCounts::default()))
            }
            fn visit_bool<E>(self, _: bool) -> Result<PlanCounts, E> {
                Ok(PlanCounts(GroupCounts::default()))
            }
            fn visit_i64<E>(self, _: i64) -> Result<PlanCounts, E> {
                Ok(PlanCounts(GroupCounts::default()))
            }
            fn visit_u64<E>(self, _: u64) -> Result<PlanCounts, E> {
                Ok(PlanCounts(GroupCounts::default()))
            }
            fn visit_f64<E>(self, _: f64) -> Result<PlanCounts, E> {
                Ok(PlanCounts(GroupCounts::default()))
            }
            fn visit_str<E>(self, _: &str) -> Result<PlanCounts, E> {
                Ok(PlanCounts(GroupCounts::default()))
            }
            fn visit_unit<E>(self) -> Result<PlanCounts, E> {
                Ok(PlanCounts(GroupCounts::default()))
            }
        }
        d.deserialize_any(Plan)
    }
}

/// The most groups a plan's text lists, counted before the plan is parsed
/// into a tree (which takes some 100 bytes a value: a file of 200,000
/// groups took about 200 MB before [`MAX_GROUPS`] refused it). JSON:
/// the lengths of its `replicas`, `group` or `groups` arrays, read without
/// keeping their elements; TOML: its `[[...groups]]`, `[[...group]]` and
/// `[[...replicas]]` table headers. `None` when the text does not parse
/// (the parse proper says why).
fn listed_groups(text: &str, json: bool) -> Option<usize> {
    if json {
        let c: GroupCounts = serde_json::from_str(text).ok()?;
        let len = |c: &GroupCounts| {
            [&c.replicas, &c.group, &c.groups]
                .iter()
                .filter_map(|l| l.as_ref().and_then(|l| l.0))
                .max()
                .unwrap_or(0)
        };
        Some(len(&c).max(c.plan.as_ref().map_or(0, |p| len(&p.0))))
    } else {
        Some(
            text.lines()
                .map(|l| l.trim_start())
                .filter(|l| {
                    l.starts_with("[[") && {
                        let name = l[2..].split("]]").next().unwrap_or("").trim();
                        let last = name.rsplit('.').next().unwrap_or("").trim();
                        matches!(last, "groups" | "group" | "replicas")
                    }
                })
                .count(),
        )
    }
}

impl PlanSpec {
    /// The stage-micro-batch pairs simulating this plan takes (its groups'
    /// stages times micro-batches, summed), what its evaluation costs.
    pub fn simulated_pairs(&self) -> u64 {
        simulated_pairs(
            self.groups
                .iter()
                .map(|g| (g.stages.len(), g.micro_batches)),
        )
    }

    /// Reads a plan from JSON or TOML text (`json` says which), in any of
    /// the forms the module documentation lists.
    pub fn parse(text: &str, json: bool) -> Result<PlanSpec, SpecError> {
        if let Some(n) = listed_groups(text, json).filter(|&n| n > MAX_GROUPS) {
            return Err(plan_err(format!(
                "has {n} groups; a plan has 1 to {MAX_GROUPS}"
            )));
        }
        let value: Value = if json {
            polychip_files::parse_json_value(text)
                .map_err(|e| plan_err(format!("is not valid JSON: {e}")))?
        } else {
            let t: toml::Value = toml::from_str(text).map_err(|e| SpecError::Toml {
                what: "plan",
                message: polychip_files::toml_error(text, &e),
            })?;
            serde_json::to_value(t).map_err(|e| plan_err(e.to_string()))?
        };
        Self::from_value(&value)
    }

    /// Reads a plan file (JSON when its name ends in `.json`, else TOML).
    pub fn load(path: &std::path::Path) -> Result<PlanSpec, SpecError> {
        let text = crate::error::read_file(path)?;
        let json = path.extension().is_some_and(|e| e == "json");
        Self::parse(&text, json).map_err(|e| e.of_plan_file(path))
    }

    fn from_value(v: &Value) -> Result<PlanSpec, SpecError> {
        if v.get("plan").is_some() {
            known_keys(v, "the report", REPORT_KEYS)?;
        }
        let settings = match v.get("settings") {
            None | Some(Value::Null) => None,
            Some(s) => Some(
                TrainingSettings::deserialize(s)
                    .map_err(|e| plan_err(format!("its settings are not training settings: {e}")))
                    .and_then(|s: TrainingSettings| {
                        s.validate()?;
                        Ok(s)
                    })?,
            ),
        };
        let v = v.get("plan").unwrap_or(v);
        if v.get("replicas").is_some() {
            known_keys(v, "the plan", PLAN_KEYS)?;
        } else if v.get("group").is_some() || v.get("groups").is_some() {
            known_keys(v, "the plan", TRAIN_PLAN_KEYS)?;
            one_of(v, "the plan", "group", "groups")?;
        }
        let (groups, planner) = match (v.get("replicas"), v.get("group"), v.get("groups")) {
            (Some(g), _, _) => (g, true),
            (None, Some(g), _) | (None, None, Some(g)) => (g, false),
            _ => {
                return Err(plan_err(
                    "has no groups: expected `polychip plan --json` output (\"replicas\"), or \
                     `polychip train --save-plan` output (\"group\" tables)"
                        .into(),
                ));
            }
        };
        let groups = groups
            .as_array()
            .ok_or_else(|| plan_err("its groups are not a list".into()))?;
        if groups.is_empty() || groups.len() > MAX_GROUPS {
            return Err(plan_err(format!(
                "has {} groups; a plan has 1 to {MAX_GROUPS}",
                groups.len()
            )));
        }
        let mut out = Vec::with_capacity(groups.len());
        for (gi, g) in groups.iter().enumerate() {
            let at = format!("group {gi}");
            match planner {
                true => known_keys(g, &at, PLANNER_GROUP_KEYS)?,
                false => known_keys(g, &at, GROUP_KEYS)?,
            }
            one_of(g, &at, "copies", "dp")?;
            let stages = g
                .get("stages")
                .and_then(Value::as_array)
                .ok_or_else(|| plan_err(format!("{at} has no list of stages")))?;
            if stages.is_empty() || stages.len() > MAX_STAGES {
                return Err(plan_err(format!(
                    "{at} has {} stages; a pipeline has 1 to {MAX_STAGES}",
                    stages.len()
                )));
            }
            let copies = match g.get("copies") {
                Some(_) => field_u64(g, "copies", &at, Some(1))?,
                None => field_u64(g, "dp", &at, Some(1))?,
            };
            let micro_batch_size = field_u64(g, "micro_batch_size", &at, None)?;
            let micro_batches = field_u64(g, "micro_batches", &at, None)?;
            // A trainer plan's replica sequences (the planner's own
            // "sequences" is the group's total, copies included).
            if !planner
                && let Some(seqs) = g.get("sequences")
                && seqs.as_u64() != micro_batch_size.checked_mul(micro_batches)
            {
                return Err(plan_err(format!(
                    "{at} gives sequences {seqs}, a last micro-batch smaller than its others, \
                     which polychip train runs but the cluster planner does not model: give \
                     every micro-batch the same size"
                )));
            }
            if copies.saturating_mul(stages.len() as u64) > MAX_SIMULATED
                && stages
                    .iter()
                    .any(|s| matches!(s.get("chip").or(s.get("device")), Some(Value::Array(_))))
            {
                return Err(plan_err(format!(
                    "{at} has {copies} replicas of {} stages with chip types mixed; the planner \
                     deals out at most {MAX_SIMULATED} replica-stages",
                    stages.len()
                )));
            }
            // Each stage's (chip, tp) per replica: one entry for all of
            // them, or one per replica where the stage mixes chip types.
            let mut per_replica: Vec<Vec<(String, u64)>> = Vec::with_capacity(stages.len());
            let mut layers: Vec<[u64; 2]> = Vec::with_capacity(stages.len());
            for (si, s) in stages.iter().enumerate() {
                let at = format!("stage {si} of group {gi}");
                match planner {
                    true => known_keys(s, &at, PLANNER_STAGE_KEYS)?,
                    false => known_keys(s, &at, STAGE_KEYS)?,
                }
                per_replica.push(stage_chips(s, &at, copies)?);
                let range = if planner {
                    [
                        field_u64(s, "first_layer", &at, None)?,
                        field_u64(s, "end_layer", &at, None)?,
                    ]
                } else if let Some(n) = s.get("layers").and_then(whole_number) {
                    // A count: the layers after the previous stage's.
                    let first = layers.last().map_or(0, |p| p[1]);
                    let end = first.checked_add(n).ok_or_else(|| {
                        plan_err(format!("{at}: layers {n} overflows the layer count"))
                    })?;
                    [first, end]
                } else {
                    let l = s
                        .get("layers")
                        .and_then(Value::as_array)
                        .filter(|l| l.len() == 2)
                        .ok_or_else(|| plan_err(format!("{at} has no layers [first, end]")))?;
                    let n = |x: &Value| {
                        whole_number(x).ok_or_else(|| match x.as_f64() {
                            Some(f) if f >= 0.0 && (f * 2.0).fract() == 0.0 => plan_err(format!(
                                "{at}: layers holds {x}, a cut halfway through a block, which \
                                 polychip train runs but the cluster planner does not model: \
                                 it cuts at whole blocks"
                            )),
                            _ if x.as_str().is_some_and(|t| t.contains('+')) => plan_err(format!(
                                "{at}: layers holds {x}, a cut inside a block by its \
                                     width (heads or columns), which polychip train runs but \
                                     the cluster planner does not model: it cuts at whole \
                                     blocks"
                            )),
                            _ => plan_err(format!("{at}: layers holds {x}, not a layer index")),
                        })
                    };
                    [n(&l[0])?, n(&l[1])?]
                };
                layers.push(range);
            }
            // Replica j runs entry j of every stage that mixes chip types
            // (entry 0 of the others).
            let entry = |chips: &Vec<(String, u64)>, j: usize| j.min(chips.len() - 1);
            let pipeline = |j: usize| -> Vec<StageSpec> {
                per_replica
                    .iter()
                    .zip(&layers)
                    .map(|(chips, &layers)| {
                        let (chip, tp) = chips[entry(chips, j)].clone();
                        StageSpec { chip, tp, layers }
                    })
                    .collect()
            };
            if per_replica.iter().all(|c| c.len() == 1) {
                out.push(GroupSpec {
                    copies,
                    micro_batch_size,
                    micro_batches,
                    stages: pipeline(0),
                    origin: None,
                });
                continue;
            }
            // Replicas whose pipelines are the same become one group of
            // copies, in the order of their first replica.
            let mut members: Vec<Vec<usize>> = Vec::new();
            let mut seen: std::collections::HashMap<Vec<&(String, u64)>, usize> =
                std::collections::HashMap::new();
            for j in 0..copies as usize {
                let key: Vec<&(String, u64)> =
                    per_replica.iter().map(|c| &c[entry(c, j)]).collect();
                let next = members.len();
                let k = *seen.entry(key).or_insert(next);
                if k == next {
                    members.push(Vec::new());
                }
                members[k].push(j);
            }
            for replicas in members {
                out.push(GroupSpec {
                    copies: replicas.len() as u64,
                    micro_batch_size,
                    micro_batches,
                    stages: pipeline(replicas[0]),
                    origin: Some(GroupOrigin {
                        group: gi,
                        replicas,
                    }),
                });
            }
        }
        if out.len() > MAX_GROUPS {
            return Err(plan_err(format!(
                "has {} groups of identical replicas once its mixed stages are dealt out; a \
                 plan has 1 to {MAX_GROUPS}",
                out.len()
            )));
        }
        // A planner's plan restates its replicas and its batch: the groups
        // are what is evaluated, so totals that disagree with them (one
        // edited, not the other) are refused rather than ignored.
        if planner {
            // Checked sums: a total past u64 is said as such, not as the
            // saturated u64::MAX.
            let dp = out
                .iter()
                .try_fold(0u64, |sum, g| sum.checked_add(g.copies));
            let batch = out.iter().try_fold(0u64, |sum, g| {
                g.copies
                    .checked_mul(g.micro_batch_size)?
                    .checked_mul(g.micro_batches)?
                    .checked_add(sum)
            });
            for (key, sum, what) in [
                ("dp", dp, "its replicas' copies add up to"),
                (
                    "global_batch",
                    batch,
                    "its replicas' sequences (copies x micro-batch size x micro-batches) add up to",
                ),
            ] {
                if let Some(x) = v.get(key)
                    && (sum.is_none() || x.as_u64() != sum)
                {
                    let sum =
                        sum.map_or_else(|| format!("more than {}", u64::MAX), |n| n.to_string());
                    return Err(plan_err(format!(
                        "gives {key} {x}, but {what} {sum}: edit the one to match the other"
                    )));
                }
            }
        }
        // A train plan's `schedule`, or the pipeline the planner's own
        // answer priced its replicas under (`replicas[].pipeline`).
        // A planner's groups share one schedule; ones that differ (an
        // edited report) are refused, not scored under the first.
        if planner {
            for key in ["pipeline", "virtual_stages"] {
                let mut named = groups
                    .iter()
                    .enumerate()
                    .filter_map(|(i, g)| g.get(key).map(|x| (i, x)));
                if let Some((i, first)) = named.next()
                    && let Some((j, other)) = named.find(|(_, x)| *x != first)
                {
                    return Err(plan_err(format!(
                        "group {i} gives {key} {first} but group {j} {other}: a plan's \
                         pipelines share one; give every group the same"
                    )));
                }
            }
        }
        let named = match planner {
            true => groups.iter().find_map(|g| g.get("pipeline")),
            false => v.get("schedule"),
        };
        let schedule = match named {
            None | Some(Value::Null) => None,
            Some(x) => Some(x.as_str().and_then(|s| s.parse().ok()).ok_or_else(|| {
                plan_err(format!(
                    "schedule is {x}; expected \"1f1b\", \"1f1b-deferred\", \"zero-bubble\" or \
                     \"gpipe\" \
                     (an interleaved 1F1B plan gives \"virtual_stages\" beside \"1f1b\")"
                ))
            })?),
        };
        let named = match planner {
            true => groups.iter().find_map(|g| g.get("virtual_stages")),
            false => v.get("virtual_stages"),
        };
        // A count from 1 to `max`, where 1 means `one`.
        let count = |named: Option<&Value>, key: &str, max: u64, one: &str| match named {
            None | Some(Value::Null) => Ok(None),
            Some(x) => match x.as_u64().filter(|n| (1..=max).contains(n)) {
                Some(n) => Ok(Some(n)),
                None => Err(plan_err(format!(
                    "{key} is {x}; it must be 1 ({one}) to {max}"
                ))),
            },
        };
        let virtual_stages = count(
            named,
            "virtual_stages",
            crate::settings::MAX_VIRTUAL_STAGES,
            "no interleaving",
        )?;
        let run_ahead = count(
            v.get("run_ahead").filter(|_| !planner),
            "run_ahead",
            crate::schedule::MAX_RUN_AHEAD as u64,
            "the schedule as published",
        )?;
        // The restated fields it reads must be what they say (a negative
        // sequence length read as "unknown" hid an edit).
        if planner {
            if let Some(x) = v
                .get("seq_len")
                .filter(|x| x.as_u64().is_none_or(|l| l == 0))
            {
                return Err(plan_err(format!(
                    "seq_len is {x}, not a positive integer (the sequence length it was planned \
                     for)"
                )));
            }
            if let Some(x) = v.get("model").filter(|x| !x.is_string()) {
                return Err(plan_err(format!(
                    "model is {x}, not the name of the model it was planned for"
                )));
            }
        } else if let Some(x) = v.get("predicted_step_seconds")
            && !x.as_f64().is_some_and(|p| (1e-9..=1e9).contains(&p))
        {
            return Err(plan_err(format!(
                "predicted_step_seconds is {x}; it must be a number of seconds from 1e-9 to 1e9 \
                 (as polychip train reads it)"
            )));
        }
        let made_for = match (
            v.get("model").and_then(Value::as_str),
            v.get("seq_len").and_then(Value::as_u64),
        ) {
            (Some(m), Some(l)) if planner => Some((m.to_string(), l)),
            _ => None,
        };
        Ok(PlanSpec {
            groups: out,
            schedule,
            virtual_stages,
            run_ahead,
            settings,
            made_for,
        })
    }

    /// Checks the plan against `model` and `cluster` and resolves its
    /// chips: layers contiguous from 0 to the model's last, each stage
    /// non-empty; tp one of the degrees, dividing the type's chips per
    /// node; at most as many chips of a type as the cluster has; sizes
    /// within the planner's bounds.
    pub(crate) fn layouts(
        &self,
        model: &ModelSpec,
        cluster: &ClusterSpec,
        virtual_stages: u64,
        context_parallel: u64,
    ) -> Result<Vec<Layout>, SpecError> {
        let mut used = vec![0u64; cluster.chip_types.len()];
        let mut sequences = 0u64;
        let mut out = Vec::with_capacity(self.groups.len());
        for (gi, g) in self.groups.iter().enumerate() {
            let at = g.label(gi);
            let bounded = |what: &str, v: u64| {
                let max = crate::settings::MAX_GLOBAL_BATCH;
                if v == 0 || v > max {
                    Err(plan_err(format!(
                        "{at}: {what} is {v}; it must be 1 to {max}"
                    )))
                } else {
                    Ok(v)
                }
            };
            bounded("copies", g.copies)?;
            bounded("micro_batch_size", g.micro_batch_size)?;
            bounded("micro_batches", g.micro_batches)?;
            sequences = g
                .copies
                .checked_mul(g.micro_batch_size)
                .and_then(|x| x.checked_mul(g.micro_batches))
                .and_then(|x| x.checked_add(sequences))
                .filter(|&x| x <= crate::settings::MAX_GLOBAL_BATCH)
                .ok_or_else(|| {
                    plan_err(format!(
                        "its groups take more than {} sequences per step",
                        crate::settings::MAX_GLOBAL_BATCH
                    ))
                })?;
            let mut next = 0u64;
            let mut stages: Vec<LayoutStage> = Vec::with_capacity(g.stages.len());
            let devices = (g.stages.len() / virtual_stages.max(1) as usize).max(1);
            for (si, s) in g.stages.iter().enumerate() {
                let at = format!("stage {si} of {}", g.label(gi));
                let ty = cluster
                    .resolve_chip(&s.chip)
                    .map_err(|m| plan_err(format!("{at}: chip {m}")))?;
                let c = &cluster.chip_types[ty];
                // Any degree a node holds whole (the search itself tries
                // 1, 2, 4 and 8; a measured run may use 16 on a node of 16,
                // or 3 on a node of 6).
                if s.tp == 0 || c.chips_per_node % s.tp != 0 {
                    return Err(plan_err(format!(
                        "{at}: tp {} does not divide {:?}'s {} chips per node (a \
                         tensor-parallel group lies inside one node)",
                        s.tp, c.name, c.chips_per_node
                    )));
                }
                if let Some(why) = model.tp_refusal(s.tp) {
                    return Err(plan_err(format!("{at}: {why}")));
                }
                let [first, end] = s.layers;
                // A stage of no layer is scored (as frameworks' plans can
                // give one, e.g. a transpose alone) and reported as one that
                // cannot run ([`Evaluation::cannot_run`]), unless it is the
                // first stage holding the embedding alone or the last the
                // head alone, as a trainer plan may.
                if first != next || end < first || end > model.layers {
                    return Err(plan_err(format!(
                        "{at}: layers [{first}, {end}) do not continue the pipeline at layer \
                         {next} within the model's {n} layers",
                        n = model.layers
                    )));
                }
                next = end;
                // Under interleaving a device's chips hold its every chunk.
                if si < devices {
                    let chips = g.copies.saturating_mul(s.tp);
                    used[ty] = used[ty].saturating_add(chips.saturating_mul(context_parallel));
                } else if let Some(d) = stages.get(si % devices)
                    && (d.ty, d.tp) != (ty, s.tp)
                {
                    return Err(plan_err(format!(
                        "{at} is chunk {} of device {} of the interleaved pipeline (its stages \
                         are {} chunks per device, in model order), but is on {:?} with tp {} \
                         where the device's first chunk (stage {}) is on {:?} with tp {}",
                        si / devices,
                        si % devices,
                        virtual_stages,
                        c.name,
                        s.tp,
                        si % devices,
                        cluster.chip_types[d.ty].name,
                        d.tp
                    )));
                }
                stages.push(LayoutStage {
                    ty,
                    tp: s.tp,
                    layers: end - first,
                });
            }
            if next != model.layers {
                return Err(plan_err(format!(
                    "{at} ends at layer {next}, but the model {:?} has {} layers",
                    model.name, model.layers
                )));
            }
            crate::sim::check_interleaving(
                stages.len(),
                virtual_stages as usize,
                crate::schedule::PipelineSchedule::OneFOneB,
                g.micro_batches as usize,
            )
            .map_err(|why| plan_err(format!("{at}: {why}")))?;
            out.push(Layout {
                copies: g.copies,
                micro_batch_size: g.micro_batch_size,
                micro_batches: g.micro_batches,
                stages,
            });
        }
        let simulated = simulated_pairs(out.iter().map(|g| (g.stages.len(), g.micro_batches)));
        if simulated > MAX_SIMULATED {
            return Err(plan_err(format!(
                "has {simulated} stage-micro-batch pairs to simulate (stages times \
                 micro-batches over its groups), more than the {MAX_SIMULATED} the planner runs"
            )));
        }
        for (ty, &n) in used.iter().enumerate() {
            let c = &cluster.chip_types[ty];
            if n > c.count {
                let cp = match context_parallel {
                    1 => String::new(),
                    cp => format!(" (context parallel {cp}: each replica's tp chips {cp} times)"),
                };
                return Err(plan_err(format!(
                    "uses {n} chips of type {:?}{cp}, but the cluster has {}",
                    c.name, c.count
                )));
            }
        }
        Ok(out)
    }
}

/// The keys of `polychip plan --json`'s report (and of `--evaluate
/// --json`'s) around its `plan` object.
const REPORT_KEYS: &[&str] = &[
    "plan",
    "alone",
    "candidates",
    "exhaustive",
    "hetero_speedup_ratio",
    "search_seconds",
    "time_limited",
    "settings",
    "bottleneck",
    "cannot_run",
    "fits",
    "group_labels",
    "measured_chips",
    "overflows",
    "polychip_count_chips",
];
/// The keys of the planner's `plan` object.
const PLAN_KEYS: &[&str] = &[
    "replicas",
    "model",
    "kind",
    "dp",
    "seq_len",
    "global_batch",
    "chips_used",
    "bubble_fraction",
    "mfu",
    "step_time_analytic",
    "step_time_simulated",
    "tokens_per_s",
    "tokens_per_s_simulated",
];
/// The keys of the planner's replicas and their stages (read: the
/// structure; the others are its predictions, ignored).
const PLANNER_GROUP_KEYS: &[&str] = &[
    "copies",
    "micro_batch_size",
    "micro_batches",
    "sequences",
    "stages",
    "pipeline",
    "virtual_stages",
    "bubble_fraction",
    "step_time_analytic",
    "step_time_simulated",
];
const PLANNER_STAGE_KEYS: &[&str] = &[
    "chip",
    "tp",
    "first_layer",
    "end_layer",
    "memory",
    "memory_capacity",
    "mfu",
    "timing",
];
/// The keys of a `polychip train --save-plan` plan and of one written by
/// hand, at the top, per group and per stage.
const TRAIN_PLAN_KEYS: &[&str] = &[
    "group",
    "groups",
    "schedule",
    "virtual_stages",
    "run_ahead",
    "predicted_step_seconds",
    "core_order",
];
const GROUP_KEYS: &[&str] = &[
    "copies",
    "dp",
    "micro_batch_size",
    "micro_batches",
    "sequences",
    "stages",
];
const STAGE_KEYS: &[&str] = &[
    "chip",
    "device",
    "tp",
    "layers",
    "optimizer_weight",
    "predicted_passes",
];

/// Refuses a key of the object `v` that is not in `known` (a misspelt
/// `micro_batch_szie` or `TP` would otherwise be ignored and the plan
/// scored with the default).
fn known_keys(v: &Value, at: &str, known: &[&str]) -> Result<(), SpecError> {
    let Some(object) = v.as_object() else {
        return Ok(());
    };
    match object.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(plan_err(format!(
            "{at} has the key {}, which a plan does not have (known here: {})",
            polychip_files::printable(&format!("{k:?}")),
            known.join(", ")
        ))),
        None => Ok(()),
    }
}

/// Refuses an object that gives both of two keys that mean one thing.
fn one_of(v: &Value, at: &str, a: &str, b: &str) -> Result<(), SpecError> {
    match v.get(a).is_some() && v.get(b).is_some() {
        true => Err(plan_err(format!(
            "{at} gives both {a:?} and {b:?}, which mean the same; give one"
        ))),
        false => Ok(()),
    }
}

/// The most replicas a stage that mixes chip types may list.
const MAX_MIXED_REPLICAS: usize = MAX_GROUPS;

/// A stage's chip and tensor-parallel degree for each replica: one entry
/// for every replica (`"chip": "A"`, `"device": ...`), or a list when the
/// stage's data-parallel group mixes chip types (`"chip": ["A", "B"]`,
/// each entry a name, or `{"chip": .., "tp": .., "copies": ..}` standing
/// for `copies` replicas; `tp` one number or a list as long as the
/// entries), naming every replica of the group.
fn stage_chips(s: &Value, at: &str, copies: u64) -> Result<Vec<(String, u64)>, SpecError> {
    one_of(s, at, "chip", "device")?;
    let tp = s.get("tp");
    let chip = match (s.get("chip"), s.get("device")) {
        (Some(c), _) | (None, Some(c)) => c,
        _ => {
            return Err(plan_err(format!(
                "{at} names no chip (a \"chip\" or \"device\" string, or a list of one \
                 per replica)"
            )));
        }
    };
    let one = |c: &Value, tp: Option<&Value>, at: &str| -> Result<(String, u64), SpecError> {
        let (name, tp) = match c {
            Value::String(n) => (n.clone(), tp),
            Value::Object(_) => {
                known_keys(c, at, &["chip", "device", "tp", "copies"])?;
                one_of(c, at, "chip", "device")?;
                let n = match (c.get("chip"), c.get("device")) {
                    (Some(Value::String(n)), _) | (None, Some(Value::String(n))) => n.clone(),
                    _ => return Err(plan_err(format!("{at} names no chip"))),
                };
                (n, c.get("tp").or(tp))
            }
            other => {
                return Err(plan_err(format!(
                    "{at}: chip {other} is not a chip type, device or vendor name"
                )));
            }
        };
        if name.contains('+') {
            return Err(plan_err(format!(
                "{at}: chip {name:?} joins chip types with '+'; a stage whose replicas are of \
                 several types lists one chip per replica, e.g. \"chip\": [\"A\", \"B\"] \
                 for copies = 2"
            )));
        }
        let tp = match tp {
            None => 1,
            Some(Value::Null) => {
                return Err(plan_err(format!(
                    "{at}: tp is null; give a number, or leave it out for 1"
                )));
            }
            Some(t) => t
                .as_u64()
                .ok_or_else(|| plan_err(format!("{at}: tp is {t}, not a non-negative integer")))?,
        };
        Ok((name, tp))
    };
    let Value::Array(list) = chip else {
        if matches!(tp, Some(Value::Array(_))) {
            return Err(plan_err(format!(
                "{at} gives a list of tp degrees but one chip; list one chip per replica too"
            )));
        }
        return Ok(vec![one(chip, tp, at)?]);
    };
    if list.is_empty() || list.len() > MAX_MIXED_REPLICAS {
        return Err(plan_err(format!(
            "{at} lists {} chips; a stage that mixes chip types names the chip of every \
             replica (1 to {MAX_MIXED_REPLICAS} entries)",
            list.len()
        )));
    }
    let tps: Vec<Option<&Value>> = match tp {
        Some(Value::Array(t)) if t.len() == list.len() => t.iter().map(Some).collect(),
        Some(Value::Array(t)) => {
            return Err(plan_err(format!(
                "{at} lists {} tp degrees for {} chips",
                t.len(),
                list.len()
            )));
        }
        t => vec![t; list.len()],
    };
    // Each entry is one replica, or `copies` of them (`{"chip": "A",
    // "copies": 2}`).
    let mut out = Vec::new();
    for (j, (c, tp)) in list.iter().zip(tps).enumerate() {
        let at = format!("{at}, entry {j}");
        let n = match c.get("copies") {
            None => 1,
            Some(v) => v
                .as_u64()
                .filter(|n| (1..=MAX_MIXED_REPLICAS as u64).contains(n))
                .ok_or_else(|| {
                    plan_err(format!(
                        "{at}: copies is {v}; it must be 1 to {MAX_MIXED_REPLICAS}"
                    ))
                })? as usize,
        };
        let e = one(c, tp, &at)?;
        if out.len() + n > MAX_MIXED_REPLICAS {
            return Err(plan_err(format!(
                "{at}: the stage names more than {MAX_MIXED_REPLICAS} replicas"
            )));
        }
        out.extend(std::iter::repeat_n(e, n));
    }
    if out.len() as u64 != copies {
        return Err(plan_err(format!(
            "{at} names {} replicas in its list of chips, but its group has {copies} \
             (copies); a stage that mixes chip types names the chip of every replica",
            out.len()
        )));
    }
    Ok(out)
}

/// The stage that bounds the step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bottleneck {
    /// Its group.
    pub group: usize,
    /// Its index in the pipeline (under interleaving, its device's, which
    /// is that of the device's first chunk).
    pub stage: usize,
    /// Its chip type.
    pub chip: String,
    /// Forward plus backward of one micro-batch, seconds (under
    /// interleaving, of all its device's chunks).
    pub seconds_per_micro_batch: f64,
}

/// A stage that does not fit its chips.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Overflow {
    /// Its group.
    pub group: usize,
    /// Its index in the pipeline.
    pub stage: usize,
    /// Its chip type.
    pub chip: String,
    /// Bytes needed beyond the capacity.
    pub short_bytes: f64,
}

/// A scored plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// The plan with every stage's memory terms and timings.
    pub plan: Plan,
    /// Whether the plan can run: every stage fits its chips
    /// (`overflows` is empty) and has something to train (`cannot_run` is
    /// empty).
    pub fits: bool,
    /// The stages that do not fit.
    pub overflows: Vec<Overflow>,
    /// Why the plan cannot run although its memory fits: each stage that
    /// holds no layer, neither the embedding nor the head (an optimizer over
    /// no parameters, which every framework refuses).
    #[serde(default)]
    pub cannot_run: Vec<String>,
    /// The slowest stage of the slowest group.
    pub bottleneck: Bottleneck,
    /// Chip types priced from a profile's measurements.
    pub measured_chips: Vec<String>,
    /// Chip types whose memory is counted as `polychip train` allocates it
    /// (`framework = "polychip"`); the others by Megatron's count.
    #[serde(default)]
    pub polychip_count_chips: Vec<String>,
    /// How the plan file names each of `plan.replicas`: `group 1`, or
    /// `group 0 (replicas 0, 2)` for the replicas of a group with a stage
    /// that mixes chip types.
    pub group_labels: Vec<String>,
}

impl Evaluation {
    /// The most memory any stage's chip is predicted to hold, bytes.
    pub fn peak_memory_bytes(&self) -> f64 {
        self.plan
            .replicas
            .iter()
            .flat_map(|r| &r.stages)
            .map(|s| s.memory.total)
            .fold(0.0, f64::max)
    }
}

/// Scores `spec` on `cluster` (with any profile already applied) for
/// `model`; `settings`' global batch is replaced by the plan's.
pub fn evaluate(
    spec: &PlanSpec,
    model: &ModelSpec,
    cluster: &ClusterSpec,
    settings: &TrainingSettings,
) -> Result<Evaluation, SpecError> {
    model.validate()?;
    cluster.validate()?;
    let mut settings = settings.clone();
    if let Some(schedule) = spec.schedule {
        settings.schedule = schedule;
    }
    if let Some(v) = spec.virtual_stages {
        settings.virtual_stages = v;
    }
    if let Some(r) = spec.run_ahead {
        settings.run_ahead = r;
    }
    settings.check_interleaving()?;
    settings.check_zero()?;
    settings.check_recompute()?;
    settings.check_context_parallel()?;
    settings.check_expert_parallel()?;
    settings.check_fp8()?;
    crate::cost::check_cluster_settings(model, cluster, &settings)?;
    let layouts = spec.layouts(
        model,
        cluster,
        settings.virtual_stages,
        settings.context_parallel,
    )?;
    // Every replica of every group reduces its gradients together: the
    // expert-parallel groups divide them (times the context-parallel
    // groups and each stage's `tp` over the expert tensor-parallel degree,
    // as Megatron-LM folds them).
    let replicas = layouts
        .iter()
        .map(|g| g.copies)
        .fold(0u64, u64::saturating_add)
        .saturating_mul(settings.context_parallel.max(1));
    for stage in layouts.iter().flat_map(|g| &g.stages) {
        if let Some(why) = crate::cost::experts_unfolded(model, &settings, stage.tp, replicas) {
            return Err(SpecError::Settings(why));
        }
    }
    settings.global_batch = layouts
        .iter()
        .map(|g| g.copies * g.micro_batch_size * g.micro_batches)
        .sum();
    let kind = if layouts.len() == 1 {
        PlanKind::HeteroPp
    } else {
        PlanKind::MixedReplicas
    };
    let plan = assemble(model, cluster, &settings, &layouts, kind);
    let group = plan.slowest_group();
    let r = &plan.replicas[group];
    // Per device: under interleaving the sum of its chunks.
    let devices = r.devices();
    let mut per_device = vec![0.0f64; devices];
    for (k, s) in r.stages.iter().enumerate() {
        per_device[k % devices] += s.timing.forward + s.timing.backward;
    }
    let (stage, &seconds) = per_device
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .expect("a pipeline has stages");
    let bottleneck = Bottleneck {
        group,
        stage,
        chip: r.stages[stage].chip.clone(),
        seconds_per_micro_batch: seconds,
    };
    let mut overflows = Vec::new();
    for (g, r) in plan.replicas.iter().enumerate() {
        // A device's chunks all show its memory: each device once.
        for (i, s) in r.stages.iter().enumerate().take(r.devices()) {
            let cap = s.memory_capacity as f64;
            if s.memory.total > cap {
                overflows.push(Overflow {
                    group: g,
                    stage: i,
                    chip: s.chip.clone(),
                    short_bytes: s.memory.total - cap,
                });
            }
        }
    }
    let names = |keep: &dyn Fn(&crate::cluster::ChipType) -> bool| -> Vec<String> {
        cluster
            .chip_types
            .iter()
            .filter(|c| keep(c))
            .map(|c| c.name.clone())
            .collect()
    };
    let measured_chips = names(&|c| !c.measured.is_empty());
    let polychip_count_chips = names(&|c| c.framework == crate::framework::Framework::Polychip);
    let group_labels: Vec<String> = spec
        .groups
        .iter()
        .enumerate()
        .map(|(i, g)| g.label(i))
        .collect();
    let mut cannot_run = Vec::new();
    for (g, r) in plan.replicas.iter().enumerate() {
        let n = r.stages.len();
        for (i, s) in r.stages.iter().enumerate() {
            if s.first_layer == s.end_layer
                && !crate::plan::holds_one_end_alone(i, n, s.first_layer, model.layers)
            {
                cannot_run.push(format!(
                    "stage {i} of {} holds no layer, neither the embedding nor the head: a \
                     pipeline stage with no parameters cannot train (frameworks refuse an \
                     optimizer over no parameters); give it a layer or drop it",
                    group_labels.get(g).map_or("the plan", String::as_str)
                ));
            }
        }
    }
    Ok(Evaluation {
        group_labels,
        fits: overflows.is_empty() && cannot_run.is_empty(),
        overflows,
        cannot_run,
        bottleneck,
        plan,
        measured_chips,
        polychip_count_chips,
    })
}

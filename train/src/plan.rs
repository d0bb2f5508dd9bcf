//! The layout a training job runs: groups of identical pipelines
//! (data-parallel replicas), each pipeline a list of stages (a device and a
//! block range), and its micro-batching. Ranks are numbered group by group,
//! replica by replica, stage by stage. Read from TOML/JSON, built from the
//! planner's answer, or written on the command line (`--stages`).

use std::path::Path;

use serde::{Deserialize, Serialize};

use polychip_comm::env::MAX_WORLD_SIZE;
use polychip_files::{MAX_TEXT_FILE, read_text_file};
use polychip_planner::plan::holds_one_end_alone;
use polychip_planner::schedule::{MAX_RUN_AHEAD, PipelineSchedule};

use crate::config::{MAX_GLOBAL_BATCH, ModelConfig};
use crate::error::{Result, TrainError};
use crate::params::{Cut, StageRange};

/// The largest `optimizer_weight` a plan may give: weights are relative,
/// and their sum must stay finite.
pub const MAX_OPTIMIZER_WEIGHT: f64 = 1e12;

/// The most characters a plan's device name (a stage's `device`, an entry
/// of `core_order`) may have: `vendor:index` or a device kind as
/// `polychip devices` names it are a few dozen.
pub const MAX_DEVICE_NAME: usize = 128;

/// The longest `predicted_step_seconds` a plan may give, 1e9 s (about 32
/// years).
pub const MAX_PREDICTED_STEP_SECONDS: f64 = 1e9;

/// The shortest `predicted_step_seconds` a plan may give, 1 ns (no step
/// is shorter; a subnormal one made the measured step's excess over it a
/// 300-digit percentage).
pub const MIN_PREDICTED_STEP_SECONDS: f64 = 1e-9;

/// One pipeline stage: which device runs which blocks (or half blocks).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StagePlan {
    /// `vendor` (the next unused device of that vendor) or `vendor:index`.
    pub device: String,
    /// Blocks `[first, end)`; either may fall halfway through a block
    /// (`3.5`: between block 3's attention and feed-forward halves).
    pub layers: [Cut; 2],
    /// Shard the optimizer step: this stage's device updates a share of
    /// the parameters it holds with the other replicas' devices in
    /// proportion to this weight (its optimizer speed), and the updated
    /// weights are gathered. Given on every stage of a plan or on none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_weight: Option<f64>,
    /// The planner's forward and backward seconds of one micro-batch
    /// through this stage (plans from `--plan auto`): `polychip train`
    /// prints them beside the measured ones, so a stage the profile
    /// misjudged shows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_passes: Option<[f64; 2]>,
}

/// `copies` identical pipelines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupPlan {
    /// Identical replicas of this pipeline.
    #[serde(default = "one")]
    pub copies: usize,
    /// Sequences per micro-batch.
    pub micro_batch_size: usize,
    /// Micro-batches per step per replica.
    pub micro_batches: usize,
    /// Sequences per step per replica when its last micro-batch is smaller
    /// than the others (the batch dealt to replicas in sequences, not whole
    /// micro-batches): more than `(micro_batches - 1) * micro_batch_size`
    /// and at most `micro_batches * micro_batch_size`, the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequences: Option<usize>,
    /// Its stages, first to last.
    pub stages: Vec<StagePlan>,
}

impl GroupPlan {
    /// Sequences per step per replica: `sequences`, or micro-batches times
    /// their size (`None` when that overflows).
    pub fn checked_sequences(&self) -> Option<usize> {
        match self.sequences {
            Some(s) => Some(s),
            None => self.micro_batch_size.checked_mul(self.micro_batches),
        }
    }
}

fn one() -> usize {
    1
}

/// A whole training layout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainPlan {
    /// Groups of replicas.
    #[serde(rename = "group")]
    pub groups: Vec<GroupPlan>,
    /// The planner's predicted step time, seconds (plans from `--plan auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_step_seconds: Option<f64>,
    /// The pipelines' schedule (`"1f1b"`, `"1f1b-deferred"`, `"zero-bubble"`
    /// or `"gpipe"`): the one the
    /// prediction is for (`--plan auto` chooses it); `polychip train
    /// --schedule` overrides it, and without either pipelines run 1F1B.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<PipelineSchedule>,
    /// How far each pipeline stage runs ahead of the next, as a multiple
    /// of the schedule's lead: 1 (the schedule as published) to
    /// [`MAX_RUN_AHEAD`] (`--plan auto` gives
    /// [`polychip_planner::schedule::AUTO_RUN_AHEAD`] where the stages'
    /// memory allows; `polychip train --run-ahead` overrides it); without
    /// it, 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_ahead: Option<usize>,
    /// The devices in the order whose positions give their ranks' cores on
    /// one machine (position `i` of `n` takes `pin::share(cores, i, n)`),
    /// as `--plan auto` profiled them there: a pipeline's stage order then
    /// does not move a device to another core, or beside another device,
    /// than it was profiled on. Without it, rank `r` takes rank `r`'s
    /// share. Each device of the plan must appear once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub core_order: Option<Vec<String>>,
    /// The model name and sequence length a planner plan (`polychip plan
    /// --json`) was made for: [`Self::validate`] refuses another model.
    /// Not written or read in plan files of this struct's own format.
    #[serde(skip)]
    pub planned_for: Option<(String, usize)>,
}

/// What one rank does.
#[derive(Debug, Clone, PartialEq)]
pub struct Role {
    /// The rank.
    pub rank: usize,
    /// Its group.
    pub group: usize,
    /// Its replica, counted over all groups.
    pub replica: usize,
    /// Its stage in the pipeline.
    pub stage: usize,
    /// Stages of its pipeline.
    pub stages: usize,
    /// Its device, `vendor:index`.
    pub device: String,
    /// Its blocks.
    pub range: StageRange,
    /// Sequences per micro-batch.
    pub micro_batch_size: usize,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// Sequences per step of its replica: `micro_batches` of
    /// `micro_batch_size`, the last perhaps smaller.
    pub sequences: usize,
    /// The first sequence of the global batch its replica takes.
    pub first_sequence: usize,
    /// The rank of the previous stage of its pipeline.
    pub prev: Option<usize>,
    /// The rank of the next stage of its pipeline.
    pub next: Option<usize>,
    /// Its weight in a sharded optimizer step (see
    /// [`StagePlan::optimizer_weight`]).
    pub optimizer_weight: Option<f64>,
}

impl Role {
    /// Sequences in micro-batch `i` (0-based) of the step: the micro-batch
    /// size, but for a smaller last one.
    pub fn micro_batch(&self, i: usize) -> usize {
        self.micro_batch_size
            .min(self.sequences.saturating_sub(i * self.micro_batch_size))
    }
}

impl TrainPlan {
    /// The whole model on one device, `micro_batches` micro-batches of `mbs`.
    pub fn single(device: &str, layers: usize, mbs: usize, micro_batches: usize) -> TrainPlan {
        TrainPlan {
            groups: vec![GroupPlan {
                copies: 1,
                micro_batch_size: mbs,
                micro_batches,
                sequences: None,
                stages: vec![StagePlan {
                    device: device.to_string(),
                    layers: [Cut::at(0), Cut::block(layers)],
                    optimizer_weight: None,
                    predicted_passes: None,
                }],
            }],
            predicted_step_seconds: None,
            schedule: None,
            run_ahead: None,
            core_order: None,
            planned_for: None,
        }
    }

    /// Parses `--stages "ferrite:0=0..3,cobalt:0=3..4"` (one pipeline) with
    /// `copies` replicas; a bound may fall halfway through a block
    /// (`ferrite:0=0..3.5,cobalt:0=3.5..4`).
    pub fn parse_stages(
        spec: &str,
        copies: usize,
        mbs: usize,
        micro_batches: usize,
    ) -> Result<TrainPlan> {
        let mut stages = Vec::new();
        for part in spec.split(',') {
            let part = part.trim();
            let qp = polychip_comm::text::quoted(part);
            let bad = || {
                TrainError::Config(format!(
                    "--stages entry {qp} is not DEVICE=FIRST..END (e.g. ferrite:0=0..3, \
                     ferrite:0=0..3.5 to cut halfway through block 3, ferrite:0=0..3+1 to cut \
                     its attention half after one key/value head, or ferrite:0=0..3.5+40 to \
                     cut its feed-forward half after 40 columns; heads and columns from 1)"
                ))
            };
            let (device, range) = part.split_once('=').ok_or_else(bad)?;
            if device.trim().is_empty() {
                return Err(TrainError::Config(format!(
                    "--stages entry {qp} names no device before '='; write DEVICE=FIRST..END \
                     (e.g. ferrite:0=0..3)"
                )));
            }
            let (a, b) = range.split_once("..").ok_or_else(bad)?;
            let first = Cut::parse(a).ok_or_else(bad)?;
            let end = Cut::parse(b).ok_or_else(bad)?;
            stages.push(StagePlan {
                device: device.trim().to_string(),
                layers: [first, end],
                optimizer_weight: None,
                predicted_passes: None,
            });
        }
        Ok(TrainPlan {
            groups: vec![GroupPlan {
                copies,
                micro_batch_size: mbs,
                micro_batches,
                sequences: None,
                stages,
            }],
            predicted_step_seconds: None,
            schedule: None,
            run_ahead: None,
            core_order: None,
            planned_for: None,
        })
    }

    /// Reads a plan file: TOML (`[[group]]` tables), or JSON (`.json`): this
    /// struct as `--save-plan` writes it, or the FLOP-based planner's answer
    /// as `polychip plan --json` prints it (its chip type names must then be
    /// vendor names or device names as `polychip devices` reports them, see
    /// [`TrainPlan::name_vendors`], and its tensor-parallel degrees 1).
    pub fn load(path: &Path) -> Result<TrainPlan> {
        let text = read_text_file(path, MAX_TEXT_FILE).map_err(|e| TrainError::io(path, e))?;
        let bad = |e: String| {
            TrainError::Plan(format!(
                "plan file {}: {e}",
                polychip_files::shown_path(path)
            ))
        };
        let plan = Self::parse(&text, path).map_err(bad)?;
        plan.check_names().map_err(bad)?;
        plan.check_prediction().map_err(bad)?;
        plan.check_run_ahead().map_err(bad)?;
        Ok(plan)
    }

    /// [`Self::load`]'s parsing of `text`, read from `path`.
    fn parse(text: &str, path: &Path) -> std::result::Result<TrainPlan, String> {
        // An interleaved plan (`polychip plan --evaluate` scores them) lists
        // model chunks, not stages: refused as such, not as a stray key.
        let interleaved = |v: Option<u64>| match v {
            Some(v) if v > 1 => Err(interleaving_refused(v)),
            _ => Ok(()),
        };
        if path.extension().is_none_or(|e| e != "json") {
            if let Ok(v) = toml::from_str::<toml::Table>(text) {
                interleaved(
                    v.get("virtual_stages")
                        .and_then(|x| x.as_integer())
                        .map(|x| x.max(0) as u64),
                )?;
            }
            return toml::from_str(text).map_err(|e| polychip_files::toml_error(text, &e));
        }
        let value: serde_json::Value =
            polychip_files::parse_json_value(text).map_err(|e| e.to_string())?;
        interleaved(
            value
                .get("virtual_stages")
                .and_then(serde_json::Value::as_u64),
        )?;
        let planner = match (value.get("plan"), value.get("replicas")) {
            (Some(p), _) => Some(p.clone()),
            (None, Some(_)) => Some(value.clone()),
            (None, None) => None,
        };
        match planner {
            Some(p) => {
                let plan: polychip_planner::plan::Plan = serde_json::from_value(p.clone())
                    .map_err(|e| {
                        let at = culprit::<polychip_planner::plan::Plan>(&p)
                            .map(|k| format!(" at {k}"))
                            .unwrap_or_default();
                        format!("a planner plan{at}: {e}")
                    })?;
                from_planner(&plan).map_err(|e| e.to_string())
            }
            None => serde_json::from_value(value.clone()).map_err(|e| match locate(&value) {
                Some(at) => format!("at {at}: {e}"),
                None => e.to_string(),
            }),
        }
    }

    /// Refuses a device name (a stage's, or in `core_order`) of more than
    /// [`MAX_DEVICE_NAME`] characters, and a `core_order` of more devices
    /// than a job has ranks, before any message quotes them (a
    /// 100,000-character device name was echoed whole into the refusals).
    fn check_names(&self) -> std::result::Result<(), String> {
        for (gi, g) in self.groups.iter().enumerate() {
            for (si, s) in g.stages.iter().enumerate() {
                if s.device.chars().count() > MAX_DEVICE_NAME {
                    return Err(format!(
                        "group {gi} stage {si} names device {}, longer than the \
                         {MAX_DEVICE_NAME} characters a device name may have",
                        shown(&s.device)
                    ));
                }
            }
        }
        if let Some(order) = &self.core_order {
            if order.len() > MAX_WORLD_SIZE {
                return Err(format!(
                    "core_order lists {} devices, more than the {MAX_WORLD_SIZE} ranks a job \
                     may have",
                    order.len()
                ));
            }
            if let Some(d) = order.iter().find(|d| d.chars().count() > MAX_DEVICE_NAME) {
                return Err(format!(
                    "core_order names device {}, longer than the {MAX_DEVICE_NAME} characters \
                     a device name may have",
                    shown(d)
                ));
            }
        }
        Ok(())
    }

    /// Refuses a `run_ahead` outside 1 to [`MAX_RUN_AHEAD`].
    fn check_run_ahead(&self) -> std::result::Result<(), String> {
        match self.run_ahead {
            Some(r) if !(1..=MAX_RUN_AHEAD).contains(&r) => Err(format!(
                "run_ahead is {r}; it must be a whole number from 1 (the schedule as published) \
                 to {MAX_RUN_AHEAD}"
            )),
            _ => Ok(()),
        }
    }

    /// Refuses a `predicted_step_seconds` that is not a number of seconds
    /// from [`MIN_PREDICTED_STEP_SECONDS`] to [`MAX_PREDICTED_STEP_SECONDS`].
    fn check_prediction(&self) -> std::result::Result<(), String> {
        match self.predicted_step_seconds {
            Some(p) if !(MIN_PREDICTED_STEP_SECONDS..=MAX_PREDICTED_STEP_SECONDS).contains(&p) => {
                Err(format!(
                    "predicted_step_seconds is {}; it must be a number of seconds from \
                     {MIN_PREDICTED_STEP_SECONDS:e} to {MAX_PREDICTED_STEP_SECONDS:e}",
                    polychip_planner::cluster::fmt_num(p)
                ))
            }
            _ => Ok(()),
        }
    }

    /// Ranks the plan needs (saturating; [`Self::validate`] bounds it by
    /// [`polychip_comm::env::MAX_WORLD_SIZE`]).
    pub fn world_size(&self) -> usize {
        self.groups
            .iter()
            .map(|g| g.copies.saturating_mul(g.stages.len()))
            .fold(0, usize::saturating_add)
    }

    /// Every stage of every group (once per group, not per copy).
    pub fn stages(&self) -> impl Iterator<Item = &StagePlan> {
        self.groups.iter().flat_map(|g| &g.stages)
    }

    /// Whether the optimizer step is sharded over the replicas.
    pub fn shards_optimizer(&self) -> bool {
        self.stages().any(|s| s.optimizer_weight.is_some())
    }

    /// Shards the optimizer step with each stage's weight its replica's
    /// share of the global batch (its micro-batch size times count): the
    /// planner dealt the batch by speed. Weights already given are kept.
    pub fn shard_optimizer_by_batch(&mut self) {
        for g in &mut self.groups {
            let share = g.checked_sequences().unwrap_or(usize::MAX) as f64;
            for s in &mut g.stages {
                s.optimizer_weight.get_or_insert(share);
            }
        }
    }

    /// Steps every parameter on every replica: drops the stages' optimizer
    /// weights.
    pub fn unshard_optimizer(&mut self) {
        for g in &mut self.groups {
            for s in &mut g.stages {
                s.optimizer_weight = None;
            }
        }
    }

    /// Replicas over all groups (saturating).
    pub fn replicas(&self) -> usize {
        self.groups
            .iter()
            .map(|g| g.copies)
            .fold(0, usize::saturating_add)
    }

    /// Sequences per step: `None` when the sum overflows.
    pub fn checked_global_batch(&self) -> Option<usize> {
        self.groups.iter().try_fold(0usize, |acc, g| {
            g.copies
                .checked_mul(g.checked_sequences()?)?
                .checked_add(acc)
        })
    }

    /// Sequences per step (saturating; see [`Self::checked_global_batch`]).
    pub fn global_batch(&self) -> usize {
        self.checked_global_batch().unwrap_or(usize::MAX)
    }

    /// Checks the plan against the model and the global batch; messages
    /// name the group and stage.
    pub fn validate(&self, cfg: &ModelConfig, global_batch: usize) -> Result<()> {
        let bad = |m: String| Err(TrainError::Plan(m));
        if self.groups.is_empty() {
            return bad("it has no groups".into());
        }
        self.check_names().map_err(TrainError::Plan)?;
        if let Some((model, seq_len)) = &self.planned_for
            && (!model.trim().eq_ignore_ascii_case(cfg.name.trim()) || *seq_len != cfg.seq_len)
        {
            return bad(format!(
                "it was planned for model {} with sequences of {seq_len} tokens, and this run \
                 trains {:?} with sequences of {}; plan for this model (polychip plan --model \
                 {:?}) or train the model planned for",
                shown(model),
                cfg.name,
                cfg.seq_len,
                cfg.name
            ));
        }
        self.check_prediction().map_err(TrainError::Plan)?;
        self.check_run_ahead().map_err(TrainError::Plan)?;
        for (gi, g) in self.groups.iter().enumerate() {
            if g.copies == 0 || g.micro_batch_size == 0 || g.micro_batches == 0 {
                return bad(format!(
                    "group {gi}: copies ({}), micro_batch_size ({}) and micro_batches ({}) must be positive",
                    g.copies, g.micro_batch_size, g.micro_batches
                ));
            }
            for (field, v, limit) in [
                ("copies", g.copies, MAX_WORLD_SIZE),
                ("micro_batch_size", g.micro_batch_size, MAX_GLOBAL_BATCH),
                ("micro_batches", g.micro_batches, MAX_GLOBAL_BATCH),
            ] {
                if v > limit {
                    return bad(format!(
                        "group {gi}: {field} is {v}, more than the {limit} accepted"
                    ));
                }
            }
            if let Some(seqs) = g.sequences {
                // Within the bounds checked above, the products fit.
                let (b, m) = (g.micro_batch_size, g.micro_batches);
                if seqs <= (m - 1) * b || seqs > m * b {
                    return bad(format!(
                        "group {gi}: sequences is {seqs}, but {m} micro-batches of {b} hold \
                         {} to {} sequences (only the last micro-batch may be smaller)",
                        (m - 1) * b + 1,
                        m * b
                    ));
                }
            }
            if g.stages.is_empty() {
                return bad(format!("group {gi} has no stages"));
            }
            let mut next = Cut::at(0);
            let last = Cut::block(cfg.layers);
            for (si, s) in g.stages.iter().enumerate() {
                // An empty name (or an empty vendor before the index) named
                // the device ":0", which no machine has.
                if s.device
                    .trim()
                    .split(':')
                    .next()
                    .is_none_or(|v| v.trim().is_empty())
                {
                    return bad(format!(
                        "group {gi} stage {si} names device {}, which has no vendor: name a \
                         device (ferrite:0), a vendor (ferrite) or a device kind (\"Ferrite F1\")",
                        shown(&s.device)
                    ));
                }
                let [a, b] = s.layers;
                // A stage of no blocks holds an end of the model alone: the
                // embedding (the first stage, 0..0) or the head (the last,
                // L..L), beside at least one other stage.
                let end_alone = a == b
                    && holds_one_end_alone(si, g.stages.len(), a.half as u64, last.half as u64);
                if a != next || (b <= a && !end_alone) || b > last {
                    return bad(format!(
                        "group {gi} stage {si} ({}) holds blocks {a}..{b}, but it must start at \
                         block {next}, end by block {last} and hold a part of the model \
                         (only a pipeline's first stage may hold the embedding alone, 0..0, \
                         and only its last the head alone, {last}..{last})",
                        s.device
                    ));
                }
                let width = |c: Cut| crate::params::half_width(cfg, c.half);
                if let Some(c) = [a, b].into_iter().find(|&c| c.cols >= width(c).max(1)) {
                    let (what, unit) = match c.half % 2 {
                        0 => ("attention half", "key/value heads"),
                        _ => ("feed-forward half", "feed-forward columns"),
                    };
                    return bad(format!(
                        "group {gi} stage {si} ({}) is cut at {c}, {} {unit} into block {}'s \
                         {what}, but the model {} has {} {unit}",
                        s.device,
                        c.cols,
                        c.half / 2,
                        cfg.name,
                        width(c)
                    ));
                }
                if b.is_inside() && self.groups.len() > 1 {
                    return bad(format!(
                        "group {gi} stage {si} ({}) ends at {b}, inside a half block; \
                         a cut by width is supported in a plan of one group (replicas split \
                         alike), and this one has {} groups",
                        s.device,
                        self.groups.len()
                    ));
                }
                next = b;
                if let Some(p) = s.predicted_passes
                    && !p
                        .iter()
                        .all(|x| x.is_finite() && (0.0..=MAX_PREDICTED_STEP_SECONDS).contains(x))
                {
                    return bad(format!(
                        "group {gi} stage {si} ({}): predicted_passes is [{}, {}]; they must be \
                         seconds, from 0 to {MAX_PREDICTED_STEP_SECONDS:e}",
                        s.device,
                        polychip_planner::cluster::fmt_num(p[0]),
                        polychip_planner::cluster::fmt_num(p[1])
                    ));
                }
                if let Some(w) = s.optimizer_weight
                    && !(w > 0.0 && w <= MAX_OPTIMIZER_WEIGHT)
                {
                    return bad(format!(
                        "group {gi} stage {si} ({}): optimizer_weight is {}; it must be a \
                         positive number of at most {MAX_OPTIMIZER_WEIGHT:e} (weights are \
                         relative)",
                        s.device,
                        polychip_planner::cluster::fmt_num(w)
                    ));
                }
            }
            if next != last {
                return bad(format!(
                    "group {gi}'s stages end at block {next}, but the model {} has {} blocks",
                    cfg.name, cfg.layers
                ));
            }
        }
        let weighted = self
            .stages()
            .filter(|s| s.optimizer_weight.is_some())
            .count();
        if weighted != 0 && weighted != self.stages().count() {
            return bad(format!(
                "{weighted} of its {} stages give an optimizer_weight; a sharded optimizer \
                 step needs one on every stage (or none on any)",
                self.stages().count()
            ));
        }
        let ranks = self.groups.iter().try_fold(0usize, |acc, g| {
            g.copies.checked_mul(g.stages.len())?.checked_add(acc)
        });
        if ranks.is_none_or(|r| r > MAX_WORLD_SIZE) {
            return bad(format!(
                "it needs {} ranks (copies x stages over its groups), more than the \
                 {MAX_WORLD_SIZE} a job may have",
                ranks.map_or("more than 2^64".to_string(), |r| r.to_string())
            ));
        }
        if let Some(order) = &self.core_order {
            let mut want: Vec<String> = self.roles().into_iter().map(|r| r.device).collect();
            let mut got: Vec<String> = order.iter().map(|d| d.to_lowercase()).collect();
            want.sort();
            got.sort();
            if want != got {
                return bad(format!(
                    "core_order lists {}, but its ranks run on {}; it must name each of those \
                     devices once",
                    order.join(", "),
                    want.join(", ")
                ));
            }
        }
        if self.checked_global_batch() != Some(global_batch) {
            let parts: Vec<String> = self
                .groups
                .iter()
                .map(|g| match g.sequences {
                    Some(seqs) => format!("{} x {seqs}", g.copies),
                    None => format!(
                        "{} x {} x {}",
                        g.copies, g.micro_batch_size, g.micro_batches
                    ),
                })
                .collect();
            return bad(format!(
                "its replicas take {} sequences per step ({} as copies x micro_batch_size x \
                 micro_batches, or copies x sequences) but the global batch is {global_batch}",
                self.checked_global_batch()
                    .map_or("more than 2^64".to_string(), |b| b.to_string()),
                parts.join(" + ")
            ));
        }
        Ok(())
    }

    /// Each rank's position among the ranks sharing out the cores of one
    /// machine, and their number: its device's place in `core_order` when
    /// the plan has one that names it, else its rank among all.
    pub fn core_positions(&self) -> Vec<(usize, usize)> {
        let roles = self.roles();
        let n = roles.len();
        roles
            .iter()
            .map(|r| {
                let at = self.core_order.as_ref().and_then(|order| {
                    let at = order.iter().position(|d| d.to_lowercase() == r.device)?;
                    Some((at, order.len()))
                });
                at.unwrap_or((r.rank, n))
            })
            .collect()
    }

    /// Stages naming a device kind by the name `polychip devices` reports
    /// (`Ferrite F1`, as `polychip plan` writes the chip types of a cluster
    /// made from `polychip devices --json`) name its vendor instead,
    /// ignoring case and surrounding spaces; `kinds` are the (name,
    /// vendor) pairs of the devices present, one per device. A stage
    /// naming a device (`vendor:index`) or a vendor is left as it is; a
    /// name of a vendor whose devices here are of several names is refused
    /// (its vendor would not say which device).
    pub fn name_vendors(&mut self, kinds: &[(String, String)]) -> Result<()> {
        let same = |a: &str, b: &str| a.trim().eq_ignore_ascii_case(b.trim());
        for s in self.groups.iter_mut().flat_map(|g| g.stages.iter_mut()) {
            let want = s.device.trim();
            if want.contains(':') || kinds.iter().any(|(_, v)| same(v, want)) {
                continue;
            }
            let Some((_, vendor)) = kinds.iter().find(|(n, _)| same(n, want)) else {
                continue;
            };
            if let Some((other, _)) = kinds.iter().find(|(n, v)| v == vendor && !same(n, want)) {
                return Err(TrainError::Plan(format!(
                    "a stage names device kind {}, but {vendor}'s devices here are of more \
                     than one kind ({} too); name its devices as {vendor}:INDEX instead",
                    shown(want),
                    shown(other)
                )));
            }
            s.device = vendor.clone();
        }
        Ok(())
    }

    /// Every rank's role. A stage naming only a vendor gets that vendor's
    /// lowest device index that no stage names explicitly and no earlier
    /// stage took; the answer depends on the plan alone, so every rank of
    /// a job (on any machine) computes the same. Indices are those of the
    /// machine the rank runs on: on several machines, name devices
    /// explicitly. [`check_devices`] checks that they are present.
    pub fn roles(&self) -> Vec<Role> {
        let mut taken: Vec<String> = Vec::new();
        for g in &self.groups {
            for s in &g.stages {
                if s.device.contains(':') {
                    taken.push(s.device.to_lowercase());
                }
            }
        }
        let mut roles = Vec::new();
        let (mut rank, mut replica, mut first_seq) = (0, 0, 0);
        for (gi, g) in self.groups.iter().enumerate() {
            for _ in 0..g.copies {
                let base = rank;
                for (si, s) in g.stages.iter().enumerate() {
                    let want = s.device.to_lowercase();
                    let device = if want.contains(':') {
                        want
                    } else {
                        let name = (0..)
                            .map(|i| format!("{want}:{i}"))
                            .find(|d| !taken.contains(d))
                            .expect("an unused index exists");
                        taken.push(name.clone());
                        name
                    };
                    let p = g.stages.len();
                    roles.push(Role {
                        rank,
                        group: gi,
                        replica,
                        stage: si,
                        stages: p,
                        device,
                        range: StageRange {
                            start: s.layers[0],
                            end: s.layers[1],
                            embed: si == 0,
                            head: si + 1 == p,
                        },
                        micro_batch_size: g.micro_batch_size,
                        micro_batches: g.micro_batches,
                        sequences: g.checked_sequences().unwrap_or(usize::MAX),
                        first_sequence: first_seq,
                        prev: (si > 0).then(|| base + si - 1),
                        next: (si + 1 < p).then(|| base + si + 1),
                        optimizer_weight: s.optimizer_weight,
                    });
                    rank += 1;
                }
                replica += 1;
                first_seq = first_seq.saturating_add(g.checked_sequences().unwrap_or(usize::MAX));
            }
        }
        roles
    }

    /// A one-line description, e.g. `1 x [ferrite:0 0..3 | cobalt:0 3..4] b=2 m=4`.
    pub fn describe(&self) -> String {
        let groups: Vec<String> = self
            .groups
            .iter()
            .map(|g| {
                let stages: Vec<String> = g
                    .stages
                    .iter()
                    .map(|s| match s.optimizer_weight {
                        Some(w) => {
                            format!("{} {}..{} opt={w:.3}", s.device, s.layers[0], s.layers[1])
                        }
                        None => format!("{} {}..{}", s.device, s.layers[0], s.layers[1]),
                    })
                    .collect();
                let last = match g.sequences {
                    Some(seqs) if Some(seqs) != g.micro_batch_size.checked_mul(g.micro_batches) => {
                        format!(" ({seqs} sequences)")
                    }
                    _ => String::new(),
                };
                format!(
                    "{} x [{}] b={} m={}{last}",
                    g.copies,
                    stages.join(" | "),
                    g.micro_batch_size,
                    g.micro_batches
                )
            })
            .collect();
        let joined = groups.join(" + ");
        match self.schedule {
            Some(s) if self.groups.iter().any(|g| g.stages.len() > 1) => {
                match self.run_ahead.filter(|&r| r > 1) {
                    Some(r) => format!("{joined}, {}, run-ahead {r}", s.name()),
                    None => format!("{joined}, {}", s.name()),
                }
            }
            _ => joined,
        }
    }
}

/// The planner's plan as a training layout (chip types are vendor names).
/// Why a plan of `v` model chunks per device is refused.
fn interleaving_refused(v: u64) -> String {
    format!(
        "the plan is interleaved ({v} model chunks per device), which polychip train does not \
         run; polychip plan --evaluate scores such plans"
    )
}

pub fn from_planner(plan: &polychip_planner::plan::Plan) -> Result<TrainPlan> {
    let mut groups = Vec::new();
    for r in &plan.replicas {
        if r.virtual_stages > 1 {
            return Err(TrainError::Plan(interleaving_refused(r.virtual_stages)));
        }
        let mut stages = Vec::new();
        for s in &r.stages {
            if s.tp != 1 {
                return Err(TrainError::Plan(format!(
                    "the planner chose tensor parallelism {} for a stage of {}, which the \
                     trainer does not run; plan with one chip per node",
                    s.tp, s.chip
                )));
            }
            stages.push(StagePlan {
                device: s.chip.clone(),
                layers: [
                    Cut::block(s.first_layer as usize),
                    Cut::block(s.end_layer as usize),
                ],
                optimizer_weight: None,
                predicted_passes: None,
            });
        }
        let size = |field: &str, v: u64| {
            usize::try_from(v).map_err(|_| {
                TrainError::Plan(format!(
                    "the planner's {field} {v} does not fit this machine"
                ))
            })
        };
        groups.push(GroupPlan {
            copies: size("copies", r.copies)?,
            micro_batch_size: size("micro_batch_size", r.micro_batch_size)?,
            micro_batches: size("micro_batches", r.micro_batches)?,
            sequences: None,
            stages,
        });
    }
    Ok(TrainPlan {
        groups,
        predicted_step_seconds: Some(plan.step_time_simulated),
        schedule: None,
        run_ahead: None,
        core_order: None,
        planned_for: Some((plan.model.clone(), plan.seq_len as usize)),
    })
}

/// The member of the object `value` that keeps it from deserializing as a
/// `T`: the one whose removal makes it deserialize, or makes the error
/// that member's absence (serde's type errors do not name the field).
fn culprit<T: serde::de::DeserializeOwned>(value: &serde_json::Value) -> Option<String> {
    let obj = value.as_object()?;
    obj.keys()
        .find(|k| {
            let mut o = obj.clone();
            o.remove(*k);
            match serde_json::from_value::<T>(serde_json::Value::Object(o)) {
                Ok(_) => true,
                Err(e) => e.to_string() == format!("missing field `{k}`"),
            }
        })
        .cloned()
}

/// Where a plan JSON's error lies, as a path (`group[0].stages[1].device`).
fn locate(value: &serde_json::Value) -> Option<String> {
    let top = culprit::<TrainPlan>(value)?;
    let groups = match (top.as_str(), value.get("group")) {
        ("group", Some(serde_json::Value::Array(g))) => g,
        _ => return Some(top),
    };
    for (gi, g) in groups.iter().enumerate() {
        if serde_json::from_value::<GroupPlan>(g.clone()).is_ok() {
            continue;
        }
        let Some(field) = culprit::<GroupPlan>(g) else {
            return Some(format!("group[{gi}]"));
        };
        if let ("stages", Some(serde_json::Value::Array(stages))) =
            (field.as_str(), g.get("stages"))
        {
            for (si, st) in stages.iter().enumerate() {
                if serde_json::from_value::<StagePlan>(st.clone()).is_err() {
                    return Some(match culprit::<StagePlan>(st) {
                        Some(f) => format!("group[{gi}].stages[{si}].{f}"),
                        None => format!("group[{gi}].stages[{si}]"),
                    });
                }
            }
        }
        return Some(format!("group[{gi}].{field}"));
    }
    Some(top)
}

/// A device name from a plan as an error shows it: quoted, with control
/// and formatting characters escaped ([`polychip_files::printable`]), and
/// cut after 80 characters.
fn shown(name: &str) -> String {
    const MAX: usize = 80;
    match name.char_indices().nth(MAX) {
        Some((at, _)) => format!(
            "\"{}\"... ({} bytes)",
            polychip_files::printable(&name[..at]),
            name.len()
        ),
        None => format!("\"{}\"", polychip_files::printable(name)),
    }
}

/// Checks that each role's device is among `devices` (`vendor:index`, lower
/// case) and that no two roles share one.
pub fn check_devices(roles: &[&Role], devices: &[String]) -> Result<()> {
    for (i, r) in roles.iter().enumerate() {
        if !devices.contains(&r.device) {
            return Err(TrainError::Plan(format!(
                "rank {} (group {} stage {}) needs device {}, which is not present here; the \
                 devices are {}",
                r.rank,
                r.group,
                r.stage,
                shown(&r.device),
                devices.join(", ")
            )));
        }
        if let Some(o) = roles[..i].iter().find(|o| o.device == r.device) {
            return Err(TrainError::Plan(format!(
                "ranks {} and {} both need device {}; give each stage its own device",
                o.rank,
                r.rank,
                shown(&r.device)
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devices() -> Vec<String> {
        ["ferrite:0", "ferrite:1", "cobalt:0"]
            .map(String::from)
            .to_vec()
    }

    #[test]
    fn predicted_passes_are_seconds_or_refused_by_stage() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let mut plan =
            TrainPlan::parse_stages("ferrite:0=0..2+1,cobalt:0=2+1..4", 1, 2, 2).unwrap();
        plan.groups[0].stages[1].predicted_passes = Some([0.009, 0.012]);
        plan.validate(&cfg, 4).unwrap();
        let text = serde_json::to_string(&plan).unwrap();
        assert!(
            text.contains(r#""predicted_passes":[0.009,0.012]"#),
            "{text}"
        );
        for bad in [f64::NAN, -1.0, 1e10] {
            plan.groups[0].stages[1].predicted_passes = Some([0.009, bad]);
            let e = plan.validate(&cfg, 4).unwrap_err().to_string();
            assert!(
                e.contains("group 0 stage 1 (cobalt:0): predicted_passes is [0.009,"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_stage_naming_no_vendor_is_refused() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let mut plan = TrainPlan::parse_stages("ferrite:0=0..4", 1, 4, 1).unwrap();
        for name in ["", "  ", ":1", " :0"] {
            plan.groups[0].stages[0].device = name.into();
            let e = plan.validate(&cfg, 4).unwrap_err().to_string();
            assert!(
                e.contains(&format!(
                    "group 0 stage 0 names device \"{name}\", which has no vendor"
                )),
                "{e}"
            );
        }
    }

    #[test]
    fn a_plan_file_with_a_key_twice_is_refused() {
        let dir = std::env::temp_dir().join(format!("polychip-plan-dup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("p.json");
        std::fs::write(
            &file,
            r#"{"groups": [{"copies": 1, "micro_batch_size": 1, "micro_batches": 32,
                "micro_batches": 16, "stages": [{"device": "ferrite:0", "layers": [0, 4]}]}]}"#,
        )
        .unwrap();
        let err = TrainPlan::load(&file).unwrap_err().to_string();
        assert!(err.contains("\"micro_batches\" appears twice"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A scratch directory for `tag`, and the error of loading `text`
    /// written there as `name`.
    fn scratch_loader(tag: &str) -> (std::path::PathBuf, impl Fn(&str, &str) -> String) {
        let dir = std::env::temp_dir().join(format!("polychip-plan-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let at = dir.clone();
        let load = move |name: &str, text: &str| {
            let file = at.join(name);
            std::fs::write(&file, text).unwrap();
            TrainPlan::load(&file).unwrap_err().to_string()
        };
        (dir, load)
    }

    #[test]
    fn an_interleaved_plan_is_refused_as_such() {
        let (dir, load) = scratch_loader("vpp");
        let stages = r#"[{"device": "ferrite:0", "layers": [0, 1]}, {"device": "ferrite:1", "layers": [1, 2]},
            {"device": "ferrite:0", "layers": [2, 3]}, {"device": "ferrite:1", "layers": [3, 4]}]"#;
        let json = format!(
            r#"{{"virtual_stages": 2, "group": [{{"micro_batch_size": 1, "micro_batches": 4,
            "stages": {stages}}}]}}"#
        );
        let toml = "virtual_stages = 2\n[[group]]\nmicro_batch_size = 1\nmicro_batches = 4\nstages = [{ device = \"ferrite:0\", layers = [0, 4] }]\n";
        for e in [load("p.json", &json), load("p.toml", toml)] {
            assert!(e.contains("interleaved (2 model chunks per device)"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_plan_runs_ahead_as_far_as_it_says_within_bounds() {
        let (dir, load) = scratch_loader("ahead");
        let group = r#""group": [{"micro_batch_size": 1, "micro_batches": 4, "stages": [
            {"device": "cobalt:0", "layers": [0, 2]}, {"device": "ferrite:0", "layers": [2, 4]}]}]"#;
        for bad in ["0", "65", "-1", "4.5", "\"four\"", "18446744073709551616"] {
            let e = load("p.json", &format!(r#"{{"run_ahead": {bad}, {group}}}"#));
            assert!(
                e.contains("p.json") && e.contains("run_ahead"),
                "{bad}: {e}"
            );
        }
        let file = dir.join("ok.json");
        std::fs::write(
            &file,
            format!(r#"{{"run_ahead": 4, "schedule": "1f1b", {group}}}"#),
        )
        .unwrap();
        let plan = TrainPlan::load(&file).unwrap();
        assert_eq!(plan.run_ahead, Some(4));
        assert!(
            plan.describe().ends_with("b=1 m=4, 1f1b, run-ahead 4"),
            "{}",
            plan.describe()
        );
        // Written back as read.
        let again: TrainPlan =
            serde_json::from_str(&serde_json::to_string(&plan).unwrap()).unwrap();
        assert_eq!(again, plan);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_bad_prediction_or_field_type_is_refused_naming_the_field() {
        let (dir, load) = scratch_loader("pred");
        let toml = "[[group]]\nmicro_batch_size = 1\nmicro_batches = 4\nstages = [{ device = \"ferrite:0\", layers = [0, 4] }]\n";
        for bad in ["nan", "-inf", "-5.0", "0.0", "1e-300", "2e9"] {
            let e = load("p.toml", &format!("predicted_step_seconds = {bad}\n{toml}"));
            assert!(
                e.contains("p.toml: predicted_step_seconds is ")
                    && e.contains("it must be a number of seconds from 1e-9 to 1e9"),
                "{bad}: {e}"
            );
        }
        let json = |stage: &str| {
            format!(
                r#"{{"group": [{{"micro_batch_size": 1, "micro_batches": 4, "stages": [{{"device": "ferrite:0", "layers": [0, 2]}}, {stage}]}}]}}"#
            )
        };
        let e = load("p.json", &json(r#"{"device": 0, "layers": [2, 4]}"#));
        assert!(
            e.contains("p.json: at group[0].stages[1].device: invalid type: integer `0`"),
            "{e}"
        );
        let e = load(
            "q.json",
            &json(r#"{"device": "cobalt:0", "layers": [2, 4]}"#)
                .replace("\"micro_batches\": 4", "\"micro_batches\": \"4\""),
        );
        assert!(e.contains("at group[0].micro_batches: invalid type"), "{e}");
        let e = load(
            "r.json",
            &format!(
                r#"{{"predicted_step_seconds": -5.0, {}"#,
                &json(r#"{"device": "cobalt:0", "layers": [2, 4]}"#)[1..]
            ),
        );
        assert!(e.contains("predicted_step_seconds is -5;"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
        // --stages with no device before '='.
        let e = TrainPlan::parse_stages("=0..4", 1, 1, 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--stages entry \"=0..4\" names no device"),
            "{e}"
        );
    }

    #[test]
    fn a_stage_naming_a_device_kind_by_its_model_name_runs_on_its_vendor() {
        let kinds = [
            ("Ferrite F1".to_string(), "ferrite".to_string()),
            ("Cobalt C1".to_string(), "cobalt".to_string()),
        ];
        let mut plan = TrainPlan::parse_stages("ferrite f1=0..2,cobalt:0=2..4", 2, 1, 4).unwrap();
        plan.groups[0].stages[0].device = " Ferrite F1 ".into();
        plan.name_vendors(&kinds).unwrap();
        let roles = plan.roles();
        let got: Vec<&str> = roles.iter().map(|r| r.device.as_str()).collect();
        assert_eq!(got, ["ferrite:0", "cobalt:0", "ferrite:1", "cobalt:0"]);
        // A name no device has is left, and refused where devices are checked.
        let mut plan = TrainPlan::parse_stages("Opal O1=0..4", 1, 1, 4).unwrap();
        plan.name_vendors(&kinds).unwrap();
        assert_eq!(plan.groups[0].stages[0].device, "Opal O1");
        // A vendor with devices of two kinds: its name would not say which.
        let two = [
            ("Ferrite F1".to_string(), "ferrite".to_string()),
            ("Ferrite F2".to_string(), "ferrite".to_string()),
        ];
        let mut plan = TrainPlan::parse_stages("Ferrite F2=0..4", 1, 1, 4).unwrap();
        let e = plan.name_vendors(&two).unwrap_err().to_string();
        assert!(
            e.contains("names device kind \"Ferrite F2\", but ferrite's devices here are of more than one kind (\"Ferrite F1\" too)"),
            "{e}"
        );
    }

    #[test]
    fn roles_number_ranks_and_link_stages() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let plan = TrainPlan::parse_stages("ferrite=0..3,cobalt:0=3..4", 1, 2, 4).unwrap();
        plan.validate(&cfg, 8).unwrap();
        let roles = plan.roles();
        check_devices(&roles.iter().collect::<Vec<_>>(), &devices()).unwrap();
        assert_eq!(roles.len(), 2);
        assert_eq!(roles[0].device, "ferrite:0");
        assert_eq!((roles[0].prev, roles[0].next), (None, Some(1)));
        assert_eq!(roles[1].device, "cobalt:0");
        assert!(roles[1].range.head && !roles[1].range.embed);
    }

    #[test]
    fn the_ends_may_be_stages_of_their_own() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let plan =
            TrainPlan::parse_stages("cobalt=0..0,ferrite=0..4,ferrite=4..4", 1, 2, 4).unwrap();
        plan.validate(&cfg, 8).unwrap();
        let r = plan.roles();
        assert!(r[0].range.embed && !r[0].range.head && r[0].range.layers().is_empty());
        assert!(!r[1].range.embed && !r[1].range.head && r[1].range.layers() == (0..4));
        assert!(!r[2].range.embed && r[2].range.head && r[2].range.layers().is_empty());
        for bad in [
            "ferrite=0..0",
            "ferrite=0..2,cobalt=2..2,ferrite=2..4",
            "ferrite=0..4,cobalt=3..3",
        ] {
            let plan = TrainPlan::parse_stages(bad, 1, 2, 4).unwrap();
            let e = plan.validate(&cfg, 8).unwrap_err().to_string();
            assert!(e.contains("hold a part of the model"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_core_order_places_each_rank_where_its_device_was_profiled() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let mut plan =
            TrainPlan::parse_stages("ferrite:0=0..3,cobalt:0=3..4,ferrite:1=4..4", 1, 2, 4)
                .unwrap();
        // Without one, each rank takes its rank's place.
        assert_eq!(plan.core_positions()[2], (2, 3));
        plan.core_order = Some(
            ["cobalt:0", "Ferrite:0", "ferrite:1"]
                .map(String::from)
                .to_vec(),
        );
        plan.validate(&cfg, 8).unwrap();
        assert_eq!(plan.core_positions(), vec![(1, 3), (0, 3), (2, 3)]);
        // It must name every device of the plan once.
        for bad in [
            &["cobalt:0", "ferrite:0"][..],
            &["cobalt:0", "ferrite:0", "ferrite:0"],
            &["cobalt:0", "ferrite:0", "ferrite:1", "ferrite:2"],
        ] {
            plan.core_order = Some(bad.iter().map(|d| d.to_string()).collect());
            let e = plan.validate(&cfg, 8).unwrap_err().to_string();
            assert!(
                e.contains("core_order lists")
                    && e.contains("ranks run on cobalt:0, ferrite:0, ferrite:1"),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn bad_plans_name_the_problem() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let gap = TrainPlan::parse_stages("ferrite=0..2,cobalt=3..4", 1, 2, 4).unwrap();
        let e = gap.validate(&cfg, 8).unwrap_err().to_string();
        assert!(e.contains("stage 1") && e.contains("block 2"), "{e}");
        let short = TrainPlan::parse_stages("ferrite=0..3", 1, 2, 4).unwrap();
        assert!(
            short
                .validate(&cfg, 8)
                .unwrap_err()
                .to_string()
                .contains("end at block 3")
        );
        let batch = TrainPlan::parse_stages("ferrite=0..4", 1, 2, 4).unwrap();
        let e = batch.validate(&cfg, 16).unwrap_err().to_string();
        assert!(e.contains("8 sequences") && e.contains("16"), "{e}");
        let many = TrainPlan::parse_stages("cobalt=0..2,cobalt=2..4", 1, 2, 4).unwrap();
        let roles = many.roles();
        assert_eq!(roles[1].device, "cobalt:1");
        let e = check_devices(&roles.iter().collect::<Vec<_>>(), &devices())
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"cobalt:1\", which is not present"), "{e}");
        // A name from a file is shown quoted, escaped and cut short.
        let mut odd = TrainPlan::parse_stages("cobalt=0..4", 1, 2, 4).unwrap();
        odd.groups[0].stages[0].device = format!("x\u{1b}[2J{}", "y".repeat(100_000));
        let roles = odd.roles();
        let e = check_devices(&roles.iter().collect::<Vec<_>>(), &devices())
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs device \"x\\u{1b}[2jyyy"), "{e}");
        assert!(e.len() < 400 && e.contains("(100007 bytes)"), "{e}");
        let twice = TrainPlan::parse_stages("ferrite:1=0..2,ferrite:1=2..4", 1, 2, 4).unwrap();
        let roles = twice.roles();
        let e = check_devices(&roles.iter().collect::<Vec<_>>(), &devices())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ranks 0 and 1 both need device \"ferrite:1\""),
            "{e}"
        );
        assert!(TrainPlan::parse_stages("ferrite:0", 1, 1, 1).is_err());
    }

    #[test]
    fn huge_counts_cannot_wrap_the_checks() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        // 2^63 x 2 x 1 wraps to 0 in usize; with a second group of 8 the
        // wrapped sum would equal the global batch of 8.
        let mut plan = TrainPlan::parse_stages("ferrite=0..4", 1 << 63, 2, 1).unwrap();
        plan.groups
            .push(TrainPlan::single("cobalt", 4, 2, 4).groups.remove(0));
        let e = plan.validate(&cfg, 8).unwrap_err().to_string();
        assert!(
            e.contains("group 0: copies is 9223372036854775808, more than the 65536"),
            "{e}"
        );
        let plan = TrainPlan::parse_stages("ferrite=0..4", (1 << 63) - 1, 1, 1).unwrap();
        let e = plan.validate(&cfg, 8).unwrap_err().to_string();
        assert!(e.contains("copies is 9223372036854775807"), "{e}");
        // Within each bound, but too many ranks in all.
        let mut plan = TrainPlan::parse_stages("ferrite=0..2,cobalt=2..4", 40_000, 1, 1).unwrap();
        let e = plan.validate(&cfg, 40_000).unwrap_err().to_string();
        assert!(e.contains("it needs 80000 ranks"), "{e}");
        plan.groups[0].copies = 1;
        plan.groups[0].micro_batches = 1 << 20;
        let e = plan.validate(&cfg, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("micro_batches is 1048576"), "{e}");
        // A plan file with 2^63 - 1 copies is refused, not planned.
        let dir = std::env::temp_dir().join(format!("polychip-plan-huge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("huge.toml");
        std::fs::write(
            &file,
            "[[group]]\ncopies = 9223372036854775807\nmicro_batch_size = 1\nmicro_batches = 1\n\
             stages = [{ device = \"ferrite\", layers = [0, 4] }]\n",
        )
        .unwrap();
        let e = TrainPlan::load(&file)
            .unwrap()
            .validate(&cfg, 8)
            .unwrap_err()
            .to_string();
        assert!(e.contains("copies is 9223372036854775807"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

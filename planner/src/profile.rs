//! Measured costs: a profile file (`polychip profile` writes one; another
//! framework's measurements can be written by hand) gives, per chip type,
//! micro-batch size and tensor-parallel degree, the forward and backward
//! seconds of the embedding, of one block and of the head (final norm,
//! output projection and loss), the optimizer's seconds per parameter, and
//! optionally the activation bytes one block keeps per micro-batch and the
//! peak memory seen. [`ClusterSpec::apply_profile`] attaches the entries to
//! the chip types they name; from then on [`crate::cost::stage_timing`]
//! prices those types' stages from the measurements (FLOPs times
//! efficiency only for types the file does not cover), for the search and
//! for `--evaluate` alike. At a tensor-parallel degree the file does not
//! cover, the nearest measured degree is scaled by the cost model's ratio
//! between the two.
//!
//! Micro-batch sizes between two measured ones are interpolated linearly;
//! beyond the measured range a stage's times are the nearest measurement's
//! plus the cost model's difference between the two sizes, bounded by the
//! measurement in proportion to the size (activation bytes are scaled in
//! proportion; documented in `docs/planner.md`).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::cluster::{ChipType, ClusterSpec, MAX_MEMORY_BYTES, fmt_num};
use crate::error::{SpecError, read_file};
use crate::measured::MeasuredDevice;
use crate::model::ModelSpec;
use crate::settings::Dtype;

/// The `format` a profile file carries.
pub const FORMAT: &str = "polychip-profile/1";

/// The shortest pass of a block or the head a profile may give, in seconds.
pub const MIN_PASS_SECONDS: f64 = 1e-9;

/// The most entries a profile file may hold.
pub const MAX_ENTRIES: usize = 4096;

/// Forward and backward seconds of one micro-batch through a part.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "an object of seconds {\"forward\": .., \"backward\": ..} (optionally \
                 \"weight_grad\", \"fused_backward\" and \"held\")"
)]
pub struct Passes {
    /// Forward, seconds.
    pub forward: f64,
    /// Backward, seconds.
    pub backward: f64,
    /// The weights' gradients' part of `backward`, seconds, where measured
    /// apart (`polychip profile` does; the zero-bubble schedule runs it
    /// after the send). Optional: when absent, the cost model's share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_grad: Option<f64>,
    /// The backward pass run whole, seconds, where measured beside the
    /// split one (`polychip profile` does, for the block): `backward` is
    /// the pass split in two, the input's and then the weights', as a
    /// zero-bubble stage runs it; 1F1B, data-parallel replicas and a
    /// zero-bubble pipeline's first stage run it whole, which may cost
    /// less. Optional: when absent, `backward`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fused_backward: Option<f64>,
    /// The block's passes run while the stage holds another micro-batch's
    /// activations, seconds, where measured beside the passes above
    /// (`polychip profile` does, for the block): every 1F1B stage but the
    /// last starts the next forward pass before the last one's backward,
    /// and pays for it (on Ferrite 1-4%). Optional: when absent, the
    /// passes above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Held>,
}

/// A block's forward and backward seconds while another micro-batch is
/// held in flight ([`Passes::held`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "an object of seconds {\"forward\": .., \"backward\": ..}"
)]
pub struct Held {
    /// The forward pass, seconds.
    pub forward: f64,
    /// The backward pass (split, as `backward`), seconds.
    pub backward: f64,
}

/// A fixed cost each pipeline stage pays per micro-batch, seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "an object of seconds {\"forward\": .., \"backward\": ..}"
)]
pub struct StageOverhead {
    /// Of the forward pass.
    pub forward: f64,
    /// Of the backward pass.
    pub backward: f64,
}

/// One chip type's measurements at one micro-batch size and tp degree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, expecting = "an entry object")]
pub struct ProfileEntry {
    /// The chip type: its name in the cluster, a device name of it
    /// (`ferrite:0`) or a vendor (`ferrite`), matched as
    /// [`ClusterSpec::resolve_chip`] does.
    pub chip: String,
    /// Sequences per micro-batch.
    pub micro_batch: u64,
    /// Tensor-parallel degree the parts ran at (1 by default).
    #[serde(default = "one")]
    pub tp: u64,
    /// The token embedding. Optional in a file: when absent, the cost
    /// model's estimate scaled by the measured block over its own
    /// ([`ClusterSpec::apply_profile`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding: Option<Passes>,
    /// One transformer block.
    pub block: Passes,
    /// The block's attention half (its norm, projections, attention and
    /// residual), the part of `block` a pipeline cut halfway through a
    /// block leaves on the earlier stage (`polychip train --plan auto`
    /// cuts there; the cluster planner does not). Optional: when absent,
    /// half the block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention: Option<Passes>,
    /// The final norm, output projection and loss (optional, as the
    /// embedding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<Passes>,
    /// A fixed cost each pipeline stage pays per micro-batch whatever it
    /// holds (a launch, a synchronisation, memory mapped afresh), apart
    /// from the parts above, which are then of the parts alone: what a
    /// stage of one half costs beyond its share of a long stage's block
    /// (`polychip profile` measures it where it exceeds the machine's
    /// noise). Optional: when absent, none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_overhead: Option<StageOverhead>,
    /// The optimizer step (with gradient clipping), seconds per parameter.
    /// Optional: when absent, the cost model's (memory-bound) estimate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_per_param: Option<f64>,
    /// Activation bytes one block keeps for its backward per micro-batch,
    /// when measured (used in place of the formula).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_activation_bytes: Option<u64>,
    /// The most device memory in use while profiling, bytes (reported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
}

fn one() -> u64 {
    1
}

/// A profile file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a profile object")]
pub struct ProfileFile {
    /// [`FORMAT`].
    pub format: String,
    /// The model the measurements were taken on.
    pub model: ModelSpec,
    /// The compute dtype they ran in.
    pub dtype: Dtype,
    /// Where the figures come from (free text).
    #[serde(default)]
    pub source: String,
    /// The measurements.
    pub entries: Vec<ProfileEntry>,
    /// The devices (`vendor:index`) in the order they took the cores when
    /// they were profiled side by side, each on its rank's share
    /// (`polychip train --save-profile` writes it): where devices share a
    /// core their times hold only beside the same neighbours, and
    /// `polychip train --profile` plans them in this order. Optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub core_order: Option<Vec<String>>,
}

impl ProfileEntry {
    /// The measurements as the measured search's device costs.
    /// Parts an entry does not give count as free here; entries attached
    /// to a cluster have every part ([`ClusterSpec::apply_profile`] fills
    /// them in).
    pub fn costs(&self, name: &str) -> MeasuredDevice {
        let (embedding, head, stage) = (
            self.embedding.unwrap_or_default(),
            self.head.unwrap_or_default(),
            self.stage_overhead.unwrap_or_default(),
        );
        MeasuredDevice {
            name: name.to_string(),
            block_forward: self.block.forward,
            block_backward: self.block.backward,
            // Half the block when not measured (the cluster planner cuts
            // at whole blocks, so the split never counts there).
            attention_forward: self
                .attention
                .map_or(self.block.forward / 2.0, |a| a.forward),
            attention_backward: self
                .attention
                .map_or(self.block.backward / 2.0, |a| a.backward),
            embed_forward: embedding.forward,
            embed_backward: embedding.backward,
            head_forward: head.forward,
            head_backward: head.backward,
            optimizer_per_param: self.optimizer_per_param.unwrap_or(0.0),
            block_weight_grad: self.block.weight_grad.unwrap_or(0.0),
            head_weight_grad: head.weight_grad.unwrap_or(0.0),
            fused_backward_ratio: match (self.block.fused_backward, self.block.backward) {
                (Some(f), b) if b > 0.0 => f / b,
                _ => 0.0,
            },
            held_forward_ratio: match (self.block.held, self.block.forward) {
                (Some(h), f) if f > 0.0 => h.forward / f,
                _ => 0.0,
            },
            held_backward_ratio: match (self.block.held, self.block.backward) {
                (Some(h), b) if b > 0.0 => h.backward / b,
                _ => 0.0,
            },
            stage_forward: stage.forward,
            stage_backward: stage.backward,
        }
    }

    fn validate(&self, i: usize) -> Result<(), String> {
        let at = format!(
            "entry {i} (chip {:?}, micro-batch {})",
            self.chip, self.micro_batch
        );
        if self.chip.trim().is_empty() {
            return Err(format!("entry {i} has an empty chip"));
        }
        if self.micro_batch == 0 || self.micro_batch > crate::settings::MAX_GLOBAL_BATCH {
            return Err(format!(
                "{at}: micro_batch must be 1 to {}",
                crate::settings::MAX_GLOBAL_BATCH
            ));
        }
        if self.tp == 0 || self.tp > crate::cluster::MAX_CHIPS_PER_NODE {
            return Err(format!(
                "{at}: tp {} must be from 1 to {} (a tensor-parallel group lies inside a node)",
                self.tp,
                crate::cluster::MAX_CHIPS_PER_NODE
            ));
        }
        let given = |p: Option<Passes>| p.map(|p| [p.forward, p.backward]);
        let times = [
            ("embedding.forward", given(self.embedding).map(|p| p[0])),
            ("embedding.backward", given(self.embedding).map(|p| p[1])),
            ("block.forward", Some(self.block.forward)),
            ("block.backward", Some(self.block.backward)),
            ("attention.forward", given(self.attention).map(|p| p[0])),
            ("attention.backward", given(self.attention).map(|p| p[1])),
            ("head.forward", given(self.head).map(|p| p[0])),
            ("head.backward", given(self.head).map(|p| p[1])),
            (
                "stage_overhead.forward",
                self.stage_overhead.map(|o| o.forward),
            ),
            (
                "stage_overhead.backward",
                self.stage_overhead.map(|o| o.backward),
            ),
            ("optimizer_per_param", self.optimizer_per_param),
        ];
        for (field, v) in times.into_iter().filter_map(|(f, v)| Some((f, v?))) {
            if !(v.is_finite() && (0.0..=1e6).contains(&v)) {
                return Err(format!(
                    "{at}: {field} is {}; it must be seconds, from 0 to 1e6",
                    fmt_num(v)
                ));
            }
        }
        // A block's and the head's passes are real work: one that takes no
        // time, or less than a nanosecond (no kernel launches that fast), is
        // a measurement that went wrong or not in seconds, and a step of
        // such passes made throughput infinite (the embedding's lookup and
        // a stage's fixed cost may be nil).
        let passes = [("block", Some(self.block)), ("head", self.head)];
        for (part, p) in passes.into_iter().filter_map(|(n, p)| Some((n, p?))) {
            for (pass, v) in [("forward", p.forward), ("backward", p.backward)] {
                if v < MIN_PASS_SECONDS {
                    return Err(format!(
                        "{at}: {part}.{pass} is {}; a {part}'s {pass} pass takes some time, at \
                         least {MIN_PASS_SECONDS:e} s",
                        fmt_num(v)
                    ));
                }
            }
        }
        if let Some(a) = self.attention
            && (a.forward > self.block.forward || a.backward > self.block.backward)
        {
            return Err(format!(
                "{at}: attention ({} s forward, {} s backward) is a part of the block, so it \
                 cannot take longer than block ({} s, {} s)",
                fmt_num(a.forward),
                fmt_num(a.backward),
                fmt_num(self.block.forward),
                fmt_num(self.block.backward)
            ));
        }
        // The weights' gradients are part of the backward pass.
        let parts = [
            ("embedding", self.embedding),
            ("block", Some(self.block)),
            ("attention", self.attention),
            ("head", self.head),
        ];
        for (part, p) in parts.into_iter().filter_map(|(n, p)| Some((n, p?))) {
            // Only the block's are read: another part's was ignored without
            // a word until hostile sweep 6.
            let only_block = [
                ("fused_backward", p.fused_backward.is_some()),
                ("held", p.held.is_some()),
            ];
            if let Some((field, _)) = only_block
                .iter()
                .find(|(_, given)| *given && part != "block")
            {
                return Err(format!(
                    "{at}: {part}.{field} is given, but only the block's {field} is measured and \
                     used (the {part}'s passes run once a micro-batch); remove it"
                ));
            }
            if let Some(f) = p.fused_backward
                && !(f.is_finite() && f > 0.0 && f >= 0.5 * p.backward && f <= 2.0 * p.backward)
            {
                return Err(format!(
                    "{at}: {part}.fused_backward is {}; it is the same pass as {part}.backward \
                     ({}) run whole, so it must be positive and from half to twice that",
                    fmt_num(f),
                    fmt_num(p.backward)
                ));
            }
            if let Some(h) = p.held {
                for (pass, held, alone) in [
                    ("forward", h.forward, p.forward),
                    ("backward", h.backward, p.backward),
                ] {
                    if !(held.is_finite()
                        && held > 0.0
                        && held >= 0.5 * alone
                        && held <= 2.0 * alone)
                    {
                        return Err(format!(
                            "{at}: {part}.held.{pass} is {}; it is the same pass as \
                             {part}.{pass} ({}) run with another micro-batch in flight, so it \
                             must be positive and from half to twice that",
                            fmt_num(held),
                            fmt_num(alone)
                        ));
                    }
                }
            }
            if let Some(w) = p.weight_grad
                && !(w.is_finite() && (0.0..=p.backward).contains(&w))
            {
                return Err(format!(
                    "{at}: {part}.weight_grad is {}; it is the weights' part of {part}.backward \
                     ({}), so it must be from 0 to that",
                    fmt_num(w),
                    fmt_num(p.backward)
                ));
            }
        }
        let bytes = [
            ("block_activation_bytes", self.block_activation_bytes),
            ("peak_memory_bytes", self.peak_memory_bytes),
        ];
        for (field, b) in bytes.into_iter().filter_map(|(f, b)| Some((f, b?))) {
            if b > MAX_MEMORY_BYTES {
                return Err(format!(
                    "{at}: {field} is {b}, more than the {MAX_MEMORY_BYTES} bytes (1 PiB) a chip \
                     may have"
                ));
            }
        }
        Ok(())
    }
}

impl ProfileFile {
    /// Parses and checks a profile from JSON text.
    pub fn from_json_str(text: &str) -> Result<Self, SpecError> {
        let p: ProfileFile = serde_json::from_str(text)
            .map_err(|e| SpecError::Profile(format!("is not a valid profile: {e}")))?;
        p.validate()?;
        Ok(p)
    }

    /// Reads a profile file.
    pub fn load(path: &Path) -> Result<Self, SpecError> {
        Self::from_json_str(&read_file(path)?).map_err(|e| match e {
            SpecError::Profile(m) => {
                SpecError::Profile(format!("{}: {m}", polychip_files::shown_path(path)))
            }
            e => e,
        })
    }

    /// Checks the format, the model and every entry.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.format != FORMAT {
            return Err(SpecError::Profile(format!(
                "has format {:?}; this build reads {FORMAT:?}",
                self.format
            )));
        }
        // Said of the profile (its file, once loaded): the model it records.
        self.model
            .validate()
            .map_err(|e| SpecError::Profile(format!("records a model that is not valid: {e}")))?;
        if self.entries.is_empty() {
            return Err(SpecError::Profile("has no entries".into()));
        }
        if self.entries.len() > MAX_ENTRIES {
            return Err(SpecError::Profile(format!(
                "has {} entries, more than the {MAX_ENTRIES} the planner reads",
                self.entries.len()
            )));
        }
        for (i, e) in self.entries.iter().enumerate() {
            e.validate(i).map_err(SpecError::Profile)?;
        }
        Ok(())
    }

    /// Refuses a profile measured on another model shape or dtype than
    /// `model` in `dtype` (the name does not count); `dtype_flag` is the
    /// caller's flag that sets the dtype (`--dtype` for `polychip plan`,
    /// `--precision` for `polychip train`), which the message names.
    pub fn check_matches(
        &self,
        model: &ModelSpec,
        dtype: Dtype,
        dtype_flag: &str,
    ) -> Result<(), SpecError> {
        let (a, b) = (&self.model, model);
        let fields = [
            ("layers", a.layers, b.layers),
            ("hidden", a.hidden, b.hidden),
            ("ffn", a.ffn, b.ffn),
            ("heads", a.heads, b.heads),
            ("kv_heads", a.kv_heads, b.kv_heads),
            ("vocab", a.vocab, b.vocab),
            ("seq_len", a.seq_len, b.seq_len),
            ("experts", a.experts, b.experts),
            (
                "experts_per_token",
                a.experts_per_token,
                b.experts_per_token,
            ),
            ("shared_ffn", a.shared_ffn, b.shared_ffn),
            ("head_dim", a.head_dim(), b.head_dim()),
            ("dense_layers", a.dense_layers, b.dense_layers),
            ("dense_ffn", a.dense_ffn, b.dense_ffn),
            ("kv_lora_rank", a.kv_lora_rank, b.kv_lora_rank),
            ("q_lora_rank", a.q_lora_rank, b.q_lora_rank),
            ("rope_head_dim", a.rope_head_dim, b.rope_head_dim),
            ("v_head_dim", a.v_head_dim(), b.v_head_dim()),
            ("moe_layer_step", a.moe_step(), b.moe_step()),
            ("moe_layer_offset", a.moe_layer_offset, b.moe_layer_offset),
        ];
        if let Some((f, x, y)) = fields.iter().find(|(_, x, y)| x != y) {
            return Err(SpecError::Profile(format!(
                "was measured on model {:?} whose {f} is {x}, but the model planned ({:?}) has \
                 {f} {y}; profile this model",
                a.name, b.name
            )));
        }
        if b.has_dense_layers() {
            let dense = b.dense_layers_in(&(0..b.layers));
            return Err(SpecError::Profile(format!(
                "prices every block as the one it measured, but model {:?} has two kinds: {} \
                 of its {} layers dense, the others mixtures of experts; plan it without a \
                 profile",
                b.name, dense, b.layers
            )));
        }
        if self.dtype != dtype {
            return Err(SpecError::Profile(format!(
                "was measured in {}, but the plan computes in {} ({dtype_flag}); profile with \
                 that dtype, or plan with {dtype_flag} {}",
                self.dtype, dtype, self.dtype
            )));
        }
        Ok(())
    }
}

impl ClusterSpec {
    /// The chip type `name` refers to: a type's name (exactly, then
    /// ignoring case), a device of it (`ferrite:0`, as `polychip devices`
    /// lists it), or a vendor whose devices are all of one type
    /// (`ferrite`). An error lists the types when none matches.
    pub fn resolve_chip(&self, name: &str) -> Result<usize, String> {
        let types = &self.chip_types;
        if let Some(i) = types.iter().position(|c| c.name == name) {
            return Ok(i);
        }
        let lower = name.trim().to_lowercase();
        let found: Vec<usize> = (0..types.len())
            .filter(|&i| {
                let c = &types[i];
                c.name.to_lowercase() == lower
                    || c.devices.iter().any(|d| d.to_lowercase() == lower)
                    || c.devices
                        .iter()
                        .any(|d| d.to_lowercase().split(':').next() == Some(lower.as_str()))
            })
            .collect();
        match found.as_slice() {
            [i] => Ok(*i),
            [] => Err(format!(
                "{name:?} is not a chip type of the cluster, nor one of its devices (types: {})",
                types
                    .iter()
                    .map(|c| format!("{:?}", c.name))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            many => Err(format!(
                "{name:?} matches several chip types ({}); name the type",
                many.iter()
                    .map(|&i| format!("{:?}", types[i].name))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }

    /// Attaches `profile`'s entries to the chip types they name (after
    /// checking it was measured on `model` in `dtype`). A profile may
    /// cover more chips than the cluster has (one file for a whole fleet):
    /// entries for names the cluster lacks are left out and listed in
    /// [`Applied::ignored`]. A profile none of whose entries names a chip
    /// type of the cluster is an error, naming the first entry's chip.
    pub fn apply_profile(
        &mut self,
        profile: &ProfileFile,
        model: &ModelSpec,
        settings: &crate::settings::TrainingSettings,
    ) -> Result<Applied, SpecError> {
        profile.check_matches(model, settings.dtype, "--dtype")?;
        let mut applied = Applied::default();
        let mut first_miss = None;
        for (i, e) in profile.entries.iter().enumerate() {
            let ty = match self.resolve_chip(&e.chip) {
                Ok(ty) => ty,
                Err(m) => {
                    first_miss.get_or_insert_with(|| format!("entry {i}: chip {m}"));
                    if !applied.ignored.contains(&e.chip) {
                        applied.ignored.push(e.chip.clone());
                    }
                    continue;
                }
            };
            if let Some(why) = implausible(e, &self.chip_types[ty], model, settings.dtype) {
                applied.implausible.push(format!(
                    "{} at micro-batch {} and tp {}: {why}",
                    e.chip, e.micro_batch, e.tp
                ));
            }
            let (e, estimated) = self.complete(e, ty, model, settings);
            if !estimated.is_empty() {
                applied.estimated.push(format!(
                    "{} at micro-batch {} and tp {}: {}",
                    e.chip,
                    e.micro_batch,
                    e.tp,
                    estimated.join(", ")
                ));
            }
            let chip = &mut self.chip_types[ty];
            if chip
                .measured
                .iter()
                .any(|m| m.micro_batch == e.micro_batch && m.tp == e.tp)
            {
                return Err(SpecError::Profile(format!(
                    "entry {i}: chip type {:?} has two entries for micro-batch {} and tp {}",
                    chip.name, e.micro_batch, e.tp
                )));
            }
            chip.measured.push(e);
            if !applied.covered.contains(&chip.name) {
                applied.covered.push(chip.name.clone());
            }
        }
        if applied.covered.is_empty()
            && let Some(m) = first_miss
        {
            return Err(SpecError::Profile(format!(
                "{m}; none of the profile's entries names a chip type of the cluster"
            )));
        }
        for c in &mut self.chip_types {
            c.measured.sort_by_key(|m| (m.tp, m.micro_batch));
            // A larger micro-batch is not much slower per sequence: an
            // entry that is is used as given, with a warning.
            let entries: Vec<&ProfileEntry> = c.measured.iter().collect();
            applied
                .implausible
                .extend(slower_per_sequence(&c.name, &entries));
        }
        Ok(applied)
    }
}

impl ClusterSpec {
    /// `e` with every part: the embedding and head it does not give are
    /// the cost model's own (a first stage of the embedding alone, a last
    /// stage of the head alone, at the entry's micro-batch and tp) scaled by
    /// the entry's measured block over the cost model's block, forward and
    /// backward apart; a missing optimizer cost is the cost model's. Also
    /// the names of the parts estimated.
    fn complete(
        &self,
        e: &ProfileEntry,
        ty: usize,
        model: &ModelSpec,
        settings: &crate::settings::TrainingSettings,
    ) -> (ProfileEntry, Vec<&'static str>) {
        let mut e = e.clone();
        let mut estimated = Vec::new();
        let chip = &self.chip_types[ty];
        let mb = crate::cost::Microbatching {
            size: e.micro_batch,
            count: 1,
        };
        let layers = model.layers;
        let at = |model: &ModelSpec, range: std::ops::Range<u64>, index: usize, stages: usize| {
            let shape = crate::cost::StageShape {
                chip,
                layers: range,
                index,
                num_stages: stages,
                dp: 1,
                tp: e.tp,
                next: None,
                dp_peers: &[],
                dp_one_node: true,
            };
            crate::cost::analytic_stage_timing(model, settings, self, &shape, mb)
        };
        let block = at(model, 0..1, 1, 3);
        let ratio = |m: f64, a: f64| if a > 0.0 { m / a } else { 1.0 };
        let (sf, sb) = (
            ratio(e.block.forward, block.forward),
            ratio(e.block.backward, block.backward),
        );
        let scaled = |t: crate::schedule::StageTiming| Passes {
            forward: t.forward * sf,
            backward: t.backward * sb,
            weight_grad: None,
            fused_backward: None,
            held: None,
        };
        if e.embedding.is_none() {
            e.embedding = Some(scaled(at(model, 0..0, 0, 2)));
            estimated.push("embedding");
        }
        if e.head.is_none() {
            // One output head: a stage of it alone, without multi-token
            // prediction's (which `apply_measured` adds from it).
            let one = ModelSpec {
                mtp_layers: 0,
                ..model.clone()
            };
            e.head = Some(scaled(at(&one, layers..layers, 1, 2)));
            estimated.push("head");
        }
        if e.optimizer_per_param.is_none() {
            let one = crate::cost::ChipParams {
                dense: 1.0,
                ..Default::default()
            };
            e.optimizer_per_param =
                Some(crate::cost::optimizer_time(model, settings, chip, one, 1));
            estimated.push("optimizer");
        }
        (e, estimated)
    }
}

/// What [`ClusterSpec::apply_profile`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// The chip types that now have measured costs.
    pub covered: Vec<String>,
    /// The profile's chip names the cluster does not have (their entries
    /// were left out).
    pub ignored: Vec<String>,
    /// Entries that did not give every part, with the parts the cost
    /// model estimated (`"GH-96 at micro-batch 1 and tp 4: embedding,
    /// head"`).
    pub estimated: Vec<String>,
    /// Entries whose times no chip of the type can have measured (see
    /// [`implausible`]), with why: used as given, but worth a warning.
    pub implausible: Vec<String>,
}

/// Why entry `e`'s times cannot be measurements of `chip` (a sentence),
/// if they cannot: its block or head would have computed faster than the
/// chip type's peak in `dtype` (counting the least work the pass can do:
/// the weights' products and half the attention scores, as a causal
/// kernel skips the rest; three times the forward pass's for forward and
/// backward), which points at times in the wrong unit (they are seconds),
/// a peak set too low, or a timing that left out part of the work (Sailor's
/// GPT-Neo profile times a head at 2-10x the GH200's peak: not its logits
/// product); or a pass of one micro-batch (or the fixed cost per stage, or
/// the optimizer step over the whole model) would take over an hour.
pub fn implausible(
    e: &ProfileEntry,
    chip: &ChipType,
    model: &ModelSpec,
    dtype: Dtype,
) -> Option<String> {
    if chip.chips_per_node % e.tp.max(1) != 0 {
        return Some(format!(
            "its tp {} does not divide the type's {} chips per node, so no plan uses it as \
             measured (other degrees are scaled from it)",
            e.tp, chip.chips_per_node
        ));
    }
    if let Some(why) = unusable(e, chip.memory_bytes, model) {
        return Some(why);
    }
    let b = e.micro_batch;
    let block = model.matmul_forward_flops(b) + 0.5 * model.attention_score_forward_flops(b);
    let peak = chip.peak_flops.get(dtype);
    let mut parts = vec![("block", e.block, block)];
    if let Some(h) = e.head {
        parts.push(("head", h, model.output_head_forward_flops(b)));
    }
    if let Some(x) = e.embedding {
        parts.push(("embedding", x, 0.0));
    }
    if let Some(o) = e.stage_overhead {
        parts.push((
            "fixed cost per stage",
            Passes {
                forward: o.forward,
                backward: o.backward,
                weight_grad: None,
                fused_backward: None,
                held: None,
            },
            0.0,
        ));
    }
    for (name, p, forward_flops) in parts {
        if forward_flops <= 0.0 || peak <= 0.0 {
            continue;
        }
        // Each pass on its own (the backward pass does twice the forward's
        // work): a forward pass of 1e-300 s hides in a sum with a real
        // backward pass.
        for (pass, seconds, flops) in [
            ("forward", p.forward, forward_flops),
            ("backward", p.backward, 2.0 * forward_flops),
        ] {
            if seconds <= 0.0 {
                continue;
            }
            let rate = flops / (seconds * e.tp.max(1) as f64);
            if !rate.is_finite() {
                return Some(format!(
                    "its {name}'s {pass} pass takes {seconds:.3e} s, faster than any chip could \
                     run it: the profile's times are seconds"
                ));
            }
            if rate > peak {
                return Some(format!(
                    "its {name}'s {pass} pass would have run at {:.3e} FLOP/s a chip, {:.1}x the \
                     chip type's {dtype} peak ({:.3e}): its times are not seconds, the cluster's \
                     peak is too low, or what was timed leaves out part of the work",
                    rate,
                    rate / peak,
                    peak
                ));
            }
        }
    }
    None
}

/// Why entry `e`'s figures cannot be measurements of a chip with
/// `memory_bytes` of memory on `model` (a sentence), whatever its speed:
/// a block that keeps no activations or more than the chip's memory, or a
/// pass of one micro-batch (or the fixed cost per stage, or the optimizer
/// step over the whole model) that takes over an hour. [`implausible`]
/// adds the checks that need the chip type's peak.
pub fn unusable(e: &ProfileEntry, memory_bytes: u64, model: &ModelSpec) -> Option<String> {
    const HOUR: f64 = 3600.0;
    match e.block_activation_bytes {
        Some(0) => {
            return Some(
                "its block keeps no activations (block_activation_bytes 0), where a block keeps \
                 at least its input for the backward pass"
                    .into(),
            );
        }
        Some(bytes) if bytes > memory_bytes => {
            return Some(format!(
                "its block keeps {bytes} bytes of activations, more than a chip's memory \
                 ({memory_bytes}): the figure is not bytes per block of one micro-batch"
            ));
        }
        _ => {}
    }
    let mut parts = vec![("block", e.block.forward, e.block.backward)];
    if let Some(h) = e.head {
        parts.push(("head", h.forward, h.backward));
    }
    if let Some(x) = e.embedding {
        parts.push(("embedding", x.forward, x.backward));
    }
    if let Some(o) = e.stage_overhead {
        parts.push(("fixed cost per stage", o.forward, o.backward));
    }
    for (name, forward, backward) in parts {
        if forward > HOUR || backward > HOUR {
            return Some(format!(
                "its {name} takes over an hour a micro-batch ({forward:.3e} s forward, \
                 {backward:.3e} s backward); the profile's times are seconds"
            ));
        }
    }
    // The optimizer step over the whole model, at its time per parameter.
    if let Some(per_param) = e.optimizer_per_param {
        let step = per_param * model.total_params() as f64 / e.tp.max(1) as f64;
        if step > HOUR {
            return Some(format!(
                "its optimizer step takes {per_param:.3e} s a parameter, over an hour for the \
                 model's {} parameters; the profile's times are seconds",
                model.total_params()
            ));
        }
    }
    None
}

/// Pairs of one chip's entries at the same tp, the second at the next
/// larger micro-batch, whose block is more than twice as slow per sequence
/// as the first's (a time of another size, or unit): a sentence for each,
/// naming the chip as `chip`. `entries` may come in any order.
pub fn slower_per_sequence(chip: &str, entries: &[&ProfileEntry]) -> Vec<String> {
    let mut sorted = entries.to_vec();
    sorted.sort_by_key(|m| (m.tp, m.micro_batch));
    let per_sequence =
        |m: &ProfileEntry| (m.block.forward + m.block.backward) / m.micro_batch.max(1) as f64;
    sorted
        .windows(2)
        .filter_map(|w| {
            let (a, b) = (w[0], w[1]);
            let (x, y) = (per_sequence(a), per_sequence(b));
            (a.tp == b.tp && x > 0.0 && y > 2.0 * x).then(|| {
                format!(
                    "{chip} at tp {}: its block takes {y:.3e} s a sequence at micro-batch {}, \
                     {:.1}x its {x:.3e} s at micro-batch {}; a larger micro-batch is not that \
                     much slower per sequence (a time of another size, or unit?)",
                    a.tp,
                    b.micro_batch,
                    y / x,
                    a.micro_batch
                )
            })
        })
        .collect()
}

impl ChipType {
    /// The measured tensor-parallel degree nearest to `tp` (the smaller on
    /// a tie), if the type has measurements.
    pub fn nearest_measured_tp(&self, tp: u64) -> Option<u64> {
        self.measured
            .iter()
            .map(|m| m.tp)
            .min_by_key(|&m| (m.abs_diff(tp), m))
    }

    /// `b` if the type's measurements at degree `tp` span it (between their
    /// smallest and largest micro-batch), else the nearest end of that span;
    /// `None` without measurements at `tp`.
    pub fn nearest_measured_micro_batch(&self, b: u64, tp: u64) -> Option<u64> {
        let sizes = || {
            self.measured
                .iter()
                .filter(move |m| m.tp == tp)
                .map(|m| m.micro_batch)
        };
        Some(b.clamp(sizes().min()?, sizes().max()?))
    }

    /// The measured costs of one micro-batch of `b` sequences at degree
    /// `tp`, interpolated between measured sizes (or scaled in proportion
    /// to `b` from the nearest beyond them); `None` when the type has no
    /// measurement at `tp`.
    pub fn measured_costs(&self, b: u64, tp: u64) -> Option<(MeasuredDevice, Option<f64>)> {
        let at: Vec<&ProfileEntry> = self.measured.iter().filter(|m| m.tp == tp).collect();
        let (lo, hi) = match at.iter().position(|m| m.micro_batch >= b) {
            Some(0) => (at[0], at[0]),
            Some(i) => (at[i - 1], at[i]),
            None => (*at.last()?, *at.last()?),
        };
        let (x0, x1, x) = (lo.micro_batch as f64, hi.micro_batch as f64, b as f64);
        // Weights of lo and hi: linear between them, proportional outside.
        let (w0, w1) = if lo.micro_batch == hi.micro_batch {
            (x / x0, 0.0)
        } else {
            let t = (x - x0) / (x1 - x0);
            (1.0 - t, t)
        };
        let mix = |a: f64, c: f64| w0 * a + w1 * c;
        let passes = |a: Passes, c: Passes| Passes {
            forward: mix(a.forward, c.forward),
            backward: mix(a.backward, c.backward),
            weight_grad: match (a.weight_grad, c.weight_grad) {
                (Some(x), Some(y)) => Some(mix(x, y)),
                _ => None,
            },
            fused_backward: match (a.fused_backward, c.fused_backward) {
                (Some(x), Some(y)) => Some(mix(x, y)),
                _ => None,
            },
            held: match (a.held, c.held) {
                (Some(x), Some(y)) => Some(Held {
                    forward: mix(x.forward, y.forward),
                    backward: mix(x.backward, y.backward),
                }),
                _ => None,
            },
        };
        let part = |a: Option<Passes>, c: Option<Passes>| {
            Some(passes(a.unwrap_or_default(), c.unwrap_or_default()))
        };
        let e = ProfileEntry {
            embedding: part(lo.embedding, hi.embedding),
            block: passes(lo.block, hi.block),
            attention: match (lo.attention, hi.attention) {
                (Some(a), Some(c)) => Some(passes(a, c)),
                _ => None,
            },
            head: part(lo.head, hi.head),
            stage_overhead: match (lo.stage_overhead, hi.stage_overhead) {
                (None, None) => None,
                (a, c) => {
                    let (a, c) = (a.unwrap_or_default(), c.unwrap_or_default());
                    Some(StageOverhead {
                        forward: mix(a.forward, c.forward),
                        backward: mix(a.backward, c.backward),
                    })
                }
            },
            // Per parameter: it does not depend on the micro-batch.
            optimizer_per_param: lo.optimizer_per_param,
            ..lo.clone()
        };
        // The activations from the entries that measured them (not every
        // entry need): between two, linear; beyond them, in proportion to
        // the sequences from the nearest (a measurement at micro-batch 1
        // alone used to be taken at 1 and nowhere else, so a larger
        // micro-batch was sized by the formula, smaller than the measured).
        let sized: Vec<(f64, f64)> = at
            .iter()
            .filter_map(|m| Some((m.micro_batch as f64, m.block_activation_bytes? as f64)))
            .collect();
        let act = match sized.iter().position(|&(mb, _)| mb >= x) {
            _ if sized.is_empty() => None,
            Some(0) => Some(sized[0].1 * x / sized[0].0),
            Some(i) => {
                let ((m0, a0), (m1, a1)) = (sized[i - 1], sized[i]);
                Some(a0 + (a1 - a0) * (x - m0) / (m1 - m0))
            }
            None => sized.last().map(|&(mb, a)| a * x / mb),
        };
        Some((e.costs(&self.name), act))
    }
}

/// Replaces `timing`'s compute terms with the measured ones when `stage`'s
/// chip type has measurements: forward and backward from the block,
/// embedding and head times (full recomputation adds the blocks' forward
/// to the backward), the optimizer step from its time per parameter (per
/// chip, after sharding). Transfers and the gradient all-reduce stay as
/// the link model prices them.
///
/// Where the profile lacks the stage's micro-batch size or tensor-parallel
/// degree, the nearest measured entry's times are carried there by the
/// cost model ([`carry`]): of the part of the measured time the model does
/// not see, what kernels slower than the model's can explain (up to
/// [`MAX_KERNEL_SLOWDOWN`] times the model's work alone) grows with the
/// work, and the rest (launch and synchronisation overheads on the host)
/// stays fixed. First to the micro-batch size at the measured degree, then
/// to the degree (its matmul split, lost efficiency and all-reduces).
pub(crate) fn apply_measured(
    timing: &mut crate::schedule::StageTiming,
    model: &ModelSpec,
    settings: &crate::settings::TrainingSettings,
    cluster: &ClusterSpec,
    stage: &crate::cost::StageShape,
    mb: crate::cost::Microbatching,
) {
    let tp = stage.tp.max(1);
    let Some(measured_tp) = stage.chip.nearest_measured_tp(tp) else {
        return;
    };
    // Beyond the measured micro-batch sizes, from the nearest measured one.
    let Some(near) = stage
        .chip
        .nearest_measured_micro_batch(mb.size, measured_tp)
    else {
        return;
    };
    let Some((costs, _)) = stage.chip.measured_costs(near, measured_tp) else {
        return;
    };
    let blocks = (stage.layers.end - stage.layers.start) as usize;
    let (embed, head) = (stage.holds_embedding(), stage.holds_head());
    let (mut f, mut b) =
        crate::measured::stage_passes(&costs, blocks as f64, blocks as f64, embed, head);
    // Multi-token prediction's heads and their projections (its layers
    // are among the blocks): each projection's matmul does `2h / V` of a
    // head's (`h x 2h` against `h x V`; 11% of DeepSeek-V3's), priced as
    // that share of the measured head.
    let projection = 2.0 * model.hidden as f64 / model.vocab.max(1) as f64;
    let heads = 1.0 + model.mtp_layers as f64 * (1.0 + projection);
    if head {
        f += (heads - 1.0) * costs.head_forward;
        b += (heads - 1.0) * costs.head_backward;
    }
    // The weights' gradients' part: measured apart where the profile gives
    // it, else the cost model's share of the backward pass.
    let measured_weights = blocks as f64 * costs.block_weight_grad
        + if head {
            heads * costs.head_weight_grad
        } else {
            0.0
        };
    let weight_share = match (measured_weights > 0.0 && b > 0.0, timing.backward > 0.0) {
        (true, _) => measured_weights / b,
        (false, true) => timing.weight_grad / timing.backward,
        (false, false) => 0.0,
    };
    let recomputed = match settings.recompute {
        crate::settings::Recompute::Full => settings.recompute_split(blocks as u64).recomputed,
        _ => 0.0,
    };
    b += recomputed * costs.block_forward;
    // A mixture's token exchange under expert parallelism, which a
    // profile's blocks (measured on one chip) do not hold: priced by the
    // cost model, added to the measured passes, and left out of the model's
    // passes the carries below scale by.
    let exchange =
        2.0 * crate::cost::expert_all_to_all_time(model, settings, stage.chip, mb.size, tp);
    let (exchange_f, exchange_b) = (
        blocks as f64 * exchange,
        (blocks as f64 + recomputed) * exchange,
    );
    let local = (exchange > 0.0).then(|| crate::settings::TrainingSettings {
        expert_parallel: 1,
        ..settings.clone()
    });
    let local = local.as_ref().unwrap_or(settings);
    // The cost model's passes of this stage at micro-batch `size` and
    // degree `tp`, with its dispatch floor (`whole`) or without (the work
    // alone; its chip type is made only when a carry needs it).
    let bare = std::cell::OnceCell::new();
    let model_at = |size: u64, tp: u64, whole: bool| {
        let chip = match whole {
            true => stage.chip,
            false => bare.get_or_init(|| ChipType {
                kernel_dispatch_seconds: Some(0.0),
                ..stage.chip.clone()
            }),
        };
        let s = crate::cost::StageShape {
            tp,
            chip,
            ..stage.clone()
        };
        let mb = crate::cost::Microbatching { size, ..mb };
        let t = crate::cost::analytic_stage_timing(model, local, cluster, &s, mb);
        (t.forward, t.backward)
    };
    // The model at this stage's micro-batch size and the measured degree,
    // where the first carry ends and the second starts.
    let mut at_measured = None;
    let mut here = || {
        *at_measured.get_or_insert_with(|| {
            (
                model_at(mb.size, measured_tp, true),
                model_at(mb.size, measured_tp, false),
            )
        })
    };
    if near != mb.size {
        let (from, from0) = (
            model_at(near, measured_tp, true),
            model_at(near, measured_tp, false),
        );
        let (to, to0) = here();
        // Bounded by the measured time in proportion to the sequences, as
        // a pass's time per sequence does not grow with the batch nor fall
        // below that of a larger one.
        let proportional = mb.size as f64 / near as f64;
        let bounded = |measured: f64, v: f64| {
            let p = measured * proportional;
            if mb.size > near {
                v.clamp(measured, p)
            } else {
                v.clamp(p, measured)
            }
        };
        f = bounded(f, carry(f, (from.0, to.0), (from0.0, to0.0)));
        b = bounded(b, carry(b, (from.1, to.1), (from0.1, to0.1)));
    }
    if measured_tp != tp {
        // To another degree by ratios alone: the measured time of a
        // degree is mostly slower kernels than the model's, which split
        // with the work (Sailor's GH200 blocks run 1.8-2.4 times the
        // model's at tp 1 and speed up more than it with tp).
        // `timing` holds the model's passes at this shape, floor included.
        let to = (timing.forward - exchange_f, timing.backward - exchange_b);
        let (from, from0) = here();
        let to0 = model_at(mb.size, tp, false);
        f *= split(from.0, to.0, from0.0, to0.0);
        b *= split(from.1, to.1, from0.1, to0.1);
    }
    let updated =
        crate::cost::ChipParams::of(model, settings, stage).updated(model, settings, stage.dp);
    // The schedule's part, as the trainer's measured search prices it: the
    // backward pass run whole where the stage does not split it, and both
    // passes slower where it holds other micro-batches in flight (1 where
    // the profile does not measure them, as other frameworks' do not).
    let (ff, fb) = crate::measured::schedule_factors(
        &costs,
        settings.schedule,
        stage.index,
        stage.num_stages,
        mb.count as usize,
    );
    timing.forward = f * ff + exchange_f;
    timing.backward = b * fb + exchange_b;
    timing.weight_grad = (weight_share * b * fb).min(timing.backward);
    timing.optimizer = updated * costs.optimizer_per_param;
}

/// The factor that carries a measured time from one tensor-parallel
/// degree to another: the geometric mean of the cost model's ratio between
/// them with its dispatch floor (`from`, `to`: the floor stays fixed) and
/// without it (`from0`, `to0`: everything splits with the work).
fn split(from: f64, to: f64, from0: f64, to0: f64) -> f64 {
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 1.0 };
    (ratio(to, from) * ratio(to0, from0)).sqrt()
}

/// How many times slower than the cost model's work alone a chip's kernels
/// are taken to run at most when a profile is carried to another
/// micro-batch size ([`carry`]). The model prices large matmuls at the
/// chip type's `efficiency` (0.5 unless set); kernels of a training step
/// that sustain under half of that (a quarter of the peak) are rare on the
/// GPUs of the outside runs: Sailor's GH200 blocks run 1.8-2.4 times the
/// model's at tp 1 (TF32 kernels of fp32 training), AMP's T4 head, one
/// large product, 1.4 times. A measured pass slower than this is taken to
/// hold host-side overhead (dispatch by a slow CPU, synchronisation),
/// which does not grow with the batch: AMP's V100 block takes 6.5 times
/// the model's work at one sequence. 2 (half the default efficiency) was
/// chosen among round values of 1.5 to 4 as the one that loses no outside
/// set against the rule before it; docs/planner.md gives the sweep.
pub const MAX_KERNEL_SLOWDOWN: f64 = 2.0;

/// A time `measured` at one shape carried to another by the cost model,
/// whose times at the two shapes are `whole` (with its dispatch floor) and
/// `work` (its work alone, without the floor). The measurement's excess
/// over the model at its own shape is split: the part that slower kernels
/// can explain, up to [`MAX_KERNEL_SLOWDOWN`] times the model's work,
/// grows with the work; the rest is host-side overhead and stays fixed;
/// the model's own floor is the model's at the new shape. A measurement
/// faster than the model scales the model's time. Until stop 45 this was
/// the geometric mean of the measured time plus the model's difference
/// (everything fixed) and the measured time times the ratio of the
/// model's work (everything growing): against the outside runs priced
/// from part of a profile (`outside_runs.rs`), the split is closer on
/// every set (docs/planner.md, "Profiles").
fn carry(measured: f64, whole: (f64, f64), work: (f64, f64)) -> f64 {
    if work.0 <= 0.0 || whole.0 <= 0.0 {
        return (measured + (whole.1 - whole.0)).max(0.0);
    }
    let excess = measured - whole.0;
    if excess <= 0.0 {
        return measured * whole.1 / whole.0;
    }
    let growing = excess.min((MAX_KERNEL_SLOWDOWN - 1.0) * work.0);
    (whole.1 + growing * work.1 / work.0 + (excess - growing)).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(chip: &str, b: u64, block: f64) -> ProfileEntry {
        ProfileEntry {
            chip: chip.into(),
            micro_batch: b,
            tp: 1,
            embedding: Some(Passes {
                forward: 0.1 * block,
                backward: 0.1 * block,
                weight_grad: None,
                fused_backward: None,
                held: None,
            }),
            block: Passes {
                forward: block,
                backward: 2.0 * block,
                weight_grad: None,
                fused_backward: None,
                held: None,
            },
            attention: None,
            head: Some(Passes {
                forward: 3.0 * block,
                backward: 6.0 * block,
                weight_grad: None,
                fused_backward: None,
                held: None,
            }),
            stage_overhead: None,
            optimizer_per_param: Some(1e-9),
            block_activation_bytes: Some(1000 * b),
            peak_memory_bytes: None,
        }
    }

    /// The three-vendor example cluster (`examples/clusters/`).
    fn three_vendor() -> ClusterSpec {
        crate::cluster::example("china-mobile-3-vendor.toml")
    }

    fn bf16() -> crate::settings::TrainingSettings {
        let mut s = crate::settings::TrainingSettings::new(1);
        s.dtype = Dtype::Bf16;
        s
    }

    fn file(entries: Vec<ProfileEntry>) -> ProfileFile {
        ProfileFile {
            format: FORMAT.into(),
            model: ModelSpec::llama_7b(),
            dtype: Dtype::Bf16,
            source: String::new(),
            core_order: None,
            entries,
        }
    }

    #[test]
    fn an_invalid_model_is_said_of_the_profile() {
        let mut f = file(vec![entry("x", 2, 1.0)]);
        f.model.hidden = 0;
        let err = ProfileFile::from_json_str(&serde_json::to_string(&f).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "profile records a model that is not valid: model \"llama-7b\": hidden is 0"
            ),
            "{err}"
        );
    }

    /// Times no chip could have measured are flagged, not refused: a
    /// block or head faster than the chip's peak (a time in another unit
    /// than seconds, or a peak set too low), a pass, a fixed stage cost or
    /// an optimizer step of over an hour; a real entry is not.
    #[test]
    fn times_faster_than_the_peak_or_over_an_hour_are_flagged() {
        let c = three_vendor();
        let (chip, model) = (&c.chip_types[0], ModelSpec::llama_7b());
        // One LLaMA-7B block on 4 sequences of 4096 is about 3.6 TFLOP
        // forward and backward: at 40% of the peak it takes seconds.
        let flops = 3.0 * model.layer_forward_flops(4);
        let real = flops / (0.4 * chip.peak_flops.get(Dtype::Bf16));
        let e = |block: f64| entry(&chip.name, 4, block / 3.0);
        assert_eq!(implausible(&e(real), chip, &model, Dtype::Bf16), None);
        let fast = implausible(&e(real / 1000.0), chip, &model, Dtype::Bf16).unwrap();
        assert!(
            fast.contains("its block's forward pass would have run at")
                && fast.contains("the chip type's bf16 peak"),
            "{fast}"
        );
        // A forward pass of next to nothing beside a real backward pass
        // (their sum looked plausible).
        let mut tiny = e(real);
        tiny.block.forward = 1e-300;
        let why = implausible(&tiny, chip, &model, Dtype::Bf16).unwrap();
        assert!(why.contains("its block's forward pass"), "{why}");
        // A head written in the wrong unit while its block is right.
        let mut head = e(real);
        let h = head.head.as_mut().unwrap();
        (h.forward, h.backward) = (1e-9, 2e-9);
        assert!(
            implausible(&head, chip, &model, Dtype::Bf16)
                .unwrap()
                .contains("its head")
        );
        let slow = implausible(&e(3.0 * 4000.0), chip, &model, Dtype::Bf16).unwrap();
        assert!(slow.contains("over an hour"), "{slow}");
        // Activations of no bytes, or of more than a chip holds; a degree
        // no node of the type allows.
        let mut act = e(real);
        act.block_activation_bytes = Some(0);
        let why = implausible(&act, chip, &model, Dtype::Bf16).unwrap();
        assert!(why.contains("keeps no activations"), "{why}");
        act.block_activation_bytes = Some(chip.memory_bytes + 1);
        let why = implausible(&act, chip, &model, Dtype::Bf16).unwrap();
        assert!(why.contains("more than a chip's memory"), "{why}");
        let mut tp3 = e(real);
        tp3.tp = 3;
        let why = implausible(&tp3, chip, &model, Dtype::Bf16).unwrap();
        assert!(why.contains("its tp 3 does not divide"), "{why}");
        let mut optimizer = e(real);
        optimizer.optimizer_per_param = Some(1e-3);
        let why = implausible(&optimizer, chip, &model, Dtype::Bf16).unwrap();
        assert!(
            why.contains("its optimizer step takes 1.000e-3 s a parameter"),
            "{why}"
        );
        let mut overhead = e(real);
        overhead.stage_overhead = Some(StageOverhead {
            forward: 5000.0,
            backward: 0.0,
        });
        let why = implausible(&overhead, chip, &model, Dtype::Bf16).unwrap();
        assert!(
            why.contains("its fixed cost per stage takes over an hour"),
            "{why}"
        );
        let why = implausible(&e(1e-300), chip, &model, Dtype::Bf16).unwrap();
        assert!(why.contains("faster than any chip could run it"), "{why}");
        // apply_profile keeps such an entry and lists it.
        let mut cluster = c.clone();
        let applied = cluster
            .apply_profile(&file(vec![e(real / 1000.0)]), &model, &bf16())
            .unwrap();
        assert_eq!(applied.covered, vec![chip.name.clone()]);
        assert_eq!(applied.implausible.len(), 1);
        assert!(
            applied.implausible[0]
                .starts_with(&format!("{} at micro-batch 4 and tp 1: ", chip.name))
        );
        // A larger micro-batch far slower per sequence than a smaller one.
        let at = |b: u64, per_sequence: f64| entry(&chip.name, b, per_sequence * b as f64 / 3.0);
        let mut cluster = c.clone();
        let applied = cluster
            .apply_profile(&file(vec![at(1, real / 4.0), at(2, real)]), &model, &bf16())
            .unwrap();
        assert!(
            applied
                .implausible
                .iter()
                .any(|w| w.contains("4.0x its") && w.contains("at micro-batch 1")),
            "{:?}",
            applied.implausible
        );
        let mut cluster = c.clone();
        let applied = cluster
            .apply_profile(
                &file(vec![at(1, real / 4.0), at(2, real / 4.5)]),
                &model,
                &bf16(),
            )
            .unwrap();
        assert!(applied.implausible.is_empty(), "{:?}", applied.implausible);
    }

    #[test]
    fn interpolates_between_sizes_and_scales_beyond_them() {
        let mut c = three_vendor();
        let name = c.chip_types[0].name.clone();
        let p = file(vec![entry(&name, 2, 1.0), entry(&name, 4, 3.0)]);
        let applied = c
            .apply_profile(&p, &ModelSpec::llama_7b(), &bf16())
            .unwrap();
        assert_eq!(applied.covered, vec![name.clone()]);
        assert!(applied.ignored.is_empty());
        // A fleet's profile: entries for chips the cluster lacks are left
        // out and named.
        let mut other = c.clone();
        other.chip_types.iter_mut().for_each(|t| t.measured.clear());
        let fleet = file(vec![entry(&name, 2, 1.0), entry("elsewhere", 2, 1.0)]);
        let applied = other
            .apply_profile(&fleet, &ModelSpec::llama_7b(), &bf16())
            .unwrap();
        assert_eq!(applied.covered, vec![name.clone()]);
        assert_eq!(applied.ignored, vec!["elsewhere".to_string()]);
        let chip = &c.chip_types[0];
        let f = |b| chip.measured_costs(b, 1).unwrap().0.block_forward;
        assert_eq!(f(2), 1.0);
        assert_eq!(f(3), 2.0);
        assert_eq!(f(4), 3.0);
        assert_eq!(f(8), 6.0);
        assert_eq!(f(1), 0.5);
        // Activations (1000 bytes a sequence in `entry`) from the entries
        // that measured them, wherever the others did not.
        let act = |c: &ClusterSpec, b| c.chip_types[0].measured_costs(b, 1).unwrap().1;
        assert_eq!((act(&c, 3), act(&c, 8)), (Some(3000.0), Some(8000.0)));
        let mut one = file(vec![entry(&name, 1, 1.0), entry(&name, 2, 2.0)]);
        one.entries[1].block_activation_bytes = None;
        let mut partial = c.clone();
        partial
            .chip_types
            .iter_mut()
            .for_each(|t| t.measured.clear());
        partial
            .apply_profile(&one, &ModelSpec::llama_7b(), &bf16())
            .unwrap();
        assert_eq!(
            (act(&partial, 1), act(&partial, 2), act(&partial, 4)),
            (Some(1000.0), Some(2000.0), Some(4000.0))
        );
        assert!(chip.measured_costs(2, 2).is_none());
        assert_eq!(chip.nearest_measured_tp(4), Some(1));
        assert_eq!(c.chip_types[1].nearest_measured_tp(1), None);
    }

    /// A multi-token-prediction layer on the measured last stage: a block
    /// more, and the measured head again with its projection, `2h / V` of
    /// a head's matmul (a quarter of Llama 7B's at 4,096 of 32,000 words).
    #[test]
    fn multi_token_prediction_takes_the_measured_head_again() {
        use crate::cost::{Microbatching, StageShape, stage_timing};
        let mut c = three_vendor();
        let m = ModelSpec::llama_7b();
        let mtp = ModelSpec {
            mtp_layers: 1,
            ..m.clone()
        };
        let name = c.chip_types[0].name.clone();
        c.apply_profile(&file(vec![entry(&name, 2, 0.2)]), &m, &bf16())
            .unwrap();
        let forward = |model: &ModelSpec| {
            let stage = StageShape {
                chip: &c.chip_types[0],
                layers: model.stage_layers(28..32, true),
                index: 2,
                num_stages: 3,
                dp: 1,
                tp: 1,
                next: None,
                dp_peers: &[],
                dp_one_node: true,
            };
            let mb = Microbatching { size: 2, count: 4 };
            stage_timing(model, &bf16(), &c, &stage, mb).forward
        };
        let close = |a: f64, b: f64| assert!((a - b).abs() <= 1e-9 * b, "{a} against {b}");
        // Four blocks and the head (three blocks' time); then five blocks,
        // the head twice and the projection.
        close(forward(&m), 4.0 * 0.2 + 0.6);
        let projection = 2.0 * 4096.0 / 32000.0;
        close(forward(&mtp), 5.0 * 0.2 + 0.6 * (2.0 + projection));
    }

    /// Beyond the measured sizes a stage takes the nearest measurement
    /// carried by the cost model: of its excess over the model, what
    /// kernels up to `MAX_KERNEL_SLOWDOWN` times slower than the model's
    /// work explain grows with the work and the rest stays fixed; the
    /// result stays between the measurement and its proportional scaling.
    #[test]
    fn extends_beyond_the_measured_sizes_growing_what_slow_kernels_explain() {
        use crate::cost::{Microbatching, StageShape, analytic_stage_timing, stage_timing};
        let mut c = three_vendor();
        let (m, s) = (ModelSpec::llama_7b(), bf16());
        let name = c.chip_types[0].name.clone();
        let plain = c.clone();
        // A block measured at 0.2 s forward at two sequences: far above
        // the model's, the rest an overhead the model does not see.
        c.apply_profile(&file(vec![entry(&name, 2, 0.2)]), &m, &s)
            .unwrap();
        fn stage(c: &ClusterSpec) -> StageShape<'_> {
            StageShape {
                chip: &c.chip_types[0],
                layers: 4..8,
                index: 1,
                num_stages: 3,
                dp: 1,
                tp: 1,
                next: None,
                dp_peers: &[],
                dp_one_node: true,
            }
        }
        let mb = |size| Microbatching { size, count: 4 };
        let mut bare = plain.clone();
        bare.chip_types[0].kernel_dispatch_seconds = Some(0.0);
        let (measured, model, work) = (stage(&c), stage(&plain), stage(&bare));
        let at = |b| stage_timing(&m, &s, &c, &measured, mb(b)).forward;
        let model_at = |b| analytic_stage_timing(&m, &s, &plain, &model, mb(b)).forward;
        let work_at = |b| analytic_stage_timing(&m, &s, &bare, &work, mb(b)).forward;
        let close = |a: f64, b: f64| assert!((a - b).abs() <= 1e-12 * b, "{a} against {b}");
        close(at(2), 4.0 * 0.2);
        // The excess over the model at two sequences, far more than slow
        // kernels explain: (K - 1) times the model's work grows, the rest
        // stays.
        let excess = 4.0 * 0.2 - model_at(2);
        let grows = (MAX_KERNEL_SLOWDOWN - 1.0) * work_at(2);
        assert!(excess > grows);
        for b in [8u64, 64] {
            let fixed = 4.0 * 0.2 + model_at(b) - model_at(2);
            let growing = 4.0 * 0.2 * work_at(b) / work_at(2);
            let split = model_at(b) + grows * work_at(b) / work_at(2) + (excess - grows);
            close(at(b), split.min(0.8 * b as f64 / 2.0));
            assert!(at(b) > fixed && at(b) < growing, "b {b}: {}", at(b));
            assert!(at(b) < 0.8 * b as f64 / 2.0, "b {b}: {}", at(b));
        }
        // Below the smallest size: not under the proportional share.
        assert!(at(1) >= 0.4 && at(1) <= 0.8, "{}", at(1));
    }

    /// An entry of a block alone (another framework's per-layer
    /// measurement) gets the embedding, head and optimizer of the cost
    /// model, the first two scaled by the measured block over the model's.
    #[test]
    fn a_block_alone_is_completed_by_the_cost_model_scaled_to_it() {
        let base = three_vendor();
        let name = base.chip_types[0].name.clone();
        let m = ModelSpec::llama_7b();
        let full = entry(&name, 2, 0.05);
        let mut alone = full.clone();
        (alone.embedding, alone.head, alone.optimizer_per_param) = (None, None, None);
        let mut twice = alone.clone();
        twice.block.forward *= 2.0;
        twice.block.backward *= 2.0;
        let got = |e: &ProfileEntry| {
            let mut c = base.clone();
            let applied = c
                .apply_profile(&file(vec![e.clone()]), &m, &bf16())
                .unwrap();
            (c.chip_types[0].measured[0].clone(), applied)
        };
        let (one, applied) = got(&alone);
        assert_eq!(
            applied.estimated,
            vec![format!(
                "{name} at micro-batch 2 and tp 1: embedding, head, optimizer"
            )]
        );
        let (two, _) = got(&twice);
        let (e1, e2) = (one.embedding.unwrap(), two.embedding.unwrap());
        let (h1, h2) = (one.head.unwrap(), two.head.unwrap());
        assert!(e1.forward > 0.0 && h1.forward > 0.0 && h1.backward > 0.0);
        assert!((e2.forward / e1.forward - 2.0).abs() < 1e-9);
        assert!((h2.backward / h1.backward - 2.0).abs() < 1e-9);
        assert!(one.optimizer_per_param.unwrap() > 0.0);
        // Given parts are kept as they are.
        let (kept, applied) = got(&full);
        assert!(applied.estimated.is_empty());
        assert_eq!(kept, full);
    }

    #[test]
    fn refuses_another_model_an_unknown_chip_and_bad_figures() {
        let mut c = three_vendor();
        let p = file(vec![entry("no-such-chip", 2, 1.0)]);
        let err = c
            .apply_profile(&p, &ModelSpec::llama_13b(), &bf16())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("layers is 32") && err.contains("layers 40"),
            "{err}"
        );
        let err = c
            .apply_profile(&p, &ModelSpec::llama_7b(), &bf16())
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"no-such-chip\" is not a chip type"), "{err}");
        let mut bad = entry("x", 2, 1.0);
        bad.block.backward = f64::NAN;
        let text = serde_json::to_string(&file(vec![bad])).unwrap();
        let text = text.replace("NaN", "-1.0").replace("null", "-1.0");
        let err = ProfileFile::from_json_str(&text).unwrap_err().to_string();
        assert!(err.contains("block.backward is -1"), "{err}");
        // The weights' part of a backward pass cannot exceed it.
        let mut over = entry("x", 2, 1.0);
        over.head.as_mut().unwrap().weight_grad = Some(7.0);
        let text = serde_json::to_string(&file(vec![over])).unwrap();
        let err = ProfileFile::from_json_str(&text).unwrap_err().to_string();
        assert!(
            err.contains("head.weight_grad is 7") && err.contains("head.backward (6)"),
            "{err}"
        );
        // The attention half is part of the block, and gives the halves'
        // split where given (half the block where not).
        let mut halves = entry("x", 2, 1.0);
        assert_eq!(halves.costs("x").attention_backward, 1.0);
        halves.attention = Some(Passes {
            forward: 0.25,
            backward: 0.5,
            weight_grad: None,
            fused_backward: None,
            held: None,
        });
        let c = halves.costs("x");
        assert_eq!((c.attention_forward, c.attention_backward), (0.25, 0.5));
        halves.attention.as_mut().unwrap().backward = 2.5;
        let text = serde_json::to_string(&file(vec![halves])).unwrap();
        let err = ProfileFile::from_json_str(&text).unwrap_err().to_string();
        assert!(
            err.contains("attention (0.25 s forward, 2.5 s backward)")
                && err.contains("(1 s, 2 s)"),
            "{err}"
        );
        let err = ProfileFile::from_json_str("{\"format\": 3}")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a valid profile"), "{err}");
    }

    #[test]
    fn huge_byte_counts_and_times_are_refused_compactly() {
        for field in ["peak_memory_bytes", "block_activation_bytes"] {
            let mut e = entry("x", 2, 1.0);
            match field {
                "peak_memory_bytes" => e.peak_memory_bytes = Some(u64::MAX),
                _ => e.block_activation_bytes = Some(u64::MAX),
            }
            let text = serde_json::to_string(&file(vec![e])).unwrap();
            let err = ProfileFile::from_json_str(&text).unwrap_err().to_string();
            assert!(
                err.contains(&format!(
                    "entry 0 (chip \"x\", micro-batch 2): {field} is 18446744073709551615, \
                     more than the 1125899906842624 bytes (1 PiB)"
                )),
                "{err}"
            );
        }
        let mut e = entry("x", 2, 1.0);
        e.block.forward = 1e308;
        let text = serde_json::to_string(&file(vec![e])).unwrap();
        let err = ProfileFile::from_json_str(&text).unwrap_err().to_string();
        assert!(
            err.contains("block.forward is 1e308; it must be seconds") && err.len() < 200,
            "{err}"
        );
        // A block's or the head's pass of no time is a failed measurement
        // (it was accepted and priced a stage at next to nothing).
        for (part, pass) in [("block", 0), ("block", 1), ("head", 0), ("head", 1)] {
            let mut e = entry("x", 2, 1.0);
            let p = if part == "block" {
                &mut e.block
            } else {
                e.head.as_mut().unwrap()
            };
            *[&mut p.forward, &mut p.backward][pass] = 0.0;
            let text = serde_json::to_string(&file(vec![e])).unwrap();
            let err = ProfileFile::from_json_str(&text).unwrap_err().to_string();
            let name = ["forward", "backward"][pass];
            assert!(
                err.contains(&format!(
                    "{part}.{name} is 0; a {part}'s {name} pass takes some time"
                )),
                "{err}"
            );
        }
        // Nor one of a subnormal time, which made throughput infinite.
        let mut e = entry("x", 2, 1.0);
        e.block.forward = 5e-324;
        let text = serde_json::to_string(&file(vec![e])).unwrap();
        let err = ProfileFile::from_json_str(&text).unwrap_err().to_string();
        assert!(
            err.contains(
                "block.forward is 5e-324; a block's forward pass takes some time, at least 1e-9 s"
            ),
            "{err}"
        );
        // The backward pass run whole is the same work as the split one:
        // from half to twice it.
        let mut e = entry("x", 2, 1.0);
        e.block.fused_backward = Some(1e-9);
        let text = serde_json::to_string(&file(vec![e])).unwrap();
        let err = ProfileFile::from_json_str(&text).unwrap_err().to_string();
        assert!(
            err.contains(
                "block.fused_backward is 0.000000001; it is the same pass as block.backward (2)"
            ) && err.contains("from half to twice that"),
            "{err}"
        );
        let mut e = entry("x", 2, 1.0);
        e.block.held = Some(Held {
            forward: e.block.forward * 1.01,
            backward: e.block.backward * 3.0,
        });
        let err = ProfileFile::from_json_str(&serde_json::to_string(&file(vec![e])).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("block.held.backward is 6; it is the same pass as block.backward (2)")
                && err.contains("another micro-batch in flight"),
            "{err}"
        );
        // Only the block's held and fused passes are read: elsewhere they
        // are refused, not ignored.
        for field in ["held", "fused_backward"] {
            let mut v = serde_json::to_value(file(vec![entry("x", 2, 1.0)])).unwrap();
            v["entries"][0]["head"][field] = match field {
                "held" => serde_json::json!({"forward": 1.0, "backward": 2.0}),
                _ => serde_json::json!(2.0),
            };
            let err = ProfileFile::from_json_str(&v.to_string())
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!(
                    "head.{field} is given, but only the block's {field}"
                )),
                "{err}"
            );
        }
        // serde's type names are said as what the file holds there.
        let mut v = serde_json::to_value(file(vec![entry("x", 2, 1.0)])).unwrap();
        v["entries"][0]["stage_overhead"] = "x".into();
        let err = ProfileFile::from_json_str(&v.to_string())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("expected an object of seconds {\"forward\": .., \"backward\": ..} at")
                && !err.contains("struct"),
            "{err}"
        );
        // A fixed cost per stage: seconds as the parts, added once a stage.
        let mut e = entry("x", 2, 1.0);
        e.stage_overhead = Some(StageOverhead {
            forward: -1.0,
            backward: 0.0,
        });
        let text = serde_json::to_string(&file(vec![e.clone()])).unwrap();
        let err = ProfileFile::from_json_str(&text).unwrap_err().to_string();
        assert!(
            err.contains("stage_overhead.forward is -1; it must be seconds"),
            "{err}"
        );
        e.stage_overhead = Some(StageOverhead {
            forward: 0.5,
            backward: 0.25,
        });
        let text = serde_json::to_string(&file(vec![e])).unwrap();
        let parsed = ProfileFile::from_json_str(&text).unwrap();
        let c = parsed.entries[0].costs("x:0");
        assert_eq!((c.stage_forward, c.stage_backward), (0.5, 0.25));
    }

    /// A profile's blocks are one chip's: under expert parallelism the
    /// token exchange (priced by the cost model) comes on top of them,
    /// twice each way a block, and the rest is the measured passes.
    #[test]
    fn expert_parallelism_adds_its_exchange_to_measured_blocks() {
        let mut c = three_vendor();
        let model = ModelSpec::mixtral_8x7b();
        let name = c.chip_types[0].name.clone();
        let profile = ProfileFile {
            model: model.clone(),
            ..file(vec![entry(&name, 1, 0.05)])
        };
        c.apply_profile(&profile, &model, &bf16()).unwrap();
        let chip = &c.chip_types[0];
        let shape = crate::cost::StageShape {
            chip,
            layers: 4..8,
            index: 1,
            num_stages: 4,
            dp: 8,
            tp: 1,
            next: None,
            dp_peers: &[],
            dp_one_node: false,
        };
        let mb = crate::cost::Microbatching { size: 1, count: 8 };
        let mut s = bf16();
        let local = crate::cost::stage_timing(&model, &s, &c, &shape, mb);
        s.expert_parallel = 8;
        let spread = crate::cost::stage_timing(&model, &s, &c, &shape, mb);
        let exchange = 4.0 * 2.0 * crate::cost::expert_all_to_all_time(&model, &s, chip, 1, 1);
        assert!(exchange > 0.0);
        // The measured blocks: 4 of 0.05 s forward, 0.1 s backward.
        assert!((local.forward - 0.2).abs() < 1e-12, "{}", local.forward);
        assert!((spread.forward - local.forward - exchange).abs() < 1e-12);
        assert!((spread.backward - local.backward - exchange).abs() < 1e-12);
        // The optimizer updates a chip's share: an eighth of the experts.
        assert!(spread.optimizer < local.optimizer / 4.0);
    }
}

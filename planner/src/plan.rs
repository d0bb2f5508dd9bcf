//! A training plan and its predictions: data-parallel groups of identical
//! pipelines (stages of one chip type each, a tensor-parallel degree inside a
//! node, a layer range), micro-batching, and the predicted step time
//! (analytic and simulated), tokens/s, MFU and memory per stage, and bubble
//! fraction. Serializes to JSON.
//!
//! A HeteroPP plan has one [`Replica`] group: `copies` identical pipelines
//! that each process `global_batch / copies` sequences. A mixed plan (the
//! relaxation "mixed-type data-parallel groups, batch split in proportion to
//! speed") has several groups with different pipelines and micro-batch
//! counts; all replicas of all groups share one gradient all-reduce (their
//! stages are costed with `dp` = all replicas), and the step ends when the
//! slowest group has finished.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cost::MemoryBreakdown;
#[cfg(doc)]
use crate::model::ModelSpec;
use crate::schedule::{PipelineSchedule, Schedule, StageTiming};
use crate::sim::{self, SimResult};

/// One pipeline stage of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StagePlan {
    /// The chip type of all its chips.
    pub chip: String,
    /// Chips per replica of this stage, all in one node: the tensor-parallel
    /// degree `t`.
    pub tp: u64,
    /// First layer, 0-based.
    pub first_layer: u64,
    /// One past the last layer.
    pub end_layer: u64,
    /// The multi-token-prediction layers it runs after its layers (the
    /// last stage, of a model with some: [`ModelSpec::mtp_layers`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mtp_layers: u64,
    /// Memory of one of its chips.
    pub memory: MemoryBreakdown,
    /// Memory of one of its chips, bytes.
    pub memory_capacity: u64,
    /// Model FLOPs the stage executes per step (forward and backward, no
    /// recomputation) over the step time times the peak of its `tp` chips.
    pub mfu: f64,
    /// Its costs per micro-batch and per step.
    pub timing: StageTiming,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The most stage passes (stages times micro-batches of one replica) a
/// Chrome trace of a plan shows ([`Plan::chrome_trace`]): about four events
/// each, so some 250 MB of JSON at most.
pub const MAX_TRACE_PASSES: u64 = 500_000;

/// `copies` identical pipelines (data-parallel replicas).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Replica {
    /// Identical replicas of this pipeline.
    pub copies: u64,
    /// Its stages, first to last.
    pub stages: Vec<StagePlan>,
    /// Sequences per micro-batch (`b`).
    pub micro_batch_size: u64,
    /// Micro-batches per step per replica (`m`).
    pub micro_batches: u64,
    /// Sequences per step over all copies: `copies * b * m`.
    pub sequences: u64,
    /// Analytic 1F1B step time of one replica, seconds.
    pub step_time_analytic: f64,
    /// Simulated step time of one replica, seconds.
    pub step_time_simulated: f64,
    /// Bubble fraction of the simulated step.
    pub bubble_fraction: f64,
    /// The schedule its stages run.
    #[serde(default)]
    pub pipeline: PipelineSchedule,
    /// Model chunks per device under the interleaved schedule (1: not
    /// interleaved). Above 1, `stages` are the chunks in model order, chunk
    /// `k` on the pipeline's device `k mod (stages / virtual_stages)`, and
    /// each chunk's `memory` is its device's: all its chunks'
    /// ([`crate::schedule::Schedule::virtual_stages`]).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub virtual_stages: u64,
    /// How far each stage runs ahead of the next, as a multiple of the
    /// schedule's lead ([`crate::schedule::Schedule::run_ahead`]).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub run_ahead: u64,
}

fn one() -> u64 {
    1
}

fn is_one(v: &u64) -> bool {
    *v == 1
}

/// Whether stage `index` of a pipeline of `stages` may hold no layer,
/// `first..first`: the first stage the embedding alone (at layer 0), the
/// last the final norm and head alone (at `layers`), beside at least one
/// other stage. The one rule for trainer plans and evaluated plans alike.
pub fn holds_one_end_alone(index: usize, stages: usize, first: u64, layers: u64) -> bool {
    stages > 1 && ((index == 0 && first == 0) || (index + 1 == stages && first == layers))
}

impl Replica {
    /// The schedule the simulator runs.
    pub fn schedule(&self) -> Schedule {
        Schedule {
            stages: self.stages.iter().map(|s| s.timing.clone()).collect(),
            microbatches: self.micro_batches as usize,
            pipeline: self.pipeline,
            virtual_stages: self.virtual_stages.max(1) as usize,
            run_ahead: self.run_ahead.max(1) as usize,
        }
    }

    /// Simulates one step of this pipeline.
    pub fn simulate(&self) -> SimResult {
        sim::simulate(&self.schedule())
    }

    /// Devices (pipeline stages) of one copy: its stages, or under
    /// interleaving its chunks over `virtual_stages`.
    pub fn devices(&self) -> usize {
        self.stages.len() / self.virtual_stages.max(1) as usize
    }

    /// Chips over all copies.
    pub fn chips(&self) -> u64 {
        let devices = &self.stages[..self.devices()];
        self.copies * devices.iter().map(|s| s.tp).sum::<u64>()
    }
}

/// How a plan was formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlanKind {
    /// One pipeline (stages of one type each), `dp` identical replicas.
    HeteroPp,
    /// Several groups of replicas, each its own pipeline, the batch split in
    /// proportion to speed.
    MixedReplicas,
}

/// A whole plan and its predictions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The model's name.
    pub model: String,
    /// How the plan was formed.
    pub kind: PlanKind,
    /// Data-parallel replicas over all groups.
    pub dp: u64,
    /// Groups of identical replicas (one for a HeteroPP plan).
    pub replicas: Vec<Replica>,
    /// Sequences per step.
    pub global_batch: u64,
    /// Sequence length (tokens per sequence).
    pub seq_len: u64,
    /// Analytic step time: the slowest group's, seconds.
    pub step_time_analytic: f64,
    /// Simulated step time: the slowest group's, seconds.
    pub step_time_simulated: f64,
    /// `global_batch * seq_len / step_time_analytic`.
    pub tokens_per_s: f64,
    /// `global_batch * seq_len / step_time_simulated`.
    pub tokens_per_s_simulated: f64,
    /// Bubble fraction of the slowest group's simulated step.
    pub bubble_fraction: f64,
    /// Model FLOPs per step over (simulated step time times the peak of
    /// every chip used).
    pub mfu: f64,
    /// Chips the plan uses.
    pub chips_used: u64,
}

impl Plan {
    /// Whether every stage's memory fits its chips.
    pub fn fits(&self) -> bool {
        self.replicas.iter().all(|r| {
            r.stages
                .iter()
                .all(|s| s.memory.total <= s.memory_capacity as f64)
        })
    }

    /// The index of the slowest group (by simulated step time).
    pub fn slowest_group(&self) -> usize {
        let mut best = 0;
        for (i, r) in self.replicas.iter().enumerate() {
            if r.step_time_simulated > self.replicas[best].step_time_simulated {
                best = i;
            }
        }
        best
    }

    /// A Chrome trace of the slowest group's simulated step (one replica);
    /// refused, with the reason, when that replica runs more than
    /// [`MAX_TRACE_PASSES`] micro-batches through its stages (the trace
    /// would take gigabytes to build and could not be opened).
    pub fn chrome_trace(&self) -> Result<Value, String> {
        let r = &self.replicas[self.slowest_group()];
        let passes = (r.stages.len() as u64).saturating_mul(r.micro_batches);
        if passes > MAX_TRACE_PASSES {
            return Err(format!(
                "the plan's slowest replica runs {} micro-batches through {} stages ({passes} \
                 stage passes), more than the {MAX_TRACE_PASSES} a trace may show; trace a plan \
                 with fewer micro-batches or stages",
                r.micro_batches,
                r.stages.len()
            ));
        }
        let names: Vec<String> = r.stages.iter().map(|s| s.timing.name.clone()).collect();
        Ok(sim::chrome_trace(&r.simulate(), &names))
    }
}

//! `--plan auto`: HeteroAuto on the devices at hand. Each vendor's device
//! is profiled on the real model (forward and backward of a micro-batch
//! through one and two blocks, so the per-block time and the fixed cost of
//! embedding and head separate), the planner gets a cluster whose chips
//! sustain the measured FLOP/s, and its plan becomes the job's layout.

use std::time::Instant;

use polychip_host::Device;
use polychip_planner::cluster::{ChipType, ClusterSpec, PeakFlops};
use polychip_planner::search::{self, PlanOptions, PlanReport};
use polychip_planner::settings::{Dtype, TrainingSettings};

use crate::config::{ModelConfig, Precision};
use crate::data::{Corpus, Split};
use crate::error::{Result, TrainError};
use crate::model::{Stage, StageInput};
use crate::params::StageRange;
use crate::plan::{GroupPlan, StagePlan, TrainPlan};
use crate::trainer::device_name;

/// A device kind's measured speed on this model.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// The vendor (the planner's chip type name).
    pub vendor: String,
    /// The device profiled.
    pub device: String,
    /// Forward plus backward of one block for one micro-batch, seconds.
    pub block_seconds: f64,
    /// Forward plus backward of the embedding, final norm, head and loss.
    pub ends_seconds: f64,
    /// The micro-batch size profiled.
    pub micro_batch: usize,
    /// Model FLOP/s one block sustains (Megatron's count).
    pub sustained_flops: f64,
}

fn time_passes(stage: &Stage, cfg: &ModelConfig, b: usize, reps: usize) -> Result<f64> {
    let corpus = Corpus::bundled();
    let (tokens, targets) = corpus.batch(Split::Train, 0, 0, 0, b, cfg.seq_len);
    let dev = stage.device();
    let mut times = Vec::new();
    for _ in 0..reps + 1 {
        let x = dev.from_slice(&tokens, &[b as i64, cfg.seq_len as i64])?;
        let t = dev.from_slice(&targets, &[(b * cfg.seq_len) as i64])?;
        let start = Instant::now();
        let (saved, _, _) = stage.forward(StageInput::Tokens(x), Some(t))?;
        stage.backward(saved, None, 1.0)?;
        times.push(start.elapsed().as_secs_f64());
    }
    times.remove(0);
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Profiles `device` on `cfg` with micro-batches of `b` sequences.
pub fn profile(
    cfg: &ModelConfig,
    precision: Precision,
    device: &Device,
    b: usize,
) -> Result<Profile> {
    let range = |blocks| StageRange {
        first_layer: 0,
        end_layer: blocks,
        embed: true,
        head: true,
    };
    let blocks = cfg.layers.min(2);
    let one = Stage::new(cfg, range(1), precision, device, 0)?;
    let t1 = time_passes(&one, cfg, b, 5)?;
    drop(one);
    let (block, ends) = if blocks == 2 {
        let two = Stage::new(cfg, range(2), precision, device, 0)?;
        let t2 = time_passes(&two, cfg, b, 5)?;
        let block = (t2 - t1).max(t1 * 0.05);
        (block, (t1 - block).max(0.0))
    } else {
        (t1, 0.0)
    };
    let flops = 3.0 * cfg.planner_spec().layer_forward_flops(b as u64);
    Ok(Profile {
        vendor: device.plugin().vendor().to_lowercase(),
        device: device_name(device),
        block_seconds: block,
        ends_seconds: ends,
        micro_batch: b,
        sustained_flops: flops / block,
    })
}

/// Which layouts `--plan auto` may choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoMode {
    /// The fastest of all (`auto`).
    Best,
    /// One pipeline whose stages mix types (HeteroPP only, `auto-pp`).
    Pipeline,
    /// Data-parallel groups of one type each, the batch split by speed
    /// (`auto-dp`).
    Replicas,
}

impl AutoMode {
    /// Parses `auto`, `auto-pp` or `auto-dp`.
    pub fn parse(s: &str) -> Option<AutoMode> {
        match s {
            "auto" => Some(AutoMode::Best),
            "auto-pp" => Some(AutoMode::Pipeline),
            "auto-dp" => Some(AutoMode::Replicas),
            _ => None,
        }
    }
}

/// Plans `cfg` over `devices` (any mix of vendors) for `global_batch`
/// sequences per step: profiles one device per vendor, then runs the
/// HeteroAuto search. Returns the plan, the planner's report and the profiles.
pub fn auto_plan(
    cfg: &ModelConfig,
    precision: Precision,
    devices: &[Device],
    global_batch: usize,
    mode: AutoMode,
) -> Result<(TrainPlan, PlanReport, Vec<Profile>)> {
    if devices.is_empty() {
        return Err(TrainError::Plan(
            "--plan auto: no devices to plan over".into(),
        ));
    }
    let b = [4, 2, 1]
        .into_iter()
        .find(|b| global_batch % b == 0)
        .unwrap_or(1);
    let mut profiles: Vec<Profile> = Vec::new();
    let mut chips: Vec<ChipType> = Vec::new();
    for d in devices {
        let vendor = d.plugin().vendor().to_lowercase();
        if let Some(c) = chips.iter_mut().find(|c| c.name == vendor) {
            c.count += 1;
            c.memory_bytes = c.memory_bytes.min(d.props().memory_bytes);
            continue;
        }
        let p = profile(cfg, precision, d, b)?;
        let link = d.props().link_bandwidth;
        chips.push(ChipType {
            name: vendor,
            count: 1,
            chips_per_node: 1,
            memory_bytes: d.props().memory_bytes,
            peak_flops: PeakFlops {
                f32: p.sustained_flops,
                bf16: p.sustained_flops,
                f16: p.sustained_flops,
            },
            efficiency: 1.0,
            intra_node_bandwidth: if link > 0.0 { link } else { 2e9 },
            nic_bandwidth: 2e9,
            memory_bandwidth: None,
        });
        profiles.push(p);
    }
    let cluster = ClusterSpec {
        chip_types: chips,
        inter_node_bandwidth: 2e9,
    };
    let mut settings = TrainingSettings::new(global_batch as u64);
    settings.dtype = match precision {
        Precision::F32 => Dtype::F32,
        Precision::Bf16 => Dtype::Bf16,
    };
    // The profiled micro-batch size only: a chip's speed depends on it (a
    // slow chip's fixed per-op costs weigh more on small micro-batches), and
    // the planner's cost model assumes one sustained rate per chip.
    settings.micro_batch_sizes = vec![b as u64];
    let report = search::plan(
        &cfg.planner_spec(),
        &cluster,
        &settings,
        &PlanOptions {
            mixed_replicas: mode != AutoMode::Pipeline,
            heteropp: mode != AutoMode::Replicas,
            ..PlanOptions::default()
        },
    )
    .map_err(|e| TrainError::Plan(format!("--plan auto: {e}")))?;
    let plan = from_planner(&report.plan)?;
    Ok((plan, report, profiles))
}

/// The planner's plan as a training layout (chip types are vendor names).
pub fn from_planner(plan: &polychip_planner::plan::Plan) -> Result<TrainPlan> {
    let mut groups = Vec::new();
    for r in &plan.replicas {
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
                layers: [s.first_layer as usize, s.end_layer as usize],
            });
        }
        groups.push(GroupPlan {
            copies: r.copies as usize,
            micro_batch_size: r.micro_batch_size as usize,
            micro_batches: r.micro_batches as usize,
            stages,
        });
    }
    Ok(TrainPlan {
        groups,
        predicted_step_seconds: Some(plan.step_time_simulated),
    })
}

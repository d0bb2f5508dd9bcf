//! How much device memory a stage needs, counted from the tensors the model
//! actually allocates (the counts are the planner's
//! `framework::polychip`, so that its predictions and this check agree),
//! and the check that refuses a plan before training
//! when a stage does not fit (naming the stage and the shortfall).

use polychip_host::Device;
use polychip_planner::schedule::PipelineSchedule;

use polychip_planner::framework::polychip as counts;

use crate::config::{ModelConfig, Precision};
use crate::error::{Result, TrainError};
use crate::params::{StageRange, stage_params};
use crate::plan::Role;

/// A stage's memory, bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageMemory {
    /// Weights, gradients, AdamW state (and bf16 copies).
    pub state: u64,
    /// Activations kept for the backward pass, all micro-batches in flight.
    pub activations: u64,
    /// The largest transient buffers of one pass.
    pub transient: u64,
}

impl StageMemory {
    /// Everything.
    pub fn total(&self) -> u64 {
        self.state + self.activations + self.transient
    }
}

/// The memory of `range` with `in_flight` micro-batches of `b` sequences.
pub fn stage_memory(
    cfg: &ModelConfig,
    precision: Precision,
    range: &StageRange,
    b: usize,
    in_flight: usize,
) -> StageMemory {
    let params: usize = stage_params(cfg, range).iter().map(|p| p.numel()).sum();
    let c = precision.dtype().size() as u64;
    let shape = counts::Shape {
        hidden: cfg.dim as u64,
        kv_dim: (cfg.kv_heads * cfg.head_dim()) as u64,
        ffn: cfg.ffn as u64,
        heads: cfg.heads as u64,
        vocab: cfg.vocab as u64,
    };
    let tokens = (b * cfg.seq_len) as u64;
    // Each half's activations; a feed-forward half held in part keeps those
    // of its own columns.
    let mut per_micro = counts::micro_batch_bytes(tokens);
    for h in range.halves() {
        per_micro += match h % 2 {
            0 => {
                // The heads held (their q, k, v and output; the input and
                // normed input whole).
                let kv = range.held(h, cfg.kv_heads).len();
                let part = counts::Shape {
                    kv_dim: (kv * cfg.head_dim()) as u64,
                    heads: (kv * cfg.heads / cfg.kv_heads.max(1)) as u64,
                    ..shape
                };
                counts::attention_bytes(part, tokens, c)
            }
            _ => {
                let cols = range.held(h, cfg.ffn).len() as u64;
                counts::feed_forward_bytes(counts::Shape { ffn: cols, ..shape }, tokens, c)
            }
        };
    }
    if range.head {
        per_micro += counts::head_bytes(shape, tokens, c);
    }
    StageMemory {
        state: params as u64 * counts::state_bytes_per_param(c),
        activations: per_micro * in_flight as u64,
        transient: counts::transient_bytes(shape, tokens, c),
    }
}

/// Set to `1` to skip [`check_role`]: a stage that does not fit then fails
/// when the device refuses an allocation, as an unchecked framework's
/// would (the planner's validation measures that outcome).
pub const NO_CHECK_VAR: &str = "POLYCHIP_TRAIN_NO_MEMORY_CHECK";

fn unchecked() -> bool {
    std::env::var(NO_CHECK_VAR).is_ok_and(|v| v == "1")
}

/// What `role`'s stage needs under `schedule`, running `ahead` times its
/// lead ahead.
fn role_need(
    cfg: &ModelConfig,
    precision: Precision,
    role: &Role,
    schedule: PipelineSchedule,
    ahead: usize,
) -> StageMemory {
    let in_flight = schedule.in_flight(role.stage, role.stages, role.micro_batches, ahead);
    stage_memory(
        cfg,
        precision,
        &role.range,
        role.micro_batch_size,
        in_flight,
    )
}

/// [`check_role`]'s test against `have` bytes (true when [`NO_CHECK_VAR`]
/// is `1`), for a role on another rank's device.
pub fn role_fits(
    cfg: &ModelConfig,
    precision: Precision,
    role: &Role,
    schedule: PipelineSchedule,
    ahead: usize,
    have: u64,
) -> bool {
    unchecked() || role_need(cfg, precision, role, schedule, ahead).total() <= have
}

/// Refuses a role whose stage does not fit its device under `schedule`,
/// running `ahead` times its lead ahead (unless [`NO_CHECK_VAR`] is `1`).
pub fn check_role(
    cfg: &ModelConfig,
    precision: Precision,
    role: &Role,
    schedule: PipelineSchedule,
    ahead: usize,
    device: &Device,
) -> Result<()> {
    if unchecked() {
        return Ok(());
    }
    let in_flight = schedule.in_flight(role.stage, role.stages, role.micro_batches, ahead);
    let need = role_need(cfg, precision, role, schedule, ahead);
    let have = device.props().memory_bytes;
    if need.total() > have {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        return Err(TrainError::Plan(format!(
            "stage {} of replica {} ({}, blocks {}..{}) needs {:.1} MiB (weights and optimizer \
             {:.1} MiB, activations of {in_flight} {} of {} sequences {:.1} MiB, \
             work buffers {:.1} MiB) but the device has {:.1} MiB: {:.1} MiB short; give it \
             fewer blocks, smaller or fewer micro-batches",
            role.stage,
            role.replica,
            role.device,
            role.range.start,
            role.range.end,
            mib(need.total()),
            mib(need.state),
            if in_flight == 1 {
                "micro-batch"
            } else {
                "micro-batches"
            },
            role.micro_batch_size,
            mib(need.activations),
            mib(need.transient),
            mib(have),
            mib(need.total() - have)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use polychip_planner::cluster::{ChipType, Framework, PeakFlops};
    use polychip_planner::cost::{Microbatching, StageShape, stage_memory as planned};
    use polychip_planner::settings::{Dtype, TrainingSettings};

    /// The planner's count for a chip under `polychip train` is the
    /// trainer's own, term by term: what it predicts to fit passes this
    /// check, and what it predicts not to fit is refused by it.
    #[test]
    fn the_planners_count_for_polychip_chips_is_the_trainers() {
        let chip = ChipType {
            name: "X".into(),
            count: 4,
            chips_per_node: 4,
            memory_bytes: 1 << 30,
            peak_flops: PeakFlops {
                f32: 1e12,
                bf16: 1e12,
                fp8: None,
                f16: 1e12,
            },
            efficiency: 0.5,
            intra_node_bandwidth: 1e10,
            nic_bandwidth: 1e10,
            nics_per_node: None,
            memory_bandwidth: None,
            memory_reserve_bytes: Some(0),
            matmul_workspace_bytes: Some(0),
            kernel_dispatch_seconds: Some(0.0),
            framework: Framework::Polychip,
            devices: Vec::new(),
            measured: Vec::new(),
        };
        for (name, precision, dtype) in [
            ("tiny", Precision::F32, Dtype::F32),
            ("deep", Precision::F32, Dtype::F32),
            ("small", Precision::Bf16, Dtype::Bf16),
        ] {
            let cfg = ModelConfig::preset(name).unwrap();
            let spec = cfg.planner_spec();
            let mut settings = TrainingSettings::new(8);
            settings.dtype = dtype;
            let n = cfg.layers;
            // (first, end, stage index, stages, micro-batches)
            for (first, end, index, stages, m) in [
                (0, n, 0, 1, 4),
                (0, n / 2, 0, 2, 4),
                (n / 2, n, 1, 2, 4),
                (1, n - 1, 1, 3, 2),
            ] {
                for b in [1usize, 2, 4] {
                    let range = StageRange {
                        embed: index == 0,
                        head: index + 1 == stages,
                        ..StageRange::new(first, end, n)
                    };
                    let in_flight = (stages - index).min(m);
                    let want = stage_memory(&cfg, precision, &range, b, in_flight);
                    let shape = StageShape {
                        chip: &chip,
                        layers: first as u64..end as u64,
                        index,
                        num_stages: stages,
                        dp: 1,
                        tp: 1,
                        next: None,
                        dp_peers: &[],
                        dp_one_node: true,
                    };
                    let mb = Microbatching {
                        size: b as u64,
                        count: m as u64,
                    };
                    let got = planned(&spec, &settings, &shape, mb);
                    let what =
                        format!("{name} blocks {first}..{end} of stage {index}/{stages}, b {b}");
                    assert_eq!(
                        (got.activations + got.logits) as u64,
                        want.activations,
                        "{what}"
                    );
                    assert_eq!(got.workspace as u64, want.transient, "{what}");
                    let state = got.weights + got.gradients + got.optimizer;
                    let rel = (state - want.state as f64).abs() / want.state as f64;
                    // The planner counts the norms of every stage alike.
                    assert!(rel < 2e-3, "{what}: state {state} against {}", want.state);
                }
            }
        }
    }
}

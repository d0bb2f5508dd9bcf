//! How much device memory a stage needs, counted from the tensors the model
//! actually allocates, and the check that refuses a plan before training
//! when a stage does not fit (naming the stage and the shortfall).

use polychip_host::Device;

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
    let c = precision.dtype().size();
    // value + exp_avg + exp_avg_sq (f32) + grad (compute), + bf16 copy and f32 grad.
    let per_param = 12
        + c
        + if precision == Precision::Bf16 {
            2 + 4
        } else {
            0
        };
    let (s, d, f) = (cfg.seq_len, cfg.dim, cfg.ffn);
    let kv = cfg.kv_heads * cfg.head_dim();
    let tokens = b * s;
    // Saved per block: x, h1, q, k, v, attn, x2, h2, gate, up, act (compute)
    // and inv1, inv2, lse (f32).
    let block = tokens * (6 * d + 2 * kv + 3 * f) * c + tokens * (2 + cfg.heads) * 4;
    let mut per_micro = block * range.layers().len() + tokens * 4;
    if range.head {
        per_micro += tokens * (2 * d + cfg.vocab) * c + tokens * 8;
    }
    let transient = tokens * (3 * f.max(cfg.vocab) + 4 * d) * c;
    StageMemory {
        state: (params * per_param) as u64,
        activations: (per_micro * in_flight) as u64,
        transient: transient as u64,
    }
}

/// Set to `1` to skip [`check_role`]: a stage that does not fit then fails
/// when the device refuses an allocation, as an unchecked framework's
/// would (the planner's validation measures that outcome).
pub const NO_CHECK_VAR: &str = "POLYCHIP_TRAIN_NO_MEMORY_CHECK";

/// Refuses a role whose stage does not fit its device (unless
/// [`NO_CHECK_VAR`] is `1`).
pub fn check_role(
    cfg: &ModelConfig,
    precision: Precision,
    role: &Role,
    device: &Device,
) -> Result<()> {
    if std::env::var(NO_CHECK_VAR).is_ok_and(|v| v == "1") {
        return Ok(());
    }
    let in_flight = (role.stages - role.stage).min(role.micro_batches);
    let need = stage_memory(
        cfg,
        precision,
        &role.range,
        role.micro_batch_size,
        in_flight,
    );
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
            role.range.first_layer,
            role.range.end_layer,
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

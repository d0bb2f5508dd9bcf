//! Unit tests of the cost model against hand-computed numbers for the
//! Llama-2-70B shape (s = 4096, h = 8192, a = 64, so `s b h` = 33,554,432
//! at b = 1, and one layer holds 855,654,400 parameters).

use super::*;
use crate::settings::Dtype;

const SBH: f64 = 33_554_432.0;
const LAYER: f64 = 855_654_400.0;

fn close(got: f64, want: f64) {
    assert!(
        (got - want).abs() <= want.abs() * 1e-12,
        "got {got}, want {want}"
    );
}

fn chip(name: &str, nic: f64) -> ChipType {
    ChipType {
        name: name.into(),
        count: 64,
        chips_per_node: 8,
        memory_bytes: 80_000_000_000,
        peak_flops: crate::cluster::PeakFlops {
            f32: 0.25e15,
            bf16: 1e15,
            f16: 1e15,
        },
        efficiency: 0.5,
        intra_node_bandwidth: 100e9,
        nic_bandwidth: nic,
        memory_bandwidth: Some(2e12),
        devices: Vec::new(),
        measured: Vec::new(),
    }
}

fn cluster() -> ClusterSpec {
    ClusterSpec {
        chip_types: vec![chip("X", 25e9), chip("Y", 50e9)],
        inter_node_bandwidth: 12.5e9,
    }
}

fn shape(c: &ClusterSpec, layers: Range<u64>, index: usize, dp: u64, tp: u64) -> StageShape<'_> {
    StageShape {
        chip: &c.chip_types[0],
        layers,
        index,
        num_stages: 4,
        dp,
        tp,
        next: None,
    }
}

const ONE: Microbatching = Microbatching { size: 1, count: 8 };

#[test]
fn model_state_bytes_per_parameter() {
    let (m, c) = (ModelSpec::llama_70b(), cluster());
    let mut s = TrainingSettings::new(64);
    let st = shape(&c, 10..20, 1, 4, 1);
    let params = 10.0 * LAYER;
    let mem = |s: &TrainingSettings, st: &StageShape| {
        let x = stage_memory(&m, s, st, ONE);
        x.weights + x.gradients + x.optimizer
    };
    close(mem(&s, &st), 18.0 * params);
    s.bf16_gradients = true;
    close(mem(&s, &st), 16.0 * params);
    s.bf16_gradients = false;
    s.shard_optimizer = true;
    close(mem(&s, &st), (6.0 + 12.0 / 4.0) * params);
    close(mem(&s, &shape(&c, 10..20, 1, 4, 8)), 9.0 * params / 8.0);
    // The first stage also holds the embedding, the last the head.
    assert_eq!(stage_params(&m, &(0..1)), 855_654_400 + 262_144_000);
    assert_eq!(stage_params(&m, &(79..80)), 855_654_400 + 262_152_192);
    assert_eq!(stage_params(&m, &(0..80)), m.total_params());
}

#[test]
fn activation_bytes_per_layer() {
    let m = ModelSpec::llama_70b();
    let mut s = TrainingSettings::new(64);
    s.flash_attention = false;
    // s b h (34 + 5 a s / h) / t = 33,554,432 * (34 + 160) / 8
    close(layer_activation_bytes(&m, &s, 1, 8), 813_694_976.0);
    close(layer_activation_bytes(&m, &s, 2, 1), 2.0 * SBH * 194.0);
    s.recompute = Recompute::Selective;
    close(layer_activation_bytes(&m, &s, 1, 8), 142_606_336.0); // 34 s b h / t
    s.recompute = Recompute::None;
    s.flash_attention = true;
    close(layer_activation_bytes(&m, &s, 1, 8), 142_606_336.0);
    s.recompute = Recompute::Full;
    close(layer_activation_bytes(&m, &s, 1, 8), 67_108_864.0); // 2 s b h
    s.recompute = Recompute::None;
    s.dtype = Dtype::F32;
    close(layer_activation_bytes(&m, &s, 1, 8), 2.0 * 142_606_336.0);
}

#[test]
fn one_f_one_b_first_stage_keeps_the_most() {
    assert_eq!(
        (0..4)
            .map(|i| inflight_microbatches(i, 4, 8))
            .collect::<Vec<_>>(),
        [4, 3, 2, 1]
    );
    assert_eq!(
        (0..4)
            .map(|i| inflight_microbatches(i, 4, 2))
            .collect::<Vec<_>>(),
        [2, 2, 2, 1]
    );
    let (m, c, s) = (ModelSpec::llama_70b(), cluster(), TrainingSettings::new(64));
    let acts: Vec<f64> = (0..4)
        .map(|i| stage_memory(&m, &s, &shape(&c, 10..20, i, 1, 8), ONE).activations)
        .collect();
    close(acts[0], 10.0 * 4.0 * 142_606_336.0);
    close(acts[3], 10.0 * 142_606_336.0);
    assert!(acts.windows(2).all(|w| w[0] > w[1]));
    let mut full = s.clone();
    full.recompute = Recompute::Full;
    let x = stage_memory(&m, &full, &shape(&c, 10..20, 0, 1, 8), ONE);
    close(x.activations, 40.0 * 67_108_864.0 + 142_606_336.0);
    close(
        x.total,
        x.weights + x.gradients + x.optimizer + x.activations,
    );
}

#[test]
fn compute_and_tensor_parallel_time() {
    let (m, c) = (ModelSpec::llama_70b(), cluster());
    let mut s = TrainingSettings::new(64);
    // One layer forward, b = 1: 4 b s h^2 (1 + 1/8 + 5.25 + 0.5).
    let layer = 7_559_142_440_960.0;
    close(m.layer_forward_flops(1), layer);
    let t = stage_timing(&m, &s, &c, &shape(&c, 10..20, 1, 1, 1), ONE);
    close(t.forward, 10.0 * layer / 0.5e15);
    close(t.backward, 2.0 * t.forward);
    assert_eq!((t.send_next, t.dp_allreduce), (0.0, 0.0));
    // t = 8: compute over 8 chips, plus 2 all-reduces of s b h bf16 per
    // layer each way: 2 * 7/8 * 67,108,864 B / 100 GB/s = 1.17440512 ms.
    let t8 = stage_timing(&m, &s, &c, &shape(&c, 10..20, 1, 1, 8), ONE);
    let ar = 1.75 * 2.0 * SBH / 100e9;
    close(ar, 1.174_405_12e-3);
    close(t8.forward, 10.0 * layer / 4e15 + 20.0 * ar);
    close(t8.backward, 20.0 * layer / 4e15 + 20.0 * ar);
    // The last stage adds the head: 2 b s h V.
    let last = stage_timing(&m, &s, &c, &shape(&c, 70..80, 3, 1, 1), ONE);
    close(last.forward, (10.0 * layer + 2_147_483_648_000.0) / 0.5e15);
    s.recompute = Recompute::Selective;
    let sel = stage_timing(&m, &s, &c, &shape(&c, 10..20, 1, 1, 1), ONE);
    close(
        sel.backward,
        (20.0 * layer + 10.0 * 549_755_813_888.0) / 0.5e15,
    );
    s.recompute = Recompute::Full;
    let full = stage_timing(&m, &s, &c, &shape(&c, 10..20, 1, 1, 1), ONE);
    close(full.backward, 30.0 * layer / 0.5e15);
}

#[test]
fn transfers_and_data_parallel_all_reduce() {
    let (m, c, s) = (ModelSpec::llama_70b(), cluster(), TrainingSettings::new(64));
    let mut st = shape(&c, 10..20, 1, 4, 1);
    st.next = Some(Boundary {
        chip: &c.chip_types[1],
        same_node: false,
    });
    let t = stage_timing(&m, &s, &c, &st, ONE);
    // 2 s b h bytes over min(25, 50, 12.5) GB/s.
    close(t.send_next, 2.0 * SBH / 12.5e9);
    // d = 4 fits a node of 8: 2 * 3/4 * params * 4 B / 100 GB/s.
    close(t.dp_allreduce, 1.5 * 10.0 * LAYER * 4.0 / 100e9);
    close(t.dp_allreduce, 0.513_392_64);
    // Optimizer: (4 + 2 + 2 * 12) B per parameter at 2 TB/s.
    close(t.optimizer, 10.0 * LAYER * 30.0 / 2e12);
    st.next = Some(Boundary {
        chip: &c.chip_types[0],
        same_node: true,
    });
    st.dp = 16; // 16 chips span two nodes: the cross-node path, 12.5 GB/s
    let t = stage_timing(&m, &s, &c, &st, ONE);
    close(t.send_next, 2.0 * SBH / 100e9);
    close(
        t.dp_allreduce,
        2.0 * 15.0 / 16.0 * 10.0 * LAYER * 4.0 / 12.5e9,
    );
    assert_eq!(t.name, "stage 1 (X x1, layers 10-19)");
}

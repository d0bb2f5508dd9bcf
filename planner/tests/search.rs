//! The search's properties (issue 5, "Checks") on randomized small clusters
//! (up to 32 chips, up to 3 types, up to 32 layers) from a deterministic
//! xorshift: the default search is within 2% of the exhaustive optimum in at
//! least 95% of cases and never returns a plan that does not fit; adding
//! chips never lowers the predicted throughput; a single-type cluster gives
//! a HeteroSpeedupRatio of exactly 1; an infeasible input names the
//! shortfall.

use polychip_planner::cluster::{ChipType, ClusterSpec, PeakFlops};
use polychip_planner::model::ModelSpec;
use polychip_planner::search::{PlanError, PlanOptions, PlanReport, plan};
use polychip_planner::settings::TrainingSettings;

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[(self.next() % v.len() as u64) as usize]
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

const GIB: u64 = 1 << 30;

fn chip(rng: &mut XorShift, name: String, budget: u64) -> Option<ChipType> {
    let cpn = rng.pick(&[1u64, 2, 4, 8]);
    if cpn > budget {
        return None;
    }
    let nodes = rng.range(1, (budget / cpn).min(4));
    let bf16 = 50e12 + rng.unit() * 350e12;
    Some(ChipType {
        name,
        count: nodes * cpn,
        chips_per_node: cpn,
        memory_bytes: rng.range(4, 48) * GIB,
        peak_flops: PeakFlops {
            f32: bf16 / 8.0,
            fp8: None,
            bf16,
            f16: bf16,
        },
        efficiency: 0.3 + 0.4 * rng.unit(),
        intra_node_bandwidth: rng.pick(&[32e9, 100e9, 300e9]),
        nic_bandwidth: rng.pick(&[12.5e9, 25e9]),
        nics_per_node: None,
        memory_bandwidth: Some(1e12 + rng.unit() * 1e12),
        memory_reserve_bytes: None,
        matmul_workspace_bytes: None,
        kernel_dispatch_seconds: None,
        framework: Default::default(),
        devices: Vec::new(),
        measured: Vec::new(),
    })
}

fn random_case(rng: &mut XorShift) -> (ClusterSpec, ModelSpec, TrainingSettings) {
    let ntypes = rng.range(1, 3);
    let mut types = Vec::new();
    let mut left = 32;
    for i in 0..ntypes {
        if let Some(c) = chip(rng, format!("t{i}"), left) {
            left -= c.count;
            types.push(c);
        }
    }
    if types.is_empty() {
        types.push(chip(rng, "t0".into(), 1).unwrap_or_else(|| {
            let mut c = chip(&mut XorShift(7), "t0".into(), 8).unwrap();
            c.count = 1;
            c.chips_per_node = 1;
            c
        }));
    }
    let cluster = ClusterSpec {
        chip_types: types,
        inter_node_bandwidth: 25e9,
    };
    let hidden = rng.pick(&[1024u64, 2048, 4096]);
    let model = ModelSpec {
        name: "random".into(),
        layers: rng.range(2, 32),
        hidden,
        ffn: hidden * 8 / 3 / 256 * 256,
        heads: hidden / 128,
        kv_heads: rng.pick(&[hidden / 128, 8]),
        vocab: 32000,
        seq_len: 2048,
        ..Default::default()
    };
    let settings = TrainingSettings::new(rng.pick(&[8u64, 16, 32, 64]));
    (cluster, model, settings)
}

fn quick(exhaustive: bool) -> PlanOptions {
    PlanOptions {
        exhaustive,
        speedup_ratio: false,
        ..PlanOptions::default()
    }
}

/// HeteroPP's rule alone: every type's chips in as many stages as fit.
fn heuristic_only() -> PlanOptions {
    PlanOptions {
        full_enumeration_budget: 0,
        ..quick(false)
    }
}

#[test]
fn default_is_within_two_percent_of_exhaustive_and_always_fits() {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let (mut cases, mut feasible) = (0, 0);
    // [default, heuristic only]: cases within 2%, worst ratio.
    let mut close = [0; 2];
    let mut worst = [1.0f64; 2];
    for _ in 0..250 {
        let (cluster, model, settings) = random_case(&mut rng);
        cases += 1;
        let ex = plan(&model, &cluster, &settings, &quick(true));
        for (j, opts) in [quick(false), heuristic_only()].iter().enumerate() {
            match (&ex, plan(&model, &cluster, &settings, opts)) {
                (Ok(ex), Ok(de)) => {
                    feasible += usize::from(j == 0);
                    assert!(ex.plan.fits() && de.plan.fits());
                    let r = de.plan.tokens_per_s / ex.plan.tokens_per_s;
                    worst[j] = worst[j].min(r);
                    close[j] += usize::from(r >= 0.98);
                }
                (Err(_), Err(_)) => close[j] += 1,
                (Ok(ex), Err(e)) => panic!("search found nothing ({e}), exhaustive {ex:?}"),
                (Err(e), Ok(_)) => panic!("exhaustive found nothing but the search did: {e}"),
            }
        }
    }
    eprintln!(
        "{cases} cases ({feasible} feasible): default {}/{cases} within 2% (worst {:.4}); HeteroPP rule only {}/{cases} (worst {:.4})",
        close[0], worst[0], close[1], worst[1]
    );
    assert!(feasible >= cases / 3, "only {feasible} of {cases} feasible");
    for c in close {
        assert!(c * 100 >= cases * 95, "{c}/{cases} within 2%");
    }
}

/// A mixture of experts whose first layers are dense: the search prices
/// its layers as expert ones and the first stage's dense ones apart;
/// every plan it keeps fits as the plan's own evaluation counts it, and
/// it stays within 2% of the exhaustive search.
#[test]
fn a_mixture_with_dense_first_layers_is_searched_and_fits() {
    let (cases, feasible, close) = searched_random_models(
        0x51ed_270b_a3c4_1f27,
        60,
        |rng, dense| {
            if dense.layers < 3 {
                return None;
            }
            let model = ModelSpec {
                experts: 8,
                experts_per_token: 2,
                ffn: dense.ffn / 2,
                dense_layers: rng.range(1, dense.layers / 2 + 1),
                dense_ffn: dense.ffn,
                ..dense
            };
            model.validate().unwrap();
            Some(model)
        },
        |_, _| {},
    );
    eprintln!("{cases} mixtures with dense first layers ({feasible} feasible): {close} within 2%");
    assert!(feasible >= cases / 3, "only {feasible} of {cases} feasible");
    assert!(close * 100 >= cases * 95, "{close}/{cases} within 2%");
}

/// A mixture of experts whose expert layers alternate with dense ones
/// (every second or third layer, from a random offset, after 0 to 2 dense
/// first ones): the search prices its layers as expert ones; every plan it
/// keeps fits as the plan's own evaluation counts it, and it stays within
/// 2% of the exhaustive search.
#[test]
fn a_mixture_with_dense_layers_between_expert_ones_is_searched_and_fits() {
    let (cases, feasible, close) = searched_random_models(
        0x6a09_e667_f3bc_c908,
        60,
        |rng, dense| {
            let step = rng.range(2, 4);
            let model = ModelSpec {
                experts: 8,
                experts_per_token: 2,
                ffn: dense.ffn / 2,
                dense_layers: rng.range(0, 3).min(dense.layers.saturating_sub(step)),
                dense_ffn: dense.ffn,
                moe_layer_step: step,
                moe_layer_offset: rng.range(0, step),
                ..dense
            };
            model.validate().is_ok().then_some(model)
        },
        |_, _| {},
    );
    eprintln!("{cases} alternating mixtures ({feasible} feasible): {close} within 2%");
    assert!(
        cases >= 30 && feasible >= cases / 3,
        "{feasible} of {cases} feasible"
    );
    assert!(close * 100 >= cases * 95, "{close}/{cases} within 2%");
}

/// Multi-token prediction's layers on the last stage: the search prices
/// them with the head; every plan it keeps fits as the plan's own
/// evaluation counts it, runs them on its last stage, and stays within 2%
/// of the exhaustive search.
#[test]
fn a_model_with_multi_token_prediction_is_searched_and_fits() {
    let (cases, feasible, close) = searched_random_models(
        0x3c6e_f372_fe94_f82b,
        40,
        |rng, dense| {
            let model = ModelSpec {
                mtp_layers: rng.range(1, 3),
                ..dense
            };
            model.validate().unwrap();
            Some(model)
        },
        |model, de| {
            for r in &de.plan.replicas {
                let last = r.stages.len() - 1;
                for (i, s) in r.stages.iter().enumerate() {
                    let want = if i == last { model.mtp_layers } else { 0 };
                    assert_eq!(s.mtp_layers, want, "{}", brief(de));
                }
            }
        },
    );
    eprintln!(
        "{cases} models with multi-token prediction ({feasible} feasible): {close} within 2%"
    );
    assert!(feasible >= cases / 3, "only {feasible} of {cases} feasible");
    assert!(close * 100 >= cases * 95, "{close}/{cases} within 2%");
}

/// `rounds` random cases (seeded by `seed`), each dense model made into
/// another by `build` (`None`: the case is skipped), each searched as
/// [`searched_as_exhaustive`] with `check` given the model: (cases
/// searched, feasible, within 2%).
fn searched_random_models(
    seed: u64,
    rounds: usize,
    mut build: impl FnMut(&mut XorShift, ModelSpec) -> Option<ModelSpec>,
    check: impl Fn(&ModelSpec, &PlanReport),
) -> (usize, usize, usize) {
    let mut rng = XorShift(seed);
    let (mut cases, mut feasible, mut close) = (0, 0, 0);
    for _ in 0..rounds {
        let (cluster, dense, settings) = random_case(&mut rng);
        let Some(model) = build(&mut rng, dense) else {
            continue;
        };
        cases += 1;
        let (f, c) = searched_as_exhaustive(&model, &cluster, &settings, |de| check(&model, de));
        (feasible, close) = (feasible + f, close + c);
    }
    (cases, feasible, close)
}

/// The search and the exhaustive search of one case: (1 if they found a
/// plan, 1 if the search's is within 2% of the exhaustive one's or both
/// found none), each plan found fitting by its own evaluation and the
/// search's passing `check`.
fn searched_as_exhaustive(
    model: &ModelSpec,
    cluster: &ClusterSpec,
    settings: &TrainingSettings,
    check: impl Fn(&PlanReport),
) -> (usize, usize) {
    let ex = plan(model, cluster, settings, &quick(true));
    match (ex, plan(model, cluster, settings, &quick(false))) {
        (Ok(ex), Ok(de)) => {
            assert!(ex.plan.fits() && de.plan.fits(), "{}", brief(&de));
            check(&de);
            (
                1,
                usize::from(de.plan.tokens_per_s >= 0.98 * ex.plan.tokens_per_s),
            )
        }
        (Err(_), Err(_)) => (0, 1),
        (Ok(_), Err(e)) => panic!("search found nothing ({e})"),
        (Err(e), Ok(_)) => panic!("exhaustive found nothing but the search did: {e}"),
    }
}

fn brief(r: &PlanReport) -> String {
    let p = &r.plan;
    let groups: Vec<String> = p
        .replicas
        .iter()
        .map(|g| {
            let st: Vec<String> = g
                .stages
                .iter()
                .map(|s| format!("{}x{}:{}", s.chip, s.tp, s.end_layer - s.first_layer))
                .collect();
            format!(
                "{}x[{}] b{} m{}",
                g.copies,
                st.join(" "),
                g.micro_batch_size,
                g.micro_batches
            )
        })
        .collect();
    format!("{:?} {}", p.kind, groups.join(" | "))
}

#[test]
fn adding_chips_never_lowers_throughput() {
    let mut rng = XorShift(0x1234_5678_9abc_def1);
    let mut checked = 0;
    for _ in 0..150 {
        let (cluster, model, settings) = random_case(&mut rng);
        let Ok(before) = plan(&model, &cluster, &settings, &quick(false)) else {
            continue;
        };
        // One more node of a type, or a whole new type.
        let mut bigger = cluster.clone();
        let ty = (rng.next() % (bigger.chip_types.len() as u64 + 1)) as usize;
        if ty < bigger.chip_types.len() {
            let c = &mut bigger.chip_types[ty];
            c.count += c.chips_per_node;
        } else {
            let mut extra = chip(&mut rng, "extra".into(), 8).unwrap_or_else(|| {
                let mut c = cluster.chip_types[0].clone();
                c.count = c.chips_per_node;
                c
            });
            extra.name = "extra".into();
            bigger.chip_types.push(extra);
        }
        let after = plan(&model, &bigger, &settings, &quick(false)).unwrap();
        assert!(
            after.plan.tokens_per_s >= before.plan.tokens_per_s * (1.0 - 1e-9),
            "{} -> {} tokens/s adding chips to {cluster:?}\nbefore {}\nafter {}",
            before.plan.tokens_per_s,
            after.plan.tokens_per_s,
            brief(&before),
            brief(&after)
        );
        checked += 1;
    }
    assert!(checked >= 40, "{checked}");
}

#[test]
fn a_single_type_cluster_has_ratio_exactly_one() {
    let mut rng = XorShift(42);
    let mut checked = 0;
    while checked < 20 {
        let (mut cluster, model, settings) = random_case(&mut rng);
        cluster.chip_types.truncate(1);
        let Ok(r): Result<PlanReport, _> =
            plan(&model, &cluster, &settings, &PlanOptions::default())
        else {
            continue;
        };
        assert_eq!(r.hetero_speedup_ratio, Some(1.0));
        checked += 1;
    }
}

#[test]
fn the_infeasible_message_names_the_shortfall() {
    let mut rng = XorShift(5);
    let mut c = chip(&mut rng, "tiny".into(), 8).unwrap();
    c.count = 8;
    c.chips_per_node = 8;
    c.memory_bytes = 16 * GIB;
    let cluster = ClusterSpec {
        chip_types: vec![c],
        inter_node_bandwidth: 25e9,
    };
    let model = ModelSpec::h2_100b();
    let err = plan(
        &model,
        &cluster,
        &TrainingSettings::new(64),
        &PlanOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, PlanError::DoesNotFit { .. }));
    // 102e9 parameters * 18 bytes; 8 * 16 GiB = 0.14 TB.
    let msg = err.to_string();
    assert!(
        msg.starts_with("the h2-100b model needs at least 1.84 TB for weights, gradients and optimizer state; the cluster has 137.44 GB of memory in total: 1.70 TB short"),
        "{msg}"
    );
}

#[test]
fn turning_heteropp_off_plans_replicas_of_one_type_each() {
    let path = format!(
        "{}/../examples/clusters/china-mobile-3-vendor.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    let cluster = ClusterSpec::load(std::path::Path::new(&path)).unwrap();
    let model = ModelSpec::preset("llama-7b").unwrap();
    let settings = TrainingSettings::new(512);
    let options = PlanOptions {
        heteropp: false,
        speedup_ratio: false,
        ..PlanOptions::default()
    };
    let report = plan(&model, &cluster, &settings, &options).unwrap();
    assert_eq!(
        report.plan.kind,
        polychip_planner::plan::PlanKind::MixedReplicas
    );
    for r in &report.plan.replicas {
        let first = &r.stages[0].chip;
        assert!(r.stages.iter().all(|s| &s.chip == first), "{r:?}");
    }
}

/// The expert-parallel degrees tried for a mixture: the powers of two that
/// divide its experts, up to 64; the kept plan is the fastest of those
/// each degree's search gives, and a dense model is refused.
#[test]
fn the_expert_degree_search_keeps_the_fastest_degree() {
    use polychip_planner::search::{expert_degrees, plan_expert_degrees};
    assert_eq!(expert_degrees(8), [1, 2, 4, 8]);
    assert_eq!(expert_degrees(60), [1, 2, 4]);
    assert_eq!(expert_degrees(256), [1, 2, 4, 8, 16, 32, 64]);
    let cluster = ClusterSpec::from_toml_str(include_str!(
        "../../examples/clusters/china-mobile-3-vendor.toml"
    ))
    .unwrap();
    let model = ModelSpec::mixtral_8x7b();
    let settings = TrainingSettings::new(512);
    let (best, tried) =
        plan_expert_degrees(&model, &cluster, &settings, &PlanOptions::default()).unwrap();
    // Each degree at the tp and with every expert whole on a chip.
    let degrees: Vec<(u64, u64)> = tried.iter().map(|t| (t.0.ep, t.0.etp)).collect();
    assert_eq!(
        degrees,
        [
            (1, 0),
            (1, 1),
            (2, 0),
            (2, 1),
            (4, 0),
            (4, 1),
            (8, 0),
            (8, 1)
        ]
    );
    let fastest = tried.iter().filter_map(|t| t.1).fold(0.0, f64::max);
    assert_eq!(best.plan.tokens_per_s_simulated, fastest);
    let kept = tried.iter().find(|t| t.1 == Some(fastest)).unwrap().0;
    assert_eq!(best.settings.expert_parallel, kept.ep);
    assert_eq!(best.settings.expert_tensor_parallel, kept.etp);
    // A degree the settings give is the only one tried.
    let one = TrainingSettings {
        expert_tensor_parallel: 1,
        ..settings.clone()
    };
    let (_, tried) = plan_expert_degrees(&model, &cluster, &one, &PlanOptions::default()).unwrap();
    assert!(tried.iter().all(|t| t.0.etp == 1), "{tried:?}");
    let e = plan_expert_degrees(
        &ModelSpec::llama_7b(),
        &cluster,
        &settings,
        &PlanOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("is dense"), "{e}");
}

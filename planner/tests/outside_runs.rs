//! The cluster-level model against training runs measured outside this
//! project: Sailor's simulator-validation runs (Megatron-DeepSpeed on CSCS's
//! GH200 nodes, OPT-350M and GPT-Neo 2.7B over data, pipeline and tensor
//! parallelism; and OPT-350M on nodes of RTX 3090, Titan RTX and RTX 2080
//! Ti, with stages whose data-parallel groups mix the three). The plans,
//! the measured iteration times and peak memory are in
//! `tests/data/outside/sailor-runs.json` (`convert_sailor.py` there
//! reproduces it from Sailor's repository, and names the commit); the
//! clusters' figures are spec sheets and Sailor's network measurements, not
//! fitted to the runs.
//!
//! Each run is scored twice: without a profile, and from Sailor's own
//! per-layer profiles of the same GPUs (`sailor-profile-<model>.json`,
//! converted into `polychip-profile/1` by the same script), as a user
//! would with another framework's measurements.
//!
//! A second set is AMP's heterogeneous-cluster experiment
//! (`amp-runs.json`, `convert_amp.py`): 53 plans of GPT-2 in fp16 on V100
//! and T4 nodes, 10 of which failed, scored for their outcome as well.
//!
//! Later sets: vTrain's, NVIDIA's Selene runs, BigScience's Jean Zay sweep
//! and OneFlow DLPerf's Megatron-LM runs on V100 (`dlperf-megatron-v100/`:
//! dp, tp and pp on 1 to 32 GPUs, with nvidia-smi's memory), each in a
//! directory of its own with the converter that wrote it.
//!
//! `cargo test -p polychip-planner --test outside_runs -- --nocapture`
//! prints every run and the figures per cluster (Spearman rank correlation
//! of predicted and measured steps, top-1 regret, median error as given and
//! after one scale per cluster, which is what setting the compute rate to
//! what the layers ran at does, and fit agreement: every run here ran).

use std::collections::BTreeMap;
use std::path::PathBuf;

use polychip_planner::cluster::ClusterSpec;
use polychip_planner::evaluate::{Evaluation, PlanSpec, evaluate};
use polychip_planner::model::ModelSpec;
use polychip_planner::profile::{ProfileEntry, ProfileFile};
use polychip_planner::settings::{Dtype, LossKernel, Recompute, RecomputeModule, TrainingSettings};
use polychip_planner::validate::{median, median_error, one_scale, spearman, topk_regret};
use serde_json::Value;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/outside")
        .join(name)
}

/// Training in `dtype` with attention without a fused kernel and no
/// recomputation: the options of every run here (Megatron-DeepSpeed).
/// The largest share of its chip's memory a stage of `ev` is predicted to
/// take.
fn peak_share(ev: &Evaluation) -> f64 {
    ev.plan
        .replicas
        .iter()
        .flat_map(|r| &r.stages)
        .map(|s| s.memory.total / s.memory_capacity as f64)
        .fold(0.0, f64::max)
}

fn unfused(dtype: Dtype) -> TrainingSettings {
    let mut s = TrainingSettings::new(1);
    s.dtype = dtype;
    s.flash_attention = false;
    s
}

struct Scored {
    name: String,
    /// Predicted (without a profile, and from Sailor's layer profiles) and
    /// measured seconds per sequence (runs differ in their global batch,
    /// so they are ranked by time per sequence).
    predicted: f64,
    profiled: f64,
    /// From the profile's blocks alone (embedding, head and optimizer
    /// left to the cost model, scaled to the measured block).
    blocks_only: f64,
    measured: f64,
    fits: bool,
    predicted_peak: f64,
    measured_peak: Option<f64>,
}

/// A cluster file of the data, every chip type's dispatch floor set to
/// `dispatch` when given.
fn cluster(name: &str, dispatch: Option<f64>) -> ClusterSpec {
    let mut c = ClusterSpec::load(&data(&format!("{name}.toml"))).unwrap();
    if dispatch.is_some() {
        c.chip_types
            .iter_mut()
            .for_each(|t| t.kernel_dispatch_seconds = dispatch);
    }
    c
}

/// Every run evaluated, by cluster (each chip's dispatch floor `dispatch`,
/// or the default).
fn score(dispatch: Option<f64>) -> BTreeMap<String, Vec<Scored>> {
    score_from(dispatch, |_| true)
}

/// As [`score`], from the profiles' entries that `keep` keeps.
fn score_from(
    dispatch: Option<f64>,
    keep: fn(&ProfileEntry) -> bool,
) -> BTreeMap<String, Vec<Scored>> {
    let text = std::fs::read_to_string(data("sailor-runs.json")).unwrap();
    let runs: Value = serde_json::from_str(&text).unwrap();
    let mut out: BTreeMap<String, Vec<Scored>> = BTreeMap::new();
    // Each model's profile, read once.
    let mut profiles: BTreeMap<String, ProfileFile> = BTreeMap::new();
    for run in runs["runs"].as_array().unwrap() {
        let name = run["name"].as_str().unwrap().to_string();
        let cluster_name = run["cluster"].as_str().unwrap();
        let cluster = cluster(cluster_name, dispatch);
        let model =
            ModelSpec::load(&data(&format!("{}.toml", run["model"].as_str().unwrap()))).unwrap();
        let spec = PlanSpec::parse(&run["plan"].to_string(), true)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        // fp32 training (the runs' Megatron-DeepSpeed options), whose loss
        // subtracts the logits' maximum into a new buffer (Microsoft's
        // Megatron-DeepSpeed, `megatron/core/tensor_parallel/cross_entropy.py`).
        let mut settings = unfused(Dtype::F32);
        settings.loss = LossKernel::OutOfPlace;
        let ev =
            evaluate(&spec, &model, &cluster, &settings).unwrap_or_else(|e| panic!("{name}: {e}"));
        let model_name = run["model"].as_str().unwrap();
        let profile = profiles.entry(model_name.to_string()).or_insert_with(|| {
            let mut p =
                ProfileFile::load(&data(&format!("sailor-profile-{model_name}.json"))).unwrap();
            p.entries.retain(keep);
            p
        });
        let mut measured = cluster.clone();
        let applied = measured.apply_profile(profile, &model, &settings).unwrap();
        assert!(
            !applied.ignored.is_empty(),
            "the profiles cover other GPUs too"
        );
        let with_profile = evaluate(&spec, &model, &measured, &settings)
            .unwrap_or_else(|e| panic!("{name} with the profile: {e}"));
        let mut blocks = profile.clone();
        for e in &mut blocks.entries {
            (e.embedding, e.head, e.optimizer_per_param) = (None, None, None);
        }
        let mut estimated = cluster.clone();
        let applied = estimated.apply_profile(&blocks, &model, &settings).unwrap();
        assert!(!applied.estimated.is_empty());
        let blocks_only = evaluate(&spec, &model, &estimated, &settings)
            .unwrap_or_else(|e| panic!("{name} with the blocks' profile: {e}"));
        let sequences = ev.plan.global_batch as f64;
        let peak = ev.peak_memory_bytes();
        out.entry(cluster_name.to_string())
            .or_default()
            .push(Scored {
                name,
                predicted: ev.plan.step_time_simulated / sequences,
                profiled: with_profile.plan.step_time_simulated / sequences,
                blocks_only: blocks_only.plan.step_time_simulated / sequences,
                measured: run["measured_step_s"].as_f64().unwrap() / sequences,
                fits: ev.fits,
                predicted_peak: peak,
                measured_peak: run["measured_peak_bytes"].as_f64(),
            });
    }
    out
}

/// The figures of one cluster's runs.
struct Figures {
    spearman: f64,
    top1_regret: f64,
    top3_regret: f64,
    median_error: f64,
    median_error_scaled: f64,
    scale: f64,
    fit_agreement: usize,
    median_memory_error: f64,
}

fn figures(runs: &[Scored], predicted: fn(&Scored) -> f64) -> Figures {
    let p: Vec<f64> = runs.iter().map(predicted).collect();
    let m: Vec<f64> = runs.iter().map(|r| r.measured).collect();
    let scale = one_scale(&p, &m);
    let mem: Vec<f64> = runs
        .iter()
        .filter_map(|r| Some((r.predicted_peak - r.measured_peak?) / r.measured_peak?))
        .collect();
    Figures {
        spearman: spearman(&p, &m),
        top1_regret: topk_regret(&p, &m, 1),
        top3_regret: topk_regret(&p, &m, 3),
        median_error: median_error(&p, &m, 1.0),
        median_error_scaled: median_error(&p, &m, scale),
        scale,
        fit_agreement: runs.iter().filter(|r| r.fits).count(),
        median_memory_error: median(mem),
    }
}

#[test]
fn the_cluster_model_ranks_measured_outside_runs() {
    let scored = score(None);
    let mut all_fit = true;
    for (cluster, runs) in &scored {
        println!("{cluster}:");
        println!(
            "  {:<44} {:>12} {:>12} {:>12} {:>10} {:>10} {:>5}",
            "run", "predicted s", "profiled s", "measured s", "pred. GB", "meas. GB", "fits"
        );
        for r in runs {
            println!(
                "  {:<44} {:>12.5} {:>12.5} {:>12.5} {:>10.2} {:>10} {:>5}",
                r.name,
                r.predicted,
                r.profiled,
                r.measured,
                r.predicted_peak / 1e9,
                r.measured_peak
                    .map_or("-".to_string(), |b| format!("{:.2}", b / 1e9)),
                r.fits
            );
        }
        let f = figures(runs, |r| r.predicted);
        let g = figures(runs, |r| r.profiled);
        let h = figures(runs, |r| r.blocks_only);
        for (what, f) in [
            ("without a profile", &f),
            ("from Sailor's profile", &g),
            ("from its blocks alone", &h),
        ] {
            println!(
                "  {} runs {what}: Spearman {:.3}, top-1 regret {:.1}%, top-3 regret {:.1}%, \
                 median error {:.1}% as given, {:.1}% after scaling by {:.3}",
                runs.len(),
                f.spearman,
                100.0 * f.top1_regret,
                100.0 * f.top3_regret,
                100.0 * f.median_error,
                100.0 * f.median_error_scaled,
                f.scale,
            );
        }
        println!(
            "  fits {}/{} (every run ran); median memory error {:+.1}%",
            f.fit_agreement,
            runs.len(),
            100.0 * f.median_memory_error
        );
        all_fit &= f.fit_agreement == runs.len();
        // The issue's bar without a profile; measured 0.992 and 0.929.
        assert!(f.spearman >= 0.7, "{cluster}: Spearman {:.3}", f.spearman);
        if cluster == "clariden-gh200" {
            // The GH200 runs: the best-predicted plan is the best measured,
            // and once scaled the model predicts them within a median 13%.
            assert_eq!(f.top1_regret, 0.0, "{cluster}");
            assert!(
                f.median_error_scaled <= 0.2,
                "{cluster}: {}",
                f.median_error_scaled
            );
            // From the profile Sailor measured on the same GPUs, the issue's
            // bar with a profile: measured 0.997 and 7.9% (0.998 and 4.6% before
            // stop 43 priced every chip of a stage sending the whole activation).
            assert!(g.spearman >= 0.9, "{cluster}: Spearman {:.3}", g.spearman);
            assert!(g.median_error <= 0.1, "{cluster}: {}", g.median_error);
            // A profile of the blocks alone still ranks the runs.
            assert!(h.spearman >= 0.9, "{cluster}: Spearman {:.3}", h.spearman);
        }
    }
    assert!(all_fit, "a run that ran was predicted not to fit");
}

/// The GH200 runs from part of Sailor's profile, as a user with fewer
/// measurements would price them: the micro-batch sizes and
/// tensor-parallel degrees the part lacks are carried from the nearest
/// measured entry by the cost model (`profile::apply_measured`). Measured
/// (median error as given): every entry 7.9%, tp 1 alone 7.4%,
/// micro-batch 1 alone 4.0%, micro-batch 1 at tp 1 alone 5.8% (4.1% after
/// one scale), Spearman 0.996-0.999. With the geometric mean of the fixed
/// and growing readings (stop 43 to 44): 5.9% and 12.8% (1.9% after one
/// scale) on the last two. With the cost model's whole ratio between
/// shapes and whole activations sent by every chip (before stop 43):
/// 4.6%, 16.2%, 13.0% and 17.8%.
#[test]
fn part_of_a_profile_still_prices_the_runs() {
    type Keep = fn(&ProfileEntry) -> bool;
    let parts: [(&str, Keep, f64); 4] = [
        ("every entry", |_| true, 0.09),
        ("tp 1 alone", |e| e.tp == 1, 0.09),
        ("micro-batch 1 alone", |e| e.micro_batch == 1, 0.05),
        (
            "micro-batch 1 at tp 1 alone",
            |e| e.micro_batch == 1 && e.tp == 1,
            0.07,
        ),
    ];
    for (what, keep, ceiling) in parts {
        let scored = score_from(None, keep);
        let g = figures(&scored["clariden-gh200"], |r| r.profiled);
        println!(
            "clariden-gh200 from {what}: Spearman {:.3}, top-1 regret {:.1}%, median error \
             {:.1}% as given, {:.1}% after scaling by {:.3}",
            g.spearman,
            100.0 * g.top1_regret,
            100.0 * g.median_error,
            100.0 * g.median_error_scaled,
            g.scale
        );
        assert!(g.spearman >= 0.99, "{what}: Spearman {:.3}", g.spearman);
        assert_eq!(g.top1_regret, 0.0, "{what}");
        assert!(g.median_error <= ceiling, "{what}: {}", g.median_error);
    }
}

/// One block's forward and backward per micro-batch, as the cost model
/// prices it without a profile (a middle stage of one layer: no embedding
/// or head), against Sailor's measured block at every micro-batch size and
/// tp degree of the GH200 profiles. Shows how the model's tensor-parallel
/// speed-up compares with the measured one (which is often none).
#[test]
fn the_cost_model_follows_measured_blocks_across_tp_and_micro_batch() {
    for model_name in ["opt-350m", "gpt-neo-2.7b"] {
        let (rho, _) = blocks(model_name, None, true);
        assert!(rho >= 0.9, "{model_name}: Spearman {rho:.3}");
    }
}

/// The blocks of `model_name`'s GH200 profile against the cost model's (at
/// dispatch floor `dispatch`, or the default): Spearman and the median
/// error after one scale; every entry printed when `print`.
fn blocks(model_name: &str, dispatch: Option<f64>, print: bool) -> (f64, f64) {
    use polychip_planner::cost::{Microbatching, StageShape, analytic_stage_timing};
    let cluster = cluster("clariden-gh200", dispatch);
    let chip = &cluster.chip_types[0];
    let settings = unfused(Dtype::F32);
    let model = ModelSpec::load(&data(&format!("{model_name}.toml"))).unwrap();
    let profile = ProfileFile::load(&data(&format!("sailor-profile-{model_name}.json"))).unwrap();
    let (mut predicted, mut measured) = (Vec::new(), Vec::new());
    if print {
        println!("{model_name} on GH-96: block forward + backward, ms (model / measured)");
    }
    for e in profile.entries.iter().filter(|e| e.chip == "GH-96") {
        let shape = StageShape {
            chip,
            layers: 0..1,
            index: 1,
            num_stages: 3,
            dp: 1,
            tp: e.tp,
            next: None,
            dp_peers: &[],
            dp_one_node: true,
        };
        let mb = Microbatching {
            size: e.micro_batch,
            count: 1,
        };
        let t = analytic_stage_timing(&model, &settings, &cluster, &shape, mb);
        predicted.push(t.forward + t.backward);
        measured.push(e.block.forward + e.block.backward);
        if print {
            println!(
                "  b {:>3} tp {}: {:8.3} / {:8.3}",
                e.micro_batch,
                e.tp,
                1e3 * (t.forward + t.backward),
                1e3 * (e.block.forward + e.block.backward)
            );
        }
    }
    let scale = one_scale(&predicted, &measured);
    let err = median_error(&predicted, &measured, scale);
    let rho = spearman(&predicted, &measured);
    if print {
        println!(
            "  {} entries: Spearman {rho:.3}, median error {:.1}% after scaling by {scale:.3}",
            predicted.len(),
            100.0 * err
        );
    }
    (rho, err)
}

/// The dispatch floor swept over 0-120 µs on the GH200 runs (without a
/// profile) and on the single blocks: the figures docs/planner.md gives
/// for choosing the default. The default's scaled median error on the
/// runs is within 3 points of the best of the sweep.
#[test]
fn the_default_dispatch_floor_is_near_the_best_of_a_sweep() {
    let floors = [0.0, 30e-6, 45e-6, 50e-6, 60e-6, 75e-6, 90e-6, 120e-6];
    println!(
        "dispatch µs | GH200 runs: Spearman, scaled error | blocks' scaled error: OPT-350M, GPT-Neo"
    );
    let mut best = f64::INFINITY;
    for d in floors {
        let runs = figures(&score(Some(d))["clariden-gh200"], |r| r.predicted);
        let (_, opt) = blocks("opt-350m", Some(d), false);
        let (_, neo) = blocks("gpt-neo-2.7b", Some(d), false);
        println!(
            "{:>11.0} | {:.3}, {:.1}% | {:.1}%, {:.1}%",
            d * 1e6,
            runs.spearman,
            100.0 * runs.median_error_scaled,
            100.0 * opt,
            100.0 * neo
        );
        best = best.min(runs.median_error_scaled);
    }
    let default = figures(&score(None)["clariden-gh200"], |r| r.predicted);
    assert!(
        default.median_error_scaled <= best + 0.03,
        "default {} against the sweep's best {best}",
        default.median_error_scaled
    );
}

/// What the AMP tests check: Spearman without and with the profile, AMP's
/// own, the outcomes predicted, and the plans flagged as unable to run.
struct AmpFigures {
    rho: f64,
    rho_profile: f64,
    /// The median error as given, from the profile.
    error_profile: f64,
    rho_amp: f64,
    agree: usize,
    /// Outcomes predicted under the in-place loss, not v1's.
    agree_in_place: usize,
    runs: usize,
    empty: usize,
}

/// Scores one of AMP's experiments (`runs_file`, converted by
/// `convert_amp.py`, on `cluster_name`): each plan without a profile and
/// from AMP's own per-layer forward times (one sequence per micro-batch),
/// beside AMP's own predictions, and without a profile at a few dispatch
/// floors; prints every run and the figures.
fn score_amp(runs_file: &str, cluster_name: &str, profiled_types: usize) -> AmpFigures {
    let text = std::fs::read_to_string(data(runs_file)).unwrap();
    let runs: Value = serde_json::from_str(&text).unwrap();
    let runs = runs["runs"].as_array().unwrap();
    let model = ModelSpec::load(&data("gpt2-medium-amp.toml")).unwrap();
    // Megatron-LM v1.1.5 (2020) predates sequence parallelism (the
    // figures are the same with it: these runs are far from full).
    let mut settings = unfused(Dtype::F16);
    settings.sequence_parallel = false;
    // Its loss clones the f32 logits and exponentiates them into another
    // buffer (`megatron/mpu/cross_entropy.py` before Megatron-LM's 57064fd6
    // of March 2020).
    settings.loss = LossKernel::Cloned;
    let cluster = cluster(cluster_name, None);
    let profile = ProfileFile::load(&data("amp-profile-gpt2-medium.json")).unwrap();
    let mut measured_cluster = cluster.clone();
    let applied = measured_cluster
        .apply_profile(&profile, &model, &settings)
        .unwrap();
    assert_eq!(applied.covered.len(), profiled_types);
    let specs: Vec<PlanSpec> = runs
        .iter()
        .map(|r| PlanSpec::parse(&r["plan"].to_string(), true).unwrap())
        .collect();
    let score = |c: &ClusterSpec| -> Vec<_> {
        specs
            .iter()
            .zip(runs)
            .map(|(spec, r)| {
                evaluate(spec, &model, c, &settings)
                    .unwrap_or_else(|e| panic!("{}: {e}", r["name"]))
            })
            .collect()
    };
    let (plain, from_profile) = (score(&cluster), score(&measured_cluster));
    let measured: Vec<Option<f64>> = runs.iter().map(|r| r["measured_step_s"].as_f64()).collect();
    // The steps of the runs that ran, as `step` gives them.
    let ran_only = |step: &dyn Fn(usize) -> f64| -> Vec<f64> {
        (0..runs.len())
            .filter(|&i| measured[i].is_some())
            .map(step)
            .collect()
    };
    let m = ran_only(&|i| measured[i].unwrap());
    println!("{runs_file} on {cluster_name}:");
    println!(
        "  {:<72} {:>10} {:>10} {:>10} {:>9} {:>6} {:>6}",
        "run", "predicted", "profiled", "measured", "peak/cap", "runs?", "ran"
    );
    let (mut agree, mut empty) = (0, 0);
    for (i, r) in runs.iter().enumerate() {
        let (name, ran) = (r["name"].as_str().unwrap(), r["ran"].as_bool().unwrap());
        let ev = &plain[i];
        agree += usize::from(ev.fits == ran);
        if !ev.cannot_run.is_empty() {
            empty += 1;
            assert!(!ran, "{name} ran");
        }
        let peak = peak_share(ev);
        println!(
            "  {name:<72} {:>10.3} {:>10.3} {:>10} {peak:>9.2} {:>6} {ran:>6}",
            ev.plan.step_time_simulated,
            from_profile[i].plan.step_time_simulated,
            measured[i].map_or("-".into(), |m| format!("{m:.2}")),
            ev.fits,
        );
    }
    let p = ran_only(&|i| plain[i].plan.step_time_simulated);
    let q = ran_only(&|i| from_profile[i].plan.step_time_simulated);
    let amp = ran_only(&|i| runs[i]["amp_predicted_s"].as_f64().unwrap());
    let (rho, rho_profile, rho_amp) = (spearman(&p, &m), spearman(&q, &m), spearman(&amp, &m));
    for (what, p, rho) in [
        ("without a profile", &p, rho),
        ("from AMP's profile", &q, rho_profile),
    ] {
        let scale = one_scale(p, &m);
        println!(
            "  {} runs that ran, {what}: Spearman {rho:.3}, top-1 regret {:.1}%, top-3 regret \
             {:.1}%, median error {:.1}% as given, {:.1}% after scaling by {scale:.3}",
            m.len(),
            100.0 * topk_regret(p, &m, 1),
            100.0 * topk_regret(p, &m, 3),
            100.0 * median_error(p, &m, 1.0),
            100.0 * median_error(p, &m, scale),
        );
    }
    println!(
        "  AMP's own predictions: Spearman {rho_amp:.3}, top-1 regret {:.1}%",
        100.0 * topk_regret(&amp, &m, 1)
    );
    println!(
        "  outcome predicted for {agree}/{} runs ({empty} with a stage of no layer)",
        runs.len()
    );
    // The same plans under Megatron-Core's in-place loss (6 bytes a logit
    // where v1's holds 14): the loss's version decides these outcomes.
    let mut in_place = settings.clone();
    in_place.loss = LossKernel::InPlace;
    let agree_in_place = specs
        .iter()
        .zip(runs)
        .filter(|(spec, r)| {
            let ev = evaluate(spec, &model, &cluster, &in_place).unwrap();
            ev.fits == r["ran"].as_bool().unwrap()
        })
        .count();
    println!(
        "  outcome predicted for {agree_in_place}/{} runs at Megatron-Core's in-place loss",
        runs.len()
    );
    for d in [100e-6, 200e-6, 300e-6] {
        let swept = score(&crate::cluster(cluster_name, Some(d)));
        let p = ran_only(&|i| swept[i].plan.step_time_simulated);
        println!(
            "  dispatch floor {:.0} µs, without a profile: Spearman {:.3}",
            d * 1e6,
            spearman(&p, &m)
        );
    }
    // The profile's backward passes are its forward's doubled (AMP timed
    // forward passes only); at other multiples the two sets move apart.
    for k in [1.0, 1.5] {
        let mut scaled = profile.clone();
        for e in &mut scaled.entries {
            let passes = [Some(&mut e.block), e.embedding.as_mut(), e.head.as_mut()];
            for x in passes.into_iter().flatten() {
                x.backward = k * x.forward;
            }
        }
        let mut c = cluster.clone();
        c.apply_profile(&scaled, &model, &settings).unwrap();
        let swept = score(&c);
        let q = ran_only(&|i| swept[i].plan.step_time_simulated);
        println!(
            "  from the profile with each backward {k:.1} times its forward: Spearman {:.3}, \
             median error {:.1}% as given",
            spearman(&q, &m),
            100.0 * median_error(&q, &m, 1.0)
        );
    }
    AmpFigures {
        rho,
        rho_profile,
        error_profile: median_error(&q, &m, 1.0),
        rho_amp,
        agree,
        agree_in_place,
        runs: runs.len(),
        empty,
    }
}

/// AMP's heterogeneous-cluster runs (`amp-runs.json`): GPT-2 (hidden 1024,
/// 24 layers) in fp16 on three nodes of four V100 and one of four T4, 53
/// plans over tensor, pipeline and data parallelism, 10 of which failed;
/// the figures docs/planner.md gives for this older stack. Three of AMP's
/// plans give a pipeline stage no layer at all (a transpose alone): they
/// are predicted not to run (`cannot_run`).
#[test]
fn the_cluster_model_scores_amps_heterogeneous_runs() {
    let f = score_amp("amp-runs.json", "aws-v100-t4", 2);
    assert_eq!(f.empty, 3);
    // Measured (docs/planner.md): 0.723 without a profile, the issue's
    // bar 0.7 met; 0.849 from AMP's one-sequence profile, under its 0.9,
    // with a median error of 8.1%, within its 10% (0.821 and 12.0% before
    // stop 45 split a measurement's excess between slow kernels and host
    // overhead; 0.718, 0.851 and 7.4% before stop 47's one NIC a node);
    // AMP's own 0.394; 50 of 53 outcomes (the three missed
    // failed for other reasons than memory, see the docs).
    assert!(f.rho >= 0.7, "Spearman without a profile {:.3}", f.rho);
    assert!(
        f.rho_profile >= 0.83,
        "Spearman from the profile {:.3}",
        f.rho_profile
    );
    assert!(
        f.error_profile <= 0.1,
        "median error from the profile {:.3}",
        f.error_profile
    );
    assert!(
        f.rho > f.rho_amp,
        "{:.3} against AMP's own {:.3}",
        f.rho,
        f.rho_amp
    );
    assert!(f.agree >= 50, "{}/{} outcomes", f.agree, f.runs);
    // At Megatron-Core's in-place loss, 47: three failed runs predicted to
    // fit.
    assert!(f.agree_in_place < f.agree, "{}", f.agree_in_place);
}

/// AMP's homogeneous runs (`amp-homogeneous-runs.json`): the same GPT-2 on
/// four nodes of four T4, 52 plans, 5 of which failed; profiled from the
/// T4's entries of the same profile.
#[test]
fn the_cluster_model_scores_amps_homogeneous_runs() {
    let f = score_amp("amp-homogeneous-runs.json", "aws-t4x16", 1);
    // Measured (docs/planner.md): 0.925 without a profile, 0.879 from the
    // profile with a median error of 10.9% (0.868 and 12.4% before stop
    // 45), AMP's own 0.935; 51 of 52 outcomes (the one missed, at 0.92
    // of a T4 by this count, failed; the same plan ran on the V100+T4
    // cluster, see the docs).
    assert!(f.rho >= 0.85, "Spearman without a profile {:.3}", f.rho);
    assert!(
        f.rho_profile >= 0.86,
        "Spearman from the profile {:.3}",
        f.rho_profile
    );
    assert!(
        f.error_profile <= 0.12,
        "median error from the profile {:.3}",
        f.error_profile
    );
    assert!(f.agree >= 51, "{}/{} outcomes", f.agree, f.runs);
    // At Megatron-Core's in-place loss, 49.
    assert!(f.agree_in_place < f.agree, "{}", f.agree_in_place);
}

/// One vTrain run scored without a profile: its name, predicted and
/// measured seconds per sequence, and whether it is predicted to fit.
struct VtrainRun {
    set: String,
    name: String,
    predicted: f64,
    measured: f64,
    fits: bool,
    /// Seconds per sequence that one second per layer per micro-batch on
    /// the pipeline's path would add: `(m + p - 1) L / p` over the
    /// sequences (BigScience's runs suggest such a cost, see there).
    layer_cycles: f64,
}

/// Every run of `file` (under `vtrain/`), scored under the runs' own
/// settings (fp16, full recomputation, no flash attention, no sequence
/// parallelism: Megatron-DeepSpeed as vTrain ran it); a run's set is its
/// model (and, for single-node runs, the set is the model over every plan
/// of it).
fn score_vtrain(file: &str) -> Vec<VtrainRun> {
    let dir = data("vtrain");
    let text = std::fs::read_to_string(dir.join(file)).unwrap();
    let runs: Value = serde_json::from_str(&text).unwrap();
    let s = &runs["settings"];
    assert_eq!(
        (
            s["dtype"].as_str(),
            s["recompute"].as_str(),
            s["gradient_bytes"].as_u64()
        ),
        (Some("f16"), Some("full"), Some(2))
    );
    let mut settings = TrainingSettings::new(1);
    settings.dtype = Dtype::F16;
    settings.recompute = polychip_planner::settings::Recompute::Full;
    settings.flash_attention = false;
    settings.sequence_parallel = false;
    // Megatron-DeepSpeed in fp16 keeps its gradients in fp16 (2 bytes), as
    // the BigScience and DLPerf sets of the same stack are scored.
    settings.bf16_gradients = true;
    let cluster = ClusterSpec::load(&dir.join("a100-80g-vtrain.toml")).unwrap();
    let mut models: BTreeMap<String, ModelSpec> = BTreeMap::new();
    let mut out = Vec::new();
    for run in runs["runs"].as_array().unwrap() {
        let name = run["name"].as_str().unwrap().to_string();
        let model_name = run["model"].as_str().unwrap();
        let model = models
            .entry(model_name.to_string())
            .or_insert_with(|| ModelSpec::load(&dir.join(format!("{model_name}.toml"))).unwrap());
        let spec = PlanSpec::parse(&run["plan"].to_string(), true)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let ev =
            evaluate(&spec, model, &cluster, &settings).unwrap_or_else(|e| panic!("{name}: {e}"));
        let sequences = ev.plan.global_batch as f64;
        let replica = &ev.plan.replicas[0];
        let p = replica.stages.len() as f64;
        let cycles = replica.micro_batches as f64 + p - 1.0;
        out.push(VtrainRun {
            set: name.split('/').take(2).collect::<Vec<_>>().join("/"),
            name,
            predicted: ev.plan.step_time_simulated / sequences,
            measured: run["measured_step_s"].as_f64().unwrap() / sequences,
            fits: ev.fits,
            layer_cycles: cycles * model.layers as f64 / p / sequences,
        });
    }
    out
}

/// vTrain's measured runs (`tests/data/outside/vtrain/`, converted from
/// github.com/VIA-Research/vTrain by `convert_vtrain.py`): Megatron-DeepSpeed
/// on A100 nodes, 103 runs of four GPT-3-style models on 64 to 512 GPUs
/// and 1,440 runs on one node. No profile exists for them, so the issue's
/// bar without one applies: Spearman >= 0.7 on each model's runs (measured
/// 0.927, 0.749, 0.761 and 0.826 on the four large sets, 0.97-0.99 on the
/// single-node ones); every run ran, and every one is predicted to fit
/// with the stack's fp16 gradients (with 4 bytes a gradient, 3.6B as 64
/// replicas of micro-batch 8 was counted at 86.3 GB of 85.9; see
/// docs/planner.md).
#[test]
fn the_cluster_model_scores_vtrains_runs() {
    for (file, floor) in [
        ("vtrain-multi-runs.json", 0.7),
        ("vtrain-single-runs.json", 0.95),
    ] {
        let runs = score_vtrain(file);
        let mut sets: BTreeMap<&str, Vec<&VtrainRun>> = BTreeMap::new();
        for r in &runs {
            sets.entry(r.set.as_str()).or_default().push(r);
        }
        println!("{file}:");
        for (set, rs) in &sets {
            let p: Vec<f64> = rs.iter().map(|r| r.predicted).collect();
            let m: Vec<f64> = rs.iter().map(|r| r.measured).collect();
            let scale = one_scale(&p, &m);
            let rho = spearman(&p, &m);
            let fit = rs.iter().filter(|r| r.fits).count();
            println!(
                "  {set}: {} runs, Spearman {rho:.3}, top-1 regret {:.1}%, median error {:.1}% as \
                 given, {:.1}% after scaling by {scale:.3}, {fit}/{} predicted to fit (all ran)",
                rs.len(),
                100.0 * topk_regret(&p, &m, 1),
                100.0 * median_error(&p, &m, 1.0),
                100.0 * median_error(&p, &m, scale),
                rs.len()
            );
            for r in rs.iter().filter(|r| !r.fits) {
                println!("    predicted not to fit, but ran: {}", r.name);
            }
            // The fixed cost per layer and micro-batch that BigScience's
            // runs suggest, tried on these (not in the model).
            if file.contains("multi") {
                let line: Vec<String> = [0.005, 0.015]
                    .iter()
                    .map(|o| {
                        let p: Vec<f64> = rs
                            .iter()
                            .map(|r| r.predicted + o * r.layer_cycles)
                            .collect();
                        format!("{:.0} ms: {:.3}", 1e3 * o, spearman(&p, &m))
                    })
                    .collect();
                println!(
                    "    Spearman with a fixed cost per layer per micro-batch of {}",
                    line.join(", ")
                );
            }
            assert!(rho >= floor, "{set}: Spearman {rho:.3}");
        }
        let misses = runs.iter().filter(|r| !r.fits).count();
        assert!(
            misses == 0,
            "{file}: {misses} runs that ran predicted not to fit"
        );
    }
}

/// The Selene runs' settings: fp16 without flash attention, with the
/// run's recomputation and sequence parallelism.
fn selene_settings(
    recompute: polychip_planner::settings::Recompute,
    sequence_parallel: bool,
) -> TrainingSettings {
    let mut settings = TrainingSettings::new(1);
    settings.dtype = Dtype::F16;
    settings.flash_attention = false;
    settings.recompute = recompute;
    settings.sequence_parallel = sequence_parallel;
    settings
}

/// One run of `megatron-selene/megatron-selene-runs.json` scored: without
/// a profile and, for the 22B runs, from the paper's Table 4 layer.
struct SeleneRun {
    name: String,
    model: String,
    recompute: String,
    predicted: f64,
    profiled: Option<f64>,
    measured: f64,
    fits: bool,
    peak_share: f64,
}

/// NVIDIA's Megatron-LM runs on Selene (`tests/data/outside/megatron-selene/`,
/// converted by `convert_megatron_selene.py` from github.com/calculon-ai/calculon,
/// which replays the measured iteration times of Korthikanti et al. 2022,
/// "Reducing Activation Recomputation in Large Transformer Models", Table
/// 5, and the paper's section 6.3): GPT models of 22B, 175B, 530B and 1T
/// on DGX A100 80GB nodes, tp 8, pipelines of 1 to 64 stages (the 175B and
/// 530B interleaved, three chunks a device), no data parallelism but one
/// run (the 530B on 2,240 GPUs, dp 8), each trained with full recomputation
/// and with selective recomputation plus sequence parallelism: 9 runs, all
/// of which ran. Scored without a profile (the cluster is spec sheets and
/// the paper's links), and the two 22B runs also from the paper's Table 4
/// (one layer, forward and backward, of that model at tp 8 and micro-batch
/// 4) as a one-entry profile of the blocks alone.
fn score_megatron_selene() -> Vec<SeleneRun> {
    let dir = data("megatron-selene");
    let text = std::fs::read_to_string(dir.join("megatron-selene-runs.json")).unwrap();
    let runs: Value = serde_json::from_str(&text).unwrap();
    let s = &runs["settings"];
    assert_eq!(
        (
            s["dtype"].as_str(),
            s["flash_attention"].as_bool(),
            s["schedule"].as_str()
        ),
        (Some("f16"), Some(false), Some("1f1b"))
    );
    let cluster = ClusterSpec::load(&dir.join("selene-a100-80g.toml")).unwrap();
    let mut out = Vec::new();
    for run in runs["runs"].as_array().unwrap() {
        let name = run["name"].as_str().unwrap().to_string();
        let model_name = run["model"].as_str().unwrap();
        let model = ModelSpec::load(&dir.join(format!("{model_name}.toml"))).unwrap();
        let recompute = run["settings"]["recompute"].as_str().unwrap().to_string();
        let settings = selene_settings(
            match recompute.as_str() {
                "full" => polychip_planner::settings::Recompute::Full,
                "selective" => polychip_planner::settings::Recompute::Selective,
                other => panic!("{name}: recompute {other}"),
            },
            run["settings"]["sequence_parallel"].as_bool().unwrap(),
        );
        let spec = PlanSpec::parse(&run["plan"].to_string(), true)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let ev =
            evaluate(&spec, &model, &cluster, &settings).unwrap_or_else(|e| panic!("{name}: {e}"));
        // The 22B runs from the paper's layer of the same run's technique
        // (`megatron-selene-profile-22b-{full,seqsel}.json`).
        let profiled = (model_name == "megatron-22b").then(|| {
            let mode = if recompute == "full" {
                "full"
            } else {
                "seqsel"
            };
            let profile =
                ProfileFile::load(&dir.join(format!("megatron-selene-profile-22b-{mode}.json")))
                    .unwrap();
            let mut measured = cluster.clone();
            let applied = measured.apply_profile(&profile, &model, &settings).unwrap();
            assert_eq!(applied.covered.len(), 1, "{name}");
            evaluate(&spec, &model, &measured, &settings)
                .unwrap_or_else(|e| panic!("{name} with the profile: {e}"))
                .plan
                .step_time_simulated
        });
        let peak_share = peak_share(&ev);
        out.push(SeleneRun {
            name,
            model: model_name.to_string(),
            recompute,
            predicted: ev.plan.step_time_simulated,
            profiled,
            measured: run["measured_step_s"].as_f64().unwrap(),
            fits: ev.fits,
            peak_share,
        });
    }
    out
}

/// The Selene runs (see `score_megatron_selene`): prints every run, the
/// figures over the 9 (seconds per sequence), and per model what selective
/// recomputation with sequence parallelism saves over full recomputation,
/// measured and predicted.
#[test]
fn the_cluster_model_scores_megatrons_selene_runs() {
    let runs = score_megatron_selene();
    println!("megatron-selene-runs.json on selene-a100-80g (seconds per iteration):");
    println!(
        "  {:<28} {:>11} {:>11} {:>10} {:>9} {:>5}",
        "run", "predicted", "profiled", "measured", "peak/cap", "fits"
    );
    for r in &runs {
        println!(
            "  {:<28} {:>11.3} {:>11} {:>10.2} {:>9.2} {:>5}",
            r.name,
            r.predicted,
            r.profiled.map_or("-".into(), |p| format!("{p:.3}")),
            r.measured,
            r.peak_share,
            r.fits
        );
    }
    // Ranked by seconds per sequence, as the global batches differ.
    let text = std::fs::read_to_string(data("megatron-selene/megatron-selene-runs.json")).unwrap();
    let json: Value = serde_json::from_str(&text).unwrap();
    let sequences: Vec<f64> = json["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r["plan"]["groups"]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| {
                    (g["copies"].as_u64().unwrap()
                        * g["micro_batch_size"].as_u64().unwrap()
                        * g["micro_batches"].as_u64().unwrap()) as f64
                })
                .sum()
        })
        .collect();
    let p: Vec<f64> = runs
        .iter()
        .zip(&sequences)
        .map(|(r, n)| r.predicted / n)
        .collect();
    let m: Vec<f64> = runs
        .iter()
        .zip(&sequences)
        .map(|(r, n)| r.measured / n)
        .collect();
    let scale = one_scale(&p, &m);
    let rho = spearman(&p, &m);
    let err = median_error(&p, &m, 1.0);
    let err_scaled = median_error(&p, &m, scale);
    let fit = runs.iter().filter(|r| r.fits).count();
    println!(
        "  {} runs without a profile: Spearman {rho:.3}, top-1 regret {:.1}%, median error \
         {:.1}% as given, {:.1}% after scaling by {scale:.3}; {fit}/{} predicted to fit (all ran)",
        runs.len(),
        100.0 * topk_regret(&p, &m, 1),
        100.0 * err,
        100.0 * err_scaled,
        runs.len()
    );
    // Within each model: the full-recompute run's time over the selective +
    // sequence-parallel one's (the paper's "throughput increase", 29-32%).
    let mut gains = Vec::new();
    for full in runs.iter().filter(|r| r.recompute == "full") {
        let sel = runs
            .iter()
            .find(|r| r.model == full.model && r.recompute == "selective")
            .unwrap();
        let (measured, predicted) = (full.measured / sel.measured, full.predicted / sel.predicted);
        println!(
            "  {}: full recompute / selective + sequence parallel: measured {measured:.3}, \
             predicted {predicted:.3}{}",
            full.model,
            match (full.profiled, sel.profiled) {
                (Some(f), Some(s)) => format!(", from Table 4's layer {:.3}", f / s),
                _ => String::new(),
            }
        );
        gains.push((measured, predicted));
    }
    let dp1 = runs
        .iter()
        .find(|r| r.name == "turing-530B/seqsel")
        .unwrap();
    let dp8 = runs
        .iter()
        .find(|r| r.name == "turing-530B/seqsel/dp8")
        .unwrap();
    println!(
        "  530B at dp 8 over dp 1 (2,240 over 280 GPUs): measured {:.3}, predicted {:.3}",
        dp8.measured / dp1.measured,
        dp8.predicted / dp1.predicted
    );
    for r in runs.iter().filter(|r| r.profiled.is_some()) {
        println!(
            "  {} from Table 4's layer alone: {:.3} s against {:.2} measured ({:+.1}%)",
            r.name,
            r.profiled.unwrap(),
            r.measured,
            100.0 * (r.profiled.unwrap() / r.measured - 1.0)
        );
    }
    // One 22B block (a middle stage of one layer, tp 8, micro-batch 4) as
    // the cost model prices it, against Table 4's measured layer.
    {
        use polychip_planner::cost::{Microbatching, StageShape, analytic_stage_timing};
        let dir = data("megatron-selene");
        let cluster = ClusterSpec::load(&dir.join("selene-a100-80g.toml")).unwrap();
        let model = ModelSpec::load(&dir.join("megatron-22b.toml")).unwrap();
        for (mode, recompute, sp) in [
            ("full", polychip_planner::settings::Recompute::Full, false),
            (
                "seqsel",
                polychip_planner::settings::Recompute::Selective,
                true,
            ),
        ] {
            let settings = selene_settings(recompute, sp);
            let shape = StageShape {
                chip: &cluster.chip_types[0],
                layers: 0..1,
                index: 1,
                num_stages: 3,
                dp: 1,
                tp: 8,
                next: None,
                dp_peers: &[],
                dp_one_node: true,
            };
            let mb = Microbatching { size: 4, count: 1 };
            let t = analytic_stage_timing(&model, &settings, &cluster, &shape, mb);
            let profile =
                ProfileFile::load(&dir.join(format!("megatron-selene-profile-22b-{mode}.json")))
                    .unwrap();
            let b = &profile.entries[0].block;
            println!(
                "  22B block, {mode}: cost model forward {:.2} ms, backward {:.2} ms (recompute \
                 included); Table 4 {:.1} and {:.1} ms{}",
                1e3 * t.forward,
                1e3 * t.backward,
                1e3 * b.forward,
                1e3 * b.backward,
                if mode == "full" {
                    " (no recompute; 19.5 with it)"
                } else {
                    ""
                }
            );
        }
    }
    // Floors at what the model achieves: Spearman 1.000 (the models'
    // sizes order the runs; the figure that discriminates is the next
    // one); the gain of selective recomputation with sequence parallelism
    // over full recomputation 0.2-2.5% over the measured on the 175B,
    // 530B and 1T (0.3% before stop 43 split the pipeline sends by tp: the
    // sends priced whole had narrowed the gap), and 5.3% over it on the
    // 22B (1.360 against 1.291: its full recomputation's backward is
    // priced at 24.6 ms a layer against Table 4's 19.5; before sequence
    // parallelism split the norms and residual adds, 1.322, and the others
    // 0.1-1.3% off); 35.0% too slow as given at the guessed efficiency 0.5
    // (the runs' MFU is 41-56%; 46.0% with the sends whole), 6.8% after one
    // scale (x 0.754; 9.0%), the large models relatively faster than the
    // 22B as on vTrain's runs; from Table 4's layer alone the 22B runs
    // within 4.2% and 6.5%; every run predicted to fit.
    assert!(rho >= 0.95, "Spearman {rho:.3}");
    for (measured, predicted) in &gains {
        assert!(
            (predicted / measured - 1.0).abs() <= 0.06,
            "gain predicted {predicted:.3}, measured {measured:.3}"
        );
    }
    let large_gains = &gains[1..]; // the 22B is first in the file
    assert!(
        large_gains.iter().all(|(m, p)| (p / m - 1.0).abs() <= 0.03),
        "gains of the large models {large_gains:?}"
    );
    assert!(err <= 0.4, "median error {err:.3}");
    assert!(
        err_scaled <= 0.08,
        "median error after one scale {err_scaled:.3}"
    );
    for r in runs.iter().filter(|r| r.profiled.is_some()) {
        let e = (r.profiled.unwrap() / r.measured - 1.0).abs();
        assert!(e <= 0.08, "{} from the profile: {e:.3}", r.name);
    }
    assert!(
        dp8.predicted > dp1.predicted,
        "data parallelism predicted to cost nothing"
    );
    assert_eq!(fit, runs.len(), "a run that ran was predicted not to fit");
}

/// BigScience's runs' settings (Megatron-DeepSpeed, February 2022): fp16
/// with full recomputation, no flash attention or sequence parallelism,
/// ZeRO-1 (the optimizer state sharded over the replicas); gradients in
/// fp16 (2 bytes) when `fp16_gradients`, else the Megatron count of 4.
fn bigscience_settings(fp16_gradients: bool) -> TrainingSettings {
    let mut settings = TrainingSettings::new(1);
    settings.dtype = Dtype::F16;
    settings.recompute = polychip_planner::settings::Recompute::Full;
    settings.flash_attention = false;
    settings.sequence_parallel = false;
    settings.shard_optimizer = true;
    settings.bf16_gradients = fp16_gradients;
    settings
}

/// One run of `bigscience-jean-zay/bigscience-runs.json` scored without a
/// profile: its plan's degrees, predicted and measured seconds per
/// sequence (measured `None`: it ran out of memory), whether it is
/// predicted to fit, its predicted and measured peak memory.
struct BigscienceRun {
    name: String,
    degrees: [u64; 4],
    ran: bool,
    predicted: f64,
    measured: Option<f64>,
    fits: bool,
    fits_4_byte_gradients: bool,
    peak_share: f64,
    predicted_peak: f64,
    predicted_peak_4_byte_gradients: f64,
    measured_peak: Option<f64>,
    /// The first stage's forward and backward and the last stage's
    /// all-reduce of its gradients, seconds (what the step is made of).
    forward_backward: f64,
    dp_allreduce: f64,
    send: f64,
    optimizer: f64,
    analytic: f64,
    /// Sequences per step (the plan's global batch).
    sequences: f64,
}

/// BigScience's topology sweep of the 181B model before BLOOM
/// (`tests/data/outside/bigscience-jean-zay/`, converted by
/// `convert_bigscience.py` from github.com/bigscience-workshop/bigscience,
/// `train/tr11-176B-ml/chronicles-prequel.md`, the runs of 2022-02-25):
/// one model (72 layers, hidden 14,336) on 48 nodes of 8 A100 80GB of
/// Jean Zay, 24 plans over tp 2/4/8, 1-24 stages, 4-48 replicas and
/// micro-batches of 1-6, 3 of which ran out of memory. No per-layer
/// profile exists for them. Every GPU's NIC bandwidth is `nic` bytes/s
/// when given (the cluster file's spec sheet otherwise).
fn score_bigscience(nic: Option<f64>) -> Vec<BigscienceRun> {
    let dir = data("bigscience-jean-zay");
    let text = std::fs::read_to_string(dir.join("bigscience-runs.json")).unwrap();
    let runs: Value = serde_json::from_str(&text).unwrap();
    let s = &runs["settings"];
    assert_eq!(
        (
            s["dtype"].as_str(),
            s["recompute"].as_str(),
            s["shard_optimizer"].as_bool(),
            s["gradient_bytes"].as_u64()
        ),
        (Some("f16"), Some("full"), Some(true), Some(2))
    );
    let mut cluster = ClusterSpec::load(&dir.join("jean-zay-a100-80g.toml")).unwrap();
    if let Some(nic) = nic {
        cluster
            .chip_types
            .iter_mut()
            .for_each(|t| t.nic_bandwidth = nic);
    }
    let model = ModelSpec::load(&dir.join("bigscience-181b.toml")).unwrap();
    let (settings, four_bytes) = (bigscience_settings(true), bigscience_settings(false));
    let mut out = Vec::new();
    for run in runs["runs"].as_array().unwrap() {
        let name = run["name"].as_str().unwrap().to_string();
        let spec = PlanSpec::parse(&run["plan"].to_string(), true)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let ev =
            evaluate(&spec, &model, &cluster, &settings).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ev4 = evaluate(&spec, &model, &cluster, &four_bytes)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let group = &run["plan"]["groups"][0];
        let stages = group["stages"].as_array().unwrap();
        let degrees = [
            group["copies"].as_u64().unwrap(),
            stages[0]["tp"].as_u64().unwrap(),
            stages.len() as u64,
            group["micro_batch_size"].as_u64().unwrap(),
        ];
        let sequences = ev.plan.global_batch as f64;
        let replica = &ev.plan.replicas[0];
        let (first, last) = (&replica.stages[0], replica.stages.last().unwrap());
        out.push(BigscienceRun {
            name,
            degrees,
            ran: run["ran"].as_bool().unwrap(),
            predicted: ev.plan.step_time_simulated / sequences,
            measured: run["measured_step_s"].as_f64().map(|m| m / sequences),
            fits: ev.fits,
            fits_4_byte_gradients: ev4.fits,
            peak_share: peak_share(&ev),
            predicted_peak: ev.peak_memory_bytes(),
            predicted_peak_4_byte_gradients: ev4.peak_memory_bytes(),
            measured_peak: run["measured_peak_bytes"].as_f64(),
            forward_backward: first.timing.forward + first.timing.backward,
            dp_allreduce: last.timing.dp_allreduce,
            send: first.timing.send_next,
            optimizer: first.timing.optimizer,
            analytic: ev.plan.step_time_analytic / sequences,
            sequences,
        });
    }
    out
}

/// BigScience's runs (see `score_bigscience`): prints every run and, over
/// the 21 that ran, the ranking by seconds per sequence (global batches of
/// 1,568, 2,016 and 2,048), the errors, the outcome of every plan (3 ran
/// out of memory) and the peak memory against nvidia-smi's; and the mean
/// error per tensor-parallel degree, pipeline depth and micro-batch size.
#[test]
fn the_cluster_model_scores_bigsciences_jean_zay_runs() {
    let runs = score_bigscience(None);
    println!(
        "bigscience-runs.json on jean-zay-a100-80g (seconds per sequence; the first stage's forward + backward and the last stage's all-reduce, seconds):"
    );
    println!(
        "  {:<36} {:>10} {:>10} {:>10} {:>7} {:>8} {:>7} {:>7} {:>7} {:>9} {:>9} {:>5} {:>5}",
        "run",
        "predicted",
        "analytic",
        "measured",
        "ratio",
        "fwd+bwd",
        "send",
        "dp a-r",
        "optim.",
        "pred. GB",
        "meas. GB",
        "fits",
        "ran"
    );
    for r in &runs {
        println!(
            "  {:<36} {:>10.5} {:>10.5} {:>10} {:>7} {:>8.3} {:>7.4} {:>7.3} {:>7.3} {:>9.1} {:>9} {:>5} {:>5}",
            r.name,
            r.predicted,
            r.analytic,
            r.measured.map_or("-".into(), |m| format!("{m:.5}")),
            r.measured
                .map_or("-".into(), |m| format!("{:.3}", r.predicted / m)),
            r.forward_backward,
            r.send,
            r.dp_allreduce,
            r.optimizer,
            r.predicted_peak / 1e9,
            r.measured_peak
                .map_or("-".into(), |b| format!("{:.1}", b / 1e9)),
            r.fits,
            r.ran
        );
    }
    let ran: Vec<&BigscienceRun> = runs.iter().filter(|r| r.ran).collect();
    let p: Vec<f64> = ran.iter().map(|r| r.predicted).collect();
    let m: Vec<f64> = ran.iter().map(|r| r.measured.unwrap()).collect();
    let scale = one_scale(&p, &m);
    let rho = spearman(&p, &m);
    let regret = topk_regret(&p, &m, 1);
    let err = median_error(&p, &m, 1.0);
    let err_scaled = median_error(&p, &m, scale);
    let agree = runs.iter().filter(|r| r.fits == r.ran).count();
    let agree4 = runs
        .iter()
        .filter(|r| r.fits_4_byte_gradients == r.ran)
        .count();
    let mem: Vec<f64> = ran
        .iter()
        .filter_map(|r| Some((r.predicted_peak - r.measured_peak?) / r.measured_peak?))
        .collect();
    let mem_n = mem.len();
    let mem_err = median(mem);
    let mem4_err = median(
        ran.iter()
            .filter_map(|r| {
                Some((r.predicted_peak_4_byte_gradients - r.measured_peak?) / r.measured_peak?)
            })
            .collect(),
    );
    println!(
        "  {} runs that ran, without a profile: Spearman {rho:.3}, top-1 regret {:.1}%, median \
         error {:.1}% as given, {:.1}% after scaling by {scale:.3}",
        ran.len(),
        100.0 * regret,
        100.0 * err,
        100.0 * err_scaled
    );
    println!(
        "  outcome predicted for {agree}/{} plans with fp16 gradients ({agree4} counting 4 bytes \
         a gradient); median peak-memory error {:+.1}% over the {mem_n} with a figure \
         ({:+.1}% counting 4 bytes a gradient)",
        runs.len(),
        100.0 * mem_err,
        100.0 * mem4_err
    );
    for r in runs.iter().filter(|r| r.fits != r.ran) {
        println!(
            "    outcome missed: {} (ran: {}, predicted at {:.2} of an A100's memory)",
            r.name, r.ran, r.peak_share
        );
    }
    // Where the errors lie: the mean of log(predicted / measured) after the
    // one scale, per degree of each plan dimension.
    for (d, what) in ["dp", "tp", "pp", "micro-batch"].iter().enumerate() {
        let mut by: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
        for r in &ran {
            by.entry(r.degrees[d])
                .or_default()
                .push((scale * r.predicted / r.measured.unwrap()).ln());
        }
        let line: Vec<String> = by
            .iter()
            .map(|(k, v)| {
                format!(
                    "{k}: {:+.1}% ({})",
                    100.0 * ((v.iter().sum::<f64>() / v.len() as f64).exp() - 1.0),
                    v.len()
                )
            })
            .collect();
        println!("  scaled error by {what}: {}", line.join(", "));
    }
    // The same at the per-GPU bandwidth out of a node that BigScience's
    // all-reduce benchmark measured on 4 of these nodes a month before
    // (15 to 42 Gb/s against the spec sheet's 50).
    for gbits in [42.0, 30.0, 15.0] {
        let swept = score_bigscience(Some(gbits * 1e9 / 8.0));
        let p: Vec<f64> = swept
            .iter()
            .filter(|r| r.ran)
            .map(|r| r.predicted)
            .collect();
        let scale = one_scale(&p, &m);
        println!(
            "  at {gbits:.0} Gb/s a GPU out of a node: Spearman {:.3}, median error {:.1}% after \
             scaling by {scale:.3}",
            spearman(&p, &m),
            100.0 * median_error(&p, &m, scale)
        );
    }
    // What the ranking misses (docs/performance.md): the plans that differ
    // only in their micro-batch size show a fixed cost per layer and micro-
    // batch that the model has no term for, and the shallow pipelines a
    // slower gradient reduction than the spec sheet's. Neither is in the
    // model (no mechanism is known for the first, and the network stays the
    // spec sheet's, see the cluster file); this prints what each would do:
    // `o` seconds added per layer per micro-batch on the slowest stage's
    // path of `m + p - 1` cycles, and the reduction at `1 / f` of its speed.
    for (o, f) in [(0.015, 1.0), (0.0, 2.9), (0.015, 2.9)] {
        let p: Vec<f64> = ran
            .iter()
            .map(|r| {
                let [dp, _, pp, b] = r.degrees.map(|x| x as f64);
                let cycles = r.sequences / (dp * b) + pp - 1.0;
                r.predicted + (cycles * o * 72.0 / pp + (f - 1.0) * r.dp_allreduce) / r.sequences
            })
            .collect();
        let scale = one_scale(&p, &m);
        println!(
            "  with {:.0} ms per layer per micro-batch and the reduction at 1/{f:.2} of its \
             speed: Spearman {:.3}, median error {:.1}% after scaling by {scale:.3}",
            1e3 * o,
            spearman(&p, &m),
            100.0 * median_error(&p, &m, scale)
        );
    }
    // Floors slightly below what the model reaches (docs/performance.md):
    // Spearman -0.055 (the 21 runs' seconds per sequence span 0.054-0.072,
    // while two measurements of one plan differ by 2.8%: not noise, the
    // model misses what the lines above print; 0.025 before stop 43 split
    // the pipeline sends by tp), top-1
    // regret 25.2% (the model picks a 2-stage plan, slowed in practice by
    // its gradient all-reduce over 24 replicas), median error 18.3% as
    // given and 6.4% after one scale (x 0.871; 20.4% and 8.1% with the
    // sends whole); 23 of 24 outcomes
    // (the plan missed ran out of memory at 1.00 of an A100 by this count,
    // 0.98 before the embedding's backward and dropout mask were counted);
    // peak memory 17.5% under nvidia-smi's (the allocator's cache and the
    // CUDA context are not counted).
    assert_eq!(ran.len(), 21);
    assert!(rho >= -0.1, "Spearman {rho:.3}");
    assert!(regret <= 0.27, "top-1 regret {regret:.3}");
    assert!(err <= 0.21, "median error {err:.3}");
    assert!(
        err_scaled <= 0.1,
        "median error after one scale {err_scaled:.3}"
    );
    assert!(agree >= 23, "{agree}/{} outcomes", runs.len());
    assert!(
        (-0.22..=0.0).contains(&mem_err),
        "median peak-memory error {mem_err:.3}"
    );
}

/// DLPerf's runs' settings (NVIDIA Megatron-LM at 8aa4619f, early 2021,
/// `--fp16 --checkpoint-activations`): fp16 with full recomputation, no
/// flash attention, sequence parallelism or ZeRO; gradients in fp16 (2
/// bytes: Megatron all-reduced fp16 gradients unless told to accumulate
/// them in fp32) when `fp16_gradients`, else the Megatron count of 4.
fn dlperf_settings(fp16_gradients: bool) -> TrainingSettings {
    let mut settings = TrainingSettings::new(1);
    settings.dtype = Dtype::F16;
    settings.recompute = polychip_planner::settings::Recompute::Full;
    settings.flash_attention = false;
    settings.sequence_parallel = false;
    settings.shard_optimizer = false;
    settings.bf16_gradients = fp16_gradients;
    settings
}

/// One run of `dlperf-megatron-v100/dlperf-megatron-runs.json` scored
/// without a profile: its model, GPUs and degrees (dp, tp, pp,
/// micro-batch), predicted and measured seconds per sequence, whether it
/// is predicted to fit, predicted and measured (nvidia-smi) peak memory,
/// and what its first stage's step is made of.
struct DlperfRun {
    name: String,
    model: String,
    gpus: u64,
    global_batch: u64,
    degrees: [u64; 4],
    predicted: f64,
    measured: f64,
    fits: bool,
    fits_4_byte_gradients: bool,
    peak_share: f64,
    predicted_peak: f64,
    measured_peak: f64,
    forward_backward: f64,
    send: f64,
    dp_allreduce: f64,
    optimizer: f64,
}

/// OneFlow's DLPerf measurements of NVIDIA Megatron-LM on 4 nodes of 8
/// V100-SXM2-16GB with one 100 Gb/s InfiniBand HCA a node
/// (`tests/data/outside/dlperf-megatron-v100/`, converted by
/// `convert_dlperf.py` from github.com/Oneflow-Inc/DLPerf,
/// `Megatron-LM/README.md`): GPT models of hidden 768 to 2,304 (0.1B to
/// 1.6B parameters), sequences of 2,048, fp16 with full recomputation, on 1
/// to 32 GPUs: data, tensor (tp 1-8) and pipeline (2 and 4 stages with 32
/// micro-batches) parallelism, 16 runs that all ran (two more, tp 16 and 32
/// over several nodes, are left out). No per-layer profile exists for them.
/// Every GPU's NVLink bandwidth is `nvlink` bytes/s per direction when
/// given (the cluster file's spec sheet otherwise).
fn score_dlperf(nvlink: Option<f64>) -> Vec<DlperfRun> {
    let dir = data("dlperf-megatron-v100");
    let text = std::fs::read_to_string(dir.join("dlperf-megatron-runs.json")).unwrap();
    let runs: Value = serde_json::from_str(&text).unwrap();
    let s = &runs["settings"];
    assert_eq!(
        (
            s["dtype"].as_str(),
            s["recompute"].as_str(),
            s["shard_optimizer"].as_bool(),
            s["gradient_bytes"].as_u64(),
            s["schedule"].as_str()
        ),
        (
            Some("f16"),
            Some("full"),
            Some(false),
            Some(2),
            Some("1f1b")
        )
    );
    let mut cluster = ClusterSpec::load(&dir.join("dlperf-v100-16g.toml")).unwrap();
    if let Some(nvlink) = nvlink {
        cluster
            .chip_types
            .iter_mut()
            .for_each(|t| t.intra_node_bandwidth = nvlink);
    }
    let (settings, four_bytes) = (dlperf_settings(true), dlperf_settings(false));
    let mut out = Vec::new();
    for run in runs["runs"].as_array().unwrap() {
        let name = run["name"].as_str().unwrap().to_string();
        let model_name = run["model"].as_str().unwrap().to_string();
        let model = ModelSpec::load(&dir.join(format!("{model_name}.toml"))).unwrap();
        let spec = PlanSpec::parse(&run["plan"].to_string(), true)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let ev =
            evaluate(&spec, &model, &cluster, &settings).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ev4 = evaluate(&spec, &model, &cluster, &four_bytes)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let group = &run["plan"]["groups"][0];
        let stages = group["stages"].as_array().unwrap();
        let degrees = [
            group["copies"].as_u64().unwrap(),
            stages[0]["tp"].as_u64().unwrap(),
            stages.len() as u64,
            group["micro_batch_size"].as_u64().unwrap(),
        ];
        let sequences = ev.plan.global_batch as f64;
        let replica = &ev.plan.replicas[0];
        let (first, last) = (&replica.stages[0], replica.stages.last().unwrap());
        out.push(DlperfRun {
            name,
            model: model_name,
            gpus: run["gpus"].as_u64().unwrap(),
            global_batch: ev.plan.global_batch,
            degrees,
            predicted: ev.plan.step_time_simulated / sequences,
            measured: run["measured_step_s"].as_f64().unwrap() / sequences,
            fits: ev.fits,
            fits_4_byte_gradients: ev4.fits,
            peak_share: peak_share(&ev),
            predicted_peak: ev.peak_memory_bytes(),
            measured_peak: run["measured_peak_bytes"].as_f64().unwrap(),
            forward_backward: first.timing.forward + first.timing.backward,
            send: first.timing.send_next,
            dp_allreduce: last.timing.dp_allreduce,
            optimizer: first.timing.optimizer,
        });
    }
    out
}

/// Spearman, top-1 and top-3 regret, median error as given and after one
/// scale (and the scale) of `predicted` against `measured`.
fn dlperf_figures(p: &[f64], m: &[f64]) -> (f64, f64, f64, f64, f64, f64) {
    let scale = one_scale(p, m);
    (
        spearman(p, m),
        topk_regret(p, m, 1),
        topk_regret(p, m, 3),
        median_error(p, m, 1.0),
        median_error(p, m, scale),
        scale,
    )
}

/// DLPerf's Megatron-LM runs (see `score_dlperf`): prints every run and the
/// figures over the 16, ranked by seconds per sequence (the runs use 1 to
/// 32 GPUs and global batches of 2 to 512) and by GPU-seconds per sequence
/// (seconds per sequence times the GPUs: how well each plan uses its GPUs,
/// the harder ranking), per model and over the plans that share GPUs and
/// global batch; the outcome of every plan (all ran) and the peak memory
/// against nvidia-smi's; and the mean error per plan dimension.
#[test]
fn the_cluster_model_scores_dlperfs_megatron_v100_runs() {
    let runs = score_dlperf(None);
    println!(
        "dlperf-megatron-runs.json on dlperf-v100-16g (seconds per sequence; the first stage's forward + backward, send and the last stage's all-reduce, seconds a step):"
    );
    println!(
        "  {:<38} {:>4} {:>10} {:>10} {:>7} {:>8} {:>7} {:>7} {:>7} {:>8} {:>8} {:>5}",
        "run",
        "gpus",
        "predicted",
        "measured",
        "ratio",
        "fwd+bwd",
        "send",
        "dp a-r",
        "optim.",
        "pred. GB",
        "meas. GB",
        "fits"
    );
    for r in &runs {
        println!(
            "  {:<38} {:>4} {:>10.5} {:>10.5} {:>7.3} {:>8.4} {:>7.4} {:>7.4} {:>7.4} {:>8.2} {:>8.2} {:>5}",
            r.name,
            r.gpus,
            r.predicted,
            r.measured,
            r.predicted / r.measured,
            r.forward_backward,
            r.send,
            r.dp_allreduce,
            r.optimizer,
            r.predicted_peak / 1e9,
            r.measured_peak / 1e9,
            r.fits
        );
    }
    let p: Vec<f64> = runs.iter().map(|r| r.predicted).collect();
    let m: Vec<f64> = runs.iter().map(|r| r.measured).collect();
    let (rho, regret, regret3, err, err_scaled, scale) = dlperf_figures(&p, &m);
    println!(
        "  {} runs by seconds per sequence, without a profile: Spearman {rho:.3}, top-1 regret \
         {:.1}%, top-3 regret {:.1}%, median error {:.1}% as given, {:.1}% after scaling by \
         {scale:.3}",
        runs.len(),
        100.0 * regret,
        100.0 * regret3,
        100.0 * err,
        100.0 * err_scaled
    );
    let gpu_s = |v: &[f64]| -> Vec<f64> {
        v.iter()
            .zip(&runs)
            .map(|(x, r)| x * r.gpus as f64)
            .collect()
    };
    let (gp, gm) = (gpu_s(&p), gpu_s(&m));
    let (grho, gregret, gregret3, _, _, _) = dlperf_figures(&gp, &gm);
    println!(
        "  by GPU-seconds per sequence: Spearman {grho:.3}, top-1 regret {:.1}%, top-3 regret \
         {:.1}%",
        100.0 * gregret,
        100.0 * gregret3
    );
    // Per model, and over the plans that share GPUs and global batch (the
    // question a planner answers: which plan for these GPUs).
    let mut subsets: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, r) in runs.iter().enumerate() {
        subsets.entry(r.model.clone()).or_default().push(i);
        subsets
            .entry(format!(
                "{} on {} GPUs, batch {}",
                r.model, r.gpus, r.global_batch
            ))
            .or_default()
            .push(i);
    }
    let mut per_model = BTreeMap::new();
    for (what, idx) in subsets.iter().filter(|(_, v)| v.len() >= 3) {
        let sp: Vec<f64> = idx.iter().map(|&i| gp[i]).collect();
        let sm: Vec<f64> = idx.iter().map(|&i| gm[i]).collect();
        let (rho, regret, _, _, err_scaled, scale) = dlperf_figures(&sp, &sm);
        println!(
            "  {what}: {} runs by GPU-seconds per sequence, Spearman {rho:.3}, top-1 regret \
             {:.1}%, median error {:.1}% after scaling by {scale:.3}",
            idx.len(),
            100.0 * regret,
            100.0 * err_scaled
        );
        per_model.insert(what.clone(), (rho, regret));
    }
    let agree = runs.iter().filter(|r| r.fits).count();
    let agree4 = runs.iter().filter(|r| r.fits_4_byte_gradients).count();
    let mem_err = median(
        runs.iter()
            .map(|r| (r.predicted_peak - r.measured_peak) / r.measured_peak)
            .collect(),
    );
    println!(
        "  outcome predicted for {agree}/{} plans with fp16 gradients ({agree4} counting 4 bytes \
         a gradient); median peak-memory error {:+.1}% against nvidia-smi",
        runs.len(),
        100.0 * mem_err
    );
    for r in runs.iter().filter(|r| !r.fits) {
        println!(
            "    outcome missed: {} ran, predicted at {:.2} of a V100's memory",
            r.name, r.peak_share
        );
    }
    // Where the errors lie: the mean of log(predicted / measured) after the
    // one scale, per degree of each plan dimension (every run recomputes
    // fully: there is no recomputation dimension).
    for (d, what) in ["dp", "tp", "pp", "micro-batch"].iter().enumerate() {
        let mut by: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
        for r in &runs {
            by.entry(r.degrees[d])
                .or_default()
                .push((scale * r.predicted / r.measured).ln());
        }
        let line: Vec<String> = by
            .iter()
            .map(|(k, v)| {
                format!(
                    "{k}: {:+.1}% ({})",
                    100.0 * ((v.iter().sum::<f64>() / v.len() as f64).exp() - 1.0),
                    v.len()
                )
            })
            .collect();
        println!("  scaled error by {what}: {}", line.join(", "));
    }
    // The same at less NVLink bandwidth per GPU than the spec sheet's 150
    // GB/s: the hybrid cube mesh joins a tp-2 pair by one 25 GB/s link and
    // reaches four of a GPU's seven peers.
    for gbs in [75.0, 50.0, 25.0] {
        let swept = score_dlperf(Some(gbs * 1e9));
        let p: Vec<f64> = swept.iter().map(|r| r.predicted).collect();
        let (rho, _, _, _, err_scaled, scale) = dlperf_figures(&p, &m);
        let (grho, ..) = dlperf_figures(&gpu_s(&p), &gm);
        println!(
            "  at {gbs:.0} GB/s of NVLink a GPU: Spearman {rho:.3} ({grho:.3} by GPU-seconds), \
             median error {:.1}% after scaling by {scale:.3}",
            100.0 * err_scaled
        );
    }
    // Floors slightly below what the model reaches (docs/planner.md):
    // Spearman 0.966 by seconds per sequence and 0.976 by GPU-seconds, no
    // top-1 or top-3 regret, median error 14.2% as given (every run
    // predicted faster: x 1.179) and 6.0% after one scale; 0.915 over the
    // 1536x16 model's 10 runs and 0.912 over its 6 plans of one node;
    // 16/16 outcomes (15 before the loss's buffers and the last layer's
    // transients were no longer added); peak memory 15.4% under
    // nvidia-smi's.
    assert_eq!(runs.len(), 16);
    assert!(rho >= 0.95, "Spearman {rho:.3}");
    assert!(grho >= 0.95, "Spearman by GPU-seconds {grho:.3}");
    assert!(
        regret <= 0.01 && gregret <= 0.01,
        "top-1 regret {regret:.3} {gregret:.3}"
    );
    assert!(
        regret3 <= 0.01 && gregret3 <= 0.01,
        "top-3 regret {regret3:.3} {gregret3:.3}"
    );
    assert!(err <= 0.16, "median error {err:.3}");
    assert!(
        err_scaled <= 0.07,
        "median error after one scale {err_scaled:.3}"
    );
    let node = "gpt-h1536-l16-a16-s2048 on 8 GPUs, batch 16";
    assert!(per_model[node].0 >= 0.9, "{node}: {:?}", per_model[node]);
    assert!(per_model["gpt-h1536-l16-a16-s2048"].0 >= 0.9);
    assert_eq!(agree, runs.len(), "a run that ran was predicted not to fit");
    assert!(
        (-0.2..=0.0).contains(&mem_err),
        "median peak-memory error {mem_err:.3}"
    );
}

/// NVIDIA's Megatron-Bridge performance runs on DGX H100
/// (`tests/data/outside/megatron-bridge-h100/`, converted by
/// `convert_megatron_bridge.py` from the project's published tables):
/// Llama 3 8B under Megatron FSDP (ZeRO-3) on 8 GPUs, Llama 3 70B at tp 4
/// and 8 interleaved stages of 5 chunks on 64, Llama 3.1 405B at tp 8, 8
/// interleaved stages of 8 chunks and context parallelism 2 on 1,024, each
/// in FP8 with current scaling; and Qwen3-30B-A3B, a mixture of 128
/// experts (8 a token) with wide heads, at 8-way expert parallelism over
/// 2 interleaved stages on 16; 7 runs (two configurations of the 70B, the
/// 405B and the 30B-A3B), all of which ran. Scored without a profile, in FP8 and
/// (for comparison) as if in bf16, ranked by seconds per token per GPU.
/// The bar without a profile: Spearman >= 0.7; every run predicted to fit.
#[test]
fn the_cluster_model_scores_megatron_bridges_h100_runs() {
    let dir = data("megatron-bridge-h100");
    let text = std::fs::read_to_string(dir.join("megatron-bridge-h100-runs.json")).unwrap();
    let runs: Value = serde_json::from_str(&text).unwrap();
    let cluster = ClusterSpec::load(&dir.join("dgx-h100.toml")).unwrap();
    println!("megatron-bridge-h100-runs.json on dgx-h100 (seconds per step):");
    println!(
        "  {:<22} {:>10} {:>10} {:>10} {:>9} {:>5}",
        "run", "as run", "as bf16", "measured", "peak/cap", "fits"
    );
    // The dense runs, and the mixture's apart: (predicted in fp8, as bf16,
    // measured, fits) by seconds per token per GPU.
    let (mut dense, mut moe, mut moe_names) = (Vec::new(), Vec::new(), Vec::new());
    for run in runs["runs"].as_array().unwrap() {
        let name = run["name"].as_str().unwrap();
        let model =
            ModelSpec::load(&dir.join(format!("{}.toml", run["model"].as_str().unwrap()))).unwrap();
        let mut settings = TrainingSettings::new(1);
        settings.dtype = Dtype::Bf16;
        // FP8 matmuls, but where a run trained in bf16 (GPT-OSS 120B's).
        settings.fp8 = run["settings"]["fp8"].as_bool().unwrap();
        settings.bf16_gradients = true;
        settings.overlap_grad_reduce = true;
        // The loss the runs file gives: Transformer Engine's cross-entropy
        // (Megatron-Bridge's performance scripts set
        // `cross_entropy_fusion_impl = "te"`), which wrote the gradient into
        // the logits until July 2026.
        settings.loss = runs["settings"]["loss"].as_str().unwrap().parse().unwrap();
        assert_eq!(settings.loss, LossKernel::Fused);
        settings.zero_stage = run["settings"]["zero_stage"].as_u64().unwrap() as u8;
        settings.overlap_param_gather = settings.zero_stage == 1;
        settings.context_parallel = run["settings"]["context_parallel"].as_u64().unwrap();
        settings.expert_parallel = run["settings"]["expert_parallel"].as_u64().unwrap();
        settings.expert_tensor_parallel =
            run["settings"]["expert_tensor_parallel"].as_u64().unwrap();
        // Selective recomputation of the modules a recipe names.
        for name in run["settings"]["recompute_modules"].as_array().unwrap() {
            let module = RecomputeModule::from_name(name.as_str().unwrap()).unwrap();
            settings.recompute = Recompute::Selective;
            settings.recompute_modules.push(module);
        }
        let spec = PlanSpec::parse(&run["plan"].to_string(), true)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let ev =
            evaluate(&spec, &model, &cluster, &settings).unwrap_or_else(|e| panic!("{name}: {e}"));
        // A model attending over a window, also priced as if its every
        // layer attended the whole sequence (what its window changes).
        if model.window_layers > 0 {
            let full = ModelSpec {
                sliding_window: 0,
                attention_chunk: 0,
                window_layers: 0,
                ..model.clone()
            };
            let whole = evaluate(&spec, &full, &cluster, &settings).unwrap();
            println!(
                "  {name}: {:.3} s with its window, {:.3} s without it",
                ev.plan.step_time_simulated, whole.plan.step_time_simulated
            );
        }
        settings.fp8 = false;
        let bf16 = evaluate(&spec, &model, &cluster, &settings).unwrap();
        let measured = run["measured_step_s"].as_f64().unwrap();
        let tokens = (run["gpus"].as_u64().unwrap() as f64)
            * ev.plan.global_batch as f64
            * model.seq_len as f64;
        println!(
            "  {:<22} {:>10.3} {:>10.3} {:>10.3} {:>9.2} {:>5}",
            name,
            ev.plan.step_time_simulated,
            bf16.plan.step_time_simulated,
            measured,
            peak_share(&ev),
            ev.fits
        );
        // Seconds per token per GPU: the runs train different models on
        // different clusters.
        let row = (
            ev.plan.step_time_simulated / tokens,
            bf16.plan.step_time_simulated / tokens,
            measured / tokens,
            ev.fits,
        );
        match model.is_moe() {
            true => {
                moe.push(row);
                moe_names.push((name.to_string(), row));
            }
            false => dense.push(row),
        }
    }
    let figures = |what: &str, rows: &[(f64, f64, f64, bool)]| {
        let p: Vec<f64> = rows.iter().map(|r| r.0).collect();
        let p16: Vec<f64> = rows.iter().map(|r| r.1).collect();
        let m: Vec<f64> = rows.iter().map(|r| r.2).collect();
        let fits = rows.iter().filter(|r| r.3).count();
        let (scale, rho) = (one_scale(&p, &m), spearman(&p, &m));
        let scale16 = one_scale(&p16, &m);
        println!(
            "  {} {what} runs as run (fp8 but GPT-OSS's bf16) without a profile: Spearman \
             {rho:.3}, median error {:.1}% as given, {:.1}% after scaling by {scale:.3}; \
             {fits}/{} predicted to fit (all ran); priced as bf16: median error {:.1}% as \
             given, {:.1}% after scaling by {scale16:.3}",
            p.len(),
            100.0 * median_error(&p, &m, 1.0),
            100.0 * median_error(&p, &m, scale),
            p.len(),
            100.0 * median_error(&p16, &m, 1.0),
            100.0 * median_error(&p16, &m, scale16)
        );
        (rho, fits, scale)
    };
    let (rho, fits, _) = figures("dense", &dense);
    assert!(rho >= 0.7, "Spearman {rho:.3}");
    assert_eq!(fits, dense.len(), "every dense run ran");
    // The mixtures: ranked by their seconds a token a GPU; Qwen3-30B-A3B's
    // two runs (hidden 2048, 128 experts of 768) took 2.3 times their
    // predicted steps and GPT-OSS 120B's (hidden 2880, 128 experts of
    // 2880, in bf16) 1.35 times, a known miss of narrow experts
    // (docs/planner.md), while Qwen3-235B's and DeepSeek-V3's took less
    // than predicted, as the dense runs do (the planner's efficiency of
    // 0.5 below what H100s reach).
    let (rho, _, _) = figures("mixture-of-experts", &moe);
    assert!(rho >= 0.7, "the mixtures' Spearman {rho:.3}");
    for (name, (p, _, m, _)) in &moe_names {
        let ratio = m / p;
        println!("  {name}: measured / predicted {ratio:.3}");
        match name.split('/').next().unwrap() {
            "qwen3-30b-a3b" => assert!(ratio > 2.0, "{name}: {ratio:.3}"),
            "gpt-oss-120b" => assert!((1.0..2.0).contains(&ratio), "{name}: {ratio:.3}"),
            _ => assert!((0.5..1.0).contains(&ratio), "{name}: {ratio:.3}"),
        }
    }
}

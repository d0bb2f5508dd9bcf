//! `polychip plan --evaluate`'s library side: a given plan is scored with
//! the model the search uses (the search's own answer, evaluated, gives its
//! step time back exactly), every plan-file form parses, memory shortfalls
//! are reported per stage, and inconsistent plans are refused naming what
//! is wrong.

mod common;

use common::example_cluster;
use polychip_planner::cluster::ClusterSpec;
use polychip_planner::evaluate::{PlanSpec, evaluate};
use polychip_planner::model::ModelSpec;
use polychip_planner::profile::{FORMAT, Passes, ProfileEntry, ProfileFile};
use polychip_planner::schedule::PipelineSchedule;
use polychip_planner::search::{PlanOptions, plan};
use polychip_planner::settings::{Dtype, Recompute, TrainingSettings};

fn err(text: &str, json: bool, model: &ModelSpec) -> String {
    let spec = match PlanSpec::parse(text, json) {
        Ok(s) => s,
        Err(e) => return e.to_string(),
    };
    evaluate(&spec, model, &example_cluster(), &TrainingSettings::new(64))
        .map(|_| String::new())
        .unwrap_or_else(|e| e.to_string())
}

#[test]
fn the_searchs_answer_evaluates_to_its_own_prediction() {
    let (c, m) = (example_cluster(), ModelSpec::llama_7b());
    let s = TrainingSettings::new(256);
    let report = plan(&m, &c, &s, &PlanOptions::default()).unwrap();
    let json = serde_json::to_string(&report).unwrap();
    let spec = PlanSpec::parse(&json, true).unwrap();
    let ev = evaluate(&spec, &m, &c, &s).unwrap();
    // Searched under zero bubble, the answer names it and evaluates under
    // it with the default settings too.
    let mut zb = s.clone();
    zb.schedule = PipelineSchedule::ZeroBubble;
    let zb_report = plan(&m, &c, &zb, &PlanOptions::default()).unwrap();
    let zb_spec = PlanSpec::parse(&serde_json::to_string(&zb_report).unwrap(), true).unwrap();
    assert_eq!(zb_spec.schedule, Some(PipelineSchedule::ZeroBubble));
    let zb_ev = evaluate(&zb_spec, &m, &c, &s).unwrap();
    assert_eq!(
        zb_ev.plan.step_time_simulated,
        zb_report.plan.step_time_simulated
    );
    assert_eq!(ev.plan.step_time_simulated, report.plan.step_time_simulated);
    assert_eq!(ev.plan.step_time_analytic, report.plan.step_time_analytic);
    assert_eq!(ev.plan.replicas, report.plan.replicas);
    assert!(ev.fits && ev.overflows.is_empty());
    let slowest = &ev.plan.replicas[ev.bottleneck.group].stages;
    let t = |i: usize| slowest[i].timing.forward + slowest[i].timing.backward;
    assert!((0..slowest.len()).all(|i| t(i) <= t(ev.bottleneck.stage)));
    // The report records its settings, which a caller evaluates it under
    // (`polychip plan --evaluate` does): recomputation and a sharded
    // optimizer give back the same step (without them, 24% less).
    let mut other = s.clone();
    (other.recompute, other.shard_optimizer) = (Recompute::Full, true);
    let report = plan(&m, &c, &other, &PlanOptions::default()).unwrap();
    let spec = PlanSpec::parse(&serde_json::to_string(&report).unwrap(), true).unwrap();
    assert_eq!(spec.settings.as_ref(), Some(&other));
    assert_eq!(spec.made_for, Some((m.name.clone(), m.seq_len)));
    let ev = evaluate(&spec, &m, &c, spec.settings.as_ref().unwrap()).unwrap();
    assert_eq!(ev.plan.step_time_simulated, report.plan.step_time_simulated);
    let defaults = evaluate(&spec, &m, &c, &s).unwrap();
    assert!(defaults.plan.step_time_simulated < 0.9 * report.plan.step_time_simulated);
}

#[test]
fn a_train_plan_a_chip_plan_and_a_toml_plan_parse_alike() {
    let m = ModelSpec::llama_7b();
    let train = r#"{"group": [{"copies": 2, "micro_batch_size": 1, "micro_batches": 32,
        "stages": [{"device": "nvidia-a800-class", "layers": [0, 20]},
                   {"device": "iluvatar-bi-v100-class", "layers": [20, 32]}]}]}"#;
    let chips = r#"{"groups": [{"copies": 2, "micro_batch_size": 1, "micro_batches": 32,
        "stages": [{"chip": "nvidia-a800-class", "tp": 1, "layers": [0, 20]},
                   {"chip": "iluvatar-bi-v100-class", "layers": [20, 32]}]}]}"#;
    let toml = r#"
[[group]]
copies = 2
micro_batch_size = 1
micro_batches = 32
stages = [{ device = "nvidia-a800-class", layers = [0, 20] },
          { device = "iluvatar-bi-v100-class", layers = [20, 32] }]
"#;
    let counts = r#"{"groups": [{"dp": 2, "micro_batch_size": 1, "micro_batches": 32,
        "stages": [{"chip": "nvidia-a800-class", "layers": 20},
                   {"chip": "iluvatar-bi-v100-class", "layers": 12}]}]}"#;
    let a = PlanSpec::parse(train, true).unwrap();
    assert_eq!(a, PlanSpec::parse(chips, true).unwrap());
    assert_eq!(a, PlanSpec::parse(counts, true).unwrap());
    assert_eq!(a, PlanSpec::parse(toml, false).unwrap());
    let ev = evaluate(&a, &m, &example_cluster(), &TrainingSettings::new(1)).unwrap();
    assert_eq!(ev.plan.global_batch, 64);
    assert_eq!(ev.plan.dp, 2);
    let s = &ev.plan.replicas[0].stages;
    assert_eq!((s[0].first_layer, s[1].end_layer), (0, 32));
    // The last stage holds the head: more parameters per layer there.
    assert!(s[1].memory.weights / 12.0 > s[0].memory.weights / 20.0);
}

#[test]
fn a_plan_that_does_not_fit_names_its_stage_and_shortfall() {
    let m = ModelSpec::llama_70b();
    let plan = r#"{"group": [{"micro_batch_size": 1, "micro_batches": 64,
        "stages": [{"device": "iluvatar-bi-v100-class", "layers": [0, 30]},
                   {"device": "nvidia-a800-class", "tp": 8, "layers": [30, 55]},
                   {"device": "nvidia-a800-class", "tp": 8, "layers": [55, 80]}]}]}"#;
    let spec = PlanSpec::parse(plan, true).unwrap();
    let ev = evaluate(&spec, &m, &example_cluster(), &TrainingSettings::new(1)).unwrap();
    assert!(!ev.fits);
    assert_eq!(ev.overflows.len(), 1, "{:?}", ev.overflows);
    let o = &ev.overflows[0];
    assert_eq!(
        (o.group, o.stage, o.chip.as_str()),
        (0, 0, "iluvatar-bi-v100-class")
    );
    let s = &ev.plan.replicas[0].stages[0];
    assert!((o.short_bytes - (s.memory.total - s.memory_capacity as f64)).abs() < 1.0);
}

/// A trainer plan may give a pipeline's first stage the embedding alone
/// and its last the head alone (`polychip train --save-plan` writes such
/// plans): each is priced as what it holds, nothing counted twice.
#[test]
fn stages_of_one_end_alone_are_priced_as_what_they_hold() {
    let (m, c) = (ModelSpec::llama_7b(), example_cluster());
    let s = TrainingSettings::new(1);
    let eval = |stages: &str| {
        let plan = format!(
            r#"{{"group": [{{"micro_batch_size": 1, "micro_batches": 16, "stages": [{stages}]}}]}}"#
        );
        evaluate(&PlanSpec::parse(&plan, true).unwrap(), &m, &c, &s).unwrap()
    };
    let ends = eval(
        r#"{"device": "iluvatar-bi-v100-class", "layers": [0, 0]},
           {"device": "nvidia-a800-class", "tp": 8, "layers": [0, 32]},
           {"device": "iluvatar-bi-v100-class", "layers": [32, 32]}"#,
    );
    let two = eval(
        r#"{"device": "iluvatar-bi-v100-class", "layers": [0, 1]},
           {"device": "nvidia-a800-class", "tp": 8, "layers": [1, 32]}"#,
    );
    let st = &ends.plan.replicas[0].stages;
    let weights = |x: &polychip_planner::plan::StagePlan| x.memory.weights * x.tp as f64;
    let total: f64 = st.iter().map(weights).sum();
    let bytes = m.total_params() as f64 * s.dtype.bytes() as f64;
    assert!((total - bytes).abs() < 1.0, "{total} vs {bytes}");
    // The embedding alone keeps only its dropout mask, a byte per element
    // of b s h, for each of the 3 micro-batches the first of 3 stages holds.
    let mask = 3.0 * (m.seq_len * m.hidden) as f64;
    assert!((st[0].memory.activations - mask).abs() < 1.0);
    assert!(st[0].memory.weights > 0.0 && st[2].memory.logits > 0.0);
    assert_eq!(st[1].memory.logits, 0.0);
    // The embedding alone costs less than the embedding and a layer.
    let t = |x: &polychip_planner::plan::StagePlan| x.timing.forward + x.timing.backward;
    assert!(t(&st[0]) < t(&two.plan.replicas[0].stages[0]));
    assert!(t(&st[0]) > 0.0 && t(&st[2]) > 0.0);
    assert!(ends.fits && ends.cannot_run.is_empty());
    // An empty stage anywhere else is scored, and reported as one that
    // cannot run (a stage with no parameters to train), naming it.
    let empty = eval(
        r#"{"device": "nvidia-a800-class", "tp": 8, "layers": [0, 16]},
           {"device": "iluvatar-bi-v100-class", "layers": [16, 16]},
           {"device": "nvidia-a800-class", "tp": 8, "layers": [16, 32]}"#,
    );
    assert!(!empty.fits);
    assert!(empty.overflows.is_empty());
    assert_eq!(empty.cannot_run.len(), 1, "{:?}", empty.cannot_run);
    assert!(
        empty.cannot_run[0].starts_with("stage 1 of group 0 holds no layer"),
        "{}",
        empty.cannot_run[0]
    );
    let st = &empty.plan.replicas[0].stages[1];
    assert_eq!((st.memory.weights, st.memory.activations), (0.0, 0.0));
    assert!(st.timing.name.contains("no layer"), "{}", st.timing.name);
    // Layers that go backwards are still refused.
    let e = err(
        r#"{"group": [{"micro_batch_size": 1, "micro_batches": 16, "stages": [
            {"device": "nvidia-a800-class", "layers": [0, 16]},
            {"device": "iluvatar-bi-v100-class", "layers": [16, 12]},
            {"device": "nvidia-a800-class", "layers": [12, 32]}]}]}"#,
        true,
        &m,
    );
    assert!(
        e.contains("layers [16, 12) do not continue the pipeline at layer 16"),
        "{e}"
    );
}

#[test]
fn inconsistent_plans_are_refused_naming_what_is_wrong() {
    let m = ModelSpec::llama_7b();
    let one = |stages: &str, extra: &str| {
        format!(
            r#"{{"group": [{{"micro_batch_size": 2, "micro_batches": 8{extra}, "stages": [{stages}]}}]}}"#
        )
    };
    let a800 = r#"{"device": "nvidia-a800-class", "layers": [0, 32]}"#;
    let cases = [
        (
            one(r#"{"device": "nvidia-a800-class", "layers": [0, 16]}"#, ""),
            "ends at layer 16, but the model \"llama-7b\" has 32 layers",
        ),
        (
            one(
                r#"{"device": "nvidia-a800-class", "layers": [0, 16]}, {"device": "nvidia-a800-class", "layers": [17, 32]}"#,
                "",
            ),
            "stage 1 of group 0: layers [17, 32) do not continue the pipeline at layer 16",
        ),
        (
            one(r#"{"device": "tpu-v9", "layers": [0, 32]}"#, ""),
            "stage 0 of group 0: chip \"tpu-v9\" is not a chip type of the cluster",
        ),
        // What polychip train runs but the cluster planner does not model.
        (
            one(
                r#"{"device": "nvidia-a800-class", "layers": [0, 15.5]}, {"device": "nvidia-a800-class", "layers": [15.5, 32]}"#,
                "",
            ),
            "stage 0 of group 0: layers holds 15.5, a cut halfway through a block, which \
             polychip train runs but the cluster planner does not model",
        ),
        (
            one(
                r#"{"device": "nvidia-a800-class", "layers": [0, "15.5+40"]}, {"device": "nvidia-a800-class", "layers": ["15.5+40", 32]}"#,
                "",
            ),
            "stage 0 of group 0: layers holds \"15.5+40\", a cut inside a block by its width",
        ),
        (
            one(a800, r#", "sequences": 15"#),
            "group 0 gives sequences 15, a last micro-batch smaller than its others",
        ),
        (
            one(
                r#"{"device": "nvidia-a800-class", "tp": 3, "layers": [0, 32]}"#,
                "",
            ),
            "tp 3 does not divide \"nvidia-a800-class\"'s 8 chips per node",
        ),
        (
            one(a800, r#", "copies": 300"#),
            "uses 300 chips of type \"nvidia-a800-class\", but the cluster has 256",
        ),
        (one(a800, r#", "copies": 0"#), "group 0: copies is 0"),
        (
            one(
                r#"{"chip": ["nvidia-a800-class", "biren-br104-class"], "layers": [0, 32]}"#,
                "",
            ),
            "stage 0 of group 0 names 2 replicas in its list of chips, but its group has 1",
        ),
        (
            one(
                r#"{"chip": ["nvidia-a800-class", "biren-br104-class"], "tp": [1, 2, 4],
                    "layers": [0, 32]}"#,
                r#", "copies": 2"#,
            ),
            "stage 0 of group 0 lists 3 tp degrees for 2 chips",
        ),
        (
            one(
                r#"{"chip": ["nvidia-a800-class", "no-such-chip"], "layers": [0, 32]}"#,
                r#", "copies": 2"#,
            ),
            "stage 0 of group 0 (replica 1): chip",
        ),
        (
            one(
                r#"{"chip": "nvidia-a800-class+biren-br104-class", "layers": [0, 32]}"#,
                "",
            ),
            "joins chip types with '+'; a stage whose replicas are of several types lists one chip per replica",
        ),
        (r#"{"group": []}"#.to_string(), "has 0 groups"),
        (r#"{"steps": 3}"#.to_string(), "has no groups"),
        (
            one(r#"{"device": "nvidia-a800-class", "layers": [0, -1]}"#, ""),
            "layers holds -1, not a layer index",
        ),
        // A misspelt or foreign key is refused, not ignored (the plan was
        // scored at tp 1 and one replica), and so are two keys meaning one.
        (
            one(
                r#"{"chip": "nvidia-a800-class", "TP": 4, "layers": [0, 32]}"#,
                "",
            ),
            "stage 0 of group 0 has the key \"TP\", which a plan does not have",
        ),
        (
            one(a800, r#", "replicas": 8"#),
            "group 0 has the key \"replicas\", which a plan does not have",
        ),
        (
            one(a800, r#", "micro_batch_szie": 2"#),
            "group 0 has the key \"micro_batch_szie\"",
        ),
        (
            one(a800, r#", "copies": 1, "dp": 2"#),
            "group 0 gives both \"copies\" and \"dp\"",
        ),
        (
            one(
                r#"{"chip": "nvidia-a800-class", "device": "biren-br104-class", "layers": [0, 32]}"#,
                "",
            ),
            "gives both \"chip\" and \"device\"",
        ),
    ];
    for (text, want) in cases {
        let got = err(&text, true, &m);
        assert!(got.contains(want), "{text}\nwanted {want:?}\ngot {got:?}");
    }
    // Tensor parallelism gives each chip whole heads: 20 heads do not
    // split 8 ways (Megatron refuses it), and the search does not propose it.
    let twenty = ModelSpec {
        heads: 20,
        kv_heads: 20,
        hidden: 2560,
        ..ModelSpec::llama_7b()
    };
    let got = err(
        &one(
            r#"{"chip": "nvidia-a800-class", "tp": 8, "layers": [0, 32]}"#,
            "",
        ),
        true,
        &twenty,
    );
    assert!(
        got.contains("tp 8 does not divide the model's 20 attention heads"),
        "{got}"
    );
    // A plan too large to simulate is refused, not run for minutes in
    // gigabytes: 300 one-layer stages of 65,536 micro-batches (and 200
    // stages of 16,384: 3.3 M pairs, which took 4 GB when the bound was
    // 16 M and the simulator kept every event).
    let deep = ModelSpec {
        layers: 300,
        ..ModelSpec::llama_7b()
    };
    let stages = vec![r#"{"device": "nvidia-a800-class", "layers": 1}"#; 300];
    let text = format!(
        r#"{{"group": [{{"micro_batch_size": 1, "micro_batches": 65536, "stages": [{}]}}]}}"#,
        stages.join(", ")
    );
    let got = err(&text, true, &deep);
    assert!(
        got.contains("more than the 2097152 the planner runs"),
        "{got}"
    );
    let text = format!(
        r#"{{"group": [{{"micro_batch_size": 1, "micro_batches": 16384, "stages": [{}]}}]}}"#,
        stages[..200].join(", ")
    );
    let got = err(
        &text,
        true,
        &ModelSpec {
            layers: 200,
            ..deep
        },
    );
    assert!(got.contains("3276800 stage-micro-batch pairs"), "{got}");
    // null is not the default: a count or a tp nulled is refused (each
    // was silently 1).
    for (extra, stage, want) in [
        (
            r#", "copies": null"#,
            a800,
            "group 0: copies is null; give a number, or leave it out for 1",
        ),
        (
            r#", "dp": null"#,
            a800,
            "group 0: dp is null; give a number, or leave it out for 1",
        ),
        (
            "",
            r#"{"chip": "nvidia-a800-class", "tp": null, "layers": [0, 32]}"#,
            "tp is null; give a number, or leave it out for 1",
        ),
    ] {
        let got = err(&one(stage, extra), true, &m);
        assert!(got.contains(want), "{got}");
    }
    // A planner's report restates its replicas and batch: totals that
    // disagree with its groups are refused, not ignored.
    let (c, s) = (example_cluster(), TrainingSettings::new(256));
    let report = plan(&m, &c, &s, &PlanOptions::default()).unwrap();
    let mut v = serde_json::to_value(&report).unwrap();
    let dp = v["plan"]["dp"].as_u64().unwrap();
    for (key, value, want) in [
        (
            "dp",
            dp + 1,
            format!(
                "gives dp {}, but its replicas' copies add up to {dp}",
                dp + 1
            ),
        ),
        (
            "global_batch",
            255,
            "gives global_batch 255, but its replicas' sequences".to_string(),
        ),
    ] {
        let mut edited = v.clone();
        edited["plan"][key] = value.into();
        let got = PlanSpec::parse(&edited.to_string(), true)
            .unwrap_err()
            .to_string();
        assert!(got.contains(&want), "{got}");
    }
    v["plan"]["dp"] = dp.into();
    PlanSpec::parse(&v.to_string(), true).unwrap();
}

/// A profile entry of the example cluster's A800 type at micro-batch `b`
/// (LLaMA-7B, bf16): blocks 10 and 20 ms a sequence, the ends fixed.
fn a800_entry(b: u64) -> ProfileEntry {
    ProfileEntry {
        chip: "nvidia-a800-class".into(),
        micro_batch: b,
        tp: 1,
        embedding: Some(Passes {
            forward: 0.001,
            backward: 0.002,
            weight_grad: None,
            fused_backward: None,
            held: None,
        }),
        block: Passes {
            forward: 0.01 * b as f64,
            backward: 0.02 * b as f64,
            weight_grad: None,
            fused_backward: None,
            held: None,
        },
        attention: None,
        head: Some(Passes {
            forward: 0.005,
            backward: 0.01,
            weight_grad: None,
            fused_backward: None,
            held: None,
        }),
        optimizer_per_param: Some(1e-11),
        block_activation_bytes: None,
        stage_overhead: None,
        peak_memory_bytes: None,
    }
}

/// A profile file of `entries` for LLaMA-7B in bf16.
fn a800_profile(m: &ModelSpec, entries: Vec<ProfileEntry>) -> ProfileFile {
    ProfileFile {
        format: FORMAT.into(),
        model: m.clone(),
        dtype: Dtype::Bf16,
        source: "test".into(),
        entries,
        core_order: None,
    }
}

#[test]
fn a_profile_prices_the_types_it_covers_and_scales_to_other_tp() {
    let m = ModelSpec::llama_7b();
    let mut c = example_cluster();
    let entry = a800_entry;
    let profile = a800_profile(&m, vec![entry(1), entry(2)]);
    c.apply_profile(&profile, &m, &TrainingSettings::new(1))
        .unwrap();
    let plan = r#"{"group": [{"micro_batch_size": 2, "micro_batches": 4,
        "stages": [{"device": "nvidia-a800-class", "layers": [0, 32]}]}]}"#;
    let spec = PlanSpec::parse(plan, true).unwrap();
    let ev = evaluate(&spec, &m, &c, &TrainingSettings::new(1)).unwrap();
    let t = &ev.plan.replicas[0].stages[0].timing;
    assert!(
        (t.forward - (32.0 * 0.02 + 0.001 + 0.005)).abs() < 1e-12,
        "{t:?}"
    );
    assert!(
        (t.backward - (32.0 * 0.04 + 0.002 + 0.01)).abs() < 1e-12,
        "{t:?}"
    );
    assert_eq!(ev.measured_chips, vec!["nvidia-a800-class".to_string()]);
    // At tp 2, which the profile does not cover, the measured tp-1 costs
    // are scaled by the geometric mean of the cost model's own tp-2 over
    // tp-1 ratios with its dispatch floor and without it.
    let at = |tp: u64, c: &ClusterSpec| {
        let text = plan.replace(
            r#""layers": [0, 32]"#,
            &format!(r#""tp": {tp}, "layers": [0, 32]"#),
        );
        let spec = PlanSpec::parse(&text, true).unwrap();
        evaluate(&spec, &m, c, &TrainingSettings::new(1))
            .unwrap()
            .plan
            .replicas[0]
            .stages[0]
            .timing
            .clone()
    };
    let (analytic1, analytic2) = (at(1, &example_cluster()), at(2, &example_cluster()));
    let mut bare = example_cluster();
    for t in &mut bare.chip_types {
        t.kernel_dispatch_seconds = Some(0.0);
    }
    let (work1, work2) = (at(1, &bare), at(2, &bare));
    let measured2 = at(2, &c);
    let want =
        t.forward * (analytic2.forward / analytic1.forward * work2.forward / work1.forward).sqrt();
    assert!(
        (measured2.forward - want).abs() < 1e-9 * want,
        "{measured2:?} {want}"
    );
    assert!(
        measured2.forward < t.forward,
        "tp 2 is faster here: {measured2:?}"
    );
    // The search plans the profiled cluster without trouble.
    let report = plan_with(&m, &c);
    assert!(report.plan.step_time_simulated > 0.0);
    // The weights' gradients: the cost model's share of the measured
    // backward pass, or the profile's own where it times them apart.
    assert!(t.weight_grad > 0.2 * t.backward && t.weight_grad < 0.6 * t.backward);
    let mut split = profile.clone();
    for e in &mut split.entries {
        e.block.weight_grad = Some(0.015 * e.micro_batch as f64);
        e.head.as_mut().unwrap().weight_grad = Some(0.004);
    }
    let mut c2 = example_cluster();
    c2.apply_profile(&split, &m, &TrainingSettings::new(1))
        .unwrap();
    let ev = evaluate(&spec, &m, &c2, &TrainingSettings::new(1)).unwrap();
    let t2 = &ev.plan.replicas[0].stages[0].timing;
    assert!((t2.backward - t.backward).abs() < 1e-12);
    assert!(
        (t2.weight_grad - (32.0 * 0.03 + 0.004)).abs() < 1e-12,
        "{t2:?}"
    );
}

/// A profile's block passes run whole (`fused_backward`) and run holding
/// a second micro-batch (`held`) price a pipeline's stages as the trainer's
/// measured search prices them: under 1F1B every stage's backward pass
/// whole, and the stages before the last (which hold more than one
/// micro-batch in flight) at the held ratios; a profile without them (as
/// other frameworks' are) prices every stage at its plain passes.
#[test]
fn a_profile_s_whole_and_held_passes_price_the_stages_that_run_them() {
    let m = ModelSpec::llama_7b();
    let plain = a800_profile(&m, vec![a800_entry(2)]);
    let mut measured = plain.clone();
    let block = &mut measured.entries[0].block;
    block.fused_backward = Some(0.9 * block.backward);
    block.held = Some(polychip_planner::profile::Held {
        forward: 1.1 * block.forward,
        backward: 1.2 * block.backward,
    });
    let plan = r#"{"group": [{"micro_batch_size": 2, "micro_batches": 8, "stages": [
        {"device": "nvidia-a800-class", "layers": [0, 16]},
        {"device": "nvidia-a800-class", "layers": [16, 32]}]}]}"#;
    let spec = PlanSpec::parse(plan, true).unwrap();
    let stages = |p: &ProfileFile, schedule| {
        let mut c = example_cluster();
        let mut s = TrainingSettings::new(1);
        s.schedule = schedule;
        c.apply_profile(p, &m, &s).unwrap();
        let ev = evaluate(&spec, &m, &c, &s).unwrap();
        let t = |i: usize| ev.plan.replicas[0].stages[i].timing.clone();
        (t(0), t(1))
    };
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs();
    let (p0, p1) = stages(&plain, PipelineSchedule::OneFOneB);
    let (m0, m1) = stages(&measured, PipelineSchedule::OneFOneB);
    assert!(close(m0.forward, 1.1 * p0.forward), "{m0:?} {p0:?}");
    assert!(close(m0.backward, 0.9 * 1.2 * p0.backward), "{m0:?} {p0:?}");
    assert!(close(m1.forward, p1.forward), "{m1:?} {p1:?}");
    assert!(close(m1.backward, 0.9 * p1.backward), "{m1:?} {p1:?}");
    // Under zero bubble the second stage splits its backward pass and
    // holds its weights' gradients' inputs: split and held.
    let (z1, zp1) = (
        stages(&measured, PipelineSchedule::ZeroBubble).1,
        stages(&plain, PipelineSchedule::ZeroBubble).1,
    );
    assert!(close(z1.backward, 1.2 * zp1.backward), "{z1:?} {zp1:?}");
}

fn plan_with(m: &ModelSpec, c: &ClusterSpec) -> polychip_planner::search::PlanReport {
    plan(m, c, &TrainingSettings::new(256), &PlanOptions::default()).unwrap()
}

/// A stage whose data-parallel group mixes chip types (`"chip": [..]`, one
/// per replica, as measured heterogeneous runs are written): replica j runs
/// entry j of every mixed stage, replicas with the same pipeline are one
/// group, and the result is the plan of those groups written out, except
/// that a gradient all-reduce among several types runs across nodes.
#[test]
fn a_stage_mixing_chip_types_is_dealt_out_by_replica() {
    let (m, c) = (ModelSpec::llama_7b(), example_cluster());
    let s = TrainingSettings::new(1);
    let mixed = r#"{"groups": [{"copies": 3, "micro_batch_size": 1, "micro_batches": 8,
        "stages": [{"chip": ["nvidia-a800-class", "iluvatar-bi-v100-class", "nvidia-a800-class"],
                    "tp": [8, 4, 8], "layers": [0, 16]},
                   {"chip": "nvidia-a800-class", "tp": 8, "layers": [16, 32]}]}]}"#;
    let spec = PlanSpec::parse(mixed, true).unwrap();
    assert_eq!(spec.groups.len(), 2);
    assert_eq!(spec.groups[0].copies, 2);
    assert_eq!(spec.groups[1].copies, 1);
    assert_eq!(spec.groups[1].label(1), "group 0 (replica 1)");
    assert_eq!(spec.groups[0].label(0), "group 0 (replicas 0, 2)");
    let ev = evaluate(&spec, &m, &c, &s).unwrap();
    let written = r#"{"groups": [
        {"copies": 2, "micro_batch_size": 1, "micro_batches": 8,
         "stages": [{"chip": "nvidia-a800-class", "tp": 8, "layers": [0, 16]},
                    {"chip": "nvidia-a800-class", "tp": 8, "layers": [16, 32]}]},
        {"copies": 1, "micro_batch_size": 1, "micro_batches": 8,
         "stages": [{"chip": "iluvatar-bi-v100-class", "tp": 4, "layers": [0, 16]},
                    {"chip": "nvidia-a800-class", "tp": 8, "layers": [16, 32]}]}]}"#;
    let two = evaluate(&PlanSpec::parse(written, true).unwrap(), &m, &c, &s).unwrap();
    assert_eq!(ev.plan.replicas, two.plan.replicas);
    // The same stage with counts: two A800 replicas at tp 8, one BI-V100
    // at tp 4 (the order of first appearance gives the groups' order).
    let counted = r#"{"groups": [{"copies": 3, "micro_batch_size": 1, "micro_batches": 8,
        "stages": [{"chip": [{"chip": "nvidia-a800-class", "tp": 8, "copies": 2},
                             {"chip": "iluvatar-bi-v100-class", "tp": 4}], "layers": [0, 16]},
                   {"chip": "nvidia-a800-class", "tp": 8, "layers": [16, 32]}]}]}"#;
    let three = evaluate(&PlanSpec::parse(counted, true).unwrap(), &m, &c, &s).unwrap();
    assert_eq!(three.plan.replicas, two.plan.replicas);
    assert_eq!(ev.plan.global_batch, 24);
    assert_eq!(ev.plan.dp, 3);
    // Only the first stage's data-parallel group crosses chip types; the
    // second stage is A800 in every replica. Against the same plan all on
    // A800, the mixed first stage's all-reduce is slower (at the BI-V100's
    // slower NIC), the second's the same.
    let same = r#"{"groups": [{"copies": 3, "micro_batch_size": 1, "micro_batches": 8,
        "stages": [{"chip": "nvidia-a800-class", "tp": 8, "layers": [0, 16]},
                   {"chip": "nvidia-a800-class", "tp": 8, "layers": [16, 32]}]}]}"#;
    let one = evaluate(&PlanSpec::parse(same, true).unwrap(), &m, &c, &s).unwrap();
    let ar = |e: &polychip_planner::evaluate::Evaluation, stage: usize| {
        e.plan.replicas[0].stages[stage].timing.dp_allreduce
    };
    let bw = |a: &str, b: &str| c.link_bandwidth(c.chip(a).unwrap(), c.chip(b).unwrap(), false);
    assert!(
        bw("nvidia-a800-class", "iluvatar-bi-v100-class")
            < bw("nvidia-a800-class", "nvidia-a800-class")
    );
    assert_eq!(ar(&ev, 1), ar(&one, 1));
    assert!(
        ar(&ev, 0) > ar(&one, 0),
        "{} vs {}",
        ar(&ev, 0),
        ar(&one, 0)
    );
    // The step is the slowest pipeline's.
    let slowest = ev
        .plan
        .replicas
        .iter()
        .map(|r| r.step_time_simulated)
        .fold(0.0, f64::max);
    assert_eq!(ev.plan.step_time_simulated, slowest);
}

#[test]
fn a_plan_names_its_schedule_and_is_priced_and_sized_under_it() {
    let m = ModelSpec::llama_7b();
    let c = example_cluster();
    let plan = |schedule: &str| {
        format!(
            r#"{{{schedule} "group": [{{"copies": 2, "micro_batch_size": 1, "micro_batches": 32,
            "stages": [{{"device": "nvidia-a800-class", "layers": [0, 20]}},
                       {{"device": "iluvatar-bi-v100-class", "layers": [20, 32]}}]}}]}}"#
        )
    };
    let run = |schedule: &str| {
        let spec = PlanSpec::parse(&plan(schedule), true).unwrap();
        evaluate(&spec, &m, &c, &TrainingSettings::new(64)).unwrap()
    };
    let (default, one, zb) = (
        run(""),
        run(r#""schedule": "1f1b","#),
        run(r#""schedule": "zero-bubble","#),
    );
    assert_eq!(default.plan, one.plan);
    let (r1, rz) = (&one.plan.replicas[0], &zb.plan.replicas[0]);
    assert_eq!(rz.pipeline, PipelineSchedule::ZeroBubble);
    // The cost model prices the weights' gradients (one matmul per weight,
    // as many FLOPs as its forward): a real share of each backward pass.
    for s in &rz.stages {
        let t = &s.timing;
        assert!(
            t.weight_grad > 0.2 * t.backward && t.weight_grad < 0.6 * t.backward,
            "{t:?}"
        );
    }
    assert_ne!(r1.step_time_simulated, rz.step_time_simulated);
    // Stage 0 of 2 keeps 3 micro-batches' activations, not 2; stage 1 one
    // more for its weights' pass, 2 not 1.
    let act = |r: &polychip_planner::plan::Replica, i: usize| r.stages[i].memory.activations;
    assert!((act(rz, 0) / act(r1, 0) - 1.5).abs() < 1e-9);
    assert!((act(rz, 1) / act(r1, 1) - 2.0).abs() < 1e-9);
    // GPipe: every forward pass first, so every stage holds the
    // activations of all 32 micro-batches (1F1B: 2 and 1), at a step
    // within the simulator's ordering of 1F1B's.
    let gp = run(r#""schedule": "gpipe","#);
    let rg = &gp.plan.replicas[0];
    assert_eq!(rg.pipeline, PipelineSchedule::GPipe);
    assert!((act(rg, 0) / act(r1, 0) - 16.0).abs() < 1e-9);
    assert!((act(rg, 1) / act(r1, 1) - 32.0).abs() < 1e-9);
    assert!((rg.step_time_simulated / r1.step_time_simulated - 1.0).abs() < 0.05);
    // The settings' schedule applies where the file names none.
    let mut s = TrainingSettings::new(64);
    s.schedule = PipelineSchedule::ZeroBubble;
    let spec = PlanSpec::parse(&plan(""), true).unwrap();
    assert_eq!(evaluate(&spec, &m, &c, &s).unwrap().plan, zb.plan);
    // A schedule that is not one is refused, naming it.
    let e = err(&plan(r#""schedule": "interleaved","#), true, &m);
    assert!(
        e.contains("schedule is \"interleaved\"") && e.contains("zero-bubble"),
        "{e}"
    );
    let e = err(&plan(r#""schedule": 3,"#), true, &m);
    assert!(e.contains("schedule is 3"), "{e}");
    // A run-ahead of 3: stage 0 holds 3 + 1 micro-batches' activations
    // (1F1B: 2), stage 1 as before; zero bubble's lead of 2 times 3, 7.
    let ra = run(r#""run_ahead": 3,"#);
    let ra_zb = run(r#""schedule": "zero-bubble", "run_ahead": 3,"#);
    let r3 = &ra.plan.replicas[0];
    assert_eq!(r3.run_ahead, 3);
    assert!((act(r3, 0) / act(r1, 0) - 2.0).abs() < 1e-9);
    assert!((act(r3, 1) / act(r1, 1) - 1.0).abs() < 1e-9);
    assert!((act(&ra_zb.plan.replicas[0], 0) / act(r1, 0) - 3.5).abs() < 1e-9);
    for bad in ["0", "65", "\"4\"", "-1"] {
        let e = err(&plan(&format!(r#""run_ahead": {bad},"#)), true, &m);
        assert!(e.contains(&format!("run_ahead is {bad}")), "{bad}: {e}");
    }
}

#[test]
fn a_trace_too_large_to_open_is_refused_before_it_is_built() {
    let (c, m) = (example_cluster(), ModelSpec::llama_7b());
    let report = plan(&m, &c, &TrainingSettings::new(256), &PlanOptions::default()).unwrap();
    let trace = report.plan.chrome_trace().unwrap();
    assert!(
        trace["traceEvents"]
            .as_array()
            .is_some_and(|e| !e.is_empty())
    );
    let mut huge = report.plan.clone();
    let g = huge.slowest_group();
    let stages = huge.replicas[g].stages.len() as u64;
    huge.replicas[g].micro_batches = polychip_planner::plan::MAX_TRACE_PASSES / stages + 1;
    let err = huge.chrome_trace().unwrap_err();
    assert!(
        err.contains("more than the 500000 a trace may show"),
        "{err}"
    );
}

#[test]
fn a_plan_with_a_key_twice_is_refused_not_read_as_the_last() {
    let m = ModelSpec::llama_7b();
    let text = r#"{"group": [{"copies": 64, "copies": 1, "micro_batch_size": 1,
        "micro_batches": 32, "stages": [{"chip": "A100", "layers": 32}]}]}"#;
    let e = err(text, true, &m);
    assert!(e.contains("\"copies\" appears twice"), "{e}");
}

/// `count` chips of one type "x", `per_node` to a node, each with
/// `nic` bytes/s out of it (100 GB/s inside, a 25 GB/s network).
fn one_type_cluster(per_node: u64, count: u64, nic: f64) -> ClusterSpec {
    ClusterSpec::from_toml_str(&format!(
        r#"inter_node_bandwidth = 25e9
[[chip_types]]
name = "x"
count = {count}
chips_per_node = {per_node}
memory_bytes = 103079215104
peak_flops = {{ f32 = 50e12, bf16 = 400e12, f16 = 400e12 }}
efficiency = 0.5
intra_node_bandwidth = 100e9
nic_bandwidth = {nic:e}
"#
    ))
    .unwrap()
}

#[test]
fn a_tensor_parallel_degree_outside_the_searchs_is_scored() {
    // Nodes of 16 (as Trainium's) with tp 16, and of 6 with tp 3: the
    // search tries 1, 2, 4 and 8, a measured run may use any degree a node
    // holds whole.
    let m = ModelSpec::llama_7b();
    let s = TrainingSettings::new(64);
    let step = |c: &ClusterSpec, tp: u64| {
        let text = format!(
            r#"{{"group": [{{"micro_batch_size": 1, "micro_batches": 64, "stages": [{{"chip": "x", "tp": {tp}, "layers": [0, 32]}}]}}]}}"#
        );
        evaluate(&PlanSpec::parse(&text, true).unwrap(), &m, c, &s)
            .map(|e| e.plan.step_time_simulated)
            .map_err(|e| e.to_string())
    };
    let sixteen = one_type_cluster(16, 64, 25e9);
    let (t8, t16) = (step(&sixteen, 8).unwrap(), step(&sixteen, 16).unwrap());
    assert!(
        t16.is_finite() && t16 > 0.0 && t16 < t8,
        "tp 16 {t16} s, tp 8 {t8} s"
    );
    // 3 divides a node of 6 but not LLaMA's 32 heads; 16 does not divide 6.
    let six = one_type_cluster(6, 24, 25e9);
    let err = step(&six, 3).unwrap_err();
    assert!(
        err.contains("tp 3 does not divide the model's 32 attention heads"),
        "{err}"
    );
    let err = step(&six, 16).unwrap_err();
    assert!(
        err.contains("tp 16 does not divide \"x\"'s 6 chips per node"),
        "{err}"
    );
}

/// Replicas of a stage sit next to each other in a node and the stages
/// after them (Megatron-LM's and DeepSpeed's rank order), so one placement
/// prices both transfers: one pipeline of four stages on a node of four
/// sends inside it; four copies of it reduce each stage inside a node and
/// send across nodes; three copies of two stages put the second stage's
/// replicas on two nodes.
#[test]
fn sends_and_all_reduces_follow_one_placement_of_the_replicas() {
    let c = one_type_cluster(4, 16, 10e9);
    let m = ModelSpec::llama_7b();
    let s = TrainingSettings::new(48);
    let timings = |copies: u64, splits: &[u64]| {
        let stages: Vec<String> = splits
            .windows(2)
            .map(|w| {
                format!(
                    r#"{{"chip": "x", "tp": 1, "layers": [{}, {}]}}"#,
                    w[0], w[1]
                )
            })
            .collect();
        let text = format!(
            r#"{{"group": [{{"copies": {copies}, "micro_batch_size": 1, "micro_batches": {}, "stages": [{}]}}]}}"#,
            48 / copies,
            stages.join(", ")
        );
        let ev = evaluate(&PlanSpec::parse(&text, true).unwrap(), &m, &c, &s).unwrap();
        ev.plan.replicas[0]
            .stages
            .iter()
            .map(|st| (st.timing.send_next, st.timing.dp_allreduce))
            .collect::<Vec<_>>()
    };
    let one = timings(1, &[0, 8, 16, 24, 32]);
    let four = timings(4, &[0, 8, 16, 24, 32]);
    // The same sends, across the 10 GB/s NIC instead of the 100 GB/s link.
    let ratio = four[0].0 / one[0].0;
    assert!((ratio - 10.0).abs() < 1e-9, "send ratio {ratio}");
    // Four replicas of a middle stage reduce over the intra-node link:
    // 2 (d - 1)/d of its gradients at 100 GB/s.
    let grads = 8.0 * m.layer_params() as f64 * s.grad_bytes();
    let within = 2.0 * 3.0 / 4.0 * grads / 100e9;
    assert!((four[1].1 / within - 1.0).abs() < 1e-9, "{four:?}");
    // Three copies of two stages: the first stage's replicas share node 0,
    // the second's straddle nodes 0 and 1 (chips 3, 4 and 5).
    let three = timings(3, &[0, 16, 32]);
    assert!(three[0].0 > 9.0 * one[0].0, "{three:?}");
    let (first, second) = (three[0].1, three[1].1);
    let grads = |n: u64, end: u64| (n * m.layer_params() + end) as f64 * s.grad_bytes();
    let at = |bytes: f64, bw: f64| 2.0 * 2.0 / 3.0 * bytes / bw;
    let first_within = at(grads(16, m.embedding_params()), 100e9);
    assert!((first / first_within - 1.0).abs() < 1e-9, "{three:?}");
    // Across nodes: three members' share of the NIC, capped by the network.
    let second_across = at(grads(16, m.head_params()), 25e9);
    assert!((second / second_across - 1.0).abs() < 1e-9, "{three:?}");
}

#[test]
fn an_interleaved_plan_is_scored_chunk_by_chunk_and_sized_by_device() {
    let m = ModelSpec::llama_7b();
    let c = one_type_cluster(8, 8, 25e9);
    let s = TrainingSettings::new(8);
    let plan = |v: u64, micro_batches: u64| {
        let per = 32 / (4 * v);
        let stages = vec![format!(r#"{{"chip": "x", "layers": {per}}}"#); (4 * v) as usize];
        format!(
            r#"{{"virtual_stages": {v}, "groups": [{{"copies": 1, "micro_batch_size": 1,
            "micro_batches": {micro_batches}, "stages": [{}]}}]}}"#,
            stages.join(", ")
        )
    };
    let run = |text: &str| evaluate(&PlanSpec::parse(text, true).unwrap(), &m, &c, &s).unwrap();
    let (plain, two) = (run(&plan(1, 8)), run(&plan(2, 8)));
    let (r1, r2) = (&plain.plan.replicas[0], &two.plan.replicas[0]);
    assert_eq!((r1.virtual_stages, r2.virtual_stages), (1, 2));
    assert_eq!((r1.stages.len(), r2.stages.len(), r2.devices()), (4, 8, 4));
    assert_eq!(plain.plan.chips_used, two.plan.chips_used);
    // The bubble shrinks: (m + (p - 1)/2) against (m + p - 1) passes, with
    // twice the sends.
    assert!(r2.step_time_simulated < 0.95 * r1.step_time_simulated);
    assert!(r2.bubble_fraction < r1.bubble_fraction);
    // A device holds the weights of its chunks, as many as a plain stage;
    // device 0 keeps 11 chunk passes of 4 layers (2 (p - 1) + p + 1), where
    // stage 0 keeps 4 of 8: 1 + (p - 1)/(p v) = 1.375 times the
    // activations (Narayanan et al., 2021).
    for d in 0..4 {
        let (a, b) = (&r1.stages[d].memory, &r2.stages[d].memory);
        assert!(
            (a.weights - b.weights).abs() < 1e-6 * a.weights,
            "device {d}"
        );
        assert_eq!(r2.stages[d].memory, r2.stages[d + 4].memory);
    }
    let ratio = r2.stages[0].memory.activations / r1.stages[0].memory.activations;
    assert!((ratio - 1.375).abs() < 1e-9, "{ratio}");
    // The bottleneck is a device, its time all its chunks'.
    let t = |s: &polychip_planner::plan::StagePlan| s.timing.forward + s.timing.backward;
    let b = &two.bottleneck;
    assert!(b.stage < 4);
    let want = t(&r2.stages[b.stage]) + t(&r2.stages[b.stage + 4]);
    assert!((b.seconds_per_micro_batch - want).abs() < 1e-12);
    // The evaluation's own JSON evaluates to itself.
    let json = serde_json::to_string(&two).unwrap();
    let again = evaluate(&PlanSpec::parse(&json, true).unwrap(), &m, &c, &s).unwrap();
    assert_eq!(again.plan, two.plan);
    // Micro-batches in groups of the devices, chunks alike on a device, 1f1b.
    let err_x = |text: &str| match PlanSpec::parse(text, true) {
        Ok(spec) => evaluate(&spec, &m, &c, &s).unwrap_err().to_string(),
        Err(e) => e.to_string(),
    };
    let e = err_x(&plan(2, 6));
    assert!(e.contains("multiple of 4, not 6"), "{e}");
    // Fewer stages than chunks per device: refused (it divided by zero).
    let one = r#"{"virtual_stages": 2, "groups": [{"copies": 1, "micro_batch_size": 1,
        "micro_batches": 2, "stages": [{"chip": "x", "layers": 32}]}]}"#;
    let e = err_x(one);
    assert!(e.contains("at least 4; this one has 1"), "{e}");
    let e = err_x(&plan(1, 8).replace("\"virtual_stages\": 1", "\"virtual_stages\": 0"));
    assert!(e.contains("virtual_stages is 0"), "{e}");
    let zb = plan(2, 8).replace(
        "{\"virtual_stages\"",
        "{\"schedule\": \"zero-bubble\", \"virtual_stages\"",
    );
    assert!(err_x(&zb).contains("1f1b only"), "{zb}");
    let e = err_x(&plan(2, 8).replacen("\"layers\": 4}", "\"layers\": 4, \"tp\": 2}", 1));
    assert!(e.contains("where the device's first chunk"), "{e}");
    let mixed = r#"{"virtual_stages": 2, "groups": [{"copies": 1, "micro_batch_size": 1,
        "micro_batches": 4, "stages": [
        {"chip": "nvidia-a800-class", "layers": 8}, {"chip": "iluvatar-bi-v100-class", "layers": 8},
        {"chip": "iluvatar-bi-v100-class", "layers": 8}, {"chip": "iluvatar-bi-v100-class", "layers": 8}]}]}"#;
    let e = err(mixed, true, &m);
    assert!(
        e.contains("stage 2 of group 0 is chunk 1 of device 0") && e.contains("nvidia-a800-class"),
        "{e}"
    );
    // The search proposes no interleaving.
    let mut v2 = s.clone();
    v2.virtual_stages = 2;
    let e = plan_fn(&m, &c, &v2).unwrap_err().to_string();
    assert!(e.contains("--evaluate"), "{e}");
}

fn plan_fn(
    m: &ModelSpec,
    c: &ClusterSpec,
    s: &TrainingSettings,
) -> Result<polychip_planner::search::PlanReport, polychip_planner::search::PlanError> {
    plan(m, c, s, &PlanOptions::default())
}

#[test]
fn whole_layers_written_as_floats_parse_and_restated_fields_must_be_valid() {
    let m = ModelSpec::llama_7b();
    let plan = |layers: &str, extra: &str| {
        format!(
            r#"{{{extra} "groups": [{{"copies": 2, "micro_batch_size": 1, "micro_batches": 32,
            "stages": [{{"chip": "nvidia-a800-class", "layers": {layers}}},
                       {{"chip": "iluvatar-bi-v100-class", "layers": [20, 32]}}]}}]}}"#
        )
    };
    // `polychip train` reads 20.0 as a layer; so does --evaluate (it called
    // it a cut halfway through a block), in both forms.
    assert_eq!(err(&plan("[0, 20.0]", ""), true, &m), "");
    assert_eq!(err(&plan("20.0", ""), true, &m), "");
    assert!(err(&plan("[0, 19.5]", ""), true, &m).contains("halfway through a block"));
    let e = err(
        &plan("[0, 20]", r#""predicted_step_seconds": -1,"#),
        true,
        &m,
    );
    assert!(e.contains("predicted_step_seconds is -1"), "{e}");
    // A report's restated fields, and its groups' one schedule.
    let c = example_cluster();
    let report = plan_fn(&m, &c, &TrainingSettings::new(256)).unwrap();
    let mut v = serde_json::to_value(&report).unwrap();
    v["plan"]["seq_len"] = serde_json::json!(-5);
    let e = PlanSpec::parse(&v.to_string(), true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("seq_len is -5"), "{e}");
    let mut v = serde_json::to_value(&report).unwrap();
    let groups = v["plan"]["replicas"].as_array_mut().unwrap();
    if groups.len() < 2 {
        let g = groups[0].clone();
        groups.push(g);
    }
    groups[1]["pipeline"] = serde_json::json!("gpipe");
    let sum = |key: &str| -> u64 { groups.iter().map(|g| g[key].as_u64().unwrap()).sum() };
    let (dp, batch) = (sum("copies"), sum("sequences"));
    v["plan"]["dp"] = serde_json::json!(dp);
    v["plan"]["global_batch"] = serde_json::json!(batch);
    let e = PlanSpec::parse(&v.to_string(), true)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("group 0 gives pipeline \"1f1b\" but group 1 \"gpipe\""),
        "{e}"
    );
}

/// A plan listing more groups than a plan may have is refused from a count
/// of its group lists, before its text is parsed into a tree (200,000
/// groups took about 200 MB that way): JSON at the top or under `plan`,
/// and TOML's `[[groups]]` tables, with the count in the message.
#[test]
fn a_plan_of_too_many_groups_is_refused_before_it_is_built() {
    let group = r#"{"copies":1,"micro_batch_size":1,"micro_batches":1,"stages":[{"layers":32,"chip":"a","tp":1}]}"#;
    let many = vec![group; 200_000].join(",");
    for text in [
        format!(r#"{{"groups":[{many}]}}"#),
        format!(r#"{{"plan":{{"replicas":[{many}]}}}}"#),
    ] {
        let e = PlanSpec::parse(&text, true).unwrap_err().to_string();
        assert_eq!(e, "plan: has 200000 groups; a plan has 1 to 4096", "{e}");
    }
    let toml = "[[groups]]\ncopies = 1\n".repeat(5000);
    let e = PlanSpec::parse(&toml, false).unwrap_err().to_string();
    assert!(e.contains("has 5000 groups; a plan has 1 to 4096"), "{e}");
    // At the limit the plan is read as before (and refused for what else
    // is wrong with it, not its count).
    let few = [group; 3].join(",");
    let e = PlanSpec::parse(&format!(r#"{{"groups":[{few}]}}"#), true);
    assert!(e.is_ok(), "{:?}", e.err());
}

/// Every combination of the settings that shard, overlap and recompute
/// scores the searched plan with finite, non-negative figures, each ZeRO
/// stage holds no more of any stage's training state than the one before,
/// recomputing more layers keeps no more activations, and overlapping a
/// sharded optimizer's gather never lengthens the step.
#[test]
fn every_sharding_overlap_and_recomputation_setting_scores_a_plan() {
    use polychip_planner::settings::RecomputeMethod;
    let (c, m) = (example_cluster(), ModelSpec::llama_7b());
    let s = TrainingSettings::new(256);
    let report = plan(&m, &c, &s, &PlanOptions::default()).unwrap();
    let spec = PlanSpec::parse(&serde_json::to_string(&report).unwrap(), true).unwrap();
    assert!(report.plan.dp > 1, "the plan has replicas to shard over");
    let recomputations = [
        (Recompute::None, RecomputeMethod::Uniform, 1),
        (Recompute::Selective, RecomputeMethod::Uniform, 1),
        (Recompute::Full, RecomputeMethod::Block, 2),
        (Recompute::Full, RecomputeMethod::Uniform, 3),
        (Recompute::Full, RecomputeMethod::Uniform, 1),
    ];
    for dtype in [Dtype::Bf16, Dtype::F32] {
        for overlap in [false, true] {
            let mut block_activations: Option<Vec<f64>> = None;
            for (recompute, method, n) in recomputations {
                let mut last_state: Option<Vec<f64>> = None;
                for zero in 0..=3 {
                    let mut t = s.clone();
                    (t.dtype, t.overlap_grad_reduce, t.zero_stage) = (dtype, overlap, zero);
                    (t.recompute, t.recompute_method, t.recompute_num_layers) =
                        (recompute, method, n);
                    let at = format!(
                        "{dtype} overlap {overlap} {recompute:?} {method:?} {n} zero {zero}"
                    );
                    let ev = evaluate(&spec, &m, &c, &t).unwrap_or_else(|e| panic!("{at}: {e}"));
                    let step = ev.plan.step_time_simulated;
                    assert!(step.is_finite() && step > 0.0, "{at}: step {step}");
                    let stages: Vec<_> = ev.plan.replicas.iter().flat_map(|r| &r.stages).collect();
                    for st in &stages {
                        let x = &st.memory;
                        let tm = &st.timing;
                        for v in [x.weights, x.gradients, x.optimizer, x.activations, x.logits]
                            .into_iter()
                            .chain([tm.forward, tm.backward, tm.dp_allreduce, tm.optimizer])
                        {
                            assert!(v.is_finite() && v >= 0.0, "{at}: {st:?}");
                        }
                    }
                    let state: Vec<f64> = stages
                        .iter()
                        .map(|st| st.memory.weights + st.memory.gradients + st.memory.optimizer)
                        .collect();
                    if let Some(before) = &last_state {
                        for (now, before) in state.iter().zip(before) {
                            assert!(*now <= before * (1.0 + 1e-12), "{at}: {now} > {before}");
                        }
                    }
                    last_state = Some(state);
                    // Under ZeRO-1 the weights' gather may overlap the next
                    // step's first forward pass: never a longer step.
                    if zero == 1 {
                        let mut g = t.clone();
                        g.overlap_param_gather = true;
                        let gathered = evaluate(&spec, &m, &c, &g)
                            .unwrap_or_else(|e| panic!("{at} gather overlapped: {e}"));
                        let overlapped = gathered.plan.step_time_simulated;
                        assert!(
                            overlapped.is_finite() && overlapped <= step * (1.0 + 1e-12),
                            "{at}: {overlapped} > {step}"
                        );
                    }
                    // Every layer recomputed keeps no more than only the
                    // first two of each stage recomputed.
                    let acts: Vec<f64> = stages.iter().map(|st| st.memory.activations).collect();
                    match (recompute, method, n) {
                        (Recompute::Full, RecomputeMethod::Block, _) if zero == 0 => {
                            block_activations = Some(acts)
                        }
                        (Recompute::Full, RecomputeMethod::Uniform, 1) => {
                            let block = block_activations.as_ref().expect("block ran first");
                            for (now, block) in acts.iter().zip(block) {
                                assert!(*now <= block * (1.0 + 1e-12), "{at}: {now} > {block}");
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}

//! `polychip plan` on the example clusters with the 100B and 70B presets,
//! JSON output and trace, and an infeasible case.

mod common;
use common::polychip;

fn example(name: &str) -> String {
    format!("{}/../examples/clusters/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A scratch directory of this test process for the test `name`, created.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("polychip-plan-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `polychip plan --cluster CLUSTER --model MODEL`, then `args`.
fn plan_with(cluster: &str, model: &str, args: &[&str]) -> (Option<i32>, String, String) {
    polychip(&[&["plan", "--cluster", cluster, "--model", model][..], args].concat())
}

#[test]
fn plans_both_example_clusters_with_both_presets() {
    for cluster in ["h2-like-1024.toml", "china-mobile-3-vendor.toml"] {
        for model in ["h2-100b", "llama-70b"] {
            let (code, out, err) =
                polychip(&["plan", "--cluster", &example(cluster), "--model", model]);
            assert_eq!(code, Some(0), "{cluster} {model}: {err}");
            for needle in [
                "stage",
                "memory used/capacity",
                "MFU",
                "data-parallel degree",
                "predicted step time",
                "tokens/s",
                "idle",
                "HeteroSpeedupRatio: ",
                "candidates evaluated",
            ] {
                assert!(
                    out.contains(needle),
                    "{cluster} {model}: no {needle:?} in\n{out}"
                );
            }
            assert!(!out.contains("undefined"), "{out}");
        }
    }
}

#[test]
fn json_and_trace() {
    let dir = std::env::temp_dir().join(format!("polychip-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace.json");
    let (code, out, err) = polychip(&[
        "plan",
        "--cluster",
        &example("china-mobile-3-vendor.toml"),
        "--model",
        "llama-70b",
        "--global-batch",
        "512",
        "--recompute",
        "selective",
        "--shard-optimizer",
        "--json",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["plan"]["global_batch"], 512);
    assert!(v["hetero_speedup_ratio"].as_f64().unwrap() > 0.0);
    assert!(v["candidates"].as_u64().unwrap() > 0);
    let stages = v["plan"]["replicas"][0]["stages"].as_array().unwrap();
    assert!(!stages.is_empty());
    for s in stages {
        assert!(s["memory"]["total"].as_f64().unwrap() <= s["memory_capacity"].as_f64().unwrap());
    }
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    assert!(t["traceEvents"].as_array().unwrap().len() > 10);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn half_gradients_halve_the_gradients_of_an_evaluated_plan() {
    let dir = scratch("half");
    let cluster = example("china-mobile-3-vendor.toml");
    let plan = |extra: &[&str]| {
        let args = [&["--global-batch", "512", "--json"][..], extra].concat();
        let (code, out, err) = plan_with(&cluster, "llama-70b", &args);
        assert_eq!(code, Some(0), "{err}");
        (
            serde_json::from_str::<serde_json::Value>(&out).unwrap(),
            err,
        )
    };
    let (searched, _) = plan(&[]);
    let file = dir.join("plan.json");
    std::fs::write(&file, searched.to_string()).unwrap();
    let file = file.to_str().unwrap();
    let gradients = |v: &serde_json::Value| {
        v["plan"]["replicas"][0]["stages"][0]["memory"]["gradients"]
            .as_f64()
            .unwrap()
    };
    let (full, _) = plan(&["--evaluate", file]);
    let (half, err) = plan(&["--evaluate", file, "--half-gradients"]);
    assert_eq!(gradients(&full), gradients(&searched));
    assert!(gradients(&full) > 0.0);
    assert_eq!(gradients(&half), gradients(&full) / 2.0);
    // The report was made with 4-byte gradients: the flag's change is said.
    assert!(err.contains("--half-gradients"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `--zero-stage` scores a plan with its replicas sharding gradients and
/// weights too: less memory, and the step pays the collectives; a stage
/// past 3 is refused by name.
#[test]
fn zero_stages_shard_an_evaluated_plan() {
    let dir = scratch("zero");
    let cluster = example("china-mobile-3-vendor.toml");
    let plan = |extra: &[&str]| {
        let args = [&["--global-batch", "512", "--json"][..], extra].concat();
        plan_with(&cluster, "llama-70b", &args)
    };
    let (code, out, err) = plan(&[]);
    assert_eq!(code, Some(0), "{err}");
    let file = dir.join("plan.json");
    std::fs::write(&file, &out).unwrap();
    let file = file.to_str().unwrap();
    let scored = |zero: &str| {
        let (code, out, err) = plan(&["--evaluate", file, "--zero-stage", zero]);
        assert_eq!(code, Some(0), "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let memory = &v["plan"]["replicas"][0]["stages"][0]["memory"];
        let part = |k: &str| memory[k].as_f64().unwrap();
        let step = v["plan"]["step_time_simulated"].as_f64().unwrap();
        (
            [part("weights"), part("gradients"), part("optimizer")],
            step,
            err,
        )
    };
    let (zero0, step0, _) = scored("0");
    let (zero1, _, _) = scored("1");
    let (zero2, _, _) = scored("2");
    let (zero3, step3, err) = scored("3");
    assert!(
        zero1[2] < zero0[2] && zero1[..2] == zero0[..2],
        "{zero0:?} {zero1:?}"
    );
    assert!(
        zero2[1] < zero1[1] && zero2[0] == zero1[0],
        "{zero1:?} {zero2:?}"
    );
    assert!(zero3[0] < zero2[0], "{zero2:?} {zero3:?}");
    assert!(
        step3 > step0,
        "ZeRO-3 gathers weights every pass: {step0} {step3}"
    );
    assert!(err.contains("--zero-stage 3 for 0"), "{err}");
    // The search prices ZeRO-2's and 3's collectives of every micro-batch:
    // asked for them, it finds a plan faster under them than the plan it
    // finds under ZeRO-1 (which it found for them too until it priced
    // them: ZeRO-2 22.9 s against 26.3 s a step, ZeRO-3 17.0 s against
    // 23.9 s; fewer and larger micro-batches over more replicas).
    let (code, out, err) = plan(&["--zero-stage", "1"]);
    assert_eq!(code, Some(0), "{err}");
    let zero1 = dir.join("zero1.json");
    std::fs::write(&zero1, &out).unwrap();
    let zero1 = zero1.to_str().unwrap();
    for zero in ["2", "3"] {
        let (code, out, err) = plan(&["--evaluate", zero1, "--zero-stage", zero]);
        assert_eq!(code, Some(0), "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let unaware = v["plan"]["step_time_simulated"].as_f64().unwrap();
        let (code, out, err) = plan(&["--zero-stage", zero]);
        assert_eq!(code, Some(0), "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let searched = v["plan"]["step_time_simulated"].as_f64().unwrap();
        assert!(
            searched < unaware,
            "ZeRO-{zero}: {searched} s against {unaware} s"
        );
    }
    // The text output opens with the settings it priced.
    let (code, out, err) = plan_with(
        &cluster,
        "llama-70b",
        &["--evaluate", file, "--zero-stage", "3"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.lines().next(), Some("settings: bf16, ZeRO-3"), "{out}");
    let (code, _, err) = plan(&["--zero-stage", "4"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("zero_stage is 4; it must be 0"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A Hugging Face model's directory or config.json plans as its shape
/// (`--seq-len` in place of its context); a mixture of experts is refused
/// naming the field.
#[test]
fn a_hugging_face_config_plans_as_its_shape() {
    let dir = std::env::temp_dir().join(format!("polychip-plan-hf-{}", std::process::id()));
    let model = dir.join("qwen-tiny");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(
        model.join("config.json"),
        r#"{"model_type": "qwen2", "hidden_act": "silu", "hidden_size": 896,
            "intermediate_size": 4864, "max_position_embeddings": 32768,
            "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
            "vocab_size": 151936}"#,
    )
    .unwrap();
    let cluster = example("china-mobile-3-vendor.toml");
    let plan = |m: &str, extra: &[&str]| {
        plan_with(
            &cluster,
            m,
            &[&["--global-batch", "256", "--json"][..], extra].concat(),
        )
    };
    for (m, extra, seq) in [
        (model.to_str().unwrap(), &[][..], 4096),
        (
            model.join("config.json").to_str().unwrap(),
            &["--seq-len", "8192"][..],
            8192,
        ),
    ] {
        let (code, out, err) = plan(m, extra);
        assert_eq!(code, Some(0), "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["plan"]["model"], "qwen-tiny");
        assert_eq!(v["plan"]["seq_len"], seq);
    }
    // A mixture of experts plans as its experts, one with dense layers
    // among them too (every other layer, `decoder_sparse_step` 2); one
    // whose expert layers follow no pattern is refused naming the fields.
    let moe = dir.join("moe.json");
    let config = r#"{"model_type": "qwen3_moe", "hidden_act": "silu", "hidden_size": 2048,
        "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
        "num_experts_per_tok": 8, "num_attention_heads": 32, "num_key_value_heads": 4,
        "num_hidden_layers": 48, "vocab_size": 151936, "decoder_sparse_step": 1}"#;
    std::fs::write(&moe, config).unwrap();
    let (code, out, err) = plan(moe.to_str().unwrap(), &["--expert-parallel", "8"]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["plan"]["model"], "moe");
    std::fs::write(
        &moe,
        config.replace("\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 2"),
    )
    .unwrap();
    let (code, _, err) = plan(moe.to_str().unwrap(), &[]);
    assert_eq!(code, Some(0), "{err}");
    std::fs::write(
        &moe,
        config.replace(
            "\"decoder_sparse_step\": 1",
            "\"decoder_sparse_step\": 2, \"mlp_only_layers\": [47]",
        ),
    )
    .unwrap();
    let (code, _, err) = plan(moe.to_str().unwrap(), &[]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("moe.json")
            && err.contains("`decoder_sparse_step`, `mlp_only_layers` make layers 1, 3, 5")
            && err.contains("(layer 47 dense)"),
        "{err}"
    );
    // A directory whose config.json is a FIFO: refused by name, unread
    // (until 2026-12-07 it was read as a model TOML path and said to be a
    // directory).
    let fifo_dir = dir.join("fifo");
    std::fs::create_dir_all(&fifo_dir).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(fifo_dir.join("config.json"))
        .status()
        .unwrap();
    assert!(made.success());
    let (code, _, err) = plan(fifo_dir.to_str().unwrap(), &[]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("config.json: it is a FIFO, not a regular file"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `--expert-parallel` on Mixtral 8x7B: the search keeps every stage's
/// replicas a multiple of the groups, each chip holds a share of the
/// experts (less weight memory than every expert on every chip), the text
/// names the setting, and an evaluated plan whose replicas the degree does
/// not divide is refused by name, as is the degree on a dense model.
#[test]
fn expert_parallelism_divides_a_mixtures_experts() {
    let dir = scratch("ep");
    let cluster = example("china-mobile-3-vendor.toml");
    let plan = |model: &str, extra: &[&str]| {
        plan_with(
            &cluster,
            model,
            &[&["--global-batch", "512"][..], extra].concat(),
        )
    };
    let weights_and_replicas = |ep: &str| {
        let (code, out, err) = plan("mixtral-8x7b", &["--json", "--expert-parallel", ep]);
        assert_eq!(code, Some(0), "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let r = &v["plan"]["replicas"][0];
        let weights: Vec<f64> = r["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let layers = s["end_layer"].as_f64().unwrap() - s["first_layer"].as_f64().unwrap();
                s["memory"]["weights"].as_f64().unwrap() * s["tp"].as_f64().unwrap() / layers
            })
            .collect();
        (weights, v["plan"]["dp"].as_u64().unwrap(), out)
    };
    let (one, _, _) = weights_and_replicas("1");
    let (eight, dp, out) = weights_and_replicas("8");
    assert_eq!(dp % 8, 0, "{out}");
    // A layer's weights on a chip (times its tp): at most the dense part
    // and an eighth of the experts, where every expert took 2.8 GB.
    assert!(eight.iter().all(|&w| w < 0.6e9), "{eight:?}");
    assert!(one.iter().all(|&w| w > 2.8e9), "{one:?}");
    let file = dir.join("plan.json");
    std::fs::write(&file, &out).unwrap();
    let file = file.to_str().unwrap();
    let (code, text, err) = plan("mixtral-8x7b", &["--evaluate", file]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        text.starts_with("settings: bf16, expert parallel 8\n"),
        "{text}"
    );
    // The plan's replicas, in groups of 8 not of 3 * 8.
    let mut odd: serde_json::Value = serde_json::from_str(&out).unwrap();
    let copies = odd["plan"]["replicas"][0]["copies"].as_u64().unwrap();
    odd["plan"]["replicas"][0]["copies"] = (copies - 4).into();
    odd["plan"]["dp"] = (copies - 4).into();
    let sequences = odd["plan"]["global_batch"].as_u64().unwrap() / copies * (copies - 4);
    odd["plan"]["global_batch"] = sequences.into();
    std::fs::write(dir.join("odd.json"), odd.to_string()).unwrap();
    let odd = dir.join("odd.json");
    let (code, _, err) = plan("mixtral-8x7b", &["--evaluate", odd.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("expert_parallel is 8, which does not divide"),
        "{err}"
    );
    let (code, _, err) = plan("llama-7b", &["--expert-parallel", "2"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("is dense"), "{err}");
    // --search-expert-parallel keeps the fastest degree of 1, 2, 4 and 8.
    let tokens = |out: &str| {
        let v: serde_json::Value = serde_json::from_str(out).unwrap();
        let ep = v["settings"]["expert_parallel"].as_u64().unwrap_or(1);
        (v["plan"]["tokens_per_s_simulated"].as_f64().unwrap(), ep)
    };
    let (code, out, err) = plan("mixtral-8x7b", &["--json", "--search-expert-parallel"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("expert parallelism searched at 1: "), "{err}");
    let (best, ep) = tokens(&out);
    for d in ["1", "2", "4", "8"] {
        let (code, out, e) = plan("mixtral-8x7b", &["--json", "--expert-parallel", d]);
        assert_eq!(code, Some(0), "{e}");
        let (t, _) = tokens(&out);
        assert!(t <= best, "degree {d}: {t} over the kept {best} at {ep}");
    }
    let (code, _, err) = plan("llama-7b", &["--search-expert-parallel"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("is dense"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `--fp8`: on a cluster whose chip types give an fp8 peak the search
/// prices the layers' matmuls there (a shorter step than in bf16) and the
/// text says so; on one without, refused naming the chip type.
#[test]
fn fp8_plans_where_the_chips_have_fp8_matmuls() {
    let h100 = outside("megatron-bridge-h100/dgx-h100.toml");
    let h100 = h100.to_str().unwrap();
    let step = |extra: &[&str]| {
        let args = [&["--global-batch", "256"][..], extra].concat();
        let (code, out, err) = plan_with(h100, "llama-70b", &args);
        assert_eq!(code, Some(0), "{err}");
        let at = out.find("predicted step time: ").unwrap() + 21;
        let secs: f64 = out[at..].split(' ').next().unwrap().parse().unwrap();
        (secs, out)
    };
    let (bf16, _) = step(&[]);
    let (fp8, out) = step(&["--fp8"]);
    assert!(
        out.starts_with("settings: bf16 with FP8 matmuls\n"),
        "{out}"
    );
    assert!(fp8 < 0.8 * bf16, "{fp8} {bf16}");
    let cluster = example("china-mobile-3-vendor.toml");
    let (code, _, err) = plan_with(&cluster, "llama-7b", &["--global-batch", "64", "--fp8"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("gives no peak_flops.fp8"), "{err}");
}

/// `--context-parallel` scores a plan with each stage's sequences split
/// over groups of its chips: twice the chips, half the activations, about
/// half the step; the search, a sequence that does not split and a plan
/// past the cluster's chips are refused by name.
#[test]
fn context_parallelism_scores_a_plan_with_its_sequences_split() {
    let dir = scratch("cp");
    let file = dir.join("plan.json");
    std::fs::write(
        &file,
        r#"{"groups": [{"copies": 8, "micro_batch_size": 1, "micro_batches": 8, "stages": [
            {"chip": "nvidia-a800-class", "tp": 4, "layers": [0, 16]},
            {"chip": "nvidia-a800-class", "tp": 4, "layers": [16, 32]}]}]}"#,
    )
    .unwrap();
    let cluster = example("china-mobile-3-vendor.toml");
    let plan = |extra: &[&str]| {
        plan_with(
            &cluster,
            "llama-7b",
            &[&["--seq-len", "16384"][..], extra].concat(),
        )
    };
    let scored = |cp: &str| {
        let (code, out, err) = plan(&[
            "--evaluate",
            file.to_str().unwrap(),
            "--json",
            "--context-parallel",
            cp,
        ]);
        assert_eq!(code, Some(0), "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let p = &v["plan"];
        let acts = p["replicas"][0]["stages"][0]["memory"]["activations"]
            .as_f64()
            .unwrap();
        (
            p["chips_used"].as_u64().unwrap(),
            p["step_time_simulated"].as_f64().unwrap(),
            acts,
        )
    };
    let (chips1, step1, acts1) = scored("1");
    let (chips2, step2, acts2) = scored("2");
    assert_eq!((chips1, chips2), (64, 128));
    assert!(
        (acts2 - acts1 / 2.0).abs() < 1e-6 * acts1,
        "{acts1} {acts2}"
    );
    assert!(
        step2 < 0.6 * step1 && step2 > 0.4 * step1,
        "{step1} {step2}"
    );
    for (extra, says) in [
        (
            &["--context-parallel", "2"][..],
            "the search proposes plans without context",
        ),
        (
            &[
                "--evaluate",
                file.to_str().unwrap(),
                "--context-parallel",
                "3",
            ][..],
            "do not split into 6 equal chunks",
        ),
        (
            &[
                "--evaluate",
                file.to_str().unwrap(),
                "--context-parallel",
                "8",
            ][..],
            "(context parallel 8: each replica's tp chips 8 times)",
        ),
    ] {
        let (code, _, err) = plan(extra);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains(says), "{err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A heterogeneous FSDP plan (two groups of two chip types, each replica
/// the whole 7B model, the batch dealt unevenly): under ZeRO-3 both types
/// hold it, sharded over all 16 replicas, where unsharded neither does and
/// ZeRO-2 leaves the smaller chip short; ZeRO-3's gathers, hidden behind
/// the passes but for a layer's, leave no step-end reduction.
#[test]
fn a_heterogeneous_fsdp_plan_fits_under_zero_3() {
    let dir = scratch("fsdp");
    let file = dir.join("plan.json");
    std::fs::write(
        &file,
        r#"{"groups": [
            {"copies": 8, "micro_batch_size": 2, "micro_batches": 4,
             "stages": [{"chip": "nvidia-a800-class", "tp": 1, "layers": [0, 32]}]},
            {"copies": 8, "micro_batch_size": 1, "micro_batches": 4,
             "stages": [{"chip": "iluvatar-bi-v100-class", "tp": 1, "layers": [0, 32]}]}]}"#,
    )
    .unwrap();
    let cluster = example("china-mobile-3-vendor.toml");
    let fits = |zero: &str| {
        let file = file.to_str().unwrap();
        let args = ["--json", "--evaluate", file, "--zero-stage", zero];
        let (code, out, err) = plan_with(&cluster, "llama-7b", &args);
        assert_eq!(code, Some(0), "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let stages: Vec<(bool, f64)> = (0..2)
            .map(|g| {
                let s = &v["plan"]["replicas"][g]["stages"][0];
                let fits = s["memory"]["total"].as_f64() <= s["memory_capacity"].as_f64();
                (fits, s["timing"]["dp_allreduce"].as_f64().unwrap())
            })
            .collect();
        stages
    };
    assert!(fits("0").iter().all(|s| !s.0));
    assert_eq!(
        fits("2").iter().map(|s| s.0).collect::<Vec<_>>(),
        [true, false]
    );
    let zero3 = fits("3");
    assert!(
        zero3.iter().all(|&(fit, reduce)| fit && reduce == 0.0),
        "{zero3:?}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A file of the planner's outside datasets.
fn outside(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../planner/tests/data/outside")
        .join(name)
}

/// `polychip plan --evaluate` of Megatron-Bridge's Qwen3-235B-A22B H100
/// run (tp 2, 8 x 4 chunks, GBS 2,048) on its cluster, in FP8 with the
/// optimizer state sharded and 32-way expert parallelism, and `extra`;
/// the plan written under `dir`.
fn evaluate_qwen3_235b(dir: &std::path::Path, extra: &[&str]) -> (Option<i32>, String, String) {
    evaluate_bridge_run(dir, "qwen3-235b-a22b/gbs2048", "32", extra)
}

/// `polychip plan --evaluate` of the Megatron-Bridge H100 run `name` (its
/// model's TOML named by the run's model), FP8 with ZeRO-1 at expert
/// parallelism `ep`, plus `extra`.
fn evaluate_bridge_run(
    dir: &std::path::Path,
    name: &str,
    ep: &str,
    extra: &[&str],
) -> (Option<i32>, String, String) {
    let runs: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(outside(
            "megatron-bridge-h100/megatron-bridge-h100-runs.json",
        ))
        .unwrap(),
    )
    .unwrap();
    let run = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap();
    let model = format!(
        "megatron-bridge-h100/{}.toml",
        run["model"].as_str().unwrap()
    );
    let file = dir.join("plan.json");
    std::fs::write(&file, run["plan"].to_string()).unwrap();
    let flags = [
        "--evaluate",
        file.to_str().unwrap(),
        "--fp8",
        "--shard-optimizer",
        "--expert-parallel",
        ep,
    ];
    plan_with(
        outside("megatron-bridge-h100/dgx-h100.toml")
            .to_str()
            .unwrap(),
        outside(&model).to_str().unwrap(),
        &[&flags[..], extra].concat(),
    )
}

/// `--loss`: Qwen3-30B-A3B's micro-batch-2 H100 run (8,192 tokens of a
/// 151,936-word vocabulary on its last chunk's GPU) fits under
/// Megatron-Core's in-place loss, the default, as it ran, and not at an
/// eager loss's 12 bytes a logit, which the settings line names; an
/// unknown kernel is refused by name.
#[test]
fn the_loss_kernel_decides_whether_the_last_stage_fits() {
    let dir = scratch("loss-kernel");
    let evaluate = |extra: &[&str]| {
        let flags = [
            &["--expert-tensor-parallel", "1", "--half-gradients"],
            extra,
        ]
        .concat();
        evaluate_bridge_run(&dir, "qwen3-30b-a3b/gbs512", "8", &flags)
    };
    // The last chunk's device's logits term, GB.
    let logits = |out: &str| -> f64 {
        let device1 = &out[out.find("memory for device 1").unwrap()..];
        let at = device1.find("logits ").unwrap() + "logits ".len();
        device1[at..].split(' ').next().unwrap().parse().unwrap()
    };
    let (code, out, err) = evaluate(&[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!out.contains("DOES NOT FIT"), "{out}");
    assert!(!out.contains(" loss"), "the default is not named: {out}");
    let (code, eager, err) = evaluate(&["--loss", "eager"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(eager.contains(", eager loss\n"), "{eager}");
    assert!(
        eager.contains("memory for device 1, all its chunks"),
        "{eager}"
    );
    assert!(eager.contains("(DOES NOT FIT)"), "{eager}");
    // b s V = 1,244,659,712 logits, 6 bytes more each (both terms less
    // the same last layer's transients).
    let (six, twelve) = (logits(&out), logits(&eager));
    assert!((twelve - six - 7.468).abs() < 0.011, "{six} {twelve}");
    // Transformer Engine's fused loss, which the run used (its runs file's
    // "loss"): 10 bytes a logit fewer than eager's, 12.45 GB.
    let (code, fused, err) = evaluate(&["--loss", "fused"]);
    assert_eq!(code, Some(0), "{err}");
    let two = logits(&fused);
    assert!((twelve - two - 12.447).abs() < 0.011, "{two} {twelve}");
    let (code, _, err) = evaluate(&["--loss", "chunked"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("unknown loss kernel `chunked`"), "{err}");
    // A report records its kernel, and --evaluate prices it under it
    // unless the flag says otherwise, which it notes.
    let cluster = example("china-mobile-3-vendor.toml");
    let (code, report, err) = plan_with(&cluster, "llama-7b", &["--loss", "eager", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let json: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert_eq!(json["settings"]["loss"], "eager");
    let file = dir.join("report.json");
    std::fs::write(&file, &report).unwrap();
    let file = file.to_str().unwrap();
    let (code, out, err) = plan_with(&cluster, "llama-7b", &["--evaluate", file]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("settings: bf16, eager loss\n"), "{out}");
    let (code, out, err) = plan_with(
        &cluster,
        "llama-7b",
        &["--evaluate", file, "--loss", "fused"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("(--loss fused for eager); evaluated under the flags'"),
        "{err}"
    );
    assert!(out.starts_with("settings: bf16, fused loss\n"), "{out}");
}

/// `--expert-tensor-parallel 1` beside tp 2 (Qwen3-235B-A22B's H100
/// recipe: 32-way expert parallelism over 16 replicas of tp 2): the plan
/// the degree of the tp cannot fold is evaluated, its experts whole on each
/// chip, and the text names the setting; a degree that does not divide the
/// tp is refused by name.
#[test]
fn an_expert_tensor_parallel_degree_folds_the_experts_over_the_tp() {
    let dir = scratch("etp");
    let evaluate = |extra: &[&str]| evaluate_qwen3_235b(&dir, extra);
    let (code, _, err) = evaluate(&[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("expert_parallel is 32, which does not divide a stage's 16 expert slices"),
        "{err}"
    );
    let (code, text, err) = evaluate(&["--expert-tensor-parallel", "1"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        text.starts_with(
            "settings: bf16 with FP8 matmuls, ZeRO-1 (optimizer state sharded), expert parallel \
             32, expert tensor parallel 1\n"
        ),
        "{text}"
    );
    let (code, _, err) = evaluate(&["--expert-tensor-parallel", "4"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("expert_tensor_parallel 4 does not divide a stage's tp 2"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `--mtp-layers 1` (DeepSeek-V3's and Megatron-LM's multi-token
/// prediction) on Qwen3-235B-A22B's H100 plan: its last stage runs the
/// layer more and the step is longer; too many layers are refused by name
/// (and any on `polychip train`'s chips: `cost_tests.rs`).
#[test]
fn multi_token_prediction_layers_run_on_the_last_stage() {
    let dir = scratch("mtp");
    let evaluate = |extra: &[&str]| {
        evaluate_qwen3_235b(&dir, &[&["--expert-tensor-parallel", "1"], extra].concat())
    };
    let step = |text: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with("predicted step: "))
            .unwrap();
        line["predicted step: ".len()..]
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let (code, without, err) = evaluate(&[]);
    assert_eq!(code, Some(0), "{err}");
    let (code, with, err) = evaluate(&["--mtp-layers", "1"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(with.contains("layers 92..94 and 1 MTP: "), "{with}");
    assert!(!without.contains("MTP"), "{without}");
    assert!(step(&with) > step(&without), "{with}\n{without}");
    let (code, _, err) = evaluate(&["--mtp-layers", "17"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("--mtp-layers 17: model \"qwen3-235b-a22b\": mtp_layers is 17, more than"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `--recompute-modules`: selective recomputation of the modules named
/// (implied), in the text; an unknown name, or modules beside full
/// recomputation, refused by name.
#[test]
fn recompute_modules_name_what_selective_recomputation_recomputes() {
    let cluster = example("china-mobile-3-vendor.toml");
    let plan = |extra: &[&str]| plan_with(&cluster, "llama-7b", extra);
    let (code, text, err) = plan(&["--recompute-modules", "core_attn,mlp,mlp"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        text.starts_with("settings: bf16, selective recomputation of core_attn, mlp\n"),
        "{text}"
    );
    let (code, _, err) = plan(&["--recompute-modules", "attention"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("--recompute-modules attention: expected some of core_attn, layernorm"),
        "{err}"
    );
    let (code, _, err) = plan(&["--recompute", "full", "--recompute-modules", "mlp"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("recompute_modules [mlp] apply to selective recomputation"),
        "{err}"
    );
}

#[test]
fn score_ranks_measured_outside_runs_and_says_each_outcome() {
    // Sailor's GPT-Neo 2.7B runs on the GH200 cluster (fp32, no fused
    // attention), as a runs file; one marked as not having run, so that
    // the fit agreement has a miss to name.
    let sailor: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(outside("sailor-runs.json")).unwrap())
            .unwrap();
    let mut runs: Vec<serde_json::Value> = sailor["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["cluster"] == "clariden-gh200" && r["model"] == "gpt-neo-2.7b")
        .map(|r| {
            serde_json::json!({
                "name": r["name"],
                "plan": r["plan"],
                "step_seconds": r["measured_step_s"],
                "peak_memory_bytes": r["measured_peak_bytes"],
            })
        })
        .collect();
    assert_eq!(runs.len(), 11);
    let failed = runs[0]["name"].as_str().unwrap().to_string();
    runs[0] = serde_json::json!({ "name": failed, "plan": runs[0]["plan"], "ran": false });
    let doc = serde_json::json!({
        "settings": { "dtype": "f32", "flash_attention": false },
        "runs": runs,
    });
    let dir = scratch("score");
    let file = dir.join("runs.json");
    std::fs::write(&file, doc.to_string()).unwrap();
    let cluster = outside("clariden-gh200.toml");
    let model = outside("gpt-neo-2.7b.toml");
    let score = |extra: &[&str]| {
        let base = [
            "plan",
            "--cluster",
            cluster.to_str().unwrap(),
            "--model",
            model.to_str().unwrap(),
            "--score",
            file.to_str().unwrap(),
        ];
        polychip(&[&base[..], extra].concat())
    };
    let (code, out, err) = score(&["--json"]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let s = &v["scores"];
    assert_eq!(s["runs"].as_u64().unwrap() as usize, runs.len());
    assert_eq!(s["ran"].as_u64().unwrap() as usize, runs.len() - 1);
    assert!(s["spearman"].as_f64().unwrap() > 0.9, "{s}");
    assert_eq!(
        s["predicted_to_fit_but_failed"],
        serde_json::json!([failed])
    );
    assert_eq!(
        s["fit_agreement"].as_u64().unwrap() as usize,
        runs.len() - 1,
        "{s}"
    );
    assert!(
        s["median_memory_error"].as_f64().unwrap().abs() < 0.5,
        "{s}"
    );
    // The settings the runs file gives, the loss at its default.
    assert_eq!(v["settings"]["dtype"], "f32");
    assert_eq!(v["settings"]["flash_attention"], false);
    assert!(v["settings"].get("loss").is_none(), "{}", v["settings"]);
    // The table says the same, under the settings' line.
    let (code, table, err) = score(&[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        table.lines().next(),
        Some("settings: f32, no flash attention")
    );
    let (_, eager, _) = score(&["--loss", "eager"]);
    assert_eq!(
        eager.lines().next(),
        Some("settings: f32, no flash attention, eager loss")
    );
    assert!(
        table.contains("10 runs that ran (ranked by seconds per sequence): Spearman ")
            && table.contains(&format!("predicted to fit but did not run: {failed}")),
        "{table}"
    );
    // Each run's plan gives its batch: a --global-batch is refused, not
    // ignored.
    let (code, _, err) = score(&["--global-batch", "8"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--global-batch"), "{err}");
    // A run without its outcome is refused naming the run and the file.
    std::fs::write(
        &file,
        serde_json::json!({ "runs": [{ "name": "x", "plan": doc["runs"][1]["plan"] }] })
            .to_string(),
    )
    .unwrap();
    let (code, _, err) = score(&[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("runs.json: run \"x\": has no step_seconds"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn an_infeasible_case_exits_2_with_the_shortfall() {
    let dir = scratch("tiny");
    let file = dir.join("tiny.toml");
    std::fs::write(
        &file,
        r#"
inter_node_bandwidth = 25e9
[[chip_types]]
name = "tiny"
count = 8
chips_per_node = 8
memory_bytes = 17179869184
peak_flops = { f32 = 19.5e12, bf16 = 312e12, f16 = 312e12 }
efficiency = 0.5
intra_node_bandwidth = 300e9
nic_bandwidth = 25e9
"#,
    )
    .unwrap();
    let (code, out, err) = polychip(&[
        "plan",
        "--cluster",
        file.to_str().unwrap(),
        "--model",
        "h2-100b",
    ]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(
        err.contains("the h2-100b model needs at least 1.84 TB for weights, gradients and optimizer state; the cluster has 137.44 GB of memory in total: 1.70 TB short"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `polychip profile` on the bundled devices, then `polychip plan
/// --evaluate` of a `--save-plan` pipeline with and without the profile.
#[test]
fn profile_then_evaluate_a_saved_plan_of_the_bundled_devices() {
    let dir = std::env::temp_dir().join(format!("polychip-eval-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = |n: &str| dir.join(n).to_str().unwrap().to_string();
    let (code, devices, err) = polychip(&["devices", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    std::fs::write(file("devices.json"), devices).unwrap();
    let (code, _, err) = polychip(&[
        "profile",
        "--model",
        "mini",
        "--micro-batch-sizes",
        "1,2",
        "--out",
        &file("profile.json"),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let profile: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file("profile.json")).unwrap()).unwrap();
    let entries = profile["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 4, "{profile}");
    for e in entries {
        assert!(e["block"]["forward"].as_f64().unwrap() > 0.0, "{e}");
        assert!(e["peak_memory_bytes"].as_u64().unwrap() > 0, "{e}");
        // The weights' gradients timed apart, a part of the backward pass
        // (at most all of it: the two are noisy medians, clamped).
        for part in ["block", "head"] {
            let (w, b) = (&e[part]["weight_grad"], &e[part]["backward"]);
            assert!(w.as_f64().unwrap() > 0.0, "{e}");
            assert!(w.as_f64().unwrap() <= b.as_f64().unwrap(), "{e}");
        }
    }
    let (code, out, err) = polychip(&[
        "train",
        "--model",
        "mini",
        "--stages",
        "ferrite:0=0..1,cobalt:0=1..2",
        "--global-batch",
        "8",
        "--micro-batch-size",
        "2",
        "--save-plan",
        &file("plan.json"),
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    let (devices, plan) = (file("devices.json"), file("plan.json"));
    let plan_mini = |extra: &[&str]| {
        polychip(
            &[
                &["plan", "--cluster", devices.as_str(), "--model", "mini"][..],
                extra,
            ]
            .concat(),
        )
    };
    let eval = |extra: &[&str]| {
        plan_mini(&[&["--dtype", "f32", "--evaluate", plan.as_str()][..], extra].concat())
    };
    let (code, table, err) = eval(&[]);
    assert_eq!(code, Some(0), "{err}");
    for needle in [
        "stage 1: Cobalt",
        "logits",
        "reserve",
        "bottleneck:",
        "fits:",
        // A cluster seeded from the devices counts as the trainer allocates.
        "memory counted as polychip train allocates it:",
    ] {
        assert!(table.contains(needle), "no {needle:?} in\n{table}");
    }
    let profile = file("profile.json");
    let (code, json, err) = eval(&["--profile", &profile, "--json"]);
    assert_eq!(code, Some(0), "{err}");
    // A measured profile is below the devices' declared peaks; the same
    // times a million times smaller (at least the 1 ns a pass must take)
    // are used as given, with a warning naming the file, the chip and the
    // part.
    assert!(!err.contains("warning"), "{err}");
    let mut tiny: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&profile).unwrap()).unwrap();
    for e in tiny["entries"].as_array_mut().unwrap() {
        for part in ["embedding", "block", "attention", "head", "stage_overhead"] {
            if let Some(times) = e[part].as_object_mut() {
                // The block's held passes are an object of times too.
                let held = times.get_mut("held").and_then(|h| h.as_object_mut());
                let nested: Vec<&mut serde_json::Value> =
                    held.map_or_else(Vec::new, |h| h.values_mut().collect());
                let tiny = |t: &mut serde_json::Value| {
                    *t = serde_json::json!((t.as_f64().unwrap() * 1e-6).max(1e-9));
                };
                nested.into_iter().for_each(tiny);
                times.values_mut().filter(|t| t.is_number()).for_each(tiny);
            }
        }
    }
    let fast = file("fast-profile.json");
    std::fs::write(&fast, tiny.to_string()).unwrap();
    let (code, _, err) = eval(&["--profile", &fast]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains(&format!(
            "warning: {fast}: Ferrite F1 at micro-batch 1 and tp 1: its block's forward pass would have run at"
        )) && err.contains("its times are not seconds"),
        "{err}"
    );
    let ev: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(ev["measured_chips"].as_array().unwrap().len(), 2, "{ev}");
    assert_eq!(
        ev["polychip_count_chips"].as_array().unwrap().len(),
        2,
        "{ev}"
    );
    assert_eq!(ev["plan"]["global_batch"], 8);
    assert_eq!(ev["fits"], true);
    // The plan runs 1F1B; under zero bubble (asked for, or named by the
    // plan file) the weights' gradients come from the profile.
    assert_eq!(ev["plan"]["replicas"][0]["pipeline"], "1f1b");
    let (code, table, err) = eval(&["--profile", &profile, "--schedule", "zero-bubble"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        table.contains("bubble") && table.contains(", zero-bubble schedule"),
        "{table}"
    );
    let mut named: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    named["schedule"] = "zero-bubble".into();
    let zb_plan = file("zb-plan.json");
    std::fs::write(&zb_plan, named.to_string()).unwrap();
    let (code, json, err) = plan_mini(&[
        "--dtype",
        "f32",
        "--evaluate",
        &zb_plan,
        "--profile",
        &profile,
        "--json",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let zb: serde_json::Value = serde_json::from_str(&json).unwrap();
    let r = &zb["plan"]["replicas"][0];
    assert_eq!(r["pipeline"], "zero-bubble");
    let w = r["stages"][1]["timing"]["weight_grad"].as_f64().unwrap();
    assert!(
        w > 0.0 && w < r["stages"][1]["timing"]["backward"].as_f64().unwrap(),
        "{r}"
    );
    // Deferred weights: 1F1B's passes, the last stage's last two weights'
    // passes after its last input gradient: a shorter simulated step.
    let (code, json, err) = plan_mini(&[
        "--dtype",
        "f32",
        "--evaluate",
        &plan,
        "--profile",
        &profile,
        "--schedule",
        "1f1b-deferred",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let deferred: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(deferred["plan"]["replicas"][0]["pipeline"], "1f1b-deferred");
    let simulated = |v: &serde_json::Value| v["plan"]["step_time_simulated"].as_f64().unwrap();
    assert!(simulated(&deferred) < simulated(&ev), "{deferred}\n{ev}");
    // Another model's profile is refused, naming the field; a plan that
    // does not fit the model (mini's 2 layers, tiny's more) is refused
    // naming the plan file.
    let plan_tiny = |flag: &str, path: &str| {
        let devices = file("devices.json");
        polychip(&["plan", "--cluster", &devices, "--model", "tiny", flag, path])
    };
    let (code, _, err) = plan_tiny("--profile", &profile);
    assert_eq!(code, Some(2));
    assert!(
        err.contains(&format!(
            "{profile}: profile was measured on model \"mini\" whose layers is 2"
        )),
        "{err}"
    );
    let (code, _, err) = plan_tiny("--evaluate", &plan);
    assert_eq!(code, Some(2));
    assert!(err.contains(&format!("plan {plan}: ")), "{err}");
    // The planner's own plan of the devices, its chip types the names
    // `polychip devices` reports (`Ferrite F1`), trains as it is.
    let (code, json, err) = plan_mini(&["--global-batch", "8", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        json.contains("\"chip\": \"Ferrite F1\"") || json.contains("\"chip\": \"Cobalt"),
        "{json}"
    );
    let planned = file("planned.json");
    std::fs::write(&planned, json).unwrap();
    let train = |model: &str| {
        let args = ["--plan", &planned, "--global-batch", "8", "--steps", "1"];
        polychip(&[&["train", "--model", model][..], &args].concat())
    };
    let (code, out, err) = train("mini");
    assert_eq!(code, Some(0), "{out}{err}");
    // It is a plan of mini: another model is refused, not trained on it.
    let (code, _, err) = train("tiny");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("it was planned for model \"mini\" with sequences of 16 tokens, and this run trains \"tiny\""),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A plan's groups fix its batch: a `--global-batch` that differs is said
/// in a note (it was silently dropped), one that agrees is not.
#[test]
fn evaluate_notes_a_global_batch_the_plan_does_not_take() {
    let dir = common::scratch_dir("plan", "eval-batch");
    let plan = dir.join("plan.toml");
    std::fs::write(
        &plan,
        "[[group]]\nmicro_batch_size = 1\nmicro_batches = 4\nstages = [{ chip = \
         \"nvidia-a800-class\", tp = 8, layers = [0, 32] }]\n",
    )
    .unwrap();
    let cluster = example("china-mobile-3-vendor.toml");
    let run = |batch: &str| {
        let (code, _, err) = polychip(&[
            "plan",
            "--cluster",
            &cluster,
            "--model",
            "llama-7b",
            "--evaluate",
            plan.to_str().unwrap(),
            "--global-batch",
            batch,
        ]);
        assert_eq!(code, Some(0), "{err}");
        err
    };
    let err = run("64");
    assert!(
        err.contains("its groups take 4 sequences per step")
            && err.contains("not --global-batch 64"),
        "{err}"
    );
    assert!(!run("4").contains("--global-batch"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A model whose parts the device cannot hold is refused by `polychip
/// profile` and by `train --plan auto` before any weights are built (it
/// used to take minutes and gigabytes of host memory, then abort), naming
/// the device, the part and the shortfall.
#[test]
fn a_model_too_large_to_profile_is_refused_before_building_it() {
    let dir = common::scratch_dir("plan", "too-large-to-profile");
    let model = dir.join("mid.toml");
    std::fs::write(
        &model,
        "name = \"mid\"\ndim = 8192\nlayers = 64\nheads = 64\nkv_heads = 8\nffn = 28672\nseq_len = 4096\n",
    )
    .unwrap();
    let model = model.to_str().unwrap();
    let out = dir.join("p.json");
    let started = std::time::Instant::now();
    let (code, _, err) = polychip(&["profile", "--model", model, "--out", out.to_str().unwrap()]);
    assert_ne!(code, Some(0), "{err}");
    assert!(
        err.contains("with micro-batches of 1 sequences of 4096")
            && err.contains("so the model cannot be profiled or trained on it"),
        "{err}"
    );
    assert!(!out.exists());
    let (code, _, err) = polychip(&[
        "train",
        "--model",
        model,
        "--devices",
        "ferrite:0",
        "--steps",
        "1",
        "--global-batch",
        "2",
    ]);
    assert_ne!(code, Some(0), "{err}");
    assert!(
        err.contains("cannot hold") && err.contains("MiB short")
            || err.contains("cannot be profiled"),
        "{err}"
    );
    assert!(started.elapsed().as_secs() < 30, "{:?}", started.elapsed());
    std::fs::remove_dir_all(&dir).ok();
}

/// A model file that neither format reads is named, with both formats'
/// reasons (`dim` beside `hidden` was "unknown field dim", though `dim`
/// alone is the trainer's format).
#[test]
fn a_model_file_neither_format_reads_is_named_with_both_reasons() {
    let dir = common::scratch_dir("plan", "model-both-formats");
    let model = dir.join("both.toml");
    std::fs::write(
        &model,
        "name = \"m\"\ndim = 64\nlayers = 2\nhidden = 64\nheads = 4\nkv_heads = 4\nffn = 128\n\
         vocab = 256\nseq_len = 64\n",
    )
    .unwrap();
    let cluster = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/clusters/h2-like-1024.toml"
    );
    let (code, _, err) = polychip(&[
        "plan",
        "--cluster",
        cluster,
        "--model",
        model.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!("{}: could not parse model TOML", model.display()))
            && err.contains("read as polychip train's model format instead"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

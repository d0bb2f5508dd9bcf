//! `polychip plan` on the example clusters with the 100B and 70B presets,
//! JSON output and trace, and an infeasible case.

mod common;
use common::polychip;

fn example(name: &str) -> String {
    format!("{}/../examples/clusters/{name}", env!("CARGO_MANIFEST_DIR"))
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
                "bubble fraction",
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
fn an_infeasible_case_exits_2_with_the_shortfall() {
    let dir = std::env::temp_dir().join(format!("polychip-plan-tiny-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
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

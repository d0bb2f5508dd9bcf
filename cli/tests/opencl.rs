//! The OpenCL plugin through the `polychip` command: it passes `polychip
//! conform` with nothing failed, skipped or unimplemented (every slot of
//! the ABI's op table implemented); it reports zero
//! devices, with the reason, where OpenCL has no driver; and `polychip
//! train` runs pipelines and replicas that include its device, a
//! three-vendor pipeline following the single-device loss curve.
//!
//! Needs `cargo build --workspace` first and an OpenCL driver
//! (`scripts/install-deps` installs PoCL, which runs OpenCL on the CPU).
//! Without an OpenCL device the tests that need one say why and pass,
//! unless `POLYCHIP_REQUIRE_OPENCL=1` (which `scripts/test` sets) makes
//! that a failure.

mod common;
use common::{built_plugin, conform_report, max_diff, polychip_env};

use std::path::{Path, PathBuf};

const PLUGIN: &str = "libpolychip_opencl.so";

/// The bound on |loss difference| per step against one device, f32 (the
/// one `tests/train.rs` states for every heterogeneous plan).
const F32_BOUND: f64 = 1e-4;

/// `polychip devices --json` with only `plugin` loaded: the report, and
/// what it wrote to stderr.
fn devices_of(plugin: &str) -> (serde_json::Value, String) {
    let (code, out, err) = polychip_env(
        &["devices", "--json"],
        &[
            ("POLYCHIP_PLUGIN_PATH", plugin),
            ("POLYCHIP_NO_BUNDLED_PLUGINS", "1"),
        ],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    (serde_json::from_str(&out).unwrap(), err)
}

/// The plugin's path, when the machine has an OpenCL device.
fn opencl() -> Option<String> {
    opencl_devices().map(|(plugin, _)| plugin)
}

/// The plugin's path and its `polychip devices --json`, when the machine
/// has an OpenCL device.
fn opencl_devices() -> Option<(String, serde_json::Value)> {
    let plugin = built_plugin(PLUGIN);
    let (doc, err) = devices_of(&plugin);
    if doc["devices"].as_array().is_some_and(|d| !d.is_empty()) {
        return Some((plugin, doc));
    }
    let why =
        format!("no OpenCL device (install a driver: scripts/install-deps installs PoCL): {err}");
    assert!(
        std::env::var("POLYCHIP_REQUIRE_OPENCL").as_deref() != Ok("1"),
        "{why}, and POLYCHIP_REQUIRE_OPENCL=1"
    );
    eprintln!("skipped: {why}");
    None
}

/// Every slot of the op table is filled: `polychip devices` lists no
/// operator missing and all of the ABI's implemented, on every device.
#[test]
fn every_operator_slot_is_implemented() {
    let Some(plugin) = opencl() else {
        return;
    };
    let (doc, _) = devices_of(&plugin);
    for d in doc["devices"].as_array().unwrap() {
        assert_eq!(d["ops_missing"], serde_json::json!([]), "{d}");
        let implemented = d["ops_implemented"].as_array().unwrap().len();
        assert_eq!(implemented, polychip_host::ffi::OP_COUNT, "{d}");
    }
}

/// `polychip conform` on the OpenCL device passes every case of every
/// operator whose name begins with a letter from `lo` to `hi`, each in
/// every dtype the spec lists, every one implemented. Two tests of half
/// the operators each, so that the two halves run side by side (the
/// whole suite on PoCL took a core for a minute).
fn conform_passes_every_case_of(lo: char, hi: char) {
    let Some((plugin, devices)) = opencl_devices() else {
        return;
    };
    let ops = format!("^[{lo}-{hi}]");
    let (code, text, doc) = conform_report(&["--plugin", &plugin, "--ops", &ops], &[]);
    let rows = doc["rows"]
        .as_array()
        .unwrap_or_else(|| panic!("no report: {text}"));
    let total = |key: &str| rows.iter().map(|r| r[key].as_u64().unwrap()).sum::<u64>();
    assert_eq!(total("failed"), 0, "{text}");
    let missing: std::collections::BTreeSet<&str> = rows
        .iter()
        .filter(|r| r["not_implemented"].as_u64().unwrap() > 0)
        .map(|r| r["op"].as_str().unwrap())
        .collect();
    // Every slot implemented: an operator with any case answered "not
    // implemented" (a NULL slot, or a kernel refusing a dtype) is named.
    assert_eq!(
        missing,
        std::collections::BTreeSet::new(),
        "operators not implemented: {text}"
    );
    assert_eq!(total("not_implemented"), 0, "{text}");
    assert_eq!(total("skipped"), 0, "{text}");
    assert!(total("passed") > 2000, "{text}");
    // Every operator of the ABI in the range (the device lists them all,
    // `every_operator_slot_is_implemented`).
    let all = devices["devices"][0]["ops_implemented"].as_array().unwrap();
    let first = |name: &str| name.chars().next().unwrap_or_default();
    let want: std::collections::BTreeSet<&str> = all
        .iter()
        .map(|o| o.as_str().unwrap())
        .filter(|o| (lo..=hi).contains(&first(o)))
        .collect();
    let ran: std::collections::BTreeSet<&str> =
        rows.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ran, want, "{ops}");
    assert_eq!(code, 0, "{text}");
}

#[test]
fn conform_passes_every_case_of_the_operators_a_to_l() {
    conform_passes_every_case_of('a', 'l');
}

#[test]
fn conform_passes_every_case_of_the_operators_m_to_z() {
    conform_passes_every_case_of('m', 'z');
}

/// The row kernels (reductions, softmax, norms, the key sort of embedding
/// backward and of scatter_add, here made to sort every case, matmul's
/// tiles) built for groups of 32 work-items, as a GPU whose kernels allow
/// fewer than the device's 256 needs (`POLYCHIP_OPENCL_WORK_GROUP`), pass
/// as they do at 256.
#[test]
fn row_kernels_pass_at_a_smaller_work_group() {
    let Some(plugin) = opencl() else {
        return;
    };
    let ops = "^(sum|max|argmax|softmax|log_softmax_backward|cross_entropy|rms_norm|layer_norm_backward|embedding_backward|scatter_add|matmul|attention)$";
    let (code, text, doc) = conform_report(
        &["--plugin", &plugin, "--ops", ops, "--dtype", "f32"],
        &[
            ("POLYCHIP_OPENCL_WORK_GROUP", "32"),
            ("POLYCHIP_OPENCL_SCATTER_ADD", "sort"),
        ],
    );
    let rows = doc["rows"]
        .as_array()
        .unwrap_or_else(|| panic!("no report: {text}"));
    let total = |key: &str| rows.iter().map(|r| r[key].as_u64().unwrap()).sum::<u64>();
    assert_eq!(
        (total("failed"), total("not_implemented")),
        (0, 0),
        "{text}"
    );
    assert_eq!(rows.len(), 12, "{text}");
    assert_eq!(code, 0, "{text}");
}

/// `scatter_add` made to sort every case (`POLYCHIP_OPENCL_SCATTER_ADD`),
/// also those of at most 64 places it walks by default, passes every case
/// of the suite in every dtype as the default choice does (the full run
/// above).
#[test]
fn scatter_add_passes_when_it_sorts_every_case() {
    let Some(plugin) = opencl() else {
        return;
    };
    let (code, text, doc) = conform_report(
        &["--plugin", &plugin, "--ops", "^scatter_add$"],
        &[("POLYCHIP_OPENCL_SCATTER_ADD", "sort")],
    );
    let rows = doc["rows"]
        .as_array()
        .unwrap_or_else(|| panic!("no report: {text}"));
    let total = |key: &str| rows.iter().map(|r| r[key].as_u64().unwrap()).sum::<u64>();
    assert_eq!(
        (total("failed"), total("not_implemented"), total("skipped")),
        (0, 0, 0),
        "{text}"
    );
    // f32, f16, bf16, f64, i32, i64.
    assert_eq!(rows.len(), 6, "{text}");
    assert!(total("passed") > 100, "{text}");
    assert_eq!(code, 0, "{text}");
}

#[test]
fn no_driver_means_zero_devices_and_the_reason() {
    let plugin = built_plugin(PLUGIN);
    let empty = std::env::temp_dir().join(format!("polychip-no-icd-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let (code, out, err) = polychip_env(
        &["devices"],
        &[
            ("POLYCHIP_PLUGIN_PATH", &plugin),
            ("POLYCHIP_NO_BUNDLED_PLUGINS", "1"),
            // The ICD loader finds its drivers here: none.
            ("OCL_ICD_VENDORS", empty.to_str().unwrap()),
        ],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("OpenCL") && out.contains("reports no devices"),
        "{out}"
    );
    assert!(err.contains("no OpenCL platform"), "{err}");
    assert!(!out.contains("failed to load"), "{out}");
    let _ = std::fs::remove_dir_all(&empty);
}

fn scratch(name: &str) -> PathBuf {
    common::scratch_dir("opencl", name)
}

/// `polychip train` on the default model (`tiny`, 4 blocks) with the
/// OpenCL plugin loaded beside the bundled ones; the per-step losses.
fn curve(plugin: &str, dir: &Path, tag: &str, extra: &[&str]) -> (Vec<f64>, String) {
    let json = dir.join(format!("{tag}.json"));
    let j = json.display().to_string();
    let mut args = vec![
        "train",
        "--model",
        "tiny",
        "--global-batch",
        "8",
        "--eval-every",
        "0",
        "--log-every",
        "0",
        "--no-pin",
        "--log-json",
        &j,
    ];
    args.extend_from_slice(extra);
    if !extra.contains(&"--steps") {
        args.extend_from_slice(&["--steps", "6"]);
    }
    let (code, out, err) = polychip_env(&args, &[("POLYCHIP_PLUGIN_PATH", plugin)]);
    assert_eq!(code, Some(0), "{tag}: {out}\n{err}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let losses = v["summary"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["loss"].as_f64().unwrap())
        .collect();
    (losses, out + &err)
}

#[test]
fn training_pipelines_and_replicas_include_the_opencl_device() {
    let Some(plugin) = opencl() else {
        return;
    };
    let dir = scratch("train");
    let (reference, _) = curve(&plugin, &dir, "ref", &["--device", "ferrite:0"]);
    assert!(
        reference[5] < reference[0],
        "the loss must fall: {reference:?}"
    );
    let (alone, _) = curve(&plugin, &dir, "alone", &["--device", "opencl:0"]);
    let (three, _) = curve(
        &plugin,
        &dir,
        "three",
        &["--stages", "ferrite:0=0..2,cobalt:0=2..3,opencl:0=3..4"],
    );
    let plan = dir.join("replicas.toml");
    std::fs::write(
        &plan,
        r#"
[[group]]
micro_batch_size = 2
micro_batches = 2
stages = [{ device = "ferrite:0", layers = [0, 4] }]

[[group]]
micro_batch_size = 2
micro_batches = 2
stages = [{ device = "opencl:0", layers = [0, 2] }, { device = "cobalt:0", layers = [2, 4] }]
"#,
    )
    .unwrap();
    let p = plan.display().to_string();
    let (replicas, _) = curve(&plugin, &dir, "replicas", &["--plan", &p]);
    for (name, c) in [
        ("opencl alone", &alone),
        ("pipeline ferrite+cobalt+opencl", &three),
        ("replicas ferrite | opencl+cobalt", &replicas),
    ] {
        let d = max_diff(&reference, c);
        eprintln!("{name}: largest loss difference over 6 steps {d:.3e}");
        assert!(d <= F32_BOUND, "{name}: differs by {d} (bound {F32_BOUND})");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn plan_auto_profiles_the_opencl_device_like_any_other() {
    let Some(plugin) = opencl() else {
        return;
    };
    let dir = scratch("auto");
    let (losses, text) = curve(
        &plugin,
        &dir,
        "auto",
        &[
            "--plan",
            "auto",
            "--devices",
            "ferrite:0,cobalt:0,opencl:0",
            "--steps",
            "2",
        ],
    );
    assert_eq!(losses.len(), 2);
    assert!(text.contains("profiled opencl:0"), "{text}");
    let plan = text
        .lines()
        .find(|l| l.starts_with("plan ("))
        .unwrap_or_default();
    assert!(plan.contains("HeteroAuto"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

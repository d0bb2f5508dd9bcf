//! Hostile inputs, round of 2026-12-06: negative values of numeric flags,
//! paths and names from files quoted escaped and cut like every other
//! value from the user, variables that are long or not UTF-8, a model file
//! that is missing (needs the bundled plugins built, as `input_limits.rs`).

mod common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;

/// `polychip ARGS` (any bytes) with the variables `env` set and those of
/// `unset` removed: exit code and stderr.
fn run(args: &[&OsStr], env: &[(&str, &OsStr)], unset: &[&str]) -> (Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_polychip"));
    cmd.args(args).env("POLYCHIP_TRANSPORT", "shm");
    for v in unset {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run polychip");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn os(args: &[&str]) -> Vec<&'static OsStr> {
    args.iter()
        .map(|a| OsStr::new(Box::leak(a.to_string().into_boxed_str())))
        .collect()
}

fn refused(args: &[&str]) -> String {
    let (code, err) = run(&os(args), &[], &[]);
    assert_eq!(code, Some(2), "{args:?}: {err}");
    err
}

/// Every whole-number flag of every subcommand given `-1` (and `--flag=-1`)
/// is refused in a sentence naming the flag; it was clap's "unexpected
/// argument '-1' found" (a negative number after a flag was taken for
/// another flag) or "invalid digit found in string".
#[test]
fn a_negative_value_of_any_numeric_flag_is_refused_naming_the_flag() {
    let flags: &[(&[&str], &str, &str)] = &[
        (&["train"], "--steps", "0 or more"),
        (&["train"], "--seq-len", "1 or more"),
        (&["train"], "--global-batch", "1 or more"),
        (&["train"], "--seed", "0 or more"),
        (&["train"], "--eval-every", "0 or more"),
        (&["train"], "--copies", "1 or more"),
        (&["train"], "--micro-batch-size", "1 or more"),
        (&["train"], "--save-every", "0 or more"),
        (&["train"], "--stop-after", "1 or more"),
        (&["train"], "--log-every", "0 or more"),
        (&["train"], "--rebalance-every", "1 or more"),
        (&["train"], "--run-ahead", "from 1 to 64"),
        (
            &["plan", "--cluster", "c", "--model", "tiny"],
            "--global-batch",
            "1 or more",
        ),
        (
            &["plan", "--cluster", "c", "--model", "tiny"],
            "--search-timeout",
            "from 0 to 604800",
        ),
        (&["profile", "--out", "o.json"], "--seq-len", "1 or more"),
        (&["profile", "--out", "o.json"], "--repeats", "1 or more"),
        (&["profile", "--out", "o.json"], "--rounds", "1 or more"),
        (&["conform"], "--case", "0 or more"),
        (
            &["checkpoint", "import-hf", "a", "b"],
            "--seq-len",
            "1 or more",
        ),
        (&["bench", "comm"], "--iters", "1 or more"),
        (&["bench", "comm"], "--nproc", "1 or more"),
        (&["launch", "--", "true"], "--nproc", "1 or more"),
    ];
    for &(command, flag, range) in flags {
        // `launch`'s command comes last.
        let (head, tail) = match command.iter().position(|&a| a == "--") {
            Some(at) => command.split_at(at),
            None => (command, &[][..]),
        };
        let spelled = format!("{flag}=-1");
        for given in [&[flag, "-1"][..], &[spelled.as_str()][..]] {
            let args = [head, given, tail].concat();
            let err = refused(&args);
            assert!(
                err.contains(&format!(
                    "must be a whole number{}",
                    match range {
                        r if r.starts_with("from") => format!(" {r}"),
                        r if r.starts_with('0') => format!(", {r}"),
                        r => format!(" of {r}"),
                    }
                )) && err.contains(flag)
                    && err.contains("\"-1\" is negative")
                    && !err.contains("unexpected argument"),
                "{args:?}: {err}"
            );
        }
    }
    // The short spelling names both.
    let err = refused(&["launch", "-n", "-2", "--", "true"]);
    assert!(err.contains("-n/--nproc must be"), "{err}");
    // A number that is not whole, or past the type, is said so.
    let err = refused(&["train", "--steps", "1e3"]);
    assert!(
        err.contains("--steps must be a whole number, 0 or more; \"1e3\" is not one"),
        "{err}"
    );
    let err = refused(&["train", "--copies", "99999999999999999999"]);
    assert!(err.contains("is more than 18446744073709551615"), "{err}");
    let err = refused(&[
        "plan",
        "--cluster",
        "c",
        "--model",
        "tiny",
        "--search-timeout",
        "604801",
    ]);
    assert!(err.contains("\"604801\" is more than 604800"), "{err}");
}

/// The real-number flags take a negative value as a value (it was
/// "unexpected argument '-0'"), and their subcommand refuses it with its
/// range.
#[test]
fn a_negative_value_of_a_real_flag_reaches_its_range_check() {
    let err = refused(&[
        "train",
        "--model",
        "mini",
        "--device",
        "ferrite:0",
        "--lr",
        "-0.1",
    ]);
    assert!(err.contains("lr must be positive, not -0.1"), "{err}");
    let err = refused(&[
        "train",
        "--model",
        "mini",
        "--plan",
        "auto",
        "--profile-error",
        "-1",
    ]);
    assert!(
        err.contains("--profile-error -1 is not a fraction between 0 and 0.5"),
        "{err}"
    );
    // Not 300 digits (hostile sweep 6), with or without --plan auto.
    for (flag, value) in [("--plan", "auto"), ("--device", "ferrite:0")] {
        let err = refused(&[
            "train",
            "--model",
            "mini",
            flag,
            value,
            "--profile-error",
            "1e300",
        ]);
        assert!(
            err.contains("--profile-error 1e300 ") && err.len() < 300,
            "{err}"
        );
    }
    let err = refused(&["conform", "--case-timeout", "-1", "--plugin", "x"]);
    assert!(
        err.contains("--case-timeout -1 is not a number of seconds"),
        "{err}"
    );
    let err = refused(&["train", "--lr", "fast"]);
    assert!(
        err.contains("--lr must be a number; \"fast\" is not one"),
        "{err}"
    );
}

/// A path in a message is escaped and cut after 200 characters, saying
/// its length, like every other value from the user (it was cut only
/// where the whole line passed 1,000 characters), and a byte that is not
/// UTF-8 is written `\xNN` (it was `�`).
#[test]
fn paths_in_messages_are_escaped_and_cut_after_200_characters() {
    let long = format!("/nonexistent/{}x.json", "d/".repeat(1500));
    let cut = format!("{}… ({} bytes)", &long[..200], long.len());
    let dir = common::scratch_dir("hostile", "paths");
    let devices = dir.join("devices.json");
    let (code, json, err) = common::polychip(&["devices", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    std::fs::write(&devices, json).unwrap();
    let devices = devices.to_str().unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["plan", "--cluster", &long, "--model", "tiny"],
        vec!["plan", "--cluster", devices, "--model", &long],
        vec![
            "plan",
            "--cluster",
            devices,
            "--model",
            "mini",
            "--evaluate",
            &long,
        ],
        vec![
            "plan",
            "--cluster",
            devices,
            "--model",
            "mini",
            "--profile",
            &long,
        ],
        vec![
            "plan",
            "--cluster",
            devices,
            "--model",
            "mini",
            "--trace",
            &long,
        ],
        vec!["train", "--model", "mini", "--plan", &long],
        vec!["train", "--model", &long],
        vec!["train", "--model", "mini", "--config", &long],
        vec![
            "train",
            "--model",
            "mini",
            "--device",
            "ferrite:0",
            "--corpus",
            &long,
        ],
        vec![
            "train",
            "--model",
            "mini",
            "--plan",
            "auto",
            "--save-plan",
            &long,
        ],
        vec!["train", "--resume", &long],
        vec!["checkpoint", "export-hf", &long, "out"],
        vec!["conform", "--waivers", &long, "--plugin", "x"],
        vec!["conform", "--plugin", &long],
        vec!["profile", "--out", &long],
    ];
    for args in cases {
        let err = refused(&args);
        assert!(
            err.contains(&cut) && err.len() < 800 && !err.contains(&long[..1000]),
            "{args:?}: {err}"
        );
    }
    // A plugin path that does not load (the host's messages).
    let out = Command::new(env!("CARGO_BIN_EXE_polychip"))
        .arg("devices")
        .env("POLYCHIP_PLUGIN_PATH", &long)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let failed = stdout
        .lines()
        .find(|l| l.starts_with("failed to load"))
        .unwrap_or_default();
    assert!(failed.contains(&cut) && failed.len() < 600, "{stdout}");
    // Escaped byte by byte.
    let odd = OsStr::from_bytes(b"/nonexistent/a\xff\x1b[31m.toml");
    let args = [
        OsStr::new("plan"),
        OsStr::new("--cluster"),
        odd,
        OsStr::new("--model"),
    ];
    let (code, err) = run(&[&args[..], &[OsStr::new("tiny")]].concat(), &[], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(r"/nonexistent/a\xff\u{1b}[31m.toml"),
        "{err:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A plan file's device name of 100,000 characters is refused by its
/// length, quoted cut (it was echoed whole into the refusal that came
/// first, cut only at the line's 1,000th character).
#[test]
fn a_plan_with_a_device_name_of_any_length_is_refused_by_its_length() {
    let dir = common::scratch_dir("hostile", "device_name");
    let name = format!("{}\u{1b}[2J", "x".repeat(100_000));
    for (file, plan) in [
        (
            "stage.json",
            serde_json::json!({"group": [{"copies": 1, "micro_batch_size": 2,
                "micro_batches": 2, "stages": [{"device": name, "layers": [0, 2]}]}]}),
        ),
        (
            "order.json",
            serde_json::json!({"group": [{"copies": 1, "micro_batch_size": 2,
                "micro_batches": 2, "stages": [{"device": "ferrite:0", "layers": [0, 2]}]}],
                "core_order": [name]}),
        ),
    ] {
        let path = dir.join(file);
        std::fs::write(&path, plan.to_string()).unwrap();
        let err = refused(&["train", "--model", "mini", "--plan", path.to_str().unwrap()]);
        assert!(
            err.contains("longer than the 128 characters a device name may have")
                && err.contains("(100004 bytes)")
                && err.len() < 800
                && !err.contains('\u{1b}'),
            "{file}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A Hugging Face model's config of the `mini` preset's shape.
const CONFIG: &str = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 64,
  "max_position_embeddings": 16, "num_attention_heads": 4, "num_hidden_layers": 2,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
  "tie_word_embeddings": false, "vocab_size": 256}"#;

/// A tensor name of 100,000 characters in a safetensors header or a shard
/// index is refused by its length, quoted cut (it was echoed whole).
#[test]
fn a_tensor_name_of_any_length_is_refused_by_its_length() {
    let dir = common::scratch_dir("hostile", "tensor_name");
    let name = format!("{}\u{1b}[2J", "w".repeat(100_000));
    let header = serde_json::json!({&name: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})
        .to_string();
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&[0; 4]);
    let single = dir.join("single");
    std::fs::create_dir(&single).unwrap();
    std::fs::write(single.join("config.json"), CONFIG).unwrap();
    std::fs::write(single.join("model.safetensors"), &file).unwrap();
    let sharded = dir.join("sharded");
    std::fs::create_dir(&sharded).unwrap();
    std::fs::write(sharded.join("config.json"), CONFIG).unwrap();
    let index = serde_json::json!({"weight_map": {&name: "model-1.safetensors"}});
    std::fs::write(
        sharded.join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    for (model, needle) in [
        (&single, "more than the 256 a tensor name or field may have"),
        (&sharded, "more than the 256 a tensor name may have"),
    ] {
        let out = dir.join("out");
        let err = refused(&[
            "checkpoint",
            "import-hf",
            model.to_str().unwrap(),
            out.to_str().unwrap(),
        ]);
        assert!(
            err.contains(needle)
                && err.contains("(100004 bytes)")
                && err.len() < 800
                && !err.contains('\u{1b}'),
            "{err}"
        );
        assert!(!out.exists());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Variables: a long `POLYCHIP_LOG` is quoted cut (it was echoed whole,
/// 6,000 characters, past the line cut); `POLYCHIP_BENCH_RANKS` that is
/// negative is not called "not a number", a long one is cut, and one that
/// is not UTF-8 is refused (it was taken as unset: 2 ranks); so is a
/// `POLYCHIP_TRANSPORT` that is not UTF-8 (it was taken as `auto`).
#[test]
fn long_or_undecodable_variables_are_refused_or_quoted_cut() {
    let long = "x=".repeat(3000);
    let (_, err) = run(
        &os(&[
            "plan",
            "--cluster",
            "/nonexistent/c.toml",
            "--model",
            "tiny",
        ]),
        &[("POLYCHIP_LOG", OsStr::new(&long))],
        &[],
    );
    let line = err
        .lines()
        .find(|l| l.contains("POLYCHIP_LOG"))
        .unwrap_or_default();
    assert!(
        line.contains("is not a log filter") && line.contains("… (6000 bytes)") && line.len() < 600,
        "{err}"
    );
    let bench = os(&["bench", "comm", "--ops", "barrier", "--iters", "1"]);
    let long_n = "9".repeat(3000);
    for (value, needle) in [
        (
            OsStr::new("-1"),
            "POLYCHIP_BENCH_RANKS=\"-1\" is not a whole number of ranks",
        ),
        (
            OsStr::new(&long_n),
            "… (3000 bytes) is not a whole number of ranks",
        ),
        (
            OsStr::from_bytes(b"4\xff"),
            "POLYCHIP_BENCH_RANKS is not UTF-8 text",
        ),
    ] {
        let (code, err) = run(&bench, &[("POLYCHIP_BENCH_RANKS", value)], &[]);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains(needle) && err.len() < 600, "{err}");
    }
    let (code, err) = run(
        &bench,
        &[("POLYCHIP_TRANSPORT", OsStr::from_bytes(b"shm\xff"))],
        &[],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("POLYCHIP_TRANSPORT is not UTF-8 text"),
        "{err}"
    );
}

/// A `--model` that can only be a file (a `/` in it, or `.toml`) and is
/// missing is said to be missing, as `polychip plan` says it (it was
/// "unknown model preset"); flags' lists are quoted cut.
#[test]
fn a_missing_model_file_is_said_missing_and_long_lists_are_cut() {
    for model in ["/nonexistent/m.toml", "typo.toml"] {
        let err = refused(&["train", "--model", model]);
        assert!(
            err.contains(model) && err.contains("No such file") && !err.contains("preset"),
            "{err}"
        );
    }
    let long = format!("{}\u{1b}[2J", "7".repeat(100_000));
    for args in [
        vec!["train", "--model", "mini", "--cores", &long],
        vec!["train", "--model", "mini", "--stages", &long],
        vec!["profile", "--out", "o.json", "--micro-batch-sizes", &long],
    ] {
        let err = refused(&args);
        assert!(
            err.contains("… (100004 bytes)") && err.len() < 1200 && !err.contains('\u{1b}'),
            "{args:?}: {err}"
        );
    }
}

/// An output directory whose temporary sibling cannot be made is named in
/// the refusal (it named only the temporary directory, a path the user
/// never gave), and nothing is left; one that is not empty is named as an
/// output, not as a checkpoint.
#[test]
fn an_output_directory_that_cannot_be_made_is_named() {
    let dir = common::scratch_dir("hostile", "out_dir");
    let hf = dir.join("hf");
    let made = common::polychip(&[
        "train",
        "--model",
        "mini",
        "--device",
        "ferrite:0",
        "--steps",
        "0",
        "--export-hf",
        hf.to_str().unwrap(),
    ]);
    assert_eq!(made.0, Some(0), "{}", made.2);
    let err = refused(&[
        "checkpoint",
        "import-hf",
        hf.to_str().unwrap(),
        "/proc/polychip-out",
    ]);
    // /proc takes no new directory, even for root.
    assert!(
        err.contains(
            "/proc/polychip-out: cannot be written: its temporary directory \
             /proc/.polychip-out.tmp-"
        ),
        "{err}"
    );
    assert!(!std::path::Path::new("/proc/polychip-out").exists());
    // An output directory that is not empty is said as the output it is
    // (it was "checkpoint DIR", also of a Hugging Face directory).
    let full = hf.to_str().unwrap();
    let err = refused(&[
        "train",
        "--model",
        "mini",
        "--device",
        "ferrite:0",
        "--export-hf",
        full,
    ]);
    assert!(
        err.contains(&format!("--export-hf {full}: exists and is not empty"))
            && !err.contains("checkpoint"),
        "{err}"
    );
    let err = refused(&["checkpoint", "import-hf", full, full]);
    assert!(
        err.contains(&format!(": {full}: exists and is not empty"))
            && !err.contains(&format!("checkpoint {full}")),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A `POLYCHIP_PLUGIN_PATH` that is not UTF-8 is reported as a failure to
/// load, naming the variable (it was taken as unset: its directories were
/// not searched, without a word); the bundled plugins still load.
#[test]
fn a_plugin_path_that_is_not_utf8_is_reported() {
    let out = Command::new(env!("CARGO_BIN_EXE_polychip"))
        .arg("devices")
        .env(
            "POLYCHIP_PLUGIN_PATH",
            OsStr::from_bytes(b"/nonexistent/plug\xff"),
        )
        .output()
        .unwrap();
    let (stdout, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}{err}");
    assert!(
        stdout.contains(
            "failed to load: /nonexistent/plug\\xff: POLYCHIP_PLUGIN_PATH is not UTF-8 text, \
             so none of its directories was searched"
        ) && stdout.contains("Ferrite F1"),
        "{stdout}{err}"
    );
}

/// `plan --score`, round of 2026-12-06 (helper hostile5): `--schedule`
/// overrides a run's plan's own schedule as it does with `--evaluate` (a
/// run whose plan named `gpipe` was scored under gpipe, the flag silently
/// dropped); runs whose plans were made for another model are named; a
/// step of 5e-324 s (which printed `inf` and `NaN%`) and a plan file that
/// is the runs file itself are refused naming the run.
#[test]
fn score_runs_take_the_schedule_flag_and_absurd_runs_are_refused() {
    let data =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../planner/tests/data/outside");
    let sailor: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("sailor-runs.json")).unwrap())
            .unwrap();
    let plan = sailor["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["cluster"] == "clariden-gh200" && r["model"] == "gpt-neo-2.7b")
        .unwrap()["plan"]
        .clone();
    let mut gpipe = plan.clone();
    gpipe["schedule"] = "gpipe".into();
    let dir = std::env::temp_dir().join(format!("polychip-hostile-score-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("runs.json");
    let (cluster, model) = (
        data.join("clariden-gh200.toml"),
        data.join("gpt-neo-2.7b.toml"),
    );
    let score = |runs: serde_json::Value, extra: &[&str]| {
        std::fs::write(&file, serde_json::json!({ "runs": runs }).to_string()).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_polychip"))
            .args(["plan", "--json", "--score"])
            .arg(&file)
            .arg("--cluster")
            .arg(&cluster)
            .arg("--model")
            .arg(&model)
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let doc = serde_json::from_slice::<serde_json::Value>(&out.stdout).ok();
        (out.status.code(), doc, err)
    };
    let peak = |doc: &serde_json::Value| {
        doc["runs"][0]["predicted_peak_memory_bytes"]
            .as_f64()
            .unwrap()
    };
    let run = |plan: &serde_json::Value| serde_json::json!([{ "name": "a", "plan": plan, "step_seconds": 1.0 }]);
    let (code, plain, err) = score(run(&plan), &["--schedule", "1f1b"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, own, err) = score(run(&gpipe), &[]);
    assert_eq!(code, Some(0), "{err}");
    let (code, flagged, err) = score(run(&gpipe), &["--schedule", "1f1b"]);
    assert_eq!(code, Some(0), "{err}");
    let (plain, own, flagged) = (
        peak(&plain.unwrap()),
        peak(&own.unwrap()),
        peak(&flagged.unwrap()),
    );
    assert!(
        own > plain,
        "gpipe holds more activations: {own} against {plain}"
    );
    assert_eq!(
        flagged, plain,
        "--schedule 1f1b was not taken over the plan's gpipe"
    );
    // A run whose plan (a `polychip plan --json` report) was made for
    // another model is named (it was scored without a word).
    let out = Command::new(env!("CARGO_BIN_EXE_polychip"))
        .args(["plan", "--json", "--global-batch", "16", "--cluster"])
        .arg(&cluster)
        .arg("--model")
        .arg(&model)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (code, _, err) = score(run(&report), &[]);
    assert!(code == Some(0) && !err.contains("another model"), "{err}");
    // ... and one made under other settings than those it is scored under.
    let (code, _, err) = score(run(&report), &["--dtype", "f32"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("the plans of 1 run (a) were made under other training settings"),
        "{err}"
    );
    report["plan"]["model"] = "gpt-neo-1.3b".into();
    let (code, _, err) = score(run(&report), &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("the plans of 1 run (a) were made for another model"),
        "{err}"
    );
    // Absurd figures and a plan file that is the runs file.
    let (code, _, err) = score(
        serde_json::json!([{ "name": "tiny", "plan": plan, "step_seconds": 5e-324 }]),
        &[],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("run \"tiny\": step_seconds is 5e-324"),
        "{err}"
    );
    let (code, _, err) = score(
        serde_json::json!([{ "name": "me", "plan_file": "runs.json", "step_seconds": 1 }]),
        &[],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("run \"me\": its plan_file \"runs.json\" is the runs file itself"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// The launcher's and the comm layer's variables that are not UTF-8 are
/// refused naming them: they were taken as unset (`RANK=$'\xff'
/// WORLD_SIZE=2` made a launched rank of `bench comm` run a 2-rank job of
/// its own with exit 0; a timeout that was not UTF-8 was the default);
/// `POLYCHIP_COMM_ADDR` is quoted cut; `POLYCHIP_NO_BUNDLED_PLUGINS=true`
/// keeps the bundled plugins out (only `1` did).
#[test]
fn comm_variables_that_are_not_utf8_are_refused_and_no_bundled_takes_any_value() {
    let bench = os(&[
        "bench", "comm", "--ops", "barrier", "--sizes", "4", "--iters", "1",
    ]);
    let bad = OsStr::from_bytes(b"\xff");
    let (code, err) = run(
        &bench,
        &[
            ("RANK", bad),
            ("WORLD_SIZE", OsStr::new("2")),
            ("MASTER_ADDR", OsStr::new("127.0.0.1")),
            ("MASTER_PORT", OsStr::new("29877")),
        ],
        &[],
    );
    assert_ne!(code, Some(0), "{err}");
    assert!(
        err.contains("RANK is \"\u{fffd}\", which is not UTF-8 text"),
        "{err}"
    );
    let two = os(&[
        "bench", "comm", "-n", "2", "--ops", "barrier", "--sizes", "4", "--iters", "1",
    ]);
    for var in ["POLYCHIP_COMM_TIMEOUT_SECS", "POLYCHIP_JOB_ID"] {
        let (code, err) = run(&two, &[(var, bad)], &[]);
        assert_ne!(code, Some(0), "{var}: {err}");
        assert!(
            err.contains(&format!("{var} is \"\u{fffd}\", which is not UTF-8 text")),
            "{err}"
        );
    }
    let long = "x".repeat(3000);
    let (code, err) = run(
        &two,
        &[
            ("POLYCHIP_COMM_ADDR", OsStr::new(&long)),
            ("POLYCHIP_TRANSPORT", OsStr::new("tcp")),
        ],
        &[],
    );
    assert_ne!(code, Some(0), "{err}");
    assert!(
        err.contains("… (3000 bytes) is not an IP address") && err.len() < 2000,
        "{err}"
    );
    for value in ["true", "yes"] {
        let out = Command::new(env!("CARGO_BIN_EXE_polychip"))
            .arg("devices")
            .env("POLYCHIP_NO_BUNDLED_PLUGINS", value)
            .env_remove("POLYCHIP_PLUGIN_PATH")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!stdout.contains("Ferrite F1"), "{value}: {stdout}");
    }
}

/// `polychip conform` started (with `sh -c 'trap "" INT; exec ...'` when
/// `ignore_sigint`, as a background job of a non-interactive shell starts
/// it), with the worker it runs the suite in: (conform, the worker's pid).
/// None when Ferrite's plugin is not built.
// The child is returned to the caller, which waits for it (`stop_conform`).
#[allow(clippy::zombie_processes)]
fn conform_with_worker(ignore_sigint: bool) -> Option<(std::process::Child, String)> {
    let plugin = std::path::Path::new(env!("CARGO_BIN_EXE_polychip"))
        .with_file_name("libpolychip_vendor_ferrite.so");
    if !plugin.exists() {
        eprintln!("skipped: {} is not built", plugin.display());
        return None;
    }
    let trap = if ignore_sigint { "trap '' INT; " } else { "" };
    let mut conform = Command::new("sh")
        .arg("-c")
        .arg(format!(r#"{trap}exec "$0" conform --plugin "$1""#))
        .arg(env!("CARGO_BIN_EXE_polychip"))
        .arg(&plugin)
        .env("POLYCHIP_NO_BUNDLED_PLUGINS", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = conform.id();
    let children = format!("/proc/{pid}/task/{pid}/children");
    let started = std::time::Instant::now();
    loop {
        let found = std::fs::read_to_string(&children)
            .unwrap_or_default()
            .split_whitespace()
            .find(|c| {
                std::fs::read(format!("/proc/{c}/cmdline"))
                    .is_ok_and(|cmd| cmd.windows(8).any(|w| w == b"--worker"))
            })
            .map(str::to_string);
        if let Some(w) = found {
            return Some((conform, w));
        }
        if started.elapsed().as_secs() >= 120 {
            let _ = conform.kill();
            let _ = conform.wait();
            panic!("conform started no worker");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Sends `signal` to conform and waits (at most 10 s) for it and then its
/// worker to end: conform's exit code and stderr. Panics, killing what is
/// left, when either runs on.
fn stop_conform(
    mut conform: std::process::Child,
    worker: &str,
    signal: &str,
) -> (Option<i32>, String) {
    let pid = conform.id().to_string();
    assert!(
        Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap()
            .success()
    );
    let since = std::time::Instant::now();
    let running = |p: &str| {
        std::path::Path::new(&format!("/proc/{p}")).exists()
            && !std::fs::read_to_string(format!("/proc/{p}/stat"))
                .unwrap_or_default()
                .contains(") Z ")
    };
    let status = loop {
        if let Some(status) = conform.try_wait().unwrap() {
            break status;
        }
        if since.elapsed().as_secs() >= 10 {
            let _ = Command::new("kill").args(["-KILL", worker, &pid]).status();
            panic!("conform runs on 10 s after {signal}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    while running(worker) {
        if since.elapsed().as_secs() >= 10 {
            // Not left running past the test.
            let _ = Command::new("kill").args(["-KILL", worker]).status();
            panic!("the worker {worker} runs on after conform was stopped by {signal}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let mut err = String::new();
    std::io::Read::read_to_string(&mut conform.stderr.take().unwrap(), &mut err).unwrap();
    (status.code(), err)
}

/// `polychip conform` killed (SIGTERM) takes its case worker with it: the
/// worker ran on as an orphan through the rest of the suite (or in a hung
/// case for ever), its results written into a closed pipe and ignored.
#[test]
fn a_killed_conform_leaves_no_worker_running() {
    let Some((conform, worker)) = conform_with_worker(false) else {
        return;
    };
    let (code, err) = stop_conform(conform, &worker, "-TERM");
    assert_eq!(code, Some(128 + 15), "{err}");
    assert!(err.contains("stopped by SIGTERM after"), "{err}");
}

/// SIGINT stops `polychip conform` and its worker and says so (exit 130),
/// also when conform was started ignoring SIGINT (a background job of a
/// non-interactive shell): it had no handler, so it died without a word
/// or, ignoring SIGINT, ran the whole suite on (sweep 6).
#[test]
fn an_interrupted_conform_stops_its_worker_and_says_so() {
    for ignored in [false, true] {
        let Some((conform, worker)) = conform_with_worker(ignored) else {
            return;
        };
        let (code, err) = stop_conform(conform, &worker, "-INT");
        assert_eq!(code, Some(130), "SIGINT ignored at start: {ignored}: {err}");
        assert!(
            err.contains("stopped by SIGINT after") && err.contains("no report was written"),
            "{err}"
        );
    }
}

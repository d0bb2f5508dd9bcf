//! `polychip checkpoint` and `polychip train --init-from / --export-hf` end
//! to end on the bundled plugins (needs `cargo build --workspace` first):
//! step-0 checkpoints and exports, export -> import giving the same bytes,
//! resuming an imported checkpoint exactly as training from the Hugging
//! Face directory, logits equal whichever form the weights take, and the
//! refusals (conflicting flags, a non-empty output, a corrupt checkpoint,
//! tokens the model cannot take), none of which leaves anything behind.

mod common;
use common::polychip;

use std::path::{Path, PathBuf};

fn ok(args: &[&str]) -> String {
    let (code, out, err) = polychip(args);
    assert_eq!(code, Some(0), "polychip {args:?}:\n{out}\n{err}");
    out
}

fn refused(args: &[&str]) -> String {
    let (code, out, err) = polychip(args);
    assert_ne!(
        code,
        Some(0),
        "polychip {args:?} should fail:\n{out}\n{err}"
    );
    err
}

fn scratch(name: &str) -> PathBuf {
    common::scratch_dir("ckpt", name)
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

const TRAIN: [&str; 12] = [
    "train",
    "--model",
    "mini",
    "--global-batch",
    "4",
    "--micro-batch-size",
    "2",
    "--eval-every",
    "0",
    "--log-every",
    "0",
    "--no-pin",
];

/// `polychip train` with the common flags, `--model` dropped when `extra`
/// names the model another way.
fn train(extra: &[&str]) -> String {
    let mut args: Vec<&str> = TRAIN.to_vec();
    if extra.contains(&"--init-from") || extra.contains(&"--resume") {
        args.drain(1..3);
    }
    args.extend_from_slice(extra);
    ok(&args)
}

/// The losses of a run, from its JSON summary.
fn losses(dir: &Path, tag: &str, extra: &[&str]) -> Vec<f64> {
    let json = dir.join(format!("{tag}.json"));
    let j = s(&json);
    let mut args = extra.to_vec();
    args.extend_from_slice(&["--log-json", &j]);
    train(&args);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    v["summary"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["loss"].as_f64().unwrap())
        .collect()
}

const TOKENS: &str = "84,104,101,32,113,117,105,99,107,0,255";

fn logits(path: &Path) -> Vec<Vec<f32>> {
    let out = ok(&[
        "checkpoint",
        "logits",
        &s(path),
        "--tokens",
        TOKENS,
        "--device",
        "ferrite:0",
    ]);
    serde_json::from_str(&out).unwrap()
}

#[test]
fn steps_0_writes_a_step_0_checkpoint_and_export_with_the_same_logits() {
    let dir = scratch("steps0");
    let (c, e) = (dir.join("ckpt"), dir.join("hf"));
    let out = train(&[
        "--steps",
        "0",
        "--device",
        "ferrite:0",
        "--checkpoint-dir",
        &s(&c),
        "--export-hf",
        &s(&e),
    ]);
    assert!(out.contains("exported the weights after step 0"), "{out}");
    assert_eq!(
        std::fs::read_to_string(c.join("latest")).unwrap(),
        "step-00000000"
    );
    assert_eq!(entries(&e), ["config.json", "model.safetensors"]);
    let from_checkpoint = logits(&c);
    assert_eq!(from_checkpoint.len(), TOKENS.split(',').count());
    assert!(from_checkpoint.iter().all(|row| row.len() == 256));
    assert_eq!(
        from_checkpoint,
        logits(&e),
        "the same weights give the same logits"
    );
    assert_eq!(entries(&dir), ["ckpt", "hf"], "nothing else is left");
}

#[test]
fn export_then_import_is_bit_identical_and_resumes_like_init_from() {
    let dir = scratch("round-trip");
    let (c, e) = (dir.join("ckpt"), dir.join("hf"));
    // A pipeline over both vendors, so the checkpoint has two stage files.
    train(&[
        "--steps",
        "3",
        "--stages",
        "ferrite:0=0..1,cobalt:0=1..2",
        "--checkpoint-dir",
        &s(&c),
    ]);
    let out = ok(&["checkpoint", "export-hf", &s(&c), &s(&e)]);
    assert!(out.contains("as a Hugging Face LLaMA model"), "{out}");
    let imported = dir.join("imported");
    let out = ok(&["checkpoint", "import-hf", &s(&e), &s(&imported)]);
    assert!(
        out.contains("step-0 checkpoint") && out.contains("--resume"),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(imported.join("latest")).unwrap(),
        "step-00000000"
    );
    let again = dir.join("hf-again");
    ok(&["checkpoint", "export-hf", &s(&imported), &s(&again)]);
    assert_eq!(
        std::fs::read(e.join("model.safetensors")).unwrap(),
        std::fs::read(again.join("model.safetensors")).unwrap(),
        "export -> import -> export gives the same weights, bit for bit"
    );
    // The trained pipeline, its export and the imported checkpoint: one model.
    let l = logits(&c);
    assert_eq!(l, logits(&e));
    assert_eq!(l, logits(&imported));

    // Resuming the imported checkpoint is training from the directory itself.
    let a = losses(
        &dir,
        "init",
        &[
            "--steps",
            "4",
            "--device",
            "ferrite:0",
            "--init-from",
            &s(&e),
        ],
    );
    let b = losses(
        &dir,
        "resume",
        &[
            "--steps",
            "4",
            "--device",
            "ferrite:0",
            "--resume",
            &s(&imported),
        ],
    );
    assert_eq!(a.len(), 4);
    assert_eq!(a, b, "bit-exact");
    // And every stage split starts from the same imported weights.
    let p = losses(
        &dir,
        "init-pipeline",
        &[
            "--steps",
            "4",
            "--stages",
            "cobalt:0=0..1,ferrite:0=1..2",
            "--init-from",
            &s(&e),
        ],
    );
    let worst = a
        .iter()
        .zip(&p)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    assert!(worst < 1e-4, "pipeline vs one device: {a:?} {p:?}");
}

#[test]
fn train_exports_through_a_staging_checkpoint_on_every_split() {
    let dir = scratch("train-export");
    let (one, two) = (dir.join("one"), dir.join("two"));
    train(&[
        "--steps",
        "2",
        "--device",
        "ferrite:0",
        "--export-hf",
        &s(&one),
    ]);
    train(&[
        "--steps",
        "2",
        "--stages",
        "ferrite:0=0..1,cobalt:0=1..2",
        "--export-hf",
        &s(&two),
    ]);
    assert_eq!(
        entries(&dir),
        ["one", "two"],
        "the staging checkpoints are gone"
    );
    let (a, b) = (logits(&one), logits(&two));
    let worst = a
        .iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(worst < 1e-4, "{worst}");
}

#[test]
fn conflicts_and_bad_outputs_are_refused_and_leave_nothing() {
    let dir = scratch("refusals");
    let (c, e) = (dir.join("ckpt"), dir.join("hf"));
    train(&[
        "--steps",
        "1",
        "--device",
        "ferrite:0",
        "--checkpoint-dir",
        &s(&c),
    ]);
    ok(&["checkpoint", "export-hf", &s(&c), &s(&e)]);

    let err = refused(&["train", "--init-from", &s(&e), "--resume", &s(&c)]);
    assert!(
        err.contains("--init-from") && err.contains("cannot be used with"),
        "{err}"
    );
    let err = refused(&["train", "--init-from", &s(&e), "--model", "mini"]);
    assert!(err.contains("cannot be used with"), "{err}");

    // A non-empty output directory: refused before training, untouched.
    let busy = dir.join("busy");
    std::fs::create_dir(&busy).unwrap();
    std::fs::write(busy.join("notes.txt"), "mine").unwrap();
    let mut args: Vec<&str> = TRAIN.to_vec();
    let b = s(&busy);
    args.extend_from_slice(&["--steps", "1", "--device", "ferrite:0", "--export-hf", &b]);
    let (code, out, err) = polychip(&args);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("busy") && err.contains("not empty"), "{err}");
    assert!(!out.contains("training"), "refused before training: {out}");
    let err = refused(&["checkpoint", "export-hf", &s(&c), &b]);
    assert!(err.contains("not empty"), "{err}");
    let err = refused(&["checkpoint", "import-hf", &s(&e), &b]);
    assert!(err.contains("not empty"), "{err}");
    assert_eq!(entries(&busy), ["notes.txt"]);

    // A corrupt checkpoint: named, and no output or temporary directory left.
    let file = c.join("step-00000001/stage-00-of-01.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 9;
    bytes[last] ^= 0x40;
    std::fs::write(&file, bytes).unwrap();
    let err = refused(&["checkpoint", "export-hf", &s(&c), &s(&dir.join("out"))]);
    assert!(
        err.contains("stage-00-of-01.safetensors") && err.contains("checksum"),
        "{err}"
    );
    let err = refused(&["checkpoint", "logits", &s(&c), "--tokens", "1,2"]);
    assert!(err.contains("checksum"), "{err}");
    // Neither kind of directory.
    let err = refused(&["checkpoint", "import-hf", &s(&c), &s(&dir.join("out"))]);
    assert!(err.contains("has no config.json"), "{err}");
    assert_eq!(entries(&dir), ["busy", "ckpt", "hf"]);

    // Tokens the model cannot take.
    let err = refused(&["checkpoint", "logits", &s(&e), "--tokens", "1,256"]);
    assert!(
        err.contains("token 256 is outside the model's vocabulary 0..256"),
        "{err}"
    );
    let err = refused(&["checkpoint", "logits", &s(&e), "--tokens", "1,x"]);
    assert!(err.contains("\"x\" is not a token id"), "{err}");
    let many = vec!["7"; 17].join(",");
    let err = refused(&["checkpoint", "logits", &s(&e), "--tokens", &many]);
    assert!(
        err.contains("`max_position_embeddings` = 16") && err.contains("17"),
        "{err}"
    );
    let err = refused(&[
        "checkpoint",
        "logits",
        &s(&e),
        "--tokens",
        "1",
        "--device",
        "nope:3",
    ]);
    assert!(err.contains("nope:3 is not present"), "{err}");
}

#[test]
fn checkpoint_help_names_its_commands() {
    let out = ok(&["checkpoint", "--help"]);
    for command in ["export-hf", "import-hf", "logits"] {
        assert!(
            out.contains(&format!("  {command} ")),
            "{command} missing from:\n{out}"
        );
    }
    assert!(out.contains("LlamaForCausalLM.from_pretrained"), "{out}");
    let out = ok(&["train", "--help"]);
    for flag in ["--init-from", "--export-hf", "--seq-len"] {
        assert!(out.contains(flag), "{flag} missing from:\n{out}");
    }
}

#[test]
fn a_directory_with_another_runs_checkpoints_is_refused_unless_resumed() {
    let dir = scratch("shared");
    let ck = dir.join("ck");
    let ck_arg = s(&ck);
    let run = |extra: &[&str]| {
        let mut args = TRAIN.to_vec();
        if extra.contains(&"--resume") {
            args.drain(1..3);
        }
        args.extend_from_slice(&["--device", "ferrite:0", "--checkpoint-dir", &ck_arg]);
        args.extend_from_slice(extra);
        polychip(&args)
    };
    let (code, out, err) = run(&["--steps", "2", "--save-every", "1"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let before = entries(&ck);
    assert!(before.contains(&"latest".to_string()), "{before:?}");
    let latest = std::fs::read_to_string(ck.join("latest")).unwrap();
    // A new run into it: refused before training, nothing changed.
    let (code, _, err) = run(&["--steps", "1", "--seed", "5"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("already holds another run's checkpoints (latest: step-00000002)")
            && err.contains("--resume"),
        "{err}"
    );
    assert_eq!(entries(&ck), before);
    assert_eq!(std::fs::read_to_string(ck.join("latest")).unwrap(), latest);
    // Going on with it is allowed, from its root or from one of its steps.
    let (code, out, err) = run(&["--steps", "3", "--resume", &s(&ck)]);
    assert_eq!(code, Some(0), "{out}{err}");
    let step = ck.join("step-00000001");
    let (code, out, err) = run(&["--steps", "2", "--resume", &s(&step)]);
    assert_eq!(code, Some(0), "{out}{err}");
    // While a run holds it, another is refused (the lock is the
    // committing rank's; here util-linux's `flock` holds it, where it is
    // installed).
    // It says "held" once it holds the lock; `-o` keeps the lock out of
    // its child, so that killing `flock` frees it.
    let holder = std::process::Command::new("flock")
        .arg("-o")
        .arg(ck.join(".lock"))
        .args(["sh", "-c", "echo held; exec sleep 30"])
        .stdout(std::process::Stdio::piped())
        .spawn();
    if let Ok(mut holder) = holder {
        let mut said = String::new();
        let out = holder.stdout.take().unwrap();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut said).unwrap();
        assert_eq!(said.trim(), "held");
        let (code, _, err) = run(&["--steps", "4", "--resume", &s(&ck)]);
        let _ = holder.kill();
        let _ = holder.wait();
        assert_ne!(code, Some(0), "{err}");
        assert!(
            err.contains("another run is saving its checkpoints here now"),
            "{err}"
        );
    }
    // A lock file that is not a file is refused before anything runs,
    // naming it (it was "Is a directory (os error 21)" after the plan).
    std::fs::remove_file(ck.join(".lock")).unwrap();
    std::fs::create_dir(ck.join(".lock")).unwrap();
    let (code, out, err) = run(&["--steps", "4", "--resume", &s(&ck)]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(
        err.contains("its lock file .lock is a directory, not a file") && !out.contains("step 3"),
        "{out}{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

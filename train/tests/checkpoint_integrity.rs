//! Checkpoints load only what was saved: every file of a real saved
//! checkpoint is edited byte by byte, replaced by a link, a FIFO, a device
//! or a directory, and each must be refused with an error naming the file
//! and the fault, before anything is loaded. Needs no device.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use polychip_host::DType;
use polychip_train::checkpoint::{self, Manifest};
use polychip_train::config::{ModelConfig, TrainConfig};
use polychip_train::safetensors::{Header, SafeTensors, StoredTensor, crc64};
use serde_json::Value;

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("checkpoint-integrity")
        .join(format!("{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn model() -> ModelConfig {
    ModelConfig::preset("tiny").unwrap()
}

fn tensors(seed: f32) -> SafeTensors {
    let mut st = SafeTensors::new();
    for (i, name) in [
        "layers.0.ffn_norm.weight",
        "layers.1.ffn_norm.weight",
        "layers.2.ffn_norm.weight",
    ]
    .iter()
    .enumerate()
    {
        let data = (0..8)
            .flat_map(|k| (seed + (i * 8 + k) as f32).to_le_bytes())
            .collect();
        st.insert(
            *name,
            StoredTensor {
                dtype: DType::F32,
                shape: vec![2, 4],
                data,
            },
        )
        .unwrap();
    }
    st
}

/// Saves step `step` under `root` as the trainer does (one stage file).
fn save(root: &Path, step: u64, train: &TrainConfig) -> PathBuf {
    checkpoint::write_tensors(root, step, &tensors(step as f32), 0, 1).unwrap();
    let manifest = Manifest {
        format: checkpoint::FORMAT.into(),
        step,
        model: model(),
        train: train.clone(),
        plan: "test".into(),
        files: vec![checkpoint::stage_file(0, 1)],
        sums: Vec::new(),
    };
    checkpoint::commit(root, &manifest).unwrap()
}

/// A root with a saved step 6; returns it and the stage file.
fn saved(name: &str) -> (PathBuf, PathBuf) {
    let root = scratch(name).join("ck");
    let dir = save(&root, 6, &TrainConfig::default());
    let file = dir.join(checkpoint::stage_file(0, 1));
    // It loads as saved.
    let loaded = checkpoint::open(&root).unwrap();
    assert_eq!(loaded.manifest.step, 6);
    assert_eq!(loaded.tensors[0].1, tensors(6.0));
    (root, file)
}

/// The error of opening `root`, which must name `names` and say `what`.
fn refused(root: &Path, names: &Path, what: &[&str]) -> String {
    let started = Instant::now();
    let msg = match checkpoint::open(root) {
        Ok(l) => panic!("loaded {} although it should be refused", l.dir.display()),
        Err(e) => e.to_string(),
    };
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "refused promptly"
    );
    assert!(
        msg.contains(&names.display().to_string()),
        "the error names {}: {msg}",
        names.display()
    );
    for w in what {
        assert!(msg.contains(w), "the error says {w:?}: {msg}");
    }
    msg
}

/// Rewrites the header of the safetensors file `file` through `edit`
/// (padding and the length kept valid).
fn edit_header(file: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(header.as_object_mut().unwrap());
    let mut json = header.to_string().into_bytes();
    json.resize(json.len().div_ceil(8) * 8, b' ');
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(file, out).unwrap();
}

/// Replaces `from` by `to` (same length) once in `file`'s bytes.
fn replace_bytes(file: &Path, from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let mut bytes = std::fs::read(file).unwrap();
    let i = bytes
        .windows(from.len())
        .position(|w| w == from.as_bytes())
        .unwrap_or_else(|| panic!("{from:?} is not in {}", file.display()));
    bytes[i..i + to.len()].copy_from_slice(to.as_bytes());
    std::fs::write(file, bytes).unwrap();
}

#[test]
fn swapped_offsets_of_same_shape_tensors_are_refused() {
    let (root, file) = saved("swap");
    edit_header(&file, |h| {
        let a = h["layers.0.ffn_norm.weight"]["data_offsets"].clone();
        let b = h["layers.1.ffn_norm.weight"]["data_offsets"].clone();
        h.get_mut("layers.0.ffn_norm.weight").unwrap()["data_offsets"] = b;
        h.get_mut("layers.1.ffn_norm.weight").unwrap()["data_offsets"] = a;
    });
    // A valid safetensors file still (another tool would read it)...
    SafeTensors::from_bytes(&file, &std::fs::read(&file).unwrap()).unwrap_err();
    // ...but not the one saved.
    refused(&root, &file, &["corrupt", "checksum"]);
}

#[test]
fn a_changed_shape_or_dtype_in_the_header_is_refused() {
    let (root, file) = saved("shape");
    edit_header(&file, |h| {
        h.get_mut("layers.2.ffn_norm.weight").unwrap()["shape"] = serde_json::json!([4, 2]);
    });
    refused(&root, &file, &["checksum"]);
}

#[test]
fn duplicate_tensor_names_are_refused() {
    let (root, file) = saved("dup");
    replace_bytes(
        &file,
        "\"layers.1.ffn_norm.weight\":",
        "\"layers.0.ffn_norm.weight\":",
    );
    refused(&root, &file, &["checksum"]);
    // Without a checksum to lean on (a file from another writer), the
    // structure alone refuses it, naming the tensor.
    let bytes = std::fs::read(&file).unwrap();
    let msg = SafeTensors::from_bytes(&file, &bytes)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("`layers.0.ffn_norm.weight` twice"), "{msg}");
    let msg = Header::read(&file).unwrap_err().to_string();
    assert!(msg.contains("`layers.0.ffn_norm.weight` twice"), "{msg}");
}

#[test]
fn overlapping_and_out_of_range_offsets_are_refused() {
    let (root, file) = saved("overlap");
    let good = std::fs::read(&file).unwrap();
    edit_header(&file, |h| {
        h.get_mut("layers.1.ffn_norm.weight").unwrap()["data_offsets"] = serde_json::json!([0, 32]);
    });
    refused(&root, &file, &[]);
    std::fs::write(&file, &good).unwrap();
    edit_header(&file, |h| {
        h.get_mut("layers.2.ffn_norm.weight").unwrap()["data_offsets"] =
            serde_json::json!([64, 1u64 << 40]);
    });
    refused(&root, &file, &[]);
}

#[test]
fn a_renamed_or_removed_checksum_is_an_error_not_a_skipped_check() {
    let (root, file) = saved("nokey");
    let good = std::fs::read(&file).unwrap();
    replace_bytes(&file, "polychip.file_crc64", "polychip.file_crc6X");
    refused(&root, &file, &["does not record its checksum"]);
    std::fs::write(&file, &good).unwrap();
    edit_header(&file, |h| {
        h.get_mut("__metadata__")
            .unwrap()
            .as_object_mut()
            .unwrap()
            .remove("polychip.file_crc64");
    });
    // (The file is shorter than the manifest says: that refuses it first.)
    refused(&root, &file, &[]);
    let msg = SafeTensors::from_sealed_bytes(&file, &std::fs::read(&file).unwrap())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("does not record its checksum"), "{msg}");
    // And the data-only checksum of earlier versions is not enough.
    std::fs::write(&file, &good).unwrap();
    let n = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let data_crc = format!("{:016x}", crc64(&good[8 + n..]));
    edit_header(&file, |h| {
        let m = h.get_mut("__metadata__").unwrap().as_object_mut().unwrap();
        m.remove("polychip.file_crc64");
        m.insert("polychip.crc64".into(), data_crc.into());
    });
    refused(&root, &file, &[]);
    let msg = SafeTensors::from_sealed_bytes(&file, &std::fs::read(&file).unwrap())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("does not record its checksum"), "{msg}");
    // (A file from another writer may carry it: it is checked.)
    SafeTensors::from_bytes(&file, &std::fs::read(&file).unwrap()).unwrap();
    // A header another tool re-serialised with other spacing still holds
    // the key: said so (it was called "not 16 hex digits").
    let n = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&good[8..8 + n]).unwrap();
    let mut json = serde_json::to_string_pretty(&header).unwrap().into_bytes();
    json.resize(json.len().div_ceil(8) * 8, b' ');
    let mut pretty = (json.len() as u64).to_le_bytes().to_vec();
    pretty.extend_from_slice(&json);
    pretty.extend_from_slice(&good[8 + n..]);
    std::fs::write(&file, pretty).unwrap();
    for msg in [
        SafeTensors::from_sealed_bytes(&file, &std::fs::read(&file).unwrap())
            .unwrap_err()
            .to_string(),
        SafeTensors::from_bytes(&file, &std::fs::read(&file).unwrap())
            .unwrap_err()
            .to_string(),
        Header::read(&file).unwrap_err().to_string(),
    ] {
        assert!(
            msg.contains("records its checksum (\"polychip.file_crc64\") in another form")
                && msg.contains("rewritten by another tool"),
            "{msg}"
        );
    }
}

#[test]
fn a_flipped_bit_of_the_data_is_refused() {
    let (root, file) = saved("data");
    let mut bytes = std::fs::read(&file).unwrap();
    let n = bytes.len();
    bytes[n - 5] ^= 0x01;
    std::fs::write(&file, bytes).unwrap();
    refused(&root, &file, &["corrupt"]);
}

#[test]
fn an_edited_manifest_is_refused() {
    let (root, file) = saved("manifest");
    let dir = file.parent().unwrap().to_path_buf();
    let m = dir.join("manifest.json");
    let good = std::fs::read(&m).unwrap();
    let len = std::fs::metadata(&file).unwrap().len();
    let (bytes, longer) = (
        format!("\"bytes\": {len}"),
        format!("\"bytes\": {}", len + 1),
    );
    let edits: [(&str, &str, &[&str]); 5] = [
        // A flipped digit of the step.
        ("\"step\": 6", "\"step\": 7", &["corrupt", "checksum"]),
        // Another learning rate.
        ("\"lr\": 0.003", "\"lr\": 0.005", &["corrupt"]),
        // The checksum removed (renamed).
        (
            "\"checksum\"",
            "\"checksun\"",
            &["does not record its checksum (it has no \"checksum\")"],
        ),
        // Or written in another form (a tool's spacing).
        (
            "\"checksum\": \"",
            " \"checksum\":\"",
            &["records its checksum (\"checksum\") in another form"],
        ),
        // A stage file's recorded length changed: refused, even with a
        // checksum recomputed by someone who knows the scheme? No: the
        // manifest's own checksum catches it first.
        (&bytes, &longer, &["corrupt"]),
    ];
    for (from, to, want) in edits {
        std::fs::write(&m, &good).unwrap();
        replace_bytes(&m, from, to);
        refused(&root, &m, want);
    }
}

#[test]
fn a_stage_file_of_another_checkpoint_is_refused() {
    let root = scratch("other").join("ck");
    save(&root, 3, &TrainConfig::default());
    let dir = save(&root, 6, &TrainConfig::default());
    let name = checkpoint::stage_file(0, 1);
    // Each is valid by itself; the manifest's checksum ties each to its own.
    std::fs::copy(checkpoint::step_dir(&root, 3).join(&name), dir.join(&name)).unwrap();
    refused(&root, &dir.join(&name), &["manifest records"]);
}

#[test]
fn a_bigger_stage_file_is_refused_before_it_is_read() {
    let (root, file) = saved("bigger");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes.extend_from_slice(&[0; 4096]);
    std::fs::write(&file, bytes).unwrap();
    refused(&root, &file, &["more than the"]);
    // A truncated one too.
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 4096 - 8]).unwrap();
    refused(&root, &file, &["truncated"]);
}

#[test]
fn latest_is_followed_only_inside_the_checkpoint_directory() {
    let (root, _) = saved("latest");
    let outside = root.parent().unwrap().join("outside");
    std::fs::create_dir_all(outside.join("step-00000006")).unwrap();
    let latest = root.join("latest");
    for bad in [
        "../outside/step-00000006",
        "/etc",
        "step-00000006/..",
        "..",
        "",
        "step-",
        "step-6x",
    ] {
        std::fs::write(&latest, bad).unwrap();
        refused(&root, &latest, &["does not name a step directory"]);
    }
    // A link planted in the directory, to a step directory elsewhere.
    std::fs::write(&latest, "step-00000009").unwrap();
    std::os::unix::fs::symlink(outside.join("step-00000006"), root.join("step-00000009")).unwrap();
    refused(&root, &root.join("step-00000009"), &["symbolic link"]);
    // `latest` itself a link.
    std::fs::remove_file(&latest).unwrap();
    std::fs::write(outside.join("name"), "step-00000006").unwrap();
    std::os::unix::fs::symlink(outside.join("name"), &latest).unwrap();
    refused(&root, &latest, &["symbolic link"]);
}

#[test]
fn a_foreign_file_is_refused_without_quoting_it() {
    let (root, file) = saved("foreign");
    let secret = "SECRET-7f3a9c token=hunter2\n".repeat(4);
    let latest = root.join("latest");
    std::fs::write(&latest, &secret).unwrap();
    let msg = refused(&root, &latest, &[]);
    assert!(!msg.contains("SECRET") && !msg.contains("hunter2"), "{msg}");
    std::fs::write(&latest, "step-00000006").unwrap();
    // A manifest that is someone else's file.
    let m = file.parent().unwrap().join("manifest.json");
    std::fs::write(&m, format!("{{\"format\": \"{secret}\"}}")).unwrap();
    let msg = refused(&root, &m, &["has no"]);
    assert!(!msg.contains("SECRET") && !msg.contains("hunter2"), "{msg}");
    // A stage file that is someone else's file: the manifest's recorded
    // length refuses it (or the missing checksum), unquoted.
    let (root, file) = saved("foreign-stage");
    let len = std::fs::metadata(&file).unwrap().len() as usize;
    let mut foreign = secret.repeat(len / secret.len() + 1).into_bytes();
    foreign.truncate(len);
    std::fs::write(&file, &foreign).unwrap();
    let msg = refused(&root, &file, &[]);
    assert!(!msg.contains("SECRET") && !msg.contains("hunter2"), "{msg}");
}

#[test]
fn links_fifos_devices_and_directories_are_refused_unread() {
    let (root, file) = saved("special");
    let dir = file.parent().unwrap().to_path_buf();
    let saved_bytes = std::fs::read(&file).unwrap();
    let outside = root.parent().unwrap().join("copy.safetensors");
    std::fs::write(&outside, &saved_bytes).unwrap();
    let mkfifo = |p: &Path| {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    };
    // The stage file: a link to an identical copy outside, a FIFO (which
    // would block a plain open), a link to /dev/zero, a directory.
    std::fs::remove_file(&file).unwrap();
    std::os::unix::fs::symlink(&outside, &file).unwrap();
    refused(&root, &file, &["symbolic link"]);
    std::fs::remove_file(&file).unwrap();
    mkfifo(&file);
    refused(&root, &file, &["is a FIFO", "not read"]);
    std::fs::remove_file(&file).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &file).unwrap();
    refused(&root, &file, &["symbolic link"]);
    std::fs::remove_file(&file).unwrap();
    std::fs::create_dir(&file).unwrap();
    refused(&root, &file, &["is a directory"]);
    std::fs::remove_dir(&file).unwrap();
    std::fs::write(&file, &saved_bytes).unwrap();
    checkpoint::open(&root).unwrap();

    // The manifest and `latest` likewise.
    let m = dir.join("manifest.json");
    let good = std::fs::read(&m).unwrap();
    std::fs::remove_file(&m).unwrap();
    mkfifo(&m);
    refused(&root, &m, &["is a FIFO"]);
    std::fs::remove_file(&m).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &m).unwrap();
    refused(&root, &m, &["symbolic link"]);
    std::fs::remove_file(&m).unwrap();
    std::fs::write(&m, &good).unwrap();
    let latest = root.join("latest");
    std::fs::remove_file(&latest).unwrap();
    mkfifo(&latest);
    refused(&root, &latest, &["is a FIFO"]);
    std::fs::remove_file(&latest).unwrap();
    std::fs::create_dir(&latest).unwrap();
    refused(&root, &latest, &["is a directory"]);

    // Where links are followed (a path the user named, a Hugging Face
    // cache), what they lead to must still be a regular file.
    for p in [Path::new("/dev/zero"), dir.as_path()] {
        let msg = Header::read(p).unwrap_err().to_string();
        assert!(msg.contains("not a regular file"), "{msg}");
        let msg = SafeTensors::load(p).unwrap_err().to_string();
        assert!(msg.contains("not a regular file"), "{msg}");
    }
    let fifo = root.parent().unwrap().join("fifo.safetensors");
    mkfifo(&fifo);
    let msg = Header::read(&fifo).unwrap_err().to_string();
    assert!(msg.contains("is a FIFO"), "{msg}");
}

#[test]
fn a_huge_manifest_is_refused_before_it_is_read() {
    let (root, file) = saved("huge");
    let m = file.parent().unwrap().join("manifest.json");
    let f = std::fs::File::create(&m).unwrap();
    f.set_len(checkpoint::MAX_MANIFEST_BYTES + 1).unwrap();
    refused(&root, &m, &["more than the"]);
}

#[test]
fn resuming_with_other_settings_or_no_steps_left_is_refused() {
    let root = scratch("settings").join("ck");
    let saved = TrainConfig {
        steps: 12,
        ..TrainConfig::default()
    };
    save(&root, 6, &saved);
    let m = model();
    let resume = |t: &TrainConfig, allow| {
        checkpoint::load_for_resume(&root, &m, t, allow)
            .map(|(l, d)| (l.manifest.step, d))
            .map_err(|e| e.to_string())
    };
    assert_eq!(resume(&saved, false), Ok((6, vec![])));
    // More steps: the run goes on (the schedule's end moves).
    let longer = TrainConfig {
        steps: 20,
        ..saved.clone()
    };
    assert_eq!(resume(&longer, false), Ok((6, vec![])));
    for steps in [6, 3] {
        let t = TrainConfig {
            steps,
            ..saved.clone()
        };
        let e = resume(&t, false).unwrap_err();
        assert!(
            e.contains("step 6") && e.contains(&format!("--steps is {steps}")),
            "{e}"
        );
        assert!(resume(&t, true).is_err(), "no flag makes it sensible");
    }
    let lr = TrainConfig {
        lr: 1e-3,
        ..saved.clone()
    };
    let e = resume(&lr, false).unwrap_err();
    assert!(
        e.contains("lr (--lr) is 0.003 in the checkpoint but 0.001 now")
            && e.contains("--allow-changed-settings"),
        "{e}"
    );
    let seed = TrainConfig {
        seed: 7,
        ..saved.clone()
    };
    let e = resume(&seed, false).unwrap_err();
    assert!(
        e.contains("seed (--seed) is 1234 in the checkpoint but 7 now"),
        "{e}"
    );
    let many = TrainConfig {
        warmup: 3,
        global_batch: 8,
        ..saved.clone()
    };
    let e = resume(&many, false).unwrap_err();
    assert!(
        e.contains("warmup is 20 in the checkpoint but 3 now")
            && e.contains("global_batch (--global-batch) is 64 in the checkpoint but 8 now"),
        "{e}"
    );
    // With the flag: loaded, each change reported.
    let (_, diffs) = resume(&lr, true).unwrap();
    assert_eq!(
        diffs,
        ["lr (--lr) is 0.003 in the checkpoint but 0.001 now"]
    );
    // Validation settings may change.
    let eval = TrainConfig {
        eval_every: 1,
        eval_sequences: 2,
        ..saved.clone()
    };
    assert_eq!(resume(&eval, false), Ok((6, vec![])));
}

#[test]
fn a_step_zero_import_takes_any_settings() {
    let root = scratch("import").join("ck");
    save(&root, 0, &TrainConfig::default());
    let t = TrainConfig {
        lr: 1e-4,
        seed: 99,
        ..TrainConfig::default()
    };
    let (l, diffs) = checkpoint::load_for_resume(&root, &model(), &t, false).unwrap();
    assert_eq!((l.manifest.step, diffs.len()), (0, 0));
}

#[test]
fn saving_a_step_again_keeps_a_complete_checkpoint() {
    let root = scratch("again").join("ck");
    save(&root, 6, &TrainConfig::default());
    let dir = save(&root, 6, &TrainConfig::default());
    assert_eq!(checkpoint::open(&root).unwrap().dir, dir);
    let left: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let mut left = left;
    left.sort();
    assert_eq!(left, ["latest", "step-00000006"]);
}

const CHILD: &str = "POLYCHIP_TEST_SAVE_FOREVER";

/// In a child process (re-run of this test binary): saves step after step
/// into the root the parent names, until killed.
#[test]
fn kill_9_during_saves_keeps_the_previous_checkpoint() {
    if let Ok(root) = std::env::var(CHILD) {
        let root = PathBuf::from(root);
        for step in 2.. {
            save(&root, step, &TrainConfig::default());
        }
        return;
    }
    let root = scratch("kill").join("ck");
    save(&root, 1, &TrainConfig::default());
    let exe = std::env::current_exe().unwrap();
    let mut last = 1;
    for round in 0..12u64 {
        let mut child = std::process::Command::new(&exe)
            .args([
                "--exact",
                "kill_9_during_saves_keeps_the_previous_checkpoint",
                "--test-threads",
                "1",
            ])
            .env(CHILD, &root)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Killed at varying points of a save.
        std::thread::sleep(Duration::from_millis(40 + round * 17));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let loaded = checkpoint::open(&root)
            .unwrap_or_else(|e| panic!("round {round}: the last checkpoint was lost: {e}"));
        let step = loaded.manifest.step;
        assert!(step >= 1, "round {round}");
        assert_eq!(loaded.tensors[0].1, tensors(step as f32), "round {round}");
        last = last.max(step);
    }
    eprintln!("after 12 kills, latest is step {last}");
}

#[test]
fn saving_does_not_write_through_planted_links() {
    let root = scratch("planted").join("ck");
    save(&root, 1, &TrainConfig::default());
    let elsewhere = root.parent().unwrap().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    // A link where the next save's partial directory goes.
    std::os::unix::fs::symlink(&elsewhere, root.join("step-00000002.partial")).unwrap();
    let msg = checkpoint::write_tensors(&root, 2, &tensors(2.0), 0, 1)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("step-00000002.partial") && msg.contains("not a directory"),
        "{msg}"
    );
    // A link at the temporary file's name (it is predictable: the pid).
    std::fs::remove_file(root.join("step-00000002.partial")).unwrap();
    let partial = root.join("step-00000002.partial");
    std::fs::create_dir_all(&partial).unwrap();
    let victim = elsewhere.join("victim");
    std::fs::write(&victim, "keep me").unwrap();
    let tmp = partial.join(format!(
        ".{}.tmp-{}",
        checkpoint::stage_file(0, 1),
        std::process::id()
    ));
    std::os::unix::fs::symlink(&victim, &tmp).unwrap();
    save(&root, 2, &TrainConfig::default());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert_eq!(checkpoint::open(&root).unwrap().manifest.step, 2);
    assert!(
        elsewhere.read_dir().unwrap().count() == 1,
        "nothing else written there"
    );
}

#[test]
fn a_hugging_face_directory_of_fifos_is_refused_unread() {
    let dir = scratch("hf-fifo");
    let mkfifo = |p: &Path| {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    };
    mkfifo(&dir.join("config.json"));
    mkfifo(&dir.join("model.safetensors"));
    let started = Instant::now();
    let msg = match polychip_train::hf::HfModel::open(&dir, None) {
        Ok(_) => panic!("a directory of FIFOs was opened"),
        Err(e) => e.to_string(),
    };
    assert!(started.elapsed() < Duration::from_secs(10), "no hang");
    assert!(
        msg.contains("config.json") && msg.contains("is a FIFO"),
        "{msg}"
    );
}

#[test]
fn a_version_1_checkpoint_is_refused_naming_the_format() {
    let (root, file) = saved("v1");
    let m = file.parent().unwrap().join("manifest.json");
    let text = std::fs::read_to_string(&m).unwrap();
    let v1: String = text
        .lines()
        .filter(|l| !l.contains("\"checksum\""))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("polychip-checkpoint/2", "polychip-checkpoint/1");
    std::fs::write(&m, v1).unwrap();
    refused(&root, &m, &["polychip-checkpoint/1", "this build reads"]);
}

/// A checkpoint whose weights are not finite (saved before saves refused
/// them, or by hand) is refused by what reads its weights (logits,
/// export), naming the file, the tensor and the element.
#[test]
fn weights_that_are_not_finite_are_refused_by_name() {
    use polychip_train::params::{StageRange, stage_params};
    let root = scratch("nan");
    let cfg = ModelConfig::preset("mini").unwrap();
    let mut st = SafeTensors::new();
    for spec in stage_params(&cfg, &StageRange::whole(&cfg)) {
        let mut values = vec![0.01f32; spec.numel()];
        if spec.name == "layers.1.feed_forward.w2.weight" {
            values[5] = f32::NAN;
        }
        let t = StoredTensor {
            dtype: DType::F32,
            shape: spec.shape.clone(),
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        st.insert(spec.name, t).unwrap();
    }
    checkpoint::write_tensors(&root, 3, &st, 0, 1).unwrap();
    let manifest = Manifest {
        format: checkpoint::FORMAT.into(),
        step: 3,
        model: cfg,
        train: TrainConfig::default(),
        plan: "test".into(),
        files: vec![checkpoint::stage_file(0, 1)],
        sums: Vec::new(),
    };
    checkpoint::commit(&root, &manifest).unwrap();
    let e = polychip_train::hf::checkpoint_weights(&root)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("stage-00-of-01")
            && e.contains("tensor `layers.1.feed_forward.w2.weight` element 5 is NaN"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

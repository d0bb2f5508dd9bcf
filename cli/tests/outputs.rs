//! The files commands write: an output that is one of the command's inputs
//! or another of its outputs is refused before anything runs (nothing is
//! overwritten), and the reports' files of `polychip conform` are checked
//! before the suite runs, not after (needs the bundled plugins built:
//! `cargo build -p polychip -p polychip-vendor-ferrite`).

mod common;
use common::{built_plugin, polychip};

use std::path::{Path, PathBuf};

fn scratch(name: &str) -> PathBuf {
    common::scratch_dir("outputs", name)
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

const TRAIN: [&str; 9] = [
    "train",
    "--model",
    "mini",
    "--device",
    "ferrite:0",
    "--steps",
    "1",
    "--no-pin",
    "--eval-every=0",
];

/// `polychip train` with the common flags and `extra`: exit code and
/// stderr.
fn train(extra: &[&str]) -> (Option<i32>, String) {
    let mut args = TRAIN.to_vec();
    args.extend_from_slice(extra);
    let (code, _, err) = polychip(&args);
    (code, err)
}

#[test]
fn an_output_over_an_input_or_another_output_is_refused_and_nothing_is_written() {
    let dir = scratch("train");
    let corpus = dir.join("corpus.txt");
    let text = "the corpus must survive the refusal\n".repeat(40);
    std::fs::write(&corpus, &text).unwrap();
    let (code, err) = train(&["--corpus", &s(&corpus), "--log-json", &s(&corpus)]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--log-json") && err.contains("is the same file as --corpus"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&corpus).unwrap(), text);
    // Through a link, and through another spelling of the same path.
    let link = dir.join("link.txt");
    std::os::unix::fs::symlink(&corpus, &link).unwrap();
    let (code, err) = train(&["--corpus", &s(&corpus), "--trace", &s(&link)]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("same file as --corpus"), "{err}");
    // Two outputs at one path (one not made yet), the trace's simulated
    // step among them.
    let a = dir.join("a.json");
    let other = dir.join(".").join("a.json");
    let (code, err) = train(&["--trace", &s(&a), "--log-json", &s(&other)]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("name the same path"), "{err}");
    let (code, err) = train(&[
        "--trace",
        &s(&a),
        "--save-plan",
        &s(&dir.join("a.sim.json")),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--trace (its simulated step)"), "{err}");
    // The checkpoint directory as the export's: refused before training.
    let x = dir.join("x");
    let (code, err) = train(&["--checkpoint-dir", &s(&x), "--export-hf", &s(&x)]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--checkpoint-dir") && err.contains("--export-hf"),
        "{err}"
    );
    assert!(!x.exists(), "nothing was saved");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(left.len(), 2, "only the corpus and its link: {left:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn plan_and_profile_refuse_to_write_over_their_inputs() {
    let dir = scratch("plan");
    let cluster = dir.join("cluster.toml");
    let original = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../examples/clusters/china-mobile-3-vendor.toml"),
    )
    .unwrap();
    std::fs::write(&cluster, &original).unwrap();
    let (code, _, err) = polychip(&[
        "plan",
        "--cluster",
        &s(&cluster),
        "--model",
        "llama-7b",
        "--trace",
        &s(&cluster),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--trace") && err.contains("--cluster"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&cluster).unwrap(), original);
    let model = dir.join("m.toml");
    let m = "name = \"m\"\nvocab = 256\ndim = 64\nlayers = 1\nheads = 4\nkv_heads = 2\n\
             ffn = 128\nseq_len = 16\n";
    std::fs::write(&model, m).unwrap();
    let (code, _, err) = polychip(&["profile", "--model", &s(&model), "--out", &s(&model)]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--out") && err.contains("--model"), "{err}");
    assert_eq!(std::fs::read_to_string(&model).unwrap(), m);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn conform_checks_its_reports_files_before_the_suite_runs() {
    let dir = scratch("conform");
    let plugin = built_plugin("libpolychip_vendor_ferrite.so");
    let fifo = dir.join("fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|st| st.success()) {
        let (code, out, err) = polychip(&["conform", "--plugin", &plugin, "--json", &s(&fifo)]);
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.contains("--json") && err.contains("not a regular file"),
            "{err}"
        );
        assert!(!out.contains("passed"), "the suite did not run: {out}");
    }
    let waivers = dir.join("w.toml");
    std::fs::write(&waivers, "").unwrap();
    let (code, _, err) = polychip(&[
        "conform",
        "--plugin",
        &plugin,
        "--waivers",
        &s(&waivers),
        "--junit",
        &s(&waivers),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--junit") && err.contains("--waivers"),
        "{err}"
    );
    // A waiver file that is a device is not read.
    let (code, _, err) = polychip(&["conform", "--plugin", &plugin, "--waivers", "/dev/zero"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("a character device"), "{err}");
    // A file that may be written in a directory where nothing may be
    // created (the report goes through a temporary file beside it, renamed
    // over it): refused before the suite, not after it.
    let (code, out, err) = polychip(&[
        "conform",
        "--plugin",
        &plugin,
        "--ops",
        "^fill$",
        "--json",
        "/proc/self/comm",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--json /proc/self/comm: cannot be replaced: its temporary file"),
        "{err}"
    );
    assert!(!out.contains("passed"), "the suite did not run: {out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A file system of `kib` KiB mounted at `dir` (tmpfs), or `None` where
/// this process may not mount one (not root, or in a container without the
/// right): the full-disk test then skips, saying why.
fn small_disk(dir: &Path, kib: u64) -> Option<Mounted> {
    std::fs::create_dir_all(dir).ok()?;
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
        .arg(dir)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then(|| Mounted(dir.to_path_buf()))
}

struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_leaves_no_half_written_output_and_no_stray_file() {
    let dir = scratch("full");
    let disk = dir.join("disk");
    let Some(_mounted) = small_disk(&disk, 16) else {
        eprintln!(
            "skipped: cannot mount a small tmpfs here (needs root), so no disk can be filled"
        );
        return;
    };
    // The checkpoint of `mini` is larger than the disk: the save fails,
    // and neither a partial step directory nor a temporary file stays.
    let ck = disk.join("ck");
    let (code, err) = train(&["--checkpoint-dir", &s(&ck)]);
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&ck)
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.iter().all(|n| n == ".lock"),
        "only the lock file stays: {left:?}"
    );
    // An export's staging directory goes too.
    let (code, err) = train(&["--export-hf", &s(&disk.join("hf"))]);
    assert_ne!(code, Some(0), "{err}");
    let left: Vec<_> = std::fs::read_dir(&disk)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        left.iter().all(|n| n == "ck"),
        "nothing of the export stays: {left:?}"
    );
    std::fs::remove_dir_all(&ck).unwrap();
    // A JSON output on a full disk: no truncated file, no temporary one.
    let filler = disk.join("filler");
    let _ = std::fs::write(&filler, vec![0u8; 64 << 10]);
    let log = disk.join("log.json");
    let (code, err) = train(&["--log-json", &s(&log)]);
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("--log-json"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&disk)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, ["filler"], "{left:?}");
}

//! Issue 15, numbers and refusals: sizes beyond their bounds, flags that
//! would train nothing, a corpus that is not a regular file, unwritable
//! output paths and bad launcher variables are all refused with the flag,
//! field or variable named, before the first training step (needs the
//! bundled plugins built: `cargo build -p polychip -p
//! polychip-vendor-ferrite -p polychip-vendor-cobalt`).

mod common;
use common::polychip_env;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn scratch(name: &str) -> PathBuf {
    common::scratch_dir("limits", name)
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

const TRAIN: [&str; 8] = [
    "train",
    "--global-batch",
    "4",
    "--eval-every",
    "0",
    "--log-every",
    "0",
    "--no-pin",
];

/// `polychip train` with the common flags and `extra`, killed after
/// `limit` (a hang fails the test instead of stalling it): exit code and
/// stderr.
fn train_within(extra: &[&str], env: &[(&str, &str)], limit: Duration) -> (Option<i32>, String) {
    let mut args: Vec<&str> = TRAIN.to_vec();
    if !extra.contains(&"--model") {
        args.extend_from_slice(&["--model", "mini"]);
    }
    args.extend_from_slice(extra);
    let child = Command::new(env!("CARGO_BIN_EXE_polychip"))
        .args(&args)
        .envs(env.iter().copied())
        .env("POLYCHIP_TRANSPORT", "shm")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run polychip");
    let out = finish_within(child, limit, &format!("polychip train {extra:?}"));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Waits for `child` at most `limit`; a hang kills it and fails the test,
/// naming `what`.
fn finish_within(
    mut child: std::process::Child,
    limit: Duration,
    what: &str,
) -> std::process::Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().unwrap();
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Expects a refusal (exit 2) before any training that mentions every one
/// of `needles`.
fn refused(extra: &[&str], env: &[(&str, &str)], needles: &[&str]) -> String {
    let (code, out) = train_within(extra, env, Duration::from_secs(60));
    assert_eq!(code, Some(2), "{extra:?} {env:?}: {out}");
    assert!(
        !out.contains("training mini"),
        "trained before refusing: {out}"
    );
    for n in needles {
        assert!(out.contains(n), "{extra:?} {env:?}: no {n:?} in {out}");
    }
    out
}

#[test]
fn flags_that_would_train_nothing_are_refused() {
    refused(
        &["--steps", "0"],
        &[],
        &["--steps is 0", "--checkpoint-dir"],
    );
    refused(
        &[
            "--steps",
            "2",
            "--device",
            "ferrite:0",
            "--micro-batch-size",
            "0",
        ],
        &[],
        &["--micro-batch-size is 0"],
    );
    refused(
        &["--steps", "2", "--device", "ferrite:0", "--copies", "0"],
        &[],
        &["--copies is 0"],
    );
    refused(
        &["--steps", "2", "--save-every", "1"],
        &[],
        &["--save-every 1 needs --checkpoint-dir"],
    );
    refused(
        &["--steps", "2", "--stop-after", "0"],
        &[],
        &["--stop-after is 0"],
    );
    // Ignored before: the plan sets the micro-batching.
    refused(
        &["--steps", "2", "--plan", "auto", "--micro-batch-size", "4"],
        &[],
        &["--micro-batch-size applies to --stages and --device only"],
    );
    refused(
        &["--steps", "2", "--plan", "auto", "--copies", "2"],
        &[],
        &["--copies applies to --stages and --device only"],
    );
}

#[test]
fn huge_sizes_are_refused_by_name() {
    let dir = scratch("model");
    let config = dir.join("train.toml");
    std::fs::write(&config, "global_batch = 100000000\n").unwrap();
    refused(
        &["--steps", "1", "--config", &s(&config)],
        &[],
        &["global_batch is 100000000, more than the 65536"],
    );
    let model = dir.join("huge.toml");
    std::fs::write(
        &model,
        "name = \"huge\"\ndim = 4294967296\nlayers = 2\nheads = 4\nkv_heads = 2\nffn = 64\nseq_len = 16\n",
    )
    .unwrap();
    refused(
        &["--steps", "1", "--model", &s(&model)],
        &[],
        &["dim is 4294967296, more than the 1048576 accepted"],
    );
    let plan = dir.join("plan.toml");
    std::fs::write(
        &plan,
        "[[group]]\ncopies = 9223372036854775807\nmicro_batch_size = 1\nmicro_batches = 1\n\
         stages = [{ device = \"ferrite\", layers = [0, 2] }]\n",
    )
    .unwrap();
    refused(
        &["--steps", "1", "--plan", &s(&plan)],
        &[],
        &["copies is 9223372036854775807, more than the 65536"],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_fifo_or_device_as_corpus_is_refused_without_hanging() {
    let dir = scratch("fifo");
    let fifo = dir.join("corpus.fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    refused(
        &["--steps", "1", "--corpus", &s(&fifo)],
        &[],
        &["is not a regular file (it is a FIFO)"],
    );
    refused(
        &["--steps", "1", "--corpus", "/dev/zero"],
        &[],
        &["/dev/zero", "a character device"],
    );
    refused(
        &["--steps", "1", "--corpus", &s(&dir)],
        &[],
        &["a directory"],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unwritable_outputs_are_refused_before_training() {
    let dir = scratch("outputs");
    // A regular file where a directory is needed: refused even for root.
    let file = dir.join("a-file");
    std::fs::write(&file, "x").unwrap();
    let under = s(&file.join("sub"));
    let missing = s(&dir.join("no-such-dir").join("out.json"));
    refused(
        &["--steps", "1", "--checkpoint-dir", &under],
        &[],
        &[
            "--checkpoint-dir",
            "is not a directory, so it cannot be created",
        ],
    );
    refused(
        &["--steps", "1", "--checkpoint-dir", &s(&file)],
        &[],
        &["--checkpoint-dir", "exists and is not a directory"],
    );
    refused(
        &["--steps", "1", "--trace", &missing],
        &[],
        &["--trace", "cannot be created"],
    );
    refused(
        &["--steps", "1", "--log-json", &s(&dir)],
        &[],
        &["--log-json", "is a directory"],
    );
    let fifo = dir.join("out.fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    refused(
        &["--steps", "1", "--log-json", &s(&fifo)],
        &[],
        &["--log-json", "is not a regular file"],
    );
    // The probes leave nothing behind: a good --log-json and --trace, a
    // bad --save-plan.
    let (log, trace) = (dir.join("log.json"), dir.join("trace.json"));
    let ckpt = dir.join("ckpt").join("deeper");
    refused(
        &[
            "--steps",
            "1",
            "--checkpoint-dir",
            &s(&ckpt),
            "--log-json",
            &s(&log),
            "--trace",
            &s(&trace),
            "--save-plan",
            &under,
        ],
        &[],
        &["--save-plan", "cannot be created"],
    );
    let mut left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["a-file", "out.fifo"], "the probes left files behind");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_launcher_variables_are_refused_by_name() {
    let run = [
        "--steps",
        "1",
        "--device",
        "ferrite:0",
        "--micro-batch-size",
        "2",
    ];
    for bad in ["abc", "inf", "-1", "0"] {
        refused(
            &run,
            &[("POLYCHIP_COMM_TIMEOUT_SECS", bad)],
            &[&format!("POLYCHIP_COMM_TIMEOUT_SECS is {bad:?}")],
        );
    }
    refused(
        &run,
        &[
            ("RANK", "0"),
            ("WORLD_SIZE", "18446744073709551615"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ],
        &["WORLD_SIZE is 18446744073709551615, more than the 65536 ranks"],
    );
}

#[test]
fn plan_refuses_huge_models_and_batches() {
    let cluster = format!(
        "{}/../examples/clusters/china-mobile-3-vendor.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    let dir = scratch("plan");
    let model = dir.join("m.toml");
    std::fs::write(
        &model,
        "name = \"wide\"\nlayers = 80\nhidden = 4294967296\nffn = 28672\nheads = 64\n\
         kv_heads = 8\nvocab = 32000\nseq_len = 4096\n",
    )
    .unwrap();
    let (code, _, err) = polychip_env(&["plan", "--cluster", &cluster, "--model", &s(&model)], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("hidden is 4294967296, more than the planner accepts (1048576)"),
        "{err}"
    );
    let start = Instant::now();
    let (code, _, err) = polychip_env(
        &[
            "plan",
            "--cluster",
            &cluster,
            "--model",
            "llama-70b",
            "--global-batch",
            "100000000",
        ],
        &[],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--global-batch is 100000000"), "{err}");
    let (code, _, err) = polychip_env(
        &[
            "plan",
            "--cluster",
            &cluster,
            "--model",
            "llama-70b",
            "--trace",
            &s(&dir.join("no-such-dir").join("t.json")),
        ],
        &[],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--trace") && err.contains("cannot be created"),
        "{err}"
    );
    assert!(start.elapsed() < Duration::from_secs(10));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn launch_refuses_a_huge_rank_count_and_train_an_empty_core_range() {
    let (code, _, err) = polychip_env(&["launch", "-n", "18446744073709551615", "--", "true"], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("-n is 18446744073709551615, more than the 65536 ranks"),
        "{err}"
    );
    refused(
        &["--steps", "1", "--cores", "3-1"],
        &[],
        &["--cores \"3-1\"", "is empty"],
    );
}

/// `polychip profile-worker`, its stdin and stdout piped.
fn worker() -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_polychip"))
        .arg("profile-worker")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run polychip")
}

/// `polychip profile-worker` fed `input` on stdin (then its end): exit
/// code and the events it said (one JSON object per line).
fn worker_given(input: Vec<u8>) -> (Option<i32>, Vec<serde_json::Value>) {
    use std::io::Write;
    let mut child = worker();
    let mut stdin = child.stdin.take().unwrap();
    // It may stop reading (and close) before the end of a long input.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    let events = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    (out.status.code(), events)
}

const WORKER_MODEL: &str =
    r#"{"name":"w","dim":16,"layers":2,"heads":2,"kv_heads":1,"ffn":32,"seq_len":8}"#;

#[test]
fn the_profile_worker_refuses_a_bad_job_by_saying_what_is_wrong() {
    let job = |device: &str, sizes: &str| {
        format!(
            r#"{{"model":{WORKER_MODEL},"train":{{}},"device":"{device}","sizes":{sizes},"cores":null}}"#
        )
    };
    let long = vec![b'a'; 17 << 20];
    for (input, want) in [
        (Vec::new(), "no job on standard input"),
        (b"not json\n".to_vec(), "the job: "),
        (long, "a line longer than"),
        (
            format!("{}\n", job("nosuch:0", "[1]")).into_bytes(),
            "no device nosuch:0",
        ),
        (
            format!("{}\n", job("ferrite:0", "[0]")).into_bytes(),
            "micro-batch sizes [0]",
        ),
        (
            format!(
                "{}\n",
                job("ferrite:0", "[1]").replace("\"dim\":16", "\"dim\":0")
            )
            .into_bytes(),
            "the job's model: ",
        ),
    ] {
        let (code, events) = worker_given(input);
        assert_eq!(code, Some(2), "{events:?}");
        let last = events.last().unwrap_or_else(|| panic!("no event: {want}"));
        assert_eq!(last["event"], "error", "{events:?}");
        assert!(
            last["message"].as_str().unwrap().contains(want),
            "{want}: {events:?}"
        );
    }
    // Ready, then the parent gone before the start: it ends quietly.
    let (code, events) = worker_given(format!("{}\n", job("ferrite:0", "[1]")).into_bytes());
    assert_eq!(code, Some(0), "{events:?}");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["event"], "ready");
}

#[test]
fn the_profile_worker_profiles_until_stopped_and_marks_what_ended_after() {
    use std::io::{BufRead, BufReader, Write};
    let mut child = worker();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut next = || {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        serde_json::from_str::<serde_json::Value>(&line).unwrap_or_else(|e| panic!("{line}: {e}"))
    };
    let job = format!(
        r#"{{"model":{WORKER_MODEL},"train":{{}},"device":"ferrite:0","sizes":[2,1],"cores":null}}"#
    );
    writeln!(stdin, "{job}").unwrap();
    assert_eq!(next()["event"], "ready");
    let start = Instant::now();
    writeln!(stdin, "go").unwrap();
    // A round that ended 2 s or more after the start.
    assert_eq!(next()["event"], "round");
    assert!(start.elapsed() >= Duration::from_secs(2));
    writeln!(stdin, "stop").unwrap();
    let done = next();
    assert_eq!(done["event"], "done", "{done}");
    let measured = done["measured"].as_array().unwrap();
    // Every size, round after round; only the one in progress at the stop
    // (if any) ended after it.
    assert!(measured.len() >= 2, "{done}");
    for b in [1, 2] {
        assert!(measured.iter().any(|m| m[0]["micro_batch"] == b), "{done}");
    }
    let after = measured.iter().filter(|m| m[1] == false).count();
    assert!(after <= 1, "{done}");
    assert!(measured[0][0]["costs"]["block_forward"].as_f64().unwrap() > 0.0);
    assert!(child.wait().unwrap().success());
}

/// `polychip ARGS` with stdout going to `stdout`, killed after `limit` (a
/// hang fails the test): exit code and stderr.
fn with_stdout(
    args: &[&str],
    stdout: Stdio,
    close_it: bool,
    limit: Duration,
) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_polychip"))
        .args(args)
        .env("POLYCHIP_TRANSPORT", "shm")
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("run polychip");
    if close_it {
        // The reader goes away before anything is written: `| head -c0`.
        drop(child.stdout.take());
    }
    let out = finish_within(
        child,
        limit,
        &format!("polychip {args:?} (stdout closed: {close_it})"),
    );
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn dev_full() -> Stdio {
    Stdio::from(
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("open /dev/full"),
    )
}

#[test]
fn a_full_disk_on_stdout_is_one_clear_line_and_a_closed_pipe_ends_quietly() {
    let cluster = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/clusters/china-mobile-3-vendor.toml"
    );
    let limit = Duration::from_secs(120);
    for args in [
        vec!["devices"],
        vec!["plan", "--cluster", cluster, "--model", "llama-7b"],
    ] {
        let (code, err) = with_stdout(&args, dev_full(), false, limit);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(
            err.trim(),
            "polychip: cannot write to standard output: No space left on device (os error 28)",
            "{args:?}"
        );
    }
    let train = [
        "train",
        "--model",
        "mini",
        "--device",
        "ferrite:0",
        "--steps",
        "3",
        "--log-every",
        "1",
        "--global-batch",
        "4",
        "--no-pin",
    ];
    for args in [&["devices"][..], &train[..]] {
        let (code, err) = with_stdout(args, Stdio::piped(), true, limit);
        assert_eq!(code, Some(141), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn a_launcher_whose_stdout_is_closed_stops_its_ranks() {
    // Ranks that would print forever: the launcher must not relay them
    // into nothing until the end of time.
    let args = [
        "launch",
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        "while :; do echo y; sleep 0.01; done",
    ];
    let (code, err) = with_stdout(&args, Stdio::piped(), true, Duration::from_secs(30));
    assert_eq!(code, Some(141), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let (code, err) = with_stdout(&args, dev_full(), false, Duration::from_secs(30));
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("cannot write the ranks' output to standard output")
            && err.contains("No space left on device"),
        "{err}"
    );
}

#[test]
fn bench_comm_refuses_sizes_and_iterations_that_cannot_run() {
    let bench = |extra: &[&str]| {
        let mut args = vec!["bench", "comm", "-n", "2"];
        args.extend_from_slice(extra);
        let (code, out, err) = polychip_env(&args, &[]);
        (code, out + &err)
    };
    for (extra, needles) in [
        (
            &["--sizes", "18446744073709551615", "--ops", "all_reduce"][..],
            &["--sizes", "1073741824 (1 GiB)"][..],
        ),
        (&["--sizes", "1000G"], &["--sizes", "1000G", "limit"]),
        (
            &["--sizes", "16G", "--iters", "1"],
            &["--sizes", "16G", "limit"],
        ),
        (
            &["--sizes", "4K", "--iters", "18446744073709551615"],
            &["--iters is 18446744073709551615", "100000"],
        ),
        (&["--sizes", "4K", "--iters", "0"], &["--iters is 0"]),
        (
            &["--sizes", "1001", "--ops", "all_reduce"],
            &["--sizes", "1001 bytes", "f32", "multiple of 4"],
        ),
        (
            &["--sizes", "4", "--ops", "all_gather"],
            &["--sizes", "all_gather", "2 ranks", "at least 8 bytes"],
        ),
    ] {
        let (code, out) = bench(extra);
        assert_eq!(code, Some(2), "{extra:?}: {out}");
        assert!(
            !out.contains("panicked") && !out.contains("size(B)"),
            "{extra:?}: {out}"
        );
        for n in needles {
            assert!(out.contains(n), "{extra:?}: no {n:?} in {out}");
        }
    }
    // The flag is named, not the variable the launcher passes it on in.
    let (code, out) = bench(&[
        "--transport",
        "verbs",
        "--sizes",
        "4K",
        "--ops",
        "all_reduce",
    ]);
    assert!(!out.contains("POLYCHIP_TRANSPORT=verbs"), "{out}");
    if code != Some(0) {
        assert!(out.contains("--transport verbs"), "{out}");
    }
    // More ranks than a communicator takes: refused before any rank starts
    // (64 ranks used to start and each fail), naming where the count came
    // from.
    let sized = ["bench", "comm", "--sizes", "4K", "--iters", "1"];
    let (code, _, err) = polychip_env(&[&sized[..], &["-n", "64"]].concat(), &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("-n gives 64 ranks; the benchmark runs 1 to 63"),
        "{err}"
    );
    let (code, _, err) = polychip_env(&sized, &[("POLYCHIP_BENCH_RANKS", "0")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("POLYCHIP_BENCH_RANKS=\"0\" gives 0 ranks"),
        "{err}"
    );
}

#[test]
fn a_model_file_with_fewer_than_256_tokens_is_refused_naming_it() {
    let dir = scratch("vocab");
    let model = dir.join("v10.toml");
    std::fs::write(
        &model,
        "name = \"v10\"\nvocab = 10\ndim = 64\nlayers = 1\nheads = 4\nkv_heads = 2\nffn = 64\nseq_len = 16\n",
    )
    .unwrap();
    let out = refused(
        &[
            "--model",
            &s(&model),
            "--device",
            "ferrite:0",
            "--steps",
            "1",
        ],
        &[],
        &[&s(&model), "vocab is 10", "byte tokens", "at least 256"],
    );
    assert!(!out.contains("Ferrite"), "the plugin was reached: {out}");
}

#[test]
fn diverged_weights_are_never_saved_or_exported() {
    let dir = scratch("diverged");
    let (ck, hf) = (dir.join("ck"), dir.join("hf"));
    let (ck_s, hf_s) = (s(&ck), s(&hf));
    let base = [
        "--model",
        "mini",
        "--device",
        "ferrite:0",
        "--checkpoint-dir",
        &ck_s,
    ];
    let limit = Duration::from_secs(300);
    // A good step-1 checkpoint first.
    let mut good = base.to_vec();
    good.extend_from_slice(&["--steps", "1"]);
    let (code, out) = train_within(&good, &[], limit);
    assert_eq!(code, Some(0), "{out}");
    let latest = std::fs::read_to_string(ck.join("latest")).unwrap();
    // The last step diverges (a NaN validation loss; the last step is
    // always evaluated): nothing is saved or exported.
    let mut last = base.to_vec();
    last.extend_from_slice(&[
        "--resume",
        &ck_s,
        "--allow-changed-settings",
        "--steps",
        "2",
        "--lr",
        "1e300",
        "--export-hf",
        &hf_s,
    ]);
    let (code, out) = train_within(&last, &[], limit);
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("training diverged: step 2"), "{out}");
    assert!(!hf.exists(), "exported diverged weights: {out}");
    // Saving every step: the diverged step-2 weights are refused before
    // their save, and step 1 stays `latest`.
    let mut every = base.to_vec();
    every.extend_from_slice(&[
        "--resume",
        &ck_s,
        "--allow-changed-settings",
        "--steps",
        "3",
        "--save-every",
        "1",
        "--lr",
        "1e300",
    ]);
    let (code, out) = train_within(&every, &[], limit);
    assert_ne!(code, Some(0), "{out}");
    assert!(
        out.contains("training diverged: step 2: the weights are not finite"),
        "{out}"
    );
    assert_eq!(std::fs::read_to_string(ck.join("latest")).unwrap(), latest);
    let steps: Vec<String> = std::fs::read_dir(&ck)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    assert_eq!(steps, ["step-00000001"], "{out}");
}

/// The example cluster with `edit` applied to its text, written to `dir`.
fn cluster_with(dir: &Path, name: &str, edit: impl Fn(String) -> String) -> PathBuf {
    let example = format!(
        "{}/../examples/clusters/china-mobile-3-vendor.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    let path = dir.join(name);
    std::fs::write(&path, edit(std::fs::read_to_string(example).unwrap())).unwrap();
    path
}

#[test]
fn plan_refuses_absurd_chip_figures_and_says_why_a_type_holds_no_model() {
    let dir = scratch("plan-figures");
    let plan = |cluster: &Path, json: bool| {
        let c = s(cluster);
        let mut args = vec!["plan", "--cluster", &c, "--model", "llama-7b"];
        args.extend_from_slice(&["--global-batch", "256"]);
        if json {
            args.push("--json");
        }
        polychip_env(&args, &[])
    };
    for (edit, field) in [
        ("peak_flops = { f32 = 128e12", "peak_flops = { f32 = 1e-300"),
        ("memory_bandwidth = 0.8e12", "memory_bandwidth = 1e-300"),
        (
            "memory_bandwidth = 0.8e12",
            "memory_bandwidth = 0.8e12\nmatmul_workspace_bytes = 18446744073709551615",
        ),
    ] {
        let c = cluster_with(&dir, "c.toml", |t| t.replace(edit, field));
        let (code, out, err) = plan(&c, false);
        assert_eq!(code, Some(2), "{field}: {out}{err}");
        let name = field
            .rsplit('\n')
            .next()
            .unwrap()
            .split(' ')
            .next()
            .unwrap();
        let name = if name == "peak_flops" {
            "peak_flops.f32"
        } else {
            name
        };
        assert!(
            err.contains(&format!(
                "{}: chip type \"biren-br104-class\": {name}",
                s(&c)
            )),
            "{field}: {err}"
        );
        assert!(!err.contains("NaN") && err.len() < 400, "{err}");
    }
    // A reserve that leaves one byte: the type is kept, and the report says
    // why it cannot hold the model alone (not "0 tokens/s").
    let c = cluster_with(&dir, "one-byte.toml", |t| {
        t.replace(
            "memory_bandwidth = 0.8e12",
            "memory_bandwidth = 0.8e12\nmatmul_workspace_bytes = 0\nmemory_reserve_bytes = 34359738367",
        )
    });
    let (code, out, err) = plan(&c, false);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("biren-br104-class alone (256 chips): cannot hold the model: its 256 chips have 256 B in all"),
        "{out}"
    );
    assert!(
        !out.contains(" 0 tokens/s") && !out.contains("undefined"),
        "{out}"
    );
    let (code, out, err) = plan(&c, true);
    assert_eq!(code, Some(0), "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(report["alone"][2]["cannot_hold"].is_string(), "{out}");
    assert!(
        report["hetero_speedup_ratio"].as_f64().unwrap() > 0.0,
        "{out}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn plan_refuses_bad_devices_json_by_device_and_says_which_memory_it_took() {
    let dir = scratch("plan-devices");
    let dev = |id: &str, mem: &str, link: &str| {
        format!(
            r#"{{"id": "{id}", "name": "Ferrite F1", "memory_bytes": {mem}, "peak_flops": {{"f32": 1e11, "bf16": 1e11, "f16": 1e11}}, "memory_bandwidth": 1e10, "link_bandwidth": {link}}}"#
        )
    };
    let run = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        polychip_env(
            &[
                "plan",
                "--cluster",
                &s(&path),
                "--model",
                "mini",
                "--global-batch",
                "8",
            ],
            &[],
        )
    };
    let gib = "4294967296";
    for (devices, want) in [
        (
            [dev("Ferrite:0", gib, "1e10"), dev("Ferrite:0", gib, "1e10")],
            "devices 0 and 1 both have id \"ferrite:0\"",
        ),
        (
            [
                dev("Ferrite:0", gib, "1e10"),
                dev("Ferrite:1", "-1", "1e10"),
            ],
            "device 1 (\"Ferrite F1\") has memory_bytes -1; it must be a positive whole number",
        ),
        (
            [dev("Ferrite:0", gib, "1e10"), dev("Ferrite:1", gib, "-1")],
            "device 1 (\"Ferrite F1\") has link_bandwidth -1",
        ),
    ] {
        let (code, _, err) = run("d.json", format!("[{}]", devices.join(",")));
        assert_eq!(code, Some(2), "{want}: {err}");
        assert!(
            err.contains("d.json: devices JSON: ") && err.contains(want),
            "{err}"
        );
    }
    let (code, _, err) = run(
        "m.json",
        format!(
            "[{},{}]",
            dev("Ferrite:0", gib, "0"),
            dev("Ferrite:1", "1073741824", "1e10")
        ),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("note: ") && err.contains("reports link_bandwidth 0 (unknown)"),
        "{err}"
    );
    assert!(
        err.contains("device 1 (ferrite:1)")
            && err.contains("the type takes the least, 1073741824 bytes"),
        "{err}"
    );
    // A byte-order mark before the JSON is no part of it.
    let (code, _, err) = run(
        "bom.json",
        format!(
            "\u{feff}{{\"devices\": [{}]}}",
            dev("Ferrite:0", gib, "1e10")
        ),
    );
    assert_eq!(code, Some(0), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn conform_refuses_a_case_beyond_the_unit_and_waivers_for_no_op() {
    let (code, out, err) = polychip_env(
        &[
            "conform",
            "--ops",
            "^add$",
            "--dtype",
            "f32",
            "--case",
            "999999999",
        ],
        &[],
    );
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(
        err.contains("--case 999999999 is beyond the cases: add in f32 has ")
            && err.contains("numbered 0 to "),
        "{err}"
    );
    assert!(!out.contains("passed"), "{out}");
    let dir = scratch("waivers");
    for (text, want) in [
        (
            "[[waiver]]\nop = \"ad\"\naction = \"skip\"\nreason = \"r\"\n",
            "waiver 1 (op \"ad\"): the suite has no operator \"ad\"; did you mean add?",
        ),
        (
            "[[waiver]]\nop = \"add\"\ndtype = \"f33\"\naction = \"skip\"\nreason = \"r\"\n",
            "there is no dtype \"f33\"",
        ),
        (
            "[[waiver]]\nop = \"add\"\naction = \"skip\"\nreason = \"r\"\n\
             [[waiver]]\nop = \"add\"\naction = \"loosen\"\nfactor = 2.0\nreason = \"r\"\n",
            "waiver 2 (op \"add\"): waiver 1 already covers add in every dtype",
        ),
        (
            "[[waiver]]\nop = \"add\"\naction = \"loosen\"\nfactor = 1e308\nreason = \"r\"\n",
            "factor 1e308 is more than 1e6",
        ),
    ] {
        let w = dir.join("w.toml");
        std::fs::write(&w, text).unwrap();
        let (code, out, err) = polychip_env(
            &[
                "conform",
                "--ops",
                "^add$",
                "--dtype",
                "f32",
                "--waivers",
                &s(&w),
            ],
            &[],
        );
        assert_eq!(code, Some(2), "{out}{err}");
        assert!(
            err.contains(&format!("{}: ", s(&w))) && err.contains(want),
            "{err}"
        );
        assert!(err.len() < 400, "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn training_settings_and_plans_that_cannot_train_are_refused_by_field() {
    let dir = scratch("train-fields");
    for (text, want) in [
        (
            "eps = inf\n",
            "eps is inf; it must be from 1.18e-38 (f32's smallest normal number",
        ),
        (
            "warmup = 18446744073709551615\n",
            "warmup is 18446744073709551615 steps, more than the 1000000000",
        ),
    ] {
        let f = dir.join("settings.toml");
        std::fs::write(&f, text).unwrap();
        let f = s(&f);
        refused(
            &["--device", "ferrite:0", "--steps", "1", "--config", &f],
            &[],
            &[&format!("training file {f}: {want}")],
        );
    }
    for bad in ["nan", "-inf", "-5.0"] {
        let p = dir.join("plan.toml");
        std::fs::write(
            &p,
            format!(
                "predicted_step_seconds = {bad}\n[[group]]\nmicro_batch_size = 1\n\
                 micro_batches = 4\nstages = [{{ device = \"ferrite:0\", layers = [0, 2] }}]\n"
            ),
        )
        .unwrap();
        let out = refused(
            &["--plan", &s(&p), "--steps", "1"],
            &[],
            &[
                "plan.toml: predicted_step_seconds is ",
                "a number of seconds from 1e-9 to 1e9",
            ],
        );
        assert!(!out.contains("NaN ms"), "{out}");
    }
    let p = dir.join("plan.json");
    std::fs::write(
        &p,
        r#"{"group": [{"micro_batch_size": 1, "micro_batches": 4, "stages": [{"device": 0, "layers": [0, 2]}]}]}"#,
    )
    .unwrap();
    refused(
        &["--plan", &s(&p), "--steps", "1"],
        &[],
        &["at group[0].stages[0].device: invalid type: integer `0`"],
    );
    refused(
        &["--stages", "=0..2", "--steps", "1"],
        &[],
        &["--stages entry \"=0..2\" names no device"],
    );
    refused(
        &["--plan", "auto", "--devices", "", "--steps", "1"],
        &[],
        &["--devices is empty"],
    );
    refused(
        &[
            "--plan",
            "auto",
            "--devices",
            "ferrite:0,,cobalt:0",
            "--steps",
            "1",
        ],
        &[],
        &["entry 2 is empty"],
    );
    refused(
        &[
            "--plan",
            "auto",
            "--devices",
            "ferrite:0,Ferrite:0",
            "--steps",
            "1",
        ],
        &[],
        &["--devices names ferrite:0 twice"],
    );
    // A settings file that starts with a byte-order mark is read.
    let f = dir.join("bom.toml");
    std::fs::write(&f, "\u{feff}eps = inf\n").unwrap();
    refused(
        &["--device", "ferrite:0", "--steps", "1", "--config", &s(&f)],
        &[],
        &["eps is inf"],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn messages_name_the_cause_not_a_symptom() {
    let dir = scratch("messages");
    // A plugin path that is a loop of links: named as such, not missing.
    let (a, b) = (dir.join("loop-a"), dir.join("loop-b"));
    std::os::unix::fs::symlink(&b, &a).unwrap();
    std::os::unix::fs::symlink(&a, &b).unwrap();
    let (_, out, err) = polychip_env(&["devices"], &[("POLYCHIP_PLUGIN_PATH", &s(&a))]);
    let said = format!("{out}{err}");
    assert!(
        said.contains("symbolic links") && !said.contains("does not exist"),
        "{said}"
    );
    // The temporary directory a local job hands its plan through.
    let (code, out, err) = polychip_env(
        &[
            "train",
            "--model",
            "mini",
            "--stages",
            "ferrite:0=0..1,cobalt:0=1..2",
            "--steps",
            "1",
            "--no-pin",
        ],
        &[("TMPDIR", "/nonexistent/polychip-tmp")],
    );
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("TMPDIR"), "{err}");
    // --resume given the manifest file instead of its directory.
    let manifest = dir.join("manifest.json");
    std::fs::write(&manifest, "{}").unwrap();
    let (code, _, err) = polychip_env(&["train", "--resume", &s(&manifest), "--steps", "1"], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("is a file; give the checkpoint's step directory"),
        "{err}"
    );
    // A model name with an escape sequence is not printed to the terminal.
    let model = dir.join("esc.toml");
    std::fs::write(
        &model,
        "name = \"a\\u001b[31mred\"\nvocab = 256\ndim = 64\nlayers = 1\nheads = 4\n\
         kv_heads = 2\nffn = 64\nseq_len = 16\n",
    )
    .unwrap();
    let (code, err) = train_within(
        &[
            "--model",
            &s(&model),
            "--device",
            "ferrite:0",
            "--steps",
            "1",
        ],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("none of them control characters") && !err.contains('\u{1b}'),
        "{err}"
    );
    // The transport's listen address is named with the variable that set it.
    let (code, out, err) = polychip_env(
        &[
            "bench",
            "comm",
            "--transport",
            "tcp",
            "--sizes",
            "1K",
            "--nproc",
            "2",
            "--iters",
            "1",
        ],
        &[("POLYCHIP_COMM_ADDR", "192.0.2.1")],
    );
    assert_ne!(code, Some(0), "{out}{err}");
    assert!(
        err.contains("listen on 192.0.2.1") && err.contains("POLYCHIP_COMM_ADDR"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A negative `--device` is refused by name (clap took `-1` for a flag:
/// "unexpected argument '-1'").
#[test]
fn a_negative_device_index_is_refused_by_name() {
    for bad in ["-1", "-7"] {
        let (code, _, err) = polychip_env(&["conform", "--device", bad], &[]);
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.contains(&format!("--device {bad}: a device index is 0 or more")),
            "{err}"
        );
    }
}

/// What the command quotes from its arguments and environment has its
/// control characters escaped and a very long value cut: clap's refusals,
/// the launcher's, and the rendezvous variables' (they were echoed raw and
/// whole). A job id longer than the store's handshake carries is refused
/// before any rank starts, naming the variable and the limit.
#[test]
fn quoted_input_is_escaped_and_cut_and_a_huge_job_id_refused_by_name() {
    let clean = |err: &str| !err.contains('\u{1b}') && !err.contains('\u{7}');
    let (code, _, err) = polychip_env(&["conform", "--device", "\u{1b}]0;x\u{7}"], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(clean(&err) && err.contains("for '--device"), "{err:?}");
    let (code, _, err) = polychip_env(&["conform", "--device", "1\u{8}\u{8}2"], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(!err.contains('\u{8}'), "{err:?}");
    let devices = "a\u{1b}[2J,b,c";
    let (code, _, err) = polychip_env(
        &["launch", "-n", "2", "--devices", devices, "--", "true"],
        &[],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        clean(&err) && err.contains(r#""a\u{1b}[2J,b,c" has 3 entries"#),
        "{err:?}"
    );
    let long = format!("{},", "x".repeat(100_000));
    let (code, _, err) = polychip_env(
        &["launch", "-n", "2", "--devices", &long, "--", "true"],
        &[],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("… (100001 bytes) has an empty entry"), "{err}");
    assert!(err.len() < 1000, "{} bytes", err.len());
    let job_id = "j".repeat(70_000);
    let (code, _, err) = polychip_env(
        &["launch", "-n", "2", "--", "true"],
        &[("POLYCHIP_JOB_ID", &job_id)],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("POLYCHIP_JOB_ID is 70000 bytes long; a job id has at most 65536 bytes"),
        "{err}"
    );
    let run = [
        "--steps",
        "1",
        "--device",
        "ferrite:0",
        "--micro-batch-size",
        "2",
    ];
    let long_addr = "h".repeat(100_000);
    for (addr, needle) in [
        (
            "node0\u{1b}]0;x\u{7}",
            r#"MASTER_ADDR is "node0\u{1b}]0;x\u{7}", which is not a host"#,
        ),
        (
            long_addr.as_str(),
            "… (100000 bytes), longer than the 255 bytes",
        ),
    ] {
        let env = [
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", addr),
            ("MASTER_PORT", "29500"),
        ];
        let out = refused(&run, &env, &[needle]);
        assert!(clean(&out) && out.len() < 2000, "{out:?}");
    }
}

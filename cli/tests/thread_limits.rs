//! Commands under a process limit (`ulimit -u`, `prlimit --nproc`): a
//! thread the system refuses ends the command with a sentence naming what
//! the thread was for, never a panic (exit 101) or a hang. Until
//! 2026-12-07 conform's worker readers, its concurrency check, training's
//! reducer, sender and profilers, and the staged copy threads panicked
//! ("failed to spawn thread"). Root drops to `nobody` with setpriv, whose
//! limit is then enforced; skipped without root, setpriv or prlimit.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `polychip ARGS` as `nobody` with at most `limit` processes and threads:
/// its exit code and its output (stdout and stderr), killed (and the test
/// failed) after `within`.
fn limited(limit: usize, args: &[&str], within: Duration) -> (Option<i32>, String) {
    let dir = common::scratch_dir("thread-limits", &limit.to_string());
    let (out_path, err_path) = (dir.join("out"), dir.join("err"));
    let mut child = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .args(["prlimit", &format!("--nproc={limit}")])
        .arg(env!("CARGO_BIN_EXE_polychip"))
        .args(args)
        .current_dir("/")
        .env("RUST_BACKTRACE", "0")
        .env("TMPDIR", "/tmp")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("run setpriv");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "ulimit -u {limit}: polychip {} still ran after {within:?}:\n{}",
                args.join(" "),
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let said = std::fs::read_to_string(&out_path).unwrap_or_default()
        + &std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    // The limit's processes (workers, ranks) are gone before the next.
    std::thread::sleep(Duration::from_millis(200));
    (status.code(), said)
}

/// Whether `said` holds a panic of polychip's own: Rust's "thread 'NAME'
/// (TID) panicked at FILE:LINE". A plugin's panic it caught is reported,
/// not this ("Ferrite: fill panicked: ...", "panic: panicked at" in its
/// log).
fn panicked(said: &str) -> bool {
    said.lines()
        .any(|l| l.contains("thread '") && l.contains("panicked at"))
}

/// The limit counts every process and thread of `nobody`: one sweep at a
/// time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `args` under each limit of `limits`: every run ends on its own,
/// none panics, and each either succeeds or fails saying which thread it
/// could not start (or which process: a worker or rank the limit
/// refuses). Returns how many runs said a thread was refused. The sweep
/// ends at the second limit in a row that succeeds: a higher limit only
/// allows more (the runs above it, each a whole command, took most of the
/// suite's three minutes here and refused nothing).
fn sweep(limits: std::ops::RangeInclusive<usize>, args: &[&str], within: Duration) -> usize {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut threads_refused = 0;
    let mut succeeded_in_a_row = 0;
    for limit in limits {
        if succeeded_in_a_row == 2 {
            break;
        }
        let (code, said) = limited(limit, args, within);
        succeeded_in_a_row = if code == Some(0) {
            succeeded_in_a_row + 1
        } else {
            0
        };
        let why = said
            .lines()
            .find(|l| l.contains("could not start") || l.contains("unavailable"))
            .unwrap_or("");
        eprintln!("ulimit -u {limit}: exit {code:?} {why:.300}");
        assert!(
            !panicked(&said) && code != Some(101) && !said.contains("code 101"),
            "ulimit -u {limit}: polychip {}: {code:?}\n{said}",
            args.join(" ")
        );
        // Ferrite's kernels run on the calling thread when its pool's
        // threads are refused (until 2026-12-07 every kernel large enough
        // to split failed: "fill panicked: The global thread pool has not
        // been initialized"), and conform does not take a stream the limit
        // refused for a race.
        assert!(
            !said.contains("thread pool has not been initialized")
                && !said.contains("State shared between calls"),
            "ulimit -u {limit}: polychip {}: {code:?}\n{said}",
            args.join(" ")
        );
        if said.contains("could not start a thread to ") {
            threads_refused += 1;
            assert_ne!(code, Some(0), "ulimit -u {limit}: {said}");
            if said.contains("the conformance worker") {
                // conform's own readers refused: no verdict on the plugin
                // (until 2026-12-07 every case left failed with the
                // sentence, exit 1, as if the plugin had failed them).
                assert!(
                    code == Some(3) && said.contains("no verdict on the plugin"),
                    "ulimit -u {limit}: {code:?}\n{said}"
                );
                assert!(!said.contains("FAILED "), "ulimit -u {limit}: {said}");
            }
        } else if code != Some(0) {
            // A process the limit refused (a worker, a rank, a plugin's
            // loader), a peer that failed, or cases a plugin failed (its
            // own threads refused): said by the command.
            assert!(
                said.contains(&format!("polychip {}: ", args[0])) || said.contains("FAILED "),
                "ulimit -u {limit}: polychip {} failed without saying why: {code:?}\n{said}",
                args.join(" ")
            );
        }
    }
    threads_refused
}

/// `polychip conform` on Ferrite's fill (its worker, the worker's two
/// readers, and the concurrency check's threads).
#[test]
fn conform_under_a_process_limit_fails_with_a_sentence() {
    if !common::can_limit_processes() {
        return;
    }
    let plugin = common::built_plugin("libpolychip_vendor_ferrite.so");
    let args = ["conform", "--plugin", &plugin, "--ops", "^fill$"];
    let refused = sweep(1..=16, &args, Duration::from_secs(120));
    assert!(refused > 0, "no limit made a thread fail");
}

/// A one-step `polychip train` of `mini` with `extra` (the plan), swept
/// over limits enough for it to succeed at the top (each plugin built is
/// loaded in a child process first).
fn train_sweep(extra: [&str; 2]) {
    let mut args = vec!["train", "--model", "mini", "--global-batch", "8"];
    args.extend_from_slice(&["--eval-every", "0", "--log-every", "0"]);
    args.extend_from_slice(&["--no-pin", "--steps", "1"]);
    args.extend_from_slice(&extra);
    let refused = sweep(1..=24, &args, Duration::from_secs(180));
    assert!(refused > 0, "no limit made a thread fail");
}

/// A two-rank `polychip train` (each rank a process with its transport's
/// threads, the pipeline's sender, the stream threads of its device).
#[test]
fn train_under_a_process_limit_fails_with_a_sentence() {
    if common::can_limit_processes() {
        train_sweep(["--stages", "ferrite:0=0..1,ferrite:1=1..2"]);
    }
}

/// `polychip train --plan auto`: the profile workers (a process each, a
/// relay thread each in the parent, a stop watcher in each), then the job.
#[test]
fn a_searched_plan_under_a_process_limit_fails_with_a_sentence() {
    if common::can_limit_processes() {
        train_sweep(["--plan", "auto"]);
    }
}

//! `polychip launch` as a user runs it: the rank variables every child
//! sees, `[rank K] ` prefixes, a failing rank stopping the job with its
//! exit code, `--devices`, and usage errors.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

/// Runs `polychip launch ARGS`, killing it if it takes over a minute.
fn launch(args: &[&str]) -> Run {
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_polychip"))
        .arg("launch")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run polychip");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("polychip launch {args:?} ran for over a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = start.elapsed();
    Run {
        code: status.code(),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
        elapsed,
    }
}

fn sorted_lines(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines.sort();
    lines
}

#[test]
fn every_rank_gets_its_variables_and_a_prefix() {
    let run = launch(&[
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "echo rank $RANK of $WORLD_SIZE local $LOCAL_RANK of $LOCAL_WORLD_SIZE at $MASTER_ADDR launcher $POLYCHIP_LAUNCHER; echo oops >&2",
    ]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert_eq!(
        sorted_lines(&run.stdout),
        (0..3)
            .map(|k| format!("[rank {k}] rank {k} of 3 local {k} of 3 at 127.0.0.1 launcher 1"))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        sorted_lines(&run.stderr),
        (0..3)
            .map(|k| format!("[rank {k}] oops"))
            .collect::<Vec<_>>()
    );
}

#[test]
fn ranks_share_one_free_master_port() {
    let run = launch(&["-n", "2", "--", "sh", "-c", "echo $MASTER_PORT"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let ports: Vec<u16> = run
        .stdout
        .lines()
        .map(|l| l.split_once("] ").unwrap().1.parse().unwrap())
        .collect();
    assert_eq!(ports.len(), 2);
    assert_eq!(ports[0], ports[1]);
    assert_ne!(ports[0], 0);
}

#[test]
fn long_output_lines_are_never_mixed() {
    // Each rank prints 200 lines of 2000 characters.
    let script = "i=0; line=$(printf \"%02000d\" $RANK); while [ $i -lt 200 ]; do echo $line; i=$((i+1)); done";
    let run = launch(&["-n", "4", "--", "sh", "-c", script]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 800);
    for line in lines {
        let (prefix, body) = line.split_once("] ").unwrap();
        let rank = prefix.strip_prefix("[rank ").unwrap();
        assert_eq!(body.len(), 2000, "{prefix}");
        assert!(body.ends_with(rank) && body.trim_end_matches(rank).chars().all(|c| c == '0'));
    }
}

#[test]
fn output_without_newlines_is_passed_on_in_bounded_pieces() {
    // A megabyte without a newline: the launcher passes it on in pieces
    // of 64 KiB, each with the prefix (it held the whole line: a rank
    // writing /dev/zero took the launcher's memory without bound).
    let script = "head -c 1000000 /dev/zero | tr '\\0' x";
    let run = launch(&["-n", "1", "--", "sh", "-c", script]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let pieces: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(pieces.len(), 1_000_000usize.div_ceil(64 << 10));
    let mut total = 0;
    for piece in pieces {
        let body = piece.strip_prefix("[rank 0] ").unwrap();
        assert!(body.len() <= 64 << 10 && body.bytes().all(|b| b == b'x'));
        total += body.len();
    }
    assert_eq!(total, 1_000_000);
}

#[test]
fn a_job_secret_the_ranks_would_refuse_is_refused_before_any_starts() {
    let out = Command::new(env!("CARGO_BIN_EXE_polychip"))
        .args(["launch", "-n", "2", "--", "sh", "-c", "echo started"])
        .env("POLYCHIP_JOB_SECRET", "abc")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!stdout.contains("started"), "a rank started: {stdout}");
    assert!(
        stderr.contains("POLYCHIP_JOB_SECRET is 3 bytes long"),
        "{stderr}"
    );
}

#[test]
fn a_failing_rank_stops_the_others_and_sets_the_exit_code() {
    let run = launch(&[
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "echo started; if [ $RANK = 1 ]; then exit 7; fi; sleep 30",
    ]);
    assert_eq!(run.code, Some(7), "{}{}", run.stdout, run.stderr);
    assert!(
        run.elapsed < Duration::from_secs(20),
        "took {:?}",
        run.elapsed
    );
    assert!(
        run.stderr
            .contains("polychip launch: rank 1 exited with code 7"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_killed_rank_exits_1_and_names_the_signal() {
    let run = launch(&[
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        "if [ $RANK = 0 ]; then kill -9 $$; fi; sleep 30",
    ]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.elapsed < Duration::from_secs(20),
        "took {:?}",
        run.elapsed
    );
    assert!(
        run.stderr
            .contains("polychip launch: rank 0 killed by signal 9"),
        "{}",
        run.stderr
    );
}

#[test]
fn devices_are_distributed_one_per_rank() {
    let run = launch(&[
        "-n",
        "3",
        "--devices",
        "ferrite:0,ferrite:1,cobalt:0",
        "--",
        "sh",
        "-c",
        "echo $POLYCHIP_DEVICE",
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        sorted_lines(&run.stdout),
        [
            "[rank 0] ferrite:0",
            "[rank 1] ferrite:1",
            "[rank 2] cobalt:0"
        ]
    );
    let run = launch(&[
        "-n",
        "2",
        "--devices",
        "cobalt:0",
        "--",
        "sh",
        "-c",
        "echo $POLYCHIP_DEVICE",
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        sorted_lines(&run.stdout),
        ["[rank 0] cobalt:0", "[rank 1] cobalt:0"]
    );
}

#[test]
fn usage_errors() {
    let run = launch(&["-n", "3", "--devices", "a,b", "--", "true"]);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr.contains("has 2 entries but -n is 3"),
        "{}",
        run.stderr
    );
    assert!(run.stdout.is_empty());
    let run = launch(&["-n", "0", "--", "true"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    // No command.
    let run = launch(&["-n", "2"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    // A command that does not exist.
    let run = launch(&["-n", "2", "--", "/nonexistent/polychip-test-program"]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("could not start"), "{}", run.stderr);
}

/// When the system refuses a thread the launcher needs (too many processes
/// and threads for the user: `ulimit -u` of an unprivileged user), the job
/// stops with a sentence naming the rank, as when a rank cannot be
/// started. Until 2026-12-06 the launcher panicked ("failed to spawn
/// thread", exit 101). Root drops to `nobody` with setpriv, whose limit
/// (prlimit's `--nproc`) is then enforced; skipped without root, setpriv
/// or prlimit.
#[test]
fn a_thread_the_system_refuses_stops_the_job_with_a_sentence() {
    if !common::can_limit_processes() {
        return;
    }
    let mut threads_refused = 0;
    // Each rank is a process and two threads: depending on the limit, a
    // rank or a thread is the first thing refused.
    for limit in 4..=24 {
        let out = Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .args(["prlimit", &format!("--nproc={limit}")])
            .arg(env!("CARGO_BIN_EXE_polychip"))
            .args(["launch", "-n", "8", "--", "/bin/sleep", "0.2"])
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::null())
            .output()
            .expect("run setpriv");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("panicked") && out.status.code() != Some(101),
            "ulimit -u {limit}: {:?}\n{stderr}",
            out.status
        );
        if stderr.contains("could not start a thread to relay its output") {
            threads_refused += 1;
            assert_eq!(out.status.code(), Some(1), "{stderr}");
            assert!(stderr.contains("polychip launch: rank "), "{stderr}");
        }
        // The stopped ranks' processes are gone before the next limit.
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(threads_refused > 0, "no limit made a thread fail");
}

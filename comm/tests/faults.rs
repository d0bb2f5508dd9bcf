//! Failures across real processes: `launch` starts copies of this test
//! binary, each running only one `child_*` test (which does nothing under
//! the ordinary harness). Children ignore SIGTERM, so the launcher's stop
//! does not cut their report short, and write what they saw to a file in a
//! directory named after the test process (their parent). Checked: a rank
//! killed mid all-reduce (16 MiB, shared memory and TCP) surfaces on every
//! survivor as PeerLost/Timeout naming the operation and a rank within the
//! 5 s timeout, and the launcher names the killed rank; a rank that never
//! arrives makes the others' init time out naming it; mismatched sizes are
//! `Mismatch` on every rank. Every wait is bounded; launches run one at a
//! time.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use polychip_comm::CommError;
use polychip_comm::bootstrap::{InitOptions, Job, TransportKind, init_with};
use polychip_comm::collectives::{DType, ReduceOp};
use polychip_comm::env::RankInfo;
use polychip_comm::launch::{LaunchOptions, LaunchOutcome, launch};

const TIMEOUT: Duration = Duration::from_secs(5);
/// How long one launch may take before the test declares a hang.
const WATCHDOG: Duration = Duration::from_secs(60);
static SERIAL: Mutex<()> = Mutex::new(());

fn dir(parent: u32, name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("polychip-faults-{parent}-{name}"))
}

/// Runs `n` ranks of the test `child`; returns the outcome and each rank's
/// report (lines: error kind, milliseconds, message).
fn run(child: &str, n: usize) -> (LaunchOutcome, Vec<Vec<String>>) {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = dir(std::process::id(), child);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let exe = std::env::current_exe().unwrap();
    let args = [child, "--exact", "--quiet", "--test-threads=1"];
    let mut command = vec![exe.to_string_lossy().into_owned()];
    command.extend(args.iter().map(|a| a.to_string()));
    let mut opts = LaunchOptions::new(n, command);
    opts.grace = Duration::from_secs(20);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(launch(&opts)));
    let outcome = rx
        .recv_timeout(WATCHDOG)
        .unwrap_or_else(|_| panic!("{child}: the launch hung for {WATCHDOG:?}"))
        .unwrap();
    let reports = (0..n)
        .map(|r| {
            let text = std::fs::read_to_string(d.join(format!("rank{r}"))).unwrap_or_default();
            text.splitn(3, '\n').map(str::to_string).collect()
        })
        .collect();
    // A killed rank cannot remove its shared-memory files; the job's name
    // starts with rank 0's pid (see `shm::unique_job_name`).
    if let Ok(pid) = std::fs::read_to_string(d.join("pid0")) {
        let prefix = format!("polychip-{:x}-", pid.trim().parse::<u32>().unwrap_or(0));
        for entry in std::fs::read_dir("/dev/shm")
            .into_iter()
            .flatten()
            .flatten()
        {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir_all(&d);
    eprintln!("{child}: {}; reports {reports:?}", outcome.description);
    (outcome, reports)
}

/// In a launched child: this rank's info and report directory.
fn child(name: &str) -> Option<(RankInfo, PathBuf)> {
    if std::env::var("POLYCHIP_LAUNCHER").as_deref() != Ok("1") {
        return None;
    }
    // SAFETY: SIG_IGN is a valid disposition; no handler code runs.
    unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() } as u32;
    let (info, dir) = (polychip_comm::env::from_env().unwrap(), dir(parent, name));
    if info.rank == 0 {
        std::fs::write(dir.join("pid0"), std::process::id().to_string()).unwrap();
    }
    Some((info, dir))
}

fn report(dir: &std::path::Path, rank: usize, start: Instant, e: &CommError) {
    let kind = match e {
        CommError::PeerLost { .. } => "PeerLost",
        CommError::Timeout { .. } => "Timeout",
        CommError::Mismatch { .. } => "Mismatch",
        _ => "Other",
    };
    let ms = start.elapsed().as_millis();
    std::fs::write(
        dir.join(format!("rank{rank}")),
        format!("{kind}\n{ms}\n{e}"),
    )
    .unwrap();
}

fn start(info: &RankInfo, transport: TransportKind) -> Job {
    let mut options = InitOptions::from_env().unwrap();
    options.transport = Some(transport);
    options.timeout = TIMEOUT;
    init_with(info.clone(), options).unwrap()
}

/// The last rank kills itself (SIGKILL) during the second 16 MiB
/// all-reduce (or a later one); the others report the error they got. (At
/// 64 MiB the first all-reduce of this debug build could pass the 5 s
/// timeout on a loaded machine, and every rank ended without a kill.)
fn kill_mid_all_reduce(name: &str, transport: TransportKind) {
    let Some((info, dir)) = child(name) else {
        return;
    };
    let mut job = start(&info, transport);
    let victim = info.world_size - 1;
    let mut buf = vec![0u8; 16 << 20];
    let began = Instant::now();
    for i in 0.. {
        if i == 1 && info.rank == victim {
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_millis(30));
                // SAFETY: kill and getpid take and return plain integers.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            });
        }
        let t = Instant::now();
        if let Err(e) = job.all_reduce(&mut buf, DType::F32, ReduceOp::Sum) {
            return report(&dir, info.rank, t, &e);
        }
        assert!(began.elapsed() < Duration::from_secs(40), "no error seen");
    }
}

fn check_kill(name: &str, n: usize) {
    let (outcome, reports) = run(name, n);
    assert_eq!(outcome.failed_rank, Some(n - 1), "{outcome:?}");
    assert_eq!(outcome.signal, Some(libc::SIGKILL), "{outcome:?}");
    for (r, rep) in reports.iter().enumerate().take(n - 1) {
        assert_eq!(rep.len(), 3, "rank {r} reported nothing: {rep:?}");
        assert!(
            rep[0] == "PeerLost" || rep[0] == "Timeout",
            "rank {r}: {rep:?}"
        );
        let ms: u64 = rep[1].parse().unwrap();
        assert!(ms < 10_000, "rank {r} took {ms} ms: {rep:?}");
        assert!(rep[2].contains("all_reduce"), "rank {r}: {rep:?}");
        assert!(rep[2].contains(&format!("rank {r}:")), "rank {r}: {rep:?}");
        assert!(
            rep[2].contains("peer rank") || rep[2].contains("rank "),
            "{rep:?}"
        );
    }
}

#[test]
fn killed_rank_over_shm_fails_the_others() {
    check_kill("child_kill_shm", 3);
}

#[test]
fn child_kill_shm() {
    kill_mid_all_reduce("child_kill_shm", TransportKind::Shm);
}

#[test]
fn killed_rank_over_tcp_fails_the_others() {
    check_kill("child_kill_tcp", 3);
}

#[test]
fn child_kill_tcp() {
    kill_mid_all_reduce("child_kill_tcp", TransportKind::Tcp);
}

#[test]
fn a_rank_that_never_arrives_times_out_init() {
    let (outcome, reports) = run("child_absent", 3);
    assert!(outcome.success(), "{outcome:?}");
    for (r, rep) in reports.iter().enumerate().take(2) {
        assert_eq!(rep.len(), 3, "rank {r} reported nothing: {rep:?}");
        let ms: u64 = rep[1].parse().unwrap();
        assert!(ms < 15_000, "rank {r} took {ms} ms");
        // Rank 0 times out first and stops the store; rank 1 may see that
        // (sooner than its own timeout when it started later).
        let store_gone = r > 0 && rep[0] == "PeerLost" && rep[2].contains("rendezvous store");
        if !store_gone {
            assert!(ms >= 4_000, "rank {r} took {ms} ms");
            assert_eq!(rep[0], "Timeout", "rank {r}: {rep:?}");
            assert!(rep[2].contains("init"), "{rep:?}");
            assert!(rep[2].contains("rank 2 of 3 to join"), "{rep:?}");
        }
    }
}

#[test]
fn child_absent() {
    let Some((info, dir)) = child("child_absent") else {
        return;
    };
    if info.rank == 2 {
        return;
    }
    let mut options = InitOptions::from_env().unwrap();
    options.timeout = TIMEOUT;
    let t = Instant::now();
    let e = init_with(info.clone(), options).unwrap_err();
    report(&dir, info.rank, t, &e);
}

#[test]
fn mismatched_sizes_are_a_mismatch_on_every_rank() {
    let (outcome, reports) = run("child_mismatch", 2);
    assert!(outcome.success(), "{outcome:?}");
    for (r, rep) in reports.iter().enumerate() {
        assert_eq!(rep.len(), 3, "rank {r} reported nothing: {rep:?}");
        assert_eq!(rep[0], "Mismatch", "rank {r}: {rep:?}");
        assert!(rep[2].contains("all_reduce of 1000 x f32"), "{rep:?}");
        assert!(rep[2].contains("all_reduce of 2000 x f32"), "{rep:?}");
    }
}

#[test]
fn child_mismatch() {
    let Some((info, dir)) = child("child_mismatch") else {
        return;
    };
    let mut job = start(&info, TransportKind::Shm);
    let mut buf = vec![0u8; 4000 * (info.rank + 1)];
    let t = Instant::now();
    let e = job
        .all_reduce(&mut buf, DType::F32, ReduceOp::Sum)
        .unwrap_err();
    report(&dir, info.rank, t, &e);
}

//! The library side of `polychip launch -n N [--devices SPEC] -- CMD ...`,
//! a one-machine launcher like `torchrun --standalone`: it picks a free port
//! on 127.0.0.1, starts N copies of the command with the torchrun variables
//! (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`,
//! `MASTER_PORT`) plus `POLYCHIP_LAUNCHER=1`, the job's secret and id
//! (`POLYCHIP_JOB_SECRET`, `POLYCHIP_JOB_ID`: generated per job unless the
//! launcher's own environment sets them; see [`crate::auth`]) and, with a
//! device list, `POLYCHIP_DEVICE`; prefixes every line they print with `[rank K] `; and
//! when one rank fails, stops the others (SIGTERM to each rank's process
//! group, SIGKILL after a grace period) and reports that rank's failure.
//! SIGINT, SIGTERM and SIGHUP sent to the launcher while it runs are passed
//! on to every rank the same way. When the launcher's own standard output
//! fails (a closed pipe, as with `| head`, or a full disk), the ranks are
//! stopped the same way and the outcome says so
//! ([`LaunchOutcome::stdout_closed`]): their output would go nowhere.
//! Ranks' stdin is empty (`/dev/null`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{CommError, Result};
use crate::text::quoted;

/// What to launch.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// Number of ranks (processes) to start.
    pub nproc: usize,
    /// Devices, comma-separated, one per rank (`ferrite:0,ferrite:1`) or one
    /// for all; each rank gets its entry as `POLYCHIP_DEVICE`.
    pub devices: Option<String>,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// How long ranks being stopped get between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// How long the other ranks get, after one fails, to end on their own
    /// before they are sent SIGTERM. A failure often ends several ranks at
    /// once (one that cannot listen closes the rendezvous store, and its
    /// peers see it gone); this lets the rank with the cause finish saying
    /// it, rather than being stopped in the middle of its message.
    pub settle: Duration,
}

impl LaunchOptions {
    /// `nproc` ranks of `command`, no device list, half a second for the
    /// others to settle after a failure, a 5 s grace period.
    pub fn new(nproc: usize, command: Vec<String>) -> LaunchOptions {
        LaunchOptions {
            nproc,
            devices: None,
            command,
            grace: Duration::from_secs(5),
            settle: Duration::from_millis(500),
        }
    }
}

/// How a launch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchOutcome {
    /// 0 when every rank exited 0; the failing rank's exit code when it
    /// exited non-zero; 1 when it was killed by a signal; 128 + the signal
    /// when the launcher itself was interrupted.
    pub exit_code: i32,
    /// The rank whose failure ended the job, if any: the first seen, unless
    /// a rank killed by a signal from outside the job is seen after it.
    pub failed_rank: Option<usize>,
    /// The signal that killed the failing rank (or interrupted the
    /// launcher), if that is how it ended.
    pub signal: Option<i32>,
    /// One sentence: "all 4 ranks exited 0", "rank 1 exited with code 7",
    /// "rank 2 killed by signal 9".
    pub description: String,
    /// The launcher's standard output was closed (`EPIPE`) while relaying
    /// the ranks' output, so the ranks were stopped: a command-line tool
    /// ends quietly then, as Unix tools do (exit code 141, 128 + SIGPIPE).
    pub stdout_closed: bool,
}

impl LaunchOutcome {
    /// Whether every rank exited 0.
    pub fn success(&self) -> bool {
        self.exit_code == 0 && self.failed_rank.is_none()
    }
}

/// Splits a `--devices` list into one entry per rank: `nproc` entries, or
/// one entry given to every rank.
pub fn parse_devices(spec: &str, nproc: usize) -> Result<Vec<String>> {
    let entries: Vec<String> = spec.split(',').map(|s| s.trim().to_string()).collect();
    if entries.iter().any(String::is_empty) {
        return Err(CommError::Usage(format!(
            "--devices {} has an empty entry; give a comma-separated list like \
             ferrite:0,ferrite:1",
            quoted(spec)
        )));
    }
    match entries.len() {
        1 => Ok(vec![entries[0].clone(); nproc]),
        n if n == nproc => Ok(entries),
        n => Err(CommError::Usage(format!(
            "--devices {} has {n} entries but -n is {nproc}: give one device per rank, \
             or a single device for all ranks",
            quoted(spec)
        ))),
    }
}

/// A free TCP port on 127.0.0.1 (the OS's pick; free when we looked).
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).map_err(|e| CommError::Io {
        rank: 0,
        op: "launch".into(),
        message: format!("could not find a free port on 127.0.0.1: {e}"),
    })?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| CommError::Io {
            rank: 0,
            op: "launch".into(),
            message: format!("could not find a free port on 127.0.0.1: {e}"),
        })
}

/// Starts the ranks, forwards their output, and waits for them all.
/// `Ok` carries how the job ended (failed ranks included); `Err` means the
/// options were unusable or a rank could not be started.
pub fn launch(opts: &LaunchOptions) -> Result<LaunchOutcome> {
    if opts.nproc == 0 {
        return Err(CommError::Usage(
            "-n must be at least 1 (the number of ranks to start)".into(),
        ));
    }
    if opts.nproc > crate::env::MAX_WORLD_SIZE {
        return Err(CommError::Usage(format!(
            "-n is {}, more than the {} ranks a job may have",
            opts.nproc,
            crate::env::MAX_WORLD_SIZE
        )));
    }
    let Some(program) = opts.command.first() else {
        return Err(CommError::Usage(
            "no command to launch: give it after `--`, e.g. `polychip launch -n 2 -- python \
             train.py`"
                .into(),
        ));
    };
    let devices = match &opts.devices {
        Some(spec) => Some(parse_devices(spec, opts.nproc)?),
        None => None,
    };
    let port = free_port()?;
    // The secret is bytes, as the ranks read it (one that is not UTF-8 was
    // taken as unset and replaced by a new one until 2026-12-06); the job
    // id is text, and one that is not is refused naming it.
    let secret = match std::env::var_os(crate::auth::SECRET_VAR).filter(|v| !v.is_empty()) {
        Some(s) => s,
        None => crate::auth::hex(&crate::auth::random_bytes(16)?).into(),
    };
    let job_id = match crate::env::var(crate::auth::JOB_ID_VAR)?.filter(|v| !v.is_empty()) {
        Some(j) => j,
        None => crate::auth::hex(&crate::auth::random_bytes(8)?),
    };
    // A secret or a job id every rank would refuse is refused before any
    // starts, naming its variable.
    crate::auth::JobAuth::new(secret.as_encoded_bytes(), job_id.as_str())?;
    let signals = polychip_files::signals::SignalGuard::install();

    let (done_tx, done_rx) = mpsc::channel::<()>();
    // The raw OS error of the first failed write to our stdout (0: none).
    let out_failed = Arc::new(AtomicI32::new(0));
    let mut ranks: Vec<Rank> = Vec::with_capacity(opts.nproc);
    for rank in 0..opts.nproc {
        let mut cmd = Command::new(program);
        cmd.args(&opts.command[1..])
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", opts.nproc.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", opts.nproc.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("POLYCHIP_LAUNCHER", "1")
            .env(crate::auth::SECRET_VAR, &secret)
            .env(crate::auth::JOB_ID_VAR, &job_id)
            // In their own process groups, ranks reading the terminal would
            // be stopped (SIGTTIN) and hang the job: they read nothing.
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so stopping a rank stops what it started.
            .process_group(0);
        if let Some(devices) = &devices {
            cmd.env("POLYCHIP_DEVICE", &devices[rank]);
        }
        // Die with the launcher even if it is killed with SIGKILL.
        polychip_files::die_with_parent(&mut cmd, libc::SIGTERM);
        match cmd.spawn() {
            Ok(mut child) => {
                let mut readers = Vec::with_capacity(2);
                let mut relayed = Ok(());
                if let Some(out) = child.stdout.take() {
                    match forward(rank, out, false, done_tx.clone(), &out_failed) {
                        Ok(r) => readers.push(r),
                        Err(e) => relayed = Err(e),
                    }
                }
                if relayed.is_ok()
                    && let Some(err) = child.stderr.take()
                {
                    match forward(rank, err, true, done_tx.clone(), &out_failed) {
                        Ok(r) => readers.push(r),
                        Err(e) => relayed = Err(e),
                    }
                }
                ranks.push(Rank {
                    child,
                    status: None,
                    readers,
                });
                // A thread the system refuses (too many processes and
                // threads for the user): the job stops as when a rank
                // cannot be started (until 2026-12-06 the launcher
                // panicked, "failed to spawn thread", exit 101).
                if let Err(e) = relayed {
                    stop_all(&mut ranks, libc::SIGTERM, opts.grace);
                    drop(signals);
                    return Err(CommError::Io {
                        rank,
                        op: "launch".into(),
                        message: format!("could not start a thread to relay its output: {e}"),
                    });
                }
            }
            Err(e) => {
                stop_all(&mut ranks, libc::SIGTERM, opts.grace);
                drop(signals);
                return Err(CommError::Io {
                    rank,
                    op: "launch".into(),
                    message: format!("could not start {}: {e}", quoted(program)),
                });
            }
        }
    }
    drop(done_tx);

    let launched = Instant::now();
    let mut failure: Option<(usize, ExitStatus)> = None;
    let mut interrupted: Option<i32> = None;
    let mut output_error: Option<std::io::Error> = None;
    let mut kill_at: Option<Instant> = None;
    let mut failed_at: Option<Instant> = None;
    // Whether the launcher has signalled the ranks itself: after that, a
    // rank killed by a signal says nothing about the cause.
    let mut stopping = false;
    loop {
        let mut running = 0;
        for (rank, r) in ranks.iter_mut().enumerate() {
            if r.status.is_some() {
                continue;
            }
            match r.child.try_wait() {
                Ok(Some(status)) => {
                    r.status = Some(status);
                    if interrupted.is_none() && takes_the_blame(failure, status, stopping) {
                        failure = Some((rank, status));
                    }
                }
                Ok(None) => running += 1,
                Err(e) => {
                    log::warn!("polychip launch: cannot wait for rank {rank}: {e}");
                    running += 1;
                }
            }
        }
        if running == 0 {
            break;
        }
        let caught = signals.caught();
        if caught != 0 && interrupted.is_none() {
            interrupted = Some(caught);
            signal_all(&ranks, caught);
            stopping = true;
            kill_at = Some(Instant::now() + opts.grace);
        }
        let failed = out_failed.load(Ordering::SeqCst);
        if failed != 0 && output_error.is_none() && interrupted.is_none() && failure.is_none() {
            // Nobody reads the ranks' output any more: stop them rather
            // than let them run on (or block) for nothing.
            output_error = Some(std::io::Error::from_raw_os_error(failed));
            signal_all(&ranks, libc::SIGTERM);
            stopping = true;
            kill_at = Some(Instant::now() + opts.grace);
        }
        if failure.is_some() && failed_at.is_none() {
            failed_at = Some(Instant::now());
        }
        if failed_at.is_some_and(|t| t.elapsed() >= opts.settle) && kill_at.is_none() {
            signal_all(&ranks, libc::SIGTERM);
            stopping = true;
            kill_at = Some(Instant::now() + opts.grace);
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            signal_all(&ranks, libc::SIGKILL);
            kill_at = Some(Instant::now() + Duration::from_secs(3600));
        }
        std::thread::sleep(watch_interval(launched.elapsed()));
    }
    if failure.is_some() || interrupted.is_some() || output_error.is_some() {
        // Whatever the ranks started is stopped too.
        signal_all(&ranks, libc::SIGKILL);
    }
    drop(signals);

    // Let the readers print what is left. A grandchild that left its
    // rank's process group may hold a pipe open; do not wait for it long.
    let readers: Vec<JoinHandle<()>> = ranks.iter_mut().flat_map(|r| r.readers.drain(..)).collect();
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut finished = 0;
    while finished < readers.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        match done_rx.recv_timeout(left) {
            Ok(()) => finished += 1,
            Err(_) => break,
        }
    }
    for handle in readers {
        if handle.is_finished() {
            let _ = handle.join();
        }
    }

    // A write that failed after the ranks had exited (their last lines).
    let failed = out_failed.load(Ordering::SeqCst);
    if failed != 0 && output_error.is_none() && interrupted.is_none() && failure.is_none() {
        output_error = Some(std::io::Error::from_raw_os_error(failed));
    }
    if let Some(e) = output_error {
        let closed = e.kind() == std::io::ErrorKind::BrokenPipe;
        return Ok(LaunchOutcome {
            exit_code: if closed { 128 + libc::SIGPIPE } else { 1 },
            failed_rank: None,
            signal: None,
            description: match closed {
                true => format!(
                    "standard output was closed; stopped all {} ranks",
                    opts.nproc
                ),
                false => format!(
                    "cannot write the ranks' output to standard output: {e}; stopped all {} ranks",
                    opts.nproc
                ),
            },
            stdout_closed: closed,
        });
    }
    Ok(outcome(opts.nproc, failure, interrupted))
}

/// Whether a rank that ended with `status` is the job's cause rather than
/// `cause`, the one blamed so far. The first failure seen is the cause,
/// with one exception: a rank killed by a signal from outside the job (a
/// kill, a terminal's or a batch system's stop; one the launcher did not
/// send itself, `stopping` false) takes the blame from a rank that exited
/// with a code, which may be reporting that this peer is gone: the
/// launcher polls every 10 ms, and on a loaded machine it can find both
/// ended in one poll, or the reporter first. A signal a rank raises itself
/// (an abort, a segmentation fault) may be how it reports a peer gone, and
/// takes no blame.
fn takes_the_blame(cause: Option<(usize, ExitStatus)>, status: ExitStatus, stopping: bool) -> bool {
    if status.success() {
        return false;
    }
    match cause {
        None => true,
        Some((_, blamed)) => {
            let external = matches!(
                status.signal(),
                Some(libc::SIGKILL | libc::SIGTERM | libc::SIGINT | libc::SIGHUP | libc::SIGQUIT)
            );
            !stopping && external && blamed.signal().is_none()
        }
    }
}

fn outcome(
    nproc: usize,
    failure: Option<(usize, ExitStatus)>,
    interrupted: Option<i32>,
) -> LaunchOutcome {
    if let Some(sig) = interrupted {
        return LaunchOutcome {
            exit_code: 128 + sig,
            failed_rank: None,
            signal: Some(sig),
            description: format!("interrupted by signal {sig}; stopped all {nproc} ranks"),
            stdout_closed: false,
        };
    }
    match failure {
        None => LaunchOutcome {
            exit_code: 0,
            failed_rank: None,
            signal: None,
            description: if nproc == 1 {
                "the rank exited 0".to_string()
            } else {
                format!("all {nproc} ranks exited 0")
            },
            stdout_closed: false,
        },
        Some((rank, status)) => match (status.code(), status.signal()) {
            (Some(code), _) => LaunchOutcome {
                exit_code: code,
                failed_rank: Some(rank),
                signal: None,
                description: format!("rank {rank} exited with code {code}"),
                stdout_closed: false,
            },
            (None, sig) => LaunchOutcome {
                exit_code: 1,
                failed_rank: Some(rank),
                signal: sig,
                description: match sig {
                    Some(sig) => format!("rank {rank} killed by signal {sig}"),
                    None => format!("rank {rank} failed ({status})"),
                },
                stdout_closed: false,
            },
        },
    }
}

#[derive(Debug)]
struct Rank {
    child: Child,
    status: Option<ExitStatus>,
    readers: Vec<JoinHandle<()>>,
}

/// How long the launcher sleeps between looks at its ranks, `elapsed`
/// after starting them: 10 ms for the first 2 s (a short job, or a rank
/// failing at start, is seen at once), then 100 ms. It slept 10 ms all
/// job long until stop 48: 100 wake-ups a second on the ranks' cores
/// (the launcher is not bound), each preempting a rank's compute thread.
fn watch_interval(elapsed: Duration) -> Duration {
    match elapsed < Duration::from_secs(2) {
        true => Duration::from_millis(10),
        false => Duration::from_millis(100),
    }
}

/// Sends `sig` to every rank's process group (ranks that exited included:
/// what they started may still run).
fn signal_all(ranks: &[Rank], sig: i32) {
    for r in ranks {
        let Ok(pgid) = libc::pid_t::try_from(r.child.id()) else {
            continue;
        };
        // SAFETY: kill takes plain integers; a negative pid names the
        // process group the child leads (set up with process_group(0)).
        // Errors (no such group any more) are harmless and ignored.
        unsafe {
            libc::kill(-pgid, sig);
        }
    }
}

/// Stops ranks already started (when a later one could not start).
fn stop_all(ranks: &mut [Rank], sig: i32, grace: Duration) {
    signal_all(ranks, sig);
    let deadline = Instant::now() + grace;
    for r in ranks.iter_mut() {
        while Instant::now() < deadline {
            if let Ok(Some(_)) = r.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    signal_all(ranks, libc::SIGKILL);
    for r in ranks.iter_mut() {
        let _ = r.child.wait();
    }
}

/// Copies `from` line by line to our stdout (or stderr) with a
/// `[rank K] ` prefix, each line in one locked write so lines of different
/// ranks never mix. Signals `done` at end of stream. A failed write to our
/// stdout is recorded in `failed` (its OS error; the launch then stops the
/// ranks), and the rest of the stream is drained so no rank blocks on a
/// full pipe meanwhile.
/// The longest piece of a rank's output line the launcher holds before it
/// passes it on (64 KiB).
const MAX_LINE: u64 = 64 << 10;

fn forward(
    rank: usize,
    from: impl Read + Send + 'static,
    to_stderr: bool,
    done: mpsc::Sender<()>,
    failed: &Arc<AtomicI32>,
) -> std::io::Result<JoinHandle<()>> {
    let failed = Arc::clone(failed);
    std::thread::Builder::new().spawn(move || {
        let prefix = format!("[rank {rank}] ");
        let mut reader = BufReader::new(from);
        let mut line = Vec::new();
        let mut out = Vec::new();
        loop {
            line.clear();
            // A line is passed on in pieces of at most MAX_LINE bytes, each
            // with the prefix: a rank writing without newlines (`cat
            // /dev/zero`) took the launcher's memory without bound.
            match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            out.clear();
            out.extend_from_slice(prefix.as_bytes());
            out.extend_from_slice(&line);
            if !line.ends_with(b"\n") {
                out.push(b'\n');
            }
            let written = if to_stderr {
                let mut e = std::io::stderr().lock();
                e.write_all(&out).and_then(|()| e.flush())
            } else {
                let mut o = std::io::stdout().lock();
                o.write_all(&out).and_then(|()| o.flush())
            };
            if let Err(e) = written {
                if !to_stderr {
                    let code = e.raw_os_error().unwrap_or(libc::EIO);
                    let _ = failed.compare_exchange(0, code, Ordering::SeqCst, Ordering::SeqCst);
                }
                // Our own output is gone; keep draining so the rank does
                // not block on a full pipe.
                let _ = std::io::copy(&mut reader, &mut std::io::sink());
                break;
            }
        }
        let _ = done.send(());
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_lists() {
        assert_eq!(parse_devices("ferrite:0", 3).unwrap(), vec!["ferrite:0"; 3]);
        assert_eq!(
            parse_devices("ferrite:0, ferrite:1,cobalt:0", 3).unwrap(),
            vec!["ferrite:0", "ferrite:1", "cobalt:0"]
        );
        let err = parse_devices("a,b", 3).unwrap_err().to_string();
        assert!(err.contains("has 2 entries but -n is 3"), "{err}");
        assert!(parse_devices("a,,b", 3).is_err());
    }

    #[test]
    fn a_device_list_is_quoted_escaped_and_cut() {
        let err = parse_devices("a\u{1b}[2J,b", 3).unwrap_err().to_string();
        assert!(
            err.contains(r#"--devices "a\u{1b}[2J,b" has 2 entries"#),
            "{err}"
        );
        let long = format!("{},", "x".repeat(100_000));
        let err = parse_devices(&long, 3).unwrap_err().to_string();
        assert!(err.contains("… (100001 bytes) has an empty entry"), "{err}");
        assert!(err.len() < 400, "{} bytes", err.len());
    }

    #[test]
    fn outcomes() {
        let ok = outcome(2, None, None);
        assert!(ok.success());
        assert_eq!(ok.description, "all 2 ranks exited 0");
        let failed = outcome(3, Some((1, ExitStatus::from_raw(7 << 8))), None);
        assert_eq!((failed.exit_code, failed.failed_rank), (7, Some(1)));
        assert_eq!(failed.description, "rank 1 exited with code 7");
        let killed = outcome(3, Some((2, ExitStatus::from_raw(9))), None);
        assert_eq!((killed.exit_code, killed.signal), (1, Some(9)));
        assert_eq!(killed.description, "rank 2 killed by signal 9");
    }

    #[test]
    fn a_signal_from_outside_takes_the_blame_from_a_rank_reporting_it() {
        let code = ExitStatus::from_raw(2 << 8);
        let killed = ExitStatus::from_raw(9);
        let ok = ExitStatus::from_raw(0);
        assert!(takes_the_blame(None, code, false));
        assert!(!takes_the_blame(None, ok, false));
        // Rank 0 said "peer rank 1 is gone" and was seen first.
        assert!(takes_the_blame(Some((0, code)), killed, false));
        // Once the launcher stops the ranks, their signals are its own.
        assert!(!takes_the_blame(Some((0, code)), killed, true));
        // The first of two failures of the same kind stays the cause.
        assert!(!takes_the_blame(Some((0, code)), code, false));
        // A rank that aborts (a signal of its own) after its peer exited
        // with the cause takes no blame.
        assert!(!takes_the_blame(
            Some((1, code)),
            ExitStatus::from_raw(6),
            false
        ));
        assert!(!takes_the_blame(Some((0, killed)), killed, false));
    }
}

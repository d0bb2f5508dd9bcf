//! `polychip train --plan auto` profiles each device in a process of its
//! own, bound as its rank will be: one `polychip profile-worker` child per
//! device, each bound to the share of the cores its rank will get before it
//! loads any plugin (so a plugin's thread pool starts there, as in the
//! rank), all profiling at once so that each is timed beside the others.
//!
//! Threads of one process are not ranks: a plugin that runs its kernels on
//! a process-wide pool (PoCL) runs them wherever the pool was started, and
//! a profile timed there misjudges the devices that share a core in the
//! job (docs/performance.md, "Which devices share a core").
//!
//! The protocol, one JSON object per line: the parent writes the job to
//! the child's stdin; the child answers `ready` once its device is found,
//! waits for `go`, profiles round after round ([`auto::profile_rounds`]),
//! says `round` once it has finished a round that ended at least
//! [`auto::MIN_PROFILE`] after `go`, and on `stop` (sent once every child
//! has said `round`; or on end of input: a parent that is gone) finishes
//! the size at hand and answers `done` with its measurements, each marked
//! with whether it ended before the stop. Any failure is an `error` with a
//! message; the parent then stops every child and names the device.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::{Duration, Instant};

use polychip_host::Device;
use polychip_train::auto::{self, Profile};
use polychip_train::config::{ModelConfig, TrainConfig};
use polychip_train::error::TrainError;
use polychip_train::pin;
use polychip_train::trainer::device_name;
use serde::{Deserialize, Serialize};

/// What a worker profiles.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Job {
    model: ModelConfig,
    train: TrainConfig,
    /// `vendor:index`.
    device: String,
    sizes: Vec<usize>,
    /// Where to bind before loading the plugins; none: unbound.
    cores: Option<Vec<usize>>,
}

/// What a worker says, one per line of its stdout.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
enum Event {
    Ready,
    Round,
    Done {
        /// Each measurement, and whether it ended before the stop.
        measured: Vec<(Profile, bool)>,
    },
    Error {
        message: String,
    },
}

/// The longest line either side reads: a job, or a worker's measurements
/// (a few hundred bytes each, a few hundred of them at most).
const MAX_LINE: u64 = 16 << 20;

/// How every event begins (serde writes the tag first).
const EVENT: &str = "{\"event\":";

/// How long a worker may take to load the plugins and find its device.
const START_DEADLINE: Duration = Duration::from_secs(120);

/// One line of `r`, at most [`MAX_LINE`] bytes; `None` at the end of input.
fn read_line(r: &mut impl BufRead) -> std::io::Result<Option<String>> {
    let mut line = String::new();
    let n = r.by_ref().take(MAX_LINE).read_line(&mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if !line.ends_with('\n') && n as u64 == MAX_LINE {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a line longer than {MAX_LINE} bytes"),
        ));
    }
    Ok(Some(line.trim_end().to_string()))
}

/// A worker's line as the plugin's own output and the event after it, if
/// any (a plugin's unfinished output may precede an event on its line).
fn split_event(line: &str) -> (&str, Option<&str>) {
    match line.find(EVENT) {
        Some(at) => (&line[..at], Some(&line[at..])),
        None => (line, None),
    }
}

/// A plugin's own output on a worker's standard output as the parent
/// relays it to its standard error: after the worker's name, with control
/// and bidirectional characters escaped and cut after 1,000 characters (a
/// line may be 16 MiB; until 2026-12-06 it was relayed as it was, terminal
/// escapes and all).
fn relayed(name: &str, own: &str) -> String {
    format!("{name}: {}", polychip_files::printable_lines(own))
}

fn say(event: &Event) {
    let mut out = std::io::stdout().lock();
    // A parent that is gone reads nothing: nothing to report to.
    let _ = writeln!(
        out,
        "{}",
        serde_json::to_string(event).expect("events serialize")
    );
    let _ = out.flush();
}

/// Runs `polychip profile-worker` (internal): the child side.
pub fn worker() -> ExitCode {
    match work() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            say(&Event::Error { message });
            ExitCode::from(2)
        }
    }
}

fn work() -> Result<(), String> {
    let mut input = BufReader::new(std::io::stdin());
    let line = read_line(&mut input)
        .map_err(|e| format!("reading the job: {e}"))?
        .ok_or("no job on standard input (this command is run by polychip train)")?;
    let job: Job = serde_json::from_str(&line).map_err(|e| format!("the job: {e}"))?;
    job.model
        .validate()
        .map_err(|e| format!("the job's model: {e}"))?;
    job.train.validate().map_err(|e| e.to_string())?;
    if job.sizes.is_empty() || job.sizes.iter().any(|&b| !(1..=1024).contains(&b)) {
        return Err(format!(
            "the job's micro-batch sizes {:?} are not sizes from 1 to 1024",
            job.sizes
        ));
    }
    // Bound before any plugin starts a thread, as the rank will be.
    if let Some(cores) = &job.cores {
        crate::train::pin_to(cores).map_err(|e| e.to_string())?;
    }
    let rt = crate::devices::runtime_from_env()?;
    let device = rt
        .devices()
        .iter()
        .find(|d| device_name(d) == job.device)
        .ok_or_else(|| format!("no device {} among the plugins' devices", job.device))?;
    say(&Event::Ready);
    match read_line(&mut input).map_err(|e| format!("waiting to start: {e}"))? {
        Some(go) if go == "go" => {}
        // The parent gave up before the start.
        _ => return Ok(()),
    }
    let stopped_at: Arc<OnceLock<Instant>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    {
        let (stopped_at, stop) = (stopped_at.clone(), stop.clone());
        polychip_files::threads::spawn("wait for the word to stop", move || {
            // "stop", anything else, or the end of input (a parent that is
            // gone): stop after the size at hand.
            let _ = read_line(&mut input);
            let _ = stopped_at.set(Instant::now());
            stop.store(true, Ordering::Release);
        })
        .map_err(|e| e.to_string())?;
    }
    let measured = auto::profile_rounds(
        &job.model,
        &job.train,
        device,
        &job.sizes,
        Instant::now(),
        &|| stop.load(Ordering::Acquire),
        &mut || say(&Event::Round),
    )
    .map_err(|e| e.to_string())?;
    let stopped_at = stopped_at.get().copied();
    let measured = measured
        .into_iter()
        .map(|(p, at)| (p, stopped_at.is_none_or(|s| at <= s)))
        .collect();
    say(&Event::Done { measured });
    Ok(())
}

/// The workers of one profile; killed if dropped before they finish.
struct Workers {
    children: Vec<Child>,
    inputs: Vec<Option<ChildStdin>>,
}

impl Workers {
    /// Writes `line` to every worker still listening.
    fn tell(&mut self, line: &str) {
        for input in &mut self.inputs {
            if let Some(w) = input
                && writeln!(w, "{line}").and_then(|_| w.flush()).is_err()
            {
                // Gone: its reader reports how.
                *input = None;
            }
        }
    }
}

impl Workers {
    /// How worker `i` ended (` (exit status: ...)`), when it has within a
    /// second; empty if it has not.
    fn exit(&mut self, i: usize) -> String {
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.children[i].try_wait() {
                return format!(" ({status})");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        String::new()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Profiles each of `devices` on `cfg` at every size of `sizes`, each in
/// a `polychip profile-worker` process of its own, bound (with `cores`)
/// to the share of `cores` its rank will get (by its place in `devices`,
/// as the plan's `core_order` records it), all at once; returns one
/// profile per kind and size ([`auto::kind_medians`]).
pub fn profile(
    cfg: &ModelConfig,
    t: &TrainConfig,
    devices: &[Device],
    sizes: &[usize],
    cores: Option<&[usize]>,
) -> Result<Vec<Profile>, TrainError> {
    let exe = std::env::current_exe().map_err(|e| TrainError::io("polychip", e))?;
    let n = devices.len();
    let names: Vec<String> = devices.iter().map(device_name).collect();
    let failed = |i: usize, why: &str| {
        TrainError::Plan(format!(
            "profiling {} in a process of its own: {why}",
            names[i]
        ))
    };
    let (events, inbox) = mpsc::channel::<(usize, Result<Event, String>)>();
    let mut workers = Workers {
        children: Vec::new(),
        inputs: Vec::new(),
    };
    for (i, name) in names.iter().enumerate() {
        let mut cmd = Command::new(&exe);
        cmd.arg("profile-worker")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // Killed with the command (it profiled on to the end of its job).
        polychip_files::die_with_parent(&mut cmd, 9);
        let mut child = cmd.spawn().map_err(|e| {
            failed(
                i,
                &format!("starting {}: {e}", polychip_files::shown_path(&exe)),
            )
        })?;
        let stdout = child.stdout.take().expect("piped");
        let mut stdin = child.stdin.take();
        workers.children.push(child);
        let job = Job {
            model: cfg.clone(),
            train: t.clone(),
            device: name.clone(),
            sizes: sizes.to_vec(),
            cores: cores.map(|c| pin::share(c, i, n)),
        };
        let line = serde_json::to_string(&job).expect("jobs serialize");
        if let Some(w) = &mut stdin
            && writeln!(w, "{line}").and_then(|_| w.flush()).is_err()
        {
            stdin = None;
        }
        workers.inputs.push(stdin);
        let events = events.clone();
        // Refused, the workers started so far are killed (`Workers`' drop)
        // and their relays end with their output.
        let relay = format!("relay {name}'s profile");
        let name = name.clone();
        polychip_files::threads::spawn(&relay, move || {
            let mut out = BufReader::new(stdout);
            loop {
                let event = match read_line(&mut out) {
                    // A plugin's own output (some print to stdout), which
                    // may also precede an event on its line.
                    Ok(Some(line)) => {
                        let (own, event) = split_event(&line);
                        if !own.is_empty() {
                            eprintln!("{}", relayed(&name, own));
                        }
                        let Some(event) = event else { continue };
                        serde_json::from_str::<Event>(event).map_err(|e| {
                            format!("it said something unreadable ({e}): {event:.200}")
                        })
                    }
                    Ok(None) => Err("it ended without its measurements".into()),
                    Err(e) => Err(format!("reading it: {e}")),
                };
                let last = !matches!(event, Ok(Event::Ready | Event::Round));
                if events.send((i, event)).is_err() || last {
                    return;
                }
            }
        })
        .map_err(|e| failed(i, &e.to_string()))?;
    }
    drop(events);
    let mut ready = vec![false; n];
    let mut rounds = 0;
    let mut done: Vec<Option<Vec<(Profile, bool)>>> = vec![None; n];
    let deadline = Instant::now() + START_DEADLINE;
    while done.iter().any(Option::is_none) {
        let next = match ready.contains(&false) {
            true => inbox.recv_timeout(deadline.saturating_duration_since(Instant::now())),
            false => inbox
                .recv()
                .map_err(|_| mpsc::RecvTimeoutError::Disconnected),
        };
        let (i, event) = match next {
            Ok(e) => e,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let late = ready.iter().position(|r| !r).unwrap_or(0);
                return Err(failed(
                    late,
                    &format!(
                        "it did not load the plugins and find its device within {} s",
                        START_DEADLINE.as_secs()
                    ),
                ));
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(TrainError::Plan(
                    "profiling the devices in processes of their own: every worker ended \
                     without its measurements"
                        .into(),
                ));
            }
        };
        match event {
            Ok(Event::Ready) => {
                ready[i] = true;
                if !ready.contains(&false) {
                    workers.tell("go");
                }
            }
            Ok(Event::Round) => {
                rounds += 1;
                if rounds == n {
                    workers.tell("stop");
                }
            }
            Ok(Event::Done { measured }) => done[i] = Some(measured),
            Ok(Event::Error { message }) => return Err(failed(i, &message)),
            Err(why) => return Err(failed(i, &format!("{why}{}", workers.exit(i)))),
        }
    }
    for (i, c) in workers.children.iter_mut().enumerate() {
        match c.wait() {
            Ok(s) if s.success() => {}
            Ok(s) => return Err(failed(i, &format!("it exited with {s}"))),
            Err(e) => return Err(failed(i, &e.to_string())),
        }
    }
    workers.children.clear();
    let measured: Vec<(Profile, bool)> = done.into_iter().flatten().flatten().collect();
    auto::kind_medians(devices, sizes, &measured)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_found_after_a_plugins_unfinished_output() {
        assert_eq!(
            split_event("{\"event\":\"ready\"}"),
            ("", Some("{\"event\":\"ready\"}"))
        );
        assert_eq!(
            split_event("loading kernels...{\"event\":\"round\"}"),
            ("loading kernels...", Some("{\"event\":\"round\"}"))
        );
        assert_eq!(
            split_event("plugin says hello"),
            ("plugin says hello", None)
        );
        let (_, event) = split_event("x{\"event\":\"round\"}");
        assert!(matches!(
            serde_json::from_str(event.unwrap()),
            Ok(Event::Round)
        ));
    }

    #[test]
    fn a_plugins_own_output_is_relayed_escaped_and_cut() {
        let line = format!("\u{1b}]0;title\u{7}\u{202e}{}", "y".repeat(5000));
        let out = relayed("cobalt:0", &line);
        assert!(
            out.starts_with("cobalt:0: \\u{1b}]0;title\\u{7}\\u{202e}yyy"),
            "{out}"
        );
        assert!(
            !out.chars().any(|c| c.is_control() || c == '\u{202e}'),
            "{out}"
        );
        assert!(out.ends_with("more characters)"), "{out}");
        assert!(out.len() < 1200, "{} bytes", out.len());
    }
}

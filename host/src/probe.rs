//! Loading plugins in child processes first, so that one that crashes or
//! hangs while loading costs a line in a report instead of the process.
//!
//! A plugin's initialisers and entry function run inside whatever process
//! loads it: a segfault, an `abort()`, a truncated file (SIGBUS when the
//! loader touches the missing pages) or an endless loop there takes the
//! process with it. A [`Probe`] names a program that loads one plugin file
//! and exits (the `polychip` command's hidden `devices --probe FILE`); it is
//! run on every file, up to [`MAX_AT_ONCE`] at a time, each with a deadline
//! ([`LOAD_TIMEOUT_VAR`], default [`DEFAULT_LOAD_TIMEOUT`]). Files whose probe
//! was killed by a signal or ran past the deadline are reported as load
//! failures naming the file; the others are then loaded in-process, where
//! a clean refusal (a wrong ABI version, a missing symbol) is reported as
//! usual.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::error::HostError;

/// The environment variable that sets how long a plugin may take to load in
/// its probe process, in seconds (a positive decimal number).
pub const LOAD_TIMEOUT_VAR: &str = "POLYCHIP_PLUGIN_LOAD_TIMEOUT_SECS";
/// How long a plugin may take to load when [`LOAD_TIMEOUT_VAR`] is unset.
pub const DEFAULT_LOAD_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest deadline [`LOAD_TIMEOUT_VAR`] accepts (one day).
pub const MAX_LOAD_TIMEOUT_SECS: f64 = 86_400.0;
/// The most probe processes run at once; the rest wait for a free slot.
pub const MAX_AT_ONCE: usize = 16;
/// The exit status of a probe whose plugin was refused cleanly (the parent
/// then loads it in-process to get the refusal's details).
pub const REFUSED_EXIT: i32 = 3;

/// Parses a deadline in seconds as [`LOAD_TIMEOUT_VAR`] gives it.
pub fn parse_timeout(value: &str) -> Result<Duration, String> {
    let seconds: f64 = value.trim().parse().map_err(|_| {
        format!("{LOAD_TIMEOUT_VAR}={value:?} is not a number of seconds (e.g. 10 or 2.5)")
    })?;
    if !(seconds > 0.0 && seconds <= MAX_LOAD_TIMEOUT_SECS) {
        return Err(format!(
            "{LOAD_TIMEOUT_VAR}={value:?} must be more than 0 and at most {MAX_LOAD_TIMEOUT_SECS} seconds"
        ));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// The deadline [`LOAD_TIMEOUT_VAR`] sets, or the default when it is unset.
pub fn load_timeout() -> Result<Duration, String> {
    match std::env::var(LOAD_TIMEOUT_VAR) {
        Ok(value) => parse_timeout(&value),
        Err(std::env::VarError::NotPresent) => Ok(DEFAULT_LOAD_TIMEOUT),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(format!("{LOAD_TIMEOUT_VAR} is not valid UTF-8"))
        }
    }
}

/// A program that loads one plugin file, given as its last argument, and
/// exits 0 when it loaded, [`REFUSED_EXIT`] when it was refused cleanly.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The program.
    pub program: PathBuf,
    /// Its arguments before the plugin file.
    pub args: Vec<OsString>,
    /// How long one file may take.
    pub timeout: Duration,
}

/// The name of a signal, for messages.
fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGABRT => "SIGABRT",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGSYS => "SIGSYS",
        _ => "a signal",
    }
}

/// How a probe that did not exit 0 or [`REFUSED_EXIT`] ended, in words.
fn how_it_ended(status: ExitStatus) -> String {
    match (status.signal(), status.code()) {
        (Some(signal), _) => format!("signal {signal}, {}", signal_name(signal)),
        (None, Some(code)) => format!("the probe process exited with status {code}"),
        (None, None) => format!("the probe process ended: {status}"),
    }
}

impl Probe {
    /// A probe running `program args... FILE` with the deadline from the
    /// environment ([`LOAD_TIMEOUT_VAR`]).
    pub fn from_env(program: PathBuf, args: Vec<OsString>) -> Result<Probe, String> {
        Ok(Probe {
            program,
            args,
            timeout: load_timeout()?,
        })
    }

    fn spawn(&self, file: &Path) -> std::io::Result<Child> {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .arg(file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // A plugin that hangs while loading does not outlive the command
        // that probes it.
        polychip_files::die_with_parent(&mut cmd, 9);
        cmd.spawn()
    }

    /// Loads each of `files` in its own child process, several at once
    /// (at most [`MAX_AT_ONCE`]), and says for each whether loading it in
    /// this process is safe: `Ok` when its probe exited (the plugin loaded
    /// or was refused cleanly), the crash or the deadline otherwise. Each
    /// child gets the whole deadline from its own start.
    pub fn check(&self, files: &[PathBuf]) -> Vec<Result<(), HostError>> {
        let mut results: Vec<Option<Result<(), HostError>>> = vec![None; files.len()];
        let mut running: Vec<(usize, Child, Instant)> = Vec::new();
        let mut next = 0;
        let mut pause = Duration::from_millis(1);
        loop {
            while running.len() < MAX_AT_ONCE && next < files.len() {
                match self.spawn(&files[next]) {
                    Ok(child) => running.push((next, child, Instant::now())),
                    Err(e) => {
                        results[next] = Some(Err(HostError::Usage(format!(
                            "{}: cannot start {} to load it in a child process: {e}",
                            files[next].display(),
                            self.program.display()
                        ))))
                    }
                }
                next += 1;
            }
            if running.is_empty() {
                break;
            }
            let mut i = 0;
            let mut finished = false;
            while i < running.len() {
                let (index, child, started) = &mut running[i];
                let file = &files[*index];
                let outcome = match child.try_wait() {
                    Ok(Some(status)) => Some(judge(file, status)),
                    Ok(None) if started.elapsed() >= self.timeout => {
                        let _ = child.kill();
                        let _ = child.wait();
                        Some(Err(HostError::LoadTimedOut {
                            path: file.clone(),
                            seconds: self.timeout.as_secs_f64(),
                        }))
                    }
                    Ok(None) => None,
                    Err(e) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        Some(Err(HostError::Usage(format!(
                            "{}: cannot wait for its probe process: {e}",
                            file.display()
                        ))))
                    }
                };
                match outcome {
                    Some(result) => {
                        results[*index] = Some(result);
                        running.swap_remove(i);
                        finished = true;
                    }
                    None => i += 1,
                }
            }
            if finished {
                pause = Duration::from_millis(1);
            } else {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every probe was judged"))
            .collect()
    }
}

fn judge(file: &Path, status: ExitStatus) -> Result<(), HostError> {
    match status.code() {
        Some(0) | Some(REFUSED_EXIT) => Ok(()),
        _ => Err(HostError::LoadCrashed {
            path: file.to_path_buf(),
            reason: how_it_ended(status),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse_and_nonsense_is_refused_naming_the_variable() {
        assert_eq!(parse_timeout("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_timeout(" 2.5 "), Ok(Duration::from_millis(2500)));
        for bad in ["abc", "", "0", "-1", "inf", "NaN", "1e9"] {
            let e = parse_timeout(bad).unwrap_err();
            assert!(e.contains(LOAD_TIMEOUT_VAR), "{e}");
        }
    }

    fn sh(script: &str, timeout: Duration) -> Probe {
        Probe {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into(), "sh".into()],
            timeout,
        }
    }

    #[test]
    fn exits_pass_signals_and_hangs_are_named() {
        let files = [PathBuf::from("/p/a.so")];
        let ok = sh("exit 0", Duration::from_secs(5)).check(&files);
        assert!(ok[0].is_ok());
        let refused = sh("exit 3", Duration::from_secs(5)).check(&files);
        assert!(refused[0].is_ok());
        let crashed = sh("kill -SEGV $$", Duration::from_secs(5)).check(&files);
        let e = crashed[0].as_ref().unwrap_err().to_string();
        assert!(
            e.contains("/p/a.so: the plugin crashed while loading (signal 11, SIGSEGV)"),
            "{e}"
        );
        let started = Instant::now();
        let hung = sh("exec sleep 30", Duration::from_millis(300)).check(&files);
        assert!(started.elapsed() < Duration::from_secs(5));
        let e = hung[0].as_ref().unwrap_err().to_string();
        assert!(
            e.contains("/p/a.so: the plugin did not finish loading within 0.3 s"),
            "{e}"
        );
    }

    #[test]
    fn many_files_are_probed_a_bounded_number_at_a_time() {
        let files: Vec<PathBuf> = (0..3 * MAX_AT_ONCE)
            .map(|i| PathBuf::from(format!("/p/{i}.so")))
            .collect();
        // Each probe records itself while it runs; at most MAX_AT_ONCE overlap.
        let dir = std::env::temp_dir().join(format!("probe-bound-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = format!(
            "d={dir}; touch $d/$$; n=$(ls $d | wc -l); echo $n >> $d.max; sleep 0.1; rm $d/$$",
            dir = dir.display()
        );
        let results = sh(&script, Duration::from_secs(20)).check(&files);
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let counts = std::fs::read_to_string(dir.with_extension("max")).unwrap();
        let most = counts
            .lines()
            .filter_map(|l| l.trim().parse::<usize>().ok())
            .max();
        assert!(most.is_some_and(|m| m <= MAX_AT_ONCE), "{counts}");
        assert_eq!(counts.lines().count(), files.len());
        std::fs::remove_dir_all(&dir).ok();
        std::fs::remove_file(dir.with_extension("max")).ok();
    }
}

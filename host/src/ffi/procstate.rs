//! The process state a plugin does not own, read around loading a plugin,
//! around each conformance case and once a training step (ABI rule 13).
//!
//! A plugin shares its process with the framework, the host and other
//! vendors' plugins. A library that changes the working directory (every
//! relative path the user gave then means another file), blocks signals
//! or pins the calling thread to one core (OpenMP runtimes bind the thread
//! that starts their first parallel region when asked to), installs its
//! own handler for `SIGINT` or `SIGSEGV` (Ctrl-C no longer stops the job;
//! crashes are no longer reported as crashes), points standard output
//! somewhere else, sets environment variables that other plugins' runtimes
//! read, or changes the C locale (every C library's `strtod` and `printf`
//! then read and write `0,5`) breaks code it never called.
//!
//! Reading all of it costs system calls (tens of microseconds), too much for
//! every operator call, so the host reads it around loading each plugin
//! (its constructors and its entry), `polychip conform` around every case
//! and `polychip train` once a step ([`Watch`]). What the host owns or the calling thread owns is put back (the
//! working directory, the file-creation mask, the locale, the calling
//! thread's signal mask and CPU affinity); what is the whole process's and
//! may be in use by the plugin (signal handlers, standard streams, the
//! environment) is reported, not undone: taking a handler away from a
//! runtime that relies on it would turn its handled faults into crashes.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, OsString};

/// The signals whose handlers are compared: those a job's own stopping,
/// crash reporting and child processes rely on.
const SIGNALS: [(libc::c_int, &str); 14] = [
    (libc::SIGINT, "SIGINT"),
    (libc::SIGTERM, "SIGTERM"),
    (libc::SIGHUP, "SIGHUP"),
    (libc::SIGQUIT, "SIGQUIT"),
    (libc::SIGPIPE, "SIGPIPE"),
    (libc::SIGCHLD, "SIGCHLD"),
    (libc::SIGSEGV, "SIGSEGV"),
    (libc::SIGBUS, "SIGBUS"),
    (libc::SIGFPE, "SIGFPE"),
    (libc::SIGILL, "SIGILL"),
    (libc::SIGABRT, "SIGABRT"),
    (libc::SIGUSR1, "SIGUSR1"),
    (libc::SIGUSR2, "SIGUSR2"),
    (libc::SIGALRM, "SIGALRM"),
];

/// The most environment variables named in one message.
const MAX_NAMED: usize = 6;

/// What changed between two [`ProcState`]s, each a phrase.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// What rule 13 forbids: the working directory, the file-creation
    /// mask, the locale, the calling thread's signal mask and CPU affinity,
    /// and the standard streams.
    pub forbidden: Vec<String>,
    /// What rule 13 discourages: signal handlers (real drivers install
    /// them: PoCL's `clGetDeviceIDs` calls LLVM's `RemoveFileOnSignal`,
    /// which takes eleven signals, removes its temporary files on one, then
    /// puts the previous handler back and raises it again; a snapshot
    /// cannot tell such a handler from one that swallows the signal) and
    /// the environment (PoCL sets `HWLOC_PLUGINS_PATH`).
    pub discouraged: Vec<String>,
}

impl Changes {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.forbidden.is_empty() && self.discouraged.is_empty()
    }
}

/// A snapshot of the process state a plugin must leave alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcState {
    cwd: Option<OsString>,
    umask: Option<u32>,
    locale: Option<CString>,
    /// The calling thread's blocked signals, one bit per signal number.
    thread_mask: Option<u128>,
    /// The CPUs the calling thread may run on.
    affinity: Option<Vec<usize>>,
    /// Per signal of [`SIGNALS`]: the handler's address and its flags.
    handlers: Vec<Option<(usize, libc::c_int)>>,
    /// Per standard stream: the device and inode of what it is, or `None`
    /// when closed.
    stdio: [Option<(u64, u64)>; 3],
    environment: BTreeMap<OsString, OsString>,
}

impl ProcState {
    /// The state now, as the calling thread sees it.
    pub fn current() -> ProcState {
        ProcState {
            cwd: std::env::current_dir().ok().map(Into::into),
            umask: read_umask(),
            locale: read_locale(),
            thread_mask: read_thread_mask(),
            affinity: read_affinity(),
            handlers: SIGNALS.iter().map(|&(s, _)| read_handler(s)).collect(),
            stdio: [0, 1, 2].map(read_stdio),
            environment: std::env::vars_os().collect(),
        }
    }

    /// What differs in `after`, each as a phrase ("the working directory
    /// changed from /a to /").
    pub fn changes_to(&self, after: &ProcState) -> Changes {
        let mut out = Vec::new();
        let mut discouraged = Vec::new();
        if self.cwd != after.cwd {
            let show = |c: &Option<OsString>| {
                c.as_ref()
                    .map_or_else(|| "(unreadable)".into(), polychip_files::shown_path)
            };
            out.push(format!(
                "the working directory changed from {} to {}",
                show(&self.cwd),
                show(&after.cwd)
            ));
        }
        if self.umask != after.umask {
            let show =
                |m: Option<u32>| m.map_or_else(|| "(unreadable)".into(), |m| format!("{m:04o}"));
            out.push(format!(
                "the file-creation mask (umask) changed from {} to {}",
                show(self.umask),
                show(after.umask)
            ));
        }
        if self.locale != after.locale {
            let show = |l: &Option<CString>| {
                l.as_ref().map_or_else(
                    || "(unreadable)".into(),
                    |l| polychip_files::printable(&l.to_string_lossy()),
                )
            };
            out.push(format!(
                "the C locale changed from {} to {} (C code's strtod and printf read and write \
                 numbers by it)",
                show(&self.locale),
                show(&after.locale)
            ));
        }
        if let (Some(b), Some(a)) = (self.thread_mask, after.thread_mask)
            && a != b
        {
            let names = |bits: u128| -> Vec<String> {
                (1..128)
                    .filter(|s| bits & (1u128 << s) != 0)
                    .map(signal_name)
                    .collect()
            };
            let blocked = names(a & !b);
            let unblocked = names(b & !a);
            let mut what = Vec::new();
            if !blocked.is_empty() {
                what.push(format!("blocked {}", blocked.join(", ")));
            }
            if !unblocked.is_empty() {
                what.push(format!("unblocked {}", unblocked.join(", ")));
            }
            out.push(format!(
                "the calling thread's signal mask changed ({})",
                what.join("; ")
            ));
        }
        if self.affinity != after.affinity {
            let show = |a: &Option<Vec<usize>>| {
                a.as_ref()
                    .map_or_else(|| "(unreadable)".into(), |cpus| cpu_list(cpus))
            };
            out.push(format!(
                "the calling thread's CPU affinity changed from CPUs {} to {}",
                show(&self.affinity),
                show(&after.affinity)
            ));
        }
        let changed: Vec<&str> = SIGNALS
            .iter()
            .zip(self.handlers.iter().zip(&after.handlers))
            .filter(|(_, (b, a))| b != a)
            .map(|((_, name), _)| *name)
            .collect();
        if !changed.is_empty() {
            discouraged.push(format!(
                "the process's handler for {} changed",
                changed.join(", ")
            ));
        }
        for (fd, (b, a)) in self.stdio.iter().zip(&after.stdio).enumerate() {
            if b != a {
                let name = ["standard input", "standard output", "standard error"][fd];
                let what = match a {
                    None => "was closed",
                    Some(_) if b.is_none() => "was opened",
                    Some(_) => "now refers to another file",
                };
                out.push(format!("{name} (file descriptor {fd}) {what}"));
            }
        }
        if self.environment != after.environment {
            let mut names: Vec<String> = Vec::new();
            let keys = self.environment.keys().chain(after.environment.keys());
            for key in keys {
                let (b, a) = (self.environment.get(key), after.environment.get(key));
                let name = polychip_files::printable(&key.to_string_lossy());
                if b != a && !names.contains(&name) {
                    names.push(name);
                }
            }
            let more = names.len().saturating_sub(MAX_NAMED);
            names.truncate(MAX_NAMED);
            let mut list = names.join(", ");
            if more > 0 {
                list.push_str(&format!(" and {more} more"));
            }
            discouraged.push(format!("the environment changed ({list})"));
        }
        Changes {
            forbidden: out,
            discouraged,
        }
    }

    /// Puts back what the host or the calling thread owns, as it was in
    /// `self`: the working directory, the file-creation mask, the locale,
    /// the calling thread's signal mask and CPU affinity. Signal handlers,
    /// standard streams and the environment are left as they are.
    pub fn restore(&self, after: &ProcState) {
        if self.cwd != after.cwd
            && let Some(cwd) = &self.cwd
        {
            let _ = std::env::set_current_dir(cwd);
        }
        if self.umask != after.umask
            && let Some(mask) = self.umask
        {
            // SAFETY: umask only sets the process's file-creation mask.
            unsafe { libc::umask(mask as libc::mode_t) };
        }
        if self.locale != after.locale
            && let Some(locale) = &self.locale
        {
            // SAFETY: a NUL-terminated locale name setlocale itself returned.
            unsafe { libc::setlocale(libc::LC_ALL, locale.as_ptr()) };
        }
        if self.thread_mask != after.thread_mask
            && let Some(bits) = self.thread_mask
        {
            set_thread_mask(bits);
        }
        if self.affinity != after.affinity
            && let Some(cpus) = &self.affinity
        {
            set_affinity(cpus);
        }
    }
}

/// Signal `s` by name where it has a usual one.
fn signal_name(s: u32) -> String {
    SIGNALS
        .iter()
        .find(|(n, _)| *n as u32 == s)
        .map_or_else(|| format!("signal {s}"), |(_, name)| (*name).to_string())
}

/// CPUs as ranges: "0-3,6".
fn cpu_list(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(",")
    }
}

/// The file-creation mask, from `/proc/self/status` (reading it through
/// `umask(2)` means setting it, racing other threads' file creation).
fn read_umask() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Umask:"))?;
    u32::from_str_radix(line["Umask:".len()..].trim(), 8).ok()
}

fn read_locale() -> Option<CString> {
    // SAFETY: a NULL locale queries.
    let p = unsafe { libc::setlocale(libc::LC_ALL, std::ptr::null()) };
    // SAFETY: a non-NULL result is a NUL-terminated string owned by the C
    // library, copied at once.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_owned())
}

fn read_thread_mask() -> Option<u128> {
    // SAFETY: an all-zero sigset_t is a valid value to be overwritten;
    // a NULL new set only queries.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        if libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set) != 0 {
            return None;
        }
        let mut bits = 0u128;
        for s in 1..128 {
            if libc::sigismember(&set, s) == 1 {
                bits |= 1 << s;
            }
        }
        Some(bits)
    }
}

fn set_thread_mask(bits: u128) {
    // SAFETY: sigemptyset initialises the set; SIG_SETMASK with it sets the
    // calling thread's mask to the one read before.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in 1..128 {
            if bits & (1 << s) != 0 {
                libc::sigaddset(&mut set, s);
            }
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
}

fn read_affinity() -> Option<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is valid; pid 0 is the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
        Some((0..max).filter(|&c| libc::CPU_ISSET(c, &set)).collect())
    }
}

fn set_affinity(cpus: &[usize]) {
    // SAFETY: as in `read_affinity`; the CPUs are ones read from it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn read_handler(signal: libc::c_int) -> Option<(usize, libc::c_int)> {
    // SAFETY: a NULL new action only queries.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        (libc::sigaction(signal, std::ptr::null(), &mut old) == 0)
            .then_some((old.sa_sigaction, old.sa_flags))
    }
}

fn read_stdio(fd: libc::c_int) -> Option<(u64, u64)> {
    // SAFETY: fstat writes a stat for an open descriptor and fails on any other.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0).then_some((st.st_dev, st.st_ino))
    }
}

/// A plugin that left the process state changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStateChange {
    /// The plugin's vendor name, or its file while it has none yet.
    pub plugin: String,
    /// What it was doing ("loading (its initialisers and entry)").
    pub during: String,
    /// What changed, each a phrase.
    pub what: Vec<String>,
    /// Whether rule 13 forbids these changes ([`Changes::forbidden`]) or
    /// discourages them ([`Changes::discouraged`]).
    pub forbidden: bool,
}

impl ProcStateChange {
    /// The forbidden and the discouraged changes of `changes`, each as a
    /// change of its own when there is one.
    pub fn split(plugin: &str, during: &str, changes: Changes) -> Vec<ProcStateChange> {
        [(changes.forbidden, true), (changes.discouraged, false)]
            .into_iter()
            .filter(|(what, _)| !what.is_empty())
            .map(|(what, forbidden)| ProcStateChange {
                plugin: plugin.to_string(),
                during: during.to_string(),
                what,
                forbidden,
            })
            .collect()
    }
}

impl std::fmt::Display for ProcStateChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.forbidden {
            write!(
                f,
                "plugin {} changed process state it does not own while {}: {} (ABI rule 13; the \
                 host put back the working directory, umask, locale and the calling thread's \
                 signal mask and CPU affinity)",
                self.plugin,
                self.during,
                self.what.join("; ")
            )
        } else {
            write!(
                f,
                "plugin {} changed process-wide state while {}: {} (ABI rule 13 discourages \
                 it: a handler must pass on the signals it does not handle, and a variable set \
                 while other threads run can crash their reads of the environment; left as the \
                 plugin set it)",
                self.plugin,
                self.during,
                self.what.join("; ")
            )
        }
    }
}

/// Reads the state before `call` and after it; puts back what
/// [`ProcState::restore`] puts back, and says what changed.
pub fn around<T>(call: impl FnOnce() -> T) -> (T, Changes) {
    let before = ProcState::current();
    let result = call();
    let after = ProcState::current();
    if before == after {
        return (result, Changes::default());
    }
    before.restore(&after);
    (result, before.changes_to(&after))
}

/// The process state watched across many calls, for a loop too hot to
/// bracket each call (a training step runs hundreds of operators): each
/// [`Watch::look`] compares the state with the last one, puts back what
/// [`ProcState::restore`] puts back, and takes what it leaves (a handler,
/// an environment variable) as the state to compare with next, so that
/// each change is reported once.
#[derive(Debug)]
pub struct Watch {
    last: ProcState,
}

impl Watch {
    /// Starts from the state now, as the calling thread sees it.
    pub fn new() -> Watch {
        Watch {
            last: ProcState::current(),
        }
    }

    /// What changed since [`Watch::new`] or the last look, as the calling
    /// thread (the one that called `new`) sees it.
    pub fn look(&mut self) -> Changes {
        let now = ProcState::current();
        if now == self.last {
            return Changes::default();
        }
        self.last.restore(&now);
        let changes = self.last.changes_to(&now);
        self.last = ProcState::current();
        changes
    }
}

impl Default for Watch {
    fn default() -> Watch {
        Watch::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_changes_between_two_reads() {
        let a = ProcState::current();
        let b = ProcState::current();
        assert!(a.changes_to(&b).is_empty());
    }

    #[test]
    fn a_changed_signal_mask_is_named_and_put_back() {
        // On a thread of its own: the mask is per thread.
        std::thread::spawn(|| {
            let ((), what) = around(|| {
                let mask = read_thread_mask().unwrap();
                set_thread_mask(mask | (1 << libc::SIGUSR2));
            });
            assert_eq!(what.forbidden.len(), 1, "{what:?}");
            assert!(what.discouraged.is_empty(), "{what:?}");
            assert!(
                what.forbidden[0].contains("signal mask changed (blocked SIGUSR2)"),
                "{what:?}"
            );
            assert_eq!(read_thread_mask().unwrap() & (1 << libc::SIGUSR2), 0);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_watch_puts_back_the_mask_and_reports_each_change_once() {
        std::thread::spawn(|| {
            let mut watch = Watch::new();
            assert!(watch.look().is_empty());
            let mask = read_thread_mask().unwrap();
            set_thread_mask(mask | (1 << libc::SIGUSR2));
            let what = watch.look();
            assert_eq!(what.forbidden.len(), 1, "{what:?}");
            assert!(what.forbidden[0].contains("blocked SIGUSR2"), "{what:?}");
            assert_eq!(read_thread_mask().unwrap(), mask);
            // Put back: nothing more to say.
            assert!(watch.look().is_empty());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn cpu_lists_are_ranges() {
        assert_eq!(cpu_list(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
        assert_eq!(cpu_list(&[5]), "5");
        assert_eq!(cpu_list(&[]), "none");
    }
}

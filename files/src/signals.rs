//! Catching SIGINT, SIGTERM and SIGHUP while a command runs helper
//! processes, so that it can stop them and say why before it exits
//! (`polychip launch` passes the signal on to its ranks; `polychip conform`
//! kills its case worker). The handler only records the signal; the
//! command polls [`SignalGuard::caught`].

use std::sync::atomic::{AtomicI32, Ordering};

/// The last of SIGINT, SIGTERM, SIGHUP received while a guard is installed
/// (0: none).
static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNALLED.store(sig, Ordering::SeqCst);
}

/// Catches SIGINT, SIGTERM and SIGHUP while it lives, and puts the previous
/// handlers back when dropped. A signal the process was started ignoring
/// (SIGINT and SIGQUIT of a background job of a non-interactive shell) is
/// caught too: whoever sends it to this process by its id means it.
pub struct SignalGuard {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl std::fmt::Debug for SignalGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignalGuard").finish_non_exhaustive()
    }
}

impl SignalGuard {
    /// Installs the handlers, forgetting any signal caught before.
    pub fn install() -> SignalGuard {
        SIGNALLED.store(0, Ordering::SeqCst);
        let mut previous = Vec::new();
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: sigaction is plain data; all-zero is a valid value
            // (no handler, empty mask, no flags) that we then fill in.
            let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            // SAFETY: as above, a zeroed sigaction to receive the old one.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: both pointers are to live, initialised sigaction
            // values; the handler only stores to an atomic, which is
            // async-signal-safe.
            let rc = unsafe {
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(sig, &action, &mut old)
            };
            if rc == 0 {
                previous.push((sig, old));
            }
        }
        SignalGuard { previous }
    }

    /// The signal caught since the last call (0: none), taken.
    pub fn caught(&self) -> i32 {
        SIGNALLED.swap(0, Ordering::SeqCst)
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for (sig, old) in &self.previous {
            // SAFETY: `old` is the action sigaction gave us for `sig`.
            unsafe {
                libc::sigaction(*sig, old, std::ptr::null_mut());
            }
        }
    }
}

/// The signal's name, as a message gives it (`SIGINT`), or its number.
pub fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        other => format!("signal {other}"),
    }
}

//! What a rank says when its launcher stops it. When one rank of a job
//! fails, `polychip launch` (like torchrun) sends SIGTERM to the others;
//! without a word they would vanish from the log. [`on_termination`]
//! makes a SIGTERM print one line naming the rank and why, then exit with
//! status 143 (128 + SIGTERM) at once: the job is already failing, and the
//! last complete checkpoint is the one `latest` names.

use std::sync::OnceLock;

static MESSAGE: OnceLock<Vec<u8>> = OnceLock::new();

extern "C" fn on_sigterm(_: libc::c_int) {
    if let Some(m) = MESSAGE.get() {
        // SAFETY: write(2) is async-signal-safe; the buffer was initialised
        // before the handler was installed and is never changed again.
        unsafe { libc::write(2, m.as_ptr().cast(), m.len()) };
    }
    // SAFETY: _exit is async-signal-safe and does not return.
    unsafe { libc::_exit(143) };
}

/// Installs the SIGTERM handler for rank `rank` of `world`.
pub fn on_termination(rank: usize, world: usize) {
    let text = format!(
        "polychip train: rank {rank} of {world}: stopped by the launcher (SIGTERM), most likely \
         because another rank failed; see that rank's error above\n"
    );
    if MESSAGE.set(text.into_bytes()).is_err() {
        return;
    }
    let handler: extern "C" fn(libc::c_int) = on_sigterm;
    // SAFETY: installs a handler that only calls async-signal-safe functions.
    unsafe { libc::signal(libc::SIGTERM, handler as libc::sighandler_t) };
}

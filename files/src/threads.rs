//! Starting threads without panicking when the system refuses one.
//!
//! `std::thread::spawn` and `Scope::spawn` panic ("failed to spawn
//! thread") when the system refuses a thread: a user's process limit
//! (`ulimit -u`, `prlimit --nproc`), a cgroup's `pids.max`, memory for its
//! stack. Every thread polychip starts goes through [`spawn`] or
//! [`spawn_scoped`] instead, which give the refusal back as a
//! [`ThreadRefused`] naming what the thread was for, for the caller to
//! turn into its ordinary error (a failed conform run, a failed rank, a
//! failed transport call) instead of exit 101.

use std::fmt;
use std::io;
use std::thread::{Builder, JoinHandle, Scope, ScopedJoinHandle};

/// A thread the system would not start: what it was for and why not.
#[derive(Debug)]
pub struct ThreadRefused {
    purpose: String,
    error: io::Error,
}

impl ThreadRefused {
    /// What the thread was to do (`relay rank 1's output`).
    pub fn purpose(&self) -> &str {
        &self.purpose
    }

    /// The system's reason (`Resource temporarily unavailable`).
    pub fn error(&self) -> &io::Error {
        &self.error
    }
}

impl fmt::Display for ThreadRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "could not start a thread to {}: {}",
            self.purpose, self.error
        )
    }
}

impl std::error::Error for ThreadRefused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<ThreadRefused> for io::Error {
    fn from(r: ThreadRefused) -> io::Error {
        io::Error::new(r.error.kind(), r.to_string())
    }
}

/// The builder every thread starts from: named after its purpose (the
/// system keeps the first 15 bytes), so a panic inside it and a debugger's
/// thread list say what it was.
fn builder(purpose: &str) -> Builder {
    // A name with a NUL byte would make `spawn` panic; a purpose may
    // carry a device's name, which a plugin gives.
    let b = Builder::new().name(purpose.replace('\0', " "));
    #[cfg(test)]
    if tests::REFUSE.get() {
        // A stack no system gives (1 EiB): the thread is refused as a
        // process limit refuses one, by `pthread_create` failing.
        return b.stack_size(1 << 60);
    }
    b
}

fn refused(purpose: &str, error: io::Error) -> ThreadRefused {
    ThreadRefused {
        purpose: purpose.to_string(),
        error,
    }
}

/// Starts `f` on a new thread that is to `purpose` (said as the rest of
/// "a thread to ...": `relay rank 1's output`); the system's refusal comes
/// back as an error, not a panic.
pub fn spawn<F, T>(purpose: &str, f: F) -> Result<JoinHandle<T>, ThreadRefused>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    builder(purpose).spawn(f).map_err(|e| refused(purpose, e))
}

/// [`spawn`] inside a [`std::thread::scope`]. When it fails, the threads
/// the scope already started are still joined at its end: the caller must
/// leave them able to finish (drop the sender a started thread waits on,
/// say), which returning the error from the scope's closure does for what
/// the closure owns.
pub fn spawn_scoped<'scope, 'env, F, T>(
    scope: &'scope Scope<'scope, 'env>,
    purpose: &str,
    f: F,
) -> Result<ScopedJoinHandle<'scope, T>, ThreadRefused>
where
    F: FnOnce() -> T + Send + 'scope,
    T: Send + 'scope,
{
    builder(purpose)
        .spawn_scoped(scope, f)
        .map_err(|e| refused(purpose, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    std::thread_local! {
        /// Whether this thread's next threads are refused.
        pub(super) static REFUSE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// `f` with this thread's threads refused.
    fn refusing<T>(f: impl FnOnce() -> T) -> T {
        REFUSE.set(true);
        let r = f();
        REFUSE.set(false);
        r
    }

    #[test]
    fn a_started_thread_runs_and_is_named_after_its_purpose() {
        let h = spawn("say hello", || {
            (7, std::thread::current().name().map(str::to_string))
        })
        .unwrap();
        assert_eq!(h.join().unwrap(), (7, Some("say hello".to_string())));
        let n = std::thread::scope(|s| spawn_scoped(s, "add", || 1 + 1).unwrap().join().unwrap());
        assert_eq!(n, 2);
    }

    #[test]
    fn a_purpose_with_a_nul_byte_still_starts_its_thread() {
        let h = spawn("relay bad\0name's profile", || 3).unwrap();
        assert_eq!(h.join().unwrap(), 3);
    }

    #[test]
    fn a_refused_thread_is_an_error_naming_its_purpose() {
        let e = refusing(|| spawn("relay rank 1's output", || ()))
            .expect_err("a 1 EiB stack was given");
        let said = e.to_string();
        assert!(
            said.starts_with("could not start a thread to relay rank 1's output: "),
            "{said}"
        );
        assert!(said.len() > "could not start a thread to relay rank 1's output: ".len());
        assert_eq!(e.purpose(), "relay rank 1's output");
        let io: io::Error = e.into();
        assert!(
            io.to_string()
                .starts_with("could not start a thread to relay")
        );
    }

    #[test]
    fn a_scope_whose_second_thread_is_refused_still_ends() {
        // The first thread waits on a channel whose sender the scope's
        // closure owns: returning the refusal drops it, so the scope's
        // join at its end does not wait for ever.
        let got: Result<u32, ThreadRefused> = std::thread::scope(|s| {
            let (tx, rx) = mpsc::channel::<u32>();
            let first = spawn_scoped(s, "sum", move || rx.iter().sum::<u32>())?;
            refusing(|| spawn_scoped(s, "feed the sum", || ()))?;
            tx.send(1).unwrap();
            drop(tx);
            Ok(first.join().unwrap())
        });
        let e = got.expect_err("a 1 EiB stack was given");
        assert!(
            e.to_string()
                .starts_with("could not start a thread to feed the sum: ")
        );
    }
}

//! Log records to the caller's callback. libpolychip carries its own copy
//! of the `log` crate (it is a shared library), so the logger installed here
//! sees only polychip's records (the host's and, through it, the plugins'),
//! never the embedding program's.

use std::ffi::c_void;
use std::sync::RwLock;

use crate::runtime::{polychip_log_fn, polychip_log_level_t};

#[derive(Clone, Copy)]
struct Target {
    callback: polychip_log_fn,
    context: usize,
}

/// Where records go, and how many runtimes live: the context is the
/// caller's only while one does (the header's promise), so the target is
/// dropped with the last runtime.
struct State {
    target: Option<Target>,
    runtimes: usize,
}

static STATE: RwLock<State> = RwLock::new(State {
    target: None,
    runtimes: 0,
});

thread_local! {
    /// Set while this thread runs the callback: a record the callback
    /// itself causes is dropped, not sent back into it.
    static IN_CALLBACK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// How deep this thread is in C API calls.
    static DEPTH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Records made inside a C API call, sent when the outermost returns.
    static QUEUE: std::cell::RefCell<Vec<(polychip_log_level_t, String)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// The most records one C API call holds back; beyond it they are counted
/// and one record says how many were dropped.
const QUEUE_LIMIT: usize = 10_000;

/// A C API call begins on this thread.
pub(crate) fn enter() {
    DEPTH.with(|d| d.set(d.get() + 1));
}

/// A C API call ends on this thread: at the outermost, the records it made
/// go to the callback now that polychip holds no lock (a callback called
/// while the host held one, that made a runtime of its own, deadlocked).
pub(crate) fn leave() {
    let depth = DEPTH.with(|d| {
        let n = d.get().saturating_sub(1);
        d.set(n);
        n
    });
    if depth == 0 {
        let records = QUEUE.with(|q| std::mem::take(&mut *q.borrow_mut()));
        for (level, message) in records {
            deliver(level, &message);
        }
    }
}

/// Calls the callback with one record, unless this thread is already in it.
fn deliver(level: polychip_log_level_t, message: &str) {
    if IN_CALLBACK.with(|c| c.get()) {
        return;
    }
    // Copied out, and the lock released before the call.
    let target = STATE.read().unwrap_or_else(|e| e.into_inner()).target;
    let Some(Target {
        callback: Some(f),
        context,
    }) = target
    else {
        return;
    };
    IN_CALLBACK.with(|c| c.set(true));
    // SAFETY: the caller registered `f` with `context` and promised both
    // stay valid while a runtime lives (the target goes with the last
    // runtime); the message is borrowed for the call.
    unsafe {
        f(
            context as *mut c_void,
            level,
            message.as_ptr().cast(),
            message.len(),
        )
    };
    IN_CALLBACK.with(|c| c.set(false));
}

struct Forward;

static FORWARD: Forward = Forward;

impl log::Log for Forward {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) || IN_CALLBACK.with(|c| c.get()) {
            return;
        }
        let level = record.level() as polychip_log_level_t;
        let message = record.args().to_string();
        if DEPTH.with(|d| d.get()) == 0 {
            deliver(level, &message);
            return;
        }
        QUEUE.with(|q| {
            let mut q = q.borrow_mut();
            match q.len() {
                n if n < QUEUE_LIMIT => q.push((level, message)),
                n if n == QUEUE_LIMIT => q.push((
                    log::Level::Warn as polychip_log_level_t,
                    format!(
                        "more than {QUEUE_LIMIT} log records in one call; the rest are dropped"
                    ),
                )),
                _ => {}
            }
        });
    }

    fn flush(&self) {}
}

/// Sends records up to `level` to `callback` from now on.
pub(crate) fn install(
    callback: polychip_log_fn,
    context: *mut c_void,
    level: polychip_log_level_t,
) {
    STATE.write().unwrap_or_else(|e| e.into_inner()).target = Some(Target {
        callback,
        context: context as usize,
    });
    // The first install wins the logger slot; later ones only retarget it.
    let _ = log::set_logger(&FORWARD);
    log::set_max_level(match level {
        0 => log::LevelFilter::Off,
        1 => log::LevelFilter::Error,
        2 => log::LevelFilter::Warn,
        3 => log::LevelFilter::Info,
        4 => log::LevelFilter::Debug,
        _ => log::LevelFilter::Trace,
    });
}

/// A runtime was made (`Some(true)`), destroyed (`Some(false)`), or its
/// making failed (`None`): with no runtime left, records are dropped and
/// the callback's context is no longer used (it was, after every runtime
/// was destroyed, by a tensor's destruction).
pub(crate) fn runtimes(made: Option<bool>) {
    let mut state = STATE.write().unwrap_or_else(|e| e.into_inner());
    match made {
        Some(true) => state.runtimes += 1,
        Some(false) => state.runtimes = state.runtimes.saturating_sub(1),
        None => {}
    }
    if state.runtimes == 0 {
        state.target = None;
    }
}

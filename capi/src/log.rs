//! Log records to the caller's callback. libpolychip carries its own copy
//! of the `log` crate (it is a shared library), so the logger installed here
//! sees only polychip's records (the host's and, through it, the plugins'),
//! never the embedding program's.

use std::ffi::c_void;
use std::sync::RwLock;

use crate::runtime::{polychip_log_fn, polychip_log_level_t};

struct Target {
    callback: polychip_log_fn,
    context: usize,
}

static TARGET: RwLock<Option<Target>> = RwLock::new(None);

struct Forward;

static FORWARD: Forward = Forward;

impl log::Log for Forward {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let target = TARGET.read().unwrap_or_else(|e| e.into_inner());
        let Some(Target {
            callback: Some(f),
            context,
        }) = target.as_ref()
        else {
            return;
        };
        let message = record.args().to_string();
        // SAFETY: the caller registered `f` with `context` and promised both
        // stay valid while a runtime lives; the message is borrowed for the call.
        unsafe {
            f(
                *context as *mut c_void,
                record.level() as polychip_log_level_t,
                message.as_ptr().cast(),
                message.len(),
            )
        };
    }

    fn flush(&self) {}
}

/// Sends records up to `level` to `callback` from now on.
pub(crate) fn install(
    callback: polychip_log_fn,
    context: *mut c_void,
    level: polychip_log_level_t,
) {
    *TARGET.write().unwrap_or_else(|e| e.into_inner()) = Some(Target {
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

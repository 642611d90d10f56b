//! One logging facade for both shims and the engine. The level comes from `CUDAW_LOG`
//! (`error`, `warn`, `info`, `debug`, `trace`; default `warn`), read once. Lines go to
//! standard error, prefixed `cudaw[PID]` and the library's origin, if it set one
//! ([`set_origin`]: the driver layer's lines read `cudaw[PID] driver warn: ...`).

use std::fmt::Arguments;
use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};

pub use cudaw_config::Level;

static LEVEL: AtomicU8 = AtomicU8::new(0);

/// The library's name in its lines (empty for the runtime shim). Each cdylib links its
/// own copy of this crate, so each has its own.
static ORIGIN: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Names the library in every line it logs from now on (`"driver"`); the first call wins.
pub fn set_origin(origin: &'static str) {
    let _ = ORIGIN.set(origin);
}

fn origin() -> &'static str {
    ORIGIN.get().copied().unwrap_or("")
}

/// The level in force (reads `CUDAW_LOG` on first use).
pub fn level() -> Level {
    let l = LEVEL.load(Ordering::Relaxed);
    if l != 0 {
        return match l {
            1 => Level::Error,
            2 => Level::Warn,
            3 => Level::Info,
            4 => Level::Debug,
            _ => Level::Trace,
        };
    }
    let lv = cudaw_config::get().log_level;
    LEVEL.store(lv as u8, Ordering::Relaxed);
    lv
}

/// Whether `l` is enabled.
pub fn enabled(l: Level) -> bool {
    l <= level()
}

/// Writes one line at level `l`.
pub fn write(l: Level, args: Arguments<'_>) {
    if !enabled(l) {
        return;
    }
    let tag = match l {
        Level::Error => "error",
        Level::Warn => "warn",
        Level::Info => "info",
        Level::Debug => "debug",
        Level::Trace => "trace",
    };
    let line = match origin() {
        "" => format!("cudaw[{}] {tag}: {args}\n", std::process::id()),
        o => format!("cudaw[{}] {o} {tag}: {args}\n", std::process::id()),
    };
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Writes one line without a level tag, when warnings are shown (the default): what the
/// user asked for, such as the trace summary at exit.
pub fn warn_plain(args: Arguments<'_>) {
    if !enabled(Level::Warn) {
        return;
    }
    let line = match origin() {
        "" => format!("cudaw[{}] {args}\n", std::process::id()),
        o => format!("cudaw[{}] {o} {args}\n", std::process::id()),
    };
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Logs at error level.
pub fn error(args: Arguments<'_>) {
    write(Level::Error, args)
}
/// Logs at warn level.
pub fn warn(args: Arguments<'_>) {
    write(Level::Warn, args)
}
/// Logs at info level.
pub fn info(args: Arguments<'_>) {
    write(Level::Info, args)
}
/// Logs at debug level.
pub fn debug(args: Arguments<'_>) {
    write(Level::Debug, args)
}

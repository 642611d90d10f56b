//! One logging facade. The level comes from `CUDAW_LOG` (`error`, `warn`, `info`, `debug`,
//! `trace`; default `warn`), read once. Lines go to standard error, prefixed `cudaw[PID]`.

use std::fmt::Arguments;
use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};

/// Log levels, most severe first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    /// Something failed.
    Error = 1,
    /// Something is off but cudaw carries on.
    Warn = 2,
    /// What cudaw did, once per event.
    Info = 3,
    /// Details for developers.
    Debug = 4,
    /// Every call.
    Trace = 5,
}

impl Level {
    /// Parses a level name; `None` for an unknown one.
    pub fn parse(s: &str) -> Option<Level> {
        Some(match s.trim().to_ascii_lowercase().as_str() {
            "error" => Level::Error,
            "warn" | "warning" => Level::Warn,
            "info" => Level::Info,
            "debug" => Level::Debug,
            "trace" => Level::Trace,
            "off" | "none" => return Some(Level::Error),
            _ => return None,
        })
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(0);

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
    let lv = crate::config::get().log_level;
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
    let line = format!("cudaw[{}] {tag}: {args}\n", std::process::id());
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Writes one line without a level tag, when warnings are shown (the default): what the
/// user asked for, such as the trace summary at exit.
pub fn warn_plain(args: Arguments<'_>) {
    if !enabled(Level::Warn) {
        return;
    }
    let line = format!("cudaw[{}] {args}\n", std::process::id());
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

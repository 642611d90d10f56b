//! The daemon's log: one line per event on standard error, `cudaw-node[PID] LEVEL: ...`
//! (systemd's journal adds the time). The level comes from `CUDAW_LOG` (`error`, `warn`,
//! `info`, `debug`, `trace`; default `info`): `info` shows what changes — jobs joining and
//! leaving, configuration reloads, swaps, failures; `debug` adds every quantum's holds and
//! releases (twenty a second and more).

use std::fmt::Arguments;
use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};

/// How much is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Failures.
    Error = 1,
    /// Trouble the daemon works around.
    Warn = 2,
    /// Changes: jobs, configuration, swaps.
    Info = 3,
    /// Every action.
    Debug = 4,
    /// Every observation.
    Trace = 5,
}

static LEVEL: AtomicU8 = AtomicU8::new(0);

/// The level `CUDAW_LOG` names (`None`: not a level).
pub fn parse_level(v: &str) -> Option<Level> {
    Some(match v.trim().to_ascii_lowercase().as_str() {
        "error" | "off" => Level::Error,
        "warn" | "warning" => Level::Warn,
        "info" | "" => Level::Info,
        "debug" => Level::Debug,
        "trace" => Level::Trace,
        _ => return None,
    })
}

/// The level in force (`CUDAW_LOG`, read on first use).
pub fn level() -> Level {
    match LEVEL.load(Ordering::Relaxed) {
        0 => {
            let l = std::env::var("CUDAW_LOG")
                .ok()
                .and_then(|v| parse_level(&v))
                .unwrap_or(Level::Info);
            LEVEL.store(l as u8, Ordering::Relaxed);
            l
        }
        1 => Level::Error,
        2 => Level::Warn,
        3 => Level::Info,
        4 => Level::Debug,
        _ => Level::Trace,
    }
}

/// Whether lines of level `l` are written.
pub fn enabled(l: Level) -> bool {
    l <= level()
}

/// Writes one line at level `l` (a failed write is ignored: there is nowhere to report it).
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
    let line = format!("cudaw-node[{}] {tag}: {args}\n", std::process::id());
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

macro_rules! log_warn { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Warn, format_args!($($t)*)) } }
macro_rules! log_info { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Info, format_args!($($t)*)) } }
macro_rules! log_debug { ($($t:tt)*) => { $crate::log::write($crate::log::Level::Debug, format_args!($($t)*)) } }
pub(crate) use {log_debug, log_info, log_warn};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse() {
        assert_eq!(parse_level("DEBUG"), Some(Level::Debug));
        assert_eq!(parse_level(""), Some(Level::Info));
        assert_eq!(parse_level("loud"), None);
        assert!(Level::Error < Level::Debug);
    }
}

//! Log lines, `cudaw[PID] driver LEVEL: ...` on standard error, at the level `CUDAW_LOG`
//! names (the runtime shim's variable and levels; default `warn`).

use std::fmt::Arguments;
use std::io::Write;
use std::sync::OnceLock;

fn threshold() -> u8 {
    static LEVEL: OnceLock<u8> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        match std::env::var("CUDAW_LOG")
            .unwrap_or_default()
            .to_ascii_lowercase()
            .as_str()
        {
            "error" | "off" | "none" => 1,
            "info" => 3,
            "debug" => 4,
            "trace" => 5,
            _ => 2,
        }
    })
}

fn line(level: u8, tag: &str, args: Arguments<'_>) {
    if level <= threshold() {
        let text = format!("cudaw[{}] driver {tag}: {args}\n", std::process::id());
        let _ = std::io::stderr().lock().write_all(text.as_bytes());
    }
}

/// Something failed.
pub fn error(args: Arguments<'_>) {
    line(1, "error", args)
}
/// Something is off; cudaw carries on.
pub fn warn(args: Arguments<'_>) {
    line(2, "warn", args)
}
/// What cudaw did, once per event.
pub fn info(args: Arguments<'_>) {
    line(3, "info", args)
}
/// Details for developers.
pub fn debug(args: Arguments<'_>) {
    line(4, "debug", args)
}

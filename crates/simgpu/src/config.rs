//! simgpu's configuration, read once from the environment.

/// The default simulated device memory: 16 GiB.
pub const DEFAULT_MEM: u64 = 16 << 30;

/// What the environment configures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Device memory in bytes (`SIMGPU_MEM`, e.g. `8G`, `512M`, `1048576`).
    pub mem_bytes: u64,
}

impl Config {
    /// Reads `SIMGPU_MEM`; an unparsable value falls back to the default with a warning.
    pub fn from_env() -> Self {
        let mem_bytes = match std::env::var("SIMGPU_MEM") {
            Ok(text) => parse_size(&text).unwrap_or_else(|| {
                eprintln!("simgpu: SIMGPU_MEM={text:?} is not a size (like 8G, 512M); using 16G");
                DEFAULT_MEM
            }),
            Err(_) => DEFAULT_MEM,
        };
        Config { mem_bytes }
    }
}

/// `SIMGPU_LAUNCH_DELAY_US`: how long every kernel launch waits, inside the call, between
/// reading its arguments and queuing the kernel (0: none; read once). Widens the window in
/// which a launch is "in the driver", for tests of what waits for calls in flight.
pub fn launch_delay() -> std::time::Duration {
    static DELAY: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| {
        let us = match std::env::var("SIMGPU_LAUNCH_DELAY_US") {
            Ok(text) => text.trim().parse().unwrap_or_else(|_| {
                eprintln!("simgpu: SIMGPU_LAUNCH_DELAY_US={text:?} is not a number of microseconds; using 0");
                0
            }),
            Err(_) => 0,
        };
        std::time::Duration::from_micros(us)
    })
}

/// Parses `8G`, `512M`, `64K`, `1T`, `4096` (binary units; an optional trailing `B`/`iB`).
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (digits, shift) = match t.chars().last()? {
        'k' | 'K' => (&t[..t.len() - 1], 10),
        'm' | 'M' => (&t[..t.len() - 1], 20),
        'g' | 'G' => (&t[..t.len() - 1], 30),
        't' | 'T' => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = digits.trim().parse().ok()?;
    n.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("8G"), Some(8 << 30));
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("2k"), Some(2048));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("99999999999T"), None);
    }
}

//! Configuration, read once from the environment into one typed struct.

use crate::log::Level;
use std::path::PathBuf;
use std::sync::OnceLock;

/// How device pointers relate to device addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addressing {
    /// The pointer is the device address (default).
    Mapped,
    /// Pointers come from a range the driver never hands out and are translated.
    Translated,
}

/// Everything cudaw reads from the environment.
#[derive(Clone, Debug)]
pub struct Config {
    /// `CUDAW_LOG`.
    pub log_level: Level,
    /// `CUDAW_REAL_CUDART`: the real runtime to forward to.
    pub real_cudart: Option<PathBuf>,
    /// `CUDAW_LIBCUDA`: the driver library cudaw itself uses.
    pub libcuda: Option<PathBuf>,
    /// `CUDAW_ADDRESSING`.
    pub addressing: Addressing,
    /// Problems found while reading (reported once logging works).
    pub warnings: Vec<String>,
}

impl Config {
    /// Reads the configuration from a variable lookup (the environment, or a test's map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Config {
        let mut warnings = Vec::new();
        let log_level = match get("CUDAW_LOG") {
            None => Level::Warn,
            Some(v) => Level::parse(&v).unwrap_or_else(|| {
                warnings.push(format!(
                    "CUDAW_LOG={v:?} is not one of error, warn, info, debug, trace; using warn"
                ));
                Level::Warn
            }),
        };
        let addressing = match get("CUDAW_ADDRESSING").as_deref() {
            None | Some("") | Some("mapped") => Addressing::Mapped,
            Some("translated") => Addressing::Translated,
            Some(other) => {
                warnings.push(format!(
                    "CUDAW_ADDRESSING={other:?} is not mapped or translated; using mapped"
                ));
                Addressing::Mapped
            }
        };
        let path = |k: &str| get(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        Config {
            log_level,
            real_cudart: path("CUDAW_REAL_CUDART"),
            libcuda: path("CUDAW_LIBCUDA"),
            addressing,
            warnings,
        }
    }
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// The process's configuration, read on first use.
pub fn get() -> &'static Config {
    CONFIG.get_or_init(|| Config::from_lookup(|k| std::env::var(k).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_bad_values() {
        let c = Config::from_lookup(|_| None);
        assert_eq!(c.addressing, Addressing::Mapped);
        assert_eq!(c.log_level, Level::Warn);
        let c = Config::from_lookup(|k| match k {
            "CUDAW_ADDRESSING" => Some("sideways".into()),
            "CUDAW_LOG" => Some("debug".into()),
            _ => None,
        });
        assert_eq!(c.addressing, Addressing::Mapped);
        assert_eq!(c.log_level, Level::Debug);
        assert_eq!(c.warnings.len(), 1);
        assert!(c.warnings[0].contains("sideways"));
    }
}

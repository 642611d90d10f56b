//! The VMM's typed configuration.

use std::str::FromStr;

/// How device pointers handed to the program relate to real device addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Addressing {
    /// Pointers are real device addresses inside reservations from
    /// [`crate::Backend::reserve`], backed by physical memory the VMM maps (the default).
    #[default]
    Mapped,
    /// Pointers come from a synthetic range the driver never hands out; each allocation is
    /// backed by [`crate::Backend::alloc_linear`] and every pointer crossing to the driver
    /// goes through [`crate::Vmm::translate`].
    Translated,
}

impl FromStr for Addressing {
    type Err = String;

    /// Parses `mapped` or `translated` (the values of `CUDAW_ADDRESSING`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "mapped" => Ok(Addressing::Mapped),
            "translated" => Ok(Addressing::Translated),
            other => Err(format!(
                "addressing `{other}`, expected `mapped` or `translated`"
            )),
        }
    }
}

/// How physical memory is cut into chunks in mapped addressing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkPolicy {
    /// Size of the shared chunks small allocations are carved from, in granules (at least 1).
    pub slab_chunk_granules: u64,
    /// Allocations of at most this many bytes share chunks (slab classes); larger ones get a
    /// chunk of their own, rounded up to the granularity. `None`: an eighth of a shared
    /// chunk. `Some(0)`: no sharing, every allocation gets its own chunk.
    pub max_small: Option<u64>,
}

impl Default for ChunkPolicy {
    fn default() -> Self {
        Self {
            slab_chunk_granules: 1,
            max_small: None,
        }
    }
}

/// The VMM's configuration. `Config::default()` is mapped addressing, 1 TiB reservations,
/// no memory limit, one-granule shared chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Mapped (default) or translated addressing.
    pub addressing: Addressing,
    /// Virtual bytes asked of [`crate::Backend::reserve`] each time the address space grows
    /// (mapped addressing); a larger allocation reserves its own rounded size.
    pub reservation_size: u64,
    /// Maximum physical bytes mapped at once (granule rounding included); `None` = no limit.
    pub memory_limit: Option<u64>,
    /// Chunking of physical memory (mapped addressing).
    pub chunking: ChunkPolicy,
    /// First address of the synthetic range of translated addressing (256-byte aligned).
    pub translated_base: u64,
    /// Size in bytes of the synthetic range of translated addressing (at least 2 MiB; it is
    /// used in whole 2 MiB units from `translated_base`).
    pub translated_size: u64,
}

/// 1 TiB.
pub const DEFAULT_RESERVATION_SIZE: u64 = 1 << 40;
/// Default start of the translated range: in the upper canonical half of a 48-bit x86-64
/// address space, which user-space device allocations never occupy.
pub const DEFAULT_TRANSLATED_BASE: u64 = 0xffff_c000_0000_0000;
/// Default size of the translated range: 16 TiB.
pub const DEFAULT_TRANSLATED_SIZE: u64 = 1 << 44;
/// Alignment of every allocation, as CUDA guarantees for `cudaMalloc`.
pub const ALLOCATION_ALIGNMENT: u64 = 256;

impl Default for Config {
    fn default() -> Self {
        Self {
            addressing: Addressing::Mapped,
            reservation_size: DEFAULT_RESERVATION_SIZE,
            memory_limit: None,
            chunking: ChunkPolicy::default(),
            translated_base: DEFAULT_TRANSLATED_BASE,
            translated_size: DEFAULT_TRANSLATED_SIZE,
        }
    }
}

impl Config {
    /// Mapped addressing with the defaults.
    pub fn mapped() -> Self {
        Self::default()
    }

    /// Translated addressing with the defaults.
    pub fn translated() -> Self {
        Self {
            addressing: Addressing::Translated,
            ..Self::default()
        }
    }

    /// The same config with a memory limit.
    pub fn with_memory_limit(self, limit: u64) -> Self {
        Self {
            memory_limit: Some(limit),
            ..self
        }
    }
}

/// Parses a size as operators write it (`CUDAW_MEM_LIMIT`, `--size`): plain bytes, or a
/// number with a binary suffix `K`, `M`, `G`, `T`, optionally followed by `B` or `iB`
/// (`8G`, `512MiB`, `1.5G`, `4096`). `None` for anything else or an overflow.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let unit = unit.trim().to_ascii_uppercase();
    let unit = unit.trim_end_matches("IB").trim_end_matches('B');
    let mult: u64 = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return None,
    };
    if num.is_empty() {
        return None;
    }
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult);
    }
    let f: f64 = num.parse().ok()?;
    let v = f * mult as f64;
    (v.is_finite() && v >= 0.0 && v < u64::MAX as f64).then_some(v as u64)
}

#[cfg(test)]
mod size_tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("8G"), Some(8 << 30));
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("64k"), Some(64 << 10));
        assert_eq!(parse_size("1.5G"), Some(3 << 29));
        assert_eq!(parse_size("12X"), None);
        assert_eq!(parse_size("G"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("99999999999T"), None);
    }
}

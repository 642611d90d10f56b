//! The memory-limit syntax of `CUDAW_MEM_LIMIT` and `cudaw run --mem-limit`.
//!
//! A comma-separated list of items. An item is a limit for every device (`8G`) or for one
//! device ordinal (`1:4G`); a device named by ordinal takes its own item, the others the
//! item without an ordinal, if any. A limit is a size ([`vmm::parse_size`]: bytes, or with
//! `K`, `M`, `G`, `T`: `8G`, `512M`, `1.5G`) or a percentage of the device's total memory
//! (`75%`, `12.5%`).
//!
//! ```text
//! 8G            every device: 8 GiB
//! 75%           every device: three quarters of its memory
//! 0:8G,1:4G     device 0: 8 GiB, device 1: 4 GiB, others: no limit
//! 4G,1:50%      device 1: half its memory, every other device: 4 GiB
//! ```

use std::fmt;

/// What a valid limit is, for messages.
pub const SYNTAX: &str = "a size above 0 (bytes, or with K, M, G, T: 8G, 512M, 1.5G) or a percentage above 0 and at most 100 (75%), for every device, or per device ordinal (0:8G,1:4G; an item without an ordinal applies to the devices not named)";

/// The largest device ordinal an item may name.
pub const MAX_ORDINAL: i32 = 1023;

/// One limit as written.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limit {
    /// A size in bytes.
    Bytes(u64),
    /// A percentage of the device's total memory, in (0, 100].
    Percent(f64),
}

impl Limit {
    /// Parses `8G`, `4096`, `1.5G` or `75%`.
    pub fn parse(s: &str) -> Result<Limit, String> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p.trim().parse().map_err(|_| {
                format!(
                    "{t:?} is not a percentage (a number from 0 to 100 followed by %, e.g. 75%)"
                )
            })?;
            if !(v > 0.0 && v <= 100.0) {
                return Err(format!(
                    "{t:?}: a percentage must be above 0 and at most 100"
                ));
            }
            return Ok(Limit::Percent(v));
        }
        if t.starts_with('-') {
            return Err(format!("{t:?}: a limit must be above 0"));
        }
        match vmm::parse_size(t) {
            Some(0) => Err(format!(
                "{t:?}: a limit of 0 bytes would refuse every allocation"
            )),
            Some(n) => Ok(Limit::Bytes(n)),
            None => Err(format!(
                "{t:?} is not a size (bytes, or with K, M, G, T: 8G, 512M, 1.5G) or a percentage (75%)"
            )),
        }
    }

    /// The limit in bytes on a device with `total` bytes of memory.
    pub fn bytes(self, total: u64) -> u64 {
        match self {
            Limit::Bytes(n) => n,
            Limit::Percent(p) => ((total as f64) * p / 100.0).floor() as u64,
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Bytes(n) => write!(f, "{n}"),
            Limit::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// The limits of every device, as `CUDAW_MEM_LIMIT` gives them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemLimits {
    /// The limit of devices without their own item.
    pub default: Option<Limit>,
    /// Devices with their own item, in the order written.
    pub devices: Vec<(i32, Limit)>,
}

impl MemLimits {
    /// Parses the whole list; an empty string is no limit. Errors name the item at fault
    /// (callers add [`SYNTAX`]). `cudaw run --mem-limit` and `CUDAW_MEM_LIMIT` both take
    /// exactly what this accepts.
    pub fn parse(s: &str) -> Result<MemLimits, String> {
        let mut out = MemLimits::default();
        if s.trim().is_empty() {
            return Ok(out);
        }
        for item in s.split(',') {
            let item = item.trim();
            if item.is_empty() {
                return Err(format!(
                    "{s:?} has an empty item (items are separated by single commas: 0:8G,1:4G)"
                ));
            }
            match item.split_once(':') {
                None => {
                    if out.default.is_some() {
                        return Err(format!(
                            "{s:?} gives the limit of every device twice (write one SIZE, and ORDINAL:SIZE for devices that differ)"
                        ));
                    }
                    out.default = Some(Limit::parse(item)?);
                }
                Some((dev, limit)) => {
                    let dev = dev.trim();
                    let ordinal: i32 = dev
                        .parse()
                        .ok()
                        .filter(|o| (0..=MAX_ORDINAL).contains(o))
                        .ok_or_else(|| {
                            format!(
                                "{item:?}: {dev:?} is not a device ordinal (0 to {MAX_ORDINAL}, as in 0:8G)"
                            )
                        })?;
                    if out.devices.iter().any(|(o, _)| *o == ordinal) {
                        return Err(format!("{s:?} gives device {ordinal} two limits"));
                    }
                    let limit = Limit::parse(limit).map_err(|e| format!("{item:?}: {e}"))?;
                    out.devices.push((ordinal, limit));
                }
            }
        }
        Ok(out)
    }

    /// Whether no device has a limit.
    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.devices.is_empty()
    }

    /// The limit of device `ordinal`, as written.
    pub fn for_device(&self, ordinal: i32) -> Option<Limit> {
        self.devices
            .iter()
            .find(|(o, _)| *o == ordinal)
            .map(|(_, l)| *l)
            .or(self.default)
    }

    /// The limit of device `ordinal` in bytes, on a device with `total` bytes of memory.
    pub fn resolve(&self, ordinal: i32, total: u64) -> Option<u64> {
        self.for_device(ordinal).map(|l| l.bytes(total))
    }
}

impl fmt::Display for MemLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(d) = self.default {
            parts.push(d.to_string());
        }
        for (o, l) in &self.devices {
            parts.push(format!("{o}:{l}"));
        }
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    #[test]
    fn every_unit() {
        for (text, bytes) in [
            ("1073741824", G),
            ("1G", G),
            ("1GiB", G),
            ("1024M", G),
            ("1048576K", G),
            ("0.5T", 512 * G),
            ("1.5G", 3 * G / 2),
            (" 8g ", 8 * G),
        ] {
            let m = MemLimits::parse(text).unwrap();
            assert_eq!(m.resolve(0, 80 * G), Some(bytes), "{text}");
            assert_eq!(m.resolve(7, 80 * G), Some(bytes), "{text}");
        }
        let m = MemLimits::parse("25%").unwrap();
        assert_eq!(m.resolve(0, 4 * G), Some(G));
        let m = MemLimits::parse("12.5%").unwrap();
        assert_eq!(m.resolve(0, 8 * G), Some(G));
        assert_eq!(MemLimits::parse("100%").unwrap().resolve(0, 3), Some(3));
    }

    #[test]
    fn per_device() {
        let m = MemLimits::parse("0:8G,1:4G").unwrap();
        assert_eq!(m.resolve(0, 80 * G), Some(8 * G));
        assert_eq!(m.resolve(1, 80 * G), Some(4 * G));
        assert_eq!(m.resolve(2, 80 * G), None);
        let m = MemLimits::parse("4G, 1:50%").unwrap();
        assert_eq!(m.resolve(0, 80 * G), Some(4 * G));
        assert_eq!(m.resolve(1, 80 * G), Some(40 * G));
        assert_eq!(m.resolve(5, 80 * G), Some(4 * G));
        assert_eq!(m.to_string(), "4294967296,1:50%");
        assert_eq!(MemLimits::parse(&m.to_string()).unwrap(), m);
        assert!(MemLimits::parse("").unwrap().is_empty());
        assert!(MemLimits::parse("  ").unwrap().is_empty());
    }

    #[test]
    fn bad_input_names_the_fault() {
        for (text, says) in [
            ("lots", "is not a size"),
            ("0", "0 bytes"),
            ("0%", "above 0"),
            ("101%", "at most 100"),
            ("x%", "not a percentage"),
            ("8G,4G", "twice"),
            ("0:8G,0:4G", "two limits"),
            ("a:8G", "not a device ordinal"),
            ("-1:8G", "not a device ordinal"),
            ("0:8G,,1:4G", "empty item"),
            ("1:lots", "\"1:lots\""),
            ("8X", "not a size"),
            ("-1", "must be above 0"),
            ("-1G", "must be above 0"),
            ("-5%", "above 0"),
            ("200%", "at most 100"),
            ("nan%", "above 0"),
            ("garbage", "is not a size"),
            ("0:", "\"0:\""),
            (",", "empty item"),
            ("8G,", "empty item"),
            ("1:8G,1:8G", "two limits"),
            ("1024:8G", "not a device ordinal"),
            ("99999999999T", "not a size"),
        ] {
            let e = MemLimits::parse(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}

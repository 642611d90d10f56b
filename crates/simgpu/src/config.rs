//! simgpu's configuration, read once from the environment.

/// The default simulated device memory: 16 GiB.
pub const DEFAULT_MEM: u64 = 16 << 30;
/// The most devices simgpu simulates (`SIMGPU_DEVICES`).
pub const MAX_DEVICES: usize = 64;

/// What the environment configures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The machine's devices, by physical ordinal (`SIMGPU_DEVICES`, default 1; 0: none).
    pub devices: usize,
    /// Each physical device's memory in bytes (`SIMGPU_MEM`: one size for every device,
    /// or a comma list, device by device, whose last entry repeats).
    pub mem_bytes: Vec<u64>,
    /// The physical ordinals the process sees, in its own order (`CUDA_VISIBLE_DEVICES`):
    /// visible device `i` is physical device `visible[i]`.
    pub visible: Vec<usize>,
}

/// A configuration simgpu refuses: `cuInit` fails with `CUDA_ERROR_INVALID_VALUE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Config {
    /// Reads `SIMGPU_DEVICES`, `SIMGPU_MEM` and `CUDA_VISIBLE_DEVICES` ([`Config::from_vars`]),
    /// printing its warnings on standard error.
    pub fn from_env() -> Result<Self, ConfigError> {
        let var = |name| std::env::var(name).ok();
        let (config, warnings) = Config::from_vars(
            var("SIMGPU_DEVICES").as_deref(),
            var("SIMGPU_MEM").as_deref(),
            var("CUDA_VISIBLE_DEVICES").as_deref(),
        )?;
        for w in warnings {
            say!("simgpu: {w}");
        }
        Ok(config)
    }

    /// The configuration the three variables' values give, and warnings for people.
    ///
    /// - `SIMGPU_DEVICES`: unset means 1; a number from 0 to [`MAX_DEVICES`] (0: a machine
    ///   without GPUs, on which `cuInit` returns `CUDA_ERROR_NO_DEVICE`); anything else is
    ///   an error: the machine's shape is not guessed.
    /// - `SIMGPU_MEM`: as before, an unparsable value falls back to 16G with a warning.
    /// - `CUDA_VISIBLE_DEVICES`: see [`visible_devices`].
    pub fn from_vars(
        devices: Option<&str>,
        mem: Option<&str>,
        visible: Option<&str>,
    ) -> Result<(Self, Vec<String>), ConfigError> {
        let mut warnings = Vec::new();
        let devices = match devices {
            None => 1,
            Some(text) => parse_device_count(text)?,
        };
        if devices == 0 {
            warnings.push(
                "SIMGPU_DEVICES=0: a machine without GPUs (cuInit returns CUDA_ERROR_NO_DEVICE)"
                    .to_owned(),
            );
        }
        let sizes = match mem {
            None => vec![DEFAULT_MEM],
            Some(text) => parse_size_list(text).unwrap_or_else(|| {
                warnings.push(format!(
                    "SIMGPU_MEM={text:?} is not a size (like 8G, 512M) or a comma list of \
                     sizes; using 16G"
                ));
                vec![DEFAULT_MEM]
            }),
        };
        let last = *sizes.last().unwrap_or(&DEFAULT_MEM);
        let mem_bytes = (0..devices)
            .map(|i| sizes.get(i).copied().unwrap_or(last))
            .collect();
        let uuids: Vec<[u8; 16]> = (0..devices).map(uuid_of).collect();
        Ok((
            Config {
                devices,
                mem_bytes,
                visible: visible_devices(visible, &uuids),
            },
            warnings,
        ))
    }
}

/// `SIMGPU_DEVICES`: a whole number from 0 to [`MAX_DEVICES`].
pub fn parse_device_count(text: &str) -> Result<usize, ConfigError> {
    match text.trim().parse::<usize>() {
        Ok(n) if n <= MAX_DEVICES => Ok(n),
        _ => Err(ConfigError(format!(
            "SIMGPU_DEVICES={text:?} is not a device count (a whole number from 0 to \
             {MAX_DEVICES}); cuInit fails with CUDA_ERROR_INVALID_VALUE"
        ))),
    }
}

/// `8G` or `8G,4G,…`: every entry a size ([`parse_size`]).
fn parse_size_list(text: &str) -> Option<Vec<u64>> {
    text.split(',').map(parse_size).collect()
}

/// The UUID of physical device `ordinal`: stable, distinct from the first four bytes on
/// (so a `GPU-xxxxxxxx` prefix names one device), then `SIMGPU-DEV` and the ordinal in
/// two ASCII digits.
pub fn uuid_of(ordinal: usize) -> [u8; 16] {
    let key = format!("simgpu-device-{ordinal}");
    let hash = key.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let mut uuid = [0u8; 16];
    uuid[..4].copy_from_slice(&hash.to_be_bytes());
    uuid[4..14].copy_from_slice(b"SIMGPU-DEV");
    uuid[14] = b'0' + (ordinal / 10 % 10) as u8;
    uuid[15] = b'0' + (ordinal % 10) as u8;
    uuid
}

/// A UUID as `nvidia-smi -L` and `CUDA_VISIBLE_DEVICES` write it:
/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn uuid_text(uuid: &[u8; 16]) -> String {
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The physical ordinals `CUDA_VISIBLE_DEVICES` makes visible, in its order, as the
/// driver reads it: unset, every device; empty, none; else a comma list whose entries are
/// ordinals (`1`) or UUIDs (`GPU-…`, a prefix naming exactly one device, dashes
/// optional as in the driver); the list stops at the first entry that names no device (out
/// of range, unknown, ambiguous, repeated, or not a number), so `0,7,1` on two devices is
/// device 0 alone. Spaces around entries are ignored.
pub fn visible_devices(spec: Option<&str>, uuids: &[[u8; 16]]) -> Vec<usize> {
    let Some(spec) = spec else {
        return (0..uuids.len()).collect();
    };
    let mut visible = Vec::new();
    for entry in spec.split(',') {
        let entry = entry.trim();
        let found = if let Some(prefix) = entry.strip_prefix("GPU-") {
            let want: String = prefix.chars().filter(|&c| c != '-').collect();
            let want = want.to_ascii_lowercase();
            let mut matching = uuids.iter().enumerate().filter(|(_, u)| {
                let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
                !want.is_empty() && hex.starts_with(&want)
            });
            match (matching.next(), matching.next()) {
                (Some((i, _)), None) => Some(i),
                _ => None,
            }
        } else {
            entry.parse::<usize>().ok().filter(|&i| i < uuids.len())
        };
        match found {
            Some(i) if !visible.contains(&i) => visible.push(i),
            _ => break,
        }
    }
    visible
}

/// `SIMGPU_LAUNCH_DELAY_US`: how long every kernel launch waits, inside the call, between
/// reading its arguments and queuing the kernel (0: none; read once). Widens the window in
/// which a launch is "in the driver", for tests of what waits for calls in flight.
pub fn launch_delay() -> std::time::Duration {
    static DELAY: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| {
        let us = match std::env::var("SIMGPU_LAUNCH_DELAY_US") {
            Ok(text) => text.trim().parse().unwrap_or_else(|_| {
                say!("simgpu: SIMGPU_LAUNCH_DELAY_US={text:?} is not a number of microseconds; using 0");
                0
            }),
            Err(_) => 0,
        };
        std::time::Duration::from_micros(us)
    })
}

/// `SIMGPU_COPY_DELAY_US`: how long every copy of the driver API waits on its stream,
/// before moving its bytes (0: none; read once). Makes copies slow on the device side
/// only, as DMA is next to host work: a test shows that work queued after a copy waits
/// for it.
pub fn copy_delay() -> std::time::Duration {
    static DELAY: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| {
        let us = match std::env::var("SIMGPU_COPY_DELAY_US") {
            Ok(text) => text.trim().parse().unwrap_or_else(|_| {
                say!("simgpu: SIMGPU_COPY_DELAY_US={text:?} is not a number of microseconds; using 0");
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

    fn uuids(n: usize) -> Vec<[u8; 16]> {
        (0..n).map(uuid_of).collect()
    }

    #[test]
    fn visible_devices_read_as_the_driver_reads_them() {
        let two = uuids(2);
        let four = uuids(4);
        let u1 = uuid_text(&two[1]);
        let u1_short = &u1[..12]; // GPU-xxxxxxxx
        type Row<'a> = (Option<&'a str>, &'a [[u8; 16]], &'a [usize]);
        let table: &[Row] = &[
            (None, &two, &[0, 1]),
            (None, &[], &[]),
            (Some(""), &two, &[]),
            (Some("   "), &two, &[]),
            (Some("0"), &two, &[0]),
            (Some("1"), &two, &[1]),
            (Some("1,0"), &two, &[1, 0]),
            (Some(" 1 , 0 "), &two, &[1, 0]),
            (Some("2"), &two, &[]),
            (Some("0,2,1"), &two, &[0]),
            (Some("0,0,1"), &two, &[0]),
            (Some("-1"), &two, &[]),
            (Some("1,-1,0"), &two, &[1]),
            (Some("0,x"), &two, &[0]),
            (Some("0,"), &two, &[0]),
            (Some("3,1"), &four, &[3, 1]),
            (Some(u1_short), &two, &[1]),
            (Some(&u1), &two, &[1]),
            (Some("GPU-"), &two, &[]),
            (Some("GPU-zz"), &two, &[]),
            (Some("MIG-1234"), &two, &[]),
        ];
        for &(spec, uuids, want) in table {
            assert_eq!(
                visible_devices(spec, uuids),
                want,
                "CUDA_VISIBLE_DEVICES={spec:?}"
            );
        }
        let mixed = format!("{},0", &u1[..8]);
        assert_eq!(visible_devices(Some(&mixed), &two), [1, 0]);
        let upper = u1.to_ascii_uppercase();
        assert_eq!(visible_devices(Some(&upper), &two), [1]);
    }

    #[test]
    fn uuids_are_stable_distinct_and_distinct_by_prefix() {
        assert_eq!(uuid_of(3), uuid_of(3));
        let all = uuids(MAX_DEVICES);
        let mut prefixes: Vec<&[u8]> = all.iter().map(|u| &u[..4]).collect();
        prefixes.sort();
        prefixes.dedup();
        assert_eq!(prefixes.len(), MAX_DEVICES, "8-digit prefixes collide");
        assert_eq!(&all[12][4..], b"SIMGPU-DEV12");
        let text = uuid_text(&all[0]);
        assert_eq!(text.len(), 40);
        assert!(
            text.starts_with("GPU-") && text[4..].split('-').count() == 5,
            "{text}"
        );
    }

    #[test]
    fn device_count_memory_and_visibility_from_the_variables() {
        let (c, w) = Config::from_vars(None, None, None).unwrap();
        assert_eq!(
            (c.devices, c.mem_bytes.clone(), c.visible),
            (1, vec![DEFAULT_MEM], vec![0])
        );
        assert!(w.is_empty());
        let (c, _) = Config::from_vars(Some("3"), Some("8G,4G"), Some("2,0")).unwrap();
        assert_eq!(c.devices, 3);
        assert_eq!(c.mem_bytes, [8 << 30, 4 << 30, 4 << 30]);
        assert_eq!(c.visible, [2, 0]);
        let (c, w) = Config::from_vars(Some(" 2 "), Some("lots"), Some("")).unwrap();
        assert_eq!((c.devices, c.visible.len()), (2, 0));
        assert_eq!(c.mem_bytes, [DEFAULT_MEM, DEFAULT_MEM]);
        assert!(w[0].contains("SIMGPU_MEM=\"lots\""), "{w:?}");
        let (c, w) = Config::from_vars(Some("0"), None, None).unwrap();
        assert_eq!((c.devices, c.visible.len()), (0, 0));
        assert!(w[0].contains("CUDA_ERROR_NO_DEVICE"), "{w:?}");
        for bad in ["", "two", "-1", "65", "1.5", "99999999999999999999999"] {
            let e = Config::from_vars(Some(bad), None, None).unwrap_err();
            assert!(
                e.0.contains(&format!("SIMGPU_DEVICES={bad:?}"))
                    && e.0.contains("CUDA_ERROR_INVALID_VALUE"),
                "{e}"
            );
        }
        assert_eq!(parse_device_count("64"), Ok(64));
    }

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

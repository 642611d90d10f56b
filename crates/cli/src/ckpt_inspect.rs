//! `cudaw-ckpt inspect`: an image's header, producer, GPU and allocation table, and with
//! `--verify` every chunk checksum and the image digest.

use std::fs::File;
use std::path::Path;

use ckpt::{Addressing, ImageError, ImageReader, Summary};

use crate::ckpt_client::{fail, Kind};

/// How many allocations the table shows without `--all`.
const SHOWN: usize = 20;

/// An image error as a failure: the file system's (`io`) or the image's (`bad_image`).
pub fn image_error(path: &Path, e: ImageError) -> anyhow::Error {
    match e {
        ImageError::Io { .. } => fail(Kind::Io, format!("{}: {e}", path.display())),
        e => fail(Kind::BadImage, format!("{}: {e}", path.display())),
    }
}

/// Opens `path` and checks its header, metadata, table and trailer.
pub fn open(path: &Path) -> anyhow::Result<ImageReader<File>> {
    if path.is_dir() {
        return Err(fail(
            Kind::Io,
            format!("{} is a folder, not an image", path.display()),
        ));
    }
    // A regular file only: a FIFO or a device is refused instead of blocking.
    let f = cudaw_files::open_input(path, cudaw_files::Follow::Yes)
        .map_err(|e| crate::ckpt_client::file_failure("open", path, e))?;
    ImageReader::open(f).map_err(|e| image_error(path, e))
}

/// `cudaw-ckpt inspect`.
pub fn run(path: &Path, verify: bool, json: bool, all: bool) -> anyhow::Result<()> {
    let mut r = open(path)?;
    let mut summary = r.summary();
    if !json {
        print_summary(path, &summary, all)?;
    }
    if verify {
        match r.verify() {
            Ok(v) => summary.verified = Some(v),
            Err(e) => return Err(image_error(path, e)),
        }
    }
    if json {
        outln!("{}", serde_json::to_string(&summary)?)?;
    } else if let Some(v) = summary.verified {
        outln!(
            "  verified  every checksum matches: {} chunks, {} bytes, digest {:#018x}",
            v.chunks,
            v.data_bytes,
            v.digest
        )?;
    }
    Ok(())
}

fn mib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

fn addressing(a: Addressing) -> String {
    match a {
        Addressing::Mapped => "mapped".to_owned(),
        Addressing::Translated => "translated".to_owned(),
        Addressing::Other(c) => format!("unknown ({c})"),
    }
}

/// `YYYY-MM-DD hh:mm:ss UTC` from nanoseconds since the Unix epoch.
pub fn utc(nanos: u64) -> String {
    let secs = nanos / 1_000_000_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn print_summary(path: &Path, s: &Summary, all: bool) -> anyhow::Result<()> {
    let p = &s.process;
    let g = &s.gpu;
    outln!(
        "{}: cudaw checkpoint image, format {}, {} bytes ({})",
        path.display(),
        s.format_version,
        s.file_len,
        mib(s.file_len)
    )?;
    outln!(
        "  process   {} {} on host {}",
        p.pid,
        if p.executable.is_empty() {
            "(executable unknown)"
        } else {
            &p.executable
        },
        if p.hostname.is_empty() {
            "(unknown)"
        } else {
            &p.hostname
        }
    )?;
    outln!(
        "            cudaw {}, CUDA {} runtime, {} addressing",
        p.cudaw_version,
        p.cuda_runtime_major,
        addressing(p.addressing)
    )?;
    outln!("  created   {}", utc(p.created_unix_nanos))?;
    if g.name.is_empty() && s.allocation_count == 0 {
        outln!("  GPU       none (the process had no device memory)")?;
    } else {
        for g in std::iter::once(g).chain(&s.other_gpus) {
            let device = g
                .ordinal
                .map_or_else(|| "device ?".to_owned(), |o| format!("device {o}"));
            outln!(
                "  GPU       {device}: {}, uuid {}, compute capability {}.{}, {}",
                if g.name.is_empty() {
                    "(name unknown)"
                } else {
                    &g.name
                },
                if g.uuid.is_empty() {
                    "unknown"
                } else {
                    &g.uuid
                },
                g.compute_capability_major,
                g.compute_capability_minor,
                mib(g.total_memory)
            )?;
        }
    }
    outln!(
        "  data      {} allocations, {} bytes ({}) in {} chunks of up to {}",
        s.allocation_count,
        s.data_bytes,
        mib(s.data_bytes),
        s.chunk_count,
        mib(s.chunk_size)
    )?;
    if s.handle_ranges > 0 {
        outln!(
            "            of which {} driver-handle ranges, {} bytes ({}): cuMemCreate memory mapped by the program",
            s.handle_ranges,
            s.handle_bytes,
            mib(s.handle_bytes)
        )?;
    }
    outln!("  digest    {:#018x}", s.digest)?;
    if s.allocations.is_empty() {
        return Ok(());
    }
    outln!(
        "  {:>8}  {:>18}  {:>14}  {:>8}  {:>4}  {:>14}  driver handle",
        "id",
        "base",
        "size",
        "order",
        "tag",
        "file offset"
    )?;
    let n = if all { s.allocations.len() } else { SHOWN };
    for a in s.allocations.iter().take(n) {
        let r = &a.record;
        let handle = r.handle.map_or(String::new(), |h| {
            format!(
                "  {:#x} (+{:#x} of {} bytes)",
                h.handle, h.offset, h.handle_size
            )
        });
        outln!(
            "  {:>8}  {:>#18x}  {:>14}  {:>8}  {:>4}  {:>14}{handle}",
            r.id,
            r.base,
            r.size,
            r.order,
            r.tag,
            a.data_offset
        )?;
    }
    if s.allocations.len() > n {
        outln!(
            "  ... and {} more (--all lists every allocation)",
            s.allocations.len() - n
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::utc;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400 * 1_000_000_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_790_000_000_123_456_789), "2026-09-21 14:13:20 UTC");
    }
}

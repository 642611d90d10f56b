//! Header, chunk and trailer encodings, and the data layout computed from a table.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use crate::error::ImageError;
use crate::meta::{AllocationEntry, AllocationRecord, ImageMetadata};

/// First 8 bytes of every image.
pub const MAGIC: [u8; 8] = *b"CUDAWIMG";
/// Last 8 bytes of every image.
pub const END_MAGIC: [u8; 8] = *b"CUDAWEND";
/// The format major version this build writes and reads.
pub const FORMAT_MAJOR: u16 = 1;
/// The format minor version this build writes (it reads any minor of its major).
pub const FORMAT_MINOR: u16 = 3;
/// Header length in format 1.0.
pub const HEADER_LEN: u64 = 128;
/// Longest header accepted (newer minors may extend it).
pub const MAX_HEADER_LEN: u64 = 4096;
/// Longest metadata section accepted.
pub const MAX_METADATA_LEN: u64 = 1 << 30;
/// Bytes before a chunk's payload (allocation id, offset, length).
pub const CHUNK_HEADER_LEN: u64 = 24;
/// Bytes after a chunk's payload (checksum).
pub const CHUNK_FOOTER_LEN: u64 = 8;
/// Per-chunk bytes besides the payload.
pub const CHUNK_OVERHEAD: u64 = CHUNK_HEADER_LEN + CHUNK_FOOTER_LEN;
/// Trailer length in format 1.0.
pub const TRAILER_LEN: u64 = 32;
/// Default chunk payload size: 8 MiB.
pub const DEFAULT_CHUNK_SIZE: u64 = 8 << 20;
/// Smallest chunk size accepted.
pub const MIN_CHUNK_SIZE: u64 = 16;
/// Largest chunk size accepted: 1 GiB.
pub const MAX_CHUNK_SIZE: u64 = 1 << 30;
/// Flag bits a reader must understand (the low 32).
pub const REQUIRED_FLAGS_MASK: u64 = 0xffff_ffff;
/// Required flag (1.2): the table holds driver-handle ranges (records of kind 1), which a
/// 1.0 or 1.1 reader would take for runtime allocations; it refuses the image instead.
pub const FLAG_DRIVER_HANDLES: u64 = 1;
/// Required flag (1.3): the table holds memory of more than one device, which a 1.0 to
/// 1.2 reader would take for one device's; it refuses the image instead.
pub const FLAG_DEVICES: u64 = 2;
/// Required flags this build knows.
pub const KNOWN_REQUIRED_FLAGS: u64 = FLAG_DRIVER_HANDLES | FLAG_DEVICES;

/// The fixed header, as decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// Format major version.
    pub major: u16,
    /// Format minor version.
    pub minor: u16,
    /// Header length in bytes.
    pub header_len: u64,
    /// Feature flags (low 32 bits required, high 32 bits optional).
    pub flags: u64,
    /// Payload bytes per chunk (the last chunk of an allocation may be shorter).
    pub chunk_size: u64,
    /// File offset of the metadata section.
    pub metadata_offset: u64,
    /// Its length.
    pub metadata_len: u64,
    /// File offset of the data section.
    pub data_offset: u64,
    /// Its length.
    pub data_len: u64,
    /// File offset of the trailer.
    pub trailer_offset: u64,
    /// Its length.
    pub trailer_len: u64,
    /// Length of the whole image.
    pub file_len: u64,
    /// xxh3-64 of the metadata section.
    pub metadata_checksum: u64,
    /// Number of allocations.
    pub allocation_count: u64,
    /// Number of chunks in the data section.
    pub chunk_count: u64,
}

impl Header {
    /// The 1.0 encoding (128 bytes, header checksum last).
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN as usize] {
        let mut b = [0u8; HEADER_LEN as usize];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..10].copy_from_slice(&self.major.to_le_bytes());
        b[10..12].copy_from_slice(&self.minor.to_le_bytes());
        b[12..16].copy_from_slice(&(self.header_len as u32).to_le_bytes());
        let fields = [
            self.flags,
            self.chunk_size,
            self.metadata_offset,
            self.metadata_len,
            self.data_offset,
            self.data_len,
            self.trailer_offset,
            self.trailer_len,
            self.file_len,
            self.metadata_checksum,
            self.allocation_count,
            self.chunk_count,
            0,
        ];
        for (i, v) in fields.iter().enumerate() {
            b[16 + 8 * i..24 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        let sum = xxh3_64(&b[..120]);
        b[120..128].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Decodes a whole header (`bytes.len()` is the header length read from bytes 12..16,
    /// already bounds-checked) whose magic and major were checked.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Header, ImageError> {
        let n = bytes.len();
        let stored = u64_at(bytes, n - 8);
        let computed = xxh3_64(&bytes[..n - 8]);
        if stored != computed {
            return Err(ImageError::SectionChecksum {
                what: "header",
                stored,
                computed,
            });
        }
        let f = |i: usize| u64_at(bytes, 16 + 8 * i);
        Ok(Header {
            major: u16::from_le_bytes([bytes[8], bytes[9]]),
            minor: u16::from_le_bytes([bytes[10], bytes[11]]),
            header_len: n as u64,
            flags: f(0),
            chunk_size: f(1),
            metadata_offset: f(2),
            metadata_len: f(3),
            data_offset: f(4),
            data_len: f(5),
            trailer_offset: f(6),
            trailer_len: f(7),
            file_len: f(8),
            metadata_checksum: f(9),
            allocation_count: f(10),
            chunk_count: f(11),
        })
    }

    /// Checks that the sections follow each other inside the image.
    pub(crate) fn check_sections(&self) -> Result<(), ImageError> {
        let unknown = self.flags & REQUIRED_FLAGS_MASK & !KNOWN_REQUIRED_FLAGS;
        if unknown != 0 {
            return Err(ImageError::UnsupportedFlags { flags: unknown });
        }
        check_chunk_size(self.chunk_size)?;
        let malformed = |offset: u64, detail: String| ImageError::Malformed {
            what: "header",
            offset,
            detail,
        };
        if self.metadata_len > MAX_METADATA_LEN {
            return Err(malformed(
                40,
                format!(
                    "metadata length {} (at most {MAX_METADATA_LEN})",
                    self.metadata_len
                ),
            ));
        }
        if self.trailer_len < TRAILER_LEN {
            return Err(malformed(
                72,
                format!(
                    "trailer length {} (at least {TRAILER_LEN})",
                    self.trailer_len
                ),
            ));
        }
        // Each section starts at or after the end of the previous one.
        let sections = [
            ("metadata", 32, self.metadata_offset, self.metadata_len),
            ("data", 48, self.data_offset, self.data_len),
            ("trailer", 64, self.trailer_offset, self.trailer_len),
        ];
        let mut prev_end = self.header_len;
        for (name, field, off, len) in sections {
            if off < prev_end {
                return Err(malformed(
                    field,
                    format!("{name} section at {off} starts before offset {prev_end}"),
                ));
            }
            prev_end = off.checked_add(len).ok_or_else(|| {
                malformed(
                    field,
                    format!("{name} section at {off} of {len} bytes overflows"),
                )
            })?;
        }
        if prev_end != self.file_len {
            return Err(ImageError::Inconsistent {
                what: "image length (header) against the end of its trailer",
                found: self.file_len,
                expected: prev_end,
            });
        }
        Ok(())
    }
}

/// Rejects chunk sizes outside [`MIN_CHUNK_SIZE`]..=[`MAX_CHUNK_SIZE`].
pub(crate) fn check_chunk_size(chunk_size: u64) -> Result<(), ImageError> {
    if (MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&chunk_size) {
        Ok(())
    } else {
        Err(ImageError::ChunkSize(chunk_size))
    }
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// A chunk header: allocation id, offset within the allocation, payload length.
pub(crate) fn chunk_header(id: u64, offset: u64, len: u64) -> [u8; CHUNK_HEADER_LEN as usize] {
    let mut b = [0u8; CHUNK_HEADER_LEN as usize];
    b[0..8].copy_from_slice(&id.to_le_bytes());
    b[8..16].copy_from_slice(&offset.to_le_bytes());
    b[16..24].copy_from_slice(&len.to_le_bytes());
    b
}

/// Number of chunks holding `size` bytes.
pub(crate) fn chunks_of(size: u64, chunk_size: u64) -> u64 {
    size.div_ceil(chunk_size)
}

/// The data section's layout for a table.
pub(crate) struct Layout {
    pub entries: Vec<AllocationEntry>,
    pub data_len: u64,
    pub chunk_count: u64,
    pub data_bytes: u64,
}

/// Checks a table (unique ids, no address overflow, no overlap) and lays out its data from
/// `data_offset`, allocation after allocation in table order.
pub(crate) fn layout(
    table: &[AllocationRecord],
    chunk_size: u64,
    data_offset: u64,
) -> Result<Layout, ImageError> {
    check_table(table)?;
    let mut entries = Vec::with_capacity(table.len());
    let mut at = data_offset;
    let mut chunk_count = 0u64;
    let mut data_bytes = 0u64;
    let overflow = |id: u64| ImageError::Malformed {
        what: "allocation table",
        offset: 0,
        detail: format!("the data of allocation {id} ends past 2^64 bytes"),
    };
    for r in table {
        let n = chunks_of(r.size, chunk_size);
        let span = n
            .checked_mul(CHUNK_OVERHEAD)
            .and_then(|o| o.checked_add(r.size))
            .ok_or_else(|| overflow(r.id))?;
        entries.push(AllocationEntry {
            record: *r,
            data_offset: at,
            chunk_count: n,
        });
        at = at.checked_add(span).ok_or_else(|| overflow(r.id))?;
        // Both sums are at most the sum of the spans, which fits (checked above).
        chunk_count += n;
        data_bytes += r.size;
    }
    Ok(Layout {
        entries,
        data_len: at - data_offset,
        chunk_count,
        data_bytes,
    })
}

/// Unique ids, ends within 64 bits, no two allocations sharing a byte.
pub(crate) fn check_table(table: &[AllocationRecord]) -> Result<(), ImageError> {
    let mut by_base: Vec<&AllocationRecord> = table.iter().collect();
    for r in &by_base {
        if r.end().is_none() {
            return Err(ImageError::AddressOverflow {
                id: r.id,
                base: r.base,
                size: r.size,
            });
        }
    }
    by_base.sort_unstable_by_key(|r| (r.base, r.size));
    let mut last: Option<&AllocationRecord> = None;
    for r in by_base.iter().filter(|r| r.size > 0) {
        if let Some(p) = last {
            let p_end = p.base + p.size;
            if r.base < p_end {
                return Err(ImageError::Overlap {
                    a: p.id,
                    a_base: p.base,
                    a_end: p_end,
                    b: r.id,
                    b_base: r.base,
                    b_end: r.base + r.size,
                });
            }
        }
        last = Some(r);
    }
    let mut ids: Vec<u64> = table.iter().map(|r| r.id).collect();
    ids.sort_unstable();
    if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
        return Err(ImageError::DuplicateId { id: w[0] });
    }
    Ok(())
}

/// The header flags a table needs: [`FLAG_DRIVER_HANDLES`] when it holds a driver-handle
/// range, [`FLAG_DEVICES`] when it holds memory of more than one device.
pub(crate) fn table_flags(table: &[AllocationRecord]) -> u64 {
    let mut flags = 0;
    if table.iter().any(|r| r.handle.is_some()) {
        flags |= FLAG_DRIVER_HANDLES;
    }
    if table.windows(2).any(|w| w[0].device != w[1].device) {
        flags |= FLAG_DEVICES;
    }
    flags
}

/// Every device of `meta` named once, every record's device among them (when the image
/// knows its devices' ordinals: a 1.0 image does not).
pub(crate) fn check_devices(
    meta: &ImageMetadata,
    table: &[AllocationRecord],
) -> Result<(), ImageError> {
    let mut ordinals: Vec<u32> = meta.gpus().filter_map(|g| g.ordinal).collect();
    if ordinals.is_empty() && meta.other_gpus.is_empty() {
        return Ok(());
    }
    if meta.gpus().any(|g| g.ordinal.is_none()) {
        return Err(ImageError::UnknownDevice {
            id: None,
            device: None,
        });
    }
    ordinals.sort_unstable();
    if let Some(w) = ordinals.windows(2).find(|w| w[0] == w[1]) {
        return Err(ImageError::DuplicateDevice { ordinal: w[0] });
    }
    match table
        .iter()
        .find(|r| ordinals.binary_search(&r.device).is_err())
    {
        Some(r) => Err(ImageError::UnknownDevice {
            id: Some(r.id),
            device: Some(r.device),
        }),
        None => Ok(()),
    }
}

/// The trailer: chunk count, payload bytes, whole-image digest, end marker.
pub(crate) fn trailer(
    chunk_count: u64,
    data_bytes: u64,
    digest: u64,
) -> [u8; TRAILER_LEN as usize] {
    let mut b = [0u8; TRAILER_LEN as usize];
    b[0..8].copy_from_slice(&chunk_count.to_le_bytes());
    b[8..16].copy_from_slice(&data_bytes.to_le_bytes());
    b[16..24].copy_from_slice(&digest.to_le_bytes());
    b[24..32].copy_from_slice(&END_MAGIC);
    b
}

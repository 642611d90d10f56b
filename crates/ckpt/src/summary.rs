//! A serialisable description of an image, for `cudaw-ckpt inspect`.

use serde::{Deserialize, Serialize};

use crate::format::Header;
use crate::meta::{AllocationEntry, GpuInfo, ProcessInfo};
use crate::reader::{Trailer, VerifyReport};

/// Header, metadata and table of an image (`serde_json::to_string(&summary)` for
/// `inspect --json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// `"major.minor"` of the image's format.
    pub format_version: String,
    /// Header flags.
    pub flags: u64,
    /// Payload bytes per chunk.
    pub chunk_size: u64,
    /// Image length in bytes.
    pub file_len: u64,
    /// The producing process.
    pub process: ProcessInfo,
    /// Its GPU (the device of lowest ordinal whose memory the image holds).
    pub gpu: GpuInfo,
    /// The other devices whose memory the image holds (format 1.3).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_gpus: Vec<GpuInfo>,
    /// Number of allocations (driver-handle ranges included).
    pub allocation_count: u64,
    /// Of them, ranges of driver-level handles (format 1.2).
    #[serde(default)]
    pub handle_ranges: u64,
    /// Their bytes.
    #[serde(default)]
    pub handle_bytes: u64,
    /// Allocation bytes in all.
    pub data_bytes: u64,
    /// Chunks in all.
    pub chunk_count: u64,
    /// The trailer's whole-image digest.
    pub digest: u64,
    /// The allocations, in image order.
    pub allocations: Vec<AllocationEntry>,
    /// Set by the caller after [`crate::ImageReader::verify`] (`None`: not verified).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<VerifyReport>,
}

impl Summary {
    pub(crate) fn new(
        header: &Header,
        meta: &crate::ImageMetadata,
        entries: &[AllocationEntry],
        trailer: &Trailer,
    ) -> Summary {
        Summary {
            format_version: format!("{}.{}", header.major, header.minor),
            flags: header.flags,
            chunk_size: header.chunk_size,
            file_len: header.file_len,
            process: meta.process.clone(),
            gpu: meta.gpu.clone(),
            other_gpus: meta.other_gpus.clone(),
            allocation_count: entries.len() as u64,
            handle_ranges: entries.iter().filter(|e| e.record.handle.is_some()).count() as u64,
            handle_bytes: entries
                .iter()
                .filter(|e| e.record.handle.is_some())
                .map(|e| e.record.size)
                .sum(),
            data_bytes: trailer.data_bytes,
            chunk_count: trailer.chunk_count,
            digest: trailer.digest,
            allocations: entries.to_vec(),
            verified: None,
        }
    }
}

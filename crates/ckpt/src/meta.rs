//! What an image records about the process, the GPU and the allocations, and its encoding.

use serde::{Deserialize, Serialize};

use crate::error::ImageError;

/// Longest string field accepted (bytes).
pub const MAX_STRING_LEN: u32 = 64 * 1024;

/// How the process's pointers relate to device addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Addressing {
    /// Pointers are real device addresses (encoded 0).
    Mapped,
    /// Pointers are translated to backing allocations (encoded 1).
    Translated,
    /// A mode this build does not know (an image from a newer minor version).
    Other(u8),
}

impl Addressing {
    fn code(self) -> u8 {
        match self {
            Addressing::Mapped => 0,
            Addressing::Translated => 1,
            Addressing::Other(c) => c,
        }
    }

    fn from_code(c: u8) -> Self {
        match c {
            0 => Addressing::Mapped,
            1 => Addressing::Translated,
            c => Addressing::Other(c),
        }
    }
}

/// The process that produced the image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// Its PID.
    pub pid: u32,
    /// Its executable path.
    pub executable: String,
    /// The host it ran on.
    pub hostname: String,
    /// The cudaw version that wrote the image.
    pub cudaw_version: String,
    /// When the image was made, nanoseconds since the Unix epoch.
    pub created_unix_nanos: u64,
    /// The CUDA runtime major version the process uses.
    pub cuda_runtime_major: u32,
    /// Its addressing mode.
    pub addressing: Addressing,
}

/// The GPU the process ran on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// The device name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// The device UUID (`GPU-…`).
    pub uuid: String,
    /// Compute capability major.
    pub compute_capability_major: u32,
    /// Compute capability minor.
    pub compute_capability_minor: u32,
    /// Total device memory in bytes.
    pub total_memory: u64,
    /// The CUDA device ordinal in the producing process (format 1.1; `None` in a 1.0
    /// image). With the name it identifies the GPU when the UUID is unknown (empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordinal: Option<u32>,
}

/// Process and GPU description of an image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageMetadata {
    /// The producing process.
    pub process: ProcessInfo,
    /// Its GPU: the device of lowest ordinal whose memory the image holds (what a 1.0 to
    /// 1.2 reader sees).
    pub gpu: GpuInfo,
    /// The other devices whose memory the image holds, by ordinal (format 1.3; empty for an
    /// image of one device, and in older images).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_gpus: Vec<GpuInfo>,
}

impl ImageMetadata {
    /// Every device of the image: [`ImageMetadata::gpu`], then the others.
    pub fn gpus(&self) -> impl Iterator<Item = &GpuInfo> {
        std::iter::once(&self.gpu).chain(&self.other_gpus)
    }

    /// The device of ordinal `ordinal`, if the image names it.
    pub fn gpu_of(&self, ordinal: u32) -> Option<&GpuInfo> {
        self.gpus().find(|g| g.ordinal == Some(ordinal))
    }
}

/// One allocation of the process (what the shim converts `vmm::Allocation` into).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AllocationRecord {
    /// Its id (unique within the table).
    pub id: u64,
    /// Its base address, as the program holds it.
    pub base: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Its creation sequence number.
    pub order: u64,
    /// The caller's opaque tag.
    pub tag: u32,
    /// Set when the range is memory of a driver-level handle (`cuMemCreate`) mapped at
    /// `base` (format 1.2): what re-creates and re-maps it. `None`: a runtime allocation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handle: Option<HandleRange>,
    /// The ordinal of the device it is memory of (format 1.3; in an older image, the
    /// image's one device: [`GpuInfo::ordinal`], 0 when unknown).
    #[serde(default)]
    pub device: u32,
}

/// The driver handle behind a handle-backed range (format 1.2): one mapping of the handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HandleRange {
    /// The handle as the program holds it (cudaw's virtual handle).
    pub handle: u64,
    /// The handle's size in bytes (the range is `size` bytes of it from `offset`).
    pub handle_size: u64,
    /// Offset of the range within the handle (`cuMemMap`'s `offset`).
    pub offset: u64,
    /// The `CUmemAllocationProp` the handle was created with (32 bytes, as the driver
    /// lays it out).
    pub prop: [u8; PROP_LEN],
}

/// Bytes of a `CUmemAllocationProp` in a [`HandleRange`].
pub const PROP_LEN: usize = 32;

/// Record kind of a runtime allocation (the 1.0 and 1.1 reserved field, 0).
pub(crate) const KIND_ALLOCATION: u32 = 0;
/// Record kind of a driver-handle range (1.2).
pub(crate) const KIND_HANDLE: u32 = 1;

impl AllocationRecord {
    /// One past its last byte, `None` on overflow.
    pub fn end(&self) -> Option<u64> {
        self.base.checked_add(self.size)
    }
}

/// An allocation as the image holds it: the record and where its data starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AllocationEntry {
    /// The allocation.
    #[serde(flatten)]
    pub record: AllocationRecord,
    /// File offset of its first chunk header.
    pub data_offset: u64,
    /// Number of chunks holding its data.
    pub chunk_count: u64,
}

/// Bytes of one allocation record in formats 1.0 and 1.1 (the fields every record has).
pub(crate) const RECORD_LEN_1_0: u32 = 48;
/// Bytes of one allocation record in format 1.2 (the handle fields added).
pub(crate) const RECORD_LEN_1_2: u32 = RECORD_LEN_1_0 + 24 + PROP_LEN as u32;
/// Bytes of one allocation record in format 1.3 (the device ordinal and a reserved u32
/// added).
pub(crate) const RECORD_LEN: u32 = RECORD_LEN_1_2 + 8;

/// Little-endian encoder.
#[derive(Default)]
pub(crate) struct Enc(pub Vec<u8>);

impl Enc {
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn bytes(&mut self, v: &[u8]) {
        self.0.extend_from_slice(v);
    }
    /// A string: u32 length, UTF-8 bytes. Longer strings are cut at a character boundary.
    pub fn str(&mut self, s: &str) {
        let mut end = s.len().min(MAX_STRING_LEN as usize);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.u32(end as u32);
        self.bytes(&s.as_bytes()[..end]);
    }
    /// A block: u32 length, then what `f` writes.
    pub fn block(&mut self, f: impl FnOnce(&mut Enc)) {
        let at = self.0.len();
        self.u32(0);
        f(self);
        let len = (self.0.len() - at - 4) as u32;
        self.0[at..at + 4].copy_from_slice(&len.to_le_bytes());
    }
}

/// Little-endian decoder over a section read into memory; errors name the file offset.
pub(crate) struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
    /// File offset of `buf[0]`.
    base: u64,
    what: &'static str,
}

impl<'a> Dec<'a> {
    pub fn new(buf: &'a [u8], base: u64, what: &'static str) -> Self {
        Dec {
            buf,
            pos: 0,
            base,
            what,
        }
    }

    pub fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Bytes not decoded yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn err(&self, detail: impl Into<String>) -> ImageError {
        ImageError::Malformed {
            what: self.what,
            offset: self.offset(),
            detail: detail.into(),
        }
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8], ImageError> {
        let left = self.buf.len() - self.pos;
        if n > left {
            return Err(self.err(format!("needs {n} more bytes, the section has {left} left")));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ImageError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    pub fn u8(&mut self) -> Result<u8, ImageError> {
        Ok(self.array::<1>()?[0])
    }
    pub fn u32(&mut self) -> Result<u32, ImageError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, ImageError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub fn str(&mut self) -> Result<String, ImageError> {
        let at = self.offset();
        let len = self.u32()?;
        if len > MAX_STRING_LEN {
            return Err(ImageError::Malformed {
                what: self.what,
                offset: at,
                detail: format!("string of {len} bytes (at most {MAX_STRING_LEN})"),
            });
        }
        let b = self.take(len as usize)?;
        String::from_utf8(b.to_vec()).map_err(|e| ImageError::Malformed {
            what: self.what,
            offset: at,
            detail: format!("string is not UTF-8: {e}"),
        })
    }
    /// A block written by [`Enc::block`]: a decoder over its bytes (what follows the fields
    /// a reader knows is skipped by the caller dropping the sub-decoder).
    pub fn block(&mut self, what: &'static str) -> Result<Dec<'a>, ImageError> {
        let len = self.u32()? as usize;
        let base = self.offset();
        let buf = self.take(len)?;
        Ok(Dec::new(buf, base, what))
    }
}

fn encode_gpu(g: &GpuInfo, e: &mut Enc) {
    e.str(&g.name);
    e.str(&g.uuid);
    e.u32(g.compute_capability_major);
    e.u32(g.compute_capability_minor);
    e.u64(g.total_memory);
    e.u32(g.ordinal.unwrap_or(u32::MAX));
}

/// Encodes the process and GPU blocks (format 1.3: the GPU block ends with the other
/// devices, each a GPU block of its own).
pub(crate) fn encode_description(meta: &ImageMetadata, e: &mut Enc) {
    let p = &meta.process;
    e.block(|e| {
        e.u32(p.pid);
        e.str(&p.executable);
        e.str(&p.hostname);
        e.str(&p.cudaw_version);
        e.u64(p.created_unix_nanos);
        e.u32(p.cuda_runtime_major);
        e.u8(p.addressing.code());
    });
    e.block(|e| {
        encode_gpu(&meta.gpu, e);
        e.u32(meta.other_gpus.len() as u32);
        for g in &meta.other_gpus {
            e.block(|e| encode_gpu(g, e));
        }
    });
}

/// Encodes the allocation table (format 1.x).
pub(crate) fn encode_table(table: &[AllocationEntry], e: &mut Enc) {
    e.u64(table.len() as u64);
    e.u32(RECORD_LEN);
    for a in table {
        let r = &a.record;
        e.u64(r.id);
        e.u64(r.base);
        e.u64(r.size);
        e.u64(r.order);
        e.u32(r.tag);
        e.u32(if r.handle.is_some() {
            KIND_HANDLE
        } else {
            KIND_ALLOCATION
        });
        e.u64(a.data_offset);
        let h = r.handle.unwrap_or(HandleRange {
            handle: 0,
            handle_size: 0,
            offset: 0,
            prop: [0; PROP_LEN],
        });
        e.u64(h.handle);
        e.u64(h.handle_size);
        e.u64(h.offset);
        e.bytes(&h.prop);
        e.u32(r.device);
        e.u32(0);
    }
}

/// Decodes a GPU block's fields (the 1.1 ordinal when present).
fn decode_gpu(b: &mut Dec<'_>) -> Result<GpuInfo, ImageError> {
    Ok(GpuInfo {
        name: b.str()?,
        uuid: b.str()?,
        compute_capability_major: b.u32()?,
        compute_capability_minor: b.u32()?,
        total_memory: b.u64()?,
        // Added in 1.1: absent from a 1.0 image's block.
        ordinal: match b.remaining() {
            0 => None,
            _ => Some(b.u32()?).filter(|&o| o != u32::MAX),
        },
    })
}

/// The most devices an image names.
pub const MAX_DEVICES: u32 = 1024;

/// Decodes the metadata section of an image of format 1.`minor`: description, then the
/// records with their recorded data offsets (chunk counts left 0 for the caller to fill
/// in).
pub(crate) fn decode(
    d: &mut Dec<'_>,
    minor: u16,
) -> Result<(ImageMetadata, Vec<AllocationEntry>), ImageError> {
    let mut b = d.block("process block")?;
    let process = ProcessInfo {
        pid: b.u32()?,
        executable: b.str()?,
        hostname: b.str()?,
        cudaw_version: b.str()?,
        created_unix_nanos: b.u64()?,
        cuda_runtime_major: b.u32()?,
        addressing: Addressing::from_code(b.u8()?),
    };
    let mut b = d.block("GPU block")?;
    let gpu = decode_gpu(&mut b)?;
    // Added in 1.3: the other devices.
    let mut other_gpus = Vec::new();
    if minor >= 3 {
        let count_at = b.offset();
        let n = b.u32()?;
        if n > MAX_DEVICES {
            return Err(ImageError::Malformed {
                what: "GPU block",
                offset: count_at,
                detail: format!("{n} other devices (at most {MAX_DEVICES})"),
            });
        }
        for _ in 0..n {
            other_gpus.push(decode_gpu(&mut b.block("GPU block")?)?);
        }
    }
    // Before 1.3 every record is memory of the image's one device.
    let one_device = gpu.ordinal.unwrap_or(0);
    let count_at = d.offset();
    let count = d.u64()?;
    let record_len = d.u32()?;
    if record_len < RECORD_LEN_1_0 {
        return Err(d.err(format!(
            "allocation record of {record_len} bytes (at least {RECORD_LEN_1_0})"
        )));
    }
    let left = (d.buf.len() - d.pos) as u64;
    if count > left / u64::from(record_len) {
        return Err(ImageError::Malformed {
            what: "allocation table",
            offset: count_at,
            detail: format!(
                "{count} records of {record_len} bytes do not fit in the {left} bytes left"
            ),
        });
    }
    let mut table = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let mut r = Dec::new(
            d.take(record_len as usize)?,
            d.offset() - u64::from(record_len),
            "allocation record",
        );
        let id = r.u64()?;
        let base = r.u64()?;
        let size = r.u64()?;
        let order = r.u64()?;
        let tag = r.u32()?;
        let kind_at = r.offset();
        let kind = r.u32()?;
        let data_offset = r.u64()?;
        let handle = match kind {
            KIND_ALLOCATION => None,
            KIND_HANDLE if record_len >= RECORD_LEN_1_2 => {
                let handle = r.u64()?;
                let handle_size = r.u64()?;
                let offset = r.u64()?;
                let mut prop = [0u8; PROP_LEN];
                prop.copy_from_slice(r.take(PROP_LEN)?);
                Some(HandleRange {
                    handle,
                    handle_size,
                    offset,
                    prop,
                })
            }
            k => {
                return Err(ImageError::Malformed {
                    what: "allocation record",
                    offset: kind_at,
                    detail: format!(
                        "record kind {k} in a record of {record_len} bytes (0: allocation; 1: driver handle range, in records of at least {RECORD_LEN_1_2} bytes)"
                    ),
                })
            }
        };
        let device = if minor >= 3 && record_len >= RECORD_LEN {
            // A kind 0 record skipped the handle fields.
            if handle.is_none() {
                r.take(24 + PROP_LEN)?;
            }
            r.u32()?
        } else {
            one_device
        };
        table.push(AllocationEntry {
            record: AllocationRecord {
                id,
                base,
                size,
                order,
                tag,
                handle,
                device,
            },
            data_offset,
            chunk_count: 0,
        });
    }
    Ok((
        ImageMetadata {
            process,
            gpu,
            other_gpus,
        },
        table,
    ))
}

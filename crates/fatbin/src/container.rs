//! Fatbin containers and their entries (FATBIN.md §2), and entry decompression (§3).
//!
//! Indexing reads headers only; [`Entry::payload`] decompresses on request.

use std::borrow::Cow;

use crate::error::{slice_at, span_at, u16_at, u32_at, u64_at, Error, Result};
use crate::raw::{container_len_at, CONTAINER_MAGIC};
use crate::{cubin, ptx, KernelInfo, Source};

/// Entry flag: 64-bit code.
pub const FLAG_64BIT: u64 = 0x1;
/// Entry flag: compiled with debug information.
pub const FLAG_DEBUG: u64 = 0x2;
/// Entry flag: payload compressed with the LZ4 block format.
pub const FLAG_LZ4: u64 = 0x2000;
/// Entry flag: payload compressed with zstd.
pub const FLAG_ZSTD: u64 = 0x8000;
/// Entry flag (observed, nvcc 13): arch-specific code (`sm_90a`, `compute_90a`): runs only on
/// exactly that SM.
pub const FLAG_ARCH_SPECIFIC: u64 = 0x10_0000;
/// Entry flag (observed, nvcc 13): family-specific code (`sm_100f`).
pub const FLAG_FAMILY_SPECIFIC: u64 = 0x20_0000;

/// Smallest entry header the parser accepts (the fields it reads end at 0x40).
pub const MIN_ENTRY_HEADER_SIZE: u32 = 0x40;

/// Largest uncompressed size accepted for one entry (1 GiB): a guard against absurd headers.
pub const MAX_UNCOMPRESSED_SIZE: u64 = 1 << 30;

/// What an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// PTX text (kind 1).
    Ptx,
    /// A cubin ELF (kind 2).
    Elf,
    /// Any other kind (4 old cubin, 8 NVVM IR, …): listed, never parsed.
    Other(u16),
}

/// How an entry's payload is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compression {
    /// Stored as is.
    None,
    /// LZ4 block format (flag 0x2000).
    Lz4,
    /// zstd (flag 0x8000).
    Zstd,
}

/// One entry of a container: headers only; the payload is borrowed, not decompressed.
#[derive(Debug, Clone)]
pub struct Entry<'a> {
    /// Index of the container holding it, in [`crate::Fatbin::containers`].
    pub container: usize,
    /// Offset of the entry header in the input (host file offset for host ELF input).
    pub offset: u64,
    /// PTX, ELF or other.
    pub kind: EntryKind,
    /// The header's size field (0x40 for ELF, 0x50 for PTX observed; others honoured).
    pub header_size: u32,
    /// SM number (`90` for sm_90 / compute_90).
    pub sm: u32,
    /// Raw flags (see the `FLAG_*` constants).
    pub flags: u64,
    /// (major, minor): PTX ISA version for PTX, code version for ELF.
    pub version: (u16, u16),
    /// The entry's identifier string, when the header has one.
    pub identifier: Option<String>,
    /// How the payload is stored.
    pub compression: Compression,
    /// Compressed size field (0 if not compressed).
    pub compressed_size: u32,
    /// Uncompressed size field (0 if not compressed).
    pub uncompressed_size: u64,
    /// The stored payload (compressed if [`Entry::compression`] says so; zero-padded).
    pub raw_payload: &'a [u8],
}

/// A fatbin container: header and the entries it lists.
#[derive(Debug, Clone)]
pub struct Container {
    /// Offset of the container header in the input.
    pub offset: u64,
    /// Total length (header included).
    pub len: u64,
    /// Container version (1).
    pub version: u16,
    /// Found in `__nv_relfatbin` (relocatable, `-rdc` device code for nvlink).
    pub relocatable: bool,
    /// Range of this container's entries in [`crate::Fatbin::entries`].
    pub entries: std::ops::Range<usize>,
}

impl Entry<'_> {
    /// `true` for arch-specific code (`sm_90a`), which runs only on exactly its SM.
    pub fn is_arch_specific(&self) -> bool {
        self.flags & FLAG_ARCH_SPECIFIC != 0
    }

    /// The payload, decompressed if needed (borrowed when stored uncompressed).
    pub fn payload(&self) -> Result<Cow<'_, [u8]>> {
        if self.compression == Compression::None {
            return Ok(Cow::Borrowed(self.raw_payload));
        }
        let mut out = Vec::new();
        let n = decompress_into(self, &mut out, None)?;
        out.truncate(n);
        Ok(Cow::Owned(out))
    }

    /// Decompresses the payload and parses every kernel in it (ELF or PTX entries; other kinds
    /// give an empty list). Kernels carry [`KernelInfo::sm`] = this entry's SM.
    pub fn kernels(&self) -> Result<Vec<KernelInfo>> {
        let payload = self.payload()?;
        self.kernels_of(&payload)
    }

    /// The kernels of `payload`, this entry's decompressed payload.
    pub(crate) fn kernels_of(&self, payload: &[u8]) -> Result<Vec<KernelInfo>> {
        let mut kernels = match self.kind {
            EntryKind::Elf => cubin::parse_cubin(payload)?.kernels,
            EntryKind::Ptx => ptx::parse_ptx(payload)?.kernels,
            EntryKind::Other(_) => Vec::new(),
        };
        for k in &mut kernels {
            k.sm = Some(self.sm);
            k.source = match self.kind {
                EntryKind::Ptx => Source::Ptx,
                _ => Source::Elf,
            };
        }
        Ok(kernels)
    }
}

/// Decompresses `entry`'s payload (LZ4 or zstd) into `out[..n]` and returns `n` (the
/// header's uncompressed size), with `zstd` as the zstd context when given (a new one
/// otherwise). `out` is grown (with zeros) when shorter, never shrunk, so that a buffer
/// reused from entry to entry is written without being cleared; the decoder is given
/// exactly `n` bytes, so what it reports does not depend on the buffer's past.
/// `Compression::None` returns 0: the payload is the raw bytes.
pub(crate) fn decompress_into(
    entry: &Entry<'_>,
    out: &mut Vec<u8>,
    zstd: Option<&mut zstd::bulk::Decompressor<'static>>,
) -> Result<usize> {
    let (raw, compressed_size, uncompressed_size, offset) = (
        entry.raw_payload,
        entry.compressed_size,
        entry.uncompressed_size,
        entry.offset,
    );
    let input = |scheme| {
        if compressed_size == 0 {
            return Ok(raw);
        }
        raw.get(..compressed_size as usize)
            .ok_or(Error::Decompress {
                scheme,
                offset,
                reason: format!(
                    "compressed size {compressed_size} exceeds the stored payload of {} bytes",
                    raw.len()
                ),
            })
    };
    let too_big = |scheme| Error::Decompress {
        scheme,
        offset,
        reason: format!(
            "uncompressed size {uncompressed_size} is over the limit of {MAX_UNCOMPRESSED_SIZE}"
        ),
    };
    match entry.compression {
        Compression::None => Ok(0),
        Compression::Lz4 => {
            let input = input("lz4")?;
            // LZ4 expands at most ~255:1; a larger claim is a corrupt header.
            let max = (input.len() as u64).saturating_mul(255).saturating_add(64);
            if uncompressed_size > MAX_UNCOMPRESSED_SIZE || uncompressed_size > max {
                return Err(too_big("lz4"));
            }
            out.resize(uncompressed_size as usize, 0);
            let n =
                lz4_flex::block::decompress_into(input, out).map_err(|e| Error::Decompress {
                    scheme: "lz4",
                    offset,
                    reason: e.to_string(),
                })?;
            if n as u64 != uncompressed_size {
                return Err(Error::Decompress {
                    scheme: "lz4",
                    offset,
                    reason: format!("decoded {n} bytes, header says {uncompressed_size}"),
                });
            }
            Ok(n)
        }
        Compression::Zstd => {
            let input = input("zstd")?;
            if uncompressed_size > MAX_UNCOMPRESSED_SIZE {
                return Err(too_big("zstd"));
            }
            let err = |reason: String| Error::Decompress {
                scheme: "zstd",
                offset,
                reason,
            };
            // A larger output than declared is an error, not a reallocation.
            let dst = grown(out, uncompressed_size as usize);
            let decoded = match zstd {
                Some(d) => d.decompress_to_buffer(input, dst),
                None => zstd::bulk::Decompressor::new()
                    .and_then(|mut d| d.decompress_to_buffer(input, dst)),
            };
            let n = decoded.map_err(|e| err(e.to_string()))?;
            if n as u64 != uncompressed_size {
                return Err(err(format!(
                    "decoded {n} bytes, header says {uncompressed_size}"
                )));
            }
            Ok(n)
        }
    }
}

/// `out[..n]`, growing `out` with zeros first if it is shorter (a new buffer is allocated
/// zeroed, which costs no writes).
pub(crate) fn grown(out: &mut Vec<u8>, n: usize) -> &mut [u8] {
    if out.is_empty() {
        *out = vec![0; n];
    } else if out.len() < n {
        out.resize(n, 0);
    }
    &mut out[..n]
}

/// Parses one or several concatenated containers in `data` (zero padding between them is
/// skipped), appending to `containers` and `entries`. `base` is `data`'s offset in the file,
/// added to every reported offset.
pub(crate) fn parse_containers<'a>(
    data: &'a [u8],
    base: u64,
    relocatable: bool,
    containers: &mut Vec<Container>,
    entries: &mut Vec<Entry<'a>>,
) -> Result<()> {
    let mut pos = 0usize;
    let mut found = false;
    while pos < data.len() {
        let rest = &data[pos..];
        // Padding between containers: skip zero bytes.
        if rest[0] == 0 {
            pos += 1;
            continue;
        }
        let at = base.saturating_add(pos as u64);
        let magic = u32_at(rest, 0, "fatbin container header", at)?;
        if magic != CONTAINER_MAGIC {
            return Err(Error::BadMagic {
                what: "fatbin container",
                offset: at,
                found: magic.into(),
                expected: CONTAINER_MAGIC.into(),
            });
        }
        let len = container_len_at(rest, at)?;
        let bytes = slice_at(rest, 0, len, "fatbin container", at)?;
        let version = u16_at(rest, 4, "fatbin container header", at)?;
        let header_size = u16_at(rest, 6, "fatbin container header", at)?;
        let first = entries.len();
        parse_entries(
            bytes,
            usize::from(header_size),
            at,
            containers.len(),
            entries,
        )?;
        containers.push(Container {
            offset: at,
            len,
            version,
            relocatable,
            entries: first..entries.len(),
        });
        found = true;
        // `len` fits in usize: `slice_at` checked it against `rest`.
        pos += bytes.len();
    }
    if !found {
        return Err(Error::Truncated {
            what: "fatbin container",
            offset: base,
            needed: 16,
            available: data.len() as u64,
        });
    }
    Ok(())
}

fn parse_entries<'a>(
    bytes: &'a [u8],
    mut pos: usize,
    base: u64,
    container: usize,
    entries: &mut Vec<Entry<'a>>,
) -> Result<()> {
    while pos < bytes.len() {
        let at = base.saturating_add(pos as u64);
        let e = &bytes[pos..];
        let head = parse_entry_head(e, e.len() as u64, at, container)?;
        let (start, len) = (head.entry.header_size as usize, head.payload_size as usize);
        // Both fit: `parse_entry_head` checked header and payload against the container.
        let raw_payload = e.get(start..start + len).unwrap_or_default();
        let identifier = head.identifier.and_then(|(off, len)| {
            slice_at(e, off.into(), len.into(), "entry identifier", at)
                .ok()
                .map(identifier_text)
        });
        entries.push(Entry {
            identifier,
            raw_payload,
            ..head.entry
        });
        pos += start + len;
    }
    Ok(())
}

/// An entry's NUL-terminated identifier string.
pub(crate) fn identifier_text(bytes: &[u8]) -> String {
    let s = bytes.split(|&b| b == 0).next().unwrap_or_default();
    String::from_utf8_lossy(s).into_owned()
}

/// One entry header, read without its payload.
pub(crate) struct EntryHead {
    /// The entry, with no payload and no identifier.
    pub entry: Entry<'static>,
    /// The stored payload's size; it starts `entry.header_size` bytes after the entry.
    pub payload_size: u64,
    /// Where the identifier is, relative to the entry (offset, length), if it has one.
    pub identifier: Option<(u32, u32)>,
}

/// Reads the header of the entry at `at` (in the input) from `e`, its first bytes (the
/// fields read end at 0x40); `available` is how many bytes the container holds from the
/// entry's start on: the header and payload must fit in them.
pub(crate) fn parse_entry_head(
    e: &[u8],
    available: u64,
    at: u64,
    container: usize,
) -> Result<EntryHead> {
    const W: &str = "fatbin entry header";
    let kind = u16_at(e, 0, W, at)?;
    let header_size = u32_at(e, 4, W, at)?;
    if header_size < MIN_ENTRY_HEADER_SIZE {
        return Err(Error::InvalidField {
            field: "entry header size",
            offset: at + 4,
            found: header_size.into(),
            expected: "at least 0x40",
        });
    }
    let payload_size = u64_at(e, 8, W, at)?;
    let compressed_size = u32_at(e, 0x10, W, at)?;
    let minor = u16_at(e, 0x18, W, at)?;
    let major = u16_at(e, 0x1a, W, at)?;
    let sm = u32_at(e, 0x1c, W, at)?;
    let id_off = u32_at(e, 0x20, W, at)?;
    let id_len = u32_at(e, 0x24, W, at)?;
    let flags = u64_at(e, 0x28, W, at)?;
    let uncompressed_size = u64_at(e, 0x38, W, at)?;
    span_at(available, 0, header_size.into(), W, at)?;
    span_at(
        available,
        header_size.into(),
        payload_size,
        "fatbin entry payload",
        at,
    )?;
    let compression = match (flags & FLAG_LZ4 != 0, flags & FLAG_ZSTD != 0) {
        (false, false) => Compression::None,
        (true, false) => Compression::Lz4,
        (false, true) => Compression::Zstd,
        (true, true) => {
            return Err(Error::InvalidField {
                field: "entry flags",
                offset: at + 0x28,
                found: flags,
                expected: "at most one of LZ4 (0x2000) and zstd (0x8000)",
            })
        }
    };
    Ok(EntryHead {
        entry: Entry {
            container,
            offset: at,
            kind: match kind {
                1 => EntryKind::Ptx,
                2 => EntryKind::Elf,
                k => EntryKind::Other(k),
            },
            header_size,
            sm,
            flags,
            version: (major, minor),
            identifier: None,
            compression,
            compressed_size,
            uncompressed_size,
            raw_payload: &[],
        },
        payload_size,
        identifier: (id_off != 0 && id_len != 0).then_some((id_off, id_len)),
    })
}

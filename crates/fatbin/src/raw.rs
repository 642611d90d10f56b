//! Step-by-step helpers for code that holds only a raw pointer (the shim's
//! `__cudaRegisterFatBinary`, the driver shim's `cuModuleLoadData`): each takes a few leading
//! bytes and says how many bytes the image declares, so the caller reads exactly those and
//! nothing past them.

use crate::error::{u16_at, u32_at, u64_at, Error, Result};

/// Magic of `__fatBinC_Wrapper_t`, the structure `__cudaRegisterFatBinary` receives.
pub const WRAPPER_MAGIC: u32 = 0x4662_43B1;
/// Size of `__fatBinC_Wrapper_t` on 64-bit hosts.
pub const WRAPPER_SIZE: usize = 24;
/// Magic of a fatbin container (`50 ed 55 ba` in the file).
pub const CONTAINER_MAGIC: u32 = 0xBA55_ED50;
/// Size of a fatbin container header; [`container_len`] needs this many bytes.
pub const CONTAINER_HEADER_SIZE: usize = 16;
/// Size of an ELF64 file header; [`elf_image_len`] needs at least this many bytes.
pub const ELF64_HEADER_SIZE: usize = 64;

/// The 24-byte `__fatBinC_Wrapper_t` nvcc's static constructor passes to
/// `__cudaRegisterFatBinary`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FatbinWrapper {
    /// 1 for a normal image; 2 for a device-linked (`-rdc`) image.
    pub version: u32,
    /// Address of the fatbin container (magic [`CONTAINER_MAGIC`]).
    pub container: u64,
    /// Version 2: address of a NULL-terminated array of prelinked container addresses;
    /// version 1: 0.
    pub prelinked: u64,
}

/// Parses the 24-byte wrapper; checks its magic.
pub fn parse_wrapper(bytes: &[u8]) -> Result<FatbinWrapper> {
    let magic = u32_at(bytes, 0, "fatbin wrapper", 0)?;
    if magic != WRAPPER_MAGIC {
        return Err(Error::BadMagic {
            what: "fatbin wrapper",
            offset: 0,
            found: magic.into(),
            expected: WRAPPER_MAGIC.into(),
        });
    }
    Ok(FatbinWrapper {
        version: u32_at(bytes, 4, "fatbin wrapper", 0)?,
        container: u64_at(bytes, 8, "fatbin wrapper", 0)?,
        prelinked: u64_at(bytes, 16, "fatbin wrapper", 0)?,
    })
}

/// From the first 16 bytes of a fatbin container: its total length in bytes (header
/// included). Checks the magic and the header-size field.
pub fn container_len(header: &[u8]) -> Result<u64> {
    container_len_at(header, 0)
}

pub(crate) fn container_len_at(header: &[u8], base: u64) -> Result<u64> {
    let magic = u32_at(header, 0, "fatbin container header", base)?;
    if magic != CONTAINER_MAGIC {
        return Err(Error::BadMagic {
            what: "fatbin container",
            offset: base,
            found: magic.into(),
            expected: CONTAINER_MAGIC.into(),
        });
    }
    let header_size = u16_at(header, 6, "fatbin container header", base)?;
    if usize::from(header_size) < CONTAINER_HEADER_SIZE {
        return Err(Error::InvalidField {
            field: "container header size",
            offset: base + 6,
            found: header_size.into(),
            expected: "at least 16",
        });
    }
    let size = u64_at(header, 8, "fatbin container header", base)?;
    u64::from(header_size)
        .checked_add(size)
        .ok_or(Error::InvalidField {
            field: "container size",
            offset: base + 8,
            found: size,
            expected: "a size that fits in 64 bits with the header",
        })
}

/// What a module image handed to the driver (or found in a file) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageKind {
    /// A fatbin container (`cuModuleLoadData`/`cuModuleLoadFatBinary`).
    Fatbin,
    /// The 24-byte `__fatBinC_Wrapper_t`.
    Wrapper,
    /// A cubin: ELF with `e_machine` 190 (EM_CUDA).
    Cubin,
    /// Any other ELF file: a host executable, shared library or object.
    HostElf,
    /// PTX text (NUL-terminated when handed to the driver).
    Ptx,
}

/// Classifies an image from its first bytes (16 are enough; 20 tell a cubin from a host ELF).
/// Returns `None` for anything unrecognised.
pub fn detect_image_kind(prefix: &[u8]) -> Option<ImageKind> {
    let magic = prefix.first_chunk::<4>().map(|b| u32::from_le_bytes(*b));
    match magic {
        Some(CONTAINER_MAGIC) => return Some(ImageKind::Fatbin),
        Some(WRAPPER_MAGIC) => return Some(ImageKind::Wrapper),
        _ => {}
    }
    if prefix.starts_with(b"\x7fELF") {
        return match u16_at(prefix, 18, "ELF header", 0) {
            Ok(190) => Some(ImageKind::Cubin),
            Ok(_) => Some(ImageKind::HostElf),
            Err(_) => None,
        };
    }
    looks_like_ptx(prefix).then_some(ImageKind::Ptx)
}

/// PTX text begins (after white space) with a comment or a directive, and its first bytes are
/// printable ASCII.
fn looks_like_ptx(prefix: &[u8]) -> bool {
    let head = &prefix[..prefix.len().min(64)];
    let head = match head.iter().position(|&b| b == 0) {
        Some(nul) => &head[..nul],
        None => head,
    };
    if !head
        .iter()
        .all(|&b| b.is_ascii_graphic() || b.is_ascii_whitespace())
    {
        return false;
    }
    let trimmed = head.trim_ascii_start();
    trimmed.starts_with(b"//") || trimmed.starts_with(b"/*") || trimmed.starts_with(b".")
}

/// The length of an ELF64 little-endian image (a cubin handed to `cuModuleLoadData`), in
/// two steps for a caller that can read only what is declared:
///
/// 1. call with the first [`ELF64_HEADER_SIZE`] bytes: it fails with [`Error::Truncated`]
///    whose `offset + needed` says how many bytes cover the section header table;
/// 2. call again with that many bytes: it returns the end of the furthest section, section
///    header table or program header table.
pub fn elf_image_len(bytes: &[u8]) -> Result<u64> {
    if !bytes.starts_with(b"\x7fELF") {
        let found = u32_at(bytes, 0, "ELF header", 0)?;
        return Err(Error::BadMagic {
            what: "ELF",
            offset: 0,
            found: found.into(),
            expected: 0x464c_457f,
        });
    }
    let class = bytes.get(4).copied().unwrap_or(0);
    let data = bytes.get(5).copied().unwrap_or(0);
    if class != 2 || data != 1 {
        return Err(Error::InvalidField {
            field: "ELF class/data",
            offset: 4,
            found: (u64::from(class) << 8) | u64::from(data),
            expected: "ELF64 little-endian (0x201)",
        });
    }
    let phoff = u64_at(bytes, 0x20, "ELF header", 0)?;
    let shoff = u64_at(bytes, 0x28, "ELF header", 0)?;
    let phentsize = u64::from(u16_at(bytes, 0x36, "ELF header", 0)?);
    let phnum = u64::from(u16_at(bytes, 0x38, "ELF header", 0)?);
    let shentsize = u64::from(u16_at(bytes, 0x3a, "ELF header", 0)?);
    let shnum = u64::from(u16_at(bytes, 0x3c, "ELF header", 0)?);
    let overflow = |field| Error::InvalidField {
        field,
        offset: 0,
        found: u64::MAX,
        expected: "a table that ends below 2^64",
    };
    let ph_end = phoff
        .checked_add(phentsize.saturating_mul(phnum))
        .ok_or(overflow("e_phoff"))?;
    let sh_end = shoff
        .checked_add(shentsize.saturating_mul(shnum))
        .ok_or(overflow("e_shoff"))?;
    let mut end = ph_end.max(sh_end).max(ELF64_HEADER_SIZE as u64);
    if shnum > 0 {
        if shentsize < 64 {
            return Err(Error::InvalidField {
                field: "e_shentsize",
                offset: 0x3a,
                found: shentsize,
                expected: "at least 64",
            });
        }
        if (bytes.len() as u64) < sh_end {
            return Err(Error::Truncated {
                what: "ELF section header table",
                offset: 0,
                needed: sh_end,
                available: bytes.len() as u64,
            });
        }
        for i in 0..shnum {
            let at = usize::try_from(shoff + i * shentsize).map_err(|_| overflow("e_shoff"))?;
            let sh_type = u32_at(bytes, at + 4, "ELF section header", 0)?;
            if sh_type == 8 {
                continue; // SHT_NOBITS occupies no file bytes
            }
            let off = u64_at(bytes, at + 0x18, "ELF section header", 0)?;
            let size = u64_at(bytes, at + 0x20, "ELF section header", 0)?;
            end = end.max(off.checked_add(size).ok_or(overflow("sh_offset"))?);
        }
    }
    Ok(end)
}

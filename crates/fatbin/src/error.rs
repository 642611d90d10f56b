//! The crate's one error type.

/// Everything that can go wrong while reading a fatbin, cubin or PTX image.
///
/// Every variant names where in the input the problem was found (`offset`, in bytes from the
/// start of the slice given to the parser, or of the host file for host ELF input) and what
/// was seen and expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The input ends before a structure it declares.
    #[error(
        "truncated {what} at offset {offset:#x}: needs {needed} bytes, only {available} available"
    )]
    Truncated {
        /// The structure being read.
        what: &'static str,
        /// Where it starts.
        offset: u64,
        /// Bytes it needs from `offset`.
        needed: u64,
        /// Bytes available from `offset`.
        available: u64,
    },
    /// A magic number did not match.
    #[error("bad {what} magic at offset {offset:#x}: found {found:#x}, expected {expected:#x}")]
    BadMagic {
        /// The structure whose magic was checked.
        what: &'static str,
        /// Where the magic was read.
        offset: u64,
        /// The value seen.
        found: u64,
        /// The value expected.
        expected: u64,
    },
    /// A header field holds a value the parser cannot accept.
    #[error("invalid {field} at offset {offset:#x}: found {found:#x}, expected {expected}")]
    InvalidField {
        /// The field's name.
        field: &'static str,
        /// Where the field (or its structure) is.
        offset: u64,
        /// The value seen.
        found: u64,
        /// What was expected, in words.
        expected: &'static str,
    },
    /// A compressed entry could not be decompressed.
    #[error("cannot decompress {scheme} entry at offset {offset:#x}: {reason}")]
    Decompress {
        /// `"lz4"` or `"zstd"`.
        scheme: &'static str,
        /// The entry's offset.
        offset: u64,
        /// What the decoder reported.
        reason: String,
    },
    /// A cubin or host ELF file is malformed.
    #[error("malformed ELF at offset {offset:#x}: {reason}")]
    Elf {
        /// The offset of the ELF image (or of the bad structure when known).
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// PTX text that the `.entry` parser cannot read.
    #[error("PTX syntax error at byte {offset}: found {found:?}, expected {expected}")]
    Ptx {
        /// Byte offset into the PTX text.
        offset: u64,
        /// The token seen (or `"end of input"`).
        found: String,
        /// What was expected.
        expected: &'static str,
    },
    /// The input could not be read (a file read through [`crate::stream::ReadAt`]).
    #[error("cannot read {len} bytes at offset {offset:#x}: {reason}")]
    Io {
        /// Where the read started.
        offset: u64,
        /// How many bytes it asked for.
        len: u64,
        /// What the system reported.
        reason: String,
    },
    /// A host ELF file carries no `.nv_fatbin` or `__nv_relfatbin` section.
    #[error("no fatbin in this ELF file: it has no .nv_fatbin or __nv_relfatbin section")]
    NoFatbin,
    /// The input is none of: host ELF, fatbin container, cubin, PTX text.
    #[error("unrecognised image: first bytes {prefix:02x?}; expected a fatbin container (50 ed 55 ba), an ELF file (7f 45 4c 46) or PTX text")]
    UnknownFormat {
        /// Up to 8 leading bytes of the input.
        prefix: Vec<u8>,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = core::result::Result<T, E>;

/// Bounds-checked little-endian reads. Every read returns [`Error::Truncated`] instead of
/// panicking.
pub(crate) fn bytes_at<'a, const N: usize>(
    data: &'a [u8],
    offset: usize,
    what: &'static str,
    base: u64,
) -> Result<&'a [u8; N]> {
    data.get(offset..)
        .and_then(|rest| rest.first_chunk::<N>())
        .ok_or(Error::Truncated {
            what,
            offset: base.saturating_add(offset as u64),
            needed: N as u64,
            available: data.len().saturating_sub(offset) as u64,
        })
}

pub(crate) fn u16_at(data: &[u8], offset: usize, what: &'static str, base: u64) -> Result<u16> {
    bytes_at::<2>(data, offset, what, base).map(|b| u16::from_le_bytes(*b))
}

pub(crate) fn u32_at(data: &[u8], offset: usize, what: &'static str, base: u64) -> Result<u32> {
    bytes_at::<4>(data, offset, what, base).map(|b| u32::from_le_bytes(*b))
}

pub(crate) fn u64_at(data: &[u8], offset: usize, what: &'static str, base: u64) -> Result<u64> {
    bytes_at::<8>(data, offset, what, base).map(|b| u64::from_le_bytes(*b))
}

/// Checks that `len` bytes at `offset` lie within `available` bytes (the same
/// [`Error::Truncated`] as [`slice_at`] on a slice of that length).
pub(crate) fn span_at(
    available: u64,
    offset: u64,
    len: u64,
    what: &'static str,
    base: u64,
) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= available && usize::try_from(end).is_ok() => Ok(()),
        _ => Err(Error::Truncated {
            what,
            offset: base.saturating_add(offset),
            needed: len,
            available: available.saturating_sub(offset),
        }),
    }
}

/// `data[offset..offset + len]`, or [`Error::Truncated`].
pub(crate) fn slice_at<'a>(
    data: &'a [u8],
    offset: u64,
    len: u64,
    what: &'static str,
    base: u64,
) -> Result<&'a [u8]> {
    let trunc = || Error::Truncated {
        what,
        offset: base.saturating_add(offset),
        needed: len,
        available: (data.len() as u64).saturating_sub(offset),
    };
    let start = usize::try_from(offset).map_err(|_| trunc())?;
    let len = usize::try_from(len).map_err(|_| trunc())?;
    let end = start.checked_add(len).ok_or_else(trunc)?;
    data.get(start..end).ok_or_else(trunc)
}

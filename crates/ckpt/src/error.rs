//! The one error type of the crate.

use std::io;

/// Everything that can go wrong writing or reading an image. Each variant names what is
/// wrong and where (file offsets, allocation ids, chunk indices).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// The underlying reader or writer failed.
    #[error("I/O error while {context} at file offset {offset}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// File offset of the operation.
        offset: u64,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The first bytes are not the image magic.
    #[error("not a cudaw image: starts with {found}")]
    NotAnImage {
        /// The first bytes, in hex and as text.
        found: String,
    },
    /// The image's format major version is not the one this build reads.
    #[error("unsupported image format version {found}.x (this build reads {supported}.x)")]
    UnsupportedMajor {
        /// The major version in the image.
        found: u16,
        /// The major version this build reads.
        supported: u16,
    },
    /// The image sets required feature flags this build does not know.
    #[error("image requires unknown features (required flags {flags:#x})")]
    UnsupportedFlags {
        /// The unknown required flag bits.
        flags: u64,
    },
    /// The image ends before it should.
    #[error("image truncated at offset {at} (expected {expected} bytes)")]
    Truncated {
        /// Where the data ends.
        at: u64,
        /// How many bytes the image should have (at least).
        expected: u64,
    },
    /// The image is longer than its header says.
    #[error("image has {actual} bytes but its header says {expected}: trailing data")]
    TrailingData {
        /// The length of the file.
        actual: u64,
        /// The length the header records.
        expected: u64,
    },
    /// The header or metadata checksum does not match.
    #[error("{what} checksum mismatch (stored {stored:#018x}, computed {computed:#018x})")]
    SectionChecksum {
        /// `"header"` or `"metadata"`.
        what: &'static str,
        /// The checksum the image stores.
        stored: u64,
        /// The checksum of the bytes read.
        computed: u64,
    },
    /// A field has an impossible value.
    #[error("malformed {what} at file offset {offset}: {detail}")]
    Malformed {
        /// Which section or field.
        what: &'static str,
        /// File offset of the field.
        offset: u64,
        /// What is wrong with it.
        detail: String,
    },
    /// A chunk's bytes do not match its checksum.
    #[error(
        "checksum mismatch in chunk {chunk} of allocation {allocation} at offset {offset} \
         (file offset {file_offset}; stored {stored:#018x}, computed {computed:#018x})"
    )]
    ChunkChecksum {
        /// The allocation id.
        allocation: u64,
        /// The chunk's index within the allocation.
        chunk: u64,
        /// The chunk's offset within the allocation.
        offset: u64,
        /// File offset of the chunk header.
        file_offset: u64,
        /// The checksum stored after the chunk.
        stored: u64,
        /// The checksum of the bytes read.
        computed: u64,
    },
    /// A chunk header is not the one the table puts there.
    #[error(
        "chunk {chunk} of allocation {allocation} at file offset {file_offset}: header says \
         allocation {found_allocation}, offset {found_offset}, length {found_len}; expected \
         allocation {allocation}, offset {offset}, length {len}"
    )]
    ChunkHeader {
        /// The allocation id expected.
        allocation: u64,
        /// The chunk's index within the allocation.
        chunk: u64,
        /// The offset within the allocation expected.
        offset: u64,
        /// The length expected.
        len: u64,
        /// File offset of the chunk header.
        file_offset: u64,
        /// The allocation id found.
        found_allocation: u64,
        /// The offset found.
        found_offset: u64,
        /// The length found.
        found_len: u64,
    },
    /// The whole-image digest in the trailer does not match.
    #[error("image digest mismatch (trailer {stored:#018x}, computed {computed:#018x})")]
    DigestMismatch {
        /// The digest in the trailer.
        stored: u64,
        /// The digest computed.
        computed: u64,
    },
    /// The trailer does not end with the end marker.
    #[error("bad end marker at offset {at}: found {found}")]
    BadEndMarker {
        /// File offset of the end marker.
        at: u64,
        /// The bytes found, in hex and as text.
        found: String,
    },
    /// Two allocations of a table overlap.
    #[error("allocations {a} [{a_base:#x}, {a_end:#x}) and {b} [{b_base:#x}, {b_end:#x}) overlap")]
    Overlap {
        /// The first allocation's id.
        a: u64,
        /// Its base.
        a_base: u64,
        /// Its end.
        a_end: u64,
        /// The second allocation's id.
        b: u64,
        /// Its base.
        b_base: u64,
        /// Its end.
        b_end: u64,
    },
    /// An allocation id appears twice in a table.
    #[error("allocation id {id} appears twice in the table")]
    DuplicateId {
        /// The id.
        id: u64,
    },
    /// A record names a device the image's GPU list does not (or a device of several has no
    /// ordinal).
    #[error("{}", match (id, device) {
        (Some(id), Some(d)) => format!("allocation {id} is memory of device {d}, which the image's GPU list does not name"),
        _ => "a device in the image's GPU list has no ordinal (every device of an image of several has one)".to_owned(),
    })]
    UnknownDevice {
        /// The allocation (`None`: a device without an ordinal).
        id: Option<u64>,
        /// The device it names.
        device: Option<u32>,
    },
    /// A device is named twice in the image's GPU list.
    #[error("device {ordinal} appears twice in the image's GPU list")]
    DuplicateDevice {
        /// Its ordinal.
        ordinal: u32,
    },
    /// An allocation's end does not fit in 64 bits.
    #[error("allocation {id}: base {base:#x} + size {size} overflows the address space")]
    AddressOverflow {
        /// The id.
        id: u64,
        /// Its base.
        base: u64,
        /// Its size.
        size: u64,
    },
    /// An allocation's data offset is not where the layout puts it.
    #[error("allocation {id}: data recorded at file offset {recorded}, the layout puts it at {expected}")]
    DataOffset {
        /// The id.
        id: u64,
        /// The offset the table records.
        recorded: u64,
        /// The offset the layout computes.
        expected: u64,
    },
    /// Two recorded quantities that must agree do not.
    #[error("{what}: {found} recorded, {expected} expected")]
    Inconsistent {
        /// What the quantity is.
        what: &'static str,
        /// The value found.
        found: u64,
        /// The value expected.
        expected: u64,
    },
    /// The chunk size is outside the supported range.
    #[error("chunk size {0} out of range ({min}..={max})", min = crate::MIN_CHUNK_SIZE, max = crate::MAX_CHUNK_SIZE)]
    ChunkSize(u64),
    /// Writer: data given for an allocation or offset other than the next one.
    #[error(
        "write out of order: expected allocation {expected_id} at offset {expected_offset}, \
         got allocation {id} at offset {offset}"
    )]
    OutOfOrder {
        /// The allocation id expected next.
        expected_id: u64,
        /// The offset expected next.
        expected_offset: u64,
        /// The allocation id given.
        id: u64,
        /// The offset given.
        offset: u64,
    },
    /// Writer: more bytes than the allocation holds.
    #[error("allocation {id}: {len} bytes at offset {offset} exceed its size {size}")]
    Overrun {
        /// The allocation id.
        id: u64,
        /// The offset given.
        offset: u64,
        /// The number of bytes given.
        len: u64,
        /// The allocation's size.
        size: u64,
    },
    /// Writer: data given after every allocation is complete.
    #[error("every allocation is written; got {len} more bytes for allocation {id}")]
    UnexpectedData {
        /// The allocation id given.
        id: u64,
        /// The number of bytes given.
        len: u64,
    },
    /// Writer: `finish` called before every allocation is complete.
    #[error("image incomplete: allocation {id} has {written} of {size} bytes")]
    Incomplete {
        /// The first incomplete allocation.
        id: u64,
        /// The bytes written for it.
        written: u64,
        /// Its size.
        size: u64,
    },
    /// Writer: an earlier write failed, the output is in an unknown state.
    #[error("an earlier write failed; the image cannot be completed")]
    Poisoned,
    /// Reader: no allocation with that id.
    #[error("no allocation {0} in the image")]
    UnknownAllocation(u64),
    /// Reader: a range read that is not chunk aligned or goes past the allocation.
    #[error(
        "cannot read {len} bytes at offset {offset} of allocation {id} (size {size}): ranges \
         must start at a multiple of the chunk size {chunk_size} and end at one or at the end"
    )]
    BadRange {
        /// The allocation id.
        id: u64,
        /// The offset asked for.
        offset: u64,
        /// The length asked for.
        len: u64,
        /// The allocation's size.
        size: u64,
        /// The image's chunk size.
        chunk_size: u64,
    },
}

impl ImageError {
    /// The message without any of the file's own bytes: what a process that opened the
    /// file on someone else's behalf may say about it (`not a cudaw image (bad magic)`,
    /// where [`fmt::Display`](std::fmt::Display) quotes what the file starts with).
    pub fn message_without_content(&self) -> String {
        match self {
            ImageError::NotAnImage { .. } => "not a cudaw image (bad magic)".to_owned(),
            ImageError::BadEndMarker { at, .. } => {
                format!("bad end marker at offset {at} (not CUDAWEND)")
            }
            e => e.to_string(),
        }
    }
}

/// `bytes` as hex and as text (non-printable bytes as `.`), for error messages.
pub(crate) fn show_bytes(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "nothing (empty)".to_owned();
    }
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let text: String = bytes
        .iter()
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '.'
            }
        })
        .collect();
    format!("{} (\"{}\")", hex.join(" "), text)
}

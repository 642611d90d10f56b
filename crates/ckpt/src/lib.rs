//! cudaw's checkpoint image: a process's device allocations in one file, streamed in and out
//! in checksummed chunks, never holding more than a chunk (the writer holds none) in memory.
//!
//! The shim converts `vmm::Allocation`s, and the mapped ranges of the driver-level handles
//! it evicts ([`HandleRange`]), into [`AllocationRecord`]s, writes an image with
//! [`ImageWriter`] while the process is paused (`cudaw-ckpt dump`), and on `restore` opens it
//! with [`ImageReader::open`] (which checks header, metadata, table and trailer), compares it
//! with the paused process ([`ImageReader::check_against`]) before touching anything, then
//! reads the image once: [`ImageReader::begin_load`], each allocation with
//! [`ImageReader::read_range`] (every chunk checked as it is read), then
//! [`ImageReader::finish_load`] checks the image digest from the checksums the load saw,
//! before the restore commits. `cudaw-ckpt inspect` prints [`ImageReader::summary`].
//!
//! ```
//! use ckpt::*;
//! # fn main() -> Result<(), ImageError> {
//! let meta = ImageMetadata {
//!     process: ProcessInfo {
//!         pid: 42, executable: "/usr/bin/python3".into(), hostname: "node1".into(),
//!         cudaw_version: "0.1.0".into(), created_unix_nanos: 0, cuda_runtime_major: 13,
//!         addressing: Addressing::Mapped,
//!     },
//!     gpu: GpuInfo {
//!         name: "NVIDIA H100 80GB HBM3".into(), uuid: "GPU-0".into(),
//!         compute_capability_major: 9, compute_capability_minor: 0, total_memory: 80 << 30,
//!         ordinal: Some(0),
//!     },
//!     other_gpus: Vec::new(),
//! };
//! let table = [AllocationRecord {
//!     id: 1, base: 0x7f00_0000_0000, size: 100, order: 0, tag: 0, handle: None, device: 0,
//! }];
//! let mut w = ImageWriter::begin(Vec::new(), &meta, &table, WriterOptions { chunk_size: 64 })?;
//! w.write_chunk(1, 0, &[7; 64])?;   // pieces of any size, in order
//! w.write_chunk(1, 64, &[7; 36])?;
//! let bytes = w.finish()?;
//!
//! let mut r = ImageReader::open(std::io::Cursor::new(bytes))?;
//! assert!(r.check_against(&table).is_empty());
//! r.verify()?;
//! let mut buf = vec![0; 100];
//! r.read_allocation(1, &mut buf)?;
//! assert_eq!(buf, [7; 100]);
//! # Ok(()) }
//! ```
//!
//! # Format 1.3, byte for byte
//!
//! Every integer is little-endian. Checksums and the digest are XXH3-64 (seed 0). An image
//! is four sections, one after the other:
//!
//! ```text
//! header    128 bytes at 0
//! metadata  at header_len
//! data      at metadata_offset + metadata_len
//! trailer   32 bytes, last in the file
//! ```
//!
//! **Header** (128 bytes in 1.x so far):
//!
//! | offset | size | field |
//! | ---: | ---: | --- |
//! | 0 | 8 | magic `b"CUDAWIMG"` |
//! | 8 | 2 | format major (1): a reader refuses any other major |
//! | 10 | 2 | format minor (3): a reader reads any minor of its major |
//! | 12 | 4 | header length (128; a newer minor may make it longer, at most 4096) |
//! | 16 | 8 | flags: bits 0–31 required (a reader refuses unknown ones), 32–63 optional; bit 0 (1.2): the table holds driver-handle ranges; bit 1 (1.3): the table holds memory of several devices |
//! | 24 | 8 | chunk size: payload bytes per chunk (16 ..= 2^30; default 8 MiB) |
//! | 32 | 8 | metadata offset |
//! | 40 | 8 | metadata length (at most 2^30) |
//! | 48 | 8 | data offset |
//! | 56 | 8 | data length |
//! | 64 | 8 | trailer offset |
//! | 72 | 8 | trailer length (at least 32) |
//! | 80 | 8 | image length (= trailer offset + trailer length) |
//! | 88 | 8 | XXH3-64 of the metadata section |
//! | 96 | 8 | allocation count |
//! | 104 | 8 | chunk count |
//! | 112 | 8 | reserved, 0 |
//! | header length − 8 | 8 | XXH3-64 of the header's bytes before this field |
//!
//! Sections may not start before the previous one ends (1.0 to 1.3 write them back to back).
//!
//! Flag bit 0 is set exactly when the table holds a driver-handle range (a reader refuses
//! an image where the two disagree): a 1.0 or 1.1 reader, which would take such a range
//! for a runtime allocation, refuses the image (unknown required flag) instead. An image
//! without driver handles leaves it clear and reads in 1.1 readers.
//!
//! Flag bit 1 is set exactly when the table's records name more than one device (a reader
//! refuses an image where the two disagree): a 1.2 reader, which would take every record
//! for memory of the one device its GPU block names, refuses the image. An image of one
//! device leaves it clear and reads in 1.2 readers.
//!
//! **Metadata**: a *string* is a u32 byte length (at most 65536) and UTF-8 bytes; a *block*
//! is a u32 byte length and that many bytes, of which a reader decodes the fields it knows
//! and skips the rest (so a newer minor may append fields).
//!
//! ```text
//! process block: u32 pid, string executable, string hostname, string cudaw_version,
//!                u64 created (ns since the Unix epoch), u32 CUDA runtime major,
//!                u8 addressing (0 mapped, 1 translated)
//! GPU block:     string name, string UUID (empty when unknown), u32 compute capability
//!                major, u32 minor, u64 total memory (bytes),
//!                u32 device ordinal (since 1.1; 0xffffffff: unknown; absent in 1.0),
//!                since 1.3: u32 count of the other devices, then each as a block of the
//!                fields above (name to ordinal)
//! u64 allocation count, u32 record length (48 in 1.0 and 1.1, 104 in 1.2, 112 in 1.3;
//! longer records are read in part), then per allocation:
//!                 u64 id, u64 base, u64 size, u64 creation order, u32 tag,
//!                 u32 kind (0 runtime allocation, 1 driver-handle range; reserved 0 before 1.2),
//!                 u64 data offset (file offset of its first chunk),
//!   since 1.2:    u64 handle, u64 handle size, u64 offset within the handle,
//!                 32 bytes CUmemAllocationProp (all zero for kind 0)
//!   since 1.3:    u32 device ordinal (the device it is memory of), u32 reserved 0
//! ```
//!
//! **Devices** (1.3): an image holds the memory of every device of the process, one
//! section of the GPU list per device: the GPU block's own fields describe the device of
//! lowest ordinal (what a 1.2 reader sees), the list after them the others, each with its
//! ordinal, name and UUID, so that a restore can check that every device is the one the
//! memory came from. Ordinals are unique; every record names one of them. Before 1.3 every
//! record is memory of the one device the GPU block names.
//!
//! A *driver-handle range* (kind 1) is one mapping of a `cuMemCreate` handle the program
//! holds (PyTorch's expandable segments): `base` is the address it is mapped at, `size`
//! the bytes mapped, `handle` cudaw's virtual handle for it (what the program holds),
//! `handle size` and the properties what re-create it, `offset` where in the handle the
//! mapping starts. A handle mapped several times has one range per distinct span. Its
//! bytes are chunks like an allocation's; a kind 1 record shorter than 104 bytes is
//! refused.
//!
//! Bytes after the table are ignored (room for a newer minor). Ids are unique across the
//! whole image (all devices), and no two allocations share an address
//! (`[base, base + size)`: devices share one virtual address space).
//!
//! **Data**: the allocations in table order, each as `ceil(size / chunk size)` chunks (none
//! for size 0). Chunk *k* of allocation *A* holds bytes `k·chunk_size ..` of *A*:
//!
//! ```text
//! u64 allocation id, u64 offset within the allocation, u64 payload length   (24 bytes)
//! payload (chunk size bytes, the last chunk of an allocation: what remains)
//! u64 XXH3-64 of the 24 header bytes followed by the payload                (8 bytes)
//! ```
//!
//! So allocation *i*'s data offset is the data offset of the section plus, for every earlier
//! allocation, its size + 32 × its chunk count: a reader recomputes the layout and refuses a
//! table that disagrees, and can seek to any chunk directly.
//!
//! **Trailer** (32 bytes): u64 chunk count, u64 allocation bytes, u64 image digest, and the
//! end marker `b"CUDAWEND"` (the image's last 8 bytes). The digest is XXH3-64 of the header
//! bytes, the metadata bytes, and every chunk's checksum (as 8 little-endian bytes) in file
//! order.
//!
//! # What is checked when
//!
//! [`ImageReader::open`] reads only the header, metadata and trailer: magic, major version,
//! required flags, header checksum, section bounds, the file length against the header's
//! (a truncated image fails here), metadata checksum and encoding, the table (unique ids,
//! no overlap, data offsets) and the trailer's counts and end marker. Data is checked as it
//! is read: every chunk's header and checksum on every read, and the digest by
//! [`ImageReader::verify`]. No input makes the reader panic.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod compat;
mod error;
mod format;
mod meta;
mod reader;
mod summary;
mod writer;

pub use compat::{compare_tables, Difference};
pub use error::ImageError;
pub use format::{
    Header, CHUNK_FOOTER_LEN, CHUNK_HEADER_LEN, CHUNK_OVERHEAD, DEFAULT_CHUNK_SIZE, END_MAGIC,
    FLAG_DEVICES, FLAG_DRIVER_HANDLES, FORMAT_MAJOR, FORMAT_MINOR, HEADER_LEN, MAGIC,
    MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, TRAILER_LEN,
};
pub use meta::{
    Addressing, AllocationEntry, AllocationRecord, GpuInfo, HandleRange, ImageMetadata,
    ProcessInfo, MAX_DEVICES, PROP_LEN,
};
pub use reader::{ImageReader, RangeRead, Trailer, VerifyReport};
pub use summary::Summary;
pub use writer::{ImageWriter, Progress, WriterOptions};

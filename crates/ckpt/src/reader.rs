//! The streaming reader.

use std::collections::HashMap;
use std::fmt;
use std::io::{ErrorKind, Read, Seek, SeekFrom};

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::{xxh3_64, Xxh3Default};

use crate::compat::{compare_tables, Difference};
use crate::error::{show_bytes, ImageError};
use crate::format::{
    self, chunk_header, u64_at, Header, CHUNK_FOOTER_LEN, CHUNK_HEADER_LEN, CHUNK_OVERHEAD,
    END_MAGIC, FORMAT_MAJOR, HEADER_LEN, MAGIC, MAX_HEADER_LEN,
};
use crate::meta::{self, AllocationEntry, AllocationRecord, Dec, ImageMetadata};
use crate::summary::Summary;

/// Bytes read and hashed at a time: small enough to be hashed while still in cache.
const PIECE: u64 = 256 << 10;

/// The trailer's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trailer {
    /// Chunks in the data section.
    pub chunk_count: u64,
    /// Allocation bytes in the data section.
    pub data_bytes: u64,
    /// xxh3-64 over the header, the metadata and every chunk checksum.
    pub digest: u64,
}

/// What [`ImageReader::verify`] checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// Chunks whose checksum matched.
    pub chunks: u64,
    /// Allocation bytes read.
    pub data_bytes: u64,
    /// The whole-image digest (equal to the trailer's).
    pub digest: u64,
}

/// Reads an image from any [`Read`] + [`Seek`]. [`ImageReader::open`] checks the header,
/// metadata, table and trailer before anything else; allocation data is read (and every
/// chunk checked) only when asked for.
pub struct ImageReader<R: Read + Seek> {
    inner: R,
    /// Where `inner` is, `None` when unknown (after an error).
    pos: Option<u64>,
    header: Header,
    metadata: ImageMetadata,
    entries: Vec<AllocationEntry>,
    by_id: HashMap<u64, usize>,
    trailer: Trailer,
    /// Digest state after the header and metadata.
    prefix_digest: Xxh3Default,
    /// The index of each allocation's first chunk among all the image's chunks.
    first_chunk: Vec<u64>,
    /// Since [`ImageReader::begin_load`]: each chunk's checksum once it was read and
    /// checked (by chunk index), for [`ImageReader::finish_load`].
    loaded: Option<Vec<Option<u64>>>,
    /// Bytes read from `inner` since [`ImageReader::open`] began.
    bytes_read: u64,
}

impl<R: Read + Seek> fmt::Debug for ImageReader<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImageReader")
            .field("header", &self.header)
            .field("metadata", &self.metadata)
            .field("allocations", &self.entries.len())
            .field("trailer", &self.trailer)
            .finish_non_exhaustive()
    }
}

impl<R: Read + Seek> ImageReader<R> {
    /// Opens an image: checks magic, version, header checksum, section bounds against the
    /// file length (truncation is found here), metadata checksum, the table (unique ids, no
    /// overlap, data offsets where the layout puts them) and the trailer's end marker and
    /// counts. Allocation data is not read.
    pub fn open(mut inner: R) -> Result<Self, ImageError> {
        let actual = inner
            .seek(SeekFrom::End(0))
            .map_err(|source| ImageError::Io {
                context: "finding the image length",
                offset: 0,
                source,
            })?;
        let mut r = Raw {
            inner: &mut inner,
            pos: None,
            read: 0,
        };
        let mut start = [0u8; 16];
        let n = r.read_up_to(0, &mut start)?;
        let got = &start[..n];
        if got.len() < 8 && MAGIC.starts_with(got) && !got.is_empty() {
            return Err(ImageError::Truncated {
                at: n as u64,
                expected: HEADER_LEN,
            });
        }
        if got.len() < 8 || got[..8] != MAGIC {
            return Err(ImageError::NotAnImage {
                found: show_bytes(got),
            });
        }
        if n < 16 {
            return Err(ImageError::Truncated {
                at: n as u64,
                expected: HEADER_LEN,
            });
        }
        let major = u16::from_le_bytes([start[8], start[9]]);
        if major != FORMAT_MAJOR {
            return Err(ImageError::UnsupportedMajor {
                found: major,
                supported: FORMAT_MAJOR,
            });
        }
        let header_len = u64::from(u32::from_le_bytes([
            start[12], start[13], start[14], start[15],
        ]));
        if !(HEADER_LEN..=MAX_HEADER_LEN).contains(&header_len) {
            return Err(ImageError::Malformed {
                what: "header",
                offset: 12,
                detail: format!(
                    "header length {header_len} (expected {HEADER_LEN}..={MAX_HEADER_LEN})"
                ),
            });
        }
        let mut head = vec![0u8; header_len as usize];
        r.read_exact_at(0, &mut head, header_len, "reading the header")?;
        let header = Header::decode(&head)?;
        header.check_sections()?;
        if actual < header.file_len {
            return Err(ImageError::Truncated {
                at: actual,
                expected: header.file_len,
            });
        }
        if actual > header.file_len {
            return Err(ImageError::TrailingData {
                actual,
                expected: header.file_len,
            });
        }

        let mut md = vec![0u8; header.metadata_len as usize];
        r.read_exact_at(
            header.metadata_offset,
            &mut md,
            header.file_len,
            "reading the metadata",
        )?;
        let computed = xxh3_64(&md);
        if computed != header.metadata_checksum {
            return Err(ImageError::SectionChecksum {
                what: "metadata",
                stored: header.metadata_checksum,
                computed,
            });
        }
        let (metadata, recorded) = meta::decode(
            &mut Dec::new(&md, header.metadata_offset, "metadata"),
            header.minor,
        )?;
        if recorded.len() as u64 != header.allocation_count {
            return Err(ImageError::Inconsistent {
                what: "allocation count (header) against the table",
                found: header.allocation_count,
                expected: recorded.len() as u64,
            });
        }
        let handles = recorded
            .iter()
            .filter(|e| e.record.handle.is_some())
            .count();
        let flagged = header.flags & format::FLAG_DRIVER_HANDLES != 0;
        if flagged != (handles > 0) {
            return Err(ImageError::Inconsistent {
                what: "driver-handle flag (header) against the table's driver-handle ranges",
                found: u64::from(flagged),
                expected: u64::from(handles > 0),
            });
        }
        let records: Vec<AllocationRecord> = recorded.iter().map(|e| e.record).collect();
        format::check_devices(&metadata, &records)?;
        let several = header.flags & format::FLAG_DEVICES != 0;
        let expected = format::table_flags(&records) & format::FLAG_DEVICES != 0;
        if several != expected {
            return Err(ImageError::Inconsistent {
                what: "several-devices flag (header) against the devices the table's records name",
                found: u64::from(several),
                expected: u64::from(expected),
            });
        }
        let layout = format::layout(&records, header.chunk_size, header.data_offset)?;
        for (rec, lay) in recorded.iter().zip(&layout.entries) {
            if rec.data_offset != lay.data_offset {
                return Err(ImageError::DataOffset {
                    id: rec.record.id,
                    recorded: rec.data_offset,
                    expected: lay.data_offset,
                });
            }
        }
        if header.data_len != layout.data_len {
            return Err(ImageError::Inconsistent {
                what: "data section length (header) against the table",
                found: header.data_len,
                expected: layout.data_len,
            });
        }
        if header.chunk_count != layout.chunk_count {
            return Err(ImageError::Inconsistent {
                what: "chunk count (header) against the table",
                found: header.chunk_count,
                expected: layout.chunk_count,
            });
        }

        let mut t = [0u8; 24];
        r.read_exact_at(
            header.trailer_offset,
            &mut t,
            header.file_len,
            "reading the trailer",
        )?;
        let mut end = [0u8; 8];
        let end_at = header.file_len - 8;
        r.read_exact_at(end_at, &mut end, header.file_len, "reading the end marker")?;
        if end != END_MAGIC {
            return Err(ImageError::BadEndMarker {
                at: end_at,
                found: show_bytes(&end),
            });
        }
        let trailer = Trailer {
            chunk_count: u64_at(&t, 0),
            data_bytes: u64_at(&t, 8),
            digest: u64_at(&t, 16),
        };
        if trailer.chunk_count != layout.chunk_count {
            return Err(ImageError::Inconsistent {
                what: "chunk count (trailer) against the table",
                found: trailer.chunk_count,
                expected: layout.chunk_count,
            });
        }
        if trailer.data_bytes != layout.data_bytes {
            return Err(ImageError::Inconsistent {
                what: "allocation bytes (trailer) against the table",
                found: trailer.data_bytes,
                expected: layout.data_bytes,
            });
        }
        let (pos, bytes_read) = (r.pos, r.read);
        let mut prefix_digest = Xxh3Default::new();
        prefix_digest.update(&head);
        prefix_digest.update(&md);
        let by_id = layout
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.record.id, i))
            .collect();
        let first_chunk = layout
            .entries
            .iter()
            .scan(0u64, |n, e| {
                let first = *n;
                *n += e.chunk_count;
                Some(first)
            })
            .collect();
        Ok(ImageReader {
            inner,
            pos,
            header,
            metadata,
            entries: layout.entries,
            by_id,
            trailer,
            prefix_digest,
            first_chunk,
            loaded: None,
            bytes_read,
        })
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The producing process and GPU.
    pub fn metadata(&self) -> &ImageMetadata {
        &self.metadata
    }

    /// The trailer.
    pub fn trailer(&self) -> &Trailer {
        &self.trailer
    }

    /// The allocations, in the image's order.
    pub fn allocations(&self) -> &[AllocationEntry] {
        &self.entries
    }

    /// The allocation with this id.
    pub fn allocation(&self, id: u64) -> Option<&AllocationEntry> {
        self.by_id.get(&id).map(|&i| &self.entries[i])
    }

    /// Payload bytes per chunk: [`ImageReader::read_range`] reads whole chunks.
    pub fn chunk_size(&self) -> u64 {
        self.header.chunk_size
    }

    /// Header, metadata and table, for `cudaw-ckpt inspect`.
    pub fn summary(&self) -> Summary {
        Summary::new(&self.header, &self.metadata, &self.entries, &self.trailer)
    }

    /// How the image's table differs from `running` (the paused process's table): empty
    /// when the image can be restored into it.
    pub fn check_against(&self, running: &[AllocationRecord]) -> Vec<Difference> {
        let image: Vec<AllocationRecord> = self.entries.iter().map(|e| e.record).collect();
        compare_tables(&image, running)
    }

    /// Gives the underlying reader back.
    pub fn into_inner(self) -> R {
        self.inner
    }

    /// Reads every chunk, checking its header and checksum, then the whole-image digest.
    /// Uses a scratch buffer of at most 256 KiB.
    pub fn verify(&mut self) -> Result<VerifyReport, ImageError> {
        self.verify_with_progress(|_| {})
    }

    /// [`ImageReader::verify`], calling `progress` after each chunk with the allocation
    /// bytes checked so far (for progress bars).
    pub fn verify_with_progress(
        &mut self,
        mut progress: impl FnMut(u64),
    ) -> Result<VerifyReport, ImageError> {
        let mut digest = self.prefix_digest.clone();
        let mut scratch = vec![0u8; self.header.chunk_size.min(PIECE) as usize];
        let mut chunks = 0u64;
        let mut data_bytes = 0u64;
        for i in 0..self.entries.len() {
            for k in 0..self.entries[i].chunk_count {
                let (sum, len) = self.read_chunk(i, k, &mut scratch)?;
                digest.update(&sum.to_le_bytes());
                chunks += 1;
                data_bytes += len;
                progress(data_bytes);
            }
        }
        self.conclude(digest, chunks, data_bytes)
    }

    /// Starts a load that reads the image once: from now on the checksum of every chunk
    /// read and checked ([`ImageReader::read_range`], in any order) is remembered, so that
    /// [`ImageReader::finish_load`] checks the whole-image digest without reading those
    /// chunks again. A restore loads every allocation this way, then checks the digest,
    /// and commits the load only if it matches.
    pub fn begin_load(&mut self) {
        self.loaded = Some(vec![None; self.header.chunk_count as usize]);
    }

    /// Ends a load begun with [`ImageReader::begin_load`]: reads and checks the chunks it
    /// did not read (none when every allocation was loaded), then checks the whole-image
    /// digest over every chunk's checksum in image order. `progress` is called after each
    /// chunk read here with the allocation bytes read here so far. Without
    /// [`ImageReader::begin_load`] it is [`ImageReader::verify_with_progress`].
    pub fn finish_load(
        &mut self,
        mut progress: impl FnMut(u64),
    ) -> Result<VerifyReport, ImageError> {
        let Some(loaded) = self.loaded.take() else {
            return self.verify_with_progress(progress);
        };
        let mut digest = self.prefix_digest.clone();
        let mut scratch = Vec::new();
        let (mut chunks, mut data_bytes, mut read_here) = (0u64, 0u64, 0u64);
        for i in 0..self.entries.len() {
            for k in 0..self.entries[i].chunk_count {
                let sum = match loaded[(self.first_chunk[i] + k) as usize] {
                    Some(sum) => sum,
                    None => {
                        if scratch.is_empty() {
                            scratch = vec![0u8; self.header.chunk_size.min(PIECE) as usize];
                        }
                        let (sum, len) = self.read_chunk(i, k, &mut scratch)?;
                        read_here += len;
                        progress(read_here);
                        sum
                    }
                };
                digest.update(&sum.to_le_bytes());
                chunks += 1;
                data_bytes += self.chunk_len(i, k);
            }
        }
        self.conclude(digest, chunks, data_bytes)
    }

    /// The whole-image digest over every chunk's checksum, against the trailer's: the
    /// report of a verify or a load.
    fn conclude(
        &self,
        digest: Xxh3Default,
        chunks: u64,
        data_bytes: u64,
    ) -> Result<VerifyReport, ImageError> {
        let computed = digest.digest();
        if computed != self.trailer.digest {
            return Err(ImageError::DigestMismatch {
                stored: self.trailer.digest,
                computed,
            });
        }
        Ok(VerifyReport {
            chunks,
            data_bytes,
            digest: computed,
        })
    }

    /// Bytes read from the underlying reader so far (opening included): a restore that
    /// reads the image once reads about its length.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// Payload bytes of chunk `k` of allocation `entries[i]`.
    fn chunk_len(&self, i: usize, k: u64) -> u64 {
        let cs = self.header.chunk_size;
        cs.min(self.entries[i].record.size - k * cs)
    }

    /// Reads allocation `id` whole into `buf` (its exact size), checking every chunk.
    pub fn read_allocation(&mut self, id: u64, buf: &mut [u8]) -> Result<(), ImageError> {
        let e = self
            .allocation(id)
            .ok_or(ImageError::UnknownAllocation(id))?;
        if buf.len() as u64 != e.record.size {
            return Err(ImageError::Inconsistent {
                what: "buffer length against the allocation's size",
                found: buf.len() as u64,
                expected: e.record.size,
            });
        }
        self.read_range(id, 0, buf)
    }

    /// Reads bytes `offset..offset + buf.len()` of allocation `id` into `buf`, checking each
    /// chunk's header and checksum as it goes (random access: only those chunks are read).
    /// `offset` must be a multiple of [`ImageReader::chunk_size`], and the end either one
    /// or the allocation's end, so that every chunk read is checked whole: restore reads an
    /// allocation through pinned buffers whose size is a multiple of the chunk size. On an
    /// error, `buf` holds unspecified bytes.
    pub fn read_range(&mut self, id: u64, offset: u64, buf: &mut [u8]) -> Result<(), ImageError> {
        let read = self.read_range_unchecked(id, offset, buf)?;
        let sums = read.check(buf)?;
        self.loaded_checked(&sums);
        Ok(())
    }

    /// [`ImageReader::read_range`]'s reading alone: the chunks' payloads into `buf`, their
    /// headers and stored checksums into the returned [`RangeRead`], whose
    /// [`RangeRead::check`] (on any thread) checks them against `buf`. A loader reads on
    /// one thread and checks on another, so that the disk is not idle while a chunk's
    /// checksum is computed; it hands the checksums back with
    /// [`ImageReader::loaded_checked`]. The same conditions on `offset` and the length.
    pub fn read_range_unchecked(
        &mut self,
        id: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<RangeRead, ImageError> {
        let i = *self
            .by_id
            .get(&id)
            .ok_or(ImageError::UnknownAllocation(id))?;
        let e = self.entries[i];
        let size = e.record.size;
        let cs = self.header.chunk_size;
        let len = buf.len() as u64;
        let end = offset.checked_add(len);
        let ok = offset % cs == 0
            && end.is_some_and(|end| end <= size && (end % cs == 0 || end == size));
        if !ok {
            return Err(ImageError::BadRange {
                id,
                offset,
                len,
                size,
                chunk_size: cs,
            });
        }
        let file_len = self.header.file_len;
        let mut read = RangeRead {
            id,
            chunks: Vec::with_capacity(buf.len().div_ceil(cs.max(1) as usize)),
        };
        let mut r = Raw {
            inner: &mut self.inner,
            pos: self.pos,
            read: 0,
        };
        let result = (|| {
            let mut rest = &mut *buf;
            let mut k = offset / cs;
            while !rest.is_empty() {
                let n = cs.min(rest.len() as u64);
                let (piece, tail) = rest.split_at_mut(n as usize);
                let at = e.data_offset + k * (cs + CHUNK_OVERHEAD);
                let mut header = [0u8; CHUNK_HEADER_LEN as usize];
                r.read_exact_at(at, &mut header, file_len, "reading a chunk header")?;
                r.read_exact_at(at + CHUNK_HEADER_LEN, piece, file_len, "reading chunk data")?;
                let mut f = [0u8; CHUNK_FOOTER_LEN as usize];
                r.read_exact_at(
                    at + CHUNK_HEADER_LEN + n,
                    &mut f,
                    file_len,
                    "reading a chunk checksum",
                )?;
                read.chunks.push(ChunkRead {
                    index: self.first_chunk[i] + k,
                    k,
                    offset: k * cs,
                    len: n,
                    file_offset: at,
                    header,
                    stored: u64::from_le_bytes(f),
                });
                rest = tail;
                k += 1;
            }
            Ok(())
        })();
        self.pos = r.pos;
        self.bytes_read += r.read;
        result.map(|()| read)
    }

    /// Checksums [`RangeRead::check`] passed, by chunk index: remembered for
    /// [`ImageReader::finish_load`] (nothing without [`ImageReader::begin_load`]).
    pub fn loaded_checked(&mut self, sums: &[(u64, u64)]) {
        if let Some(loaded) = self.loaded.as_mut() {
            for &(index, sum) in sums {
                if let Some(slot) = loaded.get_mut(index as usize) {
                    *slot = Some(sum);
                }
            }
        }
    }

    /// Reads chunk `k` of allocation `entries[i]` through `scratch` (its payload not kept),
    /// checks its header and checksum; returns the checksum and payload length.
    fn read_chunk(
        &mut self,
        i: usize,
        k: u64,
        scratch: &mut [u8],
    ) -> Result<(u64, u64), ImageError> {
        let e = self.entries[i];
        let cs = self.header.chunk_size;
        let id = e.record.id;
        let offset = k * cs;
        let len = cs.min(e.record.size - offset);
        // Within the file: `open` checked the layout against the file length.
        let at = e.data_offset + k * (cs + CHUNK_OVERHEAD);
        let file_len = self.header.file_len;
        let mut r = Raw {
            inner: &mut self.inner,
            pos: self.pos,
            read: 0,
        };
        let result = (|| {
            let mut h = [0u8; CHUNK_HEADER_LEN as usize];
            r.read_exact_at(at, &mut h, file_len, "reading a chunk header")?;
            // Its header is checked before its payload is read; its checksum after.
            let mut chunk = ChunkRead {
                index: self.first_chunk[i] + k,
                k,
                offset,
                len,
                file_offset: at,
                header: h,
                stored: 0,
            };
            chunk.check_header(id)?;
            let mut hash = Xxh3Default::new();
            hash.update(&h);
            let payload_at = at + CHUNK_HEADER_LEN;
            let mut done = 0u64;
            while done < len {
                let n = (scratch.len() as u64).min(len - done);
                let piece = &mut scratch[..n as usize];
                r.read_exact_at(payload_at + done, piece, file_len, "reading chunk data")?;
                hash.update(piece);
                done += n;
            }
            let mut f = [0u8; CHUNK_FOOTER_LEN as usize];
            r.read_exact_at(
                payload_at + len,
                &mut f,
                file_len,
                "reading a chunk checksum",
            )?;
            chunk.stored = u64::from_le_bytes(f);
            chunk.check_sum(id, hash.digest())?;
            Ok((chunk.stored, len))
        })();
        self.pos = r.pos;
        self.bytes_read += r.read;
        if let (Ok((sum, _)), Some(loaded)) = (&result, self.loaded.as_mut()) {
            loaded[(self.first_chunk[i] + k) as usize] = Some(*sum);
        }
        result
    }
}

/// What [`ImageReader::read_range_unchecked`] read besides the payloads: each chunk's
/// header and stored checksum, to check against the payloads ([`RangeRead::check`]).
#[derive(Debug, Clone)]
pub struct RangeRead {
    id: u64,
    chunks: Vec<ChunkRead>,
}

#[derive(Debug, Clone, Copy)]
struct ChunkRead {
    /// Among all the image's chunks (the digest's order).
    index: u64,
    /// Among the allocation's chunks.
    k: u64,
    /// Of its payload in the allocation, and its length.
    offset: u64,
    len: u64,
    /// Of its header in the file.
    file_offset: u64,
    header: [u8; CHUNK_HEADER_LEN as usize],
    stored: u64,
}

impl ChunkRead {
    /// The header read against the one chunk `k` of allocation `id` should have.
    fn check_header(&self, id: u64) -> Result<(), ImageError> {
        if self.header == chunk_header(id, self.offset, self.len) {
            return Ok(());
        }
        Err(ImageError::ChunkHeader {
            allocation: id,
            chunk: self.k,
            offset: self.offset,
            len: self.len,
            file_offset: self.file_offset,
            found_allocation: u64_at(&self.header, 0),
            found_offset: u64_at(&self.header, 8),
            found_len: u64_at(&self.header, 16),
        })
    }

    /// The stored checksum against the one computed over header and payload.
    fn check_sum(&self, id: u64, computed: u64) -> Result<(), ImageError> {
        if computed == self.stored {
            return Ok(());
        }
        Err(ImageError::ChunkChecksum {
            allocation: id,
            chunk: self.k,
            offset: self.offset,
            file_offset: self.file_offset,
            stored: self.stored,
            computed,
        })
    }
}

impl RangeRead {
    /// Checks each chunk's header and checksum (xxh3 over header and payload) against
    /// `buf`, the payloads [`ImageReader::read_range_unchecked`] read into it: the
    /// checksums by chunk index, for [`ImageReader::loaded_checked`], or the first
    /// chunk's error.
    pub fn check(&self, buf: &[u8]) -> Result<Vec<(u64, u64)>, ImageError> {
        let mut sums = Vec::with_capacity(self.chunks.len());
        let mut at = 0usize;
        for c in &self.chunks {
            c.check_header(self.id)?;
            let payload = buf
                .get(at..at + c.len as usize)
                .ok_or(ImageError::Inconsistent {
                    what: "buffer length against the chunks read",
                    found: buf.len() as u64,
                    expected: (at as u64) + c.len,
                })?;
            let mut hash = Xxh3Default::new();
            hash.update(&c.header);
            hash.update(payload);
            c.check_sum(self.id, hash.digest())?;
            sums.push((c.index, c.stored));
            at += c.len as usize;
        }
        Ok(sums)
    }
}

/// Positioned reads over the underlying reader, tracking its position so that sequential
/// reads do not seek.
struct Raw<'a, R> {
    inner: &'a mut R,
    pos: Option<u64>,
    /// Bytes read through it.
    read: u64,
}

impl<R: Read + Seek> Raw<'_, R> {
    fn seek_to(&mut self, at: u64) -> Result<(), ImageError> {
        if self.pos != Some(at) {
            self.pos = None;
            self.inner
                .seek(SeekFrom::Start(at))
                .map_err(|source| ImageError::Io {
                    context: "seeking",
                    offset: at,
                    source,
                })?;
            self.pos = Some(at);
        }
        Ok(())
    }

    /// Reads into `buf` until it is full or the data ends; returns the count.
    fn read_up_to(&mut self, at: u64, buf: &mut [u8]) -> Result<usize, ImageError> {
        self.seek_to(at)?;
        let mut got = 0;
        while got < buf.len() {
            match self.inner.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => {
                    got += n;
                    self.read += n as u64;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(source) => {
                    self.pos = None;
                    return Err(ImageError::Io {
                        context: "reading",
                        offset: at + got as u64,
                        source,
                    });
                }
            }
        }
        self.pos = Some(at + got as u64);
        Ok(got)
    }

    /// Fills `buf` from `at`; running out of data is truncation (`expected`: the length
    /// the image should have).
    fn read_exact_at(
        &mut self,
        at: u64,
        buf: &mut [u8],
        expected: u64,
        context: &'static str,
    ) -> Result<(), ImageError> {
        let got = self.read_up_to(at, buf).map_err(|e| match e {
            ImageError::Io { offset, source, .. } => ImageError::Io {
                context,
                offset,
                source,
            },
            e => e,
        })?;
        if got < buf.len() {
            return Err(ImageError::Truncated {
                at: at + got as u64,
                expected: expected.max(at + buf.len() as u64),
            });
        }
        Ok(())
    }
}

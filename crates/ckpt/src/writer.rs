//! The streaming writer.

use std::collections::HashSet;
use std::fmt;
use std::io::Write;

use xxhash_rust::xxh3::Xxh3Default;

use crate::error::ImageError;
use crate::format::{
    self, chunk_header, Header, DEFAULT_CHUNK_SIZE, FORMAT_MAJOR, FORMAT_MINOR, HEADER_LEN,
    TRAILER_LEN,
};
use crate::meta::{self, AllocationEntry, AllocationRecord, Enc, ImageMetadata};

/// How to write an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterOptions {
    /// Payload bytes per chunk (default 8 MiB).
    pub chunk_size: u64,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            chunk_size: DEFAULT_CHUNK_SIZE,
        }
    }
}

/// Where a write stands, for progress bars.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Image bytes written so far.
    pub bytes_written: u64,
    /// Image bytes in all.
    pub total_bytes: u64,
    /// Allocation bytes written so far.
    pub data_written: u64,
    /// Allocation bytes in all.
    pub data_total: u64,
}

type ProgressFn = Box<dyn FnMut(&Progress) + Send>;

/// Writes an image to any [`Write`], streaming: the header, metadata and table first (the
/// layout follows from the table), then the allocations' bytes in table order, in pieces of
/// any size, then the trailer. It never copies or buffers payload bytes: its memory is the
/// table plus a few fixed-size fields, whatever the image size.
pub struct ImageWriter<W: Write> {
    out: W,
    entries: Vec<AllocationEntry>,
    /// Ids of the empty allocations (skipped; writing nothing to them is accepted).
    empty: HashSet<u64>,
    chunk_size: u64,
    /// The allocation being written (index into `entries`).
    cur: usize,
    /// Bytes of it written.
    cur_written: u64,
    /// Bytes left in the open chunk (0: none open).
    chunk_left: u64,
    chunk_hash: Xxh3Default,
    digest: Xxh3Default,
    progress: Progress,
    chunks_written: u64,
    chunk_count: u64,
    on_progress: Option<ProgressFn>,
    poisoned: bool,
}

impl<W: Write> fmt::Debug for ImageWriter<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImageWriter")
            .field("chunk_size", &self.chunk_size)
            .field("allocations", &self.entries.len())
            .field("progress", &self.progress)
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}

impl<W: Write> ImageWriter<W> {
    /// Checks the table (unique ids, no overlap), lays the image out and writes its header
    /// and metadata. The allocations' bytes must then be written in `table` order.
    pub fn begin(
        mut out: W,
        meta: &ImageMetadata,
        table: &[AllocationRecord],
        options: WriterOptions,
    ) -> Result<Self, ImageError> {
        format::check_chunk_size(options.chunk_size)?;
        format::check_devices(meta, table)?;
        let mut enc = Enc::default();
        meta::encode_description(meta, &mut enc);
        let table_len = 12 + u64::from(meta::RECORD_LEN) * table.len() as u64;
        let metadata_len = enc.0.len() as u64 + table_len;
        let data_offset = HEADER_LEN + metadata_len;
        let layout = format::layout(table, options.chunk_size, data_offset)?;
        meta::encode_table(&layout.entries, &mut enc);
        debug_assert_eq!(enc.0.len() as u64, metadata_len);
        let trailer_offset = data_offset + layout.data_len;
        let header = Header {
            major: FORMAT_MAJOR,
            minor: FORMAT_MINOR,
            header_len: HEADER_LEN,
            flags: format::table_flags(table),
            chunk_size: options.chunk_size,
            metadata_offset: HEADER_LEN,
            metadata_len,
            data_offset,
            data_len: layout.data_len,
            trailer_offset,
            trailer_len: TRAILER_LEN,
            file_len: trailer_offset + TRAILER_LEN,
            metadata_checksum: xxhash_rust::xxh3::xxh3_64(&enc.0),
            allocation_count: table.len() as u64,
            chunk_count: layout.chunk_count,
        };
        let head = header.encode();
        let mut digest = Xxh3Default::new();
        digest.update(&head);
        digest.update(&enc.0);
        let io = |source| ImageError::Io {
            context: "writing the header and metadata",
            offset: 0,
            source,
        };
        out.write_all(&head).map_err(io)?;
        out.write_all(&enc.0).map_err(io)?;
        let empty = table.iter().filter(|r| r.size == 0).map(|r| r.id).collect();
        let mut w = ImageWriter {
            out,
            entries: layout.entries,
            empty,
            chunk_size: options.chunk_size,
            cur: 0,
            cur_written: 0,
            chunk_left: 0,
            chunk_hash: Xxh3Default::new(),
            digest,
            progress: Progress {
                bytes_written: data_offset,
                total_bytes: header.file_len,
                data_written: 0,
                data_total: layout.data_bytes,
            },
            chunks_written: 0,
            chunk_count: layout.chunk_count,
            on_progress: None,
            poisoned: false,
        };
        w.skip_empty();
        Ok(w)
    }

    /// Calls `f` after every write with the bytes written so far.
    pub fn on_progress(&mut self, f: impl FnMut(&Progress) + Send + 'static) {
        self.on_progress = Some(Box::new(f));
    }

    /// Where the write stands.
    pub fn progress(&self) -> Progress {
        self.progress
    }

    /// The allocations as the image lays them out (data offsets, chunk counts).
    pub fn allocations(&self) -> &[AllocationEntry] {
        &self.entries
    }

    /// The allocation and offset the writer expects next (`None` once all are written).
    pub fn next_expected(&self) -> Option<(u64, u64)> {
        self.entries
            .get(self.cur)
            .map(|e| (e.record.id, self.cur_written))
    }

    /// Payload bytes the writer holds between calls: always 0 (it writes through).
    pub fn buffered_bytes(&self) -> usize {
        0
    }

    /// Writes bytes `offset..offset + data.len()` of allocation `id`: the next bytes of the
    /// allocation being written (allocations in table order, each from offset 0 up).
    /// Pieces need not match the image's chunks. Empty allocations need no write (writing
    /// nothing at offset 0 to one is accepted at any time).
    pub fn write_chunk(&mut self, id: u64, offset: u64, data: &[u8]) -> Result<(), ImageError> {
        if self.poisoned {
            return Err(ImageError::Poisoned);
        }
        let len = data.len() as u64;
        if len == 0 && offset == 0 && self.empty.contains(&id) {
            return Ok(());
        }
        let Some(e) = self.entries.get(self.cur) else {
            return Err(ImageError::UnexpectedData { id, len });
        };
        let (exp_id, size) = (e.record.id, e.record.size);
        if id != exp_id || offset != self.cur_written {
            return Err(ImageError::OutOfOrder {
                expected_id: exp_id,
                expected_offset: self.cur_written,
                id,
                offset,
            });
        }
        if len > size - offset {
            return Err(ImageError::Overrun {
                id,
                offset,
                len,
                size,
            });
        }
        let result = self.write_through(id, size, data);
        if result.is_err() {
            self.poisoned = true;
        }
        result?;
        if self.cur_written == size {
            self.cur += 1;
            self.cur_written = 0;
            self.skip_empty();
        }
        if let Some(f) = self.on_progress.as_mut() {
            f(&self.progress);
        }
        Ok(())
    }

    /// Writes the whole of allocation `id` (which must be the next one).
    pub fn write_allocation(&mut self, id: u64, data: &[u8]) -> Result<(), ImageError> {
        if let Some(e) = self.entries.get(self.cur) {
            if e.record.id == id && self.cur_written == 0 && data.len() as u64 != e.record.size {
                return Err(ImageError::Inconsistent {
                    what: "bytes given for a whole allocation against its size",
                    found: data.len() as u64,
                    expected: e.record.size,
                });
            }
        }
        self.write_chunk(id, 0, data)
    }

    fn write_through(&mut self, id: u64, size: u64, mut data: &[u8]) -> Result<(), ImageError> {
        while !data.is_empty() {
            if self.chunk_left == 0 {
                let len = self.chunk_size.min(size - self.cur_written);
                let h = chunk_header(id, self.cur_written, len);
                self.chunk_hash.reset();
                self.chunk_hash.update(&h);
                self.put(&h)?;
                self.chunk_left = len;
            }
            let n = (self.chunk_left.min(data.len() as u64)) as usize;
            let (piece, rest) = data.split_at(n);
            self.chunk_hash.update(piece);
            self.put(piece)?;
            self.cur_written += n as u64;
            self.progress.data_written += n as u64;
            self.chunk_left -= n as u64;
            data = rest;
            if self.chunk_left == 0 {
                let sum = self.chunk_hash.digest().to_le_bytes();
                self.digest.update(&sum);
                self.put(&sum)?;
                self.chunks_written += 1;
            }
        }
        Ok(())
    }

    fn put(&mut self, b: &[u8]) -> Result<(), ImageError> {
        let offset = self.progress.bytes_written;
        self.out.write_all(b).map_err(|source| ImageError::Io {
            context: "writing allocation data",
            offset,
            source,
        })?;
        self.progress.bytes_written += b.len() as u64;
        Ok(())
    }

    fn skip_empty(&mut self) {
        while self
            .entries
            .get(self.cur)
            .is_some_and(|e| e.record.size == 0)
        {
            self.cur += 1;
        }
    }

    /// Writes the trailer and flushes; every allocation must be complete. Returns the
    /// output.
    pub fn finish(mut self) -> Result<W, ImageError> {
        if self.poisoned {
            return Err(ImageError::Poisoned);
        }
        if let Some(e) = self.entries.get(self.cur) {
            return Err(ImageError::Incomplete {
                id: e.record.id,
                written: self.cur_written,
                size: e.record.size,
            });
        }
        debug_assert_eq!(self.chunks_written, self.chunk_count);
        let t = format::trailer(
            self.chunks_written,
            self.progress.data_written,
            self.digest.digest(),
        );
        let offset = self.progress.bytes_written;
        let io = |source| ImageError::Io {
            context: "writing the trailer",
            offset,
            source,
        };
        self.out.write_all(&t).map_err(io)?;
        self.out.flush().map_err(io)?;
        self.progress.bytes_written += t.len() as u64;
        debug_assert_eq!(self.progress.bytes_written, self.progress.total_bytes);
        if let Some(f) = self.on_progress.as_mut() {
            f(&self.progress);
        }
        Ok(self.out)
    }
}

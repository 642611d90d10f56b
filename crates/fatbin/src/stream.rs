//! Listing every kernel of a large input without holding it: [`StreamIndex`] reads entry
//! headers through [`ReadAt`] (a file, or a slice), and [`decode_in_order`] decodes the
//! entries one by one — read the payload, decompress, parse, drop — on one or several
//! threads, handing the results back in input order.
//!
//! Memory is bounded by the work in flight, not by the input: each worker owns one
//! [`Decoder`] (one buffer for the stored payload, one for the decompressed image, one zstd
//! context, all reused from entry to entry), and at most `2 × threads` decoded results wait
//! for the caller. On PyTorch 2.11's `libtorch_cuda.so` (a 298 MB `.nv_fatbin` of 2,789
//! zstd cubins, 4.7 GB decompressed) that is the largest cubin (41 MB) per thread.
//!
//! [`crate::Fatbin`] stays the in-process path (the shim's lazy, per-kernel lookups): it
//! borrows an image already in memory and starts no thread.

use std::collections::VecDeque;
use std::io;
use std::sync::{Condvar, Mutex};

use crate::container::{
    decompress_into, grown, identifier_text, parse_entry_head, Compression, Container, Entry,
    EntryKind,
};
use crate::error::{span_at, u16_at, u32_at, Error, Result};
use crate::index::{fatbin_sections, loadable_indices, select_indices, single, InputKind};
use crate::raw::{container_len_at, detect_image_kind, ImageKind, CONTAINER_MAGIC};
use crate::{cubin, ptx, KernelInfo};

/// A source of bytes read at offsets: a file (`pread`, no shared cursor) or a slice.
pub trait ReadAt: Sync {
    /// The length in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Fills `buf` with the bytes at `offset`; fails if fewer are there.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

impl ReadAt for [u8] {
    fn size(&self) -> io::Result<u64> {
        Ok(self.len() as u64)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let bytes = usize::try_from(offset)
            .ok()
            .and_then(|start| self.get(start..start.checked_add(buf.len())?))
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(bytes);
        Ok(())
    }
}

impl ReadAt for Vec<u8> {
    fn size(&self) -> io::Result<u64> {
        self.as_slice().size()
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.as_slice().read_exact_at(buf, offset)
    }
}

#[cfg(unix)]
impl ReadAt for std::fs::File {
    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }
}

fn io_err(offset: u64, len: usize, e: &io::Error) -> Error {
    Error::Io {
        offset,
        len: len as u64,
        reason: e.to_string(),
    }
}

fn read_at<R: ReadAt + ?Sized>(src: &R, buf: &mut [u8], offset: u64) -> Result<()> {
    src.read_exact_at(buf, offset)
        .map_err(|e| io_err(offset, buf.len(), &e))
}

/// `object`'s reader over a [`ReadAt`], for the host ELF's headers.
struct Cursor<'r, R: ?Sized> {
    src: &'r R,
    pos: u64,
}

impl<R: ReadAt + ?Sized> object::ReadCacheOps for Cursor<'_, R> {
    fn len(&mut self) -> Result<u64, ()> {
        self.src.size().map_err(|_| ())
    }
    fn seek(&mut self, pos: u64) -> Result<u64, ()> {
        self.pos = pos;
        Ok(pos)
    }
    fn read(&mut self, buf: &mut [u8]) -> Result<usize, ()> {
        let left = self.src.size().map_err(|_| ())?.saturating_sub(self.pos);
        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        self.read_exact(&mut buf[..n])?;
        Ok(n)
    }
    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), ()> {
        self.src.read_exact_at(buf, self.pos).map_err(|_| ())?;
        self.pos += buf.len() as u64;
        Ok(())
    }
}

/// How many bytes are read at once while walking headers: an entry header (0x40–0x50
/// bytes) with its identifier, or a run of zero padding.
const WINDOW: u64 = 4096;

/// The headers of every entry of an input, read through [`ReadAt`] without holding any
/// payload: what [`crate::Fatbin`] indexes, for an input too large to keep in memory.
#[derive(Debug, Clone)]
pub struct StreamIndex {
    kind: InputKind,
    containers: Vec<Container>,
    /// Entries with an empty [`Entry::raw_payload`]; the payload is at
    /// `offset + header_size`, `payload_sizes[i]` bytes.
    entries: Vec<Entry<'static>>,
    payload_sizes: Vec<u64>,
}

impl StreamIndex {
    /// Indexes any input [`crate::Fatbin::parse`] takes, reading its headers only: for a
    /// host ELF file, its section headers and names and the header of each entry of its
    /// `.nv_fatbin` / `__nv_relfatbin` sections. A bare cubin or PTX text (one image) is
    /// read whole. Errors are those of [`crate::Fatbin::parse`] on the same bytes, and
    /// [`Error::Io`] when the source fails.
    pub fn read<R: ReadAt + ?Sized>(src: &R) -> Result<Self> {
        let size = src.size().map_err(|e| io_err(0, 0, &e))?;
        let mut prefix = vec![0u8; size.min(64) as usize];
        read_at(src, &mut prefix, 0)?;
        let mut index = StreamIndex {
            kind: InputKind::Containers,
            containers: Vec::new(),
            entries: Vec::new(),
            payload_sizes: Vec::new(),
        };
        let whole = || -> Result<Vec<u8>> {
            let len = usize::try_from(size).map_err(|_| Error::Io {
                offset: 0,
                len: size,
                reason: "larger than this machine's address space".into(),
            })?;
            let mut all = vec![0u8; len];
            read_at(src, &mut all, 0)?;
            Ok(all)
        };
        match detect_image_kind(&prefix) {
            Some(ImageKind::Fatbin) => {
                index.walk_containers(src, 0, size, false)?;
            }
            Some(ImageKind::HostElf) => {
                index.kind = InputKind::HostElf;
                let cache = object::ReadCache::new(Cursor { src, pos: 0 });
                for section in fatbin_sections(&cache)? {
                    let end = section
                        .offset
                        .checked_add(section.size)
                        .filter(|&e| e <= size);
                    let Some(end) = end else {
                        return Err(Error::Elf {
                            offset: 0,
                            reason: "Invalid ELF section size or offset".into(),
                        });
                    };
                    index.walk_containers(src, section.offset, end, section.relocatable)?;
                }
            }
            Some(ImageKind::Cubin) => {
                let data = whole()?;
                let sm = cubin::parse_cubin(&data)?.sm.unwrap_or(0);
                index.kind = InputKind::Cubin;
                index.push_single(EntryKind::Elf, sm, size);
            }
            Some(ImageKind::Ptx) => {
                let data = whole()?;
                let sm = ptx::parse_ptx(&data)?.target_sm.unwrap_or(0);
                index.kind = InputKind::Ptx;
                index.push_single(EntryKind::Ptx, sm, size);
            }
            Some(ImageKind::Wrapper) | None => {
                return Err(Error::UnknownFormat {
                    prefix: prefix.iter().take(8).copied().collect(),
                })
            }
        }
        Ok(index)
    }

    fn push_single(&mut self, kind: EntryKind, sm: u32, size: u64) {
        let (mut container, entry) = single(kind, sm, &[]);
        container.len = size;
        self.containers.push(container);
        self.entries.push(entry);
        self.payload_sizes.push(size);
    }

    /// Reads the containers in `start..end` (zero padding between them skipped), as
    /// `parse_containers` does over a slice.
    fn walk_containers<R: ReadAt + ?Sized>(
        &mut self,
        src: &R,
        start: u64,
        end: u64,
        relocatable: bool,
    ) -> Result<()> {
        let mut buf = vec![0u8; WINDOW as usize];
        let mut pos = start;
        let mut found = false;
        while pos < end {
            let n = (end - pos).min(WINDOW) as usize;
            let window = &mut buf[..n];
            read_at(src, window, pos)?;
            // Padding between containers: skip zero bytes.
            let Some(skip) = window.iter().position(|&b| b != 0) else {
                pos += n as u64;
                continue;
            };
            if skip > 0 {
                pos += skip as u64;
                continue;
            }
            let at = pos;
            let magic = u32_at(window, 0, "fatbin container header", at)?;
            if magic != CONTAINER_MAGIC {
                return Err(Error::BadMagic {
                    what: "fatbin container",
                    offset: at,
                    found: magic.into(),
                    expected: CONTAINER_MAGIC.into(),
                });
            }
            let len = container_len_at(window, at)?;
            span_at(end - pos, 0, len, "fatbin container", at)?;
            let version = u16_at(window, 4, "fatbin container header", at)?;
            let header_size = u16_at(window, 6, "fatbin container header", at)?;
            let first = self.entries.len();
            self.walk_entries(src, at, len, u64::from(header_size), &mut buf)?;
            self.containers.push(Container {
                offset: at,
                len,
                version,
                relocatable,
                entries: first..self.entries.len(),
            });
            found = true;
            pos += len;
        }
        if !found {
            return Err(Error::Truncated {
                what: "fatbin container",
                offset: start,
                needed: 16,
                available: end - start,
            });
        }
        Ok(())
    }

    /// Reads the entry headers of the container at `base`, `len` bytes long, from `pos`.
    fn walk_entries<R: ReadAt + ?Sized>(
        &mut self,
        src: &R,
        base: u64,
        len: u64,
        mut pos: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let container = self.containers.len();
        while pos < len {
            let at = base + pos;
            let available = len - pos;
            let n = available.min(WINDOW) as usize;
            let window = &mut buf[..n];
            read_at(src, window, at)?;
            let head = parse_entry_head(window, available, at, container)?;
            let identifier = match head.identifier {
                Some((off, id_len)) => {
                    let (off, id_len) = (u64::from(off), u64::from(id_len));
                    match off.checked_add(id_len) {
                        Some(id_end) if id_end <= n as u64 => {
                            Some(identifier_text(&window[off as usize..id_end as usize]))
                        }
                        Some(id_end) if id_end <= available => {
                            let mut id = vec![0u8; id_len as usize];
                            read_at(src, &mut id, at + off)?;
                            Some(identifier_text(&id))
                        }
                        _ => None,
                    }
                }
                None => None,
            };
            self.entries.push(Entry {
                identifier,
                ..head.entry
            });
            self.payload_sizes.push(head.payload_size);
            // `parse_entry_head` checked both against `available`.
            pos += u64::from(self.entries[self.entries.len() - 1].header_size) + head.payload_size;
        }
        Ok(())
    }

    /// What the input was.
    pub fn input_kind(&self) -> InputKind {
        self.kind
    }

    /// Every container, in input order.
    pub fn containers(&self) -> &[Container] {
        &self.containers
    }

    /// Every entry of every container, in input order, each with an empty
    /// [`Entry::raw_payload`] (decode them with a [`Decoder`]).
    pub fn entries(&self) -> &[Entry<'static>] {
        &self.entries
    }

    /// Indices of the entries the driver can load (as [`crate::Fatbin::loadable_entries`]).
    pub fn loadable(&self) -> Vec<usize> {
        loadable_indices(&self.containers).collect()
    }

    /// Indices of the entries the driver runs on SM `sm` (as [`crate::Fatbin::select`]).
    pub fn select(&self, sm: u32) -> Vec<usize> {
        select_indices(&self.containers, &self.entries, sm)
    }
}

/// Above this, a [`Decoder`]'s buffers are given back after the entry instead of being
/// kept for the next one.
const KEEP_BYTES: usize = 64 << 20;

/// Reusable buffers for decoding entries one after another: the stored payload, the
/// decompressed image and a zstd context. Holds at most one image at a time.
#[derive(Default)]
pub struct Decoder {
    raw: Vec<u8>,
    image: Vec<u8>,
    zstd: Option<zstd::bulk::Decompressor<'static>>,
    /// Seconds spent reading, decompressing and parsing (with [`Decoder::timed`]).
    timings: Option<Timings>,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("raw_capacity", &self.raw.capacity())
            .field("image_capacity", &self.image.capacity())
            .finish_non_exhaustive()
    }
}

/// Where a [`Decoder`]'s time went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// Reading stored payloads from the source.
    pub read: f64,
    /// Decompressing.
    pub decompress: f64,
    /// Parsing cubins and PTX.
    pub parse: f64,
    /// Bytes decompressed.
    pub decompressed_bytes: u64,
}

impl std::ops::AddAssign for Timings {
    fn add_assign(&mut self, o: Timings) {
        self.read += o.read;
        self.decompress += o.decompress;
        self.parse += o.parse;
        self.decompressed_bytes += o.decompressed_bytes;
    }
}

impl Decoder {
    /// A decoder (buffers grow on first use).
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder that also records [`Timings`].
    pub fn timed() -> Self {
        Decoder {
            timings: Some(Timings::default()),
            ..Self::default()
        }
    }

    /// What a [`Decoder::timed`] decoder measured so far.
    pub fn timings(&self) -> Option<Timings> {
        self.timings
    }

    /// Bytes its buffers hold now (capacity).
    pub fn held_bytes(&self) -> usize {
        self.raw.capacity() + self.image.capacity()
    }

    /// Every kernel of entry `i` of `index`: reads its stored payload from `src`,
    /// decompresses it and parses it (as [`Entry::kernels`]).
    pub fn kernels<R: ReadAt + ?Sized>(
        &mut self,
        src: &R,
        index: &StreamIndex,
        i: usize,
    ) -> Result<Vec<KernelInfo>> {
        let (Some(entry), Some(&stored)) = (index.entries.get(i), index.payload_sizes.get(i))
        else {
            return Ok(Vec::new());
        };
        // A compressed entry needs its compressed bytes only (the rest is padding).
        let want = match entry.compression {
            Compression::Lz4 | Compression::Zstd if entry.compressed_size != 0 => {
                stored.min(entry.compressed_size.into())
            }
            _ => stored,
        };
        let start = std::time::Instant::now();
        let offset = entry.offset + u64::from(entry.header_size);
        let want = usize::try_from(want).map_err(|_| Error::Io {
            offset,
            len: want,
            reason: "larger than this machine's address space".into(),
        })?;
        let read = read_at(src, grown(&mut self.raw, want), offset);
        let t_read = start.elapsed().as_secs_f64();
        let result = read.and_then(|()| {
            let raw = self.raw.get(..want).unwrap_or_default();
            let with_payload = Entry {
                raw_payload: raw,
                identifier: None,
                ..entry.clone()
            };
            let zstd = match (&mut self.zstd, entry.compression) {
                (Some(z), _) => Some(z),
                (z @ None, Compression::Zstd) => {
                    *z = zstd::bulk::Decompressor::new().ok();
                    z.as_mut()
                }
                _ => None,
            };
            let n = decompress_into(&with_payload, &mut self.image, zstd)?;
            let t_decompress = start.elapsed().as_secs_f64();
            let payload: &[u8] = match entry.compression {
                Compression::None => raw,
                _ => self.image.get(..n).unwrap_or_default(),
            };
            let kernels = with_payload.kernels_of(payload);
            if let Some(t) = &mut self.timings {
                t.read += t_read;
                t.decompress += t_decompress - t_read;
                t.parse += start.elapsed().as_secs_f64() - t_decompress;
                t.decompressed_bytes += payload.len() as u64;
            }
            kernels
        });
        // Keep the buffers for the next entry unless one is exceptionally large.
        for buf in [&mut self.raw, &mut self.image] {
            if buf.capacity() > KEEP_BYTES {
                *buf = Vec::new();
            }
        }
        result
    }
}

/// What [`decode_in_order`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DecodeStats {
    /// Worker threads used (0: decoded on the calling thread).
    pub threads: usize,
    /// Entries decoded.
    pub entries: usize,
    /// The most entries decoded at once: each holds at most one decompressed image.
    pub peak_images: usize,
    /// The most results waiting for the caller at once.
    pub peak_waiting: usize,
    /// The most bytes the decoders' buffers held at once (their capacity, summed).
    pub peak_buffer_bytes: usize,
    /// Where the decoders' time went, summed over threads.
    pub timings: Timings,
}

/// Decodes the entries `indices` of `index` (read from `src`) and calls `sink` with each
/// one's result, in the order of `indices`, on the calling thread. `map` turns an entry's
/// kernels into what `sink` takes (formatting them, say); it runs on the worker that
/// decoded the entry, with that worker's `state`.
///
/// With `threads` ≤ 1 everything runs on the calling thread. Otherwise `threads` workers
/// decode ahead of `sink`, by at most `2 × threads` entries: at most `threads` images are
/// decompressed at once, whatever the input's size. `sink`'s first error stops the work
/// and is returned.
pub fn decode_in_order<R, S, T, E>(
    src: &R,
    index: &StreamIndex,
    indices: &[usize],
    threads: usize,
    map: impl Fn(&mut S, &Entry<'static>, Result<Vec<KernelInfo>>) -> T + Sync,
    mut sink: impl FnMut(T) -> std::result::Result<(), E>,
) -> std::result::Result<DecodeStats, E>
where
    R: ReadAt + ?Sized,
    S: Default,
    T: Send,
{
    let mut stats = DecodeStats::default();
    let placeholder = single(EntryKind::Other(0), 0, &[]).1;
    let entry = |i: usize| index.entries.get(i).unwrap_or(&placeholder);
    if threads <= 1 || indices.len() <= 1 {
        let mut decoder = Decoder::timed();
        let mut state = S::default();
        for &i in indices {
            let kernels = decoder.kernels(src, index, i);
            stats.peak_buffer_bytes = stats.peak_buffer_bytes.max(decoder.held_bytes());
            stats.entries += 1;
            stats.peak_images = 1;
            sink(map(&mut state, entry(i), kernels))?;
            stats.peak_waiting = stats.peak_waiting.max(1);
        }
        stats.timings = decoder.timings().unwrap_or_default();
        return Ok(stats);
    }

    struct Shared<T> {
        /// Position in `indices` of the next entry to claim.
        next: usize,
        /// Position of the first result `sink` has not taken.
        taken: usize,
        /// Results from `taken` on (`None`: not decoded yet).
        ready: VecDeque<Option<T>>,
        decoding: usize,
        buffer_bytes: Vec<usize>,
        stop: bool,
        stats: DecodeStats,
    }
    let window = 2 * threads;
    let shared = Mutex::new(Shared {
        next: 0,
        taken: 0,
        ready: VecDeque::with_capacity(window),
        decoding: 0,
        buffer_bytes: vec![0; threads],
        stop: false,
        stats: DecodeStats {
            threads,
            ..DecodeStats::default()
        },
    });
    let changed = Condvar::new();
    let lock = || shared.lock().unwrap_or_else(|e| e.into_inner());
    let wait = |g| changed.wait(g).unwrap_or_else(|e| e.into_inner());

    let result = std::thread::scope(|scope| {
        for worker in 0..threads {
            let (map, lock, wait, changed) = (&map, &lock, &wait, &changed);
            scope.spawn(move || {
                // Should `map` panic, the caller stops waiting (the scope re-raises it).
                struct StopOnPanic<'s>(&'s dyn Fn());
                impl Drop for StopOnPanic<'_> {
                    fn drop(&mut self) {
                        if std::thread::panicking() {
                            (self.0)();
                        }
                    }
                }
                let stop = || {
                    lock().stop = true;
                    changed.notify_all();
                };
                let _guard = StopOnPanic(&stop);
                let mut decoder = Decoder::timed();
                let mut state = S::default();
                loop {
                    let pos = {
                        let mut g = lock();
                        while !g.stop && g.next < indices.len() && g.next >= g.taken + window {
                            g = wait(g);
                        }
                        if g.stop || g.next >= indices.len() {
                            break;
                        }
                        let pos = g.next;
                        g.next += 1;
                        g.ready.push_back(None);
                        g.decoding += 1;
                        g.stats.peak_images = g.stats.peak_images.max(g.decoding);
                        pos
                    };
                    let i = indices[pos];
                    let kernels = decoder.kernels(src, index, i);
                    let held = decoder.held_bytes();
                    let out = map(&mut state, entry(i), kernels);
                    let mut g = lock();
                    g.decoding -= 1;
                    g.buffer_bytes[worker] = held;
                    let bytes: usize = g.buffer_bytes.iter().sum();
                    g.stats.peak_buffer_bytes = g.stats.peak_buffer_bytes.max(bytes);
                    let waiting = g.ready.iter().filter(|r| r.is_some()).count() + 1;
                    g.stats.peak_waiting = g.stats.peak_waiting.max(waiting);
                    let taken = g.taken;
                    if let Some(slot) = g.ready.get_mut(pos - taken) {
                        *slot = Some(out);
                    }
                    changed.notify_all();
                }
                let mut g = lock();
                g.stats.timings += decoder.timings().unwrap_or_default();
            });
        }
        // The caller's side: take the results in order.
        for _ in 0..indices.len() {
            let out = {
                let mut g = lock();
                loop {
                    if let Some(Some(_)) = g.ready.front() {
                        break;
                    }
                    if g.stop {
                        return Ok(());
                    }
                    g = wait(g);
                }
                let out = g.ready.pop_front().flatten();
                g.taken += 1;
                g.stats.entries += 1;
                changed.notify_all();
                out
            };
            if let Some(out) = out {
                if let Err(e) = sink(out) {
                    lock().stop = true;
                    changed.notify_all();
                    return Err(e);
                }
            }
        }
        Ok(())
    });
    let stats = lock().stats;
    result.map(|()| stats)
}

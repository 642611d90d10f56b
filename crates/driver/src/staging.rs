//! [`PinnedStaging`]: the [`vmm::Staging`] that pause and resume copy through, at close to
//! the PCIe limit.
//!
//! A pageable copy (`cuMemcpyDtoH` into a `Vec<u8>`) goes through the driver's own small
//! staging buffer one piece at a time: 3.3 GiB/s device to host on an H100, where a copy
//! into page-locked memory runs at 48 GiB/s. Pinning the destination at pause time costs
//! more than the copy itself. So this staging keeps a small pool of page-locked (pinned)
//! buffers, and for each batch of ranges:
//!
//! - **save** (device → host): the calling thread issues asynchronous copies into the
//!   buffers, round-robin over several streams, and records an event per buffer; host
//!   threads take the buffers in order, prefault the destination pages while the copy is
//!   still on the wire, wait for the event and copy the bytes into the pageable
//!   destination (`Vec<u8>`, the [`HostCopy::Memory`] the VMM keeps). A buffer is refilled
//!   as soon as its bytes are out, so the DMA engines and the host copies overlap. Once
//!   every batch is issued, the calling thread copies out too.
//! - **load** (host → device): host threads, the calling thread among them, take the
//!   batches in order, wait until their buffer's previous copy has left it, copy the bytes
//!   in and issue the asynchronous copy.
//!
//! The batches are graded (`Plan::new`): small first, growing by a quarter up to a
//! buffer, shrinking at the end, so that the device and the host threads start sooner.
//!
//! Destinations of 2 MiB or more are advised for transparent huge pages
//! (`madvise(MADV_HUGEPAGE)`): one fault per 2 MiB instead of 512, and a cheaper free
//! (8 GiB: 0.02 s instead of 0.47 s). The bytes go into them with streaming stores.
//!
//! Measured on an H100 host (16 cores, Linux 6.18; `staging_bench`): writing into fresh
//! pageable memory is what limits a save: 16 threads fault in and fill fresh huge pages at
//! 29 GiB/s with no GPU involved (60 GiB/s into memory already faulted in), and a save runs
//! at 28-31 GiB/s against 51 GiB/s for a copy into pinned memory; a load runs at
//! 43-44 GiB/s. Defaults chosen there: 2 streams, 4 MiB buffers, streaming stores.
//!
//! Ranges of any size are packed into the buffers: a small one shares a buffer with its
//! neighbours, a large one spans several. Every call waits for all its copies before it
//! returns, on success and on failure, so the pool is idle between calls and a failure
//! loses nothing: the VMM keeps the device memory mapped until `save` has returned `Ok`,
//! and keeps its host copies until `load` has.
//!
//! The pool is made on first use for each context (device) and kept: pinning memory is
//! slow (its cost is part of the first pause). If it cannot be made (page-locked memory
//! refused), the staging falls back to [`vmm::HostStaging`]'s synchronous copies and says
//! so in [`PinnedStaging::take_notes`].
//!
//! **Kept host copies** (`CUDAW_HOST_REUSE`, on by default): the host copies a load has
//! copied back are given to [`vmm::Staging::recycle`]; their pages are given back lazily
//! (`MADV_FREE`) and the next save writes into them (by size: a copy of capacity `len` to
//! `len` + 1/8), at the speed of memory already faulted in where the kernel has not taken
//! them back meanwhile. [`PinnedStaging::drop_warm`] frees what a pause did not reuse.
//!
//! **Host arena** (opt-in, `CUDAW_HOST_ARENA=pinned`): to get past the fault limit of fresh
//! pageable memory, [`PinnedStaging::start_arena`] makes (on a background thread, the same
//! way as the pool: mmap, huge pages, faulted in on many threads, `cuMemHostRegister`) a
//! page-locked arena as large as the device memory; whole-process pauses
//! ([`PinnedStaging::save_retaining`], [`Retaining`]) then copy device memory straight into
//! it in large asynchronous copies over the pool's streams, with no host-side copy, and
//! return [`HostCopy::Retained`]; loads of [`Source::Retained`] copy straight out of it.
//! Readers borrow the bytes with [`PinnedStaging::retained`]; [`PinnedStaging::forget`] /
//! [`PinnedStaging::forget_all`] release places ([`PinnedStaging::forget_all_but`] keeps
//! the places of bytes still needed, which the next pause then places its bytes after).
//! The arena is keyed by [`vmm::AllocationId`]: whoever saves into it (the VMM's
//! allocations, the engine's driver-level handles) keeps its ids apart from the others'.
//! Single evictions (the `Staging::save` of the trait) always take the ordinary path.
//!
//! **A program's copies with pageable host memory** ([`PinnedStaging::copy_pageable`]; the
//! decisions are the engine's `pageable` module's): one copy through the same pool and
//! pipeline, ordered after the program's stream by an event the pool's streams wait for;
//! to the device asynchronously, it returns once every byte is in a buffer and makes the
//! program's stream wait for the pool's last copies (the next user of a buffer waits for
//! its event first, so buffers still on the wire are never overwritten). A copy of one
//! batch (128 KiB or less) runs on the calling thread alone; a larger one, even of less
//! than a buffer, is spread over the threads.
//!
//! **Host threads**: each pool starts its copy threads once, when it is made (never at
//! library load), and keeps them until it is freed, which ends and joins them; each copy
//! hands its work to them (a [`rayon_core`] scope, so the work borrows the copy's plan),
//! instead of starting threads per copy (hundreds of microseconds for 16 threads). Where
//! they cannot be started (a pids limit), in a child of fork (which has none of them) or
//! when the caller is itself a worker of a rayon pool, the copy runs on the calling thread.
//!
//! Configuration ([`StagingConfig`]): `CUDAW_STAGING_STREAMS` (default 2),
//! `CUDAW_STAGING_BUFFER` (bytes per buffer, default 4M), `CUDAW_STAGING_THREADS` (host
//! copy threads, default the CPUs available, at most 16), `CUDAW_STAGED_COPY_MIN` (the
//! smallest program copy staged, default 1M, or `off`).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use vmm::{HostCopy, HostStaging, LoadRange, Source, Staging, StagingError, StagingRange};

use crate::api::{
    Context, Driver, Event, Stream, EVENT_DISABLE_TIMING, MEMHOSTALLOC_PORTABLE,
    STREAM_NON_BLOCKING,
};
use crate::backend::DriverBackend;
use crate::error::DriverError;

/// The variable that sets how many streams copy at once.
pub const STREAMS_ENV: &str = "CUDAW_STAGING_STREAMS";
/// The variable that sets the size of one pinned buffer (`8M`, `4194304`).
pub const BUFFER_ENV: &str = "CUDAW_STAGING_BUFFER";
/// The variable that sets how many host threads copy between the buffers and host memory.
pub const THREADS_ENV: &str = "CUDAW_STAGING_THREADS";
/// The variable that has the host threads copy into the pinned buffers with streaming
/// (non-temporal) stores for resumes and other loads: `on` (or `off`, the default). Copies
/// of a program's pageable memory to the device, and copies out of the buffers, always
/// stream.
pub const STREAMING_IN_ENV: &str = "CUDAW_STAGING_STREAMING_IN";

/// The variable that turns the host arena on: `pinned` (or `off`, the default).
pub const ARENA_ENV: &str = "CUDAW_HOST_ARENA";
/// `on`: every staged copy prints where its time went ([`StagingConfig::profile`]).
pub const PROFILE_ENV: &str = "CUDAW_STAGING_PROFILE";
/// The variable that turns off the reuse of host copies between pauses: `off` (or `on`,
/// the default).
pub const REUSE_ENV: &str = "CUDAW_HOST_REUSE";
/// The variable that sets the smallest copy between device memory and a program's
/// pageable host memory that goes through the pinned staging (`1M`, `262144`), or turns
/// that off (`off`): [`StagingConfig::copy_min`].
pub const COPY_MIN_ENV: &str = "CUDAW_STAGED_COPY_MIN";
/// [`COPY_MIN_ENV`]'s default: 1 MiB. Below it the driver's own pageable path is as fast
/// or faster: a staged copy pays a fixed few tens of microseconds (the pointer query, the
/// events that order it with the program's stream, a host thread's hand-off) where the
/// driver moves 1 MiB in about 125 µs host to device (8.3 GB/s pageable, H100) and 320 µs
/// device to host (3.3 GB/s); the crossover is to be measured on the GPU (gpu-check's
/// `transfers`).
pub const DEFAULT_COPY_MIN: usize = 1 << 20;
/// Where each allocation's bytes start in the host arena: a multiple of this. Size an
/// arena for a set of allocations as the sum of their sizes rounded up to it.
pub const ARENA_ALIGN: u64 = 4096;
/// The largest single copy issued into or out of the arena (spread over the streams).
const ARENA_PIECE: usize = 64 << 20;

/// The most streams, buffers or threads accepted.
const MAX_COUNT: usize = 256;
/// The smallest and largest buffer accepted.
const MIN_BUFFER: usize = 4 << 10;
const MAX_BUFFER: usize = 1 << 30;
/// Host pages, and transparent huge pages.
const PAGE: usize = 4 << 10;
const HUGE_PAGE: usize = 2 << 20;

/// How [`PinnedStaging`] copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagingConfig {
    /// Streams the copies are spread over (`CUDAW_STAGING_STREAMS`).
    pub streams: usize,
    /// Bytes in one pinned buffer (`CUDAW_STAGING_BUFFER`), a multiple of 4 KiB.
    pub buffer_bytes: usize,
    /// Pinned buffers in the pool; the pool holds `buffers * buffer_bytes` bytes.
    pub buffers: usize,
    /// Host threads copying between the pinned buffers and host memory
    /// (`CUDAW_STAGING_THREADS`).
    pub threads: usize,
    /// Advise destinations of at least 2 MiB for transparent huge pages.
    pub huge_pages: bool,
    /// Fault the destination pages in while the device copy is on the wire.
    pub prefault: bool,
    /// Copy into the destination with streaming (non-temporal) stores.
    pub streaming_stores: bool,
    /// Copy into the pinned buffers with streaming stores for resumes and other loads
    /// (`CUDAW_STAGING_STREAMING_IN`): the host's memory traffic is a third lower (no read
    /// of the buffer's lines before they are written), but the device then reads the bytes
    /// from memory instead of the cache. Off until measured faster for resumes; copies of
    /// a program's pageable memory to the device always stream (measured faster).
    pub streaming_in: bool,
    /// Make the pool from ordinary memory (huge pages, faulted in on all threads) pinned in
    /// place with `cuMemHostRegister`, rather than with `cuMemHostAlloc`: several times
    /// faster to make. Falls back to `cuMemHostAlloc` if registering fails.
    pub pin_in_place: bool,
    /// Keep a page-locked host arena as large as the device memory
    /// (`CUDAW_HOST_ARENA=pinned`; made by [`PinnedStaging::start_arena`], which the
    /// runtime shim calls while the program runs, once its memory holds still, and after
    /// a resume): whole-process pauses then copy straight into it
    /// ([`PinnedStaging::save_retaining`]) and resumes straight out of it.
    pub host_arena: bool,
    /// Keep the host copies a resume has loaded (their memory given back lazily,
    /// `MADV_FREE`) and save the next pause's bytes into them (`CUDAW_HOST_REUSE`, default
    /// on): memory already faulted in takes the bytes about twice as fast as fresh pages.
    pub reuse_host: bool,
    /// The smallest copy between device memory and a program's pageable host memory that
    /// goes through the pool ([`PinnedStaging::copy_pageable`]; `CUDAW_STAGED_COPY_MIN`,
    /// default [`DEFAULT_COPY_MIN`]); `None` (`off`): every such copy takes the driver's
    /// own path.
    pub copy_min: Option<usize>,
    /// Print, for every copy through the pool, where its time went: the parties' start,
    /// their waits for a buffer and for the device, their host copying and issuing
    /// (`CUDAW_STAGING_PROFILE=on`, a diagnostic; one line on stderr a copy).
    pub profile: bool,
}

impl Default for StagingConfig {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
        StagingConfig::new(2, 4 << 20, cpus.min(16))
    }
}

impl StagingConfig {
    /// `streams` streams, buffers of `buffer_bytes` (rounded up to 4 KiB; clamped to
    /// 4 KiB ..= 1 GiB), `threads` host threads, and enough buffers for every thread to
    /// hold one while each stream has two copies in flight.
    pub fn new(streams: usize, buffer_bytes: usize, threads: usize) -> Self {
        let streams = streams.clamp(1, MAX_COUNT);
        let threads = threads.clamp(1, MAX_COUNT);
        StagingConfig {
            streams,
            buffer_bytes: buffer_bytes
                .clamp(MIN_BUFFER, MAX_BUFFER)
                .next_multiple_of(PAGE),
            buffers: (threads + 2 * streams).min(MAX_COUNT),
            threads,
            huge_pages: true,
            prefault: true,
            streaming_stores: true,
            streaming_in: false,
            pin_in_place: true,
            host_arena: false,
            reuse_host: true,
            copy_min: Some(DEFAULT_COPY_MIN),
            profile: false,
        }
    }

    /// Reads [`STREAMS_ENV`], [`BUFFER_ENV`] and [`THREADS_ENV`] through `get` (the
    /// environment, or a test's map); a bad value keeps the default and adds a warning.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>, warnings: &mut Vec<String>) -> Self {
        let d = StagingConfig::default();
        let mut count = |key: &str, default: usize| -> usize {
            match get(key).filter(|v| !v.trim().is_empty()) {
                None => default,
                Some(v) => match v.trim().parse::<usize>() {
                    Ok(n) if (1..=MAX_COUNT).contains(&n) => n,
                    _ => {
                        warnings.push(format!(
                            "{key}={v:?} is not a count from 1 to {MAX_COUNT}; using {default}"
                        ));
                        default
                    }
                },
            }
        };
        let streams = count(STREAMS_ENV, d.streams);
        let threads = count(THREADS_ENV, d.threads);
        let buffer = match get(BUFFER_ENV).filter(|v| !v.trim().is_empty()) {
            None => d.buffer_bytes,
            Some(v) => match vmm::parse_size(&v).and_then(|n| usize::try_from(n).ok()) {
                Some(n) if (MIN_BUFFER..=MAX_BUFFER).contains(&n) => n,
                _ => {
                    warnings.push(format!(
                        "{BUFFER_ENV}={v:?} is not a size from 4K to 1G (like 8M); using {}M",
                        d.buffer_bytes >> 20
                    ));
                    d.buffer_bytes
                }
            },
        };
        // A switch: `on` (its own word for on), `off`; empty is the default; anything else
        // keeps the default and warns.
        let mut switch = |key: &str, on: &str, default: bool| {
            let v = get(key)?.trim().to_ascii_lowercase();
            match v.as_str() {
                "" => None,
                "off" => Some(false),
                w if w == on => Some(true),
                _ => {
                    let word = if default { on } else { "off" };
                    warnings.push(format!(
                        "{key}={v:?} is neither `{on}` nor `off`; using {word}"
                    ));
                    None
                }
            }
        };
        let host_arena = switch(ARENA_ENV, "pinned", d.host_arena).unwrap_or(d.host_arena);
        let reuse_host = switch(REUSE_ENV, "on", d.reuse_host).unwrap_or(d.reuse_host);
        let streaming_in = switch(STREAMING_IN_ENV, "on", d.streaming_in).unwrap_or(d.streaming_in);
        let profile = switch(PROFILE_ENV, "on", d.profile).unwrap_or(d.profile);
        let copy_min = match get(COPY_MIN_ENV).map(|v| v.trim().to_owned()) {
            None => d.copy_min,
            Some(v) if v.is_empty() => d.copy_min,
            Some(v) if v.eq_ignore_ascii_case("off") => None,
            Some(v) => match vmm::parse_size(&v).and_then(|n| usize::try_from(n).ok()) {
                Some(n) => Some(n.max(1)),
                None => {
                    warnings.push(format!(
                        "{COPY_MIN_ENV}={v:?} is neither a size (like 1M or 262144) nor `off`; using {}K",
                        DEFAULT_COPY_MIN >> 10
                    ));
                    d.copy_min
                }
            },
        };
        StagingConfig {
            host_arena,
            reuse_host,
            streaming_in,
            copy_min,
            profile,
            ..StagingConfig::new(streams, buffer, threads)
        }
    }

    /// Page-locked host memory the pool holds.
    pub fn pinned_bytes(&self) -> usize {
        self.buffers * self.buffer_bytes
    }
}

/// The staging pause and resume use: pinned buffers on several streams, host copies on
/// several threads (see the module documentation). One pool per context, made on first
/// use and kept until [`PinnedStaging::release`] or drop.
pub struct PinnedStaging {
    config: StagingConfig,
    pools: HashMap<usize, Pool>,
    /// Host arenas, per context (only with [`StagingConfig::host_arena`]).
    arenas: HashMap<usize, Arena>,
    /// Arenas being made on a background thread, per context.
    building: HashMap<usize, Building>,
    /// Contexts where making an arena failed (not tried again).
    arena_refused: std::collections::HashSet<usize>,
    /// Host copies given back after a resume, for the next pause's bytes.
    warm: WarmPool,
    /// Bytes of kept host memory that saves reused, since [`PinnedStaging::take_reused`].
    reused: usize,
    notes: Vec<String>,
}

impl std::fmt::Debug for PinnedStaging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedStaging")
            .field("config", &self.config)
            .field("pools", &self.pools.len())
            .finish_non_exhaustive()
    }
}

impl PinnedStaging {
    /// A staging with this configuration; nothing is allocated until first use.
    pub fn new(config: StagingConfig) -> Self {
        PinnedStaging {
            config,
            pools: HashMap::new(),
            arenas: HashMap::new(),
            building: HashMap::new(),
            arena_refused: std::collections::HashSet::new(),
            warm: WarmPool::default(),
            reused: 0,
            notes: Vec::new(),
        }
    }

    /// Bytes of kept host memory (capacity) that saves wrote into since the last call.
    pub fn take_reused(&mut self) -> usize {
        std::mem::take(&mut self.reused)
    }

    /// Bytes of host memory kept for the next pause ([`StagingConfig::reuse_host`]).
    pub fn warm_bytes(&self) -> usize {
        self.warm.bytes
    }

    /// Frees the kept host copies a pause did not reuse (its allocations changed since).
    pub fn drop_warm(&mut self) {
        self.warm = WarmPool::default();
    }

    /// Its configuration.
    pub fn config(&self) -> &StagingConfig {
        &self.config
    }

    /// Makes the pool for `backend`'s context now, if it is not there yet (otherwise the
    /// first save or load makes it).
    pub fn prepare(&mut self, backend: &DriverBackend) -> Result<(), DriverError> {
        self.pool(backend).map(drop)
    }

    /// Whether a pool for `backend`'s context exists.
    pub fn is_prepared(&self, backend: &DriverBackend) -> bool {
        self.pools.contains_key(&backend.context().0)
    }

    /// Frees every pool and host arena (waiting for arenas being made; no copy is in
    /// flight between calls). Bytes the arenas retained are lost.
    pub fn release(&mut self) -> Result<(), DriverError> {
        let mut first = None;
        self.finish_all_builds();
        for (_, mut arena) in self.arenas.drain() {
            if let Err(e) = arena.free() {
                first.get_or_insert(e);
            }
        }
        for (_, pool) in self.pools.drain() {
            if let Err(e) = pool.free() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// What happened that the caller may want to log (a fallback to synchronous copies),
    /// since the last call.
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    fn pool(&mut self, backend: &DriverBackend) -> Result<&Pool, DriverError> {
        let key = backend.context().0;
        if !self.pools.contains_key(&key) {
            let pool = Pool::new(backend.driver().clone(), backend.context(), &self.config)?;
            if pool.workers.is_none() {
                self.notes.push(
                    "no staging thread could be started: staged copies run on the calling thread"
                        .to_owned(),
                );
            }
            self.pools.insert(key, pool);
        }
        Ok(&self.pools[&key])
    }

    /// The pool, or `None` after noting why synchronous copies are used instead.
    fn pool_or_note(&mut self, backend: &DriverBackend) -> Option<&Pool> {
        let key = backend.context().0;
        match self.pool(backend) {
            Ok(_) => self.pools.get(&key),
            Err(e) => {
                self.notes.push(format!(
                    "no pinned staging pool ({} x {} bytes): {e}; copying synchronously through pageable memory",
                    self.config.buffers, self.config.buffer_bytes
                ));
                None
            }
        }
    }

    /// Drops a pool whose streams failed to synchronise: the next call makes a new one.
    fn discard_if_broken(&mut self, backend: &DriverBackend, broken: bool) {
        if broken {
            if let Some(pool) = self.pools.remove(&backend.context().0) {
                drop(pool.free());
            }
        }
    }
}

impl Drop for PinnedStaging {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            eprintln!("cudaw: freeing the pinned staging pool: {e}");
        }
    }
}

impl Staging<DriverBackend> for PinnedStaging {
    fn save(
        &mut self,
        backend: &DriverBackend,
        ranges: &[StagingRange],
    ) -> Result<Vec<HostCopy>, StagingError> {
        if ranges.is_empty() {
            return Ok(Vec::new());
        }
        let config = self.config;
        let mut warm = std::mem::take(&mut self.warm);
        let kept = warm.bytes;
        let (result, broken) = match self.pool_or_note(backend) {
            Some(pool) => pool.save(&config, ranges, &mut warm),
            None => {
                self.warm = warm;
                return HostStaging.save(backend, ranges);
            }
        };
        self.reused += kept - warm.bytes;
        self.warm = warm;
        self.discard_if_broken(backend, broken);
        result
    }

    fn recycle(&mut self, copies: Vec<Vec<u8>>) {
        if self.config.reuse_host {
            for v in copies {
                self.warm.put(v);
            }
        }
    }

    fn load(
        &mut self,
        backend: &DriverBackend,
        ranges: &[LoadRange<'_>],
    ) -> Result<(), StagingError> {
        // Refuse what cannot be loaded before copying anything.
        let key = backend.context().0;
        let mut sources = Vec::with_capacity(ranges.len());
        let mut memory = Vec::with_capacity(ranges.len());
        let mut retained: Vec<(usize, usize, u64)> = Vec::new();
        for r in ranges {
            match r.source {
                Source::Memory(bytes) if bytes.len() as u64 == r.len => {
                    sources.push(bytes);
                    memory.push(*r);
                }
                Source::Memory(bytes) => {
                    return Err(StagingError::Io(format!(
                        "host copy of allocation {:?} holds {} bytes, expected {}",
                        r.id,
                        bytes.len(),
                        r.len
                    )))
                }
                Source::Retained => {
                    let place = self.arenas.get(&key).and_then(|a| a.entries.get(&r.id));
                    match place {
                        Some(&(at, len)) if len as u64 == r.len => retained.push((at, len, r.addr)),
                        Some(&(_, len)) => {
                            return Err(StagingError::Io(format!(
                                "the host arena holds {len} bytes of allocation {:?}, expected {}",
                                r.id, r.len
                            )))
                        }
                        None => {
                            return Err(StagingError::Io(format!(
                                "allocation {:?} is not in the host arena",
                                r.id
                            )))
                        }
                    }
                }
                other => {
                    return Err(StagingError::Unsupported {
                        id: r.id,
                        source_kind: other.kind(),
                    })
                }
            }
        }
        if ranges.is_empty() {
            return Ok(());
        }
        if !retained.is_empty() {
            self.load_from_arena(backend, &retained)?;
        }
        if memory.is_empty() {
            return Ok(());
        }
        let config = self.config;
        let (result, broken) = match self.pool_or_note(backend) {
            Some(pool) => pool.load(&config, &memory, &sources),
            None => return HostStaging.load(backend, &memory),
        };
        self.discard_if_broken(backend, broken);
        result
    }
}

// ---- a program's copies between device memory and pageable host memory ----

/// A program's copy between device memory and its pageable host memory
/// ([`PinnedStaging::copy_pageable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageableCopy {
    /// `len` bytes from host memory at `src` to the device address `dst`.
    ToDevice {
        /// The device address (the backing address in translated addressing).
        dst: u64,
        /// The program's host memory.
        src: *const u8,
        /// Bytes.
        len: usize,
    },
    /// `len` bytes from the device address `src` to host memory at `dst`.
    ToHost {
        /// The program's host memory.
        dst: *mut u8,
        /// The device address.
        src: u64,
        /// Bytes.
        len: usize,
    },
}

impl PageableCopy {
    /// Its bytes.
    pub fn len(&self) -> usize {
        match *self {
            PageableCopy::ToDevice { len, .. } | PageableCopy::ToHost { len, .. } => len,
        }
    }

    /// Whether it copies nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// When [`PinnedStaging::copy_pageable`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// Once the copy is done (`cudaMemcpy`, and every copy to pageable host memory).
    Done,
    /// Once the source's bytes are all in pinned buffers (`cudaMemcpyAsync` from pageable
    /// memory): the rest goes on asynchronously, and the program's stream waits for it.
    Staged,
}

/// Why [`PinnedStaging::copy_pageable`] did not copy.
#[derive(Debug)]
pub enum PageableCopyError {
    /// No pool could be made (page-locked memory refused): nothing was done.
    NoPool(DriverError),
    /// The copy could not be ordered after the program's stream (a stream of another
    /// context, a broken context): nothing was done.
    NotStarted(DriverError),
    /// A copy failed once under way; everything it issued has been waited for, so no
    /// copy of cudaw's reaches the destination after the call.
    Failed(StagingError),
}

impl std::fmt::Display for PageableCopyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PageableCopyError::NoPool(e) => write!(f, "no pinned staging pool: {e}"),
            PageableCopyError::NotStarted(e) => {
                write!(f, "cannot order the copy after the program's stream: {e}")
            }
            PageableCopyError::Failed(e) => write!(f, "the staged copy failed: {e}"),
        }
    }
}

impl PinnedStaging {
    /// Copies between device memory of `backend`'s context and a program's pageable host
    /// memory through the pool: after the work the program queued on `stream` before (an
    /// event recorded there, which the pool's streams wait for), host copies on several
    /// threads overlapped with the device copies on the pool's streams. With
    /// [`Completion::Staged`] (a copy to the device only) it returns once every byte is in
    /// a pinned buffer, the program's stream made to wait for the last device copies;
    /// otherwise once the copy is done. The calling thread's current context is the same
    /// afterwards.
    ///
    /// `stream` is a stream of `backend`'s context, or [`Stream::LEGACY`] /
    /// [`Stream::PER_THREAD`] with that context current; a stream being captured into a
    /// graph must not be given (the event would become a node of the graph).
    ///
    /// # Safety
    /// The host range is valid for the call: readable (to the device), or writable and
    /// neither read nor written by anyone else until the call returns (to the host). The
    /// device range lies inside memory of `backend`'s context.
    pub unsafe fn copy_pageable(
        &mut self,
        backend: &DriverBackend,
        copy: PageableCopy,
        stream: Stream,
        completion: Completion,
    ) -> Result<(), PageableCopyError> {
        if copy.is_empty() {
            return Ok(());
        }
        let driver = backend.driver().clone();
        let previous = driver
            .ctx_get_current()
            .map_err(PageableCopyError::NotStarted)?;
        let config = self.config;
        let result = match self.pool(backend) {
            Err(e) => Err((PageableCopyError::NoPool(e), false)),
            // SAFETY: forwarded from the caller.
            Ok(pool) => unsafe { pool.copy_pageable(&config, copy, stream, completion) },
        };
        let restored = driver.ctx_set_current(previous);
        match result {
            Ok(()) => restored.map_err(|e| PageableCopyError::Failed(staging_error(e))),
            Err((e, broken)) => {
                self.discard_if_broken(backend, broken);
                Err(e)
            }
        }
    }
}

// ---- the host arena ----

/// What a background arena build reports when it is done: how long it took, or why it
/// failed.
pub type ArenaDone = Box<dyn FnOnce(Result<std::time::Duration, String>) + Send>;

/// What [`PinnedStaging::arena_status`] reports for one context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArenaStatus {
    /// Bytes of the arena ready to use (0: none).
    pub bytes: usize,
    /// Bytes of an arena being made in the background (0: none).
    pub building: usize,
    /// Allocations whose bytes the arena holds now.
    pub retained: usize,
}

/// [`PinnedStaging`] for a whole-process pause: `save` is
/// [`PinnedStaging::save_retaining`] (bytes stay in the host arena, where there is one),
/// `load` is [`PinnedStaging`]'s.
#[derive(Debug)]
pub struct Retaining<'a>(pub &'a mut PinnedStaging);

impl Staging<DriverBackend> for Retaining<'_> {
    fn save(
        &mut self,
        backend: &DriverBackend,
        ranges: &[StagingRange],
    ) -> Result<Vec<HostCopy>, StagingError> {
        self.0.save_retaining(backend, ranges)
    }

    fn load(
        &mut self,
        backend: &DriverBackend,
        ranges: &[LoadRange<'_>],
    ) -> Result<(), StagingError> {
        self.0.load(backend, ranges)
    }
}

/// Page-locked host memory as large as a context's device memory, made once and kept:
/// whole-process pauses copy device memory straight into it (no host-side copy), resumes
/// straight out of it. Each allocation's bytes have a place, by allocation id.
struct Arena {
    driver: Arc<dyn Driver>,
    /// An `mmap` of `len` bytes registered with the driver (null once freed).
    host: *mut u8,
    len: usize,
    /// Allocation → (offset, bytes) of what the arena holds.
    entries: HashMap<vmm::AllocationId, (usize, usize)>,
    /// Where the next allocation goes (while `entries` is not empty).
    cursor: usize,
}

// SAFETY: `host` is page-locked memory owned by the arena alone; it is written only by
// the device copies of one staging call at a time (the staging is `&mut` for the call) and
// read by borrowers of `&PinnedStaging`, never both at once.
unsafe impl Send for Arena {}
// SAFETY: as for `Send`.
unsafe impl Sync for Arena {}

impl Arena {
    fn free(&mut self) -> Result<(), DriverError> {
        if self.host.is_null() {
            return Ok(());
        }
        // SAFETY: `host` was registered by `pin_in_place`; every staging call waits for its
        // copies, so nothing uses it.
        let r = unsafe { self.driver.mem_host_unregister(self.host) };
        // SAFETY: our own mapping of `len` bytes, used by nothing any more.
        unsafe { libc::munmap(self.host.cast(), self.len) };
        self.host = std::ptr::null_mut();
        self.entries.clear();
        r
    }

    /// The bytes at `[at, at + len)`, inside the arena.
    fn bytes(&self, at: usize, len: usize) -> &[u8] {
        assert!(at.checked_add(len).is_some_and(|end| end <= self.len));
        // SAFETY: inside the live mapping (checked above); no copy writes it while `&self`
        // is borrowed (writers hold the staging mutably).
        unsafe { std::slice::from_raw_parts(self.host.add(at), len) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        if let Err(e) = self.free() {
            eprintln!("cudaw: freeing the host arena: {e}");
        }
    }
}

/// An arena being made on a background thread: the thread returns the registered mapping.
struct Building {
    handle: std::thread::JoinHandle<Option<usize>>,
    len: usize,
    driver: Arc<dyn Driver>,
}

impl PinnedStaging {
    /// Starts making a host arena of `bytes` (rounded up to 2 MiB) for `backend`'s context
    /// on a background thread (an anonymous mapping advised for huge pages, faulted in on
    /// the configured threads, registered with `cuMemHostRegister`), if the configuration
    /// asks for one ([`StagingConfig::host_arena`]) and there is no arena of that size yet.
    /// A smaller arena holding no bytes is freed first; one holding bytes is kept. `done`
    /// is called on that thread when the arena is made or has failed. Returns whether a
    /// build started.
    pub fn start_arena(&mut self, backend: &DriverBackend, bytes: u64, done: ArenaDone) -> bool {
        let key = backend.context().0;
        if !self.config.host_arena || bytes == 0 || self.arena_refused.contains(&key) {
            return false;
        }
        self.install_finished_arenas();
        let Some(len) = usize::try_from(bytes)
            .ok()
            .and_then(|b| b.checked_next_multiple_of(HUGE_PAGE))
        else {
            return false;
        };
        if self.building.get(&key).is_some_and(|b| b.len >= len) {
            return false;
        }
        self.finish_build(key);
        if let Some(a) = self.arenas.get(&key) {
            if a.len >= len || !a.entries.is_empty() {
                return false;
            }
        }
        if let Some(mut old) = self.arenas.remove(&key) {
            if let Err(e) = old.free() {
                self.notes
                    .push(format!("freeing the smaller host arena: {e}"));
            }
        }
        let driver = backend.driver().clone();
        let keep = driver.clone();
        let context = backend.context();
        let threads = self.config.threads;
        let spawned = std::thread::Builder::new()
            .name("cudaw-arena".into())
            .spawn(move || {
                let started = std::time::Instant::now();
                let made = match driver.ctx_set_current(context) {
                    Err(e) => Err(format!("{e}")),
                    Ok(()) => pin_in_place(&*driver, len, threads).ok_or_else(|| {
                        format!(
                            "{len} bytes of page-locked memory refused (mmap or cuMemHostRegister)"
                        )
                    }),
                };
                let r = made.as_ref().ok().map(|&p| p as usize);
                done(made.map(|_| started.elapsed()));
                r
            });
        match spawned {
            Ok(handle) => {
                self.building.insert(
                    key,
                    Building {
                        handle,
                        len,
                        driver: keep,
                    },
                );
                true
            }
            Err(e) => {
                self.notes
                    .push(format!("cannot start making the host arena: {e}"));
                false
            }
        }
    }

    /// Installs the arenas whose making has finished, without waiting for one in progress.
    pub fn install_finished_arenas(&mut self) {
        let done: Vec<usize> = self
            .building
            .iter()
            .filter(|(_, b)| b.handle.is_finished())
            .map(|(&k, _)| k)
            .collect();
        for k in done {
            self.finish_build(k);
        }
    }

    /// Waits for every arena being made and installs it: no thread of ours is inside the
    /// driver (making page-locked memory) when this returns.
    pub fn finish_all_builds(&mut self) {
        let keys: Vec<usize> = self.building.keys().copied().collect();
        for key in keys {
            self.finish_build(key);
        }
    }

    /// Bytes of the host arenas made, and of those being made.
    pub fn arena_bytes(&self) -> (usize, usize) {
        (
            self.arenas.values().map(|a| a.len).sum(),
            self.building.values().map(|b| b.len).sum(),
        )
    }

    /// Waits for the arena being made for `backend`'s context, if any, and installs it.
    pub fn wait_for_arena(&mut self, backend: &DriverBackend) {
        self.finish_build(backend.context().0);
    }

    /// The host arena of `backend`'s context: its size, a build in progress, what it holds.
    pub fn arena_status(&self, backend: &DriverBackend) -> ArenaStatus {
        let key = backend.context().0;
        ArenaStatus {
            bytes: self.arenas.get(&key).map_or(0, |a| a.len),
            building: self.building.get(&key).map_or(0, |b| b.len),
            retained: self.arenas.get(&key).map_or(0, |a| a.entries.len()),
        }
    }

    /// The bytes the host arena holds for allocation `id` ([`HostCopy::Retained`]), to read
    /// (a checkpoint writes them from here).
    pub fn retained(&self, backend: &DriverBackend, id: vmm::AllocationId) -> Option<&[u8]> {
        let a = self.arenas.get(&backend.context().0)?;
        let &(at, len) = a.entries.get(&id)?;
        Some(a.bytes(at, len))
    }

    /// Forgets what the arena holds for allocation `id` (its bytes now live elsewhere, or
    /// it was freed). Returns whether it held any.
    pub fn forget(&mut self, backend: &DriverBackend, id: vmm::AllocationId) -> bool {
        self.arenas
            .get_mut(&backend.context().0)
            .is_some_and(|a| a.entries.remove(&id).is_some())
    }

    /// Forgets everything the arena holds for `backend`'s context: call it once every
    /// allocation is back on the device (after a whole restore), so that the next pause
    /// starts at the arena's beginning.
    pub fn forget_all(&mut self, backend: &DriverBackend) {
        self.forget_all_but(backend, |_| false);
    }

    /// Forgets what the arena holds for `backend`'s context except the allocations `keep`
    /// says yes to (bytes still needed: their owner is not back on the device yet). Kept
    /// bytes stay where they are: the next pause places its bytes after them (where the
    /// arena has room), and starts at the arena's beginning again only once nothing is
    /// kept. Returns how many it kept.
    pub fn forget_all_but(
        &mut self,
        backend: &DriverBackend,
        keep: impl Fn(vmm::AllocationId) -> bool,
    ) -> usize {
        let Some(a) = self.arenas.get_mut(&backend.context().0) else {
            return 0;
        };
        a.entries.retain(|&id, _| keep(id));
        if a.entries.is_empty() {
            a.cursor = 0;
        }
        a.entries.len()
    }

    /// The allocations whose bytes the arena of `backend`'s context holds now.
    pub fn retained_ids(&self, backend: &DriverBackend) -> Vec<vmm::AllocationId> {
        self.arenas
            .get(&backend.context().0)
            .map_or_else(Vec::new, |a| a.entries.keys().copied().collect())
    }

    /// Copies `ranges` off the device for a whole-process pause: into the host arena
    /// (waiting for one being made), straight from device memory in large asynchronous
    /// copies over the pool's streams, returning [`HostCopy::Retained`]; ranges that do not
    /// fit in what is left of the arena, or all of them when there is no arena, go the
    /// ordinary way ([`HostCopy::Memory`]). On failure nothing is retained.
    pub fn save_retaining(
        &mut self,
        backend: &DriverBackend,
        ranges: &[StagingRange],
    ) -> Result<Vec<HostCopy>, StagingError> {
        let key = backend.context().0;
        self.finish_build(key);
        let Some(arena) = self.arenas.get(&key) else {
            return self.save(backend, ranges);
        };
        let mut cursor = if arena.entries.is_empty() {
            0
        } else {
            arena.cursor
        };
        let mut places = Vec::with_capacity(ranges.len());
        let mut copies = Vec::new();
        for r in ranges {
            let end = usize::try_from(r.len)
                .ok()
                .and_then(|len| cursor.checked_add(len))
                .filter(|&end| end <= arena.len);
            match end {
                Some(end) => {
                    places.push(Some(cursor));
                    copies.push((cursor, r.len as usize, r.addr));
                    cursor = end.next_multiple_of(ARENA_ALIGN as usize).min(arena.len);
                }
                None => places.push(None),
            }
        }
        self.arena_copies(backend, &copies, true)?;
        let rest: Vec<StagingRange> = ranges
            .iter()
            .zip(&places)
            .filter(|(_, p)| p.is_none())
            .map(|(r, _)| *r)
            .collect();
        let mut rest = if rest.is_empty() {
            Vec::new()
        } else {
            self.save(backend, &rest)?
        }
        .into_iter();
        let arena = self.arenas.get_mut(&key).expect("the arena stays");
        let mut out = Vec::with_capacity(ranges.len());
        for (r, p) in ranges.iter().zip(&places) {
            match p {
                Some(at) => {
                    arena.entries.insert(r.id, (*at, r.len as usize));
                    out.push(HostCopy::Retained);
                }
                None => out.push(rest.next().ok_or(StagingError::Count {
                    seen: out.len(),
                    expected: ranges.len(),
                })?),
            }
        }
        arena.cursor = cursor;
        Ok(out)
    }

    /// Copies arena places `(offset, bytes, device address)` onto the device.
    fn load_from_arena(
        &mut self,
        backend: &DriverBackend,
        places: &[(usize, usize, u64)],
    ) -> Result<(), StagingError> {
        self.arena_copies(backend, places, false)
    }

    /// Copies between the arena and device memory, `(offset, bytes, device address)` each,
    /// in pieces of at most [`ARENA_PIECE`] spread over the pool's streams (synchronous
    /// copies when there is no pool); waits for them all.
    fn arena_copies(
        &mut self,
        backend: &DriverBackend,
        places: &[(usize, usize, u64)],
        to_host: bool,
    ) -> Result<(), StagingError> {
        let key = backend.context().0;
        let Some(arena) = self.arenas.get(&key) else {
            return Err(StagingError::Io("no host arena".into()));
        };
        if places.is_empty() {
            return Ok(());
        }
        let (host, len) = (arena.host as usize, arena.len);
        for &(at, n, _) in places {
            if at.checked_add(n).is_none_or(|end| end > len) {
                return Err(StagingError::Io(format!(
                    "arena place {at}+{n} outside the arena ({len} bytes)"
                )));
            }
        }
        let driver = backend.driver().clone();
        let context = backend.context();
        let Some(pool) = self.pool_or_note(backend) else {
            let copied = (|| -> Result<(), DriverError> {
                driver.ctx_set_current(context)?;
                for &(at, n, addr) in places {
                    // SAFETY: inside the arena (checked above); the arena is ours for the
                    // call (`&mut self`), nobody else reads or writes it meanwhile.
                    let bytes =
                        unsafe { std::slice::from_raw_parts_mut((host + at) as *mut u8, n) };
                    if to_host {
                        driver.memcpy_dtoh(bytes, addr)?;
                    } else {
                        driver.memcpy_htod(addr, bytes)?;
                    }
                }
                Ok(())
            })();
            return copied.map_err(staging_error);
        };
        let streams = pool.streams.clone();
        let issued = (|| -> Result<(), DriverError> {
            driver.ctx_set_current(context)?;
            let mut k = 0;
            for &(at, n, addr) in places {
                let mut off = 0;
                while off < n {
                    let piece = (n - off).min(ARENA_PIECE);
                    let stream = streams[k % streams.len()];
                    k += 1;
                    let p = (host + at + off) as *mut u8;
                    // SAFETY: the piece lies inside the arena (checked above), which stays
                    // mapped and untouched by anyone else until the streams are
                    // synchronised below, before this call returns.
                    unsafe {
                        if to_host {
                            driver.memcpy_dtoh_async(p, addr + off as u64, piece, stream)?;
                        } else {
                            driver.memcpy_htod_async(addr + off as u64, p, piece, stream)?;
                        }
                    }
                    off += piece;
                }
            }
            Ok(())
        })();
        let synced = pool.synchronize();
        let broken = synced.is_err();
        let result = issued.and(synced).map_err(staging_error);
        self.discard_if_broken(backend, broken);
        result
    }

    /// Joins the build for context `key`, if any, and installs its arena.
    fn finish_build(&mut self, key: usize) {
        let Some(b) = self.building.remove(&key) else {
            return;
        };
        match b.handle.join() {
            Ok(Some(host)) => {
                self.arenas.insert(
                    key,
                    Arena {
                        driver: b.driver,
                        host: host as *mut u8,
                        len: b.len,
                        entries: HashMap::new(),
                        cursor: 0,
                    },
                );
            }
            Ok(None) | Err(_) => {
                self.arena_refused.insert(key);
                self.notes.push(format!(
                    "no host arena of {} MiB; pauses copy through host memory",
                    b.len >> 20
                ));
            }
        }
    }
}

/// A driver failure as a staging failure, naming the call that failed.
fn staging_error(e: DriverError) -> StagingError {
    StagingError::Backend(vmm::BackendError::new(
        e.code,
        format!("{} in {}", e.name, e.call),
    ))
}

// ---- the pool ----

/// One pinned buffer: its place in the pool, its stream and the event of its last copy.
struct Slot {
    offset: usize,
    stream: Stream,
    event: Event,
}

/// Pinned buffers, streams and events in one context.
struct Pool {
    driver: Arc<dyn Driver>,
    context: Context,
    host: *mut u8,
    /// `Some(len)`: `host` is an `mmap` of `len` bytes registered with the driver;
    /// `None`: it came from `cuMemHostAlloc`.
    mapped: Option<usize>,
    buffer_bytes: usize,
    streams: Vec<Stream>,
    slots: Vec<Slot>,
    /// Recorded on a program's stream before a pageable copy: the pool's streams wait for
    /// it ([`Pool::copy_pageable`]).
    entry: Option<Event>,
    /// One per stream, recorded after an asynchronous pageable copy's last piece: the
    /// program's stream waits for them.
    exits: Vec<Event>,
    /// The host copy threads, started with the pool; `None` where none could be started
    /// (the copies then run on the calling thread).
    workers: Option<Workers>,
}

// SAFETY: `host` is page-locked memory owned by the pool alone (freed in `free`); every
// use of it is ordered by the pipeline (a buffer is written by one party at a time), and
// the driver handles are usable from any thread.
unsafe impl Send for Pool {}
// SAFETY: as for `Send`: shared use goes through the pipeline's turn-taking.
unsafe impl Sync for Pool {}

impl Pool {
    fn new(
        driver: Arc<dyn Driver>,
        context: Context,
        config: &StagingConfig,
    ) -> Result<Pool, DriverError> {
        driver.ctx_set_current(context)?;
        let mut pool = Pool {
            driver,
            context,
            host: std::ptr::null_mut(),
            mapped: None,
            buffer_bytes: config.buffer_bytes,
            streams: Vec::new(),
            slots: Vec::new(),
            entry: None,
            exits: Vec::new(),
            workers: None,
        };
        // On failure, dropping the half-made pool frees what was made.
        let made = (|| -> Result<(), DriverError> {
            let bytes = config.pinned_bytes();
            match config
                .pin_in_place
                .then(|| pin_in_place(&*pool.driver, bytes, config.threads))
                .flatten()
            {
                Some(host) => (pool.host, pool.mapped) = (host, Some(bytes)),
                None => pool.host = pool.driver.mem_host_alloc(bytes, MEMHOSTALLOC_PORTABLE)?,
            }
            for _ in 0..config.streams {
                let s = pool.driver.stream_create(STREAM_NON_BLOCKING)?;
                pool.streams.push(s);
                let e = pool.driver.event_create(EVENT_DISABLE_TIMING)?;
                pool.exits.push(e);
            }
            pool.entry = Some(pool.driver.event_create(EVENT_DISABLE_TIMING)?);
            for i in 0..config.buffers {
                let event = pool.driver.event_create(EVENT_DISABLE_TIMING)?;
                pool.slots.push(Slot {
                    offset: i * config.buffer_bytes,
                    stream: pool.streams[i % pool.streams.len()],
                    event,
                });
            }
            Ok(())
        })();
        match made {
            Ok(()) => {
                pool.workers = Workers::start(config.threads);
                Ok(pool)
            }
            Err(e) => {
                drop(pool.free());
                Err(e)
            }
        }
    }

    /// The host copy threads to hand work to, or `None`: the work runs on the calling
    /// thread. None in a child of fork (the threads are the parent's), nor when the caller
    /// is a worker of a rayon pool (while it waited for ours, it would run its own pool's
    /// other jobs, which may call back into the staging).
    fn workers(&self) -> Option<&rayon_core::ThreadPool> {
        let w = self.workers.as_ref()?;
        (w.pid == std::process::id() && rayon_core::current_thread_index().is_none())
            .then_some(&w.pool)
    }

    /// The start of buffer `slot`.
    fn buffer(&self, slot: usize) -> *mut u8 {
        // SAFETY: `offset` is inside the pool's allocation (slot < buffers).
        unsafe { self.host.add(self.slots[slot].offset) }
    }

    /// Waits for every stream.
    fn synchronize(&self) -> Result<(), DriverError> {
        let mut first = self.driver.ctx_set_current(self.context).err();
        for &s in &self.streams {
            if let Err(e) = self.driver.stream_synchronize(s) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Frees everything (after waiting for the streams).
    fn free(mut self) -> Result<(), DriverError> {
        self.free_parts()
    }

    fn free_parts(&mut self) -> Result<(), DriverError> {
        // Idle between calls (every call waits for its work): they end at once.
        if let Some(w) = self.workers.take() {
            w.stop();
        }
        if self.host.is_null()
            && self.slots.is_empty()
            && self.streams.is_empty()
            && self.exits.is_empty()
            && self.entry.is_none()
        {
            return Ok(());
        }
        let mut first = self.synchronize().err();
        let mut note = |r: Result<(), DriverError>| {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        };
        for slot in self.slots.drain(..) {
            note(self.driver.event_destroy(slot.event));
        }
        for e in self.exits.drain(..).chain(self.entry.take()) {
            note(self.driver.event_destroy(e));
        }
        for s in self.streams.drain(..) {
            note(self.driver.stream_destroy(s));
        }
        if !self.host.is_null() {
            match self.mapped.take() {
                Some(len) => {
                    // SAFETY: `host` was registered by `pin_in_place`; the streams are
                    // synchronised (or gone), so no copy uses it.
                    note(unsafe { self.driver.mem_host_unregister(self.host) });
                    // SAFETY: our own mapping of `len` bytes, used by nothing any more.
                    unsafe { libc::munmap(self.host.cast(), len) };
                }
                // SAFETY: `host` came from mem_host_alloc; the streams are synchronised
                // (or gone), so no copy uses it.
                None => note(unsafe { self.driver.mem_free_host(self.host) }),
            }
            self.host = std::ptr::null_mut();
        }
        first.map_or(Ok(()), Err)
    }

    /// Copies `ranges` off the device. Returns the result and whether the pool is broken.
    fn save(
        &self,
        config: &StagingConfig,
        ranges: &[StagingRange],
        warm: &mut WarmPool,
    ) -> (Result<Vec<HostCopy>, StagingError>, bool) {
        let mut lens = Vec::with_capacity(ranges.len());
        let mut dests: Vec<Vec<u8>> = Vec::with_capacity(ranges.len());
        for r in ranges {
            let Ok(len) = usize::try_from(r.len) else {
                let e = format!("range of {} bytes exceeds the address space", r.len);
                return (Err(StagingError::Io(e)), false);
            };
            if let Some(v) = warm.take(len) {
                // Faulted in by an earlier pause (or fresh again if the kernel took it back
                // meanwhile: every byte is written before it is read either way).
                lens.push(len);
                dests.push(v);
                continue;
            }
            let mut v = Vec::new();
            if v.try_reserve_exact(len).is_err() {
                let e = format!(
                    "cannot allocate {len} bytes of host memory for allocation {:?}",
                    r.id
                );
                return (Err(StagingError::Io(e)), false);
            }
            if config.huge_pages {
                advise_huge_pages(v.as_mut_ptr(), len);
            }
            lens.push(len);
            dests.push(v);
        }
        let targets: Vec<HostPtr> = dests.iter_mut().map(|v| HostPtr(v.as_mut_ptr())).collect();
        let plan = Plan::new(&lens, self.buffer_bytes, config.threads);
        let copied = self.run_save(config, ranges, &targets, &plan);
        let synced = self.synchronize();
        let broken = synced.is_err();
        if let Err(e) = copied.and(synced.map_err(staging_error)) {
            return (Err(e), broken);
        }
        for (v, &len) in dests.iter_mut().zip(&lens) {
            // SAFETY: the plan's pieces cover every byte of each range exactly once and
            // every piece was copied (no failure), so the first `len` bytes are written;
            // the capacity is at least `len` (reserved above).
            unsafe { v.set_len(len) };
        }
        (Ok(dests.into_iter().map(HostCopy::Memory).collect()), false)
    }

    fn run_save(
        &self,
        config: &StagingConfig,
        ranges: &[StagingRange],
        targets: &[HostPtr],
        plan: &Plan,
    ) -> Result<(), StagingError> {
        let batches = plan.batches.len();
        let workers = self.workers().filter(|_| batches > 1);
        let Some(workers) = workers else {
            // One batch's worth (no hand-off to pay for), or no threads to hand it to.
            return self
                .save_here(config, ranges, targets, plan)
                .map_err(staging_error);
        };
        let threads = config
            .threads
            .min(batches)
            .min(workers.current_num_threads())
            .max(1);
        let pipe = Pipeline::new(self.slots.len(), config.profile);
        // The issuer runs here while the workers copy out, then copies out too (a copy of
        // a few buffers is all issued at once: the caller is awake, where a worker must
        // be woken first). The scope returns once they all have (the pipeline is closed,
        // on success and on failure).
        workers.in_place_scope(|s| {
            for _ in 0..threads {
                s.spawn(|_| {
                    let _stop = StopOnPanic(&pipe);
                    self.save_worker(config, targets, plan, &pipe)
                });
            }
            let _stop = StopOnPanic(&pipe);
            if let Err(e) = self.issue_save(ranges, plan, &pipe) {
                pipe.fail(staging_error(e));
            }
            pipe.close();
            self.save_worker(config, targets, plan, &pipe);
        });
        if let Some(p) = &pipe.prof {
            p.report("to host", plan);
        }
        pipe.result()
    }

    /// A save on the calling thread alone: the first buffers filled, then each copied out
    /// and refilled with the batch one round later, so the device copies of later batches
    /// overlap the host copies of earlier ones.
    fn save_here(
        &self,
        config: &StagingConfig,
        ranges: &[StagingRange],
        targets: &[HostPtr],
        plan: &Plan,
    ) -> Result<(), DriverError> {
        let (n, batches) = (self.slots.len(), plan.batches.len());
        self.driver.ctx_set_current(self.context)?;
        for k in 0..n.min(batches) {
            self.issue_batch(ranges, plan, k)?;
        }
        for k in 0..batches {
            self.copy_out(config, targets, plan, k, None)?;
            if k + n < batches {
                // Buffer `k % n` is out (copied just above): it takes batch `k + n`.
                self.issue_batch(ranges, plan, k + n)?;
            }
        }
        Ok(())
    }

    /// The issuer of a save: fills the buffers in order, each once its previous bytes are
    /// out, and queues each filled batch for the copy threads.
    fn issue_save(
        &self,
        ranges: &[StagingRange],
        plan: &Plan,
        pipe: &Pipeline,
    ) -> Result<(), DriverError> {
        let n = self.slots.len();
        let prof = pipe.prof.as_ref();
        self.driver.ctx_set_current(self.context)?;
        for k in 0..plan.batches.len() {
            if !Prof::timed(prof, |p| &p.wait, || pipe.wait_turn(k % n, k / n)) {
                break;
            }
            Prof::timed(prof, |p| &p.issue, || self.issue_batch(ranges, plan, k))?;
            Prof::issued(prof);
            pipe.push(k);
        }
        Ok(())
    }

    /// Issues the device copies of save batch `k` into its buffer, and records the
    /// buffer's event after them. The buffer's previous bytes are out, and the pool's
    /// context is current.
    fn issue_batch(
        &self,
        ranges: &[StagingRange],
        plan: &Plan,
        k: usize,
    ) -> Result<(), DriverError> {
        let slot = k % self.slots.len();
        let at = self.buffer(slot);
        let Slot { stream, event, .. } = self.slots[slot];
        for p in &plan.pieces[plan.batches[k].clone()] {
            // SAFETY: the piece lies inside buffer `slot` (the plan packs at most
            // `buffer_bytes` per batch), which nobody else touches until whoever copies
            // batch `k` out has waited for `event`; the streams are synchronised before
            // the pool is used or freed again.
            unsafe {
                self.driver.memcpy_dtoh_async(
                    at.add(p.at),
                    ranges[p.range].addr + p.offset as u64,
                    p.len,
                    stream,
                )?
            };
        }
        self.driver.event_record(event, stream)
    }

    /// A party copying a save out (a worker, or the issuer once done issuing): copies the
    /// filled batches out as they come. Sets the
    /// pool's context first (the thread may have served other copies).
    fn save_worker(
        &self,
        config: &StagingConfig,
        targets: &[HostPtr],
        plan: &Plan,
        pipe: &Pipeline,
    ) {
        let prof = pipe.prof.as_ref();
        Prof::party(prof);
        if let Err(e) = self.driver.ctx_set_current(self.context) {
            pipe.fail(staging_error(e));
            return;
        }
        while let Some(k) = Prof::timed(prof, |p| &p.wait, || pipe.pop()) {
            if let Err(e) = self.copy_out(config, targets, plan, k, prof) {
                pipe.fail(staging_error(e));
                return;
            }
            pipe.release(k % self.slots.len());
        }
    }

    /// Copies save batch `k` out of its buffer into the destinations, once its device
    /// copies are done (prefaulting the destination pages while they are on the wire).
    /// Only the caller writes the batch's destinations.
    fn copy_out(
        &self,
        config: &StagingConfig,
        targets: &[HostPtr],
        plan: &Plan,
        k: usize,
        prof: Option<&Prof>,
    ) -> Result<(), DriverError> {
        let slot = k % self.slots.len();
        let pieces = &plan.pieces[plan.batches[k].clone()];
        let faulting = Prof::mark(prof);
        if config.prefault {
            for p in pieces {
                // SAFETY: the piece's destination lies inside its range's reserved
                // capacity, and only this thread writes it.
                unsafe { prefault(targets[p.range].0.add(p.offset), p.len) };
            }
        }
        Prof::add(prof, |p| &p.copy, faulting);
        Prof::timed(
            prof,
            |p| &p.device,
            || self.driver.event_synchronize(self.slots[slot].event),
        )?;
        let copying = Prof::mark(prof);
        let from = self.buffer(slot);
        for p in pieces {
            // SAFETY: the device copy into the buffer is complete (event above); the
            // destination lies inside the range's reserved capacity and no other
            // thread writes these bytes (the plan's pieces are disjoint).
            unsafe {
                let (src, dst) = (from.add(p.at), targets[p.range].0.add(p.offset));
                if config.streaming_stores {
                    copy_streaming(src, dst, p.len)
                } else {
                    std::ptr::copy_nonoverlapping(src, dst, p.len)
                }
            };
        }
        Prof::add(prof, |p| &p.copy, copying);
        Ok(())
    }

    /// [`PinnedStaging::copy_pageable`] in this pool. On failure: the error and whether
    /// the pool is broken.
    ///
    /// # Safety
    /// As [`PinnedStaging::copy_pageable`].
    unsafe fn copy_pageable(
        &self,
        config: &StagingConfig,
        copy: PageableCopy,
        stream: Stream,
        completion: Completion,
    ) -> Result<(), (PageableCopyError, bool)> {
        let d = &*self.driver;
        let not_started = |e| (PageableCopyError::NotStarted(e), false);
        let entry = self.entry.ok_or_else(|| {
            not_started(DriverError {
                code: crate::error::CUDA_ERROR_INVALID_VALUE,
                name: "the pool has no entry event".into(),
                call: "cuEventCreate",
            })
        })?;
        d.ctx_set_current(self.context).map_err(not_started)?;
        // The program's earlier work on its stream comes first. A stream left waiting for
        // it when a later one refuses holds nothing of ours: harmless.
        d.event_record(entry, stream).map_err(not_started)?;
        for &s in &self.streams {
            d.stream_wait_event(s, entry).map_err(not_started)?;
        }
        let id = vmm::AllocationId(0);
        let copied = match copy {
            PageableCopy::ToHost { dst, src, len } => {
                let range = StagingRange {
                    id,
                    addr: src,
                    len: len as u64,
                };
                let plan = Plan::new(&[len], self.buffer_bytes, config.threads);
                self.run_save(config, &[range], &[HostPtr(dst)], &plan)
            }
            PageableCopy::ToDevice { dst, src, len } => {
                // SAFETY: readable for the call (the caller's contract); only read.
                let bytes = unsafe { std::slice::from_raw_parts(src, len) };
                let range = LoadRange {
                    id,
                    addr: dst,
                    len: len as u64,
                    source: Source::Memory(bytes),
                };
                // Streaming stores into the buffers, whatever `streaming_in` says for
                // resumes: measured faster for these copies (gpu-check's `stagesweep`, an
                // H200 host: 8 / 32 / 128 MiB at 23 / 26 / 34 GB/s against 16 / 21 / 32).
                let config = StagingConfig {
                    streaming_in: true,
                    ..*config
                };
                self.run_load(&config, &[range], &[bytes])
            }
        };
        let finished = copied.and_then(|()| {
            let handed_back = match (copy, completion) {
                // The program's later work on its stream waits for the copies still on
                // the wire.
                (PageableCopy::ToDevice { .. }, Completion::Staged) => self
                    .streams
                    .iter()
                    .zip(&self.exits)
                    .try_for_each(|(&s, &e)| {
                        d.event_record(e, s)?;
                        d.stream_wait_event(stream, e)
                    }),
                _ => self.synchronize(),
            };
            handed_back.map_err(staging_error)
        });
        finished.map_err(|e| {
            let synced = self.synchronize();
            (PageableCopyError::Failed(e), synced.is_err())
        })
    }

    /// Copies `sources` onto the device. Returns the result and whether the pool is broken.
    fn load(
        &self,
        config: &StagingConfig,
        ranges: &[LoadRange<'_>],
        sources: &[&[u8]],
    ) -> (Result<(), StagingError>, bool) {
        let loaded = self.run_load(config, ranges, sources);
        let synced = self.synchronize();
        let broken = synced.is_err();
        let result = loaded.and(synced.map_err(staging_error));
        (result, broken)
    }

    /// Copies `sources` into the buffers and issues their device copies; returns once
    /// every byte is in a buffer (the last copies may still be on the wire).
    fn run_load(
        &self,
        config: &StagingConfig,
        ranges: &[LoadRange<'_>],
        sources: &[&[u8]],
    ) -> Result<(), StagingError> {
        let lens: Vec<usize> = sources.iter().map(|s| s.len()).collect();
        let plan = Plan::new(&lens, self.buffer_bytes, config.threads);
        let n = self.slots.len();
        let pipe = Pipeline::new(n, config.profile);
        let next = AtomicUsize::new(0);
        let threads = config.threads.min(plan.batches.len()).max(1);
        let work = || {
            let _stop = StopOnPanic(&pipe);
            let r = self.load_worker(config, ranges, sources, &plan, &pipe, &next);
            if let Err(e) = r {
                pipe.fail(staging_error(e));
            }
        };
        match self.workers().filter(|_| threads > 1) {
            // The calling thread copies too (it starts at once, where a worker must be
            // woken first). The scope returns once every worker has: each stops at the
            // last batch or the first failure.
            Some(workers) => workers.in_place_scope(|s| {
                for _ in 1..threads.min(workers.current_num_threads() + 1) {
                    s.spawn(|_| work());
                }
                work();
            }),
            // One thread's worth, or no threads to hand it to (a pids limit): here.
            None => work(),
        }
        if let Some(p) = &pipe.prof {
            p.report("to device", &plan);
        }
        pipe.result()
    }

    /// A party of a load (a worker, or the calling thread): takes the next batch until none
    /// is left. Sets the pool's
    /// context first (the thread may have served other copies).
    fn load_worker(
        &self,
        config: &StagingConfig,
        ranges: &[LoadRange<'_>],
        sources: &[&[u8]],
        plan: &Plan,
        pipe: &Pipeline,
        next: &AtomicUsize,
    ) -> Result<(), DriverError> {
        let prof = pipe.prof.as_ref();
        Prof::party(prof);
        self.driver.ctx_set_current(self.context)?;
        let n = self.slots.len();
        loop {
            let k = next.fetch_add(1, Ordering::Relaxed);
            if k >= plan.batches.len()
                || !Prof::timed(prof, |p| &p.wait, || pipe.wait_turn(k % n, k / n))
            {
                return Ok(());
            }
            let slot = k % n;
            let Slot { stream, event, .. } = self.slots[slot];
            // The buffer's previous copy (batch k - n, or an asynchronous pageable copy's
            // that returned before it was done) must have left it. An event never recorded
            // is reached.
            Prof::timed(prof, |p| &p.device, || self.driver.event_synchronize(event))?;
            let at = self.buffer(slot);
            let pieces = &plan.pieces[plan.batches[k].clone()];
            let copying = Prof::mark(prof);
            for p in pieces {
                let src = &sources[p.range][p.offset..p.offset + p.len];
                // SAFETY: the piece lies inside buffer `slot`, which is ours until we
                // release it: its previous device copy is done (event above) and the
                // next batch to use it waits for our turn.
                unsafe {
                    if config.streaming_in {
                        copy_streaming(src.as_ptr(), at.add(p.at), p.len)
                    } else {
                        std::ptr::copy_nonoverlapping(src.as_ptr(), at.add(p.at), p.len)
                    }
                };
            }
            let issuing = Prof::add(prof, |p| &p.copy, copying);
            for p in pieces {
                // SAFETY: the buffer stays allocated and unchanged until the copy is done:
                // the next writer of this buffer waits for `event`, recorded after it, and
                // the streams are synchronised before the pool is used or freed again.
                unsafe {
                    self.driver.memcpy_htod_async(
                        ranges[p.range].addr + p.offset as u64,
                        at.add(p.at),
                        p.len,
                        stream,
                    )?
                };
            }
            self.driver.event_record(event, stream)?;
            Prof::add(prof, |p| &p.issue, issuing);
            Prof::issued(prof);
            pipe.release(slot);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Err(e) = self.free_parts() {
            eprintln!("cudaw: freeing a pinned staging pool: {e}");
        }
    }
}

/// A pool's host copy threads: started once with the pool, given each copy's work, ended
/// and joined when the pool is freed.
struct Workers {
    pool: rayon_core::ThreadPool,
    handles: Vec<std::thread::JoinHandle<()>>,
    /// The process that started them (a child of fork has none of them).
    pid: u32,
}

impl Workers {
    /// `threads` threads, named `cudaw-stage-N`, or as many as could be started when
    /// some are refused (a pids limit); `None` if not even one.
    fn start(threads: usize) -> Option<Workers> {
        let mut want = threads.max(1);
        loop {
            if let Some(w) = Workers::try_start(want) {
                return Some(w);
            }
            if want == 1 {
                return None;
            }
            want /= 2;
        }
    }

    fn try_start(threads: usize) -> Option<Workers> {
        let mut handles = Vec::with_capacity(threads);
        let built = rayon_core::ThreadPoolBuilder::new()
            .num_threads(threads)
            // At most 15 bytes (Linux's limit on a thread's name) up to 256 threads.
            .thread_name(|i| format!("cudaw-stage-{i}"))
            .spawn_handler(|thread| {
                let mut b = std::thread::Builder::new();
                if let Some(name) = thread.name() {
                    b = b.name(name.to_owned());
                }
                if let Some(size) = thread.stack_size() {
                    b = b.stack_size(size);
                }
                handles.push(b.spawn(|| thread.run())?);
                Ok(())
            })
            .build();
        match built {
            Ok(pool) => Some(Workers {
                pool,
                handles,
                pid: std::process::id(),
            }),
            Err(_) => {
                // The builder has told the threads it started to end.
                for h in handles {
                    drop(h.join());
                }
                None
            }
        }
    }

    /// Ends the threads and waits for them (they are idle: every call waits for its
    /// work). In a child of fork, which has none of them, forgets them instead: their
    /// locks may have been held at the fork.
    fn stop(self) {
        if self.pid != std::process::id() {
            std::mem::forget(self);
            return;
        }
        drop(self.pool);
        for h in self.handles {
            drop(h.join());
        }
    }
}

// ---- the plan: ranges cut into pieces, pieces packed into buffer-sized batches ----

/// Part of one range, at `offset` in it, copied through a buffer at `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    range: usize,
    offset: usize,
    len: usize,
    at: usize,
}

/// Batches of pieces, each fitting one buffer; batch `k` uses buffer `k % buffers`.
#[derive(Debug)]
struct Plan {
    pieces: Vec<Piece>,
    batches: Vec<std::ops::Range<usize>>,
}

/// The smallest batch a copy is cut into (or the buffer, where that is smaller; the last
/// batch of a copy is whatever is left, merged into the one before where it fits): below
/// it, a device copy's launch costs more than the bytes it moves.
const MIN_BATCH: usize = 128 << 10;

/// Batches grow by a quarter at the start and shrink by a fifth of what is left at the
/// end (see [`Plan::new`]).
const GROW_DIV: usize = 4;
const SHRINK_DIV: usize = 5;

impl Plan {
    /// Every byte of `lens` once, packed into batches of at most `buffer` bytes, for
    /// `parties` host threads. The batches are graded: the first is small, so the device
    /// starts sooner on a copy to it and the copy threads start sooner on a copy from it,
    /// and each grows by a quarter (about what the device moves while one thread copies
    /// a batch: 10 GB/s a thread against 50 GB/s a DMA engine), up to a buffer; the last
    /// ones shrink by a fifth of what is left, so the last host copy out of a buffer is
    /// short too. The first is `1/parties` of the copy, at least [`MIN_BATCH`] (or the
    /// buffer, where smaller) and at most a sixteenth of a buffer where that is larger: a
    /// copy of one buffer or less is spread over the threads.
    /// Whole 4 MiB batches cost a fixed 0.2–0.9 ms a copy on an H200 (one thread copying
    /// a buffer while the device waited), and batches doubling from an eighth still
    /// 0.5–1.3 ms (the threads all start at once: the fourth batch was ready only when a
    /// whole buffer had been copied, long after the device had moved the first three).
    fn new(lens: &[usize], buffer: usize, parties: usize) -> Plan {
        let buffer = buffer.max(1);
        let total: usize = lens.iter().sum();
        let floor = MIN_BATCH.min(buffer);
        let first = total
            .div_ceil(parties.max(1))
            .clamp(floor, (buffer / 16).max(floor));
        let mut pieces = Vec::new();
        let mut batches = Vec::new();
        let (mut start, mut used, mut done) = (0, 0, 0);
        let mut up = first;
        // What would be left after a batch is taken into it when less than the smallest
        // batch and it still fits one buffer.
        let capacity = |up: usize, left: usize| {
            let cap = up.min((left / SHRINK_DIV).max(first));
            if left > cap && left - cap < floor && left <= buffer {
                left
            } else {
                cap
            }
        };
        let mut cap = capacity(up, total);
        for (range, &len) in lens.iter().enumerate() {
            let mut offset = 0;
            while offset < len {
                if used == cap {
                    batches.push(start..pieces.len());
                    (start, used) = (pieces.len(), 0);
                    up = up.saturating_add((up / GROW_DIV).max(1)).min(buffer);
                    cap = capacity(up, total - done);
                }
                let take = (len - offset).min(cap - used);
                pieces.push(Piece {
                    range,
                    offset,
                    len: take,
                    at: used,
                });
                offset += take;
                used += take;
                done += take;
            }
        }
        if pieces.len() > start {
            batches.push(start..pieces.len());
        }
        Plan { pieces, batches }
    }
}

/// Fails the pipeline when the party holding it unwinds (a panic in a copy thread or the
/// issuer), so that the others stop instead of waiting for its turns for ever; the panic
/// then goes on to the caller of the scope.
struct StopOnPanic<'a>(&'a Pipeline);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0
                .fail(StagingError::Io("a staging thread panicked".to_owned()));
        }
    }
}

// ---- the pipeline: buffers taken in turn, a queue of filled buffers, the first error ----

struct Queue {
    ready: VecDeque<usize>,
    closed: bool,
}

struct Pipeline {
    /// Where the copy's time goes, when profiled ([`StagingConfig::profile`]).
    prof: Option<Prof>,
    /// How many batches each buffer has been through.
    turns: Mutex<Vec<usize>>,
    turned: Condvar,
    queue: Mutex<Queue>,
    queued: Condvar,
    failed: AtomicBool,
    error: Mutex<Option<StagingError>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Pipeline {
    fn new(buffers: usize, profile: bool) -> Pipeline {
        Pipeline {
            prof: profile.then(Prof::new),
            turns: Mutex::new(vec![0; buffers]),
            turned: Condvar::new(),
            queue: Mutex::new(Queue {
                ready: VecDeque::new(),
                closed: false,
            }),
            queued: Condvar::new(),
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
        }
    }

    /// Waits until buffer `slot` has been through `round` batches; `false` on failure.
    fn wait_turn(&self, slot: usize, round: usize) -> bool {
        let mut turns = lock(&self.turns);
        loop {
            if self.failed.load(Ordering::SeqCst) {
                return false;
            }
            if turns[slot] >= round {
                return true;
            }
            turns = self
                .turned
                .wait(turns)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// Buffer `slot` is done with its batch.
    fn release(&self, slot: usize) {
        lock(&self.turns)[slot] += 1;
        self.turned.notify_all();
    }

    fn push(&self, batch: usize) {
        lock(&self.queue).ready.push_back(batch);
        self.queued.notify_one();
    }

    fn close(&self) {
        lock(&self.queue).closed = true;
        self.queued.notify_all();
    }

    /// The next filled batch; `None` once closed and empty, or on failure.
    fn pop(&self) -> Option<usize> {
        let mut q = lock(&self.queue);
        loop {
            if self.failed.load(Ordering::SeqCst) {
                return None;
            }
            if let Some(k) = q.ready.pop_front() {
                return Some(k);
            }
            if q.closed {
                return None;
            }
            q = self
                .queued
                .wait(q)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// Records the first failure and wakes everyone so they stop.
    ///
    /// (Also called by [`StopOnPanic`] when a party of the copy unwinds: the others would
    /// otherwise wait for its turn for ever, and so would the scope that waits for them.)
    fn fail(&self, e: StagingError) {
        lock(&self.error).get_or_insert(e);
        self.failed.store(true, Ordering::SeqCst);
        // Take each lock once so no waiter misses the flag between its check and its wait.
        drop(lock(&self.turns));
        self.turned.notify_all();
        drop(lock(&self.queue));
        self.queued.notify_all();
    }

    fn result(&self) -> Result<(), StagingError> {
        match lock(&self.error).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Where a copy through the pool spent its time ([`StagingConfig::profile`]), in
/// nanoseconds summed over its parties (the calling thread and the workers).
struct Prof {
    start: std::time::Instant,
    parties: AtomicU64,
    /// When the last party started, after the copy did.
    last_start: AtomicU64,
    /// When the first and the last batch's device copies were issued.
    first_issue: AtomicU64,
    last_issue: AtomicU64,
    /// Waiting for a buffer's turn (loads, the issuer of saves) or a filled batch (the
    /// copiers of saves).
    wait: AtomicU64,
    /// Waiting for a buffer's device copy.
    device: AtomicU64,
    /// Copying between the buffers and host memory (prefaulting included).
    copy: AtomicU64,
    /// Issuing device copies and events.
    issue: AtomicU64,
}

impl Prof {
    fn new() -> Prof {
        Prof {
            start: std::time::Instant::now(),
            parties: AtomicU64::new(0),
            last_start: AtomicU64::new(0),
            first_issue: AtomicU64::new(u64::MAX),
            last_issue: AtomicU64::new(0),
            wait: AtomicU64::new(0),
            device: AtomicU64::new(0),
            copy: AtomicU64::new(0),
            issue: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// A party starts.
    fn party(p: Option<&Prof>) {
        if let Some(p) = p {
            p.parties.fetch_add(1, Ordering::Relaxed);
            p.last_start.fetch_max(p.now(), Ordering::Relaxed);
        }
    }

    /// Now, to [`Prof::add`] to a field later (0 when not profiled).
    fn mark(p: Option<&Prof>) -> u64 {
        p.map_or(0, Prof::now)
    }

    /// Adds the time since `from` to a field; returns now.
    fn add(p: Option<&Prof>, field: fn(&Prof) -> &AtomicU64, from: u64) -> u64 {
        let Some(p) = p else { return 0 };
        let now = p.now();
        field(p).fetch_add(now.saturating_sub(from), Ordering::Relaxed);
        now
    }

    /// Runs `f`, its time added to a field.
    fn timed<T>(p: Option<&Prof>, field: fn(&Prof) -> &AtomicU64, f: impl FnOnce() -> T) -> T {
        let from = Prof::mark(p);
        let r = f();
        Prof::add(p, field, from);
        r
    }

    /// A batch's device copies are issued.
    fn issued(p: Option<&Prof>) {
        if let Some(p) = p {
            let now = p.now();
            p.first_issue.fetch_min(now, Ordering::Relaxed);
            p.last_issue.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// One line on stderr.
    fn report(&self, direction: &str, plan: &Plan) {
        let us = |v: &AtomicU64| v.load(Ordering::Relaxed) as f64 / 1e3;
        let bytes: usize = plan.pieces.iter().map(|p| p.len).sum();
        let parties = self.parties.load(Ordering::Relaxed).max(1) as f64;
        eprintln!(
            "cudaw staging profile: {direction} {bytes} bytes in {} batches, {:.0} µs; \
             {parties} parties, the last started at {:.0} µs; device copies issued from {:.0} \
             to {:.0} µs; per party: waiting {:.0} µs for a buffer or batch, {:.0} µs for the \
             device, copying {:.0} µs, issuing {:.0} µs",
            plan.batches.len(),
            self.now() as f64 / 1e3,
            us(&self.last_start),
            us(&self.first_issue),
            us(&self.last_issue),
            us(&self.wait) / parties,
            us(&self.device) / parties,
            us(&self.copy) / parties,
            us(&self.issue) / parties,
        );
    }
}

// ---- host memory ----

/// A destination in host memory, shared by the copy threads (each writes its own pieces).
#[derive(Clone, Copy)]
struct HostPtr(*mut u8);

// SAFETY: the threads write disjoint pieces of the memory behind it (see `Plan`), and
// the owner does not touch it until they have all finished (the end of the call's scope).
unsafe impl Send for HostPtr {}
// SAFETY: as for `Send`.
unsafe impl Sync for HostPtr {}

/// Host copies kept between a resume and the next pause, by capacity. Their memory is
/// given back to the kernel lazily (`MADV_FREE`): under memory pressure it takes the pages
/// (a later write faults fresh ones in, as without the pool); otherwise they are still
/// there, and the next pause's bytes go into them at the speed of memory already faulted
/// in (60 GiB/s against 29 GiB/s for fresh pages, 16 threads of an H100 host).
#[derive(Default)]
struct WarmPool {
    by_capacity: std::collections::BTreeMap<usize, Vec<Vec<u8>>>,
    bytes: usize,
}

impl WarmPool {
    /// Keeps `v` (empty, its memory lazily freed). Small ones are not worth keeping.
    fn put(&mut self, mut v: Vec<u8>) {
        let cap = v.capacity();
        if cap < HUGE_PAGE {
            return;
        }
        v.clear();
        let start = (v.as_mut_ptr() as usize).next_multiple_of(PAGE);
        let end = (v.as_mut_ptr() as usize + cap) / PAGE * PAGE;
        if end > start {
            // SAFETY: whole pages inside `v`'s own allocation, whose contents are not
            // needed any more (`v` is empty; every byte is written before it is read
            // again). MADV_FREE changes no mapping; advice only, failures ignored.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_FREE) };
        }
        self.bytes += cap;
        self.by_capacity.entry(cap).or_default().push(v);
    }

    /// A kept vector of capacity `len` to `len` + 1/8 (not a much larger one: its spare
    /// memory would be held for nothing), emptied.
    fn take(&mut self, len: usize) -> Option<Vec<u8>> {
        let most = len.saturating_add(len / 8);
        let (&cap, _) = self.by_capacity.range(len..=most).next()?;
        let list = self.by_capacity.get_mut(&cap)?;
        let v = list.pop()?;
        if list.is_empty() {
            self.by_capacity.remove(&cap);
        }
        self.bytes -= cap;
        Some(v)
    }
}

/// Advises the whole 2 MiB pages inside `[ptr, ptr + len)` for transparent huge pages.
/// Advice only: failures (no THP support) are ignored.
fn advise_huge_pages(ptr: *mut u8, len: usize) {
    let start = (ptr as usize).next_multiple_of(HUGE_PAGE);
    let end = (ptr as usize + len) / HUGE_PAGE * HUGE_PAGE;
    if end > start {
        // SAFETY: advice on whole pages of memory this process owns (a reserved but
        // unwritten allocation); MADV_HUGEPAGE changes no contents.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
}

/// `CU_MEMHOSTREGISTER_PORTABLE`: pinned for every context.
const MEMHOSTREGISTER_PORTABLE: u32 = 0x1;

/// Page-locked memory made by pinning ordinary memory in place: an anonymous mapping
/// advised for huge pages, faulted in on `threads` threads, then registered with the
/// driver. Several times faster than `cuMemHostAlloc`, which faults the memory in on one
/// thread. `None` if any step fails (nothing is left behind).
fn pin_in_place(driver: &dyn Driver, bytes: usize, threads: usize) -> Option<*mut u8> {
    // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let base = p as usize;
    // A child of fork (PyTorch's DataLoader workers, subprocesses) neither needs nor
    // inherits the pinned pool or arena: without this, a kernel that pins pages through
    // pin_user_pages copies every pinned page into each child at fork. Advice only.
    // SAFETY: advice on our fresh mapping; no contents change.
    unsafe { libc::madvise(p, bytes, libc::MADV_DONTFORK) };
    advise_huge_pages(p.cast(), bytes);
    let part = bytes.div_ceil(threads.max(1)).next_multiple_of(PAGE);
    let fault = move |start: usize| {
        let len = part.min(bytes - start);
        // SAFETY: a part of our fresh mapping that only this thread touches.
        unsafe { prefault((base + start) as *mut u8, len) };
    };
    std::thread::scope(|s| {
        for start in (0..bytes).step_by(part) {
            // A thread that cannot be started (a pids limit): this one faults its part in.
            if std::thread::Builder::new()
                .spawn_scoped(s, move || fault(start))
                .is_err()
            {
                fault(start);
            }
        }
    });
    // SAFETY: our own mapping of `bytes` bytes; it stays mapped until unregistered (the
    // pool unregisters before unmapping).
    match unsafe { driver.mem_host_register(p.cast(), bytes, MEMHOSTREGISTER_PORTABLE) } {
        Ok(()) => Some(p.cast()),
        Err(_) => {
            // SAFETY: our own mapping, registered with nobody.
            unsafe { libc::munmap(p, bytes) };
            None
        }
    }
}

/// Faults in the pages of `[ptr, ptr + len)` for writing by writing a zero to the first
/// byte of each page inside the range (one fault per huge page where the range has them).
/// Only bytes inside the range are written. (`MADV_POPULATE_WRITE` measured 3x slower than
/// touching on 16 threads, on an H100 host with Linux 6.18.)
///
/// # Safety
/// `[ptr, ptr + len)` is writable memory of this process that only the caller writes
/// until it overwrites it.
unsafe fn prefault(ptr: *mut u8, len: usize) {
    let (mut at, end) = (ptr as usize, ptr as usize + len);
    while at < end {
        // SAFETY: `at` is inside the caller's range, which only the caller writes.
        unsafe { std::ptr::write_volatile(at as *mut u8, 0) };
        at = (at + 1).next_multiple_of(PAGE);
    }
}

/// Copies `len` bytes with non-temporal (streaming) stores where the destination allows:
/// the destination's cache lines are not read first, nor kept in the cache (a save's
/// pageable destination: the pinned buffers stay cached; a load's pinned buffer: the
/// device then reads it from memory). The stores are fenced before it returns.
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`.
unsafe fn copy_streaming(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        let head = (dst as usize).next_multiple_of(16) - dst as usize;
        if len >= head + 256 {
            // SAFETY: the caller's contract covers [0, len); the head is in range.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
            let body = (len - head) / 64 * 64;
            let (s, d) = (
                // SAFETY: inside the caller's ranges.
                unsafe { src.add(head) },
                // SAFETY: inside the caller's ranges; 16-byte aligned by construction.
                unsafe { dst.add(head) },
            );
            let mut i = 0;
            while i < body {
                // SAFETY: SSE2 is part of x86_64; `i + 64 <= body` keeps every access in
                // range; the destination is 16-byte aligned as streaming stores need.
                unsafe {
                    let a = _mm_loadu_si128(s.add(i).cast::<__m128i>());
                    let b = _mm_loadu_si128(s.add(i + 16).cast::<__m128i>());
                    let c = _mm_loadu_si128(s.add(i + 32).cast::<__m128i>());
                    let e = _mm_loadu_si128(s.add(i + 48).cast::<__m128i>());
                    _mm_stream_si128(d.add(i).cast::<__m128i>(), a);
                    _mm_stream_si128(d.add(i + 16).cast::<__m128i>(), b);
                    _mm_stream_si128(d.add(i + 32).cast::<__m128i>(), c);
                    _mm_stream_si128(d.add(i + 48).cast::<__m128i>(), e);
                }
                i += 64;
            }
            // SAFETY: orders the streaming stores before what follows (the release of the
            // buffer, the device copy a load issues next, the readers of the destination).
            unsafe { _mm_sfence() };
            let done = head + body;
            // SAFETY: the tail is inside the caller's ranges.
            unsafe { std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), len - done) };
            return;
        }
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(lens: &[usize], buffer: usize, parties: usize) -> Vec<usize> {
        let plan = Plan::new(lens, buffer, parties);
        // Every byte of every range exactly once, in order.
        let mut next = vec![0usize; lens.len()];
        for p in &plan.pieces {
            assert_eq!(p.offset, next[p.range], "{p:?}");
            assert!(p.len > 0);
            next[p.range] += p.len;
        }
        assert_eq!(next, lens);
        // Batches: consecutive, disjoint inside one buffer, none empty.
        let mut expect = 0;
        let mut sizes = Vec::new();
        for b in &plan.batches {
            assert_eq!(b.start, expect);
            assert!(b.end > b.start);
            expect = b.end;
            let mut used = 0;
            for p in &plan.pieces[b.clone()] {
                assert_eq!(p.at, used, "pieces are packed");
                used += p.len;
            }
            assert!(used <= buffer.max(1));
            sizes.push(used);
        }
        assert_eq!(expect, plan.pieces.len());
        sizes
    }

    #[test]
    fn plans_cover_every_byte_once() {
        for parties in [1, 2, 16] {
            check(&[], 4096, parties);
            check(&[1], 4096, parties);
            check(&[4096], 4096, parties);
            check(&[4097], 4096, parties);
            check(&[1, 1, 1, 4095, 1, 8192, 3, 10000, 4096], 4096, parties);
            check(&[0, 5, 0], 4096, parties);
            check(&[5 * 4096 + 7], 4096, parties);
            check(&[3000, 3000, 3000], 4096, parties);
            check(&[1 << 20], 4096, parties);
            check(&[1 << 20], 1, parties);
            check(&[7 << 20, 1, 3 << 20], 4 << 20, parties);
        }
        assert_eq!(
            check(&[1, 2, 3], 4096, 16),
            [6],
            "small ranges share a buffer"
        );
        assert_eq!(
            check(&[4096], 4096, 16),
            [4096],
            "batches of one buffer at most"
        );
    }

    #[test]
    fn a_copy_of_a_buffer_or_less_is_spread_over_the_threads() {
        const MIB: usize = 1 << 20;
        let sizes = check(&[MIB], 4 * MIB, 16);
        assert!(sizes.len() >= 4, "{sizes:?}");
        assert!(sizes
            .iter()
            .all(|&s| s >= MIN_BATCH || s == *sizes.last().unwrap()));
        assert!(sizes.iter().all(|&s| s <= MIB / 4), "{sizes:?}");
        // One thread: still graded, the first batch short.
        let sizes = check(&[4 * MIB], 4 * MIB, 1);
        assert_eq!(
            sizes[0],
            MIB / 4,
            "a sixteenth of a buffer at most: {sizes:?}"
        );
        // Nothing smaller than the smallest batch is cut, nor left over at the end.
        assert_eq!(check(&[100 << 10], 4 * MIB, 16), [100 << 10]);
        assert_eq!(check(&[(128 << 10) + 1], 4 * MIB, 16), [(128 << 10) + 1]);
        for len in [MIB + 1, 3 * MIB + 4095, 9 * MIB + 7, 130 * MIB + 1] {
            let sizes = check(&[len], 4 * MIB, 16);
            assert!(*sizes.last().unwrap() >= MIN_BATCH, "{len}: {sizes:?}");
        }
    }

    #[test]
    fn large_copies_grow_by_a_quarter_then_shrink_by_a_fifth() {
        const MIB: usize = 1 << 20;
        let buffer = 4 * MIB;
        let sizes = check(&[128 * MIB], buffer, 16);
        assert_eq!(sizes[0], buffer / 16);
        let top = sizes
            .iter()
            .position(|&s| s == buffer)
            .expect("reaches a buffer");
        for w in sizes[..=top].windows(2) {
            assert!(w[1] > w[0] && w[1] <= w[0] + w[0] / 4 + 1, "{sizes:?}");
        }
        // Down to the first batch's size; the last takes what is left with it (less than
        // the smallest batch would be left otherwise).
        let last = sizes.iter().rposition(|&s| s == buffer).unwrap();
        let n = sizes.len();
        for w in sizes[last..n - 1].windows(2) {
            assert!(w[1] <= w[0], "{sizes:?}");
        }
        assert!(sizes[n - 2] <= buffer / 16, "{sizes:?}");
        assert!(sizes[n - 1] < buffer / 16 + MIN_BATCH, "{sizes:?}");
        // Most of the bytes move in whole buffers.
        let whole: usize = sizes.iter().filter(|&&s| s == buffer).sum();
        assert!(whole >= 88 * MIB, "{whole}");
    }

    #[test]
    fn a_party_that_panics_stops_the_others() {
        let pipe = Pipeline::new(2, false);
        let outcome = std::thread::scope(|s| {
            let waiter = s.spawn(|| pipe.wait_turn(0, 1));
            let taker = s.spawn(|| pipe.pop());
            let panicked = s
                .spawn(|| {
                    let _stop = StopOnPanic(&pipe);
                    panic!("a copy thread's bug");
                })
                .join();
            (panicked.is_err(), waiter.join(), taker.join())
        });
        assert!(outcome.0, "the party panicked");
        assert!(
            !outcome.1.expect("the waiter returned"),
            "its turn never comes"
        );
        assert_eq!(outcome.2.expect("the taker returned"), None);
        assert!(pipe.result().is_err());
    }

    #[test]
    fn configuration_from_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let mut w = Vec::new();
        let c = StagingConfig::from_lookup(
            env(&[(STREAMS_ENV, "2"), (BUFFER_ENV, "1M"), (THREADS_ENV, "3")]),
            &mut w,
        );
        assert!(w.is_empty(), "{w:?}");
        assert_eq!((c.streams, c.buffer_bytes, c.threads), (2, 1 << 20, 3));
        assert_eq!(c.buffers, 3 + 2 * 2);
        assert_eq!(c.pinned_bytes(), 7 << 20);
        let d = StagingConfig::default();
        let c = StagingConfig::from_lookup(
            env(&[
                (STREAMS_ENV, "0"),
                (BUFFER_ENV, "huge"),
                (THREADS_ENV, "-1"),
            ]),
            &mut w,
        );
        assert_eq!(c, d);
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[0].contains("CUDAW_STAGING_STREAMS=\"0\""), "{w:?}");
        assert!(w
            .iter()
            .any(|m| m.contains("CUDAW_STAGING_BUFFER=\"huge\"")));
        assert_eq!(StagingConfig::new(1, 5000, 1).buffer_bytes, 8192);
        // Streaming stores into the buffers: off unless asked.
        assert!(!d.streaming_in);
        let mut w = Vec::new();
        assert!(StagingConfig::from_lookup(env(&[(STREAMING_IN_ENV, "on")]), &mut w).streaming_in);
        assert!(StagingConfig::from_lookup(env(&[(PROFILE_ENV, "on")]), &mut w).profile);
        assert!(!StagingConfig::from_lookup(env(&[]), &mut w).profile);
        assert!(
            !StagingConfig::from_lookup(env(&[(STREAMING_IN_ENV, "yes")]), &mut w).streaming_in
        );
        assert_eq!(w.len(), 1, "{w:?}");
    }

    #[test]
    fn the_staged_copy_threshold_from_the_environment() {
        let read = |v: &'static str, w: &mut Vec<String>| {
            StagingConfig::from_lookup(|k| (k == COPY_MIN_ENV).then(|| v.to_owned()), w).copy_min
        };
        let mut w = Vec::new();
        assert_eq!(StagingConfig::default().copy_min, Some(DEFAULT_COPY_MIN));
        assert_eq!(read("", &mut w), Some(DEFAULT_COPY_MIN));
        assert_eq!(read("256K", &mut w), Some(256 << 10));
        assert_eq!(read(" 4096 ", &mut w), Some(4096));
        assert_eq!(read("0", &mut w), Some(1), "0 stages every copy: as 1");
        assert_eq!(read("off", &mut w), None);
        assert_eq!(read("OFF", &mut w), None);
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(read("big", &mut w), Some(DEFAULT_COPY_MIN));
        assert_eq!(
            w,
            ["CUDAW_STAGED_COPY_MIN=\"big\" is neither a size (like 1M or 262144) nor `off`; using 1024K"]
        );
    }

    #[test]
    fn kept_host_copies_are_reused_by_size() {
        let mut w = WarmPool::default();
        let mk = |n: usize| {
            let mut v = Vec::new();
            v.try_reserve_exact(n).unwrap();
            v.resize(n, 1u8);
            v
        };
        w.put(mk(4 << 20));
        w.put(mk(8 << 20));
        w.put(mk(4 << 20));
        w.put(mk(4096)); // too small to keep
        assert_eq!(w.bytes, 16 << 20);
        // The same size, then one a little smaller; never one much larger.
        let a = w.take(4 << 20).expect("a 4 MiB one");
        assert!(a.is_empty() && a.capacity() >= 4 << 20);
        assert!(w.take(15 << 19).is_some_and(|v| v.capacity() == 8 << 20)); // 7.5 MiB
        assert!(
            w.take(1 << 20).is_none(),
            "4 MiB is far more than 1 MiB needs"
        );
        assert!(w.take(4 << 20).is_some());
        assert!(w.take(4 << 20).is_none());
        assert_eq!(w.bytes, 0);
        // Reused memory (lazily freed meanwhile) takes and keeps new bytes.
        let mut v = a;
        v.resize(4 << 20, 0xAB);
        assert!(v.iter().all(|&b| b == 0xAB));
        // The switch.
        let mut warnings = Vec::new();
        let off = StagingConfig::from_lookup(
            |k| (k == REUSE_ENV).then(|| "off".to_owned()),
            &mut warnings,
        );
        assert!(!off.reuse_host && StagingConfig::default().reuse_host && warnings.is_empty());
        let bad = StagingConfig::from_lookup(
            |k| (k == REUSE_ENV).then(|| "maybe".to_owned()),
            &mut warnings,
        );
        assert!(bad.reuse_host && warnings.iter().any(|w| w.contains(REUSE_ENV)));
        // The arena's switch, the same way.
        let arena = |v: &'static str, w: &mut Vec<String>| {
            StagingConfig::from_lookup(|k| (k == ARENA_ENV).then(|| v.to_owned()), w).host_arena
        };
        let mut w = Vec::new();
        assert!(arena("pinned", &mut w) && !arena("off", &mut w) && !arena("", &mut w));
        assert!(w.is_empty(), "{w:?}");
        assert!(!arena("pinnned", &mut w));
        assert!(
            w[0].contains("is neither `pinned` nor `off`; using off"),
            "{w:?}"
        );
    }

    #[test]
    fn streaming_copies_are_exact_at_every_alignment() {
        let src: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
        for (from, to, len) in [
            (0, 0, 5000),
            (1, 3, 4000),
            (5, 0, 300),
            (7, 9, 255),
            (3, 1, 4096),
        ] {
            let mut dst = vec![0xEEu8; 5100];
            // SAFETY: both ranges are inside their vectors.
            unsafe { copy_streaming(src.as_ptr().add(from), dst.as_mut_ptr().add(to), len) };
            assert_eq!(
                &dst[to..to + len],
                &src[from..from + len],
                "{from} {to} {len}"
            );
            assert!(dst[..to].iter().chain(&dst[to + len..]).all(|&b| b == 0xEE));
        }
    }

    #[test]
    fn prefault_writes_only_inside_the_range() {
        let mut v = vec![7u8; 5 * PAGE];
        // SAFETY: a range inside `v`, which only this thread uses.
        unsafe { prefault(v.as_mut_ptr().add(100), 3 * PAGE) };
        assert!(v[..100].iter().all(|&b| b == 7));
        assert!(v[100 + 3 * PAGE..].iter().all(|&b| b == 7));
    }
}

//! A program's copies between device memory and its pageable host memory, through the
//! pinned staging pause and resume use ([`crate::staging::copy_pageable`]).
//!
//! A copy from or to memory the driver does not know (`malloc`, `std::vector`, a NumPy
//! array) goes through the driver's own small staging buffer one piece at a time:
//! 8.3 GB/s host to device and 3.3 GB/s device to host on an H100, against 51 GiB/s from
//! page-locked memory. cudaw's pool ([`driver::PinnedStaging`]) copies on several host
//! threads into pinned buffers while the DMA engines move the previous ones, on several
//! streams.
//!
//! **Which calls.** The runtime shim's `cudaMemcpy`, `cudaMemcpyAsync` and their `_ptds` /
//! `_ptsz` forms (and so `cudaMemcpyDefault` with one host side): a copy of at least
//! [`min_bytes`] (`CUDAW_STAGED_COPY_MIN`, default 1 MiB; `off` turns this off; smart
//! pinning counts copies from 1 MiB whatever it is, [`considered_bytes`]) whose device
//! side lies inside one resident allocation of cudaw's and whose host side the driver
//! answers `CUDA_ERROR_INVALID_VALUE` for (`cuPointerGetAttribute`: pageable). Everything
//! else goes to the real runtime as before: smaller copies (one compare, nothing more),
//! page-locked (`cudaMallocHost`, `cudaHostRegister`) and managed memory, device memory
//! cudaw did not allocate, 2D/3D copies, the driver API's copies, and a stream being
//! captured into a graph (the shim asks `cudaStreamIsCapturing` first: an event recorded
//! there would become a node of the graph).
//!
//! **Semantics** (CUDA's "API synchronization behavior"): the copy is ordered after the
//! work queued before it on its stream (an event recorded on the program's stream, which
//! the pool's streams wait for; `cudaMemcpy`'s stream is the legacy default stream, or the
//! thread's default stream for `_ptds`, so the legacy stream's implicit ordering with the
//! blocking streams holds too). A copy to pageable memory returns once the bytes are in
//! the host buffer, `cudaMemcpyAsync` too. `cudaMemcpy` from pageable memory returns once
//! the copy is done (the runtime promises only that the source may be reused; done is
//! stricter and what programs expect). `cudaMemcpyAsync` from pageable memory returns once
//! every byte is in a pinned buffer (no device synchronisation where the copy fits the
//! pool; a larger one waits, as the driver's own staging does): the program's stream is
//! made to wait for the pool's last copies, so its later work sees the bytes.
//!
//! **Errors.** Whatever cudaw cannot do, or finds failing, the real runtime does: a copy
//! that could not be ordered after its stream, or that failed once under way (after
//! waiting for everything it issued, so that no copy of cudaw's lands afterwards), is
//! handed to the real runtime, which copies or reports the error exactly as it would have
//! (its return value, its last error). Invalid pointers and directions never reach the
//! staging: they fail the checks above and go to the real runtime.
//!
//! **Pause.** A staged copy is a wrapped call in flight ([`crate::inflight`]): a pause
//! waits for it as for any call, before it takes the staging for its own copies, and its
//! device synchronisation waits for the pool's streams. The copy never waits for the
//! pause while holding the staging (it is already past the gate), so neither waits for the
//! other.

use crate::log;
use crate::memory;
use crate::pinning::Held;
pub use cudaw_pin::Cuts;
use driver::{Completion, DriverBackend, MemoryType, PageableCopy, PageableCopyError, Stream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// `cudaMemcpyHostToDevice`.
const HOST_TO_DEVICE: i32 = 1;
/// `cudaMemcpyDeviceToHost`.
const DEVICE_TO_HOST: i32 = 2;
/// `cudaMemcpyDefault`.
const DEFAULT: i32 = 4;

/// [`min_bytes`] before it is read from the configuration.
const UNREAD: usize = 0;
/// [`min_bytes`] when staged copies are off.
const OFF: usize = usize::MAX;

static MIN_BYTES: AtomicUsize = AtomicUsize::new(UNREAD);

/// Copies that went through the staging, and their bytes.
static STAGED_COPIES: AtomicU64 = AtomicU64::new(0);
static STAGED_BYTES: AtomicU64 = AtomicU64::new(0);

/// Copies that went through the pinned staging so far, and their bytes (the exit summary;
/// the seam for statistics).
pub fn staged() -> (u64, u64) {
    (
        STAGED_COPIES.load(Ordering::Relaxed),
        STAGED_BYTES.load(Ordering::Relaxed),
    )
}

/// The smallest copy that may be staged (`CUDAW_STAGED_COPY_MIN`); `usize::MAX` when off.
/// A relaxed load: the shim compares every copy's size with it first.
#[inline]
pub fn min_bytes() -> usize {
    match MIN_BYTES.load(Ordering::Relaxed) {
        UNREAD => read_min_bytes(),
        n => n,
    }
}

/// The smallest copy the shim hands to [`copy`]: [`min_bytes`], or smart pinning's
/// smallest ([`crate::pinning::MIN_BYTES`]) where it is on and lower. A copy below
/// [`min_bytes`] is counted for pinning there and goes to the driver until it is pinned:
/// below the crossover the driver's own path is the faster (1 MiB on an H200: 0.17 ms
/// natively, 0.21 ms staged).
#[inline]
pub fn considered_bytes() -> usize {
    min_bytes().min(crate::pinning::considers())
}

#[cold]
fn read_min_bytes() -> usize {
    let n = crate::config::get()
        .staging
        .copy_min
        .map_or(OFF, |n| n.max(1));
    // A concurrent `turn_off` wins.
    match MIN_BYTES.compare_exchange(UNREAD, n, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => n,
        Err(now) => now,
    }
}

/// No copy is staged from now on.
fn turn_off() {
    MIN_BYTES.store(OFF, Ordering::Relaxed);
}

/// A program's copy, as its runtime call gave it.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    /// The destination pointer the program passed.
    pub dst: u64,
    /// The source pointer the program passed.
    pub src: u64,
    /// Bytes.
    pub len: usize,
    /// The `cudaMemcpyKind`.
    pub kind: i32,
    /// The driver's name for the copy's stream: the program's stream, or
    /// [`Stream::LEGACY`] / [`Stream::PER_THREAD`] for its default stream.
    pub stream: Stream,
    /// `cudaMemcpyAsync` (else `cudaMemcpy`).
    pub asynchronous: bool,
}

/// What became of a [`Request`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// cudaw copied it: the call returns success.
    Copied,
    /// The real runtime is to do it (or to report why not).
    Forward,
    /// The real runtime is to do it as one synchronous copy per piece (the host side
    /// spans registrations of cudaw's, and the driver copies at pinned speed only inside
    /// one), in order, the first failure returned.
    Split(Cuts),
}

/// Where a copy's host memory stands (see [`host_memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostMemory {
    /// Unknown to the driver: the copy goes through the pinned staging (or, once hot,
    /// smart pinning page-locks it).
    Pageable,
    /// Pageable, but an edge page of it lies in a pinned neighbour's registration: as
    /// [`HostMemory::Pageable`], and a copy handed to the driver goes in pieces, each
    /// inside one registration or outside all (the driver refuses a copy straddling the
    /// border).
    Straddling(Cuts),
    /// Page-locked by smart pinning: the driver's path for a synchronous copy (one copy per
    /// registration it spans), the staging for an asynchronous one (pageable memory's
    /// promises).
    PinnedByCudaw(Cuts),
    /// Page-locked, managed or device memory, or the driver could not say: the driver's
    /// own path.
    DriverPath,
}

/// Copies `req` through the pinned staging if it qualifies (see the module
/// documentation); `may_order()` is asked, last, whether the copy's stream may be given
/// an event (false while it is being captured into a graph).
///
/// # Safety
/// The request is a runtime copy call's arguments, as the program passed them: its host
/// side is valid for `len` bytes as the runtime's contract demands.
pub unsafe fn copy(req: Request, may_order: impl FnOnce() -> bool) -> Outcome {
    let Some((backend, copy)) = qualify(&req) else {
        return Outcome::Forward;
    };
    let host = match copy {
        PageableCopy::ToDevice { src, .. } => src as u64,
        PageableCopy::ToHost { dst, .. } => dst as u64,
    };
    // A synchronous copy from or to a range cudaw page-locked goes to the driver, at pinned
    // speed. An asynchronous one keeps pageable memory's promises (the source reusable, the
    // result there, when the call returns): it goes through the staging, as before pinning.
    let (pinned, borders) = match host_memory(backend, host, req.len) {
        HostMemory::Pageable => (false, None),
        HostMemory::Straddling(cuts) => (false, Some(cuts)),
        HostMemory::PinnedByCudaw(cuts) if !req.asynchronous => return direct(cuts),
        HostMemory::PinnedByCudaw(cuts) => (true, Some(cuts)),
        HostMemory::DriverPath => return Outcome::Forward,
    };
    // What the real runtime is handed when cudaw does not copy it: a copy straddling a
    // registration's border in pieces.
    let forward = || borders.map_or(Outcome::Forward, direct);
    // The default streams are the current context's: the allocation's context must be.
    if (req.stream == Stream::LEGACY || req.stream == Stream::PER_THREAD)
        && backend.driver().ctx_get_current().ok() != Some(backend.context())
    {
        return forward();
    }
    if !may_order() {
        if pinned || borders.is_some() {
            // Captured into a graph: as the pageable memory it was (the runtime refuses or
            // copies it as it would have), every registration of cudaw's it touches taken
            // back, so that no node of the graph copies from memory cudaw unpins later.
            crate::pinning::release(host, req.len as u64, true);
        }
        return Outcome::Forward;
    }
    // Hot enough to page-lock in place (smart pinning): the driver copies it from now on
    // (its synchronous copies; this one too, if it is one).
    if !pinned {
        if let Some(cuts) = crate::pinning::decide(backend, host, req.len) {
            if !req.asynchronous {
                return direct(cuts);
            }
        }
    }
    // Counted for pinning only: below the staged copies' threshold the driver's own path
    // is the faster one.
    if req.len < min_bytes() {
        return forward();
    }
    let completion = match (copy, req.asynchronous) {
        (PageableCopy::ToDevice { .. }, true) => Completion::Staged,
        _ => Completion::Done,
    };
    // SAFETY: the host range is the program's, valid for the call (the caller's
    // contract); the device range lies inside one of the backend's allocations
    // (`qualify`).
    match unsafe { crate::staging::copy_pageable(backend, copy, req.stream, completion) } {
        Ok(()) => {
            STAGED_COPIES.fetch_add(1, Ordering::Relaxed);
            STAGED_BYTES.fetch_add(req.len as u64, Ordering::Relaxed);
            Outcome::Copied
        }
        Err(e @ PageableCopyError::NoPool(_)) => {
            turn_off();
            log::warn(format_args!(
                "staged copies: {e}; copies with pageable host memory take the driver's path from now on"
            ));
            forward()
        }
        Err(e @ PageableCopyError::NotStarted(_)) => {
            log::debug(format_args!(
                "staged copy of {} bytes: {e}; handed to the real runtime",
                req.len
            ));
            forward()
        }
        Err(e @ PageableCopyError::Failed(_)) => {
            log::warn(format_args!(
                "staged copy of {} bytes: {e}; handed to the real runtime, which copies or reports the error",
                req.len
            ));
            forward()
        }
    }
}

/// For a copy cudaw hands to the real runtime without looking further (below the staged
/// copies' size, or not between its memory and the host): where its host side crosses a
/// border of smart pinning's registrations, if it does (the driver copies page-locked
/// memory only inside one registration). Relaxed loads while nothing pinned is near.
pub fn forward_cuts(dst: u64, src: u64, len: usize) -> Option<Cuts> {
    [src, dst]
        .into_iter()
        .find_map(|host| crate::pinning::crossing(host, len))
}

/// Before a copy cudaw hands on without cutting it (2D, to or from a symbol): the
/// registrations of smart pinning `[host, host + len)` touches are unpinned first where
/// the driver would not treat the copy as the pageable one the program made. A copy that
/// crosses a border: the driver refuses one that starts inside a registration and runs
/// past it (`invalid argument`, seen on an H200). An asynchronous copy touching one at
/// all: page-locked, it would run truly asynchronously, where pageable memory promises
/// the source read (to the device) or the result there (to the host) when the call
/// returns. Relaxed loads while nothing pinned is near.
pub fn unpin_crossing(host: u64, len: usize, asynchronous: bool) {
    if len == 0 {
        return;
    }
    let unpin = if asynchronous {
        crate::pinning::touching(host, len)
    } else {
        crate::pinning::crossing(host, len).is_some()
    };
    if unpin {
        crate::pinning::release(host, len as u64, true);
    }
}

/// The bytes a 2D copy's side spans from its start: `height` rows of `width` bytes,
/// `pitch` apart (0 when empty).
pub fn extent_2d(pitch: usize, width: usize, height: usize) -> usize {
    if height == 0 || width == 0 {
        return 0;
    }
    pitch.saturating_mul(height - 1).saturating_add(width)
}

/// A synchronous copy from or to memory cudaw page-locked: the driver's, in one piece per
/// registration.
fn direct(cuts: Cuts) -> Outcome {
    if cuts.is_none() {
        Outcome::Forward
    } else {
        Outcome::Split(cuts)
    }
}

/// The device whose memory `req` copies, and the copy in device addresses, when its
/// direction is one this module takes and its device side lies inside one resident
/// allocation of cudaw's. The host side is not looked at (but for being non-null).
fn qualify(req: &Request) -> Option<(&'static DriverBackend, PageableCopy)> {
    let to_device = match req.kind {
        HOST_TO_DEVICE => true,
        DEVICE_TO_HOST => false,
        // A host side and one allocation of cudaw's; two of cudaw's is a device copy.
        DEFAULT => match (memory::lookup(req.dst), memory::lookup(req.src)) {
            (Some(_), None) => true,
            (None, Some(_)) => false,
            _ => return None,
        },
        _ => return None,
    };
    let (device, host) = if to_device {
        (req.dst, req.src)
    } else {
        (req.src, req.dst)
    };
    if host == 0 {
        return None;
    }
    let (mem, a) = memory::lookup(device)?;
    let len = req.len as u64;
    let inside = device
        .checked_sub(a.base)
        .filter(|&off| off.checked_add(len).is_some_and(|end| end <= a.size))?;
    if !a.residency.is_resident() || a.backing == 0 {
        return None;
    }
    let addr = a.backing + inside;
    let copy = if to_device {
        PageableCopy::ToDevice {
            dst: addr,
            src: host as *const u8,
            len: req.len,
        }
    } else {
        PageableCopy::ToHost {
            dst: host as *mut u8,
            src: addr,
            len: req.len,
        }
    };
    Some((mem.vmm.backend(), copy))
}

/// Where the host side of a copy of at least [`min_bytes`] whose device side is cudaw's
/// stands: pageable (the staging's, or smart pinning's to page-lock once hot), page-locked
/// by smart pinning ([`crate::pinning`]), or anything else the driver knows (its path).
pub fn host_memory(backend: &'static DriverBackend, host: u64, len: usize) -> HostMemory {
    match backend.driver().pointer_memory_type(host) {
        Ok(MemoryType::Pageable) => match crate::pinning::crossing(host, len) {
            Some(borders) => HostMemory::Straddling(borders),
            None => HostMemory::Pageable,
        },
        Ok(MemoryType::Host) => match crate::pinning::pinned_by_cudaw(host, len) {
            Held::Whole(cuts) => HostMemory::PinnedByCudaw(cuts),
            // Its first page is a pinned neighbour's: pageable memory still, and maybe
            // hot enough to pin the rest of.
            Held::Part(borders) => HostMemory::Straddling(borders),
            Held::No => HostMemory::DriverPath,
        },
        Ok(MemoryType::Other(_)) | Err(_) => HostMemory::DriverPath,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_is_read_once_and_turned_off_for_good() {
        // The configuration's default (the test process has no CUDAW_STAGED_COPY_MIN).
        let first = min_bytes();
        assert!(first >= 1);
        assert_eq!(min_bytes(), first);
        turn_off();
        assert_eq!(min_bytes(), OFF);
        assert_eq!(read_min_bytes(), OFF, "a turned-off feature stays off");
    }

    #[test]
    fn directions_other_than_host_and_device_are_not_taken() {
        for kind in [0, 3, 5, -1] {
            let req = Request {
                dst: 0x1000,
                src: 0x2000,
                len: 1 << 20,
                kind,
                stream: Stream::LEGACY,
                asynchronous: false,
            };
            assert!(qualify(&req).is_none(), "kind {kind}");
        }
    }

    #[test]
    fn a_2d_copy_spans_its_last_row_whole_and_the_pitch_before() {
        assert_eq!(extent_2d(1024, 100, 1), 100);
        assert_eq!(extent_2d(1024, 100, 3), 2 * 1024 + 100);
        assert_eq!(extent_2d(1024, 0, 3), 0);
        assert_eq!(extent_2d(1024, 100, 0), 0);
        assert_eq!(extent_2d(usize::MAX, 2, 3), usize::MAX);
        // Nothing pinned: nothing to do, and no panic for any address.
        unpin_crossing(0, usize::MAX, false);
        unpin_crossing(u64::MAX, 1, true);
    }
}

//! The staging pause and resume copy device memory through: one [`PinnedStaging`] for the
//! process (pinned buffers on several streams, host copies on several threads; configured
//! by `CUDAW_STAGING_STREAMS`, `CUDAW_STAGING_BUFFER`, `CUDAW_STAGING_THREADS`). Its pinned
//! pool is made on the first pause, per device, and kept for the next ones.
//!
//! With `CUDAW_HOST_ARENA=pinned`, the control thread starts making a page-locked host arena
//! as large as a device's allocations on a background thread once they have held still for
//! a while ([`prepare_arena`]; a resume does too, [`restored`]); whole-process pauses
//! ([`save_for_pause`]) leave the bytes there
//! ([`vmm::HostCopy::Retained`]) and resumes load them from there. Dumps read them with
//! [`with_retained`]; when the bytes move to an image the arena forgets them ([`forget`]).
//! The driver-level handles' ranges ([`crate::handles`]) go there the same way, under ids
//! of their own that never meet the VMM's (`crate::handles::is_range_id`); the arena's
//! size counts them.

use crate::log;
use driver::{
    Completion, DriverBackend, PageableCopy, PageableCopyError, PinnedStaging, Retaining, Stream,
};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;
use vmm::{HostCopy, LoadRange, Staging, StagingError, StagingRange};

static STAGING: OnceLock<Mutex<PinnedStaging>> = OnceLock::new();

/// A handle on the process's staging; each save or load takes it for its duration, so a
/// handle may be made anywhere (also while another is alive, as in pause's rollback).
#[derive(Debug)]
pub struct ProcessStaging(());

/// The staging to evict and restore through.
pub fn staging() -> ProcessStaging {
    ProcessStaging(())
}

fn staging_mutex() -> &'static Mutex<PinnedStaging> {
    STAGING.get_or_init(|| Mutex::new(PinnedStaging::new(crate::config::get().staging)))
}

/// Saves a batch of a whole-process pause: into the host arena where there is one (see
/// the module documentation), else as [`ProcessStaging`] does.
pub fn save_for_pause(
    backend: &DriverBackend,
    ranges: &[StagingRange],
) -> Result<Vec<HostCopy>, StagingError> {
    with(backend, |s| {
        let waited = s.arena_status(backend).building > 0;
        let started = Instant::now();
        s.wait_for_arena(backend);
        if waited {
            log::info(format_args!(
                "pause: waited {:.1} ms for the host arena of device {} to be made",
                started.elapsed().as_secs_f64() * 1e3,
                backend.device()
            ));
        }
        Retaining(s).save(backend, ranges)
    })
}

/// Waits for the host arenas being made in the background: before the driver checkpoints
/// the process (`pause --release`), no thread of cudaw's may be inside the driver.
pub fn finish_arena_builds() {
    wait_prepared();
    if let Some(s) = STAGING.get() {
        s.lock().finish_all_builds();
    }
}

/// Allocations of the device the host arena holds now, of those `counted` says yes to (the
/// VMM's, or the driver handles' ranges).
pub fn retained_count(
    backend: &DriverBackend,
    counted: impl Fn(vmm::AllocationId) -> bool,
) -> usize {
    STAGING.get().map_or(0, |s| {
        s.lock()
            .retained_ids(backend)
            .into_iter()
            .filter(|&id| counted(id))
            .count()
    })
}

/// Every allocation of `backend`'s device is back on the device: the arena forgets what it
/// held, and, with `CUDAW_HOST_ARENA=pinned`, starts making an arena of `demand` bytes in
/// the background if it has none that large (`demand` 0: only forget). What `owed` says
/// yes to stays: the ranges of driver handles still evicted (a restore loads the VMM's
/// allocations before the handles; a handle that failed to come back is loaded by the next
/// resume), which the handles forget once loaded (`crate::handles::in_arena` lists them:
/// ask it before calling, as its table's lock comes before the staging's).
pub fn restored(backend: &DriverBackend, demand: u64, owed: impl Fn(vmm::AllocationId) -> bool) {
    let Some(m) = STAGING.get() else { return };
    let mut s = m.lock();
    let kept = s.forget_all_but(backend, owed);
    if kept > 0 {
        log::debug(format_args!(
            "host arena for device {}: {kept} ranges of driver handles not back yet kept",
            backend.device()
        ));
    }
    start_arena(&mut s, backend, demand);
}

/// With `CUDAW_HOST_ARENA=pinned`, while the program runs: starts making a host arena of
/// `demand` bytes (what the device's allocations need now) in the background if there is
/// none that large, so that even the first pause copies straight into page-locked memory.
pub fn prepare_arena(backend: &DriverBackend, demand: u64) {
    start_arena(&mut staging_mutex().lock(), backend, demand);
}

fn start_arena(s: &mut PinnedStaging, backend: &DriverBackend, demand: u64) {
    let device = backend.device();
    let started = s.start_arena(
        backend,
        demand,
        Box::new(move |r| match r {
            Ok(t) => log::info(format_args!(
                "host arena for device {device}: {demand} bytes ({} MiB) page-locked, ready in {:.1} ms",
                demand >> 20,
                t.as_secs_f64() * 1e3
            )),
            Err(e) => log::warn(format_args!(
                "host arena for device {device}: {e}; pauses copy through host memory"
            )),
        }),
    );
    if started {
        log::info(format_args!(
            "host arena for device {device}: making {demand} bytes page-locked in the background"
        ));
    }
    for note in s.take_notes() {
        log::warn(format_args!("staging: {note}"));
    }
}

/// Runs `f` on the bytes the host arena holds for allocation `id` of `backend`'s device
/// (a dump writes them from there); `None` if it holds none. The staging is locked during
/// `f`: keep it to plain I/O.
pub fn with_retained<R>(
    backend: &DriverBackend,
    id: vmm::AllocationId,
    f: impl FnOnce(&[u8]) -> R,
) -> Option<R> {
    let s = STAGING.get()?.lock();
    s.retained(backend, id).map(f)
}

/// The host arena forgets allocation `id` (its bytes now live in an image).
pub fn forget(backend: &DriverBackend, id: vmm::AllocationId) {
    if let Some(s) = STAGING.get() {
        s.lock().forget(backend, id);
    }
}

/// Copies between device memory and a program's pageable host memory through the pinned
/// pool ([`PinnedStaging::copy_pageable`]; the decisions are [`crate::pageable`]'s). The
/// pool is the pauses' own: a copy holds it for its duration, and a pause takes it only
/// once the calls in flight, this copy among them, have left.
///
/// # Safety
/// As [`PinnedStaging::copy_pageable`].
pub unsafe fn copy_pageable(
    backend: &DriverBackend,
    copy: PageableCopy,
    stream: Stream,
    completion: Completion,
) -> Result<(), PageableCopyError> {
    // SAFETY: forwarded from the caller.
    with(backend, |s| unsafe {
        s.copy_pageable(backend, copy, stream, completion)
    })
}

/// With smart pinning on (`CUDAW_PIN`: the program copies pageable memory, or cudaw was
/// asked to care), the pinned staging of `backend`'s device is made now on a thread of its
/// own, rather than by the first staged copy, inside the program's time (7 ms on an H200
/// host). A copy that comes meanwhile waits for it, as it would have made it.
///
/// Whether a thread was started: the caller then registers an exit handler that runs
/// before the runtime's teardown and waits for it ([`wait_prepared`]).
pub fn prepare_in_background(backend: &'static DriverBackend) -> bool {
    let cfg = crate::config::get();
    if cfg.pin == cudaw_pin::Mode::Off || cfg.staging.copy_min.is_none() {
        return false;
    }
    PREPARING.fetch_add(1, Ordering::SeqCst);
    let started = std::thread::Builder::new()
        .name("cudaw-staging".into())
        .spawn(move || {
            crate::boundary::guard("making the pinned staging", (), || with(backend, |_| ()));
            PREPARING.fetch_sub(1, Ordering::SeqCst);
        });
    match started {
        Ok(_) => true,
        Err(e) => {
            PREPARING.fetch_sub(1, Ordering::SeqCst);
            log::debug(format_args!(
                "pinned staging: no thread to make it ahead ({e}); the first staged copy makes it"
            ));
            false
        }
    }
}

/// Stagings being made by [`prepare_in_background`].
static PREPARING: AtomicUsize = AtomicUsize::new(0);

/// In the child of a fork: the threads making stagings are the parent's. An atomic store
/// (async-signal-safe).
pub fn forked() {
    PREPARING.store(0, Ordering::SeqCst);
}

/// Waits (at most 2 s) for a staging [`prepare_in_background`] is making: at exit, so that
/// its driver calls are not under way while the runtime tears the context down, and before
/// the driver checkpoints the process ([`finish_arena_builds`]).
pub fn wait_prepared() {
    let deadline = Instant::now() + std::time::Duration::from_secs(2);
    while PREPARING.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

fn with<R>(backend: &DriverBackend, f: impl FnOnce(&mut PinnedStaging) -> R) -> R {
    let mut s = staging_mutex().lock();
    if !s.is_prepared(backend) {
        let started = Instant::now();
        let c = *s.config();
        match s.prepare(backend) {
            Ok(()) => log::info(format_args!(
                "pinned staging for device {}: {} streams, {} buffers of {} KiB ({} MiB pinned), {} threads, ready in {:.1} ms",
                backend.device(),
                c.streams,
                c.buffers,
                c.buffer_bytes >> 10,
                c.pinned_bytes() >> 20,
                c.threads,
                started.elapsed().as_secs_f64() * 1e3
            )),
            Err(e) => log::warn(format_args!("pinned staging for device {}: {e}", backend.device())),
        }
    }
    let r = f(&mut s);
    for note in s.take_notes() {
        log::warn(format_args!("staging: {note}"));
    }
    r
}

impl Staging<DriverBackend> for ProcessStaging {
    fn save(
        &mut self,
        backend: &DriverBackend,
        ranges: &[StagingRange],
    ) -> Result<Vec<HostCopy>, StagingError> {
        with(backend, |s| s.save(backend, ranges))
    }

    fn load(
        &mut self,
        backend: &DriverBackend,
        ranges: &[LoadRange<'_>],
    ) -> Result<(), StagingError> {
        with(backend, |s| s.load(backend, ranges))
    }

    fn recycle(&mut self, copies: Vec<Vec<u8>>) {
        staging_mutex().lock().recycle(copies);
    }
}

/// Bytes of page-locked host arena made (`CUDAW_HOST_ARENA=pinned`), and being made.
pub fn arena_bytes() -> (u64, u64) {
    STAGING.get().map_or((0, 0), |s| {
        let mut s = s.lock();
        s.install_finished_arenas();
        let (made, building) = s.arena_bytes();
        (made as u64, building as u64)
    })
}

/// Host memory kept from the last resume for the next pause (bytes of capacity).
pub fn kept_host() -> usize {
    STAGING.get().map_or(0, |s| s.lock().warm_bytes())
}

/// After a whole pause: frees the kept host copies it did not reuse (the program's
/// allocations changed since the last resume), so that they are not held beside the new
/// ones while the process stays paused. Returns how many bytes of kept host memory the
/// pause wrote into.
pub fn pause_done() -> usize {
    let Some(s) = STAGING.get() else { return 0 };
    let mut s = s.lock();
    let unused = s.warm_bytes();
    s.drop_warm();
    if unused > 0 {
        log::debug(format_args!(
            "pause: {unused} bytes of kept host memory not reused, freed"
        ));
    }
    s.take_reused()
}

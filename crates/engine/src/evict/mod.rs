//! Eviction and restore: a pause hands the process's device memory back, a resume brings
//! it back at the same addresses.
//!
//! - [`pause`]: close the gate (calls entering the library wait), wait for the calls in
//!   flight to leave ([`crate::inflight`]), synchronise every device with memory of
//!   cudaw's ([`synchronise_all`]), then evict every allocation to host memory and release
//!   the physical memory ([`vmm::Vmm::evict_all`]), then the driver-level handles
//!   ([`crate::handles::evict`]). A failure puts back what was evicted and opens the gate:
//!   the process runs on as before.
//! - [`resume`]: restore every allocation at its address ([`vmm::Vmm::restore_all`]) and
//!   every driver handle, from host memory or from the image a dump left them in
//!   ([`Load`]), synchronise, then open the gate. A failure leaves the process paused.
//!
//! Dump and restore ([`crate::image`]) build on these functions.

mod adapters;

pub(crate) use crate::drain::synchronise_all;
use adapters::Evict;
#[cfg(test)]
pub(crate) use adapters::DEVICE_SHIFT;
pub(crate) use adapters::{image_id, vmm_id, Load};

use crate::failure::{Failure, Report};
use crate::host::host;
use crate::memory::{self, DeviceMemory};
use crate::staging::{self, staging};
use crate::state::Ctl;
use crate::{config, handles, inflight, lifecycle, log};
use cudaw_control::{ErrorKind, Moved, Phase, Progress};
use std::time::Instant;

/// Counts the bytes a phase has moved and reports them.
struct Counter<'r, 'a> {
    report: &'r mut Report<'a>,
    phase: Phase,
    done: u64,
    total: u64,
}

impl<'r, 'a> Counter<'r, 'a> {
    /// Starts counting `total` bytes of `phase` (reported at once, done 0).
    fn start(report: &'r mut Report<'a>, phase: Phase, total: u64) -> Self {
        let mut c = Counter {
            report,
            phase,
            done: 0,
            total,
        };
        c.add(0);
        c
    }

    fn add(&mut self, n: u64) {
        self.done += n;
        (self.report)(Progress {
            phase: self.phase,
            done: self.done,
            total: self.total.max(self.done),
        });
    }
}

/// Pauses; on failure the process runs on as before.
pub(crate) fn pause(mut report: Report<'_>) -> Result<Moved, Failure> {
    let started = Instant::now();
    quiesce(started)?;
    let mut progress = Counter::start(&mut report, Phase::Evict, resident_bytes());
    let (evicted, mut allocations, mut bytes) = evict_devices(&mut progress)?;
    // Driver-level handles (cuMemCreate through the entry points or the driver layer).
    let handles_started = Instant::now();
    let h = match handles::evict(&mut |n| progress.add(n)) {
        Ok(h) => h,
        Err(e) => {
            let msg = format!("evicting driver-level handles failed: {e}; resumed");
            return Err(roll_back_pause(evicted, msg));
        }
    };
    let handles_ms = handles_started.elapsed().as_secs_f64() * 1e3;
    allocations += h.handles;
    bytes += h.bytes;
    let reused = staging::pause_done();
    if reused > 0 {
        log::info(format_args!(
            "pause: {reused} bytes went into host memory kept from the last resume"
        ));
    }
    let mapped: u64 = memory::managed_devices()
        .map(|(_, m)| m.vmm.stats().mapped)
        .sum::<u64>()
        + h.kept_bytes;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    log::info(format_args!(
        "paused: {allocations} allocations, {bytes} bytes evicted in {ms:.1} ms; {mapped} bytes of device memory still mapped (driver handles: {} evicted, {} bytes in {handles_ms:.1} ms, copies {:.1} ms; {} left on the device, {} bytes)",
        h.handles, h.bytes, h.copy_ms, h.kept, h.kept_bytes
    ));
    Ok(Moved {
        allocations: allocations as u64,
        bytes,
        ms,
        changed: true,
    })
}

/// A pause's first step: closes the gate, waits for the calls in flight and for every
/// device to finish its work. Nothing is evicted until both waits are over: on failure the
/// gate opens again and the process runs on as before.
fn quiesce(started: Instant) -> Result<(), Failure> {
    let timeout = config::get().pause_timeout;
    let deadline = timeout.map(|t| started + t);
    host().close_gate();
    let waited = inflight::wait_for_calls_in_flight(started, deadline)
        .map_err(|n| {
            Failure::new(
                ErrorKind::Timeout,
                format!(
                    "{n} call(s) that can put work on the device were still in flight at the pause's deadline (CUDAW_PAUSE_TIMEOUT)"
                ),
            )
        })
        .and_then(|()| synchronise_all(deadline))
        // Exit began while the pause waited: give it up, never evict under a teardown.
        .and_then(|()| {
            if lifecycle::is_exiting() {
                Err(Failure::new(
                    ErrorKind::Failed,
                    "the process began to exit during the pause",
                ))
            } else {
                Ok(())
            }
        });
    let Err(mut e) = waited else { return Ok(()) };
    if e.kind == ErrorKind::Timeout {
        let secs = timeout.map_or(0.0, |t| t.as_secs_f64());
        e.message = format!(
            "{} after {secs:.1} s; the pause was given up and the program runs on (a kernel or copy waiting for something a pause holds back, such as another process's collective, never finishes: pause every rank of a job, or raise CUDAW_PAUSE_TIMEOUT)",
            e.message
        );
    } else {
        e.message.push_str("; resumed");
    }
    log::error(format_args!("pause: {}", e.message));
    host().open_gate();
    Err(e)
}

/// Bytes a pause has to move: the allocations and driver handles on the devices now.
fn resident_bytes() -> u64 {
    memory::managed_devices()
        .map(|(_, m)| m.vmm.stats().resident)
        .sum::<u64>()
        + handles::devices()
            .into_iter()
            .map(|d| handles::counts(d).resident)
            .sum::<u64>()
}

/// The devices a pause has evicted so far, to put back should a later step fail.
type Evicted = Vec<(i32, &'static DeviceMemory)>;

/// Evicts every managed device's allocations: the devices evicted, the allocations and
/// bytes moved. On failure every device is put back and the gate opened.
fn evict_devices(progress: &mut Counter<'_, '_>) -> Result<(Evicted, usize, u64), Failure> {
    let mut evicted: Evicted = Vec::new();
    let (mut allocations, mut bytes) = (0usize, 0u64);
    for (ordinal, m) in memory::managed_devices() {
        m.reap_synchronised();
        match evict_device(m, &mut |n| progress.add(n)) {
            Ok(moved) => {
                allocations += moved.allocations;
                bytes += moved.bytes;
                evicted.push((ordinal, m));
                let kept =
                    staging::retained_count(m.vmm.backend(), |id| !handles::is_range_id(id.0));
                if kept > 0 {
                    log::info(format_args!(
                        "pause: device {ordinal}: {kept} of {} allocations left in the host arena",
                        moved.allocations
                    ));
                }
            }
            Err(e) => {
                let msg = format!("evicting device {ordinal} failed: {e}; resumed");
                // The failing device too: a release that failed after the copies left its
                // allocations evicted (their chunks still mapped, which a restore fills).
                evicted.push((ordinal, m));
                return Err(roll_back_pause(evicted, msg));
            }
        }
    }
    Ok((evicted, allocations, bytes))
}

/// Undoes a pause that failed part-way: logs `msg`, restores the devices evicted so far,
/// opens the gate. The failure to return.
fn roll_back_pause(evicted: Evicted, msg: String) -> Failure {
    log::error(format_args!("pause: {msg}"));
    for (o, m) in evicted {
        match m.vmm.restore_all(&mut staging()) {
            Ok(_) => arena_after_restore(m, 0),
            Err(e) => log::error(format_args!("pause: restoring device {o} failed: {e}")),
        }
    }
    host().open_gate();
    Failure::new(ErrorKind::Failed, msg)
}

/// Resumes (loading from host copies and from the image a dump left, if any); on failure
/// the process stays paused, its memory where it was. The node daemon's memory limit does
/// not apply to what comes back (the process held it; a limit lowered since takes effect
/// as it frees memory), the process's own limit does.
pub(crate) fn resume(ctl: &mut Ctl, report: Report<'_>) -> Result<Moved, Failure> {
    let waiting = handles::shared::awaiting();
    if waiting > 0 {
        return Err(Failure::new(
            ErrorKind::Failed,
            format!(
                "{waiting} imports of memory another process of the job shares are not back yet: resume the whole job (`cudaw-ckpt resume --job PID`, PID its launcher's), which has their exporters export them again; the process stays paused"
            ),
        ));
    }
    let started = Instant::now();
    let total: u64 = memory::managed_devices()
        .map(|(_, m)| m.vmm.stats().evicted)
        .sum::<u64>()
        + handles::evicted_bytes();
    let image = ctl.image.as_ref().map(|h| h.path.clone());
    let mut load = Load::new(
        ctl.image.as_mut().map(|h| &mut h.reader),
        false,
        total,
        report,
    );
    (load.report)(Progress {
        phase: Phase::Load,
        done: 0,
        total,
    });
    let before_memory = Instant::now();
    // What comes back was the process's: the node's limit is lifted for it, and in force
    // again before the gate opens.
    let lifted = memory::NodeLimitLifted::new();
    let (restored, mut allocations, mut bytes) = restore_devices(&mut load, image.as_deref())?;
    let memory_ms = before_memory.elapsed().as_secs_f64() * 1e3;
    let staging_ms = load.in_staging.as_secs_f64() * 1e3;
    let before_handles = Instant::now();
    // Driver-level handles: from host memory, or from the image a dump left them in.
    let handles_restored = handles::restore(&mut load);
    drop(lifted);
    match handles_restored {
        Ok(h) => {
            allocations += h.handles;
            bytes += h.bytes;
        }
        Err(e) => {
            let image_error = load.image_error.take();
            return Err(resume_failure(
                image_error,
                image.as_deref(),
                "driver handles",
                format!("restoring driver-level handles failed: {e}"),
            ));
        }
    }
    let image_times = load.image_times();
    drop(load);
    let handles_ms = before_handles.elapsed().as_secs_f64() * 1e3;
    let before_sync = Instant::now();
    // A copy from pageable host memory returns once the bytes are staged, before they
    // reach the device; kernels on the program's non-blocking streams must not run
    // ahead of them.
    if let Err(mut e) = synchronise_all(None) {
        e.message
            .push_str("; staying paused (resume again to retry)");
        log::error(format_args!("resume: {}", e.message));
        return Err(e);
    }
    let from = match ctl.image.take() {
        Some(h) => format!(" (from {})", h.path.display()),
        None => String::new(),
    };
    let ms = started.elapsed().as_secs_f64() * 1e3;
    log::info(format_args!(
        "resumed: {allocations} allocations, {bytes} bytes restored in {ms:.1} ms{from}{image_times}"
    ));
    log::debug(format_args!(
        "resume phases: device memory {memory_ms:.1} ms (copies from host memory {staging_ms:.1} ms), driver handles {handles_ms:.1} ms, synchronising {:.1} ms",
        before_sync.elapsed().as_secs_f64() * 1e3
    ));
    ctl.paused = false;
    ctl.paused_by = None;
    host().open_gate();
    for m in restored {
        arena_after_restore(m, arena_demand(m));
    }
    Ok(Moved {
        allocations: allocations as u64,
        bytes,
        ms,
        changed: true,
    })
}

/// Restores every managed device's allocations through `load`: the devices restored, the
/// allocations and bytes moved. `image` is where the image a dump left is.
fn restore_devices(
    load: &mut Load<'_>,
    image: Option<&std::path::Path>,
) -> Result<(Vec<&'static DeviceMemory>, usize, u64), Failure> {
    let (mut allocations, mut bytes) = (0usize, 0u64);
    let mut restored = Vec::new();
    for (ordinal, m) in memory::managed_devices() {
        match m.vmm.restore_all(load) {
            Ok(moved) => {
                allocations += moved.allocations;
                bytes += moved.bytes;
                restored.push(m);
            }
            Err(e) => {
                // Staying paused keeps the program off memory that is not there.
                return Err(resume_failure(
                    load.image_error.take(),
                    image,
                    "memory",
                    format!("restoring device {ordinal} failed: {e}"),
                ));
            }
        }
    }
    Ok((restored, allocations, bytes))
}

/// A resume's failure, logged: the image's damage when reading `image` failed (`what`
/// it holds: "memory", "driver handles"), else `failed`.
fn resume_failure(
    image_error: Option<ckpt::ImageError>,
    image: Option<&std::path::Path>,
    what: &str,
    failed: String,
) -> Failure {
    let (kind, msg) = match (image_error, image) {
        (Some(ie), Some(path)) => (
            ErrorKind::BadImage,
            format!(
                "the image {} that holds the process's {what} is damaged: {ie}; staying paused (`cudaw-ckpt restore PID -i IMAGE` can load another image of this process)",
                path.display()
            ),
        ),
        _ => (
            ErrorKind::Failed,
            format!("{failed}; staying paused (resume again to retry)"),
        ),
    };
    log::error(format_args!("resume: {msg}"));
    Failure::new(kind, msg)
}

/// Every allocation of `m` is back on its device: the host arena forgets them, keeping the
/// ranges of its device's driver handles not back yet, and is made `demand` bytes large
/// ([`staging::restored`]).
pub(crate) fn arena_after_restore(m: &DeviceMemory, demand: u64) {
    let owed = handles::in_arena(m.vmm.backend().device());
    staging::restored(m.vmm.backend(), demand, |id| owed.contains(&id.0));
}

/// Host arena bytes `m`'s allocations and its device's driver handles need
/// (`CUDAW_HOST_ARENA=pinned`).
pub(crate) fn arena_demand(m: &DeviceMemory) -> u64 {
    m.vmm
        .snapshot()
        .iter()
        .map(|a| a.size.next_multiple_of(driver::ARENA_ALIGN))
        .sum::<u64>()
        + handles::arena_demand(m.vmm.backend().device())
}

/// Evicts every resident allocation of one device to host memory: the one place that says
/// how (the process's pinned staging, [`crate::staging::save_for_pause`]): into
/// [`vmm::HostCopy::Memory`] copies the VMM holds (dump reads them with
/// [`vmm::Vmm::with_host_copy`]), or, with the host arena, [`vmm::HostCopy::Retained`] in
/// the arena (dump reads them with [`crate::staging::with_retained`]). `copied` receives
/// the bytes copied since its last call.
pub(crate) fn evict_device(
    m: &DeviceMemory,
    copied: &mut dyn FnMut(u64),
) -> Result<vmm::Moved, vmm::VmmError> {
    m.vmm.evict_all(&mut Evict { copied })
}

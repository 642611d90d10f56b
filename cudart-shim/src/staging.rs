//! The staging pause and resume copy device memory through: one [`PinnedStaging`] for the
//! process (pinned buffers on several streams, host copies on several threads; configured
//! by `CUDAW_STAGING_STREAMS`, `CUDAW_STAGING_BUFFER`, `CUDAW_STAGING_THREADS`). Its pinned
//! pool is made on the first pause, per device, and kept for the next ones.

use crate::log;
use driver::{DriverBackend, PinnedStaging};
use parking_lot::Mutex;
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

fn with<R>(backend: &DriverBackend, f: impl FnOnce(&mut PinnedStaging) -> R) -> R {
    let mut s = STAGING
        .get_or_init(|| Mutex::new(PinnedStaging::new(crate::config::get().staging)))
        .lock();
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
}

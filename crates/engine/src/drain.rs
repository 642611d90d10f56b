//! Waiting for the devices' work, before a pause evicts and after a resume or restore loads.

use crate::failure::Failure;
use crate::{handles, memory};
use cudaw_control::ErrorKind;
use std::sync::mpsc;
use std::time::Instant;

/// Every device with memory of cudaw's: allocations, or driver handles alone (PyTorch's
/// expandable segments need no `cudaMalloc`).
fn ordinals() -> Vec<i32> {
    let mut ordinals: Vec<i32> = memory::managed_devices().map(|(o, _)| o).collect();
    ordinals.extend(handles::devices());
    ordinals.sort_unstable();
    ordinals.dedup();
    ordinals
}

/// Synchronises device `ordinal` through the driver; the message names the device.
fn synchronise(ordinal: i32) -> Result<(), String> {
    let m = memory::device_without_runtime(ordinal)
        .map_err(|e| format!("device {ordinal}: error {e}"))?;
    m.vmm.backend().synchronize().map_err(|e| {
        // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED .. _WRONG_THREAD (900-908).
        let capture = if (900..=908).contains(&e.code) {
            " (a stream is being captured into a CUDA graph: pause once no capture is under way)"
        } else {
            ""
        };
        format!("synchronising device {ordinal}: {e}{capture}")
    })
}

/// Waits for every device's work, through the driver (`cuCtxSynchronize` on the primary
/// context cudaw's memory lives in), not the real runtime: a thread held at the driver
/// layer's gate from inside the real runtime may hold one of the runtime's locks, which
/// `cudaDeviceSynchronize` could then wait for. A device that cannot be synchronised is an
/// error: its kernels may still be using the memory a pause would take away, or a resume
/// has just loaded.
///
/// With a `deadline`, the devices synchronise on helper threads ([`Drain`]) and a device
/// still busy then is an error of kind [`ErrorKind::Timeout`] (a kernel that waits for
/// something the pause holds back — another rank's collective, a host callback — would
/// keep it busy for ever; the helper returns once the device is idle).
pub fn synchronise_all(deadline: Option<Instant>) -> Result<(), Failure> {
    let Some(deadline) = deadline else {
        for ordinal in ordinals() {
            synchronise(ordinal).map_err(|m| Failure::new(ErrorKind::Failed, m))?;
        }
        return Ok(());
    };
    match Drain::start()?.wait(deadline)? {
        Drained::Done => Ok(()),
        Drained::Busy(busy) => Err(Failure::new(
            ErrorKind::Timeout,
            format!(
                "device {} was still running the program's work at the pause's deadline (CUDAW_PAUSE_TIMEOUT)",
                busy.iter().map(|o| o.to_string()).collect::<Vec<_>>().join(", device ")
            ),
        )),
    }
}

/// Whether a [`Drain`] finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drained {
    /// Every device's work finished.
    Done,
    /// These devices were still busy.
    Busy(Vec<i32>),
}

/// Every device's work being waited for, each on a helper thread of its own (all at once,
/// so that N devices take as long as the slowest). The helpers end once their device is
/// idle, whether anyone still waits or not: a device kept busy for ever (a collective that
/// another rank never joins) keeps its helper, blocked in the driver, which is harmless.
pub struct Drain {
    pending: Vec<(i32, mpsc::Receiver<Result<(), String>>)>,
    /// Devices with [`MAX_WAITING`] helpers still blocked from earlier drains: busy.
    stuck: Vec<i32>,
}

/// The most helpers left waiting for one device (a device busy for ever, tried again and
/// again by a job pause without a deadline, would otherwise gather one thread per try).
const MAX_WAITING: usize = 8;

/// Helpers still waiting for each device.
static WAITING: parking_lot::Mutex<std::collections::BTreeMap<i32, usize>> =
    parking_lot::Mutex::new(std::collections::BTreeMap::new());

impl Drain {
    /// Starts a helper for every device with memory of cudaw's.
    pub fn start() -> Result<Drain, Failure> {
        let mut pending = Vec::new();
        let mut stuck = Vec::new();
        for ordinal in ordinals() {
            {
                let mut w = WAITING.lock();
                let n = w.entry(ordinal).or_insert(0);
                if *n >= MAX_WAITING {
                    stuck.push(ordinal);
                    continue;
                }
                *n += 1;
            }
            let (tx, rx) = mpsc::channel();
            let spawned = std::thread::Builder::new()
                .name("cudaw-sync".into())
                .spawn(move || {
                    let r = synchronise(ordinal);
                    if let Some(n) = WAITING.lock().get_mut(&ordinal) {
                        *n = n.saturating_sub(1);
                    }
                    let _ = tx.send(r);
                });
            if let Err(e) = spawned {
                if let Some(n) = WAITING.lock().get_mut(&ordinal) {
                    *n = n.saturating_sub(1);
                }
                return Err(Failure::new(
                    ErrorKind::Failed,
                    format!("starting a thread to synchronise device {ordinal}: {e}"),
                ));
            }
            pending.push((ordinal, rx));
        }
        Ok(Drain { pending, stuck })
    }

    /// Waits until every device is idle or `until` passes: which, or the first device that
    /// failed to synchronise. Devices found idle are not waited for again.
    pub fn wait(&mut self, until: Instant) -> Result<Drained, Failure> {
        let mut busy = Vec::new();
        let mut still = Vec::new();
        for (ordinal, rx) in self.pending.drain(..) {
            let left = until.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(Ok(())) => {}
                Ok(Err(m)) => return Err(Failure::new(ErrorKind::Failed, m)),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    busy.push(ordinal);
                    still.push((ordinal, rx));
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(Failure::new(
                        ErrorKind::Failed,
                        format!("synchronising device {ordinal}: the helper thread died"),
                    ))
                }
            }
        }
        self.pending = still;
        busy.extend(self.stuck.iter().copied());
        busy.sort_unstable();
        Ok(if busy.is_empty() {
            Drained::Done
        } else {
            Drained::Busy(busy)
        })
    }
}

//! Waiting for the devices' work, before a pause evicts and after a resume or restore loads.

use crate::failure::Failure;
use crate::{handles, memory};
use cudaw_control::ErrorKind;
use std::time::Instant;

/// Waits for every device's work, through the driver (`cuCtxSynchronize` on the primary
/// context cudaw's memory lives in), not the real runtime: a thread held at the driver
/// layer's gate from inside the real runtime may hold one of the runtime's locks, which
/// `cudaDeviceSynchronize` could then wait for. Every device with memory of cudaw's:
/// allocations, or driver handles alone (PyTorch's expandable segments need no
/// `cudaMalloc`). A device that cannot be synchronised is an error: its kernels may still
/// be using the memory a pause would take away, or a resume has just loaded.
///
/// With a `deadline`, the synchronise runs on a helper thread and a device still busy then
/// is an error of kind [`ErrorKind::Timeout`] (a kernel that waits for something the pause
/// holds back — another rank's collective, a host callback — would keep it busy for ever;
/// the helper returns once the device is idle).
pub(crate) fn synchronise_all(deadline: Option<Instant>) -> Result<(), Failure> {
    let mut ordinals: Vec<i32> = memory::managed_devices().map(|(o, _)| o).collect();
    ordinals.extend(handles::devices());
    ordinals.sort_unstable();
    ordinals.dedup();
    let failed = |msg: String| Failure::new(ErrorKind::Failed, msg);
    for ordinal in ordinals {
        let m = memory::device_without_runtime(ordinal)
            .map_err(|e| failed(format!("device {ordinal}: error {e}")))?;
        let backend = m.vmm.backend();
        let sync = move || {
            backend.synchronize().map_err(|e| {
                // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED .. _WRONG_THREAD (900-908).
                let capture = if (900..=908).contains(&e.code) {
                    " (a stream is being captured into a CUDA graph: pause once no capture is under way)"
                } else {
                    ""
                };
                format!("synchronising device {ordinal}: {e}{capture}")
            })
        };
        let Some(deadline) = deadline else {
            sync().map_err(failed)?;
            continue;
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("cudaw-sync".into())
            .spawn(move || {
                let _ = tx.send(sync());
            })
            .map_err(|e| {
                failed(format!(
                    "starting a thread to synchronise device {ordinal}: {e}"
                ))
            })?;
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(r) => r.map_err(failed)?,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                return Err(Failure::new(
                    ErrorKind::Timeout,
                    format!(
                        "device {ordinal} was still running the program's work at the pause's deadline (CUDAW_PAUSE_TIMEOUT)"
                    ),
                ))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(failed(format!("synchronising device {ordinal}: the helper thread died")))
            }
        }
    }
    Ok(())
}

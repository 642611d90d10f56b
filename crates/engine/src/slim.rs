//! What a released context hands the driver: as little as cudaw can make it.
//!
//! `cudaw-ckpt pause --release` and `migrate` have the driver checkpoint what cudaw's
//! eviction leaves of a context (`cuCheckpointProcessCheckpoint`), and restore it later,
//! perhaps on another GPU. The driver copies every byte the context holds, at about
//! 1.7 GB/s for the checkpoint: its time is the context's size. A large part of that size
//! is local memory, reserved for the per-thread stack (`CU_LIMIT_STACK_SIZE`) of every
//! thread the GPU can hold at once: 260 of the 1834 MiB a PyTorch process held on an H100
//! (`nvidia-smi`, stack 1 KiB), none of it in use while the process is paused.
//!
//! So before the driver takes the context, [`shrink`] sets each managed context's stack
//! limit to 0 (the driver frees the reserve), and [`restore`] sets it back before the
//! program's first call after the resume (the driver reserves it again). The program
//! never runs in between: a released process's gate is closed.

use crate::log;
use crate::memory;
use driver::{DriverBackend, LIMIT_STACK_SIZE};
use std::sync::Mutex;

/// The contexts shrunk (by their device's backend), with their stack limits before.
static SHRUNK: Mutex<Vec<(&'static DriverBackend, usize)>> = Mutex::new(Vec::new());

/// Frees each managed context's stack reserve (paused, before the driver's checkpoint).
/// A context whose limit cannot be read or set keeps its reserve (logged).
pub fn shrink() {
    let mut shrunk = SHRUNK.lock().unwrap_or_else(|e| e.into_inner());
    for (ordinal, m) in memory::managed_devices() {
        let backend = m.vmm.backend();
        if shrunk.iter().any(|(b, _)| b.context() == backend.context()) {
            continue;
        }
        let drv = backend.driver();
        let r = backend.in_context(|| {
            let was = drv.ctx_get_limit(LIMIT_STACK_SIZE)?;
            if was > 0 {
                drv.ctx_set_limit(LIMIT_STACK_SIZE, 0)?;
            }
            Ok::<usize, driver::DriverError>(was)
        });
        match r {
            Ok(0) => {}
            Ok(was) => {
                shrunk.push((backend, was));
                log::info(format_args!(
                    "device {ordinal}: the stack's local memory is freed for the driver's checkpoint (limit {was} bytes a thread, restored at resume)"
                ));
            }
            Err(e) => log::warn(format_args!(
                "device {ordinal}: the stack limit stays ({e}): the driver checkpoints its local memory too"
            )),
        }
    }
}

/// Sets back the stack limits [`shrink`] lowered (the context is on a GPU again). A limit
/// that cannot be set back is logged: the driver then reserves what each kernel needs
/// when it is launched.
pub fn restore() {
    let shrunk = std::mem::take(&mut *SHRUNK.lock().unwrap_or_else(|e| e.into_inner()));
    for (backend, was) in shrunk {
        match backend.in_context(|| backend.driver().ctx_set_limit(LIMIT_STACK_SIZE, was)) {
            Ok(()) => log::info(format_args!(
                "the stack limit is {was} bytes a thread again"
            )),
            Err(e) => log::warn(format_args!(
                "setting the stack limit back to {was} bytes failed ({e}): kernels get what they need when launched"
            )),
        }
    }
}

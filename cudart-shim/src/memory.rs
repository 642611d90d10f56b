//! Device memory: the runtime's allocation calls, replaced by the virtual memory manager.
//!
//! One [`Vmm`] per device, created on the first allocation on that device over the driver's
//! VMM calls in the device's primary context (the runtime's own context). Stream-ordered
//! frees (`cudaFreeAsync`) take effect when their stream reaches them: an event is recorded
//! and the memory is released once it has completed.

use crate::config::Addressing;
use crate::types::*;
use crate::{call_real, log};
use driver::{DriverBackend, LibCuda};
use parking_lot::Mutex;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};
use vmm::{Allocation, Config as VmmConfig, Vmm, VmmError};

/// Tags recorded with each allocation: which API created it.
pub mod tag {
    /// `cudaMalloc`.
    pub const MALLOC: u32 = 1;
    /// `cudaMallocPitch`.
    pub const PITCH: u32 = 2;
    /// `cudaMalloc3D`.
    pub const MALLOC_3D: u32 = 3;
    /// `cudaMallocAsync` / `cudaMallocFromPoolAsync`.
    pub const ASYNC: u32 = 4;
    /// `cuMemAlloc` / `cuMemAllocAsync` handed out through a driver entry point.
    pub const DRIVER: u32 = 5;
}

/// Pitch alignment for `cudaMallocPitch` / `cudaMalloc3D` (what the runtime uses on
/// current GPUs).
pub const PITCH_ALIGNMENT: usize = 512;

/// The most devices cudaw manages in one process.
pub const MAX_DEVICES: usize = 64;

/// One device's memory.
pub struct DeviceMemory {
    /// The manager.
    pub vmm: Vmm<DriverBackend>,
    /// Frees waiting for their stream: (event, pointer).
    deferred: Mutex<Vec<(usize, u64)>>,
}

static DRIVER: OnceLock<Result<Arc<LibCuda>, String>> = OnceLock::new();
static DEVICES: [OnceLock<Result<DeviceMemory, String>>; MAX_DEVICES] =
    [const { OnceLock::new() }; MAX_DEVICES];

fn driver() -> Result<Arc<LibCuda>, String> {
    DRIVER
        .get_or_init(|| {
            let cfg = crate::config::get();
            let r = match &cfg.libcuda {
                Some(p) => LibCuda::open_path(&p.to_string_lossy()),
                None => LibCuda::open(),
            };
            r.map(Arc::new).map_err(|e| e.to_string())
        })
        .clone()
}

/// The device the calling thread uses (the real runtime's current device).
pub fn current_device() -> Result<i32, cudaError_t> {
    let mut dev: i32 = 0;
    let rc = call_real!(cudaGetDevice: fn(*mut i32) -> cudaError_t, &mut dev);
    if rc != SUCCESS {
        return Err(rc);
    }
    Ok(dev)
}

/// The memory of device `ordinal`, created on first use.
pub fn device(ordinal: i32) -> Result<&'static DeviceMemory, cudaError_t> {
    let slot = DEVICES
        .get(usize::try_from(ordinal).map_err(|_| ERROR_INVALID_VALUE)?)
        .ok_or(ERROR_INVALID_VALUE)?;
    let r = slot.get_or_init(|| {
        let started = std::time::Instant::now();
        // The runtime creates and makes current the device's primary context.
        let rc = call_real!(cudaFree: fn(*mut c_void) -> cudaError_t, std::ptr::null_mut());
        if rc != SUCCESS {
            return Err(format!(
                "initialising the runtime on device {ordinal} failed ({rc})"
            ));
        }
        let drv = driver()?;
        let backend = DriverBackend::new(drv, ordinal).map_err(|e| e.to_string())?;
        let cfg = crate::config::get();
        let vcfg = match cfg.addressing {
            Addressing::Mapped => VmmConfig::mapped(),
            Addressing::Translated => VmmConfig::translated(),
        };
        let vcfg = match cfg.mem_limit {
            Some(l) => vcfg.with_memory_limit(l),
            None => vcfg,
        };
        let vmm = Vmm::new(backend, vcfg).map_err(|e| e.to_string())?;
        log::info(format_args!(
            "device {ordinal}: cudaw manages its memory ({:?} addressing, granularity {} KiB, ready in {:.1} ms)",
            cfg.addressing,
            vmm.granularity() >> 10,
            started.elapsed().as_secs_f64() * 1e3
        ));
        Ok(DeviceMemory {
            vmm,
            deferred: Mutex::new(Vec::new()),
        })
    });
    match r {
        Ok(m) => Ok(m),
        Err(e) => {
            log::error(format_args!("device {ordinal}: {e}"));
            Err(ERROR_INITIALIZATION)
        }
    }
}

/// The memory of the calling thread's current device.
pub fn current() -> Result<&'static DeviceMemory, cudaError_t> {
    device(current_device()?)
}

/// Every device whose memory cudaw manages, with its ordinal.
pub fn managed_devices() -> impl Iterator<Item = (i32, &'static DeviceMemory)> {
    DEVICES
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s.get() {
            Some(Ok(m)) => Some((i as i32, m)),
            _ => None,
        })
}

/// The allocation containing `ptr`, on whichever device owns it.
pub fn lookup(ptr: u64) -> Option<(&'static DeviceMemory, Allocation)> {
    managed_devices().find_map(|(_, m)| m.vmm.lookup(ptr).map(|a| (m, a)))
}

/// `ptr` as the real runtime must see it: translated when it is one of cudaw's translated
/// pointers, unchanged otherwise.
pub fn to_real(ptr: *const c_void) -> *const c_void {
    let p = ptr as u64;
    for (_, m) in managed_devices() {
        if m.vmm.in_translated_range(p) {
            if let Some(t) = m.vmm.translate(p) {
                return t as *const c_void;
            }
        }
    }
    ptr
}

/// Whether translated addressing is on.
pub fn translated() -> bool {
    crate::config::get().addressing == Addressing::Translated
}

fn vmm_error(e: &VmmError, what: &str) -> cudaError_t {
    log::debug(format_args!("{what}: {e}"));
    e.cuda_error_code()
}

impl DeviceMemory {
    /// Allocates `size` bytes, retrying once after completed stream-ordered frees when out
    /// of memory.
    pub fn alloc(&self, size: u64, tag: u32) -> Result<Allocation, cudaError_t> {
        let a = self.alloc_inner(size, tag)?;
        log::debug(format_args!(
            "allocated {} bytes at {:#x} (backing {:#x}, tag {tag})",
            a.size, a.base, a.backing
        ));
        Ok(a)
    }

    fn alloc_inner(&self, size: u64, tag: u32) -> Result<Allocation, cudaError_t> {
        self.reap(false);
        match self.vmm.alloc(size, tag) {
            Ok(a) => Ok(a),
            Err(e) if e.cuda_error_code() == ERROR_MEMORY_ALLOCATION => {
                if self.reap(true) > 0 {
                    self.vmm
                        .alloc(size, tag)
                        .map_err(|e| vmm_error(&e, "allocation"))
                } else {
                    Err(vmm_error(&e, "allocation"))
                }
            }
            Err(e) => Err(vmm_error(&e, "allocation")),
        }
    }

    /// Releases deferred frees whose stream has passed them (all of them, waiting, when
    /// `wait`). Returns how many were released.
    pub fn reap(&self, wait: bool) -> usize {
        let ready: Vec<(usize, u64)> = {
            let mut d = self.deferred.lock();
            if d.is_empty() {
                return 0;
            }
            let mut ready = Vec::new();
            d.retain(|&(ev, ptr)| {
                let ev_ptr = ev as cudaEvent_t;
                let done = if wait {
                    call_real!(cudaEventSynchronize: fn(cudaEvent_t) -> cudaError_t, ev_ptr)
                        != ERROR_NOT_READY
                } else {
                    call_real!(cudaEventQuery: fn(cudaEvent_t) -> cudaError_t, ev_ptr)
                        != ERROR_NOT_READY
                };
                if done {
                    ready.push((ev, ptr));
                }
                !done
            });
            ready
        };
        for &(ev, ptr) in &ready {
            call_real!(cudaEventDestroy: fn(cudaEvent_t) -> cudaError_t, ev as cudaEvent_t);
            if let Err(e) = self.vmm.free(ptr) {
                log::warn(format_args!("deferred free of {ptr:#x}: {e}"));
            }
        }
        ready.len()
    }

    /// Frees `ptr` once `stream` reaches this point.
    pub fn free_on_stream(&self, ptr: u64, stream: cudaStream_t) -> cudaError_t {
        let mut ev: cudaEvent_t = std::ptr::null_mut();
        let rc = call_real!(
            cudaEventCreateWithFlags: fn(*mut cudaEvent_t, u32) -> cudaError_t,
            &mut ev,
            EVENT_DISABLE_TIMING
        );
        if rc != SUCCESS {
            return rc;
        }
        let rc =
            call_real!(cudaEventRecord: fn(cudaEvent_t, cudaStream_t) -> cudaError_t, ev, stream);
        if rc != SUCCESS {
            call_real!(cudaEventDestroy: fn(cudaEvent_t) -> cudaError_t, ev);
            return rc;
        }
        self.deferred.lock().push((ev as usize, ptr));
        SUCCESS
    }
}

/// Writes `value` through `out` if it is not null.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
pub unsafe fn write_out<T>(out: *mut T, value: T) -> cudaError_t {
    if out.is_null() {
        return ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null, and valid per the caller's contract (the application's out-pointer).
    unsafe { out.write(value) };
    SUCCESS
}

/// Rounds `v` up to a multiple of `a` (a power of two).
pub fn align_up(v: usize, a: usize) -> Option<usize> {
    v.checked_add(a - 1).map(|x| x & !(a - 1))
}

/// One line per managed device, plus driver-level memory and registrations: what cudaw did
/// for this process. Logged at exit at info level.
pub fn summary() -> String {
    let mut parts = Vec::new();
    for (i, m) in managed_devices() {
        let s = m.vmm.stats();
        parts.push(format!(
            "device {i}: {} live allocations, {} MiB requested (peak {} MiB), {} MiB mapped (peak {} MiB)",
            s.allocations,
            s.requested >> 20,
            s.peak_requested >> 20,
            s.mapped >> 20,
            s.peak_mapped >> 20
        ));
    }
    let d = crate::entry_points::snapshot();
    let (fatbins, kernels) = crate::registry::counts_ever();
    parts.push(format!(
        "driver-level: {} handles ({} MiB, peak {} MiB), {} mappings, {} reservations",
        d.handles.len(),
        d.bytes() >> 20,
        d.peak_bytes >> 20,
        d.mappings.len(),
        d.reservations.len()
    ));
    parts.push(format!(
        "registered over the run: {fatbins} fatbins, {kernels} kernels"
    ));
    parts.join("; ")
}

extern "C" fn log_summary_at_exit() {
    crate::boundary::guard("the exit summary", (), || {
        if log::enabled(log::Level::Info) {
            log::info(format_args!("at exit: {}", summary()));
        }
    })
}

/// Arranges for [`summary`] to be logged when the process exits.
pub fn log_summary_at_exit_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a function with no arguments that never unwinds (it runs inside
        // the panic boundary).
        unsafe { libc::atexit(log_summary_at_exit) };
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment() {
        assert_eq!(align_up(1, 512), Some(512));
        assert_eq!(align_up(512, 512), Some(512));
        assert_eq!(align_up(0, 512), Some(0));
        assert_eq!(align_up(usize::MAX, 512), None);
    }
}

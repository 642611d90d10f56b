//! The memory calls both APIs serve from cudaw's memory, as plain functions the cdylib's
//! thin `extern "C"` wrappers call (`cudaMalloc*`, `cudaMemGetInfo`, `cudaMallocManaged`,
//! and the driver's `cuMemAlloc*`, `cuMemGetInfo`, `cuDeviceTotalMem`,
//! `cuMemAllocManaged`, `cuMemAddressReserve`): the pitch arithmetic, the limit the
//! program sees, managed memory charged to the budget, the driver-level address
//! reservations, and the driver layer's `cuMemAlloc*` / `cuMemFree*` from the VMM
//! (`driver_*`).

use crate::memory::{self, align_up, PITCH_ALIGNMENT};
use crate::types::*;
use driver::hooks::NOT_MINE;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::ffi::c_void;

/// `CUresult` values for what cudaw answers itself.
pub const CU_SUCCESS: u32 = 0;
/// `CUDA_ERROR_INVALID_VALUE`.
pub const CU_ERROR_INVALID_VALUE: u32 = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CU_ERROR_OUT_OF_MEMORY: u32 = 2;

/// A runtime error code as the driver API's `CUresult`.
pub fn to_cu(rc: cudaError_t) -> u32 {
    match rc {
        SUCCESS => CU_SUCCESS,
        ERROR_MEMORY_ALLOCATION => CU_ERROR_OUT_OF_MEMORY,
        _ => CU_ERROR_INVALID_VALUE,
    }
}

/// `size` bytes from the current device's memory, tagged `tag` (`memory::tag`); 0 for a
/// size of 0, as the runtime answers.
pub fn alloc(size: u64, tag: u32) -> Result<u64, cudaError_t> {
    if size == 0 {
        return Ok(0);
    }
    Ok(memory::current()?.alloc(size, tag)?.base)
}

/// An allocation of `size` bytes for `cudaMallocPitch` / `cudaMalloc3D`: as [`alloc`], but
/// the current device is set up first, so that a device that cannot be used fails the call
/// even when the extent is empty (as the runtime's does).
pub fn alloc_pitched(size: u64, tag: u32) -> Result<u64, cudaError_t> {
    let m = memory::current()?;
    if size == 0 {
        return Ok(0);
    }
    Ok(m.alloc(size, tag)?.base)
}

/// `cudaMallocPitch`'s pitch and size for `width` bytes by `height` rows: the width rounded
/// up to [`PITCH_ALIGNMENT`] (at least one), times the rows.
pub fn pitched(width: usize, height: usize) -> Result<(usize, usize), cudaError_t> {
    pitched_3d(width, height, 1)
}

/// `cudaMalloc3D`'s pitch and size for `width` bytes by `height` rows by `depth` slices.
pub fn pitched_3d(
    width: usize,
    height: usize,
    depth: usize,
) -> Result<(usize, usize), cudaError_t> {
    let p = align_up(width.max(1), PITCH_ALIGNMENT).ok_or(ERROR_INVALID_VALUE)?;
    let size = p
        .checked_mul(height)
        .and_then(|s| s.checked_mul(depth))
        .ok_or(ERROR_MEMORY_ALLOCATION)?;
    Ok((p, size))
}

/// `cuMemAllocPitch`'s pitch and size: as [`pitched`], for an element size of 4, 8 or 16
/// bytes and a size that is not 0; `None` (`CUDA_ERROR_INVALID_VALUE`) otherwise.
pub fn driver_pitched(width: usize, height: usize, element: u32) -> Option<(usize, usize)> {
    if !matches!(element, 4 | 8 | 16) {
        return None;
    }
    let p = align_up(width.max(1), PITCH_ALIGNMENT)?;
    let size = p.checked_mul(height).filter(|&s| s > 0)?;
    Some((p, size))
}

/// `(free, total)` of the current device as the program must see them (its limit, the
/// stream-ordered frees its streams have passed released first), from what `query` (the
/// real `cudaMemGetInfo` or `cuMemGetInfo`) answers for the card; `Err` is `query`'s code.
pub fn memory_info(
    query: impl FnOnce(&mut usize, &mut usize) -> u32,
) -> Result<(usize, usize), u32> {
    let dev = memory::current_device();
    if let Ok(d) = dev {
        memory::reap_completed(d);
    }
    let (mut f, mut t) = (0usize, 0usize);
    match query(&mut f, &mut t) {
        0 => {}
        rc => return Err(rc),
    }
    let (f, t) = match dev {
        Ok(d) => memory::reported_memory(d, f as u64, t as u64),
        Err(_) => (f as u64, t as u64),
    };
    Ok((f as usize, t as usize))
}

/// The total memory device `ordinal` reports (`totalGlobalMem`, `cuDeviceTotalMem`): the
/// card's `total`, or its limit where it has one below that.
pub fn limited_total(ordinal: i32, total: u64) -> u64 {
    if !memory::has_limit(ordinal) {
        return total;
    }
    match memory::budget(ordinal).ok().and_then(|b| b.limit()) {
        Some(limit) => total.min(limit),
        None => total,
    }
}

/// A managed allocation of `size` bytes made by `forward` (the real `cudaMallocManaged` or
/// `cuMemAllocManaged`: its code, and the pointer it made when it succeeded), charged
/// against the current device's budget (rounded up to 2 MiB) until it is freed; refused
/// over the limit before `forward` runs. `Err` is a runtime error code of cudaw's own.
pub fn managed(
    size: u64,
    forward: impl FnOnce() -> (u32, Option<u64>),
) -> Result<u32, cudaError_t> {
    let dev = memory::current_device()?;
    let charged = memory::charge_managed(dev, size)?;
    match forward() {
        (0, Some(ptr)) => {
            memory::record_managed(ptr, dev, charged);
            Ok(0)
        }
        (rc, _) => {
            memory::uncharge(dev, charged);
            Ok(rc)
        }
    }
}

/// Driver-level address reservations that went through cudaw's entry points
/// (`cuMemAddressReserve`): base → bytes. The handles and mappings are
/// [`crate::handles`]'.
static RESERVATIONS: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());

/// Records the reservation of `size` bytes at `base`.
pub fn reserved(base: u64, size: u64) {
    RESERVATIONS.lock().insert(base, size);
}

/// Forgets the reservation at `base` (freed).
pub fn unreserved(base: u64) {
    RESERVATIONS.lock().remove(&base);
}

/// The reservations recorded now.
pub fn reservations() -> BTreeMap<u64, u64> {
    RESERVATIONS.lock().clone()
}

// ------------------------------------------------------------------ the driver layer's calls

/// Runs `f`, a driver-layer call the VMM serves, and puts back the calling thread's
/// context if `f` changed it. A driver-API caller may have a context of its own
/// (`cuCtxCreate`): the VMM works in the device's primary context (and its first use
/// initialises the runtime there), which must not stay current in the caller's place.
fn keeping_context<R>(f: impl FnOnce() -> R) -> R {
    let drv = memory::driver().ok();
    let _kept = drv
        .as_deref()
        .and_then(|d| driver::KeptContext::new(d).ok());
    f()
}

/// The driver layer's `cuMemAlloc`: allocates `size` bytes on device `ordinal` from its
/// VMM and writes the address through `out`; [`NOT_MINE`] where the VMM does not serve the
/// driver shim.
pub fn driver_alloc(out: *mut u64, size: u64, ordinal: i32, tag: u32) -> u32 {
    keeping_context(|| alloc_in_vmm(out, size, ordinal, tag))
}

fn alloc_in_vmm(out: *mut u64, size: u64, ordinal: i32, tag: u32) -> u32 {
    if memory::translated() {
        return NOT_MINE;
    }
    if out.is_null() || size == 0 {
        return CU_ERROR_INVALID_VALUE;
    }
    let _in_flight = crate::inflight::enter();
    let mem = match memory::device(ordinal) {
        Ok(m) => m,
        // No VMM for this device (logged): the driver shim forwards instead.
        Err(ERROR_INITIALIZATION) => return NOT_MINE,
        Err(e) => return to_cu(e),
    };
    match mem.alloc(size, tag) {
        Ok(a) => {
            // SAFETY: the program's non-null out-pointer, passed on by the driver shim.
            unsafe { out.write(a.base) };
            CU_SUCCESS
        }
        Err(e) => to_cu(e),
    }
}

/// The driver layer's `cuMemAllocPitch` ([`driver_alloc`] of the pitched size, the pitch
/// written through `pitch`).
pub fn driver_alloc_pitch(
    out: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element: u32,
    ordinal: i32,
) -> u32 {
    if memory::translated() {
        return NOT_MINE;
    }
    let pitched = driver_pitched(width, height, element);
    let (false, false, Some((p, size))) = (out.is_null(), pitch.is_null(), pitched) else {
        return CU_ERROR_INVALID_VALUE;
    };
    let rc = driver_alloc(out, size as u64, ordinal, memory::tag::PITCH);
    if rc == CU_SUCCESS {
        // SAFETY: the program's non-null out-pointer, passed on by the driver shim.
        unsafe { pitch.write(p) };
    }
    rc
}

/// The driver layer's `cuMemFree` of `ptr`; `traced` records the free with the tracer.
pub fn driver_free(ptr: u64, traced: fn(u64)) -> u32 {
    keeping_context(|| match memory::lookup(ptr) {
        Some((mem, a)) if a.base == ptr => {
            let _in_flight = crate::inflight::enter();
            mem.synchronise_before_free("cuMemFree");
            traced(ptr);
            match mem.vmm.free(ptr) {
                Ok(()) => CU_SUCCESS,
                Err(e) => to_cu(e.cuda_error_code()),
            }
        }
        Some(_) => CU_ERROR_INVALID_VALUE,
        None => NOT_MINE,
    })
}

/// The driver layer's `cuMemFreeAsync` of `ptr` on `stream`.
pub fn driver_free_async(ptr: u64, stream: *mut c_void) -> u32 {
    keeping_context(|| match memory::lookup(ptr) {
        Some((mem, a)) if a.base == ptr => {
            let _in_flight = crate::inflight::enter();
            to_cu(mem.free_on_stream(ptr, stream as cudaStream_t))
        }
        Some(_) => CU_ERROR_INVALID_VALUE,
        None => NOT_MINE,
    })
}

/// The allocation of cudaw's holding `ptr`: its base and size written through `base` and
/// `size`; false for none (or a null out-pointer).
pub fn driver_allocation(ptr: u64, base: *mut u64, size: *mut u64) -> bool {
    let Some((_, a)) = memory::lookup(ptr) else {
        return false;
    };
    if base.is_null() || size.is_null() {
        return false;
    }
    // SAFETY: the driver shim's non-null out-pointers.
    unsafe {
        base.write(a.base);
        size.write(a.size);
    }
    true
}

/// `cuMemAlloc` as the runtime's driver entry point hands it out: `size` bytes of the
/// current device's memory, written through `dptr`.
pub fn entry_alloc(dptr: *mut u64, size: usize) -> u32 {
    let _in_flight = crate::inflight::enter();
    if dptr.is_null() || size == 0 {
        return CU_ERROR_INVALID_VALUE;
    }
    match alloc(size as u64, memory::tag::DRIVER) {
        Ok(base) => {
            // SAFETY: non-null out-pointer from the caller.
            unsafe { dptr.write(base) };
            CU_SUCCESS
        }
        Err(e) => to_cu(e),
    }
}

/// `cuMemAllocPitch` as the runtime's driver entry point hands it out.
pub fn entry_alloc_pitch(
    dptr: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element: u32,
) -> u32 {
    let _in_flight = crate::inflight::enter();
    let pitched = driver_pitched(width, height, element);
    let (false, false, Some((p, size))) = (dptr.is_null(), pitch.is_null(), pitched) else {
        return CU_ERROR_INVALID_VALUE;
    };
    match alloc(size as u64, memory::tag::PITCH) {
        Ok(base) => {
            // SAFETY: non-null out-pointers from the caller.
            unsafe {
                dptr.write(base);
                pitch.write(p);
            }
            CU_SUCCESS
        }
        Err(e) => to_cu(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pitches() {
        assert_eq!(pitched(1, 3), Ok((512, 1536)));
        assert_eq!(pitched(0, 2), Ok((512, 1024)));
        assert_eq!(pitched(513, 0), Ok((1024, 0)));
        assert_eq!(pitched(usize::MAX, 1), Err(ERROR_INVALID_VALUE));
        assert_eq!(pitched(1 << 40, 1 << 40), Err(ERROR_MEMORY_ALLOCATION));
        assert_eq!(pitched_3d(100, 2, 3), Ok((512, 3072)));
        assert_eq!(pitched_3d(100, 2, usize::MAX), Err(ERROR_MEMORY_ALLOCATION));
    }

    #[test]
    fn driver_pitches() {
        assert_eq!(driver_pitched(100, 2, 4), Some((512, 1024)));
        assert_eq!(driver_pitched(100, 2, 3), None, "element size");
        assert_eq!(driver_pitched(100, 0, 8), None, "no rows");
        assert_eq!(driver_pitched(usize::MAX, 1, 16), None);
    }

    #[test]
    fn error_codes_as_curesult() {
        assert_eq!(to_cu(SUCCESS), CU_SUCCESS);
        assert_eq!(to_cu(ERROR_MEMORY_ALLOCATION), CU_ERROR_OUT_OF_MEMORY);
        assert_eq!(to_cu(ERROR_NOT_SUPPORTED), CU_ERROR_INVALID_VALUE);
    }

    #[test]
    fn reservations_are_recorded_and_forgotten() {
        reserved(0x7000_0000_0000, 4 << 20);
        assert_eq!(reservations().get(&0x7000_0000_0000), Some(&(4 << 20)));
        unreserved(0x7000_0000_0000);
        assert!(!reservations().contains_key(&0x7000_0000_0000));
    }
}

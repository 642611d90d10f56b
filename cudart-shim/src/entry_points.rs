//! `cudaGetDriverEntryPoint[ByVersion]`: the runtime's door to the driver. Frameworks fetch
//! driver functions through it (PyTorch's expandable segments take memory with
//! `cuMemCreate` + `cuMemMap` this way); for the allocation calls cudaw hands out its own
//! versions, so that memory is cudaw's too: `cuMemAlloc`/`cuMemFree` (and the async pair)
//! come from the VMM like `cudaMalloc`; the VMM primitives (`cuMemCreate`, `cuMemMap`,
//! `cuMemUnmap`, `cuMemRelease`, `cuMemAddressReserve`, `cuMemAddressFree`) go to the
//! driver and are recorded — handles, mappings and reservations — for accounting and for
//! pause. Every other name passes through untouched.

#![allow(non_snake_case)]

use crate::boundary::guard;
use crate::dispatch::idx;
use crate::memory::{self, tag};
use crate::types::*;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// `CUresult` values cudaw returns itself.
const CU_SUCCESS: u32 = 0;
const CU_ERROR_INVALID_VALUE: u32 = 1;
const CU_ERROR_OUT_OF_MEMORY: u32 = 2;
const CU_ERROR_NOT_SUPPORTED: u32 = 801;

/// The driver functions cudaw replaces: (name, index in [`REAL`]).
const NAMES: [&str; 10] = [
    "cuMemAlloc",
    "cuMemFree",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemAddressReserve",
    "cuMemAddressFree",
];

/// The real driver function behind each of [`NAMES`], as the entry point returned it.
static REAL: [AtomicUsize; NAMES.len()] = [const { AtomicUsize::new(0) }; NAMES.len()];

/// Driver-level memory that went through cudaw's entry points.
#[derive(Default, Debug, Clone)]
pub struct DriverMemory {
    /// Physical handles from `cuMemCreate`: handle → bytes.
    pub handles: BTreeMap<u64, u64>,
    /// Mappings from `cuMemMap`: address → (bytes, handle).
    pub mappings: BTreeMap<u64, (u64, u64)>,
    /// Reservations from `cuMemAddressReserve`: base → bytes.
    pub reservations: BTreeMap<u64, u64>,
    /// Peak bytes of live physical handles.
    pub peak_bytes: u64,
}

impl DriverMemory {
    /// Bytes of live physical handles.
    pub fn bytes(&self) -> u64 {
        self.handles.values().sum()
    }
}

static TRACKED: OnceLock<Mutex<DriverMemory>> = OnceLock::new();

fn tracked() -> &'static Mutex<DriverMemory> {
    TRACKED.get_or_init(Default::default)
}

/// A snapshot of the driver-level memory cudaw has seen.
pub fn snapshot() -> DriverMemory {
    tracked().lock().clone()
}

fn real(i: usize) -> Option<usize> {
    match REAL[i].load(Ordering::Acquire) {
        0 => None,
        p => Some(p),
    }
}

macro_rules! drv_forward {
    ($i:expr, fn($($t:ty),*), $($arg:expr),*) => {
        match real($i) {
            // SAFETY: the address the driver's entry point returned for this name, whose
            // C signature (cuda.h) is written here; the application's arguments unchanged.
            Some(p) => unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> u32>(p)($($arg),*) },
            None => CU_ERROR_NOT_SUPPORTED,
        }
    };
}

fn to_cu(rc: cudaError_t) -> u32 {
    match rc {
        SUCCESS => CU_SUCCESS,
        ERROR_MEMORY_ALLOCATION => CU_ERROR_OUT_OF_MEMORY,
        _ => CU_ERROR_INVALID_VALUE,
    }
}

extern "C" fn cuMemAlloc(dptr: *mut u64, size: usize) -> u32 {
    guard("cuMemAlloc", 999, || {
        let _in_flight = crate::pause::enter();
        if dptr.is_null() || size == 0 {
            return CU_ERROR_INVALID_VALUE;
        }
        match memory::current().and_then(|m| m.alloc(size as u64, tag::DRIVER)) {
            Ok(a) => {
                // SAFETY: non-null out-pointer from the caller.
                unsafe { dptr.write(a.base) };
                CU_SUCCESS
            }
            Err(e) => to_cu(e),
        }
    })
}

extern "C" fn cuMemFree(ptr: u64) -> u32 {
    guard("cuMemFree", 999, || match memory::lookup(ptr) {
        Some((mem, a)) if a.base == ptr => {
            let _in_flight = crate::pause::enter();
            crate::call_real!(cudaDeviceSynchronize: fn() -> cudaError_t,);
            match mem.vmm.free(ptr) {
                Ok(()) => CU_SUCCESS,
                Err(e) => to_cu(e.cuda_error_code()),
            }
        }
        Some(_) => CU_ERROR_INVALID_VALUE,
        None => drv_forward!(1, fn(u64), ptr),
    })
}

extern "C" fn cuMemAllocAsync(dptr: *mut u64, size: usize, stream: cudaStream_t) -> u32 {
    guard("cuMemAllocAsync", 999, || {
        let _ = stream;
        cuMemAlloc(dptr, size)
    })
}

extern "C" fn cuMemFreeAsync(ptr: u64, stream: cudaStream_t) -> u32 {
    guard("cuMemFreeAsync", 999, || match memory::lookup(ptr) {
        Some((mem, a)) if a.base == ptr => {
            let _in_flight = crate::pause::enter();
            to_cu(mem.free_on_stream(ptr, stream))
        }
        Some(_) => CU_ERROR_INVALID_VALUE,
        None => drv_forward!(3, fn(u64, cudaStream_t), ptr, stream),
    })
}

extern "C" fn cuMemCreate(handle: *mut u64, size: usize, prop: *const c_void, flags: u64) -> u32 {
    guard("cuMemCreate", 999, || {
        let rc = drv_forward!(
            4,
            fn(*mut u64, usize, *const c_void, u64),
            handle,
            size,
            prop,
            flags
        );
        if rc == CU_SUCCESS && !handle.is_null() {
            // SAFETY: the driver wrote the new handle through the caller's pointer.
            let h = unsafe { handle.read() };
            let mut t = tracked().lock();
            t.handles.insert(h, size as u64);
            t.peak_bytes = t.peak_bytes.max(t.bytes());
        }
        rc
    })
}

extern "C" fn cuMemRelease(handle: u64) -> u32 {
    guard("cuMemRelease", 999, || {
        let rc = drv_forward!(5, fn(u64), handle);
        if rc == CU_SUCCESS {
            tracked().lock().handles.remove(&handle);
        }
        rc
    })
}

extern "C" fn cuMemMap(ptr: u64, size: usize, offset: usize, handle: u64, flags: u64) -> u32 {
    guard("cuMemMap", 999, || {
        let rc = drv_forward!(
            6,
            fn(u64, usize, usize, u64, u64),
            ptr,
            size,
            offset,
            handle,
            flags
        );
        if rc == CU_SUCCESS {
            tracked().lock().mappings.insert(ptr, (size as u64, handle));
        }
        rc
    })
}

extern "C" fn cuMemUnmap(ptr: u64, size: usize) -> u32 {
    guard("cuMemUnmap", 999, || {
        let rc = drv_forward!(7, fn(u64, usize), ptr, size);
        if rc == CU_SUCCESS {
            let end = ptr.saturating_add(size as u64);
            tracked()
                .lock()
                .mappings
                .retain(|&a, _| a < ptr || a >= end);
        }
        rc
    })
}

extern "C" fn cuMemAddressReserve(
    out: *mut u64,
    size: usize,
    align: usize,
    addr: u64,
    flags: u64,
) -> u32 {
    guard("cuMemAddressReserve", 999, || {
        let rc = drv_forward!(
            8,
            fn(*mut u64, usize, usize, u64, u64),
            out,
            size,
            align,
            addr,
            flags
        );
        if rc == CU_SUCCESS && !out.is_null() {
            // SAFETY: the driver wrote the reservation's base through the caller's pointer.
            let base = unsafe { out.read() };
            tracked().lock().reservations.insert(base, size as u64);
        }
        rc
    })
}

extern "C" fn cuMemAddressFree(ptr: u64, size: usize) -> u32 {
    guard("cuMemAddressFree", 999, || {
        let rc = drv_forward!(9, fn(u64, usize), ptr, size);
        if rc == CU_SUCCESS {
            tracked().lock().reservations.remove(&ptr);
        }
        rc
    })
}

/// cudaw's replacement for driver function `name`, if it has one.
fn replacement(name: &str) -> Option<(usize, usize)> {
    let i = NAMES.iter().position(|n| *n == name)?;
    let f = match i {
        0 => cuMemAlloc as *const () as usize,
        1 => cuMemFree as *const () as usize,
        2 => cuMemAllocAsync as *const () as usize,
        3 => cuMemFreeAsync as *const () as usize,
        4 => cuMemCreate as *const () as usize,
        5 => cuMemRelease as *const () as usize,
        6 => cuMemMap as *const () as usize,
        7 => cuMemUnmap as *const () as usize,
        8 => cuMemAddressReserve as *const () as usize,
        _ => cuMemAddressFree as *const () as usize,
    };
    Some((i, f))
}

/// After the real entry point answered for `symbol` into `func`: swap in cudaw's version.
///
/// # Safety
/// `symbol` is null or NUL-terminated; `func` is null or valid for reads and writes.
unsafe fn substitute(symbol: *const i8, func: *mut *mut c_void) {
    if symbol.is_null() || func.is_null() {
        return;
    }
    // SAFETY: NUL-terminated name from the caller (contract above).
    let name = unsafe { CStr::from_ptr(symbol) }.to_string_lossy();
    let Some((i, ours)) = replacement(&name) else {
        return;
    };
    // SAFETY: `func` is the caller's out-pointer, which the real runtime just wrote.
    let got = unsafe { func.read() } as usize;
    if got == 0 {
        return;
    }
    let _ = REAL[i].compare_exchange(0, got, Ordering::AcqRel, Ordering::Acquire);
    // SAFETY: as above.
    unsafe { func.write(ours as *mut c_void) };
    crate::log::debug(format_args!(
        "driver entry point {name}: cudaw's version handed out"
    ));
}

fn entry_point_impl(
    i: usize,
    symbol: *const i8,
    func: *mut *mut c_void,
    flags: u64,
    status: *mut i32,
) -> cudaError_t {
    let rc = crate::wrappers::forward_raw(
        i,
        |f: unsafe extern "C" fn(*const i8, *mut *mut c_void, u64, *mut i32) -> cudaError_t| {
            // SAFETY: forwarding the caller's arguments to the real entry-point query.
            unsafe { f(symbol, func, flags, status) }
        },
    );
    if rc == SUCCESS {
        // SAFETY: the caller's name and out-pointer, as the API requires.
        unsafe { substitute(symbol, func) };
    }
    rc
}

fn entry_point_by_version_impl(
    i: usize,
    symbol: *const i8,
    func: *mut *mut c_void,
    version: u32,
    flags: u64,
    status: *mut i32,
) -> cudaError_t {
    let rc = crate::wrappers::forward_raw(
        i,
        |f: unsafe extern "C" fn(
            *const i8,
            *mut *mut c_void,
            u32,
            u64,
            *mut i32,
        ) -> cudaError_t| {
            // SAFETY: forwarding the caller's arguments to the real entry-point query.
            unsafe { f(symbol, func, version, flags, status) }
        },
    );
    if rc == SUCCESS {
        // SAFETY: the caller's name and out-pointer, as the API requires.
        unsafe { substitute(symbol, func) };
    }
    rc
}

crate::variants!(entry_point_impl => cudaGetDriverEntryPoint, cudaGetDriverEntryPoint_ptsz;
    (symbol: *const i8, func: *mut *mut c_void, flags: u64, status: *mut i32));
crate::variants!(entry_point_by_version_impl => cudaGetDriverEntryPointByVersion, cudaGetDriverEntryPointByVersion_ptsz;
    (symbol: *const i8, func: *mut *mut c_void, version: u32, flags: u64, status: *mut i32));

/// The entry-point queries cudaw replaces.
pub fn table() -> Vec<(usize, usize)> {
    vec![
        (
            idx::cudaGetDriverEntryPoint,
            cudaGetDriverEntryPoint as *const () as usize,
        ),
        (
            idx::cudaGetDriverEntryPoint_ptsz,
            cudaGetDriverEntryPoint_ptsz as *const () as usize,
        ),
        (
            idx::cudaGetDriverEntryPointByVersion,
            cudaGetDriverEntryPointByVersion as *const () as usize,
        ),
        (
            idx::cudaGetDriverEntryPointByVersion_ptsz,
            cudaGetDriverEntryPointByVersion_ptsz as *const () as usize,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replacements_cover_every_name_once() {
        let mut seen = std::collections::HashSet::new();
        for n in NAMES {
            let (i, f) = replacement(n).unwrap();
            assert_eq!(NAMES[i], n);
            assert!(seen.insert(f), "{n} shares a replacement");
        }
        assert!(replacement("cuLaunchKernel").is_none());
    }
}

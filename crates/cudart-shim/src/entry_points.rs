//! `cudaGetDriverEntryPoint[ByVersion]`: the runtime's door to the driver. Frameworks fetch
//! driver functions through it (PyTorch's expandable segments take memory with
//! `cuMemCreate` + `cuMemMap` this way); for the allocation calls cudaw hands out its own
//! versions, so that memory is cudaw's too: `cuMemAlloc`/`cuMemFree` (and the async pair)
//! and `cuMemAllocPitch` come from the VMM like `cudaMalloc`; `cuMemCreate` and every call
//! that takes its handle (`cuMemMap`, `cuMemUnmap`, `cuMemRelease`, `cuMemSetAccess`,
//! `cuMemGetAllocationPropertiesFromHandle`, `cuMemExportToShareableHandle`,
//! `cuMemImportFromShareableHandle`, `cuMemRetainAllocationHandle`, `cuMulticastBindMem`)
//! go to [`crate::handles`], which virtualises the handles so that a pause can evict the
//! memory; reservations are recorded here. `cuMemCreate` of device memory and
//! `cuMemAllocManaged` are charged to the device's budget first (refused with
//! `CUDA_ERROR_OUT_OF_MEMORY` over the limit), and given back when the memory goes (a
//! released handle at its last unmap). `cuMemGetInfo` and `cuDeviceTotalMem` report the
//! limit, as `cudaMemGetInfo` does. Every other name passes through untouched.

#![allow(non_snake_case)]

use crate::boundary::guard;
use crate::handles;
use crate::memory;
use crate::types::*;
use cudaw_engine::memory_calls::{self as calls, to_cu, CU_ERROR_INVALID_VALUE, CU_SUCCESS};
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

const CU_ERROR_NOT_SUPPORTED: u32 = 801;

/// The driver functions cudaw replaces, each by the function of this module of its name
/// (indices into [`NAMES`] and [`REAL`] follow this order): [`NAMES`] and
/// [`replacement_at`].
macro_rules! replaced {
    ($($name:ident),+ $(,)?) => {
        /// The driver functions cudaw replaces: (name, index in [`REAL`]).
        const NAMES: [&str; [$(stringify!($name)),+].len()] = [$(stringify!($name)),+];

        /// cudaw's replacement for `NAMES[i]`.
        fn replacement_at(i: usize) -> usize {
            [$($name as *const () as usize),+][i]
        }
    };
}

replaced! {
    cuMemAlloc, cuMemFree, cuMemAllocAsync, cuMemFreeAsync, cuMemCreate, cuMemRelease, cuMemMap,
    cuMemUnmap, cuMemAddressReserve, cuMemAddressFree, cuMemGetInfo, cuDeviceTotalMem,
    cuMemAllocManaged, cuMemAllocPitch, cuMemSetAccess, cuMemGetAllocationPropertiesFromHandle,
    cuMemExportToShareableHandle, cuMemImportFromShareableHandle, cuMemRetainAllocationHandle,
    cuMulticastBindMem, cuMulticastBindMem_v2,
}

/// The real driver function behind each of [`NAMES`], as the entry point returned it.
static REAL: [AtomicUsize; NAMES.len()] = [const { AtomicUsize::new(0) }; NAMES.len()];

fn real(i: usize) -> Option<usize> {
    match REAL[i].load(Ordering::Acquire) {
        0 => None,
        p => Some(p),
    }
}

/// Calls the real driver function behind `NAMES[$i]`, `$name` in cuda.h, with the C
/// signature `fn($t...) -> CUresult` (checked against the header's at compile time).
macro_rules! drv_forward {
    ($i:expr, $name:ident : fn($($t:ty),*), $($arg:expr),*) => {{
        driver::check_signature!(driver, $name, unsafe extern "C" fn($($t),*) -> u32);
        match real($i) {
            // SAFETY: the address the driver's entry point returned for this name, whose
            // C signature (cuda.h) is written here; the application's arguments unchanged.
            Some(p) => unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> u32>(p)($($arg),*) },
            None => CU_ERROR_NOT_SUPPORTED,
        }
    }};
}

extern "C" fn cuMemAlloc(dptr: *mut u64, size: usize) -> u32 {
    guard("cuMemAlloc", 999, || calls::entry_alloc(dptr, size))
}

extern "C" fn cuMemFree(ptr: u64) -> u32 {
    guard("cuMemFree", 999, || match memory::lookup(ptr) {
        Some((mem, a)) if a.base == ptr => {
            let _in_flight = cudaw_engine::inflight::enter();
            crate::call_real!(cudaDeviceSynchronize: fn() -> cudaError_t,);
            crate::tracing::free(ptr);
            match mem.vmm.free(ptr) {
                Ok(()) => CU_SUCCESS,
                Err(e) => to_cu(e.cuda_error_code()),
            }
        }
        Some(_) => CU_ERROR_INVALID_VALUE,
        None => {
            let rc = drv_forward!(1, cuMemFree_v2: fn(u64), ptr);
            if rc == CU_SUCCESS {
                memory::freed_managed(ptr);
            }
            rc
        }
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
            let _in_flight = cudaw_engine::inflight::enter();
            to_cu(mem.free_on_stream(ptr, stream))
        }
        Some(_) => CU_ERROR_INVALID_VALUE,
        None => drv_forward!(3, cuMemFreeAsync: fn(u64, cudaStream_t), ptr, stream),
    })
}

/// One replacement per entry that runs a [`crate::handles`] function inside the panic
/// boundary (named by the replaced function); `#unsafe` where it reads or writes the
/// application's pointers, as the API requires.
macro_rules! handle_calls {
    ($($name:ident => $(#$unsafe:ident)? $f:ident($($a:ident: $t:ty),*) $(, $extra:expr)?;)+) => {$(
        extern "C" fn $name($($a: $t),*) -> u32 {
            guard(stringify!($name), 999, || {
                handle_calls!(@call $($unsafe)? handles::$f($($a),* $(, $extra)?))
            })
        }
    )+};
    (@call unsafe $e:expr) => {
        // SAFETY: the application's pointers, as the API requires.
        unsafe { $e }
    };
    (@call $e:expr) => {
        $e
    };
}

handle_calls! {
    cuMemCreate => #unsafe create(handle: *mut u64, size: usize, prop: *const c_void, flags: u64),
        true;
    cuMemRelease => release(handle: u64);
    cuMemMap => map(ptr: u64, size: usize, offset: usize, handle: u64, flags: u64);
    cuMemUnmap => unmap(ptr: u64, size: usize);
    cuMemSetAccess => #unsafe set_access(ptr: u64, size: usize, desc: *const c_void, count: usize);
    cuMemGetAllocationPropertiesFromHandle => #unsafe properties(prop: *mut c_void, handle: u64);
    cuMemExportToShareableHandle => export(out: *mut c_void, handle: u64, kind: u32, flags: u64);
    cuMemImportFromShareableHandle => #unsafe import(out: *mut u64, os: *mut c_void, kind: u32);
    cuMemRetainAllocationHandle => #unsafe retain(out: *mut u64, addr: *mut c_void);
    cuMulticastBindMem => bind(
        mc: u64, mc_offset: usize, handle: u64, offset: usize, size: usize, flags: u64);
    cuMulticastBindMem_v2 => bind_v2(
        mc: u64, dev: i32, mc_offset: usize, handle: u64, offset: usize, size: usize, flags: u64);
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
            8, cuMemAddressReserve:
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
            calls::reserved(base, size as u64);
        }
        rc
    })
}

extern "C" fn cuMemAddressFree(ptr: u64, size: usize) -> u32 {
    guard("cuMemAddressFree", 999, || {
        let rc = drv_forward!(9, cuMemAddressFree: fn(u64, usize), ptr, size);
        if rc == CU_SUCCESS {
            calls::unreserved(ptr);
        }
        rc
    })
}

extern "C" fn cuMemGetInfo(free: *mut usize, total: *mut usize) -> u32 {
    guard("cuMemGetInfo", 999, || {
        if free.is_null() || total.is_null() {
            return drv_forward!(10, cuMemGetInfo_v2: fn(*mut usize, *mut usize), free, total);
        }
        let query = |f: &mut usize, t: &mut usize| drv_forward!(10, cuMemGetInfo_v2: fn(*mut usize, *mut usize), f, t);
        match calls::memory_info(query) {
            // SAFETY: both non-null out-pointers from the caller.
            Ok((f, t)) => unsafe {
                free.write(f);
                total.write(t);
                CU_SUCCESS
            },
            Err(rc) => rc,
        }
    })
}

extern "C" fn cuDeviceTotalMem(bytes: *mut usize, dev: i32) -> u32 {
    guard("cuDeviceTotalMem", 999, || {
        let rc = drv_forward!(11, cuDeviceTotalMem_v2: fn(*mut usize, i32), bytes, dev);
        if rc == CU_SUCCESS && !bytes.is_null() && memory::has_limit(dev) {
            // SAFETY: the driver wrote the total through the caller's non-null pointer.
            let card = unsafe { bytes.read() } as u64;
            let limited = calls::limited_total(dev, card);
            if limited != card {
                // SAFETY: as above; written only when the limit changes it.
                unsafe { bytes.write(limited as usize) };
            }
        }
        rc
    })
}

extern "C" fn cuMemAllocManaged(dptr: *mut u64, size: usize, flags: u32) -> u32 {
    guard("cuMemAllocManaged", 999, || {
        if dptr.is_null() || size == 0 {
            return drv_forward!(12, cuMemAllocManaged: fn(*mut u64, usize, u32), dptr, size, flags);
        }
        let forward =
            || drv_forward!(12, cuMemAllocManaged: fn(*mut u64, usize, u32), dptr, size, flags);
        let made = || match forward() {
            // SAFETY: the driver wrote the pointer through the caller's non-null pointer.
            CU_SUCCESS => (CU_SUCCESS, Some(unsafe { dptr.read() })),
            rc => (rc, None),
        };
        calls::managed(size as u64, made).unwrap_or_else(to_cu)
    })
}

extern "C" fn cuMemAllocPitch(
    dptr: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element: u32,
) -> u32 {
    guard("cuMemAllocPitch", 999, || {
        calls::entry_alloc_pitch(dptr, pitch, width, height, element)
    })
}

/// cudaw's replacement for driver function `name`, if it has one.
fn replacement(name: &str) -> Option<(usize, usize)> {
    let i = NAMES.iter().position(|n| *n == name)?;
    Some((i, replacement_at(i)))
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
    let name = unsafe { CStr::from_ptr(symbol.cast()) }.to_string_lossy();
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
    type EntryPoint =
        unsafe extern "C" fn(*const i8, *mut *mut c_void, u64, *mut i32) -> cudaError_t;
    driver::check_signature!(runtime, cudaGetDriverEntryPoint, EntryPoint);
    let rc = crate::wrappers::forward_raw(i, |f: EntryPoint| {
        // SAFETY: forwarding the caller's arguments to the real entry-point query.
        unsafe { f(symbol, func, flags, status) }
    });
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
    type EntryPoint =
        unsafe extern "C" fn(*const i8, *mut *mut c_void, u32, u64, *mut i32) -> cudaError_t;
    driver::check_signature!(runtime, cudaGetDriverEntryPointByVersion, EntryPoint);
    let rc = crate::wrappers::forward_raw(i, |f: EntryPoint| {
        // SAFETY: forwarding the caller's arguments to the real entry-point query.
        unsafe { f(symbol, func, version, flags, status) }
    });
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

//! Device memory taken through the driver by callers the runtime shim does not account for
//! (cuBLAS's and NCCL's own allocations, a driver-only program's): charged to the runtime's
//! budget of the current device before the driver is asked (over the limit the call fails
//! with `CUDA_ERROR_OUT_OF_MEMORY`, as the runtime's allocations do), given back at the
//! free or release. A call made inside one of the runtime shim's wrapped calls, or by
//! cudaw's own threads, is the runtime's to account and passes uncounted. Without a runtime
//! shim in the process nothing is charged; the bytes are still tallied for the report.
//!
//! `cuMemCreate` and every call that takes its handle (`cuMemMap`, `cuMemUnmap`,
//! `cuMemRelease`, `cuMemSetAccess`, `cuMemGetAllocationPropertiesFromHandle`,
//! `cuMemExportToShareableHandle`, `cuMemImportFromShareableHandle`,
//! `cuMemRetainAllocationHandle`, `cuMulticastBindMem*`) go, when the runtime shim is in the
//! process, to its handle table (`cudart-shim/src/handles.rs`, through
//! [`driver::hooks::HandleHooks`]): the handles are virtual, and a pause evicts the memory
//! behind them. Without a runtime shim they are forwarded, `cuMemCreate` tallied.
//!
//! Not done: `cuMemAlloc*` memory does not come from cudaw's VMM, so a pause does not evict
//! it and a checkpoint does not hold it.

#![allow(non_snake_case)]

use crate::boundary::{guard, CUDA_ERROR_UNKNOWN};
use crate::dispatch::idx;
use driver::hooks::{CHARGED, REFUSED};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

type Handle = *mut c_void;

const CUDA_ERROR_OUT_OF_MEMORY: u32 = 2;

/// A live allocation: (device, bytes, charged to the runtime's budget).
type Live = (i32, u64, bool);

/// Live allocations: device pointer or physical handle → what it holds.
static LIVE: LazyLock<Mutex<HashMap<u64, Live>>> = LazyLock::new(Default::default);
static BYTES: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);

/// Bytes the driver shim holds for its callers now, and at most so far.
pub fn bytes() -> (u64, u64) {
    (BYTES.load(Ordering::Relaxed), PEAK.load(Ordering::Relaxed))
}

fn current_device() -> Option<i32> {
    let mut dev = 0i32;
    (crate::forward!(cuCtxGetDevice: fn(*mut i32), &mut dev) == 0).then_some(dev)
}

/// A charge taken before an allocation.
struct Charge {
    device: i32,
    bytes: u64,
    charged: bool,
}

/// Charges `bytes` on the current device unless the runtime accounts for this thread;
/// `Err` when the budget refuses.
fn charge(bytes: u64) -> Result<Option<Charge>, u32> {
    if bytes == 0 || crate::runtime::runtime_accounts() {
        return Ok(None);
    }
    let device = current_device().unwrap_or(0);
    let charged = match crate::runtime::hooks().map(|h| (h.charge)(device, bytes)) {
        Some(REFUSED) => return Err(CUDA_ERROR_OUT_OF_MEMORY),
        Some(c) => c == CHARGED,
        None => false,
    };
    Ok(Some(Charge {
        device,
        bytes,
        charged,
    }))
}

/// After the driver answered: keeps the charge under `key`, or gives it back.
fn settle(c: Option<Charge>, rc: u32, key: impl FnOnce() -> Option<u64>) {
    let Some(c) = c else { return };
    match key().filter(|_| rc == 0) {
        Some(k) => {
            LIVE.lock().insert(k, (c.device, c.bytes, c.charged));
            let now = BYTES.fetch_add(c.bytes, Ordering::Relaxed) + c.bytes;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        None => give_back(c.device, c.bytes, c.charged),
    }
}

fn give_back(device: i32, bytes: u64, charged: bool) {
    if charged {
        if let Some(h) = crate::runtime::hooks() {
            (h.uncharge)(device, bytes);
        }
    }
}

/// Gives back what `key` was charged, once it is gone.
fn released(key: u64) {
    if let Some((device, bytes, charged)) = LIVE.lock().remove(&key) {
        BYTES.fetch_sub(bytes, Ordering::Relaxed);
        give_back(device, bytes, charged);
    }
}

/// Reads the `u64` the driver wrote through `out`.
fn written(out: *mut u64) -> Option<u64> {
    // SAFETY: non-null, and the driver just wrote through it (the call succeeded).
    (!out.is_null()).then(|| unsafe { out.read() })
}

/// An allocation of `$bytes` whose pointer or handle the driver writes through `$out`.
macro_rules! allocation {
    ($name:ident ($($a:ident : $t:ty),* $(,)?) => bytes $bytes:expr, out $out:expr) => {
        allocation!($name = $name ($($a: $t),*) => bytes $bytes, out $out);
    };
    ($fn_name:ident = $name:ident ($($a:ident : $t:ty),* $(,)?) => bytes $bytes:expr, out $out:expr) => {
        extern "C" fn $fn_name($($a: $t),*) -> u32 {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let c = match charge($bytes as u64) {
                    Ok(c) => c,
                    Err(rc) => return rc,
                };
                let rc = crate::forward!($name: fn($($t),*) $(, $a)*);
                settle(c, rc, || written($out));
                rc
            })
        }
    };
}

/// A free of `$key`.
macro_rules! release {
    ($name:ident ($($a:ident : $t:ty),* $(,)?) => $key:expr) => {
        release!($name = $name ($($a: $t),*) => $key);
    };
    ($fn_name:ident = $name:ident ($($a:ident : $t:ty),* $(,)?) => $key:expr) => {
        extern "C" fn $fn_name($($a: $t),*) -> u32 {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let rc = crate::forward!($name: fn($($t),*) $(, $a)*);
                if rc == 0 {
                    released($key);
                }
                rc
            })
        }
    };
}

allocation!(cuMemAlloc_v2(out: *mut u64, size: usize) => bytes size, out out);
allocation!(cuMemAllocPitch_v2(out: *mut u64, pitch: *mut usize, width: usize, height: usize,
    element: u32) => bytes width.saturating_mul(height), out out);
allocation!(cuMemAllocAsync(out: *mut u64, size: usize, stream: Handle) => bytes size, out out);
allocation!(cuMemAllocAsync_ptsz(out: *mut u64, size: usize, stream: Handle)
    => bytes size, out out);
allocation!(cuMemAllocFromPoolAsync(out: *mut u64, size: usize, pool: Handle, stream: Handle)
    => bytes size, out out);
allocation!(cuMemAllocFromPoolAsync_ptsz(out: *mut u64, size: usize, pool: Handle,
    stream: Handle) => bytes size, out out);
allocation!(forward_mem_create = cuMemCreate(out: *mut u64, size: usize, prop: *const c_void,
    flags: u64) => bytes size, out out);
release!(cuMemFree_v2(ptr: u64) => ptr);
release!(cuMemFreeAsync(ptr: u64, stream: Handle) => ptr);
release!(cuMemFreeAsync_ptsz(ptr: u64, stream: Handle) => ptr);
release!(forward_mem_release = cuMemRelease(handle: u64) => handle);

/// A driver function that takes or makes a physical-memory handle: to the runtime
/// shim's handle table when it is there (`$hook`), else forwarded (`$fallback`).
macro_rules! handle_call {
    ($name:ident ($($a:ident : $t:ty),* $(,)?) => $hook:ident, else $fallback:expr) => {
        extern "C" fn $name($($a: $t),*) -> u32 {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                match crate::runtime::handles() {
                    Some(h) => (h.$hook)($($a),*),
                    None => $fallback,
                }
            })
        }
    };
}

extern "C" fn cuMemCreate(out: *mut u64, size: usize, prop: *const c_void, flags: u64) -> u32 {
    guard("cuMemCreate", CUDA_ERROR_UNKNOWN, || {
        match crate::runtime::handles() {
            // Charged unless the runtime accounts for this thread (its own calls).
            Some(h) => (h.mem_create)(out, size, prop, flags, !crate::runtime::runtime_accounts()),
            None => forward_mem_create(out, size, prop, flags),
        }
    })
}

handle_call!(cuMemRelease(handle: u64) => mem_release, else forward_mem_release(handle));
handle_call!(cuMemMap(ptr: u64, size: usize, offset: usize, handle: u64, flags: u64)
    => mem_map, else crate::forward!(cuMemMap: fn(u64, usize, usize, u64, u64), ptr, size,
        offset, handle, flags));
handle_call!(cuMemUnmap(ptr: u64, size: usize) => mem_unmap,
    else crate::forward!(cuMemUnmap: fn(u64, usize), ptr, size));
handle_call!(cuMemSetAccess(ptr: u64, size: usize, desc: *const c_void, count: usize)
    => mem_set_access, else crate::forward!(cuMemSetAccess: fn(u64, usize, *const c_void,
        usize), ptr, size, desc, count));
handle_call!(cuMemGetAllocationPropertiesFromHandle(prop: *mut c_void, handle: u64)
    => mem_properties, else crate::forward!(cuMemGetAllocationPropertiesFromHandle:
        fn(*mut c_void, u64), prop, handle));
handle_call!(cuMemExportToShareableHandle(out: *mut c_void, handle: u64, kind: u32, flags: u64)
    => mem_export, else crate::forward!(cuMemExportToShareableHandle: fn(*mut c_void, u64,
        u32, u64), out, handle, kind, flags));
handle_call!(cuMemImportFromShareableHandle(out: *mut u64, os: *mut c_void, kind: u32)
    => mem_import, else crate::forward!(cuMemImportFromShareableHandle: fn(*mut u64,
        *mut c_void, u32), out, os, kind));
handle_call!(cuMemRetainAllocationHandle(out: *mut u64, addr: *mut c_void)
    => mem_retain, else crate::forward!(cuMemRetainAllocationHandle: fn(*mut u64,
        *mut c_void), out, addr));
handle_call!(cuMulticastBindMem(mc: u64, mc_offset: usize, handle: u64, offset: usize,
    size: usize, flags: u64) => multicast_bind_mem, else crate::forward!(cuMulticastBindMem:
        fn(u64, usize, u64, usize, usize, u64), mc, mc_offset, handle, offset, size, flags));
handle_call!(cuMulticastBindMem_v2(mc: u64, dev: i32, mc_offset: usize, handle: u64,
    offset: usize, size: usize, flags: u64) => multicast_bind_mem_v2,
    else crate::forward!(cuMulticastBindMem_v2: fn(u64, i32, usize, u64, usize, usize, u64),
        mc, dev, mc_offset, handle, offset, size, flags));

/// The wrappers of this module: (index, function).
pub fn table() -> Vec<(usize, usize)> {
    macro_rules! entries {
        ($($name:ident),* $(,)?) => { vec![$((idx::$name, $name as *const () as usize)),*] };
    }
    entries![
        cuMemAlloc_v2,
        cuMemAllocPitch_v2,
        cuMemAllocAsync,
        cuMemAllocAsync_ptsz,
        cuMemAllocFromPoolAsync,
        cuMemAllocFromPoolAsync_ptsz,
        cuMemCreate,
        cuMemFree_v2,
        cuMemFreeAsync,
        cuMemFreeAsync_ptsz,
        cuMemRelease,
        cuMemMap,
        cuMemUnmap,
        cuMemSetAccess,
        cuMemGetAllocationPropertiesFromHandle,
        cuMemExportToShareableHandle,
        cuMemImportFromShareableHandle,
        cuMemRetainAllocationHandle,
        cuMulticastBindMem,
        cuMulticastBindMem_v2,
    ]
}

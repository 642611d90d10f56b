//! Device memory taken through the driver by callers the runtime shim does not account for
//! (cuBLAS's and NCCL's own allocations, Triton's, a driver-only program's).
//!
//! `cuMemAlloc`, `cuMemAllocPitch`, `cuMemAllocAsync` and `cuMemAllocFromPoolAsync` come,
//! when the runtime shim is in the process and its addressing is mapped, from cudaw's VMM
//! (through [`driver::hooks::MemoryHooks`], `crates/cudart-shim/src/hooks.rs`), the same path as
//! `cudaMalloc`: the pointer is the VMM's device address, which the caller uses directly;
//! a pause evicts the memory and a checkpoint holds it; the VMM charges it to the device's
//! budget (granule rounding included). The stream-ordered calls take the memory at once
//! (usable on every stream); `cuMemFreeAsync` releases it once its stream reaches the free.
//! A pool's own attributes (release threshold, IPC export) do not apply to such memory.
//! A stream-ordered allocation on a stream being captured into a graph is forwarded, so the
//! graph gets its allocation node. `cuMemFree*` of a pointer the VMM does not own goes to
//! the real driver.
//!
//! Otherwise — no runtime shim, translated addressing (the program would get a pointer the
//! real driver does not know), a device the VMM cannot serve — the call is forwarded and
//! charged to the runtime's budget of the current device before the driver is asked (over
//! the limit it fails with `CUDA_ERROR_OUT_OF_MEMORY`, as the runtime's allocations do),
//! given back at the free. A call made inside one of the runtime shim's wrapped calls, or
//! by cudaw's own threads, is the runtime's to account and is forwarded uncounted. Without
//! a runtime shim nothing is charged; the bytes are still tallied for the report.
//!
//! Pointer queries (`cuMemGetAddressRange`, `cuPointerGetAttribute(s)`'s
//! `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR` / `RANGE_SIZE`) of VMM memory answer with the
//! allocation, as the driver does for `cuMemAlloc` memory: the real driver, asked about
//! memory mapped with `cuMemMap`, names the mapping, which the VMM shares between small
//! allocations. `MAPPING_BASE_ADDR` / `MAPPING_SIZE` stay the driver's (they name the
//! mapping).
//!
//! `cuMemCreate` and every call that takes its handle (`cuMemMap`, `cuMemUnmap`,
//! `cuMemRelease`, `cuMemSetAccess`, `cuMemGetAllocationPropertiesFromHandle`,
//! `cuMemExportToShareableHandle`, `cuMemImportFromShareableHandle`,
//! `cuMemRetainAllocationHandle`, `cuMulticastBindMem*`) go, when the runtime shim is in the
//! process, to its handle table (`crates/cudart-shim/src/handles.rs`, through
//! [`driver::hooks::HandleHooks`]): the handles are virtual, and a pause evicts the memory
//! behind them. Without a runtime shim they are forwarded, `cuMemCreate` tallied.
//!
//! `cuCtxEnablePeerAccess` / `cuCtxDisablePeerAccess` are forwarded; once the driver agrees,
//! the runtime shim is told ([`MemoryHooks::peer_access`]), which grants the current
//! context's device access to the peer context's device's memory of cudaw's (VMM mappings
//! and driver handles), or takes it away: the driver's peer access reaches only memory of
//! `cuMemAlloc`, a `cuMemMap` mapping needs it per mapping.

#![allow(non_snake_case)]

use crate::boundary::{guard, CUDA_ERROR_UNKNOWN};
use driver::hooks::{MemoryHooks, CHARGED, NOT_MINE, REFUSED};
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
/// Allocations the runtime's VMM served for the driver shim's callers.
static FROM_VMM: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);

/// Bytes the driver shim holds for its callers now, and at most so far.
pub fn bytes() -> (u64, u64) {
    (BYTES.load(Ordering::Relaxed), PEAK.load(Ordering::Relaxed))
}

fn current_device() -> Option<i32> {
    let mut dev = 0i32;
    (crate::forward!(cuCtxGetDevice: fn(*mut i32), &mut dev) == 0).then_some(dev)
}

/// Allocations served by cudaw's VMM so far.
pub fn from_vmm_count() -> u64 {
    FROM_VMM.load(Ordering::Relaxed)
}

/// Asks the runtime's VMM for an allocation on the current context's device: `None` when it
/// is not the VMM's to serve (the caller forwards), else its `CUresult`.
fn from_vmm(f: impl FnOnce(&MemoryHooks, i32) -> u32) -> Option<u32> {
    if crate::runtime::runtime_accounts() {
        return None;
    }
    let h = crate::runtime::memory()?;
    // No current context: the real driver gives the program its error.
    let device = current_device()?;
    match f(h, device) {
        NOT_MINE => None,
        rc => {
            if rc == 0 {
                FROM_VMM.fetch_add(1, Ordering::Relaxed);
            }
            Some(rc)
        }
    }
}

/// Whether `stream` is being captured into a graph (`cuStreamIsCapturing`; `ptsz`: the
/// per-thread default stream's form). A driver without the call captures nothing.
pub(crate) fn capturing(stream: Handle, ptsz: bool) -> bool {
    let mut status = 0u32;
    let rc = if ptsz {
        crate::forward!(cuStreamIsCapturing_ptsz: fn(Handle, *mut u32), stream, &mut status)
    } else {
        crate::forward!(cuStreamIsCapturing: fn(Handle, *mut u32), stream, &mut status)
    };
    // CU_STREAM_CAPTURE_STATUS_NONE is 0; ACTIVE and INVALIDATED both mean a capture.
    rc == 0 && status != 0
}

/// A stream-ordered allocation from the VMM, unless `stream` is being captured into a
/// graph ([`NOT_MINE`]: the real driver gives the graph its allocation node; the VMM would
/// hand out memory at once, and the graph's replays would outlive its free).
fn ordered(
    h: &MemoryHooks,
    out: *mut u64,
    size: usize,
    dev: i32,
    stream: Handle,
    ptsz: bool,
) -> u32 {
    if capturing(stream, ptsz) {
        NOT_MINE
    } else {
        (h.mem_alloc)(out, size, dev)
    }
}

/// Frees `ptr` in the runtime's VMM: `None` when the VMM does not own it.
fn free_in_vmm(ptr: u64, f: impl FnOnce(&MemoryHooks) -> u32) -> Option<u32> {
    if ptr == 0 {
        return None;
    }
    match f(crate::runtime::memory()?) {
        NOT_MINE => None,
        rc => Some(rc),
    }
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

/// An allocation of `$bytes` whose pointer or handle the driver writes through `$out`; with
/// `vmm`, asked of the runtime's VMM first.
macro_rules! allocation {
    ($name:ident ($($a:ident : $t:ty),* $(,)?) => vmm $vmm:expr, bytes $bytes:expr,
        out $out:expr) => {
        pub(crate) extern "C" fn $name($($a: $t),*) -> u32 {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                if let Some(rc) = from_vmm($vmm) {
                    return rc;
                }
                forwarded(|| charge($bytes as u64), || crate::forward!($name: fn($($t),*) $(, $a)*),
                    || written($out))
            })
        }
    };
    ($fn_name:ident = $name:ident ($($a:ident : $t:ty),* $(,)?) => bytes $bytes:expr, out $out:expr) => {
        pub(crate) extern "C" fn $fn_name($($a: $t),*) -> u32 {
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

/// The forwarded allocation: charged, asked of the real driver, settled under the key
/// `out` reads.
fn forwarded(
    charge: impl FnOnce() -> Result<Option<Charge>, u32>,
    call: impl FnOnce() -> u32,
    out: impl FnOnce() -> Option<u64>,
) -> u32 {
    let c = match charge() {
        Ok(c) => c,
        Err(rc) => return rc,
    };
    let rc = call();
    settle(c, rc, out);
    rc
}

/// A free of `$key`.
macro_rules! release {
    ($name:ident ($($a:ident : $t:ty),* $(,)?) => vmm $vmm:expr, key $key:expr) => {
        pub(crate) extern "C" fn $name($($a: $t),*) -> u32 {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                if let Some(rc) = free_in_vmm($key, $vmm) {
                    return rc;
                }
                let rc = crate::forward!($name: fn($($t),*) $(, $a)*);
                if rc == 0 {
                    released($key);
                }
                rc
            })
        }
    };
    ($fn_name:ident = $name:ident ($($a:ident : $t:ty),* $(,)?) => $key:expr) => {
        pub(crate) extern "C" fn $fn_name($($a: $t),*) -> u32 {
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

allocation!(cuMemAlloc_v2(out: *mut u64, size: usize)
    => vmm |h, dev| (h.mem_alloc)(out, size, dev), bytes size, out out);
allocation!(cuMemAllocPitch_v2(out: *mut u64, pitch: *mut usize, width: usize, height: usize,
    element: u32) => vmm |h, dev| (h.mem_alloc_pitch)(out, pitch, width, height, element, dev),
    bytes width.saturating_mul(height), out out);
allocation!(cuMemAllocAsync(out: *mut u64, size: usize, stream: Handle)
    => vmm |h, dev| ordered(h, out, size, dev, stream, false), bytes size, out out);
allocation!(cuMemAllocAsync_ptsz(out: *mut u64, size: usize, stream: Handle)
    => vmm |h, dev| ordered(h, out, size, dev, stream, true), bytes size, out out);
allocation!(cuMemAllocFromPoolAsync(out: *mut u64, size: usize, pool: Handle, stream: Handle)
    => vmm |h, dev| ordered(h, out, size, dev, stream, false), bytes size, out out);
allocation!(cuMemAllocFromPoolAsync_ptsz(out: *mut u64, size: usize, pool: Handle,
    stream: Handle) => vmm |h, dev| ordered(h, out, size, dev, stream, true), bytes size,
    out out);
allocation!(forward_mem_create = cuMemCreate(out: *mut u64, size: usize, prop: *const c_void,
    flags: u64) => bytes size, out out);
release!(cuMemFree_v2(ptr: u64) => vmm |h| (h.mem_free)(ptr), key ptr);
release!(cuMemFreeAsync(ptr: u64, stream: Handle) => vmm |h| (h.mem_free_async)(ptr, stream),
    key ptr);
release!(cuMemFreeAsync_ptsz(ptr: u64, stream: Handle)
    => vmm |h| (h.mem_free_async)(ptr, stream), key ptr);
release!(forward_mem_release = cuMemRelease(handle: u64) => handle);

/// A driver function that takes or makes a physical-memory handle: to the runtime
/// shim's handle table when it is there (`$hook`), else forwarded (`$fallback`).
macro_rules! handle_call {
    ($name:ident ($($a:ident : $t:ty),* $(,)?) => $hook:ident, else $fallback:expr) => {
        pub(crate) extern "C" fn $name($($a: $t),*) -> u32 {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                match crate::runtime::handles() {
                    Some(h) => (h.$hook)($($a),*),
                    None => $fallback,
                }
            })
        }
    };
}

pub(crate) extern "C" fn cuMemCreate(
    out: *mut u64,
    size: usize,
    prop: *const c_void,
    flags: u64,
) -> u32 {
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

/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR` (a `CUdeviceptr`).
const RANGE_START_ADDR: u32 = 11;
/// `CU_POINTER_ATTRIBUTE_RANGE_SIZE` (a `size_t`).
const RANGE_SIZE: u32 = 12;

/// The VMM allocation holding `ptr`: (base, size).
fn vmm_allocation(ptr: u64) -> Option<(u64, u64)> {
    let h = crate::runtime::memory()?;
    let (mut base, mut size) = (0u64, 0u64);
    (h.allocation)(ptr, &mut base, &mut size).then_some((base, size))
}

/// Whether the driver's answer `rc` may be replaced by cudaw's for VMM memory: it succeeded,
/// or the driver lacks the function.
fn answerable(rc: u32) -> bool {
    rc == 0 || rc == crate::dispatch::CUDA_ERROR_NOT_SUPPORTED
}

/// The device of context `ctx` (`cuCtxGetDevice` asks the current one: pushed, asked,
/// popped).
fn device_of_context(ctx: Handle) -> Option<i32> {
    if crate::forward!(cuCtxPushCurrent_v2: fn(Handle), ctx) != 0 {
        return None;
    }
    let dev = current_device();
    let mut popped: Handle = std::ptr::null_mut();
    let _ = crate::forward!(cuCtxPopCurrent_v2: fn(*mut Handle), &mut popped);
    dev
}

/// Tells the runtime shim that the current context's device may (or no longer may) access
/// the memory of `peer`'s device.
fn peer_access_changed(peer: Handle, enabled: bool) {
    let Some(h) = crate::runtime::memory() else {
        return;
    };
    if let (Some(accessor), Some(owner)) = (current_device(), device_of_context(peer)) {
        (h.peer_access)(accessor, owner, enabled);
    }
}

/// `cuMemHostRegister[_v2]`: memory the program page-locks itself is its own from now on;
/// what smart pinning registered there is unregistered first (the runtime shim's
/// [`MemoryHooks::host_register`]).
pub(crate) extern "C" fn cuMemHostRegister_v2(ptr: *mut c_void, size: usize, flags: u32) -> u32 {
    guard("cuMemHostRegister_v2", CUDA_ERROR_UNKNOWN, || {
        if let Some(h) = crate::runtime::memory() {
            (h.host_register)(ptr as u64, size as u64);
        }
        crate::forward!(cuMemHostRegister_v2: fn(*mut c_void, usize, u32), ptr, size, flags)
    })
}

/// `cuMemHostRegister` (the older export): as [`cuMemHostRegister_v2`].
pub(crate) extern "C" fn cuMemHostRegister(ptr: *mut c_void, size: usize, flags: u32) -> u32 {
    guard("cuMemHostRegister", CUDA_ERROR_UNKNOWN, || {
        if let Some(h) = crate::runtime::memory() {
            (h.host_register)(ptr as u64, size as u64);
        }
        crate::forward!(cuMemHostRegister: fn(*mut c_void, usize, u32), ptr, size, flags)
    })
}

/// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`: enabled (by an earlier call).
const PEER_ACCESS_ALREADY_ENABLED: u32 = 704;
/// `CUDA_ERROR_PEER_ACCESS_NOT_ENABLED`: disabled (or never enabled).
const PEER_ACCESS_NOT_ENABLED: u32 = 705;

pub(crate) extern "C" fn cuCtxEnablePeerAccess(peer: Handle, flags: u32) -> u32 {
    guard("cuCtxEnablePeerAccess", CUDA_ERROR_UNKNOWN, || {
        let rc = crate::forward!(cuCtxEnablePeerAccess: fn(Handle, u32), peer, flags);
        if rc == 0 || rc == PEER_ACCESS_ALREADY_ENABLED {
            peer_access_changed(peer, true);
        }
        rc
    })
}

pub(crate) extern "C" fn cuCtxDisablePeerAccess(peer: Handle) -> u32 {
    guard("cuCtxDisablePeerAccess", CUDA_ERROR_UNKNOWN, || {
        let rc = crate::forward!(cuCtxDisablePeerAccess: fn(Handle), peer);
        if rc == 0 || rc == PEER_ACCESS_NOT_ENABLED {
            peer_access_changed(peer, false);
        }
        rc
    })
}

pub(crate) extern "C" fn cuMemGetAddressRange_v2(
    base: *mut u64,
    size: *mut usize,
    ptr: u64,
) -> u32 {
    guard("cuMemGetAddressRange_v2", CUDA_ERROR_UNKNOWN, || {
        let rc = crate::forward!(cuMemGetAddressRange_v2: fn(*mut u64, *mut usize, u64), base,
            size, ptr);
        if !answerable(rc) {
            return rc;
        }
        let Some((b, n)) = vmm_allocation(ptr) else {
            return rc;
        };
        // SAFETY: the caller's out-pointers, each null or valid for a write (cuda.h).
        unsafe {
            if !base.is_null() {
                base.write(b);
            }
            if !size.is_null() {
                size.write(n as usize);
            }
        }
        0
    })
}

/// Writes cudaw's answer for VMM memory through `data` when `attribute` is the range's;
/// whether it did.
fn range_attribute(data: *mut c_void, attribute: u32, ptr: u64) -> bool {
    if data.is_null() || !matches!(attribute, RANGE_START_ADDR | RANGE_SIZE) {
        return false;
    }
    let Some((base, size)) = vmm_allocation(ptr) else {
        return false;
    };
    let value = if attribute == RANGE_START_ADDR {
        base
    } else {
        size
    };
    // SAFETY: the caller's buffer for this attribute: a CUdeviceptr or a size_t, 8 bytes.
    unsafe { data.cast::<u64>().write_unaligned(value) };
    true
}

pub(crate) extern "C" fn cuPointerGetAttribute(data: *mut c_void, attribute: u32, ptr: u64) -> u32 {
    guard("cuPointerGetAttribute", CUDA_ERROR_UNKNOWN, || {
        let rc = crate::forward!(cuPointerGetAttribute: fn(*mut c_void, u32, u64), data,
            attribute, ptr);
        if answerable(rc) && range_attribute(data, attribute, ptr) {
            return 0;
        }
        rc
    })
}

pub(crate) extern "C" fn cuPointerGetAttributes(
    n: u32,
    attributes: *mut u32,
    data: *mut *mut c_void,
    ptr: u64,
) -> u32 {
    guard("cuPointerGetAttributes", CUDA_ERROR_UNKNOWN, || {
        let rc = crate::forward!(cuPointerGetAttributes: fn(u32, *mut u32, *mut *mut c_void,
            u64), n, attributes, data, ptr);
        if rc != 0 || attributes.is_null() || data.is_null() {
            return rc;
        }
        for i in 0..n as usize {
            // SAFETY: the caller's arrays of `n` attributes and `n` buffers (cuda.h); the
            // call succeeded with them.
            let (a, d) = unsafe { (attributes.add(i).read(), data.add(i).read()) };
            range_attribute(d, a, ptr);
        }
        rc
    })
}

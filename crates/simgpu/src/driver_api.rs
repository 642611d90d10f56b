//! The exported driver API: thin `extern "C"` functions with the real driver's names that
//! turn raw pointers into values once, then call the safe modules. Every body runs inside
//! [`boundary`], so a panic becomes `CUDA_ERROR_UNKNOWN` instead of crossing the C ABI.
//!
//! # Safety
//!
//! Every export has the contract of the driver function it is named after: each pointer
//! argument is null (refused with `CUDA_ERROR_INVALID_VALUE` where the driver refuses it)
//! or valid for the reads and writes the driver documents; host memory given to an
//! asynchronous copy stays valid until the stream has done the copy.
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // the module's Safety section covers every export

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::os::fd::IntoRawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::device::{self, Device, Machine};
use crate::error::{CuError, CuResult};
use crate::memory::{Access, Requested, GRANULARITY, HANDLE_TYPE_POSIX_FD};
use crate::stream::{Event, StreamId, Task};

/// `CUresult` on the wire.
pub type CUresult = c_uint;
/// `CUdevice`.
pub type CUdevice = c_int;
/// `CUdeviceptr`.
pub type CUdeviceptr = u64;
/// `CUcontext`, `CUstream`, `CUevent`: opaque pointers.
pub type Handle = *mut c_void;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemLocation {
    /// `CUmemLocationType`: 1 is `CU_MEM_LOCATION_TYPE_DEVICE`.
    pub type_: u32,
    /// The device ordinal.
    pub id: c_int,
}

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemAllocationProp {
    /// `CUmemAllocationType`: 1 is `CU_MEM_ALLOCATION_TYPE_PINNED`.
    pub type_: u32,
    /// `CUmemAllocationHandleType`.
    pub requested_handle_types: u32,
    /// Where the memory lives.
    pub location: MemLocation,
    /// Windows only.
    pub win32_handle_meta_data: *mut c_void,
    /// `allocFlags` (compression, RDMA, usage, reserved).
    pub alloc_flags: [u8; 8],
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemAccessDesc {
    /// Who gets access.
    pub location: MemLocation,
    /// `CUmemAccess_flags`.
    pub flags: u32,
}

const LOCATION_DEVICE: u32 = 1;
const ALLOCATION_PINNED: u32 = 1;

static PANICKED: AtomicBool = AtomicBool::new(false);

/// Runs an export's body; a panic is logged once and becomes `CUDA_ERROR_UNKNOWN`. A
/// process the driver's checkpoint API locked holds the call until unlock.
pub fn boundary(body: impl FnOnce() -> CuResult<()>) -> CUresult {
    let _inside = crate::checkpoint::enter();
    boundary_ungated(body)
}

/// [`boundary`] without the checkpoint gate: the checkpoint API's own entry points, which
/// act on other processes.
pub fn boundary_ungated(body: impl FnOnce() -> CuResult<()>) -> CUresult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => CuError::to_code(result),
        Err(_) => {
            if !PANICKED.swap(true, Ordering::Relaxed) {
                say!("simgpu: internal panic in a driver call (reported as CUDA_ERROR_UNKNOWN)");
            }
            CuError::CUDA_ERROR_UNKNOWN.code()
        }
    }
}

macro_rules! entry {
    ($body:block) => {
        boundary(move || -> CuResult<()> { $body })
    };
}

/// Writes `value` through an out-pointer; null is CUDA_ERROR_INVALID_VALUE.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T) -> CuResult<()> {
    if out.is_null() {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for writes by the caller's contract.
    unsafe { out.write(value) };
    Ok(())
}

/// Reads an in-pointer; null is CUDA_ERROR_INVALID_VALUE.
///
/// # Safety
/// `ptr` is null or valid for a read of `T`.
unsafe fn get<T: Copy>(ptr: *const T) -> CuResult<T> {
    if ptr.is_null() {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for reads by the caller's contract.
    Ok(unsafe { ptr.read() })
}

fn copy_task(dst: u64, src: u64, len: usize) -> Task {
    let delay = crate::config::copy_delay();
    Box::new(move || {
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        // SAFETY: both ranges were checked (device side) or promised by the caller (host
        // side) when the copy was enqueued; `copy` allows overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) }
    })
}

/// The device and stream a `CUstream` names, with a context current.
fn on_stream(stream: Handle) -> CuResult<(&'static Device, StreamId)> {
    Device::with_context()?;
    Machine::get()?.stream(stream as u64)
}

/// The current context's device's NULL stream.
fn on_null_stream() -> CuResult<(&'static Device, StreamId)> {
    Ok((Device::with_context()?, StreamId::Null))
}

/// Enqueues a copy after checking the device sides; `wait` makes it synchronous.
fn enqueue_copy(
    dst: u64,
    dst_device: bool,
    src: u64,
    src_device: bool,
    len: usize,
    on: (&Device, StreamId),
    wait: bool,
) -> CuResult<()> {
    let side = |addr, device| Side {
        addr,
        device,
        pitch: len as u64,
    };
    enqueue_rows(
        side(dst, dst_device),
        side(src, src_device),
        len,
        1,
        on,
        wait,
    )
}

/// One side of a copy: its first byte, whether it is device memory, and the distance
/// between its rows.
#[derive(Debug, Clone, Copy)]
struct Side {
    addr: u64,
    device: bool,
    pitch: u64,
}

/// Enqueues a copy of `height` rows of `width` bytes (a 1D copy is one row), each side
/// checked whole: a device side readable or writable, a host side by the driver's rule for
/// page-locked memory, over every byte from its first row's start to its last row's end.
/// `wait` makes it synchronous. Pageable host memory (neither allocated page-locked nor
/// registered) keeps its promises, as the driver's: an asynchronous copy from it returns
/// once the source is read (staged here: a snapshot), one to it once the bytes are there.
fn enqueue_rows(
    dst: Side,
    src: Side,
    width: usize,
    height: usize,
    (device, stream): (&Device, StreamId),
    wait: bool,
) -> CuResult<()> {
    if width == 0 || height == 0 {
        return Ok(());
    }
    if dst.addr == 0 || src.addr == 0 {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    let extent = |s: Side| s.pitch * (height as u64 - 1) + width as u64;
    let (dst_pageable, src_pageable) = {
        let memory = device.memory();
        if dst.device {
            memory.check_device(dst.addr, extent(dst), true)?;
        }
        if src.device {
            memory.check_device(src.addr, extent(src), false)?;
        }
        if !dst.device {
            memory.check_host_copy(dst.addr, extent(dst))?;
        }
        if !src.device {
            memory.check_host_copy(src.addr, extent(src))?;
        }
        let reachable = |addr: u64| memory.check_device(addr, 1, false).is_ok();
        (
            !dst.device && !reachable(dst.addr),
            !src.device && !reachable(src.addr),
        )
    };
    // The source read now (staged), the copy later; else read when the copy runs.
    let (from, staged) = if src_pageable && dst.device && !wait {
        let mut staged = Vec::with_capacity(width * height);
        for r in 0..height as u64 {
            // SAFETY: the caller's source rows are valid during the call.
            staged.extend_from_slice(unsafe {
                std::slice::from_raw_parts((src.addr + r * src.pitch) as *const u8, width)
            });
        }
        let at = staged.as_ptr() as u64;
        (
            Side {
                addr: at,
                device: false,
                pitch: width as u64,
            },
            Some(staged),
        )
    } else {
        (src, None)
    };
    let delay = crate::config::copy_delay();
    let task: Task = Box::new(move || {
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        for r in 0..height as u64 {
            // SAFETY: both sides were checked (device) or promised by the caller (host)
            // when the copy was enqueued, or the source is the snapshot this task owns;
            // `copy` allows overlap.
            unsafe {
                std::ptr::copy(
                    (from.addr + r * from.pitch) as *const u8,
                    (dst.addr + r * dst.pitch) as *mut u8,
                    width,
                )
            }
        }
        drop(staged);
    });
    let ticket = device.streams.enqueue(stream, task)?;
    if wait || (dst_pageable && src.device) {
        ticket.wait();
    }
    Ok(())
}

fn enqueue_memset(
    dst: u64,
    value: u8,
    len: usize,
    (device, stream): (&Device, StreamId),
    wait: bool,
) -> CuResult<()> {
    if len == 0 {
        return Ok(());
    }
    device.memory().check_device(dst, len as u64, true)?;
    let task: Task = Box::new(move || {
        // SAFETY: the range was checked writable device memory when enqueued.
        unsafe { std::ptr::write_bytes(dst as *mut u8, value, len) }
    });
    let ticket = device.streams.enqueue(stream, task)?;
    if wait {
        ticket.wait();
    }
    Ok(())
}

// ---- initialisation, versions, errors ----

/// `cuInit`.
#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    entry!({
        if flags != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        Machine::init().map(drop)
    })
}

/// `cuDriverGetVersion`.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    // SAFETY: the caller passes a valid out-pointer or null.
    entry!({ unsafe { put(version, device::DRIVER_VERSION) } })
}

fn static_name(code: CUresult) -> Option<&'static [u8]> {
    macro_rules! names {
        ($($name:literal),*) => {
            match CuError::name_of(code)? {
                $($name => Some(concat!($name, "\0").as_bytes()),)*
                _ => None,
            }
        };
    }
    names!(
        "CUDA_SUCCESS",
        "CUDA_ERROR_INVALID_VALUE",
        "CUDA_ERROR_OUT_OF_MEMORY",
        "CUDA_ERROR_NOT_INITIALIZED",
        "CUDA_ERROR_DEINITIALIZED",
        "CUDA_ERROR_NO_DEVICE",
        "CUDA_ERROR_INVALID_DEVICE",
        "CUDA_ERROR_INVALID_CONTEXT",
        "CUDA_ERROR_ALREADY_MAPPED",
        "CUDA_ERROR_NOT_MAPPED",
        "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
        "CUDA_ERROR_INVALID_HANDLE",
        "CUDA_ERROR_ILLEGAL_STATE",
        "CUDA_ERROR_NOT_FOUND",
        "CUDA_ERROR_NOT_READY",
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
        "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
        "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
        "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
        "CUDA_ERROR_NOT_PERMITTED",
        "CUDA_ERROR_NOT_SUPPORTED",
        "CUDA_ERROR_UNKNOWN"
    )
}

/// `cuGetErrorName`: a static NUL-terminated name; CUDA_ERROR_INVALID_VALUE for unknown codes.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(code: CUresult, name: *mut *const c_char) -> CUresult {
    entry!({
        let text = static_name(code).ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(name, text.as_ptr().cast()) }
    })
}

/// `cuGetErrorString`: simgpu describes each error by its name.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(code: CUresult, text: *mut *const c_char) -> CUresult {
    // SAFETY: same contract as cuGetErrorName.
    unsafe { cuGetErrorName(code, text) }
}

// ---- devices ----

/// `cuDeviceGetCount`: the visible devices; 0 (and `cuInit`'s CUDA_ERROR_NO_DEVICE) when
/// there are none.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    entry!({
        let n = match Machine::get() {
            Ok(m) => m.count(),
            Err(CuError::CUDA_ERROR_NO_DEVICE) => {
                // SAFETY: the caller passes a valid out-pointer or null.
                unsafe { put(count, 0) }?;
                return Err(CuError::CUDA_ERROR_NO_DEVICE);
            }
            Err(e) => return Err(e),
        };
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(count, n as c_int) }
    })
}

/// Visible device `dev`, once `cuInit` has run.
fn device_at(dev: CUdevice) -> CuResult<&'static Device> {
    Machine::get()?.device(dev)
}

/// `cuDeviceGet`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut CUdevice, ordinal: c_int) -> CUresult {
    entry!({
        device_at(ordinal)?;
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(dev, ordinal) }
    })
}

/// `cuDeviceGetAttribute`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attr: c_int,
    dev: CUdevice,
) -> CUresult {
    entry!({
        let v = device::attribute(attr, device_at(dev)?)?;
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(value, v) }
    })
}

/// Writes `text` into a caller's buffer of `len` bytes, truncated to `len - 1` plus NUL.
///
/// # Safety
/// `out` is null or valid for `len` bytes of writes.
unsafe fn put_text(out: *mut c_char, len: c_int, text: &str) -> CuResult<()> {
    if out.is_null() || len <= 0 {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    let bytes = text.as_bytes();
    let n = bytes.len().min(len as usize - 1);
    // SAFETY: the caller's buffer holds `len` bytes; we write `n + 1 <= len`.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), n);
        out.add(n).write(0);
    }
    Ok(())
}

/// `cuDeviceGetName`: truncated to `len - 1` bytes plus NUL.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    entry!({
        let device = device_at(dev)?;
        // SAFETY: the caller's buffer of `len` bytes.
        unsafe { put_text(name, len, &device.name()) }
    })
}

/// `cuDeviceTotalMem_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    entry!({
        let device = device_at(dev)?;
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(bytes, device.total_mem() as usize) }
    })
}

/// `cuDeviceGetUuid_v2`: the 16 bytes of the device's UUID.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    entry!({
        let device = device_at(dev)?;
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(uuid, device.uuid()) }
    })
}

/// `cuDeviceGetUuid`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuDeviceGetUuid_v2(uuid, dev) }
}

/// `cuDeviceGetPCIBusId`: `0000:BB:00.0`, truncated to `len - 1` bytes plus NUL.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    id: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    entry!({
        let device = device_at(dev)?;
        // SAFETY: the caller's buffer of `len` bytes.
        unsafe { put_text(id, len, &device.pci_bus_id()) }
    })
}

/// The bus number of a PCI location `[domain:]bus:device.function` (hexadecimal).
pub fn parse_pci_bus(text: &str) -> Option<u32> {
    let (head, function) = text.trim().rsplit_once('.')?;
    let parts: Vec<&str> = head.split(':').collect();
    let (domain, bus, dev) = match parts[..] {
        [d, b, v] => (d, b, v),
        [b, v] => ("0", b, v),
        _ => return None,
    };
    let hex = |t: &str| u32::from_str_radix(t, 16).ok();
    (hex(domain)? == 0 && hex(dev)? == 0 && hex(function)? == 0).then_some(())?;
    hex(bus)
}

/// `cuDeviceGetByPCIBusId`: the visible device at a PCI location.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, id: *const c_char) -> CUresult {
    entry!({
        let machine = Machine::get()?;
        if id.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated string from the caller.
        let text = unsafe { std::ffi::CStr::from_ptr(id) }.to_string_lossy();
        let bus = parse_pci_bus(&text).ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let found = machine
            .devices()
            .iter()
            .find(|d| d.pci_bus() == bus)
            .ok_or(CuError::CUDA_ERROR_INVALID_DEVICE)?;
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(dev, found.ordinal() as CUdevice) }
    })
}

// ---- peers ----

/// `cuDeviceCanAccessPeer`: 1 between two distinct devices, 0 for a device and itself.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can: *mut c_int,
    dev: CUdevice,
    peer: CUdevice,
) -> CUresult {
    entry!({
        let (a, b) = (device_at(dev)?, device_at(peer)?);
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(can, c_int::from(a.ordinal() != b.ordinal())) }
    })
}

/// `cuDeviceGetP2PAttribute` between two distinct devices: performance rank (1) 0; access
/// (2), native atomics (3) and CUDA array access (4) supported.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetP2PAttribute(
    value: *mut c_int,
    attr: c_int,
    src: CUdevice,
    dst: CUdevice,
) -> CUresult {
    entry!({
        let v = p2p_attribute(attr, src, dst)?;
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(value, v) }
    })
}

/// The value of P2P attribute `attr` from `src` to `dst` (shared with the runtime).
pub(crate) fn p2p_attribute(attr: c_int, src: CUdevice, dst: CUdevice) -> CuResult<c_int> {
    let (a, b) = (device_at(src)?, device_at(dst)?);
    if a.ordinal() == b.ordinal() {
        return Err(CuError::CUDA_ERROR_INVALID_DEVICE);
    }
    match attr {
        1 => Ok(0),
        2..=4 => Ok(1),
        _ => Err(CuError::CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuCtxEnablePeerAccess`: the current context's device may reach `peer`'s device's
/// `cuMemAlloc` memory (kernels on it; VMM memory is governed by `cuMemSetAccess` alone).
#[no_mangle]
pub unsafe extern "C" fn cuCtxEnablePeerAccess(peer: Handle, flags: c_uint) -> CUresult {
    entry!({
        let device = Device::with_context()?;
        let peer = Machine::get()?.device_of_context(peer as usize)?;
        if flags != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        device
            .memory()
            .enable_peer(device.ordinal(), peer.ordinal())
    })
}

/// `cuCtxDisablePeerAccess`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDisablePeerAccess(peer: Handle) -> CUresult {
    entry!({
        let device = Device::with_context()?;
        let peer = Machine::get()?.device_of_context(peer as usize)?;
        device
            .memory()
            .disable_peer(device.ordinal(), peer.ordinal())
    })
}

/// A copy of `len` bytes from device memory on `src_device` to device memory on
/// `dst_device` (peer copies need no peer access). Synchronous (`on` is None): ordered
/// after all work on both devices and the current one, done when it returns; else
/// enqueued on `on`.
pub(crate) fn peer_copy(
    dst: u64,
    dst_device: &Device,
    src: u64,
    src_device: &Device,
    len: usize,
    on: Option<(&Device, StreamId)>,
) -> CuResult<()> {
    let current = Device::with_context()?;
    if len == 0 {
        return Ok(());
    }
    {
        let memory = current.memory();
        memory.check_device(dst, len as u64, true)?;
        memory.check_device(src, len as u64, false)?;
        if memory.device_of(dst) != Some(dst_device.ordinal())
            || memory.device_of(src) != Some(src_device.ordinal())
        {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
    }
    match on {
        Some((device, stream)) => {
            device.streams.enqueue(stream, copy_task(dst, src, len))?;
        }
        None => {
            for d in [dst_device, src_device] {
                d.streams.synchronize_all();
            }
            current
                .streams
                .enqueue(StreamId::Null, copy_task(dst, src, len))?
                .wait();
        }
    }
    Ok(())
}

/// `cuMemcpyPeer`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyPeer(
    dst: CUdeviceptr,
    dst_ctx: Handle,
    src: CUdeviceptr,
    src_ctx: Handle,
    len: usize,
) -> CUresult {
    entry!({
        let machine = Machine::get()?;
        let d = machine.device_of_context(dst_ctx as usize)?;
        let s = machine.device_of_context(src_ctx as usize)?;
        peer_copy(dst, d, src, s, len, None)
    })
}

/// `cuMemcpyPeerAsync`: returns before the copy is done.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyPeerAsync(
    dst: CUdeviceptr,
    dst_ctx: Handle,
    src: CUdeviceptr,
    src_ctx: Handle,
    len: usize,
    stream: Handle,
) -> CUresult {
    entry!({
        let machine = Machine::get()?;
        let d = machine.device_of_context(dst_ctx as usize)?;
        let s = machine.device_of_context(src_ctx as usize)?;
        peer_copy(dst, d, src, s, len, Some(on_stream(stream)?))
    })
}

// ---- contexts ----

/// `cuDevicePrimaryCtxRetain`.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut Handle, dev: CUdevice) -> CUresult {
    entry!({
        let device = device_at(dev)?;
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(ctx, device.primary_context() as Handle) }?;
        device.retain_primary();
        Ok(())
    })
}

/// `cuDevicePrimaryCtxRelease_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    entry!({
        device_at(dev)?.release_primary();
        Ok(())
    })
}

/// `cuDevicePrimaryCtxRelease` (pre-11 name).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    // SAFETY: no pointers involved.
    unsafe { cuDevicePrimaryCtxRelease_v2(dev) }
}

/// `cuDevicePrimaryCtxGetState`: its flags, and 1 when retained (or used by the runtime).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    entry!({
        let (f, a) = device_at(dev)?.primary_state();
        // SAFETY: the caller passes valid out-pointers or null.
        unsafe {
            put(flags, f)?;
            put(active, c_int::from(a))
        }
    })
}

/// `cuDevicePrimaryCtxSetFlags_v2`: kept and reported, otherwise without effect.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    entry!({
        device_at(dev)?.set_primary_flags(flags);
        Ok(())
    })
}

/// `cuDevicePrimaryCtxReset_v2`: waits for the device's work; its memory stays (simgpu
/// does not destroy a context's allocations).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    entry!({
        device_at(dev)?.streams.synchronize_all();
        Ok(())
    })
}

/// `cuCtxCreate_v2`: the program's own context on `dev` ([`device::own_context`]: the
/// same device memory as the primary one, another handle); it becomes current.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    ctx: *mut Handle,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    entry!({
        let device = device_at(dev)?;
        let own = device::own_context(device.ordinal());
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(ctx, own as Handle) }?;
        device::set_current(own)
    })
}

/// `cuCtxDestroy_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: Handle) -> CUresult {
    entry!({
        Machine::get()?.device_of_context(ctx as usize)?;
        if device::current() == ctx as usize {
            device::set_current(0)?;
        }
        Ok(())
    })
}

/// `cuCtxSetCurrent`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: Handle) -> CUresult {
    entry!({
        Machine::get()?;
        device::set_current(ctx as usize)
    })
}

/// `cuCtxGetCurrent`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut Handle) -> CUresult {
    entry!({
        Machine::get()?;
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(ctx, device::current() as Handle) }
    })
}

/// `cuCtxPushCurrent_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: Handle) -> CUresult {
    entry!({
        Machine::get()?;
        device::push_current(ctx as usize)
    })
}

/// `cuCtxPopCurrent_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(ctx: *mut Handle) -> CUresult {
    entry!({
        Machine::get()?;
        let popped = device::pop_current()?;
        if !ctx.is_null() {
            // SAFETY: checked non-null; the caller's out-pointer.
            unsafe { ctx.write(popped as Handle) };
        }
        Ok(())
    })
}

/// `cuCtxGetDevice`: the current context's device.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    entry!({
        let device = Device::with_context()?;
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(dev, device.ordinal() as CUdevice) }
    })
}

/// `cuCtxSynchronize`: the current context's device's work.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    entry!({
        Device::with_context()?.streams.synchronize_all();
        Ok(())
    })
}

/// Per-thread stack bytes (`CU_LIMIT_STACK_SIZE`) of every simulated context: the local
/// memory a context reserves follows it on a GPU; here it is only remembered.
static STACK_LIMIT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1024);

/// `cuCtxGetLimit`: the stack size as set, the printf FIFO's and malloc heap's defaults.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetLimit(value: *mut usize, limit: c_uint) -> CUresult {
    entry!({
        Device::with_context()?;
        let v = match limit {
            0 => STACK_LIMIT.load(std::sync::atomic::Ordering::Relaxed),
            1 => 1 << 20,
            2 => 8 << 20,
            _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
        };
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(value, v) }
    })
}

/// `cuCtxSetLimit`: the stack size is remembered; the other limits are accepted.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetLimit(limit: c_uint, value: usize) -> CUresult {
    entry!({
        Device::with_context()?;
        match limit {
            0 => STACK_LIMIT.store(value, std::sync::atomic::Ordering::Relaxed),
            1 | 2 => {}
            _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    })
}

// ---- memory: information and VMM ----

/// `cuMemGetInfo_v2`: the current context's device's memory.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    entry!({
        let device = Device::with_context()?;
        let (f, t) = device.memory().info(device.ordinal())?;
        // SAFETY: the caller passes valid out-pointers or null.
        unsafe {
            put(free, f as usize)?;
            put(total, t as usize)
        }
    })
}

/// `cuMemGetAllocationGranularity`: 2 MiB, minimum and recommended.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const MemAllocationProp,
    option: c_uint,
) -> CUresult {
    entry!({
        Machine::get()?;
        // SAFETY: the caller passes a valid property pointer or null.
        let prop = unsafe { get(prop) }?;
        check_prop(&prop)?;
        if option > 1 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(granularity, GRANULARITY as usize) }
    })
}

/// Checks an allocation's properties; returns the device it is to live on.
fn check_prop(prop: &MemAllocationProp) -> CuResult<usize> {
    if prop.type_ != ALLOCATION_PINNED || prop.location.type_ != LOCATION_DEVICE {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    device::check_ordinal(prop.location.id)
}

/// `cuMemAddressReserve`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: u64,
) -> CUresult {
    entry!({
        let device = Device::with_context()?;
        if flags != 0 || ptr.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let base = device
            .memory()
            .reserve(size as u64, alignment as u64, addr)?;
        // SAFETY: checked non-null; the caller passes a valid out-pointer.
        unsafe { put(ptr, base) }
    })
}

/// `cuMemAddressFree`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    entry!({
        Device::with_context()?
            .memory()
            .free_reservation(ptr, size as u64)
    })
}

/// `cuMemCreate`: pinned device memory on the device `prop.location.id` names
/// (CUDA_ERROR_INVALID_DEVICE for an ordinal no visible device has).
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const MemAllocationProp,
    flags: u64,
) -> CUresult {
    entry!({
        let device = Device::with_context()?;
        // SAFETY: the caller passes a valid property pointer or null.
        let prop = unsafe { get(prop) }?;
        let on = check_prop(&prop)?;
        if flags != 0 || handle.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let requested = Requested {
            handle_types: prop.requested_handle_types,
            alloc_flags: prop.alloc_flags,
        };
        let h = device
            .memory()
            .create_requested(on, size as u64, requested)?;
        // SAFETY: checked non-null; the caller passes a valid out-pointer.
        unsafe { put(handle, h) }
    })
}

/// `CU_MEM_HANDLE_TYPE_WIN32`, `CU_MEM_HANDLE_TYPE_WIN32_KMT`, `CU_MEM_HANDLE_TYPE_FABRIC`:
/// handle types simgpu cannot give (CUDA_ERROR_NOT_SUPPORTED, as a Linux driver without
/// a fabric does).
const HANDLE_TYPES_UNSUPPORTED: [u32; 3] = [2, 4, 8];

/// `cuMemExportToShareableHandle`: for `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, writes a
/// new file descriptor (an `int`, close-on-exec, one per call, the caller's to close) of the
/// allocation's memory to `shareable`; another process that receives it (over a Unix
/// socket with `SCM_RIGHTS`) imports the same bytes. CUDA_ERROR_INVALID_VALUE for a null
/// `shareable`, flags other than 0, a handle that is not live, or one whose `cuMemCreate`
/// did not request that handle type; CUDA_ERROR_NOT_SUPPORTED for Win32 and fabric handles.
#[no_mangle]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: u64,
    kind: c_uint,
    flags: u64,
) -> CUresult {
    entry!({
        let device = Device::with_context()?;
        if flags != 0 || shareable.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let memory = device.memory();
        if kind != HANDLE_TYPE_POSIX_FD {
            let requested = memory.properties(handle)?.requested.handle_types;
            return Err(
                if HANDLE_TYPES_UNSUPPORTED.contains(&kind) && requested & kind != 0 {
                    CuError::CUDA_ERROR_NOT_SUPPORTED
                } else {
                    CuError::CUDA_ERROR_INVALID_VALUE
                },
            );
        }
        let fd = memory.export_fd(handle)?;
        // SAFETY: checked non-null; for this handle type the caller passes an `int`.
        unsafe { put(shareable.cast::<c_int>(), fd.into_raw_fd()) }
    })
}

/// `cuMemImportFromShareableHandle`: for `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`,
/// `os_handle` is the file descriptor itself (`(void*)(uintptr_t)fd`). Each call gives a
/// new handle to the same bytes, to be released on its own; the descriptor may be closed
/// afterwards. CUDA_ERROR_INVALID_VALUE for a descriptor that is not a simgpu shareable
/// handle (the reason on standard error) or a handle type that is no type;
/// CUDA_ERROR_NOT_SUPPORTED for Win32 and fabric handles.
#[no_mangle]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut u64,
    os_handle: *mut c_void,
    kind: c_uint,
) -> CUresult {
    entry!({
        let device = Device::with_context()?;
        if handle.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        if kind != HANDLE_TYPE_POSIX_FD {
            return Err(if HANDLE_TYPES_UNSUPPORTED.contains(&kind) {
                CuError::CUDA_ERROR_NOT_SUPPORTED
            } else {
                CuError::CUDA_ERROR_INVALID_VALUE
            });
        }
        let fd =
            i32::try_from(os_handle as usize).map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?;
        let h = device.memory().import_fd(fd)?;
        // SAFETY: checked non-null; the caller passes a valid out-pointer.
        unsafe { put(handle, h) }
    })
}

/// `cuMemGetAllocationPropertiesFromHandle`: the properties `cuMemCreate` was given (for
/// an imported handle, the creator's, with `location.id` this process's ordinal of the
/// device when it sees the device). CUDA_ERROR_INVALID_VALUE for a handle that is not live.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut MemAllocationProp,
    handle: u64,
) -> CUresult {
    entry!({
        let p = Device::with_context()?.memory().properties(handle)?;
        let value = MemAllocationProp {
            type_: ALLOCATION_PINNED,
            requested_handle_types: p.requested.handle_types,
            location: MemLocation {
                type_: LOCATION_DEVICE,
                id: p.ordinal,
            },
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: p.requested.alloc_flags,
        };
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(prop, value) }
    })
}

/// `cuMemRelease`: freed now, or at the last unmap if still mapped.
#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    entry!({ Device::with_context()?.memory().release(handle) })
}

/// `cuMemMap`.
#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: u64,
    flags: u64,
) -> CUresult {
    entry!({
        if flags != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        Device::with_context()?
            .memory()
            .map(ptr, size as u64, offset as u64, handle)
    })
}

/// `cuMemUnmap`: waits for the device to finish work first, then the range faults.
#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    entry!({
        let device = Device::with_context()?;
        Machine::get()?.synchronize_all();
        // SAFETY: device memory is only touched by stream work, finished above; host code
        // touching it afterwards faults, which is the point.
        unsafe { device.memory().unmap(ptr, size as u64) }
    })
}

/// `cuMemSetAccess`: each descriptor sets one device's right on the range (a later
/// descriptor for the same device wins); devices not named keep theirs.
#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const MemAccessDesc,
    count: usize,
) -> CUresult {
    entry!({
        let device = Device::with_context()?;
        if desc.is_null() || count == 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller passes `count` descriptors at `desc` (checked non-null).
        let descs = unsafe { std::slice::from_raw_parts(desc, count) };
        let mut rights = Vec::with_capacity(descs.len());
        for d in descs {
            if d.location.type_ != LOCATION_DEVICE {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            rights.push((
                device::check_ordinal(d.location.id)?,
                Access::from_flags(d.flags)?,
            ));
        }
        Machine::get()?.synchronize_all();
        // SAFETY: stream work on the range is finished (above); host code touching it
        // afterwards faults when access is removed, which is the point.
        unsafe { device.memory().set_access(ptr, size as u64, &rights) }
    })
}

/// `cuMemGetAccess`: the right of the device `location` names on the mapping at `ptr`.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAccess(
    flags: *mut u64,
    location: *const MemLocation,
    ptr: CUdeviceptr,
) -> CUresult {
    entry!({
        let device = Device::with_context()?;
        // SAFETY: the caller passes a valid location pointer or null.
        let location = unsafe { get(location) }?;
        if location.type_ != LOCATION_DEVICE {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let on = device::check_ordinal(location.id)?;
        let access = device.memory().access_of(ptr, on)?;
        let value = match access {
            Access::None => 0,
            Access::Read => 1,
            Access::ReadWrite => 3,
        };
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(flags, value) }
    })
}

// ---- memory: linear and host ----

/// `cuMemAlloc_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(ptr: *mut CUdeviceptr, size: usize) -> CUresult {
    entry!({
        let device = Device::with_context()?;
        if ptr.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let addr = device.memory().alloc(device.ordinal(), size as u64)?;
        // SAFETY: checked non-null; the caller passes a valid out-pointer.
        unsafe { put(ptr, addr) }
    })
}

/// `cuMemAllocManaged`: device memory (host-accessible in simgpu); `flags`
/// `CU_MEM_ATTACH_GLOBAL` (1) or `CU_MEM_ATTACH_HOST` (2).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    ptr: *mut CUdeviceptr,
    size: usize,
    flags: c_uint,
) -> CUresult {
    entry!({
        let device = Device::with_context()?;
        if ptr.is_null() || size == 0 || !matches!(flags, 1 | 2) {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let addr = device.memory().alloc(device.ordinal(), size as u64)?;
        // SAFETY: checked non-null; the caller passes a valid out-pointer.
        unsafe { put(ptr, addr) }
    })
}

/// `cuMemFree_v2`: waits for the device first, as the driver does.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(ptr: CUdeviceptr) -> CUresult {
    entry!({
        let device = Device::with_context()?;
        Machine::get()?.synchronize_all();
        // SAFETY: stream work is finished; later host accesses fault, as intended.
        unsafe { device.memory().free(ptr) }
    })
}

/// `cuMemAllocAsync`: simgpu's memory is usable at once, on every stream.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    ptr: *mut CUdeviceptr,
    size: usize,
    _stream: *mut c_void,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuMemAlloc_v2(ptr, size) }
}

/// `cuMemFreeAsync`: simgpu waits for the device, then frees.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(ptr: CUdeviceptr, _stream: *mut c_void) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuMemFree_v2(ptr) }
}

/// `cuMemHostAlloc`.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    ptr: *mut *mut c_void,
    size: usize,
    _flags: c_uint,
) -> CUresult {
    entry!({
        let device = Device::with_context()?;
        if ptr.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let addr = device.memory().host_alloc(size as u64)?;
        // SAFETY: checked non-null; the caller passes a valid out-pointer.
        unsafe { put(ptr, addr as *mut c_void) }
    })
}

/// `cuMemAllocHost_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(ptr: *mut *mut c_void, size: usize) -> CUresult {
    // SAFETY: same contract as cuMemHostAlloc.
    unsafe { cuMemHostAlloc(ptr, size, 0) }
}

/// `cuMemFreeHost`: waits for the device first.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(ptr: *mut c_void) -> CUresult {
    entry!({
        let device = Device::with_context()?;
        Machine::get()?.synchronize_all();
        // SAFETY: the caller gives the memory up; stream work using it is finished.
        unsafe { device.memory().host_free(ptr as u64) }
    })
}

/// `cuMemHostRegister_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostRegister_v2(
    ptr: *mut c_void,
    size: usize,
    _flags: c_uint,
) -> CUresult {
    entry!({
        Device::with_context()?
            .memory()
            .host_register(ptr as u64, size as u64)
    })
}

/// `cuMemHostRegister` (the unversioned name).
#[no_mangle]
pub unsafe extern "C" fn cuMemHostRegister(
    ptr: *mut c_void,
    size: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: same contract as cuMemHostRegister_v2.
    unsafe { cuMemHostRegister_v2(ptr, size, flags) }
}

/// `cuMemHostUnregister`.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostUnregister(ptr: *mut c_void) -> CUresult {
    entry!({
        let device = Device::with_context()?;
        Machine::get()?.synchronize_all();
        device.memory().host_unregister(ptr as u64)
    })
}

// ---- copies and memset ----

/// `cuMemcpyHtoD_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    len: usize,
) -> CUresult {
    entry!({ enqueue_copy(dst, true, src as u64, false, len, on_null_stream()?, true) })
}

/// `cuMemcpyDtoH_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    len: usize,
) -> CUresult {
    entry!({ enqueue_copy(dst as u64, false, src, true, len, on_null_stream()?, true) })
}

/// `cuMemcpyDtoD_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
) -> CUresult {
    entry!({ enqueue_copy(dst, true, src, true, len, on_null_stream()?, true) })
}

/// `cuMemcpyHtoDAsync_v2`: returns before the copy is done.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    len: usize,
    stream: Handle,
) -> CUresult {
    entry!({ enqueue_copy(dst, true, src as u64, false, len, on_stream(stream)?, false,) })
}

/// `cuMemcpyDtoHAsync_v2`: returns before the copy is done.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    len: usize,
    stream: Handle,
) -> CUresult {
    entry!({ enqueue_copy(dst as u64, false, src, true, len, on_stream(stream)?, false,) })
}

/// `cuMemcpyDtoDAsync_v2`: returns before the copy is done.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
    stream: Handle,
) -> CUresult {
    entry!({ enqueue_copy(dst, true, src, true, len, on_stream(stream)?, false,) })
}

/// cuda.h's `CUDA_MEMCPY2D`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
// The C layout, every field (the arrays are not simulated: never read).
#[allow(dead_code)]
pub struct CudaMemcpy2D {
    src_x_in_bytes: usize,
    src_y: usize,
    src_memory_type: u32,
    src_host: *const c_void,
    src_device: CUdeviceptr,
    src_array: *mut c_void,
    src_pitch: usize,
    dst_x_in_bytes: usize,
    dst_y: usize,
    dst_memory_type: u32,
    dst_host: *mut c_void,
    dst_device: CUdeviceptr,
    dst_array: *mut c_void,
    dst_pitch: usize,
    width_in_bytes: usize,
    height: usize,
}

/// `CU_MEMORYTYPE_HOST`, `_DEVICE`, `_UNIFIED` (arrays are not simulated).
const MEMORYTYPE_HOST: u32 = 1;
const MEMORYTYPE_DEVICE: u32 = 2;
const MEMORYTYPE_UNIFIED: u32 = 4;

/// A 2D copy (`cuMemcpy2D*`): its descriptor's sides resolved, then [`enqueue_rows`].
fn enqueue_copy_2d(p: *const CudaMemcpy2D, on: (&Device, StreamId), wait: bool) -> CuResult<()> {
    // SAFETY: the caller's descriptor, valid for the call (the driver API's contract).
    let m = unsafe { p.as_ref() }.ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
    let width = m.width_in_bytes;
    if width == 0 || m.height == 0 {
        return Ok(());
    }
    let side = |ty: u32, host: u64, dev: u64, x: usize, y: usize, pitch: usize| {
        let at = (y as u64)
            .checked_mul(pitch as u64)
            .and_then(|o| o.checked_add(x as u64))
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let (addr, device) = match ty {
            MEMORYTYPE_HOST => (host.wrapping_add(at), false),
            MEMORYTYPE_DEVICE => (dev.wrapping_add(at), true),
            MEMORYTYPE_UNIFIED => {
                let reachable = on.0.memory().check_device(dev, 1, false).is_ok();
                (dev.wrapping_add(at), reachable)
            }
            _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
        };
        Ok(Side {
            addr,
            device,
            pitch: pitch.max(width) as u64,
        })
    };
    let src = side(
        m.src_memory_type,
        m.src_host as u64,
        m.src_device,
        m.src_x_in_bytes,
        m.src_y,
        m.src_pitch,
    )?;
    let dst = side(
        m.dst_memory_type,
        m.dst_host as u64,
        m.dst_device,
        m.dst_x_in_bytes,
        m.dst_y,
        m.dst_pitch,
    )?;
    enqueue_rows(dst, src, width, m.height, on, wait)
}

/// `cuMemcpy2D_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2D_v2(p: *const CudaMemcpy2D) -> CUresult {
    entry!({ enqueue_copy_2d(p, on_null_stream()?, true) })
}

/// `cuMemcpy2DUnaligned_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DUnaligned_v2(p: *const CudaMemcpy2D) -> CUresult {
    entry!({ enqueue_copy_2d(p, on_null_stream()?, true) })
}

/// `cuMemcpy2DAsync_v2`: returns before the copy is done (but as pageable memory's
/// promises say).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DAsync_v2(p: *const CudaMemcpy2D, stream: Handle) -> CUresult {
    entry!({ enqueue_copy_2d(p, on_stream(stream)?, false) })
}

/// `cuMemsetD8_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, count: usize) -> CUresult {
    entry!({ enqueue_memset(dst, value, count, on_null_stream()?, true) })
}

/// `cuMemsetD8Async`.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(
    dst: CUdeviceptr,
    value: u8,
    count: usize,
    stream: Handle,
) -> CUresult {
    entry!({ enqueue_memset(dst, value, count, on_stream(stream)?, false) })
}

// ---- streams ----

/// `cuStreamCreate`: a stream of the current context's device.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut Handle, flags: c_uint) -> CUresult {
    entry!({
        let device = Device::with_context()?;
        if stream.is_null() || flags > 1 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let id = device.streams.create(flags);
        // SAFETY: checked non-null; the caller passes a valid out-pointer.
        unsafe { put(stream, device::handle_of(id) as Handle) }
    })
}

/// `cuStreamDestroy_v2`: work already enqueued still completes.
#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: Handle) -> CUresult {
    entry!({
        match on_stream(stream)? {
            (device, StreamId::Created(id)) => device.streams.destroy(id),
            (_, StreamId::Null) => Err(CuError::CUDA_ERROR_INVALID_HANDLE),
        }
    })
}

/// `cuStreamSynchronize`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(stream: Handle) -> CUresult {
    entry!({
        let (device, stream) = on_stream(stream)?;
        device.streams.tail(stream)?.wait();
        Ok(())
    })
}

/// `cuStreamQuery`: CUDA_ERROR_NOT_READY while work is pending.
#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(stream: Handle) -> CUresult {
    entry!({
        let (device, stream) = on_stream(stream)?;
        match device.streams.idle(stream)? {
            true => Ok(()),
            false => Err(CuError::CUDA_ERROR_NOT_READY),
        }
    })
}

// ---- events ----

/// The device an event belongs to, and the event, with a context current.
fn event_of(event: Handle) -> CuResult<(&'static Device, std::sync::Arc<Event>)> {
    Device::with_context()?;
    Machine::get()?.event(event as u64)
}

/// `cuEventCreate`: an event of the current context's device.
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(event: *mut Handle, flags: c_uint) -> CUresult {
    entry!({
        let device = Device::with_context()?;
        if event.is_null() || flags > 0xf {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let handle = device.add_event(Event::new(flags));
        // SAFETY: checked non-null; the caller passes a valid out-pointer.
        unsafe { put(event, handle as Handle) }
    })
}

/// `cuEventRecord`: on a stream of the event's own device (CUDA_ERROR_INVALID_HANDLE for
/// another device's, as on a GPU).
#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(event: Handle, stream: Handle) -> CUresult {
    entry!({
        let (owner, e) = event_of(event)?;
        let (device, stream) = on_stream(stream)?;
        if owner.ordinal() != device.ordinal() {
            return Err(CuError::CUDA_ERROR_INVALID_HANDLE);
        }
        e.record(&device.streams, stream)
    })
}

/// `cuStreamWaitEvent`: the stream's later work waits until the event's last record is
/// reached (the event may be another device's).
#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent(
    stream: Handle,
    event: Handle,
    flags: c_uint,
) -> CUresult {
    entry!({
        if flags != 0 && flags != 0x1 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let (_, e) = event_of(event)?;
        let (device, stream) = on_stream(stream)?;
        device.streams.enqueue(stream, e.waiter()).map(drop)
    })
}

/// `cuPointerGetAttribute`: `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` (2) only: host (1) for
/// page-locked host memory, device (2) for device memory, `CUDA_ERROR_INVALID_VALUE` for
/// memory the driver does not know (pageable host memory); other attributes are not
/// supported.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: c_uint,
    ptr: CUdeviceptr,
) -> CUresult {
    const MEMORY_TYPE: c_uint = 2;
    entry!({
        if attribute != MEMORY_TYPE {
            return Err(CuError::CUDA_ERROR_NOT_SUPPORTED);
        }
        if data.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let memory = Device::with_context()?.memory();
        let kind: c_uint = if memory.is_host(ptr) {
            1
        } else if memory.check_device(ptr, 1, false).is_ok() {
            2
        } else {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        };
        // SAFETY: checked non-null; the caller passes room for a CUmemorytype.
        unsafe { put(data.cast::<c_uint>(), kind) }
    })
}

/// `cuEventSynchronize`.
#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(event: Handle) -> CUresult {
    entry!({
        event_of(event)?.1.synchronize();
        Ok(())
    })
}

/// `cuEventQuery`: CUDA_ERROR_NOT_READY until the stream reaches the last record.
#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(event: Handle) -> CUresult {
    entry!({
        match event_of(event)?.1.done() {
            true => Ok(()),
            false => Err(CuError::CUDA_ERROR_NOT_READY),
        }
    })
}

/// `cuEventElapsedTime`: real milliseconds between two completed records.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, start: Handle, end: Handle) -> CUresult {
    entry!({
        let value = Event::elapsed_ms(&event_of(start)?.1, &event_of(end)?.1)?;
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(ms, value) }
    })
}

/// `cuEventElapsedTime_v2` (CUDA 12.8+ name; same contract).
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: Handle,
    end: Handle,
) -> CUresult {
    // SAFETY: same contract as cuEventElapsedTime.
    unsafe { cuEventElapsedTime(ms, start, end) }
}

/// `cuEventDestroy_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(event: Handle) -> CUresult {
    entry!({
        Device::with_context()?;
        Machine::get()?.remove_event(event as u64)
    })
}

// ---- the process checkpoint API (crate::checkpoint) ----

/// The checkpoint API's argument structures are 64 bytes of words (`CUcheckpoint*Args`).
type Args = [u64; 8];

/// Reads an optional argument structure (NULL: all zero).
///
/// # Safety
/// `args` is null or valid for a read of 64 bytes.
unsafe fn args(args: *const Args) -> Args {
    if args.is_null() {
        [0; 8]
    } else {
        // SAFETY: non-null, and valid by the caller's contract.
        unsafe { args.read_unaligned() }
    }
}

fn zero(words: &[u64]) -> CuResult<()> {
    if words.iter().all(|&w| w == 0) {
        Ok(())
    } else {
        Err(CuError::CUDA_ERROR_INVALID_VALUE)
    }
}

/// `cuCheckpointProcessLock`: `timeoutMs` (0: wait for ever), the rest reserved (zero).
#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessLock(pid: c_int, args_in: *const Args) -> CUresult {
    boundary_ungated(|| {
        crate::checkpoint::caller_ready()?;
        // SAFETY: the caller's contract.
        let a = unsafe { args(args_in) };
        zero(&[a[0] >> 32])?;
        zero(&a[1..])?;
        let timeout_ms = a[0] & 0xffff_ffff;
        crate::checkpoint::request(pid, &format!("lock {timeout_ms}")).map(drop)
    })
}

/// `cuCheckpointProcessCheckpoint`: to host memory only (`customStorageInfo_out` set:
/// CUDA_ERROR_NOT_SUPPORTED).
#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessCheckpoint(
    pid: c_int,
    args_in: *const Args,
) -> CUresult {
    boundary_ungated(|| {
        crate::checkpoint::caller_ready()?;
        // SAFETY: the caller's contract.
        let a = unsafe { args(args_in) };
        if a[0] != 0 {
            return Err(CuError::CUDA_ERROR_NOT_SUPPORTED);
        }
        zero(&a[1..])?;
        crate::checkpoint::request(pid, "checkpoint").map(drop)
    })
}

/// `cuCheckpointProcessRestore`: from host memory, with optional GPU pairs
/// (`gpuPairs`, `gpuPairsCount`: old UUID, new UUID).
#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessRestore(pid: c_int, args_in: *const Args) -> CUresult {
    boundary_ungated(|| {
        crate::checkpoint::caller_ready()?;
        // SAFETY: the caller's contract.
        let a = unsafe { args(args_in) };
        if a[2] != 0 {
            return Err(CuError::CUDA_ERROR_NOT_SUPPORTED);
        }
        zero(&a[3..])?;
        let count = (a[1] & 0xffff_ffff) as usize;
        zero(&[a[1] >> 32])?;
        let pairs_ptr = a[0] as *const [[u8; 16]; 2];
        if count > 0 && pairs_ptr.is_null() || count > 4096 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let pairs: Vec<([u8; 16], [u8; 16])> = (0..count)
            .map(|i| {
                // SAFETY: the caller passes `count` pairs at `gpuPairs`.
                let [old, new] = unsafe { pairs_ptr.add(i).read_unaligned() };
                (old, new)
            })
            .collect();
        crate::checkpoint::request(pid, &crate::checkpoint::restore_line(&pairs)).map(drop)
    })
}

/// `cuCheckpointProcessUnlock`.
#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessUnlock(pid: c_int, args_in: *const Args) -> CUresult {
    boundary_ungated(|| {
        crate::checkpoint::caller_ready()?;
        // SAFETY: the caller's contract.
        zero(&unsafe { args(args_in) })?;
        crate::checkpoint::request(pid, "unlock").map(drop)
    })
}

/// `cuCheckpointProcessGetState`: a `CUprocessState`.
#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessGetState(pid: c_int, state: *mut c_int) -> CUresult {
    boundary_ungated(|| {
        crate::checkpoint::caller_ready()?;
        let s = crate::checkpoint::request(pid, "state")?;
        let s: c_int = s.parse().map_err(|_| CuError::CUDA_ERROR_UNKNOWN)?;
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(state, s) }
    })
}

/// `cuCheckpointProcessGetRestoreThreadId`: the target's thread that carries requests out.
#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessGetRestoreThreadId(
    pid: c_int,
    tid: *mut c_int,
) -> CUresult {
    boundary_ungated(|| {
        crate::checkpoint::caller_ready()?;
        let t = crate::checkpoint::request(pid, "tid")?;
        let t: c_int = t.parse().map_err(|_| CuError::CUDA_ERROR_UNKNOWN)?;
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(tid, t) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boundary_turns_panics_into_unknown() {
        assert_eq!(boundary(|| Ok(())), 0);
        assert_eq!(boundary(|| Err(CuError::CUDA_ERROR_NOT_READY)), 600);
        assert_eq!(boundary(|| panic!("a bug")), 999);
    }

    #[test]
    fn abi_layouts_match_the_driver() {
        assert_eq!(std::mem::size_of::<MemLocation>(), 8);
        assert_eq!(std::mem::size_of::<MemAllocationProp>(), 32);
        assert_eq!(std::mem::size_of::<MemAccessDesc>(), 12);
    }

    #[test]
    fn error_names_are_nul_terminated() {
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { cuGetErrorName(2, &mut name) }, 0);
        // SAFETY: cuGetErrorName returned a static NUL-terminated string.
        let text = unsafe { std::ffi::CStr::from_ptr(name) };
        assert_eq!(text.to_str().unwrap(), "CUDA_ERROR_OUT_OF_MEMORY");
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { cuGetErrorName(4242, &mut name) }, 1);
    }
}

//! The exported runtime API (`cuda*`, `__cuda*`): the subset of `libcudart` the test
//! programs reach through cudaw's forwarding, played over the same device, memory and
//! streams as the driver API (`driver_api`), so `CUDAW_REAL_CUDART` and `CUDAW_LIBCUDA`
//! may both name `libsimgpu.so`.
//!
//! Handles are shared with the driver: a `cudaStream_t` is a `CUstream`, a `cudaEvent_t`
//! a `CUevent`. Every call initialises the device on first use and makes the primary
//! context current on the calling thread, as the real runtime does. Failures are recorded
//! as the thread's last error; a kernel's fault is sticky. Kernels run as host functions
//! looked up by mangled name ([`crate::kernels`]), enqueued on the launch's stream; a
//! kernel simgpu has no host function for fails to launch with
//! `cudaErrorInvalidDeviceFunction` and a message naming it.
//!
//! Every body runs inside [`runtime::guard`], so no panic crosses the C ABI.
//!
//! # Safety
//!
//! Every export has the contract of the runtime function it is named after: each pointer
//! argument is null (refused with `cudaErrorInvalidValue` where the runtime refuses it) or
//! valid for the reads and writes the runtime documents; host memory given to an
//! asynchronous copy stays valid until the stream has done the copy.
#![allow(non_snake_case, non_camel_case_types)]
#![allow(clippy::missing_safety_doc)] // the module's Safety section covers every export

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::device;
use crate::kernels::{self, Launch};
use crate::runtime::{self, error, CallConfig, Dim3, RtError, RtResult};
use crate::stream::{Event, StreamId, Task};

/// `cudaError_t` on the wire.
pub type cudaError_t = c_uint;
/// `cudaStream_t`, `cudaEvent_t`, `cudaKernel_t`, `cudaMemPool_t`: opaque pointers.
pub type Handle = *mut c_void;

/// `cudaRuntimeGetVersion`: CUDA 13.0.
pub const RUNTIME_VERSION: i32 = 13000;

/// `cudaMemcpyKind`.
mod kind {
    pub const HOST_TO_HOST: i32 = 0;
    pub const HOST_TO_DEVICE: i32 = 1;
    pub const DEVICE_TO_HOST: i32 = 2;
    pub const DEVICE_TO_DEVICE: i32 = 3;
    pub const DEFAULT: i32 = 4;
}

/// `cudaMemoryType`.
mod memory_type {
    pub const UNREGISTERED: i32 = 0;
    pub const HOST: i32 = 1;
    pub const DEVICE: i32 = 2;
}

/// The default memory pool's handle (any non-null value; never dereferenced).
const DEFAULT_POOL: usize = 0x9001_0000;

macro_rules! rt {
    ($body:block) => {
        runtime::entry(move || -> RtResult<()> { $body })
    };
}

/// Writes `value` through an out-pointer; null is `cudaErrorInvalidValue`.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T) -> RtResult<()> {
    if out.is_null() {
        return Err(RtError::cudaErrorInvalidValue);
    }
    // SAFETY: non-null, and valid for writes by the caller's contract.
    unsafe { out.write(value) };
    Ok(())
}

/// Reads an in-pointer; null is `cudaErrorInvalidValue`.
///
/// # Safety
/// `ptr` is null or valid for a read of `T`.
unsafe fn get<T: Copy>(ptr: *const T) -> RtResult<T> {
    if ptr.is_null() {
        return Err(RtError::cudaErrorInvalidValue);
    }
    // SAFETY: non-null, and valid for reads by the caller's contract.
    Ok(unsafe { ptr.read() })
}

/// Waits for `ticket`'s work, then reports a fault any kernel took meanwhile.
fn finish(ticket: &crate::stream::Ticket) -> RtResult<()> {
    ticket.wait();
    runtime::sticky()
}

// ---- errors and versions ----

/// `cudaGetLastError`: this thread's last error, reset to `cudaSuccess` (a sticky error
/// stays).
#[no_mangle]
pub extern "C" fn cudaGetLastError() -> cudaError_t {
    runtime::guard(RtError::cudaErrorUnknown.code(), || {
        runtime::last_error(true)
    })
}

/// `cudaPeekAtLastError`: this thread's last error, kept.
#[no_mangle]
pub extern "C" fn cudaPeekAtLastError() -> cudaError_t {
    runtime::guard(RtError::cudaErrorUnknown.code(), || {
        runtime::last_error(false)
    })
}

/// `cudaGetErrorString`: a static description ("unrecognized error code" for others).
#[no_mangle]
pub extern "C" fn cudaGetErrorString(code: cudaError_t) -> *const c_char {
    runtime::guard(c"unrecognized error code".as_ptr(), || {
        error::description_of(code)
            .unwrap_or(c"unrecognized error code")
            .as_ptr()
    })
}

/// `cudaGetErrorName`: a static name ("unrecognized error code" for others).
#[no_mangle]
pub extern "C" fn cudaGetErrorName(code: cudaError_t) -> *const c_char {
    runtime::guard(c"unrecognized error code".as_ptr(), || {
        error::name_of(code)
            .unwrap_or(c"unrecognized error code")
            .as_ptr()
    })
}

/// `cudaRuntimeGetVersion`.
#[no_mangle]
pub unsafe extern "C" fn cudaRuntimeGetVersion(version: *mut c_int) -> cudaError_t {
    // SAFETY: the caller passes a valid out-pointer or null.
    rt!({ unsafe { put(version, RUNTIME_VERSION) } })
}

/// `cudaDriverGetVersion`.
#[no_mangle]
pub unsafe extern "C" fn cudaDriverGetVersion(version: *mut c_int) -> cudaError_t {
    // SAFETY: the caller passes a valid out-pointer or null.
    rt!({ unsafe { put(version, device::DRIVER_VERSION) } })
}

// ---- devices ----

/// `cudaGetDeviceCount`: the visible devices; 0 and `cudaErrorNoDevice` when there are
/// none.
#[no_mangle]
pub unsafe extern "C" fn cudaGetDeviceCount(count: *mut c_int) -> cudaError_t {
    rt!({
        match runtime::machine() {
            // SAFETY: the caller passes a valid out-pointer or null.
            Ok(m) => unsafe { put(count, m.count() as c_int) },
            Err(e) => {
                if !count.is_null() {
                    // SAFETY: checked non-null; the caller's out-pointer.
                    unsafe { count.write(0) };
                }
                Err(e)
            }
        }
    })
}

/// `cudaGetDevice`: the current context's device.
#[no_mangle]
pub unsafe extern "C" fn cudaGetDevice(dev: *mut c_int) -> cudaError_t {
    rt!({
        let device = runtime::context()?;
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(dev, device.ordinal() as c_int) }
    })
}

/// `cudaSetDevice`: the device's primary context becomes current on this thread.
#[no_mangle]
pub extern "C" fn cudaSetDevice(dev: c_int) -> cudaError_t {
    rt!({
        runtime::make_current(device_at(dev)?);
        Ok(())
    })
}

/// The visible device `dev` (`cudaErrorInvalidDevice` if none).
fn device_at(dev: c_int) -> RtResult<&'static device::Device> {
    runtime::machine()?
        .device(dev)
        .map_err(|_| RtError::cudaErrorInvalidDevice)
}

/// `cudaDeviceGetAttribute`: the driver's H100 values (compute capability 9.0).
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetAttribute(
    value: *mut c_int,
    attr: c_int,
    dev: c_int,
) -> cudaError_t {
    rt!({
        runtime::context()?;
        let v = device::attribute(attr, device_at(dev)?)?;
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(value, v) }
    })
}

/// `cudaDeviceSynchronize`: waits for every stream of the current device; reports a
/// kernel's fault.
#[no_mangle]
pub extern "C" fn cudaDeviceSynchronize() -> cudaError_t {
    rt!({
        runtime::context()?.streams.synchronize_all();
        runtime::sticky()
    })
}

/// `cudaDeviceGetPCIBusId`: `0000:BB:00.0`, truncated to `len - 1` bytes plus NUL.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetPCIBusId(
    id: *mut c_char,
    len: c_int,
    dev: c_int,
) -> cudaError_t {
    rt!({
        runtime::context()?;
        let text = device_at(dev)?.pci_bus_id();
        if id.is_null() || len <= 0 {
            return Err(RtError::cudaErrorInvalidValue);
        }
        let n = text.len().min(len as usize - 1);
        // SAFETY: the caller's buffer holds `len` bytes; we write `n + 1 <= len`.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), id.cast::<u8>(), n);
            id.add(n).write(0);
        }
        Ok(())
    })
}

// ---- peers ----

/// `cudaDeviceCanAccessPeer`: 1 between two distinct devices, 0 for a device and itself.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceCanAccessPeer(
    can: *mut c_int,
    dev: c_int,
    peer: c_int,
) -> cudaError_t {
    rt!({
        runtime::context()?;
        let (a, b) = (device_at(dev)?, device_at(peer)?);
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(can, c_int::from(a.ordinal() != b.ordinal())) }
    })
}

/// `cudaDeviceGetP2PAttribute`: see `cuDeviceGetP2PAttribute`.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetP2PAttribute(
    value: *mut c_int,
    attr: c_int,
    src: c_int,
    dst: c_int,
) -> cudaError_t {
    rt!({
        runtime::context()?;
        device_at(src)?;
        device_at(dst)?;
        let v = crate::driver_api::p2p_attribute(attr, src, dst)?;
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(value, v) }
    })
}

/// `cudaDeviceEnablePeerAccess`: kernels on the current device may reach `peer`'s
/// `cudaMalloc` memory. `cudaErrorInvalidDevice` for the current device itself or an
/// ordinal no device has, `cudaErrorPeerAccessAlreadyEnabled` the second time.
#[no_mangle]
pub extern "C" fn cudaDeviceEnablePeerAccess(peer: c_int, flags: c_uint) -> cudaError_t {
    rt!({
        let device = runtime::context()?;
        let peer = device_at(peer)?;
        if flags != 0 {
            return Err(RtError::cudaErrorInvalidValue);
        }
        Ok(device
            .memory()
            .enable_peer(device.ordinal(), peer.ordinal())?)
    })
}

/// `cudaDeviceDisablePeerAccess`: `cudaErrorPeerAccessNotEnabled` when it was not.
#[no_mangle]
pub extern "C" fn cudaDeviceDisablePeerAccess(peer: c_int) -> cudaError_t {
    rt!({
        let device = runtime::context()?;
        let peer = device_at(peer)?;
        Ok(device
            .memory()
            .disable_peer(device.ordinal(), peer.ordinal())?)
    })
}

/// `cudaMemcpyPeer`: from `src` on device `src_dev` to `dst` on `dst_dev`, after all
/// work on both and on the current device; done when it returns.
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyPeer(
    dst: *mut c_void,
    dst_dev: c_int,
    src: *const c_void,
    src_dev: c_int,
    count: usize,
) -> cudaError_t {
    rt!({
        runtime::context()?;
        let (d, s) = (device_at(dst_dev)?, device_at(src_dev)?);
        crate::driver_api::peer_copy(dst as u64, d, src as u64, s, count, None)?;
        runtime::sticky()
    })
}

/// `cudaMemcpyPeerAsync`: enqueued on `stream`.
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyPeerAsync(
    dst: *mut c_void,
    dst_dev: c_int,
    src: *const c_void,
    src_dev: c_int,
    count: usize,
    stream: Handle,
) -> cudaError_t {
    rt!({
        runtime::context()?;
        let (d, s) = (device_at(dst_dev)?, device_at(src_dev)?);
        let on = runtime::stream(stream as u64)?;
        Ok(crate::driver_api::peer_copy(
            dst as u64,
            d,
            src as u64,
            s,
            count,
            Some(on),
        )?)
    })
}

/// `cudaMemGetInfo`.
#[no_mangle]
pub unsafe extern "C" fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> cudaError_t {
    rt!({
        let device = runtime::context()?;
        let (f, t) = device.memory().info(device.ordinal())?;
        // SAFETY: the caller passes valid out-pointers or null.
        unsafe {
            put(free, f as usize)?;
            put(total, t as usize)
        }
    })
}

/// Fills the fields at the start of `cudaDeviceProp`, whose offsets every CUDA version
/// shares — `name` (0), `uuid` (256) and `totalGlobalMem` (288) — with device `dev`'s
/// identity, and leaves the rest as the caller had it.
///
/// # Safety
/// `prop` is null or points to a `cudaDeviceProp`.
unsafe fn device_properties(prop: *mut c_void, dev: c_int) -> RtResult<()> {
    runtime::context()?;
    let device = device_at(dev)?;
    if prop.is_null() {
        return Err(RtError::cudaErrorInvalidValue);
    }
    let mut head = [0u8; 296];
    let name = device.name();
    let name = name.as_bytes();
    let n = name.len().min(255);
    head[..n].copy_from_slice(&name[..n]);
    head[256..272].copy_from_slice(&device.uuid());
    head[288..296].copy_from_slice(&device.total_mem().to_ne_bytes());
    // SAFETY: the caller's cudaDeviceProp is larger than these 296 bytes.
    unsafe { std::ptr::copy_nonoverlapping(head.as_ptr(), prop.cast::<u8>(), head.len()) };
    Ok(())
}

// The exports below share private implementations rather than calling each other: a call
// from one export to another would go through the dynamic linker and reach cudaw's
// wrapper when cudaw is preloaded, which the real runtime never does.

/// `cudaGetDeviceProperties`: see `device_properties`.
#[no_mangle]
pub unsafe extern "C" fn cudaGetDeviceProperties(prop: *mut c_void, dev: c_int) -> cudaError_t {
    // SAFETY: the export's contract.
    rt!({ unsafe { device_properties(prop, dev) } })
}

/// `cudaGetDeviceProperties_v2` (CUDA 12's name).
#[no_mangle]
pub unsafe extern "C" fn cudaGetDeviceProperties_v2(prop: *mut c_void, dev: c_int) -> cudaError_t {
    // SAFETY: the export's contract.
    rt!({ unsafe { device_properties(prop, dev) } })
}

/// simgpu's driver function called `name` (the name without `_v2`, as programs ask the
/// runtime for it).
fn driver_symbol(name: &str) -> Option<usize> {
    use crate::driver_api as d;
    Some(match name {
        "cuMemCreate" => d::cuMemCreate as *const () as usize,
        "cuMemRelease" => d::cuMemRelease as *const () as usize,
        "cuMemMap" => d::cuMemMap as *const () as usize,
        "cuMemUnmap" => d::cuMemUnmap as *const () as usize,
        "cuMemSetAccess" => d::cuMemSetAccess as *const () as usize,
        "cuMemAddressReserve" => d::cuMemAddressReserve as *const () as usize,
        "cuMemAddressFree" => d::cuMemAddressFree as *const () as usize,
        "cuMemGetAllocationGranularity" => d::cuMemGetAllocationGranularity as *const () as usize,
        "cuMemExportToShareableHandle" => d::cuMemExportToShareableHandle as *const () as usize,
        "cuMemImportFromShareableHandle" => d::cuMemImportFromShareableHandle as *const () as usize,
        "cuMemGetAllocationPropertiesFromHandle" => {
            d::cuMemGetAllocationPropertiesFromHandle as *const () as usize
        }
        "cuMemGetInfo" => d::cuMemGetInfo_v2 as *const () as usize,
        "cuDeviceTotalMem" => d::cuDeviceTotalMem_v2 as *const () as usize,
        "cuMemAlloc" => d::cuMemAlloc_v2 as *const () as usize,
        "cuMemFree" => d::cuMemFree_v2 as *const () as usize,
        "cuMemAllocManaged" => d::cuMemAllocManaged as *const () as usize,
        "cuCtxSynchronize" => d::cuCtxSynchronize as *const () as usize,
        "cuMemGetAccess" => d::cuMemGetAccess as *const () as usize,
        "cuDeviceGetUuid" => d::cuDeviceGetUuid_v2 as *const () as usize,
        "cuDeviceCanAccessPeer" => d::cuDeviceCanAccessPeer as *const () as usize,
        "cuDeviceGetP2PAttribute" => d::cuDeviceGetP2PAttribute as *const () as usize,
        "cuCtxEnablePeerAccess" => d::cuCtxEnablePeerAccess as *const () as usize,
        "cuCtxDisablePeerAccess" => d::cuCtxDisablePeerAccess as *const () as usize,
        "cuMemcpyPeer" => d::cuMemcpyPeer as *const () as usize,
        "cuMemcpyPeerAsync" => d::cuMemcpyPeerAsync as *const () as usize,
        "cuCtxGetDevice" => d::cuCtxGetDevice as *const () as usize,
        "cuCtxGetCurrent" => d::cuCtxGetCurrent as *const () as usize,
        "cuCtxSetCurrent" => d::cuCtxSetCurrent as *const () as usize,
        "cuDevicePrimaryCtxRetain" => d::cuDevicePrimaryCtxRetain as *const () as usize,
        _ => return None,
    })
}

/// `cudaDriverEntryPointSymbolNotFound`.
const ENTRY_POINT_SYMBOL_NOT_FOUND: c_int = 1;

/// simgpu's own driver functions, for the names it has; an unknown name gives a null
/// function and `cudaDriverEntryPointSymbolNotFound`.
///
/// # Safety
/// `symbol` is null or NUL-terminated; `func` null or writable; `status` null or writable.
unsafe fn driver_entry_point(
    symbol: *const c_char,
    func: *mut *mut c_void,
    status: *mut c_int,
) -> RtResult<()> {
    runtime::context()?;
    if symbol.is_null() || func.is_null() {
        return Err(RtError::cudaErrorInvalidValue);
    }
    // SAFETY: a NUL-terminated name from the caller.
    let name = unsafe { std::ffi::CStr::from_ptr(symbol) }.to_string_lossy();
    let f = driver_symbol(&name);
    // SAFETY: the caller's non-null out-pointer; `status` may be null.
    unsafe {
        func.write(f.unwrap_or(0) as *mut c_void);
        if !status.is_null() {
            status.write(if f.is_some() {
                0
            } else {
                ENTRY_POINT_SYMBOL_NOT_FOUND
            });
        }
    }
    Ok(())
}

/// `cudaGetDriverEntryPoint`: see `driver_entry_point`.
#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPoint(
    symbol: *const c_char,
    func: *mut *mut c_void,
    _flags: u64,
    status: *mut c_int,
) -> cudaError_t {
    // SAFETY: the export's contract.
    rt!({ unsafe { driver_entry_point(symbol, func, status) } })
}

/// `cudaGetDriverEntryPoint_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPoint_ptsz(
    symbol: *const c_char,
    func: *mut *mut c_void,
    _flags: u64,
    status: *mut c_int,
) -> cudaError_t {
    // SAFETY: the export's contract.
    rt!({ unsafe { driver_entry_point(symbol, func, status) } })
}

/// `cudaGetDriverEntryPointByVersion`: the same for any version.
#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPointByVersion(
    symbol: *const c_char,
    func: *mut *mut c_void,
    _version: c_uint,
    _flags: u64,
    status: *mut c_int,
) -> cudaError_t {
    // SAFETY: the export's contract.
    rt!({ unsafe { driver_entry_point(symbol, func, status) } })
}

/// `cudaGetDriverEntryPointByVersion_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPointByVersion_ptsz(
    symbol: *const c_char,
    func: *mut *mut c_void,
    _version: c_uint,
    _flags: u64,
    status: *mut c_int,
) -> cudaError_t {
    // SAFETY: the export's contract.
    rt!({ unsafe { driver_entry_point(symbol, func, status) } })
}

// ---- registration and launch configuration ----

/// `__cudaRegisterFatBinary`: records the fatbin; returns its handle.
#[no_mangle]
pub extern "C" fn __cudaRegisterFatBinary(fat_cubin: *mut c_void) -> *mut *mut c_void {
    runtime::guard(std::ptr::null_mut(), || {
        runtime::register_fatbin(fat_cubin as usize) as *mut *mut c_void
    })
}

/// `__cudaRegisterFatBinaryEnd`: nothing to finish.
#[no_mangle]
pub extern "C" fn __cudaRegisterFatBinaryEnd(_handle: *mut *mut c_void) {}

/// `__cudaUnregisterFatBinary`: forgets the fatbin and its kernels.
#[no_mangle]
pub extern "C" fn __cudaUnregisterFatBinary(handle: *mut *mut c_void) {
    runtime::guard((), || runtime::unregister_fatbin(handle as usize))
}

/// `__cudaRegisterFunction`: host stub → mangled device name.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn __cudaRegisterFunction(
    handle: *mut *mut c_void,
    host_fun: *const c_char,
    _device_fun: *mut c_char,
    device_name: *const c_char,
    _thread_limit: c_int,
    _tid: *mut c_void,
    _bid: *mut c_void,
    _bdim: *mut c_void,
    _gdim: *mut c_void,
    _wsize: *mut c_int,
) {
    runtime::guard((), || {
        if device_name.is_null() || host_fun.is_null() {
            return;
        }
        // SAFETY: nvcc passes the kernel's mangled name, NUL-terminated and static.
        let name = unsafe { std::ffi::CStr::from_ptr(device_name) }.to_string_lossy();
        runtime::register_function(handle as usize, host_fun as usize, &name);
    })
}

/// `__cudaRegisterVar`: device variables are not simulated; recorded nowhere.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn __cudaRegisterVar(
    _handle: *mut *mut c_void,
    _host_var: *mut c_char,
    _device_address: *mut c_char,
    _device_name: *const c_char,
    _ext: c_int,
    _size: usize,
    _constant: c_int,
    _global: c_int,
) {
}

/// `__cudaPushCallConfiguration`: the `<<<grid, block, shared, stream>>>` of the next
/// launch on this thread.
#[no_mangle]
pub extern "C" fn __cudaPushCallConfiguration(
    grid: Dim3,
    block: Dim3,
    shared_mem: usize,
    stream: Handle,
) -> c_uint {
    runtime::guard(RtError::cudaErrorUnknown.code(), || {
        runtime::push_config(CallConfig {
            grid,
            block,
            shared_mem,
            stream: stream as u64,
        });
        0
    })
}

/// `__cudaPopCallConfiguration`: the configuration the launch stub pushed.
#[no_mangle]
pub unsafe extern "C" fn __cudaPopCallConfiguration(
    grid: *mut Dim3,
    block: *mut Dim3,
    shared_mem: *mut usize,
    stream: *mut Handle,
) -> cudaError_t {
    rt!({
        let c = runtime::pop_config().ok_or(RtError::cudaErrorInvalidConfiguration)?;
        // SAFETY: the launch stub passes pointers to its locals.
        unsafe {
            put(grid, c.grid)?;
            put(block, c.block)?;
            put(shared_mem, c.shared_mem)?;
            put(stream, c.stream as Handle)
        }
    })
}

/// `__cudaGetKernel`: the kernel handle of a registered host stub.
#[no_mangle]
pub unsafe extern "C" fn __cudaGetKernel(
    kernel: *mut Handle,
    host_fun: *const c_void,
) -> cudaError_t {
    rt!({
        let k = runtime::kernel_handle(host_fun as usize)?;
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(kernel, k as Handle) }
    })
}

// ---- launches ----

/// Checks a launch's shape against the device's limits.
fn check_shape(grid: Dim3, block: Dim3) -> RtResult<()> {
    let bad = grid.x == 0
        || grid.y == 0
        || grid.z == 0
        || grid.y > 65535
        || grid.z > 65535
        || grid.x > i32::MAX as u32
        || block.x == 0
        || block.y == 0
        || block.z == 0
        || block.x > 1024
        || block.y > 1024
        || block.z > 64
        || block.count() > 1024;
    if bad {
        return Err(RtError::cudaErrorInvalidConfiguration);
    }
    Ok(())
}

/// Launches `function` on `stream`: its host implementation, enqueued.
///
/// # Safety
/// `args` holds one valid pointer per kernel parameter, as the launch API requires.
pub(crate) unsafe fn launch(
    function: runtime::Function,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared_mem: usize,
    stream: Handle,
) -> RtResult<()> {
    let current = runtime::context()?;
    check_shape(grid, block)?;
    let (device, stream) = runtime::stream(stream as u64)?;
    if device.ordinal() != current.ordinal() {
        // As on a GPU: a kernel cannot be launched into another device's stream.
        return Err(RtError::cudaErrorInvalidResourceHandle);
    }
    let ordinal = device.ordinal();
    let Some(kernel) = kernels::find(&function.name) else {
        say!(
            "simgpu: cannot launch kernel {}: simgpu has no host implementation of it \
             (known kernels are listed in simgpu's kernels module); the launch fails with \
             cudaErrorInvalidDeviceFunction",
            function.name
        );
        return Err(RtError::cudaErrorInvalidDeviceFunction);
    };
    if args.is_null() {
        return Err(RtError::cudaErrorInvalidValue);
    }
    let shape = Launch {
        grid,
        block,
        shared_mem,
    };
    // SAFETY: the caller passes the kernel's arguments, read now, before they go away.
    let work = unsafe { kernel.prepare(&shape, args as *const *const c_void) };
    let task: Task = Box::new(move || {
        if runtime::sticky_on(ordinal).is_err() {
            return; // the context is corrupt: later work does not run
        }
        let checked = work.check(&device.memory(), ordinal);
        match checked {
            // SAFETY: the memory was checked; unmapping waits for the stream first.
            Ok(()) => unsafe { work.run() },
            Err(fault) => {
                say!("simgpu: {fault}");
                runtime::set_sticky_on(ordinal, fault.error);
            }
        }
    });
    let delay = crate::config::launch_delay();
    if !delay.is_zero() {
        std::thread::sleep(delay);
    }
    device.streams.enqueue(stream, task)?;
    Ok(())
}

/// `cuLaunchKernel`'s signature.
type CuLaunchKernel = unsafe extern "C" fn(
    Handle,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Handle,
    *mut *mut c_void,
    *mut *mut c_void,
) -> c_int;

/// `cuLaunchKernel` of the `libcuda.so.1` already loaded in the process when it is not
/// simgpu itself — cudaw's driver layer, preloaded ahead of simgpu: simgpu's runtime then
/// launches through it, as the real runtime launches through whatever `libcuda.so.1` the
/// process has (fetched with `cuGetProcAddress`), so that the driver layer sees the
/// runtime's launches as it does on a GPU.
fn driver_launch() -> Option<CuLaunchKernel> {
    static F: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let f = *F.get_or_init(|| {
        // SAFETY: RTLD_NOLOAD only looks among the objects already loaded.
        let h =
            unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if h.is_null() {
            return None;
        }
        // SAFETY: dlsym on a live handle; the name is NUL-terminated.
        let gpa = unsafe { libc::dlsym(h, c"cuGetProcAddress_v2".as_ptr()) };
        if gpa.is_null() || crate::os::is_own(gpa as usize) {
            return None;
        }
        type Gpa = unsafe extern "C" fn(*const c_char, *mut usize, c_int, u64, *mut c_int) -> c_int;
        // SAFETY: `cuGetProcAddress_v2`'s signature (cuda.h).
        let gpa: Gpa = unsafe { std::mem::transmute(gpa) };
        let mut pfn = 0usize;
        // SAFETY: a NUL-terminated name and out-pointers to locals.
        let rc = unsafe {
            gpa(
                c"cuLaunchKernel".as_ptr(),
                &mut pfn,
                12000,
                0,
                std::ptr::null_mut(),
            )
        };
        (rc == 0 && pfn != 0).then_some(pfn)
    });
    // SAFETY: the driver returned `cuLaunchKernel`, whose signature `CuLaunchKernel` is.
    f.map(|f| unsafe { std::mem::transmute::<usize, CuLaunchKernel>(f) })
}

/// A launch of simgpu's runtime: through the process's other `libcuda.so.1`
/// ([`driver_launch`]) when there is one and simgpu can run the kernel, else (or when that
/// launch failed, which enqueued nothing) simgpu's own [`launch`], which also gives a failed
/// launch its runtime error.
///
/// # Safety
/// The launch's contract.
unsafe fn runtime_launch(
    function: runtime::Function,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared_mem: usize,
    stream: Handle,
) -> RtResult<()> {
    let through_driver = driver_launch().zip(kernels::find(&function.name));
    if let Some((driver, kernel)) = through_driver {
        let f = crate::driver_modules::runtime_function_handle(kernel.name);
        // SAFETY: the caller's launch, with simgpu's handle for the kernel.
        let rc = unsafe {
            driver(
                f as Handle,
                grid.x,
                grid.y,
                grid.z,
                block.x,
                block.y,
                block.z,
                shared_mem as c_uint,
                stream,
                args,
                std::ptr::null_mut(),
            )
        };
        if rc == 0 {
            return Ok(());
        }
    }
    // SAFETY: the caller's launch.
    unsafe { launch(function, grid, block, args, shared_mem, stream) }
}

/// `cudaLaunchKernel`: launches the kernel registered for host stub `func`.
#[no_mangle]
pub unsafe extern "C" fn cudaLaunchKernel(
    func: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared_mem: usize,
    stream: Handle,
) -> cudaError_t {
    rt!({
        runtime::context()?;
        let f = runtime::function(func as usize)?;
        // SAFETY: the launch's contract.
        unsafe { runtime_launch(f, grid, block, args, shared_mem, stream) }
    })
}

/// `cudaLaunchKernel_ptsz` (per-thread default stream: simgpu's NULL stream).
#[no_mangle]
pub unsafe extern "C" fn cudaLaunchKernel_ptsz(
    func: *const c_void,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared_mem: usize,
    stream: Handle,
) -> cudaError_t {
    // SAFETY: same contract.
    unsafe { cudaLaunchKernel(func, grid, block, args, shared_mem, stream) }
}

/// `__cudaLaunchKernel`: launches the kernel behind a handle from `__cudaGetKernel`.
#[no_mangle]
pub unsafe extern "C" fn __cudaLaunchKernel(
    kernel: Handle,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared_mem: usize,
    stream: Handle,
) -> cudaError_t {
    rt!({
        runtime::context()?;
        let f = runtime::function_of_kernel(kernel as usize)?;
        // SAFETY: the launch's contract.
        unsafe { runtime_launch(f, grid, block, args, shared_mem, stream) }
    })
}

/// `__cudaLaunchKernel_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn __cudaLaunchKernel_ptsz(
    kernel: Handle,
    grid: Dim3,
    block: Dim3,
    args: *mut *mut c_void,
    shared_mem: usize,
    stream: Handle,
) -> cudaError_t {
    // SAFETY: same contract.
    unsafe { __cudaLaunchKernel(kernel, grid, block, args, shared_mem, stream) }
}

// ---- memory ----

/// `cudaMalloc`: `*ptr = NULL` for size 0.
#[no_mangle]
pub unsafe extern "C" fn cudaMalloc(ptr: *mut *mut c_void, size: usize) -> cudaError_t {
    rt!({
        let device = runtime::context()?;
        if ptr.is_null() {
            return Err(RtError::cudaErrorInvalidValue);
        }
        let addr = match size {
            0 => 0,
            _ => device.memory().alloc(device.ordinal(), size as u64)?,
        };
        // SAFETY: checked non-null; the caller passes a valid out-pointer.
        unsafe { put(ptr, addr as *mut c_void) }
    })
}

/// `cudaFree`: `cudaFree(NULL)` initialises the runtime; otherwise waits for the device
/// first, as the runtime does.
#[no_mangle]
pub unsafe extern "C" fn cudaFree(ptr: *mut c_void) -> cudaError_t {
    rt!({
        let device = runtime::context()?;
        if ptr.is_null() {
            return Ok(());
        }
        runtime::machine()?.synchronize_all();
        // SAFETY: stream work is finished; later accesses fault, as on a GPU.
        unsafe { device.memory().free(ptr as u64) }?;
        Ok(())
    })
}

/// `cudaMallocManaged`: simgpu's device memory is host-accessible, so managed memory is
/// device memory (`flags`: `cudaMemAttachGlobal` 1 or `cudaMemAttachHost` 2).
#[no_mangle]
pub unsafe extern "C" fn cudaMallocManaged(
    ptr: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> cudaError_t {
    rt!({
        let device = runtime::context()?;
        if ptr.is_null() || size == 0 || !matches!(flags, 1 | 2) {
            return Err(RtError::cudaErrorInvalidValue);
        }
        let addr = device.memory().alloc(device.ordinal(), size as u64)?;
        // SAFETY: checked non-null; the caller passes a valid out-pointer.
        unsafe { put(ptr, addr as *mut c_void) }
    })
}

/// `cudaMallocAsync`: allocated at once (simgpu has no pool to order).
#[no_mangle]
pub unsafe extern "C" fn cudaMallocAsync(
    ptr: *mut *mut c_void,
    size: usize,
    stream: Handle,
) -> cudaError_t {
    rt!({
        runtime::context()?;
        runtime::stream(stream as u64)?;
        // SAFETY: same contract as cudaMalloc.
        match unsafe { cudaMalloc(ptr, size) } {
            0 => Ok(()),
            code => Err(RtError::from_code(code)),
        }
    })
}

/// `cudaMallocAsync_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cudaMallocAsync_ptsz(
    ptr: *mut *mut c_void,
    size: usize,
    stream: Handle,
) -> cudaError_t {
    // SAFETY: same contract.
    unsafe { cudaMallocAsync(ptr, size, stream) }
}

/// `cudaFreeAsync`: freed when the stream reaches this point.
#[no_mangle]
pub extern "C" fn cudaFreeAsync(ptr: *mut c_void, stream: Handle) -> cudaError_t {
    rt!({
        runtime::context()?;
        let (device, stream) = runtime::stream(stream as u64)?;
        if ptr.is_null() {
            return Ok(());
        }
        let addr = ptr as u64;
        let task: Task = Box::new(move || {
            // SAFETY: earlier work on this stream is done; the program gave the memory up.
            if let Err(e) = unsafe { device.memory().free(addr) } {
                say!("simgpu: cudaFreeAsync({addr:#x}): not an allocation ({e})");
            }
        });
        device.streams.enqueue(stream, task)?;
        Ok(())
    })
}

/// `cudaFreeAsync_ptsz`.
#[no_mangle]
pub extern "C" fn cudaFreeAsync_ptsz(ptr: *mut c_void, stream: Handle) -> cudaError_t {
    cudaFreeAsync(ptr, stream)
}

/// `cudaHostAlloc`: pinned host memory the device can reach.
#[no_mangle]
pub unsafe extern "C" fn cudaHostAlloc(
    ptr: *mut *mut c_void,
    size: usize,
    _flags: c_uint,
) -> cudaError_t {
    rt!({
        let device = runtime::context()?;
        if ptr.is_null() {
            return Err(RtError::cudaErrorInvalidValue);
        }
        let addr = match size {
            0 => 0,
            _ => {
                let a = device.memory().host_alloc(size as u64)?;
                runtime::add_pinned(a, size as u64);
                a
            }
        };
        // SAFETY: checked non-null; the caller passes a valid out-pointer.
        unsafe { put(ptr, addr as *mut c_void) }
    })
}

/// `cudaMallocHost`.
#[no_mangle]
pub unsafe extern "C" fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) -> cudaError_t {
    // SAFETY: same contract as cudaHostAlloc.
    unsafe { cudaHostAlloc(ptr, size, 0) }
}

/// `cudaFreeHost`: waits for the device first.
#[no_mangle]
pub unsafe extern "C" fn cudaFreeHost(ptr: *mut c_void) -> cudaError_t {
    rt!({
        let device = runtime::context()?;
        if ptr.is_null() {
            return Ok(());
        }
        runtime::machine()?.synchronize_all();
        // SAFETY: the program gives the memory up; stream work using it is finished.
        unsafe { device.memory().host_free(ptr as u64) }?;
        runtime::remove_pinned(ptr as u64);
        Ok(())
    })
}

/// `cudaHostRegister`.
#[no_mangle]
pub unsafe extern "C" fn cudaHostRegister(
    ptr: *mut c_void,
    size: usize,
    _flags: c_uint,
) -> cudaError_t {
    rt!({
        runtime::context()?
            .memory()
            .host_register(ptr as u64, size as u64)?;
        runtime::add_pinned(ptr as u64, size as u64);
        Ok(())
    })
}

/// `cudaHostUnregister`.
#[no_mangle]
pub unsafe extern "C" fn cudaHostUnregister(ptr: *mut c_void) -> cudaError_t {
    rt!({
        let device = runtime::context()?;
        runtime::machine()?.synchronize_all();
        device.memory().host_unregister(ptr as u64)?;
        runtime::remove_pinned(ptr as u64);
        Ok(())
    })
}

/// `cudaDeviceGetDefaultMemPool`: one pool, whose attributes simgpu accepts and keeps.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetDefaultMemPool(pool: *mut Handle, dev: c_int) -> cudaError_t {
    rt!({
        runtime::context()?;
        device_at(dev)?;
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(pool, DEFAULT_POOL as Handle) }
    })
}

/// `cudaDeviceGetMemPool`: the default pool.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceGetMemPool(pool: *mut Handle, dev: c_int) -> cudaError_t {
    // SAFETY: same contract.
    unsafe { cudaDeviceGetDefaultMemPool(pool, dev) }
}

static RELEASE_THRESHOLD: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// `cudaMemPoolSetAttribute`: the release threshold (4) is kept; the reuse flags (1–3) and
/// the resettable high-water marks (6, 8) are accepted.
#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolSetAttribute(
    pool: Handle,
    attr: c_int,
    value: *mut c_void,
) -> cudaError_t {
    rt!({
        runtime::context()?;
        if pool as usize != DEFAULT_POOL || value.is_null() {
            return Err(RtError::cudaErrorInvalidValue);
        }
        match attr {
            1..=3 => Ok(()),
            4 => {
                // SAFETY: the threshold attribute's value is a `cuuint64_t` (checked non-null).
                let v = unsafe { get(value as *const u64) }?;
                RELEASE_THRESHOLD.store(v, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            6 | 8 => Ok(()),
            _ => Err(RtError::cudaErrorInvalidValue),
        }
    })
}

/// `cudaMemPoolGetAttribute`: the release threshold as set; 0 for the others.
#[no_mangle]
pub unsafe extern "C" fn cudaMemPoolGetAttribute(
    pool: Handle,
    attr: c_int,
    value: *mut c_void,
) -> cudaError_t {
    rt!({
        runtime::context()?;
        if pool as usize != DEFAULT_POOL {
            return Err(RtError::cudaErrorInvalidValue);
        }
        // SAFETY: attributes 1–3 are `int`, 4–8 `cuuint64_t` (the caller's buffer).
        unsafe {
            match attr {
                1..=3 => put(value as *mut c_int, 0),
                4 => put(
                    value as *mut u64,
                    RELEASE_THRESHOLD.load(std::sync::atomic::Ordering::Relaxed),
                ),
                5..=8 => put(value as *mut u64, 0),
                _ => Err(RtError::cudaErrorInvalidValue),
            }
        }
    })
}

/// `cudaPointerAttributes`, the fields every CUDA major shares (CUDA 13 appends more,
/// which simgpu leaves as the caller had them).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PointerAttributes {
    /// `cudaMemoryType`.
    pub type_: c_int,
    /// The device ordinal.
    pub device: c_int,
    /// The address the device uses.
    pub device_pointer: *mut c_void,
    /// The address the host uses.
    pub host_pointer: *mut c_void,
}

/// `cudaPointerGetAttributes`: device memory, the runtime's pinned host memory, or
/// unregistered host memory.
#[no_mangle]
pub unsafe extern "C" fn cudaPointerGetAttributes(
    attributes: *mut PointerAttributes,
    ptr: *const c_void,
) -> cudaError_t {
    rt!({
        let device = runtime::context()?;
        let memory = device.memory();
        let p = ptr as *mut c_void;
        // Page-locked by the runtime (cudaHostAlloc, cudaHostRegister) or by the driver
        // (cuMemHostAlloc, cuMemHostRegister): the runtime asks the driver.
        let value = if runtime::is_pinned(ptr as u64) || memory.is_host(ptr as u64) {
            PointerAttributes {
                type_: memory_type::HOST,
                device: device.ordinal() as c_int,
                device_pointer: p,
                host_pointer: p,
            }
        } else if memory.check_device(ptr as u64, 1, false).is_ok() {
            PointerAttributes {
                type_: memory_type::DEVICE,
                device: memory.device_of(ptr as u64).map_or(0, |d| d as c_int),
                device_pointer: p,
                host_pointer: std::ptr::null_mut(),
            }
        } else {
            PointerAttributes {
                type_: memory_type::UNREGISTERED,
                device: -2,
                device_pointer: std::ptr::null_mut(),
                host_pointer: p,
            }
        };
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(attributes, value) }
    })
}

// ---- copies and memset ----

/// Enqueues a copy of `len` bytes; `wait` makes it synchronous. Device sides are checked
/// first. Like the real runtime, a copy from pageable host memory is staged at once (the
/// caller may reuse the buffer when the call returns) and a copy to pageable host memory
/// is waited for.
fn enqueue_copy(
    dst: u64,
    src: u64,
    len: usize,
    kind: i32,
    (device, stream): (&device::Device, StreamId),
    wait: bool,
) -> RtResult<()> {
    if len == 0 {
        return Ok(());
    }
    if dst == 0 || src == 0 {
        return Err(RtError::cudaErrorInvalidValue);
    }
    let (dst_device, src_device, dst_pageable, src_pageable) = {
        let memory = device.memory();
        let reachable = |addr: u64| memory.check_device(addr, 1, false).is_ok();
        let (dst_device, src_device) = match kind {
            kind::HOST_TO_HOST => (false, false),
            kind::HOST_TO_DEVICE => (true, false),
            kind::DEVICE_TO_HOST => (false, true),
            kind::DEVICE_TO_DEVICE => (true, true),
            kind::DEFAULT => (reachable(dst), reachable(src)),
            _ => return Err(RtError::cudaErrorInvalidMemcpyDirection),
        };
        if dst_device {
            memory.check_device(dst, len as u64, true)?;
        }
        if src_device {
            memory.check_device(src, len as u64, false)?;
        }
        if !dst_device {
            memory.check_host_copy(dst, len as u64)?;
        }
        if !src_device {
            memory.check_host_copy(src, len as u64)?;
        }
        (
            dst_device,
            src_device,
            !dst_device && !reachable(dst),
            !src_device && !reachable(src),
        )
    };
    let task: Task = if src_pageable && dst_device && !wait {
        // SAFETY: the caller's source buffer is valid for `len` bytes during the call.
        let staged = unsafe { std::slice::from_raw_parts(src as *const u8, len) }.to_vec();
        Box::new(move || {
            // SAFETY: the destination was checked writable device memory when enqueued.
            unsafe { std::ptr::copy_nonoverlapping(staged.as_ptr(), dst as *mut u8, len) }
        })
    } else {
        Box::new(move || {
            // SAFETY: device sides were checked when enqueued; host sides are the caller's
            // promise, kept until the stream has done the copy. `copy` allows overlap.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) }
        })
    };
    let ticket = device.streams.enqueue(stream, task)?;
    if wait || (dst_pageable && src_device) {
        finish(&ticket)?;
    }
    Ok(())
}

/// `cudaMemcpy`: ordered on the NULL stream, returns when done.
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: c_int,
) -> cudaError_t {
    rt!({
        let device = runtime::context()?;
        enqueue_copy(
            dst as u64,
            src as u64,
            count,
            kind,
            (device, StreamId::Null),
            true,
        )
    })
}

/// `cudaMemcpy2D`: `height` rows of `width` bytes, each row a copy of its own (as
/// synchronous as `cudaMemcpy`).
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpy2D(
    dst: *mut c_void,
    dpitch: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: c_int,
) -> cudaError_t {
    rt!({
        let device = runtime::context()?;
        if width > dpitch || width > spitch {
            return Err(RtError::cudaErrorInvalidPitchValue);
        }
        for row in 0..height {
            let at = |base: u64, pitch: usize| {
                row.checked_mul(pitch)
                    .and_then(|off| base.checked_add(off as u64))
            };
            let (d, s) = (at(dst as u64, dpitch), at(src as u64, spitch));
            let (Some(d), Some(s)) = (d, s) else {
                return Err(RtError::cudaErrorInvalidValue);
            };
            enqueue_copy(d, s, width, kind, (device, StreamId::Null), true)?;
        }
        Ok(())
    })
}

/// `cudaMemcpyAsync`: returns before the copy is done.
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyAsync(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: c_int,
    stream: Handle,
) -> cudaError_t {
    rt!({
        runtime::context()?;
        let s = runtime::stream(stream as u64)?;
        enqueue_copy(dst as u64, src as u64, count, kind, s, false)
    })
}

/// `cudaMemcpyAsync_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cudaMemcpyAsync_ptsz(
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    kind: c_int,
    stream: Handle,
) -> cudaError_t {
    // SAFETY: same contract.
    unsafe { cudaMemcpyAsync(dst, src, count, kind, stream) }
}

fn enqueue_memset(
    dst: u64,
    value: c_int,
    len: usize,
    (device, stream): (&device::Device, StreamId),
) -> RtResult<()> {
    if len == 0 {
        return Ok(());
    }
    device.memory().check_device(dst, len as u64, true)?;
    let byte = value as u8;
    let task: Task = Box::new(move || {
        // SAFETY: the range was checked writable device memory when enqueued.
        unsafe { std::ptr::write_bytes(dst as *mut u8, byte, len) }
    });
    device.streams.enqueue(stream, task)?;
    Ok(())
}

/// `cudaMemset`: on the NULL stream, asynchronous to the host as on a GPU.
#[no_mangle]
pub unsafe extern "C" fn cudaMemset(dst: *mut c_void, value: c_int, count: usize) -> cudaError_t {
    rt!({
        let device = runtime::context()?;
        enqueue_memset(dst as u64, value, count, (device, StreamId::Null))
    })
}

/// `cudaMemsetAsync`.
#[no_mangle]
pub unsafe extern "C" fn cudaMemsetAsync(
    dst: *mut c_void,
    value: c_int,
    count: usize,
    stream: Handle,
) -> cudaError_t {
    rt!({
        runtime::context()?;
        let s = runtime::stream(stream as u64)?;
        enqueue_memset(dst as u64, value, count, s)
    })
}

/// `cudaMemsetAsync_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cudaMemsetAsync_ptsz(
    dst: *mut c_void,
    value: c_int,
    count: usize,
    stream: Handle,
) -> cudaError_t {
    // SAFETY: same contract.
    unsafe { cudaMemsetAsync(dst, value, count, stream) }
}

// ---- streams ----

/// `cudaStreamCreateWithFlags`: `cudaStreamNonBlocking` (1) or default (0).
#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreateWithFlags(
    stream: *mut Handle,
    flags: c_uint,
) -> cudaError_t {
    rt!({
        let device = runtime::context()?;
        if stream.is_null() || flags > 1 {
            return Err(RtError::cudaErrorInvalidValue);
        }
        let id = device.streams.create(flags);
        // SAFETY: checked non-null; the caller passes a valid out-pointer.
        unsafe { put(stream, device::handle_of(id) as Handle) }
    })
}

/// `cudaStreamCreate`.
#[no_mangle]
pub unsafe extern "C" fn cudaStreamCreate(stream: *mut Handle) -> cudaError_t {
    // SAFETY: same contract.
    unsafe { cudaStreamCreateWithFlags(stream, 0) }
}

/// `cudaStreamDestroy`: work already enqueued still completes.
#[no_mangle]
pub extern "C" fn cudaStreamDestroy(stream: Handle) -> cudaError_t {
    rt!({
        runtime::context()?;
        match runtime::stream(stream as u64)? {
            (device, StreamId::Created(id)) => Ok(device.streams.destroy(id)?),
            (_, StreamId::Null) => Err(RtError::cudaErrorInvalidResourceHandle),
        }
    })
}

/// `cudaStreamSynchronize`: reports a kernel's fault.
#[no_mangle]
pub extern "C" fn cudaStreamSynchronize(stream: Handle) -> cudaError_t {
    rt!({
        runtime::context()?;
        let (device, stream) = runtime::stream(stream as u64)?;
        device.streams.tail(stream)?.wait();
        runtime::sticky_on(device.ordinal())
    })
}

/// `cudaStreamQuery`: `cudaErrorNotReady` while work is pending.
#[no_mangle]
pub extern "C" fn cudaStreamQuery(stream: Handle) -> cudaError_t {
    rt!({
        runtime::context()?;
        let (device, stream) = runtime::stream(stream as u64)?;
        match device.streams.idle(stream)? {
            true => runtime::sticky_on(device.ordinal()),
            false => Err(RtError::cudaErrorNotReady),
        }
    })
}

/// `cudaStreamIsCapturing`: simgpu never captures (`cudaStreamCaptureStatusNone`).
#[no_mangle]
pub unsafe extern "C" fn cudaStreamIsCapturing(stream: Handle, status: *mut c_int) -> cudaError_t {
    rt!({
        runtime::context()?;
        runtime::stream(stream as u64)?;
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(status, 0) }
    })
}

// ---- events ----

/// `cudaEventCreateWithFlags`.
#[no_mangle]
pub unsafe extern "C" fn cudaEventCreateWithFlags(
    event: *mut Handle,
    flags: c_uint,
) -> cudaError_t {
    rt!({
        let device = runtime::context()?;
        if event.is_null() || flags > 0xf {
            return Err(RtError::cudaErrorInvalidValue);
        }
        let handle = device.add_event(Event::new(flags));
        // SAFETY: checked non-null; the caller passes a valid out-pointer.
        unsafe { put(event, handle as Handle) }
    })
}

/// `cudaEventCreate`.
#[no_mangle]
pub unsafe extern "C" fn cudaEventCreate(event: *mut Handle) -> cudaError_t {
    // SAFETY: same contract.
    unsafe { cudaEventCreateWithFlags(event, 0) }
}

/// `cudaEventRecord`.
#[no_mangle]
pub extern "C" fn cudaEventRecord(event: Handle, stream: Handle) -> cudaError_t {
    rt!({
        runtime::context()?;
        let (owner, e) = runtime::machine()?.event(event as u64)?;
        let (device, stream) = runtime::stream(stream as u64)?;
        if owner.ordinal() != device.ordinal() {
            // As on a GPU: an event records only on a stream of its own device.
            return Err(RtError::cudaErrorInvalidResourceHandle);
        }
        Ok(e.record(&device.streams, stream)?)
    })
}

/// `cudaEventRecord_ptsz`.
#[no_mangle]
pub extern "C" fn cudaEventRecord_ptsz(event: Handle, stream: Handle) -> cudaError_t {
    cudaEventRecord(event, stream)
}

/// `cudaEventSynchronize`: reports a kernel's fault.
#[no_mangle]
pub extern "C" fn cudaEventSynchronize(event: Handle) -> cudaError_t {
    rt!({
        runtime::context()?;
        let (device, e) = runtime::machine()?.event(event as u64)?;
        e.synchronize();
        runtime::sticky_on(device.ordinal())
    })
}

/// `cudaEventQuery`: `cudaErrorNotReady` until the stream reaches the last record.
#[no_mangle]
pub extern "C" fn cudaEventQuery(event: Handle) -> cudaError_t {
    rt!({
        runtime::context()?;
        let (device, e) = runtime::machine()?.event(event as u64)?;
        match e.done() {
            true => runtime::sticky_on(device.ordinal()),
            false => Err(RtError::cudaErrorNotReady),
        }
    })
}

/// `cudaEventElapsedTime`: real milliseconds between two completed records.
#[no_mangle]
pub unsafe extern "C" fn cudaEventElapsedTime(
    ms: *mut f32,
    start: Handle,
    end: Handle,
) -> cudaError_t {
    rt!({
        runtime::context()?;
        let machine = runtime::machine()?;
        let value = Event::elapsed_ms(
            &machine.event(start as u64)?.1,
            &machine.event(end as u64)?.1,
        )?;
        // SAFETY: the caller passes a valid out-pointer or null.
        unsafe { put(ms, value) }
    })
}

/// `cudaEventDestroy`.
#[no_mangle]
pub extern "C" fn cudaEventDestroy(event: Handle) -> cudaError_t {
    rt!({
        runtime::context()?;
        Ok(runtime::machine()?.remove_event(event as u64)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(code: cudaError_t) {
        assert_eq!(code, 0, "{:?}", error::name_of(code));
    }

    /// Registers `name` under a fresh fake host stub; returns the stub.
    fn register(name: &std::ffi::CStr) -> *const c_void {
        static STUBS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let stub = 0x5000 + 16 * STUBS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let handle = __cudaRegisterFatBinary(std::ptr::null_mut());
        // SAFETY: a static NUL-terminated name; the other pointers are unused.
        unsafe {
            __cudaRegisterFunction(
                handle,
                stub as *const c_char,
                std::ptr::null_mut(),
                name.as_ptr(),
                -1,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        __cudaRegisterFatBinaryEnd(handle);
        stub as *const c_void
    }

    #[test]
    fn a_launch_runs_on_its_stream_between_copies() {
        let stub = register(c"_Z10vector_addPKfS0_Pfi");
        let n = 1000usize;
        let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let b = vec![0.25f32; n];
        let mut c = vec![0f32; n];
        let bytes = n * 4;
        let mut d = [std::ptr::null_mut::<c_void>(); 3];
        let mut stream: Handle = std::ptr::null_mut();
        let (mut start, mut end): (Handle, Handle) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: valid out-pointers and buffers of the sizes given; the stream is
        // synchronised before the host buffers go.
        unsafe {
            for p in &mut d {
                ok(cudaMalloc(p, bytes));
            }
            ok(cudaStreamCreateWithFlags(&mut stream, 1));
            ok(cudaEventCreate(&mut start));
            ok(cudaEventCreate(&mut end));
            ok(cudaEventRecord(start, stream));
            ok(cudaMemcpyAsync(
                d[0],
                a.as_ptr().cast(),
                bytes,
                kind::HOST_TO_DEVICE,
                stream,
            ));
            ok(cudaMemcpyAsync(
                d[1],
                b.as_ptr().cast(),
                bytes,
                kind::DEFAULT,
                stream,
            ));
            let ni = n as c_int;
            let mut args = [
                (&d[0]) as *const _ as *mut c_void,
                (&d[1]) as *const _ as *mut c_void,
                (&d[2]) as *const _ as *mut c_void,
                (&ni) as *const _ as *mut c_void,
            ];
            let mut kernel: Handle = std::ptr::null_mut();
            ok(__cudaGetKernel(&mut kernel, stub));
            ok(__cudaLaunchKernel(
                kernel,
                Dim3::x(4),
                Dim3::x(256),
                args.as_mut_ptr(),
                0,
                stream,
            ));
            ok(cudaMemcpyAsync(
                c.as_mut_ptr().cast(),
                d[2],
                bytes,
                kind::DEVICE_TO_HOST,
                stream,
            ));
            ok(cudaEventRecord(end, stream));
            ok(cudaStreamSynchronize(stream));
            ok(cudaEventQuery(end));
            let mut ms = -1f32;
            ok(cudaEventElapsedTime(&mut ms, start, end));
            assert!(ms >= 0.0);
            // The same kernel through its host stub, on the NULL stream.
            ok(cudaMemset(d[2], 0, bytes));
            ok(cudaLaunchKernel(
                stub,
                Dim3::x(4),
                Dim3::x(256),
                args.as_mut_ptr(),
                0,
                std::ptr::null_mut(),
            ));
            let mut c2 = vec![0f32; n];
            ok(cudaMemcpy(
                c2.as_mut_ptr().cast(),
                d[2],
                bytes,
                kind::DEVICE_TO_HOST,
            ));
            assert_eq!(c, c2);
            for p in d {
                ok(cudaFree(p));
            }
            ok(cudaStreamDestroy(stream));
            ok(cudaEventDestroy(start));
            ok(cudaEventDestroy(end));
        }
        assert!(c.iter().enumerate().all(|(i, &v)| v == i as f32 + 0.25));
    }

    #[test]
    fn failures_are_the_runtimes_and_set_the_last_error() {
        let stub = register(c"_Z14not_simulatedv") as usize;
        std::thread::spawn(move || {
            let stub = stub as *const c_void;
            // SAFETY: valid pointers or deliberately invalid values the runtime refuses.
            unsafe {
                let mut args: [*mut c_void; 0] = [];
                let rc = cudaLaunchKernel(
                    stub,
                    Dim3::x(1),
                    Dim3::x(1),
                    args.as_mut_ptr(),
                    0,
                    std::ptr::null_mut(),
                );
                assert_eq!(rc, 98);
                assert_eq!(cudaPeekAtLastError(), 98);
                assert_eq!(cudaGetLastError(), 98);
                assert_eq!(cudaGetLastError(), 0);
                let rc = cudaLaunchKernel(
                    0x7770 as *const c_void,
                    Dim3::x(1),
                    Dim3::x(1),
                    args.as_mut_ptr(),
                    0,
                    std::ptr::null_mut(),
                );
                assert_eq!(rc, 98, "an unregistered stub");
                let vstub = register(c"_Z10vector_addPKfS0_Pfi");
                let rc = cudaLaunchKernel(
                    vstub,
                    Dim3::x(1),
                    Dim3::x(2048),
                    args.as_mut_ptr(),
                    0,
                    std::ptr::null_mut(),
                );
                assert_eq!(rc, 9, "too many threads per block");
                let mut x = 0u8;
                let p = (&mut x) as *mut u8 as *mut c_void;
                assert_eq!(cudaMemcpy(p, p, 1, 7), 21);
                assert_eq!(cudaStreamSynchronize(0x35 as Handle), 400);
                assert_eq!(cudaSetDevice(1), 101);
                assert_eq!(cudaGetLastError(), 101);
                let mut v = 0;
                ok(cudaDeviceGetAttribute(&mut v, 75, 0));
                assert_eq!(v, 9);
                ok(cudaRuntimeGetVersion(&mut v));
                assert_eq!(v, 13000);
                let mut status = 1;
                ok(cudaStreamIsCapturing(std::ptr::null_mut(), &mut status));
                assert_eq!(status, 0);
                ok(cudaFree(std::ptr::null_mut()));
                let name = std::ffi::CStr::from_ptr(cudaGetErrorName(98));
                assert_eq!(name.to_str(), Ok("cudaErrorInvalidDeviceFunction"));
                let text = std::ffi::CStr::from_ptr(cudaGetErrorString(12345));
                assert_eq!(text.to_str(), Ok("unrecognized error code"));
            }
        })
        .join()
        .unwrap();
    }
}

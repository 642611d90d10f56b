//! cudaw's own versions of the runtime functions it must see. Each is an `extern "C"` body
//! inside the panic boundary; [`table`] says which names they replace in the dispatch
//! table. Allocation calls are always cudaw's; with translated addressing, every call that
//! carries device pointers to the real runtime translates them on the way.

#![allow(non_snake_case)]

use crate::boundary::guard;
use crate::dispatch::idx;
use crate::memory::{self, tag, to_real, translated, write_out};
use crate::registry;
use crate::tracing;
use crate::types::*;
use crate::{call_real, log};
use cudaw_engine::launch_args::{translate_args, ArgBuffer};
use cudaw_engine::memory_calls as calls;
use cudaw_engine::pageable;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

/// The real function at dispatch index `i`, typed as `F` (a function-pointer type).
///
/// # Safety
/// `F` must be the real function's C signature.
unsafe fn real_as<F: Copy>(i: usize) -> Option<F> {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<usize>()) };
    let p = crate::dispatch::real(i)?;
    // SAFETY: `F` is a function pointer type of the right signature (caller's contract),
    // and `p` is the address of that function.
    Some(unsafe { std::mem::transmute_copy::<usize, F>(&p) })
}

/// Calls the real function at dispatch index `i` through `call`, typed as `F`; returns
/// `cudaErrorNotSupported` when the real runtime lacks it.
pub(crate) fn forward_raw<F: Copy>(i: usize, call: impl FnOnce(F) -> cudaError_t) -> cudaError_t {
    // SAFETY: callers name `F` as the runtime header's signature for index `i`.
    match unsafe { real_as::<F>(i) } {
        Some(f) => call(f),
        None => ERROR_NOT_SUPPORTED,
    }
}

/// Calls the real function at index `$i`, `$name` or one of its variants, with the C
/// signature `fn($t...) -> cudaError_t`, checked against the header's for `$name` at compile
/// time (`driver::check_signature!`).
macro_rules! forward {
    ($i:expr, $name:ident : fn($($t:ty),*), $($arg:expr),*) => {{
        driver::check_signature!(runtime, $name, unsafe extern "C" fn($($t),*) -> cudaError_t);
        // SAFETY: the signature is the runtime header's for the function at this index.
        match unsafe { real_as::<unsafe extern "C" fn($($t),*) -> cudaError_t>($i) } {
            // SAFETY: forwarding the application's arguments (translated where needed).
            Some(f) => unsafe { f($($arg),*) },
            None => ERROR_NOT_SUPPORTED,
        }
    }};
}

use crate::variants;

// ---------------------------------------------------------------- allocation (always)

fn malloc_impl(_i: usize, out: *mut *mut c_void, size: usize) -> cudaError_t {
    alloc_into(out, size, tag::MALLOC)
}

/// `size` bytes of cudaw's memory (tagged `tag`), written through `out` (null for 0 bytes).
fn alloc_into(out: *mut *mut c_void, size: usize, tag: u32) -> cudaError_t {
    if out.is_null() {
        return ERROR_INVALID_VALUE;
    }
    match calls::alloc(size as u64, tag) {
        // SAFETY: non-null out-pointer from the application.
        Ok(base) => unsafe { write_out(out, base as *mut c_void) },
        Err(e) => e,
    }
}
variants!(malloc_impl => cudaMalloc; (out: *mut *mut c_void, size: usize));

fn free_impl(i: usize, ptr: *mut c_void) -> cudaError_t {
    if ptr.is_null() {
        return forward!(i, cudaFree: fn(*mut c_void), ptr);
    }
    match memory::lookup(ptr as u64) {
        Some((mem, a)) => {
            if a.base != ptr as u64 {
                // What the current runtime answers for a pointer that is not an allocation's
                // start (cudaErrorInvalidDevicePointer is deprecated since CUDA 10.1).
                return ERROR_INVALID_VALUE;
            }
            mem.synchronise_before_free("cudaFree");
            mem.reap(false);
            tracing::free(a.base);
            match mem.vmm.free(a.base) {
                Ok(()) => SUCCESS,
                Err(e) => e.cuda_error_code(),
            }
        }
        None => {
            let rc = forward!(i, cudaFree: fn(*mut c_void), ptr);
            if rc == SUCCESS {
                memory::freed_managed(ptr as u64);
            }
            rc
        }
    }
}
variants!(free_impl => cudaFree; (ptr: *mut c_void));

/// `cudaHostRegister`: memory the program page-locks itself is its own from now on. What
/// smart pinning registered there is unregistered first (the runtime would otherwise answer
/// "already registered", which the program never sees natively).
fn host_register_impl(i: usize, ptr: *mut c_void, size: usize, flags: u32) -> cudaError_t {
    cudaw_engine::pinning::release(ptr as u64, size as u64, true);
    forward!(i, cudaHostRegister: fn(*mut c_void, usize, u32), ptr, size, flags)
}
variants!(host_register_impl => cudaHostRegister; (ptr: *mut c_void, size: usize, flags: u32));

fn malloc_pitch_impl(
    _i: usize,
    out: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> cudaError_t {
    if out.is_null() || pitch.is_null() {
        return ERROR_INVALID_VALUE;
    }
    let (p, base) = match calls::pitched(width, height)
        .and_then(|(p, size)| Ok((p, calls::alloc_pitched(size as u64, tag::PITCH)?)))
    {
        Ok(v) => v,
        Err(e) => return e,
    };
    // SAFETY: both out-pointers are non-null and come from the application.
    unsafe {
        pitch.write(p);
        out.write(base as *mut c_void);
    }
    SUCCESS
}
variants!(malloc_pitch_impl => cudaMallocPitch; (out: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize));

fn malloc_3d_impl(_i: usize, out: *mut cudaPitchedPtr, extent: cudaExtent) -> cudaError_t {
    if out.is_null() {
        return ERROR_INVALID_VALUE;
    }
    let (p, base) = match calls::pitched_3d(extent.width, extent.height, extent.depth)
        .and_then(|(p, size)| Ok((p, calls::alloc_pitched(size as u64, tag::MALLOC_3D)?)))
    {
        Ok(v) => v,
        Err(e) => return e,
    };
    let v = cudaPitchedPtr {
        ptr: base as *mut c_void,
        pitch: p,
        xsize: extent.width,
        ysize: extent.height,
    };
    // SAFETY: non-null out-pointer from the application.
    unsafe { write_out(out, v) }
}
variants!(malloc_3d_impl => cudaMalloc3D; (out: *mut cudaPitchedPtr, extent: cudaExtent));

/// Whether `stream` is capturing a graph: stream-ordered allocations made during capture
/// become graph memory nodes, which belong to the real runtime.
fn capturing(stream: cudaStream_t) -> bool {
    let mut status: i32 = 0;
    let rc = call_real!(cudaStreamIsCapturing: fn(cudaStream_t, *mut i32) -> cudaError_t, stream, &mut status);
    rc == SUCCESS && status != 0
}

fn malloc_async_impl(
    i: usize,
    out: *mut *mut c_void,
    size: usize,
    stream: cudaStream_t,
) -> cudaError_t {
    if capturing(stream) {
        return forward!(
            i, cudaMallocAsync:
            fn(*mut *mut c_void, usize, cudaStream_t),
            out,
            size,
            stream
        );
    }
    alloc_into(out, size, tag::ASYNC)
}
variants!(malloc_async_impl => cudaMallocAsync, cudaMallocAsync_ptsz; (out: *mut *mut c_void, size: usize, stream: cudaStream_t));

fn malloc_from_pool_impl(
    i: usize,
    out: *mut *mut c_void,
    size: usize,
    pool: *mut c_void,
    stream: cudaStream_t,
) -> cudaError_t {
    if capturing(stream) {
        return forward!(
            i, cudaMallocFromPoolAsync:
            fn(*mut *mut c_void, usize, *mut c_void, cudaStream_t),
            out,
            size,
            pool,
            stream
        );
    }
    malloc_async_impl(idx::cudaMallocAsync, out, size, stream)
}
variants!(malloc_from_pool_impl => cudaMallocFromPoolAsync, cudaMallocFromPoolAsync_ptsz;
    (out: *mut *mut c_void, size: usize, pool: *mut c_void, stream: cudaStream_t));

fn free_async_impl(i: usize, ptr: *mut c_void, stream: cudaStream_t) -> cudaError_t {
    match memory::lookup(ptr as u64) {
        Some((mem, a)) if a.base == ptr as u64 => {
            tracing::free(a.base);
            mem.free_on_stream(a.base, stream)
        }
        Some(_) => ERROR_INVALID_VALUE,
        None => forward!(i, cudaFreeAsync: fn(*mut c_void, cudaStream_t), ptr, stream),
    }
}
variants!(free_async_impl => cudaFreeAsync, cudaFreeAsync_ptsz; (ptr: *mut c_void, stream: cudaStream_t));

fn mem_get_info_impl(i: usize, free: *mut usize, total: *mut usize) -> cudaError_t {
    if free.is_null() || total.is_null() {
        return forward!(i, cudaMemGetInfo: fn(*mut usize, *mut usize), free, total);
    }
    match calls::memory_info(|f, t| forward!(i, cudaMemGetInfo: fn(*mut usize, *mut usize), f, t)) {
        // SAFETY: both non-null out-pointers from the application.
        Ok((f, t)) => unsafe {
            free.write(f);
            total.write(t);
            SUCCESS
        },
        Err(rc) => rc,
    }
}
variants!(mem_get_info_impl => cudaMemGetInfo; (free: *mut usize, total: *mut usize));

/// `cudaGetDeviceProperties[_v2]`: `totalGlobalMem` is the device's memory limit, when
/// it has one below the card's memory.
fn get_device_properties_impl(i: usize, prop: *mut c_void, dev: i32) -> cudaError_t {
    let rc = forward!(i, cudaGetDeviceProperties: fn(*mut c_void, i32), prop, dev);
    if rc == SUCCESS && !prop.is_null() && memory::has_limit(dev) {
        // SAFETY: the real runtime filled the application's cudaDeviceProp, whose
        // totalGlobalMem (a size_t, 8-aligned) lies at this offset in every CUDA version.
        unsafe {
            let p = (prop as *mut u8).add(memory::PROP_TOTAL_GLOBAL_MEM) as *mut u64;
            let (card, limited) = (p.read(), calls::limited_total(dev, p.read()));
            // Written only when the limit changes it: the struct is the program's.
            if limited != card {
                p.write(limited);
            }
        }
    }
    rc
}
variants!(get_device_properties_impl => cudaGetDeviceProperties, cudaGetDeviceProperties_v2; (prop: *mut c_void, dev: i32));

/// `cudaMallocManaged`: forwarded (the real runtime manages migration), its size counted
/// against the current device's budget, rounded up to 2 MiB, until it is freed.
fn malloc_managed_impl(i: usize, out: *mut *mut c_void, size: usize, flags: u32) -> cudaError_t {
    let forward =
        || forward!(i, cudaMallocManaged: fn(*mut *mut c_void, usize, u32), out, size, flags);
    if out.is_null() || size == 0 {
        return forward();
    }
    let made = || match forward() {
        // SAFETY: the real runtime wrote the pointer through the non-null `out`.
        SUCCESS => (SUCCESS, Some(unsafe { out.read() } as u64)),
        rc => (rc, None),
    };
    calls::managed(size as u64, made).unwrap_or_else(|e| e)
}
variants!(malloc_managed_impl => cudaMallocManaged; (out: *mut *mut c_void, size: usize, flags: u32));

// ---------------------------------------------------------------- peer access (always)

/// `cudaDeviceEnablePeerAccess`: forwarded; once the driver agrees, the current device is
/// granted access to `peer`'s memory of cudaw's too (VMM mappings need it per mapping).
fn enable_peer_access_impl(i: usize, peer: i32, flags: u32) -> cudaError_t {
    let rc = forward!(i, cudaDeviceEnablePeerAccess: fn(i32, u32), peer, flags);
    if cudaw_engine::peer::enable_took_effect(rc) {
        if let Ok(dev) = memory::current_device() {
            cudaw_engine::peer::enabled(dev, peer);
        }
    }
    rc
}
variants!(enable_peer_access_impl => cudaDeviceEnablePeerAccess; (peer: i32, flags: u32));

/// `cudaDeviceDisablePeerAccess`: forwarded; once the driver agrees, the access granted on
/// cudaw's memory goes too.
fn disable_peer_access_impl(i: usize, peer: i32) -> cudaError_t {
    let rc = forward!(i, cudaDeviceDisablePeerAccess: fn(i32), peer);
    if cudaw_engine::peer::disable_took_effect(rc) {
        if let Ok(dev) = memory::current_device() {
            cudaw_engine::peer::disabled(dev, peer);
        }
    }
    rc
}
variants!(disable_peer_access_impl => cudaDeviceDisablePeerAccess; (peer: i32));

// ---------------------------------------------------------------- registration (always)

extern "C" fn __cudaRegisterFatBinary(wrapper: *mut c_void) -> *mut *mut c_void {
    guard("__cudaRegisterFatBinary", std::ptr::null_mut(), || {
        type F = unsafe extern "C" fn(*mut c_void) -> *mut *mut c_void;
        driver::check_signature!(runtime, __cudaRegisterFatBinary, F);
        // SAFETY: the runtime header's signature (checked above).
        let real = unsafe { real_as::<F>(idx::__cudaRegisterFatBinary) };
        let Some(real) = real else {
            return std::ptr::null_mut();
        };
        // SAFETY: forwarding the compiler-generated wrapper unchanged.
        let handle = unsafe { real(wrapper) };
        // SAFETY: `wrapper` is the `__fatBinC_Wrapper_t` nvcc emitted, alive for the process.
        let data = unsafe { registry::fatbin_bytes(wrapper) };
        registry::add_fatbin(handle as usize, data);
        handle
    })
}

extern "C" fn __cudaUnregisterFatBinary(handle: *mut *mut c_void) {
    guard("__cudaUnregisterFatBinary", (), || {
        registry::remove_fatbin(handle as usize);
        type F = unsafe extern "C" fn(*mut *mut c_void);
        driver::check_signature!(runtime, __cudaUnregisterFatBinary, F);
        // SAFETY: the runtime header's signature (checked above).
        if let Some(real) = unsafe { real_as::<F>(idx::__cudaUnregisterFatBinary) } {
            // SAFETY: forwarding the handle the real runtime gave out.
            unsafe { real(handle) }
        }
    })
}

#[allow(clippy::too_many_arguments)]
extern "C" fn __cudaRegisterFunction(
    handle: *mut *mut c_void,
    host_fun: *const c_void,
    device_fun: *mut i8,
    device_name: *const i8,
    thread_limit: i32,
    tid: *mut c_void,
    bid: *mut c_void,
    bdim: *mut c_void,
    gdim: *mut c_void,
    wsize: *mut i32,
) {
    type F = unsafe extern "C" fn(
        *mut *mut c_void,
        *const c_void,
        *mut i8,
        *const i8,
        i32,
        *mut c_void,
        *mut c_void,
        *mut c_void,
        *mut c_void,
        *mut i32,
    );
    driver::check_signature!(runtime, __cudaRegisterFunction, F);
    guard("__cudaRegisterFunction", (), || {
        if !device_name.is_null() {
            // SAFETY: nvcc passes the kernel's mangled name, NUL-terminated, static.
            let name = unsafe { std::ffi::CStr::from_ptr(device_name.cast()) }
                .to_string_lossy()
                .into_owned();
            registry::add_function(handle as usize, host_fun as usize, name);
        }
        // SAFETY: the runtime header's signature (checked above).
        if let Some(real) = unsafe { real_as::<F>(idx::__cudaRegisterFunction) } {
            // SAFETY: forwarding the compiler-generated arguments unchanged.
            unsafe {
                real(
                    handle,
                    host_fun,
                    device_fun,
                    device_name,
                    thread_limit,
                    tid,
                    bid,
                    bdim,
                    gdim,
                    wsize,
                )
            }
        }
    })
}

fn get_kernel_impl(i: usize, out: *mut *mut c_void, host_fun: *const c_void) -> cudaError_t {
    let rc = forward!(i, __cudaGetKernel: fn(*mut *mut c_void, *const c_void), out, host_fun);
    if rc == SUCCESS && !out.is_null() {
        // SAFETY: the real runtime wrote the kernel handle through the application's pointer.
        let k = unsafe { out.read() };
        registry::add_kernel_handle(k as usize, host_fun as usize);
    }
    rc
}
variants!(get_kernel_impl => __cudaGetKernel; (out: *mut *mut c_void, host_fun: *const c_void));

// ---------------------------------------------------------------- translated addressing

static DEVICE_SM: AtomicU32 = AtomicU32::new(0);

/// The current device's SM number (e.g. 90), cached.
pub(crate) fn device_sm() -> u32 {
    let v = DEVICE_SM.load(Ordering::Relaxed);
    if v != 0 {
        return v;
    }
    let dev = memory::current_device().unwrap_or(0);
    let (mut maj, mut min) = (0i32, 0i32);
    call_real!(cudaDeviceGetAttribute: fn(*mut i32, i32, i32) -> cudaError_t, &mut maj, DEV_ATTR_CC_MAJOR, dev);
    call_real!(cudaDeviceGetAttribute: fn(*mut i32, i32, i32) -> cudaError_t, &mut min, DEV_ATTR_CC_MINOR, dev);
    let sm = (maj.max(0) * 10 + min.max(0)) as u32;
    DEVICE_SM.store(sm, Ordering::Relaxed);
    sm
}

/// Forwards a launch of `rec`'s kernel (`f` is what the caller named it by: a host stub or a
/// `cudaKernel_t`), its arguments rewritten for translated addressing.
#[allow(clippy::too_many_arguments)]
fn forward_launch(
    i: usize,
    rec: Option<&'static registry::FunctionRecord>,
    lookup_ticks: u64,
    f: *const c_void,
    g: Dim3,
    b: Dim3,
    args: *mut *mut c_void,
    shm: usize,
    s: cudaStream_t,
) -> cudaError_t {
    let mut buf = translate_args(rec, args, device_sm);
    let a = buf.as_mut().map_or(args, ArgBuffer::as_args);
    tracing::launch(
        rec,
        lookup_ticks,
        g.into(),
        b.into(),
        shm,
        args,
        device_sm,
        |on| {
            launched(i, on, || {
                forward!(
                    i, cudaLaunchKernel:
                    fn(*const c_void, Dim3, Dim3, *mut *mut c_void, usize, cudaStream_t),
                    f,
                    g,
                    b,
                    a,
                    shm,
                    s
                )
            })
        },
    )
}

/// Runs launch `f` of export `i` as tracing in mode `timeline` needs it (`None`: tracing
/// is off): its result, and whether cudaw's driver layer recorded it already.
///
/// Under `metrics`, the first launch through export `i` while it is still to be observed
/// ([`crate::launch_bypass`]) is left to cudaw's driver layer, which counts it when the
/// real runtime's launch reaches it (`driver_layer_counts_launches`; the export goes
/// straight to the real runtime from then on); this layer records it only when it did not.
fn launched(i: usize, timeline: Option<bool>, f: impl FnOnce() -> u32) -> (u32, bool) {
    match timeline {
        None => (f(), false),
        Some(false)
            if crate::launch_bypass::untested(i) && tracing::driver_layer_counts_launches() =>
        {
            crate::launch_bypass::observe_unrecorded(i, f)
        }
        Some(_) => (crate::inflight::recording_launch_of(f), false),
    }
}

fn launch_impl(
    i: usize,
    f: *const c_void,
    g: Dim3,
    b: Dim3,
    args: *mut *mut c_void,
    shm: usize,
    s: cudaStream_t,
) -> cudaError_t {
    let (rec, lookup) = tracing::self_timed(|| registry::function(f as usize));
    forward_launch(i, rec, lookup, f, g, b, args, shm, s)
}
variants!(marked launch_impl => cudaLaunchKernel, cudaLaunchKernel_ptsz, cudaLaunchCooperativeKernel, cudaLaunchCooperativeKernel_ptsz;
    (f: *const c_void, g: Dim3, b: Dim3, args: *mut *mut c_void, shm: usize, s: cudaStream_t));

fn launch_kernel_handle_impl(
    i: usize,
    k: *const c_void,
    g: Dim3,
    b: Dim3,
    args: *mut *mut c_void,
    shm: usize,
    s: cudaStream_t,
) -> cudaError_t {
    let (rec, lookup) = tracing::self_timed(|| registry::function_of_kernel(k as usize));
    forward_launch(i, rec, lookup, k, g, b, args, shm, s)
}
variants!(marked launch_kernel_handle_impl => __cudaLaunchKernel, __cudaLaunchKernel_ptsz;
    (k: *const c_void, g: Dim3, b: Dim3, args: *mut *mut c_void, shm: usize, s: cudaStream_t));

fn launch_ex_impl(
    i: usize,
    cfg: *const cudaLaunchConfig_t,
    f: *const c_void,
    args: *mut *mut c_void,
) -> cudaError_t {
    let (rec, lookup) = tracing::self_timed(|| registry::function(f as usize));
    let mut buf = translate_args(rec, args, device_sm);
    let a = buf.as_mut().map_or(args, ArgBuffer::as_args);
    // SAFETY: a non-null launch configuration from the application.
    let shape = (!cfg.is_null()).then(|| unsafe { cfg.read() });
    let (g, b, shm) = shape.map_or(([0; 3], [0; 3], 0), |c| {
        (c.grid_dim.into(), c.block_dim.into(), c.dynamic_smem_bytes)
    });
    tracing::launch(rec, lookup, g, b, shm, args, device_sm, |on| {
        launched(i, on, || {
            forward!(
                i, cudaLaunchKernelExC:
                fn(*const cudaLaunchConfig_t, *const c_void, *mut *mut c_void),
                cfg,
                f,
                a
            )
        })
    })
}
variants!(marked launch_ex_impl => cudaLaunchKernelExC, cudaLaunchKernelExC_ptsz;
    (cfg: *const cudaLaunchConfig_t, f: *const c_void, args: *mut *mut c_void));

/// The launches as cudaw forwards them with mapped addressing and no tracing: marked in
/// flight ([`crate::inflight::marked`]; their trampolines are the plain kind) and passed on
/// unchanged, until [`crate::launch_bypass`] has seen that the driver layer marks them
/// (then the export goes to the real runtime).
mod marked_launches {
    #![allow(non_snake_case)]
    use super::*;

    macro_rules! marked {
        ($($name:ident ($($a:ident : $t:ty),*);)+) => {
            // One thin wrapper per name of the list's `launch` group, and no other.
            const _: () = assert!(
                crate::types::same_set(&super::list::LAUNCH, &[$(idx::$name),+]),
                "the thin launch wrappers and exports/wrapped.txt's `launch` group differ"
            );
            /// (index, thin wrapper), in the order of the list's `launch` group.
            pub(super) fn table() -> [(usize, usize); super::list::LAUNCH.len()] {
                let mine = [$((idx::$name, $name as *const () as usize)),+];
                super::list::LAUNCH.map(|i| {
                    mine.iter().find(|(j, _)| *j == i).copied().unwrap_or((i, crate::dispatch::real_or_stub(i)))
                })
            }
            $(
            pub(super) extern "C" fn $name($($a: $t),*) -> cudaError_t {
                guard(stringify!($name), ERROR_UNKNOWN, || {
                    let launch = || {
                        crate::inflight::marked(|| forward!(idx::$name, $name: fn($($t),*), $($a),*))
                    };
                    if crate::launch_bypass::untested(idx::$name) {
                        return crate::launch_bypass::observe(idx::$name, stringify!($name), launch);
                    }
                    launch()
                })
            }
        )+ };
    }

    marked! {
        cudaLaunchKernel(f: *const c_void, g: Dim3, b: Dim3, args: *mut *mut c_void, shm: usize, s: cudaStream_t);
        cudaLaunchKernel_ptsz(f: *const c_void, g: Dim3, b: Dim3, args: *mut *mut c_void, shm: usize, s: cudaStream_t);
        cudaLaunchCooperativeKernel(f: *const c_void, g: Dim3, b: Dim3, args: *mut *mut c_void, shm: usize, s: cudaStream_t);
        cudaLaunchCooperativeKernel_ptsz(f: *const c_void, g: Dim3, b: Dim3, args: *mut *mut c_void, shm: usize, s: cudaStream_t);
        __cudaLaunchKernel(k: *const c_void, g: Dim3, b: Dim3, args: *mut *mut c_void, shm: usize, s: cudaStream_t);
        __cudaLaunchKernel_ptsz(k: *const c_void, g: Dim3, b: Dim3, args: *mut *mut c_void, shm: usize, s: cudaStream_t);
        cudaLaunchKernelExC(cfg: *const cudaLaunchConfig_t, f: *const c_void, args: *mut *mut c_void);
        cudaLaunchKernelExC_ptsz(cfg: *const cudaLaunchConfig_t, f: *const c_void, args: *mut *mut c_void);
    }
}

/// `cudaKernelNodeParams`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct cudaKernelNodeParams {
    func: *mut c_void,
    grid: Dim3,
    block: Dim3,
    shared: u32,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
}

fn translated_node(p: *const cudaKernelNodeParams) -> Option<(cudaKernelNodeParams, ArgBuffer)> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null pointer to the application's node parameters.
    let mut q = unsafe { p.read() };
    let mut buf = translate_args(
        registry::function(q.func as usize),
        q.kernel_params,
        device_sm,
    )?;
    q.kernel_params = buf.as_args();
    Some((q, buf))
}

fn graph_add_kernel_node_impl(
    i: usize,
    node: *mut c_void,
    graph: *mut c_void,
    deps: *const c_void,
    n: usize,
    p: *const cudaKernelNodeParams,
) -> cudaError_t {
    // The runtime copies the parameters when the node is made: the buffer may go after.
    let t = translated_node(p);
    let pp = t.as_ref().map_or(p, |(q, _)| q as *const _);
    forward!(
        i, cudaGraphAddKernelNode:
        fn(*mut c_void, *mut c_void, *const c_void, usize, *const cudaKernelNodeParams),
        node,
        graph,
        deps,
        n,
        pp
    )
}
variants!(graph_add_kernel_node_impl => cudaGraphAddKernelNode;
    (node: *mut c_void, graph: *mut c_void, deps: *const c_void, n: usize, p: *const cudaKernelNodeParams));

fn kernel_node_set_impl(
    i: usize,
    node: *mut c_void,
    p: *const cudaKernelNodeParams,
) -> cudaError_t {
    let t = translated_node(p);
    let pp = t.as_ref().map_or(p, |(q, _)| q as *const _);
    forward!(i, cudaGraphKernelNodeSetParams: fn(*mut c_void, *const cudaKernelNodeParams), node, pp)
}
variants!(kernel_node_set_impl => cudaGraphKernelNodeSetParams; (node: *mut c_void, p: *const cudaKernelNodeParams));

fn exec_kernel_node_set_impl(
    i: usize,
    exec: *mut c_void,
    node: *mut c_void,
    p: *const cudaKernelNodeParams,
) -> cudaError_t {
    let t = translated_node(p);
    let pp = t.as_ref().map_or(p, |(q, _)| q as *const _);
    forward!(
        i, cudaGraphExecKernelNodeSetParams:
        fn(*mut c_void, *mut c_void, *const cudaKernelNodeParams),
        exec,
        node,
        pp
    )
}
variants!(exec_kernel_node_set_impl => cudaGraphExecKernelNodeSetParams;
    (exec: *mut c_void, node: *mut c_void, p: *const cudaKernelNodeParams));

fn r(p: *const c_void) -> *const c_void {
    if translated() {
        to_real(p)
    } else {
        p
    }
}
fn rm(p: *mut c_void) -> *mut c_void {
    r(p) as *mut c_void
}

/// The copy and set forwarders: per entry the wrapper, the exports it serves, the copy it
/// records (`copy(kind, bytes, dst, src)`; a set records none) and its arguments, each
/// passed through the translation named after `=>` (`rm`/`r`: a device pointer; `pitched`:
/// a pitched pointer's) or as it is.
macro_rules! forwarders {
    ($(
        $imp:ident => $name:ident $(, $variant:ident)*;
        $(copy($k:expr, $n:expr, $d:ident, $s:ident);)?
        $(hosts($async:expr; $($hp:expr, $hl:expr),+);)?
        ($($a:ident : $t:ty $(=> $f:ident)?),*);
    )+) => {$(
        #[allow(clippy::too_many_arguments)]
        fn $imp(i: usize, $($a: $t),*) -> cudaError_t {
            // Host sides the call does not cut at smart pinning's borders.
            $($(pageable::unpin_crossing($hp as u64, $hl, $async);)+)?
            let run = || forward!(i, $name: fn($($t),*), $(translate!($a $(, $f)?)),*);
            copy_or_run!(run $(, $k, $n, $d, $s)?)
        }
        variants!($imp => $name $(, $variant)*; ($($a: $t),*));
    )+};
}

/// An argument of [`forwarders!`], translated or as it is.
macro_rules! translate {
    ($a:ident) => {
        $a
    };
    ($a:ident, $f:ident) => {
        $f($a)
    };
}

/// Runs a forwarder's call, recording its copy when it names one ([`tracing::copy`]).
macro_rules! copy_or_run {
    ($run:ident) => {
        $run()
    };
    ($run:ident, $k:expr, $n:expr, $d:ident, $s:ident) => {
        tracing::copy($k, $n, $d, $s, $run)
    };
}

/// A pitched pointer with its device pointer translated.
fn pitched(mut p: cudaPitchedPtr) -> cudaPitchedPtr {
    p.ptr = rm(p.ptr);
    p
}

// ---------------------------------------------------------------- copies with pageable memory

/// `cudaMemcpy[_ptds]`: a copy of at least `CUDAW_STAGED_COPY_MIN` bytes between cudaw's
/// device memory and pageable host memory goes through the pinned staging
/// ([`cudaw_engine::pageable`]); every other one, and any the staging declines, to the real
/// runtime (translated where needed). A smaller copy costs one compare more than before.
fn memcpy_impl(i: usize, d: *mut c_void, s: *const c_void, n: usize, k: i32) -> cudaError_t {
    let copy = |d: *mut c_void, s: *const c_void, n: usize| forward!(i, cudaMemcpy: fn(*mut c_void, *const c_void, usize, i32), rm(d), r(s), n, k);
    let run = || {
        if n >= pageable::considered_bytes() {
            let stream = default_stream(i == idx::cudaMemcpy_ptds);
            match staged(d, s, n, k, stream, false) {
                pageable::Outcome::Copied => return SUCCESS,
                pageable::Outcome::Split(cuts) => return in_pieces(cuts, d, s, n, copy),
                pageable::Outcome::Forward => {}
            }
        }
        forward_copy(d, s, n, copy)
    };
    tracing::copy(k, n, d, s, run)
}
variants!(memcpy_impl => cudaMemcpy, cudaMemcpy_ptds; (d: *mut c_void, s: *const c_void, n: usize, k: i32));

/// `cudaMemcpyAsync[_ptsz]`: as [`memcpy_impl`], on the program's stream.
fn memcpy_async_impl(
    i: usize,
    d: *mut c_void,
    s: *const c_void,
    n: usize,
    k: i32,
    st: cudaStream_t,
) -> cudaError_t {
    let copy = |d: *mut c_void, s: *const c_void, n: usize| {
        forward!(
            i, cudaMemcpyAsync:
            fn(*mut c_void, *const c_void, usize, i32, cudaStream_t),
            rm(d),
            r(s),
            n,
            k,
            st
        )
    };
    // The runtime's name of the copy's stream (`cudaStreamPerThread` for the per-thread
    // default stream of a `_ptsz` call), to wait for it.
    let sync = if st.is_null() && i == idx::cudaMemcpyAsync_ptsz {
        driver::Stream::PER_THREAD.0 as cudaStream_t
    } else {
        st
    };
    let run = || {
        if n >= pageable::considered_bytes() {
            let stream = if st.is_null() {
                default_stream(i == idx::cudaMemcpyAsync_ptsz)
            } else {
                driver::Stream(st as usize)
            };
            match staged(d, s, n, k, stream, true) {
                pageable::Outcome::Copied => return SUCCESS,
                pageable::Outcome::Split(cuts) => {
                    return as_pageable(d, s, n, sync, || in_pieces(cuts, d, s, n, copy))
                }
                pageable::Outcome::Forward => {}
            }
        }
        as_pageable(d, s, n, sync, || forward_copy(d, s, n, copy))
    };
    tracing::copy(k, n, d, s, run)
}
variants!(memcpy_async_impl => cudaMemcpyAsync, cudaMemcpyAsync_ptsz;
    (d: *mut c_void, s: *const c_void, n: usize, k: i32, st: cudaStream_t));

/// An asynchronous copy handed to the real runtime (`forward`) as the pageable one the
/// program made: where its host side touches a range smart pinning page-locked, the
/// driver would copy it truly asynchronously, where pageable memory promises the source
/// read (to the device) or the result there (to the host) when the call returns. So the
/// call waits for its stream after the copy; on a stream being captured into a graph
/// (which cannot be waited for) the range is unpinned first instead. Relaxed loads while
/// nothing pinned is near.
fn as_pageable(
    d: *mut c_void,
    s: *const c_void,
    n: usize,
    st: cudaStream_t,
    forward: impl FnOnce() -> cudaError_t,
) -> cudaError_t {
    let touched: Vec<u64> = [d as u64, s as u64]
        .into_iter()
        .filter(|&host| n > 0 && cudaw_engine::pinning::touching(host, n))
        .collect();
    if touched.is_empty() {
        return forward();
    }
    if capturing(st) {
        for host in touched {
            cudaw_engine::pinning::release(host, n as u64, true);
        }
        return forward();
    }
    let rc = forward();
    if rc != SUCCESS {
        return rc;
    }
    call_real!(cudaStreamSynchronize: fn(cudaStream_t) -> cudaError_t, st)
}

/// A copy cudaw does not take, handed to the real runtime: whole, or in pieces where its
/// host side crosses a border of smart pinning's registrations.
fn forward_copy(
    d: *mut c_void,
    s: *const c_void,
    n: usize,
    copy: impl Fn(*mut c_void, *const c_void, usize) -> cudaError_t,
) -> cudaError_t {
    match pageable::forward_cuts(d as u64, s as u64, n) {
        Some(cuts) => in_pieces(cuts, d, s, n, copy),
        None => copy(d, s, n),
    }
}

/// A copy handed to the real runtime in pieces (one per registration of cudaw's its host
/// side spans, or per side of a registration's border), in order; the first failure is
/// returned.
fn in_pieces(
    cuts: pageable::Cuts,
    d: *mut c_void,
    s: *const c_void,
    n: usize,
    copy: impl Fn(*mut c_void, *const c_void, usize) -> cudaError_t,
) -> cudaError_t {
    for (off, len) in cuts.pieces(n as u64) {
        let (off, len) = (off as usize, len as usize);
        let rc = copy(d.wrapping_byte_add(off), s.wrapping_byte_add(off), len);
        if rc != SUCCESS {
            return rc;
        }
    }
    SUCCESS
}

/// The driver's name for a default stream: the thread's own (`_ptds` / `_ptsz` exports,
/// which programs built with `--default-stream per-thread` call) or the legacy one.
fn default_stream(per_thread: bool) -> driver::Stream {
    if per_thread {
        driver::Stream::PER_THREAD
    } else {
        driver::Stream::LEGACY
    }
}

/// Copies through the pinned staging when [`cudaw_engine::pageable`] takes the copy: what
/// became of it (else the real runtime is to copy it, and perhaps to be waited for).
fn staged(
    d: *mut c_void,
    s: *const c_void,
    n: usize,
    k: i32,
    stream: driver::Stream,
    asynchronous: bool,
) -> pageable::Outcome {
    let req = pageable::Request {
        dst: d as u64,
        src: s as u64,
        len: n,
        kind: k,
        stream,
        asynchronous,
    };
    // A stream being captured gets no event of cudaw's (it would become a graph node): the
    // runtime's answer, for the runtime's name of the stream (its default streams' handles
    // are the driver's, `cudaStreamLegacy` and `cudaStreamPerThread`).
    let may_order = || {
        let mut status: i32 = 0;
        let h = stream.0 as cudaStream_t;
        let rc = call_real!(cudaStreamIsCapturing: fn(cudaStream_t, *mut i32) -> cudaError_t, h, &mut status);
        rc == SUCCESS && status == 0
    };
    // SAFETY: the program's own arguments to a runtime copy, whose contract makes the host
    // side valid for `n` bytes during the call.
    unsafe { pageable::copy(req, may_order) }
}

forwarders! {
    memset_impl => cudaMemset, cudaMemset_ptds;
        (d: *mut c_void => rm, v: i32, n: usize);
    memset_async_impl => cudaMemsetAsync, cudaMemsetAsync_ptsz;
        (d: *mut c_void => rm, v: i32, n: usize, st: cudaStream_t);
    memcpy_2d_impl => cudaMemcpy2D, cudaMemcpy2D_ptds; copy(k, w.saturating_mul(h), d, s);
        hosts(false; s, pageable::extent_2d(sp, w, h), d, pageable::extent_2d(dp, w, h));
        (d: *mut c_void => rm, dp: usize, s: *const c_void => r, sp: usize, w: usize, h: usize, k: i32);
    memcpy_2d_async_impl => cudaMemcpy2DAsync, cudaMemcpy2DAsync_ptsz;
        copy(k, w.saturating_mul(h), d, s);
        hosts(true; s, pageable::extent_2d(sp, w, h), d, pageable::extent_2d(dp, w, h));
        (d: *mut c_void => rm, dp: usize, s: *const c_void => r, sp: usize, w: usize, h: usize, k: i32,
         st: cudaStream_t);
    memset_2d_impl => cudaMemset2D, cudaMemset2D_ptds;
        (d: *mut c_void => rm, p: usize, v: i32, w: usize, h: usize);
    memset_2d_async_impl => cudaMemset2DAsync, cudaMemset2DAsync_ptsz;
        (d: *mut c_void => rm, p: usize, v: i32, w: usize, h: usize, st: cudaStream_t);
    memset_3d_impl => cudaMemset3D, cudaMemset3D_ptds;
        (p: cudaPitchedPtr => pitched, v: i32, e: cudaExtent);
    memset_3d_async_impl => cudaMemset3DAsync, cudaMemset3DAsync_ptsz;
        (p: cudaPitchedPtr => pitched, v: i32, e: cudaExtent, st: cudaStream_t);
    memcpy_peer_impl => cudaMemcpyPeer; copy(MEMCPY_DEVICE_TO_DEVICE, n, d, s);
        (d: *mut c_void => rm, dd: i32, s: *const c_void => r, sd: i32, n: usize);
    memcpy_peer_async_impl => cudaMemcpyPeerAsync; copy(MEMCPY_DEVICE_TO_DEVICE, n, d, s);
        (d: *mut c_void => rm, dd: i32, s: *const c_void => r, sd: i32, n: usize, st: cudaStream_t);
    to_symbol_impl => cudaMemcpyToSymbol, cudaMemcpyToSymbol_ptds; hosts(false; s, n);
        (sym: *const c_void, s: *const c_void => r, n: usize, off: usize, k: i32);
    from_symbol_impl => cudaMemcpyFromSymbol, cudaMemcpyFromSymbol_ptds; hosts(false; d, n);
        (d: *mut c_void => rm, sym: *const c_void, n: usize, off: usize, k: i32);
    to_symbol_async_impl => cudaMemcpyToSymbolAsync, cudaMemcpyToSymbolAsync_ptsz;
        hosts(true; s, n);
        (sym: *const c_void, s: *const c_void => r, n: usize, off: usize, k: i32, st: cudaStream_t);
    from_symbol_async_impl => cudaMemcpyFromSymbolAsync, cudaMemcpyFromSymbolAsync_ptsz;
        hosts(true; d, n);
        (d: *mut c_void => rm, sym: *const c_void, n: usize, off: usize, k: i32, st: cudaStream_t);
}

fn translated_3d(p: *const cudaMemcpy3DParms) -> Option<cudaMemcpy3DParms> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null pointer to the application's copy parameters.
    let mut q = unsafe { p.read() };
    q.src_ptr.ptr = rm(q.src_ptr.ptr);
    q.dst_ptr.ptr = rm(q.dst_ptr.ptr);
    Some(q)
}

/// The bytes a 3D copy's linear side spans, from its pointer's start to the last byte it
/// touches (0 for an array side, or an empty copy).
fn extent_3d(side: &cudaPitchedPtr, pos: &cudaPos, e: &cudaExtent) -> usize {
    if side.ptr.is_null() || e.width == 0 || e.height == 0 || e.depth == 0 {
        return 0;
    }
    let rows = (pos.z.saturating_add(e.depth - 1))
        .saturating_mul(side.ysize)
        .saturating_add(pos.y.saturating_add(e.height - 1));
    rows.saturating_mul(side.pitch)
        .saturating_add(pos.x.saturating_add(e.width))
}

/// Before a 3D copy: its linear sides' registrations of smart pinning unpinned where the
/// driver would not see the pageable memory the program copies ([`pageable::unpin_crossing`]).
fn unpin_3d(p: *const cudaMemcpy3DParms, asynchronous: bool) {
    if p.is_null() {
        return;
    }
    // SAFETY: non-null pointer to the application's copy parameters.
    let q = unsafe { p.read() };
    for (side, pos) in [(&q.src_ptr, &q.src_pos), (&q.dst_ptr, &q.dst_pos)] {
        let len = extent_3d(side, pos, &q.extent);
        pageable::unpin_crossing(side.ptr as u64, len, asynchronous);
    }
}

fn memcpy_3d_impl(i: usize, p: *const cudaMemcpy3DParms) -> cudaError_t {
    unpin_3d(p, false);
    let q = translated_3d(p);
    let pp = q.as_ref().map_or(p, |q| q as *const _);
    forward!(i, cudaMemcpy3D: fn(*const cudaMemcpy3DParms), pp)
}
variants!(memcpy_3d_impl => cudaMemcpy3D, cudaMemcpy3D_ptds; (p: *const cudaMemcpy3DParms));

fn memcpy_3d_async_impl(i: usize, p: *const cudaMemcpy3DParms, st: cudaStream_t) -> cudaError_t {
    unpin_3d(p, true);
    let q = translated_3d(p);
    let pp = q.as_ref().map_or(p, |q| q as *const _);
    forward!(i, cudaMemcpy3DAsync: fn(*const cudaMemcpy3DParms, cudaStream_t), pp, st)
}
variants!(memcpy_3d_async_impl => cudaMemcpy3DAsync, cudaMemcpy3DAsync_ptsz; (p: *const cudaMemcpy3DParms, st: cudaStream_t));

fn pointer_attributes_impl(
    i: usize,
    out: *mut cudaPointerAttributes,
    p: *const c_void,
) -> cudaError_t {
    let rp = r(p);
    let rc = forward!(i, cudaPointerGetAttributes: fn(*mut cudaPointerAttributes, *const c_void), out, rp);
    if rc == SUCCESS && rp != p && !out.is_null() {
        // The application sees its own (virtual) pointer.
        // SAFETY: the real runtime filled the application's non-null out-pointer.
        unsafe { (*out).device_pointer = p as *mut c_void };
    }
    rc
}
variants!(pointer_attributes_impl => cudaPointerGetAttributes; (out: *mut cudaPointerAttributes, p: *const c_void));

// ---------------------------------------------------------------- inter-process handles

/// `cudaIpcGetMemHandle`: forwarded as it is. cudaw's memory cannot be shared through
/// legacy IPC (mapped addressing: `cuMemCreate` memory, which legacy IPC refuses;
/// translated: a pointer the driver does not know, and a backing that other allocations
/// may share, so an importer would see the wrong base): the real runtime's refusal goes
/// back to the program, and the log says why, once (PyTorch's `torch.multiprocessing`
/// sharing of CUDA tensors takes this path).
fn ipc_get_mem_handle_impl(i: usize, handle: *mut c_void, dev_ptr: *mut c_void) -> cudaError_t {
    let rc = forward!(i, cudaIpcGetMemHandle: fn(*mut c_void, *mut c_void), handle, dev_ptr);
    if rc != SUCCESS && memory::lookup(dev_ptr as u64).is_some() {
        static TOLD: std::sync::Once = std::sync::Once::new();
        TOLD.call_once(|| {
            log::warn(format_args!(
                "cudaIpcGetMemHandle({dev_ptr:p}) failed ({rc}): the memory cudaw hands out cannot be shared with another process through legacy CUDA IPC (sharing CUDA tensors with torch.multiprocessing, for one); such a program must run without cudaw for now"
            ))
        });
    }
    rc
}
variants!(ipc_get_mem_handle_impl => cudaIpcGetMemHandle; (handle: *mut c_void, dev_ptr: *mut c_void));

/// The one list of wrapped calls, `exports/wrapped.txt`, as `build.rs` writes it: per group
/// (`always`, `launch`, `traced`, `timed`) the indices and `(index, wrapper)` pairs.
pub mod list {
    use crate::dispatch::idx;
    include!(concat!(env!("OUT_DIR"), "/wrapped.rs"));
}

/// Sets tracing up (once; [`tracing::init`]) with the list's `timed` group.
pub fn init_tracing() {
    tracing::init(&list::TIMED);
}

/// `cudaw_trace_active_v1(on)`: a program's own switch ([`tracing::set_active`]): `on` non-zero
/// switches tracing on, zero off. Returns whether it was on before (1 or 0), or -1 where
/// tracing cannot be switched (the process started without `CUDAW_TRACE`). Found with
/// `dlsym` in the process's libcudart; benchmarks use it to time the same work traced and
/// untraced in one process.
#[no_mangle]
pub extern "C" fn cudaw_trace_active_v1(on: i32) -> i32 {
    crate::boundary::guard("switching tracing", -1, || {
        match tracing::set_active(on != 0, switch_launch_entries) {
            Ok(was) => i32::from(was),
            Err(e) => {
                // Once: a program may ask in a loop.
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| log::warn(format_args!("{e}")));
                -1
            }
        }
    })
}

/// The names cudaw replaces, and with what, for this configuration.
pub fn table() -> Vec<(usize, usize)> {
    let mut v = list::always_wrappers().to_vec();
    v.extend(launch_entries(translated() || tracing::enabled()));
    v
}

/// The names wrapped only to translate their arguments or to trace them: with neither,
/// they go to the real runtime, except the launches, which go to their thin wrappers that
/// mark them in flight ([`marked_launches`]; their trampolines leave it to the wrappers:
/// build.rs) — or to the real runtime too once the driver layer is seen to mark them
/// ([`crate::launch_bypass`]).
fn launch_entries(wrapped: bool) -> Vec<(usize, usize)> {
    let mut v: Vec<(usize, usize)> = if wrapped {
        list::launch_wrappers().to_vec()
    } else {
        marked_launches::table().to_vec()
    };
    // The launches seen to reach the driver layer need no wrapper of this library untraced,
    // nor under `metrics`, which leaves them to that layer.
    if !wrapped || tracing::driver_layer_counts_launches() {
        for (i, f) in &mut v {
            if crate::launch_bypass::reaches_driver_layer(*i) {
                *f = crate::dispatch::real_or_stub(*i);
            }
        }
    }
    if wrapped {
        v.extend(list::traced_wrappers());
    } else {
        v.extend(
            list::TRACED
                .into_iter()
                .map(|i| (i, crate::dispatch::real_or_stub(i))),
        );
    }
    v
}

/// Points the launch entries at the wrappers tracing needs (`traced`) or at what runs
/// untraced: [`tracing::set_active`] switches tracing on and off in a running
/// process. With translated addressing the wrappers stay (they translate).
pub(crate) fn switch_launch_entries(traced: bool) {
    if translated() {
        return;
    }
    for (i, f) in launch_entries(traced) {
        crate::dispatch::DISPATCH.set(i, f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_3d_copy_spans_to_its_last_byte() {
        let side = cudaPitchedPtr {
            ptr: 0x1000 as *mut c_void,
            pitch: 512,
            xsize: 500,
            ysize: 10,
        };
        let at = |x, y, z| cudaPos { x, y, z };
        let e = |width, height, depth| cudaExtent {
            width,
            height,
            depth,
        };
        assert_eq!(extent_3d(&side, &at(0, 0, 0), &e(100, 1, 1)), 100);
        assert_eq!(extent_3d(&side, &at(0, 0, 0), &e(100, 3, 1)), 2 * 512 + 100);
        assert_eq!(
            extent_3d(&side, &at(4, 1, 0), &e(100, 2, 2)),
            (10 + 2) * 512 + 104
        );
        assert_eq!(extent_3d(&side, &at(0, 0, 0), &e(0, 3, 1)), 0);
        let none = cudaPitchedPtr {
            ptr: std::ptr::null_mut(),
            ..side
        };
        assert_eq!(extent_3d(&none, &at(0, 0, 0), &e(100, 3, 1)), 0);
    }
}

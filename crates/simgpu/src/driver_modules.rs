//! The driver's module and launch API, and `cuGetProcAddress`, for programs (and libraries
//! such as Triton) that load kernels and launch them through the driver: a module is any
//! image with a fatbin, ELF or PTX header (the bytes are not run: kernels are host
//! functions looked up by name); a function is a kernel simgpu has a host implementation
//! of; a launch enqueues it as the runtime's launches do.
//!
//! # Safety
//!
//! Every export has the contract of the driver function it is named after (see
//! [`crate::driver_api`]).
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // the module's Safety section covers every export

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use crate::driver_api::{boundary, CUresult, Handle};
use crate::error::{CuError, CuResult};
use crate::kernels;
use crate::runtime::{self, Dim3};

/// Loaded modules: handle → the kernel functions made from it (handle → name).
#[derive(Default)]
struct Modules {
    modules: HashMap<u64, Vec<u64>>,
    functions: HashMap<u64, &'static str>,
}

static MODULES: LazyLock<Mutex<Modules>> = LazyLock::new(Default::default);
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(0x5100_0000);

fn modules() -> std::sync::MutexGuard<'static, Modules> {
    MODULES.lock().unwrap_or_else(|e| e.into_inner())
}

fn new_handle() -> u64 {
    NEXT_HANDLE.fetch_add(0x10, Ordering::Relaxed)
}

/// Whether `image` starts like a module the driver would load: a fatbin (magic
/// `0xba55ed50`), an ELF cubin, or PTX text.
///
/// # Safety
/// `image` points to at least 4 readable bytes.
unsafe fn looks_like_module(image: *const c_void) -> bool {
    // SAFETY: the caller's image holds at least a header.
    let head = unsafe { std::slice::from_raw_parts(image.cast::<u8>(), 4) };
    head == [0x50, 0xed, 0x55, 0xba] || head == b"\x7fELF" || head[0] == b'/' || head[0] == b'.'
}

fn load(out: *mut Handle, image: *const c_void) -> CuResult<()> {
    crate::device::Device::with_context()?;
    if out.is_null() || image.is_null() {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's image (the driver's contract).
    if !unsafe { looks_like_module(image) } {
        return Err(CuError::CUDA_ERROR_INVALID_IMAGE);
    }
    let h = new_handle();
    modules().modules.insert(h, Vec::new());
    // SAFETY: checked non-null; the caller's out-pointer.
    unsafe { out.write(h as Handle) };
    Ok(())
}

/// `cuModuleLoadData`.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(out: *mut Handle, image: *const c_void) -> CUresult {
    boundary(|| load(out, image))
}

/// `cuModuleLoadDataEx`: the JIT options are accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    out: *mut Handle,
    image: *const c_void,
    _n: c_uint,
    _options: *mut c_void,
    _values: *mut *mut c_void,
) -> CUresult {
    boundary(|| load(out, image))
}

/// `cuModuleUnload`: its functions become invalid handles.
#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(module: Handle) -> CUresult {
    boundary(|| {
        let mut m = modules();
        let functions = m
            .modules
            .remove(&(module as u64))
            .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?;
        for f in functions {
            m.functions.remove(&f);
        }
        Ok(())
    })
}

/// `cuModuleGetFunction`: `CUDA_ERROR_NOT_FOUND` for a kernel simgpu cannot run.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    out: *mut Handle,
    module: Handle,
    name: *const c_char,
) -> CUresult {
    boundary(|| {
        if out.is_null() || name.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated name from the caller.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let kernel = kernels::find(&name).ok_or(CuError::CUDA_ERROR_NOT_FOUND)?;
        let mut m = modules();
        let h = new_handle();
        m.modules
            .get_mut(&(module as u64))
            .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?
            .push(h);
        m.functions.insert(h, kernel.name);
        // SAFETY: checked non-null; the caller's out-pointer.
        unsafe { out.write(h as Handle) };
        Ok(())
    })
}

/// The function handle simgpu's runtime launches kernel `name` by when it goes through the
/// driver ([`crate::runtime_api`]'s launches, as the real runtime's do): one per name,
/// belonging to no module.
pub(crate) fn runtime_function_handle(name: &'static str) -> u64 {
    static HANDLES: LazyLock<Mutex<HashMap<&'static str, u64>>> = LazyLock::new(Default::default);
    let mut handles = HANDLES.lock().unwrap_or_else(|e| e.into_inner());
    *handles.entry(name).or_insert_with(|| {
        let h = new_handle();
        modules().functions.insert(h, name);
        h
    })
}

/// Every kernel's name, NUL-terminated, for `cuFuncGetName`.
static C_NAMES: LazyLock<HashMap<&'static str, std::ffi::CString>> = LazyLock::new(|| {
    kernels::KERNELS
        .iter()
        .filter_map(|k| Some((k.name, std::ffi::CString::new(k.name).ok()?)))
        .collect()
});

fn function_name(f: Handle) -> CuResult<&'static str> {
    modules()
        .functions
        .get(&(f as u64))
        .copied()
        .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)
}

/// `cuFuncGetName`: the kernel's mangled name.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetName(name: *mut *const c_char, f: Handle) -> CUresult {
    boundary(|| {
        if name.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let n = function_name(f)?;
        let c = C_NAMES.get(n).ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?;
        // SAFETY: checked non-null; the names live as long as the process.
        unsafe { name.write(c.as_ptr()) };
        Ok(())
    })
}

/// `cuLaunchKernel`: `extra` is not supported (null expected).
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    boundary(|| {
        crate::device::Device::with_context()?;
        if !extra.is_null() {
            return Err(CuError::CUDA_ERROR_NOT_SUPPORTED);
        }
        let name = function_name(f)?;
        let function = runtime::Function {
            name: Arc::from(name),
            fatbin: 0,
        };
        let grid = Dim3 {
            x: gx,
            y: gy,
            z: gz,
        };
        let block = Dim3 {
            x: bx,
            y: by,
            z: bz,
        };
        // SAFETY: the launch's contract: one valid pointer per kernel parameter.
        let r = unsafe {
            crate::runtime_api::launch(function, grid, block, params, shared as usize, stream)
        };
        r.map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)
    })
}

/// `cuLaunchKernel_ptsz` (simgpu's per-thread stream is its NULL stream).
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) }
}

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
const PER_THREAD_DEFAULT_STREAM: u64 = 2;
/// `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`.
const SYMBOL_NOT_FOUND: c_int = 1;

/// simgpu's export for the driver function `name` asked at some version: the newest
/// symbol of the name simgpu has (`NAME_v2`, then `NAME`), its `_ptsz`/`_ptds` form
/// first when the flags ask for the per-thread stream.
fn proc_address(name: &str, flags: u64) -> Option<usize> {
    let mut candidates = Vec::new();
    if flags & PER_THREAD_DEFAULT_STREAM != 0 {
        for suffix in ["_v2_ptds", "_v2_ptsz", "_ptds", "_ptsz"] {
            candidates.push(format!("{name}{suffix}"));
        }
    }
    candidates.push(format!("{name}_v2"));
    candidates.push(name.to_owned());
    candidates
        .into_iter()
        .find_map(|c| crate::os::own_symbol(&c))
}

/// `cuGetProcAddress_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    _version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    boundary(|| {
        if symbol.is_null() || pfn.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated name from the caller.
        let name = unsafe { CStr::from_ptr(symbol) }.to_string_lossy();
        let found = proc_address(&name, flags);
        // SAFETY: checked non-null; `status` may be null.
        unsafe {
            pfn.write(found.unwrap_or(0) as *mut c_void);
            if !status.is_null() {
                status.write(if found.is_some() { 0 } else { SYMBOL_NOT_FOUND });
            }
        }
        found.map(|_| ()).ok_or(CuError::CUDA_ERROR_NOT_FOUND)
    })
}

/// `cuGetProcAddress` (CUDA 11.3's, without the status).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuGetProcAddress_v2(symbol, pfn, version, flags, std::ptr::null_mut()) }
}

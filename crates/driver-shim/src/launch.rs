//! The wrappers of launches and of the calls that load modules and make kernel handles:
//! launches are counted per kernel ([`crate::counts`]), marked in flight and traced
//! ([`crate::trace::launch`]); handles are named at `cuModuleGetFunction`,
//! `cuLibraryGetKernel` and `cuKernelGetFunction`, and keyed to their module's layouts
//! ([`crate::modules`]); unloading forgets both.

#![allow(non_snake_case)]

use crate::boundary::{guard, CUDA_ERROR_UNKNOWN};
use crate::counts::{forget_module, record};
use driver::launch_args::Dims;
use std::ffi::{c_char, c_uint, c_void, CStr};

type Handle = *mut c_void;

/// Defines a wrapper that runs `$before`, then forwards every argument to the real
/// driver's function of the same name.
macro_rules! observed {
    ($name:ident ($($a:ident : $t:ty),* $(,)?) => $before:expr) => {
        pub(crate) extern "C" fn $name($($a: $t),*) -> u32 {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                $before;
                crate::forward!($name: fn($($t),*) $(, $a)*)
            })
        }
    };
}

/// Defines a launch wrapper: counts the launch, then forwards it marked in flight
/// ([`crate::inflight::marked`]: its trampoline is the plain kind, `build.rs`), traced
/// when tracing is on ([`crate::trace::launch`]: one predictable branch on a cached flag
/// when it is off). `$dims` gives the launch's [`Dims`] (an `Option`, read
/// only when the launch is recorded), `$params` and `$extra` its arguments.
macro_rules! launch {
    ($name:ident ($($a:ident : $t:ty),* $(,)?) => $f:ident, $dims:expr, $params:expr, $extra:expr) => {
        pub(crate) extern "C" fn $name($($a: $t),*) -> u32 {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                crate::trace::launch($f as usize, || $dims, $params, $extra, || {
                    crate::inflight::marked(|| crate::forward!($name: fn($($t),*) $(, $a)*))
                })
            })
        }
    };
}

/// The dimensions of a `cuLaunchKernelEx` launch (`None` for a null config).
fn config_dims(config: *const c_void) -> Option<Dims> {
    // SAFETY: the caller's `CUlaunchConfig` (or null), read in its launch's wrapper.
    unsafe { driver::launch_args::dims_of_config(config) }
}

/// The dimensions of a launch given as arguments.
fn dims(grid: [c_uint; 3], block: [c_uint; 3], shared: c_uint, stream: Handle) -> Option<Dims> {
    Some(Dims {
        grid,
        block,
        shared,
        stream,
    })
}

launch!(cuLaunchKernel(f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint,
    bz: c_uint, shared: c_uint, stream: Handle, params: *mut Handle, extra: *mut Handle)
    => f, dims([gx, gy, gz], [bx, by, bz], shared, stream), params, extra);
launch!(cuLaunchKernel_ptsz(f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint,
    by: c_uint, bz: c_uint, shared: c_uint, stream: Handle, params: *mut Handle,
    extra: *mut Handle) => f, dims([gx, gy, gz], [bx, by, bz], shared, stream), params, extra);
launch!(cuLaunchKernelEx(config: *const c_void, f: Handle, params: *mut Handle,
    extra: *mut Handle) => f, config_dims(config), params, extra);
launch!(cuLaunchKernelEx_ptsz(config: *const c_void, f: Handle, params: *mut Handle,
    extra: *mut Handle) => f, config_dims(config), params, extra);
launch!(cuLaunchCooperativeKernel(f: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint,
    by: c_uint, bz: c_uint, shared: c_uint, stream: Handle, params: *mut Handle)
    => f, dims([gx, gy, gz], [bx, by, bz], shared, stream), params, std::ptr::null_mut());
launch!(cuLaunchCooperativeKernel_ptsz(f: Handle, gx: c_uint, gy: c_uint, gz: c_uint,
    bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: Handle, params: *mut Handle)
    => f, dims([gx, gy, gz], [bx, by, bz], shared, stream), params, std::ptr::null_mut());
observed!(cuGraphLaunch(exec: Handle, stream: Handle)
    => crate::counts::graph_launched());
observed!(cuGraphLaunch_ptsz(exec: Handle, stream: Handle)
    => crate::counts::graph_launched());

/// Defines a wrapper that forwards, then on success runs `$after`.
macro_rules! then {
    ($name:ident ($($a:ident : $t:ty),* $(,)?) => $after:expr) => {
        pub(crate) extern "C" fn $name($($a: $t),*) -> u32 {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let rc = crate::forward!($name: fn($($t),*) $(, $a)*);
                if rc == 0 {
                    $after;
                }
                rc
            })
        }
    };
}

/// Records the handle the driver wrote through `out` under the name at `name`.
fn record_out(out: *mut usize, name: *const c_char, module: usize) {
    if out.is_null() || name.is_null() {
        return;
    }
    // SAFETY: the driver just wrote the handle through the caller's out-pointer, and the
    // caller's name is NUL-terminated (the call succeeded with it).
    let (h, n) = unsafe { (out.read(), CStr::from_ptr(name)) };
    let n = n.to_string_lossy();
    record(h, &n, module);
    crate::modules::handle_made(h, module, &n);
}

then!(cuModuleGetFunction(out: *mut usize, module: usize, name: *const c_char)
    => record_out(out, name, module));
then!(cuLibraryGetKernel(out: *mut usize, library: usize, name: *const c_char)
    => record_out(out, name, library));
then!(cuKernelGetFunction(out: *mut usize, kernel: usize) => {
    if !out.is_null() {
        // SAFETY: the driver just wrote the function through the caller's out-pointer.
        let f = unsafe { out.read() };
        crate::modules::function_of_kernel(f, kernel);
        let name = crate::counts::name_of(kernel);
        if let Some(name) = name {
            record(f, &name, 0);
        }
    }
});
then!(cuModuleUnload(module: usize) => {
    forget_module(module);
    crate::modules::unloaded(module);
});
then!(cuLibraryUnload(library: usize) => {
    forget_module(library);
    crate::modules::unloaded(library);
});

fn loaded() {
    crate::counts::module_loaded();
}

then!(cuModuleLoad(out: *mut usize, file: *const c_char) => {
    loaded();
    crate::modules::loaded_file(out, file);
});
then!(cuModuleLoadData(out: *mut usize, image: *const c_void) => {
    loaded();
    crate::modules::loaded_image(out, image);
});
then!(cuModuleLoadDataEx(out: *mut usize, image: *const c_void, n: c_uint,
    options: *mut c_void, values: *mut Handle) => {
    loaded();
    crate::modules::loaded_image(out, image);
});
then!(cuModuleLoadFatBinary(out: *mut usize, image: *const c_void) => {
    loaded();
    crate::modules::loaded_image(out, image);
});
then!(cuLibraryLoadData(out: *mut usize, code: *const c_void, jit_options: *mut c_void,
    jit_values: *mut Handle, jit_n: c_uint, options: *mut c_void, values: *mut Handle,
    n: c_uint) => {
    loaded();
    crate::modules::loaded_image(out, code);
});
then!(cuLibraryLoadFromFile(out: *mut usize, file: *const c_char, jit_options: *mut c_void,
    jit_values: *mut Handle, jit_n: c_uint, options: *mut c_void, values: *mut Handle,
    n: c_uint) => {
    loaded();
    crate::modules::loaded_file(out, file);
});

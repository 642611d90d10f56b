//! The real driver: found once (`driver::locate::candidates`), loaded `RTLD_LOCAL` by its
//! path, never this library (a candidate exporting this library's marker,
//! `cudaw_driver_shim_real_path`, is refused whatever its name or inode).

use cudaw_shim_core::real::{self, LoadError, RealLibrary, Search};
use driver::hooks::DRIVER_SHIM_REAL_PATH_SYMBOL;
use std::ffi::c_char;
use std::sync::OnceLock;

/// What the real driver is: `libcuda.so.1` exporting `cuInit`, and not this library.
const SEARCH: Search<'static> = Search {
    soname: "libcuda.so.1",
    variable: "CUDAW_REAL_LIBCUDA",
    probe: (c"cuInit", "not a CUDA driver"),
    marker: Some((DRIVER_SHIM_REAL_PATH_SYMBOL, "cudaw's driver shim")),
};

static FOUND: OnceLock<Result<RealLibrary, LoadError>> = OnceLock::new();

/// The real driver, loaded on first use; why none could be, when none was found.
pub fn get() -> Result<&'static RealLibrary, &'static LoadError> {
    FOUND
        .get_or_init(|| real::load(&SEARCH, driver::locate::candidates()))
        .as_ref()
}

/// The real driver's path, for cudaw's own driver calls (`driver::LibCuda`): null when
/// there is none. The marker other libraries recognise this library by.
#[no_mangle]
pub extern "C" fn cudaw_driver_shim_real_path() -> *const c_char {
    crate::boundary::guard("cudaw_driver_shim_real_path", std::ptr::null(), || {
        get().map_or(std::ptr::null(), |r| r.c_path().as_ptr())
    })
}

//! The real driver: found once (`driver::locate::candidates`), loaded `RTLD_LOCAL` by its
//! path, never this library (a candidate exporting this library's marker,
//! `cudaw_driver_shim_real_path`, is refused whatever its name or inode).

use driver::hooks::DRIVER_SHIM_REAL_PATH_SYMBOL;
use std::ffi::{c_char, c_void, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::sync::OnceLock;

/// The loaded real driver.
pub struct RealDriver {
    handle: usize,
    path: CString,
}

impl RealDriver {
    /// The address of `name` in the real driver, if it exports it.
    pub fn symbol(&self, name: &str) -> Option<usize> {
        let c = CString::new(name).ok()?;
        // SAFETY: dlsym reads the loader's tables for a handle dlopen returned, never
        // closed (the real driver stays loaded for the life of the process).
        let p = unsafe { libc::dlsym(self.handle as *mut c_void, c.as_ptr()) } as usize;
        (p != 0).then_some(p)
    }

    /// Where it was loaded from.
    pub fn path(&self) -> String {
        self.path.to_string_lossy().into_owned()
    }
}

struct Found {
    real: Option<RealDriver>,
    tried: Vec<String>,
}

static FOUND: OnceLock<Found> = OnceLock::new();

fn find() -> Found {
    let mut tried = Vec::new();
    for path in driver::locate::candidates() {
        let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
            continue;
        };
        // SAFETY: loading the CUDA driver runs its initialisers, as any CUDA program does.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            tried.push(format!("{} (cannot load)", path.display()));
            continue;
        }
        let has = |sym: &CStr| {
            // SAFETY: a handle dlopen just returned; only the loader's tables are read.
            !unsafe { libc::dlsym(h, sym.as_ptr()) }.is_null()
        };
        if has(DRIVER_SHIM_REAL_PATH_SYMBOL) {
            tried.push(format!("{} (cudaw's driver shim)", path.display()));
            continue;
        }
        if !has(c"cuInit") {
            tried.push(format!("{} (not a CUDA driver)", path.display()));
            continue;
        }
        return Found {
            real: Some(RealDriver {
                handle: h as usize,
                path: c,
            }),
            tried,
        };
    }
    Found { real: None, tried }
}

/// The real driver, loaded on first use; `None` when none was found.
pub fn get() -> Option<&'static RealDriver> {
    FOUND.get_or_init(find).real.as_ref()
}

/// What was tried and refused, for the error message.
pub fn tried() -> String {
    let t = &FOUND.get_or_init(find).tried;
    if t.is_empty() {
        "nothing".into()
    } else {
        t.join(", ")
    }
}

/// The real driver's path, for cudaw's own driver calls (`driver::LibCuda`): null when
/// there is none. The marker other libraries recognise this library by.
#[no_mangle]
pub extern "C" fn cudaw_driver_shim_real_path() -> *const c_char {
    crate::boundary::guard("cudaw_driver_shim_real_path", std::ptr::null(), || {
        get().map_or(std::ptr::null(), |r| r.path.as_ptr())
    })
}

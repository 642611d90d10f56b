#![allow(non_snake_case)]

//! `cuGetProcAddress` (11.3's and 12.0's `_v2`): the real driver answers, then a pointer
//! that is one of the real driver's exports is replaced by this library's trampoline for
//! that export (which passes the gate and reaches cudaw's wrapper where there is one). The
//! real driver returns exactly the address of an export (checked on the H100's driver 580
//! for every one of its 477 names), so the map is by address and needs no version table;
//! a pointer that is no export (a function a newer driver has and this list lacks) passes
//! through untouched, as does the symbol-status out-parameter.

use crate::boundary::{guard, CUDA_ERROR_UNKNOWN};
use crate::dispatch::{self, ALL_NAMES, DISPATCH};
use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

/// (real driver's address, index), sorted by address.
static BY_ADDRESS: OnceLock<Vec<(usize, usize)>> = OnceLock::new();

/// Indexes the real driver's exports by address (after the dispatch table is filled).
pub fn index_real_exports() {
    BY_ADDRESS.get_or_init(|| {
        let mut v: Vec<(usize, usize)> = (0..ALL_NAMES.len())
            .filter_map(|i| match DISPATCH.real_now(i) {
                0 => None,
                p => Some((p, i)),
            })
            .collect();
        v.sort_unstable();
        v
    });
}

/// This library's function standing for the real driver's function at `real`, if `real`
/// is one of its exports.
pub fn ours_for(real: usize) -> Option<usize> {
    let v = BY_ADDRESS.get()?;
    let k = v.binary_search_by_key(&real, |&(a, _)| a).ok()?;
    Some(dispatch::trampoline(v[k].1))
}

/// Replaces the real pointer the driver wrote through `pfn` by ours.
///
/// # Safety
/// `pfn` is null or valid for reads and writes of a pointer.
unsafe fn substitute(pfn: *mut *mut c_void) {
    if pfn.is_null() {
        return;
    }
    // SAFETY: the caller's out-pointer, which the real driver just wrote.
    let got = unsafe { pfn.read() } as usize;
    if let Some(ours) = ours_for(got) {
        // SAFETY: as above.
        unsafe { pfn.write(ours as *mut c_void) };
    }
}

pub(crate) extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> u32 {
    guard("cuGetProcAddress", CUDA_ERROR_UNKNOWN, || {
        let rc = crate::forward!(
            cuGetProcAddress: fn(*const c_char, *mut *mut c_void, c_int, u64),
            symbol,
            pfn,
            version,
            flags
        );
        if rc == 0 {
            // SAFETY: the caller's out-pointer, as the API requires.
            unsafe { substitute(pfn) };
        }
        rc
    })
}

pub(crate) extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> u32 {
    guard("cuGetProcAddress_v2", CUDA_ERROR_UNKNOWN, || {
        let rc = crate::forward!(
            cuGetProcAddress_v2: fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int),
            symbol,
            pfn,
            version,
            flags,
            status
        );
        if rc == 0 {
            // SAFETY: the caller's out-pointer, as the API requires.
            unsafe { substitute(pfn) };
        }
        rc
    })
}

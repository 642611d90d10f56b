//! The driver API's copies (`cuMemcpyHtoD*`, `cuMemcpyDtoH*`, `cuMemcpyDtoD*`, `cuMemcpy`,
//! `cuMemcpyAsync` and their per-thread forms: `data/wrapped.txt`'s `copies` group), wrapped
//! while tracing records them (`crate::trace::copy`) or smart pinning (`CUDAW_PIN`) is on.
//!
//! Smart pinning (the runtime shim's, `crates/engine/src/pinning.rs`) page-locks in place
//! pageable buffers the program copies often. That changes what the driver does with a
//! copy the program made of pageable memory:
//!
//! - a copy whose host side starts inside a registration and runs past it is refused
//!   (`CUDA_ERROR_INVALID_VALUE`, seen on an H200: the driver checks the registration's
//!   exact bytes), where natively it copies;
//! - an asynchronous copy touching a registration runs truly asynchronously, where the
//!   pageable memory the program passed promises the source read (to the device) or the
//!   bytes there (to the host) when the call returns.
//!
//! So a copy from a caller other than the runtime shim (which does the same for its own
//! copies before they reach this layer) asks the runtime shim
//! ([`driver::hooks::MemoryHooks::host_copy`]) about its host side: a synchronous one
//! crossing a border of the registrations is issued in pieces, each inside one registration
//! or outside all; an asynchronous one touching a registration waits for its stream before
//! it returns, or, on a stream being captured into a graph (which cannot be waited for),
//! has the registrations it touches given up first. With pinning off nothing is asked.

#![allow(non_snake_case)]

use crate::boundary::{guard, CUDA_ERROR_UNKNOWN};
use crate::trace::{DEFAULT, DTOD, DTOH, HTOD};
use cudaw_pin::Cuts;
use driver::hooks::{HOST_CUT, HOST_PINNED};
use std::ffi::c_void;
use std::sync::OnceLock;

type Stream = *mut c_void;

/// Whether the copies are wrapped: while tracing or smart pinning is on.
pub fn wanted() -> bool {
    crate::trace::on() || pinning_on()
}

/// Whether smart pinning is on in this process: `CUDAW_PIN` set to anything but `off`
/// (the runtime shim reads it, and refuses a bad value: then nothing is ever pinned and
/// every answer is "plain").
fn pinning_on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var("CUDAW_PIN").is_ok_and(|v| {
            let v = v.trim();
            !v.is_empty() && !v.eq_ignore_ascii_case("off")
        })
    })
}

/// What smart pinning says of a copy's host side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// Nothing of it touches the copy: as the program made it.
    Plain,
    /// A synchronous copy crossing a border: in pieces.
    Cut(Cuts),
    /// An asynchronous copy touching a registration.
    Pinned,
}

/// Asks the runtime shim about each of `hosts` (the copy's possible host sides, `len`
/// bytes from each); nothing where the caller is the runtime shim itself or pinning is off.
fn side(hosts: &[u64], len: usize, asynchronous: bool) -> Side {
    if !pinning_on() || len == 0 || crate::runtime::runtime_accounts() {
        return Side::Plain;
    }
    let Some(m) = crate::runtime::memory() else {
        return Side::Plain;
    };
    for &host in hosts.iter().filter(|&&h| h != 0) {
        let mut cuts = [0u64; 2];
        match (m.host_copy)(host, len as u64, asynchronous, &mut cuts) {
            HOST_CUT if !asynchronous => return Side::Cut(Cuts::from_offsets(cuts)),
            HOST_PINNED if asynchronous => return Side::Pinned,
            _ => {}
        }
    }
    Side::Plain
}

/// Runs a copy of `n` bytes from `src` to `dst` (`issue(dst, src, n)` forwards it), as
/// the module documentation says; `stream`: an asynchronous copy's stream, and whether the
/// call is a `_ptsz` form.
fn run(
    direction: i32,
    n: usize,
    (dst, src): (u64, u64),
    hosts: &[u64],
    stream: Option<(Stream, bool)>,
    issue: impl Fn(u64, u64, usize) -> u32,
) -> u32 {
    let side = side(hosts, n, stream.is_some());
    crate::trace::copy(direction, n, dst, src, || match side {
        Side::Plain => issue(dst, src, n),
        Side::Cut(cuts) => {
            for (off, len) in cuts.pieces(n as u64) {
                let rc = issue(dst.wrapping_add(off), src.wrapping_add(off), len as usize);
                if rc != 0 {
                    return rc;
                }
            }
            0
        }
        Side::Pinned => {
            let (s, ptsz) = stream.unwrap_or((std::ptr::null_mut(), false));
            if crate::memory::capturing(s, ptsz) {
                if let Some(m) = crate::runtime::memory() {
                    for &host in hosts.iter().filter(|&&h| h != 0) {
                        (m.host_register)(host, n as u64);
                    }
                }
                return issue(dst, src, n);
            }
            match issue(dst, src, n) {
                0 if ptsz => crate::forward!(cuStreamSynchronize_ptsz: fn(Stream), s),
                0 => crate::forward!(cuStreamSynchronize: fn(Stream), s),
                rc => rc,
            }
        }
    })
}

/// The stream type of a wrapper's optional stream argument.
macro_rules! stream_ty {
    ($s:ident) => {
        Stream
    };
}

/// A wrapper's stream argument, if it has one.
macro_rules! stream_arg {
    () => {
        None
    };
    ($s:ident) => {
        Some($s)
    };
}

/// Defines a copy wrapper: its arguments (the destination, the source, the bytes, and for
/// an asynchronous copy the stream), the direction, the arguments that may be host memory,
/// and whether it is a `_ptsz` form (its null stream the thread's own).
macro_rules! copy_wrapper {
    ($name:ident ($dst:ident : $dt:ty, $src:ident : $st:ty, $n:ident : usize $(, $s:ident : Stream)?)
        => $dir:expr, hosts [$($host:ident),*], ptsz $ptsz:literal) => {
        #[allow(clippy::unnecessary_cast)]
        pub(crate) extern "C" fn $name($dst: $dt, $src: $st, $n: usize $(, $s: Stream)?) -> u32 {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                let issue = |d: u64, s: u64, len: usize| {
                    crate::forward!($name: fn($dt, $st, usize $(, stream_ty!($s))?), d as $dt, s as $st, len $(, $s)?)
                };
                let stream: Option<Stream> = stream_arg!($($s)?);
                run($dir, $n, ($dst as u64, $src as u64), &[$($host as u64),*], stream.map(|s| (s, $ptsz)), issue)
            })
        }
    };
}

copy_wrapper!(cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize) => HTOD, hosts [src], ptsz false);
copy_wrapper!(cuMemcpyHtoD_v2_ptds(dst: u64, src: *const c_void, n: usize) => HTOD, hosts [src], ptsz false);
copy_wrapper!(cuMemcpyHtoDAsync_v2(dst: u64, src: *const c_void, n: usize, s: Stream)
    => HTOD, hosts [src], ptsz false);
copy_wrapper!(cuMemcpyHtoDAsync_v2_ptsz(dst: u64, src: *const c_void, n: usize, s: Stream)
    => HTOD, hosts [src], ptsz true);
copy_wrapper!(cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize) => DTOH, hosts [dst], ptsz false);
copy_wrapper!(cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: u64, n: usize) => DTOH, hosts [dst], ptsz false);
copy_wrapper!(cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, n: usize, s: Stream)
    => DTOH, hosts [dst], ptsz false);
copy_wrapper!(cuMemcpyDtoHAsync_v2_ptsz(dst: *mut c_void, src: u64, n: usize, s: Stream)
    => DTOH, hosts [dst], ptsz true);
copy_wrapper!(cuMemcpyDtoD_v2(dst: u64, src: u64, n: usize) => DTOD, hosts [], ptsz false);
copy_wrapper!(cuMemcpyDtoD_v2_ptds(dst: u64, src: u64, n: usize) => DTOD, hosts [], ptsz false);
copy_wrapper!(cuMemcpyDtoDAsync_v2(dst: u64, src: u64, n: usize, s: Stream)
    => DTOD, hosts [], ptsz false);
copy_wrapper!(cuMemcpyDtoDAsync_v2_ptsz(dst: u64, src: u64, n: usize, s: Stream)
    => DTOD, hosts [], ptsz true);
// Unified addressing: either side may be host memory (a device pointer is never near a
// registration of host memory: the answer for it is "plain").
copy_wrapper!(cuMemcpy(dst: u64, src: u64, n: usize) => DEFAULT, hosts [dst, src], ptsz false);
copy_wrapper!(cuMemcpy_ptds(dst: u64, src: u64, n: usize) => DEFAULT, hosts [dst, src], ptsz false);
copy_wrapper!(cuMemcpyAsync(dst: u64, src: u64, n: usize, s: Stream)
    => DEFAULT, hosts [dst, src], ptsz false);
copy_wrapper!(cuMemcpyAsync_ptsz(dst: u64, src: u64, n: usize, s: Stream)
    => DEFAULT, hosts [dst, src], ptsz true);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_asked_of_a_process_without_pinning() {
        // The test process has no CUDAW_PIN and no runtime shim.
        assert_eq!(side(&[0x1000], 1 << 20, false), Side::Plain);
        assert_eq!(side(&[0x1000], 1 << 20, true), Side::Plain);
        assert_eq!(side(&[], 0, true), Side::Plain);
    }
}

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
//! ([`driver::hooks::MemoryHooks::host_copy`]) about its host side: one crossing a border
//! of the registrations is issued in pieces, each inside one registration or outside all;
//! an asynchronous one touching a registration waits for its stream before it returns,
//! or, on a stream being captured into a graph (which cannot be waited for), has the
//! registrations it touches given up first. With pinning off nothing is asked.
//!
//! 2D copies (`cuMemcpy2D*`) cannot be cut (their rows are the caller's): the
//! registrations they cross a border of (synchronous) or touch (asynchronous) are given up
//! first, as the runtime shim does for `cudaMemcpy2D`.
//!
//! Not covered: a synchronous copy crossing the border of a range the runtime shim is
//! unregistering at that moment (forgotten by its history, still registered with the
//! driver) is not cut (an asynchronous one touching it waits for its stream); the
//! driver's 3D, array and batch copies are not wrapped.

#![allow(non_snake_case)]

use crate::boundary::{guard, CUDA_ERROR_UNKNOWN};
use crate::trace::{DEFAULT, DTOD, DTOH, HTOD};
use cudaw_pin::Cuts;
use driver::hooks::{HOST_CUT, HOST_PINNED, HOST_PLAIN};
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

/// Asks the runtime shim about each of `hosts` (the copy's possible host sides) moved on
/// by `off`, `len` bytes from there: its flags ([`HOST_CUT`], [`HOST_PINNED`]) and, where
/// it crosses a border, the first cut. Nothing where the caller is the runtime shim
/// itself or pinning is off.
fn ask(hosts: &[u64], off: u64, len: usize, asynchronous: bool) -> (u32, Option<u64>) {
    if !pinning_on() || len == 0 || crate::runtime::runtime_accounts() {
        return (HOST_PLAIN, None);
    }
    let Some(m) = crate::runtime::memory() else {
        return (HOST_PLAIN, None);
    };
    let mut flags = HOST_PLAIN;
    let mut first = None;
    for &host in hosts.iter().filter(|&&h| h != 0) {
        let mut cuts = [0u64; 2];
        let f = (m.host_copy)(host.wrapping_add(off), len as u64, asynchronous, &mut cuts);
        flags |= f;
        if f & HOST_CUT != 0 && first.is_none() {
            first = Cuts::from_offsets(cuts)
                .pieces(len as u64)
                .next()
                .map(|(_, l)| l)
                .filter(|&l| l < len as u64);
        }
    }
    (flags, first)
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
    let asynchronous = stream.is_some();
    let (flags, first) = ask(hosts, 0, n, asynchronous);
    crate::trace::copy(direction, n, dst, src, || {
        if flags == HOST_PLAIN {
            return issue(dst, src, n);
        }
        let (s, ptsz) = stream.unwrap_or((std::ptr::null_mut(), false));
        if flags & HOST_PINNED != 0 && crate::memory::capturing(s, ptsz) {
            // Captured into a graph (which cannot be waited for): as the pageable memory
            // it was, every registration of cudaw's it touches given up first.
            if let Some(m) = crate::runtime::memory() {
                for &host in hosts.iter().filter(|&&h| h != 0) {
                    (m.host_register)(host, n as u64);
                }
            }
            return issue(dst, src, n);
        }
        // In pieces, each inside one registration or outside all: the borders are asked
        // for again past each piece (a copy may cross more than the two a query gives).
        let (mut off, mut next) = (0u64, first);
        while off < n as u64 {
            let len = next.unwrap_or(n as u64 - off);
            let rc = issue(dst.wrapping_add(off), src.wrapping_add(off), len as usize);
            if rc != 0 {
                return rc;
            }
            off += len;
            next = if off < n as u64 {
                ask(hosts, off, (n as u64 - off) as usize, asynchronous).1
            } else {
                None
            };
        }
        match (flags & HOST_PINNED != 0, ptsz) {
            (false, _) => 0,
            (true, true) => crate::forward!(cuStreamSynchronize_ptsz: fn(Stream), s),
            (true, false) => crate::forward!(cuStreamSynchronize: fn(Stream), s),
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

/// cuda.h's `CUDA_MEMCPY2D` (the fields a host side needs are read).
#[repr(C)]
struct Memcpy2D {
    src_x_in_bytes: usize,
    src_y: usize,
    src_memory_type: u32,
    src_host: u64,
    src_device: u64,
    src_array: u64,
    src_pitch: usize,
    dst_x_in_bytes: usize,
    dst_y: usize,
    dst_memory_type: u32,
    dst_host: u64,
    dst_device: u64,
    dst_array: u64,
    dst_pitch: usize,
    width_in_bytes: usize,
    height: usize,
}

/// `CU_MEMORYTYPE_HOST` and `CU_MEMORYTYPE_UNIFIED` (whose pointer may be host memory).
const MEMORYTYPE_HOST: u32 = 1;
const MEMORYTYPE_UNIFIED: u32 = 4;

impl Memcpy2D {
    /// Its sides that may be host memory: (first byte, bytes from there to the last row's
    /// end).
    fn host_sides(&self) -> Vec<(u64, usize)> {
        let (w, h) = (self.width_in_bytes, self.height);
        if w == 0 || h == 0 {
            return Vec::new();
        }
        let side = |ty: u32, host: u64, dev: u64, x: usize, y: usize, pitch: usize| {
            let base = match ty {
                MEMORYTYPE_HOST => host,
                MEMORYTYPE_UNIFIED => dev,
                _ => return None,
            };
            let at = y.checked_mul(pitch)?.checked_add(x)?;
            let extent = pitch.max(w).checked_mul(h - 1)?.checked_add(w)?;
            Some((base.checked_add(at as u64)?, extent))
        };
        [
            side(
                self.src_memory_type,
                self.src_host,
                self.src_device,
                self.src_x_in_bytes,
                self.src_y,
                self.src_pitch,
            ),
            side(
                self.dst_memory_type,
                self.dst_host,
                self.dst_device,
                self.dst_x_in_bytes,
                self.dst_y,
                self.dst_pitch,
            ),
        ]
        .into_iter()
        .flatten()
        .filter(|&(host, _)| host != 0)
        .collect()
    }
}

/// A 2D copy (`cuMemcpy2D*`), which cannot be cut at a border (its rows are the caller's):
/// as the runtime shim does for `cudaMemcpy2D`, the registrations of smart pinning its host
/// side crosses a border of (synchronous) or touches (asynchronous) are given up first, so
/// that the driver sees the pageable memory the program passed.
fn copy_2d(p: *const c_void, asynchronous: bool, issue: impl FnOnce() -> u32) -> u32 {
    if p.is_null() || !pinning_on() || crate::runtime::runtime_accounts() {
        return issue();
    }
    // SAFETY: the caller's CUDA_MEMCPY2D, valid for the call (the driver API's contract);
    // only read.
    let m = unsafe { &*p.cast::<Memcpy2D>() };
    let sides = m.host_sides();
    if let Some(hooks) = crate::runtime::memory() {
        for (host, len) in sides {
            if ask(&[host], 0, len, asynchronous).0 & (HOST_CUT | HOST_PINNED) != 0 {
                (hooks.host_register)(host, len as u64);
            }
        }
    }
    issue()
}

/// Defines a 2D copy wrapper: its arguments, and whether it is asynchronous.
macro_rules! copy_2d_wrapper {
    ($name:ident (p: *const c_void $(, $s:ident : Stream)?) => asynchronous $a:literal) => {
        pub(crate) extern "C" fn $name(p: *const c_void $(, $s: Stream)?) -> u32 {
            guard(stringify!($name), CUDA_ERROR_UNKNOWN, || {
                copy_2d(p, $a, || {
                    crate::forward!($name: fn(*const c_void $(, stream_ty!($s))?), p $(, $s)?)
                })
            })
        }
    };
}

copy_2d_wrapper!(cuMemcpy2D_v2(p: *const c_void) => asynchronous false);
copy_2d_wrapper!(cuMemcpy2D_v2_ptds(p: *const c_void) => asynchronous false);
copy_2d_wrapper!(cuMemcpy2DUnaligned_v2(p: *const c_void) => asynchronous false);
copy_2d_wrapper!(cuMemcpy2DUnaligned_v2_ptds(p: *const c_void) => asynchronous false);
copy_2d_wrapper!(cuMemcpy2DAsync_v2(p: *const c_void, s: Stream) => asynchronous true);
copy_2d_wrapper!(cuMemcpy2DAsync_v2_ptsz(p: *const c_void, s: Stream) => asynchronous true);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_asked_of_a_process_without_pinning() {
        // The test process has no CUDAW_PIN and no runtime shim.
        assert_eq!(ask(&[0x1000], 0, 1 << 20, false), (HOST_PLAIN, None));
        assert_eq!(ask(&[0x1000], 4096, 1 << 20, true), (HOST_PLAIN, None));
        assert_eq!(ask(&[], 0, 0, true), (HOST_PLAIN, None));
    }

    #[test]
    fn a_2d_copys_host_sides_span_its_rows() {
        let m = Memcpy2D {
            src_x_in_bytes: 16,
            src_y: 2,
            src_memory_type: MEMORYTYPE_HOST,
            src_host: 0x10000,
            src_device: 0,
            src_array: 0,
            src_pitch: 4096,
            dst_x_in_bytes: 0,
            dst_y: 0,
            dst_memory_type: 2,
            dst_host: 0,
            dst_device: 0x7000_0000,
            dst_array: 0,
            dst_pitch: 1024,
            width_in_bytes: 1000,
            height: 3,
        };
        // From row 2, byte 16 of the source; three rows 4096 apart; the device side none.
        assert_eq!(m.host_sides(), [(0x10000 + 2 * 4096 + 16, 2 * 4096 + 1000)]);
        let unified = Memcpy2D {
            dst_memory_type: MEMORYTYPE_UNIFIED,
            ..m
        };
        assert_eq!(unified.host_sides().len(), 2);
        assert!(Memcpy2D { height: 0, ..m }.host_sides().is_empty());
        let huge = Memcpy2D {
            src_pitch: usize::MAX,
            ..m
        };
        assert!(
            huge.host_sides().is_empty(),
            "an overflowing extent is no side"
        );
    }
}

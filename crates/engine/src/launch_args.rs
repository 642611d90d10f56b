//! A launch's kernel arguments rewritten for translated addressing: every pointer-sized
//! word of a parameter whose value is a translated pointer, replaced by the real one, in
//! storage of its own ([`translate_args`]).

use crate::memory::{to_real, translated};
use crate::registry;
use std::ffi::c_void;

/// Kernel arguments rewritten for the real runtime: translated pointers in their own
/// storage, `ptrs[i]` pointing at parameter `i`.
pub struct ArgBuffer {
    _storage: Vec<u64>,
    ptrs: Vec<*mut c_void>,
}

impl ArgBuffer {
    /// The argument array to pass the real runtime.
    pub fn as_args(&mut self) -> *mut *mut c_void {
        self.ptrs.as_mut_ptr()
    }
}

/// Rewrites the arguments of a launch of `rec`: every 8-byte-aligned 8-byte word of a
/// parameter whose value is a translated pointer. `None`: nothing to rewrite (or no layout).
/// `sm` gives the device's SM number for the kernel's parameter layout (asked only when
/// there is something to look at).
pub fn translate_args(
    rec: Option<&registry::FunctionRecord>,
    args: *mut *mut c_void,
    sm: fn() -> u32,
) -> Option<ArgBuffer> {
    if !translated() {
        return None;
    }
    let rec = rec?;
    if args.is_null() {
        return None;
    }
    let layout = rec.layout(sm())?;
    let n = layout
        .params
        .iter()
        .map(|p| p.ordinal as usize + 1)
        .max()
        .unwrap_or(0);
    // SAFETY: the launch passes one argument pointer per kernel parameter.
    let src: &[*mut c_void] = unsafe { std::slice::from_raw_parts(args, n) };
    let total = layout
        .params
        .iter()
        .map(|p| p.offset as usize + p.size as usize)
        .max()
        .unwrap_or(0);
    let mut storage: Option<Vec<u64>> = None;
    for p in &layout.params {
        let base = src[p.ordinal as usize] as *const u8;
        if base.is_null() {
            continue;
        }
        let off = p.offset as usize;
        for w in p.aligned_words() {
            // SAFETY: `base` points at this parameter's `size` bytes (the launch's contract).
            let v = unsafe { (base.add(w) as *const u64).read_unaligned() };
            let t = to_real(v as *const c_void) as u64;
            if t != v {
                let buf = storage.get_or_insert_with(|| {
                    let mut s = vec![0u64; total.div_ceil(8)];
                    let bytes = s.as_mut_ptr() as *mut u8;
                    for q in &layout.params {
                        let qb = src[q.ordinal as usize] as *const u8;
                        if !qb.is_null() {
                            // SAFETY: copying each parameter's bytes into its slot of a
                            // buffer sized for the whole parameter block.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    qb,
                                    bytes.add(q.offset as usize),
                                    q.size as usize,
                                )
                            };
                        }
                    }
                    s
                });
                let bytes = buf.as_mut_ptr() as *mut u8;
                // SAFETY: `off + w + 8 <= total`, and `off + w` is 8-aligned in the buffer.
                unsafe { (bytes.add(off + w) as *mut u64).write(t) };
            }
        }
    }
    let mut storage = storage?;
    let bytes = storage.as_mut_ptr() as *mut u8;
    let mut ptrs = src.to_vec();
    for p in &layout.params {
        // SAFETY: within the buffer (offset < total).
        ptrs[p.ordinal as usize] = unsafe { bytes.add(p.offset as usize) } as *mut c_void;
    }
    Some(ArgBuffer {
        _storage: storage,
        ptrs,
    })
}

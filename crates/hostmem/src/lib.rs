//! `libcudaw_hostmem.so`: cudaw's host-memory interposer, first in `LD_PRELOAD` when smart
//! pinning is on (`CUDAW_PIN`, `cudaw run`).
//!
//! cudaw page-locks pageable host ranges that a program copies often
//! (`cuMemHostRegister`, `crates/engine/src/pinning.rs`). Such a range must be
//! unregistered before the program gives its memory back, or the driver keeps the old
//! pages locked (and, were the address mapped again, would copy from pages that are no
//! longer the program's). This library defines `free`, `realloc`, `munmap`, `mremap` and
//! `madvise` for the whole process: each tells the runtime shim what is about to go
//! (through the function the shim handed over with [`cudaw_hostmem_pinned_v1`], which
//! unregisters what cudaw pinned there) and then calls the next definition
//! (`dlsym(RTLD_NEXT)`: glibc's, or an allocator preloaded after this library).
//!
//! While nothing is pinned (the shim says how many ranges are, through
//! [`cudaw_hostmem_pinned_v1`]) each call costs one relaxed load more. The size of a
//! block being freed is the allocator's own `malloc_usable_size`. Nothing here allocates:
//! these run inside every `free` of the process.
//!
//! **Start.** The next definitions are looked up in this library's constructor and, for a
//! call that comes earlier, on first use. `dlsym` may itself free memory (glibc keeps
//! per-thread error state); a `free` that arrives while this library is still looking
//! `free` up leaks its block (a few bytes, once) rather than call an allocator that may
//! not own it.

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// Ranges the shim has pinned (0: every call goes straight through).
static PINNED: AtomicU64 = AtomicU64::new(0);
/// The shim's `void release(uint64_t ptr, uint64_t len, uint32_t pages)`, handed over with
/// the count (never looked up here: `dlsym` inside `free` could free, and recurse).
static RELEASE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// The shim tells how many ranges it has pinned now, and what to call when memory goes.
#[no_mangle]
pub extern "C" fn cudaw_hostmem_pinned_v1(ranges: u64, release: extern "C" fn(u64, u64, u32)) {
    RELEASE.store(release as *mut c_void, Ordering::Release);
    PINNED.store(ranges, Ordering::Release);
}

/// Whether the process's `free` is this library's (another allocator preloaded before it
/// would take every `free`, and pinned memory given back would go unseen): 1 or 0.
#[no_mangle]
pub extern "C" fn cudaw_hostmem_owns_free_v1() -> c_int {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name has no preconditions.
    let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"free".as_ptr()) };
    c_int::from(std::ptr::eq(global as *const (), free as *const ()))
}

/// Tells the shim that `[ptr, ptr + len)` is about to be given back: `pages` 1 when the
/// pages themselves go, 0 for a heap block.
fn release(ptr: *mut c_void, len: u64, pages: u32) {
    if ptr.is_null() || len == 0 || PINNED.load(Ordering::Acquire) == 0 {
        return;
    }
    let f = RELEASE.load(Ordering::Acquire);
    if f.is_null() {
        return;
    }
    // SAFETY: `f` is the shim's `extern "C" fn(u64, u64, u32)`, handed over with the count
    // (it never unwinds); the shim is never unloaded (LD_PRELOAD).
    let f: extern "C" fn(u64, u64, u32) = unsafe { std::mem::transmute(f) };
    f(ptr as u64, len, pages);
}

/// One next definition, looked up once.
struct Next {
    name: &'static CStr,
    f: AtomicPtr<c_void>,
}

/// The thread looking a definition up now (0: none).
static LOOKING_UP: AtomicU64 = AtomicU64::new(0);

impl Next {
    const fn new(name: &'static CStr) -> Self {
        Next {
            name,
            f: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The next definition; null for a call from inside the lookup itself (on the thread
    /// doing it), or where none exists. Another thread waits for a lookup under way.
    fn get(&self) -> *mut c_void {
        loop {
            let f = self.f.load(Ordering::Acquire);
            if !f.is_null() {
                return f;
            }
            // SAFETY: pthread_self has no preconditions.
            let me = unsafe { libc::pthread_self() } as u64;
            match LOOKING_UP.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name has no
                    // preconditions.
                    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) };
                    self.f.store(f, Ordering::Release);
                    LOOKING_UP.store(0, Ordering::Release);
                    return f;
                }
                Err(owner) if owner == me => return std::ptr::null_mut(),
                // SAFETY: sched_yield has no preconditions.
                Err(_) => unsafe {
                    libc::sched_yield();
                },
            }
        }
    }
}

static FREE: Next = Next::new(c"free");
static REALLOC: Next = Next::new(c"realloc");
static USABLE: Next = Next::new(c"malloc_usable_size");
static MUNMAP: Next = Next::new(c"munmap");
static MREMAP: Next = Next::new(c"mremap");
static MADVISE: Next = Next::new(c"madvise");

/// Looks every next definition up while the process is still starting.
extern "C" fn look_up_all() {
    for n in [&FREE, &REALLOC, &USABLE, &MUNMAP, &MREMAP, &MADVISE] {
        n.get();
    }
}

#[used]
#[link_section = ".init_array"]
static LOOK_UP_AT_START: extern "C" fn() = look_up_all;

/// The usable size of a block the allocator handed out, or 0.
fn usable(ptr: *mut c_void) -> u64 {
    let f = USABLE.get();
    if f.is_null() {
        return 0;
    }
    // SAFETY: `f` is the allocator's `size_t malloc_usable_size(void*)`; `ptr` is a block
    // the program is giving back to that allocator (non-null).
    let f: unsafe extern "C" fn(*mut c_void) -> usize = unsafe { std::mem::transmute(f) };
    // SAFETY: as above.
    unsafe { f(ptr) as u64 }
}

/// `free`: what cudaw pinned in the block is unpinned first.
///
/// # Safety
/// `free`'s contract.
#[no_mangle]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    if PINNED.load(Ordering::Relaxed) != 0 {
        release(ptr, usable(ptr), 0);
    }
    let f = FREE.get();
    if f.is_null() {
        // Mid-lookup: leak this block (see the module documentation).
        return;
    }
    // SAFETY: `f` is the next `void free(void*)`; the caller's contract holds.
    let f: unsafe extern "C" fn(*mut c_void) = unsafe { std::mem::transmute(f) };
    // SAFETY: as above.
    unsafe { f(ptr) }
}

/// `realloc`: the old block may move or shrink, so what cudaw pinned in it is unpinned
/// first.
///
/// # Safety
/// `realloc`'s contract.
#[no_mangle]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    if !ptr.is_null() && PINNED.load(Ordering::Relaxed) != 0 {
        release(ptr, usable(ptr), 0);
    }
    let f = REALLOC.get();
    if f.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `f` is the next `void* realloc(void*, size_t)`; the caller's contract holds.
    let f: unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void =
        unsafe { std::mem::transmute(f) };
    // SAFETY: as above.
    unsafe { f(ptr, size) }
}

/// `munmap`.
///
/// # Safety
/// `munmap`'s contract.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    release(addr, len as u64, 1);
    let f = MUNMAP.get();
    if f.is_null() {
        // SAFETY: the raw system call, with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_munmap, addr, len) as c_int };
    }
    // SAFETY: `f` is the next `int munmap(void*, size_t)`; the caller's contract holds.
    let f: unsafe extern "C" fn(*mut c_void, usize) -> c_int = unsafe { std::mem::transmute(f) };
    // SAFETY: as above.
    unsafe { f(addr, len) }
}

/// `mremap` (its fifth argument, `new_address`, is read only with `MREMAP_FIXED`: on
/// Linux's x86-64 and AArch64 calling conventions a variadic argument is passed as a named
/// one would be).
///
/// # Safety
/// `mremap`'s contract.
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_address: *mut c_void,
) -> *mut c_void {
    release(old, old_len as u64, 1);
    let f = MREMAP.get();
    if f.is_null() {
        // SAFETY: the raw system call, with the caller's arguments.
        return unsafe {
            libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_address)
                as *mut c_void
        };
    }
    // SAFETY: `f` is the next `void* mremap(void*, size_t, size_t, int, ...)`, called with
    // the caller's arguments.
    let f: unsafe extern "C" fn(*mut c_void, usize, usize, c_int, ...) -> *mut c_void =
        unsafe { std::mem::transmute(f) };
    // SAFETY: as above.
    unsafe { f(old, old_len, new_len, flags, new_address) }
}

/// `madvise`: advice that drops the pages' contents unpins first.
///
/// # Safety
/// `madvise`'s contract.
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    // MADV_DONTNEED_LOCKED (24, Linux 5.18) is not in every libc crate.
    if matches!(
        advice,
        libc::MADV_DONTNEED | libc::MADV_FREE | libc::MADV_REMOVE | 24
    ) {
        release(addr, len as u64, 1);
    }
    let f = MADVISE.get();
    if f.is_null() {
        // SAFETY: the raw system call, with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) as c_int };
    }
    // SAFETY: `f` is the next `int madvise(void*, size_t, int)`; the caller's contract
    // holds.
    let f: unsafe extern "C" fn(*mut c_void, usize, c_int) -> c_int =
        unsafe { std::mem::transmute(f) };
    // SAFETY: as above.
    unsafe { f(addr, len, advice) }
}

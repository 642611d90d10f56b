//! The few system calls simgpu's memory model stands on: address reservations, a shared
//! memory file for physical memory, fixed mappings of it, protection changes.
//!
//! Every function that replaces mappings at a fixed address is `unsafe`: the caller promises
//! the range is one it owns (a reservation it made), so no other Rust object lives there.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// No access.
pub const PROT_NONE: i32 = libc::PROT_NONE;
/// Read only.
pub const PROT_READ: i32 = libc::PROT_READ;
/// Read and write.
pub const PROT_RW: i32 = libc::PROT_READ | libc::PROT_WRITE;

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reserves `size` bytes of inaccessible address space aligned to `align` (a power of
/// two), near `hint` when the kernel allows it.
pub fn reserve(size: u64, align: u64, hint: u64) -> io::Result<u64> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    if hint != 0 && hint.is_multiple_of(align) {
        // SAFETY: without MAP_FIXED the kernel treats `hint` as a hint and never replaces
        // existing mappings; the result is a fresh mapping nothing else references.
        let p = unsafe { libc::mmap(hint as *mut _, size as usize, PROT_NONE, flags, -1, 0) };
        if p != libc::MAP_FAILED {
            if p as u64 == hint {
                return Ok(hint);
            }
            // SAFETY: `p` is the mapping just made, of `size` bytes, referenced by nothing.
            unsafe { libc::munmap(p, size as usize) };
        }
    }
    let total = size.checked_add(align).ok_or(io::ErrorKind::InvalidInput)?;
    // SAFETY: a fresh anonymous PROT_NONE mapping at an address the kernel picks.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total as usize,
            PROT_NONE,
            flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let start = p as u64;
    let base = start.next_multiple_of(align);
    let head = base - start;
    let tail = total - head - size;
    if head > 0 {
        // SAFETY: the head slack lies inside the mapping just made and is not handed out.
        unsafe { libc::munmap(start as *mut _, head as usize) };
    }
    if tail > 0 {
        // SAFETY: the tail slack lies inside the mapping just made and is not handed out.
        unsafe { libc::munmap((base + size) as *mut _, tail as usize) };
    }
    Ok(base)
}

/// Returns `[addr, addr + size)` to the kernel.
///
/// # Safety
/// The range must be one the caller reserved and nothing may reference it any more.
pub unsafe fn release(addr: u64, size: u64) -> io::Result<()> {
    // SAFETY: the caller owns the range and nothing references it.
    check(unsafe { libc::munmap(addr as *mut _, size as usize) })
}

/// Replaces whatever is mapped at `[addr, addr + size)` by inaccessible address space.
///
/// # Safety
/// The range must lie inside a reservation the caller owns; no Rust reference may point
/// into it.
pub unsafe fn make_inaccessible(addr: u64, size: u64) -> io::Result<()> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED;
    // SAFETY: MAP_FIXED replaces only the caller's own range (its precondition).
    let p = unsafe { libc::mmap(addr as *mut _, size as usize, PROT_NONE, flags, -1, 0) };
    if p == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Maps `size` bytes of `file` from `offset` at `addr`, shared, inaccessible for now.
///
/// # Safety
/// As [`make_inaccessible`].
pub unsafe fn map_file(addr: u64, size: u64, file: &OwnedFd, offset: u64) -> io::Result<()> {
    let flags = libc::MAP_SHARED | libc::MAP_FIXED;
    // SAFETY: MAP_FIXED replaces only the caller's own range (its precondition); the file
    // descriptor is open for the duration of the call.
    let p = unsafe {
        libc::mmap(
            addr as *mut _,
            size as usize,
            PROT_NONE,
            flags,
            file.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Changes the protection of `[addr, addr + size)`.
///
/// # Safety
/// The range must be mapped by the caller; removing access must not invalidate Rust
/// references the caller holds into it.
pub unsafe fn protect(addr: u64, size: u64, prot: i32) -> io::Result<()> {
    // SAFETY: the caller owns the mapping (its precondition).
    check(unsafe { libc::mprotect(addr as *mut _, size as usize, prot) })
}

/// Creates an anonymous shared memory file of `size` bytes (sparse: pages are only
/// allocated when touched).
pub fn memfd(name: &str, size: u64) -> io::Result<OwnedFd> {
    let cname = std::ffi::CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: `cname` is a valid C string for the duration of the call.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let file = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain system call on a descriptor we own.
    check(unsafe { libc::ftruncate(file.as_raw_fd(), size as libc::off_t) })?;
    Ok(file)
}

/// Creates a sealed anonymous shared memory file of `size` bytes followed by `trailer`
/// (written at offset `size`): its length can never change afterwards (`F_SEAL_SHRINK`,
/// `F_SEAL_GROW`, `F_SEAL_SEAL`), so a mapping of it never faults for want of pages, in
/// this process or in one it is passed to.
pub fn sealed_memfd(name: &str, size: u64, trailer: &[u8]) -> io::Result<OwnedFd> {
    let cname = std::ffi::CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: `cname` is a valid C string for the duration of the call.
    let fd =
        unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let file = unsafe { OwnedFd::from_raw_fd(fd) };
    let total = size
        .checked_add(trailer.len() as u64)
        .ok_or(io::ErrorKind::InvalidInput)?;
    // SAFETY: plain system call on a descriptor we own.
    check(unsafe { libc::ftruncate(file.as_raw_fd(), total as libc::off_t) })?;
    let mut done = 0;
    while done < trailer.len() {
        // SAFETY: the source is `trailer[done..]`, valid for that many bytes.
        let n = unsafe {
            libc::pwrite(
                file.as_raw_fd(),
                trailer[done..].as_ptr().cast(),
                trailer.len() - done,
                (size + done as u64) as libc::off_t,
            )
        };
        if n <= 0 {
            return Err(io::Error::last_os_error());
        }
        done += n as usize;
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: plain system call on a descriptor we own.
    check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    Ok(file)
}

/// A new descriptor (close-on-exec) for the open file `fd` refers to: `EBADF` when `fd` is
/// not an open descriptor of this process.
pub fn dup_raw(fd: i32) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC only reads the descriptor table; a descriptor that is not
    // open fails with EBADF and nothing is created.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `new` is a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// What [`sealed_memfd`] made, as seen through any descriptor of it: its length, and
/// whether its length is sealed (`F_SEAL_SHRINK` and `F_SEAL_GROW`). `None` for a file
/// that is not a regular file or carries no seals (not a memory file).
pub fn sealed_len(file: &OwnedFd) -> io::Result<Option<u64>> {
    // SAFETY: `st` is a valid out-pointer; fstat only fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above, on a descriptor we own.
    check(unsafe { libc::fstat(file.as_raw_fd(), &mut st) })?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(None);
    }
    // SAFETY: plain system call on a descriptor we own.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    let needed = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    if seals < 0 || seals & needed != needed {
        return Ok(None);
    }
    Ok(Some(st.st_size as u64))
}

/// Reads `buf.len()` bytes of `file` at `offset`; fewer when the file ends first.
pub fn read_at(file: &OwnedFd, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: the destination is `buf[done..]`, valid for that many bytes.
        let n = unsafe {
            libc::pread(
                file.as_raw_fd(),
                buf[done..].as_mut_ptr().cast(),
                buf.len() - done,
                (offset + done as u64) as libc::off_t,
            )
        };
        match n {
            0 => break,
            n if n < 0 => return Err(io::Error::last_os_error()),
            n => done += n as usize,
        }
    }
    Ok(done)
}

/// Writes all of `buf` to `file` at `offset`.
pub fn write_at(file: &OwnedFd, buf: &[u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: the source is `buf[done..]`, valid for that many bytes.
        let n = unsafe {
            libc::pwrite(
                file.as_raw_fd(),
                buf[done..].as_ptr().cast(),
                buf.len() - done,
                (offset + done as u64) as libc::off_t,
            )
        };
        match n {
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "pwrite wrote nothing",
                ))
            }
            n => done += n as usize,
        }
    }
    Ok(())
}

/// Gives the pages of `[offset, offset + len)` of `file` back (they read as zero after).
pub fn punch_hole(file: &OwnedFd, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain system call on a descriptor we own; it changes file contents only.
    check(unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    })
}

/// Allocates `size` bytes of zeroed, readable and writable private memory.
pub fn alloc_rw(size: u64) -> io::Result<u64> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // SAFETY: a fresh anonymous mapping at an address the kernel picks.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), size as usize, PROT_RW, flags, -1, 0) };
    if p == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(p as u64)
    }
}

/// The address of this library's own export `name` (never another library's definition of
/// the same name, such as cudaw's driver shim's), looked up through the loader.
pub fn own_symbol(name: &str) -> Option<usize> {
    let c = std::ffi::CString::new(name).ok()?;
    let base = object_base(own_symbol as *const libc::c_void)?;
    // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-pointer.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::dladdr(own_symbol as *const libc::c_void, &mut info) } == 0
        || info.dli_fname.is_null()
    {
        return None;
    }
    // SAFETY: the name of an object already loaded (RTLD_NOLOAD loads nothing new); the
    // handle's reference is kept (this library is never unloaded while its code runs).
    let handle = unsafe { libc::dlopen(info.dli_fname, libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if handle.is_null() {
        return None;
    }
    // SAFETY: a valid handle and a NUL-terminated name; only the loader's tables are read.
    let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
    (!p.is_null() && object_base(p) == Some(base)).then_some(p as usize)
}

/// Whether `addr` lies in simgpu's own loaded object.
pub fn is_own(addr: usize) -> bool {
    let own = object_base(is_own as *const libc::c_void);
    own.is_some() && object_base(addr as *const libc::c_void) == own
}

/// The base address of the loaded object containing `addr`.
fn object_base(addr: *const libc::c_void) -> Option<usize> {
    // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-pointer.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    (unsafe { libc::dladdr(addr, &mut info) } != 0).then_some(info.dli_fbase as usize)
}

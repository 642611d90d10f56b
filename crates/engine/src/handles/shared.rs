//! Memory a process shares with the other processes of its job: `cuMem` handles exported
//! to a POSIX file descriptor, or imported from one (NCCL's buffers between the ranks of a
//! node). A single pause leaves them on the device (another process maps them); a job pause
//! that holds every process of the job can evict them too, and its resume brings them back
//! at the same addresses.
//!
//! 1. **Keeping the descriptors.** Each export's descriptor, and the one each import came
//!    from, is duplicated and kept ([`note_export`], [`Share::imported`]): an import and its
//!    export then hold one open file description between them.
//! 2. **Pairing.** The coordinator (`cudaw-ckpt --job`) collects every process's exports
//!    ([`exports`]: handle and descriptor number) and gives them to every process, which
//!    finds with `kcmp(2)` which export each of its imports came from ([`pair`]).
//! 3. **Eviction.** A job pause marks the exports whose every descriptor was paired, and the
//!    paired imports ([`mark`]): an import is unmapped and released (its bytes are the
//!    exporter's), an export is saved, unmapped and released as any handle, and the kept
//!    descriptors closed, so that the device memory is freed.
//! 4. **Back.** While every process is still paused, each exporter re-creates its exports at
//!    their addresses with their bytes and exports new descriptors ([`reexport`]); the
//!    coordinator passes them to the importers, which import and map them where the old
//!    ones were ([`reimport`]). Only then does the job resume; a resume with an import not
//!    back is refused ([`awaiting`]).

use super::*;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The most export descriptors kept per handle (a program that exports one handle again
/// and again keeps only the latest; an export whose earlier descriptors were dropped
/// pairs no more, and stays on the device).
const KEPT_PER_HANDLE: usize = 16;

/// `evict_shared` of the exports is under way: marked exports may be evicted.
static EVICTING_EXPORTS: AtomicBool = AtomicBool::new(false);

/// Whether marked exports may be evicted now.
pub(super) fn evicting_exports() -> bool {
    EVICTING_EXPORTS.load(Ordering::SeqCst)
}

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
pub const POSIX_FD: u32 = 1;

/// What a handle shares with other processes.
#[derive(Debug, Clone, Default)]
pub struct Share {
    /// Duplicates of its export descriptors, or of the descriptor it was imported from.
    pub fds: Vec<Arc<OwnedFd>>,
    /// An import: the export it came from (process, handle), once paired.
    pub peer: Option<(u32, u64)>,
    /// This pause evicts it with its job.
    pub evict: bool,
}

/// A duplicate of `fd` (close-on-exec), or `None` when it is not open.
fn dup(fd: RawFd) -> Option<OwnedFd> {
    if fd < 0 {
        return None;
    }
    // SAFETY: the descriptor is the caller's and stays open during the call; only
    // duplicated here.
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    b.try_clone_to_owned().ok()
}

impl Share {
    /// An import from `os` (the descriptor, for [`POSIX_FD`]).
    pub fn imported(kind: u32, os: *mut c_void) -> Share {
        Share {
            fds: (kind == POSIX_FD)
                .then(|| dup(os as usize as RawFd))
                .flatten()
                .map(Arc::new)
                .into_iter()
                .collect(),
            ..Share::default()
        }
    }
}

/// After a successful export of `v`: the descriptor written at `out` is kept (duplicated).
pub(super) fn note_export(t: &mut Table, v: u64, kind: u32, out: *mut c_void) {
    if kind != POSIX_FD || out.is_null() {
        return;
    }
    // SAFETY: the driver wrote an `int` descriptor at `out` (a POSIX-descriptor export).
    let fd = unsafe { out.cast::<i32>().read() };
    if let (Some(h), Some(d)) = (t.handles.get_mut(&v), dup(fd)) {
        if h.share.fds.len() >= KEPT_PER_HANDLE {
            h.share.fds.remove(0);
        }
        h.share.fds.push(Arc::new(d));
    }
}

/// Every export's kept descriptors: (handle, descriptor number in this process).
pub fn exports() -> Vec<(u64, i32)> {
    let t = TABLE.lock();
    t.handles
        .iter()
        .filter(|(_, h)| h.pinned == Some(EXPORTED) && h.real.is_some())
        .flat_map(|(&v, h)| h.share.fds.iter().map(move |f| (v, f.as_raw_fd())))
        .collect()
}

/// Whether `fd` here and `their` in process `pid` are one open file description; the
/// error when they cannot be compared (`kcmp` refused, or the process gone).
fn same_file(pid: u32, fd: RawFd, their: i32) -> Result<bool, std::io::Error> {
    const KCMP_FILE: libc::c_long = 0;
    // SAFETY: kcmp(2) compares two descriptors by number; it reads no memory of ours.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            libc::c_long::from(libc::getpid()),
            libc::c_long::from(pid as i32),
            KCMP_FILE,
            libc::c_long::from(fd),
            libc::c_long::from(their),
        )
    };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        // A descriptor number not open there: not this export.
        if e.raw_os_error() == Some(libc::EBADF) {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(r == 0)
}

/// Pairs every import with the export it came from, among `peers` (process, handle,
/// descriptor number there): (import, process, export, the export's descriptor matched)
/// for each import paired, and how many stayed unpaired. An import whose export is not
/// among them (another job's, or its exporter's descriptor closed) stays unpaired, and so
/// on the device. `Err` when descriptors cannot be compared (nothing is paired then).
#[allow(clippy::type_complexity)]
pub fn pair(peers: &[(u32, u64, i32)]) -> Result<(Vec<(u64, u32, u64, i32)>, usize), String> {
    let mut t = TABLE.lock();
    let mut out = Vec::new();
    let mut unpaired = 0;
    for (&v, h) in t.handles.iter_mut() {
        // An import evicted already (the job was paused before) is neither paired nor
        // from outside the job: its exporter brings it back.
        if h.pinned != Some(IMPORTED) || h.real.is_none() {
            continue;
        }
        let Some(fd) = h.share.fds.first().map(|f| f.as_raw_fd()) else {
            unpaired += 1;
            continue;
        };
        let mut found = None;
        for &(pid, ev, their) in peers {
            match same_file(pid, fd, their) {
                Ok(true) => {
                    found = Some((pid, ev, their));
                    break;
                }
                Ok(false) => {}
                Err(e) => {
                    return Err(format!(
                        "comparing descriptors with process {pid} (kcmp): {e} (a seccomp profile or a kernel without kcmp refuses it; the shared memory stays on the device)"
                    ))
                }
            }
        }
        h.share.peer = found.map(|(pid, ev, _)| (pid, ev));
        match found {
            Some((pid, ev, their)) => out.push((v, pid, ev, their)),
            None => unpaired += 1,
        }
    }
    Ok((out, unpaired))
}

/// Marks what `evict_shared` evicts: the exports `exports` (each paired with an import of
/// the job) and the imports `imports` (each paired, of a marked export). Replaces earlier
/// marks; empty lists clear them.
pub fn mark(exports: &[u64], imports: &[u64]) -> Result<(usize, usize), String> {
    let mut t = TABLE.lock();
    for h in t.handles.values_mut() {
        h.share.evict = false;
    }
    for v in exports {
        match t.handles.get_mut(v) {
            Some(h) if h.pinned == Some(EXPORTED) => h.share.evict = true,
            _ => return Err(format!("handle {v:#x} is no export of this process")),
        }
    }
    for v in imports {
        match t.handles.get_mut(v) {
            Some(h) if h.pinned == Some(IMPORTED) && h.share.peer.is_some() => h.share.evict = true,
            _ => return Err(format!("handle {v:#x} is no paired import of this process")),
        }
    }
    Ok((exports.len(), imports.len()))
}

/// Clears every mark.
pub fn clear_marks() {
    for h in TABLE.lock().handles.values_mut() {
        h.share.evict = false;
    }
}

/// Evicts, while paused, the marked imports (`imports`) or the marked exports: how many.
/// The exports' marks are cleared after, whatever the outcome. A failure leaves what was
/// evicted evicted (a job's resume brings it back) and the rest where it was.
pub fn evict_shared(imports: bool) -> Result<usize, String> {
    if imports {
        let mut t = TABLE.lock();
        return evict_imports(&mut t);
    }
    let marked = TABLE
        .lock()
        .handles
        .values()
        .filter(|h| h.pinned == Some(EXPORTED) && h.share.evict && h.real.is_some())
        .count();
    EVICTING_EXPORTS.store(true, Ordering::SeqCst);
    let r = evict(&mut |_| {});
    EVICTING_EXPORTS.store(false, Ordering::SeqCst);
    clear_marks();
    r.map(|_| marked)
}

/// Exports and imports evicted with their job and not yet back.
pub fn evicted() -> usize {
    TABLE
        .lock()
        .handles
        .values()
        .filter(|h| is_shared(h) && h.real.is_none())
        .count()
}

/// The handles shared with other processes (exported or imported): (count, bytes).
pub fn totals() -> Option<(usize, u64)> {
    let t = TABLE.lock();
    let (n, b) = t
        .handles
        .values()
        .filter(|h| is_shared(h))
        .fold((0, 0), |(n, b), h| (n + 1, b + h.size));
    (n > 0).then_some((n, b))
}

/// Evicts the marked imports (during a pause): unmapped and released, their descriptors
/// closed; their mappings stay recorded for [`reimport`]. How many.
fn evict_imports(t: &mut Table) -> Result<usize, String> {
    let ids: Vec<u64> = t
        .handles
        .iter()
        .filter(|(_, h)| h.pinned == Some(IMPORTED) && h.share.evict && h.real.is_some())
        .map(|(&v, _)| v)
        .collect();
    for &v in &ids {
        unmap_all(t, v).map_err(|(va, size, rc)| {
            format!("unmapping imported memory ({size} bytes at {va:#x}): CUresult {rc}")
        })?;
        let h = t.handles.get_mut(&v).expect("live");
        if let (Some(r), false) = (h.real, h.real_released) {
            let rc = real_release(r);
            if rc != CU_SUCCESS {
                log::warn(format_args!(
                    "pause: releasing imported handle {v:#x}: CUresult {rc}"
                ));
            }
        }
        h.real = None;
        h.share.fds.clear();
    }
    Ok(ids.len())
}

/// The imports evicted and not yet back, with the exports they came from: (import,
/// process, export).
pub fn awaiting_imports() -> Vec<(u64, u32, u64)> {
    TABLE
        .lock()
        .handles
        .iter()
        .filter(|(_, h)| h.pinned == Some(IMPORTED) && h.real.is_none())
        .filter_map(|(&v, h)| h.share.peer.map(|(pid, ev)| (v, pid, ev)))
        .collect()
}

/// Imports evicted and not yet back: a resume must wait for them ([`reimport`]).
pub fn awaiting() -> usize {
    TABLE
        .lock()
        .handles
        .values()
        .filter(|h| h.pinned == Some(IMPORTED) && h.real.is_none())
        .count()
}

/// Exports `vs` again (while paused): each evicted one is brought back first (re-created at
/// its addresses with its bytes) and exported anew; its new descriptor replaces the ones
/// kept (those were let go with the memory). A resident export (never evicted, or back
/// from an earlier try that failed later) keeps its memory, and other imports of the job
/// may map it: it hands out a duplicate of a descriptor kept, so that every import of it
/// stays paired with it (and one the program released, which cannot be exported again,
/// still can be handed out); only one with no descriptor kept is exported again, and the
/// new one joins those kept. A descriptor for each, in order.
pub fn reexport(
    vs: &[u64],
    loader: &mut dyn Staging<DriverBackend>,
) -> Result<Vec<OwnedFd>, String> {
    let mut t = TABLE.lock();
    for v in vs {
        match t.handles.get(v) {
            Some(h) if h.pinned == Some(EXPORTED) => {}
            _ => return Err(format!("handle {v:#x} is no export of this process")),
        }
    }
    let evicted: Vec<u64> = vs
        .iter()
        .copied()
        .filter(|v| t.handles.get(v).is_some_and(|h| h.real.is_none()))
        .collect();
    restore_handles(&mut t, &evicted, loader, true)?;
    let mut out = Vec::new();
    for &v in vs {
        let h = t.handles.get_mut(&v).expect("checked");
        let fresh = evicted.contains(&v);
        if !fresh {
            if let Some(kept) = h.share.fds.last() {
                let fd = dup(kept.as_raw_fd()).ok_or_else(|| {
                    format!("duplicating a kept descriptor of driver handle {v:#x}")
                })?;
                h.share.evict = false;
                out.push(fd);
                continue;
            }
        }
        let (Some(r), false) = (h.real, h.real_released) else {
            return Err(format!(
                "driver handle {v:#x} was released: it cannot be exported again"
            ));
        };
        let mut fd: i32 = -1;
        let rc = call!(
            real().export,
            fn(*mut c_void, u64, u32, u64),
            (&mut fd as *mut i32).cast(),
            r,
            POSIX_FD,
            0
        );
        if rc != CU_SUCCESS || fd < 0 {
            return Err(format!(
                "exporting driver handle {v:#x} again: CUresult {rc}"
            ));
        }
        // SAFETY: the driver just gave us this descriptor; it is ours to own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let kept = dup(fd.as_raw_fd()).map(Arc::new);
        if fresh {
            h.share.fds = kept.into_iter().collect();
        } else if let Some(k) = kept {
            if h.share.fds.len() >= KEPT_PER_HANDLE {
                h.share.fds.remove(0);
            }
            h.share.fds.push(k);
        }
        h.share.evict = false;
        out.push(fd);
    }
    // Exports the program had released go now that their importers can have them: the
    // driver frees each at its last unmap.
    for &v in vs {
        let h = t.handles.get_mut(&v).expect("checked");
        if h.refs == 0 && !h.real_released {
            if let Some(r) = h.real {
                let _ = real_release(r);
                h.real_released = true;
            }
        }
    }
    Ok(out)
}

/// A device to map imported memory from: one its mappings grant access to, else the first
/// device cudaw manages (the driver maps through the current context).
fn device_for(maps: &[(u64, Mapping)]) -> Option<i32> {
    maps.iter()
        .flat_map(|(_, m)| m.access.iter())
        .flat_map(|(_, _, d)| d.chunks_exact(ACCESS_DESC_BYTES))
        .find_map(|d| {
            let kind = u32::from_ne_bytes(d[0..4].try_into().ok()?);
            let id = i32::from_ne_bytes(d[4..8].try_into().ok()?);
            (kind == LOCATION_DEVICE).then_some(id)
        })
        .or_else(|| memory::managed_devices().next().map(|(o, _)| o))
}

/// Imports `items` (an evicted import, and its exporter's new descriptor) and maps each
/// where it was, with the access it had. How many came back; on a failure, the one that
/// failed is left evicted as it was (unmapped, released) and the error says which.
pub fn reimport(items: Vec<(u64, OwnedFd)>) -> Result<usize, String> {
    let mut t = TABLE.lock();
    let mut n = 0;
    for (v, fd) in items {
        match t.handles.get(&v) {
            Some(h) if h.pinned == Some(IMPORTED) && h.real.is_none() => {}
            Some(_) => return Err(format!("handle {v:#x} is no evicted import")),
            None => return Err(format!("handle {v:#x} is unknown")),
        }
        let maps = mappings_of(&t, v);
        if let Some(dev) = device_for(&maps) {
            if let Ok(m) = memory::device_without_runtime(dev) {
                let _ = m.vmm.backend().make_current();
            }
        }
        let mut r = 0u64;
        let rc = call!(
            real().import,
            fn(*mut u64, *mut c_void, u32),
            &mut r,
            fd.as_raw_fd() as usize as *mut c_void,
            POSIX_FD
        );
        if rc != CU_SUCCESS {
            return Err(format!(
                "importing handle {v:#x} from its exporter's new descriptor: CUresult {rc}"
            ));
        }
        let mut mapped: Vec<(u64, u64)> = Vec::new();
        let fail = map_again(&maps, r, &mut mapped).err();
        if let Some(f) = fail {
            for (va, size) in mapped {
                let _ = real_unmap(va, size);
            }
            let _ = real_release(r);
            return Err(format!("handle {v:#x}: {f}"));
        }
        let h = t.handles.get_mut(&v).expect("checked");
        h.real = Some(r);
        h.share.evict = false;
        h.share.fds = vec![Arc::new(fd)];
        if h.refs == 0 {
            let _ = real_release(r);
            h.real_released = true;
        } else {
            h.real_released = false;
        }
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kcmp_tells_one_file_description_from_another() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let me = std::process::id();
        let a2 = a.try_clone().unwrap();
        assert!(same_file(me, a.as_raw_fd(), a2.as_raw_fd()).unwrap());
        assert!(!same_file(me, a.as_raw_fd(), b.as_raw_fd()).unwrap());
        // A number not open there is no match, not an error.
        assert!(!same_file(me, a.as_raw_fd(), 1 << 20).unwrap());
    }

    #[test]
    fn an_import_keeps_a_duplicate_of_its_descriptor() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let s = Share::imported(POSIX_FD, a.as_raw_fd() as usize as *mut c_void);
        assert_eq!(s.fds.len(), 1);
        assert_ne!(s.fds[0].as_raw_fd(), a.as_raw_fd());
        assert!(same_file(std::process::id(), s.fds[0].as_raw_fd(), a.as_raw_fd()).unwrap());
        // Another kind of handle keeps nothing.
        assert!(Share::imported(2, std::ptr::null_mut()).fds.is_empty());
    }
}

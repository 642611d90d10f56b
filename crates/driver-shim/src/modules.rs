//! Kernel parameter layouts of the modules and libraries loaded through the driver
//! (`cuModuleLoadData`, `cuModuleLoadDataEx`, `cuModuleLoadFatBinary`, `cuLibraryLoadData`
//! — Triton loads its cubins this way — and `cuModuleLoad` / `cuLibraryLoadFromFile`), so
//! that launch-time argument inspection works for kernels the runtime never registered.
//!
//! At load, the image's bytes are copied (the caller may free them once the call returns;
//! their length comes from the image's own headers, [`fatbin::raw`]) — unless they lie in
//! a loaded shared object or executable (`dladdr`: the fatbins a runtime registers), which
//! are read in place later; for a file, its path is kept. Nothing is parsed then: the first
//! [`layout`] asked of a handle made from the module parses the image with the `fatbin`
//! crate (a fatbin container, a cubin or PTX) for the current device's SM, with no lock
//! held, keeps every kernel's layout and drops the bytes. A parse
//! that fails or panics (the parser is fuzzed, but a panic is caught here) leaves the
//! module without layouts, logged once. Handles (`cuModuleGetFunction`,
//! `cuLibraryGetKernel`, `cuKernelGetFunction`) are keyed to their module and kernel name;
//! unloading forgets both.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use fatbin::{ImageKind, KernelInfo};

/// The largest image copied at load (a larger declared length is taken as corrupt).
const MAX_IMAGE: u64 = 1 << 30;

/// Where a module's code is, until parsed.
enum Code {
    Bytes(Box<[u8]>),
    /// `len` bytes at `addr`, inside a shared object or executable the process has loaded
    /// (the fatbins the runtime registers, in their library's `.nv_fatbin`): read in place
    /// when parsed, never copied. The object stays loaded while the module is (its
    /// destructor unregisters the fatbin, which unloads the module and forgets this).
    InObject {
        addr: usize,
        len: usize,
    },
    /// Being parsed by a thread that holds no lock meanwhile.
    Parsing,
    File(PathBuf),
    /// Parsed: every kernel's layout by name.
    Parsed(HashMap<String, Arc<KernelInfo>>),
    /// Nothing could be read.
    Unusable,
}

#[derive(Default)]
struct State {
    modules: HashMap<usize, Code>,
    /// Function or kernel handle → (module or library, kernel name).
    handles: HashMap<usize, (usize, Box<str>)>,
}

static STATE: LazyLock<Mutex<State>> = LazyLock::new(Default::default);
static LAYOUTS: AtomicU64 = AtomicU64::new(0);
/// Calls of [`layout`]: the launches whose thread's cache of layouts did not hold theirs.
static LOOKUPS: AtomicU64 = AtomicU64::new(0);

/// How many times a launch looked its layout up here, past its thread's cache (a
/// diagnostic of tracing's cost: each is a lock and a name's hash).
pub fn layout_lookups() -> u64 {
    LOOKUPS.load(Ordering::Relaxed)
}

/// Kernel layouts recorded so far (from every module parsed).
pub fn layouts_recorded() -> u64 {
    LAYOUTS.load(Ordering::Relaxed)
}

/// The bytes of the image at `image`, read only as far as its headers declare.
///
/// # Safety
/// `image` is null or an image the real driver just loaded (a fatbin container or wrapper,
/// a cubin, or NUL-terminated PTX), readable for the length its headers declare.
unsafe fn image_span(image: *const c_void) -> Option<(*const u8, usize)> {
    if image.is_null() {
        return None;
    }
    let p = image.cast::<u8>();
    // SAFETY: every loadable image is longer than 20 bytes (caller's contract).
    let prefix = unsafe { std::slice::from_raw_parts(p, 20) };
    let len = match fatbin::detect_image_kind(prefix)? {
        ImageKind::Fatbin => fatbin::container_len(&prefix[..16]).ok()?,
        ImageKind::Wrapper => {
            // SAFETY: a wrapper is 24 bytes.
            let w = unsafe { std::slice::from_raw_parts(p, 24) };
            let container = fatbin::parse_wrapper(w).ok()?.container as *const c_void;
            if container.is_null() {
                return None;
            }
            // SAFETY: the wrapper names the container the driver loaded.
            return unsafe { image_span(container) };
        }
        ImageKind::Cubin => {
            // SAFETY: an ELF image holds its 64-byte header.
            let head = unsafe { std::slice::from_raw_parts(p, fatbin::raw::ELF64_HEADER_SIZE) };
            match fatbin::elf_image_len(head) {
                Ok(n) => n,
                Err(fatbin::Error::Truncated { offset, needed, .. }) => {
                    let n = offset.checked_add(needed).filter(|&n| n <= MAX_IMAGE)?;
                    // SAFETY: the ELF header declares its tables up to `n` bytes.
                    let more = unsafe { std::slice::from_raw_parts(p, n as usize) };
                    fatbin::elf_image_len(more).ok()?
                }
                Err(_) => return None,
            }
        }
        // SAFETY: PTX is NUL-terminated.
        ImageKind::Ptx => unsafe { CStr::from_ptr(image.cast::<c_char>()) }
            .to_bytes()
            .len() as u64,
        ImageKind::HostElf => return None,
    };
    if len > MAX_IMAGE {
        return None;
    }
    Some((p, len as usize))
}

/// Whether `addr` lies inside a shared object or executable the process has loaded
/// (`dladdr`), rather than in memory the caller may free once the load returns.
fn in_loaded_object(addr: *const u8) -> bool {
    // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-pointer.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::dladdr(addr.cast(), &mut info) != 0 && !info.dli_fname.is_null() }
}

/// After a successful load of `image` into the module or library written through `out`.
pub fn loaded_image(out: *const usize, image: *const c_void) {
    if out.is_null() {
        return;
    }
    // SAFETY: the driver just loaded `image` (and wrote `out`).
    let code = match unsafe { image_span(image) } {
        Some((p, len)) if in_loaded_object(p) => Code::InObject {
            addr: p as usize,
            len,
        },
        // SAFETY: the image's headers declare `len` bytes, all loaded by the driver.
        Some((p, len)) => Code::Bytes(unsafe { std::slice::from_raw_parts(p, len) }.into()),
        None => Code::Unusable,
    };
    // SAFETY: the driver just wrote the handle through the caller's out-pointer.
    let module = unsafe { out.read() };
    STATE.lock().modules.insert(module, code);
}

/// After a successful load of the file `path` into the module written through `out`.
pub fn loaded_file(out: *const usize, path: *const c_char) {
    if out.is_null() || path.is_null() {
        return;
    }
    // SAFETY: the driver just wrote `out`; `path` is the caller's NUL-terminated path.
    let (module, path) = unsafe { (out.read(), CStr::from_ptr(path)) };
    let path = PathBuf::from(
        <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path.to_bytes()),
    );
    STATE.lock().modules.insert(module, Code::File(path));
}

/// Records that `handle` runs kernel `name` of `module`.
pub fn handle_made(handle: usize, module: usize, name: &str) {
    STATE.lock().handles.insert(handle, (module, name.into()));
}

/// Records that function `f` is kernel `kernel`'s (`cuKernelGetFunction`).
pub fn function_of_kernel(f: usize, kernel: usize) {
    let mut s = STATE.lock();
    if let Some(k) = s.handles.get(&kernel).cloned() {
        s.handles.insert(f, k);
    }
}

/// Forgets `module` (unloaded) and the handles made from it.
pub fn unloaded(module: usize) {
    let mut s = STATE.lock();
    s.modules.remove(&module);
    s.handles.retain(|_, (m, _)| *m != module);
}

/// The current device's SM (`major * 10 + minor`), 90 when unknown.
fn current_sm() -> u32 {
    let mut dev = 0i32;
    if crate::forward!(cuCtxGetDevice: fn(*mut i32), &mut dev) != 0 {
        return 90;
    }
    let (mut major, mut minor) = (0i32, 0i32);
    // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR.
    let a = crate::forward!(cuDeviceGetAttribute: fn(*mut i32, i32, i32), &mut major, 75, dev);
    let b = crate::forward!(cuDeviceGetAttribute: fn(*mut i32, i32, i32), &mut minor, 76, dev);
    if a != 0 || b != 0 {
        return 90;
    }
    (major * 10 + minor) as u32
}

/// Every kernel layout of `bytes` for SM `sm`.
fn parse(bytes: &[u8], sm: u32) -> Result<HashMap<String, Arc<KernelInfo>>, String> {
    let fatbin = fatbin::Fatbin::parse(bytes).map_err(|e| e.to_string())?;
    let mut kernels = fatbin.kernels_for_sm(sm).unwrap_or_default();
    if kernels.is_empty() {
        // No entry for this SM (a cubin built for another): whatever the image holds.
        for e in fatbin.entries() {
            kernels.extend(
                e.kernels()
                    .map_err(|e| e.to_string())?
                    .into_iter()
                    .map(Arc::new),
            );
        }
    }
    let mut by_name = HashMap::new();
    for k in kernels {
        by_name.entry(k.name.clone()).or_insert(k);
    }
    Ok(by_name)
}

/// What parsing `code` needs, taken out of the table (the parse itself runs with no lock
/// held: decompressing a large image takes milliseconds, and module loads and handle
/// lookups on every thread wait for the table's lock).
enum Source {
    Owned(Vec<u8>),
    InObject(usize, usize),
}

/// The parameter layout of the kernel `handle` (a `CUfunction` or `CUkernel` handed out
/// through this layer) runs, parsing its module on first need.
pub fn layout(handle: usize) -> Option<Arc<KernelInfo>> {
    LOOKUPS.fetch_add(1, Ordering::Relaxed);
    let (module, name, source) = {
        let mut s = STATE.lock();
        let (module, name) = s.handles.get(&handle).cloned()?;
        let code = s.modules.get_mut(&module)?;
        let source = match code {
            Code::Parsed(m) => return m.get(&*name).cloned(),
            Code::Unusable | Code::Parsing => return None,
            Code::Bytes(b) => Source::Owned(std::mem::take(b).into_vec()),
            Code::InObject { addr, len } => Source::InObject(*addr, *len),
            Code::File(p) => match std::fs::read(&*p) {
                Ok(b) => Source::Owned(b),
                Err(e) => {
                    crate::log::debug(format_args!("module {module:#x}: {}: {e}", p.display()));
                    *code = Code::Unusable;
                    return None;
                }
            },
        };
        *code = Code::Parsing;
        (module, name, source)
    };
    let bytes: &[u8] = match &source {
        Source::Owned(b) => b,
        // SAFETY: the module is loaded (it was in the table a moment ago, and a launch of
        // one of its kernels is under way), so the object holding its image is too.
        Source::InObject(addr, len) => unsafe {
            std::slice::from_raw_parts(*addr as *const u8, *len)
        },
    };
    let sm = current_sm();
    let code = match catch_unwind(AssertUnwindSafe(|| parse(bytes, sm))) {
        Ok(Ok(layouts)) => {
            LAYOUTS.fetch_add(layouts.len() as u64, Ordering::Relaxed);
            Code::Parsed(layouts)
        }
        Ok(Err(e)) => {
            crate::log::debug(format_args!("module {module:#x}: no kernel layouts: {e}"));
            Code::Unusable
        }
        Err(_) => {
            crate::log::warn(format_args!(
                "module {module:#x}: the image parser failed; its kernels have no layouts"
            ));
            Code::Unusable
        }
    };
    let found = match &code {
        Code::Parsed(m) => m.get(&*name).cloned(),
        _ => None,
    };
    // Unloaded meanwhile (or unloaded and the handle reused: then it is not `Parsing`):
    // the result is dropped.
    let mut s = STATE.lock();
    if let Some(c) = s.modules.get_mut(&module) {
        if matches!(c, Code::Parsing) {
            *c = code;
        }
    }
    found
}

/// Writes [`cudaw_trace::driver_side::layout_json`] of `handle`'s kernel into `buf` (at most `len` bytes,
/// NUL-terminated when it fits); returns the length of the whole text without its NUL, 0
/// when the handle has no known layout.
#[no_mangle]
pub extern "C" fn cudaw_driver_kernel_layout_v1(
    handle: usize,
    buf: *mut c_char,
    len: usize,
) -> usize {
    crate::boundary::guard("cudaw_driver_kernel_layout_v1", 0, || {
        let Some(k) = layout(handle) else { return 0 };
        let text = cudaw_trace::driver_side::layout_json(&k);
        if !buf.is_null() && len > text.len() {
            // SAFETY: the caller's buffer holds `len` bytes, more than the text and its NUL.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
                buf.add(text.len()).write(0);
            }
        }
        text.len()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PTX module with one kernel taking a pointer and an int, NUL-terminated as
    /// `cuModuleLoadData` takes it. In this test binary's read-only data.
    static PTX: &[u8] = b"//\n.version 8.0\n.target sm_90\n.address_size 64\n\n.visible .entry _Z1kPfi(\n\t.param .u64 _Z1kPfi_param_0,\n\t.param .u32 _Z1kPfi_param_1\n)\n{\n\tret;\n}\n\0";

    fn params(handle: usize) -> Option<Vec<(u32, u32)>> {
        layout(handle).map(|k| k.params.iter().map(|p| (p.offset, p.size)).collect())
    }

    #[test]
    fn images_in_a_loaded_object_are_read_in_place_and_others_copied() {
        assert!(in_loaded_object(PTX.as_ptr()));
        let heap = PTX.to_vec();
        assert!(!in_loaded_object(heap.as_ptr()));

        // In the binary: kept as an address, parsed in place on first need.
        let (m1, f1) = (0x1000usize, 0x1001usize);
        loaded_image(&m1, PTX.as_ptr().cast());
        assert!(matches!(
            STATE.lock().modules.get(&m1),
            Some(Code::InObject { .. })
        ));
        handle_made(f1, m1, "_Z1kPfi");
        assert_eq!(params(f1), Some(vec![(0, 8), (8, 4)]));
        assert!(matches!(
            STATE.lock().modules.get(&m1),
            Some(Code::Parsed(_))
        ));

        // On the heap: copied at load (the caller may free it), the same layout.
        let (m2, f2) = (0x2000usize, 0x2001usize);
        loaded_image(&m2, heap.as_ptr().cast());
        drop(heap);
        assert!(matches!(
            STATE.lock().modules.get(&m2),
            Some(Code::Bytes(_))
        ));
        handle_made(f2, m2, "_Z1kPfi");
        assert_eq!(params(f2), Some(vec![(0, 8), (8, 4)]));

        // Unloaded: forgotten.
        unloaded(m1);
        unloaded(m2);
        assert_eq!(params(f1), None);
        assert_eq!(params(f2), None);
    }
}

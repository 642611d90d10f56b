//! Finding and loading the real library a shim forwards to, never cudaw itself. Each
//! shim gives its search ([`Search`]: the file name, the variable that overrides it, a
//! symbol every real one exports, cudaw's marker) and its candidates, best first (the
//! runtime's: `CUDAW_REAL_CUDART`, `LD_LIBRARY_PATH`, the toolkit and Python folders; the
//! driver's: `driver::locate::candidates`). A candidate is refused when it is the file this
//! shim was loaded from (same device and inode), when it exports cudaw's marker, or when
//! it lacks the probe symbol (or that symbol resolves into this shim); the others are
//! loaded `RTLD_NOW | RTLD_LOCAL` by path and stay loaded for the life of the process.

use std::ffi::{c_void, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// How a shim tells its real library from anything else.
#[derive(Clone, Copy, Debug)]
pub struct Search<'a> {
    /// The file looked for: `libcudart.so.13`, `libcuda.so.1`.
    pub soname: &'a str,
    /// The variable that names it instead: `CUDAW_REAL_CUDART`, `CUDAW_REAL_LIBCUDA`.
    pub variable: &'a str,
    /// A symbol every real one exports (`cudaGetErrorString`, `cuInit`), and what a
    /// candidate without it is called in the error (`not a CUDA runtime, or cudaw`).
    pub probe: (&'a CStr, &'a str),
    /// A symbol only a library of cudaw's exports, and what a candidate that has it is
    /// called in the error (`cudaw's driver shim`).
    pub marker: Option<(&'a CStr, &'a str)>,
}

/// A loaded real library (never unloaded).
#[derive(Debug)]
pub struct RealLibrary {
    handle: usize,
    path: CString,
}

impl RealLibrary {
    /// The address of `name` in the real library, if it exports it (and it is not this
    /// shim's).
    pub fn symbol(&self, name: &str) -> Option<usize> {
        let c = CString::new(name).ok()?;
        self.symbol_c(&c)
    }

    fn symbol_c(&self, name: &CStr) -> Option<usize> {
        // SAFETY: dlsym reads the loader's tables for a handle dlopen returned, never
        // closed; nothing is called here.
        let p = unsafe { libc::dlsym(self.handle as *mut c_void, name.as_ptr()) } as usize;
        (p != 0 && !is_inside_self(p)).then_some(p)
    }

    /// Where it was loaded from.
    pub fn path(&self) -> &Path {
        Path::new(std::ffi::OsStr::from_bytes(self.path.as_bytes()))
    }

    /// Where it was loaded from, NUL-terminated (alive as long as the library).
    pub fn c_path(&self) -> &CStr {
        &self.path
    }
}

/// Why no real library could be loaded: every candidate, and why each was refused.
#[derive(Clone, Debug)]
pub struct LoadError {
    soname: String,
    variable: String,
    tried: Vec<String>,
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot find the real {} to forward to (set {}); tried: {}",
            self.soname,
            self.variable,
            if self.tried.is_empty() {
                "nothing".into()
            } else {
                self.tried.join(", ")
            }
        )
    }
}

impl std::error::Error for LoadError {}

/// Loads the first of `candidates` that is the real library `search` describes.
pub fn load(
    search: &Search<'_>,
    candidates: impl IntoIterator<Item = PathBuf>,
) -> Result<RealLibrary, LoadError> {
    let mut tried = Vec::new();
    for path in candidates {
        if is_self_file(&path) {
            tried.push(format!("{} (cudaw itself)", path.display()));
            continue;
        }
        let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
            tried.push(format!("{} (a NUL in the path)", path.display()));
            continue;
        };
        // SAFETY: loading the real CUDA library runs its initialisers, as the program
        // would have had it load them anyway.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            tried.push(format!("{} ({})", path.display(), last_dl_error()));
            continue;
        }
        let lib = RealLibrary {
            handle: h as usize,
            path: c,
        };
        if let Some((marker, what)) = search.marker {
            // SAFETY: a handle dlopen just returned; only the loader's tables are read.
            if !unsafe { libc::dlsym(h, marker.as_ptr()) }.is_null() {
                tried.push(format!("{} ({what})", path.display()));
                continue;
            }
        }
        if lib.symbol_c(search.probe.0).is_none() {
            tried.push(format!("{} ({})", path.display(), search.probe.1));
            continue;
        }
        return Ok(lib);
    }
    Err(LoadError {
        soname: search.soname.to_owned(),
        variable: search.variable.to_owned(),
        tried,
    })
}

/// The loader's message for the last failed `dlopen` of this thread.
fn last_dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string owned by the loader, valid
    // until the thread's next dl* call; it is copied at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        return "cannot load".into();
    }
    // SAFETY: as above.
    unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
}

/// The path of the object this code is linked into (the shim's own file).
pub fn self_path() -> Option<PathBuf> {
    let info = dl_info(self_path as *const c_void)?;
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader, valid while loaded.
    let s = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(s.to_bytes())))
}

fn dl_info(addr: *const c_void) -> Option<libc::Dl_info> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-pointer.
    (unsafe { libc::dladdr(addr, &mut info) } != 0).then_some(info)
}

fn is_self_file(p: &Path) -> bool {
    let (Ok(m), Some(own)) = (std::fs::metadata(p), self_path()) else {
        return false;
    };
    std::fs::metadata(own).is_ok_and(|o| (o.dev(), o.ino()) == (m.dev(), m.ino()))
}

/// Whether `addr` lies in the object this code is linked into.
fn is_inside_self(addr: usize) -> bool {
    match (
        dl_info(addr as *const c_void),
        dl_info(self_path as *const c_void),
    ) {
        (Some(a), Some(b)) => a.dli_fbase == b.dli_fbase,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEARCH: Search<'static> = Search {
        soname: "libc.so.6",
        variable: "CUDAW_TEST_REAL",
        probe: (c"malloc", "not a C library"),
        marker: Some((c"cudaw_no_such_marker_v1", "cudaw")),
    };

    #[test]
    fn loads_the_first_real_one_and_says_why_others_were_refused() {
        let missing = std::env::temp_dir().join("cudaw-shim-core-no-such-dir/libnothing.so");
        let err = load(&SEARCH, [missing.clone()]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(
                "cannot find the real libc.so.6 to forward to (set CUDAW_TEST_REAL); tried: "
            ),
            "{text}"
        );
        assert!(text.contains(&format!("{} (", missing.display())), "{text}");
        let none = load(&SEARCH, []).unwrap_err().to_string();
        assert!(none.ends_with("tried: nothing"), "{none}");

        let libc_path = PathBuf::from("libc.so.6");
        let lib = load(&SEARCH, [missing, libc_path]).expect("libc loads");
        assert!(lib.symbol("malloc").is_some());
        assert!(lib.symbol("cudaw_no_such_symbol").is_none());
        assert_eq!(lib.path(), Path::new("libc.so.6"));
    }

    #[test]
    fn refuses_a_candidate_with_the_marker() {
        let marked = Search {
            marker: Some((c"malloc", "cudaw's own")),
            ..SEARCH
        };
        let err = load(&marked, [PathBuf::from("libc.so.6")]).unwrap_err();
        assert!(
            err.to_string().ends_with("tried: libc.so.6 (cudaw's own)"),
            "{err}"
        );
    }
}

//! Finding and loading the real CUDA runtime of this build's major.
//!
//! Order: `CUDAW_REAL_CUDART`; else the first file named like this build's SONAME found in
//! `LD_LIBRARY_PATH`, the CUDA toolkit folders, the system library folders and the Python
//! environments' `nvidia/*/lib` folders. Never cudaw itself: a candidate that is the file
//! this shim was loaded from (same device and inode), or any library that carries cudaw's
//! marker section, is skipped.

use crate::dispatch::SONAME;
use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use std::ffi::{c_void, CString};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A loaded real runtime.
pub struct RealRuntime {
    lib: Library,
    path: PathBuf,
}

impl RealRuntime {
    /// The address of `name` in the real runtime, if it exports it.
    pub fn symbol(&self, name: &str) -> Option<usize> {
        let c = CString::new(name).ok()?;
        // SAFETY: we read the symbol's address only; nothing is called here.
        let sym = unsafe { self.lib.get::<*mut c_void>(c.as_bytes_with_nul()) }.ok()?;
        let p = *sym as usize;
        (p != 0 && !is_inside_self(p)).then_some(p)
    }

    /// Where it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Why the real runtime could not be loaded.
#[derive(Debug)]
pub struct LoadError(pub String);

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Loads the real runtime (once per call; the dispatch table calls it once).
pub fn load() -> Result<RealRuntime, LoadError> {
    let cfg = crate::config::get();
    let candidates: Vec<PathBuf> = match &cfg.real_cudart {
        Some(p) => vec![p.clone()],
        None => discover(),
    };
    let mut tried = Vec::new();
    for path in candidates {
        if is_self_file(&path) {
            tried.push(format!("{} (cudaw itself)", path.display()));
            continue;
        }
        // SAFETY: loading a shared library runs its initialisers; this is the real CUDA
        // runtime the program asked for, which it would have loaded anyway.
        match unsafe { Library::open(Some(&path), RTLD_NOW | RTLD_LOCAL) } {
            Ok(lib) => {
                let rt = RealRuntime { lib, path };
                // A library whose cudaMalloc is ours is cudaw itself under another name.
                if rt.symbol("cudaGetErrorString").is_none() {
                    tried.push(format!(
                        "{} (not a CUDA runtime, or cudaw)",
                        rt.path.display()
                    ));
                    continue;
                }
                return Ok(rt);
            }
            Err(e) => tried.push(format!("{} ({e})", path.display())),
        }
    }
    Err(LoadError(format!(
        "cannot find the real {SONAME} to forward to (set CUDAW_REAL_CUDART); tried: {}",
        if tried.is_empty() {
            "nothing".into()
        } else {
            tried.join(", ")
        }
    )))
}

/// Candidate paths, best first.
pub fn discover() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Ok(v) = std::env::var("LD_LIBRARY_PATH") {
        dirs.extend(v.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    dirs.extend(driver::locate::runtime_dirs());
    for site in python_site_dirs() {
        if let Ok(rd) = std::fs::read_dir(site.join("nvidia")) {
            let mut subs: Vec<PathBuf> = rd.flatten().map(|e| e.path().join("lib")).collect();
            subs.sort();
            dirs.extend(subs);
        }
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for d in dirs {
        let p = d.join(SONAME);
        if p.is_file() && !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

fn python_site_dirs() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Ok(v) = std::env::var(var) {
            roots.push(PathBuf::from(v));
        }
    }
    roots.extend(["/usr", "/usr/local", "/opt/conda"].map(PathBuf::from));
    let mut sites = Vec::new();
    if let Ok(pp) = std::env::var("PYTHONPATH") {
        sites.extend(pp.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    for r in roots {
        let lib = r.join("lib");
        if let Ok(rd) = std::fs::read_dir(&lib) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("python3") {
                    sites.push(e.path().join("site-packages"));
                    sites.push(e.path().join("dist-packages"));
                }
            }
        }
    }
    sites
}

/// The file this shim was loaded from, as (device, inode).
fn self_identity() -> Option<(u64, u64)> {
    let path = self_path()?;
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino()))
}

/// The path of the object containing this function.
pub fn self_path() -> Option<PathBuf> {
    let mut info: libc::Dl_info = empty_dl_info();
    // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-pointer.
    let ok = unsafe { libc::dladdr(self_path as *const c_void, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader, valid while loaded.
    let s = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(s.to_string_lossy().into_owned()))
}

fn empty_dl_info() -> libc::Dl_info {
    libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    }
}

fn is_self_file(p: &Path) -> bool {
    let Ok(m) = std::fs::metadata(p) else {
        return false;
    };
    self_identity() == Some((m.dev(), m.ino()))
}

/// Whether `addr` lies in the object this shim was loaded from.
fn is_inside_self(addr: usize) -> bool {
    let mut a = empty_dl_info();
    let mut b = empty_dl_info();
    // SAFETY: dladdr only reads the loader's tables; both out-pointers are valid.
    let (ra, rb) = unsafe {
        (
            libc::dladdr(addr as *const c_void, &mut a),
            libc::dladdr(self_path as *const c_void, &mut b),
        )
    };
    ra != 0 && rb != 0 && a.dli_fbase == b.dli_fbase
}

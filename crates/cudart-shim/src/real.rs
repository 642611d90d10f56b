//! Finding and loading the real CUDA runtime of this build's major.
//!
//! Order: `CUDAW_REAL_CUDART`; else the first file named like this build's SONAME found in
//! `LD_LIBRARY_PATH`, the CUDA toolkit folders, the system library folders and the Python
//! environments' `nvidia/*/lib` folders. Never cudaw itself: a candidate that is the file
//! this shim was loaded from (same device and inode), or whose `cudaGetErrorString` is this
//! shim's, is skipped (`cudaw_shim_core::real`).

use crate::dispatch::SONAME;
use cudaw_shim_core::real::{self, LoadError, RealLibrary, Search};
use std::path::PathBuf;

/// What the real runtime is: this build's SONAME, exporting `cudaGetErrorString`.
const SEARCH: Search<'static> = Search {
    soname: SONAME,
    variable: "CUDAW_REAL_CUDART",
    probe: (c"cudaGetErrorString", "not a CUDA runtime, or cudaw"),
    marker: None,
};

/// Loads the real runtime (once per call; the dispatch table calls it once).
pub fn load() -> Result<RealLibrary, LoadError> {
    let candidates: Vec<PathBuf> = match &crate::config::get().real_cudart {
        Some(p) => vec![p.clone()],
        None => discover(),
    };
    real::load(&SEARCH, candidates)
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

//! Where the real CUDA driver (`libcuda.so.1`) may be: the candidates, best first.
//!
//! `CUDAW_REAL_LIBCUDA`, then `CUDAW_LIBCUDA` (the driver cudaw itself uses, simgpu's in
//! tests), then `libcuda.so.1` in each `LD_LIBRARY_PATH` folder, the paths the dynamic
//! linker's cache (`/etc/ld.so.cache`) holds for it, and the usual driver folders. The
//! candidates may include cudaw's own driver shim (it is on `LD_LIBRARY_PATH` or named by
//! mistake): whoever loads them skips a file that is itself or that exports
//! [`crate::hooks::DRIVER_SHIM_REAL_PATH_SYMBOL`]. Reading the cache is a plain file read
//! (no `ldconfig` process is started from inside a library).

use std::path::PathBuf;

/// Names the real driver explicitly.
pub const REAL_LIBCUDA_ENV: &str = "CUDAW_REAL_LIBCUDA";
/// The driver's file name.
pub const LIBCUDA: &str = "libcuda.so.1";

/// This architecture's Debian multiarch folder name and CUDA's `targets/` name for it
/// (`sbsa-linux`: Arm servers, GH200 and GB200 included).
#[cfg(not(target_arch = "aarch64"))]
const ARCH_DIRS: (&str, &str) = ("x86_64-linux-gnu", "x86_64-linux");
#[cfg(target_arch = "aarch64")]
const ARCH_DIRS: (&str, &str) = ("aarch64-linux-gnu", "sbsa-linux");

/// CUDA's `targets/` folder name for this architecture (`x86_64-linux`, `sbsa-linux`).
pub const CUDA_TARGET: &str = ARCH_DIRS.1;

/// The usual folders of the driver library, after the cache.
#[cfg(not(target_arch = "aarch64"))]
pub const DRIVER_DIRS: [&str; 7] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/local/nvidia/lib64",
    "/usr/lib/wsl/lib",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
    "/lib64",
];
/// The usual folders of the driver library, after the cache.
#[cfg(target_arch = "aarch64")]
pub const DRIVER_DIRS: [&str; 7] = [
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/local/nvidia/lib64",
    "/usr/lib/wsl/lib",
    "/usr/lib",
    "/lib/aarch64-linux-gnu",
    "/lib64",
];

/// The usual folders of CUDA's runtime libraries (`libcudart.so.N`), best first: each
/// `/usr/local/cuda*` installation's (sorted by name), then the system's. The drop-in
/// runtime looks there for the real one, and `cudaw run` for whether there is one.
pub fn runtime_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/usr/local") {
        let mut cuda: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("cuda"))
            })
            .collect();
        cuda.sort();
        for c in cuda {
            dirs.push(c.join("lib64"));
            dirs.push(c.join("targets").join(CUDA_TARGET).join("lib"));
        }
    }
    let multiarch = ARCH_DIRS.0;
    dirs.extend([
        PathBuf::from("/usr/lib").join(multiarch),
        PathBuf::from("/usr/lib64"),
        PathBuf::from("/usr/lib"),
        PathBuf::from("/lib").join(multiarch),
    ]);
    dirs
}

/// Candidate paths for the real driver, best first, without duplicates.
pub fn candidates() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut push = |p: PathBuf| {
        if !out.contains(&p) {
            out.push(p);
        }
    };
    for var in [REAL_LIBCUDA_ENV, crate::loader::LIBCUDA_ENV] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            push(PathBuf::from(v));
        }
    }
    if let Some(v) = std::env::var_os("LD_LIBRARY_PATH") {
        for d in std::env::split_paths(&v).filter(|d| !d.as_os_str().is_empty()) {
            let p = d.join(LIBCUDA);
            if p.is_file() {
                push(p);
            }
        }
    }
    if let Ok(cache) = std::fs::read("/etc/ld.so.cache") {
        for p in cached_paths(&cache, LIBCUDA) {
            push(p);
        }
    }
    for d in DRIVER_DIRS {
        let p = PathBuf::from(d).join(LIBCUDA);
        if p.is_file() {
            push(p);
        }
    }
    out
}

/// The absolute paths ending in `/NAME` in a dynamic linker cache's string table (both
/// cache formats keep every path as a NUL-terminated string).
pub fn cached_paths(cache: &[u8], name: &str) -> Vec<PathBuf> {
    let suffix = format!("/{name}");
    cache
        .split(|&b| b == 0)
        .filter_map(|s| std::str::from_utf8(s).ok())
        .filter(|s| s.starts_with('/') && s.ends_with(&suffix))
        .map(PathBuf::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_paths_are_read_from_the_string_table() {
        let cache = b"glibc-ld.so.cache1.1\0\x01\x02libcuda.so.1\0/usr/lib/x86_64-linux-gnu/libcuda.so.1\0libc.so.6\0/lib/libc.so.6\0/opt/x/libcuda.so.1\0";
        assert_eq!(
            cached_paths(cache, LIBCUDA),
            vec![
                PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
                PathBuf::from("/opt/x/libcuda.so.1")
            ]
        );
    }

    #[test]
    fn the_explicit_driver_comes_first() {
        // Only this test sets the variable in this process.
        std::env::set_var(REAL_LIBCUDA_ENV, "/nonexistent/real/libcuda.so.1");
        let c = candidates();
        std::env::remove_var(REAL_LIBCUDA_ENV);
        assert_eq!(c[0], PathBuf::from("/nonexistent/real/libcuda.so.1"));
    }
}

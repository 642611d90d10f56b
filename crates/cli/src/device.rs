//! Where a program runs, for `cudaw run` and `cudaw demo` alike: the GPU when the NVIDIA
//! driver finds one, else simgpu (cudaw's simulated GPU); and where cudaw's own files are.
//!
//! On simgpu, `libsimgpu.so` plays both the driver (`CUDAW_LIBCUDA`, what cudaw's runtime
//! and driver layer load) and the real runtime cudaw forwards to (`--real-cudart`): a
//! program built with `nvcc -cudart shared` then runs unchanged, its `libcudart.so.N`
//! being cudaw's (preloaded).
//!
//! cudaw's files are looked for beside the binary (`../lib`, `../share/cudaw`: the layout
//! of `dist/` from `scripts/package.sh`, or of a development build's `target/PROFILE/`),
//! then in the source tree the binary was built from, when it is still there (a `cudaw`
//! installed with `cargo install --path crates/cli` finds the clone's `dist/` and
//! `target/` builds that way).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use driver::Driver;

use crate::failure::{fail, Kind};

/// `--device`'s values.
pub const CHOICES: [&str; 3] = ["auto", "gpu", "sim"];

/// `--device`'s help, the same for `cudaw run` and `cudaw demo`.
pub const HELP: &str = "Where to run: auto (the GPU when the NVIDIA driver finds one, else \
simgpu, cudaw's simulated GPU, saying so on standard error), gpu (refuse when there is no \
usable GPU), or sim (simgpu, even with a GPU)";

/// Where a program runs.
#[derive(Debug, Clone)]
pub enum Target {
    /// The real GPU, through the NVIDIA driver; its name and memory, when probed.
    Gpu(Option<String>),
    /// simgpu: its library, and why (the probe's finding; `None` when asked for).
    Sim {
        /// `libsimgpu.so`.
        lib: PathBuf,
        /// Why not the GPU, when the probe decided.
        why: Option<String>,
    },
}

impl Target {
    /// simgpu's library, on simgpu.
    pub fn simgpu(&self) -> Option<&Path> {
        match self {
            Target::Sim { lib, .. } => Some(lib),
            Target::Gpu(_) => None,
        }
    }
}

/// Decides where to run for `--device CHOICE`: `gpu` and `auto` ask the driver (`auto`
/// falls back to simgpu, `gpu` refuses); `sim` does not ask.
pub fn choose(choice: &str) -> Result<Target> {
    if choice == "sim" {
        return Ok(Target::Sim {
            lib: find_simgpu()?,
            why: None,
        });
    }
    match probe_gpu() {
        Ok(name) => Ok(Target::Gpu(Some(name))),
        Err(why) if choice == "gpu" => Err(fail(
            Kind::NoDevice,
            format!("--device gpu, but no GPU is usable: {why} (--device sim runs on simgpu)"),
        )),
        Err(why) => {
            let lib = find_simgpu().with_context(|| format!("no GPU ({why})"))?;
            Ok(Target::Sim {
                lib,
                why: Some(why),
            })
        }
    }
}

/// Whether a GPU is usable: `libcuda.so.1` loads, initialises and has a device. Its name
/// and memory, or why not in plain words.
pub fn probe_gpu() -> std::result::Result<String, String> {
    let cuda = driver::LibCuda::open_path("libcuda.so.1").map_err(|e| {
        if e.call == "dlopen" && !e.name.contains("driver shim") {
            "no NVIDIA driver found (libcuda.so.1 is not installed, or not on the library path)"
                .to_owned()
        } else {
            format!("no NVIDIA driver found ({})", e.name)
        }
    })?;
    cuda.init()
        .map_err(|e| format!("the NVIDIA driver found no usable GPU (cuInit: {e})"))?;
    let n = cuda
        .device_count()
        .map_err(|e| format!("the NVIDIA driver found no usable GPU ({e})"))?;
    if n < 1 {
        return Err("the NVIDIA driver reports no GPU".into());
    }
    let dev = cuda.device_get(0).map_err(|e| e.to_string())?;
    let name = cuda.device_name(dev).map_err(|e| e.to_string())?;
    let total = cuda.device_total_mem(dev).unwrap_or(0);
    Ok(format!(
        "{name}, {:.1} GiB",
        total as f64 / f64::from(1u32 << 30)
    ))
}

/// The folder holding this binary (symlinks resolved: a link to `dist/bin/cudaw` finds
/// `dist/lib`).
pub fn exe_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe()?.canonicalize()?;
    Ok(exe.parent().context("this binary's folder")?.to_path_buf())
}

/// The source tree this binary was built from, while it is still there.
pub fn source_tree() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.join("crates/cli/Cargo.toml")
        .is_file()
        .then(|| root.canonicalize().ok())
        .flatten()
}

/// The folders to look in for cudaw's file `rel` (relative to a `bin/`-like folder), best
/// first: beside this binary, then the source tree's `dist/bin` and release build.
pub fn beside_or_in_tree(rel: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(d) = exe_dir() {
        out.push(d.join(rel));
    }
    if let Some(root) = source_tree() {
        for bin in ["dist/bin", "target/release", "target/debug"] {
            let p = root.join(bin).join(rel);
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

/// simgpu's library: $CUDAW_SIMGPU, else `../lib/libsimgpu.so` beside this binary (dist/),
/// or the development build's (`target/PROFILE/` and its `deps/`), or the source tree's.
pub fn find_simgpu() -> Result<PathBuf> {
    let mut tried = Vec::new();
    if let Some(p) = std::env::var_os("CUDAW_SIMGPU") {
        tried.push(PathBuf::from(p));
    }
    for rel in ["../lib/libsimgpu.so", "libsimgpu.so", "deps/libsimgpu.so"] {
        tried.extend(beside_or_in_tree(rel));
    }
    for p in &tried {
        if p.is_file() {
            return Ok(p.canonicalize()?);
        }
    }
    Err(fail(
        Kind::NoDevice,
        format!(
            "no simgpu to run on: looked for {} (build it with `cargo build --release -p \
             simgpu`, or use dist/ from scripts/package.sh)",
            list(&tried)
        ),
    ))
}

/// Paths for a message.
pub fn list(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

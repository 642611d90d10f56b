//! `cudaw run`: runs a program under the drop-in runtime.
//!
//! Finds the CUDA major the program needs (its `DT_NEEDED`, or for Python the `nvidia`
//! runtime package PyTorch uses), the real runtime to forward to, and cudaw's libraries
//! beside this binary; sets `LD_PRELOAD` (which, unlike `LD_LIBRARY_PATH`, also wins over
//! an RPATH such as PyTorch's) — cudaw's `libcuda.so.1` (the driver layer) first when it is
//! there — and cudaw's variables; then replaces itself with the
//! program, so the PID, signals and exit status are the program's own.

use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use object::elf::{FileHeader64, DT_NEEDED, DT_RPATH, DT_RUNPATH};
use object::read::elf::{Dyn, FileHeader};
use object::Endianness;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs a CUDA program under cudaw.
#[derive(Debug, ClapArgs)]
#[command(
    after_help = "Examples:\n  cudaw run -- ./my_cuda_program --its-flags\n  cudaw run --mem-limit 8G -- python3 train.py\n  cudaw run --mem-limit 75% -- python3 train.py\n  cudaw run --mem-limit 0:8G,1:4G -- python3 train_on_two_gpus.py\n  cudaw run --addressing translated -- ./my_cuda_program\n  cudaw run --device sim -- ./my_cuda_program    # on simgpu, cudaw's simulated GPU\n  cudaw run --print-env -- ./my_cuda_program     # show what would be set, run nothing\n\nThe program keeps its PID: `kill -USR1 PID` pauses it, `kill -USR2 PID` resumes it.\n\nWithout a GPU (no NVIDIA driver, or a driver that finds no device), --device auto runs\nthe program on simgpu and says so once on standard error. A program that links\nlibcudart.so.N is not started when no real runtime of that major can be found (every CUDA\ncall would fail): cudaw says why and what to do, and exits 1.\n\nMemory limits: every way the program takes device memory counts (cudaMalloc and its\nkin, cudaMallocManaged, the driver's cuMemCreate as PyTorch's expandable segments use\nit, and the rounding to 2 MiB granules that cudaw adds). An allocation over the limit\nfails with the CUDA out-of-memory error, and the program can free and go on;\ncudaMemGetInfo reports the limit as the total. The processes under cudaw on one GPU,\nevery user's, also share its memory through the node ledger (CUDAW_NODE_DIR, default\n/dev/shm): limits may add up to more than the card, and an allocation the card cannot\nhold beside the others fails cleanly.\n`cudaw-ckpt status` shows each process's limit, use and peak."
)]
pub struct Args {
    #[arg(long, default_value = "auto", value_parser = crate::device::CHOICES, help = crate::device::HELP)]
    pub device: String,
    /// Cap the program's device memory: a size (bytes, or 8G, 512M, 1.5G), a share of each
    /// device's memory (75%), or per device ordinal (0:8G,1:4G; an item without an ordinal
    /// applies to the devices not named). Sets CUDAW_MEM_LIMIT.
    #[arg(long, value_name = "LIMIT", value_parser = parse_mem_limit)]
    pub mem_limit: Option<String>,
    /// How device pointers relate to device addresses.
    #[arg(long, value_parser = ["mapped", "translated"])]
    pub addressing: Option<String>,
    /// Keep the evicted bytes in a page-locked host arena as large as the program's device
    /// memory, made while it runs once its memory holds still: pauses and resumes, the
    /// first included, copy straight between it and the device at the pinned-copy speed;
    /// that much host RAM stays page-locked while the program runs. Sets CUDAW_HOST_ARENA.
    #[arg(long, value_name = "MODE", value_parser = ["pinned", "off"])]
    pub host_arena: Option<String>,
    /// How long a pause waits for the calls in flight and the device's work before it is
    /// given up and the program runs on: seconds (60, 2.5), 500ms, 2m, or off (wait for
    /// ever). Default 60 s. Sets CUDAW_PAUSE_TIMEOUT.
    #[arg(long, value_name = "TIME", value_parser = parse_pause_timeout)]
    pub pause_timeout: Option<String>,
    /// `cudaw-ckpt pause PID` releases the CUDA context too, as with --release (the
    /// driver's checkpoint, from cudaw-ckpt: NVIDIA's API is called from another
    /// process), unless told --no-release. A pause by signal (kill -USR1) cannot call it
    /// and keeps the context. Sets CUDAW_RELEASE_ON_PAUSE=1.
    #[arg(long)]
    pub release_on_pause: bool,
    /// Smart pinning: page-lock the pageable host buffers the program copies often, so that
    /// their copies run at pinned speed (off, auto, profile:FILE to also write what was
    /// seen, use:FILE to pin a profile's hot copies from the start). Preloads cudaw's
    /// host-memory interposer, which unpins a buffer before the program frees or unmaps it.
    /// Sets CUDAW_PIN (default: $CUDAW_PIN, else off).
    #[arg(long, value_name = "MODE", value_parser = parse_pin)]
    pub pin: Option<String>,
    /// The job the program belongs to for the node scheduler (`cudaw node`): its
    /// processes share the job's turns and shares as the daemon's configuration names
    /// them. Without it the program is a job of its own. Sets CUDAW_JOB.
    #[arg(long, value_name = "ID", value_parser = parse_job)]
    pub job: Option<String>,
    /// How long an allocation that does not fit waits for the node scheduler to make room
    /// before failing with out-of-memory ("30s", "500ms", "off", or "auto": 30 s when a
    /// `cudaw node` daemon runs, else no wait). Sets CUDAW_ALLOC_WAIT.
    #[arg(long, value_name = "TIME", value_parser = parse_alloc_wait)]
    pub alloc_wait: Option<String>,
    /// CUDA major of the runtime to stand in for (default: found from the program).
    #[arg(long, value_parser = ["11", "12", "13"])]
    pub cuda: Option<String>,
    /// The real libcudart to forward to (default: $CUDAW_REAL_CUDART, else found from the
    /// program, as its dynamic linker would, or in the usual CUDA folders; on simgpu,
    /// simgpu itself).
    #[arg(long, value_name = "PATH")]
    pub real_cudart: Option<PathBuf>,
    /// Folder holding cudaw's libcudart.so.* (default: $CUDAW_LIB_DIR, else ../lib beside
    /// this binary, else the build of the source tree it was built from).
    #[arg(long, value_name = "DIR")]
    pub lib_dir: Option<PathBuf>,
    /// Log level: error, warn, info, debug, trace.
    #[arg(long)]
    pub log: Option<String>,
    /// The real driver (libcuda.so.1) for cudaw's driver layer to forward to (default:
    /// found by the driver layer itself). Sets CUDAW_REAL_LIBCUDA.
    #[arg(long, value_name = "PATH")]
    pub real_libcuda: Option<PathBuf>,
    /// Leave cudaw's driver layer (its libcuda.so.1) out: only calls through the runtime
    /// are seen, paused and counted.
    #[arg(long)]
    pub no_driver_layer: bool,
    /// Print the environment cudaw would set, and run nothing.
    #[arg(long)]
    pub print_env: bool,
    /// The program and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<OsString>,
}

/// Checks a `--pause-timeout` value with the parser the drop-in runtime uses.
fn parse_pause_timeout(s: &str) -> std::result::Result<String, String> {
    cudaw_control::parse_timeout(s)
        .map(|_| s.trim().to_owned())
        .ok_or_else(|| format!("{s:?} is not a time ({})", cudaw_control::TIMEOUT_SYNTAX))
}

/// Checks a `--mem-limit` value with the parser the drop-in runtime uses for
/// `CUDAW_MEM_LIMIT` (which refuses every allocation when given a value this refuses).
fn parse_mem_limit(s: &str) -> std::result::Result<String, String> {
    let valid = cudaw_ledger::spec::SYNTAX;
    let limits = cudaw_ledger::MemLimits::parse(s).map_err(|e| format!("{e} (valid: {valid})"))?;
    if limits.is_empty() {
        return Err(format!("an empty limit (valid: {valid})"));
    }
    Ok(s.trim().to_owned())
}

/// The SONAME of each major's runtime.
fn soname(major: u32) -> &'static str {
    match major {
        11 => "libcudart.so.11.0",
        12 => "libcudart.so.12",
        _ => "libcudart.so.13",
    }
}

/// What an ELF file links: its DT_NEEDED names and its RPATH/RUNPATH folders.
pub fn elf_needs(path: &Path) -> Result<Option<(Vec<String>, Vec<PathBuf>)>> {
    let data = match std::fs::read(path) {
        Ok(d) => d,
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    if !data.starts_with(b"\x7fELF") {
        return Ok(None);
    }
    let header = FileHeader64::<Endianness>::parse(&*data).context("not a 64-bit ELF file")?;
    let endian = header.endian()?;
    let sections = header.sections(endian, &*data)?;
    let mut needed = Vec::new();
    let mut paths = Vec::new();
    if let Some((dynamic, link)) = sections.dynamic(endian, &*data)? {
        let strings = sections.strings(endian, &*data, link)?;
        for d in dynamic {
            let Some(tag) = d.tag32(endian) else { continue };
            let tag = i64::from(tag);
            if tag == DT_NEEDED.0 || tag == DT_RPATH.0 || tag == DT_RUNPATH.0 {
                let Ok(s) = d.string(endian, strings) else {
                    continue;
                };
                let s = String::from_utf8_lossy(s).into_owned();
                if tag == DT_NEEDED.0 {
                    needed.push(s);
                } else {
                    let origin = path.parent().unwrap_or(Path::new("."));
                    for p in s.split(':').filter(|p| !p.is_empty()) {
                        paths.push(PathBuf::from(
                            p.replace("$ORIGIN", &origin.to_string_lossy()),
                        ));
                    }
                }
            }
        }
    }
    Ok(Some((needed, paths)))
}

/// Finds an executable on `PATH` (or the path itself if it has a slash).
fn which(cmd: &Path) -> Option<PathBuf> {
    if cmd.components().count() > 1 {
        return cmd.exists().then(|| cmd.to_path_buf());
    }
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(cmd))
            .find(|c| c.is_file())
    })
}

/// The Python interpreter a command runs, if it is one (directly or through a shebang).
fn python_of(exe: &Path) -> Option<PathBuf> {
    let name = exe.file_name()?.to_string_lossy().into_owned();
    if name.starts_with("python") {
        return Some(exe.to_path_buf());
    }
    let head = std::fs::read(exe).ok()?;
    let first = head.split(|&b| b == b'\n').next()?;
    let line = String::from_utf8_lossy(first);
    let rest = line.strip_prefix("#!")?.trim();
    let mut parts = rest.split_whitespace();
    let interp = parts.next()?;
    let interp = if interp.ends_with("/env") {
        parts.next()?
    } else {
        interp
    };
    interp
        .contains("python")
        .then(|| which(Path::new(interp)).unwrap_or_else(|| PathBuf::from(interp)))
}

/// For a Python program: the major and real runtime of the `nvidia` runtime package that
/// PyTorch (or any CUDA wheel) uses, found without importing torch.
pub fn python_runtime(python: &Path) -> Option<(u32, PathBuf)> {
    let script = "import importlib.util as u\ns=u.find_spec('nvidia')\nprint('\\n'.join(s.submodule_search_locations) if s else '')";
    let out = Command::new(python).args(["-c", script]).output().ok()?;
    for dir in String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
    {
        let d = Path::new(dir);
        for (major, rel) in [
            (13, "cu13/lib/libcudart.so.13"),
            (13, "cuda_runtime/lib/libcudart.so.13"),
            (12, "cuda_runtime/lib/libcudart.so.12"),
            (11, "cuda_runtime/lib/libcudart.so.11.0"),
        ] {
            if d.join(rel).is_file() {
                return Some((major, d.join(rel)));
            }
        }
    }
    None
}

/// Where the dynamic linker would find `name` for a program with `rpaths`.
pub fn find_library(name: &str, rpaths: &[PathBuf]) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = rpaths.to_vec();
    if let Some(v) = std::env::var_os("LD_LIBRARY_PATH") {
        dirs.extend(std::env::split_paths(&v));
    }
    if let Ok(out) = Command::new("ldconfig").arg("-p").output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let line = line.trim();
            if line.starts_with(name) {
                if let Some(p) = line.split("=> ").nth(1) {
                    return Some(PathBuf::from(p.trim()));
                }
            }
        }
    }
    dirs.extend([
        PathBuf::from("/usr/local/cuda/lib64"),
        PathBuf::from("/usr/local/cuda/targets")
            .join(driver::locate::CUDA_TARGET)
            .join("lib"),
    ]);
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// cudaw's library folder: --lib-dir, $CUDAW_LIB_DIR, ../lib beside this binary, the
/// development build's target/shims/PROFILE, or the same in the source tree it was built
/// from (a `cargo install`ed cudaw).
fn lib_dir(args: &Args, major: u32) -> Result<PathBuf> {
    let name = soname(major);
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(d) = &args.lib_dir {
        candidates.push(d.clone());
    } else {
        if let Some(d) = std::env::var_os("CUDAW_LIB_DIR") {
            candidates.push(PathBuf::from(d));
        }
        let dir = crate::device::exe_dir()?;
        candidates.push(dir.join("../lib"));
        if let Some(profile) = dir.file_name() {
            candidates.push(dir.join("../shims").join(profile));
        }
        if let Some(root) = crate::device::source_tree() {
            for d in ["dist/lib", "target/shims/release", "target/shims/debug"] {
                let d = root.join(d);
                if !candidates
                    .iter()
                    .any(|c| c.canonicalize().ok() == d.canonicalize().ok())
                {
                    candidates.push(d);
                }
            }
        }
    }
    for c in &candidates {
        if c.join(name).is_file() {
            return Ok(c.canonicalize()?);
        }
    }
    bail!(
        "cannot find cudaw's {name}: looked in {} (build it with scripts/package.sh, which \
         makes dist/lib, or pass --lib-dir)",
        crate::device::list(&candidates)
    )
}

/// The real runtime of `major` for a program with `rpaths`: $CUDAW_REAL_CUDART, else where
/// the dynamic linker would find it, CUDA's and the system's folders, the `nvidia` runtime
/// package of `python3`. `Err` lists where it looked.
pub fn real_cudart(major: u32, rpaths: &[PathBuf]) -> std::result::Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("CUDAW_REAL_CUDART").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("CUDAW_REAL_CUDART={}: no such file", p.display()))
        };
    }
    let name = soname(major);
    if let Some(p) = find_library(name, rpaths) {
        return Ok(p);
    }
    if let Some(p) = driver::locate::runtime_dirs()
        .into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
    {
        return Ok(p);
    }
    for py in ["python3", "python"] {
        if let Some((m, p)) = python_runtime(Path::new(py)) {
            if m == major {
                return Ok(p);
            }
        }
    }
    // The CUDA runtime scripts/setup-cuda.sh installed into the source tree.
    if let Some(p) = crate::device::source_tree()
        .map(|root| root.join("target/cuda/lib").join(name))
        .filter(|p| p.is_file())
    {
        return Ok(p);
    }
    Err(format!(
        "looked in the program's RPATH, LD_LIBRARY_PATH, the ld.so cache, /usr/local/cuda*, \
         the system library folders, python3's nvidia packages and cudaw's target/cuda/lib \
         for {name}"
    ))
}

/// What the program links: the CUDA major of its runtime, and whether it links one
/// (dynamically); for Python, the `nvidia` runtime package's major and runtime.
struct Needs {
    /// The runtime's major (13 when unknown).
    major: u32,
    /// It links `libcudart.so.N` dynamically: without a real runtime of that major every
    /// CUDA call it makes would fail.
    links_cudart: bool,
    /// Its RPATH / RUNPATH folders.
    rpaths: Vec<PathBuf>,
    /// The real runtime found with it (Python's `nvidia` package).
    real: Option<PathBuf>,
}

fn needs(exe: &Path, cuda: Option<u32>) -> Result<Needs> {
    let mut n = Needs {
        major: cuda.unwrap_or(13),
        links_cudart: false,
        rpaths: Vec::new(),
        real: None,
    };
    if let Some(py) = python_of(exe) {
        if let Some((m, r)) = python_runtime(&py) {
            n.major = cuda.unwrap_or(m);
            if cuda.is_none_or(|c| c == m) {
                n.real = Some(r);
            }
        }
    } else if let Some((needed, rpaths)) = elf_needs(exe)? {
        n.rpaths = rpaths;
        if let Some(lib) = needed.iter().find(|n| n.starts_with("libcudart.so.")) {
            let m = if lib.starts_with("libcudart.so.11") {
                11
            } else if lib.starts_with("libcudart.so.12") {
                12
            } else {
                13
            };
            n.major = cuda.unwrap_or(m);
            n.links_cudart = true;
        } else if !needed.iter().any(|n| n.starts_with("libcuda.so")) {
            errln!(
                "cudaw: warning: {} does not link libcudart.so dynamically; build it with \
                 `nvcc -cudart shared` for cudaw to see its runtime calls",
                exe.display()
            );
        }
    }
    Ok(n)
}

/// The GPUs job `job` may run on, as the node daemon's configuration says (`gpus` in its
/// `[[job]]`, else in `[default]` for a job it does not name), asked of the user's
/// daemon, else the machine's (`/run/cudaw/node.sock`), as `CUDA_VISIBLE_DEVICES` (with `CUDA_DEVICE_ORDER=PCI_BUS_ID` where it
/// names indexes: they are nvidia-smi's). Nothing when no daemon answers, the job names
/// no GPUs, or the caller set `CUDA_VISIBLE_DEVICES` already (its choice stands; the
/// daemon's log says when a job runs elsewhere).
fn job_gpus(job: &str) -> Vec<(String, OsString)> {
    if std::env::var_os("CUDA_VISIBLE_DEVICES").is_some() {
        return Vec::new();
    }
    // The user's own daemon, else the machine's (root's).
    let mut sockets = vec![cudaw_node::default_socket()];
    let root = std::path::PathBuf::from("/run/cudaw/node.sock");
    if !sockets.contains(&root) {
        sockets.push(root);
    }
    let Some(report) = sockets
        .iter()
        .find_map(|s| cudaw_node::server::query(s).ok())
    else {
        return Vec::new();
    };
    let c = &report.config;
    let Some(gpus) = c
        .gpus
        .get(job)
        .or(c
            .default_gpus
            .as_ref()
            .filter(|_| !c.jobs.iter().any(|j| j == job)))
        .filter(|g| !g.is_empty())
    else {
        return Vec::new();
    };
    let list = gpus.join(",");
    errln!(
        "cudaw: job {job} may run on GPU {list} (cudaw node's configuration): CUDA_VISIBLE_DEVICES={list}"
    );
    let mut env = vec![("CUDA_VISIBLE_DEVICES".to_owned(), OsString::from(&list))];
    let indexes = gpus.iter().any(|g| g.trim().parse::<u32>().is_ok());
    if indexes && std::env::var_os("CUDA_DEVICE_ORDER").is_none() {
        env.push(("CUDA_DEVICE_ORDER".to_owned(), "PCI_BUS_ID".into()));
    }
    env
}

/// Runs the command (does not return on success).
pub fn run(args: &Args) -> Result<()> {
    let program = PathBuf::from(&args.command[0]);
    let exe =
        which(&program).with_context(|| format!("{}: command not found", program.display()))?;
    let cuda: Option<u32> = args.cuda.as_deref().and_then(|s| s.parse().ok());
    let needs = needs(&exe, cuda)?;
    let major = needs.major;
    let dir = lib_dir(args, major)?;
    // Where to run. A driver named in CUDAW_LIBCUDA is the user's choice: no probe.
    let target = if args.device == "auto" && std::env::var_os("CUDAW_LIBCUDA").is_some() {
        crate::device::Target::Gpu(None)
    } else {
        crate::device::choose(&args.device)?
    };
    let real = match &target {
        crate::device::Target::Sim { lib, why } => {
            if let Some(why) = why {
                errln!(
                    "cudaw: no GPU here: {why}. Running {} on simgpu, cudaw's simulated GPU \
                     ({}); --device gpu refuses instead, --device sim skips this check",
                    program.display(),
                    lib.display()
                );
            }
            // simgpu plays the real runtime too.
            Some(args.real_cudart.clone().unwrap_or_else(|| lib.clone()))
        }
        crate::device::Target::Gpu(_) => match (&args.real_cudart, &needs.real) {
            (Some(r), _) | (None, Some(r)) => Some(r.clone()),
            (None, None) => match real_cudart(major, &needs.rpaths) {
                Ok(r) => Some(r),
                Err(looked) if needs.links_cudart => {
                    return Err(crate::failure::fail(
                        crate::failure::Kind::NoDevice,
                        format!(
                            "not starting {}: it links {}, and there is no real CUDA {major} \
                             runtime for cudaw to forward to, so every CUDA call it makes \
                             would fail ({looked}). Name one with --real-cudart PATH (or \
                             CUDAW_REAL_CUDART), install one (pip install \
                             nvidia-cuda-runtime), or run on simgpu with --device sim",
                            program.display(),
                            soname(major)
                        ),
                    ));
                }
                // The drop-in runtime looks for itself (and says so if it finds none).
                Err(_) => None,
            },
        },
    };
    if let Some(r) = &real {
        if !r.is_file() {
            bail!(
                "not starting {}: the real runtime {} is no file (--real-cudart or \
                 CUDAW_REAL_CUDART)",
                program.display(),
                r.display()
            );
        }
    }
    let shim = dir.join(soname(major));
    let mut env: Vec<(String, OsString)> = Vec::new();
    // The driver layer first: preloaded, its SONAME (libcuda.so.1) is what every later
    // dlopen("libcuda.so.1") and DT_NEEDED of cuBLAS, cuDNN, NCCL and Triton resolves to,
    // whatever their RPATH says.
    let driver_shim = dir.join("libcuda.so.1");
    let mut preload = OsString::new();
    // The host-memory interposer first of all: its `free` and `munmap` must be the ones the
    // whole process calls (it calls the next ones, an allocator preloaded after it too).
    let pin = args
        .pin
        .clone()
        .or_else(|| std::env::var("CUDAW_PIN").ok())
        .filter(|p| {
            !matches!(
                cudaw_pin::Mode::parse(p.trim()),
                Ok(cudaw_pin::Mode::Off) | Err(_)
            )
        });
    if pin.is_some() {
        let hostmem = dir.join("libcudaw_hostmem.so");
        if !hostmem.is_file() {
            bail!(
                "not starting {}: smart pinning needs {}, which is not there (rebuild with \
                 scripts/build-shims.sh, or run without --pin / CUDAW_PIN)",
                program.display(),
                hostmem.display()
            );
        }
        preload.push(&hostmem);
        preload.push(":");
    }
    if !args.no_driver_layer && driver_shim.is_file() {
        preload.push(&driver_shim);
        preload.push(":");
    }
    preload.push(&shim);
    if let Some(p) = std::env::var_os("LD_PRELOAD").filter(|p| !p.is_empty()) {
        preload.push(":");
        preload.push(p);
    }
    env.push(("LD_PRELOAD".into(), preload));
    if let Some(r) = &real {
        env.push(("CUDAW_REAL_CUDART".into(), r.clone().into()));
    }
    if let Some(sim) = target.simgpu() {
        env.push(("CUDAW_LIBCUDA".into(), sim.into()));
    }
    if let Some(r) = &args.real_libcuda {
        env.push(("CUDAW_REAL_LIBCUDA".into(), r.clone().into()));
    }
    if let Some(a) = &args.addressing {
        env.push(("CUDAW_ADDRESSING".into(), a.into()));
    }
    if let Some(l) = &args.mem_limit {
        env.push(("CUDAW_MEM_LIMIT".into(), l.into()));
    }
    if let Some(a) = &args.host_arena {
        env.push(("CUDAW_HOST_ARENA".into(), a.into()));
    }
    if let Some(t) = &args.pause_timeout {
        env.push(("CUDAW_PAUSE_TIMEOUT".into(), t.into()));
    }
    if args.release_on_pause {
        env.push(("CUDAW_RELEASE_ON_PAUSE".into(), "1".into()));
    }
    if let Some(p) = &args.pin {
        env.push(("CUDAW_PIN".into(), p.into()));
    }
    if let Some(j) = &args.job {
        env.push(("CUDAW_JOB".into(), j.into()));
        env.extend(job_gpus(j));
    }
    if let Some(w) = &args.alloc_wait {
        env.push(("CUDAW_ALLOC_WAIT".into(), w.into()));
    }
    if let Some(l) = &args.log {
        env.push(("CUDAW_LOG".into(), l.into()));
    }
    if args.print_env {
        for (k, v) in &env {
            outln!("{k}={}", v.to_string_lossy())?;
        }
        return Ok(());
    }
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..]);
    for (k, v) in &env {
        cmd.env(k, v);
    }
    let err = cmd.exec();
    bail!("cannot run {}: {err}", program.display())
}

/// `--pin MODE`: off, auto, profile:FILE or use:FILE.
fn parse_pin(v: &str) -> Result<String, String> {
    cudaw_pin::Mode::parse(v).map(|_| v.to_owned())
}

/// `--alloc-wait TIME`: a time, `off` or `auto`.
fn parse_alloc_wait(v: &str) -> Result<String, String> {
    if v == "auto" || cudaw_control::parse_timeout(v).is_some() {
        Ok(v.to_owned())
    } else {
        Err(format!(
            "{v:?} is not a time ({}) or auto",
            cudaw_control::TIMEOUT_SYNTAX
        ))
    }
}

/// `--job ID`: letters, digits, `-`, `_`, `.`, `:`, at most 64.
fn parse_job(v: &str) -> Result<String, String> {
    if cudaw_control::job_id_ok(v) {
        Ok(v.to_owned())
    } else {
        Err(format!(
            "{v:?} is not a job id: 1 to 64 letters, digits, '-', '_', '.' or ':'"
        ))
    }
}

#[cfg(test)]
mod mem_limit_tests {
    use super::parse_mem_limit;

    #[test]
    fn the_option_takes_what_the_variable_takes() {
        for ok in ["8G", " 75% ", "0:8G,1:4G", "4G,1:50%", "1.5G", "100%"] {
            assert_eq!(parse_mem_limit(ok).as_deref(), Ok(ok.trim()), "{ok}");
        }
        for (bad, says) in [
            ("garbage", "\"garbage\" is not a size"),
            ("0", "0 bytes"),
            ("-1", "must be above 0"),
            ("200%", "at most 100"),
            ("0:8G,,1:4G", "empty item"),
            ("0:8G,0:4G", "two limits"),
            ("", "an empty limit"),
        ] {
            let e = parse_mem_limit(bad).unwrap_err();
            assert!(
                e.contains(says) && e.contains("(valid: a size above 0"),
                "{bad}: {e}"
            );
            // The drop-in runtime refuses the same values in CUDAW_MEM_LIMIT.
            if !bad.is_empty() {
                assert!(cudaw_ledger::MemLimits::parse(bad).is_err(), "{bad}");
            }
        }
    }
}

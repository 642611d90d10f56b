//! Helpers for cudaw's integration tests: finding the real CUDA compiler, compiling the
//! test programs (cached under `target/cuda-programs/`, keyed by a hash of source, headers
//! and flags), and running a program under cudaw's drop-in runtime on simgpu through the
//! real launcher, `cudaw run`.
//!
//! What the tests need, and where it comes from:
//!
//! | what | where |
//! | --- | --- |
//! | `nvcc` | `$CUDAW_CUDA_BIN` or `target/cuda/bin` (`scripts/setup-cuda.sh`); absent: the test is skipped with a message, or fails when `CUDAW_REQUIRE_CUDA_TOOLS` is set |
//! | `libcudart.so.13` (the shim) | `target/shims/debug/` (`scripts/build-shims.sh`, which `scripts/test.sh` runs first); absent: the test fails saying so |
//! | `libsimgpu.so` | the test binary's `deps/` folder (simgpu is a dev-dependency) |
//! | `cudaw`, `cudaw-ckpt` | `target/PROFILE/` beside the test binary, built with `cargo build -p cudaw-cli --bins` on first use |

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lies in the workspace")
        .to_path_buf()
}

/// The test programs' folder, `tests/cuda/programs`.
pub fn programs_dir() -> PathBuf {
    workspace().join("tests/cuda/programs")
}

/// The names of the test programs (`tests/cuda/programs/NAME.cu`), sorted.
pub fn program_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(programs_dir())
        .expect("reading tests/cuda/programs")
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".cu").map(str::to_owned)
        })
        .collect();
    names.sort();
    names
}

/// The flags every test program is compiled with.
pub const NVCC_FLAGS: [&str; 3] = ["-arch=sm_90", "-cudart", "shared"];

/// The real `nvcc`, or `None` (after printing why) when it is absent and
/// `CUDAW_REQUIRE_CUDA_TOOLS` is unset. Panics when it is set and nvcc is absent.
pub fn nvcc() -> Option<PathBuf> {
    let bin = std::env::var_os("CUDAW_CUDA_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/cuda/bin"));
    // nvcc finds its headers relative to its real location: resolve the symlinks.
    match bin.join("nvcc").canonicalize() {
        Ok(p) if p.is_file() => Some(p),
        _ => {
            if std::env::var_os("CUDAW_REQUIRE_CUDA_TOOLS").is_some() {
                panic!(
                    "CUDAW_REQUIRE_CUDA_TOOLS is set but nvcc is missing under {} \
                     (run scripts/setup-cuda.sh)",
                    bin.display()
                );
            }
            eprintln!(
                "SKIPPED: no nvcc under {} (run scripts/setup-cuda.sh, or set CUDAW_CUDA_BIN)",
                bin.display()
            );
            None
        }
    }
}

/// FNV-1a, 64 bits: a stable cache key.
fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Compiles the CUDA source file `src` (whose `#include "common.h"` resolves in
/// `tests/cuda/programs`) into an executable named `name`, with [`NVCC_FLAGS`]; cached by
/// a hash of the source, `common.h`, the flags and the compiler's path.
pub fn compile(nvcc: &Path, name: &str, src: &Path) -> PathBuf {
    let include = programs_dir();
    let mut key = std::fs::read(src).unwrap_or_else(|e| panic!("reading {}: {e}", src.display()));
    key.extend(std::fs::read(include.join("common.h")).unwrap_or_default());
    key.extend(format!("{NVCC_FLAGS:?} {}", nvcc.display()).as_bytes());
    let dir = workspace()
        .join("target/cuda-programs")
        .join(format!("{name}-{:016x}", fnv(&key)));
    let exe = dir.join(name);
    if exe.is_file() {
        return exe;
    }
    // Build in a private folder, then rename it into place: parallel tests and test
    // processes never see a half-written executable.
    let tmp = private_dir(&dir);
    let out = Command::new(nvcc)
        .args(NVCC_FLAGS)
        .arg("-I")
        .arg(&include)
        .arg("-o")
        .arg(tmp.join(name))
        .arg(src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", nvcc.display()));
    assert!(
        out.status.success(),
        "nvcc failed on {}:\n{}{}",
        src.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    publish(&tmp, &dir);
    assert!(exe.is_file(), "{} missing after compiling", exe.display());
    exe
}

/// A fresh folder beside `dir` that only this call uses.
fn private_dir(dir: &Path) -> PathBuf {
    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.with_extension(format!("tmp{}-{seq}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).expect("creating a build folder");
    tmp
}

/// Renames `tmp` to `dir`, unless another test process got there first.
fn publish(tmp: &Path, dir: &Path) {
    if std::fs::rename(tmp, dir).is_err() {
        let _ = std::fs::remove_dir_all(tmp);
    }
}

/// Compiles the CUDA source `src` into a fatbin for sm_90 (`nvcc --fatbin`): a module image
/// for `cuModuleLoadData`. Cached like [`compile`].
pub fn compile_fatbin(nvcc: &Path, name: &str, src: &Path) -> PathBuf {
    let mut key = std::fs::read(src).unwrap_or_else(|e| panic!("reading {}: {e}", src.display()));
    key.extend(format!("--fatbin -arch=sm_90 {}", nvcc.display()).as_bytes());
    let dir = workspace()
        .join("target/cuda-programs")
        .join(format!("{name}-fatbin-{:016x}", fnv(&key)));
    let out = dir.join(format!("{name}.fatbin"));
    if out.is_file() {
        return out;
    }
    let tmp = private_dir(&dir);
    let o = Command::new(nvcc)
        .args(["--fatbin", "-arch=sm_90", "-o"])
        .arg(tmp.join(format!("{name}.fatbin")))
        .arg(src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", nvcc.display()));
    assert!(
        o.status.success(),
        "nvcc --fatbin failed on {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    publish(&tmp, &dir);
    assert!(out.is_file(), "{} missing after compiling", out.display());
    out
}

/// Compiles `tests/cuda/programs/NAME.cu`.
pub fn compile_program(nvcc: &Path, name: &str) -> PathBuf {
    compile(nvcc, name, &programs_dir().join(format!("{name}.cu")))
}

/// Compiles a program given as text (a test's own), saved first as
/// `target/cuda-programs/NAME-HASH/NAME.cu`.
pub fn compile_text(nvcc: &Path, name: &str, source: &str) -> PathBuf {
    let dir = workspace()
        .join("target/cuda-programs")
        .join(format!("{name}-src-{:016x}", fnv(source.as_bytes())));
    let src = dir.join(format!("{name}.cu"));
    if !src.is_file() {
        let tmp = private_dir(&dir);
        std::fs::write(tmp.join(format!("{name}.cu")), source).expect("writing the source");
        publish(&tmp, &dir);
    }
    compile(nvcc, name, &src)
}

/// The folder cargo put the running test binary in (`target/PROFILE/deps`).
fn deps_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent().expect("deps folder").to_path_buf()
}

/// `libsimgpu.so`, built by cargo into the test binary's `deps/` folder (simgpu is a
/// dev-dependency).
pub fn simgpu() -> PathBuf {
    let deps = deps_dir();
    [deps.join("libsimgpu.so"), deps.join("../libsimgpu.so")]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("libsimgpu.so not found in {}", deps.display()))
}

/// cudaw's drop-in runtimes, `target/shims/debug` (built by `scripts/build-shims.sh`).
/// Panics with the command to run when they are missing.
pub fn shims() -> PathBuf {
    let dir = workspace().join("target/shims/debug");
    let lib = dir.join("libcudart.so.13");
    assert!(
        lib.is_file(),
        "{} is missing: build the drop-in runtimes first with scripts/build-shims.sh \
         (scripts/test.sh does)",
        lib.display()
    );
    dir
}

/// The `cudaw` launcher beside the test binary (`target/PROFILE/cudaw`), brought up to
/// date with `cargo build -p cudaw-cli --bins` once per test process.
pub fn cudaw() -> PathBuf {
    cli_dir().join("cudaw")
}

/// `cudaw-ckpt` beside the test binary (`target/PROFILE/cudaw-ckpt`), built as [`cudaw`] is.
pub fn cudaw_ckpt() -> PathBuf {
    cli_dir().join("cudaw-ckpt")
}

/// The folder holding `cudaw` and `cudaw-ckpt`, both brought up to date once per test
/// process.
fn cli_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let profile_dir = deps_dir().parent().expect("profile folder").to_path_buf();
        let target_dir = profile_dir.parent().expect("target folder").to_path_buf();
        let profile = profile_dir
            .file_name()
            .expect("profile name")
            .to_string_lossy()
            .into_owned();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(workspace())
            .args(["build", "-q", "-p", "cudaw-cli", "--bins"])
            .arg("--target-dir")
            .arg(&target_dir);
        match profile.as_str() {
            "debug" => {}
            "release" => {
                cmd.arg("--release");
            }
            other => {
                cmd.args(["--profile", other]);
            }
        }
        let out = cmd.output().expect("running cargo build for cudaw");
        assert!(
            out.status.success(),
            "building cudaw and cudaw-ckpt failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for bin in ["cudaw", "cudaw-ckpt"] {
            let exe = profile_dir.join(bin);
            assert!(exe.is_file(), "{} missing after cargo build", exe.display());
        }
        profile_dir
    })
    .clone()
}

/// How device pointers relate to device addresses (`cudaw run --addressing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addressing {
    /// The pointer is the device address.
    Mapped,
    /// Pointers come from vmm's translated range.
    Translated,
}

impl Addressing {
    /// The `--addressing` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Addressing::Mapped => "mapped",
            Addressing::Translated => "translated",
        }
    }
}

/// A finished run: exit status, output, and the shim's log.
#[derive(Debug)]
pub struct Run {
    /// What the process returned.
    pub output: Output,
}

impl Run {
    /// Standard output, as text.
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    /// Standard error, as text.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    /// Panics, showing both streams, unless the run exited 0.
    pub fn assert_success(&self, what: &str) {
        assert!(
            self.output.status.success(),
            "{what} failed ({}):\n--- stdout\n{}--- stderr\n{}",
            self.output.status,
            self.stdout(),
            self.stderr()
        );
    }

    /// What follows `marker` on the first line of standard error that holds it.
    pub fn after(&self, marker: &str) -> Option<String> {
        self.stderr()
            .lines()
            .find_map(|l| l.split_once(marker).map(|(_, rest)| rest.to_owned()))
    }

    /// The device pointers the shim handed out, from its `CUDAW_LOG=debug` lines
    /// (`allocated N bytes at 0x…`).
    pub fn allocations(&self) -> Vec<u64> {
        self.stderr()
            .lines()
            .filter_map(|l| {
                let rest = l.split_once("] debug: allocated ")?.1;
                let hex = rest.split_once(" at 0x")?.1;
                let hex = hex.split(|c: char| !c.is_ascii_hexdigit()).next()?;
                u64::from_str_radix(hex, 16).ok()
            })
            .collect()
    }
}

/// The command that runs `program` under cudaw on simgpu: `cudaw run --lib-dir
/// target/shims/debug --real-cudart libsimgpu.so --addressing MODE -- PROGRAM`, with
/// `CUDAW_LIBCUDA` naming simgpu too and `CUDAW_LOG=debug`, plus `env`.
pub fn command_under_cudaw(
    program: &Path,
    addressing: Addressing,
    env: &[(&str, &str)],
) -> Command {
    let sim = simgpu();
    let mut cmd = Command::new(cudaw());
    cmd.arg("run")
        .arg("--lib-dir")
        .arg(shims())
        .arg("--real-cudart")
        .arg(&sim)
        .args(["--addressing", addressing.as_str(), "--"])
        .arg(program)
        .env("CUDAW_LIBCUDA", &sim)
        .env("CUDAW_NODE_DIR", node_dir())
        .env("CUDAW_LOG", "debug")
        // A small simulated device: the programs need well under 1 GiB.
        .env("SIMGPU_MEM", "4G")
        .env_remove("LD_PRELOAD");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// The node-ledger folder of this test process's programs (`CUDAW_NODE_DIR`, under
/// `target/tmp`): a simulated device has the same UUID in every process, and the programs
/// of tests run by other test processes (or other clones) must not share one card's
/// accounting with them. A test that needs another folder sets the variable itself.
pub fn node_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = workspace()
            .join("target/tmp")
            .join(format!("node-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating the node-ledger folder");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .expect("making the node-ledger folder private");
        dir
    })
}

/// Runs `program` natively on simgpu, to completion: simgpu plays `libcudart.so.13` (linked
/// in a private folder on `LD_LIBRARY_PATH`), with the simulated device's memory as under
/// cudaw ([`command_under_cudaw`]).
pub fn run_natively(program: &Path) -> Run {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    let lib = LIB.get_or_init(|| {
        let dir = workspace()
            .join("target/tmp")
            .join(format!("native-runtime-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating the native runtime's folder");
        std::os::unix::fs::symlink(simgpu(), dir.join("libcudart.so.13"))
            .expect("linking simgpu as the runtime");
        // And as the driver, for a program that loads it itself.
        std::os::unix::fs::symlink(simgpu(), dir.join("libcuda.so.1"))
            .expect("linking simgpu as the driver");
        dir
    });
    let output = Command::new(program)
        .env("LD_LIBRARY_PATH", lib)
        .env("SIMGPU_MEM", "4G")
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    Run { output }
}

/// Runs `program` under cudaw on simgpu ([`command_under_cudaw`]) to completion.
pub fn run_under_cudaw(program: &Path, addressing: Addressing, env: &[(&str, &str)]) -> Run {
    let mut cmd = command_under_cudaw(program, addressing, env);
    Run {
        output: cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}")),
    }
}

/// The expected output of program `name` (`tests/cuda/programs/NAME.expected`).
pub fn expected(name: &str) -> String {
    let path = programs_dir().join(format!("{name}.expected"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (a passing run's output is the reference: the program checks its \
             results against the CPU and fails on any mismatch)",
            path.display()
        )
    })
}

/// A child process killed and reaped when dropped, whether the test passed or failed: no
/// test leaves a program behind (a paused one would wait for ever).
pub struct KillOnDrop(pub std::process::Child);

impl std::ops::Deref for KillOnDrop {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // Harmless for a child that has exited and been waited for.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits up to `limit` for `child` to exit; `None` if it is still running then.
pub fn wait_timeout(
    child: &mut std::process::Child,
    limit: std::time::Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().expect("waiting for a child") {
            return Some(s);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// The tests' seeded random choices (xorshift64*): a printed seed replays them.
pub struct Rng(pub u64);

impl Rng {
    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Sleeps up to `max` microseconds.
    pub fn sleep_us(&mut self, max: u64) {
        std::thread::sleep(std::time::Duration::from_micros(self.below(max)));
    }
}

/// A copy of `cudaw-ckpt` that another user can run (the clone may sit in a private
/// folder that user cannot enter), in a 0755 folder of its own, removed when dropped.
pub struct CkptForOthers {
    dir: PathBuf,
    /// The copy.
    pub exe: PathBuf,
}

impl Drop for CkptForOthers {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Copies `cudaw-ckpt` where every user can run it ([`CkptForOthers`]).
pub fn cudaw_ckpt_for_others(tag: &str) -> CkptForOthers {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("cudaw-ckpt-bin-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating a folder for the copy");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let exe = dir.join("cudaw-ckpt");
    // Copied by `cp`, never opened for writing in this process: a child another test thread
    // forks while this process held the copy open would keep the descriptor until its exec,
    // and exec'ing the copy meanwhile fails with "Text file busy" (ETXTBSY).
    let status = Command::new("cp")
        .arg(cudaw_ckpt())
        .arg(&exe)
        .status()
        .expect("running cp");
    assert!(status.success(), "copying cudaw-ckpt: cp {status}");
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    CkptForOthers { dir, exe }
}

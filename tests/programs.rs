//! Every program in `tests/cuda/programs/`, compiled by the real nvcc, run under cudaw's
//! drop-in runtime on simgpu (playing both the real runtime and the driver) in both
//! addressing modes, through the real launcher (`cudaw run`). Each program checks its own
//! results against the CPU and exits non-zero on any mismatch; its standard output must
//! equal `NAME.expected`. `CUDAW_BLESS=1` rewrites the expected files from passing runs.
//!
//! Each run also shows that cudaw was in the path: its log says it forwards to simgpu and
//! manages the device's memory, and the pointers it handed out lie in vmm's translated
//! range exactly when addressing is translated.

use cudaw_tests::{
    compile_program, compile_text, expected, nvcc, program_names, run_under_cudaw, shims, simgpu,
    Addressing, Run,
};
use std::process::Command;

/// The programs this file tests; checked against the folder.
const PROGRAMS: [&str; 16] = [
    "ckpt_target",
    "cudaw_demo",
    "exit_race",
    "hotcold",
    "malloc_async",
    "multithread",
    "pageable_copy",
    "pause_stress",
    "pause_target",
    "peer_copy",
    "pin_copy",
    "pin_driver_copy",
    "reduction",
    "streams_events",
    "struct_of_pointers",
    "vector_add",
];

fn in_translated_range(p: u64) -> bool {
    let base = vmm::config::DEFAULT_TRANSLATED_BASE;
    p >= base && p - base < vmm::config::DEFAULT_TRANSLATED_SIZE
}

/// Asserts the log shows cudaw forwarding to simgpu and managing memory with
/// `addressing`, and that every pointer it handed out is (translated) or is not (mapped)
/// in the translated range.
fn assert_cudaw_was_there(run: &Run, addressing: Addressing) {
    let log = run.stderr();
    assert!(
        log.contains("info: forwarding") && log.contains("libsimgpu.so"),
        "the shim did not say it forwards to simgpu:\n{log}"
    );
    let mode = match addressing {
        Addressing::Mapped => "cudaw manages its memory (Mapped addressing",
        Addressing::Translated => "cudaw manages its memory (Translated addressing",
    };
    assert!(log.contains(mode), "no {mode:?} in the log:\n{log}");
    let pointers = run.allocations();
    assert!(!pointers.is_empty(), "no allocations logged:\n{log}");
    for p in pointers {
        assert_eq!(
            in_translated_range(p),
            addressing == Addressing::Translated,
            "pointer {p:#x} with {addressing:?} addressing"
        );
    }
}

fn check_program(name: &str, addressing: Addressing) {
    let Some(nvcc) = nvcc() else { return };
    let exe = compile_program(&nvcc, name);
    let run = run_under_cudaw(&exe, addressing, &[]);
    run.assert_success(&format!("{name} ({addressing:?})"));
    assert_cudaw_was_there(&run, addressing);
    let path = cudaw_tests::programs_dir().join(format!("{name}.expected"));
    if std::env::var_os("CUDAW_BLESS").is_some() {
        std::fs::write(&path, run.stdout()).expect("writing the expected output");
    }
    assert_eq!(
        run.stdout(),
        expected(name),
        "{name} ({addressing:?}): output differs from {}",
        path.display()
    );
}

macro_rules! programs {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn mapped() {
                    super::check_program(stringify!($name), cudaw_tests::Addressing::Mapped);
                }

                #[test]
                fn translated() {
                    super::check_program(stringify!($name), cudaw_tests::Addressing::Translated);
                }
            }
        )*
        #[test]
        fn the_list_is_the_folder() {
            assert_eq!(vec![$(stringify!($name)),*], PROGRAMS);
        }
    };
}

programs!(
    ckpt_target,
    cudaw_demo,
    exit_race,
    hotcold,
    malloc_async,
    multithread,
    pageable_copy,
    pause_stress,
    pause_target,
    peer_copy,
    pin_copy,
    pin_driver_copy,
    reduction,
    streams_events,
    struct_of_pointers,
    vector_add,
);

#[test]
fn every_program_is_tested_and_has_expected_output() {
    assert_eq!(
        program_names(),
        PROGRAMS,
        "tests/cuda/programs/*.cu and this file's list differ"
    );
    for name in PROGRAMS {
        let path = cudaw_tests::programs_dir().join(format!("{name}.expected"));
        assert!(path.is_file(), "{} missing", path.display());
    }
}

/// A kernel simgpu has no host function for: the launch fails with
/// cudaErrorInvalidDeviceFunction (98), recorded as the last error and cleared by reading
/// it, and simgpu names the kernel on stderr.
const UNKNOWN_KERNEL: &str = r#"
#include <cstdio>
#include <cuda_runtime.h>
__global__ void mystery_kernel(int* p) { p[0] = 1; }
int main() {
  int* d;
  if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) return 3;
  mystery_kernel<<<1, 1>>>(d);
  cudaError_t e = cudaGetLastError();
  std::printf("launch: %d %s\n", (int)e, cudaGetErrorName(e));
  std::printf("after: %d\n", (int)cudaGetLastError());
  std::printf("free: %d\n", (int)cudaFree(d));
  return 0;
}
"#;

#[test]
fn an_unknown_kernel_fails_to_launch_naming_it() {
    let Some(nvcc) = nvcc() else { return };
    let exe = compile_text(&nvcc, "unknown_kernel", UNKNOWN_KERNEL);
    for addressing in [Addressing::Mapped, Addressing::Translated] {
        let run = run_under_cudaw(&exe, addressing, &[]);
        run.assert_success("unknown_kernel");
        assert_eq!(
            run.stdout(),
            "launch: 98 cudaErrorInvalidDeviceFunction\nafter: 0\nfree: 0\n"
        );
        assert!(
            run.stderr().contains("_Z14mystery_kernelPi"),
            "stderr does not name the kernel:\n{}",
            run.stderr()
        );
    }
}

/// A kernel that touches memory that is not the device's faults like a GPU's: the launch
/// itself returns success, the next synchronisation reports cudaErrorIllegalAddress (700),
/// and the error is sticky: reading it does not clear it and later calls fail with it.
const FAULTING_KERNEL: &str = r#"
#include <cstdio>
#include <cuda_runtime.h>
__global__ void vector_add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}
int main() {
  float* d;
  if (cudaMalloc(&d, 256 * sizeof(float)) != cudaSuccess) return 3;
  static float host[256];
  // The launch's own result: the kernel may already have faulted on simgpu's stream
  // worker by the time cudaGetLastError would run.
  float* h = host;
  int n = 256;
  void* args[] = {&d, &d, &h, &n};
  std::printf("launch: %d\n", (int)cudaLaunchKernel((const void*)vector_add, dim3(1), dim3(256), args, 0, 0));
  std::printf("sync: %d\n", (int)cudaDeviceSynchronize());
  std::printf("last: %d\n", (int)cudaGetLastError());
  std::printf("again: %d\n", (int)cudaGetLastError());
  void* p = nullptr;
  std::printf("malloc: %d\n", (int)cudaMalloc(&p, 64));
  return 0;
}
"#;

#[test]
fn a_kernel_fault_is_sticky() {
    let Some(nvcc) = nvcc() else { return };
    let exe = compile_text(&nvcc, "faulting_kernel", FAULTING_KERNEL);
    let run = run_under_cudaw(&exe, Addressing::Mapped, &[]);
    run.assert_success("faulting_kernel");
    assert_eq!(
        run.stdout(),
        "launch: 0\nsync: 700\nlast: 700\nagain: 700\nmalloc: 700\n"
    );
    assert!(
        run.stderr()
            .contains("kernel _Z10vector_addPKfS0_Pfi: a write of 1024 bytes"),
        "stderr does not describe the fault:\n{}",
        run.stderr()
    );
}

/// With a real runtime that does not exist, the program fails cleanly: a non-zero exit and
/// a message naming what cudaw tried, not a crash.
#[test]
fn a_missing_real_runtime_fails_cleanly() {
    let Some(nvcc) = nvcc() else { return };
    let exe = compile_program(&nvcc, "vector_add");
    let out = Command::new(&exe)
        .env("LD_PRELOAD", shims().join("libcudart.so.13"))
        .env("CUDAW_REAL_CUDART", "/nonexistent/libcudart.so.13")
        .env("CUDAW_LIBCUDA", simgpu())
        .env_remove("CUDAW_LOG")
        .output()
        .expect("running vector_add");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code().is_some_and(|c| c != 0),
        "expected a clean non-zero exit, got {} with:\n{stderr}",
        out.status
    );
    assert!(
        stderr.contains("cannot find the real libcudart.so.13")
            && stderr.contains("/nonexistent/libcudart.so.13"),
        "stderr does not say what is missing:\n{stderr}"
    );
    assert!(out.stdout.is_empty(), "the program got to print results");
}

/// `cudaw run` on a command that does not exist exits non-zero and says so.
#[test]
fn cudaw_run_on_a_missing_command_fails_clearly() {
    let out = Command::new(cudaw_tests::cudaw())
        .args(["run", "--lib-dir"])
        .arg(shims())
        .args(["--", "/nonexistent/program"])
        .output()
        .expect("running cudaw");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code().is_some_and(|c| c != 0),
        "{}: {stderr}",
        out.status
    );
    assert!(
        stderr.contains("/nonexistent/program") && stderr.contains("not found"),
        "stderr does not name the missing command:\n{stderr}"
    );
}

//! Each build exports exactly the real runtime's set for its major, every symbol under the
//! version node named after the SONAME, and forwards to the real runtime.
//!
//! Needs `scripts/build-shims.sh` (the three builds) and `scripts/setup-cuda.sh` (the real
//! runtimes from the Python package index); `scripts/test.sh` runs both first.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root")
}

fn required() -> bool {
    std::env::var_os("CUDAW_REQUIRE_CUDA_TOOLS").is_some()
}

/// `nm -D --defined-only` as sorted "TYPE NAME" lines, without the absolute symbol GNU ld
/// adds for each version node (`A libcudart.so.13`): it is no export, rustc links with lld,
/// which does not add it, and the node itself is checked through `readelf -V`.
fn dynamic_symbols(lib: &Path) -> Vec<String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
        .expect("run nm");
    assert!(
        out.status.success(),
        "nm {}: {}",
        lib.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace().rev();
            let name = it.next()?;
            let ty = it.next()?;
            (ty != "A").then(|| format!("{ty} {name}"))
        })
        .collect();
    v.sort();
    v
}

fn soname(lib: &Path) -> String {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(lib)
        .output()
        .expect("run readelf");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.contains("(SONAME)"))
        .and_then(|l| l.split('[').nth(1))
        .map(|s| s.trim_end_matches(']').to_owned())
        .unwrap_or_default()
}

/// The names of the version definitions other than the file's own base definition.
fn version_definitions(lib: &Path) -> Vec<String> {
    let out = Command::new("readelf")
        .arg("-V")
        .arg(lib)
        .output()
        .expect("run readelf");
    let text = String::from_utf8_lossy(&out.stdout);
    let section = text
        .split("Version definition section")
        .nth(1)
        .unwrap_or("");
    let section = section.split("Version needs section").next().unwrap_or("");
    section
        .lines()
        .filter(|l| l.contains("Flags: none"))
        .filter_map(|l| l.split("Name:").nth(1))
        .map(|s| s.trim().to_owned())
        .collect()
}

#[test]
fn every_build_exports_exactly_the_real_set_under_its_version_node() {
    let ws = workspace();
    let mut checked = 0;
    for name in ["libcudart.so.11.0", "libcudart.so.12", "libcudart.so.13"] {
        let ours = ws.join("target/shims/debug").join(name);
        let real = ws.join("target/cuda/lib").join(name);
        if !ours.exists() || !real.exists() {
            assert!(
                !required(),
                "missing {} or {}",
                ours.display(),
                real.display()
            );
            eprintln!("skipping {name}: run scripts/build-shims.sh and scripts/setup-cuda.sh");
            continue;
        }
        assert_eq!(soname(&ours), name);
        assert_eq!(
            version_definitions(&ours),
            vec![name.to_owned()],
            "{name}: version nodes"
        );
        let (a, b) = (dynamic_symbols(&ours), dynamic_symbols(&real));
        // Beside the runtime's exports, cudaw's own: the hook, handle, memory and tracing
        // tables its driver layer looks up (driver::hooks), and the tracing switch.
        let own: Vec<_> = a.iter().filter(|s| s.contains(" cudaw_")).collect();
        assert!(
            own.len() == 5
                && own.iter().any(|s| s.starts_with("T cudaw_trace_active_v1"))
                && own
                    .iter()
                    .any(|s| s.starts_with("T cudaw_runtime_trace_v1"))
                && own
                    .iter()
                    .any(|s| s.starts_with("T cudaw_runtime_memory_v1"))
                && own
                    .iter()
                    .any(|s| s.starts_with("T cudaw_runtime_handles_v1"))
                && own
                    .iter()
                    .any(|s| s.starts_with("T cudaw_runtime_hooks_v1")),
            "{name}: cudaw's own exports: {own:?}"
        );
        let only_ours: Vec<_> = a
            .iter()
            .filter(|s| !b.contains(s) && !s.contains(" cudaw_"))
            .collect();
        let only_real: Vec<_> = b.iter().filter(|s| !a.contains(s)).collect();
        assert!(
            only_ours.is_empty() && only_real.is_empty(),
            "{name}: only in cudaw: {only_ours:?}; only in the real runtime: {only_real:?}"
        );
        assert!(a
            .iter()
            .filter(|s| s.starts_with("T ") && !s.contains(" cudaw_"))
            .all(|s| s.ends_with(&format!("@@{name}"))));
        checked += 1;
    }
    assert!(checked == 3 || !required());
}

#[test]
fn forwards_to_the_real_runtime_and_fails_cleanly_without_it() {
    let ws = workspace();
    let ours = ws.join("target/shims/debug/libcudart.so.13");
    let real = ws.join("target/cuda/lib/libcudart.so.13");
    if !ours.exists() || !real.exists() {
        assert!(
            !required(),
            "missing {} or {}",
            ours.display(),
            real.display()
        );
        return;
    }
    let probe = build_probe();
    let out = Command::new(&probe)
        .arg(&ours)
        .env("CUDAW_REAL_CUDART", &real)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "probe failed: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // cudaRuntimeGetVersion answers from the real runtime: 13xxx.
    let rt: Vec<i64> = text.lines().find(|l| l.starts_with("rt ")).unwrap()[3..]
        .split(' ')
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(rt[0], 0);
    assert!((13000..14000).contains(&rt[1]), "{text}");
    assert!(text.contains("es out of memory"), "{text}");

    let out = Command::new(&probe)
        .arg(&ours)
        .env("CUDAW_REAL_CUDART", "/nonexistent/libcudart.so.13")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("rt 801 0"), "{text}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot find the real libcudart.so.13"));
}

/// A small C program that dlopens a runtime and calls three functions through it.
fn build_probe() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let src = dir.join("probe.c");
    let exe = dir.join("probe");
    std::fs::write(
        &src,
        r#"#include <stdio.h>
#include <dlfcn.h>
typedef int (*iptr_t)(int*); typedef const char* (*es_t)(int);
int main(int argc, char** argv) {
  void* h = dlopen(argv[1], RTLD_NOW);
  if (!h) { printf("dlopen %s\n", dlerror()); return 1; }
  int v = 0; int r = ((iptr_t)dlsym(h, "cudaRuntimeGetVersion"))(&v); printf("rt %d %d\n", r, v);
  printf("es %s\n", ((es_t)dlsym(h, "cudaGetErrorString"))(2));
  int n = -1; r = ((iptr_t)dlsym(h, "cudaGetDeviceCount"))(&n); printf("dc %d %d\n", r, n);
  return 0;
}
"#,
    )
    .unwrap();
    let st = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-ldl")
        .status()
        .unwrap();
    assert!(st.success());
    exe
}

/// `exports/register-args.txt` (the exports the tracing fast path calls from its own
/// frame) is what `scripts/gen-register-args.py` finds in the CUDA 13 and 11.8 headers
/// today: the compiler's reading of every prototype, not a list kept by hand.
#[test]
fn register_args_list_matches_the_headers() {
    let root = workspace();
    if !root.join("target/cuda/include/cuda_runtime_api.h").exists() {
        assert!(!required(), "no CUDA headers (run scripts/setup-cuda.sh)");
        eprintln!("skipped: no CUDA headers (run scripts/setup-cuda.sh)");
        return;
    }
    let out = Command::new("python3")
        .arg(root.join("scripts/gen-register-args.py"))
        .arg("--check")
        .output()
        .expect("run scripts/gen-register-args.py");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The exports a PyTorch step calls most are among them; the launches (grid and block
    // by value, two arguments on the stack) and the 2D copies (eight arguments) are not.
    let list =
        std::fs::read_to_string(root.join("crates/cudart-shim/exports/register-args.txt")).unwrap();
    let has = |n: &str| list.lines().any(|l| l == n);
    for n in [
        "cudaGetDevice",
        "cudaGetLastError",
        "cudaMemcpyAsync",
        "cudaStreamIsCapturing",
    ] {
        assert!(has(n), "{n} missing");
    }
    for n in [
        "cudaLaunchKernel",
        "__cudaLaunchKernel",
        "cudaMemcpy2DAsync",
        "cudaMalloc3D",
    ] {
        assert!(!has(n), "{n} listed");
    }
}

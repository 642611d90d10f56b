//! `cudaw demo` on simgpu (there is no GPU here): the example runs natively and under
//! cudaw, is paused, resumed, dumped and restored, and its results must match, with the
//! device memory released while paused. Checked through `--json` (the example compiled by
//! the test, translated addressing) and through the steps printed for people (the example
//! compiled by the demo itself with nvcc from its built-in source, simgpu found beside
//! `cudaw`), plus the clear failure of `--device gpu` without a GPU.

use cudaw_tests::{compile_program, cudaw, nvcc, simgpu};
use serde_json::Value;
use std::process::{Command, Output};

fn demo(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(cudaw());
    cmd.arg("demo")
        .args(args)
        .env_remove("LD_PRELOAD")
        .env_remove("CUDAW_LOG")
        .env_remove("CUDAW_SIMGPU")
        .env_remove("CUDAW_REAL_CUDART")
        // No GPU: never pick up a real driver, whatever the machine has.
        .env("SIMGPU_MEM", "4G");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running cudaw demo")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn json_summary_on_simgpu() {
    let Some(nvcc) = nvcc() else { return };
    let exe = compile_program(&nvcc, "cudaw_demo");
    let sim = simgpu();
    let out = demo(
        &[
            "--device",
            "sim",
            "--json",
            "--mib",
            "8",
            "--iterations",
            "40",
            "--addressing",
            "translated",
            "--program",
            exe.to_str().unwrap(),
        ],
        &[("CUDAW_SIMGPU", sim.to_str().unwrap())],
    );
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "cudaw demo failed ({}):\n{stdout}\n{}",
        out.status,
        text(&out.stderr)
    );
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{stdout:?}: {e}"));
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["device"]["kind"], "simgpu", "{v}");
    assert_eq!(v["addressing"], "translated", "{v}");
    assert_eq!(v["program"]["found"], "given", "{v}");
    assert_eq!(v["results_match"], true, "{v}");
    assert_eq!(v["memory_released"], true, "{v}");
    assert_eq!(v["held_while_paused"], true, "{v}");
    let want = "cudaw_demo mib=8 iters=40 checksum=";
    let native = v["native"]["result"].as_str().unwrap_or_default();
    assert!(native.starts_with(want), "{v}");
    assert_eq!(v["cudaw"]["result"], v["native"]["result"], "{v}");
    // The example's memory: 8 MiB + 256 KiB, all of it evicted, dumped and restored.
    let bytes = (8u64 << 20) + (1 << 18);
    assert_eq!(v["pause"]["bytes"].as_u64(), Some(bytes), "{v}");
    assert_eq!(v["pause"]["allocations"].as_u64(), Some(2), "{v}");
    assert_eq!(v["resume"]["bytes"].as_u64(), Some(bytes), "{v}");
    assert_eq!(v["dump"]["bytes"].as_u64(), Some(bytes), "{v}");
    assert_eq!(v["restore"]["bytes"].as_u64(), Some(bytes), "{v}");
    let held = &v["device_bytes"];
    assert!(held["running"].as_u64() >= Some(bytes), "{v}");
    assert_eq!(held["paused"].as_u64(), Some(0), "{v}");
    assert_eq!(held["dumped"].as_u64(), Some(0), "{v}");
    assert_eq!(held["resumed"], held["running"], "{v}");
    assert_eq!(held["restored"], held["running"], "{v}");
    // The temporary folder (image, socket, log) is gone.
    let image = v["dump"]["path"].as_str().unwrap();
    assert!(!std::path::Path::new(image).exists(), "{image} left behind");
}

#[test]
fn steps_for_people_with_the_example_compiled_by_the_demo() {
    let Some(nvcc) = nvcc() else { return };
    let bin = nvcc.parent().unwrap().to_str().unwrap().to_owned();
    let keep = std::env::temp_dir().join(format!("cudaw-demo-test-{}", std::process::id()));
    let out = demo(
        &[
            "--device",
            "auto",
            "--mib",
            "4",
            "--iterations",
            "30",
            "--keep",
            keep.to_str().unwrap(),
        ],
        &[("CUDAW_CUDA_BIN", &bin), ("PATH", "/usr/bin:/bin")],
    );
    let stdout = text(&out.stdout);
    let result = std::panic::catch_unwind(|| {
        assert!(
            out.status.success(),
            "cudaw demo failed ({}):\n{stdout}\n{}",
            out.status,
            text(&out.stderr)
        );
        // Compiled by the demo, unless the clone holds a packaged one (scripts/package.sh
        // puts it in dist/share/cudaw, where the demo looks first).
        let compiled = !stdout.contains("(prebuilt)");
        if compiled {
            assert!(stdout.contains("compiled with "), "{stdout}");
        }
        for step in [
            "device   simgpu",
            "[1/7] native run",
            "[3/7] pause",
            "device memory held: ",
            " -> 0 bytes",
            "the program is held",
            "[5/7] dump",
            "[6/7] restore",
            "PASS: the same result",
            // Without a GPU, said plainly; and where the binaries are (not on PATH here).
            "(no GPU here: ",
            "simgpu stands in for it)",
            "cudaw and cudaw-ckpt are in ",
        ] {
            assert!(stdout.contains(step), "no {step:?} in:\n{stdout}");
        }
        // --keep keeps the image, the log and the compiled example.
        for f in ["demo.img", "cudaw.log", "example/cudaw_demo"] {
            if f.starts_with("example/") && !compiled {
                continue;
            }
            assert!(keep.join(f).is_file(), "{f} not kept in {}", keep.display());
        }
    });
    let _ = std::fs::remove_dir_all(&keep);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn no_gpu_is_a_clear_error() {
    let out = demo(&["--device", "gpu", "--json"], &[]);
    // On a machine with a GPU this test has nothing to show.
    if out.status.success() {
        return;
    }
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).expect("--json failure");
    assert_eq!(v["ok"], false, "{v}");
    let e = v["error"].as_str().unwrap();
    assert!(e.contains("--device gpu, but no GPU is usable"), "{e}");
    assert!(
        text(&out.stderr).contains("cudaw: error: --device gpu"),
        "{}",
        text(&out.stderr)
    );
}

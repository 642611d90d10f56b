//! `cudaw fatbin` on a real nvcc-built executable: `--json` parses and equals the library's
//! answer; `--sm` picks the driver's image; bad inputs give clear errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// nvcc (symlinks resolved: it finds its headers next to its real location), or `None` after
/// printing why, unless `CUDAW_REQUIRE_CUDA_TOOLS` is set.
fn nvcc() -> Option<PathBuf> {
    let bin = std::env::var_os("CUDAW_CUDA_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/cuda/bin"));
    match bin.join("nvcc").canonicalize() {
        Ok(p) => Some(p),
        Err(_) if std::env::var_os("CUDAW_REQUIRE_CUDA_TOOLS").is_some() => {
            panic!(
                "CUDAW_REQUIRE_CUDA_TOOLS is set but nvcc is missing under {}",
                bin.display()
            )
        }
        Err(_) => {
            eprintln!("SKIPPED: no nvcc under {}", bin.display());
            None
        }
    }
}

fn build(nvcc: &Path, dir: &Path) -> PathBuf {
    let out = dir.join("layouts_basic");
    let src = workspace().join("tests/cuda/layouts_basic.cu");
    let st = Command::new(nvcc)
        .args([
            "-cudart",
            "shared",
            "-gencode",
            "arch=compute_80,code=sm_80",
        ])
        .args(["-gencode", "arch=compute_90,code=[sm_90,compute_90]", "-o"])
        .arg(&out)
        .arg(src)
        .status()
        .unwrap();
    assert!(st.success());
    out
}

fn cudaw(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cudaw"))
        .arg("fatbin")
        .args(args)
        .output()
        .unwrap()
}

fn tempdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("cudaw-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn json_matches_the_library() {
    let Some(nvcc) = nvcc() else { return };
    let dir = tempdir();
    let exe = build(&nvcc, &dir);
    let out = cudaw(&[exe.as_os_str(), "--json".as_ref()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let items = v["kernels"].as_array().unwrap();

    let bytes = std::fs::read(&exe).unwrap();
    let fb = fatbin::Fatbin::parse(&bytes).unwrap();
    let mut expected = Vec::new();
    for e in fb.loadable_entries() {
        expected.extend(e.kernels().unwrap());
    }
    assert_eq!(items.len(), expected.len());
    for (item, k) in items.iter().zip(&expected) {
        assert_eq!(item["name"], k.name.as_str());
        assert_eq!(item["sm"], k.sm.unwrap());
        assert_eq!(item["source"], k.source.as_str());
        let params: Vec<(u64, u64, u64)> = item["params"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["ordinal"].as_u64().unwrap(),
                    p["offset"].as_u64().unwrap(),
                    p["size"].as_u64().unwrap(),
                )
            })
            .collect();
        let want: Vec<(u64, u64, u64)> = k
            .params
            .iter()
            .map(|p| (p.ordinal.into(), p.offset.into(), p.size.into()))
            .collect();
        assert_eq!(params, want, "{}", k.name);
    }
    assert!(items.iter().any(|i| i["source"] == "ptx"));
    assert!(items.iter().any(|i| i["sm"] == 80));

    // --sm 86 runs the sm_80 cubin; --sm 100 JITs the compute_90 PTX.
    for (sm, source, want_sm) in [("86", "elf", 80), ("100", "ptx", 90)] {
        let out = cudaw(&[
            exe.as_os_str(),
            "--json".as_ref(),
            "--sm".as_ref(),
            sm.as_ref(),
        ]);
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let items = v["kernels"].as_array().unwrap();
        assert_eq!(items.len(), 10, "--sm {sm}");
        assert!(
            items
                .iter()
                .all(|i| i["source"] == source && i["sm"] == want_sm),
            "--sm {sm}"
        );
    }

    // The table names kernels both ways.
    let out = cudaw(&[exe.as_os_str()]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("outer::inner::namespaced(float*, int)"),
        "{text}"
    );
    assert!(text.contains("_ZN5outer5inner10namespacedEPfi"));

    // A corrupt copy: the error names the file.
    let corrupt = dir.join("corrupt");
    let mut b = bytes.clone();
    let at = fb.entries()[1].offset as usize;
    b[at + 8..at + 16].copy_from_slice(&u64::MAX.to_le_bytes()); // payload size runs off the end
    std::fs::write(&corrupt, b).unwrap();
    let out = cudaw(&[corrupt.as_os_str()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("corrupt") && err.contains("truncated"),
        "{err}"
    );

    // An image found corrupt part-way through the listing: the kernels before it are out,
    // and under --json the one object on standard output is closed with the failure.
    let loadable = fb.loadable_entries();
    let with_kernels = loadable
        .iter()
        .position(|e| !e.kernels().unwrap().is_empty())
        .unwrap();
    let second = loadable[with_kernels + 1];
    let at = (second.offset + u64::from(second.header_size)) as usize;
    let mut b = bytes.clone();
    b[at..at + 4].copy_from_slice(b"oops"); // the zstd frame's or the ELF's magic
    std::fs::write(&corrupt, b).unwrap();
    for threads in ["1", "3"] {
        let out = cudaw(&[
            corrupt.as_os_str(),
            "--json".as_ref(),
            "--threads".as_ref(),
            threads.as_ref(),
        ]);
        assert_eq!(out.status.code(), Some(1), "--threads {threads}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        assert_eq!(v["ok"], false);
        assert_eq!(v["kind"], "bad_input");
        let first: usize = loadable[..=with_kernels]
            .iter()
            .map(|e| e.kernels().unwrap().len())
            .sum();
        assert_eq!(v["kernels"].as_array().unwrap().len(), first, "{v}");
        let error = v["error"].as_str().unwrap();
        assert!(error.contains(&format!("{:#x}", second.offset)), "{error}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn clear_errors() {
    let out = cudaw(&["/nonexistent/file".as_ref()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/nonexistent/file") && err.contains("cannot read"),
        "{err}"
    );

    // An ELF file without device code: this test binary.
    let me = std::env::current_exe().unwrap();
    let out = cudaw(&[me.as_os_str()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no .nv_fatbin"), "{err}");

    let dir = tempdir();
    let text = dir.join("notes.txt");
    std::fs::write(&text, "\u{1}\u{2} not a binary").unwrap();
    let out = cudaw(&[text.as_os_str()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unrecognised image"));

    let out = Command::new(env!("CARGO_BIN_EXE_cudaw"))
        .args(["fatbin", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("--sm") && help.contains("JSON shape"),
        "{help}"
    );
}

//! Compiles `tests/cuda/layouts_*.cu` with the real nvcc in many forms and checks that every
//! kernel layout this crate reads equals what `cuobjdump -elf` prints for the same file, and
//! that PTX-derived layouts equal cubin-derived ones.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use fatbin::{Compression, EntryKind, Fatbin};

const FIXTURES: &[&str] = &["layouts_basic.cu", "layouts_templates.cu"];

/// (label, nvcc flags, output file name).
type Form = (&'static str, &'static [&'static str], &'static str);
const FORMS: &[Form] = &[
    ("default executable", &["-cudart", "shared"], "a.out"),
    (
        "sm_90 executable",
        &["-arch=sm_90", "-cudart", "shared"],
        "a.out",
    ),
    (
        "several gencodes with PTX",
        &[
            "-fatbin",
            "-gencode",
            "arch=compute_80,code=sm_80",
            "-gencode",
            "arch=compute_90,code=[sm_90,compute_90]",
        ],
        "k.fatbin",
    ),
    (
        "zstd",
        &["-fatbin", "-arch=sm_90", "-Xfatbin", "-compress-all"],
        "k.fatbin",
    ),
    (
        "lz4",
        &[
            "-fatbin",
            "-arch=sm_90",
            "--compress-mode=speed",
            "-Xfatbin",
            "-compress-all",
        ],
        "k.fatbin",
    ),
    (
        "uncompressed",
        &["-fatbin", "-arch=sm_90", "-Xfatbin", "-compress=false"],
        "k.fatbin",
    ),
    (
        "compress-mode none",
        &["-fatbin", "-arch=sm_90", "--compress-mode=none"],
        "k.fatbin",
    ),
    ("rdc object", &["-c", "-rdc=true", "-arch=sm_90"], "k.o"),
    (
        "rdc executable",
        &["-rdc=true", "-arch=sm_90", "-cudart", "shared"],
        "a.out",
    ),
    (
        "shared library",
        &[
            "-shared",
            "-Xcompiler",
            "-fPIC",
            "-arch=sm_90",
            "-cudart",
            "shared",
        ],
        "lib.so",
    ),
    ("sm_90a cubin", &["-cubin", "-arch=sm_90a"], "k.cubin"),
    (
        "ptx only",
        &["-fatbin", "-gencode", "arch=compute_90,code=compute_90"],
        "k.fatbin",
    ),
];

/// Compiles every (fixture, form) pair, two at a time.
fn build_all(t: &Tools) -> Vec<(String, std::path::PathBuf)> {
    let jobs: Vec<(&str, &Form)> = FIXTURES
        .iter()
        .flat_map(|f| FORMS.iter().map(move |form| (*f, form)))
        .collect();
    let mut out: Vec<(String, std::path::PathBuf)> = Vec::new();
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .chunks(jobs.len().div_ceil(2))
            .map(|chunk| {
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|(src, (label, flags, file))| {
                            (format!("{src} / {label}"), nvcc(t, src, flags, file))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in handles {
            out.extend(h.join().unwrap());
        }
    });
    for src in FIXTURES {
        if let Some(c) = cu12_cubin(t, src) {
            out.push((format!("{src} / CUDA 12 ptxas cubin"), c));
        }
        if let Some(f) = cu12_fatbin(t, src) {
            out.push((format!("{src} / CUDA 12 ptxas cubin in fatbinary"), f));
        }
    }
    out
}

fn check_against_cuobjdump(t: &Tools, label: &str, path: &Path) -> usize {
    let bytes = std::fs::read(path).unwrap();
    let ours = our_layouts(&bytes);
    let theirs = cuobjdump_layouts(t, path);
    assert_eq!(
        ours,
        theirs,
        "{label}: layouts differ from cuobjdump -elf ({})",
        path.display()
    );
    ours.len()
}

#[test]
fn layouts_equal_cuobjdump_in_every_form() {
    let Some(t) = tools() else { return };
    let built = build_all(&t);
    let mut total = 0;
    for (label, path) in &built {
        let n = check_against_cuobjdump(&t, label, path);
        eprintln!("{label}: {n} kernel layouts equal cuobjdump's");
        if !label.contains("ptx only") {
            assert!(n > 0, "{label}: no kernels found");
        }
        total += n;
    }
    assert!(total > 100);
}

#[test]
fn forms_have_the_expected_shape() {
    let Some(t) = tools() else { return };
    let src = "layouts_basic.cu";
    let parse = |flags: &[&str], file: &str| std::fs::read(nvcc(&t, src, flags, file)).unwrap();

    let lz4 = parse(
        &[
            "-fatbin",
            "-arch=sm_90",
            "--compress-mode=speed",
            "-Xfatbin",
            "-compress-all",
        ],
        "k.fatbin",
    );
    let fb = Fatbin::parse(&lz4).unwrap();
    assert!(fb
        .entries()
        .iter()
        .any(|e| e.compression == Compression::Lz4 && e.kind == EntryKind::Elf));

    let zstd = parse(
        &["-fatbin", "-arch=sm_90", "-Xfatbin", "-compress-all"],
        "k.fatbin",
    );
    let fb = Fatbin::parse(&zstd).unwrap();
    assert!(fb
        .entries()
        .iter()
        .all(|e| e.compression == Compression::Zstd));

    let none = parse(
        &["-fatbin", "-arch=sm_90", "-Xfatbin", "-compress=false"],
        "k.fatbin",
    );
    let fb = Fatbin::parse(&none).unwrap();
    assert!(fb
        .entries()
        .iter()
        .all(|e| e.compression == Compression::None));

    let obj = parse(&["-c", "-rdc=true", "-arch=sm_90"], "k.o");
    let fb = Fatbin::parse(&obj).unwrap();
    assert!(fb.containers().iter().all(|c| c.relocatable));
    assert!(!fb.kernels_for_sm(90).unwrap().is_empty());

    // The raw-pointer helpers read exactly the declared lengths.
    assert_eq!(
        fatbin::container_len(&none[..16]).unwrap(),
        none.len() as u64
    );
    assert_eq!(
        fatbin::detect_image_kind(&none),
        Some(fatbin::ImageKind::Fatbin)
    );

    let a = parse(&["-arch=sm_90a", "-cubin"], "k.cubin");
    assert_eq!(
        fatbin::detect_image_kind(&a),
        Some(fatbin::ImageKind::Cubin)
    );
    let needed = match fatbin::elf_image_len(&a[..64]) {
        Err(fatbin::Error::Truncated { offset, needed, .. }) => (offset + needed) as usize,
        other => panic!("expected a request for the section headers, got {other:?}"),
    };
    assert_eq!(fatbin::elf_image_len(&a[..needed]).unwrap(), a.len() as u64);
    let fb = Fatbin::parse(&a).unwrap();
    assert_eq!(fb.input_kind(), fatbin::InputKind::Cubin);
    assert_eq!(fb.entries()[0].sm, 90);

    if let Some(c) = cu12_cubin(&t, src) {
        let cubin = fatbin::parse_cubin(&std::fs::read(c).unwrap()).unwrap();
        assert_eq!(cubin.flavour, fatbin::CubinFlavour::Legacy);
        assert_eq!(cubin.sm, Some(90));
    } else if std::env::var_os("CUDAW_REQUIRE_CUDA_TOOLS").is_some() {
        panic!("CUDA 12 ptxas missing under target/cuda/cu12");
    }
}

/// PTX layouts equal cubin layouts for the same kernels (one fatbin holding both).
#[test]
fn ptx_layouts_equal_cubin_layouts() {
    let Some(t) = tools() else { return };
    for src in FIXTURES {
        let path = nvcc(
            &t,
            src,
            &[
                "-fatbin",
                "-gencode",
                "arch=compute_90,code=[sm_90,compute_90]",
            ],
            "k.fatbin",
        );
        let bytes = std::fs::read(path).unwrap();
        let fb = Fatbin::parse(&bytes).unwrap();
        let mut elf = Vec::new();
        let mut ptx = Vec::new();
        for e in fb.entries() {
            let mut ks = e.kernels().unwrap();
            ks.sort_by(|a, b| a.name.cmp(&b.name));
            match e.kind {
                EntryKind::Elf => elf.extend(ks),
                EntryKind::Ptx => ptx.extend(ks),
                EntryKind::Other(_) => {}
            }
        }
        assert!(!ptx.is_empty(), "{src}: no PTX kernels");
        assert_eq!(elf.len(), ptx.len(), "{src}: kernel counts differ");
        for (c, p) in elf.iter().zip(&ptx) {
            assert_eq!(c.name, p.name);
            assert_eq!(c.params, p.params, "{src}: {} params differ", c.name);
            assert_eq!(
                c.param_bytes, p.param_bytes,
                "{src}: {} param bytes differ",
                c.name
            );
            if c.max_threads.is_some() {
                assert_eq!(c.max_threads, p.max_threads, "{}", c.name);
            }
        }

        // A PTX-only fatbin (JIT): its layouts equal the sm_90 cubin's.
        let path = nvcc(
            &t,
            src,
            &["-fatbin", "-gencode", "arch=compute_90,code=compute_90"],
            "k.fatbin",
        );
        let bytes = std::fs::read(path).unwrap();
        let fb = Fatbin::parse(&bytes).unwrap();
        assert!(fb.entries().iter().all(|e| e.kind == EntryKind::Ptx));
        let mut jit: Vec<_> = fb
            .kernels_for_sm(90)
            .unwrap()
            .iter()
            .map(|k| (k.name.clone(), k.params.clone(), k.param_bytes))
            .collect();
        jit.sort();
        let want: Vec<_> = elf
            .iter()
            .map(|k| (k.name.clone(), k.params.clone(), k.param_bytes))
            .collect();
        assert_eq!(jit, want, "{src}: PTX-only layouts differ from the cubin's");
    }
}

/// Image choice on real multi-arch output; PTX-only input falls back to JIT.
#[test]
fn image_choice() {
    let Some(t) = tools() else { return };
    let path = nvcc(
        &t,
        "layouts_templates.cu",
        &[
            "-fatbin",
            "-gencode",
            "arch=compute_80,code=sm_80",
            "-gencode",
            "arch=compute_90,code=[sm_90,compute_90]",
        ],
        "k.fatbin",
    );
    let bytes = std::fs::read(path).unwrap();
    let fb = Fatbin::parse(&bytes).unwrap();
    let pick = |sm| {
        fb.select(sm)
            .iter()
            .map(|e| (e.kind, e.sm))
            .collect::<Vec<_>>()
    };
    assert_eq!(pick(90), vec![(EntryKind::Elf, 90)]);
    assert_eq!(pick(86), vec![(EntryKind::Elf, 80)]);
    assert_eq!(pick(80), vec![(EntryKind::Elf, 80)]);
    assert_eq!(pick(100), vec![(EntryKind::Ptx, 90)]);
    assert_eq!(pick(75), vec![]);
    let k = fb.kernel("_Z4axpyIfEvT_PKS0_PS0_i", 90).unwrap().unwrap();
    assert_eq!(k.source, fatbin::Source::Elf);
    assert_eq!(k.params.len(), 4);
    let k = fb.kernel("_Z4axpyIfEvT_PKS0_PS0_i", 120).unwrap().unwrap();
    assert_eq!(k.source, fatbin::Source::Ptx);
    assert!(fb.kernel("nope", 90).unwrap().is_none());

    let a = nvcc(
        &t,
        "layouts_basic.cu",
        &["-fatbin", "-arch=sm_90a"],
        "k.fatbin",
    );
    let bytes = std::fs::read(a).unwrap();
    let fb = Fatbin::parse(&bytes).unwrap();
    assert!(fb
        .select(90)
        .iter()
        .all(|e| e.kind == EntryKind::Elf && e.is_arch_specific()));
    // sm_91 is not sm_90a: no cubin; the arch-specific PTX is refused too; the generic one is taken.
    assert!(fb
        .select(91)
        .iter()
        .all(|e| e.kind == EntryKind::Ptx && !e.is_arch_specific()));
}

/// The cache answers the same `Arc` twice and works from several threads.
#[test]
fn cached_lookup_is_shared_across_threads() {
    let Some(t) = tools() else { return };
    let path = nvcc(
        &t,
        "layouts_basic.cu",
        &["-arch=sm_90", "-cudart", "shared"],
        "a.out",
    );
    let bytes = std::fs::read(path).unwrap();
    let fb = Fatbin::parse(&bytes).unwrap();
    let name = "_Z12big_by_value7Big8000Pi";
    let results: Vec<_> = std::thread::scope(|s| {
        (0..4)
            .map(|_| s.spawn(|| fb.kernel(name, 90).unwrap().unwrap()))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect()
    });
    assert!(results
        .windows(2)
        .all(|w| std::sync::Arc::ptr_eq(&w[0], &w[1])));
    assert_eq!(results[0].params[0].size, 8000);
    assert_eq!(results[0].param_bytes, 8008);
    let bounded = fb.kernel("_Z7boundedPi", 90).unwrap().unwrap();
    assert_eq!(bounded.max_threads, Some([128, 1, 1]));
    assert!(bounded.registers.is_some());
    let _ = Command::new("true");
}

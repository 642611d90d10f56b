//! Shared by the integration tests: finding the real CUDA tools, compiling the
//! `tests/cuda/layouts_*.cu` fixtures (cached under `target/fatbin-fixtures/`, keyed by a hash
//! of source and flags), and reading `cuobjdump -elf` output.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root")
}

pub struct Tools {
    pub bin: PathBuf,
    pub cu12_ptxas: Option<PathBuf>,
}

impl Tools {
    pub fn tool(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }
}

/// The CUDA tools, or `None` (after printing why) when they are absent and
/// `CUDAW_REQUIRE_CUDA_TOOLS` is unset. Panics when it is set and they are absent.
pub fn tools() -> Option<Tools> {
    let bin = std::env::var_os("CUDAW_CUDA_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/cuda/bin"));
    // nvcc finds its headers relative to its real location: resolve the symlinks.
    let nvcc = bin.join("nvcc").canonicalize().ok();
    let Some(nvcc) = nvcc.filter(|p| p.is_file()) else {
        if std::env::var_os("CUDAW_REQUIRE_CUDA_TOOLS").is_some() {
            panic!(
                "CUDAW_REQUIRE_CUDA_TOOLS is set but nvcc is missing under {}",
                bin.display()
            );
        }
        eprintln!(
            "SKIPPED: no nvcc under {} (run scripts/setup-cuda.sh)",
            bin.display()
        );
        return None;
    };
    let cu12 = workspace()
        .join("target/cuda/cu12/ptxas")
        .canonicalize()
        .ok();
    Some(Tools {
        bin: nvcc.parent().unwrap().to_path_buf(),
        cu12_ptxas: cu12,
    })
}

pub fn fixture(name: &str) -> PathBuf {
    workspace().join("tests/cuda").join(name)
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

pub fn run(cmd: &mut Command) -> Vec<u8> {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Runs `build(dir, out)` once per (inputs, key); later calls return the cached file.
pub fn cached(
    key: &str,
    inputs: &[&Path],
    file: &str,
    build: impl FnOnce(&Path, &Path),
) -> PathBuf {
    let mut h = key.as_bytes().to_vec();
    for i in inputs {
        h.extend(std::fs::read(i).unwrap());
    }
    let dir = workspace()
        .join("target/fatbin-fixtures")
        .join(format!("{:016x}", fnv(&h)));
    let out = dir.join(file);
    if out.is_file() {
        return out;
    }
    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.with_extension(format!("tmp{}-{seq}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    build(&tmp, &tmp.join(file));
    // Tests run on several threads (and processes) at once, and two may build the same
    // fixture: the first rename wins and the others keep its result. Never remove `dir`
    // once it holds the file: another test may be reading it right now (removing it
    // before renaming, as this once did, made a concurrent reader find nothing).
    if std::fs::rename(&tmp, &dir).is_err() {
        if !out.is_file() {
            // A leftover without the file (an interrupted run): replace it.
            let _ = std::fs::remove_dir_all(&dir);
            if std::fs::rename(&tmp, &dir).is_ok() {
                return out;
            }
        }
        let _ = std::fs::remove_dir_all(&tmp); // another test won the race
    }
    assert!(
        out.is_file(),
        "fixture {} missing after its build",
        out.display()
    );
    out
}

/// `nvcc FLAGS -o OUT SRC`, cached.
pub fn nvcc(t: &Tools, src: &str, flags: &[&str], file: &str) -> PathBuf {
    let src = fixture(src);
    let key = format!("nvcc {flags:?} {file}");
    cached(&key, &[&src], file, |dir, out| {
        run(Command::new(t.tool("nvcc"))
            .current_dir(dir)
            .args(flags)
            .arg("-o")
            .arg(out)
            .arg(&src));
    })
}

/// A CUDA 12 flavour cubin (OSABI 0x33): nvcc 13's PTX, `.version` lowered to 8.8, assembled
/// by CUDA 12.9's ptxas. `None` when that ptxas is absent.
pub fn cu12_cubin(t: &Tools, src: &str) -> Option<PathBuf> {
    let ptxas = t.cu12_ptxas.clone()?;
    let src_path = fixture(src);
    let ptx = nvcc(t, src, &["-ptx", "-arch=compute_90"], "k.ptx");
    Some(cached(
        "cu12 cubin",
        &[&src_path, &ptx],
        "k.cubin",
        |dir, out| {
            let text = std::fs::read_to_string(&ptx).unwrap();
            let lowered: String = text
                .lines()
                .map(|l| {
                    if l.starts_with(".version") {
                        ".version 8.8"
                    } else {
                        l
                    }
                })
                .collect::<Vec<_>>()
                .join("\n");
            let p = dir.join("k.ptx");
            std::fs::write(&p, lowered).unwrap();
            run(Command::new(&ptxas)
                .arg("-arch=sm_90")
                .arg("-o")
                .arg(out)
                .arg(&p));
        },
    ))
}

/// The cu12 cubin packed with `fatbinary`.
pub fn cu12_fatbin(t: &Tools, src: &str) -> Option<PathBuf> {
    let cubin = cu12_cubin(t, src)?;
    Some(cached("cu12 fatbin", &[&cubin], "k.fatbin", |_, out| {
        run(Command::new(t.tool("fatbinary"))
            .arg("--64")
            .arg(format!("--create={}", out.display()))
            .arg(format!("--image3=kind=elf,sm=90,file={}", cubin.display())));
    }))
}

/// Layouts per kernel as `cuobjdump -elf` prints them: (sm, name) → (params, param_bytes),
/// one item per kernel per cubin, sorted.
pub type Layout = (u32, String, Vec<(u32, u32, u32)>, u32);
type Params = (Vec<(u32, u32, u32)>, u32);

fn hex(s: &str) -> u32 {
    let s = s.trim();
    u32::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or_else(|_| panic!("bad hex {s:?}"))
}

fn field(line: &str, key: &str) -> u32 {
    let rest = &line[line
        .find(key)
        .unwrap_or_else(|| panic!("{key} in {line:?}"))
        + key.len()..];
    let rest = rest.trim_start().trim_start_matches(':').trim_start();
    hex(rest.split_whitespace().next().unwrap())
}

pub fn cuobjdump_layouts(t: &Tools, file: &Path) -> Vec<Layout> {
    let text =
        String::from_utf8(run(Command::new(t.tool("cuobjdump")).arg("-elf").arg(file))).unwrap();
    let mut out = Vec::new();
    let blocks: Vec<&str> = if text.contains("Fatbin elf code:") {
        text.split("Fatbin elf code:").skip(1).collect()
    } else if text.contains("Sections:") {
        vec![text.as_str()] // a bare cubin
    } else {
        Vec::new()
    };
    for block in blocks {
        let sm = block
            .lines()
            .find_map(|l| l.split(", sm=").nth(1))
            .map(|s| {
                s.split(|c: char| !c.is_ascii_digit())
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .unwrap_or(0);
        let mut kernels: BTreeMap<String, Params> = BTreeMap::new();
        let mut in_symtab = false;
        let mut section: Option<String> = None;
        let mut attr = String::new();
        for line in block.lines() {
            if line.starts_with(".section .symtab") {
                in_symtab = true;
                continue;
            }
            if line.starts_with('.') {
                in_symtab = false;
                section = line.strip_prefix(".nv.info.").map(|s| s.trim().to_owned());
                continue;
            }
            if in_symtab {
                let cols: Vec<&str> = line.split_whitespace().collect();
                if cols.len() >= 8 && cols[3] == "FUNC" && cols.contains(&"ENTRY") {
                    kernels.entry(cols.last().unwrap().to_string()).or_default();
                }
                continue;
            }
            let Some(sec) = &section else { continue };
            let l = line.trim();
            if let Some(a) = l.strip_prefix("Attribute:") {
                attr = a.trim().to_owned();
            } else if let Some(v) = l.strip_prefix("Value:") {
                let k = kernels.entry(sec.clone()).or_default();
                match attr.as_str() {
                    "EIATTR_KPARAM_INFO" | "EIATTR_KPARAM_INFO_V2" => {
                        k.0.push((field(v, "Ordinal"), field(v, "Offset"), field(v, "Size")))
                    }
                    "EIATTR_CBANK_PARAM_SIZE" => k.1 = hex(v),
                    _ => {}
                }
            }
        }
        for (name, (mut params, bytes)) in kernels {
            params.sort();
            out.push((sm, name, params, bytes));
        }
    }
    out.sort();
    out
}

/// The same, from this crate: every loadable ELF entry's kernels.
pub fn our_layouts(bytes: &[u8]) -> Vec<Layout> {
    let fb = fatbin::Fatbin::parse(bytes).expect("parse");
    let mut out = Vec::new();
    for e in fb
        .loadable_entries()
        .into_iter()
        .filter(|e| e.kind == fatbin::EntryKind::Elf)
    {
        for k in e.kernels().expect("kernels") {
            let params = k
                .params
                .iter()
                .map(|p| (p.ordinal, p.offset, p.size))
                .collect();
            out.push((e.sm, k.name, params, k.param_bytes));
        }
    }
    out.sort();
    out
}

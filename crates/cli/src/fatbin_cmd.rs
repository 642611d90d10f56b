//! `cudaw fatbin FILE [--json] [--sm N]`.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Result;

use crate::failure::{fail, Kind};
use fatbin::{Fatbin, KernelInfo};

/// Arguments of `cudaw fatbin`.
#[derive(Debug, clap::Args)]
#[command(
    long_about = "List every kernel in a CUDA binary with its parameter layout.\n\n\
FILE may be a program or shared library built by nvcc (its .nv_fatbin and __nv_relfatbin \
sections are read), an -rdc object, a raw fatbin (nvcc -fatbin; several concatenated \
containers are fine), a cubin (nvcc -cubin) or PTX text (nvcc -ptx).\n\n\
Each kernel is listed once per image that contains it: one row per kernel per cubin \
(source elf, SM of the cubin) or PTX entry (source ptx, SM = the PTX's compute_XX target). \
OFFSETS shows each parameter as ordinal:offset+size, in bytes.",
    after_help = "Examples:\n  \
cudaw fatbin ./vector_add                 all kernels of all images\n  \
cudaw fatbin ./vector_add --sm 90         what the driver would load on an sm_90 GPU\n  \
cudaw fatbin libtorch_cuda.so --sm 90 --json | jq '.kernels | length'\n\n\
JSON shape (--json): {\"kernels\": [{\"name\": MANGLED, \"demangled\": TEXT, \"sm\": 90, \
\"source\": \"elf\"|\"ptx\", \"param_bytes\": N, \"params\": [{\"ordinal\": 0, \"offset\": 0, \
\"size\": 8}, ...]}, ...]}. \"sm\" is null only for PTX text without a .target line."
)]
pub struct Args {
    /// The binary to read.
    pub file: PathBuf,
    /// Print exactly one JSON object instead of a table (on failure,
    /// {"ok":false,"kind":KIND,"error":MESSAGE}).
    #[arg(long)]
    pub json: bool,
    /// Only the images the driver would run on this SM (e.g. 90 for sm_90): per container,
    /// an exact cubin, else an older-minor cubin of the same major, else the newest PTX.
    #[arg(long, value_name = "N")]
    pub sm: Option<u32>,
}

/// Runs the subcommand, printing to stdout.
pub fn run(args: &Args) -> Result<()> {
    let path = args.file.display();
    let bytes = std::fs::read(&args.file)
        .map_err(|e| fail(Kind::Io, format!("{path}: cannot read: {e}")))?;
    let fatbin = Fatbin::parse(&bytes).map_err(|e| {
        fail(
            Kind::BadInput,
            format!("{path}: no usable device code: {e}"),
        )
    })?;
    let entries: Vec<_> = match args.sm {
        Some(sm) => fatbin.select(sm),
        None => fatbin.loadable_entries(),
    };
    let mut kernels = Vec::new();
    for entry in entries {
        let list = entry.kernels().map_err(|e| {
            fail(
                Kind::BadInput,
                format!(
                    "{path}: corrupt {:?} entry for sm_{} at offset {:#x}: {e}",
                    entry.kind, entry.sm, entry.offset
                ),
            )
        })?;
        kernels.extend(list);
    }
    let out = if args.json {
        json(&kernels)
    } else {
        table(&fatbin, &kernels, args.sm)
    };
    out!("{out}")?;
    Ok(())
}

/// The demangled form of a mangled name (the name itself for `extern "C"` kernels).
pub fn demangle(name: &str) -> String {
    cpp_demangle::Symbol::new(name)
        .ok()
        .and_then(|s| s.demangle().ok())
        .unwrap_or_else(|| name.to_owned())
}

fn json(kernels: &[KernelInfo]) -> String {
    let items: Vec<_> = kernels
        .iter()
        .map(|k| {
            serde_json::json!({
                "name": k.name,
                "demangled": demangle(&k.name),
                "sm": k.sm,
                "source": k.source.as_str(),
                "param_bytes": k.param_bytes,
                "registers": k.registers,
                "params": k.params.iter().map(|p| serde_json::json!({
                    "ordinal": p.ordinal, "offset": p.offset, "size": p.size,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let mut s = serde_json::json!({ "kernels": items }).to_string();
    s.push('\n');
    s
}

fn table(fatbin: &Fatbin<'_>, kernels: &[KernelInfo], sm: Option<u32>) -> String {
    let mut s = String::new();
    let entries = fatbin.entries();
    let _ = writeln!(
        s,
        "{} container(s), {} entr{} ({} cubin, {} PTX){}; {} kernel image(s)",
        fatbin.containers().len(),
        entries.len(),
        if entries.len() == 1 { "y" } else { "ies" },
        entries
            .iter()
            .filter(|e| e.kind == fatbin::EntryKind::Elf)
            .count(),
        entries
            .iter()
            .filter(|e| e.kind == fatbin::EntryKind::Ptx)
            .count(),
        sm.map(|n| format!(", showing what sm_{n} runs"))
            .unwrap_or_default(),
        kernels.len(),
    );
    let _ = writeln!(
        s,
        "{:<5} {:<4} {:>6} {:>6}  KERNEL (mangled name)  OFFSETS",
        "SM", "SRC", "PARAMS", "BYTES"
    );
    for k in kernels {
        let sm = k.sm.map_or_else(|| "-".to_owned(), |n| n.to_string());
        let demangled = demangle(&k.name);
        let name = if demangled == k.name {
            k.name.clone()
        } else {
            format!("{demangled}  ({})", k.name)
        };
        let offsets: Vec<String> = k
            .params
            .iter()
            .map(|p| format!("{}:{}+{}", p.ordinal, p.offset, p.size))
            .collect();
        let _ = writeln!(
            s,
            "{:<5} {:<4} {:>6} {:>6}  {}  [{}]",
            sm,
            k.source.as_str(),
            k.params.len(),
            k.param_bytes,
            name,
            offsets.join(" ")
        );
    }
    s
}

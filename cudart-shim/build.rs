//! Generates the shim's exports from the real runtime's export lists (`exports/`), the single
//! source of truth: the dispatch table over the union of every major's names, one assembly
//! trampoline per export of the selected major, and the linker version script naming the
//! SONAME's version node. Nothing here is edited by hand.

use std::collections::BTreeSet;
use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;

const MAJORS: [(&str, &str, &str); 3] = [
    ("cuda11", "cudart-11.8.exports", "libcudart.so.11.0"),
    ("cuda12", "cudart-12.9.exports", "libcudart.so.12"),
    ("cuda13", "cudart-13.5.exports", "libcudart.so.13"),
];

fn read_list(dir: &std::path::Path, file: &str) -> Vec<String> {
    let path = dir.join(file);
    println!("cargo:rerun-if-changed={}", path.display());
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let exports_dir = manifest.join("exports");

    let selected: Vec<_> = MAJORS
        .iter()
        .filter(|(feat, _, _)| env::var(format!("CARGO_FEATURE_{}", feat.to_uppercase())).is_ok())
        .collect();
    assert!(
        selected.len() == 1,
        "cudart-shim: enable exactly one of the features cuda11, cuda12, cuda13 (got {})",
        selected.len()
    );
    let (_, sel_file, soname) = *selected[0];

    let mut all = BTreeSet::new();
    for (_, file, _) in MAJORS {
        all.extend(read_list(&exports_dir, file));
    }
    let all: Vec<String> = all.into_iter().collect();
    let exported = read_list(&exports_dir, sel_file);

    // names.rs: the union, indexable; `idx::NAME` constants for wrappers.
    let mut names = String::new();
    writeln!(
        names,
        "/// Every runtime export of every supported major, sorted."
    )
    .unwrap();
    writeln!(names, "pub const ALL_NAMES: [&str; {}] = [", all.len()).unwrap();
    for n in &all {
        writeln!(names, "    {n:?},").unwrap();
    }
    writeln!(names, "];").unwrap();
    writeln!(names, "/// The SONAME (and version node) of this build.").unwrap();
    writeln!(names, "pub const SONAME: &str = {soname:?};").unwrap();
    writeln!(names, "/// How many names this build exports.").unwrap();
    writeln!(
        names,
        "pub const EXPORTED_COUNT: usize = {};",
        exported.len()
    )
    .unwrap();
    writeln!(names, "/// Index of each name in [`ALL_NAMES`].").unwrap();
    writeln!(
        names,
        "#[allow(non_upper_case_globals, dead_code, missing_docs)]"
    )
    .unwrap();
    writeln!(names, "pub mod idx {{").unwrap();
    for (i, n) in all.iter().enumerate() {
        writeln!(names, "    pub const {n}: usize = {i};").unwrap();
    }
    writeln!(names, "}}").unwrap();
    fs::write(out.join("names.rs"), names).unwrap();

    // trampolines.s: one per exported name. Fast path: one load of the gate word, then an
    // indirect jump through the dispatch table, every argument register untouched.
    let mut asm = String::new();
    writeln!(asm, ".pushsection .text.cudaw_trampolines,\"ax\",@progbits").unwrap();
    for name in &exported {
        let i = all.binary_search(name).unwrap();
        writeln!(
            asm,
            ".globl {name}\n.type {name},@function\n.p2align 4\n{name}:\n    cmpl $0, {{gate}}(%rip)\n    jne 1f\n    jmp *({{table}}+{off})(%rip)\n1:  movl ${i}, %r11d\n    jmp {{slow}}\n.size {name}, .-{name}",
            off = i * 8
        )
        .unwrap();
    }
    writeln!(asm, ".popsection").unwrap();
    fs::write(out.join("trampolines.s"), asm).unwrap();

    // The version script: every export under the SONAME's node, nothing else global.
    let mut map = format!("{soname} {{\n  global:\n");
    for n in &exported {
        writeln!(map, "    {n};").unwrap();
    }
    map.push_str("  local: *;\n};\n");
    let map_path = out.join("exports.map");
    fs::write(&map_path, map).unwrap();
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map_path.display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=build.rs");
}

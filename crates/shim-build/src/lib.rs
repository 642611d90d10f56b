//! Build-script code shared by cudaw's two cdylibs, `cudart-shim` (the runtime,
//! `libcudart.so.*`) and `driver-shim` (the driver, `libcuda.so.1`). Each exports every
//! function of the library it stands in for as a generated assembly trampoline; this crate
//! writes those trampolines, the Rust table of names they index, and the linker version
//! script, from one committed list per library (never a list written by hand).
//!
//! A trampoline is one test of the pause gate word and an indirect jump through the
//! dispatch table, every argument register untouched, so any C signature passes through:
//!
//! ```text
//! NAME:  cmpl $0, GATE(%rip)        ; or (PointerMask): mov GATE(%rip),%r11; testl $MASK,(%r11)
//!        jne 1f
//!        jmp *(TABLE+8*i)(%rip)
//! 1:     movl $i, %r11d              ; the slow path learns which export it is
//!        jmp SLOW
//! ```
#![deny(missing_docs)]

use std::fmt::Write as _;
use std::path::Path;

/// Reads a list: the first word of each line that is neither empty nor a `#` comment.
/// Tells cargo to rerun the build script when the file changes. Panics (the build fails)
/// when the file cannot be read.
pub fn read_list(path: &Path) -> Vec<String> {
    println!("cargo:rerun-if-changed={}", path.display());
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// How a trampoline reaches the gate word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateWord {
    /// `{gate}` is the `u32` gate word itself (one load).
    Direct,
    /// `{gate}` holds a pointer to the gate word (two loads), and only the given bits
    /// send a call to the slow path: the driver shim shares the runtime shim's gate once
    /// it has found it, and tests its "paused" bit alone.
    PointerMask(u32),
}

/// `names.rs`: `ALL_NAMES` (sorted), `idx::NAME` constants, `EXPORTED_COUNT`, plus the
/// caller's extra items.
pub fn names_rs(all: &[String], exported: usize, what: &str, extra: &str) -> String {
    let mut s = String::new();
    writeln!(s, "/// Every {what}, sorted.").unwrap();
    writeln!(s, "pub const ALL_NAMES: [&str; {}] = [", all.len()).unwrap();
    for n in all {
        writeln!(s, "    {n:?},").unwrap();
    }
    writeln!(s, "];").unwrap();
    writeln!(s, "/// How many names this build exports.").unwrap();
    writeln!(s, "pub const EXPORTED_COUNT: usize = {exported};").unwrap();
    writeln!(s, "/// Index of each name in [`ALL_NAMES`].").unwrap();
    writeln!(
        s,
        "#[allow(non_upper_case_globals, dead_code, missing_docs)]"
    )
    .unwrap();
    writeln!(s, "pub mod idx {{").unwrap();
    for (i, n) in all.iter().enumerate() {
        writeln!(s, "    pub const {n}: usize = {i};").unwrap();
    }
    writeln!(s, "}}").unwrap();
    s.push_str(extra);
    s
}

/// `trampolines.s`: one exported function per name of `exported` (each present in the
/// sorted `all`), with `{gate}`, `{table}` and `{slow}` left for `global_asm!` to fill.
/// With `address_table: Some(LABEL)`, also a hidden read-only array `LABEL` of every
/// trampoline's address, in `all`'s order (0 for a name not exported), filled through
/// local aliases so that no other library's definition of a name can take its place.
pub fn trampolines(
    all: &[String],
    exported: &[String],
    gate: GateWord,
    address_table: Option<&str>,
) -> String {
    let mut asm = String::new();
    writeln!(asm, ".pushsection .text.cudaw_trampolines,\"ax\",@progbits").unwrap();
    let test = match gate {
        GateWord::Direct => "    cmpl $0, {gate}(%rip)".to_owned(),
        GateWord::PointerMask(mask) => {
            format!("    mov {{gate}}(%rip), %r11\n    testl ${mask}, (%r11)")
        }
    };
    for name in exported {
        let i = all
            .binary_search(name)
            .unwrap_or_else(|_| panic!("{name} is exported but not in the names table"));
        writeln!(
            asm,
            ".globl {name}\n.type {name},@function\n.p2align 4\n{name}:\ncudaw_t{i}:\n{test}\n    jne 1f\n    jmp *({{table}}+{off})(%rip)\n1:  movl ${i}, %r11d\n    jmp {{slow}}\n.size {name}, .-{name}",
            off = i * 8
        )
        .unwrap();
    }
    writeln!(asm, ".popsection").unwrap();
    if let Some(label) = address_table {
        writeln!(
            asm,
            ".pushsection .data.rel.ro.cudaw_trampolines,\"aw\",@progbits\n.p2align 3\n.globl {label}\n.hidden {label}\n{label}:"
        )
        .unwrap();
        for (i, name) in all.iter().enumerate() {
            if exported.iter().any(|e| e == name) {
                writeln!(asm, "    .quad cudaw_t{i}").unwrap();
            } else {
                writeln!(asm, "    .quad 0").unwrap();
            }
        }
        writeln!(asm, ".popsection").unwrap();
    }
    asm
}

/// `slow.s`: the slow path every trampoline jumps to when the gate word is not zero, with
/// `%r11d` holding the export's index. It saves every argument register (integer, vector,
/// and `%rax`, which carries the vector count for varargs), calls `{resolve}(index, slot)`
/// (a Rust `extern "C" fn(u32, *mut usize) -> usize` that may block while paused; `slot` is
/// the address of the caller's return address, which tracing swaps for its return thunk;
/// a resolver may ignore it), restores them and
/// jumps to the address it returned. The stack is 16-byte aligned at the call. `{entry}`
/// names the slow path itself.
pub fn slow_path() -> String {
    [
        ".pushsection .text.cudaw_slow,\"ax\",@progbits",
        ".p2align 4",
        ".type {entry},@function",
        "{entry}:",
        "    push %rbp",
        "    mov %rsp, %rbp",
        "    push %rdi",
        "    push %rsi",
        "    push %rdx",
        "    push %rcx",
        "    push %r8",
        "    push %r9",
        "    push %rax",
        "    push %r10",
        "    sub $128, %rsp",
        "    movdqu %xmm0, 0(%rsp)",
        "    movdqu %xmm1, 16(%rsp)",
        "    movdqu %xmm2, 32(%rsp)",
        "    movdqu %xmm3, 48(%rsp)",
        "    movdqu %xmm4, 64(%rsp)",
        "    movdqu %xmm5, 80(%rsp)",
        "    movdqu %xmm6, 96(%rsp)",
        "    movdqu %xmm7, 112(%rsp)",
        "    mov %r11d, %edi",
        "    lea 8(%rbp), %rsi",
        "    call {resolve}",
        "    mov %rax, %r11",
        "    movdqu 0(%rsp), %xmm0",
        "    movdqu 16(%rsp), %xmm1",
        "    movdqu 32(%rsp), %xmm2",
        "    movdqu 48(%rsp), %xmm3",
        "    movdqu 64(%rsp), %xmm4",
        "    movdqu 80(%rsp), %xmm5",
        "    movdqu 96(%rsp), %xmm6",
        "    movdqu 112(%rsp), %xmm7",
        "    add $128, %rsp",
        "    pop %r10",
        "    pop %rax",
        "    pop %r9",
        "    pop %r8",
        "    pop %rcx",
        "    pop %rdx",
        "    pop %rsi",
        "    pop %rdi",
        "    pop %rbp",
        "    jmp *%r11",
        ".size {entry}, .-{entry}",
        ".popsection",
        "",
    ]
    .join("\n")
}

/// The linker version script: `names` global (under `node`, or unversioned when `None`),
/// everything else local.
pub fn version_script(node: Option<&str>, names: &[String]) -> String {
    let mut map = format!("{} {{\n  global:\n", node.unwrap_or(""));
    for n in names {
        writeln!(map, "    {n};").unwrap();
    }
    map.push_str("  local: *;\n};\n");
    map
}

/// Writes the version script to `out_dir/exports.map` and tells cargo to link the cdylib
/// with it, with SONAME `soname`, and never unloaded (`-z nodelete`: the trampolines and
/// the tables they read must outlive any `dlclose`).
pub fn link_cdylib(out_dir: &Path, map: &str, soname: &str) {
    let path = out_dir.join("exports.map");
    std::fs::write(&path, map).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        path.display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn trampolines_index_the_sorted_table() {
        let all = v(&["a", "b", "c"]);
        let asm = trampolines(&all, &v(&["a", "c"]), GateWord::Direct, None);
        assert!(asm.contains("c:\ncudaw_t2:\n    cmpl $0, {gate}(%rip)\n    jne 1f\n    jmp *({table}+16)(%rip)\n1:  movl $2, %r11d"));
        assert!(!asm.contains("\nb:"));
        let asm = trampolines(&all, &v(&["a", "c"]), GateWord::PointerMask(2), Some("tt"));
        assert!(asm.contains("mov {gate}(%rip), %r11\n    testl $2, (%r11)"));
        assert!(asm.contains("tt:\n    .quad cudaw_t0\n    .quad 0\n    .quad cudaw_t2\n"));
    }

    #[test]
    fn version_script_names_the_node() {
        assert_eq!(
            version_script(Some("libcudart.so.13"), &v(&["x"])),
            "libcudart.so.13 {\n  global:\n    x;\n  local: *;\n};\n"
        );
        assert!(version_script(None, &v(&["x"])).starts_with(" {\n"));
    }

    #[test]
    fn lists_skip_comments_and_keep_the_first_word() {
        let dir = std::env::temp_dir().join(format!("shim-build-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("list");
        std::fs::write(&f, "# head\n\ncuA cuA 2000 default header\n  cuB\n").unwrap();
        assert_eq!(read_list(&f), v(&["cuA", "cuB"]));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

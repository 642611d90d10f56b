//! The AArch64 (AAPCS64) forms of the generated assembly: the same symbols, gate words,
//! in-flight protocol and slow-resolve protocol as the x86-64 forms in `lib.rs`, so that
//! the Rust side of both libraries is one.
//!
//! Registers: `x0`–`x7` and `q0`–`q7` carry arguments and `x8` the address of an indirect
//! result; `x16`/`x17` (IP0/IP1) are free scratch in a trampoline. A trampoline leaves
//! every argument register and `x30` (the caller's return address) untouched and jumps
//! with `br x16`. The slow paths get the export's index in `w17`.
//!
//! The return address lives in `x30`, not on the stack: the slow path stores it in its
//! frame, passes that word's address as `slot` (at the caller's stack pointer - 8, as on
//! x86-64 the slot is just below the stack pointer the call returns with), and reloads
//! `x30` from it after the resolver, so a resolver that puts a thunk in `*slot` gets the
//! call to return into that thunk. A thunk finds `slot` as its stack pointer - 8.
//! Jumps to a return address use `ret xN` (never checked by BTI, where `br` would be).
//!
//! Not here: the counting trampolines and the assembly fast path of call timing
//! (`trace_fast_path`), whose x86-64 forms lean on that architecture's ordered stores;
//! on AArch64 a traced call takes the Rust slow path (`trace_fast_path` gives only the
//! per-thread words and an entry that goes straight to `{full}`).

use crate::{GateWord, InFlight, IDLE, IN_FLIGHT, TRACE_TLS_SIZE};
use std::fmt::Write as _;

/// The in-flight return thunk stores `xzr` for [`IDLE`].
const _: () = assert!(IDLE == 0);

/// Loads the address of the calling thread's block of initial-exec TLS symbol `sym` into
/// `dst`, with `tmp` as scratch (lines, each ending in a newline).
fn tls_address(dst: &str, tmp: &str, sym: &str) -> String {
    format!(
        "    mrs {dst}, tpidr_el0\n    adrp {tmp}, :gottprel:{sym}\n    ldr {tmp}, [{tmp}, #:gottprel_lo12:{sym}]\n    add {dst}, {dst}, {tmp}\n"
    )
}

/// Loads `{table}[i]` into `x16` and jumps there.
fn jump_table(i: usize) -> String {
    let off = i * 8;
    format!(
        "    adrp x16, {{table}}+{off}\n    ldr x16, [x16, #:lo12:{{table}}+{off}]\n    br x16\n"
    )
}

/// Tests the gate word with `x16` as scratch, branching to `label` when the call must take
/// the slow path. The word is read with acquire order (`ldar`): the table entry read next
/// must not be one from before the gate opened (x86-64 keeps loads in order by itself; an
/// AArch64 core may read the entry first, and find 0 while the library initialises). The
/// pointer form's second load depends on its first by address, which orders them.
fn gate_test(gate: GateWord, label: &str) -> String {
    match gate {
        GateWord::Direct => format!(
            "    adrp x16, {{gate}}\n    add x16, x16, #:lo12:{{gate}}\n    ldar w16, [x16]\n    cbnz w16, {label}\n"
        ),
        GateWord::PointerMask(mask) => {
            assert!(
                is_logical_immediate(mask),
                "gate mask {mask:#x} is not an AArch64 logical immediate (expected a contiguous run of set bits)"
            );
            format!(
                "    adrp x16, {{gate}}\n    ldr x16, [x16, #:lo12:{{gate}}]\n    ldar w16, [x16]\n    tst w16, #{mask:#x}\n    b.ne {label}\n"
            )
        }
    }
}

/// Whether `mask` is a contiguous run of set bits (a logical immediate `tst` takes; the
/// rotated forms are not needed here).
fn is_logical_immediate(mask: u32) -> bool {
    mask != 0 && mask != u32::MAX && {
        let run = mask >> mask.trailing_zeros();
        run & (run + 1) == 0
    }
}

/// Moves the export's index into `w17` and branches to `slow`.
fn to_slow(i: usize, slow: &str) -> String {
    assert!(
        i <= 0xffff,
        "export index {i} does not fit a movz immediate (16 bits)"
    );
    format!("    mov w17, #{i}\n    b {slow}\n")
}

/// A line naming `operands` in a comment: the x86-64 form of a file uses them and the
/// `global_asm!` call that includes it passes them, so this form must name them too
/// (`global_asm!` rejects an operand never used).
fn unused(operands: &[&str]) -> String {
    let names: Vec<String> = operands.iter().map(|o| format!("{{{o}}}")).collect();
    format!(
        "    // not used on AArch64 (the x86-64 form's): {}\n",
        names.join(" ")
    )
}

/// [`crate::trampolines`] for AArch64. `count` is accepted and ignored: every call whose
/// gate is not open goes on to `{slow}` (named in a comment so that the operand is used).
pub(crate) fn trampolines(
    all: &[String],
    exported: &[String],
    gate: GateWord,
    address_table: Option<&str>,
    in_flight: Option<InFlight<'_>>,
    count: Option<u32>,
) -> String {
    let mut asm = String::new();
    writeln!(asm, ".pushsection .text.cudaw_trampolines,\"ax\",%progbits").unwrap();
    let mut slow_used = false;
    for name in exported {
        let i = all
            .binary_search(name)
            .unwrap_or_else(|_| panic!("{name} is exported but not in the names table"));
        writeln!(
            asm,
            ".globl {name}\n.type {name},%function\n.p2align 4\n{name}:\ncudaw_t{i}:"
        )
        .unwrap();
        if let Some(f) = in_flight.filter(|f| (f.marked)(name)) {
            let p = f.prefix;
            // x17: the thread's block. Not idle: nested (2, straight on) or the thread's
            // first call (3, slow path). Idle: in flight, *then* the gate test.
            asm.push_str(&tls_address("x17", "x16", &format!("{p}_inflight_tls")));
            write!(
                asm,
                "    ldr x16, [x17]\n    cbnz x16, 2f\n    mov x16, #{IN_FLIGHT}\n    str x16, [x17]\n{test}    str x30, [x17, #8]\n    adrp x30, {p}_inflight_return\n    add x30, x30, #:lo12:{p}_inflight_return\n{jump}2:  cmp x16, #{IN_FLIGHT}\n    b.eq 4f\n3:\n{slow}4:\n{jump}",
                test = gate_test(gate, "3f"),
                jump = jump_table(i),
                slow = to_slow(i, &format!("{p}_inflight_slow")),
            )
            .unwrap();
        } else {
            write!(
                asm,
                "{test}{jump}1:\n{slow}",
                test = gate_test(gate, "1f"),
                jump = jump_table(i),
                slow = to_slow(i, "{slow}"),
            )
            .unwrap();
            slow_used = true;
        }
        writeln!(asm, ".size {name}, .-{name}").unwrap();
    }
    if !slow_used {
        asm.push_str(&unused(&["slow"]));
    }
    if count.is_some() {
        asm.push_str("    // counting trampolines: x86-64 only; the slow path counts here\n");
    }
    writeln!(asm, ".popsection").unwrap();
    if let Some(label) = address_table {
        crate::address_table_asm(&mut asm, label, all, exported, "%progbits", ".xword");
    }
    asm
}

/// The slow path's body for AArch64, entered at `entry` with the export's index in `w17`:
/// saves `x0`–`x8` and `q0`–`q7` (208 bytes, the stack kept 16-byte aligned) under a frame
/// record holding `x29` and `x30`, calls `resolve(index, slot)` with `slot` the address of
/// the saved `x30`, restores every register (`x30` from `slot`, where the resolver may
/// have put a thunk) and jumps to the address it returned.
pub(crate) fn slow_path_named(entry: &str, resolve: &str) -> String {
    [
        ".pushsection .text.cudaw_slow,\"ax\",%progbits",
        ".p2align 4",
        ".type {entry},%function",
        "{entry}:",
        "    stp x29, x30, [sp, #-16]!",
        "    mov x29, sp",
        "    sub sp, sp, #208",
        "    stp x0, x1, [sp, #0]",
        "    stp x2, x3, [sp, #16]",
        "    stp x4, x5, [sp, #32]",
        "    stp x6, x7, [sp, #48]",
        "    str x8, [sp, #64]",
        "    stp q0, q1, [sp, #80]",
        "    stp q2, q3, [sp, #112]",
        "    stp q4, q5, [sp, #144]",
        "    stp q6, q7, [sp, #176]",
        "    mov w0, w17",
        "    add x1, x29, #8",
        "    bl {resolve}",
        "    mov x16, x0",
        "    ldp q6, q7, [sp, #176]",
        "    ldp q4, q5, [sp, #144]",
        "    ldp q2, q3, [sp, #112]",
        "    ldp q0, q1, [sp, #80]",
        "    ldr x8, [sp, #64]",
        "    ldp x6, x7, [sp, #48]",
        "    ldp x4, x5, [sp, #32]",
        "    ldp x2, x3, [sp, #16]",
        "    ldp x0, x1, [sp, #0]",
        "    mov sp, x29",
        "    ldp x29, x30, [sp], #16",
        "    br x16",
        ".size {entry}, .-{entry}",
        ".popsection",
        "",
    ]
    .join("\n")
    .replace("{entry}", entry)
    .replace("{resolve}", resolve)
}

/// [`crate::in_flight_support_traced`] for AArch64: the per-thread block, the return thunk
/// (which stores [`IDLE`] with release order, after every store of the call, and returns
/// to the saved address) and the slow path calling `{inflight_resolve}`. With `trace`, the
/// x86-64 form's way into the fast path of call timing is not made (there is none here):
/// every call takes the slow path, whose resolver starts the timing.
pub(crate) fn in_flight_support_traced(prefix: &str, trace: Option<(u32, &str)>) -> String {
    let p = prefix;
    let mut s = format!(
        ".pushsection .tdata.{p}_inflight,\"awT\",%progbits
.p2align 4
.globl {p}_inflight_tls
.hidden {p}_inflight_tls
.type {p}_inflight_tls,%object
.size {p}_inflight_tls,32
{p}_inflight_tls:
    .xword {UNREGISTERED}
    .xword 0
    .xword 0
    .xword 0
.popsection
.pushsection .text.cudaw_inflight,\"ax\",%progbits
.p2align 4
.globl {p}_inflight_return
.hidden {p}_inflight_return
.type {p}_inflight_return,%function
{p}_inflight_return:
{tls}    ldr x16, [x17, #8]
    stlr xzr, [x17]
    ret x16
.size {p}_inflight_return, .-{p}_inflight_return
",
        UNREGISTERED = crate::UNREGISTERED,
        tls = tls_address("x17", "x16", &format!("{p}_inflight_tls")),
    );
    if trace.is_some() {
        s.push_str(&unused(&["gate"]));
    }
    s.push_str(".popsection\n");
    let slow = format!("{p}_inflight_slow");
    s.push_str(&format!(".globl {slow}\n.hidden {slow}\n"));
    s.push_str(&slow_path_named(&slow, "{inflight_resolve}"));
    s
}

/// [`crate::trace_fast_path`] for AArch64: the per-thread words (`PREFIX_trace_tls`) and
/// their accessors, as on x86-64, and `PREFIX_trace_enter`, which goes straight to
/// `{full}` (the Rust slow path times the call). `PREFIX_trace_return` is not made.
pub(crate) fn trace_fast_path(prefix: &str, _bits: u32) -> String {
    let p = prefix;
    let mut s = format!(
        ".pushsection .tbss.{p}_trace,\"awT\",%nobits
.p2align 3
.globl {p}_trace_tls
.hidden {p}_trace_tls
.type {p}_trace_tls,%object
.size {p}_trace_tls,{TRACE_TLS_SIZE}
{p}_trace_tls:
    .zero {TRACE_TLS_SIZE}
.popsection
.pushsection .text.cudaw_trace_fast,\"ax\",%progbits
"
    );
    s.push_str(&unused(&["gate", "table", "slow_return", "direct_full"]));
    let enter = "    b {full}\n";
    let block = tls_address("x0", "x1", &format!("{p}_trace_tls")) + "    ret\n";
    let offset = format!(
        "    adrp x0, :gottprel:{p}_trace_tls\n    ldr x0, [x0, #:gottprel_lo12:{p}_trace_tls]\n    ret\n"
    );
    for (name, body) in [
        ("enter", enter.to_owned()),
        ("block", block),
        ("tls_offset", offset),
    ] {
        let name = format!("{p}_trace_{name}");
        write!(
            s,
            ".p2align 4\n.globl {name}\n.hidden {name}\n.type {name},%function\n{name}:\n{body}.size {name}, .-{name}\n"
        )
        .unwrap();
    }
    s.push_str(".popsection\n");
    s
}

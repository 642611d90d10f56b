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
//!
//! # Calls in flight
//!
//! A pause must wait for every call that can enqueue device work ([`enqueues_device_work`]:
//! launches, copies, sets, graph launches, stream memory operations, prefetches), whichever
//! library makes it, or the work could reach the device after the pause's synchronisation.
//! Those exports get an *in-flight* trampoline instead ([`trampolines`]' `in_flight`):
//! before testing the gate it sets a per-thread word (`PREFIX_inflight_tls`, static TLS,
//! reached through `%fs`) to "in flight", and when the gate is open it saves the caller's
//! return address beside that word and replaces it with a return thunk
//! (`PREFIX_inflight_return`) that clears the word after the real call returns and jumps
//! back. The word's states: [`IDLE`], [`IN_FLIGHT`], and [`UNREGISTERED`] (its initial
//! value in every new thread: the first call takes the slow path, which registers the
//! word where pause can read it). A call made while the thread's word is already "in
//! flight" (a nested call) jumps straight on: the outer call covers the thread. Every
//! other case (gate not open, first call of a thread) goes to `PREFIX_inflight_slow`,
//! which calls `{inflight_resolve}(index, slot)` as the slow path does ([`in_flight_support`]).
//!
//! ```text
//! NAME:  movq PREFIX_inflight_tls@gottpoff(%rip), %r11
//!        cmpq $0, %fs:(%r11)          ; not idle: nested, or the thread's first call
//!        jne 2f
//!        movq $1, %fs:(%r11)          ; in flight, *then* test the gate (pause fences)
//!        cmpl $0, GATE(%rip)
//!        jne 3f
//!        pushq (%rsp)                 ; save the return address in the thread's block
//!        popq %fs:8(%r11)
//!        leaq PREFIX_inflight_return(%rip), %r11
//!        movq %r11, (%rsp)
//!        jmp *(TABLE+8*i)(%rip)
//! 2:     cmpq $1, %fs:(%r11)
//!        je 4f
//! 3:     movl $i, %r11d
//!        jmp PREFIX_inflight_slow
//! 4:     jmp *(TABLE+8*i)(%rip)
//! ```
//!
//! Pause closes the gate, then issues `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` (a
//! full barrier on every running thread of the process), then reads every registered
//! word: a thread either had its "in flight" visible by then, or it tests the gate after
//! the barrier and sees it closed. The hot path thus carries no fence.
//!
//! # Architectures
//!
//! The assembly is written for the architecture cargo builds for (`CARGO_CFG_TARGET_ARCH`
//! in a build script, [`Arch::target`]): x86-64 (AT&T syntax, as above) or AArch64
//! (`aarch64.rs`: the same symbols and protocols, with the export's index in `w17` and the
//! return address in `x30`; no counting trampolines and no assembly fast path of call
//! timing, so traced calls take the Rust slow path). The including `global_asm!` passes
//! `options(att_syntax)` on x86-64 only.
#![deny(missing_docs)]

mod aarch64;

use std::fmt::Write as _;
use std::path::Path;

/// The architecture the generated assembly is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// x86-64, System V ABI, AT&T syntax.
    X86_64,
    /// AArch64, AAPCS64 (Linux: GH200, GB200 hosts).
    Aarch64,
}

impl Arch {
    /// The architecture being built for: `CARGO_CFG_TARGET_ARCH` in a build script (which
    /// runs on the host, so `cfg!` would name the host's), else (this crate's own tests)
    /// the one this crate was built for. Panics (the build fails) for any other, naming it.
    pub fn target() -> Arch {
        let arch = std::env::var("CARGO_CFG_TARGET_ARCH")
            .unwrap_or_else(|_| std::env::consts::ARCH.to_owned());
        match arch.as_str() {
            "x86_64" => Arch::X86_64,
            "aarch64" => Arch::Aarch64,
            other => panic!(
                "shim-build: target architecture {other:?} has no trampolines (expected \"x86_64\" or \"aarch64\")"
            ),
        }
    }
}

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
/// With `count: Some(BITS)` (the gate value of [`trace_fast_path`]'s with the same
/// `BITS`; [`GateWord::Direct`] only), a plain trampoline whose gate is exactly `BITS`
/// counts the call itself, as `PREFIX_trace_enter` does an untimed call, and jumps through
/// its own table entry, as its fast path does: straight-line code with `%r10` and `%r11`
/// for scratch, no call and no shared jump (each export keeps its own indirect jump,
/// which the processor predicts). A call that is to be timed, the thread's first, or any
/// other gate value goes on to `{slow}`.
/// With `address_table: Some(LABEL)`, also a hidden read-only array `LABEL` of every
/// trampoline's address, in `all`'s order (0 for a name not exported), filled through
/// local aliases so that no other library's definition of a name can take its place.
pub fn trampolines(
    all: &[String],
    exported: &[String],
    gate: GateWord,
    address_table: Option<&str>,
    in_flight: Option<InFlight<'_>>,
    count: Option<u32>,
) -> String {
    if Arch::target() == Arch::Aarch64 {
        return aarch64::trampolines(all, exported, gate, address_table, in_flight, count);
    }
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
        if let Some(f) = in_flight.filter(|f| (f.marked)(name)) {
            let p = f.prefix;
            let tls = format!("    movq {p}_inflight_tls@gottpoff(%rip), %r11");
            // The pointer form of the gate test uses %r11: reload the word's offset after.
            let reload = match gate {
                GateWord::Direct => String::new(),
                GateWord::PointerMask(_) => format!("{tls}\n"),
            };
            writeln!(
                asm,
                ".globl {name}\n.type {name},@function\n.p2align 4\n{name}:\ncudaw_t{i}:\n{tls}\n    cmpq ${IDLE}, %fs:(%r11)\n    jne 2f\n    movq ${IN_FLIGHT}, %fs:(%r11)\n{test}\n    jne 3f\n{reload}    pushq (%rsp)\n    popq %fs:8(%r11)\n    leaq {p}_inflight_return(%rip), %r11\n    movq %r11, (%rsp)\n    jmp *({{table}}+{off})(%rip)\n2:  cmpq ${IN_FLIGHT}, %fs:(%r11)\n    je 4f\n3:  movl ${i}, %r11d\n    jmp {p}_inflight_slow\n4:  jmp *({{table}}+{off})(%rip)\n.size {name}, .-{name}",
                off = i * 8
            )
            .unwrap();
            continue;
        }
        let off = i * 8;
        let head = format!(
            ".globl {name}\n.type {name},@function\n.p2align 4\n{name}:\ncudaw_t{i}:\n{test}\n    jne 1f\n    jmp *({{table}}+{off})(%rip)\n1:"
        );
        match count {
            Some(bits) => {
                assert!(
                    matches!(gate, GateWord::Direct),
                    "counting trampolines test the gate word directly"
                );
                // The export's counters: `(count, ticks, max, timed)`, 32 bytes from the
                // thread's calls pointer (TRACE_TLS_CALLS).
                let slot = i * 32;
                let timed = slot + 24;
                writeln!(
                    asm,
                    "{head}  cmpl ${bits}, {{gate}}(%rip)\n    jne 2f\n    movq {{gate}}+{GATE_TRACE_TLS}(%rip), %r10\n    movq %fs:{TRACE_TLS_CALLS}(%r10), %r11\n    testq %r11, %r11\n    jz 2f\n    movq %fs:{TRACE_TLS_MASK}(%r10), %r10\n    testq %r10, {slot}(%r11)\n    jz 2f\n    btq $63, {timed}(%r11)\n    jc 2f\n    addq $1, {slot}(%r11)\n    jmp *({{table}}+{off})(%rip)\n2:  movl ${i}, %r11d\n    jmp {{slow}}\n.size {name}, .-{name}"
                )
                .unwrap();
            }
            None => writeln!(
                asm,
                "{head}  movl ${i}, %r11d\n    jmp {{slow}}\n.size {name}, .-{name}"
            )
            .unwrap(),
        }
    }
    writeln!(asm, ".popsection").unwrap();
    if let Some(label) = address_table {
        address_table_asm(&mut asm, label, all, exported, "@progbits", ".quad");
    }
    asm
}

/// The table of every name's trampoline address (0 for a name this build does not export),
/// under `label`: `section_type` and `word` are the target assembler's (`@progbits`/`.quad`
/// on x86-64, `%progbits`/`.xword` on AArch64).
pub(crate) fn address_table_asm(
    asm: &mut String,
    label: &str,
    all: &[String],
    exported: &[String],
    section_type: &str,
    word: &str,
) {
    writeln!(
        asm,
        ".pushsection .data.rel.ro.cudaw_trampolines,\"aw\",{section_type}\n.p2align 3\n.globl {label}\n.hidden {label}\n{label}:"
    )
    .unwrap();
    for (i, name) in all.iter().enumerate() {
        if exported.iter().any(|e| e == name) {
            writeln!(asm, "    {word} cudaw_t{i}").unwrap();
        } else {
            writeln!(asm, "    {word} 0").unwrap();
        }
    }
    writeln!(asm, ".popsection").unwrap();
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
    slow_path_named("{entry}", "{resolve}")
}

/// The slow path's body, entered at `entry`, calling `resolve`.
fn slow_path_named(entry: &str, resolve: &str) -> String {
    if Arch::target() == Arch::Aarch64 {
        return aarch64::slow_path_named(entry, resolve);
    }
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
    .replace("{entry}", entry)
    .replace("{resolve}", resolve)
}

/// A thread's in-flight word: no marked call of this library in progress.
pub const IDLE: u64 = 0;
/// A thread's in-flight word: a marked call is in progress (or about to test the gate).
pub const IN_FLIGHT: u64 = 1;
/// A thread's in-flight word before its first marked call: not yet registered.
pub const UNREGISTERED: u64 = 2;

/// Which exports get an in-flight trampoline, and the prefix of the symbols of
/// [`in_flight_support`] they use.
#[derive(Clone, Copy)]
pub struct InFlight<'a> {
    /// Symbol prefix (one per library, so that two libraries linked into one test binary
    /// never clash): `PREFIX_inflight_tls`, `PREFIX_inflight_return`, `PREFIX_inflight_slow`.
    pub prefix: &'a str,
    /// Whether the export gets an in-flight trampoline.
    pub marked: &'a dyn Fn(&str) -> bool,
}

/// Whether a call of this export (driver `cu*` or runtime `cuda*`) can enqueue device
/// work that reads or writes device memory: the calls a pause must wait for.
pub fn enqueues_device_work(name: &str) -> bool {
    const PREFIXES: [&str; 16] = [
        "cuLaunch",
        "cuMemcpy",
        "cuMemset",
        "cuGraphLaunch",
        "cuStreamWaitValue",
        "cuStreamWriteValue",
        "cuStreamBatchMemOp",
        "cuMemPrefetch",
        "cuMemDiscard",
        "cudaLaunch",
        "__cudaLaunch",
        "cudaMemcpy",
        "cudaMemset",
        "cudaGraphLaunch",
        "cudaMemPrefetch",
        "cudaMemDiscard",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Whether export `name` gets an in-flight trampoline: it [`enqueues_device_work`] and is
/// not one of `by_wrapper`, the exports whose wrappers mark them in flight themselves (so
/// that their return goes straight back to the caller, not through the trampoline's thunk).
pub fn marked_by_trampoline(name: &str, by_wrapper: &[&str]) -> bool {
    enqueues_device_work(name) && !by_wrapper.contains(&name)
}

/// `inflight.s`, for the in-flight trampolines of [`trampolines`] with this `prefix`:
///
/// - `PREFIX_inflight_tls`: the per-thread block (initial-exec TLS, 32 bytes), the word
///   (initially [`UNREGISTERED`]), the saved return address, and a word the library keeps
///   its per-thread state's address in (initially 0; the fourth is spare);
/// - `PREFIX_inflight_return`: the return thunk; it keeps the return registers, sets the
///   word to [`IDLE`] and jumps to the saved return address;
/// - `PREFIX_inflight_slow`: the slow path ([`slow_path`]'s body) calling
///   `{inflight_resolve}(index, slot)`, a Rust `extern "C" fn(u32, *mut usize) -> usize`
///   that finds the word [`IN_FLIGHT`] (gate not open) or [`UNREGISTERED`], and must leave
///   it [`IN_FLIGHT`] with the return address saved and the thunk in `*slot` (or [`IDLE`]
///   / [`UNREGISTERED`] and `*slot` untouched) before returning the target.
///
/// Rust reaches the calling thread's block through `PREFIX_inflight_tls` itself
/// (`driver::inflight_block!`: its initial-exec address computed in place).
pub fn in_flight_support(prefix: &str) -> String {
    in_flight_support_traced(prefix, None)
}

/// [`in_flight_support`], and with `trace: Some((bits, enter))` a fast way into a
/// [`trace_fast_path`]: when the gate word `{gate}` is exactly `bits` and the thread's
/// word is [`IN_FLIGHT`] (registered, the trampoline set it), the slow path saves the
/// return address and puts the in-flight thunk in its place as the open-gate trampoline
/// does, then jumps to `enter` (the trace fast path), which times the call and chains its
/// thunk before ours. Anything else takes the ordinary slow path.
pub fn in_flight_support_traced(prefix: &str, trace: Option<(u32, &str)>) -> String {
    if Arch::target() == Arch::Aarch64 {
        return aarch64::in_flight_support_traced(prefix, trace);
    }
    let p = prefix;
    let mut s = format!(
        ".pushsection .tdata.{p}_inflight,\"awT\",@progbits
.p2align 4
.globl {p}_inflight_tls
.hidden {p}_inflight_tls
.type {p}_inflight_tls,@object
.size {p}_inflight_tls,32
{p}_inflight_tls:
    .quad {UNREGISTERED}
    .quad 0
    .quad 0
    .quad 0
.popsection
.pushsection .text.cudaw_inflight,\"ax\",@progbits
.p2align 4
.globl {p}_inflight_return
.hidden {p}_inflight_return
.type {p}_inflight_return,@function
{p}_inflight_return:
    movq {p}_inflight_tls@gottpoff(%rip), %r11
    pushq %fs:8(%r11)
    movq ${IDLE}, %fs:(%r11)
    popq %r11
    jmp *%r11
.size {p}_inflight_return, .-{p}_inflight_return
.popsection
"
    );
    let slow = match trace {
        None => format!("{p}_inflight_slow"),
        Some((bits, enter)) => {
            write!(
                s,
                ".pushsection .text.cudaw_inflight,\"ax\",@progbits
.p2align 4
.globl {p}_inflight_slow
.hidden {p}_inflight_slow
.type {p}_inflight_slow,@function
{p}_inflight_slow:
    cmpl ${bits}, {{gate}}(%rip)
    jne {p}_inflight_slow_full
    push %rax
    movq {p}_inflight_tls@gottpoff(%rip), %rax
    cmpq ${IN_FLIGHT}, %fs:(%rax)
    jne 1f
    pushq 8(%rsp)
    popq %fs:8(%rax)
    leaq {p}_inflight_return(%rip), %rax
    movq %rax, 8(%rsp)
    pop %rax
    jmp {enter}
1:  pop %rax
    jmp {p}_inflight_slow_full
.size {p}_inflight_slow, .-{p}_inflight_slow
.popsection
"
            )
            .unwrap();
            format!("{p}_inflight_slow_full")
        }
    };
    s.push_str(&format!(".globl {slow}\n.hidden {slow}\n"));
    s.push_str(&slow_path_named(&slow, "{inflight_resolve}"));
    s
}

/// Offsets in the per-thread trace block of [`trace_fast_path`] (a `repr(C)` struct the
/// host library owns): the next free frame.
pub const TRACE_TOP: usize = 0;
/// Offset of the end of the frames (the stack is full when the top reaches it).
pub const TRACE_LIMIT: usize = 8;
/// Offset of the pointer to the thread's call counters: `(count, ticks, max, timed)`,
/// `u64`s, per export index.
pub const TRACE_CALLS: usize = 16;
/// Offset of the sampling mask: a call is timed when its export's count so far has none
/// of these bits (0: every call).
pub const TRACE_MASK: usize = 24;
/// Offset of the thread's timeline call buffer cursor: where the next call event goes (0:
/// none, with `metrics`). Each timed call that returns through the fast thunk writes one
/// [`TRACE_EVENT`]-byte event there, `(start ticks, duration ticks, export index)`, and
/// advances it.
pub const TRACE_EVENTS: usize = 32;
/// Offset of the buffer's soft end: a call that finds the cursor at or past it takes the
/// slow path (whose Rust side empties the buffer). The buffer has room past it for the
/// calls already on the shadow stack (at most its depth), whose thunks write unchecked.
pub const TRACE_EVENTS_END: usize = 40;
/// Size of one timeline call event.
pub const TRACE_EVENT: usize = 24;
/// Bit of an export's `timed` counter that makes the fast path time every call of it,
/// whatever the sampling mask (for calls whose caller the host library must know: an
/// allocation's creation site is the return address on the shadow stack).
pub const TRACE_ALWAYS: u64 = 1 << 63;
/// Bit of an export's `timed` counter that makes the fast path *call* it when timed,
/// instead of swapping the caller's return address for its thunk's: for exports whose
/// arguments all travel in registers (`crates/cudart-shim/exports/register-args.txt`), which
/// therefore read nothing of their caller's frame. The call and its return pair up, so
/// the processor predicts both returns (a swapped return address costs two mispredicted
/// jumps a call); the export's event is written when it returns, or, when its buffer has
/// filled meanwhile (calls nested in it), handed to `{direct_full}(index, start, ticks)`.
/// Never set with [`TRACE_ALWAYS`] (those calls need their frame on the shadow stack).
pub const TRACE_DIRECT: u64 = 1 << 62;
/// Size of one shadow-stack frame: `(slot, return address, index, start ticks)`, `u64`s.
pub const TRACE_FRAME: usize = 32;
/// The thread-local words of [`trace_fast_path`] (`PREFIX_trace_tls`): the address of the
/// thread's trace block (0 until it has one), then copies of the block's [`TRACE_CALLS`] at
/// [`TRACE_TLS_CALLS`] and [`TRACE_MASK`] at [`TRACE_TLS_MASK`], so that a call the
/// sampling leaves untimed reads no more than these words and its counter (the block is
/// read by timed calls only). The calls pointer is written last: nonzero means all three
/// are set.
pub const TRACE_TLS_SIZE: usize = 24;
/// Offset of the copy of the block's calls pointer in the thread-local words.
pub const TRACE_TLS_CALLS: usize = 8;
/// Offset of the copy of the block's sampling mask in the thread-local words.
pub const TRACE_TLS_MASK: usize = 16;
/// Offset from the gate word `{gate}` of the `u64` holding the thread-pointer offset of
/// `PREFIX_trace_tls` (the host library stores there what `PREFIX_trace_tls_offset`
/// returns before its gate word can first be exactly `bits`). The gate's cache line is
/// loaded by every call, so the fast path needs no GOT load to find its words.
pub const GATE_TRACE_TLS: usize = 8;

/// `trace.s`: the assembly fast path of call timing (`CUDAW_TRACE=metrics`), for a library
/// whose gate word is `{gate}` (a `u32`, [`GateWord::Direct`]) and whose trampolines'
/// slow path is `PREFIX_trace_enter` (pass it as their `{slow}`).
///
/// - `PREFIX_trace_tls`: [`TRACE_TLS_SIZE`] bytes of initial-exec TLS per thread: the
///   address of the thread's trace block (0: none yet) and copies of its calls pointer and
///   sampling mask, found through the thread-pointer offset at `{gate}` +
///   [`GATE_TRACE_TLS`] (`PREFIX_trace_tls_offset` returns it).
/// - `PREFIX_trace_enter` (`%r11d` = the export's index, the caller's return address at
///   `(%rsp)`): when the gate word is exactly `bits` (tracing, nothing else) and the
///   thread has a block: a call the sampling mask leaves untimed (and whose export's
///   `timed` counter lacks bit 63, [`TRACE_ALWAYS`]) only adds 1 to its count and jumps
///   on, having read the gate's line, the thread-local words and the counter; else, when
///   its shadow stack has room and holds no frame the stack has since
///   unwound (a `longjmp`), it pushes `(slot, return address, index, rdtsc)`, puts
///   `PREFIX_trace_return` in the caller's return-address slot and jumps to
///   `{table}[index]` (never 0 once the gate is that value). A timed call of an export
///   whose `timed` counter has [`TRACE_DIRECT`] is instead called from the thunk's own
///   frame (two callee-saved registers hold its start and index), counted and written
///   to the buffer when it returns, and the thunk returns to the caller itself, with
///   `%rax`/`%rdx` and every vector register as the call left them. Anything
///   else goes to `{full}`, the ordinary slow path. Only `%r11` changes (the arguments
///   and `%rax` are kept).
/// - `PREFIX_trace_return`, the thunk a fast-timed call returns into: `rdtsc`, pops the
///   top frame (when it is this call's, else `{slow_return}`, the library's own thunk, with
///   the return registers untouched), adds 1, the ticks, and the max into the thread's
///   counters (plain adds: only the thread writes them), with a timeline call buffer
///   ([`TRACE_EVENTS`]) appends the call's event to it, and jumps to the saved return
///   address, `%rax`/`%rdx` (and every vector register) as the call left them. A timed
///   call that finds the buffer at its soft end ([`TRACE_EVENTS_END`]) goes to `{full}`.
/// - `PREFIX_trace_block`: `extern "C" fn() -> *mut *mut Block`, the calling thread's
///   words.
/// - `PREFIX_trace_tls_offset`: `extern "C" fn() -> usize`, the words' thread-pointer
///   offset.
///
/// The block's layout: [`TRACE_TOP`], [`TRACE_LIMIT`], [`TRACE_CALLS`], [`TRACE_MASK`],
/// [`TRACE_EVENTS`], [`TRACE_EVENTS_END`] (without a buffer: 0 and `u64::MAX`); the frame
/// below
/// the first has the slot `u64::MAX`, so that an empty stack needs no test.
pub fn trace_fast_path(prefix: &str, bits: u32) -> String {
    if Arch::target() == Arch::Aarch64 {
        return aarch64::trace_fast_path(prefix, bits);
    }
    let p = prefix;
    let f = TRACE_FRAME;
    // A direct call's event may find the buffer full (calls nested in it filled it).
    let record_direct = record_timed_call("%rbx", "%r12", ('8', '9'), Some('6'));
    let record_return = record_timed_call("%r11", "%r10", ('2', '4'), None);
    let g = GATE_TRACE_TLS;
    let main = format!(
        ".pushsection .tbss.{p}_trace,\"awT\",@nobits
.p2align 3
.globl {p}_trace_tls
.hidden {p}_trace_tls
.type {p}_trace_tls,@object
.size {p}_trace_tls,{TRACE_TLS_SIZE}
{p}_trace_tls:
    .zero {TRACE_TLS_SIZE}
.popsection
.pushsection .text.cudaw_trace_fast,\"ax\",@progbits
.p2align 4
.globl {p}_trace_enter
.hidden {p}_trace_enter
.type {p}_trace_enter,@function
{p}_trace_enter:
    cmpl ${bits}, {{gate}}(%rip)
    jne {{full}}
    push %rax
    push %rdx
    push %rcx
    movq {{gate}}+{g}(%rip), %rcx
    movq %fs:{TRACE_TLS_CALLS}(%rcx), %rax
    testq %rax, %rax
    jz 1f
    movq %r11, %rdx
    shlq $5, %rdx
    addq %rdx, %rax
    movq (%rax), %rdx
    testq %fs:{TRACE_TLS_MASK}(%rcx), %rdx
    jz 5f
    btq $63, 24(%rax)
    jc 5f
    addq $1, (%rax)
    leaq {{table}}(%rip), %rax
    movq (%rax,%r11,8), %r11
    pop %rcx
    pop %rdx
    pop %rax
    jmp *%r11
5:  movq %fs:(%rcx), %rcx
    btq $62, 24(%rax)
    movq {TRACE_EVENTS}(%rcx), %rax
    jc 7f
    cmpq {TRACE_EVENTS_END}(%rcx), %rax
    jae 1f
    movq {TRACE_TOP}(%rcx), %rdx
    cmpq {TRACE_LIMIT}(%rcx), %rdx
    jae 1f
    leaq 24(%rsp), %rax
    cmpq %rax, -{f}(%rdx)
    jbe 1f
    leaq {f}(%rdx), %rax
    movq %rax, {TRACE_TOP}(%rcx)
    leaq 24(%rsp), %rax
    movq %rax, 0(%rdx)
    movq (%rax), %rcx
    movq %rcx, 8(%rdx)
    movq %r11, 16(%rdx)
    leaq {p}_trace_return(%rip), %rcx
    movq %rcx, (%rax)
    movq %rdx, %rcx
    leaq {{table}}(%rip), %rax
    movq (%rax,%r11,8), %r11
    rdtsc
    shlq $32, %rdx
    orq %rdx, %rax
    movq %rax, 24(%rcx)
    pop %rcx
    pop %rdx
    pop %rax
    jmp *%r11
1:  pop %rcx
    pop %rdx
    pop %rax
    jmp {{full}}
7:  cmpq {TRACE_EVENTS_END}(%rcx), %rax
    jae 1b
    push %rbx
    push %r12
    movq %r11, %r12
    leaq {{table}}(%rip), %rax
    movq (%rax,%r11,8), %r11
    rdtsc
    shlq $32, %rdx
    orq %rdx, %rax
    movq %rax, %rbx
    movq 16(%rsp), %rcx
    movq 24(%rsp), %rdx
    movq 32(%rsp), %rax
    call *%r11
    movq %rax, 32(%rsp)
    movq %rdx, 24(%rsp)
    rdtsc
    shlq $32, %rdx
    orq %rdx, %rax
    subq %rbx, %rax
    movq {{gate}}+{g}(%rip), %rcx
    movq %fs:(%rcx), %rcx
    movq %r12, %rsi
{record_direct}9:  pop %r12
    pop %rbx
    addq $8, %rsp
    pop %rdx
    pop %rax
    ret
6:  movq %r12, %rdi
    movq %rbx, %rsi
    movq %rax, %rdx
    subq $32, %rsp
    movdqu %xmm0, 0(%rsp)
    movdqu %xmm1, 16(%rsp)
    call {{direct_full}}
    movdqu 0(%rsp), %xmm0
    movdqu 16(%rsp), %xmm1
    addq $32, %rsp
    jmp 9b
.size {p}_trace_enter, .-{p}_trace_enter
.p2align 4
.globl {p}_trace_return
.hidden {p}_trace_return
.type {p}_trace_return,@function
{p}_trace_return:
    movq %rax, %r8
    movq %rdx, %r9
    rdtsc
    shlq $32, %rdx
    orq %rdx, %rax
    movq {{gate}}+{g}(%rip), %rcx
    movq %fs:(%rcx), %rcx
    movq {TRACE_TOP}(%rcx), %rdx
    leaq -8(%rsp), %rsi
    cmpq %rsi, -{f}(%rdx)
    jne 1f
    movq -8(%rdx), %r11
    subq %r11, %rax
    movq -16(%rdx), %rsi
    movq %rsi, %r10
    movq -24(%rdx), %rdi
    leaq -{f}(%rdx), %rdx
    movq %rdx, {TRACE_TOP}(%rcx)
{record_return}4:  movq %r8, %rax
    movq %r9, %rdx
    jmp *%rdi
1:  movq %r8, %rax
    movq %r9, %rdx
    jmp {{slow_return}}
.size {p}_trace_return, .-{p}_trace_return
"
    );
    let block = format!(
        "    movq {p}_trace_tls@gottpoff(%rip), %rax
    addq %fs:0, %rax
    ret
"
    );
    let offset = format!("    movq {p}_trace_tls@gottpoff(%rip), %rax\n    ret\n");
    let mut s = main;
    for (name, body) in [("block", block), ("tls_offset", offset)] {
        s.push_str(&hidden_function(&format!("{p}_trace_{name}"), &body));
    }
    s.push_str(".popsection\n");
    s
}

/// A hidden function of generated assembly: `name`, aligned, with `body` (whole lines).
fn hidden_function(name: &str, body: &str) -> String {
    format!(
        ".p2align 4\n.globl {name}\n.hidden {name}\n.type {name},@function\n{name}:\n{body}.size {name}, .-{name}\n"
    )
}

/// The end of a timed call in [`trace_fast_path`]'s thunks, with `%rcx` = the thread's
/// block, `%rax` = the call's ticks, `%rsi` = its export's index (scaled here; `index`
/// holds it too) and `start` its start: adds 1, the ticks and the max to the thread's
/// counters, and with a timeline call buffer appends the event to it (when `full` is given,
/// jumping there instead if the buffer is at its soft end). Local labels `max` and `done`
/// (`done` is the caller's, after this).
fn record_timed_call(
    start: &str,
    index: &str,
    (max, done): (char, char),
    full: Option<char>,
) -> String {
    let full = full.map_or(String::new(), |l| {
        format!("    cmpq {TRACE_EVENTS_END}(%rcx), %rdx\n    jae {l}f\n")
    });
    format!(
        "    shlq $5, %rsi
    addq {TRACE_CALLS}(%rcx), %rsi
    addq $1, (%rsi)
    addq %rax, 8(%rsi)
    addq $1, 24(%rsi)
    cmpq %rax, 16(%rsi)
    jae {max}f
    movq %rax, 16(%rsi)
{max}:  movq {TRACE_EVENTS}(%rcx), %rdx
    testq %rdx, %rdx
    jz {done}f
{full}    movq {start}, (%rdx)
    movq %rax, 8(%rdx)
    movq {index}, 16(%rdx)
    addq ${TRACE_EVENT}, %rdx
    movq %rdx, {TRACE_EVENTS}(%rcx)
"
    )
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
    link_with_lld();
}

/// Links with LLD, the one linker that takes the version script beside the anonymous one
/// rustc writes for every cdylib (GNU ld refuses the pair: "anonymous version tag cannot be
/// combined with other version tags"). rustc already uses its own LLD (`rust-lld`) for
/// x86-64 Linux; this does the same for every target, as rustc does: `-B` the toolchain's
/// `gcc-ld` folder (its `ld.lld` runs `rust-lld`) and `-fuse-ld=lld`. Without that folder
/// (a distribution's rustc), `-fuse-ld=lld` alone finds `ld.lld` on `PATH`.
fn link_with_lld() {
    let host = std::env::var("HOST").unwrap_or_default();
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let sysroot = std::process::Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let gcc_ld = sysroot.map(|s| Path::new(&s).join(format!("lib/rustlib/{host}/bin/gcc-ld")));
    match gcc_ld.filter(|d| d.join("ld.lld").is_file()) {
        Some(dir) => println!("cargo:rustc-cdylib-link-arg=-B{}", dir.display()),
        None => println!(
            "cargo:warning=no rust-lld in {rustc}'s sysroot (lib/rustlib/{host}/bin/gcc-ld/ld.lld): linking with the ld.lld on PATH"
        ),
    }
    println!("cargo:rustc-cdylib-link-arg=-fuse-ld=lld");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    #[cfg(target_arch = "x86_64")] // the x86-64 forms (Arch::target)
    fn trampolines_index_the_sorted_table() {
        let all = v(&["a", "b", "c"]);
        let asm = trampolines(&all, &v(&["a", "c"]), GateWord::Direct, None, None, None);
        assert!(asm.contains("c:\ncudaw_t2:\n    cmpl $0, {gate}(%rip)\n    jne 1f\n    jmp *({table}+16)(%rip)\n1:  movl $2, %r11d"));
        assert!(!asm.contains("\nb:"));
        let asm = trampolines(
            &all,
            &v(&["a", "c"]),
            GateWord::PointerMask(2),
            Some("tt"),
            None,
            None,
        );
        assert!(asm.contains("mov {gate}(%rip), %r11\n    testl $2, (%r11)"));
        assert!(asm.contains("tt:\n    .quad cudaw_t0\n    .quad 0\n    .quad cudaw_t2\n"));
        // Counted: the slow path counts the call in place, at the export's own counter,
        // then jumps through its own entry.
        let asm = trampolines(&all, &all, GateWord::Direct, None, None, Some(4));
        assert!(asm.contains("1:  cmpl $4, {gate}(%rip)\n    jne 2f\n    movq {gate}+8(%rip), %r10\n    movq %fs:8(%r10), %r11\n    testq %r11, %r11\n    jz 2f\n    movq %fs:16(%r10), %r10\n    testq %r10, 32(%r11)\n    jz 2f\n    btq $63, 56(%r11)\n    jc 2f\n    addq $1, 32(%r11)\n    jmp *({table}+8)(%rip)\n2:  movl $1, %r11d\n    jmp {slow}\n"));
    }

    #[test]
    #[cfg(target_arch = "x86_64")] // the x86-64 forms (Arch::target)
    fn marked_exports_get_in_flight_trampolines() {
        let all = v(&["cuLaunchKernel", "cuMemAlloc"]);
        let marked = |n: &str| enqueues_device_work(n);
        let f = InFlight {
            prefix: "px",
            marked: &marked,
        };
        let asm = trampolines(&all, &all, GateWord::PointerMask(2), None, Some(f), None);
        // The launch: word set before the gate test, offset reloaded after it.
        assert!(asm.contains("cuLaunchKernel:\ncudaw_t0:\n    movq px_inflight_tls@gottpoff(%rip), %r11\n    cmpq $0, %fs:(%r11)\n    jne 2f\n    movq $1, %fs:(%r11)\n    mov {gate}(%rip), %r11\n    testl $2, (%r11)\n    jne 3f\n    movq px_inflight_tls@gottpoff(%rip), %r11\n    pushq (%rsp)\n    popq %fs:8(%r11)\n    leaq px_inflight_return(%rip), %r11"));
        assert!(asm
            .contains("3:  movl $0, %r11d\n    jmp px_inflight_slow\n4:  jmp *({table}+0)(%rip)"));
        // The allocation: the plain trampoline.
        assert!(asm.contains(
            "cuMemAlloc:\ncudaw_t1:\n    mov {gate}(%rip), %r11\n    testl $2, (%r11)\n    jne 1f"
        ));
        let support = in_flight_support("px");
        for sym in [
            "px_inflight_tls:",
            "px_inflight_return:",
            "px_inflight_slow:",
            "call {inflight_resolve}",
        ] {
            assert!(support.contains(sym), "{sym}");
        }
        assert!(!support.contains("{entry}"));
    }

    #[test]
    #[cfg(target_arch = "x86_64")] // the x86-64 forms (Arch::target)
    fn the_trace_fast_path_tests_the_exact_gate_and_chains_in_flight() {
        let t = trace_fast_path("px", 4);
        for want in [
            "px_trace_tls:\n    .zero 24",
            "px_trace_enter:\n    cmpl $4, {gate}(%rip)\n    jne {full}",
            "movq {gate}+8(%rip), %rcx\n    movq %fs:8(%rcx), %rax",
            "testq %fs:16(%rcx), %rdx",
            "px_trace_tls_offset:\n    movq px_trace_tls@gottpoff(%rip), %rax\n    ret",
            "movq (%rax,%r11,8), %r11",
            "jmp {slow_return}",
            "px_trace_block:",
        ] {
            assert!(t.contains(want), "{want}");
        }
        let f = in_flight_support_traced("px", Some((4, "px_trace_enter")));
        assert!(f.contains(
            "px_inflight_slow:\n    cmpl $4, {gate}(%rip)\n    jne px_inflight_slow_full"
        ));
        assert!(f.contains("jmp px_trace_enter"));
        assert!(f.contains("px_inflight_slow_full:"));
        // Without tracing, the slow path is what it was (and needs no {gate}).
        let plain = in_flight_support("px");
        assert!(plain.contains("px_inflight_slow:\n    push %rbp") && !plain.contains("{gate}"));
    }

    /// The AArch64 forms: the same gate tests, table offsets, indices and symbols.
    #[test]
    fn aarch64_trampolines_mirror_the_x86_64_ones() {
        let all = v(&["cuLaunchKernel", "cuMemAlloc", "cuMemcpyAsync"]);
        let marked = |n: &str| marked_by_trampoline(n, &["cuLaunchKernel"]);
        let f = InFlight {
            prefix: "px",
            marked: &marked,
        };
        let asm = aarch64::trampolines(
            &all,
            &all,
            GateWord::PointerMask(2),
            Some("tt"),
            Some(f),
            None,
        );
        // Plain: pointer gate, its bit, the entry at 8 * index, the index for the slow path.
        assert!(asm.contains("cuMemAlloc:\ncudaw_t1:\n    adrp x16, {gate}\n    ldr x16, [x16, #:lo12:{gate}]\n    ldar w16, [x16]\n    tst w16, #0x2\n    b.ne 1f\n    adrp x16, {table}+8\n    ldr x16, [x16, #:lo12:{table}+8]\n    br x16\n1:\n    mov w17, #1\n    b {slow}\n"));
        // In flight: the word set before the gate test, the return address kept, the thunk.
        assert!(asm.contains("cuMemcpyAsync:\ncudaw_t2:\n    mrs x17, tpidr_el0\n    adrp x16, :gottprel:px_inflight_tls\n"));
        assert!(asm.contains(
            "    cbnz x16, 2f\n    mov x16, #1\n    str x16, [x17]\n    adrp x16, {gate}\n"
        ));
        assert!(asm.contains("    str x30, [x17, #8]\n    adrp x30, px_inflight_return\n"));
        assert!(asm.contains(
            "3:\n    mov w17, #2\n    b px_inflight_slow\n4:\n    adrp x16, {table}+16\n"
        ));
        assert!(
            asm.contains("tt:\n    .xword cudaw_t0\n    .xword cudaw_t1\n    .xword cudaw_t2\n")
        );
        let direct = aarch64::trampolines(&all, &all[1..2], GateWord::Direct, None, None, Some(4));
        assert!(direct.contains(
            "    adrp x16, {gate}\n    add x16, x16, #:lo12:{gate}\n    ldar w16, [x16]\n    cbnz w16, 1f\n"
        ));
        let support = aarch64::in_flight_support_traced("px", Some((4, "px_trace_enter")));
        for want in [
            "px_inflight_tls:\n    .xword 2\n",
            "px_inflight_return:\n    mrs x17, tpidr_el0\n",
            "    ldr x16, [x17, #8]\n    stlr xzr, [x17]\n    ret x16\n",
            "px_inflight_slow:\n    stp x29, x30, [sp, #-16]!\n",
            "    add x1, x29, #8\n    bl {inflight_resolve}\n",
            "{gate}",
        ] {
            assert!(support.contains(want), "{want}");
        }
        let trace = aarch64::trace_fast_path("px", 4);
        for want in [
            "px_trace_tls:\n    .zero 24",
            "px_trace_enter:\n    b {full}\n",
            "px_trace_tls_offset:\n    adrp x0, :gottprel:px_trace_tls\n",
            "{gate} {table} {slow_return} {direct_full}",
        ] {
            assert!(trace.contains(want), "{want}");
        }
    }

    #[test]
    #[should_panic(expected = "gate mask 0x5 is not an AArch64 logical immediate")]
    fn aarch64_refuses_a_mask_tst_cannot_take() {
        aarch64::trampolines(
            &v(&["a"]),
            &v(&["a"]),
            GateWord::PointerMask(5),
            None,
            None,
            None,
        );
    }

    /// Every AArch64 file assembles (the placeholders `global_asm!` fills given symbol
    /// names), with LLVM's assembler (rustc's) or GNU's. Skipped when neither is installed,
    /// unless `CUDAW_REQUIRE_CROSS_TOOLS` is set (scripts/test.sh installs GNU's).
    #[test]
    fn aarch64_assembly_assembles() {
        let all = v(&["cuLaunchKernel", "cuMemAlloc", "cuMemcpyAsync"]);
        let marked = |n: &str| enqueues_device_work(n);
        let f = InFlight {
            prefix: "px",
            marked: &marked,
        };
        // As the shims include them: each `global_asm!` its own unit.
        let units = [
            aarch64::trampolines(
                &all,
                &all,
                GateWord::PointerMask(2),
                Some("tt"),
                Some(f),
                None,
            ),
            aarch64::trampolines(
                &v(&["qa", "qb"]),
                &v(&["qb"]),
                GateWord::Direct,
                None,
                None,
                Some(4),
            ),
            aarch64::slow_path_named("slow_entry", "{resolve}"),
            aarch64::in_flight_support_traced("px", Some((4, "px_trace_enter"))),
            aarch64::trace_fast_path("px", 4),
        ];
        let mut ran = false;
        for unit in units {
            let mut text = unit;
            for p in [
                "gate",
                "table",
                "slow",
                "full",
                "slow_return",
                "direct_full",
                "inflight_resolve",
                "resolve",
            ] {
                text = text.replace(&format!("{{{p}}}"), &format!("sym_{p}"));
            }
            assert!(!text.contains('{'), "a placeholder left:\n{text}");
            ran |= assemble_aarch64(&text);
        }
        if !ran {
            assert!(
                std::env::var_os("CUDAW_REQUIRE_CROSS_TOOLS").is_none(),
                "CUDAW_REQUIRE_CROSS_TOOLS is set but neither llvm-mc nor aarch64-linux-gnu-as runs"
            );
            eprintln!("skipped: neither llvm-mc nor aarch64-linux-gnu-as is installed");
        }
    }

    /// Assembles `text` for AArch64 with every assembler of llvm-mc and
    /// aarch64-linux-gnu-as that runs here, failing on any refusal; whether one ran.
    fn assemble_aarch64(text: &str) -> bool {
        use std::io::Write as _;
        use std::process::{Command, Stdio};
        let tools: [(&str, &[&str]); 2] = [
            (
                "llvm-mc",
                &[
                    "-triple=aarch64-linux-gnu",
                    "-filetype=obj",
                    "-o",
                    "/dev/null",
                ],
            ),
            ("aarch64-linux-gnu-as", &["-o", "/dev/null", "-"]),
        ];
        let mut ran = false;
        for (tool, args) in tools {
            let child = Command::new(tool)
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn();
            let Ok(mut child) = child else { continue };
            // A write error shows as the tool's failure below.
            let _ = child.stdin.take().unwrap().write_all(text.as_bytes());
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{tool} refused the AArch64 assembly:\n{}\n{text}",
                String::from_utf8_lossy(&out.stderr)
            );
            ran = true;
        }
        ran
    }

    #[test]
    fn device_work_is_named_by_prefix() {
        for n in [
            "cuLaunchKernel_ptsz",
            "cuMemcpyHtoDAsync_v2",
            "cuMemsetD32Async",
            "cuGraphLaunch",
            "cuStreamWaitValue32_v2",
            "cuMemPrefetchAsync",
            "cudaLaunchKernel",
            "cudaMemcpyAsync",
            "cudaGraphLaunch_ptsz",
            "__cudaLaunchKernel",
        ] {
            assert!(enqueues_device_work(n), "{n}");
        }
        for n in [
            "cuMemAlloc_v2",
            "cuCtxSynchronize",
            "cudaMalloc",
            "cudaStreamSynchronize",
            "cuGraphInstantiate",
        ] {
            assert!(!enqueues_device_work(n), "{n}");
        }
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

/// One line of a library's list of wrapped calls ([`read_wrapped`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wrapped {
    /// The exported name.
    pub name: String,
    /// Its behaviour groups (`always`, `launch`, `timed`, ...).
    pub groups: Vec<String>,
    /// The module of the crate its wrapper is in (`@module` on the line), if not the
    /// module that includes the generated code.
    pub module: Option<String>,
}

/// Reads a library's one list of wrapped calls: per line, a name, then its groups, and
/// `@module` where its wrapper lives elsewhere; `#` starts a comment. Panics (the build
/// fails) on a group not in `groups`, a name listed twice or a name not in `names`.
pub fn read_wrapped(path: &Path, groups: &[&str], names: &[String]) -> Vec<Wrapped> {
    println!("cargo:rerun-if-changed={}", path.display());
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out: Vec<Wrapped> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut words = line.split_whitespace();
        let Some(name) = words.next() else { continue };
        let at = format!("{}:{}", path.display(), n + 1);
        assert!(
            names.iter().any(|x| x == name),
            "{at}: {name} is not an export of this library"
        );
        assert!(
            out.iter().all(|w| w.name != name),
            "{at}: {name} is listed twice"
        );
        let mut w = Wrapped {
            name: name.to_owned(),
            groups: Vec::new(),
            module: None,
        };
        for word in words {
            match word.strip_prefix('@') {
                Some(m) => w.module = Some(m.to_owned()),
                None if groups.contains(&word) => w.groups.push(word.to_owned()),
                None => panic!("{at}: group {word:?} is not one of {groups:?}"),
            }
        }
        assert!(!w.groups.is_empty(), "{at}: {name} has no group");
        out.push(w);
    }
    out
}

/// The names of `list` in `group`.
pub fn in_group<'a>(list: &'a [Wrapped], group: &str) -> Vec<&'a str> {
    list.iter()
        .filter(|w| w.groups.iter().any(|g| g == group))
        .map(|w| w.name.as_str())
        .collect()
}

/// `wrapped.rs`, for `include!` in the module that defines the wrappers: per group `G`,
/// `pub const G: [usize; n]` (the names' indices, `idx::NAME`) and
/// `pub fn G_wrappers() -> [(usize, usize); n]` (index and wrapper: `super::NAME`, or
/// `crate::MODULE::NAME`), so that a listed name without a wrapper, or a wrapper no list
/// names (dead code), fails the build.
pub fn wrapped_rs(list: &[Wrapped], groups: &[&str]) -> String {
    let mut s =
        String::from("// Generated by build.rs from the list of wrapped calls; do not edit.\n");
    for g in groups {
        let members: Vec<&Wrapped> = list
            .iter()
            .filter(|w| w.groups.iter().any(|x| x == g))
            .collect();
        let upper = g.to_uppercase();
        writeln!(s, "/// The calls in group `{g}`.").unwrap();
        writeln!(
            s,
            "#[allow(dead_code)]\npub const {upper}: [usize; {}] = [",
            members.len()
        )
        .unwrap();
        for w in &members {
            writeln!(s, "    idx::{},", w.name).unwrap();
        }
        writeln!(s, "];").unwrap();
        writeln!(
            s,
            "/// (index, cudaw's wrapper) for the calls in group `{g}`."
        )
        .unwrap();
        writeln!(
            s,
            "#[allow(dead_code)]\npub fn {g}_wrappers() -> [(usize, usize); {}] {{\n    [",
            members.len()
        )
        .unwrap();
        for w in &members {
            let path = match &w.module {
                Some(m) => format!("crate::{m}::{}", w.name),
                None => format!("super::{}", w.name),
            };
            writeln!(
                s,
                "        (idx::{}, {path} as *const () as usize),",
                w.name
            )
            .unwrap();
        }
        writeln!(s, "    ]\n}}").unwrap();
    }
    s
}

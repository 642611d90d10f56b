//! `CUDAW_TRACE`: the runtime side of tracing. The store itself ([`cudaw_trace::Tracer`]:
//! counters, timeline ring, memory history) is a pure crate the driver shim can feed too;
//! this module times every export and feeds the store from the wrappers.
//!
//! Timing every export without knowing its signature: with tracing on, the gate word has
//! the [`gate::TRACING`] bit, so every call takes the trampolines' slow path. There,
//! [`enter`] saves the caller's return address on a small per-thread shadow stack,
//! replaces it with [`cudaw_trace_return`]'s address and reads the time stamp counter; the
//! export runs untouched (any signature, varargs included) and returns into the thunk,
//! which saves the return registers, calls [`exit`] (time, counters, timeline) and jumps
//! to the saved address. Nested calls (a callback calling CUDA) stack up; frames a
//! `longjmp` skipped are dropped when a shallower frame returns or enters. With tracing
//! off, the gate word is what it always was and the trampolines are unchanged.
//!
//! The wrappers add what the generic layer cannot see: kernel names and the allocations a
//! launch receives (from the parameter layouts), copy directions and sizes, allocations and
//! frees with the calling library, pauses and resumes.

use crate::dispatch::ALL_NAMES;
use crate::{gate, log, registry};
use cudaw_trace::{Config, Direction, Mode, Tracer};
use std::cell::RefCell;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

/// The time stamp counter: the tick source (constant rate on every x86-64 CPU that runs
/// CUDA; calibrated against the monotonic clock).
fn ticks() -> u64 {
    // SAFETY: rdtsc reads a counter; it has no preconditions on x86-64.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// The id of `ALL_NAMES[0]` in the tracer's function table.
static FUNCTION_BASE: AtomicU32 = AtomicU32::new(0);

/// Sets tracing up from the configuration (once, while the shim initialises, before the
/// dispatch table is filled); does nothing when `CUDAW_TRACE` is off.
pub fn init() {
    let cfg = crate::config::get();
    if cfg.trace == Mode::Off {
        return;
    }
    let t = cudaw_trace::install(Config {
        mode: cfg.trace,
        ring_events: cfg.trace_events,
        clock: Some(ticks),
    });
    FUNCTION_BASE.store(t.register_functions(&ALL_NAMES), Ordering::Relaxed);
    // SAFETY: registers a function with no arguments that never unwinds (it runs inside
    // the panic boundary).
    unsafe { libc::atexit(at_exit) };
    gate::GATE.fetch_or(gate::TRACING, Ordering::SeqCst);
    log::info(format_args!(
        "tracing: {} ({}; ticks {:.3} per ns)",
        cfg.trace.as_str(),
        if cfg.trace == Mode::Timeline {
            format!(
                "a ring of {} events, written to {} at exit",
                cfg.trace_events,
                trace_file().display()
            )
        } else {
            "counters and the memory history".to_owned()
        },
        t.clock().rate()
    ));
}

/// The process's tracer, when tracing is on.
#[inline]
pub fn tracer() -> Option<&'static Tracer> {
    cudaw_trace::get()
}

/// Whether tracing is on.
pub fn enabled() -> bool {
    crate::config::get().trace != Mode::Off
}

/// `CUDAW_TRACE_FILE`, or `cudaw-PID.trace.json` in the working folder.
pub fn trace_file() -> PathBuf {
    crate::config::get()
        .trace_file
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("cudaw-{}.trace.json", std::process::id())))
}

// ------------------------------------------------------------------ the shadow stack

/// Calls a thread may nest (deeper calls run untimed).
const DEPTH: usize = 32;

#[derive(Clone, Copy)]
struct Frame {
    /// Where the caller's return address was (the thunk's address is there now).
    slot: usize,
    /// The caller's return address.
    ret: usize,
    /// The export's index in `ALL_NAMES`.
    index: u32,
    /// Ticks at entry.
    start: u64,
}

struct Shadow {
    depth: usize,
    frames: [Frame; DEPTH],
    /// This thread's counters in the tracer (one thread-local read per traced call).
    counters: Option<&'static cudaw_trace::counters::ThreadCounters>,
}

const EMPTY: Frame = Frame {
    slot: 0,
    ret: 0,
    index: 0,
    start: 0,
};

thread_local! {
    static SHADOW: RefCell<Shadow> = const {
        RefCell::new(Shadow { depth: 0, frames: [EMPTY; DEPTH], counters: None })
    };
}

/// Starts timing the call of export `index` whose return address is at `slot`: called by
/// the slow path just before it jumps to the export.
///
/// # Safety
/// `slot` is the address of the return address of the export call in progress on this
/// thread (the word the `call` instruction pushed).
pub unsafe fn enter(index: u32, slot: *mut usize) {
    let _ = SHADOW.try_with(|s| {
        let Ok(mut s) = s.try_borrow_mut() else {
            return;
        };
        let at = slot as usize;
        // A frame at or below this one on the stack cannot be live: a longjmp skipped it.
        while s.depth > 0 && s.frames[s.depth - 1].slot <= at {
            s.depth -= 1;
        }
        if s.depth == DEPTH {
            return;
        }
        // SAFETY: `slot` holds this call's return address (caller's contract).
        let ret = unsafe { slot.read() };
        let d = s.depth;
        s.frames[d] = Frame {
            slot: at,
            ret,
            index,
            start: 0,
        };
        s.depth = d + 1;
        // SAFETY: as above; the export returns into the thunk, which returns to `ret`.
        unsafe { slot.write(cudaw_trace_return as *const () as usize) };
        s.frames[d].start = ticks();
    });
}

/// The return thunk's work: ends the timing of the call whose return address was at
/// `slot` and returns that address.
extern "C" fn exit(slot: usize) -> usize {
    let end = ticks();
    let popped = SHADOW.try_with(|s| {
        let mut s = s.try_borrow_mut().ok()?;
        let i = (0..s.depth).rev().find(|&i| s.frames[i].slot == slot)?;
        s.depth = i;
        Some((s.frames[i], s.counters))
    });
    let Ok(Some((f, counters))) = popped else {
        // No frame for this return: nowhere to go back to. Never expected.
        log::error(format_args!(
            "tracing: a traced call returned with no frame recorded (slot {slot:#x}); aborting"
        ));
        std::process::abort();
    };
    crate::boundary::guard("tracing a call", (), || {
        if let Some(t) = tracer() {
            let id = FUNCTION_BASE.load(Ordering::Relaxed) + f.index;
            match counters {
                Some(c) => t.record_call_on(c, id, f.start, end),
                None => {
                    let c = t.thread_counters();
                    let _ = SHADOW.try_with(|s| {
                        if let Ok(mut s) = s.try_borrow_mut() {
                            s.counters = Some(c);
                        }
                    });
                    t.record_call_on(c, id, f.start, end);
                }
            }
        }
    });
    f.ret
}

// The thunk a traced export returns into: %rsp is the return address's slot + 8. Saves the
// return registers (%rax, %rdx, %xmm0, %xmm1), calls exit(slot) on an aligned stack,
// restores them and jumps to the caller's real return address.
std::arch::global_asm!(
    ".pushsection .text.cudaw_trace,\"ax\",@progbits",
    ".p2align 4",
    ".globl {thunk}",
    ".hidden {thunk}",
    ".type {thunk},@function",
    "{thunk}:",
    "    push %rbp",
    "    mov %rsp, %rbp",
    "    push %rax",
    "    push %rdx",
    "    sub $32, %rsp",
    "    and $-16, %rsp",
    "    movdqu %xmm0, 0(%rsp)",
    "    movdqu %xmm1, 16(%rsp)",
    "    mov %rbp, %rdi",
    "    call {exit}",
    "    mov %rax, %r11",
    "    movdqu 0(%rsp), %xmm0",
    "    movdqu 16(%rsp), %xmm1",
    "    lea -16(%rbp), %rsp",
    "    pop %rdx",
    "    pop %rax",
    "    pop %rbp",
    "    jmp *%r11",
    ".size {thunk}, .-{thunk}",
    ".popsection",
    thunk = sym cudaw_trace_return,
    exit = sym exit,
    options(att_syntax)
);

extern "C" {
    /// The return thunk (defined above in assembly; never called directly).
    fn cudaw_trace_return();
}

/// The return address of the traced export call in progress on this thread (the
/// outermost cudaw sees), if any.
fn caller_address() -> Option<usize> {
    SHADOW
        .try_with(|s| {
            let s = s.try_borrow().ok()?;
            (s.depth > 0).then(|| s.frames[s.depth - 1].ret)
        })
        .ok()
        .flatten()
}

/// The file name of the library (or program) containing `addr`.
fn library_of(addr: usize) -> Option<String> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-pointer.
    let ok = unsafe { libc::dladdr(addr as *const c_void, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let s = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy();
    let name = s.rsplit('/').next().unwrap_or(&s);
    Some(if name.is_empty() {
        "the program".to_owned()
    } else {
        name.to_owned()
    })
}

// ------------------------------------------------------------------ what wrappers record

/// A new allocation (any API cudaw serves), named by the API that made it.
pub fn alloc(base: u64, size: u64, api: &'static str) {
    if let Some(t) = tracer() {
        let site = caller_address().and_then(library_of);
        t.record_alloc(base, size, api, site.as_deref());
    }
}

/// The allocation at `base` is freed.
pub fn free(base: u64) {
    if let Some(t) = tracer() {
        t.record_free(base);
    }
}

/// Runs the copy `f` of `bytes` (`cudaMemcpyKind` `kind`) from `src` to `dst`, recording it
/// when it succeeds.
#[inline]
pub fn copy(
    kind: i32,
    bytes: usize,
    dst: *const c_void,
    src: *const c_void,
    f: impl FnOnce() -> u32,
) -> u32 {
    let Some(t) = tracer() else { return f() };
    let start = t.now();
    let rc = f();
    if rc == 0 {
        let end = t.now();
        t.record_copy(
            Direction::from_kind(kind),
            bytes as u64,
            dst as u64,
            src as u64,
            start,
            end,
        );
    }
    rc
}

/// The kernel's id in the tracer (its mangled name interned once per registration).
fn kernel_id(t: &Tracer, rec: &registry::FunctionRecord) -> u32 {
    *rec.trace_id.get_or_init(|| t.kernel_id(&rec.name))
}

/// The 8-byte words of a launch's arguments that may be pointers (with the parameter
/// each came from), read through the kernel's parameter layout.
fn pointer_words(
    rec: &registry::FunctionRecord,
    args: *mut *mut c_void,
    out: &mut Vec<(u16, u64)>,
) {
    if args.is_null() {
        return;
    }
    let Some(layout) = rec.layout(crate::wrappers::device_sm()) else {
        return;
    };
    for p in &layout.params {
        // SAFETY: the launch passes one argument pointer per kernel parameter.
        let base = unsafe { *args.add(p.ordinal as usize) } as *const u8;
        if base.is_null() {
            continue;
        }
        let (off, size) = (p.offset as usize, p.size as usize);
        let mut w = (8 - off % 8) % 8;
        while w + 8 <= size {
            // SAFETY: `base` points at this parameter's `size` bytes (the launch's contract).
            let v = unsafe { (base.add(w) as *const u64).read_unaligned() };
            out.push((p.ordinal as u16, v));
            w += 8;
        }
    }
}

/// Runs the launch `f` of `rec`'s kernel, recording it (name, grid, block, the allocations
/// its arguments point into) when it succeeds.
#[inline]
pub fn launch(
    rec: Option<&registry::FunctionRecord>,
    grid: [u32; 3],
    block: [u32; 3],
    shared: usize,
    args: *mut *mut c_void,
    f: impl FnOnce() -> u32,
) -> u32 {
    let Some(t) = tracer() else { return f() };
    let start = t.now();
    let rc = f();
    if rc != 0 {
        return rc;
    }
    let end = t.now();
    let Some(rec) = rec else { return rc };
    let k = kernel_id(t, rec);
    let mut words = Vec::new();
    pointer_words(rec, args, &mut words);
    t.record_launch(k, grid, block, shared as u32, start, end, &words);
    rc
}

/// A pause (or a resume) that took from tick `start` until now and moved `bytes` of
/// `allocations`.
pub fn pause(resume: bool, start: u64, allocations: u64, bytes: u64) {
    if let Some(t) = tracer() {
        t.record_pause(resume, start, t.now(), allocations, bytes);
    }
}

/// Ticks now (0 when tracing is off).
pub fn now() -> u64 {
    tracer().map_or(0, |t| t.now())
}

// ------------------------------------------------------------------ reading

/// The metrics and the `top` hottest and coldest allocations, or why not.
pub fn stats(top: usize) -> Result<cudaw_trace::Stats, String> {
    match tracer() {
        Some(t) => Ok(t.stats(std::process::id(), top)),
        None => Err(format!(
            "tracing is off in process {} (start it with CUDAW_TRACE=metrics or CUDAW_TRACE=timeline)",
            std::process::id()
        )),
    }
}

/// What writing the timeline did.
pub struct Written {
    /// Events written.
    pub events: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Events dropped from the ring before.
    pub dropped: u64,
}

/// Writes the timeline so far to `path` (through a temporary file renamed into place).
pub fn write_timeline(path: &std::path::Path) -> Result<Written, String> {
    let Some(t) = tracer() else {
        return Err(stats(0).err().unwrap_or_default());
    };
    if !t.timeline() {
        return Err(format!(
            "process {} keeps no timeline (CUDAW_TRACE=metrics; start it with CUDAW_TRACE=timeline)",
            std::process::id()
        ));
    }
    let name = path
        .file_name()
        .ok_or_else(|| format!("{} names no file", path.display()))?;
    let tmp = path.with_file_name(format!(
        ".{}.tmp{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| -> std::io::Result<u64> {
        let f = std::fs::File::create(&tmp)?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        let n = t.write_timeline(&mut w, std::process::id(), &process_name())?;
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        Ok(n)
    })();
    match result {
        Ok(events) => Ok(Written {
            events,
            bytes: std::fs::metadata(path).map_or(0, |m| m.len()),
            dropped: t
                .stats(std::process::id(), 0)
                .timeline
                .map_or(0, |s| s.dropped),
        }),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(format!("writing the timeline to {}: {e}", path.display()))
        }
    }
}

fn process_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "process".to_owned())
}

extern "C" fn at_exit() {
    crate::boundary::guard("the trace summary at exit", (), || {
        let Some(t) = tracer() else { return };
        if t.timeline() {
            let path = trace_file();
            match write_timeline(&path) {
                Ok(w) => log::warn_plain(format_args!(
                    "trace: timeline of {} events ({} dropped) written to {}",
                    w.events,
                    w.dropped,
                    path.display()
                )),
                Err(e) => log::error(format_args!("trace: {e}")),
            }
        }
        let s = t.stats(std::process::id(), 5);
        for line in s.summary(10).lines() {
            log::warn_plain(format_args!("trace: {line}"));
        }
    })
}

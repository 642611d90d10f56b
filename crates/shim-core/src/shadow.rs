//! The tracing shadow stack: a thread's block of timed calls, shared with the assembly
//! fast path (`shim-build`'s `trace_fast_path`), the Rust path's [`enter`] and [`exit`],
//! the return thunk ([`return_thunk!`](crate::return_thunk)) and the timeline's per-thread
//! call buffers. Parameterised by [`Host`]: the library's static TLS words, its tracer and
//! what it times; the runtime shim's `tracing` module implements it.
//!
//! With the gate word exactly `TRACING`, the fast path pushes `(slot, return address,
//! index, ticks)` on the thread's shadow stack ([`Block`], reached through static TLS
//! words, [`TraceTls`]), replaces the return address with its thunk and jumps to the
//! target. Anything else takes the Rust path: [`enter`] pushes the same frame with the
//! return thunk, which saves the return registers, calls [`exit`] (time, counters,
//! timeline) and jumps to the saved address. Frames a `longjmp` skipped are dropped when a
//! shallower frame returns or enters.

use cudaw_trace::Tracer;
use driver::selfcost::ticks;
use std::ffi::c_void;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::Mutex;

/// What a library tells its shadow stack. Implemented by a unit type in the library; every
/// function here is generic over it.
///
/// # Safety
/// [`Host::words`] returns the address of the calling thread's static TLS words, laid out
/// as [`TraceTls`] (`shim-build`'s `TRACE_TLS_*`), zeroed at thread start, alive as long
/// as the thread and used by that thread only; [`Host::thunk`] is the address of the
/// return thunk [`return_thunk!`](crate::return_thunk) made for this host.
pub unsafe trait Host: 'static {
    /// The calling thread's words.
    fn words() -> *mut TraceTls;
    /// The tracer, when tracing is on.
    fn tracer() -> Option<&'static Tracer>;
    /// The library's blocks and counts.
    fn state() -> &'static State;
    /// The id of export 0 in the tracer's function table.
    fn function_base() -> u32;
    /// How many exports the library has.
    fn exports() -> usize;
    /// The exports timed on every call whatever the sampling says.
    fn always_timed() -> &'static [usize];
    /// The exports called from the fast path's own frame (their arguments all travel in
    /// registers), when that is on; none otherwise.
    fn direct_exports() -> &'static [usize];
    /// `CUDAW_TRACE_SAMPLE`: one call in this many of each export is timed.
    fn sample() -> u32;
    /// The address of the return thunk.
    fn thunk() -> usize;
}

/// A library's shadow-stack state: every thread's block, and the calls [`direct_full`]
/// recorded.
pub struct State {
    /// Every thread's block (addresses; blocks are never freed).
    blocks: Mutex<Vec<usize>>,
    /// Calls [`direct_full`] recorded.
    direct_full: AtomicU64,
}

impl State {
    /// No blocks yet.
    pub const fn new() -> Self {
        State {
            blocks: Mutex::new(Vec::new()),
            direct_full: AtomicU64::new(0),
        }
    }

    fn blocks(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        // A panic while holding it left the list whole (pushes only).
        self.blocks.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for State {
    fn default() -> Self {
        State::new()
    }
}

/// Calls a thread may nest (deeper calls run untimed).
const DEPTH: usize = 32;

/// One timed call on the shadow stack (`shim-build`'s `TRACE_FRAME` layout).
#[derive(Clone, Copy)]
#[repr(C)]
struct Frame {
    /// Where the caller's return address was (a thunk's address is there now).
    slot: usize,
    /// The caller's return address.
    ret: usize,
    /// The export's index in `ALL_NAMES`.
    index: u64,
    /// Ticks at entry.
    start: u64,
}

/// A thread's tracing state, shared with the assembly fast path (`shim-build`'s
/// `trace_fast_path`: `TRACE_TOP`, `TRACE_LIMIT`, `TRACE_CALLS`), reached through a
/// word of static TLS (`cudaw_rt_trace_tls`, [`TraceTls`]). Made on the thread's first
/// traced call and never freed (the tracer keeps every thread's counters anyway), so calls
/// made while a thread exits are timed too.
#[repr(C)]
pub struct Block {
    /// The next free frame.
    top: *mut Frame,
    /// One past the last frame.
    limit: *mut Frame,
    /// The thread's counters of `ALL_NAMES[i]`, at `i` (`ThreadCounters::flat_calls`).
    calls: *const cudaw_trace::counters::CallSlot,
    /// `CUDAW_TRACE_SAMPLE` - 1: the fast path times a call when its export's count so far
    /// has none of these bits.
    mask: u64,
    /// The timeline's call buffer: where the fast thunk writes the next call's event (null
    /// with `metrics`). Only this thread writes it (plain stores from the assembly); a
    /// reader of the timeline loads it under the ring's lock ([`pending_calls`]).
    events: AtomicPtr<CallEvent>,
    /// The buffer's soft end ([`EVENTS`] events in; `usize::MAX` without a buffer): a
    /// timed call that finds `events` there takes the Rust path, which empties it.
    events_end: *mut CallEvent,
    /// The buffer's first event (null with `metrics`).
    events_base: *mut CallEvent,
    /// The thread's counters.
    counters: &'static cudaw_trace::counters::ThreadCounters,
    /// `frames[0]` is a sentinel (slot `usize::MAX`: never stale, never matched).
    frames: [Frame; DEPTH + 1],
    /// Calls this thread timed on the Rust path ([`rust_enters`]): written by this thread
    /// alone, with a plain add.
    rust_enters: std::sync::atomic::AtomicU64,
}

const _: () = {
    assert!(std::mem::offset_of!(Block, top) == 0);
    assert!(std::mem::offset_of!(Block, limit) == 8);
    assert!(std::mem::offset_of!(Block, calls) == 16);
    assert!(std::mem::offset_of!(Block, mask) == 24);
    assert!(std::mem::offset_of!(Block, events) == 32);
    assert!(std::mem::offset_of!(Block, events_end) == 40);
    assert!(std::mem::size_of::<CallEvent>() == 24);
    assert!(std::mem::size_of::<Frame>() == 32);
    assert!(std::mem::size_of::<cudaw_trace::counters::CallSlot>() == 32);
};

/// One call the fast thunk wrote into a thread's timeline buffer (`shim-build`'s
/// `TRACE_EVENT` layout).
#[derive(Clone, Copy)]
#[repr(C)]
struct CallEvent {
    start: u64,
    ticks: u64,
    /// The export's index in `ALL_NAMES`.
    index: u64,
}

/// Calls a thread's timeline buffer holds before they go to the ring (under its lock, all
/// at once), and the room past that for the calls on the shadow stack, whose thunks write
/// without looking.
#[doc(hidden)]
pub const EVENTS: usize = 1024;
const EVENTS_ROOM: usize = EVENTS + DEPTH + 1;

const EMPTY: Frame = Frame {
    slot: 0,
    ret: 0,
    index: 0,
    start: 0,
};

/// A thread's words of static TLS (`shim-build`'s `TRACE_TLS_*`): its block, and copies of
/// the block's `calls` and `mask`, which a call the sampling leaves untimed reads instead
/// of the block.
#[repr(C)]
pub struct TraceTls {
    block: *mut Block,
    /// Written last: nonzero means all three are set.
    calls: *const cudaw_trace::counters::CallSlot,
    mask: u64,
}

const _: () = {
    assert!(std::mem::offset_of!(TraceTls, calls) == 8);
    assert!(std::mem::offset_of!(TraceTls, mask) == 16);
    assert!(std::mem::size_of::<TraceTls>() == 24);
};

/// The calling thread's block, made on first use (`None`: tracing is off).
fn block<H: Host>() -> Option<*mut Block> {
    if let Some(b) = existing_block::<H>() {
        return Some(b);
    }
    let t = H::tracer()?;
    let counters = t.thread_counters();
    let base = H::function_base();
    let slots = counters.flat_calls(base, H::exports())?;
    // Allocations are always timed: the shadow stack's frame gives their creation site.
    let always_timed = H::always_timed();
    for &i in always_timed {
        if let Some(s) = slots.get(i) {
            s.time_always();
        }
    }
    // Exports whose arguments all travel in registers are called from the fast path's
    // own frame (their returns stay predicted), allocations excepted.
    for &i in H::direct_exports() {
        if let (Some(s), false) = (slots.get(i), always_timed.contains(&i)) {
            s.call_direct();
        }
    }
    let calls = slots.as_ptr();
    let mut frames = [EMPTY; DEPTH + 1];
    frames[0].slot = usize::MAX;
    // The timeline: every call timed, its event written by the fast thunk into the
    // thread's buffer (leaked with the block).
    let (mask, events_base, events_end) = if t.timeline() {
        let buf: &'static mut [CallEvent] = Box::leak(
            vec![
                CallEvent {
                    start: 0,
                    ticks: 0,
                    index: 0
                };
                EVENTS_ROOM
            ]
            .into_boxed_slice(),
        );
        let base = buf.as_mut_ptr();
        // SAFETY: EVENTS < EVENTS_ROOM: inside the buffer.
        (0, base, unsafe { base.add(EVENTS) })
    } else {
        (
            H::sample().max(1) as u64 - 1,
            std::ptr::null_mut(),
            usize::MAX as *mut CallEvent,
        )
    };
    let b = Box::into_raw(Box::new(Block {
        top: std::ptr::null_mut(),
        limit: std::ptr::null_mut(),
        calls,
        mask,
        events: AtomicPtr::new(events_base),
        events_end,
        events_base,
        counters,
        frames,
        rust_enters: std::sync::atomic::AtomicU64::new(0),
    }));
    H::state().blocks().push(b as usize);
    // SAFETY: `b` is a fresh allocation, leaked for the life of the process; the frames
    // array has DEPTH + 1 elements, so both pointers are in bounds (or one past the end).
    unsafe {
        let first = std::ptr::addr_of_mut!((*b).frames).cast::<Frame>();
        (*b).top = first.add(1);
        (*b).limit = first.add(DEPTH + 1);
        // The fast path reads the calls pointer first: it goes last, each a volatile
        // store in this order (only this thread reads its words, a signal handler on it
        // included).
        let words = H::words();
        std::ptr::addr_of_mut!((*words).block).write_volatile(b);
        std::ptr::addr_of_mut!((*words).mask).write_volatile(mask);
        std::ptr::addr_of_mut!((*words).calls).write_volatile(calls);
    }
    Some(b)
}

/// Moves the calls the fast thunk wrote into the thread's timeline buffer (`b`, the calling
/// thread's block) to the ring, under its lock, and empties the buffer.
fn flush_calls<H: Host>(b: &Block) {
    let base = b.events_base;
    if base.is_null() {
        return;
    }
    let Some(t) = H::tracer() else { return };
    if b.events.load(Ordering::Relaxed) == base {
        return;
    }
    t.push_batch(|push| {
        // SAFETY: the calling thread's own buffer: nothing else writes it meanwhile.
        unsafe { buffered_calls::<H>(b, push) };
        b.events.store(base, Ordering::Relaxed);
    });
}

/// A call the fast path made from its own frame (`shim-build`'s `TRACE_DIRECT`) that
/// returned to a full timeline buffer (calls nested in it filled it): the buffer goes to
/// the ring, then this call's event. Its counters are already updated.
pub fn direct_full<H: Host>(index: u64, start: u64, ticks: u64) {
    H::state().direct_full.fetch_add(1, Ordering::Relaxed);
    crate::boundary::guard("tracing a call", (), || {
        let Some(b) = existing_block::<H>() else {
            return;
        };
        // SAFETY: blocks are leaked when made, never freed; this is the calling thread's.
        let b = unsafe { &*b };
        flush_calls::<H>(b);
        if let Some(t) = H::tracer() {
            let f = H::function_base() + index as u32;
            let tid = b.counters.tid;
            t.push_batch(|push| {
                push(cudaw_trace::timeline::Event::Call {
                    f,
                    tid,
                    start,
                    end: start.wrapping_add(ticks),
                })
            });
        }
    })
}

/// Calls [`direct_full`] recorded so far (the fast path's test reads it).
#[doc(hidden)]
pub fn direct_full_calls<H: Host>() -> u64 {
    H::state().direct_full.load(Ordering::Relaxed)
}

/// Room left in the calling thread's timeline buffer, in calls (0 without one): the fast
/// path's test fills it exactly.
#[doc(hidden)]
pub fn timeline_room<H: Host>() -> usize {
    existing_block::<H>().map_or(0, |b| {
        // SAFETY: the calling thread's own block (leaked, never freed); the cursor stays
        // inside its buffer, or is null with its end at usize::MAX without one.
        let (end, at) = unsafe { ((*b).events_end, (*b).events.load(Ordering::Relaxed)) };
        if at.is_null() {
            0
        } else {
            (end as usize).saturating_sub(at as usize) / std::mem::size_of::<CallEvent>()
        }
    })
}

/// Hands `each` the calls block `b`'s timeline buffer holds, as timeline events.
///
/// # Safety
/// Nobody empties the buffer meanwhile: the caller is its thread, or holds the ring's lock
/// (which emptying takes). Its thread may go on writing past the cursor read here.
unsafe fn buffered_calls<H: Host>(b: &Block, each: &mut dyn FnMut(cudaw_trace::timeline::Event)) {
    let base = b.events_base;
    if base.is_null() {
        return;
    }
    let fbase = H::function_base();
    // The thread wrote every event below the cursor before it stored the cursor (x86
    // stores are seen in order).
    let end = b.events.load(Ordering::Acquire);
    // SAFETY: the cursor stays within the buffer, at or past its base.
    let n = unsafe { end.offset_from(base) }.max(0) as usize;
    // SAFETY: `n` events written, inside the buffer, not rewritten meanwhile (caller's
    // contract).
    for e in unsafe { std::slice::from_raw_parts(base, n) } {
        each(cudaw_trace::timeline::Event::Call {
            f: fbase + e.index as u32,
            tid: b.counters.tid,
            start: e.start,
            end: e.start.wrapping_add(e.ticks),
        });
    }
}

/// The calls every thread's timeline buffer holds, not yet in the ring: run under the
/// ring's lock ([`cudaw_trace::Tracer::write_timeline_with`]), so no thread empties its
/// buffer meanwhile (emptying takes that lock); the events up to each cursor read are
/// complete (x86 stores are seen in order).
pub fn pending_calls<H: Host>() -> Vec<cudaw_trace::timeline::Event> {
    let mut out = Vec::new();
    for &b in H::state().blocks().iter() {
        // SAFETY: blocks are leaked when made, never freed; we run under the ring's lock,
        // which a thread takes to empty its buffer.
        unsafe { buffered_calls::<H>(&*(b as *const Block), &mut |e| out.push(e)) };
    }
    out
}

/// The calling thread's block, if it has one.
fn existing_block<H: Host>() -> Option<*mut Block> {
    // SAFETY: the thread's own TLS words.
    let b = unsafe { (*H::words()).block };
    (!b.is_null()).then_some(b)
}

/// Calls timed on the Rust path rather than the assembly fast path (a pause, a thread's
/// first call, a full shadow stack or call buffer), summed over the threads: the summary
/// at exit reports them, and the tests check the fast path took the rest. Each thread
/// counts its own in its block with a plain add.
pub fn rust_enters<H: Host>() -> u64 {
    H::state()
        .blocks()
        .iter()
        .map(|&b| {
            // SAFETY: blocks are leaked when made, never freed.
            let b = unsafe { &*(b as *const Block) };
            b.rust_enters.load(Ordering::Relaxed)
        })
        .sum()
}

/// Starts timing the call of export `index` whose return address is at `slot`: called by
/// the slow path just before it jumps to the export.
///
/// # Safety
/// `slot` is the address of the return address of the export call in progress on this
/// thread (the word the `call` instruction pushed).
pub unsafe fn enter<H: Host>(index: u32, slot: *mut usize) {
    let Some(b) = block::<H>() else { return };
    // SAFETY: this thread's block (leaked, never freed).
    unsafe { flush_calls::<H>(&*b) };
    // SAFETY: this thread's block; only this thread writes its count.
    let n = unsafe { &(*b).rust_enters };
    n.store(n.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    let at = slot as usize;
    // SAFETY: `b` is this thread's block; only this thread (here, the assembly fast path
    // and the thunks, never at the same time) touches it. `top` stays within
    // frames[1..=DEPTH]; the sentinel frames[0] ends the loop.
    unsafe {
        // A frame at or below this one on the stack cannot be live: a longjmp skipped it.
        while (*(*b).top.sub(1)).slot <= at {
            (*b).top = (*b).top.sub(1);
        }
        if (*b).top >= (*b).limit {
            return;
        }
        let f = (*b).top;
        (*b).top = f.add(1);
        // SAFETY (slot): holds this call's return address (caller's contract); the export
        // returns into the thunk, which returns to it.
        f.write(Frame {
            slot: at,
            ret: slot.read(),
            index: u64::from(index),
            start: 0,
        });
        slot.write(H::thunk());
        (*f).start = ticks();
    }
}

/// The return thunk's work: ends the timing of the call whose return address was at
/// `slot` and returns that address.
pub fn exit<H: Host>(slot: usize) -> usize {
    let end = ticks();
    // SAFETY: this thread's block (see `enter`); the search stays above the sentinel.
    let popped = existing_block::<H>().and_then(|b| unsafe {
        let first = std::ptr::addr_of_mut!((*b).frames).cast::<Frame>().add(1);
        let mut f = (*b).top;
        while f > first {
            f = f.sub(1);
            if (*f).slot == slot {
                (*b).top = f;
                return Some((f.read(), (*b).counters));
            }
        }
        None
    });
    let Some((f, counters)) = popped else {
        // No frame for this return: nowhere to go back to. Never expected.
        crate::log::error(format_args!(
            "tracing: a traced call returned with no frame recorded (slot {slot:#x}); aborting"
        ));
        std::process::abort();
    };
    crate::boundary::guard("tracing a call", (), || {
        if let Some(t) = H::tracer() {
            let id = H::function_base() + f.index as u32;
            t.record_call_on(counters, id, f.start, end);
        }
    });
    f.ret
}

/// Defines the return thunk `$thunk` of host `$host` ([`Host::thunk`] is its address): the
/// thunk a call timed in Rust returns into (and the fast thunk's fallback). It saves the
/// return registers, calls [`exit`] with the return address's slot and jumps to the
/// caller's real return address. Expanded in the library, as a hidden symbol of it.
#[macro_export]
macro_rules! return_thunk {
    ($vis:vis $thunk:ident, $host:ty) => {
        /// The return thunk's work (`cudaw_shim_core::shadow::exit`).
        extern "C" fn __cudaw_shadow_exit(slot: usize) -> usize {
            $crate::shadow::exit::<$host>(slot)
        }

        // The thunk a call timed in Rust returns into (and the fast thunk's fallback): %rsp is the
        // return address's slot + 8. Saves the return registers (%rax, %rdx, %xmm0, %xmm1), calls
        // exit(slot) on an aligned stack, restores them and jumps to the caller's real return
        // address.
        #[cfg(target_arch = "x86_64")]
        ::std::arch::global_asm!(
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
            thunk = sym $thunk,
            exit = sym __cudaw_shadow_exit,
            options(att_syntax)
        );

        // The same on AArch64: the slow path kept the return address at its stack pointer - 8
        // (shim-build's `aarch64.rs`), so `slot` is the thunk's stack pointer - 8 on entry. Saves
        // the return registers (x0-x7, q0-q3) around exit(slot) and returns to its result.
        #[cfg(target_arch = "aarch64")]
        ::std::arch::global_asm!(
            ".pushsection .text.cudaw_trace,\"ax\",%progbits",
            ".p2align 4",
            ".globl {thunk}",
            ".hidden {thunk}",
            ".type {thunk},%function",
            "{thunk}:",
            "    sub sp, sp, #144",
            "    stp x29, x30, [sp, #128]",
            "    add x29, sp, #128",
            "    stp x0, x1, [sp, #0]",
            "    stp x2, x3, [sp, #16]",
            "    stp x4, x5, [sp, #32]",
            "    stp x6, x7, [sp, #48]",
            "    stp q0, q1, [sp, #64]",
            "    stp q2, q3, [sp, #96]",
            "    add x0, sp, #136",
            "    bl {exit}",
            "    mov x16, x0",
            "    ldp q2, q3, [sp, #96]",
            "    ldp q0, q1, [sp, #64]",
            "    ldp x6, x7, [sp, #48]",
            "    ldp x4, x5, [sp, #32]",
            "    ldp x2, x3, [sp, #16]",
            "    ldp x0, x1, [sp, #0]",
            "    ldp x29, x30, [sp, #128]",
            "    add sp, sp, #144",
            "    ret x16",
            ".size {thunk}, .-{thunk}",
            ".popsection",
            thunk = sym $thunk,
            exit = sym __cudaw_shadow_exit,
        );

        extern "C" {
            /// The return thunk (defined above in assembly; never called directly).
            $vis fn $thunk();
        }
    };
}

/// The return address of the traced export call in progress on this thread (the
/// innermost cudaw sees), if any.
pub fn caller_address<H: Host>() -> Option<usize> {
    let b = existing_block::<H>()?;
    // SAFETY: this thread's block; `top - 1` is the sentinel at worst (slot usize::MAX).
    let f = unsafe { (*b).top.sub(1).read() };
    (f.slot != usize::MAX).then_some(f.ret)
}

/// The file name of the library (or program) containing `addr`.
pub fn library_of(addr: usize) -> Option<String> {
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

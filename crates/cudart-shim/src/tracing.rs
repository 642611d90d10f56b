//! `CUDAW_TRACE`: the runtime side of tracing. The store itself ([`cudaw_trace::Tracer`]:
//! counters, timeline ring, memory history) is a pure crate the driver shim can feed too;
//! this module times every export and feeds the store from the wrappers.
//!
//! Timing every export without knowing its signature: with tracing on, the gate word has
//! the [`gate::TRACING`] bit, so every call takes the trampolines' slow path. With the
//! word exactly `TRACING` (metrics, not paused), that is `shim-build`'s assembly
//! `trace_fast_path`: it pushes `(slot, return address, index, rdtsc)` on the thread's
//! shadow stack (`Block`, reached through static TLS words, `TraceTls`), replaces the
//! return address with its thunk and jumps to the target; the thunk reads the TSC, pops the
//! frame, adds to the thread's counters (`ThreadCounters::flat_calls`, plain adds) and jumps
//! back. With `CUDAW_TRACE_SAMPLE=N`, one call in N of each export is timed and the others
//! only counted (the merge scales the timed calls' ticks up to the count): a plain
//! trampoline counts an untimed call itself, in place (`shim-build`'s `trampolines` with
//! `count`: a plain add to the export's counter, no call), and jumps through its own table
//! entry; the others go on to the fast path. Under the
//! timeline every call is timed and the thunk also writes `(start, ticks, index)` into the
//! thread's call buffer (`Block::events`); when that is full the call takes the Rust
//! path, which moves the buffer's calls into the ring in one batch (`flush_calls`), and
//! readers of the timeline add what the buffers hold (`pending_calls`).
//! Anything else (a pause, a thread's first call, a full stack, a frame a `longjmp` left
//! behind, a full call buffer) takes the Rust path: [`enter`] pushes the same frame with
//! `cudaw_trace_return` as the thunk, which saves the return registers, calls `exit`
//! (time, counters, timeline) and jumps to the saved address. Nested calls (a callback
//! calling CUDA) stack up; frames a `longjmp` skipped are dropped when a shallower frame
//! returns or enters. The in-flight trampolines chain: their thunk is the return address
//! the tracing thunk goes back to. With tracing off, the gate word is what it always was
//! and the trampolines are unchanged.
//!
//! The wrappers add what the generic layer cannot see: kernel names and the allocations a
//! launch receives (from the parameter layouts), copy directions and sizes, allocations and
//! frees with the calling library, pauses and resumes.

use crate::dispatch::ALL_NAMES;
use crate::{gate, log, registry};
use cudaw_trace::{Config, Direction, Mode, Tracer};
// The tick source: the time stamp counter on x86-64 (constant rate on every CPU that runs
// CUDA), the virtual counter on AArch64; calibrated against the monotonic clock.
use driver::selfcost::ticks;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};

/// The id of `ALL_NAMES[0]` in the tracer's function table.
static FUNCTION_BASE: AtomicU32 = AtomicU32::new(0);

/// Sets tracing up from the configuration (once: while the shim initialises, before the
/// dispatch table is filled, or at the driver shim's first traced call, whichever comes
/// first); does nothing when `CUDAW_TRACE` is off. `always_timed`: the exports timed on
/// every call whatever `CUDAW_TRACE_SAMPLE` says, those that make allocations, whose
/// creation site is the caller's return address on the shadow stack (`exports/wrapped.txt`'s
/// `timed` group).
pub fn init(always_timed: &'static [usize]) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        ALWAYS_TIMED.get_or_init(|| always_timed);
        init_once()
    });
}

fn init_once() {
    // SAFETY: the accessor only reads the GOT's thread-pointer offset of the words.
    gate::set_trace_tls(unsafe { cudaw_rt_trace_tls_offset() });
    let cfg = crate::config::get();
    if cfg.trace == Mode::Off {
        return;
    }
    let t = cudaw_trace::install(Config {
        mode: cfg.trace,
        ring_events: cfg.trace_events,
        clock: Some(ticks),
        buffer_sample: cfg.trace_buffer_sample,
    });
    FUNCTION_BASE.store(t.register_functions(&ALL_NAMES), Ordering::Relaxed);
    t.set_launch_source(Box::new(driver_layer_launches));
    // SAFETY: registers a function with no arguments that never unwinds (it runs inside
    // the panic boundary).
    unsafe { libc::atexit(at_exit) };
    gate::GATE.fetch_or(gate_bits(cfg.trace), Ordering::SeqCst);
    if !cfg.trace_calls {
        log::info(format_args!(
            "tracing: calls are not counted or timed (CUDAW_TRACE_CALLS=off)"
        ));
    }
    if !cfg.trace_driver {
        log::info(format_args!(
            "tracing: the driver layer records nothing: launches and copies made through the driver API (cuBLAS, cuDNN, Triton) are left out (CUDAW_TRACE_DRIVER=off)"
        ));
    }
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

/// The launches cudaw's driver layer counted under `metrics` (it hands over only those whose
/// buffers the memory history looks up: `crates/driver-shim`'s `trace::launch`), by kernel,
/// to `each`; nothing without a driver layer of cudaw's.
fn driver_layer_launches(each: &mut dyn FnMut(&str, u64)) {
    type Export = extern "C" fn(driver::hooks::TracedLaunches, *mut c_void);
    extern "C" fn one(ctx: *mut c_void, name: *const u8, len: usize, n: u64) {
        crate::boundary::guard("reading the driver layer's launches", (), || {
            // SAFETY: `ctx` is the `&mut &mut dyn FnMut` passed below, alive for the call.
            let each = unsafe { &mut *(ctx as *mut &mut dyn FnMut(&str, u64)) };
            // SAFETY: the driver layer passes its kernel name's bytes, `len` of them.
            let bytes = unsafe { std::slice::from_raw_parts(name, len) };
            each(&String::from_utf8_lossy(bytes), n);
        })
    }
    // SAFETY: dlsym reads the loader's tables; RTLD_DEFAULT searches the global scope.
    let f = unsafe {
        libc::dlsym(
            libc::RTLD_DEFAULT,
            driver::hooks::TRACED_LAUNCHES_SYMBOL.as_ptr(),
        )
    };
    if f.is_null() {
        return;
    }
    // SAFETY: cudaw's driver layer exports this name with the signature `Export`.
    let f: Export = unsafe { std::mem::transmute(f) };
    let mut each = each;
    f(
        one,
        &mut each as *mut &mut dyn FnMut(&str, u64) as *mut c_void,
    );
}

/// The process's tracer, when tracing is on (and not switched off by [`set_active`]).
#[inline]
pub fn tracer() -> Option<&'static Tracer> {
    let t = cudaw_trace::get()?;
    (!SUSPENDED.load(Ordering::Relaxed)).then_some(t)
}

/// Whether tracing is on: configured (`CUDAW_TRACE`) and not switched off.
pub fn enabled() -> bool {
    configured() && !SUSPENDED.load(Ordering::Relaxed)
}

/// Whether `CUDAW_TRACE` asked for tracing when the process started.
pub fn configured() -> bool {
    crate::config::get().trace != Mode::Off
}

/// The mode tracing runs in now: `CUDAW_TRACE`'s, or [`Mode::Off`] while switched off.
pub fn mode() -> Mode {
    if enabled() {
        crate::config::get().trace
    } else {
        Mode::Off
    }
}

// ------------------------------------------------------------------ switching on and off

/// Tracing is switched off ([`set_active`]): the tracer and what it holds are kept, nothing
/// new is recorded, and calls take the untraced paths.
static SUSPENDED: AtomicBool = AtomicBool::new(false);

/// Held while tracing is switched, and while a launch export is pointed elsewhere
/// ([`when_direct`]), so that the launch entries always match the tracing state.
static SWITCH: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// Runs `f`, which points a launch entry whose launches reach cudaw's driver layer at the
/// real runtime, if no wrapper of this library is needed for them now (mapped addressing,
/// and tracing off, switched off, or [`driver_layer_counts_launches`]), with the switch
/// held: a later switch installs what [`crate::wrappers`] picks then. Whether `f` ran.
pub(crate) fn when_direct(f: impl FnOnce()) -> bool {
    let _g = SWITCH.lock();
    let direct = !crate::memory::translated() && (!enabled() || driver_layer_counts_launches());
    if direct {
        f();
    }
    direct
}

/// Whether, tracing now, the launches that reach cudaw's driver layer are left to it: with
/// `metrics` (and `CUDAW_TRACE_DRIVER` on, and mapped addressing: the driver layer sees
/// the real runtime's pointers, which translated addressing makes differ), that layer
/// counts them in its own per-thread counters ([`driver_layer_launches`] adds them in
/// when read) and hands over the launches whose buffers the memory history looks up, so
/// the runtime's launch exports whose launches reach it ([`crate::launch_bypass`]) go
/// straight to the real runtime, as untraced. The timeline keeps this library's wrappers
/// (it records every launch, with the kernel's name from the registration).
pub(crate) fn driver_layer_counts_launches() -> bool {
    enabled()
        && mode() == Mode::Metrics
        && crate::config::get().trace_driver
        && !crate::memory::translated()
}

/// Switches tracing off (`false`) or back on (`true`) in this running process, which
/// started with `CUDAW_TRACE=metrics` or `timeline`: `cudaw-ckpt tracing PID off|on`, or a
/// program's own call of [`cudaw_trace_active_v1`](crate::wrappers::cudaw_trace_active_v1). Off, every call takes the path it
/// takes with `CUDAW_TRACE=off` (the gate word without the tracing bits, the launches'
/// thin wrappers, the driver layer told to stop recording); the counters, the memory
/// history and the timeline recorded so far stay readable, and recording resumes where it
/// left off when switched back on (calls made meanwhile are not counted; allocations made
/// meanwhile have no history). Returns whether tracing was on before.
pub fn set_active(on: bool, switch_launch_entries: fn(bool)) -> Result<bool, String> {
    if !configured() {
        return Err(
            "tracing is off in this process: start it with CUDAW_TRACE=metrics or timeline \
             to switch tracing on and off while it runs"
                .to_owned(),
        );
    }
    crate::dispatch::DISPATCH.ensure_initialised();
    let _g = SWITCH.lock();
    let was = !SUSPENDED.load(Ordering::SeqCst);
    if was == on {
        return Ok(was);
    }
    let bits = gate_bits(crate::config::get().trace);
    if on {
        SUSPENDED.store(false, Ordering::SeqCst);
        switch_launch_entries(true);
        driver_layer_mode(mode());
        gate::GATE.fetch_or(bits, Ordering::SeqCst);
    } else {
        gate::GATE.fetch_and(!bits, Ordering::SeqCst);
        driver_layer_mode(Mode::Off);
        switch_launch_entries(false);
        SUSPENDED.store(true, Ordering::SeqCst);
    }
    log::info(format_args!(
        "tracing switched {}",
        if on { "on" } else { "off" }
    ));
    Ok(was)
}

/// The gate bits tracing in `mode` sets.
fn gate_bits(mode: Mode) -> u32 {
    if !crate::config::get().trace_calls {
        return 0;
    }
    match mode {
        Mode::Off => 0,
        // The timeline's calls take the assembly fast path too: its thunk writes each
        // call's event into the thread's buffer ([`Block::events`]).
        Mode::Timeline | Mode::Metrics => gate::TRACING,
    }
}

/// The mode cudaw's driver layer records in while tracing runs in `mode`: none with
/// `CUDAW_TRACE_DRIVER=off`.
pub(crate) fn driver_mode(mode: Mode) -> Mode {
    if crate::config::get().trace_driver {
        mode
    } else {
        Mode::Off
    }
}

/// Tells cudaw's driver layer (`libcuda.so.1`), when it is the loaded driver, to record or
/// not (`driver::hooks::TRACE_MODE_SYMBOL`) while tracing runs in `mode`.
fn driver_layer_mode(mode: Mode) {
    let mode = driver_mode(mode);
    // SAFETY: dlopen with RTLD_NOLOAD only looks the loaded library up; dlsym reads the
    // loader's tables. The driver layer exports the name as `extern "C" fn(u32)`; no other
    // library exports it.
    unsafe {
        let h = libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        );
        if h.is_null() {
            return;
        }
        let f = libc::dlsym(h, driver::hooks::TRACE_MODE_SYMBOL.as_ptr());
        if !f.is_null() {
            let set: extern "C" fn(u32) = std::mem::transmute(f);
            set(trace_mode_word(mode));
        }
        libc::dlclose(h);
    }
}

/// `mode` as the driver shim's word for it.
pub fn trace_mode_word(mode: Mode) -> u32 {
    use driver::hooks::{TRACE_METRICS, TRACE_OFF, TRACE_TIMELINE};
    match mode {
        Mode::Off => TRACE_OFF,
        Mode::Metrics => TRACE_METRICS,
        Mode::Timeline => TRACE_TIMELINE,
    }
}

/// `CUDAW_TRACE_FILE` (`%p` in it standing for the PID), or `cudaw-PID.trace.json` in the
/// working folder ([`cudaw_trace::files::trace_file_for`]).
pub fn trace_file() -> PathBuf {
    cudaw_trace::files::trace_file_for(
        crate::config::get().trace_file.as_deref(),
        std::process::id(),
    )
}

// ------------------------------------------------------------------ the shadow stack

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
pub(crate) struct Block {
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

extern "C" {
    /// The calling thread's words (`trace.s`, [`TraceTls`]): 0 until [`block`] makes the
    /// block.
    fn cudaw_rt_trace_block() -> *mut *mut c_void;
    /// The thread-pointer offset of those words, which the gate's line keeps for the fast
    /// path ([`gate::set_trace_tls`]).
    fn cudaw_rt_trace_tls_offset() -> usize;
}

/// A thread's words of static TLS (`shim-build`'s `TRACE_TLS_*`): its block, and copies of
/// the block's `calls` and `mask`, which a call the sampling leaves untimed reads instead
/// of the block.
#[repr(C)]
struct TraceTls {
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

/// The calling thread's words.
fn thread_words() -> *mut TraceTls {
    // SAFETY: the accessor returns the address of the calling thread's static TLS words,
    // which live as long as the thread and are used by this thread only.
    unsafe { cudaw_rt_trace_block() }.cast()
}

/// The calling thread's block, made on first use (`None`: tracing is off).
fn block() -> Option<*mut Block> {
    if let Some(b) = existing_block() {
        return Some(b);
    }
    let t = tracer()?;
    let counters = t.thread_counters();
    let base = FUNCTION_BASE.load(Ordering::Relaxed);
    let slots = counters.flat_calls(base, ALL_NAMES.len())?;
    // Allocations are always timed: the shadow stack's frame gives their creation site.
    let always_timed = ALWAYS_TIMED.get().copied().unwrap_or(&[]);
    for &i in always_timed {
        if let Some(s) = slots.get(i) {
            s.time_always();
        }
    }
    // Exports whose arguments all travel in registers are called from the fast path's
    // own frame (their returns stay predicted), allocations excepted.
    if crate::config::get().trace_direct {
        for i in crate::dispatch::REGISTER_ARGS {
            if let (Some(s), false) = (slots.get(i), always_timed.contains(&i)) {
                s.call_direct();
            }
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
            crate::config::get().trace_sample.max(1) as u64 - 1,
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
    BLOCKS.lock().push(b as usize);
    // SAFETY: `b` is a fresh allocation, leaked for the life of the process; the frames
    // array has DEPTH + 1 elements, so both pointers are in bounds (or one past the end).
    unsafe {
        let first = std::ptr::addr_of_mut!((*b).frames).cast::<Frame>();
        (*b).top = first.add(1);
        (*b).limit = first.add(DEPTH + 1);
        // The fast path reads the calls pointer first: it goes last, each a volatile
        // store in this order (only this thread reads its words, a signal handler on it
        // included).
        let words = thread_words();
        std::ptr::addr_of_mut!((*words).block).write_volatile(b);
        std::ptr::addr_of_mut!((*words).mask).write_volatile(mask);
        std::ptr::addr_of_mut!((*words).calls).write_volatile(calls);
    }
    Some(b)
}

/// Moves the calls the fast thunk wrote into the thread's timeline buffer (`b`, the calling
/// thread's block) to the ring, under its lock, and empties the buffer.
fn flush_calls(b: &Block) {
    let base = b.events_base;
    if base.is_null() {
        return;
    }
    let Some(t) = tracer() else { return };
    if b.events.load(Ordering::Relaxed) == base {
        return;
    }
    t.push_batch(|push| {
        // SAFETY: the calling thread's own buffer: nothing else writes it meanwhile.
        unsafe { buffered_calls(b, push) };
        b.events.store(base, Ordering::Relaxed);
    });
}

/// A call the fast path made from its own frame (`shim-build`'s `TRACE_DIRECT`) that
/// returned to a full timeline buffer (calls nested in it filled it): the buffer goes to
/// the ring, then this call's event. Its counters are already updated.
pub(crate) extern "C" fn direct_full(index: u64, start: u64, ticks: u64) {
    DIRECT_FULL.fetch_add(1, Ordering::Relaxed);
    crate::boundary::guard("tracing a call", (), || {
        let Some(b) = existing_block() else { return };
        // SAFETY: blocks are leaked when made, never freed; this is the calling thread's.
        let b = unsafe { &*b };
        flush_calls(b);
        if let Some(t) = tracer() {
            let f = FUNCTION_BASE.load(Ordering::Relaxed) + index as u32;
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
pub fn direct_full_calls() -> u64 {
    DIRECT_FULL.load(Ordering::Relaxed)
}

/// Room left in the calling thread's timeline buffer, in calls (0 without one): the fast
/// path's test fills it exactly.
#[doc(hidden)]
pub fn timeline_room() -> usize {
    existing_block().map_or(0, |b| {
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

/// Calls [`direct_full`] recorded.
static DIRECT_FULL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Hands `each` the calls block `b`'s timeline buffer holds, as timeline events.
///
/// # Safety
/// Nobody empties the buffer meanwhile: the caller is its thread, or holds the ring's lock
/// (which emptying takes). Its thread may go on writing past the cursor read here.
unsafe fn buffered_calls(b: &Block, each: &mut dyn FnMut(cudaw_trace::timeline::Event)) {
    let base = b.events_base;
    if base.is_null() {
        return;
    }
    let fbase = FUNCTION_BASE.load(Ordering::Relaxed);
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
pub fn pending_calls() -> Vec<cudaw_trace::timeline::Event> {
    let mut out = Vec::new();
    for &b in BLOCKS.lock().iter() {
        // SAFETY: blocks are leaked when made, never freed; we run under the ring's lock,
        // which a thread takes to empty its buffer.
        unsafe { buffered_calls(&*(b as *const Block), &mut |e| out.push(e)) };
    }
    out
}

/// The calling thread's block, if it has one.
fn existing_block() -> Option<*mut Block> {
    // SAFETY: the thread's own TLS words.
    let b = unsafe { (*thread_words()).block };
    (!b.is_null()).then_some(b)
}

/// Every thread's block (addresses; blocks are never freed).
static BLOCKS: parking_lot::Mutex<Vec<usize>> = parking_lot::Mutex::new(Vec::new());

/// Calls timed on the Rust path rather than the assembly fast path (a pause, a thread's
/// first call, a full shadow stack or call buffer), summed over the threads: the summary
/// at exit reports them, and the tests check the fast path took the rest. Each thread
/// counts its own in its block with a plain add.
pub fn rust_enters() -> u64 {
    BLOCKS
        .lock()
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
pub unsafe fn enter(index: u32, slot: *mut usize) {
    let Some(b) = block() else { return };
    // SAFETY: this thread's block (leaked, never freed).
    unsafe { flush_calls(&*b) };
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
        slot.write(cudaw_trace_return as *const () as usize);
        (*f).start = ticks();
    }
}

/// The return thunk's work: ends the timing of the call whose return address was at
/// `slot` and returns that address.
extern "C" fn exit(slot: usize) -> usize {
    let end = ticks();
    // SAFETY: this thread's block (see `enter`); the search stays above the sentinel.
    let popped = existing_block().and_then(|b| unsafe {
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
        log::error(format_args!(
            "tracing: a traced call returned with no frame recorded (slot {slot:#x}); aborting"
        ));
        std::process::abort();
    };
    crate::boundary::guard("tracing a call", (), || {
        if let Some(t) = tracer() {
            let id = FUNCTION_BASE.load(Ordering::Relaxed) + f.index as u32;
            t.record_call_on(counters, id, f.start, end);
        }
    });
    f.ret
}

// The thunk a call timed in Rust returns into (and the fast thunk's fallback): %rsp is the
// return address's slot + 8. Saves the return registers (%rax, %rdx, %xmm0, %xmm1), calls
// exit(slot) on an aligned stack, restores them and jumps to the caller's real return
// address.
#[cfg(target_arch = "x86_64")]
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

// The same on AArch64: the slow path kept the return address at its stack pointer - 8
// (shim-build's `aarch64.rs`), so `slot` is the thunk's stack pointer - 8 on entry. Saves
// the return registers (x0-x7, q0-q3) around exit(slot) and returns to its result.
#[cfg(target_arch = "aarch64")]
std::arch::global_asm!(
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
    thunk = sym cudaw_trace_return,
    exit = sym exit,
);

extern "C" {
    /// The return thunk (defined above in assembly; never called directly).
    pub(crate) fn cudaw_trace_return();
}

/// The return address of the traced export call in progress on this thread (the
/// innermost cudaw sees), if any.
fn caller_address() -> Option<usize> {
    let b = existing_block()?;
    // SAFETY: this thread's block; `top - 1` is the sentinel at worst (slot usize::MAX).
    let f = unsafe { (*b).top.sub(1).read() };
    (f.slot != usize::MAX).then_some(f.ret)
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

/// The exports timed on every call whatever `CUDAW_TRACE_SAMPLE` says ([`init`]).
static ALWAYS_TIMED: std::sync::OnceLock<&'static [usize]> = std::sync::OnceLock::new();

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
    // The clock is read only where it is kept: the timeline's start, the last use.
    let timeline = t.timeline();
    let start = if timeline { t.now() } else { 0 };
    let rc = f();
    if rc == 0 {
        let end = t.now();
        let start = if timeline { start } else { end };
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

/// Runs the launch `run` of `rec`'s kernel, recording it (name, grid, block, the
/// allocations its arguments point into) when it succeeds
/// ([`cudaw_engine::trace::record_launch`]). `run` is told whether the timeline is on
/// (`None`: tracing is off) and returns the launch's result and whether cudaw's driver
/// layer recorded it already (then this layer does not); `sm` gives the device's SM number
/// for the kernel's parameter layout.
#[inline]
#[allow(clippy::too_many_arguments)]
pub fn launch(
    rec: Option<&registry::FunctionRecord>,
    lookup_ticks: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared: usize,
    args: *mut *mut c_void,
    sm: fn() -> u32,
    run: impl FnOnce(Option<bool>) -> (u32, bool),
) -> u32 {
    let Some(t) = tracer() else {
        return run(None).0;
    };
    // The clock is read only where it is kept: the timeline, and the last use of the
    // allocations the launch received (none for a kernel without pointers).
    let start = if t.timeline() { t.now() } else { 0 };
    let (rc, elsewhere) = run(Some(t.timeline()));
    if rc == 0 && !elsewhere {
        // SAFETY: `args` is the launch's argument array (the launch's contract, which
        // the real runtime relied on just now).
        unsafe {
            cudaw_engine::trace::record_launch(
                t,
                rec,
                lookup_ticks,
                grid,
                block,
                shared,
                args,
                sm,
                start,
            )
        };
    }
    rc
}

/// `f()` and, with `CUDAW_TRACE_SELF=1` and tracing on, the ticks it took (else 0): a launch
/// wrapper times its record lookup with it.
#[inline]
pub fn self_timed<R>(f: impl FnOnce() -> R) -> (R, u64) {
    cudaw_engine::trace::self_timed(tracer().is_some(), f)
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

extern "C" fn at_exit() {
    crate::boundary::guard("the trace summary at exit", (), || {
        cudaw_engine::trace::log_exit_summary(&trace_file(), pending_calls, rust_enters())
    })
}

//! `CUDAW_TRACE` at the driver layer: the launches and copies that callers other than
//! cudaw's runtime (cuBLAS, cuDNN, Triton) make through the driver are recorded in the
//! runtime shim's tracing store, through its tracing table
//! ([`driver::hooks::TraceHooks`], `cudaw_runtime_trace_v1`).
//!
//! The mode is read once, when this library initialises, into `MODE`: with tracing off
//! a launch wrapper pays one predictable branch on it, and the copy wrappers are not even
//! installed. A call made by a thread the runtime shim accounts for (inside one of its
//! wrapped calls, which record the launch or copy themselves) is not recorded again.
//! Launches record the kernel (its name, interned once per kernel), grid, block, shared
//! memory and stream and, where the module's parameter layout is known ([`crate::modules`]),
//! the argument words that may be pointers — the store finds the allocations they point
//! into (each thread keeps the layouts of the handles it launched: no lock per launch). The clock is read only where it is kept (the timeline, the last use of an
//! allocation), as in the runtime.

#![allow(non_snake_case)]

use cudaw_trace::driver_side::{self, probe, SLOTS};
use driver::hooks::{
    TraceHooks, TraceLaunch, TraceWord, RUNTIME_TRACE_SYMBOL, TRACE_OFF, TRACE_TIMELINE,
};
use driver::launch_args::{Args, Dims};
use fatbin::sites::PointerSites;
use fatbin::KernelInfo;
use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// `CUDAW_TRACE` as the runtime shim reads it ([`driver::hooks::TRACE_OFF`] without one).
static MODE: AtomicU32 = AtomicU32::new(TRACE_OFF);

static HOOKS: OnceLock<Option<&'static TraceHooks>> = OnceLock::new();

fn find() -> Option<&'static TraceHooks> {
    // SAFETY: dlsym reads the loader's tables; RTLD_DEFAULT searches the global scope.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, RUNTIME_TRACE_SYMBOL.as_ptr()) };
    if f.is_null() {
        return None;
    }
    // SAFETY: the runtime shim exports this name as `extern "C" fn() -> *const
    // TraceHooks`; no other library exports it.
    let get: extern "C" fn() -> *const TraceHooks = unsafe { std::mem::transmute(f) };
    // SAFETY: a pointer to the runtime shim's static table (never freed), or null.
    let h = unsafe { get().as_ref() }?;
    (h.size >= std::mem::size_of::<TraceHooks>()).then_some(h)
}

/// The runtime shim's tracing table, if it is loaded.
pub fn hooks() -> Option<&'static TraceHooks> {
    *HOOKS.get_or_init(find)
}

/// `CUDAW_TRACE_BUFFER_SAMPLE` as the runtime shim reads it (a power of two).
static BUFFER_SAMPLE: AtomicU32 = AtomicU32::new(64);

/// Reads the mode from the runtime shim (once, while this library initialises).
pub fn init() {
    if let Some(h) = hooks() {
        let mode = (h.mode)();
        MODE.store(mode, Ordering::Relaxed);
        let sample = (h.buffer_sample)();
        if sample.is_power_of_two() {
            BUFFER_SAMPLE.store(sample, Ordering::Relaxed);
        }
        if mode != TRACE_OFF {
            crate::log::debug(format_args!(
                "tracing the driver's launches and copies into the runtime's store"
            ));
        }
    }
}

/// The tracing switch (`driver::hooks::TRACE_MODE_SYMBOL`): the runtime shim calls it
/// with the mode in force when tracing is switched on or off in a running process. The
/// copy wrappers, installed when tracing was on at start, forward untouched while it is
/// off.
#[no_mangle]
pub extern "C" fn cudaw_driver_trace_mode_v1(mode: u32) {
    let mode = if mode <= TRACE_TIMELINE {
        mode
    } else {
        TRACE_OFF
    };
    MODE.store(mode, Ordering::Relaxed);
}

/// Whether tracing is on: the one test a launch pays with tracing off.
#[inline(always)]
pub fn on() -> bool {
    MODE.load(Ordering::Relaxed) != TRACE_OFF
}

fn timeline() -> bool {
    MODE.load(Ordering::Relaxed) == TRACE_TIMELINE
}

/// A launch's argument words that may be pointers: on the stack for up to 16.
type Words = smallvec::SmallVec<[TraceWord; 16]>;

/// A launch's argument words that may be pointers ([`driver_side::pointer_words`]) from
/// its `params` or `extra` buffer.
fn pointer_words(
    layout: &KernelInfo,
    args: &Args,
    span: (u64, u64),
    sites: Option<&parking_lot::Mutex<PointerSites>>,
    out: &mut Words,
) {
    if args.is_empty() {
        return;
    }
    let bytes = |p: &fatbin::ParamInfo| args.param(p.ordinal, p.offset, p.size);
    driver_side::pointer_words(layout, bytes, span, sites, |param, value| {
        out.push(TraceWord { param, value })
    });
}

/// [`driver_side::site_words`] from a launch's `params` or `extra` buffer: `false` when
/// the kernel's sites are not ready (scan instead).
fn site_words(
    sites: &parking_lot::Mutex<PointerSites>,
    args: &Args,
    span: (u64, u64),
    out: &mut Words,
    bytes: &mut u64,
) -> bool {
    // SAFETY: a scan of this kernel found a whole word at `s.at` in the parameter.
    let word = |s: &fatbin::sites::Site| unsafe { args.word(s.param, s.offset, s.at) };
    let push = |param, value| out.push(TraceWord { param, value });
    match driver_side::site_words(sites, word, span, push) {
        Some(n) => {
            *bytes = n;
            true
        }
        None => false,
    }
}

/// One thread's layouts of the handles it launched: a table with the launch counts' slots
/// (`crate::counts::probe`), valid for one generation of handles
/// ([`crate::counts::generation`]). On the heap: this library's static TLS stays small.
struct Layouts {
    generation: Cell<u64>,
    slots: RefCell<[LayoutSlot; SLOTS]>,
}

/// A handle and its kernel's layout (`None`: unknown), or nothing cached.
type LayoutSlot = Option<(usize, Option<Arc<KernelInfo>>)>;

thread_local! {
    static LAYOUTS: Box<Layouts> = Box::new(Layouts {
        generation: Cell::new(0),
        slots: RefCell::new([const { None }; SLOTS]),
    });
}

/// Runs `f` with the parameter layout of `handle`'s kernel (`None`: unknown): from the
/// thread's table, else from [`crate::modules::layout`] (whose lock is taken on a thread's
/// first launch of a handle), without cloning it on the way.
fn with_layout<R>(handle: usize, f: impl FnOnce(Option<&KernelInfo>) -> R) -> R {
    let generation = crate::counts::generation();
    let mut f = Some(f);
    let r = LAYOUTS.try_with(|c| {
        let Ok(mut slots) = c.slots.try_borrow_mut() else {
            return None;
        };
        if c.generation.get() != generation {
            slots.iter_mut().for_each(|s| *s = None);
            c.generation.set(generation);
        }
        let i = probe(handle, |i| slots[i].as_ref().map_or(0, |(h, _)| *h)).unwrap_or_else(|i| {
            slots[i] = Some((handle, crate::modules::layout(handle)));
            i
        });
        let layout = slots[i].as_ref().and_then(|(_, l)| l.as_deref());
        f.take().map(|f| f(layout))
    });
    match (r, f) {
        (Ok(Some(v)), _) => v,
        (_, Some(f)) => f(crate::modules::layout(handle).as_deref()),
        // `f` ran: its result was returned above.
        (_, None) => unreachable!("the layout closure ran without a result"),
    }
}

/// Whether the calling thread is inside a launch cudaw's runtime records itself: its flags
/// word (`TraceHooks::thread_flags`), whose address the thread's in-flight block keeps
/// (`flags`, unused otherwise by this library) after the first ask: two loads.
#[inline]
fn runtime_records_launch(h: &TraceHooks) -> bool {
    let b = crate::inflight::block();
    let mut p = b.flags.load(Ordering::Relaxed);
    if p == 0 {
        p = (h.thread_flags)() as usize;
        if p == 0 {
            return false;
        }
        b.flags.store(p, Ordering::Relaxed);
    }
    // SAFETY: the runtime shim's static TLS word of this thread, alive as long as the
    // thread (whose own block holds the address).
    let flags = unsafe { &*(p as *const std::sync::atomic::AtomicUsize) };
    flags.load(Ordering::Relaxed) & driver::hooks::RECORDING_LAUNCH != 0
}

/// Counts the launch `f` of handle `handle` ([`crate::counts::count`]) and runs it,
/// recording it when it succeeds, tracing is on and the caller is not cudaw's runtime
/// (which records its own). With `metrics`, the launch is counted here
/// ([`crate::counts::count_traced`]: the runtime shim adds these counts in when it reads
/// its own) and only one launch in `CUDAW_TRACE_BUFFER_SAMPLE` of each thread's launches of
/// a handle goes further (its kernel and argument words to the memory history): the others
/// cost what an untraced launch does, and a few plain adds. With the timeline, every
/// launch is recorded. `dims` gives the launch's grid, block, shared memory and stream
/// (read only for a launch recorded).
///
/// `f` is called from one place, so that it is inlined here: a traced launch runs the
/// real launch from the wrapper's own frame, as an untraced one does (a frame more on the
/// way down costs the caller's returns their predictions, the driver's call chain being
/// deep).
#[inline(always)]
pub fn launch(
    handle: usize,
    dims: impl FnOnce() -> Option<Dims>,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    f: impl FnOnce() -> u32,
) -> u32 {
    let plan = if on() {
        plan(handle)
    } else {
        crate::counts::count(handle);
        None
    };
    let start = match plan {
        Some((h, _, None)) => (h.now)(),
        _ => 0,
    };
    let rc = f();
    if let Some((h, k, sampled)) = plan {
        if rc == 0 {
            let end = if sampled.is_none() { (h.now)() } else { 0 };
            if let Some(d) = dims() {
                record_launch(h, handle, k, sampled, d, params, extra, (start, end));
            }
        }
    }
    rc
}

/// What a launch of `handle` with tracing on records after it runs ([`record_launch`]'s
/// hooks, kernel and weight: `None` for the timeline), having counted it; `None` when
/// it records nothing (the runtime shim records it, or `metrics` leaves it at counting).
#[inline(always)]
fn plan(
    handle: usize,
) -> Option<(
    &'static TraceHooks,
    &'static crate::counts::Kernel,
    Option<u32>,
)> {
    let h = match hooks() {
        Some(h) if !runtime_records_launch(h) => h,
        _ => {
            crate::counts::count(handle);
            return None;
        }
    };
    if timeline() {
        return Some((h, crate::counts::count(handle), None));
    }
    let (k, seen) = crate::counts::count_traced(handle);
    let sample = BUFFER_SAMPLE.load(Ordering::Relaxed);
    if seen & u64::from(sample - 1) != 0 {
        return None;
    }
    Some((h, k, Some(sample)))
}

/// The recording part of [`launch`], out of line: the launches it leaves at counting (all
/// but one in `CUDAW_TRACE_BUFFER_SAMPLE` under `metrics`) run the real launch from the
/// wrapper's own small frame, as untraced ones do. `sampled`: the launch's weight in the
/// history under `metrics` (`None`: the timeline, which counts it with the runtime);
/// `(start, end)`: its times under the timeline.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn record_launch(
    h: &TraceHooks,
    handle: usize,
    k: &'static crate::counts::Kernel,
    sampled: Option<u32>,
    d: Dims,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    (start, end): (u64, u64),
) {
    let timeline = sampled.is_none();
    let timed = driver::selfcost::enabled();
    let ticks = driver::selfcost::ticks;
    let t0 = if timed { ticks() } else { 0 };
    let kernel = k.trace_id(|name| (h.kernel_id)(name.as_ptr(), name.len()));
    let weight = match sampled {
        Some(w) => w,
        None => (h.count_launch)(kernel),
    };
    let t1 = if timed { ticks() } else { 0 };
    let mut words = Words::new();
    let mut bytes = 0u64;
    let mut tl = 0;
    // The words of one launch in CUDAW_TRACE_BUFFER_SAMPLE of each kernel go to the memory
    // history; the timeline keeps every launch's (resolved when it is read).
    // A sampled launch is scanned whole (teaching the kernel's pointer sites); the
    // timeline's others read the learned sites.
    let mut span = (0u64, 0u64);
    if weight != 0 || timeline {
        (h.memory_span)(&mut span.0, &mut span.1);
    }
    // SAFETY: the arguments of the launch that just succeeded with them, read in its
    // wrapper: one pointer per parameter, or an `extra` list ended by its end key.
    let args = unsafe { Args::new(params, extra) };
    let short = weight == 0 && timeline && {
        if timed {
            tl = ticks();
        }
        site_words(&k.sites, &args, span, &mut words, &mut bytes)
    };
    // Whether this layer knows the kernel's parameter layout (where it read no words).
    let mut known = short;
    if !short && (weight != 0 || timeline) {
        with_layout(handle, |layout| {
            if let Some(layout) = layout {
                known = true;
                if timed {
                    tl = ticks();
                }
                pointer_words(layout, &args, span, Some(&k.sites), &mut words);
                if timed {
                    bytes = layout.params.iter().map(|p| p.size as u64).sum();
                }
            }
        });
    }
    let t2 = if timed { ticks() } else { 0 };
    let (start, end) = match (timeline, words.is_empty()) {
        (true, _) => (start, end),
        (false, true) => (0, 0),
        (false, false) => {
            let now = (h.now)();
            (now, now)
        }
    };
    let launch = TraceLaunch {
        kernel,
        grid: d.grid,
        block: d.block,
        shared: d.shared,
        stream: d.stream as u64,
        start,
        end,
        words: if words.is_empty() {
            std::ptr::null()
        } else {
            words.as_ptr()
        },
        words_len: words.len(),
    };
    // A sampled launch of a kernel whose layout this layer lacks (the real runtime's
    // kernels, when their images did not pass through it): the runtime shim may know the
    // kernel by name from the program's registration, and read the words itself.
    let by_name = !timeline
        && !known
        && weight != 0
        && extra.is_null()
        && (h.record_named_launch)(&launch, k.name.as_ptr(), k.name.len(), params, weight) != 0;
    // Counted already: without the timeline, a launch whose buffers are not looked up
    // has nothing more to record.
    if !by_name && (timeline || weight != 0) {
        (h.record_counted_launch)(&launch, weight);
    }
    if timed && SELF_COST.begin(t0) {
        // Without a layout, the whole span is the layout lookup's.
        let tl = if tl == 0 { t2 } else { tl };
        SELF_COST.add(0, t1.saturating_sub(t0));
        SELF_COST.add(1, tl.saturating_sub(t1));
        SELF_COST.add(2, t2.saturating_sub(tl));
        SELF_COST.add(3, ticks().saturating_sub(t2));
        SELF_COST.end(words.len() as u64, bytes);
        SITE_READS.fetch_add(u64::from(short), Ordering::Relaxed);
        static AT_EXIT: std::sync::Once = std::sync::Once::new();
        // SAFETY: registers a function with no arguments that never unwinds (it catches).
        AT_EXIT.call_once(|| unsafe {
            libc::atexit(report_self_cost);
        });
    }
}

/// `CUDAW_TRACE_SELF=1`: of the launches timed, those whose words were read at their
/// kernels' learned pointer sites.
static SITE_READS: AtomicU64 = AtomicU64::new(0);

/// `CUDAW_TRACE_SELF=1`: the phases of this layer's traced launches (reported at exit).
static SELF_COST: driver::selfcost::SelfCost = driver::selfcost::SelfCost::new(
    "driver layer",
    ["kernel id", "layout", "argument words", "record", ""],
    None,
);

extern "C" fn report_self_cost() {
    crate::boundary::guard("the self-cost report", (), || {
        if let Some(line) = SELF_COST.report(driver::selfcost::ticks()) {
            // How often the per-thread caches keyed by handle were found stale (handles
            // renamed or forgotten) and layouts looked up past them: each costs launches
            // a lock and a hash.
            crate::log::warn(format_args!(
                "trace: {line}; handle generation {}, {} layout lookups past the threads' caches; {} read at their kernels' learned pointer sites",
                crate::counts::generation(),
                crate::modules::layout_lookups(),
                SITE_READS.load(Ordering::Relaxed)
            ));
        }
    })
}

/// `cudaMemcpyKind` values, as the runtime's store records them.
pub(crate) const HTOD: i32 = 1;
pub(crate) const DTOH: i32 = 2;
pub(crate) const DTOD: i32 = 3;
pub(crate) const DEFAULT: i32 = 4;

/// Runs the copy `f` of `bytes` from `src` to `dst`, recording it when tracing is on, it
/// succeeds and the caller is not cudaw's runtime (the driver API's copies,
/// [`crate::copies`]).
pub(crate) fn copy(
    direction: i32,
    bytes: usize,
    dst: u64,
    src: u64,
    f: impl FnOnce() -> u32,
) -> u32 {
    let Some(h) = hooks() else { return f() };
    if !on() || crate::runtime::runtime_accounts() {
        return f();
    }
    let timeline = timeline();
    let start = if timeline { (h.now)() } else { 0 };
    let rc = f();
    if rc == 0 {
        let end = (h.now)();
        let start = if timeline { start } else { end };
        (h.record_copy)(direction, bytes as u64, dst, src, start, end);
    }
    rc
}

//! Tracing and metrics for cudaw, fed by the drop-in runtime (`cudart-shim`) and, later, by
//! the driver shim: one [`Tracer`] per process holds
//!
//! - **metrics**: per function, the call count and the total and largest time in the call;
//!   per kernel, launches; per copy direction, copies and bytes. Each thread counts in its
//!   own [`counters::ThreadCounters`] (plain loads and stores, no shared cache line, no
//!   lock); [`Tracer::stats`] merges them on read.
//! - the **timeline** (mode [`Mode::Timeline`]): every call with its start and duration,
//!   launches with grid, block and the allocations their arguments point into, copies,
//!   allocations, frees, pauses and resumes, in a bounded ring ([`timeline::Ring`]) that
//!   drops its oldest events when full; written as Chrome trace-event JSON (Perfetto opens
//!   it) by [`Tracer::write_timeline`].
//! - the **memory history** ([`history::History`]): per allocation, its creation (size,
//!   order, API, the calling library), copies in and out, the kernels that received it and
//!   its last use; the hottest and coldest allocations on request.
//!
//! Time is read from a tick source the host library installs ([`Config::clock`]: the TSC
//! in the shim, [`instant_ticks`] by default) and converted to nanoseconds on read
//! ([`Clock`]). Pure, safe Rust: the host library supplies addresses, names and ticks.

#![forbid(unsafe_code)]

pub mod counters;
pub mod driver_side;
pub mod files;
pub mod history;
pub mod report;
pub mod timeline;

use counters::ThreadCounters;
use history::History;
use parking_lot::{Mutex, RwLock};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use timeline::{Event, Ring};

pub use report::{AllocStat, CallStat, CopyStat, KernelStat, Stats};

/// What `CUDAW_TRACE` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    /// Nothing is recorded (the default).
    Off,
    /// Counters and the memory history.
    Metrics,
    /// Counters, the memory history and the timeline ring.
    Timeline,
}

impl Mode {
    /// Parses `CUDAW_TRACE`: `metrics`, `timeline`, or `off` (also empty, `0`, `none`).
    pub fn parse(s: &str) -> Result<Mode, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "off" | "0" | "none" => Ok(Mode::Off),
            "metrics" | "1" | "on" => Ok(Mode::Metrics),
            "timeline" => Ok(Mode::Timeline),
            other => Err(format!(
                "CUDAW_TRACE={other:?} is not metrics, timeline or off"
            )),
        }
    }

    /// `off`, `metrics` or `timeline`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Metrics => "metrics",
            Mode::Timeline => "timeline",
        }
    }
}

/// The default number of events the timeline ring holds.
pub const DEFAULT_RING_EVENTS: usize = 1 << 20;

/// How a [`Tracer`] is set up.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// What to record.
    pub mode: Mode,
    /// The timeline ring's capacity in events (oldest dropped beyond it).
    pub ring_events: usize,
    /// The tick source: monotonic, at a constant rate (calibrated against [`Instant`]);
    /// `None`: [`instant_ticks`] (nanoseconds).
    pub clock: Option<fn() -> u64>,
    /// Of each thread's launches of a kernel, those whose argument buffers the memory
    /// history looks up: one in this many (a power of two; the first launch always; 1:
    /// every launch). Such a launch counts this many times there (an estimate of the
    /// launches each allocation received): [`Tracer::count_launch`]. The others are
    /// counted as launches only; the timeline keeps every launch's words, whatever this
    /// is, and resolves them when it is written.
    pub buffer_sample: u32,
}

impl Config {
    /// `mode` with the default ring, the [`Instant`] clock and every launch's buffers
    /// looked up in the memory history.
    pub fn new(mode: Mode) -> Config {
        Config {
            mode,
            ring_events: DEFAULT_RING_EVENTS,
            clock: None,
            buffer_sample: 1,
        }
    }
}

static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds since the first call: the default tick source.
pub fn instant_ticks() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// A tick source and its rate, measured against [`Instant`].
pub struct Clock {
    now: fn() -> u64,
    /// Whether `now` counts nanoseconds already ([`instant_ticks`]).
    nanoseconds: bool,
    t0: u64,
    i0: Instant,
    /// Ticks per nanosecond measured at start (over a short spin), used until the process
    /// has run long enough for the whole span to be the better measure.
    initial: f64,
}

impl Clock {
    /// Calibrates `source` (spinning about 2 ms); `None`: [`instant_ticks`].
    pub fn new(source: Option<fn() -> u64>) -> Clock {
        let now = source.unwrap_or(instant_ticks);
        let i0 = Instant::now();
        let t0 = now();
        let initial = if source.is_none() {
            1.0
        } else {
            loop {
                let ns = i0.elapsed().as_nanos() as u64;
                if ns >= 2_000_000 {
                    let t = now();
                    break t.wrapping_sub(t0) as f64 / ns as f64;
                }
                std::hint::spin_loop();
            }
        };
        Clock {
            now,
            nanoseconds: source.is_none(),
            t0,
            i0,
            initial: if initial > 0.0 { initial } else { 1.0 },
        }
    }

    /// Ticks now.
    #[inline]
    pub fn now(&self) -> u64 {
        (self.now)()
    }

    /// Ticks per nanosecond.
    pub fn rate(&self) -> f64 {
        if self.nanoseconds {
            return 1.0;
        }
        let ns = self.i0.elapsed().as_nanos() as u64;
        if ns < 200_000_000 {
            return self.initial;
        }
        let t = self.now().wrapping_sub(self.t0) as f64;
        let r = t / ns as f64;
        if r > 0.0 {
            r
        } else {
            self.initial
        }
    }

    /// Nanoseconds for `ticks` at `rate` ticks per nanosecond.
    pub fn ns(ticks: u64, rate: f64) -> f64 {
        ticks as f64 / rate
    }

    /// Nanoseconds from the tracer's start to tick `t` at `rate`.
    pub fn since_start(&self, t: u64, rate: f64) -> f64 {
        t.wrapping_sub(self.t0) as i64 as f64 / rate
    }

    /// The tick the tracer started at.
    pub fn start(&self) -> u64 {
        self.t0
    }
}

/// A copy's direction, numbered as `cudaMemcpyKind` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Host to host.
    HtoH = 0,
    /// Host to device.
    HtoD = 1,
    /// Device to host.
    DtoH = 2,
    /// Device to device.
    DtoD = 3,
    /// Inferred from the addresses (`cudaMemcpyDefault`).
    Default = 4,
}

impl Direction {
    /// Every direction, in `cudaMemcpyKind` order.
    pub const ALL: [Direction; 5] = [
        Direction::HtoH,
        Direction::HtoD,
        Direction::DtoH,
        Direction::DtoD,
        Direction::Default,
    ];

    /// From a `cudaMemcpyKind` (anything unknown: [`Direction::Default`]).
    pub fn from_kind(kind: i32) -> Direction {
        match kind {
            0 => Direction::HtoH,
            1 => Direction::HtoD,
            2 => Direction::DtoH,
            3 => Direction::DtoD,
            _ => Direction::Default,
        }
    }

    /// `HtoD`, `DtoH`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::HtoH => "HtoH",
            Direction::HtoD => "HtoD",
            Direction::DtoH => "DtoH",
            Direction::DtoD => "DtoD",
            Direction::Default => "Default",
        }
    }
}

/// Names interned to small numbers (kernels), with their demangled forms made on read.
#[derive(Default)]
struct Interner {
    ids: HashMap<String, u32>,
    names: Vec<Arc<str>>,
}

/// Every function table registered, flattened: id → name.
#[derive(Default)]
struct Functions {
    names: Vec<&'static str>,
}

/// A launch's shape: grid and block dimensions, dynamic shared memory in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchShape {
    /// Grid dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub shared: u32,
}

/// The process's tracer.
pub struct Tracer {
    id: usize,
    mode: Mode,
    clock: Clock,
    functions: RwLock<Functions>,
    kernels: RwLock<Interner>,
    threads: Mutex<Vec<Arc<ThreadCounters>>>,
    next_tid: AtomicU32,
    ring: Option<Mutex<Ring>>,
    history: Mutex<History>,
    /// The history's span (lowest base, an end no live allocation passes), read without
    /// its lock: [`Tracer::memory_span`].
    span: [AtomicU64; 2],
    pauses: Mutex<report::PauseStat>,
    /// [`Config::buffer_sample`] (a power of two).
    buffer_sample: u32,
    /// Counters of calls made after a thread's own were destroyed (at exit).
    late: OnceLock<Arc<ThreadCounters>>,
    late_lock: Mutex<()>,
    /// Launches counted outside the store ([`Tracer::set_launch_source`]).
    launch_source: OnceLock<LaunchSource>,
}

/// What [`Tracer::set_launch_source`] takes: a function that hands each kernel (its mangled
/// name) and the launches of it counted elsewhere to the closure it is given.
pub type LaunchSource = Box<dyn Fn(&mut dyn FnMut(&str, u64)) + Send + Sync>;

static NEXT_TRACER: AtomicU32 = AtomicU32::new(1);
static GLOBAL: OnceLock<Tracer> = OnceLock::new();

thread_local! {
    /// This thread's counters, per tracer (one in a process; tests make several).
    static LOCAL: RefCell<Vec<(usize, Arc<ThreadCounters>)>> = const { RefCell::new(Vec::new()) };
    /// The counters of the tracer this thread used last: a plain reference, no destructor,
    /// so the common case is one thread-local read, and calls made while the thread exits
    /// still count.
    static LAST: std::cell::Cell<Option<(usize, &'static ThreadCounters)>> =
        const { std::cell::Cell::new(None) };
}

/// Installs the process's tracer (the first call wins) and returns it.
pub fn install(cfg: Config) -> &'static Tracer {
    GLOBAL.get_or_init(|| Tracer::new(cfg))
}

/// The process's tracer, if one was installed with a mode other than [`Mode::Off`].
#[inline]
pub fn get() -> Option<&'static Tracer> {
    GLOBAL.get().filter(|t| t.mode != Mode::Off)
}

impl Tracer {
    /// A tracer of its own (the process's is [`install`]ed).
    pub fn new(cfg: Config) -> Tracer {
        let clock = if cfg.mode == Mode::Off {
            Clock {
                now: cfg.clock.unwrap_or(instant_ticks),
                nanoseconds: cfg.clock.is_none(),
                t0: 0,
                i0: Instant::now(),
                initial: 1.0,
            }
        } else {
            Clock::new(cfg.clock)
        };
        Tracer {
            id: NEXT_TRACER.fetch_add(1, Ordering::Relaxed) as usize,
            mode: cfg.mode,
            clock,
            functions: RwLock::new(Functions::default()),
            kernels: RwLock::new(Interner::default()),
            threads: Mutex::new(Vec::new()),
            next_tid: AtomicU32::new(1),
            ring: (cfg.mode == Mode::Timeline)
                .then(|| Mutex::new(Ring::new(cfg.ring_events.max(16)))),
            history: Mutex::new(History::default()),
            span: [AtomicU64::new(0), AtomicU64::new(0)],
            pauses: Mutex::new(report::PauseStat::default()),
            buffer_sample: cfg.buffer_sample.max(1).next_power_of_two(),
            late: OnceLock::new(),
            late_lock: Mutex::new(()),
            launch_source: OnceLock::new(),
        }
    }

    /// Adds launches counted outside the store to its per-kernel counts whenever they are
    /// read ([`Tracer::stats`]): a host library whose launches are counted by another layer
    /// (cudaw's driver layer counts them in its own per-thread counters and hands over only
    /// those whose buffers the memory history looks up). The first source set stays; false
    /// when one was set already.
    pub fn set_launch_source(&self, source: LaunchSource) -> bool {
        self.launch_source.set(source).is_ok()
    }

    /// What this tracer records.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether the timeline is kept.
    #[inline]
    pub fn timeline(&self) -> bool {
        self.ring.is_some()
    }

    /// The clock.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Ticks now.
    #[inline]
    pub fn now(&self) -> u64 {
        self.clock.now()
    }

    /// Registers a table of function names (one library's exports); returns the id of its
    /// first name: name `i` of the table is function `base + i` in [`Tracer::record_call`].
    pub fn register_functions(&self, names: &[&'static str]) -> u32 {
        let mut f = self.functions.write();
        let base = f.names.len() as u32;
        f.names.extend_from_slice(names);
        base
    }

    /// The number a kernel (by its mangled name) is counted under.
    pub fn kernel_id(&self, mangled: &str) -> u32 {
        if let Some(&id) = self.kernels.read().ids.get(mangled) {
            return id;
        }
        let mut k = self.kernels.write();
        if let Some(&id) = k.ids.get(mangled) {
            return id;
        }
        let id = k.names.len() as u32;
        k.names.push(Arc::from(mangled));
        k.ids.insert(mangled.to_owned(), id);
        id
    }

    /// A kernel's mangled name.
    pub fn kernel_name(&self, id: u32) -> Option<Arc<str>> {
        self.kernels.read().names.get(id as usize).cloned()
    }

    /// The calling thread's counters (registered on first use); once the thread's own are
    /// gone (calls made while it exits), shared ones under a lock.
    #[inline]
    fn local<R>(&self, f: impl FnOnce(&ThreadCounters) -> R) -> R {
        if let Ok(Some((id, c))) = LAST.try_with(|l| l.get()) {
            if id == self.id {
                return f(c);
            }
        }
        self.local_slow(f)
    }

    /// This thread's counters, kept for the life of the process (the tracer keeps every
    /// thread's anyway, to merge them): what a host library caches beside its own
    /// per-thread state, to count with [`Tracer::record_call_on`].
    pub fn thread_counters(&self) -> &'static ThreadCounters {
        if let Ok(Some((id, c))) = LAST.try_with(|l| l.get()) {
            if id == self.id {
                return c;
            }
        }
        self.local_slow(|_| ());
        match LAST.try_with(|l| l.get()) {
            Ok(Some((id, c))) if id == self.id => c,
            // The thread is exiting: counters of its own, registered, for the rest of it.
            _ => {
                let c = Arc::new(ThreadCounters::new(
                    self.next_tid.fetch_add(1, Ordering::Relaxed),
                    None,
                ));
                self.threads.lock().push(c.clone());
                Box::leak(Box::new(c))
            }
        }
    }

    /// [`Tracer::record_call`] on counters from [`Tracer::thread_counters`].
    #[inline]
    pub fn record_call_on(&self, c: &ThreadCounters, f: u32, start: u64, end: u64) {
        c.call(f as usize, end.wrapping_sub(start));
        if self.ring.is_some() {
            self.push(Event::Call {
                f,
                tid: c.tid,
                start,
                end,
            });
        }
    }

    #[cold]
    fn local_slow<R>(&self, f: impl FnOnce(&ThreadCounters) -> R) -> R {
        let mut f = Some(f);
        let r = LOCAL.try_with(|l| {
            let Ok(b) = l.try_borrow() else { return None };
            if let Some((_, c)) = b.iter().find(|(id, _)| *id == self.id) {
                let forever: &'static ThreadCounters = Box::leak(Box::new(c.clone()));
                let _ = LAST.try_with(|l| l.set(Some((self.id, forever))));
                return f.take().map(|f| f(c));
            }
            drop(b);
            let c = Arc::new(ThreadCounters::new(
                self.next_tid.fetch_add(1, Ordering::Relaxed),
                std::thread::current().name().map(str::to_owned),
            ));
            self.threads.lock().push(c.clone());
            l.try_borrow_mut().ok()?.push((self.id, c.clone()));
            // One clone kept for good: the thread-local cache holds a plain reference.
            let forever: &'static ThreadCounters = Box::leak(Box::new(c.clone()));
            let _ = LAST.try_with(|l| l.set(Some((self.id, forever))));
            f.take().map(|f| f(&c))
        });
        match (r, f) {
            (Ok(Some(v)), _) => v,
            (_, Some(f)) => {
                let late = self.late.get_or_init(|| {
                    let c = Arc::new(ThreadCounters::new(0, Some("exiting threads".into())));
                    self.threads.lock().push(c.clone());
                    c
                });
                let _one_writer = self.late_lock.lock();
                f(late)
            }
            // `f` ran but its value was lost: never, as `f` runs at most once above.
            (_, None) => unreachable!("the counter closure ran without a result"),
        }
    }

    /// The calling thread's number in the timeline.
    pub fn thread_id(&self) -> u32 {
        self.local(|c| c.tid)
    }

    fn push(&self, e: Event) {
        if let Some(r) = &self.ring {
            r.lock().push(e);
        }
    }

    /// Runs `f` under the timeline ring's lock with a function that adds an event to it
    /// (nothing without a timeline): a thread's buffered calls go in at once.
    pub fn push_batch(&self, f: impl FnOnce(&mut dyn FnMut(Event))) {
        if let Some(r) = &self.ring {
            let mut g = r.lock();
            f(&mut |e| g.push(e));
        }
    }

    /// One call of function `f` (see [`Tracer::register_functions`]) from tick `start` to
    /// tick `end`.
    #[inline]
    pub fn record_call(&self, f: u32, start: u64, end: u64) {
        let d = end.wrapping_sub(start);
        let tid = self.local(|c| {
            c.call(f as usize, d);
            c.tid
        });
        if self.ring.is_some() {
            self.push(Event::Call { f, tid, start, end });
        }
    }

    /// A kernel launch: `words` are the 8-byte words of its arguments that may be pointers
    /// (each with the parameter it came from), from the parameter layout; those inside a
    /// known allocation are the buffers it received.
    #[allow(clippy::too_many_arguments)]
    pub fn record_launch(
        &self,
        kernel: u32,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        start: u64,
        end: u64,
        words: &[(u16, u64)],
    ) {
        self.record_launch_words(
            kernel,
            grid,
            block,
            shared,
            start,
            end,
            words.iter().copied(),
        )
    }

    /// [`Tracer::record_launch`] with the words as an iterator (read where they are, not
    /// copied first).
    #[allow(clippy::too_many_arguments)]
    pub fn record_launch_words<I>(
        &self,
        kernel: u32,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        start: u64,
        end: u64,
        words: I,
    ) where
        I: ExactSizeIterator<Item = (u16, u64)> + Clone,
    {
        let weight = self.count_launch(kernel);
        let shape = LaunchShape {
            grid,
            block,
            shared,
        };
        self.record_counted_launch(kernel, shape, start, end, words, weight);
    }

    /// Counts one launch of `kernel` on the calling thread, and says whether the memory
    /// history is to look its argument buffers up ([`Config::buffer_sample`]): the weight
    /// they count with there, or 0 when not (only one launch in the sample rate of each
    /// thread's launches of a kernel, the first included). A launch layer calls this first,
    /// reads the words when it says so (and, with the timeline, always), then
    /// [`Tracer::record_counted_launch`].
    #[inline]
    pub fn count_launch(&self, kernel: u32) -> u32 {
        let before = self.local(|c| c.launch(kernel as usize));
        if before & u64::from(self.buffer_sample - 1) == 0 {
            self.buffer_sample
        } else {
            0
        }
    }

    /// Records a launch [`Tracer::count_launch`] counted, with the `weight` it returned: the
    /// allocations its argument words point into (looked up only when `weight` is not 0)
    /// each count it `weight` times, with `end` as their last use. In the timeline, the
    /// launch with its words as they are (pass them for every launch there): which
    /// allocations they point into is worked out when the timeline is read
    /// ([`timeline::resolve_buffers`]), so a launch costs no lookup.
    pub fn record_counted_launch<I>(
        &self,
        kernel: u32,
        shape: LaunchShape,
        start: u64,
        end: u64,
        words: I,
        weight: u32,
    ) where
        I: ExactSizeIterator<Item = (u16, u64)> + Clone,
    {
        if weight != 0 && words.len() != 0 {
            self.history
                .lock()
                .launch_counted(kernel, words.clone(), end, u64::from(weight));
        }
        let Some(r) = &self.ring else { return };
        let tid = self.local(|c| c.tid);
        r.lock().push_launch(
            kernel,
            tid,
            start,
            end,
            shape.grid,
            shape.block,
            shape.shared,
            words,
        );
    }

    /// Stores the history's span for [`Tracer::memory_span`] (under the history's lock).
    fn publish_span(&self, (lo, hi): (u64, u64)) {
        self.span[0].store(lo, Ordering::Release);
        self.span[1].store(hi, Ordering::Release);
    }

    /// Where the live allocations lie: (lowest base, an end none passes), `(0, 0)` with
    /// nothing live. A launch's argument words outside (sizes, counts, flags) need not be
    /// handed to [`Tracer::record_launch`]. Read without a lock; an allocation is published
    /// before its `record_alloc` returns.
    pub fn memory_span(&self) -> (u64, u64) {
        (
            self.span[0].load(Ordering::Acquire),
            self.span[1].load(Ordering::Acquire),
        )
    }

    /// A copy of `bytes` from `src` to `dst` (addresses as the program gave them).
    pub fn record_copy(
        &self,
        dir: Direction,
        bytes: u64,
        dst: u64,
        src: u64,
        start: u64,
        end: u64,
    ) {
        let (dir, dst_a, src_a) = self.history.lock().copy(dir, bytes, dst, src, end);
        let tid = self.local(|c| {
            c.copy(dir, bytes);
            c.tid
        });
        if self.ring.is_some() {
            self.push(Event::Copy(Box::new(timeline::CopyEvent {
                dir,
                tid,
                start,
                end,
                bytes,
                dst: dst_a,
                src: src_a,
            })));
        }
    }

    /// A new allocation of `size` bytes at `base`, made by `api` (e.g. `cudaMalloc`), called
    /// from `site` (the calling library, when known).
    pub fn record_alloc(&self, base: u64, size: u64, api: &'static str, site: Option<&str>) {
        let at = self.now();
        let tid = self.thread_id();
        let mut h = self.history.lock();
        let (order, replaced) = h.alloc_replacing(base, size, api, site, at);
        self.publish_span(h.span());
        // Under the history's lock: the ring holds allocations and frees in the history's
        // order, which reading the timeline replays (`timeline::resolve_buffers`).
        if self.ring.is_some() {
            self.push(Event::Alloc(Box::new(timeline::AllocEvent {
                tid,
                at,
                base,
                size,
                order,
                api,
                replaced,
            })));
        }
    }

    /// The allocation at `base` was freed.
    pub fn record_free(&self, base: u64) {
        let at = self.now();
        let tid = self.thread_id();
        let mut h = self.history.lock();
        let rec = h.free(base, at);
        self.publish_span(h.span());
        // Under the history's lock, as an allocation's.
        if let (Some((order, size)), true) = (rec, self.ring.is_some()) {
            self.push(Event::Free(Box::new(timeline::FreeEvent {
                tid,
                at,
                base,
                size,
                order,
            })));
        }
    }

    /// A pause (or, with `resume`, a resume) from `start` to `end` that moved `bytes` of
    /// `allocations`.
    pub fn record_pause(&self, resume: bool, start: u64, end: u64, allocations: u64, bytes: u64) {
        let ms = Clock::ns(end.wrapping_sub(start), self.clock.rate()) / 1e6;
        {
            let mut p = self.pauses.lock();
            if resume {
                p.resumes += 1;
                p.resume_ms += ms;
            } else {
                p.pauses += 1;
                p.pause_ms += ms;
            }
        }
        let tid = self.thread_id();
        self.push(Event::Pause(Box::new(timeline::PauseEvent {
            resume,
            tid,
            start,
            end,
            allocations,
            bytes,
        })));
    }

    /// Smart pinning page-locked (`pinned`) or unpinned `bytes` at `base`, now.
    pub fn record_pin(&self, pinned: bool, base: u64, bytes: u64) {
        let tid = self.thread_id();
        let at = self.now();
        self.push(Event::Pin(Box::new(timeline::PinEvent {
            pinned,
            tid,
            at,
            base,
            bytes,
        })));
    }

    /// The function names, by id.
    fn function_names(&self) -> Vec<&'static str> {
        self.functions.read().names.clone()
    }

    fn kernel_names(&self) -> Vec<Arc<str>> {
        self.kernels.read().names.clone()
    }

    /// Everything counted so far, merged over threads; `top` hottest and coldest
    /// allocations.
    pub fn stats(&self, pid: u32, top: usize) -> Stats {
        let rate = self.clock.rate();
        let threads: Vec<Arc<ThreadCounters>> = self.threads.lock().clone();
        let mut merged = counters::merge(&threads);
        if let Some(source) = self.launch_source.get() {
            source(&mut |name, n| {
                let id = self.kernel_id(name) as usize;
                if merged.kernels.len() <= id {
                    merged.kernels.resize(id + 1, 0);
                }
                merged.kernels[id] += n;
            });
        }
        let fnames = self.function_names();
        let knames = self.kernel_names();
        let now = self.now();
        let history = self.history.lock();
        report::build(report::Inputs {
            pid,
            mode: self.mode,
            seconds: Clock::ns(now.wrapping_sub(self.clock.start()), rate) / 1e9,
            rate,
            now,
            merged: &merged,
            function_names: &fnames,
            kernel_names: &knames,
            history: &history,
            pauses: *self.pauses.lock(),
            timeline: self.ring.as_ref().map(|r| {
                let r = r.lock();
                report::TimelineStat {
                    events: r.len() as u64,
                    capacity: r.capacity() as u64,
                    dropped: r.dropped(),
                }
            }),
            top,
        })
    }

    /// Writes the timeline so far as Chrome trace-event JSON; returns the number of events
    /// written. `process` names the process in the viewer.
    pub fn write_timeline(
        &self,
        w: &mut dyn std::io::Write,
        pid: u32,
        process: &str,
    ) -> std::io::Result<u64> {
        self.write_timeline_with(w, pid, process, Vec::new)
    }

    /// [`Tracer::write_timeline`], with the events `pending` returns (called under the
    /// ring's lock) after the ring's: those a host library keeps elsewhere until it adds
    /// them in a batch ([`Tracer::push_batch`], which waits for that lock).
    pub fn write_timeline_with(
        &self,
        w: &mut dyn std::io::Write,
        pid: u32,
        process: &str,
        pending: impl FnOnce() -> Vec<Event>,
    ) -> std::io::Result<u64> {
        let (mut events, pending, capacity, mut dropped) = match &self.ring {
            Some(r) => {
                // The history's lock first (as where allocations are recorded, which push
                // their events under it): with both held, the live allocations are those
                // after the ring's last event. The history is let go at once: an allocation
                // recorded meanwhile waits for the ring's lock to push its event.
                let h = self.history.lock();
                let g = r.lock();
                let live = timeline::Live::new(h.live().map(history::Record::alloc_ref));
                drop(h);
                let mut events = g.to_vec();
                let more = (pending(), g.capacity(), g.dropped());
                drop(g);
                timeline::resolve_buffers(&mut events, live);
                (events, more.0, more.1, more.2)
            }
            None => (Vec::new(), Vec::new(), 0, 0),
        };
        if !pending.is_empty() {
            // In time order, and no more than the ring holds: the oldest go first.
            events.extend(pending);
            events.sort_by_key(Event::start);
            let over = events.len().saturating_sub(capacity);
            events.drain(..over);
            dropped += over as u64;
        }
        let threads: Vec<(u32, Option<String>)> = self
            .threads
            .lock()
            .iter()
            .map(|t| (t.tid, t.name.clone()))
            .collect();
        timeline::write_chrome(
            w,
            &timeline::Context {
                pid,
                process,
                clock: &self.clock,
                rate: self.clock.rate(),
                functions: &self.function_names(),
                kernels: &self.kernel_names(),
                threads: &threads,
                dropped,
            },
            &events,
        )
    }
}

/// The demangled form of a kernel's name (the name itself for `extern "C"` kernels, such
/// as Triton's).
pub fn demangle(name: &str) -> String {
    if !name.starts_with("_Z") {
        return name.to_owned();
    }
    cudaw_demangle::demangle(name)
}
#[cfg(test)]
mod tests {
    use crate::{Config, Mode, Tracer};

    /// The `buffers` of each launch in `t`'s timeline, as written.
    fn kernel_buffers(t: &Tracer) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        t.write_timeline(&mut out, 1, "p").unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["cat"] == "kernel")
            .map(|e| e["args"]["buffers"].clone())
            .collect()
    }

    fn launches_on(t: &Tracer, base: u64) -> u64 {
        let s = t.stats(1, 100);
        let b = format!("{base:#x}");
        s.memory
            .hottest
            .iter()
            .chain(&s.memory.coldest)
            .find(|a| a.base == b)
            .map_or(0, |a| a.launches)
    }

    #[test]
    fn one_launch_in_the_sample_rate_has_its_buffers_read_and_counts_that_many_times() {
        let t = Tracer::new(Config {
            buffer_sample: 4,
            ..Config::new(Mode::Metrics)
        });
        let (a, b) = (t.kernel_id("a"), t.kernel_id("b"));
        // Per kernel and thread: the first launch, then every 4th.
        let weights: Vec<u32> = (0..9).map(|_| t.count_launch(a)).collect();
        assert_eq!(weights, [4, 0, 0, 0, 4, 0, 0, 0, 4]);
        assert_eq!(t.count_launch(b), 4, "another kernel's first launch");
        let other = std::thread::scope(|s| s.spawn(|| t.count_launch(a)).join().unwrap());
        assert_eq!(other, 4, "another thread's first launch of the kernel");
        // record_launch counts and samples the same way: 10 launches, 3 read, 12 counted.
        t.record_alloc(0x1000, 0x100, "cudaMalloc", None);
        let k = t.kernel_id("k");
        for _ in 0..10 {
            t.record_launch(k, [1; 3], [1; 3], 0, 0, 1, &[(0, 0x1010)]);
        }
        assert_eq!(launches_on(&t, 0x1000), 12);
        let s = t.stats(1, 10);
        let n = |name: &str| s.kernels.iter().find(|x| x.name == name).unwrap().launches;
        assert_eq!((n("a"), n("b"), n("k")), (10, 1, 10), "launches stay exact");
    }

    #[test]
    fn a_word_counts_on_the_allocation_it_pointed_into_when_launched() {
        let t = Tracer::new(Config::new(Mode::Timeline));
        let k = t.kernel_id("k");
        t.record_alloc(0x1000, 0x100, "cudaMalloc", None);
        for _ in 0..3 {
            t.record_launch(k, [1; 3], [1; 3], 0, 0, 1, &[(0, 0x1010)]);
        }
        // Freed after three launches, then made again at the same base:
        // the three belong to the first allocation (order 0), the next to the second.
        t.record_free(0x1000);
        t.record_alloc(0x1000, 0x100, "cudaMalloc", None);
        t.record_launch(k, [1; 3], [1; 3], 0, 0, 1, &[(0, 0x1010)]);
        assert_eq!(launches_on(&t, 0x1000), 1);
        assert_eq!(t.stats(1, 1).kernels[0].launches, 4);
        let orders: Vec<serde_json::Value> = kernel_buffers(&t)
            .iter()
            .map(|b| b[0]["alloc"].clone())
            .collect();
        assert_eq!(orders, [0, 0, 0, 1]);
    }

    /// With the history sampled, the timeline still gives every launch its buffers: it
    /// keeps each launch's words and resolves them when written.
    #[test]
    fn the_timeline_lists_every_launchs_buffers_when_the_history_is_sampled() {
        let t = Tracer::new(Config {
            buffer_sample: 16,
            ..Config::new(Mode::Timeline)
        });
        let k = t.kernel_id("k");
        t.record_alloc(0x1000, 0x100, "cudaMalloc", None);
        for _ in 0..5 {
            t.record_launch(k, [1; 3], [1; 3], 0, 0, 1, &[(0, 0x1010), (1, 7)]);
        }
        assert_eq!(
            launches_on(&t, 0x1000),
            16,
            "one launch looked up, counted 16 times"
        );
        let buffers = kernel_buffers(&t);
        let one = serde_json::json!([{"alloc": 0, "base": "0x1000", "size": 256, "param": 0}]);
        assert_eq!(buffers, vec![one; 5]);
    }

    #[test]
    fn launches_from_two_threads_are_all_counted() {
        for mode in [Mode::Metrics, Mode::Timeline] {
            let t = Tracer::new(Config::new(mode));
            let k = t.kernel_id("k");
            t.record_alloc(0x10_0000, 0x1000, "cudaMalloc", None);
            // Launches from two threads at once.
            let n = 263;
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        for i in 0..n {
                            t.record_launch(k, [1; 3], [1; 3], 0, i, i + 1, &[(0, 0x10_0008)]);
                        }
                    });
                }
            });
            assert_eq!(launches_on(&t, 0x10_0000), 2 * n, "{mode:?}");
            assert_eq!(t.stats(1, 1).kernels[0].launches, 2 * n);
            if mode == Mode::Timeline {
                let mut out = Vec::new();
                t.write_timeline(&mut out, 1, "p").unwrap();
                let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
                let kernels: Vec<&serde_json::Value> = v["traceEvents"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|e| e["cat"] == "kernel")
                    .collect();
                assert_eq!(kernels.len() as u64, 2 * n);
                assert!(kernels
                    .iter()
                    .all(|e| e["args"]["buffers"][0]["base"] == "0x100000"));
            }
        }
    }
}

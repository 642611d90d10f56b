//! The counts of launches and the kernels they run: every launch through the driver is
//! counted per kernel name, every graph launch once; module loads are counted (the
//! wrappers that count are `crate::launch`'s).
//!
//! A kernel's name is recorded when its handle is made (`cuModuleGetFunction`,
//! `cuLibraryGetKernel`, `cuKernelGetFunction`), else asked of the real driver
//! (`cuFuncGetName`, then `cuKernelGetName`) on the handle's first launch. The hot path
//! takes no lock and makes no locked (read-modify-write) instruction: a per-thread cache
//! maps a handle to its kernel and holds the thread's launches of it, which go to the
//! kernel's counter (an atomic shared by every handle of that name) when the slot is taken
//! by another handle or the thread ends; a reader adds what the live threads hold. The
//! registry's lock is taken on a thread's first launch of a handle only. Unloading a module
//! or library forgets its handles (the driver may reuse them) and empties every thread's
//! cache.

use crate::boundary::guard;
use cudaw_trace::driver_side::{home, probe, SLOTS};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{LazyLock, Once};

/// One kernel name and its launches.
#[derive(Debug)]
pub struct Kernel {
    /// The kernel's (mangled) name.
    pub name: Box<str>,
    /// Launches through the driver so far.
    pub launches: AtomicU64,
    /// Of those, the launches tracing (`metrics`) counted here rather than in the runtime
    /// shim's store ([`count_traced`]).
    pub traced: AtomicU64,
    /// The tracer's id for the name ([`crate::trace`]), `u32::MAX` until asked.
    trace_id: AtomicU32,
    /// Where its traced launches were seen to pass pointers ([`crate::trace`]).
    pub sites: Mutex<fatbin::sites::PointerSites>,
}

impl Kernel {
    /// The tracer's id for this kernel's name, asked of `intern` once.
    pub fn trace_id(&self, intern: impl FnOnce(&str) -> u32) -> u32 {
        match self.trace_id.load(Ordering::Relaxed) {
            u32::MAX => {
                let id = intern(&self.name);
                self.trace_id.store(id, Ordering::Relaxed);
                id
            }
            id => id,
        }
    }
}

#[derive(Default)]
struct Registry {
    by_name: HashMap<Box<str>, &'static Kernel>,
    by_handle: HashMap<usize, &'static Kernel>,
    /// Module or library → the handles made from it (a set: libraries ask for the same
    /// function again and again).
    by_module: HashMap<usize, HashSet<usize>>,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Default::default);
/// Bumped when handles are forgotten: every thread's cache is stale.
static GENERATION: AtomicU64 = AtomicU64::new(0);
static GRAPH_LAUNCHES: AtomicU64 = AtomicU64::new(0);
static MODULES_LOADED: AtomicU64 = AtomicU64::new(0);

/// One slot of a thread's cache: a handle, its kernel, and the launches of that handle on
/// this thread not yet added to the kernel's shared counter. Atomics so that a reader on
/// another thread ([`counts`]) may add the pending launches in; the owning thread updates
/// them with plain loads and stores (no locked instruction on the launch path).
struct Slot {
    handle: AtomicUsize,
    kernel: AtomicPtr<Kernel>,
    pending: AtomicU64,
    /// Of `pending`, the launches [`count_traced`] counted; as it, moved to the kernel's
    /// `traced` counter, which happens only when the slot is given to a handle (again):
    /// so it is also the count since then that picks the launches whose words are looked
    /// up.
    traced: AtomicU64,
}

impl Slot {
    const fn empty() -> Slot {
        Slot {
            handle: AtomicUsize::new(0),
            kernel: AtomicPtr::new(std::ptr::null_mut()),
            pending: AtomicU64::new(0),
            traced: AtomicU64::new(0),
        }
    }

    /// Gives the slot to `handle` (its launches so far go to the kernel they were of);
    /// `handle`'s kernel.
    #[cold]
    #[inline(never)]
    fn take(&self, handle: usize) -> &'static Kernel {
        let k = kernel_of(handle);
        self.flush();
        self.kernel
            .store(k as *const Kernel as *mut Kernel, Ordering::Relaxed);
        self.handle.store(handle, Ordering::Relaxed);
        k
    }

    /// Moves the pending launches into the kernel's shared counter. Pending first goes to
    /// 0, then the counter grows: a reader in between sees a count short by the launches
    /// moving, never one counted twice.
    fn flush(&self) {
        let n = self.pending.load(Ordering::Relaxed);
        if n == 0 {
            return;
        }
        let t = self.traced.load(Ordering::Relaxed);
        self.pending.store(0, Ordering::Relaxed);
        self.traced.store(0, Ordering::Relaxed);
        let k = self.kernel.load(Ordering::Relaxed);
        if !k.is_null() {
            // SAFETY: kernels are leaked by `Registry::named`, never freed.
            let k = unsafe { &*k };
            k.launches.fetch_add(n, Ordering::Relaxed);
            k.traced.fetch_add(t, Ordering::Relaxed);
        }
    }
}

/// One thread's launched handles: a hash table (a handle's slot is its home, or one of
/// the next [`PROBES`]: [`probe`]), so that a launch of a cached handle costs a few loads
/// and a plain add to the slot's pending count; a handle met for the first time asks the
/// registry. `generation` is the registry's when the table was last valid; `launches`
/// counts every launch through this layer's launch wrappers on the thread
/// ([`cudaw_driver_thread_launches_v1`]).
struct Cache {
    generation: Cell<u64>,
    launches: Cell<u64>,
    slots: [Slot; SLOTS],
}

/// Every live thread's cache (its address), for [`counts`] to add their pending launches.
static CACHES: Mutex<Vec<usize>> = Mutex::new(Vec::new());

impl Cache {
    /// Empties every slot (handles were forgotten: the registry is at `generation`).
    #[cold]
    fn renew(&self, generation: u64) {
        for s in &self.slots {
            s.flush();
            s.handle.store(0, Ordering::Relaxed);
        }
        self.generation.set(generation);
    }

    /// The slot of `handle` away from its home (or given to it now), and its kernel.
    #[cold]
    #[inline(never)]
    fn slot_of(&self, handle: usize) -> (&Slot, &'static Kernel) {
        let i = probe(handle, |i| self.slots[i].handle.load(Ordering::Relaxed));
        let s = &self.slots[i.unwrap_or_else(|i| i)];
        let k = s.kernel.load(Ordering::Relaxed);
        if i.is_ok() && !k.is_null() {
            // SAFETY: cached pointers come from `kernel_of`: leaked, never freed.
            return (s, unsafe { &*k });
        }
        (s, s.take(handle))
    }

    fn new() -> Box<Cache> {
        let c = Box::new(Cache {
            generation: Cell::new(GENERATION.load(Ordering::Acquire)),
            launches: Cell::new(0),
            slots: [const { Slot::empty() }; SLOTS],
        });
        CACHES.lock().push(&*c as *const Cache as usize);
        c
    }
}

impl Drop for Cache {
    // The thread ends: its pending launches go to the shared counters, and readers forget
    // it before its memory is freed.
    fn drop(&mut self) {
        crate::inflight::block().local.store(0, Ordering::Relaxed);
        let mut caches = CACHES.lock();
        for s in &self.slots {
            s.flush();
        }
        let me = self as *const Cache as usize;
        caches.retain(|&c| c != me);
    }
}

thread_local! {
    // On the heap: this library's static TLS must stay small (it uses initial-exec TLS, so
    // a `dlopen` of it, by a runtime that finds it on LD_LIBRARY_PATH, needs its whole TLS
    // block to fit in glibc's small static-TLS surplus).
    static CACHE: Box<Cache> = Cache::new();
}

impl Registry {
    fn named(&mut self, name: &str) -> &'static Kernel {
        if let Some(k) = self.by_name.get(name) {
            return k;
        }
        let k: &'static Kernel = Box::leak(Box::new(Kernel {
            name: name.into(),
            launches: AtomicU64::new(0),
            traced: AtomicU64::new(0),
            trace_id: AtomicU32::new(u32::MAX),
            sites: Mutex::new(fatbin::sites::PointerSites::new()),
        }));
        self.by_name.insert(name.into(), k);
        k
    }
}

/// Records that `handle` (made from `module`, 0 if none) runs kernel `name`.
pub fn record(handle: usize, name: &str, module: usize) {
    let mut r = REGISTRY.lock();
    let k = r.named(name);
    if r.by_handle
        .insert(handle, k)
        .is_some_and(|old| !std::ptr::eq(old, k))
    {
        GENERATION.fetch_add(1, Ordering::AcqRel);
    }
    if module != 0 {
        r.by_module.entry(module).or_default().insert(handle);
    }
}

/// Forgets the handles made from `module` (unloaded).
pub fn forget_module(module: usize) {
    let mut r = REGISTRY.lock();
    if let Some(handles) = r.by_module.remove(&module) {
        for h in handles {
            r.by_handle.remove(&h);
        }
        GENERATION.fetch_add(1, Ordering::AcqRel);
    }
}

/// The real driver's name for `handle` (a function or a kernel).
fn name_from_driver(handle: usize) -> Option<String> {
    let mut name: *const c_char = std::ptr::null();
    let mut rc = crate::forward!(cuFuncGetName: fn(*mut *const c_char, usize), &mut name, handle);
    if rc != 0 || name.is_null() {
        rc = crate::forward!(cuKernelGetName: fn(*mut *const c_char, usize), &mut name, handle);
    }
    if rc != 0 || name.is_null() {
        return None;
    }
    // SAFETY: the driver returned a NUL-terminated name it owns, valid while loaded.
    Some(
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// The counter of `handle`'s kernel, from the registry (naming it first if needed).
fn kernel_of(handle: usize) -> &'static Kernel {
    if let Some(k) = REGISTRY.lock().by_handle.get(&handle) {
        return k;
    }
    let name = name_from_driver(handle).unwrap_or_else(|| format!("<function {handle:#x}>"));
    record(handle, &name, 0);
    REGISTRY.lock().named(&name)
}

/// The generation of the handles: bumped whenever handles are forgotten (a module
/// unloaded) or renamed, when every per-thread cache keyed by handle is stale.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// Runs `f` with the calling thread's cache (`None` once the thread's is gone: it is
/// ending). The cache's address is kept in the thread's in-flight block (initial-exec TLS),
/// so the launch path makes no `__tls_get_addr` call; the `thread_local!` owns it and frees
/// it when the thread ends.
#[inline(always)]
fn with_cache<R>(f: impl FnOnce(Option<&Cache>) -> R) -> R {
    let b = crate::inflight::block();
    let p = b.local.load(Ordering::Relaxed) as *const Cache;
    if !p.is_null() {
        // SAFETY: set below from this thread's cache, cleared by its destructor before the
        // cache is freed; only this thread reads it.
        return f(Some(unsafe { &*p }));
    }
    with_cache_slow(b, f)
}

#[cold]
#[inline(never)]
fn with_cache_slow<R>(b: &driver::inflight::Block, f: impl FnOnce(Option<&Cache>) -> R) -> R {
    match CACHE.try_with(|c| {
        b.local
            .store(&**c as *const Cache as usize, Ordering::Relaxed);
        &**c as *const Cache
    }) {
        // SAFETY: the thread's cache, alive until its destructor (which clears `local`).
        Ok(p) => f(Some(unsafe { &*p })),
        Err(_) => f(None),
    }
}

/// Counts one launch of `handle`; its kernel.
#[inline]
pub fn count(handle: usize) -> &'static Kernel {
    count_in(handle, false).0
}

/// Counts one launch of `handle` as [`count`] does, and as a launch tracing (`metrics`)
/// counts here ([`Kernel::traced`], read with [`traced_counts`]) rather than in the runtime
/// shim's store: its kernel, and the launches of `handle` this thread counted so before
/// this one since the slot was given to it (0 for the first; 0 always on a thread that is
/// ending).
#[inline]
pub fn count_traced(handle: usize) -> (&'static Kernel, u64) {
    count_in(handle, true)
}

#[inline(always)]
fn count_in(handle: usize, traced: bool) -> (&'static Kernel, u64) {
    let generation = GENERATION.load(Ordering::Acquire);
    with_cache(|c| {
        let Some(c) = c else {
            // The thread's cache is gone (the thread is ending): count on the kernel.
            let k = kernel_of(handle);
            k.launches.fetch_add(1, Ordering::Relaxed);
            if traced {
                k.traced.fetch_add(1, Ordering::Relaxed);
            }
            return (k, 0);
        };
        if c.generation.get() != generation {
            c.renew(generation);
        }
        c.launches.set(c.launches.get() + 1);
        let s = &c.slots[home(handle)];
        let k = s.kernel.load(Ordering::Relaxed);
        let (s, k): (&Slot, &'static Kernel) =
            if s.handle.load(Ordering::Relaxed) == handle && !k.is_null() {
                // SAFETY: cached pointers come from `kernel_of`: leaked, never freed.
                (s, unsafe { &*k })
            } else {
                c.slot_of(handle)
            };
        // Plain adds: only this thread writes its slots' counts.
        s.pending
            .store(s.pending.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        if !traced {
            return (k, 0);
        }
        let before = s.traced.load(Ordering::Relaxed);
        s.traced.store(before + 1, Ordering::Relaxed);
        (k, before)
    })
}

/// Launches through this layer's launch wrappers on the calling thread so far (0 on a
/// thread that is ending).
pub fn thread_launches() -> u64 {
    with_cache(|c| c.map_or(0, |c| c.launches.get()))
}

/// [`thread_launches`], for cudaw's runtime: it tells whether the real runtime's launches
/// reach this layer's launch wrappers, which mark them in flight through the runtime's
/// gate, so that the runtime's own launch exports need not (`cudart-shim`'s
/// `launch_bypass`). Always 0 while this layer is not connected to a runtime of cudaw's
/// (its gate is then its own, which no pause closes).
#[no_mangle]
pub extern "C" fn cudaw_driver_thread_launches_v1() -> u64 {
    guard("cudaw_driver_thread_launches_v1", 0, || {
        if crate::runtime::hooks().is_none() {
            return 0;
        }
        thread_launches()
    })
}

/// The launches every live thread holds pending (not yet in the shared counters), by
/// kernel (its address): all of them, or (`traced`) those [`count_traced`] counted.
fn launches_of_all(traced: bool) -> HashMap<usize, u64> {
    let mut pending: HashMap<usize, u64> = HashMap::new();
    let caches = CACHES.lock();
    for &c in caches.iter() {
        // SAFETY: a cache is removed from the list (under this lock) before it is freed.
        let c = unsafe { &*(c as *const Cache) };
        for s in &c.slots {
            let n = if traced { &s.traced } else { &s.pending }.load(Ordering::Relaxed);
            let k = s.kernel.load(Ordering::Relaxed);
            if n != 0 && !k.is_null() {
                *pending.entry(k as usize).or_default() += n;
            }
        }
    }
    pending
}

/// Every kernel launched or named so far, with its launches, most launched first.
pub fn counts() -> Vec<(String, u64)> {
    counts_of(false)
}

/// Every kernel named so far, with the launches tracing counted here ([`count_traced`]),
/// most first.
pub fn traced_counts() -> Vec<(String, u64)> {
    counts_of(true)
}

fn counts_of(traced: bool) -> Vec<(String, u64)> {
    let pending = launches_of_all(traced);
    let r = REGISTRY.lock();
    let mut v: Vec<(String, u64)> = r
        .by_name
        .values()
        .map(|&k| {
            let held = pending.get(&(k as *const Kernel as usize)).copied();
            let shared = if traced { &k.traced } else { &k.launches };
            (
                k.name.to_string(),
                shared.load(Ordering::Relaxed) + held.unwrap_or(0),
            )
        })
        .collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

/// [`traced_counts`] for cudaw's runtime (`driver::hooks::TRACED_LAUNCHES_SYMBOL`): calls
/// `each(ctx, name, len, launches)` for every kernel with traced launches.
#[no_mangle]
pub extern "C" fn cudaw_driver_traced_launches_v1(
    each: driver::hooks::TracedLaunches,
    ctx: *mut c_void,
) {
    guard("cudaw_driver_traced_launches_v1", (), || {
        for (name, n) in traced_counts() {
            if n > 0 {
                each(ctx, name.as_ptr(), name.len(), n);
            }
        }
    })
}

/// Kernel launches so far (each kernel launch once; a graph launch is not counted here):
/// the shared counters and what the threads hold. A thread handing its launches over
/// between the two reads can make one reading short; the total returned never goes
/// down (a counter for Prometheus), it is the largest read so far.
pub fn total_launches() -> u64 {
    static MOST: AtomicU64 = AtomicU64::new(0);
    let shared: u64 = REGISTRY
        .lock()
        .by_name
        .values()
        .map(|k| k.launches.load(Ordering::Relaxed))
        .sum();
    let now = shared + launches_of_all(false).values().sum::<u64>();
    MOST.fetch_max(now, Ordering::Relaxed).max(now)
}

/// [`total_launches`] for cudaw's runtime (its status's `launches`).
#[no_mangle]
pub extern "C" fn cudaw_driver_total_launches_v1() -> u64 {
    guard("cudaw_driver_total_launches_v1", 0, total_launches)
}

/// Graph launches so far.
pub fn graph_launches() -> u64 {
    GRAPH_LAUNCHES.load(Ordering::Relaxed)
}

/// Modules and libraries loaded through the driver so far.
pub fn modules_loaded() -> u64 {
    MODULES_LOADED.load(Ordering::Relaxed)
}

/// `{"kernels":{"NAME":LAUNCHES,...},"graph_launches":N,"modules_loaded":N}`.
pub fn counts_json() -> String {
    cudaw_trace::driver_side::counts_json(&counts(), graph_launches(), modules_loaded())
}

/// Writes [`counts_json`] into `buf` (at most `len` bytes, NUL-terminated when it fits);
/// returns the length of the whole text without its NUL.
#[no_mangle]
pub extern "C" fn cudaw_driver_launch_counts_v1(buf: *mut c_char, len: usize) -> usize {
    guard("cudaw_driver_launch_counts_v1", 0, || {
        let text = counts_json();
        if !buf.is_null() && len > text.len() {
            // SAFETY: the caller's buffer holds `len` bytes, more than the text and its NUL.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
                buf.add(text.len()).write(0);
            }
        }
        text.len()
    })
}

/// `CUDAW_KERNEL_COUNTS=FILE`: where the counts go at exit, one `LAUNCHES<TAB>NAME` line
/// per kernel, most launched first, then `# graph launches N` and `# modules loaded N`;
/// written only by a process that launched or loaded something.
pub const COUNTS_FILE_ENV: &str = "CUDAW_KERNEL_COUNTS";

extern "C" fn at_exit() {
    guard("the launch report", (), || {
        let counts = counts();
        let launched: Vec<_> = counts.iter().filter(|(_, n)| *n > 0).collect();
        let total: u64 = launched.iter().map(|(_, n)| n).sum();
        crate::log::info(format_args!(
            "{total} kernel launches of {} kernels, {} graph launches, {} modules loaded through the driver, {} kernel layouts recorded",
            launched.len(),
            graph_launches(),
            modules_loaded(),
            crate::modules::layouts_recorded()
        ));
        // A process that launched nothing and loaded nothing (a helper process that
        // inherited the preload, such as a compiler worker) leaves the file alone.
        let idle = launched.is_empty() && graph_launches() == 0 && modules_loaded() == 0;
        let path = std::env::var_os(COUNTS_FILE_ENV).filter(|p| !p.is_empty() && !idle);
        if let Some(path) = path {
            let launched: Vec<(String, u64)> = launched.into_iter().cloned().collect();
            let text = cudaw_trace::driver_side::counts_file(
                &launched,
                graph_launches(),
                modules_loaded(),
            );
            // The safe way (no link followed, no FIFO or device replaced).
            let path = std::path::Path::new(&path);
            if let Err(e) = cudaw_files::write_file(path, |mut f| {
                std::io::Write::write_all(&mut f, text.as_bytes())
            }) {
                crate::log::warn(format_args!("cannot write the kernel counts: {e}"));
            }
        }
    })
}

/// Registers the report at exit (once).
pub fn report_at_exit() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a function with no arguments that catches its own panics; this
        // library is never unloaded (-z nodelete), so it is there at exit.
        unsafe { libc::atexit(at_exit) };
    });
}

/// Counts a graph launch.
pub fn graph_launched() {
    GRAPH_LAUNCHES.fetch_add(1, Ordering::Relaxed);
}

/// Counts a module or library loaded.
pub fn module_loaded() {
    MODULES_LOADED.fetch_add(1, Ordering::Relaxed);
}

/// The name recorded for `handle`, if any.
pub fn name_of(handle: usize) -> Option<Box<str>> {
    REGISTRY
        .lock()
        .by_handle
        .get(&handle)
        .map(|k| k.name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudaw_trace::driver_side::PROBES;

    /// The launches of kernel `name` in `counts` ([`counts`] or [`traced_counts`]).
    fn of(counts: Vec<(String, u64)>, name: &str) -> Option<u64> {
        counts.into_iter().find(|(k, _)| k == name).map(|(_, n)| n)
    }

    #[test]
    fn handles_share_their_names_counter_and_unloading_forgets_them() {
        record(0x1000, "_Z4testv", 0xaa);
        record(0x2000, "_Z4testv", 0);
        count(0x1000);
        count(0x1000);
        count(0x2000);
        let n = |name: &str| of(counts(), name);
        assert_eq!(n("_Z4testv"), Some(3));
        forget_module(0xaa);
        // 0x1000 is forgotten: the driver may hand it out again for another kernel.
        record(0x1000, "_Z5otherv", 0);
        count(0x1000);
        assert_eq!(n("_Z5otherv"), Some(1));
        assert_eq!(n("_Z4testv"), Some(3));
        assert!(counts_json().contains("\"_Z4testv\":3"));
    }

    /// Launches counted for tracing are counted as launches too, read apart, and numbered
    /// per slot from 0 (the sampling's "first included"); a slot given to another handle
    /// moves them to the kernel and numbers afresh.
    #[test]
    fn traced_launches_are_counted_apart_and_numbered_per_slot() {
        record(0x9100, "_Z6tracedv", 0);
        let traced = || of(traced_counts(), "_Z6tracedv");
        count(0x9100);
        let seen: Vec<u64> = (0..3).map(|_| count_traced(0x9100).1).collect();
        assert_eq!(seen, [0, 1, 2]);
        assert_eq!(traced(), Some(3));
        assert!(counts().contains(&("_Z6tracedv".to_owned(), 4)));
        // Handles of the same home take the next slots, and each keeps its numbering.
        let same_home: Vec<usize> = (0x9100..)
            .step_by(16)
            .skip(1)
            .filter(|&h| home(h) == home(0x9100))
            .take(PROBES)
            .collect();
        for &h in &same_home[..PROBES - 1] {
            record(h, "_Z6tracedv", 0);
            assert_eq!(count_traced(h).1, 0);
            assert_eq!(count_traced(h).1, 1);
        }
        assert_eq!(traced(), Some(3 + 2 * (PROBES as u64 - 1)));
        assert_eq!(count_traced(0x9100).1, 3, "a neighbour took no slot of its");
        // One more handle of that home finds every slot of its run taken: it takes home,
        // and the launches counted there move to the kernel; the evicted handle then
        // numbers afresh, wherever it lands.
        let last = same_home[PROBES - 1];
        record(last, "_Z6tracedv", 0);
        assert_eq!(count_traced(last).1, 0);
        assert_eq!(traced(), Some(3 + 2 * (PROBES as u64 - 1) + 2));
        assert_eq!(count_traced(0x9100).1, 0);
    }

    #[test]
    fn launches_held_by_threads_are_counted_live_and_when_the_threads_end() {
        record(0x7000, "_Z7threadsv", 0);
        let n = || of(counts(), "_Z7threadsv");
        let before = thread_launches();
        for _ in 0..5 {
            count(0x7000);
        }
        assert_eq!(thread_launches(), before + 5);
        // Held in this thread's slot, not yet in the shared counter, yet read.
        assert_eq!(n(), Some(5));
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (done, counted) = std::sync::mpsc::channel::<()>();
        let live = std::thread::spawn(move || {
            for _ in 0..7 {
                count(0x7000);
            }
            done.send(()).unwrap();
            wait.recv().unwrap();
        });
        counted.recv().unwrap();
        assert_eq!(n(), Some(12), "a live thread's launches");
        go.send(()).unwrap();
        live.join().unwrap();
        assert_eq!(n(), Some(12), "an ended thread's launches");
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    (0..1000).for_each(|_| {
                        count(0x7000);
                    })
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(n(), Some(4012));
    }
}

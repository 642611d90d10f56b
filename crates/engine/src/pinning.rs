//! Smart pinning (`CUDAW_PIN`, issue 29): hot pageable host ranges page-locked in place.
//!
//! [`crate::pageable`] asks [`decide`] about the host side of every copy it would stage.
//! The policy ([`cudaw_pin::History`]) counts the copy against its host range; once the
//! range is hot and fits `CUDAW_PIN_MAX`, it is registered (`cuMemHostRegister`) and the
//! copy, and every later one inside the range, goes to the driver, which sees page-locked
//! memory and copies at pinned speed with no staging. Only synchronous copies take that
//! path: an asynchronous copy of a range cudaw pinned still goes through the staging, which
//! keeps pageable memory's promises (the runtime returns only once the source is read, host
//! to device, or the copy done, device to host, and the program may rely on it).
//!
//! **Memory given back.** A registered range must be unregistered before the program frees
//! or unmaps it, or the driver would keep the old pages locked (and, were the address
//! mapped again, copy from pages no longer the program's). cudaw learns of it from its
//! host-memory interposer (`crates/hostmem`: `free`, `realloc`, `munmap`, `mremap`,
//! `madvise`), which calls [`release`] first, through the function pointer this module
//! hands it ([`INTERPOSER_SYMBOL`]). Pinning is on only where that interposer is loaded and
//! its `free` is the process's: without it, `CUDAW_PIN` is refused with a warning.
//!
//! **Locking.** One mutex guards the history, never held across a driver call: `free`
//! takes it (when its block may hold a pinned range: two relaxed loads decide), and the
//! driver frees memory inside its own calls. A thread already inside this module (the
//! driver's or cudaw's own `free` while registering, say) is let through without looking,
//! as memory cudaw or the driver frees is never a program range cudaw pinned.
//!
//! **Fork.** The child of a process that pinned has no driver: pinning is off there and
//! the interposer looks at nothing ([`forked`]).

use crate::log;
use cudaw_pin::{Action, Cuts, History, Mode, Policy};
use driver::DriverBackend;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

/// Exported by cudaw's host-memory interposer: `void f(uint64_t pinned_ranges, void
/// (*release)(uint64_t ptr, uint64_t len, uint32_t pages))`, told how many ranges are
/// pinned (its `free` looks no further while none is) and what to call when memory goes.
pub const INTERPOSER_SYMBOL: &std::ffi::CStr = c"cudaw_hostmem_pinned_v1";
/// Exported by the interposer: `int f(void)`, whether the process's `free` is its own.
pub const INTERPOSER_OWNS_FREE: &std::ffi::CStr = c"cudaw_hostmem_owns_free_v1";

const UNREAD: u8 = 0;
const ON: u8 = 1;
const OFF: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNREAD);
static HISTORY: Mutex<Option<Pinning>> = Mutex::new(None);
/// Ranges pinned now, and the lowest and highest pinned address (mirrors of the history,
/// readable without the lock: what `free` looks at first).
static PINNED: AtomicU64 = AtomicU64::new(0);
static LO: AtomicU64 = AtomicU64::new(u64::MAX);
static HI: AtomicU64 = AtomicU64::new(0);
/// Copies decided so far: the history's clock.
static COPIES: AtomicU64 = AtomicU64::new(0);
/// The interposer's notification function, when it is loaded.
static NOTIFY: AtomicU64 = AtomicU64::new(0);

/// `CU_MEMHOSTREGISTER_PORTABLE`: every context sees the range page-locked.
const PORTABLE: u32 = 0x01;

/// The history, and the device whose driver registered the ranges.
struct Pinning {
    history: History,
    backend: Option<&'static DriverBackend>,
}

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// The smallest copy smart pinning counts (smaller ranges are never pinned), whatever
/// the staged copies' threshold: a copy too small to stage may still be of a hot buffer.
pub const MIN_BYTES: usize = 1 << 20;

/// The smallest copy smart pinning wants to see: [`MIN_BYTES`] while it is on, else none.
/// A relaxed load once pinning has started.
#[inline]
pub fn considers() -> usize {
    if active() {
        MIN_BYTES
    } else {
        usize::MAX
    }
}

/// Whether pinning is on (read once from the configuration and the interposer).
pub fn active() -> bool {
    match STATE.load(Ordering::Relaxed) {
        ON => true,
        OFF => false,
        _ => start(),
    }
}

/// The interposer's functions, when it is loaded and its `free` is the process's.
fn interposer() -> Result<u64, &'static str> {
    // SAFETY: dlsym with RTLD_DEFAULT and NUL-terminated names has no preconditions.
    let (notify, owns) = unsafe {
        (
            libc::dlsym(libc::RTLD_DEFAULT, INTERPOSER_SYMBOL.as_ptr()),
            libc::dlsym(libc::RTLD_DEFAULT, INTERPOSER_OWNS_FREE.as_ptr()),
        )
    };
    if notify.is_null() || owns.is_null() {
        return Err(
            "cudaw's host-memory interposer is not loaded (run the program with \
                    `cudaw run --pin`)",
        );
    }
    // SAFETY: the interposer's `int cudaw_hostmem_owns_free_v1(void)`, resolved above.
    let owns: extern "C" fn() -> i32 = unsafe { std::mem::transmute(owns) };
    if owns() == 0 {
        return Err(
            "the process's `free` is not cudaw's interposer's (another allocator \
                    is preloaded before it): memory given back would go unseen",
        );
    }
    Ok(notify as u64)
}

#[cold]
fn start() -> bool {
    let config = crate::config::get();
    let mode = config.pin.clone();
    let on = mode != Mode::Off
        && match interposer() {
            Ok(notify) => {
                NOTIFY.store(notify, Ordering::Relaxed);
                true
            }
            Err(why) => {
                log::warn(format_args!(
                    "CUDAW_PIN is set but {why}: pinning is off, copies are staged"
                ));
                false
            }
        };
    if on {
        let budget = config
            .pin_max
            .unwrap_or_else(|| Policy::default_budget(total_ram()));
        let policy = Policy {
            mode: mode.clone(),
            budget,
            // Whatever the staged copies' threshold (CUDAW_STAGED_COPY_MIN): copies between
            // the two are counted, and go to the driver until pinned.
            min_bytes: MIN_BYTES as u64,
            costs: config.pin_costs,
        };
        let history = match &mode {
            Mode::Use(path) => match std::fs::read_to_string(path)
                .map_err(|e| e.to_string())
                .and_then(|t| cudaw_pin::Profile::from_json(&t))
            {
                Ok(p) => History::with_profile(policy, &p),
                Err(e) => {
                    log::warn(format_args!(
                        "CUDAW_PIN=use:{path}: {e}; learning from scratch instead"
                    ));
                    History::new(policy)
                }
            },
            _ => History::new(policy),
        };
        inside(|| {
            let mut slot = lock();
            // Two first copies at once: the first history stays (the other is dropped
            // here, inside, so that its frees look at nothing).
            if slot.is_none() {
                *slot = Some(Pinning {
                    history,
                    backend: None,
                });
            }
        });
        log::info(format_args!(
            "smart pinning on ({mode:?}), at most {} MiB page-locked",
            budget >> 20
        ));
    }
    let state = if on { ON } else { OFF };
    match STATE.compare_exchange(UNREAD, state, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => on,
        Err(now) => now == ON,
    }
}

fn lock() -> std::sync::MutexGuard<'static, Option<Pinning>> {
    HISTORY.lock().unwrap_or_else(|e| e.into_inner())
}

/// The machine's memory (`MemTotal`), or 64 GiB where it cannot be read.
fn total_ram() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(64 << 30, |kb| kb << 10)
}

/// Marks the thread inside this module while it lives (see the module documentation).
struct Inside(bool);

impl Inside {
    fn enter() -> Inside {
        Inside(INSIDE.try_with(|c| c.replace(true)).unwrap_or(true))
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let was = self.0;
        let _ = INSIDE.try_with(|c| c.set(was));
    }
}

/// Runs `f` marked as inside this module.
fn inside<T>(f: impl FnOnce() -> T) -> T {
    let _inside = Inside::enter();
    f()
}

fn is_inside() -> bool {
    INSIDE.try_with(Cell::get).unwrap_or(true)
}

/// Marks a pinning decision on the timeline (`CUDAW_TRACE=timeline`; nothing otherwise).
fn mark(pinned: bool, start: u64, len: u64) {
    if let Some(t) = cudaw_trace::get() {
        t.record_pin(pinned, start, len);
    }
}

/// Unregisters `ranges` (no lock held).
fn unregister(backend: &DriverBackend, ranges: &[(u64, u64)]) {
    if ranges.is_empty() {
        return;
    }
    inside(|| {
        for (start, len) in ranges {
            mark(false, *start, *len);
        }
        backend.in_context(|| {
            for (start, _) in ranges {
                // SAFETY: `start` was registered by `decide` and not unregistered since
                // (the history hands each range out once).
                if let Err(e) = unsafe { backend.driver().mem_host_unregister(*start as *mut u8) } {
                    log::debug(format_args!("unpinning {start:#x}: {e}"));
                }
            }
        })
    });
}

/// Mirrors the history's pinned ranges in the atomics `free` reads, and tells the
/// interposer when their count changed (under the lock).
fn publish(history: &History) {
    let (lo, hi) = history.pinned_bounds();
    LO.store(lo, Ordering::Relaxed);
    HI.store(hi, Ordering::Relaxed);
    let n = history.stats().pinned_ranges;
    if PINNED.swap(n, Ordering::Relaxed) != n {
        notify(n);
    }
}

fn notify(n: u64) {
    let f = NOTIFY.load(Ordering::Relaxed);
    if f != 0 {
        // SAFETY: NOTIFY holds the interposer's `cudaw_hostmem_pinned_v1`, resolved by
        // dlsym; the interposer is never unloaded (LD_PRELOAD). It stores two atomics.
        let f: extern "C" fn(u64, extern "C" fn(u64, u64, u32)) =
            unsafe { std::mem::transmute(f as usize) };
        f(n, release_from_interposer);
    }
}

/// What the interposer calls before memory goes: `pages` is 1 for `munmap`, `mremap` and
/// `madvise`, 0 for a heap block (`free`, `realloc`).
extern "C" fn release_from_interposer(ptr: u64, len: u64, pages: u32) {
    crate::boundary::guard("unpinning memory given back", (), || {
        release(ptr, len, pages != 0)
    })
}

/// Whether the copy of `len` bytes at pageable `host` should now take the driver's path
/// (its range is, or was just, page-locked by cudaw), and where it crosses from one
/// registration into the next (one driver copy per piece).
pub fn decide(backend: &'static DriverBackend, host: u64, len: usize) -> Option<Cuts> {
    if !active() {
        return None;
    }
    let now = COPIES.fetch_add(1, Ordering::Relaxed);
    let action = inside(|| {
        lock()
            .as_mut()
            .map(|p| p.history.copy(host, len as u64, "", now))
    });
    let (start, span) = match action {
        None | Some(Action::Stage) => return None,
        Some(Action::Direct(cuts)) => return Some(cuts),
        Some(Action::Pin { start, len }) => (start, len),
    };
    // Registering takes a while (the driver faults in and locks every page): no lock held.
    let registered = inside(|| {
        backend.in_context(|| {
            // SAFETY: `[start, start + span)` covers the host side of a copy the program
            // passed (valid memory, by the runtime's contract), widened to whole pages of
            // the same mappings; registering locks it, nothing more.
            unsafe {
                backend
                    .driver()
                    .mem_host_register(start as *mut u8, span as usize, PORTABLE)
            }
        })
    });
    // Kept: where this copy crosses between registrations (the new one may lean on a
    // neighbour's edge page), if they cover it whole.
    let kept = inside(|| {
        let mut guard = lock();
        let p = guard.as_mut()?;
        let kept = match &registered {
            Ok(()) => p.history.pinned(start),
            Err(_) => {
                p.history.pin_failed(start);
                false
            }
        };
        if registered.is_ok() && !kept {
            // Given back meanwhile: page-locked, and cudaw's no more, until unregistered
            // below; copies of it are staged meanwhile (as in `release`).
            UNREGISTERING_N.fetch_add(1, Ordering::SeqCst);
            unregistering().push((start, span));
        }
        if kept {
            p.backend.get_or_insert(backend);
        }
        publish(&p.history);
        Some((
            kept,
            kept.then(|| p.history.cuts(host, len as u64)).flatten(),
        ))
    });
    match (registered, kept) {
        (Ok(()), Some((true, cuts))) => {
            inside(|| mark(true, start, span));
            log::debug(format_args!(
                "pinned {span} bytes at {start:#x} (copied often)"
            ));
            cuts
        }
        // Given back while it was being registered: unregistered again (listed as being
        // unregistered above).
        (Ok(()), Some((false, _))) => {
            let range = (start, span);
            unregister(backend, &[range]);
            unregistered(&[range]);
            None
        }
        // Smart pinning was turned off meanwhile: nothing of it to tell.
        (Ok(()), None) => {
            unregister(backend, &[(start, span)]);
            None
        }
        (Err(e), _) => {
            log::debug(format_args!(
                "pinning {span} bytes at {start:#x}: {e}; its copies stay staged"
            ));
            None
        }
    }
}

/// How much of a copy's host side cudaw's registrations hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// All of it: a copy from it counts as hot; one driver copy per piece.
    Whole(Cuts),
    /// Part of it (an edge page a pinned neighbour holds): pageable memory still; a
    /// copy of it handed to the driver goes in pieces cut at the registrations' borders.
    Part(Cuts),
    /// None of it.
    No,
}

/// Whether smart pinning is on and `[host, host + len)` lies between the lowest and highest
/// address it pinned: relaxed loads, the first look of every question about a copy.
fn near_pinned(host: u64, len: u64) -> bool {
    STATE.load(Ordering::Relaxed) == ON
        && PINNED.load(Ordering::Relaxed) != 0
        && host < HI.load(Ordering::Relaxed)
        && host.saturating_add(len) > LO.load(Ordering::Relaxed)
}

/// How much of `[host, host + len)` cudaw's registrations hold (a copy they hold whole
/// is counted as a hot one): for a copy the driver sees as page-locked.
pub fn pinned_by_cudaw(host: u64, len: usize) -> Held {
    if STATE.load(Ordering::Relaxed) == ON && being_unregistered(host, len) {
        // A range being unregistered (forgotten, still registered): staged.
        return Held::Part(Cuts::NONE);
    }
    if !near_pinned(host, len as u64) {
        return Held::No;
    }
    let now = COPIES.fetch_add(1, Ordering::Relaxed);
    inside(|| {
        let mut guard = lock();
        let Some(p) = guard.as_mut() else {
            return Held::No;
        };
        match p.history.copy_direct(host, len as u64, now) {
            Some(cuts) => Held::Whole(cuts),
            None if p.history.touches(host, len as u64) => {
                Held::Part(p.history.borders(host, len as u64))
            }
            None => Held::No,
        }
    })
}

/// Where `[host, host + len)` crosses a border of cudaw's registrations (between two, or
/// between one and memory none holds), if it does: nothing counted. Relaxed loads while
/// nothing pinned is near.
pub fn crossing(host: u64, len: usize) -> Option<Cuts> {
    if !near_pinned(host, len as u64) {
        return None;
    }
    inside(|| {
        let guard = lock();
        let cuts = guard.as_ref()?.history.borders(host, len as u64);
        (!cuts.is_none()).then_some(cuts)
    })
}

/// Whether any registration of cudaw's touches `[host, host + len)`, one being
/// unregistered included (forgotten by the history, still registered with the driver).
/// Relaxed loads while nothing pinned is near.
pub fn touching(host: u64, len: usize) -> bool {
    if STATE.load(Ordering::Relaxed) == ON && being_unregistered(host, len) {
        return true;
    }
    near_pinned(host, len as u64)
        && inside(|| {
            lock()
                .as_ref()
                .is_some_and(|p| p.history.touches(host, len as u64))
        })
}

/// The program is about to give `[ptr, ptr + len)` back (the interposer, or the program's
/// own `cudaHostRegister` of it): what cudaw pinned there is unregistered first. `pages`:
/// the pages go (else a heap block: only ranges whose copied bytes it overlaps). Relaxed
/// loads when nothing pinned is near ([`near_pinned`]).
pub fn release(ptr: u64, len: u64, pages: bool) {
    if !near_pinned(ptr, len) || is_inside() {
        return;
    }
    // Until the driver has unregistered them, the ranges forgotten here are still
    // page-locked but cudaw's no more: copies of them are staged meanwhile
    // ([`pinned_by_cudaw`]), never handed to the driver as the program's own page-locked
    // memory. They are listed in UNREGISTERING under the history's lock.
    let (ranges, backend) = inside(|| {
        let mut guard = lock();
        let Some(p) = guard.as_mut() else {
            return (Vec::new(), None);
        };
        let ranges = p.history.release(ptr, len, pages);
        if !ranges.is_empty() {
            UNREGISTERING_N.fetch_add(1, Ordering::SeqCst);
            unregistering().extend(ranges.iter().copied());
        }
        publish(&p.history);
        (ranges, p.backend)
    });
    if ranges.is_empty() {
        return;
    }
    if let Some(backend) = backend {
        unregister(backend, &ranges);
    }
    unregistered(&ranges);
}

/// `ranges`, listed in UNREGISTERING, are unregistered now: off the list, and the history
/// may let other ranges register those pages.
fn unregistered(ranges: &[(u64, u64)]) {
    inside(|| {
        if let Some(p) = lock().as_mut() {
            for &(start, _) in ranges {
                p.history.unregistered(start);
            }
        }
    });
    unregistering().retain(|r| !ranges.contains(r));
    UNREGISTERING_N.fetch_sub(1, Ordering::SeqCst);
}

/// Releases under way ([`release`]), and the ranges they are taking back: still registered
/// with the driver, no longer cudaw's.
static UNREGISTERING_N: AtomicU64 = AtomicU64::new(0);
static UNREGISTERING: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

fn unregistering() -> std::sync::MutexGuard<'static, Vec<(u64, u64)>> {
    UNREGISTERING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `[host, host + len)` touches a range being unregistered.
fn being_unregistered(host: u64, len: usize) -> bool {
    if UNREGISTERING_N.load(Ordering::SeqCst) == 0 {
        return false;
    }
    let end = host.saturating_add(len as u64);
    unregistering()
        .iter()
        .any(|&(s, l)| s < end && host < s.saturating_add(l))
}

/// At exit: every range still pinned is unregistered, and the profile written
/// (`profile:FILE`).
pub fn finish() {
    if STATE.load(Ordering::Relaxed) != ON {
        return;
    }
    let (ranges, backend) = inside(|| {
        let mut guard = lock();
        let Some(p) = guard.as_mut() else {
            return (Vec::new(), None);
        };
        if let Mode::Profile(path) = &crate::config::get().pin {
            match std::fs::write(path, p.history.profile().to_json()) {
                Ok(()) => log::info(format_args!("pinning profile written to {path}")),
                Err(e) => log::warn(format_args!("writing the pinning profile {path}: {e}")),
            }
        }
        let ranges = p.history.unpin_all();
        publish(&p.history);
        (ranges, p.backend)
    });
    if let Some(backend) = backend {
        unregister(backend, &ranges);
    }
}

/// In the child of a `fork`: no driver there, so pinning is off and the interposer looks
/// at nothing. Atomics only (async-signal-safe).
pub fn forked() {
    STATE.store(OFF, Ordering::SeqCst);
    PINNED.store(0, Ordering::SeqCst);
    LO.store(u64::MAX, Ordering::SeqCst);
    HI.store(0, Ordering::SeqCst);
    notify(0);
}

/// What pinning did so far (statistics), when it is on.
pub fn stats() -> Option<cudaw_pin::Stats> {
    if STATE.load(Ordering::Relaxed) != ON {
        return None;
    }
    inside(|| lock().as_ref().map(|p| p.history.stats()))
}

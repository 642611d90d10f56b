//! Smart pinning (`CUDAW_PIN`, issue 29): hot pageable host ranges page-locked in place.
//!
//! [`crate::pageable`] asks [`decide`] about the host side of every copy it would stage.
//! The policy ([`cudaw_pin::History`]) counts the copy against its host range; once the
//! range is hot and fits `CUDAW_PIN_MAX`, it is registered (`cuMemHostRegister`) and the
//! copy, and every later one inside the range, goes to the driver, which sees page-locked
//! memory and copies at pinned speed with no staging.
//!
//! **Memory given back.** A registered range must be unregistered before the program frees
//! or unmaps it, or the driver would keep the old pages locked (and, were the address
//! mapped again, copy from pages no longer the program's). cudaw learns of it from its
//! host-memory interposer (`free`, `realloc`, `munmap`, `mremap`, `madvise`), which calls
//! [`release`] first. Pinning is on only where that interposer is loaded
//! ([`INTERPOSER_SYMBOL`] resolves): without it, `CUDAW_PIN` is refused with a warning and
//! every copy is staged as before.
//!
//! **Locking.** One mutex guards the history. [`release`] may be called from inside
//! `free` on any thread, the engine's own threads included: a thread already inside this
//! module (its own `free` while holding the lock) is let through without looking, as
//! memory cudaw itself frees is never a program range cudaw pinned.

use crate::log;
use cudaw_pin::{Action, History, Mode, Policy};
use driver::DriverBackend;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

/// Exported by cudaw's host-memory interposer: `void f(uint64_t pinned_ranges)`, told
/// how many ranges are pinned, so that its `free` looks no further while none is.
pub const INTERPOSER_SYMBOL: &std::ffi::CStr = c"cudaw_hostmem_pinned_v1";

const UNREAD: u8 = 0;
const ON: u8 = 1;
const OFF: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNREAD);
static HISTORY: Mutex<Option<Pinning>> = Mutex::new(None);

/// The history, and the device whose driver registered the ranges (registered
/// `CU_MEMHOSTREGISTER_PORTABLE`, so that every context sees them page-locked).
struct Pinning {
    history: History,
    backend: Option<&'static DriverBackend>,
}

/// `CU_MEMHOSTREGISTER_PORTABLE`.
const PORTABLE: u32 = 0x01;
/// Ranges pinned now (mirrors the history, readable without the lock).
static PINNED: AtomicU64 = AtomicU64::new(0);
/// Copies decided so far: the history's clock.
static COPIES: AtomicU64 = AtomicU64::new(0);
/// The interposer's notification function, when it is loaded.
static NOTIFY: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Whether pinning is on (read once from the configuration and the interposer's
/// presence).
pub fn active() -> bool {
    match STATE.load(Ordering::Relaxed) {
        ON => true,
        OFF => false,
        _ => start(),
    }
}

#[cold]
fn start() -> bool {
    let config = crate::config::get();
    let mode = config.pin.clone();
    let on = mode != Mode::Off && {
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name has no preconditions.
        let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, INTERPOSER_SYMBOL.as_ptr()) };
        if f.is_null() {
            log::warn(format_args!(
                "CUDAW_PIN is set but cudaw's host-memory interposer is not loaded (run the \
                 program with `cudaw run`): pinning is off, copies are staged"
            ));
            false
        } else {
            NOTIFY.store(f as u64, Ordering::Relaxed);
            true
        }
    };
    if on {
        let budget = config
            .pin_max
            .unwrap_or_else(|| Policy::default_budget(total_ram()));
        let policy = Policy {
            mode: mode.clone(),
            budget,
            // Never below the staged copies' threshold (CUDAW_STAGED_COPY_MIN), nor 1 MiB.
            min_bytes: config.staging.copy_min.unwrap_or(0).max(1 << 20) as u64,
            costs: cudaw_pin::Costs::default(),
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
        *lock() = Some(Pinning {
            history,
            backend: None,
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

/// Runs `f` marked as inside this module (see the module documentation).
fn inside<T>(f: impl FnOnce() -> T) -> T {
    let _ = INSIDE.try_with(|c| c.set(true));
    let r = f();
    let _ = INSIDE.try_with(|c| c.set(false));
    r
}

/// Whether this thread is inside this module (or past its thread-locals' end, where
/// nothing is looked at either).
fn is_inside() -> bool {
    INSIDE.try_with(Cell::get).unwrap_or(true)
}

/// Runs `f` with `backend`'s context current on this thread, and the thread's own one
/// current again afterwards.
fn in_context<T>(backend: &DriverBackend, f: impl FnOnce() -> T) -> T {
    let driver = backend.driver();
    let mine = driver.ctx_get_current().ok();
    let switch = mine != Some(backend.context());
    if switch {
        let _ = driver.ctx_set_current(backend.context());
    }
    let r = f();
    if switch {
        if let Some(mine) = mine {
            let _ = driver.ctx_set_current(mine);
        }
    }
    r
}

fn notify() {
    let f = NOTIFY.load(Ordering::Relaxed);
    if f != 0 {
        // SAFETY: NOTIFY holds the interposer's `void(uint64_t)` function, resolved by
        // dlsym; the interposer is never unloaded (LD_PRELOAD).
        let f: extern "C" fn(u64) = unsafe { std::mem::transmute(f as usize) };
        f(PINNED.load(Ordering::Relaxed));
    }
}

/// Whether the copy of `len` bytes at pageable `host` should now take the driver's path:
/// its range is (or was just) page-locked by cudaw.
pub fn decide(backend: &'static DriverBackend, host: u64, len: usize) -> bool {
    if !active() {
        return false;
    }
    inside(|| {
        let mut guard = lock();
        let Some(Pinning {
            history,
            backend: registrar,
        }) = guard.as_mut()
        else {
            return false;
        };
        let now = COPIES.fetch_add(1, Ordering::Relaxed);
        match history.copy(host, len as u64, "", now) {
            Action::Stage => false,
            Action::Direct => true,
            Action::Pin { start, len } => {
                // SAFETY: `[start, start + len)` covers the host side of a copy the
                // program passed (valid memory, by the runtime's contract), widened to
                // whole pages of the same mappings; registering locks it, nothing more.
                let r = in_context(backend, || unsafe {
                    backend
                        .driver()
                        .mem_host_register(start as *mut u8, len as usize, PORTABLE)
                });
                match r {
                    Ok(()) => {
                        history.pinned(start);
                        registrar.get_or_insert(backend);
                        PINNED.store(history.stats().pinned_ranges, Ordering::Relaxed);
                        notify();
                        log::debug(format_args!(
                            "pinned {len} bytes at {start:#x} (copied often)"
                        ));
                        true
                    }
                    Err(e) => {
                        history.pin_failed(start);
                        log::debug(format_args!(
                            "pinning {len} bytes at {start:#x}: {e}; its copies stay staged"
                        ));
                        false
                    }
                }
            }
        }
    })
}

/// A copy the driver sees as page-locked: counted if cudaw pinned its range (statistics).
pub fn note_direct(host: u64, len: usize) {
    if STATE.load(Ordering::Relaxed) != ON || PINNED.load(Ordering::Relaxed) == 0 {
        return;
    }
    inside(|| {
        if let Some(p) = lock().as_mut() {
            let now = COPIES.fetch_add(1, Ordering::Relaxed);
            p.history.copy_direct(host, len as u64, now);
        }
    });
}

/// The program is about to give `[ptr, ptr + len)` back (the host-memory interposer's
/// `free`, `munmap`, …): the ranges cudaw pinned there are unregistered first. Cheap when
/// nothing is pinned (one relaxed load).
pub fn release(ptr: u64, len: u64) {
    if PINNED.load(Ordering::Relaxed) == 0 || is_inside() {
        return;
    }
    inside(|| {
        let mut guard = lock();
        let Some(Pinning { history, backend }) = guard.as_mut() else {
            return;
        };
        let ranges = history.release(ptr, len);
        if let Some(backend) = backend {
            in_context(backend, || {
                for (start, _) in &ranges {
                    // SAFETY: `start` was registered by `decide` and not unregistered since.
                    let r = unsafe { backend.driver().mem_host_unregister(*start as *mut u8) };
                    if let Err(e) = r {
                        log::debug(format_args!("unpinning {start:#x}: {e}"));
                    }
                }
            });
        }
        PINNED.store(history.stats().pinned_ranges, Ordering::Relaxed);
        notify();
    });
}

/// Every range still pinned is unregistered, and the profile written (`profile:FILE`):
/// at exit.
pub fn finish() {
    if STATE.load(Ordering::Relaxed) != ON {
        return;
    }
    inside(|| {
        let mut guard = lock();
        let Some(Pinning { history, backend }) = guard.as_mut() else {
            return;
        };
        if let Mode::Profile(path) = &crate::config::get().pin {
            match std::fs::write(path, history.profile().to_json()) {
                Ok(()) => log::info(format_args!("pinning profile written to {path}")),
                Err(e) => log::warn(format_args!("writing the pinning profile {path}: {e}")),
            }
        }
        let all = history.pinned_ranges();
        for (start, len) in &all {
            history.release(*start, *len);
        }
        if let Some(backend) = backend {
            in_context(backend, || {
                for (start, _) in &all {
                    // SAFETY: registered by `decide`, not unregistered since.
                    let _ = unsafe { backend.driver().mem_host_unregister(*start as *mut u8) };
                }
            });
        }
        PINNED.store(0, Ordering::Relaxed);
        notify();
    });
}

/// What pinning did so far (statistics), when it is on.
pub fn stats() -> Option<cudaw_pin::Stats> {
    if STATE.load(Ordering::Relaxed) != ON {
        return None;
    }
    inside(|| lock().as_ref().map(|p| p.history.stats()))
}

//! The runtime shim, when it is in the process: its hook table
//! ([`driver::hooks::RuntimeHooks`]), found once with `dlsym(RTLD_DEFAULT)`.

use driver::hooks::{
    HandleHooks, MemoryHooks, RuntimeHooks, GATE_PAUSED, RUNTIME_HANDLES_SYMBOL,
    RUNTIME_HOOKS_SYMBOL, RUNTIME_MEMORY_SYMBOL,
};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

static HOOKS: OnceLock<Option<&'static RuntimeHooks>> = OnceLock::new();

fn find() -> Option<&'static RuntimeHooks> {
    // SAFETY: dlsym reads the loader's tables; RTLD_DEFAULT searches the global scope.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, RUNTIME_HOOKS_SYMBOL.as_ptr()) };
    if f.is_null() {
        return None;
    }
    // SAFETY: the runtime shim exports this name as `extern "C" fn() -> *const
    // RuntimeHooks`; no other library exports it.
    let get: extern "C" fn() -> *const RuntimeHooks = unsafe { std::mem::transmute(f) };
    let p = get();
    // SAFETY: a pointer to the runtime shim's static table (never freed), or null.
    let h = unsafe { p.as_ref() }?;
    if h.size < std::mem::size_of::<RuntimeHooks>() {
        crate::log::warn(format_args!(
            "the cudaw runtime in this process is older than this driver shim; not sharing its state"
        ));
        return None;
    }
    Some(h)
}

/// The runtime shim's hooks, if it is loaded.
pub fn hooks() -> Option<&'static RuntimeHooks> {
    *HOOKS.get_or_init(find)
}

static HANDLES: OnceLock<Option<&'static HandleHooks>> = OnceLock::new();

fn find_handles() -> Option<&'static HandleHooks> {
    // SAFETY: dlsym reads the loader's tables; RTLD_DEFAULT searches the global scope.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, RUNTIME_HANDLES_SYMBOL.as_ptr()) };
    if f.is_null() {
        return None;
    }
    // SAFETY: the runtime shim exports this name as `extern "C" fn() -> *const
    // HandleHooks`; no other library exports it.
    let get: extern "C" fn() -> *const HandleHooks = unsafe { std::mem::transmute(f) };
    // SAFETY: a pointer to the runtime shim's static table (never freed), or null.
    let h = unsafe { get().as_ref() }?;
    (h.size >= std::mem::size_of::<HandleHooks>()).then_some(h)
}

/// The runtime shim's handle table, if it is loaded (its handles are virtual: every call
/// that takes one goes through it).
pub fn handles() -> Option<&'static HandleHooks> {
    *HANDLES.get_or_init(find_handles)
}

static MEMORY: OnceLock<Option<&'static MemoryHooks>> = OnceLock::new();

fn find_memory() -> Option<&'static MemoryHooks> {
    // SAFETY: dlsym reads the loader's tables; RTLD_DEFAULT searches the global scope.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, RUNTIME_MEMORY_SYMBOL.as_ptr()) };
    if f.is_null() {
        return None;
    }
    // SAFETY: the runtime shim exports this name as `extern "C" fn() -> *const
    // MemoryHooks`; no other library exports it.
    let get: extern "C" fn() -> *const MemoryHooks = unsafe { std::mem::transmute(f) };
    // SAFETY: a pointer to the runtime shim's static table (never freed), or null.
    let h = unsafe { get().as_ref() }?;
    if h.size < std::mem::size_of::<MemoryHooks>() {
        crate::log::warn(format_args!(
            "the cudaw runtime's memory table in this process is older than this driver shim; \
             driver allocations and copies go to the driver as they are"
        ));
        return None;
    }
    Some(h)
}

/// The runtime shim's memory table, if it is loaded (`cuMemAlloc*` from its VMM).
pub fn memory() -> Option<&'static MemoryHooks> {
    *MEMORY.get_or_init(find_memory)
}

/// Whether the gate is closed for pause.
pub fn is_paused() -> bool {
    hooks().is_some_and(|h| {
        // SAFETY: the runtime shim's static gate word.
        unsafe { &*h.gate }.load(Ordering::Acquire) & GATE_PAUSED != 0
    })
}

/// Holds the calling thread while the process is paused, unless the runtime says it may
/// pass (it is inside a runtime call pause waits for, or it is cudaw's own thread).
pub fn wait_if_paused() {
    if let Some(h) = hooks() {
        if is_paused() && !(h.may_pass)() {
            (h.wait_while_paused)();
        }
    }
}

/// Whether the calling thread's driver calls are the runtime shim's to account for.
pub fn runtime_accounts() -> bool {
    hooks().is_some_and(|h| (h.may_pass)())
}

const NOT_STARTED: u8 = 0;
const RUNNING: u8 = 1;
const DONE: u8 = 2;
static PAUSE: AtomicU8 = AtomicU8::new(NOT_STARTED);

/// Asks the runtime shim, once, to install the pause signals and the control socket. A
/// driver call made while that runs (on any thread) does not ask again.
pub fn install_pause_once() {
    if PAUSE.load(Ordering::Acquire) == DONE {
        return;
    }
    let Some(h) = hooks() else {
        PAUSE.store(DONE, Ordering::Release);
        return;
    };
    if PAUSE
        .compare_exchange(NOT_STARTED, RUNNING, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        (h.install_pause)();
        PAUSE.store(DONE, Ordering::Release);
    }
}

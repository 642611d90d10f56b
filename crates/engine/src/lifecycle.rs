//! The process's life around cudaw: load, exit and fork.
//!
//! - **Load.** The runtime shim's constructor ([`on_load`]), run before `main` (or when a program `dlopen`s the runtime),
//!   installs the pause and resume signal handlers and their self-pipe, so that a pause that
//!   arrives before the first CUDA call is a pause (that call waits for the resume), not a
//!   death by `SIGUSR1`. The control thread, which serves the pipe, starts at the first CUDA
//!   call ([`crate::control::install_once`]); requests sent before it wait in the pipe.
//! - **Exit.** The process is marked exiting as early as glibc lets a library know: when the
//!   main thread's thread-local destructors run (`exit` runs them before any `atexit`
//!   handler), in cudaw's `atexit` handlers (registered at initialisation and again at each
//!   pause, so that after a pause cudaw's handler runs before every other), and in the
//!   library's destructor. From then on a pause is refused ([`is_exiting`]). A pause already
//!   taken is undone by the control thread (the memory restored, as a resume) or, where the
//!   driver cannot take the memory back (shut down, out of memory), abandoned: the gate
//!   opens and the program's threads go on without their device memory. Either way `exit`
//!   proceeds: nothing of the program's teardown waits behind a closed gate.
//! - **Fork.** The child gets a self-pipe of its own (a signal to the child must never pause
//!   its parent). The child of a process whose CUDA is initialised cannot use CUDA (the
//!   driver refuses it after `fork`) and has no control thread: its gate is opened and its
//!   pause signals do nothing. A child of a process that never called CUDA initialises
//!   cudaw as any process does, with its own control thread and socket.
//!
//! The library itself is never unloaded (`-z nodelete`): the control thread and the
//! handlers outlive any `dlclose`.

use crate::host::host;
use crate::signals::{self, BYTE_EXIT, CONTROL_RUNNING};
use crate::{inflight, log};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The process is exiting.
static EXITING: AtomicBool = AtomicBool::new(false);
/// This process is the child of a `fork` after cudaw had initialised: no control thread.
static FORKED_AFTER_INIT: AtomicBool = AtomicBool::new(false);

/// Whether the process is exiting (a pause is refused).
pub fn is_exiting() -> bool {
    EXITING.load(Ordering::SeqCst)
}

/// Whether this process is the child of a fork taken after cudaw had initialised.
pub fn forked_after_init() -> bool {
    FORKED_AFTER_INIT.load(Ordering::SeqCst)
}

// ---- load ----

/// What the library does as it loads (its `.init_array` constructor calls this, the
/// engine's host installed): marks the main thread, arranges for forks, makes the
/// self-pipe and installs the pause and resume handlers.
pub fn on_load() {
    // The main thread's sentinel: its destructor runs first in `exit`.
    if is_main_thread() {
        MAIN_SENTINEL.with(|_| {});
    }
    // SAFETY: the handler is an `extern "C"` function that never unwinds and calls only
    // async-signal-safe functions and atomics.
    unsafe { libc::pthread_atfork(None, None, Some(in_forked_child)) };
    if let Err(e) = signals::create_pipe() {
        log::warn(format_args!("pause/resume: {e}"));
        return;
    }
    if let Err(e) = signals::install_handlers(false) {
        log::warn(format_args!("pause/resume signals not installed: {e}"));
    }
}

/// What the library does as it unloads (its `.fini_array` destructor, run at exit).
pub fn on_unload() {
    mark_exiting("the runtime library's destructor")
}

fn is_main_thread() -> bool {
    // SAFETY: getpid and gettid have no preconditions and cannot fail.
    unsafe { libc::getpid() == libc::gettid() }
}

/// Lives in the main thread's thread-local storage: `exit` runs the calling thread's
/// thread-local destructors before any `atexit` handler, so its drop is the earliest sign
/// that the process is exiting (or that the main thread called `pthread_exit`, after which
/// the process can no longer be paused either).
struct MainSentinel;

impl Drop for MainSentinel {
    fn drop(&mut self) {
        if is_main_thread() {
            crate::boundary::guard("marking the process exiting", (), || {
                mark_exiting("the main thread is exiting")
            });
        }
    }
}

thread_local! {
    static MAIN_SENTINEL: MainSentinel = const { MainSentinel };
}

// ---- fork ----

extern "C" fn in_forked_child() {
    // Async-signal-safe only: atomics, fstat(2), close(2), socketpair(2).
    let initialised = host().runtime_loaded();
    // A child that has not used CUDA yet may: it gets a pipe of its own.
    signals::in_forked_child(!initialised);
    if initialised {
        // No control thread here, and the driver refuses CUDA after fork: never hold a
        // call at the gate (a pause the parent held when it forked included).
        FORKED_AFTER_INIT.store(true, Ordering::SeqCst);
        host().open_gate_after_fork();
    }
    // No driver here either: nothing to pin or unpin (the parent's lock may be held).
    crate::pinning::forked();
    crate::staging::forked();
}

// ---- exit ----

/// How many `atexit` registrations cudaw makes at most (one at initialisation, one per
/// pause): each costs glibc a few bytes for the life of the process.
const MAX_EXIT_HANDLERS: u32 = 4096;
static EXIT_HANDLERS: AtomicU32 = AtomicU32::new(0);

/// Registers cudaw's exit handler (again): handlers run in reverse order of registration,
/// so the latest registration runs before every handler registered earlier — the
/// runtime's teardown and the program's destructors among them.
pub(crate) fn register_exit_handler() {
    if EXIT_HANDLERS.fetch_add(1, Ordering::SeqCst) >= MAX_EXIT_HANDLERS {
        return;
    }
    // SAFETY: registers a function with no arguments that never unwinds (its body runs
    // inside the panic boundary). A failure (glibc out of memory, or exit already past its
    // handlers) leaves the earlier registrations.
    unsafe { libc::atexit(at_exit) };
}

extern "C" fn at_exit() {
    crate::boundary::guard("cudaw's exit handler", (), || {
        if !forked_after_init() {
            crate::staging::wait_prepared();
        }
        mark_exiting("exit handlers")
    })
}

/// How long the exiting thread waits for the control thread to undo or abandon a pause
/// (a resume of many GiB from an image takes seconds); then the gate opens regardless.
const EXIT_WAIT: Duration = Duration::from_secs(120);

static EXIT_SERVED: parking_lot::Mutex<bool> = parking_lot::Mutex::new(false);
static EXIT_SERVED_CV: parking_lot::Condvar = parking_lot::Condvar::new();

/// Marks the process exiting (once): pauses are refused from now on, and a pause already
/// taken is undone or abandoned so that exit proceeds.
pub fn mark_exiting(why: &str) {
    if EXITING.swap(true, Ordering::SeqCst) {
        return;
    }
    if forked_after_init() {
        host().open_gate_after_fork();
        return;
    }
    log::debug(format_args!(
        "exiting ({why}): pause requests are refused from now on"
    ));
    if inflight::is_cudaw_thread() {
        // The control thread itself (or a helper of it): nothing to wait for.
        return;
    }
    if !CONTROL_RUNNING.load(Ordering::SeqCst) || !signals::write_byte(BYTE_EXIT) {
        // No control thread to hold the process paused (or none to ask): let every
        // thread go.
        if host().gate_closed() {
            log::warn(format_args!(
                "exiting while paused ({why}), with no control thread to undo the pause: the threads go on"
            ));
            host().open_gate();
        }
        return;
    }
    // The control thread undoes or abandons the pause; wait for it, boundedly.
    let deadline = Instant::now() + EXIT_WAIT;
    let mut served = EXIT_SERVED.lock();
    while !*served {
        if EXIT_SERVED_CV.wait_until(&mut served, deadline).timed_out() {
            log::error(format_args!(
                "exiting: the control thread did not answer within {} s; the gate opens so that exit proceeds",
                EXIT_WAIT.as_secs()
            ));
            host().open_gate();
            return;
        }
    }
}

/// The control thread has undone or abandoned the pause at exit (or found none).
pub(crate) fn exit_served() {
    *EXIT_SERVED.lock() = true;
    EXIT_SERVED_CV.notify_all();
}

/// Marks the process exiting from the control thread itself (it found the driver shut
/// down): nothing to wait for.
pub(crate) fn mark_exiting_from_control() {
    EXITING.store(true, Ordering::SeqCst);
}

/// Whether the process is a Python interpreter that has begun to finalize (`Py_Finalize`,
/// before C's `exit`): a PyTorch job that printed its last line is exiting, and a pause
/// taken now would hold its shutdown (its objects' finalizers may call CUDA).
pub fn interpreter_finalizing() -> bool {
    type IsFinalizing = unsafe extern "C" fn() -> libc::c_int;
    static FOUND: std::sync::OnceLock<Option<IsFinalizing>> = std::sync::OnceLock::new();
    let f = FOUND.get_or_init(|| {
        [c"Py_IsFinalizing", c"_Py_IsFinalizing"]
            .into_iter()
            .find_map(|name| {
                // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks up.
                let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
                // SAFETY: both names are CPython's `int (void)` functions.
                (!p.is_null())
                    .then(|| unsafe { std::mem::transmute::<*mut libc::c_void, IsFinalizing>(p) })
            })
    });
    // SAFETY: the function reads the runtime's finalizing flag (an atomic), which needs
    // neither the GIL nor an initialised thread state.
    f.is_some_and(|f| unsafe { f() } != 0)
}

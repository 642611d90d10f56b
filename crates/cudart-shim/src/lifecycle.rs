//! The process's life around cudaw: load, exit and fork.
//!
//! - **Load.** A constructor, run before `main` (or when a program `dlopen`s the runtime),
//!   installs the pause and resume signal handlers and their self-pipe, so that a pause that
//!   arrives before the first CUDA call is a pause (that call waits for the resume), not a
//!   death by `SIGUSR1`. The control thread, which serves the pipe, starts at the first CUDA
//!   call ([`crate::pause::install_once`]); requests sent before it wait in the pipe.
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

use crate::{gate, log};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A pause request's byte in the self-pipe.
pub(crate) const BYTE_PAUSE: u8 = b'P';
/// A resume request's byte.
pub(crate) const BYTE_RESUME: u8 = b'R';
/// The process is exiting: undo or abandon a pause.
pub(crate) const BYTE_EXIT: u8 = b'X';

/// The self-pipe's read end, for the control thread (-1 until created).
static PIPE_READ: AtomicI32 = AtomicI32::new(-1);
/// The self-pipe's write end (-1 until created, or in a child that cannot pause).
static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);
/// The write end's inode: the handler writes only while the descriptor is still the pipe
/// (a program that closes every descriptor and opens a file must not get our bytes).
static PIPE_INODE: AtomicU64 = AtomicU64::new(0);
/// The read end's inode, checked likewise before cudaw reads from or closes it.
static READ_INODE: AtomicU64 = AtomicU64::new(0);
/// The configured signals, as the handler compares them (0: none).
static PAUSE_SIGNAL: AtomicI32 = AtomicI32::new(0);
static RESUME_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Handlers running now: the control thread waits for them before it reads a batch of
/// requests, so that a pause's byte is never read after the byte of a resume sent after it.
pub(crate) static HANDLERS_ACTIVE: AtomicU32 = AtomicU32::new(0);

/// The process is exiting.
static EXITING: AtomicBool = AtomicBool::new(false);
/// This process is the child of a `fork` after cudaw had initialised: no control thread.
static FORKED_AFTER_INIT: AtomicBool = AtomicBool::new(false);
/// The control thread runs (set by it as it starts).
pub(crate) static CONTROL_RUNNING: AtomicBool = AtomicBool::new(false);

/// Whether the process is exiting (a pause is refused).
pub fn is_exiting() -> bool {
    EXITING.load(Ordering::SeqCst)
}

/// Whether this process is the child of a fork taken after cudaw had initialised.
pub fn forked_after_init() -> bool {
    FORKED_AFTER_INIT.load(Ordering::SeqCst)
}

/// The configured pause and resume signals, once the handlers are installed.
pub(crate) fn signals() -> Option<(i32, i32)> {
    match (
        PAUSE_SIGNAL.load(Ordering::SeqCst),
        RESUME_SIGNAL.load(Ordering::SeqCst),
    ) {
        (0, _) | (_, 0) => None,
        s => Some(s),
    }
}

// ---- load ----

// SAFETY (of the attribute): a function pointer placed in `.init_array` is called by the
// dynamic loader with no arguments once the library is relocated; `on_load` takes none,
// never unwinds (its body runs inside the panic boundary) and touches nothing that needs
// `main` to have started.
#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

// SAFETY (of the attribute): as above, for `.fini_array`, run at exit (the library is
// never unloaded).
#[used]
#[link_section = ".fini_array"]
static ON_UNLOAD: extern "C" fn() = on_unload;

extern "C" fn on_load() {
    crate::boundary::guard("loading cudaw", (), || {
        // The main thread's sentinel: its destructor runs first in `exit`.
        if is_main_thread() {
            MAIN_SENTINEL.with(|_| {});
        }
        // SAFETY: the three handlers are `extern "C"` functions that never unwind and,
        // in the child, call only async-signal-safe functions and atomics.
        unsafe { libc::pthread_atfork(None, None, Some(in_forked_child)) };
        if let Err(e) = create_pipe() {
            log::warn(format_args!("pause/resume: {e}"));
            return;
        }
        if let Err(e) = install_handlers(false) {
            log::warn(format_args!("pause/resume signals not installed: {e}"));
        }
    })
}

extern "C" fn on_unload() {
    crate::boundary::guard("unloading cudaw", (), || {
        mark_exiting("the runtime library's destructor")
    })
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

/// Creates the self-pipe: a socket pair, so that a byte sent to it never raises `SIGPIPE`
/// (`MSG_NOSIGNAL`) even if the program closed the other end.
pub(crate) fn create_pipe() -> Result<(), String> {
    let fds =
        new_pair().ok_or_else(|| format!("socketpair: {}", std::io::Error::last_os_error()))?;
    install_pair(fds);
    Ok(())
}

/// A non-blocking, close-on-exec socket pair and each end's inode; async-signal-safe.
fn new_pair() -> Option<[(i32, u64); 2]> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for the two descriptors socketpair writes.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return None;
    }
    Some([(fds[0], inode(fds[0])?), (fds[1], inode(fds[1])?)])
}

fn install_pair([(r, r_ino), (w, w_ino)]: [(i32, u64); 2]) {
    READ_INODE.store(r_ino, Ordering::SeqCst);
    PIPE_INODE.store(w_ino, Ordering::SeqCst);
    PIPE_READ.store(r, Ordering::SeqCst);
    PIPE_WRITE.store(w, Ordering::SeqCst);
}

/// The inode of socket `fd`, if it is one. Async-signal-safe.
fn inode(fd: i32) -> Option<u64> {
    // SAFETY: an all-zero `stat` is a valid value for fstat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into a live local; a closed descriptor only fails.
    let ok = unsafe { libc::fstat(fd, &mut st) } == 0;
    (ok && st.st_mode & libc::S_IFMT == libc::S_IFSOCK).then_some(st.st_ino)
}

/// Whether `fd` is still the self-pipe's end whose inode is `ino` (a program that closes
/// every descriptor may have reused the number). Async-signal-safe.
fn still_ours(fd: i32, ino: &AtomicU64) -> bool {
    fd >= 0 && inode(fd) == Some(ino.load(Ordering::SeqCst))
}

/// The self-pipe's read end, made again if the program closed or reused either end since
/// the library loaded (-1 if it cannot be made).
pub(crate) fn checked_read_end() -> i32 {
    let (r, w) = (
        PIPE_READ.load(Ordering::SeqCst),
        PIPE_WRITE.load(Ordering::SeqCst),
    );
    if still_ours(r, &READ_INODE) && still_ours(w, &PIPE_INODE) {
        return r;
    }
    // Not ours any more: leave those numbers to the program, and make a new pair.
    PIPE_WRITE.store(-1, Ordering::SeqCst);
    PIPE_READ.store(-1, Ordering::SeqCst);
    match create_pipe() {
        Ok(()) => {
            log::warn(format_args!(
                "the pause/resume self-pipe was closed by the program; made again (signals sent meanwhile are lost)"
            ));
            PIPE_READ.load(Ordering::SeqCst)
        }
        Err(e) => {
            log::warn(format_args!("pause/resume signals: {e}"));
            -1
        }
    }
}

/// Installs the pause and resume handlers (`CUDAW_PAUSE_SIGNAL`, `CUDAW_RESUME_SIGNAL`),
/// at load and again at initialisation (`again`): a handler of the program's (one it set
/// before loading the runtime with `dlopen`, or since) is replaced, with a warning.
pub(crate) fn install_handlers(again: bool) -> Result<(), String> {
    let cfg = crate::config::get();
    let Some((pause, resume)) = cfg.pause_signal.zip(cfg.resume_signal) else {
        return Ok(());
    };
    if PIPE_WRITE.load(Ordering::SeqCst) < 0 {
        return Err("no self-pipe".into());
    }
    PAUSE_SIGNAL.store(pause, Ordering::SeqCst);
    RESUME_SIGNAL.store(resume, Ordering::SeqCst);
    for (sig, what) in [(pause, "pause"), (resume, "resume")] {
        // SAFETY: sigaction structs are plain data; zeroed is a valid starting point.
        let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        new.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        new.sa_flags = libc::SA_RESTART;
        // SAFETY: `new.sa_mask` is ours to initialise; sigaction reads `new` and writes
        // `old`, both live locals; the handler is async-signal-safe.
        let rc = unsafe {
            libc::sigemptyset(&mut new.sa_mask);
            libc::sigaction(sig, &new, &mut old)
        };
        if rc != 0 {
            return Err(format!(
                "sigaction({sig}): {}",
                std::io::Error::last_os_error()
            ));
        }
        let ours = on_signal as extern "C" fn(libc::c_int) as usize;
        if old.sa_sigaction != ours
            && old.sa_sigaction != libc::SIG_DFL
            && old.sa_sigaction != libc::SIG_IGN
        {
            log::warn(format_args!(
                "signal {sig} had a handler of the program's; cudaw's {what} handler replaces it"
            ));
        }
    }
    if again {
        log::info(format_args!(
            "pause on signal {pause}, resume on signal {resume}"
        ));
    }
    Ok(())
}

extern "C" fn on_signal(sig: libc::c_int) {
    // Async-signal-safe: atomics, fstat(2), write(2); errno saved and restored.
    HANDLERS_ACTIVE.fetch_add(1, Ordering::SeqCst);
    // SAFETY: __errno_location returns the calling thread's errno slot.
    let errno = unsafe { *libc::__errno_location() };
    let b = if sig == PAUSE_SIGNAL.load(Ordering::Relaxed) {
        BYTE_PAUSE
    } else {
        BYTE_RESUME
    };
    write_byte(b);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
    HANDLERS_ACTIVE.fetch_sub(1, Ordering::SeqCst);
}

/// Sends one request byte to the self-pipe, if it is still ours. Async-signal-safe.
fn write_byte(b: u8) -> bool {
    let fd = PIPE_WRITE.load(Ordering::SeqCst);
    // SAFETY: sends one byte from a live local on our socket; never raises SIGPIPE
    // (MSG_NOSIGNAL), never blocks (a full buffer drops the byte: the requests already
    // queued say the same).
    still_ours(fd, &PIPE_INODE)
        && unsafe {
            libc::send(
                fd,
                (&b as *const u8).cast(),
                1,
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        } == 1
}

// ---- fork ----

extern "C" fn in_forked_child() {
    // Async-signal-safe only: atomics, fstat(2), close(2), socketpair(2).
    let (r, w) = (
        PIPE_READ.swap(-1, Ordering::SeqCst),
        PIPE_WRITE.swap(-1, Ordering::SeqCst),
    );
    for (fd, ino) in [(r, &READ_INODE), (w, &PIPE_INODE)] {
        if still_ours(fd, ino) {
            // SAFETY: our own descriptor (checked), a copy of the parent's; the parent
            // keeps its own.
            unsafe { libc::close(fd) };
        }
    }
    CONTROL_RUNNING.store(false, Ordering::SeqCst);
    if crate::dispatch::initialised() {
        // No control thread here, and the driver refuses CUDA after fork: never hold a
        // call at the gate (a pause the parent held when it forked included).
        FORKED_AFTER_INIT.store(true, Ordering::SeqCst);
        gate::GATE.fetch_and(!gate::PAUSED, Ordering::SeqCst);
        return;
    }
    // A child that has not used CUDA yet may: it gets a pipe of its own.
    if let Some(pair) = new_pair() {
        install_pair(pair);
    }
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
    crate::boundary::guard("cudaw's exit handler", (), || mark_exiting("exit handlers"))
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
        gate::GATE.fetch_and(!gate::PAUSED, Ordering::SeqCst);
        return;
    }
    log::debug(format_args!(
        "exiting ({why}): pause requests are refused from now on"
    ));
    if crate::pause::is_cudaw_thread() {
        // The control thread itself (or a helper of it): nothing to wait for.
        return;
    }
    if !CONTROL_RUNNING.load(Ordering::SeqCst) || !write_byte(BYTE_EXIT) {
        // No control thread to hold the process paused (or none to ask): let every
        // thread go.
        if gate::is_paused() {
            log::warn(format_args!(
                "exiting while paused ({why}), with no control thread to undo the pause: the threads go on"
            ));
            gate::open();
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
            gate::open();
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

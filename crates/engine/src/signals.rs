//! The pause and resume signals and their self-pipe. The handlers are async-signal-safe:
//! they write one byte to the self-pipe (a socket pair, so that a byte sent never raises
//! `SIGPIPE`), which the control thread ([`crate::control`]) reads. The pipe is made at load
//! ([`create_pipe`]), made again if the program closed it ([`checked_read_end`]), and
//! replaced in a forked child ([`in_forked_child`]).

use crate::log;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};

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

/// The control thread runs (set by it as it starts).
pub(crate) static CONTROL_RUNNING: AtomicBool = AtomicBool::new(false);

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
pub(crate) fn write_byte(b: u8) -> bool {
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

/// In a forked child: closes the parent's self-pipe (a signal to the child must never
/// pause its parent) and marks the control thread gone; with `new_pipe`, makes the
/// child's own pipe. Async-signal-safe: atomics, fstat(2), close(2), socketpair(2).
pub(crate) fn in_forked_child(new_pipe: bool) {
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
    if new_pipe {
        if let Some(pair) = new_pair() {
            install_pair(pair);
        }
    }
}

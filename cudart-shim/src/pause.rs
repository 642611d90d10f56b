//! Pause and resume: `SIGUSR1` pauses the process and hands its device memory back,
//! `SIGUSR2` resumes it (signals configurable: `CUDAW_PAUSE_SIGNAL`, `CUDAW_RESUME_SIGNAL`).
//!
//! The signal handlers are async-signal-safe: they write one byte to a self-pipe. A control
//! thread, spawned once at initialisation, reads it and does the work:
//!
//! - pause: close the gate (calls entering the shim wait in the trampolines' slow path),
//!   wait for cudaw's wrapped calls already in flight to leave ([`enter`]), synchronise
//!   every managed device, then evict every allocation to host memory and release the
//!   physical memory ([`vmm::Vmm::evict_all`]). A pause while paused does nothing.
//! - resume: restore every allocation at the same address ([`vmm::Vmm::restore_all`]),
//!   then open the gate. A resume while running does nothing.
//!
//! The same thread serves the control socket ([`crate::control`], `cudaw-ckpt`): socket
//! requests and signals go through [`handle`] one at a time.
//!
//! Not covered: a thread already inside a *forwarded* call (one cudaw does not wrap, such
//! as a kernel launch in mapped addressing) when the gate closes is not waited for; the
//! device synchronisation covers work it already queued, and a short settle
//! ([`SETTLE`]) followed by a second synchronisation covers one that queues work just
//! after, but nothing bounds how long such a thread may take.

use crate::staging::staging;
use crate::types::*;
use crate::{call_real, gate, log, memory};
use parking_lot::Mutex;
use std::cell::Cell;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub use cudaw_control::Moved;

/// cudaw's wrapped calls running now (threads inside at least one).
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// The self-pipe's write end (-1 until installed).
static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);
/// The configured signals, as the handler compares them.
static PAUSE_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// How long pause waits after the first device synchronisation before the second.
pub const SETTLE: Duration = Duration::from_millis(2);

thread_local! {
    /// How deep the calling thread is in wrapped calls (a wrapper may call another).
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Marks the calling thread as inside a wrapped call until the guard drops. Waits while
/// the process is paused (before entering, never once inside).
pub struct InFlight(());

/// Enters a wrapped call: waits while paused, then counts the thread in flight. Nested
/// calls on one thread count once and never wait (the outer call is already counted).
pub fn enter() -> InFlight {
    let depth = DEPTH.with(|d| {
        let v = d.get();
        d.set(v + 1);
        v
    });
    if depth == 0 {
        loop {
            IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
            // Either pause sees our count, or we see its closed gate (both SeqCst).
            if !gate::is_paused() {
                break;
            }
            IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
            gate::wait_while_paused();
        }
    }
    InFlight(())
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let depth = DEPTH.with(|d| {
            let v = d.get().saturating_sub(1);
            d.set(v);
            v
        });
        if depth == 0 {
            IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Wrapped calls in flight now.
pub fn in_flight() -> usize {
    IN_FLIGHT.load(Ordering::SeqCst)
}

/// One control request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// Pause.
    Pause,
    /// Resume.
    Resume,
}

const BYTE_PAUSE: u8 = b'P';
const BYTE_RESUME: u8 = b'R';

extern "C" fn on_signal(sig: libc::c_int) {
    // Async-signal-safe: atomics, write(2), errno saved and restored.
    // SAFETY: __errno_location returns the calling thread's errno slot.
    let errno = unsafe { *libc::__errno_location() };
    let fd = PIPE_WRITE.load(Ordering::Relaxed);
    if fd >= 0 {
        let b = if sig == PAUSE_SIGNAL.load(Ordering::Relaxed) {
            BYTE_PAUSE
        } else {
            BYTE_RESUME
        };
        // SAFETY: writes one byte from a live local to our pipe; a full pipe (requests
        // piling up) drops the byte (O_NONBLOCK), which is harmless.
        unsafe { libc::write(fd, (&b as *const u8).cast(), 1) };
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Installs the handlers and starts the control thread, once. Failures are logged; the
/// program runs on without pause.
pub fn install_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Err(e) = install() {
            log::warn(format_args!("pause/resume signals not installed: {e}"));
        }
    });
}

fn install() -> Result<(), String> {
    let cfg = crate::config::get();
    let listener = crate::control::listen();
    let signals = cfg.pause_signal.zip(cfg.resume_signal);
    if signals.is_none() {
        log::info(format_args!("pause/resume signals disabled"));
    }
    if signals.is_none() && listener.is_none() {
        return Ok(());
    }
    let read_fd = match signals {
        Some((pause, _)) => {
            let mut fds = [0i32; 2];
            // SAFETY: `fds` has room for the two descriptors pipe2 writes.
            if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                return Err(format!("pipe2: {}", std::io::Error::last_os_error()));
            }
            let (read_fd, write_fd) = (fds[0], fds[1]);
            // SAFETY: sets a flag on the pipe's write end, which we own.
            unsafe {
                let fl = libc::fcntl(write_fd, libc::F_GETFL);
                libc::fcntl(write_fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
            }
            PIPE_WRITE.store(write_fd, Ordering::SeqCst);
            PAUSE_SIGNAL.store(pause, Ordering::SeqCst);
            read_fd
        }
        None => -1,
    };
    std::thread::Builder::new()
        .name("cudaw-control".into())
        .spawn(move || control_loop(read_fd, listener))
        .map_err(|e| format!("spawning the control thread: {e}"))?;
    let Some((pause, resume)) = signals else {
        return Ok(());
    };
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
        if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN {
            log::warn(format_args!(
                "signal {sig} had a handler of the program's; cudaw's {what} handler replaces it"
            ));
        }
    }
    log::info(format_args!(
        "pause on signal {pause}, resume on signal {resume}"
    ));
    Ok(())
}

/// The control thread: serves the signals' pipe (`fd`, or -1) and the control socket, one
/// request at a time, so that signals and socket requests are serialised.
fn control_loop(fd: i32, listener: Option<std::os::unix::net::UnixListener>) {
    use std::os::fd::AsRawFd;
    let mut fd = fd;
    let mut buf = [0u8; 64];
    loop {
        let mut polls = [
            libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: listener.as_ref().map_or(-1, |l| l.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        if polls.iter().all(|p| p.fd < 0) {
            return;
        }
        // SAFETY: `polls` is a live array of the length given; poll ignores negative fds.
        let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            log::error(format_args!(
                "control thread: poll failed: {}; pause/resume stop working",
                std::io::Error::last_os_error()
            ));
            return;
        }
        if fd >= 0 && polls[0].revents != 0 {
            // SAFETY: reads into a live local buffer of the length given.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                    log::error(format_args!(
                        "control thread: reading its pipe failed: {}; the pause/resume signals stop working",
                        std::io::Error::last_os_error()
                    ));
                    fd = -1;
                }
            } else if n == 0 {
                fd = -1;
            } else {
                for &b in &buf[..n as usize] {
                    let req = if b == BYTE_PAUSE {
                        Request::Pause
                    } else {
                        Request::Resume
                    };
                    crate::boundary::guard("the control thread", (), || {
                        let _ = handle(req);
                    });
                }
            }
        }
        if let Some(l) = &listener {
            if polls[1].revents != 0 {
                crate::boundary::guard("the control socket", (), || crate::control::serve_one(l));
            }
        }
    }
}

/// Whether cudaw has paused the process (memory evicted, gate closed).
static PAUSED: Mutex<bool> = Mutex::new(false);

/// Carries out one request (on the control thread; callable directly from tests): what it
/// moved, or why it failed.
pub fn handle(req: Request) -> Result<Moved, String> {
    let mut paused = PAUSED.lock();
    match (req, *paused) {
        (Request::Pause, true) => {
            log::info(format_args!("pause: already paused"));
            Ok(Moved::default())
        }
        (Request::Resume, false) => {
            log::info(format_args!("resume: not paused"));
            Ok(Moved::default())
        }
        (Request::Pause, false) => {
            let r = pause();
            *paused = r.is_ok();
            r
        }
        (Request::Resume, true) => {
            let r = resume();
            *paused = r.is_err();
            r
        }
    }
}

/// Whether the process is paused now.
pub fn is_paused() -> bool {
    *PAUSED.lock()
}

fn synchronise_all() {
    for (ordinal, _) in memory::managed_devices() {
        call_real!(cudaSetDevice: fn(i32) -> cudaError_t, ordinal);
        let rc = call_real!(cudaDeviceSynchronize: fn() -> cudaError_t,);
        if rc != SUCCESS {
            log::warn(format_args!(
                "pause: synchronising device {ordinal} reported {rc}"
            ));
        }
    }
}

/// Pauses; on failure the process runs on as before.
fn pause() -> Result<Moved, String> {
    let started = Instant::now();
    gate::close();
    let mut warned = false;
    while in_flight() > 0 {
        if !warned && started.elapsed() > Duration::from_secs(1) {
            log::warn(format_args!(
                "pause: still waiting for {} call(s) in flight after 1 s",
                in_flight()
            ));
            warned = true;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    synchronise_all();
    std::thread::sleep(SETTLE);
    synchronise_all();
    let mut evicted: Vec<(i32, &'static memory::DeviceMemory)> = Vec::new();
    let (mut allocations, mut bytes) = (0usize, 0u64);
    for (ordinal, m) in memory::managed_devices() {
        m.reap(true);
        match m.vmm.evict_all(&mut staging()) {
            Ok(moved) => {
                allocations += moved.allocations;
                bytes += moved.bytes;
                evicted.push((ordinal, m));
            }
            Err(e) => {
                let msg = format!("evicting device {ordinal} failed: {e}; resumed");
                log::error(format_args!("pause: {msg}"));
                for (o, m) in evicted {
                    if let Err(e) = m.vmm.restore_all(&mut staging()) {
                        log::error(format_args!("pause: restoring device {o} failed: {e}"));
                    }
                }
                gate::open();
                return Err(msg);
            }
        }
    }
    let mapped: u64 = memory::managed_devices()
        .map(|(_, m)| m.vmm.stats().mapped)
        .sum();
    let ms = started.elapsed().as_secs_f64() * 1e3;
    log::info(format_args!(
        "paused: {allocations} allocations, {bytes} bytes evicted in {ms:.1} ms; {mapped} bytes of device memory still mapped"
    ));
    Ok(Moved {
        allocations: allocations as u64,
        bytes,
        ms,
        changed: true,
    })
}

/// Resumes; on failure the process stays paused.
fn resume() -> Result<Moved, String> {
    let started = Instant::now();
    let (mut allocations, mut bytes) = (0usize, 0u64);
    for (ordinal, m) in memory::managed_devices() {
        match m.vmm.restore_all(&mut staging()) {
            Ok(moved) => {
                allocations += moved.allocations;
                bytes += moved.bytes;
            }
            Err(e) => {
                // Staying paused keeps the program off memory that is not there.
                let msg = format!(
                    "restoring device {ordinal} failed: {e}; staying paused (resume again to retry)"
                );
                log::error(format_args!("resume: {msg}"));
                return Err(msg);
            }
        }
    }
    let ms = started.elapsed().as_secs_f64() * 1e3;
    log::info(format_args!(
        "resumed: {allocations} allocations, {bytes} bytes restored in {ms:.1} ms"
    ));
    gate::open();
    Ok(Moved {
        allocations: allocations as u64,
        bytes,
        ms,
        changed: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_entries_count_once() {
        let before = in_flight();
        {
            let _a = enter();
            let _b = enter();
            assert_eq!(in_flight(), before + 1);
        }
        assert_eq!(in_flight(), before);
    }
}

//! The control thread and what it serves: the pause and resume signals (through their
//! self-pipe, [`crate::signals`]) and the control socket ([`socket`], `cudaw-ckpt`). Both
//! go through [`crate::requests::handle`] one request at a time — this module is its only
//! caller — so that signals and socket requests are serialised.
//!
//! The signal handlers only write a byte; the thread reads it and takes signals sent back
//! to back together ([`settle`]). While paused it also watches for the process's exit (a
//! Python interpreter finalizing), and with `CUDAW_HOST_ARENA=pinned` it makes the host
//! arena once the program's memory holds still ([`ArenaWatch`]).

pub mod socket;

use crate::host::host;
use crate::requests::{self, Request};
use crate::{evict, handles, inflight, lifecycle, log, memory, signals, staging, state};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

pub use socket::{execute, run_dir, status};

/// Installs the handlers again (a program may have replaced them since the library was
/// loaded) and starts the control thread, once, at the first CUDA call. Failures are
/// logged; the program runs on without pause.
pub fn install_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Err(e) = install() {
            log::warn(format_args!("pause/resume not available: {e}"));
        }
    });
}

fn install() -> Result<(), String> {
    let listener = socket::listen();
    if let Err(e) = signals::install_handlers(true) {
        log::warn(format_args!("pause/resume signals not installed: {e}"));
    }
    if signals::signals().is_none() {
        log::info(format_args!("pause/resume signals disabled"));
    }
    lifecycle::register_exit_handler();
    // Looked up here, once: the control thread must never call dlsym, whose lock this
    // thread may hold (a first CUDA call made by a constructor inside dlopen).
    let _ = lifecycle::interpreter_finalizing();
    let fd = signals::checked_read_end();
    if fd < 0 && listener.is_none() {
        return Ok(());
    }
    // Requests that arrived before this first CUDA call: a pause holds the call.
    let first = if fd >= 0 {
        let mut batch = Vec::new();
        read_pipe(fd, &mut batch);
        signal_request(&batch)
    } else {
        None
    };
    let held = first == Some(Request::Pause) && !lifecycle::is_exiting();
    if held {
        log::info(format_args!(
            "a pause arrived before the first CUDA call: CUDA calls wait for the resume"
        ));
        host().close_gate();
    }
    std::thread::Builder::new()
        .name("cudaw-control".into())
        .spawn(move || {
            inflight::mark_cudaw_thread();
            signals::CONTROL_RUNNING.store(true, Ordering::SeqCst);
            if let Some(req) = first {
                crate::boundary::guard("the control thread", (), || {
                    let _ = requests::handle(req, &mut |_| {});
                });
                // A first pause refused (the process exiting) or failed leaves no gate
                // closed behind it.
                if held && !state::is_paused() {
                    host().open_gate();
                }
            }
            control_loop(fd, listener);
            // Nobody serves the pipe any more: an exit must not wait for an answer.
            signals::CONTROL_RUNNING.store(false, Ordering::SeqCst);
        })
        .map_err(|e| {
            if held {
                host().open_gate();
            }
            format!("spawning the control thread: {e}")
        })?;
    Ok(())
}

/// Reads whatever the self-pipe holds now (it is non-blocking) into `batch`. `false` once
/// the pipe is gone (closed by the program, or an error).
fn read_pipe(fd: i32, batch: &mut Vec<u8>) -> bool {
    let mut buf = [0u8; 64];
    loop {
        // SAFETY: reads into a live local buffer of the length given.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        match n {
            n if n > 0 => batch.extend_from_slice(&buf[..n as usize]),
            0 => return false,
            _ => {
                let e = std::io::Error::last_os_error();
                return match e.kind() {
                    std::io::ErrorKind::Interrupted => continue,
                    std::io::ErrorKind::WouldBlock => true,
                    _ => {
                        log::error(format_args!(
                            "control thread: reading its pipe failed: {e}; the pause/resume signals stop working"
                        ));
                        false
                    }
                };
            }
        }
    }
}

/// How long the control thread waits for more signals after one arrives: signals sent
/// back to back are taken together (see [`signal_request`]).
const SIGNAL_GRACE: Duration = Duration::from_millis(20);

/// Collects the signals sent together with those already in `batch`: waits until no
/// handler is running and no byte has come for [`SIGNAL_GRACE`]. Signal handlers run on
/// whichever thread the kernel picks, so the bytes of a pause and a resume sent back to
/// back can reach the pipe in either order; taken together, their order does not matter.
fn settle(fd: i32, batch: &mut Vec<u8>) -> bool {
    let started = Instant::now();
    // Signals that keep coming are taken a batch at a time; an exit is served at once.
    while started.elapsed() < SETTLE_MAX && !batch.contains(&signals::BYTE_EXIT) {
        while signals::HANDLERS_ACTIVE.load(Ordering::SeqCst) > 0 && started.elapsed() < SETTLE_MAX
        {
            std::thread::sleep(Duration::from_micros(200));
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        let n = unsafe { libc::poll(&mut p, 1, SIGNAL_GRACE.as_millis() as i32) };
        if n <= 0 {
            return true;
        }
        if !read_pipe(fd, batch) {
            return false;
        }
    }
    true
}

/// How often a paused process's control thread looks whether its interpreter is
/// finalizing.
const FINALIZE_WATCH: Duration = Duration::from_millis(100);

/// The longest [`settle`] gathers signals for.
const SETTLE_MAX: Duration = Duration::from_millis(200);

/// What a batch of signal bytes asks: signals taken together resume if any of them is a
/// resume (a pause and then a resume, sent back to back, end resumed — whichever handler
/// wrote its byte first), else pause if any is a pause.
fn signal_request(batch: &[u8]) -> Option<Request> {
    if batch.contains(&signals::BYTE_RESUME) {
        Some(Request::Resume)
    } else if batch.contains(&signals::BYTE_PAUSE) {
        Some(Request::Pause)
    } else {
        None
    }
}

/// The control thread: serves the signals' pipe (`fd`, or -1) and the control socket, one
/// request at a time, so that signals and socket requests are serialised.
fn control_loop(fd: i32, listener: Option<std::os::unix::net::UnixListener>) {
    use std::os::fd::AsRawFd;
    let mut fd = fd;
    // With the host arena, the thread also wakes to make it once the memory holds still.
    let mut arena = crate::config::get()
        .staging
        .host_arena
        .then(ArenaWatch::default);
    loop {
        if let Some(w) = &mut arena {
            crate::boundary::guard("the host arena's watch", (), || w.tick());
        }
        // While paused, the thread also wakes to notice an interpreter's shutdown: a
        // Python job whose finalizers call CUDA would wait behind the gate for ever.
        let paused = host().gate_closed();
        if paused {
            crate::boundary::guard("the hold's lease", (), requests::expire_hold);
        }
        if paused
            && !lifecycle::is_exiting()
            && crate::boundary::guard("the exit watch", false, requests::exiting)
        {
            crate::boundary::guard("the control thread at exit", (), requests::serve_exit);
        }
        let timeout = match (paused, arena.is_some()) {
            (true, _) => FINALIZE_WATCH.as_millis() as i32,
            (false, true) => ARENA_WATCH.as_millis() as i32,
            (false, false) => -1,
        };
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
        let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, timeout) };
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
            let alive = serve_signals(fd);
            if !alive || polls[0].revents & (libc::POLLNVAL | libc::POLLERR) != 0 {
                fd = -1;
            }
        }
        if let Some(l) = &listener {
            if polls[1].revents != 0 {
                crate::boundary::guard("the control socket", (), || socket::serve_one(l));
            }
        }
    }
}

/// Serves the signals waiting in the self-pipe `fd`, with those sent together with them
/// ([`settle`]). `false` once the pipe is gone.
fn serve_signals(fd: i32) -> bool {
    let mut batch = Vec::new();
    let mut alive = read_pipe(fd, &mut batch);
    if alive && signal_request(&batch).is_some() {
        alive = settle(fd, &mut batch);
    }
    // Exit first: a pause taken together with it is refused.
    if batch.contains(&signals::BYTE_EXIT) {
        crate::boundary::guard("the control thread at exit", (), requests::serve_exit);
    }
    if let Some(req) = signal_request(&batch) {
        crate::boundary::guard("the control thread", (), || {
            let _ = requests::handle(req, &mut |_| {});
        });
    }
    alive
}

/// With `CUDAW_HOST_ARENA=pinned`: how often the control thread looks at what each device's
/// allocations would need of a host arena.
const ARENA_WATCH: Duration = Duration::from_millis(500);

/// The control thread's watch over the host arena's size: once a device's allocations have
/// needed the same bytes at two looks in a row (half a second apart) while the program runs,
/// and the device has no arena that large, one is made in the background
/// ([`staging::prepare_arena`]): the first pause then copies straight into it, as
/// later ones do. A job whose memory grows gets a larger arena once it holds still again.
#[derive(Default)]
struct ArenaWatch {
    at: Option<Instant>,
    demand: Vec<(i32, u64)>,
}

impl ArenaWatch {
    fn tick(&mut self) {
        if self.at.is_some_and(|t| t.elapsed() < ARENA_WATCH) {
            return;
        }
        self.at = Some(Instant::now());
        let Some(ctl) = state::CTL.try_lock() else {
            return;
        };
        if ctl.paused {
            return;
        }
        // Devices cudaw manages, and those that hold only driver handles (PyTorch with
        // expandable segments makes no cudaMalloc): their memory manager is made here as a
        // pause would make it, so that even their first pause finds an arena.
        let mut devices: Vec<(i32, &'static memory::DeviceMemory)> =
            memory::managed_devices().collect();
        for o in handles::devices() {
            if !devices.iter().any(|(d, _)| *d == o) {
                if let Ok(m) = memory::device_without_runtime(o) {
                    devices.push((o, m));
                }
            }
        }
        for (ordinal, m) in devices {
            let demand = evict::arena_demand(m);
            match self.demand.iter_mut().find(|(o, _)| *o == ordinal) {
                Some((_, before)) => {
                    if demand > 0 && *before == demand {
                        staging::prepare_arena(m.vmm.backend(), demand);
                    }
                    *before = demand;
                }
                None => self.demand.push((ordinal, demand)),
            }
        }
    }
}

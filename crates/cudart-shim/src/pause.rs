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
//! requests and signals go through [`handle`] one at a time. Dump and restore
//! ([`crate::image`]) build on pause and resume: after a dump without `--leave-running`
//! the allocations' bytes live only in the image ([`vmm::Residency::InFile`]) and a
//! resume loads them from it (`Load`).
//!
//! Calls in flight: pause waits for every call that can enqueue device work, whichever
//! library makes it — cudaw's wrapped calls ([`enter`]) and the exports with in-flight
//! trampolines of both the runtime shim and the driver shim ([`crate::inflight`]:
//! launches, copies, sets, graph launches, stream memory operations, prefetches, even
//! when merely forwarded). A thread that tested the gate just before it closed is inside
//! such a call, and is waited for; one that tests it after sees it closed. So no work
//! reaches the device after the synchronisation.

use crate::staging::staging;
use crate::{gate, image, lifecycle, log, memory};
use ckpt::{ImageError, ImageReader};
use driver::DriverBackend;
use parking_lot::Mutex;
use std::cell::Cell;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use vmm::{Backend, HostCopy, LoadRange, Source, Staging, StagingError, StagingRange};

pub use cudaw_control::{Dumped, ErrorKind, Moved, Phase, Progress, Restored};

/// cudaw's wrapped calls running now (threads inside at least one).
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

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
            // Either pause sees our count, or we see its closed gate (both SeqCst). A
            // wrapped call reached through an in-flight trampoline is waited for already.
            if !gate::is_paused() || crate::inflight::active() {
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

/// Whether the calling thread is inside one of cudaw's wrapped calls.
pub fn in_wrapped_call() -> bool {
    DEPTH.with(|d| d.get() > 0)
}

thread_local! {
    /// Set on cudaw's own threads (the control thread).
    static CUDAW_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is one of cudaw's own (it pauses; it never waits at the gate).
pub fn is_cudaw_thread() -> bool {
    CUDAW_THREAD.with(Cell::get)
}

/// Wrapped calls in flight now.
pub fn in_flight() -> usize {
    IN_FLIGHT.load(Ordering::SeqCst)
}

/// One control request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Pause.
    Pause,
    /// Resume.
    Resume,
    /// Write an image of every allocation to `path` (absolute); stay paused with the bytes
    /// only in the image, or resume when `leave_running`.
    Dump {
        /// The image's path.
        path: PathBuf,
        /// Resume once written.
        leave_running: bool,
    },
    /// Check the image at `path` against the process, load it and resume.
    Restore {
        /// The image's path.
        path: PathBuf,
        /// Accept another process's image whose table matches.
        force: bool,
    },
}

/// What a request did.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A pause's result.
    Pause(Moved),
    /// A resume's result.
    Resume(Moved),
    /// A dump's result.
    Dump(Dumped),
    /// A restore's result.
    Restore(Restored),
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What kind of failure (scripts read it).
    pub kind: ErrorKind,
    /// The message for people.
    pub message: String,
}

impl Failure {
    /// A failure of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Failure {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Where a long request reports its progress (the control socket sends it on when the
/// client asked; signals ignore it).
pub type Report<'a> = &'a mut dyn FnMut(Progress);

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
    let listener = crate::control::listen();
    if let Err(e) = lifecycle::install_handlers(true) {
        log::warn(format_args!("pause/resume signals not installed: {e}"));
    }
    if lifecycle::signals().is_none() {
        log::info(format_args!("pause/resume signals disabled"));
    }
    lifecycle::register_exit_handler();
    // Looked up here, once: the control thread must never call dlsym, whose lock this
    // thread may hold (a first CUDA call made by a constructor inside dlopen).
    let _ = lifecycle::interpreter_finalizing();
    let fd = lifecycle::checked_read_end();
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
        gate::close();
    }
    std::thread::Builder::new()
        .name("cudaw-control".into())
        .spawn(move || {
            CUDAW_THREAD.with(|c| c.set(true));
            lifecycle::CONTROL_RUNNING.store(true, Ordering::SeqCst);
            if let Some(req) = first {
                crate::boundary::guard("the control thread", (), || {
                    let _ = handle(req, &mut |_| {});
                });
                // A first pause refused (the process exiting) or failed leaves no gate
                // closed behind it.
                if held && !CTL.lock().paused {
                    gate::open();
                }
            }
            control_loop(fd, listener);
            // Nobody serves the pipe any more: an exit must not wait for an answer.
            lifecycle::CONTROL_RUNNING.store(false, Ordering::SeqCst);
        })
        .map_err(|e| {
            if held {
                gate::open();
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
    while started.elapsed() < SETTLE_MAX && !batch.contains(&lifecycle::BYTE_EXIT) {
        while lifecycle::HANDLERS_ACTIVE.load(Ordering::SeqCst) > 0
            && started.elapsed() < SETTLE_MAX
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
    if batch.contains(&lifecycle::BYTE_RESUME) {
        Some(Request::Resume)
    } else if batch.contains(&lifecycle::BYTE_PAUSE) {
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
        let paused = gate::is_paused();
        if paused
            && !lifecycle::is_exiting()
            && crate::boundary::guard("the exit watch", false, exiting)
        {
            crate::boundary::guard("the control thread at exit", (), serve_exit);
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
            let mut batch = Vec::new();
            let mut alive = read_pipe(fd, &mut batch);
            if alive && signal_request(&batch).is_some() {
                alive = settle(fd, &mut batch);
            }
            // Exit first: a pause taken together with it is refused.
            if batch.contains(&lifecycle::BYTE_EXIT) {
                crate::boundary::guard("the control thread at exit", (), serve_exit);
            }
            if let Some(req) = signal_request(&batch) {
                crate::boundary::guard("the control thread", (), || {
                    let _ = handle(req, &mut |_| {});
                });
            }
            if !alive || polls[0].revents & (libc::POLLNVAL | libc::POLLERR) != 0 {
                fd = -1;
            }
        }
        if let Some(l) = &listener {
            if polls[1].revents != 0 {
                crate::boundary::guard("the control socket", (), || crate::control::serve_one(l));
            }
        }
    }
}

/// At exit: undoes a pause (a resume), or abandons it when the memory cannot come back, so
/// that the program's teardown runs with its gate open; then lets the exiting thread go.
fn serve_exit() {
    let mut ctl = CTL.lock();
    if ctl.paused {
        match resume(&mut ctl, &mut |_| {}) {
            Ok(m) => log::info(format_args!(
                "exiting while paused: the pause was undone ({} bytes restored) so that the program's teardown runs as it would have",
                m.bytes
            )),
            Err(e) => abandon(&mut ctl, &format!("exiting while paused: {e}")),
        }
    }
    drop(ctl);
    lifecycle::exit_served();
}

/// Gives a pause up without its memory: the gate opens and the program's threads go on,
/// their evicted allocations left where they are (in host memory or an image). Only for a
/// process that is exiting, or whose driver has shut down: nothing can bring the memory
/// back, and holding the threads would hold the process for ever.
fn abandon(ctl: &mut Ctl, why: &str) {
    ctl.paused = false;
    ctl.image = None;
    gate::open();
    log::warn(format_args!(
        "{why}; the pause is abandoned: the program's threads go on without their device memory"
    ));
}

/// Whether the process is exiting: C's `exit` has begun, or the Python interpreter is
/// finalizing (marked exiting from then on).
fn exiting() -> bool {
    if lifecycle::is_exiting() {
        return true;
    }
    let finalizing = lifecycle::interpreter_finalizing();
    if finalizing {
        log::debug(format_args!(
            "the Python interpreter is finalizing: the process is exiting"
        ));
        lifecycle::mark_exiting_from_control();
    }
    finalizing
}

/// Whether the driver has shut down (`CUDA_ERROR_DEINITIALIZED` from a synchronise on a
/// device holding cudaw's memory): the process is exiting, and no memory can come back.
fn driver_shut_down() -> bool {
    const CUDA_ERROR_DEINITIALIZED: i32 = 4;
    memory::managed_devices().any(|(_, m)| {
        matches!(m.vmm.backend().synchronize(), Err(e) if e.code as i32 == CUDA_ERROR_DEINITIALIZED)
    })
}

/// With `CUDAW_HOST_ARENA=pinned`: how often the control thread looks at what each device's
/// allocations would need of a host arena.
const ARENA_WATCH: Duration = Duration::from_millis(500);

/// The control thread's watch over the host arena's size: once a device's allocations have
/// needed the same bytes at two looks in a row (half a second apart) while the program runs,
/// and the device has no arena that large, one is made in the background
/// ([`crate::staging::prepare_arena`]): the first pause then copies straight into it, as
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
        let Some(ctl) = CTL.try_lock() else { return };
        if ctl.paused {
            return;
        }
        for (ordinal, m) in memory::managed_devices() {
            let demand = arena_demand(m);
            match self.demand.iter_mut().find(|(o, _)| *o == ordinal) {
                Some((_, before)) => {
                    if demand > 0 && *before == demand {
                        crate::staging::prepare_arena(m.vmm.backend(), demand);
                    }
                    *before = demand;
                }
                None => self.demand.push((ordinal, demand)),
            }
        }
    }
}

/// What the control thread knows about the process.
pub(crate) struct Ctl {
    /// cudaw has paused it (memory evicted, gate closed).
    pub paused: bool,
    /// The image holding allocations' bytes after a dump without `--leave-running`
    /// (open: a resume reads it even if the file is renamed or removed meanwhile).
    pub image: Option<Held>,
}

/// An image some allocations' bytes live in.
pub(crate) struct Held {
    /// Where it was written.
    pub path: PathBuf,
    /// It, open.
    pub reader: ImageReader<File>,
}

static CTL: Mutex<Ctl> = Mutex::new(Ctl {
    paused: false,
    image: None,
});

/// Carries out one request (on the control thread; callable directly from tests): what it
/// did, or why it failed. `report` receives progress.
pub fn handle(req: Request, report: Report<'_>) -> Result<Outcome, Failure> {
    let mut ctl = CTL.lock();
    match req {
        Request::Pause if ctl.paused => {
            log::info(format_args!("pause: already paused"));
            Ok(Outcome::Pause(Moved::default()))
        }
        Request::Resume if !ctl.paused => {
            log::info(format_args!("resume: not paused"));
            Ok(Outcome::Resume(Moved::default()))
        }
        Request::Pause | Request::Dump { .. } | Request::Restore { .. }
            if !ctl.paused && exiting() =>
        {
            let msg = "the process is exiting: pause refused";
            log::info(format_args!("{msg}"));
            Err(Failure::new(ErrorKind::Failed, msg))
        }
        Request::Pause => {
            let t0 = crate::tracing::now();
            // cudaw's exit handler runs first if the process exits while paused.
            lifecycle::register_exit_handler();
            let m = pause(report)?;
            crate::tracing::pause(false, t0, m.allocations, m.bytes);
            ctl.paused = true;
            Ok(Outcome::Pause(m))
        }
        Request::Resume => {
            let t0 = crate::tracing::now();
            let m = match resume(&mut ctl, report) {
                Ok(m) => m,
                Err(e) if driver_shut_down() => {
                    lifecycle::mark_exiting_from_control();
                    let msg = format!(
                        "{}; the driver has shut down (CUDA_ERROR_DEINITIALIZED): the process is exiting",
                        e.message
                    );
                    abandon(&mut ctl, &msg);
                    return Err(Failure::new(
                        ErrorKind::Failed,
                        format!("{msg}; the pause was abandoned and its threads let go"),
                    ));
                }
                Err(e) => return Err(e),
            };
            crate::tracing::pause(true, t0, m.allocations, m.bytes);
            Ok(Outcome::Resume(m))
        }
        Request::Dump {
            path,
            leave_running,
        } => image::dump(&mut ctl, &path, leave_running, report).map(Outcome::Dump),
        Request::Restore { path, force } => {
            image::restore(&mut ctl, &path, force, report).map(Outcome::Restore)
        }
    }
}

/// Whether the process is paused now.
pub fn is_paused() -> bool {
    CTL.lock().paused
}

/// The image holding the paused process's memory, if a dump left it there.
pub fn image_path() -> Option<PathBuf> {
    CTL.lock().image.as_ref().map(|h| h.path.clone())
}

/// Waits for every device's work, through the driver (`cuCtxSynchronize` on the primary
/// context cudaw's memory lives in), not the real runtime: a thread held at the driver
/// layer's gate from inside the real runtime may hold one of the runtime's locks, which
/// `cudaDeviceSynchronize` could then wait for. Every device with memory of cudaw's:
/// allocations, or driver handles alone (PyTorch's expandable segments need no
/// `cudaMalloc`). A device that cannot be synchronised is an error: its kernels may still
/// be using the memory a pause would take away, or a resume has just loaded.
///
/// With a `deadline`, the synchronise runs on a helper thread and a device still busy then
/// is an error of kind [`ErrorKind::Timeout`] (a kernel that waits for something the pause
/// holds back — another rank's collective, a host callback — would keep it busy for ever;
/// the helper returns once the device is idle).
pub(crate) fn synchronise_all(deadline: Option<Instant>) -> Result<(), Failure> {
    let mut ordinals: Vec<i32> = memory::managed_devices().map(|(o, _)| o).collect();
    ordinals.extend(crate::handles::devices());
    ordinals.sort_unstable();
    ordinals.dedup();
    let failed = |msg: String| Failure::new(ErrorKind::Failed, msg);
    for ordinal in ordinals {
        let m = memory::device_without_runtime(ordinal)
            .map_err(|e| failed(format!("device {ordinal}: error {e}")))?;
        let backend = m.vmm.backend();
        let sync = move || {
            backend.synchronize().map_err(|e| {
                // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED .. _WRONG_THREAD (900-908).
                let capture = if (900..=908).contains(&e.code) {
                    " (a stream is being captured into a CUDA graph: pause once no capture is under way)"
                } else {
                    ""
                };
                format!("synchronising device {ordinal}: {e}{capture}")
            })
        };
        let Some(deadline) = deadline else {
            sync().map_err(failed)?;
            continue;
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("cudaw-sync".into())
            .spawn(move || {
                let _ = tx.send(sync());
            })
            .map_err(|e| {
                failed(format!(
                    "starting a thread to synchronise device {ordinal}: {e}"
                ))
            })?;
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(r) => r.map_err(failed)?,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                return Err(Failure::new(
                    ErrorKind::Timeout,
                    format!(
                        "device {ordinal} was still running the program's work at the pause's deadline (CUDAW_PAUSE_TIMEOUT)"
                    ),
                ))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(failed(format!("synchronising device {ordinal}: the helper thread died")))
            }
        }
    }
    Ok(())
}

/// Evicts every resident allocation of one device to host memory: the one place that says
/// how (the process's pinned staging, [`crate::staging::save_for_pause`]): into
/// [`HostCopy::Memory`] copies the VMM holds (dump reads them with
/// [`vmm::Vmm::with_host_copy`]), or, with the host arena, [`HostCopy::Retained`] in the
/// arena (dump reads them with [`crate::staging::with_retained`]). `copied` receives the
/// bytes copied since its last call.
pub(crate) fn evict_device(
    m: &memory::DeviceMemory,
    copied: &mut dyn FnMut(u64),
) -> Result<vmm::Moved, vmm::VmmError> {
    m.vmm.evict_all(&mut Evict { copied })
}

/// The process's pinned staging ([`staging()`]), given batches of about [`BATCH`] bytes so
/// that progress can be counted between them.
struct Evict<'a> {
    copied: &'a mut dyn FnMut(u64),
}

/// Bytes per save or load handed to the pinned staging at once (a progress step).
const BATCH: u64 = 512 << 20;

/// Splits `ranges` into consecutive runs of about [`BATCH`] bytes (a range is never split).
fn batches<T>(ranges: &[T], len: impl Fn(&T) -> u64) -> impl Iterator<Item = &[T]> {
    let mut rest = ranges;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (mut n, mut bytes) = (0, 0u64);
        while n < rest.len() && (n == 0 || bytes < BATCH) {
            bytes += len(&rest[n]);
            n += 1;
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Some(head)
    })
}

impl Staging<DriverBackend> for Evict<'_> {
    fn save(
        &mut self,
        backend: &DriverBackend,
        ranges: &[StagingRange],
    ) -> Result<Vec<HostCopy>, StagingError> {
        let mut out = Vec::with_capacity(ranges.len());
        for batch in batches(ranges, |r| r.len) {
            out.extend(crate::staging::save_for_pause(backend, batch)?);
            (self.copied)(batch.iter().map(|r| r.len).sum());
        }
        Ok(out)
    }

    fn load(
        &mut self,
        backend: &DriverBackend,
        ranges: &[LoadRange<'_>],
    ) -> Result<(), StagingError> {
        staging().load(backend, ranges)
    }
}

/// Loads allocations onto the device: from the host copies the VMM holds and from an
/// image (the allocations a dump left in it, or every allocation for a restore when
/// `image_only`). Reads the image one chunk at a time through one chunk-sized buffer,
/// every chunk's checksum checked as it is read.
pub(crate) struct Load<'a> {
    /// The image to read from.
    pub image: Option<&'a mut ImageReader<File>>,
    /// Load every range from the image, whatever the VMM holds (restore).
    pub image_only: bool,
    /// Bytes loaded so far.
    pub done: u64,
    /// Bytes to load in all.
    pub total: u64,
    /// Where progress goes.
    pub report: Report<'a>,
    /// The image's own failure, when reading it failed (a damaged file).
    pub image_error: Option<ImageError>,
    /// Time spent inside the staging's loads (the copies from host memory), for the
    /// phases a resume logs at debug level.
    pub in_staging: std::time::Duration,
    buf: Vec<u8>,
}

impl<'a> Load<'a> {
    pub(crate) fn new(
        image: Option<&'a mut ImageReader<File>>,
        image_only: bool,
        total: u64,
        report: Report<'a>,
    ) -> Self {
        Load {
            image,
            image_only,
            done: 0,
            total,
            report,
            image_error: None,
            in_staging: std::time::Duration::ZERO,
            buf: Vec::new(),
        }
    }

    fn advance_by(&mut self, n: u64) {
        self.done += n;
        (self.report)(Progress {
            phase: Phase::Load,
            done: self.done,
            total: self.total,
        });
    }

    fn load_from_image(
        &mut self,
        backend: &DriverBackend,
        r: &LoadRange<'_>,
    ) -> Result<(), StagingError> {
        let id = r.id.0;
        let Some(img) = self.image.as_deref_mut() else {
            return Err(StagingError::Io(format!(
                "allocation {id} is in an image, but no image is open"
            )));
        };
        match img.allocation(id).map(|e| e.record.size) {
            Some(size) if size == r.len => {}
            other => {
                return Err(StagingError::Io(format!(
                    "allocation {id} ({} bytes) is {} in the image",
                    r.len,
                    other.map_or("missing".to_owned(), |s| format!("{s} bytes"))
                )))
            }
        }
        let cs = img.chunk_size().min(r.len.max(1));
        let cs = usize::try_from(cs).map_err(|_| StagingError::Io("chunk size".into()))?;
        if self.buf.len() < cs {
            self.buf.resize(cs, 0);
        }
        let mut off = 0u64;
        while off < r.len {
            let n = (r.len - off).min(cs as u64) as usize;
            let piece = &mut self.buf[..n];
            if let Err(e) = img.read_range(id, off, piece) {
                let msg = e.to_string();
                self.image_error = Some(e);
                return Err(StagingError::Io(msg));
            }
            backend.copy_from_host(r.addr + off, piece)?;
            off += n as u64;
            self.done += n as u64;
            (self.report)(Progress {
                phase: Phase::Load,
                done: self.done,
                total: self.total,
            });
        }
        Ok(())
    }
}

impl Staging<DriverBackend> for Load<'_> {
    fn recycle(&mut self, copies: Vec<Vec<u8>>) {
        staging().recycle(copies);
    }

    fn save(
        &mut self,
        _backend: &DriverBackend,
        _ranges: &[StagingRange],
    ) -> Result<Vec<HostCopy>, StagingError> {
        Err(StagingError::Io("this staging only loads".into()))
    }

    fn load(
        &mut self,
        backend: &DriverBackend,
        ranges: &[LoadRange<'_>],
    ) -> Result<(), StagingError> {
        // Runs of ranges held in host memory go through the pinned staging a batch at a
        // time; ranges in the image are read chunk by chunk.
        let mut i = 0;
        while i < ranges.len() {
            let from_memory = |r: &LoadRange<'_>| {
                !self.image_only && matches!(r.source, Source::Memory(_) | Source::Retained)
            };
            if from_memory(&ranges[i]) {
                // Ranges in the host arena go in one call (straight copies, no host-side
                // work to pace: a wait between batches would only idle the copy engines);
                // those in pageable memory a batch at a time, for the progress reports.
                let retained = matches!(ranges[i].source, Source::Retained);
                let mut j = i;
                while j < ranges.len()
                    && from_memory(&ranges[j])
                    && matches!(ranges[j].source, Source::Retained) == retained
                {
                    j += 1;
                }
                let run = &ranges[i..j];
                let parts: Box<dyn Iterator<Item = &[LoadRange<'_>]>> = if retained {
                    Box::new(std::iter::once(run))
                } else {
                    Box::new(batches(run, |r| r.len))
                };
                for batch in parts {
                    let t = Instant::now();
                    staging().load(backend, batch)?;
                    self.in_staging += t.elapsed();
                    self.advance_by(batch.iter().map(|r| r.len).sum());
                }
                i = j;
                continue;
            }
            self.load_from_image(backend, &ranges[i])?;
            i += 1;
        }
        Ok(())
    }
}

/// Host arena bytes `m`'s allocations need (`CUDAW_HOST_ARENA=pinned`).
pub(crate) fn arena_demand(m: &memory::DeviceMemory) -> u64 {
    m.vmm
        .snapshot()
        .iter()
        .map(|a| a.size.next_multiple_of(driver::ARENA_ALIGN))
        .sum()
}

/// Waits, the gate closed, until no thread is inside a wrapped call or a call in flight;
/// `Err(calls still in flight)` at `deadline`.
fn wait_for_calls_in_flight(started: Instant, deadline: Option<Instant>) -> Result<(), usize> {
    // Every thread's "in flight" store before its gate test is visible from here on.
    driver::inflight::barrier();
    let mut warned = false;
    loop {
        let (wrapped, marked) = (in_flight(), crate::inflight::REGISTRY.busy());
        if wrapped == 0 && marked == 0 {
            return Ok(());
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(wrapped + marked);
        }
        if !warned && started.elapsed() > Duration::from_secs(1) {
            log::warn(format_args!(
                "pause: still waiting for {} call(s) in flight after 1 s",
                wrapped + marked
            ));
            warned = true;
        }
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// Pauses; on failure the process runs on as before.
pub(crate) fn pause(report: Report<'_>) -> Result<Moved, Failure> {
    let started = Instant::now();
    let timeout = crate::config::get().pause_timeout;
    let deadline = timeout.map(|t| started + t);
    gate::close();
    // Nothing is evicted until both waits are over: a failure lets the process run on as
    // before.
    let waited = wait_for_calls_in_flight(started, deadline)
        .map_err(|n| {
            Failure::new(
                ErrorKind::Timeout,
                format!(
                    "{n} call(s) that can put work on the device were still in flight at the pause's deadline (CUDAW_PAUSE_TIMEOUT)"
                ),
            )
        })
        .and_then(|()| synchronise_all(deadline));
    // Exit began while the pause waited: give it up, never evict under a teardown.
    let waited = waited.and_then(|()| {
        if lifecycle::is_exiting() {
            Err(Failure::new(
                ErrorKind::Failed,
                "the process began to exit during the pause",
            ))
        } else {
            Ok(())
        }
    });
    if let Err(mut e) = waited {
        if e.kind == ErrorKind::Timeout {
            let secs = timeout.map_or(0.0, |t| t.as_secs_f64());
            e.message = format!(
                "{} after {secs:.1} s; the pause was given up and the program runs on (a kernel or copy waiting for something a pause holds back, such as another process's collective, never finishes: pause every rank of a job, or raise CUDAW_PAUSE_TIMEOUT)",
                e.message
            );
        } else {
            e.message.push_str("; resumed");
        }
        log::error(format_args!("pause: {}", e.message));
        gate::open();
        return Err(e);
    }
    let total: u64 = memory::managed_devices()
        .map(|(_, m)| m.vmm.stats().resident)
        .sum::<u64>()
        + crate::handles::devices()
            .into_iter()
            .map(|d| crate::handles::counts(d).resident)
            .sum::<u64>();
    let mut done = 0u64;
    report(Progress {
        phase: Phase::Evict,
        done,
        total,
    });
    let mut evicted: Vec<(i32, &'static memory::DeviceMemory)> = Vec::new();
    let (mut allocations, mut bytes) = (0usize, 0u64);
    for (ordinal, m) in memory::managed_devices() {
        m.reap_synchronised();
        let r = evict_device(m, &mut |n| {
            done += n;
            report(Progress {
                phase: Phase::Evict,
                done,
                total: total.max(done),
            });
        });
        match r {
            Ok(moved) => {
                allocations += moved.allocations;
                bytes += moved.bytes;
                evicted.push((ordinal, m));
                let kept = crate::staging::retained_count(m.vmm.backend());
                if kept > 0 {
                    log::info(format_args!(
                        "pause: device {ordinal}: {kept} of {} allocations left in the host arena",
                        moved.allocations
                    ));
                }
            }
            Err(e) => {
                let msg = format!("evicting device {ordinal} failed: {e}; resumed");
                log::error(format_args!("pause: {msg}"));
                // The failing device too: a release that failed after the copies left its
                // allocations evicted (their chunks still mapped, which a restore fills).
                evicted.push((ordinal, m));
                for (o, m) in evicted {
                    match m.vmm.restore_all(&mut staging()) {
                        Ok(_) => crate::staging::restored(m.vmm.backend(), 0),
                        Err(e) => {
                            log::error(format_args!("pause: restoring device {o} failed: {e}"))
                        }
                    }
                }
                gate::open();
                return Err(Failure::new(ErrorKind::Failed, msg));
            }
        }
    }
    // Driver-level handles (cuMemCreate through the entry points or the driver layer).
    let h = match crate::handles::evict(&mut |n| {
        done += n;
        report(Progress {
            phase: Phase::Evict,
            done,
            total: total.max(done),
        });
    }) {
        Ok(h) => h,
        Err(e) => {
            let msg = format!("evicting driver-level handles failed: {e}; resumed");
            log::error(format_args!("pause: {msg}"));
            for (o, m) in evicted {
                match m.vmm.restore_all(&mut staging()) {
                    Ok(_) => crate::staging::restored(m.vmm.backend(), 0),
                    Err(e) => log::error(format_args!("pause: restoring device {o} failed: {e}")),
                }
            }
            gate::open();
            return Err(Failure::new(ErrorKind::Failed, msg));
        }
    };
    allocations += h.handles;
    bytes += h.bytes;
    let reused = crate::staging::pause_done();
    if reused > 0 {
        log::info(format_args!(
            "pause: {reused} bytes went into host memory kept from the last resume"
        ));
    }
    let mapped: u64 = memory::managed_devices()
        .map(|(_, m)| m.vmm.stats().mapped)
        .sum::<u64>()
        + h.kept_bytes;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    log::info(format_args!(
        "paused: {allocations} allocations, {bytes} bytes evicted in {ms:.1} ms; {mapped} bytes of device memory still mapped (driver handles: {} evicted, {} bytes; {} left on the device, {} bytes)",
        h.handles, h.bytes, h.kept, h.kept_bytes
    ));
    Ok(Moved {
        allocations: allocations as u64,
        bytes,
        ms,
        changed: true,
    })
}

/// Resumes (loading from host copies and from the image a dump left, if any); on failure
/// the process stays paused, its memory where it was.
pub(crate) fn resume(ctl: &mut Ctl, report: Report<'_>) -> Result<Moved, Failure> {
    let started = Instant::now();
    let total: u64 = memory::managed_devices()
        .map(|(_, m)| m.vmm.stats().evicted)
        .sum::<u64>()
        + crate::handles::evicted_bytes();
    let mut load = Load::new(
        ctl.image.as_mut().map(|h| &mut h.reader),
        false,
        total,
        report,
    );
    (load.report)(Progress {
        phase: Phase::Load,
        done: 0,
        total,
    });
    let (mut allocations, mut bytes) = (0usize, 0u64);
    let mut restored = Vec::new();
    let before_memory = Instant::now();
    for (ordinal, m) in memory::managed_devices() {
        match m.vmm.restore_all(&mut load) {
            Ok(moved) => {
                allocations += moved.allocations;
                bytes += moved.bytes;
                restored.push(m);
            }
            Err(e) => {
                // Staying paused keeps the program off memory that is not there.
                let image_error = load.image_error.take();
                drop(load);
                let (kind, msg) = match (image_error, &ctl.image) {
                    (Some(ie), Some(h)) => (
                        ErrorKind::BadImage,
                        format!(
                            "the image {} that holds the process's memory is damaged: {ie}; staying paused (`cudaw-ckpt restore PID -i IMAGE` can load another image of this process)",
                            h.path.display()
                        ),
                    ),
                    _ => (
                        ErrorKind::Failed,
                        format!(
                            "restoring device {ordinal} failed: {e}; staying paused (resume again to retry)"
                        ),
                    ),
                };
                log::error(format_args!("resume: {msg}"));
                return Err(Failure::new(kind, msg));
            }
        }
    }
    let memory_ms = before_memory.elapsed().as_secs_f64() * 1e3;
    let staging_ms = load.in_staging.as_secs_f64() * 1e3;
    let before_handles = Instant::now();
    // Driver-level handles: from host memory, or from the image a dump left them in.
    match crate::handles::restore(&mut load) {
        Ok(h) => {
            allocations += h.handles;
            bytes += h.bytes;
        }
        Err(e) => {
            let image_error = load.image_error.take();
            drop(load);
            let (kind, msg) = match (image_error, &ctl.image) {
                (Some(ie), Some(h)) => (
                    ErrorKind::BadImage,
                    format!(
                        "the image {} that holds the process's driver handles is damaged: {ie}; staying paused (`cudaw-ckpt restore PID -i IMAGE` can load another image of this process)",
                        h.path.display()
                    ),
                ),
                _ => (
                    ErrorKind::Failed,
                    format!(
                        "restoring driver-level handles failed: {e}; staying paused (resume again to retry)"
                    ),
                ),
            };
            log::error(format_args!("resume: {msg}"));
            return Err(Failure::new(kind, msg));
        }
    }
    drop(load);
    let handles_ms = before_handles.elapsed().as_secs_f64() * 1e3;
    let before_sync = Instant::now();
    // A copy from pageable host memory returns once the bytes are staged, before they
    // reach the device; kernels on the program's non-blocking streams must not run
    // ahead of them.
    if let Err(mut e) = synchronise_all(None) {
        e.message
            .push_str("; staying paused (resume again to retry)");
        log::error(format_args!("resume: {}", e.message));
        return Err(e);
    }
    let from = match ctl.image.take() {
        Some(h) => format!(" (from {})", h.path.display()),
        None => String::new(),
    };
    let ms = started.elapsed().as_secs_f64() * 1e3;
    log::info(format_args!(
        "resumed: {allocations} allocations, {bytes} bytes restored in {ms:.1} ms{from}"
    ));
    log::debug(format_args!(
        "resume phases: device memory {memory_ms:.1} ms (copies from host memory {staging_ms:.1} ms), driver handles {handles_ms:.1} ms, synchronising {:.1} ms",
        before_sync.elapsed().as_secs_f64() * 1e3
    ));
    ctl.paused = false;
    gate::open();
    for m in restored {
        crate::staging::restored(m.vmm.backend(), arena_demand(m));
    }
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

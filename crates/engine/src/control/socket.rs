//! The control socket: `$CUDAW_RUN_DIR/PID.sock` (the run folder is private:
//! [`cudaw_control::open_run_dir`]; the socket is 0600), served for `cudaw-ckpt`. One JSON
//! request line (with, for `dump`, `restore` and `trace`, the file itself passed as a
//! descriptor), progress lines if the request asks for them, one JSON reply line
//! ([`cudaw_control`]); the peer's uid (`SO_PEERCRED`) must be the process owner's or
//! root's. The socket is removed at exit; one left by a dead process of the same PID is
//! replaced.
//!
//! Connections are served concurrently, so that no client can hold up another:
//! - The control thread accepts every waiting connection ([`serve_one`]) and hands it to
//!   the *reader* thread, which reads the request lines of up to [`MAX_PENDING`]
//!   connections at once (one `poll`), each within [`READ_LIMIT`]: a silent client is
//!   answered with an error when its time is up, and delays no one (past that many silent
//!   ones, the oldest is dropped for the newest).
//! - `status`, `stats` and `trace` are answered at once, each on a thread of its own (at
//!   most [`MAX_ANSWERING`] at a time), also while a long request runs: `status` then
//!   says which (`busy`) and takes the state from the pause gate.
//! - `pause`, `resume`, `dump`, `restore` and `tracing` are queued for the control thread
//!   (which the reader wakes by connecting to the socket), and run there one at a time, as
//!   the signals' requests do: they act on the device from cudaw's own thread.
//!
//! Each line written to a client may take at most [`WRITE_LIMIT`]; a client that goes
//! away during a long request does not stop it.

use crate::failure::Report;
use crate::host::{host, TracerRequest};
use crate::requests::{self, Outcome};
use crate::{config, handles, image, log, memory, staging, state};
use cudaw_control::{
    DeviceStatus, ErrorKind, Progress, Reply, Request, State, Status, MAX_REQUEST,
};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use vmm::Residency;

/// The socket this process created, and the PID that created it (a forked child's exit
/// must not remove its parent's socket).
static SOCKET: OnceLock<(PathBuf, u32)> = OnceLock::new();

/// How long a client has to send its request line.
pub const READ_LIMIT: Duration = Duration::from_secs(2);
/// How long writing one line to a client may take.
pub const WRITE_LIMIT: Duration = Duration::from_secs(2);
/// Connections whose request line is being read at once.
pub const MAX_PENDING: usize = 64;
/// `status`, `stats` and `trace` requests answered at once.
pub const MAX_ANSWERING: usize = 16;

fn euid() -> u32 {
    cudaw_files::euid()
}

/// Creates the socket and arranges its removal at exit; `None` (after a warning) when it
/// cannot be created, or `CUDAW_CONTROL_SOCKET=off`.
pub fn listen() -> Option<UnixListener> {
    if !config::get().control_socket {
        log::info(format_args!(
            "control socket disabled (CUDAW_CONTROL_SOCKET=off)"
        ));
        return None;
    }
    match try_listen() {
        Ok(l) => Some(l),
        Err(e) => {
            log::warn(format_args!("control socket not created: {e}"));
            None
        }
    }
}

static RUN_DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// The run folder (once per process; see [`cudaw_control::open_run_dir`]): `CUDAW_RUN_DIR`
/// (absolute and private, else refused), else `$XDG_RUNTIME_DIR/cudaw`, else
/// `/tmp/cudaw-UID`, else a private `/tmp/cudaw-UID-…` when that is another user's.
/// Created 0700 if missing. The control socket lives there (the node ledger has a folder
/// of its own, `CUDAW_NODE_DIR`).
pub fn run_dir() -> Result<PathBuf, String> {
    RUN_DIR
        .get_or_init(|| {
            let d = cudaw_control::open_run_dir(
                |k| std::env::var(k).ok(),
                euid(),
                Path::new(cudaw_control::TMP),
            )?;
            for w in &d.warnings {
                log::warn(format_args!("run folder: {w}"));
            }
            Ok(d.path)
        })
        .clone()
}

fn try_listen() -> Result<UnixListener, String> {
    let dir = run_dir()?;
    let pid = std::process::id();
    let path = cudaw_control::socket_path(&dir, pid);
    // Our PID's socket can only be a dead process's: replace it.
    match std::fs::remove_file(&path) {
        Ok(()) => log::info(format_args!("replaced a stale {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("removing the stale {}: {e}", path.display())),
    }
    let listener = UnixListener::bind(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("chmod 0600 {}: {e}", path.display()))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if SOCKET.set((path.clone(), pid)).is_ok() {
        // SAFETY: registers a function with no arguments that never unwinds (it runs
        // inside the panic boundary).
        unsafe { libc::atexit(remove_at_exit) };
    }
    log::info(format_args!("control socket {}", path.display()));
    Ok(listener)
}

extern "C" fn remove_at_exit() {
    crate::boundary::guard("removing the control socket", (), || {
        if let Some((path, pid)) = SOCKET.get() {
            if *pid == std::process::id() {
                let _ = std::fs::remove_file(path);
            }
        }
    })
}

// ------------------------------------------------------------------ accepting

/// Accepts the waiting connections (on the control thread) and hands them to the reader;
/// then runs the requests queued for the control thread.
pub fn serve_one(listener: &UnixListener) {
    for _ in 0..MAX_PENDING {
        match listener.accept() {
            Ok((s, _)) => adopt(s),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => {
                log::warn(format_args!("control socket: accept: {e}"));
                // Avoid spinning on a persistent error.
                std::thread::sleep(Duration::from_millis(10));
                break;
            }
        }
    }
    run_jobs();
}

/// Checks the peer and hands the connection to the reader.
fn adopt(stream: UnixStream) {
    let uid = match rustix::net::sockopt::socket_peercred(&stream) {
        Ok(c) => c.uid.as_raw(),
        Err(e) => {
            reply_now(
                &stream,
                &Reply::error(ErrorKind::Request, format!("SO_PEERCRED: {e}")),
            );
            return;
        }
    };
    if uid != 0 && uid != euid() {
        log::warn(format_args!(
            "control socket: refused a request from uid {uid} (the process belongs to uid {})",
            euid()
        ));
        reply_now(
            &stream,
            &Reply::error(
                ErrorKind::Request,
                format!(
                    "permission denied: uid {uid} may not control process {} (owner uid {}; only the owner or root may)",
                    std::process::id(),
                    euid()
                ),
            ),
        );
        return;
    }
    match reader() {
        Some(r) => {
            let sent = r.tx.lock().send(stream);
            match sent {
                Ok(()) => {
                    let _ = (&r.wake).write(&[1]);
                }
                Err(mpsc::SendError(stream)) => reply_now(
                    &stream,
                    &Reply::error(ErrorKind::Failed, "the control socket's reader has stopped"),
                ),
            }
        }
        None => reply_now(
            &stream,
            &Reply::error(
                ErrorKind::Failed,
                "the control socket's reader thread could not be started",
            ),
        ),
    }
}

/// Writes a short reply without waiting (a client that does not read it loses it).
fn reply_now(stream: &UnixStream, reply: &Reply) {
    let _ = stream.set_nonblocking(true);
    let _ = (&*stream).write(reply.to_line().as_bytes());
}

// ------------------------------------------------------------------ reading requests

struct ReaderHandle {
    tx: Mutex<mpsc::Sender<UnixStream>>,
    /// Written to wake the reader's `poll` for a new connection.
    wake: UnixStream,
}

static READER: OnceLock<Option<ReaderHandle>> = OnceLock::new();

fn reader() -> Option<&'static ReaderHandle> {
    READER
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel();
            let (wake, wake_rx) = UnixStream::pair().ok()?;
            wake.set_nonblocking(true).ok()?;
            wake_rx.set_nonblocking(true).ok()?;
            let spawned = std::thread::Builder::new()
                .name("cudaw-control-io".into())
                .spawn(move || reader_loop(rx, wake_rx));
            match spawned {
                Ok(_) => Some(ReaderHandle {
                    tx: Mutex::new(tx),
                    wake,
                }),
                Err(e) => {
                    log::error(format_args!(
                        "control socket: cannot start its reader thread: {e}"
                    ));
                    None
                }
            }
        })
        .as_ref()
}

/// A connection whose request line is being read.
struct Pending {
    stream: UnixStream,
    buf: Vec<u8>,
    fds: Vec<OwnedFd>,
    deadline: Instant,
}

/// What reading a connection came to.
enum Read {
    /// More to come.
    More,
    /// The line (or the end of the stream) is there.
    Done,
    /// The client closed without sending anything (the reader's own wake-ups do).
    Empty,
    /// Reading failed; the reply says why.
    Failed(String),
}

fn read_some(p: &mut Pending) -> Read {
    let mut chunk = [0u8; 4096];
    loop {
        match cudaw_control::recv_with_fds(&p.stream, &mut chunk, &mut p.fds) {
            Ok(0) if p.buf.is_empty() => return Read::Empty,
            Ok(0) => return Read::Done,
            Ok(n) => {
                p.buf.extend_from_slice(&chunk[..n]);
                if p.buf.contains(&b'\n') {
                    return Read::Done;
                }
                if p.buf.len() > MAX_REQUEST {
                    return Read::Failed(format!("request longer than {MAX_REQUEST} bytes"));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Read::More,
            Err(e) => return Read::Failed(format!("reading the request: {e}")),
        }
    }
}

fn reader_loop(rx: mpsc::Receiver<UnixStream>, wake: UnixStream) {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut pending: Vec<Pending> = Vec::new();
    loop {
        loop {
            match rx.try_recv() {
                Ok(stream) => {
                    if pending.len() >= MAX_PENDING {
                        let oldest = pending.remove(0);
                        reply_now(
                            &oldest.stream,
                            &Reply::error(
                                ErrorKind::Request,
                                format!("dropped: {MAX_PENDING} connections were waiting to send a request, and this one had sent none"),
                            ),
                        );
                    }
                    if stream.set_nonblocking(true).is_ok() {
                        pending.push(Pending {
                            stream,
                            buf: Vec::new(),
                            fds: Vec::new(),
                            deadline: Instant::now() + READ_LIMIT,
                        });
                    }
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => return,
            }
        }
        let now = Instant::now();
        let wait = pending
            .iter()
            .map(|p| p.deadline.saturating_duration_since(now))
            .min();
        let ready: Vec<bool> = {
            let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(pending.len() + 1);
            fds.push(PollFd::new(&wake, PollFlags::IN));
            for p in &pending {
                fds.push(PollFd::new(&p.stream, PollFlags::IN));
            }
            let timeout = wait.map(|d| Timespec {
                tv_sec: d.as_secs() as _,
                tv_nsec: d.subsec_nanos() as _,
            });
            match poll(&mut fds, timeout.as_ref()) {
                Ok(_) => fds.iter().map(|f| !f.revents().is_empty()).collect(),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    log::error(format_args!(
                        "control socket: the reader's poll failed: {e}; requests are no longer read"
                    ));
                    return;
                }
            }
        };
        if ready[0] {
            let mut b = [0u8; 64];
            while matches!(std::io::Read::read(&mut &wake, &mut b), Ok(n) if n > 0) {}
        }
        let mut i = 0;
        let mut k = 1;
        while i < pending.len() {
            let is_ready = ready.get(k).copied().unwrap_or(false);
            k += 1;
            let outcome = if is_ready {
                read_some(&mut pending[i])
            } else {
                Read::More
            };
            match outcome {
                Read::More if Instant::now() >= pending[i].deadline => {
                    let p = pending.remove(i);
                    reply_now(
                        &p.stream,
                        &Reply::error(
                            ErrorKind::Request,
                            format!(
                                "no request line within {} s (send one JSON line ending in a newline, e.g. {{\"cmd\":\"status\"}})",
                                READ_LIMIT.as_secs()
                            ),
                        ),
                    );
                }
                Read::More => i += 1,
                Read::Empty => {
                    pending.remove(i);
                }
                Read::Failed(e) => {
                    let p = pending.remove(i);
                    reply_now(&p.stream, &Reply::error(ErrorKind::Request, e));
                }
                Read::Done => {
                    let p = pending.remove(i);
                    dispatch(p);
                }
            }
        }
    }
}

/// A request read, to be carried out.
struct Job {
    stream: UnixStream,
    req: Request,
    file: Option<File>,
    /// Descriptors a reimport passed, one per handle.
    fds: Vec<OwnedFd>,
}

/// Requests queued for the control thread.
static JOBS: Mutex<VecDeque<Job>> = Mutex::new(VecDeque::new());
/// `status`, `stats` and `trace` answers in progress.
static ANSWERING: AtomicUsize = AtomicUsize::new(0);

/// Parses a request read in full and sends it where it runs.
fn dispatch(mut p: Pending) {
    let end = p
        .buf
        .iter()
        .position(|&b| b == b'\n')
        .unwrap_or(p.buf.len());
    p.buf.truncate(end);
    let parsed = String::from_utf8(std::mem::take(&mut p.buf))
        .map_err(|_| "the request is not UTF-8".to_owned())
        .and_then(|line| Request::parse(&line));
    let req = match parsed {
        Ok(r) => r,
        Err(e) => {
            log::warn(format_args!("control socket: {e}"));
            reply_now(&p.stream, &Reply::error(ErrorKind::Request, e));
            return;
        }
    };
    // A reimport takes one descriptor per handle.
    let mut passed = Vec::new();
    if let Request::Reimport { handles } = &req {
        if p.fds.len() != handles.len() {
            reply_now(
                &p.stream,
                &Reply::error(
                    ErrorKind::Request,
                    format!(
                        "a reimport of {} handles came with {} descriptors (one each)",
                        handles.len(),
                        p.fds.len()
                    ),
                ),
            );
            return;
        }
        passed = std::mem::take(&mut p.fds);
    }
    let file = match (req.passes_fd(), p.fds.len()) {
        (false, 0) => None,
        (true, 1) => p.fds.pop().map(File::from),
        (true, 0) => {
            reply_now(
                &p.stream,
                &Reply::error(
                    ErrorKind::Request,
                    format!(
                        "the {} request says a file comes with it (\"fd\":true), but no descriptor came",
                        req.name()
                    ),
                ),
            );
            return;
        }
        (_, n) => {
            reply_now(
                &p.stream,
                &Reply::error(
                    ErrorKind::Request,
                    format!(
                        "{n} descriptors came with a {} request, which takes {}",
                        req.name(),
                        if req.passes_fd() {
                            "one"
                        } else {
                            "none (\"fd\" is not set)"
                        }
                    ),
                ),
            );
            return;
        }
    };
    let job = Job {
        stream: p.stream,
        req,
        file,
        fds: passed,
    };
    match job.req {
        Request::Status {} | Request::Stats { .. } | Request::Trace { .. } => answer_aside(job),
        _ => {
            JOBS.lock().push_back(job);
            // Wake the control thread: a connection that closes at once, which the reader
            // drops unanswered.
            match SOCKET.get() {
                Some((path, _)) => {
                    if let Err(e) = UnixStream::connect(path) {
                        log::warn(format_args!(
                            "control socket: cannot wake the control thread through {}: {e}; the request waits for the next connection",
                            path.display()
                        ));
                    }
                }
                None => run_jobs(),
            }
        }
    }
}

/// Answers on a thread of its own, when fewer than [`MAX_ANSWERING`] are.
fn answer_aside(job: Job) {
    if ANSWERING.fetch_add(1, Ordering::SeqCst) >= MAX_ANSWERING {
        ANSWERING.fetch_sub(1, Ordering::SeqCst);
        reply_now(
            &job.stream,
            &Reply::error(
                ErrorKind::Failed,
                format!("busy: {MAX_ANSWERING} requests are being answered; try again"),
            ),
        );
        return;
    }
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            ANSWERING.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let spawned = std::thread::Builder::new()
        .name("cudaw-control-reply".into())
        .spawn(move || {
            let _done = Done;
            crate::boundary::guard("the control socket", (), || answer(job));
        });
    if let Err(e) = spawned {
        ANSWERING.fetch_sub(1, Ordering::SeqCst);
        log::warn(format_args!("control socket: cannot start a thread: {e}"));
    }
}

// ------------------------------------------------------------------ carrying out

/// Held by the control thread while it runs a queued request.
static EXEC: Mutex<()> = Mutex::new(());
/// The queued request running now, and since when.
static RUNNING: Mutex<Option<(&'static str, Instant)>> = Mutex::new(None);

/// Runs the queued requests (on the control thread).
fn run_jobs() {
    loop {
        let Some(job) = JOBS.lock().pop_front() else {
            return;
        };
        // RUNNING is set before EXEC is taken and cleared after it is let go, so a status
        // that finds EXEC held always finds the request's name.
        struct Running;
        impl Drop for Running {
            fn drop(&mut self) {
                *RUNNING.lock() = None;
            }
        }
        *RUNNING.lock() = Some((job.req.name(), Instant::now()));
        let _running = Running;
        let _exec = EXEC.lock();
        answer(job);
    }
}

/// Carries out a request and writes the progress lines and the reply.
fn answer(job: Job) {
    let Job {
        stream,
        req,
        file,
        fds,
    } = job;
    if let Err(e) = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_write_timeout(Some(WRITE_LIMIT)))
    {
        log::warn(format_args!("control socket: {e}"));
        return;
    }
    let mut sink = Sink {
        stream: &stream,
        on: req.wants_progress(),
        last: None,
    };
    let (reply, out) = execute_with(req, file, fds, &mut |p| sink.send(p));
    let line = reply.to_line();
    let sent = if out.is_empty() {
        (&stream).write_all(line.as_bytes())
    } else {
        let borrowed: Vec<_> = out.iter().map(|f| f.as_fd()).collect();
        cudaw_control::send_line_with_fds(&stream, line.as_bytes(), &borrowed)
    };
    if let Err(e) = sent {
        log::warn(format_args!("control socket: writing the reply: {e}"));
    }
}

/// Sends progress lines to the client, about ten a second per phase (always the first and
/// the last of a phase); stops after a failed write.
struct Sink<'a> {
    stream: &'a UnixStream,
    on: bool,
    last: Option<(Progress, Instant)>,
}

impl Sink<'_> {
    const EVERY: Duration = Duration::from_millis(100);

    fn send(&mut self, p: Progress) {
        if !self.on {
            return;
        }
        let due = match self.last {
            None => true,
            Some((q, at)) => {
                q.phase != p.phase
                    || (p.done >= p.total && q.done < q.total)
                    || (at.elapsed() >= Self::EVERY && p.done != q.done)
            }
        };
        if !due {
            return;
        }
        self.last = Some((p, Instant::now()));
        let mut s = self.stream;
        if let Err(e) = s.write_all(p.to_line().as_bytes()) {
            log::info(format_args!(
                "control socket: the client stopped reading progress ({e}); carrying on"
            ));
            self.on = false;
        }
    }
}

/// Carries out one request through the request handler (as the signals' requests are),
/// `report` receiving its progress.
pub fn execute(req: Request, report: Report<'_>) -> Reply {
    execute_with(req, None, Vec::new(), report).0
}

/// [`execute`], with the file the client passed (`"fd":true`) or a reimport's descriptors:
/// the reply, and the descriptors that go with it (a reexport's).
fn execute_with(
    req: Request,
    file: Option<File>,
    fds: Vec<OwnedFd>,
    report: Report<'_>,
) -> (Reply, Vec<OwnedFd>) {
    let req = match requests::shared(req, fds) {
        Ok(done) => return done,
        Err(req) => req,
    };
    (execute_one(req, file, report), Vec::new())
}

fn execute_one(req: Request, file: Option<File>, report: Report<'_>) -> Reply {
    let absolute = |path: String| -> Result<PathBuf, String> {
        let p = PathBuf::from(path);
        if p.is_absolute() {
            Ok(p)
        } else {
            Err(format!(
                "the path {} is not absolute (the process's working folder is not the client's)",
                p.display()
            ))
        }
    };
    // Who pauses (the node daemon's swaps say so): recorded once the pause is done.
    let pauser = match &req {
        Request::Pause { by, .. } => Some(by.clone()),
        _ => None,
    };
    let req = match req {
        Request::Status {} => {
            return Reply {
                ok: true,
                status: Some(status()),
                ..Reply::default()
            }
        }
        Request::Hold {
            window_ms,
            lease_ms,
        } => requests::Request::Hold {
            // Bounded: an Instant plus either must not overflow.
            window: std::time::Duration::from_millis(window_ms.min(600_000)),
            lease: std::time::Duration::from_millis(lease_ms.min(3_600_000)),
        },
        Request::Release {} => requests::Request::Release,
        Request::Limit { memory } => {
            return Reply {
                ok: true,
                limit: Some(cudaw_control::Limited {
                    memory,
                    devices: crate::memory::set_node_limit(memory),
                }),
                ..Reply::default()
            }
        }
        Request::Pause {
            release_context: true,
            ..
        } => requests::Request::PauseForRelease,
        Request::Pause { .. } => requests::Request::Pause,
        Request::ContextKept {} => requests::Request::ContextKept,
        Request::Shares {}
        | Request::Pair { .. }
        | Request::Mark { .. }
        | Request::EvictShared { .. }
        | Request::Reexport { .. }
        | Request::Reimport { .. } => {
            return Reply::error(
                ErrorKind::Failed,
                "a shared-memory request reached the wrong handler",
            )
        }
        Request::Resume {
            context_restored: true,
            ..
        } => requests::Request::ResumeReleased,
        Request::Resume { .. } => requests::Request::Resume,
        Request::Dump {
            path,
            leave_running,
            keep_shared,
            ..
        } => match absolute(path) {
            Ok(path) => requests::Request::Dump {
                path,
                leave_running,
                keep_shared,
            },
            Err(e) => return Reply::error(ErrorKind::Request, e),
        },
        Request::Restore { path, force, .. } => match absolute(path) {
            Ok(path) => requests::Request::Restore { path, force },
            Err(e) => return Reply::error(ErrorKind::Request, e),
        },
        Request::Stats { top } => {
            let top = top.unwrap_or(cudaw_control::DEFAULT_TOP) as usize;
            return host().tracer_request(TracerRequest::Stats { top });
        }
        Request::Tracing { on } => return host().tracer_request(TracerRequest::Switch { on }),
        Request::Trace { path, .. } => {
            let path = match absolute(path) {
                Ok(p) => p,
                Err(e) => return Reply::error(ErrorKind::Request, e),
            };
            return host().tracer_request(TracerRequest::Timeline {
                path: &path,
                file: file.as_ref(),
            });
        }
    };
    let outcome = match file {
        Some(f) => image::with_passed_file(f, || requests::handle(req, report)),
        None => requests::handle(req, report),
    };
    match outcome {
        Ok(out) => {
            let mut r = Reply {
                ok: true,
                ..Reply::default()
            };
            match out {
                Outcome::Pause(m) => {
                    if let Some(by) = pauser {
                        state::pause_done(by, m.changed);
                    }
                    r.pause = Some(m)
                }
                Outcome::Resume(m) => r.resume = Some(m),
                Outcome::Hold(h) => r.hold = Some(h),
                Outcome::Release(h) => r.release = Some(h),
                Outcome::Dump(d) => r.dump = Some(d),
                Outcome::Restore(d) => r.restore = Some(d),
            }
            r
        }
        Err(e) => Reply::error(e.kind, e.message),
    }
}

/// The process's state and memory now; while a queued request runs on the control thread,
/// without waiting for it (the state from the pause gate, `busy` naming the request).
pub fn status() -> Status {
    loop {
        if let Some(_idle) = EXEC.try_lock() {
            return status_now(None);
        }
        // EXEC was held, so RUNNING was set; None here means the request ended in between:
        // look again.
        if let Some((name, since)) = *RUNNING.lock() {
            let busy = format!("{name}, for {:.1} s", since.elapsed().as_secs_f64());
            return status_now(Some(busy));
        }
    }
}

fn status_now(busy: Option<String>) -> Status {
    let (arena, arena_building) = staging::arena_bytes();
    // Devices with cudaw's allocations or a budget (memory taken through the driver alone,
    // as PyTorch's expandable segments do, has a budget and no VMM).
    let mut ordinals: Vec<i32> = memory::managed_devices()
        .map(|(o, _)| o)
        .chain(memory::budgets().map(|(o, _)| o))
        .chain(handles::devices())
        .collect();
    ordinals.sort_unstable();
    ordinals.dedup();
    let devices = ordinals
        .into_iter()
        .map(|ordinal| {
            let s = memory::managed_devices()
                .find(|(o, _)| *o == ordinal)
                .map(|(_, m)| m.vmm.stats())
                .unwrap_or_default();
            let in_file = memory::managed_devices()
                .find(|(o, _)| *o == ordinal)
                .map(|(_, m)| {
                    m.vmm
                        .snapshot()
                        .iter()
                        .filter(|a| matches!(a.residency, Residency::InFile { .. }))
                        .map(|a| a.size)
                        .sum()
                })
                .unwrap_or(0);
            let budget = memory::budgets()
                .find(|(o, _)| *o == ordinal)
                .map(|(_, b)| b);
            let usage = budget.map(|b| b.usage()).unwrap_or_default();
            let node = budget.and_then(|b| b.node());
            let h = handles::counts(ordinal);
            DeviceStatus {
                ordinal,
                gpu: memory::gpu_of(ordinal).unwrap_or_default(),
                allocations: s.allocations + h.handles,
                resident: s.resident + h.resident,
                evicted: s.evicted + h.evicted,
                in_file,
                mapped: s.mapped + h.resident,
                limit: usage.limit.or(s.limit),
                used: usage.used,
                peak: usage.peak,
                refused: usage.refused,
                node_used: node.as_ref().map(|v| v.used()),
                node_capacity: node.as_ref().map(|v| v.capacity),
                handles: h.handles,
                held: h.held,
                wanted: crate::room::wanted()
                    .iter()
                    .filter(|w| w.ordinal == ordinal)
                    .map(|w| w.bytes)
                    .sum(),
            }
        })
        .collect();
    Status {
        pid: std::process::id(),
        state: if busy.is_none() && state::is_released() {
            State::Released
        } else if busy.as_deref().is_some_and(|b| b.starts_with("hold")) && host().gate_closed() {
            State::Held
        } else if busy.is_some() && host().gate_closed() || busy.is_none() && state::is_paused() {
            State::Paused
        } else if busy.is_none() && state::is_held() {
            State::Held
        } else {
            State::Running
        },
        addressing: match config::get().addressing {
            config::Addressing::Mapped => "mapped",
            config::Addressing::Translated => "translated",
        }
        .to_owned(),
        image: if busy.is_some() {
            None
        } else {
            state::image_path().map(|p| p.to_string_lossy().into_owned())
        },
        kept_host: staging::kept_host() as u64,
        release_on_pause: config::get().release_on_pause,
        arena,
        arena_building,
        devices,
        node_dir: config::get()
            .ledger
            .then(|| config::get().node_dir.to_string_lossy().into_owned()),
        job: config::get().job.clone(),
        waiting: host().gate_waiters() as u64,
        // Read under the request lock: not while a request holds it.
        paused_by: if busy.is_none() {
            state::paused_by()
        } else {
            None
        },
        launches: crate::trace::driver_launches(),
        busy,
    }
}

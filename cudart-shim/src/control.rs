//! The control socket: `$CUDAW_RUN_DIR/PID.sock` (default `$XDG_RUNTIME_DIR/cudaw`, else
//! `/tmp/cudaw-UID`; the folder is created 0700, the socket is 0600), served by the pause
//! module's control thread for `cudaw-ckpt`. One JSON request line, progress lines if the
//! request asks for them, one JSON reply line ([`cudaw_control`]); the peer's uid
//! (`SO_PEERCRED`) must be the process owner's or root's. The socket is removed at exit;
//! one left by a dead process of the same PID is replaced.
//!
//! One connection is served at a time, on the control thread, with a 2 s limit on reading
//! the request and on writing each line: a client that stalls delays the next request by
//! at most that (a client that goes away during a long request does not stop it).

use crate::{config, log, memory, pause};
use cudaw_control::{
    DeviceStatus, ErrorKind, Progress, Reply, Request, State, Status, MAX_REQUEST,
};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use vmm::Residency;

/// The socket this process created, and the PID that created it (a forked child's exit
/// must not remove its parent's socket).
static SOCKET: OnceLock<(PathBuf, u32)> = OnceLock::new();

const IO_LIMIT: Duration = Duration::from_secs(2);

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
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

/// The run folder (`CUDAW_RUN_DIR`), created 0700 if missing; refused unless it is a
/// folder owned by this process's user. The control socket and the node ledgers live there.
pub fn run_dir() -> Result<PathBuf, String> {
    let uid = euid();
    let dir = cudaw_control::run_dir_from_env(uid);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let meta = std::fs::metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() || meta.uid() != uid {
        return Err(format!(
            "{} is not a folder owned by uid {uid}; refusing to use it",
            dir.display()
        ));
    }
    Ok(dir)
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

/// The connecting process's uid, from `SO_PEERCRED`.
fn peer_uid(stream: &UnixStream) -> Result<u32, String> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a live local of that size.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(format!("SO_PEERCRED: {}", std::io::Error::last_os_error()));
    }
    Ok(cred.uid)
}

/// Accepts one waiting connection (if any) and answers it.
pub fn serve_one(listener: &UnixListener) {
    let stream = match listener.accept() {
        Ok((s, _)) => s,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
        Err(e) => {
            log::warn(format_args!("control socket: accept: {e}"));
            // Avoid spinning on a persistent error.
            std::thread::sleep(Duration::from_millis(10));
            return;
        }
    };
    if let Err(e) = answer(stream) {
        log::warn(format_args!("control socket: {e}"));
    }
}

fn answer(mut stream: UnixStream) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_LIMIT))?;
    stream.set_write_timeout(Some(IO_LIMIT))?;
    let reply = match peer_uid(&stream) {
        Err(e) => Reply::error(ErrorKind::Request, e),
        Ok(uid) if uid != 0 && uid != euid() => {
            log::warn(format_args!(
                "control socket: refused a request from uid {uid} (the process belongs to uid {})",
                euid()
            ));
            Reply::error(
                ErrorKind::Request,
                format!(
                    "permission denied: uid {uid} may not control process {} (owner uid {}; only the owner or root may)",
                    std::process::id(),
                    euid()
                ),
            )
        }
        Ok(_) => match read_line(&mut stream) {
            Err(e) => Reply::error(ErrorKind::Request, e),
            Ok(line) => match Request::parse(&line) {
                Err(e) => {
                    log::warn(format_args!("control socket: {e}"));
                    Reply::error(ErrorKind::Request, e)
                }
                Ok(req) => {
                    let mut sink = Sink {
                        stream: &stream,
                        on: req.wants_progress(),
                        last: None,
                    };
                    execute(req, &mut |p| sink.send(p))
                }
            },
        },
    };
    stream.write_all(reply.to_line().as_bytes())?;
    stream.flush()
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

/// Reads up to the first newline (or the end), at most [`MAX_REQUEST`] bytes.
fn read_line(stream: &mut UnixStream) -> Result<String, String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(format!(
                    "no request line within {} s (send one JSON line ending in a newline, e.g. {{\"cmd\":\"status\"}})",
                    IO_LIMIT.as_secs()
                ))
            }
            Err(e) => return Err(format!("reading the request: {e}")),
        };
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.iter().position(|&b| b == b'\n') {
            buf.truncate(i);
            break;
        }
        if buf.len() > MAX_REQUEST {
            return Err(format!("request longer than {MAX_REQUEST} bytes"));
        }
    }
    String::from_utf8(buf).map_err(|_| "the request is not UTF-8".to_owned())
}

/// Carries out one request through the pause module (the same functions the signals use),
/// `report` receiving its progress.
pub fn execute(req: Request, report: pause::Report<'_>) -> Reply {
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
    let req = match req {
        Request::Status {} => {
            return Reply {
                ok: true,
                status: Some(status()),
                ..Reply::default()
            }
        }
        Request::Pause { .. } => pause::Request::Pause,
        Request::Resume { .. } => pause::Request::Resume,
        Request::Dump {
            path,
            leave_running,
            ..
        } => match absolute(path) {
            Ok(path) => pause::Request::Dump {
                path,
                leave_running,
            },
            Err(e) => return Reply::error(ErrorKind::Request, e),
        },
        Request::Restore { path, force, .. } => match absolute(path) {
            Ok(path) => pause::Request::Restore { path, force },
            Err(e) => return Reply::error(ErrorKind::Request, e),
        },
        Request::Stats { top } => {
            let top = top.unwrap_or(cudaw_control::DEFAULT_TOP) as usize;
            return match crate::tracing::stats(top) {
                Ok(s) => Reply {
                    ok: true,
                    stats: Some(Box::new(s)),
                    ..Reply::default()
                },
                Err(e) => Reply::error(ErrorKind::Failed, e),
            };
        }
        Request::Tracing { on } => {
            return match crate::tracing::set_active(on) {
                Ok(was_on) => Reply {
                    ok: true,
                    tracing: Some(cudaw_control::TracingSwitched {
                        mode: crate::config::get().trace.as_str().to_owned(),
                        on,
                        was_on,
                    }),
                    ..Reply::default()
                },
                Err(e) => Reply::error(ErrorKind::Failed, e),
            };
        }
        Request::Trace { path } => {
            let path = match absolute(path) {
                Ok(p) => p,
                Err(e) => return Reply::error(ErrorKind::Request, e),
            };
            return match crate::tracing::write_timeline(&path) {
                Ok(w) => Reply {
                    ok: true,
                    trace: Some(cudaw_control::TraceWritten {
                        path: path.to_string_lossy().into_owned(),
                        events: w.events,
                        bytes: w.bytes,
                        dropped: w.dropped,
                    }),
                    ..Reply::default()
                },
                Err(e) => Reply::error(ErrorKind::Failed, e),
            };
        }
    };
    match pause::handle(req, report) {
        Ok(out) => {
            let mut r = Reply {
                ok: true,
                ..Reply::default()
            };
            match out {
                pause::Outcome::Pause(m) => r.pause = Some(m),
                pause::Outcome::Resume(m) => r.resume = Some(m),
                pause::Outcome::Dump(d) => r.dump = Some(d),
                pause::Outcome::Restore(d) => r.restore = Some(d),
            }
            r
        }
        Err(e) => Reply::error(e.kind, e.message),
    }
}

/// The process's state and memory now.
pub fn status() -> Status {
    let (arena, arena_building) = crate::staging::arena_bytes();
    // Devices with cudaw's allocations or a budget (memory taken through the driver alone,
    // as PyTorch's expandable segments do, has a budget and no VMM).
    let mut ordinals: Vec<i32> = memory::managed_devices()
        .map(|(o, _)| o)
        .chain(memory::budgets().map(|(o, _)| o))
        .chain(crate::handles::devices())
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
            let h = crate::handles::counts(ordinal);
            DeviceStatus {
                ordinal,
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
            }
        })
        .collect();
    Status {
        pid: std::process::id(),
        state: if pause::is_paused() {
            State::Paused
        } else {
            State::Running
        },
        addressing: match config::get().addressing {
            config::Addressing::Mapped => "mapped",
            config::Addressing::Translated => "translated",
        }
        .to_owned(),
        image: pause::image_path().map(|p| p.to_string_lossy().into_owned()),
        kept_host: crate::staging::kept_host() as u64,
        arena,
        arena_building,
        devices,
    }
}

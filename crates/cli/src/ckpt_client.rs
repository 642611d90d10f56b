//! `cudaw-ckpt`'s side of the control socket: finding and connecting to a process's
//! socket, sending one request, reading progress lines and the reply (its failures are
//! [`crate::failure`]'s kinds).

use std::io::{BufRead, BufReader};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cudaw_control::{Line, Progress, Reply, Request};

pub use crate::failure::{fail, kind_of, Kind};

/// Our effective uid (the owner of /proc/self).
pub fn my_uid() -> anyhow::Result<u32> {
    Ok(std::fs::metadata("/proc/self")
        .map_err(|e| fail(Kind::Io, format!("reading /proc/self: {e}")))?
        .uid())
}

/// The run folders the processes under cudaw may use, in their order of preference
/// ([`cudaw_control::find_run_dirs`]): `CUDAW_RUN_DIR` alone when set, else those of
/// `$XDG_RUNTIME_DIR/cudaw`, `/tmp/cudaw-UID` and the user's private `/tmp/cudaw-UID-*`
/// that exist and are private.
pub fn run_dirs() -> anyhow::Result<Vec<PathBuf>> {
    cudaw_control::find_run_dirs(
        |k| std::env::var(k).ok(),
        my_uid()?,
        Path::new(cudaw_control::TMP),
    )
    .map_err(|e| fail(Kind::Request, e))
}

/// Whether a process `pid` exists (as /proc shows it: also another user's).
pub fn process_exists(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A zombie (exited, not yet reaped by its parent) is gone for every purpose here:
        // the state follows the command name's closing parenthesis.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_none_or(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => std::fs::symlink_metadata(format!("/proc/{pid}")).is_ok(),
    }
}

/// The process's status.
pub fn status(pid: u32) -> anyhow::Result<cudaw_control::Status> {
    let reply = request(pid, &cudaw_control::Request::Status {}, &mut |_| {})?;
    carried(reply.status, "status")
}

/// The run folder named in messages: the first of [`run_dirs`], else the first place a
/// process would use.
pub fn run_dir() -> anyhow::Result<PathBuf> {
    Ok(match run_dirs()?.into_iter().next() {
        Some(d) => d,
        None => cudaw_control::run_dir_from_env(my_uid()?),
    })
}

/// Connects to `pid`'s socket, or explains why not. The socket must be served by process
/// `pid` itself (`SO_PEERCRED`): a file passed with a request goes to no one else.
pub fn connect(pid: u32) -> anyhow::Result<UnixStream> {
    let dirs = run_dirs()?;
    let dir = dirs
        .iter()
        .find(|d| cudaw_control::socket_path(d, pid).exists())
        .cloned()
        .map_or_else(run_dir, Ok)?;
    let path = cudaw_control::socket_path(&dir, pid);
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let owner = std::fs::metadata(&proc_dir).ok().map(|m| m.uid());
    let Some(owner) = owner else {
        // Its socket, if one is left behind (killed with SIGKILL), goes now.
        let removed = match std::fs::symlink_metadata(&path) {
            Ok(_) => match remove_stale_socket(&dir, pid) {
                Ok(Some(_)) => format!(" (its stale socket {} was removed)", path.display()),
                _ => String::new(),
            },
            Err(_) => String::new(),
        };
        return Err(fail(
            Kind::NoProcess,
            format!("no process with PID {pid}{removed}"),
        ));
    };
    match UnixStream::connect(&path) {
        Ok(s) => {
            let peer = rustix::net::sockopt::socket_peercred(&s).map_err(|e| {
                fail(
                    Kind::Connection,
                    format!("{}: SO_PEERCRED: {e}", path.display()),
                )
            })?;
            if peer.pid.as_raw_nonzero().get() as u32 != pid {
                return Err(fail(
                    Kind::NotUnderCudaw,
                    format!(
                        "{} is served by process {}, not by process {pid}; not using it",
                        path.display(),
                        peer.pid.as_raw_nonzero()
                    ),
                ));
            }
            Ok(s)
        }
        Err(e) => {
            let me = my_uid()?;
            Err(match e.kind() {
                std::io::ErrorKind::PermissionDenied => fail(Kind::Permission, format!(
                    "permission denied on {}: process {pid} belongs to uid {owner}; only its owner or root may control it",
                    path.display()
                )),
                std::io::ErrorKind::NotFound if owner != me && me != 0 => fail(Kind::Permission, format!(
                    "process {pid} belongs to another user (uid {owner}); only its owner or root may control it (its socket is not in your run folder {})",
                    dir.display()
                )),
                std::io::ErrorKind::NotFound => fail(Kind::NotUnderCudaw, format!(
                    "process {pid} is not running under cudaw (no control socket {}; start it with `cudaw run`, and check CUDAW_RUN_DIR matches)",
                    path.display()
                )),
                std::io::ErrorKind::ConnectionRefused => fail(Kind::NotUnderCudaw, format!(
                    "process {pid} is not serving its control socket {} (a stale socket: the PID now belongs to another process, or cudaw's control thread has stopped)",
                    path.display()
                )),
                _ => fail(Kind::Connection, format!("connecting to {}: {e}", path.display())),
            })
        }
    }
}

/// Sends one request to `pid`; progress lines go to `on_progress`; returns the reply (an
/// error if not ok).
pub fn request(
    pid: u32,
    req: &Request,
    on_progress: &mut dyn FnMut(Progress),
) -> anyhow::Result<Reply> {
    request_with_file(pid, req, None, on_progress)
}

/// [`request`], passing `file` with it (the request says `"fd":true`).
pub fn request_with_file(
    pid: u32,
    req: &Request,
    file: Option<BorrowedFd<'_>>,
    on_progress: &mut dyn FnMut(Progress),
) -> anyhow::Result<Reply> {
    let stream = connect(pid)?;
    exchange_with(stream, req, file, on_progress).map_err(|e| {
        let kind = kind_of(&e);
        fail(kind, format!("process {pid}: {e}"))
    })
}

/// Sends `req` on `stream` and reads until the reply.
pub fn exchange(
    stream: UnixStream,
    req: &Request,
    on_progress: &mut dyn FnMut(Progress),
) -> anyhow::Result<Reply> {
    exchange_with(stream, req, None, on_progress)
}

/// Sends `req` (with `file`, if any) on `stream` and reads until the reply.
pub fn exchange_with(
    stream: UnixStream,
    req: &Request,
    file: Option<BorrowedFd<'_>>,
    on_progress: &mut dyn FnMut(Progress),
) -> anyhow::Result<Reply> {
    // Pausing, dumping or restoring a large process takes a while (progress lines, when
    // asked for, arrive at least every few seconds); status and a stalled server do not.
    // A job's hold and release come back within their window: a member that does not
    // answer by then (stopped, or its control thread stuck) fails the job operation, which
    // lets the others go, rather than holding them for ever.
    let limit = match req {
        Request::Status {} => Duration::from_secs(10),
        Request::Hold { window_ms, .. } => {
            Duration::from_millis(*window_ms) + Duration::from_secs(15)
        }
        Request::Release {} => Duration::from_secs(15),
        _ => Duration::from_secs(3600),
    };
    stream.set_read_timeout(Some(limit))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    // A server that refuses us (another user's process) replies without reading the
    // request: read its reply even when sending failed.
    let sent = cudaw_control::send_request(&stream, req, file);
    let mut lines = BufReader::new(stream);
    loop {
        let mut line = String::new();
        let read = lines.read_line(&mut line);
        if line.is_empty() {
            if let Err(e) = sent {
                return Err(fail(Kind::Connection, format!("sending the request: {e}")));
            }
            if let Err(e) = read {
                let late = matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                );
                return Err(fail(
                    if late {
                        Kind::Timeout
                    } else {
                        Kind::Connection
                    },
                    if late {
                        format!(
                            "no reply within {:.0} s (the process is stopped, or its control thread is stuck)",
                            limit.as_secs_f64()
                        )
                    } else {
                        format!("reading the reply: {e}")
                    },
                ));
            }
            return Err(fail(
                Kind::Connection,
                "the process closed the connection without replying",
            ));
        }
        match Line::parse(&line).map_err(|e| fail(Kind::Connection, e))? {
            Line::Progress(p) => on_progress(p),
            Line::Reply(reply) => return succeeded(*reply),
        }
    }
}

/// What a reply carries for the request made, or a connection failure naming it.
pub fn carried<T>(field: Option<T>, what: &str) -> anyhow::Result<T> {
    field.ok_or_else(|| fail(Kind::Connection, format!("the reply carries no {what}")))
}

/// `reply`, or the failure it reports.
fn succeeded(reply: Reply) -> anyhow::Result<Reply> {
    if !reply.ok {
        let msg = reply
            .error
            .as_deref()
            .unwrap_or("request failed (no reason given)");
        return Err(fail(Kind::of_reply(reply.kind, msg), msg));
    }
    Ok(reply)
}

/// `path` made absolute against our working folder (the process's is another).
pub fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    let cwd = std::env::current_dir()
        .map_err(|e| fail(Kind::Io, format!("finding the working folder: {e}")))?;
    Ok(cwd.join(path))
}

/// `path` as the UTF-8 text the protocol carries.
pub fn utf8(path: &Path) -> anyhow::Result<String> {
    path.to_str().map(str::to_owned).ok_or_else(|| {
        fail(
            Kind::Io,
            format!("{} is not valid UTF-8; choose another name", path.display()),
        )
    })
}

/// Why the process that made a socket last modified at `made` cannot be the one now
/// holding `pid`, if that is sure: no such process, a process started after the socket
/// was made (the PID was reused), or one that maps no `libcudart` (cudaw's runtime is
/// one, under any major). `None`: it may still be the socket's process (alive, but not
/// answering), so the socket is kept.
pub fn not_the_socket_process(pid: u32, made: std::time::SystemTime) -> Option<String> {
    if !process_exists(pid) {
        return Some(format!("no process {pid}"));
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    if matches!(state, Some("Z" | "X")) {
        return Some(format!("process {pid} has exited (not yet reaped)"));
    }
    if let Some(started) = process_start(pid) {
        // Start times are known to about a second (boot time in whole seconds).
        if started > made + Duration::from_secs(2) {
            return Some(format!(
                "PID {pid} now belongs to a process started after the socket was made"
            ));
        }
    }
    if let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) {
        if !maps.is_empty() && !maps.contains("libcudart") {
            return Some(format!("process {pid} does not run cudaw's runtime"));
        }
    }
    None
}

/// When process `pid` started: `/proc/PID/stat`'s start time (clock ticks after boot,
/// the tick rate from this process's auxiliary vector) after `/proc/stat`'s boot time.
fn process_start(pid: u32) -> Option<std::time::SystemTime> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    // Field 22 of the line is the 20th after the name.
    let ticks: u64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    let boot: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let hz = clock_ticks()?;
    let nanos = u128::from(ticks) * 1_000_000_000 / u128::from(hz);
    Some(
        std::time::UNIX_EPOCH
            + Duration::from_secs(boot)
            + Duration::from_nanos(u64::try_from(nanos).ok()?),
    )
}

/// The kernel's clock tick rate (`AT_CLKTCK` in `/proc/self/auxv`).
fn clock_ticks() -> Option<u64> {
    const AT_CLKTCK: u64 = 17;
    let auxv = std::fs::read("/proc/self/auxv").ok()?;
    auxv.chunks_exact(16).find_map(|pair| {
        let key = u64::from_ne_bytes(pair[..8].try_into().ok()?);
        let value = u64::from_ne_bytes(pair[8..].try_into().ok()?);
        (key == AT_CLKTCK && value > 0).then_some(value)
    })
}

/// Removes `pid`'s socket from the run folder `dir` when it is surely stale
/// ([`not_the_socket_process`]) and it is safe to: `dir` is a real folder (not a link)
/// owned by us, and the entry is a socket (not followed if a link) owned by us.
/// `Ok(Some(why))` when removed, `Ok(None)` when kept (it may be live), `Err` when it
/// may not be removed.
pub fn remove_stale_socket(dir: &Path, pid: u32) -> Result<Option<String>, String> {
    use std::os::unix::fs::FileTypeExt;
    let me = my_uid().map_err(|e| e.to_string())?;
    let d = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !d.is_dir() || d.uid() != me {
        return Err(format!(
            "the run folder {} is not a folder of yours",
            dir.display()
        ));
    }
    let path = cudaw_control::socket_path(dir, pid);
    let m = std::fs::symlink_metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !m.file_type().is_socket() || m.uid() != me {
        return Err(format!("{} is not a socket of yours", path.display()));
    }
    let made = m
        .modified()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let Some(why) = not_the_socket_process(pid, made) else {
        return Ok(None);
    };
    // The lock file of a `--release` sequence goes with it (see `sequence_lock`).
    let _ = std::fs::remove_file(dir.join(format!("{pid}.release-lock")));
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(Some(why)),
        // Removed meanwhile (by the process's successor, or another cudaw-ckpt).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Some(why)),
        Err(e) => Err(format!("removing {}: {e}", path.display())),
    }
}

/// A file error as a failure: `Permission` when the system said so, `Io` otherwise.
pub fn file_failure(what: &str, path: &Path, e: cudaw_files::FileError) -> anyhow::Error {
    let kind = if e.io_kind() == Some(std::io::ErrorKind::PermissionDenied) {
        Kind::Permission
    } else {
        Kind::Io
    };
    match e {
        cudaw_files::FileError::Io { .. } if kind == Kind::Permission => fail(
            kind,
            format!(
                "cannot {what} {}: permission denied (a process under cudaw reads and writes files only as you could)",
                path.display()
            ),
        ),
        cudaw_files::FileError::Io { source, .. } => {
            fail(kind, format!("cannot {what} {}: {source}", path.display()))
        }
        e => fail(kind, format!("cannot {what}: {e}")),
    }
}

/// Sends `req` to `pid` with `fds` (one per handle of a reimport) and reads its one reply
/// line with the descriptors that come with it (a reexport's).
pub fn request_fds(
    pid: u32,
    req: &Request,
    fds: &[BorrowedFd<'_>],
) -> anyhow::Result<(Reply, Vec<std::os::fd::OwnedFd>)> {
    let stream = connect(pid)?;
    let exchange = || -> anyhow::Result<(Reply, Vec<std::os::fd::OwnedFd>)> {
        stream.set_read_timeout(Some(Duration::from_secs(600)))?;
        stream.set_write_timeout(Some(Duration::from_secs(10)))?;
        let line = req.to_line();
        if fds.is_empty() {
            std::io::Write::write_all(&mut &stream, line.as_bytes())?;
        } else {
            cudaw_control::send_line_with_fds(&stream, line.as_bytes(), fds)?;
        }
        let (text, got) = cudaw_control::recv_line_with_fds(&stream, 1 << 24)
            .map_err(|e| fail(Kind::Connection, format!("reading the reply: {e}")))?;
        if text.is_empty() {
            return Err(fail(
                Kind::Connection,
                "the process closed the connection without replying",
            ));
        }
        let reply = Reply::parse(&text).map_err(|e| fail(Kind::Connection, e))?;
        Ok((succeeded(reply)?, got))
    };
    exchange().map_err(|e| {
        let kind = kind_of(&e);
        fail(kind, format!("process {pid}: {e:#}"))
    })
}

/// An exclusive lock held for the driver-and-cudaw sequence of a `--release` pause or of a
/// released process's resume (`PID.release-lock` in the process's run folder, next to its
/// socket): two `cudaw-ckpt` at once cannot interleave the driver's lock and checkpoint
/// with a resume. `None` where the file cannot be made (another user's folder): no lock.
pub fn sequence_lock(pid: u32) -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let dirs = run_dirs().ok()?;
    let dir = dirs
        .iter()
        .find(|d| cudaw_control::socket_path(d, pid).exists())?;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(dir.join(format!("{pid}.release-lock")))
        .ok()?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).ok()?;
    Some(f)
}

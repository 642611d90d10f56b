//! `cudaw-ckpt`'s side of the control socket: finding and connecting to a process's
//! socket, sending one request, reading progress lines and the reply; and the failures
//! `cudaw-ckpt` reports, each with a kind scripts can read and an exit status.

use std::io::{BufRead, BufReader};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cudaw_control::{ErrorKind, Line, Progress, Reply, Request};

/// What went wrong, for `--json` (`"kind"`) and the exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// No process has that PID.
    NoProcess,
    /// The process does not serve a cudaw control socket.
    NotUnderCudaw,
    /// Another user's process, or a file we may not read.
    Permission,
    /// The socket misbehaved (closed early, malformed reply, timeout).
    Connection,
    /// A file could not be read, created or written.
    Io,
    /// Not a readable cudaw image: another format, another version, truncated, corrupt.
    BadImage,
    /// A sound image of another process (table, addressing, producer).
    Mismatch,
    /// The request was malformed or refused by the process.
    Request,
    /// The process could not do it (device failure, memory on several devices).
    Failed,
    /// The process holds memory the request cannot cover (driver-level handles in a dump).
    Unsupported,
    /// A pause gave up at the process's deadline (`CUDAW_PAUSE_TIMEOUT`); it runs on.
    Timeout,
}

impl Kind {
    /// The `"kind"` of `--json` errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::NoProcess => "no_process",
            Kind::NotUnderCudaw => "not_under_cudaw",
            Kind::Permission => "permission",
            Kind::Connection => "connection",
            Kind::Io => "io",
            Kind::BadImage => "bad_image",
            Kind::Mismatch => "mismatch",
            Kind::Request => "request",
            Kind::Failed => "failed",
            Kind::Unsupported => "unsupported",
            Kind::Timeout => "timeout",
        }
    }

    /// The exit status: 3 when the image is at fault, 1 otherwise.
    pub fn exit_code(self) -> u8 {
        match self {
            Kind::BadImage | Kind::Mismatch => 3,
            _ => 1,
        }
    }

    fn of_reply(kind: Option<ErrorKind>, msg: &str) -> Kind {
        match kind {
            Some(ErrorKind::BadImage) => Kind::BadImage,
            Some(ErrorKind::Mismatch) => Kind::Mismatch,
            Some(ErrorKind::Io) => Kind::Io,
            Some(ErrorKind::Failed) => Kind::Failed,
            Some(ErrorKind::Unsupported) => Kind::Unsupported,
            Some(ErrorKind::Timeout) => Kind::Timeout,
            _ if msg.starts_with("permission denied") => Kind::Permission,
            Some(ErrorKind::Request) => Kind::Request,
            None => Kind::Failed,
        }
    }
}

/// A failure with its kind.
#[derive(Debug)]
pub struct Failure {
    /// Its kind.
    pub kind: Kind,
    /// The message.
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// A failure of `kind`.
pub fn fail(kind: Kind, message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Failure {
        kind,
        message: message.into(),
    })
}

/// The kind of an error (`Failed` unless it carries one).
pub fn kind_of(e: &anyhow::Error) -> Kind {
    e.chain()
        .find_map(|c| c.downcast_ref::<Failure>())
        .map_or(Kind::Failed, |f| f.kind)
}

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
        return Err(fail(Kind::NoProcess, format!("no process with PID {pid}")));
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
    let limit = match req {
        Request::Status {} => Duration::from_secs(10),
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
                return Err(fail(Kind::Connection, format!("reading the reply: {e}")));
            }
            return Err(fail(
                Kind::Connection,
                "the process closed the connection without replying",
            ));
        }
        match Line::parse(&line).map_err(|e| fail(Kind::Connection, e))? {
            Line::Progress(p) => on_progress(p),
            Line::Reply(reply) => {
                if !reply.ok {
                    let msg = reply
                        .error
                        .as_deref()
                        .unwrap_or("request failed (no reason given)");
                    return Err(fail(Kind::of_reply(reply.kind, msg), msg));
                }
                return Ok(*reply);
            }
        }
    }
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

//! `cudaw-ckpt`'s side of the control socket: finding and connecting to a process's
//! socket, sending one request, reading progress lines and the reply (its failures are
//! [`crate::failure`]'s kinds).

use std::io::{BufRead, BufReader, Write};
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

/// The run folder, as the processes under cudaw see it.
pub fn run_dir() -> anyhow::Result<PathBuf> {
    Ok(cudaw_control::run_dir_from_env(my_uid()?))
}

/// Connects to `pid`'s socket, or explains why not.
pub fn connect(pid: u32) -> anyhow::Result<UnixStream> {
    let dir = run_dir()?;
    let path = cudaw_control::socket_path(&dir, pid);
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let owner = std::fs::metadata(&proc_dir).ok().map(|m| m.uid());
    let Some(owner) = owner else {
        return Err(fail(Kind::NoProcess, format!("no process with PID {pid}")));
    };
    match UnixStream::connect(&path) {
        Ok(s) => Ok(s),
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
    let stream = connect(pid)?;
    exchange(stream, req, on_progress).map_err(|e| {
        let kind = kind_of(&e);
        fail(kind, format!("process {pid}: {e}"))
    })
}

/// Sends `req` on `stream` and reads until the reply.
pub fn exchange(
    mut stream: UnixStream,
    req: &Request,
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
    let sent = stream.write_all(req.to_line().as_bytes());
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

//! The daemon's side of the processes' control sockets (the protocol of `cudaw-control`):
//! one request, one reply line, with a time limit that suits the request.

use cudaw_control::{Line, Reply, Request, Status};
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// No process answers: the socket is gone or refuses connections, it is served by
    /// another process, or the process has exited. The process has left.
    Gone(String),
    /// The process answered with an error, or too late, or not in the protocol.
    Failed(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Gone(m) | Failure::Failed(m) => f.write_str(m),
        }
    }
}

/// How long to wait for the reply to `req`: a status is answered at once; a hold within
/// its window; a pause or resume moves a process's memory (minutes for many GiB over a
/// slow link).
pub fn limit(req: &Request) -> Duration {
    match req {
        Request::Status {} => Duration::from_secs(5),
        Request::Hold { window_ms, .. } => {
            Duration::from_millis(*window_ms) + Duration::from_secs(10)
        }
        Request::Release {} => Duration::from_secs(10),
        _ => Duration::from_secs(600),
    }
}

/// Sends `req` to process `pid` on `socket` and returns its reply (an error unless ok).
/// The socket must be served by `pid` itself (`SO_PEERCRED`): a socket file someone else
/// put in a run folder is not taken for the process.
pub fn request(socket: &Path, pid: u32, req: &Request) -> Result<Reply, Failure> {
    let stream = UnixStream::connect(socket)
        .map_err(|e| Failure::Gone(format!("connecting to {}: {e}", socket.display())))?;
    let peer = rustix::net::sockopt::socket_peercred(&stream)
        .map_err(|e| Failure::Gone(format!("{}: SO_PEERCRED: {e}", socket.display())))?;
    let served_by = peer.pid.as_raw_nonzero().get() as u32;
    if served_by != pid {
        return Err(Failure::Gone(format!(
            "{} is served by process {served_by}, not by process {pid}",
            socket.display()
        )));
    }
    let limit = limit(req);
    let io = |e: std::io::Error| Failure::Gone(format!("{}: {e}", socket.display()));
    stream.set_read_timeout(Some(limit)).map_err(io)?;
    stream
        .set_write_timeout(Some(Duration::from_secs(5)))
        .map_err(io)?;
    // A server that refuses us replies without reading the request: read its reply even
    // when sending failed.
    let sent = cudaw_control::send_request(&stream, req, None);
    let mut lines = BufReader::new(stream);
    loop {
        let mut line = String::new();
        let read = lines.read_line(&mut line);
        if line.is_empty() {
            return Err(match (sent, read) {
                (Err(e), _) => Failure::Gone(format!("sending {}: {e}", req.name())),
                (_, Err(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    Failure::Failed(format!(
                        "no reply to {} within {:.0} s (the process is stopped, or its control thread is stuck)",
                        req.name(),
                        limit.as_secs_f64()
                    ))
                }
                (_, Err(e)) => Failure::Gone(format!("reading the reply to {}: {e}", req.name())),
                (_, Ok(_)) => Failure::Gone(format!(
                    "the process closed the connection without replying to {}",
                    req.name()
                )),
            });
        }
        match Line::parse(&line).map_err(Failure::Failed)? {
            Line::Progress(_) => continue,
            Line::Reply(reply) if reply.ok => return Ok(*reply),
            Line::Reply(reply) => {
                return Err(Failure::Failed(format!(
                    "{} refused: {}",
                    req.name(),
                    reply.error.as_deref().unwrap_or("no reason given")
                )))
            }
        }
    }
}

/// Process `pid`'s status.
pub fn status(socket: &Path, pid: u32) -> Result<Status, Failure> {
    request(socket, pid, &Request::Status {})?
        .status
        .ok_or_else(|| Failure::Failed("the reply to status carries no status".into()))
}

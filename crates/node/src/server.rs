//! What the daemon serves: the status socket (`cudaw node status`) and the Prometheus
//! endpoint (`--metrics`), both from the latest [`NodeReport`] the daemon published.
//!
//! The status socket is a Unix stream socket: a client sends one request line
//! (`{"cmd":"status"}`) and reads one JSON line, the [`NodeReport`]; then the daemon
//! closes the connection. Its default place ([`default_socket`]): `$CUDAW_NODE_SOCKET`,
//! else `/run/cudaw/node.sock` as root (mode 0666: every user may read the report; it
//! changes nothing), else `$XDG_RUNTIME_DIR/cudaw/node.sock` or `/tmp/cudaw-UID/node.sock`
//! (0600, in the user's private run folder).

use crate::report::{self, NodeReport};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The report the servers answer with, published by the daemon's loop.
pub type Shared = Arc<Mutex<NodeReport>>;

/// The status socket's default path for user `uid` (see the module's doc).
pub fn default_socket(get: impl Fn(&str) -> Option<String>, uid: u32) -> PathBuf {
    if let Some(p) = get("CUDAW_NODE_SOCKET").filter(|v| !v.is_empty()) {
        return PathBuf::from(p);
    }
    if uid == 0 {
        return PathBuf::from("/run/cudaw/node.sock");
    }
    if let Some(x) = get("XDG_RUNTIME_DIR").filter(|v| v.starts_with('/')) {
        return Path::new(&x).join("cudaw/node.sock");
    }
    PathBuf::from(format!("{}/cudaw-{uid}/node.sock", cudaw_control::TMP))
}

/// The status socket, bound.
pub struct StatusSocket {
    listener: UnixListener,
    path: PathBuf,
}

impl StatusSocket {
    /// Binds `path` (its folder made if missing: 0755 for root, else private), refusing
    /// when another daemon answers there; a socket left by a dead one is replaced.
    pub fn bind(path: &Path, uid: u32) -> Result<StatusSocket, String> {
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if !dir.exists() {
            if uid == 0 {
                std::fs::create_dir_all(dir)
                    .and_then(|()| {
                        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
                    })
                    .map_err(|e| format!("creating {}: {e}", dir.display()))?;
            } else {
                cudaw_files::private_dir(dir, uid, true)
                    .map_err(|e| format!("the status socket's folder: {e}"))?;
            }
        }
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => match UnixStream::connect(path) {
                Ok(s) => {
                    let who = rustix::net::sockopt::socket_peercred(&s)
                        .map(|c| format!(" (PID {})", c.pid.as_raw_nonzero()))
                        .unwrap_or_default();
                    return Err(format!(
                        "another cudaw node{who} serves {} already; stop it first, or give this one another --socket",
                        path.display()
                    ));
                }
                Err(_) => std::fs::remove_file(path)
                    .map_err(|e| format!("removing the stale socket {}: {e}", path.display()))?,
            },
            Ok(_) => {
                return Err(format!(
                    "{} exists and is not a socket; not replacing it",
                    path.display()
                ))
            }
            Err(_) => {}
        }
        let listener =
            UnixListener::bind(path).map_err(|e| format!("binding {}: {e}", path.display()))?;
        let mode = if uid == 0 { 0o666 } else { 0o600 };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("chmod {}: {e}", path.display()))?;
        Ok(StatusSocket {
            listener,
            path: path.to_path_buf(),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Answers every client with `report` on a thread of its own, until the process ends.
    pub fn serve(self, report: Shared) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("node-status".into())
            .spawn(move || {
                for conn in self.listener.incoming() {
                    let Ok(conn) = conn else { continue };
                    let r = Arc::clone(&report);
                    // One thread per client: a slow one stalls no other.
                    let _ = std::thread::Builder::new()
                        .name("node-status-client".into())
                        .spawn(move || answer(conn, &r));
                }
            })
    }
}

/// Reads the client's request line and writes the report.
fn answer(conn: UnixStream, report: &Shared) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(2)));
    let mut line = String::new();
    let _ = BufReader::new(&conn).take(4096).read_line(&mut line);
    let reply = match serde_json::from_str::<serde_json::Value>(line.trim()) {
        Ok(v) if v.get("cmd").and_then(|c| c.as_str()) == Some("status") => {
            let r = report.lock().map(|r| r.clone()).unwrap_or_default();
            serde_json::to_string(&r).unwrap_or_default()
        }
        _ => serde_json::json!({
            "error": format!("malformed request {:?}: expected {{\"cmd\":\"status\"}}", line.trim())
        })
        .to_string(),
    };
    let mut w = &conn;
    let _ = w
        .write_all(reply.as_bytes())
        .and_then(|()| w.write_all(b"\n"));
}

use std::io::Read;

/// Asks the daemon serving `path` for its report.
pub fn query(path: &Path) -> Result<NodeReport, String> {
    let conn = UnixStream::connect(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => format!(
            "no cudaw node daemon serves {} ({e}): start one with `cudaw node --config FILE`, or name its socket with --socket or CUDAW_NODE_SOCKET",
            path.display()
        ),
        std::io::ErrorKind::PermissionDenied => format!(
            "permission denied on {}: the daemon belongs to another user",
            path.display()
        ),
        _ => format!("connecting to {}: {e}", path.display()),
    })?;
    let io = |e: std::io::Error| format!("{}: {e}", path.display());
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(io)?;
    conn.set_write_timeout(Some(Duration::from_secs(10)))
        .map_err(io)?;
    (&conn).write_all(b"{\"cmd\":\"status\"}\n").map_err(io)?;
    let mut line = String::new();
    BufReader::new(&conn)
        .read_line(&mut line)
        .map_err(|e| format!("reading the daemon's reply on {}: {e}", path.display()))?;
    if line.trim().is_empty() {
        return Err(format!(
            "the daemon on {} closed the connection without replying",
            path.display()
        ));
    }
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
        if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
            return Err(format!("the daemon on {} refused: {e}", path.display()));
        }
    }
    serde_json::from_str(&line).map_err(|e| {
        format!(
            "the daemon on {} replied {:?}: {e}",
            path.display(),
            line.trim()
        )
    })
}

/// Serves `report` as Prometheus text on `GET /metrics` at `addr` (`127.0.0.1:9400`), on
/// a thread of its own; the error says why it cannot listen there.
pub fn serve_metrics(addr: &str, report: Shared) -> Result<std::net::SocketAddr, String> {
    let server = tiny_http::Server::http(addr)
        .map_err(|e| format!("cannot serve metrics on {addr}: {e}"))?;
    let bound = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| format!("cannot serve metrics on {addr}: not an IP address"))?;
    std::thread::Builder::new()
        .name("node-metrics".into())
        .spawn(move || {
            for req in server.incoming_requests() {
                let path = req.url().split('?').next().unwrap_or("");
                let resp = if path == "/metrics" && *req.method() == tiny_http::Method::Get {
                    let text = report
                        .lock()
                        .map(|r| report::prometheus(&r))
                        .unwrap_or_default();
                    let header = tiny_http::Header::from_bytes(
                        &b"Content-Type"[..],
                        &b"text/plain; version=0.0.4; charset=utf-8"[..],
                    )
                    .ok();
                    let mut r = tiny_http::Response::from_string(text);
                    if let Some(h) = header {
                        r = r.with_header(h);
                    }
                    r
                } else {
                    tiny_http::Response::from_string(
                        "cudaw node: the metrics are at GET /metrics\n",
                    )
                    .with_status_code(404)
                };
                let _ = req.respond(resp);
            }
        })
        .map_err(|e| format!("starting the metrics thread: {e}"))?;
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn the_default_socket() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            default_socket(
                env(&[("CUDAW_NODE_SOCKET", "/s"), ("XDG_RUNTIME_DIR", "/x")]),
                0
            ),
            PathBuf::from("/s")
        );
        assert_eq!(
            default_socket(env(&[("XDG_RUNTIME_DIR", "/x")]), 0),
            PathBuf::from("/run/cudaw/node.sock")
        );
        assert_eq!(
            default_socket(env(&[("XDG_RUNTIME_DIR", "/x")]), 7),
            PathBuf::from("/x/cudaw/node.sock")
        );
        assert_eq!(
            default_socket(env(&[]), 7),
            PathBuf::from("/tmp/cudaw-7/node.sock")
        );
    }

    #[test]
    fn the_status_socket_answers_and_a_second_daemon_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("sub/node.sock");
        let uid = cudaw_files::euid();
        let shared: Shared = Arc::new(Mutex::new(crate::report::tests::sample()));
        let s = StatusSocket::bind(&path, uid).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, if uid == 0 { 0o666 } else { 0o600 });
        s.serve(Arc::clone(&shared)).unwrap();
        assert_eq!(query(&path).unwrap(), crate::report::tests::sample());
        let e = StatusSocket::bind(&path, uid).err().unwrap();
        assert!(e.contains("another cudaw node (PID "), "{e}");
        assert!(
            e.contains("serves") && e.contains("node.sock already"),
            "{e}"
        );
        // A client that speaks nonsense is told so.
        let mut c = UnixStream::connect(&path).unwrap();
        c.write_all(b"hello\n").unwrap();
        let mut got = String::new();
        c.read_to_string(&mut got).unwrap();
        assert!(got.contains("malformed request \\\"hello\\\""), "{got}");
    }

    #[test]
    fn a_stale_socket_is_replaced_and_a_missing_daemon_explained() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("node.sock");
        drop(UnixListener::bind(&path).unwrap());
        let e = query(&path).unwrap_err();
        assert!(
            e.starts_with(&format!("no cudaw node daemon serves {}", path.display())),
            "{e}"
        );
        assert!(StatusSocket::bind(&path, cudaw_files::euid()).is_ok());
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "").unwrap();
        let e = StatusSocket::bind(&path, cudaw_files::euid())
            .err()
            .unwrap();
        assert!(
            e.ends_with("exists and is not a socket; not replacing it"),
            "{e}"
        );
    }

    #[test]
    fn metrics_over_http() {
        let shared: Shared = Arc::new(Mutex::new(crate::report::tests::sample()));
        let addr = serve_metrics("127.0.0.1:0", shared).unwrap();
        let get = |path: &str| {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
            let mut r = String::new();
            s.read_to_string(&mut r).unwrap();
            r
        };
        let r = get("/metrics");
        assert!(
            r.starts_with("HTTP/1.0 200") || r.starts_with("HTTP/1.1 200"),
            "{r}"
        );
        assert!(r.contains("text/plain; version=0.0.4"), "{r}");
        assert!(
            r.contains("cudaw_node_gpu_share{job=\"train-a\",gpu=\"GPU-5a1b\"} 0.24"),
            "{r}"
        );
        let r = get("/");
        assert!(r.contains(" 404 "), "{r}");
        let e = serve_metrics("127.0.0.1:notaport", Arc::default()).unwrap_err();
        assert!(
            e.starts_with("cannot serve metrics on 127.0.0.1:notaport"),
            "{e}"
        );
    }
}

//! The control socket's protocol, one definition for both sides: the drop-in runtime
//! (`cudart-shim`, which serves `$CUDAW_RUN_DIR/PID.sock`) and `cudaw-ckpt` (which connects).
//!
//! One request line of JSON → one reply line of JSON, then the server closes the
//! connection:
//!
//! ```text
//! → {"cmd":"pause"}
//! ← {"ok":true,"pause":{"allocations":5,"bytes":327680,"ms":1.2,"changed":true}}
//! → {"cmd":"status"}
//! ← {"ok":true,"status":{"pid":42,"state":"paused","addressing":"mapped","devices":[...]}}
//! → nonsense
//! ← {"ok":false,"error":"malformed request ..."}
//! ```
//!
//! Pure: no I/O beyond reading the variables it is given.

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The longest request line the server reads, in bytes.
pub const MAX_REQUEST: usize = 4096;

/// One request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Pause: evict every allocation to host memory and hold CUDA calls.
    Pause,
    /// Resume: restore every allocation at its address and let calls through.
    Resume,
    /// Report the process's state and memory.
    Status,
}

impl Request {
    /// Parses one request line.
    pub fn parse(line: &str) -> Result<Request, String> {
        serde_json::from_str(line.trim()).map_err(|e| {
            format!(
                "malformed request {:?}: {e} (expected one JSON line such as {{\"cmd\":\"pause\"}}, {{\"cmd\":\"resume\"}} or {{\"cmd\":\"status\"}})",
                truncate(line.trim(), 80)
            )
        })
    }

    /// The request as one line, newline included.
    pub fn to_line(self) -> String {
        let mut s = serde_json::to_string(&self).unwrap_or_default();
        s.push('\n');
        s
    }
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Whether the process runs or is paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// CUDA calls go through.
    Running,
    /// Memory evicted, CUDA calls held.
    Paused,
}

impl State {
    /// `running` or `paused`.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Paused => "paused",
        }
    }
}

/// What a pause or resume moved.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Moved {
    /// Allocations evicted (pause) or restored (resume).
    pub allocations: u64,
    /// Bytes evicted or restored.
    pub bytes: u64,
    /// Milliseconds the request took.
    pub ms: f64,
    /// False when the request changed nothing (a pause while paused, a resume while
    /// running).
    pub changed: bool,
}

/// One managed device's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStatus {
    /// The CUDA device ordinal.
    pub ordinal: i32,
    /// Live allocations.
    pub allocations: u64,
    /// Requested bytes of resident allocations.
    pub resident: u64,
    /// Requested bytes of evicted allocations.
    pub evicted: u64,
    /// Physical bytes mapped on the device now.
    pub mapped: u64,
    /// The memory limit, if any (`CUDAW_MEM_LIMIT`).
    pub limit: Option<u64>,
}

/// A process's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The process.
    pub pid: u32,
    /// Running or paused.
    pub state: State,
    /// `mapped` or `translated`.
    pub addressing: String,
    /// Every device cudaw manages memory on.
    pub devices: Vec<DeviceStatus>,
}

/// One reply.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Reply {
    /// Whether the request was carried out.
    pub ok: bool,
    /// Why not, when not ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A pause's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<Moved>,
    /// A resume's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Moved>,
    /// A status request's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
}

impl Reply {
    /// A failure reply.
    pub fn error(msg: impl Into<String>) -> Reply {
        Reply {
            ok: false,
            error: Some(msg.into()),
            ..Reply::default()
        }
    }

    /// Parses one reply line.
    pub fn parse(line: &str) -> Result<Reply, String> {
        serde_json::from_str(line.trim()).map_err(|e| format!("malformed reply {line:?}: {e}"))
    }

    /// The reply as one line, newline included.
    pub fn to_line(&self) -> String {
        let mut s = serde_json::to_string(self)
            .unwrap_or_else(|_| r#"{"ok":false,"error":"reply not encodable"}"#.to_owned());
        s.push('\n');
        s
    }
}

/// The run folder: `CUDAW_RUN_DIR`, else `$XDG_RUNTIME_DIR/cudaw`, else `/tmp/cudaw-UID`.
pub fn run_dir(get: impl Fn(&str) -> Option<String>, uid: u32) -> PathBuf {
    if let Some(d) = get("CUDAW_RUN_DIR").filter(|v| !v.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = get("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        return Path::new(&d).join("cudaw");
    }
    PathBuf::from(format!("/tmp/cudaw-{uid}"))
}

/// The run folder from this process's environment.
pub fn run_dir_from_env(uid: u32) -> PathBuf {
    run_dir(|k| std::env::var(k).ok(), uid)
}

/// Process `pid`'s socket in `dir`.
pub fn socket_path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("{pid}.sock"))
}

/// The PID a socket's file name names (`PID.sock`), if it is one.
pub fn pid_of_socket(name: &str) -> Option<u32> {
    let digits = name.strip_suffix(".sock")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        for r in [Request::Pause, Request::Resume, Request::Status] {
            assert_eq!(Request::parse(&r.to_line()), Ok(r));
        }
        assert_eq!(Request::Pause.to_line(), "{\"cmd\":\"pause\"}\n");
    }

    #[test]
    fn malformed_requests_are_errors() {
        for bad in [
            "",
            "pause",
            "{}",
            "{\"cmd\":\"explode\"}",
            "{\"cmd\":1}",
            "[1]",
        ] {
            let e = Request::parse(bad).unwrap_err();
            assert!(e.contains("malformed request"), "{bad}: {e}");
        }
    }

    #[test]
    fn replies_round_trip() {
        let r = Reply {
            ok: true,
            status: Some(Status {
                pid: 7,
                state: State::Paused,
                addressing: "mapped".into(),
                devices: vec![DeviceStatus {
                    ordinal: 0,
                    allocations: 5,
                    resident: 0,
                    evicted: 327680,
                    mapped: 0,
                    limit: None,
                }],
            }),
            ..Reply::default()
        };
        assert_eq!(Reply::parse(&r.to_line()), Ok(r));
        let e = Reply::error("no");
        assert_eq!(e.to_line(), "{\"ok\":false,\"error\":\"no\"}\n");
    }

    #[test]
    fn run_dir_order() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            run_dir(
                env(&[("CUDAW_RUN_DIR", "/r"), ("XDG_RUNTIME_DIR", "/x")]),
                5
            ),
            PathBuf::from("/r")
        );
        assert_eq!(
            run_dir(env(&[("XDG_RUNTIME_DIR", "/x")]), 5),
            PathBuf::from("/x/cudaw")
        );
        assert_eq!(run_dir(env(&[]), 5), PathBuf::from("/tmp/cudaw-5"));
    }

    #[test]
    fn socket_names() {
        assert_eq!(pid_of_socket("123.sock"), Some(123));
        assert_eq!(pid_of_socket(".sock"), None);
        assert_eq!(pid_of_socket("12a.sock"), None);
        assert_eq!(pid_of_socket("123"), None);
    }
}

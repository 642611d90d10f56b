//! `cudaw-ckpt`: pause, resume and inspect processes running under cudaw, through their
//! control sockets (`$CUDAW_RUN_DIR/PID.sock`).

#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand};
use cudaw_control::{Moved, Reply, Request, Status};

/// Pause, resume and inspect CUDA programs running under cudaw.
///
/// A program started with `cudaw run` (or with cudaw's libcudart.so preloaded) serves a
/// control socket at $CUDAW_RUN_DIR/PID.sock (default $XDG_RUNTIME_DIR/cudaw, else
/// /tmp/cudaw-UID). Only the process's owner, or root, may use it.
///
/// Pausing waits for cudaw's calls in flight, synchronises the device and copies every
/// allocation to host memory, handing the device memory back; the program's CUDA calls
/// wait. Resuming puts every allocation back at the same address and lets the calls
/// through. `kill -USR1 PID` / `kill -USR2 PID` do the same without a reply.
///
/// Examples:
///
///   cudaw-ckpt status                  every process under cudaw on this machine
///
///   cudaw-ckpt pause 4242              pause; prints what was evicted and how long it took
///
///   cudaw-ckpt status 4242 --json      one process, as JSON
///
///   cudaw-ckpt resume 4242
///
/// Exit status: 0 on success, 1 on any failure (no such process, not under cudaw,
/// permission, the request failed), 2 for a usage error.
#[derive(Debug, Parser)]
#[command(name = "cudaw-ckpt", version, about, verbatim_doc_comment)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Pause a process: evict its device memory to host memory and hold its CUDA calls.
    /// Waits until done; prints the allocations and bytes evicted and the time taken.
    Pause {
        /// The process ID.
        pid: u32,
    },
    /// Resume a paused process: restore its device memory at the same addresses.
    /// Waits until done; prints the allocations and bytes restored and the time taken.
    Resume {
        /// The process ID.
        pid: u32,
    },
    /// Show a process's state (running or paused), addressing mode and memory per device;
    /// without a PID, every process under cudaw on this machine (dead sockets are
    /// reported as stale and skipped).
    Status {
        /// The process ID (default: all).
        pid: Option<u32>,
        /// Print JSON: the status object for one PID; for all, {"processes": [...],
        /// "stale": [PIDs]}.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Pause { pid } => pause_or_resume(pid, Request::Pause),
        Command::Resume { pid } => pause_or_resume(pid, Request::Resume),
        Command::Status {
            pid: Some(pid),
            json,
        } => status_one(pid, json),
        Command::Status { pid: None, json } => status_all(json),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cudaw-ckpt: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Our effective uid (the owner of /proc/self).
fn my_uid() -> Result<u32> {
    Ok(std::fs::metadata("/proc/self")
        .context("reading /proc/self")?
        .uid())
}

fn run_dir() -> Result<PathBuf> {
    Ok(cudaw_control::run_dir_from_env(my_uid()?))
}

/// Connects to `pid`'s socket, or explains why not.
fn connect(pid: u32) -> Result<UnixStream> {
    let dir = run_dir()?;
    let path = cudaw_control::socket_path(&dir, pid);
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let owner = std::fs::metadata(&proc_dir).ok().map(|m| m.uid());
    let Some(owner) = owner else {
        bail!("no process with PID {pid}");
    };
    match UnixStream::connect(&path) {
        Ok(s) => Ok(s),
        Err(e) => {
            let me = my_uid()?;
            match e.kind() {
                std::io::ErrorKind::PermissionDenied => bail!(
                    "permission denied on {}: process {pid} belongs to uid {owner}; only its owner or root may control it",
                    path.display()
                ),
                std::io::ErrorKind::NotFound if owner != me && me != 0 => bail!(
                    "process {pid} belongs to another user (uid {owner}); only its owner or root may control it (its socket is not in your run folder {})",
                    dir.display()
                ),
                std::io::ErrorKind::NotFound => bail!(
                    "process {pid} is not running under cudaw (no control socket {}; start it with `cudaw run`, and check CUDAW_RUN_DIR matches)",
                    path.display()
                ),
                std::io::ErrorKind::ConnectionRefused => bail!(
                    "process {pid} is not serving its control socket {} (a stale socket: the PID now belongs to another process, or cudaw's control thread has stopped)",
                    path.display()
                ),
                _ => Err(anyhow!(e).context(format!("connecting to {}", path.display()))),
            }
        }
    }
}

/// Sends one request to `pid` and returns its reply (an error if not ok).
fn request(pid: u32, req: Request) -> Result<Reply> {
    let stream = connect(pid)?;
    exchange(stream, req).with_context(|| format!("process {pid}"))
}

fn exchange(mut stream: UnixStream, req: Request) -> Result<Reply> {
    // Pausing a large process takes a while; status and a stalled server do not.
    let limit = match req {
        Request::Status => Duration::from_secs(10),
        _ => Duration::from_secs(3600),
    };
    stream.set_read_timeout(Some(limit))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    // A server that refuses us (another user's process) replies without reading the
    // request: read its reply even when sending failed.
    let sent = stream.write_all(req.to_line().as_bytes());
    let mut line = String::new();
    let read = BufReader::new(stream).read_line(&mut line);
    if line.is_empty() {
        sent.context("sending the request")?;
        read.context("reading the reply")?;
        bail!("the process closed the connection without replying");
    }
    let reply = Reply::parse(&line).map_err(|e| anyhow!(e))?;
    if !reply.ok {
        bail!(
            "{}",
            reply
                .error
                .as_deref()
                .unwrap_or("request failed (no reason given)")
        );
    }
    Ok(reply)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

fn pause_or_resume(pid: u32, req: Request) -> Result<()> {
    let reply = request(pid, req)?;
    let (moved, verb, already): (Option<Moved>, &str, &str) = match req {
        Request::Pause => (reply.pause, "paused", "already paused"),
        _ => (reply.resume, "resumed", "not paused; nothing to resume"),
    };
    let m = moved.ok_or_else(|| anyhow!("the reply carries no result: {reply:?}"))?;
    if m.changed {
        let what = if req == Request::Pause {
            "evicted"
        } else {
            "restored"
        };
        println!(
            "{pid}: {verb}: {} allocations, {} bytes ({}) {what} in {:.1} ms",
            m.allocations,
            m.bytes,
            mib(m.bytes),
            m.ms
        );
    } else {
        println!("{pid}: {already}");
    }
    Ok(())
}

fn print_status(s: &Status) {
    println!(
        "{}: {} ({} addressing)",
        s.pid,
        s.state.as_str(),
        s.addressing
    );
    if s.devices.is_empty() {
        println!("  no device memory managed yet");
    }
    for d in &s.devices {
        let limit = d.limit.map_or_else(|| "none".to_owned(), mib);
        println!(
            "  device {}: {} allocations, {} resident, {} evicted, {} mapped, limit {limit}",
            d.ordinal,
            d.allocations,
            mib(d.resident),
            mib(d.evicted),
            mib(d.mapped)
        );
    }
}

fn status_one(pid: u32, json: bool) -> Result<()> {
    let reply = request(pid, Request::Status)?;
    let s = reply
        .status
        .ok_or_else(|| anyhow!("the reply carries no status"))?;
    if json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        print_status(&s);
    }
    Ok(())
}

/// Every `PID.sock` in `dir`, sorted by PID.
fn sockets(dir: &Path) -> Result<Vec<u32>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(anyhow!(e).context(format!("reading {}", dir.display()))),
    };
    let mut pids: Vec<u32> = entries
        .flatten()
        .filter_map(|e| cudaw_control::pid_of_socket(&e.file_name().to_string_lossy()))
        .collect();
    pids.sort_unstable();
    Ok(pids)
}

fn status_all(json: bool) -> Result<()> {
    let dir = run_dir()?;
    let mut live = Vec::new();
    let mut stale = Vec::new();
    for pid in sockets(&dir)? {
        let path = cudaw_control::socket_path(&dir, pid);
        let reply = UnixStream::connect(&path)
            .map_err(anyhow::Error::from)
            .and_then(|s| exchange(s, Request::Status));
        match reply.map(|r| r.status) {
            Ok(Some(s)) => live.push(s),
            Ok(None) => stale.push((pid, "no status in the reply".to_owned())),
            Err(e) => stale.push((pid, format!("{e:#}"))),
        }
    }
    if json {
        let v = serde_json::json!({
            "processes": live,
            "stale": stale.iter().map(|(p, _)| p).collect::<Vec<_>>(),
        });
        println!("{v}");
    } else {
        if live.is_empty() {
            println!("no processes under cudaw (run folder {})", dir.display());
        }
        for s in &live {
            print_status(s);
        }
    }
    for (pid, why) in &stale {
        eprintln!(
            "cudaw-ckpt: stale socket {} skipped: {why}",
            cudaw_control::socket_path(&dir, *pid).display()
        );
    }
    Ok(())
}

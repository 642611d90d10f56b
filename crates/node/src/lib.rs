//! `cudaw node`: the node daemon that shares each GPU between the jobs of the processes
//! under cudaw on the machine.
//!
//! - [`discover`]: every `PID.sock` in the run folders is a process under cudaw; the
//!   daemon asks each for its status ([`client`]) and joins it, under its job id
//!   (`cudaw run --job ID`, else `pid-PID`), to the GPUs it has memory on.
//! - [`policy`]: one policy per GPU, cudaw-sched's `Scheduler`, decides who runs and who
//!   is swapped out; the daemon feeds it what it sees and the time.
//! - [`exec`]: one worker per process carries out the actions (hold, release, pause,
//!   resume through the control socket) in order, renewing held processes' leases so
//!   that they run ungated soon after the daemon dies.
//! - [`config_file`]: the TOML configuration, watched every second; a bad edit is
//!   refused with its line and the last good one kept.
//! - [`server`] and [`report`]: `cudaw node status` over a Unix socket, and Prometheus
//!   text on `GET /metrics`.
//! - [`daemon`]: the loop tying them together; SIGTERM or SIGINT lets every process go.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub(crate) mod log;

pub mod client;
pub mod config_file;
pub mod daemon;
pub mod discover;
pub mod exec;
pub mod policy;
pub mod report;
pub mod server;
pub mod timeline;

#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use report::NodeReport;

/// How `cudaw node` was asked to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The configuration file.
    pub config: PathBuf,
    /// The run folders to look in instead of the defaults.
    pub run_dirs: Vec<PathBuf>,
    /// The status socket (default: [`server::default_socket`]).
    pub socket: Option<PathBuf>,
    /// Where to serve Prometheus metrics (`127.0.0.1:9400`), if anywhere.
    pub metrics: Option<String>,
    /// How often the run folders are scanned and the processes asked for their status.
    pub interval: Duration,
    /// The holds' timing.
    pub timing: exec::Timing,
}

/// Why the daemon did not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartError {
    /// The configuration file is missing or refused (the line and the reason).
    Config(String),
    /// The status socket or the metrics endpoint cannot be served, or the signals not
    /// caught.
    Other(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Config(m) | StartError::Other(m) => f.write_str(m),
        }
    }
}

/// The status socket `cudaw node` and `cudaw node status` use when not told.
pub fn default_socket() -> PathBuf {
    server::default_socket(|k| std::env::var(k).ok(), cudaw_files::euid())
}

/// Runs the daemon with cudaw-sched's policy until `stop` is set (see
/// [`stop_on_signals`]), then lets every process go.
pub fn run(opts: &Options, stop: &AtomicBool) -> Result<(), StartError> {
    run_with(
        opts,
        cudaw_sched::Config::parse,
        Box::new(policy::scheduler),
        stop,
    )
}

/// [`run`] with another parser and policy (the tests').
pub fn run_with(
    opts: &Options,
    parse: config_file::Parse,
    make: Box<policy::MakePolicy>,
    stop: &AtomicBool,
) -> Result<(), StartError> {
    let uid = cudaw_files::euid();
    let config = config_file::ConfigFile::load(&opts.config, parse)
        .map_err(|e| StartError::Config(format!("configuration refused: {e}")))?;
    let path = opts.socket.clone().unwrap_or_else(default_socket);
    let socket = server::StatusSocket::bind(&path, uid).map_err(StartError::Other)?;
    let shared: server::Shared = Arc::new(Mutex::new(NodeReport::default()));
    let mut d = daemon::Daemon::new(
        daemon::Setup {
            run_dirs: opts.run_dirs.clone(),
            uid,
            interval: opts.interval,
            timing: opts.timing,
            make,
        },
        config,
        Arc::clone(&shared),
    );
    // The first report (its configuration, no process yet) before anyone can ask.
    d.publish(std::time::Instant::now());
    if let Some(addr) = &opts.metrics {
        let bound = server::serve_metrics(addr, Arc::clone(&shared)).map_err(StartError::Other)?;
        log::log_info!("metrics at http://{bound}/metrics");
    }
    socket
        .serve(Arc::clone(&shared))
        .map_err(|e| StartError::Other(format!("starting the status socket's thread: {e}")))?;
    log::log_info!(
        "cudaw node {} (PID {}): status on {}",
        env!("CARGO_PKG_VERSION"),
        std::process::id(),
        path.display()
    );
    d.run(stop);
    let _ = std::fs::remove_file(&path);
    Ok(())
}

/// A flag SIGTERM and SIGINT set (the daemon then lets every process go and exits); a
/// second signal while it stops ends the process at once (status 130 or 143).
pub fn stop_on_signals() -> Result<Arc<AtomicBool>, StartError> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let flag = Arc::new(AtomicBool::new(false));
    for (sig, code) in [(SIGTERM, 143), (SIGINT, 130)] {
        signal_hook::flag::register_conditional_shutdown(sig, code, Arc::clone(&flag))
            .and_then(|_| signal_hook::flag::register(sig, Arc::clone(&flag)))
            .map_err(|e| StartError::Other(format!("catching signal {sig}: {e}")))?;
    }
    Ok(flag)
}

/// Parses `--interval`: `20ms`, `0.05s`, `1s` (between 1 ms and 10 s).
pub fn parse_interval(v: &str) -> Result<Duration, String> {
    let t = v.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err("expected a time with its unit, such as 20ms or 0.05s".into());
    };
    let secs = num
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite())
        .map(|s| s * scale)
        .ok_or_else(|| format!("{num:?} is not a number"))?;
    if !(0.001..=10.0).contains(&secs) {
        return Err(format!("{v} is not between 1ms and 10s"));
    }
    Ok(Duration::from_secs_f64(secs))
}

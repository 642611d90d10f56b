//! The node scheduler's policy (`cudaw node`): which job holds each GPU now, for how long,
//! and whose memory is swapped out to make room — a pure state machine. It does no I/O
//! and reads no clock: the daemon (`crates/node`) feeds it what it observes of the
//! processes, with the time, and carries out the [`Action`]s it returns through the
//! processes' control sockets (`hold` closes a process's gate and waits for its device
//! work to drain; `release` opens it; `pause` / `resume` evict and restore its memory).
//!
//! - [`config`]: the daemon's TOML configuration (`[[job]]` tables: `id`, `request`,
//!   `limit`, `memory`, `priority`, `gpus`), parsed with the line and reason of any error.
//! - [`Scheduler`]: one GPU's schedule. Jobs (one or more processes each) take turns in
//!   quanta by their shares; an idle job's share goes to the others (work-conserving);
//!   a job over its `limit` waits even when the GPU is free; before a job's quantum, jobs
//!   not running now are swapped out (least recently run first, never a higher priority
//!   for a lower) until the job's memory fits.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod config;

use std::time::{Duration, Instant};

pub use config::{Config, ConfigError, JobSpec, MemSpec};

/// A process of a job, by PID.
pub type Pid = u32;

/// What the daemon saw of one process, now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Observation {
    /// Threads of the process wait at its closed gate: it wants the GPU.
    pub waiting: bool,
    /// The process's device memory resident on this GPU, in bytes.
    pub resident: u64,
    /// Its device memory swapped out (paused: in host memory), in bytes.
    pub swapped: u64,
}

/// What the daemon must do, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Close the process's gate and wait for its device work to drain (the end of its
    /// job's quantum, or a job over its limit).
    Hold(Pid),
    /// Open the process's gate: its job's quantum begins.
    Release(Pid),
    /// Swap the process's memory out (pause: evict to host memory).
    SwapOut(Pid),
    /// Swap the process's memory back in (resume, then hold again until its quantum).
    SwapIn(Pid),
}

/// How an action the daemon carried out ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done.
    Done,
    /// Failed, with the reason (the process may be gone: [`Scheduler::leave`] follows).
    Failed(String),
}

/// One job as `cudaw node status` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct JobReport {
    /// The job's id (`cudaw run --job ID`; a process without one is the job `pid-PID`).
    pub id: String,
    /// Its processes on this GPU.
    pub pids: Vec<Pid>,
    /// Its guaranteed share of the GPU's time (0–1).
    pub request: f64,
    /// Its largest share (0–1).
    pub limit: f64,
    /// Its memory limit in bytes, if any.
    pub memory: Option<u64>,
    /// Its priority (higher is swapped out later).
    pub priority: i32,
    /// The share of the GPU's time it had over the last minute (0–1).
    pub achieved_share: f64,
    /// Its device memory resident now, in bytes.
    pub resident_bytes: u64,
    /// Its device memory swapped out now, in bytes.
    pub swapped_bytes: u64,
    /// Times it was swapped out.
    pub swaps: u64,
    /// Times it waited for the GPU (a quantum asked for and not yet given).
    pub waits: u64,
    /// Whether it holds the GPU now.
    pub running: bool,
}

/// One GPU's schedule. See the crate docs.
#[derive(Debug)]
pub struct Scheduler {
    capacity: u64,
    config: Config,
    _state: (),
}

impl Scheduler {
    /// A GPU of `capacity` bytes scheduled by `config`.
    pub fn new(capacity: u64, config: &Config) -> Scheduler {
        Scheduler {
            capacity,
            config: config.clone(),
            _state: (),
        }
    }

    /// Applies a new configuration (shares and limits at once; a lowered memory limit
    /// as the job frees memory).
    pub fn set_config(&mut self, config: &Config, _now: Instant) {
        self.config = config.clone();
    }

    /// Process `pid` of job `job` joined (found running ungated: it counts as running
    /// until the first [`Action::Hold`] of it is done).
    pub fn join(&mut self, pid: Pid, job: &str, now: Instant) {
        let _ = (pid, job, now, self.capacity);
        todo!("cudaw-sched: join")
    }

    /// Process `pid` is gone (exited, or its socket no longer answers).
    pub fn leave(&mut self, pid: Pid, now: Instant) {
        let _ = (pid, now);
        todo!("cudaw-sched: leave")
    }

    /// What the daemon saw of process `pid` now.
    pub fn observe(&mut self, pid: Pid, seen: Observation, now: Instant) {
        let _ = (pid, seen, now);
        todo!("cudaw-sched: observe")
    }

    /// An action returned by [`Scheduler::tick`] ended.
    pub fn done(&mut self, action: &Action, outcome: Outcome, now: Instant) {
        let _ = (action, outcome, now);
        todo!("cudaw-sched: done")
    }

    /// What to do now. Call again at [`Scheduler::next_deadline`] or after any event.
    pub fn tick(&mut self, now: Instant) -> Vec<Action> {
        let _ = now;
        todo!("cudaw-sched: tick")
    }

    /// When the schedule next changes by itself (a quantum's end), if ever.
    pub fn next_deadline(&self) -> Option<Instant> {
        todo!("cudaw-sched: next_deadline")
    }

    /// Every job on this GPU, for `cudaw node status` and the metrics.
    pub fn report(&self, now: Instant) -> Vec<JobReport> {
        let _ = now;
        todo!("cudaw-sched: report")
    }

    /// The quantum the next turn would get now (for the timeline and the logs).
    pub fn quantum(&self) -> Duration {
        self.config.quantum
    }
}

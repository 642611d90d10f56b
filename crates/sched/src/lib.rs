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
//!
//! # The policy
//!
//! - **Turns.** At most one job's gates are open at a time. A job wants the GPU when a
//!   process of it waits at its closed gate (or an allocation of it waits for room,
//!   [`Scheduler::alloc_wait`]). Of the jobs that want it, the one with the least GPU time
//!   used divided by its weight goes next (stride scheduling; GPU time is from its release
//!   done to its hold done, so a hold's drain is its own). The weight is the job's
//!   `request`; jobs that request 0 share what the requests of the jobs here leave over
//!   equally (at least [`MIN_WEIGHT`]). A job that starts wanting is brought up to the
//!   least virtual time of the others, so time it did not want is not credit (not a job
//!   seen wanting at the first look after a hold ended its turn: it was running).
//! - **Work-conserving.** At the end of its quantum the running job goes on, with no hold,
//!   unless a job that wants the GPU should go before it: one job alone is never held.
//! - **Limits.** A job is held at the end of a quantum when its GPU time over the last
//!   [`LIMIT_WINDOW`] would pass `limit × LIMIT_WINDOW`, even with the GPU otherwise idle,
//!   and starts again once a whole quantum fits under it ([`Scheduler::next_deadline`]
//!   says when).
//! - **Quanta.** A job's quantum is the configured `quantum`, lengthened to
//!   [`DRAIN_FACTOR`] times the moving average of its holds' drain (so a switch costs at
//!   most about 5% of its turn), within `min_quantum..max_quantum`. A turn that had to swap
//!   memory first lasts at least [`SWAP_FACTOR`] times the swap took, past `max_quantum` if
//!   need be, so a swap costs at most about a sixth of the GPU's time.
//! - **Memory.** Before job J's turn, if the memory resident on the GPU plus J's swapped
//!   memory (and the bytes its allocations wait for) exceed the card, jobs not running are
//!   swapped out — least recently run first, never one of a higher priority than J — until
//!   J fits; then J's memory is swapped in, then its gates open (swaps and releases come in
//!   separate ticks: a failed swap cancels the turn, retried after `max_quantum`). A job
//!   that cannot fit waits (`memory_waits` in its report); the others go on.
//! - **Robustness.** A process that joins is running ungated: if another job holds the GPU
//!   it is held at once. A failed hold means the process may still run: its job keeps the
//!   turn, the hold is tried again after `min_quantum`, and no other job is released
//!   meanwhile (the daemon should bound a hold's wait and report it failed). An action
//!   outstanding (given by [`Scheduler::tick`], not yet [`Scheduler::done`]) blocks any
//!   other for that process. A job whose processes all leave ends its turn.
//!
//! The daemon's loop: [`Scheduler::join`] / [`Scheduler::leave`] / [`Scheduler::observe`]
//! as it finds processes, [`Scheduler::tick`] after each event and at
//! [`Scheduler::next_deadline`], each action carried out in order and reported with
//! [`Scheduler::done`] (then [`Scheduler::tick`] again).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod config;

use std::collections::{BTreeMap, BTreeSet};
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
    /// Its kernel launches so far (the process's, on all its GPUs).
    pub launches: u64,
    /// Host memory it keeps between pauses (the host arena, host copies kept from the last
    /// resume): what a swap out fills first, at no new cost to the host.
    pub host_kept: u64,
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

impl Action {
    /// The process it is for.
    pub fn pid(&self) -> Pid {
        match self {
            Action::Hold(p) | Action::Release(p) | Action::SwapOut(p) | Action::SwapIn(p) => *p,
        }
    }

    /// Its name, for logs and timelines: `hold`, `release`, `swap out`, `swap in`.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Hold(_) => "hold",
            Action::Release(_) => "release",
            Action::SwapOut(_) => "swap out",
            Action::SwapIn(_) => "swap in",
        }
    }
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
    /// Bytes swapped out over all its swaps (what was resident each time).
    pub swapped_out_bytes: u64,
    /// Its kernel launches (its processes', those that left included).
    pub launches: u64,
    /// Times it waited for the GPU (a quantum asked for and not yet given).
    pub waits: u64,
    /// Whether it holds the GPU now.
    pub running: bool,
    /// All the GPU time it had, in seconds (its turns: from release done to hold done).
    pub gpu_seconds: f64,
    /// Times it wanted the GPU and did not fit in memory (only jobs of a higher priority
    /// left to swap out, or a swap failed): it waited for room.
    pub memory_waits: u64,
    /// Its weight in the fair share: its request, or an equal part of what the requests
    /// leave over for a job that requests 0.
    pub weight: f64,
    /// The quantum it gets now, in seconds.
    pub quantum_seconds: f64,
}

/// How long achieved shares are measured over ([`JobReport::achieved_share`]).
pub const SHARE_WINDOW: Duration = Duration::from_secs(60);
/// How long a job's `limit` is enforced over: a job is held while its GPU time in the last
/// `LIMIT_WINDOW` would exceed `limit × LIMIT_WINDOW`.
pub const LIMIT_WINDOW: Duration = Duration::from_secs(2);
/// A job's quantum is at least this many times its holds' drain time (within
/// `min_quantum..max_quantum`), so the switch costs at most about 5% of its turns.
pub const DRAIN_FACTOR: u32 = 20;
/// A turn that had to swap memory first lasts at least this many times the swap took
/// (even past `max_quantum`), so swapping costs at most about a sixth of the GPU's time.
pub const SWAP_FACTOR: u32 = 5;
/// The smallest weight a job with `request = 0` gets when the requests leave nothing over.
pub const MIN_WEIGHT: f64 = 0.01;

/// One process, as the scheduler knows it.
#[derive(Debug)]
struct Proc {
    job: String,
    seen: Observation,
    /// When it was last observed ([`Scheduler::observe`]).
    seen_at: Option<Instant>,
    /// Bytes an allocation of it waits for ([`Scheduler::alloc_wait`]).
    need: u64,
    /// When it was last seen waiting for them.
    need_at: Option<Instant>,
    /// Unseen memory was learnt from its present wait (once a wait: an eviction that did
    /// not let it through teaches nothing more).
    learnt: bool,
    /// Its gate may be open: it joined ungated, was released, or a hold of it failed.
    open: bool,
    /// The action the daemon carries out for it now, and when it was given.
    pending: Option<(Action, Instant)>,
    /// A failed hold is tried again from then.
    retry_at: Option<Instant>,
}

/// One job, as the scheduler knows it.
#[derive(Debug)]
struct Job {
    pids: Vec<Pid>,
    joined: Instant,
    /// GPU time used divided by its weight, in seconds: the job that wants the GPU with the
    /// least goes next (stride scheduling).
    vtime: f64,
    /// All its GPU time.
    gpu: Duration,
    /// Its turns (from the first release done to the last hold done) within the windows.
    runs: std::collections::VecDeque<(Instant, Instant)>,
    /// When its last turn ended (its join, before any): swaps take the least recent first.
    last_run: Instant,
    wanting: bool,
    /// When its last turn ended, until the daemon has looked at every process of it since:
    /// when it is seen wanting the GPU meanwhile, it had not stopped wanting it, it was
    /// running (the daemon's looks are some milliseconds apart: with quanta as short as
    /// them, a job would otherwise be brought up to the running job's virtual time every
    /// turn and get 0.33 of the GPU for its request of 0.25, as it did on the H200 with
    /// 10 ms quanta). Every process, not the first one looked at: an idle process of the
    /// job seen first must not end it before the busy one, seen waiting, is looked at.
    turn_ended: Option<Instant>,
    swaps: u64,
    /// Bytes it had resident when swapped out, over all its swaps.
    swapped_out: u64,
    /// The launches of its processes that left, by process (the report adds those of the
    /// others; a process that joins again is counted as live again, not twice).
    launches_left: BTreeMap<Pid, u64>,
    waits: u64,
    memory_waits: u64,
    /// It wants the GPU and does not fit: counted once in `memory_waits` per episode.
    mem_blocked: bool,
    /// The moving average of its holds' drain times.
    drain: Option<Duration>,
    /// A turn of it failed to prepare (a swap failed): not tried again before then.
    backoff_until: Option<Instant>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Swaps for the turn are being carried out.
    Preparing { started: Instant, failed: bool },
    /// Its releases are being carried out; `swap` is how long preparing took.
    Releasing { swap: Duration },
    /// Its gates are open until `end`.
    Running { end: Instant },
    /// Its holds are being carried out.
    Draining,
}

/// The job that holds the GPU (or is about to, or is giving it back).
#[derive(Debug)]
struct Turn {
    job: String,
    phase: Phase,
    /// Its first release done (or its join, when it was found running).
    since: Option<Instant>,
}

/// One GPU's schedule. See the crate docs.
#[derive(Debug)]
pub struct Scheduler {
    capacity: u64,
    config: Config,
    procs: BTreeMap<Pid, Proc>,
    jobs: BTreeMap<String, Job>,
    turn: Option<Turn>,
    /// The last [`Scheduler::tick`]'s time: deadlines not after it are not deadlines.
    last_tick: Option<Instant>,
    /// Host memory a swap out may still take, in bytes ([`Scheduler::host_room`]); `None`:
    /// not known, not checked.
    host_room: Option<u64>,
    /// Device memory the accounting does not see (contexts, libraries' own allocations,
    /// programs not under cudaw), learnt from allocations that keep waiting while the
    /// accounting says they fit ([`Scheduler::make_room_for_running`]); forgotten when a
    /// process leaves.
    unseen: u64,
    /// When the memory on the GPU last changed by the schedule's doing (a swap done, a
    /// turn begun): a waiting allocation is believed only once it had time to try again.
    settled_from: Option<Instant>,
}

/// How long after the last swap or the start of its turn a running job's allocation must
/// still be seen waiting before the memory the accounting misses is learnt from it: the
/// process tries again every 5 ms, so by then it has tried with the memory as it is.
pub const SETTLE: Duration = Duration::from_millis(25);

/// What is learnt beyond the measured shortfall, so that a few more megabytes of contexts
/// do not need another round.
const UNSEEN_SLACK: u64 = 64 << 20;

/// How much of `[from, to]` lies in `[start, end]` (`from` `None`: from the beginning).
fn overlap(start: Instant, end: Instant, from: Option<Instant>, to: Instant) -> Duration {
    let s = match from {
        Some(f) => start.max(f),
        None => start,
    };
    let e = end.min(to);
    e.saturating_duration_since(s)
}

impl Scheduler {
    /// A GPU of `capacity` bytes scheduled by `config` (`capacity` 0: unknown, nothing is
    /// swapped).
    pub fn new(capacity: u64, config: &Config) -> Scheduler {
        Scheduler {
            capacity,
            config: config.clone(),
            procs: BTreeMap::new(),
            jobs: BTreeMap::new(),
            turn: None,
            last_tick: None,
            host_room: None,
            unseen: 0,
            settled_from: None,
        }
    }

    /// The host memory swaps out on this GPU may take now, in bytes (the daemon reads the
    /// host's available memory, leaves a reserve and splits the rest between its GPUs): a
    /// job whose memory (less what it keeps in host memory already) would not fit there is
    /// not swapped out, and a job that needs it swapped out to fit waits for memory
    /// instead (host RAM is not overcommitted). `None`: not checked.
    pub fn host_room(&mut self, bytes: Option<u64>) {
        self.host_room = bytes;
    }

    /// Applies a new configuration (shares and limits at once; a lowered memory limit
    /// as the job frees memory).
    pub fn set_config(&mut self, config: &Config, now: Instant) {
        self.config = config.clone();
        // The running turn's end follows the new quantum and limit at once.
        if let Some(Turn {
            job,
            phase: Phase::Running { end },
            since: Some(since),
        }) = &self.turn
        {
            let q = self.turn_length(job, now);
            let new_end = (*since + q).max(now);
            if new_end < *end {
                let job = job.clone();
                self.set_phase(&job, Phase::Running { end: new_end });
            }
        }
    }

    /// Process `pid` of job `job` joined (found running ungated: it counts as running
    /// until the first [`Action::Hold`] of it is done).
    pub fn join(&mut self, pid: Pid, job: &str, now: Instant) {
        if let Some(p) = self.procs.get(&pid) {
            if p.job == job {
                return;
            }
            self.leave(pid, now);
        }
        if !self.jobs.contains_key(job) {
            let floor = self.vfloor(None, now);
            self.jobs.insert(
                job.to_owned(),
                Job {
                    pids: Vec::new(),
                    joined: now,
                    vtime: floor,
                    gpu: Duration::ZERO,
                    runs: Default::default(),
                    last_run: now,
                    wanting: false,
                    turn_ended: None,
                    swaps: 0,
                    swapped_out: 0,
                    launches_left: BTreeMap::new(),
                    waits: 0,
                    memory_waits: 0,
                    mem_blocked: false,
                    drain: None,
                    backoff_until: None,
                },
            );
        }
        if let Some(j) = self.jobs.get_mut(job) {
            j.pids.push(pid);
        }
        self.procs.insert(
            pid,
            Proc {
                job: job.to_owned(),
                seen: Observation::default(),
                seen_at: None,
                need: 0,
                need_at: None,
                learnt: false,
                open: true,
                pending: None,
                retry_at: None,
            },
        );
        if self.turn.is_none() && self.procs.values().all(|p| p.job == job || !p.open) {
            // Found running with the GPU otherwise free: its turn began now.
            self.start_running(job, now, Duration::ZERO);
        }
    }

    /// Process `pid` is gone (exited, or its socket no longer answers).
    pub fn leave(&mut self, pid: Pid, now: Instant) {
        let Some(p) = self.procs.remove(&pid) else {
            return;
        };
        // Its context went with it: what the accounting misses is learnt again if need be.
        self.unseen = 0;
        self.settled_from = Some(now);
        let empty = match self.jobs.get_mut(&p.job) {
            Some(j) => {
                j.pids.retain(|&q| q != pid);
                j.launches_left.insert(pid, p.seen.launches);
                j.pids.is_empty()
            }
            None => false,
        };
        let is_turn = self.turn.as_ref().is_some_and(|t| t.job == p.job);
        let draining = self
            .turn
            .as_ref()
            .is_some_and(|t| t.phase == Phase::Draining);
        if is_turn && (empty || (draining && self.turn_drained())) {
            self.end_turn(now);
        }
        if empty {
            self.jobs.remove(&p.job);
        } else {
            self.update_wanting(&p.job, now);
        }
    }

    /// What the daemon saw of process `pid` now.
    pub fn observe(&mut self, pid: Pid, seen: Observation, now: Instant) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        p.seen = seen;
        p.seen_at = Some(now);
        let job = p.job.clone();
        self.update_wanting(&job, now);
    }

    /// An allocation of process `pid` waits for `bytes` of device memory it does not have
    /// (0: none waits now). The job counts as wanting the GPU, its turn is prepared with
    /// room for the bytes, and while it runs, jobs that may be swapped out for it are.
    /// (Added for the issue's waiting allocations; optional for the daemon.)
    pub fn alloc_wait(&mut self, pid: Pid, bytes: u64, now: Instant) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        p.need = bytes;
        p.need_at = (bytes > 0).then_some(now);
        if bytes == 0 {
            p.learnt = false;
        }
        let job = p.job.clone();
        self.update_wanting(&job, now);
    }

    /// An action returned by [`Scheduler::tick`] ended.
    pub fn done(&mut self, action: &Action, outcome: Outcome, now: Instant) {
        let pid = action.pid();
        let min_q = self.config.min_quantum;
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        let issued = match &p.pending {
            Some((a, at)) if a == action => *at,
            _ => return, // not the action outstanding for it: stale
        };
        p.pending = None;
        let ok = outcome == Outcome::Done;
        let job = p.job.clone();
        let mut prep_failed = false;
        match action {
            Action::Hold(_) => {
                if ok {
                    p.open = false;
                    p.retry_at = None;
                    let drain = now.saturating_duration_since(issued);
                    if let Some(j) = self.jobs.get_mut(&job) {
                        j.drain = Some(match j.drain {
                            Some(d) => d.mul_f64(0.7) + drain.mul_f64(0.3),
                            None => drain,
                        });
                    }
                } else {
                    // It may still run: it keeps the GPU until a hold of it is done.
                    p.retry_at = Some(now + min_q);
                }
            }
            Action::Release(_) => {
                // A failed release leaves its gate unknown: held before anyone else runs.
                p.open = true;
                if let Some(Turn {
                    job: tj,
                    phase: Phase::Releasing { swap },
                    ..
                }) = &self.turn
                {
                    if *tj == job {
                        let swap = *swap;
                        self.start_running(&job, now, swap);
                    }
                }
            }
            Action::SwapOut(_) => {
                if ok {
                    p.seen.swapped = p.seen.swapped.saturating_add(p.seen.resident);
                    p.seen.resident = 0;
                } else {
                    prep_failed = true;
                }
            }
            Action::SwapIn(_) => {
                if ok {
                    p.seen.resident = p.seen.resident.saturating_add(p.seen.swapped);
                    p.seen.swapped = 0;
                } else {
                    prep_failed = true;
                }
            }
        }
        if matches!(action, Action::SwapOut(_) | Action::SwapIn(_)) {
            self.settled_from = Some(now);
        }
        if prep_failed {
            if let Some(Turn {
                phase: Phase::Preparing { failed, .. },
                ..
            }) = &mut self.turn
            {
                *failed = true;
            }
        }
        if matches!(action, Action::Hold(_))
            && self
                .turn
                .as_ref()
                .is_some_and(|t| t.job == job && t.phase == Phase::Draining)
            && self.turn_drained()
        {
            self.end_turn(now);
        }
    }

    /// What to do now. Call again at [`Scheduler::next_deadline`] or after any event
    /// (an observation, a join or leave, an action done). At most one action is
    /// outstanding for a process at a time: no action is given for a process whose last
    /// one is not yet [`Scheduler::done`].
    pub fn tick(&mut self, now: Instant) -> Vec<Action> {
        self.last_tick = Some(now);
        self.prune(now);
        let mut out = Vec::new();
        let turn_job = self.turn.as_ref().map(|t| t.job.clone());

        // Processes whose gates may be open that are not the turn's: hold them.
        let strays: Vec<Pid> = self
            .procs
            .iter()
            .filter(|(_, p)| {
                p.open
                    && p.pending.is_none()
                    && Some(&p.job) != turn_job.as_ref()
                    && p.retry_at.is_none_or(|t| t <= now)
            })
            .map(|(&pid, _)| pid)
            .collect();
        for pid in strays {
            self.issue(&mut out, Action::Hold(pid), now);
        }

        if let Some(turn) = &self.turn {
            let job = turn.job.clone();
            match turn.phase {
                Phase::Preparing { started, failed } => {
                    // Nothing of another job may run (a stray found running, a hold
                    // that failed) when its gates open.
                    if !self.job_pending(&job)
                        && !self.any_pending_outside(&job)
                        && !self.any_open_outside(&job)
                    {
                        if failed {
                            self.abort_turn(&job, now);
                        } else if self.fits_now(&job) {
                            let swap = now.saturating_duration_since(started);
                            self.release(&job, swap, now, &mut out);
                        } else if !self.prepare(&job, now, &mut out) {
                            self.abort_turn(&job, now);
                        }
                    }
                }
                Phase::Releasing { .. } => {}
                Phase::Running { .. }
                    if self.job_sum(&job, |p| p.seen.swapped) > 0 && !self.job_pending(&job) =>
                {
                    // Its memory is swapped out: it cannot run. (A process found paused
                    // with its memory out, an earlier daemon's swap, that joined first
                    // was "found running": its turn began at its join, before anything
                    // was seen of it.) The turn is prepared again: its memory first.
                    self.set_phase(
                        &job,
                        Phase::Preparing {
                            started: now,
                            failed: false,
                        },
                    );
                }
                Phase::Running { end } => {
                    self.make_room_for_running(&job, now, &mut out);
                    if now >= end {
                        self.end_of_quantum(&job, now, &mut out);
                    }
                }
                Phase::Draining => self.hold_job(&job, now, &mut out),
            }
        }

        if self.turn.is_none() {
            self.start_next(now, &mut out);
        }
        out
    }

    /// When the schedule next changes by itself (a quantum's end, a failed hold tried
    /// again, a job back under its limit), if ever.
    pub fn next_deadline(&self) -> Option<Instant> {
        let after = |t: &Instant| self.last_tick.is_none_or(|l| *t > l);
        let mut times = Vec::new();
        if let Some(Turn {
            phase: Phase::Running { end },
            ..
        }) = &self.turn
        {
            times.push(*end);
        }
        for p in self.procs.values() {
            if p.open && p.pending.is_none() {
                times.extend(p.retry_at);
            }
        }
        let now = self.last_tick;
        for (id, j) in &self.jobs {
            if !j.wanting {
                continue;
            }
            times.extend(j.backoff_until);
            if let Some(now) = now {
                times.extend(self.limit_ready_at(id, now));
            }
        }
        times.into_iter().filter(after).min()
    }

    /// Every job on this GPU, for `cudaw node status` and the metrics.
    pub fn report(&self, now: Instant) -> Vec<JobReport> {
        let from = now.checked_sub(SHARE_WINDOW);
        self.jobs
            .iter()
            .map(|(id, j)| {
                let spec = self.config.job(id);
                let used = self.used_since(id, from, now);
                let span = now
                    .saturating_duration_since(j.joined)
                    .min(SHARE_WINDOW)
                    .max(Duration::from_millis(1));
                let mut resident = 0u64;
                let mut swapped = 0u64;
                let mut launches: u64 = j
                    .launches_left
                    .iter()
                    .filter(|(pid, _)| !j.pids.contains(pid))
                    .map(|(_, n)| n)
                    .sum();
                for pid in &j.pids {
                    if let Some(p) = self.procs.get(pid) {
                        resident = resident.saturating_add(p.seen.resident);
                        swapped = swapped.saturating_add(p.seen.swapped);
                        // Back after it left: not below what it had then.
                        let before = j.launches_left.get(pid).copied().unwrap_or(0);
                        launches = launches.saturating_add(p.seen.launches.max(before));
                    }
                }
                let running = self.turn.as_ref().is_some_and(|t| {
                    t.job == *id && matches!(t.phase, Phase::Running { .. } | Phase::Draining)
                });
                JobReport {
                    id: id.clone(),
                    pids: j.pids.clone(),
                    request: spec.request,
                    limit: spec.limit,
                    memory: spec.memory.map(|m| self.mem_bytes(m)),
                    priority: spec.priority,
                    achieved_share: (used.as_secs_f64() / span.as_secs_f64()).min(1.0),
                    resident_bytes: resident,
                    swapped_bytes: swapped,
                    swaps: j.swaps,
                    swapped_out_bytes: j.swapped_out,
                    launches,
                    waits: j.waits,
                    running,
                    gpu_seconds: (j.gpu + self.current_run(id, now)).as_secs_f64(),
                    memory_waits: j.memory_waits,
                    weight: self.weight(id),
                    quantum_seconds: self.quantum_for(id).as_secs_f64(),
                }
            })
            .collect()
    }

    /// The quantum the next turn would get now (for the timeline and the logs): the
    /// running job's, or the configured one when none runs.
    pub fn quantum(&self) -> Duration {
        match &self.turn {
            Some(t) => self.quantum_for(&t.job),
            None => self
                .config
                .quantum
                .clamp(self.config.min_quantum, self.config.max_quantum),
        }
    }

    /// The quantum job `id` gets now, if it is on this GPU: the configured quantum,
    /// lengthened to [`DRAIN_FACTOR`] times its holds' drain, within
    /// `min_quantum..max_quantum`. (Added for the daemon's logs.)
    pub fn job_quantum(&self, id: &str) -> Option<Duration> {
        self.jobs.contains_key(id).then(|| self.quantum_for(id))
    }

    /// The job whose turn it is, if any (running, or being prepared, released or held).
    /// (Added for the daemon's timeline.)
    pub fn turn_job(&self) -> Option<&str> {
        self.turn.as_ref().map(|t| t.job.as_str())
    }

    // ---- policy -------------------------------------------------------------------

    fn quantum_for(&self, id: &str) -> Duration {
        let c = &self.config;
        let drain = self.jobs.get(id).and_then(|j| j.drain).unwrap_or_default();
        c.quantum
            .max(drain.saturating_mul(DRAIN_FACTOR))
            .clamp(c.min_quantum, c.max_quantum.max(c.min_quantum))
    }

    /// Its weight: its request, or for a job that requests 0, an equal part of what the
    /// requests of the jobs here leave over (at least [`MIN_WEIGHT`]).
    fn weight(&self, id: &str) -> f64 {
        let spec = self.config.job(id);
        if spec.request > 0.0 {
            return spec.request;
        }
        let mut sum = 0.0;
        let mut zero = 0usize;
        for other in self.jobs.keys() {
            let r = self.config.job(other).request;
            if r > 0.0 {
                sum += r;
            } else {
                zero += 1;
            }
        }
        ((1.0 - sum) / zero.max(1) as f64).max(MIN_WEIGHT)
    }

    /// Its virtual time, with the running turn counted so far.
    fn vtime(&self, id: &str, now: Instant) -> f64 {
        let Some(j) = self.jobs.get(id) else {
            return 0.0;
        };
        j.vtime + self.current_run(id, now).as_secs_f64() / self.weight(id)
    }

    /// The least virtual time of the jobs that want or hold the GPU, other than `except`:
    /// a job that starts wanting is brought up to it, so time it did not want is not
    /// credit it can claim later.
    fn vfloor(&self, except: Option<&str>, now: Instant) -> f64 {
        let turn = self.turn.as_ref().map(|t| t.job.as_str());
        self.jobs
            .iter()
            .filter(|(id, j)| Some(id.as_str()) != except && (j.wanting || turn == Some(id)))
            .map(|(id, _)| self.vtime(id, now))
            .min_by(f64::total_cmp)
            .unwrap_or_else(|| {
                self.jobs
                    .iter()
                    .filter(|(id, _)| Some(id.as_str()) != except)
                    .map(|(_, j)| j.vtime)
                    .min_by(f64::total_cmp)
                    .unwrap_or(0.0)
            })
    }

    fn current_run(&self, id: &str, now: Instant) -> Duration {
        match &self.turn {
            Some(Turn {
                job,
                since: Some(since),
                ..
            }) if job == id => now.saturating_duration_since(*since),
            _ => Duration::ZERO,
        }
    }

    /// Its GPU time in `[from, now]`.
    fn used_since(&self, id: &str, from: Option<Instant>, now: Instant) -> Duration {
        let Some(j) = self.jobs.get(id) else {
            return Duration::ZERO;
        };
        let mut used: Duration = j.runs.iter().map(|&(s, e)| overlap(s, e, from, now)).sum();
        if let Some(Turn {
            job,
            since: Some(since),
            ..
        }) = &self.turn
        {
            if job == id {
                used += overlap(*since, now, from, now);
            }
        }
        used
    }

    /// How much more GPU time its limit allows in the limit window now (`None`: no limit).
    fn budget(&self, id: &str, now: Instant) -> Option<Duration> {
        let limit = self.config.job(id).limit;
        if limit >= 1.0 {
            return None;
        }
        let allowed = LIMIT_WINDOW.mul_f64(limit.max(0.0));
        let used = self.used_since(id, now.checked_sub(LIMIT_WINDOW), now);
        Some(allowed.saturating_sub(used))
    }

    /// The budget a waiting job needs before it may start a turn: a whole quantum (or its
    /// whole window's allowance, if smaller), so a limited job does not run in slivers.
    fn budget_needed(&self, id: &str) -> Duration {
        let limit = self.config.job(id).limit.max(0.0);
        self.quantum_for(id).min(LIMIT_WINDOW.mul_f64(limit))
    }

    fn under_limit(&self, id: &str, now: Instant) -> bool {
        match self.budget(id, now) {
            None => true,
            Some(b) => !b.is_zero() && b >= self.budget_needed(id),
        }
    }

    /// When a job that waits only for its limit may start a turn again.
    fn limit_ready_at(&self, id: &str, now: Instant) -> Option<Instant> {
        let budget = self.budget(id, now)?;
        let need = self.budget_needed(id);
        if budget >= need && !budget.is_zero() {
            return None;
        }
        let mut excess = need.max(Duration::from_micros(1)) - budget;
        let from = now.checked_sub(LIMIT_WINDOW);
        let j = self.jobs.get(id)?;
        for &(s, e) in &j.runs {
            let len = overlap(s, e, from, now);
            if len.is_zero() {
                continue;
            }
            let start = from.map_or(s, |f| s.max(f));
            if excess <= len {
                return Some(start + excess + LIMIT_WINDOW);
            }
            excess -= len;
        }
        None
    }

    fn mem_bytes(&self, m: MemSpec) -> u64 {
        m.bytes(self.capacity)
    }

    fn job_sum(&self, id: &str, f: impl Fn(&Proc) -> u64) -> u64 {
        self.jobs.get(id).map_or(0, |j| {
            j.pids
                .iter()
                .filter_map(|pid| self.procs.get(pid))
                .map(&f)
                .fold(0u64, u64::saturating_add)
        })
    }

    fn total_resident(&self) -> u64 {
        self.procs
            .values()
            .map(|p| p.seen.resident)
            .fold(0u64, u64::saturating_add)
    }

    /// The bytes job `id` needs on the GPU beyond what it has there.
    fn job_need(&self, id: &str) -> u64 {
        self.job_sum(id, |p| p.seen.swapped.saturating_add(p.need))
    }

    fn fits_now(&self, id: &str) -> bool {
        self.job_sum(id, |p| p.seen.swapped) == 0
            && (self.capacity == 0
                || self
                    .total_resident()
                    .saturating_add(self.job_sum(id, |p| p.need))
                    <= self.usable())
    }

    /// The jobs to swap out, least recently run first, for job `id` to fit; `None` if it
    /// cannot (only jobs of a higher priority, or busy ones, are left to swap out).
    fn evictions(&self, id: &str) -> Option<Vec<String>> {
        self.evictions_with(id, None)
    }

    /// Whether job `id` could fit once the turn now running ends (its job held, then
    /// swapped out like any other): what a job waiting for memory needs to be picked for
    /// the next turn while another job still runs.
    fn could_fit(&self, id: &str) -> bool {
        let turn = self.turn.as_ref().map(|t| t.job.as_str());
        self.evictions_with(id, turn).is_some()
    }

    /// [`Scheduler::evictions`], counting job `ending` (the turn about to end) as held.
    fn evictions_with(&self, id: &str, ending: Option<&str>) -> Option<Vec<String>> {
        if self.capacity == 0 {
            return Some(Vec::new());
        }
        let total = self.total_resident().saturating_add(self.job_need(id));
        let mut over = total.saturating_sub(self.usable());
        if over == 0 {
            return Some(Vec::new());
        }
        let prio = self.config.job(id).priority;
        let mut candidates: Vec<(&String, &Job)> = self
            .jobs
            .iter()
            .filter(|(other, j)| {
                *other != id
                    && self.config.job(other).priority <= prio
                    && (ending == Some(other.as_str())
                        || j.pids.iter().all(|pid| {
                            self.procs
                                .get(pid)
                                .is_none_or(|p| !p.open && p.pending.is_none())
                        }))
                    && self.job_sum(other, |p| p.seen.resident) > 0
            })
            .collect();
        candidates.sort_by(|a, b| a.1.last_run.cmp(&b.1.last_run).then(a.0.cmp(b.0)));
        let mut victims = Vec::new();
        let mut room = self.host_room.unwrap_or(u64::MAX);
        for (other, _) in candidates {
            let bytes = self.job_sum(other, |p| p.seen.resident);
            // What the host must find for it (beyond what the job keeps there already):
            // more than it has, the job stays (the next may fit).
            let cost = bytes.saturating_sub(self.job_sum(other, |p| p.seen.host_kept));
            if cost > room {
                continue;
            }
            room -= cost;
            victims.push(other.clone());
            over = over.saturating_sub(bytes);
            if over == 0 {
                return Some(victims);
            }
        }
        None
    }

    /// Whether job `id` may start a turn now (memory aside).
    fn eligible(&self, id: &str, now: Instant) -> bool {
        let Some(j) = self.jobs.get(id) else {
            return false;
        };
        j.wanting && j.backoff_until.is_none_or(|t| t <= now) && self.under_limit(id, now)
    }

    /// The job that should have the GPU next among those that want it, other than
    /// `except`: the least virtual time, then the least recently run.
    fn best(&self, except: Option<&str>, now: Instant) -> Option<String> {
        self.jobs
            .iter()
            .filter(|(id, _)| Some(id.as_str()) != except)
            .filter(|(id, _)| self.eligible(id, now) && self.could_fit(id))
            .map(|(id, j)| (self.vtime(id, now), j.last_run, id))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(b.2)))
            .map(|(_, _, id)| id.clone())
    }

    // ---- turns --------------------------------------------------------------------

    fn issue(&mut self, out: &mut Vec<Action>, action: Action, now: Instant) {
        let pid = action.pid();
        if let Some(p) = self.procs.get_mut(&pid) {
            if p.pending.is_none() {
                p.pending = Some((action.clone(), now));
                out.push(action);
            }
        }
    }

    fn set_phase(&mut self, id: &str, phase: Phase) {
        if let Some(t) = &mut self.turn {
            if t.job == id {
                t.phase = phase;
            }
        }
    }

    fn job_pending(&self, id: &str) -> bool {
        self.jobs.get(id).is_some_and(|j| {
            j.pids
                .iter()
                .any(|pid| self.procs.get(pid).is_some_and(|p| p.pending.is_some()))
        })
    }

    fn any_pending_outside(&self, id: &str) -> bool {
        self.procs
            .values()
            .any(|p| p.job != id && p.pending.is_some())
    }

    fn any_open_outside(&self, id: &str) -> bool {
        self.procs.values().any(|p| p.job != id && p.open)
    }

    /// Every process of the turn's job is held, none with an action outstanding.
    fn turn_drained(&self) -> bool {
        let Some(t) = &self.turn else {
            return false;
        };
        self.jobs.get(&t.job).is_none_or(|j| {
            j.pids.iter().all(|pid| {
                self.procs
                    .get(pid)
                    .is_none_or(|p| !p.open && p.pending.is_none())
            })
        })
    }

    /// Its turn's length from its start: its quantum, at least [`SWAP_FACTOR`] times the
    /// swap that prepared it, at most what its limit allows.
    fn turn_length(&self, id: &str, now: Instant) -> Duration {
        let q = self.quantum_for(id);
        match self.budget(id, now) {
            Some(b) => q.min(b.max(self.config.min_quantum)),
            None => q,
        }
    }

    fn start_running(&mut self, id: &str, now: Instant, swap: Duration) {
        let len = self
            .turn_length(id, now)
            .max(swap.saturating_mul(SWAP_FACTOR));
        self.turn = Some(Turn {
            job: id.to_owned(),
            phase: Phase::Running { end: now + len },
            since: Some(now),
        });
        self.settled_from = Some(now);
        if let Some(j) = self.jobs.get_mut(id) {
            j.mem_blocked = false;
        }
    }

    /// The turn is over: its GPU time is the job's.
    fn end_turn(&mut self, now: Instant) {
        let Some(t) = self.turn.take() else {
            return;
        };
        let w = self.weight(&t.job);
        if let Some(j) = self.jobs.get_mut(&t.job) {
            if let Some(since) = t.since {
                let used = now.saturating_duration_since(since);
                j.gpu += used;
                j.vtime += used.as_secs_f64() / w;
                j.runs.push_back((since, now));
                j.last_run = now;
            }
            j.turn_ended = Some(now);
        }
    }

    fn abort_turn(&mut self, id: &str, now: Instant) {
        self.turn = None;
        let backoff = self.config.max_quantum;
        if let Some(j) = self.jobs.get_mut(id) {
            j.backoff_until = Some(now + backoff);
            if !j.mem_blocked {
                j.mem_blocked = true;
                j.memory_waits += 1;
            }
        }
    }

    fn prune(&mut self, now: Instant) {
        let Some(from) = now.checked_sub(SHARE_WINDOW.max(LIMIT_WINDOW)) else {
            return;
        };
        for j in self.jobs.values_mut() {
            while j.runs.front().is_some_and(|&(_, e)| e < from) {
                j.runs.pop_front();
            }
        }
    }

    fn update_wanting(&mut self, id: &str, now: Instant) {
        let wanting = self.jobs.get(id).is_some_and(|j| {
            j.pids.iter().any(|pid| {
                self.procs
                    .get(pid)
                    .is_some_and(|p| p.seen.waiting || p.need > 0)
            })
        });
        let was = self.jobs.get(id).is_some_and(|j| j.wanting);
        if wanting && !was {
            let floor = self.vfloor(Some(id), now);
            let is_turn = self.turn.as_ref().is_some_and(|t| {
                t.job == id && matches!(t.phase, Phase::Running { .. } | Phase::Releasing { .. })
            });
            let holds_gpu = self.turn.as_ref().is_some_and(|t| t.job == id);
            if let Some(j) = self.jobs.get_mut(id) {
                if !holds_gpu && j.turn_ended.is_none() {
                    j.vtime = j.vtime.max(floor);
                }
                if !is_turn {
                    j.waits += 1;
                }
            }
        }
        // Once every process of it was looked at after its turn, a start of wanting follows
        // a time without.
        let looked_at_all = self.jobs.get(id).is_some_and(|j| {
            j.turn_ended.is_some_and(|ended| {
                j.pids.iter().all(|pid| {
                    self.procs
                        .get(pid)
                        .is_none_or(|p| p.seen_at.is_some_and(|at| at >= ended))
                })
            })
        });
        if let Some(j) = self.jobs.get_mut(id) {
            j.wanting = wanting;
            if !wanting {
                j.mem_blocked = false;
            }
            if looked_at_all {
                j.turn_ended = None;
            }
        }
    }

    /// Holds every process of job `id` whose gate may be open.
    fn hold_job(&mut self, id: &str, now: Instant, out: &mut Vec<Action>) {
        let pids: Vec<Pid> = self.jobs.get(id).map_or(Vec::new(), |j| {
            j.pids
                .iter()
                .copied()
                .filter(|pid| {
                    self.procs.get(pid).is_some_and(|p| {
                        p.open && p.pending.is_none() && p.retry_at.is_none_or(|t| t <= now)
                    })
                })
                .collect()
        });
        for pid in pids {
            self.issue(out, Action::Hold(pid), now);
        }
    }

    /// The running job's quantum is over: it goes on if no job that wants the GPU should
    /// go before it and its limit allows; else it is held.
    fn end_of_quantum(&mut self, id: &str, now: Instant, out: &mut Vec<Action>) {
        let over = match self.budget(id, now) {
            Some(b) => {
                b < self
                    .config
                    .min_quantum
                    .min(self.budget_needed(id))
                    .max(Duration::from_micros(1))
            }
            None => false,
        };
        let mine = self.vtime(id, now);
        let yield_to = self
            .best(Some(id), now)
            .is_some_and(|other| self.vtime(&other, now) <= mine);
        if over || yield_to {
            self.set_phase(id, Phase::Draining);
            self.hold_job(id, now, out);
        } else {
            let len = self.turn_length(id, now);
            self.set_phase(id, Phase::Running { end: now + len });
        }
    }

    /// While job `id` runs, an allocation of it that waits is given room by swapping out
    /// jobs that may be swapped out for it.
    fn make_room_for_running(&mut self, id: &str, now: Instant, out: &mut Vec<Action>) {
        let need = self.job_sum(id, |p| p.need);
        if need == 0 {
            return;
        }
        // Its allocation still waits, settled (no swap under way, time to try again since
        // the last), though the accounting says it fits: that much more is on the GPU than
        // the accounting sees (the contexts, at the least).
        let seen_at = self.jobs.get(id).and_then(|j| {
            j.pids
                .iter()
                .filter_map(|pid| self.procs.get(pid)?.need_at)
                .max()
        });
        let settled = seen_at.is_some_and(|at| {
            self.settled_from
                .is_none_or(|t| at.saturating_duration_since(t) >= SETTLE)
        }) && self.procs.values().all(|p| p.pending.is_none());
        let learnt = self.job_sum(id, |p| u64::from(p.learnt)) > 0;
        // Only with a known capacity (the daemon passes u64::MAX for unknown), and once a
        // wait: an eviction that did not let it through (another daemon's claims, a broken
        // ledger entry) must not cascade into swapping every job out.
        if self.capacity > 0 && self.capacity != u64::MAX && settled && !learnt {
            let free = self.usable().saturating_sub(self.total_resident());
            if free >= need {
                self.unseen = self
                    .unseen
                    .saturating_add(free - need)
                    .saturating_add(UNSEEN_SLACK)
                    .min(self.capacity);
                self.settled_from = Some(now);
                let pids: Vec<Pid> = self.jobs.get(id).map_or(Vec::new(), |j| j.pids.clone());
                for pid in &pids {
                    if let Some(p) = self.procs.get_mut(pid) {
                        if p.need > 0 {
                            p.learnt = true;
                        }
                    }
                }
            }
        }
        if let Some(victims) = self.evictions(id) {
            self.swap_out(&victims, now, out);
        }
    }

    /// The device memory jobs may have: the capacity less what the accounting misses.
    fn usable(&self) -> u64 {
        self.capacity.saturating_sub(self.unseen)
    }

    /// Device memory on the GPU the accounting does not see, as learnt so far (bytes).
    pub fn unseen(&self) -> u64 {
        self.unseen
    }

    fn swap_out(&mut self, victims: &[String], now: Instant, out: &mut Vec<Action>) {
        for v in victims {
            let pids: Vec<Pid> = self.jobs.get(v).map_or(Vec::new(), |j| j.pids.clone());
            let mut any = false;
            let mut bytes = 0u64;
            for pid in pids {
                let resident = self.procs.get(&pid).map_or(0, |p| p.seen.resident);
                if resident > 0 {
                    let before = out.len();
                    self.issue(out, Action::SwapOut(pid), now);
                    if out.len() > before {
                        any = true;
                        bytes = bytes.saturating_add(resident);
                    }
                }
            }
            if any {
                if let Some(j) = self.jobs.get_mut(v) {
                    j.swaps += 1;
                    j.swapped_out = j.swapped_out.saturating_add(bytes);
                }
            }
        }
    }

    /// Issues the swaps job `id`'s turn needs; false if it cannot fit.
    fn prepare(&mut self, id: &str, now: Instant, out: &mut Vec<Action>) -> bool {
        let Some(victims) = self.evictions(id) else {
            return false;
        };
        let before = out.len();
        self.swap_out(&victims, now, out);
        if out.len() > before {
            // The swap-ins wait for the swap-outs to be done (a later tick): the daemon
            // carries out actions of different processes at once, and a swap-in begun
            // before the memory it needs was given back would be refused.
            return true;
        }
        let pids: Vec<Pid> = self.jobs.get(id).map_or(Vec::new(), |j| j.pids.clone());
        for pid in pids {
            if self.procs.get(&pid).is_some_and(|p| p.seen.swapped > 0) {
                self.issue(out, Action::SwapIn(pid), now);
            }
        }
        true
    }

    fn release(&mut self, id: &str, swap: Duration, now: Instant, out: &mut Vec<Action>) {
        if self.any_open_outside(id) {
            // Not while another job's process may run: tried again at the next tick.
            return;
        }
        self.set_phase(id, Phase::Releasing { swap });
        let pids: Vec<Pid> = self.jobs.get(id).map_or(Vec::new(), |j| j.pids.clone());
        let mut any = false;
        for pid in pids {
            if self
                .procs
                .get(&pid)
                .is_some_and(|p| !p.open && p.pending.is_none())
            {
                self.issue(out, Action::Release(pid), now);
                any = true;
            }
        }
        if !any {
            // Its processes are open already (found running): its turn runs now.
            self.start_running(id, now, swap);
        }
    }

    /// No job has the GPU: the one found running takes it, or the next by the policy.
    fn start_next(&mut self, now: Instant, out: &mut Vec<Action>) {
        let open_jobs: BTreeSet<&str> = self
            .procs
            .values()
            .filter(|p| p.open || matches!(p.pending, Some((Action::Release(_), _))))
            .map(|p| p.job.as_str())
            .collect();
        if !open_jobs.is_empty() {
            // Running ungated (joined, or a hold failed): if one job alone, it has the GPU.
            if open_jobs.len() == 1 {
                let id = open_jobs
                    .iter()
                    .next()
                    .map(|s| s.to_string())
                    .unwrap_or_default();
                if !self.job_pending(&id) {
                    self.start_running(&id, now, Duration::ZERO);
                }
            }
            return;
        }
        if self.procs.values().any(|p| p.pending.is_some()) {
            return;
        }
        // Jobs that want the GPU and cannot fit wait; say so once per wait.
        let blocked: Vec<String> = self
            .jobs
            .keys()
            .filter(|id| self.eligible(id, now) && !self.could_fit(id))
            .cloned()
            .collect();
        for id in blocked {
            if let Some(j) = self.jobs.get_mut(&id) {
                if !j.mem_blocked {
                    j.mem_blocked = true;
                    j.memory_waits += 1;
                }
            }
        }
        let Some(next) = self.best(None, now) else {
            return;
        };
        self.turn = Some(Turn {
            job: next.clone(),
            phase: Phase::Preparing {
                started: now,
                failed: false,
            },
            since: None,
        });
        if self.fits_now(&next) {
            self.release(&next, Duration::ZERO, now, out);
        } else if !self.prepare(&next, now, out) {
            self.abort_turn(&next, now);
        }
    }
}

//! A deterministic simulation of one GPU, its processes and the daemon that carries out
//! the scheduler's actions, on a fake clock of 1 ms steps.
//!
//! - Each process has a workload (always busy, bursts, idle) and device memory; the GPU
//!   runs the work of the processes whose gates are open (and, while a hold drains, the
//!   work already in flight).
//! - The daemon observes every process every `poll_ms`, calls `tick` after every
//!   observation, every action done and at `next_deadline`, and carries out the actions in
//!   order, one at a time: a hold drains in 1–3 ms (pseudo-random, seeded), a release is
//!   immediate, a swap moves its bytes at `bandwidth` bytes per ms.
//! - It checks, at every step, what must always hold: no release while another job's
//!   process may run, no action for a process whose last one is outstanding, never more
//!   memory resident than the card has.

#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use cudaw_sched::{Action, Config, JobReport, Observation, Outcome, Pid, Scheduler};

pub const GIB: u64 = 1 << 30;

/// What a process asks of the GPU.
#[derive(Debug, Clone, Copy)]
pub enum Load {
    /// Always has work queued.
    Busy,
    /// `work_ms` of GPU work arrives at the start of every `period_ms`.
    Bursty { period_ms: u64, work_ms: u64 },
    /// Never launches anything.
    Idle,
}

#[derive(Debug)]
pub struct Proc {
    pub job: String,
    pub load: Load,
    /// Work queued, in GPU ms.
    pub backlog: u64,
    pub gate_open: bool,
    /// A hold of it is draining: in-flight work still runs.
    pub draining: bool,
    /// The device memory it needs to make progress (allocated when it first runs).
    pub footprint: u64,
    pub resident: u64,
    pub swapped: u64,
    /// GPU ms it got (work done).
    pub progress: u64,
    /// Host memory it keeps between pauses (the host arena).
    pub host_kept: u64,
}

impl Proc {
    fn has_work(&self) -> bool {
        match self.load {
            Load::Busy => true,
            Load::Bursty { .. } => self.backlog > 0,
            Load::Idle => false,
        }
    }

    /// Bytes an allocation of it waits for.
    fn need(&self) -> u64 {
        if self.swapped == 0 && self.resident < self.footprint {
            self.footprint - self.resident
        } else {
            0
        }
    }
}

/// One action the daemon carried out.
#[derive(Debug, Clone)]
pub struct Done {
    pub issued_ms: u64,
    pub done_ms: u64,
    pub action: Action,
    pub ok: bool,
}

pub struct Sim {
    pub sched: Scheduler,
    pub t0: Instant,
    pub ms: u64,
    pub procs: BTreeMap<Pid, Proc>,
    pub capacity: u64,
    /// Bytes a swap moves per ms.
    pub bandwidth: u64,
    pub poll_ms: u64,
    /// Actions given, not yet started.
    queue: VecDeque<(Action, u64)>,
    /// The action being carried out: (action, issued, finishes at).
    current: Option<(Action, u64, u64)>,
    rng: u64,
    /// GPU ms per job.
    pub busy: BTreeMap<String, u64>,
    /// Every action given, with its time.
    pub given: Vec<(u64, Action)>,
    /// Every action done.
    pub done: Vec<Done>,
    /// Ms in which two jobs' work ran at once.
    pub overlap_ms: u64,
    /// A hold drains in this many ms (else 1–3 ms, pseudo-random).
    pub hold_ms: Option<u64>,
    /// Holds of these pids fail (that many times).
    pub fail_holds: BTreeMap<Pid, u32>,
    /// Priorities, for the swap checks.
    pub priority: BTreeMap<String, i32>,
    /// Each swap out given: (ms, the victim's job, the other jobs with memory resident).
    pub swap_outs: Vec<(u64, String, Vec<String>)>,
}

impl Sim {
    pub fn new(capacity: u64, config: &Config) -> Sim {
        Sim {
            sched: Scheduler::new(capacity, config),
            t0: Instant::now(),
            ms: 0,
            procs: BTreeMap::new(),
            capacity,
            bandwidth: 50 * GIB / 1000,
            poll_ms: 10,
            queue: VecDeque::new(),
            current: None,
            rng: 0x9e37_79b9_7f4a_7c15,
            busy: BTreeMap::new(),
            given: Vec::new(),
            done: Vec::new(),
            overlap_ms: 0,
            hold_ms: None,
            fail_holds: BTreeMap::new(),
            priority: BTreeMap::new(),
            swap_outs: Vec::new(),
        }
    }

    pub fn now(&self) -> Instant {
        self.t0 + Duration::from_millis(self.ms)
    }

    /// A process of `job` starts, ungated, with `footprint` bytes to allocate when it
    /// runs (it holds them already if `resident`).
    pub fn spawn(&mut self, pid: Pid, job: &str, load: Load, footprint: u64, resident: bool) {
        self.procs.insert(
            pid,
            Proc {
                job: job.to_owned(),
                load,
                backlog: 0,
                gate_open: true,
                draining: false,
                footprint,
                resident: if resident { footprint } else { 0 },
                swapped: 0,
                progress: 0,
                host_kept: 0,
            },
        );
        let now = self.now();
        self.sched.join(pid, job, now);
        self.tick();
    }

    /// Process `pid` exits.
    pub fn kill(&mut self, pid: Pid) {
        self.procs.remove(&pid);
        self.queue.retain(|(a, _)| a.pid() != pid);
        let now = self.now();
        self.sched.leave(pid, now);
        self.tick();
    }

    fn rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn resident_total(&self) -> u64 {
        self.procs.values().map(|p| p.resident).sum()
    }

    /// Starts the next queued action, if none is being carried out.
    fn start_next(&mut self) {
        if self.current.is_some() {
            return;
        }
        let Some((action, issued)) = self.queue.pop_front() else {
            return;
        };
        let pid = action.pid();
        let hold_ms = match self.hold_ms {
            Some(ms) => ms,
            None => 1 + self.rand() % 3,
        };
        let Some(p) = self.procs.get_mut(&pid) else {
            // Gone: the daemon reports it failed.
            self.finish(action, issued, false);
            return;
        };
        let dur = match action {
            Action::Hold(_) => {
                p.gate_open = false;
                p.draining = true;
                hold_ms
            }
            Action::Release(_) => 0,
            Action::SwapOut(_) => p.resident.div_ceil(self.bandwidth),
            Action::SwapIn(_) => p.swapped.div_ceil(self.bandwidth),
        };
        self.current = Some((action, issued, self.ms + dur));
    }

    /// The action being carried out ends now.
    fn finish(&mut self, action: Action, issued: u64, exists: bool) {
        let pid = action.pid();
        let mut ok = exists;
        if exists {
            let total = self.resident_total();
            let capacity = self.capacity;
            let fail_hold = match self.fail_holds.get_mut(&pid) {
                Some(n) if *n > 0 && matches!(action, Action::Hold(_)) => {
                    *n -= 1;
                    true
                }
                _ => false,
            };
            let p = self.procs.get_mut(&pid).expect("exists");
            match action {
                Action::Hold(_) => {
                    p.draining = false;
                    if fail_hold {
                        // The process did not answer in time: its gate may still be open.
                        p.gate_open = true;
                        ok = false;
                    }
                }
                Action::Release(_) => {
                    let job = p.job.clone();
                    let others_may_run = self
                        .procs
                        .values()
                        .any(|q| q.job != job && (q.gate_open || q.draining));
                    assert!(
                        !others_may_run,
                        "at {} ms: {action:?} of {job} while another job's process may run",
                        self.ms
                    );
                    let p = self.procs.get_mut(&pid).expect("exists");
                    p.gate_open = true;
                }
                Action::SwapOut(_) => {
                    p.swapped += p.resident;
                    p.resident = 0;
                }
                Action::SwapIn(_) => {
                    if total + p.swapped > capacity {
                        ok = false;
                    } else {
                        p.resident += p.swapped;
                        p.swapped = 0;
                    }
                }
            }
        }
        self.done.push(Done {
            issued_ms: issued,
            done_ms: self.ms,
            action: action.clone(),
            ok,
        });
        let outcome = if ok {
            Outcome::Done
        } else {
            Outcome::Failed("simulated failure".into())
        };
        let now = self.now();
        self.sched.done(&action, outcome, now);
    }

    fn tick(&mut self) {
        let now = self.now();
        let actions = self.sched.tick(now);
        for a in actions {
            let pid = a.pid();
            let outstanding = self.queue.iter().any(|(q, _)| q.pid() == pid)
                || self
                    .current
                    .as_ref()
                    .is_some_and(|(c, _, _)| c.pid() == pid);
            assert!(
                !outstanding,
                "at {} ms: {a:?} given while an action of {pid} is outstanding",
                self.ms
            );
            assert!(
                self.procs.contains_key(&pid),
                "{a:?} for an unknown process"
            );
            if let Action::SwapOut(v) = &a {
                self.note_swap_out(*v);
            }
            self.given.push((self.ms, a.clone()));
            self.queue.push_back((a, self.ms));
        }
        self.start_next();
    }

    fn note_swap_out(&mut self, pid: Pid) {
        let victim = self.procs[&pid].job.clone();
        let mut others: Vec<String> = Vec::new();
        for p in self.procs.values() {
            if p.job != victim && p.resident > 0 && !others.contains(&p.job) {
                others.push(p.job.clone());
            }
        }
        self.swap_outs.push((self.ms, victim, others));
    }

    /// Runs the simulation for `ms` more milliseconds.
    pub fn run(&mut self, ms: u64) {
        let end = self.ms + ms;
        while self.ms < end {
            self.step();
        }
    }

    fn step(&mut self) {
        self.ms += 1;
        let mut acted = false;
        // Actions that end now (a release ends as it starts: several may end in one ms).
        while let Some((action, issued, at)) = self.current.clone() {
            if at > self.ms {
                break;
            }
            self.current = None;
            let exists = self.procs.contains_key(&action.pid());
            self.finish(action, issued, exists);
            acted = true;
            self.tick();
        }
        // Work arrives and runs.
        let ms = self.ms;
        let capacity = self.capacity;
        let mut running_jobs: Vec<String> = Vec::new();
        let pids: Vec<Pid> = self.procs.keys().copied().collect();
        for pid in pids {
            let total = self.resident_total();
            let p = self.procs.get_mut(&pid).expect("listed");
            if let Load::Bursty { period_ms, work_ms } = p.load {
                if ms.checked_rem(period_ms) == Some(0) {
                    p.backlog += work_ms;
                }
            }
            if p.gate_open && p.need() > 0 && total + p.need() <= capacity {
                p.resident = p.footprint;
            }
            let ready = p.resident == p.footprint && p.swapped == 0;
            if (p.gate_open || p.draining) && p.has_work() && ready {
                p.progress += 1;
                if p.backlog > 0 {
                    p.backlog -= 1;
                }
                if !running_jobs.contains(&p.job) {
                    running_jobs.push(p.job.clone());
                }
            }
        }
        if running_jobs.len() > 1 {
            self.overlap_ms += 1;
        }
        for j in running_jobs {
            *self.busy.entry(j).or_default() += 1;
        }
        assert!(
            self.resident_total() <= self.capacity,
            "at {ms} ms: {} bytes resident on a card of {}",
            self.resident_total(),
            self.capacity
        );
        // The daemon observes.
        let now = self.now();
        if self.ms.checked_rem(self.poll_ms) == Some(0) {
            let seen: Vec<(Pid, Observation, u64)> = self
                .procs
                .iter()
                .map(|(&pid, p)| {
                    let waiting = !p.gate_open && (p.has_work() || p.need() > 0);
                    (
                        pid,
                        Observation {
                            waiting,
                            resident: p.resident,
                            swapped: p.swapped,
                            launches: p.progress,
                            host_kept: p.host_kept,
                        },
                        p.need(),
                    )
                })
                .collect();
            for (pid, o, need) in seen {
                self.sched.observe(pid, o, now);
                self.sched.alloc_wait(pid, need, now);
            }
            acted = true;
        }
        if acted || self.sched.next_deadline().is_some_and(|d| d <= now) {
            self.tick();
        }
    }

    /// A job's GPU ms.
    pub fn busy_ms(&self, job: &str) -> u64 {
        self.busy.get(job).copied().unwrap_or(0)
    }

    /// Resets the GPU-time counters (to measure from now).
    pub fn reset_busy(&mut self) {
        self.busy.clear();
    }

    pub fn holds(&self) -> usize {
        self.given
            .iter()
            .filter(|(_, a)| matches!(a, Action::Hold(_)))
            .count()
    }

    pub fn report(&self, job: &str) -> JobReport {
        let now = self.now();
        self.sched
            .report(now)
            .into_iter()
            .find(|r| r.id == job)
            .unwrap_or_else(|| panic!("job {job} not in the report"))
    }

    pub fn job_of(&self, pid: Pid) -> Option<String> {
        self.procs.get(&pid).map(|p| p.job.clone())
    }
}

/// `[[job]]` tables for `(id, request, limit)`.
pub fn config(jobs: &[(&str, f64, f64)]) -> Config {
    let mut text = String::new();
    for (id, request, limit) in jobs {
        text.push_str(&format!(
            "[[job]]\nid = \"{id}\"\nrequest = {request:?}\nlimit = {limit:?}\n\n"
        ));
    }
    Config::parse(&text).expect("a valid config")
}

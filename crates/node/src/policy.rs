//! The policy the daemon consults, one per GPU: [`cudaw_sched::Scheduler`] in `cudaw node`,
//! a scripted stand-in in the tests (the daemon's discovery, execution and reporting do not
//! depend on how turns are chosen).

use cudaw_sched::{Action, Config, JobReport, Observation, Outcome, Pid, Scheduler};
use std::time::Instant;

/// One GPU's schedule, as the daemon drives it ([`Scheduler`]'s methods).
pub trait Policy: Send {
    /// Applies a new configuration.
    fn set_config(&mut self, config: &Config, now: Instant);
    /// Process `pid` of job `job` joined.
    fn join(&mut self, pid: Pid, job: &str, now: Instant);
    /// Process `pid` is gone.
    fn leave(&mut self, pid: Pid, now: Instant);
    /// What the daemon saw of process `pid` now.
    fn observe(&mut self, pid: Pid, seen: Observation, now: Instant);
    /// An allocation of process `pid` waits for `bytes` it does not have (0: none).
    fn alloc_wait(&mut self, _pid: Pid, _bytes: u64, _now: Instant) {}
    /// The host memory swaps out may take now (`None`: not known).
    fn host_room(&mut self, _bytes: Option<u64>) {}
    /// An action returned by [`Policy::tick`] ended.
    fn done(&mut self, action: &Action, outcome: Outcome, now: Instant);
    /// What to do now.
    fn tick(&mut self, now: Instant) -> Vec<Action>;
    /// When the schedule next changes by itself.
    fn next_deadline(&self) -> Option<Instant>;
    /// Every job on this GPU.
    fn report(&self, now: Instant) -> Vec<JobReport>;
    /// Device memory the accounting does not see, as learnt so far (bytes).
    fn unseen(&self) -> u64 {
        0
    }
}

/// Makes a GPU's policy: its capacity in bytes and the configuration in force.
pub type MakePolicy = dyn Fn(u64, &Config) -> Box<dyn Policy> + Send;

/// `cudaw node`'s policy: cudaw-sched's [`Scheduler`].
pub fn scheduler(capacity: u64, config: &Config) -> Box<dyn Policy> {
    Box::new(Scheduler::new(capacity, config))
}

impl Policy for Scheduler {
    fn set_config(&mut self, config: &Config, now: Instant) {
        Scheduler::set_config(self, config, now)
    }
    fn join(&mut self, pid: Pid, job: &str, now: Instant) {
        Scheduler::join(self, pid, job, now)
    }
    fn leave(&mut self, pid: Pid, now: Instant) {
        Scheduler::leave(self, pid, now)
    }
    fn observe(&mut self, pid: Pid, seen: Observation, now: Instant) {
        Scheduler::observe(self, pid, seen, now)
    }
    fn alloc_wait(&mut self, pid: Pid, bytes: u64, now: Instant) {
        Scheduler::alloc_wait(self, pid, bytes, now)
    }
    fn host_room(&mut self, bytes: Option<u64>) {
        Scheduler::host_room(self, bytes)
    }
    fn done(&mut self, action: &Action, outcome: Outcome, now: Instant) {
        Scheduler::done(self, action, outcome, now)
    }
    fn tick(&mut self, now: Instant) -> Vec<Action> {
        Scheduler::tick(self, now)
    }
    fn next_deadline(&self) -> Option<Instant> {
        Scheduler::next_deadline(self)
    }
    fn report(&self, now: Instant) -> Vec<JobReport> {
        Scheduler::report(self, now)
    }
    fn unseen(&self) -> u64 {
        Scheduler::unseen(self)
    }
}

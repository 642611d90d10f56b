//! The daemon's loop: discover processes, ask each for its status, feed the GPUs'
//! policies, carry out their actions, publish the report; at SIGTERM, let every process go.

use crate::client::Failure;
use crate::config_file::{Change, ConfigFile};
use crate::exec::{Event, Task, Timing, Worker};
use crate::log::{log_debug as debug, log_info as info, log_warn as warn};
use crate::policy::{MakePolicy, Policy};
use crate::report::{ConfigReport, GpuReport, JobRow, NodeReport, ProcessRow};
use crate::server::Shared;
use cudaw_control::State;
use cudaw_sched::{Action, Observation, Outcome};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// How often the configuration file and the list of run folders are looked at.
const SLOW_PERIOD: Duration = Duration::from_secs(1);
/// How long a socket that did not answer is left alone before it is asked again.
const RETRY: Duration = Duration::from_secs(5);
/// How long stopping waits for the processes to be released and swapped in.
const STOP_WAIT: Duration = Duration::from_secs(120);

/// What the loop needs besides the configuration.
pub struct Setup {
    /// `--run-dir` folders (empty: the defaults).
    pub run_dirs: Vec<PathBuf>,
    /// The daemon's uid (root looks in every user's run folders).
    pub uid: u32,
    /// How often the run folders are scanned and each process asked for its status.
    pub interval: Duration,
    /// The holds' timing.
    pub timing: Timing,
    /// Makes a GPU's policy.
    pub make: Box<MakePolicy>,
}

struct Gpu {
    index: i32,
    capacity: Option<u64>,
    policy: Box<dyn Policy>,
    /// The policy's unseen memory when last logged.
    unseen_logged: u64,
}

struct Proc {
    worker: Worker,
    job: Option<String>,
    gpus: BTreeSet<String>,
    /// A status request is queued or under way.
    polling: bool,
    note: Option<String>,
    /// This daemon swapped the process out (a SwapOut done, no SwapIn done since).
    swapped_by_us: bool,
    /// Paused or released by someone else (an operator, a migration): out of the
    /// schedule until it runs again; never resumed by the daemon.
    foreign: bool,
    /// Actions sent to its worker and not yet done (a status taken meanwhile may show a
    /// swap-in half done: resumed, not yet held).
    acting: u32,
    /// The memory limit it has, as far as the daemon knows (`None`: unknown — none sent
    /// yet, or the last send failed; `Some(None)`: no limit). An unknown one is sent,
    /// "none" too (an earlier daemon may have set one).
    limit_sent: Option<Option<u64>>,
    /// A send failed: not tried again before then.
    limit_retry: Option<Instant>,
    /// This daemon limited it (a limit it set took).
    limited: bool,
}

/// A socket that did not answer: left alone until `until`.
struct Ignored {
    until: Instant,
    reason: String,
}

/// The daemon's state.
pub struct Daemon {
    setup: Setup,
    config: ConfigFile,
    gpus: BTreeMap<String, Gpu>,
    procs: BTreeMap<u32, Proc>,
    ignored: BTreeMap<u32, Ignored>,
    events: Receiver<Event>,
    sender: Sender<Event>,
    stopping: Arc<AtomicBool>,
    shared: Shared,
    dirs: Vec<PathBuf>,
    /// The run folders' locks (two daemons never manage the same folder).
    locks: crate::discover::DirLocks,
    /// Failures logged, by process and reason: each is logged once.
    logged: BTreeSet<(u32, String)>,
    /// The decisions as slices per job (`CUDAW_TRACE=timeline`).
    timeline: Option<crate::timeline::Timeline>,
    /// The host memory swaps may take, as last read.
    host_room: Option<u64>,
}

impl Daemon {
    /// A daemon with the configuration `config`, publishing its report to `shared`.
    pub fn new(setup: Setup, config: ConfigFile, shared: Shared) -> Daemon {
        let (sender, events) = std::sync::mpsc::channel();
        let mut locks = crate::discover::DirLocks::default();
        let dirs = Daemon::managed(&mut locks, &setup);
        Daemon {
            setup,
            config,
            gpus: BTreeMap::new(),
            procs: BTreeMap::new(),
            ignored: BTreeMap::new(),
            events,
            sender,
            stopping: Arc::new(AtomicBool::new(false)),
            shared,
            dirs,
            locks,
            logged: BTreeSet::new(),
            timeline: crate::timeline::Timeline::from_env(),
            host_room: None,
        }
    }

    /// Runs until `stop` is set, then lets every process go ([`Daemon::stop`]).
    pub fn run(&mut self, stop: &AtomicBool) {
        info!(
            "looking for processes under cudaw in {} every {} ms; configuration {}",
            self.dirs_text(),
            self.setup.interval.as_millis(),
            self.config.path().display()
        );
        if let Some(t) = &self.timeline {
            info!(
                "timeline (CUDAW_TRACE=timeline): each job's turns, holds and swaps, written to {} when the daemon stops",
                t.path().display()
            );
        }
        let mut next_scan = Instant::now();
        let mut next_slow = Instant::now() + SLOW_PERIOD;
        let mut next_publish = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now >= next_slow {
                self.poll_config(now);
                self.dirs = Daemon::managed(&mut self.locks, &self.setup);
                next_slow = now + SLOW_PERIOD;
            }
            if now >= next_scan {
                self.scan(now);
                next_scan = now + self.setup.interval;
            }
            self.tick(now);
            if now >= next_publish {
                self.publish(now);
                next_publish = now + self.setup.interval;
            }
            let mut wake = next_scan.min(next_slow).min(next_publish);
            for g in self.gpus.values() {
                if let Some(d) = g.policy.next_deadline() {
                    wake = wake.min(d);
                }
            }
            // Signals set `stop` without waking us: look at it at least every 100 ms. A
            // deadline already past (the policy did not move it) must not make this spin.
            let wait = wake
                .saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(1), Duration::from_millis(100));
            match self.events.recv_timeout(wait) {
                Ok(ev) => {
                    self.handle(ev);
                    while let Ok(ev) = self.events.try_recv() {
                        self.handle(ev);
                    }
                }
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {}
            }
        }
        self.stop();
    }

    /// The run folders to look in that this daemon holds; those another daemon holds
    /// are said once.
    fn managed(locks: &mut crate::discover::DirLocks, setup: &Setup) -> Vec<PathBuf> {
        let (ours, taken) = locks.keep(crate::discover::run_dirs(&setup.run_dirs, setup.uid));
        for d in taken {
            warn!(
                "{}: another cudaw node daemon manages it: its processes are left to that one",
                d.display()
            );
        }
        ours
    }

    fn dirs_text(&self) -> String {
        if self.dirs.is_empty() {
            "no run folder (none exists yet)".into()
        } else {
            self.dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        }
    }

    fn poll_config(&mut self, now: Instant) {
        match self.config.poll() {
            None => {}
            Some(Change::Reloaded) => {
                info!(
                    "configuration {} reloaded: {} job{} named; applied to {} GPU{}",
                    self.config.path().display(),
                    self.config.config().jobs.len(),
                    plural(self.config.config().jobs.len()),
                    self.gpus.len(),
                    plural(self.gpus.len())
                );
                let c = self.config.config().clone();
                for g in self.gpus.values_mut() {
                    g.policy.set_config(&c, now);
                }
                let pids: Vec<u32> = self.procs.keys().copied().collect();
                for pid in pids {
                    self.send_limit(pid);
                }
            }
            Some(Change::Refused(msg)) => warn!("configuration refused: {msg}"),
        }
    }

    /// Finds new and vanished sockets; asks every process for its status; tells the
    /// policies how much host memory swaps may take.
    fn scan(&mut self, now: Instant) {
        let room = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| host_room(&m));
        self.host_room = room;
        // Split between the GPUs: their policies decide apart, the host's memory is one.
        let share = room.map(|r| r / self.gpus.len().max(1) as u64);
        for g in self.gpus.values_mut() {
            g.policy.host_room(share);
        }
        let found = crate::discover::scan(&self.dirs);
        let gone: Vec<u32> = self
            .procs
            .keys()
            .filter(|p| !found.contains_key(p))
            .copied()
            .collect();
        for pid in gone {
            self.forget(pid, "its socket is gone (the process exited)", now);
        }
        self.ignored.retain(|pid, _| found.contains_key(pid));
        self.logged.retain(|(pid, _)| found.contains_key(pid));
        for (pid, socket) in found {
            if self.procs.contains_key(&pid)
                || self.ignored.get(&pid).is_some_and(|i| i.until > now)
            {
                continue;
            }
            debug!("found {}", socket.display());
            let worker = Worker::spawn(
                pid,
                socket,
                self.setup.timing,
                self.sender.clone(),
                Arc::clone(&self.stopping),
            );
            self.procs.insert(
                pid,
                Proc {
                    worker,
                    job: None,
                    gpus: BTreeSet::new(),
                    polling: false,
                    note: Some("not answered yet".into()),
                    swapped_by_us: false,
                    foreign: false,
                    acting: 0,
                    limit_sent: None,
                    limit_retry: None,
                    limited: false,
                },
            );
        }
        for p in self.procs.values_mut() {
            if !p.polling {
                p.polling = p.worker.send(Task::Status);
            }
        }
    }

    /// The process left: every GPU's policy is told.
    fn forget(&mut self, pid: u32, reason: &str, now: Instant) {
        let Some(p) = self.procs.remove(&pid) else {
            return;
        };
        if let Some(t) = &mut self.timeline {
            let job = job_id(pid, p.job.as_deref());
            t.left(pid, &job, now);
        }
        for key in &p.gpus {
            if let Some(g) = self.gpus.get_mut(key) {
                g.policy.leave(pid, now);
            }
        }
        if p.job.is_some() {
            info!("{}: left ({reason})", who(pid, p.job.as_deref()));
        } else {
            debug!("process {pid}: not joined ({reason})");
        }
        // Its worker ends once its queue is done (the sender is dropped here).
        drop(p.worker);
        self.drop_empty_gpus();
    }

    fn drop_empty_gpus(&mut self) {
        let used: BTreeSet<&String> = self.procs.values().flat_map(|p| &p.gpus).collect();
        let empty: Vec<String> = self
            .gpus
            .keys()
            .filter(|k| !used.contains(k))
            .cloned()
            .collect();
        for k in empty {
            self.gpus.remove(&k);
            info!("GPU {k}: no process under cudaw uses it now");
        }
    }

    fn handle(&mut self, ev: Event) {
        let now = Instant::now();
        match ev {
            Event::Status { pid, result } => {
                if let Some(p) = self.procs.get_mut(&pid) {
                    p.polling = false;
                }
                match result {
                    Ok(st) => self.observed(pid, st, now),
                    Err(f) => {
                        let reason = match &f {
                            Failure::Gone(m) => m.clone(),
                            Failure::Failed(m) => format!("it does not answer: {m}"),
                        };
                        if self.procs.contains_key(&pid) {
                            let again = self.ignored.get(&pid).is_some_and(|i| i.reason == reason);
                            if !again && self.procs[&pid].job.is_none() {
                                info!("process {pid}: not joined: {reason}");
                            }
                            self.forget(pid, &reason, now);
                            self.ignored.insert(
                                pid,
                                Ignored {
                                    until: now + RETRY,
                                    reason,
                                },
                            );
                        }
                    }
                }
            }
            Event::Done {
                pid,
                gpu,
                action,
                outcome,
            } => {
                // A process that left meanwhile: its policy has forgotten it.
                let Some(p) = self.procs.get(&pid) else {
                    return;
                };
                let name = who(pid, p.job.as_deref());
                if let Some(p) = self.procs.get_mut(&pid) {
                    p.acting = p.acting.saturating_sub(1);
                }
                if outcome == Outcome::Done {
                    if let Some(p) = self.procs.get_mut(&pid) {
                        match action {
                            Action::SwapOut(_) => p.swapped_by_us = true,
                            Action::SwapIn(_) => p.swapped_by_us = false,
                            _ => {}
                        }
                    }
                }
                match (&action, &outcome) {
                    (_, Outcome::Failed(why)) => {
                        if self.logged.insert((pid, why.clone())) {
                            warn!("{name}: {} failed: {why}", action.name());
                        }
                    }
                    (Action::SwapOut(_), Outcome::Done) => {
                        info!("{name}: swapped out on GPU {gpu}")
                    }
                    (Action::SwapIn(_), Outcome::Done) => info!("{name}: swapped in on GPU {gpu}"),
                    (_, Outcome::Done) => debug!("{name}: {} done on GPU {gpu}", action.name()),
                }
                if let (Some(t), Some(g)) = (&mut self.timeline, self.gpus.get(&gpu)) {
                    let job = job_id(pid, self.procs.get(&pid).and_then(|p| p.job.as_deref()));
                    let ok = outcome == Outcome::Done;
                    t.done(pid, &job, (g.index, &gpu), &action, ok, now);
                }
                if let Some(g) = self.gpus.get_mut(&gpu) {
                    g.policy.done(&action, outcome, now);
                }
            }
            Event::Limited {
                pid,
                memory,
                result,
            } => {
                let Some(p) = self.procs.get_mut(&pid) else {
                    return;
                };
                let name = who(pid, p.job.as_deref());
                match result {
                    Ok(()) => {
                        match memory {
                            Some(b) => info!(
                                "{name}: memory limited to {} on each of its GPUs (its job's `memory`)",
                                crate::report::bytes(b)
                            ),
                            // Every process is told "none" when it joins: said when it
                            // lifts a limit this daemon set.
                            None if p.limited => info!("{name}: memory limit lifted"),
                            None => debug!("{name}: no memory limit"),
                        }
                        p.limited = memory.is_some();
                    }
                    // An older cudaw knows no `limit`: it has none to lift.
                    Err(f) if memory.is_none() && f.to_string().contains("unknown variant") => {
                        debug!("{name}: no memory limit to lift (it knows no limit request)");
                    }
                    Err(f) => {
                        // Unknown now: sent again with a status 30 s on.
                        p.limit_sent = None;
                        p.limit_retry = Some(Instant::now() + LIMIT_RETRY);
                        if self.logged.insert((pid, f.to_string())) {
                            warn!("{name}: setting its memory limit failed: {f}");
                        }
                    }
                }
            }
            Event::Note { pid, warn, message } => {
                let name = who(pid, self.procs.get(&pid).and_then(|p| p.job.as_deref()));
                if warn {
                    warn!("{name}: {message}");
                } else {
                    info!("{name}: {message}");
                }
            }
            Event::Stopped { .. } => {}
        }
    }

    /// A status came: join the process to its GPUs, and tell their policies what it does.
    fn observed(&mut self, pid: u32, st: cudaw_control::Status, now: Instant) {
        let job = job_id(pid, st.job.as_deref());
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        if p.job.as_deref() != Some(job.as_str()) {
            if let Some(old) = p.job.take() {
                info!("process {pid}: its job is now {job} (was {old}): joining again");
                for key in std::mem::take(&mut p.gpus) {
                    if let Some(g) = self.gpus.get_mut(&key) {
                        g.policy.leave(pid, now);
                    }
                }
            }
            p.job = Some(job.clone());
        }
        // Swapped out by an earlier daemon (it stopped or died before it swapped the
        // process in): this daemon's swap now, swapped in at the job's turn.
        if st.state == State::Paused
            && st.busy.is_none()
            && st.paused_by.as_deref() == Some(cudaw_control::NODE_OWNER)
            && !p.swapped_by_us
            && p.acting == 0
        {
            p.swapped_by_us = true;
            p.worker.send(Task::Adopt);
            info!(
                "{}: found swapped out by an earlier daemon: swapped in at its turn",
                who(pid, Some(&job))
            );
        }
        // Swapped out by us, and paused since by an operator (the pause is theirs now: no
        // owner): not ours to swap in; it leaves the schedule as any operator's pause.
        if st.state == State::Paused
            && st.busy.is_none()
            && st.paused_by.as_deref() == Some("")
            && p.swapped_by_us
            && p.acting == 0
        {
            p.swapped_by_us = false;
            p.worker.send(Task::Disown);
            info!(
                "{}: paused by someone else while swapped out: the pause is theirs now",
                who(pid, Some(&job))
            );
        }
        // Swapped out by us and running now: someone resumed it (`cudaw-ckpt resume`).
        // It joins again as a process found running (the policy holds it until its turn).
        if p.swapped_by_us && p.acting == 0 && st.state == State::Running {
            p.swapped_by_us = false;
            info!(
                "{}: resumed by someone else while swapped out: joining the schedule again",
                who(pid, Some(&job))
            );
            for key in std::mem::take(&mut p.gpus) {
                if let Some(g) = self.gpus.get_mut(&key) {
                    g.policy.leave(pid, now);
                }
            }
        }
        // Paused or released by someone else (not a swap of ours): the daemon must not
        // resume it, and must not wait for it (a hold of a released process is refused).
        // It leaves the schedule until it runs again.
        let foreign = matches!(st.state, State::Paused | State::Released)
            && !p.swapped_by_us
            && p.acting == 0;
        if foreign != p.foreign {
            p.foreign = foreign;
            if foreign {
                info!(
                    "{}: paused by someone else ({}): out of the schedule until it runs again",
                    who(pid, Some(&job)),
                    if st.state == State::Released {
                        "its context released"
                    } else {
                        "not a swap of this daemon's"
                    }
                );
            } else {
                info!("{}: runs again: back in the schedule", who(pid, Some(&job)));
            }
        }
        if foreign {
            for key in std::mem::take(&mut p.gpus) {
                if let Some(g) = self.gpus.get_mut(&key) {
                    g.policy.leave(pid, now);
                }
            }
            return;
        }
        let mut now_on = BTreeSet::new();
        for d in &st.devices {
            let key = if d.gpu.is_empty() {
                format!("ordinal-{}", d.ordinal)
            } else {
                d.gpu.clone()
            };
            let gpus_before = self.gpus.len() as u64;
            let gpu = self.gpus.entry(key.clone()).or_insert_with(|| {
                let capacity = d.node_capacity;
                info!(
                    "GPU {key} (ordinal {}{}): first process under cudaw on it",
                    d.ordinal,
                    capacity
                        .map(|c| format!(", {}", crate::report::bytes(c)))
                        .unwrap_or_else(|| ", memory unknown: nothing is swapped for room".into())
                );
                let mut policy =
                    (self.setup.make)(capacity.unwrap_or(u64::MAX), self.config.config());
                // Its share of the host's room until the next scan splits it again.
                policy.host_room(self.host_room.map(|r| r / (gpus_before + 1)));
                Gpu {
                    index: d.ordinal,
                    capacity,
                    policy,
                    unseen_logged: 0,
                }
            });
            if !p.gpus.contains(&key) {
                gpu.policy.join(pid, &job, now);
                p.gpus.insert(key.clone());
                info!(
                    "{}: joined GPU {key} (ordinal {})",
                    who(pid, Some(&job)),
                    d.ordinal
                );
                // Its `gpus`, when they are UUIDs (an index is nvidia-smi's, which the
                // process's ordinal is not): `cudaw run --job` keeps it to them, unless
                // CUDA_VISIBLE_DEVICES said otherwise.
                if let Some(allowed) = &self.config.config().job(&job).gpus {
                    let uuids = allowed.iter().all(|g| g.starts_with("GPU-"));
                    if uuids && !allowed.iter().any(|g| g.eq_ignore_ascii_case(&key)) {
                        warn!(
                            "{}: runs on GPU {key}, not one of its gpus ({}): start it with `cudaw run --job {job}` and without CUDA_VISIBLE_DEVICES to keep it to them",
                            who(pid, Some(&job)),
                            allowed.join(", ")
                        );
                    }
                }
            }
            // In the bytes the node ledger counts: the budget's `used` (allocations
            // rounded to the VMM's granules, driver handles). Evicted and wanted bytes are
            // as requested: each allocation may take up to a granule more once back.
            const GRANULE: u64 = 2 << 20;
            gpu.policy.observe(
                pid,
                Observation {
                    waiting: st.waiting > 0,
                    launches: st.launches,
                    // The arena's pinned pages, which MemAvailable does not count (host
                    // copies kept from a resume are MADV_FREE pages it counts already).
                    host_kept: st.arena,
                    resident: d.used.max(d.resident),
                    swapped: if d.evicted > 0 {
                        d.evicted
                            .saturating_add(d.allocations.saturating_mul(GRANULE))
                    } else {
                        0
                    },
                },
                now,
            );
            // An allocation waiting for room (CUDAW_ALLOC_WAIT): the policy makes it.
            let wanted = if d.wanted > 0 {
                d.wanted.saturating_add(GRANULE)
            } else {
                0
            };
            gpu.policy.alloc_wait(pid, wanted, now);
            now_on.insert(key);
        }
        let left: Vec<String> = p.gpus.difference(&now_on).cloned().collect();
        for key in left {
            p.gpus.remove(&key);
            if let Some(g) = self.gpus.get_mut(&key) {
                g.policy.leave(pid, now);
            }
            info!("{}: no longer on GPU {key}", who(pid, Some(&job)));
        }
        p.note = p
            .gpus
            .is_empty()
            .then(|| "no device memory yet: it joins a GPU at its first allocation".into());
        self.drop_empty_gpus();
        self.send_limit(pid);
    }

    /// The memory limit process `pid` should have: its job's `memory`, on the smallest of
    /// the GPUs it is on when given as a share of the card (`Err`: not known yet).
    fn limit_of(&self, pid: u32) -> Result<Option<u64>, ()> {
        let p = self.procs.get(&pid).ok_or(())?;
        let job = p.job.as_deref().ok_or(())?;
        let Some(spec) = self.config.config().job(job).memory else {
            return Ok(None);
        };
        if let cudaw_sched::MemSpec::Bytes(b) = spec {
            return Ok(Some(b));
        }
        let smallest = p
            .gpus
            .iter()
            .filter_map(|k| self.gpus.get(k).and_then(|g| g.capacity))
            .min()
            .ok_or(())?;
        Ok(Some(spec.bytes(smallest)))
    }

    /// Sends process `pid` its memory limit when it is not the one it was sent last.
    fn send_limit(&mut self, pid: u32) {
        let Ok(want) = self.limit_of(pid) else { return };
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        if p.limit_sent == Some(want) || p.limit_retry.is_some_and(|t| Instant::now() < t) {
            return;
        }
        if p.worker.send(Task::Limit(want)) {
            p.limit_sent = Some(want);
        }
    }

    /// Asks every GPU's policy what to do now, and has it done.
    fn tick(&mut self, now: Instant) {
        let mut refused = Vec::new();
        for (key, g) in &mut self.gpus {
            let actions = g.policy.tick(now);
            let unseen = g.policy.unseen();
            if unseen > g.unseen_logged && g.capacity.is_some() {
                info!(
                    "GPU {key}: an allocation waits where the accounting says it fits: {} MiB on the card are not cudaw's (contexts, other programs); jobs fit in {} MiB from now on",
                    unseen >> 20,
                    g.capacity.unwrap_or(0).saturating_sub(unseen) >> 20
                );
            }
            g.unseen_logged = unseen;
            for action in actions {
                let pid = action.pid();
                let sent = self.procs.get_mut(&pid).is_some_and(|p| {
                    let sent = p.worker.send(Task::Act {
                        gpu: key.clone(),
                        action: action.clone(),
                    });
                    p.acting += u32::from(sent);
                    sent
                });
                if let (true, Some(t)) = (sent, &mut self.timeline) {
                    t.asked(pid, &action, now);
                }
                if !sent {
                    refused.push((key.clone(), action));
                }
            }
        }
        for (key, action) in refused {
            if let Some(g) = self.gpus.get_mut(&key) {
                let pid = action.pid();
                g.policy.done(
                    &action,
                    Outcome::Failed(format!("process {pid} is not known to the daemon")),
                    now,
                );
            }
        }
    }

    /// The report as the status socket and the metrics give it.
    pub fn report(&self, now: Instant) -> NodeReport {
        let mut gpus: Vec<GpuReport> = self
            .gpus
            .iter()
            .map(|(key, g)| GpuReport {
                index: g.index,
                uuid: key.clone(),
                capacity: g.capacity,
                unseen_bytes: g.policy.unseen(),
                jobs: g.policy.report(now).iter().map(JobRow::from).collect(),
            })
            .collect();
        gpus.sort_by(|a, b| (a.index, &a.uuid).cmp(&(b.index, &b.uuid)));
        let loaded = self
            .config
            .loaded()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        NodeReport {
            gpus,
            host_room: self.host_room,
            config: ConfigReport {
                path: self.config.path().display().to_string(),
                loaded,
                error: self.config.error().map(str::to_owned),
                gpus: self
                    .config
                    .config()
                    .jobs
                    .iter()
                    .filter_map(|j| Some((j.id.clone(), j.gpus.clone()?)))
                    .collect(),
                jobs: self
                    .config
                    .config()
                    .jobs
                    .iter()
                    .map(|j| j.id.clone())
                    .collect(),
                default_gpus: self.config.config().default.gpus.clone(),
            },
            processes: self
                .procs
                .iter()
                .map(|(pid, p)| ProcessRow {
                    pid: *pid,
                    job: p.job.clone(),
                    gpus: p.gpus.iter().cloned().collect(),
                    note: p.note.clone(),
                })
                .collect(),
            pid: std::process::id(),
            run_dirs: self.dirs.iter().map(|d| d.display().to_string()).collect(),
        }
    }

    /// Publishes the report for the status socket and the metrics.
    pub fn publish(&self, now: Instant) {
        let r = self.report(now);
        if let Ok(mut s) = self.shared.lock() {
            *s = r;
        }
    }

    /// Lets every process go: a held one is released, one the daemon swapped out resumed;
    /// waits for that (up to two minutes), logging what could not be done.
    pub fn stop(&mut self) {
        self.stopping.store(true, Ordering::Relaxed);
        info!(
            "stopping: letting {} process{} go (held ones released, swapped-out ones swapped in)",
            self.procs.len(),
            if self.procs.len() == 1 { "" } else { "es" }
        );
        let mut waiting: BTreeSet<u32> = BTreeSet::new();
        for (pid, p) in &self.procs {
            if p.worker.send(Task::Stop) {
                waiting.insert(*pid);
            }
        }
        let deadline = Instant::now() + STOP_WAIT;
        while !waiting.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(Event::Stopped { pid }) => {
                    waiting.remove(&pid);
                }
                Ok(ev @ Event::Note { .. }) => self.handle(ev),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        if !waiting.is_empty() {
            warn!(
                "stopping: processes {waiting:?} did not answer within {} s; their gates open by themselves at their holds' lease ({} s)",
                STOP_WAIT.as_secs(),
                self.setup.timing.lease.as_secs()
            );
        }
        for (pid, p) in std::mem::take(&mut self.procs) {
            if !waiting.contains(&pid) {
                p.worker.join();
            }
        }
        if let Some(t) = &self.timeline {
            match t.write() {
                Ok(n) => info!("timeline: {n} slices written to {}", t.path().display()),
                Err(e) => warn!("timeline: writing {} failed: {e}", t.path().display()),
            }
        }
        info!("stopped");
    }
}

/// The host memory swaps out may take, from `/proc/meminfo`'s text: what is available,
/// less a reserve of 5% of the host's memory for everything else (`None`: unreadable).
pub fn host_room(meminfo: &str) -> Option<u64> {
    let kib = |key: &str| -> Option<u64> {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?
            .split_whitespace()
            .next()?
            .parse::<u64>()
            .ok()
            .map(|k| k * 1024)
    };
    let (total, available) = (kib("MemTotal")?, kib("MemAvailable")?);
    Some(available.saturating_sub(total / 20))
}

/// How long after a failed memory-limit request the daemon tries again.
const LIMIT_RETRY: Duration = Duration::from_secs(30);

/// A process's job: the one it claims (`cudaw run --job`), else a job of its own,
/// `pid-PID`.
fn job_id(pid: u32, job: Option<&str>) -> String {
    job.map_or_else(|| format!("pid-{pid}"), str::to_owned)
}

fn who(pid: u32, job: Option<&str>) -> String {
    match job {
        Some(j) => format!("job {j} (PID {pid})"),
        None => format!("process {pid}"),
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

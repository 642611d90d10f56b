//! Carrying out the policy's actions: one worker thread per process, so that a slow
//! process (a swap moving GiB, a kernel running past its quantum) delays no other, while
//! each process's requests go in the order they were given.
//!
//! - `Hold` → `hold` requests with the daemon's window and lease, again until the process
//!   is idle: a process whose device work outlasts its quantum keeps the GPU until that
//!   work ends (a kernel cannot be preempted), and the log says so once.
//! - `Release` → `release`.
//! - `SwapOut` → `pause` (of a held process: it only evicts).
//! - `SwapIn` → `resume`, then a hold as above: the process stays held until its turn.
//! - [`Task::Limit`] → `limit`: its job's `memory` (the daemon sends it when the process
//!   joins and when the configuration changes it).
//!
//! While a process is held the worker renews its hold every `renew` (with an empty window):
//! if the daemon dies, each process opens its own gate at the lease's end and runs on
//! ungated. Stopping ([`Task::Stop`]) releases a held process, resumes one the daemon
//! swapped out and lifts the memory limit it set, so that nothing stays gated behind a
//! daemon that is gone.

use crate::client::{self, Failure};
use cudaw_control::Request;
use cudaw_sched::{Action, Outcome};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a worker is asked to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Task {
    /// Ask the process for its status.
    Status,
    /// Carry out a policy's action (of the GPU named, to report to its policy).
    Act {
        /// The GPU whose policy gave the action.
        gpu: String,
        /// The action.
        action: Action,
    },
    /// Set the process's memory limit (its job's `memory`; `None`: none).
    Limit(Option<u64>),
    /// The process was found swapped out by an earlier daemon: this one's now (it swaps
    /// it in when it stops).
    Adopt,
    /// An operator paused the process this daemon had swapped out: not swapped in when
    /// the daemon stops.
    Disown,
    /// Release the process if held, resume it if the daemon swapped it out, lift a
    /// memory limit it set; then end.
    Stop,
}

/// What a worker reports.
#[derive(Debug)]
pub enum Event {
    /// The process's status, or why it gave none.
    Status {
        /// The process.
        pid: u32,
        /// Its status.
        result: Result<cudaw_control::Status, Failure>,
    },
    /// An action ended.
    Done {
        /// The process.
        pid: u32,
        /// The GPU whose policy gave it.
        gpu: String,
        /// The action.
        action: Action,
        /// How it ended.
        outcome: Outcome,
    },
    /// Something for the log (a process past its quantum; a failed renewal).
    Note {
        /// The process.
        pid: u32,
        /// `true`: a warning; `false`: information.
        warn: bool,
        /// The line.
        message: String,
    },
    /// A memory limit was set, or why not.
    Limited {
        /// The process.
        pid: u32,
        /// The limit asked for.
        memory: Option<u64>,
        /// How it ended.
        result: Result<(), Failure>,
    },
    /// The worker ended after [`Task::Stop`].
    Stopped {
        /// The process.
        pid: u32,
    },
}

/// The holds' timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long one hold waits for the process's calls in flight and device work.
    pub window: Duration,
    /// How long a hold lasts without being renewed: after the daemon dies, processes run
    /// ungated within this.
    pub lease: Duration,
    /// How often a held process's hold is renewed.
    pub renew: Duration,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing {
            window: Duration::from_secs(1),
            lease: Duration::from_secs(5),
            renew: Duration::from_secs(1),
        }
    }
}

/// A process's worker.
pub struct Worker {
    tx: Sender<Task>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    /// Starts the worker of process `pid`, served on `socket`; it reports on `events`
    /// and skips the actions still queued once `stopping` is set.
    pub fn spawn(
        pid: u32,
        socket: PathBuf,
        timing: Timing,
        events: Sender<Event>,
        stopping: Arc<AtomicBool>,
    ) -> Worker {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut w = Proc {
            pid,
            socket,
            timing,
            events,
            stopping,
            gated: false,
            swapped: false,
            limited: false,
            renewed: Instant::now(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("node-{pid}"))
            .spawn(move || w.run(rx))
            .ok();
        Worker { tx, thread }
    }

    /// Queues `task`; `false` if the worker has ended.
    pub fn send(&self, task: Task) -> bool {
        self.thread.is_some() && self.tx.send(task).is_ok()
    }

    /// Waits for the worker to end (after [`Task::Stop`], or once the daemon dropped its
    /// queue and it finished what was queued).
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Proc {
    pid: u32,
    socket: PathBuf,
    timing: Timing,
    events: Sender<Event>,
    stopping: Arc<AtomicBool>,
    /// The daemon holds the process (a hold it made that no release has ended).
    gated: bool,
    /// The daemon swapped the process out and has not swapped it in.
    swapped: bool,
    /// The daemon set a memory limit on the process.
    limited: bool,
    renewed: Instant,
}

impl Proc {
    fn run(&mut self, rx: Receiver<Task>) {
        loop {
            let task = if self.gated {
                let due = self.renewed + self.timing.renew;
                match rx.recv_timeout(due.saturating_duration_since(Instant::now())) {
                    Ok(t) => Some(t),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            } else {
                match rx.recv() {
                    Ok(t) => Some(t),
                    Err(_) => return,
                }
            };
            match task {
                None => {}
                Some(Task::Status) => {
                    let result = client::status(&self.socket, self.pid);
                    let _ = self.events.send(Event::Status {
                        pid: self.pid,
                        result,
                    });
                }
                Some(Task::Act { gpu, action }) => {
                    let outcome = if self.stopping.load(Ordering::Relaxed) {
                        Outcome::Failed("the daemon is stopping".into())
                    } else {
                        self.act(&action)
                    };
                    let _ = self.events.send(Event::Done {
                        pid: self.pid,
                        gpu,
                        action,
                        outcome,
                    });
                }
                Some(Task::Adopt) => self.swapped = true,
                Some(Task::Disown) => self.swapped = false,
                Some(Task::Limit(memory)) => {
                    let result = self.request(&Request::Limit { memory }).map(|_| ());
                    if result.is_ok() {
                        self.limited = memory.is_some();
                    }
                    let _ = self.events.send(Event::Limited {
                        pid: self.pid,
                        memory,
                        result,
                    });
                }
                Some(Task::Stop) => {
                    self.stop();
                    let _ = self.events.send(Event::Stopped { pid: self.pid });
                    return;
                }
            }
            if self.gated && self.renewed.elapsed() >= self.timing.renew {
                self.renew();
            }
        }
    }

    fn request(&self, req: &Request) -> Result<cudaw_control::Reply, Failure> {
        client::request(&self.socket, self.pid, req)
    }

    fn hold_request(&self, window: Duration) -> Request {
        Request::Hold {
            window_ms: window.as_millis() as u64,
            lease_ms: self.timing.lease.as_millis() as u64,
        }
    }

    fn note(&self, warn: bool, message: String) {
        let _ = self.events.send(Event::Note {
            pid: self.pid,
            warn,
            message,
        });
    }

    fn act(&mut self, action: &Action) -> Outcome {
        let result = match action {
            Action::Hold(_) => self.hold(),
            Action::Release(_) => {
                self.gated = false;
                self.request(&Request::Release {}).map(drop)
            }
            Action::SwapOut(_) => self
                .request(&Request::Pause {
                    progress: false,
                    release_context: false,
                    by: Some(cudaw_control::NODE_OWNER.into()),
                })
                .or_else(|f| {
                    // A process of an older cudaw knows no owner: paused without one.
                    if f.to_string().contains("unknown field `by`") {
                        self.request(&Request::PAUSE)
                    } else {
                        Err(f)
                    }
                })
                .and_then(|r| {
                    // Paused already (an operator's pause came first): not a swap of ours.
                    if r.pause.is_some_and(|m| !m.changed) {
                        return Err(Failure::Failed(
                            "it was paused already (by someone else): not swapped out".into(),
                        ));
                    }
                    // The pause took the gate over from the hold: nothing to renew.
                    self.swapped = true;
                    self.gated = false;
                    Ok(())
                }),
            Action::SwapIn(_) => self
                .request(&Request::Resume {
                    progress: false,
                    context_restored: false,
                })
                .and_then(|_| {
                    self.swapped = false;
                    self.hold()
                }),
        };
        match result {
            Ok(()) => Outcome::Done,
            Err(f) => Outcome::Failed(f.to_string()),
        }
    }

    /// Holds the process until it is idle (see the module's doc).
    fn hold(&mut self) -> Result<(), Failure> {
        let started = Instant::now();
        let mut said = false;
        loop {
            let reply = match self.request(&self.hold_request(self.timing.window)) {
                Ok(r) => r,
                Err(f) => {
                    // A failed hold opens the process's gate again.
                    self.gated = false;
                    return Err(f);
                }
            };
            self.gated = true;
            self.renewed = Instant::now();
            let held = reply.hold.unwrap_or_default();
            if held.idle {
                if said {
                    self.note(
                        false,
                        format!(
                            "its device work ended {:.1} s after its quantum: the GPU goes on",
                            started.elapsed().as_secs_f64()
                        ),
                    );
                }
                return Ok(());
            }
            if !said {
                said = true;
                let what = match (held.busy_devices.is_empty(), held.calls_in_flight) {
                    (false, _) => format!(
                        "device work on ordinal{} {:?}",
                        if held.busy_devices.len() == 1 {
                            ""
                        } else {
                            "s"
                        },
                        held.busy_devices
                    ),
                    (true, n) if n > 0 => format!("{n} CUDA call(s) in flight"),
                    _ => "work".to_owned(),
                };
                self.note(
                    true,
                    format!(
                        "still has {what} {:.1} s after its quantum ended: it keeps the GPU until that work ends (a running kernel cannot be preempted); the others wait",
                        self.timing.window.as_secs_f64()
                    ),
                );
            }
            if self.stopping.load(Ordering::Relaxed) {
                return Err(Failure::Failed(
                    "the daemon is stopping (the process was still busy)".into(),
                ));
            }
        }
    }

    /// Renews the hold's lease (an empty window: only the lease).
    fn renew(&mut self) {
        match self.request(&self.hold_request(Duration::ZERO)) {
            Ok(_) => self.renewed = Instant::now(),
            Err(f) => {
                self.gated = false;
                self.note(true, format!("renewing its hold failed: {f}"));
            }
        }
    }

    fn stop(&mut self) {
        if self.limited {
            match self.request(&Request::Limit { memory: None }) {
                Ok(_) => self.limited = false,
                Err(f) => self.note(
                    true,
                    format!("cannot lift its memory limit ({f}); it keeps it until it exits"),
                ),
            }
        }
        if self.swapped {
            match self.request(&Request::Resume {
                progress: false,
                context_restored: false,
            }) {
                Ok(_) => {
                    self.swapped = false;
                    self.gated = false;
                    self.note(false, "swapped in again: the daemon is stopping".into());
                }
                Err(f) => self.note(
                    true,
                    format!(
                        "cannot swap it in again ({f}); it stays paused: `cudaw-ckpt resume {}` resumes it",
                        self.pid
                    ),
                ),
            }
        }
        if self.gated {
            match self.request(&Request::Release {}) {
                Ok(_) => self.gated = false,
                Err(f) => self.note(
                    true,
                    format!(
                        "cannot release it ({f}); its gate opens by itself within {:.0} s",
                        self.timing.lease.as_secs_f64()
                    ),
                ),
            }
        }
    }
}

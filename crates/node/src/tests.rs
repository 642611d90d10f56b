//! The daemon and its workers against a stand-in process: a control socket served by this
//! test process (named after its PID, so that the peer check passes), answering in the
//! protocol of `cudaw-control` and recording every request; and a scripted policy.

use crate::exec::{Event, Task, Timing, Worker};
use crate::policy::Policy;
use cudaw_control::{DeviceStatus, Held, Reply, Request, State, Status};
use cudaw_sched::{Action, Config, JobReport, Observation, Outcome, Pid};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A stand-in for a process under cudaw.
struct Fake {
    dir: tempfile::TempDir,
    requests: Arc<Mutex<Vec<Request>>>,
    /// Holds answered "busy" before the process is idle.
    busy_holds: Arc<AtomicU32>,
}

impl Fake {
    fn start() -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let listener =
            UnixListener::bind(cudaw_control::socket_path(dir.path(), std::process::id())).unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let busy_holds = Arc::new(AtomicU32::new(0));
        let (rq, busy) = (Arc::clone(&requests), Arc::clone(&busy_holds));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let mut line = String::new();
                if BufReader::new(&conn).read_line(&mut line).is_err() {
                    continue;
                }
                let req = Request::parse(&line).unwrap();
                let mut reply = Reply {
                    ok: true,
                    ..Reply::default()
                };
                match &req {
                    Request::Status {} => reply.status = Some(status()),
                    Request::Hold { .. } => {
                        let busy_now = busy.load(Ordering::SeqCst) > 0;
                        if busy_now {
                            busy.fetch_sub(1, Ordering::SeqCst);
                        }
                        reply.hold = Some(Held {
                            idle: !busy_now,
                            busy_devices: if busy_now { vec![0] } else { vec![] },
                            ..Held::default()
                        })
                    }
                    Request::Release {} => reply.release = Some(Held::default()),
                    Request::Pause { .. } => {
                        reply.pause = Some(cudaw_control::Moved {
                            changed: true,
                            ..Default::default()
                        })
                    }
                    Request::Resume { .. } => reply.resume = Some(Default::default()),
                    Request::Limit { memory } => {
                        reply.limit = Some(cudaw_control::Limited {
                            memory: *memory,
                            devices: vec![],
                        })
                    }
                    _ => reply = Reply::error(cudaw_control::ErrorKind::Request, "unexpected"),
                }
                rq.lock().unwrap().push(req);
                let _ = (&conn).write_all(reply.to_line().as_bytes());
            }
        });
        Fake {
            dir,
            requests,
            busy_holds,
        }
    }

    fn socket(&self) -> PathBuf {
        cudaw_control::socket_path(self.dir.path(), std::process::id())
    }

    /// The requests other than status and limit, as names (`hold0` is a hold with an empty window:
    /// a renewal).
    fn actions(&self) -> Vec<String> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| !matches!(r, Request::Status {} | Request::Limit { .. }))
            .map(|r| match r {
                Request::Hold { window_ms: 0, .. } => "hold0".to_owned(),
                r => r.name().to_owned(),
            })
            .collect()
    }

    /// Waits (up to 10 s) until `pred` holds for the actions.
    fn wait_for(&self, what: &str, pred: impl Fn(&[String]) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pred(&self.actions()) {
            assert!(
                Instant::now() < deadline,
                "{what}: not within 10 s; the requests: {:?}",
                self.actions()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn status() -> Status {
    Status {
        pid: std::process::id(),
        state: State::Running,
        addressing: "mapped".into(),
        image: None,
        kept_host: 0,
        arena: 0,
        arena_building: 0,
        devices: vec![DeviceStatus {
            ordinal: 0,
            gpu: "GPU-test".into(),
            resident: 4096,
            node_capacity: Some(1 << 30),
            ..DeviceStatus::default()
        }],
        node_dir: None,
        release_on_pause: false,
        busy: None,
        job: Some("train".into()),
        waiting: 1,
        launches: 77,
        paused_by: None,
    }
}

fn timing() -> Timing {
    Timing {
        window: Duration::from_millis(200),
        lease: Duration::from_secs(5),
        renew: Duration::from_secs(3600),
    }
}

fn worker(fake: &Fake, timing: Timing) -> (Worker, Receiver<Event>, Arc<AtomicBool>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let stopping = Arc::new(AtomicBool::new(false));
    let w = Worker::spawn(
        std::process::id(),
        fake.socket(),
        timing,
        tx,
        Arc::clone(&stopping),
    );
    (w, rx, stopping)
}

fn act(w: &Worker, rx: &Receiver<Event>, action: Action) -> Outcome {
    assert!(w.send(Task::Act {
        gpu: "GPU-test".into(),
        action: action.clone()
    }));
    loop {
        match rx.recv_timeout(Duration::from_secs(10)).expect("an event") {
            Event::Done {
                action: a, outcome, ..
            } => {
                assert_eq!(a, action);
                return outcome;
            }
            Event::Note { .. } => {}
            e => panic!("unexpected {e:?}"),
        }
    }
}

fn stop(w: Worker, rx: &Receiver<Event>) -> Vec<String> {
    assert!(w.send(Task::Stop));
    let mut notes = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(10)).expect("an event") {
            Event::Stopped { .. } => break,
            Event::Note { message, .. } => notes.push(message),
            e => panic!("unexpected {e:?}"),
        }
    }
    w.join();
    notes
}

#[test]
fn actions_become_requests_in_order() {
    let fake = Fake::start();
    let (w, rx, _) = worker(&fake, timing());
    let me = std::process::id();
    assert_eq!(act(&w, &rx, Action::Hold(me)), Outcome::Done);
    assert_eq!(act(&w, &rx, Action::SwapOut(me)), Outcome::Done);
    assert_eq!(act(&w, &rx, Action::SwapIn(me)), Outcome::Done);
    assert_eq!(act(&w, &rx, Action::Release(me)), Outcome::Done);
    assert_eq!(stop(w, &rx), Vec::<String>::new());
    // A swap-in is a resume and a hold: the process stays held until its release. Nothing
    // was held or swapped out at the stop: nothing to undo.
    assert_eq!(
        fake.actions(),
        ["hold", "pause", "resume", "hold", "release"]
    );
    let first = fake.requests.lock().unwrap()[0].clone();
    assert_eq!(
        first,
        Request::Hold {
            window_ms: 200,
            lease_ms: 5000
        }
    );
}

#[test]
fn stopping_releases_the_held_and_resumes_the_swapped_out() {
    let fake = Fake::start();
    let me = std::process::id();
    let (w, rx, _) = worker(&fake, timing());
    assert_eq!(act(&w, &rx, Action::Hold(me)), Outcome::Done);
    stop(w, &rx);
    assert_eq!(fake.actions(), ["hold", "release"]);

    let fake = Fake::start();
    let (w, rx, _) = worker(&fake, timing());
    assert_eq!(act(&w, &rx, Action::Hold(me)), Outcome::Done);
    assert_eq!(act(&w, &rx, Action::SwapOut(me)), Outcome::Done);
    let notes = stop(w, &rx);
    assert_eq!(fake.actions(), ["hold", "pause", "resume"]);
    assert_eq!(notes, ["swapped in again: the daemon is stopping"]);
}

#[test]
fn a_held_process_has_its_lease_renewed() {
    let fake = Fake::start();
    let me = std::process::id();
    let (w, rx, _) = worker(
        &fake,
        Timing {
            renew: Duration::from_millis(20),
            ..timing()
        },
    );
    assert_eq!(act(&w, &rx, Action::Hold(me)), Outcome::Done);
    fake.wait_for("two renewals", |a| {
        a.iter().filter(|x| *x == "hold0").count() >= 2
    });
    assert_eq!(act(&w, &rx, Action::Release(me)), Outcome::Done);
    let n = fake.actions().len();
    // No renewal after the release: it would close the gate again.
    std::thread::sleep(Duration::from_millis(100));
    let after: Vec<String> = fake.actions()[n..].to_vec();
    assert!(after.is_empty(), "renewed after its release: {after:?}");
    stop(w, &rx);
}

#[test]
fn a_process_busy_past_its_quantum_keeps_the_gpu_and_the_log_says_so() {
    let fake = Fake::start();
    fake.busy_holds.store(2, Ordering::SeqCst);
    let me = std::process::id();
    let (w, rx, _) = worker(&fake, timing());
    assert!(w.send(Task::Act {
        gpu: "GPU-test".into(),
        action: Action::Hold(me)
    }));
    let mut notes = Vec::new();
    let outcome = loop {
        match rx.recv_timeout(Duration::from_secs(10)).expect("an event") {
            Event::Done { outcome, .. } => break outcome,
            Event::Note { warn, message, .. } => notes.push((warn, message)),
            e => panic!("unexpected {e:?}"),
        }
    };
    assert_eq!(outcome, Outcome::Done);
    // Held until idle: three holds, one warning, one line when it ends.
    assert_eq!(fake.actions(), ["hold", "hold", "hold"]);
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes[0].0);
    assert_eq!(
        notes[0].1,
        "still has device work on ordinal [0] 0.2 s after its quantum ended: it keeps the GPU until that work ends (a running kernel cannot be preempted); the others wait"
    );
    assert!(!notes[1].0);
    assert!(
        notes[1].1.starts_with("its device work ended "),
        "{notes:?}"
    );
    stop(w, &rx);
}

#[test]
fn a_gone_process_fails_the_action() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let w = Worker::spawn(
        std::process::id(),
        dir.path().join("1.sock"),
        timing(),
        tx,
        Arc::default(),
    );
    let Outcome::Failed(why) = act(&w, &rx, Action::Hold(1)) else {
        panic!("a hold of no process must fail")
    };
    assert!(why.starts_with("connecting to "), "{why}");
    assert!(w.send(Task::Status));
    match rx.recv_timeout(Duration::from_secs(10)).unwrap() {
        Event::Status {
            result: Err(crate::client::Failure::Gone(m)),
            ..
        } => {
            assert!(m.contains("1.sock"), "{m}")
        }
        e => panic!("unexpected {e:?}"),
    }
    stop(w, &rx);
}

/// A policy that holds each process once it joined and reports what it was told.
#[derive(Default)]
struct Scripted {
    log: Arc<Mutex<Vec<String>>>,
    jobs: Vec<(Pid, String, Observation)>,
    due: Vec<Action>,
    config: Option<Config>,
}

impl Policy for Scripted {
    fn set_config(&mut self, config: &Config, _: Instant) {
        self.log
            .lock()
            .unwrap()
            .push(format!("config {:?}", config.quantum));
        self.config = Some(config.clone());
    }
    fn join(&mut self, pid: Pid, job: &str, _: Instant) {
        self.log.lock().unwrap().push(format!("join {job}"));
        self.jobs
            .push((pid, job.to_owned(), Observation::default()));
        self.due.push(Action::Hold(pid));
    }
    fn leave(&mut self, pid: Pid, _: Instant) {
        self.log.lock().unwrap().push("leave".into());
        self.jobs.retain(|j| j.0 != pid);
    }
    fn observe(&mut self, pid: Pid, seen: Observation, _: Instant) {
        for j in &mut self.jobs {
            if j.0 == pid {
                j.2 = seen;
            }
        }
    }
    fn done(&mut self, action: &Action, outcome: Outcome, _: Instant) {
        self.log
            .lock()
            .unwrap()
            .push(format!("done {action:?} {outcome:?}"));
    }
    fn tick(&mut self, _: Instant) -> Vec<Action> {
        std::mem::take(&mut self.due)
    }
    fn next_deadline(&self) -> Option<Instant> {
        None
    }
    fn report(&self, _: Instant) -> Vec<JobReport> {
        self.jobs
            .iter()
            .map(|(pid, id, seen)| JobReport {
                id: id.clone(),
                pids: vec![*pid],
                request: 0.5,
                limit: 1.0,
                memory: None,
                priority: 0,
                achieved_share: 0.0,
                resident_bytes: seen.resident,
                swapped_bytes: seen.swapped,
                swaps: 0,
                swapped_out_bytes: 0,
                launches: seen.launches,
                waits: u64::from(seen.waiting),
                running: false,
                gpu_seconds: 0.0,
                memory_waits: 0,
                weight: 0.5,
                quantum_seconds: 0.05,
            })
            .collect()
    }
}

/// Waits (up to 10 s) for the daemon's report to satisfy `pred`.
fn report_until(
    socket: &std::path::Path,
    what: &str,
    pred: impl Fn(&crate::NodeReport) -> bool,
) -> crate::NodeReport {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = crate::server::query(socket);
        if let Ok(r) = &r {
            if pred(r) {
                return r.clone();
            }
        }
        assert!(Instant::now() < deadline, "{what}: not within 10 s: {r:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_daemon_discovers_holds_reloads_and_lets_go() {
    let fake = Fake::start();
    let d = tempfile::tempdir().unwrap();
    let config = d.path().join("node.toml");
    std::fs::write(&config, "quantum = 30\n").unwrap();
    let socket = d.path().join("node.sock");
    let opts = crate::Options {
        config: config.clone(),
        run_dirs: vec![fake.dir.path().to_path_buf()],
        socket: Some(socket.clone()),
        metrics: None,
        interval: Duration::from_millis(10),
        timing: timing(),
    };
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let l = Arc::clone(&log);
    let stop = Arc::new(AtomicBool::new(false));
    let s = Arc::clone(&stop);
    let daemon = std::thread::spawn(move || {
        crate::run_with(
            &opts,
            crate::config_file::tests::parse,
            Box::new(move |cap, _: &Config| {
                assert_eq!(cap, 1 << 30);
                Box::new(Scripted {
                    log: Arc::clone(&l),
                    ..Scripted::default()
                }) as Box<dyn Policy>
            }),
            &s,
        )
    });
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let _guard = StopOnDrop(Arc::clone(&stop));

    let me = std::process::id();
    let r = report_until(&socket, "the process found", |r| {
        r.gpus.len() == 1 && r.gpus[0].jobs.len() == 1
    });
    assert_eq!(r.gpus[0].uuid, "GPU-test");
    assert_eq!(r.gpus[0].capacity, Some(1 << 30));
    assert_eq!(r.gpus[0].jobs[0].id, "train");
    assert_eq!(r.gpus[0].jobs[0].pids, [me]);
    assert_eq!(r.gpus[0].jobs[0].resident_bytes, 4096);
    assert_eq!(r.gpus[0].jobs[0].launches, 77);
    assert_eq!(r.config.error, None);
    fake.wait_for("the hold", |a| {
        a.first().map(String::as_str) == Some("hold")
    });

    // A bad edit is refused with its line; the last good configuration stays.
    std::fs::write(&config, "quantum = 30\nnonsense\n").unwrap();
    let r = report_until(&socket, "the refusal", |r| r.config.error.is_some());
    let e = r.config.error.unwrap();
    assert!(e.contains("line 2: expected `quantum = MS`"), "{e}");
    // A good one is applied.
    std::fs::write(&config, "quantum = 45\n").unwrap();
    report_until(&socket, "the reload", |r| r.config.error.is_none());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log.lock().unwrap().iter().any(|l| l == "config 45ms") {
        assert!(Instant::now() < deadline, "{:?}", log.lock().unwrap());
        std::thread::sleep(Duration::from_millis(10));
    }

    stop.store(true, Ordering::SeqCst);
    daemon.join().unwrap().unwrap();
    // Held at the stop: released.
    assert_eq!(fake.actions().last().map(String::as_str), Some("release"));
    assert!(!socket.exists(), "the status socket outlived the daemon");
    let log = log.lock().unwrap().clone();
    assert_eq!(log[0], "join train");
    assert!(log.contains(&format!("done Hold({me}) Done")), "{log:?}");
}

#[test]
fn a_bad_first_configuration_stops_the_start() {
    let d = tempfile::tempdir().unwrap();
    let config = d.path().join("node.toml");
    std::fs::write(&config, "\n\nquantum = x\n").unwrap();
    let opts = crate::Options {
        config,
        run_dirs: vec![d.path().to_path_buf()],
        socket: Some(d.path().join("node.sock")),
        metrics: None,
        interval: Duration::from_millis(10),
        timing: timing(),
    };
    let e = crate::run_with(
        &opts,
        crate::config_file::tests::parse,
        Box::new(|_, _: &Config| Box::new(Scripted::default()) as Box<dyn Policy>),
        &AtomicBool::new(false),
    )
    .unwrap_err();
    let crate::StartError::Config(m) = e else {
        panic!("{e:?}")
    };
    assert!(m.starts_with("configuration refused: "), "{m}");
    assert!(m.contains("node.toml: line 3: expected"), "{m}");
}

#[test]
fn intervals() {
    assert_eq!(crate::parse_interval("20ms"), Ok(Duration::from_millis(20)));
    assert_eq!(
        crate::parse_interval("0.5s"),
        Ok(Duration::from_millis(500))
    );
    assert!(crate::parse_interval("20")
        .unwrap_err()
        .contains("with its unit"));
    assert!(crate::parse_interval("0ms")
        .unwrap_err()
        .contains("0ms is not between 1ms and 10s"));
}

#[test]
fn host_room_is_what_is_available_less_a_reserve() {
    let m = "MemTotal:       24000000 kB\nMemFree:        1000 kB\nMemAvailable:   10000000 kB\n";
    assert_eq!(
        crate::daemon::host_room(m),
        Some((10_000_000 - 1_200_000) * 1024)
    );
    // Less available than the reserve: no room.
    let tight = "MemTotal: 24000000 kB\nMemAvailable: 1000000 kB\n";
    assert_eq!(crate::daemon::host_room(tight), Some(0));
    assert_eq!(crate::daemon::host_room("MemTotal: 1 kB\n"), None);
    assert!(crate::daemon::host_room(&std::fs::read_to_string("/proc/meminfo").unwrap()).is_some());
}

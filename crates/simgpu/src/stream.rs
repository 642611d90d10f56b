//! Streams and events: each stream runs its work in order on its own worker thread, so
//! asynchronous work really is asynchronous. The NULL (legacy) stream orders with the
//! blocking streams: its work waits for all work enqueued earlier on them, and their work
//! waits for NULL-stream work enqueued earlier. Non-blocking streams order with nothing.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::error::{CuError, CuResult};

/// A piece of work a stream runs.
pub type Task = Box<dyn FnOnce() + Send>;

/// `CU_STREAM_NON_BLOCKING`: no implicit ordering with the NULL stream.
pub const STREAM_NON_BLOCKING: u32 = 0x1;
/// `CU_EVENT_DISABLE_TIMING`.
pub const EVENT_DISABLE_TIMING: u32 = 0x2;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How far a stream has got: work items enqueued and completed, in order.
#[derive(Default)]
struct Progress {
    enqueued: u64,
    completed: u64,
}

#[derive(Default)]
struct Shared {
    progress: Mutex<Progress>,
    done: Condvar,
}

impl Shared {
    fn wait_for(&self, seq: u64) {
        let mut p = lock(&self.progress);
        while p.completed < seq {
            p = self.done.wait(p).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// A point in a stream's work: done once the stream has completed item `seq`.
#[derive(Clone)]
pub struct Ticket {
    shared: Arc<Shared>,
    seq: u64,
}

impl Ticket {
    /// Blocks until the stream has done the work up to this point.
    pub fn wait(&self) {
        self.shared.wait_for(self.seq);
    }
}

struct Job {
    seq: u64,
    after: Vec<Ticket>,
    task: Task,
}

/// One stream: its worker thread and its progress.
pub struct Stream {
    flags: u32,
    shared: Arc<Shared>,
    sender: Mutex<Sender<Job>>,
}

impl Stream {
    fn new(flags: u32) -> Stream {
        let shared = Arc::new(Shared::default());
        let (sender, receiver) = channel::<Job>();
        let worker = shared.clone();
        std::thread::Builder::new()
            .name("simgpu-stream".into())
            .spawn(move || {
                for job in receiver {
                    for ticket in &job.after {
                        ticket.wait();
                    }
                    if catch_unwind(AssertUnwindSafe(job.task)).is_err() {
                        say!("simgpu: a stream task panicked");
                    }
                    lock(&worker.progress).completed = job.seq;
                    worker.done.notify_all();
                }
            })
            .expect("spawning a stream worker thread");
        Stream {
            flags,
            shared,
            sender: Mutex::new(sender),
        }
    }

    fn blocking(&self) -> bool {
        self.flags & STREAM_NON_BLOCKING == 0
    }

    fn tail(&self) -> Ticket {
        Ticket {
            shared: self.shared.clone(),
            seq: lock(&self.shared.progress).enqueued,
        }
    }

    fn push(&self, after: Vec<Ticket>, task: Task) -> Ticket {
        // Hold the sender lock across numbering and sending, so items arrive in order.
        let sender = lock(&self.sender);
        let seq = {
            let mut p = lock(&self.shared.progress);
            p.enqueued += 1;
            p.enqueued
        };
        if sender.send(Job { seq, after, task }).is_err() {
            say!("simgpu: stream worker is gone");
        }
        Ticket {
            shared: self.shared.clone(),
            seq,
        }
    }

    /// Whether all work enqueued so far is done (`cuStreamQuery`).
    pub fn idle(&self) -> bool {
        let p = lock(&self.shared.progress);
        p.completed == p.enqueued
    }
}

/// Which stream work goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamId {
    /// The NULL / legacy stream.
    Null,
    /// A created stream.
    Created(u64),
}

/// One device's streams.
pub struct Streams {
    null: Stream,
    /// Created streams; the lock also orders enqueues across streams.
    created: Mutex<HashMap<u64, Arc<Stream>>>,
}

/// Stream ids are unique across devices, so a stream's handle names its device.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Default for Streams {
    fn default() -> Self {
        Self::new()
    }
}

impl Streams {
    /// The NULL stream alone.
    pub fn new() -> Streams {
        Streams {
            null: Stream::new(0),
            created: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `id` is one of these streams.
    pub fn contains(&self, id: u64) -> bool {
        lock(&self.created).contains_key(&id)
    }

    /// `cuStreamCreate`: returns a new id (never 0).
    pub fn create(&self, flags: u32) -> u64 {
        let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        lock(&self.created).insert(id, Arc::new(Stream::new(flags)));
        id
    }

    /// `cuStreamDestroy`: work already enqueued still runs.
    pub fn destroy(&self, id: u64) -> CuResult<()> {
        lock(&self.created)
            .remove(&id)
            .map(drop)
            .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)
    }

    /// Enqueues `task` on `stream`, ordered as the module describes.
    pub fn enqueue(&self, stream: StreamId, task: Task) -> CuResult<Ticket> {
        let created = lock(&self.created);
        match stream {
            StreamId::Null => {
                let after = created
                    .values()
                    .filter(|s| s.blocking())
                    .map(|s| s.tail())
                    .collect();
                Ok(self.null.push(after, task))
            }
            StreamId::Created(id) => {
                let s = created.get(&id).ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?;
                let after = if s.blocking() {
                    vec![self.null.tail()]
                } else {
                    Vec::new()
                };
                Ok(s.push(after, task))
            }
        }
    }

    /// The point after all work enqueued so far on `stream`.
    pub fn tail(&self, stream: StreamId) -> CuResult<Ticket> {
        match stream {
            StreamId::Null => Ok(self.null.tail()),
            StreamId::Created(id) => Ok(lock(&self.created)
                .get(&id)
                .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?
                .tail()),
        }
    }

    /// `cuStreamQuery`: `Ok(true)` when idle.
    pub fn idle(&self, stream: StreamId) -> CuResult<bool> {
        match stream {
            StreamId::Null => Ok(self.null.idle()),
            StreamId::Created(id) => Ok(lock(&self.created)
                .get(&id)
                .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?
                .idle()),
        }
    }

    /// `cuCtxSynchronize`: waits for all work enqueued so far on every stream.
    pub fn synchronize_all(&self) {
        let tickets: Vec<Ticket> = {
            let created = lock(&self.created);
            created
                .values()
                .map(|s| s.tail())
                .chain([self.null.tail()])
                .collect()
        };
        for t in tickets {
            t.wait();
        }
    }
}

#[derive(Default)]
struct EventState {
    /// How many times the event was recorded, and how many of those the streams reached.
    recorded: u64,
    completed: u64,
    at: Option<Instant>,
}

/// An event: records a point in a stream and the time the stream reached it.
#[derive(Default)]
pub struct Event {
    flags: u32,
    state: Mutex<EventState>,
    reached: Condvar,
}

impl Event {
    /// `cuEventCreate`.
    pub fn new(flags: u32) -> Arc<Event> {
        Arc::new(Event {
            flags,
            ..Event::default()
        })
    }

    /// `cuEventRecord`: the event completes when `stream` reaches this point.
    pub fn record(self: &Arc<Self>, streams: &Streams, stream: StreamId) -> CuResult<()> {
        let generation = {
            let mut s = lock(&self.state);
            s.recorded += 1;
            s.recorded
        };
        let event = self.clone();
        let reached = streams.enqueue(
            stream,
            Box::new(move || {
                let mut s = lock(&event.state);
                if s.completed < generation {
                    s.completed = generation;
                    s.at = Some(Instant::now());
                }
                event.reached.notify_all();
            }),
        );
        if reached.is_err() {
            let mut s = lock(&self.state);
            s.recorded -= 1;
        }
        reached.map(drop)
    }

    /// `cuStreamWaitEvent`: work that waits until the event's last record so far is
    /// reached (at once for an event never recorded), to enqueue on the waiting stream.
    pub fn waiter(self: &Arc<Self>) -> Task {
        let target = lock(&self.state).recorded;
        let event = self.clone();
        Box::new(move || {
            let mut s = lock(&event.state);
            while s.completed < target {
                s = event.reached.wait(s).unwrap_or_else(|e| e.into_inner());
            }
        })
    }

    /// `cuEventQuery`: `true` when the stream has reached the last record (or the event
    /// was never recorded).
    pub fn done(&self) -> bool {
        let s = lock(&self.state);
        s.completed == s.recorded
    }

    /// `cuEventSynchronize`.
    pub fn synchronize(&self) {
        let mut s = lock(&self.state);
        let target = s.recorded;
        while s.completed < target {
            s = self.reached.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// `cuEventElapsedTime`: milliseconds from `start` to `end`.
    pub fn elapsed_ms(start: &Event, end: &Event) -> CuResult<f32> {
        if start.flags & EVENT_DISABLE_TIMING != 0 || end.flags & EVENT_DISABLE_TIMING != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_HANDLE);
        }
        let times = |e: &Event| {
            let s = lock(&e.state);
            if s.recorded == 0 {
                Err(CuError::CUDA_ERROR_INVALID_HANDLE)
            } else if s.completed < s.recorded {
                Err(CuError::CUDA_ERROR_NOT_READY)
            } else {
                s.at.ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)
            }
        };
        let (a, b) = (times(start)?, times(end)?);
        let ms = if b >= a {
            b.duration_since(a).as_secs_f64() * 1e3
        } else {
            -(a.duration_since(b).as_secs_f64() * 1e3)
        };
        Ok(ms as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    fn sleeper(ms: u64) -> Task {
        Box::new(move || std::thread::sleep(Duration::from_millis(ms)))
    }

    #[test]
    fn work_runs_in_order_and_asynchronously() {
        let streams = Streams::new();
        let s = StreamId::Created(streams.create(0));
        let log = Arc::new(Mutex::new(Vec::new()));
        for i in 0..20 {
            let log = log.clone();
            streams
                .enqueue(
                    s,
                    Box::new(move || {
                        std::thread::sleep(Duration::from_millis(1));
                        lock(&log).push(i);
                    }),
                )
                .unwrap();
        }
        assert!(
            !streams.idle(s).unwrap(),
            "enqueue returned before the work ran"
        );
        streams.tail(s).unwrap().wait();
        assert!(streams.idle(s).unwrap());
        assert_eq!(*lock(&log), (0..20).collect::<Vec<_>>());
    }

    #[test]
    fn null_stream_orders_with_blocking_streams_only() {
        let streams = Streams::new();
        let a = StreamId::Created(streams.create(0));
        let free = StreamId::Created(streams.create(STREAM_NON_BLOCKING));
        let counter = Arc::new(AtomicU64::new(0));
        streams.enqueue(a, sleeper(50)).unwrap();
        let c = counter.clone();
        streams
            .enqueue(
                a,
                Box::new(move || {
                    c.fetch_add(1, Ordering::SeqCst);
                }),
            )
            .unwrap();
        // NULL-stream work waits for stream a's earlier work.
        let c = counter.clone();
        let seen = Arc::new(AtomicU64::new(99));
        let s2 = seen.clone();
        let t = streams
            .enqueue(
                StreamId::Null,
                Box::new(move || s2.store(c.load(Ordering::SeqCst), Ordering::SeqCst)),
            )
            .unwrap();
        // The non-blocking stream does not wait for the NULL stream.
        let started = Instant::now();
        streams.enqueue(free, Box::new(|| {})).unwrap().wait();
        assert!(started.elapsed() < Duration::from_millis(40));
        t.wait();
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        // Work on a blocking stream waits for earlier NULL-stream work.
        streams.enqueue(StreamId::Null, sleeper(30)).unwrap();
        let started = Instant::now();
        streams.enqueue(a, Box::new(|| {})).unwrap().wait();
        assert!(started.elapsed() >= Duration::from_millis(25));
        streams.synchronize_all();
        assert_eq!(streams.destroy(99), Err(CuError::CUDA_ERROR_INVALID_HANDLE));
    }

    #[test]
    fn a_stream_waits_for_an_event_of_another() {
        let streams = Streams::new();
        let a = StreamId::Created(streams.create(STREAM_NON_BLOCKING));
        let b = StreamId::Created(streams.create(STREAM_NON_BLOCKING));
        // An event never recorded holds nothing up.
        streams.enqueue(b, Event::new(0).waiter()).unwrap().wait();
        // Stream a is held until the test lets it go.
        let gate = |rx: std::sync::mpsc::Receiver<()>| -> Task {
            Box::new(move || {
                let _ = rx.recv();
            })
        };
        let (go, held) = std::sync::mpsc::channel();
        let counter = Arc::new(AtomicU64::new(0));
        streams.enqueue(a, gate(held)).unwrap();
        let c = counter.clone();
        streams
            .enqueue(a, Box::new(move || c.store(1, Ordering::SeqCst)))
            .unwrap();
        let e = Event::new(0);
        e.record(&streams, a).unwrap();
        streams.enqueue(b, e.waiter()).unwrap();
        let (c, seen) = (counter.clone(), Arc::new(AtomicU64::new(99)));
        let s2 = seen.clone();
        let after = streams
            .enqueue(
                b,
                Box::new(move || s2.store(c.load(Ordering::SeqCst), Ordering::SeqCst)),
            )
            .unwrap();
        go.send(()).unwrap();
        after.wait();
        assert_eq!(seen.load(Ordering::SeqCst), 1, "b ran before a's event");
        // A later record does not change what an earlier wait waits for: b goes on while a
        // is held again.
        let (go, held) = std::sync::mpsc::channel();
        streams.enqueue(a, gate(held)).unwrap();
        e.record(&streams, a).unwrap();
        streams.enqueue(b, Box::new(|| {})).unwrap().wait();
        assert!(!e.done(), "a is still held");
        go.send(()).unwrap();
        streams.synchronize_all();
        assert!(e.done());
    }

    #[test]
    fn events_complete_when_reached_and_time_in_ms() {
        let streams = Streams::new();
        let s = StreamId::Created(streams.create(0));
        let start = Event::new(0);
        let end = Event::new(0);
        assert!(end.done(), "a never-recorded event is complete");
        assert_eq!(
            Event::elapsed_ms(&start, &end),
            Err(CuError::CUDA_ERROR_INVALID_HANDLE)
        );
        start.record(&streams, s).unwrap();
        streams.enqueue(s, sleeper(40)).unwrap();
        end.record(&streams, s).unwrap();
        assert!(!end.done());
        assert_eq!(
            Event::elapsed_ms(&start, &end),
            Err(CuError::CUDA_ERROR_NOT_READY)
        );
        end.synchronize();
        assert!(end.done());
        let ms = Event::elapsed_ms(&start, &end).unwrap();
        assert!((35.0..1000.0).contains(&ms), "{ms} ms");
        let untimed = Event::new(EVENT_DISABLE_TIMING);
        untimed.record(&streams, s).unwrap();
        untimed.synchronize();
        assert_eq!(
            Event::elapsed_ms(&untimed, &end),
            Err(CuError::CUDA_ERROR_INVALID_HANDLE)
        );
        streams
            .destroy(match s {
                StreamId::Created(id) => id,
                StreamId::Null => unreachable!(),
            })
            .unwrap();
        assert_eq!(
            start.record(&streams, s),
            Err(CuError::CUDA_ERROR_INVALID_HANDLE)
        );
    }
}

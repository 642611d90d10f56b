//! The timeline: events in a bounded ring (the oldest dropped when full), written as
//! Chrome trace-event JSON (`{"traceEvents":[...]}`), which Perfetto and `chrome://tracing`
//! open. Calls, launches, copies and pauses are complete events (`"ph":"X"`, start and
//! duration in microseconds); allocations and frees are instant events (`"ph":"i"`).
//! Categories: `call`, `kernel`, `copy`, `memory`, `pause`.

use crate::{demangle, Clock, Direction};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::io::Write;
use std::sync::Arc;

/// An allocation as an event names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocRef {
    /// Creation order.
    pub order: u64,
    /// Address.
    pub base: u64,
    /// Size in bytes.
    pub size: u64,
}

/// An allocation a launch received, through parameter `param`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buffer {
    /// The parameter's ordinal.
    pub param: u16,
    /// The allocation.
    pub alloc: AllocRef,
}

/// A launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// Kernel id.
    pub kernel: u32,
    /// Thread.
    pub tid: u32,
    /// Ticks at the start of the launch call.
    pub start: u64,
    /// Ticks at its end.
    pub end: u64,
    /// Grid.
    pub grid: [u32; 3],
    /// Block.
    pub block: [u32; 3],
    /// Dynamic shared memory.
    pub shared: u32,
    /// The allocations its arguments point into.
    pub buffers: Vec<Buffer>,
}

/// One timeline event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A call of function `f`.
    Call {
        /// Function id.
        f: u32,
        /// Thread.
        tid: u32,
        /// Start tick.
        start: u64,
        /// End tick.
        end: u64,
    },
    /// A kernel launch.
    Launch(Box<Launch>),
    /// A copy (boxed, as is all but a call: an event takes 32 bytes of the ring).
    Copy(Box<CopyEvent>),
    /// An allocation (boxed, as is all but a call: an event takes 32 bytes of the ring).
    Alloc(Box<AllocEvent>),
    /// A free (boxed, as is all but a call: an event takes 32 bytes of the ring).
    Free(Box<FreeEvent>),
    /// A pause or resume (boxed, as is all but a call: an event takes 32 bytes of the ring).
    Pause(Box<PauseEvent>),
}

impl Event {
    /// The tick it started at (an allocation's, a free's: when it happened).
    pub fn start(&self) -> u64 {
        match self {
            Event::Call { start, .. } => *start,
            Event::Launch(l) => l.start,
            Event::Copy(c) => c.start,
            Event::Alloc(a) => a.at,
            Event::Free(f) => f.at,
            Event::Pause(p) => p.start,
        }
    }
}

/// A copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyEvent {
    /// Direction.
    pub dir: Direction,
    /// Thread.
    pub tid: u32,
    /// Start tick.
    pub start: u64,
    /// End tick.
    pub end: u64,
    /// Bytes.
    pub bytes: u64,
    /// The allocation copied into.
    pub dst: Option<AllocRef>,
    /// The allocation copied from.
    pub src: Option<AllocRef>,
}

/// An allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocEvent {
    /// Thread.
    pub tid: u32,
    /// Tick.
    pub at: u64,
    /// Address.
    pub base: u64,
    /// Size.
    pub size: u64,
    /// Creation order.
    pub order: u64,
    /// The API.
    pub api: &'static str,
}

/// A free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreeEvent {
    /// Thread.
    pub tid: u32,
    /// Tick.
    pub at: u64,
    /// Address.
    pub base: u64,
    /// Size.
    pub size: u64,
    /// Creation order.
    pub order: u64,
}

/// A pause or resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PauseEvent {
    /// A resume rather than a pause.
    pub resume: bool,
    /// Thread.
    pub tid: u32,
    /// Start tick.
    pub start: u64,
    /// End tick.
    pub end: u64,
    /// Allocations moved.
    pub allocations: u64,
    /// Bytes moved.
    pub bytes: u64,
}

/// A bounded ring of events.
pub struct Ring {
    events: VecDeque<Event>,
    capacity: usize,
    dropped: u64,
}

impl Ring {
    /// An empty ring of `capacity` events, its memory (32 bytes an event) allocated and
    /// written once now up to [`Ring::PREPARED`] events, so that recording neither grows
    /// it nor takes page faults on it; a larger ring grows as it fills beyond that.
    pub fn new(capacity: usize) -> Ring {
        let prepared = capacity.min(Self::PREPARED);
        let mut events = VecDeque::with_capacity(prepared);
        let blank = Event::Call {
            f: 0,
            tid: 0,
            start: 0,
            end: 0,
        };
        events.resize(prepared, blank);
        events.clear();
        Ring {
            events,
            capacity,
            dropped: 0,
        }
    }

    /// The events whose memory a new ring takes at once (64 MiB): the default ring
    /// (1048576 events) whole, not a mistyped `CUDAW_TRACE_EVENTS` of billions.
    pub const PREPARED: usize = 1 << 21;

    /// Adds `e`, dropping the oldest event when full.
    pub fn push(&mut self, e: Event) {
        if self.events.len() >= self.capacity {
            self.events.pop_front();
            self.dropped += 1;
        }
        self.events.push_back(e);
    }

    /// Events held.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Its capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Events dropped so far to stay within the capacity.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// A copy of the events, oldest first.
    pub fn to_vec(&self) -> Vec<Event> {
        self.events.iter().cloned().collect()
    }
}

/// What writing needs besides the events.
pub struct Context<'a> {
    /// The process id.
    pub pid: u32,
    /// The process's name.
    pub process: &'a str,
    /// The clock the ticks came from.
    pub clock: &'a Clock,
    /// Its rate (ticks per ns).
    pub rate: f64,
    /// Function names by id.
    pub functions: &'a [&'static str],
    /// Kernel (mangled) names by id.
    pub kernels: &'a [Arc<str>],
    /// Threads: (tid, name).
    pub threads: &'a [(u32, Option<String>)],
    /// Events dropped from the ring.
    pub dropped: u64,
}

/// A number as JSON: the shortest form that reads back the same, `null` when not finite
/// (as `serde_json` writes it).
fn write_f64(w: &mut dyn Write, v: f64) -> std::io::Result<()> {
    if v.is_finite() {
        write!(w, "{v}")
    } else {
        w.write_all(b"null")
    }
}

fn hex(v: u64) -> String {
    format!("{v:#x}")
}

fn alloc_json(a: &AllocRef) -> Value {
    json!({"alloc": a.order, "base": hex(a.base), "size": a.size})
}

/// Writes `events` as Chrome trace-event JSON; returns how many events were written.
pub fn write_chrome(w: &mut dyn Write, cx: &Context<'_>, events: &[Event]) -> std::io::Result<u64> {
    let us = |t: u64| cx.clock.since_start(t, cx.rate) / 1e3;
    let dur = |a: u64, b: u64| Clock::ns(b.wrapping_sub(a), cx.rate) / 1e3;
    let mut kernel_names: Vec<Option<String>> = vec![None; cx.kernels.len()];
    let mut kname = |k: u32| -> String {
        match kernel_names.get_mut(k as usize) {
            Some(slot) => slot
                .get_or_insert_with(|| demangle(&cx.kernels[k as usize]))
                .clone(),
            None => format!("kernel#{k}"),
        }
    };
    let pid = cx.pid;
    w.write_all(b"{\"traceEvents\":[\n")?;
    let mut n = 0u64;
    let mut first = true;
    let mut emit = |w: &mut dyn Write, v: Value| -> std::io::Result<()> {
        if !first {
            w.write_all(b",\n")?;
        }
        first = false;
        serde_json::to_writer(&mut *w, &v)?;
        Ok(())
    };
    emit(
        w,
        json!({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
               "args": {"name": format!("{} (cudaw, pid {pid})", cx.process)}}),
    )?;
    for (tid, name) in cx.threads {
        let name = name.clone().unwrap_or_else(|| format!("thread {tid}"));
        emit(
            w,
            json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}),
        )?;
    }
    // Calls are most of a timeline: written straight, their names escaped once.
    let names: Vec<String> = cx
        .functions
        .iter()
        .map(|n| serde_json::to_string(n).unwrap_or_else(|_| "\"?\"".into()))
        .collect();
    for e in events {
        let v = match e {
            Event::Call { f, tid, start, end } => {
                // After the process's metadata event: never the first.
                w.write_all(b",\n")?;
                let name = names.get(*f as usize).map_or("\"?\"", String::as_str);
                write!(
                    w,
                    "{{\"name\":{name},\"cat\":\"call\",\"ph\":\"X\",\"pid\":{pid},\"tid\":{tid},\"ts\":"
                )?;
                write_f64(w, us(*start))?;
                w.write_all(b",\"dur\":")?;
                write_f64(w, dur(*start, *end))?;
                w.write_all(b"}")?;
                n += 1;
                continue;
            }
            Event::Launch(l) => {
                let mangled = cx
                    .kernels
                    .get(l.kernel as usize)
                    .map_or_else(String::new, |s| s.to_string());
                let buffers: Vec<Value> = l
                    .buffers
                    .iter()
                    .map(|b| {
                        let mut v = alloc_json(&b.alloc);
                        v["param"] = json!(b.param);
                        v
                    })
                    .collect();
                json!({
                    "name": kname(l.kernel), "cat": "kernel", "ph": "X", "pid": pid, "tid": l.tid,
                    "ts": us(l.start), "dur": dur(l.start, l.end),
                    "args": {"kernel": mangled, "grid": l.grid, "block": l.block,
                             "shared": l.shared, "buffers": buffers},
                })
            }
            Event::Copy(e) => json!({
                "name": format!("copy {}", e.dir.as_str()), "cat": "copy", "ph": "X",
                "pid": pid, "tid": e.tid, "ts": us(e.start), "dur": dur(e.start, e.end),
                "args": {"direction": e.dir.as_str(), "bytes": e.bytes,
                         "dst": e.dst.as_ref().map(alloc_json), "src": e.src.as_ref().map(alloc_json)},
            }),
            Event::Alloc(e) => json!({
                "name": format!("alloc {}", e.size), "cat": "memory", "ph": "i", "s": "t",
                "pid": pid, "tid": e.tid, "ts": us(e.at),
                "args": {"alloc": e.order, "base": hex(e.base), "size": e.size, "api": e.api},
            }),
            Event::Free(e) => json!({
                "name": format!("free {}", e.size), "cat": "memory", "ph": "i", "s": "t",
                "pid": pid, "tid": e.tid, "ts": us(e.at),
                "args": {"alloc": e.order, "base": hex(e.base), "size": e.size},
            }),
            Event::Pause(e) => json!({
                "name": if e.resume { "resume" } else { "pause" }, "cat": "pause", "ph": "X",
                "pid": pid, "tid": e.tid, "ts": us(e.start), "dur": dur(e.start, e.end),
                "args": {"allocations": e.allocations, "bytes": e.bytes},
            }),
        };
        emit(w, v)?;
        n += 1;
    }
    w.write_all(b"\n],\"displayTimeUnit\":\"ns\",\"otherData\":")?;
    serde_json::to_writer(
        &mut *w,
        &json!({"producer": "cudaw", "events": n, "dropped": cx.dropped}),
    )?;
    w.write_all(b"}\n")?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls, written without `serde_json`'s tree, read back as the same JSON values: the
    /// name escaped, the times as numbers.
    #[test]
    fn calls_are_written_as_json() {
        let clock = crate::Clock::new(None);
        let start = clock.start();
        let cx = Context {
            pid: 42,
            process: "p",
            clock: &clock,
            rate: 1.0,
            functions: &["cudaGetDevice", "odd \"name\"\n"],
            kernels: &[],
            threads: &[(3, Some("main".into()))],
            dropped: 0,
        };
        let events = [
            Event::Call {
                f: 0,
                tid: 3,
                start: start + 1500,
                end: start + 4250,
            },
            Event::Call {
                f: 1,
                tid: 3,
                start,
                end: start,
            },
            Event::Call {
                f: 9,
                tid: 4,
                start: start + 7,
                end: start + 8,
            },
        ];
        let mut out = Vec::new();
        assert_eq!(write_chrome(&mut out, &cx, &events).unwrap(), 3);
        let v: Value = serde_json::from_slice(&out).unwrap();
        let calls: Vec<&Value> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["cat"] == "call")
            .collect();
        assert_eq!(
            *calls[0],
            json!({"name": "cudaGetDevice", "cat": "call", "ph": "X", "pid": 42, "tid": 3,
                   "ts": 1.5, "dur": 2.75})
        );
        assert_eq!(calls[1]["name"], "odd \"name\"\n");
        assert_eq!(
            (calls[1]["ts"].as_f64(), calls[1]["dur"].as_f64()),
            (Some(0.0), Some(0.0))
        );
        assert_eq!(calls[2]["name"], "?");
        assert_eq!(calls[2]["dur"].as_f64(), Some(0.001));
        assert_eq!(v["otherData"]["events"], 3);
    }

    #[test]
    fn the_ring_drops_its_oldest() {
        let mut r = Ring::new(3);
        for i in 0..5 {
            r.push(Event::Call {
                f: i,
                tid: 1,
                start: 0,
                end: 1,
            });
        }
        assert_eq!((r.len(), r.dropped()), (3, 2));
        assert!(matches!(r.to_vec()[0], Event::Call { f: 2, .. }));
    }

    /// The default ring's memory is taken whole at start; a huge one only up to
    /// `Ring::PREPARED` events, and it still holds its capacity as it fills.
    #[test]
    fn a_ring_prepares_its_memory_up_to_a_bound() {
        let r = Ring::new(crate::DEFAULT_RING_EVENTS);
        assert!(r.events.capacity() >= crate::DEFAULT_RING_EVENTS);
        assert!(r.is_empty());
        let cap = Ring::PREPARED + 10;
        let mut r = Ring::new(cap);
        let reserved = r.events.capacity();
        assert!((Ring::PREPARED..cap).contains(&reserved), "{reserved}");
        for i in 0..cap as u32 + 5 {
            r.push(Event::Call {
                f: i,
                tid: 1,
                start: 0,
                end: 1,
            });
        }
        assert_eq!((r.len(), r.dropped()), (cap, 5));
    }

    #[test]
    fn an_event_takes_32_bytes() {
        // The default ring (2^20 events) is then 32 MiB.
        assert_eq!(std::mem::size_of::<Event>(), 32);
    }
}

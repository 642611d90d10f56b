//! The timeline: events in a bounded ring (the oldest dropped when full), written as
//! Chrome trace-event JSON (`{"traceEvents":[...]}`), which Perfetto and `chrome://tracing`
//! open. Calls, launches, copies and pauses are complete events (`"ph":"X"`, start and
//! duration in microseconds); allocations and frees are instant events (`"ph":"i"`).
//! Categories: `call`, `kernel`, `copy`, `memory`, `pause`.

use crate::{demangle, Clock, Direction};
use serde_json::{json, Value};
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

/// A launch's argument words that may be pointers, as (parameter, value): kept as the
/// launch passed them (the first few inline), and resolved into the allocations they point
/// into only when the timeline is read ([`resolve_buffers`]): recording a launch looks
/// nothing up.
pub type Words = smallvec::SmallVec<[(u16, u64); 6]>;

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
    /// Its argument words that may be pointers, not yet resolved ([`resolve_buffers`]
    /// moves them into `buffers`).
    pub words: Words,
    /// The allocations its arguments point into, once resolved.
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
    /// Smart pinning page-locked a host range, or unpinned one (boxed, as the rest).
    Pin(Box<PinEvent>),
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
            Event::Pin(p) => p.at,
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

/// The live allocations at one point of a timeline, for [`resolve_buffers`]: (base, end,
/// allocation) by base, looked up as the memory history does (the one with the highest
/// base at or below an address, when the address is before its end).
#[derive(Debug, Default)]
pub struct Live {
    index: Vec<(u64, u64, AllocRef)>,
}

impl Live {
    /// The allocations `live` (in any order).
    pub fn new(live: impl IntoIterator<Item = AllocRef>) -> Live {
        let mut index: Vec<(u64, u64, AllocRef)> = live
            .into_iter()
            .map(|a| (a.base, a.base.saturating_add(a.size.max(1)), a))
            .collect();
        index.sort_by_key(|e| e.0);
        Live { index }
    }

    /// Adds `a` (replacing one at the same base, as the history does).
    pub fn insert(&mut self, a: AllocRef) {
        let end = a.base.saturating_add(a.size.max(1));
        match self.index.binary_search_by_key(&a.base, |e| e.0) {
            Ok(i) => self.index[i] = (a.base, end, a),
            Err(i) => self.index.insert(i, (a.base, end, a)),
        }
    }

    /// Removes allocation `order` at `base`, if it is there.
    pub fn remove(&mut self, base: u64, order: u64) {
        if let Ok(i) = self.index.binary_search_by_key(&base, |e| e.0) {
            if self.index[i].2.order == order {
                self.index.remove(i);
            }
        }
    }

    /// The allocation containing `ptr`.
    pub fn find(&self, ptr: u64) -> Option<AllocRef> {
        crate::history::containing(&self.index, ptr).map(|e| e.2)
    }
}

/// Resolves each launch's [`Launch::words`] into its [`Launch::buffers`]: the allocations
/// they pointed into when it ran, one buffer per allocation (with the first parameter that
/// pointed into it). `events` are in the order they were recorded (the ring's order, in
/// which an allocation or free is recorded under the memory history's lock), and `live`
/// holds the allocations live after the last of them: the events are walked from the
/// newest back, a free making its allocation live again and an allocation ending it (and
/// bringing back the one it replaced at the same base, if any).
pub fn resolve_buffers(events: &mut [Event], mut live: Live) {
    for e in events.iter_mut().rev() {
        match e {
            Event::Alloc(a) => {
                live.remove(a.base, a.order);
                if let Some(r) = a.replaced {
                    live.insert(r);
                }
            }
            Event::Free(f) => live.insert(AllocRef {
                order: f.order,
                base: f.base,
                size: f.size,
            }),
            Event::Launch(l) if !l.words.is_empty() => {
                let mut buffers: Vec<Buffer> = Vec::new();
                for &(param, w) in &l.words {
                    if let Some(a) = live.find(w) {
                        if !buffers.iter().any(|b| b.alloc.order == a.order) {
                            buffers.push(Buffer { param, alloc: a });
                        }
                    }
                }
                l.buffers = buffers;
                l.words = Words::new();
            }
            _ => {}
        }
    }
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
    /// A live allocation at the same base that this one replaced (its free unseen).
    pub replaced: Option<AllocRef>,
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

/// Smart pinning's decision about a host range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinEvent {
    /// Page-locked (else unpinned: given back, or at exit).
    pub pinned: bool,
    /// Thread.
    pub tid: u32,
    /// When (tick).
    pub at: u64,
    /// The range's first byte.
    pub base: u64,
    /// Its bytes.
    pub bytes: u64,
}

/// A bounded ring of events, encoded into words of its own memory (written once when the
/// ring is made, so that recording neither allocates nor takes page faults: a boxed event
/// per launch grew the heap by a page every dozen launches, a page fault each). It holds
/// at most `capacity` events and `capacity` × [`Ring::WORDS_PER_EVENT`] words, the
/// oldest dropped to make room: a call takes 3 words, a launch 7 and 2 per argument word,
/// an allocation 8, a copy 10. Events are decoded on read ([`Ring::to_vec`]).
pub struct Ring {
    words: Vec<u64>,
    /// Where the oldest event starts, and where the next one goes (indices into `words`,
    /// wrapping).
    head: usize,
    tail: usize,
    /// Words held.
    used: usize,
    /// Events held.
    len: usize,
    capacity: usize,
    dropped: u64,
    /// The APIs allocation events name, by number.
    apis: Vec<&'static str>,
}

const CALL: u64 = 1;
const LAUNCH: u64 = 2;
const COPY: u64 = 3;
const ALLOC: u64 = 4;
const FREE: u64 = 5;
const PAUSE: u64 = 6;
const PIN: u64 = 7;

/// An event's first word: its kind, its thread (24 bits) and a 32-bit value (a call's
/// function, a launch's kernel, ...).
fn header(kind: u64, tid: u32, value: u32) -> u64 {
    kind | u64::from(tid & 0xff_ffff) << 8 | u64::from(value) << 32
}

fn pair(lo: u32, hi: u32) -> u64 {
    u64::from(lo) | u64::from(hi) << 32
}

fn halves(w: u64) -> (u32, u32) {
    (w as u32, (w >> 32) as u32)
}

/// An optional allocation as 3 words (presence in the order's top bit).
fn alloc_words(a: Option<AllocRef>) -> [u64; 3] {
    match a {
        Some(a) => [a.order | 1 << 63, a.base, a.size],
        None => [0, 0, 0],
    }
}

fn alloc_of(w: [u64; 3]) -> Option<AllocRef> {
    (w[0] >> 63 == 1).then(|| AllocRef {
        order: w[0] & !(1 << 63),
        base: w[1],
        size: w[2],
    })
}

impl Ring {
    /// Words of the ring's memory per event of its capacity (32 bytes).
    pub const WORDS_PER_EVENT: usize = 4;

    /// An empty ring of `capacity` events, its memory (32 bytes an event) allocated and
    /// written once now up to [`Ring::PREPARED`] events, so that recording neither grows
    /// it nor takes page faults on it; a larger ring grows as it fills beyond that.
    pub fn new(capacity: usize) -> Ring {
        let capacity = capacity.max(1);
        let prepared = capacity.min(Self::PREPARED) * Self::WORDS_PER_EVENT;
        let mut words = Vec::with_capacity(prepared);
        // Written, not only reserved: the pages are taken now.
        words.resize(prepared, u64::MAX);
        Ring {
            words,
            head: 0,
            tail: 0,
            used: 0,
            len: 0,
            capacity,
            dropped: 0,
            apis: Vec::new(),
        }
    }

    /// The events whose memory a new ring takes at once (64 MiB): the default ring
    /// (1048576 events) whole, not a mistyped `CUDAW_TRACE_EVENTS` of billions.
    pub const PREPARED: usize = 1 << 21;

    /// The words the ring may hold.
    fn word_capacity(&self) -> usize {
        self.capacity.saturating_mul(Self::WORDS_PER_EVENT)
    }

    /// The number of words of the event that starts at `i`.
    fn event_len(&self, i: usize) -> usize {
        match self.word(i) & 0xff {
            CALL => 3,
            LAUNCH => 7 + 2 * (self.word(i + 6) >> 32) as usize,
            COPY => 10,
            ALLOC => 8,
            FREE | PAUSE => 5,
            PIN => 4,
            // Never written: a corrupt ring reads as one-word events.
            _ => 1,
        }
    }

    /// The word at `i`, an index at most one length past the end (wrapping).
    fn word(&self, i: usize) -> u64 {
        let n = self.words.len();
        self.words[if i >= n { i - n } else { i }]
    }

    /// `i + n`, wrapped (both within the memory).
    fn advance(&self, i: usize, n: usize) -> usize {
        let j = i + n;
        if j >= self.words.len() {
            j - self.words.len()
        } else {
            j
        }
    }

    /// Drops the oldest event.
    fn drop_oldest(&mut self) {
        if self.len == 0 {
            return;
        }
        let n = self.event_len(self.head);
        self.head = self.advance(self.head, n);
        self.used -= n;
        self.len -= 1;
        self.dropped += 1;
    }

    /// Makes room for an event of `n` words (dropping the oldest), growing the memory
    /// while it is below the word capacity (a ring larger than [`Ring::PREPARED`]).
    fn reserve(&mut self, n: usize) {
        let n = n.min(self.word_capacity());
        while self.len > 0 && (self.len >= self.capacity || self.used + n > self.word_capacity()) {
            self.drop_oldest();
        }
        if self.used + n > self.words.len() {
            // Grow: unwrap the held words to the front, then extend.
            let held: Vec<u64> = (0..self.used).map(|i| self.word(self.head + i)).collect();
            let target = (self.words.len() * 2)
                .max(self.used + n)
                .min(self.word_capacity());
            self.words = held;
            self.words.resize(target, u64::MAX);
            self.head = 0;
            self.tail = self.used;
        }
    }

    /// Appends an event of `words` (dropping it whole if it is larger than the ring).
    fn put(&mut self, words: &[u64]) {
        if words.len() > self.word_capacity() {
            // Larger than the whole ring (a ring of a few events): not kept.
            self.dropped += 1;
            return;
        }
        self.reserve(words.len());
        for &w in words {
            self.write(w);
        }
        self.used += words.len();
        self.len += 1;
    }

    /// Writes `w` at the tail, wrapping (room made by [`Ring::reserve`]).
    #[inline]
    fn write(&mut self, w: u64) {
        self.words[self.tail] = w;
        self.tail += 1;
        if self.tail == self.words.len() {
            self.tail = 0;
        }
    }

    /// A call of function `f` on thread `tid` from tick `start` to `end`.
    #[inline]
    pub fn push_call(&mut self, f: u32, tid: u32, start: u64, end: u64) {
        self.put(&[header(CALL, tid, f), start, end]);
    }

    /// A launch, its argument words kept as they are (resolved on read).
    #[allow(clippy::too_many_arguments)]
    pub fn push_launch(
        &mut self,
        kernel: u32,
        tid: u32,
        start: u64,
        end: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        words: impl ExactSizeIterator<Item = (u16, u64)>,
    ) {
        // More words than the ring may hold are cut (never in practice: thousands).
        let n = words.len().min(self.word_capacity().saturating_sub(7) / 2);
        let head = [
            header(LAUNCH, tid, kernel),
            start,
            end,
            pair(grid[0], grid[1]),
            pair(grid[2], block[0]),
            pair(block[1], block[2]),
            pair(shared, n as u32),
        ];
        self.reserve(7 + 2 * n);
        for v in head {
            self.write(v);
        }
        for (param, value) in words.take(n) {
            self.write(u64::from(param));
            self.write(value);
        }
        self.used += 7 + 2 * n;
        self.len += 1;
    }

    /// Adds `e`, dropping the oldest event when full.
    pub fn push(&mut self, e: Event) {
        match e {
            Event::Call { f, tid, start, end } => self.push_call(f, tid, start, end),
            Event::Launch(l) => self.push_launch(
                l.kernel,
                l.tid,
                l.start,
                l.end,
                l.grid,
                l.block,
                l.shared,
                l.words.iter().copied(),
            ),
            Event::Copy(c) => {
                let [d0, d1, d2] = alloc_words(c.dst);
                let [s0, s1, s2] = alloc_words(c.src);
                self.put(&[
                    header(COPY, c.tid, c.dir as u32),
                    c.start,
                    c.end,
                    c.bytes,
                    d0,
                    d1,
                    d2,
                    s0,
                    s1,
                    s2,
                ]);
            }
            Event::Alloc(a) => {
                let api = match self.apis.iter().position(|x| *x == a.api) {
                    Some(i) => i,
                    None => {
                        self.apis.push(a.api);
                        self.apis.len() - 1
                    }
                };
                let [r0, r1, r2] = alloc_words(a.replaced);
                self.put(&[
                    header(ALLOC, a.tid, api as u32),
                    a.at,
                    a.base,
                    a.size,
                    a.order,
                    r0,
                    r1,
                    r2,
                ]);
            }
            Event::Free(f) => {
                self.put(&[header(FREE, f.tid, 0), f.at, f.base, f.size, f.order]);
            }
            Event::Pause(p) => self.put(&[
                header(PAUSE, p.tid, u32::from(p.resume)),
                p.start,
                p.end,
                p.allocations,
                p.bytes,
            ]),
            Event::Pin(p) => self.put(&[
                header(PIN, p.tid, u32::from(p.pinned)),
                p.at,
                p.base,
                p.bytes,
            ]),
        }
    }

    /// Events held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its capacity in events.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Events dropped so far to stay within the capacity.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The events, decoded, oldest first.
    pub fn to_vec(&self) -> Vec<Event> {
        let mut out = Vec::with_capacity(self.len);
        let mut i = self.head;
        for _ in 0..self.len {
            let w0 = self.word(i);
            let at = |k: usize| self.word(i + k);
            let tid = ((w0 >> 8) & 0xff_ffff) as u32;
            let value = (w0 >> 32) as u32;
            let e = match w0 & 0xff {
                CALL => Event::Call {
                    f: value,
                    tid,
                    start: at(1),
                    end: at(2),
                },
                LAUNCH => {
                    let (g0, g1) = halves(at(3));
                    let (g2, b0) = halves(at(4));
                    let (b1, b2) = halves(at(5));
                    let (shared, n) = halves(at(6));
                    Event::Launch(Box::new(Launch {
                        kernel: value,
                        tid,
                        start: at(1),
                        end: at(2),
                        grid: [g0, g1, g2],
                        block: [b0, b1, b2],
                        shared,
                        words: (0..n as usize)
                            .map(|k| (at(7 + 2 * k) as u16, at(8 + 2 * k)))
                            .collect(),
                        buffers: Vec::new(),
                    }))
                }
                COPY => Event::Copy(Box::new(CopyEvent {
                    dir: Direction::from_kind(value as i32),
                    tid,
                    start: at(1),
                    end: at(2),
                    bytes: at(3),
                    dst: alloc_of([at(4), at(5), at(6)]),
                    src: alloc_of([at(7), at(8), at(9)]),
                })),
                ALLOC => Event::Alloc(Box::new(AllocEvent {
                    tid,
                    at: at(1),
                    base: at(2),
                    size: at(3),
                    order: at(4),
                    api: self.apis.get(value as usize).copied().unwrap_or("?"),
                    replaced: alloc_of([at(5), at(6), at(7)]),
                })),
                FREE => Event::Free(Box::new(FreeEvent {
                    tid,
                    at: at(1),
                    base: at(2),
                    size: at(3),
                    order: at(4),
                })),
                PAUSE => Event::Pause(Box::new(PauseEvent {
                    resume: value != 0,
                    tid,
                    start: at(1),
                    end: at(2),
                    allocations: at(3),
                    bytes: at(4),
                })),
                PIN => Event::Pin(Box::new(PinEvent {
                    pinned: value != 0,
                    tid,
                    at: at(1),
                    base: at(2),
                    bytes: at(3),
                })),
                _ => {
                    i = self.advance(i, 1);
                    continue;
                }
            };
            out.push(e);
            i = self.advance(i, self.event_len(i));
        }
        out
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
            Event::Pin(e) => json!({
                "name": format!("{} {}", if e.pinned { "pin" } else { "unpin" }, e.bytes),
                "cat": "pinning", "ph": "i", "s": "p",
                "pid": pid, "tid": e.tid, "ts": us(e.at),
                "args": {"base": hex(e.base), "bytes": e.bytes},
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
        assert_eq!(
            r.words.len(),
            crate::DEFAULT_RING_EVENTS * Ring::WORDS_PER_EVENT
        );
        assert!(r.is_empty());
        let cap = Ring::PREPARED + 10;
        let mut r = Ring::new(cap);
        assert_eq!(r.words.len(), Ring::PREPARED * Ring::WORDS_PER_EVENT);
        for i in 0..cap as u32 + 5 {
            r.push_call(i, 1, 0, 1);
        }
        assert_eq!((r.len(), r.dropped()), (cap, 5));
        assert!(matches!(r.to_vec()[0], Event::Call { f: 5, .. }));
    }

    /// One event of each kind, as the ring gives them back.
    fn one_of_each(i: u64) -> Vec<Event> {
        let a = AllocRef {
            order: i,
            base: 0x1000 * i,
            size: 64,
        };
        vec![
            Event::Call {
                f: i as u32,
                tid: 0xab_cdef,
                start: i,
                end: i + 1,
            },
            launch(&[(0, 0x1000 * i), (7, u64::MAX)]),
            launch(&[]),
            Event::Copy(Box::new(CopyEvent {
                dir: Direction::DtoH,
                tid: 2,
                start: i,
                end: i + 5,
                bytes: 1 << 40,
                dst: None,
                src: Some(a),
            })),
            alloc(i, 0x1000 * i, 64, Some(a)),
            Event::Alloc(Box::new(AllocEvent {
                tid: 3,
                at: i,
                base: 1,
                size: 2,
                order: 3,
                api: "cuMemAlloc",
                replaced: None,
            })),
            free(i, 0x1000 * i, 64),
            Event::Pause(Box::new(PauseEvent {
                resume: true,
                tid: 4,
                start: i,
                end: i + 9,
                allocations: 5,
                bytes: 6,
            })),
            Event::Pin(Box::new(PinEvent {
                pinned: i % 2 == 0,
                tid: 5,
                at: i,
                base: 0x7000_0000 + i,
                bytes: 1 << 20,
            })),
        ]
    }

    /// The words an event takes in the ring.
    fn size(e: &Event) -> usize {
        match e {
            Event::Call { .. } => 3,
            Event::Launch(l) => 7 + 2 * l.words.len(),
            Event::Copy(_) => 10,
            Event::Alloc(_) => 8,
            Event::Free(_) | Event::Pause(_) => 5,
            Event::Pin(_) => 4,
        }
    }

    /// Every kind of event reads back as it went in, through wrapping around the ring's
    /// memory many times; the ring holds the newest events within both of its bounds
    /// (events, and words), as a plain queue with those bounds does.
    #[test]
    fn events_read_back_as_pushed_through_many_wraps() {
        for capacity in [4usize, 16, 37] {
            let mut r = Ring::new(capacity);
            let mut model: std::collections::VecDeque<Event> = Default::default();
            let mut dropped = 0u64;
            for i in 0..300 {
                for e in one_of_each(i) {
                    r.push(e.clone());
                    let words = capacity * Ring::WORDS_PER_EVENT;
                    if size(&e) > words {
                        dropped += 1;
                        continue;
                    }
                    model.push_back(e);
                    while model.len() > capacity || model.iter().map(size).sum::<usize>() > words {
                        model.pop_front();
                        dropped += 1;
                    }
                }
                assert_eq!(
                    r.to_vec(),
                    Vec::from(model.clone()),
                    "capacity {capacity}, round {i}"
                );
                assert_eq!((r.len(), r.dropped()), (model.len(), dropped));
            }
        }
        // A thread number is kept to its low 24 bits.
        let mut r = Ring::new(16);
        r.push_call(1, 0x1ab_cdef, 2, 3);
        assert!(matches!(
            r.to_vec()[0],
            Event::Call {
                f: 1,
                tid: 0xab_cdef,
                start: 2,
                end: 3
            }
        ));
    }

    fn launch(words: &[(u16, u64)]) -> Event {
        Event::Launch(Box::new(Launch {
            kernel: 0,
            tid: 1,
            start: 0,
            end: 0,
            grid: [1; 3],
            block: [1; 3],
            shared: 0,
            words: words.iter().copied().collect(),
            buffers: Vec::new(),
        }))
    }

    fn alloc(order: u64, base: u64, size: u64, replaced: Option<AllocRef>) -> Event {
        Event::Alloc(Box::new(AllocEvent {
            tid: 1,
            at: 0,
            base,
            size,
            order,
            api: "cudaMalloc",
            replaced,
        }))
    }

    fn free(order: u64, base: u64, size: u64) -> Event {
        Event::Free(Box::new(FreeEvent {
            tid: 1,
            at: 0,
            base,
            size,
            order,
        }))
    }

    /// Each launch's buffers as (parameter, allocation order).
    fn buffers(events: &[Event]) -> Vec<Vec<(u16, u64)>> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Launch(l) => {
                    assert!(l.words.is_empty(), "resolved words are let go");
                    Some(l.buffers.iter().map(|b| (b.param, b.alloc.order)).collect())
                }
                _ => None,
            })
            .collect()
    }

    /// Launches resolve against the allocations live when they ran: a freed allocation's
    /// address made again is the new one's after, the old one's before; an address
    /// reused without a free seen brings the replaced allocation back before it; words
    /// into one allocation give one buffer (the first parameter's); words into nothing
    /// give none.
    #[test]
    fn launch_words_resolve_to_the_allocations_live_when_they_ran() {
        let b = AllocRef {
            order: 1,
            base: 0x1000,
            size: 0x200,
        };
        let c = AllocRef {
            order: 2,
            base: 0x1000,
            size: 0x80,
        };
        let mut events = vec![
            launch(&[(0, 0x1010)]),
            alloc(0, 0x1000, 0x100, None),
            launch(&[(0, 0x1010), (1, 0x10f0), (2, 0x1180)]),
            free(0, 0x1000, 0x100),
            launch(&[(0, 0x1010)]),
            alloc(1, 0x1000, 0x200, None),
            launch(&[(3, 0x1180), (4, 0x1010)]),
            alloc(2, 0x1000, 0x80, Some(b)),
            launch(&[(0, 0x1010), (1, 0x1180)]),
        ];
        resolve_buffers(&mut events, Live::new([c]));
        assert_eq!(
            buffers(&events),
            [vec![], vec![(0, 0)], vec![], vec![(3, 1)], vec![(0, 2)]]
        );
        // The events before a ring's window are gone: the live set replayed back from the
        // end still resolves the launches it holds.
        let mut tail = vec![
            launch(&[(0, 0x1010)]),
            free(0, 0x1000, 0x100),
            launch(&[(0, 0x1010)]),
        ];
        resolve_buffers(&mut tail, Live::new([]));
        assert_eq!(buffers(&tail), [vec![(0, 0)], vec![]]);
    }

    /// An allocation inside another (a pool's block in its reservation) is found for the
    /// words inside it, the outer one for the rest.
    #[test]
    fn nested_allocations_resolve_as_the_history_finds_them() {
        let outer = AllocRef {
            order: 0,
            base: 0x10_0000,
            size: 0x10_0000,
        };
        let inner = AllocRef {
            order: 1,
            base: 0x14_0000,
            size: 0x1000,
        };
        let mut events = vec![launch(&[(0, 0x10_0008), (1, 0x14_0010), (2, 0x18_0000)])];
        resolve_buffers(&mut events, Live::new([inner, outer]));
        assert_eq!(buffers(&events), [vec![(0, 0), (1, 1)]]);
    }

    #[test]
    fn an_event_read_back_takes_32_bytes() {
        assert_eq!(std::mem::size_of::<Event>(), 32);
    }
}

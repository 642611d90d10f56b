//! Launches waiting to be counted into the memory history (and, with the timeline, to
//! become events). A launch records what it has (kernel, shape, times, the argument words
//! inside the live allocations' span) in its thread's [`Pending`] log: a few writes into
//! memory the thread just used, under a lock only a flush from another thread ever
//! contends. The log is counted into the history in one go when it fills, and whenever
//! the history is read or an allocation is made or freed ([`crate::Tracer`] flushes every
//! thread's log first), so what a reader sees and which allocation a word is counted on
//! are as if each launch had been counted when it was made. Counting many launches at
//! once keeps the history's tree and records in cache; counting each one as it is made
//! found them cold every time in a real program (PyTorch: several hundred nanoseconds a
//! launch, most of tracing's cost).

/// One launch waiting in a [`Pending`] log; its words are the log's next `words`.
pub(crate) struct PendingLaunch {
    pub kernel: u32,
    pub tid: u32,
    pub shared: u32,
    pub words: u32,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub start: u64,
    pub end: u64,
}

/// Launches a log holds before it is counted.
pub(crate) const MAX_LAUNCHES: usize = 128;
/// Argument words a log holds before it is counted.
pub(crate) const MAX_WORDS: usize = 4096;
/// Timeline events (calls) a log holds before they go into the ring.
pub(crate) const MAX_EVENTS: usize = 512;

/// One thread's launches not yet counted, and (with the timeline) its calls not yet in
/// the ring: the ring is a large, shared, locked buffer, cold in cache at every single
/// push; a batch moves into it under one lock, in one sequential sweep.
#[derive(Default)]
pub(crate) struct Pending {
    pub launches: Vec<PendingLaunch>,
    pub words: Vec<(u16, u64)>,
    pub events: Vec<crate::timeline::Event>,
}

impl Pending {
    /// Adds a launch; returns whether the log is full (to be counted now).
    #[inline]
    pub fn push(&mut self, l: PendingLaunch, words: impl Iterator<Item = (u16, u64)>) -> bool {
        if self.launches.capacity() == 0 {
            self.launches.reserve(MAX_LAUNCHES);
            self.words.reserve(MAX_WORDS);
        }
        let before = self.words.len();
        self.words.extend(words);
        let n = (self.words.len() - before) as u32;
        self.launches.push(PendingLaunch { words: n, ..l });
        self.launches.len() >= MAX_LAUNCHES || self.words.len() >= MAX_WORDS
    }

    /// Adds a timeline event; returns whether the log is full (to be moved now).
    #[inline]
    pub fn push_event(&mut self, e: crate::timeline::Event) -> bool {
        if self.events.capacity() == 0 {
            self.events.reserve(MAX_EVENTS);
        }
        self.events.push(e);
        self.events.len() >= MAX_EVENTS
    }

    /// Whether it holds nothing.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.launches.is_empty() && self.events.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use crate::{Config, Mode, Tracer};

    fn launches_on(t: &Tracer, base: u64) -> u64 {
        let s = t.stats(1, 100);
        let b = format!("{base:#x}");
        s.memory
            .hottest
            .iter()
            .chain(&s.memory.coldest)
            .find(|a| a.base == b)
            .map_or(0, |a| a.launches)
    }

    #[test]
    fn a_word_counts_on_the_allocation_it_pointed_into_when_launched() {
        let t = Tracer::new(Config::new(Mode::Timeline));
        let k = t.kernel_id("k");
        t.record_alloc(0x1000, 0x100, "cudaMalloc", None);
        for _ in 0..3 {
            t.record_launch(k, [1; 3], [1; 3], 0, 0, 1, &[(0, 0x1010)]);
        }
        // Freed with three launches still in the log, then made again at the same base:
        // the three belong to the first allocation (order 0), the next to the second.
        t.record_free(0x1000);
        t.record_alloc(0x1000, 0x100, "cudaMalloc", None);
        t.record_launch(k, [1; 3], [1; 3], 0, 0, 1, &[(0, 0x1010)]);
        assert_eq!(launches_on(&t, 0x1000), 1);
        assert_eq!(t.stats(1, 1).kernels[0].launches, 4);
        let mut out = Vec::new();
        t.write_timeline(&mut out, 1, "p").unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let orders: Vec<serde_json::Value> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["cat"] == "kernel")
            .map(|e| e["args"]["buffers"][0]["alloc"].clone())
            .collect();
        assert_eq!(orders, [0, 0, 0, 1]);
    }

    #[test]
    fn every_thread_s_launches_are_counted_on_read() {
        for mode in [Mode::Metrics, Mode::Timeline] {
            let t = Tracer::new(Config::new(mode));
            let k = t.kernel_id("k");
            t.record_alloc(0x10_0000, 0x1000, "cudaMalloc", None);
            // More launches than a log holds (some counted when it fills, the rest on read).
            let n = super::MAX_LAUNCHES as u64 * 2 + 7;
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        for i in 0..n {
                            t.record_launch(k, [1; 3], [1; 3], 0, i, i + 1, &[(0, 0x10_0008)]);
                        }
                    });
                }
            });
            assert_eq!(launches_on(&t, 0x10_0000), 2 * n, "{mode:?}");
            assert_eq!(t.stats(1, 1).kernels[0].launches, 2 * n);
            if mode == Mode::Timeline {
                let mut out = Vec::new();
                t.write_timeline(&mut out, 1, "p").unwrap();
                let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
                let kernels: Vec<&serde_json::Value> = v["traceEvents"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|e| e["cat"] == "kernel")
                    .collect();
                assert_eq!(kernels.len() as u64, 2 * n);
                assert!(kernels
                    .iter()
                    .all(|e| e["args"]["buffers"][0]["base"] == "0x100000"));
            }
        }
    }
}

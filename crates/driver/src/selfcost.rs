//! `CUDAW_TRACE_SELF=1`: what tracing itself adds to each traced launch, by phase, timed
//! with the host library's tick source inside the running program, with its caches as the
//! program leaves them. Microbenchmarks run tracing's code hot; in a real program (PyTorch)
//! every cache line it touches may be cold, which a loop cannot show. Launches are counted
//! after a warm-up (first launches parse layouts and intern names). Diagnostic: timing the
//! phases adds two tick reads to each.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// Phases a host library may time.
pub const PHASES: usize = 5;

/// Per-phase totals of one layer's traced launches.
pub struct SelfCost {
    layer: &'static str,
    names: [&'static str; PHASES],
    /// Launches left out first; `None`: [`warmup`]'s.
    warmup: Option<u64>,
    seen: AtomicU64,
    counted: AtomicU64,
    ticks: [AtomicU64; PHASES],
    words: AtomicU64,
    bytes: AtomicU64,
    /// (ticks, nanoseconds since the process's first use of this module) at the first
    /// launch: with the same at the report, the tick rate.
    first: [AtomicU64; 2],
}

fn epoch() -> Instant {
    static E: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *E.get_or_init(Instant::now)
}

impl SelfCost {
    /// Totals for `layer`'s phases `names` (unused slots `""`), counted after `warmup`
    /// launches (`None`: `CUDAW_TRACE_SELF_WARMUP`, default 20000).
    pub const fn new(
        layer: &'static str,
        names: [&'static str; PHASES],
        warmup: Option<u64>,
    ) -> SelfCost {
        SelfCost {
            layer,
            names,
            warmup,
            seen: AtomicU64::new(0),
            counted: AtomicU64::new(0),
            ticks: [const { AtomicU64::new(0) }; PHASES],
            words: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            first: [const { AtomicU64::new(0) }; 2],
        }
    }

    /// A traced launch begins at tick `now`: whether it is past the warm-up (its phases
    /// are to be added).
    pub fn begin(&self, now: u64) -> bool {
        let n = self.seen.fetch_add(1, Relaxed);
        if n == 0 {
            self.first[0].store(now, Relaxed);
            self.first[1].store(epoch().elapsed().as_nanos() as u64, Relaxed);
        }
        n >= self.warmup()
    }

    fn warmup(&self) -> u64 {
        self.warmup.unwrap_or_else(warmup)
    }

    /// Adds `ticks` to phase `phase`.
    pub fn add(&self, phase: usize, ticks: u64) {
        if let Some(t) = self.ticks.get(phase) {
            t.fetch_add(ticks, Relaxed);
        }
    }

    /// A counted launch ended: `words` argument words handed over of `bytes` read.
    pub fn end(&self, words: u64, bytes: u64) {
        self.counted.fetch_add(1, Relaxed);
        self.words.fetch_add(words, Relaxed);
        self.bytes.fetch_add(bytes, Relaxed);
    }

    /// One line: the mean nanoseconds of each phase per counted launch (tick rate measured
    /// between the first launch and `now`), or `None` before any was counted.
    pub fn report(&self, now: u64) -> Option<String> {
        let n = self.counted.load(Relaxed);
        if n == 0 {
            return None;
        }
        let ns = (epoch().elapsed().as_nanos() as u64).saturating_sub(self.first[1].load(Relaxed));
        let ticks = now.wrapping_sub(self.first[0].load(Relaxed));
        let rate = if ns > 0 && ticks > 0 {
            ticks as f64 / ns as f64
        } else {
            1.0
        };
        let mut s = format!(
            "self cost of a traced launch ({}, mean of {n} after {}):",
            self.layer,
            self.warmup()
        );
        let mut total = 0.0;
        for (name, t) in self.names.iter().zip(&self.ticks) {
            if name.is_empty() {
                continue;
            }
            let v = t.load(Relaxed) as f64 / rate / n as f64;
            total += v;
            s.push_str(&format!(" {name} {v:.0} ns,"));
        }
        s.push_str(&format!(
            " in all {total:.0} ns; {:.1} words handed over of {:.0} bytes read",
            self.words.load(Relaxed) as f64 / n as f64,
            self.bytes.load(Relaxed) as f64 / n as f64
        ));
        Some(s)
    }
}

/// Both cudaw libraries' tick source (tracing's clock, and the phases here), calibrated
/// against the monotonic clock by its users: the time stamp counter on x86-64, the
/// virtual counter (`cntvct_el0`) on AArch64, and nanoseconds of the monotonic clock
/// elsewhere.
#[inline]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc reads a counter; it has no preconditions on x86-64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let t: u64;
        // SAFETY: reads the virtual counter, which Linux lets user space read; no memory.
        unsafe {
            std::arch::asm!("mrs {t}, cntvct_el0", t = out(reg) t, options(nomem, nostack, preserves_flags));
        }
        t
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_nanos() as u64
    }
}

/// `CUDAW_TRACE_SELF_WARMUP`: launches left out before the phases are counted (default
/// 20000; read once).
pub fn warmup() -> u64 {
    static W: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *W.get_or_init(|| {
        std::env::var("CUDAW_TRACE_SELF_WARMUP")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(20_000)
    })
}

/// Whether `CUDAW_TRACE_SELF=1` (read once).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("CUDAW_TRACE_SELF").is_ok_and(|v| v.trim() == "1"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_averaged_after_the_warm_up() {
        let c = SelfCost::new("test", ["a", "b", "", "", ""], Some(2));
        assert!(c.report(0).is_none());
        for i in 0..5u64 {
            if c.begin(i * 1000) {
                c.add(0, 100);
                c.add(1, 300);
                c.end(4, 64);
            }
        }
        let r = c.report(5000).unwrap();
        assert!(r.contains("mean of 3 after 2"), "{r}");
        assert!(r.contains("4.0 words handed over of 64 bytes read"), "{r}");
        assert!(
            r.contains(" a ") && r.contains(" b ") && !r.contains(",  ns"),
            "{r}"
        );
    }
}
